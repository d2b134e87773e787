//! Acceptance rates: how often drafted tokens were kept, as exponentially decayed counts per drafted position or
//! per [`Class`](super::class::Class) of evidence, shrunk towards a prior where trials are few.

use super::step::MAX_DRAFT;

/// Acceptance rates as exponentially decayed counts, one per slot: per drafted position (slot i is
/// P(token i accepted | tokens before it accepted)) or per [`Class`](super::class::Class) of evidence.
#[derive(Clone, Debug)]
pub struct Rates<const N: usize> {
    num: [f32; N],
    den: [f32; N],
}

impl<const N: usize> Default for Rates<N> {
    fn default() -> Self {
        Rates { num: [0.0; N], den: [0.0; N] }
    }
}

impl<const N: usize> Rates<N> {
    /// One trial in slot `i`.
    #[inline]
    pub fn observe(&mut self, i: usize, accepted: bool, decay: f32) {
        let i = i.min(N - 1);
        self.num[i] = self.num[i] * decay + if accepted { 1.0 } else { 0.0 };
        self.den[i] = self.den[i] * decay + 1.0;
    }

    /// A step drafted `drafted` tokens and the target accepted the first `accepted`: positions up to the
    /// first rejection were trials.
    pub fn observe_run(&mut self, drafted: usize, accepted: usize, decay: f32) {
        for i in 0..drafted.min(accepted + 1).min(N) {
            self.observe(i, i < accepted, decay);
        }
    }

    /// The decayed counts: accepted, and trials, per slot.
    pub fn counts(&self) -> (&[f32; N], &[f32; N]) {
        (&self.num, &self.den)
    }

    /// Rates from decayed counts (as [`Rates::counts`] gives them); `None` unless both have `N` slots.
    pub fn from_counts(num: &[f32], den: &[f32]) -> Option<Self> {
        Some(Rates { num: num.try_into().ok()?, den: den.try_into().ok()? })
    }

    /// The measured rate of slot `i` alone (0 before any trial).
    pub fn rate(&self, i: usize) -> f32 {
        let i = i.min(N - 1);
        if self.den[i] > 0.0 { self.num[i] / self.den[i] } else { 0.0 }
    }

    /// Estimate for slot `i`, shrunk towards `prior` by `weight` pseudo-samples.
    #[inline]
    pub fn estimate(&self, i: usize, prior: f32, weight: f32) -> f32 {
        let i = i.min(N - 1);
        (self.num[i] + weight * prior) / (self.den[i] + weight)
    }
}

/// Per drafted position.
pub type Acceptance = Rates<MAX_DRAFT>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_is_conditional_per_position() {
        let mut a = Acceptance::default();
        a.observe_run(3, 1, 1.0);
        assert_eq!(a.estimate(0, 0.5, 1.0), 0.75);
        assert_eq!(a.estimate(1, 0.5, 1.0), 0.25);
        assert_eq!(
            a.estimate(2, 0.5, 1.0),
            0.5,
            "position 3 was never reached: prior"
        );
    }
}
