//! Persistence: the [`Store`] trait and its sled implementation.
//!
//! Keys are big-endian so that scans come out in order: runs by id, jobs by
//! (run, job), records by (run, job, attempt, seq). Values are JSON, readable
//! with any tool. Every write that a caller acknowledges to someone else is
//! flushed first.

use std::path::Path;

use benchfleet_core::RequestRecord;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sled::Transactional;

use crate::model::{AttemptKey, Group, Job, Run, RunId};

use std::path::PathBuf;

/// The store's directory: `--data-dir`, else `$XDG_DATA_HOME/benchfleet`,
/// else `~/.local/share/benchfleet`, else `./.benchfleet`.
pub fn data_dir(given: Option<&Path>) -> PathBuf {
    if let Some(d) = given {
        return d.to_path_buf();
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("benchfleet");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home).join(".local/share/benchfleet");
    }
    PathBuf::from(".benchfleet")
}

/// Bumped when the layout of stored values changes incompatibly.
const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store in {dir}: {source}")]
    Open { dir: String, source: sled::Error },
    #[error(
        "the store in {dir} is in use by another process (a running controller?); stop it, or ask it with --controller"
    )]
    Locked { dir: String },
    #[error("the store in {dir} has schema version {found}, this build reads version {SCHEMA_VERSION}")]
    Schema { dir: String, found: u32 },
    #[error("store i/o failed: {0}")]
    Sled(#[from] sled::Error),
    #[error("stored {what} is corrupt: {source}")]
    Corrupt { what: String, source: serde_json::Error },
    #[error("{0} not found")]
    NotFound(String),
}

/// Where runs, jobs, request records and dataset files live.
pub trait Store: Send + Sync + 'static {
    /// A new, never used run id.
    fn next_run_id(&self) -> Result<RunId, StoreError>;
    /// Stores a new run with its groups and jobs, all or nothing.
    fn create_run(&self, run: &Run, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError>;
    /// Adds groups and their jobs to an existing run, all or nothing.
    fn add_groups(&self, run: RunId, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError>;
    fn put_run(&self, run: &Run) -> Result<(), StoreError>;
    fn run(&self, id: RunId) -> Result<Option<Run>, StoreError>;
    fn runs(&self) -> Result<Vec<Run>, StoreError>;
    fn groups(&self, run: RunId) -> Result<Vec<Group>, StoreError>;
    fn put_job(&self, job: &Job) -> Result<(), StoreError>;
    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError>;
    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError>;
    /// Stores records of one attempt, keyed by their seq (a record stored
    /// twice is stored once), and flushes.
    fn put_records(&self, attempt: &AttemptKey, records: &[RequestRecord]) -> Result<(), StoreError>;
    fn records(&self, attempt: &AttemptKey) -> Result<Vec<RequestRecord>, StoreError>;
    /// Stores a file under its SHA-256 (hex).
    fn put_file(&self, sha256: &str, content: &[u8]) -> Result<(), StoreError>;
    fn file(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn flush(&self) -> Result<(), StoreError>;
}

/// The sled-backed store.
pub struct SledStore {
    db: sled::Db,
    runs: sled::Tree,
    groups: sled::Tree,
    jobs: sled::Tree,
    records: sled::Tree,
    files: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. A store another process holds
    /// is waited for briefly: sled's background thread releases its lock a
    /// moment after the previous owner is gone.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        let shown = dir.display().to_string();
        let mut tries = 0;
        let db = loop {
            match sled::open(dir) {
                Ok(db) => break db,
                Err(sled::Error::Io(io))
                    if io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("lock") =>
                {
                    tries += 1;
                    if tries == 20 {
                        return Err(StoreError::Locked { dir: shown });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(source) => return Err(StoreError::Open { dir: shown, source }),
            }
        };
        match db.get("schema_version")? {
            None => {
                db.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
            }
            Some(v) => {
                let found = v.as_ref().try_into().map(u32::from_be_bytes).unwrap_or(0);
                if found != SCHEMA_VERSION {
                    return Err(StoreError::Schema { dir: shown, found });
                }
            }
        }
        Ok(SledStore {
            runs: db.open_tree("runs")?,
            groups: db.open_tree("groups")?,
            jobs: db.open_tree("jobs")?,
            records: db.open_tree("records")?,
            files: db.open_tree("files")?,
            db,
        })
    }
}

impl SledStore {
    /// Writes a run (when given), groups and jobs in one transaction, and
    /// flushes.
    fn write_groups(&self, run: Option<&Run>, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        (&self.runs, &self.groups, &self.jobs)
            .transaction(|(runs, group_tree, job_tree)| {
                if let Some(run) = run {
                    runs.insert(key(&[run.id.0]), encode(run))?;
                }
                for g in groups {
                    group_tree.insert(key(&[g.run.0, g.id]), encode(g))?;
                }
                for j in jobs {
                    job_tree.insert(key(&[j.run.0, j.id]), encode(j))?;
                }
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(e) => StoreError::Sled(e),
                sled::transaction::TransactionError::Abort(()) => {
                    StoreError::Sled(sled::Error::Unsupported("transaction aborted".to_owned()))
                }
            })?;
        self.flush()
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain data types to JSON cannot fail.
    serde_json::to_vec(value).expect("domain types serialize to JSON")
}

fn decode<T: DeserializeOwned>(what: impl Fn() -> String, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { what: what(), source })
}

fn key(parts: &[u64]) -> Vec<u8> {
    parts.iter().flat_map(|p| p.to_be_bytes()).collect()
}

fn scan<T: DeserializeOwned>(tree: &sled::Tree, prefix: &[u64], what: &str) -> Result<Vec<T>, StoreError> {
    tree.scan_prefix(key(prefix))
        .map(|kv| {
            let (k, v) = kv?;
            decode(|| format!("{what} {k:?}"), &v)
        })
        .collect()
}

impl Store for SledStore {
    fn next_run_id(&self) -> Result<RunId, StoreError> {
        // A counter of our own rather than sled's generate_id, which skips
        // a million ids at every reopen: operators type these ids.
        // Never below a run already stored (a store written before the
        // counter existed).
        let newest = self.runs.last()?.and_then(|(k, _)| k.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
        let next = self.db.update_and_fetch("run_counter", |old| {
            let last = old.and_then(|v| v.try_into().ok()).map_or(0, u64::from_be_bytes);
            Some((last.max(newest) + 1).to_be_bytes().to_vec())
        })?;
        self.flush()?;
        let id = next.as_deref().and_then(|v| v.try_into().ok()).map_or(1, u64::from_be_bytes);
        Ok(RunId(id))
    }

    fn create_run(&self, run: &Run, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        self.write_groups(Some(run), groups, jobs)
    }

    fn add_groups(&self, run: RunId, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        if self.run(run)?.is_none() {
            return Err(StoreError::NotFound(format!("run {run}")));
        }
        self.write_groups(None, groups, jobs)
    }

    fn put_run(&self, run: &Run) -> Result<(), StoreError> {
        self.runs.insert(key(&[run.id.0]), encode(run))?;
        self.flush()
    }

    fn run(&self, id: RunId) -> Result<Option<Run>, StoreError> {
        self.runs.get(key(&[id.0]))?.map(|v| decode(|| format!("run {id}"), &v)).transpose()
    }

    fn runs(&self) -> Result<Vec<Run>, StoreError> {
        scan(&self.runs, &[], "run")
    }

    fn groups(&self, run: RunId) -> Result<Vec<Group>, StoreError> {
        scan(&self.groups, &[run.0], "group")
    }

    fn put_job(&self, job: &Job) -> Result<(), StoreError> {
        self.jobs.insert(key(&[job.run.0, job.id]), encode(job))?;
        self.flush()
    }

    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError> {
        self.jobs.get(key(&[run.0, job]))?.map(|v| decode(|| format!("job {run}/{job}"), &v)).transpose()
    }

    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError> {
        scan(&self.jobs, &[run.0], "job")
    }

    fn put_records(&self, attempt: &AttemptKey, records: &[RequestRecord]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for r in records {
            batch.insert(key(&[attempt.run.0, attempt.job, u64::from(attempt.attempt), r.seq]), encode(r));
        }
        self.records.apply_batch(batch)?;
        self.flush()
    }

    fn records(&self, attempt: &AttemptKey) -> Result<Vec<RequestRecord>, StoreError> {
        scan(&self.records, &[attempt.run.0, attempt.job, u64::from(attempt.attempt)], "record")
    }

    fn put_file(&self, sha256: &str, content: &[u8]) -> Result<(), StoreError> {
        self.files.insert(sha256, content)?;
        self.flush()
    }

    fn file(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.files.get(sha256)?.map(|v| v.to_vec()))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arrival, Dataset, Endpoint, Profile};
    use benchfleet_core::Outcome;

    fn job(run: RunId, id: u64) -> Job {
        let profile = Profile {
            name: "p".to_owned(),
            dataset: Dataset::Random { input_tokens: 8, output_tokens: 4, seed: 1 },
            rate: Some(1.0),
            arrival: Arrival::Constant,
            requests: 1,
            max_concurrency: None,
            endpoint: Endpoint::Completions,
            seed: 0,
        };
        Job::new(run, id, 0, profile, 1)
    }

    fn record(seq: u64) -> RequestRecord {
        RequestRecord {
            seq,
            scheduled_ns: 0,
            sent_ns: 1,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: Some(2),
            completed_ns: 3,
            chunks: Default::default(),
            prompt_tokens: 8,
            output_tokens: 4,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            phase: Default::default(),
        }
    }

    #[test]
    fn survives_reopen_and_keeps_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let attempt = AttemptKey { run: RunId(1), job: 2, attempt: 1 };
        {
            let store = SledStore::open(dir.path()).expect("open");
            let run = Run {
                id: store.next_run_id().expect("id"),
                name: "n".to_owned(),
                matrix_file: "m.yaml".to_owned(),
                matrix_yaml: String::new(),
                created_unix_ms: 0,
                finished: false,
                files: Default::default(),
                runtime_override: None,
            };
            let jobs: Vec<Job> = (0..300).map(|i| job(run.id, i)).collect();
            store.create_run(&run, &[], &jobs).expect("create");
            store.put_records(&attempt, &[record(256), record(1), record(2)]).expect("records");
            // A resent batch overwrites instead of doubling.
            store.put_records(&attempt, &[record(1)]).expect("records");
        }
        let store = SledStore::open(dir.path()).expect("reopen");
        let runs = store.runs().expect("runs");
        assert_eq!(runs.len(), 1);
        let ids: Vec<u64> = store.jobs(runs[0].id).expect("jobs").iter().map(|j| j.id).collect();
        assert_eq!(ids, (0..300).collect::<Vec<_>>());
        let seqs: Vec<u64> = store.records(&attempt).expect("records").iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2, 256]);
        // Run ids count up by one, across reopening too.
        assert_eq!(runs[0].id, RunId(1));
        assert_eq!(store.next_run_id().expect("id"), RunId(2));
    }

    #[test]
    fn a_second_open_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = SledStore::open(dir.path()).expect("open");
        let err = SledStore::open(dir.path()).err().expect("second open must fail");
        assert!(err.to_string().contains("in use by another process"), "{err}");
    }
}
