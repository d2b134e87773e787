//! `kolm-rsd replay` on the real test model: its rows, and a trace of the drafter's steps that adds up to the row
//! it traces.

mod common;

use std::process::Command;

fn replay(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kolm-rsd")).arg("replay").args(args).output().unwrap()
}

#[test]
fn a_trace_has_a_line_per_step_of_the_first_row_and_sums_up_where_drafts_and_chains_part() {
    let model = common::smol();
    let dir = common::scratch("replay-trace");
    let trace = dir.join("steps.tsv");
    let recordings = dir.join("recordings.json");
    let args = [
        "--model",
        model.to_str().unwrap(),
        "--pack",
        "off",
        "--workload",
        "code-edit",
        "--prompts",
        "2",
        "--tokens",
        "48",
        "--trace",
        trace.to_str().unwrap(),
        "--recordings",
        recordings.to_str().unwrap(),
    ];
    let out = replay(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("recording 2 greedy continuations"));
    // Replayed again from the kept recordings: nothing recorded, the same table and trace.
    let first_trace = std::fs::read_to_string(&trace).unwrap();
    let again = replay(&args);
    assert!(again.status.success() && !String::from_utf8_lossy(&again.stderr).contains("recording"), "{again:?}");
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), first_trace);
    // The first row: this CPU's clock, the drafter; its drafted and accepted tokens are the trace's sums.
    let row = stdout.lines().find(|l| l.starts_with("| this CPU")).unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let (drafted, accepted): (usize, usize) = (cells[4].parse().unwrap(), cells[5].parse().unwrap());

    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("recording\tposition\tdrafted\taccepted\tright\toracle\tchain\tnext\tproposed"));
    let steps: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    assert!(steps.iter().all(|s| s.len() == 9), "{text}");
    let num = |s: &Vec<&str>, i: usize| s[i].parse::<usize>().unwrap();
    assert_eq!(steps.iter().map(|s| num(s, 2)).sum::<usize>(), drafted, "{text}");
    assert_eq!(steps.iter().map(|s| num(s, 3)).sum::<usize>(), accepted, "{text}");
    assert!(drafted > 0, "code edits copy their code: {stdout}");
    let mut missed = 0;
    for s in &steps {
        let (g, acc, right, oracle) = (num(s, 2), num(s, 3), num(s, 4), num(s, 5));
        // A run the oracle drafts fits one verify pass (a chained copy may keep more than a fresh lookup proposes).
        assert!(oracle <= 15, "{s:?}");
        missed += oracle.saturating_sub(acc);
        let chain: Vec<&str> = if s[6].is_empty() { vec![] } else { s[6].split("; ").collect() };
        assert!(chain.len() >= g && right <= chain.len() && right.min(g) == acc, "{s:?}");
        // Each token's evidence and expected acceptance, the draft's end marked where the chain runs on.
        for (i, c) in chain.iter().enumerate() {
            let (label, p) = c.rsplit_once(' ').unwrap();
            assert!(p.parse::<f32>().is_ok_and(|p| (0.0..=1.0).contains(&p)) && label.contains(" @"), "{c}");
            assert_eq!(label.starts_with("| "), i == g && g > 0, "{s:?}");
        }
        // The recording's text and the chain's, quoted; a chain that is right throughout spells the recording's start.
        let quoted = |t: &str| t.len() >= 2 && t.starts_with('"') && t.ends_with('"');
        assert!(quoted(s[7]) && quoted(s[8]), "{s:?}");
        assert_eq!(s[8] == "\"\"", chain.is_empty(), "{s:?}");
        if right == chain.len() && right > 0 && !s[8].contains('\u{fffd}') {
            assert!(s[7].starts_with(s[8].trim_end_matches('"')), "{s:?}");
        }
    }
    assert_eq!(steps.iter().map(|s| num(s, 0)).max(), Some(1), "both recordings");
    let summary = stdout.lines().find(|l| l.starts_with("trace of the first row")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(summary.contains(&format!("({} steps)", steps.len())), "{summary}");
    let wasted: usize = steps.iter().map(|s| num(s, 2).saturating_sub(num(s, 4))).sum();
    assert!(summary.contains("drafted past the right run: ") && summary.contains(&format!("({wasted} tokens, ")), "{summary}");
    let (in_chain, beyond) = summary.split_once("did not keep: ").and_then(|(_, t)| t.split_once(" in the chain, ")).unwrap_or_else(|| panic!("{summary}"));
    let beyond: usize = beyond.trim_end_matches(" beyond it").parse().unwrap();
    assert_eq!(in_chain.parse::<usize>().unwrap() + beyond, missed, "{summary}");
}

#[test]
fn a_trace_that_cannot_be_written_is_named_before_anything_is_recorded() {
    let model = common::smol();
    let dir = common::scratch("replay-trace-bad");
    let trace = dir.join("no-such-dir").join("steps.tsv");
    let out = replay(&["--model", model.to_str().unwrap(), "--pack", "off", "--trace", trace.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&trace.display().to_string()) && err.contains("cannot write the trace"), "{err}");
    assert!(!err.contains("recording"), "failed before recording: {err}");
}

#[test]
fn several_clients_are_replayed_beside_their_oracle_and_traced() {
    let model = common::smol();
    let trace = common::scratch("replay-clients").join("steps.tsv");
    let args = ["--model", model.to_str().unwrap(), "--pack", "off", "--workload", "code-edit", "--prompts", "3", "--tokens", "48", "--clients", "2"];
    let out = replay(&[&args[..], &["--trace", trace.to_str().unwrap()]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let cells = |prefix: &str, nth: usize| -> Vec<String> {
        let row = stdout.lines().filter(|l| l.starts_with(prefix)).nth(nth).unwrap_or_else(|| panic!("no `{prefix}` row: {stdout}"));
        row.split('|').map(|c| c.trim().to_string()).collect()
    };
    let (drafter, oracle) = (cells("| 2 clients", 0), cells("| … oracle", 3));
    let num = |c: &[String], i: usize| c[i].parse::<f64>().unwrap_or_else(|_| panic!("{c:?}"));
    // speedup, steps, drafted, accepted
    assert!(num(&drafter, 5) <= num(&drafter, 4) && num(&drafter, 4) > 0.0, "code edits copy their code: {drafter:?}");
    assert_eq!(num(&oracle, 4), num(&oracle, 5), "{oracle:?}");
    assert!(num(&oracle, 2) >= num(&drafter, 2) && num(&oracle, 3) <= num(&drafter, 3), "{oracle:?} {drafter:?}");
    // Each request's runs of right proposals are its own, however many share its steps: the oracle drafts what
    // it drafts alone (the first table's oracle rows).
    assert_eq!(num(&oracle, 4), num(&cells("| … oracle", 0), 4), "{stdout}");
    // The trace follows the row of clients: a line per request and step, summing to its drafted and accepted tokens.
    let text = std::fs::read_to_string(&trace).unwrap();
    let steps: Vec<Vec<usize>> = text.lines().skip(1).map(|l| l.split('\t').take(6).map(|c| c.parse().unwrap()).collect()).collect();
    assert_eq!(steps.iter().map(|s| s[2]).sum::<usize>() as f64, num(&drafter, 4), "{text}");
    assert_eq!(steps.iter().map(|s| s[3]).sum::<usize>() as f64, num(&drafter, 5), "{text}");
    assert_eq!(steps.iter().map(|s| s[0]).max(), Some(2), "all three recordings: {text}");
    // Two requests share each step: more lines than steps, never more than twice as many.
    let passes = num(&drafter, 3) as usize;
    assert!(steps.len() > passes && steps.len() <= 2 * passes, "{} lines for {passes} steps", steps.len());
    let summary = stdout.lines().find(|l| l.starts_with("trace of the 2 clients row")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(summary.contains(&format!("({} steps)", steps.len())), "{summary}");
}

#[test]
fn slots_are_served_to_clients_with_the_plugin_s_settings_beside_their_oracle() {
    let model = common::smol();
    let base = ["--model", model.to_str().unwrap(), "--pack", "off", "--workload", "code-edit", "--prompts", "3", "--tokens", "48"];
    let args = ["--slots", "2", "--load-clients", "3", "--plugin-arg", "shared_sure=0,shared_fair=0", "--plugin-arg", "gate=off"];
    let out = replay(&[&base[..], &args[..]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("| llama-server, strict calls, 3 clients |"), "{stdout}");
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("| llama-server"))
        .filter(|l| l.starts_with("| -np 2") || l.starts_with("| … oracle"))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(rows.len(), 3, "one row per plugin argument and the oracle: {stdout}");
    assert!(rows[0][1].ends_with("`shared_sure=0,shared_fair=0`") && rows[1][1].ends_with("`gate=off`"), "{rows:?}");
    let num = |r: &[String], i: usize| r[i].parse::<f64>().unwrap_or_else(|_| panic!("{r:?}"));
    // speedup, generation, p50 × plain, p99 × plain, steps, drafted, accepted
    for r in &rows {
        assert!((2..=5).all(|i| num(r, i) > 0.0) && num(r, 8) <= num(r, 7), "{r:?}");
    }
    let oracle = &rows[2];
    assert_eq!(num(oracle, 7), num(oracle, 8), "{oracle:?}");
    assert!(rows[..2].iter().all(|r| num(oracle, 6) <= num(r, 6)), "the oracle takes the fewest steps: {rows:?}");
    assert!(num(&rows[0], 7) > 0.0, "code edits copy their code: {rows:?}");

    // A plugin argument the plugin would refuse is refused before anything is recorded, with the key and the reason.
    let out = replay(&[&base[..], &["--slots", "2", "--plugin-arg", "shared_sure=2"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("shared_sure=2 is not a number in 0..=1"), "{err}");
    assert!(!err.contains("recording"), "{err}");
    let out = replay(&[&base[..], &["--plugin-arg", "gate=off"]].concat());
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--slots"), "{}", String::from_utf8_lossy(&out.stderr));
}
