//! `kolm-rsd bench --pool`: several `bench --load` runs of one stream read as one. On a machine whose speed drifts
//! between minutes, one run's three ABBA pairings are few: session 72 read the same path at `-np 8` at 0.932× in one
//! run and 1.073× in the next, and only the seven pairings of both together gave an interval to quote. Each run's
//! rounds stay paired with that run's plain rounds (and an exact row's with its plain-strict rounds, where the run
//! served them); the pairings of all runs are then read as `bench --load` reads one run's ([`Plain::against`]).

use super::calls;
use super::load::{of_alone, LoadConfig};
use super::paired::{AgainstPlain, Plain, Rounds};
use serde::Deserialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What a row counts, summed over runs as they are.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
pub struct Counts {
    pub sent: usize,
    pub done: usize,
    pub identical: usize,
    pub compared: usize,
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens served, and what the same answers have alone, summed over the runs that report both (reports older
    /// than session 75 have no tokens alone).
    #[serde(default)]
    pub tokens: u64,
    #[serde(default)]
    pub alone_tokens: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.sent += o.sent;
        self.done += o.done;
        self.identical += o.identical;
        self.compared += o.compared;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        if o.alone_tokens > 0 {
            self.tokens += o.tokens;
            self.alone_tokens += o.alone_tokens;
        }
    }
}

/// The part of a `bench --load` row (`load.json`) that pooling reads.
#[derive(Clone, Debug, Deserialize)]
pub struct RunRow {
    pub slots: u32,
    pub config: String,
    #[serde(flatten)]
    pub counts: Counts,
    pub healthy: bool,
    pub round_tok_per_s: Vec<f64>,
    pub round_p99_s: Vec<f64>,
    /// Absent from reports older than the units (session 71): a round then unread at one speed unless its call log
    /// is beside the report.
    #[serde(default)]
    pub round_unit_ms: Vec<Option<f64>>,
}

#[derive(Deserialize)]
struct Report {
    rows: Vec<RunRow>,
}

/// One run: where its report was read from, and its rows.
pub struct Run {
    pub path: PathBuf,
    pub rows: Vec<RunRow>,
}

/// Reads a run's report: `load.json` in a `bench --load` output directory, or the file itself. Each round's unit
/// is read again from its call log beside the report where there is one, so that runs made before a change to
/// the unit's rule ([`calls`]) are read at one speed by the same rule as the others; a round without a log keeps
/// the unit its report holds.
pub fn read(path: &Path) -> Result<Run, String> {
    let file = if path.is_dir() { path.join("load.json") } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut report: Report = serde_json::from_str(&text).map_err(|e| format!("{}: not a `kolm-rsd bench --load` report (load.json): {e}", file.display()))?;
    let dir = file.parent().unwrap_or(Path::new("."));
    for r in &mut report.rows {
        let rounds = r.round_tok_per_s.len();
        if rounds != r.round_p99_s.len() {
            return Err(format!("{}: -np {} {}: {rounds} rounds' rates against {} rounds' p99", file.display(), r.slots, r.config, r.round_p99_s.len()));
        }
        r.round_unit_ms.resize(rounds, None);
        for (round, unit) in r.round_unit_ms.iter_mut().enumerate() {
            let log = dir.join(calls::log_name(r.slots, &r.config, round));
            if log.is_file() {
                *unit = calls::read(&log, r.slots as usize)?.map(|c| c.unit_ms);
            }
        }
    }
    Ok(Run { path: file, rows: report.rows })
}

/// One configuration at one slot count over every run that served it.
#[derive(Clone, Debug)]
pub struct PoolRow {
    pub slots: u32,
    pub config: String,
    pub runs: usize,
    pub counts: Counts,
    pub healthy: bool,
    /// Against plain over the pairings of all runs (None for plain; with fewer than two pairings, `paired` is None).
    pub against: Option<AgainstPlain>,
    /// Against plain-strict over the runs that served it: the same answers, so the same work (None for plain and
    /// plain-strict, and where no run served plain-strict; [`super::load::LoadRow::against_strict`]).
    pub against_strict: Option<AgainstPlain>,
    /// Runs in which it had no plain row at its slot count to be paired with: its counts are in, its rounds are not.
    pub unpaired_runs: usize,
}

/// The rows of the runs pooled by slot count and configuration, in the order they first appear (plain first at a
/// slot count when the runs put it there, as `bench --load` does).
pub fn pool(runs: &[Run]) -> Vec<PoolRow> {
    let mut keys: Vec<(u32, &str)> = Vec::new();
    for r in runs.iter().flat_map(|run| &run.rows) {
        if !keys.contains(&(r.slots, r.config.as_str())) {
            keys.push((r.slots, r.config.as_str()));
        }
    }
    keys.into_iter().map(|(slots, config)| pooled(runs, slots, config)).collect()
}

fn pooled(runs: &[Run], slots: u32, config: &str) -> PoolRow {
    let mut row =
        PoolRow { slots, config: config.to_string(), runs: 0, counts: Counts::default(), healthy: true, against: None, against_strict: None, unpaired_runs: 0 };
    for r in runs.iter().flat_map(|run| run.rows.iter().find(|r| r.slots == slots && r.config == config)) {
        row.runs += 1;
        row.counts += r.counts;
        row.healthy &= r.healthy;
    }
    if config != "plain" {
        let (against, unpaired) = paired_with(runs, slots, config, "plain");
        row.against = Some(against);
        row.unpaired_runs = unpaired;
    }
    if LoadConfig::read_against_strict(config) {
        let (against, unpaired) = paired_with(runs, slots, config, LoadConfig::PlainStrict.name());
        row.against_strict = (unpaired < row.runs).then_some(against);
    }
    row
}

/// `config` against `reference` over every run that served it, and in how many of those runs there was no
/// `reference` row to pair it with. The reference's rounds and this configuration's gather run by run, each run cut
/// to the rounds both have, so round i of one stays beside round i of the other.
fn paired_with(runs: &[Run], slots: u32, config: &str, reference: &str) -> (AgainstPlain, usize) {
    let (mut base, mut this, mut unpaired) = (Columns::default(), Columns::default(), 0);
    for run in runs {
        let Some(r) = run.rows.iter().find(|r| r.slots == slots && r.config == config) else { continue };
        match run.rows.iter().find(|p| p.slots == slots && p.config == reference) {
            Some(p) => {
                let n = p.round_tok_per_s.len().min(r.round_tok_per_s.len());
                base.extend(p, n);
                this.extend(r, n);
            }
            None => unpaired += 1,
        }
    }
    (Plain::new(base.rounds()).against(&this.rounds()), unpaired)
}

/// Rounds gathered from several runs.
#[derive(Default)]
struct Columns {
    tok_per_s: Vec<f64>,
    p99_s: Vec<f64>,
    unit_ms: Vec<Option<f64>>,
}

impl Columns {
    /// The first `n` rounds of a run's row ([`read`] gives every round a unit or None).
    fn extend(&mut self, r: &RunRow, n: usize) {
        self.tok_per_s.extend(&r.round_tok_per_s[..n]);
        self.p99_s.extend(&r.round_p99_s[..n]);
        self.unit_ms.extend(&r.round_unit_ms[..n]);
    }

    fn rounds(&self) -> Rounds<'_> {
        Rounds { tok_per_s: &self.tok_per_s, p99_s: &self.p99_s, unit_ms: &self.unit_ms }
    }
}

/// The pooled rows as a Markdown table, the runs they come from above it.
pub fn markdown(rows: &[PoolRow], runs: &[Run]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} runs of `kolm-rsd bench --load` pooled, each configuration's rounds paired with plain's round beside it in the same run:", runs.len());
    for run in runs {
        let _ = writeln!(s, "- `{}`", run.path.display());
    }
    let _ = writeln!(s, "\n| -np | config | runs | pairings | × plain, rates (95%) | × plain at one speed (95%) | its units × plain's (95%) | p99 at or below plain's, rounds (at one speed) | drafted / accepted | identical to alone (its tokens × theirs) | done | healthy |");
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let ratio = |p: &super::paired::Paired| format!("{:.3}× ({:.3}–{:.3})", p.mean, p.lo, p.hi);
    for r in rows {
        let a = r.against.as_ref();
        let paired = a.and_then(|a| a.paired.as_ref());
        let dash = || "–".to_string();
        let p99 = paired.map_or_else(dash, |(p, below)| {
            let at_speed = a.and_then(|a| a.p99_below_at_speed).map_or(String::new(), |k| format!(" ({k} of {})", p.rounds));
            format!("{below} of {}{at_speed}", p.rounds)
        });
        let work = of_alone(r.counts.tokens, r.counts.alone_tokens);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {}/{}{work} | {}/{} | {} |",
            r.slots,
            r.config,
            r.runs,
            paired.map_or_else(dash, |(p, _)| p.rounds.to_string()),
            paired.map_or_else(dash, |(p, _)| ratio(p)),
            a.and_then(|a| a.paired_at_speed.as_ref()).map_or_else(dash, ratio),
            a.and_then(|a| a.unit_vs_plain.as_ref()).map_or_else(dash, ratio),
            p99,
            r.counts.drafted,
            r.counts.accepted,
            r.counts.identical,
            r.counts.compared,
            r.counts.done,
            r.counts.sent,
            if r.healthy { "yes" } else { "**no**" }
        );
    }
    let strict: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let a = r.against_strict.as_ref()?;
            let (p, below) = a.paired.as_ref()?;
            let at_speed = a.paired_at_speed.as_ref().map_or(String::new(), |q| format!("; at one speed {}", ratio(q)));
            Some(format!("- -np {} {}: {}, {} pairings{at_speed}; p99 at or below plain-strict's in {below} of {}", r.slots, r.config, ratio(p), p.rounds, p.rounds))
        })
        .collect();
    if !strict.is_empty() {
        let _ = writeln!(s, "\nAgainst plain-strict, paired the same way (the same answers as alone, so the same work; the cost of exactness taken out):");
        let _ = writeln!(s, "{}", strict.join("\n"));
    }
    for r in rows.iter().filter(|r| r.unpaired_runs > 0) {
        let _ = writeln!(s, "\n-np {} {}: {} run(s) had no plain row at this slot count; their counts are in the row, their rounds are not paired.", r.slots, r.config, r.unpaired_runs);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::paired::paired;
    use super::*;

    fn row(config: &str, rates: &[f64], p99: &[f64], units: Option<&[f64]>) -> RunRow {
        let n = rates.len();
        RunRow {
            slots: 8,
            config: config.into(),
            counts: Counts { sent: 4 * n, done: 4 * n, identical: 3 * n, compared: 4 * n, drafted: 10, accepted: 9, ..Counts::default() },
            healthy: true,
            round_tok_per_s: rates.to_vec(),
            round_p99_s: p99.to_vec(),
            round_unit_ms: units.map_or_else(|| vec![None; rates.len()], |u| u.iter().copied().map(Some).collect()),
        }
    }

    fn run(name: &str, rows: Vec<RunRow>) -> Run {
        Run { path: PathBuf::from(name), rows }
    }

    #[test]
    fn pairings_of_all_runs_are_read_as_one_run_s_and_each_run_keeps_its_own_plain() {
        // Run a: three rounds; run b, on a machine half as fast: two. kolm's rounds beside plain's in each.
        let a = run("a", vec![row("plain", &[20.0, 19.0, 21.0], &[60.0, 62.0, 61.0], Some(&[100.0, 105.0, 95.0])), row("kolm", &[19.0, 20.0, 22.0], &[58.0, 63.0, 60.0], Some(&[104.0, 100.0, 96.0]))]);
        let b = run("b", vec![row("plain", &[10.0, 11.0], &[120.0, 118.0], Some(&[200.0, 190.0])), row("kolm", &[11.0, 11.5], &[115.0, 119.0], Some(&[195.0, 200.0]))]);
        let rows = pool(&[a, b]);
        assert_eq!(rows.iter().map(|r| (r.config.as_str(), r.runs)).collect::<Vec<_>>(), [("plain", 2), ("kolm", 2)]);
        assert!(rows[0].against.is_none(), "plain is the reference");
        let k = &rows[1];
        let (p, below) = k.against.as_ref().unwrap().paired.clone().unwrap();
        // The oracle: the five ratios, each against its own run's plain.
        assert_eq!(p, paired(&[20.0, 19.0, 21.0, 10.0, 11.0], &[19.0, 20.0, 22.0, 11.0, 11.5]).unwrap());
        assert_eq!((p.rounds, below), (5, 3));
        let at_speed = k.against.as_ref().unwrap().paired_at_speed.clone().unwrap();
        assert_eq!(at_speed, paired(&[2000.0, 1995.0, 1995.0, 2000.0, 2090.0], &[1976.0, 2000.0, 2112.0, 2145.0, 2300.0]).unwrap());
        assert_eq!(k.counts, Counts { sent: 20, done: 20, identical: 15, compared: 20, drafted: 20, accepted: 18, ..Counts::default() });
        let md = markdown(&rows, &[run("a", vec![]), run("b", vec![])]);
        assert!(md.contains(&format!("| 8 | kolm | 2 | 5 | {:.3}× ({:.3}–{:.3}) |", p.mean, p.lo, p.hi)), "{md}");
        assert!(md.contains("| 8 | plain | 2 | – | – | – | – | – | 20 / 18 | 15/20 | 20/20 | yes |"), "{md}");
    }

    #[test]
    fn a_run_without_units_or_without_plain_still_counts_but_is_not_read_at_one_speed_or_paired() {
        let a = run("a", vec![row("plain", &[20.0, 19.0], &[60.0, 62.0], Some(&[100.0, 105.0])), row("kolm", &[19.0, 20.0, 18.0], &[58.0, 63.0, 70.0], Some(&[104.0, 100.0, 90.0]))]);
        let old = run("old", vec![row("plain", &[10.0, 11.0], &[120.0, 118.0], None), row("kolm", &[11.0, 11.5], &[115.0, 119.0], None)]);
        let lone = run("lone", vec![row("kolm", &[30.0, 30.0], &[10.0, 10.0], None)]);
        let rows = pool(&[a, old, lone]);
        let k = rows.iter().find(|r| r.config == "kolm").unwrap();
        let a = k.against.as_ref().unwrap();
        // Run a's third kolm round has no plain round beside it: four pairings, not five.
        assert_eq!(a.paired.as_ref().unwrap().0, paired(&[20.0, 19.0, 10.0, 11.0], &[19.0, 20.0, 11.0, 11.5]).unwrap());
        assert!(a.paired_at_speed.is_none() && a.unit_vs_plain.is_none() && a.p99_below_at_speed.is_none(), "rounds without a unit: no reading at one speed");
        assert_eq!((k.runs, k.unpaired_runs, k.counts.sent), (3, 1, 28));
        assert!(markdown(&rows, &[]).contains("-np 8 kolm: 1 run(s) had no plain row at this slot count"));
    }

    #[test]
    fn exact_rows_are_paired_with_plain_strict_in_the_runs_that_served_it() {
        let work = |mut r: RunRow, tokens: u64| {
            r.counts.tokens = tokens;
            r.counts.alone_tokens = 100;
            r
        };
        let a = run("a", vec![work(row("plain", &[20.0, 19.0], &[60.0, 62.0], None), 93), work(row("plain-strict", &[18.0, 17.0], &[64.0, 66.0], None), 100), work(row("kolm", &[19.8, 18.7], &[63.0, 67.0], None), 100)]);
        let b = run("b", vec![work(row("plain", &[10.0, 11.0], &[120.0, 118.0], None), 93), work(row("plain-strict", &[9.0, 10.0], &[125.0, 124.0], None), 100), work(row("kolm", &[9.9, 11.0], &[124.0, 123.0], None), 100)]);
        // A run without plain-strict, older than the tokens alone: kolm's rounds there are paired with plain only, and
        // its tokens are left out of the ratio to the answers alone.
        let old = |mut r: RunRow| {
            r.counts.tokens = 300;
            r
        };
        let c = run("c", vec![old(row("plain", &[10.0, 10.0], &[100.0, 100.0], None)), old(row("kolm", &[30.0, 30.0], &[10.0, 10.0], None))]);
        let rows = pool(&[a, b, c]);
        let by = |config: &str| rows.iter().find(|r| r.config == config).unwrap();
        assert!(by("plain").against_strict.is_none() && by("plain-strict").against_strict.is_none(), "the references are not read against themselves");
        let (p, below) = by("kolm").against_strict.as_ref().unwrap().paired.clone().unwrap();
        assert_eq!(p, paired(&[18.0, 17.0, 9.0, 10.0], &[19.8, 18.7, 9.9, 11.0]).unwrap(), "runs a and b only");
        assert_eq!(below, 3, "above plain-strict's p99 in one round of four");
        assert_eq!(by("kolm").against.as_ref().unwrap().paired.as_ref().unwrap().0.rounds, 6, "against plain: every run");
        let md = markdown(&rows, &[]);
        assert!(md.contains(&format!("- -np 8 kolm: {:.3}× ({:.3}–{:.3}), 4 pairings; p99 at or below plain-strict's in 3 of 4", p.mean, p.lo, p.hi)), "{md}");
        assert!(md.contains("| 8 | plain |") && md.contains("| 18/24 (0.930×) |"), "plain served 93 tokens a run of the 100 its answers have alone: {md}");
        assert!(md.contains("| 18/24 (1.000×) |"), "run c's 300 tokens have nothing alone to be read against: {md}");
    }

    #[test]
    fn a_missing_or_foreign_report_is_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("kolm-pool-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = read(&dir).err().unwrap();
        assert!(e.starts_with(&dir.join("load.json").display().to_string()), "{e}");
        std::fs::write(dir.join("load.json"), r#"{"entries": []}"#).unwrap();
        let e = read(&dir).err().unwrap();
        assert!(e.contains("load.json: not a `kolm-rsd bench --load` report"), "{e}");
        let bad = r#"{"rows": [{"slots": 8, "config": "kolm", "sent": 1, "done": 1, "identical": 1, "compared": 1, "drafted": 0, "accepted": 0, "healthy": true, "round_tok_per_s": [1.0, 2.0], "round_p99_s": [1.0]}]}"#;
        std::fs::write(dir.join("load.json"), bad).unwrap();
        assert!(read(&dir).err().unwrap().contains("-np 8 kolm: 2 rounds' rates against 1 rounds' p99"));
        let good = bad.replace("[1.0]}", "[1.0, 1.5]}");
        std::fs::write(dir.join("load.json"), good).unwrap();
        let run = read(&dir.join("load.json")).unwrap();
        assert_eq!((run.rows.len(), &run.rows[0].round_unit_ms[..]), (1, &[None, None][..]), "a report older than the units reads");
        // The second round's call log beside it: that round is read at one speed by the log, by today's rule.
        let one = "80000\t8\t0\t8\t8\n";
        std::fs::write(dir.join(calls::log_name(8, "kolm", 1)), format!("us\ttokens\tprompt\toutputs\tslots\n{}", one.repeat(3))).unwrap();
        assert_eq!(read(&dir).unwrap().rows[0].round_unit_ms, [None, Some(80.0)]);
        std::fs::write(dir.join(calls::log_name(8, "kolm", 0)), "wall\n").unwrap();
        let e = read(&dir).err().unwrap();
        assert!(e.contains("calls-np8-kolm-r1.tsv: not a call log"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
