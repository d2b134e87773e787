//! `kolm-rsd replay`: the drafter on recorded greedy continuations of held-out prompts, with this CPU's
//! verify cost, vLLM's on this CPU and free verification as the clock (src/replay.rs says why).

use super::CliResult;
use kolm_rsd::draft::beta::{BetaModel, DEFAULT_BETA_PRIOR};
use kolm_rsd::draft::step::INVARIANT_DRAFT;
use kolm_rsd::draft::syntax::TokenTexts;
use kolm_rsd::draft::step::Layout;
use kolm_rsd::draft::{Context, Drafter, DrafterConfig};
use kolm_rsd::llama::{Model, ModelOptions};
use kolm_rsd::quantile::quantile;
use kolm_rsd::replay::{model_key, oracle, replay, replay_batched, replay_batched_traced, replay_traced, right_proposals, right_run, NgramSimple, Oracle, Recorded, Recordings, Replayed, Served, Serving, Step};
use kolm_rsd::live::{Live, LiveConfig};
use kolm_rsd::pack::MAX_N;
use kolm_rsd::shape::ShapeTable;
use kolm_rsd::teacher::Teacher;
use kolm_rsd::bench::{calls, load_ceiling};
use kolm_rsd::{compile, engine, vocab, workload};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Target model (GGUF): its greedy continuations are recorded.
    #[arg(long)]
    model: PathBuf,
    /// Recipe pack (default: the one beside the model, if any); `off` for none.
    #[arg(long)]
    pack: Option<String>,
    /// Workload whose held-out prompts are replayed: json-extraction, humaneval, mt-bench[:CATEGORY], or a .jsonl file;
    /// several, comma-separated, for mixed traffic: their prompts in turn (each until it runs out), as `bench --load
    /// --workloads` sends them.
    #[arg(long, default_value = "json-extraction")]
    workload: String,
    /// Held-out prompts replayed; past the workload's last one the first ones come again.
    #[arg(long, default_value_t = 6)]
    prompts: usize,
    /// Tokens generated per prompt (greedy).
    #[arg(long, default_value_t = 96)]
    tokens: usize,
    /// Draft from the request's own text (`on`), not at all (`off`), or only from what the answer wrote
    /// (`answer`), as the plugin's `context=` key.
    #[arg(long, default_value = "on", value_parser = ["on", "off", "answer"])]
    context: String,
    /// Send each prompt's code block as the request's predicted output (OpenAI's `prediction`), as the served
    /// bench's `kolm-predict` does (with `--context answer`). The oracle rows, which read the request's own text
    /// only, are left out.
    #[arg(long)]
    prediction: bool,
    /// Attach a live index that first learns the recorded answers of this many of the workload's training
    /// prompts (unmeasured), as a server that had answered them would have it.
    #[arg(long)]
    live: Option<usize>,
    /// Longest literal and shape contexts the live index counts; repeat the flag to replay each (one row each,
    /// the same recordings).
    #[arg(long, value_name = "LITERAL,SHAPE", default_value = "8,6", value_parser = context_lengths)]
    live_n: Vec<(usize, usize)>,
    /// Write the first row's steps to this file (with `--clients`, the first row of clients': each request's part of
    /// each step, where the drafter decides beside others; tab-separated: recording, position, drafted, accepted, how
    /// many of the chain's first tokens the recording has next, how long a run the oracle drafts there, the chain:
    /// each token's evidence and the acceptance expected of it, `|` where the draft ended; then the text the
    /// recording has next and the chain's text, quoted), and sum up where the drafter and its chain part.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Keep the greedy continuations in this file, and take from it those it has (the same model file, prompt
    /// and --tokens): recording is what takes a replay minutes, so a drafter change can then be replayed in seconds.
    #[arg(long, value_name = "FILE")]
    recordings: Option<PathBuf>,
    /// Also serve the prompts this many at a time, each step one forward pass of every request's tokens as
    /// vLLM runs it (β = 1 + 0.04 per request beyond the first + 0.07 per drafted token, fitted on vLLM's step
    /// logs at eight clients, Qwen2.5-Coder-0.5B on this CPU); repeat the flag for one row each.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..=256))]
    clients: Vec<u16>,
    /// Also serve the prompts as llama-server does with this many slots (`-np N`) to `--load-clients` clients: a
    /// step is the calls strict batching makes of every slot's tokens, each priced by the time of one slot verifying
    /// as many, plus the prompts begun in it, all measured for the model on this CPU before the rows; the drafter
    /// set up as the plugin sets it up; repeat the flag for one row each.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..=64))]
    slots: Vec<u16>,
    /// Clients of the `--slots` rows, each sending its next request when its last one ends (`bench --load`'s
    /// default).
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    load_clients: u16,
    /// The plugin's `--spec-plugin-arg` for the `--slots` rows (its drafter's keys: shared_gain, shared_sure,
    /// shared_fair, shared_lag, gate, gate_steps, kv, adaptive, nmax; the pack and the request's own text are this command's),
    /// e.g. `shared_sure=0.8`; repeat the flag for one row each (without it: one row as the plugin's defaults).
    #[arg(long, value_name = "ARG", requires = "slots")]
    plugin_arg: Vec<String>,
    /// A plain llama-server's call log from `bench --load` (e.g. `calls-np4-plain-r1.tsv`), the machine the `--slots`
    /// rows run on: each step at the speed the log's calls of one token a slot ran at, in turn, with their drift and
    /// scatter; repeat the flag for one set of rows each, after the steady machine's (the same call costs).
    #[arg(long, value_name = "FILE", requires = "slots")]
    machine: Vec<PathBuf>,
}

/// The greedy continuations of `prompts` and `warm`: from `--recordings` where it has them, recorded otherwise (and
/// then kept there).
fn record(model: &Model, a: &ReplayArgs, longest: usize, prompts: Vec<Vec<i32>>, warm: Vec<Vec<i32>>) -> Result<(Vec<Recorded>, Vec<Recorded>), String> {
    let key = model_key(&a.model)?;
    let mut kept = a.recordings.as_deref().map(Recordings::load).transpose()?.unwrap_or_default();
    let missing: Vec<&Vec<i32>> = prompts.iter().chain(&warm).filter(|p| kept.get(&key, a.tokens, p).is_none()).collect();
    if !missing.is_empty() {
        eprintln!("recording {} greedy continuations of {} tokens …", missing.len(), a.tokens);
        let mut teacher = Teacher::new(model, 1, longest + a.tokens + 8, 0).map_err(|e| e.to_string())?;
        for p in missing {
            let output = teacher.greedy(p, a.tokens).map_err(|e| e.to_string())?;
            kept.put(&key, a.tokens, p, &output);
        }
        if let Some(path) = &a.recordings {
            kept.save(path)?;
        }
    }
    let runs = |ps: Vec<Vec<i32>>| -> Vec<Recorded> {
        ps.into_iter().map(|prompt| Recorded { output: kept.get(&key, a.tokens, &prompt).unwrap_or_default().to_vec(), prompt, ..Recorded::default() }).collect()
    };
    Ok((runs(prompts), runs(warm)))
}

/// The speeds of a `--machine` call log at `n` slots ([`calls::speeds`]), refused when it has none.
fn machine(path: &Path, n: usize) -> Result<Vec<f64>, String> {
    let speeds = calls::speeds(path, n)?;
    if speeds.is_empty() {
        return Err(format!("{}: --machine: no call of one token from each of {n} slots", path.display()));
    }
    Ok(speeds)
}

fn context_lengths(v: &str) -> Result<(usize, usize), String> {
    let bad = || format!("`{v}`: two context lengths in 2..={MAX_N}, as LITERAL,SHAPE");
    let (l, s) = v.split_once(',').ok_or_else(bad)?;
    let n = |x: &str| x.trim().parse::<usize>().ok().filter(|n| (2..=MAX_N).contains(n)).ok_or_else(bad);
    Ok((n(l)?, n(s)?))
}

pub fn run(a: &ReplayArgs) -> CliResult {
    // Before the recording, which takes minutes: a trace that cannot be written fails at once.
    let mut trace = a.trace.as_deref().map(Trace::create).transpose()?;
    // So does a `--machine` log that cannot be read or has no step of one token from each slot: per `--slots`, the
    // speeds of each log.
    let machines = a.slots.iter().map(|&n| a.machine.iter().map(|p| machine(p, usize::from(n))).collect::<Result<Vec<_>, _>>()).collect::<Result<Vec<_>, _>>()?;
    let plugin_args: Vec<&str> = if a.plugin_arg.is_empty() { vec![""] } else { a.plugin_arg.iter().map(String::as_str).collect() };
    let plugin = plugin_args.iter().map(|&arg| Ok((arg, engine::EngineConfig::from_plugin_arg(arg, "")?))).collect::<Result<Vec<_>, engine::EngineError>>()?;
    let model = Model::load(&a.model, &ModelOptions::default())?;
    let pack = match a.pack.as_deref() {
        Some("off") => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(engine::pack_beside(&a.model)).filter(|p| p.exists()),
    };
    let splits = a.workload.split(',').map(|w| workload::load(w.trim()).map(|all| workload::split(&all))).collect::<Result<Vec<_>, _>>()?;
    let (train, held): (Vec<_>, Vec<_>) = splits.into_iter().unzip();
    let (train, held) = (workload::in_turn(&train), workload::in_turn(&held));
    let tokenize = |p: &workload::Prompt| model.tokenize(&compile::templated(&model, &p.text), true, true);
    // Past the last held-out prompt the first ones come again, as in `bench --load`'s stream (whose live index then
    // knows their answers).
    let prompts: Vec<Vec<i32>> = held.iter().cycle().take(a.prompts).map(tokenize).collect::<Result<_, _>>()?;
    let repeats = a.prompts.saturating_sub(held.len()).min(prompts.len());
    let n_warm = a.live.unwrap_or(0);
    let warm: Vec<Vec<i32>> = train.iter().take(n_warm).map(tokenize).collect::<Result<_, _>>()?;
    if warm.len() < n_warm {
        return Err(format!("{}: --live {n_warm} asks for more training prompts than its {}", a.workload, warm.len()).into());
    }
    let longest = prompts.iter().chain(&warm).map(Vec::len).max().ok_or_else(|| format!("{}: no held-out prompts", a.workload))?;
    let (mut runs, warm) = record(&model, a, longest, prompts, warm)?;
    if a.prediction {
        // Tokenized as the server's patch does: the content alone, no special tokens.
        for (r, p) in runs.iter_mut().zip(&held) {
            let code = workload::code_edit::code_block(&p.text).ok_or_else(|| format!("{}: prompt {} has no code block to predict", a.workload, p.id))?;
            r.prediction = model.tokenize(code, false, false)?;
        }
    }

    let cpu = BetaModel::new(DEFAULT_BETA_PRIOR);
    let clocks: [(&str, &dyn Fn(usize) -> f64); 3] = [
        ("this CPU (β prior: Qwen2.5-Coder-1.5B, 2 cores)", &|m| cpu.beta(m)),
        ("vLLM on this CPU (β(m) = 1 + 0.016 (m − 1), measured for Qwen2.5-Coder-0.5B)", &|m| 1.0 + 0.016 * (m as f64 - 1.0)),
        ("free verification (β = 1, a GPU's limit)", &|_| 1.0),
    ];
    println!(
        "replay: {} on {} ({} held-out prompts × {} tokens{}), pack {}, request's own text {}, prediction {}, live index {}",
        a.model.display(),
        a.workload,
        runs.len(),
        a.tokens,
        if repeats > 0 { format!("; the last {repeats} repeat the first ones") } else { String::new() },
        pack.as_ref().map_or("none".into(), |p| p.display().to_string()),
        match a.context.as_str() { "answer" => "(the answer's only)", c => c },
        if a.prediction { "the prompt's code block" } else { "none" },
        a.live.map_or("off".into(), |n| format!("learned from {n} training prompts' answers"))
    );
    println!("\n| clock | speedup | tokens per pass | drafted | accepted | α | per prompt |\n|---|---:|---:|---:|---:|---:|---|");
    let vocab = vocab::token_texts(&model);
    let index = pack.as_deref().map(|p| engine::load_index(p, &vocab)).transpose()?;
    let context = match a.context.as_str() {
        "off" => Context::Off,
        "answer" => Context::Answer,
        _ => Context::All,
    };
    let cfg = DrafterConfig { context, ..DrafterConfig::default() };
    let texts = vocab::drafter_texts(&model, &vocab);
    let row = |name: &str, (each, t): (Vec<Replayed>, Replayed)| {
        let per: Vec<String> = each.iter().map(|r| format!("{:.2}", r.speedup())).collect();
        println!(
            "| {name} | {:.3} | {:.2} | {} | {} | {:.2} | {} |",
            t.speedup(),
            t.tokens_per_pass(),
            t.drafted,
            t.accepted,
            t.acceptance(),
            per.join(" ")
        );
    };
    // Rows per clock: the drafter without a live index, or with one per --live-n.
    let shapes = a.live.map(|_| ShapeTable::from_token_texts(&vocab));
    let lives: Vec<Option<(usize, usize)>> = if a.live.is_some() { a.live_n.iter().copied().map(Some).collect() } else { vec![None] };
    let mut traced = None;
    for (name, beta) in clocks {
        for lengths in &lives {
            let mut d = Drafter::new(index.clone(), cfg.clone()).with_texts(texts.clone());
            let mut label = name.to_string();
            if let Some((literal, shape)) = *lengths {
                let lc = LiveConfig { max_n_literal: literal, max_n_shape: shape, ..LiveConfig::default() };
                d = d.with_live(Live::new(lc, shapes.clone()));
                replay(&mut d, &warm, INVARIANT_DRAFT, beta, 1e6);
                label += &format!(", live contexts up to {literal} literal / {shape} shape");
            }
            // The trace follows the batched rows' first when there are any: that is where their decisions differ.
            match if a.clients.is_empty() && a.slots.is_empty() { trace.take() } else { None } {
                Some(mut t) => {
                    let right = right_proposals(index.as_ref(), Some(&texts), &cfg, &runs);
                    let r = replay_traced(&mut d, &runs, INVARIANT_DRAFT, beta, 1e6, |s| t.step(s, &runs, &right, &texts, beta));
                    traced = Some(t.finish("first", r.1.cost)?);
                    row(&label, r);
                }
                None => row(&label, replay(&mut d, &runs, INVARIANT_DRAFT, beta, 1e6)),
            }
        }
        // Upstream verifies its whole m-gram, split into calls as patch 0004 does; the clock prices that.
        let mut baseline = NgramSimple::DEFAULT;
        let n_max = baseline.m;
        row("… llama.cpp's ngram-simple (its long verifies priced as strict calls of 16; served, 48 tokens cost β ≈ 21 on the fast kernels)", replay(&mut baseline, &runs, n_max, beta, 1e6));
        if a.prediction {
            continue;
        }
        let o = oracle(index.as_ref(), Some(&texts), &cfg, &runs, INVARIANT_DRAFT, beta);
        println!(
            "| … oracle: every run of right proposals drafted, nothing else | {:.3} | {:.2} | {} | {} | 1.00 | |",
            o.speedup(),
            o.tokens_per_pass(),
            o.drafted,
            o.accepted
        );
    }
    let mut rows = Rows { runs: &runs, warm: &warm, index: index.as_ref(), texts: &texts, cfg: &cfg, lives: &lives, shapes: &shapes, trace, traced };
    if !a.clients.is_empty() {
        println!("\n| vLLM, one pass per step | speedup | steps | drafted | accepted | α |\n|---|---:|---:|---:|---:|---:|");
    }
    for &n in &a.clients {
        let n = usize::from(n);
        // As the vLLM proposer drafts: its one pass per step and its shared-step rule.
        let shared = DrafterConfig { n_seq: n, layout: Some(Layout::OnePass), ..cfg.clone() }.one_pass_shared();
        rows.serve(&format!("{n} clients"), &[(String::new(), shared)], &Serving::steps(n, &one_pass, 1e6).marked(), !a.prediction)?;
    }
    if !a.slots.is_empty() {
        println!(
            "\n| llama-server, strict calls, {} clients | speedup | generation | p50 × plain | p99 × plain | steps | drafted | accepted | α |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            a.load_clients
        );
        // Calls priced at a slot's mean depth, the recordings' halfway point, and a prompt of the mean length.
        let mean = |f: &dyn Fn(&Recorded) -> usize| runs.iter().map(f).sum::<usize>() / runs.len().max(1);
        let (n_past, prompt) = (mean(&|r| r.prompt.len() + r.output.len() / 2), mean(&|r| r.prompt.len()));
        for (&n, machines) in a.slots.iter().zip(&machines) {
            let n = usize::from(n);
            let costs = load_ceiling::call_costs(&model, n, 0, n_past, prompt.max(1), 9)?;
            let single = &costs.single_ms;
            let step = |shape: &[usize]| load_ceiling::priced(single, shape, Layout::Unified) / single[0];
            let prompt_cost = |len: usize| costs.prompt_ms(len) / single[0];
            let serving = Serving { slots: n, clients: usize::from(a.load_clients), step: &step, prompt: &prompt_cost, unit_ns: single[0] * 1e6, machine: &[], marked: false };
            let setups: Vec<(String, DrafterConfig)> = plugin
                .iter()
                .map(|(arg, e)| {
                    let label = if arg.is_empty() { String::new() } else { format!(", `{arg}`") };
                    (label, engine::EngineConfig { n_seq: n, context, ..e.clone() }.drafter_config())
                })
                .collect();
            let label = format!(
                "-np {n} (one slot verifying 1, 2, 8, 16 tokens: {:.1}, {:.1}, {:.1}, {:.1} ms; a prompt of {} tokens {:.0} ms)",
                single[0], single[1], single[7], single[15], costs.prompt.0, costs.prompt.1
            );
            rows.serve(&label, &setups, &serving, !a.prediction)?;
            for (path, speeds) in a.machine.iter().zip(machines) {
                rows.serve(&format!("{label}, on the machine of {}", path.display()), &setups, &Serving { machine: speeds, ..serving }, !a.prediction)?;
            }
        }
    }
    let traced = rows.traced;
    if let Some(summary) = traced {
        println!("\n{summary}");
    }
    Ok(())
}

/// β of one of vLLM's steps on this CPU: `shape[j]` the tokens request j verifies (0: none), in steps of one
/// request with none. Fitted on the proposer's step logs at eight clients (docs/bench/2026-11-28-s33, -s35 and
/// -s36, Qwen2.5-Coder-0.5B): 67–89 ms a step, 1.4–4.6 ms per request beyond the first, 4.1–6.1 ms a drafted token.
fn one_pass(shape: &[usize]) -> f64 {
    let rows = shape.iter().filter(|&&t| t > 0).count();
    let drafted: usize = shape.iter().map(|t| t.saturating_sub(1)).sum();
    1.0 + 0.04 * rows.saturating_sub(1) as f64 + 0.07 * drafted as f64
}

/// What every row of concurrent requests replays: the recordings, the drafter's evidence, and the trace, which the
/// first such row takes.
struct Rows<'a, 'p> {
    runs: &'a [Recorded],
    warm: &'a [Recorded],
    index: Option<&'a kolm_rsd::index::Index>,
    texts: &'a TokenTexts,
    cfg: &'a DrafterConfig,
    lives: &'a [Option<(usize, usize)>],
    shapes: &'a Option<ShapeTable>,
    trace: Option<Trace<'p>>,
    traced: Option<String>,
}

impl Rows<'_, '_> {
    /// The recordings served as `serving` says: plain decoding, then a row per drafter setup (`(label, config)`) and
    /// live index, then the oracle when `oracle`. Rows of llama-server's (clients of their own) also show the
    /// generation steps' speed and the requests' times against plain's.
    fn serve(&mut self, name: &str, setups: &[(String, DrafterConfig)], serving: &Serving, oracle: bool) -> Result<(), String> {
        let plain = replay_batched(None, self.runs, INVARIANT_DRAFT, serving);
        let n = serving.slots;
        // A request alone verifying m tokens: the live index's warm-up and the trace's price of wasted tokens.
        let alone = |m: usize| {
            let mut shape = vec![0; n];
            shape[0] = m;
            (serving.step)(&shape)
        };
        let row = |label: &str, t: &Served, alpha: String| {
            let (p, r) = (&plain.total, &t.total);
            if serving.clients == 0 {
                println!("| {label} | {:.3} | {} | {} | {} | {alpha} |", p.cost / r.cost, r.passes, r.drafted, r.accepted);
            } else {
                let q = |x: &Served, q: f64| quantile(&x.latency, q);
                println!(
                    "| {label} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {alpha} |",
                    p.cost / r.cost,
                    (p.cost - plain.prompt_cost) / (r.cost - t.prompt_cost),
                    q(t, 0.5) / q(&plain, 0.5),
                    q(t, 0.99) / q(&plain, 0.99),
                    r.passes,
                    r.drafted,
                    r.accepted
                );
            }
        };
        for (setup, dcfg) in setups {
            for lengths in self.lives {
                let mut d = Drafter::new(self.index.cloned(), dcfg.clone()).with_texts(self.texts.clone());
                let mut label = format!("{name}{setup}");
                if let Some((literal, shape)) = *lengths {
                    let lc = LiveConfig { max_n_literal: literal, max_n_shape: shape, ..LiveConfig::default() };
                    d = d.with_live(Live::new(lc, self.shapes.clone()));
                    replay(&mut d, self.warm, INVARIANT_DRAFT, alone, serving.unit_ns);
                    label += &format!(", live contexts up to {literal} literal / {shape} shape");
                }
                let t = match self.trace.take() {
                    Some(mut tr) => {
                        let right = right_proposals(self.index, Some(self.texts), self.cfg, self.runs);
                        let (runs, texts) = (self.runs, self.texts);
                        let t = replay_batched_traced(&mut d, runs, INVARIANT_DRAFT, serving, |s| tr.step(s, runs, &right, texts, &alone));
                        self.traced = Some(tr.finish(&label, t.total.cost)?);
                        t
                    }
                    None => replay_batched(Some(&mut d), self.runs, INVARIANT_DRAFT, serving),
                };
                row(&label, &t, format!("{:.2}", t.total.acceptance()));
            }
        }
        if oracle {
            let mut o = Oracle::new(self.runs, right_proposals(self.index, Some(self.texts), self.cfg, self.runs));
            let t = replay_batched(Some(&mut o), self.runs, INVARIANT_DRAFT, serving);
            row("… oracle: every run of right proposals drafted, nothing else", &t, "1.00".into());
        }
        Ok(())
    }
}

/// Tokens' text (spaces and newlines as themselves, not the tokenizer's markers), quoted and escaped so that a
/// tab, a newline or a `;` cannot break the trace's columns.
fn text(texts: &TokenTexts, tokens: &[i32]) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| texts.get(t)).copied().collect();
    format!("{:?}", String::from_utf8_lossy(&bytes))
}

/// A replay's steps written as they come, and the sums of where the drafter's drafts and its chains part.
struct Trace<'p> {
    path: &'p Path,
    out: std::io::BufWriter<std::fs::File>,
    error: Option<std::io::Error>,
    steps: usize,
    /// Steps that drafted nothing where the chain's first token was right, and the right tokens they held.
    declined: (usize, usize),
    /// Steps that drafted fewer tokens than the chain had right, and how many fewer (the chain may run on).
    short: (usize, usize),
    /// Drafts with a token past the right run, and those tokens.
    wasted: (usize, usize),
    /// Verify cost (plain steps) of the tokens past the right runs.
    wasted_cost: f64,
    /// Right tokens the oracle drafted and the step did not keep: where the chain had them (the control cut it
    /// short or declined it), and beyond the chain (built only a token past where drafting may pay, or as far as
    /// its evidence went).
    missed: (usize, usize),
}

impl<'p> Trace<'p> {
    fn create(path: &'p Path) -> Result<Trace<'p>, String> {
        let file = std::fs::File::create(path).map_err(|e| format!("{}: cannot write the trace: {e}", path.display()))?;
        let mut t = Trace { path, out: std::io::BufWriter::new(file), error: None, steps: 0, declined: (0, 0), short: (0, 0), wasted: (0, 0), wasted_cost: 0.0, missed: (0, 0) };
        t.write(format_args!("recording\tposition\tdrafted\taccepted\tright\toracle\tchain\tnext\tproposed\n"));
        Ok(t)
    }

    fn write(&mut self, line: std::fmt::Arguments) {
        if self.error.is_none() {
            self.error = self.out.write_fmt(line).err();
        }
    }

    /// One step of `runs`, on the clock `beta`; `right`: their [`right_proposals`], which say the run the oracle drafts
    /// where this step's draft starts.
    fn step(&mut self, s: Step, runs: &[Recorded], right: &[Vec<bool>], texts: &TokenTexts, beta: &dyn Fn(usize) -> f64) {
        let r = &runs[s.run];
        let done = s.position - r.prompt.len();
        // The recording's tokens from where the draft starts; right[i] is about output[i + 1].
        let next = r.output.get(done..).unwrap_or_default();
        let oracle = right_run(&right[s.run], done - 1, INVARIANT_DRAFT);
        self.steps += 1;
        let had = oracle.min(s.right).saturating_sub(s.accepted);
        self.missed.0 += had;
        self.missed.1 += oracle.saturating_sub(s.accepted) - had;
        let add = |(n, k): &mut (usize, usize), x: usize| (*n, *k) = (*n + 1, *k + x);
        match (s.drafted, s.right) {
            (0, r) if r > 0 => add(&mut self.declined, r),
            (g, r) if g > 0 && g < r => add(&mut self.short, r - g),
            (g, r) if g > r => {
                add(&mut self.wasted, g - r);
                self.wasted_cost += beta(g + 1) - beta(r + 1);
            }
            _ => {}
        }
        let chain: Vec<String> = s
            .chain
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{}{} {:.2}", if i == s.drafted && i > 0 { "| " } else { "" }, c.class.label(), c.p))
            .collect();
        let proposed: Vec<i32> = s.chain.iter().map(|c| c.token).collect();
        // As far as the chain or the draft reached, and one token past: where they part from the recording.
        let shown = &next[..next.len().min(s.chain.len().max(s.drafted) + 1)];
        self.write(format_args!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            s.run,
            s.position,
            s.drafted,
            s.accepted,
            s.right,
            oracle,
            chain.join("; "),
            text(texts, shown),
            text(texts, &proposed)
        ));
    }

    /// Flushes the file; returns the sums, to print below the table. `row`: which row was traced; `cost`: its
    /// verify cost.
    fn finish(mut self, row: &str, cost: f64) -> Result<String, String> {
        let flushed = self.out.flush();
        if let Some(e) = self.error.take().or(flushed.err()) {
            return Err(format!("{}: cannot write the trace: {e}", self.path.display()));
        }
        Ok(format!(
            "trace of the {row} row: {} ({} steps). Declined where the chain's first token was right: {} steps ({} right tokens); \
             drafted fewer than the chain had right: {} steps ({} tokens); drafted past the right run: {} drafts ({} tokens, {:.1} plain steps of verify cost, {:.1}% of the run's); \
             right tokens the oracle drafted and the step did not keep: {} in the chain, {} beyond it",
            self.path.display(),
            self.steps,
            self.declined.0,
            self.declined.1,
            self.short.0,
            self.short.1,
            self.wasted.0,
            self.wasted.1,
            self.wasted_cost,
            100.0 * self.wasted_cost / cost.max(1e-9),
            self.missed.0,
            self.missed.1
        ))
    }
}
