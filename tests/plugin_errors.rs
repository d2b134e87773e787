//! Bad plugins and bad arguments stop llama-server at start-up with a message that names the file and
//! the reason; nothing crashes.

mod common;

use kolm_rsd::server::{Server, ServerOptions};
use std::path::Path;

fn start_error(plugin: &Path, arg: Option<&str>, log: &Path) -> String {
    let mut opts = ServerOptions::new(&common::smol(), log);
    opts.plugin = Some(plugin.to_path_buf());
    opts.plugin_arg = arg.map(str::to_string);
    match Server::start(&opts) {
        Ok(_) => panic!("llama-server started with the bad plugin {}", plugin.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_library_names_the_path() {
    let dir = common::scratch("plugin-missing");
    let e = start_error(&dir.join("no-such-plugin.so"), None, &dir.join("log"));
    assert!(e.contains("failed to load speculative plugin") && e.contains("no-such-plugin.so"), "{e}");
}

#[test]
fn library_without_the_symbols_names_the_symbol() {
    let dir = common::scratch("plugin-nosyms");
    let so = common::fake_plugin(&dir, "nosyms", Some("FAKE_NO_SYMBOLS 1"));
    let e = start_error(&so, None, &dir.join("log"));
    assert!(e.contains("nosyms.so") && e.contains("does not export the symbol 'llama_spec_plugin_abi_version'"), "{e}");
}

#[test]
fn abi_mismatch_names_both_versions() {
    let dir = common::scratch("plugin-abi");
    let so = common::fake_plugin(&dir, "abi2", Some("FAKE_ABI 2"));
    let e = start_error(&so, None, &dir.join("log"));
    assert!(e.contains("abi2.so") && e.contains("has ABI version 2") && e.contains("expected version 1"), "{e}");
}

#[test]
fn failing_init_reports_the_plugin_message() {
    let dir = common::scratch("plugin-init");
    let so = common::fake_plugin(&dir, "initnull", Some("FAKE_INIT_NULL 1"));
    let e = start_error(&so, None, &dir.join("log"));
    assert!(e.contains("llama_spec_plugin_init failed") && e.contains("init refused on purpose"), "{e}");
}

#[test]
fn kolm_plugin_refuses_a_wrong_flag_and_a_missing_pack() {
    let dir = common::scratch("plugin-args");
    let e = start_error(&common::plugin(), Some("colour=blue"), &dir.join("log1"));
    assert!(e.contains("unknown key `colour`"), "{e}");
    let e = start_error(&common::plugin(), Some("pack=/nonexistent/x.recipes.json"), &dir.join("log2"));
    assert!(e.contains("recipe pack /nonexistent/x.recipes.json") && e.contains("No such file"), "{e}");
}

#[test]
fn kolm_plugin_refuses_a_corrupt_pack_beside_nothing_lost() {
    let dir = common::scratch("plugin-corrupt-pack");
    let pack = dir.join("bad.recipes.json");
    std::fs::write(&pack, b"{\"format\": \"kolm-rsd/recipes\", \"version\": 1, ").unwrap();
    let e = start_error(&common::plugin(), Some(&format!("pack={}", pack.display())), &dir.join("log"));
    assert!(e.contains("bad.recipes.json") && e.contains("bad JSON"), "{e}");
    assert!(pack.is_file(), "the refused pack is left where it was");
}
