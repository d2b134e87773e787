//! GGUF metadata and tensor directory, read without loading weights (gguf.h).

use super::{sys, LlamaError};
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

/// Where one tensor sits in the file and what it is.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml type id (`ggml_type`), and its name (e.g. "q4_K").
    pub ggml_type: u32,
    pub type_name: String,
    /// Dimensions, innermost first (`ne[0]` = row length).
    pub shape: Vec<i64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub size: u64,
}

/// An open GGUF directory (metadata only).
pub struct GgufFile {
    ctx: NonNull<sys::gguf_context>,
    path: String,
}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: owned context from gguf_init_from_file, freed once.
        unsafe { sys::gguf_free(self.ctx.as_ptr()) };
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, LlamaError> {
        let p = path.display().to_string();
        let err = |reason: &str| LlamaError::Gguf { path: p.clone(), reason: reason.into() };
        if !path.is_file() {
            return Err(err("no such file"));
        }
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| err("path contains NUL"))?;
        let params = sys::gguf_init_params { no_alloc: true, ctx: std::ptr::null_mut() };
        // SAFETY: c is a valid C string; with no_alloc and no ggml ctx only metadata is read.
        let ctx = unsafe { sys::gguf_init_from_file(c.as_ptr(), params) };
        let ctx = NonNull::new(ctx).ok_or_else(|| err("not a valid GGUF file"))?;
        Ok(GgufFile { ctx, path: p })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn key(&self, key: &str) -> Option<i64> {
        let k = CString::new(key).ok()?;
        // SAFETY: live context, NUL-terminated key.
        let id = unsafe { sys::gguf_find_key(self.ctx.as_ptr(), k.as_ptr()) };
        (id >= 0).then_some(id)
    }

    /// A string value, if the key exists and is a string.
    pub fn get_str(&self, key: &str) -> Option<String> {
        let id = self.key(key)?;
        // SAFETY: id is a valid key id; the type is checked before reading it as a string.
        unsafe {
            if sys::gguf_get_kv_type(self.ctx.as_ptr(), id) != sys::GGUF_TYPE_STRING {
                return None;
            }
            Some(CStr::from_ptr(sys::gguf_get_val_str(self.ctx.as_ptr(), id)).to_string_lossy().into_owned())
        }
    }

    /// An unsigned integer value of any width.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        let id = self.key(key)?;
        let c = self.ctx.as_ptr();
        // SAFETY: each getter is called only for its own type, as gguf.h requires.
        unsafe {
            match sys::gguf_get_kv_type(c, id) {
                sys::GGUF_TYPE_UINT32 => Some(sys::gguf_get_val_u32(c, id) as u64),
                sys::GGUF_TYPE_INT32 => u64::try_from(sys::gguf_get_val_i32(c, id)).ok(),
                sys::GGUF_TYPE_UINT64 => Some(sys::gguf_get_val_u64(c, id)),
                sys::GGUF_TYPE_UINT16 => Some(sys::gguf_get_val_u16(c, id) as u64),
                sys::GGUF_TYPE_UINT8 => Some(sys::gguf_get_val_u8(c, id) as u64),
                _ => None,
            }
        }
    }

    /// Length of an array value (e.g. `tokenizer.ggml.tokens`).
    pub fn array_len(&self, key: &str) -> Option<usize> {
        let id = self.key(key)?;
        // SAFETY: the type is checked to be an array before asking its length.
        unsafe { (sys::gguf_get_kv_type(self.ctx.as_ptr(), id) == sys::GGUF_TYPE_ARRAY).then(|| sys::gguf_get_arr_n(self.ctx.as_ptr(), id)) }
    }

    pub fn tensors(&self) -> Vec<TensorInfo> {
        let c = self.ctx.as_ptr();
        // SAFETY: ids 0..n are valid tensor ids; returned strings and ne arrays are owned by the context.
        unsafe {
            let n = sys::gguf_get_n_tensors(c);
            let base = sys::gguf_get_data_offset(c) as u64;
            (0..n)
                .map(|i| {
                    let t = sys::gguf_get_tensor_type(c, i);
                    let ne = std::slice::from_raw_parts(sys::gguf_get_tensor_ne(c, i), sys::GGML_MAX_DIMS as usize);
                    let mut shape: Vec<i64> = ne.to_vec();
                    while shape.len() > 1 && *shape.last().unwrap() == 1 {
                        shape.pop();
                    }
                    TensorInfo {
                        name: CStr::from_ptr(sys::gguf_get_tensor_name(c, i)).to_string_lossy().into_owned(),
                        ggml_type: t as u32,
                        type_name: CStr::from_ptr(sys::ggml_type_name(t)).to_string_lossy().into_owned(),
                        shape,
                        offset: base + sys::gguf_get_tensor_offset(c, i) as u64,
                        size: sys::gguf_get_tensor_size(c, i) as u64,
                    }
                })
                .collect()
        }
    }

    /// The LM head: `output.weight`, or `token_embd.weight` when the embeddings are tied.
    pub fn head_tensor(&self) -> Option<TensorInfo> {
        let all = self.tensors();
        let find = |n: &str| all.iter().find(|t| t.name == n).cloned();
        find("output.weight").or_else(|| find("token_embd.weight"))
    }
}
