//! `Pack`: a recipe pack loaded and validated by the core (optionally against a tokenizer), for inspection;
//! the tokenizer fingerprint; where the plugin looks for a model's pack and miss log.

use crate::error::engine_error;
use crate::tokens::{token_texts, views};
use kolm_rsd::pack::Pack as CorePack;
use pyo3::prelude::*;
use std::path::{Path, PathBuf};

/// A validated recipe pack (`*.recipes.json`).
#[pyclass(frozen, module = "kolm_rsd")]
pub struct Pack {
    path: PathBuf,
    pack: CorePack,
}

#[pymethods]
impl Pack {
    /// Loads and validates the pack at `path`; with `token_texts`, also refuses a pack compiled for another
    /// tokenizer (`TokenizerMismatchError`) or naming token ids outside it.
    #[new]
    #[pyo3(signature = (path, token_texts=None))]
    fn new(py: Python<'_>, path: PathBuf, token_texts: Option<&Bound<'_, PyAny>>) -> PyResult<Pack> {
        let texts = token_texts.map(self::token_texts).transpose()?;
        let pack = py.detach(|| match &texts {
            Some(t) => kolm_rsd::engine::read_pack(&path, Some(&views(t))),
            None => kolm_rsd::engine::read_pack(&path, None),
        });
        Ok(Pack { pack: pack.map_err(engine_error)?, path })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Fingerprint of the tokenizer the pack was compiled for (see `tokenizer_fingerprint`).
    #[getter]
    fn tokenizer(&self) -> String {
        self.pack.meta.tokenizer.clone()
    }

    /// The name of the model the pack was compiled from.
    #[getter]
    fn model(&self) -> String {
        self.pack.meta.model.name.clone()
    }

    #[getter]
    fn arch(&self) -> String {
        self.pack.meta.model.arch.clone()
    }

    /// Number of recipes.
    fn __len__(&self) -> usize {
        self.pack.entries().len()
    }

    #[getter]
    fn content_hash(&self) -> String {
        self.pack.content_hash().to_string()
    }

    /// Share of held-out positions the pack's recipes covered at compile time, when measured.
    #[getter]
    fn coverage(&self) -> Option<f64> {
        self.pack.meta.coverage
    }

    /// Prompts compiled and held out, samples per prompt, temperature and tokens per sample.
    #[getter]
    fn compile<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let c = &self.pack.meta.compile;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("prompts", c.prompts)?;
        d.set_item("heldout", c.heldout)?;
        d.set_item("k", c.k)?;
        d.set_item("temperature", c.temperature)?;
        d.set_item("max_tokens", c.max_tokens)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("Pack({:?}, model={:?}, {} recipes, tokenizer {})", self.path.display().to_string(), self.pack.meta.model.name, self.pack.entries().len(), self.pack.meta.tokenizer)
    }
}

/// The tokenizer fingerprint packs are checked against: SHA-256 over every token's raw text (u32 LE length,
/// then bytes) in id order, first 16 bytes in hex. The same function the plugin applies to llama.cpp's vocabulary.
#[pyfunction]
pub fn tokenizer_fingerprint(py: Python<'_>, token_texts: &Bound<'_, PyAny>) -> PyResult<String> {
    let texts = self::token_texts(token_texts)?;
    Ok(py.detach(|| kolm_rsd::pack::tokenizer_fingerprint(texts.iter().map(Vec::as_slice))))
}

/// Where the plugin finds a model's pack without flags: `dir/M.gguf` → `dir/M.recipes.json`.
#[pyfunction]
pub fn pack_beside(model: PathBuf) -> PathBuf {
    kolm_rsd::engine::pack_beside(&model)
}

/// The plugin's default miss log for a model: `~/.cache/kolm-rsd/misses/<model stem>.jsonl`.
#[pyfunction]
pub fn default_miss_log(model: PathBuf) -> PathBuf {
    kolm_rsd::engine::default_miss_log(Path::new(&model))
}
