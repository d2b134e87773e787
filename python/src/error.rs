//! The exceptions of `kolm_rsd` and how the engine's errors become them: every message names the file and
//! the reason, as the C ABI's last error does.

use kolm_rsd::engine::EngineError;
use kolm_rsd::pack::{PackError as CorePackError, PackErrorKind};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::{create_exception, PyErr};

create_exception!(kolm_rsd, KolmRsdError, PyException, "Base class of kolm-rsd's errors.");
create_exception!(kolm_rsd, PackError, KolmRsdError, "A recipe pack was refused or could not be read (the message names the file and why).");
create_exception!(
    kolm_rsd,
    TokenizerMismatchError,
    PackError,
    "The pack was compiled for another tokenizer than the one whose token texts were given."
);

/// A refused pack as the exception its reason calls for.
fn pack_error(e: CorePackError) -> PyErr {
    match e.kind {
        PackErrorKind::TokenizerMismatch { .. } => TokenizerMismatchError::new_err(e.to_string()),
        _ => PackError::new_err(e.to_string()),
    }
}

pub fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Pack(p) => pack_error(p),
        // The engine reads only the pack from disk.
        EngineError::Io(..) => PackError::new_err(e.to_string()),
        EngineError::Arg(_) => PyValueError::new_err(e.to_string()),
        EngineError::Draft(_) => KolmRsdError::new_err(e.to_string()),
    }
}
