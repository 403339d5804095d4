//! Local mode: a controller, one agent and simulated engines in one process
//! tree on this machine, over real gRPC on loopback and a real sled store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_agent::AgentConfig;
use benchfleet_agent::engine::{EngineRuntime, ProcessRuntime};
use benchfleet_agent::gpu::SimGpuProbe;
use benchfleet_agent::load::ProcessLoadRunner;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use benchfleet_controller::server::{Controller, ControllerConfig, serve};
use benchfleet_controller::store::Store;

/// A running local controller and agent.
pub struct LocalFleet {
    /// The controller's gRPC URL.
    pub url: String,
    shutdown: CancellationToken,
    controller: JoinHandle<()>,
    agent: JoinHandle<()>,
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
        let controller = Controller::new(store, ControllerConfig { advertise_url: url.clone() })?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let controller = tokio::spawn(async move {
            if let Err(e) = serve(controller, listener, stop.cancelled_owned()).await {
                tracing::error!("controller stopped: {e}");
            }
        });
        let agent_config = match agent(url.clone()) {
            Ok(config) => config,
            Err(e) => {
                shutdown.cancel();
                let _ = controller.await;
                return Err(e);
            }
        };
        let stop = shutdown.clone();
        let agent = tokio::spawn(async move {
            if let Err(e) = benchfleet_agent::run(agent_config, stop).await {
                tracing::error!("agent stopped: {e:#}");
            }
        });
        Ok(LocalFleet { url, shutdown, controller, agent })
    }

    /// Stops the agent (and with it any engine it runs), then the controller.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.agent.await;
        // Streams that outlive the agent (a watcher) must not hold the
        // controller up for long.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.controller).await;
    }
}

/// The agent of local mode: simulated GPUs, engines run as `benchfleet-sim`
/// processes, loadgen run as the `benchfleet-loadgen` binary, both found
/// beside the running executable.
pub fn simulated_agent(controller_url: String, gpu: &str, work_dir: std::path::PathBuf) -> anyhow::Result<AgentConfig> {
    let missing = |name: &str| {
        format!("{name} not found beside this binary or on PATH; build every binary first: cargo build --release")
    };
    let sim = benchfleet_agent::find_binary("benchfleet-sim").with_context(|| missing("benchfleet-sim"))?;
    let loadgen = benchfleet_agent::find_binary("benchfleet-loadgen").with_context(|| missing("benchfleet-loadgen"))?;
    let mut runtimes: HashMap<String, Arc<dyn EngineRuntime>> = HashMap::new();
    // The simulator models the GPU the matrix asks for.
    let env = vec![("BENCHFLEET_SIM_GPU".to_owned(), gpu.to_owned())];
    runtimes.insert(
        "process".into(),
        Arc::new(ProcessRuntime { launcher: vec![sim.display().to_string()], env, ..ProcessRuntime::default() }),
    );
    Ok(AgentConfig {
        controller_url,
        name: "local".into(),
        gpus: Arc::new(SimGpuProbe { model: gpu.to_owned(), count: 1, host: "local".into() }),
        runtimes,
        loadgen: Arc::new(ProcessLoadRunner { binary: loadgen }),
        work_dir,
        startup_timeout: Duration::from_secs(120),
        gpu_check_interval: Duration::from_secs(60),
    })
}
