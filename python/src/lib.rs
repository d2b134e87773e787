//! `kolm_rsd._native`: the Python binding of the kolm-rsd engine, a sibling of the C ABI (`src/ffi`) over the
//! same `Engine`: packs, the drafter with its break-even control and the miss log are the core's; this layer
//! only converts arguments, releases the GIL around the work and turns errors into Python exceptions.

mod drafter;
mod error;
mod pack;
mod tokens;
mod vocab;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KolmRsdError", py.get_type::<error::KolmRsdError>())?;
    m.add("PackError", py.get_type::<error::PackError>())?;
    m.add("TokenizerMismatchError", py.get_type::<error::TokenizerMismatchError>())?;
    m.add_class::<pack::Pack>()?;
    m.add_class::<drafter::Drafter>()?;
    m.add_class::<drafter::Stats>()?;
    m.add_function(wrap_pyfunction!(pack::tokenizer_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(pack::pack_beside, m)?)?;
    m.add_function(wrap_pyfunction!(pack::default_miss_log, m)?)?;
    m.add_function(wrap_pyfunction!(vocab::gguf_vocab, m)?)?;
    m.add("MAX_DRAFT", kolm_rsd::draft::step::INVARIANT_DRAFT)?;
    Ok(())
}
