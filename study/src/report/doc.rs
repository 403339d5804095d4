//! The report as data: everything any format shows, gathered from the store
//! once (`report::document`). Every renderer reads this and nothing else,
//! so the console text, the Markdown document, the CSV rows, the HTML page
//! and the JSON (this type, serialized) always say the same thing.
//!
//! The JSON form is a versioned schema (`docs/report-json.md`): fields are
//! only ever added within a version; a reader checks `schema`.

use benchfleet_core::Summary;
use benchfleet_core::metrics::Percentile;
use benchfleet_core::telemetry::Energy;
use serde::{Deserialize, Serialize};

/// The schema every JSON report names; a change that removes or retypes a
/// field takes the next number.
pub const SCHEMA: &str = "benchfleet.report/v1";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportDoc {
    /// [`SCHEMA`].
    pub schema: String,
    /// The benchfleet version that wrote it.
    pub generated_by: String,
    pub run: RunInfo,
    pub setup: Setup,
    /// In the order the matrix gives them.
    pub profiles: Vec<ProfileInfo>,
    /// Each engine configuration once, in the order they were planned.
    pub configurations: Vec<Configuration>,
    /// A greedy run's stages, in order; empty for a grid.
    #[serde(default)]
    pub stages: Vec<StageInfo>,
    /// A greedy run's outcome so far.
    #[serde(default)]
    pub greedy: Option<GreedyOutcome>,
    /// Every variant configuration against its engine's baseline, per profile.
    #[serde(default)]
    pub comparisons: Vec<ComparisonRow>,
    pub recommendation: Option<Recommendation>,
    /// Each search profile: the load found per configuration, and every
    /// point probed.
    #[serde(default)]
    pub searches: Vec<SearchInfo>,
    /// A fleet check's verdicts (`strategy: fleet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetInfo>,
    /// Each sweep (or search) of two points or more: throughput per GPU
    /// against tokens per second per user, the Pareto set marked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pareto: Vec<super::pareto::ParetoSweep>,
}

/// A fleet check: every target judged against its cohort, and the hosts
/// left out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetInfo {
    /// `host` or `gpu`.
    pub per: String,
    pub thresholds: crate::fleet::Thresholds,
    pub cohorts: Vec<crate::fleet::CohortResult>,
    pub skipped: Vec<crate::fleet::Skipped>,
}

impl FleetInfo {
    /// The worst verdict of any target: `None` when some target could not
    /// be judged (too few peers, or every repeat failed) and none is worse
    /// than ok.
    pub fn worst(&self) -> Option<crate::fleet::Verdict> {
        let rows = || self.cohorts.iter().flat_map(|c| &c.rows);
        let worst = rows().filter_map(|r| r.verdict).max();
        match worst {
            Some(v) if v > crate::fleet::Verdict::Ok => Some(v),
            _ if rows().any(|r| r.verdict.is_none()) => None,
            w => w,
        }
    }
}

/// A search profile's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchInfo {
    pub profile: String,
    pub primary: bool,
    /// What it varies: rate or max_concurrency.
    pub over: String,
    /// req/s or concurrent.
    pub unit: String,
    pub lo: f64,
    pub hi: f64,
    /// Probes after the two bounds, at most.
    pub steps: u32,
    /// The SLOs in words: `P99 TTFT <= 500 ms`, `goodput >= 95% of requests`.
    pub slo: Vec<String>,
    /// The latency SLOs as data: each one's `key` (`ttft_p99_ms`), `label`
    /// (`P99 TTFT`) and bound `ms`.
    #[serde(default)]
    pub bounds: Vec<SloBound>,
    /// Per configuration that ran it, in the order they were planned.
    pub results: Vec<SearchResult>,
}

/// One configuration's search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    pub config: String,
    /// Whether the search ended (else more probes are to come).
    pub done: bool,
    /// The highest load probed where the SLOs held; `None` when they did
    /// not hold at the lower bound (or nothing is judged yet).
    pub found: Option<f64>,
    /// The lowest load above it where they did not; `None` when they held
    /// at the upper bound.
    pub missed_at: Option<f64>,
    /// The result in words: `9.73 req/s`, `at least 32 req/s (the upper
    /// bound)`, `none`, `searching`.
    pub capacity: String,
    /// Every point probed, in the order they were probed.
    pub probes: Vec<ProbeInfo>,
}

/// One probed point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeInfo {
    pub point: f64,
    /// The profile its jobs (and its block) carry: `chat@r16.5`.
    pub profile: String,
    /// Whether the SLOs held there; `None` while a job there runs.
    pub held: Option<bool>,
    /// The SLOs' statistics there, the worst repeat's.
    pub measured: String,
    /// Why they did not hold.
    pub missed: Option<String>,
    /// Each of `bounds`' statistic there, ms, the worst repeat's; empty
    /// when none succeeded.
    #[serde(default)]
    pub values: Vec<f64>,
}

impl ProbeInfo {
    /// `held`, `missed`, or `running` while its jobs run.
    pub fn verdict(&self) -> &'static str {
        match self.held {
            Some(true) => "held",
            Some(false) => "missed",
            None => "running",
        }
    }
}

/// A latency SLO of a search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloBound {
    pub key: String,
    pub label: String,
    pub ms: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub id: u64,
    pub name: String,
    pub matrix_file: String,
    /// running, finished or cancelled.
    pub state: String,
    pub created_unix_ms: i64,
    pub ended_unix_ms: Option<i64>,
    pub jobs_total: u64,
    pub jobs_succeeded: u64,
    pub jobs_failed: u64,
    /// grid or greedy.
    pub strategy: String,
    /// total_token_throughput, output_throughput or mean_latency.
    pub objective: String,
    pub primary_profile: String,
    pub min_success_rate: f64,
    /// The smallest relative gain that counts as one (a fraction).
    pub min_effect: f64,
    pub repeats: u32,
    /// The repeats a greedy decision near the minimum effect was taken on
    /// (`acceptance.confirm_repeats`), if the matrix asks.
    #[serde(default)]
    pub confirm_repeats: Option<u32>,
}

/// What the numbers were measured with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    pub models: Vec<String>,
    /// The GPU fingerprints of every job (model, memory, driver, ...).
    pub gpus: Vec<String>,
    pub hosts: Vec<String>,
    pub engines: Vec<EngineInfo>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// The matrix's name for it.
    pub name: String,
    /// vllm or sglang.
    pub kind: String,
    /// process, docker or external.
    pub runtime: String,
    pub images: Vec<String>,
    /// The versions its jobs reported (`/version`), and its images' digests.
    #[serde(default)]
    pub versions: Vec<String>,
    #[serde(default)]
    pub image_digests: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileInfo {
    pub name: String,
    pub primary: bool,
    /// E.g. `random: 256 input / 64 output tokens, seed 42`.
    pub dataset: String,
    /// The offered rate, requests per second; `None`: all at once.
    pub rate: Option<f64>,
    /// constant or poisson.
    pub arrival: String,
    pub requests: u64,
    pub max_concurrency: Option<u64>,
    /// completions or chat.
    pub endpoint: String,
    /// The arrivals' seed.
    pub seed: u64,
    /// The profile as the references list it: `dataset_name: ShareGPT`,
    /// `request_rate: 8`, `total_requests: 1000`, ...
    pub parameters: Vec<(String, String)>,
    /// A search profile's search in words: `rate from 1 to 32 req/s, at
    /// most 5 probes after the bounds, holding P99 TTFT <= 500 ms`.
    #[serde(default)]
    pub search: Option<String>,
    /// For a probe of a search: the search profile's name.
    #[serde(default)]
    pub probe_of: Option<String>,
    /// For a point of a sweep: the swept profile's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_of: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Configuration {
    pub name: String,
    pub engine: String,
    pub kind: String,
    pub variants: Vec<String>,
    /// The greedy stage it was planned in (1 for a grid).
    pub stage: u32,
    pub model: String,
    pub image: String,
    pub runtime: String,
    /// The engine's arguments, one a line as the references show them.
    pub args: Vec<String>,
    /// The command line that serves it.
    pub serve_command: String,
    pub blocks: Vec<Block>,
}

impl Configuration {
    pub fn is_baseline(&self) -> bool {
        self.variants.is_empty()
    }

    /// The command to publish, on one line: the engine's arguments only; and the simulator's
    /// flags it leaves out.
    pub fn published_command(&self) -> (String, Vec<String>) {
        let (args, simulator) = benchfleet_core::flags::without_simulator_flags(&self.args);
        (benchfleet_core::engine::one_line(self.engine_kind(), &self.model, &args), simulator)
    }

    /// [`Configuration::published_command`] one argument a line, continued with `\`.
    pub fn published_lines(&self) -> String {
        let (args, _) = benchfleet_core::flags::without_simulator_flags(&self.args);
        benchfleet_core::engine::lines(self.engine_kind(), &self.model, &args)
    }

    fn engine_kind(&self) -> benchfleet_core::engine::EngineKind {
        benchfleet_core::engine::EngineKind::from_name(&self.kind).unwrap_or(benchfleet_core::engine::EngineKind::Vllm)
    }

    pub fn block(&self, profile: &str) -> Option<&Block> {
        self.blocks.iter().find(|b| b.profile == profile)
    }
}

/// One configuration on one profile: its repeats and their pooled
/// "Serving Benchmark Result" block.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    pub profile: String,
    /// The successful repeats pooled (percentiles of the union of their
    /// samples); `None` when none succeeded or they cannot be pooled.
    pub pooled: Option<Summary>,
    /// Why the successful repeats could not be pooled (each is then shown
    /// alone).
    pub not_pooled: Option<String>,
    /// Each headline number's 95% interval over the repeats; with one
    /// successful repeat, the interval its own requests give (none for a
    /// figure they give none for); empty with none, or one too short.
    pub intervals: Vec<Interval>,
    /// Percentiles 1 to 99.9 of the pooled TTFT and ITL, ms (for charts);
    /// empty when the samples are not stored.
    #[serde(default)]
    pub ttft_ms: Vec<Percentile>,
    #[serde(default)]
    pub itl_ms: Vec<Percentile>,
    /// The first successful repeat's telemetry over time, for charts: the
    /// engine's running and waiting requests and KV cache use, and each
    /// GPU's SM clock (`TELEMETRY_CHARTED`); empty when none was taken.
    #[serde(default)]
    pub telemetry: Vec<benchfleet_core::telemetry::Series>,
    /// The GPUs' energy over the successful repeats' load runs (joules,
    /// durations and output tokens summed over them); `None` unless every
    /// successful repeat's GPUs gave their energy counters.
    #[serde(default)]
    pub energy: Option<Energy>,
    /// What the successful repeats' GPU time cost, at the matrix's price
    /// (`cost:`); `None` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<benchfleet_core::cost::Cost>,
    /// The engine's prefix cache over the successful repeats: prompt tokens
    /// found cached over those looked up (its counters' increase over each
    /// job, summed), 0 to 1; `None` unless every one of them has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_hit_rate: Option<f64>,
    pub repeats: Vec<Repeat>,
}

impl Block {
    /// The sections besides the reference block's that the report knows.
    pub fn sections(&self) -> benchfleet_core::Sections<'_> {
        benchfleet_core::Sections {
            energy: self.energy.as_ref(),
            cost: self.cost.as_ref(),
            prefix_cache_hit_rate: self.prefix_cache_hit_rate,
        }
    }
}

/// The telemetry series a block keeps for its charts.
pub const TELEMETRY_CHARTED: [&str; 7] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "gpu_sm_clock_mhz",
];

impl Block {
    /// The successful repeats' own summaries.
    pub fn summaries(&self) -> impl Iterator<Item = &Summary> {
        self.repeats.iter().filter(|r| r.state == "succeeded").filter_map(|r| r.summary.as_ref())
    }

    pub fn succeeded(&self) -> usize {
        self.summaries().count()
    }
}

/// A headline number's mean over the repeats with its 95% interval
/// (Student's t, n - 1 degrees of freedom).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// As the block names it: `Total token throughput (tok/s)`.
    pub metric: String,
    pub mean: f64,
    pub half_width: Option<f64>,
}

/// One job: a repeat of a configuration on a profile, with where and how it
/// was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    pub job: u64,
    pub repeat: u32,
    /// The job's state: succeeded, failed, cancelled, ...
    pub state: String,
    pub summary: Option<Summary>,
    pub error: Option<String>,
    /// The engine's last log lines, for a failure.
    pub log_tail: Option<String>,
    pub provenance: Provenance,
}

impl Repeat {
    /// Its GPUs' energy over its load run, against its own output tokens;
    /// `None` when it did not succeed or its energy is not known.
    pub fn energy(&self) -> Option<Energy> {
        let tokens = self.summary.as_ref().filter(|_| self.state == "succeeded")?.total_output_tokens;
        self.provenance.telemetry.as_ref()?.energy(tokens)
    }
}

/// Where a repeat's numbers came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The agent that ran its last attempt.
    pub host: Option<String>,
    pub attempt: u32,
    pub started_unix_ms: Option<i64>,
    pub ended_unix_ms: Option<i64>,
    /// The GPUs' fingerprints.
    pub gpus: Vec<String>,
    /// Engine start to serving, s.
    pub engine_startup_s: Option<f64>,
    /// How the engine's prefix cache was emptied before the job, or why it
    /// was warm.
    pub prefix_cache: Option<String>,
    pub dataset: String,
    /// The rate and the arrivals: `8 req/s, poisson, seed 0`.
    pub load: String,
    /// Why the numbers cannot be trusted, when they cannot.
    pub invalid: Option<String>,
    /// The server's token counts against the tokenizer's, when they differ.
    pub token_counts: Option<String>,
    /// The engine's own version (`/version`, SGLang's server info).
    #[serde(default)]
    pub engine_version: Option<String>,
    /// The container image's digest, for a Docker engine.
    #[serde(default)]
    pub image_digest: Option<String>,
    #[serde(default)]
    pub loadgen_version: Option<String>,
    /// The standalone `benchfleet-loadgen` command that sends this load
    /// again, against the engine at `$ENGINE_URL`.
    #[serde(default)]
    pub reproduce: Option<String>,
    /// GPUs whose clocks were held down during the job, each in words:
    /// `SM clock 1,410 of 1,980 MHz for 38% of the job: power cap`.
    #[serde(default)]
    pub throttled: Vec<String>,
    /// The most memory one of its GPUs held.
    #[serde(default)]
    pub peak_gpu_memory_bytes: Option<u64>,
    /// The engine's `/metrics` and the GPUs over the job, summarized
    /// (`docs/metrics.md`, "During a job").
    #[serde(default)]
    pub telemetry: Option<benchfleet_core::telemetry::TelemetrySummary>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageInfo {
    pub number: u32,
    pub title: String,
    pub decisions: Vec<Decision>,
    /// The configurations this stage measured, in order.
    pub configurations: Vec<String>,
    /// The stage in a sentence: `vllm Total TPS = 9632.01, sglang Total TPS
    /// = 4995.66, vllm higher by 4,636.35 tok/s (92.8%)`.
    pub summary: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub config: String,
    pub verdict: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GreedyOutcome {
    /// The stage still running, when the run is not over.
    pub running_stage: Option<u32>,
    pub chosen: Option<String>,
    pub reason: String,
    /// Each variant was tried on top of the configuration kept so far (the
    /// matrix's `cumulative`), not alone on the baseline.
    #[serde(default)]
    pub cumulative: bool,
}

/// What a comparison with the baseline concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Better,
    Worse,
    WithinNoise,
    /// The variant's own run is INVALID.
    Invalid,
    /// The baseline's run is INVALID: not compared.
    BaselineInvalid,
    /// The variant's success rate is below the acceptance.
    BelowAcceptance,
    /// One side has no successful repeat.
    NoResult,
}

impl Verdict {
    /// Whether the configuration can be adopted on this evidence.
    pub fn adopted(self) -> bool {
        self == Verdict::Better
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComparisonRow {
    pub profile: String,
    pub config: String,
    pub baseline: String,
    /// The objective as the references name it: `Total TPS`, `Output TPS`,
    /// `Mean latency (s)`.
    pub metric: String,
    pub value: Option<f64>,
    pub baseline_value: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub baseline_tpot_ms: Option<f64>,
    pub verdict: Verdict,
    /// The conclusion in words: `+3.23%, better`, `1.26x faster (2.09 s vs
    /// 1.65 s), better`, `success rate 51.6%, not adopted`.
    pub said: String,
    /// Variant minus baseline, with Welch's 95% half-width when both have
    /// two repeats or more.
    pub difference: Option<f64>,
    pub half_width: Option<f64>,
    /// The difference and `said` compare the runs' steady states (closed loops that each reached
    /// one, docs/metrics.md), not the whole runs that `value` and `baseline_value` give.
    #[serde(default)]
    pub steady_state: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    pub config: String,
    /// The command that serves it, on one line, without the simulator's flags.
    pub serve_command: String,
    /// The simulator's `--sim-*` flags (with their values) its configuration ran with, which
    /// `serve_command` leaves out: a real engine would refuse them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulator_flags: Vec<String>,
    /// The primary profile it was chosen on.
    pub profile: String,
    /// Why: `the best total token throughput 9942.93 tok/s on profile p`.
    pub why: String,
    /// The engine's baseline configuration, when the recommendation is a
    /// variant of it.
    pub baseline: Option<String>,
    /// Before and after, per profile.
    pub table: Vec<BeforeAfter>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BeforeAfter {
    pub profile: String,
    /// `Total TPS: 9632.01, Mean TPOT(ms): 25.89` or `Mean latency: 2.09s/req`.
    pub baseline: Option<String>,
    /// The same with the change: `Total TPS: 10570.88 (+9.75%), Mean TPOT(ms): 24.71`.
    pub optimized: Option<String>,
}
