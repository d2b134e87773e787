//! One server's run of a request stream, and the answers each prompt gets served alone: what the stress
//! harness and the load benchmark compare side by side.

use super::{send, Kind, Limits, Outcome, Record, Request};
use crate::server::Server;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::Duration;

/// (prompt, n_predict) of a greedy request: the key of its answer served alone.
pub type Key = (String, i64);

/// A prompt's answer served alone: the text every answer to it is held to, and its length, the work it asks of a
/// server (plain llama-server's batches change some answers, and so what it serves: 7% fewer tokens in session 75's
/// HumanEval rounds at `-np 8`).
#[derive(Clone, Debug, PartialEq)]
pub struct Alone {
    pub content: String,
    pub tokens: u64,
}

/// What one server did with the stream.
pub struct Side {
    pub name: String,
    pub records: Vec<Record>,
    pub wall: f64,
    /// `/health` answered 200 after the load and a normal request still completed.
    pub healthy: bool,
    pub rss_kib: Option<u64>,
    /// The plugin's shutdown line, when it ran.
    pub summary: String,
}

impl Side {
    /// Runs `requests` against `server` within `limits`, then checks it still serves.
    pub fn serve(name: &str, server: &mut Server, requests: &[Request], limits: Limits) -> Side {
        let (records, wall) = super::run(server.port(), requests, limits);
        let rss_kib = server.rss_kib();
        let agent = ureq::AgentBuilder::new().timeout(limits.request_timeout).build();
        let after = Request { prompt: "Hello".into(), n_predict: 8, kind: Kind::Plain, label: "after".into(), cache_prompt: false };
        let serves = matches!(send(&agent, server.port(), &after), Outcome::Done { .. });
        let healthy = server.healthy() && serves;
        Side { name: name.to_string(), records, wall, healthy, rss_kib, summary: String::new() }
    }

    /// Tokens of completed answers per second of the whole run.
    pub fn tok_per_s(&self) -> f64 {
        let tokens: u64 = self.records.iter().map(|r| if let Outcome::Done { tokens, .. } = r.outcome { tokens } else { 0 }).sum();
        tokens as f64 / self.wall.max(1e-9)
    }

    /// Times to last token of the completed greedy requests.
    pub fn latencies(&self, requests: &[Request]) -> Vec<f64> {
        self.answers(requests).map(|r| r.secs).collect()
    }

    /// The completed answers to greedy requests (raw bodies aside): what latencies are taken over.
    pub fn answers<'a>(&'a self, requests: &'a [Request]) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(|r| matches!(r.outcome, Outcome::Done { .. }) && !matches!(requests[r.request].kind, Kind::Raw { .. }))
    }

    /// Completed greedy records against the answers served alone: (identical, differing with the answer
    /// alone).
    pub fn identity<'a>(&'a self, requests: &[Request], alone: &'a HashMap<Key, Alone>) -> (usize, Vec<(&'a Record, &'a str)>) {
        let mut same = 0;
        let mut differ = Vec::new();
        for r in &self.records {
            let (Outcome::Done { content, .. }, Some(k)) = (&r.outcome, key(&requests[r.request])) else { continue };
            match alone.get(&k) {
                Some(want) if want.content == *content => same += 1,
                Some(want) => differ.push((r, want.content.as_str())),
                None => {}
            }
        }
        (same, differ)
    }

    /// The tokens its completed greedy answers have served alone: the work it was asked for, against which the
    /// tokens it served are read.
    pub fn alone_tokens(&self, requests: &[Request], alone: &HashMap<Key, Alone>) -> u64 {
        self.answers(requests).filter_map(|r| key(&requests[r.request]).and_then(|k| alone.get(&k))).map(|a| a.tokens).sum()
    }
}

/// Key of a greedy request's answer served alone; None for a raw body.
pub fn key(r: &Request) -> Option<Key> {
    (!matches!(r.kind, Kind::Raw { .. })).then(|| (r.prompt.clone(), r.n_predict))
}

/// Each distinct greedy prompt of `requests` served once, alone, in one whole response, by `server`
/// (without speculation, the reference every output is held to). A request that fails keeps its outcome
/// in brackets, so nothing can be identical to it.
pub fn alone(server: &Server, requests: &[Request], timeout: Duration) -> HashMap<Key, Alone> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut alone = HashMap::new();
    for r in requests {
        if let Some(Entry::Vacant(slot)) = key(r).map(|k| alone.entry(k)) {
            let one = Request { kind: Kind::Plain, cache_prompt: false, ..r.clone() };
            slot.insert(match send(&agent, server.port(), &one) {
                Outcome::Done { content, tokens, .. } => Alone { content, tokens },
                other => Alone { content: format!("<{other:?}>"), tokens: 0 },
            });
        }
    }
    alone
}

/// What a record's answer was ("" when it has none).
pub fn content(r: &Record) -> &str {
    match &r.outcome {
        Outcome::Done { content, .. } => content,
        _ => "",
    }
}
