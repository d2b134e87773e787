//! Paired rounds: a configuration against plain round by round. `bench --load` serves the configurations in ABBA
//! order, so a round of each sits in the same minutes of the machine; the ratio of their rates in a round cancels
//! the drift between rounds (15% here), which a pooled ratio keeps. Over several rounds the ratios give a mean and a
//! 95% interval, so that a reading of 0.98× says whether it could be the floor's 0.99× or is below it.

use serde::Serialize;

/// A configuration's rate over plain's, round by round.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Paired {
    pub rounds: usize,
    /// The geometric mean of the rounds' ratios.
    pub mean: f64,
    /// The 95% interval of that mean (Student's t on the logarithms of the ratios).
    pub lo: f64,
    pub hi: f64,
}

/// The paired ratio of `other` over `base` (rates of the same rounds, in round order); None without two rounds of
/// both, or with a rate that is not positive.
pub fn paired(base: &[f64], other: &[f64]) -> Option<Paired> {
    let n = base.len().min(other.len());
    if n < 2 || !base[..n].iter().chain(&other[..n]).all(|&x| x > 0.0) {
        return None;
    }
    let logs: Vec<f64> = base.iter().zip(other).map(|(b, o)| (o / b).ln()).collect();
    let mean = logs.iter().sum::<f64>() / n as f64;
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t975(n - 1) * (var / n as f64).sqrt();
    Some(Paired { rounds: n, mean: mean.exp(), lo: (mean - half).exp(), hi: (mean + half).exp() })
}

/// A configuration's rounds as `bench --load` reports them, in round order: each round's rate, its p99 and its unit
/// (the decode call of one token from every slot, each call taken at the speed of its moment: the machine's speed in
/// that round; None where there was no such call).
pub struct Rounds<'a> {
    pub tok_per_s: &'a [f64],
    pub p99_s: &'a [f64],
    pub unit_ms: &'a [Option<f64>],
}

/// A configuration against plain, round by round; all None for plain itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AgainstPlain {
    /// The rates' ratio with its 95% interval, and in how many rounds p99 was at or below plain's (None with fewer
    /// than two rounds).
    pub paired: Option<(Paired, usize)>,
    /// Its units against plain's: reading at one speed assumes its one-token calls cost what plain's do. Where they
    /// cost more beyond the pairings' spread, it may be its own cost (which the rates' ratio counts and the one at one
    /// speed takes out) or the machine's drift (session 72's two runs of one path at `-np 8` read 1.19× and 0.92×).
    pub unit_vs_plain: Option<Paired>,
    /// The rates' ratio with each round taken at one machine speed (its rate times its unit): what the configuration
    /// did, with the machine's drift between the rounds taken out (None where a round had no unit).
    pub paired_at_speed: Option<Paired>,
    /// In how many rounds p99 was at or below plain's, each in its own round's units (a tail is a wait, and a wait
    /// is as long as the machine is slow).
    pub p99_below_at_speed: Option<usize>,
}

/// Plain's rounds, with their readings at one speed computed once for every configuration paired with them.
pub struct Plain<'a> {
    rounds: Rounds<'a>,
    units: Option<Vec<f64>>,
    rate: Option<Vec<f64>>,
    p99: Option<Vec<f64>>,
}

impl<'a> Plain<'a> {
    pub fn new(rounds: Rounds<'a>) -> Self {
        Plain { units: units(&rounds), rate: rate_at_speed(&rounds), p99: p99_at_speed(&rounds), rounds }
    }

    /// `other` paired with these rounds: round i of each sat in the same minutes of the machine.
    pub fn against(&self, other: &Rounds) -> AgainstPlain {
        let b = &self.rounds;
        AgainstPlain {
            paired: paired(b.tok_per_s, other.tok_per_s).map(|p| (p, at_or_below(other.p99_s, b.p99_s))),
            unit_vs_plain: self.units.as_ref().zip(units(other)).and_then(|(b, x)| paired(b, &x)),
            paired_at_speed: self.rate.as_ref().zip(rate_at_speed(other)).and_then(|(b, x)| paired(b, &x)),
            p99_below_at_speed: self.p99.as_ref().zip(p99_at_speed(other)).map(|(b, x)| at_or_below(&x, b)),
        }
    }
}

fn units(r: &Rounds) -> Option<Vec<f64>> {
    r.unit_ms.iter().copied().collect::<Option<Vec<f64>>>().filter(|u| u.len() == r.tok_per_s.len())
}

/// Tokens per one-token call of every slot.
fn rate_at_speed(r: &Rounds) -> Option<Vec<f64>> {
    in_units(r.tok_per_s, r.unit_ms, |rate, unit| rate * unit)
}

/// The tail in such calls.
fn p99_at_speed(r: &Rounds) -> Option<Vec<f64>> {
    in_units(r.p99_s, r.unit_ms, |p99, unit| p99 / unit)
}

/// In how many rounds a p99 was at or below plain's round beside it.
fn at_or_below(p99: &[f64], plain: &[f64]) -> usize {
    p99.iter().zip(plain).filter(|(k, b)| k <= b).count()
}

/// Each round's value taken at one machine speed by its unit; None unless every round has a unit.
fn in_units(values: &[f64], units: &[Option<f64>], f: impl Fn(f64, f64) -> f64) -> Option<Vec<f64>> {
    values.iter().zip(units).map(|(&v, unit)| unit.map(|u| f(v, u))).collect::<Option<Vec<_>>>().filter(|v| v.len() == values.len())
}

/// Student's t at 0.975 with `df` degrees of freedom (df ≥ 1); beyond the table, the normal's 1.96.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
        2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.max(1) - 1).copied().unwrap_or(1.96)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The t distribution's CDF at `t`, by integrating its density (Simpson's rule): the oracle of the table.
    fn t_cdf(t: f64, df: usize) -> f64 {
        // Γ((ν+1)/2) / Γ(ν/2): 1/√π at ν = 1, √π/2 at ν = 2, and × (ν+1)/ν from ν to ν + 2.
        let pi = std::f64::consts::PI;
        let mut g = if df % 2 == 1 { 1.0 / pi.sqrt() } else { pi.sqrt() / 2.0 };
        for v in (if df % 2 == 1 { 1 } else { 2 }..df).step_by(2) {
            g *= (v + 1) as f64 / v as f64;
        }
        let df = df as f64;
        let c = g / (df * pi).sqrt();
        let f = |x: f64| c * (1.0 + x * x / df).powf(-(df + 1.0) / 2.0);
        let n = 20_000;
        let h = t / n as f64;
        let inner: f64 = (1..n).map(|i| f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
        0.5 + h / 3.0 * (f(0.0) + inner + f(t))
    }

    #[test]
    fn the_table_is_student_s_t_at_0_975() {
        for df in 1..=30 {
            let p = t_cdf(t975(df), df);
            // The table's three decimals move the CDF by up to 3e-5.
            assert!((p - 0.975).abs() < 5e-5, "df {df}: CDF({}) = {p}", t975(df));
        }
        assert_eq!(t975(31), 1.96);
    }

    #[test]
    fn rounds_pair_up_and_give_an_interval_around_their_geometric_mean() {
        let p = paired(&[10.0, 20.0], &[11.0, 22.0]).unwrap();
        assert_eq!(p.rounds, 2);
        assert!((p.mean - 1.1).abs() < 1e-12 && (p.lo - 1.1).abs() < 1e-12 && (p.hi - 1.1).abs() < 1e-12, "{p:?}: no spread, no width");
        // Ratios 0.9 and 1.1: mean log 0.5·ln(0.99), sd |ln(1.1/0.9)|/√2, half width 12.706·sd/√2.
        let p = paired(&[10.0, 10.0], &[9.0, 11.0]).unwrap();
        let half = 12.706 * (1.1f64 / 0.9).ln() / 2.0;
        assert!((p.mean - 0.99f64.sqrt()).abs() < 1e-12);
        assert!((p.lo - (0.99f64.sqrt().ln() - half).exp()).abs() < 1e-12 && (p.hi - (0.99f64.sqrt().ln() + half).exp()).abs() < 1e-12);
        assert!(p.lo < 0.5 && p.hi > 2.0, "two rounds that disagree say little: {p:?}");
        let six = paired(&[10.0; 6], &[9.8, 10.1, 9.9, 10.2, 9.7, 10.0]).unwrap();
        assert!(six.lo > 0.97 && six.hi < 1.02, "six rounds near plain narrow it: {six:?}");
    }

    #[test]
    fn one_round_or_a_dead_round_gives_no_pairing() {
        assert_eq!(paired(&[10.0], &[11.0]), None);
        assert_eq!(paired(&[10.0, 0.0], &[11.0, 12.0]), None);
        assert_eq!(paired(&[10.0, f64::NAN], &[11.0, 12.0]), None);
        assert_eq!(paired(&[10.0, 10.0, 10.0], &[11.0, 12.0]).map(|p| p.rounds), Some(2), "as many rounds as both have");
    }
}
