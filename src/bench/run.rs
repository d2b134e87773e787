//! Runs the configurations side by side: one fresh llama-server per configuration (same model, threads, context
//! and slots; only the speculative flags differ), all started before the first measured request, then the same
//! prompts round by round, the order of configurations rotating every round, so machine drift and position
//! effects fall on every configuration alike. `-np 1`: one request at a time. `-np N`: N client threads send
//! N prompts at once per round, for aggregate throughput.

use super::config::{Config, ConfigKind};
use super::Observer;
use crate::server::{Completion, Server, ServerOptions};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One prompt as the server sees it (chat template already applied).
#[derive(Clone, Debug)]
pub struct BenchPrompt {
    pub id: String,
    pub text: String,
    /// The predicted output a client would send with it (the code it asks to change), if any.
    pub prediction: Option<String>,
}

impl BenchPrompt {
    /// Sends the prompt: greedy, `n_predict` tokens at most, with its prediction when `predict` and it has one.
    fn send(&self, server: &Server, n_predict: u32, predict: bool) -> Result<Completion, String> {
        let extra = match self.prediction.as_deref().filter(|_| predict) {
            None => serde_json::json!({}),
            Some(p) => serde_json::json!({"prediction": {"type": "content", "content": p}}),
        };
        server.complete_with(&self.text, n_predict, extra).map_err(|e| e.to_string())
    }
}

/// What is the same for every configuration of one run.
#[derive(Clone, Debug)]
pub struct RunSpec<'a> {
    pub model: &'a Path,
    pub prompts: &'a [BenchPrompt],
    /// A prompt for the unmeasured warm-up request of each server (not one of the measured prompts).
    pub warmup: &'a str,
    /// Prompts each server answers after start, unmeasured, before the measured ones (none of them).
    pub traffic: &'a [BenchPrompt],
    pub n_predict: u32,
    pub slots: u32,
    pub threads: Option<u32>,
    /// Context per slot.
    pub n_ctx: u32,
    /// Passes over the prompts.
    pub repeat: usize,
    /// Where the servers' logs go.
    pub log_dir: &'a Path,
    /// Pause before each measured request or round, so the previous server's worker threads stop spinning.
    pub settle: Duration,
}

/// One completion as measured.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    pub prompt_id: String,
    pub round: usize,
    pub predicted_n: u64,
    pub predicted_per_second: f64,
    pub predicted_ms: f64,
    pub draft_n: u64,
    pub draft_n_accepted: u64,
    /// Verify steps that carried a draft (from `/metrics`, exact with one slot; None with several).
    pub drafts: Option<u64>,
    /// Client-side time of the whole request (prompt included), ms.
    pub wall_ms: f64,
    /// SHA-256 of the output text (first 16 hex digits) and its length in bytes.
    pub content_sha256: String,
    pub content_len: usize,
    /// The output text itself (kept for the identity check; not written to JSON).
    #[serde(skip)]
    pub content: String,
}

/// One round (with several slots: the prompts sent at once).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoundRecord {
    pub round: usize,
    pub requests: usize,
    /// From the first send to the last answer, ms.
    pub wall_ms: f64,
    pub predicted_n: u64,
    /// Verify steps that carried a draft, all slots (from `/metrics`).
    pub drafts: Option<u64>,
}

/// Everything one configuration did in one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigRun {
    pub config: Config,
    pub slots: u32,
    pub requests: Vec<RequestRecord>,
    pub rounds: Vec<RoundRecord>,
    /// Why it stopped (server did not start, a request failed); requests before that are kept.
    pub error: Option<String>,
    pub log: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the reference configuration (no speculation) failed: {0}")]
    Reference(String),
}

pub(crate) fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn record(prompt_id: &str, round: usize, c: &Completion, drafts: Option<u64>) -> RequestRecord {
    RequestRecord {
        prompt_id: prompt_id.to_string(),
        round,
        predicted_n: c.predicted_n,
        predicted_per_second: c.predicted_per_second,
        predicted_ms: c.predicted_ms,
        draft_n: c.draft_n,
        draft_n_accepted: c.draft_n_accepted,
        drafts,
        wall_ms: c.wall.as_secs_f64() * 1e3,
        content_sha256: short_hash(&c.content),
        content_len: c.content.len(),
        content: c.content.clone(),
    }
}

/// `llamacpp:spec_decode_num_drafts_total` of a server (verify steps that carried a draft, since start).
pub fn drafts_total(server: &Server) -> Option<u64> {
    let url = format!("http://127.0.0.1:{}/metrics", server.port());
    let text = ureq::get(&url).timeout(Duration::from_secs(10)).call().ok()?.into_string().ok()?;
    parse_metric(&text, "llamacpp:spec_decode_num_drafts_total").map(|v| v as u64)
}

/// A counter's value from Prometheus text.
pub fn parse_metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ').or_else(|| rest.strip_prefix('\t'))))
        .and_then(|v| v.trim().parse().ok())
}

fn log_name(c: &Config, slots: u32) -> String {
    let safe: String = c.name.chars().map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' { ch } else { '_' }).collect();
    format!("{safe}-np{slots}.log")
}

/// Order of the configurations in round `r`: rotated by r.
pub fn rotation(n: usize, r: usize) -> Vec<usize> {
    (0..n).map(|i| (i + r) % n.max(1)).collect()
}

/// Runs every configuration over the prompts. The first configuration must be the reference (no speculation):
/// if it cannot run, nothing is measured. Any other configuration that fails to start or fails a request is
/// reported with its error and left out of later rounds.
pub fn run_interleaved(spec: &RunSpec, configs: &[Config], obs: &dyn Observer) -> Result<Vec<ConfigRun>, RunError> {
    let mut runs: Vec<ConfigRun> = Vec::new();
    let mut servers: Vec<Option<Server>> = Vec::new();
    // Starts configuration `ci`, logging to `log`. A failure is kept in its run, and ends the whole run when it is
    // the reference's.
    let launch = |ci: usize, log: &Path, run: &mut ConfigRun| -> Result<Option<Server>, RunError> {
        let c = &configs[ci];
        let opts = ServerOptions {
            model: spec.model.to_path_buf(),
            plugin: c.plugin.clone(),
            plugin_arg: c.plugin_arg.clone(),
            // Every configuration, the reference included, schedules batch-invariantly (patch 0004), so with
            // several slots each output can still be held against plain decoding.
            extra: [c.extra.clone(), vec!["--strict-batching".to_string()]].concat(),
            n_parallel: spec.slots,
            n_ctx: spec.n_ctx,
            threads: spec.threads,
            log: log.to_path_buf(),
            env: Vec::new(),
        };
        if c.kind == ConfigKind::LiveKept {
            // Each start learns anew from the warm-up traffic only, never from an earlier pass's measured prompts.
            if let Some(f) = c.plugin_arg.as_deref().and_then(|a| a.split(',').find_map(|kv| kv.strip_prefix("live="))) {
                let _ = std::fs::remove_file(f);
            }
        }
        let warm = |s: Server| -> Result<Server, crate::server::ServerError> {
            s.complete(spec.warmup, 8)?;
            for p in spec.traffic {
                s.complete(&p.text, spec.n_predict)?;
            }
            if c.kind != ConfigKind::LiveKept || spec.traffic.is_empty() {
                return Ok(s);
            }
            // Stopped (the live index is saved) and started again from what it saved: a restart.
            s.stop();
            let again = Server::start(&ServerOptions { log: log.with_extension("restart.log"), ..opts.clone() })?;
            again.complete(spec.warmup, 8)?;
            Ok(again)
        };
        match Server::start(&opts).and_then(warm) {
            Ok(s) => Ok(Some(s)),
            Err(e) => {
                let msg = e.to_string();
                if c.kind == ConfigKind::None && ci == 0 {
                    return Err(RunError::Reference(msg));
                }
                obs.note(&format!("  !! {} did not start: {}", c.name, first_lines(&msg, 6)));
                run.error = Some(msg);
                Ok(None)
            }
        }
    };
    for (ci, c) in configs.iter().enumerate() {
        let log = spec.log_dir.join(log_name(c, spec.slots));
        obs.note(&format!("  starting llama-server: {} (-np {})", c.name, spec.slots));
        let mut run = ConfigRun { config: c.clone(), slots: spec.slots, requests: vec![], rounds: vec![], error: None, log: log.clone() };
        servers.push(launch(ci, &log, &mut run)?);
        runs.push(run);
    }

    let n_rounds_per_pass = spec.prompts.len().div_ceil(spec.slots.max(1) as usize);
    for pass in 0..spec.repeat.max(1) {
        // Each pass starts from fresh servers: a drafter that keeps state across requests (llama.cpp's
        // ngram-mod pools n-grams of every request it served) would otherwise see the same prompts again.
        for (ci, server) in servers.iter_mut().enumerate().filter(|(_, s)| pass > 0 && s.is_some()) {
            *server = None;
            obs.note(&format!("  restarting llama-server: {} (pass {})", configs[ci].name, pass + 1));
            let log = spec.log_dir.join(format!("{}.pass{}", log_name(&configs[ci], spec.slots), pass + 1));
            *server = launch(ci, &log, &mut runs[ci])?;
        }
        for (ri, chunk) in spec.prompts.chunks(spec.slots.max(1) as usize).enumerate() {
            let round = pass * n_rounds_per_pass + ri;
            for ci in rotation(configs.len(), round) {
                let Some(server) = servers[ci].as_ref() else { continue };
                std::thread::sleep(spec.settle);
                let before = drafts_total(server);
                let t0 = Instant::now();
                let predict = configs[ci].kind.sends_prediction();
                let results: Vec<(usize, Result<Completion, String>)> = if spec.slots <= 1 {
                    chunk.iter().enumerate().map(|(i, p)| (i, p.send(server, spec.n_predict, predict))).collect()
                } else {
                    std::thread::scope(|s| {
                        let handles: Vec<_> = chunk
                            .iter()
                            .enumerate()
                            .map(|(i, p)| s.spawn(move || (i, p.send(server, spec.n_predict, predict))))
                            .collect();
                        handles.into_iter().map(|h| h.join().expect("client thread panicked")).collect()
                    })
                };
                let wall = t0.elapsed();
                let after = drafts_total(server);
                let drafts = match (before, after) {
                    (Some(b), Some(a)) => Some(a.saturating_sub(b)),
                    _ => None,
                };
                let run = &mut runs[ci];
                let mut failed = None;
                let mut predicted = 0;
                for (i, r) in results {
                    match r {
                        Ok(c) => {
                            predicted += c.predicted_n;
                            let per_request_drafts = if chunk.len() == 1 { drafts } else { None };
                            run.requests.push(record(&chunk[i].id, round, &c, per_request_drafts));
                        }
                        Err(e) => failed = Some(e),
                    }
                    obs.step(&format!("{} np{} {}", run.config.name, spec.slots, chunk[i].id));
                }
                run.rounds.push(RoundRecord { round, requests: chunk.len(), wall_ms: wall.as_secs_f64() * 1e3, predicted_n: predicted, drafts });
                if let Some(e) = failed {
                    if run.config.kind == ConfigKind::None && ci == 0 {
                        return Err(RunError::Reference(e));
                    }
                    obs.note(&format!("  !! {} failed a request: {}", run.config.name, first_lines(&e, 6)));
                    run.error = Some(e);
                    servers[ci] = None;
                }
            }
        }
    }
    drop(servers);
    Ok(runs)
}

fn first_lines(s: &str, n: usize) -> String {
    s.lines().take(n).collect::<Vec<_>>().join("\n     ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_visits_every_position() {
        assert_eq!(rotation(3, 0), vec![0, 1, 2]);
        assert_eq!(rotation(3, 1), vec![1, 2, 0]);
        assert_eq!(rotation(3, 5), vec![2, 0, 1]);
        for n in 1..6 {
            for pos in 0..n {
                let firsts: std::collections::BTreeSet<usize> = (0..n).map(|r| rotation(n, r)[pos]).collect();
                assert_eq!(firsts.len(), n);
            }
        }
    }

    #[test]
    fn metrics_are_read_from_prometheus_text() {
        let text = "# HELP llamacpp:spec_decode_num_drafts_total Speculative\n# TYPE llamacpp:spec_decode_num_drafts_total counter\n\
                    llamacpp:spec_decode_num_drafts_total 42\nllamacpp:spec_decode_num_drafts_total_x 7\n";
        assert_eq!(parse_metric(text, "llamacpp:spec_decode_num_drafts_total"), Some(42.0));
        assert_eq!(parse_metric(text, "llamacpp:n_decode_total"), None);
    }

    #[test]
    fn hashes_are_short_and_stable() {
        assert_eq!(short_hash("abc"), "ba7816bf8f01cfea");
    }
}
