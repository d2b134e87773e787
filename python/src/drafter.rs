//! `Drafter`: the engine of the llama.cpp plugin (pack lookup, copies of the request, break-even control, miss
//! log) driven per sequence from Python: begin, propose (one sequence or a batch in one call), accept.
//! The GIL is released around the engine's work; a mutex keeps one caller in the engine at a time.

use crate::error::{engine_error, KolmRsdError};
use crate::tokens::{token_ids, token_texts, views};
use kolm_rsd::draft::step::Layout;
use kolm_rsd::draft::{Context, DrafterConfig};
use kolm_rsd::engine::{Counters, Engine, EngineConfig, LiveChoice, MISS_LOG_CAP, SHARED_GAIN_RANGE, SHARED_SURE_RANGE};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

const MAX_DRAFT: usize = kolm_rsd::draft::step::INVARIANT_DRAFT;

/// `value` if given and within `range`, else `default` when not given, else a ValueError naming both.
fn in_range<T: PartialOrd + std::fmt::Display>(name: &str, value: Option<T>, default: T, range: &RangeInclusive<T>) -> PyResult<T> {
    match value {
        None => Ok(default),
        Some(v) if range.contains(&v) => Ok(v),
        Some(v) => Err(PyValueError::new_err(format!("{name}={v} is not a number in {}..={}", range.start(), range.end()))),
    }
}

/// A drafter for `n_seq` concurrent sequences of one tokenizer, with an optional recipe pack.
#[pyclass(frozen, module = "kolm_rsd")]
pub struct Drafter {
    engine: Mutex<Engine>,
    n_seq: usize,
}

impl Drafter {
    fn engine(&self) -> PyResult<MutexGuard<'_, Engine>> {
        self.engine.lock().map_err(|_| KolmRsdError::new_err("the drafter is unusable after an internal panic"))
    }

    fn seq(&self, seq: i64) -> PyResult<usize> {
        usize::try_from(seq)
            .ok()
            .filter(|&s| s < self.n_seq)
            .ok_or_else(|| PyValueError::new_err(format!("sequence {seq} out of range 0..{}", self.n_seq)))
    }

    fn wrap(engine: Engine) -> Drafter {
        Drafter { n_seq: engine.n_seq(), engine: Mutex::new(engine) }
    }
}

#[pymethods]
impl Drafter {
    /// A drafter for the tokenizer whose raw token texts (`convert_ids_to_tokens` of a Hugging Face tokenizer,
    /// as bytes or str) are `token_texts`, in id order. `control_tokens`: ids a copy of the prompt must never
    /// propose (chat-template markers, end of turn). `pack` is checked against the texts' fingerprint.
    #[new]
    #[pyo3(signature = (token_texts, *, pack=None, control_tokens=None, n_seq=1, n_max=MAX_DRAFT, adaptive=true, shared_gain=None, shared_sure=None, one_pass=false, context=true, live=true, miss_log=None, miss_log_cap=MISS_LOG_CAP, step_log=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        token_texts: &Bound<'_, PyAny>,
        pack: Option<PathBuf>,
        control_tokens: Option<Vec<i32>>,
        n_seq: usize,
        n_max: usize,
        adaptive: bool,
        shared_gain: Option<f64>,
        shared_sure: Option<f32>,
        one_pass: bool,
        context: bool,
        live: bool,
        miss_log: Option<PathBuf>,
        miss_log_cap: u64,
        step_log: Option<PathBuf>,
    ) -> PyResult<Drafter> {
        if n_seq == 0 {
            return Err(PyValueError::new_err("n_seq must be at least 1"));
        }
        // Shared steps follow the one-pass engines' rule (vLLM's) unless the caller names a margin or a floor.
        let rule = DrafterConfig::default().one_pass_shared();
        let shared_gain = in_range("shared_gain", shared_gain, rule.shared_min_gain, &SHARED_GAIN_RANGE)?;
        let shared_sure = in_range("shared_sure", shared_sure, rule.shared_sure, &SHARED_SURE_RANGE)?;
        let texts = self::token_texts(token_texts)?;
        let control: HashSet<i32> = control_tokens.unwrap_or_default().into_iter().collect();
        let live = if live { LiveChoice::Memory } else { LiveChoice::Off };
        let layout = one_pass.then_some(Layout::OnePass);
        let cfg = EngineConfig { n_seq, n_max, adaptive, shared_gain, shared_sure, shared_fair: rule.shared_fair, layout, context: if context { Context::All } else { Context::Off }, live, pack, miss_log, miss_log_cap, step_log, ..EngineConfig::default() };
        let engine = py.detach(|| Engine::from_texts(&views(&texts), |t| control.contains(&t), cfg)).map_err(engine_error)?;
        Ok(Drafter::wrap(engine))
    }

    /// The plugin's drafter for a GGUF model, read by llama.cpp: `arg` is `--spec-plugin-arg` (the pack beside
    /// the model unless `pack=`, the default miss log unless `misslog=`, `draft=`, …).
    #[staticmethod]
    #[pyo3(signature = (model, arg="", n_seq=1))]
    fn from_gguf(py: Python<'_>, model: PathBuf, arg: &str, n_seq: usize) -> PyResult<Drafter> {
        if n_seq == 0 {
            return Err(PyValueError::new_err("n_seq must be at least 1"));
        }
        let engine = py.detach(|| {
            let mut cfg = EngineConfig::from_plugin_arg(arg, &model.to_string_lossy()).map_err(engine_error)?;
            cfg.n_seq = n_seq;
            let m = crate::vocab::load_gguf(&model).map_err(|e| KolmRsdError::new_err(e.to_string()))?;
            Engine::new(&m, cfg).map_err(engine_error)
        })?;
        Ok(Drafter::wrap(engine))
    }

    /// Number of sequences; ids are `0..n_seq`.
    #[getter]
    fn n_seq(&self) -> usize {
        self.n_seq
    }

    /// A new request starts on `seq` with this prompt (token ids, or the bytes of an int32 array).
    fn begin(&self, py: Python<'_>, seq: i64, prompt: &Bound<'_, PyAny>) -> PyResult<()> {
        let (s, prompt) = (self.seq(seq)?, token_ids(prompt)?);
        py.detach(|| {
            self.engine()?.begin(s, &prompt);
            Ok(())
        })
    }

    /// The step that just ended also evaluated part of a prompt (vLLM's chunked prefill, before the request's
    /// first token and so its `begin`): no sequence times that step as verify cost.
    fn prompt_decoded(&self) -> PyResult<()> {
        self.engine()?.prompt_decoded();
        Ok(())
    }

    /// The request begun on `seq` comes with a predicted output (OpenAI's `prediction`): a text to copy from.
    fn predict(&self, py: Python<'_>, seq: i64, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let (s, tokens) = (self.seq(seq)?, token_ids(tokens)?);
        py.detach(|| {
            self.engine()?.predict(s, &tokens);
            Ok(())
        })
    }

    /// Up to `n_max` draft tokens to follow `tokens` (prompt and output so far) and `id_last`, the token just
    /// sampled (not in `tokens`). An empty list: drafting does not pay here now.
    #[pyo3(signature = (seq, tokens, id_last, n_max=MAX_DRAFT))]
    fn propose(&self, py: Python<'_>, seq: i64, tokens: &Bound<'_, PyAny>, id_last: i32, n_max: usize) -> PyResult<Vec<i32>> {
        let (s, tokens) = (self.seq(seq)?, token_ids(tokens)?);
        py.detach(|| {
            let mut out = Vec::new();
            self.engine()?.propose(s, &tokens, id_last, n_max, &mut out);
            Ok(out)
        })
    }

    /// `propose` for many sequences in one call (one step of a batch): `requests` holds `(seq, tokens, id_last)`,
    /// in any order of sequences, as the call marks the step.
    #[pyo3(signature = (requests, n_max=MAX_DRAFT))]
    fn propose_batch(&self, py: Python<'_>, requests: &Bound<'_, PyAny>, n_max: usize) -> PyResult<Vec<Vec<i32>>> {
        let reqs = requests
            .try_iter()?
            .map(|r| {
                let (seq, tokens, id_last): (i64, Bound<'_, PyAny>, i32) = r?.extract()?;
                Ok((self.seq(seq)?, token_ids(&tokens)?, id_last))
            })
            .collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            let mut engine = self.engine()?;
            engine.start_step();
            Ok(reqs
                .iter()
                .map(|(s, tokens, id_last)| {
                    let mut out = Vec::new();
                    engine.propose(*s, tokens, *id_last, n_max, &mut out);
                    out
                })
                .collect())
        })
    }

    /// The target kept the first `n_accepted` tokens of the last draft proposed for `seq`.
    fn accept(&self, seq: i64, n_accepted: usize) -> PyResult<()> {
        let s = self.seq(seq)?;
        self.engine()?.accept(s, n_accepted);
        Ok(())
    }

    /// After `context` the target produced `token`, which nothing predicted: logged for the next compile.
    fn observe_miss(&self, context: &Bound<'_, PyAny>, token: i32) -> PyResult<()> {
        let context = token_ids(context)?;
        self.engine()?.observe_miss(&context, token);
        Ok(())
    }

    /// Writes the misses collected so far to the miss log (also done at each `begin` and when dropped).
    fn flush_misses(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            self.engine()?.flush_misses();
            Ok(())
        })
    }

    /// Counters since the drafter was made, over all sequences.
    fn stats(&self) -> PyResult<Stats> {
        Ok(Stats(self.engine()?.counters()))
    }

    /// One line on what the drafter was set up with (pack, sequences, miss log).
    fn describe(&self) -> PyResult<String> {
        Ok(self.engine()?.describe())
    }

    /// One line on what drafting did (the plugin's shutdown line): acceptance, hits, the gate, β.
    fn summary(&self) -> PyResult<String> {
        Ok(self.engine()?.summary())
    }

    fn __repr__(&self) -> PyResult<String> {
        Ok(format!("Drafter({})", self.describe()?))
    }
}

/// What a drafter did since it was made (what the C API's `kolm_rsd_stats` reports).
#[pyclass(frozen, module = "kolm_rsd")]
pub struct Stats(Counters);

#[pymethods]
impl Stats {
    #[getter]
    fn propose_calls(&self) -> u64 {
        self.0.draft.calls
    }
    /// Calls that proposed at least one token.
    #[getter]
    fn drafts(&self) -> u64 {
        self.0.draft.drafts
    }
    #[getter]
    fn tokens_drafted(&self) -> u64 {
        self.0.draft.tokens_drafted
    }
    #[getter]
    fn tokens_accepted(&self) -> u64 {
        self.0.draft.tokens_accepted
    }
    /// Drafted tokens that came from the recipe pack (literal or shape recipes).
    #[getter]
    fn pack_hits(&self) -> u64 {
        self.0.pack_hits()
    }
    /// Drafted tokens copied from the request's own text.
    #[getter]
    fn context_hits(&self) -> u64 {
        self.0.draft.context_hits
    }
    /// Steps on which the break-even control held drafting off.
    #[getter]
    fn steps_off(&self) -> u64 {
        self.0.draft.steps_off
    }
    #[getter]
    fn misses_logged(&self) -> u64 {
        self.0.misses_logged
    }
    /// Recipes in the loaded pack (0 without one).
    #[getter]
    fn pack_entries(&self) -> u64 {
        self.0.pack_entries
    }
    /// Accepted over drafted tokens (0 when nothing was drafted).
    #[getter]
    fn acceptance(&self) -> f64 {
        self.0.draft.tokens_accepted as f64 / self.0.draft.tokens_drafted.max(1) as f64
    }
    fn __repr__(&self) -> String {
        let s = &self.0.draft;
        format!(
            "Stats(propose_calls={}, drafts={}, tokens_drafted={}, tokens_accepted={}, pack_hits={}, context_hits={}, steps_off={}, misses_logged={}, pack_entries={})",
            s.calls,
            s.drafts,
            s.tokens_drafted,
            s.tokens_accepted,
            self.0.pack_hits(),
            s.context_hits,
            s.steps_off,
            self.0.misses_logged,
            self.0.pack_entries
        )
    }
}
