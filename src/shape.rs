//! Token → shape class, from the token's text.
//!
//! A shape abstracts the parts of a prefix that vary between otherwise identical requests (names,
//! numbers, free text) so that `{"name": "Ann", "age": ` and `{"name": "Bob", "age": ` produce the
//! same shape sequence, while structure (punctuation, quotes, a few keywords) stays exact.
//!
//! Classes are `u32`: a *literal* token maps to its own id (`< 2^31`); an *abstract* class has the
//! top bit set: `SHAPE_BIT | kind << 1 | leading_space`. Token texts may render a leading space as
//! `' '`, `'Ġ'` (byte-level BPE) or `'▁'` (SentencePiece); newlines and tabs as `'Ċ'`/`'ĉ'` or
//! themselves. All of these are normalised before classifying.
//!
//! String context: inside a double-quoted string, words, digits and other text (and keywords)
//! all become one "string content" class. To keep the shape of a window a function of the window
//! alone (identical at compile time and at run time, with no per-sequence state), quote parity is
//! counted from the *start of each window*: the first token of a window is taken to be outside
//! any string. A window that starts inside a string simply gets the inverted labelling, the same
//! way everywhere it occurs.

use crate::hash::{window_key, SuffixHasher};

/// Set on abstract classes; literal classes are token ids below it.
pub const SHAPE_BIT: u32 = 1 << 31;

/// Class of an unknown or out-of-range token.
pub const UNKNOWN: u32 = SHAPE_BIT;

const DIGITS: u32 = 1;
const WORD: u32 = 2;
const OTHER: u32 = 3;
const STRING: u32 = 4;
const SPACES: u32 = 5;
const NEWLINE: u32 = 6;
const NEWLINE_INDENT: u32 = 7;
const NEWLINES: u32 = 8;

/// Odd number of unescaped `"` in the text: flips string context for the tokens after it.
const F_TOGGLE: u8 = 1;
/// Becomes string content inside a string (words, digits, other text, keywords).
const F_STRINGY: u8 = 2;
/// Text starts with a space (kept in the string-content class too).
const F_SPACE: u8 = 4;

/// Keywords that stay literal: they carry structure in JSON and common programming languages.
const KEYWORDS: &[&[u8]] = &[
    b"true",
    b"false",
    b"null",
    b"None",
    b"True",
    b"False",
    b"def",
    b"return",
    b"if",
    b"else",
    b"elif",
    b"for",
    b"while",
    b"in",
    b"not",
    b"and",
    b"or",
    b"is",
    b"import",
    b"from",
    b"class",
    b"fn",
    b"let",
    b"const",
    b"var",
    b"function",
    b"pub",
    b"struct",
    b"impl",
    b"use",
    b"self",
    b"new",
    b"async",
    b"await",
    b"yield",
    b"with",
    b"as",
    b"try",
    b"except",
    b"raise",
    b"pass",
    b"break",
    b"continue",
    b"lambda",
    b"match",
    b"case",
];

/// Longest text classified; longer tokens are literal (they are rare and usually special).
const MAX_TEXT: usize = 256;

/// Whether a class is a literal token id (as opposed to an abstract class).
#[inline]
pub fn is_literal(class: u32) -> bool {
    class & SHAPE_BIT == 0
}

/// Per-vocabulary table of shape classes, one entry per token id. Clones share the table: the pack's index
/// and the live index read one copy (1.2 MB for a 152K vocabulary; two copies were more than a core's L2), and
/// window keys hashed once serve both ([`crate::windows::Windows`]).
#[derive(Clone, Debug, Default)]
pub struct ShapeTable {
    /// (class outside strings, flags) per token: one array, so one cache line per lookup.
    info: std::sync::Arc<[(u32, u8)]>,
}

impl ShapeTable {
    /// Builds the table from every token's text, indexed by token id.
    pub fn from_token_texts(texts: &[&[u8]]) -> ShapeTable {
        let mut buf = Vec::with_capacity(MAX_TEXT);
        let info = texts
            .iter()
            .enumerate()
            .map(|(id, text)| {
                let (class, f) = classify(text, &mut buf);
                (class.unwrap_or(id as u32), f)
            })
            .collect();
        ShapeTable { info }
    }

    /// Number of tokens in the vocabulary.
    pub fn len(&self) -> usize {
        self.info.len()
    }

    /// Whether `other` is this table (a clone of it), so shape keys made with one are the other's.
    pub fn same(&self, other: &ShapeTable) -> bool {
        std::sync::Arc::ptr_eq(&self.info, &other.info)
    }

    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }

    /// Class of a token outside any string.
    #[inline]
    pub fn class(&self, token: i32) -> u32 {
        self.class_in(token, false)
    }

    /// Class of a token, inside or outside a string.
    #[inline]
    pub fn class_in(&self, token: i32, in_string: bool) -> u32 {
        match self.get(token) {
            None => UNKNOWN,
            Some((_, f)) if in_string && f & F_STRINGY != 0 => {
                SHAPE_BIT | STRING << 1 | u32::from(f & F_SPACE != 0)
            }
            Some((class, _)) => class,
        }
    }

    /// Whether the token flips string context for the tokens after it.
    #[inline]
    pub fn toggles_string(&self, token: i32) -> bool {
        self.get(token).is_some_and(|(_, f)| f & F_TOGGLE != 0)
    }

    /// Whether the token is literal whatever its string context (its shape is its id).
    #[inline]
    pub fn always_literal(&self, token: i32) -> bool {
        self.get(token)
            .is_some_and(|(class, f)| is_literal(class) && f & F_STRINGY == 0)
    }

    #[inline]
    fn get(&self, token: i32) -> Option<(u32, u8)> {
        usize::try_from(token)
            .ok()
            .and_then(|t| self.info.get(t))
            .copied()
    }

    /// Shape classes of a window, string context counted from the window's first token.
    pub fn window_classes(&self, window: &[i32], out: &mut Vec<u32>) {
        out.clear();
        let mut in_string = false;
        for &t in window {
            out.push(self.class_in(t, in_string));
            in_string ^= self.toggles_string(t);
        }
    }

    /// Key of a window's shape (reference definition; see `suffix_keys` for the fast path).
    pub fn window_key(&self, window: &[i32]) -> u64 {
        let mut classes = Vec::with_capacity(window.len());
        self.window_classes(window, &mut classes);
        window_key(&classes)
    }

    /// Shape keys of the last 1, 2, …, `max_n` tokens: `out[n - 1]` is the key of the last `n`.
    /// Returns how many keys were written. One pass, no allocation.
    ///
    /// The string context of token `j` in the window starting at `s` is the parity of toggles in
    /// `s..j`, which is `u[s] ^ u[j]` where `u[x]` is the parity of toggles in `x..end`. Walking
    /// from the end, two hashers run side by side, one for windows whose `u[s]` is 0 and one for
    /// 1; the window starting at `s` reads the hasher matching `u[s]`.
    #[inline]
    pub fn suffix_keys(&self, tokens: &[i32], max_n: usize, out: &mut [u64]) -> usize {
        let n = max_n.min(tokens.len()).min(out.len());
        let mut acc = [SuffixHasher::new(); 2];
        let mut u = 0usize;
        for (i, &t) in tokens.iter().rev().take(n).enumerate() {
            let (outside, f) = self.get(t).unwrap_or((UNKNOWN, 0));
            let inside = if f & F_STRINGY != 0 {
                SHAPE_BIT | STRING << 1 | u32::from(f & F_SPACE != 0)
            } else {
                outside
            };
            u ^= usize::from(f & F_TOGGLE != 0);
            // acc[a] serves windows whose start has u = a: token i is in a string iff a ^ u = 1.
            acc[0].push(if u == 1 { inside } else { outside });
            acc[1].push(if u == 0 { inside } else { outside });
            out[i] = acc[u].key();
        }
        n
    }
}

/// Classifies one token text: `None` means literal (the class is the token id).
fn classify(raw: &[u8], buf: &mut Vec<u8>) -> (Option<u32>, u8) {
    if raw.is_empty() || raw.len() > MAX_TEXT || is_special(raw) {
        return (None, 0);
    }
    normalise(raw, buf);
    let text = buf.as_slice();
    let toggle = if odd_quotes(text) { F_TOGGLE } else { 0 };
    if text
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return (Some(SHAPE_BIT | whitespace_kind(text) << 1), 0);
    }
    let space = text[0] == b' ';
    let rest = if space { &text[1..] } else { text };
    let sp = if space { F_SPACE } else { 0 };
    if KEYWORDS.contains(&rest) {
        return (None, F_STRINGY | sp);
    }
    let is_word_byte = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_' || *b >= 0x80;
    if rest.contains(&b'"') || rest.iter().all(|b| b.is_ascii_punctuation()) {
        return (None, toggle);
    }
    let kind = if rest.iter().all(u8::is_ascii_digit) {
        DIGITS
    } else if (rest[0].is_ascii_alphabetic() || rest[0] >= 0x80) && rest.iter().all(is_word_byte) {
        WORD
    } else {
        OTHER
    };
    (
        Some(SHAPE_BIT | kind << 1 | u32::from(space)),
        F_STRINGY | sp,
    )
}

/// Control and special tokens (`<s>`, `<|im_start|>`, `<0x0A>`) stay literal.
fn is_special(raw: &[u8]) -> bool {
    raw.len() > 2 && raw[0] == b'<' && raw[raw.len() - 1] == b'>'
}

/// Rewrites whitespace markers of byte-level BPE (`Ġ Ċ ĉ`) and SentencePiece (`▁`) as bytes.
pub(crate) fn normalise(raw: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut i = 0;
    while i < raw.len() {
        let (b, step) = match raw[i..] {
            [0xC4, 0xA0, ..] => (b' ', 2),
            [0xC4, 0x8A, ..] => (b'\n', 2),
            [0xC4, 0x89, ..] => (b'\t', 2),
            [0xE2, 0x96, 0x81, ..] => (b' ', 3),
            _ => (raw[i], 1),
        };
        out.push(b);
        i += step;
    }
}

fn whitespace_kind(text: &[u8]) -> u32 {
    match memchr::memchr_iter(b'\n', text).count() {
        0 => SPACES,
        1 if text.last() == Some(&b'\n') => NEWLINE,
        1 => NEWLINE_INDENT,
        _ => NEWLINES,
    }
}

/// Odd number of `"` not preceded by a backslash.
fn odd_quotes(text: &[u8]) -> bool {
    memchr::memchr_iter(b'"', text)
        .filter(|&i| i == 0 || text[i - 1] != b'\\')
        .count()
        % 2
        == 1
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A small byte-level-BPE-like vocabulary used across the crate's tests.
    pub(crate) const VOCAB: &[&str] = &[
        "{",
        "\"",
        "name",
        "\":",
        "Ġ\"",
        "Ann",
        "\",",
        "age",
        "Bob",
        "Ġ",
        "30",
        "Ġ41",
        "}",
        "ĊĠĠĠ",
        "Ċ",
        "ĊĊ",
        "def",
        "Ġreturn",
        "Ġfoo",
        "(",
        ")",
        ":",
        "Ġ=",
        ".com",
        "▁Hello",
        "<|im_end|>",
        "Ġtrue",
        "Ġnull",
        "x_1",
        "Ġthe",
        "Ġcat",
        "é",
        "\\\"",
        "ĠĠ",
        "42",
        ",",
        "Ġ\",",
        "Ġfor",
    ];

    pub(crate) fn table() -> ShapeTable {
        let texts: Vec<&[u8]> = VOCAB.iter().map(|s| s.as_bytes()).collect();
        ShapeTable::from_token_texts(&texts)
    }

    pub(crate) fn id(s: &str) -> i32 {
        VOCAB.iter().position(|v| *v == s).unwrap() as i32
    }

    fn ids(s: &[&str]) -> Vec<i32> {
        s.iter().map(|t| id(t)).collect()
    }

    #[test]
    fn names_and_numbers_abstract_structure_stays_literal() {
        let t = table();
        assert_eq!(t.class(id("Ann")), t.class(id("Bob")));
        assert!(!is_literal(t.class(id("Ann"))));
        assert_eq!(t.class(id("30")), SHAPE_BIT | DIGITS << 1);
        assert_eq!(t.class(id("Ġ41")), SHAPE_BIT | DIGITS << 1 | 1);
        for lit in [
            "{",
            "\"",
            "\":",
            "\",",
            "}",
            "(",
            ")",
            ":",
            "Ġ=",
            "def",
            "Ġreturn",
            "Ġtrue",
            "Ġnull",
            "<|im_end|>",
            ",",
        ] {
            assert_eq!(t.class(id(lit)), id(lit) as u32, "{lit} should be literal");
        }
        assert_eq!(t.class(id("x_1")), SHAPE_BIT | WORD << 1);
        assert_eq!(t.class(id("é")), SHAPE_BIT | WORD << 1);
        assert_eq!(t.class(id(".com")), SHAPE_BIT | OTHER << 1);
        assert_eq!(
            t.class(id("▁Hello")),
            t.class(id("Ġfoo")),
            "both marker styles mean a leading space"
        );
        assert_eq!(t.class(id("ĊĠĠĠ")), SHAPE_BIT | NEWLINE_INDENT << 1);
        assert_eq!(t.class(id("Ċ")), SHAPE_BIT | NEWLINE << 1);
        assert_eq!(t.class(id("ĊĊ")), SHAPE_BIT | NEWLINES << 1);
        assert_eq!(t.class(id("ĠĠ")), SHAPE_BIT | SPACES << 1);
        assert_eq!(t.class(-1), UNKNOWN);
        assert_eq!(t.class(10_000), UNKNOWN);
    }

    #[test]
    fn same_record_different_values_same_shape() {
        let t = table();
        let a = ids(&[
            "{", "\"", "name", "\":", "Ġ\"", "Ann", "\",", "Ġ\"", "age", "\":", "Ġ",
        ]);
        let b = ids(&[
            "{", "\"", "name", "\":", "Ġ\"", "Bob", "\",", "Ġ\"", "age", "\":", "Ġ",
        ]);
        let (mut sa, mut sb) = (Vec::new(), Vec::new());
        t.window_classes(&a, &mut sa);
        t.window_classes(&b, &mut sb);
        assert_eq!(sa, sb);
        assert_eq!(t.window_key(&a), t.window_key(&b));
    }

    #[test]
    fn string_context_turns_words_and_keywords_into_content() {
        let t = table();
        let mut s = Vec::new();
        t.window_classes(
            &ids(&["\"", "30", "Ġfor", "Ġthe", "\",", "30", "Ġfor"]),
            &mut s,
        );
        let str_ = SHAPE_BIT | STRING << 1;
        assert_eq!(&s[1..4], &[str_, str_ | 1, str_ | 1]);
        assert_eq!(
            s[5],
            SHAPE_BIT | DIGITS << 1,
            "after the closing quote, digits are digits again"
        );
        assert_eq!(
            s[6],
            id("Ġfor") as u32,
            "keyword outside a string is literal"
        );
        assert!(
            !t.toggles_string(id("\\\"")),
            "an escaped quote does not close a string"
        );
        assert!(
            t.always_literal(id("{"))
                && !t.always_literal(id("Ġfor"))
                && !t.always_literal(id("Ann"))
        );
    }

    proptest! {
        #[test]
        fn suffix_keys_match_window_reference(idx in proptest::collection::vec(0usize..VOCAB.len() + 2, 0..24), max_n in 0usize..24) {
            let t = table();
            let toks: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
            let mut out = [0u64; 32];
            let n = t.suffix_keys(&toks, max_n, &mut out);
            prop_assert_eq!(n, max_n.min(toks.len()));
            for k in 1..=n {
                prop_assert_eq!(out[k - 1], t.window_key(&toks[toks.len() - k..]));
            }
        }
    }
}
