//! Concurrent clients against a real llama-server on 127.0.0.1: a fixed request stream served by N client
//! threads, bounded in count (the stream) and time (a deadline, and a timeout on every request), with plain
//! and streamed (SSE) completions, clients that hang up mid-generation and raw bodies sent as they are.
//! Every request ends in a recorded outcome; nothing here decides pass or fail.

pub mod served;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How one request is sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `/completion`, the whole answer in one response.
    Plain,
    /// `/completion` with `stream: true`, read as server-sent events to the end.
    Stream,
    /// Streamed, but the client closes the connection after this many events.
    Abandon { after_events: usize },
    /// This body, sent as it is to this path (malformed JSON, wrong types, empty messages …).
    Raw { path: &'static str, body: String },
}

/// One request of the stream: a greedy completion of `prompt` (already templated), or a raw body.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: String,
    pub n_predict: i64,
    pub kind: Kind,
    /// What the request tests, for the report ("json", "long prompt", "bad JSON" …).
    pub label: String,
    /// `cache_prompt`: reuse the slot's cached prompt (llama-server's default). Off, every request is decoded as
    /// alone (docs/batch-invariance.md).
    pub cache_prompt: bool,
}

impl Request {
    fn body(&self, stream: bool) -> Value {
        json!({
            "prompt": self.prompt,
            "n_predict": self.n_predict,
            "temperature": 0.0,
            "seed": 0,
            "cache_prompt": self.cache_prompt,
            "stream": stream,
        })
    }
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A whole answer: its text, tokens, the drafts the server reports for it, and the seconds the server spent
    /// on it in its slot (prompt and generation; the rest of the client's time it waited for a slot).
    Done { content: String, tokens: u64, prompt_n: u64, draft_n: u64, draft_accepted: u64, served_s: f64 },
    /// The server answered with an HTTP error.
    Refused { status: u16, message: String },
    /// The client hung up on purpose.
    Abandoned { events: usize },
    /// No answer: transport error, timeout, or a stream that ended without its last event.
    Failed(String),
}

/// A request's outcome and its time from send to last byte.
#[derive(Clone, Debug)]
pub struct Record {
    pub request: usize,
    pub outcome: Outcome,
    pub secs: f64,
    /// Seconds since the run started at which the request was sent.
    pub started: f64,
}

/// The limits of a run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub clients: usize,
    /// No request is sent after this.
    pub deadline: Duration,
    /// A request gets no longer than this.
    pub request_timeout: Duration,
}

/// How far apart the clients' first requests are sent, in request order. Sent at once, they reach
/// llama-server's task queue in a racy order that differs from server to server, so which request waits for the
/// last free slot (and sets the p99) changed between configurations served the same stream. Spaced, every server
/// queues them alike; 5 ms sufficed on a loaded 2-core machine, this leaves margin and costs 0.3 s for 16 clients.
pub const FIRST_SENDS_APART: Duration = Duration::from_millis(20);

/// Serves `requests` in order with `limits.clients` threads against 127.0.0.1:`port`; returns one record
/// per request sent (in request order) and the run's wall time. The first request of each client is sent
/// [`FIRST_SENDS_APART`] after the one before it; later ones as soon as a client is free. Requests not sent before
/// the deadline are left out.
pub fn run(port: u16, requests: &[Request], limits: Limits) -> (Vec<Record>, f64) {
    let next = AtomicUsize::new(0);
    let records = Mutex::new(Vec::with_capacity(requests.len()));
    let t0 = Instant::now();
    let clients = limits.clients.max(1);
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                let agent = ureq::AgentBuilder::new().timeout(limits.request_timeout).build();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests.len() {
                        break;
                    }
                    if i < clients {
                        std::thread::sleep((FIRST_SENDS_APART * i as u32).saturating_sub(t0.elapsed()));
                    }
                    if t0.elapsed() > limits.deadline {
                        break;
                    }
                    let started = t0.elapsed().as_secs_f64();
                    let t = Instant::now();
                    let outcome = send(&agent, port, &requests[i]);
                    let rec = Record { request: i, outcome, secs: t.elapsed().as_secs_f64(), started };
                    records.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
                }
            });
        }
    });
    let wall = t0.elapsed().as_secs_f64();
    let mut v = records.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|r| r.request);
    (v, wall)
}

/// One request, whatever it is, to its outcome.
pub fn send(agent: &ureq::Agent, port: u16, r: &Request) -> Outcome {
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let sent = match &r.kind {
        Kind::Plain => agent.post(&url("/completion")).send_json(r.body(false)),
        Kind::Stream | Kind::Abandon { .. } => agent.post(&url("/completion")).send_json(r.body(true)),
        Kind::Raw { path, body } => agent.post(&url(path)).set("Content-Type", "application/json").send_string(body),
    };
    let resp = match sent {
        Ok(resp) => resp,
        Err(ureq::Error::Status(status, resp)) => {
            let text = resp.into_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            return Outcome::Refused { status, message };
        }
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match &r.kind {
        Kind::Plain | Kind::Raw { .. } => match resp.into_json::<Value>() {
            Ok(v) => done(&v, v["content"].as_str().unwrap_or_default().to_string()),
            Err(e) => Outcome::Failed(format!("unreadable answer: {e}")),
        },
        Kind::Stream => read_stream(resp, usize::MAX),
        Kind::Abandon { after_events } => read_stream(resp, *after_events),
    }
}

fn done(v: &Value, content: String) -> Outcome {
    let t = &v["timings"];
    Outcome::Done {
        content,
        tokens: t["predicted_n"].as_u64().unwrap_or(0),
        prompt_n: t["prompt_n"].as_u64().unwrap_or(0),
        draft_n: t["draft_n"].as_u64().unwrap_or(0),
        draft_accepted: t["draft_n_accepted"].as_u64().unwrap_or(0),
        served_s: (t["prompt_ms"].as_f64().unwrap_or(0.0) + t["predicted_ms"].as_f64().unwrap_or(0.0)) / 1000.0,
    }
}

/// Reads `data: {...}` events, gluing their `content`, until the one with `stop: true` (or, to abandon,
/// until `limit` events were read: dropping the reader closes the connection mid-generation).
fn read_stream(resp: ureq::Response, limit: usize) -> Outcome {
    let mut content = String::new();
    let mut events = 0;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return Outcome::Failed(format!("stream broke after {events} events: {e}")),
        };
        let Some(data) = line.strip_prefix("data: ") else { continue };
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return Outcome::Failed(format!("event {events} is not JSON: {e}")),
        };
        if let Some(m) = v["error"]["message"].as_str() {
            return Outcome::Refused { status: 200, message: m.to_string() };
        }
        content.push_str(v["content"].as_str().unwrap_or_default());
        events += 1;
        if v["stop"].as_bool() == Some(true) {
            return done(&v, content);
        }
        if events >= limit {
            return Outcome::Abandoned { events };
        }
    }
    Outcome::Failed(format!("stream ended after {events} events without its last one"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A one-shot HTTP server on loopback that answers every connection with `reply`.
    fn serve(reply: &'static str, connections: usize) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in l.incoming().take(connections) {
                let mut s = s.unwrap();
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(reply.as_bytes());
                // Closing with part of the request unread (its body may come in a later segment) makes the
                // kernel reset the connection, and the client can lose the reply: end writing, then read to
                // the client's close.
                let _ = s.shutdown(std::net::Shutdown::Write);
                let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            }
        });
        port
    }

    fn req(kind: Kind) -> Request {
        Request { prompt: "p".into(), n_predict: 4, kind, label: "t".into(), cache_prompt: false }
    }

    #[test]
    fn a_stream_is_glued_and_an_error_is_read() {
        let sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n\
                   data: {\"content\":\"a\",\"stop\":false}\n\n\
                   data: {\"content\":\"b\",\"stop\":false}\n\n\
                   data: {\"content\":\"\",\"stop\":true,\"timings\":{\"predicted_n\":2,\"prompt_n\":7,\"prompt_ms\":250.0,\"predicted_ms\":1250.0}}\n\n";
        let port = serve(sse, 2);
        let agent = ureq::agent();
        let got = send(&agent, port, &req(Kind::Stream));
        assert_eq!(got, Outcome::Done { content: "ab".into(), tokens: 2, prompt_n: 7, draft_n: 0, draft_accepted: 0, served_s: 1.5 });
        assert_eq!(send(&agent, port, &req(Kind::Abandon { after_events: 1 })), Outcome::Abandoned { events: 1 });

        let bad = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n\
                   {\"error\":{\"code\":400,\"message\":\"no prompt\"}}";
        let port = serve(bad, 1);
        let raw = req(Kind::Raw { path: "/completion", body: "{".into() });
        assert_eq!(send(&agent, port, &raw), Outcome::Refused { status: 400, message: "no prompt".into() });
    }

    #[test]
    fn the_first_requests_go_out_in_turn_and_the_rest_as_clients_free() {
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n\
                  {\"content\":\"x\",\"timings\":{\"predicted_n\":1}}";
        let port = serve(ok, 6);
        let limits = Limits { clients: 4, deadline: Duration::from_secs(60), request_timeout: Duration::from_secs(10) };
        let (records, _) = run(port, &vec![req(Kind::Plain); 6], limits);
        assert_eq!(records.iter().map(|r| r.request).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        assert!(records.iter().all(|r| matches!(r.outcome, Outcome::Done { .. })), "{records:?}");
        let apart = FIRST_SENDS_APART.as_secs_f64();
        for r in &records[..4] {
            assert!(r.started >= apart * r.request as f64, "request {} sent at {} s, before its turn", r.request, r.started);
        }
        // The fifth waits for a free client, not for a turn of its own.
        let first_free = records[..4].iter().map(|r| r.started + r.secs).fold(f64::INFINITY, f64::min);
        assert!(records[4].started >= first_free, "{records:?}");
    }

    #[test]
    fn a_stream_cut_short_is_a_failure() {
        let cut = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n\
                   data: {\"content\":\"a\",\"stop\":false}\n\n";
        let port = serve(cut, 1);
        assert!(matches!(send(&ureq::agent(), port, &req(Kind::Stream)), Outcome::Failed(_)));
    }
}
