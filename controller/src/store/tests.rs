//! The sled store against a real sled on disk: order, reopening, record
//! batches stored once, purges, files, and the migration from schema 1.

use super::*;
use benchfleet_core::{Chunk, Outcome};
use benchfleet_study::model::{Dataset, Profile, RunState};

fn job(run: RunId, id: u64) -> Job {
    let mut profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 4, seed: 1 }, 1);
    profile.rate = Some(1.0);
    Job::new(run, id, 0, profile, 1)
}

fn run(id: RunId) -> Run {
    Run {
        id,
        name: "n".to_owned(),
        matrix_file: "m.yaml".to_owned(),
        matrix_yaml: String::new(),
        created_unix_ms: 0,
        state: RunState::Running,
        ended_unix_ms: None,
        note: None,
        files: Default::default(),
        runtime_override: None,
        fleet: None,
    }
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
        chunks: [Chunk { at_ns: 2, tokens: 1 }, Chunk { at_ns: 3, tokens: 3 }].into_iter().collect(),
        prompt_tokens: 8,
        output_tokens: 4,
        outcome: Outcome::Ok,
        http_status: Some(200),
        error: None,
        phase: Default::default(),
        turn: None,
    }
}

fn batch(attempt: AttemptKey, n: u64, seqs: &[u64]) -> (AttemptKey, u64, Vec<u8>) {
    let records: Vec<RequestRecord> = seqs.iter().map(|s| record(*s)).collect();
    (attempt, n, codec::encode_batch(&records))
}

fn seqs(store: &SledStore, attempt: &AttemptKey) -> Vec<u64> {
    store.records(attempt).map(|r| r.expect("decodes").seq).collect()
}

#[test]
fn survives_reopen_and_keeps_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let attempt = AttemptKey { run: RunId(1), job: 2, attempt: 1 };
    {
        let store = SledStore::open(dir.path()).expect("open");
        let run = run(store.next_run_id().expect("id"));
        let jobs: Vec<Job> = (0..300).map(|i| job(run.id, i)).collect();
        store.create_run(&run, &[], &jobs).expect("create");
        let commit =
            RecordCommit { batches: vec![batch(attempt, 0, &[256, 1]), batch(attempt, 1, &[2])], ..Default::default() };
        store.commit_records(&commit).expect("records");
        // A resent batch overwrites instead of doubling.
        store
            .commit_records(&RecordCommit { batches: vec![batch(attempt, 0, &[256, 1])], ..Default::default() })
            .expect("records");
        store.apply(&[Write::Counters(Counters { next_agent: 4, next_epoch: 9 })]).expect("counters");
    }
    let store = SledStore::open(dir.path()).expect("reopen");
    let runs = store.runs().expect("runs");
    assert_eq!(runs.len(), 1);
    let ids: Vec<u64> = store.jobs(runs[0].id).expect("jobs").iter().map(|j| j.id).collect();
    assert_eq!(ids, (0..300).collect::<Vec<_>>());
    assert_eq!(seqs(&store, &attempt), [256, 1, 2], "in batch order");
    assert_eq!(store.stored_batch(&attempt, 0).expect("read"), Some(2));
    assert_eq!(store.stored_batch(&attempt, 7).expect("read"), None);
    assert_eq!(store.counters().expect("counters"), Counters { next_agent: 4, next_epoch: 9 });
    // Run ids count up by one, across reopening too.
    assert_eq!(runs[0].id, RunId(1));
    assert_eq!(store.next_run_id().expect("id"), RunId(2));
}

#[test]
fn a_purge_removes_earlier_attempts_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let a = |job, attempt| AttemptKey { run: RunId(1), job, attempt };
    let stats = AttemptStats { records: 1, sent: 1, removed: false };
    store
        .commit_records(&RecordCommit {
            batches: vec![batch(a(0, 1), 0, &[0]), batch(a(0, 2), 0, &[0]), batch(a(1, 1), 0, &[0])],
            summaries: vec![(a(0, 1), Summary::default())],
            stats: vec![(a(0, 1), stats), (a(0, 2), stats)],
            ..Default::default()
        })
        .expect("commit");
    store.commit_records(&RecordCommit { purges: vec![a(0, 3)], ..Default::default() }).expect("purge");
    assert!(seqs(&store, &a(0, 1)).is_empty());
    assert!(seqs(&store, &a(0, 2)).is_empty());
    assert_eq!(seqs(&store, &a(1, 1)), [0], "another job's records stay");
    assert_eq!(store.summary(&a(0, 1)).expect("read"), None);
    let kept = store.attempt_stats(RunId(1)).expect("stats");
    assert_eq!(kept[&a(0, 1)], AttemptStats { removed: true, ..stats }, "the counts stay, marked removed");
}

#[test]
fn a_digest_is_kept_while_its_summary_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let a = |job, attempt| AttemptKey { run: RunId(1), job, attempt };
    // Large enough to be stored in several parts.
    let histogram = |n: i64| benchfleet_core::Histogram {
        count: n as u64,
        sum_ns: n as f64,
        counts: (0..n).map(|v| (v * 1000, 1)).collect(),
    };
    let digest = |n| Digest { records: 3, ttft: histogram(n), ..Digest::default() };
    let (big, small) = (digest(20_000), digest(5));
    let encoded = |d: &Digest| codec::encode_digest(d);
    assert!(encoded(&big).len() > 3 * PART_BYTES);
    store
        .commit_records(&RecordCommit {
            summaries: vec![(a(0, 1), Summary::default())],
            digests: vec![(a(0, 1), encoded(&big)), (a(1, 1), encoded(&small))],
            ..Default::default()
        })
        .expect("commit");
    assert_eq!(store.digest(&a(0, 1)).expect("read"), Some(big));
    assert_eq!(store.digest(&a(1, 1)).expect("read"), None, "no summary, no digest");
    // Built again: the new one replaces every part of the old.
    store
        .commit_records(&RecordCommit { digests: vec![(a(0, 1), encoded(&small))], ..Default::default() })
        .expect("commit");
    assert_eq!(store.digest(&a(0, 1)).expect("read"), Some(small.clone()));
    // Another encoding's digest reads as none: it is built again.
    let mut other = encoded(&small);
    other[0] = codec::DIGEST_VERSION + 1;
    store.commit_records(&RecordCommit { digests: vec![(a(0, 1), other)], ..Default::default() }).expect("commit");
    assert_eq!(store.digest(&a(0, 1)).expect("read"), None);
    // A purge takes it with the summary; one built meanwhile is not kept.
    store
        .commit_records(&RecordCommit { digests: vec![(a(0, 1), encoded(&small))], ..Default::default() })
        .expect("commit");
    store
        .commit_records(&RecordCommit {
            purges: vec![a(0, 2)],
            digests: vec![(a(0, 1), encoded(&small))],
            ..Default::default()
        })
        .expect("purge");
    assert_eq!(store.digest(&a(0, 1)).expect("read"), None);
    assert_eq!(store.digests.len(), 0);
}

#[test]
fn files_are_stored_under_their_hash_once_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let content = b"[{\"id\": 1}]";
    let sha = hex(&sha2::Sha256::digest(content));
    let mut w = store.new_file().expect("new");
    w.write(&content[..4]).expect("write");
    w.write(&content[4..]).expect("write");
    let wrong = w.finish(&"0".repeat(64), content.len() as u64).expect_err("a wrong hash is refused");
    assert!(wrong.to_string().contains(&sha), "{wrong}");
    assert!(!store.has_file(&sha).expect("has"), "nothing stored from a refused upload");
    let mut w = store.new_file().expect("new");
    w.write(content).expect("write");
    w.finish(&sha, content.len() as u64).expect("stored");
    assert!(store.has_file(&sha).expect("has"));
    let (mut f, size) = store.open_file(&sha).expect("open").expect("present");
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut back).expect("read");
    assert_eq!((back.as_slice(), size), (&content[..], content.len() as u64));
    assert!(store.open_file("../../etc/passwd").expect("no error").is_none(), "only hashes name files");
    let leftovers = std::fs::read_dir(dir.path().join("files")).expect("dir").count();
    assert_eq!(leftovers, 1, "no temporary files left");
}

#[test]
fn a_second_open_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = SledStore::open(dir.path()).expect("open");
    let err = SledStore::open(dir.path()).err().expect("second open must fail");
    assert!(err.to_string().contains("in use by another process"), "{err}");
}

#[test]
fn a_schema_1_store_is_migrated_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let content = b"[]".to_vec();
    let sha = hex(&sha2::Sha256::digest(&content));
    {
        let db = sled::open(dir.path()).expect("sled");
        db.insert("schema_version", &1u32.to_be_bytes()).expect("version");
        let runs = db.open_tree("runs").expect("tree");
        let mut r = serde_json::to_value(run(RunId(1))).expect("json");
        let obj = r.as_object_mut().expect("object");
        obj.remove("state");
        obj.insert("finished".into(), true.into());
        runs.insert(key(&[1]), serde_json::to_vec(&r).expect("json")).expect("run");
        let jobs = db.open_tree("jobs").expect("tree");
        let mut j = serde_json::to_value(job(RunId(1), 0)).expect("json");
        let obj = j.as_object_mut().expect("object");
        obj.insert("attempt".into(), 2.into());
        obj.insert("agent".into(), "agent-3".into());
        obj.insert("state".into(), "succeeded".into());
        obj.insert(
            "summary".into(),
            serde_json::to_value(Summary { successful: 7, ..Summary::default() }).expect("json"),
        );
        jobs.insert(key(&[1, 0]), serde_json::to_vec(&j).expect("json")).expect("job");
        let records = db.open_tree("records").expect("tree");
        for seq in [0u64, 1, 300] {
            records.insert(key(&[1, 0, 2, seq]), serde_json::to_vec(&record(seq)).expect("json")).expect("record");
        }
        db.open_tree("files").expect("tree").insert(sha.as_bytes(), content.clone()).expect("file");
        db.flush().expect("flush");
    }
    let store = SledStore::open(dir.path()).expect("migrated");
    assert_eq!(store.run(RunId(1)).expect("read").expect("run").state, RunState::Finished);
    let job = store.job(RunId(1), 0).expect("read").expect("job");
    assert_eq!(job.agent, Some(benchfleet_study::model::AgentId(3)));
    assert_eq!(job.summary.map(|s| s.successful), Some(7));
    let attempt = AttemptKey { run: RunId(1), job: 0, attempt: 2 };
    assert_eq!(seqs(&store, &attempt), [0, 1, 300]);
    assert_eq!(store.records(&attempt).next().expect("one").expect("decodes"), record(0));
    assert_eq!(store.stats(&attempt).expect("read").map(|s| s.records), Some(3));
    assert!(store.has_file(&sha).expect("has"));
    drop(store);
    // Opening again finds nothing left to migrate.
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(seqs(&store, &attempt), [0, 1, 300]);
}

#[test]
fn a_schema_2_store_s_agents_hold_no_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = crate::records::AgentRecord {
        id: benchfleet_study::model::AgentId(4),
        name: "gpu-4".into(),
        hostname: "gpu-4.lab".into(),
        version: "0.1.0".into(),
        gpus: Vec::new(),
        runtimes: vec!["docker".into()],
        drain: None,
        registered_unix_ms: 1,
        connected_unix_ms: 2,
        epoch: 7,
        certificate: None,
    };
    {
        let db = sled::open(dir.path()).expect("sled");
        db.insert("schema_version", &2u32.to_be_bytes()).expect("version");
        let mut a = serde_json::to_value(&agent).expect("json");
        a.as_object_mut().expect("object").remove("certificate");
        db.open_tree("agents")
            .expect("tree")
            .insert(4u64.to_be_bytes(), serde_json::to_vec(&a).expect("json"))
            .expect("agent");
        db.flush().expect("flush");
    }
    let store = SledStore::open(dir.path()).expect("migrated");
    assert_eq!(store.agents().expect("agents"), std::slice::from_ref(&agent));
    let raw = store.agents.get(4u64.to_be_bytes()).expect("read").expect("stored");
    assert!(String::from_utf8_lossy(&raw).contains("\"certificate\":null"));
    drop(store);
    assert_eq!(SledStore::open(dir.path()).expect("reopen").agents().expect("agents"), [agent]);
}

#[test]
fn a_large_batch_is_stored_in_parts_and_read_back_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let attempt = AttemptKey { run: RunId(1), job: 0, attempt: 1 };
    let records: Vec<RequestRecord> = (0..600)
        .map(|seq| {
            let mut r = record(seq);
            r.chunks = (0..64).map(|i| Chunk { at_ns: 2 + i * 12_345_678, tokens: 1 }).collect();
            r
        })
        .collect();
    let bytes = codec::encode_batch(&records);
    assert!(bytes.len() > 8 * PART_BYTES, "{} bytes", bytes.len());
    let small = codec::encode_batch(&[record(600)]);
    store
        .commit_records(&RecordCommit { batches: vec![(attempt, 0, bytes), (attempt, 1, small)], ..Default::default() })
        .expect("commit");
    let back: Vec<RequestRecord> = store.records(&attempt).collect::<Result<_, _>>().expect("decodes");
    assert_eq!(back.len(), 601);
    assert_eq!(&back[..600], &records[..]);
    assert_eq!(store.stored_batch(&attempt, 0).expect("read"), Some(600));
    let parts = store.records.scan_prefix(attempt_key(&attempt)).count();
    assert!(parts > 9, "{parts} parts");
}

#[test]
fn telemetry_series_are_kept_apart_replaced_whole_and_purged_with_their_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let r = RunId(1);
    store.create_run(&run(r), &[], &[job(r, 0)]).expect("create");
    let a = |attempt| AttemptKey { run: r, job: 0, attempt };
    // Long enough to take several parts.
    let points: Vec<(u32, f64)> = (0..600).map(|i| (i * 500, f64::from(i) / 3.0)).collect();
    let series = |name: &str| Series { name: name.to_owned(), gpu: "GPU-1".to_owned(), points: points.clone() };
    let many: Vec<Series> = (0..4).map(|i| series(&format!("gpu_power_w{i}"))).collect();
    assert!(encode(&many).len() > 2 * PART_BYTES);
    store.apply(&[Write::Telemetry(a(1), many.clone())]).expect("write");
    assert_eq!(store.telemetry(&a(1)).expect("read"), Some(many));
    // Sent again, shorter: nothing of the first is left.
    let one = vec![series("vllm:num_requests_running")];
    store.apply(&[Write::Telemetry(a(1), one.clone())]).expect("write again");
    assert_eq!(store.telemetry(&a(1)).expect("read"), Some(one.clone()));
    store.apply(&[Write::Telemetry(a(2), one.clone())]).expect("the next attempt's");
    // The job itself stays small: listing reads no series.
    let listed = store.jobs(r).expect("jobs");
    assert!(encode(&listed[0]).len() < 2048);
    store.commit_records(&RecordCommit { purges: vec![a(2)], ..Default::default() }).expect("purge");
    assert_eq!(store.telemetry(&a(1)).expect("read"), None);
    assert_eq!(store.telemetry(&a(2)).expect("read"), Some(one));
}

#[test]
fn a_job_stored_before_telemetry_loads_with_none_of_it() {
    let mut stored = serde_json::to_value(job(RunId(1), 0)).expect("json");
    let obj = stored.as_object_mut().expect("an object");
    for field in ["engine_version", "image_digest", "loadgen_args", "loadgen_version", "telemetry"] {
        assert!(obj.remove(field).is_some(), "{field}");
    }
    let old: Job = serde_json::from_value(stored).expect("an older job loads");
    assert_eq!(old, job(RunId(1), 0));
}

#[test]
fn a_run_id_is_claimed_only_if_never_given_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    // A fresh store gave nothing out: any id may be claimed, and the next
    // ones go on from it.
    assert!(store.claim_run_id(RunId(7)).expect("claim"));
    assert!(!store.claim_run_id(RunId(7)).expect("claim"), "an id is claimed once");
    assert_eq!(store.next_run_id().expect("id"), RunId(8));
    // Given out (even if never stored), stored, or below either: not free.
    for taken in [8, 3, 0] {
        assert!(!store.claim_run_id(RunId(taken)).expect("claim"), "{taken}");
    }
    store.create_run(&run(RunId(8)), &[], &[]).expect("create");
    assert!(!store.claim_run_id(RunId(u64::MAX)).expect("claim"), "the last id is never claimed");
    assert!(store.claim_run_id(RunId(20)).expect("claim"));
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(store.next_run_id().expect("id"), RunId(21), "the claim survives a reopen");
}

fn group(run: RunId, id: u64, stage: u32, jobs: Vec<u64>) -> Group {
    use benchfleet_study::model::EngineConfig;
    Group {
        run,
        id,
        config: EngineConfig::test("vllm", &[]),
        gpu: None,
        gpus_per_job: 1,
        jobs,
        stage,
        placement: None,
        failed_on: Vec::new(),
        pin: None,
    }
}

/// Run `id` of `groups` groups of `per_group` jobs each, in `state`.
fn stored_run(store: &SledStore, id: u64, groups: u64, per_group: u64, state: JobState) -> (Run, Vec<Group>, Vec<Job>) {
    let r = run(RunId(id));
    let gs: Vec<Group> =
        (0..groups).map(|g| group(r.id, g, 1, (0..per_group).map(|j| g * per_group + j).collect())).collect();
    let jobs: Vec<Job> =
        gs.iter().flat_map(|g| g.jobs.iter().map(|&j| Job { state, group: g.id, ..job(r.id, j) })).collect();
    store.create_run(&r, &gs, &jobs).expect("create");
    (r, gs, jobs)
}

fn counts_of(store: &SledStore, id: u64) -> Option<RunCounts> {
    store.listed_runs().expect("list").into_iter().find(|(r, _)| r.id == RunId(id)).map(|(_, c)| c)
}

use benchfleet_study::model::JobState;

#[test]
fn run_counts_follow_every_write_of_jobs_and_groups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let (r, mut gs, mut jobs) = stored_run(&store, 1, 2, 3, JobState::Pending);
    let expect = |c: RunCounts, pending, running, succeeded, failed| {
        assert_eq!(
            [
                c.jobs_in(JobState::Pending),
                c.jobs_in(JobState::Running),
                c.jobs_in(JobState::Succeeded),
                c.jobs_in(JobState::Failed)
            ],
            [pending, running, succeeded, failed],
            "{c:?}"
        );
    };
    let c = counts_of(&store, 1).expect("counted");
    expect(c, 6, 0, 0, 0);
    assert_eq!((c.groups, c.stage()), (2, 1));
    // One job through its life, another written twice in one batch: each
    // is counted in its latest state only.
    jobs[0].state = JobState::Running;
    store.apply(&[Write::Job(jobs[0].clone())]).expect("running");
    expect(counts_of(&store, 1).expect("counted"), 5, 1, 0, 0);
    jobs[0].state = JobState::Succeeded;
    jobs[1].state = JobState::Running;
    let mut again = jobs[1].clone();
    again.state = JobState::Failed;
    store.apply(&[Write::Job(jobs[0].clone()), Write::Job(jobs[1].clone()), Write::Job(again.clone())]).expect("ended");
    expect(counts_of(&store, 1).expect("counted"), 4, 0, 1, 1);
    // A group written again is not counted again; a later stage's is.
    gs[0].placement = None;
    let next = group(r.id, 2, 2, vec![6]);
    store.add_groups(r.id, &[gs[0].clone(), next.clone()], &[job(r.id, 6)]).expect("stage 2");
    let c = counts_of(&store, 1).expect("counted");
    expect(c, 5, 0, 1, 1);
    assert_eq!((c.groups, c.stage()), (3, 2));
    assert_eq!(c.progress(), Progress { total: 7, succeeded: 1, failed: 1, cancelled: 0 });
    // What is kept is what counting the stored jobs gives, across a reopen.
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    let recounted = RunCounts::of(&store.groups(r.id).expect("groups"), &store.jobs(r.id).expect("jobs"));
    assert_eq!(counts_of(&store, 1), Some(recounted));
    // A run without groups yet lists as stage 1.
    store.create_run(&run(RunId(2)), &[], &[]).expect("create");
    assert_eq!(counts_of(&store, 2).map(|c| (c.stage(), c.progress().total)), Some((1, 0)));
}

#[test]
fn a_schema_3_store_gets_its_run_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (groups, jobs) = {
        let store = SledStore::open(dir.path()).expect("open");
        let (_, gs, jobs) = stored_run(&store, 1, 2, 2, JobState::Succeeded);
        // As a schema 3 store holds it: no counts.
        store.run_counts.clear().expect("clear");
        store.db.insert("schema_version", &3u32.to_be_bytes()).expect("version");
        store.flush().expect("flush");
        (gs, jobs)
    };
    let store = SledStore::open(dir.path()).expect("migrated");
    assert_eq!(store.run_counts.len(), 1);
    assert_eq!(counts_of(&store, 1), Some(RunCounts::of(&groups, &jobs)));
    let version = store.db.get("schema_version").expect("read").expect("stored");
    assert_eq!(version.as_ref(), &SCHEMA_VERSION.to_be_bytes());
}

/// Every key of `run` in every tree keyed by run.
fn keys_of(store: &SledStore, run: RunId) -> Vec<String> {
    let prefix = key(&[run.0]);
    let mut found = Vec::new();
    for name in store.db.tree_names() {
        let tree = store.db.open_tree(&name).expect("tree");
        if matches!(name.as_ref(), b"agents" | b"meta" | b"__sled__default") {
            continue;
        }
        for k in tree.scan_prefix(&prefix).keys() {
            found.push(format!("{} {:?}", String::from_utf8_lossy(&name), k.expect("key")));
        }
    }
    found
}

/// Stores `content` as a file and dates its last use `age` ago.
fn old_file(store: &SledStore, content: &[u8], age: std::time::Duration) -> String {
    let sha = hex(&sha2::Sha256::digest(content));
    let mut w = store.new_file().expect("new");
    w.write(content).expect("write");
    w.finish(&sha, content.len() as u64).expect("stored");
    let f = std::fs::File::options().write(true).open(store.files.join(&sha)).expect("open");
    f.set_modified(std::time::SystemTime::now() - age).expect("date");
    sha
}

/// Run `id`, over, with records, a summary, stats, telemetry and a digest
/// for its first job's two attempts, naming `files`.
fn full_run(store: &SledStore, id: u64, files: &[&str]) -> Run {
    let (mut r, _, _) = stored_run(store, id, 1, 2, JobState::Succeeded);
    r.state = RunState::Finished;
    r.files = files.iter().enumerate().map(|(i, sha)| (format!("data-{i}.json"), sha.to_string())).collect();
    store.apply(&[Write::Run(r.clone())]).expect("finished");
    let a = |attempt| AttemptKey { run: r.id, job: 0, attempt };
    store
        .commit_records(&RecordCommit {
            batches: vec![batch(a(1), 0, &[0, 1]), batch(a(2), 0, &[0]), batch(a(2), 1, &[1])],
            summaries: vec![(a(2), Summary::default())],
            stats: vec![
                (a(1), AttemptStats { records: 2, sent: 2, removed: true }),
                (a(2), AttemptStats { records: 2, sent: 2, removed: false }),
            ],
            digests: vec![(a(2), codec::encode_digest(&Digest::default()))],
            ..Default::default()
        })
        .expect("records");
    let series = vec![Series { name: "gpu_power_w".into(), gpu: "GPU-1".into(), points: vec![(0, 1.0)] }];
    store.apply(&[Write::Telemetry(a(2), series)]).expect("telemetry");
    r
}

#[test]
fn a_run_not_over_is_not_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let (r, mut gs, mut jobs) = stored_run(&store, 1, 1, 2, JobState::Running);
    let refused = |store: &SledStore| match store.delete_run(r.id) {
        Err(StoreError::NotOver(why)) => why,
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(refused(&store), "run 1 is still running; delete it once it has finished or been cancelled");
    let mut over = r.clone();
    over.state = RunState::Cancelled;
    gs[0].placement = Some(benchfleet_study::model::Placement {
        agent: benchfleet_study::model::AgentId(3),
        gpus: vec!["GPU-0".into()],
        epoch: 1,
        since_unix_ms: 0,
    });
    store.apply(&[Write::Run(over), Write::Group(gs[0].clone())]).expect("cancelled");
    assert!(refused(&store).contains("its group 0 still holds GPUs on agent-3"));
    gs[0].placement = None;
    store.apply(&[Write::Group(gs[0].clone())]).expect("stopped");
    assert_eq!(refused(&store), "run 1 is over, but its job 0 is still running; delete it once the job has ended");
    assert!(store.run(r.id).expect("read").is_some(), "a refused delete leaves the run");
    assert!(matches!(store.delete_run(RunId(9)), Err(StoreError::NotFound(_))));
    for j in &mut jobs {
        j.state = JobState::Cancelled;
    }
    store.apply(&jobs.iter().cloned().map(Write::Job).collect::<Vec<_>>()).expect("ended");
    assert_eq!(store.delete_run(r.id).expect("deleted").jobs, 2);
}

#[test]
fn a_delete_removes_every_key_of_the_run_and_the_files_no_run_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let hour = std::time::Duration::from_secs(3600);
    let (only, shared, recent) = (
        old_file(&store, b"[1]", 2 * hour),
        old_file(&store, b"[2]", 2 * hour),
        old_file(&store, b"[3]", std::time::Duration::ZERO),
    );
    let doomed = full_run(&store, 1, &[&only, &shared, &recent]);
    let kept = full_run(&store, 2, &[&shared]);
    assert!(keys_of(&store, doomed.id).len() > 10);
    let before = keys_of(&store, kept.id);
    let deleted = store.delete_run(doomed.id).expect("deleted");
    assert_eq!(deleted, Deleted { jobs: 2, records: 2, files: vec![only.clone()] });
    assert_eq!(keys_of(&store, doomed.id), Vec::<String>::new(), "no key of the run is left");
    assert_eq!(keys_of(&store, kept.id), before, "the other run is whole");
    assert!(store.run(doomed.id).expect("read").is_none());
    assert_eq!(store.listed_runs().expect("list").len(), 1);
    assert!(!store.has_file(&only).expect("has"), "named by no other run: removed");
    assert!(store.has_file(&shared).expect("has"), "named by another run: kept");
    assert!(store.has_file(&recent).expect("has"), "used within the grace: kept");
    assert!(store.deleted.is_empty());
    // The newest run's id is not given again once it is deleted.
    store.delete_run(kept.id).expect("deleted");
    assert_eq!(store.next_run_id().expect("id"), RunId(3));
}

#[test]
fn writes_of_a_run_being_deleted_are_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let r = full_run(&store, 1, &[]);
    store.mark_deleted(r.id).expect("hidden");
    store
        .apply(&[Write::Run(r.clone()), Write::Job(job(r.id, 0)), Write::Group(group(r.id, 0, 1, vec![0]))])
        .expect("apply");
    assert!(store.run(r.id).expect("read").is_none());
    assert!(store.run_counts.is_empty());
}

#[test]
fn a_delete_cut_short_after_hiding_the_run_is_finished_at_the_next_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = {
        let store = SledStore::open(dir.path()).expect("open");
        let file = old_file(&store, b"[1]", std::time::Duration::from_secs(7200));
        let r = full_run(&store, 1, &[&file]);
        full_run(&store, 2, &[]);
        // A crash right after the first step: the run is out of sight...
        store.mark_deleted(r.id).expect("hidden");
        assert!(store.run(r.id).expect("read").is_none());
        assert_eq!(store.listed_runs().expect("list").iter().map(|(r, _)| r.id).collect::<Vec<_>>(), [RunId(2)]);
        assert!(!keys_of(&store, r.id).is_empty(), "...and the rest still stored");
        file
    };
    // ...and the next open removes the rest.
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(keys_of(&store, RunId(1)), Vec::<String>::new());
    assert!(store.deleted.is_empty());
    assert!(!store.has_file(&file).expect("has"));
    assert_eq!(store.listed_runs().expect("list").len(), 1);
}

#[test]
fn two_digests_of_one_attempt_in_a_commit_keep_the_later_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let a = AttemptKey { run: RunId(1), job: 0, attempt: 1 };
    let histogram = |n: i64| benchfleet_core::Histogram {
        count: n as u64,
        sum_ns: n as f64,
        counts: (0..n).map(|v| (v * 1000, 1)).collect(),
    };
    let (big, small) = (Digest { records: 3, ttft: histogram(20_000), ..Digest::default() }, Digest::default());
    store
        .commit_records(&RecordCommit {
            summaries: vec![(a, Summary::default())],
            digests: vec![(a, codec::encode_digest(&big)), (a, codec::encode_digest(&small))],
            ..Default::default()
        })
        .expect("commit");
    assert_eq!(store.digest(&a).expect("read"), Some(small));
}
