//! A matrix file's raw shape, as serde reads the YAML: every section with
//! its fields as written (unknown ones refused), before any is checked.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatrix {
    pub(super) name: String,
    pub(super) model: String,
    #[serde(default)]
    pub(super) objective: Option<String>,
    #[serde(default)]
    pub(super) hardware: Option<RawHardware>,
    #[serde(default)]
    pub(super) acceptance: Option<RawAcceptance>,
    /// 1 when not given (3 for a fleet check).
    #[serde(default)]
    pub(super) repeats: Option<i64>,
    pub(super) engines: BTreeMap<String, RawEngine>,
    #[serde(default)]
    pub(super) variants: BTreeMap<String, RawVariant>,
    pub(super) profiles: BTreeMap<String, RawProfile>,
    #[serde(default)]
    pub(super) primary_profile: Option<String>,
    #[serde(default)]
    pub(super) strategy: Option<String>,
    /// The greedy strategy tries each variant on top of the configuration
    /// kept so far, in file order, instead of each alone on the baseline.
    #[serde(default)]
    pub(super) cumulative: bool,
    /// A fleet check's thresholds and what it runs a job on.
    #[serde(default)]
    pub(super) fleet: Option<RawFleet>,
    /// Run a job with a warm prefix cache when the engine's cannot be
    /// emptied, instead of failing it.
    #[serde(default)]
    pub(super) allow_warm_cache: bool,
    /// The model's tokenizer.json, relative to the matrix.
    #[serde(default)]
    pub(super) processor: Option<String>,
    /// A price per GPU-hour: every block then says what its tokens cost.
    #[serde(default)]
    pub(super) cost: Option<RawCost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCost {
    pub(super) gpu_hour: f64,
    #[serde(default)]
    pub(super) currency: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    #[serde(default)]
    pub(super) per: Option<String>,
    #[serde(default)]
    pub(super) warn_pct: Option<f64>,
    #[serde(default)]
    pub(super) fail_pct: Option<f64>,
    #[serde(default)]
    pub(super) z: Option<f64>,
    #[serde(default)]
    pub(super) drift_pct: Option<f64>,
    #[serde(default)]
    pub(super) hosts: Option<String>,
}

pub(super) fn one() -> i64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHardware {
    pub(super) gpu: String,
    #[serde(default = "one")]
    pub(super) gpus_per_job: i64,
    /// Run on GPUs outside the H100 and H200 families.
    #[serde(default)]
    pub(super) allow_other_gpus: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAcceptance {
    #[serde(default = "all")]
    pub(super) min_success_rate: f64,
    /// A fraction (0.01) or a percentage ("1%").
    #[serde(default)]
    pub(super) min_effect: Option<serde_yaml_ng::Value>,
    /// The repeats a greedy decision near the minimum effect is taken on.
    #[serde(default)]
    pub(super) confirm_repeats: Option<i64>,
}

pub(super) fn all() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEngine {
    #[serde(default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) image: Option<String>,
    #[serde(default)]
    pub(super) args: Vec<String>,
    #[serde(default)]
    pub(super) runtime: Option<String>,
    #[serde(default)]
    pub(super) url: Option<String>,
    /// The profiles its configurations run (by name; a sweep's name is
    /// all its points); absent: every profile.
    #[serde(default)]
    pub(super) profiles: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVariant {
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default)]
    pub(super) args: Vec<String>,
    /// The engines it applies to (by name); absent: every engine.
    #[serde(default)]
    pub(super) engines: Option<Vec<String>>,
    /// Variants of one group are alternatives: at most one applies at once.
    #[serde(default)]
    pub(super) group: Option<String>,
    /// The profiles a configuration with this variant runs; absent: every
    /// profile.
    #[serde(default)]
    pub(super) profiles: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub(super) dataset: RawDataset,
    /// One rate, or a sweep: a list, one profile per rate.
    #[serde(default)]
    pub(super) rate: Option<OneOrMany<RawRate>>,
    #[serde(default)]
    pub(super) arrival: Option<String>,
    pub(super) requests: i64,
    /// One cap, or a sweep: a list, one profile per cap.
    #[serde(default)]
    pub(super) max_concurrency: Option<OneOrMany<i64>>,
    #[serde(default)]
    pub(super) endpoint: Option<String>,
    #[serde(default)]
    pub(super) seed: Option<u64>,
    /// The P99 dispatch lag limit, ms (default: the load kind's).
    #[serde(default)]
    pub(super) lag_limit_ms: Option<f64>,
    /// A fraction (0.05) or a percentage ("5%").
    #[serde(default)]
    pub(super) rate_tolerance: Option<serde_yaml_ng::Value>,
    /// `synchronous` (one request at a time) or `throughput` (all at
    /// once), instead of a rate and a concurrency.
    #[serde(default)]
    pub(super) mode: Option<String>,
    #[serde(default)]
    pub(super) warmup: Option<RawWindow>,
    #[serde(default)]
    pub(super) cooldown: Option<RawWindow>,
    /// Seconds (a number, `300s` or `5m`).
    #[serde(default)]
    pub(super) max_duration: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    pub(super) ignore_eos: bool,
    /// Fields merged into every request body.
    #[serde(default)]
    pub(super) extra_body: Option<serde_yaml_ng::Value>,
    /// The variants a configuration must have to run this profile.
    #[serde(default)]
    pub(super) only_with: Option<Vec<String>>,
    /// vLLM's goodput SLOs, ms.
    #[serde(default)]
    pub(super) goodput: Option<RawGoodput>,
    /// Find the load instead of giving it: the highest rate or concurrency
    /// at which the SLOs hold.
    #[serde(default)]
    pub(super) search: Option<RawSearch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSearch {
    /// `[lo, hi]` requests per second.
    #[serde(default)]
    pub(super) rate: Option<Vec<f64>>,
    /// `[lo, hi]` requests in flight.
    #[serde(default)]
    pub(super) max_concurrency: Option<Vec<i64>>,
    /// Probes after the two bounds, at most.
    #[serde(default)]
    pub(super) steps: Option<i64>,
    /// `ttft_p99_ms: 200`, ...; `goodput: 95%`.
    #[serde(default)]
    pub(super) slo: Option<serde_yaml_ng::Mapping>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGoodput {
    #[serde(default)]
    pub(super) ttft_ms: Option<f64>,
    #[serde(default)]
    pub(super) tpot_ms: Option<f64>,
    #[serde(default)]
    pub(super) e2el_ms: Option<f64>,
}

/// A value, or a list of them: a sweep.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub(super) fn list(&self) -> Vec<&T> {
        match self {
            OneOrMany::One(v) => vec![v],
            OneOrMany::Many(vs) => vs.iter().collect(),
        }
    }

    pub(super) fn is_sweep(&self) -> bool {
        matches!(self, OneOrMany::Many(_))
    }
}

/// A rate is a number of requests per second, or `inf` for all at once.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub(super) enum RawRate {
    Number(f64),
    Word(String),
}

/// Exactly one of the fields is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDataset {
    #[serde(default)]
    pub(super) random: Option<RawRandom>,
    #[serde(default)]
    pub(super) sharegpt: Option<String>,
    #[serde(default)]
    pub(super) shared_prefix: Option<RawSharedPrefix>,
    #[serde(default)]
    pub(super) trace: Option<RawTrace>,
    #[serde(default)]
    pub(super) multi_turn: Option<RawMultiTurn>,
    /// A ShareGPT file's conversations sent as multi-turn sessions.
    #[serde(default)]
    pub(super) sessions: Option<RawSessions>,
    /// Overrides the ShareGPT replies' lengths as output lengths.
    #[serde(default)]
    pub(super) output_tokens: Option<i64>,
}

/// A request trace to replay: its file (relative to the matrix), its form
/// (`mooncake`, the default, or `jsonl`) and its speed (1.0: as recorded).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrace {
    pub(super) path: String,
    #[serde(default)]
    pub(super) format: Option<String>,
    #[serde(default)]
    pub(super) speed: Option<f64>,
}

/// The think time of a ShareGPT file's sessions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    #[serde(default)]
    pub(super) think_time_ms: Option<i64>,
}

/// Multi-turn sessions: user turns per session, each turn's user and
/// output tokens, the think time between a reply and the next turn.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMultiTurn {
    pub(super) turns: i64,
    pub(super) user_tokens: i64,
    pub(super) output_tokens: i64,
    #[serde(default)]
    pub(super) think_time_ms: Option<i64>,
    #[serde(default)]
    pub(super) seed: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSharedPrefix {
    pub(super) groups: i64,
    pub(super) prefix_tokens: i64,
    pub(super) suffix_tokens: i64,
    pub(super) output_tokens: i64,
    #[serde(default)]
    pub(super) seed: u64,
}

/// Requests (a number) or seconds (`30s`, `2m`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawWindow {
    Requests(i64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRandom {
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    #[serde(default)]
    pub(super) seed: u64,
}
