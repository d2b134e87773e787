//! A loaded GGUF model and its vocabulary.

use super::{init, sys, LlamaError, Token};
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

/// How to load a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Layers on the GPU; 0 keeps everything on the CPU.
    pub n_gpu_layers: i32,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self { n_gpu_layers: 999 }
    }
}

/// An owned `llama_model`, or a borrowed one handed to the plugin by its host.
pub struct Model {
    ptr: NonNull<sys::llama_model>,
    owned: bool,
}

// SAFETY: llama_model is immutable after loading and llama.cpp reads it from many threads.
unsafe impl Send for Model {}
// SAFETY: as above; every method takes &self and only reads.
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the pointer, it came from llama_model_load_from_file and is freed once.
            unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
        }
    }
}

impl Model {
    /// Loads a GGUF file; a missing file or a bad GGUF is an error naming the path.
    pub fn load(path: &Path, opts: &ModelOptions) -> Result<Model, LlamaError> {
        let err = |reason: &str| LlamaError::Load { path: path.display().to_string(), reason: reason.into() };
        if !path.is_file() {
            return Err(err("no such file"));
        }
        init();
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| err("path contains NUL"))?;
        // SAFETY: default params are plain data; c is a valid NUL-terminated string for the call.
        let ptr = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = opts.n_gpu_layers;
            sys::llama_model_load_from_file(c.as_ptr(), p)
        };
        NonNull::new(ptr).map(|ptr| Model { ptr, owned: true }).ok_or_else(|| err("llama.cpp could not load it (see its log)"))
    }

    /// Wraps a model owned by someone else (the plugin's host).
    ///
    /// # Safety
    /// `ptr` must point to a live `llama_model` that outlives the returned value.
    pub unsafe fn borrowed(ptr: NonNull<sys::llama_model>) -> Model {
        Model { ptr, owned: false }
    }

    pub fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is live; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    pub fn n_vocab(&self) -> usize {
        // SAFETY: live vocab pointer.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    pub fn n_embd(&self) -> usize {
        // SAFETY: live model pointer.
        unsafe { sys::llama_model_n_embd(self.ptr.as_ptr()) as usize }
    }

    /// The raw vocabulary text of a token (as stored in the GGUF, e.g. with 'Ġ' for a leading space).
    pub fn token_text(&self, t: Token) -> &[u8] {
        assert!((t as usize) < self.n_vocab(), "token {t} out of range");
        // SAFETY: t is in range; llama.cpp returns a NUL-terminated string owned by the vocab.
        unsafe { CStr::from_ptr(sys::llama_vocab_get_text(self.vocab(), t)).to_bytes() }
    }

    /// The bytes a token renders to in output text (special tokens rendered too).
    pub fn token_piece(&self, t: Token) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: buf is writable for buf.len() bytes; the vocab is live.
            let n = unsafe {
                sys::llama_token_to_piece(self.vocab(), t, buf.as_mut_ptr().cast(), buf.len() as i32, 0, true)
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize((-n) as usize, 0);
        }
    }

    pub fn detokenize(&self, tokens: &[Token]) -> String {
        let bytes: Vec<u8> = tokens.iter().flat_map(|&t| self.token_piece(t)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn is_eog(&self, t: Token) -> bool {
        // SAFETY: live vocab pointer; llama.cpp range-checks the id.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), t) }
    }

    /// True for control/special tokens (end of turn, chat-template markers, …).
    pub fn is_control(&self, t: Token) -> bool {
        // SAFETY: live vocab pointer; t is a valid id for it.
        let attr = unsafe { sys::llama_vocab_get_attr(self.vocab(), t) };
        attr & (sys::LLAMA_TOKEN_ATTR_CONTROL | sys::LLAMA_TOKEN_ATTR_USER_DEFINED) != 0
    }

    /// Tokenizes text; `special` parses special-token text such as `<|im_start|>`.
    pub fn tokenize(&self, text: &str, add_bos: bool, special: bool) -> Result<Vec<Token>, LlamaError> {
        let mut out = vec![0 as Token; text.len() + 8];
        loop {
            // SAFETY: text is valid for text.len() bytes; out is writable for out.len() tokens.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast(),
                    text.len() as i32,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_bos,
                    special,
                )
            };
            if n >= 0 {
                out.truncate(n as usize);
                return Ok(out);
            }
            if n == i32::MIN {
                return Err(LlamaError::Tokenize("text too long".into()));
            }
            out.resize((-n) as usize, 0);
        }
    }

    /// A GGUF metadata value as a string, if present.
    pub fn meta(&self, key: &str) -> Option<String> {
        let k = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: k is NUL-terminated; buf is writable for its length.
            let n = unsafe { sys::llama_model_meta_val_str(self.ptr.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return None;
            }
            if (n as usize) < buf.len() {
                buf.truncate(n as usize);
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize(n as usize + 1, 0);
        }
    }

    /// Applies the model's own chat template to one user message, ready for generation.
    /// `None` when the model has no template llama.cpp knows.
    pub fn chat_prompt(&self, user: &str) -> Option<String> {
        // SAFETY: the model is live; a NULL name asks for the default template.
        let tmpl = unsafe { sys::llama_model_chat_template(self.ptr.as_ptr(), std::ptr::null()) };
        if tmpl.is_null() {
            return None;
        }
        let role = CString::new("user").unwrap();
        let content = CString::new(user.replace('\0', "")).unwrap();
        let msg = sys::llama_chat_message { role: role.as_ptr(), content: content.as_ptr() };
        let mut buf = vec![0u8; 2 * user.len() + 256];
        loop {
            // SAFETY: tmpl is NUL-terminated and owned by the model; msg points to live CStrings; buf is writable.
            let n = unsafe { sys::llama_chat_apply_template(tmpl, &msg, 1, true, buf.as_mut_ptr().cast(), buf.len() as i32) };
            if n < 0 {
                return None;
            }
            if (n as usize) <= buf.len() {
                buf.truncate(n as usize);
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize(n as usize, 0);
        }
    }
}
