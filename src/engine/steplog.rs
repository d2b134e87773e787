//! A line per server step (`steplog=PATH`): its wall time, the time spent in the drafter's calls, the
//! prompts begun in it and the tokens each slot verified. What the control prices a step at comes from calls
//! timed alone; this is what the steps cost in place, beside the other slots' prompts and the server's own work.

use std::fs::File;
use std::io::{LineWriter, Write};
use std::path::{Path, PathBuf};

use crate::draft::decision::{Decision, Ended};
use crate::draft::gate::Arm;

/// Tab-separated: microseconds from the step's first `propose` to the next step's, what the drafter's β model
/// priced the step at before it learned from it (`-`: no price yet), in its `propose` calls, from its first
/// `propose` to its first `accept` (`-`: none), the requests begun in it, and per slot the tokens it verified
/// (comma-separated, 0: not in the step), the gate's arm in the step (`-`: no gate), with the rate of the
/// window that closed at the step's end, `on=1.234` (how the gate decided, window by window), and per slot what
/// the control did with its chain ([`Decision`]'s `found:drafted:kept:why:p0:judged`; `-`: not in the step),
/// so that a round whose drafting stops shows whether chains stopped being found or were declined, and by which
/// rule. A request begun in a step proposes first in the next server iteration; its calls before an older slot's
/// count in the step it began in.
pub const HEADER: &str = "wall_us\tpriced_us\tdraft_us\tto_accept_us\tbegun\tslots\tgate\tdrafts";

/// The gate as a step sees it: the arm now, and the last full window ([`crate::draft::gate::Gate::last_window`]).
pub type GateMark = Option<(Arm, Option<(u64, Arm, f64)>)>;

pub struct StepLog {
    path: PathBuf,
    /// Written a line at a time: read while the server runs, and whole when its process ends without dropping
    /// the engine (vLLM's workers).
    out: Option<LineWriter<File>>,
    /// The open step: its first `propose` (ns), the time in its calls (ns), its first `accept` (ns).
    start: Option<u64>,
    drafted: u64,
    accepted: Option<u64>,
    begun: u32,
    /// The open step's arm, and the count of windows already written.
    arm: Option<Arm>,
    windows: u64,
}

impl StepLog {
    pub fn create(path: &Path) -> std::io::Result<StepLog> {
        let mut out = LineWriter::new(File::create(path)?);
        writeln!(out, "{HEADER}")?;
        Ok(StepLog { path: path.to_path_buf(), out: Some(out), start: None, drafted: 0, accepted: None, begun: 0, arm: None, windows: 0 })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A request began (its prompt was evaluated in the open step).
    pub fn begin(&mut self) {
        self.begun += 1;
    }

    /// A `propose` ran from `start` to `end` ns; when it was the first of a step, `ended` is the step before, which
    /// is written out. `gate` is the gate after the call.
    pub fn proposed(&mut self, start: u64, end: u64, ended: Option<Ended<'_>>, gate: GateMark) {
        if let (Some(Ended { tokens: slots, price, decisions }), Some(s0)) = (ended, self.start) {
            let price = price.map_or("-".into(), |p| format!("{:.0}", p / 1000.0));
            let drafts: Vec<String> = slots
                .iter()
                .enumerate()
                .map(|(j, &t)| decisions.get(j).filter(|_| t > 0).map_or("-".into(), Decision::to_string))
                .collect();
            let to_accept = self.accepted.map_or("-".into(), |a| (a.saturating_sub(s0) / 1000).to_string());
            let slots: Vec<String> = slots.iter().map(usize::to_string).collect();
            let mut arm = self.arm.map_or("-".to_string(), |a| name(a).to_string());
            // The window that closed at this call ended with the step being written.
            if let Some((n, a, rate)) = gate.and_then(|g| g.1).filter(|w| w.0 > self.windows) {
                self.windows = n;
                arm += &format!(" {}={rate:.3}", name(a));
            }
            let line = format!(
                "{}\t{price}\t{}\t{to_accept}\t{}\t{}\t{arm}\t{}",
                start.saturating_sub(s0) / 1000,
                self.drafted / 1000,
                self.begun,
                slots.join(","),
                drafts.join(",")
            );
            self.write(&line);
            (self.start, self.drafted, self.accepted, self.begun) = (None, 0, None, 0);
        }
        if self.start.is_none() {
            self.start = Some(start);
            self.arm = gate.map(|g| g.0);
        }
        self.drafted += end.saturating_sub(start);
    }

    /// An `accept` at `now` ns.
    pub fn accepted(&mut self, now: u64) {
        if self.start.is_some() {
            self.accepted.get_or_insert(now);
        }
    }

    /// Writes a line; a failed write stops the log (once, said on stderr) and never fails the server.
    fn write(&mut self, line: &str) {
        if let Some(out) = &mut self.out {
            if let Err(e) = writeln!(out, "{line}") {
                eprintln!("kolm-rsd: step log {}: {e}; no more steps are logged", self.path.display());
                self.out = None;
            }
        }
    }
}

fn name(a: Arm) -> &'static str {
    match a {
        Arm::On => "on",
        Arm::Off => "off",
    }
}

impl Drop for StepLog {
    fn drop(&mut self) {
        if let Some(mut out) = self.out.take() {
            if let Err(e) = out.flush() {
                eprintln!("kolm-rsd: step log {}: {e}", self.path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::decision::Why;

    #[test]
    fn a_line_per_ended_step_with_its_phases() {
        let dir = std::env::temp_dir().join(format!("kolm-steplog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("steps.tsv");
        let drafted = Decision { found: 5, drafted: 3, kept: 3, why: Why::Drafted, p0: 0.97, judged: None };
        let declined = Decision { found: 2, why: Why::Unsure, p0: 0.6, judged: Some(false), ..Decision::default() };
        let (two, none) = ([drafted, declined, Decision::default()], [Decision::default(); 3]);
        let ended = |tokens, price, decisions| Some(Ended { tokens, price, decisions });
        {
            let mut log = StepLog::create(&path).unwrap();
            // Step 1: two slots propose (1..3 µs and 4..6 µs), one request begins, slot 0 accepts at 40 µs.
            log.proposed(1_000, 3_000, None, Some((Arm::On, None)));
            log.proposed(4_000, 6_000, None, Some((Arm::On, None)));
            log.begin();
            log.accepted(40_000);
            log.accepted(41_000);
            // Step 2 starts at 101 µs; in step 1 slot 0 drafted 3 of a chain of 5 and verified 4 tokens, and slot 1
            // declined its chain and verified one; the gate's first window closed with it (1.25 tokens a slot per
            // plain step) and step 2 does not draft.
            log.proposed(101_000, 102_000, ended(&[4, 1, 0], Some(90_400.0), &two), Some((Arm::Off, Some((1, Arm::On, 1.25)))));
            // Step 3 starts at 301 µs: nothing accepted, nothing begun in step 2, no window closed.
            log.proposed(301_000, 302_000, ended(&[1, 1, 0], None, &none), Some((Arm::Off, Some((1, Arm::On, 1.25)))));
            // Step 4 (begun under the gate's off arm), and step 5 without a gate nor decisions.
            log.proposed(401_000, 401_500, ended(&[1, 1, 1], None, &none), None);
            log.proposed(501_000, 501_500, ended(&[1, 1, 1], None, &[]), None);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let want = "100\t90\t4\t39\t1\t4,1,0\ton on=1.250\t5:3:3:d:0.97:-,2:0:0:s:0.60:x,-\n\
                    200\t-\t1\t-\t0\t1,1,0\toff\t0:0:0:-:0.00:-,0:0:0:-:0.00:-,-\n\
                    100\t-\t1\t-\t0\t1,1,1\toff\t0:0:0:-:0.00:-,0:0:0:-:0.00:-,0:0:0:-:0.00:-\n\
                    100\t-\t0\t-\t0\t1,1,1\t-\t-,-,-\n";
        assert_eq!(text, format!("{HEADER}\n{want}"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
