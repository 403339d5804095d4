//! `--report-to`: streams records to the controller's IngestService as they
//! complete, and the summary at the end.
//!
//! The sink is a task fed by an unbounded channel, so a slow or broken
//! controller never stalls the requests. Every batch stays in memory until
//! the controller acknowledges it; a broken stream is reopened and the
//! unacknowledged batches are resent in order (the controller keeps records
//! idempotent by seq).

use std::collections::VecDeque;
use std::time::Duration;

use benchfleet_proto as pb;
use futures_util::StreamExt;
use pb::ingest_service_client::IngestServiceClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::metrics::Summary;
use crate::record::RequestRecord;

/// Where to report records, and as which attempt.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    /// The controller's gRPC URL, e.g. `http://controller:7000`.
    pub url: String,
    pub run_id: String,
    pub job: u64,
    pub attempt: u32,
    /// How long the sink keeps trying to reach the controller (at the start,
    /// after a broken stream, or while acknowledgements stall) before the run
    /// fails.
    pub retry_for: Duration,
}

impl SinkConfig {
    pub fn new(url: impl Into<String>, run_id: impl Into<String>, job: u64, attempt: u32) -> SinkConfig {
        SinkConfig { url: url.into(), run_id: run_id.into(), job, attempt, retry_for: Duration::from_secs(30) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot reach the controller at {url} (tried for {retry_for:?}): {reason}")]
    Unreachable { url: String, retry_for: Duration, reason: String },
    /// The controller stopped acknowledging; `acked` records are stored.
    #[error("the controller at {url} stopped acknowledging records: {reason}")]
    Broken { url: String, reason: String, acked: u64 },
}

impl SinkError {
    /// Records the controller acknowledged before the sink gave up.
    pub fn acked(&self) -> u64 {
        match self {
            SinkError::Unreachable { .. } => 0,
            SinkError::Broken { acked, .. } => *acked,
        }
    }
}

/// Most records in one batch.
const BATCH_RECORDS: usize = 256;
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
}

impl Sink {
    /// Opens the stream to the controller before the measured window, so that
    /// a wrong URL fails the run before any load is sent.
    pub(crate) async fn start(config: SinkConfig) -> Result<Sink, SinkError> {
        let mut state = State {
            attempt: pb::AttemptRef { run_id: config.run_id.clone(), job: config.job, attempt: config.attempt },
            config,
            pending: VecDeque::new(),
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
        Ok(Sink { url: state.config.url.clone(), tx, task: tokio::spawn(state.run(rx)) })
    }

    /// A handle for the request tasks.
    pub(crate) fn sender(&self) -> RecordSender {
        RecordSender(self.tx.clone())
    }

    /// Sends the summary and waits until the controller has stored it and
    /// every record. `Err` carries how many records were acknowledged.
    pub(crate) async fn finish(self, summary: Summary) -> Result<(), SinkError> {
        let _ = self.tx.send(Message::Finish(Box::new(summary)));
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(SinkError::Broken { url: self.url, reason: format!("sink task failed: {e}"), acked: 0 }),
        }
    }
}

/// Where request tasks put their records.
#[derive(Clone)]
pub(crate) struct RecordSender(mpsc::UnboundedSender<Message>);

impl RecordSender {
    /// Queues one record; never waits. If the sink has given up the record is
    /// dropped here and counted as unacknowledged at the end.
    pub(crate) fn record(&self, record: RequestRecord) {
        let _ = self.0.send(Message::Record(Box::new(record)));
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
    /// Sent, not yet acknowledged, in batch order.
    pending: VecDeque<pb::RecordBatch>,
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
                        self.buffer.push(pb::RequestRecord::from(&*record));
                        if self.buffer.len() >= BATCH_RECORDS {
                            self.flush(None);
                        }
                    }
                    Some(Message::Finish(summary)) => {
                        finishing = true;
                        self.flush(Some(pb::Summary::from(&*summary)));
                    }
                    // The run went away without finishing: nothing to wait for.
                    None => return Ok(()),
                },
                ack = next_ack(&mut self.conn) => match ack {
                    Some(Ok(ack)) => self.on_ack(&ack),
                    Some(Err(status)) => self.broke(format!("stream failed: {}", status.message())),
                    None => self.broke("stream closed by the controller".to_owned()),
                },
                _ = tick.tick() => {
                    if !finishing {
                        self.flush(None);
                    }
                    self.watch().await?;
                }
            }
            if finishing && self.summary_acked && self.pending.is_empty() {
                return Ok(());
            }
        }
    }

    /// Closes the current batch (with the summary, for the last one) and
    /// sends it.
    fn flush(&mut self, summary: Option<pb::Summary>) {
        if self.buffer.is_empty() && summary.is_none() {
            return;
        }
        if self.pending.is_empty() {
            // Stall detection measures from the oldest unacknowledged batch.
            self.last_progress = Instant::now();
        }
        let batch = pb::RecordBatch {
            attempt: Some(self.attempt.clone()),
            batch: self.next_batch,
            records: std::mem::take(&mut self.buffer),
            summary,
        };
        self.next_batch += 1;
        if let Some(conn) = &self.conn {
            let _ = conn.tx.send(batch.clone());
        }
        self.pending.push_back(batch);
    }

    fn on_ack(&mut self, ack: &pb::RecordAck) {
        // Acks come in order, one per batch; an ack covers every batch up to it.
        while self.pending.front().is_some_and(|b| b.batch <= ack.batch) {
            if let Some(batch) = self.pending.pop_front() {
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
        if self.conn.is_some() && !self.pending.is_empty() && self.last_progress.elapsed() > retry_for {
            self.broke(format!("no acknowledgement for {retry_for:?}"));
        }
        if self.conn.is_none() {
            if self.broken_since.is_some_and(|t| t.elapsed() > retry_for) {
                return Err(SinkError::Broken {
                    url: self.config.url.clone(),
                    reason: format!("no working stream for {retry_for:?}"),
                    acked: self.acked,
                });
            }
            if Instant::now() >= self.retry_at {
                if let Err(reason) = self.connect().await {
                    tracing::warn!(url = %self.config.url, %reason, "cannot reopen the record stream");
                    self.retry_at = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
                } else if self.pending.is_empty() {
                    // Nothing was lost: the stream is whole again.
                    self.broken_since = None;
                }
            }
        }
        Ok(())
    }

    /// Opens a Records stream and resends every unacknowledged batch on it.
    async fn connect(&mut self) -> Result<(), String> {
        let open = async {
            let mut client = IngestServiceClient::connect(self.config.url.clone())
                .await
                .map_err(|e| crate::client::error_chain(&e))?;
            let (tx, rx) = mpsc::unbounded_channel();
            for batch in &self.pending {
                let _ = tx.send(batch.clone());
            }
            let acks = client.records(UnboundedReceiverStream::new(rx)).await.map_err(|s| s.message().to_owned())?;
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

/// The next ack of the open stream; never resolves while there is none.
async fn next_ack(conn: &mut Option<Conn>) -> Option<Result<pb::RecordAck, tonic::Status>> {
    match conn {
        Some(conn) => conn.acks.next().await,
        None => std::future::pending().await,
    }
}
