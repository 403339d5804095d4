//! Export and import against real sled stores: a run with several groups,
//! repeats, a job that failed, an attempt whose records were removed and
//! thousands of records goes out and comes back with the same report and
//! the same export; every kind of bad file is refused by its line, leaving
//! no trace in the store it was read into.

use std::sync::atomic::{AtomicU64, Ordering};

use benchfleet_core::{Chunk, Digest, Outcome, summarize};

use super::*;
use crate::plan::{self, Submission};
use crate::records::Write as StoreWrite;
use crate::report;
use crate::store::{FileWriter, Records, SledStore};
use benchfleet_study::model::{AgentId, AttemptInfo, AttemptOutcome, JobState, Placement, RunState};

const MATRIX: &str = "\
name: export
model: m
repeats: 2
engines: { vllm: {} }
variants:
  mtp: { args: [--mtp] }
profiles:
  long: { dataset: { random: { input_tokens: 64, output_tokens: 16 } }, requests: 300 }
  short: { dataset: { random: { input_tokens: 8, output_tokens: 4 } }, requests: 200 }
";

/// A sled store that counts the record batches written through it, to show
/// that a refused import had staged records (and removed them).
struct Spy {
    inner: SledStore,
    batches: AtomicU64,
    /// Storing a run fails, as a full disk would make it.
    fail_create_run: std::sync::atomic::AtomicBool,
}

impl Spy {
    fn open(dir: &std::path::Path) -> Spy {
        Spy {
            inner: SledStore::open(dir).expect("store"),
            batches: AtomicU64::new(0),
            fail_create_run: Default::default(),
        }
    }
}

impl Store for Spy {
    fn next_run_id(&self) -> Result<RunId, StoreError> {
        self.inner.next_run_id()
    }
    fn claim_run_id(&self, id: RunId) -> Result<bool, StoreError> {
        self.inner.claim_run_id(id)
    }
    fn create_run(&self, run: &Run, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        if self.fail_create_run.load(Ordering::Relaxed) {
            return Err(StoreError::Io(std::io::Error::other("no space left on device")));
        }
        self.inner.create_run(run, groups, jobs)
    }
    fn add_groups(&self, run: RunId, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        self.inner.add_groups(run, groups, jobs)
    }
    fn apply(&self, writes: &[StoreWrite]) -> Result<(), StoreError> {
        self.inner.apply(writes)
    }
    fn run(&self, id: RunId) -> Result<Option<Run>, StoreError> {
        self.inner.run(id)
    }
    fn runs(&self) -> Result<Vec<Run>, StoreError> {
        self.inner.runs()
    }
    fn groups(&self, run: RunId) -> Result<Vec<Group>, StoreError> {
        self.inner.groups(run)
    }
    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError> {
        self.inner.jobs(run)
    }
    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError> {
        self.inner.job(run, job)
    }
    fn agents(&self) -> Result<Vec<crate::records::AgentRecord>, StoreError> {
        self.inner.agents()
    }
    fn counters(&self) -> Result<crate::records::Counters, StoreError> {
        self.inner.counters()
    }
    fn commit_records(&self, commit: &RecordCommit) -> Result<(), StoreError> {
        self.batches.fetch_add(commit.batches.len() as u64, Ordering::Relaxed);
        self.inner.commit_records(commit)
    }
    fn stored_batch(&self, attempt: &AttemptKey, batch: u64) -> Result<Option<u64>, StoreError> {
        self.inner.stored_batch(attempt, batch)
    }
    fn records(&self, attempt: &AttemptKey) -> Records<'_> {
        self.inner.records(attempt)
    }
    fn summary(&self, attempt: &AttemptKey) -> Result<Option<Summary>, StoreError> {
        self.inner.summary(attempt)
    }
    fn digest(&self, attempt: &AttemptKey) -> Result<Option<Digest>, StoreError> {
        self.inner.digest(attempt)
    }
    fn telemetry(&self, attempt: &AttemptKey) -> Result<Option<Vec<benchfleet_core::telemetry::Series>>, StoreError> {
        self.inner.telemetry(attempt)
    }
    fn has_digest(&self, attempt: &AttemptKey) -> Result<bool, StoreError> {
        self.inner.has_digest(attempt)
    }
    fn summarized(&self, run: RunId) -> Result<Vec<AttemptKey>, StoreError> {
        self.inner.summarized(run)
    }
    fn attempt_stats(&self, run: RunId) -> Result<BTreeMap<AttemptKey, AttemptStats>, StoreError> {
        self.inner.attempt_stats(run)
    }
    fn stats(&self, attempt: &AttemptKey) -> Result<Option<AttemptStats>, StoreError> {
        self.inner.stats(attempt)
    }
    fn has_file(&self, sha256: &str) -> Result<bool, StoreError> {
        self.inner.has_file(sha256)
    }
    fn new_file(&self) -> Result<FileWriter, StoreError> {
        self.inner.new_file()
    }
    fn open_file(&self, sha256: &str) -> Result<Option<(std::fs::File, u64)>, StoreError> {
        self.inner.open_file(sha256)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }
}

/// `n` records of a job: latencies spread by a fixed rule, every
/// `fail_every`th one an HTTP error.
fn records(job: u64, n: u64, output_tokens: u32, fail_every: u64) -> Vec<RequestRecord> {
    (0..n)
        .map(|seq| {
            let scheduled_ns = seq as i64 * 10_000_000;
            let sent_ns = scheduled_ns + 20_000 + (seq * 7 % 13) as i64 * 1_000;
            let failed = fail_every > 0 && seq % fail_every == fail_every - 1;
            if failed {
                return RequestRecord {
                    seq,
                    scheduled_ns,
                    sent_ns,
                    slot_ns: None,
                    connect_ns: None,
                    first_token_ns: None,
                    completed_ns: sent_ns + 3_000_000,
                    chunks: Default::default(),
                    prompt_tokens: 64,
                    output_tokens: 0,
                    outcome: Outcome::HttpError,
                    http_status: Some(503),
                    error: Some(format!("busy (job {job})")),
                    phase: Default::default(),
                    turn: None,
                };
            }
            let ttft = 5_000_000 + ((seq * 7919 + job * 31) % 97) as i64 * 250_000;
            let itl = 1_000_000 + ((seq * 104_729) % 89) as i64 * 20_000;
            let first = sent_ns + ttft;
            let chunks: benchfleet_core::Chunks =
                (0..output_tokens).map(|k| Chunk { at_ns: first + i64::from(k) * itl, tokens: 1 }).collect();
            RequestRecord {
                seq,
                scheduled_ns,
                sent_ns,
                slot_ns: None,
                connect_ns: (seq % 50 == 0).then_some(40_000),
                first_token_ns: Some(first),
                completed_ns: first + i64::from(output_tokens - 1) * itl + 1_000,
                chunks,
                prompt_tokens: 64,
                output_tokens,
                outcome: Outcome::Ok,
                http_status: Some(200),
                error: None,
                phase: Default::default(),
                turn: None,
            }
        })
        .collect()
}

fn attempt_info(number: u32, outcome: AttemptOutcome, reason: Option<&str>) -> AttemptInfo {
    AttemptInfo {
        price: None,
        number,
        epoch: u64::from(number),
        agent: AgentId(u64::from(number)),
        agent_name: format!("gpu-{number}"),
        started_unix_ms: 1_000 * i64::from(number),
        ended_unix_ms: Some(1_000 * i64::from(number) + 500),
        outcome,
        reason: reason.map(str::to_owned),
        charged: outcome == AttemptOutcome::Failed,
        log_tail: reason.map(|r| format!("engine log\n{r}")),
    }
}

/// Stores an attempt's records in batches of 100, with its stats and (when
/// it succeeded) its summary.
fn store_attempt(store: &dyn Store, key: AttemptKey, records: &[RequestRecord], summarized: bool) {
    let batches =
        records.chunks(100).enumerate().map(|(i, c)| (key, i as u64, codec::encode_batch(c))).collect::<Vec<_>>();
    let stats = AttemptStats { records: records.len() as u64, sent: records.len() as u64, removed: false };
    let summaries = if summarized { vec![(key, summarize(records, None))] } else { Vec::new() };
    store
        .commit_records(&RecordCommit { batches, stats: vec![(key, stats)], summaries, ..Default::default() })
        .expect("records");
}

/// Stores run `id` of `MATRIX`, finished: 2 configurations x 2 profiles x 2
/// repeats. Job 1 was lost on its first agent (those records removed) and
/// succeeded on the next; job 5 failed twice, keeping its last attempt's
/// records; job 6's requests partly failed.
fn store_run(store: &dyn Store, id: RunId) {
    let sub = Submission { matrix_name: "export.yaml".into(), matrix_yaml: MATRIX.into(), ..Default::default() };
    let prepared = plan::prepare_dry(&sub, || Ok(id)).expect("the matrix is valid");
    let mut run = prepared.run;
    run.state = RunState::Finished;
    run.ended_unix_ms = Some(99_000);
    let mut jobs = prepared.jobs;
    assert_eq!((prepared.groups.len(), jobs.len()), (2, 8), "the fixture's shape");
    for job in &mut jobs {
        let n = job.profile.requests;
        let tokens = job.profile.dataset.output_tokens().expect("random");
        let key = |attempt| AttemptKey { run: id, job: job.id, attempt };
        match job.id {
            1 => {
                store_attempt(store, key(1), &records(job.id, 40, tokens, 0), false);
                // The second attempt's start removes the first's records.
                store.commit_records(&RecordCommit { purges: vec![key(2)], ..Default::default() }).expect("purge");
                store_attempt(store, key(2), &records(job.id, n, tokens, 0), true);
                store.apply(&[StoreWrite::Telemetry(key(2), telemetry_of(job.id))]).expect("telemetry");
                job.attempts = vec![
                    attempt_info(1, AttemptOutcome::Abandoned, Some("lease lost")),
                    attempt_info(2, AttemptOutcome::Succeeded, None),
                ];
                job.attempt = 2;
                job.state = JobState::Succeeded;
            }
            5 => {
                store.commit_records(&RecordCommit { purges: vec![key(2)], ..Default::default() }).expect("purge");
                store_attempt(store, key(2), &records(job.id, 25, tokens, 0), false);
                job.attempts = vec![
                    attempt_info(1, AttemptOutcome::Failed, Some("engine exited")),
                    attempt_info(2, AttemptOutcome::Failed, Some("engine exited")),
                ];
                job.attempt = 2;
                job.state = JobState::Failed;
                job.error = Some("failed on 2 hosts: engine exited".into());
            }
            _ => {
                store_attempt(store, key(1), &records(job.id, n, tokens, if job.id == 6 { 9 } else { 0 }), true);
                if job.id == 0 {
                    store.apply(&[StoreWrite::Telemetry(key(1), telemetry_of(job.id))]).expect("telemetry");
                }
                job.attempts = vec![attempt_info(1, AttemptOutcome::Succeeded, None)];
                job.attempt = 1;
                job.state = JobState::Succeeded;
            }
        }
        job.agent = Some(AgentId(1));
        job.epoch = u64::from(job.attempt);
        job.engine_startup_s = Some(12.5);
        job.gpu_fingerprint = vec!["NVIDIA H200 GPU-1 550.1 12.4 1980MHz".into()];
        job.prefix_cache = Some("cold: reset".into());
    }
    store.create_run(&run, &prepared.groups, &jobs).expect("create");
}

/// A job's telemetry series: an engine gauge and a GPU's power.
fn telemetry_of(job: u64) -> Vec<benchfleet_core::telemetry::Series> {
    let points = |scale: f64| (0..50u32).map(|i| (i * 500, f64::from(i) * scale + job as f64)).collect();
    vec![
        benchfleet_core::telemetry::Series {
            name: "vllm:num_requests_running".into(),
            gpu: String::new(),
            points: points(1.0),
        },
        benchfleet_core::telemetry::Series { name: "gpu_power_w".into(), gpu: "GPU-1".into(), points: points(7.5) },
    ]
}

fn exported(store: &dyn Store, id: RunId) -> Vec<u8> {
    let mut out = Vec::new();
    export(store, id, &mut out).expect("export");
    out
}

/// A store holding run 1 of the fixture, and its export.
fn original() -> (tempfile::TempDir, SledStore, Vec<u8>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    store_run(&store, RunId(1));
    let file = exported(&store, RunId(1));
    (dir, store, file)
}

fn text(store: &dyn Store, id: RunId) -> String {
    report::render(store, id).expect("report").text
}

#[test]
fn an_imported_run_reports_and_exports_as_the_original() {
    let (_d, store, file) = original();
    let counts = trailer(file.trim_ascii_end().rsplit(|b| *b == b'\n').next().expect("a last line"));
    // 8 jobs: 6 of 1 attempt, 2 of 2; summaries of the 7 that succeeded;
    // stats of 9 attempts (job 5's first sent nothing); records of every
    // attempt but job 1's first: its profile's requests, or job 5's 25.
    let jobs = store.jobs(RunId(1)).expect("jobs");
    let records = jobs.iter().map(|j| if j.id == 5 { 25 } else { j.profile.requests }).sum();
    assert_eq!(counts, Some(Counts { groups: 2, jobs: 8, summaries: 7, stats: 9, telemetry: 2, records }));

    let dir = tempfile::tempdir().expect("tempdir");
    let target = SledStore::open(dir.path()).expect("store");
    let imported = import(&target, file.as_slice()).expect("import");
    assert_eq!(
        imported,
        Imported { run: RunId(1), original: RunId(1), counts: counts.expect("counted"), missing_files: Vec::new() }
    );
    let report = text(&target, RunId(1));
    assert_eq!(report, text(&store, RunId(1)));
    // The fixture's report has what the test claims to compare.
    for part in ["(2 repeats pooled)", "failed on 2 hosts: engine exited", "vllm+mtp", "Profile: short"] {
        assert!(report.contains(part), "{part:?} in:\n{report}");
    }
    assert_eq!(exported(&target, RunId(1)), file, "the import's export is the original's, byte for byte");
    let series =
        |store: &SledStore, job, attempt| store.telemetry(&AttemptKey { run: RunId(1), job, attempt }).expect("read");
    assert_eq!(series(&target, 0, 1), Some(telemetry_of(0)));
    assert_eq!(series(&target, 1, 2), Some(telemetry_of(1)));
    // The import built every summarized attempt's digest, and the next run
    // id is past the imported one.
    for key in target.summarized(RunId(1)).expect("summarized") {
        assert!(target.has_digest(&key).expect("digest"), "{key}");
    }
    assert_eq!(target.next_run_id().expect("id"), RunId(2));
}

/// The export with the run's ids (header, run, groups, jobs) set to `to`.
fn renumbered(file: &[u8], to: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for line in file.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let mut v: serde_json::Value = serde_json::from_slice(line).expect("json");
        match v["kind"].as_str() {
            Some(KIND) => v["run"] = to.into(),
            Some("run") => v["run"]["id"] = to.into(),
            Some("group") => v["group"]["run"] = to.into(),
            Some("job") => v["job"]["run"] = to.into(),
            _ => {}
        }
        out.extend(serde_json::to_vec(&v).expect("json"));
        out.push(b'\n');
    }
    out
}

#[test]
fn a_run_whose_id_is_taken_gets_the_next_one() {
    let (_d, store, file) = original();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = SledStore::open(dir.path()).expect("store");
    // The target's own run 1, and an id it gave out but never stored.
    store_run(&target, target.next_run_id().expect("id"));
    assert_eq!(target.next_run_id().expect("id"), RunId(2));
    let before = text(&target, RunId(1));

    let imported = import(&target, file.as_slice()).expect("import");
    assert_eq!((imported.run, imported.original), (RunId(3), RunId(1)));
    assert_eq!(text(&target, RunId(1)), before, "the run already there is untouched");
    let (got, want) = (text(&target, RunId(3)), text(&store, RunId(1)));
    assert_eq!(got.split_once('\n').map(|(first, _)| first), Some("Run 3: export (export.yaml)"));
    assert_eq!(got.split_once('\n').map(|(_, rest)| rest), want.split_once('\n').map(|(_, rest)| rest));
    assert_eq!(renumbered(&exported(&target, RunId(3)), 1), renumbered(&file, 1));
    assert_eq!(target.next_run_id().expect("id"), RunId(4));
    let ids: Vec<RunId> = target.runs().expect("runs").iter().map(|r| r.id).collect();
    assert_eq!(ids, [RunId(1), RunId(3)]);
}

fn lines(file: &[u8]) -> Vec<String> {
    String::from_utf8(file.to_vec()).expect("utf-8").lines().map(str::to_owned).collect()
}

fn joined(lines: &[String]) -> Vec<u8> {
    lines.iter().flat_map(|l| l.bytes().chain([b'\n'])).collect()
}

/// The index of the `n`th line (from 0) of `kind`.
fn nth(lines: &[String], kind: &str, n: usize) -> usize {
    let tag = format!("{{\"kind\":\"{kind}\"");
    lines.iter().enumerate().filter(|(_, l)| l.starts_with(&tag)).nth(n).map(|(i, _)| i).expect("such a line")
}

/// Every way a file goes wrong: the file, the line named (0 for errors of
/// the whole file), words of the error, and whether records were staged
/// before it was found (and must be gone).
fn bad_files(file: &[u8]) -> Vec<(&'static str, Vec<u8>, u64, &'static str, bool)> {
    let all = lines(file);
    let n = all.len();
    let with = |i: usize, line: String| {
        let mut l = all.clone();
        l[i] = line;
        joined(&l)
    };
    let edit = |i: usize, from: &str, to: &str| {
        assert!(all[i].contains(from), "{from:?} in line {}: {}", i + 1, all[i]);
        with(i, all[i].replacen(from, to, 1))
    };
    // A line with one field set to another value (the JSON's keys then come
    // in another order, which the import takes as well).
    let set = |i: usize, field: &str, value: serde_json::Value| {
        let mut v: serde_json::Value = serde_json::from_str(&all[i]).expect("json");
        v[field] = value;
        with(i, v.to_string())
    };
    let middle = nth(&all, "record", 1500);
    let first_record = nth(&all, "record", 0);
    let last = n - 1;
    let mut moved = all.clone();
    let group = moved.remove(nth(&all, "group", 1));
    // After the first job line, which moved up by one.
    let after_job = nth(&all, "job", 0);
    moved.insert(after_job, group);
    let mut doubled = all.clone();
    doubled.insert(middle, all[middle].clone());
    let cut_at = joined(&all[..middle]).len() + all[middle].len() / 2;
    let at = |i: usize| i as u64 + 1;
    vec![
        ("truncated", joined(&all[..last]), 0, "without the export's trailer: it was cut short", true),
        ("cut mid-line", file[..cut_at].to_vec(), at(middle), "ends in the middle of this line", true),
        ("corrupt", with(middle, "{\"kind\":\"record\",\"job\":3,".into()), at(middle), "not a line of an", true),
        (
            "wrong shape",
            set(middle, "record", serde_json::json!({ "seq": "x" })),
            at(middle),
            "not a valid record",
            true,
        ),
        ("not json", with(middle, "\u{1b}garbage".into()), at(middle), "not a line of an export", true),
        ("empty line", with(middle, String::new()), at(middle), "an empty line", true),
        ("newer format", edit(0, "\"format\":1", "\"format\":2"), 1, "format 2 is newer than this", false),
        ("unknown format", edit(0, "\"format\":1", "\"format\":0"), 1, "format 0 is not one this", false),
        ("no format", edit(0, "\"format\":1,", ""), 1, "format none is not one", false),
        ("not an export", joined(&all[1..]), 1, "not a benchfleet export: it begins with a 'run' line", false),
        ("unknown attempt", set(middle, "attempt", 9.into()), at(middle), "of attempt 9 of job", true),
        ("unknown job", set(middle, "job", 99.into()), at(middle), "of job 99, which the file does not hold", true),
        ("removed attempt", edit(first_record, "\"job\":0,", "\"job\":1,"), at(first_record), "were removed", false),
        ("trailer count", edit(last, "\"records\":", "\"records\":1"), at(last), "the trailer counts", true),
        ("out of order", joined(&moved), at(after_job), "a group line after the job lines", false),
        ("running run", edit(1, "\"state\":\"finished\"", "\"state\":\"running\""), 2, "still running", false),
        ("more records", joined(&doubled), 0, "than the", true),
        ("after the trailer", joined(&[all.clone(), vec![all[1].clone()]].concat()), at(n), "after the trailer", true),
        ("kind", edit(2, "\"kind\":\"group\"", "\"kind\":\"grope\""), 3, "unknown kind 'grope'", false),
        ("too long", with(middle, " ".repeat(MAX_LINE_BYTES + 1)), at(middle), "longer than 1 MiB", true),
    ]
}

/// The store holds its run 1 (whose report is `before`) and nothing of
/// any other, under any id an import could have taken. Stats written under
/// a claimed id (the last write before the run itself) may stay, marked
/// removed, where `stats_removed`.
fn no_trace_but(target: &dyn Store, case: &str, before: &str, stats_removed: bool) {
    let ids: Vec<RunId> = target.runs().expect("runs").iter().map(|r| r.id).collect();
    assert_eq!(ids, [RunId(1)], "{case}");
    assert_eq!(text(target, RunId(1)), before, "{case}");
    let newest = target.next_run_id().expect("id").0;
    for run in 2..=newest {
        for job in 0..8 {
            for attempt in 1..=2 {
                let key = AttemptKey { run: RunId(run), job, attempt };
                assert_eq!(target.records(&key).count(), 0, "{case}: {key}");
                assert_eq!(target.summary(&key).expect("summary"), None, "{case}: {key}");
                assert!(!target.has_digest(&key).expect("digest"), "{case}: {key}");
                assert_eq!(target.telemetry(&key).expect("telemetry"), None, "{case}: {key}");
                let stats = target.stats(&key).expect("stats");
                assert!(stats.is_none() || stats_removed && stats.is_some_and(|s| s.removed), "{case}: {key}");
            }
        }
    }
}

fn no_trace(target: &dyn Store, case: &str, before: &str) {
    no_trace_but(target, case, before, false);
}

/// Reads `file` up to `after` bytes, then fails.
struct Broken<'a> {
    file: &'a [u8],
    after: usize,
}

impl std::io::Read for Broken<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.after == 0 {
            return Err(std::io::Error::other("connection reset"));
        }
        let n = buf.len().min(self.after).min(self.file.len());
        buf[..n].copy_from_slice(&self.file[..n]);
        self.file = &self.file[n..];
        self.after -= n;
        Ok(n)
    }
}

#[test]
fn a_read_or_a_store_that_fails_leaves_no_trace() {
    let (_d, _store, file) = original();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = Spy::open(dir.path());
    store_run(&target, RunId(1));
    let before = text(&target, RunId(1));

    let broken = std::io::BufReader::new(Broken { file: &file, after: file.len() * 2 / 3 });
    let e = import(&target, broken).expect_err("a read that fails");
    assert!(matches!(&e, ImportError::Read { line, .. } if *line > 100), "{e}");
    assert!(e.to_string().ends_with("failed: connection reset"), "{e}");
    assert!(target.batches.load(Ordering::Relaxed) > 0, "records were staged");
    no_trace(&target, "a read that fails", &before);

    // The run is stored last; when that fails, what was staged goes.
    target.fail_create_run.store(true, Ordering::Relaxed);
    let e = import(&target, file.as_slice()).expect_err("a store that fails");
    assert_eq!(e.to_string(), "file i/o in the store failed: no space left on device");
    no_trace_but(&target, "a store that fails", &before, true);
}

#[test]
fn a_bad_file_is_refused_by_its_line_and_leaves_no_trace() {
    let (_d, _store, file) = original();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = Spy::open(dir.path());
    store_run(&target, RunId(1));
    let before = text(&target, RunId(1));
    let nothing_yet = import(&target, &b""[..]).expect_err("an empty file");
    assert!(matches!(nothing_yet, ImportError::Empty), "{nothing_yet}");
    for (case, bad, line, words, staged) in bad_files(&file) {
        let written = target.batches.load(Ordering::Relaxed);
        let e = import(&target, bad.as_slice()).expect_err(case);
        let said = e.to_string();
        match (&e, line) {
            (ImportError::Truncated { .. }, 0) => {}
            (ImportError::Line { line: got, .. }, 0) => assert!(*got > 0, "{case}: {said}"),
            (ImportError::Line { line: got, .. }, want) => assert_eq!(*got, want, "{case}: {said}"),
            _ => panic!("{case}: {said}"),
        }
        assert!(said.contains(words), "{case}: {words:?} in {said:?}");
        assert!(said.starts_with("line ") || line == 0, "{case}: {said}");
        let staged_now = target.batches.load(Ordering::Relaxed) > written;
        assert_eq!(staged_now, staged, "{case}: records staged before the error was found");
        no_trace(&target, case, &before);
    }
    // And the good file still goes in after all that.
    let imported = import(&target, file.as_slice()).expect("import");
    assert_eq!(text(&target, imported.run).split_once('\n').map(|(_, r)| r.to_owned()), {
        let (_d, store, _) = original();
        text(&store, RunId(1)).split_once('\n').map(|(_, r)| r.to_owned())
    });
}

#[test]
fn a_run_that_may_still_change_is_not_exported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    store_run(&store, RunId(1));
    let refused = |store: &SledStore| {
        let mut out = Vec::new();
        let e = export(store, RunId(1), &mut out).expect_err("refused");
        assert!(out.is_empty(), "nothing is written");
        e.to_string()
    };
    let mut run = store.run(RunId(1)).expect("run").expect("stored");
    run.state = RunState::Running;
    store.apply(&[StoreWrite::Run(run.clone())]).expect("write");
    assert_eq!(refused(&store), "run 1 is still running; export it once it has finished or been cancelled");

    run.state = RunState::Cancelled;
    let mut group = store.groups(RunId(1)).expect("groups").remove(1);
    group.placement = Some(Placement { agent: AgentId(4), gpus: vec!["GPU-1".into()], epoch: 3, since_unix_ms: 0 });
    store.apply(&[StoreWrite::Run(run), StoreWrite::Group(group.clone())]).expect("write");
    assert!(refused(&store).contains("its group 1 still holds GPUs on agent-4"), "{}", refused(&store));

    group.placement = None;
    let mut job = store.job(RunId(1), 3).expect("job").expect("stored");
    job.state = JobState::Running;
    store.apply(&[StoreWrite::Group(group), StoreWrite::Job(job)]).expect("write");
    assert!(refused(&store).contains("its job 3 is still running"), "{}", refused(&store));

    let e = export(&store, RunId(9), &mut Vec::new()).expect_err("unknown");
    assert_eq!(e.to_string(), "run 9 does not exist");
}

#[test]
fn an_import_names_the_files_the_store_lacks() {
    let (_d, store, _) = original();
    let mut run = store.run(RunId(1)).expect("run").expect("stored");
    let sha = "ab".repeat(32);
    run.files.insert("chat.json".into(), sha.clone());
    store.apply(&[StoreWrite::Run(run)]).expect("write");
    let file = exported(&store, RunId(1));
    let dir = tempfile::tempdir().expect("tempdir");
    let target = SledStore::open(dir.path()).expect("store");
    let imported = import(&target, file.as_slice()).expect("import");
    assert_eq!(imported.missing_files, [("chat.json".to_owned(), sha)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_run_is_nothing_to_a_live_or_restarted_scheduler() {
    let (_d, _store, file) = original();
    let dir = tempfile::tempdir().expect("tempdir");
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(SledStore::open(dir.path()).expect("store"));
    let config = crate::ControllerConfig::new("http://127.0.0.1:1");
    let controller = crate::Controller::start(store.clone(), config.clone()).expect("start");
    let into = store.clone();
    let imported = tokio::task::spawn_blocking(move || import(into.as_ref(), file.as_slice())).await.expect("task");
    let id = imported.expect("import").run;
    let held = |c: std::sync::Arc<crate::Controller>| async move {
        c.query(move |s, _| s.run_jobs(id).is_some()).await.expect("query")
    };
    assert!(!held(controller.clone()).await, "the live scheduler does not take it up");
    controller.stop().await;
    let restarted = crate::Controller::start(store.clone(), config).expect("restart");
    assert!(!held(restarted.clone()).await, "nor does one restored from the store");
    assert_eq!(store.run(id).expect("run").map(|r| r.state), Some(RunState::Finished));
    restarted.stop().await;
}
