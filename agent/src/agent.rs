//! The agent's life: register with the controller, hold one session, run the
//! engine groups it is given, report on every job, and reconnect when the
//! controller goes away.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use benchfleet_proto as pb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::engine::{EngineRuntime, wait_until_serving};
use crate::gpu::GpuProbe;
use crate::job::{Attempt, GroupAssignment, LoadDataset, LoadRun};
use crate::load::LoadRunner;

/// What an agent needs to run.
#[derive(Clone)]
pub struct AgentConfig {
    /// The controller's gRPC URL, e.g. `http://127.0.0.1:7070`.
    pub controller_url: String,
    /// Unique in the fleet; a restarted agent registers under the same name.
    pub name: String,
    pub gpus: Arc<dyn GpuProbe>,
    /// By runtime name: "process", "docker", "external".
    pub runtimes: HashMap<String, Arc<dyn EngineRuntime>>,
    pub loadgen: Arc<dyn LoadRunner>,
    /// Where dataset files are written for loadgen.
    pub work_dir: PathBuf,
    pub startup_timeout: Duration,
}

/// Runs the agent until `shutdown` is cancelled.
pub async fn run(config: AgentConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    // The HTTP client needs a TLS provider even for plain http; ring is the
    // project's one (a no-op when the binary installed it already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut backoff = Duration::from_millis(100);
    loop {
        let session = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            r = session(&config, &shutdown) => r,
        };
        match session {
            Ok(()) if shutdown.is_cancelled() => return Ok(()),
            Ok(()) => {
                warn!("controller closed the session; reconnecting");
                backoff = Duration::from_millis(100);
            }
            Err(e) => warn!("session with {} failed: {e:#}; retrying in {backoff:?}", config.controller_url),
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One session: register, say hello, heartbeat, and run what is assigned.
/// A group still running when the session ends is abandoned: the controller
/// reruns its jobs as new attempts.
async fn session(config: &AgentConfig, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(config.controller_url.clone())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(1 << 30);
    let gpus = config.gpus.probe()?;
    let registered = client
        .register(pb::RegisterRequest {
            name: config.name.clone(),
            hostname: hostname(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            gpus: gpus
                .iter()
                .map(|g| pb::Gpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    name: g.name.clone(),
                    memory_total_bytes: g.memory_total_bytes,
                    usable: g.usable(),
                    reasons: g.reasons.clone(),
                })
                .collect(),
            runtimes: config.runtimes.keys().cloned().collect(),
        })
        .await?
        .into_inner();
    let (tx, rx) = mpsc::channel(64);
    tx.send(msg(pb::agent_message::Msg::Hello(pb::Hello { agent_id: registered.agent_id.clone() }))).await?;
    let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    info!(agent = %registered.agent_id, "session with the controller started");

    let beat = Duration::from_millis(u64::from(registered.heartbeat_interval_ms.max(100)));
    let mut heartbeat = tokio::time::interval(beat);
    let session_over = shutdown.child_token();
    let _stop_group_on_exit = session_over.clone().drop_guard();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = heartbeat.tick() => {
                tx.send(msg(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {}))).await?;
            }
            next = inbound.next() => match next {
                None => return Ok(()),
                Some(Err(status)) => anyhow::bail!("session broke: {}", status.message()),
                Some(Ok(pb::ControllerMessage { msg: Some(pb::controller_message::Msg::AssignGroup(g)) })) => {
                    match GroupAssignment::try_from(g) {
                        Ok(group) => {
                            let (config, tx, stop) = (config.clone(), tx.clone(), session_over.clone());
                            tokio::spawn(async move {
                                tokio::select! {
                                    () = stop.cancelled() => {}
                                    () = run_group(&config, group, &tx) => {}
                                }
                            });
                        }
                        Err(e) => warn!("ignoring a malformed assignment: {e}"),
                    }
                }
                Some(Ok(_)) => {}
            }
        }
    }
}

fn msg(m: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(m) }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Reports a job's state; a closed session means the controller will rerun
/// the job anyway, so a failed send is not an error here.
async fn report(
    tx: &mpsc::Sender<pb::AgentMessage>,
    attempt: &Attempt,
    state: pb::JobState,
    f: impl FnOnce(&mut pb::JobUpdate),
) {
    let mut update = pb::JobUpdate { attempt: Some(attempt.into()), state: state as i32, ..Default::default() };
    f(&mut update);
    let _ = tx.send(msg(pb::agent_message::Msg::JobUpdate(update))).await;
}

/// Starts the group's engine once, runs its jobs in order, stops the engine.
async fn run_group(config: &AgentConfig, mut group: GroupAssignment, tx: &mpsc::Sender<pb::AgentMessage>) {
    info!(run = %group.run_id, group = group.group, config = %group.engine.config_name, "starting engine group");
    let done =
        msg(pb::agent_message::Msg::GroupDone(pb::GroupDone { run_id: group.run_id.clone(), group: group.group }));
    let Some(first) = group.jobs.first().cloned() else {
        let _ = tx.send(done).await;
        return;
    };
    report(tx, &first.attempt, pb::JobState::StartingEngine, |_| {}).await;
    let gpus: Vec<String> = match config.gpus.probe() {
        Ok(gpus) => gpus.into_iter().filter(|g| g.usable()).map(|g| g.uuid).collect(),
        Err(e) => {
            warn!("cannot read the GPUs before starting the engine: {e:#}");
            Vec::new()
        }
    };
    group.engine.instance_name =
        format!("benchfleet-{}-{}-{}", first.attempt.run_id, first.attempt.job, first.attempt.attempt);
    group.engine.labels = vec![
        ("benchfleet.run".into(), first.attempt.run_id.clone()),
        ("benchfleet.job".into(), first.attempt.job.to_string()),
        ("benchfleet.attempt".into(), first.attempt.attempt.to_string()),
        ("benchfleet.agent".into(), config.name.clone()),
    ];
    group.engine.gpu_uuids = gpus;

    let started = match config.runtimes.get(&group.engine.runtime) {
        None => Err((
            format!("runtime `{}` is not available on agent {}", group.engine.runtime, config.name),
            String::new(),
        )),
        Some(runtime) => match runtime.start(&group.engine).await {
            Err(e) => Err((e.to_string(), String::new())),
            Ok(mut engine) => {
                match wait_until_serving(engine.as_mut(), &group.engine.model, config.startup_timeout).await {
                    Ok(took) => Ok((engine, took)),
                    Err(e) => {
                        let tail = engine.log_tail();
                        engine.stop().await;
                        Err((e.to_string(), tail))
                    }
                }
            }
        },
    };
    let (mut engine, startup) = match started {
        Ok(e) => e,
        Err((error, tail)) => {
            warn!(config = %group.engine.config_name, "engine did not start: {error}");
            for job in &group.jobs {
                report(tx, &job.attempt, pb::JobState::Failed, |u| {
                    u.error = format!("engine did not start: {error}");
                    u.log_tail = tail.clone();
                })
                .await;
            }
            let _ = tx.send(done).await;
            return;
        }
    };
    info!(config = %group.engine.config_name, "engine serving after {:.1} s", startup.as_secs_f64());

    let http = reqwest::Client::new();
    for (i, job) in group.jobs.iter().enumerate() {
        if let Some(status) = engine.exit_status() {
            report(tx, &job.attempt, pb::JobState::Failed, |u| {
                u.error = format!("the engine exited ({status}) before this job");
                u.log_tail = engine.log_tail();
            })
            .await;
            continue;
        }
        if i > 0 {
            // Each profile starts with a cold prefix cache, where the engine
            // allows it (vLLM and the simulator do).
            let _ = http.post(format!("{}/reset_prefix_cache", engine.base_url())).send().await;
        }
        report(tx, &job.attempt, pb::JobState::Running, |u| u.engine_startup_s = startup.as_secs_f64()).await;
        let result = match dataset_file(config, &job.dataset).await {
            Ok(dataset_path) => {
                let run = LoadRun {
                    job: job.clone(),
                    base_url: engine.base_url(),
                    model: group.engine.model.clone(),
                    ingest_url: group.ingest_url.clone(),
                    dataset_path,
                };
                config.loadgen.run(&run).await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => report(tx, &job.attempt, pb::JobState::Succeeded, |_| {}).await,
            Err(e) => {
                warn!(job = job.attempt.job, "job failed: {e:#}");
                let exited = engine.exit_status();
                report(tx, &job.attempt, pb::JobState::Failed, |u| {
                    u.error = match &exited {
                        Some(status) => format!("the engine exited ({status}) during the job: {e:#}"),
                        None => format!("{e:#}"),
                    };
                    if exited.is_some() {
                        u.log_tail = engine.log_tail();
                    }
                })
                .await;
            }
        }
    }
    engine.stop().await;
    let _ = tx.send(done).await;
}

/// Writes a ShareGPT file the controller sent, once, named by its hash.
async fn dataset_file(config: &AgentConfig, dataset: &LoadDataset) -> anyhow::Result<Option<PathBuf>> {
    let LoadDataset::ShareGpt { sha256, content, .. } = dataset else {
        return Ok(None);
    };
    let dir = config.work_dir.join("datasets");
    tokio::fs::create_dir_all(&dir).await?;
    let path = dir.join(format!("{sha256}.json"));
    if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
        let partial = dir.join(format!("{sha256}.json.partial"));
        tokio::fs::write(&partial, content).await?;
        tokio::fs::rename(&partial, &path).await?;
    }
    Ok(Some(path))
}
