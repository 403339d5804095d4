//! Persistence: the [`Store`] trait and its sled implementation.
//!
//! Trees and their keys (big-endian, so scans come out in order): `runs`
//! (run), `groups` and `jobs` (run, id), `agents` (agent id), `summaries`,
//! `stats` (run, job, attempt), `records` (run, job, attempt, batch),
//! `telemetry` (run, job, attempt, part): an attempt's telemetry series,
//! apart from its job so that listing jobs stays small. Runs, groups, jobs,
//! agents, summaries and telemetry are JSON, readable with any tool;
//! records are a compact binary encoding (`codec`), stored as the batches
//! loadgen sent (a batch sent twice is stored once). Dataset and tokenizer
//! files live beside the trees, as files named by their SHA-256
//! (`files/<sha256>`), so that a file of hundreds of MiB streams in and out
//! with bounded memory. The schema version covers all of it; `migrate`
//! brings an older store up to date. Every write that a caller acknowledges
//! to someone else is flushed first.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use benchfleet_core::telemetry::Series;
use benchfleet_core::{Digest, RequestRecord, Summary};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Digest as _;
use sled::Transactional;

use crate::model::{AgentRecord, AttemptKey, AttemptStats, Counters, Group, Job, Run, RunId, Write};

pub mod codec;
mod migrate;

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

/// Bumped when the layout of stored values changes; `migrate` knows every
/// earlier one.
const SCHEMA_VERSION: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store in {dir}: {source}")]
    Open { dir: String, source: sled::Error },
    #[error(
        "the store in {dir} is in use by another process (a running controller?); stop it, or ask it with --controller"
    )]
    Locked { dir: String },
    #[error(
        "the store in {dir} has schema version {found}, newer than this build reads ({SCHEMA_VERSION}); use a newer benchfleet"
    )]
    Schema { dir: String, found: u32 },
    #[error("store i/o failed: {0}")]
    Sled(#[from] sled::Error),
    #[error("file i/o in the store failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("stored {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
}

/// One group commit of the ingest service: record batches, summaries and
/// per-attempt counts, and the removal of superseded attempts' records.
#[derive(Debug, Default)]
pub struct RecordCommit {
    /// (attempt, batch number, encoded batch).
    pub batches: Vec<(AttemptKey, u64, Vec<u8>)>,
    pub summaries: Vec<(AttemptKey, Summary)>,
    pub stats: Vec<(AttemptKey, AttemptStats)>,
    /// Removes the records, summaries, digests and telemetry of the job's
    /// attempts before this one (their stats stay, marked removed).
    pub purges: Vec<AttemptKey>,
    /// Digests of attempts' records (encoded), each stored only while the
    /// attempt's summary is: applied after the purges, so a digest built
    /// while its attempt was superseded is not kept.
    pub digests: Vec<(AttemptKey, Vec<u8>)>,
}

impl RecordCommit {
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
            && self.summaries.is_empty()
            && self.stats.is_empty()
            && self.purges.is_empty()
            && self.digests.is_empty()
    }
}

/// Records of one attempt, read one stored batch at a time.
pub type Records<'a> = Box<dyn Iterator<Item = Result<RequestRecord, StoreError>> + 'a>;

/// Where runs, jobs, agents, request records and files live.
pub trait Store: Send + Sync + 'static {
    /// A new, never used run id.
    fn next_run_id(&self) -> Result<RunId, StoreError>;
    /// Takes `id` for a new run if this store never gave it out (it is above
    /// every id handed out or stored); later `next_run_id`s go on from it.
    /// An id handed out and never stored is not given again: a submission
    /// may still be on its way to storing it.
    fn claim_run_id(&self, id: RunId) -> Result<bool, StoreError>;
    /// Stores a new run with its groups and jobs, all or nothing.
    fn create_run(&self, run: &Run, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError>;
    /// Adds groups and their jobs to an existing run, all or nothing.
    fn add_groups(&self, run: RunId, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError>;
    /// The scheduler's writes, all or nothing, flushed.
    fn apply(&self, writes: &[Write]) -> Result<(), StoreError>;
    fn run(&self, id: RunId) -> Result<Option<Run>, StoreError>;
    fn runs(&self) -> Result<Vec<Run>, StoreError>;
    fn groups(&self, run: RunId) -> Result<Vec<Group>, StoreError>;
    /// The run's jobs, each with the summary of its current attempt.
    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError>;
    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError>;
    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError>;
    fn counters(&self) -> Result<Counters, StoreError>;
    /// The enrolment state (`enrol`): join tokens, agents' certificates,
    /// revocations, as its JSON.
    fn enrolment(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    /// Stores the enrolment state, flushed.
    fn put_enrolment(&self, _json: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Invalid("this store keeps no enrolment".to_owned()))
    }
    /// Applies one ingest commit and flushes (a commit of digests alone,
    /// which can be built again, is left to the next flush).
    fn commit_records(&self, commit: &RecordCommit) -> Result<(), StoreError>;
    /// How many records a stored batch holds, if it is stored.
    fn stored_batch(&self, attempt: &AttemptKey, batch: u64) -> Result<Option<u64>, StoreError>;
    /// An attempt's records, in the order of their batches.
    fn records(&self, attempt: &AttemptKey) -> Records<'_>;
    fn summary(&self, attempt: &AttemptKey) -> Result<Option<Summary>, StoreError>;
    /// The series of an attempt's telemetry (the engine's `/metrics`, the
    /// GPUs' readings), if its agent sent them; the job holds their summary.
    fn telemetry(&self, attempt: &AttemptKey) -> Result<Option<Vec<Series>>, StoreError>;
    /// The digest of an attempt's records, if one of this build's encoding
    /// is stored (`None` tells the caller to build it from the records).
    fn digest(&self, attempt: &AttemptKey) -> Result<Option<Digest>, StoreError>;
    /// Whether a digest of this build's encoding is stored, without reading it.
    fn has_digest(&self, attempt: &AttemptKey) -> Result<bool, StoreError>;
    /// The attempts of a run that have a summary stored.
    fn summarized(&self, run: RunId) -> Result<Vec<AttemptKey>, StoreError>;
    fn attempt_stats(&self, run: RunId) -> Result<BTreeMap<AttemptKey, AttemptStats>, StoreError>;
    fn stats(&self, attempt: &AttemptKey) -> Result<Option<AttemptStats>, StoreError>;
    /// Whether a file with this SHA-256 is stored.
    fn has_file(&self, sha256: &str) -> Result<bool, StoreError>;
    /// Starts storing a file; nothing is stored until `FileWriter::finish`.
    fn new_file(&self) -> Result<FileWriter, StoreError>;
    /// A stored file, opened for reading, and its size.
    fn open_file(&self, sha256: &str) -> Result<Option<(std::fs::File, u64)>, StoreError>;
    fn flush(&self) -> Result<(), StoreError>;
    /// Bytes the store takes on disk (files included).
    fn size_on_disk(&self) -> Result<u64, StoreError>;
}

/// A file being stored: written to a temporary file while its hash is
/// computed, renamed to its hash once complete and checked.
pub struct FileWriter {
    dir: PathBuf,
    tmp: PathBuf,
    file: Option<std::fs::File>,
    hasher: sha2::Sha256,
    size: u64,
}

impl FileWriter {
    pub fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let file = self.file.as_mut().ok_or_else(|| StoreError::Invalid("file already finished".to_owned()))?;
        file.write_all(data)?;
        self.hasher.update(data);
        self.size += data.len() as u64;
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks the content against what the sender said it is, and stores it
    /// under its hash.
    pub fn finish(mut self, sha256: &str, size: u64) -> Result<(), StoreError> {
        let got = hex(&std::mem::take(&mut self.hasher).finalize());
        if got != sha256.to_ascii_lowercase() {
            return Err(StoreError::Invalid(format!(
                "the file's content has SHA-256 {got}, not the {sha256} it was sent as; send it again"
            )));
        }
        if self.size != size {
            return Err(StoreError::Invalid(format!("the file is {} bytes, not the {size} it was sent as", self.size)));
        }
        if let Some(file) = self.file.take() {
            file.sync_all()?;
        }
        std::fs::rename(&self.tmp, self.dir.join(&got))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        // An upload that did not finish leaves nothing behind.
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is a SHA-256 in hex.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The sled-backed store.
pub struct SledStore {
    db: sled::Db,
    files: PathBuf,
    runs: sled::Tree,
    groups: sled::Tree,
    jobs: sled::Tree,
    agents: sled::Tree,
    summaries: sled::Tree,
    stats: sled::Tree,
    records: sled::Tree,
    /// Each attempt's digest (`codec::encode_digest`) in parts: derived from
    /// its records, so any can be dropped and built again.
    digests: sled::Tree,
    /// Each attempt's telemetry series, JSON in parts of at most `PART_BYTES`.
    telemetry: sled::Tree,
    /// Counters that are not a run's.
    meta: sled::Tree,
}

impl SledStore {
    /// Opens (or creates) the store in `dir`, migrating an older layout. A
    /// store another process holds is waited for briefly: sled's background
    /// thread releases its lock a moment after the previous owner is gone.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        let shown = dir.display().to_string();
        let mut tries = 0;
        let db = loop {
            match sled::Config::new().path(dir).cache_capacity(64 << 20).open() {
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
        let files = dir.join("files");
        std::fs::create_dir_all(&files)?;
        // Uploads a crash cut short.
        for entry in std::fs::read_dir(&files)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".upload-") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let found = match db.get("schema_version")? {
            None if db.tree_names().len() <= 1 && db.is_empty() => SCHEMA_VERSION,
            None => 1,
            Some(v) => v.as_ref().try_into().map(u32::from_be_bytes).unwrap_or(0),
        };
        if found > SCHEMA_VERSION {
            return Err(StoreError::Schema { dir: shown, found });
        }
        let store = SledStore {
            runs: db.open_tree("runs")?,
            groups: db.open_tree("groups")?,
            jobs: db.open_tree("jobs")?,
            agents: db.open_tree("agents")?,
            summaries: db.open_tree("summaries")?,
            stats: db.open_tree("stats")?,
            records: db.open_tree("records")?,
            digests: db.open_tree("digests")?,
            telemetry: db.open_tree("telemetry")?,
            meta: db.open_tree("meta")?,
            files,
            db,
        };
        if found < SCHEMA_VERSION {
            migrate::run(&store, found)?;
        }
        store.db.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
        store.flush()?;
        Ok(store)
    }

    /// Writes a run (when given), groups and jobs in one transaction, and
    /// flushes.
    fn write_groups(&self, run: Option<&Run>, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        let mut writes: Vec<Write> = run.map(|r| Write::Run(r.clone())).into_iter().collect();
        writes.extend(groups.iter().cloned().map(Write::Group));
        writes.extend(jobs.iter().cloned().map(Write::Job));
        self.apply(&writes)
    }
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain data types to JSON cannot fail.
    serde_json::to_vec(value).expect("domain types serialize to JSON")
}

pub(crate) fn decode<T: DeserializeOwned>(what: impl Fn() -> String, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt { what: what(), reason: e.to_string() })
}

pub(crate) fn key(parts: &[u64]) -> Vec<u8> {
    parts.iter().flat_map(|p| p.to_be_bytes()).collect()
}

fn attempt_key(a: &AttemptKey) -> Vec<u8> {
    key(&[a.run.0, a.job, u64::from(a.attempt)])
}

/// The (run, job, attempt) at the start of a key.
fn attempt_of(k: &[u8]) -> Option<AttemptKey> {
    let part = |i: usize| k.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
    Some(AttemptKey { run: RunId(part(0)?), job: part(1)?, attempt: u32::try_from(part(2)?).ok()? })
}

/// A stored batch is cut into parts of at most this many bytes: sled keeps
/// large values in memory (with 180 KB values, its memory grew with all
/// that was written; with 16 KB ones it stays near its cache), so a long run
/// must not arrive as large values.
const PART_BYTES: usize = 16 << 10;

/// The keys and contents of a batch's parts: (run, job, attempt, batch,
/// part).
pub(crate) fn batch_parts<'a>(
    attempt: &AttemptKey,
    batch: u64,
    bytes: &'a [u8],
) -> impl Iterator<Item = (Vec<u8>, &'a [u8])> + 'a {
    let prefix = attempt_key(attempt);
    // An empty batch still has its one part.
    let parts: Vec<&'a [u8]> = if bytes.is_empty() { vec![bytes] } else { bytes.chunks(PART_BYTES).collect() };
    parts.into_iter().enumerate().map(move |(i, part)| {
        let mut k = prefix.clone();
        k.extend_from_slice(&batch.to_be_bytes());
        k.extend_from_slice(&(i as u32).to_be_bytes());
        (k, part)
    })
}

/// An attempt's records read back: each batch's parts joined, then decoded,
/// one batch at a time.
struct StoredRecords {
    attempt: AttemptKey,
    parts: sled::Iter,
    /// The batch being joined: its number and bytes so far.
    batch: Option<(u64, Vec<u8>)>,
    decoded: std::collections::VecDeque<Result<RequestRecord, StoreError>>,
}

impl StoredRecords {
    fn decode(&mut self, bytes: &[u8]) {
        let corrupt = |e: codec::DecodeError| StoreError::Corrupt {
            what: format!("records of {}", self.attempt),
            reason: e.to_string(),
        };
        match codec::BatchReader::new(bytes) {
            Ok(reader) => self.decoded.extend(reader.map(|r| r.map_err(corrupt))),
            Err(e) => self.decoded.push_back(Err(corrupt(e))),
        }
    }
}

impl Iterator for StoredRecords {
    type Item = Result<RequestRecord, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(r) = self.decoded.pop_front() {
                return Some(r);
            }
            match self.parts.next() {
                Some(Err(e)) => return Some(Err(e.into())),
                Some(Ok((k, v))) => {
                    let number = k.get(24..32).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
                    match &mut self.batch {
                        Some((n, bytes)) if *n == number => bytes.extend_from_slice(&v),
                        _ => {
                            if let Some((_, bytes)) = self.batch.replace((number, v.to_vec())) {
                                self.decode(&bytes);
                            }
                        }
                    }
                }
                None => {
                    let (_, bytes) = self.batch.take()?;
                    self.decode(&bytes);
                }
            }
        }
    }
}

fn scan<T: DeserializeOwned>(tree: &sled::Tree, prefix: &[u64], what: &str) -> Result<Vec<T>, StoreError> {
    tree.scan_prefix(key(prefix))
        .map(|kv| {
            let (k, v) = kv?;
            decode(|| format!("{what} {k:?}"), &v)
        })
        .collect()
}

fn abort(e: sled::transaction::TransactionError<()>) -> StoreError {
    match e {
        sled::transaction::TransactionError::Storage(e) => StoreError::Sled(e),
        sled::transaction::TransactionError::Abort(()) => {
            StoreError::Sled(sled::Error::Unsupported("transaction aborted".to_owned()))
        }
    }
}

impl Store for SledStore {
    fn next_run_id(&self) -> Result<RunId, StoreError> {
        // A counter of our own rather than sled's generate_id, which skips
        // a million ids at every reopen: operators type these ids.
        // Never below a run already stored.
        let newest = self.runs.last()?.and_then(|(k, _)| k.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
        let next = self.db.update_and_fetch("run_counter", |old| {
            let last = old.and_then(|v| v.try_into().ok()).map_or(0, u64::from_be_bytes);
            Some((last.max(newest) + 1).to_be_bytes().to_vec())
        })?;
        self.flush()?;
        let id = next.as_deref().and_then(|v| v.try_into().ok()).map_or(1, u64::from_be_bytes);
        Ok(RunId(id))
    }

    fn claim_run_id(&self, id: RunId) -> Result<bool, StoreError> {
        let newest = self.runs.last()?.and_then(|(k, _)| k.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
        let mut claimed = false;
        self.db.update_and_fetch("run_counter", |old| {
            let last = old.and_then(|v| v.try_into().ok()).map_or(0, u64::from_be_bytes);
            // The last id is never claimed: `next_run_id` adds one to it.
            claimed = id.0 > last.max(newest) && id.0 < u64::MAX;
            Some(if claimed { id.0 } else { last }.to_be_bytes().to_vec())
        })?;
        self.flush()?;
        Ok(claimed)
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

    fn apply(&self, writes: &[Write]) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        // An attempt's series replace whatever parts it had (a report sent
        // again after a reconnect writes them again).
        let mut stale: Vec<Vec<u8>> = Vec::new();
        let mut encoded: Vec<(u8, Vec<u8>, Vec<u8>)> = Vec::new();
        for w in writes {
            match w {
                Write::Run(r) => encoded.push((0, key(&[r.id.0]), encode(r))),
                Write::Group(g) => encoded.push((1, key(&[g.run.0, g.id]), encode(g))),
                Write::Job(j) => encoded.push((2, key(&[j.run.0, j.id]), encode(j))),
                Write::Agent(a) => encoded.push((3, key(&[a.id.0]), encode(a))),
                Write::Counters(c) => encoded.push((4, b"counters".to_vec(), key(&[c.next_agent, c.next_epoch]))),
                Write::Telemetry(attempt, series) => {
                    for k in self.telemetry.scan_prefix(attempt_key(attempt)).keys() {
                        stale.push(k?.to_vec());
                    }
                    for (i, part) in encode(series).chunks(PART_BYTES).enumerate() {
                        let mut k = attempt_key(attempt);
                        k.extend_from_slice(&(i as u32).to_be_bytes());
                        encoded.push((5, k, part.to_vec()));
                    }
                }
            }
        }
        (&self.runs, &self.groups, &self.jobs, &self.agents, &self.meta, &self.telemetry)
            .transaction(|(runs, groups, jobs, agents, meta, telemetry)| {
                for k in &stale {
                    telemetry.remove(k.as_slice())?;
                }
                for (tree, k, v) in &encoded {
                    let t = match tree {
                        0 => runs,
                        1 => groups,
                        2 => jobs,
                        3 => agents,
                        5 => telemetry,
                        _ => meta,
                    };
                    t.insert(k.as_slice(), v.as_slice())?;
                }
                Ok(())
            })
            .map_err(abort)?;
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

    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError> {
        let mut jobs: Vec<Job> = scan(&self.jobs, &[run.0], "job")?;
        for job in &mut jobs {
            job.summary = self.summary(&job.key())?;
        }
        Ok(jobs)
    }

    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError> {
        let Some(mut j) =
            self.jobs.get(key(&[run.0, job]))?.map(|v| decode::<Job>(|| format!("job {run}/{job}"), &v)).transpose()?
        else {
            return Ok(None);
        };
        j.summary = self.summary(&j.key())?;
        Ok(Some(j))
    }

    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        scan(&self.agents, &[], "agent")
    }

    fn enrolment(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.meta.get("enrolment")?.map(|v| v.to_vec()))
    }

    fn put_enrolment(&self, json: &[u8]) -> Result<(), StoreError> {
        self.meta.insert("enrolment", json)?;
        self.meta.flush()?;
        Ok(())
    }

    fn counters(&self) -> Result<Counters, StoreError> {
        let Some(v) = self.meta.get("counters")? else { return Ok(Counters::default()) };
        let part = |i: usize| v.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
        match (part(0), part(1)) {
            (Some(next_agent), Some(next_epoch)) => Ok(Counters { next_agent, next_epoch }),
            _ => Err(StoreError::Corrupt { what: "counters".to_owned(), reason: format!("{} bytes", v.len()) }),
        }
    }

    fn commit_records(&self, commit: &RecordCommit) -> Result<(), StoreError> {
        let mut records = sled::Batch::default();
        let mut summaries = sled::Batch::default();
        let mut stats = sled::Batch::default();
        for purge in &commit.purges {
            for kv in self.records.scan_prefix(key(&[purge.run.0, purge.job])) {
                let (k, _) = kv?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    records.remove(k);
                }
            }
            for kv in self.summaries.scan_prefix(key(&[purge.run.0, purge.job])) {
                let (k, _) = kv?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    summaries.remove(k);
                }
            }
            for kv in self.stats.scan_prefix(key(&[purge.run.0, purge.job])) {
                let (k, v) = kv?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    let mut s: AttemptStats = decode(|| "attempt stats".to_owned(), &v)?;
                    s.removed = true;
                    stats.insert(k, encode(&s));
                }
            }
        }
        for (attempt, batch, bytes) in &commit.batches {
            for (k, part) in batch_parts(attempt, *batch, bytes) {
                records.insert(k, part);
            }
        }
        for (attempt, summary) in &commit.summaries {
            summaries.insert(attempt_key(attempt), encode(summary));
        }
        for (attempt, s) in &commit.stats {
            stats.insert(attempt_key(attempt), encode(s));
        }
        self.records.apply_batch(records)?;
        self.summaries.apply_batch(summaries)?;
        self.stats.apply_batch(stats)?;
        let mut telemetry = sled::Batch::default();
        for purge in &commit.purges {
            for k in self.telemetry.scan_prefix(key(&[purge.run.0, purge.job])).keys() {
                let k = k?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    telemetry.remove(k);
                }
            }
        }
        self.telemetry.apply_batch(telemetry)?;
        let mut digests = sled::Batch::default();
        for purge in &commit.purges {
            for k in self.digests.scan_prefix(key(&[purge.run.0, purge.job])).keys() {
                let k = k?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    digests.remove(k);
                }
            }
        }
        for (attempt, bytes) in &commit.digests {
            if !self.summaries.contains_key(attempt_key(attempt))? {
                continue;
            }
            // A digest built again replaces the old one whole.
            for k in self.digests.scan_prefix(attempt_key(attempt)).keys() {
                digests.remove(k?);
            }
            for (i, part) in bytes.chunks(PART_BYTES).enumerate() {
                let mut k = attempt_key(attempt);
                k.extend_from_slice(&(i as u32).to_be_bytes());
                digests.insert(k, part);
            }
        }
        self.digests.apply_batch(digests)?;
        // Digests can always be built again: alone, they wait for the next
        // flush (sled's own, or the next commit's).
        if commit.batches.is_empty()
            && commit.summaries.is_empty()
            && commit.stats.is_empty()
            && commit.purges.is_empty()
        {
            return Ok(());
        }
        self.flush()
    }

    fn stored_batch(&self, attempt: &AttemptKey, batch: u64) -> Result<Option<u64>, StoreError> {
        let mut k = attempt_key(attempt);
        k.extend_from_slice(&batch.to_be_bytes());
        k.extend_from_slice(&0u32.to_be_bytes());
        // The batch's first part begins with its record count.
        match self.records.get(k)? {
            None => Ok(None),
            Some(v) => codec::BatchReader::count(&v).map(Some).map_err(|e| StoreError::Corrupt {
                what: format!("records of {attempt}, batch {batch}"),
                reason: e.to_string(),
            }),
        }
    }

    fn records(&self, attempt: &AttemptKey) -> Records<'_> {
        Box::new(StoredRecords {
            attempt: *attempt,
            parts: self.records.scan_prefix(attempt_key(attempt)),
            batch: None,
            decoded: std::collections::VecDeque::new(),
        })
    }

    fn summary(&self, attempt: &AttemptKey) -> Result<Option<Summary>, StoreError> {
        self.summaries.get(attempt_key(attempt))?.map(|v| decode(|| format!("summary of {attempt}"), &v)).transpose()
    }

    fn telemetry(&self, attempt: &AttemptKey) -> Result<Option<Vec<Series>>, StoreError> {
        let mut bytes = Vec::new();
        for part in self.telemetry.scan_prefix(attempt_key(attempt)).values() {
            bytes.extend_from_slice(&part?);
        }
        if bytes.is_empty() {
            return Ok(None);
        }
        decode(|| format!("telemetry of {attempt}"), &bytes).map(Some)
    }

    fn digest(&self, attempt: &AttemptKey) -> Result<Option<Digest>, StoreError> {
        let mut bytes = Vec::new();
        for part in self.digests.scan_prefix(attempt_key(attempt)).values() {
            bytes.extend_from_slice(&part?);
        }
        if bytes.is_empty() || bytes[0] != codec::DIGEST_VERSION {
            return Ok(None);
        }
        codec::decode_digest(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Corrupt { what: format!("digest of {attempt}"), reason: e.to_string() })
    }

    fn has_digest(&self, attempt: &AttemptKey) -> Result<bool, StoreError> {
        let mut first = attempt_key(attempt);
        first.extend_from_slice(&0u32.to_be_bytes());
        Ok(self.digests.get(first)?.is_some_and(|part| part.first() == Some(&codec::DIGEST_VERSION)))
    }

    fn summarized(&self, run: RunId) -> Result<Vec<AttemptKey>, StoreError> {
        self.summaries
            .scan_prefix(key(&[run.0]))
            .keys()
            .map(|k| Ok(attempt_of(&k?)))
            .filter_map(Result::transpose)
            .collect()
    }

    fn attempt_stats(&self, run: RunId) -> Result<BTreeMap<AttemptKey, AttemptStats>, StoreError> {
        let mut out = BTreeMap::new();
        for kv in self.stats.scan_prefix(key(&[run.0])) {
            let (k, v) = kv?;
            if let Some(a) = attempt_of(&k) {
                out.insert(a, decode(|| format!("stats of {a}"), &v)?);
            }
        }
        Ok(out)
    }

    fn stats(&self, attempt: &AttemptKey) -> Result<Option<AttemptStats>, StoreError> {
        self.stats.get(attempt_key(attempt))?.map(|v| decode(|| format!("stats of {attempt}"), &v)).transpose()
    }

    fn has_file(&self, sha256: &str) -> Result<bool, StoreError> {
        Ok(is_sha256(sha256) && self.files.join(sha256.to_ascii_lowercase()).is_file())
    }

    fn new_file(&self) -> Result<FileWriter, StoreError> {
        let tmp = self.files.join(format!(".upload-{}", rand_name()));
        let file = std::fs::File::create(&tmp)?;
        Ok(FileWriter { dir: self.files.clone(), tmp, file: Some(file), hasher: sha2::Sha256::new(), size: 0 })
    }

    fn open_file(&self, sha256: &str) -> Result<Option<(std::fs::File, u64)>, StoreError> {
        if !is_sha256(sha256) {
            return Ok(None);
        }
        match std::fs::File::open(self.files.join(sha256.to_ascii_lowercase())) {
            Ok(f) => {
                let size = f.metadata()?.len();
                Ok(Some((f, size)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        let mut bytes = self.db.size_on_disk()?;
        for entry in std::fs::read_dir(&self.files)?.flatten() {
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
        Ok(bytes)
    }
}

/// A name no other upload in flight has: the process, a counter and the time.
fn rand_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{n}-{t}", std::process::id())
}

#[cfg(test)]
mod tests;
