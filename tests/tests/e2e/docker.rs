//! The docker runtime against a real Docker daemon: a controller and an agent
//! whose engines run as containers of the simulator's image, as an operator's
//! would. CI starts the daemon and builds the image (`.ci/run`); without them
//! these tests fail and say what to start or build.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use benchfleet_agent::docker::{AGENT_LABEL, DockerArgs, DockerMode, DockerOptions, DockerRuntime, runtime_from_args};
use benchfleet_agent::engine::EngineRuntime;
use benchfleet_agent::gpu::SimGpuProbe;
use benchfleet_agent::{AgentConfig, Shutdown};
use benchfleet_cli::client;
use benchfleet_cli::local::LocalFleet;
use benchfleet_controller::{SledStore, Store};
use benchfleet_study::model::{AttemptKey, Job, JobState, RunId};
use bollard::Docker;
use bollard::query_parameters::{InspectContainerOptions, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};

/// The simulator's image, as `.ci/run` builds it.
const IMAGE: &str = "benchfleet-sim:dev";
const SOCKET: &str = "/var/run/docker.sock";
/// Every agent of these tests is named with this prefix, so leftovers of an
/// interrupted earlier run can be found.
const AGENT_PREFIX: &str = "e2e-docker-";

/// Container names come from run ids, which every test's fresh controller
/// numbers from 1: the tests take turns so their containers never share a name.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn options(dir: &Path) -> DockerOptions {
    DockerOptions {
        socket: PathBuf::from(SOCKET),
        model_cache: Some(dir.join("hf-cache")),
        stop_grace: Duration::from_secs(5),
        ..DockerOptions::default()
    }
}

/// Connects to the daemon, checks the image is there, and removes what an
/// interrupted earlier run of these tests left.
async fn docker(dir: &Path) -> DockerRuntime {
    let runtime = DockerRuntime::connect(options(dir)).await.unwrap_or_else(|e| {
        panic!("these tests need a Docker daemon ({e}); start one: dockerd --bridge=none --iptables=false &")
    });
    if let Err(e) = runtime.client().inspect_image(IMAGE).await {
        panic!("the image {IMAGE} is missing ({e}); build it with deploy/build-sim-image.sh --debug {IMAGE}");
    }
    for (name, agent) in containers(runtime.client(), None).await {
        if agent.starts_with(AGENT_PREFIX) {
            let options = RemoveContainerOptionsBuilder::new().force(true).build();
            let _ = runtime.client().remove_container(&name, Some(options)).await;
        }
    }
    runtime
}

/// The benchfleet containers (name, agent), of one agent or of all.
async fn containers(docker: &Docker, agent: Option<&str>) -> Vec<(String, String)> {
    let label = agent.map_or_else(|| AGENT_LABEL.to_owned(), |a| format!("{AGENT_LABEL}={a}"));
    let filters = HashMap::from([("label", vec![label])]);
    let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let list = docker.list_containers(Some(options)).await.expect("the daemon lists containers");
    list.into_iter()
        .map(|c| {
            let name = c.names.into_iter().flatten().next().unwrap_or_default();
            let agent = c.labels.and_then(|mut l| l.remove(AGENT_LABEL)).unwrap_or_default();
            (name.trim_start_matches('/').to_owned(), agent)
        })
        .collect()
}

/// Waits until `agent` has no container left: the engine is removed after
/// the last profile (just after its job is reported, so not at once).
async fn assert_no_containers(docker: &Docker, agent: &str) {
    for _ in 0..100 {
        if containers(docker, Some(agent)).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("containers of {agent} were left: {:?}", containers(docker, Some(agent)).await);
}

/// An agent with only the docker runtime and the in-process loadgen.
fn agent(controller_url: String, name: &str, docker: DockerRuntime, work_dir: PathBuf) -> AgentConfig {
    agent_with(controller_url, name, "docker", Arc::new(docker), work_dir)
}

fn agent_with(
    controller_url: String,
    name: &str,
    runtime_name: &str,
    runtime: Arc<dyn EngineRuntime>,
    work_dir: PathBuf,
) -> AgentConfig {
    let runtimes: HashMap<String, Arc<dyn EngineRuntime>> = HashMap::from([(runtime_name.to_owned(), runtime)]);
    AgentConfig {
        controller_url,
        tls: Default::default(),
        name: name.to_owned(),
        gpus: Arc::new(SimGpuProbe::new("H200", 1, name)),
        runtimes,
        loadgen: Arc::new(crate::fleet::InProcessLoadgen),
        work_dir,
        startup_timeout: Duration::from_secs(30),
        gpu_check_interval: Duration::from_secs(60),
        leave_grace: Duration::from_secs(10),
        price: None,
    }
}

/// A matrix of one simulated vLLM engine in the image and one profile.
fn matrix(dir: &Path, args: &str, rate: u32, requests: u32) -> PathBuf {
    let yaml = format!(
        "name: docker
model: Qwen/Qwen3.5-9B
objective: total_token_throughput
hardware: {{ gpu: H200, gpus_per_job: 1 }}
repeats: 1
engines:
  vllm: {{ image: {IMAGE}, runtime: docker, args: [{args}] }}
profiles:
  random:
    dataset: {{ random: {{ input_tokens: 64, output_tokens: 16, seed: 42 }} }}
    rate: {rate}
    requests: {requests}
strategy: grid
"
    );
    let path = dir.join("docker.yaml");
    std::fs::write(&path, yaml).expect("the matrix is written");
    path
}

async fn submit(url: &str, matrix: &Path) -> RunId {
    let mut operator = client::connect(url).await.expect("the controller answers");
    let submission = client::submission(matrix, None).expect("the matrix is valid");
    let run = client::submit(&mut operator, submission).await.expect("the run is accepted");
    run.run_id.parse().expect("a run id")
}

/// Follows the run until it finishes; returns its one job.
async fn finished(url: &str, store: &dyn Store, run: RunId) -> Job {
    let run_id = run.to_string();
    let watch = client::watch(url, &run_id, Duration::from_secs(30), |_| {});
    tokio::time::timeout(Duration::from_secs(120), watch)
        .await
        .expect("the run finishes within two minutes")
        .expect("the run can be watched");
    let mut jobs = store.jobs(run).expect("the store reads");
    assert_eq!(jobs.len(), 1);
    jobs.remove(0)
}

/// Waits until the job's load runs and its engine container is up; returns
/// the container's name.
async fn running(store: &dyn Store, run: RunId, docker: &Docker, agent: &str) -> String {
    for _ in 0..600 {
        let job_running = store.jobs(run).expect("the store reads").iter().any(|j| j.state == JobState::Running);
        let up = containers(docker, Some(agent)).await;
        if job_running && let Some((name, _)) = up.into_iter().next() {
            return name;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the job never ran in a container");
}

async fn fleet(dir: &Path, name: &str, docker: DockerRuntime) -> (LocalFleet, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.join("store")).expect("a sled store"));
    let work_dir = dir.join("agent");
    let fleet = LocalFleet::start(store.clone(), |url| Ok(agent(url, name, docker, work_dir)))
        .await
        .expect("the controller and agent start");
    (fleet, store)
}

fn init_logs() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info").try_init();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_a_container_stores_all_its_records() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logs();
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = "e2e-docker-records";
    let docker = docker(dir.path()).await;
    let client = docker.client().clone();
    let (fleet, store) = fleet(dir.path(), name, docker).await;

    let run = submit(&fleet.url, &matrix(dir.path(), "--max-model-len=8192", 40, 20)).await;
    let job = finished(&fleet.url, store.as_ref(), run).await;
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert!(job.engine_startup_s.is_some_and(|s| s > 0.0), "the startup time is recorded: {job:?}");
    // An image built here has no repository digest: its id names it.
    assert!(job.image_digest.as_deref().is_some_and(|d| d.starts_with("sha256:")), "{:?}", job.image_digest);
    assert_eq!(job.engine_version.as_deref(), Some(benchfleet_sim::ENGINE_VERSION));
    assert!(job.telemetry.as_ref().is_some_and(|t| t.engine_scrapes > 0 && t.engine_scrape_failures == 0), "{job:?}");
    let records =
        crate::fleet::records(store.as_ref(), &AttemptKey { run, job: job.id, attempt: job.attempt }).expect("records");
    assert_eq!(records.len(), 20);
    assert!(records.iter().all(|r| r.outcome.is_ok()), "every request succeeded");
    // The engine's container is stopped and removed after the last profile.
    assert_no_containers(&client, name).await;
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_container_fails_its_attempt_with_the_log_tail() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logs();
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = "e2e-docker-killed";
    let docker = docker(dir.path()).await;
    let client = docker.client().clone();
    let (fleet, store) = fleet(dir.path(), name, docker).await;

    // Long enough (5 s of load) to be killed in the middle.
    let run = submit(&fleet.url, &matrix(dir.path(), "--max-model-len=8192", 20, 100)).await;
    let container = running(store.as_ref(), run, &client, name).await;
    client.kill_container(&container, None).await.expect("the container is killed");

    let job = finished(&fleet.url, store.as_ref(), run).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    let error = job.error.unwrap_or_default();
    assert!(error.contains("the engine exited (exit status: 137)"), "{error}");
    let tail = job.log_tail.unwrap_or_default();
    assert!(tail.contains("benchfleet-sim listening on 127.0.0.1:"), "the engine's log is kept: {tail}");
    assert_no_containers(&client, name).await;
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_flag_is_a_classified_failure() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logs();
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = "e2e-docker-bad-flag";
    let docker = docker(dir.path()).await;
    let client = docker.client().clone();
    let (fleet, store) = fleet(dir.path(), name, docker).await;

    let run = submit(&fleet.url, &matrix(dir.path(), "--no-such-flag", 20, 10)).await;
    let job = finished(&fleet.url, store.as_ref(), run).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    let error = job.error.unwrap_or_default();
    assert!(
        error.contains(
            "engine did not start: the engine rejected its flags: error: unrecognized arguments: --no-such-flag"
        ),
        "{error}"
    );
    let tail = job.log_tail.unwrap_or_default();
    assert!(tail.contains("unrecognized arguments: --no-such-flag"), "{tail}");
    assert_no_containers(&client, name).await;
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_a_classified_failure() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logs();
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = "e2e-docker-no-image";
    let docker = docker(dir.path()).await;
    let (fleet, store) = fleet(dir.path(), name, docker).await;

    let path = matrix(dir.path(), "", 20, 10);
    let yaml = std::fs::read_to_string(&path).expect("the matrix").replace(IMAGE, "benchfleet-sim:no-such-tag");
    std::fs::write(&path, yaml).expect("the matrix is written");
    let run = submit(&fleet.url, &path).await;
    let job = finished(&fleet.url, store.as_ref(), run).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    let error = job.error.unwrap_or_default();
    assert!(
        error.contains("the image `benchfleet-sim:no-such-tag` is not on this host and pulling it failed"),
        "{error}"
    );
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_removes_the_container_it_left() {
    let _turn = ONE_AT_A_TIME.lock().await;
    init_logs();
    let dir = tempfile::tempdir().expect("a temp dir");
    let name = "e2e-docker-restarted";
    let client = docker(dir.path()).await.client().clone();
    // The local fleet's own agent only runs processes, so the docker group
    // goes to the agent started below, which can then die on its own.
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.path().join("store")).expect("a sled store"));
    let decoy = dir.path().join("decoy");
    let fleet = LocalFleet::start(store.clone(), |url| {
        Ok(agent_with(url, "e2e-docker-decoy", "process", Arc::new(crate::fleet::InProcessSim), decoy))
    })
    .await
    .expect("the controller starts");

    // The first agent runs on a runtime of its own, so that dropping the
    // runtime stops it like a crash: its tasks end where they are and clean
    // nothing up.
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    let (url, first_dir) = (fleet.url.clone(), dir.path().to_path_buf());
    let first = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let docker = DockerRuntime::connect(options(&first_dir)).await.expect("the daemon answers");
            let config = agent(url, name, docker, first_dir.join("first"));
            tokio::select! {
                result = benchfleet_agent::run(config, Shutdown::new()) => result.expect("the agent runs"),
                _ = killed => {}
            }
        });
        drop(runtime);
    });

    let run = submit(&fleet.url, &matrix(dir.path(), "--max-model-len=8192", 20, 100)).await;
    let orphan = running(store.as_ref(), run, &client, name).await;
    kill.send(()).expect("the first agent is running");
    first.join().expect("the first agent stops");
    assert!(
        client.inspect_container(&orphan, None::<InspectContainerOptions>).await.is_ok(),
        "the crash left {orphan}"
    );

    // The restarted agent starts as the binary does, which removes the orphan.
    let args = DockerArgs {
        mode: DockerMode::On,
        docker_socket: PathBuf::from(SOCKET),
        model_cache: Some(dir.path().join("hf-cache")),
        hf_token: None,
        shm_size_gib: None,
        stop_grace_s: 5,
    };
    let docker = runtime_from_args(&args, name).await.expect("the agent starts").expect("docker is on");
    let gone = client.inspect_container(&orphan, None::<InspectContainerOptions>).await;
    assert!(gone.is_err(), "the orphaned container {orphan} is removed");

    // ...and the job runs again as a new attempt, which succeeds.
    let stop = Shutdown::new();
    let second = tokio::spawn(benchfleet_agent::run(
        agent(fleet.url.clone(), name, docker, dir.path().join("second")),
        stop.clone(),
    ));
    let job = finished(&fleet.url, store.as_ref(), run).await;
    assert_eq!((job.state, job.attempt), (JobState::Succeeded, 2), "{job:?}");
    assert_no_containers(&client, name).await;
    stop.now.cancel();
    second.await.expect("the second agent stops").expect("the second agent ran");
    fleet.stop().await;
}
