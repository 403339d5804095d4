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
    }
}
