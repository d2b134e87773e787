//! The server step: which sequences share llama-server's decode call, with how many tokens each, and the
//! forward passes llama.cpp makes of them.
//!
//! A step's cost is not a function of its total tokens. Strict batching (patch 0004) packs whole slots into
//! calls of at most [`CALL_MAX`] tokens, and with a KV cache per slot (`-np N` without `-kvu`) llama.cpp's
//! `split_equal` cuts each call into passes ("ubatches") of consecutive slots with the same number of tokens
//! each. Measured on Qwen2.5-Coder-1.5B at `-np 4` (BENCHMARKS.md, session 15): one slot verifying two
//! tokens beside three verifying one costs 110 ms against 78 for all four at one token, and all four at two
//! cost 119 ms; the extra pass, not the extra token, is the price. So a draft is judged by the passes it adds.

/// Most tokens one decode call takes under strict batching (`GGML_CPU_BATCH_INVARIANT_MAX`).
pub const CALL_MAX: usize = 16;

/// Size of the per-length tables (β, acceptance per position, the counters' β).
pub const MAX_DRAFT: usize = 16;

/// Longest draft proposed: one verify pass of this many drafted tokens plus the sampled one stays within
/// the batch size that patch 0002 computes exactly like single-token decoding (`GGML_CPU_BATCH_INVARIANT_MAX`,
/// default 16), so output stays byte-identical to plain decoding.
pub const INVARIANT_DRAFT: usize = CALL_MAX - 1;

/// How llama.cpp cuts a decode call into forward passes: one pass per run of consecutive slots with equal
/// tokens (`split_equal`: a KV stream per slot, as with an explicit `-np`, on a llama.cpp without patch 0014 or
/// with `LLAMA_KV_RAGGED_MAX=0`) or the whole call as one pass (`Unified`: patch 0014's ragged ubatch with a
/// stream per slot, or one unified stream with `-kvu`). Or a server that runs every step as one pass of all its
/// tokens, with no call limit (vLLM; its cost is [`super::onepass`]'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Split,
    Unified,
    OnePass,
}

/// Calls `call(slots)` for every decode call strict batching (patch 0004's `strict_chunk`) makes of a step in
/// which slot `j < n` verifies `tokens(j)` tokens (0: not generating): whole slots in slot order, as many as stay
/// within [`CALL_MAX`] tokens, at least one. A range may hold slots that verify nothing.
pub fn calls(n: usize, tokens: impl Fn(usize) -> usize, mut call: impl FnMut(std::ops::Range<usize>)) {
    let (mut start, mut sum) = (None, 0);
    for j in 0..n {
        let t = tokens(j);
        if t == 0 {
            continue;
        }
        if let Some(s) = start.filter(|_| sum + t > CALL_MAX) {
            call(s..j);
            (start, sum) = (None, 0);
        }
        start.get_or_insert(j);
        sum += t;
    }
    if let Some(s) = start {
        call(s..n);
    }
}

/// Calls `pass(tokens)` for every forward pass of a step in which slot `j < n` verifies `tokens(j)` tokens
/// (0: not generating), in the order llama.cpp runs them.
pub fn passes(n: usize, tokens: impl Fn(usize) -> usize, layout: Layout, mut pass: impl FnMut(usize)) {
    if layout == Layout::OnePass {
        let total: usize = (0..n).map(&tokens).sum();
        if total > 0 {
            pass(total);
        }
        return;
    }
    calls(n, &tokens, |slots| {
        // (slot, tokens left) of the call's generating slots: at most CALL_MAX of them, as each has a token.
        let mut call = [(0usize, 0usize); CALL_MAX];
        let mut len = 0;
        for j in slots.filter(|&j| tokens(j) > 0) {
            if len == CALL_MAX {
                break;
            }
            call[len] = (j, tokens(j));
            len += 1;
        }
        match layout {
            Layout::Unified | Layout::OnePass => pass(call[..len].iter().map(|e| e.1).sum()),
            Layout::Split => split_equal(&mut call[..len], &mut pass),
        }
    });
}

/// llama.cpp's `split_equal(…, sequential = true)` on one call of (slot, tokens) runs in slot order: each pass
/// takes the first slot with tokens left and the slots after it with consecutive ids and tokens left, the same
/// number of tokens (the least any of them has left) from each.
fn split_equal(call: &mut [(usize, usize)], pass: &mut impl FnMut(usize)) {
    while let Some(first) = call.iter().position(|e| e.1 > 0) {
        let mut end = first + 1;
        while end < call.len() && call[end].1 > 0 && call[end].0 == call[end - 1].0 + 1 {
            end += 1;
        }
        let take = call[first..end].iter().map(|e| e.1).min().unwrap_or(0);
        for e in &mut call[first..end] {
            e.1 -= take;
        }
        pass(take * (end - first));
    }
}

/// The step a sequence's proposal joins: what each slot puts in (`tokens[j]`; the proposing sequence's own
/// entry is 0) and what the others are expected to yield.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shared<'a> {
    pub tokens: &'a [usize],
    pub seq: usize,
    pub expected: f64,
}

impl Shared<'_> {
    /// A sequence alone in its steps (`-np 1`).
    pub const ALONE: Shared<'static> = Shared { tokens: &[], seq: 0, expected: 0.0 };

    /// Whether other sequences verify in the same step.
    pub fn others(&self) -> bool {
        self.tokens.iter().any(|&t| t > 0)
    }

    /// Other slots verifying in the step: the requests that wait for whatever this sequence adds to it. Its own
    /// entry is 0, as [`Shared::others`] reads it.
    pub fn waiting(&self) -> usize {
        self.tokens.iter().filter(|&&t| t > 0).count()
    }

    /// Tokens slot `j` verifies when this sequence verifies `own`.
    #[inline]
    pub fn with(&self, own: usize) -> impl Fn(usize) -> usize + '_ {
        move |j| if j == self.seq { own } else { self.tokens.get(j).copied().unwrap_or(0) }
    }

    /// Slots the step spans (the proposing sequence included).
    pub fn n(&self) -> usize {
        self.tokens.len().max(self.seq + 1)
    }
}

/// Which sequences share llama-server's decode calls. Each server step drafts for every generating slot
/// (one call each, in slot order: the plugin's `draft` walks the sequences upwards), then verifies all their
/// tokens; a call for a sequence no higher than the step's last one marks the next step, unless the caller
/// marks steps itself ([`Rounds::start`], vLLM's batch, whose rows come in any order). A sequence counts in the
/// current step with what it proposed in it, or else with what it put into the last one (it has not been asked
/// yet), or with one token if its request began since (it was not in the last).
pub(super) struct Rounds {
    now: Vec<bool>,
    prev: Vec<bool>,
    /// The sequence asked last in the current step, and whether calls come in slot order (no [`Rounds::start`]).
    /// Told by repeated sequences alone, a slot whose request began while the others generated was asked first in
    /// the next step and not seen as its start, and every later step was cut between two slots: the duration of
    /// one step was paired with the tokens of the next (a replay at four slots learned a dear drafted token as
    /// cheap, and drafted 40 tokens in a step, session 67).
    asked: Option<usize>,
    ordered: bool,
    /// [`Rounds::start`] was called: the next call begins a step.
    started: bool,
    /// Per sequence whose request [`begun`](Self::begun) and was not asked since: through how many more step ends
    /// it counts (2 at `begun`, as the step it first generates in starts at the next end; 0 once asked).
    joining: Vec<u8>,
    /// Per sequence: tokens (1 + drafted) of its latest proposal, and what it is expected to yield …
    tokens: Vec<usize>,
    expected: Vec<f64>,
    /// … and what it offered to put into a step where the others draft ([`Rounds::offer`]).
    offer: Vec<(usize, f64)>,
    /// Whether a sequence not yet asked in the current step counts with its offer rather than its last proposal.
    joint: bool,
    /// Per slot, the tokens of the last complete step (0: not in it), and whether a slot of the step before it
    /// was not in it: its request ended, and the server answered it and took up the next in that step.
    last: Vec<usize>,
    left: bool,
    /// Per slot, what a proposing sequence shares its step with (its own entry 0).
    view: Vec<usize>,
    view_expected: f64,
}

impl Rounds {
    pub(super) fn new(n_seq: usize) -> Rounds {
        let n = n_seq.max(1);
        Rounds {
            now: vec![false; n],
            prev: vec![false; n],
            asked: None,
            ordered: true,
            started: false,
            joining: vec![0; n],
            tokens: vec![1; n],
            expected: vec![1.0; n],
            offer: vec![(1, 1.0); n],
            joint: false,
            last: vec![0; n],
            left: false,
            view: vec![0; n],
            view_expected: 0.0,
        }
    }

    /// `seq` is asked for a draft: a step has ended if a [`Rounds::start`] came before it, if it was asked in the
    /// current step already, or (calls in slot order) if it is no higher than the last one asked. Returns whether
    /// a step ended (this call is the first of a new one).
    pub(super) fn enter(&mut self, seq: usize) -> bool {
        let wrapped = self.ordered && self.asked.is_some_and(|a| seq <= a);
        let ended = self.now[seq] || wrapped || (self.started && self.asked.is_some());
        self.started = false;
        self.asked = Some(seq);
        if ended {
            self.left = (0..self.now.len()).any(|j| self.prev[j] && !self.now[j]);
            for j in 0..self.now.len() {
                self.last[j] = if self.now[j] { self.tokens[j] } else { 0 };
            }
            std::mem::swap(&mut self.now, &mut self.prev);
            self.now.fill(false);
            for c in &mut self.joining {
                *c = c.saturating_sub(1);
            }
        }
        self.now[seq] = true;
        self.joining[seq] = 0;
        self.view_expected = 0.0;
        for j in 0..self.now.len() {
            let with = j != seq && (self.now[j] || self.prev[j] || self.joining[j] > 0);
            let (t, e) = match (with, self.now[j] || !self.joint) {
                (false, _) => (0, 0.0),
                (true, true) => (self.tokens[j], self.expected[j]),
                (true, false) => self.offer[j],
            };
            self.view[j] = t;
            self.view_expected += e;
        }
        ended
    }

    /// Sequences not yet asked in a step count with what they offered in the last one ([`Rounds::offer`]), so that a
    /// step's drafts are decided together: the first extra token in a step of one token a slot is the dearest (at
    /// `-np 4` here one slot's second token took a 76 ms step to 92, every slot's second token to 117, session 79's
    /// step logs and call costs), so a slot that weighs its sure draft alone declines it, and when every slot does,
    /// none drafts again.
    pub(super) fn joint(mut self) -> Rounds {
        self.joint = true;
        self
    }

    /// A step begins: the calls up to the next `start` are its own, in whatever order they come.
    pub(super) fn start(&mut self) {
        self.ordered = false;
        self.started = true;
    }

    /// What the sequence last [`enter`](Self::enter)ed shares its step with.
    pub(super) fn shared(&self, seq: usize) -> Shared<'_> {
        Shared { tokens: &self.view, seq, expected: self.view_expected }
    }

    /// Per slot, the tokens the last complete step verified.
    pub(super) fn last(&self) -> &[usize] {
        &self.last
    }

    /// Whether a slot generating in the step before the last complete one was not in it ([`Rounds::last`]).
    pub(super) fn left(&self) -> bool {
        self.left
    }

    pub(super) fn record(&mut self, seq: usize, tokens: usize, expected: f64) {
        self.tokens[seq] = tokens;
        self.expected[seq] = expected;
        self.offer[seq] = (tokens, expected);
    }

    /// What `seq`, which put `record`'s tokens into this step, would put into one where the others draft.
    pub(super) fn offer(&mut self, seq: usize, tokens: usize, expected: f64) {
        self.offer[seq] = (tokens.max(self.tokens[seq]), expected.max(self.expected[seq]));
    }

    /// A request began on `seq`, its prompt decoded: it generates from the next step on, so the sequences asked
    /// in that step before it count its token. Unseen, a slot whose request had just begun let the slots before
    /// it draft into a 17th token (a second decode call under strict batching: 308 ms against 137 for the step of
    /// eight at one token, session 53's step logs).
    pub(super) fn begun(&mut self, seq: usize) {
        self.record(seq, 1, 1.0);
        self.joining[seq] = 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(tokens: &[usize], layout: Layout) -> Vec<usize> {
        let mut v = Vec::new();
        passes(tokens.len(), |j| tokens[j], layout, |t| v.push(t));
        v
    }

    /// llama.cpp's loops, token by token: the server's batch (each slot's tokens in slot order), cut into calls
    /// as patch 0004's `strict_chunk` does, each call cut into ubatches as `llama_batch_allocr::split_equal`
    /// with `sequential` does (it scans unused tokens in batch order and adds a sequence when its id follows
    /// the last one added).
    fn oracle(tokens: &[usize], layout: Layout) -> Vec<usize> {
        let batch: Vec<usize> = tokens.iter().enumerate().flat_map(|(j, &t)| std::iter::repeat_n(j, t)).collect();
        let run_end = |i: usize| (i + 1..batch.len()).find(|&k| batch[k] != batch[i]).unwrap_or(batch.len());
        let mut out = Vec::new();
        let mut off = 0;
        while off < batch.len() {
            let mut end = run_end(off);
            while end < batch.len() && run_end(end) - off <= CALL_MAX {
                end = run_end(end);
            }
            let call = &batch[off..end];
            if layout == Layout::Unified {
                out.push(call.len());
            } else {
                let mut used = vec![false; call.len()];
                loop {
                    let mut seqs: Vec<usize> = Vec::new();
                    for (i, &s) in call.iter().enumerate() {
                        if !used[i] && !seqs.contains(&s) && seqs.last().is_none_or(|&l| s == l + 1) {
                            seqs.push(s);
                        }
                    }
                    if seqs.is_empty() {
                        break;
                    }
                    let mut n = 0;
                    'fill: loop {
                        let next: Option<Vec<usize>> =
                            seqs.iter().map(|&s| (0..call.len()).find(|&i| !used[i] && call[i] == s)).collect();
                        let Some(next) = next else { break 'fill };
                        for i in next {
                            used[i] = true;
                            n += 1;
                        }
                    }
                    out.push(n);
                }
            }
            off = end;
        }
        out
    }

    #[test]
    fn passes_are_those_the_session_15_costs_showed() {
        use Layout::*;
        assert_eq!(list(&[1, 1, 1, 1], Split), [4], "78 ms");
        assert_eq!(list(&[2, 1, 1, 1], Split), [4, 1], "110 ms: one slot's second token is a pass of its own");
        assert_eq!(list(&[2, 2, 2, 2], Split), [8], "119 ms");
        assert_eq!(list(&[3, 3, 1, 1], Split), [4, 4], "153 ms");
        assert_eq!(list(&[3, 1, 3, 1], Split), [4, 2, 2], "184 ms: slots 0 and 2 are not consecutive");
        assert_eq!(list(&[1, 0, 1, 1], Split), [1, 2], "88 ms: an idle slot between generating ones");
        assert_eq!(list(&[2, 1, 1, 1], Unified), [5]);
        assert_eq!(list(&[5, 5, 5, 5], Split), [15, 5], "whole slots, at most 16 tokens a call");
        assert_eq!(list(&[16, 1], Unified), [16, 1]);
        assert_eq!(list(&[0, 0], Split), Vec::<usize>::new());
        assert_eq!(list(&[5, 5, 5, 5, 1, 0, 9], OnePass), [30], "vLLM: one pass, no call limit");
        assert_eq!(list(&[0, 0], OnePass), Vec::<usize>::new());
    }

    #[test]
    fn passes_follow_llama_cpp_token_by_token() {
        // Every shape of up to 5 slots with 0..=4 tokens each, and spot checks of longer drafts and more slots.
        let mut shapes: Vec<Vec<usize>> = Vec::new();
        for code in 0..5usize.pow(5) {
            shapes.push((0..5).map(|i| code / 5usize.pow(i) % 5).collect());
        }
        let mut x = 0x9e37_79b9_u64;
        for _ in 0..2000 {
            let n = 1 + (x % 12) as usize;
            shapes.push((0..n).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                [0, 1, 1, 2, 3, 8, 16][(x % 7) as usize]
            }).collect());
        }
        for s in &shapes {
            for layout in [Layout::Split, Layout::Unified] {
                assert_eq!(list(s, layout), oracle(s, layout), "{s:?} {layout:?}");
            }
        }
    }

    #[test]
    fn rounds_see_what_each_slot_puts_into_the_step() {
        let mut r = Rounds::new(3);
        r.enter(0);
        assert!(!r.shared(0).others(), "alone so far");
        r.record(0, 4, 2.5);
        r.enter(1);
        assert_eq!(r.shared(1), Shared { tokens: &[4, 0, 0], seq: 1, expected: 2.5 });
        r.record(1, 1, 1.0);
        // Sequence 0 again: the step with 4 + 1 tokens was decoded; 1 has not drafted in this one yet but
        // did in the last, so it counts with what it put in then.
        r.enter(0);
        assert_eq!(r.shared(0), Shared { tokens: &[0, 1, 0], seq: 0, expected: 1.0 });
        assert_eq!(r.last(), [4, 1, 0]);
        assert!(!r.left());
        r.record(0, 1, 1.0);
        r.enter(1);
        assert_eq!(r.shared(1).tokens, [1, 0, 0], "0 is in this step already, with its new proposal");
        r.record(1, 3, 2.0);
        r.enter(0);
        assert_eq!(r.shared(0).tokens, [0, 3, 0]);
        assert_eq!(r.last(), [1, 3, 0]);
        assert!(!r.left());
        r.record(0, 1, 1.0);
        r.enter(0);
        assert!(!r.shared(0).others(), "1 did not draft in the last step: its request is over");
        assert_eq!(r.last(), [1, 0, 0]);
        assert!(r.left(), "1 was in the step before and is not in this one");
        let with = r.shared(0);
        assert_eq!((0..3).map(with.with(5)).collect::<Vec<_>>(), [5, 0, 0]);
    }

    #[test]
    fn a_step_begins_where_the_slots_start_over() {
        // Slot 0's request began in the last step (its prompt decoded): not asked then, it is asked first in this
        // one, which begins with it. Each step after pairs with its own tokens.
        let mut r = Rounds::new(3);
        for seq in [0, 1, 2] {
            r.enter(seq);
            r.record(seq, 1, 1.0);
        }
        assert!(r.enter(1), "0's request ended; 1 starts the next step");
        r.record(1, 1, 1.0);
        r.enter(2);
        r.record(2, 1, 1.0);
        r.begun(0);
        assert!(r.enter(0), "asked first, 0 begins the step");
        r.record(0, 5, 3.0);
        assert!(!r.enter(1));
        r.record(1, 2, 1.5);
        assert!(!r.enter(2));
        r.record(2, 1, 1.0);
        assert!(r.enter(0));
        assert_eq!(r.last(), [5, 2, 1], "the step's own tokens, not the last step's beside this one's");
    }

    #[test]
    fn a_joint_step_counts_the_slots_not_yet_asked_with_their_offers() {
        let mut r = Rounds::new(3).joint();
        for seq in 0..3 {
            r.enter(seq);
            r.record(seq, 1, 1.0);
        }
        r.offer(1, 3, 2.5); // sequence 1 drafted nothing, and would draft two tokens in a step where the others do
        r.offer(2, 1, 1.0);
        r.enter(0);
        assert_eq!(r.shared(0), Shared { tokens: &[0, 3, 1], seq: 0, expected: 3.5 }, "1 not asked yet: its offer");
        r.record(0, 2, 1.9);
        r.enter(1);
        r.record(1, 1, 1.0); // asked, it declined after all
        r.enter(2);
        assert_eq!(r.shared(2), Shared { tokens: &[2, 1, 0], seq: 2, expected: 2.9 }, "asked: what it put in");
        r.record(2, 1, 1.0);
        assert_eq!(r.last(), [1, 1, 1], "the step before");
        r.enter(0);
        assert_eq!(r.last(), [2, 1, 1], "a step verifies what was proposed, never what was offered");
        // Without `joint`, the slots not yet asked count with what they put into the last step.
        let mut r = Rounds::new(2);
        for seq in 0..2 {
            r.enter(seq);
            r.record(seq, 1, 1.0);
        }
        r.offer(1, 3, 2.5);
        r.enter(0);
        assert_eq!(r.shared(0).tokens, [0, 1]);
    }

    #[test]
    fn marked_steps_take_their_sequences_in_any_order() {
        let mut r = Rounds::new(3);
        r.start();
        for (seq, t) in [(2, 3), (0, 1), (1, 2)] {
            r.enter(seq);
            r.record(seq, t, 1.0);
        }
        r.start();
        assert!(r.enter(1), "the mark begins the step");
        assert_eq!(r.last(), [1, 2, 3]);
        r.record(1, 1, 1.0);
        assert!(!r.enter(0), "a lower sequence after a higher one is the same step");
        r.record(0, 4, 2.0);
        r.start();
        assert!(r.enter(0));
        assert_eq!(r.last(), [4, 1, 0], "2 was not asked in it");
    }

    #[test]
    fn a_request_begun_counts_before_it_is_asked() {
        let mut r = Rounds::new(3);
        r.enter(0);
        r.record(0, 1, 1.0);
        r.enter(1);
        r.record(1, 3, 2.0);
        r.begun(2); // after the decode of the step above, which evaluated its prompt
        assert!(r.enter(0), "a new step");
        assert_eq!(r.shared(0), Shared { tokens: &[0, 3, 1], seq: 0, expected: 3.0 }, "2 generates in it");
        r.record(0, 1, 1.0);
        r.enter(1);
        assert_eq!(r.shared(1).tokens, [1, 0, 1]);
        r.record(1, 1, 1.0);
        r.enter(2);
        assert_eq!(r.shared(2).tokens, [1, 1, 0]);
        r.record(2, 4, 3.0);
        r.enter(0);
        assert_eq!(r.shared(0).tokens, [0, 1, 4], "then it counts with what it proposed");
        assert_eq!(r.last(), [1, 1, 4]);
        // A request that ends at its first token is never asked: it counts in the one step it would have joined.
        r.record(0, 1, 1.0);
        r.begun(1);
        r.enter(2);
        r.record(2, 1, 1.0);
        assert!(r.enter(0));
        assert_eq!(r.shared(0).tokens, [0, 1, 1]);
        r.record(0, 1, 1.0);
        r.enter(2);
        r.record(2, 1, 1.0);
        assert!(r.enter(0));
        assert_eq!(r.shared(0).tokens, [0, 0, 1], "1 was not in the last step");
    }
}
