//! The live index: recipes learned while serving, from what the target itself answered. Every verified
//! token of every slot's answer is counted after its literal and shape contexts (the windows that end just
//! before it, reaching back into the prompt), in one table all slots share, so a request like an earlier one
//! drafts from that one's answer without a compiled pack. The drafter consults it where the pack has no
//! recipe; verification stays the target's, so it changes no output.
//!
//! Bounded: a set-associative table of a fixed number of entries (4 ways, on huge pages where the kernel gives
//! them); a full set evicts the entry seen least recently, so what traffic keeps producing stays. Lookups
//! allocate nothing. Each context keeps its two leading next tokens and how often any token followed it: exact
//! while at most two tokens compete; beyond that the runner-up is whichever came last (its count an
//! underestimate), and the leader's count stays exact while it leads. `file` keeps the table across restarts.

pub mod file;
mod pages;

use crate::index::Hit;
use crate::pack::{EntryKind, MAX_N};
use crate::shape::ShapeTable;
use crate::windows::Windows;
use pages::Pages;

/// Contexts per set. A set is two adjacent 64-byte lines of two [`Slot`]s each, 128-byte aligned, and a slot holds
/// its whole context, so probing, claiming and counting a context touch that pair of lines alone: a feed's or a
/// lookup's 2 to 12 sets are asked for together and arrive in one round. (Before session 19 a set was 8 ways with
/// a line of tags and ages apart from its 40-byte entries: a feed waited two rounds, the tags then the entries, and
/// a lookup hit a third line. Two ways in one line were faster still, but under churn kept 15% fewer of the
/// contexts that recur: `benches/memory.rs`.)
const WAYS: usize = 4;

/// One context and what followed it as the table keeps it: 32 bytes.
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    /// The window key (below 2^KEY_BITS), the context's length and its kind above it ([`Slot::id`]).
    id: u64,
    lead: (u32, u32),
    second: (u32, u32),
    /// Times any token followed the context; 0: the slot is empty.
    total: u32,
    seen: u32,
}

#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct Set([Slot; WAYS]);

/// Where a slot's id keeps the context's length and kind, above the window key.
const N_SHIFT: u32 = crate::hash::KEY_BITS;
const KIND_SHIFT: u32 = N_SHIFT + 8;

const _: () = assert!(size_of::<Set>() == 128 && KIND_SHIFT < 64 && MAX_N < 256);

impl Slot {
    const EMPTY: Slot = Slot { id: 0, lead: (0, 0), second: (0, 0), total: 0, seen: 0 };

    #[inline]
    fn id(kind: EntryKind, n: u8, key: u64) -> u64 {
        key | u64::from(n) << N_SHIFT | u64::from(kind == EntryKind::Shape) << KIND_SHIFT
    }

    fn first(id: u64, token: u32, tick: u32) -> Slot {
        Slot { id, lead: (token, 1), second: (0, 0), total: 1, seen: tick }
    }

    #[inline]
    fn holds(&self, id: u64) -> bool {
        self.total > 0 && self.id == id
    }

    /// Counts one more occurrence of the context, followed by `token`.
    fn observe(&mut self, token: u32, tick: u32) {
        self.total = self.total.saturating_add(1);
        self.seen = tick;
        if self.lead.1 > 0 && self.lead.0 == token {
            self.lead.1 = self.lead.1.saturating_add(1);
        } else if self.second.1 > 0 && self.second.0 == token {
            self.second.1 = self.second.1.saturating_add(1);
            if self.second.1 > self.lead.1 {
                std::mem::swap(&mut self.lead, &mut self.second);
            }
        } else {
            self.second = (token, 1);
        }
    }

    fn kind(&self) -> EntryKind {
        if self.id >> KIND_SHIFT & 1 == 1 {
            EntryKind::Shape
        } else {
            EntryKind::Literal
        }
    }

    fn n(&self) -> u8 {
        (self.id >> N_SHIFT) as u8
    }

    fn hit(&self) -> Hit {
        Hit { token: self.lead.0 as i32, count: self.lead.1, total: self.total, kind: self.kind(), n: self.n() }
    }

    fn entry(&self) -> LiveEntry {
        let key = self.id & ((1 << N_SHIFT) - 1);
        LiveEntry { kind: self.kind(), n: self.n(), key, lead: self.lead, second: self.second, total: self.total, seen: self.seen }
    }

    fn of(e: &LiveEntry) -> Slot {
        Slot { id: Slot::id(e.kind, e.n, e.key), lead: e.lead, second: e.second, total: e.total, seen: e.seen }
    }
}

/// How the live index is sized and what it counts.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveConfig {
    /// Entries kept at most (rounded up to a power-of-two number of sets).
    pub capacity: usize,
    /// Longest literal and shape context counted, in tokens.
    pub max_n_literal: usize,
    pub max_n_shape: usize,
    /// Shortest context counted: one token says little about the next.
    pub min_n: usize,
}

/// 2^18 entries, 8 MiB (32-byte slots): room for the contexts of some 20,000 answer tokens before anything
/// is evicted.
pub const DEFAULT_CAPACITY: usize = 1 << 18;

impl Default for LiveConfig {
    fn default() -> Self {
        // Not fewer: literal 2..=6 and shape 2..=4 replayed as fast on recorded Qwen2.5-Coder-1.5B answers (JSON
        // 1.329x against 1.335x, code edits 1.572x both), but served, a second identical SmolLM2 request whose answer
        // repeats its own 6-grams (`json_data = json.dumps(json_data)` then `.loads(json_data)`) drafted 55 of 64
        // tokens instead of 57: shorter contexts cannot tell the repeats apart.
        LiveConfig { capacity: DEFAULT_CAPACITY, max_n_literal: 8, max_n_shape: 6, min_n: 2 }
    }
}

/// One context and what followed it (what a saved table holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveEntry {
    pub kind: EntryKind,
    /// Context length in tokens.
    pub n: u8,
    /// Window key ([`crate::hash`], the pack's keys).
    pub key: u64,
    /// The leading next token and its count; the runner-up and its count (0: none yet).
    pub lead: (u32, u32),
    pub second: (u32, u32),
    /// Times any token followed the context.
    pub total: u32,
    /// Feed tick at which the context was last seen.
    pub seen: u32,
}

/// The table all slots share.
pub struct Live {
    cfg: LiveConfig,
    shapes: Option<ShapeTable>,
    sets: Pages<Set>,
    /// log2 of the number of sets.
    bits: u32,
    tick: u32,
    len: usize,
    /// Answer tokens counted since the table was made (or loaded).
    fed: u64,
}

impl Live {
    /// An empty table; without a shape table only literal contexts are counted.
    pub fn new(cfg: LiveConfig, shapes: Option<ShapeTable>) -> Live {
        let sets = cfg.capacity.div_ceil(WAYS).next_power_of_two().max(1);
        Live {
            sets: Pages::filled(sets, Set([Slot::EMPTY; WAYS])),
            bits: sets.trailing_zeros(),
            cfg: LiveConfig { max_n_literal: cfg.max_n_literal.min(MAX_N), max_n_shape: cfg.max_n_shape.min(MAX_N), ..cfg },
            shapes,
            tick: 0,
            len: 0,
            fed: 0,
        }
    }

    pub fn config(&self) -> &LiveConfig {
        &self.cfg
    }

    /// Entries the table holds at most.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Answer tokens counted since the table was made.
    pub fn fed(&self) -> u64 {
        self.fed
    }

    /// Bytes of the table itself (it never grows).
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.sets)
    }

    /// Longest context any lookup reads.
    pub fn max_n(&self) -> usize {
        let (literal, shape) = self.max_ns();
        literal.max(shape)
    }

    /// Longest literal and shape contexts counted.
    pub fn max_ns(&self) -> (usize, usize) {
        (self.cfg.max_n_literal, if self.shapes.is_some() { self.cfg.max_n_shape } else { 0 })
    }

    /// The set a context lives in: the high bits of its id times an odd constant (every bit of the id, the
    /// context's length and kind included, reaches them).
    #[inline]
    fn set(&self, id: u64) -> usize {
        if self.bits == 0 {
            0
        } else {
            (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
        }
    }

    /// Asks the CPU for the sets of `ids`, so their cache misses overlap.
    #[inline]
    fn prefetch(&self, ids: &[u64]) {
        for &id in ids {
            let set = &self.sets[self.set(id)].0;
            prefetch(&set[0]);
            prefetch(&set[2]);
        }
    }

    #[inline]
    fn find(&self, id: u64) -> Option<&Slot> {
        self.sets[self.set(id)].0.iter().find(|e| e.holds(id))
    }

    /// The slot for a context: its own, else an empty one, else the one seen least recently (evicted); and
    /// whether it holds the context already.
    fn claim(&mut self, id: u64) -> (&mut Slot, bool) {
        let set = self.set(id);
        let ways = &self.sets[set].0;
        let (i, held) = match ways.iter().position(|e| e.holds(id)) {
            Some(i) => (i, true),
            None => match ways.iter().position(|e| e.total == 0) {
                Some(i) => {
                    self.len += 1;
                    (i, false)
                }
                None => ((0..WAYS).min_by_key(|&i| ways[i].seen).expect("a set has ways"), false),
            },
        };
        (&mut self.sets[set].0[i], held)
    }

    /// The ids of the contexts that end `history`, their sets' lines already asked for. A shape window with
    /// nothing abstracted in it (its key is its literal window's: a token's shape is its id unless it is
    /// abstracted) is the literal context again, counted and looked up there; those are the shortest shape
    /// windows, up to the first abstracted token from the end, and are skipped.
    #[inline]
    fn contexts(&self, w: &mut Windows) -> Contexts {
        let lo = self.cfg.min_n.max(1) - 1;
        let keys = w.literal();
        let n = keys.len().min(self.cfg.max_n_literal);
        let mut c = Contexts { ids: [0; 2 * MAX_N], len: 0 };
        for i in (lo..n).rev() {
            c.ids[c.len] = Slot::id(EntryKind::Literal, i as u8 + 1, keys[i]);
            c.len += 1;
        }
        // The literal sets are asked for before the shape keys are hashed, so that work overlaps their misses.
        self.prefetch(&c.ids[..c.len]);
        let literal = c.len;
        if let Some(shapes) = &self.shapes {
            let (keys, shape_keys) = w.literal_and_shape(shapes);
            let m = shape_keys.len().min(self.cfg.max_n_shape);
            let mut shape_lo = lo;
            while shape_lo < m.min(n) && shape_keys[shape_lo] == keys[shape_lo] {
                shape_lo += 1;
            }
            for i in (shape_lo..m).rev() {
                c.ids[c.len] = Slot::id(EntryKind::Shape, i as u8 + 1, shape_keys[i]);
                c.len += 1;
            }
        }
        self.prefetch(&c.ids[literal..c.len]);
        c
    }

    /// The windows `lookup` and `feed` read at the end of `history`, hashed.
    #[inline]
    pub fn windows(&self, history: &[i32]) -> Windows {
        let (literal, shape) = self.max_ns();
        Windows::new(history, literal, shape)
    }

    /// Asks the CPU for the sets a lookup of `w` reads, so that their misses overlap other work (a feed).
    #[inline]
    pub fn prefetch_lookup(&self, w: &mut Windows) {
        self.contexts(w);
    }

    /// Counts `token` (verified output) after every context of `history` (all tokens before it).
    pub fn feed(&mut self, history: &[i32], token: i32) {
        let Ok(token) = u32::try_from(token) else { return };
        self.tick = self.tick.wrapping_add(1);
        self.fed += 1;
        let c = self.contexts(&mut self.windows(history));
        let tick = self.tick;
        for &id in &c.ids[..c.len] {
            match self.claim(id) {
                (e, true) => e.observe(token, tick),
                (e, false) => *e = Slot::first(id, token, tick),
            }
        }
    }

    /// What followed the end of `history` before: the longest literal context seen, else the longest shape
    /// context (as [`crate::index::Index::lookup`] reads a pack).
    #[inline]
    pub fn lookup(&self, history: &[i32]) -> Option<Hit> {
        self.find_windows(&mut self.windows(history))
    }

    /// [`Live::lookup`] on a history's windows already hashed (their shape keys, if made, under this table's
    /// [`Live::shapes`]); windows longer than the contexts counted are not read.
    #[inline]
    pub fn find_windows(&self, w: &mut Windows) -> Option<Hit> {
        let c = self.contexts(w);
        c.ids[..c.len].iter().find_map(|&id| self.find(id)).map(Slot::hit)
    }

    /// The shape table the shape contexts are counted under.
    pub fn shapes(&self) -> Option<&ShapeTable> {
        self.shapes.as_ref()
    }

    /// The entries held, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = LiveEntry> + '_ {
        self.sets.iter().flat_map(|s| &s.0).filter(|e| e.total > 0).map(Slot::entry)
    }

    /// Puts `e` back (loading a saved table) in its set, evicting the entry seen least recently when the set
    /// is full: load oldest first so the newest stay. A context twice in one file (only a crafted file has
    /// that) keeps the one seen later.
    pub fn restore(&mut self, e: LiveEntry) {
        let longest = match e.kind {
            EntryKind::Literal => self.cfg.max_n_literal,
            EntryKind::Shape => self.cfg.max_n_shape,
        };
        // A context longer than this table counts (a file from a build that counted longer ones) is never looked up.
        if e.total == 0 || e.lead.1 == 0 || usize::from(e.n) > longest || e.kind == EntryKind::Shape && self.shapes.is_none() {
            return;
        }
        self.tick = self.tick.max(e.seen);
        let id = Slot::id(e.kind, e.n, e.key);
        if self.find(id).is_some_and(|held| held.seen > e.seen) {
            return;
        }
        *self.claim(id).0 = Slot::of(&e);
    }
}

/// The contexts ending a history, as slot ids, in the order a lookup tries them: the literal windows longest
/// first, then the shape windows longest first.
struct Contexts {
    ids: [u64; 2 * MAX_N],
    len: usize,
}

/// A hint that `at` will be read soon; no effect on what any read returns.
#[inline(always)]
fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults nor changes memory, and `at` is a live reference. SSE is part of the
    // x86_64 baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((at as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hash::window_key;
    use crate::shape::tests::{id, table};
    use proptest::prelude::*;

    /// The reference: every (context window, token) observation kept in order, keys computed from scratch by
    /// the reference window functions, the same two-leader rule replayed per context at lookup.
        struct Naive {
        obs: Vec<(EntryKind, u8, u64, u32)>,
        cfg: LiveConfig,
        shapes: Option<ShapeTable>,
    }

    impl Naive {
        fn key(&self, kind: EntryKind, w: &[i32]) -> u64 {
            match kind {
                EntryKind::Literal => window_key(&w.iter().map(|&t| t as u32).collect::<Vec<_>>()),
                EntryKind::Shape => self.shapes.as_ref().unwrap().window_key(w),
            }
        }

        fn max_n(&self, kind: EntryKind) -> usize {
            match kind {
                EntryKind::Literal => self.cfg.max_n_literal,
                EntryKind::Shape if self.shapes.is_some() => self.cfg.max_n_shape,
                EntryKind::Shape => 0,
            }
        }

        fn feed(&mut self, history: &[i32], token: i32) {
            for kind in [EntryKind::Literal, EntryKind::Shape] {
                for n in self.cfg.min_n..=self.max_n(kind).min(history.len()) {
                    let key = self.key(kind, &history[history.len() - n..]);
                    self.obs.push((kind, n as u8, key, token as u32));
                }
            }
        }

        fn lookup(&self, history: &[i32]) -> Option<Hit> {
            [EntryKind::Literal, EntryKind::Shape].into_iter().find_map(|kind| {
                (self.cfg.min_n..=self.max_n(kind).min(history.len())).rev().find_map(|n| {
                    let key = self.key(kind, &history[history.len() - n..]);
                    let mut e: Option<Slot> = None;
                    for &(k, m, key2, t) in &self.obs {
                        if (k, usize::from(m), key2) == (kind, n, key) {
                            match &mut e {
                                Some(e) => e.observe(t, 0),
                                None => e = Some(Slot::first(Slot::id(kind, n as u8, key), t, 0)),
                            }
                        }
                    }
                    e.map(|e| e.hit())
                })
            })
        }
    }

    fn both(cfg: LiveConfig) -> (Live, Naive) {
        (Live::new(cfg.clone(), Some(table())), Naive { obs: Vec::new(), cfg, shapes: Some(table()) })
    }

    #[test]
    fn a_second_answer_drafts_from_the_first() {
        let (mut live, _) = both(LiveConfig::default());
        let prompt = [1, 2, 3, 4];
        let answer = [10, 11, 12, 13, 14];
        let mut h = prompt.to_vec();
        for &t in &answer {
            assert_eq!(live.lookup(&h), None, "nothing is known before the first answer");
            live.feed(&h, t);
            h.push(t);
        }
        let mut h = prompt.to_vec();
        for &t in &answer {
            let hit = live.lookup(&h).expect("the same context again");
            assert_eq!((hit.token, hit.count, hit.total, hit.kind), (t, 1, 1, EntryKind::Literal));
            assert_eq!(usize::from(hit.n), h.len().min(LiveConfig::default().max_n_literal));
            h.push(t);
        }
        assert_eq!(live.fed(), 5);
    }

    #[test]
    fn a_name_never_seen_is_drafted_by_its_shape() {
        let (mut live, _) = both(LiveConfig::default());
        let ann = [id("{"), id("Ann"), id("\",")];
        live.feed(&ann, id("}"));
        let bob = [id("{"), id("Bob"), id("\",")];
        let hit = live.lookup(&bob).expect("same shape");
        assert_eq!((hit.token, hit.kind), (id("}"), EntryKind::Shape));
    }

    #[test]
    fn a_shape_window_with_nothing_abstracted_is_left_to_its_literal_twin() {
        let (mut live, _) = both(LiveConfig::default());
        // Windows ending at `}`: `", }` has nothing abstracted (its shape is itself), `Ann ", }` and longer have.
        live.feed(&[id("{"), id("Ann"), id("\","), id("}")], id("{"));
        assert_eq!(live.len(), 3 + 2, "literal 2, 3, 4 tokens; shape 3 and 4 only");
        let hit = live.lookup(&[id("("), id("\","), id("}")]).expect("the literal twin");
        assert_eq!((hit.kind, hit.n), (EntryKind::Literal, 2));
    }

    #[test]
    fn the_leader_changes_when_the_runner_up_overtakes_it() {
        let mut e = Slot::first(Slot::id(EntryKind::Literal, 2, 7), 5, 0);
        e.observe(6, 1);
        assert_eq!((e.lead, e.second, e.total), ((5, 1), (6, 1), 2), "a tie keeps the first");
        e.observe(6, 2);
        assert_eq!((e.lead, e.second, e.total), ((6, 2), (5, 1), 3));
        e.observe(9, 3);
        assert_eq!((e.lead, e.second, e.total), ((6, 2), (9, 1), 4), "a third token replaces the runner-up");
        assert_eq!(e.hit().confidence(), 0.5);
    }

    #[test]
    fn memory_stays_within_capacity_and_what_is_seen_again_stays() {
        let cfg = LiveConfig { capacity: 64, max_n_literal: 2, max_n_shape: 2, min_n: 2 };
        let mut live = Live::new(cfg, None);
        assert_eq!(live.capacity(), 64);
        let bytes = live.bytes();
        let kept = [1000, 1001];
        for i in 0..10_000i32 {
            live.feed(&[i, i + 1], i + 2);
            if i % 8 == 0 {
                live.feed(&kept, 7);
            }
            assert!(live.len() <= live.capacity());
        }
        assert_eq!(live.len(), 64, "the table fills");
        assert_eq!(live.bytes(), bytes, "and never grows");
        assert_eq!(live.lookup(&kept).map(|h| h.token), Some(7), "a context seen every 8 feeds stays (4 newer ones in its set between sightings would evict it)");
        assert_eq!(live.lookup(&[5, 6]), None, "one seen once, 10,000 feeds ago, is");
    }

    #[test]
    fn restore_puts_entries_back_as_they_were() {
        let (mut live, _) = both(LiveConfig::default());
        for (i, t) in [(1, 5), (2, 5), (3, 6), (4, 5)] {
            live.feed(&[9, 9, i], t);
        }
        let mut copy = Live::new(LiveConfig::default(), Some(table()));
        let mut saved: Vec<LiveEntry> = live.entries().collect();
        saved.sort_by_key(|e| e.seen);
        for e in saved {
            copy.restore(e);
        }
        for h in [&[9, 9, 1][..], &[9, 9], &[0, 9, 9], &[9, 9, 4]] {
            assert_eq!(copy.lookup(h), live.lookup(h));
        }
        assert_eq!(copy.len(), live.len());
    }

    #[test]
    fn restore_skips_contexts_longer_than_the_table_counts() {
        // A file from a table that counted contexts of 8 loaded by one that counts up to 6: the longer entries are
        // never looked up there, so they are not loaded to take a slot; the shorter ones are.
        let (mut long, _) = both(LiveConfig::default());
        long.feed(&[1, 2, 3, 4, 5, 6, 7, 8], 9);
        let mut short = Live::new(LiveConfig { max_n_literal: 6, max_n_shape: 4, ..LiveConfig::default() }, Some(table()));
        for e in long.entries() {
            short.restore(e);
        }
        assert!(short.entries().all(|e| usize::from(e.n) <= short.config().max_n_literal));
        assert_eq!(short.lookup(&[1, 2, 3, 4, 5, 6, 7, 8]).map(|h| (h.token, h.n)), Some((9, 6)));
        assert!(short.len() < long.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Without eviction (room for every context) the table answers as the reference does.
        #[test]
        fn agrees_with_naive_oracle(
            stream in proptest::collection::vec(0i32..5, 0..120),
            probes in proptest::collection::vec(proptest::collection::vec(0i32..5, 0..10), 1..20),
            min_n in 1usize..3,
        ) {
            let (mut live, mut naive) = both(LiveConfig { capacity: 1 << 14, max_n_literal: 5, max_n_shape: 4, min_n });
            for i in 0..stream.len() {
                live.feed(&stream[..i], stream[i]);
                naive.feed(&stream[..i], stream[i]);
            }
            for h in probes.iter().chain([&stream]) {
                prop_assert_eq!(live.lookup(h), naive.lookup(h));
            }
        }

        /// With eviction, memory stays bounded and whatever is found was seen after that context, never
        /// more often than the reference saw it (an entry evicted and seen again starts its counts over).
        #[test]
        fn evicting_never_invents(stream in proptest::collection::vec(0i32..40, 0..400)) {
            let (mut live, mut naive) = both(LiveConfig { capacity: 16, max_n_literal: 3, max_n_shape: 0, min_n: 1 });
            for i in 0..stream.len() {
                live.feed(&stream[..i], stream[i]);
                naive.feed(&stream[..i], stream[i]);
                prop_assert!(live.len() <= 16);
            }
            for i in 0..=stream.len() {
                let Some(hit) = live.lookup(&stream[..i]) else { continue };
                let key = naive.key(EntryKind::Literal, &stream[i - usize::from(hit.n)..i]);
                let seen: Vec<u32> = naive.obs.iter().filter(|o| (o.0, o.1, o.2) == (EntryKind::Literal, hit.n, key)).map(|o| o.3).collect();
                prop_assert!(hit.total as usize <= seen.len());
                prop_assert!(hit.count as usize <= seen.iter().filter(|&&t| t == hit.token as u32).count());
                prop_assert!(hit.count >= 1);
            }
        }
    }
}
