//! Misses: positions the next compile could learn, recorded once the target's token there is known.

use std::collections::VecDeque;

use super::stats::Stats;

/// Tokens of context kept with a miss.
pub const MISS_CONTEXT: usize = 8;

/// Why a miss was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissKind {
    /// The target rejected a drafted token; `token` is what it produced instead.
    Rejected,
    /// The pack had no recipe, yet the request's own n-grams predicted the target's token.
    Uncovered,
}

/// A position the next compile could learn: after `context`, the target produced `token`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Miss {
    pub kind: MissKind,
    /// Up to [`MISS_CONTEXT`] tokens before the position, oldest first.
    pub context: Vec<i32>,
    pub token: i32,
}

/// A miss waiting for the target's token at `pos`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pos: usize,
    kind: MissKind,
    /// Rejected: the drafted token; Uncovered: the n-gram prediction.
    expect: i32,
    context: [i32; MISS_CONTEXT],
    context_len: usize,
}

impl Pending {
    /// A pending miss at `pos`, whose context is the end of `hist` followed by `extra`.
    pub(super) fn new(hist: &[i32], extra: &[i32], pos: usize, kind: MissKind, expect: i32) -> Pending {
        let mut context = [0; MISS_CONTEXT];
        let len = (hist.len() + extra.len()).min(MISS_CONTEXT);
        for (slot, &t) in context[..len].iter_mut().rev().zip(extra.iter().rev().chain(hist.iter().rev())) {
            *slot = t;
        }
        Pending { pos, kind, expect, context, context_len: len }
    }
}

/// Settles `pending` misses now that the target's tokens (`toks`) are known: the ones that proved to be misses
/// go into `misses` while it holds fewer than `capacity`, the rest are counted as dropped.
pub(super) fn resolve(toks: &[i32], pending: &mut Vec<Pending>, misses: &mut VecDeque<Miss>, capacity: usize, stats: &mut Stats) {
    for p in pending.drain(..) {
        let ctx = &p.context[..p.context_len];
        if p.pos >= toks.len() || p.pos < ctx.len() || &toks[p.pos - ctx.len()..p.pos] != ctx {
            continue;
        }
        let actual = toks[p.pos];
        let record = match p.kind {
            MissKind::Rejected => actual != p.expect,
            MissKind::Uncovered => actual == p.expect,
        };
        if !record {
            continue;
        }
        if misses.len() < capacity {
            misses.push_back(Miss { kind: p.kind, context: ctx.to_vec(), token: actual });
            stats.misses_recorded += 1;
        } else {
            stats.misses_dropped += 1;
        }
    }
}
