//! A running mean that noise on a busy machine cannot carry: noise only ever adds time to a step, so past a few
//! samples one counts at most [`CLIP`] times the mean, and past [`EMA_SAMPLES`] the mean follows the machine as
//! an exponential moving average. The β model ([`super::beta`]) and the gate ([`super::gate`]) keep
//! their clocks with it.

/// After this many samples a bucket's mean becomes an exponential moving average.
pub(super) const EMA_SAMPLES: u32 = 16;
/// Once a bucket has [`CLIP_AFTER`] samples, an interval counts at most this many times its mean. Noise on
/// a busy machine only ever adds time, and a bucket drafted a few dozen times otherwise carries a single
/// stall for its whole window: served, β(2..5) came out 1.75 2.40 2.59 3.24 in one pass and 1.91 2.59 3.24
/// 3.73 in the next, on the same requests, and the second pass drafted 25% fewer times.
pub(super) const CLIP: f64 = 1.5;
pub(super) const CLIP_AFTER: u32 = 4;

/// Adds `x` to a running `mean` of `samples` measurements: past [`CLIP_AFTER`] samples `x` counts at most [`CLIP`]
/// times the mean, and the mean is plain, then past [`EMA_SAMPLES`] an exponential moving average. The starting
/// value of `mean` is worth `prior_weight` samples (0: the first measurement replaces it).
pub(super) fn clipped_average(mean: &mut f64, samples: &mut u32, x: f64, prior_weight: f64) {
    let x = if *samples >= CLIP_AFTER { x.min(CLIP * *mean) } else { x };
    *samples = samples.saturating_add(1);
    *mean += (x - *mean) / (f64::from((*samples).min(EMA_SAMPLES)) + prior_weight);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_at_most_clip_times_the_mean_once_warm() {
        let (mut mean, mut n) = (0.0, 0);
        for _ in 0..CLIP_AFTER {
            clipped_average(&mut mean, &mut n, 10.0, 0.0);
        }
        assert_eq!(mean, 10.0, "a plain mean while warming up");
        clipped_average(&mut mean, &mut n, 1000.0, 0.0);
        assert!((mean - (10.0 + (CLIP * 10.0 - 10.0) / f64::from(CLIP_AFTER + 1))).abs() < 1e-12, "{mean}");
        // Past EMA_SAMPLES a lasting change is followed at a fixed rate, however long the history.
        for _ in 0..1000 {
            clipped_average(&mut mean, &mut n, 12.0, 0.0);
        }
        assert!((mean - 12.0).abs() < 1e-9, "{mean}");
    }

    #[test]
    fn a_prior_is_worth_its_weight_in_samples() {
        let (mut mean, mut n) = (1.0, 0);
        clipped_average(&mut mean, &mut n, 3.0, 1.0);
        assert_eq!(mean, 2.0);
    }
}
