//! The machine's speed in one server run, from llama-server's call log (patch 0022, `LLAMA_SERVER_CALL_LOG`):
//! the decode call of one token from every slot and no prompt. Every configuration makes such calls, plain
//! llama-server included, and they are the same work in all of them, so a run's rate times its own unit is its
//! rate at one machine speed. On a machine whose speed moves by half between minutes (session 71: that call took
//! 61 ms in one round and 92 ms in the next, same server, same settings), the rates' ratio of two runs side by
//! side is mostly the machine's; the ratio at one speed is what the configurations did.
//!
//! The speed also moves within a run (session 73: one round's such calls took 126 ms in one minute and 214 ms a
//! few minutes later), so each call is taken at the speed of its own moment: its time over the median of the
//! [`NEAR`] such calls on each side of it. The run's unit is its decode time over the sum of those, the speed its
//! work ran at. Read so, two runs of one path at `-np 8` read 1.045× and 1.011× of plain, where the run's median
//! call read 1.113× and 0.991×.

use std::path::Path;

/// Calls of one token from every slot taken on each side of a call for the speed of its moment (about a second of
/// calls at `-np 8` here; on session 72–73's runs 3 to 6 gave the same readings, 25 and more drifted toward the
/// median of the run).
pub const NEAR: usize = 4;

/// The environment variable that asks the patched llama-server for its call log.
pub const CALL_LOG_ENV: &str = "LLAMA_SERVER_CALL_LOG";

const HEADER: &str = "us\ttokens\tprompt\toutputs\tslots";

/// One run's decode calls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calls {
    pub calls: usize,
    /// Seconds in decode calls, all of them.
    pub decode_s: f64,
    /// The run's unit (ms): the call of one generated token from each of the run's slots at the speed the run's
    /// calls ran at (each call's time over its moment's such call, [`NEAR`]).
    pub unit_ms: f64,
}

/// The call log's name of a round (0-based) of a configuration at a slot count, in a `bench --load` output directory.
pub fn log_name(slots: u32, config: &str, round: usize) -> String {
    format!("calls-np{slots}-{config}-r{}.tsv", round + 1)
}

/// Reads a call log of a run at `slots` slots; None when no call had one token from each slot.
pub fn read(path: &Path, slots: usize) -> Result<Option<Calls>, String> {
    with_log(path, |text| parse(text, slots))
}

/// The machine's speed call by call in a run at `slots` slots: each call of one token from every slot, in order,
/// over the median of them all (1.10: that call took 10% longer than the run's typical one). What a replay needs
/// to serve at this machine's drift and noise ([`crate::replay::Serving::machine`]); empty when no call had one
/// token from each slot.
pub fn speeds(path: &Path, slots: usize) -> Result<Vec<f64>, String> {
    with_log(path, |text| {
        let (times, ones) = calls(text, slots)?;
        let ones: Vec<f64> = ones.iter().map(|&i| times[i]).collect();
        let median = crate::quantile::median(&ones).max(1.0);
        Ok(ones.iter().map(|t| t / median).collect())
    })
}

/// `read` of the call log at `path`, its errors (the file's and the log's) naming the file.
fn with_log<T>(path: &Path, read: impl FnOnce(&str) -> Result<T, String>) -> Result<T, String> {
    std::fs::read_to_string(path).map_err(|e| e.to_string()).and_then(|text| read(&text)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every call's time (µs), and the indices of those of one token from every slot.
fn calls(text: &str, slots: usize) -> Result<(Vec<f64>, Vec<usize>), String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err("not a call log of patch 0022 (its header differs)".into());
    }
    let (mut times, mut ones) = (Vec::new(), Vec::new());
    for (i, line) in lines.enumerate() {
        let bad = || format!("line {}: `{line}` is not a call", i + 2);
        let f = line.split('\t').map(|x| x.parse::<u64>().map_err(|_| bad())).collect::<Result<Vec<_>, _>>()?;
        let [us, tokens, prompt, outputs, in_call] = f[..] else { return Err(bad()) };
        if prompt == 0 && tokens == slots as u64 && outputs == tokens && in_call == tokens {
            ones.push(times.len());
        }
        times.push(us as f64);
    }
    Ok((times, ones))
}

fn parse(text: &str, slots: usize) -> Result<Option<Calls>, String> {
    let (times, ones) = calls(text, slots)?;
    if ones.is_empty() {
        return Ok(None);
    }
    let us_total: f64 = times.iter().sum();
    // In units of its moment's call: the run's decode time in such calls.
    let in_units: f64 = times.iter().enumerate().map(|(i, us)| us / moment(&times, &ones, i)).sum();
    Ok(Some(Calls { calls: times.len(), decode_s: us_total / 1e6, unit_ms: us_total / in_units / 1e3 }))
}

/// The median of the [`NEAR`] calls of one token a slot on each side of call `i` (fewer at a run's ends, where the
/// window keeps its width on the other side).
fn moment(times: &[f64], ones: &[usize], i: usize) -> f64 {
    let at = ones.partition_point(|&k| k < i);
    let width = (2 * NEAR).min(ones.len());
    let lo = at.saturating_sub(NEAR).min(ones.len() - width);
    let near: Vec<f64> = ones[lo..lo + width].iter().map(|&k| times[k]).collect();
    // Whole microseconds: a log of zeros would divide by nothing.
    crate::quantile::median(&near).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_fewer_calls_of_one_token_a_slot_than_a_moment_takes_the_unit_is_their_median() {
        // Four slots: three calls of one token each (90, 60, 70 ms), one with a slot's draft (5 tokens, 4 slots),
        // a prompt chunk, a call of three slots, and a prompt with three generating slots (plain's mixed batch).
        let log = format!(
            "{HEADER}\n90000\t4\t0\t4\t4\n60000\t4\t0\t4\t4\n70000\t4\t0\t4\t4\n95000\t5\t0\t5\t4\n400000\t128\t128\t1\t1\n\
             50000\t3\t0\t3\t3\n500000\t131\t128\t4\t4\n"
        );
        let c = parse(&log, 4).unwrap().unwrap();
        assert_eq!(c.calls, 7);
        assert!((c.unit_ms - 70.0).abs() < 1e-9, "{c:?}");
        assert!((c.decode_s - 1.265).abs() < 1e-9, "{c:?}");
        assert_eq!(parse(&log, 8).unwrap(), None, "no call of eight slots at one token");
    }

    #[test]
    fn each_call_is_taken_at_the_speed_of_its_moment() {
        // Four slots. The machine runs twice as slow in the run's second half: 20 one-token calls of 100 ms with a
        // 1,000 ms prompt among them, then 20 of 200 ms. The run's work is 20 + 10 + 20 calls of its moment, 7 s in
        // all: a unit of 140 ms. The run's median call (150 ms) would count the prompt, decoded while the machine was
        // fast, as 6⅔ calls, not 10.
        let one = |ms: u64| format!("{}\t4\t0\t4\t4\n", ms * 1000);
        let log = format!("{HEADER}\n{}1000000\t300\t300\t1\t1\n{}{}", one(100).repeat(10), one(100).repeat(10), one(200).repeat(20));
        let c = parse(&log, 4).unwrap().unwrap();
        assert_eq!(c.calls, 41);
        // The one call at the seam whose nearest eight are half fast, half slow counts 200/150 for 1: 7 s over 50⅓.
        assert!((c.unit_ms - 7000.0 / (50.0 + 1.0 / 3.0)).abs() < 1e-9, "{c:?}");
        assert!((c.unit_ms - 140.0).abs() < 1.4, "within 1% of the run's speed: {c:?}");
    }

    #[test]
    fn speeds_are_the_calls_of_one_token_a_slot_over_their_median() {
        let log = format!("{HEADER}\n90000\t4\t0\t4\t4\n60000\t4\t0\t4\t4\n95000\t5\t0\t5\t4\n400000\t128\t128\t1\t1\n75000\t4\t0\t4\t4\n");
        let path = std::env::temp_dir().join(format!("kolm-calls-speeds-{}.tsv", std::process::id()));
        std::fs::write(&path, log).unwrap();
        let s = speeds(&path, 4).unwrap();
        assert_eq!(s, [1.2, 0.8, 1.0], "90, 60 and 75 ms over their median 75; the draft's and the prompt's calls left out");
        assert!(speeds(&path, 8).unwrap().is_empty());
        std::fs::remove_file(&path).unwrap();
        let e = speeds(&path, 4).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "names the file: {e}");
    }

    #[test]
    fn a_log_of_another_kind_is_refused_by_line() {
        assert!(parse("wall\n", 4).unwrap_err().contains("header"));
        let e = parse(&format!("{HEADER}\n1\t2\n"), 4).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse(&format!("{HEADER}\n1\tx\t0\t1\t1\n"), 4).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
