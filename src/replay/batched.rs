//! Replay at several clients: recordings served as concurrent requests, each step one forward pass of every
//! request's tokens, as vLLM runs it. One client at a time says nothing of what the drafter decides beside
//! others (the step's price, the shared rates, the gate); served at eight clients a run costs a quarter of an
//! hour and reads through ±7% noise, so this is where a change of the step control is A/B-tested first.

use super::{right_run, verify, Recorded, Replayed, Step};
use crate::draft::{Drafter, Proposed};

/// What drafts in a batched replay: the plugin's [`Drafter`], one sequence per client, or [`Oracle`].
pub trait Batched {
    /// Recording `run` starts on sequence `seq`.
    fn begin(&mut self, seq: usize, run: usize, r: &Recorded);
    /// Drafts at most `n_max` tokens after `hist` + `last` on `seq` into `out`, at `now_ns` on the clock.
    fn propose(&mut self, seq: usize, hist: &[i32], last: i32, n_max: usize, now_ns: u64, out: &mut Vec<i32>) -> usize;
    /// The target kept the first `n` tokens drafted on `seq`.
    fn accept(&mut self, seq: usize, n: usize);
    /// The tokens the last `propose` on `seq` looked at, drafted or not, with their evidence (none for the oracle).
    fn last_chain(&self, _seq: usize) -> Vec<Proposed> {
        Vec::new()
    }
}

impl Batched for Drafter {
    fn begin(&mut self, seq: usize, _run: usize, r: &Recorded) {
        Drafter::begin(self, seq, &r.prompt);
        if !r.prediction.is_empty() {
            Drafter::predict(self, seq, &r.prediction);
        }
    }
    fn propose(&mut self, seq: usize, hist: &[i32], last: i32, n_max: usize, now_ns: u64, out: &mut Vec<i32>) -> usize {
        Drafter::propose(self, seq, hist, last, n_max, now_ns, out)
    }
    fn accept(&mut self, seq: usize, n: usize) {
        Drafter::accept(self, seq, n);
    }
    fn last_chain(&self, seq: usize) -> Vec<Proposed> {
        Drafter::last_chain(self, seq)
    }
}

/// Drafts exactly the runs of right proposals ([`super::right_proposals`]) and nothing else, whatever a step
/// costs: the ceiling of the drafter's evidence beside others, as [`super::oracle`] is alone.
pub struct Oracle<'r> {
    runs: &'r [Recorded],
    right: Vec<Vec<bool>>,
    /// Per sequence, the recording it serves.
    at: Vec<usize>,
}

impl<'r> Oracle<'r> {
    /// `right`: [`super::right_proposals`] of `runs`.
    pub fn new(runs: &'r [Recorded], right: Vec<Vec<bool>>) -> Oracle<'r> {
        Oracle { runs, right, at: Vec::new() }
    }
}

impl Batched for Oracle<'_> {
    fn begin(&mut self, seq: usize, run: usize, _r: &Recorded) {
        if self.at.len() <= seq {
            self.at.resize(seq + 1, 0);
        }
        self.at[seq] = run;
    }
    fn propose(&mut self, seq: usize, hist: &[i32], _last: i32, n_max: usize, _now_ns: u64, out: &mut Vec<i32>) -> usize {
        out.clear();
        let run = self.at[seq];
        let (r, right) = (&self.runs[run], &self.right[run]);
        // The history is the prompt and the output up to the token just sampled, which is not in it.
        let done = hist.len() - r.prompt.len();
        let n = right_run(right, done, n_max);
        out.extend_from_slice(&r.output[1 + done..1 + done + n]);
        n
    }
    fn accept(&mut self, _seq: usize, _n: usize) {}
}

/// Serves `runs` to `d` (None: plain decoding; a drafter must have `clients` sequences) as `clients` requests at
/// once, in recording order: a request that ends makes room for the next at the following step. A step of `rows` requests verifying `drafted`
/// drafted tokens among them costs `step(rows, drafted)` plain one-request steps of `unit_ns` each on the
/// drafter's clock. Returns the sum over all requests (`passes`: steps; `cost`: the clock in plain one-request
/// steps); its speed against plain decoding is the ratio of the two runs' costs.
pub fn replay_batched(
    d: Option<&mut dyn Batched>,
    runs: &[Recorded],
    clients: usize,
    n_max: usize,
    step: impl Fn(usize, usize) -> f64,
    unit_ns: f64,
) -> Replayed {
    replay_batched_with(d, runs, clients, n_max, step, unit_ns, None)
}

/// [`replay_batched`], showing `trace` every request's part of every step.
pub fn replay_batched_traced(
    d: &mut dyn Batched,
    runs: &[Recorded],
    clients: usize,
    n_max: usize,
    step: impl Fn(usize, usize) -> f64,
    unit_ns: f64,
    mut trace: impl FnMut(Step),
) -> Replayed {
    replay_batched_with(Some(d), runs, clients, n_max, step, unit_ns, Some(&mut trace))
}

/// The batched replay loop; the chain behind each draft is read only when traced.
fn replay_batched_with(
    mut d: Option<&mut dyn Batched>,
    runs: &[Recorded],
    clients: usize,
    n_max: usize,
    step: impl Fn(usize, usize) -> f64,
    unit_ns: f64,
    mut trace: Option<&mut dyn FnMut(Step)>,
) -> Replayed {
    /// A request in flight: its recording, the history the drafter sees, the token just sampled, and how many
    /// of the recording's later tokens are decoded.
    struct InFlight {
        run: usize,
        hist: Vec<i32>,
        last: i32,
        done: usize,
        draft: Vec<i32>,
    }
    let clients = clients.max(1);
    let mut slots: Vec<Option<InFlight>> = (0..clients).map(|_| None).collect();
    let mut next = 0;
    let mut now = 0u64;
    let mut total = Replayed::default();
    loop {
        // Free slots take the next recordings (one of a single token is answered by its prompt pass alone).
        for (seq, slot) in slots.iter_mut().enumerate() {
            while slot.is_none() && next < runs.len() {
                let r = &runs[next];
                if let [first, _, ..] = r.output[..] {
                    if let Some(d) = d.as_deref_mut() {
                        d.begin(seq, next, r);
                    }
                    *slot = Some(InFlight { run: next, hist: r.prompt.clone(), last: first, done: 0, draft: Vec::new() });
                }
                next += 1;
            }
        }
        let (mut rows, mut drafted) = (0, 0);
        for (seq, slot) in slots.iter_mut().enumerate() {
            let Some(l) = slot else { continue };
            let rest = &runs[l.run].output[1..];
            rows += 1;
            l.draft.clear();
            if let Some(d) = d.as_deref_mut() {
                // vLLM never verifies past the request's remaining tokens.
                drafted += d.propose(seq, &l.hist, l.last, n_max.min(rest.len() - l.done), now, &mut l.draft);
            }
        }
        if rows == 0 {
            return total;
        }
        let cost = step(rows, drafted);
        now += (cost * unit_ns) as u64;
        total.passes += 1;
        total.cost += cost;
        total.drafted += drafted;
        for (seq, slot) in slots.iter_mut().enumerate() {
            let Some(l) = slot else { continue };
            let rest = &runs[l.run].output[1..];
            let position = l.hist.len() + 1;
            let (acc, took) = verify(&l.draft, &rest[l.done..], &mut l.hist, &mut l.last);
            if let Some(d) = d.as_deref_mut() {
                if let Some(trace) = trace.as_mut() {
                    trace(Step::new(l.run, position, l.draft.len(), acc, d.last_chain(seq), &rest[l.done..]));
                }
                d.accept(seq, acc);
            }
            l.done += took;
            total.tokens += took;
            total.accepted += acc;
            if l.done == rest.len() {
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::{step::Layout, DrafterConfig};

    /// A continuation that copies a passage of its prompt, different per request.
    fn copying(k: i32) -> Recorded {
        crate::replay::tests::copying_from(1000 * (k + 1))
    }

    /// vLLM-like: a row adds 3% of a one-row step, a drafted token 6%.
    fn one_pass(rows: usize, drafted: usize) -> f64 {
        1.0 + 0.03 * (rows - 1) as f64 + 0.06 * drafted as f64
    }

    #[test]
    fn plain_decoding_is_one_token_per_request_and_step() {
        let runs: Vec<Recorded> = (0..5).map(copying).collect();
        let plain = replay_batched(None, &runs, 2, 15, one_pass, 1e6);
        assert_eq!(plain.tokens, 5 * 62);
        assert_eq!(plain.drafted, 0);
        // Two at a time: four requests in two pairs of 62 steps, then the fifth alone.
        assert_eq!(plain.passes, 3 * 62);
        assert!((plain.cost - (2.0 * 62.0 * one_pass(2, 0) + 62.0)).abs() < 1e-9, "{plain:?}");
    }

    #[test]
    fn concurrent_copies_are_drafted_and_every_token_is_the_recording_s() {
        let runs: Vec<Recorded> = (0..12).map(copying).collect();
        let cfg = DrafterConfig { n_seq: 4, layout: Some(Layout::OnePass), ..DrafterConfig::default() };
        let mut d = Drafter::new(None, cfg);
        let spec = replay_batched(Some(&mut d), &runs, 4, 15, one_pass, 1e6);
        let plain = replay_batched(None, &runs, 4, 15, one_pass, 1e6);
        assert_eq!(spec.tokens, plain.tokens);
        assert!(spec.accepted <= spec.drafted && spec.accepted > 0, "{spec:?}");
        assert!(spec.tokens <= spec.accepted + 4 * spec.passes, "{spec:?}");
        assert!(plain.cost / spec.cost > 1.5, "copies pay beside others: {spec:?} against {plain:?}");
    }

    #[test]
    fn the_oracle_drafts_only_right_runs_and_bounds_the_drafter() {
        let runs: Vec<Recorded> = (0..12).map(copying).collect();
        let cfg = DrafterConfig { n_seq: 4, layout: Some(Layout::OnePass), ..DrafterConfig::default() };
        let right = crate::replay::right_proposals(None, None, &cfg, &runs);
        let mut o = Oracle::new(&runs, right);
        let best = replay_batched(Some(&mut o), &runs, 4, 15, one_pass, 1e6);
        let plain = replay_batched(None, &runs, 4, 15, one_pass, 1e6);
        assert_eq!(best.tokens, plain.tokens);
        assert_eq!(best.drafted, best.accepted, "{best:?}");
        let mut d = Drafter::new(None, cfg);
        let spec = replay_batched(Some(&mut d), &runs, 4, 15, one_pass, 1e6);
        assert!(best.cost <= spec.cost && best.passes <= spec.passes, "oracle {best:?} against the drafter {spec:?}");
        // After the first token the copied passage is right to its end, the tail is not: per request, passes
        // drafting 15, 15, 15, 11, 0 and 0 tokens; three rounds of four requests.
        assert_eq!((best.passes, best.drafted), (3 * 6, 12 * 56), "{best:?}");
    }

    #[test]
    fn a_dear_drafted_token_is_declined_beside_others() {
        // A drafted token costs half a step: no draft pays, and once the control has measured that, the run is
        // within a few percent of plain decoding.
        let runs: Vec<Recorded> = (0..16).map(copying).collect();
        let dear = |rows: usize, drafted: usize| 1.0 + 0.03 * (rows - 1) as f64 + 0.5 * drafted as f64;
        let cfg = DrafterConfig { n_seq: 4, layout: Some(Layout::OnePass), ..DrafterConfig::default() };
        let mut d = Drafter::new(None, cfg);
        let spec = replay_batched(Some(&mut d), &runs, 4, 15, dear, 1e6);
        let plain = replay_batched(None, &runs, 4, 15, dear, 1e6);
        assert!(plain.cost / spec.cost > 0.93, "{spec:?} against {plain:?}");
    }
}
