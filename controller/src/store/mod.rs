//! Persistence: the [`Store`] trait and its sled implementation.
//!
//! Trees and their keys (big-endian, so scans come out in order): `runs`
//! (run), `groups` and `jobs` (run, id), `agents` (agent id), `summaries`,
//! `stats` (run, job, attempt), `records` (run, job, attempt, batch),
//! `telemetry` (run, job, attempt, part): an attempt's telemetry series,
//! apart from its job so that listing jobs stays small; `run_counts` (run):
//! what a listing shows of a run (its jobs by state, its groups and latest
//! stage), changed in the same transaction as the jobs and groups it counts,
//! so that listing runs reads no job; `deleted` (run): runs being deleted.
//! Runs, groups, jobs, agents, summaries, counts and telemetry are JSON,
//! readable with any tool; records are a compact binary encoding (`codec`),
//! stored as the batches loadgen sent (a batch sent twice is stored once).
//! Dataset and tokenizer files live beside the trees, as files named by
//! their SHA-256 (`files/<sha256>`), so that a file of hundreds of MiB
//! streams in and out with bounded memory. The schema version covers all of
//! it; `migrate` brings an older store up to date. Every write that a
//! caller acknowledges to someone else is flushed first.
//!
//! A run is deleted in two steps: one transaction takes it out of `runs`
//! and `run_counts` and marks it in `deleted` (from then on nothing reads
//! it), then its keys are removed tree by tree and the mark last. Opening
//! the store finishes a delete a crash cut short, so a crash leaves either
//! the whole run or nothing of it visible.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use benchfleet_core::telemetry::Series;
use benchfleet_core::{Digest, RequestRecord, Summary};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Digest as _;
use sled::Transactional;

use benchfleet_study::model::{AttemptKey, AttemptStats, Group, Job, JobState, Progress, Run, RunId};

use crate::records::{AgentRecord, Counters, Write};

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
const SCHEMA_VERSION: u32 = 4;

/// A stored file that no run names is removed by a delete only once nobody
/// has uploaded it or asked for it for this long: a submission checks its
/// files before it stores its run, and a file it found must still be there
/// when its run is stored.
pub const FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

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
    /// The run may still change (a delete of it is refused): why, for the
    /// operator.
    #[error("{0}")]
    NotOver(String),
}

/// What a listing shows of a run without reading its jobs (`run_counts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RunCounts {
    /// Jobs by state, in the order of `JobState::ALL`.
    pub jobs: [u64; 7],
    pub groups: u64,
    /// The latest stage of its groups; 0 while it has none.
    pub stage: u32,
}

impl RunCounts {
    /// Counted from the run's groups and jobs (what `migrate` does once).
    pub fn of<'a>(groups: impl IntoIterator<Item = &'a Group>, jobs: impl IntoIterator<Item = &'a Job>) -> RunCounts {
        let mut c = RunCounts::default();
        for g in groups {
            c.groups += 1;
            c.stage = c.stage.max(g.stage);
        }
        for j in jobs {
            c.jobs[state_index(j.state)] += 1;
        }
        c
    }

    pub fn jobs_in(&self, state: JobState) -> u64 {
        self.jobs[state_index(state)]
    }

    /// The counts a run's progress is shown with.
    pub fn progress(&self) -> Progress {
        Progress {
            total: self.jobs.iter().sum(),
            succeeded: self.jobs_in(JobState::Succeeded),
            failed: self.jobs_in(JobState::Failed),
            cancelled: self.jobs_in(JobState::Cancelled),
        }
    }

    /// The stage a listing shows: 1 before the run has any group.
    pub fn stage(&self) -> u32 {
        if self.groups == 0 { 1 } else { self.stage }
    }
}

fn state_index(state: JobState) -> usize {
    JobState::ALL.iter().position(|s| *s == state).unwrap_or(0)
}

/// What a delete removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    pub jobs: u64,
    /// Records of the jobs' attempts (those not removed before).
    pub records: u64,
    /// The SHA-256 of each stored file removed with it.
    pub files: Vec<String>,
}

/// Why a run cannot be deleted or exported now, if it cannot: it is still
/// running, a group of it still holds GPUs, or a job of it has not ended.
/// `verb` is what the operator asked for ("export", "delete").
pub fn unsettled(run: &Run, groups: &[Group], jobs: &[Job], verb: &str) -> Option<String> {
    let id = run.id;
    if !run.is_over() {
        return Some(format!("run {id} is still running; {verb} it once it has finished or been cancelled"));
    }
    if let Some((g, p)) = groups.iter().find_map(|g| g.placement.as_ref().map(|p| (g, p))) {
        return Some(format!(
            "run {id} is over, but its group {} still holds GPUs on {} until that agent has stopped it; \
             {verb} it once it has",
            g.id, p.agent
        ));
    }
    jobs.iter().find(|j| !j.state.is_terminal()).map(|j| {
        format!(
            "run {id} is over, but its job {} is still {}; {verb} it once the job has ended",
            j.id,
            j.state.as_str()
        )
    })
}

/// One group commit of the ingest service: record batches, summaries and
/// per-attempt counts, and the removal of superseded attempts' records;
/// stored in one transaction.
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
    /// Every run with what a listing shows of it. This default reads every
    /// job of every run; `SledStore` reads the counts it keeps instead.
    fn listed_runs(&self) -> Result<Vec<(Run, RunCounts)>, StoreError> {
        let mut out = Vec::new();
        for run in self.runs()? {
            let counts = RunCounts::of(&self.groups(run.id)?, &self.jobs(run.id)?);
            out.push((run, counts));
        }
        Ok(out)
    }
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
    /// Applies one ingest commit, all or nothing, and flushes (a commit of
    /// digests alone, which can be built again, is left to the next flush):
    /// after a crash, a batch is stored with the stats that count it, or
    /// neither is, so a batch sent again is counted exactly once.
    fn commit_records(&self, commit: &RecordCommit) -> Result<(), StoreError>;
    /// How many records a stored batch holds, if it is stored. A stored
    /// batch is counted in its attempt's stats.
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
    /// The first step of a delete: refuses a run that may still change
    /// (`StoreError::NotOver`, with `unsettled`'s reason), else takes it out
    /// of sight at once, flushed: no read finds it from here on, and the
    /// store finishes the delete when it opens if `purge_run` does not.
    /// The caller keeps the run from changing meanwhile (the controller
    /// does this on the scheduler's thread).
    fn hide_run(&self, _run: RunId) -> Result<(), StoreError> {
        Err(StoreError::Invalid("this store deletes no run".to_owned()))
    }
    /// The second step: removes everything of a hidden run (jobs, groups,
    /// summaries, stats, records, telemetry, digests, counts) and every
    /// stored file no run names (`FILE_GRACE`), then its mark. A run that is
    /// not hidden is left alone.
    fn purge_run(&self, _run: RunId) -> Result<Deleted, StoreError> {
        Err(StoreError::Invalid("this store deletes no run".to_owned()))
    }
    /// Deletes a run that is over, with everything stored of it.
    fn delete_run(&self, run: RunId) -> Result<Deleted, StoreError> {
        self.hide_run(run)?;
        self.purge_run(run)
    }
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
    /// What a listing shows of each run (`RunCounts`).
    run_counts: sled::Tree,
    /// Runs hidden and not yet removed whole.
    deleted: sled::Tree,
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
            run_counts: db.open_tree("run_counts")?,
            deleted: db.open_tree("deleted")?,
            files,
            db,
        };
        if found < SCHEMA_VERSION {
            migrate::run(&store, found)?;
        }
        store.db.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())?;
        store.flush()?;
        // Deletes a crash cut short.
        for k in store.deleted.iter().keys() {
            let run = RunId(first_u64(&k?));
            tracing::info!(%run, "finishing the delete of run {run}");
            store.purge_run(run)?;
        }
        Ok(store)
    }

    /// The first step of a delete alone, as a crash right after it would
    /// leave the store (`hide_run`, without its checks).
    #[cfg(test)]
    pub(crate) fn mark_deleted(&self, run: RunId) -> Result<(), StoreError> {
        self.hide(run, false)
    }

    /// The transaction that hides a run: out of `runs` and `run_counts`,
    /// marked in `deleted`, its id never given again; with `over`, only
    /// while the run is stored and over. Flushed.
    fn hide(&self, run: RunId, over: bool) -> Result<(), StoreError> {
        let k = key(&[run.0]);
        (&self.runs, &self.run_counts, &self.deleted, &*self.db)
            .transaction(|(runs, counts, deleted, top)| {
                if over {
                    match runs.get(k.as_slice())? {
                        None => return tx_abort(StoreError::NotFound(format!("run {run}"))),
                        Some(v) => match decode::<Run>(|| format!("run {run}"), &v) {
                            Err(e) => return tx_abort(e),
                            Ok(r) if !r.is_over() => {
                                return tx_abort(StoreError::NotOver(format!(
                                    "run {run} is running again; delete it once it has finished or been cancelled"
                                )));
                            }
                            Ok(_) => {}
                        },
                    }
                }
                runs.remove(k.as_slice())?;
                counts.remove(k.as_slice())?;
                deleted.insert(k.as_slice(), &[][..])?;
                // Its id is never given again, even if it was the newest.
                let last =
                    top.get("run_counter")?.and_then(|v| v.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
                top.insert("run_counter", &last.max(run.0).to_be_bytes())?;
                Ok(())
            })
            .map_err(tx_error)?;
        self.flush()
    }

    /// Removes every key that begins with `prefix`, a batch at a time;
    /// returns how many.
    fn remove_prefix(tree: &sled::Tree, prefix: &[u8]) -> Result<u64, StoreError> {
        let mut removed = 0;
        loop {
            let keys: Vec<sled::IVec> = tree.scan_prefix(prefix).keys().take(4096).collect::<Result<_, _>>()?;
            if keys.is_empty() {
                return Ok(removed);
            }
            let mut batch = sled::Batch::default();
            for k in &keys {
                batch.remove(k.clone());
            }
            removed += keys.len() as u64;
            tree.apply_batch(batch)?;
        }
    }

    /// Removes the stored files that no run names and that nobody has
    /// uploaded or asked for within `FILE_GRACE`; returns their hashes.
    fn sweep_files(&self) -> Result<Vec<String>, StoreError> {
        #[derive(serde::Deserialize)]
        struct Named {
            #[serde(default)]
            files: BTreeMap<String, String>,
        }
        let mut named = std::collections::HashSet::new();
        for v in self.runs.iter().values() {
            let run: Named = decode(|| "run".to_owned(), &v?)?;
            named.extend(run.files.into_values().map(|sha| sha.to_ascii_lowercase()));
        }
        let now = std::time::SystemTime::now();
        let mut removed = Vec::new();
        for entry in std::fs::read_dir(&self.files)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_sha256(&name) || named.contains(&name) {
                continue;
            }
            let used = entry.metadata()?.modified()?;
            if now.duration_since(used).unwrap_or_default() < FILE_GRACE {
                continue;
            }
            std::fs::remove_file(entry.path())?;
            removed.push(name);
        }
        if !removed.is_empty() {
            std::fs::File::open(&self.files)?.sync_all()?;
        }
        Ok(removed)
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

fn tx_error(e: sled::transaction::TransactionError<StoreError>) -> StoreError {
    match e {
        sled::transaction::TransactionError::Storage(e) => StoreError::Sled(e),
        sled::transaction::TransactionError::Abort(e) => e,
    }
}

/// Ends a transaction with `e`.
fn tx_abort<T>(e: StoreError) -> sled::transaction::ConflictableTransactionResult<T, StoreError> {
    Err(sled::transaction::ConflictableTransactionError::Abort(e))
}

/// The number a key begins with (a run's id).
fn first_u64(k: &[u8]) -> u64 {
    k.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes)
}

/// The state of a stored job, read without decoding the rest of it.
fn job_state(bytes: &[u8]) -> Option<JobState> {
    #[derive(serde::Deserialize)]
    struct StateOf {
        state: JobState,
    }
    serde_json::from_slice::<StateOf>(bytes).ok().map(|s| s.state)
}

/// How one `apply` changes a run's counts.
#[derive(Default)]
struct CountsChange {
    jobs: [i64; 7],
    groups: u64,
    stage: u32,
}

impl CountsChange {
    fn applied_to(&self, mut c: RunCounts) -> RunCounts {
        for (n, d) in c.jobs.iter_mut().zip(self.jobs) {
            *n = n.saturating_add_signed(d);
        }
        c.groups += self.groups;
        c.stage = c.stage.max(self.stage);
        c
    }
}

/// Whose a write in `apply` is, and what it changes in its run's counts.
enum Counted {
    Nothing,
    Run(u64),
    Group(u64, u32),
    Job(u64, JobState),
    Telemetry(u64),
}

impl Counted {
    fn run(&self) -> Option<u64> {
        match *self {
            Counted::Nothing => None,
            Counted::Run(r) | Counted::Group(r, _) | Counted::Job(r, _) | Counted::Telemetry(r) => Some(r),
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
        let mut encoded: Vec<(u8, Vec<u8>, Vec<u8>, Counted)> = Vec::new();
        for w in writes {
            match w {
                Write::Run(r) => encoded.push((0, key(&[r.id.0]), encode(r), Counted::Run(r.id.0))),
                Write::Group(g) => {
                    encoded.push((1, key(&[g.run.0, g.id]), encode(g), Counted::Group(g.run.0, g.stage)));
                }
                Write::Job(j) => encoded.push((2, key(&[j.run.0, j.id]), encode(j), Counted::Job(j.run.0, j.state))),
                Write::Agent(a) => encoded.push((3, key(&[a.id.0]), encode(a), Counted::Nothing)),
                Write::Counters(c) => {
                    encoded.push((4, b"counters".to_vec(), key(&[c.next_agent, c.next_epoch]), Counted::Nothing))
                }
                Write::Telemetry(attempt, series) => {
                    for k in self.telemetry.scan_prefix(attempt_key(attempt)).keys() {
                        stale.push(k?.to_vec());
                    }
                    for (i, part) in encode(series).chunks(PART_BYTES).enumerate() {
                        let mut k = attempt_key(attempt);
                        k.extend_from_slice(&(i as u32).to_be_bytes());
                        encoded.push((5, k, part.to_vec(), Counted::Telemetry(attempt.run.0)));
                    }
                }
            }
        }
        let trees = (
            &self.runs,
            &self.groups,
            &self.jobs,
            &self.agents,
            &self.meta,
            &self.telemetry,
            &self.run_counts,
            &self.deleted,
        );
        trees
            .transaction(|(runs, groups, jobs, agents, meta, telemetry, run_counts, deleted)| {
                // Nothing of a run being deleted is written again.
                let mut hidden: BTreeMap<u64, bool> = BTreeMap::new();
                for (_, _, _, counted) in &encoded {
                    if let Some(run) = counted.run()
                        && !hidden.contains_key(&run)
                    {
                        hidden.insert(run, deleted.get(key(&[run]))?.is_some());
                    }
                }
                let is_hidden = |c: &Counted| c.run().is_some_and(|r| hidden.get(&r) == Some(&true));
                for k in &stale {
                    telemetry.remove(k.as_slice())?;
                }
                // Each run's counts change by what replaces what: a job's
                // old state is read back (within this transaction, the
                // latest write of it).
                let mut changes: BTreeMap<u64, CountsChange> = BTreeMap::new();
                for (tree, k, v, counted) in &encoded {
                    if is_hidden(counted) {
                        continue;
                    }
                    match *counted {
                        Counted::Nothing | Counted::Telemetry(_) => {}
                        Counted::Run(run) => {
                            changes.entry(run).or_default();
                        }
                        Counted::Group(run, stage) => {
                            let c = changes.entry(run).or_default();
                            if groups.get(k.as_slice())?.is_none() {
                                c.groups += 1;
                            }
                            c.stage = c.stage.max(stage);
                        }
                        Counted::Job(run, state) => {
                            let c = changes.entry(run).or_default();
                            if let Some(old) = jobs.get(k.as_slice())?.as_deref().and_then(job_state) {
                                c.jobs[state_index(old)] -= 1;
                            }
                            c.jobs[state_index(state)] += 1;
                        }
                    }
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
                for (run, change) in &changes {
                    let k = key(&[*run]);
                    let old = match run_counts.get(k.as_slice())? {
                        None => RunCounts::default(),
                        Some(v) => match decode(|| format!("counts of run {run}"), &v) {
                            Ok(c) => c,
                            Err(e) => return tx_abort(e),
                        },
                    };
                    run_counts.insert(k.as_slice(), encode(&change.applied_to(old)))?;
                }
                Ok(())
            })
            .map_err(tx_error)?;
        self.flush()
    }

    fn listed_runs(&self) -> Result<Vec<(Run, RunCounts)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.runs.iter() {
            let (k, v) = kv?;
            let run: Run = decode(|| format!("run {k:?}"), &v)?;
            let counts = match self.run_counts.get(&k)? {
                Some(c) => decode(|| format!("counts of run {}", run.id), &c)?,
                // Every run has its counts; one without is counted here.
                None => RunCounts::of(&self.groups(run.id)?, &scan::<Job>(&self.jobs, &[run.id.0], "job")?),
            };
            out.push((run, counts));
        }
        Ok(out)
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
        // Transactional trees have no scans: the keys to remove are found
        // first. Only the ingest committer writes these trees for a run
        // that is running, so nothing comes between.
        let earlier = |tree: &sled::Tree, purge: &AttemptKey| -> Result<Vec<sled::IVec>, StoreError> {
            let mut keys = Vec::new();
            for k in tree.scan_prefix(key(&[purge.run.0, purge.job])).keys() {
                let k = k?;
                if attempt_of(&k).is_some_and(|a| a.attempt < purge.attempt) {
                    keys.push(k);
                }
            }
            Ok(keys)
        };
        let mut purged: [Vec<sled::IVec>; 5] = Default::default();
        for purge in &commit.purges {
            for (keys, tree) in
                purged.iter_mut().zip([&self.records, &self.summaries, &self.stats, &self.telemetry, &self.digests])
            {
                keys.extend(earlier(tree, purge)?);
            }
        }
        let [purged_records, purged_summaries, purged_stats, purged_telemetry, purged_digests] = &purged;
        // A digest built again replaces every part of the old one; of two
        // digests of one attempt in a commit, the later is kept.
        let mut new_digests: Vec<(&AttemptKey, &[u8], Vec<sled::IVec>)> = Vec::new();
        for (i, (attempt, bytes)) in commit.digests.iter().enumerate() {
            if commit.digests[i + 1..].iter().any(|(a, _)| a == attempt) {
                continue;
            }
            let old = self.digests.scan_prefix(attempt_key(attempt)).keys().collect::<Result<Vec<_>, _>>()?;
            new_digests.push((attempt, bytes, old));
        }
        (&self.records, &self.summaries, &self.stats, &self.telemetry, &self.digests)
            .transaction(|(records, summaries, stats, telemetry, digests)| {
                for k in purged_records {
                    records.remove(k)?;
                }
                for k in purged_summaries {
                    summaries.remove(k)?;
                }
                // The counts of a purged attempt stay, marked removed.
                for k in purged_stats {
                    let Some(v) = stats.get(k)? else { continue };
                    let mut s: AttemptStats = match decode(|| "attempt stats".to_owned(), &v) {
                        Ok(s) => s,
                        Err(e) => return tx_abort(e),
                    };
                    s.removed = true;
                    stats.insert(k, encode(&s))?;
                }
                for k in purged_telemetry {
                    telemetry.remove(k)?;
                }
                for k in purged_digests {
                    digests.remove(k)?;
                }
                for (attempt, batch, bytes) in &commit.batches {
                    for (k, part) in batch_parts(attempt, *batch, bytes) {
                        records.insert(k, part)?;
                    }
                }
                for (attempt, summary) in &commit.summaries {
                    summaries.insert(attempt_key(attempt), encode(summary))?;
                }
                for (attempt, s) in &commit.stats {
                    stats.insert(attempt_key(attempt), encode(s))?;
                }
                // After the purges: a digest is kept only while its
                // attempt's summary is stored.
                for (attempt, bytes, old) in &new_digests {
                    if summaries.get(attempt_key(attempt))?.is_none() {
                        continue;
                    }
                    for k in old {
                        digests.remove(k)?;
                    }
                    for (i, part) in bytes.chunks(PART_BYTES).enumerate() {
                        let mut k = attempt_key(attempt);
                        k.extend_from_slice(&(i as u32).to_be_bytes());
                        digests.insert(k, part)?;
                    }
                }
                Ok(())
            })
            .map_err(tx_error)?;
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
        if !is_sha256(sha256) {
            return Ok(false);
        }
        let path = self.files.join(sha256.to_ascii_lowercase());
        if !path.is_file() {
            return Ok(false);
        }
        // Asked for: a submission may be about to name it (`FILE_GRACE`).
        if let Ok(f) = std::fs::File::open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Ok(true)
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

    fn hide_run(&self, run: RunId) -> Result<(), StoreError> {
        let Some(r) = self.run(run)? else { return Err(StoreError::NotFound(format!("run {run}"))) };
        let groups = self.groups(run)?;
        let jobs: Vec<Job> = scan(&self.jobs, &[run.0], "job")?;
        if let Some(why) = unsettled(&r, &groups, &jobs, "delete") {
            return Err(StoreError::NotOver(why));
        }
        // Still there, still over: the run itself is read again in the
        // transaction that hides it.
        self.hide(run, true)
    }

    fn purge_run(&self, run: RunId) -> Result<Deleted, StoreError> {
        let k = key(&[run.0]);
        if !self.deleted.contains_key(&k)? {
            return Ok(Deleted::default());
        }
        let mut deleted = Deleted::default();
        for v in self.stats.scan_prefix(&k).values() {
            let s: AttemptStats = decode(|| format!("stats of run {run}"), &v?)?;
            if !s.removed {
                deleted.records += s.records;
            }
        }
        // Summaries before digests: a digest is stored only beside its
        // summary, so none comes back once they are gone. The run's own
        // entry and counts went when it was hidden; they are swept again
        // for a store that lost them some other way.
        for tree in [&self.summaries, &self.stats, &self.records, &self.telemetry, &self.digests, &self.groups] {
            Self::remove_prefix(tree, &k)?;
        }
        deleted.jobs = Self::remove_prefix(&self.jobs, &k)?;
        Self::remove_prefix(&self.run_counts, &k)?;
        Self::remove_prefix(&self.runs, &k)?;
        deleted.files = self.sweep_files()?;
        self.deleted.remove(&k)?;
        self.flush()?;
        Ok(deleted)
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
