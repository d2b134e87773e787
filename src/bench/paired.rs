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
