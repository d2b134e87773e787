//! What a drafted token rests on, so acceptance is learned per kind of evidence instead of once for all
//! tokens: a copy of the request's own text after a 20-token match is nearly always right, after a 2-token
//! match often not, and a pack recipe's count and agreement say how far to trust it. The break-even rule
//! then drafts long where the evidence is strong and not at all where it is weak.

use crate::pack::EntryKind;

/// Where a drafted token came from (for the counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Literal,
    Shape,
    Context,
    Model,
}

/// Context-copy match lengths (tokens) at which the next class starts.
const COPY_EDGES: [usize; 7] = [2, 3, 4, 6, 9, 13, 21];
/// Pack recipes: (count at least, share at least) for the strong and the middle class; the rest is weak.
const PACK_STRONG: (u32, f32) = (4, 0.9);
const PACK_MIDDLE: (u32, f32) = (2, 0.75);

/// Short copies (the first this many length buckets) are split by whether their suffix was ambiguous.
const SPLIT_BUCKETS: usize = 3;

/// Number of classes: literal ×3, shape ×3, context copy × one per edge, ambiguous short copies, a copy
/// the pack agrees with, draft model.
pub const N_CLASSES: usize = 3 + 3 + COPY_EDGES.len() + SPLIT_BUCKETS + 1 + 1;

/// Acceptance assumed before any measurement, per class, from looking up held-out greedy outputs of
/// Qwen2.5-Coder-1.5B (JSON extraction and HumanEval, 12 prompts each that the bench and replay do not
/// serve): a pack recipe and a copy agreeing were right 93–97% of the time; a pack recipe alone 58–70%
/// (strong), 43–51% (middle), shape recipes less; copies after 9+ matched tokens 78–100%, after 2–5 tokens
/// 44–69% when the matched suffix had occurred once before and 11–40% when more often. Where a recipe and a
/// copy disagree the recipe was right only 0–12% of the time, so the copy is taken. Each sequence then
/// learns its own.
pub const DEFAULT_PRIOR: [f32; N_CLASSES] = [
    0.65, 0.5, 0.35, // literal: strong, middle, weak
    0.55, 0.4, 0.25, // shape
    0.45, 0.5, 0.65, 0.75, 0.8, 0.85, 0.9, // copy of a match of 2, 3, 4–5, 6–8, 9–12, 13–20, 21+ tokens
    0.15, 0.2, 0.3, // … of 2, 3, 4–5 tokens whose suffix occurred more than once before
    0.9, // a copy the pack agrees with
    0.7, // draft model
];

/// One kind of evidence, an index into per-class tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Class(u8);

impl Class {
    pub const MODEL: Class = Class(N_CLASSES as u8 - 1);
    /// A pack recipe and a copy of the request's own text proposing the same token.
    pub const AGREED: Class = Class(N_CLASSES as u8 - 2);

    /// A pack recipe of `kind` whose token followed its context `count` times, a share `confidence` of them.
    pub fn pack(kind: EntryKind, count: u32, confidence: f32) -> Class {
        let strength = if count >= PACK_STRONG.0 && confidence >= PACK_STRONG.1 {
            0
        } else if count >= PACK_MIDDLE.0 && confidence >= PACK_MIDDLE.1 {
            1
        } else {
            2
        };
        Class(match kind {
            EntryKind::Literal => strength,
            EntryKind::Shape => 3 + strength,
        })
    }

    /// A copy of the request's own text after a match of `len` tokens, found by a suffix that occurred more
    /// than once before (`ambiguous`) or once.
    pub fn copy(len: usize, ambiguous: bool) -> Class {
        let bucket = COPY_EDGES.iter().rposition(|&e| len >= e).unwrap_or(0);
        if ambiguous && bucket < SPLIT_BUCKETS {
            return Class((6 + COPY_EDGES.len() + bucket) as u8);
        }
        Class(6 + bucket as u8)
    }

    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    pub fn source(self) -> Source {
        match self.0 {
            0..=2 => Source::Literal,
            3..=5 => Source::Shape,
            c if usize::from(c) == N_CLASSES - 1 => Source::Model,
            _ => Source::Context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_distinct_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for kind in [EntryKind::Literal, EntryKind::Shape] {
            for (count, conf) in [(9, 1.0), (3, 0.8), (1, 1.0), (9, 0.6)] {
                let c = Class::pack(kind, count, conf);
                assert!(c.index() < N_CLASSES);
                assert_eq!(c.source(), if kind == EntryKind::Literal { Source::Literal } else { Source::Shape });
                seen.insert(c);
            }
        }
        for len in 0..40 {
            for ambiguous in [false, true] {
                let c = Class::copy(len, ambiguous);
                assert_eq!(c.source(), Source::Context, "{len}");
                seen.insert(c);
            }
        }
        seen.extend([Class::MODEL, Class::AGREED]);
        assert_eq!(Class::AGREED.source(), Source::Context);
        assert_eq!(Class::MODEL.source(), Source::Model);
        assert_eq!(seen.len(), N_CLASSES, "every class is reachable");
    }

    #[test]
    fn longer_copies_are_trusted_more_a_priori() {
        for ambiguous in [false, true] {
            let p: Vec<f32> = (2..30).map(|n| DEFAULT_PRIOR[Class::copy(n, ambiguous).index()]).collect();
            assert!(p.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
        }
        assert_eq!(Class::copy(5, false), Class::copy(4, false));
        assert_ne!(Class::copy(6, false), Class::copy(5, false));
        assert!((2..6).all(|n| DEFAULT_PRIOR[Class::copy(n, true).index()] < DEFAULT_PRIOR[Class::copy(n, false).index()]));
        assert_eq!(Class::copy(6, true), Class::copy(6, false), "long matches are not split");
    }
}
