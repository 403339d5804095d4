//! The agent's life: clear what an earlier life left, then hold a session
//! with the controller, reconnecting whenever it ends, and keep the groups
//! it runs across sessions. When its lease goes unrenewed too long (the
//! controller is gone, or the network cut off), it stops its work: the
//! controller will have given it to someone else. Asked to leave (SIGTERM),
//! it takes no new work, lets what runs finish (up to a grace), gives up the
//! rest, tells the controller, and exits; asked to stop, it stops at once,
//! engines and loadgen included.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::engine::EngineRuntime;
use crate::gpu::GpuProbe;
use crate::group::{Files, GroupContext};
use crate::job::ReportTls;
use crate::load::LoadRunner;
use crate::procs::PidDir;
use crate::session::{self, ControllerFiles, SessionConfig, SessionError, Shared};

/// What an agent needs to run.
#[derive(Clone)]
pub struct AgentConfig {
    /// The controller's gRPC URL, e.g. `http://127.0.0.1:7070`.
    pub controller_url: String,
    /// Unique in the fleet; a restarted agent registers under the same name.
    pub name: String,
    /// What it holds to reach the controller (`identity`).
    pub tls: benchfleet_core::tls::ClientTls,
    pub gpus: Arc<dyn GpuProbe>,
    /// By runtime name: "process", "docker", "external".
    pub runtimes: HashMap<String, Arc<dyn EngineRuntime>>,
    pub loadgen: Arc<dyn LoadRunner>,
    /// Where the agent keeps its files: fetched datasets (`files/`) and the
    /// pid files of what it starts (`pids/`).
    pub work_dir: PathBuf,
    pub startup_timeout: Duration,
    /// How often the GPUs are checked again and reported, so that a GPU that
    /// fails between jobs stops being given work.
    pub gpu_check_interval: Duration,
    /// When leaving, how long running groups may go on before they are
    /// given up.
    pub leave_grace: Duration,
    /// What an hour of one of its GPUs costs (`--gpu-hour-price`), said in
    /// its hello for the reports' cost; `None`: the matrix's price.
    pub price: Option<benchfleet_core::cost::Price>,
}

impl AgentConfig {
    /// Where the agent records the process groups it starts.
    pub fn pid_dir(&self) -> PidDir {
        PidDir(self.work_dir.join("pids"))
    }
}

/// How an agent is told to end.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    /// Leave: no new work, finish (up to the grace), then exit.
    pub leave: CancellationToken,
    /// Stop now: every group is stopped, then exit.
    pub now: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }
}

/// A random id for this start of the agent process.
fn instance() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), t)
}

/// Runs the agent until `shutdown` says otherwise.
pub async fn run(config: AgentConfig, shutdown: Shutdown) -> anyhow::Result<()> {
    run_with(config, shutdown, Shared::default()).await
}

/// [`run`], keeping its state in `shared` (which `observe` reads).
pub async fn run_with(config: AgentConfig, shutdown: Shutdown, shared: Shared) -> anyhow::Result<()> {
    // The HTTP client needs a TLS provider even for plain http; ring is the
    // project's one (a no-op when the binary installed it already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    // What an earlier life of this agent left running goes first: its GPUs
    // are not free until it is gone.
    let stopped = config.pid_dir().sweep(Duration::from_secs(30)).await;
    if !stopped.is_empty() {
        info!(processes = ?stopped, "stopped what an earlier run of this agent left");
    }
    let files: Arc<dyn Files> =
        Arc::new(ControllerFiles { shared: shared.clone(), dir: config.work_dir.join("files") });
    let cfg = Arc::new(SessionConfig {
        controller_url: config.controller_url.clone(),
        tls: config.tls.clone(),
        identity: config.tls.identity.as_ref().and(config.tls.source.clone()),
        name: config.name.clone(),
        hostname: benchfleet_core::hostname().unwrap_or_else(|| "unknown".to_owned()),
        instance: instance(),
        runtimes: config.runtimes.keys().cloned().collect(),
        gpu_check_interval: config.gpu_check_interval,
        price: config.price.clone(),
        group: GroupContext {
            agent_name: config.name.clone(),
            gpus: config.gpus.clone(),
            runtimes: config.runtimes.clone(),
            loadgen: config.loadgen.clone(),
            files,
            startup_timeout: config.startup_timeout,
            report: ReportTls {
                ca: config.tls.ca.as_ref().and(config.tls.source.as_ref()).map(|dir| dir.join(crate::identity::CA)),
                insecure: config.tls.insecure,
            },
        },
    });
    let mut backoff = Duration::from_millis(100);
    let mut leave_by: Option<Instant> = None;
    let mut watch = tokio::time::interval(Duration::from_millis(200));
    // After a pause (SIGSTOP, a suspended VM) one check is enough.
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        // Its own task: it goes on answering (acknowledgements included)
        // while this loop stops groups, and is aborted when the lease is lost.
        let mut session = tokio::spawn(session::session(cfg.clone(), shared.clone()));
        let _abort = AbortOnDrop(session.abort_handle());
        let ended = loop {
            tokio::select! {
                r = &mut session => break Some(r.unwrap_or_else(|e| Err(SessionError::Other(anyhow::anyhow!("session task failed: {e}"))))),
                () = shutdown.now.cancelled() => {
                    stop(&shared, "the agent was stopped").await;
                    return Ok(());
                }
                () = shutdown.leave.cancelled(), if leave_by.is_none() => {
                    info!(running = shared.running(), "leaving: no new work; running groups may finish within {:?}", config.leave_grace);
                    leave_by = Some(Instant::now() + config.leave_grace);
                    shared.leave();
                }
                _ = watch.tick() => {
                    let now = Instant::now();
                    shared.forget_old(now);
                    if let Some(silent) = shared.lease_expired(now)
                        && shared.running() > 0
                    {
                        let reason = format!(
                            "this agent lost its lease: the controller acknowledged nothing for {:.1} s",
                            silent.as_secs_f64()
                        );
                        warn!("{reason}; stopping its work");
                        shared.stop_all(&reason, true);
                        break None;
                    }
                    if let Some(by) = leave_by {
                        if shared.running() == 0 {
                            // Everything is reported; make sure it arrived.
                            shared.sync(Duration::from_secs(3)).await;
                            info!("left the fleet");
                            return Ok(());
                        }
                        if now >= by {
                            warn!("the leave grace is over; giving up the groups still running");
                            stop(&shared, "the agent shut down").await;
                            return Ok(());
                        }
                    }
                }
            }
        };
        match ended {
            // The lease was lost: reconnect at once.
            None => continue,
            Some(Ok(())) => {
                warn!("the controller closed the session; reconnecting");
                backoff = Duration::from_millis(100);
            }
            Some(Err(SessionError::Refused(why))) => {
                error!("{why}");
                backoff = backoff.max(Duration::from_secs(2));
            }
            Some(Err(e)) => warn!("session with {} failed: {e:#}; retrying in {backoff:?}", config.controller_url),
        }
        tokio::select! {
            () = shutdown.now.cancelled() => {
                stop(&shared, "the agent was stopped").await;
                return Ok(());
            }
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Stops every group, waits for their engines and loadgen to be gone, and
/// tries to tell the controller.
async fn stop(shared: &Shared, reason: &str) {
    shared.stop_all(reason, false);
    shared.join_all(Duration::from_secs(60)).await;
    shared.sync(Duration::from_secs(2)).await;
}
