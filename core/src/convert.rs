//! The one place where request records, summaries, job telemetry and load
//! specs cross to and from their gRPC (prost) form.

use benchfleet_proto as pb;

use crate::load::{Arrival, Endpoint, LoadDataset, LoadSpec, Sessions, StoredFile, TraceFormat, Window};
use crate::metrics::{Distribution, Failures, Percentile, Slo, Summary};
use crate::record::{Chunk, Outcome, Phase, RequestRecord, Turn};
use crate::telemetry::{GpuTelemetry, Series, SeriesStats, Telemetry, TelemetrySummary};

impl From<Phase> for pb::RequestPhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Measured => pb::RequestPhase::Measured,
            Phase::Warmup => pb::RequestPhase::Warmup,
            Phase::Cooldown => pb::RequestPhase::Cooldown,
        }
    }
}

impl From<Outcome> for pb::Outcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Ok => pb::Outcome::Ok,
            Outcome::HttpError => pb::Outcome::HttpError,
            Outcome::Timeout => pb::Outcome::Timeout,
            Outcome::Cancelled => pb::Outcome::Cancelled,
            Outcome::Incomplete => pb::Outcome::Incomplete,
            Outcome::Disconnected => pb::Outcome::Disconnected,
            Outcome::Malformed => pb::Outcome::Malformed,
            Outcome::TransportError => pb::Outcome::TransportError,
        }
    }
}

/// A record received over the wire is not valid.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRecord {
    #[error("record {seq}: unknown outcome {value}")]
    Outcome { seq: u64, value: i32 },
    #[error("record {seq}: unknown phase {value}")]
    Phase { seq: u64, value: i32 },
    #[error("record {seq}: {times} chunk times but {tokens} chunk token counts")]
    Chunks { seq: u64, times: usize, tokens: usize },
    #[error("record {seq}: a session needs a turn from 1, and a turn a session")]
    Turn { seq: u64 },
}

impl From<&RequestRecord> for pb::RequestRecord {
    fn from(r: &RequestRecord) -> Self {
        pb::RequestRecord {
            seq: r.seq,
            scheduled_ns: r.scheduled_ns,
            sent_ns: r.sent_ns,
            first_token_ns: r.first_token_ns.unwrap_or(0),
            completed_ns: r.completed_ns,
            chunk_ns: r.chunks.iter().map(|c| c.at_ns).collect(),
            chunk_tokens: r.chunks.iter().map(|c| c.tokens).collect(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            outcome: pb::Outcome::from(r.outcome) as i32,
            http_status: r.http_status.map_or(0, u32::from),
            error: r.error.clone().unwrap_or_default(),
            slot_ns: r.slot_ns,
            connect_ns: r.connect_ns,
            phase: pb::RequestPhase::from(r.phase) as i32,
            session: r.turn.map(|t| t.session),
            turn: r.turn.map(|t| t.turn),
        }
    }
}

impl TryFrom<pb::RequestRecord> for RequestRecord {
    type Error = InvalidRecord;

    fn try_from(r: pb::RequestRecord) -> Result<Self, Self::Error> {
        let outcome = match pb::Outcome::try_from(r.outcome) {
            Ok(pb::Outcome::Ok) => Outcome::Ok,
            Ok(pb::Outcome::HttpError) => Outcome::HttpError,
            Ok(pb::Outcome::Timeout) => Outcome::Timeout,
            Ok(pb::Outcome::Cancelled) => Outcome::Cancelled,
            Ok(pb::Outcome::Incomplete) => Outcome::Incomplete,
            Ok(pb::Outcome::Disconnected) => Outcome::Disconnected,
            Ok(pb::Outcome::Malformed) => Outcome::Malformed,
            Ok(pb::Outcome::TransportError) => Outcome::TransportError,
            Ok(pb::Outcome::Unspecified) | Err(_) => {
                return Err(InvalidRecord::Outcome { seq: r.seq, value: r.outcome });
            }
        };
        let phase = match pb::RequestPhase::try_from(r.phase) {
            Ok(pb::RequestPhase::Measured) => Phase::Measured,
            Ok(pb::RequestPhase::Warmup) => Phase::Warmup,
            Ok(pb::RequestPhase::Cooldown) => Phase::Cooldown,
            Err(_) => return Err(InvalidRecord::Phase { seq: r.seq, value: r.phase }),
        };
        let turn = match (r.session, r.turn) {
            (Some(session), Some(turn)) if turn > 0 => Some(Turn { session, turn }),
            (None, None) => None,
            _ => return Err(InvalidRecord::Turn { seq: r.seq }),
        };
        if r.chunk_ns.len() != r.chunk_tokens.len() {
            return Err(InvalidRecord::Chunks { seq: r.seq, times: r.chunk_ns.len(), tokens: r.chunk_tokens.len() });
        }
        Ok(RequestRecord {
            seq: r.seq,
            scheduled_ns: r.scheduled_ns,
            sent_ns: r.sent_ns,
            first_token_ns: (r.first_token_ns != 0).then_some(r.first_token_ns),
            completed_ns: r.completed_ns,
            chunks: r.chunk_ns.iter().zip(&r.chunk_tokens).map(|(&at_ns, &tokens)| Chunk { at_ns, tokens }).collect(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
            outcome,
            http_status: u16::try_from(r.http_status).ok().filter(|&s| s != 0),
            error: (!r.error.is_empty()).then_some(r.error),
            slot_ns: r.slot_ns,
            connect_ns: r.connect_ns,
            phase,
            turn,
        })
    }
}

impl From<&Distribution> for pb::Distribution {
    fn from(d: &Distribution) -> Self {
        pb::Distribution {
            mean: d.mean,
            median: d.median,
            p95: d.p95,
            p99: d.p99,
            count: d.count,
            percentiles: d.percentiles.iter().map(|q| pb::Percentile { p: q.p, value: q.value }).collect(),
        }
    }
}

impl From<pb::Distribution> for Distribution {
    fn from(d: pb::Distribution) -> Self {
        Distribution {
            mean: d.mean,
            median: d.median,
            p95: d.p95,
            p99: d.p99,
            count: d.count,
            percentiles: d.percentiles.iter().map(|q| Percentile { p: q.p, value: q.value }).collect(),
        }
    }
}

impl From<&Summary> for pb::Summary {
    fn from(s: &Summary) -> Self {
        pb::Summary {
            successful: s.successful,
            failed: s.failed,
            max_concurrency: s.max_concurrency.unwrap_or(0),
            duration_s: s.duration_s,
            total_input_tokens: s.total_input_tokens,
            total_output_tokens: s.total_output_tokens,
            request_throughput: s.request_throughput,
            output_throughput: s.output_throughput,
            peak_output_throughput: s.peak_output_throughput,
            peak_concurrent: s.peak_concurrent,
            total_token_throughput: s.total_token_throughput,
            latency_s: Some((&s.latency_s).into()),
            ttft_ms: Some((&s.ttft_ms).into()),
            tpot_ms: Some((&s.tpot_ms).into()),
            itl_ms: Some((&s.itl_ms).into()),
            itl_per_token_ms: Some((&s.itl_per_token_ms).into()),
            latency_from_scheduled_s: Some((&s.latency_from_scheduled_s).into()),
            ttft_from_scheduled_ms: Some((&s.ttft_from_scheduled_ms).into()),
            connect_ms: Some((&s.connect_ms).into()),
            failed_http_error: s.failures.http_error,
            failed_timeout: s.failures.timeout,
            failed_cancelled: s.failures.cancelled,
            failed_incomplete: s.failures.incomplete,
            failed_transport_error: s.failures.transport_error,
            failed_disconnected: s.failures.disconnected,
            failed_malformed: s.failures.malformed,
            failure_reasons: s
                .failure_reasons
                .iter()
                .map(|r| pb::FailureReason { reason: r.reason.clone(), count: r.count })
                .collect(),
            excluded: s.excluded,
            dispatch_lag_ms: Some((&s.dispatch_lag_ms).into()),
            offered_rate: s.offered_rate,
            achieved_rate: s.achieved_rate,
            cap_waits: s.cap_waits,
            lag_limit_ms: s.lag_limit_ms,
            rate_tolerance: s.rate_tolerance,
            client_cpu_s: s.client_cpu_s,
            invalid: s.invalid.clone(),
            usage_below_events: s.usage_below_events,
            steady_state: s.steady_state.as_ref().map(|w| pb::SteadyState {
                reached: w.reached,
                start_s: w.start_s,
                end_s: w.end_s,
                level: w.level,
                held: w.held,
                requests: w.requests,
                request_throughput: w.request_throughput,
                output_throughput: w.output_throughput,
                total_token_throughput: w.total_token_throughput,
                mean_ttft_ms: w.mean_ttft_ms,
                p99_ttft_ms: w.p99_ttft_ms,
                mean_tpot_ms: w.mean_tpot_ms,
                ttft_drift_pct: w.ttft_drift_pct,
                throughput_drift_pct: w.throughput_drift_pct,
            }),
            noise: s.noise.as_ref().map(|n| pb::Noise {
                batches: n.batches,
                metrics: n
                    .metrics
                    .iter()
                    .map(|m| pb::MetricNoise { metric: m.metric.clone(), se: m.se, batch_means: m.batch_means.clone() })
                    .collect(),
                batch_requests: n.batch_requests.clone(),
            }),
            sessions: s.sessions.as_ref().map(|s| pb::Sessions {
                sessions: s.sessions,
                turns: s.turns,
                by_turn: s
                    .by_turn
                    .iter()
                    .map(|t| pb::TurnFigures {
                        turn: t.turn,
                        successful: t.successful,
                        failed: t.failed,
                        mean_ttft_ms: t.mean_ttft_ms,
                        mean_prompt_tokens: t.mean_prompt_tokens,
                    })
                    .collect(),
            }),
            usage_check: s.usage_check.map(|u| pb::UsageCheck {
                prompts_compared: u.prompts_compared,
                prompts_off: u.prompts_off,
                prompt_ratio: u.prompt_ratio,
                outputs_compared: u.outputs_compared,
                outputs_off: u.outputs_off,
                output_ratio: u.output_ratio,
                outputs_by_events: u.outputs_by_events,
            }),
            goodput: s.goodput.map(|g| pb::Goodput {
                ttft_ms: g.slo.ttft_ms,
                tpot_ms: g.slo.tpot_ms,
                e2el_ms: g.slo.e2el_ms,
                good: g.good,
                request_goodput: g.request_goodput,
            }),
        }
    }
}

impl From<pb::Summary> for Summary {
    fn from(s: pb::Summary) -> Self {
        Summary {
            successful: s.successful,
            failed: s.failed,
            max_concurrency: (s.max_concurrency != 0).then_some(s.max_concurrency),
            duration_s: s.duration_s,
            total_input_tokens: s.total_input_tokens,
            total_output_tokens: s.total_output_tokens,
            request_throughput: s.request_throughput,
            output_throughput: s.output_throughput,
            peak_output_throughput: s.peak_output_throughput,
            peak_concurrent: s.peak_concurrent,
            total_token_throughput: s.total_token_throughput,
            latency_s: s.latency_s.unwrap_or_default().into(),
            ttft_ms: s.ttft_ms.unwrap_or_default().into(),
            tpot_ms: s.tpot_ms.unwrap_or_default().into(),
            itl_ms: s.itl_ms.unwrap_or_default().into(),
            itl_per_token_ms: s.itl_per_token_ms.unwrap_or_default().into(),
            latency_from_scheduled_s: s.latency_from_scheduled_s.unwrap_or_default().into(),
            ttft_from_scheduled_ms: s.ttft_from_scheduled_ms.unwrap_or_default().into(),
            connect_ms: s.connect_ms.unwrap_or_default().into(),
            failures: Failures {
                http_error: s.failed_http_error,
                timeout: s.failed_timeout,
                cancelled: s.failed_cancelled,
                incomplete: s.failed_incomplete,
                transport_error: s.failed_transport_error,
                disconnected: s.failed_disconnected,
                malformed: s.failed_malformed,
            },
            failure_reasons: s
                .failure_reasons
                .into_iter()
                .map(|r| crate::metrics::FailureReason { reason: r.reason, count: r.count })
                .collect(),
            excluded: s.excluded,
            dispatch_lag_ms: s.dispatch_lag_ms.unwrap_or_default().into(),
            offered_rate: s.offered_rate,
            achieved_rate: s.achieved_rate,
            cap_waits: s.cap_waits,
            // A summary from before the limit was recorded had the default.
            lag_limit_ms: if s.lag_limit_ms > 0.0 { s.lag_limit_ms } else { crate::metrics::DEFAULT_LAG_LIMIT_MS },
            rate_tolerance: if s.rate_tolerance > 0.0 {
                s.rate_tolerance
            } else {
                crate::metrics::DEFAULT_RATE_TOLERANCE
            },
            client_cpu_s: s.client_cpu_s,
            invalid: s.invalid,
            usage_below_events: s.usage_below_events,
            steady_state: s.steady_state.map(|w| crate::metrics::steady::SteadyState {
                reached: w.reached,
                start_s: w.start_s,
                end_s: w.end_s,
                level: w.level,
                held: w.held,
                requests: w.requests,
                request_throughput: w.request_throughput,
                output_throughput: w.output_throughput,
                total_token_throughput: w.total_token_throughput,
                mean_ttft_ms: w.mean_ttft_ms,
                p99_ttft_ms: w.p99_ttft_ms,
                mean_tpot_ms: w.mean_tpot_ms,
                ttft_drift_pct: w.ttft_drift_pct,
                throughput_drift_pct: w.throughput_drift_pct,
            }),
            noise: s.noise.map(|n| crate::metrics::noise::Noise {
                batches: n.batches,
                metrics: n
                    .metrics
                    .into_iter()
                    .map(|m| crate::metrics::noise::MetricNoise {
                        metric: m.metric,
                        se: m.se,
                        batch_means: m.batch_means,
                    })
                    .collect(),
                batch_requests: n.batch_requests,
            }),
            sessions: s.sessions.map(|s| crate::metrics::sessions::Sessions {
                sessions: s.sessions,
                turns: s.turns,
                by_turn: s
                    .by_turn
                    .into_iter()
                    .map(|t| crate::metrics::sessions::TurnFigures {
                        turn: t.turn,
                        successful: t.successful,
                        failed: t.failed,
                        mean_ttft_ms: t.mean_ttft_ms,
                        mean_prompt_tokens: t.mean_prompt_tokens,
                    })
                    .collect(),
            }),
            usage_check: s.usage_check.map(|u| crate::metrics::UsageCheck {
                prompts_compared: u.prompts_compared,
                prompts_off: u.prompts_off,
                prompt_ratio: u.prompt_ratio,
                outputs_compared: u.outputs_compared,
                outputs_off: u.outputs_off,
                output_ratio: u.output_ratio,
                outputs_by_events: u.outputs_by_events,
            }),
            goodput: s.goodput.map(|g| crate::metrics::Goodput {
                slo: crate::metrics::Slo { ttft_ms: g.ttft_ms, tpot_ms: g.tpot_ms, e2el_ms: g.e2el_ms },
                good: g.good,
                request_goodput: g.request_goodput,
            }),
        }
    }
}

impl From<&Telemetry> for pb::JobTelemetry {
    fn from(t: &Telemetry) -> Self {
        let s = &t.summary;
        let text = |e: &Option<String>| e.clone().unwrap_or_default();
        pb::JobTelemetry {
            summary: Some(pb::TelemetrySummary {
                duration_ms: s.duration_ms,
                engine_scrapes: s.engine_scrapes,
                engine_scrape_failures: s.engine_scrape_failures,
                engine_scrape_error: text(&s.engine_scrape_error),
                gpu_samples: s.gpu_samples,
                gpu_sample_failures: s.gpu_sample_failures,
                gpu_sample_error: text(&s.gpu_sample_error),
                series: s
                    .series
                    .iter()
                    .map(|x| pb::SeriesStats {
                        name: x.name.clone(),
                        gpu: x.gpu.clone(),
                        count: x.count,
                        min: x.min,
                        mean: x.mean,
                        max: x.max,
                        first: x.first,
                        last: x.last,
                    })
                    .collect(),
                gpus: s
                    .gpus
                    .iter()
                    .map(|g| pb::GpuTelemetry {
                        gpu: g.gpu.clone(),
                        samples: g.samples,
                        sm_clock_max_mhz: g.sm_clock_max_mhz,
                        memory_clock_max_mhz: g.memory_clock_max_mhz,
                        power_limit_w: g.power_limit_w,
                        throttled_ms: g.throttled_ms.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                        held_down_ms: g.held_down_ms,
                        held_down_sm_clock_mhz: g.held_down_sm_clock_mhz,
                        held_down_reasons: g.held_down_reasons.clone(),
                        energy_mj_start: g.energy_mj_start,
                        energy_mj_end: g.energy_mj_end,
                        pcie_gen_loaded: g.pcie_gen_loaded,
                        pcie_width_loaded: g.pcie_width_loaded,
                        pcie_gen_max: g.pcie_gen_max,
                        pcie_width_max: g.pcie_width_max,
                    })
                    .collect(),
                peak_gpu_memory_bytes: s.peak_gpu_memory_bytes,
                energy_j: s.energy_j,
                energy_duration_ms: s.energy_duration_ms,
                hardware_notes: s.hardware_notes.clone(),
            }),
            series: t
                .series
                .iter()
                .map(|x| pb::TelemetrySeries {
                    name: x.name.clone(),
                    gpu: x.gpu.clone(),
                    t_ms: x.points.iter().map(|p| p.0).collect(),
                    values: x.points.iter().map(|p| p.1).collect(),
                })
                .collect(),
        }
    }
}

/// Job telemetry received over the wire; a series whose times and values
/// differ in number is cut to the shorter.
impl From<pb::JobTelemetry> for Telemetry {
    fn from(t: pb::JobTelemetry) -> Self {
        let s = t.summary.unwrap_or_default();
        let text = |e: String| (!e.is_empty()).then_some(e);
        Telemetry {
            summary: TelemetrySummary {
                duration_ms: s.duration_ms,
                engine_scrapes: s.engine_scrapes,
                engine_scrape_failures: s.engine_scrape_failures,
                engine_scrape_error: text(s.engine_scrape_error),
                gpu_samples: s.gpu_samples,
                gpu_sample_failures: s.gpu_sample_failures,
                gpu_sample_error: text(s.gpu_sample_error),
                series: s
                    .series
                    .into_iter()
                    .map(|x| SeriesStats {
                        name: x.name,
                        gpu: x.gpu,
                        count: x.count,
                        min: x.min,
                        mean: x.mean,
                        max: x.max,
                        first: x.first,
                        last: x.last,
                    })
                    .collect(),
                gpus: s
                    .gpus
                    .into_iter()
                    .map(|g| GpuTelemetry {
                        gpu: g.gpu,
                        samples: g.samples,
                        sm_clock_max_mhz: g.sm_clock_max_mhz,
                        memory_clock_max_mhz: g.memory_clock_max_mhz,
                        power_limit_w: g.power_limit_w,
                        throttled_ms: g.throttled_ms.into_iter().collect(),
                        held_down_ms: g.held_down_ms,
                        held_down_sm_clock_mhz: g.held_down_sm_clock_mhz,
                        held_down_reasons: g.held_down_reasons,
                        energy_mj_start: g.energy_mj_start,
                        energy_mj_end: g.energy_mj_end,
                        pcie_gen_loaded: g.pcie_gen_loaded,
                        pcie_width_loaded: g.pcie_width_loaded,
                        pcie_gen_max: g.pcie_gen_max,
                        pcie_width_max: g.pcie_width_max,
                    })
                    .collect(),
                peak_gpu_memory_bytes: s.peak_gpu_memory_bytes,
                energy_j: s.energy_j,
                energy_duration_ms: s.energy_duration_ms,
                hardware_notes: s.hardware_notes,
            },
            series: t
                .series
                .into_iter()
                .map(|x| Series { name: x.name, gpu: x.gpu, points: x.t_ms.into_iter().zip(x.values).collect() })
                .collect(),
        }
    }
}

/// A load profile received over the wire is not valid.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum InvalidLoad {
    #[error("a load profile without a dataset")]
    NoDataset,
    /// 0 is what a controller older than the enum sends.
    #[error("a load profile with an unknown arrival {0} (from an older controller?)")]
    Arrival(i32),
    #[error("a load profile with an unknown endpoint {0} (from an older controller?)")]
    Endpoint(i32),
    #[error("a load profile's goodput: {0}")]
    Goodput(String),
    #[error("a load profile with an unknown trace format {0} (from an older controller?)")]
    TraceFormat(i32),
    #[error("a load profile's trace speed must be above 0, got {0}")]
    TraceSpeed(f64),
    #[error("a load profile's sessions must have a turn at least")]
    Turns,
}

/// A job's load as an assignment carries it; a file travels by its hash.
impl From<&LoadSpec> for pb::LoadProfile {
    fn from(l: &LoadSpec) -> Self {
        let dataset = match &l.dataset {
            LoadDataset::Random { input_tokens, output_tokens, seed } => {
                pb::load_profile::Dataset::Random(pb::RandomDataset {
                    input_tokens: *input_tokens,
                    output_tokens: *output_tokens,
                    seed: *seed,
                })
            }
            LoadDataset::ShareGpt { file, sha256, output_tokens, sessions } => {
                pb::load_profile::Dataset::Sharegpt(pb::ShareGptDataset {
                    name: file.clone(),
                    sha256: sha256.clone(),
                    output_tokens: output_tokens.unwrap_or(0),
                    session_think_time_ms: sessions.map(|s| s.think_time_ms),
                })
            }
            LoadDataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
                pb::load_profile::Dataset::SharedPrefix(pb::SharedPrefixDataset {
                    groups: *groups,
                    prefix_tokens: *prefix_tokens,
                    suffix_tokens: *suffix_tokens,
                    output_tokens: *output_tokens,
                    seed: *seed,
                })
            }
            LoadDataset::Trace { file, sha256, format, speed } => pb::load_profile::Dataset::Trace(pb::TraceDataset {
                name: file.clone(),
                sha256: sha256.clone(),
                format: match format {
                    TraceFormat::Mooncake => pb::TraceFormat::Mooncake,
                    TraceFormat::Jsonl => pb::TraceFormat::Jsonl,
                } as i32,
                speed: *speed,
            }),
            LoadDataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed } => {
                pb::load_profile::Dataset::MultiTurn(pb::MultiTurnDataset {
                    turns: *turns,
                    user_tokens: *user_tokens,
                    output_tokens: *output_tokens,
                    think_time_ms: *think_time_ms,
                    seed: *seed,
                })
            }
        };
        let requests = |w: Option<Window>| match w {
            Some(Window::Requests(n)) => Some(n),
            _ => None,
        };
        let seconds = |w: Option<Window>| match w {
            Some(Window::Seconds(s)) => Some(s),
            _ => None,
        };
        pb::LoadProfile {
            rate: l.rate.unwrap_or(0.0),
            max_concurrency: l.max_concurrency.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            requests: l.requests,
            dataset: Some(dataset),
            arrival: match l.arrival {
                Arrival::Constant => pb::Arrival::Constant,
                Arrival::Poisson => pb::Arrival::Poisson,
            } as i32,
            seed: l.seed,
            endpoint: match l.endpoint {
                Endpoint::Completions => pb::Endpoint::Completions,
                Endpoint::Chat => pb::Endpoint::Chat,
            } as i32,
            lag_limit_ms: l.lag_limit_ms,
            rate_tolerance: l.rate_tolerance,
            warmup_requests: requests(l.warmup),
            warmup_s: seconds(l.warmup),
            cooldown_requests: requests(l.cooldown),
            cooldown_s: seconds(l.cooldown),
            max_duration_s: l.max_duration_s,
            ignore_eos: l.ignore_eos,
            extra_body: l.extra_body.clone().unwrap_or_default(),
            goodput: l.goodput.map(|g| g.words()).unwrap_or_default(),
            processor: l.processor.as_ref().map(|f| pb::StoredFile { name: f.file.clone(), sha256: f.sha256.clone() }),
        }
    }
}

/// A job's load as an assignment carried it.
impl TryFrom<pb::LoadProfile> for LoadSpec {
    type Error = InvalidLoad;

    fn try_from(l: pb::LoadProfile) -> Result<Self, InvalidLoad> {
        let dataset = match l.dataset.ok_or(InvalidLoad::NoDataset)? {
            pb::load_profile::Dataset::Random(r) => {
                LoadDataset::Random { input_tokens: r.input_tokens, output_tokens: r.output_tokens, seed: r.seed }
            }
            pb::load_profile::Dataset::Sharegpt(s) => LoadDataset::ShareGpt {
                file: s.name,
                sha256: s.sha256,
                output_tokens: (s.output_tokens != 0).then_some(s.output_tokens),
                sessions: s.session_think_time_ms.map(|think_time_ms| Sessions { think_time_ms }),
            },
            pb::load_profile::Dataset::SharedPrefix(p) => LoadDataset::SharedPrefix {
                groups: p.groups,
                prefix_tokens: p.prefix_tokens,
                suffix_tokens: p.suffix_tokens,
                output_tokens: p.output_tokens,
                seed: p.seed,
            },
            pb::load_profile::Dataset::Trace(t) => LoadDataset::Trace {
                file: t.name,
                sha256: t.sha256,
                format: match pb::TraceFormat::try_from(t.format) {
                    Ok(pb::TraceFormat::Mooncake) => TraceFormat::Mooncake,
                    Ok(pb::TraceFormat::Jsonl) => TraceFormat::Jsonl,
                    Ok(pb::TraceFormat::Unspecified) | Err(_) => return Err(InvalidLoad::TraceFormat(t.format)),
                },
                speed: Some(t.speed).filter(|s| s.is_finite() && *s > 0.0).ok_or(InvalidLoad::TraceSpeed(t.speed))?,
            },
            pb::load_profile::Dataset::MultiTurn(m) => LoadDataset::MultiTurn {
                turns: Some(m.turns).filter(|&t| t > 0).ok_or(InvalidLoad::Turns)?,
                user_tokens: m.user_tokens,
                output_tokens: m.output_tokens,
                think_time_ms: m.think_time_ms,
                seed: m.seed,
            },
        };
        let arrival = match pb::Arrival::try_from(l.arrival) {
            Ok(pb::Arrival::Constant) => Arrival::Constant,
            Ok(pb::Arrival::Poisson) => Arrival::Poisson,
            Ok(pb::Arrival::Unspecified) | Err(_) => return Err(InvalidLoad::Arrival(l.arrival)),
        };
        let endpoint = match pb::Endpoint::try_from(l.endpoint) {
            Ok(pb::Endpoint::Completions) => Endpoint::Completions,
            Ok(pb::Endpoint::Chat) => Endpoint::Chat,
            Ok(pb::Endpoint::Unspecified) | Err(_) => return Err(InvalidLoad::Endpoint(l.endpoint)),
        };
        let window = |requests: Option<u64>, seconds: Option<f64>| {
            requests.map(Window::Requests).or(seconds.map(Window::Seconds))
        };
        let goodput =
            if l.goodput.is_empty() { None } else { Some(Slo::parse(&l.goodput).map_err(InvalidLoad::Goodput)?) };
        Ok(LoadSpec {
            dataset,
            rate: (l.rate > 0.0).then_some(l.rate),
            arrival,
            requests: l.requests,
            max_concurrency: (l.max_concurrency != 0).then_some(u64::from(l.max_concurrency)),
            endpoint,
            seed: l.seed,
            lag_limit_ms: l.lag_limit_ms,
            rate_tolerance: l.rate_tolerance,
            warmup: window(l.warmup_requests, l.warmup_s),
            cooldown: window(l.cooldown_requests, l.cooldown_s),
            max_duration_s: l.max_duration_s,
            ignore_eos: l.ignore_eos,
            extra_body: (!l.extra_body.is_empty()).then_some(l.extra_body),
            goodput,
            processor: l.processor.map(|f| StoredFile { file: f.name, sha256: f.sha256 }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Failures, Percentile};
    use crate::record::Phase;

    #[test]
    fn a_load_spec_crosses_the_wire_whole() {
        let spec = LoadSpec {
            rate: Some(12.5),
            arrival: Arrival::Poisson,
            max_concurrency: Some(9),
            endpoint: Endpoint::Chat,
            seed: 77,
            lag_limit_ms: Some(12.5),
            rate_tolerance: Some(0.025),
            warmup: Some(Window::Requests(7)),
            cooldown: Some(Window::Seconds(2.5)),
            max_duration_s: Some(90.0),
            ignore_eos: true,
            extra_body: Some(r#"{"temperature":0}"#.into()),
            goodput: Some(Slo { ttft_ms: Some(200.0), tpot_ms: None, e2el_ms: Some(5000.0) }),
            processor: Some(StoredFile { file: "tokenizer.json".into(), sha256: "ab".repeat(32) }),
            ..LoadSpec::new(
                LoadDataset::ShareGpt {
                    file: "d.json".into(),
                    sha256: "cd".into(),
                    output_tokens: Some(4),
                    sessions: None,
                },
                321,
            )
        };
        assert_eq!(LoadSpec::try_from(pb::LoadProfile::from(&spec)), Ok(spec.clone()));
        for dataset in [
            LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed: 5 },
            LoadDataset::SharedPrefix { groups: 4, prefix_tokens: 512, suffix_tokens: 64, output_tokens: 8, seed: 6 },
            LoadDataset::Trace {
                file: "t.jsonl".into(),
                sha256: "ef".into(),
                format: TraceFormat::Mooncake,
                speed: 1.0,
            },
            LoadDataset::Trace { file: "t.jsonl".into(), sha256: "ef".into(), format: TraceFormat::Jsonl, speed: 2.5 },
            LoadDataset::MultiTurn { turns: 4, user_tokens: 50, output_tokens: 20, think_time_ms: 250, seed: 9 },
        ] {
            let spec = LoadSpec {
                dataset,
                ..LoadSpec::new(LoadDataset::Random { input_tokens: 1, output_tokens: 1, seed: 1 }, 3)
            };
            assert_eq!(LoadSpec::try_from(pb::LoadProfile::from(&spec)), Ok(spec.clone()));
        }
        // A profile from a controller that sent the arrival and endpoint as
        // strings (fields since reserved) has neither enum: refused, not
        // guessed.
        let old = pb::LoadProfile { arrival: 0, ..pb::LoadProfile::from(&spec) };
        assert_eq!(LoadSpec::try_from(old), Err(InvalidLoad::Arrival(0)));
        let old = pb::LoadProfile { endpoint: 0, ..pb::LoadProfile::from(&spec) };
        assert_eq!(LoadSpec::try_from(old), Err(InvalidLoad::Endpoint(0)));
        let trace = |format, speed| pb::LoadProfile {
            dataset: Some(pb::load_profile::Dataset::Trace(pb::TraceDataset {
                name: "t".into(),
                sha256: "ef".into(),
                format,
                speed,
            })),
            ..pb::LoadProfile::from(&spec)
        };
        assert_eq!(LoadSpec::try_from(trace(0, 1.0)), Err(InvalidLoad::TraceFormat(0)));
        assert_eq!(LoadSpec::try_from(trace(1, 0.0)), Err(InvalidLoad::TraceSpeed(0.0)));
        let no_turns = pb::LoadProfile {
            dataset: Some(pb::load_profile::Dataset::MultiTurn(pb::MultiTurnDataset {
                turns: 0,
                user_tokens: 5,
                output_tokens: 5,
                think_time_ms: 0,
                seed: 0,
            })),
            ..pb::LoadProfile::from(&spec)
        };
        assert_eq!(LoadSpec::try_from(no_turns), Err(InvalidLoad::Turns));
    }

    #[test]
    fn job_telemetry_crosses_the_wire_whole() {
        let mut r = crate::telemetry::Recorder::new(500);
        r.engine_scrape(0, Ok(vec![("vllm:num_requests_running".into(), 3.0)]));
        r.engine_scrape(1000, Err("GET /metrics answered 404".into()));
        let sample = crate::telemetry::GpuSample {
            uuid: "GPU-1".into(),
            sm_clock_mhz: Some(1410),
            sm_clock_max_mhz: Some(1980),
            memory_clock_max_mhz: Some(3201),
            power_w: Some(690.5),
            power_limit_w: Some(700.0),
            utilization_pct: Some(99),
            memory_used_bytes: Some(70 << 30),
            throttle_reasons: Some(0x4),
            pcie_gen: Some(4),
            pcie_width: Some(16),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            ..Default::default()
        };
        r.gpu_sample(0, 1, Ok(vec![sample]));
        r.gpu_sample(500, 1, Err("GPU-1: not found".into()));
        r.energy(&["GPU-1".into()], &[Some(9_000_000)], &[Some(9_001_035)], 1_500);
        let telemetry = r.finish(1500);
        assert!(telemetry.summary.gpus[0].held_down_reasons == ["sw_power_cap"], "{telemetry:?}");
        assert_eq!(telemetry.summary.energy_j, Some(1.035));
        assert_eq!(telemetry.summary.pcie_flags(), ["PCIe gen4 x16 under load, its maximum gen5 x16"]);
        let back = Telemetry::from(pb::JobTelemetry::from(&telemetry));
        assert_eq!(back, telemetry);
    }

    #[test]
    fn job_energy_crosses_the_wire_known_or_absent() {
        let mut r = crate::telemetry::Recorder::new(500);
        let gpus = ["GPU-1".to_owned(), "GPU-2".to_owned()];
        r.energy(&gpus, &[Some(5_000), Some(7)], &[Some(605_000), Some(60_007)], 1_000);
        let known = r.finish(1_000);
        let mut r = crate::telemetry::Recorder::new(500);
        r.energy(&gpus, &[Some(5_000), None], &[Some(605_000), None], 1_000);
        let absent = r.finish(1_000);
        assert_eq!((known.summary.energy_j, absent.summary.energy_j), (Some(660.0), None));
        for telemetry in [known, absent] {
            let wire = pb::JobTelemetry::from(&telemetry);
            let summary = wire.summary.as_ref().expect("a summary");
            assert_eq!(summary.energy_j, telemetry.summary.energy_j);
            assert_eq!(summary.gpus[1].energy_mj_start, telemetry.summary.gpus[1].energy_mj_start);
            assert_eq!(Telemetry::from(wire), telemetry);
        }
    }

    /// A distribution whose every field differs, from `n`.
    fn dist(n: f64) -> Distribution {
        Distribution {
            mean: n + 0.1,
            median: n + 0.2,
            p95: n + 0.3,
            p99: n + 0.4,
            count: n as u64 + 5,
            percentiles: vec![Percentile { p: 90.0, value: n + 0.5 }],
        }
    }

    /// Every field crosses the wire and comes back: a field added to one
    /// side and forgotten in a conversion fails here, not in a report.
    #[test]
    fn summaries_survive_the_wire_whole() {
        let s = Summary {
            successful: 1,
            failed: 2,
            max_concurrency: Some(3),
            duration_s: 4.5,
            total_input_tokens: 6,
            total_output_tokens: 7,
            request_throughput: 8.5,
            output_throughput: 9.5,
            peak_output_throughput: Some(10.5),
            peak_concurrent: 11,
            total_token_throughput: 12.5,
            latency_s: dist(13.0),
            ttft_ms: dist(14.0),
            tpot_ms: dist(15.0),
            itl_ms: dist(16.0),
            itl_per_token_ms: dist(17.0),
            latency_from_scheduled_s: dist(18.0),
            ttft_from_scheduled_ms: dist(19.0),
            connect_ms: dist(20.0),
            failures: Failures {
                http_error: 21,
                timeout: 22,
                cancelled: 23,
                incomplete: 24,
                transport_error: 25,
                disconnected: 26,
                malformed: 27,
            },
            failure_reasons: vec![
                crate::metrics::FailureReason { reason: "http 400: too long".into(), count: 20 },
                crate::metrics::FailureReason { reason: "first-token timeout".into(), count: 22 },
            ],
            excluded: 28,
            dispatch_lag_ms: dist(29.0),
            offered_rate: Some(30.5),
            achieved_rate: 31.5,
            cap_waits: 32,
            lag_limit_ms: 33.5,
            rate_tolerance: 0.1,
            goodput: Some(crate::metrics::Goodput {
                slo: crate::metrics::Slo { ttft_ms: Some(200.0), tpot_ms: None, e2el_ms: Some(5000.0) },
                good: 46,
                request_goodput: 4.75,
            }),
            usage_below_events: 48,
            steady_state: Some(crate::metrics::steady::SteadyState {
                reached: true,
                start_s: 49.5,
                end_s: 50.5,
                level: 51,
                held: 0.52,
                requests: 53,
                request_throughput: 54.5,
                output_throughput: 55.5,
                total_token_throughput: 56.5,
                mean_ttft_ms: 57.5,
                p99_ttft_ms: 58.5,
                mean_tpot_ms: 59.5,
                ttft_drift_pct: Some(-60.5),
                throughput_drift_pct: None,
            }),
            noise: Some(crate::metrics::noise::Noise {
                batches: 61,
                metrics: vec![crate::metrics::noise::MetricNoise {
                    metric: "mean_ttft_ms".into(),
                    se: 62.5,
                    batch_means: vec![62.75, 63.25],
                }],
                batch_requests: vec![u64::MAX, 1],
            }),
            sessions: Some(crate::metrics::sessions::Sessions {
                sessions: 63,
                turns: 64,
                by_turn: vec![crate::metrics::sessions::TurnFigures {
                    turn: 2,
                    successful: 65,
                    failed: 66,
                    mean_ttft_ms: 67.5,
                    mean_prompt_tokens: 68.5,
                }],
            }),
            usage_check: Some(crate::metrics::UsageCheck {
                prompts_compared: 40,
                prompts_off: 41,
                prompt_ratio: 0.42,
                outputs_compared: 43,
                outputs_off: 44,
                output_ratio: 0.45,
                outputs_by_events: 46,
            }),
            client_cpu_s: Some(34.5),
            invalid: Some("p99 dispatch lag 9.00 ms above 5.00 ms".into()),
        };
        assert_eq!(Summary::from(pb::Summary::from(&s)), s);
    }

    #[test]
    fn records_survive_the_wire_whole() {
        let r = RequestRecord {
            seq: 1,
            scheduled_ns: 2,
            sent_ns: 3,
            slot_ns: Some(4),
            connect_ns: Some(5),
            first_token_ns: Some(6),
            completed_ns: 7,
            chunks: vec![Chunk { at_ns: 6, tokens: 2 }, Chunk { at_ns: 7, tokens: 3 }].into(),
            prompt_tokens: 8,
            output_tokens: 5,
            outcome: Outcome::Malformed,
            http_status: Some(200),
            error: Some("malformed stream".into()),
            phase: Phase::Warmup,
            turn: None,
        };
        assert_eq!(RequestRecord::try_from(pb::RequestRecord::from(&r)).expect("valid"), r);
        let r = RequestRecord { turn: Some(Turn { session: 7, turn: 3 }), ..r };
        assert_eq!(RequestRecord::try_from(pb::RequestRecord::from(&r)).expect("valid"), r);
        // A session without its turn, or turn 0, is no place in a session.
        for (session, turn) in [(Some(7), None), (None, Some(3)), (Some(7), Some(0))] {
            let bad = pb::RequestRecord { session, turn, ..pb::RequestRecord::from(&r) };
            assert_eq!(RequestRecord::try_from(bad), Err(InvalidRecord::Turn { seq: 1 }));
        }
    }
}
