//! One server run as its step log tells it (`steplog=`, `bench --load --step-log`): the wall time in steps that
//! evaluated a request's prompt and in generation steps, each also in units of the run's own one-token step of
//! every slot. On this machine that step read 102–165 ms in server runs of the same settings (session 30), so
//! rounds' rates differ by more than drafting changes them; the run's own unit takes most of that out.

use serde::Serialize;
use std::path::Path;

/// What one run's steps took.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InPlace {
    pub steps: usize,
    /// Requests begun (prompts evaluated).
    pub begun: u64,
    /// Seconds in steps that evaluated a prompt, and in the others.
    pub prompt_s: f64,
    pub gen_s: f64,
    /// Median generation step in which every slot verified one token (ms): the run's unit.
    pub unit_ms: f64,
    /// Median of wall time over the drafter's price, over generation steps it priced.
    pub wall_over_price: Option<f64>,
}

impl InPlace {
    /// Generation time in units of the run's one-token step.
    pub fn gen_units(&self) -> f64 {
        self.gen_s * 1e3 / self.unit_ms
    }

    /// Prompt time per request begun, in units of the run's one-token step.
    pub fn prompt_units_per_request(&self) -> f64 {
        self.prompt_s * 1e3 / self.unit_ms / self.begun.max(1) as f64
    }
}

/// Reads a step log; None when it has no generation step of every slot at one token (no unit).
pub fn read(path: &Path) -> Result<Option<InPlace>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str) -> Result<Option<InPlace>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(crate::engine::STEP_LOG_HEADER) {
        return Err("not a step log of this kolm-rsd (its header differs)".into());
    }
    struct Step {
        wall: f64,
        price: Option<f64>,
        begun: u64,
        slots: Vec<usize>,
    }
    let mut steps = Vec::new();
    for (i, line) in lines.enumerate() {
        let bad = || format!("line {}: `{line}` is not a step", i + 2);
        let f: Vec<&str> = line.split('\t').collect();
        let [wall, price, _, _, begun, slots, _, _] = f[..] else { return Err(bad()) };
        let num = |s: &str| s.parse::<f64>().map_err(|_| bad());
        steps.push(Step {
            wall: num(wall)?,
            price: if price == "-" { None } else { Some(num(price)?) },
            begun: begun.parse().map_err(|_| bad())?,
            slots: slots.split(',').map(|x| x.parse().map_err(|_| bad())).collect::<Result<_, _>>()?,
        });
    }
    let n = steps.iter().map(|s| s.slots.len()).max().unwrap_or(0);
    let gen = || steps.iter().filter(|s| s.begun == 0);
    let ones: Vec<f64> = gen().filter(|s| s.slots.len() == n && s.slots.iter().all(|&t| t == 1)).map(|s| s.wall).collect();
    if ones.is_empty() {
        return Ok(None);
    }
    let ratios: Vec<f64> = gen().filter_map(|s| s.price.filter(|&p| p > 0.0).map(|p| s.wall / p)).collect();
    let sum = |it: &mut dyn Iterator<Item = &Step>| it.map(|s| s.wall).sum::<f64>() / 1e6;
    Ok(Some(InPlace {
        steps: steps.len(),
        begun: steps.iter().map(|s| s.begun).sum(),
        prompt_s: sum(&mut steps.iter().filter(|s| s.begun > 0)),
        gen_s: sum(&mut gen()),
        unit_ms: crate::quantile::median(&ones) / 1e3,
        wall_over_price: (!ratios.is_empty()).then(|| crate::quantile::median(&ratios)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::STEP_LOG_HEADER;

    #[test]
    fn a_run_in_its_own_units() {
        // Two slots: three one-token steps (100, 120, 110 ms), a step with a 3-token draft priced at 150 ms that
        // took 165, a step that evaluated two prompts in 2 s, and a tail step of one slot.
        let log = format!(
            "{STEP_LOG_HEADER}\n100000\t-\t5\t-\t0\t1,1\ton\t-,-\n120000\t100000\t5\t-\t0\t1,1\ton\t-,-\n110000\t110000\t5\t-\t0\t1,1\ton\t-,-\n\
             165000\t150000\t9\t150000\t0\t4,1\ton on=1.100\t3:3:3:d:0.99:-,-\n2000000\t120000\t5\t-\t2\t1,1\toff\t-,-\n60000\t60000\t3\t-\t0\t1,0\t-\t-,-\n"
        );
        let p = parse(&log).unwrap().unwrap();
        assert_eq!((p.steps, p.begun), (6, 2));
        assert!((p.prompt_s - 2.0).abs() < 1e-9 && (p.gen_s - 0.555).abs() < 1e-9, "{p:?}");
        assert!((p.unit_ms - 110.0).abs() < 1e-9, "the median of the steps with every slot at one token");
        assert!((p.gen_units() - 5.045).abs() < 1e-3 && (p.prompt_units_per_request() - 2000.0 / 110.0 / 2.0).abs() < 1e-9);
        // wall / price over the priced generation steps: 1.2, 1.0, 1.1, 1.0 → median 1.05.
        assert!((p.wall_over_price.unwrap() - 1.05).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn a_log_without_a_unit_or_of_another_kind() {
        let log = format!("{STEP_LOG_HEADER}\n2000000\t-\t5\t-\t1\t1,1\t-\t-,-\n");
        assert_eq!(parse(&log).unwrap(), None, "no generation step of every slot");
        assert!(parse("wall\n").unwrap_err().contains("header"));
        let e = parse(&format!("{STEP_LOG_HEADER}\n1\t2\n")).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
