//! Session 47's probe of the completions of one request (`n_cmpl: 3`) in a shared KV cache after requests at once,
//! Gemma-3-270M: round after round, the six short and four long prompts of tests/server_slots.rs go four at a time
//! (in an order that changes by round) to `llama-server -np 4 -kvu` (the plugin with PARG, default
//! `adaptive=0,nmax=5,live=mem,misslog=off`; PARG=none: plain `--strict-batching`), then each long prompt is asked
//! for three completions, each compared (text and token probabilities) with the prompt served alone by `-np 1`.
//! XARGS adds llama-server flags to both servers (e.g. `-fa off`). Run from the repository root:
//!   cp docs/bench/2026-11-30-s47/n-cmpl-rounds-probe.rs tests/zz_probe.rs
//!   ROUNDS=6 cargo test --release --test zz_probe -- --nocapture; rm tests/zz_probe.rs
mod common;
use kolm_rsd::server::{Server, ServerOptions};
use serde_json::{json, Value};

fn completions(server: &Server, prompt: &str, n_predict: u32, n_cmpl: usize) -> Vec<(Value, Value)> {
    let body = json!({"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "n_probs": 2, "cache_prompt": false,
                      "n_cmpl": n_cmpl});
    let (status, v) = server.post("/completion", body).unwrap();
    assert_eq!(status, 200, "{v}");
    let all = if n_cmpl == 1 { vec![v] } else { v.as_array().cloned().unwrap_or_default() };
    all.iter().map(|r| (r["content"].clone(), r["completion_probabilities"].clone())).collect()
}
#[test]
fn probe() {
    let gemma = kolm_rsd::fetch::model("gemma3-270m", false).unwrap();
    let dir = common::scratch("zz-probe");
    let long: Vec<String> = (0..4).map(common::records).collect();
    let short: Vec<String> = ["Ann Lee", "Bo Chan", "Cy Dorn", "Di Eck", "Ed Fox", "Flo Gil"].iter().enumerate()
        .map(|(i, n)| format!("Extract the fields as JSON: name {n}, age {}, city Oslo.\nJSON:", 30 + i)).collect();
    let mut o = ServerOptions::new(&gemma, &dir.join("np1.log"));
    o.n_ctx = 8192;
    if let Ok(x) = std::env::var("XARGS") { o.extra.extend(x.split_whitespace().map(String::from)); }
    let alone = Server::start(&o).unwrap();
    let refs: Vec<_> = long.iter().map(|p| completions(&alone, p, 32, 1).remove(0)).collect();
    alone.stop();
    let mut o = ServerOptions::new(&gemma, &dir.join("kvu.log"));
    o.n_ctx = 8192; o.n_parallel = 4;
    let parg = std::env::var("PARG").unwrap_or("adaptive=0,nmax=5,live=mem,misslog=off".into());
    o.extra = vec!["-kvu".into()];
    if parg == "none" { o.extra.push("--strict-batching".into()); } else { o.plugin = Some(common::plugin()); o.plugin_arg = Some(parg); }
    if let Ok(x) = std::env::var("XARGS") { o.extra.extend(x.split_whitespace().map(String::from)); }
    let server = Server::start(&o).unwrap();
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let mut bad = 0;
    for r in 0..rounds {
        // history: some concurrent requests in a varying order
        let mut hist: Vec<String> = Vec::new();
        if r % 3 != 2 { hist.extend(short.iter().cloned()); }
        for k in 0..4 { hist.push(long[(k + r) % 4].clone()); }
        if r % 2 == 1 { hist.reverse(); }
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|c| { let hist = &hist; let server = &server; s.spawn(move || {
                for i in (c..hist.len()).step_by(4) { server.complete(&hist[i], 80).unwrap(); } }) }).collect();
            for h in hs { h.join().unwrap(); }
        });
        for k in 0..4 {
            let got = completions(&server, &long[k], 32, 3);
            for (c, g) in got.iter().enumerate() {
                let t = g.0 == refs[k].0; let p = g.1 == refs[k].1;
                let at = g.1.as_array().zip(refs[k].1.as_array()).and_then(|(g, a)| g.iter().zip(a).position(|(x, y)| x != y));
                if !(t && p) { bad += 1; }
                eprintln!("round {r} prompt {k} completion {c}: text {t} probs {p} first {at:?}");
            }
        }
    }
    server.stop();
    let log = std::fs::read_to_string(dir.join("kvu.log")).unwrap();
    eprintln!("no-page warnings: {}", log.matches("no KV page of 256 cells free").count());
    assert_eq!(bad, 0);
}
