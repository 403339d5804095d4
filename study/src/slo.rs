//! An SLO search's types: what a search profile varies, between which
//! bounds, and the SLOs (a statistic of a latency at most so many ms) that
//! must hold; a probe's point. Profiles (`model::Profile`) hold them, and
//! `search` plans and judges the probes.

use benchfleet_core::Summary;
use benchfleet_core::metrics::Distribution;
use serde::{Deserialize, Serialize};

/// What a search varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Over {
    /// Requests per second (the profile's arrival process at that rate).
    Rate,
    /// Requests in flight at most, all due at once (or at the profile's
    /// fixed rate).
    Concurrency,
}

impl Over {
    /// The load's unit, as a report writes it after the number.
    pub fn unit(self) -> &'static str {
        match self {
            Over::Rate => "req/s",
            Over::Concurrency => "concurrent",
        }
    }

    /// The matrix's name for it.
    pub fn field(self) -> &'static str {
        match self {
            Over::Rate => "rate",
            Over::Concurrency => "max_concurrency",
        }
    }
}

/// A latency metric an SLO bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Ttft,
    Tpot,
    Itl,
    E2el,
}

/// Which statistic of the metric over a job's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    Mean,
    Median,
    P95,
    P99,
}

/// One SLO: a statistic of a latency at most `ms`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    pub metric: Metric,
    pub stat: Stat,
    pub ms: f64,
}

/// The SLO keys a matrix may give, e.g. `ttft_p99_ms`.
pub const KEYS: &str = "ttft, tpot, itl or e2el, then mean, median, p95 or p99, then ms (e.g. ttft_p99_ms)";

impl Bound {
    /// A matrix key (`ttft_p99_ms`) with its bound; `None` for a key that
    /// is not one.
    pub fn parse(key: &str, ms: f64) -> Option<Bound> {
        let rest = key.strip_suffix("_ms")?;
        let (metric, stat) = rest.split_once('_')?;
        let metric = match metric {
            "ttft" => Metric::Ttft,
            "tpot" => Metric::Tpot,
            "itl" => Metric::Itl,
            "e2el" => Metric::E2el,
            _ => return None,
        };
        let stat = match stat {
            "mean" => Stat::Mean,
            "median" | "p50" => Stat::Median,
            "p95" => Stat::P95,
            "p99" => Stat::P99,
            _ => return None,
        };
        Some(Bound { metric, stat, ms })
    }

    /// As the matrix names it: `ttft_p99_ms`.
    pub fn key(&self) -> String {
        let metric = match self.metric {
            Metric::Ttft => "ttft",
            Metric::Tpot => "tpot",
            Metric::Itl => "itl",
            Metric::E2el => "e2el",
        };
        format!("{metric}_{}_ms", self.stat_name())
    }

    fn stat_name(&self) -> &'static str {
        match self.stat {
            Stat::Mean => "mean",
            Stat::Median => "median",
            Stat::P95 => "p95",
            Stat::P99 => "p99",
        }
    }

    /// As a report names it: `P99 TTFT`.
    pub fn label(&self) -> String {
        let metric = match self.metric {
            Metric::Ttft => "TTFT",
            Metric::Tpot => "TPOT",
            Metric::Itl => "ITL",
            Metric::E2el => "E2EL",
        };
        let stat = match self.stat {
            Stat::Mean => "Mean",
            Stat::Median => "Median",
            Stat::P95 => "P95",
            Stat::P99 => "P99",
        };
        format!("{stat} {metric}")
    }

    /// The statistic in a summary, ms.
    pub fn value(&self, s: &Summary) -> f64 {
        let d: &Distribution = match self.metric {
            Metric::Ttft => &s.ttft_ms,
            Metric::Tpot => &s.tpot_ms,
            Metric::Itl => &s.itl_ms,
            Metric::E2el => &s.latency_s,
        };
        let v = match self.stat {
            Stat::Mean => d.mean,
            Stat::Median => d.median,
            Stat::P95 => d.p95,
            Stat::P99 => d.p99,
        };
        if self.metric == Metric::E2el { v * 1000.0 } else { v }
    }
}

/// A profile's search: what it varies, between which bounds, for how many
/// probes, and the SLOs that must hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Search {
    pub over: Over,
    pub lo: f64,
    pub hi: f64,
    /// Probes after the two bounds, at most.
    pub steps: u32,
    pub slo: Vec<Bound>,
    /// The share of the requests (0..=1) that must be within the profile's
    /// goodput SLOs, as vLLM counts goodput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
}

/// Probes after the bounds when a matrix does not say.
pub const DEFAULT_STEPS: u32 = 5;
/// The most probes after the bounds a matrix may ask.
pub const MAX_STEPS: u32 = 20;

/// A job of a search: the point it probes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The search's profile, as the matrix names it.
    pub search: String,
    pub point: f64,
}

/// The load written as a number: `8`, `12.5`, `0.125`.
pub fn number(point: f64) -> String {
    let s = format!("{point:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The load with its unit: `12.5 req/s`, `64 concurrent`.
pub fn show(over: Over, point: f64) -> String {
    format!("{} {}", number(point), over.unit())
}
