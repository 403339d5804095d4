//! An in-process fleet: the agent's engine runtime serves the simulator's
//! library on a loopback port, and its load runner calls loadgen's library,
//! which streams records to the controller over gRPC like the binary does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use benchfleet_agent::AgentConfig;
use benchfleet_agent::engine::{Engine, EngineError, EngineRuntime, engine_command};
use benchfleet_agent::gpu::SimGpuProbe;
use benchfleet_agent::job::{EngineLaunch, LoadRun};
use benchfleet_agent::load::{LoadError, LoadRunner};
use benchfleet_cli::client;
use benchfleet_cli::local::LocalFleet;
use benchfleet_controller::{SledStore, Store};
use benchfleet_core::load::LoadExit;
use tokio_util::sync::CancellationToken;

pub struct InProcessSim;

struct SimEngine {
    port: u16,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

#[tonic::async_trait]
impl EngineRuntime for InProcessSim {
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| EngineError::Spawn { command: "bind".into(), source })?;
        let port =
            listener.local_addr().map_err(|source| EngineError::Spawn { command: "bind".into(), source })?.port();
        let config = benchfleet_sim::parse_command_line(&engine_command(launch, "127.0.0.1", port))
            .map_err(|e| EngineError::BadFlag { message: e.to_string() })?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(benchfleet_sim::serve(config, listener, stop.clone().cancelled_owned()));
        Ok(Box::new(SimEngine { port, stop, task }))
    }
}

#[tonic::async_trait]
impl Engine for SimEngine {
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    fn log_tail(&self) -> String {
        String::new()
    }
    fn exit_status(&mut self) -> Option<String> {
        self.task.is_finished().then(|| "stopped".to_owned())
    }
    async fn stop(self: Box<Self>) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

pub struct InProcessLoadgen;

#[tonic::async_trait]
impl LoadRunner for InProcessLoadgen {
    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> Result<(), LoadError> {
        // As the binary ends: an error is exit status 1, a run in which no
        // request succeeded 4, each with its words.
        let error = |e: anyhow::Error| LoadError::failed(LoadExit::Error, format!("{e:#}"));
        // The flags the agent gives the binary, parsed as the binary does.
        let (_, mut config, sink) =
            benchfleet_loadgen::cli::parse(&benchfleet_agent::load::loadgen_args(run)).map_err(error)?;
        let sink = sink.ok_or_else(|| error(anyhow::anyhow!("the agent's flags name no controller to report to")))?;
        config.stop = stop.child_token();
        let result = benchfleet_loadgen::run(config, Some(sink)).await.map_err(|e| error(e.into()))?;
        if let Some(why) = result.none_succeeded() {
            return Err(LoadError::failed(LoadExit::NoneSucceeded, why));
        }
        Ok(())
    }

    /// The library is the binary's: the same workspace version.
    async fn version(&self) -> Option<String> {
        Some(format!("benchfleet-loadgen {}", env!("CARGO_PKG_VERSION")))
    }
}

/// Submits a matrix (uploading its files) and follows the run to its end.
pub async fn run_matrix(
    url: &str,
    matrix: &Path,
    runtime: Option<&str>,
) -> anyhow::Result<(String, benchfleet_proto::RunInfo)> {
    let mut operator = client::connect(url).await?;
    let submitted = client::submit(&mut operator, client::submission(matrix, runtime)?).await?;
    let last = client::watch(url, &submitted.run_id, Duration::from_secs(30), |_| {}).await?;
    Ok((submitted.run_id, last.run.unwrap_or_default()))
}

/// Every stored record of an attempt, in seq order.
pub fn records(
    store: &dyn Store,
    attempt: &benchfleet_study::model::AttemptKey,
) -> anyhow::Result<Vec<benchfleet_loadgen::RequestRecord>> {
    let mut records = store.records(attempt).collect::<Result<Vec<_>, _>>()?;
    records.sort_by_key(|r| r.seq);
    Ok(records)
}

/// Starts a controller over a sled store in `dir` and one in-process agent
/// with one simulated H200.
pub async fn start(dir: &Path) -> anyhow::Result<(LocalFleet, Arc<dyn Store>)> {
    start_with_gpus(dir, 1).await
}

/// The same with `gpus` simulated H200s on the agent.
pub async fn start_with_gpus(dir: &Path, gpus: u32) -> anyhow::Result<(LocalFleet, Arc<dyn Store>)> {
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&dir.join("store"))?);
    let work_dir = dir.join("agent");
    let fleet = LocalFleet::start(store.clone(), |controller_url| {
        let mut runtimes: HashMap<String, Arc<dyn EngineRuntime>> = HashMap::new();
        runtimes.insert("process".into(), Arc::new(InProcessSim));
        Ok(AgentConfig {
            controller_url,
            tls: Default::default(),
            name: "in-process".into(),
            gpus: Arc::new(SimGpuProbe::new("H200", gpus, "test")),
            runtimes,
            loadgen: Arc::new(InProcessLoadgen),
            work_dir,
            startup_timeout: Duration::from_secs(30),
            gpu_check_interval: Duration::from_secs(60),
            leave_grace: Duration::from_secs(10),
            price: None,
        })
    })
    .await?;
    Ok((fleet, store))
}
