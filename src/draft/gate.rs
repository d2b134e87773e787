//! The gate: whether drafting pays at all, measured rather than modelled. The break-even control decides
//! each draft from estimates (β per call size, acceptance per kind of evidence); with several slots those
//! rest on calls other slots shape, split calls and prompts decoded between steps, and served at `-np 4` the
//! control drafted at 61% acceptance and ran at 0.86× of the same server drafting nothing. So the drafter
//! also measures what it is for: tokens produced per second over all sequences, in windows of `propose` calls
//! alternating between the control drafting as it sees fit ("on") and not drafting at all ("off"; sure drafts,
//! which both arms make, are no arm's: [`GateConfig::pass`]). The
//! faster arm runs; the other is re-measured now and then: after [`GateConfig::explore_every`] windows, or after one
//! when the first choice was against drafting (whose first window drafted on the control's priors), then after twice
//! as many each time the re-measurement confirms the choice (up to [`GateConfig::explore_max`]), after
//! `explore_every` again when it overturns it. A steady choice so pays
//! for its check about one window in `explore_max`, not one in `explore_every`. And never later than is cheap: a
//! window of the slower arm costs the gap between the arms, so arms closer than [`GateConfig::explore_cost`] times
//! the interval are re-checked sooner, arms that tie every other window (which costs nothing). Served on HumanEval
//! without a pack (Qwen2.5-Coder-1.5B, `-np 1`), the first drafting window fell on a prompt with nothing to copy and
//! tied with not drafting (29.0 against 29.3 tok/s); 8 windows of not drafting followed, the rest of the run (1.05×,
//! ngram-simple 1.30×). A pause (no request, a long
//! prompt) is cut out of the window it falls in: it is no arm's cost. So is a server step that decoded a
//! prompt beside the other slots' tokens ([`Gate::away`]): at `-np 4` prompts were 54% of the wall time, and
//! whether a window held one or two of them decided its rate more than drafting did.
//!
//! A window ends where a server step begins (session 20): the server reports every slot's kept tokens before it
//! asks for the next drafts, so a step's drafts all count for the arm that made them; windows that ended inside a
//! step at `-np 4` gave some slots' kept tokens to the other arm and timed two or three decodes by turns.
//!
//! A re-measurement of the losing arm is what the gate costs, and when the arms are far apart it needs few
//! calls: the decision only turns on a difference of [`GateConfig::margin`]. Drafting at 5.7 tokens a step (code
//! edits, verification nearly free as in vLLM on this CPU) made a window of 48 plain steps the single largest
//! cost of a six-request replay (5.25× against 7.81× with no gate). So the losing arm is re-measured in a short
//! window ([`GateConfig::short_window`] server steps) when the last comparison found the arms [`GateConfig::far`]
//! apart, and before drafting was ever switched off, when the drafting windows made that many tokens per call.
//! Steps, not calls: with several slots a step is several calls, and a window of a few steps is mostly whether
//! a prompt was decoded in it (served at `-np 4` with short windows of 12 calls, the gate split its windows 34
//! drafting and 25 not, where a steady choice re-measures about one in 32, and ran 1.00× of plain).
//!
//! With several slots a window's tokens per second say as much about how many slots were generating (a step of
//! eight slots yields 8 tokens in 127 ms, one of three 3 in 60 ms, on Qwen2.5-Coder-1.5B at `-np 8`) as about
//! drafting, so there the gate counts its time in plain steps ([`Clock::PlainSteps`]): each step's time over what a
//! step of as many slots at one token each was measured to take lately (in either arm: steps in which no slot
//! drafted), at the step's context ([`super::unit`]). Not drafting reads about one token a slot per plain step
//! whatever the occupancy, drafting what it gains. Measured rather than priced by the β model: its buckets count
//! tokens, not slots, and it priced the plain step of four slots 21–33% above its wall time at `-np 4` (three slots'
//! steps, slower in place, lifted it). A number of slots not yet seen in a plain step takes the β model's price,
//! scaled by what plain steps measured against it: a window that drafts at every step must still close.
//! Served at `-np 8` on wall time the gate kept drafting off in 23 of 27 windows of a round where it had last
//! measured drafting 28% faster (55.6 against 43.5 tok/s).
//!
//! A window also spans at least [`GateConfig::min_steps`] server steps: 48 calls are 48 steps alone but six at
//! `-np 8`, where windows of not drafting read 0.77–1.57 tokens a slot per plain step and single windows decided
//! the choice. Part of that spread was the steps in which a request ended: the server answers it and takes up the
//! next in them (seven-slot steps right after a slot left took up to 208 ms against 90), so they are cut out as a
//! prompt's step is ([`Gate::step`]'s `left`).
//!
//! The running arm's rate is a decayed average of its recent windows. The other arm's rate dates from its last
//! run, often on other text (drafting pays on a JSON skeleton, not in a free-text value), so a re-measurement
//! replaces it rather than nudging it: blended in at the running weight, one unlucky first window of drafting
//! kept drafting off for hundreds of windows (the demo's pack ran 1.01× in one run and 1.29× in the next).
//! The arm that was running goes on being blended in after such a re-measurement: replaced by its first window
//! after each check of the other arm, one unlucky window there turned drafting off for as long as the checks kept
//! confirming it (replayed alone on 48 HumanEval prompts: off from the 29th to the 45th, 1.73× against 1.81×).

use super::unit::PlainSteps;

/// Tuning of the gate.
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// `propose` calls (over all sequences) per window.
    pub window: u32,
    /// Windows between re-measurements of the arm that is not running after a re-measurement overturned the
    /// choice, and after a first choice for drafting. A first choice against drafting (one window of each arm) is
    /// re-checked after one window, the interval doubling from there: the first drafting window drafts with the
    /// control's priors, before it learned what is kept (served alone, the first drafting window read 0.87–1.00 of
    /// not drafting in six server runs of six, most later ones 1.1–1.3, and waiting eight windows to re-check it
    /// held drafting off for a third of a run).
    pub explore_every: u32,
    /// The longest interval between re-measurements, reached by doubling while they confirm the choice.
    pub explore_max: u32,
    /// The share of the rate re-measuring the slower arm may cost: with the arms `gap` apart (0.02 = 2%), the
    /// interval is at most `gap / explore_cost` windows, the re-measurement included.
    pub explore_cost: f64,
    /// Weight of the newest window in an arm's rate.
    pub weight: f64,
    /// A gap between calls longer than this (ns) is a pause, cut out of the window: the server was idle or busy
    /// elsewhere.
    pub idle_ns: u64,
    /// Drafting runs only while it measures at least this much faster than not drafting (0.02 = 2%), so
    /// noise does not keep a loser on.
    pub margin: f64,
    /// Arms this many times apart (rates, or tokens per call while drafting before the other was measured) are
    /// re-measured in windows of `short_window` server steps (at most `window` calls).
    pub far: f64,
    pub short_window: u32,
    /// A window (not a short one) also spans at least this many server steps: alone a window of `window` calls is
    /// as many steps, at `-np 8` only six, and served there windows of not drafting read 0.86–1.24 tokens a slot per
    /// plain step (sd 0.088, requests' ends cut out) where drafting gained about 3%: single windows decided the
    /// choice at random. Windows of 24 steps read with sd 0.031.
    pub min_steps: u32,
    /// A drafting window closes only once its arm drafted this many tokens beyond sure ones (or after four
    /// windows' worth of calls): one in which the control drafted nothing timed plain decoding against plain
    /// decoding. Served on SmolLM2-135M's JSON extraction (`-np 1`, no pack), the first drafting window drafted
    /// nothing and read 68 tok/s against the next window's 73, and drafting stayed off for the run: 1.02–1.06× of
    /// plain in four runs of seven, 1.20–1.22× in the others.
    pub min_drafted: u32,
    /// Both arms draft a chain's first tokens where each is expected right at least this often (acceptance
    /// learned per kind of evidence), and a step that verified only such tokens is cut out of the windows: a
    /// long copy of the prompt pays wherever a verify pass of its length pays at all, so the gate measures
    /// what is in doubt, the control's other drafts against none. Without it, windows of not drafting fell on
    /// 48-token copies of a docstring (HumanEval, replayed: 1.36× with them, 1.48× with no gate at all), and a
    /// window's rate said more about how much of its text was a copy than about drafting.
    pub pass: f32,
    /// What a window's time is counted in; None: [`Clock::PlainSteps`], whatever the number of slots. Alone
    /// (`-np 1`, SmolLM2-135M's JSON extraction, 16 clients queued, three rounds) wall-time windows of not drafting
    /// read 140–172 tok/s, plain-step ones 0.977–1.015: the machine's own drift, which plain steps divide out, was
    /// larger than what drafting gained, and the plugin ran 1.025× of plain on wall time, 1.051× in plain steps.
    pub clock: Option<Clock>,
    /// Steps a sequence has alone and steps it shares have a gate each ([`super::gates::Gates`]); off: one gate.
    pub apart: bool,
    /// On [`Clock::PlainSteps`], the off arm starts at the rate it has by construction, a slot's token per plain
    /// step, and is first measured when it is first re-checked; off: a window of not drafting follows the first
    /// drafting window. That window measured the unit it is counted in, and where a gate has few windows it was a
    /// large part of them: at `-np 4` the gate of steps alone runs only in a round's last request, about a hundred
    /// steps, two windows, the second of which did not draft (session 80, HumanEval). Replayed on that run's three
    /// plain machines (HumanEval, 32 requests): 1.093–1.099× plain against 1.088–1.094× measuring it.
    pub off_one: bool,
    /// On [`Clock::PlainSteps`], a plain step is priced at the cells its slots hold ([`super::unit`]); off: at the
    /// mean of recent plain steps of as many slots, whatever their context.
    pub by_context: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            window: 48,
            explore_every: 8,
            explore_max: 32,
            explore_cost: 0.005,
            weight: 0.3,
            idle_ns: 400_000_000,
            margin: 0.02,
            far: 1.5,
            short_window: 12,
            min_steps: 24,
            min_drafted: 8,
            pass: 0.95,
            clock: None,
            apart: true,
            off_one: true,
            by_context: true,
        }
    }
}

/// What the gate counts a window's time in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Seconds: rates are tokens per second.
    Wall,
    /// Plain steps a slot: each step's time over the recent wall time of plain steps of as many slots
    /// ([`Gate::step`]), so rates are tokens a slot per plain step, about 1 without drafting.
    PlainSteps,
}

/// A server step as the gate learns of it at the next step's first call ([`Gate::step`]).
#[derive(Clone, Copy, Debug, Default)]
struct Ended {
    /// Generating slots, the cells of context they held, and whether any of them verified a draft.
    slots: usize,
    ctx: usize,
    drafted: bool,
    /// A slot of the step before was not in it: the server finished that request in it.
    left: bool,
    /// The β model's price of its slots at one token each (ns).
    price: Option<f64>,
}

/// The two arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    On,
    Off,
}

/// Measured rates of each arm (on its [`Clock`]), and the window being measured.
#[derive(Clone, Debug)]
pub struct Gate {
    cfg: GateConfig,
    arm: Arm,
    /// Tokens per unit of the clock, decayed over windows: [on, off].
    rate: [Option<f64>; 2],
    /// Windows of the best arm since the other was last measured; the interval as confirmations doubled it,
    /// and the interval in use (no longer than the gap between the arms makes cheap).
    since_explore: u32,
    confirmed: u32,
    explore_every: u32,
    /// The arm the last full window chose as the best.
    best: Option<Arm>,
    /// The arm of the last full window, and the rate it measured.
    last: Option<Arm>,
    last_rate: f64,
    clock: Clock,
    /// The step the next first call of a step ends.
    ended: Ended,
    /// What plain steps took, the clock's unit.
    plain: PlainSteps,
    /// The current step's first call (ns), and whether nothing in it was cut out so far.
    step_ns: Option<u64>,
    step_whole: bool,
    /// Slots per ns of a plain step like the step being timed ([`Clock::PlainSteps`]; None: none measured yet).
    scale: Option<f64>,
    started: bool,
    /// The window's time so far on the gate's clock, cut steps left out.
    elapsed: f64,
    last_ns: u64,
    calls: u32,
    tokens: u64,
    /// Server steps begun in the current window, and whether it is a short one.
    steps: u32,
    short: bool,
    /// The time since the last call is not this gate's ([`Gate::away`]), and the current step is cut out of the
    /// window; a cut that came inside a step carries to the next.
    away: bool,
    cut: bool,
    carry: bool,
    /// A step verified sure drafts only ([`GateConfig::pass`]): the next step's first call cuts it out.
    sure: bool,
    /// Drafted tokens kept since the last call: the decode before it produced them.
    kept: u64,
    /// Tokens drafted in the current window, sure ones aside.
    drafted: u64,
    /// Tokens per call of the last drafting window.
    on_per_call: f64,
    /// Windows run with each arm, and pauses (and steps that decoded a prompt) cut out of them.
    pub ran: [u64; 2],
    pub pauses: u64,
    /// Steps cut out because they verified sure drafts only.
    pub sure_steps: u64,
}

impl Gate {
    /// A gate on `cfg.clock`, or on plain steps when the config leaves it open.
    pub fn new(cfg: GateConfig) -> Gate {
        let explore_every = cfg.explore_every.max(1);
        let clock = cfg.clock.unwrap_or(Clock::PlainSteps);
        let off = (cfg.off_one && clock == Clock::PlainSteps).then_some(1.0);
        let plain = PlainSteps::new(cfg.by_context);
        Gate {
            cfg,
            arm: Arm::On,
            rate: [None, off],
            since_explore: 0,
            // Set by the first choice (`next_arm`), before it is read.
            confirmed: 0,
            explore_every,
            best: None,
            last: None,
            last_rate: 0.0,
            clock,
            ended: Ended::default(),
            plain,
            step_ns: None,
            step_whole: false,
            scale: None,
            started: false,
            elapsed: 0.0,
            last_ns: 0,
            calls: 0,
            tokens: 0,
            steps: 0,
            short: false,
            away: false,
            cut: false,
            carry: false,
            sure: false,
            kept: 0,
            drafted: 0,
            on_per_call: 0.0,
            ran: [0, 0],
            pauses: 0,
            sure_steps: 0,
        }
    }

    /// Acceptance at which a drafted token passes the "off" arm ([`GateConfig::pass`]).
    pub fn pass(&self) -> f32 {
        self.cfg.pass
    }

    /// Whether any call has reached the gate (at `-np 1` the gate of shared steps never is).
    pub fn used(&self) -> bool {
        self.started
    }

    /// Whether the current window drafts.
    pub fn arm(&self) -> Arm {
        self.arm
    }

    /// Measured rates [on, off]: tokens per second, or a slot's tokens per plain step ([`Gate::clock`]).
    pub fn rates(&self) -> [Option<f64>; 2] {
        self.rate
    }

    /// A `propose` call at `now_ns`, the first of a server step if `new_step`: the sequence produced one token
    /// (the one just sampled). Closes the window when it is full and picks the next window's arm.
    pub fn call(&mut self, now_ns: u64, new_step: bool) {
        if !self.started {
            self.restart(now_ns);
            return;
        }
        let gap = now_ns.saturating_sub(self.last_ns);
        self.last_ns = now_ns;
        let kept = std::mem::take(&mut self.kept);
        if new_step {
            self.cut = std::mem::take(&mut self.carry);
        }
        // Both causes are consumed here: a prompt decoded during a pause must not cut the next step as well.
        let away = std::mem::take(&mut self.away);
        if gap > self.cfg.idle_ns || away {
            self.pauses += 1;
            self.cut = true;
            // A request begun in a step proposes first in the next server iteration, before the step's first call:
            // the tokens the other slots got from the same decode are counted in the next step, cut out with it.
            self.carry = !new_step;
        }
        // Sure drafts slow the decode of the step after the one that drafted them, whatever the arm.
        if new_step && std::mem::take(&mut self.sure) {
            self.sure_steps += 1;
            self.cut = true;
        }
        // A step in which a request ended also carried the server's answer to it and the start of the next request
        // (and the client's side of both, on the same cores): no arm's cost.
        if new_step && std::mem::take(&mut self.ended.left) {
            self.pauses += 1;
            self.cut = true;
        }
        let spoiled = self.cut;
        if new_step && self.clock == Clock::PlainSteps {
            self.time_plain(now_ns, spoiled);
        } else if spoiled {
            self.step_whole = false;
        }
        let dt = match self.clock {
            Clock::Wall => Some(gap as f64 * 1e-9),
            Clock::PlainSteps => self.scale.map(|s| gap as f64 * s),
        };
        let Some(dt) = dt.filter(|_| !self.cut) else {
            // The pause (or the step that decoded a prompt, or one without a price yet) leaves the window with its
            // tokens; what the window measured so far stays.
            return;
        };
        self.elapsed += dt;
        self.calls += 1;
        self.tokens += 1 + kept;
        self.steps += u32::from(new_step);
        // A window ends where a server step begins: every slot's drafts of the step before have been verified and
        // their kept tokens reported (the server accepts before it proposes), so they count for the arm that drafted
        // them. Ended inside a step, the slots called before the switch drafted under one arm and had their kept
        // tokens counted for the other, and windows timed two or three decodes by turns: in the test's server of
        // 4 slots the arms read 1.61x apart where they are 1.08x.
        let ended = if self.short {
            self.calls >= self.cfg.window || self.steps >= self.cfg.short_window.max(1)
        } else {
            self.calls >= self.cfg.window && self.steps >= self.cfg.min_steps
        };
        let measured = self.arm == Arm::Off || self.drafted >= u64::from(self.cfg.min_drafted) || self.calls >= self.cfg.window.saturating_mul(4);
        let full = new_step && ended && measured;
        if !full {
            return;
        }
        if self.elapsed > 0.0 {
            let i = self.arm as usize;
            let r = self.tokens as f64 / self.elapsed;
            if self.arm == Arm::On {
                self.on_per_call = self.tokens as f64 / f64::from(self.calls);
            }
            // The best arm goes on running after a window that re-measured the other: its rate is still its own
            // recent windows', and one window after each re-measurement must not replace it; a re-measurement (the
            // arm is not the best) replaces, also when it follows a window of its own arm (a first choice against
            // drafting re-checked at once, [`GateConfig::off_one`]: blended in, one unlucky first window outweighs the
            // re-check, as the module's last paragraph tells). The off arm's rate by construction is no window's: its
            // first measurement replaces it.
            let running = self.best == Some(self.arm) && self.ran[i] > 0;
            self.rate[i] = Some(match self.rate[i] {
                Some(old) if running => old + self.cfg.weight * (r - old),
                _ => r,
            });
            self.ran[i] += 1;
            self.last = Some(self.arm);
            self.last_rate = r;
        }
        self.arm = self.next_arm();
        // The arm that is not the best (or the off arm, never measured yet) is being re-measured.
        let exploring = self.best.map_or(self.arm == Arm::Off, |b| b != self.arm);
        self.short = exploring && self.far_apart();
        self.restart(now_ns);
    }

    /// Whether the arms measured (or, before the off arm was, the drafting windows' tokens per call) are
    /// `far` apart.
    fn far_apart(&self) -> bool {
        match self.rate {
            [Some(on), Some(off)] if on > 0.0 && off > 0.0 => (on / off).max(off / on) >= self.cfg.far,
            [Some(_), None] => self.on_per_call >= self.cfg.far,
            _ => false,
        }
    }

    /// The step the next call ends (as the first of the next step) had `slots` slots generating, holding `ctx` cells
    /// of context, `drafted` says whether any of them verified a draft, `left` whether a slot generating in the step
    /// before was not in it (its request ended), and the β model prices those slots at one token each at `price_ns`
    /// ([`Clock::PlainSteps`]; wall time ignores all but `left`).
    pub fn step(&mut self, slots: usize, ctx: usize, drafted: bool, left: bool, price_ns: Option<f64>) {
        self.ended = Ended { slots, ctx, drafted, left, price: price_ns.filter(|&p| p > 0.0) };
    }

    /// At `now_ns`, the first call of a step, whose interval since the last call was `spoiled` (a pause, a prompt,
    /// sure drafts): the step that ended here has as its unit the plain step of its slots and context as measured
    /// before it (or priced, corrected by what was measured), and measures it when it was plain and nothing in it was
    /// cut out.
    /// Timed from the step's first call, not by the last interval: a request begun in a step proposes first in the
    /// next server iteration, so its call carries the decode and the step's first call comes microseconds later
    /// (learned as a plain step, such intervals made the gate read drafting at 0.000 tokens a slot per plain step).
    fn time_plain(&mut self, now_ns: u64, spoiled: bool) {
        let Ended { slots, ctx, drafted, price, .. } = self.ended;
        let unit = self.plain.unit_ns(slots, ctx, price);
        self.scale = unit.filter(|_| slots > 0).map(|ns| slots as f64 / ns);
        let wall = self.step_ns.replace(now_ns).map(|s| now_ns.saturating_sub(s));
        let whole = std::mem::replace(&mut self.step_whole, true) && !spoiled;
        let Some(wall_ns) = wall.filter(|&w| w > 0 && whole && slots > 0 && !drafted) else {
            return;
        };
        self.plain.learn(slots, ctx, wall_ns as f64, price);
    }

    /// The last full window: how many windows have been measured, its arm, and the rate it measured.
    pub fn last_window(&self) -> Option<(u64, Arm, f64)> {
        self.last.map(|a| (self.ran[0] + self.ran[1], a, self.last_rate))
    }

    /// What the gate counts time in.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The time up to the next call is no arm's of this gate: a request's prompt was just decoded, in the step the
    /// next call follows (llama-server and vLLM begin a request right after the decode that evaluated its prompt),
    /// or the steps since the gate's last call were another gate's ([`super::gates::Gates`]).
    pub fn away(&mut self) {
        self.away = true;
    }

    /// A sequence drafted only sure tokens ([`GateConfig::pass`]) for the next step, which is then no arm's.
    pub fn sure(&mut self) {
        self.sure = true;
    }

    /// A sequence drafted `n` tokens for the next step, not all of them sure.
    pub fn drafted(&mut self, n: usize) {
        self.drafted += n as u64;
    }

    /// Drafted tokens the target kept, counted with the next call (whose interval produced them).
    pub fn accepted(&mut self, n: usize) {
        self.kept += n as u64;
    }

    fn restart(&mut self, now_ns: u64) {
        self.started = true;
        self.elapsed = 0.0;
        self.last_ns = now_ns;
        self.calls = 0;
        self.tokens = 0;
        self.steps = 0;
        self.drafted = 0;
    }

    /// The interval between re-measurements of the other arm now.
    pub fn explore_every(&self) -> u32 {
        self.explore_every
    }

    /// After a window: the faster arm, or the other when it is due to be re-measured (and until both are
    /// measured); after a re-measurement, the faster arm again. A re-measurement that leaves the choice as it was
    /// doubles the interval; one that overturns it resets the interval; the gap between the arms caps it.
    fn next_arm(&mut self) -> Arm {
        let (on, off) = match self.rate {
            [Some(on), Some(off)] => (on, off),
            [None, _] => return Arm::On,
            [_, None] => return Arm::Off,
        };
        let best = if on >= off * (1.0 + self.cfg.margin) { Arm::On } else { Arm::Off };
        if self.best.is_none() {
            // The first choice: its drafting window drafted on the control's priors, so a choice against drafting is
            // re-checked after one window; one for drafting, which won priors and all, after `explore_every`.
            self.confirmed = if best == Arm::On { self.cfg.explore_every.max(1) } else { 1 };
        }
        let explored = self.best.is_some_and(|b| self.arm != b);
        if explored {
            self.confirmed = if self.best == Some(best) {
                (self.confirmed * 2).min(self.cfg.explore_max.max(self.cfg.explore_every).max(1))
            } else {
                self.cfg.explore_every.max(1)
            };
        }
        let gap = on.max(off) / on.min(off).max(f64::MIN_POSITIVE) - 1.0;
        let cheap = (gap / self.cfg.explore_cost.max(f64::MIN_POSITIVE)).ceil().min(f64::from(u32::MAX)) as u32;
        self.explore_every = self.confirmed.min(cheap.saturating_sub(1)).max(1);
        self.best = Some(best);
        if explored {
            self.since_explore = 0;
            return best;
        }
        self.since_explore += 1;
        if self.since_explore >= self.explore_every {
            self.since_explore = 0;
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

    /// The gate on wall time: what most tests here time, with no step of the server reported.
    fn wall() -> GateConfig {
        GateConfig { clock: Some(Clock::Wall), ..GateConfig::default() }
    }

    /// Runs `windows` windows of a server of one slot where one step takes `step_ns` and yields `on_tokens(window)`
    /// tokens per call when drafting, 1 when not; returns the gate and the calls made with each arm.
    fn run(on_tokens: impl Fn(usize) -> f64, on_step_ns: u64, off_step_ns: u64, windows: usize) -> (Gate, [u64; 2]) {
        run_slots(1, on_tokens, on_step_ns, off_step_ns, windows)
    }

    /// The same with `slots` calls a step (each call `step_ns / slots` after the last).
    fn run_slots(slots: u64, on_tokens: impl Fn(usize) -> f64, on_step_ns: u64, off_step_ns: u64, windows: usize) -> (Gate, [u64; 2]) {
        let cfg = GateConfig { window: 10, min_steps: 1, explore_every: 4, explore_max: 32, short_window: 3, ..wall() };
        let mut g = Gate::new(cfg);
        let mut now = 0u64;
        let mut carry = 0.0;
        let mut calls = [0u64; 2];
        for call in 0..windows * 10 + 1 {
            let drafting = g.arm() == Arm::On;
            calls[g.arm() as usize] += 1;
            now += if drafting { on_step_ns } else { off_step_ns } / slots;
            g.call(now, (call as u64).is_multiple_of(slots));
            if drafting {
                g.drafted(4);
                carry += on_tokens(call / 10) - 1.0;
                let whole = carry.floor();
                carry -= whole;
                g.accepted(whole as usize);
            }
        }
        (g, calls)
    }

    fn simulate(on_tokens: impl Fn(usize) -> f64, on_step_ns: u64, off_step_ns: u64, windows: usize) -> Gate {
        run(on_tokens, on_step_ns, off_step_ns, windows).0
    }

    /// A server of `slots` slots in llama-server's order: each step every slot's call (drafting if the gate's arm at
    /// that call says so), one decode (`on_step_ns` if any slot drafted), then every drafting slot's kept tokens
    /// (`kept_per_draft` on average). Windows of 10 calls end inside a step, as they do when slots come and go.
    fn serve_steps(slots: usize, kept_per_draft: f64, on_step_ns: u64, off_step_ns: u64, steps: usize) -> Gate {
        let cfg = GateConfig { window: 10, min_steps: 1, explore_every: 4, explore_max: 32, ..wall() };
        let mut g = Gate::new(cfg);
        let (mut now, mut carry) = (0u64, 0.0);
        for _ in 0..steps {
            let mut drafted = 0;
            for slot in 0..slots {
                now += 10_000;
                g.call(now, slot == 0);
                if g.arm() == Arm::On {
                    g.drafted(4);
                    drafted += 1;
                }
            }
            now += if drafted > 0 { on_step_ns } else { off_step_ns };
            carry += drafted as f64 * kept_per_draft;
            let whole = carry.floor();
            carry -= whole;
            g.accepted(whole as usize);
        }
        g
    }

    /// A server whose generating slots come and go: `occupancy(step)` slots a step, a plain step of n slots taking
    /// 30 + 12 n ms (priced 25% dearer by the β model); drafting makes each step 10% dearer and keeps a quarter of a
    /// token a slot (1.136× faster).
    fn serve_occupancy(clock: Clock, occupancy: impl Fn(usize) -> usize, steps: usize) -> Gate {
        let cfg = GateConfig { window: 16, min_steps: 1, explore_every: 4, clock: Some(clock), ..GateConfig::default() };
        let mut g = Gate::new(cfg);
        let plain = |n: usize| (30 + 12 * n as u64) * 1_000_000;
        let (mut now, mut carry, mut last) = (0u64, 0.0, (0, false));
        for step in 0..steps {
            let n = occupancy(step);
            let mut drafting = false;
            for slot in 0..n {
                if slot == 0 {
                    g.step(last.0, 0, last.1, false, Some(plain(last.0) as f64 * 1.25));
                }
                now += 10_000;
                g.call(now, slot == 0);
                if g.arm() == Arm::On {
                    g.drafted(2);
                    drafting = true;
                }
            }
            now += if drafting { plain(n) * 11 / 10 } else { plain(n) };
            if drafting {
                carry += 0.25 * n as f64;
                let whole = carry.floor();
                carry -= whole;
                g.accepted(whole as usize);
            }
            last = (n, drafting);
        }
        g
    }

    /// Eight slots, steps that wander as served steps do: a plain step takes 110 ms times a factor that drifts
    /// (each step 0.7 of the last one's deviation plus up to ±15%: six steps' mean varies by 12%, as served windows
    /// of not drafting did at `-np 8`), and drafting makes it 6% dearer for 1.6 kept tokens a step on average, kept
    /// in bursts (6.4 tokens in a quarter of the steps, none in the others): 1.13×. Returns the gate and the share of
    /// steps drafted.
    fn serve_noisy(min_steps: u32, steps: usize) -> (Gate, f64) {
        let cfg = GateConfig { min_steps, clock: Some(Clock::PlainSteps), ..GateConfig::default() };
        let mut g = Gate::new(cfg);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut now, mut drift, mut last_drafted, mut on) = (0u64, 0.0, false, 0usize);
        for _ in 0..steps {
            let mut drafting = false;
            for slot in 0..8 {
                if slot == 0 {
                    g.step(8, 0, last_drafted, false, Some(110e6));
                }
                now += 10_000;
                g.call(now, slot == 0);
                if g.arm() == Arm::On {
                    g.drafted(2);
                    drafting = true;
                }
            }
            drift = 0.7 * drift + 0.15 * (2.0 * uniform() - 1.0);
            let cost = if drafting { 1.06 } else { 1.0 };
            now += (110e6 * (1.0 + drift) * cost) as u64;
            if drafting {
                on += 1;
                if uniform() < 0.25 {
                    g.accepted(6);
                    g.accepted(usize::from(uniform() < 0.4));
                }
            }
            last_drafted = drafting;
        }
        (g, on as f64 / steps as f64)
    }

    #[test]
    fn with_eight_slots_a_window_spans_enough_steps_to_tell_the_arms_apart() {
        // About 10 minutes of a server at -np 8. Windows of 48 calls are six steps here, and single ones decided.
        let (g, on) = serve_noisy(24, 6000);
        assert!(on > 0.85, "drafting pays 13% and runs most steps: {on:.3} ({:?})", g.ran);
        let (g, on1) = serve_noisy(1, 6000);
        assert!(on1 < on - 0.08, "windows of six steps: {on1:.3} ({:?})", g.ran);
    }

    #[test]
    fn with_slots_coming_and_going_plain_steps_time_what_drafting_gains() {
        // Eight slots for 12 steps, then three for 6: a window's tokens per second moves by a third with the slots.
        let occupancy = |step: usize| if step % 18 < 12 { 8 } else { 3 };
        let g = serve_occupancy(Clock::PlainSteps, occupancy, 4000);
        let [on, off] = g.rates().map(Option::unwrap);
        assert!((off - 1.0).abs() < 0.02, "not drafting is a token a slot per plain step: {off:.3}");
        assert!((on / off - 1.25 / 1.1).abs() < 0.03, "measured {:.3}, true {:.3}", on / off, 1.25 / 1.1);
        assert!(g.ran[0] > 4 * g.ran[1], "{:?}", g.ran);
        // On wall time which arm ran while eight slots generated decides the rates: the last windows read the arms
        // 7% apart where they are 13.6% (before the first choice was re-checked at once, the gate kept drafting off
        // in most windows here, on 72 against 58 tok/s).
        let w = serve_occupancy(Clock::Wall, occupancy, 4000);
        let [on, off] = w.rates().map(Option::unwrap);
        assert!((on / off - 1.25 / 1.1).abs() > 0.05, "measured {:.3}, true {:.3}", on / off, 1.25 / 1.1);
        // A step of as many slots as no plain step measured yet is no arm's, but measures one when it is plain (the
        // off arm measured in the second window, not taken as one).
        let cfg = GateConfig { window: 1, min_steps: 1, min_drafted: 0, clock: Some(Clock::PlainSteps), off_one: false, ..GateConfig::default() };
        let mut g = Gate::new(cfg);
        g.call(0, true);
        g.step(2, 0, true, false, None);
        g.call(10_000_000, true);
        assert_eq!((g.ran, g.pauses), ([0, 0], 0), "a step neither measured nor priced is cut, and is no pause");
        // Priced at 20 ms, it took 10: one token in half a plain step of two slots, per slot.
        g.step(2, 0, false, false, Some(20_000_000.0));
        g.call(20_000_000, true);
        assert_eq!(g.ran, [1, 0]);
        assert!((g.rates()[0].unwrap() - 1.0).abs() < 1e-9, "{:?}", g.rates());
        // Measured since: 10 ms.
        g.step(2, 0, true, false, None);
        g.call(30_000_000, true);
        assert!((g.rates()[1].unwrap() - 0.5).abs() < 1e-9, "one token in a plain step of two slots: {:?}", g.rates());
        // Three slots never plain: priced at 30 ms, which plain steps measured to take half of their price.
        g.step(3, 0, true, false, Some(30_000_000.0));
        g.call(45_000_000, true);
        let (_, arm, rate) = g.last_window().unwrap();
        assert!(arm == Arm::On && (rate - 1.0 / 3.0).abs() < 1e-9, "15 ms of three slots' 15 ms plain step: {rate}");
    }

    #[test]
    fn a_request_begun_late_in_its_step_is_cut_out_with_the_next_step() {
        // Two slots, plain steps of 10 ms. Every fifth step a request begins: its first call comes before the older
        // slot's in the next server iteration, carrying the decode and the prompt, and the step's first call follows
        // 5 µs later. The decode's time and every token it produced leave the window, on either clock.
        for clock in [Clock::PlainSteps, Clock::Wall] {
            let mut g = Gate::new(GateConfig { window: 8, min_steps: 1, min_drafted: 0, clock: Some(clock), ..GateConfig::default() });
            let (ms, mut now) = (1_000_000, 0);
            for k in 0..400 {
                g.step(2, 0, false, false, None);
                now += 10 * ms;
                if k % 5 == 4 {
                    g.away();
                    g.call(now, false);
                    now += 5_000;
                }
                g.call(now, true);
                now += 5_000;
                g.call(now, false);
            }
            let want = match clock {
                Clock::PlainSteps => 1.0,
                Clock::Wall => 2.0 / 0.01001,
            };
            let rates: Vec<f64> = g.rates().into_iter().flatten().collect();
            assert!(rates.len() == 2 && rates.iter().all(|r| (r / want - 1.0).abs() < 0.01), "{clock:?}: {rates:?}, want {want:.1}");
            assert!(g.pauses >= 79, "{}", g.pauses);
        }
    }

    #[test]
    fn tokens_kept_after_a_switch_count_for_the_window_that_drafted_them() {
        // 4 slots; drafting keeps 0.3 tokens a slot a step at 1.2x the step time: 8% faster. Windows that ended inside
        // a step (10 calls here) counted some slots' kept tokens for the arm that had not drafted them and timed 2 or
        // 3 decodes a window: the arms read 1.61x apart.
        let g = serve_steps(4, 0.3, 12_000_000, 10_000_000, 3000);
        let [on, off] = g.rates().map(Option::unwrap);
        assert!((on / off - 1.3 / 1.2).abs() < 0.03, "measured {:.3}, true {:.3}", on / off, 1.3 / 1.2);
        assert!(g.ran[0] > 4 * g.ran[1], "{:?}", g.ran);
        // One slot: a window's last draft is verified before the next window's first call, as before.
        let g = serve_steps(1, 0.3, 12_000_000, 10_000_000, 3000);
        assert!(g.ran[0] > 4 * g.ran[1], "{:?}", g.ran);
    }

    #[test]
    fn drafting_that_pays_runs_most_windows() {
        // Drafting: 2.5 tokens a step at 1.5× the step time: 1.67× faster.
        let g = simulate(|_| 2.5, 15_000_000, 10_000_000, 200);
        assert!(g.ran[0] > 180 && g.ran[1] >= 3, "{:?}", g.ran);
    }

    #[test]
    fn drafting_that_loses_is_switched_off() {
        // Drafting: 1.3 tokens a step at 1.5× the step time: 0.87× — off, re-measured now and then.
        let g = simulate(|_| 1.3, 15_000_000, 10_000_000, 200);
        assert!(g.ran[1] > 180 && g.ran[0] >= 3, "{:?}", g.ran);
    }

    #[test]
    fn a_steady_choice_is_checked_ever_more_rarely() {
        let g = simulate(|_| 1.3, 15_000_000, 10_000_000, 400);
        assert_eq!(g.explore_every(), 30, "confirmed again and again: the longest interval a 15% gap makes cheap");
        // 4 + 8 + 16 + 30 + 30 … windows between checks: far fewer than one in four.
        assert!(g.ran[0] <= 20, "{:?}", g.ran);
    }

    #[test]
    fn a_change_of_workload_is_found_and_checks_become_frequent_again() {
        // Drafting loses for 200 windows, then pays (the traffic changed): the gate turns drafting on within
        // about one long interval, and the overturned choice resets the interval.
        let g = simulate(|w| if w < 200 { 1.3 } else { 2.5 }, 15_000_000, 10_000_000, 300);
        assert!(g.ran[0] > 50, "{:?}", g.ran);
        let [on, off] = g.rates();
        assert!(on.unwrap() > off.unwrap(), "{:?}", g.rates());
    }

    #[test]
    fn one_unlucky_first_window_does_not_keep_drafting_off() {
        // Drafting pays (1.2×) except in the very first window, which found nothing to draft (0.67×). Blended
        // in at the running weight, the re-measurements would need four checks, 60 windows apart, to undo it.
        let g = simulate(|w| if w == 0 { 1.0 } else { 1.8 }, 15_000_000, 10_000_000, 100);
        assert!(g.ran[0] > 80, "on from the first re-measurement: {:?}", g.ran);
    }

    #[test]
    fn the_running_arm_is_not_judged_by_its_first_window_after_a_re_measurement() {
        // Drafting pays (2.5 tokens a step at 1.5x the step time: 1.67x) except in the first drafting window after
        // each window of not drafting, which finds nothing to draft (0.67x). Replaced by that one window, drafting's
        // rate fell below not drafting's after every check of the other arm (HumanEval replayed alone: drafting off
        // from the 29th of 48 prompts to the 45th, 1.73x against 1.81x): the running arm is blended in instead.
        let cfg = GateConfig { window: 10, min_steps: 1, explore_every: 4, explore_max: 32, short_window: 3, ..wall() };
        let mut g = Gate::new(cfg);
        let (mut now, mut carry) = (0u64, 0.0f64);
        for _ in 0..2000 {
            let drafting = g.arm() == Arm::On;
            let unlucky = drafting && g.last_window().is_some_and(|(_, arm, _)| arm == Arm::Off);
            now += if drafting { 15_000_000 } else { 10_000_000 };
            g.call(now, true);
            if drafting {
                g.drafted(4);
                carry += if unlucky { 0.0 } else { 1.5 };
                let whole = carry.floor();
                carry -= whole;
                g.accepted(whole as usize);
            }
        }
        assert!(g.ran[0] > 8 * g.ran[1], "{:?}", g.ran);
    }

    #[test]
    fn a_first_choice_made_on_the_controls_priors_is_rechecked_at_once() {
        // A short run of the default schedule (290 steps in windows of 10, as the demo's 18 requests alone). The first
        // drafting window drafts before the control learned what is kept: 1.2 tokens a step at 1.5x the step time
        // (0.8x); every later one 2 tokens (1.33x). Drafting runs 26 windows of 28; re-checked only after
        // `explore_every` windows, it ran 19 and waited eight for its second measurement.
        let mut g = Gate::new(GateConfig { window: 10, min_steps: 1, ..wall() });
        let (mut now, mut carry, mut second) = (0u64, 0.0f64, None);
        for step in 0..290 {
            g.call(now, true);
            if second.is_none() && g.ran == [1, 1] && g.arm() == Arm::On {
                second = Some(step);
            }
            let on = g.arm() == Arm::On;
            now += if on { 15_000_000 } else { 10_000_000 };
            if on {
                g.drafted(4);
                carry += if step < 10 { 0.2 } else { 1.0 };
                let kept = carry.floor();
                carry -= kept;
                g.accepted(kept as usize);
            }
        }
        assert_eq!(second, Some(20), "drafting is measured again right after the first window of not drafting");
        assert!(g.ran[0] >= 25, "{:?}", g.ran);
    }

    #[test]
    fn a_first_choice_for_drafting_is_not_rechecked_early() {
        // Drafting pays from its first window (2 tokens a step at 1.5x the step time): after one window of not
        // drafting, drafting runs until not drafting is due again, `explore_every` (8) windows after the choice.
        // Served on Qwen2.5-Coder-1.5B's JSON alone, a re-check at once cost a second window of not drafting at 1.4x
        // apart.
        let mut g = Gate::new(GateConfig { window: 10, min_steps: 1, ..wall() });
        let mut now = 0u64;
        let mut arms = Vec::new();
        for _ in 0..120 {
            g.call(now, true);
            if let Some((n, arm, _)) = g.last_window().filter(|w| w.0 as usize > arms.len()) {
                arms.push(arm);
                assert_eq!(n as usize, arms.len());
            }
            let on = g.arm() == Arm::On;
            now += if on { 15_000_000 } else { 10_000_000 };
            if on {
                g.drafted(4);
                g.accepted(1);
            }
        }
        assert_eq!(arms[..10], [Arm::On, Arm::Off, Arm::On, Arm::On, Arm::On, Arm::On, Arm::On, Arm::On, Arm::On, Arm::Off], "{arms:?}");
    }

    #[test]
    fn a_tie_goes_to_not_drafting_and_is_rechecked_every_other_window() {
        // 1.5 tokens a step at 1.5× the step time: the same rate either way, so checking costs nothing.
        let g = simulate(|_| 1.5, 15_000_000, 10_000_000, 100);
        assert_eq!(g.explore_every(), 1);
        assert!(g.ran[1] >= g.ran[0] && g.ran[0] >= 45, "{:?}", g.ran);
    }

    /// One slot alone for `steps` steps on plain steps (priced at 60 ms by the β model): a plain step takes 60 ms,
    /// every other one `jitter_ns` more, a drafting one `on_ns` and keeps `kept(step)` tokens. Returns the gate and
    /// the arm of every step.
    fn serve_alone(off_one: bool, on_ns: u64, kept: impl Fn(usize) -> usize, jitter_ns: u64, steps: usize) -> (Gate, Vec<Arm>) {
        let mut g = Gate::new(GateConfig { off_one, ..GateConfig::default() });
        let (mut now, mut drafted, mut arms) = (0u64, false, Vec::new());
        for step in 0..steps {
            g.step(1, 0, drafted, false, Some(60e6));
            g.call(now, true);
            drafted = g.arm() == Arm::On;
            arms.push(g.arm());
            if drafted {
                g.drafted(4);
                g.accepted(kept(step));
            }
            now += if drafted { on_ns } else { 60_000_000 + jitter_ns * (step as u64 % 2) };
        }
        (g, arms)
    }

    #[test]
    fn on_plain_steps_not_drafting_is_taken_as_one_until_rechecked() {
        // A request's last hundred steps alone, drafting 1.33x as fast (7 tokens in 5 steps of 63 ms against 5 in 60):
        // taken as one, not drafting is not measured in them; measured, it takes the second window.
        let on = |arms: &[Arm]| arms.iter().filter(|&&a| a == Arm::On).count();
        let (g, arms) = serve_alone(true, 63_000_000, |s| usize::from(s % 5 < 2), 0, 100);
        assert_eq!((on(&arms), g.ran), (100, [2, 0]), "drafting throughout");
        assert_eq!(g.rates()[1], Some(1.0));
        let (g, arms) = serve_alone(false, 63_000_000, |s| usize::from(s % 5 < 2), 0, 100);
        assert_eq!((on(&arms), g.ran), (52, [1, 1]), "the second window measures not drafting");
        // Drafting that loses (70 ms for nothing kept): the first choice against it is re-checked at once, as after a
        // window of not drafting, then not drafting runs and its first measured window replaces the one taken.
        let (g, arms) = serve_alone(true, 70_000_000, |_| 0, 0, 400);
        assert_eq!(&arms[..96], &[Arm::On; 96][..]);
        assert!(on(&arms) < 150 && g.ran[1] >= 4 && g.arm() == Arm::Off, "{:?}", g.ran);
        let first_off = (97..400)
            .map(|steps| serve_alone(true, 70_000_000, |_| 0, 4_000_000, steps).0)
            .find(|g| g.ran[1] == 1)
            .unwrap();
        let (_, arm, read) = first_off.last_window().unwrap();
        // Plain steps of 60 and 64 ms read a little off 1 on their moving mean: what the window read is the arm's rate.
        assert!(arm == Arm::Off && read != 1.0 && first_off.rates()[1] == Some(read), "{read} {:?}", first_off.rates());
    }

    /// One slot alone through `requests` answers of 256 tokens from a prompt of 50, a plain step taking 9.6 ms plus
    /// 12.5 µs a cell of context (SmolLM2-135M as served), a drafting one 10% more for nothing kept. Returns what every
    /// window of not drafting read.
    fn off_windows_through_answers(by_context: bool, requests: usize) -> Vec<f64> {
        let mut g = Gate::new(GateConfig { by_context, ..GateConfig::default() });
        let (mut now, mut drafted, mut reads, mut windows) = (0u64, false, Vec::new(), 0);
        for _ in 0..requests {
            now += 150_000_000;
            g.away();
            for t in 0..256usize {
                let ctx = 50 + t;
                g.step(1, ctx, drafted, false, Some(10e6));
                g.call(now, true);
                if let Some((n, arm, read)) = g.last_window().filter(|w| w.0 > windows) {
                    windows = n;
                    if arm == Arm::Off {
                        reads.push(read);
                    }
                }
                drafted = g.arm() == Arm::On;
                if drafted {
                    g.drafted(4);
                }
                let plain = 9.6e6 + 12.5e3 * ctx as f64;
                now += (if drafted { 1.1 * plain } else { plain }) as u64;
            }
        }
        reads
    }

    #[test]
    fn not_drafting_reads_one_where_requests_begin_when_steps_are_priced_at_their_context() {
        // Priced at the mean of recent plain steps, a window in which a request began read its first steps at the
        // last answer's end: up to 30% cheap, and the window well above one.
        let mean = off_windows_through_answers(false, 12);
        let high = mean.iter().cloned().fold(0.0, f64::max);
        assert!(mean.len() >= 20 && high > 1.03, "{} windows, highest {high}", mean.len());
        let priced = off_windows_through_answers(true, 12);
        assert!(priced.len() >= 20, "{}", priced.len());
        // The slope is learned in the first answers; from then on every window of not drafting reads one.
        let late = &priced[priced.len() / 2..];
        assert!(late.iter().all(|r| (r - 1.0).abs() < 0.01), "{late:?}");
    }

    #[test]
    fn a_first_drafting_window_rechecked_at_once_is_replaced_not_blended() {
        // The first drafting window keeps nothing (0.857 of not drafting), the next keeps a token every other step
        // (1.29x). Blended in, the re-check read 0.99 and drafting went off for two windows; replaced, it stays on.
        let (g, arms) = serve_alone(true, 70_000_000, |s| if s < 49 { 0 } else { s % 2 }, 0, 200);
        assert!(arms[96..192].iter().all(|&a| a == Arm::On), "{:?}", g.ran);
        assert!(g.rates()[0].unwrap() > 1.2, "{:?}", g.rates());
    }

    #[test]
    fn a_first_window_with_nothing_to_draft_does_not_keep_drafting_off() {
        // A short run (9 windows, as six requests of 96 tokens served at -np 1). The first drafting window found
        // nothing to draft and tied with not drafting (`on_tokens` is indexed by calls / 10, and a window's last
        // call is the next index's first); from the second drafting window on drafting makes 2.5 tokens a step at
        // the same step time. The tie is re-checked at once: drafting runs 7 of the 9 windows (waiting the 4
        // windows of a fresh choice, as before session 19: 5).
        let (g, _) = run(|w| if w <= 1 { 1.0 } else { 2.5 }, 10_000_000, 10_000_000, 9);
        assert!(g.ran[0] >= 7, "{:?}", g.ran);
    }

    #[test]
    fn arms_a_few_percent_apart_are_rechecked_as_often_as_is_cheap() {
        // Drafting that drafts nothing and costs 2.2% (a step of 10.22 ms against 10): re-measuring it for one window
        // in 5 costs 0.44% of the rate.
        let g = simulate(|_| 1.0, 10_220_000, 10_000_000, 200);
        assert_eq!(g.explore_every(), 4, "a 2.2% gap: one window in 5");
    }

    #[test]
    fn a_drafting_window_that_drafted_nothing_stays_open() {
        // The arm drafts nothing for 10 calls: the window runs on; 8 tokens drafted close it at the next step.
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, ..wall() });
        let ms = 1_000_000;
        for t in 0..10 {
            g.call(t * 10 * ms, true);
        }
        assert_eq!((g.ran, g.arm()), ([0, 0], Arm::On));
        g.drafted(8);
        g.call(100 * ms, true);
        assert_eq!((g.ran, g.arm()), ([1, 0], Arm::Off), "measured, the other arm is measured next");
        // Off windows close at their length; a drafting window that never drafts closes at four lengths.
        for t in 11..15 {
            g.call(t * 10 * ms, true);
        }
        assert_eq!(g.ran, [1, 1]);
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, ..wall() });
        for t in 0..=16 {
            g.call(t * 10 * ms, true);
        }
        assert_eq!(g.ran, [1, 0]);
    }

    #[test]
    fn a_pause_is_cut_out_of_its_window() {
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, min_drafted: 0, ..wall() });
        for t in [0, 10, 20] {
            g.call(t * 1_000_000, true);
        }
        g.call(2_000_000_000, true);
        assert_eq!((g.pauses, g.ran), (1, [0, 0]));
        for t in [2_010, 2_020] {
            g.call(t * 1_000_000, true);
        }
        assert_eq!(g.ran, [1, 0], "the calls before the pause count with those after it");
        let on = g.rates()[0].unwrap();
        assert!((on - 100.0).abs() < 1e-6, "4 tokens in 40 ms of calls, the 1.98 s pause left out: {on}");
        assert_eq!(g.arm(), Arm::Off, "the unmeasured arm is measured next");
    }

    #[test]
    fn a_step_in_which_a_request_ended_is_cut_out_of_its_window() {
        // Three slots, a step every 10 ms; slot 2's request ends, and the step without it takes 60 ms (the server
        // answers it and takes up the next request): that step leaves the window with its calls.
        let mut g = Gate::new(GateConfig { window: 8, min_steps: 1, min_drafted: 0, ..wall() });
        let ms = 1_000_000;
        for (t, new_step) in [(0, true), (0, false), (0, false), (10, true), (10, false), (10, false)] {
            g.step(3, 0, false, false, None);
            g.call(t * ms, new_step);
        }
        // The first call of the step without slot 2, then the step's end 60 ms later.
        g.step(3, 0, false, false, None);
        g.call(20 * ms, true);
        g.call(20 * ms, false);
        g.step(2, 0, false, true, None);
        g.call(80 * ms, true);
        g.call(80 * ms, false);
        assert_eq!((g.pauses, g.ran), (1, [0, 0]), "the 60 ms step is cut");
        g.step(2, 0, false, false, None);
        g.call(90 * ms, true);
        assert_eq!(g.ran, [1, 0]);
        let on = g.rates()[0].unwrap();
        assert!((on - 8.0 / 0.03).abs() < 1e-6, "8 tokens in 30 ms of steps, the request's end left out: {on}");
    }

    #[test]
    fn a_step_that_decoded_a_prompt_is_cut_out_of_its_window() {
        // Two slots, a step every 10 ms, but the step after a prompt took 300 ms (not a pause): it and the
        // calls in it leave the window, kept drafts included.
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, min_drafted: 0, ..wall() });
        let ms = 1_000_000;
        for (t, new_step) in [(0, true), (0, false), (10, true), (10, false)] {
            g.call(t * ms, new_step);
        }
        g.accepted(5);
        g.away();
        g.call(310 * ms, true);
        g.call(310 * ms, false);
        assert_eq!((g.pauses, g.ran), (1, [0, 0]));
        g.call(320 * ms, true);
        assert_eq!(g.ran, [1, 0]);
        let on = g.rates()[0].unwrap();
        assert!((on - 200.0).abs() < 1e-6, "4 tokens in 20 ms of steps, the prompt's step left out: {on}");
    }

    #[test]
    fn a_step_that_verified_sure_drafts_only_is_cut_out_of_its_window() {
        // One slot, a step every 10 ms, but the step verifying a sure copy took 50 ms and kept 15 tokens: it is
        // no arm's, so the window's rate is the other steps'.
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, min_drafted: 0, ..wall() });
        let ms = 1_000_000;
        for t in [0, 10, 20] {
            g.call(t * ms, true);
        }
        g.sure();
        g.accepted(15);
        g.call(70 * ms, true);
        assert_eq!((g.sure_steps, g.pauses, g.ran), (1, 0, [0, 0]));
        g.call(80 * ms, true);
        g.call(90 * ms, true);
        assert_eq!(g.ran, [1, 0]);
        let on = g.rates()[0].unwrap();
        assert!((on - 100.0).abs() < 1e-6, "4 tokens in 40 ms of steps, the sure step left out: {on}");
        // Only the next step is cut, not a later call of the step that drafted.
        let mut g = Gate::new(GateConfig { window: 4, min_steps: 1, min_drafted: 0, ..wall() });
        g.call(0, true);
        g.sure();
        g.call(0, false);
        assert_eq!(g.sure_steps, 0);
        g.call(10 * ms, true);
        assert_eq!(g.sure_steps, 1);
    }

    #[test]
    fn a_prompt_decoded_during_a_pause_cuts_that_step_alone() {
        let mut g = Gate::new(GateConfig { window: 2, min_steps: 1, min_drafted: 0, ..wall() });
        let ms = 1_000_000;
        g.call(0, true);
        g.away();
        g.call(1_000 * ms, true);
        assert_eq!(g.pauses, 1);
        g.call(1_010 * ms, true);
        g.call(1_020 * ms, true);
        assert_eq!((g.pauses, g.ran), (1, [1, 0]), "the two steps after the pause both count");
    }

    #[test]
    fn arms_far_apart_are_rechecked_in_short_windows() {
        // Drafting: 5 tokens a step at 1.1× the step time (verification nearly free): 4.5× faster. Every
        // measurement of the off arm, the first included, takes a short window.
        let (g, calls) = run(|_| 5.0, 11_000_000, 10_000_000, 200);
        assert!(g.ran[1] >= 3, "{:?}", g.ran);
        assert!((3 * g.ran[1]..3 * g.ran[1] + 3).contains(&calls[1]), "off windows of 3 calls: {calls:?} {:?}", g.ran);
    }

    #[test]
    fn with_several_slots_a_short_window_is_counted_in_steps() {
        // The same drafting with 4 slots: 3 steps are 12 calls, and a whole window of 10 calls ends where a step
        // begins, at 12 as well.
        let (g, calls) = run_slots(4, |_| 5.0, 11_000_000, 10_000_000, 200);
        assert!(g.ran[1] >= 3, "{:?}", g.ran);
        assert!((12 * g.ran[1]..12 * g.ran[1] + 12).contains(&calls[1]), "off windows of 3 steps: {calls:?} {:?}", g.ran);
    }

    #[test]
    fn arms_close_together_are_rechecked_in_whole_windows() {
        // Drafting: 1.3 tokens a step at 1.5× the step time: 0.87×, within `far` of not drafting.
        let (g, calls) = run(|_| 1.3, 15_000_000, 10_000_000, 200);
        assert!(g.ran[0] >= 3, "{:?}", g.ran);
        assert!((10 * g.ran[0]..10 * g.ran[0] + 10).contains(&calls[0]), "on windows of 10 calls: {calls:?} {:?}", g.ran);
    }
}
