//! What a drafted token rests on, so acceptance is learned per kind of evidence instead of once for all
//! tokens: a copy of the request's own text after a 20-token match is nearly always right, after a 2-token
//! match often not, and a pack recipe's count and agreement say how far to trust it. The break-even rule
//! then drafts long where the evidence is strong and not at all where it is weak. Each kind is learned apart at
//! each [`Place`] of the answer's syntax: a recipe that is usually right in a key is usually wrong in a value.

use super::syntax::{Place, N_PLACES};
use crate::pack::EntryKind;

/// Where a drafted token came from (for the counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Literal,
    Shape,
    /// The live index: what the target answered earlier while serving.
    Live,
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
/// Copies of the answer's own text shorter than 9 tokens (the first this many buckets) are kinds of their own:
/// on the project's training prompts (Qwen2.5-Coder-1.5B, greedy) a 3–8-token copy of the prompt was right
/// 72–100% of the time and one of the answer 21–76%, the answer repeating its own phrases only sometimes
/// (a docstring's `Args:` after its summary and again after the arguments).
const ANSWER_BUCKETS: usize = 4;
/// Copies of the prompt shorter than 9 tokens whose token starts a line (its indentation, or its first text
/// after it) are kinds of their own: there the answer decides what the line holds (the prompt's docstring
/// again, or code), where within a line a copy mostly goes on as it began. In the replay's trace of 41
/// held-out HumanEval answers (Qwen2.5-Coder-1.5B) 3–8-token copies of the prompt were right 42–71% of the time
/// at a line's start and 87–100% within a line; on 48 training prompts, whose answers re-type the docstring
/// more often, 88% and 87–100%. Their priors are the same as within a line: the rates learn the difference.
const LINE_BUCKETS: usize = 4;

/// Kinds of evidence: literal ×3, shape ×3, the live index's literal ×3 and shape ×3, context copy × one per
/// edge, ambiguous short copies, short copies of the answer, short copies of the prompt at a line's start, a
/// copy after a one-token match, the prediction's first token at a line of the answer's opening, the next item
/// of a list in the prompt, a copy a recipe agrees with, a rewrite the answer made before, draft model.
pub const N_KINDS: usize = 3 + 3 + 6 + COPY_EDGES.len() + SPLIT_BUCKETS + ANSWER_BUCKETS + LINE_BUCKETS + 1 + 1 + 1 + 1 + 1 + 1;
/// The first live kind, the first copy kind, the first kind of short copies of the answer, and of the prompt at a
/// line's start.
const LIVE: usize = 6;
const COPY: usize = 12;
const ANSWER: usize = COPY + COPY_EDGES.len() + SPLIT_BUCKETS;
const LINE: usize = ANSWER + ANSWER_BUCKETS;
const ONE_TOKEN: usize = N_KINDS - 6;
const OPENING: usize = N_KINDS - 5;
const LISTED: usize = N_KINDS - 4;
const AGREED: usize = N_KINDS - 3;
const REWRITE: usize = N_KINDS - 2;
const MODEL: usize = N_KINDS - 1;

/// Number of classes: every kind at every [`Place`].
pub const N_CLASSES: usize = N_KINDS * N_PLACES;

/// Names the class layout that acceptance counts kept across restarts are for. Change the version when the
/// kinds change meaning without changing in number.
pub fn layout() -> String {
    format!("{N_KINDS} kinds x {N_PLACES} places, v1")
}

/// Acceptance assumed before any measurement, per place and kind, from looking up held-out greedy outputs
/// of Qwen2.5-Coder-1.5B (JSON extraction and HumanEval, 12 prompts each that the bench and replay do not
/// serve; HumanEval's strings are mostly docstrings copied from the prompt):
/// - in code and structure, strong recipes were right 58–87% of the time, copies of 2–5 tokens 60–70%,
///   a recipe and a copy agreeing 93%;
/// - in a key, strong recipes 79–80%, copies 0–25% (they repeat the previous key);
/// - in a value, strong recipes 12–34%, copies 66–81% after 2–12 tokens and 97–100% after more, a short
///   copy whose suffix occurred more than once before 11%.
///
/// Where a recipe and a copy disagree the recipe was right only 0–12% of the time, so the copy is taken. A
/// rewrite the answer made before starts as a long copy in code and a value (unmeasured: the rule's own
/// acceptance is learned per class as any other).
/// The live index's recipes (the target's own greedy answers to earlier requests, most seen once) start a
/// little below the pack's. The prediction's first token where a line of the answer's opening starts is right
/// where the answer fenced the predicted code (a guess: a fence's line is the usual preamble). Each sequence then
/// learns its own rates, and all sequences share theirs. A token that would break a one-line string
/// ([`Place::LineBreak`]) starts unlikely whatever its evidence: valid JSON has no raw line break in a string.
pub const DEFAULT_PRIOR: [f32; N_CLASSES] = flatten([
    // literal S/M/W, shape S/M/W, live literal S/M/W, live shape S/M/W,
    // copy 2, 3, 4–5, 6–8, 9–12, 13–20, 21+, ambiguous 2, 3, 4–5, answer's 2, 3, 4–5, 6–8, at a line's start 2, 3, 4–5, 6–8,
    // copy after one token, the prediction's opening, listed, agreed, rewrite, model
    [0.7, 0.5, 0.35, 0.7, 0.25, 0.2, 0.65, 0.45, 0.3, 0.6, 0.25, 0.2, 0.6, 0.65, 0.7, 0.85, 0.85, 0.85, 0.9, 0.2, 0.25, 0.3, 0.35, 0.45, 0.6, 0.7, 0.6, 0.65, 0.7, 0.85, 0.2, 0.6, 0.5, 0.93, 0.85, 0.7], // code
    [0.8, 0.3, 0.2, 0.8, 0.25, 0.2, 0.75, 0.3, 0.2, 0.75, 0.25, 0.2, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 0.9, 0.05, 0.1, 0.15, 0.1, 0.15, 0.2, 0.3, 0.1, 0.15, 0.2, 0.3, 0.05, 0.3, 0.85, 0.5, 0.3, 0.7], // key
    [0.35, 0.2, 0.1, 0.15, 0.1, 0.1, 0.3, 0.15, 0.1, 0.15, 0.1, 0.1, 0.65, 0.75, 0.75, 0.8, 0.8, 0.95, 0.98, 0.15, 0.3, 0.3, 0.4, 0.45, 0.7, 0.75, 0.65, 0.75, 0.75, 0.8, 0.15, 0.6, 0.5, 0.95, 0.8, 0.7], // value
    [0.05; N_KINDS], // a line break in a one-line string
]);

const fn flatten(t: [[f32; N_KINDS]; N_PLACES]) -> [f32; N_CLASSES] {
    let mut out = [0.0; N_CLASSES];
    let mut i = 0;
    while i < N_CLASSES {
        out[i] = t[i / N_KINDS][i % N_KINDS];
        i += 1;
    }
    out
}

/// One kind of evidence at one place, an index into per-class tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Class(u8);

impl Class {
    const fn new(kind: usize, place: Place) -> Class {
        Class((place as usize * N_KINDS + kind) as u8)
    }

    /// A draft model's token.
    pub const fn model(place: Place) -> Class {
        Class::new(MODEL, place)
    }

    /// The prediction's first token, where a line starts in the answer's opening lines.
    pub const fn opening(place: Place) -> Class {
        Class::new(OPENING, place)
    }

    /// The next item of a list in the prompt, where a key starts.
    pub const fn listed(place: Place) -> Class {
        Class::new(LISTED, place)
    }

    /// The new text of a span the answer rewrote before, where a copy reaches that span again.
    pub const fn rewrite(place: Place) -> Class {
        Class::new(REWRITE, place)
    }

    /// A pack recipe and a copy of the request's own text proposing the same token.
    pub const fn agreed(place: Place) -> Class {
        Class::new(AGREED, place)
    }

    /// A pack recipe of `kind` whose token followed its context `count` times, a share `confidence` of them.
    pub fn pack(kind: EntryKind, count: u32, confidence: f32, place: Place) -> Class {
        Class::new(recipe_kind(kind, count, confidence), place)
    }

    /// The same for a recipe of the live index.
    pub fn live(kind: EntryKind, count: u32, confidence: f32, place: Place) -> Class {
        Class::new(LIVE + recipe_kind(kind, count, confidence), place)
    }

    /// A copy of the request's own text after a match of `len` tokens, found by a suffix that occurred more
    /// than once before (`ambiguous`) or once, of text the answer wrote (`answered`) or the prompt's, its token
    /// starting a line or not (`line_start`: the line holds at most indentation before it). A copy after one
    /// token is a kind of its own, whatever it copies: it is right far less often than one after two, and as the
    /// same kind it would drag that kind's rate down.
    pub fn copy(len: usize, ambiguous: bool, answered: bool, line_start: bool, place: Place) -> Class {
        if len < COPY_EDGES[0] {
            return Class::new(ONE_TOKEN, place);
        }
        let bucket = COPY_EDGES.iter().rposition(|&e| len >= e).unwrap_or(0);
        if answered && bucket < ANSWER_BUCKETS {
            return Class::new(ANSWER + bucket, place);
        }
        if ambiguous && bucket < SPLIT_BUCKETS {
            return Class::new(COPY + COPY_EDGES.len() + bucket, place);
        }
        if line_start && bucket < LINE_BUCKETS {
            return Class::new(LINE + bucket, place);
        }
        Class::new(COPY + bucket, place)
    }

    /// The same evidence at another place: where the token it proposes takes a place of its own
    /// ([`Place::LineBreak`]).
    pub const fn at(self, place: Place) -> Class {
        Class::new(self.0 as usize % N_KINDS, place)
    }

    /// A copy with no match behind it worth the name: after one token, or the prediction's opening.
    pub fn is_unmatched(self) -> bool {
        matches!(self.index() % N_KINDS, ONE_TOKEN | OPENING)
    }

    #[inline]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    /// A short name of the kind and the place, as `copy 9-12 @value` (for traces of the drafter's decisions).
    pub fn label(self) -> String {
        const STRENGTH: [&str; 3] = ["strong", "middle", "weak"];
        let edge = |b: usize| match COPY_EDGES.get(b + 1) {
            Some(&next) if next - COPY_EDGES[b] > 1 => format!("{}-{}", COPY_EDGES[b], next - 1),
            Some(_) => COPY_EDGES[b].to_string(),
            None => format!("{}+", COPY_EDGES[b]),
        };
        let k = self.index() % N_KINDS;
        let kind = match k {
            0..=5 => format!("{} {}", if k < 3 { "literal" } else { "shape" }, STRENGTH[k % 3]),
            LIVE..COPY => format!("live {} {}", if k - LIVE < 3 { "literal" } else { "shape" }, STRENGTH[(k - LIVE) % 3]),
            ONE_TOKEN => "copy 1".into(),
            OPENING => "prediction's opening".into(),
            LISTED => "listed".into(),
            AGREED => "agreed".into(),
            REWRITE => "rewrite".into(),
            MODEL => "model".into(),
            _ if k >= LINE => format!("copy {} at a line's start", edge(k - LINE)),
            _ if k >= ANSWER => format!("answer's copy {}", edge(k - ANSWER)),
            _ if k >= COPY + COPY_EDGES.len() => format!("ambiguous copy {}", edge(k - COPY - COPY_EDGES.len())),
            _ => format!("copy {}", edge(k - COPY)),
        };
        let place = ["code", "key", "value", "line break"][self.index() / N_KINDS];
        format!("{kind} @{place}")
    }

    pub fn source(self) -> Source {
        match self.index() % N_KINDS {
            0..=2 => Source::Literal,
            3..=5 => Source::Shape,
            LIVE..COPY => Source::Live,
            MODEL => Source::Model,
            _ => Source::Context,
        }
    }
}

/// A recipe's kind among the six of a table: literal or shape, strong, middle or weak by its count and share.
fn recipe_kind(kind: EntryKind, count: u32, confidence: f32) -> usize {
    let strength = if count >= PACK_STRONG.0 && confidence >= PACK_STRONG.1 {
        0
    } else if count >= PACK_MIDDLE.0 && confidence >= PACK_MIDDLE.1 {
        1
    } else {
        2
    };
    match kind {
        EntryKind::Literal => strength,
        EntryKind::Shape => 3 + strength,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACES: [Place; N_PLACES] = [Place::Code, Place::Key, Place::Value, Place::LineBreak];

    #[test]
    fn classes_are_distinct_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for place in PLACES {
            for kind in [EntryKind::Literal, EntryKind::Shape] {
                for (count, conf) in [(9, 1.0), (3, 0.8), (1, 1.0), (9, 0.6)] {
                    let c = Class::pack(kind, count, conf, place);
                    assert!(c.index() < N_CLASSES);
                    assert_eq!(c.source(), if kind == EntryKind::Literal { Source::Literal } else { Source::Shape });
                    seen.insert(c);
                    let l = Class::live(kind, count, conf, place);
                    assert_eq!(l.source(), Source::Live);
                    assert!(DEFAULT_PRIOR[l.index()] <= DEFAULT_PRIOR[c.index()], "live recipes start below the pack's");
                    seen.insert(l);
                }
            }
            for len in 0..40 {
                for ambiguous in [false, true] {
                    for answered in [false, true] {
                        for line_start in [false, true] {
                            let c = Class::copy(len, ambiguous, answered, line_start, place);
                            assert_eq!(c.source(), Source::Context, "{len}");
                            seen.insert(c);
                        }
                    }
                }
            }
            seen.extend([Class::model(place), Class::agreed(place), Class::listed(place), Class::rewrite(place), Class::opening(place)]);
            assert_eq!(Class::opening(place).source(), Source::Context);
            assert_eq!(Class::rewrite(place).source(), Source::Context);
            assert_eq!(Class::listed(place).source(), Source::Context);
            assert_eq!(Class::agreed(place).source(), Source::Context);
            assert_eq!(Class::model(place).source(), Source::Model);
        }
        assert_eq!(seen.len(), N_CLASSES, "every class is reachable");
    }

    #[test]
    fn every_class_has_a_label_of_its_own() {
        let labels: std::collections::HashSet<String> = (0..N_CLASSES).map(|i| Class(i as u8).label()).collect();
        assert_eq!(labels.len(), N_CLASSES);
        assert_eq!(Class::copy(10, false, false, false, Place::Value).label(), "copy 9-12 @value");
        assert_eq!(Class::copy(3, true, false, false, Place::Code).label(), "ambiguous copy 3 @code");
        assert_eq!(Class::copy(30, false, true, false, Place::Code).label(), "copy 21+ @code");
        assert_eq!(Class::copy(7, false, true, false, Place::Key).label(), "answer's copy 6-8 @key");
        assert_eq!(Class::copy(4, false, false, true, Place::Code).label(), "copy 4-5 at a line's start @code");
        assert_eq!(Class::pack(EntryKind::Shape, 2, 0.8, Place::Key).label(), "shape middle @key");
        assert_eq!(Class::live(EntryKind::Literal, 9, 1.0, Place::Code).label(), "live literal strong @code");
        assert_eq!(Class::model(Place::Value).label(), "model @value");
    }

    #[test]
    fn longer_copies_are_trusted_more_a_priori() {
        for place in [Place::Code, Place::Key, Place::Value] {
            for (ambiguous, answered) in [(false, false), (true, false), (false, true), (true, true)] {
                let p: Vec<f32> = (2..30).map(|n| DEFAULT_PRIOR[Class::copy(n, ambiguous, answered, false, place).index()]).collect();
                assert!(p.windows(2).all(|w| w[0] <= w[1]), "{place:?} {p:?}");
            }
            let prior = |n, ambiguous, answered| DEFAULT_PRIOR[Class::copy(n, ambiguous, answered, false, place).index()];
            let one = Class::copy(1, false, false, false, place);
            assert!([(true, false), (false, true), (true, true)].iter().all(|&(a, b)| Class::copy(1, a, b, false, place) == one), "one kind, whatever it copies");
            for (ambiguous, answered) in [(false, false), (true, false), (false, true), (true, true)] {
                assert!((2..40).all(|n| Class::copy(n, ambiguous, answered, false, place) != one && prior(1, false, false) <= prior(n, ambiguous, answered)));
            }
            assert_eq!(Class::copy(5, false, false, false, place), Class::copy(4, false, false, false, place));
            assert_ne!(Class::copy(6, false, false, false, place), Class::copy(5, false, false, false, place));
            assert!((2..6).all(|n| prior(n, true, false) < prior(n, false, false)));
            assert_eq!(Class::copy(6, true, false, false, place), Class::copy(6, false, false, false, place), "long matches are not split");
            // A short copy of the answer's own text is its own kind, never trusted above the prompt's.
            assert!((2..9).all(|n| Class::copy(n, false, true, false, place) != Class::copy(n, false, false, false, place) && prior(n, false, true) <= prior(n, false, false)));
            assert_eq!(Class::copy(2, true, true, false, place), Class::copy(2, false, true, false, place), "ambiguity is not split again");
            assert_eq!(Class::copy(9, false, true, false, place), Class::copy(9, false, false, false, place), "long matches are not split");
            // A short copy of the prompt that starts a line's text is its own kind, never trusted above one within a line.
            let line = |n| DEFAULT_PRIOR[Class::copy(n, false, false, true, place).index()];
            assert!((2..9).all(|n| Class::copy(n, false, false, true, place) != Class::copy(n, false, false, false, place) && line(n) <= prior(n, false, false)));
            assert!((2..8).all(|n| line(n) <= line(n + 1)));
            assert_eq!(Class::copy(9, false, false, true, place), Class::copy(9, false, false, false, place), "long matches are not split");
            assert_eq!(Class::copy(3, true, false, true, place), Class::copy(3, true, false, false, place), "ambiguity is not split again");
            assert_eq!(Class::copy(3, false, true, true, place), Class::copy(3, false, true, false, place), "nor the answer's copies");
        }
    }

    #[test]
    fn a_line_break_in_a_one_line_string_is_unlikely_whatever_proposes_it() {
        for k in 0..N_KINDS {
            let c = Class::new(k, Place::Value);
            let broken = c.at(Place::LineBreak);
            assert_eq!((broken.source(), broken.at(Place::Value)), (c.source(), c), "the same evidence, moved");
            assert!(DEFAULT_PRIOR[broken.index()] <= 0.05 && DEFAULT_PRIOR[broken.index()] <= DEFAULT_PRIOR[c.index()], "{}", broken.label());
        }
        assert_eq!(Class::copy(10, false, false, false, Place::Value).at(Place::LineBreak).label(), "copy 9-12 @line break");
    }

    #[test]
    fn recipes_are_trusted_in_keys_and_copies_in_values() {
        let recipe = |place| DEFAULT_PRIOR[Class::pack(EntryKind::Literal, 9, 1.0, place).index()];
        let copy = |place| DEFAULT_PRIOR[Class::copy(3, false, false, false, place).index()];
        assert!(recipe(Place::Key) > copy(Place::Key));
        assert!(copy(Place::Value) > recipe(Place::Value));
    }
}
