//! What an agent samples while a job runs: the engine's `/metrics` and its
//! GPUs' readings. A `Recorder` takes the readings as they come (with their
//! time, so it reads no clock) and keeps, per series, its min/mean/max over
//! every reading and the series itself at most `MAX_POINTS` points long (a
//! long job's points are merged pairwise, each kept point the mean of the
//! readings it stands for), plus, per GPU, how long each throttle reason was
//! set and how long its SM clock was held down. `TelemetrySummary` words a
//! GPU that throttled as a report shows it.
//!
//! Energy: each GPU's NVML energy counter (millijoules since the driver
//! loaded) is read at the start and at the end of the job's load run
//! (`Recorder::energy`); the job's joules are the counters' increase summed
//! over the group's GPUs, known only when every GPU gave both readings.
//! `Energy` turns joules, the run's duration and its output tokens into
//! the figures a report shows.
//!
//! `read_metrics` reads the engines' Prometheus text with
//! `prom_text_format_parser`; the agent and the simulator's tests share it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::gpu::THROTTLE_REASONS;

/// The most points a series keeps; a longer job's are merged pairwise.
pub const MAX_POINTS: usize = 600;

/// The engine's series a job keeps, by engine kind: its load, its KV cache
/// and prefix cache, preemptions and tokens, with the engine's own names.
pub const VLLM_SERIES: &[&str] = &[
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
];

/// SGLang's (it serves them only with `--enable-metrics`).
pub const SGLANG_SERIES: &[&str] = &[
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:num_retracted_requests_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
];

/// The gauges that are a share, not a count: over data-parallel replicas, their mean.
const SHARES: &[&str] = &["vllm:kv_cache_usage_perc", "sglang:token_usage", "sglang:cache_hit_rate"];

/// The series an engine of this kind ("vllm" or "sglang") is scraped for.
pub fn engine_series(kind: &str) -> &'static [&'static str] {
    if kind == "sglang" { SGLANG_SERIES } else { VLLM_SERIES }
}

/// The GPU series, one per GPU: (name, what each reading is).
pub const GPU_SERIES: &[&str] = &[
    "gpu_sm_clock_mhz",
    "gpu_memory_clock_mhz",
    "gpu_power_w",
    "gpu_temperature_c",
    "gpu_utilization_pct",
    "gpu_memory_utilization_pct",
    "gpu_memory_used_mib",
];

/// A GPU's utilization from which it counts as busy, percent.
pub const BUSY_UTILIZATION_PCT: u32 = 50;
/// A busy GPU whose SM clock is under this share of its maximum is held down.
pub const LOW_CLOCK_SHARE: f64 = 0.9;
/// The share of a job a GPU must be held down for to be flagged.
pub const FLAG_SHARE: f64 = 0.01;

/// The throttle reasons that hold a busy GPU's clocks down (power and heat),
/// and how a flag words each.
const SLOWDOWNS: &[(&str, &str)] = &[
    ("sw_power_cap", "power cap"),
    ("hw_power_brake_slowdown", "HW power brake"),
    ("sw_thermal_slowdown", "thermal slowdown"),
    ("hw_thermal_slowdown", "HW thermal slowdown"),
    ("hw_slowdown", "HW slowdown"),
];

/// One reading of one GPU; `None` where the GPU does not say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub uuid: String,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub temperature_c: Option<u32>,
    /// The share of the last sample period a kernel ran, percent.
    pub utilization_pct: Option<u32>,
    /// The share of it the memory was read or written, percent.
    pub memory_utilization_pct: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    /// NVML's clocks-throttle reason bits (`gpu::THROTTLE_REASONS`).
    pub throttle_reasons: Option<u64>,
    /// The PCIe link now (it trains down when idle) and the most the GPU
    /// and its slot can do.
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_max: Option<u32>,
}

/// One series as kept: (milliseconds since the job's telemetry began, value).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The engine's metric name, or one of `GPU_SERIES`.
    pub name: String,
    /// The GPU's UUID for a GPU series; empty for the engine's.
    #[serde(default)]
    pub gpu: String,
    pub points: Vec<(u32, f64)>,
}

/// A series' numbers over every reading (not only the points kept).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesStats {
    pub name: String,
    #[serde(default)]
    pub gpu: String,
    pub count: u64,
    pub min: f64,
    pub mean: f64,
    pub max: f64,
    /// The first and last readings: a counter's increase over the job.
    pub first: f64,
    pub last: f64,
}

/// One GPU over the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    pub gpu: String,
    /// Readings taken of it.
    pub samples: u64,
    /// The largest maxima and limit it reported.
    pub sm_clock_max_mhz: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    pub power_limit_w: Option<f64>,
    /// How long each throttle reason (but `gpu_idle`) was set, ms: each
    /// reading stands for the time since the one before.
    #[serde(default)]
    pub throttled_ms: BTreeMap<String, u64>,
    /// How long its clocks were held down: a power or heat reason set, or
    /// busy with the SM clock under `LOW_CLOCK_SHARE` of its maximum, ms.
    pub held_down_ms: u64,
    /// The median SM clock while held down.
    pub held_down_sm_clock_mhz: Option<u32>,
    /// The reasons set while held down, the longest first (keys).
    #[serde(default)]
    pub held_down_reasons: Vec<String>,
    /// Its energy counter as the load run started, millijoules since the
    /// driver loaded; `None` where it gave none.
    #[serde(default)]
    pub energy_mj_start: Option<u64>,
    /// Its energy counter as the load run ended.
    #[serde(default)]
    pub energy_mj_end: Option<u64>,
    /// The lowest PCIe link it was read at while busy (a link that trains
    /// down under load is degraded: a riser, a slot, a retimer).
    #[serde(default)]
    pub pcie_gen_loaded: Option<u32>,
    #[serde(default)]
    pub pcie_width_loaded: Option<u32>,
    /// The most its link can do, as it reported.
    #[serde(default)]
    pub pcie_gen_max: Option<u32>,
    #[serde(default)]
    pub pcie_width_max: Option<u32>,
}

/// A job's telemetry, summarized: small, kept with the job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySummary {
    /// From the first reading's start to the end of the job, ms.
    pub duration_ms: u64,
    /// `/metrics` scrapes tried, and those that failed (with the last reason).
    pub engine_scrapes: u64,
    pub engine_scrape_failures: u64,
    #[serde(default)]
    pub engine_scrape_error: Option<String>,
    /// GPU readings tried (each of every GPU of the group), and those that failed.
    pub gpu_samples: u64,
    pub gpu_sample_failures: u64,
    #[serde(default)]
    pub gpu_sample_error: Option<String>,
    pub series: Vec<SeriesStats>,
    pub gpus: Vec<GpuTelemetry>,
    /// The most memory any one of the group's GPUs held at a reading.
    #[serde(default)]
    pub peak_gpu_memory_bytes: Option<u64>,
    /// The energy the group's GPUs used over the load run, J (summed over
    /// them); `None` unless every GPU gave its counter at both ends.
    #[serde(default)]
    pub energy_j: Option<f64>,
    /// The time between the two counter readings `energy_j` covers, ms.
    #[serde(default)]
    pub energy_duration_ms: Option<u64>,
    /// What changed on the GPUs over the attempt without invalidating it
    /// (rows remapped for correctable errors, a remap pending), from the
    /// agent's readings before and after.
    #[serde(default)]
    pub hardware_notes: Vec<String>,
}

/// A job's telemetry: its summary and its series.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    pub summary: TelemetrySummary,
    pub series: Vec<Series>,
}

impl GpuTelemetry {
    /// The energy it used between its two counter readings, mJ; `None`
    /// without both, or when the counter went back (the driver reloaded).
    pub fn energy_mj(&self) -> Option<u64> {
        self.energy_mj_end?.checked_sub(self.energy_mj_start?)
    }

    /// "PCIe gen4 x8 under load, its maximum gen5 x16", when the link it
    /// was read at while busy is below what it can do.
    pub fn pcie_flag(&self) -> Option<String> {
        let (g, w) = (self.pcie_gen_loaded?, self.pcie_width_loaded?);
        let (gm, wm) = (self.pcie_gen_max?, self.pcie_width_max?);
        (g < gm || w < wm).then(|| format!("PCIe gen{g} x{w} under load, its maximum gen{gm} x{wm}"))
    }

    /// Why the GPU's results may be low, when its clocks were held down for
    /// at least `FLAG_SHARE` of a job of `duration_ms`, e.g. "SM clock 1,410
    /// of 1,980 MHz for 38% of the job: power cap".
    pub fn throttle_flag(&self, duration_ms: u64) -> Option<String> {
        if self.held_down_ms == 0 || duration_ms == 0 {
            return None;
        }
        let share = (self.held_down_ms as f64 / duration_ms as f64).min(1.0);
        if share < FLAG_SHARE {
            return None;
        }
        let clock = match (self.held_down_sm_clock_mhz, self.sm_clock_max_mhz) {
            (Some(at), Some(max)) => format!("SM clock {} of {} MHz", thousands(at), thousands(max)),
            (Some(at), None) => format!("SM clock {} MHz", thousands(at)),
            (None, _) => "clocks held down".to_owned(),
        };
        let causes: Vec<&str> = self
            .held_down_reasons
            .iter()
            .map(|key| {
                SLOWDOWNS.iter().find(|(k, _)| k == key).map(|(_, words)| *words).unwrap_or_else(|| {
                    THROTTLE_REASONS.iter().find(|(_, k, _)| k == key).map_or(key.as_str(), |(_, _, words)| words)
                })
            })
            .collect();
        let cause = if causes.is_empty() { "no throttle reason reported".to_owned() } else { causes.join(" and ") };
        let percent = (share * 100.0).round().max(1.0);
        Some(format!("{clock} for {percent}% of the job: {cause}"))
    }
}

impl TelemetrySummary {
    /// Each GPU that throttled, worded (`GpuTelemetry::throttle_flag`); with
    /// more than one GPU, each flag starts with its GPU's UUID.
    pub fn throttle_flags(&self) -> Vec<String> {
        self.per_gpu(|g| g.throttle_flag(self.duration_ms))
    }

    /// Each GPU's `flag`, led by its UUID when there are several.
    fn per_gpu(&self, flag: impl Fn(&GpuTelemetry) -> Option<String>) -> Vec<String> {
        let several = self.gpus.len() > 1;
        self.gpus
            .iter()
            .filter_map(|g| {
                let flag = flag(g)?;
                Some(if several { format!("{}: {flag}", g.gpu) } else { flag })
            })
            .collect()
    }

    /// Each GPU whose PCIe link was below its maximum under load, worded
    /// (`GpuTelemetry::pcie_flag`), as `throttle_flags`.
    pub fn pcie_flags(&self) -> Vec<String> {
        self.per_gpu(GpuTelemetry::pcie_flag)
    }

    /// A series' numbers, by name (and GPU; "" for the engine's).
    pub fn stats(&self, name: &str, gpu: &str) -> Option<&SeriesStats> {
        self.series.iter().find(|s| s.name == name && s.gpu == gpu)
    }

    /// The engine's prefix cache over the job: (prompt tokens found in the
    /// cache, prompt tokens looked up), from its counters' first and last
    /// readings (taken before the first request and after the last): vLLM's
    /// `prefix_cache_hits`/`prefix_cache_queries`, SGLang's cached and
    /// prompt tokens. `None` when the engine keeps no such counters or
    /// looked nothing up.
    pub fn prefix_cache(&self) -> Option<(f64, f64)> {
        let delta = |name: &str| self.stats(name, "").filter(|s| s.count > 0).map(|s| (s.last - s.first).max(0.0));
        let (hits, queries) = match (delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")) {
            (Some(h), Some(q)) => (h, q),
            _ => (delta("sglang:cached_tokens_total")?, delta("sglang:prompt_tokens_total")?),
        };
        (queries > 0.0).then_some((hits.min(queries), queries))
    }

    /// The job's energy figures, given the output tokens its load run
    /// generated; `None` when its joules are not known.
    pub fn energy(&self, output_tokens: u64) -> Option<Energy> {
        let duration_ms = self.energy_duration_ms?;
        Energy::of(self.energy_j?, duration_ms as f64 / 1000.0, output_tokens)
    }
}

/// What a job (or a block of them) cost in GPU energy: the figures a report
/// shows, from joules, the time they were used over and the output tokens
/// generated meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Energy {
    /// GPU board energy over the load run, summed over the group's GPUs, J.
    pub joules: f64,
    /// The joules over the load run's duration, W.
    pub mean_power_w: f64,
    /// Millijoules per output token.
    pub mj_per_output_token: f64,
    /// Output tokens per joule.
    pub output_tokens_per_joule: f64,
}

impl Energy {
    /// The figures of `joules` used over `duration_s` while `output_tokens`
    /// were generated; `None` when any of the three is zero (or the joules
    /// or the duration are not a finite positive number): nothing is
    /// divided by zero, and no figure is guessed.
    pub fn of(joules: f64, duration_s: f64, output_tokens: u64) -> Option<Energy> {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(joules) || !positive(duration_s) || output_tokens == 0 {
            return None;
        }
        let tokens = output_tokens as f64;
        Some(Energy {
            joules,
            mean_power_w: joules / duration_s,
            mj_per_output_token: joules * 1000.0 / tokens,
            output_tokens_per_joule: tokens / joules,
        })
    }
}

/// `1410` as "1,410".
pub fn thousands(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Why a `/metrics` text gave nothing.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MetricsError {
    #[error("not Prometheus text: {0}")]
    Parse(String),
    #[error("none of the engine's series ({0} and others) is in it")]
    NoSeries(String),
}

/// The values of `names` in a Prometheus text: a counter's summed over its
/// label sets (vLLM's request count per finish reason, and per data-parallel
/// engine). A gauge is read per data-parallel replica (vLLM's `engine` label,
/// SGLang's `dp_rank`), its largest of the replica's label sets (SGLang's ranks
/// of one replica report alike), and the replicas' summed: their requests
/// running and waiting are the server's; a share (KV cache usage, prefix
/// cache hit rate) is their mean. Names absent from the text are left out.
pub fn read_metrics(text: &str, names: &[&str]) -> Result<Vec<(String, f64)>, MetricsError> {
    use prom_text_format_parser::ScrapeParseError;
    let scrape = prom_text_format_parser::Scrape::parse(text).map_err(|e| {
        MetricsError::Parse(match e {
            ScrapeParseError::Parse(text) => text.lines().next().unwrap_or_default().to_owned(),
            ScrapeParseError::Collect(errors) => {
                errors.first().map_or_else(String::new, |m| format!("line {}: {}", m.line_no.start + 1, m.error))
            }
        })
    })?;
    let mut out: Vec<(String, f64)> = Vec::new();
    for name in names {
        let Some(metric) = scrape.metrics.iter().find(|m| m.name == *name) else { continue };
        let values: Vec<(Option<&str>, f64)> = metric
            .samples
            .iter()
            .filter_map(|s| {
                let replica = s.labels.iter().find(|l| l.key == "engine" || l.key == "dp_rank").map(|l| &*l.value);
                Some((replica, s.value.value.parse::<f64>().ok()?))
            })
            .collect();
        if values.is_empty() {
            continue;
        }
        let value = match metric.kind {
            prom_text_format_parser::Type::Counter => values.iter().map(|(_, v)| v).sum(),
            _ => {
                let mut replicas: BTreeMap<Option<&str>, f64> = BTreeMap::new();
                for (replica, v) in values {
                    let largest = replicas.entry(replica).or_insert(f64::NEG_INFINITY);
                    *largest = largest.max(v);
                }
                let sum: f64 = replicas.values().sum();
                if SHARES.contains(name) { sum / replicas.len() as f64 } else { sum }
            }
        };
        out.push(((*name).to_owned(), value));
    }
    if out.is_empty() && !names.is_empty() {
        return Err(MetricsError::NoSeries(names[0].to_owned()));
    }
    Ok(out)
}

/// A series being recorded: its running numbers over every reading, and its
/// points, merged pairwise whenever they reach `MAX_POINTS`.
#[derive(Clone, Debug, Default)]
struct SeriesBuilder {
    points: Vec<(u32, f64)>,
    /// Readings each kept point stands for (a power of two).
    per_point: u32,
    /// The point being filled: its time, the sum of its readings and their count.
    pending: Option<(u32, f64, u32)>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    first: f64,
    last: f64,
}

impl SeriesBuilder {
    fn push(&mut self, t_ms: u32, value: f64) {
        if !value.is_finite() {
            return;
        }
        if self.count == 0 {
            (self.min, self.max, self.first, self.per_point) = (value, value, value, 1);
        }
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.last = value;
        let (t, sum, n) = self.pending.take().unwrap_or((t_ms, 0.0, 0));
        let (sum, n) = (sum + value, n + 1);
        if n < self.per_point {
            self.pending = Some((t, sum, n));
            return;
        }
        self.points.push((t, sum / f64::from(n)));
        if self.points.len() >= MAX_POINTS {
            self.points =
                self.points.chunks(2).map(|p| (p[0].0, p.iter().map(|x| x.1).sum::<f64>() / p.len() as f64)).collect();
            self.per_point *= 2;
        }
    }

    fn finish(mut self, name: String, gpu: String) -> (SeriesStats, Series) {
        if let Some((t, sum, n)) = self.pending.take() {
            self.points.push((t, sum / f64::from(n)));
        }
        let mean = if self.count == 0 { 0.0 } else { self.sum / self.count as f64 };
        let stats = SeriesStats {
            name: name.clone(),
            gpu: gpu.clone(),
            count: self.count,
            min: self.min,
            mean,
            max: self.max,
            first: self.first,
            last: self.last,
        };
        (stats, Series { name, gpu, points: self.points })
    }
}

/// What is known of one GPU so far.
#[derive(Clone, Debug, Default)]
struct GpuState {
    summary: GpuTelemetry,
    last_t: Option<u32>,
    held_down_clocks: Vec<u32>,
    held_down_by: BTreeMap<String, u64>,
}

/// Takes a job's readings as they come; `finish` gives its telemetry.
#[derive(Clone, Debug)]
pub struct Recorder {
    /// The nominal time between two GPU readings: what the first stands for.
    gpu_interval_ms: u32,
    engine: BTreeMap<String, SeriesBuilder>,
    gpu_series: BTreeMap<(String, &'static str), SeriesBuilder>,
    gpus: BTreeMap<String, GpuState>,
    summary: TelemetrySummary,
}

impl Recorder {
    pub fn new(gpu_interval_ms: u32) -> Recorder {
        Recorder {
            gpu_interval_ms,
            engine: BTreeMap::new(),
            gpu_series: BTreeMap::new(),
            gpus: BTreeMap::new(),
            summary: TelemetrySummary::default(),
        }
    }

    /// One scrape of the engine's `/metrics` at `t_ms`: its values, or why it failed.
    pub fn engine_scrape(&mut self, t_ms: u32, result: Result<Vec<(String, f64)>, String>) {
        self.summary.engine_scrapes += 1;
        match result {
            Ok(values) => {
                for (name, value) in values {
                    self.engine.entry(name).or_default().push(t_ms, value);
                }
            }
            Err(why) => {
                self.summary.engine_scrape_failures += 1;
                self.summary.engine_scrape_error = Some(why);
            }
        }
    }

    /// One reading of the group's GPUs at `t_ms`, or why it failed; a failed
    /// reading counts once for each of `gpus`.
    pub fn gpu_sample(&mut self, t_ms: u32, gpus: usize, result: Result<Vec<GpuSample>, String>) {
        let samples = match result {
            Ok(samples) => samples,
            Err(why) => {
                let n = gpus.max(1) as u64;
                self.summary.gpu_samples += n;
                self.summary.gpu_sample_failures += n;
                self.summary.gpu_sample_error = Some(why);
                return;
            }
        };
        for s in samples {
            self.summary.gpu_samples += 1;
            self.one_gpu(t_ms, s);
        }
    }

    fn one_gpu(&mut self, t_ms: u32, s: GpuSample) {
        let values: [(&'static str, Option<f64>); 7] = [
            ("gpu_sm_clock_mhz", s.sm_clock_mhz.map(f64::from)),
            ("gpu_memory_clock_mhz", s.memory_clock_mhz.map(f64::from)),
            ("gpu_power_w", s.power_w),
            ("gpu_temperature_c", s.temperature_c.map(f64::from)),
            ("gpu_utilization_pct", s.utilization_pct.map(f64::from)),
            ("gpu_memory_utilization_pct", s.memory_utilization_pct.map(f64::from)),
            ("gpu_memory_used_mib", s.memory_used_bytes.map(|b| b as f64 / f64::from(1 << 20))),
        ];
        for (name, value) in values {
            if let Some(v) = value {
                self.gpu_series.entry((s.uuid.clone(), name)).or_default().push(t_ms, v);
            }
        }
        if let Some(used) = s.memory_used_bytes {
            let peak = &mut self.summary.peak_gpu_memory_bytes;
            *peak = Some(peak.map_or(used, |p| p.max(used)));
        }
        let interval = self.gpu_interval_ms;
        let state = self.gpus.entry(s.uuid.clone()).or_default();
        let g = &mut state.summary;
        g.gpu.clone_from(&s.uuid);
        g.samples += 1;
        g.sm_clock_max_mhz = g.sm_clock_max_mhz.max(s.sm_clock_max_mhz);
        g.memory_clock_max_mhz = g.memory_clock_max_mhz.max(s.memory_clock_max_mhz);
        if let Some(limit) = s.power_limit_w {
            g.power_limit_w = Some(g.power_limit_w.map_or(limit, |l| l.max(limit)));
        }
        let dt = u64::from(state.last_t.map_or(interval, |last| t_ms.saturating_sub(last)));
        state.last_t = Some(t_ms);
        let bits = s.throttle_reasons.unwrap_or(0);
        let set: Vec<&str> = THROTTLE_REASONS
            .iter()
            .filter(|(bit, key, _)| bits & bit != 0 && *key != "gpu_idle")
            .map(|r| r.1)
            .collect();
        for key in &set {
            *g.throttled_ms.entry((*key).to_owned()).or_default() += dt;
        }
        let slowed = set.iter().any(|k| SLOWDOWNS.iter().any(|(s, _)| s == k));
        let busy = s.utilization_pct.is_some_and(|u| u >= BUSY_UTILIZATION_PCT) && bits & 0x1 == 0;
        let low = match (s.sm_clock_mhz, s.sm_clock_max_mhz.or(g.sm_clock_max_mhz)) {
            (Some(at), Some(max)) => f64::from(at) < LOW_CLOCK_SHARE * f64::from(max),
            _ => false,
        };
        let lowest = |seen: Option<u32>, now: Option<u32>| match (seen, now) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if busy {
            g.pcie_gen_loaded = lowest(g.pcie_gen_loaded, s.pcie_gen);
            g.pcie_width_loaded = lowest(g.pcie_width_loaded, s.pcie_width);
        }
        g.pcie_gen_max = g.pcie_gen_max.max(s.pcie_gen_max);
        g.pcie_width_max = g.pcie_width_max.max(s.pcie_width_max);
        if slowed || (busy && low) {
            g.held_down_ms += dt;
            if let Some(at) = s.sm_clock_mhz {
                state.held_down_clocks.push(at);
            }
            for key in &set {
                *state.held_down_by.entry((*key).to_owned()).or_default() += dt;
            }
        }
    }

    /// The group's GPUs' energy counters, mJ, read at the start (`start`)
    /// and at the end (`end`) of the load run, `duration_ms` apart, each in
    /// the order of `uuids`; `None` where a GPU gave no reading. The job's
    /// joules are known only when every GPU gave both.
    pub fn energy(&mut self, uuids: &[String], start: &[Option<u64>], end: &[Option<u64>], duration_ms: u64) {
        let mut total_mj: Option<u64> = if uuids.is_empty() { None } else { Some(0) };
        for (i, uuid) in uuids.iter().enumerate() {
            let g = &mut self.gpus.entry(uuid.clone()).or_default().summary;
            g.gpu.clone_from(uuid);
            g.energy_mj_start = start.get(i).copied().flatten();
            g.energy_mj_end = end.get(i).copied().flatten();
            total_mj = total_mj.zip(g.energy_mj()).map(|(sum, mj)| sum + mj);
        }
        self.summary.energy_j = total_mj.map(|mj| mj as f64 / 1000.0);
        self.summary.energy_duration_ms = self.summary.energy_j.map(|_| duration_ms);
    }

    /// The job's telemetry, the job having lasted `duration_ms` since the
    /// recorder's time 0.
    pub fn finish(mut self, duration_ms: u64) -> Telemetry {
        self.summary.duration_ms = duration_ms;
        let mut series = Vec::new();
        for (name, builder) in self.engine {
            let (stats, s) = builder.finish(name, String::new());
            self.summary.series.push(stats);
            series.push(s);
        }
        for ((gpu, name), builder) in self.gpu_series {
            let (stats, s) = builder.finish(name.to_owned(), gpu);
            self.summary.series.push(stats);
            series.push(s);
        }
        for (_, mut state) in self.gpus {
            state.held_down_clocks.sort_unstable();
            state.summary.held_down_sm_clock_mhz =
                state.held_down_clocks.get(state.held_down_clocks.len() / 2).copied();
            let mut by: Vec<(String, u64)> = state.held_down_by.into_iter().collect();
            by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            state.summary.held_down_reasons = by.into_iter().map(|(k, _)| k).collect();
            self.summary.gpus.push(state.summary);
        }
        Telemetry { summary: self.summary, series }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(t_ms: u32, sm: u32, util: u32, throttle: u64) -> GpuSample {
        GpuSample {
            uuid: "GPU-0".into(),
            sm_clock_mhz: Some(sm),
            sm_clock_max_mhz: Some(1980),
            memory_clock_mhz: Some(3201),
            memory_clock_max_mhz: Some(3201),
            power_w: Some(f64::from(t_ms) / 10.0),
            power_limit_w: Some(700.0),
            temperature_c: Some(60),
            utilization_pct: Some(util),
            memory_utilization_pct: Some(40),
            memory_used_bytes: Some(u64::from(t_ms) << 20),
            throttle_reasons: Some(throttle),
            pcie_gen: Some(5),
            pcie_width: Some(16),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
        }
    }

    /// A job of `n` readings 500 ms apart, reading `at(i)` at the i-th.
    fn job(n: u32, at: impl Fn(u32) -> GpuSample) -> Telemetry {
        let mut r = Recorder::new(500);
        for i in 0..n {
            r.gpu_sample(i * 500, 1, Ok(vec![at(i * 500)]));
        }
        r.finish(u64::from(n) * 500)
    }

    #[test]
    fn the_prefix_cache_hit_rate_is_the_counters_increase_over_the_job() {
        let counter = |name: &str, first: f64, last: f64| SeriesStats {
            name: name.into(),
            gpu: String::new(),
            count: 5,
            min: first,
            mean: (first + last) / 2.0,
            max: last,
            first,
            last,
        };
        let vllm = TelemetrySummary {
            series: vec![
                counter("vllm:prefix_cache_queries_total", 1_000.0, 11_000.0),
                counter("vllm:prefix_cache_hits_total", 400.0, 2_900.0),
            ],
            ..TelemetrySummary::default()
        };
        assert_eq!(vllm.prefix_cache(), Some((2_500.0, 10_000.0)), "since the job began, not the server");
        let sglang = TelemetrySummary {
            series: vec![
                counter("sglang:prompt_tokens_total", 0.0, 8_000.0),
                counter("sglang:cached_tokens_total", 0.0, 6_000.0),
            ],
            ..TelemetrySummary::default()
        };
        assert_eq!(sglang.prefix_cache(), Some((6_000.0, 8_000.0)));
        let idle = TelemetrySummary {
            series: vec![
                counter("vllm:prefix_cache_queries_total", 5.0, 5.0),
                counter("vllm:prefix_cache_hits_total", 1.0, 1.0),
            ],
            ..TelemetrySummary::default()
        };
        assert_eq!(idle.prefix_cache(), None, "nothing looked up");
        assert_eq!(TelemetrySummary::default().prefix_cache(), None);
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        for (n, text) in [(0, "0"), (999, "999"), (1410, "1,410"), (1980, "1,980"), (1234567, "1,234,567")] {
            assert_eq!(thousands(n), text);
        }
    }

    #[test]
    fn a_power_capped_stretch_is_flagged_with_its_clock_and_share() {
        // 100 readings; from the 62nd the power cap holds the clock at 1,410 MHz.
        let t = job(100, |t| if t >= 31_000 { gpu(t, 1410, 100, 0x4) } else { gpu(t, 1980, 100, 0) });
        let g = &t.summary.gpus[0];
        assert_eq!(g.throttled_ms.get("sw_power_cap"), Some(&19_000));
        assert_eq!((g.held_down_ms, g.held_down_sm_clock_mhz), (19_000, Some(1410)));
        assert_eq!(t.summary.throttle_flags(), ["SM clock 1,410 of 1,980 MHz for 38% of the job: power cap"]);
    }

    #[test]
    fn flags_name_each_cause_and_only_what_held_a_busy_gpu_down() {
        let check = |at: &dyn Fn(u32) -> GpuSample, expected: &[&str]| {
            let t = job(100, at);
            assert_eq!(t.summary.throttle_flags(), expected, "{:?}", t.summary.gpus);
        };
        // Idle and slow is no throttling; nor is busy at full clock.
        check(&|t| gpu(t, 345, 0, 0x1), &[]);
        check(&|t| gpu(t, 1980, 100, 0), &[]);
        // Busy, slow and no reason given.
        check(
            &|t| gpu(t, 1200, 90, 0),
            &["SM clock 1,200 of 1,980 MHz for 100% of the job: no throttle reason reported"],
        );
        // Heat then power: the longer first.
        check(
            &|t| match t {
                ..10_000 => gpu(t, 1980, 100, 0),
                10_000..40_000 => gpu(t, 1500, 100, 0x20),
                _ => gpu(t, 1500, 100, 0x4),
            },
            &["SM clock 1,500 of 1,980 MHz for 80% of the job: thermal slowdown and power cap"],
        );
        // A blip under 1% of the job is not flagged.
        let blip = job(300, |t| if t == 1_000 { gpu(t, 1410, 100, 0x4) } else { gpu(t, 1980, 100, 0) });
        assert_eq!(blip.summary.gpus[0].held_down_ms, 500);
        assert_eq!(blip.summary.throttle_flags(), Vec::<String>::new());
    }

    #[test]
    fn a_link_below_its_maximum_under_load_is_flagged_and_an_idle_one_is_not() {
        let at = |t: u32, util: u32, (g, w): (u32, u32)| GpuSample {
            pcie_gen: Some(g),
            pcie_width: Some(w),
            ..gpu(t, 1980, util, 0)
        };
        // Idle links train down to gen1: that is power saving, not a fault.
        let idle = job(20, |t| if t < 5_000 { at(t, 0, (1, 16)) } else { at(t, 100, (5, 16)) });
        assert_eq!(idle.summary.pcie_flags(), Vec::<String>::new());
        let degraded = job(20, |t| if t < 5_000 { at(t, 100, (5, 16)) } else { at(t, 100, (4, 8)) });
        assert_eq!(degraded.summary.pcie_flags(), ["PCIe gen4 x8 under load, its maximum gen5 x16"]);
    }

    #[test]
    fn several_gpus_are_each_named_and_the_peak_memory_is_the_largest() {
        let mut r = Recorder::new(500);
        for i in 0..10u32 {
            let a = GpuSample { uuid: "GPU-a".into(), ..gpu(i * 500, 1980, 100, 0) };
            let b =
                GpuSample { uuid: "GPU-b".into(), memory_used_bytes: Some(9 << 30), ..gpu(i * 500, 1410, 100, 0x4) };
            r.gpu_sample(i * 500, 2, Ok(vec![a, b]));
        }
        r.gpu_sample(5_000, 2, Err("GPU-b fell off the bus".into()));
        let t = r.finish(5_500);
        assert_eq!(t.summary.throttle_flags(), ["GPU-b: SM clock 1,410 of 1,980 MHz for 91% of the job: power cap"]);
        assert_eq!(t.summary.peak_gpu_memory_bytes, Some(9 << 30));
        assert_eq!((t.summary.gpu_samples, t.summary.gpu_sample_failures), (22, 2));
        assert_eq!(t.summary.gpu_sample_error.as_deref(), Some("GPU-b fell off the bus"));
        let power = t.summary.stats("gpu_power_w", "GPU-a").expect("GPU-a's power");
        assert_eq!((power.count, power.min, power.max, power.mean), (10, 0.0, 450.0, 225.0));
    }

    #[test]
    fn energy_figures_are_the_joules_over_the_run_and_its_tokens() {
        let e = Energy::of(6_000.0, 10.0, 20_000).expect("figures");
        assert_eq!(
            (e.joules, e.mean_power_w, e.mj_per_output_token, e.output_tokens_per_joule),
            (6_000.0, 600.0, 300.0, 20_000.0 / 6_000.0)
        );
        // Nothing divided by zero, nothing guessed.
        for (joules, duration_s, tokens) in
            [(6_000.0, 10.0, 0), (6_000.0, 0.0, 10), (0.0, 10.0, 10), (-1.0, 10.0, 10), (f64::NAN, 10.0, 10)]
        {
            assert_eq!(Energy::of(joules, duration_s, tokens), None, "{joules} J, {duration_s} s, {tokens} tokens");
        }
    }

    #[test]
    fn a_job_s_energy_is_its_gpus_counters_increase_known_only_from_every_gpu() {
        let uuids = ["GPU-a".to_owned(), "GPU-b".to_owned()];
        let energy = |start: [Option<u64>; 2], end: [Option<u64>; 2]| {
            let mut r = Recorder::new(500);
            r.gpu_sample(0, 2, Ok(vec![GpuSample { uuid: "GPU-a".into(), ..gpu(0, 1980, 100, 0) }]));
            r.energy(&uuids, &start, &end, 4_000);
            r.finish(4_000).summary
        };
        let both = energy([Some(1_000_000), Some(5_000)], [Some(1_002_400), Some(7_500)]);
        assert_eq!((both.energy_j, both.energy_duration_ms), (Some(4.9), Some(4_000)));
        assert_eq!(both.gpus.len(), 2, "a GPU never sampled still has its readings: {:?}", both.gpus);
        assert_eq!((both.gpus[1].gpu.as_str(), both.gpus[1].energy_mj()), ("GPU-b", Some(2_500)));
        let e = both.energy(49).expect("figures");
        assert!((e.mean_power_w - 1.225).abs() < 1e-9 && (e.mj_per_output_token - 100.0).abs() < 1e-9, "{e:?}");
        // One GPU without a counter, one whose counter went back: unknown, not a part.
        for t in [
            energy([Some(1_000_000), None], [Some(1_002_400), None]),
            energy([Some(1_000_000), Some(5_000)], [Some(1_002_400), Some(4_000)]),
        ] {
            assert_eq!((t.energy_j, t.energy_duration_ms, t.energy(49)), (None, None, None), "{:?}", t.gpus);
        }
        // A job without energy readings (an older agent's) has none.
        assert_eq!(job(4, |t| gpu(t, 1980, 100, 0)).summary.energy_j, None);
    }

    #[test]
    fn a_summary_stored_before_energy_was_measured_reads_back_without_it() {
        let mut stored = serde_json::to_value(&job(4, |t| gpu(t, 1980, 100, 0)).summary).expect("JSON");
        let fields = stored.as_object_mut().expect("an object");
        fields.retain(|k, _| !k.starts_with("energy"));
        let gpu = fields.get_mut("gpus").and_then(|g| g[0].as_object_mut()).expect("a GPU");
        gpu.retain(|k, _| !k.starts_with("energy"));
        let back: TelemetrySummary = serde_json::from_value(stored).expect("reads back");
        assert_eq!((back.energy_j, back.energy_duration_ms, back.gpus[0].energy_mj_start), (None, None, None));
    }

    #[test]
    fn a_long_series_keeps_at_most_max_points_and_its_exact_numbers() {
        let mut r = Recorder::new(500);
        let n: u32 = 100_000;
        for i in 0..n {
            r.engine_scrape(i * 1000, Ok(vec![("vllm:num_requests_running".into(), f64::from(i % 2) * 99.0)]));
        }
        r.engine_scrape(n * 1000, Err("GET /metrics answered 503".into()));
        let t = r.finish(u64::from(n) * 1000);
        let s = &t.series[0];
        assert!(s.points.len() <= MAX_POINTS && s.points.len() > MAX_POINTS / 2, "{} points", s.points.len());
        assert!(s.points.windows(2).all(|w| w[0].0 < w[1].0), "in time order");
        // Each kept point is the mean of the readings it stands for: an even
        // number of them, alternately 0 and 99.
        assert!(s.points.iter().all(|p| p.1 == 49.5), "{:?}", &s.points[..4]);
        let stats = t.summary.stats("vllm:num_requests_running", "").expect("stats");
        assert_eq!((stats.count, stats.min, stats.max, stats.mean), (u64::from(n), 0.0, 99.0, 49.5));
        assert_eq!((t.summary.engine_scrapes, t.summary.engine_scrape_failures), (u64::from(n) + 1, 1));
    }

    #[test]
    fn metrics_are_read_by_name_counters_summed_gauges_per_replica() {
        // Two data-parallel engines of vLLM: their requests add up, their KV cache usage is the mean.
        let text = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3.0\n\
                    vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 5.0\n\
                    # TYPE vllm:kv_cache_usage_perc gauge\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.25\n\
                    # TYPE vllm:request_success_total counter\n\
                    vllm:request_success_total{finished_reason=\"length\"} 10.0\n\
                    vllm:request_success_total{finished_reason=\"stop\"} 2.0\n\
                    # TYPE vllm:e2e_request_latency_seconds histogram\n\
                    vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 12.0\n\
                    vllm:e2e_request_latency_seconds_count 12.0\n\
                    vllm:e2e_request_latency_seconds_sum 3.5\n";
        let got = read_metrics(text, VLLM_SERIES).expect("parses");
        assert_eq!(
            got,
            [
                ("vllm:num_requests_running".to_owned(), 8.0),
                ("vllm:kv_cache_usage_perc".to_owned(), 0.375),
                ("vllm:request_success_total".to_owned(), 12.0)
            ]
        );
        // SGLang's tensor-parallel ranks of one replica report alike (the largest is read), its
        // data-parallel replicas add up.
        let text = "# TYPE sglang:num_running_reqs gauge\n\
                    sglang:num_running_reqs{tp_rank=\"0\",dp_rank=\"0\"} 4.0\n\
                    sglang:num_running_reqs{tp_rank=\"1\",dp_rank=\"0\"} 4.0\n\
                    sglang:num_running_reqs{tp_rank=\"0\",dp_rank=\"1\"} 6.0\n\
                    sglang:num_running_reqs{tp_rank=\"1\",dp_rank=\"1\"} 6.0\n\
                    # TYPE sglang:token_usage gauge\n\
                    sglang:token_usage{tp_rank=\"0\"} 0.5\n\
                    sglang:token_usage{tp_rank=\"1\"} 0.5\n";
        let got = read_metrics(text, SGLANG_SERIES).expect("parses");
        assert_eq!(got, [("sglang:num_running_reqs".to_owned(), 10.0), ("sglang:token_usage".to_owned(), 0.5)]);
        assert!(matches!(read_metrics("<html>404</html>", VLLM_SERIES), Err(MetricsError::Parse(_))));
        assert_eq!(
            read_metrics("# TYPE other gauge\nother 1\n", VLLM_SERIES),
            Err(MetricsError::NoSeries("vllm:num_requests_running".into()))
        );
    }
}
