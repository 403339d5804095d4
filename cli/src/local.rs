//! Local mode: a controller, one agent and simulated engines in one process
//! tree on this machine, over real gRPC on loopback and a real sled store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_agent::engine::{EngineRuntime, ProcessRuntime};
use benchfleet_agent::gpu::SimGpuProbe;
use benchfleet_agent::load::ProcessLoadRunner;
use benchfleet_agent::{AgentConfig, Shutdown};
use benchfleet_controller::store::Store;
use benchfleet_controller::{Controller, ControllerConfig, serve};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running local controller and agent.
pub struct LocalFleet {
    /// The controller's gRPC URL.
    pub url: String,
    pub controller: Arc<Controller>,
    stop_controller: CancellationToken,
    stop_agent: Shutdown,
    serving: JoinHandle<()>,
    agent: JoinHandle<()>,
}

/// The controller settings of local mode: the one agent is in this process,
/// so there is no one to wait for after a restart.
pub fn local_config(url: &str) -> ControllerConfig {
    let mut config = ControllerConfig::new(url);
    config.sched.restart_grace = Duration::from_secs(2);
    config
}

impl LocalFleet {
    /// Starts a controller on a free loopback port and one agent whose
    /// configuration `agent` builds from the controller's URL.
    pub async fn start(
        store: Arc<dyn Store>,
        agent: impl FnOnce(String) -> anyhow::Result<AgentConfig>,
    ) -> anyhow::Result<LocalFleet> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot bind 127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let controller = Controller::start(store, local_config(&url))?;
        let stop_controller = CancellationToken::new();
        let stop = stop_controller.clone();
        let served = controller.clone();
        let serving = tokio::spawn(async move {
            if let Err(e) = serve(served, listener, stop.cancelled_owned()).await {
                tracing::error!("controller stopped: {e}");
            }
        });
        let agent_config = match agent(url.clone()) {
            Ok(config) => config,
            Err(e) => {
                stop_controller.cancel();
                let _ = serving.await;
                return Err(e);
            }
        };
        let stop_agent = Shutdown::new();
        let shutdown = stop_agent.clone();
        let agent = tokio::spawn(async move {
            if let Err(e) = benchfleet_agent::run(agent_config, shutdown).await {
                tracing::error!("agent stopped: {e:#}");
            }
        });
        Ok(LocalFleet { url, controller, stop_controller, stop_agent, serving, agent })
    }

    /// Stops the agent (and with it every engine and loadgen it runs, which
    /// it awaits), then the controller.
    pub async fn stop(self) {
        self.stop_agent.now.cancel();
        let _ = self.agent.await;
        self.stop_controller.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.serving).await;
    }
}

/// The agent of local mode: one host of `gpus` simulated GPUs (a job's
/// worth), engines run as `benchfleet-sim` processes, loadgen run as the
/// `benchfleet-loadgen` binary, both found beside the running executable.
pub fn simulated_agent(
    controller_url: String,
    gpu: &str,
    gpus: u32,
    work_dir: std::path::PathBuf,
) -> anyhow::Result<AgentConfig> {
    let missing = |name: &str| {
        format!("{name} not found beside this binary or on PATH; build every binary first: cargo build --release")
    };
    let sim = benchfleet_agent::find_binary("benchfleet-sim").with_context(|| missing("benchfleet-sim"))?;
    let loadgen = benchfleet_agent::find_binary("benchfleet-loadgen").with_context(|| missing("benchfleet-loadgen"))?;
    let pids = benchfleet_agent::procs::PidDir(work_dir.join("pids"));
    let mut runtimes: HashMap<String, Arc<dyn EngineRuntime>> = HashMap::new();
    // The simulator models the GPU the matrix asks for.
    let env = vec![("BENCHFLEET_SIM_GPU".to_owned(), gpu.to_owned())];
    runtimes.insert(
        "process".into(),
        Arc::new(ProcessRuntime {
            launcher: vec![sim.display().to_string()],
            env,
            stop_grace: Duration::from_secs(10),
            pids: Some(pids.clone()),
            sim_speed: None,
        }),
    );
    Ok(AgentConfig {
        controller_url,
        tls: Default::default(),
        name: "local".into(),
        gpus: Arc::new(SimGpuProbe::new(gpu, gpus, "local")),
        runtimes,
        loadgen: Arc::new(ProcessLoadRunner::new(loadgen, Some(pids), work_dir.join("loadgen"))),
        work_dir,
        startup_timeout: Duration::from_secs(120),
        gpu_check_interval: Duration::from_secs(60),
        leave_grace: Duration::from_secs(10),
        price: None,
    })
}
