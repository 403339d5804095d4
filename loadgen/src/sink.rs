//! `--report-to`: streams records to the controller's IngestService as they
//! complete, and the summary at the end.
//!
//! The sink is a task fed by an unbounded channel, so a slow or broken
//! controller never stalls the requests. Every batch is kept until the
//! controller acknowledges it: in memory up to a bound, then in a spill file
//! (see [`spill`]). A broken stream is reopened and the unacknowledged batches
//! are resent in order, those in memory first, then those in the file (the
//! controller keeps records idempotent by seq).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use benchfleet_proto as pb;
use futures_util::StreamExt;
use pb::ingest_service_client::IngestServiceClient;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::metrics::Summary;
use crate::record::RequestRecord;

mod spill;

/// Where to report records, and as which attempt.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// The controller's gRPC URL, e.g. `http://controller:7000`.
    pub url: String,
    pub run_id: String,
    pub job: u64,
    pub attempt: u32,
    /// The lease epoch the attempt was granted under.
    pub epoch: u64,
    /// How long the sink keeps trying to reach the controller (at the start,
    /// after a broken stream, or while acknowledgements stall) before the run
    /// fails.
    pub retry_for: Duration,
    /// Most bytes (encoded) of unacknowledged batches kept in memory. Past
    /// it, batches wait in a spill file, so a controller that is away for
    /// long costs disk, not the memory the requests in flight need.
    pub memory_bytes: usize,
    /// Where the spill file is made, when one is needed.
    pub spill_dir: PathBuf,
    /// The fleet's CA (PEM) for an https:// URL, and whether plain text may
    /// go to another host (`benchfleet_core::tls`).
    pub tls: benchfleet_core::tls::ClientTls,
    /// The attempt's ingest credential, sent with the stream (a secret).
    pub token: Option<Token>,
}

/// An ingest credential: its `Debug` never shows it.
#[derive(Clone)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(redacted)")
    }
}

/// The default bound of unacknowledged batches in memory.
pub const DEFAULT_MEMORY_BYTES: usize = 16 << 20;

impl SinkConfig {
    pub fn new(url: impl Into<String>, run_id: impl Into<String>, job: u64, attempt: u32) -> SinkConfig {
        SinkConfig {
            url: url.into(),
            run_id: run_id.into(),
            job,
            attempt,
            epoch: 0,
            retry_for: Duration::from_secs(30),
            memory_bytes: DEFAULT_MEMORY_BYTES,
            spill_dir: std::env::temp_dir(),
            tls: benchfleet_core::tls::ClientTls::default(),
            token: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot reach the controller at {url} (tried for {retry_for:?}): {reason}")]
    Unreachable { url: String, retry_for: Duration, reason: String },
    /// The controller stopped acknowledging; `acked` records are stored.
    /// `spilled` names the spill file, kept, when batches were waiting in one.
    #[error("the controller at {url} stopped acknowledging records: {reason}{}", kept(spilled.as_ref()))]
    Broken { url: String, reason: String, acked: u64, spilled: Option<PathBuf> },
    /// The controller refused the records for good: the attempt is not (or
    /// no longer) one it takes records for. Nothing is resent.
    #[error("the controller at {url} refused the records: {reason}")]
    Refused { url: String, reason: String, acked: u64 },
    /// The spill file could not be written or read back.
    #[error("cannot use the spill file {}: {reason}", path.display())]
    Spill { path: PathBuf, reason: String, acked: u64 },
}

fn kept(spilled: Option<&PathBuf>) -> String {
    spilled.map_or_else(String::new, |p| format!(" (unsent batches are kept in {})", p.display()))
}

impl SinkError {
    /// Records the controller acknowledged before the sink gave up.
    pub fn acked(&self) -> u64 {
        match self {
            SinkError::Unreachable { .. } => 0,
            SinkError::Broken { acked, .. } | SinkError::Spill { acked, .. } | SinkError::Refused { acked, .. } => {
                *acked
            }
        }
    }
}

/// Most records in one batch...
const BATCH_RECORDS: usize = 256;
/// ...and most bytes (encoded), so a batch of long replies stays well below
/// the controller's message limit.
const BATCH_BYTES: usize = 1 << 20;
/// Longest a completed record waits before it is sent.
const BATCH_EVERY: Duration = Duration::from_millis(200);

enum Message {
    Record(Box<RequestRecord>),
    Finish(Box<Summary>),
}

/// The run's side of the sink.
pub(crate) struct Sink {
    url: String,
    tx: mpsc::UnboundedSender<Message>,
    task: JoinHandle<Result<(), SinkError>>,
    /// Requests sent so far, which each batch reports.
    sent: Arc<AtomicU64>,
}

impl Sink {
    /// Opens the stream to the controller before the measured window, so that
    /// a wrong URL fails the run before any load is sent.
    /// A refusal for good cancels `stop`: the run ends at once.
    pub(crate) async fn start(config: SinkConfig, stop: CancellationToken) -> Result<Sink, SinkError> {
        let sent = Arc::new(AtomicU64::new(0));
        let mut state = State {
            attempt: pb::AttemptRef {
                run_id: config.run_id.clone(),
                job: config.job,
                attempt: config.attempt,
                epoch: config.epoch,
            },
            sent: sent.clone(),
            stop,
            buffer_bytes: 0,
            config,
            memory: VecDeque::new(),
            memory_bytes: 0,
            spill: None,
            buffer: Vec::new(),
            next_batch: 0,
            acked: 0,
            summary_acked: false,
            conn: None,
            last_progress: Instant::now(),
            broken_since: None,
            retry_at: Instant::now(),
            backoff: Duration::from_millis(100),
        };
        let deadline = Instant::now() + state.config.retry_for;
        while let Err(reason) = state.connect().await {
            if Instant::now() + state.backoff > deadline {
                return Err(SinkError::Unreachable {
                    url: state.config.url,
                    retry_for: state.config.retry_for,
                    reason,
                });
            }
            tokio::time::sleep(state.backoff).await;
            state.backoff = (state.backoff * 2).min(Duration::from_secs(5));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(Sink { url: state.config.url.clone(), tx, task: tokio::spawn(state.run(rx)), sent })
    }

    /// A handle for the workers and their request tasks.
    pub(crate) fn sender(&self) -> RecordSender {
        RecordSender { tx: self.tx.clone(), sent: Arc::clone(&self.sent) }
    }

    /// Sends the summary and waits until the controller has stored it and
    /// every record. `Err` carries how many records were acknowledged.
    pub(crate) async fn finish(self, summary: Summary) -> Result<(), SinkError> {
        let _ = self.tx.send(Message::Finish(Box::new(summary)));
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(SinkError::Broken {
                url: self.url,
                reason: format!("sink task failed: {e}"),
                acked: 0,
                spilled: None,
            }),
        }
    }
}

/// Where request tasks put their records, and workers count their sends.
#[derive(Clone)]
pub(crate) struct RecordSender {
    tx: mpsc::UnboundedSender<Message>,
    sent: Arc<AtomicU64>,
}

impl RecordSender {
    /// Queues one record; never waits. If the sink has given up the record is
    /// dropped here and counted as unacknowledged at the end.
    pub(crate) fn record(&self, record: RequestRecord) {
        let _ = self.tx.send(Message::Record(Box::new(record)));
    }

    /// Counts one request sent.
    pub(crate) fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// An open Records stream.
struct Conn {
    tx: mpsc::UnboundedSender<pb::RecordBatch>,
    acks: tonic::Streaming<pb::RecordAck>,
}

struct State {
    config: SinkConfig,
    attempt: pb::AttemptRef,
    sent: Arc<AtomicU64>,
    /// Cancelled when the controller refuses the records for good.
    stop: CancellationToken,
    /// The encoded size of `buffer`.
    buffer_bytes: usize,
    /// Unacknowledged batches in memory, in batch order, with their encoded
    /// sizes; every one was sent on the open stream, if there is one. They
    /// all come before those in the spill file.
    memory: VecDeque<(pb::RecordBatch, usize)>,
    /// The sum of the sizes in `memory`.
    memory_bytes: usize,
    /// Unacknowledged batches past the memory bound, never sent on the open
    /// stream; `None` when there are none.
    spill: Option<spill::Spill>,
    /// Completed records not yet in a batch.
    buffer: Vec<pb::RequestRecord>,
    next_batch: u64,
    acked: u64,
    summary_acked: bool,
    conn: Option<Conn>,
    /// The last ack, (re)connection, or first batch after an idle spell: a
    /// stall is measured from here.
    last_progress: Instant,
    /// Since when the stream has been broken without an ack; cleared by an
    /// ack, so a controller that accepts and breaks every stream is given up.
    broken_since: Option<Instant>,
    retry_at: Instant,
    backoff: Duration,
}

impl State {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Message>) -> Result<(), SinkError> {
        let mut tick = tokio::time::interval(BATCH_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut finishing = false;
        loop {
            tokio::select! {
                message = rx.recv(), if !finishing => match message {
                    Some(Message::Record(record)) => {
                        let record = pb::RequestRecord::from(&*record);
                        self.buffer_bytes += record.encoded_len();
                        self.buffer.push(record);
                        if self.buffer.len() >= BATCH_RECORDS || self.buffer_bytes >= BATCH_BYTES {
                            self.flush(None).await?;
                        }
                    }
                    Some(Message::Finish(summary)) => {
                        finishing = true;
                        self.flush(Some(pb::Summary::from(&*summary))).await?;
                    }
                    // The run went away without finishing: nothing to wait for.
                    None => return Ok(()),
                },
                ack = next_ack(&mut self.conn) => match ack {
                    Some(Ok(ack)) => {
                        self.on_ack(&ack);
                        self.refill().await?;
                    }
                    Some(Err(status)) if refused_for_good(&status) => {
                        self.stop.cancel();
                        return Err(SinkError::Refused {
                            url: self.config.url.clone(),
                            reason: status.message().to_owned(),
                            acked: self.acked,
                        });
                    }
                    Some(Err(status)) => self.broke(format!("stream failed: {}", status.message())),
                    None => self.broke("stream closed by the controller".to_owned()),
                },
                _ = tick.tick() => {
                    if !finishing {
                        self.flush(None).await?;
                    }
                    self.watch().await?;
                }
            }
            if finishing && self.summary_acked && self.memory.is_empty() && self.spill.is_none() {
                return Ok(());
            }
        }
    }

    /// Closes the current batch (with the summary, for the last one) and
    /// sends it, or spills it when memory is full.
    async fn flush(&mut self, summary: Option<pb::Summary>) -> Result<(), SinkError> {
        if self.buffer.is_empty() && summary.is_none() {
            return Ok(());
        }
        if self.memory.is_empty() {
            // Stall detection measures from the oldest unacknowledged batch.
            self.last_progress = Instant::now();
        }
        let batch = pb::RecordBatch {
            attempt: Some(self.attempt.clone()),
            batch: self.next_batch,
            records: std::mem::take(&mut self.buffer),
            summary,
            sent: self.sent.load(Ordering::Relaxed),
        };
        self.buffer_bytes = 0;
        self.next_batch += 1;
        let size = batch.encoded_len();
        // Once anything is spilled, later batches follow it into the file:
        // the order of resending is the order of the batches.
        if self.spill.is_none() && self.fits(size) {
            self.keep(batch, size);
            return Ok(());
        }
        let spill = match &mut self.spill {
            Some(spill) => spill,
            None => {
                let spill = spill::Spill::create(&self.config.spill_dir, &self.attempt)
                    .await
                    .map_err(|(path, e)| self.spill_error(path, &e))?;
                tracing::warn!(
                    url = %self.config.url,
                    path = %spill.path().display(),
                    "unacknowledged records exceed the memory bound; spilling to a file"
                );
                self.spill.insert(spill)
            }
        };
        if let Err(e) = spill.append(&batch).await {
            let path = spill.path().to_owned();
            return Err(self.spill_error(path, &e));
        }
        Ok(())
    }

    /// Whether a batch of `size` bytes may be kept in memory. One batch always
    /// may: the stream needs something to send.
    fn fits(&self, size: usize) -> bool {
        self.memory.is_empty() || self.memory_bytes + size <= self.config.memory_bytes
    }

    /// Keeps a batch in memory and sends it on the open stream.
    fn keep(&mut self, batch: pb::RecordBatch, size: usize) {
        if let Some(conn) = &self.conn {
            let _ = conn.tx.send(batch.clone());
        }
        self.memory_bytes += size;
        self.memory.push_back((batch, size));
    }

    /// Moves spilled batches back into memory (and onto the stream) as far as
    /// the bound allows; removes the file once it is drained.
    async fn refill(&mut self) -> Result<(), SinkError> {
        while let Some(next) = self.spill.as_ref().map(spill::Spill::next_size) {
            let Some(size) = next else {
                // Drained: dropping it removes the file.
                self.spill = None;
                break;
            };
            if !self.fits(size) {
                break;
            }
            let Some(spill) = &mut self.spill else { break };
            match spill.next().await {
                Ok(batch) => self.keep(batch, size),
                Err(e) => {
                    let path = spill.path().to_owned();
                    return Err(self.spill_error(path, &e));
                }
            }
        }
        Ok(())
    }

    fn spill_error(&mut self, path: PathBuf, e: &std::io::Error) -> SinkError {
        // The file holds records the controller has not stored: keep it.
        if let Some(spill) = &mut self.spill {
            spill.keep_on_drop();
        }
        SinkError::Spill { path, reason: e.to_string(), acked: self.acked }
    }

    fn on_ack(&mut self, ack: &pb::RecordAck) {
        // Acks come in order, one per batch; an ack covers every batch up to it.
        while self.memory.front().is_some_and(|(b, _)| b.batch <= ack.batch) {
            if let Some((batch, size)) = self.memory.pop_front() {
                self.memory_bytes -= size;
                self.acked += batch.records.len() as u64;
                self.summary_acked |= batch.summary.is_some() && ack.summary_stored;
            }
        }
        self.last_progress = Instant::now();
        self.broken_since = None;
        self.backoff = Duration::from_millis(100);
    }

    fn broke(&mut self, reason: String) {
        tracing::warn!(url = %self.config.url, %reason, "record stream broke; reconnecting");
        self.conn = None;
        self.retry_at = Instant::now();
        self.broken_since.get_or_insert_with(Instant::now);
    }

    /// Once per tick: detects stalls, reconnects a broken stream, gives up.
    async fn watch(&mut self) -> Result<(), SinkError> {
        let retry_for = self.config.retry_for;
        if self.conn.is_some() && !self.memory.is_empty() && self.last_progress.elapsed() > retry_for {
            self.broke(format!("no acknowledgement for {retry_for:?}"));
        }
        if self.conn.is_none() {
            if self.broken_since.is_some_and(|t| t.elapsed() > retry_for) {
                let spilled = self.spill.as_mut().map(|spill| {
                    spill.keep_on_drop();
                    spill.path().to_owned()
                });
                return Err(SinkError::Broken {
                    url: self.config.url.clone(),
                    reason: format!("no working stream for {retry_for:?}"),
                    acked: self.acked,
                    spilled,
                });
            }
            if Instant::now() >= self.retry_at {
                if let Err(reason) = self.connect().await {
                    tracing::warn!(url = %self.config.url, %reason, "cannot reopen the record stream");
                    self.retry_at = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
                } else if self.memory.is_empty() {
                    // Nothing was lost: the stream is whole again.
                    self.broken_since = None;
                }
            }
        }
        Ok(())
    }

    /// Opens a Records stream and resends the unacknowledged batches in memory
    /// on it; those in the spill file follow as acknowledgements make room.
    async fn connect(&mut self) -> Result<(), String> {
        let open = async {
            let endpoint =
                benchfleet_core::tls::endpoint(&self.config.url, &self.config.tls).map_err(|e| e.to_string())?;
            let channel = endpoint.connect().await.map_err(|e| crate::client::error_chain(&e))?;
            let mut client = IngestServiceClient::new(channel);
            let (tx, rx) = mpsc::unbounded_channel();
            for (batch, _) in &self.memory {
                let _ = tx.send(batch.clone());
            }
            let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
            if let Some(Token(token)) = &self.config.token {
                let value = token.parse().map_err(|_| "the ingest credential is not printable".to_owned())?;
                request.metadata_mut().insert("x-benchfleet-ingest-token", value);
            }
            let acks = client.records(request).await.map_err(|s| s.message().to_owned())?;
            Ok::<_, String>(Conn { tx, acks: acks.into_inner() })
        };
        let conn = tokio::time::timeout(Duration::from_secs(5), open)
            .await
            .map_err(|_| "no answer within 5s".to_owned())??;
        self.conn = Some(conn);
        self.last_progress = Instant::now();
        Ok(())
    }
}

/// Whether the controller's answer means the records will never be taken:
/// the attempt is stale or unknown, or the batch itself is bad. Anything
/// else (unavailable, a broken connection) is worth another try.
fn refused_for_good(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::FailedPrecondition
            | Code::NotFound
            | Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

/// The next ack of the open stream; never resolves while there is none.
async fn next_ack(conn: &mut Option<Conn>) -> Option<Result<pb::RecordAck, tonic::Status>> {
    match conn {
        Some(conn) => conn.acks.next().await,
        None => std::future::pending().await,
    }
}
