//! The statistics that decide whether a difference between configurations
//! is real: 95% confidence intervals of a mean over repeats (Student's t,
//! n - 1 degrees of freedom) and of a difference of two means (Welch's t,
//! Welch–Satterthwaite degrees of freedom). See `docs/metrics.md`.

/// The two-sided confidence level of every interval.
pub const CONFIDENCE: f64 = 0.95;

/// The mean of per-repeat values with its 95% confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    /// Half the interval's width; `None` for fewer than two values.
    pub half_width: Option<f64>,
    pub n: usize,
}

impl Estimate {
    pub fn of(values: &[f64]) -> Estimate {
        let n = values.len();
        let mean = if n == 0 { 0.0 } else { values.iter().sum::<f64>() / n as f64 };
        let half_width = (n >= 2)
            .then(|| t_quantile(1.0 - (1.0 - CONFIDENCE) / 2.0, (n - 1) as f64) * (variance(values) / n as f64).sqrt());
        Estimate { mean, half_width, n }
    }
}

/// A difference of two means (`a` minus `b`) with its 95% confidence
/// interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Difference {
    pub diff: f64,
    /// `None` unless both sides have two values or more.
    pub half_width: Option<f64>,
    /// Welch–Satterthwaite degrees of freedom, when there is an interval.
    pub df: Option<f64>,
}

impl Difference {
    /// Welch's interval for mean(a) - mean(b): no equal variances assumed.
    pub fn welch(a: &[f64], b: &[f64]) -> Difference {
        let (ea, eb) = (Estimate::of(a), Estimate::of(b));
        let diff = ea.mean - eb.mean;
        if a.len() < 2 || b.len() < 2 {
            return Difference { diff, half_width: None, df: None };
        }
        let (va, vb) = (variance(a) / a.len() as f64, variance(b) / b.len() as f64);
        let se2 = va + vb;
        if se2 == 0.0 {
            // No spread on either side: the difference is what it is.
            return Difference { diff, half_width: Some(0.0), df: Some(f64::INFINITY) };
        }
        let df = se2 * se2 / (va * va / (a.len() - 1) as f64 + vb * vb / (b.len() - 1) as f64);
        let t = t_quantile(1.0 - (1.0 - CONFIDENCE) / 2.0, df);
        Difference { diff, half_width: Some(t * se2.sqrt()), df: Some(df) }
    }

    /// The interval of `diff`, the difference of two estimates with
    /// standard errors `se_a` and `se_b` on `df_a` and `df_b` degrees of
    /// freedom (Welch–Satterthwaite): two runs' figures with the errors
    /// their own requests give (`metrics::noise`).
    pub fn of_errors(diff: f64, (se_a, df_a): (f64, f64), (se_b, df_b): (f64, f64)) -> Difference {
        let (va, vb) = (se_a * se_a, se_b * se_b);
        let se2 = va + vb;
        if se2 == 0.0 {
            return Difference { diff, half_width: Some(0.0), df: Some(f64::INFINITY) };
        }
        let df = se2 * se2 / (va * va / df_a + vb * vb / df_b);
        let t = t_quantile(1.0 - (1.0 - CONFIDENCE) / 2.0, df);
        Difference { diff, half_width: Some(t * se2.sqrt()), df: Some(df) }
    }

    /// The interval of `diff`, a mean of paired differences whose standard
    /// error `se` has `df` degrees of freedom: two runs of the same
    /// requests compared batch by batch (`metrics::noise::Noise::paired_se`).
    pub fn paired(diff: f64, (se, df): (f64, f64)) -> Difference {
        if se == 0.0 {
            return Difference { diff, half_width: Some(0.0), df: Some(f64::INFINITY) };
        }
        let t = t_quantile(1.0 - (1.0 - CONFIDENCE) / 2.0, df);
        Difference { diff, half_width: Some(t * se), df: Some(df) }
    }

    /// Whether the interval holds zero (no interval: unknown, `None`).
    pub fn contains_zero(&self) -> Option<bool> {
        self.half_width.map(|h| (self.diff - h) <= 0.0 && 0.0 <= (self.diff + h))
    }
}

/// The sample variance (n - 1 in the denominator).
fn variance(values: &[f64]) -> f64 {
    let n = values.len();
    if n < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64
}

/// The `p` quantile (0.5 < p < 1) of Student's t with `df` degrees of
/// freedom (any positive real: Welch's are not whole), by bisection on the
/// distribution function.
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if df.is_infinite() {
        return normal_quantile(p);
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_cdf(hi, df) < p {
        hi *= 2.0;
        if hi > 1e12 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2).
fn t_cdf(t: f64, df: f64) -> f64 {
    1.0 - 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The normal distribution's quantile, by bisection on its distribution
/// function (for the limit of infinitely many degrees of freedom).
fn normal_quantile(p: f64) -> f64 {
    let cdf = |z: f64| 0.5 * (1.0 + erf(z / std::f64::consts::SQRT_2));
    // Every quantile asked here is well below 8 (p < 1 - 1e-15).
    let (mut lo, mut hi) = (0.0f64, 8.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The error function for 0 <= z <= 6, by the series
/// erf(z) = 2/sqrt(pi) e^(-z^2) sum_k (2z^2)^k z / (1 3 5 ... (2k + 1)),
/// summed until its terms vanish.
fn erf(z: f64) -> f64 {
    let mut term = z;
    let mut sum = z;
    let mut k = 0.0;
    while term.abs() > 1e-17 * sum.abs() && k < 10_000.0 {
        k += 1.0;
        term *= 2.0 * z * z / (2.0 * k + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-z * z).exp() * sum
}

/// The regularized incomplete beta function I_x(a, b), from its continued
/// fraction (evaluated with the modified Lentz method), using the symmetry
/// I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(1.0 - x, b, a);
    }
    let front = (a * x.ln() + b * (1.0 - x).ln() - ln_beta(a, b)).exp() / a;
    front * beta_fraction(x, a, b)
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut h = d;
    for m in 1..1000 {
        let m = f64::from(m);
        // The even step, then the odd one.
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        h *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// ln B(a, b) = ln Γ(a) + ln Γ(b) - ln Γ(a + b).
fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// ln Γ(x) for x > 0, by the Lanczos approximation (g = 7, 9 terms:
/// about 15 correct digits).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = C[0];
    for (i, &c) in C.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn t_quantiles_match_the_published_table() {
        // df = 1 and 2 have closed forms: tan(0.475 pi) and 0.95 / sqrt(2 * 0.975 * 0.025).
        let exact1 = (0.475 * std::f64::consts::PI).tan();
        let exact2 = 0.95 / (2.0f64 * 0.975 * 0.025).sqrt();
        assert!(near(t_quantile(0.975, 1.0), exact1, 1e-8), "{}", t_quantile(0.975, 1.0));
        assert!(near(t_quantile(0.975, 2.0), exact2, 1e-8), "{}", t_quantile(0.975, 2.0));
        // The 97.5% column of the usual table, to its four decimals.
        for (df, t) in [(3.0, 3.1824), (4.0, 2.7764), (5.0, 2.5706), (10.0, 2.2281), (30.0, 2.0423), (120.0, 1.9799)] {
            assert!(near(t_quantile(0.975, df), t, 5e-5), "df {df}: {}", t_quantile(0.975, df));
        }
        assert!(near(t_quantile(0.975, f64::INFINITY), 1.95996, 1e-5));
        assert!(near(t_quantile(0.975, 1e7), 1.95996, 1e-5));
        // Between whole degrees of freedom, between their quantiles.
        let (t2, t3, t25) = (t_quantile(0.975, 2.0), t_quantile(0.975, 3.0), t_quantile(0.975, 2.5));
        assert!(t3 < t25 && t25 < t2);
    }

    #[test]
    fn an_estimate_is_the_mean_with_student_s_interval() {
        // Mean 10, sample sd 1: half width t(0.975, 2) / sqrt(3).
        let e = Estimate::of(&[9.0, 10.0, 11.0]);
        assert_eq!((e.mean, e.n), (10.0, 3));
        let expected = t_quantile(0.975, 2.0) / 3f64.sqrt();
        assert!(near(e.half_width.expect("interval"), expected, 1e-12));
        assert!(near(expected, 2.4841, 1e-4));
        assert_eq!(Estimate::of(&[5.0]).half_width, None, "one repeat: no interval");
    }

    #[test]
    fn welch_s_interval_by_hand() {
        // a: mean 11, var 1 (n 3); b: mean 10, var 4 (n 3).
        // se^2 = 1/3 + 4/3 = 5/3; df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 25/9 / (17/18) = 50/17.
        let d = Difference::welch(&[10.0, 11.0, 12.0], &[8.0, 10.0, 12.0]);
        assert!(near(d.diff, 1.0, 1e-12));
        assert!(near(d.df.expect("df"), 50.0 / 17.0, 1e-12));
        let half = t_quantile(0.975, 50.0 / 17.0) * (5.0f64 / 3.0).sqrt();
        assert!(near(d.half_width.expect("interval"), half, 1e-12));
        assert_eq!(d.contains_zero(), Some(true));
        let clear = Difference::welch(&[20.0, 20.5, 21.0], &[10.0, 10.5, 11.0]);
        assert_eq!(clear.contains_zero(), Some(false));
        assert_eq!(Difference::welch(&[1.0], &[2.0, 3.0]).contains_zero(), None);
        let flat = Difference::welch(&[2.0, 2.0], &[1.0, 1.0]);
        assert_eq!((flat.half_width, flat.contains_zero()), (Some(0.0), Some(false)));
    }
}
