//! A GGUF model's vocabulary as llama.cpp reads it, for Python: what the plugin's drafter is made from.

use kolm_rsd::llama::{LlamaError, Model, ModelOptions};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::{Path, PathBuf};

/// Loads a GGUF on the CPU with llama.cpp's log silenced (its load messages would fill the host's stderr).
pub fn load_gguf(path: &Path) -> Result<Model, LlamaError> {
    kolm_rsd::llama::quiet_logs();
    Model::load(path, &ModelOptions { n_gpu_layers: 0 })
}

/// The vocabulary of a GGUF model as llama.cpp reads it: every token's raw text in id order, and the ids of its
/// control and end-of-generation tokens (what the plugin's drafter gets from the same model).
#[pyfunction]
pub fn gguf_vocab(py: Python<'_>, path: PathBuf) -> PyResult<(Vec<Py<PyBytes>>, Vec<i32>)> {
    let (texts, control) = py
        .detach(|| {
            let model = load_gguf(&path)?;
            let texts = kolm_rsd::vocab::token_texts(&model);
            let drafter = kolm_rsd::vocab::drafter_texts(&model, &texts);
            let control = (0..texts.len() as i32).filter(|&t| drafter.is_control(t)).collect::<Vec<_>>();
            Ok::<_, LlamaError>((texts.into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>(), control))
        })
        .map_err(|e| crate::error::KolmRsdError::new_err(e.to_string()))?;
    Ok((texts.iter().map(|t| PyBytes::new(py, t).unbind()).collect(), control))
}
