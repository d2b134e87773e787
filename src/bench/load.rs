//! `kolm-rsd bench --load`: many clients at once. For each slot count (`-np`), every configuration serves the
//! same request stream from N concurrent clients (the workloads' prompts interleaved, structured and prose by
//! default, a quarter of them streamed), on a fresh llama-server each; aggregate tokens per second against plain
//! llama-server at that slot count, p50/p99 time to last token, and every completed answer held byte for byte to
//! the prompt served alone without speculation. The prompts are held out from the pack ([`crate::workload::split`]).

use super::load_ceiling::{self, LoadCeiling, LoadCosts};
use super::paired::{AgainstPlain, Plain, Rounds};
use super::calls;
use super::steps::{self, InPlace};
use super::Observer;
use crate::load::served::{self, Alone, Side};
use crate::llama::{Model, ModelOptions};
use crate::load::{Kind, Limits, Outcome, Request, FIRST_SENDS_APART};
use crate::server::{plugin_summary, Server, ServerError, ServerOptions};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a configuration adds to plain llama-server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LoadConfig {
    /// llama-server as it comes: the reference.
    Plain,
    /// Plain with `--strict-batching` (what the plugin turns on: prompts decoded alone, generation calls of
    /// at most 16 tokens): the cost of exactness alone.
    PlainStrict,
    /// The plugin loaded with nothing to draft from (no pack, no request copies, no miss log): the cost of
    /// the plugin path itself.
    KolmIdle,
    /// The plugin with the pack beside the model.
    Kolm,
    /// The plugin as `kolm`, plus the settings of `--ab-arg`: an A/B of the drafter's settings on the same
    /// stream (with none, an A/A check of the run's noise).
    KolmB,
    /// llama.cpp's own model-free mode as users run it (`--spec-type ngram-simple`, no strict batching): the
    /// field's answer, in the same table. It promises no exactness.
    NgramSimple,
}

impl LoadConfig {
    pub const ALL: [LoadConfig; 6] =
        [LoadConfig::Plain, LoadConfig::PlainStrict, LoadConfig::KolmIdle, LoadConfig::Kolm, LoadConfig::KolmB, LoadConfig::NgramSimple];

    pub fn name(self) -> &'static str {
        match self {
            LoadConfig::Plain => "plain",
            LoadConfig::PlainStrict => "plain-strict",
            LoadConfig::KolmIdle => "kolm-idle",
            LoadConfig::Kolm => "kolm",
            LoadConfig::KolmB => "kolm-b",
            LoadConfig::NgramSimple => "ngram-simple",
        }
    }

    /// Whether the configuration promises every answer byte-identical to the prompt served alone.
    pub fn exact(self) -> bool {
        matches!(self, LoadConfig::PlainStrict | LoadConfig::KolmIdle | LoadConfig::Kolm | LoadConfig::KolmB)
    }

    /// Whether the configuration serves with the recipe pack (the others run without one).
    pub fn uses_pack(self) -> bool {
        matches!(self, LoadConfig::Kolm | LoadConfig::KolmB)
    }

    /// The configuration of a name ([`LoadConfig::name`]).
    pub fn named(name: &str) -> Option<LoadConfig> {
        LoadConfig::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether a row of this name is also read against plain-strict: an exact configuration other than plain-strict
    /// itself answers as it does, so it does the same work.
    pub fn read_against_strict(name: &str) -> bool {
        LoadConfig::named(name).is_some_and(|c| c.exact() && c != LoadConfig::PlainStrict)
    }

    /// A comma-separated list of names; `plain` is always run first (every ratio is against it).
    pub fn parse_list(s: &str) -> Result<Vec<LoadConfig>, String> {
        let mut v = vec![LoadConfig::Plain];
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let c = LoadConfig::named(name)
                .ok_or_else(|| format!("--configs: unknown load configuration `{name}` (known: plain, plain-strict, kolm-idle, kolm, kolm-b, ngram-simple)"))?;
            if !v.contains(&c) {
                v.push(c);
            }
        }
        Ok(v)
    }
}

/// What a load benchmark runs.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub model: PathBuf,
    /// The recipe pack the `kolm` configuration serves with (None: none, `pack=off`).
    pub pack: Option<PathBuf>,
    /// Plugin settings `kolm-b` adds to `kolm`'s (`key=value,…`).
    pub ab_arg: String,
    /// llama-server flags `kolm-b` adds to `kolm`'s.
    pub ab_server_args: Vec<String>,
    /// llama-server flags of every server, the one that answers alone included (`-kvu`: the slots share one KV
    /// cache, llama-server's layout when `-np` is not given).
    pub server_args: Vec<String>,
    pub plugin: PathBuf,
    pub configs: Vec<LoadConfig>,
    pub slots: Vec<u32>,
    pub clients: usize,
    pub per_client: usize,
    pub n_predict: i64,
    /// KV cells per slot.
    pub slot_ctx: u32,
    pub threads: Option<u32>,
    pub out: PathBuf,
    pub request_timeout: Duration,
    /// Rounds over the configurations at each slot count, every other one in reverse order, so that a
    /// machine's drift over minutes falls on every configuration alike; the rows pool the rounds.
    pub repeat: usize,
    /// Every plugin configuration logs a line per server step (`steplog=`) to
    /// `steps-np{slots}-{config}-r{round}.tsv` in `out`.
    pub step_log: bool,
    /// The stream's requests reuse cached prompts (`cache_prompt`, llama-server's default); the answers served alone
    /// never do.
    pub cache_prompt: bool,
}

/// One configuration at one slot count.
#[derive(Serialize)]
pub struct LoadRow {
    pub slots: u32,
    pub config: &'static str,
    pub sent: usize,
    pub done: usize,
    pub failed: usize,
    pub identical: usize,
    pub compared: usize,
    pub tokens: u64,
    /// The tokens its completed answers have served alone: plain's batches change some answers and with them the
    /// work (session 75's HumanEval rounds at `-np 8`: 7% fewer tokens, the first slots freed sooner, and a p99
    /// 2.8–3.7 s below the exact servers' that answer as alone).
    pub alone_tokens: u64,
    pub wall_s: f64,
    pub tok_per_s: f64,
    /// Each round's own rate, in round order: rounds of one configuration differ by up to 15% here, so a
    /// pooled ratio is read beside them.
    pub round_tok_per_s: Vec<f64>,
    /// Against plain at the same slot count.
    pub speedup: f64,
    pub p50_s: f64,
    pub p99_s: f64,
    /// Each round's own p99, in round order: pooled, p99 is the tail of the slowest round (on prose at `-np 8` a
    /// configuration that drafted 225 tokens of 8,000 read 31.5 s against plain's 30.2 s), so configurations are
    /// compared round by round as well.
    pub round_p99_s: Vec<f64>,
    /// p50 per workload, in the stream's order.
    pub p50_by_label: Vec<(String, f64)>,
    pub drafted: u64,
    pub accepted: u64,
    pub healthy: bool,
    /// The plugin's shutdown line.
    pub summary: String,
    /// What the run could reach at this slot count with its own acceptance (rows that drafted).
    pub ceiling: Option<LoadCeiling>,
    /// The slowest completed requests, slowest first: what p99 is made of (a long wait for a slot, or a slow
    /// answer once in one).
    pub slowest: Vec<Slow>,
    /// Per round, what its steps took by the plugin's step log (`--step-log`; None where there was none).
    pub in_place: Vec<Option<InPlace>>,
    /// Per round, the machine's speed in it: the decode call of one token from every slot, each call taken at the
    /// speed of its moment (ms; llama-server's call log, [`calls`]; None where it had no such call).
    pub round_unit_ms: Vec<Option<f64>>,
    /// Against plain's round beside each of its own (ABBA order); empty for plain. Flattened: `load.json` keeps one
    /// key per reading.
    #[serde(flatten)]
    pub against: AgainstPlain,
    /// Against plain-strict's round beside each of its own, for an exact configuration when the run served
    /// plain-strict: the same answers, so the same work, and the cost of exactness taken out.
    pub against_strict: Option<AgainstPlain>,
}

/// One slow request of a row.
#[derive(Serialize)]
pub struct Slow {
    pub round: usize,
    pub request: usize,
    pub label: String,
    /// Seconds into the round at which it was sent, from then to its last byte, and of those in its slot.
    pub sent_s: f64,
    pub secs: f64,
    pub served_s: f64,
    pub tokens: u64,
    pub drafted: u64,
    pub accepted: u64,
}

/// Slow requests kept per row.
const SLOWEST: usize = 3;

/// What the ceilings of a slot count rest on: the measured costs, plain's wall time and its prefill.
#[derive(Serialize)]
pub struct CeilingBasis {
    pub costs: LoadCosts,
    pub plain_wall_s: f64,
    pub plain_prefill_s: f64,
}

/// A workload's name and its held-out prompts, templated for the model.
pub struct Prompts {
    pub name: String,
    pub prompts: Vec<String>,
}

/// The stream: `clients × per_client` greedy requests, one prompt of each workload in turn (each request labelled
/// with its workload's name), every fourth one streamed.
pub fn plan(workloads: &[Prompts], o: &LoadOptions) -> Vec<Request> {
    let mut next = vec![0usize; workloads.len()];
    (0..o.clients * o.per_client)
        .map(|i| {
            let w = i % workloads.len();
            let p = &workloads[w].prompts;
            let prompt = p[next[w] % p.len()].clone();
            next[w] += 1;
            let kind = if i % 4 == 3 { Kind::Stream } else { Kind::Plain };
            Request { prompt, n_predict: o.n_predict, kind, label: workloads[w].name.clone(), cache_prompt: o.cache_prompt }
        })
        .collect()
}

/// What the report says of the stream's prompts when some come twice in a round: a repeated prompt's answer is
/// one the plugin's live index (`live=mem`) may have learned while serving it the first time, so a configuration
/// with one is then measured on traffic it has already seen as well as on new.
pub fn repeats_line(requests: &[Request]) -> Option<String> {
    let mut seen = ahash::AHashSet::new();
    let repeats = requests.iter().filter(|r| !seen.insert(r.prompt.as_str())).count();
    (repeats > 0).then(|| {
        format!(
            "{} requests a round of {} distinct prompts: {repeats} repeat one sent earlier in the round, whose answer the plugin's live index may have learned by then.\n\n",
            requests.len(),
            seen.len()
        )
    })
}

/// Whether `c`'s answers in this run must each be byte-identical to the prompt served alone: an exact configuration,
/// and with cached prompts only when its server reuses them exactly (`--cache-exact`, docs/batch-invariance.md).
pub fn promised(o: &LoadOptions, c: LoadConfig) -> bool {
    c.exact() && (!o.cache_prompt || server_options(o, c, 1, 0).extra.iter().any(|a| a == "--cache-exact"))
}

fn server_options(o: &LoadOptions, c: LoadConfig, slots: u32, round: usize) -> ServerOptions {
    let mut s = ServerOptions::new(&o.model, &o.out.join(format!("load-np{slots}-{}.log", c.name())));
    s.n_parallel = slots;
    s.n_ctx = o.slot_ctx;
    s.threads = o.threads;
    // An HTTP thread for every client. By default llama-server keeps n_parallel + 4 and spawns more only when none
    // is idle at the moment a connection is queued, which a burst of connections outruns: at `-np 4` eight of
    // the sixteen keep-alive clients had all four of their requests answered before the other eight were read,
    // and p99 was their wait (90 s of 100, in plain and kolm-rsd alike), not decoding.
    s.extra.extend(["--threads-http".to_string(), (o.clients + slots as usize).to_string()]);
    s.extra.extend(o.server_args.iter().cloned());
    match c {
        LoadConfig::Plain => {}
        LoadConfig::PlainStrict => s.extra.push("--strict-batching".into()),
        LoadConfig::KolmIdle => {
            s.plugin = Some(o.plugin.clone());
            s.plugin_arg = Some("pack=off,context=0,live=off,misslog=off".into());
        }
        LoadConfig::Kolm | LoadConfig::KolmB => {
            s.plugin = Some(o.plugin.clone());
            let pack = o.pack.as_ref().map_or("off".into(), |p| p.display().to_string());
            let mut arg = format!("pack={pack},live=mem,misslog={}", o.out.join("load-misses.jsonl").display());
            if c == LoadConfig::KolmB {
                if !o.ab_arg.is_empty() {
                    arg = format!("{arg},{}", o.ab_arg);
                }
                s.extra.extend(o.ab_server_args.iter().cloned());
            }
            s.plugin_arg = Some(arg);
        }
        LoadConfig::NgramSimple => s.extra.extend(["--spec-type".to_string(), "ngram-simple".to_string()]),
    }
    s.env.push((calls::CALL_LOG_ENV.into(), call_log_path(o, c, slots, round)));
    if let Some(arg) = s.plugin_arg.as_mut().filter(|_| o.step_log) {
        arg.push_str(&format!(",steplog={}", step_log_path(o, c, slots, round).display()));
    }
    s
}

/// Where llama-server logs a run's decode calls (patch 0022): every configuration's machine speed.
fn call_log_path(o: &LoadOptions, c: LoadConfig, slots: u32, round: usize) -> PathBuf {
    o.out.join(calls::log_name(slots, c.name(), round))
}

fn step_log_path(o: &LoadOptions, c: LoadConfig, slots: u32, round: usize) -> PathBuf {
    o.out.join(format!("steps-np{slots}-{}-r{}.tsv", c.name(), round + 1))
}

/// Runs every configuration at every slot count on the same stream; rows in (slots, config) order, then the
/// ceiling of every row that drafted, from call costs measured with the servers stopped (one basis per slot
/// count at which something drafted).
pub fn run(workloads: &[Prompts], o: &LoadOptions, obs: &dyn Observer) -> Result<(Vec<LoadRow>, Vec<CeilingBasis>), ServerError> {
    std::fs::create_dir_all(&o.out).map_err(|e| ServerError::Start(format!("{}: {e}", o.out.display())))?;
    let requests = plan(workloads, o);
    let limits = Limits { clients: o.clients, deadline: Duration::from_secs(24 * 3600), request_timeout: o.request_timeout };
    obs.add_total((1 + o.slots.len() * o.configs.len() * o.repeat.max(1)) as u64);

    let alone_server = Server::start(&server_options(o, LoadConfig::Plain, 1, 0))?;
    let alone = served::alone(&alone_server, &requests, o.request_timeout);
    alone_server.stop();
    obs.step("answers served alone");

    let mut rows = Vec::new();
    // Per slot count: the evaluated prompt tokens of plain's completed requests.
    let mut plain_prompts = Vec::new();
    for &slots in &o.slots {
        let mut sides: Vec<Vec<Side>> = o.configs.iter().map(|_| Vec::new()).collect();
        let mut in_place: Vec<Vec<Option<InPlace>>> = o.configs.iter().map(|_| Vec::new()).collect();
        let mut units: Vec<Vec<Option<f64>>> = o.configs.iter().map(|_| Vec::new()).collect();
        for round in 0..o.repeat.max(1) {
            let mut order: Vec<usize> = (0..o.configs.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let c = o.configs[i];
                let opts = server_options(o, c, slots, round);
                let mut server = Server::start(&opts)?;
                let mut side = Side::serve(c.name(), &mut server, &requests, limits);
                server.stop();
                side.summary = plugin_summary(&opts.log);
                let steps = opts.plugin_arg.as_ref().filter(|_| o.step_log).and_then(|_| {
                    let path = step_log_path(o, c, slots, round);
                    steps::read(&path).unwrap_or_else(|e| {
                        obs.note(&format!("step log not read: {e}"));
                        None
                    })
                });
                in_place[i].push(steps);
                let unit = calls::read(&call_log_path(o, c, slots, round), slots as usize).unwrap_or_else(|e| {
                    obs.note(&format!("call log not read: {e}"));
                    None
                });
                units[i].push(unit.map(|u| u.unit_ms));
                obs.step(&format!("-np {slots} {} round {}: {:.1} tok/s", c.name(), round + 1, side.tok_per_s()));
                sides[i].push(side);
            }
        }
        let base = pooled_rate(&sides[0]);
        let first = rows.len();
        for (((c, s), steps), unit) in o.configs.iter().zip(&sides).zip(in_place).zip(units) {
            rows.push(LoadRow { in_place: steps, round_unit_ms: unit, ..row(s, &requests, &alone, slots, *c, base) });
        }
        pair(&mut rows[first..]);
        let prompts: Vec<u64> =
            sides[0].iter().flat_map(|s| &s.records).filter_map(|r| if let Outcome::Done { prompt_n, .. } = r.outcome { Some(prompt_n) } else { None }).collect();
        plain_prompts.push((slots, prompts));
    }
    let bases = ceilings(&mut rows, &plain_prompts, o, obs).map_err(|e| ServerError::Start(format!("measuring the ceiling: {e}")))?;
    Ok((rows, bases))
}

/// Pairs every row of a slot count after the first (plain) with plain round by round, and every exact one with
/// plain-strict where the run served it.
fn pair(rows: &mut [LoadRow]) {
    let Some((plain, others)) = rows.split_first_mut() else { return };
    let plain = Plain::new(plain.rounds());
    for r in others {
        r.against = plain.against(&r.rounds());
    }
    let Some(strict) = rows.iter().find(|r| r.config == LoadConfig::PlainStrict.name()) else { return };
    let strict = Plain::new(strict.rounds());
    let against: Vec<Option<AgainstPlain>> =
        rows.iter().map(|r| LoadConfig::read_against_strict(r.config).then(|| strict.against(&r.rounds()))).collect();
    for (r, a) in rows.iter_mut().zip(against) {
        r.against_strict = a;
    }
}

impl LoadRow {
    fn rounds(&self) -> Rounds<'_> {
        Rounds { tok_per_s: &self.round_tok_per_s, p99_s: &self.round_p99_s, unit_ms: &self.round_unit_ms }
    }
}

/// Fills in the ceiling of every row that drafted; returns what each slot count's ceilings rest on.
fn ceilings(rows: &mut [LoadRow], plain_prompts: &[(u32, Vec<u64>)], o: &LoadOptions, obs: &dyn Observer) -> Result<Vec<CeilingBasis>, crate::llama::LlamaError> {
    let mut bases = Vec::new();
    let mut model = None;
    for (slots, prompts) in plain_prompts {
        let (Some(plain), true) = (
            rows.iter().find(|r| r.slots == *slots && r.config == LoadConfig::Plain.name()),
            rows.iter().any(|r| r.slots == *slots && r.drafted > 0),
        ) else {
            continue;
        };
        let wall_s = plain.wall_s;
        let model = match &mut model {
            Some(m) => m,
            None => model.insert(Model::load(&o.model, &ModelOptions { n_gpu_layers: 0 })?),
        };
        let longest = prompts.iter().copied().max().unwrap_or(0) as usize;
        let max_prompt = longest.next_power_of_two().clamp(32, o.slot_ctx as usize / 2);
        // A slot's cache holds its prompt and part of its answer when it verifies: the median prompt.
        let mut sorted = prompts.clone();
        sorted.sort_unstable();
        let n_past = (sorted.get(sorted.len() / 2).copied().unwrap_or(128) as usize + o.n_predict.max(0) as usize / 2).clamp(16, o.slot_ctx as usize - 64);
        let threads = o.threads.map_or(0, |t| t as i32);
        obs.add_total(1);
        let costs = load_ceiling::measure(model, *slots as usize, threads, n_past, max_prompt, 3)?;
        let prefill_ms: f64 = prompts.iter().map(|&n| costs.prefill(n as usize)).sum();
        for r in rows.iter_mut().filter(|r| r.slots == *slots) {
            r.ceiling = load_ceiling::ceiling(&costs, r.drafted, r.accepted, wall_s * 1e3, prefill_ms, r.speedup);
        }
        obs.step(&format!("-np {slots}: call costs measured"));
        bases.push(CeilingBasis { costs, plain_wall_s: wall_s, plain_prefill_s: prefill_ms / 1e3 });
    }
    Ok(bases)
}

/// Tokens of completed answers per second over several runs of the stream.
fn pooled_rate(sides: &[Side]) -> f64 {
    let tokens: u64 = sides.iter().flat_map(|s| &s.records).map(|r| if let Outcome::Done { tokens, .. } = r.outcome { tokens } else { 0 }).sum();
    tokens as f64 / sides.iter().map(|s| s.wall).sum::<f64>().max(1e-9)
}

/// One configuration's row from its runs (rounds) at one slot count.
fn row(sides: &[Side], requests: &[Request], alone: &std::collections::HashMap<served::Key, Alone>, slots: u32, c: LoadConfig, base: f64) -> LoadRow {
    let records = || sides.iter().flat_map(|s| &s.records);
    let (mut identical, mut compared, mut alone_tokens) = (0, 0, 0);
    for s in sides {
        let (same, differ) = s.identity(requests, alone);
        identical += same;
        compared += same + differ.len();
        alone_tokens += s.alone_tokens(requests, alone);
    }
    let count = |f: fn(&Outcome) -> bool| records().filter(|r| f(&r.outcome)).count();
    let (mut tokens, mut drafted, mut accepted) = (0, 0, 0);
    for r in records() {
        if let Outcome::Done { tokens: t, draft_n, draft_accepted, .. } = r.outcome {
            tokens += t;
            drafted += draft_n;
            accepted += draft_accepted;
        }
    }
    let round_lat: Vec<Vec<f64>> = sides.iter().map(|s| s.latencies(requests)).collect();
    let lat = round_lat.concat();
    // In the stream's order: the workloads as they were given.
    let mut labels: Vec<&str> = Vec::new();
    for r in requests {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    let p50_by_label = labels
        .into_iter()
        .map(|l| {
            let xs: Vec<f64> = records().filter(|r| requests[r.request].label == l && matches!(r.outcome, Outcome::Done { .. })).map(|r| r.secs).collect();
            (l.to_string(), crate::quantile::quantile(&xs, 0.5))
        })
        .collect();
    let mut slowest: Vec<Slow> = sides
        .iter()
        .enumerate()
        .flat_map(|(round, s)| s.answers(requests).map(move |r| (round, r)))
        .filter_map(|(round, r)| match r.outcome {
            Outcome::Done { tokens, draft_n, draft_accepted, served_s, .. } => Some(Slow {
                round,
                request: r.request,
                label: requests[r.request].label.clone(),
                sent_s: r.started,
                secs: r.secs,
                served_s,
                tokens,
                drafted: draft_n,
                accepted: draft_accepted,
            }),
            _ => None,
        })
        .collect();
    slowest.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    slowest.truncate(SLOWEST);
    // The tokens summed above over the rounds' wall time: what `pooled_rate` gives, without a second pass.
    let wall_s: f64 = sides.iter().map(|s| s.wall).sum();
    let rate = tokens as f64 / wall_s.max(1e-9);
    LoadRow {
        slots,
        config: c.name(),
        sent: records().count(),
        done: count(|o| matches!(o, Outcome::Done { .. })),
        failed: count(|o| matches!(o, Outcome::Failed(_) | Outcome::Refused { .. })),
        identical,
        compared,
        tokens,
        alone_tokens,
        wall_s,
        tok_per_s: rate,
        round_tok_per_s: sides.iter().map(Side::tok_per_s).collect(),
        speedup: rate / base.max(1e-9),
        p50_s: crate::quantile::quantile(&lat, 0.5),
        p99_s: crate::quantile::quantile(&lat, 0.99),
        round_p99_s: round_lat.iter().map(|l| crate::quantile::quantile(l, 0.99)).collect(),
        against: AgainstPlain::default(),
        against_strict: None,
        p50_by_label,
        drafted,
        accepted,
        healthy: sides.iter().all(|s| s.healthy),
        summary: sides.iter().map(|s| s.summary.as_str()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" | "),
        ceiling: None,
        slowest,
        in_place: Vec::new(),
        round_unit_ms: Vec::new(),
    }
}

/// The ratios again with each round at one machine speed, and every round's unit beside them.
fn at_speed_lines(s: &mut String, rows: &[LoadRow]) {
    if rows.iter().all(|r| r.round_unit_ms.iter().all(Option::is_none)) {
        return;
    }
    let _ = writeln!(
        s,
        "\nAt one machine speed: each round's rate times its unit, the decode call of one token from every slot, each call \
         taken at the speed of its moment (the median of the nearest such calls; llama-server's call log, patch 0022; the \
         same work in every configuration), then as above. Units by round:"
    );
    for r in rows {
        let units: Vec<String> = r.round_unit_ms.iter().map(|u| u.map_or("–".into(), |u| format!("{u:.1}"))).collect();
        let ratio = r.against.paired_at_speed.as_ref().map_or(String::new(), |p| {
            let below = r.against.p99_below_at_speed.map_or(String::new(), |k| format!("; p99 at or below plain's in {k} of {}", p.rounds));
            format!(": {:.3}× (95% interval {:.3}–{:.3}×, {} rounds){below}", p.mean, p.lo, p.hi, p.rounds)
        });
        let units_against = r.against.unit_vs_plain.as_ref().map_or(String::new(), |u| {
            let own = if u.lo > 1.0 { " (above plain's beyond the pairings' spread: if that is a cost of its own and not the machine's drift, the rates' ratio is the one to read)" } else { "" };
            format!("; its units × plain's {:.3}× ({:.3}–{:.3}×){own}", u.mean, u.lo, u.hi)
        });
        let _ = writeln!(s, "- -np {} {} (ms {}){ratio}{units_against}", r.slots, r.config, units.join(", "));
    }
}

/// Per plugin round, its wall time split by the step log into prompts and generation, also in units of the run's
/// own one-token step of every slot (`--step-log`).
fn in_place_table(s: &mut String, rows: &[LoadRow]) {
    if rows.iter().all(|r| r.in_place.iter().all(Option::is_none)) {
        return;
    }
    let _ = writeln!(
        s,
        "\nSteps in place (the plugin's step log; m: the round's median generation step with every slot at one token, \
         the machine's speed in that round; wall/price: the drafter's β model against the steps' wall time):\n"
    );
    let _ = writeln!(s, "| -np | config | round | in prompt steps s | in generation steps s | m ms | generation in m | prompt per request in m | wall/price |");
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        for (i, p) in r.in_place.iter().enumerate() {
            let Some(p) = p else { continue };
            let price = p.wall_over_price.map_or("–".into(), |x| format!("{x:.2}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.1} | {price} |",
                r.slots,
                r.config,
                i + 1,
                p.prompt_s,
                p.gen_s,
                p.unit_ms,
                p.gen_units(),
                p.prompt_units_per_request()
            );
        }
    }
}

/// A line per row paired with `reference` round by round: the rates' ratio with its interval, and the rounds in which
/// p99 was at or below the reference's.
fn paired_lines<'a>(rows: &'a [LoadRow], reference: &str, against: impl Fn(&'a LoadRow) -> Option<&'a AgainstPlain>) -> Vec<String> {
    rows.iter()
        .filter_map(|r| {
            let (p, below) = against(r)?.paired.as_ref()?;
            Some(format!(
                "- -np {} {}: {:.3}× (95% interval {:.3}–{:.3}×, {} rounds); p99 at or below {reference}'s in {below} of {}",
                r.slots, r.config, p.mean, p.lo, p.hi, p.rounds, p.rounds
            ))
        })
        .collect()
}

/// Tokens served against the same answers' alone, as a table cell's suffix (nothing where they are not known).
pub(super) fn of_alone(tokens: u64, alone_tokens: u64) -> String {
    if alone_tokens > 0 {
        format!(" ({:.3}×)", tokens as f64 / alone_tokens as f64)
    } else {
        String::new()
    }
}

/// A pooled value, followed by each round's when there are several.
fn by_round(pooled: f64, rounds: &[f64]) -> String {
    match rounds {
        [_, _, ..] => format!("{pooled:.1} ({})", rounds.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ")),
        _ => format!("{pooled:.1}"),
    }
}

/// The rows as a Markdown table, with the settings above it and what the ceilings rest on below.
pub fn markdown(rows: &[LoadRow], bases: &[CeilingBasis], o: &LoadOptions) -> String {
    let mut s = String::new();
    let names: Vec<&str> = rows.first().map(|r| r.p50_by_label.iter().map(|(l, _)| l.as_str()).collect()).unwrap_or_default();
    let _ = writeln!(
        s,
        "{} clients × {} requests ({}{}, a quarter streamed{}; the first of each client sent {} ms apart, in order), {} round(s) per configuration, `n_predict` {}, {} KV cells a slot, model `{}`, {}{}\n",
        o.clients,
        o.per_client,
        names.join(" and "),
        if names.len() > 1 { " in turn" } else { "" },
        if o.cache_prompt { ", `cache_prompt` true (the answers served alone without it)" } else { "" },
        FIRST_SENDS_APART.as_millis(),
        o.repeat.max(1),
        o.n_predict,
        o.slot_ctx,
        file_name(&o.model),
        match &o.pack {
            Some(p) if o.configs.iter().any(|c| c.uses_pack()) => format!("pack `{}`", file_name(p)),
            _ => "no pack".into(),
        },
        if o.server_args.is_empty() { String::new() } else { format!(", every server with `{}`", o.server_args.join(" ")) }
    );
    let _ = writeln!(s, "| -np | config | done | identical to alone (its tokens × theirs) | tok/s (by round) | × plain | p50 s | p99 s (by round) | p50 {} s | drafted | accepted | ceiling (γ) | of ceiling | healthy |", names.join(" / "));
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|");
    for r in rows {
        let by_label: Vec<String> = r.p50_by_label.iter().map(|(_, v)| format!("{v:.1}")).collect();
        let rate = by_round(r.tok_per_s, &r.round_tok_per_s);
        let p99 = by_round(r.p99_s, &r.round_p99_s);
        let (ceil, of) = match &r.ceiling {
            Some(c) => (format!("{:.2}× ({})", c.s, c.gamma), format!("{:.0}%", 100.0 * c.share)),
            None => ("–".into(), "–".into()),
        };
        let work = of_alone(r.tokens, r.alone_tokens);
        let _ = writeln!(
            s,
            "| {} | {} | {}/{} | {}/{}{work} | {} | {:.2}× | {:.1} | {} | {} | {} | {} | {} | {} | {} |",
            r.slots,
            r.config,
            r.done,
            r.sent,
            r.identical,
            r.compared,
            rate,
            r.speedup,
            r.p50_s,
            p99,
            by_label.join(" / "),
            r.drafted,
            r.accepted,
            ceil,
            of,
            if r.healthy { "yes" } else { "**no**" }
        );
    }
    let pairs = paired_lines(rows, "plain", |r| Some(&r.against));
    if !pairs.is_empty() {
        let _ = writeln!(s, "\nEach round against plain's round beside it (ABBA order), the rates' ratio as a geometric mean over the rounds:");
        let _ = writeln!(s, "{}", pairs.join("\n"));
    }
    let strict = paired_lines(rows, "plain-strict", |r| r.against_strict.as_ref());
    if !strict.is_empty() {
        let _ = writeln!(
            s,
            "\nAgainst plain-strict's round beside it: the same answers as alone, so the same work (plain's batches change \
             some answers, and with them the tokens served and when slots free), the cost of exactness taken out:"
        );
        let _ = writeln!(s, "{}", strict.join("\n"));
    }
    at_speed_lines(&mut s, rows);
    let _ = writeln!(s, "\nSlowest requests (time to last token, of it in a slot, sent at into the round, tokens, drafted / accepted):");
    for r in rows {
        let slow: Vec<String> = r
            .slowest
            .iter()
            .map(|x| format!("{:.1} s ({:.1} s in a slot; {}, #{} of round {}, sent at {:.1} s, {} tokens, {} / {})", x.secs, x.served_s, x.label, x.request, x.round + 1, x.sent_s, x.tokens, x.drafted, x.accepted))
            .collect();
        let _ = writeln!(s, "- -np {} {}: {}", r.slots, r.config, slow.join("; "));
    }
    in_place_table(&mut s, rows);
    if !bases.is_empty() {
        let _ = writeln!(
            s,
            "\nThe ceiling: every generating slot drafting γ tokens at every step with the row's acceptance (accepted / drafted), γ \
             chosen best, from the strict calls' measured cost; prefill is not drafted and keeps plain's share of the wall time."
        );
    }
    for b in bases {
        let c = &b.costs;
        let steps: Vec<String> = [2, 3, 5, 9, 16].iter().filter(|&&k| k <= c.step_ms.len()).map(|&k| format!("t({k})/t(1) {:.2}", c.step_ms[k - 1] / c.step_ms[0])).collect();
        let _ = writeln!(
            s,
            "- -np {}: plain took {:.0} s, of which prefill {:.0} s ({:.0}%); one step of 1 token a slot {:.1} ms ({} slots, {} tokens cached each); {}",
            c.slots,
            b.plain_wall_s,
            b.plain_prefill_s,
            100.0 * b.plain_prefill_s / b.plain_wall_s.max(1e-9),
            c.step_ms[0],
            c.slots,
            c.n_past,
            steps.join(", ")
        );
        if !c.uneven.is_empty() {
            let shapes: Vec<String> = c
                .uneven
                .iter()
                .map(|u| {
                    let shape: Vec<String> = u.shape.iter().map(usize::to_string).collect();
                    format!("{} {:.0}/{:.0}/{:.0}", shape.join("-"), u.ms, u.passes_ms, u.calls_ms)
                })
                .collect();
            let _ = writeln!(s, "  uneven steps, tokens a slot: ms measured / as the sum of their passes / as one call: {}", shapes.join(", "));
        }
    }
    s
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Record;
    use std::collections::HashMap;

    fn opts() -> LoadOptions {
        LoadOptions {
            model: "m.gguf".into(),
            pack: Some("m.recipes.json".into()),
            ab_arg: "shared_gain=0.05".into(),
            ab_server_args: vec!["-kvu".into()],
            server_args: Vec::new(),
            plugin: "libkolm_rsd.so".into(),
            configs: LoadConfig::ALL.to_vec(),
            slots: vec![1, 4, 8],
            clients: 16,
            per_client: 4,
            n_predict: 64,
            slot_ctx: 1024,
            threads: None,
            out: "out".into(),
            request_timeout: Duration::from_secs(60),
            repeat: 1,
            step_log: false,
            cache_prompt: false,
        }
    }

    fn workloads(sets: &[(&str, &[&str])]) -> Vec<Prompts> {
        sets.iter().map(|(name, p)| Prompts { name: name.to_string(), prompts: p.iter().map(|x| x.to_string()).collect() }).collect()
    }

    #[test]
    fn a_stream_that_repeats_prompts_says_so() {
        let p = |n: usize| Prompts { name: "w".into(), prompts: (0..n).map(|i| format!("p{i}")).collect() };
        let o = LoadOptions { clients: 16, per_client: 2, ..opts() };
        let line = repeats_line(&plan(&[p(18)], &o)).unwrap();
        assert!(line.starts_with("32 requests a round of 18 distinct prompts: 14 repeat one"), "{line}");
        assert_eq!(repeats_line(&plan(&[p(41)], &o)), None, "41 prompts serve 32 requests once each");
    }

    #[test]
    fn the_stream_takes_the_workloads_in_turn_under_their_names_and_streams_a_quarter() {
        let reqs = plan(&workloads(&[("json-extraction", &["s1", "s2"]), ("mt-bench", &["p1"])]), &opts());
        assert_eq!(reqs.len(), 64);
        assert_eq!(reqs.iter().filter(|r| r.label == "json-extraction").count(), 32);
        assert_eq!(reqs.iter().filter(|r| r.kind == Kind::Stream).count(), 16);
        assert_eq!(reqs[..4].iter().map(|r| r.prompt.as_str()).collect::<Vec<_>>(), ["s1", "p1", "s2", "p1"]);
        assert!(reqs.iter().all(|r| !r.cache_prompt), "the stream reuses cached prompts unasked");
        let cached = plan(&workloads(&[("mt-bench", &["p1"])]), &LoadOptions { cache_prompt: true, ..opts() });
        assert!(cached.iter().all(|r| r.cache_prompt), "--cache-prompt: a request without it");
        let alone = plan(&workloads(&[("mt-bench", &["p1"])]), &opts());
        assert!(alone.iter().all(|r| r.label == "mt-bench"), "one workload: its name, not \"structured\"");
        let three = plan(&workloads(&[("a", &["a1"]), ("b", &["b1"]), ("c", &["c1"])]), &opts());
        assert_eq!(three[..4].iter().map(|r| r.prompt.as_str()).collect::<Vec<_>>(), ["a1", "b1", "c1", "a1"], "a third workload is served too");
    }

    #[test]
    fn the_report_names_the_workloads_it_served() {
        let reqs = plan(&workloads(&[("mt-bench", &["p1"]), ("json-extraction", &["s1"])]), &opts());
        let done = |i: usize| Record {
            request: i,
            outcome: Outcome::Done { content: String::new(), tokens: 10, prompt_n: 1, draft_n: 0, draft_accepted: 0, served_s: 0.5 },
            secs: 1.0 + i as f64,
            started: 0.0,
        };
        let side = Side { name: "plain".into(), records: (0..4).map(done).collect(), wall: 10.0, healthy: true, rss_kib: None, summary: String::new() };
        let r = row(&[side], &reqs, &HashMap::new(), 4, LoadConfig::Plain, 1.0);
        assert_eq!(r.p50_by_label.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(), ["mt-bench", "json-extraction"], "in the stream's order");
        let md = markdown(&[r], &[], &opts());
        assert!(md.contains("(mt-bench and json-extraction in turn, a quarter streamed; the first of each client sent 20 ms apart, in order)"), "{md}");
        let cached = markdown(&[], &[], &LoadOptions { cache_prompt: true, ..opts() });
        assert!(cached.contains("a quarter streamed, `cache_prompt` true (the answers served alone without it); the first"), "{cached}");
        assert!(md.contains("| p50 mt-bench / json-extraction s |"), "{md}");
        assert!(md.contains("| 1.0 / 2.0 |"), "each workload's p50 by nearest rank (1, 3 s and 2, 4 s): {md}");
        assert!(md.contains("pack `m.recipes.json`"), "{md}");
        let plain_only = LoadOptions { configs: LoadConfig::parse_list("plain-strict,kolm-idle").unwrap(), ..opts() };
        assert!(markdown(&[], &[], &plain_only).contains(", no pack"), "configurations that serve no pack name one");
    }

    #[test]
    fn a_row_names_its_slowest_answers_and_leaves_raw_bodies_out() {
        let mut reqs = plan(&workloads(&[("structured", &["s"]), ("prose", &["p"])]), &opts());
        reqs[5].kind = Kind::Raw { path: "/completion", body: "{".into() };
        let done = |i: usize, secs: f64| Record {
            request: i,
            outcome: Outcome::Done { content: String::new(), tokens: 10 + i as u64, prompt_n: 1, draft_n: i as u64, draft_accepted: 0, served_s: 0.5 },
            secs,
            started: i as f64,
        };
        let mut records: Vec<Record> = (0..5).map(|i| done(i, 1.0 + i as f64)).collect();
        records.push(done(5, 99.0));
        records.push(Record { request: 6, outcome: Outcome::Failed("cut".into()), secs: 50.0, started: 6.0 });
        let side = Side { name: "kolm".into(), records, wall: 10.0, healthy: true, rss_kib: None, summary: String::new() };
        let r = row(&[side], &reqs, &HashMap::new(), 4, LoadConfig::Kolm, 1.0);
        let slow: Vec<(usize, f64, u64)> = r.slowest.iter().map(|x| (x.request, x.secs, x.tokens)).collect();
        assert_eq!(slow, [(4, 5.0, 14), (3, 4.0, 13), (2, 3.0, 12)], "completed greedy answers only, slowest first");
        assert_eq!(r.p99_s, 5.0, "p99 is made of the same requests");
        let md = markdown(&[r], &[], &opts());
        assert!(md.contains("- -np 4 kolm: 5.0 s (0.5 s in a slot; structured, #4 of round 1, sent at 4.0 s, 14 tokens, 4 / 0)"), "{md}");
    }

    /// A round that served one answer of `tokens` in `wall` seconds, `secs` to its last token.
    fn one_answer(tokens: u64, wall: f64, secs: f64) -> Side {
        Side {
            name: "kolm".into(),
            records: vec![Record {
                request: 0,
                outcome: Outcome::Done { content: String::new(), tokens, prompt_n: 1, draft_n: 0, draft_accepted: 0, served_s: 1.0 },
                secs,
                started: 0.0,
            }],
            wall,
            healthy: true,
            rss_kib: None,
            summary: String::new(),
        }
    }

    #[test]
    fn rounds_pool_their_tokens_and_each_keeps_its_own_rate_and_p99() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let r = row(&[one_answer(300, 10.0, 1.0), one_answer(300, 20.0, 3.0)], &reqs, &HashMap::new(), 4, LoadConfig::Kolm, 10.0);
        assert_eq!(r.round_tok_per_s, [30.0, 15.0]);
        assert_eq!(r.tok_per_s, 20.0, "600 tokens in 30 s, not the mean of the rounds' rates");
        let md = markdown(&[r], &[], &opts());
        assert!(md.contains("| 20.0 (30.0, 15.0) | 2.00× |"));
        assert!(md.contains("| 3.0 (1.0, 3.0) |"), "pooled p99 is the slow round's; each round's beside it: {md}");
        assert!(!md.contains("Steps in place"), "no step log, no table");
        let one = row(&[one_answer(300, 10.0, 1.0)], &reqs, &HashMap::new(), 4, LoadConfig::Kolm, 10.0);
        assert!(markdown(&[one], &[], &opts()).contains("| 30.0 | 3.00× | 1.0 | 1.0 |"), "one round: its rate and p99 alone");
    }

    #[test]
    fn each_round_is_paired_with_plain_s_round_beside_it() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let side = |wall: f64, secs: f64| one_answer(100, wall, secs);
        // Plain's second round ran half as fast; kolm 10% faster than plain in each round, its p99 above in one.
        let plain = row(&[side(10.0, 2.0), side(20.0, 4.0)], &reqs, &HashMap::new(), 8, LoadConfig::Plain, 1.0);
        let kolm = row(&[side(10.0 / 1.1, 2.5), side(20.0 / 1.1, 3.0)], &reqs, &HashMap::new(), 8, LoadConfig::Kolm, 1.0);
        let mut rows = vec![plain, kolm];
        pair(&mut rows);
        assert!(rows[0].against.paired.is_none(), "plain is the reference");
        let (p, below) = rows[1].against.paired.clone().unwrap();
        assert!((p.mean - 1.1).abs() < 1e-9 && (p.lo - 1.1).abs() < 1e-9, "the drift between rounds cancels: {p:?}");
        assert_eq!((p.rounds, below), (2, 1));
        let md = markdown(&rows, &[], &opts());
        assert!(md.contains("- -np 8 kolm: 1.100× (95% interval 1.100–1.100×, 2 rounds); p99 at or below plain's in 1 of 2"), "{md}");
        let mut one = vec![row(&[side(10.0, 2.0)], &reqs, &HashMap::new(), 8, LoadConfig::Plain, 1.0), row(&[side(9.0, 2.0)], &reqs, &HashMap::new(), 8, LoadConfig::Kolm, 1.0)];
        pair(&mut one);
        assert!(one[1].against.paired.is_none() && !markdown(&one, &[], &opts()).contains("Each round against"), "one round: nothing to pair");
    }

    #[test]
    fn exact_rows_are_read_against_plain_strict_too_and_every_row_against_the_tokens_asked() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let alone = HashMap::from([(("s".to_string(), 64), Alone { content: String::new(), tokens: 100 })]);
        let rounds = |c, tokens, secs: [(f64, f64); 2]| {
            let mut sides = secs.map(|(wall, p99)| one_answer(tokens, wall, p99));
            for r in sides.iter_mut().flat_map(|s| &mut s.records) {
                if let Outcome::Done { content, .. } = &mut r.outcome {
                    *content = if tokens == 100 { String::new() } else { "cut short".into() };
                }
            }
            row(&sides, &reqs, &alone, 8, c, 1.0)
        };
        // Plain's batches cut its answer to 93 tokens of the 100 it has alone, and its p99 is the lowest; kolm is 10%
        // faster than plain-strict in both rounds, its p99 above plain-strict's in the second.
        let mut rows = vec![
            rounds(LoadConfig::Plain, 93, [(9.0, 2.0), (18.0, 4.0)]),
            rounds(LoadConfig::PlainStrict, 100, [(11.0, 2.4), (22.0, 4.4)]),
            rounds(LoadConfig::Kolm, 100, [(10.0, 2.3), (20.0, 4.6)]),
            rounds(LoadConfig::NgramSimple, 100, [(10.0, 2.0), (20.0, 4.0)]),
        ];
        pair(&mut rows);
        assert_eq!(rows.iter().map(|r| (r.tokens, r.alone_tokens)).collect::<Vec<_>>(), [(186, 200), (200, 200), (200, 200), (200, 200)]);
        let strict: Vec<bool> = rows.iter().map(|r| r.against_strict.is_some()).collect();
        assert_eq!(strict, [false, false, true, false], "only an exact configuration answers as plain-strict does");
        let (p, below) = rows[2].against_strict.as_ref().unwrap().paired.clone().unwrap();
        assert!((p.mean - 1.1).abs() < 1e-9 && (p.rounds, below) == (2, 1), "{p:?}");
        assert_eq!(rows[2].against.paired.as_ref().unwrap().1, 0, "against plain, whose work was less, its p99 is above in both");
        let md = markdown(&rows, &[], &opts());
        assert!(md.contains("| 8 | plain | 2/2 | 0/2 (0.930×) |"), "plain's tokens against the answers alone: {md}");
        assert!(md.contains("| 8 | kolm | 2/2 | 2/2 (1.000×) |"), "{md}");
        assert!(md.contains("- -np 8 kolm: 1.100× (95% interval 1.100–1.100×, 2 rounds); p99 at or below plain-strict's in 1 of 2"), "{md}");
        let json = serde_json::to_value(&rows[2]).unwrap();
        assert!(json["against_strict"]["paired"].is_array() && json["alone_tokens"] == 200, "{json}");
        assert!(serde_json::to_value(&rows[0]).unwrap()["against_strict"].is_null());
    }

    #[test]
    fn at_one_machine_speed_a_round_run_on_a_faster_machine_gains_nothing_from_it() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let side = |wall: f64| one_answer(100, wall, 1.0);
        // Plain's rounds: 10 tok/s with a 100 ms unit. kolm's first round ran while the machine was faster (a 60 ms
        // unit) at 15 tok/s, its second at plain's speed at 11 tok/s: 1.28× as rates, 0.995× at one speed.
        let plain = LoadRow { round_unit_ms: vec![Some(100.0), Some(100.0)], ..row(&[side(10.0), side(10.0)], &reqs, &HashMap::new(), 4, LoadConfig::Plain, 1.0) };
        let kolm = |units: Vec<Option<f64>>| LoadRow { round_unit_ms: units, ..row(&[side(100.0 / 15.0), side(100.0 / 11.0)], &reqs, &HashMap::new(), 4, LoadConfig::Kolm, 1.0) };
        let (untimed, kolm) = (kolm(vec![Some(60.0), None]), kolm(vec![Some(60.0), Some(100.0)]));
        let mut rows = vec![plain, kolm, untimed];
        pair(&mut rows);
        assert!((rows[1].against.paired.as_ref().unwrap().0.mean - (1.5f64 * 1.1).sqrt()).abs() < 1e-9);
        let p = rows[1].against.paired_at_speed.as_ref().unwrap();
        assert!((p.mean - (0.9f64 * 1.1).sqrt()).abs() < 1e-9, "{p:?}");
        assert!(rows[0].against.paired_at_speed.is_none() && rows[2].against.paired_at_speed.is_none(), "plain, and a round without a unit");
        // load.json keeps one key per reading, as before they were one type.
        let json = serde_json::to_value(&rows[1]).unwrap();
        assert_eq!(json["paired_at_speed"]["mean"].as_f64(), Some(p.mean), "{json}");
        assert!(json["paired"].is_array() && json["p99_below_at_speed"] == 1 && json.get("against").is_none(), "{json}");
        let md = markdown(&rows, &[], &opts());
        assert!(md.contains("- -np 4 plain (ms 100.0, 100.0)\n"), "{md}");
        // Every request took 1 s: as long as plain's in seconds, but 1/60 of kolm's faster first round against
        // 1/100 of plain's, so its tail was longer at one speed in that round.
        assert_eq!((rows[1].against.paired.as_ref().unwrap().1, rows[1].against.p99_below_at_speed), (2, Some(1)));
        assert!(md.contains("- -np 4 kolm (ms 60.0, 100.0): 0.995× (95% interval"), "{md}");
        assert!(md.contains("2 rounds); p99 at or below plain's in 1 of 2; its units × plain's 0.775× ("), "{md}");
        assert!(md.contains("- -np 4 kolm (ms 60.0, –)\n"), "{md}");
        assert!(!md.contains("beyond the pairings' spread"), "a faster round is the machine's: {md}");
    }

    #[test]
    fn calls_slower_than_plain_s_beyond_the_pairings_spread_are_flagged() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let side = |wall: f64| one_answer(100, wall, 1.0);
        let timed = |c, units: Vec<f64>| LoadRow { round_unit_ms: units.into_iter().map(Some).collect(), ..row(&[side(10.0), side(10.0)], &reqs, &HashMap::new(), 8, c, 1.0) };
        // kolm's one-token calls took 10% longer than plain's beside them in both rounds: its rates equal plain's,
        // so at one speed it reads 1.10×: a gain made of its own slowness, if that is what the slower calls are.
        let mut rows = vec![timed(LoadConfig::Plain, vec![100.0, 90.0]), timed(LoadConfig::Kolm, vec![110.0, 99.2])];
        pair(&mut rows);
        let u = rows[1].against.unit_vs_plain.as_ref().unwrap();
        assert!(u.lo > 1.0 && (u.mean - 1.1).abs() < 0.01, "{u:?}");
        let md = markdown(&rows, &[], &opts());
        assert!(md.contains("its units × plain's 1.10"), "{md}");
        assert!(md.contains("above plain's beyond the pairings' spread: if that is a cost of its own"), "{md}");
    }

    #[test]
    fn step_logs_give_each_round_a_row_in_the_rounds_own_units() {
        let reqs = plan(&workloads(&[("structured", &["s"])]), &opts());
        let p = InPlace { steps: 500, begun: 64, prompt_s: 100.0, gen_s: 50.0, unit_ms: 125.0, wall_over_price: Some(0.98) };
        let r = LoadRow { in_place: vec![None, Some(p)], ..row(&[], &reqs, &HashMap::new(), 8, LoadConfig::Kolm, 10.0) };
        let md = markdown(&[r], &[], &opts());
        assert!(md.contains("| 8 | kolm | 2 | 100.0 | 50.0 | 125.0 | 400 | 12.5 | 0.98 |"), "{md}");
        assert!(!md.contains("| 8 | kolm | 1 |"), "a round without a log has no row");
    }

    #[test]
    fn plain_comes_first_and_names_are_checked() {
        assert_eq!(LoadConfig::parse_list("kolm,kolm-idle").unwrap(), [LoadConfig::Plain, LoadConfig::Kolm, LoadConfig::KolmIdle]);
        assert!(LoadConfig::parse_list("kolm,fast").unwrap_err().contains("`fast`"));
    }

    #[test]
    fn each_configuration_gets_its_flags() {
        let o = opts();
        let http = |slots: u32| vec!["--threads-http".to_string(), (16 + slots).to_string()];
        assert!(server_options(&o, LoadConfig::Plain, 4, 0).plugin.is_none());
        assert_eq!(server_options(&o, LoadConfig::Plain, 4, 0).extra, http(4), "a thread for every client, in every configuration");
        assert_eq!(server_options(&o, LoadConfig::PlainStrict, 4, 0).extra[2..], ["--strict-batching"]);
        let idle = server_options(&o, LoadConfig::KolmIdle, 4, 0);
        assert_eq!(idle.plugin_arg.as_deref(), Some("pack=off,context=0,live=off,misslog=off"));
        assert_eq!(idle.n_parallel, 4);
        let kolm = server_options(&o, LoadConfig::Kolm, 8, 0).plugin_arg.unwrap();
        assert!(kolm.starts_with("pack=m.recipes.json,live=mem,misslog="));
        let packless = LoadOptions { pack: None, ..o.clone() };
        assert!(server_options(&packless, LoadConfig::Kolm, 8, 0).plugin_arg.unwrap().starts_with("pack=off,live=mem,misslog="), "--pack off");
        let b = server_options(&o, LoadConfig::KolmB, 8, 0);
        assert_eq!((b.plugin_arg.unwrap(), &b.extra[2..]), (format!("{kolm},shared_gain=0.05"), &["-kvu".to_string()][..]));
        assert_eq!(server_options(&o, LoadConfig::Kolm, 8, 0).extra, http(8));
        let ngram = server_options(&o, LoadConfig::NgramSimple, 4, 0);
        assert_eq!((&ngram.extra[2..], ngram.plugin.is_none()), (&["--spec-type".to_string(), "ngram-simple".to_string()][..], true));
        assert!(LoadConfig::ALL.iter().all(|c| c.exact() == !matches!(c, LoadConfig::Plain | LoadConfig::NgramSimple)));
        // with cached prompts only a server that reuses them exactly promises the prompt alone's answer
        let promises = |o: &LoadOptions| LoadConfig::ALL.map(|c| promised(o, c));
        assert_eq!(promises(&o), LoadConfig::ALL.map(LoadConfig::exact));
        let cached = LoadOptions { cache_prompt: true, ab_server_args: vec!["--cache-exact".into()], ..o.clone() };
        assert_eq!(promises(&cached), LoadConfig::ALL.map(|c| c == LoadConfig::KolmB));
        // With --step-log, each plugin server logs its steps to a file of its own slot count, name and round.
        let logged = LoadOptions { step_log: true, ..o.clone() };
        assert!(server_options(&logged, LoadConfig::KolmIdle, 8, 2).plugin_arg.unwrap().ends_with(",steplog=out/steps-np8-kolm-idle-r3.tsv"));
        assert!(server_options(&logged, LoadConfig::Plain, 8, 2).plugin_arg.is_none());
        assert!(LoadConfig::ALL.iter().all(|c| LoadConfig::parse_list(c.name()).unwrap().contains(c)), "every name parses");
        // --server-args: every server, the one answering alone (-np 1, plain) included, before kolm-b's own.
        let shared = LoadOptions { server_args: vec!["-fa".into(), "off".into()], ..o.clone() };
        for c in LoadConfig::ALL {
            assert_eq!(server_options(&shared, c, 4, 0).extra[2..4], ["-fa", "off"], "{}", c.name());
        }
        assert_eq!(server_options(&shared, LoadConfig::KolmB, 4, 0).extra[2..], ["-fa", "off", "-kvu"]);
        assert!(markdown(&[], &[], &shared).contains("every server with `-fa off`"));
        assert!(!markdown(&[], &[], &o).contains("every server with"));
    }
}
