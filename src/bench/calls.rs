//! The machine's speed in one server run, from llama-server's call log (patch 0022, `LLAMA_SERVER_CALL_LOG`):
//! the median decode call of one token from every slot and no prompt. Every configuration makes such calls, plain
//! llama-server included, and they are the same work in all of them, so a run's rate times its own unit is its
//! rate at one machine speed. On a machine whose speed moves by half between minutes (session 71: that call took
//! 61 ms in one round and 92 ms in the next, same server, same settings), the rates' ratio of two runs side by
//! side is mostly the machine's; the ratio at one speed is what the configurations did.

use std::path::Path;

/// The environment variable that asks the patched llama-server for its call log.
pub const CALL_LOG_ENV: &str = "LLAMA_SERVER_CALL_LOG";

const HEADER: &str = "us\ttokens\tprompt\toutputs\tslots";

/// One run's decode calls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calls {
    pub calls: usize,
    /// Seconds in decode calls, all of them.
    pub decode_s: f64,
    /// Median call of one generated token from each of the run's slots (ms): the run's unit.
    pub unit_ms: f64,
}

/// Reads a call log of a run at `slots` slots; None when no call had one token from each slot.
pub fn read(path: &Path, slots: usize) -> Result<Option<Calls>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text, slots).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str, slots: usize) -> Result<Option<Calls>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err("not a call log of patch 0022 (its header differs)".into());
    }
    let (mut calls, mut us_total, mut ones) = (0, 0.0, Vec::new());
    for (i, line) in lines.enumerate() {
        let bad = || format!("line {}: `{line}` is not a call", i + 2);
        let f = line.split('\t').map(|x| x.parse::<u64>().map_err(|_| bad())).collect::<Result<Vec<_>, _>>()?;
        let [us, tokens, prompt, outputs, in_call] = f[..] else { return Err(bad()) };
        calls += 1;
        us_total += us as f64;
        if prompt == 0 && tokens == slots as u64 && outputs == tokens && in_call == tokens {
            ones.push(us as f64);
        }
    }
    if ones.is_empty() {
        return Ok(None);
    }
    Ok(Some(Calls { calls, decode_s: us_total / 1e6, unit_ms: crate::quantile::median(&ones) / 1e3 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_is_the_median_call_of_one_token_a_slot() {
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
    fn a_log_of_another_kind_is_refused_by_line() {
        assert!(parse("wall\n", 4).unwrap_err().contains("header"));
        let e = parse(&format!("{HEADER}\n1\t2\n"), 4).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse(&format!("{HEADER}\n1\tx\t0\t1\t1\n"), 4).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
