//! One load run: open connections, dispatch every request at its deadline,
//! collect the records, summarize, and report.
//!
//! The requests run on `workers` event loops (the caller's alone, or one
//! thread each): worker `w` sends requests `w`, `w + workers`, ... at their
//! absolute deadlines on the run's one clock, with its own share of the cap
//! and its own connections. Each worker's dispatcher owns its schedule, its
//! in-flight count and its idle connections; its request tasks hand their
//! record and connection back over a channel. So the cap needs no shared
//! semaphore and connection reuse no shared pool; the one lock is the
//! summary's, taken once as a request goes and once as its record comes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::client::{
    self, BodyOptions, Conn, Endpoint, Request, RequestHead, Target, Timeouts, Tls, Transport, UsageTally,
};
use crate::clock::{self, Clock};
use crate::dataset::{self, Dataset, TokenCounter};
use crate::metrics::{DEFAULT_PERCENTILES, DEFAULT_RATE_TOLERANCE, Summary, SummaryBuilder, SummaryOptions};
use crate::record::{Phase, RequestRecord};
use crate::schedule::{Arrival, send_times};
use crate::session::{NextTurn, Session};
use crate::sink::{RecordSender, Sink, SinkConfig, SinkError};

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
    /// A PEM file of CA certificates trusted for an https target, besides
    /// the system's.
    pub ca_cert: Option<PathBuf>,
    /// Longest wait for the next bytes of a stream once the first token came.
    pub idle_timeout: Duration,
    /// Longest time one request may take from its send.
    pub total_timeout: Duration,
    /// Longest wait for a new connection.
    pub connect_timeout: Duration,
    /// Longest wait from the send to the first token.
    pub first_token_timeout: Duration,
    /// Ask for a streamed response (SSE); without it each response is one
    /// chunk and TTFT equals the latency.
    pub stream: bool,
    /// Extra top-level fields of every request body (they override ours).
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// Counts tokens where the server gives no usage, and makes random prompts
    /// of exact token counts.
    pub tokens: TokenCounter,
    /// The first requests, or the first seconds, are sent and recorded but
    /// not measured.
    pub warmup: Window,
    /// The last requests, or the last seconds, likewise.
    pub cooldown: Window,
    /// Stop sending after this long; requests still in flight then are
    /// cancelled (and recorded as such).
    pub max_duration: Option<Duration>,
    /// The P99 dispatch lag above which the run is marked invalid, ms;
    /// `None`: the one its load kind gives (`metrics::lag_limit_for`).
    pub lag_limit_ms: Option<f64>,
    /// The share of the offered rate the achieved rate may fall short by
    /// (with no binding cap) before the run is marked invalid.
    pub rate_tolerance: f64,
    /// The percentiles (0..=100) every distribution of the summary carries.
    pub percentiles: Vec<f64>,
    /// vLLM's goodput SLOs: the summary counts the requests within them.
    pub goodput: Option<crate::metrics::Slo>,
    /// Cancelling it ends the run early: nothing more is sent, requests in
    /// flight are recorded as cancelled.
    pub stop: CancellationToken,
    /// Live counters for a progress display, if the caller wants one.
    pub progress: Option<Arc<Progress>>,
    /// Keep every record for [`LoadResult::records`]. Without it the run
    /// holds a few numbers a request (the summary is built as the records
    /// come in, and they go to the sink as they do), so its memory grows
    /// with the requests in flight, not with the run's length.
    pub keep_records: bool,
    /// Threads the requests run on, each with its own event loop and
    /// connections and every `workers`th request of the schedule (at most
    /// one a request, and one a slot of the cap). 1: the caller's runtime,
    /// no thread of its own.
    pub workers: usize,
}

/// A part of the run at its start or end, by request count or by time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Window {
    #[default]
    None,
    Requests(usize),
    Time(Duration),
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
            ca_cert: None,
            idle_timeout: Duration::from_secs(600),
            total_timeout: Duration::from_secs(6 * 3600),
            connect_timeout: Duration::from_secs(10),
            first_token_timeout: Duration::from_secs(600),
            stream: true,
            extra_body: serde_json::Map::new(),
            tokens: TokenCounter::Words,
            warmup: Window::None,
            cooldown: Window::None,
            max_duration: None,
            lag_limit_ms: None,
            rate_tolerance: DEFAULT_RATE_TOLERANCE,
            percentiles: DEFAULT_PERCENTILES.to_vec(),
            goodput: None,
            stop: CancellationToken::new(),
            progress: None,
            keep_records: true,
            workers: 1,
        }
    }
}

/// Counters updated as requests finish; lock-free, read from anywhere.
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    /// Requests sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

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
    /// One per request sent, in schedule order; empty unless the run was
    /// asked to keep them ([`LoadConfig::keep_records`]).
    pub records: Vec<RequestRecord>,
    pub summary: Summary,
    /// The error of the earliest request (by schedule) that failed with one.
    pub first_error: Option<String>,
}

impl LoadResult {
    /// What to say of a run in which requests were sent and none succeeded:
    /// it measured nothing, whatever its block shows.
    pub fn none_succeeded(&self) -> Option<String> {
        let s = &self.summary;
        if s.successful > 0 || s.failed == 0 {
            return None;
        }
        let f = &s.failures;
        let counts: Vec<String> = [
            ("http_error", f.http_error),
            ("timeout", f.timeout),
            ("cancelled", f.cancelled),
            ("incomplete", f.incomplete),
            ("transport_error", f.transport_error),
            ("disconnected", f.disconnected),
            ("malformed", f.malformed),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what} {n}"))
        .collect();
        let first = self.first_error.as_deref().unwrap_or("no error was recorded");
        Some(format!("all {} requests failed ({}); the first: {first}", s.failed, counts.join(", ")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid load configuration: {0}")]
    Config(String),
    #[error("cannot build the http client")]
    Client(#[source] reqwest::Error),
    #[error("cannot reach the server at {url}; {hint}")]
    Unreachable {
        url: String,
        /// What to check first.
        hint: &'static str,
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
    #[error("invalid base url {url}: {reason}")]
    BaseUrl { url: String, reason: String },
    #[error("cannot open connection {n} to {addr} before the run: {error}")]
    Connect { n: usize, addr: String, error: client::RequestError },
    #[error("{0}")]
    Tls(String),
    #[error("cannot start a thread of the run (request bodies, or a worker)")]
    Thread(#[source] std::io::Error),
}

/// Runs the load: checks the server serves the model, opens connections,
/// sends every request at its deadline and records it. With a sink, returns
/// only once the controller has acknowledged every record and the summary.
pub async fn run(mut config: LoadConfig, sink: Option<SinkConfig>) -> Result<LoadResult, LoadError> {
    check(&config)?;

    // Everything costly happens before the measured window: the schedule,
    // connections, the sink's stream, and the first request bodies (all of
    // them, for a run whose bodies fit in `AHEAD_BYTES`; the rest are made
    // on a thread of their own as the run goes).
    // The dataset moves to that thread; the config keeps an empty one.
    let dataset =
        std::mem::replace(&mut config.dataset, Dataset::Random { input_tokens: 0, output_tokens: 0, seed: 0 });
    // A trace's schedule is its own; a multi-turn dataset's is of its
    // sessions' first turns (the cap, of the sessions under way).
    let schedule = dataset.send_times(config.num_requests);
    let sessions = dataset.sessions(config.num_requests).is_some();
    let prompts = dataset::prompt_iter(dataset, config.num_requests, config.tokens.clone());
    let count = prompts.size_hint().0;
    let cap = config.max_concurrency.unwrap_or(usize::MAX);
    let workers = config.workers.clamp(1, count.clamp(1, cap));
    let shape = Arc::new(BodyShape::of(&config));
    let (bodies, ready) = prepare(prompts, Arc::clone(&shape), workers)?;
    let deadlines: Arc<[Duration]> =
        schedule.unwrap_or_else(|| send_times(count, config.request_rate, config.arrival)).into();
    let first_wave = config.max_concurrency.unwrap_or(WARM_CONNECTIONS).min(count);
    let roots = match &config.ca_cert {
        Some(path) => read_roots(path)?,
        None => Vec::new(),
    };
    check_model(&build_client(&roots)?, &config).await?;
    let transport = Arc::new(transport(&config, &roots).await?);
    let options = SummaryOptions {
        max_concurrency: config.max_concurrency.map(|n| n as u64),
        lag_limit_ms: config.lag_limit_ms,
        rate_tolerance: config.rate_tolerance,
        percentiles: config.percentiles.clone(),
        goodput: config.goodput,
    };
    let collected = Arc::new(Mutex::new(Collected::new(
        workers,
        SummaryBuilder::new(options),
        config.keep_records.then(|| Vec::with_capacity(config.num_requests)),
    )));
    let phases = Arc::new(Phases::new(&config, &deadlines, sessions));

    // Each worker opens its share of the first wave's connections on its
    // own event loop, then waits for the run's clock to start.
    let (go, started) = watch::channel(None::<Go>);
    let mut opened = Vec::with_capacity(workers);
    let mut running = Vec::with_capacity(workers);
    for (index, bodies) in bodies.into_iter().enumerate() {
        let (opened_tx, opened_rx) = oneshot::channel();
        opened.push(opened_rx);
        let lane = Lane {
            index,
            of: workers,
            cap: share(cap, index, workers),
            end: config.max_duration,
            progress: config.progress.clone(),
            shape: Arc::clone(&shape),
        };
        let work = worker(
            lane,
            (Arc::clone(&transport), config.connect_timeout, share(first_wave, index, workers)),
            opened_tx,
            started.clone(),
            bodies,
            (Arc::clone(&deadlines), Arc::clone(&phases)),
            Arc::clone(&collected),
        );
        running.push(Running::start(work, workers, index)?);
    }
    drop(started);
    let usage = config.tokens.needs_text().then(|| (UsageTally::default(), config.endpoint == Endpoint::Completions));
    let begin = async {
        // Dropped when the start fails, and the workers then end.
        let go = go;
        for opened in opened {
            // A worker that ended without a word has panicked: its join says why.
            opened.await.unwrap_or(Ok(()))?;
        }
        let sink = match sink {
            Some(sink) => Some(Sink::start(sink, config.stop.clone()).await.map_err(LoadError::Sink)?),
            None => None,
        };
        let _ = ready.await;
        let target = Arc::new(Target {
            transport: Arc::clone(&transport),
            stream: config.stream,
            timeouts: Timeouts {
                connect: config.connect_timeout,
                first_token: config.first_token_timeout,
                idle: config.idle_timeout,
                total: config.total_timeout,
            },
            clock: Clock::start(),
            counter: config.tokens.clone(),
            cancel: config.stop.child_token(),
            usage,
            below_events: AtomicU64::new(0),
        });
        let cpu_before = clock::cpu_time();
        let _ = go.send(Some(Go { target: Arc::clone(&target), sink: sink.as_ref().map(Sink::sender) }));
        Ok::<_, LoadError>((target, sink, cpu_before))
    };
    // The workers on the caller's runtime (one, with no thread of its own)
    // run beside the start: they wait for it.
    let (begun, ()) = tokio::join!(begin, Running::run_inline(&mut running));
    for worker in running {
        worker.join().await;
    }
    let (target, sink, cpu_before) = begun?;
    let target_usage = target.usage.as_ref().map(|(tally, _)| tally.check());
    let cpu = cpu_before.zip(clock::cpu_time()).map(|(a, b)| b.saturating_sub(a).as_secs_f64());

    let Collected { summary, records, .. } = Arc::into_inner(collected)
        .expect("the workers have ended")
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let first_error = summary.first_error().map(str::to_owned);
    let taken = summary.records();
    let mut summary = summary.finish();
    let mut records = records.unwrap_or_default();
    records.sort_unstable_by_key(|r| r.seq);
    summary.client_cpu_s = cpu;
    summary.usage_check = target_usage;
    summary.usage_below_events = target.below_events.load(Ordering::Relaxed);
    if let Some(sink) = sink {
        sink.finish(summary.clone()).await.map_err(|source| match source {
            // Not a matter of acknowledgements: the attempt is over.
            SinkError::Refused { .. } => LoadError::Sink(source),
            source => LoadError::Unacknowledged { unacked: taken.saturating_sub(source.acked()), total: taken, source },
        })?;
    }
    Ok(LoadResult { records, summary, first_error })
}

/// The `index`th of `of` shares of `total`: the first ones take the rest.
fn share(total: usize, index: usize, of: usize) -> usize {
    if total == usize::MAX { total } else { total / of + usize::from(index < total % of) }
}

/// What a worker needs once the run's clock has started.
#[derive(Clone)]
struct Go {
    target: Arc<Target>,
    sink: Option<RecordSender>,
}

/// A worker's part of the run.
struct Lane {
    /// It sends requests `index`, `index + of`, `index + 2 of`, ...
    index: usize,
    of: usize,
    /// Its share of the concurrency cap.
    cap: usize,
    /// Sending stops this long after the start.
    end: Option<Duration>,
    progress: Option<Arc<Progress>>,
    /// Its sessions' later turns are made here.
    shape: Arc<BodyShape>,
}

/// One worker: opens its connections, says so, waits for the clock, and
/// sends its share of the schedule; gives up quietly when the run does not
/// start (another worker could not connect, or the sink could not).
async fn worker(
    lane: Lane,
    (transport, timeout, warm): (Arc<Transport>, Duration, usize),
    opened: oneshot::Sender<Result<(), LoadError>>,
    mut started: watch::Receiver<Option<Go>>,
    bodies: mpsc::Receiver<Prepared>,
    (deadlines, phases): (Arc<[Duration]>, Arc<Phases>),
    collected: Arc<Mutex<Collected>>,
) {
    let idle = match open_connections(&transport, timeout, warm).await {
        Ok(idle) => {
            let _ = opened.send(Ok(()));
            idle
        }
        Err(e) => {
            let _ = opened.send(Err(e));
            return;
        }
    };
    let Ok(go) = started.wait_for(Option::is_some).await.map(|go| go.clone()) else {
        return;
    };
    let Some(Go { target, sink }) = go else {
        return;
    };
    dispatch(target, &lane, bodies, &deadlines, &phases, idle, sink, &collected).await;
}

/// A worker as it runs: on the caller's runtime (the only one), or on a
/// thread of its own with a runtime of its own.
enum Running {
    Inline(Option<Pin<Box<dyn Future<Output = ()> + Send>>>),
    Thread(std::thread::JoinHandle<()>),
}

impl Running {
    fn start(
        work: impl Future<Output = ()> + Send + 'static,
        workers: usize,
        index: usize,
    ) -> Result<Running, LoadError> {
        if workers == 1 {
            return Ok(Running::Inline(Some(Box::pin(work))));
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(LoadError::Thread)?;
        let thread = std::thread::Builder::new()
            .name(format!("loadgen-{index}"))
            .spawn(move || runtime.block_on(work))
            .map_err(LoadError::Thread)?;
        Ok(Running::Thread(thread))
    }

    /// Runs the inline workers to their end.
    async fn run_inline(running: &mut [Running]) {
        for worker in running {
            if let Running::Inline(work) = worker
                && let Some(work) = work.take()
            {
                work.await;
            }
        }
    }

    /// Waits for a thread's end; its panic is the caller's.
    async fn join(self) {
        if let Running::Thread(thread) = self {
            match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
    }
}

/// The bodies of the requests as they are sent, one queue a worker (request
/// `seq` in queue `seq % lanes`), made on a thread of their own at most a
/// few megabytes ahead, and a signal that the first of them (every one of
/// a short run) are ready.
fn prepare(
    mut prompts: Box<dyn Iterator<Item = dataset::Prompt> + Send>,
    shape: Arc<BodyShape>,
    lanes: usize,
) -> Result<(Vec<mpsc::Receiver<Prepared>>, oneshot::Receiver<()>), LoadError> {
    let (ready_tx, ready) = oneshot::channel();
    let make = move |p: dataset::Prompt| Prepared {
        body: Bytes::from(client::request_body(&shape.options(), &p)),
        prompt_tokens: p.tokens,
        max_tokens: p.max_tokens,
        session: p.session,
    };
    let Some(first) = prompts.next().map(&make) else {
        let _ = ready_tx.send(());
        return Ok(((0..lanes).map(|_| mpsc::channel(1).1).collect(), ready));
    };
    let ahead = (AHEAD_BYTES / first.body.len().max(1)).max(MIN_AHEAD);
    let (tx, bodies): (Vec<_>, Vec<_>) = (0..lanes).map(|_| mpsc::channel(ahead.div_ceil(lanes))).unzip();
    let _ = tx[0].try_send(first);
    let work = move || {
        let mut ready_tx = Some(ready_tx);
        for (made, prompt) in (1..).zip(prompts) {
            if tx[made % lanes].blocking_send(make(prompt)).is_err() {
                return;
            }
            if made + 1 >= ahead {
                ready_tx.take().map(|ready| ready.send(()));
            }
        }
    };
    std::thread::Builder::new().name("loadgen-bodies".into()).spawn(work).map_err(LoadError::Thread)?;
    Ok((bodies, ready))
}

/// Request bodies made ahead of their send, in bytes (at least
/// `MIN_AHEAD` bodies).
const AHEAD_BYTES: usize = 16 << 20;
const MIN_AHEAD: usize = 1024;

fn check(config: &LoadConfig) -> Result<(), LoadError> {
    let bad = |m: &str| Err(LoadError::Config(m.to_owned()));
    if config.num_requests == 0 {
        return bad("the number of requests must be at least 1");
    }
    if config.request_rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return bad("the request rate must be positive");
    }
    if let Dataset::Trace { trace, speed } = &config.dataset {
        if config.request_rate.is_some_and(f64::is_finite) {
            return bad("a trace sends on its own schedule: give no request rate (--trace-speed scales it)");
        }
        if !(speed.is_finite() && *speed > 0.0) {
            return Err(LoadError::Config(format!("the trace speed must be above 0, got {speed}")));
        }
        trace.holds(config.num_requests as u64).map_err(LoadError::Config)?;
    }
    if config.max_concurrency == Some(0) {
        return bad("the concurrency cap must be at least 1");
    }
    if config.lag_limit_ms.is_some_and(|l| l.is_nan() || l <= 0.0) {
        return bad("the dispatch lag limit must be positive");
    }
    if !(0.0..1.0).contains(&config.rate_tolerance) {
        return bad("the rate tolerance must be from 0 to 1 (a share of the offered rate)");
    }
    if let Some(p) = config.percentiles.iter().find(|p| !(0.0..=100.0).contains(*p)) {
        return Err(LoadError::Config(format!("percentile {p} is not between 0 and 100")));
    }
    if config.percentiles.is_empty() {
        return bad("at least one percentile must be asked for");
    }
    // Visible ASCII and spaces only: a line break would end the header.
    if config.api_key.as_ref().is_some_and(|key| key.bytes().any(|b| !(b.is_ascii_graphic() || b == b' '))) {
        return bad("the api key holds characters a header cannot carry");
    }
    let unbounded = (config.request_rate.is_none_or(f64::is_infinite) || config.dataset.sessions(1).is_some())
        && config.max_duration.is_none()
        && !matches!(config.dataset, Dataset::Trace { .. });
    if matches!(config.cooldown, Window::Time(_)) && unbounded {
        return bad(
            "a cool-down by time needs a request rate (and no sessions) or a maximum duration: the end is not known \
             otherwise",
        );
    }
    Ok(())
}

/// Which phase a request falls in, by its position or its time.
struct Phases {
    n: usize,
    warmup: Window,
    cooldown: Window,
    /// When the run's sending ends, ns from its start, where known.
    end_ns: Option<i64>,
}

impl Phases {
    /// The phases of a run of `deadlines`; with `sessions`, they are of its
    /// sessions' first turns, and its requests are `config.num_requests`
    /// (its sending ends with its last session, which no deadline says).
    fn new(config: &LoadConfig, deadlines: &[Duration], sessions: bool) -> Phases {
        let last = deadlines.last().map(|d| ns(*d)).filter(|&d| d > 0 && !sessions);
        let end_ns = match (config.max_duration.map(ns), last) {
            (Some(max), Some(last)) => Some(max.min(last)),
            (max, last) => max.or(last),
        };
        let n = if sessions { config.num_requests } else { deadlines.len() };
        Phases { n, warmup: config.warmup, cooldown: config.cooldown, end_ns }
    }

    /// The phase of request `seq`, ready to go at `ready_ns`.
    fn of(&self, seq: usize, ready_ns: i64) -> Phase {
        let warm = match self.warmup {
            Window::None => false,
            Window::Requests(n) => seq < n,
            Window::Time(t) => ready_ns < ns(t),
        };
        let cool = match self.cooldown {
            Window::None => false,
            Window::Requests(n) => seq + n >= self.n,
            Window::Time(t) => self.end_ns.is_some_and(|end| ready_ns >= end - ns(t)),
        };
        if warm {
            Phase::Warmup
        } else if cool {
            Phase::Cooldown
        } else {
            Phase::Measured
        }
    }
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// A request's body and what is known of it before it is sent.
struct Prepared {
    body: Bytes,
    prompt_tokens: u32,
    max_tokens: u32,
    /// The session whose first turn it is.
    session: Option<Box<Session>>,
}

/// A request task's report to the dispatcher.
struct Done {
    record: RequestRecord,
    conn: Option<Conn>,
    /// The reply's text, for a session that goes on.
    reply: Option<String>,
    session: Option<Box<Session>>,
}

/// What shapes every request body of a run, owned: the first turns' are
/// made on the bodies' thread, a session's later ones by its worker.
#[derive(Debug)]
struct BodyShape {
    endpoint: Endpoint,
    model: String,
    stream: bool,
    extra: serde_json::Map<String, serde_json::Value>,
}

impl BodyShape {
    fn of(config: &LoadConfig) -> BodyShape {
        BodyShape {
            endpoint: config.endpoint,
            model: config.model.clone(),
            stream: config.stream,
            extra: config.extra_body.clone(),
        }
    }

    fn options(&self) -> BodyOptions<'_> {
        BodyOptions { endpoint: self.endpoint, model: &self.model, stream: self.stream, extra: &self.extra }
    }
}

/// What the workers make of the records as they come back: the summary,
/// built as they do, and the records themselves where they are kept.
struct Collected {
    summary: SummaryBuilder,
    records: Option<Vec<RequestRecord>>,
    /// Each worker's requests still out (`seq % lanes.len()` is the
    /// worker): no chunk of a request still out arrived before the
    /// earliest of their sends, so the summary's tokens-per-second window
    /// settles up to there.
    lanes: Vec<Out>,
}

/// When each of a worker's requests from its `first` on (its own count)
/// was handed to its task, ns, until its record is back.
#[derive(Default)]
struct Out {
    sent: VecDeque<Option<i64>>,
    first: u64,
}

impl Collected {
    fn new(lanes: usize, summary: SummaryBuilder, records: Option<Vec<RequestRecord>>) -> Collected {
        Collected { summary, records, lanes: (0..lanes).map(|_| Out::default()).collect() }
    }

    /// Request `seq` goes now. The time is read under the lock that `take`
    /// reads it under too: a worker with nothing out settles no later than
    /// its next send.
    fn sent(&mut self, seq: u64, clock: &Clock) {
        let n = self.lanes.len() as u64;
        let out = &mut self.lanes[(seq % n) as usize];
        debug_assert_eq!(seq / n, out.first + out.sent.len() as u64);
        out.sent.push_back(Some(clock.now_ns()));
    }

    fn take(&mut self, record: RequestRecord, clock: &Clock) {
        let n = self.lanes.len() as u64;
        let out = &mut self.lanes[(record.seq % n) as usize];
        let index = (record.seq / n).checked_sub(out.first).and_then(|i| usize::try_from(i).ok());
        if let Some(sent) = index.and_then(|i| out.sent.get_mut(i)) {
            *sent = None;
        }
        while out.sent.front().is_some_and(Option::is_none) {
            out.sent.pop_front();
            out.first += 1;
        }
        self.summary.add(&record);
        self.summary.settle(self.horizon(clock.now_ns()));
        if let Some(records) = &mut self.records {
            records.push(record);
        }
    }

    /// A time before which no chunk of a request still out arrived: the
    /// earliest send of those still out on any worker; `now_ns` when none
    /// is (a worker's next send is later).
    fn horizon(&self, now_ns: i64) -> i64 {
        self.lanes.iter().filter_map(|out| out.sent.front().copied().flatten()).min().unwrap_or(now_ns)
    }
}

/// What a worker's dispatcher holds between its sends.
struct LaneState {
    /// Requests sent whose record is not back.
    in_flight: usize,
    /// Slots of the cap held: a request holds one from its send to its
    /// record's return, a session from its first turn's send to its last
    /// turn's record (its think times included).
    held: usize,
    cap: usize,
    /// When a slot last came free while every one was held: a request due
    /// before then waited for it.
    freed_ns: Option<i64>,
    idle: Vec<Conn>,
    /// Sessions' next turns, the earliest due first.
    waiting: BinaryHeap<Reverse<Waiting>>,
    /// The run is ending: sessions go no further.
    stopping: bool,
}

/// A session's next turn, made and waiting for its think time to pass.
struct Waiting {
    due_ns: i64,
    turn: NextTurn,
    session: Box<Session>,
}

impl Waiting {
    fn key(&self) -> (i64, u64) {
        (self.due_ns, self.session.id)
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl LaneState {
    /// A record came back: its connection is reused, its session's next
    /// turn made, or its slot freed. Returns whether what is due next may
    /// have changed (a turn queued, or a slot freed while all were held).
    fn accept(&mut self, done: Done, shape: &BodyShape, collected: &Mutex<Collected>, clock: &Clock) -> bool {
        self.in_flight -= 1;
        if let Some(conn) = done.conn {
            self.idle.push(conn);
        }
        let next = match done.session {
            Some(mut session) if !self.stopping => session
                .next(&shape.options(), &done.record, done.reply)
                .map(|(turn, due_ns)| Waiting { due_ns, turn, session }),
            _ => None,
        };
        let changed = match next {
            Some(waiting) => {
                self.waiting.push(Reverse(waiting));
                true
            }
            None => {
                let full = self.held >= self.cap;
                if full {
                    self.freed_ns = Some(done.record.completed_ns);
                }
                self.held -= 1;
                full
            }
        };
        collected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(done.record, clock);
        changed
    }
}

/// Sends each of the lane's requests when it is due (a start at its
/// deadline once a slot of its cap is free; a session's next turn when its
/// think time has passed) until the schedule and its sessions are done, the
/// maximum duration passes or the run is stopped; its records go to
/// `collected`.
#[allow(clippy::too_many_arguments)]
async fn dispatch(
    target: Arc<Target>,
    lane: &Lane,
    mut bodies: mpsc::Receiver<Prepared>,
    deadlines: &[Duration],
    phases: &Phases,
    idle: Vec<Conn>,
    sink_tx: Option<RecordSender>,
    collected: &Mutex<Collected>,
) {
    let clock = target.clock;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut state = LaneState {
        in_flight: 0,
        held: 0,
        cap: lane.cap,
        freed_ns: None,
        idle,
        waiting: BinaryHeap::new(),
        stopping: false,
    };
    let end = lane.end.map(|d| clock.at(d));
    let end_or_never = async move {
        match end {
            Some(end) => tokio::time::sleep_until(end).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(end_or_never);
    let stop = target.cancel.clone();
    let shape = &*lane.shape;
    let mut starts = (lane.index..deadlines.len()).step_by(lane.of);
    let mut next_start: Option<(usize, Prepared)> = None;
    let mut starts_left = true;
    let mut sent = 0u64;

    'sending: loop {
        if next_start.is_none() && starts_left {
            // Made ahead: waiting here means the thread making them fell behind.
            let prepared = match starts.next() {
                None => None,
                Some(_) if stop.is_cancelled() => break 'sending,
                Some(i) => match bodies.try_recv() {
                    Ok(prepared) => Some((i, prepared)),
                    Err(_) => tokio::select! {
                        biased;
                        () = stop.cancelled() => break 'sending,
                        () = &mut end_or_never => {
                            stop.cancel();
                            break 'sending;
                        }
                        prepared = bodies.recv() => prepared.map(|p| (i, p)),
                    },
                },
            };
            starts_left = prepared.is_some();
            next_start = prepared;
        }
        let start_due = next_start.as_ref().filter(|_| state.held < state.cap).map(|(i, _)| ns(deadlines[*i]));
        let turn_due = state.waiting.peek().map(|w| w.0.due_ns);
        let due_ns = match (start_due, turn_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (None, None) if state.in_flight == 0 => break 'sending,
            (a, b) => a.or(b),
        };
        // Until it is due, take records in: their connections are reused,
        // the records would otherwise pile up in the channel, and a
        // session's next turn may be due sooner. With nothing due, nothing
        // can go until a record comes back.
        let due = async {
            match due_ns {
                Some(ns) => {
                    tokio::time::sleep_until(clock.at(Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(due);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break 'sending,
                () = &mut end_or_never => {
                    stop.cancel();
                    break 'sending;
                }
                () = &mut due => break,
                Some(done) = done_rx.recv() => {
                    if state.accept(done, shape, collected, &clock) || due_ns.is_none() {
                        continue 'sending;
                    }
                }
            }
        }
        let Some(due_ns) = due_ns else { unreachable!("nothing due never ends the wait") };
        while let Ok(done) = done_rx.try_recv() {
            state.accept(done, shape, collected, &clock);
        }
        // A session's turn keeps its slot; a start takes one, and a start
        // that was due while every slot was held waited for one: its send is
        // late, its deadline stays as scheduled, and the slot's time is kept
        // so that the lag of the client itself can be told apart.
        let (scheduled_ns, slot_ns, body, prompt_tokens, max_tokens, session) =
            match state.waiting.peek().is_some_and(|w| w.0.due_ns <= due_ns) {
                true => {
                    let Some(Reverse(Waiting { due_ns, turn, session })) = state.waiting.pop() else {
                        unreachable!("a turn was due")
                    };
                    (due_ns, None, turn.body, turn.prompt_tokens, turn.max_tokens, Some(session))
                }
                false => {
                    let Some((i, prepared)) = next_start.take() else { unreachable!("a start was due") };
                    state.held += 1;
                    let scheduled_ns = ns(deadlines[i]);
                    let slot_ns = state.freed_ns.filter(|&freed| freed > scheduled_ns);
                    let Prepared { body, prompt_tokens, max_tokens, session } = prepared;
                    (scheduled_ns, slot_ns, body, prompt_tokens, max_tokens, session)
                }
            };
        let seq = lane.index as u64 + sent * lane.of as u64;
        sent += 1;
        let ready_ns = slot_ns.map_or(scheduled_ns, |s| s.max(scheduled_ns));
        let phase = phases.of(seq as usize, ready_ns);
        let request = Request {
            seq,
            scheduled_ns,
            slot_ns,
            phase,
            body,
            prompt_tokens,
            max_tokens,
            turn: session.as_ref().map(|s| s.place()),
            keep_reply: session.as_ref().is_some_and(|s| s.continues()),
        };
        collected.lock().unwrap_or_else(std::sync::PoisonError::into_inner).sent(seq, &clock);
        let sending = client::send(Arc::clone(&target), request, state.idle.pop());
        let (progress, sink_tx, done_tx) = (lane.progress.clone(), sink_tx.clone(), done_tx.clone());
        if let Some(progress) = &progress {
            progress.sent.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(sink) = &sink_tx {
            sink.count_sent();
        }
        state.in_flight += 1;
        // Boxed: the task then holds a pointer, not the whole request state
        // padded to the task's alignment (ten thousand of them at once); and
        // `map`, not an async block, which would hold the future twice.
        tokio::spawn(Box::pin(sending.map(move |(record, conn, reply)| {
            if let Some(progress) = progress {
                progress.done.fetch_add(1, Ordering::Relaxed);
                if !record.outcome.is_ok() {
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            if let Some(tx) = sink_tx {
                tx.record(record.clone());
            }
            let _ = done_tx.send(Done { record, conn, reply, session });
        })));
    }
    drop(done_tx);

    // Stopped, or past the maximum duration: the requests still out are
    // cancelled, and each still reports its record.
    state.stopping = true;
    while state.in_flight > 0 {
        match done_rx.recv().await {
            Some(done) => {
                state.accept(done, shape, collected, &clock);
            }
            None => break,
        }
    }
}

/// The transport for the base URL: our own HTTP/1.1 connections, over TLS
/// for https.
async fn transport(config: &LoadConfig, roots: &[CertificateDer<'static>]) -> Result<Transport, LoadError> {
    let base = config.base_url.trim_end_matches('/');
    let bad = |reason: &str| LoadError::BaseUrl { url: config.base_url.clone(), reason: reason.to_owned() };
    let url = reqwest::Url::parse(base).map_err(|e| bad(&e.to_string()))?;
    let path = format!("{}{}", url.path().trim_end_matches('/'), config.endpoint.path());
    let secure = match url.scheme() {
        "http" => false,
        "https" => true,
        other => return Err(bad(&format!("scheme {other} is not http or https"))),
    };
    let host = url.host_str().ok_or_else(|| bad("it has no host"))?;
    let port = url.port_or_known_default().unwrap_or(if secure { 443 } else { 80 });
    // An IPv6 host comes bracketed, as both the address and the Host
    // header want it.
    let authority = format!("{host}:{port}");
    let authorization = config.api_key.as_ref().map(|key| format!("Bearer {key}"));
    let head = RequestHead::post(&path, &authority, authorization.as_deref()).map_err(|e| bad(&e))?;
    let tls = if secure {
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let name =
            ServerName::try_from(name.to_owned()).map_err(|e| bad(&format!("{host} is not a TLS server name: {e}")))?;
        Some(Tls { connector: tls_connector(roots).map_err(LoadError::Tls)?, name })
    } else {
        None
    };
    // Resolved once: a connection opened during the run must not wait for a
    // name lookup.
    let addrs: Vec<_> = tokio::net::lookup_host(authority.as_str())
        .await
        .map_err(|e| bad(&format!("cannot resolve {authority}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(bad(&format!("{authority} resolves to no address")));
    }
    Ok(Transport { addr: authority, addrs, head, tls })
}

/// TLS as a browser would: the system's roots and any given ones, HTTP/1.1
/// said in ALPN.
fn tls_connector(roots: &[CertificateDer<'static>]) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(roots.iter().cloned(), provider.clone())
        .map_err(|e| format!("cannot set up certificate verification: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The certificates of a PEM file of CA certificates.
fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let bad = |reason: String| LoadError::Tls(format!("cannot read CA certificates from {}: {reason}", path.display()));
    let roots = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if roots.is_empty() {
        return Err(bad("it holds no certificate".to_owned()));
    }
    Ok(roots)
}

/// Opens `n` connections before the measured window.
async fn open_connections(transport: &Transport, timeout: Duration, n: usize) -> Result<Vec<Conn>, LoadError> {
    let opened = futures_util::future::join_all((0..n).map(|_| client::connect(transport, timeout))).await;
    opened
        .into_iter()
        .enumerate()
        .map(|(i, c)| c.map_err(|error| LoadError::Connect { n: i + 1, addr: transport.addr.clone(), error }))
        .collect()
}

/// Connections opened before the run when no cap says how many the first
/// wave needs: more are opened as needed, their connect time recorded apart.
const WARM_CONNECTIONS: usize = 256;

fn build_client(roots: &[CertificateDer<'static>]) -> Result<reqwest::Client, LoadError> {
    // reqwest panics without a rustls provider, even for plain http; the
    // binary installs ring, and an in-process caller may not have.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut builder =
        reqwest::Client::builder().http1_only().tcp_nodelay(true).connect_timeout(Duration::from_secs(10));
    for root in roots {
        builder = builder.add_root_certificate(reqwest::Certificate::from_der(root).map_err(LoadError::Client)?);
    }
    builder.build().map_err(LoadError::Client)
}

#[derive(Deserialize)]
struct Models {
    data: Vec<Model>,
}

#[derive(Deserialize)]
struct Model {
    id: String,
}

/// Whether, somewhere in `error`'s causes, TLS refused the certificate the
/// server showed. An I/O error holds its cause inside it, not as its
/// source (and may hold another I/O error): each is looked into.
fn certificate_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    if matches!(
        error.downcast_ref::<rustls::Error>(),
        Some(
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::InvalidCertRevocationList(_)
        )
    ) {
        return true;
    }
    let inner = error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
    inner.is_some_and(|inner| certificate_refused(inner)) || error.source().is_some_and(certificate_refused)
}

/// Checks that the server serves the model.
async fn check_model(http: &reqwest::Client, config: &LoadConfig) -> Result<(), LoadError> {
    let url = format!("{}/v1/models", config.base_url.trim_end_matches('/'));
    let get = || async {
        let mut request = http.get(&url).timeout(Duration::from_secs(30));
        if let Some(key) = &config.api_key {
            request = request.bearer_auth(key);
        }
        let unreachable = |source: reqwest::Error| {
            let hint =
                if certificate_refused(&source) { "is its certificate trusted (--ca-cert)?" } else { "is it running?" };
            LoadError::Unreachable { url: url.clone(), hint, source }
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unreachable)?;
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Chunks, Outcome};

    fn record(seq: u64, sent_ns: i64, completed_ns: i64) -> RequestRecord {
        RequestRecord {
            seq,
            scheduled_ns: 0,
            sent_ns,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: None,
            completed_ns,
            chunks: Chunks::default(),
            prompt_tokens: 0,
            output_tokens: 0,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            phase: Phase::Measured,
            turn: None,
        }
    }

    /// The summary's window settles up to the earliest send still out on
    /// any worker, whichever worker's record came back.
    #[test]
    fn records_settle_up_to_the_earliest_request_still_out_on_any_worker() {
        let clock = Clock::start();
        let mut c = Collected::new(2, SummaryBuilder::new(SummaryOptions::new(None)), None);
        assert_eq!(c.horizon(7), 7, "nothing out");
        // Requests 0 and 2 on worker 0, 1 and 3 on worker 1.
        for seq in 0..4 {
            c.sent(seq, &clock);
        }
        let at = |c: &Collected, lane: usize| c.lanes[lane].sent.front().copied().flatten().expect("out");
        let (first0, first1) = (at(&c, 0), at(&c, 1));
        assert!(first0 <= first1);
        assert_eq!(c.horizon(i64::MAX), first0);
        // Worker 0's second comes back first: its first is still out.
        c.take(record(2, 0, 1), &clock);
        assert_eq!(c.horizon(i64::MAX), first0);
        c.take(record(0, 0, 1), &clock);
        assert_eq!(c.lanes[0].first, 2, "both of worker 0's are back");
        assert_eq!(c.horizon(i64::MAX), first1, "worker 1's first is the earliest out");
        c.take(record(1, 0, 1), &clock);
        c.take(record(3, 0, 1), &clock);
        assert_eq!(c.horizon(42), 42, "none out");
        assert_eq!(c.summary.records(), 4);
        c.sent(4, &clock);
        assert_eq!(c.lanes[0].sent.len(), 1, "worker 0's third");
    }
}
