//! What a job's GPU time cost, from a price per GPU-hour: the figure a
//! team sets beside throughput when it chooses a serving configuration.

use serde::{Deserialize, Serialize};

/// A price per GPU-hour (a matrix's `cost:` section).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub gpu_hour: f64,
    /// `USD`, `EUR`, ...: shown, never converted.
    pub currency: String,
}

impl Price {
    /// A price per GPU-hour in `currency`: a number 0 or more (`positive`:
    /// above 0) and a currency code of 1 to 8 letters; what is wrong, in
    /// words, otherwise.
    pub fn checked(gpu_hour: f64, currency: &str, positive: bool) -> Result<Price, String> {
        let low = if positive { gpu_hour <= 0.0 } else { gpu_hour < 0.0 };
        if !gpu_hour.is_finite() || low {
            let least = if positive { "above 0" } else { "0 or more" };
            return Err(format!("a price per GPU-hour must be {least}, got {gpu_hour}"));
        }
        if currency.is_empty() || currency.len() > 8 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!("must be a currency code such as USD, got '{currency}'"));
        }
        Ok(Price { gpu_hour, currency: currency.to_owned() })
    }
}

/// The cost of the GPU time some load runs took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    pub currency: String,
    pub gpu_hour: f64,
    /// The runs' GPUs times their durations (first send to last completion).
    pub gpu_hours: f64,
    /// The whole cost over the input tokens, per million (as price lists
    /// quote it: each figure carries all the GPU time); `None` without any.
    pub per_million_input: Option<f64>,
    /// The whole cost over the output tokens, per million.
    pub per_million_output: Option<f64>,
}

impl Cost {
    /// The cost of `gpu_seconds` of GPU time that served `input` and
    /// `output` tokens; `None` for no time.
    pub fn of(price: &Price, gpu_seconds: f64, input: u64, output: u64) -> Option<Cost> {
        if !(gpu_seconds.is_finite() && gpu_seconds > 0.0) {
            return None;
        }
        let gpu_hours = gpu_seconds / 3600.0;
        let total = gpu_hours * price.gpu_hour;
        let per_million = |tokens: u64| (tokens > 0).then(|| total / tokens as f64 * 1e6);
        Some(Cost {
            currency: price.currency.clone(),
            gpu_hour: price.gpu_hour,
            gpu_hours,
            per_million_input: per_million(input),
            per_million_output: per_million(output),
        })
    }

    /// The cost of GPU time bought at several prices (hosts of a fleet
    /// priced apart): each part's GPU-seconds at its price, the whole over
    /// `input` and `output` tokens; `gpu_hour` is then the whole over the
    /// GPU-hours. `None` for no time, or when the prices' currencies differ
    /// (they are never converted).
    pub fn of_parts(parts: &[(&Price, f64)], input: u64, output: u64) -> Option<Cost> {
        let (first, _) = parts.first()?;
        if parts.iter().any(|(p, _)| p.currency != first.currency) {
            return None;
        }
        let gpu_seconds: f64 = parts.iter().map(|(_, s)| s).sum();
        let total: f64 = parts.iter().map(|(p, s)| p.gpu_hour * s / 3600.0).sum();
        let mean = Price {
            gpu_hour: if gpu_seconds > 0.0 { total / (gpu_seconds / 3600.0) } else { 0.0 },
            ..(*first).clone()
        };
        Cost::of(&mean, gpu_seconds, input, output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_s_gpu_time_is_charged_to_its_tokens() {
        let price = Price { gpu_hour: 3.5, currency: "USD".into() };
        // Two GPUs for 30 minutes: one GPU-hour, 3.50 USD.
        let cost = Cost::of(&price, 2.0 * 1800.0, 7_000_000, 1_750_000).expect("a cost");
        assert!((cost.gpu_hours - 1.0).abs() < 1e-12);
        assert!((cost.per_million_input.expect("input") - 0.5).abs() < 1e-12);
        assert!((cost.per_million_output.expect("output") - 2.0).abs() < 1e-12);
        assert_eq!(Cost::of(&price, 3600.0, 0, 10).and_then(|c| c.per_million_input), None);
        assert_eq!(Cost::of(&price, 0.0, 10, 10), None);

        // Half an hour at 2.00 and an hour at 3.50: 4.50 over 1.5 GPU-hours.
        let cheap = Price { gpu_hour: 2.0, currency: "USD".into() };
        let c = Cost::of_parts(&[(&cheap, 1800.0), (&price, 3600.0)], 0, 4_500_000).expect("a cost");
        assert!((c.gpu_hours - 1.5).abs() < 1e-12 && (c.gpu_hour - 3.0).abs() < 1e-12, "{c:?}");
        assert!((c.per_million_output.expect("output") - 1.0).abs() < 1e-12, "{c:?}");
        let euros = Price { gpu_hour: 2.0, currency: "EUR".into() };
        assert_eq!(Cost::of_parts(&[(&euros, 1800.0), (&price, 3600.0)], 1, 1), None, "never converted");
        assert_eq!(Cost::of_parts(&[], 1, 1), None);
        assert!(Price::checked(-1.0, "USD", false).is_err() && Price::checked(0.0, "USD", true).is_err());
        assert_eq!(Price::checked(0.0, "USD", false).map(|p| p.gpu_hour), Ok(0.0));
        assert!(Price::checked(1.0, "US$", false).expect_err("not letters").contains("currency code"));
    }
}
