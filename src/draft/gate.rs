//! The gate: whether drafting pays at all, measured rather than modelled. The break-even control decides
//! each draft from estimates (β per call size, acceptance per kind of evidence); with several slots those
//! rest on calls other slots shape, split calls and prompts decoded between steps, and served at `-np 4` the
//! control drafted at 61% acceptance and ran at 0.86× of the same server drafting nothing. So the drafter
//! also measures what it is for: tokens produced per second over all sequences, in windows of steps
//! alternating between the control drafting as it sees fit ("on") and not drafting at all ("off"). The
//! faster arm runs; the other is re-measured one window in [`GateConfig::explore_every`]. A window with a
//! pause in it (no request, a long prompt) is thrown away rather than counted.

/// Tuning of the gate.
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// `propose` calls (over all sequences) per window.
    pub window: u32,
    /// One window in this many measures the arm that is not running.
    pub explore_every: u32,
    /// Weight of the newest window in an arm's rate.
    pub weight: f64,
    /// A gap between calls longer than this (ns) voids the window: the server was idle or busy elsewhere.
    pub idle_ns: u64,
    /// Drafting runs only while it measures at least this much faster than not drafting (0.02 = 2%), so
    /// noise does not keep a loser on.
    pub margin: f64,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig { window: 48, explore_every: 8, weight: 0.3, idle_ns: 400_000_000, margin: 0.02 }
    }
}

/// The two arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    On,
    Off,
}

/// Measured tokens per second of each arm, and the window being measured.
#[derive(Clone, Debug)]
pub struct Gate {
    cfg: GateConfig,
    arm: Arm,
    /// Tokens per second, decayed over windows: [on, off].
    rate: [Option<f64>; 2],
    windows: u64,
    start_ns: Option<u64>,
    last_ns: u64,
    calls: u32,
    tokens: u64,
    /// Windows run with each arm, and windows voided.
    pub ran: [u64; 2],
    pub voided: u64,
}

impl Gate {
    pub fn new(cfg: GateConfig) -> Gate {
        Gate { cfg, arm: Arm::On, rate: [None, None], windows: 0, start_ns: None, last_ns: 0, calls: 0, tokens: 0, ran: [0, 0], voided: 0 }
    }

    /// Whether the current window drafts.
    pub fn arm(&self) -> Arm {
        self.arm
    }

    /// Measured rates [on, off], tokens per second.
    pub fn rates(&self) -> [Option<f64>; 2] {
        self.rate
    }

    /// A `propose` call at `now_ns`: the sequence produced one token (the one just sampled). Closes the window
    /// when it is full and picks the next window's arm.
    pub fn call(&mut self, now_ns: u64) {
        let Some(start) = self.start_ns else {
            self.restart(now_ns);
            return;
        };
        if now_ns.saturating_sub(self.last_ns) > self.cfg.idle_ns {
            self.voided += 1;
            self.restart(now_ns);
            return;
        }
        self.last_ns = now_ns;
        self.calls += 1;
        self.tokens += 1;
        if self.calls < self.cfg.window {
            return;
        }
        let secs = now_ns.saturating_sub(start) as f64 * 1e-9;
        if secs > 0.0 {
            let i = self.arm as usize;
            let r = self.tokens as f64 / secs;
            self.rate[i] = Some(self.rate[i].map_or(r, |old| old + self.cfg.weight * (r - old)));
            self.ran[i] += 1;
        }
        self.windows += 1;
        self.arm = self.next_arm();
        self.restart(now_ns);
    }

    /// Drafted tokens the target kept: produced in this window too.
    pub fn accepted(&mut self, n: usize) {
        if self.start_ns.is_some() {
            self.tokens += n as u64;
        }
    }

    fn restart(&mut self, now_ns: u64) {
        self.start_ns = Some(now_ns);
        self.last_ns = now_ns;
        self.calls = 0;
        self.tokens = 0;
    }

    /// The faster arm, except every `explore_every`-th window (and until both are measured): the other.
    fn next_arm(&self) -> Arm {
        let best = match self.rate {
            [Some(on), Some(off)] if on >= off * (1.0 + self.cfg.margin) => Arm::On,
            [Some(_), Some(_)] => Arm::Off,
            [None, _] => return Arm::On,
            [_, None] => return Arm::Off,
        };
        if self.windows.is_multiple_of(u64::from(self.cfg.explore_every.max(1))) {
            match best {
                Arm::On => Arm::Off,
                Arm::Off => Arm::On,
            }
        } else {
            best
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `windows` windows of a server where one step takes `step_ns` and yields `on_tokens` tokens per
    /// call when drafting, 1 when not; returns the windows each arm ran.
    fn simulate(on_tokens: f64, on_step_ns: u64, off_step_ns: u64, windows: usize) -> [u64; 2] {
        let cfg = GateConfig { window: 10, explore_every: 5, ..GateConfig::default() };
        let mut g = Gate::new(cfg);
        let mut now = 0u64;
        let mut carry = 0.0;
        for _ in 0..windows * 10 + 1 {
            let drafting = g.arm() == Arm::On;
            now += if drafting { on_step_ns } else { off_step_ns };
            g.call(now);
            if drafting {
                carry += on_tokens - 1.0;
                let whole = carry.floor();
                carry -= whole;
                g.accepted(whole as usize);
            }
        }
        g.ran
    }

    #[test]
    fn drafting_that_pays_runs_most_windows() {
        // Drafting: 2.5 tokens a step at 1.5× the step time: 1.67× faster.
        let ran = simulate(2.5, 15_000_000, 10_000_000, 100);
        assert!(ran[0] > 70 && ran[1] >= 10, "{ran:?}");
    }

    #[test]
    fn drafting_that_loses_is_switched_off() {
        // Drafting: 1.3 tokens a step at 1.5× the step time: 0.87× — off, re-measured now and then.
        let ran = simulate(1.3, 15_000_000, 10_000_000, 100);
        assert!(ran[1] > 70 && ran[0] >= 10, "{ran:?}");
    }

    #[test]
    fn a_tie_goes_to_not_drafting() {
        let ran = simulate(1.5, 15_000_000, 10_000_000, 100);
        assert!(ran[1] > ran[0], "{ran:?}");
    }

    #[test]
    fn an_idle_gap_voids_the_window() {
        let mut g = Gate::new(GateConfig { window: 4, ..GateConfig::default() });
        for t in [0, 10, 20] {
            g.call(t * 1_000_000);
        }
        g.call(2_000_000_000);
        assert_eq!((g.voided, g.ran), (1, [0, 0]));
        for t in 1..=4 {
            g.call(2_000_000_000 + t * 10_000_000);
        }
        assert_eq!(g.ran, [1, 0], "a whole window after the gap counts");
        assert_eq!(g.arm(), Arm::Off, "the unmeasured arm is measured next");
    }
}
