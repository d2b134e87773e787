//! Counters the FFI copies out: plain data, `repr(C)`, no pointers.

use super::step::MAX_DRAFT;

/// Counters for one sequence, or summed over all of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// `propose` calls.
    pub calls: u64,
    /// Calls that proposed at least one token.
    pub drafts: u64,
    pub tokens_drafted: u64,
    pub tokens_accepted: u64,
    /// Drafted tokens by source.
    pub literal_hits: u64,
    pub shape_hits: u64,
    pub context_hits: u64,
    pub model_hits: u64,
    /// Drafted tokens from the live index (what the target answered earlier while serving).
    pub live_hits: u64,
    /// Tokens drafted from requests' predicted outputs that the target kept, and that it discarded.
    pub prediction_accepted: u64,
    pub prediction_rejected: u64,
    /// Steps on which a draft model that did not pay drafted anyway, to re-measure.
    pub model_probes: u64,
    /// Calls where the control judged drafting not worth it.
    pub steps_off: u64,
    /// Calls in the gate's windows without drafting (see [`super::gate`]).
    pub steps_gated: u64,
    /// Drafts made while off, to re-measure acceptance.
    pub probes: u64,
    pub misses_recorded: u64,
    /// Misses lost because the buffer was full.
    pub misses_dropped: u64,
    /// Estimated acceptance of the first drafted token.
    pub alpha: f32,
    /// Estimated verify cost: element g is β(g + 1), a step verifying g drafted tokens.
    pub beta: [f32; MAX_DRAFT + 1],
}

impl Stats {
    /// Adds `other`'s counters (not α and β) into `self`.
    pub(crate) fn add_counts(&mut self, o: &Stats) {
        self.calls += o.calls;
        self.drafts += o.drafts;
        self.tokens_drafted += o.tokens_drafted;
        self.tokens_accepted += o.tokens_accepted;
        self.literal_hits += o.literal_hits;
        self.shape_hits += o.shape_hits;
        self.context_hits += o.context_hits;
        self.model_hits += o.model_hits;
        self.live_hits += o.live_hits;
        self.prediction_accepted += o.prediction_accepted;
        self.prediction_rejected += o.prediction_rejected;
        self.model_probes += o.model_probes;
        self.steps_off += o.steps_off;
        self.steps_gated += o.steps_gated;
        self.probes += o.probes;
        self.misses_recorded += o.misses_recorded;
        self.misses_dropped += o.misses_dropped;
    }
}
