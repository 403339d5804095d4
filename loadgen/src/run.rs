//! One load run: warm up, dispatch every request at its deadline, collect
//! the records, summarize, and report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::client::{self, Endpoint, Target};
use crate::clock::Clock;
use crate::dataset::{self, Dataset};
use crate::metrics::{Summary, summarize};
use crate::record::RequestRecord;
use crate::schedule::{Arrival, send_times};
use crate::sink::{Sink, SinkConfig, SinkError};

/// Everything that defines a load run.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// The server's root, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    pub endpoint: Endpoint,
    pub model: String,
    pub dataset: Dataset,
    pub num_requests: usize,
    /// Requests per second; `None` or infinite sends them all at once.
    pub request_rate: Option<f64>,
    pub arrival: Arrival,
    /// At most this many requests in flight; a request due while the cap is
    /// reached waits for a slot, and its send time shows the wait. `None`
    /// means no cap at all: there is no hidden default.
    pub max_concurrency: Option<usize>,
    /// Sent as `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// Longest wait for response headers or the next bytes of a stream.
    pub idle_timeout: Duration,
    /// Longest time one request may take from its send.
    pub total_timeout: Duration,
    /// Live counters for a progress display, if the caller wants one.
    pub progress: Option<Arc<Progress>>,
}

impl LoadConfig {
    /// A run of `num_requests` sent all at once, without cap or key, with
    /// generous timeouts (like `vllm bench serve`'s).
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        dataset: Dataset,
        num_requests: usize,
    ) -> LoadConfig {
        LoadConfig {
            base_url: base_url.into(),
            endpoint: Endpoint::Completions,
            model: model.into(),
            dataset,
            num_requests,
            request_rate: None,
            arrival: Arrival::Constant,
            max_concurrency: None,
            api_key: None,
            idle_timeout: Duration::from_secs(600),
            total_timeout: Duration::from_secs(6 * 3600),
            progress: None,
        }
    }
}

/// Counters updated as requests finish; lock-free, read from anywhere.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    /// Requests finished so far (any outcome).
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Finished requests that did not succeed.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// One per request, in schedule order.
    pub records: Vec<RequestRecord>,
    pub summary: Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid load configuration: {0}")]
    Config(String),
    #[error("cannot build the http client")]
    Client(#[source] reqwest::Error),
    #[error("cannot reach the server at {url}; is it running?")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered http {status}: {body}")]
    Models { url: String, status: u16, body: String },
    #[error("model {model:?} is not served by {url} (it serves: {served})")]
    ModelNotServed { model: String, url: String, served: String },
    #[error(transparent)]
    Sink(SinkError),
    #[error("{unacked} of {total} records were not acknowledged by the controller")]
    Unacknowledged {
        unacked: u64,
        total: u64,
        #[source]
        source: SinkError,
    },
    #[error("a request task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Runs the load: checks the server serves the model, opens connections,
/// sends every request at its deadline and records it. With a sink, returns
/// only once the controller has acknowledged every record and the summary.
pub async fn run(config: LoadConfig, sink: Option<SinkConfig>) -> Result<LoadResult, LoadError> {
    if config.num_requests == 0 {
        return Err(LoadError::Config("the number of requests must be at least 1".into()));
    }
    if config.request_rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err(LoadError::Config("the request rate must be positive".into()));
    }
    if config.max_concurrency == Some(0) {
        return Err(LoadError::Config("the concurrency cap must be at least 1".into()));
    }

    // Everything costly happens before the measured window: prompts, bodies,
    // the schedule, connections, the sink's stream.
    let prompts = dataset::prompts(&config.dataset, config.num_requests);
    let requests: Vec<(String, u32)> =
        prompts.iter().map(|p| (client::request_body(config.endpoint, &config.model, p), p.words)).collect();
    drop(prompts);
    let deadlines = send_times(requests.len(), config.request_rate, config.arrival);
    let in_flight = config.max_concurrency.unwrap_or(requests.len()).min(requests.len());
    let http = build_client(in_flight)?;
    warm_up(&http, &config, in_flight.min(WARM_CONNECTIONS)).await?;
    let sink = match sink {
        Some(sink) => Some(Sink::start(sink).await.map_err(LoadError::Sink)?),
        None => None,
    };

    let clock = Clock::start();
    let target = Arc::new(Target {
        client: http,
        url: format!("{}{}", config.base_url.trim_end_matches('/'), config.endpoint.path()),
        api_key: config.api_key.clone(),
        idle_timeout: config.idle_timeout,
        total_timeout: config.total_timeout,
        clock,
    });
    let slots = config.max_concurrency.map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))));
    let sink_tx = sink.as_ref().map(Sink::sender);
    let mut tasks = Vec::with_capacity(requests.len());
    for (seq, ((body, words), deadline)) in requests.into_iter().zip(deadlines).enumerate() {
        tokio::time::sleep_until(clock.at(deadline)).await;
        // Waiting for a slot delays the send, not the schedule: both times
        // are recorded.
        let permit = match &slots {
            Some(slots) => Some(
                Arc::clone(slots)
                    .acquire_owned()
                    .await
                    .map_err(|_| LoadError::Config("the concurrency limiter closed".into()))?,
            ),
            None => None,
        };
        let (target, progress, sink_tx) = (Arc::clone(&target), config.progress.clone(), sink_tx.clone());
        let scheduled_ns = i64::try_from(deadline.as_nanos()).unwrap_or(i64::MAX);
        tasks.push(tokio::spawn(async move {
            let record = client::send(&target, seq as u64, scheduled_ns, body, words).await;
            drop(permit);
            if let Some(progress) = progress {
                progress.done.fetch_add(1, Ordering::Relaxed);
                if !record.outcome.is_ok() {
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(tx) = sink_tx {
                tx.record(record.clone());
            }
            record
        }));
    }
    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        records.push(task.await.map_err(LoadError::Task)?);
    }

    let cap = config.max_concurrency.map(|n| n as u64);
    let summary = summarize(&records, cap);
    if let Some(sink) = sink {
        drop(sink_tx);
        sink.finish(summary.clone()).await.map_err(|source| LoadError::Unacknowledged {
            unacked: (records.len() as u64).saturating_sub(source.acked()),
            total: records.len() as u64,
            source,
        })?;
    }
    Ok(LoadResult { records, summary })
}

/// Most connections opened before the run: enough for the first wave of
/// most profiles without hammering the server with warm-up requests.
const WARM_CONNECTIONS: usize = 256;

fn build_client(in_flight: usize) -> Result<reqwest::Client, LoadError> {
    // reqwest panics without a rustls provider, even for plain http; the
    // binary installs ring, and an in-process caller may not have.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(in_flight.max(1))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(LoadError::Client)
}

#[derive(Deserialize)]
struct Models {
    data: Vec<Model>,
}

#[derive(Deserialize)]
struct Model {
    id: String,
}

/// Checks that the server serves the model, on `connections` parallel
/// requests so that as many connections are open before the run.
async fn warm_up(http: &reqwest::Client, config: &LoadConfig, connections: usize) -> Result<(), LoadError> {
    let url = format!("{}/v1/models", config.base_url.trim_end_matches('/'));
    let get = || async {
        let mut request = http.get(&url).timeout(Duration::from_secs(30));
        if let Some(key) = &config.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|source| LoadError::Unreachable { url: url.clone(), source })?;
        let status = response.status();
        let body = response.bytes().await.map_err(|source| LoadError::Unreachable { url: url.clone(), source })?;
        if !status.is_success() {
            let body = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            return Err(LoadError::Models { url: url.clone(), status: status.as_u16(), body });
        }
        Ok(body)
    };
    let body = get().await?;
    let served = serde_json::from_slice::<Models>(&body).map(|m| m.data).unwrap_or_default();
    if !served.iter().any(|m| m.id == config.model) {
        let served: Vec<&str> = served.iter().map(|m| m.id.as_str()).collect();
        return Err(LoadError::ModelNotServed {
            model: config.model.clone(),
            url: url.clone(),
            served: if served.is_empty() { "nothing".into() } else { served.join(", ") },
        });
    }
    let rest = futures_util::future::join_all((1..connections).map(|_| get())).await;
    rest.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(())
}
