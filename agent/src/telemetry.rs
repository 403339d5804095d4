//! A job's telemetry, taken while its loadgen runs: the engine's `/metrics`
//! scraped every second (and once more after loadgen exits, so a counter's
//! increase covers every request) and the group's GPUs read every 500 ms through the
//! `GpuProbe`, into a `benchfleet_core::telemetry::Recorder`. A scrape or a
//! reading that fails is counted, with its reason, and never fails the job.
//! The GPUs' energy counters are read once as the load run starts and once
//! as it ends (after loadgen exits, not from the engine's startup): a
//! counter that cannot be read leaves the job's energy unknown.

use std::sync::Arc;
use std::time::Duration;

use benchfleet_core::telemetry::{Recorder, Telemetry, engine_series, read_metrics};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::gpu::GpuProbe;

/// How often each source is read.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub scrape_every: Duration,
    pub sample_every: Duration,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { scrape_every: Duration::from_secs(1), sample_every: Duration::from_millis(500) }
    }
}

/// What the telemetry of one job reads.
#[derive(Clone)]
pub struct Sources {
    pub http: reqwest::Client,
    /// The engine's base URL.
    pub base_url: String,
    /// "vllm" or "sglang": which series its `/metrics` has.
    pub kind: String,
    pub gpus: Arc<dyn GpuProbe>,
    /// The group's GPUs.
    pub uuids: Vec<String>,
}

/// The longest one reading of the energy counters may take: a GPU that
/// hangs leaves the job's energy unknown rather than holding up its end.
const ENERGY_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads `sources` until `stop` fires; returns what was read. The energy
/// counters are read first and last.
pub async fn record(sources: Sources, sampling: Sampling, stop: CancellationToken) -> Telemetry {
    let interval_ms = u32::try_from(sampling.sample_every.as_millis()).unwrap_or(u32::MAX);
    let mut recorder = Recorder::new(interval_ms);
    let (energy_start, energy_from) = read_energy(&sources).await;
    let started = Instant::now();
    let since = |started: Instant| u32::try_from(started.elapsed().as_millis()).unwrap_or(u32::MAX);
    let mut scrapes = tokio::time::interval(sampling.scrape_every);
    let mut samples = tokio::time::interval(sampling.sample_every);
    scrapes.set_missed_tick_behavior(MissedTickBehavior::Delay);
    samples.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // A scrape may take at most most of its period, so the readings stay regular.
    let timeout = sampling.scrape_every.mul_f64(0.8);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = scrapes.tick() => {
                let t = since(started);
                let scraped = tokio::select! {
                    () = stop.cancelled() => break,
                    r = scrape(&sources, timeout) => r,
                };
                if let Ok(values) = &scraped {
                    let running = values.iter().find(|(name, _)| {
                        name == "vllm:num_requests_running" || name == "sglang:num_running_reqs"
                    });
                    sources.gpus.engine_load(&sources.uuids, running.map_or(0.0, |(_, v)| *v));
                }
                recorder.engine_scrape(t, scraped);
            }
            _ = samples.tick() => {
                let t = since(started);
                let (gpus, uuids) = (sources.gpus.clone(), sources.uuids.clone());
                let read = tokio::task::spawn_blocking(move || gpus.sample(&uuids));
                let sampled = tokio::select! {
                    () = stop.cancelled() => break,
                    r = read => match r {
                        Ok(Ok(samples)) => Ok(samples),
                        Ok(Err(e)) => Err(format!("{e:#}")),
                        Err(e) => Err(format!("the GPU reading did not finish: {e}")),
                    },
                };
                recorder.gpu_sample(t, sources.uuids.len(), sampled);
            }
        }
    }
    // The engine's counters once more, after the last request: a job's
    // increase runs from the first scrape (before its first request) to
    // this one.
    let t = since(started);
    let scraped = scrape(&sources, timeout).await;
    recorder.engine_scrape(t, scraped);
    let (energy_end, energy_to) = read_energy(&sources).await;
    let energy_ms = u64::try_from(energy_to.saturating_duration_since(energy_from).as_millis()).unwrap_or(u64::MAX);
    recorder.energy(&sources.uuids, &energy_start, &energy_end, energy_ms);
    recorder.finish(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// The group's GPUs' energy counters, mJ, and when they were read (the
/// system's monotonic clock, not tokio's, which a test may pause); every one
/// `None` when the reading failed or took too long.
async fn read_energy(sources: &Sources) -> (Vec<Option<u64>>, std::time::Instant) {
    let (gpus, uuids) = (sources.gpus.clone(), sources.uuids.clone());
    let read = tokio::task::spawn_blocking(move || gpus.energy_mj(&uuids).map(|mj| (mj, std::time::Instant::now())));
    let why = match tokio::time::timeout(ENERGY_READ_TIMEOUT, read).await {
        Ok(Ok(Ok((mj, at)))) if mj.len() == sources.uuids.len() => return (mj, at),
        Ok(Ok(Ok((mj, _)))) => format!("{} counters for {} GPUs", mj.len(), sources.uuids.len()),
        Ok(Ok(Err(e))) => format!("{e:#}"),
        Ok(Err(e)) => format!("the reading did not finish: {e}"),
        Err(_) => format!("no answer within {} s", ENERGY_READ_TIMEOUT.as_secs()),
    };
    warn!("cannot read the GPUs' energy counters: {why}");
    (vec![None; sources.uuids.len()], std::time::Instant::now())
}

/// One scrape of the engine's `/metrics`: the values of its kind's series.
async fn scrape(sources: &Sources, timeout: Duration) -> Result<Vec<(String, f64)>, String> {
    let url = format!("{}/metrics", sources.base_url);
    let response =
        sources.http.get(&url).timeout(timeout).send().await.map_err(|e| format!("GET /metrics failed: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET /metrics answered {}", response.status()));
    }
    let text = response.text().await.map_err(|e| format!("GET /metrics: the body could not be read: {e}"))?;
    read_metrics(&text, engine_series(&sources.kind)).map_err(|e| format!("GET /metrics: {e}"))
}
