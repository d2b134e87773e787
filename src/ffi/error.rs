//! Stable result codes and the per-thread last-error message of the C ABI.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

/// Result of every fallible `kolm_rsd_*` call. Values are stable across versions; new ones are only added.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KolmRsdResult {
    Ok = 0,
    /// A required pointer was NULL.
    NullArgument = 1,
    /// An argument was out of range (sequence id, length, UTF-8 path…).
    InvalidArgument = 2,
    /// A file could not be read or written.
    Io = 3,
    /// A recipe pack was refused (bad JSON, version, hash, limits…); the message names the file and reason.
    BadPack = 4,
    /// The pack was compiled for another tokenizer.
    TokenizerMismatch = 5,
    /// A Rust panic was caught at the boundary; the handle should be freed.
    Panic = 6,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as the calling thread's last error.
pub fn set_last_error(msg: impl Into<String>) {
    let msg = msg.into().replace('\0', " ");
    LAST.with(|l| *l.borrow_mut() = CString::new(msg).unwrap_or_default());
}

/// Pointer to the thread's last message; valid until the next failing call on this thread.
pub fn last_error_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// An error on its way out through the ABI: a code and the words for it.
pub struct FfiError(pub KolmRsdResult, pub String);

impl FfiError {
    pub fn null(what: &str) -> FfiError {
        FfiError(KolmRsdResult::NullArgument, format!("{what} is NULL"))
    }
    pub fn invalid(msg: impl Into<String>) -> FfiError {
        FfiError(KolmRsdResult::InvalidArgument, msg.into())
    }
}

/// Runs `body` behind the panic boundary: Ok → `Ok`, Err and panics → their code with the message recorded.
pub fn boundary(body: impl FnOnce() -> Result<(), FfiError>) -> KolmRsdResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => KolmRsdResult::Ok,
        Ok(Err(FfiError(code, msg))) => {
            set_last_error(msg);
            code
        }
        Err(payload) => {
            set_last_error(format!("internal panic: {}", panic_text(&payload)));
            KolmRsdResult::Panic
        }
    }
}

/// Like `boundary` for functions that return a value instead of a code: `fallback` on error or panic.
pub fn boundary_value<T>(fallback: T, body: impl FnOnce() -> Result<T, FfiError>) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(FfiError(_, msg))) => {
            set_last_error(msg);
            fallback
        }
        Err(payload) => {
            set_last_error(format!("internal panic: {}", panic_text(&payload)));
            fallback
        }
    }
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown".into())
}
