//! The public C API of kolm-rsd.h: load a drafter for a llama model, propose drafts, report what the
//! target accepted, feed misses, read stats. Opaque handle, stable result codes, panic boundary everywhere.

use super::error::{boundary, boundary_value, last_error_ptr, FfiError, KolmRsdResult};
use crate::engine::{Counters, Engine, EngineConfig, EngineError};
use crate::llama::Model;
use crate::pack::PackErrorKind;
use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::ptr::NonNull;

/// Version of this C API; bumped on any incompatible change.
pub const KOLM_RSD_ABI_VERSION: u32 = 1;

/// Opaque drafter handle (also the state behind the llama.cpp plugin entry points).
pub struct KolmRsd {
    pub(crate) engine: Engine,
    scratch: Vec<i32>,
}

impl KolmRsd {
    pub(crate) fn new(engine: Engine) -> KolmRsd {
        KolmRsd { engine, scratch: Vec::new() }
    }

    /// Proposes for sequence index `s` and copies the draft to `out`; returns its length.
    ///
    /// # Safety
    /// `out` has room for `n_max` ids (it may be NULL only when `n_max` is 0).
    pub(crate) unsafe fn propose_into(&mut self, s: usize, tokens: &[i32], id_last: i32, n_max: usize, out: *mut i32) -> usize {
        let n = self.engine.propose(s, tokens, id_last, n_max, &mut self.scratch);
        // SAFETY: n ≤ n_max and out has room for n_max ids per the contract.
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), out, n) };
        n
    }
}

/// Options of `kolm_rsd_load`; start from `kolm_rsd_options_default`.
#[repr(C)]
pub struct KolmRsdOptions {
    /// Number of sequences (0 → 1); sequence ids are 0..n_seq-1.
    pub n_seq: u32,
    /// Longest draft to propose (0 → 4).
    pub n_max: u32,
    /// Break-even control: stop drafting a sequence when drafting does not pay (default true).
    pub adaptive: bool,
    /// Miss log path (JSON lines), NULL for none.
    pub miss_log: *const c_char,
}

/// Counters since load.
#[repr(C)]
#[derive(Default)]
pub struct KolmRsdStats {
    pub propose_calls: u64,
    pub drafts: u64,
    pub tokens_drafted: u64,
    pub tokens_accepted: u64,
    /// Proposals that came from the recipe pack (literal or shape).
    pub pack_hits: u64,
    /// Proposals that came from the request's own context n-grams.
    pub context_hits: u64,
    /// Steps on which break-even control held drafting off.
    pub steps_off: u64,
    pub misses_logged: u64,
    /// Entries of the loaded pack (0 without one).
    pub pack_entries: u64,
}

impl From<Counters> for KolmRsdStats {
    fn from(c: Counters) -> KolmRsdStats {
        let s = c.draft;
        KolmRsdStats {
            propose_calls: s.calls,
            drafts: s.drafts,
            tokens_drafted: s.tokens_drafted,
            tokens_accepted: s.tokens_accepted,
            pack_hits: c.pack_hits(),
            context_hits: s.context_hits,
            steps_off: s.steps_off,
            misses_logged: c.misses_logged,
            pack_entries: c.pack_entries,
        }
    }
}

fn map_engine(e: EngineError) -> FfiError {
    let code = match &e {
        EngineError::Pack(p) if matches!(p.kind, PackErrorKind::TokenizerMismatch { .. }) => KolmRsdResult::TokenizerMismatch,
        EngineError::Pack(_) => KolmRsdResult::BadPack,
        EngineError::Io(..) => KolmRsdResult::Io,
        EngineError::Arg(_) | EngineError::Draft(_) => KolmRsdResult::InvalidArgument,
    };
    FfiError(code, e.to_string())
}

/// Reads an optional C path; NULL → None.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn opt_path(p: *const c_char, what: &str) -> Result<Option<PathBuf>, FfiError> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| FfiError::invalid(format!("{what} is not UTF-8")))?;
    Ok(Some(PathBuf::from(s)))
}

/// # Safety
/// `p` is NULL or points to `n` readable tokens.
unsafe fn tokens<'a>(p: *const i32, n: usize, what: &str) -> Result<&'a [i32], FfiError> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(FfiError::null(what));
    }
    // SAFETY: non-null and, by the caller's contract, valid for n reads.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// # Safety
/// `p` is NULL or a handle from `kolm_rsd_load` not yet freed, used by one thread at a time.
unsafe fn handle<'a>(p: *mut KolmRsd) -> Result<&'a mut KolmRsd, FfiError> {
    // SAFETY: per the contract above.
    unsafe { p.as_mut() }.ok_or_else(|| FfiError::null("rsd"))
}

/// The version of this API (`KOLM_RSD_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn kolm_rsd_abi_version() -> u32 {
    KOLM_RSD_ABI_VERSION
}

/// The calling thread's last error message; never NULL ("" when none). Valid until the next failing call.
#[no_mangle]
pub extern "C" fn kolm_rsd_last_error() -> *const c_char {
    last_error_ptr()
}

/// Fills `out` with the defaults (1 sequence, drafts of up to 4 tokens, adaptive, no miss log).
///
/// # Safety
/// `out` is NULL or points to writable memory for one `kolm_rsd_options`.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_options_default(out: *mut KolmRsdOptions) -> KolmRsdResult {
    boundary(|| {
        let out = NonNull::new(out).ok_or_else(|| FfiError::null("out"))?;
        // SAFETY: non-null and writable per the contract.
        unsafe { out.as_ptr().write(KolmRsdOptions { n_seq: 1, n_max: 4, adaptive: true, miss_log: std::ptr::null() }) };
        Ok(())
    })
}

/// Creates a drafter for `model`. `pack_path` may be NULL: then the pack beside the model is not searched
/// (the C caller names what it wants) and only context n-grams draft. `opts` may be NULL (defaults).
///
/// # Safety
/// `model` is a live llama_model that outlives the handle; `pack_path` is NULL or NUL-terminated;
/// `opts` is NULL or a valid options struct; `out` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_load(
    model: *const crate::llama::sys::llama_model,
    pack_path: *const c_char,
    opts: *const KolmRsdOptions,
    out: *mut *mut KolmRsd,
) -> KolmRsdResult {
    boundary(|| {
        let out = NonNull::new(out).ok_or_else(|| FfiError::null("out"))?;
        let model = NonNull::new(model.cast_mut()).ok_or_else(|| FfiError::null("model"))?;
        // SAFETY: caller contract: opts is NULL or valid.
        let opts = unsafe { opts.as_ref() };
        let mut cfg = EngineConfig::default();
        if let Some(o) = opts {
            cfg.n_seq = o.n_seq.max(1) as usize;
            cfg.n_max = if o.n_max == 0 { 4 } else { o.n_max as usize };
            cfg.adaptive = o.adaptive;
            // SAFETY: miss_log is NULL or NUL-terminated per the options contract.
            cfg.miss_log = unsafe { opt_path(o.miss_log, "miss_log") }?;
        }
        // SAFETY: pack_path is NULL or NUL-terminated.
        cfg.pack = unsafe { opt_path(pack_path, "pack_path") }?;
        // SAFETY: the caller keeps the model alive longer than the handle.
        let model = unsafe { Model::borrowed(model) };
        let engine = Engine::new(&model, cfg).map_err(map_engine)?;
        let h = Box::new(KolmRsd::new(engine));
        // SAFETY: out is non-null and writable.
        unsafe { out.as_ptr().write(Box::into_raw(h)) };
        Ok(())
    })
}

/// A new generation starts on `seq` with this prompt.
///
/// # Safety
/// `rsd` is a live handle; `prompt` points to `n_prompt` tokens (or n_prompt is 0).
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_begin(rsd: *mut KolmRsd, seq: i32, prompt: *const i32, n_prompt: usize) -> KolmRsdResult {
    boundary(|| {
        // SAFETY: caller contract.
        let (h, prompt) = unsafe { (handle(rsd)?, tokens(prompt, n_prompt, "prompt")?) };
        h.engine.begin(seq_index(&h.engine, seq)?, prompt);
        Ok(())
    })
}

pub(crate) fn seq_index(e: &Engine, seq: i32) -> Result<usize, FfiError> {
    usize::try_from(seq)
        .ok()
        .filter(|&s| s < e.n_seq())
        .ok_or_else(|| FfiError::invalid(format!("sequence {seq} out of range 0..{}", e.n_seq())))
}

/// The request just begun on `seq` (after `kolm_rsd_begin`) comes with a predicted output (OpenAI's predicted
/// outputs): its tokens are a text drafts are copied from, like the request's own. The output is unchanged;
/// it only drafts. Replaces an earlier prediction of the same request.
///
/// # Safety
/// `rsd` is a live handle; `tokens` points to `n_tokens` tokens (or n_tokens is 0).
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_predict(rsd: *mut KolmRsd, seq: i32, tokens: *const i32, n_tokens: usize) -> KolmRsdResult {
    boundary(|| {
        // SAFETY: caller contract.
        let (h, toks) = unsafe { (handle(rsd)?, self::tokens(tokens, n_tokens, "tokens")?) };
        h.engine.predict(seq_index(&h.engine, seq)?, toks);
        Ok(())
    })
}

/// Proposes up to `n_max` draft tokens for `seq`. `tokens` is the sequence so far (prompt + generated),
/// `id_last` the token just sampled (not in `tokens`). Writes the draft to `out`, its length to `n_out`
/// (0 = no draft this step).
///
/// # Safety
/// `rsd` is a live handle; `tokens` holds `n_tokens` ids; `out` has room for `n_max`; `n_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_propose(
    rsd: *mut KolmRsd,
    seq: i32,
    tokens: *const i32,
    n_tokens: usize,
    id_last: i32,
    n_max: usize,
    out: *mut i32,
    n_out: *mut usize,
) -> KolmRsdResult {
    boundary(|| {
        let n_out = NonNull::new(n_out).ok_or_else(|| FfiError::null("n_out"))?;
        if out.is_null() && n_max > 0 {
            return Err(FfiError::null("out"));
        }
        // SAFETY: caller contract for rsd and tokens.
        let (h, toks) = unsafe { (handle(rsd)?, self::tokens(tokens, n_tokens, "tokens")?) };
        let s = seq_index(&h.engine, seq)?;
        // SAFETY: out has room for n_max tokens (checked non-null above when n_max > 0); n_out is writable.
        unsafe {
            let n = h.propose_into(s, toks, id_last, n_max, out);
            n_out.as_ptr().write(n);
        }
        Ok(())
    })
}

/// The target accepted the first `n_accepted` tokens of the last draft proposed for `seq`.
///
/// # Safety
/// `rsd` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_accept(rsd: *mut KolmRsd, seq: i32, n_accepted: usize) -> KolmRsdResult {
    boundary(|| {
        // SAFETY: caller contract.
        let h = unsafe { handle(rsd)? };
        let s = seq_index(&h.engine, seq)?;
        h.engine.accept(s, n_accepted);
        Ok(())
    })
}

/// Records that after `context` the target produced `token` and no recipe predicted it (for the next compile).
///
/// # Safety
/// `rsd` is a live handle; `context` holds `n_context` ids.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_observe_miss(rsd: *mut KolmRsd, context: *const i32, n_context: usize, token: i32) -> KolmRsdResult {
    boundary(|| {
        // SAFETY: caller contract.
        let (h, ctx) = unsafe { (handle(rsd)?, tokens(context, n_context, "context")?) };
        h.engine.observe_miss(ctx, token);
        Ok(())
    })
}

/// Copies the counters into `out`.
///
/// # Safety
/// `rsd` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_get_stats(rsd: *const KolmRsd, out: *mut KolmRsdStats) -> KolmRsdResult {
    boundary(|| {
        let out = NonNull::new(out).ok_or_else(|| FfiError::null("out"))?;
        // SAFETY: caller contract: a live handle, read only.
        let h = unsafe { rsd.as_ref() }.ok_or_else(|| FfiError::null("rsd"))?;
        // SAFETY: out is non-null and writable.
        unsafe { out.as_ptr().write(h.engine.counters().into()) };
        Ok(())
    })
}

/// Frees the handle (flushing the miss log). NULL is a no-op.
///
/// # Safety
/// `rsd` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kolm_rsd_free(rsd: *mut KolmRsd) {
    boundary_value((), || {
        if !rsd.is_null() {
            // SAFETY: the handle came from Box::into_raw in kolm_rsd_load and is freed once.
            drop(unsafe { Box::from_raw(rsd) });
        }
        Ok(())
    })
}
