//! The run-time drafter: the key a list in the prompt names, pack literal lookup, pack shape lookup, n-grams
//! of the current request, then (when one is attached) a draft model, chained token by token, with a
//! break-even control that picks the draft length (or none) from measured verify cost, drafter cost and
//! acceptance per kind of evidence and place in the answer's syntax.
//!
//! Per sequence (llama-server slot): `begin` with the prompt, then each step `propose` (given
//! every token so far plus the token just sampled) and `accept` (how many drafted tokens the
//! target kept). Time is passed in as monotonic nanoseconds, so tests never sleep.
//!
//! Rooms: `config` (tuning), `seq` (what is kept per sequence), `chain` (the tokens one draft proposes and
//! the evidence of each), `control` (break-even: the best length), `beta` (what a verify step costs, measured),
//! `rates` (how often drafts are kept), `mean` (the running mean both clocks keep), `step` (which sequences
//! share the server's step, and the forward passes llama.cpp makes of it), `lag` (how far each request is behind
//! plain decoding for the others' drafts), `gate` (whether drafting pays at
//! all, measured), `probe` (how much a draft model may add, and when one that does not pay is asked again),
//! `miss` (positions the next compile could learn), `decision` (what the control did with a chain and why, for a step
//! log); evidence comes from `context` (the request's copies),
//! `enumeration` and `syntax` (the prompt's lists, the answer's places), `prediction` (the request's predicted
//! output), [`crate::live`] (what the target answered earlier, learned while serving) and `model` (a draft model).

pub mod beta;
mod chain;
pub mod class;
mod config;
pub mod context;
pub mod control;
pub mod decision;
pub mod enumeration;
pub mod gate;
pub mod gates;
mod lag;
mod mean;
mod miss;
pub mod onepass;
pub mod model;
mod prediction;
mod probe;
mod rates;
pub mod rewrite;
mod seq;
pub mod stats;
pub mod step;
pub mod syntax;
mod unit;

use std::collections::VecDeque;

use crate::index::Index;
use crate::live::file::Learned;
use crate::live::Live;
use chain::{build_chain, estimate, Lookups};
use class::{Class, Source, N_CLASSES};
use beta::BetaModel;
use control::{best_length, may_pay_more, Verify};
use decision::{Decision, Ended, Why};
use rates::{Acceptance, Rates};
use gate::{Arm, Clock, Gate};
use gates::Gates;
use lag::Ledger;
use miss::Pending;
use prediction::Coda;
use probe::ModelProbes;
use seq::Seq;
use step::{Rounds, MAX_DRAFT};
use syntax::TokenTexts;

pub use chain::{copied_token, next_key};
pub use config::{Context, DrafterConfig};
pub use miss::{Miss, MissKind, MISS_CONTEXT};
pub use stats::Stats;

/// Where drafted tokens come from beyond the pack and the request's n-grams: a draft model.
pub trait TokenSource: Send {
    /// The token it predicts after `history` (every token of `seq` so far, drafts included), or None.
    fn next(&mut self, seq: usize, history: &[i32]) -> Option<i32>;
    /// Measured cost per predicted token, ns (None before the first).
    fn cost_ns(&self) -> Option<f64>;
    /// One line on what it did (for the shutdown summary).
    fn summary(&self) -> String;
}

/// One token of the chain a sequence's last `propose` built, drafted or not: the token, the evidence it rests on
/// and the acceptance the control expected of it. A trace of the drafter's decisions sets these against what
/// the target then wrote (`kolm-rsd replay --trace`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Proposed {
    pub token: i32,
    pub class: Class,
    pub p: f32,
}

/// Drafter for `n_seq` sequences sharing one pack, one β model and a global acceptance prior.
pub struct Drafter {
    cfg: DrafterConfig,
    index: Option<Index>,
    seqs: Vec<Seq>,
    beta: BetaModel,
    /// Acceptance per class and per position over all sequences, the prior of each sequence's.
    global: Rates<N_CLASSES>,
    global_acc: Acceptance,
    misses: VecDeque<Miss>,
    rounds: Rounds,
    /// How far each request is behind plain decoding in its time in the slot.
    ledger: Ledger,
    source: Option<Box<dyn TokenSource>>,
    /// Token texts, to tell keys and values from code; without them every position counts as code.
    texts: Option<TokenTexts>,
    /// When a draft model that does not pay is asked again.
    probes: ModelProbes,
    /// Whether drafting pays at all, measured (with the break-even control on and a gate configured), alone and
    /// beside other slots.
    gate: Option<Gates>,
    /// Recipes learned from every sequence's verified answers, shared by all sequences.
    live: Option<Live>,
    /// Whether the last `propose` was the first of a server step, and, when asked to ([`Drafter::with_step_log`]),
    /// what the β model priced the step that ended there at (ns) before learning from it and each slot's decision
    /// in it.
    stepped: bool,
    stepped_price: Option<f64>,
    stepped_decisions: Vec<Decision>,
    log_steps: bool,
    /// What answers wrote after repeating their prediction, drafted after the next one's end.
    coda: Coda,
}

impl Drafter {
    /// A drafter over `index` (or request n-grams only, without a pack).
    pub fn new(index: Option<Index>, mut cfg: DrafterConfig) -> Drafter {
        cfg.max_draft = cfg.max_draft.min(MAX_DRAFT);
        cfg.ctx_max_n = cfg.ctx_max_n.clamp(1, 8);
        let seqs = (0..cfg.n_seq).map(|_| Seq::new(cfg.ctx_max_n)).collect();
        Drafter {
            beta: BetaModel::new(&cfg.beta_prior).with_layout(cfg.layout),
            rounds: if cfg.joint { Rounds::new(cfg.n_seq).joint() } else { Rounds::new(cfg.n_seq) },
            ledger: Ledger::new(cfg.n_seq),
            gate: cfg.gate.clone().filter(|_| cfg.adaptive).map(Gates::new),
            probes: ModelProbes::new(&cfg),
            cfg,
            index,
            seqs,
            global: Rates::default(),
            global_acc: Acceptance::default(),
            misses: VecDeque::new(),
            source: None,
            texts: None,
            live: None,
            stepped: false,
            stepped_price: None,
            stepped_decisions: Vec::new(),
            log_steps: false,
            coda: Coda::default(),
        }
    }

    /// Prices every step that ends before learning from it and keeps each slot's decision in it, for
    /// [`Drafter::ended_step`] (a step log): work the drafter does not need for itself.
    pub fn with_step_log(mut self) -> Drafter {
        self.log_steps = true;
        self
    }

    /// Attaches a live index: every sequence's verified answer tokens are counted into it, and it is consulted
    /// where the pack has no recipe.
    pub fn with_live(mut self, live: Live) -> Drafter {
        self.live = Some(live);
        self
    }

    /// The longest draft proposed (0: every call does its bookkeeping and drafts nothing).
    pub fn max_draft(&self) -> usize {
        self.cfg.max_draft
    }

    /// The live index, when one is attached.
    pub fn live(&self) -> Option<&Live> {
        self.live.as_ref()
    }

    /// The acceptance all sequences learned per class of evidence: what a restarted server should start from.
    pub fn learned(&self) -> Learned {
        let (num, den) = self.global.counts();
        Learned { layout: class::layout(), num: num.to_vec(), den: den.to_vec() }
    }

    /// Starts from acceptance an earlier run learned; false (and nothing changed) when it was learned for
    /// another class layout.
    pub fn restore_learned(&mut self, l: &Learned) -> bool {
        match Rates::from_counts(&l.num, &l.den).filter(|_| l.layout == class::layout()) {
            Some(r) => {
                self.global = r;
                true
            }
            None => false,
        }
    }

    /// Attaches a draft model, consulted where the pack and the request's n-grams have nothing.
    pub fn with_source(mut self, source: Box<dyn TokenSource>) -> Drafter {
        self.source = Some(source);
        self
    }

    /// Attaches the vocabulary's token texts (indexed by id), so acceptance is learned per place in the
    /// answer's syntax (see [`syntax`]).
    pub fn with_texts(mut self, texts: TokenTexts) -> Drafter {
        for s in &mut self.seqs {
            s.ctx.set_canon(texts.canonical());
        }
        self.texts = Some(texts);
        self
    }

    /// The draft model's cost per token relative to a plain step: measured once both are, else the prior.
    fn model_cost(&self) -> Option<f64> {
        let src = self.source.as_ref()?;
        Some(match (src.cost_ns(), self.beta.unit_ns()) {
            (Some(c), Some(u)) if u > 0.0 => c / u,
            _ => self.cfg.model_cost_prior,
        })
    }

    /// What the draft model did, when one is attached.
    pub fn source_summary(&self) -> Option<String> {
        self.source.as_ref().map(|s| s.summary())
    }

    /// The step that the last `propose` ended by being the first of the next one (its price and decisions only
    /// when asked for, [`Drafter::with_step_log`]); None when the call was not the first of a step.
    pub fn ended_step(&self) -> Option<Ended<'_>> {
        self.stepped.then(|| Ended { tokens: self.rounds.last(), price: self.stepped_price, decisions: &self.stepped_decisions })
    }

    /// Marks the end of a `propose` on `seq` at `now_ns`: the step's verify cost is timed from here, so
    /// a draft model's own time is not taken for verify cost.
    pub fn end_propose(&mut self, seq: usize, now_ns: u64) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.last_ns = Some(now_ns);
        }
    }

    /// A step begins: the proposals up to the next call are its own, whatever order their sequences come in
    /// (vLLM drafts its batch's rows in row order, and rows move between sequences). Without it a step is told
    /// by the sequences coming in slot order, as llama-server's plugin asks them.
    pub fn start_step(&mut self) {
        self.rounds.start();
    }

    /// Starts a new request on `seq`. Counters persist; acceptance and timing start over.
    pub fn begin(&mut self, seq: usize, prompt: &[i32]) {
        let Some(s) = self.seqs.get_mut(seq) else {
            return;
        };
        // The request this one replaces ends here: what its answer wrote after its prediction, as far as seen.
        if let Some(predicted) = s.pred.tokens() {
            let hist = s.ctx.tokens();
            let answer: Vec<i32> = hist[s.answer.start().min(hist.len())..].iter().chain(&s.draft[..s.kept]).copied().collect();
            self.coda.learn(predicted, &answer, self.texts.as_ref());
        }
        s.restart(prompt, self.texts.as_ref());
        self.rounds.begun(seq);
        self.ledger.begun(seq);
        // llama-server and vLLM call this right after the decode that evaluated the prompt.
        self.prompt_decoded();
    }

    /// The decode that just ended also evaluated a prompt (a request begun, or a chunk of a prompt vLLM prefills
    /// over several steps): every sequence's interval up to its next call holds that time, which is not verify
    /// cost, so none of them times it, nor does the gate. At `-np 8`, with prompts 64% of the wall time, such
    /// intervals made β look flat (1.02–1.07 for 2–5 tokens, session 16).
    pub fn prompt_decoded(&mut self) {
        for s in &mut self.seqs {
            s.last_ns = None;
        }
        if let Some(g) = &mut self.gate {
            g.prompt();
        }
    }

    /// The request just begun on `seq` comes with a predicted output (`tokens`): copies of it are drafted
    /// like copies of the request's own text. Replaces an earlier prediction of the same request.
    pub fn predict(&mut self, seq: usize, tokens: &[i32]) {
        let Some(s) = self.seqs.get_mut(seq) else {
            return;
        };
        let prompt = &s.ctx.tokens()[..s.answer.start().min(s.ctx.tokens().len())];
        s.pred.set(&s.ctx, prompt, tokens, &self.coda, self.texts.as_ref());
    }

    /// Predicted tokens of the current request on `seq` that the target kept and discarded in drafts.
    pub fn prediction_counts(&self, seq: usize) -> Option<(u64, u64)> {
        self.seqs.get(seq).map(|s| (s.pred.accepted, s.pred.rejected))
    }

    /// Proposes up to `n_max` tokens to follow `tokens` + `id_last` into `out`; returns how many.
    /// `now_ns` is a monotonic clock reading, used to learn the verify cost.
    pub fn propose(
        &mut self,
        seq: usize,
        tokens: &[i32],
        id_last: i32,
        n_max: usize,
        now_ns: u64,
        out: &mut Vec<i32>,
    ) -> usize {
        out.clear();
        self.stepped = false;
        let model_cost = self.model_cost();
        if seq >= self.seqs.len() {
            return 0;
        }
        let new_step = self.rounds.enter(seq);
        self.stepped = new_step;
        if new_step && self.cfg.shared_lag < f64::INFINITY {
            // Every slot's `accept` of the step that ended came before this call, and no other slot was asked since.
            // (Kept only while it is read: it added a tenth to a lone sequence's `propose`.)
            let last = self.rounds.last();
            let plain = self.beta.step(last.len(), |j| last[j].min(1));
            let cost = if plain > 0.0 { self.beta.step(last.len(), |j| last[j]) / plain } else { 1.0 };
            let seqs = &self.seqs;
            self.ledger.step(last, |j| 1 + seqs[j].kept, cost);
        }
        if new_step && self.log_steps {
            let last = self.rounds.last();
            self.stepped_price = self.beta.step_ns(last.len(), |j| last[j]);
            self.stepped_decisions.clear();
            self.stepped_decisions.extend(self.seqs.iter().map(|s| Decision { kept: s.kept, ..s.decision }));
        }
        // The cells the step that ended read: each of its sequences' mirror as of its call then, give or take its tokens.
        let step_ctx = if new_step && self.gate.is_some() {
            let last = self.rounds.last();
            last.iter().zip(&self.seqs).filter(|(&t, _)| t > 0).map(|(_, s)| s.ctx.tokens().len()).sum()
        } else {
            0
        };
        let cfg = &self.cfg;
        let s = &mut self.seqs[seq];
        s.stats.calls += 1;
        // The gate's "off" windows draft nothing (and ask the draft model nothing); misses are still found.
        let beta = &self.beta;
        let shared = self.rounds.shared(seq);
        let others = shared.others();
        let gated = self.gate.as_mut().is_some_and(|gates| {
            let g = gates.at(!others);
            if new_step {
                let last = self.rounds.last();
                let plain = g.clock() == Clock::PlainSteps;
                let price = beta.step_ns(last.len(), |j| last[j].min(1)).filter(|_| plain);
                g.step(last.iter().filter(|&&t| t > 0).count(), step_ctx, last.iter().any(|&t| t > 1), self.rounds.left(), price);
            }
            g.call(now_ns, new_step);
            g.arm() == Arm::Off
        });
        if let Some(prev) = s.last_ns.filter(|_| new_step && !self.rounds.left()) {
            // The interval since this sequence's last call is one decode of the last step's tokens, unless a request
            // ended in that step: the server answered it and took up the next then, as the gate cuts out. Timed, such
            // steps of three slots took 133 ms against 87 at `-np 4` (session 58), and the table, kept
            // non-decreasing, lifted the four-token bucket to them: plain steps of four slots priced 113 ms for 96.
            // Each step once, by its first call: timed by every slot's call, one slow step counted four times at
            // `-np 4`, and two of them lifted the fit of several-pass steps past where no draft paid (session 73).
            self.beta.observe_step(self.rounds.last(), now_ns.saturating_sub(prev));
        }
        let unfair = if cfg.joint { Verify::new(&self.beta, &shared).joint(&self.beta, &shared) } else { Verify::new(&self.beta, &shared) };
        let verify = unfair.fair(cfg.shared_fair).owed(self.ledger.least_slack(shared.tokens, cfg.shared_lag));
        let margin = 1.0 + if others { cfg.shared_min_gain } else { cfg.min_gain };
        let need = verify.floor(margin);
        s.last_ns = Some(now_ns);
        s.awaiting_accept = false;
        s.kept = 0;
        let before = s.ctx.tokens().len();
        let (rewrites, pred) = (&mut s.rewrites, s.pred.index());
        let kept = if cfg.context != Context::Off || pred.is_some() {
            s.ctx.sync_each(tokens, id_last, |c, x| rewrites.observe(c, pred, cfg.context == Context::All, x))
        } else {
            s.ctx.sync(tokens, id_last)
        };
        if let Some(texts) = &self.texts {
            s.answer.sync(texts, s.ctx.tokens(), kept);
        }
        // Every token the mirror holds is the target's own (drafts are not in it): count the new answer tokens
        // (those of accepted drafts were counted at `accept`, unless the sequence lost them since).
        let hist = s.ctx.tokens();
        // The shared rates also learn from the chain's first undrafted token, now that the target has put its
        // own there: a class the control declines is still measured, where its prior would otherwise decide
        // for good. Judged only behind a draft the target kept whole, on an unchanged history. A sequence's own
        // rates learn from drafts only (see `Seq::judge`).
        let mut judged = None;
        if let Some((t, c)) = s.judge.take() {
            let (base, g) = (s.draft_base, s.draft.len());
            if let Some(&x) = hist.get(base + g).filter(|_| kept == before && hist[base..base + g] == s.draft[..]) {
                self.global.observe(c.index(), x == t, cfg.global_decay);
                judged = Some(x == t);
            }
        }
        if kept < before {
            s.fed = s.fed.min(kept);
        }
        // The chain's first lookup reads the sets of the windows that end the history: asked for before the feed,
        // their misses overlap its own, and the windows are hashed once for the pack and the live index.
        let mut first = None;
        if let Some(live) = &mut self.live {
            let lookups = Lookups::new(self.index.as_ref(), Some(live));
            if s.fed < hist.len() && lookups.shared() {
                let mut w = lookups.windows(hist);
                live.prefetch_lookup(&mut w);
                first = Some(w);
            }
            for i in s.fed..hist.len() {
                live.feed(&hist[i.saturating_sub(live.max_n())..i], hist[i]);
            }
        }
        s.fed = s.fed.max(hist.len());
        miss::resolve(s.ctx.tokens(), &mut s.pending, &mut self.misses, cfg.miss_capacity, &mut s.stats);

        let n_max = n_max.min(cfg.max_draft);
        if n_max == 0 {
            s.chain.clear();
            s.decision = Decision { judged, ..Decision::default() };
            self.rounds.record(seq, 1, 1.0);
            return 0;
        }
        let global = &self.global;
        // How many tokens the draft model may add, and whether this is a probe of a model that does not pay.
        let p_model = estimate(cfg, global, &s.rates, Class::model(s.answer.now().place()));
        let budget = self.probes.budget(model_cost, p_model, cfg, &verify, n_max, need);
        s.stats.model_probes += u64::from(budget.probe);
        let model = self.source.as_deref_mut().map(|m| (m, seq, if gated { 0 } else { budget.len }));
        // Offered to a step where the others draft, a chain is looked for as long as it is sure, whatever it would
        // pay alone.
        let offering = (cfg.joint && others && cfg.shared_sure > 0.0).then_some(cfg.shared_sure);
        let pos0 = build_chain(self.index.as_ref(), self.live.as_ref(), self.texts.as_ref(), cfg, s, n_max, global, &verify, need, offering, model, first);

        let mut p = [0f32; MAX_DRAFT];
        let mut cost = [0f64; MAX_DRAFT];
        for (i, &(_, c)) in s.chain.iter().enumerate() {
            p[i] = estimate(cfg, global, &s.rates, c);
            cost[i] = if c.source() == Source::Model { model_cost.unwrap_or(0.0) } else { 0.0 };
        }
        let n = s.chain.len();
        // Beside other slots only tokens expected right nearly always are drafted (probes aside): the others' step
        // grows by every token, and what a likely one saves its own request is time the others lose.
        let m = if others { p[..n].iter().take_while(|&&x| x >= cfg.shared_sure).count() } else { n };
        let best = best_length(&p[..m], &verify, &cost[..m], need);
        // Tokens expected right nearly always pass the gate, as long as they pay by the control's own rule.
        let sure = self.gate.as_ref().map(Gates::current).map_or(0, |gate| p[..m].iter().take_while(|&&x| x >= gate.pass()).count());
        let (g, why) = if gated {
            s.stats.steps_gated += 1;
            (best_length(&p[..sure], &verify, &cost[..sure], need), Why::GateOff)
        } else if !cfg.adaptive || budget.probe {
            (n, if budget.probe { Why::Probe } else { Why::Drafted })
        } else if best > 0 && s.drafting_run >= cfg.calibrate_every {
            (0, Why::Calibrate)
        } else if best > 0 {
            (best, Why::Drafted)
        } else if n > 0 {
            // The control judges drafting not worth it here; now and then it drafts anyway, to re-measure.
            s.off_steps += 1;
            s.stats.steps_off += 1;
            if s.off_steps >= cfg.probe_every {
                s.off_steps = 0;
                s.stats.probes += 1;
                (cfg.probe_len.clamp(1, n), Why::Probe)
            } else if m == 0 {
                (0, Why::Unsure)
            } else if self.log_steps && best_length(&p[..m], &unfair, &cost[..m], need) > 0 {
                (0, Why::Fair)
            } else {
                (0, Why::Price)
            }
        } else {
            (0, Why::NoChain)
        };
        // An empty chain was not looked for where no sure chain could pay (`build_chain` stops before its first
        // token, unless the chain is offered): told apart from one not found only for a step log, its only reader.
        let why = match (n, g) {
            (0, _) if self.log_steps && cfg.adaptive && offering.is_none() && !may_pay_more(1.0, 1.0, need, &verify, 0, n_max) => {
                if may_pay_more(1.0, 1.0, need, &unfair, 0, n_max) { Why::FairOut } else { Why::PricedOut }
            }
            (0, _) => Why::NoChain,
            (_, 1..) if why == Why::GateOff => Why::Drafted,
            _ => why,
        };
        s.decision = Decision { found: n, drafted: g, kept: 0, why, p0: p[0], judged };
        let base = s.ctx.tokens().len();
        if let Some(expect) = pos0 {
            s.pending.push(Pending::new(
                s.ctx.tokens(),
                &[],
                base,
                MissKind::Uncovered,
                expect,
            ));
        }
        s.draft.clear();
        for &(t, c) in &s.chain[..g] {
            s.draft.push(t);
            match c.source() {
                Source::Literal => s.stats.literal_hits += 1,
                Source::Shape => s.stats.shape_hits += 1,
                Source::Live => s.stats.live_hits += 1,
                Source::Context => s.stats.context_hits += 1,
                Source::Model => s.stats.model_hits += 1,
            }
        }
        out.extend_from_slice(&s.draft);
        s.draft_base = base;
        s.judge = s.chain.get(g).copied();
        let expected = 1.0 + p[..g].iter().scan(1.0f64, |run, &pi| { *run *= f64::from(pi); Some(*run) }).sum::<f64>();
        self.rounds.record(seq, g + 1, expected);
        if offering.is_some() && g == 0 && m > 0 {
            let (len, offered) = control::offer(&p[..m], &self.beta, &self.rounds.shared(seq), margin);
            self.rounds.offer(seq, len + 1, offered);
        }
        s.awaiting_accept = g > 0;
        if let Some(gate) = self.gate.as_mut().filter(|_| g > 0).map(Gates::current_mut) {
            if g <= sure {
                gate.sure();
            } else {
                gate.drafted(g);
            }
        }
        s.drafting_run = if g > 0 { s.drafting_run + 1 } else { 0 };
        if g > 0 {
            s.stats.drafts += 1;
            s.stats.tokens_drafted += g as u64;
        }
        g
    }

    /// The target kept the first `n_accepted` tokens of the last proposal on `seq`.
    pub fn accept(&mut self, seq: usize, n_accepted: usize) {
        let Some(s) = self.seqs.get_mut(seq) else {
            return;
        };
        if !s.awaiting_accept {
            return;
        }
        s.awaiting_accept = false;
        let g = s.draft.len();
        let n = n_accepted.min(g);
        s.kept = n;
        s.stats.tokens_accepted += n as u64;
        if s.chain_predicted != 0 {
            let (kept, discarded) = s.pred.observe(s.chain_predicted, g, n);
            s.stats.prediction_accepted += kept;
            s.stats.prediction_rejected += discarded;
        }
        if let Some(g) = &mut self.gate {
            g.current_mut().accepted(n);
        }
        // Kept tokens are the target's output: counted now, as a request's last ones reach no later `propose`.
        if let (Some(live), true) = (&mut self.live, s.fed == s.draft_base) {
            let hist = s.ctx.tokens();
            let tail = hist.len().saturating_sub(live.max_n());
            s.scratch.clear();
            s.scratch.extend_from_slice(&hist[tail..]);
            s.scratch.extend_from_slice(&s.draft[..n]);
            let at = hist.len() - tail;
            for i in at..at + n {
                live.feed(&s.scratch[..i], s.scratch[i]);
            }
            s.fed += n;
        }
        s.acc.observe_run(g, n, self.cfg.alpha_decay);
        self.global_acc.observe_run(g, n, self.cfg.global_decay);
        // Tokens up to the first rejected one were trials of their class; later ones were never judged.
        for (i, &(_, c)) in s.chain[..g].iter().enumerate().take(n + 1) {
            s.rates.observe(c.index(), i < n, self.cfg.alpha_decay);
            self.global.observe(c.index(), i < n, self.cfg.global_decay);
        }
        if n < g {
            let p = Pending::new(
                s.ctx.tokens(),
                &s.draft[..n],
                s.draft_base + n,
                MissKind::Rejected,
                s.draft[n],
            );
            s.pending.push(p);
        }
    }

    /// Moves the recorded misses into `out`.
    pub fn drain_misses(&mut self, out: &mut Vec<Miss>) {
        out.extend(self.misses.drain(..));
    }

    /// The chain `seq`'s last `propose` built (longer than its draft where the control cut it), with the
    /// estimates it was judged by: read before `accept`, which moves them.
    pub fn last_chain(&self, seq: usize) -> Vec<Proposed> {
        let Some(s) = self.seqs.get(seq) else { return Vec::new() };
        let p = |c| estimate(&self.cfg, &self.global, &s.rates, c);
        s.chain.iter().map(|&(token, class)| Proposed { token, class, p: p(class) }).collect()
    }

    /// Counters of one sequence, with its acceptance estimate and the shared β table.
    pub fn stats(&self, seq: usize) -> Option<Stats> {
        let s = self.seqs.get(seq)?;
        Some(Stats {
            alpha: s.acc.rate(0),
            beta: self.beta.table(),
            ..s.stats
        })
    }

    /// The gate of the last call (alone or beside other slots): its windows run with drafting on and off, and its
    /// measured rates of each.
    pub fn gate(&self) -> Option<&Gate> {
        self.gate.as_ref().map(Gates::current)
    }

    /// Both gates.
    pub fn gates(&self) -> Option<&Gates> {
        self.gate.as_ref()
    }

    /// Counters summed over all sequences, with the global acceptance estimate.
    pub fn global_stats(&self) -> Stats {
        let mut total = Stats {
            alpha: self.global_acc.rate(0),
            beta: self.beta.table(),
            ..Stats::default()
        };
        for s in &self.seqs {
            total.add_counts(&s.stats);
        }
        total
    }
}



#[cfg(test)]
mod tests {
    use super::beta::DEFAULT_BETA_PRIOR;
    use super::gate::GateConfig;
    use super::step::Layout;
    use super::*;
    use crate::pack::tests::{lit, meta};
    use syntax::Place;
    use crate::pack::{Entry, Pack};


    fn index(entries: Vec<Entry>) -> Index {
        Index::new(&Pack::from_entries(meta(), entries).unwrap(), None)
    }

    /// Free verification and confident acceptance: the control drafts as much as it can.
    fn eager(n_seq: usize) -> DrafterConfig {
        DrafterConfig {
            n_seq,
            beta_prior: vec![(1, 1.0), (16, 1.0)],
            class_prior: [0.9; N_CLASSES],
            ..DrafterConfig::default()
        }
    }

    /// A draft model stand-in: predicts `history.last() + 1`, counts its calls, costs `cost_ns`.
    struct Counter {
        calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        cost_ns: f64,
    }

    impl TokenSource for Counter {
        fn next(&mut self, _seq: usize, history: &[i32]) -> Option<i32> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            history.last().map(|t| t + 1)
        }
        fn cost_ns(&self) -> Option<f64> {
            Some(self.cost_ns)
        }
        fn summary(&self) -> String {
            String::new()
        }
    }

    /// Runs `steps` steps of a sequence counting up by one (what Counter predicts), the target accepting all.
    fn run_with_model(cfg: DrafterConfig, steps: usize, step_ns: u64, cost_ns: f64) -> (usize, Stats) {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut d = Drafter::new(None, cfg).with_source(Box::new(Counter { calls: calls.clone(), cost_ns }));
        let mut toks: Vec<i32> = vec![1, 2, 3];
        d.begin(0, &toks);
        let (mut now, mut out) = (0u64, Vec::new());
        for _ in 0..steps {
            let last = *toks.last().unwrap() + 1;
            let g = d.propose(0, &toks, last, 4, now, &mut out);
            toks.push(last);
            toks.extend_from_slice(&out);
            d.accept(0, g);
            now += step_ns * (g as u64 + 1);
        }
        (calls.load(std::sync::atomic::Ordering::Relaxed), d.global_stats())
    }


    /// Serves `answer` to `prompt` on `seq` one token a step, drafting with at most `n_max`; returns what was
    /// drafted and accepted (the target keeps a drafted token only where it is the answer's).
    fn serve(d: &mut Drafter, seq: usize, prompt: &[i32], answer: &[i32], n_max: usize) -> (u64, u64) {
        serve_predicted(d, seq, prompt, &[], answer, n_max)
    }

    /// [`serve`] with a predicted output (none if empty).
    fn serve_predicted(d: &mut Drafter, seq: usize, prompt: &[i32], prediction: &[i32], answer: &[i32], n_max: usize) -> (u64, u64) {
        let before = d.stats(seq).unwrap();
        d.begin(seq, prompt);
        if !prediction.is_empty() {
            d.predict(seq, prediction);
        }
        let mut toks = prompt.to_vec();
        let mut out = Vec::new();
        let mut i = 0;
        while i < answer.len() {
            let g = d.propose(seq, &toks, answer[i], n_max, i as u64 * 1000, &mut out);
            toks.push(answer[i]);
            let kept = out[..g].iter().zip(&answer[i + 1..]).take_while(|(a, b)| a == b).count();
            d.accept(seq, kept);
            toks.extend_from_slice(&answer[i + 1..i + 1 + kept]);
            i += 1 + kept;
        }
        let after = d.stats(seq).unwrap();
        (after.tokens_drafted - before.tokens_drafted, after.tokens_accepted - before.tokens_accepted)
    }

    #[test]
    fn a_request_drafts_from_what_another_slot_answered() {
        let cfg = DrafterConfig { context: Context::Off, ..eager(2) };
        let live = Live::new(crate::live::LiveConfig::default(), None);
        let mut d = Drafter::new(None, cfg.clone()).with_live(live);
        let prompt = [1, 2, 3, 4];
        let answer: Vec<i32> = (100..140).collect();
        assert_eq!(serve(&mut d, 0, &prompt, &answer, 8), (0, 0), "nothing learned yet");
        let (drafted, accepted) = serve(&mut d, 1, &prompt, &answer, 8);
        assert!(drafted >= 32 && accepted == drafted, "the second slot drafts most of the answer, all of it right: {drafted} {accepted}");
        assert_eq!(d.global_stats().live_hits, drafted);
        assert_eq!(d.live().unwrap().fed(), 80);
        // Without the live index the same traffic drafts nothing.
        let mut plain = Drafter::new(None, cfg);
        serve(&mut plain, 0, &prompt, &answer, 8);
        assert_eq!(serve(&mut plain, 1, &prompt, &answer, 8), (0, 0));
    }

    #[test]
    fn windows_hashed_once_for_the_pack_and_the_live_index_draft_as_hashed_apart() {
        // The engine gives the pack's index and the live index one shape table, and the chain hashes each place's
        // windows once for both; a live index with a table of its own (equal, not shared) hashes its own. The
        // same traffic must draft the same either way.
        let sh = crate::shape::tests::table();
        let v = sh.len() as i32;
        let mut x = 7u32;
        let mut next = || {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) as i32 % v
        };
        let prompt: Vec<i32> = (0..24).map(|_| next()).collect();
        let answer: Vec<i32> = (0..160).map(|_| next()).collect();
        // The pack knows a few places of the answer; the live index learns the rest from the first request.
        let entries = answer.windows(4).step_by(9).map(|w| lit(&w[..3], w[3] as u32, 3)).collect();
        let pack = Pack::from_entries(meta(), entries).unwrap();
        let cfg = DrafterConfig { context: Context::Off, ..eager(2) };
        let run = |own_table: bool| {
            let live_shapes = if own_table { crate::shape::tests::table() } else { sh.clone() };
            assert_eq!(live_shapes.same(&sh), !own_table);
            let live = Live::new(crate::live::LiveConfig::default(), Some(live_shapes));
            let mut d = Drafter::new(Some(Index::new(&pack, Some(sh.clone()))), cfg.clone()).with_live(live);
            let first = serve(&mut d, 0, &prompt, &answer, 8);
            let second = serve(&mut d, 1, &prompt, &answer, 8);
            let st = d.global_stats();
            (first, second, st.literal_hits, st.live_hits, d.live().unwrap().len())
        };
        let shared = run(false);
        assert!(shared.2 > 0 && shared.3 > 0, "both the pack and the live index drafted: {shared:?}");
        assert_eq!(shared, run(true));
    }

    #[test]
    fn a_restarted_drafter_starts_from_the_acceptance_learned_before() {
        let cfg = DrafterConfig { context: Context::Off, ..eager(2) };
        let mut d = Drafter::new(None, cfg.clone()).with_live(Live::new(crate::live::LiveConfig::default(), None));
        let answer: Vec<i32> = (100..140).collect();
        serve(&mut d, 0, &[1, 2, 3, 4], &answer, 8);
        serve(&mut d, 1, &[1, 2, 3, 4], &answer, 8);
        let learned = d.learned();
        assert!(learned.den.iter().any(|&t| t > 0.0), "the second request's drafts were trials");
        let mut again = Drafter::new(None, cfg.clone());
        assert_ne!(again.learned(), learned);
        assert!(again.restore_learned(&learned));
        assert_eq!(again.learned(), learned);
        let mut other = Drafter::new(None, cfg);
        assert!(!other.restore_learned(&Learned { layout: "another".into(), ..learned.clone() }));
        assert!(!other.restore_learned(&Learned { num: vec![1.0], den: vec![1.0], ..learned }));
        assert!(other.learned().den.iter().all(|&t| t == 0.0), "nothing taken from counts it cannot use");
    }

    #[test]
    fn a_draft_model_is_used_only_where_it_pays() {
        let cpu = DrafterConfig { context: Context::Off, ..DrafterConfig::default() };
        // Verification on this CPU's β and a model costing half a target step: never worth a probe.
        let (calls, st) = run_with_model(cpu.clone(), 300, 1_000_000, 500_000.0);
        assert_eq!((calls, st.model_hits, st.model_probes), (0, 0, 0), "{st:?}");
        // Nearly free verification and a cheap model: it drafts, and its tokens are accepted.
        let gpu = DrafterConfig { beta_prior: vec![(1, 1.0), (16, 1.2)], ..cpu.clone() };
        let (calls, st) = run_with_model(gpu, 100, 1_000_000, 50_000.0);
        assert!(calls > 100 && st.model_hits > 100 && st.tokens_accepted == st.tokens_drafted, "{calls} {st:?}");
        // Break-even control off: the model drafts n_max at every step whatever it costs.
        let fixed = DrafterConfig { adaptive: false, ..cpu };
        let (calls, st) = run_with_model(fixed, 50, 1_000_000, 500_000.0);
        assert_eq!((calls, st.model_hits, st.drafts), (200, 200, 50), "{st:?}");
    }

    #[test]
    fn chains_pack_lookups() {
        let mut d = Drafter::new(
            Some(index(vec![
                lit(&[1], 2, 5),
                lit(&[2], 3, 5),
                lit(&[1, 2, 3], 4, 2),
            ])),
            eager(1),
        );
        d.begin(0, &[50, 51]);
        let mut out = Vec::new();
        assert_eq!(d.propose(0, &[50, 51], 1, 3, 0, &mut out), 3);
        assert_eq!(
            out,
            [2, 3, 4],
            "the third token needs the two drafted ones as context"
        );
        let st = d.stats(0).unwrap();
        assert_eq!(
            (st.literal_hits, st.tokens_drafted, st.drafts, st.calls),
            (3, 3, 1, 1)
        );
    }

    #[test]
    fn stops_on_low_confidence() {
        let mut d = Drafter::new(
            Some(index(vec![
                lit(&[1], 2, 5),
                lit(&[2], 3, 1),
                lit(&[2], 4, 1),
            ])),
            eager(1),
        );
        d.begin(0, &[50]);
        let mut out = Vec::new();
        assert_eq!(d.propose(0, &[50], 1, 4, 0, &mut out), 1);
        assert_eq!(
            out,
            [2],
            "2 → 3 or 4 at 50% each is below the 60% threshold"
        );
    }

    #[test]
    fn falls_back_to_request_ngrams_and_keeps_sequences_apart() {
        let mut d = Drafter::new(None, eager(2));
        let prompt = [10, 11, 12, 13, 14, 10, 11];
        d.begin(0, &prompt);
        let mut out = Vec::new();
        assert_eq!(d.propose(0, &prompt, 12, 3, 0, &mut out), 3);
        assert_eq!(
            out,
            [13, 14, 10],
            "copies what followed 11 12 earlier in this request"
        );
        d.begin(1, &[10, 11]);
        assert_eq!(d.stats(0).unwrap().context_hits, 3);
        assert_eq!(
            d.propose(1, &[10, 11], 12, 3, 0, &mut out),
            0,
            "sequence 1 never saw 11 12 → 13"
        );
        assert!(out.is_empty());
        assert_eq!(
            d.propose(7, &[1], 2, 3, 0, &mut out),
            0,
            "unknown sequence: nothing, no panic"
        );
    }

    #[test]
    fn a_prediction_is_copied_from_the_first_step_and_counted() {
        let mut d = Drafter::new(None, DrafterConfig { adaptive: false, context: Context::Off, ..DrafterConfig::default() });
        let prompt = [1, 2, 3];
        d.begin(0, &prompt);
        d.predict(0, &[10, 11, 12, 13, 14]);
        let mut out = Vec::new();
        // The target's first token is the prediction's: the rest of it is drafted (context=0 or not).
        assert_eq!(d.propose(0, &prompt, 10, 15, 0, &mut out), 4);
        assert_eq!(out, [11, 12, 13, 14]);
        d.accept(0, 2); // the target keeps 11 12, then says 20
        assert_eq!(d.prediction_counts(0), Some((2, 2)));
        assert_eq!((d.global_stats().prediction_accepted, d.global_stats().prediction_rejected), (2, 2));
        // A new request forgets the prediction and its counts.
        d.begin(0, &prompt);
        assert_eq!(d.prediction_counts(0), Some((0, 0)));
        assert_eq!(d.propose(0, &prompt, 10, 15, 1, &mut out), 0);
    }

    #[test]
    fn a_fenced_answer_copies_its_prediction_from_the_fence_s_next_line_and_closes_it_as_the_last_one_did() {
        // Token texts: 0 the end of turn (a control token), 1 "```", 2 `python`, 3 a newline, 4 `]`, 5 `]\n`, words.
        let mut vocab: Vec<Vec<u8>> = [&b"<|im_end|>"[..], b"```", b"python", b"\n", b"]", b"]\n"].map(<[u8]>::to_vec).into();
        vocab.extend((6..40).map(|t| format!(" w{t}").into_bytes()));
        let vocab: Vec<&[u8]> = vocab.iter().map(Vec::as_slice).collect();
        let texts = TokenTexts::new(&vocab).with_control(|t| t == 0);
        let drafter = || Drafter::new(None, DrafterConfig { adaptive: false, context: Context::Answer, ..DrafterConfig::default() }).with_texts(texts.clone());
        // The model fences the code it was given bare: ```python, a newline, the code, its last `]` as `]\n`, ```.
        let prompt = [6, 7, 8];
        let fenced = |code: &[i32]| -> Vec<i32> { [1, 2, 3].iter().chain(&code[..code.len() - 1]).chain(&[5, 1, 0]).copied().collect() };
        let (first, second) = ([10, 11, 12, 13, 14, 15, 4], [20, 21, 22, 23, 24, 25, 4]);
        let propose = |d: &mut Drafter, written: &[i32]| {
            let mut toks: Vec<i32> = prompt.iter().chain(written).copied().collect();
            let last = toks.pop().unwrap();
            let mut out = Vec::new();
            d.propose(0, &toks, last, 8, 0, &mut out);
            out
        };
        let mut d = drafter();
        d.begin(0, &prompt);
        d.predict(0, &first);
        assert!(propose(&mut d, &[1, 2]).is_empty(), "the fence's line is not the prediction's");
        assert_eq!(propose(&mut d, &[1, 2, 3])[..3], [10, 11, 12], "on the fence's next line the prediction starts");
        // Served whole, the first answer teaches the fence's close: the next prediction's end runs on into it.
        serve_predicted(&mut d, 0, &prompt, &first, &fenced(&first), 8);
        d.begin(0, &prompt);
        d.predict(0, &second);
        assert_eq!(propose(&mut d, &[1, 2, 3, 20, 21, 22, 23, 24, 25]), [5, 1], "`]` as `]\\n`, the close; no control token");
        let mut fresh = drafter();
        fresh.begin(0, &prompt);
        fresh.predict(0, &second);
        assert_eq!(propose(&mut fresh, &[1, 2, 3, 20, 21, 22, 23, 24, 25]), [4], "no answer seen: the prediction as it is");
    }

    #[test]
    fn a_step_that_decoded_a_prompt_is_not_timed() {
        // A sequence decodes one token a step in 50 ms; two steps also prefill chunks of another prompt (+40 ms).
        let unit = |prefill_told: bool| {
            let mut d = Drafter::new(None, DrafterConfig { context: Context::Off, ..DrafterConfig::default() });
            let (toks, mut out, mut now) = ([1, 2, 3], Vec::new(), 0u64);
            d.begin(0, &toks);
            for step in 0..12 {
                now += if step % 6 == 5 { 90_000_000 } else { 50_000_000 };
                if step % 6 == 5 && prefill_told {
                    d.prompt_decoded();
                }
                d.propose(0, &toks, 4, 4, now, &mut out);
                d.accept(0, 0);
            }
            d.beta.unit_ns().unwrap()
        };
        assert!((unit(true) - 50e6).abs() < 1e6, "the plain step stays 50 ms: {}", unit(true));
        assert!(unit(false) > 52e6, "timed, the prefill inflates it: {}", unit(false));
    }

    #[test]
    fn an_answer_only_copy_reads_what_the_answer_wrote_and_never_the_prompt() {
        let cfg = |context| DrafterConfig { adaptive: false, context, ..DrafterConfig::default() };
        // The prompt holds 1 2 3 4 5 6; the answer wrote 1 2 7 8 9 and comes back to 1 2.
        let prompt = [1, 2, 3, 4, 5, 6, 0];
        let mut hist = prompt.to_vec();
        hist.extend([1, 2, 7, 8, 9, 1]);
        let mut out = Vec::new();
        for (context, want) in [(Context::Answer, vec![7, 8, 9]), (Context::Off, vec![])] {
            let mut d = Drafter::new(None, cfg(context));
            d.begin(0, &prompt);
            let g = d.propose(0, &hist, 2, 3, 0, &mut out);
            assert_eq!(out[..g], want, "{context:?}: the answer's 7 8 9 after `1 2`, not the prompt's 3 4 5");
        }
        // A match that only the prompt holds is no answer copy.
        let mut d = Drafter::new(None, cfg(Context::Answer));
        d.begin(0, &prompt);
        assert_eq!(d.propose(0, &[1, 2, 3, 4, 5, 6, 0, 9, 4], 5, 3, 0, &mut out), 0, "{out:?}");
    }

    /// A machine where verification is dear (this CPU before patch 0005: the second token costs 0.6 steps, every
    /// further one 0.5), so that only drafts resting on strong evidence pay; the decisions tested below are the
    /// drafter's, not the current prior's.
    fn dear() -> DrafterConfig {
        DrafterConfig { beta_prior: vec![(1, 1.0), (2, 1.6), (16, 8.6)], ..DrafterConfig::default() }
    }

    #[test]
    fn drafts_long_copies_of_long_matches_and_nothing_on_short_ones() {
        let mut d = Drafter::new(None, dear());
        let passage: Vec<i32> = (100..130).collect();
        let mut prompt = vec![1, 2];
        prompt.extend(&passage);
        prompt.extend([7, 8]);
        prompt.extend(&passage[..20]); // the answer is copying the passage: 20 tokens so far
        let (last, toks) = prompt.split_last().unwrap();
        d.begin(0, toks);
        let mut out = Vec::new();
        let g = d.propose(0, toks, *last, 15, 0, &mut out);
        assert!(g >= 3, "a copy after a 20-token match drafts several tokens: {g}");
        assert_eq!(out, passage[20..20 + g]);
        // A 2-token match: a copy from it is not worth a verify step.
        let short = [10, 11, 12, 13, 50, 51, 11];
        d.begin(0, &short);
        assert_eq!(d.propose(0, &short, 12, 15, 1, &mut out), 0, "{out:?}");
    }

    #[test]
    fn a_declined_class_is_still_learned_by_the_shared_rates() {
        // The prompt holds pairs `1000+k 2000+k`; the answer writes `900+k 1000+k 2000+k`, so after `1000+k`
        // a copy of one token proposes `2000+k`, and is right every time. Expected right 20% of the time a
        // priori, it is not drafted (nor probed, here); the shared rates still learn it from what the target
        // put there, and a new request drafts it.
        let prompt: Vec<i32> = (0..12).flat_map(|k| [1000 + k, 2000 + k]).collect();
        let answer: Vec<i32> = (0..12).flat_map(|k| [900 + k, 1000 + k, 2000 + k]).collect();
        let cfg = DrafterConfig { gate: None, probe_every: u32::MAX, ..DrafterConfig::default() };
        let mut d = Drafter::new(None, cfg.clone());
        let one = Class::copy(1, false, false, false, Place::Code);
        let shared = |d: &Drafter| estimate(&d.cfg, &d.global, &Rates::default(), one);
        let before = shared(&d);
        let trials = |d: &Drafter| d.seqs[0].rates.counts().1[one.index()];
        serve(&mut d, 0, &prompt, &answer[..6], 15);
        assert_eq!(trials(&d), 0.0, "declined");
        assert!(before < 0.3 && shared(&d) > before + 0.2, "{before} -> {}", shared(&d));
        serve(&mut d, 0, &prompt, &answer, 15);
        let (num, den) = d.seqs[0].rates.counts();
        assert!(den[one.index()] >= 3.0 && num[one.index()] == den[one.index()], "drafted, and right");
        assert!(shared(&d) > 0.7, "{}", shared(&d));

        // The chain's next token is judged only behind a draft the target kept whole: here the server dropped
        // the draft (`4`) and decoded `50 51` instead, so `51` says nothing about the chain's `5`. The chain's
        // second token, a copy after 4 tokens, is expected never right, so the draft is its first.
        let mut class_prior = [0.9; N_CLASSES];
        class_prior[Class::copy(4, false, false, false, Place::Code).index()] = 0.0;
        let mut d = Drafter::new(None, DrafterConfig { class_prior, ..cfg });
        let toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        d.begin(0, &toks[..9]);
        let mut out = Vec::new();
        assert_eq!(d.propose(0, &toks, 3, 4, 0, &mut out), 1);
        assert_eq!((out.as_slice(), d.seqs[0].chain.len()), (&[4][..], 2));
        let next = d.seqs[0].chain[1].1.index();
        let trials = d.global.counts().1[next];
        d.propose(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 50], 51, 4, 1, &mut out);
        assert_eq!(d.global.counts().1[next], trials);
    }

    #[test]
    fn a_short_copy_of_the_answer_is_its_own_kind_of_evidence() {
        // The prompt holds `10 11 12`; the answer wrote `20 21 22` and then `20 21` again.
        let prompt = [1, 2, 10, 11, 12, 13, 3];
        let mut d = Drafter::new(None, DrafterConfig { adaptive: false, ..DrafterConfig::default() });
        d.begin(0, &prompt);
        let mut out = Vec::new();
        let mut toks: Vec<i32> = prompt.iter().chain(&[20, 21, 22, 30, 20]).copied().collect();
        d.propose(0, &toks, 21, 1, 0, &mut out);
        assert_eq!(out, [22]);
        assert_eq!(d.seqs[0].chain[0].1, Class::copy(2, false, true, false, Place::Code), "a copy of what the answer wrote");
        toks.extend([21, 22, 40]);
        d.propose(0, &toks, 10, 1, 1, &mut out);
        toks.push(10);
        d.propose(0, &toks, 11, 1, 2, &mut out);
        assert_eq!(out, [12]);
        assert_eq!(d.seqs[0].chain[0].1, Class::copy(2, false, false, false, Place::Code), "a copy of the prompt");
    }

    #[test]
    fn a_copy_that_starts_a_line_is_its_own_kind_of_evidence() {
        // The prompt holds `def f ( ) :` `\n` `␣␣` `doc` `more`; the answer re-types the signature, so after
        // `:` the copy proposes the newline within the line, then the next line's indentation and `doc`, where
        // the answer decides what that line holds, then ` more` within it again.
        let vocab: [&[u8]; 9] = [b"def", b" f", b"(", b")", b":", b"\n", b"  ", b" doc", b" more"];
        let prompt = [0, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut d = Drafter::new(None, DrafterConfig { adaptive: false, ..DrafterConfig::default() }).with_texts(TokenTexts::new(&vocab));
        d.begin(0, &prompt);
        let mut out = Vec::new();
        let mut toks: Vec<i32> = prompt.iter().chain(&[0, 1, 2]).copied().collect();
        d.propose(0, &toks, 3, 4, 0, &mut out);
        assert_eq!(out, [4, 5, 6, 7]);
        let kinds: Vec<Class> = d.seqs[0].chain.iter().map(|&(_, c)| c).collect();
        assert_eq!(kinds[..2], [4, 5].map(|n| Class::copy(n, false, false, false, Place::Code)), "within the line");
        assert_eq!(kinds[2..], [6, 7].map(|n| Class::copy(n, false, false, true, Place::Code)), "the next line's indentation and first text");
        // The same from the history: the answer's last tokens are the newline and the indentation.
        toks.extend([3, 4, 5]);
        d.propose(0, &toks, 6, 4, 4, &mut out);
        assert_eq!(d.seqs[0].chain[..2], [(7, Class::copy(7, false, false, true, Place::Code)), (8, Class::copy(8, false, false, false, Place::Code))]);
    }

    #[test]
    fn sure_copies_are_drafted_while_the_gate_is_off() {
        let gate = GateConfig { window: 2, min_steps: 1, pass: 0.9, ..GateConfig::default() };
        let mut d = Drafter::new(None, DrafterConfig { gate: Some(gate), ..DrafterConfig::default() });
        // Nothing to copy, and steps timed slow while the gate's arm drafts: it switches drafting off.
        d.begin(0, &[1]);
        let (mut toks, mut now, mut out) = (vec![1], 0u64, Vec::new());
        for t in 1000..1100 {
            d.propose(0, &toks, t, 15, now, &mut out);
            toks.push(t);
            let on = d.gate().unwrap().arm() == Arm::On;
            if t >= 1040 && !on {
                break;
            }
            now += if on { 100 } else { 10 } * 1_000_000;
        }
        let gate = d.gate().unwrap();
        assert_eq!(gate.arm(), Arm::Off);
        assert!(gate.rates()[1] > gate.rates()[0], "{:?}", gate.rates());
        // A copy after a 20-token match is sure (each token expected right ≥ 90%): drafted all the same.
        let passage: Vec<i32> = (100..140).collect();
        let mut prompt = vec![1, 2];
        prompt.extend(&passage);
        prompt.extend([7, 8]);
        d.begin(0, &prompt);
        let mut toks = prompt.clone();
        toks.extend(&passage[..20]);
        let gated = d.global_stats().steps_gated;
        let g = d.propose(0, &toks, passage[20], 15, now + 10_000_000, &mut out);
        assert_eq!(d.global_stats().steps_gated, gated + 1, "the call was gated");
        assert!(g >= 4, "several tokens: {g}");
        assert_eq!(out, passage[21..21 + g]);
        assert_eq!(d.gate().unwrap().sure_steps, 0, "the step it drafted for is cut when it is timed");
    }

    #[test]
    fn a_rename_the_answer_made_is_drafted_where_the_old_name_recurs() {
        // The code calls `20 21` (a name) three times; the answer renames it `20 22 23` everywhere. The code is in
        // the prompt, or only in the request's prediction (the request's own text not copied).
        let code = [8, 9, 10, 11, 20, 21, 30, 31, 32, 33, 5, 40, 41, 20, 21, 50, 51, 52, 53, 6, 44, 45, 20, 21, 60, 61, 62, 63, 7];
        let answer: Vec<i32> = code.iter().flat_map(|&t| if t == 21 { vec![22, 23] } else { vec![t] }).collect();
        let nth = |t: &[i32], n: usize| (0..answer.len()).filter(|&i| answer[i..].starts_with(t)).nth(n).unwrap();
        let in_prompt: Vec<i32> = [1, 2].iter().chain(&code).chain(&[3]).copied().collect();
        for predicted in [false, true] {
            let prompt = if predicted { vec![1, 2, 3] } else { in_prompt.clone() };
            let at = |k: usize| {
                let mut toks = prompt.clone();
                toks.extend_from_slice(&answer[..k]);
                let last = toks.pop().unwrap();
                (toks, last)
            };
            let mut d = Drafter::new(None, DrafterConfig { adaptive: false, context: if predicted { Context::Off } else { Context::All }, ..DrafterConfig::default() });
            d.begin(0, &prompt);
            if predicted {
                d.predict(0, &code);
            }
            let mut out = Vec::new();
            // At the second call, right after `20`: the copy would say 21; the answer's rewrite says 22 23.
            let (toks, last) = at(nth(&[20], 1) + 1);
            d.propose(0, &toks, last, 6, 0, &mut out);
            assert_eq!(out[..4], [22, 23, 50, 51], "the new name, then the copy after the old one ({predicted})");
            // With the new name begun (`20 22`), the rest of it and the text after the third call's old name.
            let (toks, last) = at(nth(&[20, 22], 2) + 2);
            d.propose(0, &toks, last, 6, 1, &mut out);
            assert_eq!(out[..3], [23, 60, 61], "{predicted}");
            // With it written, the copy goes on where the old name was, not after an earlier new one.
            let (toks, last) = at(nth(&[20, 22, 23], 2) + 3);
            d.propose(0, &toks, last, 6, 2, &mut out);
            assert_eq!(out[..3], [60, 61, 62], "{predicted}");
        }
    }

    #[test]
    fn a_copy_stops_before_a_control_token() {
        // The prompt's passage ends in the chat template's end-of-turn marker (token 3); the answer copies the
        // passage and must not be offered the marker.
        let vocab: Vec<Vec<u8>> = (0..40).map(|t| format!("w{t} ").into_bytes()).collect();
        let vocab: Vec<&[u8]> = vocab.iter().map(Vec::as_slice).collect();
        let texts = TokenTexts::new(&vocab).with_control(|t| t == 3);
        let passage: Vec<i32> = (10..35).collect();
        let mut prompt = vec![1, 2];
        prompt.extend(&passage);
        prompt.extend([3, 4]);
        let mut tokens = prompt.clone();
        tokens.extend(&passage[..20]);
        let (&last, tokens) = tokens.split_last().unwrap();
        let mut out = Vec::new();
        let mut d = Drafter::new(None, DrafterConfig { adaptive: false, ..DrafterConfig::default() });
        d.begin(0, &prompt);
        d.propose(0, tokens, last, 15, 0, &mut out);
        assert_eq!(out[..6], [30, 31, 32, 33, 34, 3], "without token texts the copy runs on into the marker");
        let mut d = Drafter::new(None, DrafterConfig { adaptive: false, ..DrafterConfig::default() }).with_texts(texts);
        d.begin(0, &prompt);
        d.propose(0, tokens, last, 15, 0, &mut out);
        assert_eq!(out, [30, 31, 32, 33, 34]);
    }

    #[test]
    fn a_recipe_is_drafted_in_a_key_but_not_in_a_value() {
        // After an opening quote the pack always proposes `name`: right where a key starts, rarely in a value.
        let vocab: [&[u8]; 5] = [b"{", b" \"", b"name", b"\":", b"x"];
        let pack = || Some(index(vec![lit(&[1], 2, 9)]));
        let key: &[i32] = &[4, 0]; // prompt `x`, answer `{`, then ` "`
        let value: &[i32] = &[4, 0, 1, 2, 3]; // … `{ "name":`, then ` "`
        let mut out = Vec::new();
        for (tokens, drafted) in [(key, 1), (value, 0)] {
            let mut d = Drafter::new(pack(), dear()).with_texts(TokenTexts::new(&vocab));
            d.begin(0, &tokens[..1]);
            assert_eq!(d.propose(0, tokens, 1, 4, 0, &mut out), drafted, "{tokens:?}");
        }
        let mut d = Drafter::new(pack(), dear());
        d.begin(0, &value[..1]);
        assert_eq!(d.propose(0, value, 1, 4, 0, &mut out), 1, "without token texts every place counts as code");
    }

    #[test]
    fn keys_are_drafted_in_the_order_the_prompt_lists_them() {
        let vocab: [&[u8]; 15] = [
            b"fields", b":", b" name", b",", b" email", b" phone", b"{", b"\n", b" \"", b"name", b"\":", b"x", b"\",", b"email",
            b"phone",
        ];
        let prompt = [0, 1, 2, 3, 4, 3, 5]; // fields: name, email, phone
        let mut d = Drafter::new(None, DrafterConfig::default()).with_texts(TokenTexts::new(&vocab));
        let mut out = Vec::new();
        let mut answer = |so_far: &[i32], last: i32| {
            d.begin(0, &prompt);
            let tokens: Vec<i32> = prompt.iter().chain(so_far).copied().collect();
            d.propose(0, &tokens, last, 4, 0, &mut out);
            out.clone()
        };
        assert_eq!(answer(&[6], 8), [9], "the first key of the answer is the list's first item");
        assert_eq!(answer(&[6, 8, 9, 10, 8, 11, 12], 8), [13], "after `name` comes `email`");
        assert_eq!(answer(&[6, 8, 9, 10, 8, 11, 12, 8, 13, 10, 8, 11, 12], 8), [14]);
        assert_eq!(answer(&[6, 8, 9, 10, 8], 11), [] as [i32; 0], "values are not keys");
    }

    #[test]
    fn steps_are_priced_only_when_asked() {
        const MS: u64 = 1_000_000;
        let ended = |priced: bool| {
            let mut d = Drafter::new(None, DrafterConfig { n_seq: 2, ..DrafterConfig::default() });
            if priced {
                d = d.with_step_log();
            }
            let mut out = Vec::new();
            d.begin(0, &[1, 2]);
            d.begin(1, &[3, 4]);
            let mut seen = Vec::new();
            for step in 0..3u64 {
                for seq in 0..2 {
                    d.propose(seq, &[1, 2], 5, 4, step * 10 * MS, &mut out);
                    if let Some(e) = d.ended_step() {
                        assert_eq!(e.decisions.len(), if priced { 2 } else { 0 }, "decisions only when asked");
                        assert!(e.decisions.iter().all(|x| x.why == Why::NoChain && x.found == 0));
                        seen.push((e.tokens.to_vec(), e.price));
                    }
                }
            }
            seen
        };
        let priced = ended(true);
        assert_eq!(priced.len(), 2, "two steps ended: {priced:?}");
        assert!(priced.iter().all(|(slots, _)| slots == &[1, 1]), "{priced:?}");
        assert!(priced[1].1.is_some_and(|p| p > 0.0), "priced once a step was timed: {priced:?}");
        assert!(ended(false).iter().all(|(_, p)| p.is_none()), "no price unless asked");
    }

    /// A prompt that ends 20 tokens into a repeat of a 30-token passage: a copy alone pays by far.
    fn repeats_a_passage() -> Vec<i32> {
        let passage: Vec<i32> = (100..130).collect();
        let mut prompt = vec![1, 2];
        prompt.extend(&passage);
        prompt.extend([7, 8]);
        prompt.extend(&passage[..20]);
        prompt
    }

    #[test]
    fn a_shared_call_asks_its_own_gain() {
        // A copy after a 20-token match: alone it pays by far; in a call another sequence shares (in one pass: a
        // unified KV cache), by about 11%: less than a margin of 25% (the default until session 30), more than 5%.
        let prompt = repeats_a_passage();
        let (last, toks) = prompt.split_last().unwrap();
        let mut out = Vec::new();
        let drafted = |cfg: DrafterConfig, out: &mut Vec<i32>| {
            let mut d = Drafter::new(None, DrafterConfig { n_seq: 2, layout: Some(Layout::Unified), ..cfg });
            d.begin(0, toks);
            d.begin(1, &[50, 51]);
            d.propose(1, &[50, 51], 52, 15, 0, out); // sequence 1 puts one token into the call
            d.propose(0, toks, *last, 15, 0, out)
        };
        let any = || DrafterConfig { shared_sure: 0.0, shared_fair: 0.0, ..dear() };
        assert_eq!(drafted(DrafterConfig { shared_min_gain: 0.25, ..any() }, &mut out), 0, "{out:?}");
        assert!(drafted(any(), &mut out) >= 2, "with the default margin it drafts");
        // Beside another slot only tokens expected right at least `shared_sure` of the time are drafted: a copy of a
        // 20-token match starts at its class's prior (0.85 in code), over the default floor (0.8), under 0.9.
        assert!(drafted(dear(), &mut out) >= 2, "{out:?}");
        assert_eq!(drafted(DrafterConfig { shared_sure: 0.9, ..dear() }, &mut out), 0, "{out:?}");
        let sure = DrafterConfig { class_prior: [0.99; N_CLASSES], shared_sure: 0.9, ..dear() };
        let unfair = drafted(DrafterConfig { shared_fair: 0.0, ..sure.clone() }, &mut out);
        // By default a draft must also buy the step a tenth of the share it adds to it for each request beside it
        // (`shared_fair`): beside one slot a sure copy still does, if not at every length.
        let fair = drafted(sure, &mut out);
        assert!(fair >= 2 && fair <= unfair, "{fair} of {unfair}: {out:?}");
        let mut alone = Drafter::new(None, dear());
        alone.begin(0, toks);
        assert!(alone.propose(0, toks, *last, 15, 0, &mut out) >= 3);
    }

    #[test]
    fn slots_that_each_decline_a_sure_copy_draft_it_when_the_step_is_decided_together() {
        // Four slots, each 20 tokens into a repeat of a passage, under a KV stream per slot: one slot's second token
        // is a pass of its own (3.0 plain steps of one token against 2.0), every slot's second token one pass of eight
        // (2.8). Per step: how many tokens each slot drafts.
        let prompt = repeats_a_passage();
        let (last, toks) = prompt.split_last().unwrap();
        let drafted = |joint: bool| {
            let cfg = DrafterConfig {
                n_seq: 4,
                beta_prior: vec![(1, 1.0), (4, 2.0), (8, 2.8), (16, 5.2)],
                layout: Some(Layout::Split),
                gate: None,
                joint,
                ..DrafterConfig::default()
            };
            let mut d = Drafter::new(None, cfg);
            let mut out = Vec::new();
            (0..4).for_each(|seq| d.begin(seq, toks));
            (0..3).map(|_| (0..4).map(|seq| d.propose(seq, toks, *last, 15, 0, &mut out)).collect::<Vec<_>>()).collect::<Vec<_>>()
        };
        assert_eq!(drafted(false), [[0; 4]; 3], "alone each draft costs a pass, and nobody drafts");
        assert_eq!(drafted(true), [[0; 4], [1; 4], [1; 4]], "each offered a token: the next steps draft them together");
    }

    #[test]
    fn a_step_log_reads_why_each_slot_drafted_or_not() {
        // `a_shared_call_asks_its_own_gain`'s copy beside a sequence that has nothing to draft; the next step's
        // first call ends the step and reads its decisions.
        let prompt = repeats_a_passage();
        let (last, toks) = prompt.split_last().unwrap();
        let mut out = Vec::new();
        let decided = |cfg: DrafterConfig, keep: usize, out: &mut Vec<i32>| {
            let mut d = Drafter::new(None, DrafterConfig { n_seq: 2, layout: Some(Layout::Unified), ..cfg }).with_step_log();
            d.begin(0, toks);
            d.begin(1, &[50, 51]);
            d.propose(0, toks, *last, 0, 0, out);
            d.propose(1, &[50, 51], 52, 15, 0, out);
            let g = d.propose(0, toks, *last, 15, 0, out);
            d.propose(1, &[50, 51, 52], 53, 15, 0, out);
            d.accept(0, keep);
            d.propose(0, toks, *last, 0, 0, out);
            let e = d.ended_step().expect("sequence 0 asked again begins a step");
            assert_eq!(e.tokens, [g + 1, 1]);
            assert_eq!((e.decisions[1].found, e.decisions[1].drafted), (0, 0), "nothing to copy");
            e.decisions[0]
        };
        let d = decided(dear(), 2, &mut out);
        assert!(d.found >= d.drafted && d.drafted >= 2 && d.why == Why::Drafted, "{d:?}");
        assert_eq!(d.kept, 2, "what `accept` kept");
        assert!((d.p0 - 0.85).abs() < 1e-6, "the copy's prior: {d:?}");
        let d = decided(DrafterConfig { shared_sure: 0.9, ..dear() }, 0, &mut out);
        assert!(d.found > 0 && d.drafted == 0 && d.why == Why::Unsure, "{d:?}");
        let any = || DrafterConfig { shared_sure: 0.0, shared_fair: 0.0, ..dear() };
        let d = decided(DrafterConfig { shared_min_gain: 0.25, ..any() }, 0, &mut out);
        assert!(d.found > 0 && d.why == Why::Price, "it does not pay a margin of 25%: {d:?}");
        let sure = || DrafterConfig { class_prior: [0.99; N_CLASSES], shared_sure: 0.9, ..dear() };
        // Each slot deciding alone, a chain that no sure draft could make pay is not looked for; offered to a step
        // decided together, it is, and declined.
        let d = decided(DrafterConfig { shared_fair: 100.0, joint: false, ..sure() }, 0, &mut out);
        assert_eq!((d.found, d.why), (0, Why::FairOut), "no gain buys a hundred times what it adds: {d:?}");
        let d = decided(DrafterConfig { shared_fair: 100.0, ..sure() }, 0, &mut out);
        assert!(d.found > 0 && d.why == Why::Fair, "{d:?}");
        let d = decided(DrafterConfig { shared_fair: 0.0, shared_lag: 0.0, joint: false, ..sure() }, 0, &mut out);
        assert_eq!((d.found, d.why), (0, Why::FairOut), "no slack beside a request just begun: {d:?}");
        assert_eq!(decided(sure(), 3, &mut out).why, Why::Drafted);
    }

    #[test]
    fn a_draft_waits_while_a_request_beside_it_is_behind_plain_decoding() {
        // The sure copy of `a_shared_call_asks_its_own_gain`, beside a request on sequence 1 that drafts nothing and
        // has taken `plain` steps. At `shared_lag=0.1` that request may fall behind plain decoding by a tenth of its
        // steps: just begun, not at all; after 20 steps, by 1.9 plain steps (its first was its predecessor's).
        let prompt = repeats_a_passage();
        let (last, toks) = prompt.split_last().unwrap();
        let mut out = Vec::new();
        let sure = DrafterConfig { n_seq: 2, layout: Some(Layout::Unified), class_prior: [0.99; N_CLASSES], shared_sure: 0.9, gate: None, ..dear() };
        let drafted = |cfg: &DrafterConfig, plain: i32, out: &mut Vec<i32>| {
            let mut d = Drafter::new(None, cfg.clone());
            d.begin(0, toks);
            d.begin(1, &[50, 51]);
            let mut other = vec![50, 51];
            for i in 0..plain {
                d.propose(0, toks, *last, 0, 0, out);
                assert_eq!(d.propose(1, &other, 1000 + i, 15, 0, out), 0);
                other.push(1000 + i);
            }
            d.propose(0, toks, *last, 15, 0, out)
        };
        assert!(drafted(&sure, 0, &mut out) >= 2, "without the rule the copy is drafted at once: {out:?}");
        let owed = DrafterConfig { shared_lag: 0.1, ..sure.clone() };
        assert_eq!(drafted(&owed, 0, &mut out), 0, "{out:?}");
        assert_eq!(drafted(&owed, 2, &mut out), 0, "a step's slack of 0.1 pays for no drafted token: {out:?}");
        let later = drafted(&owed, 20, &mut out);
        assert!(later >= 2 && later <= drafted(&sure, 20, &mut out), "{later}: {out:?}");
    }

    #[test]
    fn a_request_just_begun_shares_the_step_before_it_proposes() {
        // The copy of `a_shared_call_asks_its_own_gain`, asked first in its step while a request has just begun on
        // sequence 1: the step is shared, and at a 25% margin the copy is not drafted; with no request begun there
        // it is drafted as alone.
        let prompt = repeats_a_passage();
        let (last, toks) = prompt.split_last().unwrap();
        let mut out = Vec::new();
        let cfg = DrafterConfig { n_seq: 2, layout: Some(Layout::Unified), shared_min_gain: 0.25, shared_sure: 0.0, shared_fair: 0.0, ..dear() };
        let drafted = |begun: bool, out: &mut Vec<i32>| {
            let mut d = Drafter::new(None, cfg.clone());
            d.begin(0, toks);
            d.propose(0, toks, *last, 0, 0, out);
            if begun {
                d.begin(1, &[50, 51]);
            }
            d.propose(0, toks, *last, 15, 1, out)
        };
        assert_eq!(drafted(true, &mut out), 0, "{out:?}");
        assert!(drafted(false, &mut out) >= 3, "{out:?}");
    }

    #[test]
    fn the_interval_holding_a_new_prompt_is_not_timed() {
        const MS: u64 = 1_000_000;
        // Sequence 0 alone at 10 ms a step, then both at 25 ms; then one interval of 125 ms (5 steps' worth, inside
        // what counts as a step at all) in which a request began on sequence 1 (`begin_late`) or not.
        // Counted as steps timed: the table itself is refitted only every few steps once warm.
        let beta = |begin_late: Option<bool>| {
            let mut d = Drafter::new(None, DrafterConfig { n_seq: 2, ..DrafterConfig::default() });
            let mut out = Vec::new();
            d.begin(0, &[1, 2]);
            let mut t = 0;
            for _ in 0..10 {
                d.propose(0, &[1, 2], 3, 0, t, &mut out);
                t += 10 * MS;
            }
            d.begin(1, &[1, 2]);
            for _ in 0..20 {
                d.propose(0, &[1, 2], 3, 0, t, &mut out);
                d.propose(1, &[1, 2], 3, 0, t, &mut out);
                t += 25 * MS;
            }
            if let Some(begin) = begin_late {
                if begin {
                    d.begin(1, &[4, 5]); // after the decode that evaluated its prompt
                }
                d.propose(0, &[1, 2], 3, 0, t + 100 * MS, &mut out);
            }
            d.beta.observations()
        };
        assert_eq!(beta(Some(false)), beta(None) + 1, "the long interval is timed when no prompt is in it");
        assert_eq!(beta(Some(true)), beta(None), "and not when it holds a prompt's decode");
    }

    #[test]
    fn records_rejections_and_uncovered_positions() {
        let mut d = Drafter::new(Some(index(vec![lit(&[1], 2, 5)])), eager(1));
        d.begin(0, &[5, 6, 7, 8]);
        let mut out = Vec::new();
        let mut toks = vec![5, 6, 7, 8];
        assert_eq!(d.propose(0, &toks, 1, 1, 0, &mut out), 1);
        assert_eq!(out, [2]);
        d.accept(0, 0); // the target disagrees: it produces 9 instead of 2
        toks.push(1);
        d.propose(0, &toks, 9, 1, 1, &mut out);
        let mut misses = Vec::new();
        d.drain_misses(&mut misses);
        assert_eq!(
            misses,
            [Miss {
                kind: MissKind::Rejected,
                context: vec![5, 6, 7, 8, 1],
                token: 9
            }]
        );
        toks.push(9);
        assert_eq!(d.propose(0, &toks, 11, 1, 2, &mut out), 0, "9 11 has no match, not even of one token");
        toks.push(11);
        // Uncovered: no recipe after "9 11 6", n-grams say 7 (after "6"), and the target does produce 7.
        assert_eq!(d.propose(0, &toks, 6, 1, 3, &mut out), 1);
        assert_eq!(out, [7]);
        d.accept(0, 1);
        toks.extend([6, 7]);
        d.propose(0, &toks, 3, 1, 4, &mut out);
        d.drain_misses(&mut misses);
        assert_eq!(misses.len(), 2);
        assert_eq!(
            misses[1],
            Miss {
                kind: MissKind::Uncovered,
                context: vec![5, 6, 7, 8, 1, 9, 11, 6],
                token: 7
            }
        );
        assert_eq!(d.stats(0).unwrap().misses_recorded, 2);
    }

    #[test]
    fn a_one_token_copy_drafts_where_nothing_else_does_and_gives_way_to_a_recipe() {
        // The history ends in `9 5`: only `5` occurred before (followed by 6).
        let hist = [5, 6, 7, 8, 9];
        let mut out = Vec::new();
        let mut d = Drafter::new(None, eager(1));
        d.begin(0, &hist[..4]);
        assert_eq!(d.propose(0, &hist, 5, 1, 0, &mut out), 1);
        assert_eq!(out, [6]);
        let mut d = Drafter::new(None, DrafterConfig { ctx_min_n: 2, ..eager(1) });
        d.begin(0, &hist[..4]);
        assert_eq!(d.propose(0, &hist, 5, 1, 0, &mut out), 0, "no copy of fewer than ctx_min_n tokens");
        // A recipe after `5` proposes 2: it is drafted, not the copy.
        let mut d = Drafter::new(Some(index(vec![lit(&[5], 2, 5)])), eager(1));
        d.begin(0, &hist[..4]);
        assert_eq!(d.propose(0, &hist, 5, 1, 0, &mut out), 1);
        assert_eq!(out, [2]);
    }

    #[test]
    fn miss_buffer_is_bounded() {
        let cfg = DrafterConfig {
            miss_capacity: 1,
            context: Context::Off,
            ..eager(1)
        };
        let mut d = Drafter::new(Some(index(vec![lit(&[1], 2, 5)])), cfg);
        d.begin(0, &[]);
        let mut out = Vec::new();
        let mut toks = vec![];
        for step in 0..3u64 {
            d.propose(0, &toks, 1, 1, step, &mut out);
            d.accept(0, 0);
            toks.extend([1, 1]); // the target says 1 where 2 was drafted
            d.propose(0, &toks[..toks.len() - 1], 1, 0, step, &mut out);
        }
        let st = d.global_stats();
        assert_eq!((st.misses_recorded, st.misses_dropped), (1, 2));
    }

    /// A target that continues `t` with `next(t)`, each step costing `cost[verified]` ms.
    struct Sim {
        toks: Vec<i32>,
        last: i32,
        now: u64,
        out: Vec<i32>,
    }

    impl Sim {
        fn step(
            &mut self,
            d: &mut Drafter,
            next: impl Fn(i32) -> i32,
            cost_ms: impl Fn(usize) -> u64,
        ) -> usize {
            let g = d.propose(0, &self.toks, self.last, 4, self.now, &mut self.out);
            self.toks.push(self.last);
            let mut acc = 0;
            for &t in &self.out {
                if t != next(*self.toks.last().unwrap()) {
                    break;
                }
                self.toks.push(t);
                acc += 1;
            }
            d.accept(0, acc);
            self.last = next(*self.toks.last().unwrap());
            self.now += cost_ms(g + 1) * 1_000_000;
            g
        }
    }

    #[test]
    fn control_switches_off_when_it_loses_and_back_on_after_probes() {
        // The pack predicts t → t + 1 for every token, confidently.
        let entries = (0..10)
            .map(|t| lit(&[t], ((t + 1) % 10) as u32, 5))
            .collect();
        // The request's own text repeats, so copies of it would be right: this test is about the pack alone,
        // and the control alone (no gate).
        let cfg = DrafterConfig {
            probe_every: 4,
            context: Context::Off,
            gate: None,
            ..DrafterConfig::default()
        };
        let mut d = Drafter::new(Some(index(entries)), cfg);
        d.begin(0, &[0]);
        let mut sim = Sim {
            toks: vec![0],
            last: 1,
            now: 0,
            out: Vec::new(),
        };
        let cost = |m: usize| [0, 50, 80, 110, 145, 195][m.min(5)];
        // Phase 1: the target goes t → t + 2, so every draft is rejected.
        let drafting_steps = (0..40)
            .filter(|_| sim.step(&mut d, |t| (t + 2) % 10, cost) > 0)
            .count();
        let st = d.stats(0).unwrap();
        assert!(st.steps_off >= 25, "drafting switched off: {st:?}");
        assert!(st.probes >= 3, "and probed while off: {st:?}");
        assert!(
            drafting_steps <= 14,
            "few drafts while losing: {drafting_steps}"
        );
        assert!(st.alpha < 0.3, "{st:?}");
        // The learned β stays near the measured 1.6 for two tokens.
        assert!((st.beta[1] - 1.6).abs() < 0.1, "{:?}", st.beta);
        // Phase 2: the target now agrees with the pack; probes find it out.
        let off_before = st.steps_off;
        let mut on_streak = 0;
        for _ in 0..200 {
            on_streak = if sim.step(&mut d, |t| (t + 1) % 10, cost) > 0 {
                on_streak + 1
            } else {
                0
            };
            if on_streak == 10 {
                break;
            }
        }
        assert_eq!(on_streak, 10, "drafting back on for good");
        let st = d.stats(0).unwrap();
        assert!(st.steps_off > off_before && st.alpha > 0.8, "{st:?}");
    }

    #[test]
    fn control_stays_off_when_verification_is_too_expensive() {
        let entries = (0..10)
            .map(|t| lit(&[t], ((t + 1) % 10) as u32, 5))
            .collect();
        let mut d = Drafter::new(
            Some(index(entries)),
            DrafterConfig {
                probe_every: 4,
                gate: None,
                ..DrafterConfig::default()
            },
        );
        d.begin(0, &[0]);
        let mut sim = Sim {
            toks: vec![0],
            last: 1,
            now: 0,
            out: Vec::new(),
        };
        // Every draft is right, but verifying 2 tokens costs 3 plain steps: never worth it.
        let cost = |m: usize| if m == 1 { 50 } else { 150 * m as u64 / 2 };
        let drafted: Vec<usize> = (0..100)
            .map(|_| sim.step(&mut d, |t| (t + 1) % 10, cost))
            .collect();
        let late = drafted[50..].iter().filter(|&&g| g > 0).count();
        assert!(
            late <= 14,
            "only probes after learning β: {late} drafting steps of 50"
        );
        let st = d.stats(0).unwrap();
        let prior = BetaModel::new(DEFAULT_BETA_PRIOR);
        assert!((1..=4).all(|g| f64::from(st.beta[g]) > prior.beta(g + 1)), "verification measured dearer than the prior: {st:?}");
        assert!(st.alpha > 0.9, "{st:?}");
    }

    #[test]
    fn the_gate_counts_plain_steps() {
        let alone = Drafter::new(None, DrafterConfig::default());
        assert_eq!(alone.gate().map(Gate::clock), Some(Clock::PlainSteps), "a sequence alone as well");
        // llama-server's steps and vLLM's alike.
        for layout in [None, Some(Layout::OnePass)] {
            let cfg = DrafterConfig { n_seq: 4, context: Context::Off, layout, ..DrafterConfig::default() };
            a_gate_in_plain_steps_reads_one_token_a_slot_whatever_the_occupancy(cfg);
        }
    }

    /// Four slots, two of them generating only every other stretch of 20 steps, nothing to draft: a step of n slots
    /// takes 30 + 12 n ms. In tokens per second the windows would read 51 or 37; in plain steps of their own slots,
    /// as the gate measures them, one token a slot either way.
    fn a_gate_in_plain_steps_reads_one_token_a_slot_whatever_the_occupancy(cfg: DrafterConfig) {
        let mut d = Drafter::new(None, cfg);
        let mut toks: Vec<Vec<i32>> = (0..4).map(|_| vec![1, 2, 3]).collect();
        for (s, t) in toks.iter().enumerate() {
            d.begin(s, t);
        }
        let (mut now, mut out) = (0u64, Vec::new());
        for step in 0..2000u64 {
            let n = if (step / 20) % 2 == 0 { 4 } else { 2 };
            for (s, t) in toks.iter_mut().enumerate().take(n) {
                let id = 10 + ((step * 7 + s as u64) % 50) as i32;
                d.propose(s, t, id, 8, now, &mut out);
                t.push(id);
                now += 20_000;
                d.end_propose(s, now);
            }
            now += (30 + 12 * n as u64) * 1_000_000;
        }
        let g = d.gate().unwrap();
        assert_eq!(g.clock(), Clock::PlainSteps);
        for r in g.rates().into_iter().flatten() {
            assert!((r - 1.0).abs() < 0.05, "{:?}", g.rates());
        }
        assert!(g.ran[0] + g.ran[1] >= 10, "{:?}", g.ran);
    }

    /// A drafter of four slots with no pack, no copies and no gate, each slot's request begun on the same prompt.
    fn four_slots_with_nothing_to_draft() -> (Drafter, Vec<Vec<i32>>) {
        let mut d = Drafter::new(None, DrafterConfig { n_seq: 4, context: Context::Off, gate: None, ..DrafterConfig::default() });
        let toks: Vec<Vec<i32>> = (0..4).map(|_| vec![1, 2, 3]).collect();
        for (s, t) in toks.iter().enumerate() {
            d.begin(s, t);
        }
        (d, toks)
    }

    #[test]
    fn each_step_is_timed_once_whatever_the_slots() {
        // Four slots with nothing to draft, 100 steps. Timed by every slot's call, a slow step counted four times,
        // and two of them moved the fit of several-pass steps as eight would (session 73).
        let (mut d, mut toks) = four_slots_with_nothing_to_draft();
        let (mut now, mut out) = (0u64, Vec::new());
        for step in 0..100u64 {
            for (s, t) in toks.iter_mut().enumerate() {
                let id = 10 + ((step * 7 + s as u64) % 50) as i32;
                d.propose(s, t, id, 8, now + s as u64 * 50_000, &mut out);
                t.push(id);
            }
            now += 78_000_000;
        }
        // The first step has no interval before it (its requests' prompts were just decoded).
        assert_eq!(d.beta.observations(), 99);
    }

    #[test]
    fn a_step_in_which_a_request_ended_does_not_price_the_others() {
        // Four slots with nothing to draft; a step of n slots at one token takes 30 + 12 n ms. Every 10th step
        // slot 3's request has ended: the server answers it beside the other three's decode (+70 ms, as requests
        // ending took at `-np 4`); its next request comes a step later, and the step after evaluates its prompt
        // (+500 ms). Timed, the steps in which a request ended would read 136 ms against 78 for four slots, and the
        // table, kept non-decreasing, would price every plain step of four slots at them.
        let (mut d, mut toks) = four_slots_with_nothing_to_draft();
        let (mut now, mut out) = (0u64, Vec::new());
        for step in 0..400u64 {
            let n = if step % 10 >= 7 { 3 } else { 4 };
            if step % 10 == 0 && step > 0 {
                toks[3] = vec![1, 2, 3];
                d.begin(3, &toks[3]);
            }
            for (s, t) in toks.iter_mut().enumerate().take(n) {
                let id = 10 + ((step * 7 + s as u64) % 50) as i32;
                d.propose(s, t, id, 8, now, &mut out);
                t.push(id);
            }
            let extra = match step % 10 {
                7 => 70,  // slot 3's request ended: answered
                9 => 500, // its next request's prompt
                _ => 0,
            };
            now += (30 + 12 * n as u64 + extra) * 1_000_000;
        }
        let four = d.beta.step_ns(4, |_| 1).unwrap() / 1e6;
        assert!((four - 78.0).abs() < 4.0, "a plain step of four slots priced {four:.1} ms for 78: {:?}", d.beta.table());
    }

    /// Four slots for 1,500 steps, then slot 0 alone for 300: the steps in which slot 0 drafted alone. The pack
    /// predicts t → t + 1 and the target agrees every other step (then with the whole draft); the control drafts
    /// whatever it finds (no margin, floor or fairness rule), so that the gate decides. Beside other slots each
    /// drafted token adds 15 ms to a step of 30 + 12 n: drafting loses. Alone it adds 1 ms: drafting pays.
    fn drafted_alone_after_losing_beside_others(gates_apart: bool) -> (usize, Drafter) {
        let entries = (0..10).map(|t| lit(&[t], ((t + 1) % 10) as u32, 5)).collect();
        let gate = Some(GateConfig { apart: gates_apart, ..GateConfig::default() });
        let cfg = DrafterConfig {
            n_seq: 4,
            context: Context::Off,
            min_gain: -0.5,
            shared_min_gain: -0.5,
            shared_sure: 0.0,
            shared_fair: 0.0,
            probe_every: 1,
            gate,
            ..DrafterConfig::default()
        };
        let mut d = Drafter::new(Some(index(entries)), cfg);
        let mut toks: Vec<Vec<i32>> = (0..4).map(|_| vec![0]).collect();
        let mut last = [1i32; 4];
        for (s, t) in toks.iter().enumerate() {
            d.begin(s, t);
        }
        let (mut now, mut out, mut drafted_alone) = (0u64, Vec::new(), 0);
        let mut drafts: Vec<Vec<i32>> = vec![Vec::new(); 4];
        for step in 0..1800u64 {
            let n = if step < 1500 { 4 } else { 1 };
            let inc = 1 + (step % 2) as i32;
            for s in 0..n {
                d.propose(s, &toks[s], last[s], 4, now + s as u64 * 10_000, &mut out);
                drafts[s].clone_from(&out);
                toks[s].push(last[s]);
            }
            let drafted: usize = drafts[..n].iter().map(Vec::len).sum();
            drafted_alone += usize::from(n == 1 && drafted > 0);
            now += (30 + 12 * n as u64 + if n > 1 { 15 } else { 1 } * drafted as u64) * 1_000_000;
            for s in 0..n {
                let mut kept = 0;
                for &t in &drafts[s] {
                    if t != (toks[s].last().unwrap() + inc) % 10 {
                        break;
                    }
                    toks[s].push(t);
                    kept += 1;
                }
                d.accept(s, kept);
                last[s] = (toks[s].last().unwrap() + inc) % 10;
            }
        }
        (drafted_alone, d)
    }

    #[test]
    fn a_slot_left_alone_drafts_where_drafting_beside_others_was_switched_off() {
        let (apart, d) = drafted_alone_after_losing_beside_others(true);
        let (alone, shared) = d.gates().unwrap().regimes();
        let shared = shared.unwrap();
        assert!(shared.ran[1] > 3 * shared.ran[0], "beside others mostly off: {:?}", shared.ran);
        assert!(apart > 240, "alone it drafted in {apart} of 300 steps: {:?} {:?}", alone.ran, alone.rates());
        // One gate for both takes the choice made beside others into the steps alone.
        let (one, _) = drafted_alone_after_losing_beside_others(false);
        assert!(one < apart / 2, "one gate: drafted alone in {one} of 300 steps, apart {apart}");
    }

    #[test]
    fn the_gate_switches_off_drafting_the_control_misjudges() {
        // A control told to draft even at a 50% loss (its estimates are wrong, as served β at several slots
        // was): the pack predicts t → t + 1, the target agrees every other step, verify costs as much per
        // token as a plain step. Drafting then yields 1.5 tokens per two steps' time; the gate measures it.
        let entries = (0..10).map(|t| lit(&[t], ((t + 1) % 10) as u32, 5)).collect();
        let cfg = DrafterConfig { context: Context::Off, min_gain: -0.5, probe_every: 1, ..DrafterConfig::default() };
        let mut d = Drafter::new(Some(index(entries)), cfg);
        d.begin(0, &[0]);
        let mut sim = Sim { toks: vec![0], last: 1, now: 0, out: Vec::new() };
        let mut flip = false;
        for _ in 0..2000 {
            flip = !flip;
            let step = if flip { 1 } else { 2 };
            sim.step(&mut d, |t| (t + step) % 10, |m| 10 * m as u64);
        }
        let st = d.global_stats();
        let gate = d.gate().unwrap();
        assert!(gate.rates()[1].unwrap() > gate.rates()[0].unwrap(), "{:?}", gate.rates());
        assert!(gate.ran[1] > 3 * gate.ran[0], "mostly off: {:?}", gate.ran);
        assert!(st.steps_gated > st.calls / 2, "{st:?}");
        assert!(gate.ran[0] >= 2, "and re-measured now and then: {:?}", gate.ran);
    }
}
