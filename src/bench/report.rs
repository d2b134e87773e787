//! What a benchmark reports: the summary of each configuration against no speculation (speedups, acceptance,
//! tokens per target pass, the ceiling), the identity check, a markdown table for stdout, JSON with every raw
//! number, and a PNG bar chart of speedup per configuration per workload.

use super::ceiling::{BetaTable, Ceiling};
use super::config::ConfigKind;
use super::run::{ConfigRun, RequestRecord, RoundRecord};
use crate::quantile::median;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One configuration's numbers over a run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub requests: usize,
    /// Σ predicted_n.
    pub tokens: u64,
    /// Σ predicted_ms.
    pub decode_ms: f64,
    /// Decode rate: Σ (predicted_n − 1) / Σ predicted_ms (llama-server's own definition: the first token comes
    /// from the prompt pass), tokens per second.
    pub tok_s: f64,
    /// Median of the per-request `predicted_per_second`.
    pub median_request_tok_s: f64,
    /// tok_s / tok_s of no speculation.
    pub speedup: f64,
    /// Σ predicted_n / Σ wall per request (prompt processing and HTTP included), tokens per second.
    pub wall_tok_s: f64,
    pub wall_speedup: f64,
    /// Σ predicted_n / Σ round wall: aggregate throughput of all slots (equals wall_tok_s with one slot).
    pub throughput: f64,
    pub throughput_ratio: f64,
    pub drafted: u64,
    pub accepted: u64,
    /// Verify steps that carried a draft (None when /metrics could not be read).
    pub drafts: Option<u64>,
    /// accepted / drafted.
    pub alpha: Option<f64>,
    /// drafted / drafts: mean draft length.
    pub gamma: Option<f64>,
    /// 1 + accepted / drafts: tokens per verify step that carried a draft.
    pub mean_accept_len: Option<f64>,
    /// Σ (predicted_n − 1) / Σ (predicted_n − 1 − accepted): generated tokens per target forward pass,
    /// drafting or not (1.0 without speculation).
    pub tokens_per_pass: f64,
    /// Requests whose output is byte-identical to no speculation, of those compared.
    pub identical: usize,
    pub compared: usize,
    /// The ceiling for this α, γ and the measured β (filled in once β is measured).
    pub ceiling: Option<Ceiling>,
}

/// Speedups of one configuration are against this reference (no speculation, same slots).
#[derive(Clone, Copy, Debug)]
pub struct Reference {
    pub tok_s: f64,
    pub wall_tok_s: f64,
    pub throughput: f64,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The raw rates of a run (used for the reference first, then every configuration against it).
pub fn reference(requests: &[RequestRecord], rounds: &[RoundRecord]) -> Reference {
    let gen: u64 = requests.iter().map(|r| r.predicted_n.saturating_sub(1)).sum();
    let ms: f64 = requests.iter().map(|r| r.predicted_ms).sum();
    let tokens: u64 = requests.iter().map(|r| r.predicted_n).sum();
    let wall: f64 = requests.iter().map(|r| r.wall_ms).sum();
    let round_wall: f64 = rounds.iter().map(|r| r.wall_ms).sum();
    Reference { tok_s: ratio(gen as f64 * 1e3, ms), wall_tok_s: ratio(tokens as f64 * 1e3, wall), throughput: ratio(tokens as f64 * 1e3, round_wall) }
}

/// Summarizes a run against the reference rates and the reference outputs (prompt id → text).
pub fn summarize(requests: &[RequestRecord], rounds: &[RoundRecord], refr: &Reference, expected: &BTreeMap<String, String>) -> Summary {
    let own = reference(requests, rounds);
    let tokens: u64 = requests.iter().map(|r| r.predicted_n).sum();
    let gen: u64 = requests.iter().map(|r| r.predicted_n.saturating_sub(1)).sum();
    let drafted: u64 = requests.iter().map(|r| r.draft_n).sum();
    let accepted: u64 = requests.iter().map(|r| r.draft_n_accepted).sum();
    let drafts: Option<u64> = rounds.iter().map(|r| r.drafts).sum();
    let passes = gen.saturating_sub(accepted);
    let (mut identical, mut compared) = (0, 0);
    for r in requests {
        if let Some(want) = expected.get(&r.prompt_id) {
            compared += 1;
            identical += (*want == r.content) as usize;
        }
    }
    Summary {
        requests: requests.len(),
        tokens,
        decode_ms: requests.iter().map(|r| r.predicted_ms).sum(),
        tok_s: own.tok_s,
        median_request_tok_s: median(&requests.iter().map(|r| r.predicted_per_second).collect::<Vec<_>>()),
        speedup: ratio(own.tok_s, refr.tok_s),
        wall_tok_s: own.wall_tok_s,
        wall_speedup: ratio(own.wall_tok_s, refr.wall_tok_s),
        throughput: own.throughput,
        throughput_ratio: ratio(own.throughput, refr.throughput),
        drafted,
        accepted,
        drafts,
        alpha: (drafted > 0).then(|| accepted as f64 / drafted as f64),
        gamma: drafts.filter(|&d| d > 0).map(|d| drafted as f64 / d as f64),
        mean_accept_len: drafts.filter(|&d| d > 0).map(|d| 1.0 + accepted as f64 / d as f64),
        tokens_per_pass: if passes > 0 { gen as f64 / passes as f64 } else { 1.0 },
        identical,
        compared,
        ceiling: None,
    }
}

/// A configuration in a group: ran (with its raw records and summary), skipped, or failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigResult {
    pub name: String,
    pub kind: ConfigKind,
    /// "ran", "skipped" or "failed".
    pub status: String,
    pub reason: Option<String>,
    pub flags: String,
    pub log: Option<PathBuf>,
    pub summary: Option<Summary>,
    pub requests: Vec<RequestRecord>,
    pub rounds: Vec<RoundRecord>,
}

impl ConfigResult {
    pub fn skipped(kind: ConfigKind, reason: &str) -> Self {
        ConfigResult {
            name: kind.name().into(),
            kind,
            status: "skipped".into(),
            reason: Some(reason.into()),
            flags: String::new(),
            log: None,
            summary: None,
            requests: vec![],
            rounds: vec![],
        }
    }

    pub fn from_run(run: ConfigRun, summary: Option<Summary>) -> Self {
        let status = if run.error.is_some() { "failed" } else { "ran" };
        ConfigResult {
            name: run.config.name.clone(),
            kind: run.config.kind,
            status: status.into(),
            reason: run.error.clone(),
            flags: run.config.flags(),
            log: Some(run.log.clone()),
            summary,
            requests: run.requests,
            rounds: run.rounds,
        }
    }
}

/// One model × workload × slot count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Group {
    pub model: String,
    pub model_path: PathBuf,
    pub workload: String,
    pub slots: u32,
    pub prompts: usize,
    pub n_predict: u32,
    /// Training prompts the pack and lookup caches were made from, and the tokens the teacher generated.
    pub train_prompts: usize,
    pub train_tokens: usize,
    /// What the pack builder said about the pack (entries, size, coverage).
    pub pack: Option<String>,
    /// Prompts on which no speculation at this slot count gave the same output as at the first slot count,
    /// of those compared (None for the first slot count itself).
    pub plain_vs_first: Option<(usize, usize)>,
    pub configs: Vec<ConfigResult>,
}

/// An output that differs from no speculation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Mismatch {
    pub model: String,
    pub workload: String,
    pub slots: u32,
    pub config: String,
    pub prompt_id: String,
    /// First differing byte.
    pub at: usize,
    pub expected: String,
    pub got: String,
    /// Whether it fails the run: false at a slot count where plain decoding itself is not reproducible
    /// across slot counts (then a difference cannot be put on speculation).
    pub counts: bool,
}

impl BenchReport {
    /// Mismatches that fail the run.
    pub fn failures(&self) -> usize {
        self.mismatches.iter().filter(|m| m.counts).count()
    }
}

/// Where the two texts first differ, with a little context of each.
pub fn first_difference(want: &str, got: &str) -> (usize, String, String) {
    let at = want.bytes().zip(got.bytes()).position(|(a, b)| a != b).unwrap_or(want.len().min(got.len()));
    let snip = |s: &str| {
        let mut lo = at.saturating_sub(30);
        while !s.is_char_boundary(lo.min(s.len())) {
            lo -= 1;
        }
        let mut hi = (at + 50).min(s.len());
        while !s.is_char_boundary(hi) {
            hi += 1;
        }
        s[lo.min(s.len())..hi].to_string()
    };
    (at, snip(want), snip(got))
}

/// The machine and versions a report was made on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub threads: Option<u32>,
    pub os: String,
    /// 1-minute load average when the run started (other work on the machine makes numbers noisy).
    pub load_avg: Option<f64>,
}

impl Machine {
    pub fn this(threads: Option<u32>) -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()))
            .unwrap_or_else(|| "unknown".into());
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())))
            .unwrap_or_else(|| std::env::consts::OS.into());
        let load_avg = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        Machine { cpu, cores: std::thread::available_parallelism().map_or(1, |n| n.get()), threads, os, load_avg }
    }
}

/// A draft model's cost relative to its target (d in the ceiling).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DraftCost {
    pub target: String,
    pub draft: String,
    pub t1_draft_ms: f64,
    pub t1_target_ms: f64,
    pub d: f64,
    /// The plugin's draft step (LM head skipped in llama.cpp, then the subset head over `subset_rows`).
    pub subset_rows: Option<usize>,
    pub step_subset_ms: Option<f64>,
    /// The plugin's draft step with the full head scored by the same path.
    pub step_full_ms: Option<f64>,
}

/// Everything one `kolm-rsd bench` run produced.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub tool: String,
    pub version: String,
    /// The pinned llama.cpp (vendor/llama.cpp.lock).
    pub llama_cpp: String,
    pub machine: Machine,
    pub unix_time: u64,
    pub elapsed_s: f64,
    pub command: String,
    pub options: serde_json::Value,
    pub groups: Vec<Group>,
    pub betas: Vec<BetaTable>,
    pub draft_costs: Vec<DraftCost>,
    pub mismatches: Vec<Mismatch>,
    /// Things said during the run that the reader should see (skipped models, missing fonts, ...).
    pub notes: Vec<String>,
}

/// A reason fit for a table cell: one line, no pipes, at most `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "/");
    if flat.chars().count() <= max {
        flat
    } else {
        format!("{}…", flat.chars().take(max).collect::<String>())
    }
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The markdown report: machine, one table per group, the β tables, and the mismatches.
pub fn markdown(r: &BenchReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## kolm-rsd bench\n");
    let _ = writeln!(
        s,
        "{} {}, llama.cpp {}; {} ({} cores, threads: {}), {}; {:.0} s.\n",
        r.tool,
        r.version,
        r.llama_cpp,
        r.machine.cpu,
        r.machine.cores,
        r.machine.threads.map_or("default".into(), |t| t.to_string()),
        r.machine.os,
        r.elapsed_s
    );
    let _ = writeln!(s, "`{}`\n", r.command);
    if let Some(l) = r.machine.load_avg.filter(|&l| l > 0.5 * r.machine.cores as f64) {
        let _ = writeln!(s, "**The machine was busy when the run started (load average {l:.1} on {} cores): the timings are noisy.**\n", r.machine.cores);
    }
    for g in &r.groups {
        let _ = writeln!(s, "### {} · {} · -np {} · {} prompts × {} tokens\n", g.model, g.workload, g.slots, g.prompts, g.n_predict);
        if g.train_prompts > 0 {
            let _ = writeln!(s, "lookup caches (ngram-cache): from {} training prompts, {} teacher tokens\n", g.train_prompts, g.train_tokens);
        }
        if let Some(p) = &g.pack {
            let _ = writeln!(s, "{p}\n");
        }
        let multi = g.slots > 1;
        let _ = writeln!(
            s,
            "| configuration | tok/s | speedup | {}drafted | accepted | α | γ | tok/pass | β(γ+1) | ceiling S | of S | identical |",
            if multi { "aggregate tok/s | aggregate ratio | " } else { "" }
        );
        let _ = writeln!(s, "|---|---:|---:|{}---:|---:|---:|---:|---:|---:|---:|---:|---|", if multi { "---:|---:|" } else { "" });
        for c in &g.configs {
            match (&c.summary, c.status.as_str()) {
                (Some(m), st) => {
                    let ce = m.ceiling.as_ref();
                    let ident = if m.compared == 0 {
                        "–".to_string()
                    } else if m.identical == m.compared {
                        format!("yes ({}/{})", m.identical, m.compared)
                    } else {
                        format!("**NO ({}/{})**", m.identical, m.compared)
                    };
                    let name = if st == "failed" { format!("{} (failed part-way)", c.name) } else { c.name.clone() };
                    let _ = writeln!(
                        s,
                        "| {} | {:.1} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        name,
                        m.tok_s,
                        f2(m.speedup),
                        if multi { format!("{:.1} | {} | ", m.throughput, f2(m.throughput_ratio)) } else { String::new() },
                        m.drafted,
                        m.accepted,
                        opt(m.alpha, 2),
                        opt(m.gamma, 2),
                        f2(m.tokens_per_pass),
                        opt(ce.map(|c| c.beta), 2),
                        opt(ce.map(|c| c.s), 2),
                        ce.map_or("–".into(), |c| format!("{:.0}%", 100.0 * c.share)),
                        ident
                    );
                }
                (None, st) => {
                    let _ = writeln!(s, "| {} | {} {} |", c.name, st, one_line(c.reason.as_deref().unwrap_or(""), 240));
                }
            }
        }
        let _ = writeln!(s);
    }
    if !r.betas.is_empty() {
        let _ = writeln!(s, "### β(n): one forward pass over n tokens (logits at every position) / one token\n");
        let mut ns: Vec<usize> = r.betas.iter().flat_map(|b| b.points.iter().map(|p| p.0)).filter(|&n| n > 1).collect();
        ns.sort_unstable();
        ns.dedup();
        let _ = writeln!(s, "| model | 1 token | {} |", ns.iter().map(|n| format!("n={n}")).collect::<Vec<_>>().join(" | "));
        let _ = writeln!(s, "|---|---:|{}", "---:|".repeat(ns.len()));
        for b in &r.betas {
            let cells: Vec<String> = ns.iter().map(|&n| b.points.iter().find(|p| p.0 == n).map_or("–".into(), |p| f2(p.2))).collect();
            let _ = writeln!(s, "| {} | {:.1} ms | {} |", b.model, b.t1_ms, cells.join(" | "));
        }
        let _ = writeln!(s);
    }
    for d in &r.draft_costs {
        let _ = writeln!(s, "Draft cost d for {} drafting for {}: {:.1} ms / {:.1} ms = {:.2} per drafted token (llama.cpp's one-token pass, full head).\n", d.draft, d.target, d.t1_draft_ms, d.t1_target_ms, d.d);
        if let (Some(rows), Some(sub)) = (d.subset_rows, d.step_subset_ms) {
            let _ = writeln!(
                s,
                "kolm-rsd draft step ({} decoded without its LM head, then the subset head over {rows} rows): {sub:.1} ms = d {:.2}; \
                 {:.2}× faster per drafted token than llama.cpp's full-head step{}.\n",
                d.draft,
                sub / d.t1_target_ms,
                d.t1_draft_ms / sub,
                d.step_full_ms.map_or(String::new(), |f| format!("; the same path with the full head: {f:.1} ms"))
            );
        }
    }
    let _ = writeln!(
        s,
        "tok/s: decode rate Σ(predicted_n − 1)/Σ predicted_ms; speedup against `none` in the same table. α = accepted/drafted, \
         γ = drafted per drafting step, tok/pass = generated tokens per target forward pass, S = E(α,γ)/(β(γ+1) + γ·d) with \
         E = (1−α^(γ+1))/(1−α), the ceiling of drafting γ tokens at every step; \"of S\" = speedup / max(S, 1) (a drafter \
         can always decline to draft).\n"
    );
    let failures = r.failures();
    if r.mismatches.is_empty() {
        let _ = writeln!(s, "Identity: every output of every configuration is byte-identical to no speculation.");
    } else if failures == 0 {
        let _ = writeln!(
            s,
            "Identity: every output is byte-identical to no speculation wherever plain decoding is itself reproducible; {} \
             differences at slot counts where it is not are listed below.\n",
            r.mismatches.len()
        );
    } else {
        let _ = writeln!(s, "### ⚠ OUTPUT MISMATCHES: {failures} outputs differ from no speculation\n");
    }
    for (title, counted) in [("Counted", true), ("Not counted (plain decoding differs across slot counts there)", false)] {
        let list: Vec<&Mismatch> = r.mismatches.iter().filter(|m| m.counts == counted).collect();
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{title}:\n");
        for m in list {
            let _ = writeln!(
                s,
                "- {} · {} · -np {} · **{}** · prompt {}: first difference at byte {}: expected `{}`, got `{}`",
                m.model,
                m.workload,
                m.slots,
                m.config,
                m.prompt_id,
                m.at,
                m.expected.escape_debug(),
                m.got.escape_debug()
            );
        }
        let _ = writeln!(s);
    }
    for n in &r.notes {
        let _ = writeln!(s, "\nNote: {n}");
    }
    s
}

/// Writes `bench.json` and `bench.md` into `dir`.
pub fn write_files(r: &BenchReport, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let json = dir.join("bench.json");
    let md = dir.join("bench.md");
    std::fs::write(&json, serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
    std::fs::write(&md, markdown(r))?;
    Ok((json, md))
}

/// Bars of one chart: groups (workloads) of (configuration, speedup).
pub type ChartData = Vec<(String, Vec<(String, f64)>)>;

/// The chart data of one model and slot count: speedup (aggregate throughput ratio with several slots) per
/// configuration that ran, per workload. The reference (`none`, 1.0) is left out.
pub fn chart_data(r: &BenchReport, model: &str, slots: u32) -> ChartData {
    r.groups
        .iter()
        .filter(|g| g.model == model && g.slots == slots)
        .map(|g| {
            let bars = g
                .configs
                .iter()
                .filter(|c| c.kind != ConfigKind::None)
                .filter_map(|c| c.summary.as_ref().map(|m| (c.name.clone(), if slots > 1 { m.throughput_ratio } else { m.speedup })))
                .collect();
            (g.workload.clone(), bars)
        })
        .collect()
}

const PALETTE: [(u8, u8, u8); 12] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (0, 0, 128),
    (128, 128, 0),
];

/// A configuration's colour: the same in every chart (by its place in [`ConfigKind::ALL`]).
fn colour(name: &str, fallback: usize) -> (u8, u8, u8) {
    let i = ConfigKind::ALL.iter().position(|k| k.name() == name).unwrap_or(fallback);
    PALETTE[i % PALETTE.len()]
}

/// Draws a grouped bar chart (one group per workload, one bar per configuration, a line at 1.0) to a PNG.
pub fn draw_chart(path: &Path, title: &str, data: &ChartData) -> Result<(), String> {
    use plotters::prelude::*;
    crate::chart::register_font()?;
    let configs: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for (_, bars) in data {
            for (c, _) in bars {
                if !v.contains(c) {
                    v.push(c.clone());
                }
            }
        }
        v
    };
    if configs.is_empty() {
        return Err("nothing to draw".into());
    }
    let ymax = data.iter().flat_map(|(_, b)| b.iter().map(|x| x.1)).fold(1.2f64, f64::max) * 1.12;
    let ng = data.len();
    let nb = configs.len();
    let width = (220 + ng * (nb * 34 + 40)).clamp(720, 2400) as u32;
    let root = BitMapBackend::new(path, (width, 520)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (plot, legend) = root.split_horizontally(width - 200);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..ng as f64, 0f64..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|_| String::new())
        .y_desc("speedup over no speculation")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    let slot = 0.8 / nb as f64;
    for (gi, (_, bars)) in data.iter().enumerate() {
        for (name, v) in bars {
            let ci = configs.iter().position(|c| c == name).unwrap_or(0);
            let (r, g, b) = colour(name, ci);
            let x0 = gi as f64 + 0.1 + ci as f64 * slot;
            chart.draw_series(std::iter::once(Rectangle::new([(x0, 0.0), (x0 + slot * 0.9, *v)], RGBColor(r, g, b).filled()))).map_err(e)?;
            chart
                .draw_series(std::iter::once(Text::new(format!("{v:.2}"), (x0, *v + ymax * 0.01), ("sans-serif", 11).into_font().color(&BLACK))))
                .map_err(e)?;
        }
    }
    chart.draw_series(std::iter::once(PathElement::new(vec![(0.0, 1.0), (ng as f64, 1.0)], BLACK.stroke_width(1)))).map_err(e)?;
    // workload names under their groups (the mesh's own labels would sit at round numbers, not at groups)
    let label = ("sans-serif", 15).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    ));
    for (gi, (w, _)) in data.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(gi as f64 + 0.5, 0.0));
        root.draw(&Text::new(w.clone(), (px, py + 10), label.clone())).map_err(e)?;
    }
    for (ci, c) in configs.iter().enumerate() {
        let (r, g, b) = colour(c, ci);
        let y = 60 + ci as i32 * 24;
        legend.draw(&Rectangle::new([(10, y), (26, y + 14)], RGBColor(r, g, b).filled())).map_err(e)?;
        legend.draw(&Text::new(c.clone(), (32, y), ("sans-serif", 14).into_font())).map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

/// One PNG per model and slot count (`speedup-MODEL-npN.png`); returns the files written, or why none.
pub fn write_charts(r: &BenchReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut keys: Vec<(String, u32)> = Vec::new();
    for g in &r.groups {
        if !keys.contains(&(g.model.clone(), g.slots)) {
            keys.push((g.model.clone(), g.slots));
        }
    }
    let mut out = Vec::new();
    for (model, slots) in keys {
        let data = chart_data(r, &model, slots);
        if data.iter().all(|(_, b)| b.is_empty()) {
            continue;
        }
        let safe: String = model.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
        let path = dir.join(format!("speedup-{safe}-np{slots}.png"));
        let what = if slots > 1 { "aggregate throughput" } else { "decode tok/s" };
        draw_chart(&path, &format!("{model}, -np {slots}: {what} over no speculation"), &data)?;
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, n: u64, ms: f64, drafted: u64, acc: u64, content: &str) -> RequestRecord {
        RequestRecord {
            prompt_id: id.into(),
            round: 0,
            predicted_n: n,
            predicted_per_second: (n - 1) as f64 * 1e3 / ms,
            predicted_ms: ms,
            draft_n: drafted,
            draft_n_accepted: acc,
            drafts: None,
            wall_ms: ms + 10.0,
            content_sha256: String::new(),
            content_len: content.len(),
            content: content.into(),
        }
    }

    fn round(wall: f64, drafts: Option<u64>) -> RoundRecord {
        RoundRecord { round: 0, requests: 1, wall_ms: wall, predicted_n: 0, drafts }
    }

    #[test]
    fn summary_numbers() {
        let base = vec![req("a", 101, 1000.0, 0, 0, "x"), req("b", 51, 500.0, 0, 0, "y")];
        let rb = vec![round(1010.0, Some(0)), round(510.0, Some(0))];
        let refr = reference(&base, &rb);
        assert!((refr.tok_s - 100.0).abs() < 1e-9);
        let expected: BTreeMap<String, String> = [("a".to_string(), "x".to_string()), ("b".to_string(), "y".to_string())].into();
        let none = summarize(&base, &rb, &refr, &expected);
        assert!((none.speedup - 1.0).abs() < 1e-12 && none.tokens_per_pass == 1.0 && none.identical == 2);
        assert_eq!(none.alpha, None);

        // 150 generated tokens in 1200 ms with 60 of 90 drafted accepted over 30 drafting steps
        let spec = vec![req("a", 101, 800.0, 60, 40, "x"), req("b", 51, 400.0, 30, 20, "z")];
        let rs = vec![round(810.0, Some(20)), round(410.0, Some(10))];
        let m = summarize(&spec, &rs, &refr, &expected);
        assert!((m.speedup - 1.25).abs() < 1e-9, "{}", m.speedup);
        assert_eq!((m.drafted, m.accepted, m.drafts), (90, 60, Some(30)));
        assert!((m.alpha.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert!((m.gamma.unwrap() - 3.0).abs() < 1e-12);
        assert!((m.mean_accept_len.unwrap() - 3.0).abs() < 1e-12);
        assert!((m.tokens_per_pass - 150.0 / 90.0).abs() < 1e-12);
        assert_eq!((m.identical, m.compared), (1, 2));
        // a round without /metrics makes drafts unknown
        let m = summarize(&spec, &[round(810.0, Some(20)), round(410.0, None)], &refr, &expected);
        assert_eq!((m.drafts, m.gamma), (None, None));
    }

    #[test]
    fn first_difference_points_at_the_byte() {
        let (at, w, g) = first_difference("{\"a\": 1, \"b\": 2}", "{\"a\": 1, \"b\": 3}");
        assert_eq!(at, 14);
        assert!(w.ends_with("2}") && g.ends_with("3}"));
        let (at, _, _) = first_difference("abc", "abcdef");
        assert_eq!(at, 3);
        let (at, w, _) = first_difference("ééé", "éé");
        assert_eq!(at, 4);
        assert_eq!(w, "ééé");
    }

    fn report() -> BenchReport {
        let base = vec![req("a", 101, 1000.0, 0, 0, "x")];
        let spec = vec![req("a", 101, 800.0, 60, 40, "x!")];
        let rr = vec![round(1000.0, Some(0))];
        let refr = reference(&base, &rr);
        let expected: BTreeMap<String, String> = [("a".to_string(), "x".to_string())].into();
        let run = |name: &str, kind, reqs: &Vec<RequestRecord>| ConfigResult {
            name: name.into(),
            kind,
            status: "ran".into(),
            reason: None,
            flags: String::new(),
            log: None,
            summary: Some(summarize(reqs, &rr, &refr, &expected)),
            requests: reqs.clone(),
            rounds: rr.clone(),
        };
        let configs = vec![
            run("none", ConfigKind::None, &base),
            run("ngram-mod", ConfigKind::NgramMod, &spec),
            ConfigResult::skipped(ConfigKind::DraftSimple, "no draft model with the same tokenizer for smollm2-135m"),
        ];
        let group = |w: &str| Group {
            model: "smollm2-135m".into(),
            model_path: "/m.gguf".into(),
            workload: w.into(),
            slots: 1,
            prompts: 1,
            n_predict: 100,
            train_prompts: 3,
            train_tokens: 300,
            pack: None,
            plain_vs_first: None,
            configs: configs.clone(),
        };
        BenchReport {
            tool: "kolm-rsd bench".into(),
            version: "0.1.0".into(),
            llama_cpp: "0.3.36".into(),
            machine: Machine::this(Some(2)),
            unix_time: 0,
            elapsed_s: 1.0,
            command: "kolm-rsd bench --quick".into(),
            options: serde_json::json!({}),
            groups: vec![group("json-extraction"), group("humaneval")],
            betas: vec![BetaTable { model: "smollm2-135m".into(), threads: 2, n_past: 128, reps: 5, t1_ms: 9.0, points: vec![(1, 9.0, 1.0), (2, 13.5, 1.5)] }],
            draft_costs: vec![],
            mismatches: vec![Mismatch {
                model: "smollm2-135m".into(),
                workload: "json-extraction".into(),
                slots: 1,
                config: "ngram-mod".into(),
                prompt_id: "a".into(),
                at: 1,
                expected: "x".into(),
                got: "x!".into(),
                counts: true,
            }],
            notes: vec![],
        }
    }

    #[test]
    fn markdown_has_a_row_per_configuration_and_shouts_mismatches() {
        let md = markdown(&report());
        assert!(md.contains("| none | 100.0 | 1.00 |"), "{md}");
        assert!(md.contains("| ngram-mod | 125.0 | 1.25 |"), "{md}");
        assert!(md.contains("**NO (0/1)**"), "{md}");
        assert!(md.contains("| draft-simple | skipped no draft model"), "{md}");
        assert!(md.contains("OUTPUT MISMATCHES: 1"), "{md}");
        let mut quiet = report();
        quiet.mismatches[0].counts = false;
        assert_eq!(quiet.failures(), 0);
        let md = markdown(&quiet);
        assert!(!md.contains("OUTPUT MISMATCHES") && md.contains("Not counted"), "{md}");
        assert!(md.contains("| smollm2-135m | 9.0 ms | 1.50 |"), "{md}");
        let json: serde_json::Value = serde_json::to_value(report()).unwrap();
        assert_eq!(json["groups"][0]["configs"][1]["requests"][0]["predicted_ms"], 800.0);
        assert!(json["groups"][0]["configs"][1]["requests"][0].get("content").is_none());
    }

    #[test]
    fn chart_is_a_png_when_a_font_is_there() {
        let r = report();
        let data = chart_data(&r, "smollm2-135m", 1);
        assert_eq!(data.len(), 2);
        assert_eq!(data[0].1, vec![("ngram-mod".to_string(), 1.25)]);
        let dir = std::env::temp_dir().join(format!("kolm-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        match write_charts(&r, &dir) {
            Ok(files) => {
                assert_eq!(files.len(), 1);
                let bytes = std::fs::read(&files[0]).unwrap();
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            }
            Err(e) => {
                assert!(e.contains("no TrueType font"), "{e}");
                eprintln!("chart not drawn: {e}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
