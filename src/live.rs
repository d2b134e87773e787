//! The live index: recipes learned while serving, from what the target itself answered. Every verified
//! token of every slot's answer is counted after its literal and shape contexts (the windows that end just
//! before it, reaching back into the prompt), in one table all slots share, so a request like an earlier one
//! drafts from that one's answer without a compiled pack. The drafter consults it where the pack has no
//! recipe; verification stays the target's, so it changes no output.
//!
//! Bounded: a set-associative table of a fixed number of entries; a full set evicts the entry seen least
//! recently, so what traffic keeps producing stays. Lookups allocate nothing. Each context keeps its two
//! leading next tokens and how often any token followed it: exact while at most two tokens compete; beyond
//! that the runner-up is whichever came last (its count an underestimate), and the leader's count stays exact
//! while it leads. `file` keeps the table across restarts.

pub mod file;

use crate::hash::literal_suffix_keys;
use crate::index::Hit;
use crate::pack::{EntryKind, MAX_N};
use crate::shape::ShapeTable;

/// Entries per set. A probe reads the set's [`SetMeta`] (one cache line) and an entry only where a tag
/// matches, so a miss, and choosing the entry to evict, cost one cache line; a lookup or a feed prefetches
/// the lines of its 2 to 12 sets together instead of taking one cache miss after another.
const WAYS: usize = 8;

/// What a probe reads first: per way a nonzero tag of its context (0: empty) and the feed tick it was last
/// seen at (what eviction compares).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct SetMeta {
    tag: [u32; WAYS],
    seen: [u32; WAYS],
}

impl SetMeta {
    /// The ways whose tag is `tag`, one bit each: two vector compares where the CPU has them (every probe and
    /// claim starts here).
    #[inline]
    fn ways(&self, tag: u32) -> u32 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: SSE2 is part of the x86_64 baseline; the two unaligned 16-byte loads read `self.tag[0..4]`
        // and `self.tag[4..8]`, inside the array (WAYS is 8).
        unsafe {
            use std::arch::x86_64::*;
            const _: () = assert!(WAYS == 8);
            let t = _mm_set1_epi32(tag as i32);
            let p = self.tag.as_ptr().cast::<__m128i>();
            let lo = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_loadu_si128(p), t)));
            let hi = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(_mm_loadu_si128(p.add(1)), t)));
            (lo | hi << 4) as u32
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.tag.iter().enumerate().fold(0, |m, (i, &t)| m | u32::from(t == tag) << i)
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

/// 2^18 entries, 12 MiB (40-byte entries and a 64-byte line of tags and ages per set of 8): room for the contexts of some 20,000 answer tokens before anything is evicted.
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

/// One context and what followed it.
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

impl LiveEntry {
    const EMPTY: LiveEntry = LiveEntry { kind: EntryKind::Literal, n: 0, key: 0, lead: (0, 0), second: (0, 0), total: 0, seen: 0 };

    fn first(kind: EntryKind, n: u8, key: u64, token: u32, tick: u32) -> LiveEntry {
        LiveEntry { kind, n, key, lead: (token, 1), second: (0, 0), total: 1, seen: tick }
    }

    fn is(&self, kind: EntryKind, n: u8, key: u64) -> bool {
        self.total > 0 && self.key == key && self.n == n && self.kind == kind
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

    fn hit(&self) -> Hit {
        Hit { token: self.lead.0 as i32, count: self.lead.1, total: self.total, kind: self.kind, n: self.n }
    }
}

/// The table all slots share.
pub struct Live {
    cfg: LiveConfig,
    shapes: Option<ShapeTable>,
    slots: Box<[LiveEntry]>,
    /// Per set.
    meta: Box<[SetMeta]>,
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
            slots: vec![LiveEntry::EMPTY; sets * WAYS].into_boxed_slice(),
            meta: vec![SetMeta::default(); sets].into_boxed_slice(),
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
        self.slots.len()
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
        std::mem::size_of_val(&*self.slots) + std::mem::size_of_val(&*self.meta)
    }

    /// Longest context any lookup reads.
    pub fn max_n(&self) -> usize {
        self.cfg.max_n_literal.max(if self.shapes.is_some() { self.cfg.max_n_shape } else { 0 })
    }

    /// Where a context lives: its set (the high bits of the window key mixed with its kind and length) and its
    /// tag (the low bits, never 0).
    #[inline]
    fn locate(&self, kind: EntryKind, n: u8, key: u64) -> (usize, u32) {
        let tag = (u64::from(n) << 1 | u64::from(kind == EntryKind::Shape)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let h = (key ^ tag).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        let s = if self.bits == 0 { 0 } else { (h >> (64 - self.bits)) as usize };
        (s, (h as u32) | 1)
    }

    /// Asks the CPU for the [`SetMeta`] of the sets of `keys[lo..n]` (contexts of 1..=n tokens), so their cache misses
    /// overlap.
    #[inline]
    fn prefetch(&self, kind: EntryKind, keys: &[u64], lo: usize) {
        for (i, &key) in keys.iter().enumerate().skip(lo) {
            let (set, _) = self.locate(kind, i as u8 + 1, key);
            prefetch(&self.meta[set]);
        }
    }

    #[inline]
    fn find(&self, kind: EntryKind, n: u8, key: u64) -> Option<&LiveEntry> {
        let (set, tag) = self.locate(kind, n, key);
        let mut ways = self.meta[set].ways(tag);
        while ways != 0 {
            let e = &self.slots[set * WAYS + ways.trailing_zeros() as usize];
            if e.is(kind, n, key) {
                return Some(e);
            }
            ways &= ways - 1;
        }
        None
    }

    /// The slot (an index) for a context, marked seen at `seen`: its own, else an empty one, else the one seen least
    /// recently (evicted). The set's tags and ages are updated, the entry is not read (so a claim costs
    /// the set's line alone). `held` says the tag matched; the caller checks the entry's key before counting
    /// into it (two contexts share a set and a 32-bit tag about once in 2^29 claims).
    fn claim(&mut self, kind: EntryKind, n: u8, key: u64, seen: u32) -> (usize, bool) {
        let (set, tag) = self.locate(kind, n, key);
        let m = &self.meta[set];
        let (i, held) = match m.ways(tag) {
            0 => match m.ways(0) {
                0 => ((0..WAYS).min_by_key(|&i| m.seen[i]).expect("a set has ways"), false),
                empty => {
                    self.len += 1;
                    (empty.trailing_zeros() as usize, false)
                }
            },
            ways => (ways.trailing_zeros() as usize, true),
        };
        let m = &mut self.meta[set];
        m.tag[i] = tag;
        m.seen[i] = seen;
        (set * WAYS + i, held)
    }

    /// The keys of the contexts that end `history`, their sets' lines already asked for.
    #[inline]
    fn contexts(&self, history: &[i32]) -> Contexts {
        let mut c = Contexts { lo: self.cfg.min_n.max(1) - 1, keys: [0; MAX_N], n: 0, shape_keys: [0; MAX_N], m: 0 };
        c.n = literal_suffix_keys(history, self.cfg.max_n_literal, &mut c.keys);
        c.m = self.shapes.as_ref().map_or(0, |sh| sh.suffix_keys(history, self.cfg.max_n_shape, &mut c.shape_keys));
        self.prefetch(EntryKind::Literal, &c.keys[..c.n], c.lo);
        self.prefetch(EntryKind::Shape, &c.shape_keys[..c.m], c.lo);
        c
    }

    /// Counts `token` (verified output) after every context of `history` (all tokens before it).
    pub fn feed(&mut self, history: &[i32], token: i32) {
        let Ok(token) = u32::try_from(token) else { return };
        self.tick = self.tick.wrapping_add(1);
        self.fed += 1;
        let Contexts { lo, keys, n, shape_keys, m } = self.contexts(history);
        // Two passes, so the entries' cache misses overlap too: claim every context's slot (the sets' lines,
        // prefetched above) and prefetch the entry, then count. Should a later claim evict an earlier one's
        // slot (8 contexts of one feed in one set), the later write wins, as it would one at a time.
        let tick = self.tick;
        let mut claims = [(0usize, false, EntryKind::Literal, 0u8, 0u64); 2 * MAX_N];
        let mut c = 0;
        for (kind, ks, len) in [(EntryKind::Literal, &keys, n), (EntryKind::Shape, &shape_keys, m)] {
            for (i, &key) in ks.iter().enumerate().take(len).skip(lo) {
                let (at, held) = self.claim(kind, i as u8 + 1, key, tick);
                prefetch(&self.slots[at]);
                claims[c] = (at, held, kind, i as u8 + 1, key);
                c += 1;
            }
        }
        for &(at, held, kind, n, key) in &claims[..c] {
            let e = &mut self.slots[at];
            if held && e.is(kind, n, key) {
                e.observe(token, tick);
            } else {
                *e = LiveEntry::first(kind, n, key, token, tick);
            }
        }
    }

    /// What followed the end of `history` before: the longest literal context seen, else the longest shape
    /// context (as [`crate::index::Index::lookup`] reads a pack).
    #[inline]
    pub fn lookup(&self, history: &[i32]) -> Option<Hit> {
        let Contexts { lo, keys, n, shape_keys, m } = self.contexts(history);
        if let Some(e) = (lo..n).rev().find_map(|i| self.find(EntryKind::Literal, i as u8 + 1, keys[i])) {
            return Some(e.hit());
        }
        (lo..m).rev().find_map(|i| self.find(EntryKind::Shape, i as u8 + 1, shape_keys[i])).map(LiveEntry::hit)
    }

    /// The entries held, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = &LiveEntry> {
        self.slots.iter().filter(|e| e.total > 0)
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
        if self.find(e.kind, e.n, e.key).is_some_and(|held| held.seen > e.seen) {
            return;
        }
        let (at, _) = self.claim(e.kind, e.n, e.key, e.seen);
        self.slots[at] = e;
    }
}

/// The contexts ending a history: `keys[i]` is the literal window of `i + 1` tokens (`n` of them), `shape_keys`
/// the shape windows (`m`); lengths below `lo + 1` are not counted.
struct Contexts {
    lo: usize,
    keys: [u64; MAX_N],
    n: usize,
    shape_keys: [u64; MAX_N],
    m: usize,
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
                    let mut e: Option<LiveEntry> = None;
                    for &(k, m, key2, t) in &self.obs {
                        if (k, usize::from(m), key2) == (kind, n, key) {
                            match &mut e {
                                Some(e) => e.observe(t, 0),
                                None => e = Some(LiveEntry::first(kind, n as u8, key, t, 0)),
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
    fn the_leader_changes_when_the_runner_up_overtakes_it() {
        let mut e = LiveEntry::first(EntryKind::Literal, 2, 7, 5, 0);
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
        assert_eq!(live.lookup(&kept).map(|h| h.token), Some(7), "a context seen every 8 feeds is never evicted");
        assert_eq!(live.lookup(&[5, 6]), None, "one seen once, 10,000 feeds ago, is");
    }

    #[test]
    fn restore_puts_entries_back_as_they_were() {
        let (mut live, _) = both(LiveConfig::default());
        for (i, t) in [(1, 5), (2, 5), (3, 6), (4, 5)] {
            live.feed(&[9, 9, i], t);
        }
        let mut copy = Live::new(LiveConfig::default(), Some(table()));
        let mut saved: Vec<LiveEntry> = live.entries().copied().collect();
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
        for e in long.entries().copied() {
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
