//! include/kolm-rsd.h is committed; it must equal what cbindgen generates from src/ffi right now.

#[test]
fn committed_header_is_not_stale() {
    let generated = std::fs::read_to_string(env!("KOLM_RSD_GENERATED_HEADER")).unwrap();
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/kolm-rsd.h"))
        .expect("include/kolm-rsd.h is missing");
    assert!(
        generated == committed,
        "include/kolm-rsd.h is stale: run `KOLM_RSD_UPDATE_HEADER=1 cargo build` and commit the result"
    );
}
