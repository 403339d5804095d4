//! Prometheus `/metrics`: agents by liveness, jobs of the runs in progress
//! by state, the queue, the store's size (read at each scrape), and what
//! ingest stored and how long its flushes took (counted as it happens).

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::driver::Controller;
use crate::ingest::IngestMetrics;
use benchfleet_study::model::JobState;

type Labels = Vec<(String, String)>;

/// The registry and the gauges set at each scrape.
pub struct Metrics {
    registry: Registry,
    agents: Family<Labels, Gauge>,
    jobs: Family<Labels, Gauge>,
    queue: Gauge,
    runs: Gauge,
    store_bytes: Gauge,
    holding: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new(ingest: &IngestMetrics) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("benchfleet"),
            agents: Family::default(),
            jobs: Family::default(),
            queue: Gauge::default(),
            runs: Gauge::default(),
            store_bytes: Gauge::default(),
            holding: Gauge::default(),
        };
        let registry = &mut m.registry;
        registry.register("agents", "Agents by liveness (ready, suspect, disconnected, lost)", m.agents.clone());
        registry.register("jobs", "Jobs of the runs in progress, by state", m.jobs.clone());
        registry.register("queue_groups", "Engine groups waiting for an agent", m.queue.clone());
        registry.register("runs_in_progress", "Runs not yet over", m.runs.clone());
        registry.register("store_bytes", "The store's size on disk", m.store_bytes.clone());
        registry.register(
            "lease_losses_held",
            "1 while most agents are silent at once and no lease is declared lost",
            m.holding.clone(),
        );
        registry.register("ingested_records", "Request records stored", ingest.records.clone());
        registry.register("ingested_batches", "Record batches stored", ingest.batches.clone());
        registry.register("refused_batches", "Record batches refused (stale attempts)", ingest.refused.clone());
        registry.register(
            "record_commit_seconds",
            "One group commit of records: write and flush",
            ingest.commit_seconds.clone(),
        );
        m
    }

    /// The text exposition, with the scrape-time gauges read now.
    pub async fn render(&self, c: &Controller) -> String {
        let snapshot = c
            .query(|s, now| {
                let mut agents = std::collections::BTreeMap::<&'static str, i64>::new();
                for id in s.agent_ids() {
                    if let Some(v) = s.agent_view(id, now) {
                        *agents.entry(v.liveness.as_str()).or_default() += 1;
                    }
                }
                let mut jobs = std::collections::HashMap::<JobState, i64>::new();
                let mut runs = 0;
                for run in s.run_ids() {
                    if let Some((r, js, _)) = s.run_jobs(run) {
                        runs += i64::from(!r.is_over());
                        for j in js {
                            *jobs.entry(j.state).or_default() += 1;
                        }
                    }
                }
                (agents, jobs, runs, s.queue_len() as i64, s.holding())
            })
            .await;
        if let Ok((agents, jobs, runs, queue, holding)) = snapshot {
            for state in ["ready", "suspect", "disconnected", "lost"] {
                self.agents
                    .get_or_create(&vec![("state".to_owned(), state.to_owned())])
                    .set(agents.get(state).copied().unwrap_or(0));
            }
            for state in JobState::ALL {
                self.jobs
                    .get_or_create(&vec![("state".to_owned(), state.as_str().to_owned())])
                    .set(jobs.get(&state).copied().unwrap_or(0));
            }
            self.runs.set(runs);
            self.queue.set(queue);
            self.holding.set(i64::from(holding));
        }
        let store = c.store().clone();
        if let Ok(Ok(bytes)) = tokio::task::spawn_blocking(move || store.size_on_disk()).await {
            self.store_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves `GET /metrics`, and `/healthz` (the process answers) and
/// `/readyz` (the store reads and the scheduler answers) for probes that
/// cannot present a client certificate (kubelet's), on `listener` until
/// `shutdown`.
pub async fn serve(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = Arc::new(Metrics::new(&controller.ingest.metrics));
    let ready = controller.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (metrics, controller) = (metrics.clone(), controller.clone());
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    metrics.render(&controller).await,
                )
            }
        }),
    );
    let app = app.route("/healthz", axum::routing::get(|| async { "ok\n" })).route(
        "/readyz",
        axum::routing::get(move || {
            let controller = ready.clone();
            async move {
                use axum::http::StatusCode;
                let store = controller.store().clone();
                let stored = tokio::task::spawn_blocking(move || store.counters()).await;
                let scheduling = controller.query(|_, _| ()).await;
                match (stored, scheduling) {
                    (Ok(Ok(_)), Ok(())) if !controller.shutdown.is_cancelled() => {
                        (StatusCode::OK, "ready\n".to_owned())
                    }
                    (Ok(Err(e)), _) => (StatusCode::SERVICE_UNAVAILABLE, format!("the store cannot be read: {e}\n")),
                    _ => (StatusCode::SERVICE_UNAVAILABLE, "the scheduler is not running\n".to_owned()),
                }
            }
        }),
    );
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
