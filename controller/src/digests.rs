//! Digests of attempts' records (`benchfleet_core::Digest`): built once an
//! attempt's summary is stored, on a thread of their own, and stored through
//! the ingest committer (so that a purge and a digest never cross). A report
//! pools repeats from them without reading a record; one that finds a digest
//! missing (a controller stopped before it was built, a store older than
//! digests) builds it from the records and has it stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use benchfleet_core::{Digest, DigestBuilder, Summary, digest::records_of};

use crate::ingest::Ingest;
use crate::store::{Store, StoreError};
use benchfleet_study::model::AttemptKey;

/// Builds the digest of an attempt's stored records, checking that they are
/// the records its summary counts. `None` when `stop` was set meanwhile.
pub fn build(
    store: &dyn Store,
    attempt: &AttemptKey,
    summary: &Summary,
    stop: &AtomicBool,
) -> Result<Option<Digest>, StoreError> {
    build_of(store, attempt, records_of(summary), stop)
}

fn build_of(
    store: &dyn Store,
    attempt: &AttemptKey,
    expected: u64,
    stop: &AtomicBool,
) -> Result<Option<Digest>, StoreError> {
    let mut builder = DigestBuilder::default();
    for (i, r) in store.records(attempt).enumerate() {
        if i % 4096 == 0 && stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        builder.add(&r?);
    }
    let digest = builder.finish();
    if digest.records != expected {
        return Err(StoreError::Invalid(format!(
            "{attempt} has {} records stored but its summary counts {expected}",
            digest.records
        )));
    }
    Ok(Some(digest))
}

/// The digest of an attempt whose summary is stored: the stored one, or
/// one built now from its records (then handed to `keep`).
pub fn get_or_build(
    store: &dyn Store,
    attempt: &AttemptKey,
    summary: &Summary,
    keep: &dyn Fn(AttemptKey, &Digest),
) -> Result<Digest, StoreError> {
    match store.digest(attempt) {
        Ok(Some(d)) if d.records == records_of(summary) => return Ok(d),
        Ok(_) => {}
        Err(e) => tracing::warn!("{e}; building it again from the records"),
    }
    let digest = build(store, attempt, summary, &AtomicBool::new(false))?.expect("never stopped");
    keep(*attempt, &digest);
    Ok(digest)
}

/// What the digester is asked: an attempt whose summary was stored, and the
/// records that summary counts; `None` ends the thread.
pub type Owed = Option<(AttemptKey, u64)>;

/// The digester thread's handle.
pub struct Digester {
    tx: mpsc::Sender<Owed>,
    stop: Arc<AtomicBool>,
}

impl Digester {
    /// A digester whose queue is fed by `queue()` senders, and whose thread
    /// is started by [`Digester::run`] once the ingest committer exists.
    pub fn new() -> (Digester, mpsc::Receiver<Owed>) {
        let (tx, rx) = mpsc::channel();
        (Digester { tx, stop: Arc::new(AtomicBool::new(false)) }, rx)
    }

    /// A sender that queues attempts whose summaries were stored.
    pub fn queue(&self) -> mpsc::Sender<Owed> {
        self.tx.clone()
    }

    /// Starts the thread: first the attempts of `store` with a summary and
    /// no digest, then each queued one.
    pub fn run(&self, store: Arc<dyn Store>, ingest: Ingest, rx: mpsc::Receiver<Owed>) -> std::thread::JoinHandle<()> {
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name("digests".to_owned())
            .spawn(move || {
                let owed = || -> Result<Vec<(AttemptKey, u64)>, StoreError> {
                    let mut owed = Vec::new();
                    for run in store.runs()? {
                        for key in store.summarized(run.id)? {
                            if !store.has_digest(&key)?
                                && let Some(s) = store.summary(&key)?
                            {
                                owed.push((key, records_of(&s)));
                            }
                        }
                    }
                    Ok(owed)
                };
                let owed = owed().unwrap_or_else(|e| {
                    tracing::warn!("listing the attempts without a digest failed: {e}");
                    Vec::new()
                });
                for owed in owed.into_iter().map(Some).chain(rx.iter()) {
                    let Some((key, expected)) = owed else { return };
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let built = match store.has_digest(&key) {
                        Ok(false) => build_of(store.as_ref(), &key, expected, &stop),
                        Ok(true) => Ok(None),
                        Err(e) => Err(e),
                    };
                    match built {
                        Ok(Some(d)) => ingest.digest(key, &d),
                        Ok(None) => {}
                        Err(e) => tracing::warn!("no digest of {key} for now: {e}"),
                    }
                }
            })
            .expect("a thread can be spawned")
    }

    /// Ends the thread soon: a digest being built is given up.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.tx.send(None);
    }
}
