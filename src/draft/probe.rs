//! How many tokens a draft model may add to a chain: as many as pay at its learned acceptance, none where it does
//! not pay, and now and then a short probe, so that a model judged too weak is re-measured (a probe costs the
//! model's calls and a catch-up pass, so the interval doubles while it keeps losing).

use super::config::DrafterConfig;
use super::control::{best_length, Verify};
use super::step::MAX_DRAFT;

/// The probe schedule of one drafter's draft model.
pub(super) struct ModelProbes {
    /// Steps since the model last drafted while it did not pay.
    wait: u32,
    /// Steps between probes now.
    every: u32,
}

/// What the model may do at this step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct ModelBudget {
    /// Tokens it may add to the chain.
    pub len: usize,
    /// Whether those tokens are a probe of a model that does not pay (drafted whole).
    pub probe: bool,
}

impl ModelBudget {
    const NONE: ModelBudget = ModelBudget { len: 0, probe: false };
}

impl ModelProbes {
    pub(super) fn new(cfg: &DrafterConfig) -> ModelProbes {
        ModelProbes { wait: 0, every: cfg.model_probe_min }
    }

    /// The budget of a model whose tokens are expected right `p` of the time and cost `cost` plain steps each (None:
    /// no model, so nothing), for a draft of at most `n_max` that must score `need`.
    pub(super) fn budget(&mut self, cost: Option<f64>, p: f32, cfg: &DrafterConfig, verify: &Verify, n_max: usize, need: f64) -> ModelBudget {
        let Some(d) = cost else {
            return ModelBudget::NONE;
        };
        if !cfg.adaptive {
            return ModelBudget { len: n_max, probe: false };
        }
        let costs = &[d; MAX_DRAFT][..n_max];
        match best_length(&[p; MAX_DRAFT][..n_max], verify, costs, need) {
            // A model that would not pay even at `model_probe_alpha` acceptance is not probed: with the
            // measured β and d nothing it could show would turn it on, and a probe costs a catch-up pass.
            0 if best_length(&[cfg.model_probe_alpha; MAX_DRAFT][..n_max], verify, costs, need) == 0 => ModelBudget::NONE,
            0 => {
                self.wait += 1;
                if self.wait < self.every {
                    return ModelBudget::NONE;
                }
                self.wait = 0;
                self.every = (self.every * 2).min(cfg.model_probe_max);
                ModelBudget { len: cfg.probe_len.clamp(1, n_max), probe: true }
            }
            m => {
                self.every = cfg.model_probe_min;
                ModelBudget { len: m, probe: false }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::beta::BetaModel;

    fn cfg() -> DrafterConfig {
        DrafterConfig { model_probe_min: 2, model_probe_max: 8, probe_len: 3, ..DrafterConfig::default() }
    }

    /// β of 1 at every length: drafts cost only the model's own time.
    fn free() -> Verify {
        Verify::alone(&BetaModel::new(&[(1, 1.0), (16, 1.0)]))
    }

    #[test]
    fn a_model_that_pays_drafts_and_one_that_loses_is_probed_ever_more_rarely() {
        let (c, v) = (cfg(), free());
        let mut probes = ModelProbes::new(&c);
        assert_eq!(probes.budget(None, 0.9, &c, &v, 8, 1.05), ModelBudget::NONE);
        assert!(probes.budget(Some(0.05), 0.9, &c, &v, 8, 1.05).len > 0);
        // Right a tenth of the time at a tenth of a step a token, it loses, though at 0.9 it would pay: probed
        // after 2 steps, then after 4, 8, and 8 again (the cap).
        let probed: Vec<usize> = (1..=30).filter(|_| probes.budget(Some(0.1), 0.1, &c, &v, 8, 1.05).probe).collect();
        assert_eq!(probed, vec![2, 6, 14, 22, 30]);
        // Paying again resets the interval to its least.
        assert!(!probes.budget(Some(0.05), 0.9, &c, &v, 8, 1.05).probe);
        let next = (1..=8).find(|_| probes.budget(Some(0.1), 0.1, &c, &v, 8, 1.05).probe);
        assert_eq!(next, Some(2));
    }

    #[test]
    fn a_model_too_dear_to_pay_at_any_likely_acceptance_is_never_probed() {
        let (c, v) = (cfg(), free());
        let mut probes = ModelProbes::new(&c);
        // A token costs two plain steps: even always right it would not pay.
        assert!((0..20).all(|_| probes.budget(Some(2.0), 0.1, &c, &v, 8, 1.05) == ModelBudget::NONE));
    }

    #[test]
    fn without_the_control_a_model_drafts_the_whole_budget() {
        let c = DrafterConfig { adaptive: false, ..cfg() };
        let mut probes = ModelProbes::new(&c);
        assert_eq!(probes.budget(Some(5.0), 0.0, &c, &free(), 6, 1.05), ModelBudget { len: 6, probe: false });
    }
}
