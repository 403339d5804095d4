//! The controller's scheduling against a fake agent speaking the real gRPC
//! protocol: placement by GPU model and count, several groups at once on one
//! host, attempts that go stale when a session is lost, a controller that
//! crashes and restarts without losing its run, and a greedy run whose
//! stages follow from the summaries ingested.

use std::sync::Arc;
use std::time::Duration;

use benchfleet_controller::{Controller, ControllerConfig, SledStore, Store, serve};
use benchfleet_proto as pb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const MATRIX: &str = "\
name: placement
model: m
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process }
variants:
  a: { args: [--a] }
  b: { args: [--b] }
profiles:
  p: { dataset: { random: { input_tokens: 4, output_tokens: 2 } }, requests: 1 }
";

struct Fixture {
    url: String,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn controller() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).expect("store"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let c = Controller::new(store.clone(), ControllerConfig { advertise_url: url.clone() }).expect("controller");
    tokio::spawn(serve(c, listener, std::future::pending()));
    Fixture { url, store, _dir: dir }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned()).expect("url").connect().await.expect("connect")
}

fn gpu(index: u32, name: &str) -> pb::Gpu {
    pb::Gpu { index, uuid: format!("GPU-{index}"), name: name.to_owned(), usable: true, ..Default::default() }
}

/// A fake agent: registered, holding a session, reading assignments.
struct FakeAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    assignments: tonic::Streaming<pb::ControllerMessage>,
}

async fn agent(url: &str, gpus: Vec<pb::Gpu>) -> FakeAgent {
    agent_on(channel(url).await, gpus).await
}

async fn agent_on(channel: Channel, gpus: Vec<pb::Gpu>) -> FakeAgent {
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
    let id = client
        .register(pb::RegisterRequest {
            name: "host-1".into(),
            gpus,
            runtimes: vec!["process".into()],
            ..Default::default()
        })
        .await
        .expect("register")
        .into_inner()
        .agent_id;
    let (tx, rx) = mpsc::channel(16);
    tx.send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(pb::Hello { agent_id: id })) })
        .await
        .expect("hello");
    let assignments = client.session(ReceiverStream::new(rx)).await.expect("session").into_inner();
    FakeAgent { tx, assignments }
}

impl FakeAgent {
    async fn next(&mut self) -> pb::AssignGroup {
        let msg = tokio::time::timeout(Duration::from_secs(10), self.assignments.next())
            .await
            .expect("an assignment in time")
            .expect("the session is open")
            .expect("no error");
        match msg.msg {
            Some(pb::controller_message::Msg::AssignGroup(g)) => g,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    /// No assignment arrives within a short while.
    async fn nothing_more(&mut self) {
        let next = tokio::time::timeout(Duration::from_millis(300), self.assignments.next()).await;
        assert!(next.is_err(), "unexpected message: {next:?}");
    }

    async fn send(&self, msg: pb::agent_message::Msg) {
        self.tx.send(pb::AgentMessage { msg: Some(msg) }).await.expect("send");
    }
}

/// Submits the placement matrix.
async fn submit(url: &str) -> String {
    submit_matrix(url, "placement.yaml", MATRIX).await
}

async fn submit_matrix(url: &str, name: &str, yaml: &str) -> String {
    let mut op = pb::operator_service_client::OperatorServiceClient::new(channel(url).await);
    op.submit_run(pb::SubmitRunRequest { matrix_name: name.into(), matrix_yaml: yaml.into(), ..Default::default() })
        .await
        .expect("submit")
        .into_inner()
        .run_id
}

#[tokio::test]
async fn groups_run_side_by_side_on_their_own_gpus_of_the_right_model() {
    let f = controller().await;
    let mut a =
        agent(&f.url, vec![gpu(0, "NVIDIA H200"), gpu(1, "NVIDIA A100-SXM4-80GB"), gpu(2, "NVIDIA H200")]).await;
    let run = submit(&f.url).await;

    // Four configurations, two H200s: two groups at once, on different GPUs.
    let first = a.next().await;
    let second = a.next().await;
    a.nothing_more().await;
    let mut gpus = [first.gpu_uuids.clone(), second.gpu_uuids.clone()];
    gpus.sort();
    assert_eq!(gpus, [vec!["GPU-0".to_owned()], vec!["GPU-2".to_owned()]]);

    // When one group is done, its GPU goes to the next group.
    a.send(pb::agent_message::Msg::GroupDone(pb::GroupDone { run_id: run.clone(), group: first.group })).await;
    let third = a.next().await;
    assert_eq!(third.gpu_uuids, first.gpu_uuids);
    assert!(third.group != first.group && third.group != second.group);
}

#[tokio::test]
async fn a_lost_session_reruns_its_groups_as_new_attempts_and_ignores_the_old_ones() {
    let f = controller().await;
    let mut a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let run = submit(&f.url).await;
    let old = a.next().await;
    let old_attempt = old.jobs[0].attempt.clone().expect("attempt");
    assert_eq!(old_attempt.attempt, 1);
    drop(a);

    let mut b = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let new = b.next().await;
    assert_eq!(new.group, old.group);
    let new_attempt = new.jobs[0].attempt.clone().expect("attempt");
    assert_eq!((new_attempt.job, new_attempt.attempt), (old_attempt.job, 2));

    // The old attempt's success is ignored...
    b.send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
        attempt: Some(old_attempt.clone()),
        state: pb::JobState::Succeeded as i32,
        ..Default::default()
    }))
    .await;
    // ...and its records are refused.
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(&f.url).await);
    let batch = pb::RecordBatch { attempt: Some(old_attempt.clone()), batch: 0, ..Default::default() };
    let mut acks = ingest.records(tokio_stream::iter([batch])).await.expect("stream").into_inner();
    let refused = acks.next().await.expect("a reply").expect_err("stale records are refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let run_id = run.parse().expect("run id");
    let job = f.store.job(run_id, old_attempt.job).expect("read").expect("job");
    assert_eq!(job.attempt, 2);
    assert!(!job.state.is_terminal(), "{job:?}");
}

/// The controller binary on a fixed loopback port, over a data directory.
fn controller_process(dir: &std::path::Path, port: u16) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-controller"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("the controller starts")
}

/// Connects once the controller listens.
async fn connect_when_up(url: &str) -> Channel {
    for _ in 0..100 {
        if let Ok(c) = Channel::from_shared(url.to_owned()).expect("url").connect().await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the controller at {url} never came up");
}

#[tokio::test]
async fn a_killed_controller_restarts_with_its_run_and_reassigns_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let url = format!("http://127.0.0.1:{port}");
    let mut first = controller_process(dir.path(), port);
    let mut a = agent_on(connect_when_up(&url).await, vec![gpu(0, "NVIDIA H200")]).await;
    let run = submit(&url).await;
    let before = a.next().await;
    let job = before.jobs[0].attempt.clone().expect("attempt");

    first.kill().expect("kill");
    first.wait().expect("reap");
    drop(a);

    let mut second = controller_process(dir.path(), port);
    let mut b = agent_on(connect_when_up(&url).await, vec![gpu(0, "NVIDIA H200")]).await;
    let after = b.next().await;
    let runs = pb::operator_service_client::OperatorServiceClient::new(channel(&url).await)
        .list_runs(pb::ListRunsRequest {})
        .await
        .expect("list")
        .into_inner()
        .runs;
    second.kill().expect("kill");
    let _ = second.wait();

    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].run_id.as_str(), runs[0].state.as_str(), runs[0].jobs_total), (run.as_str(), "running", 4));
    // The group that was running when the controller died runs again, as a
    // new attempt of the same job.
    assert_eq!(after.group, before.group);
    let again = after.jobs[0].attempt.clone().expect("attempt");
    assert_eq!((again.job, again.attempt), (job.job, job.attempt + 1));
}

#[tokio::test]
async fn a_gpu_that_fails_gets_no_work_until_it_recovers() {
    let f = controller().await;
    let mut a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let report = |usable: bool| {
        let mut g = gpu(0, "NVIDIA H200");
        g.usable = usable;
        if !usable {
            g.reasons = vec!["ECC uncorrectable errors: 3".into()];
        }
        pb::agent_message::Msg::GpuReport(pb::GpuReport { gpus: vec![g] })
    };
    a.send(report(false)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    submit(&f.url).await;
    a.nothing_more().await;

    let agents = pb::operator_service_client::OperatorServiceClient::new(channel(&f.url).await)
        .list_agents(pb::ListAgentsRequest {})
        .await
        .expect("agents")
        .into_inner()
        .agents;
    assert_eq!(agents[0].gpus[0].reasons, ["ECC uncorrectable errors: 3"]);

    a.send(report(true)).await;
    let assigned = a.next().await;
    assert_eq!(assigned.gpu_uuids, ["GPU-0"]);
}

const GREEDY: &str = "\
name: greedy
model: m
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process }
  sglang: { runtime: process }
variants:
  a: { args: [--a] }
  b: { args: [--b] }
  c: { args: [--c] }
profiles:
  p: { dataset: { random: { input_tokens: 4, output_tokens: 2 } }, requests: 2 }
  q: { dataset: { random: { input_tokens: 8, output_tokens: 2 } }, requests: 2 }
strategy: greedy
";

/// What each configuration measures, whatever the machine: (total token
/// throughput, successful requests of 2). b would be the fastest, but half
/// its requests fail.
fn measured(config: &str) -> (f64, u64) {
    match config {
        "vllm" => (100.0, 2),
        "sglang" => (90.0, 2),
        "vllm+a" => (110.0, 2),
        "vllm+b" => (300.0, 1),
        "vllm+c" => (105.0, 2),
        "vllm+a+c" => (108.0, 2),
        other => panic!("the greedy procedure should not try {other}"),
    }
}

async fn submit_greedy(url: &str) -> String {
    submit_matrix(url, "greedy.yaml", GREEDY).await
}

/// Runs every job of a group as an agent with loadgen would: the summary
/// through the ingest service, then the job's end, then the group's.
async fn run_group(url: &str, agent: &FakeAgent, group: &pb::AssignGroup) {
    let config = group.engine.as_ref().expect("engine").config_name.clone();
    let (tps, successful) = measured(&config);
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(url).await);
    for job in &group.jobs {
        let attempt = job.attempt.clone().expect("attempt");
        let summary =
            pb::Summary { successful, failed: 2 - successful, total_token_throughput: tps, ..Default::default() };
        let batch =
            pb::RecordBatch { attempt: Some(attempt.clone()), batch: 0, summary: Some(summary), ..Default::default() };
        let mut acks = ingest.records(tokio_stream::iter([batch])).await.expect("stream").into_inner();
        let ack = acks.next().await.expect("a reply").expect("ack");
        assert!(ack.summary_stored);
        agent
            .send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
                attempt: Some(attempt),
                state: pb::JobState::Succeeded as i32,
                ..Default::default()
            }))
            .await;
    }
    agent
        .send(pb::agent_message::Msg::GroupDone(pb::GroupDone { run_id: group.run_id.clone(), group: group.group }))
        .await;
}

/// The next stage's assignments, as "config on profile" sorted, and the groups.
async fn next_stage(agent: &mut FakeAgent, groups: usize) -> (Vec<String>, Vec<pb::AssignGroup>) {
    let mut assigned = Vec::new();
    for _ in 0..groups {
        assigned.push(agent.next().await);
    }
    agent.nothing_more().await;
    let mut shown: Vec<String> = assigned
        .iter()
        .map(|g| {
            let profiles: Vec<&str> = g.jobs.iter().map(|j| j.profile.as_str()).collect();
            format!("{} on {}", g.engine.as_ref().expect("engine").config_name, profiles.join(","))
        })
        .collect();
    shown.sort();
    (shown, assigned)
}

#[tokio::test]
async fn a_greedy_run_is_scheduled_stage_by_stage_from_its_results() {
    let f = controller().await;
    let gpus = (0..4).map(|i| gpu(i, "NVIDIA H200")).collect();
    let mut a = agent(&f.url, gpus).await;
    let run = submit_greedy(&f.url).await;
    let run_id = run.parse().expect("run id");

    // Each stage runs in parallel; the next appears only when it has ended.
    let stages: [&[&str]; 4] = [
        &["sglang on p", "vllm on p"],
        &["vllm+a on p", "vllm+b on p", "vllm+c on p"],
        // b failed the acceptance; a helped most, c less.
        &["vllm+a+c on p"],
        // a+c was below a alone: a is the winner.
        &["vllm on q", "vllm+a on q"],
    ];
    for expected in stages {
        let (shown, groups) = next_stage(&mut a, expected.len()).await;
        assert_eq!(shown, expected);
        let run_info = f.store.run(run_id).expect("read").expect("run");
        assert!(!run_info.finished, "finished before the last stage");
        for g in &groups {
            run_group(&f.url, &a, g).await;
        }
    }

    for _ in 0..50 {
        if f.store.run(run_id).expect("read").expect("run").finished {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(f.store.run(run_id).expect("read").expect("run").finished, "the run never finished");
    a.nothing_more().await;
    let stages: Vec<(String, u32)> =
        f.store.groups(run_id).expect("groups").into_iter().map(|g| (g.config.name, g.stage)).collect();
    let expected = [("vllm", 1), ("sglang", 1), ("vllm+a", 2), ("vllm+b", 2), ("vllm+c", 2), ("vllm+a+c", 3)];
    assert_eq!(stages[..6], expected.map(|(n, s)| (n.to_owned(), s)));

    let report = benchfleet_controller::report::render(f.store.as_ref(), run_id).expect("report");
    let section = report.split("## Greedy stages\n\n").nth(1).and_then(|r| r.split("\n\n").next()).expect("stages");
    assert_eq!(
        section,
        "\
Stage 1: each engine at its defaults
  vllm                                     total token throughput 100.00 tok/s, chosen
  sglang                                   total token throughput 90.00 tok/s, below vllm
Stage 2: each variant alone
  vllm+a                                   +10.00%, helps
  vllm+b                                   success rate 50.0%, not adopted
  vllm+c                                   +5.00%, helps
Stage 3: the helping variants combined
  vllm+a                                   +10.00%, the best single variant, kept
  vllm+a+c                                 +8.00%, below the previous +10.00%, not kept
Stage 4: the winner and the baseline on every profile
  vllm+a                                   the winner, measured on every profile
  vllm                                     the baseline, measured on every profile
Chosen: vllm+a: +10.00% over vllm on profile p"
    );
    assert!(report.contains("## Recommended\n\nvllm serve m --a\n"), "{report}");
}

#[tokio::test]
async fn a_restarted_controller_goes_on_with_the_next_greedy_stage() {
    let f = controller().await;
    let run = submit_greedy(&f.url).await;
    let run_id = run.parse().expect("run id");
    // Stage 1 ended while no controller was there to plan stage 2.
    for mut job in f.store.jobs(run_id).expect("jobs") {
        let config = f.store.groups(run_id).expect("groups")[job.group as usize].config.name.clone();
        let (tps, successful) = measured(&config);
        job.summary = Some(
            pb::Summary { successful, failed: 2 - successful, total_token_throughput: tps, ..Default::default() }
                .into(),
        );
        job.state = benchfleet_controller::model::JobState::Succeeded;
        f.store.put_job(&job).expect("put");
    }

    Controller::new(f.store.clone(), ControllerConfig { advertise_url: f.url.clone() }).expect("restart");
    let groups: Vec<(String, u32)> =
        f.store.groups(run_id).expect("groups").into_iter().map(|g| (g.config.name, g.stage)).collect();
    let expected = [("vllm", 1), ("sglang", 1), ("vllm+a", 2), ("vllm+b", 2), ("vllm+c", 2)];
    assert_eq!(groups, expected.map(|(n, s)| (n.to_owned(), s)));
    let jobs = f.store.jobs(run_id).expect("jobs");
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), (0..5).collect::<Vec<_>>());
}
