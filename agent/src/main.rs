//! `benchfleet-agent`: the daemon an operator runs on every GPU host.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_agent::engine::{EngineRuntime, ExternalRuntime, ProcessRuntime};
use benchfleet_agent::gpu::SimGpuProbe;
use benchfleet_agent::load::ProcessLoadRunner;
use benchfleet_agent::{AgentConfig, find_binary};
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(name = "benchfleet-agent", version, about = "benchfleet's GPU host daemon")]
struct Args {
    /// The controller's gRPC URL.
    #[arg(long, env = "BENCHFLEET_CONTROLLER", default_value = "http://127.0.0.1:7070")]
    controller: String,
    /// The agent's name in the fleet (default: the host name).
    #[arg(long, env = "BENCHFLEET_AGENT_NAME")]
    name: Option<String>,
    /// Simulate GPUs instead of probing them: MODELxCOUNT, e.g. H200x8.
    #[arg(long, value_name = "MODELxCOUNT")]
    sim_gpus: Option<String>,
    /// Run engines as the simulator (benchfleet-sim) instead of real ones.
    #[arg(long)]
    sim_engines: bool,
    /// Where dataset files and other working files go.
    #[arg(long, default_value = "/var/lib/benchfleet-agent")]
    work_dir: std::path::PathBuf,
    /// How long an engine may take to serve.
    #[arg(long, default_value_t = 1800)]
    startup_timeout_s: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let Some(spec) = &args.sim_gpus else {
        anyhow::bail!("no NVIDIA driver support in this build yet; run with --sim-gpus MODELxCOUNT (e.g. H200x8)");
    };
    let (model, count) = spec
        .split_once('x')
        .and_then(|(m, n)| Some((m.to_owned(), n.parse().ok()?)))
        .with_context(|| format!("--sim-gpus {spec}: expected MODELxCOUNT, e.g. H200x8"))?;
    let name = args.name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "agent".to_owned(), |h| h.trim().to_owned())
    });
    let launcher = if args.sim_engines {
        let sim = find_binary("benchfleet-sim").context("benchfleet-sim not found beside this binary or on PATH")?;
        vec![sim.display().to_string()]
    } else {
        Vec::new()
    };
    let loadgen =
        find_binary("benchfleet-loadgen").context("benchfleet-loadgen not found beside this binary or on PATH")?;
    let mut runtimes: HashMap<String, Arc<dyn EngineRuntime>> = HashMap::new();
    runtimes.insert("process".into(), Arc::new(ProcessRuntime { launcher }));
    runtimes.insert("external".into(), Arc::new(ExternalRuntime));

    let config = AgentConfig {
        controller_url: args.controller,
        gpus: Arc::new(SimGpuProbe { model, count, host: name.clone() }),
        name,
        runtimes,
        loadgen: Arc::new(ProcessLoadRunner { binary: loadgen }),
        work_dir: args.work_dir,
        startup_timeout: Duration::from_secs(args.startup_timeout_s),
    };
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    benchfleet_agent::run(config, shutdown).await
}
