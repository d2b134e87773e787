//! A model's vocabulary as kolm-rsd reads it: token texts in id order, the tokenizer fingerprint packs and
//! shortlists are checked against, and the drafter's view (texts plus which tokens are control tokens).
//! Below `engine`, `compile` and `shortlist`, which all need it.

use crate::draft::syntax::TokenTexts;
use crate::llama::{Model, Token};

/// The vocabulary's token texts, in id order: what shapes and the tokenizer fingerprint are made of.
pub fn token_texts(model: &Model) -> Vec<&[u8]> {
    (0..model.n_vocab() as Token).map(|t| model.token_text(t)).collect()
}

/// The vocabulary as the drafter reads it: every token's text, and which are control tokens.
pub fn drafter_texts(model: &Model, texts: &[&[u8]]) -> TokenTexts {
    TokenTexts::new(texts).with_control(|t| model.is_control(t) || model.is_eog(t))
}

/// The tokenizer fingerprint of a model (what packs and shortlists are checked against).
pub fn fingerprint(model: &Model) -> String {
    crate::pack::tokenizer_fingerprint(token_texts(model).into_iter())
}
