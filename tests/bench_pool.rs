//! `kolm-rsd bench --pool`: two `bench --load` reports read as one from the command line, and a clear error for a
//! directory that holds none; and `bench --load`'s own argument checks, which need no model or server either.

use std::path::{Path, PathBuf};
use std::process::Command;

fn pool(args: &[&Path]) -> std::process::Output {
    let list = args.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(",");
    Command::new(env!("CARGO_BIN_EXE_kolm-rsd")).args(["bench", "--pool", &list]).output().unwrap()
}

/// A run's report as `bench --load` writes it (the fields pooling reads, and one it does not).
fn report(dir: &Path, plain: &[f64], kolm: &[f64]) {
    let row = |config: &str, rates: &[f64]| {
        serde_json::json!({
            "slots": 8, "config": config, "sent": 64, "done": 64, "identical": 64, "compared": 64, "drafted": 0,
            "accepted": 0, "healthy": true, "round_tok_per_s": rates, "round_p99_s": vec![60.0; rates.len()],
            "round_unit_ms": vec![100.0; rates.len()], "p50_s": 40.0,
        })
    };
    std::fs::create_dir_all(dir).unwrap();
    let json = serde_json::json!({ "rows": [row("plain", plain), row("kolm", kolm)], "ceiling_basis": [] });
    std::fs::write(dir.join("load.json"), json.to_string()).unwrap();
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn two_runs_are_paired_with_their_own_plain_and_read_together() {
    let dir = scratch("bench-pool-two-runs");
    let (a, b) = (dir.join("a"), dir.join("b"));
    // Run a: kolm 10% above plain in both rounds; run b, on a slower machine: 10% above again.
    report(&a, &[20.0, 22.0], &[22.0, 24.2]);
    report(&b, &[10.0], &[11.0]);
    let out = pool(&[&a, &b.join("load.json")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 runs of `kolm-rsd bench --load` pooled"), "{stdout}");
    assert!(stdout.contains(&format!("- `{}`", a.join("load.json").display())), "{stdout}");
    // Three pairings, each 1.10×: no spread, so the interval is the mean; p99 equal to plain's in every round.
    assert!(stdout.contains("| 8 | kolm | 2 | 3 | 1.100× (1.100–1.100) | 1.100× (1.100–1.100) | 1.000× (1.000–1.000) | 3 of 3 (3 of 3) | 0 / 0 | 128/128 | 128/128 | yes |"), "{stdout}");
}

#[test]
fn a_directory_without_a_report_is_named() {
    let dir = scratch("bench-pool-no-report");
    std::fs::create_dir_all(&dir).unwrap();
    let out = pool(&[&dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&dir.join("load.json").display().to_string()), "{stderr}");
}

#[test]
fn a_setting_the_plugin_refuses_is_refused_before_anything_is_served() {
    // No model is fetched or loaded and no server started: the refusal names the flag and the plugin's reason.
    let out = Command::new(env!("CARGO_BIN_EXE_kolm-rsd"))
        .args(["bench", "--load", "--no-fetch", "--models", "no-such-model", "--ab-arg", "gate_unit=ctx"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--ab-arg gate_unit=ctx") && stderr.contains("gate_unit=ctx is not context or mean"), "{stderr}");
}
