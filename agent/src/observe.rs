//! The agent's `--metrics-listen`: Prometheus `/metrics` (its GPUs as its
//! probe reads them at each scrape, and its session), `/healthz` (the
//! process answers) and `/readyz` (it holds a session with the controller
//! and is not leaving).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::gpu::{GpuInfo, GpuProbe, THROTTLE_REASONS};
use crate::session::{SessionStatus, Shared};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The registry; every gauge is set at each scrape.
pub struct AgentMetrics {
    registry: Registry,
    usable: Family<Labels, Gauge>,
    temperature: Family<Labels, Gauge>,
    sm_clock: Family<Labels, FloatGauge>,
    power: Family<Labels, FloatGauge>,
    throttle: Family<Labels, Gauge>,
    probe_ok: Gauge,
    connected: Gauge,
    leaving: Gauge,
    groups: Gauge,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        let mut m = AgentMetrics {
            registry: Registry::with_prefix("benchfleet_agent"),
            usable: Family::default(),
            temperature: Family::default(),
            sm_clock: Family::default(),
            power: Family::default(),
            throttle: Family::default(),
            probe_ok: Gauge::default(),
            connected: Gauge::default(),
            leaving: Gauge::default(),
            groups: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register("gpu_usable", "1 when the GPU passes this agent's policy, 0 when it does not", m.usable.clone());
        r.register("gpu_temperature_celsius", "GPU temperature", m.temperature.clone());
        r.register("gpu_sm_clock_hertz", "GPU SM clock", m.sm_clock.clone());
        r.register("gpu_power_watts", "GPU power draw", m.power.clone());
        r.register(
            "gpu_throttle_active",
            "1 while NVML reports the clocks-throttle reason, 0 while it does not",
            m.throttle.clone(),
        );
        r.register("gpu_probe_ok", "1 when the last scrape could read the GPUs", m.probe_ok.clone());
        r.register("session_connected", "1 while a session with the controller is open", m.connected.clone());
        r.register("leaving", "1 once the agent was told to leave (it takes no new work)", m.leaving.clone());
        r.register("groups_running", "Engine groups running on this host", m.groups.clone());
        m
    }
}

/// One scrape's GPU readings, merged from the inventory and a sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub usable: bool,
    pub temperature_c: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub power_w: Option<f64>,
    /// NVML's throttle reasons (keys of `THROTTLE_REASONS`), when read.
    pub throttle: Option<Vec<String>>,
}

/// Reads the GPUs: the inventory and verdicts, then a sample of each (the
/// simulated probe has readings only there). Blocks on NVML.
pub fn read_gpus(probe: &dyn GpuProbe) -> anyhow::Result<Vec<GpuReading>> {
    let gpus: Vec<GpuInfo> = probe.probe()?;
    let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
    let samples = probe.sample(&uuids).unwrap_or_default();
    Ok(gpus
        .iter()
        .map(|g| {
            let sample = samples.iter().find(|s| s.uuid == g.uuid);
            GpuReading {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.name.clone(),
                usable: g.usable(),
                temperature_c: sample.and_then(|s| s.temperature_c).or(g.temperature_c),
                sm_clock_mhz: sample.and_then(|s| s.sm_clock_mhz).or(g.sm_clock_mhz),
                power_w: sample.and_then(|s| s.power_w),
                throttle: sample
                    .and_then(|s| s.throttle_reasons)
                    .map(benchfleet_core::gpu::throttle_reason_keys)
                    .or_else(|| g.throttle_reasons.clone()),
            }
        })
        .collect())
}

impl AgentMetrics {
    /// The text exposition of these readings and this status.
    pub fn render(&self, gpus: Option<&[GpuReading]>, status: SessionStatus) -> String {
        for family in [&self.usable, &self.temperature, &self.throttle] {
            family.clear();
        }
        self.sm_clock.clear();
        self.power.clear();
        self.probe_ok.set(i64::from(gpus.is_some()));
        for g in gpus.unwrap_or_default() {
            let labels: Labels = vec![
                ("gpu".into(), g.index.to_string()),
                ("uuid".into(), g.uuid.clone()),
                ("model".into(), g.model.clone()),
            ];
            self.usable.get_or_create(&labels).set(i64::from(g.usable));
            if let Some(t) = g.temperature_c {
                self.temperature.get_or_create(&labels).set(i64::from(t));
            }
            if let Some(mhz) = g.sm_clock_mhz {
                self.sm_clock.get_or_create(&labels).set(f64::from(mhz) * 1e6);
            }
            if let Some(w) = g.power_w {
                self.power.get_or_create(&labels).set(w);
            }
            if let Some(active) = &g.throttle {
                let mut reasons: Vec<&str> = THROTTLE_REASONS.iter().map(|(_, key, _)| *key).collect();
                // A bit NVML added after this build is shown by its value.
                reasons.extend(active.iter().map(String::as_str).filter(|k| k.starts_with("unknown_")));
                for reason in reasons {
                    let mut labels = labels.clone();
                    labels.push(("reason".into(), reason.to_owned()));
                    self.throttle.get_or_create(&labels).set(i64::from(active.iter().any(|a| a == reason)));
                }
            }
        }
        self.connected.set(i64::from(status.connected));
        self.leaving.set(i64::from(status.leaving));
        self.groups.set(i64::try_from(status.running).unwrap_or(i64::MAX));
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Why the agent is not ready, or `None` when it is.
pub fn not_ready(status: SessionStatus) -> Option<&'static str> {
    if status.leaving {
        Some("leaving: this agent takes no new work")
    } else if !status.connected {
        Some("no session with the controller")
    } else {
        None
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until
/// `shutdown`.
pub async fn serve(
    gpus: Arc<dyn GpuProbe>,
    shared: Shared,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::{StatusCode, header};
    let metrics = Arc::new(AgentMetrics::default());
    let ready = shared.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let (metrics, gpus, shared) = (metrics.clone(), gpus.clone(), shared.clone());
                async move {
                    let read = tokio::task::spawn_blocking(move || read_gpus(gpus.as_ref())).await;
                    let readings = match read {
                        Ok(Ok(r)) => Some(r),
                        Ok(Err(e)) => {
                            tracing::warn!("metrics: cannot read the GPUs: {e:#}");
                            None
                        }
                        Err(_) => None,
                    };
                    let text = metrics.render(readings.as_deref(), shared.status());
                    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let status = ready.status();
                async move {
                    match not_ready(status) {
                        None => (StatusCode::OK, "ready\n".to_owned()),
                        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                    }
                }
            }),
        );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::SimGpuProbe;

    #[test]
    fn every_gpu_gauge_and_the_session_are_exposed() {
        let probe = SimGpuProbe::new("H200", 2, "host-a");
        let readings = read_gpus(&probe).expect("simulated GPUs read");
        assert_eq!(readings.len(), 2);
        let status = SessionStatus { connected: true, leaving: false, running: 1 };
        let text = AgentMetrics::default().render(Some(&readings), status);
        for name in [
            "benchfleet_agent_gpu_usable{gpu=\"0\",uuid=\"GPU-sim-host-a-0\",model=\"NVIDIA H200 (simulated)\"} 1",
            "benchfleet_agent_gpu_temperature_celsius{gpu=\"1\"",
            "benchfleet_agent_gpu_sm_clock_hertz{gpu=\"0\"",
            "benchfleet_agent_gpu_power_watts{gpu=\"0\"",
            "benchfleet_agent_gpu_probe_ok 1",
            "benchfleet_agent_session_connected 1",
            "benchfleet_agent_leaving 0",
            "benchfleet_agent_groups_running 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    #[test]
    fn throttle_reasons_are_one_series_each_and_gone_gpus_go() {
        let metrics = AgentMetrics::default();
        let gpu = |index: u32, throttle: Option<Vec<String>>| GpuReading {
            index,
            uuid: format!("GPU-{index}"),
            model: "NVIDIA H100 80GB HBM3".into(),
            usable: index == 0,
            throttle,
            ..GpuReading::default()
        };
        let active = vec!["sw_thermal_slowdown".to_owned(), "unknown_0x1000".to_owned()];
        let text = metrics.render(Some(&[gpu(0, Some(active)), gpu(1, None)]), SessionStatus::default());
        let line = |reason: &str| {
            format!(
                "benchfleet_agent_gpu_throttle_active{{gpu=\"0\",uuid=\"GPU-0\",model=\"NVIDIA H100 80GB HBM3\",reason=\"{reason}\"}}"
            )
        };
        assert!(text.contains(&format!("{} 1", line("sw_thermal_slowdown"))), "{text}");
        assert!(text.contains(&format!("{} 0", line("hw_slowdown"))), "{text}");
        assert!(text.contains(&format!("{} 1", line("unknown_0x1000"))), "{text}");
        assert!(!text.contains("gpu=\"1\",uuid=\"GPU-1\",model=\"NVIDIA H100 80GB HBM3\",reason"), "{text}");
        assert!(
            text.contains("benchfleet_agent_gpu_usable{gpu=\"1\",uuid=\"GPU-1\",model=\"NVIDIA H100 80GB HBM3\"} 0")
        );
        // A scrape that cannot read the GPUs drops their series.
        let text = metrics.render(None, SessionStatus::default());
        assert!(!text.contains("gpu=\"0\""), "{text}");
        assert!(text.contains("benchfleet_agent_gpu_probe_ok 0"), "{text}");
    }

    #[test]
    fn ready_means_connected_and_not_leaving() {
        assert_eq!(not_ready(SessionStatus { connected: true, leaving: false, running: 0 }), None);
        assert!(not_ready(SessionStatus::default()).is_some_and(|w| w.contains("no session")));
        assert!(
            not_ready(SessionStatus { connected: true, leaving: true, running: 2 })
                .is_some_and(|w| w.contains("leaving"))
        );
    }
}
