//! A thin safe layer over the pinned llama.cpp, holding only what kolm-rsd needs: load a GGUF model, read
//! its vocabulary, tokenize, decode batches, read logits, read GGUF metadata and tensor info.
//! Everything above this room speaks Rust types; everything below is `sys`.

pub mod sys;

mod context;
mod gguf;
mod model;

pub use context::{Batch, Context, ContextOptions};
pub use gguf::{GgufFile, TensorInfo};
pub use model::{Model, ModelOptions};

use std::sync::Once;

/// A token id, as llama.cpp has it.
pub type Token = i32;

/// What went wrong inside llama.cpp, said in words that name the input.
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("{path}: cannot load the model ({reason})")]
    Load { path: String, reason: String },
    #[error("cannot create a llama context: {0}")]
    Context(String),
    #[error("llama_decode failed with code {0}")]
    Decode(i32),
    #[error("tokenize failed: {0}")]
    Tokenize(String),
    #[error("{path}: {reason}")]
    Gguf { path: String, reason: String },
}

static INIT: Once = Once::new();

/// Initializes llama.cpp's backends once per process; every entry point that touches llama.cpp calls it.
pub fn init() {
    INIT.call_once(|| {
        // SAFETY: llama_backend_init takes no arguments and is made idempotent here by `Once`.
        unsafe { sys::llama_backend_init() };
    });
}

/// Silences llama.cpp's logging to stderr (the CLI and tests keep their own output readable).
pub fn quiet_logs() {
    unsafe extern "C" fn drop_log(_level: sys::ggml_log_level, _text: *const std::os::raw::c_char, _user: *mut std::ffi::c_void) {}
    // SAFETY: the callback is a plain function valid for the whole process and ignores its arguments.
    unsafe { sys::llama_log_set(Some(drop_log), std::ptr::null_mut()) };
}

/// The index of the largest logit (the greedy choice); ties go to the lowest id, as in llama.cpp.
pub fn argmax(logits: &[f32]) -> Token {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as Token
}
