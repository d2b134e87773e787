//! One gate for steps a sequence has to itself and one for steps it shares with other slots. Alone, a verify pass
//! of a few more tokens costs what one token does (Qwen2.5-Coder-1.5B at `-np 4` here: a slot alone verifying 1, 2
//! and 3 tokens took 66.5, 65.3 and 63.1 ms), beside three other slots a second token in every slot took 1.5 times
//! the step (112 ms against 74). What one gate measured beside others says little of drafting alone: served on
//! HumanEval (session 80), the last request of each round ran alone for 104–118 steps with drafting switched off by
//! windows measured beside three slots (7.0–7.8 s), where a run whose gate happened to be on drafted there (76–82
//! steps, 5.2–5.7 s). So each regime has its own windows and its own choice, and a switch cuts the interval since
//! the gate's last call out of its window: that time was the other gate's.

use super::gate::{Arm, Gate, GateConfig};

/// The gates, and which of them ran the last call.
#[derive(Clone, Debug)]
pub struct Gates {
    /// `[alone, shared]`, or one gate for both ([`GateConfig::apart`] off).
    gates: Vec<Gate>,
    current: usize,
}

impl Gates {
    pub fn new(cfg: GateConfig) -> Gates {
        let n = if cfg.apart { 2 } else { 1 };
        Gates { gates: vec![Gate::new(cfg); n], current: 0 }
    }

    /// The gate of a call from a sequence that is `alone` in its step or not. On a switch the gate's next interval
    /// is cut out of its window (and the step it ends, if the call is not the step's first).
    pub fn at(&mut self, alone: bool) -> &mut Gate {
        let i = usize::from(!alone).min(self.gates.len() - 1);
        if i != self.current {
            self.gates[i].away();
            self.current = i;
        }
        &mut self.gates[i]
    }

    /// The gate of the last call: the one its step's drafts and kept tokens count for.
    pub fn current(&self) -> &Gate {
        &self.gates[self.current]
    }

    pub fn current_mut(&mut self) -> &mut Gate {
        &mut self.gates[self.current]
    }

    /// A prompt was decoded before the next call: no gate's time.
    pub fn prompt(&mut self) {
        for g in &mut self.gates {
            g.away();
        }
    }

    /// The gate of steps alone, and the one of shared steps (None: one gate for both).
    pub fn regimes(&self) -> (&Gate, Option<&Gate>) {
        (&self.gates[0], self.gates.get(1))
    }

    /// The last full window of the current gate, numbered over all gates (a window's number changes when one closes
    /// in either), as the step log marks them.
    pub fn last_window(&self) -> Option<(u64, Arm, f64)> {
        let n = self.gates.iter().map(|g| g.ran[0] + g.ran[1]).sum();
        self.current().last_window().map(|(_, arm, rate)| (n, arm, rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `steps` server steps of `slots` slots at `step_ns` each, every slot's call at the step's start, drafting
    /// when its gate is on and keeping `kept` tokens a slot then; returns the time after them.
    fn serve(g: &mut Gates, slots: usize, steps: usize, step_ns: impl Fn(bool) -> u64, kept: usize, mut now: u64) -> u64 {
        for _ in 0..steps {
            let on = g.current().arm() == Arm::On;
            let gate = g.at(slots == 1);
            gate.step(slots, 0, on, false, Some(1e6));
            for s in 0..slots {
                gate.call(now + s as u64 * 10_000, s == 0);
            }
            let on = gate.arm() == Arm::On;
            if on {
                gate.drafted(4 * slots);
            }
            now += step_ns(on);
            if on {
                for _ in 0..slots {
                    gate.accepted(kept);
                }
            }
        }
        now
    }

    #[test]
    fn drafting_that_loses_beside_others_is_still_measured_alone() {
        // Beside three slots a drafting step takes 2.5 plain steps for 2 tokens a slot: the shared gate turns
        // drafting off. Alone one takes 1.05 plain steps for 2 tokens: the gate of steps alone keeps drafting on.
        let mut g = Gates::new(GateConfig::default());
        let now = serve(&mut g, 4, 2000, |on| if on { 250_000_000 } else { 100_000_000 }, 1, 0);
        assert_eq!(g.current().arm(), Arm::Off, "beside others: {:?}", g.current().rates());
        serve(&mut g, 1, 400, |on| if on { 63_000_000 } else { 60_000_000 }, 1, now + 1_000_000_000);
        let (alone, shared) = g.regimes();
        assert_eq!(alone.arm(), Arm::On, "alone: {:?}", alone.rates());
        assert!(alone.ran[0] > 3 * alone.ran[1], "alone it drafts most windows: {:?}", alone.ran);
        assert!(shared.unwrap().ran[1] > shared.unwrap().ran[0], "{:?}", shared.unwrap().ran);
    }

    #[test]
    fn with_one_gate_the_choice_made_beside_others_holds_alone() {
        // The same, one gate: it reaches the steps alone with drafting off, and keeps it off for most of them.
        let mut g = Gates::new(GateConfig { apart: false, ..GateConfig::default() });
        let now = serve(&mut g, 4, 2000, |on| if on { 250_000_000 } else { 100_000_000 }, 1, 0);
        let before = g.current().ran;
        serve(&mut g, 1, 400, |on| if on { 63_000_000 } else { 60_000_000 }, 1, now + 1_000_000_000);
        let (one, none) = g.regimes();
        assert!(none.is_none());
        let off = one.ran[1] - before[1];
        let on = one.ran[0] - before[0];
        assert!(off >= on, "alone after off beside others: on {on}, off {off} windows");
    }

    #[test]
    fn a_switch_cuts_the_interval_since_the_gates_last_call() {
        // Alone for 100 steps, beside others for a second, alone again: the second's time is not the lone gate's.
        let mut g = Gates::new(GateConfig::default());
        let now = serve(&mut g, 1, 100, |_| 60_000_000, 0, 0);
        let pauses = g.regimes().0.pauses;
        g.at(false).call(now, true);
        g.at(true).call(now + 300_000_000, true);
        assert_eq!(g.regimes().0.pauses, pauses + 1);
    }
}
