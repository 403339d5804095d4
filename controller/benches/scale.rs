//! The control plane at fleet scale: the real `benchfleet-controller`
//! process against many lightweight fake agents (one process, one session
//! each, real gRPC on loopback), measured from outside (its CPU time and
//! memory from /proc). Phases:
//!
//! 1. idle: every agent heartbeats once a second;
//! 2. backlog: a 20,480-job matrix (5,120 groups) that no agent can run
//!    (an A100 matrix on an H200 fleet) waits while the heartbeats go on;
//! 3. placement: a 20,480-job matrix of H200 groups, which the agents run
//!    at once (running, a summary through ingest, succeeded, group done);
//! 4. ingest: streams of record batches (256 records of 128 chunks) into the
//!    store with flush-before-ack, 4 repeats of each configuration;
//! 5. report: the stored records of phase 4 summarized exactly, record by
//!    record (as a summary is made), then digested (as the controller does
//!    once a summary is stored), and the report, which pools the repeats
//!    from the digests.
//!
//! Leases must hold throughout: the bench fails if any agent is lost.
//!
//! `cargo bench -p benchfleet-controller --bench scale -- [--agents N] [--seconds S] [--ingest-records N]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use benchfleet_controller::digests;
use benchfleet_controller::store::{RecordCommit, codec};
use benchfleet_controller::{SledStore, Store};
use benchfleet_proto as pb;
use benchfleet_study::model::RunId;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Keep what is assigned (the ingest phase streams into it).
    Hold,
    /// Run each job at once: running, a summary, succeeded, group done.
    Complete,
}

#[derive(Default)]
struct Counts {
    acks: AtomicU64,
    assigned: AtomicU64,
    jobs_done: AtomicU64,
    groups_done: AtomicU64,
}

struct Fake {
    tx: mpsc::Sender<pb::AgentMessage>,
    held: tokio::sync::Mutex<Vec<pb::AssignGroup>>,
}

fn msg(m: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(m) }
}

/// A pseudo-random number from `x` (splitmix64), for timings that vary.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A request of `chunks` tokens, one a chunk: TTFT 80 to 480 ms, gaps 8 to
/// 16 ms, different for every request and chunk.
fn record(seq: u64, chunks: u32) -> pb::RequestRecord {
    let start = seq as i64 * 1_000_000;
    let first = start + 80_000_000 + (mix(seq) % 400_000_000) as i64;
    let mut at = first;
    let chunk_ns: Vec<i64> = (0..u64::from(chunks))
        .map(|i| {
            if i > 0 {
                at += 8_000_000 + (mix(seq << 8 | i) % 8_000_000) as i64;
            }
            at
        })
        .collect();
    pb::RequestRecord {
        seq,
        scheduled_ns: start,
        sent_ns: start + 20_000,
        first_token_ns: first,
        completed_ns: at,
        chunk_ns,
        chunk_tokens: vec![1; chunks as usize],
        prompt_tokens: 1024,
        output_tokens: chunks,
        outcome: pb::Outcome::Ok as i32,
        http_status: 200,
        ..Default::default()
    }
}

async fn fake_agent(
    url: String,
    name: String,
    mode: Arc<std::sync::Mutex<Mode>>,
    counts: Arc<Counts>,
    start_in: Duration,
) -> Arc<Fake> {
    let channel = Channel::from_shared(url).expect("url").connect().await.expect("connect");
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel.clone());
    let (tx, rx) = mpsc::channel(256);
    let hello = pb::Hello {
        name: name.clone(),
        hostname: name.clone(),
        instance: name.clone(),
        runtimes: vec!["process".into()],
        gpus: vec![pb::Gpu {
            index: 0,
            uuid: format!("GPU-{name}"),
            name: "NVIDIA H200".into(),
            usable: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    tx.send(msg(pb::agent_message::Msg::Hello(hello))).await.expect("hello");
    let mut inbound = client.session(ReceiverStream::new(rx)).await.expect("session").into_inner();
    let Some(Ok(pb::ControllerMessage { msg: Some(pb::controller_message::Msg::Welcome(w)) })) = inbound.next().await
    else {
        panic!("no welcome for {name}")
    };
    let every = Duration::from_millis(u64::from(w.heartbeat_interval_ms));
    let beats = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(start_in).await;
        let mut tick = tokio::time::interval(every);
        for seq in 1.. {
            tick.tick().await;
            if beats.send(msg(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq }))).await.is_err() {
                return;
            }
        }
    });
    let fake = Arc::new(Fake { tx: tx.clone(), held: tokio::sync::Mutex::new(Vec::new()) });
    let me = fake.clone();
    tokio::spawn(async move {
        let ingest = pb::ingest_service_client::IngestServiceClient::new(channel).max_decoding_message_size(16 << 20);
        while let Some(Ok(m)) = inbound.next().await {
            match m.msg {
                Some(pb::controller_message::Msg::HeartbeatAck(_)) => {
                    counts.acks.fetch_add(1, Ordering::Relaxed);
                }
                Some(pb::controller_message::Msg::AssignGroup(g)) => {
                    counts.assigned.fetch_add(1, Ordering::Relaxed);
                    let m = *mode.lock().expect("mode");
                    if m == Mode::Hold {
                        me.held.lock().await.push(g);
                        continue;
                    }
                    let (tx, counts, mut ingest) = (tx.clone(), counts.clone(), ingest.clone());
                    tokio::spawn(async move {
                        for job in &g.jobs {
                            let attempt = job.attempt.clone();
                            let update = |state: pb::JobState| {
                                msg(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
                                    attempt: attempt.clone(),
                                    state: state as i32,
                                    ..Default::default()
                                }))
                            };
                            let _ = tx.send(update(pb::JobState::Running)).await;
                            let summary =
                                pb::Summary { successful: 4, total_token_throughput: 1000.0, ..Default::default() };
                            let batch = pb::RecordBatch {
                                attempt: attempt.clone(),
                                batch: 0,
                                records: (0..4).map(|s| record(s, 16)).collect(),
                                summary: Some(summary),
                                sent: 4,
                            };
                            if let Ok(r) = ingest.records(tokio_stream::iter([batch])).await {
                                let _ = r.into_inner().next().await;
                            }
                            let _ = tx.send(update(pb::JobState::Succeeded)).await;
                            counts.jobs_done.fetch_add(1, Ordering::Relaxed);
                        }
                        let done = pb::GroupDone { run_id: g.run_id.clone(), group: g.group, epoch: g.epoch };
                        let _ = tx.send(msg(pb::agent_message::Msg::GroupDone(done))).await;
                        counts.groups_done.fetch_add(1, Ordering::Relaxed);
                    });
                }
                _ => {}
            }
        }
    });
    fake
}

/// The controller's CPU seconds (user + system) and peak and current RSS.
fn usage(pid: u32) -> (f64, u64, u64) {
    let ticks: f64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or_default().split_whitespace().collect();
    let cpu = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (cpu / ticks, kib("VmHWM:"), kib("VmRSS:"))
}

fn matrix(gpu: &str, name: &str) -> String {
    // 5 engines x 2^10 variant sets = 5,120 groups; 2 profiles x 2 repeats.
    let engines: String = (0..5).map(|i| format!("  e{i}: {{ kind: vllm, runtime: process }}\n")).collect();
    let variants: String = (0..10).map(|i| format!("  v{i}: {{ args: [--flag-{i}] }}\n")).collect();
    format!(
        "name: {name}\nmodel: m\nhardware: {{ gpu: {gpu}, gpus_per_job: 1, allow_other_gpus: true }}\nrepeats: 2\nengines:\n{engines}variants:\n{variants}profiles:\n  a: {{ dataset: {{ random: {{ input_tokens: 8, output_tokens: 4 }} }}, requests: 4 }}\n  b: {{ dataset: {{ random: {{ input_tokens: 16, output_tokens: 4 }} }}, requests: 4 }}\n"
    )
}

async fn agents_lost(op: &mut pb::operator_service_client::OperatorServiceClient<Channel>) -> (usize, usize) {
    let agents = op.list_agents(pb::ListAgentsRequest {}).await.expect("agents").into_inner().agents;
    (agents.iter().filter(|a| a.state == "lost").count(), agents.len())
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut b = Bench::start().await;
    idle(&mut b).await;
    backlog(&mut b).await;
    placement(&mut b).await;
    let ingested = ingest(&mut b, arg("--streams", 32) as usize, arg("--ingest-records", 1_000_000)).await;
    // Stop the controller; read the store ourselves.
    let _ = std::process::Command::new("kill").args(["-TERM", &b.pid.to_string()]).status();
    let _ = b.controller.wait();
    let size1 = dir_size(b.dir.path());
    println!(
        "  store grew by {:.1} MiB: {:.0} bytes a record on disk",
        (size1 - ingested.size0) as f64 / (1 << 20) as f64,
        (size1 - ingested.size0) as f64 / ingested.stored as f64
    );
    report_of_a_million(&b, &ingested);
}

/// The controller under test and its fleet of fake agents.
struct Bench {
    dir: tempfile::TempDir,
    url: String,
    controller: std::process::Child,
    pid: u32,
    op: pb::operator_service_client::OperatorServiceClient<Channel>,
    n_agents: usize,
    window: Duration,
    mode: Arc<std::sync::Mutex<Mode>>,
    counts: Arc<Counts>,
    agents: Vec<Arc<Fake>>,
}

impl Bench {
    /// Starts the controller and connects the agents, their heartbeats
    /// spread over the second.
    async fn start() -> Bench {
        let n_agents = arg("--agents", 1000) as usize;
        let window = Duration::from_secs(arg("--seconds", 20));
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let url = format!("http://127.0.0.1:{port}");
        let controller = std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-controller"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "off", "--data-dir"])
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("the controller starts");
        let pid = controller.id();
        let channel = loop {
            if let Ok(c) = Channel::from_shared(url.clone()).expect("url").connect().await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let op = pb::operator_service_client::OperatorServiceClient::new(channel).max_decoding_message_size(64 << 20);
        println!("controller pid {pid}; {n_agents} fake agents, 1 GPU each");

        // Agents connect, their heartbeats spread over the second.
        let mode = Arc::new(std::sync::Mutex::new(Mode::Complete));
        let counts = Arc::new(Counts::default());
        let began = Instant::now();
        let mut fakes = Vec::new();
        for i in 0..n_agents {
            let start_in = Duration::from_micros((i as u64 * 1_000_000) / n_agents as u64);
            fakes.push(tokio::spawn(fake_agent(
                url.clone(),
                format!("fake-{i:04}"),
                mode.clone(),
                counts.clone(),
                start_in,
            )));
        }
        let mut agents = Vec::new();
        for f in fakes {
            agents.push(f.await.expect("agent"));
        }
        println!("connect: {n_agents} sessions in {:.2} s", began.elapsed().as_secs_f64());
        tokio::time::sleep(Duration::from_secs(3)).await;
        Bench { dir, url, controller, pid, op, n_agents, window, mode, counts, agents }
    }
}

/// A phase's CPU (share of one core since `cpu0` at `t0`) and memory.
fn measure(pid: u32, label: &str, cpu0: f64, t0: Instant) {
    let (cpu, hwm, rss) = usage(pid);
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{label}: {:.1}% of one core over {wall:.1} s; RSS {:.0} MiB (peak {:.0} MiB)",
        100.0 * (cpu - cpu0) / wall,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}

/// Phase 1: idle heartbeats.
async fn idle(b: &mut Bench) {
    let (cpu0, _, _) = usage(b.pid);
    let (acks0, t0) = (b.counts.acks.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(b.window).await;
    measure(b.pid, "idle heartbeats", cpu0, t0);
    let acks = b.counts.acks.load(Ordering::Relaxed) - acks0;
    println!("  heartbeats acknowledged: {:.0}/s", acks as f64 / t0.elapsed().as_secs_f64());
    let (lost, known) = agents_lost(&mut b.op).await;
    assert_eq!(lost, 0, "leases lost while idle");
    assert_eq!(known, b.n_agents);
}

/// Phase 2: a backlog no agent can take.
async fn backlog(b: &mut Bench) {
    let t_submit = Instant::now();
    let sub =
        b.op.submit_run(pb::SubmitRunRequest {
            matrix_name: "backlog.yaml".into(),
            matrix_yaml: matrix("A100", "backlog"),
            ..Default::default()
        })
        .await
        .expect("submitted")
        .into_inner();
    println!(
        "backlog: run {} of {} jobs submitted in {:.2} s; warnings {:?}",
        sub.run_id,
        sub.jobs,
        t_submit.elapsed().as_secs_f64(),
        sub.warnings
    );
    let (cpu0, _, _) = usage(b.pid);
    let t0 = Instant::now();
    tokio::time::sleep(b.window).await;
    measure(b.pid, "heartbeats with 5,120 unplaceable groups queued", cpu0, t0);
    let (lost, _) = agents_lost(&mut b.op).await;
    assert_eq!(lost, 0, "leases lost with a backlog");
    b.op.cancel_run(pb::CancelRunRequest { run_id: sub.run_id.clone(), ..Default::default() }).await.expect("cancel");
}

/// Phase 3, placement: groups run as fast as the fleet takes them.
async fn placement(b: &mut Bench) {
    let (cpu0, _, _) = usage(b.pid);
    let t0 = Instant::now();
    let sub =
        b.op.submit_run(pb::SubmitRunRequest {
            matrix_name: "place.yaml".into(),
            matrix_yaml: matrix("H200", "place"),
            ..Default::default()
        })
        .await
        .expect("submitted")
        .into_inner();
    let submitted = t0.elapsed();
    let groups = 5 * 1024;
    loop {
        if b.counts.groups_done.load(Ordering::Relaxed) >= groups {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let runs = loop {
        let runs = b.op.list_runs(pb::ListRunsRequest {}).await.expect("runs").into_inner().runs;
        if runs.iter().find(|r| r.run_id == sub.run_id).is_some_and(|r| r.state != "running") {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let wall = t0.elapsed().as_secs_f64();
    let run = runs.iter().find(|r| r.run_id == sub.run_id).expect("the run");
    println!(
        "placement: {} jobs in {groups} groups submitted in {:.2} s, all run and stored in {wall:.1} s ({:.0} groups/s, {:.0} jobs/s); {} succeeded",
        sub.jobs,
        submitted.as_secs_f64(),
        groups as f64 / wall,
        sub.jobs as f64 / wall,
        run.jobs_succeeded
    );
    measure(b.pid, "  controller during placement", cpu0, t0);
    let (lost, _) = agents_lost(&mut b.op).await;
    assert_eq!(lost, 0, "leases lost during placement");
}

/// What the ingest phase stored, for the report phase.
struct Ingested {
    run_id: String,
    stored: u64,
    groups: usize,
    repeats: usize,
    size0: u64,
}

/// Phase 4, ingest: `streams / 4` agents hold a group of 4 repeats each
/// and stream the records of all 4 at once.
async fn ingest(b: &mut Bench, streams: usize, ingest_records: u64) -> Ingested {
    *b.mode.lock().expect("mode") = Mode::Hold;
    let repeats = 4;
    let groups = streams / repeats;
    let yaml = format!(
        "name: ingest\nmodel: m\nhardware: {{ gpu: H200, gpus_per_job: 1 }}\nrepeats: {repeats}\nengines:\n{}profiles:\n  a: {{ dataset: {{ random: {{ input_tokens: 8, output_tokens: 128 }} }}, requests: {} }}\n",
        (0..groups).map(|i| format!("  e{i}: {{ kind: vllm, runtime: process }}\n")).collect::<String>(),
        ingest_records / streams as u64
    );
    let sub = b
        .op
        .submit_run(pb::SubmitRunRequest { matrix_name: "ingest.yaml".into(), matrix_yaml: yaml, ..Default::default() })
        .await
        .expect("submitted")
        .into_inner();
    let mut held = Vec::new();
    while held.len() < groups {
        held.clear();
        for a in &b.agents {
            for g in a.held.lock().await.iter() {
                if g.run_id == sub.run_id {
                    held.push((a.clone(), g.clone()));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let size0 = dir_size(b.dir.path());
    let per_stream = ingest_records / streams as u64;
    let batches_per_stream = per_stream.div_ceil(256);
    // Every stream connected and its batches built before the clock starts:
    // the bench measures the controller, not its own clients.
    let mut streams_ready = Vec::new();
    for (agent, attempt) in held.iter().flat_map(|(a, g)| g.jobs.iter().map(move |j| (a, j.attempt.clone()))) {
        let channel = Channel::from_shared(b.url.clone()).expect("url").connect().await.expect("connect");
        let ingest = pb::ingest_service_client::IngestServiceClient::new(channel);
        let batches: Vec<pb::RecordBatch> = (0..batches_per_stream)
            .map(|b| {
                let first = b * 256;
                let last = (first + 256).min(per_stream);
                pb::RecordBatch {
                    attempt: attempt.clone(),
                    batch: b,
                    records: (first..last).map(|s| record(s, 128)).collect(),
                    summary: (b + 1 == batches_per_stream)
                        .then(|| pb::Summary { successful: per_stream, ..Default::default() }),
                    sent: last,
                }
            })
            .collect();
        streams_ready.push((agent.tx.clone(), attempt, ingest, batches));
    }
    let (cpu0, _, _) = usage(b.pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (tx, attempt, mut ingest, batches) in streams_ready {
        let _ = tx
            .send(msg(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
                attempt: attempt.clone(),
                state: pb::JobState::Running as i32,
                ..Default::default()
            })))
            .await;
        tasks.push(tokio::spawn(async move {
            let n = batches.len();
            let mut acks = ingest.records(tokio_stream::iter(batches)).await.expect("stream").into_inner();
            let mut got = 0;
            while let Some(ack) = acks.next().await {
                ack.expect("stored");
                got += 1;
                if got == n {
                    break;
                }
            }
            let _ = tx
                .send(msg(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
                    attempt,
                    state: pb::JobState::Succeeded as i32,
                    ..Default::default()
                })))
                .await;
        }));
    }
    for t in tasks {
        t.await.expect("stream");
    }
    let wall = t0.elapsed().as_secs_f64();
    let stored = per_stream * streams as u64;
    println!(
        "ingest: {stored} records (128 chunks each) over {streams} streams in {wall:.2} s: {:.0} records/s, each acknowledged after its flush",
        stored as f64 / wall
    );
    measure(b.pid, "  controller during ingest", cpu0, t0);
    for (agent, g) in &held {
        let done = pb::GroupDone { run_id: g.run_id.clone(), group: g.group, epoch: g.epoch };
        let _ = agent.tx.send(msg(pb::agent_message::Msg::GroupDone(done))).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (lost, _) = agents_lost(&mut b.op).await;
    assert_eq!(lost, 0, "leases lost during ingest");

    Ingested { run_id: sub.run_id, stored, groups, repeats, size0 }
}

/// Phase 5: the report of a million records.
fn report_of_a_million(b: &Bench, ingested: &Ingested) {
    let Ingested { run_id, stored: _, groups, repeats, size0: _ } = ingested;
    let (groups, repeats) = (*groups, *repeats);
    let store = SledStore::open(&b.dir.path().join("store")).expect("store");
    let run: RunId = run_id.parse().expect("run id");
    let jobs = store.jobs(run).expect("jobs");
    // (a) Exact, from the records, as one job's summary is made.
    let t0 = Instant::now();
    let mut total = 0;
    let mut decoding = Duration::ZERO;
    for job in &jobs {
        let t = Instant::now();
        let records: Vec<_> = store.records(&job.key()).collect::<Result<_, _>>().expect("records");
        decoding += t.elapsed();
        total += records.len();
        let s = benchfleet_core::summarize(&records, None);
        assert_eq!(s.successful as usize, records.len());
    }
    let exact = t0.elapsed().as_secs_f64();
    println!(
        "exact summaries: {total} stored records read and summarized in {exact:.2} s (reading and decoding {:.2} s, summarizing {:.2} s)",
        decoding.as_secs_f64(),
        exact - decoding.as_secs_f64()
    );
    // (b) The digests, built from the records as the controller builds
    // each once its summary is stored.
    let by_controller = jobs.iter().filter(|j| store.has_digest(&j.key()).expect("read")).count();
    let t0 = Instant::now();
    let mut commit = RecordCommit::default();
    let never = AtomicBool::new(false);
    for job in &jobs {
        let summary = job.summary.as_ref().expect("a summary");
        let d = digests::build(&store, &job.key(), summary, &never).expect("records").expect("not stopped");
        commit.digests.push((job.key(), codec::encode_digest(&d)));
    }
    let built = t0.elapsed().as_secs_f64();
    let bytes: usize = commit.digests.iter().map(|(_, b)| b.len()).sum();
    store.commit_records(&commit).expect("digests stored");
    println!(
        "digests: {} built from {total} records in {built:.2} s ({:.0} records/s), {:.1} KiB each on average; {by_controller} were already built by the controller before it stopped",
        jobs.len(),
        total as f64 / built,
        bytes as f64 / jobs.len() as f64 / 1024.0
    );
    // (c) The report: every configuration's repeats pooled from their digests.
    let t0 = Instant::now();
    let report = benchfleet_controller::report::render(&store, run).expect("report").text;
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(report.matches(&format!("({repeats} repeats pooled)")).count(), groups, "{report}");
    println!(
        "report: {groups} blocks pooled from {} digests of {total} records in {took:.3} s ({:.0}x faster than the exact summaries), {} bytes",
        jobs.len(),
        exact / took,
        report.len()
    );
}

fn dir_size(path: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            let m = e.metadata();
            if m.as_ref().is_ok_and(|m| m.is_dir()) {
                total += dir_size(&e.path());
            } else {
                total += m.map_or(0, |m| m.len());
            }
        }
    }
    total
}
