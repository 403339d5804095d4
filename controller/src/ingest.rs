//! The ingest committer: one thread that stores record batches from every
//! loadgen stream, many batches per flush (group commit), and acknowledges
//! each only after the flush that made it durable.
//!
//! It also keeps the fence table: which attempt of each job may send records
//! now. The scheduler's driver opens a fence before the attempt's assignment
//! is sent and closes it when the attempt ends or is abandoned; both go
//! through the same queue as the batches, so a batch is checked against the
//! fences as they stood when it is committed, and a purge of superseded
//! attempts always comes after every batch of theirs that was accepted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use benchfleet_core::Summary;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::oneshot;

use crate::sched::Fence;
use crate::store::{RecordCommit, Store, StoreError};
use benchfleet_study::model::{AttemptKey, AttemptStats, RunId};

/// What ingest counts as it goes.
#[derive(Clone, Debug)]
pub struct IngestMetrics {
    pub records: Counter,
    pub batches: Counter,
    pub refused: Counter,
    /// One group commit: the write and its flush.
    pub commit_seconds: Histogram,
}

impl Default for IngestMetrics {
    fn default() -> Self {
        IngestMetrics {
            records: Counter::default(),
            batches: Counter::default(),
            refused: Counter::default(),
            // 100 µs to about 1.6 s.
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
        }
    }
}

/// Most queued items taken into one commit.
const MAX_COMMIT: usize = 512;

/// Why a batch was not stored.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The attempt may not send records (any more): permanent.
    #[error("{0}")]
    Stale(String),
    #[error("storing the records failed: {0}")]
    Store(#[from] StoreError),
    #[error("the controller is shutting down")]
    ShuttingDown,
}

/// One batch of one attempt, encoded.
pub struct Batch {
    pub fence: Fence,
    pub number: u64,
    /// The records, in the store's encoding (`store::codec`).
    pub encoded: Vec<u8>,
    pub records: u64,
    /// Requests loadgen had sent when it made the batch.
    pub sent: u64,
    pub summary: Option<Summary>,
}

enum Item {
    Batch(Box<Batch>, oneshot::Sender<Result<bool, IngestError>>),
    Open(Fence),
    Close(AttemptKey),
    Purge(AttemptKey),
    /// An attempt's digest, encoded.
    Digest(AttemptKey, Vec<u8>),
    Stop,
}

/// The committer's handle.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Item>,
    pub metrics: IngestMetrics,
}

impl Ingest {
    /// Starts the committer thread; `on_summary` is called (on that thread)
    /// for every stored summary, before its batch is acknowledged.
    pub fn start(
        store: Arc<dyn Store>,
        on_summary: impl Fn(AttemptKey, &Summary) + Send + 'static,
    ) -> (Ingest, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let metrics = IngestMetrics::default();
        let committer = Committer { store, fences: HashMap::new(), counts: HashMap::new(), metrics: metrics.clone() };
        let thread = std::thread::Builder::new()
            .name("ingest".to_owned())
            .spawn(move || committer.run(&rx, &on_summary))
            .expect("a thread can be spawned");
        (Ingest { tx, metrics }, thread)
    }

    /// Queues a batch; the answer comes once it is durable (`Ok(true)` when
    /// it carried the summary), or refused.
    pub fn submit(&self, batch: Batch) -> oneshot::Receiver<Result<bool, IngestError>> {
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::SendError(Item::Batch(_, reply))) = self.tx.send(Item::Batch(Box::new(batch), reply)) {
            let _ = reply.send(Err(IngestError::ShuttingDown));
        }
        rx
    }

    pub fn open(&self, fence: Fence) {
        let _ = self.tx.send(Item::Open(fence));
    }

    pub fn close(&self, key: AttemptKey) {
        let _ = self.tx.send(Item::Close(key));
    }

    pub fn purge(&self, key: AttemptKey) {
        let _ = self.tx.send(Item::Purge(key));
    }

    /// Stores an attempt's digest with the next commit (only while its
    /// summary is stored).
    pub fn digest(&self, key: AttemptKey, digest: &benchfleet_core::Digest) {
        let _ = self.tx.send(Item::Digest(key, crate::store::codec::encode_digest(digest)));
    }

    /// Commits what is queued, then ends the thread.
    pub fn stop(&self) {
        let _ = self.tx.send(Item::Stop);
    }
}

struct Committer {
    store: Arc<dyn Store>,
    /// The attempt of each job that may send records now.
    fences: HashMap<(RunId, u64), Fence>,
    /// Counts of attempts with open fences, as last stored.
    counts: HashMap<AttemptKey, AttemptStats>,
    metrics: IngestMetrics,
}

/// What one commit holds besides the store writes: who to answer.
#[derive(Default)]
struct Pending {
    commit: RecordCommit,
    replies: Vec<(oneshot::Sender<Result<bool, IngestError>>, bool)>,
    /// Batches in this commit, so a batch sent twice within one counts once.
    seen: HashSet<(AttemptKey, u64)>,
    records: u64,
}

impl Committer {
    fn run(mut self, rx: &mpsc::Receiver<Item>, on_summary: &dyn Fn(AttemptKey, &Summary)) {
        loop {
            let Ok(first) = rx.recv() else { return };
            let mut pending = Pending::default();
            let mut stop = false;
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(item) = next.take() {
                taken += 1;
                match item {
                    Item::Stop => stop = true,
                    Item::Open(fence) => {
                        self.fences.insert((fence.key.run, fence.key.job), fence);
                    }
                    Item::Close(key) => {
                        if self.fences.get(&(key.run, key.job)).is_some_and(|f| f.key == key) {
                            self.fences.remove(&(key.run, key.job));
                        }
                        self.counts.remove(&key);
                    }
                    Item::Purge(key) => {
                        // Earlier batches of this commit must be written
                        // before the purge looks for what to remove.
                        if !pending.commit.batches.is_empty() {
                            self.commit(std::mem::take(&mut pending), on_summary);
                        }
                        pending.commit.purges.push(key);
                    }
                    Item::Digest(key, bytes) => pending.commit.digests.push((key, bytes)),
                    Item::Batch(batch, reply) => match self.accept(*batch, &mut pending) {
                        Ok(summary) => pending.replies.push((reply, summary)),
                        Err(e) => {
                            self.metrics.refused.inc();
                            let _ = reply.send(Err(e));
                        }
                    },
                }
                if taken < MAX_COMMIT && !stop {
                    next = rx.try_recv().ok();
                }
            }
            self.commit(pending, on_summary);
            if stop {
                return;
            }
        }
    }

    /// Adds a batch to the commit if its attempt's fence is open; says
    /// whether it carried the summary.
    fn accept(&mut self, batch: Batch, pending: &mut Pending) -> Result<bool, IngestError> {
        let key = batch.fence.key;
        match self.fences.get(&(key.run, key.job)) {
            Some(f) if *f == batch.fence => {}
            // The refusal names only the batch's own attempt: which attempt
            // is current is no business of whoever holds a stale one.
            _ => {
                return Err(IngestError::Stale(format!(
                    "{key} (epoch {}) may not send records: it ended, was abandoned, or never ran",
                    batch.fence.epoch
                )));
            }
        }
        let stats = match self.counts.get(&key) {
            Some(s) => *s,
            None => self.store.stats(&key)?.unwrap_or_default(),
        };
        let mut stats = stats;
        // A batch the store holds is counted in the stats it holds: both
        // are written in one transaction, so a batch sent again after a
        // crash is counted once, whichever side of the crash its commit was.
        let new =
            !pending.seen.contains(&(key, batch.number)) && self.store.stored_batch(&key, batch.number)?.is_none();
        if new {
            stats.records += batch.records;
            pending.records += batch.records;
        }
        pending.seen.insert((key, batch.number));
        stats.sent = stats.sent.max(batch.sent);
        self.counts.insert(key, stats);
        pending.commit.batches.push((key, batch.number, batch.encoded));
        pending.commit.stats.retain(|(k, _)| *k != key);
        pending.commit.stats.push((key, stats));
        let carried = batch.summary.is_some();
        if let Some(summary) = batch.summary {
            pending.commit.summaries.push((key, summary));
        }
        Ok(carried)
    }

    fn commit(&mut self, pending: Pending, on_summary: &dyn Fn(AttemptKey, &Summary)) {
        let Pending { commit, replies, records, .. } = pending;
        if commit.is_empty() && replies.is_empty() {
            return;
        }
        let began = Instant::now();
        let result = self.store.commit_records(&commit);
        let took = began.elapsed();
        self.metrics.commit_seconds.observe(took.as_secs_f64());
        if took > Duration::from_secs(1) {
            tracing::warn!(batches = commit.batches.len(), "a record commit took {took:?}");
        }
        match result {
            Ok(()) => {
                self.metrics.records.inc_by(records);
                self.metrics.batches.inc_by(commit.batches.len() as u64);
                for (key, summary) in &commit.summaries {
                    on_summary(*key, summary);
                }
                for (reply, summary) in replies {
                    let _ = reply.send(Ok(summary));
                }
            }
            Err(e) => {
                tracing::error!("storing records failed: {e}");
                // What this commit counted was not stored: read it again.
                self.counts.clear();
                let text = e.to_string();
                for (reply, _) in replies {
                    let _ = reply.send(Err(IngestError::Store(StoreError::Invalid(text.clone()))));
                }
            }
        }
    }
}
