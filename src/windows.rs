//! The window keys that end a history, hashed once for every table that reads them. At each place of a draft
//! the pack's index and then the live index look up the same literal and shape windows, and each hashed them
//! (issue 17 asks the live index to add at most 1 µs to a `propose`; hashing once took the bench's matched calls
//! from +1.12/+1.36 to +0.83/+0.93 µs p99, with the overlap of the first lookup and the feed). The shape keys are
//! made only when a table first asks for them: a literal hit in the pack needs none.

use crate::hash::literal_suffix_keys;
use crate::pack::MAX_N;
use crate::shape::ShapeTable;

/// The keys of the last 1, 2, … tokens of a history: `literal()[n - 1]` is the key of the last `n`.
pub struct Windows {
    /// The history's last tokens, oldest first (the shape keys are made from them later).
    tail: [i32; MAX_N],
    len: usize,
    literal: [u64; MAX_N],
    n_literal: usize,
    shape: [u64; MAX_N],
    /// Shape keys made so far (None: not yet asked for), and how many may be asked for.
    n_shape: Option<usize>,
    max_shape: usize,
}

impl Windows {
    /// Literal windows up to `max_literal` tokens, shape windows (on demand) up to `max_shape`.
    #[inline]
    pub fn new(history: &[i32], max_literal: usize, max_shape: usize) -> Windows {
        let len = max_literal.max(max_shape).min(MAX_N).min(history.len());
        let mut w = Windows { tail: [0; MAX_N], len, literal: [0; MAX_N], n_literal: 0, shape: [0; MAX_N], n_shape: None, max_shape };
        w.tail[..len].copy_from_slice(&history[history.len() - len..]);
        w.n_literal = literal_suffix_keys(&w.tail[..len], max_literal, &mut w.literal);
        w
    }

    /// Literal keys, shortest window first.
    #[inline]
    pub fn literal(&self) -> &[u64] {
        &self.literal[..self.n_literal]
    }

    /// Shape keys under `shapes`, shortest window first. Every caller of one `Windows` must pass the same table
    /// ([`ShapeTable::same`]): the keys are made once, by the first.
    #[inline]
    pub fn shape(&mut self, shapes: &ShapeTable) -> &[u64] {
        self.literal_and_shape(shapes).1
    }

    /// Both kinds of keys, the shape keys made under `shapes` if they were not yet ([`Windows::shape`]).
    #[inline]
    pub fn literal_and_shape(&mut self, shapes: &ShapeTable) -> (&[u64], &[u64]) {
        let n = *self.n_shape.get_or_insert_with(|| shapes.suffix_keys(&self.tail[..self.len], self.max_shape, &mut self.shape));
        (&self.literal[..self.n_literal], &self.shape[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::window_key;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keys_are_the_reference_window_keys(tokens in proptest::collection::vec(0i32..20, 0..40), max_l in 0usize..12, max_s in 0usize..12) {
            let sh = crate::shape::tests::table();
            let mut w = Windows::new(&tokens, max_l, max_s);
            let (literal, shape) = {
                let (l, s) = w.literal_and_shape(&sh);
                (l.to_vec(), s.to_vec())
            };
            prop_assert_eq!(literal.len(), max_l.min(tokens.len()));
            prop_assert_eq!(shape.len(), max_s.min(tokens.len()));
            for (k, key) in literal.iter().enumerate() {
                let window: Vec<u32> = tokens[tokens.len() - k - 1..].iter().map(|&t| t as u32).collect();
                prop_assert_eq!(*key, window_key(&window));
            }
            for (k, key) in shape.iter().enumerate() {
                prop_assert_eq!(*key, sh.window_key(&tokens[tokens.len() - k - 1..]));
            }
            prop_assert_eq!(w.shape(&sh), &shape[..], "made once");
        }
    }
}
