//! The reliability harness: the patched llama-server with the plugin and a pack under concurrent load and
//! hostile requests, beside plain llama-server on the same request stream, every completed greedy output
//! compared byte for byte with the same prompt served alone without speculation. `soak` watches memory over
//! many requests; `crash` kills the server while it writes the miss log. Loopback only, bounded in count
//! and time. `kolm-rsd stress` and the tests drive it; docs/reliability.md reports it.

pub mod crash;
pub mod soak;

use crate::load::served::{self, content, Alone, Key, Side};
use crate::load::{Kind, Limits, Outcome, Request};
use crate::quantile;
use crate::server::{plugin_summary, Server, ServerOptions};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The server under test and what every scenario sends it.
#[derive(Clone, Debug)]
pub struct Target {
    pub model: PathBuf,
    /// The recipe pack the plugin serves with.
    pub pack: PathBuf,
    pub plugin: PathBuf,
    pub n_parallel: u32,
    /// KV cells per slot: the long prompts are made longer than this.
    pub slot_ctx: u32,
    pub n_predict: i64,
    /// Where the servers' logs go.
    pub out: PathBuf,
}

impl Target {
    /// llama-server on the model, logging to `out/log`; with the plugin when `plugin_arg` is given.
    pub fn server(&self, log: &str, plugin_arg: Option<String>) -> ServerOptions {
        let mut s = ServerOptions::new(&self.model, &self.out.join(log));
        s.n_parallel = self.n_parallel;
        s.n_ctx = self.slot_ctx;
        if plugin_arg.is_some() {
            s.plugin = Some(self.plugin.clone());
            s.plugin_arg = plugin_arg;
        }
        s
    }

    /// `--spec-plugin-arg` naming the pack, and `extra` after it.
    pub fn pack_arg(&self, extra: &str) -> String {
        // The live index learns in memory only: a stress run leaves nothing in the user's cache.
        format!("pack={},live=mem{extra}", self.pack.display())
    }
}

/// One load run's settings.
#[derive(Clone, Debug)]
pub struct StressOptions {
    pub target: Target,
    pub clients: usize,
    pub per_client: usize,
    /// Shuffles kinds (plain, streamed, abandoned) over the stream.
    pub seed: u64,
    /// No request is sent after this; no request lasts longer than `request_timeout`.
    pub deadline: Duration,
    pub request_timeout: Duration,
}

/// The templated prompts a stream draws from, and one longer than a slot's context.
pub struct Prompts {
    pub normal: Vec<String>,
    pub long: String,
}

/// The request stream: mostly greedy completions (a quarter streamed, a tenth abandoned mid-generation),
/// with prompts longer than a slot, `n_predict` of 0, 1 and far beyond the context, and malformed bodies
/// spread through it, so they arrive while other requests generate.
pub fn plan(p: &Prompts, o: &StressOptions) -> Vec<Request> {
    let total = o.clients * o.per_client;
    let t = &o.target;
    let mut rng = fastrand::Rng::with_seed(o.seed);
    let greedy = |prompt: &str, n_predict: i64, kind: Kind, label: &str| Request {
        prompt: prompt.to_string(),
        n_predict,
        kind,
        label: label.to_string(),
        cache_prompt: false,
    };
    let raw = |path: &'static str, body: &str, label: &str| greedy("", 0, Kind::Raw { path, body: body.to_string() }, label);
    (0..total)
        .map(|i| {
            let prompt = &p.normal[i % p.normal.len()];
            match i % 48 {
                5 => raw("/completion", r#"{"prompt": "Extract the name", "n_predict": "#, "bad JSON"),
                11 => raw("/completion", r#"{"prompt": 42, "n_predict": "many"}"#, "wrong types"),
                17 => raw("/v1/chat/completions", r#"{"messages": []}"#, "empty messages"),
                23 => raw("/v1/chat/completions", r#"{"messages": "hello", "max_tokens": -5}"#, "messages not a list"),
                29 => raw("/completion", "", "empty body"),
                35 => raw("/completion", r#"{"prompt": "\ud800", "n_predict": 4}"#, "lone surrogate"),
                7 => greedy(&p.long, t.n_predict, Kind::Plain, "prompt longer than the slot"),
                13 => greedy(prompt, 0, Kind::Plain, "n_predict 0"),
                19 => greedy(prompt, 1, Kind::Stream, "n_predict 1"),
                41 => greedy(prompt, 64 * t.slot_ctx as i64, Kind::Plain, "n_predict far beyond the context"),
                _ => match rng.u32(0..20) {
                    0..=4 => greedy(prompt, t.n_predict, Kind::Stream, "streamed"),
                    5..=6 => greedy(prompt, t.n_predict, Kind::Abandon { after_events: rng.usize(1..8) }, "abandoned"),
                    _ => greedy(prompt, t.n_predict, Kind::Plain, "plain"),
                },
            }
        })
        .collect()
}

/// Everything a run saw and what it found wrong.
pub struct StressReport {
    pub requests: Vec<Request>,
    pub sides: Vec<Side>,
    /// (prompt, n_predict) → the answer served alone, without speculation.
    pub alone: HashMap<Key, Alone>,
    /// Broken promises: a failed or hung request, an unhealthy server, an output that differs.
    pub problems: Vec<String>,
}

/// Runs the stream on plain llama-server, serves each distinct prompt alone there, then runs the same
/// stream on the server with the plugin; checks every promise.
pub fn run(prompts: &Prompts, o: &StressOptions) -> Result<StressReport, Box<dyn std::error::Error>> {
    let t = &o.target;
    std::fs::create_dir_all(&t.out)?;
    let requests = plan(prompts, o);
    let limits = Limits { clients: o.clients, deadline: o.deadline, request_timeout: o.request_timeout };

    let mut plain = Server::start(&t.server("plain.log", None))?;
    let plain_side = Side::serve("plain", &mut plain, &requests, limits);
    let alone = served::alone(&plain, &requests, o.request_timeout);
    plain.stop();

    let mut server = Server::start(&t.server("kolm-rsd.log", Some(t.pack_arg(""))))?;
    let mut plugin_side = Side::serve("kolm-rsd", &mut server, &requests, limits);
    server.stop();
    plugin_side.summary = plugin_summary(&t.out.join("kolm-rsd.log"));

    let mut problems = Vec::new();
    for side in [&plain_side, &plugin_side] {
        if !side.healthy {
            problems.push(format!("{}: unhealthy after the load", side.name));
        }
        for r in &side.records {
            if let Outcome::Failed(why) = &r.outcome {
                problems.push(format!("{}: request {} ({}) failed: {why}", side.name, r.request, requests[r.request].label));
            }
        }
        if side.records.len() < requests.len() {
            problems.push(format!("{}: only {} of {} requests sent before the deadline", side.name, side.records.len(), requests.len()));
        }
    }
    for (r, want) in plugin_side.identity(&requests, &alone).1 {
        problems.push(format!("kolm-rsd: request {} ({}) differs from the prompt served alone: {:?} vs {want:?}", r.request, requests[r.request].label, content(r)));
    }
    Ok(StressReport { requests, sides: vec![plain_side, plugin_side], alone, problems })
}

/// The run as Markdown: the sides side by side, then what each kind of hostile request got.
pub fn markdown(rep: &StressReport, o: &StressOptions) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} clients × {} requests, `-np {}`, {} KV cells a slot, `n_predict` {}, model `{}`, pack `{}`\n",
        o.clients,
        o.per_client,
        o.target.n_parallel,
        o.target.slot_ctx,
        o.target.n_predict,
        file_name(&o.target.model),
        file_name(&o.target.pack)
    );
    let _ = writeln!(s, "| server | sent | done | refused | abandoned | failed | identical to alone | tok/s | × plain | p50 s | p99 s | healthy after | RSS MiB |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    let base = rep.sides[0].tok_per_s();
    for side in &rep.sides {
        let count = |f: fn(&Outcome) -> bool| side.records.iter().filter(|r| f(&r.outcome)).count();
        let (same, differ) = side.identity(&rep.requests, &rep.alone);
        let lat = side.latencies(&rep.requests);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {}/{} | {:.1} | {:.2}× | {:.2} | {:.2} | {} | {} |",
            side.name,
            side.records.len(),
            count(|o| matches!(o, Outcome::Done { .. })),
            count(|o| matches!(o, Outcome::Refused { .. })),
            count(|o| matches!(o, Outcome::Abandoned { .. })),
            count(|o| matches!(o, Outcome::Failed(_))),
            same,
            same + differ.len(),
            side.tok_per_s(),
            side.tok_per_s() / base.max(1e-9),
            quantile::quantile(&lat, 0.5),
            quantile::quantile(&lat, 0.99),
            if side.healthy { "yes" } else { "**no**" },
            side.rss_kib.map_or("?".into(), |k| format!("{:.0}", k as f64 / 1024.0)),
        );
    }
    let _ = writeln!(s, "\nWhat each kind of request got (the server with the plugin; plain answered the same unless noted):\n");
    let _ = writeln!(s, "| request | sent | outcome |");
    let _ = writeln!(s, "|---|---:|---|");
    let mut labels: Vec<&str> = rep.requests.iter().map(|r| r.label.as_str()).collect();
    labels.sort();
    labels.dedup();
    for label in labels {
        let got = |side: &Side| {
            let mut kinds: Vec<String> = side.records.iter().filter(|r| rep.requests[r.request].label == label).map(|r| describe(&r.outcome)).collect();
            kinds.sort();
            kinds.dedup();
            kinds.join("; ")
        };
        let sent = rep.sides[1].records.iter().filter(|r| rep.requests[r.request].label == label).count();
        let (plugin, plain) = (got(&rep.sides[1]), got(&rep.sides[0]));
        let note = if plain == plugin { String::new() } else { format!(" (plain: {plain})") };
        let _ = writeln!(s, "| {label} | {sent} | {plugin}{note} |");
    }
    if !rep.sides[1].summary.is_empty() {
        let _ = writeln!(s, "\nPlugin at shutdown: `{}`", rep.sides[1].summary);
    }
    let _ = writeln!(s, "\nProblems: {}", if rep.problems.is_empty() { "none".to_string() } else { rep.problems.join("; ") });
    s
}

/// An outcome in a few words, the same for every request of its kind.
fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Done { .. } => "answered".into(),
        Outcome::Refused { status, message } => format!("HTTP {status} \"{}\"", message.chars().take(70).collect::<String>()),
        Outcome::Abandoned { .. } => "closed by the client".into(),
        Outcome::Failed(why) => format!("**failed**: {why}"),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> StressOptions {
        StressOptions {
            target: Target {
                model: "m.gguf".into(),
                pack: "m.recipes.json".into(),
                plugin: "libkolm_rsd.so".into(),
                n_parallel: 4,
                slot_ctx: 1024,
                n_predict: 64,
                out: "out".into(),
            },
            clients: 16,
            per_client: 12,
            seed: 7,
            deadline: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn the_stream_mixes_every_kind_of_request() {
        let p = Prompts { normal: vec!["a".into(), "b".into()], long: "long".into() };
        let reqs = plan(&p, &opts());
        assert_eq!(reqs.len(), 192);
        let n = |label: &str| reqs.iter().filter(|r| r.label == label).count();
        for label in ["bad JSON", "wrong types", "empty messages", "prompt longer than the slot", "n_predict 0", "n_predict 1", "n_predict far beyond the context"] {
            assert_eq!(n(label), 4, "{label}");
        }
        assert!(n("streamed") > 30 && n("abandoned") > 8 && n("plain") > 80, "{} {} {}", n("streamed"), n("abandoned"), n("plain"));
        assert_eq!(plan(&p, &opts()).iter().map(|r| r.label.clone()).collect::<Vec<_>>(), reqs.iter().map(|r| r.label.clone()).collect::<Vec<_>>(), "the same seed, the same stream");
    }
}
