//! What the C API and the plugin drive: a target model's vocabulary shapes, its recipe pack (found beside
//! the GGUF or named), the combined drafter with break-even control, and the local miss log.

mod live;
mod steplog;

pub use live::default_live_path;
pub use steplog::HEADER as STEP_LOG_HEADER;

use crate::draft::model::{ModelDraftConfig, ModelDrafter};
use crate::draft::syntax::TokenTexts;
use crate::draft::gate::{Clock, Gate, GateConfig};
use crate::draft::gates::Gates;
use crate::draft::step::Layout;
use crate::draft::{Context, Drafter, DrafterConfig, Miss, Stats, TokenSource};
use crate::head::HeadDevice;
use crate::index::Index;
use crate::live::{Live, LiveConfig};
use crate::vocab::{drafter_texts, fingerprint, token_texts};
use crate::llama::{Model, Token};
use crate::misslog::MissLog;
use crate::pack::{tokenizer_fingerprint, ModelInfo, Pack};
use crate::shape::ShapeTable;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Miss logs stop growing at this size; they feed the next compile, not an archive.
pub const MISS_LOG_CAP: u64 = 16 << 20;

/// The margins `shared_gain` may take (0: none; 10: a draft must promise 11 plain steps, so never drafts).
pub const SHARED_GAIN_RANGE: std::ops::RangeInclusive<f64> = 0.0..=10.0;

/// The rates `shared_fair` may take (0: none; 10: a shared draft must gain the step ten times what it adds to it
/// for each other request in the step).
pub const SHARED_FAIR_RANGE: std::ops::RangeInclusive<f64> = 0.0..=10.0;

/// The shares `shared_lag` may take (0: no request may fall behind plain decoding for another's draft; `off`: no
/// limit).
pub const SHARED_LAG_RANGE: std::ops::RangeInclusive<f64> = 0.0..=10.0;

/// The acceptances `shared_sure` may take (0: any token that pays is drafted beside other slots).
pub const SHARED_SURE_RANGE: std::ops::RangeInclusive<f32> = 0.0..=1.0;

/// `key=v` of `--spec-plugin-arg` read as a number within `range`, or an error naming both (`0..=10`, as written).
fn number_in<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    key: &str,
    v: &str,
    range: &std::ops::RangeInclusive<T>,
) -> Result<T, EngineError> {
    v.parse().ok().filter(|x| range.contains(x)).ok_or_else(|| {
        EngineError::Arg(format!("--spec-plugin-arg: {key}={v} is not a number in {}..={}", range.start(), range.end()))
    })
}

/// How an engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub n_seq: usize,
    pub n_max: usize,
    pub adaptive: bool,
    /// Gain over a plain step a draft must promise when other slots share the verify call
    /// ([`DrafterConfig::shared_min_gain`]; `shared_gain=`).
    pub shared_gain: f64,
    /// Least estimated acceptance of a token drafted beside other slots ([`DrafterConfig::shared_sure`]; `shared_sure=`).
    pub shared_sure: f32,
    /// Least throughput gain per unit of time a draft adds to a step it shares, per other request in the step
    /// ([`DrafterConfig::shared_fair`]; `shared_fair=`).
    pub shared_fair: f64,
    /// Most a request may fall behind plain decoding for other slots' drafts, as a share of its steps
    /// ([`DrafterConfig::shared_lag`]; `shared_lag=`, infinite: `off`).
    pub shared_lag: f64,
    /// Whether a step's drafts are decided together ([`DrafterConfig::joint`]; `step=joint|slot`).
    pub joint: bool,
    /// How llama-server cuts a step into forward passes (`kv=auto|split|unified`; auto: learned from step times).
    pub layout: Option<Layout>,
    /// The recipe pack; None = context n-grams only.
    pub pack: Option<PathBuf>,
    /// Where misses go (JSON lines); None = not logged.
    pub miss_log: Option<PathBuf>,
    /// The miss log stops growing at this size.
    pub miss_log_cap: u64,
    /// Also draft from the request itself: copies of its text (prompt + history), the keys its prompt lists.
    pub context: Context,
    /// A draft model (same tokenizer as the target) consulted where the pack and n-grams have nothing.
    pub draft: Option<DraftChoice>,
    /// KV cells and threads of the draft model's context (the plugin copies the target's).
    pub n_ctx: u32,
    pub n_threads: i32,
    /// The live index of what the target answered while serving, and where it is kept.
    pub live: LiveChoice,
    /// Its size, in entries.
    pub live_cap: usize,
    /// Where a line per server step goes (`steplog=PATH`), to compare steps' cost in place with their price.
    pub step_log: Option<PathBuf>,
    /// The measured on/off gate over the control (`gate=off` drops it), and its clock (`gate=wall|steps`; None:
    /// the gate's own, [`GateConfig::clock`]).
    pub gate: bool,
    pub gate_clock: Option<Clock>,
    /// The fewest server steps a gate window spans (`gate_steps=N`; [`GateConfig::min_steps`]).
    pub gate_steps: u32,
    /// A gate for steps a slot has alone and one for shared steps (`gates=2`), or one for both (`gates=1`).
    pub gates_apart: bool,
    /// Not drafting taken as a slot's token per plain step until re-checked (`gate_off=one`), or measured in the
    /// window after the first drafting one (`gate_off=measure`; [`GateConfig::off_one`]).
    pub gate_off_one: bool,
    /// A plain step priced at the cells its slots hold (`gate_unit=context`), or at the mean of recent plain steps
    /// of as many slots (`gate_unit=mean`; [`GateConfig::by_context`]).
    pub gate_by_context: bool,
}

/// Whether an engine learns from what it serves, and where that is kept across restarts.
#[derive(Clone, Debug, PartialEq)]
pub enum LiveChoice {
    Off,
    /// Learned while running, forgotten at exit.
    Memory,
    /// Loaded from and saved to this file.
    File(PathBuf),
}

/// The draft model and the head it scores with.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftChoice {
    pub model: PathBuf,
    /// None: the full vocabulary.
    pub shortlist: Option<PathBuf>,
    /// Margin under which the full head is scored (0 = never).
    pub margin: f32,
    /// Also score the request's own ids that the shortlist lacks.
    pub request_rows: bool,
    /// Where its heads run (`head_dev=`).
    pub head_device: HeadDevice,
}

/// Default margin fallback: a subset top-1 − top-2 logit margin below this scores the full head.
pub const DEFAULT_MARGIN: f32 = 1.0;

/// The draft model's heads go where its layers go: the plugin offloads every layer to the GPU llama.cpp
/// picks (a GPU, else an integrated GPU), and `best` picks the same, else the CPU. A head left on the CPU
/// beside layers on a GPU would cost a CPU GEMM of the shortlist's rows every step.
pub const DEFAULT_HEAD_DEVICE: HeadDevice = HeadDevice::Best;

/// `draft.gguf` → `draft.shortlist.json` beside it.
pub fn shortlist_beside(model_path: &Path) -> PathBuf {
    beside(model_path, "shortlist.json")
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_seq: 1,
            n_max: crate::draft::step::INVARIANT_DRAFT,
            adaptive: true,
            shared_gain: DrafterConfig::default().shared_min_gain,
            shared_sure: DrafterConfig::default().shared_sure,
            shared_fair: DrafterConfig::default().shared_fair,
            shared_lag: DrafterConfig::default().shared_lag,
            joint: DrafterConfig::default().joint,
            layout: None,
            pack: None,
            miss_log: None,
            miss_log_cap: MISS_LOG_CAP,
            context: Context::All,
            draft: None,
            n_ctx: 4096,
            n_threads: 0,
            live: LiveChoice::Memory,
            live_cap: crate::live::DEFAULT_CAPACITY,
            step_log: None,
            gate: true,
            gate_clock: None,
            gate_steps: GateConfig::default().min_steps,
            gates_apart: GateConfig::default().apart,
            gate_off_one: GateConfig::default().off_one,
            gate_by_context: GateConfig::default().by_context,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Pack(#[from] crate::pack::PackError),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Arg(String),
    #[error(transparent)]
    Draft(#[from] crate::draft::model::ModelDraftError),
}

/// `model.gguf` → `model.recipes.json` beside it.
pub fn pack_beside(model_path: &Path) -> PathBuf {
    beside(model_path, "recipes.json")
}

/// `dir/name.gguf` → `dir/name.EXT`.
fn beside(model_path: &Path, ext: &str) -> PathBuf {
    let stem = model_path.file_stem().unwrap_or_default().to_string_lossy();
    let stem = stem.strip_suffix(".gguf").unwrap_or(&stem).to_string();
    model_path.with_file_name(format!("{stem}.{ext}"))
}

/// `~/.cache/kolm-rsd/misses/<model stem>.jsonl`: misses stay on this machine.
pub fn default_miss_log(model_path: &Path) -> PathBuf {
    in_cache(model_path, "misses", "jsonl")
}

/// `~/.cache/kolm-rsd/<dir>/<model stem>.<ext>`: what the engine learns from serving stays on this machine.
fn in_cache(model_path: &Path, dir: &str, ext: &str) -> PathBuf {
    let stem = model_path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    crate::fetch::cache_dir().join(dir).join(format!("{stem}.{ext}"))
}

impl EngineConfig {
    /// The longest draft the engine ever proposes, whatever the host allows.
    pub fn n_max_cap(&self) -> usize {
        crate::draft::step::INVARIANT_DRAFT
    }

    /// The drafter's settings these make: what the plugin drafts with, and what `kolm-rsd replay --slots` replays.
    pub fn drafter_config(&self) -> DrafterConfig {
        DrafterConfig {
            n_seq: self.n_seq,
            max_draft: self.n_max.min(self.n_max_cap()),
            adaptive: self.adaptive,
            shared_min_gain: self.shared_gain,
            shared_sure: self.shared_sure,
            shared_fair: self.shared_fair,
            shared_lag: self.shared_lag,
            joint: self.joint,
            layout: self.layout,
            context: self.context,
            gate: self.gate.then_some(GateConfig {
                clock: self.gate_clock,
                min_steps: self.gate_steps,
                apart: self.gates_apart,
                off_one: self.gate_off_one,
                by_context: self.gate_by_context,
                ..GateConfig::default()
            }),
            ..DrafterConfig::default()
        }
    }

    /// Parses `--spec-plugin-arg`: comma-separated `key=value` (`pack=PATH|off`, `misslog=PATH|off`, `misslog_cap=BYTES`,
    /// `adaptive=0|1`, `shared_gain=F`, `shared_sure=P`, `shared_fair=R`, `shared_lag=S|off`, `step=joint|slot`, `gate=auto|wall|steps|off`, `gate_steps=N`, `gates=2|1`, `gate_off=one|measure`, `gate_unit=context|mean`, `kv=auto|split|unified`, `context=0|1|answer`, `nmax=N`, `draft=GGUF`, `shortlist=PATH|full`, `margin=F`, `request_rows=0|1`,
    /// `head_dev=cpu|best`, `live=PATH|mem|off`, `live_cap=ENTRIES`, `steplog=PATH`); a bare value is the pack path. Without `pack=`,
    /// the pack beside the model is used when it exists; without `shortlist=`, the shortlist beside the draft GGUF,
    /// else the full head; without `head_dev=`, [`DEFAULT_HEAD_DEVICE`]; without `live=`, the live index is kept in
    /// [`default_live_path`].
    pub fn from_plugin_arg(arg: &str, model_path: &str) -> Result<EngineConfig, EngineError> {
        let mut cfg = EngineConfig::default();
        let model = (!model_path.is_empty()).then(|| PathBuf::from(model_path));
        let mut pack: Option<PathBuf> = None;
        let mut misslog: Option<Option<PathBuf>> = None;
        let mut pack_off = false;
        let mut draft: Option<PathBuf> = None;
        let mut shortlist: Option<Option<PathBuf>> = None;
        let mut margin = DEFAULT_MARGIN;
        let mut request_rows = true;
        let mut head_device: Option<HeadDevice> = None;
        let mut live: Option<LiveChoice> = None;
        for item in arg.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.split_once('=') {
                None => pack = Some(PathBuf::from(item)),
                Some(("pack", "off")) => pack_off = true,
                Some(("pack", v)) => pack = Some(PathBuf::from(v)),
                Some(("draft", v)) => draft = Some(PathBuf::from(v)),
                Some(("shortlist", "full")) => shortlist = Some(None),
                Some(("shortlist", v)) => shortlist = Some(Some(PathBuf::from(v))),
                Some(("margin", v)) => {
                    margin = v
                        .parse::<f32>()
                        .ok()
                        .filter(|m| m.is_finite() && *m >= 0.0)
                        .ok_or_else(|| EngineError::Arg(format!("--spec-plugin-arg: margin={v} is not a number ≥ 0")))?
                }
                Some(("request_rows", v)) => request_rows = parse_bool(v)?,
                Some(("head_dev", "cpu")) => head_device = Some(HeadDevice::Cpu),
                Some(("head_dev", "best")) => head_device = Some(HeadDevice::Best),
                Some(("head_dev", v)) => {
                    return Err(EngineError::Arg(format!(
                        "--spec-plugin-arg: head_dev={v} is not `cpu` or `best` (the device of the draft model's LM head)"
                    )))
                }
                Some(("misslog", "off")) => misslog = Some(None),
                Some(("misslog", v)) => misslog = Some(Some(PathBuf::from(v))),
                Some(("misslog_cap", v)) => {
                    cfg.miss_log_cap =
                        v.parse().map_err(|_| EngineError::Arg(format!("--spec-plugin-arg: misslog_cap={v} is not a number of bytes")))?
                }
                Some(("live", "off")) => live = Some(LiveChoice::Off),
                Some(("live", "mem")) => live = Some(LiveChoice::Memory),
                Some(("live", v)) => live = Some(LiveChoice::File(PathBuf::from(v))),
                Some(("live_cap", v)) => {
                    cfg.live_cap = v
                        .parse()
                        .ok()
                        .filter(|&n: &usize| (8..=1 << 26).contains(&n))
                        .ok_or_else(|| EngineError::Arg(format!("--spec-plugin-arg: live_cap={v} is not a number of entries in 8..=67108864")))?
                }
                Some(("adaptive", v)) => cfg.adaptive = parse_bool(v)?,
                Some(("shared_gain", v)) => cfg.shared_gain = number_in("shared_gain", v, &SHARED_GAIN_RANGE)?,
                Some(("shared_sure", v)) => cfg.shared_sure = number_in("shared_sure", v, &SHARED_SURE_RANGE)?,
                Some(("shared_fair", v)) => cfg.shared_fair = number_in("shared_fair", v, &SHARED_FAIR_RANGE)?,
                Some(("shared_lag", "off")) => cfg.shared_lag = f64::INFINITY,
                Some(("shared_lag", v)) => cfg.shared_lag = number_in("shared_lag", v, &SHARED_LAG_RANGE)?,
                Some(("step", "joint")) => cfg.joint = true,
                Some(("step", "slot")) => cfg.joint = false,
                Some(("step", v)) => return Err(EngineError::Arg(format!("--spec-plugin-arg: step={v} is not joint or slot"))),
                Some(("kv", v)) => {
                    cfg.layout = match v {
                        "auto" => None,
                        "split" => Some(Layout::Split),
                        "unified" => Some(Layout::Unified),
                        _ => return Err(EngineError::Arg(format!("--spec-plugin-arg: kv={v} is not auto, split or unified"))),
                    }
                }
                Some(("context", "answer")) => cfg.context = Context::Answer,
                Some(("context", v)) => cfg.context = if parse_bool(v)? { Context::All } else { Context::Off },
                Some(("gate", v)) => {
                    (cfg.gate, cfg.gate_clock) = match v {
                        "auto" => (true, None),
                        "wall" => (true, Some(Clock::Wall)),
                        "steps" => (true, Some(Clock::PlainSteps)),
                        "off" => (false, None),
                        _ => return Err(EngineError::Arg(format!("--spec-plugin-arg: gate={v} is not auto, wall, steps or off"))),
                    }
                }
                Some(("gate_steps", v)) => {
                    cfg.gate_steps = v.parse().map_err(|_| EngineError::Arg(format!("--spec-plugin-arg: gate_steps={v} is not a number of steps")))?
                }
                Some(("gates", "2")) => cfg.gates_apart = true,
                Some(("gates", "1")) => cfg.gates_apart = false,
                Some(("gates", v)) => return Err(EngineError::Arg(format!("--spec-plugin-arg: gates={v} is not 2 (alone and shared apart) or 1"))),
                Some(("gate_off", "one")) => cfg.gate_off_one = true,
                Some(("gate_off", "measure")) => cfg.gate_off_one = false,
                Some(("gate_off", v)) => return Err(EngineError::Arg(format!("--spec-plugin-arg: gate_off={v} is not one or measure"))),
                Some(("gate_unit", "context")) => cfg.gate_by_context = true,
                Some(("gate_unit", "mean")) => cfg.gate_by_context = false,
                Some(("gate_unit", v)) => return Err(EngineError::Arg(format!("--spec-plugin-arg: gate_unit={v} is not context or mean"))),
                Some(("steplog", v)) => cfg.step_log = Some(PathBuf::from(v)),
                Some(("nmax", v)) => {
                    cfg.n_max = v.parse().map_err(|_| EngineError::Arg(format!("--spec-plugin-arg: nmax={v} is not a number")))?
                }
                Some((k, _)) => {
                    return Err(EngineError::Arg(format!(
                        "--spec-plugin-arg: unknown key `{k}` (known: pack, misslog, misslog_cap, adaptive, shared_gain, shared_sure, shared_fair, shared_lag, step, gate, gate_steps, gates, gate_off, gate_unit, kv, context, nmax, draft, shortlist, margin, request_rows, head_dev, live, live_cap, steplog)"
                    )))
                }
            }
        }
        cfg.pack = match pack {
            _ if pack_off => None,
            Some(p) => Some(p),
            None => model.as_deref().map(pack_beside).filter(|p| p.is_file()),
        };
        for (key, given) in [("shortlist", shortlist.is_some()), ("head_dev", head_device.is_some())] {
            if given && draft.is_none() {
                return Err(EngineError::Arg(format!("--spec-plugin-arg: {key}= needs draft=GGUF")));
            }
        }
        cfg.draft = draft.map(|d| DraftChoice {
            shortlist: match shortlist {
                Some(s) => s,
                None => Some(shortlist_beside(&d)).filter(|p| p.is_file()),
            },
            model: d,
            margin,
            request_rows,
            head_device: head_device.unwrap_or(DEFAULT_HEAD_DEVICE),
        });
        cfg.live = match live {
            Some(l) => l,
            None => model.as_deref().map_or(LiveChoice::Memory, |m| LiveChoice::File(default_live_path(m))),
        };
        cfg.miss_log = match misslog {
            Some(m) => m,
            None => model.as_deref().map(default_miss_log),
        };
        Ok(cfg)
    }
}

/// Loads and validates a pack for `model`'s tokenizer.
pub fn load_pack(path: &Path, model: &Model) -> Result<Pack, EngineError> {
    read_pack(path, Some(&token_texts(model)))
}

/// Reads and validates the pack at `path`, for the tokenizer whose token texts are `texts` when given (the
/// engine has them already, for shapes too; the Python package inspects packs without one).
pub fn read_pack(path: &Path, texts: Option<&[&[u8]]>) -> Result<Pack, EngineError> {
    let fp = texts.map(|t| tokenizer_fingerprint(t.iter().copied()));
    read_pack_for(path, fp.as_deref(), texts.map(|t| t.len() as u32))
}

/// [`read_pack`] with the tokenizer's fingerprint and vocabulary size already computed.
fn read_pack_for(path: &Path, fingerprint: Option<&str>, n_vocab: Option<u32>) -> Result<Pack, EngineError> {
    let bytes = std::fs::read(path).map_err(|e| EngineError::Io(format!("recipe pack {}", path.display()), e))?;
    Ok(Pack::from_slice(&bytes, &path.display().to_string(), fingerprint, n_vocab)?)
}

/// The lookup tables of the pack at `path`, validated for the tokenizer whose token texts are `texts`
/// ([`token_texts`], read once by the caller, who needs them for the drafter too), with its shape table.
pub fn load_index(path: &Path, texts: &[&[u8]]) -> Result<Index, EngineError> {
    let fp = tokenizer_fingerprint(texts.iter().copied());
    index_with(path, &fp, texts.len(), ShapeTable::from_token_texts(texts))
}

/// The index of the pack at `path`, which must be for the tokenizer of fingerprint `fp` and `n_vocab` tokens.
fn index_with(path: &Path, fp: &str, n_vocab: usize, shapes: ShapeTable) -> Result<Index, EngineError> {
    let pack = read_pack_for(path, Some(fp), Some(n_vocab as u32))?;
    Ok(Index::new(&pack, Some(shapes)))
}

/// What an engine has done since load, for the layers above it (the C ABI's `KolmRsdStats`).
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub draft: Stats,
    pub misses_logged: u64,
    /// Entries of the loaded pack (0 without one).
    pub pack_entries: u64,
}

impl Counters {
    /// Drafted tokens that came from the pack, literal or shape recipes (what the C and Python APIs call pack hits).
    pub fn pack_hits(&self) -> u64 {
        self.draft.literal_hits + self.draft.shape_hits
    }
}

/// The drafter of one model: pack index, request n-grams, break-even control, miss log.
pub struct Engine {
    drafter: Drafter,
    /// The draft model asked for, and the ggml backend its head runs on.
    draft: Option<(DraftChoice, String)>,
    n_seq: usize,
    pack: Option<(PathBuf, usize)>,
    miss_log: Option<MissLog>,
    misses: Vec<Miss>,
    misses_logged: u64,
    clock: Instant,
    /// Where the live index is kept, when it is.
    keeper: Option<live::Keeper>,
    steps: Option<steplog::StepLog>,
}

impl Engine {
    pub fn new(model: &Model, cfg: EngineConfig) -> Result<Engine, EngineError> {
        // The vocabulary's texts serve the pack's tokenizer check, its shapes and the drafter's reading of answers;
        // their fingerprint (hashing every token's text) is taken once for the pack, the live file and the draft.
        let texts = token_texts(model);
        let fp = tokenizer_fingerprint(texts.iter().copied());
        let shapes = ShapeTable::from_token_texts(&texts);
        let index = cfg.pack.as_deref().map(|p| index_with(p, &fp, texts.len(), shapes.clone())).transpose()?;
        let source = match &cfg.draft {
            Some(d) => Some(load_draft(model, &fp, d, &cfg)?),
            None => None,
        };
        let name = ModelInfo { name: model.meta("general.name").unwrap_or_default(), arch: model.meta("general.architecture").unwrap_or_default() };
        Ok(Engine::assemble(texts.len(), &fp, index, shapes, drafter_texts(model, &texts), name, source, cfg))
    }

    /// An engine for a tokenizer known only by its token texts in id order (the raw vocabulary strings, as
    /// [`token_texts`] reads them from a GGUF: a Hugging Face tokenizer's `convert_ids_to_tokens`) and its
    /// control tokens: what the Python package drives for vLLM, which has no llama.cpp model. The pack is
    /// checked against the fingerprint of these texts; a draft model is refused (its tokenizer could not be
    /// checked against the target's).
    pub fn from_texts(texts: &[&[u8]], control: impl Fn(Token) -> bool, cfg: EngineConfig) -> Result<Engine, EngineError> {
        if let Some(d) = &cfg.draft {
            return Err(EngineError::Arg(format!(
                "draft model {}: an engine built from token texts has no llama.cpp model to check its tokenizer against",
                d.model.display()
            )));
        }
        let fp = tokenizer_fingerprint(texts.iter().copied());
        let shapes = ShapeTable::from_token_texts(texts);
        let index = cfg.pack.as_deref().map(|p| index_with(p, &fp, texts.len(), shapes.clone())).transpose()?;
        let name = ModelInfo { name: String::new(), arch: String::new() };
        Ok(Engine::assemble(texts.len(), &fp, index, shapes, TokenTexts::new(texts).with_control(control), name, None, cfg))
    }

    /// The engine over what either constructor read: the vocabulary's size and fingerprint (the live index's
    /// file is kept for them), the pack's index, the shapes, the drafter's reading of texts, the model's name, a
    /// draft model with the backend its head runs on.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        n_vocab: usize,
        fp: &str,
        index: Option<Index>,
        shapes: ShapeTable,
        texts: TokenTexts,
        name: ModelInfo,
        source: Option<(Box<dyn TokenSource>, String)>,
        cfg: EngineConfig,
    ) -> Engine {
        let (source, head_backend) = source.unzip();
        let pack = cfg.pack.clone().zip(index.as_ref().map(Index::len));
        let mut drafter = Drafter::new(index, cfg.drafter_config()).with_texts(texts);
        let mut keeper = None;
        if cfg.live != LiveChoice::Off {
            let mut table = Live::new(LiveConfig { capacity: cfg.live_cap, ..LiveConfig::default() }, Some(shapes));
            if let LiveChoice::File(path) = &cfg.live {
                let (mut k, note) = live::Keeper::open(path.clone(), fp, name, n_vocab as u32, &mut table);
                if let Some(note) = note {
                    eprintln!("kolm-rsd: {note}");
                }
                if let Some(l) = k.take_learned() {
                    if !drafter.restore_learned(&l) {
                        eprintln!("kolm-rsd: live index {}: its learned acceptance is for another kolm-rsd ({}); starting from the priors", k.path().display(), l.layout);
                    }
                }
                keeper = Some(k);
            }
            drafter = drafter.with_live(table);
        }
        if let Some(source) = source {
            drafter = drafter.with_source(source);
        }
        let steps = cfg.step_log.as_deref().and_then(|p| match steplog::StepLog::create(p) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("kolm-rsd: step log {}: {e}; steps are not logged", p.display());
                None
            }
        });
        if steps.is_some() {
            drafter = drafter.with_step_log();
        }
        Engine {
            drafter,
            draft: cfg.draft.clone().zip(head_backend),
            n_seq: cfg.n_seq,
            pack,
            miss_log: cfg.miss_log.map(|p| MissLog::new(p, cfg.miss_log_cap)),
            misses: Vec::new(),
            misses_logged: 0,
            clock: Instant::now(),
            keeper,
            steps,
        }
    }

    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    pub fn begin(&mut self, seq: usize, prompt: &[Token]) {
        self.flush_misses();
        if let Some(k) = &mut self.keeper {
            k.tick(&self.drafter);
        }
        self.drafter.begin(seq, prompt);
        if let Some(l) = &mut self.steps {
            l.begin();
        }
    }

    /// The proposals up to the next call are one step's, in any order of sequences ([`Drafter::start_step`]).
    pub fn start_step(&mut self) {
        self.drafter.start_step();
    }

    /// The decode that just ended also evaluated part of a prompt that no `begin` follows yet (vLLM prefills a
    /// long prompt in chunks over several steps): its time is not verify cost ([`Drafter::prompt_decoded`]).
    pub fn prompt_decoded(&mut self) {
        self.drafter.prompt_decoded();
    }

    /// The request begun on `seq` comes with a predicted output (OpenAI `prediction`), a source of copies.
    pub fn predict(&mut self, seq: usize, tokens: &[Token]) {
        self.drafter.predict(seq, tokens);
    }

    /// Predicted tokens of the current request on `seq` that verification kept and discarded.
    pub fn prediction_counts(&self, seq: usize) -> (u64, u64) {
        self.drafter.prediction_counts(seq).unwrap_or_default()
    }

    pub fn propose(&mut self, seq: usize, tokens: &[Token], id_last: Token, n_max: usize, out: &mut Vec<Token>) -> usize {
        let now = self.clock.elapsed().as_nanos() as u64;
        let n = self.drafter.propose(seq, tokens, id_last, n_max, now, out);
        let end = self.clock.elapsed().as_nanos() as u64;
        self.drafter.end_propose(seq, end);
        if let Some(l) = &mut self.steps {
            let gate = self.drafter.gates().map(|g| (g.current().arm(), g.last_window()));
            l.proposed(now, end, self.drafter.ended_step(), gate);
        }
        n
    }

    pub fn accept(&mut self, seq: usize, n_accepted: usize) {
        if let Some(l) = &mut self.steps {
            l.accepted(self.clock.elapsed().as_nanos() as u64);
        }
        self.drafter.accept(seq, n_accepted);
    }

    /// A miss reported by the caller (the C API); logged with the drafter's own.
    pub fn observe_miss(&mut self, context: &[Token], token: Token) {
        let tail = &context[context.len().saturating_sub(crate::draft::MISS_CONTEXT)..];
        self.misses.push(Miss { kind: crate::draft::MissKind::Uncovered, context: tail.to_vec(), token });
    }

    /// Writes the misses collected so far to the miss log (never fails the caller: a full or
    /// unwritable log only stops logging).
    pub fn flush_misses(&mut self) {
        self.drafter.drain_misses(&mut self.misses);
        if let Some(log) = &mut self.miss_log {
            if !self.misses.is_empty() {
                self.misses_logged += log.write(&self.misses) as u64;
            }
        }
        self.misses.clear();
    }

    /// Counters since load: the drafter's over all sequences, misses logged, the pack's size.
    pub fn counters(&self) -> Counters {
        Counters {
            draft: self.drafter.global_stats(),
            misses_logged: self.misses_logged,
            pack_entries: self.pack.as_ref().map_or(0, |(_, n)| *n as u64),
        }
    }

    /// One line for the server log at start-up.
    pub fn describe(&self) -> String {
        let pack = match &self.pack {
            Some((p, n)) => format!("pack {} ({n} entries)", p.display()),
            None => "no recipe pack (context n-grams only)".into(),
        };
        let log = match &self.miss_log {
            Some(l) => format!("miss log {}", l.path().display()),
            None => "no miss log".into(),
        };
        let draft = match &self.draft {
            Some((d, backend)) => format!(
                ", draft model {} with {}, margin {}, head on {backend} (head_dev={})",
                d.model.display(),
                d.shortlist.as_ref().map_or("the full head".into(), |s| format!("shortlist {}", s.display())),
                d.margin,
                d.head_device.as_str()
            ),
            None => String::new(),
        };
        let live = match (self.drafter.live(), &self.keeper) {
            (None, _) => "no live index".into(),
            (Some(l), k) => format!(
                "live index {} of {} entries ({} MiB){}",
                l.len(),
                l.capacity(),
                l.bytes() >> 20,
                k.as_ref().map_or(" in memory only".into(), |k| format!(", kept in {}", k.path().display()))
            ),
        };
        let steps = self.steps.as_ref().map_or(String::new(), |l| format!(", steps logged to {}", l.path().display()));
        let drafts = match self.drafter.max_draft() {
            0 => "drafting nothing (nmax=0)".into(),
            n => format!("drafts of at most {n}"),
        };
        format!("{pack}{draft}, {} sequences, {drafts}, {live}, {log}{steps}", self.n_seq)
    }

    /// One line at shutdown: what drafting did.
    pub fn summary(&self) -> String {
        let s = self.drafter.global_stats();
        format!(
            "{} calls, {} drafts, {} drafted, {} accepted ({:.1}%), pack hits {} literal + {} shape, live hits {}{}, context hits {}, prediction {} accepted + {} rejected, model hits {}, model probes {}, steps off {}, gate {}, alpha {:.2}, beta(2..5) {:.2} {:.2} {:.2} {:.2}{}",
            s.calls,
            s.drafts,
            s.tokens_drafted,
            s.tokens_accepted,
            100.0 * s.tokens_accepted as f64 / s.tokens_drafted.max(1) as f64,
            s.literal_hits,
            s.shape_hits,
            s.live_hits,
            self.drafter.live().map_or(String::new(), |l| format!(
                " ({} entries, {} answer tokens learned)",
                l.len(),
                self.keeper.as_ref().map_or(l.fed(), |k| k.fed_total(l))
            )),
            s.context_hits,
            s.prediction_accepted,
            s.prediction_rejected,
            s.model_hits,
            s.model_probes,
            s.steps_off,
            gates_line(self.drafter.gates()),
            s.alpha,
            s.beta[1],
            s.beta[2],
            s.beta[3],
            s.beta[4],
            self.drafter.source_summary().map_or(String::new(), |m| format!("; {m}"))
        )
    }
}

/// The draft model of `d`, refused unless its tokenizer is the target's (`model`, of fingerprint `want`), and
/// the backend its head runs on.
fn load_draft(model: &Model, want: &str, d: &DraftChoice, cfg: &EngineConfig) -> Result<(Box<dyn TokenSource>, String), EngineError> {
    let md = ModelDrafter::load(&ModelDraftConfig {
        model: d.model.clone(),
        shortlist: d.shortlist.clone(),
        margin: d.margin,
        request_rows: d.request_rows,
        n_seq: cfg.n_seq,
        n_ctx: cfg.n_ctx,
        n_threads: cfg.n_threads,
        head_device: d.head_device,
    })?;
    let got = fingerprint(md.model());
    if want != got || model.n_vocab() != md.model().n_vocab() {
        return Err(EngineError::Arg(format!(
            "draft model {}: its tokenizer differs from the target's (fingerprint {got}, {} tokens; the target has {want}, {} tokens)",
            d.model.display(),
            md.model().n_vocab(),
            model.n_vocab()
        )));
    }
    let backend = md.head_backend();
    Ok((Box::new(md), backend))
}

/// How the gates ran: alone, and beside other slots when they are apart.
fn gates_line(g: Option<&Gates>) -> String {
    let line = |g: &Gate| if g.used() { gate_line(g) } else { "unused".into() };
    match g.map(Gates::regimes) {
        None => "none".into(),
        Some((one, None)) => gate_line(one),
        Some((alone, Some(shared))) => format!("alone {}; beside other slots {}", line(alone), line(shared)),
    }
}

/// "on 40 / off 9 windows (62.1 / 55.0 tok/s), 120 sure steps": how a measured gate ran (with several slots,
/// rates in a slot's tokens per plain step).
fn gate_line(g: &Gate) -> String {
    let (digits, unit) = match g.clock() {
        Clock::Wall => (1, "tok/s"),
        Clock::PlainSteps => (3, "tokens a slot per plain step"),
    };
    // The off arm's rate before its first window is the one it has by construction ([`GateConfig::off_one`]).
    let rate = |r: Option<f64>, ran: u64| match r {
        None => "?".into(),
        Some(r) if ran == 0 => format!("{r:.digits$} taken"),
        Some(r) => format!("{r:.digits$}"),
    };
    let [on, off] = g.rates();
    format!("on {} / off {} windows ({} / {} {unit}), {} sure steps", g.ran[0], g.ran[1], rate(on, g.ran[0]), rate(off, g.ran[1]), g.sure_steps)
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.flush_misses();
        if let Some(k) = &mut self.keeper {
            k.finish(&self.drafter);
        }
    }
}

fn parse_bool(v: &str) -> Result<bool, EngineError> {
    match v {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        _ => Err(EngineError::Arg(format!("--spec-plugin-arg: `{v}` is not a boolean"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_no_step_reached_is_named_unused_not_given_rates() {
        let mut g = Gates::new(GateConfig::default());
        g.at(true).call(0, true);
        let line = gates_line(Some(&g));
        assert!(line.starts_with("alone on 0 / off 0 windows (? / 1.000 taken tokens a slot per plain step)"), "{line}");
        assert!(line.ends_with("; beside other slots unused"), "{line}");
    }

    #[test]
    fn pack_is_found_beside_the_model() {
        assert_eq!(pack_beside(Path::new("/m/qwen.gguf")), PathBuf::from("/m/qwen.recipes.json"));
        assert_eq!(pack_beside(Path::new("/m/qwen")), PathBuf::from("/m/qwen.recipes.json"));
    }

    #[test]
    fn plugin_arg_parses_and_refuses_unknown_keys() {
        let c = EngineConfig::from_plugin_arg("pack=/p.json,misslog=off,adaptive=0,nmax=3", "").unwrap();
        assert_eq!(c.pack.as_deref(), Some(Path::new("/p.json")));
        assert!(c.miss_log.is_none() && !c.adaptive && c.n_max == 3);
        assert_eq!(c.shared_gain, DrafterConfig::default().shared_min_gain);
        assert_eq!(EngineConfig::from_plugin_arg("shared_gain=0.05", "").unwrap().shared_gain, 0.05);
        assert_eq!(c.shared_sure, DrafterConfig::default().shared_sure);
        assert_eq!(EngineConfig::from_plugin_arg("shared_sure=0", "").unwrap().shared_sure, 0.0);
        assert_eq!(c.shared_fair, 0.1);
        assert_eq!(EngineConfig::from_plugin_arg("shared_fair=0", "").unwrap().shared_fair, 0.0);
        assert_eq!(EngineConfig::from_plugin_arg("shared_fair=0.2", "").unwrap().shared_fair, 0.2);
        assert!(EngineConfig::from_plugin_arg("shared_fair=-1", "").unwrap_err().to_string().contains("shared_fair=-1 is not a number in 0..=10"));
        assert_eq!(c.shared_lag, f64::INFINITY, "off by default");
        assert_eq!(EngineConfig::from_plugin_arg("shared_lag=0.1", "").unwrap().shared_lag, 0.1);
        assert!(EngineConfig::from_plugin_arg("step=joint", "").unwrap().drafter_config().joint);
        assert!(!EngineConfig::from_plugin_arg("step=joint,step=slot", "").unwrap().drafter_config().joint);
        assert!(EngineConfig::from_plugin_arg("step=all", "").unwrap_err().to_string().contains("step=all is not joint or slot"));
        let gates = |arg: &str| EngineConfig::from_plugin_arg(arg, "").unwrap().drafter_config().gate.unwrap().apart;
        assert!(gates("") && gates("gates=2") && !gates("gates=1"), "a gate alone and one beside others by default");
        assert!(EngineConfig::from_plugin_arg("gates=3", "").unwrap_err().to_string().contains("gates=3 is not 2"));
        let off_one = |arg: &str| EngineConfig::from_plugin_arg(arg, "").unwrap().drafter_config().gate.unwrap().off_one;
        assert!(off_one("") && off_one("gate_off=one") && !off_one("gate_off=measure"), "not drafting taken as one by default");
        assert!(EngineConfig::from_plugin_arg("gate_off=0", "").unwrap_err().to_string().contains("gate_off=0 is not one or measure"));
        let by_context = |arg: &str| EngineConfig::from_plugin_arg(arg, "").unwrap().drafter_config().gate.unwrap().by_context;
        assert!(by_context("") && by_context("gate_unit=context") && !by_context("gate_unit=mean"), "priced at the step's context by default");
        assert!(EngineConfig::from_plugin_arg("gate_unit=ctx", "").unwrap_err().to_string().contains("gate_unit=ctx is not context or mean"));
        assert_eq!(EngineConfig::from_plugin_arg("shared_lag=0.1,shared_lag=off", "").unwrap().shared_lag, f64::INFINITY);
        assert!(EngineConfig::from_plugin_arg("shared_lag=x", "").unwrap_err().to_string().contains("shared_lag=x is not a number in 0..=10"));
        let e = EngineConfig::from_plugin_arg("shared_sure=1.5", "").unwrap_err().to_string();
        assert!(e.contains("shared_sure=1.5") && e.contains("0..=1"), "{e}");
        let e = EngineConfig::from_plugin_arg("shared_gain=-1", "").unwrap_err().to_string();
        assert!(e.contains("shared_gain=-1"), "{e}");
        assert_eq!(c.layout, None);
        assert_eq!(EngineConfig::from_plugin_arg("kv=unified", "").unwrap().layout, Some(Layout::Unified));
        assert_eq!(EngineConfig::from_plugin_arg("kv=split", "").unwrap().layout, Some(Layout::Split));
        let e = EngineConfig::from_plugin_arg("kv=both", "").unwrap_err().to_string();
        assert!(e.contains("kv=both is not auto, split or unified"), "{e}");
        assert_eq!(EngineConfig::from_plugin_arg("steplog=/t/s.tsv", "").unwrap().step_log.as_deref(), Some(Path::new("/t/s.tsv")));
        assert_eq!(c.step_log, None);
        assert_eq!((c.gate, c.gate_clock), (true, None));
        for (v, want) in [("off", (false, None)), ("wall", (true, Some(Clock::Wall))), ("steps", (true, Some(Clock::PlainSteps))), ("auto", (true, None))] {
            let g = EngineConfig::from_plugin_arg(&format!("gate={v}"), "").unwrap();
            assert_eq!((g.gate, g.gate_clock), want, "gate={v}");
        }
        let e = EngineConfig::from_plugin_arg("gate=maybe", "").unwrap_err().to_string();
        assert!(e.contains("gate=maybe is not auto, wall, steps or off"), "{e}");
        assert_eq!((c.gate_steps, EngineConfig::from_plugin_arg("gate_steps=1", "").unwrap().gate_steps), (24, 1));
        let e = EngineConfig::from_plugin_arg("gate_steps=many", "").unwrap_err().to_string();
        assert!(e.contains("gate_steps=many is not a number of steps"), "{e}");
        assert_eq!(c.context, Context::All);
        for (v, want) in [("answer", Context::Answer), ("0", Context::Off), ("on", Context::All)] {
            assert_eq!(EngineConfig::from_plugin_arg(&format!("context={v}"), "").unwrap().context, want, "context={v}");
        }
        let c = EngineConfig::from_plugin_arg("/x.recipes.json", "").unwrap();
        assert_eq!(c.pack.as_deref(), Some(Path::new("/x.recipes.json")));
        let e = EngineConfig::from_plugin_arg("colour=blue", "").unwrap_err().to_string();
        assert!(e.contains("unknown key `colour`"), "{e}");
        let e = EngineConfig::from_plugin_arg("adaptive=maybe", "").unwrap_err().to_string();
        assert!(e.contains("not a boolean"), "{e}");
        let c = EngineConfig::from_plugin_arg("pack=off,draft=/m/d.gguf,shortlist=/m/s.json,margin=0.3", "").unwrap();
        assert!(c.pack.is_none());
        let d = c.draft.unwrap();
        assert_eq!((d.model.as_path(), d.shortlist.as_deref(), d.margin), (Path::new("/m/d.gguf"), Some(Path::new("/m/s.json")), 0.3));
        let c = EngineConfig::from_plugin_arg("draft=/m/d.gguf,shortlist=full", "").unwrap();
        assert_eq!(c.draft.unwrap().shortlist, None);
        let c = EngineConfig::from_plugin_arg("draft=/nowhere/d.gguf", "").unwrap();
        assert_eq!(c.draft.unwrap().margin, DEFAULT_MARGIN, "no shortlist beside: full head, default margin");
        let e = EngineConfig::from_plugin_arg("shortlist=/m/s.json", "").unwrap_err().to_string();
        assert!(e.contains("needs draft="), "{e}");
        let e = EngineConfig::from_plugin_arg("draft=/m/d.gguf,margin=-1", "").unwrap_err().to_string();
        assert!(e.contains("margin=-1"), "{e}");
    }

    #[test]
    fn head_dev_picks_the_draft_heads_device_and_defaults_to_the_best() {
        let head = |arg: &str| EngineConfig::from_plugin_arg(arg, "").map(|c| c.draft.unwrap().head_device);
        assert_eq!(head("draft=/m/d.gguf").unwrap(), HeadDevice::Best);
        assert_eq!(head("draft=/m/d.gguf,head_dev=cpu").unwrap(), HeadDevice::Cpu);
        assert_eq!(head("head_dev=best,draft=/m/d.gguf").unwrap(), HeadDevice::Best);
        for bad in ["gpu", "CPU", "", "Vulkan0"] {
            let e = EngineConfig::from_plugin_arg(&format!("draft=/m/d.gguf,head_dev={bad}"), "").map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(&format!("head_dev={bad} is not `cpu` or `best`")), "{bad}: {e}");
        }
        let e = EngineConfig::from_plugin_arg("head_dev=cpu", "").unwrap_err().to_string();
        assert!(e.contains("head_dev= needs draft="), "{e}");
    }

    #[test]
    fn the_live_index_is_kept_in_the_cache_unless_told_otherwise() {
        let c = EngineConfig::from_plugin_arg("", "/models/qwen.gguf").unwrap();
        assert_eq!(c.live, LiveChoice::File(default_live_path(Path::new("/models/qwen.gguf"))));
        assert!(default_live_path(Path::new("/models/qwen.gguf")).ends_with("live/qwen.json"));
        assert_eq!(EngineConfig::from_plugin_arg("", "").unwrap().live, LiveChoice::Memory, "no model path: nowhere to name it after");
        assert_eq!(EngineConfig::from_plugin_arg("live=off", "/m.gguf").unwrap().live, LiveChoice::Off);
        assert_eq!(EngineConfig::from_plugin_arg("live=mem", "/m.gguf").unwrap().live, LiveChoice::Memory);
        let c = EngineConfig::from_plugin_arg("live=/t/l.json,live_cap=4096", "/m.gguf").unwrap();
        assert_eq!((c.live, c.live_cap), (LiveChoice::File("/t/l.json".into()), 4096));
        for bad in ["live_cap=0", "live_cap=lots"] {
            let e = EngineConfig::from_plugin_arg(bad, "").unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
