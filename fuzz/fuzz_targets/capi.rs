//! The C ABI driven by arbitrary call sequences: `kolm_rsd_*` and the llama.cpp plugin entry points, with
//! NULL handles and buffers, out-of-range sequence ids, tokens at and beyond the vocabulary's edge, drafts
//! asked of 0..64 tokens, accepts larger than the draft, a fuzzed `--spec-plugin-arg`, calls after errors,
//! frees of NULL. Every pointer passed is NULL or valid for the length passed with it: the test is the
//! library's checks, not the caller's undefined behaviour. No call may panic (the boundary would turn a
//! panic into a code; here that is a finding).
#![no_main]

use kolm_rsd::ffi::api::*;
use kolm_rsd::ffi::error::KolmRsdResult;
use kolm_rsd::ffi::plugin::*;
use kolm_rsd_fuzz::{model, pack_path, Op, Ops};
use libfuzzer_sys::fuzz_target;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};

fn no_panic(code: KolmRsdResult) {
    assert_ne!(code, KolmRsdResult::Panic, "{}", last_error());
}

fn last_error() -> String {
    // SAFETY: kolm_rsd_last_error never returns NULL and the string lives until the next failing call.
    unsafe { CStr::from_ptr(kolm_rsd_last_error()) }.to_string_lossy().into_owned()
}

/// One run of the ops against a `kolm_rsd_load` handle (or NULL when `null_handle`).
fn api(ops: Ops, flags: u8, n_vocab: i32) {
    let pack = CString::new(pack_path().to_string_lossy().into_owned()).unwrap();
    let mut opts = KolmRsdOptions { n_seq: 0, n_max: 0, adaptive: true, miss_log: null() };
    // SAFETY: opts is a valid, writable options struct.
    no_panic(unsafe { kolm_rsd_options_default(&mut opts) });
    opts.n_seq = u32::from(flags >> 4);
    opts.n_max = u32::from(flags & 0x0c) * 4;
    opts.adaptive = flags & 0x02 != 0;
    let mut h: *mut KolmRsd = null_mut();
    let pack_ptr = if flags & 1 == 0 { pack.as_ptr() } else { null() };
    // SAFETY: the model is live for the process; pack is NUL-terminated; opts and h are valid.
    let code = unsafe { kolm_rsd_load(model().as_ptr(), pack_ptr, &opts, &mut h) };
    no_panic(code);
    assert_eq!(code == KolmRsdResult::Ok, !h.is_null());
    let mut history: Vec<i32> = Vec::new();
    let mut out = vec![0i32; 64];
    for op in ops {
        // seq -128 stands for a NULL handle.
        let handle = |seq: i32| if seq == -128 { null_mut() } else { h };
        match op {
            Op::Begin { seq, prompt } => {
                history = prompt;
                let p = if history.is_empty() { null() } else { history.as_ptr() };
                // SAFETY: handle is NULL or live; p is NULL or holds history.len() tokens.
                no_panic(unsafe { kolm_rsd_begin(handle(seq), seq, p, history.len()) });
            }
            Op::Propose { seq, n_max, produced, id_last } => {
                history.extend_from_slice(&produced);
                let mut n_out = usize::MAX;
                // n_max of 64 with a NULL buffer: the library must refuse it.
                let buf = if n_max == 64 { null_mut() } else { out.as_mut_ptr() };
                // SAFETY: handle NULL or live; history valid for its length; buf NULL or 64 writable ids.
                let code = unsafe { kolm_rsd_propose(handle(seq), seq, history.as_ptr(), history.len(), id_last, n_max, buf, &mut n_out) };
                no_panic(code);
                if code == KolmRsdResult::Ok {
                    assert!(n_out <= n_max);
                } else {
                    assert!(!last_error().is_empty());
                }
                history.push(id_last);
            }
            // SAFETY: handle is NULL or live.
            Op::Accept { seq, n } => no_panic(unsafe { kolm_rsd_accept(handle(seq), seq, n) }),
            Op::Wait { seq, .. } => {
                let mut st = KolmRsdStats::default();
                // SAFETY: handle NULL or live; st writable.
                no_panic(unsafe { kolm_rsd_get_stats(handle(seq), &mut st) });
                // SAFETY: a NULL output must be refused.
                assert_eq!(unsafe { kolm_rsd_get_stats(h, null_mut()) }, KolmRsdResult::NullArgument);
            }
            Op::Miss { context, token } => {
                let p = if context.is_empty() { null() } else { context.as_ptr() };
                // SAFETY: h NULL or live; p NULL or holds context.len() tokens.
                no_panic(unsafe { kolm_rsd_observe_miss(h, p, context.len(), token) });
            }
        }
    }
    let _ = n_vocab;
    // SAFETY: h came from kolm_rsd_load (or is NULL) and is not used again; NULL is a no-op.
    unsafe {
        kolm_rsd_free(h);
        kolm_rsd_free(null_mut());
    }
}

/// The same ops through the plugin entry points, with a fuzzed `--spec-plugin-arg`.
fn plugin(ops: Ops, arg: &[u8], n_seq: u32) {
    let model_path = CString::new(kolm_rsd::fetch::model(kolm_rsd::fetch::DEFAULT_MODEL, false).unwrap().to_string_lossy().into_owned()).unwrap();
    // The miss log stays off whatever the fuzzer wrote: the run must not write files.
    let mut a: Vec<u8> = arg.iter().copied().filter(|&b| b != 0).collect();
    a.extend_from_slice(b",misslog=off");
    let arg = CString::new(a).unwrap();
    let params = LlamaSpecPluginParams {
        abi_version: LLAMA_SPEC_PLUGIN_ABI_VERSION,
        model: model().as_ptr(),
        ctx: null_mut(),
        model_path: model_path.as_ptr(),
        arg: arg.as_ptr(),
        n_seq,
        n_max: 16,
    };
    // SAFETY: params is valid and its model outlives the plugin.
    let p: *mut c_void = unsafe { llama_spec_plugin_init(&params) };
    if p.is_null() {
        assert!(!last_error().starts_with("internal panic"), "{}", last_error());
        return;
    }
    let mut history: Vec<i32> = Vec::new();
    let mut out = vec![0i32; 64];
    for op in ops {
        match op {
            Op::Begin { seq, prompt } => {
                history = prompt;
                // SAFETY: p is live; history holds its length in tokens.
                unsafe { llama_spec_plugin_begin(p, seq, history.as_ptr(), history.len() as i32) };
            }
            Op::Propose { seq, n_max, produced, id_last } => {
                history.extend_from_slice(&produced);
                // SAFETY: p live; history valid; out has room for 64 ≥ n_max ids.
                let n = unsafe { llama_spec_plugin_draft(p, seq, history.as_ptr(), history.len() as i32, id_last, n_max as i32, out.as_mut_ptr()) };
                assert!(n <= n_max as i32, "{n} > {n_max}");
                if n < 0 {
                    assert!(!last_error().starts_with("internal panic"), "{}", last_error());
                }
                history.push(id_last);
            }
            // SAFETY: p is live.
            Op::Accept { seq, n } => unsafe { llama_spec_plugin_accept(p, seq, n as i32 - 128) },
            Op::Wait { .. } | Op::Miss { .. } => {}
        }
        assert!(!last_error().starts_with("internal panic"), "{}", last_error());
    }
    // SAFETY: p came from init and is not used again; NULL is a no-op.
    unsafe {
        llama_spec_plugin_free(p);
        llama_spec_plugin_free(null_mut());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let n_vocab = model().n_vocab() as i32;
    if flags & 0x80 == 0 {
        api(Ops::new(rest, n_vocab), flags, n_vocab);
    } else {
        let Some((&len, rest)) = rest.split_first() else { return };
        let (arg, rest) = rest.split_at(usize::from(len % 64).min(rest.len()));
        plugin(Ops::new(rest, n_vocab), arg, u32::from(flags & 0x0f));
    }
});
