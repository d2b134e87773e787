//! Arguments as Python passes them: token ids as a list of ints or as the bytes of an int32 array (what
//! `numpy.ndarray.tobytes()` gives, one copy instead of one Python int per token), token texts as bytes or str.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// Token ids from `bytes` (int32, native byte order) or any sequence of ints.
pub fn token_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i32>> {
    match obj.cast::<PyBytes>() {
        Ok(b) => {
            let b = b.as_bytes();
            if b.len() % 4 != 0 {
                return Err(PyValueError::new_err(format!("token bytes: {} bytes is not a whole number of int32 ids", b.len())));
            }
            Ok(b.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect())
        }
        Err(_) => obj.extract(),
    }
}

/// Each token's raw vocabulary text (bytes, or str taken as UTF-8), in id order.
pub fn token_texts(seq: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    seq.try_iter()?
        .enumerate()
        .map(|(id, item)| {
            let item = item?;
            if let Ok(s) = item.cast::<PyString>() {
                Ok(s.to_cow()?.as_bytes().to_vec())
            } else if let Ok(b) = item.cast::<PyBytes>() {
                Ok(b.as_bytes().to_vec())
            } else {
                Err(PyValueError::new_err(format!("token text of id {id} is neither bytes nor str")))
            }
        })
        .collect()
}

/// Borrowed views of `texts`, as the core takes them.
pub fn views(texts: &[Vec<u8>]) -> Vec<&[u8]> {
    texts.iter().map(Vec::as_slice).collect()
}
