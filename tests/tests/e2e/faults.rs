//! The control plane on an operator's worst day, with the real binaries:
//! `benchfleet-controller` and `benchfleet-agent` processes (simulated GPUs,
//! `benchfleet-sim` engines, `benchfleet-loadgen`), gRPC on loopback, sled
//! on disk. Agents are killed, hung, cut off, cloned and told to leave; the
//! controller is killed and stopped; runs are cancelled, drained and fail.
//! After each, what the store holds is checked: every job ended once, and
//! only its final attempt's records are kept, all of them.
//!
//! Leases are short here (heartbeat 200 ms, lost after 2 s) so that the
//! tests are quick; nothing waits on a sleep to order events: every wait
//! polls for what it expects, with a deadline.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use benchfleet_cli::client;
use benchfleet_controller::{SledStore, Store};
use benchfleet_proto as pb;
use benchfleet_study::model::{AttemptKey, RunId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub(crate) fn bin(name: &str) -> PathBuf {
    benchfleet_agent::find_binary(name).unwrap_or_else(|| {
        panic!(
            "{name} is not built; these tests run after `cargo build --workspace` (cargo test --workspace builds it)"
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A child process, killed when dropped (a test that fails leaves nothing).
pub(crate) struct Proc {
    child: Child,
    log: PathBuf,
    /// An agent's pid files: what a killed agent left running is stopped with it.
    pids: Option<PathBuf>,
}

impl Proc {
    fn spawn(program: &Path, args: &[String], log: PathBuf) -> Proc {
        Proc::spawn_with(program, args, &[], log)
    }

    /// The same with `env` set.
    pub(crate) fn spawn_with(program: &Path, args: &[String], env: &[(&str, &Path)], log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info,benchfleet_agent=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        Proc { child, log, pids: None }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn signal(&self, signal: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid() as i32) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit by itself.
    pub(crate) async fn exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} did not exit within {within:?}; its log:\n{}",
                self.log.display(),
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Agents first get the chance to stop their engines.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(rustix::process::Signal::CONT);
            self.signal(rustix::process::Signal::TERM);
            self.signal(rustix::process::Signal::TERM);
            for _ in 0..100 {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.kill9();
        // A killed agent's engines and loadgen outlive it until an agent restarts in its work
        // directory; none will once the test is over.
        let Some(dir) = &self.pids else { return };
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let mut words = text.split_whitespace().map(|w| w.parse::<u64>().ok());
            if let (Some(Some(pid)), Some(Some(started))) = (words.next(), words.next())
                && benchfleet_agent::procs::start_time(pid as u32) == Some(started)
                && let Some(group) = rustix::process::Pid::from_raw(pid as i32)
            {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A controller process with short leases, and its data directory.
pub(crate) struct Controller {
    proc: Proc,
    port: u16,
    dir: PathBuf,
}

impl Controller {
    pub(crate) fn start(dir: &Path) -> Controller {
        Controller::start_on(dir, free_port())
    }

    pub(crate) fn start_on(dir: &Path, port: u16) -> Controller {
        let args: Vec<String> = [
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            &dir.join("controller").display().to_string(),
            "--heartbeat-interval-ms",
            "200",
            "--suspect-after-ms",
            "600",
            "--lease-ttl-ms",
            "2000",
            "--restart-grace-ms",
            "3000",
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        .map(String::from)
        .to_vec();
        let n = std::fs::read_dir(dir).map_or(0, |d| d.count());
        let proc = Proc::spawn(&bin("benchfleet-controller"), &args, dir.join(format!("controller-{n}.log")));
        Controller { proc, port, dir: dir.to_path_buf() }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL: no shutdown, no last flush.
    pub(crate) fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// Stops it (SIGTERM) and opens its store.
    pub(crate) async fn stop_and_open(mut self) -> SledStore {
        self.proc.signal(rustix::process::Signal::TERM);
        let status = self.proc.exit(Duration::from_secs(15)).await;
        assert!(status.success(), "the controller exits 0 on SIGTERM: {status}");
        SledStore::open(&self.dir.join("controller/store")).expect("the store opens once the controller is gone")
    }
}

/// An agent process with simulated GPUs (one H200 unless `extra` names
/// `--sim-gpus`) and engines.
pub(crate) fn agent(dir: &Path, name: &str, controller: &str, extra: &[&str]) -> Proc {
    let work = dir.join(format!("agent-{name}"));
    let mut args: Vec<String> = [
        "--controller",
        controller,
        "--name",
        name,
        "--sim-engines",
        "--docker",
        "off",
        "--work-dir",
        &work.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    if !extra.contains(&"--sim-gpus") {
        args.extend(["--sim-gpus".to_owned(), "H200x1".to_owned()]);
    }
    // Agents on one host: each its own engine ports, or two engines started
    // at once may both find a port free and one answer the other's health
    // checks.
    static NEXT_PORTS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let first = 20000 + 40 * (NEXT_PORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 240);
    args.extend(["--engine-ports".to_owned(), format!("{first}-{}", first + 39)]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let n = std::fs::read_dir(dir).map_or(0, |d| d.count());
    let mut agent = Proc::spawn(&bin("benchfleet-agent"), &args, dir.join(format!("agent-{name}-{n}.log")));
    agent.pids = Some(work.join("pids"));
    agent
}

/// A matrix of `groups` configurations of one simulated vLLM, one profile
/// of `requests` at `rate` requests/s.
fn matrix(dir: &Path, groups: usize, requests: u32, rate: u32, engine_args: &str) -> PathBuf {
    let variants: String = (1..groups).map(|i| format!("  v{i}: {{ args: [--max-num-seqs={}] }}\n", 64 + i)).collect();
    let yaml = format!(
        "name: faults
model: Qwen/Qwen3.5-9B
hardware: {{ gpu: H200, gpus_per_job: 1 }}
engines:
  vllm: {{ runtime: process, args: [--max-model-len=4096{engine_args}] }}
{}profiles:
  load:
    dataset: {{ random: {{ input_tokens: 64, output_tokens: 32, seed: 1 }} }}
    rate: {rate}
    requests: {requests}
",
        if variants.is_empty() { String::new() } else { format!("variants:\n{variants}") }
    );
    let path = dir.join(format!("faults-{groups}-{requests}.yaml"));
    std::fs::write(&path, yaml).expect("the matrix is written");
    path
}

async fn operator(url: &str) -> client::OperatorClient {
    for _ in 0..200 {
        if let Ok(c) = client::connect(url).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the controller at {url} never answered")
}

pub(crate) async fn submit(url: &str, matrix: &Path) -> pb::SubmitRunResponse {
    let mut c = operator(url).await;
    client::submit(&mut c, client::submission(matrix, None).expect("a valid matrix")).await.expect("submitted")
}

async fn jobs(url: &str, run: &str) -> Vec<pb::JobInfo> {
    let mut c = operator(url).await;
    c.list_jobs(pb::ListJobsRequest { run_id: run.to_owned() }).await.expect("jobs").into_inner().jobs
}

async fn agents(url: &str) -> Vec<pb::AgentInfo> {
    let mut c = operator(url).await;
    c.list_agents(pb::ListAgentsRequest {}).await.expect("agents").into_inner().agents
}

/// Polls `check` until it gives a value, for at most `within`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every named agent holds a ready lease.
pub(crate) async fn ready(url: &str, names: &[&str]) {
    eventually(Duration::from_secs(30), &format!("{names:?} ready"), || async {
        let listed = agents(url).await;
        names.iter().all(|n| listed.iter().any(|a| a.name == *n && a.state == "ready")).then_some(())
    })
    .await;
}

/// Waits until some job of the run is running on `agent`; returns it.
async fn running_on(url: &str, run: &str, agent: &str) -> pb::JobInfo {
    eventually(Duration::from_secs(60), &format!("a job running on {agent}"), || async {
        jobs(url, run).await.into_iter().find(|j| {
            j.state == "running" && j.attempts.last().is_some_and(|a| a.agent_name == agent && a.records_stored > 0)
        })
    })
    .await
}

pub(crate) async fn finished(url: &str, run: &str) -> pb::RunInfo {
    let last = tokio::time::timeout(Duration::from_secs(120), client::watch(url, run, Duration::from_secs(30), |_| {}))
        .await
        .expect("the run ends within two minutes")
        .expect("the run can be watched");
    last.run.expect("run info")
}

/// The process groups an agent's pid files name: (name, pid).
fn pid_files(dir: &Path, agent: &str) -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir(dir.join(format!("agent-{agent}/pids"))) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let pid = text.split_whitespace().next()?.parse().ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), pid))
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    benchfleet_agent::procs::start_time(pid).is_some()
}

async fn gone(pids: &[u32], what: &str) {
    eventually(Duration::from_secs(20), what, || async { pids.iter().all(|p| !alive(*p)).then_some(()) }).await;
}

/// What the store holds after a run: every job succeeded, and only its final
/// attempt has records, exactly `requests` of them, each once.
fn check_records(store: &SledStore, run: &str, requests: u64) {
    let run: RunId = run.parse().expect("run id");
    let stats = store.attempt_stats(run).expect("stats");
    for job in store.jobs(run).expect("jobs") {
        assert_eq!(job.state, benchfleet_study::model::JobState::Succeeded, "{job:?}");
        for a in 1..=job.attempt {
            let key = AttemptKey { run, job: job.id, attempt: a };
            let mut seqs: Vec<u64> = store.records(&key).map(|r| r.expect("decodes").seq).collect();
            seqs.sort_unstable();
            if a == job.attempt {
                assert_eq!(seqs, (0..requests).collect::<Vec<_>>(), "the final attempt {key} has every record once");
                assert_eq!(stats.get(&key).map(|s| (s.records, s.sent)), Some((requests, requests)), "{key}");
            } else {
                assert!(seqs.is_empty(), "{key} was superseded but kept {} records", seqs.len());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_job_is_replaced_and_leaves_nothing_counted_or_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let mut a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 1, 200, 40, "")).await.run_id;
    let victim = running_on(&c.url(), &run, "a1").await;
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    let orphans: Vec<u32> = pid_files(dir.path(), "a1").into_iter().map(|(_, p)| p).collect();
    assert_eq!(orphans.len(), 2, "an engine and a loadgen run: {orphans:?}");
    a1.kill9();

    let done = finished(&c.url(), &run).await;
    assert_eq!((done.state.as_str(), done.jobs_succeeded), ("finished", 1));
    let job = jobs(&c.url(), &run).await.into_iter().find(|j| j.job == victim.job).expect("the job");
    let [first, last] = job.attempts.as_slice() else { panic!("two attempts: {job:?}") };
    assert_eq!((first.agent_name.as_str(), first.outcome.as_str()), ("a1", "abandoned"));
    assert!(first.reason.contains("lost its lease"), "{first:?}");
    assert!(first.records_removed && first.requests_sent > 0, "{first:?}");
    assert_eq!((last.agent_name.as_str(), last.outcome.as_str(), last.records_stored), ("a2", "succeeded", 200));
    // The killed agent's loadgen is refused and stops by itself; its engine
    // is stopped by the agent's next start, before it takes work.
    let loadgen: Vec<u32> =
        pid_files(dir.path(), "a1").into_iter().filter(|(n, _)| n.starts_with("loadgen")).map(|(_, p)| p).collect();
    gone(&loadgen, "the abandoned attempt's loadgen stops").await;
    let _a1 = agent(dir.path(), "a1", &c.url(), &[]);
    gone(&orphans, "what the killed agent left is stopped when it starts again").await;
    check_records(&c.stop_and_open().await, &run, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_controller_comes_back_and_the_running_attempts_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Controller::start(dir.path());
    let port = c.port;
    let _a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 1, 240, 40, "")).await.run_id;
    let url = c.url();
    // The operator's watch goes on across the restart.
    let watching = tokio::spawn({
        let (url, run) = (url.clone(), run.clone());
        async move { client::watch(&url, &run, Duration::from_secs(60), |_| {}).await }
    });
    running_on(&url, &run, "a1").await;
    c.proc.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = Controller::start_on(dir.path(), port);
    let last = tokio::time::timeout(Duration::from_secs(120), watching)
        .await
        .expect("in time")
        .expect("task")
        .expect("watched");
    assert_eq!(last.run.map(|r| (r.state, r.jobs_succeeded)), Some(("finished".to_owned(), 1)));
    let all = jobs(&url, &run).await;
    assert!(all.iter().all(|j| j.attempts.len() == 1), "no attempt was thrown away: {all:?}");
    check_records(&c.stop_and_open().await, &run, 240);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_loses_its_lease_and_stops_its_work_when_it_wakes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 1, 200, 40, "")).await.run_id;
    running_on(&c.url(), &run, "a1").await;
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    ready(&c.url(), &["a2"]).await;
    let engines: Vec<u32> = pid_files(dir.path(), "a1").into_iter().map(|(_, p)| p).collect();
    a1.signal(rustix::process::Signal::STOP);
    eventually(Duration::from_secs(20), "the hung agent is lost and its job runs on a2", || async {
        let j = jobs(&c.url(), &run).await;
        j.iter().any(|j| j.attempts.last().is_some_and(|a| a.agent_name == "a2")).then_some(())
    })
    .await;
    a1.signal(rustix::process::Signal::CONT);
    // Awake, it finds its lease gone and stops what it ran.
    gone(&engines, "the woken agent stops its engine and loadgen").await;
    let done = finished(&c.url(), &run).await;
    assert_eq!(done.jobs_succeeded, 1);
    ready(&c.url(), &["a1"]).await;
    check_records(&c.stop_and_open().await, &run, 200);
}

/// A TCP proxy that can be made a black hole: connections stay open, no
/// byte gets through, as in a network partition.
struct Blackhole {
    port: u16,
    closed: Arc<AtomicBool>,
}

impl Blackhole {
    async fn start(to: u16) -> Blackhole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let closed = Arc::new(AtomicBool::new(false));
        let shut = closed.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { continue };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::spawn(pump(ri, wo, shut.clone()));
                tokio::spawn(pump(ro, wi, shut.clone()));
            }
        });
        Blackhole { port, closed }
    }

    fn set(&self, black: bool) {
        self.closed.store(black, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    black: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 64 << 10];
    loop {
        while black.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                // Bytes read just as the hole opened are held, not sent.
                while black.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_by_the_network_stops_its_work_and_the_job_runs_elsewhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let hole = Blackhole::start(c.port).await;
    let _a1 = agent(dir.path(), "a1", &format!("http://127.0.0.1:{}", hole.port), &[]);
    // a1's loadgen reports straight to the controller; only the agent's
    // session is cut off.
    let run = submit(&c.url(), &matrix(dir.path(), 1, 300, 40, "")).await.run_id;
    running_on(&c.url(), &run, "a1").await;
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    ready(&c.url(), &["a2"]).await;
    let engines: Vec<u32> = pid_files(dir.path(), "a1").into_iter().map(|(_, p)| p).collect();
    hole.set(true);
    // The agent notices on its own (no acknowledgement within its lease)
    // and stops its engine, with its connection still open.
    gone(&engines, "the cut-off agent stops its engine and loadgen").await;
    let done = finished(&c.url(), &run).await;
    assert_eq!(done.jobs_succeeded, 1);
    let job = &jobs(&c.url(), &run).await[0];
    assert_eq!(job.attempts.len(), 2, "{job:?}");
    assert_eq!(job.attempts[1].agent_name, "a2");
    hole.set(false);
    ready(&c.url(), &["a1"]).await;
    check_records(&c.stop_and_open().await, &run, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_with_the_same_name_is_refused_and_the_run_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let _a1 = agent(dir.path(), "gpu-01", &c.url(), &[]);
    ready(&c.url(), &["gpu-01"]).await;
    let clone_dir = dir.path().join("clone");
    std::fs::create_dir_all(&clone_dir).expect("dir");
    let clone = agent(&clone_dir, "gpu-01", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 2, 60, 40, "")).await.run_id;
    let done = finished(&c.url(), &run).await;
    assert_eq!((done.state.as_str(), done.jobs_succeeded), ("finished", 2));
    let listed = agents(&c.url()).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let log = clone.text();
    assert!(log.contains("another agent already holds the name 'gpu-01' (agent-1"), "the clone says why: {log}");
    let all = jobs(&c.url(), &run).await;
    assert!(all.iter().all(|j| j.attempts.len() == 1), "the clone took no session: {all:?}");
    drop(clone);
    check_records(&c.stop_and_open().await, &run, 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_agent_finish_its_group_and_leave() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let mut a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 2, 120, 40, "")).await.run_id;
    let first = running_on(&c.url(), &run, "a1").await;
    a1.signal(rustix::process::Signal::TERM);
    let status = a1.exit(Duration::from_secs(60)).await;
    assert!(status.success(), "the agent exits 0 after leaving: {status}\n{}", a1.text());
    assert!(pid_files(dir.path(), "a1").is_empty(), "nothing left running");
    let all = jobs(&c.url(), &run).await;
    let finished_first = all.iter().find(|j| j.job == first.job).expect("the job");
    assert_eq!((finished_first.state.as_str(), finished_first.attempts.len()), ("succeeded", 1), "{finished_first:?}");
    let other = all.iter().find(|j| j.job != first.job).expect("the other job");
    assert_eq!(other.state, "pending", "the leaving agent took no new work: {other:?}");
    // Another agent finishes the run.
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    assert_eq!(finished(&c.url(), &run).await.jobs_succeeded, 2);
    check_records(&c.stop_and_open().await, &run, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_past_its_leave_grace_gives_up_and_the_job_runs_elsewhere_uncounted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let mut a1 = agent(dir.path(), "a1", &c.url(), &["--leave-grace-s", "0"]);
    let run = submit(&c.url(), &matrix(dir.path(), 1, 200, 40, "")).await.run_id;
    running_on(&c.url(), &run, "a1").await;
    a1.signal(rustix::process::Signal::TERM);
    assert!(a1.exit(Duration::from_secs(30)).await.success(), "{}", a1.text());
    assert!(pid_files(dir.path(), "a1").is_empty(), "its engine and loadgen were stopped");
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    assert_eq!(finished(&c.url(), &run).await.jobs_succeeded, 1);
    let job = &jobs(&c.url(), &run).await[0];
    assert_eq!(job.attempts[0].outcome, "failed", "{job:?}");
    assert!(job.attempts[0].reason.contains("the agent shut down"), "{job:?}");
    check_records(&c.stop_and_open().await, &run, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_controller_with_agents_connected_in_bounded_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Controller::start(dir.path());
    let port = c.port;
    let _a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 1, 200, 40, "")).await.run_id;
    running_on(&c.url(), &run, "a1").await;
    let began = std::time::Instant::now();
    c.proc.signal(rustix::process::Signal::TERM);
    let status = c.proc.exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}");
    eprintln!("the controller stopped in {:?}", began.elapsed());
    let c = Controller::start_on(dir.path(), port);
    let done = finished(&c.url(), &run).await;
    assert_eq!(done.jobs_succeeded, 1);
    check_records(&c.stop_and_open().await, &run, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_fails_everywhere_fails_for_good_naming_the_hosts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let names = ["a1", "a2", "a3"];
    let _agents: Vec<Proc> = names.iter().map(|n| agent(dir.path(), n, &c.url(), &[])).collect();
    ready(&c.url(), &names).await;
    // Far too little GPU memory for the model's weights: out of memory.
    let run = submit(&c.url(), &matrix(dir.path(), 1, 10, 10, ", --gpu-memory-utilization=0.05")).await.run_id;
    let done = finished(&c.url(), &run).await;
    assert_eq!((done.state.as_str(), done.jobs_failed), ("finished with failures", 1));
    let job = &jobs(&c.url(), &run).await[0];
    assert!(job.error.starts_with("failed on 3 hosts: engine did not start: the engine ran out of memory"), "{job:?}");
    let mut hosts: Vec<&str> = job.attempts.iter().map(|a| a.agent_name.as_str()).collect();
    hosts.sort_unstable();
    assert_eq!(hosts, names);
    // An operator's retry runs it again, with a fresh cap.
    let mut op = operator(&c.url()).await;
    let retried = op.retry_run(pb::RetryRunRequest { run_id: run.clone() }).await.expect("retry").into_inner();
    assert_eq!(retried.jobs, 1);
    let again = finished(&c.url(), &run).await;
    assert_eq!(again.jobs_failed, 1);
    assert_eq!(jobs(&c.url(), &run).await[0].attempts.len(), 6);
    let refused = op.retry_run(pb::RetryRunRequest { run_id: "99".into() }).await.expect_err("no such run");
    assert!(refused.message().contains("run 99 does not exist"), "{}", refused.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_no_agent_can_take_says_why_and_can_be_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let _a1 = agent(dir.path(), "a1", &c.url(), &[]);
    ready(&c.url(), &["a1"]).await;
    let path = matrix(dir.path(), 1, 10, 10, "");
    std::fs::write(
        &path,
        std::fs::read_to_string(&path).expect("matrix").replace("gpu: H200", "gpu: A100, allow_other_gpus: true"),
    )
    .expect("write");
    let submitted = submit(&c.url(), &path).await;
    assert_eq!(submitted.warnings, ["no agent has an A100"]);
    let mut c1 = operator(&c.url()).await;
    let mut stream =
        c1.watch_run(pb::WatchRunRequest { run_id: submitted.run_id.clone() }).await.expect("watch").into_inner();
    use tokio_stream::StreamExt as _;
    let first = stream.next().await.expect("progress").expect("ok");
    assert_eq!(first.waiting, ["no agent has an A100"]);
    let cancelled = c1
        .cancel_run(pb::CancelRunRequest {
            run_id: submitted.run_id.clone(),
            reason: "wrong GPU".into(),
            by: "ops".into(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!((cancelled.state.as_str(), cancelled.jobs_cancelled), ("cancelled", 1));
    assert_eq!(cancelled.note, "by ops: wrong GPU");
    let last = finished(&c.url(), &submitted.run_id).await;
    assert_eq!(last.state, "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_running_engines_and_drain_sends_new_work_elsewhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Controller::start(dir.path());
    let _a1 = agent(dir.path(), "a1", &c.url(), &[]);
    let run = submit(&c.url(), &matrix(dir.path(), 2, 400, 40, "")).await.run_id;
    running_on(&c.url(), &run, "a1").await;
    let mut op = operator(&c.url()).await;
    let drained = op
        .drain_agent(pb::DrainAgentRequest { agent: "a1".into(), reason: "maintenance".into(), by: "ops".into() })
        .await
        .expect("drain")
        .into_inner();
    assert!(drained.drained && drained.drain_note == "by ops: maintenance", "{drained:?}");
    let _a2 = agent(dir.path(), "a2", &c.url(), &[]);
    // The second group goes to a2, not to the drained a1.
    running_on(&c.url(), &run, "a2").await;
    let engines: Vec<u32> = ["a1", "a2"].iter().flat_map(|a| pid_files(dir.path(), a)).map(|(_, p)| p).collect();
    assert_eq!(engines.len(), 4, "two engines and two loadgens run");
    op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), reason: String::new(), by: "ops".into() })
        .await
        .expect("cancel");
    gone(&engines, "a cancelled run's engines and loadgen are stopped").await;
    let all = jobs(&c.url(), &run).await;
    assert!(all.iter().all(|j| j.state == "cancelled"), "{all:?}");
    let listed = agents(&c.url()).await;
    assert!(listed.iter().all(|a| a.running.is_empty()), "the GPUs are free again: {listed:?}");
}
