//! The controller's services against a fake agent speaking the real gRPC
//! protocol: placement by GPU model and count, several groups at once on one
//! host, attempts that go stale when an agent restarts (their records
//! refused for good), a controller that is killed and restarts while its
//! agent goes on, a clone refused, and a greedy run whose stages follow from
//! the summaries ingested; the codes of what an operator is refused
//! (`refusals`); and how `serve` stops (`stop`).
//!
//! Nothing here sleeps to let something happen: a test that checks that
//! nothing came of a message first waits for the controller to have
//! handled it (`FakeAgent::settle`).

mod refusals;
mod stop;

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
    controller: Arc<Controller>,
    _dir: tempfile::TempDir,
}

async fn controller() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).expect("store"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let c = Controller::start(store.clone(), ControllerConfig::new(url.clone())).expect("controller");
    tokio::spawn(serve(c.clone(), listener, std::future::pending()));
    Fixture { url, store, controller: c, _dir: dir }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned()).expect("url").connect().await.expect("connect")
}

fn gpu(index: u32, name: &str) -> pb::Gpu {
    pb::Gpu { index, uuid: format!("GPU-{index}"), name: name.to_owned(), usable: true, ..Default::default() }
}

/// A fake agent: holding a session (heartbeats on a task), reading
/// assignments.
struct FakeAgent {
    tx: mpsc::Sender<pb::AgentMessage>,
    assignments: tonic::Streaming<pb::ControllerMessage>,
    welcome: pb::Welcome,
    heartbeats: tokio::task::JoinHandle<()>,
    /// The sequence numbers of `settle`'s heartbeats count down from the
    /// top, apart from the heartbeat task's.
    barriers: u64,
}

impl Drop for FakeAgent {
    /// Like a killed agent: the session's stream ends.
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// Says hello until the controller has seen the previous session of the
/// name end (as a restarted agent retries). The retry waits on the
/// transport: when the controller reads the end of a dropped client's
/// stream is up to HTTP/2, not to anything this test can order.
async fn agent_again(url: &str, gpus: Vec<pb::Gpu>, instance: &str, running: Vec<pb::GroupClaim>) -> FakeAgent {
    for _ in 0..100 {
        match agent_on(channel(url).await, gpus.clone(), instance, running.clone()).await {
            Ok(a) => return a,
            Err(s) if s.code() == tonic::Code::AlreadyExists => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => panic!("{s:?}"),
        }
    }
    panic!("the earlier session never ended")
}

async fn agent(url: &str, gpus: Vec<pb::Gpu>) -> FakeAgent {
    agent_on(channel(url).await, gpus, "i1", Vec::new()).await.expect("welcome")
}

async fn agent_on(
    channel: Channel,
    gpus: Vec<pb::Gpu>,
    instance: &str,
    running: Vec<pb::GroupClaim>,
) -> Result<FakeAgent, tonic::Status> {
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    let hello = pb::Hello {
        name: "host-1".into(),
        gpus,
        runtimes: vec!["process".into()],
        instance: instance.into(),
        running,
        ..Default::default()
    };
    tx.send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(hello)) }).await.expect("hello");
    let mut assignments = client.session(ReceiverStream::new(rx)).await?.into_inner();
    let welcome = match assignments.next().await {
        Some(Ok(pb::ControllerMessage { msg: Some(pb::controller_message::Msg::Welcome(w)) })) => w,
        other => panic!("expected a welcome, got {other:?}"),
    };
    let beats = tx.clone();
    // Real heartbeats, at the agent's pace, to keep the lease: a time-based
    // behaviour of the controller's, not a wait of the test's.
    let heartbeats = tokio::spawn(async move {
        for seq in 1.. {
            let beat = pb::AgentMessage { msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq })) };
            if beats.send(beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Ok(FakeAgent { tx, assignments, welcome, heartbeats, barriers: u64::MAX })
}

impl FakeAgent {
    /// The next message that is not a heartbeat acknowledgement.
    async fn message(&mut self, wait: Duration) -> Option<pb::controller_message::Msg> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::time::timeout_at(deadline, self.assignments.next()).await.ok()?;
            match next.expect("the session is open").expect("no error").msg {
                Some(pb::controller_message::Msg::HeartbeatAck(_)) => continue,
                other => return other,
            }
        }
    }

    async fn next(&mut self) -> pb::AssignGroup {
        match self.message(Duration::from_secs(10)).await {
            Some(pb::controller_message::Msg::AssignGroup(g)) => g,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    /// Everything the controller sends for what this agent sent so far, up
    /// to a barrier (heartbeat acknowledgements aside). The session is read
    /// in order and the driver applies events in arrival order, but a
    /// batch's acknowledgements go out before the assignments its dispatch
    /// makes; so two heartbeats, the second sent once the first is
    /// acknowledged: the second is applied in a later batch than every
    /// message sent before the first, and its acknowledgement comes after
    /// everything those batches sent.
    async fn settle(&mut self) -> Vec<pb::controller_message::Msg> {
        let mut sent = Vec::new();
        for _ in 0..2 {
            let seq = self.barriers;
            self.barriers -= 1;
            self.send(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq })).await;
            loop {
                let next = tokio::time::timeout(Duration::from_secs(10), self.assignments.next())
                    .await
                    .unwrap_or_else(|_| panic!("heartbeat {seq} was never acknowledged"));
                match next.expect("the session is open").expect("no error").msg {
                    Some(pb::controller_message::Msg::HeartbeatAck(a)) if a.seq == seq => break,
                    Some(pb::controller_message::Msg::HeartbeatAck(_)) | None => {}
                    Some(other) => sent.push(other),
                }
            }
        }
        sent
    }

    /// Nothing but heartbeat acknowledgements comes for what this agent sent
    /// so far (`settle`).
    async fn nothing_more(&mut self) {
        let more = self.settle().await;
        assert!(more.is_empty(), "unexpected messages: {more:?}");
    }

    async fn done(&self, group: &pb::AssignGroup) {
        let done = pb::GroupDone { run_id: group.run_id.clone(), group: group.group, epoch: group.epoch };
        self.send(pb::agent_message::Msg::GroupDone(done)).await;
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
    let _ = &run;
    a.send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
        attempt: first.jobs[0].attempt.clone(),
        state: pb::JobState::Failed as i32,
        failure: pb::FailureKind::Config as i32,
        error: "unrecognized arguments: --a".into(),
        ..Default::default()
    }))
    .await;
    a.done(&first).await;
    let third = a.next().await;
    assert_eq!(third.gpu_uuids, first.gpu_uuids);
    assert!(third.group != first.group && third.group != second.group);
}

#[tokio::test]
async fn a_restarted_agent_gets_its_group_again_and_the_old_attempt_is_refused_for_good() {
    let f = controller().await;
    let a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let mut a = a;
    let run = submit(&f.url).await;
    let old = a.next().await;
    let old_attempt = old.jobs[0].attempt.clone().expect("attempt");
    assert_eq!((old_attempt.attempt, old_attempt.epoch), (1, a.welcome.epoch));
    drop(a);

    // The same host, a new agent process: it claims nothing.
    let mut b = agent_again(&f.url, vec![gpu(0, "NVIDIA H200")], "i2", Vec::new()).await;
    let new = b.next().await;
    assert_eq!(new.group, old.group);
    let new_attempt = new.jobs[0].attempt.clone().expect("attempt");
    assert_eq!((new_attempt.job, new_attempt.attempt), (old_attempt.job, 2));
    assert!(new_attempt.epoch > old_attempt.epoch);

    // The old attempt's success is ignored...
    b.send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
        attempt: Some(old_attempt.clone()),
        state: pb::JobState::Succeeded as i32,
        ..Default::default()
    }))
    .await;
    // ...and its records are refused, for good.
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(&f.url).await);
    let batch = pb::RecordBatch { attempt: Some(old_attempt.clone()), batch: 0, ..Default::default() };
    let mut acks = ingest.records(tokio_stream::iter([batch])).await.expect("stream").into_inner();
    let refused = acks.next().await.expect("a reply").expect_err("stale records are refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("may not send records"), "{}", refused.message());

    // Once the success is handled, it has changed nothing: no message, and
    // the store holds the new attempt, running.
    b.nothing_more().await;
    let run_id = run.parse().expect("run id");
    let job = f.store.job(run_id, old_attempt.job).expect("read").expect("job");
    assert_eq!(job.attempt, 2);
    assert!(!job.state.is_terminal(), "{job:?}");
    assert!(job.attempts[0].reason.as_deref().is_some_and(|r| r.contains("came back without it")), "{job:?}");
}

#[tokio::test]
async fn a_second_agent_with_the_same_name_is_refused_naming_the_first() {
    let f = controller().await;
    let _first = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let clone = agent_on(channel(&f.url).await, vec![gpu(0, "NVIDIA H200")], "another", Vec::new()).await;
    let status = clone.err().expect("refused");
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert!(status.message().contains("already holds the name 'host-1' (agent-1"), "{}", status.message());
}

/// The controller binary on a fixed loopback port, over a data directory.
fn controller_process(dir: &std::path::Path, port: u16) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-controller"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("the controller starts")
}

/// Connects once the controller listens: a process starting up, which
/// nothing but trying again can wait for.
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
async fn a_killed_controller_restarts_with_its_run_and_its_agent_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let url = format!("http://127.0.0.1:{port}");
    let mut first = controller_process(dir.path(), port);
    let mut a =
        agent_on(connect_when_up(&url).await, vec![gpu(0, "NVIDIA H200")], "i1", Vec::new()).await.expect("welcome");
    let run = submit(&url).await;
    let before = a.next().await;
    let job = before.jobs[0].attempt.clone().expect("attempt");

    first.kill().expect("kill");
    first.wait().expect("reap");
    drop(a);

    let mut second = controller_process(dir.path(), port);
    let claim = pb::GroupClaim {
        run_id: before.run_id.clone(),
        group: before.group,
        attempts: before.jobs.iter().filter_map(|j| j.attempt.clone()).collect(),
    };
    let mut b =
        agent_on(connect_when_up(&url).await, vec![gpu(0, "NVIDIA H200")], "i1", vec![claim]).await.expect("welcome");
    let runs = pb::operator_service_client::OperatorServiceClient::new(channel(&url).await)
        .list_runs(pb::ListRunsRequest {})
        .await
        .expect("list")
        .into_inner()
        .runs;
    // The group it was running goes on: it is kept, not assigned again.
    assert_eq!(b.welcome.keep, [pb::GroupRef { run_id: before.run_id.clone(), group: before.group }]);
    assert_eq!(b.welcome.agent_id, a_id(&before));
    assert!(b.welcome.epoch > job.epoch, "epochs never repeat across restarts");
    b.send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
        attempt: Some(job.clone()),
        state: pb::JobState::Running as i32,
        ..Default::default()
    }))
    .await;
    b.nothing_more().await;
    let jobs = pb::operator_service_client::OperatorServiceClient::new(channel(&url).await)
        .list_jobs(pb::ListJobsRequest { run_id: run.clone() })
        .await
        .expect("jobs")
        .into_inner()
        .jobs;
    let first_job = jobs.iter().find(|j| j.job == job.job).expect("the job");
    assert_eq!((first_job.state.as_str(), first_job.attempts.len()), ("running", 1), "{first_job:?}");
    second.kill().expect("kill");
    let _ = second.wait();

    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].run_id.as_str(), runs[0].state.as_str(), runs[0].jobs_total), (run.as_str(), "running", 4));
}

/// The agent id every fake agent gets on a fresh store.
fn a_id(_: &pb::AssignGroup) -> String {
    "agent-1".to_owned()
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
    // The report is handled before the run is submitted.
    a.nothing_more().await;
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
    // What the recovery brings comes before the barrier ends.
    let sent = a.settle().await;
    let [pb::controller_message::Msg::AssignGroup(assigned)] = sent.as_slice() else { panic!("{sent:?}") };
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

/// Runs every job of a group as an agent with loadgen would, each with its
/// configuration's numbers.
async fn run_group(url: &str, agent: &FakeAgent, group: &pb::AssignGroup) {
    let config = group.engine.as_ref().expect("engine").config_name.clone();
    let (tps, successful) = measured(&config);
    let summary =
        |_: &str| pb::Summary { successful, failed: 2 - successful, total_token_throughput: tps, ..Default::default() };
    run_jobs(url, agent, group, summary).await;
}

/// Runs every job of a group as an agent with loadgen would: the summary
/// (of its profile) through the ingest service, then the job's end, then
/// the group's.
async fn run_jobs(url: &str, agent: &FakeAgent, group: &pb::AssignGroup, summary_of: impl Fn(&str) -> pb::Summary) {
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(url).await);
    for job in &group.jobs {
        let attempt = job.attempt.clone().expect("attempt");
        let summary = summary_of(&job.profile);
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
    agent.done(group).await;
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
        assert!(!run_info.is_over(), "finished before the last stage");
        for g in &groups {
            run_group(&f.url, &a, g).await;
        }
    }

    // The last group's end finishes the run, in the batch that handles it.
    a.nothing_more().await;
    assert!(f.store.run(run_id).expect("read").expect("run").is_over(), "the run never finished");
    let stages: Vec<(String, u32)> =
        f.store.groups(run_id).expect("groups").into_iter().map(|g| (g.config.name, g.stage)).collect();
    let expected = [("vllm", 1), ("sglang", 1), ("vllm+a", 2), ("vllm+b", 2), ("vllm+c", 2), ("vllm+a+c", 3)];
    assert_eq!(stages[..6], expected.map(|(n, s)| (n.to_owned(), s)));

    let report = benchfleet_controller::report::render(f.store.as_ref(), run_id).expect("report").text;
    let section = report.split("## Greedy stages\n\n").nth(1).and_then(|r| r.split("\n\n").next()).expect("stages");
    assert_eq!(
        section,
        "\
Stage 1: each engine at its defaults
  vllm                                     total token throughput 100.00 tok/s, chosen
  sglang                                   total token throughput 90.00 tok/s, below vllm
  Summary: vllm Total TPS = 100.00, sglang Total TPS = 90.00. vllm higher by 10.00 tok/s (11.1%); Mean TPOT = 0.00 ms vs 0.00 ms, lower by 0.00 ms (0.00%).
Stage 2: each variant alone
  vllm+a                                   +10.00%, helps
  vllm+b                                   success rate 50.0%, not adopted
  vllm+c                                   +5.00%, helps
  Summary: vllm+a Total TPS = 110.00, vllm+b Total TPS = 300.00 (success rate 50.0%, not adopted), vllm+c Total TPS = 105.00. vllm+a higher by 5.00 tok/s (4.8%); Mean TPOT = 0.00 ms vs 0.00 ms, lower by 0.00 ms (0.00%).
Stage 3: the helping variants combined
  vllm+a                                   +10.00%, the best single variant, kept
  vllm+a+c                                 +8.00%, below the previous +10.00%, not kept
  Summary: vllm+a Total TPS = 110.00, vllm+a+c Total TPS = 108.00. vllm+a higher by 2.00 tok/s (1.9%); Mean TPOT = 0.00 ms vs 0.00 ms, lower by 0.00 ms (0.00%).
Stage 4: the winner and the baseline on every profile
  vllm+a                                   the winner, measured on every profile
  vllm                                     the baseline, measured on every profile
  Summary: vllm+a Total TPS = 110.00, vllm Total TPS = 100.00. vllm+a higher by 10.00 tok/s (10.0%); Mean TPOT = 0.00 ms vs 0.00 ms, lower by 0.00 ms (0.00%).
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
        job.state = benchfleet_study::model::JobState::Succeeded;
        let summary = job.summary.take().expect("set above");
        f.store
            .commit_records(&benchfleet_controller::store::RecordCommit {
                summaries: vec![(job.key(), summary)],
                ..Default::default()
            })
            .expect("summary");
        f.store.apply(&[benchfleet_controller::records::Write::Job(job)]).expect("put");
    }

    Controller::start(f.store.clone(), ControllerConfig::new(f.url.clone())).expect("restart");
    let groups: Vec<(String, u32)> =
        f.store.groups(run_id).expect("groups").into_iter().map(|g| (g.config.name, g.stage)).collect();
    let expected = [("vllm", 1), ("sglang", 1), ("vllm+a", 2), ("vllm+b", 2), ("vllm+c", 2)];
    assert_eq!(groups, expected.map(|(n, s)| (n.to_owned(), s)));
    let jobs = f.store.jobs(run_id).expect("jobs");
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), (0..5).collect::<Vec<_>>());
}

const SEARCH: &str = "\
name: search
model: m
hardware: { gpu: H200 }
engines:
  vllm: { runtime: process }
profiles:
  cap:
    dataset: { random: { input_tokens: 4, output_tokens: 2 } }
    requests: 2
    search: { rate: [1, 32], steps: 2, slo: { ttft_p99_ms: 200 } }
";

/// A probe's summary, its P99 TTFT 20 ms per request per second of its
/// rate (200 ms at 10 req/s).
fn probe_summary(profile: &str) -> pb::Summary {
    let rate: f64 = profile.split_once("@r").expect("a probe").1.parse().expect("its rate");
    let ttft = pb::Distribution { p99: 20.0 * rate, count: 2, ..Default::default() };
    pb::Summary { successful: 2, ttft_ms: Some(ttft), ..Default::default() }
}

#[tokio::test]
async fn a_search_is_scheduled_round_by_round_and_a_restarted_controller_goes_on() {
    let f = controller().await;
    let mut a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let run_id: benchfleet_study::model::RunId =
        submit_matrix(&f.url, "search.yaml", SEARCH).await.parse().expect("run id");

    // The bounds, then a midpoint a round: each round appears only when the
    // one before has ended.
    let (shown, groups) = next_stage(&mut a, 1).await;
    assert_eq!(shown, ["vllm on cap@r1,cap@r32"]);
    run_jobs(&f.url, &a, &groups[0], probe_summary).await;
    let (shown, _) = next_stage(&mut a, 1).await;
    assert_eq!(shown, ["vllm on cap@r16.5"]);

    // The controller stops with the second round done and nothing planned:
    // the next one starts from the store.
    drop(a);
    for mut job in f.store.jobs(run_id).expect("jobs").into_iter().filter(|j| j.profile.name == "cap@r16.5") {
        let mut summary = benchfleet_core::Summary { successful: 2, ..Default::default() };
        summary.ttft_ms.p99 = 330.0;
        job.state = benchfleet_study::model::JobState::Succeeded;
        f.store
            .commit_records(&benchfleet_controller::store::RecordCommit {
                summaries: vec![(job.key(), summary)],
                ..Default::default()
            })
            .expect("summary");
        f.store.apply(&[benchfleet_controller::records::Write::Job(job)]).expect("put");
    }
    Controller::start(f.store.clone(), ControllerConfig::new(f.url.clone())).expect("restart");
    let probes: Vec<String> = f.store.jobs(run_id).expect("jobs").into_iter().map(|j| j.profile.name).collect();
    assert_eq!(probes, ["cap@r1", "cap@r32", "cap@r16.5", "cap@r8.75"]);
    let doc = benchfleet_controller::report::document(f.store.as_ref(), run_id, &|_, _| {}).expect("report");
    let result = &doc.searches[0].results[0];
    assert_eq!((result.done, result.capacity.as_str()), (false, "searching"), "one probe still to run");
}

#[tokio::test]
async fn the_controller_serves_health_reflection_and_metrics() {
    let f = controller().await;
    let _a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    submit(&f.url).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&f.url).await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: "benchfleet.v1.AgentService".into() })
        .await
        .expect("health")
        .into_inner()
        .status;
    assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    // Reflection lists the services, for grpcurl.
    use tonic_reflection::pb::v1 as r;
    let mut reflection = r::server_reflection_client::ServerReflectionClient::new(channel(&f.url).await);
    let ask = r::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(r::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut answers =
        reflection.server_reflection_info(tokio_stream::iter([ask])).await.expect("reflection").into_inner();
    let listed = match answers.next().await.expect("an answer").expect("ok").message_response {
        Some(r::server_reflection_response::MessageResponse::ListServicesResponse(l)) => l.service,
        other => panic!("{other:?}"),
    };
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    for service in ["benchfleet.v1.AgentService", "benchfleet.v1.IngestService", "benchfleet.v1.OperatorService"] {
        assert!(names.contains(&service), "{names:?}");
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(benchfleet_controller::metrics::serve(f.controller.clone(), listener, std::future::pending()));
    let text = http_get(addr, "/metrics").await;
    for line in [
        "benchfleet_agents{state=\"ready\"} 1",
        "benchfleet_jobs{state=\"assigned\"} 1",
        "benchfleet_jobs{state=\"pending\"} 3",
        "benchfleet_queue_groups 3",
        "benchfleet_runs_in_progress 1",
        "benchfleet_ingested_records_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
    }
    assert!(text.contains("benchfleet_record_commit_seconds_bucket"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("benchfleet_store_bytes ") && !l.ends_with(" 0")), "{text}");
}

/// A plain HTTP/1.0 GET; the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let (head, body) = out.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

#[tokio::test]
async fn files_are_uploaded_in_chunks_checked_and_fetched_by_hash() {
    use sha2::Digest as _;
    let f = controller().await;
    // 5 MiB and a bit: several chunks, and more than one message may carry.
    let content: Vec<u8> = (0..(5 << 20) + 12345).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let sha: String = sha2::Sha256::digest(&content).iter().map(|b| format!("{b:02x}")).collect();
    let mut op = pb::operator_service_client::OperatorServiceClient::new(channel(&f.url).await);
    let missing =
        op.missing_files(pb::MissingFilesRequest { sha256: vec![sha.clone()] }).await.expect("ask").into_inner();
    assert_eq!(missing.sha256, std::slice::from_ref(&sha));
    let chunks = |sha: &str| {
        content
            .chunks(1 << 20)
            .enumerate()
            .map(|(i, data)| pb::FileChunk {
                sha256: if i == 0 { sha.to_owned() } else { String::new() },
                size: if i == 0 { content.len() as u64 } else { 0 },
                name: "data.json".into(),
                data: data.to_vec(),
            })
            .collect::<Vec<_>>()
    };
    // A wrong hash is refused, naming the right one, and nothing is stored.
    let wrong = op.upload_file(tokio_stream::iter(chunks(&"ab".repeat(32)))).await.expect_err("refused");
    assert!(wrong.message().contains(&sha), "{}", wrong.message());
    let missing =
        op.missing_files(pb::MissingFilesRequest { sha256: vec!["ab".repeat(32)] }).await.expect("ask").into_inner();
    assert_eq!(missing.sha256.len(), 1);
    let stored = op.upload_file(tokio_stream::iter(chunks(&sha))).await.expect("stored").into_inner();
    assert_eq!((stored.sha256.as_str(), stored.size), (sha.as_str(), content.len() as u64));
    assert!(
        op.missing_files(pb::MissingFilesRequest { sha256: vec![sha.clone()] })
            .await
            .expect("ask")
            .into_inner()
            .sha256
            .is_empty()
    );

    let mut agent = pb::agent_service_client::AgentServiceClient::new(channel(&f.url).await);
    let mut stream = agent.fetch_file(pb::FetchFileRequest { sha256: sha.clone() }).await.expect("fetch").into_inner();
    let mut back = Vec::new();
    let mut pieces = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        assert!(chunk.data.len() <= 1 << 20);
        back.extend_from_slice(&chunk.data);
        pieces += 1;
    }
    assert!(pieces > 5);
    assert!(back == content, "the file comes back whole");
    let unknown = agent.fetch_file(pb::FetchFileRequest { sha256: "cd".repeat(32) }).await.expect_err("unknown");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // A submission naming a file never uploaded stores nothing.
    let yaml = MATRIX
        .replace("dataset: { random: { input_tokens: 4, output_tokens: 2 } }", "dataset: { sharegpt: data.json }");
    let refused = op
        .submit_run(pb::SubmitRunRequest {
            matrix_name: "m.yaml".into(),
            matrix_yaml: yaml,
            files: [("data.json".to_owned(), "ef".repeat(32))].into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert!(refused.message().contains("was not uploaded"), "{}", refused.message());
    assert!(f.store.runs().expect("runs").is_empty());
}

/// A repeat's records: TTFTs and token gaps that differ by request and by
/// repeat, so that pooling them differs from averaging their percentiles.
fn repeat_records(repeat: u64) -> Vec<benchfleet_core::RequestRecord> {
    (0..60)
        .map(|i: i64| {
            let ms = 1_000_000;
            let sent = i * 40 * ms;
            let first = sent + (5 + (i * 37 + repeat as i64 * 101) % 300) * ms;
            let gap = (2 + (i + repeat as i64 * 3) % 17) * ms;
            let chunks: benchfleet_core::Chunks =
                (0..12).map(|k| benchfleet_core::Chunk { at_ns: first + k * gap, tokens: 1 }).collect();
            benchfleet_core::RequestRecord {
                seq: i as u64,
                scheduled_ns: sent,
                sent_ns: sent,
                slot_ns: None,
                connect_ns: None,
                first_token_ns: Some(first),
                completed_ns: first + 11 * gap,
                chunks,
                prompt_tokens: 16,
                output_tokens: 12,
                outcome: benchfleet_core::Outcome::Ok,
                http_status: Some(200),
                error: None,
                phase: benchfleet_core::Phase::Measured,
                turn: None,
            }
        })
        .collect()
}

#[tokio::test]
async fn repeats_are_pooled_from_the_digests_of_their_stored_records() {
    let f = controller().await;
    let mut a = agent(&f.url, vec![gpu(0, "NVIDIA H200")]).await;
    let yaml = "\
name: repeats
model: m
hardware: { gpu: H200, gpus_per_job: 1 }
repeats: 3
engines:
  vllm: { runtime: process }
profiles:
  p: { dataset: { random: { input_tokens: 16, output_tokens: 12 } }, requests: 60 }
";
    let run: benchfleet_study::model::RunId =
        submit_matrix(&f.url, "repeats.yaml", yaml).await.parse().expect("run id");
    let group = a.next().await;
    assert_eq!(group.jobs.len(), 3);
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(&f.url).await);
    let mut all = Vec::new();
    let mut keys = Vec::new();
    for (r, job) in group.jobs.iter().enumerate() {
        let attempt = job.attempt.clone().expect("attempt");
        let records = repeat_records(r as u64);
        let summary = benchfleet_core::summarize(&records, None);
        let batches: Vec<pb::RecordBatch> = records
            .chunks(25)
            .enumerate()
            .map(|(b, rs)| pb::RecordBatch {
                attempt: Some(attempt.clone()),
                batch: b as u64,
                records: rs.iter().map(pb::RequestRecord::from).collect(),
                summary: (b == 2).then(|| pb::Summary::from(&summary)),
                sent: 60,
            })
            .collect();
        let mut acks = ingest.records(tokio_stream::iter(batches)).await.expect("stream").into_inner();
        for _ in 0..3 {
            acks.next().await.expect("a reply").expect("ack");
        }
        a.send(pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
            attempt: Some(attempt.clone()),
            state: pb::JobState::Succeeded as i32,
            ..Default::default()
        }))
        .await;
        keys.push(benchfleet_study::model::AttemptKey { run, job: attempt.job, attempt: attempt.attempt });
        all.extend(records);
    }
    a.done(&group).await;

    // The last group's end finishes the run, in the batch that handles it.
    a.nothing_more().await;
    assert!(f.store.run(run).expect("read").expect("run").is_over(), "the run never finished");

    // Each attempt's digest is built from its stored records and stored, by
    // the digest thread, in its own time: polled for, with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !keys.iter().all(|k| f.store.has_digest(k).expect("read")) {
        assert!(std::time::Instant::now() < deadline, "the digests were never stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (r, k) in keys.iter().enumerate() {
        let stored = f.store.digest(k).expect("read").expect("stored");
        assert_eq!(stored, benchfleet_core::Digest::of(&repeat_records(r as u64)), "repeat {r}");
    }

    // The block is that of the union of the three repeats' samples.
    let union = benchfleet_core::summarize(&all, None);
    let report = benchfleet_controller::report::render(f.store.as_ref(), run).expect("report").text;
    assert!(report.contains("(3 repeats pooled)"), "{report}");
    for line in [
        format!("Successful requests:                     {}", 180),
        format!("Median TTFT (ms):                        {:.2}", union.ttft_ms.median),
        format!("P99 TTFT (ms):                           {:.2}", union.ttft_ms.p99),
        format!("P99 ITL (ms):                            {:.2}", union.itl_ms.p99),
    ] {
        assert!(report.contains(&line), "{line} not in\n{report}");
    }
    // Each headline number's interval comes from the repeats' own values.
    let tps: Vec<f64> =
        (0..3).map(|r| benchfleet_core::summarize(&repeat_records(r), None).total_token_throughput).collect();
    let e = benchfleet_core::stats::Estimate::of(&tps);
    let line =
        format!("  Total token throughput (tok/s):    {:.2} ± {:.2}", e.mean, e.half_width.expect("three repeats"));
    assert!(
        report.contains("95% confidence intervals of the 3 repeats' own values (Student's t, 2 degrees of freedom):")
    );
    assert!(report.contains(&line), "{line} not in\n{report}");
    // The mean of the repeats' P99s is not what is shown.
    let repeats: Vec<_> = (0..3).map(|r| benchfleet_core::summarize(&repeat_records(r), None)).collect();
    let mean_p99 = repeats.iter().map(|s| s.ttft_ms.p99).sum::<f64>() / 3.0;
    assert!((mean_p99 - union.ttft_ms.p99).abs() > 0.01, "the test data must tell the two apart");
    f.controller.stop().await;
}
