//! Bad files around a running server: a pack of another tokenizer, a truncated pack, a pack truncated while
//! the server runs, a truncated draft GGUF, a shortlist of another model, a miss log on a full disk or
//! in a place that cannot be written. Start-up stops with a message naming the file and the reason, or
//! serving goes on (without that part) with one line in the log saying why; nothing crashes.

mod common;

use kolm_rsd::pack::Pack;
use kolm_rsd::server::{Server, ServerOptions};
use kolm_rsd::shortlist::{Method, Shortlist};
use std::path::{Path, PathBuf};

fn options(arg: &str, log: &Path) -> ServerOptions {
    let mut o = ServerOptions::new(&common::smol(), log);
    o.plugin = Some(common::plugin());
    o.plugin_arg = Some(arg.to_string());
    o
}

fn start_error(arg: &str, log: &Path) -> String {
    match Server::start(&options(arg, log)) {
        Ok(_) => panic!("llama-server started with --spec-plugin-arg {arg}"),
        Err(e) => e.to_string(),
    }
}

fn copy_of_pack(dir: &Path) -> PathBuf {
    let p = dir.join("smol.recipes.json");
    std::fs::copy(common::small_pack(), &p).unwrap();
    p
}

const PROMPT: &str = "<|im_start|>user\nExtract the name and the city as JSON: Ada Lovelace lives in London.<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn a_pack_of_another_tokenizer_and_a_truncated_pack_stop_start_up() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("bad-files-pack");
    let good = Pack::from_slice(&std::fs::read(common::small_pack()).unwrap(), "small pack", None, None).unwrap();
    let mut meta = good.meta.clone();
    meta.tokenizer = "0123456789abcdef0123456789abcdef".into();
    let other = Pack::from_entries(meta, good.entries().to_vec()).unwrap();
    let path = dir.join("other.recipes.json");
    std::fs::write(&path, other.to_vec()).unwrap();
    let e = start_error(&format!("pack={}", path.display()), &dir.join("log1"));
    assert!(e.contains("other.recipes.json") && e.contains("tokenizer mismatch"), "{e}");

    let bytes = good.to_vec();
    let cut = dir.join("cut.recipes.json");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = start_error(&format!("pack={}", cut.display()), &dir.join("log2"));
    assert!(e.contains("cut.recipes.json") && e.contains("bad JSON"), "{e}");
    assert_eq!(std::fs::read(&cut).unwrap().len(), bytes.len() / 2, "the refused pack is left as it was");
}

#[test]
fn a_pack_truncated_while_the_server_runs_changes_nothing_until_restart() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("bad-files-pack-live");
    let pack = copy_of_pack(&dir);
    let plain = Server::start(&ServerOptions::new(&common::smol(), &dir.join("plain.log"))).unwrap();
    let want = plain.complete(PROMPT, 48).unwrap().content;
    drop(plain);

    let arg = format!("pack={},live=mem,misslog=off", pack.display());
    let server = Server::start(&options(&arg, &dir.join("live.log"))).unwrap();
    std::fs::write(&pack, b"{\"format\": \"kolm-rsd/rec").unwrap();
    // The pack was read whole at start-up: the server goes on drafting from it.
    for _ in 0..2 {
        assert_eq!(server.complete(PROMPT, 48).unwrap().content, want);
    }
    drop(server);
    let e = start_error(&arg, &dir.join("restart.log"));
    assert!(e.contains("smol.recipes.json") && e.contains("bad JSON"), "{e}");
}

#[test]
fn a_truncated_draft_model_and_a_shortlist_of_another_model_stop_start_up() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("bad-files-draft");
    let gguf = std::fs::read(common::smol()).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &gguf[..gguf.len() / 3]).unwrap();
    let e = start_error(&format!("draft={}", cut.display()), &dir.join("log1"));
    assert!(e.contains("cut.gguf"), "{e}");

    let other = Shortlist::from_ranking(&[5, 9, 7], &[0], 4, 49152, "0123456789abcdef0123456789abcdef".into(), Method::Topk, 10);
    let sl = dir.join("other.shortlist.json");
    std::fs::write(&sl, other.to_vec()).unwrap();
    let e = start_error(&format!("draft={},shortlist={}", common::smol().display(), sl.display()), &dir.join("log2"));
    assert!(e.contains("other.shortlist.json") && e.contains("tokenizer"), "{e}");
}

#[test]
fn a_miss_log_that_cannot_be_written_only_stops_logging() {
    let _one = common::one_at_a_time();
    let dir = common::scratch("bad-files-misslog");
    let pack = copy_of_pack(&dir);
    let plain = Server::start(&ServerOptions::new(&common::smol(), &dir.join("plain.log"))).unwrap();
    let want = plain.complete(PROMPT, 48).unwrap().content;
    drop(plain);

    let not_a_dir = dir.join("not-a-dir");
    std::fs::write(&not_a_dir, b"a file where the log's directory should be").unwrap();
    // /dev/full: every write fails with ENOSPC, as on a full disk.
    for (name, log) in [("full", PathBuf::from("/dev/full")), ("unwritable", not_a_dir.join("misses.jsonl"))] {
        let server_log = dir.join(format!("{name}.log"));
        // adaptive=0: drafting at every step makes misses certain; the break-even control drafts little
        // (and may find no miss at all) when a busy machine makes verification look dear.
        let arg = format!("adaptive=0,live=mem,pack={},misslog={}", pack.display(), log.display());
        let server = Server::start(&options(&arg, &server_log)).unwrap();
        for _ in 0..3 {
            assert_eq!(server.complete(PROMPT, 48).unwrap().content, want, "{name}: serving goes on");
        }
        server.stop();
        let text = std::fs::read_to_string(&server_log).unwrap();
        let said: Vec<&str> = text.lines().filter(|l| l.contains("misses are no longer logged")).collect();
        assert_eq!(said.len(), 1, "{name}: one line says why: {said:?}");
        assert!(said[0].contains(&log.display().to_string()), "{name}: {}", said[0]);
    }
}
