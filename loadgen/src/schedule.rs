//! When each request is sent: every send time is computed up front as an
//! absolute deadline from the run's start.
//!
//! Relative sleeps ("sleep one gap after the previous send") accumulate timer
//! overshoot and under-deliver the rate; absolute deadlines do not.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How requests arrive when a rate is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Exactly one request every 1/rate seconds.
    Constant,
    /// Exponential gaps of mean 1/rate (a Poisson process), reproducible from
    /// the seed.
    Poisson { seed: u64 },
}

/// The send deadlines of `n` requests, as offsets from the run's start. With
/// no rate (or an infinite one) every request is due at once. The first
/// request is always due at zero.
pub fn send_times(n: usize, rate: Option<f64>, arrival: Arrival) -> Vec<Duration> {
    let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return vec![Duration::ZERO; n];
    };
    match arrival {
        Arrival::Constant => (0..n).map(|i| Duration::from_secs_f64(i as f64 / rate)).collect(),
        Arrival::Poisson { seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut at = 0.0f64;
            (0..n)
                .map(|i| {
                    if i > 0 {
                        // Inverse CDF of the exponential; 1 - u is in (0, 1],
                        // so the logarithm is finite.
                        let u: f64 = rng.random();
                        at += -(1.0 - u).ln() / rate;
                    }
                    Duration::from_secs_f64(at)
                })
                .collect()
        }
    }
}

/// The rates a sweep tries: `steps` evenly spaced strictly between `low`
/// (the synchronous rate) and `high` (the throughput rate).
pub fn sweep_rates(low: f64, high: f64, steps: usize) -> Vec<f64> {
    if !(low.is_finite() && high.is_finite()) || high <= low || low <= 0.0 {
        return Vec::new();
    }
    (1..=steps).map(|i| low + (high - low) * i as f64 / (steps + 1) as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn constant_rate_deadlines_are_exact() {
        assert_eq!(send_times(4, Some(4.0), Arrival::Constant), ms(&[0, 250, 500, 750]));
        assert_eq!(send_times(3, Some(0.5), Arrival::Constant), ms(&[0, 2000, 4000]));
    }

    #[test]
    fn no_rate_or_infinite_rate_sends_everything_at_once() {
        assert_eq!(send_times(3, None, Arrival::Constant), ms(&[0, 0, 0]));
        let inf = send_times(3, Some(f64::INFINITY), Arrival::Poisson { seed: 1 });
        assert_eq!(inf, ms(&[0, 0, 0]));
    }

    #[test]
    fn poisson_is_reproducible_from_its_seed() {
        let a = send_times(100, Some(10.0), Arrival::Poisson { seed: 7 });
        assert_eq!(a, send_times(100, Some(10.0), Arrival::Poisson { seed: 7 }));
        assert_ne!(a, send_times(100, Some(10.0), Arrival::Poisson { seed: 8 }));
        assert_eq!(a[0], Duration::ZERO);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn poisson_gaps_pass_a_kolmogorov_smirnov_test() {
        let (n, rate) = (5000, 200.0);
        let times = send_times(n, Some(rate), Arrival::Poisson { seed: 11 });
        let mut gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        gaps.sort_by(f64::total_cmp);
        let m = gaps.len() as f64;
        let d = gaps
            .iter()
            .enumerate()
            .map(|(i, &g)| {
                let cdf = 1.0 - (-rate * g).exp();
                (cdf - i as f64 / m).abs().max(((i + 1) as f64 / m - cdf).abs())
            })
            .fold(0.0, f64::max);
        // The critical value at the 1% level is 1.63 / sqrt(m).
        assert!(d < 1.63 / m.sqrt(), "KS statistic {d}");
        // And a constant schedule is far from exponential.
        let constant = send_times(n, Some(rate), Arrival::Constant);
        assert!(constant.windows(2).all(|w| (w[1] - w[0]).as_secs_f64() - 1.0 / rate < 1e-9));
    }

    #[test]
    fn sweep_rates_lie_evenly_between_the_ends() {
        assert_eq!(sweep_rates(1.0, 5.0, 3), vec![2.0, 3.0, 4.0]);
        assert!(sweep_rates(5.0, 1.0, 3).is_empty());
    }

    #[test]
    fn poisson_mean_gap_is_one_over_rate() {
        let n = 20_000;
        let times = send_times(n, Some(50.0), Arrival::Poisson { seed: 42 });
        let mean_gap = times[n - 1].as_secs_f64() / (n - 1) as f64;
        assert!((mean_gap - 0.02).abs() < 0.002, "mean gap {mean_gap}");
    }
}
