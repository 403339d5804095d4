//! `benchfleet runs` over a large store: 1,000 finished runs of 1,000 jobs
//! (10 groups of 100, each job with one attempt and its summary), built
//! once in a temporary directory. Timed:
//!
//! 1. listing the runs as `ListRuns` does (`convert::run_list`: the runs and
//!    the counts the store keeps), and as it did before (every run's groups
//!    and jobs decoded, each job with its summary), side by side;
//! 2. deleting half of the runs (`Store::delete_run`), with the store's size
//!    on disk before, after, after it is opened again, and after as many
//!    runs as were deleted are stored again (whether sled reuses the space).
//!
//! `cargo bench -p benchfleet-controller --bench runs -- [--runs N] [--jobs N] [--repeat N] [--dir DIR]`
//!
//! `--dir` keeps the store there (built once, reused by later runs).

use std::time::{Duration, Instant};

use benchfleet_controller::convert;
use benchfleet_controller::store::RecordCommit;
use benchfleet_controller::{SledStore, Store};
use benchfleet_core::Summary;
use benchfleet_study::model::{
    AgentId, AttemptInfo, AttemptOutcome, Dataset, EngineConfig, EngineKind, Group, Job, JobState, Profile, Run, RunId,
    RunState, RuntimeKind,
};

const GROUPS: u64 = 10;

struct Args {
    runs: u64,
    jobs: u64,
    repeat: usize,
    dir: Option<std::path::PathBuf>,
}

fn args() -> Args {
    let mut a = Args { runs: 1000, jobs: 1000, repeat: 20, dir: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--runs" => a.runs = value().parse().expect("--runs N"),
            "--jobs" => a.jobs = value().parse().expect("--jobs N"),
            "--repeat" => a.repeat = value().parse().expect("--repeat N"),
            "--dir" => a.dir = Some(value().into()),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

fn config(i: u64) -> EngineConfig {
    EngineConfig {
        name: format!("vllm+v{i}"),
        engine: "vllm".into(),
        kind: EngineKind::Vllm,
        variants: vec![format!("v{i}")],
        model: "Qwen/Qwen3.5-9B".into(),
        image: "vllm/vllm-openai:v0.11.0".into(),
        args: vec!["--max-model-len=4096".into(), format!("--max-num-seqs={}", 64 + i)],
        runtime: RuntimeKind::Docker,
        url: None,
        allow_warm_cache: false,
        profiles: None,
    }
}

/// A finished run as the controller stores it: groups, succeeded jobs with
/// their attempt and lifecycle facts, and a summary per job.
fn build(store: &SledStore, runs: u64, jobs: u64) {
    let per_group = jobs.div_ceil(GROUPS);
    let began = Instant::now();
    for n in 0..runs {
        let id = store.next_run_id().expect("id");
        let run = Run {
            id,
            name: format!("study-{n}"),
            matrix_file: "study.yaml".into(),
            matrix_yaml: "name: study\nmodel: Qwen/Qwen3.5-9B\n".repeat(20),
            created_unix_ms: 1_700_000_000_000 + n as i64,
            state: RunState::Finished,
            ended_unix_ms: Some(1_700_000_100_000 + n as i64),
            note: None,
            files: Default::default(),
            runtime_override: None,
            fleet: None,
        };
        let groups: Vec<Group> = (0..GROUPS)
            .map(|g| Group {
                run: id,
                id: g,
                config: config(g),
                gpu: Some("H200".into()),
                gpus_per_job: 1,
                jobs: (g * per_group..((g + 1) * per_group).min(jobs)).collect(),
                stage: 1,
                placement: None,
                failed_on: Vec::new(),
                pin: None,
            })
            .collect();
        let mut profile =
            Profile::new("chat", Dataset::Random { input_tokens: 1024, output_tokens: 256, seed: 1 }, 1000);
        profile.rate = Some(8.0);
        let list: Vec<Job> = (0..jobs)
            .map(|j| {
                let mut job = Job::new(id, j, j / per_group, profile.clone(), (j % 3) as u32 + 1);
                job.state = JobState::Succeeded;
                job.attempt = 1;
                job.epoch = 7;
                job.agent = Some(AgentId(j % 64));
                job.engine_startup_s = Some(41.5);
                job.gpu_fingerprint = vec![format!("NVIDIA H200 GPU-{j:08x} driver 570.86.15 CUDA 12.8")];
                job.engine_version = Some("0.11.0".into());
                job.loadgen_version = Some("0.1.0".into());
                job.loadgen_args = "--backend vllm --model Qwen/Qwen3.5-9B --dataset-name random --random-input-len \
                                    1024 --random-output-len 256 --num-prompts 1000 --request-rate 8 --seed 1"
                    .split(' ')
                    .map(String::from)
                    .collect();
                job.attempts = vec![AttemptInfo {
                    price: None,
                    number: 1,
                    epoch: 7,
                    agent: AgentId(j % 64),
                    agent_name: format!("gpu-{:02}", j % 64),
                    started_unix_ms: 1_700_000_000_000,
                    ended_unix_ms: Some(1_700_000_060_000),
                    outcome: AttemptOutcome::Succeeded,
                    reason: None,
                    charged: false,
                    log_tail: None,
                }];
                job
            })
            .collect();
        store.create_run(&run, &groups, &list).expect("create");
        let summaries = list
            .iter()
            .map(|j| {
                let s =
                    Summary { successful: 1000, total_token_throughput: 9000.0 + j.id as f64, ..Summary::default() };
                (j.key(), s)
            })
            .collect();
        store.commit_records(&RecordCommit { summaries, ..Default::default() }).expect("summaries");
        if (n + 1) % 100 == 0 {
            eprintln!("  {} runs stored in {:.0?}", n + 1, began.elapsed());
        }
    }
}

/// The listing as `ListRuns` made it before the store kept counts.
fn list_before(store: &dyn Store) -> Vec<benchfleet_proto::RunInfo> {
    let mut out = Vec::new();
    for r in store.runs().expect("runs") {
        let groups = store.groups(r.id).expect("groups");
        let stage = groups.iter().map(|g| g.stage).max().unwrap_or(1);
        out.push(convert::run_info(&r, &store.jobs(r.id).expect("jobs"), stage));
    }
    out
}

fn time<T>(repeat: usize, mut f: impl FnMut() -> T) -> (Vec<Duration>, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        let began = Instant::now();
        last = Some(f());
        times.push(began.elapsed());
    }
    times.sort();
    (times, last.expect("at least once"))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() {
    let a = args();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().join("store"));
    let store = SledStore::open(&dir).expect("store");
    if store.runs().expect("runs").is_empty() {
        eprintln!("building {} runs of {} jobs in {}", a.runs, a.jobs, dir.display());
        let began = Instant::now();
        build(&store, a.runs, a.jobs);
        eprintln!("built in {:.1?}, {} on disk", began.elapsed(), mib(store.size_on_disk().expect("size")));
    }
    let runs = store.runs().expect("runs").len();

    let (now, listed) = time(a.repeat, || convert::run_list(&store).expect("list"));
    let (before, old) = time(a.repeat.min(3), || list_before(&store));
    assert_eq!(listed, old, "both listings say the same");
    let median = |t: &[Duration]| t[t.len() / 2];
    println!("listing {runs} runs of {} jobs:", a.jobs);
    println!(
        "  from the kept counts (now):      median {:>10.2?}  min {:>10.2?}  ({} times)",
        median(&now),
        now[0],
        now.len()
    );
    println!(
        "  from every job (before):         median {:>10.2?}  min {:>10.2?}  ({} times)",
        median(&before),
        before[0],
        before.len()
    );
    println!("  ratio of medians: {:.0}x", median(&before).as_secs_f64() / median(&now).as_secs_f64());

    let size = store.size_on_disk().expect("size");
    let doomed: Vec<RunId> = store.runs().expect("runs").iter().map(|r| r.id).take(runs / 2).collect();
    let began = Instant::now();
    let mut jobs = 0;
    for id in &doomed {
        jobs += store.delete_run(*id).expect("deleted").jobs;
    }
    let took = began.elapsed();
    let after = store.size_on_disk().expect("size");
    let (listing, _) = time(a.repeat, || convert::run_list(&store).expect("list"));
    drop(store);
    let store = SledStore::open(&dir).expect("reopen");
    let reopened = store.size_on_disk().expect("size");
    println!(
        "deleting {} runs ({jobs} jobs): {took:.1?}, {:.1?} a run",
        doomed.len(),
        took / doomed.len().max(1) as u32
    );
    println!("  size on disk: {} before, {} after, {} after reopening", mib(size), mib(after), mib(reopened));
    println!("  listing the {} runs left: median {:.2?}", runs - doomed.len(), median(&listing));
    let began = Instant::now();
    build(&store, doomed.len() as u64, a.jobs);
    println!(
        "  {} after storing {} runs again ({:.1?}); {} runs listed in {:.2?}",
        mib(store.size_on_disk().expect("size")),
        doomed.len(),
        began.elapsed(),
        runs,
        median(&time(a.repeat, || convert::run_list(&store).expect("list")).0)
    );
}
