//! The llama.cpp speculative-plugin entry points (docs/plugin-abi.md): what `llama-server --spec-plugin
//! libkolm_rsd.so` calls. Thin: arguments are checked here, the work is the engine's.

use super::api::{seq_index, KolmRsd};
use super::error::{boundary_value, last_error_ptr, set_last_error, FfiError};
use crate::engine::{Engine, EngineConfig};
use crate::llama::{sys, Model};
use std::ffi::{c_char, c_void, CStr};
use std::ptr::NonNull;

/// The plugin ABI version this library implements (the host's must be equal).
pub const LLAMA_SPEC_PLUGIN_ABI_VERSION: u32 = 1;

/// What the host hands to `llama_spec_plugin_init` (layout fixed by the ABI).
#[repr(C)]
pub struct LlamaSpecPluginParams {
    pub abi_version: u32,
    pub model: *const sys::llama_model,
    pub ctx: *mut sys::llama_context,
    pub model_path: *const c_char,
    pub arg: *const c_char,
    pub n_seq: u32,
    pub n_max: i32,
}

/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, FfiError> {
    if p.is_null() {
        return Ok("");
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| FfiError::invalid(format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is a pointer returned by `llama_spec_plugin_init` and not freed.
unsafe fn plugin<'a>(p: *mut c_void) -> Result<&'a mut KolmRsd, FfiError> {
    // SAFETY: per the contract; the host calls one plugin from one thread at a time.
    unsafe { p.cast::<KolmRsd>().as_mut() }.ok_or_else(|| FfiError::null("plugin"))
}

fn seq(p: &KolmRsd, seq_id: i32) -> Result<usize, FfiError> {
    seq_index(&p.engine, seq_id)
}

#[no_mangle]
pub extern "C" fn llama_spec_plugin_abi_version() -> u32 {
    LLAMA_SPEC_PLUGIN_ABI_VERSION
}

#[no_mangle]
pub extern "C" fn llama_spec_plugin_last_error() -> *const c_char {
    last_error_ptr()
}

/// # Safety
/// `params` points to a valid `llama_spec_plugin_params` whose model outlives the plugin.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_init(params: *const LlamaSpecPluginParams) -> *mut c_void {
    boundary_value(std::ptr::null_mut(), || {
        // SAFETY: caller contract.
        let p = unsafe { params.as_ref() }.ok_or_else(|| FfiError::null("params"))?;
        if p.abi_version != LLAMA_SPEC_PLUGIN_ABI_VERSION {
            return Err(FfiError::invalid(format!(
                "host speaks plugin ABI {}, libkolm_rsd speaks {LLAMA_SPEC_PLUGIN_ABI_VERSION}",
                p.abi_version
            )));
        }
        let model = NonNull::new(p.model.cast_mut()).ok_or_else(|| FfiError::null("params.model"))?;
        // SAFETY: both strings are NULL or NUL-terminated per the ABI.
        let (path, arg) = unsafe { (c_str(p.model_path, "model_path")?, c_str(p.arg, "arg")?) };
        let mut cfg = EngineConfig::from_plugin_arg(arg, path).map_err(|e| FfiError::invalid(e.to_string()))?;
        cfg.n_seq = p.n_seq.max(1) as usize;
        // The host's limit caps `nmax=` of --spec-plugin-arg (default: as long as a verify stays exact); 0 keeps the
        // plugin's bookkeeping and drafts nothing, the fixed cost of the plugin path on its own.
        cfg.n_max = cfg.n_max.min(usize::try_from(p.n_max).unwrap_or(0)).min(cfg.n_max_cap());
        if !p.ctx.is_null() {
            // SAFETY: the host's target context is live for the plugin's lifetime; plain reads.
            unsafe {
                cfg.n_ctx = sys::llama_n_ctx(p.ctx);
                cfg.n_threads = sys::llama_n_threads(p.ctx);
            }
        }
        // SAFETY: the host owns the model and keeps it alive until llama_spec_plugin_free.
        let model = unsafe { Model::borrowed(model) };
        let engine = Engine::new(&model, cfg).map_err(|e| FfiError::invalid(format!("kolm-rsd: {e}")))?;
        eprintln!("kolm-rsd: {}", engine.describe());
        Ok(Box::into_raw(Box::new(KolmRsd::new(engine))).cast())
    })
}

/// # Safety
/// `plugin` came from init; `prompt` holds `n_prompt` tokens.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_begin(plugin_ptr: *mut c_void, seq_id: i32, prompt: *const i32, n_prompt: i32) {
    boundary_value((), || {
        // SAFETY: caller contract.
        let p = unsafe { plugin(plugin_ptr)? };
        let s = seq(p, seq_id)?;
        // SAFETY: prompt holds n_prompt tokens when non-null.
        let prompt = unsafe { slice(prompt, n_prompt) };
        p.engine.begin(s, prompt);
        Ok(())
    })
}

/// Optional symbol (docs/plugin-abi.md): the request just begun on `seq_id` comes with a predicted output.
///
/// # Safety
/// `plugin` came from init; `tokens` is NULL with `n_tokens` ≤ 0, or holds `n_tokens` ids.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_predict(plugin_ptr: *mut c_void, seq_id: i32, tokens: *const i32, n_tokens: i32) {
    boundary_value((), || {
        // SAFETY: caller contract.
        let p = unsafe { plugin(plugin_ptr)? };
        let s = seq(p, seq_id)?;
        if tokens.is_null() && n_tokens > 0 {
            return Err(FfiError::null("tokens"));
        }
        // SAFETY: tokens holds n_tokens ids when non-null, per the caller.
        let tokens = unsafe { slice(tokens, n_tokens) };
        p.engine.predict(s, tokens);
        Ok(())
    })
}

/// Optional symbol (docs/plugin-abi.md): predicted tokens of the current request on `seq_id` that the target
/// kept and discarded in drafts. 0 on success, -1 on error (last_error says why; nothing written).
///
/// # Safety
/// `plugin` came from init; `n_accepted` and `n_rejected` point to writable `int64_t`s.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_prediction_counts(
    plugin_ptr: *mut c_void,
    seq_id: i32,
    n_accepted: *mut i64,
    n_rejected: *mut i64,
) -> i32 {
    boundary_value(-1, || {
        // SAFETY: caller contract.
        let p = unsafe { plugin(plugin_ptr)? };
        let s = seq(p, seq_id)?;
        let acc = NonNull::new(n_accepted).ok_or_else(|| FfiError::null("n_accepted"))?;
        let rej = NonNull::new(n_rejected).ok_or_else(|| FfiError::null("n_rejected"))?;
        let (a, r) = p.engine.prediction_counts(s);
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        // SAFETY: both non-null and writable per the caller.
        unsafe {
            acc.as_ptr().write(clamp(a));
            rej.as_ptr().write(clamp(r));
        }
        Ok(0)
    })
}

/// # Safety
/// `p` is NULL or points to `n` readable tokens.
unsafe fn slice<'a>(p: *const i32, n: i32) -> &'a [i32] {
    if p.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: non-null, n > 0, valid per the caller.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

/// # Safety
/// `plugin` came from init; `tokens` holds `n_tokens` ids; `out` has room for `n_max` ids.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_draft(
    plugin_ptr: *mut c_void,
    seq_id: i32,
    tokens: *const i32,
    n_tokens: i32,
    id_last: i32,
    n_max: i32,
    out: *mut i32,
) -> i32 {
    boundary_value(-1, || {
        // SAFETY: caller contract.
        let p = unsafe { plugin(plugin_ptr)? };
        let s = seq(p, seq_id)?;
        let n_max = usize::try_from(n_max).unwrap_or(0);
        if n_max == 0 {
            return Ok(0);
        }
        if out.is_null() {
            return Err(FfiError::null("out"));
        }
        // SAFETY: tokens holds n_tokens ids per the caller.
        let toks = unsafe { slice(tokens, n_tokens) };
        // SAFETY: out is non-null with room for n_max ids per the ABI.
        Ok(unsafe { p.propose_into(s, toks, id_last, n_max, out) } as i32)
    })
}

/// # Safety
/// `plugin` came from init.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_accept(plugin_ptr: *mut c_void, seq_id: i32, n_accepted: i32) {
    boundary_value((), || {
        // SAFETY: caller contract.
        let p = unsafe { plugin(plugin_ptr)? };
        let s = seq(p, seq_id)?;
        p.engine.accept(s, usize::try_from(n_accepted).unwrap_or(0));
        Ok(())
    })
}

/// # Safety
/// `plugin` is NULL or came from init and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn llama_spec_plugin_free(plugin_ptr: *mut c_void) {
    boundary_value((), || {
        if !plugin_ptr.is_null() {
            // SAFETY: created by Box::into_raw in init, freed once.
            let p = unsafe { Box::from_raw(plugin_ptr.cast::<KolmRsd>()) };
            eprintln!(
                "kolm-rsd: {}, heap {} KiB live (peak {} KiB)",
                p.engine.summary(),
                crate::heap::live() >> 10,
                crate::heap::peak() >> 10
            );
        }
        Ok(())
    });
    set_last_error("");
}
