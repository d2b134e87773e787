//! In-memory lookup tables built from a [`Pack`]: for each (kind, n) an open-addressing table from
//! window key to the best next token. A lookup tries the longest literal context first, then the
//! longest shape context, and allocates nothing.

use crate::pack::{Entry, EntryKind, Pack, MAX_N};
use crate::shape::ShapeTable;
use crate::windows::Windows;

/// A recipe that matched the end of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Most frequent next token for the matched context (ties: smallest id).
    pub token: i32,
    /// How often that token followed the context.
    pub count: u32,
    /// How often any token followed the context (in the pack).
    pub total: u32,
    pub kind: EntryKind,
    /// Context length in tokens.
    pub n: u8,
}

impl Hit {
    /// Share of the context's occurrences that `token` followed.
    pub fn confidence(&self) -> f32 {
        self.count as f32 / self.total as f32
    }
}

const EMPTY: u64 = u64::MAX;

#[derive(Clone, Copy)]
struct Payload {
    token: u32,
    count: u32,
    total: u32,
}

/// Linear-probing table; keys are already uniform hashes, so their low bits pick the slot. Keys
/// live apart from payloads: most probes miss, and a miss then touches 8 bytes per slot.
#[derive(Clone)]
struct Table {
    keys: Box<[u64]>,
    payloads: Box<[Payload]>,
    mask: u64,
}

impl Table {
    fn build(group: &[Entry]) -> Table {
        let runs = group.chunk_by(|a, b| a.key == b.key).count();
        let cap = (runs * 2).next_power_of_two().max(8);
        let mut keys = vec![EMPTY; cap].into_boxed_slice();
        let mut payloads = vec![
            Payload {
                token: 0,
                count: 0,
                total: 0
            };
            cap
        ]
        .into_boxed_slice();
        let mask = cap as u64 - 1;
        for run in group.chunk_by(|a, b| a.key == b.key) {
            let best = run
                .iter()
                .max_by_key(|e| (e.count, std::cmp::Reverse(e.token)))
                .expect("non-empty run");
            let total = run.iter().fold(0u32, |t, e| t.saturating_add(e.count));
            let mut i = best.key & mask;
            while keys[i as usize] != EMPTY {
                i = (i + 1) & mask;
            }
            keys[i as usize] = best.key;
            payloads[i as usize] = Payload {
                token: best.token,
                count: best.count,
                total,
            };
        }
        Table {
            keys,
            payloads,
            mask,
        }
    }

    #[inline]
    fn get(&self, key: u64) -> Option<&Payload> {
        let mut i = key & self.mask;
        loop {
            let k = self.keys[i as usize];
            if k == key {
                return Some(&self.payloads[i as usize]);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// Tables of one kind, indexed by context length.
#[derive(Clone, Default)]
struct Tables {
    by_n: Vec<Option<Table>>,
    /// Context lengths present, longest first.
    ns: Vec<u8>,
}

impl Tables {
    fn max_n(&self) -> usize {
        self.ns.first().map_or(0, |&n| usize::from(n))
    }

    #[inline]
    fn probe(&self, keys: &[u64], kind: EntryKind) -> Option<Hit> {
        for &n in &self.ns {
            let Some(&key) = keys.get(usize::from(n) - 1) else {
                continue;
            };
            let table = self.by_n[usize::from(n)]
                .as_ref()
                .expect("listed length has a table");
            if let Some(s) = table.get(key) {
                return Some(Hit {
                    token: s.token as i32,
                    count: s.count,
                    total: s.total,
                    kind,
                    n,
                });
            }
        }
        None
    }
}

/// Lookup structure for one pack and vocabulary.
#[derive(Clone)]
pub struct Index {
    literal: Tables,
    shape: Tables,
    shapes: Option<ShapeTable>,
    entries: usize,
}

impl Index {
    /// Builds the tables. Without a shape table, shape entries are ignored.
    pub fn new(pack: &Pack, shapes: Option<ShapeTable>) -> Index {
        let mut literal = Tables::default();
        let mut shape = Tables::default();
        for t in [&mut literal, &mut shape] {
            t.by_n.resize_with(MAX_N + 1, || None);
        }
        // Entries are in canonical order, so each (kind, n) group is contiguous and key-sorted.
        for group in pack
            .entries()
            .chunk_by(|a, b| (a.kind, a.n) == (b.kind, b.n))
        {
            let t = match group[0].kind {
                EntryKind::Literal => &mut literal,
                EntryKind::Shape if shapes.is_some() => &mut shape,
                EntryKind::Shape => continue,
            };
            t.by_n[usize::from(group[0].n)] = Some(Table::build(group));
            t.ns.push(group[0].n);
        }
        for t in [&mut literal, &mut shape] {
            t.ns.sort_unstable_by(|a, b| b.cmp(a));
        }
        Index {
            literal,
            shape,
            shapes,
            entries: pack.entries().len(),
        }
    }

    /// Longest context (in tokens) any lookup looks at.
    pub fn max_n(&self) -> usize {
        self.literal.max_n().max(self.shape.max_n())
    }

    /// Number of pack entries indexed.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    pub fn shapes(&self) -> Option<&ShapeTable> {
        self.shapes.as_ref()
    }

    /// The recipe for the end of `history`: longest literal match, else longest shape match.
    #[inline]
    pub fn lookup(&self, history: &[i32]) -> Option<Hit> {
        self.find(&mut Windows::new(history, self.literal.max_n(), self.shape.max_n()))
    }

    /// [`Index::lookup`] on a history's windows already hashed (their shape keys, if made, under this index's
    /// shape table); windows longer than this pack's contexts are not read.
    #[inline]
    pub fn find(&self, w: &mut Windows) -> Option<Hit> {
        if let Some(hit) = self.literal.probe(w.literal(), EntryKind::Literal) {
            return Some(hit);
        }
        let shapes = self.shapes.as_ref()?;
        self.shape.probe(w.shape(shapes), EntryKind::Shape)
    }

    /// Longest literal and shape contexts this pack holds.
    pub fn max_ns(&self) -> (usize, usize) {
        (self.literal.max_n(), if self.shapes.is_some() { self.shape.max_n() } else { 0 })
    }
}

/// Reference lookup by linear scan over the pack's entries, with keys computed from scratch by
/// the reference window functions. Tests check [`Index::lookup`] against it.
pub fn naive_lookup(pack: &Pack, shapes: Option<&ShapeTable>, history: &[i32]) -> Option<Hit> {
    let scan = |kind: EntryKind, key_of: &dyn Fn(&[i32]) -> u64| {
        (1..=MAX_N.min(history.len())).rev().find_map(|n| {
            let key = key_of(&history[history.len() - n..]);
            let matching: Vec<&Entry> = pack
                .entries()
                .iter()
                .filter(|e| e.kind == kind && usize::from(e.n) == n && e.key == key)
                .collect();
            let best = matching
                .iter()
                .max_by_key(|e| (e.count, std::cmp::Reverse(e.token)))?;
            let total = matching.iter().fold(0u32, |t, e| t.saturating_add(e.count));
            Some(Hit {
                token: best.token as i32,
                count: best.count,
                total,
                kind,
                n: n as u8,
            })
        })
    };
    let literal_key =
        |w: &[i32]| crate::hash::window_key(&w.iter().map(|&t| t as u32).collect::<Vec<_>>());
    scan(EntryKind::Literal, &literal_key).or_else(|| {
        let s = shapes?;
        scan(EntryKind::Shape, &|w: &[i32]| s.window_key(w))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::tests::{lit, meta};
    use crate::shape::tests::{id, table};
    use proptest::prelude::*;


    fn shp(window: &[i32], token: u32, count: u32) -> Entry {
        Entry {
            kind: EntryKind::Shape,
            n: window.len() as u8,
            key: table().window_key(window),
            token,
            count,
        }
    }

    #[test]
    fn longest_literal_then_shape() {
        let pack = Pack::from_entries(
            meta(),
            vec![
                lit(&[1, 2], 10, 5),
                lit(&[2], 11, 3),
                lit(&[2], 12, 1),
                lit(&[7, 8, 9], 13, 2),
                shp(&[id("Ann"), id("\",")], 14, 4),
            ],
        )
        .unwrap();
        let idx = Index::new(&pack, Some(table()));
        let hit = |h: &[i32]| idx.lookup(h);
        assert_eq!(
            hit(&[5, 1, 2]),
            Some(Hit {
                token: 10,
                count: 5,
                total: 5,
                kind: EntryKind::Literal,
                n: 2
            })
        );
        assert_eq!(
            hit(&[5, 3, 2]),
            Some(Hit {
                token: 11,
                count: 3,
                total: 4,
                kind: EntryKind::Literal,
                n: 1
            })
        );
        assert_eq!(hit(&[8, 9]), None, "a partial context is no match");
        // "Bob" never appeared in the pack, but its shape matches "Ann".
        let bob = [id("{"), id("Bob"), id("\",")];
        assert_eq!(
            hit(&bob),
            Some(Hit {
                token: 14,
                count: 4,
                total: 4,
                kind: EntryKind::Shape,
                n: 2
            })
        );
        assert_eq!(
            Index::new(&pack, None).lookup(&bob),
            None,
            "no shape table, no shape lookups"
        );
        for h in [&[5, 1, 2][..], &[5, 3, 2], &[8, 9], &bob, &[]] {
            assert_eq!(idx.lookup(h), naive_lookup(&pack, Some(&table()), h));
        }
        assert_eq!(idx.max_n(), 3);
        assert_eq!(idx.len(), 5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn index_agrees_with_naive_oracle(
            windows in proptest::collection::vec((proptest::collection::vec(0i32..6, 1..5), 0u32..6, 1u32..5, any::<bool>()), 0..40),
            histories in proptest::collection::vec(proptest::collection::vec(0i32..6, 0..10), 1..20),
        ) {
            let entries = windows.iter().map(|(w, t, c, s)| if *s { shp(w, *t, *c) } else { lit(w, *t, *c) }).collect();
            let pack = Pack::from_entries(meta(), entries).unwrap();
            let idx = Index::new(&pack, Some(table()));
            for h in &histories {
                prop_assert_eq!(idx.lookup(h), naive_lookup(&pack, Some(&table()), h));
            }
        }
    }
}
