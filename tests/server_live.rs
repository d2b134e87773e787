//! The live index served for real: a request like an earlier one drafts from that one's answer, with no pack
//! and no copies of the request; what was learned is saved (0600) at shutdown and drafts again after a
//! restart; a live index that cannot be read is moved aside, not lost, and the server starts. Every output is
//! identical to llama-server without the plugin.

mod common;

use kolm_rsd::live::file::{is_live, Saved};
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::server::{Completion, Server, ServerOptions};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const N: u32 = 64;

fn prompts(model: &Model) -> Vec<String> {
    let all = kolm_rsd::workload::load("json-extraction").unwrap();
    let (_, held) = kolm_rsd::workload::split(&all);
    held.iter().take(2).map(|p| model.chat_prompt(&p.text).unwrap()).collect()
}

/// A server drafting from the live index alone (no pack, no copies of the request) at every step it can.
fn live_server(dir: &Path, live: &Path, log: &str) -> Server {
    let mut o = ServerOptions::new(&common::smol(), &dir.join(log));
    o.plugin = Some(common::plugin());
    o.plugin_arg = Some(format!("pack=off,context=0,adaptive=0,misslog=off,live={}", live.display()));
    Server::start(&o).unwrap()
}

fn check(got: &Completion, want: &Completion, what: &str) {
    assert_eq!(got.content, want.content, "{what}: output differs from plain llama-server");
}

#[test]
fn a_second_request_drafts_from_the_first_and_keeps_it_across_a_restart() {
    let _one = common::one_at_a_time();
    let path = common::smol();
    let model = Model::load(&path, &ModelOptions { n_gpu_layers: 0 }).unwrap();
    let prompts = prompts(&model);
    drop(model);
    let dir = common::scratch("server-live");
    let live = dir.join("live").join("smol.json");

    let plain = Server::start(&ServerOptions::new(&path, &dir.join("plain.log"))).unwrap();
    let want: Vec<Completion> = prompts.iter().map(|p| plain.complete(p, N).unwrap()).collect();
    drop(plain);

    let server = live_server(&dir, &live, "first.log");
    let first = server.complete(&prompts[0], N).unwrap();
    check(&first, &want[0], "first request");
    let again = server.complete(&prompts[0], N).unwrap();
    check(&again, &want[0], "the same request again");
    let other = server.complete(&prompts[1], N).unwrap();
    check(&other, &want[1], "another request");
    server.stop();
    eprintln!(
        "first {}/{} drafted/accepted, again {}/{}, other {}/{}",
        first.draft_n, first.draft_n_accepted, again.draft_n, again.draft_n_accepted, other.draft_n, other.draft_n_accepted
    );
    // The answer is known after its first token: all but that one come from accepted drafts.
    assert!(again.draft_n_accepted + 1 >= again.predicted_n * 9 / 10, "again: {again:?}");
    assert!(again.draft_n_accepted > first.draft_n_accepted + 16, "first {first:?}, again {again:?}");
    let summary = common::plugin_summary(&dir.join("first.log"));
    assert!(common::summary_number(&summary, "live hits ") >= again.draft_n_accepted, "{summary}");

    let meta = std::fs::metadata(&live).expect("saved at shutdown");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the table holds the user's traffic: owner only");
    let bytes = std::fs::read(&live).unwrap();
    assert!(is_live(&bytes));
    let saved = Saved::from_slice(&bytes, "saved", None, None).unwrap();
    let answered = first.predicted_n + again.predicted_n + other.predicted_n;
    // The plugin never sees the last token or two of a request (sampled after its last draft call).
    assert!(saved.fed <= answered && saved.fed + 3 * 2 >= answered, "{} answer tokens counted, {answered} answered", saved.fed);

    // What the server learned merges into a compiled pack's format with the CLI.
    let merged = dir.join("merged.recipes.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kolm-rsd")).arg("merge").arg(&live).arg("-o").arg(&merged).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pack = kolm_rsd::pack::Pack::from_slice(&std::fs::read(&merged).unwrap(), "merged", Some(&saved.tokenizer), None).unwrap();
    assert!(!pack.entries().is_empty() && pack.entries().len() < saved.entries.len(), "{} of {}", pack.entries().len(), saved.entries.len());

    let server = live_server(&dir, &live, "second.log");
    let after = server.complete(&prompts[0], N).unwrap();
    check(&after, &want[0], "after a restart");
    server.stop();
    assert!(after.draft_n_accepted + 1 >= after.predicted_n * 9 / 10, "after a restart: {after:?}");

    // A corrupt file is moved aside (nothing lost) and the server starts empty, drafting nothing it did not learn.
    std::fs::write(&live, &bytes[..bytes.len() / 2]).unwrap();
    let server = live_server(&dir, &live, "third.log");
    let fresh = server.complete(&prompts[0], N).unwrap();
    check(&fresh, &want[0], "after a corrupt live index");
    server.stop();
    let log = std::fs::read_to_string(dir.join("third.log")).unwrap();
    assert!(log.contains("live index") && log.contains("smol.json") && log.contains("moved to"), "{log}");
    assert_eq!(std::fs::read(live.with_extension("json.bad")).unwrap(), &bytes[..bytes.len() / 2]);
    assert!(fresh.draft_n_accepted < after.draft_n_accepted, "fresh {fresh:?}");
}
