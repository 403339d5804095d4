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

use crate::engine::{Engine, EngineError, EngineRuntime, wait_until_serving};
use crate::gpu::{GpuInfo, GpuProbe};
use crate::job::{Attempt, EngineLaunch, GroupAssignment, LoadDataset, LoadRun};
use crate::load::LoadRunner;
use crate::verdict::{new_errors, new_xids};

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
    /// How often the GPUs are checked again and reported, so that a GPU that
    /// fails between jobs stops being given work.
    pub gpu_check_interval: Duration,
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
    let gpus = probe(config).await?;
    let registered = client
        .register(pb::RegisterRequest {
            name: config.name.clone(),
            hostname: hostname(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            gpus: gpus.iter().map(gpu_message).collect(),
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
    let mut gpu_check = tokio::time::interval_at(
        tokio::time::Instant::now() + config.gpu_check_interval,
        config.gpu_check_interval.max(Duration::from_millis(100)),
    );
    let mut last_verdicts = verdicts(&gpus);
    let session_over = shutdown.child_token();
    let _stop_group_on_exit = session_over.clone().drop_guard();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = heartbeat.tick() => {
                tx.send(msg(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {}))).await?;
            }
            _ = gpu_check.tick() => {
                let gpus = match probe(config).await {
                    Ok(gpus) => gpus,
                    Err(e) => {
                        warn!("cannot read the GPUs: {e:#}");
                        continue;
                    }
                };
                let now = verdicts(&gpus);
                if now != last_verdicts {
                    for g in gpus.iter().filter(|g| !g.usable()) {
                        warn!(gpu = %g.uuid, "GPU not usable: {}", g.reasons.join("; "));
                    }
                    last_verdicts = now;
                }
                let report = pb::GpuReport { gpus: gpus.iter().map(gpu_message).collect() };
                tx.send(msg(pb::agent_message::Msg::GpuReport(report))).await?;
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

/// Each GPU's UUID and reasons, to notice a change.
fn verdicts(gpus: &[GpuInfo]) -> Vec<(String, Vec<String>)> {
    gpus.iter().map(|g| (g.uuid.clone(), g.reasons.clone())).collect()
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
    // The GPUs are checked again right before the engine starts: one that
    // failed since registration must not produce a number.
    let unusable: Vec<String> = match probe(config).await {
        Ok(gpus) => group
            .gpu_uuids
            .iter()
            .filter_map(|uuid| match gpus.iter().find(|g| &g.uuid == uuid) {
                None => Some(format!("GPU {uuid} is gone")),
                Some(g) if !g.usable() => Some(format!("GPU {uuid}: {}", g.reasons.join("; "))),
                Some(_) => None,
            })
            .collect(),
        Err(e) => vec![format!("cannot read the GPUs: {e:#}")],
    };
    if !unusable.is_empty() {
        let error = format!("GPU check before engine start failed: {}", unusable.join("; "));
        warn!(config = %group.engine.config_name, "{error}");
        for job in &group.jobs {
            report(tx, &job.attempt, pb::JobState::Failed, |u| u.error = error.clone()).await;
        }
        let _ = tx.send(done).await;
        return;
    }
    group.engine.instance_name =
        format!("benchfleet-{}-{}-{}", first.attempt.run_id, first.attempt.job, first.attempt.attempt);
    group.engine.labels = vec![
        ("benchfleet.run".into(), first.attempt.run_id.clone()),
        ("benchfleet.job".into(), first.attempt.job.to_string()),
        ("benchfleet.attempt".into(), first.attempt.attempt.to_string()),
        ("benchfleet.agent".into(), config.name.clone()),
    ];
    group.engine.gpu_uuids = group.gpu_uuids.clone();

    let started = match config.runtimes.get(&group.engine.runtime) {
        None => Err((
            format!("runtime `{}` is not available on agent {}", group.engine.runtime, config.name),
            String::new(),
        )),
        Some(runtime) => match start_engine(runtime.as_ref(), &group.engine, &first.attempt, tx).await {
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
        // Taken first: an XID from here on (the cache reset included) is
        // during this job's attempt.
        let xid_mark = config.gpus.xid_mark();
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
        // Read right before the job: its fingerprint goes with the result,
        // and its error counts are the baseline the job is checked against.
        let before = probe(config).await.inspect_err(|e| warn!("cannot read the GPUs before the job: {e:#}")).ok();
        let uuids = attempt_gpus(before.as_deref().unwrap_or_default(), &group.gpu_uuids);
        report(tx, &job.attempt, pb::JobState::Running, |u| {
            u.engine_startup_s = startup.as_secs_f64();
            // The verdicts were given before the engine started; judged now,
            // the engine's own memory would read as a foreign process.
            u.gpu_fingerprint = before
                .iter()
                .flatten()
                .filter(|g| uuids.contains(&g.uuid))
                .map(|g| pb::Gpu { usable: true, reasons: Vec::new(), ..gpu_message(g) })
                .collect();
        })
        .await;
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
        // A GPU error during the attempt makes its numbers worthless,
        // whatever loadgen says.
        if let Some(error) = gpu_errors_since(config, before.as_deref(), xid_mark, &uuids).await {
            warn!(job = job.attempt.job, "{error}");
            report(tx, &job.attempt, pb::JobState::Failed, |u| u.error = error).await;
            continue;
        }
        match result {
            // Numbers measured against an engine that died are no result.
            Ok(()) => match engine.exit_status() {
                Some(status) => {
                    report(tx, &job.attempt, pb::JobState::Failed, |u| {
                        u.error = format!("the engine exited ({status}) during the job");
                        u.log_tail = engine.log_tail();
                    })
                    .await
                }
                None => report(tx, &job.attempt, pb::JobState::Succeeded, |_| {}).await,
            },
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

/// Prepares the runtime (a container image pull), reporting its progress
/// with STARTING_ENGINE updates, then starts the engine.
async fn start_engine(
    runtime: &dyn EngineRuntime,
    launch: &EngineLaunch,
    attempt: &Attempt,
    tx: &mpsc::Sender<pb::AgentMessage>,
) -> Result<Box<dyn Engine>, EngineError> {
    let progress = |line: String| {
        info!(config = %launch.config_name, "{line}");
        let update = pb::JobUpdate {
            attempt: Some(attempt.into()),
            state: pb::JobState::StartingEngine as i32,
            pull_progress: line,
            ..Default::default()
        };
        // Progress is advisory: a line that finds the session's queue full
        // is dropped rather than holding the pull up.
        let _ = tx.try_send(msg(pb::agent_message::Msg::JobUpdate(update)));
    };
    runtime.prepare(launch, &progress).await?;
    runtime.start(launch).await
}

/// Probes the GPUs off the async threads: NVML calls block, at times for
/// long (a GPU that fell off the bus).
async fn probe(config: &AgentConfig) -> anyhow::Result<Vec<GpuInfo>> {
    let gpus = config.gpus.clone();
    tokio::task::spawn_blocking(move || gpus.probe()).await?
}

/// The GPUs an attempt runs on: those the controller gave its group, or
/// every GPU of the host when it gave none.
fn attempt_gpus(gpus: &[GpuInfo], assigned: &[String]) -> Vec<String> {
    if assigned.is_empty() { gpus.iter().map(|g| g.uuid.clone()).collect() } else { assigned.to_vec() }
}

/// Why an attempt is invalid, if it is: new uncorrectable ECC errors since
/// `before` (not compared when the GPUs could not be read before the job),
/// and XID events since `xid_mark`.
async fn gpu_errors_since(
    config: &AgentConfig,
    before: Option<&[GpuInfo]>,
    xid_mark: u64,
    uuids: &[String],
) -> Option<String> {
    let mut errors = match before {
        Some(before) => match probe(config).await {
            Ok(after) => new_errors(before, &after, uuids),
            // A GPU that cannot be read after the job may have failed during it.
            Err(e) => vec![format!("cannot read the GPUs after the job: {e:#}")],
        },
        None => Vec::new(),
    };
    errors.extend(new_xids(&config.gpus.xid_events_after(xid_mark), uuids));
    (!errors.is_empty()).then(|| format!("attempt invalidated: {}", errors.join("; ")))
}

/// A GPU as the controller stores it: inventory, verdict and fingerprint.
fn gpu_message(g: &GpuInfo) -> pb::Gpu {
    pb::Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory_total_bytes: g.memory_total_bytes,
        usable: g.usable(),
        reasons: g.reasons.clone(),
        serial: g.serial.clone().unwrap_or_default(),
        driver_version: g.driver_version.clone(),
        cuda_driver_version: g.cuda_driver_version.clone(),
        memory_used_bytes: g.memory_used_bytes.unwrap_or_default(),
        sm_clock_max_mhz: g.sm_clock_max_mhz.unwrap_or_default(),
        memory_clock_max_mhz: g.memory_clock_max_mhz.unwrap_or_default(),
        power_limit_w: g.power_limit_w.unwrap_or_default(),
        pcie_gen_max: g.pcie_gen_max.unwrap_or_default(),
        pcie_width_max: g.pcie_width_max.unwrap_or_default(),
        pcie_width: g.pcie_width.unwrap_or_default(),
        mig_enabled: g.mig_enabled.unwrap_or_default(),
        ecc_enabled: g.ecc_enabled.unwrap_or_default(),
        ecc_uncorrectable_volatile: g.ecc_uncorrectable_volatile.unwrap_or_default(),
        ecc_uncorrectable_aggregate: g.ecc_uncorrectable_aggregate.unwrap_or_default(),
        temperature_c: g.temperature_c.unwrap_or_default(),
        fingerprint: g.fingerprint(),
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::gpu::XidEvent;
    use crate::load::ProcessLoadRunner;

    /// GPUs whose inventory a test changes between probes, and a fixed XID
    /// log of which only the events after a mark are returned.
    struct Changing {
        gpus: Mutex<Vec<GpuInfo>>,
        xids: Vec<XidEvent>,
    }

    impl GpuProbe for Changing {
        fn probe(&self) -> anyhow::Result<Vec<GpuInfo>> {
            Ok(self.gpus.lock().expect("not poisoned").clone())
        }

        fn xid_mark(&self) -> u64 {
            1
        }

        fn xid_events_after(&self, mark: u64) -> Vec<XidEvent> {
            self.xids.iter().filter(|e| e.seq > mark).cloned().collect()
        }
    }

    fn config(gpus: Arc<Changing>) -> AgentConfig {
        AgentConfig {
            controller_url: String::new(),
            name: "test".into(),
            gpus,
            runtimes: HashMap::new(),
            loadgen: Arc::new(ProcessLoadRunner { binary: PathBuf::new() }),
            work_dir: PathBuf::new(),
            startup_timeout: Duration::ZERO,
            gpu_check_interval: Duration::ZERO,
        }
    }

    #[tokio::test]
    async fn ecc_errors_and_xids_during_an_attempt_are_both_named() {
        let gpu = |uuid: &str| GpuInfo { uuid: uuid.into(), ecc_uncorrectable_volatile: Some(0), ..GpuInfo::default() };
        let xid = |seq, uuid: &str, xid| XidEvent { seq, uuid: uuid.into(), xid, at_unix_ms: 0 };
        let before = vec![gpu("GPU-0"), gpu("GPU-1")];
        let probe = Arc::new(Changing {
            gpus: Mutex::new(before.clone()),
            // Before the mark, and on a GPU of another attempt: neither counts.
            xids: vec![xid(1, "GPU-0", 13), xid(2, "GPU-1", 79), xid(3, "GPU-0", 79)],
        });
        let config = config(Arc::clone(&probe));
        let mark = config.gpus.xid_mark();
        let attempt = ["GPU-0".to_owned()];
        assert_eq!(
            gpu_errors_since(&config, Some(&before), mark, &attempt).await.as_deref(),
            Some("attempt invalidated: XID 79 on GPU GPU-0")
        );
        probe.gpus.lock().expect("not poisoned")[0].ecc_uncorrectable_volatile = Some(2);
        assert_eq!(
            gpu_errors_since(&config, Some(&before), mark, &attempt).await.as_deref(),
            Some("attempt invalidated: new uncorrectable ECC errors on GPU GPU-0: 2; XID 79 on GPU GPU-0")
        );
        // Without a reading before the job, XIDs still count.
        assert_eq!(
            gpu_errors_since(&config, None, mark, &attempt).await.as_deref(),
            Some("attempt invalidated: XID 79 on GPU GPU-0")
        );
        probe.gpus.lock().expect("not poisoned")[0].ecc_uncorrectable_volatile = Some(0);
        assert_eq!(gpu_errors_since(&config, Some(&before), 3, &attempt).await, None, "nothing after this mark");
    }
}
