//! `kolm-rsd shortlist build` and `kolm-rsd shortlist report`: static shortlists for a restricted LM head.

use super::CliResult;
use indicatif::ProgressBar;
use kolm_rsd::compile::templated;
use kolm_rsd::head::{certify, exact_dot, needs_full_head, principal_directions, top2, HeadDevice, HeadInfo, HeadOptions, HeadRows, ProjectedBound, SubsetHead};
use kolm_rsd::llama::{argmax, Model, ModelOptions, Token};
use kolm_rsd::pack::write_atomic;
use kolm_rsd::quantile::{median, quantile};
use kolm_rsd::vocab;
use kolm_rsd::shortlist::{always_tokens, rank_of, score_positions, top_ids, Coverage, Histogram, Method, Shortlist, COVERAGE_KS};
use kolm_rsd::teacher::Teacher;
use kolm_rsd::workload;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Subcommand)]
pub enum ShortlistCmd {
    /// Rank token ids by the teacher's top-k predictions (or corpus frequency) and write a shortlist.
    Build(BuildArgs),
    /// Coverage, argmax parity with the full head under a margin fallback, certification, head GEMM time.
    Report(ReportArgs),
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum By {
    Topk,
    Frequency,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
pub enum Split {
    /// The compile split (3 of every 4 prompts).
    Train,
    /// Every 4th prompt.
    Heldout,
    All,
}

/// Where the text comes from: prompts, their split, and the teacher's own greedy continuations.
#[derive(clap::Args, Clone)]
pub struct TextArgs {
    /// Greedy tokens the teacher generates after each prompt; the continuation is scored too.
    #[arg(long, default_value_t = 48)]
    pub gen: usize,
    /// At most this many prompts per workload (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_prompts: usize,
    /// Positions per decode (all logits of a chunk in one batch).
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Teacher model (GGUF).
    #[arg(long)]
    pub model: PathBuf,
    /// Workloads (json-extraction, humaneval, mt-bench[:CAT], FILE.jsonl) or plain text files.
    #[arg(long, required = true, num_args = 1..)]
    pub corpus: Vec<String>,
    #[arg(long, value_enum, default_value_t = Split::Train)]
    pub split: Split,
    #[arg(long, default_value_t = 10)]
    pub top_k: usize,
    #[arg(long, default_value_t = 32768)]
    pub size: usize,
    #[arg(long, value_enum, default_value_t = By::Topk)]
    pub by: By,
    /// Histogram file: read when it exists (no model run), written otherwise.
    /// Default: beside the output, NAME.histogram.json.
    #[arg(long)]
    pub histogram: Option<PathBuf>,
    #[command(flatten)]
    pub text: TextArgs,
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(clap::Args)]
pub struct ReportArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub shortlist: PathBuf,
    /// Histogram of the shortlist, to rank sizes beyond the shortlist's own length.
    #[arg(long)]
    pub histogram: Option<PathBuf>,
    /// Held-out workloads (their held-out split is used unless --split says otherwise).
    #[arg(long, required = true, num_args = 1..)]
    pub heldout: Vec<String>,
    #[arg(long, value_enum, default_value_t = Split::Heldout)]
    pub split: Split,
    #[arg(long, value_delimiter = ',', default_value = "5000,10000,20000,30000,45000,60000,75000")]
    pub sizes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "32768,60000")]
    pub parity_sizes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1.5,0.5,0.3,0.1,0.02,0")]
    pub margins: Vec<f32>,
    /// Principal directions of the certificate's projected bound (r; capped at n_embd).
    #[arg(long, default_value_t = 32)]
    pub cert_dims: usize,
    /// Logit slack of the certificate (covers kernel vs exact arithmetic; see docs/shortlist.md).
    #[arg(long, default_value_t = 0.5)]
    pub slack: f32,
    /// Repetitions of the single-token head GEMM timing.
    #[arg(long, default_value_t = 100)]
    pub reps: usize,
    /// Threads of the head GEMM timing.
    #[arg(long, default_value_t = 1)]
    pub time_threads: i32,
    #[command(flatten)]
    pub text: TextArgs,
    /// Also write the tables (markdown) here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Plot of coverage against set size (PNG). Default: beside --output, NAME.coverage.png.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

pub fn run(cmd: ShortlistCmd) -> CliResult {
    match cmd {
        ShortlistCmd::Build(a) => build(&a),
        ShortlistCmd::Report(a) => report(&a),
    }
}

fn bar(len: u64, what: &str, unit: &str) -> ProgressBar {
    super::progress::bar(len, &format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {unit}, {{elapsed}} elapsed, eta {{eta}}"), what)
}

/// Token texts to score: each prompt with the model's chat template, followed by the teacher's greedy
/// continuation; plain files are tokenized as they are.
fn texts(model: &Model, sources: &[String], split: Split, t: &TextArgs) -> Result<Vec<Vec<Token>>, Box<dyn std::error::Error>> {
    let mut prompts = Vec::new();
    let mut raw = Vec::new();
    for s in sources {
        let is_workload = matches!(s.as_str(), "json-extraction" | "humaneval" | "code-edit") || s.starts_with("mt-bench") || s.ends_with(".jsonl");
        if is_workload {
            let all = workload::load(s)?;
            let (train, held) = workload::split(&all);
            let mut chosen = match split {
                Split::Train => train,
                Split::Heldout => held,
                Split::All => all,
            };
            if t.max_prompts > 0 {
                chosen.truncate(t.max_prompts);
            }
            prompts.extend(chosen.into_iter().map(|p| model.tokenize(&templated(model, &p.text), true, true)));
        } else {
            let text = std::fs::read_to_string(s).map_err(|e| format!("{s}: {e}"))?;
            raw.push(model.tokenize(&text, true, false)?);
        }
    }
    let prompts = prompts.into_iter().collect::<Result<Vec<_>, _>>()?;
    let mut out = raw;
    if t.gen == 0 {
        out.extend(prompts);
        return Ok(out);
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut teacher = Teacher::new(model, 1, longest + t.gen + 8, t.threads)?;
    let b = bar(prompts.len() as u64, "generate", "prompts");
    for p in prompts {
        let cont = teacher.greedy(&p, t.gen)?;
        out.push([p, cont].concat());
        b.inc(1);
    }
    b.finish_and_clear();
    Ok(out)
}

fn build(a: &BuildArgs) -> CliResult {
    let model = Model::load(&a.model, &ModelOptions::default())?;
    let fp = vocab::fingerprint(&model);
    let n_vocab = model.n_vocab();
    let hpath = a.histogram.clone().unwrap_or_else(|| {
        let stem = a.output.file_name().unwrap_or_default().to_string_lossy();
        let stem = stem.strip_suffix(".shortlist.json").or_else(|| stem.strip_suffix(".json")).unwrap_or(&stem).to_string();
        a.output.with_file_name(format!("{stem}.histogram.json"))
    });
    let hist = if hpath.is_file() {
        let h = Histogram::load(&hpath, Some((&fp, n_vocab as u32)))?;
        println!("histogram {} ({} positions, top-{}): no model run", hpath.display(), h.positions, h.top_k);
        h
    } else {
        let t0 = Instant::now();
        let texts = texts(&model, &a.corpus, a.split, &a.text)?;
        let total: usize = texts.iter().map(Vec::len).sum();
        let mut h = Histogram::new(fp.clone(), n_vocab, a.top_k);
        h.corpus = a.corpus.clone();
        for t in &texts {
            h.add_text(t);
        }
        let b = bar(total as u64, "score", "positions");
        score_positions(&model, &texts, a.text.batch, a.text.threads, false, |p| {
            h.add_logits(p.logits);
            b.inc(1);
        }, |_| {})?;
        b.finish_and_clear();
        write_atomic(&hpath, &h.to_vec()).map_err(|e| format!("{}: {e}", hpath.display()))?;
        println!("scored {} texts, {} positions in {:.0} s -> {}", texts.len(), h.positions, t0.elapsed().as_secs_f64(), hpath.display());
        h
    };
    let method = match a.by {
        By::Topk => Method::Topk,
        By::Frequency => Method::Frequency,
    };
    let always = always_tokens(&model);
    let s = Shortlist::from_histogram(&hist, method, &always, a.size);
    let seen = match method {
        Method::Topk => hist.topk.iter().filter(|&&c| c > 0).count(),
        Method::Frequency => hist.frequency.iter().filter(|&&c| c > 0).count(),
    };
    write_atomic(&a.output, &s.to_vec()).map_err(|e| format!("{}: {e}", a.output.display()))?;
    println!(
        "shortlist: {} of {} ids by {} ({} always-in special tokens, {} ids ever counted) -> {}",
        s.len(),
        n_vocab,
        method,
        always.len(),
        seen,
        a.output.display()
    );
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// Where the held-out positions split in two folds for the certificate's directions: the text boundary
/// nearest the middle (the middle itself when there is one text), so each fold is certified with
/// directions fitted on the other and no position on directions fitted on itself.
fn fold_boundary(text_lens: &[usize]) -> usize {
    let total: usize = text_lens.iter().sum();
    let inner = text_lens.iter().scan(0, |acc, &n| {
        *acc += n;
        Some(*acc)
    });
    inner.filter(|&b| b > 0 && b < total).min_by_key(|&b| b.abs_diff(total / 2)).unwrap_or(total / 2)
}

fn report(a: &ReportArgs) -> CliResult {
    let model = Model::load(&a.model, &ModelOptions::default())?;
    let n_vocab = model.n_vocab();
    let n_embd = model.n_embd();
    let s = Shortlist::load(&a.shortlist, &model)?;
    let ranking = match &a.histogram {
        Some(p) => {
            let h = Histogram::load(p, Some((&s.tokenizer, s.n_vocab)))?;
            Shortlist::from_histogram(&h, s.method, &s.ids[..s.always as usize], n_vocab).ids
        }
        None => s.ids.clone(),
    };
    let mut md = String::new();
    let name = a.model.file_name().unwrap_or_default().to_string_lossy().into_owned();
    md += &format!("### {name} (vocabulary {n_vocab}, ranking by {}, top-{})\n\n", s.method, s.top_k);

    // Held-out positions: teacher top-10, full argmax, hidden state.
    let t0 = Instant::now();
    let texts = texts(&model, &a.heldout, a.split, &a.text)?;
    let text_lens: Vec<usize> = texts.iter().map(Vec::len).collect();
    let total: usize = text_lens.iter().sum();
    let mut top10: Vec<Vec<u32>> = Vec::with_capacity(total);
    let mut full_arg: Vec<u32> = Vec::with_capacity(total);
    let mut hidden: Vec<f32> = Vec::with_capacity(total * n_embd);
    // Full logits are kept only at the ids of the largest parity set, for the kernel-difference check.
    let pmax = a.parity_sizes.iter().copied().max().unwrap_or(0).min(ranking.len());
    let check_ids: Vec<u32> = ranking[..pmax].to_vec();
    let mut full_at: Vec<f32> = Vec::new();
    let b = bar(total as u64, "score", "positions");
    score_positions(&model, &texts, a.text.batch, a.text.threads, true, |p| {
        top10.push(top_ids(p.logits, 10));
        full_arg.push(argmax(p.logits) as u32);
        hidden.extend_from_slice(p.hidden.unwrap());
        full_at.extend(check_ids.iter().map(|&i| p.logits[i as usize]));
        b.inc(1);
    }, |_| {})?;
    b.finish_and_clear();
    let npos = full_arg.len();
    println!("{} held-out texts, {npos} positions scored in {:.0} s", texts.len(), t0.elapsed().as_secs_f64());

    // Coverage.
    let rank = rank_of(&ranking, n_vocab);
    let mut cov = Coverage::default();
    for t in &top10 {
        cov.add(t, &rank);
    }
    let mut sizes: Vec<usize> = a.sizes.iter().map(|&n| n.min(n_vocab)).filter(|&n| n <= ranking.len()).collect();
    sizes.dedup();
    md += &format!("Coverage: share of {npos} held-out positions whose teacher top-k are all in the set.\n\n{}\n", cov.table(&sizes));
    let plot = a.plot.clone().or_else(|| a.output.as_ref().map(|o| o.with_extension("coverage.png")));
    if let Some(png) = plot {
        let lines: Vec<(String, Vec<(f64, f64)>)> = COVERAGE_KS
            .iter()
            .enumerate()
            .map(|(j, k)| (format!("top-{k} in the set"), sizes.iter().map(|&n| (n as f64, cov.share(n, j))).collect()))
            .collect();
        let title = format!("{name}: held-out coverage by shortlist size ({npos} positions)");
        match kolm_rsd::chart::draw_lines(&png, &title, "shortlist size (ids)", "positions covered (%)", &lines) {
            Ok(()) => md += &format!("![coverage]({})\n\n", png.file_name().unwrap_or_default().to_string_lossy()),
            Err(e) => eprintln!("no coverage plot: {e}"),
        }
    }
    let skipped: Vec<usize> = a.sizes.iter().copied().filter(|&n| n.min(n_vocab) > ranking.len()).collect();
    if !skipped.is_empty() {
        md += &format!("(sizes {skipped:?} exceed the ranking of {} ids; pass --histogram)\n\n", ranking.len());
    }

    // Parity, certification, kernel difference.
    if npos < 2 {
        return Err(format!("{npos} held-out positions: too few for the certificate's two folds").into());
    }
    let info = HeadInfo::open(&a.model)?;
    let hopts = HeadOptions { n_threads: a.text.threads, device: HeadDevice::Cpu };
    let rows = HeadRows::read(info.clone())?;
    let cut = fold_boundary(&text_lens);
    let folds = [0..cut, cut..npos];
    let dims = a.cert_dims.clamp(1, n_embd);
    let mut bounds = Vec::new();
    for f in 0..2 {
        let fit = &folds[1 - f];
        let u = principal_directions(&hidden[fit.start * n_embd..fit.end * n_embd], n_embd, dims);
        let sb = bar(n_vocab as u64, &format!("projected rows, fold {}", f + 1), "rows");
        bounds.push(ProjectedBound::of_head(&rows, u, |n| sb.set_position(n as u64)));
        sb.finish_and_clear();
    }
    // ρ/‖h‖: the share of the hidden state the directions miss, which decides how tight the bound is.
    let rho_share: Vec<f64> = (0..npos)
        .map(|pos| {
            let h = &hidden[pos * n_embd..(pos + 1) * n_embd];
            bounds[(pos >= cut) as usize].project(h).residual_norm() / exact_dot(h, h).sqrt().max(f64::MIN_POSITIVE)
        })
        .collect();
    md += &format!(
        "Parity: with the margin fallback at threshold m, a position is answered from the set when the subset's top-1 − top-2 \
         logit margin is ≥ m (else the full head is scored); parity = the answer equals the full head's argmax (llama.cpp's logits). \
         Head rows: {} ({}), n_embd {n_embd}.\n\n",
        info.tensor.name, info.tensor.type_name
    );
    let mut header = String::from("| set | measure |");
    let mut sep = String::from("|---|---|");
    for m in &a.margins {
        header += &format!(" m={m} |");
        sep += "---|";
    }
    md += &format!("{header}\n{sep}\n");
    let mut cert_md = format!(
        "Certificate: every outside row's logit is bounded by a_j·b + e_j·ρ (+ a rounding term), with b the projection of the \
         hidden state onto its top {dims} uncentred principal directions, ρ the norm of the rest, a_j and e_j the same for row j; \
         the directions of each half of the held-out positions are fitted on the hidden states of the other half ({} and {} \
         positions, split at a text boundary). Rows whose bound reaches the subset's top-1 logit minus a slack of {} are open and \
         are rescored exactly (f64 dot of the dequantized row); a position is certified when every outside row's bound or exact \
         logit plus the slack stays below the top-1 logit. Open rows are the certificate's cost beyond the bound itself \
         ({dims}/{n_embd} = {} of scoring the outside rows); cost = that + mean open share. Parity where certified = the subset \
         argmax equals llama.cpp's full-head argmax on the certified positions. ρ/‖h‖ over the positions: median {:.3}, \
         p10 {:.3}, p90 {:.3}.\n\n\
         | set | certified by the bound alone | certified after exact rescoring | open rows, mean | open rows, p99 | cost vs scoring the outside rows | parity where certified | subset argmax = full argmax | max abs top-1 kernel − exact | max abs logit diff vs llama.cpp |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        folds[0].len(),
        folds[1].len(),
        a.slack,
        pct(dims as f64 / n_embd as f64),
        median(&rho_share),
        quantile(&rho_share, 0.1),
        quantile(&rho_share, 0.9)
    );
    let mut max_diff_all = 0f32;
    for &ps in &a.parity_sizes {
        let n = ps.min(n_vocab);
        if n > ranking.len() {
            continue;
        }
        let ids = &ranking[..n];
        let mut head = SubsetHead::from_gguf(&a.model, ids, &hopts)?;
        let mut inset = vec![false; n_vocab];
        for &i in ids {
            inset[i as usize] = true;
        }
        let outside: Vec<u32> = (0..n_vocab as u32).filter(|&j| !inset[j as usize]).collect();
        let mut answered = vec![0usize; a.margins.len()];
        let mut agree = vec![0usize; a.margins.len()];
        let (mut by_bound, mut certified, mut cert_ok, mut plain_ok) = (0usize, 0usize, 0usize, 0usize);
        let mut max_diff = 0f32;
        let mut top1_vs_exact = 0f64;
        let mut open_share: Vec<f64> = Vec::with_capacity(npos);
        let cols = 32;
        let pb = bar(npos as u64, &format!("subset {n}"), "positions");
        for start in (0..npos).step_by(cols) {
            let c = cols.min(npos - start);
            let lg = head.logits(&hidden[start * n_embd..(start + c) * n_embd], c)?;
            for k in 0..c {
                let pos = start + k;
                let row = &lg[k * n..(k + 1) * n];
                let (i1, v1, v2) = top2(row);
                let sub = ids[i1];
                let ok = sub == full_arg[pos];
                plain_ok += ok as usize;
                for (j, &m) in a.margins.iter().enumerate() {
                    if !needs_full_head(v1, v2, m) {
                        answered[j] += 1;
                        agree[j] += ok as usize;
                    } else {
                        agree[j] += 1;
                    }
                }
                let h = &hidden[pos * n_embd..(pos + 1) * n_embd];
                top1_vs_exact = top1_vs_exact.max((v1 as f64 - rows.exact_logit(sub as usize, h)).abs());
                let v = certify(&bounds[(pos >= cut) as usize], &outside, h, v1, a.slack, |j| rows.exact_logit(j as usize, h));
                open_share.push(if outside.is_empty() { 0.0 } else { v.open as f64 / outside.len() as f64 });
                by_bound += (v.certified && v.open == 0) as usize;
                certified += v.certified as usize;
                cert_ok += (v.certified && ok) as usize;
                if n <= pmax {
                    let f = &full_at[pos * pmax..pos * pmax + n];
                    for (x, y) in row.iter().zip(f) {
                        max_diff = max_diff.max((x - y).abs());
                    }
                }
            }
            pb.inc(c as u64);
        }
        pb.finish_and_clear();
        max_diff_all = max_diff_all.max(max_diff);
        let np = npos as f64;
        md += &format!("| {n} | answered from the set |");
        for &x in &answered {
            md += &format!(" {} |", pct(x as f64 / np));
        }
        md += &format!("\n| {n} | parity with full head |");
        for &x in &agree {
            md += &format!(" {} |", pct(x as f64 / np));
        }
        md.push('\n');
        let mean_open = open_share.iter().sum::<f64>() / np;
        cert_md += &format!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {top1_vs_exact:.4} | {max_diff:.4} |\n",
            pct(by_bound as f64 / np),
            pct(certified as f64 / np),
            pct(mean_open),
            pct(quantile(&open_share, 0.99)),
            pct(dims as f64 / n_embd as f64 + mean_open),
            if certified > 0 { pct(cert_ok as f64 / certified as f64) } else { "—".into() },
            pct(plain_ok as f64 / np)
        );
    }
    md += &format!("\n{cert_md}\n");

    // Head GEMM time, one hidden state (a draft step), subset vs full, interleaved.
    let topts = HeadOptions { n_threads: a.time_threads, device: HeadDevice::Cpu };
    let mut full = SubsetHead::from_gguf(&a.model, &(0..n_vocab as u32).collect::<Vec<_>>(), &topts)?;
    md += &format!(
        "Head GEMM (ggml_mul_mat of the {} rows by one hidden state, i.e. one draft step's head), {} backend, {} thread(s), \
         median of {} interleaved runs:\n\n| rows | time | vs full |\n|---|---|---|\n",
        full.type_name(), full.backend_name(), a.time_threads, a.reps
    );
    let h0 = hidden[..n_embd].to_vec();
    let mut subs: Vec<(usize, SubsetHead)> = Vec::new();
    for &ps in &a.parity_sizes {
        let n = ps.min(n_vocab);
        if n <= ranking.len() {
            subs.push((n, SubsetHead::from_gguf(&a.model, &ranking[..n], &topts)?));
        }
    }
    let mut tf = Vec::new();
    let mut ts: Vec<Vec<f64>> = vec![Vec::new(); subs.len()];
    for _ in 0..3 {
        full.logits(&h0, 1)?;
        for (_, s) in subs.iter_mut() {
            s.logits(&h0, 1)?;
        }
    }
    let mut outf = vec![0f32; n_vocab];
    let mut outs: Vec<Vec<f32>> = subs.iter().map(|(n, _)| vec![0f32; *n]).collect();
    for _ in 0..a.reps {
        let t = Instant::now();
        full.logits_into(&h0, 1, &mut outf)?;
        tf.push(t.elapsed().as_secs_f64());
        for (j, (_, s)) in subs.iter_mut().enumerate() {
            let t = Instant::now();
            s.logits_into(&h0, 1, &mut outs[j])?;
            ts[j].push(t.elapsed().as_secs_f64());
        }
    }
    let mf = median(&tf);
    md += &format!("| {n_vocab} (full) | {:.3} ms | 1.00× |\n", mf * 1e3);
    for (j, (n, _)) in subs.iter().enumerate() {
        let m = median(&ts[j]);
        md += &format!("| {n} | {:.3} ms | {:.2}× faster |\n", m * 1e3, mf / m);
    }
    md += &format!("\nLargest |subset logit − llama.cpp logit| over all checked positions and rows: {max_diff_all:.4}.\n");
    print!("{md}");
    if let Some(o) = &a.output {
        write_atomic(o, md.as_bytes()).map_err(|e| format!("{}: {e}", o.display()))?;
    }
    Ok(())
}
