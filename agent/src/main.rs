//! `benchfleet-agent`: the daemon an operator runs on every GPU host.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_agent::engine::{EnginePorts, EngineRuntime, ExternalRuntime, ProcessRuntime, ephemeral_range};
use benchfleet_agent::gpu::{GpuProbe, SimGpuProbe, SimSpeed};
use benchfleet_agent::identity;
use benchfleet_agent::load::ProcessLoadRunner;
use benchfleet_agent::nvml::NvmlProbe;
use benchfleet_agent::policy::EnginePolicy;
use benchfleet_agent::procs::PidDir;
use benchfleet_agent::verdict::Policy;
use benchfleet_agent::verify::{VerifyReport, all_usable, table, watch_xids};
use benchfleet_agent::{AgentConfig, Shutdown, find_binary};
use benchfleet_core::config;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "benchfleet-agent",
    version,
    about = "benchfleet's GPU host daemon",
    args_conflicts_with_subcommands = true,
    after_help = "Environment: the flags' variables (shown with each), HF_TOKEN (given to engines), \
                  RUST_LOG (the log filter), PATH (where benchfleet-loadgen and benchfleet-sim are found, beside \
                  the agent's own binary first).\n\nExit status: run: 0 after SIGINT or SIGTERM once its engines \
                  are stopped, 1 on an error; verify: 0 when every GPU is usable, 1 when one is not, 2 when the GPUs \
                  cannot be read."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand, the agent runs.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the agent: register with the controller and run the engine groups it assigns (the default).
    Run(Box<RunArgs>),
    /// Check this host's GPUs: print their inventory and whether each is usable.
    ///
    /// Exit code 0: every GPU is usable; 1: some GPU is not (the table says why), or reported an XID during
    /// --watch-xid-ms; 2: the GPUs could not be read.
    Verify(VerifyArgs),
    /// Enrol with the controller: pin its CA by hash, send a CSR with a join token, store the certificate in
    /// WORK_DIR/identity/. Touches neither the GPUs nor Docker; does nothing when a valid identity is there.
    ///
    /// Exit code 0: joined (or already); 1: refused or unreachable (the message says why).
    Join(JoinArgs),
}

#[derive(clap::Args, Debug)]
struct JoinArgs {
    /// The controller's URL (https://).
    #[arg(long, env = "BENCHFLEET_CONTROLLER")]
    controller: String,
    /// The join token (ID.SECRET) from `benchfleet token create`.
    #[arg(long, conflicts_with = "token_file", required_unless_present = "token_file")]
    token: Option<String>,
    /// A file holding the join token (keeps it out of `ps` and shell history).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// sha256:HEX of the controller's CA, as `benchfleet token create` printed it.
    #[arg(long)]
    ca_hash: String,
    /// The name to join as (default: the host name).
    #[arg(long, env = "BENCHFLEET_AGENT_NAME")]
    name: Option<String>,
    /// Where the identity goes (WORK_DIR/identity/); the agent's own --work-dir.
    #[arg(long, default_value = "/var/lib/benchfleet-agent")]
    work_dir: PathBuf,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The controller's gRPC URL. https:// uses the certificate `join` stored in WORK_DIR/identity/.
    #[arg(long, env = "BENCHFLEET_CONTROLLER", default_value = "http://127.0.0.1:7070")]
    controller: String,
    /// The agent's name in the fleet (default: the host name; under https://, its certificate's).
    #[arg(long, env = "BENCHFLEET_AGENT_NAME")]
    name: Option<String>,
    /// Allow an http:// controller URL to a host other than this one (plain text, unauthenticated).
    #[arg(long)]
    insecure: bool,
    /// Simulate GPUs instead of probing them: MODELxCOUNT, e.g. H200x8.
    #[arg(long, value_name = "MODELxCOUNT")]
    sim_gpus: Option<String>,
    /// Run engines as the simulator (benchfleet-sim) instead of real ones.
    #[arg(long)]
    sim_engines: bool,
    /// With --sim-engines and --sim-gpus: this host's simulated engines run at FACTOR of their modelled speed,
    /// their GPUs' clocks held down in proportion (to stage a slow host).
    #[arg(long, value_name = "FACTOR", value_parser = SimSpeed::factor)]
    sim_speed: Option<f64>,
    /// As --sim-speed, for one simulated GPU: INDEX=FACTOR (repeat for more).
    #[arg(long, value_name = "INDEX=FACTOR", value_parser = SimSpeed::parse_gpu)]
    sim_speed_gpu: Vec<(u32, f64)>,
    /// Where dataset files and other working files go.
    #[arg(long, default_value = "/var/lib/benchfleet-agent")]
    work_dir: std::path::PathBuf,
    /// How long an engine may take to serve.
    #[arg(long, default_value_t = 1800)]
    startup_timeout_s: u64,
    /// The ports engines listen on (on loopback): FIRST-LAST, outside the
    /// kernel's ephemeral range (net.ipv4.ip_local_port_range).
    #[arg(long, value_name = "FIRST-LAST", default_value = "20000-29999")]
    engine_ports: String,
    /// On SIGTERM, how long running groups may go on before they are given
    /// up (a second SIGTERM or SIGINT stops them at once).
    #[arg(long, default_value_t = 600)]
    leave_grace_s: u64,
    /// Address to serve Prometheus `/metrics`, `/healthz` and `/readyz` on (HTTP), e.g. 0.0.0.0:7072; none by
    /// default.
    #[arg(long, env = "BENCHFLEET_AGENT_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// What an hour of one of this host's GPUs costs, for the reports' cost (before the matrix's `cost:` price):
    /// for fleets of mixed prices.
    #[arg(long, value_name = "AMOUNT")]
    gpu_hour_price: Option<f64>,
    /// The currency of --gpu-hour-price (a code such as USD, EUR; shown, never converted).
    #[arg(long, value_name = "CODE", default_value = "USD")]
    gpu_hour_currency: String,
    /// Print the configuration these flags, variables and file make (each value's source as a comment), and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    docker: benchfleet_agent::docker::DockerArgs,
}

/// How the agent reads and judges its GPUs.
#[derive(clap::Args, Debug)]
struct GpuArgs {
    /// The agent's config file (TOML): every flag of `run` is a key (its name with `_` for `-`), the [gpu] table
    /// holds the GPU policy, the [engines] table what engines the agent runs (see deploy/agent.example.toml). A flag
    /// or its variable beats the file.
    #[arg(long, env = "BENCHFLEET_AGENT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// The NVML library to load instead of the NVIDIA driver's libnvidia-ml.so.1.
    #[arg(long, env = "BENCHFLEET_NVML_LIB", value_name = "FILE")]
    nvml_lib: Option<PathBuf>,
}

impl GpuArgs {
    /// The NVML probe with the config file's policy; `require` overrides its model.
    fn nvml_probe(&self, require: Option<String>) -> anyhow::Result<NvmlProbe> {
        let mut policy = match &self.config {
            Some(path) => Policy::from_file(path)?,
            None => Policy::default(),
        };
        if let Some(list) = require {
            policy.require_model = benchfleet_agent::verdict::models_of(&list);
        }
        Ok(NvmlProbe::new(self.nvml_lib.as_deref(), policy)?)
    }
}

#[derive(clap::Args, Debug)]
struct VerifyArgs {
    #[command(flatten)]
    gpu: GpuArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The models a GPU may be, matched on the product name, e.g. H200 or "H100,H200" (default: the config's
    /// require_model, else H100 and H200); "" accepts any GPU.
    #[arg(long, value_name = "MODELS")]
    require: Option<String>,
    /// Also watch the GPUs' XID events for this long before reading them: a GPU that reports one (other than those
    /// the config's ignore_xids lists) is not usable.
    #[arg(long, value_name = "MS")]
    watch_xid_ms: Option<u64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // bollard logs request and response bodies at debug level, and a
    // container's carry HF_TOKEN: its level is capped whatever RUST_LOG says.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info".into())
        .add_directive("bollard=info".parse().context("a fixed log directive")?);
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let spec =
        config::Spec { config: "config", print: "print_config", daemon: Some("run"), tables: &["gpu", "engines"] };
    let (cli, layered) = config::parse::<Cli>(&spec)?;
    if layered.print {
        print!("{}", layered.render());
        return Ok(ExitCode::SUCCESS);
    }
    match cli.command {
        Some(Command::Verify(args)) => verify(&args),
        Some(Command::Join(args)) => join(args).await,
        Some(Command::Run(args)) => run(*args).await.map(|()| ExitCode::SUCCESS),
        None => run(cli.run).await.map(|()| ExitCode::SUCCESS),
    }
}

/// Prints the GPUs' inventory and verdicts; the exit code says whether every
/// GPU is usable.
fn verify(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let read = args.gpu.nvml_probe(args.require.clone()).and_then(|probe| {
        let watch = args.watch_xid_ms.map(|ms| watch_xids(&probe, Duration::from_millis(ms)));
        Ok((probe.probe()?, watch))
    });
    let (gpus, watch) = match read {
        Ok((mut gpus, watch)) => {
            if let Some(watch) = &watch {
                watch.judge(&mut gpus);
            }
            (gpus, watch)
        }
        Err(e) => {
            if args.json {
                println!("{}", serde_json::json!({ "usable": false, "error": format!("{e:#}") }));
            }
            eprintln!("error: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&VerifyReport::new(&gpus, watch.as_ref()))?);
    } else {
        print!("{}", table(&gpus));
        if let Some(watch) = &watch {
            print!("{}", watch.text(&gpus));
        }
    }
    Ok(if all_usable(&gpus) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

async fn join(args: JoinArgs) -> anyhow::Result<ExitCode> {
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.clone(),
        (None, Some(file)) => {
            std::fs::read_to_string(file).with_context(|| format!("--token-file {}", file.display()))?.trim().to_owned()
        }
        (None, None) => anyhow::bail!("give --token or --token-file"),
    };
    let joined = identity::join(&args.controller, &token, &args.ca_hash, args.name.as_deref(), &args.work_dir).await?;
    let dir = identity::dir(&args.work_dir);
    match joined {
        identity::Joined::New { name, not_after_unix } => println!(
            "joined as '{name}': {} holds its certificate (until {}); start it with: benchfleet-agent --controller {} \
             --work-dir {}",
            dir.display(),
            when(not_after_unix),
            args.controller,
            args.work_dir.display()
        ),
        identity::Joined::Already { name, not_after_unix } => println!(
            "already joined as '{name}': {} holds a valid certificate (until {}); nothing to do",
            dir.display(),
            when(not_after_unix)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn when(unix: i64) -> String {
    benchfleet_core::utc(unix.saturating_mul(1000))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Who this agent is, before any GPU or Docker is touched.
    let (name, tls) = identity::resolve(&args.work_dir, &args.controller, args.name.as_deref(), args.insecure)?;
    identity::check_url(&args.controller, &tls)?;
    // What engines this agent runs: the config file's [engines] table.
    let mut policy = match &args.gpu.config {
        Some(path) => EnginePolicy::from_file(path)?,
        None => EnginePolicy::default(),
    };
    policy.simulator = args.sim_engines;
    let policy = Arc::new(policy);
    let mut sim_env = Vec::new();
    let sim_speed = SimSpeed { host: args.sim_speed, gpus: args.sim_speed_gpu.iter().copied().collect() };
    if sim_speed != SimSpeed::default() && !(args.sim_engines && args.sim_gpus.is_some()) {
        anyhow::bail!(
            "--sim-speed and --sim-speed-gpu stage a slow simulated host: they need --sim-engines and --sim-gpus"
        );
    }
    let gpus: Arc<dyn GpuProbe> = match &args.sim_gpus {
        Some(spec) => {
            let (model, count) = spec
                .split_once('x')
                .and_then(|(m, n)| Some((m.to_owned(), n.parse().ok()?)))
                .with_context(|| format!("--sim-gpus {spec}: expected MODELxCOUNT, e.g. H200x8"))?;
            // Simulated engines model the simulated GPU.
            sim_env.push(("BENCHFLEET_SIM_GPU".to_owned(), model.clone()));
            let mut probe = SimGpuProbe::new(model, count, name.clone());
            probe.speed = sim_speed.clone();
            Arc::new(probe)
        }
        None => Arc::new(args.gpu.nvml_probe(None)?),
    };
    // The controller shows the verdicts too; the host's own log says it first.
    for gpu in gpus.probe()? {
        if !gpu.usable() {
            tracing::warn!("GPU {} ({}) is not usable: {}", gpu.index, gpu.uuid, gpu.reasons.join("; "));
        }
    }
    let launcher = if args.sim_engines {
        let sim = find_binary("benchfleet-sim").context("benchfleet-sim not found beside this binary or on PATH")?;
        vec![sim.display().to_string()]
    } else {
        Vec::new()
    };
    let loadgen =
        find_binary("benchfleet-loadgen").context("benchfleet-loadgen not found beside this binary or on PATH")?;
    let (first, last) = EnginePorts::parse_range(&args.engine_ports).map_err(anyhow::Error::msg)?;
    EnginePorts::global().set_range(first, last, ephemeral_range()).map_err(anyhow::Error::msg)?;
    let pids = PidDir(args.work_dir.join("pids"));
    // Process engines get none of the agent's environment but what they need.
    let mut process_env = sim_env;
    process_env.extend(policy.passed_env());
    if let (false, Some(token)) = (args.sim_engines, &args.docker.hf_token) {
        process_env.push(("HF_TOKEN".to_owned(), token.expose().to_owned()));
    }
    let mut runtimes: Vec<(String, Arc<dyn EngineRuntime>)> = vec![
        (
            "process".into(),
            Arc::new(ProcessRuntime {
                launcher,
                env: process_env,
                pids: Some(pids.clone()),
                sim_speed: args.sim_engines.then_some(sim_speed),
                ..ProcessRuntime::default()
            }),
        ),
        ("external".into(), Arc::new(ExternalRuntime)),
    ];
    if let Some(docker) = benchfleet_agent::docker::runtime_from_args(&args.docker, &name).await? {
        runtimes.push(("docker".into(), Arc::new(docker)));
    }
    // Only what the policy allows is offered (and so told to the controller).
    let runtimes = policy.offered(runtimes);
    let mut offered: Vec<&str> = runtimes.keys().map(String::as_str).collect();
    offered.sort_unstable();
    tracing::info!(runtimes = ?offered, "offering engine runtimes");

    let price = args
        .gpu_hour_price
        .map(|p| benchfleet_core::cost::Price::checked(p, &args.gpu_hour_currency, false))
        .transpose()
        .map_err(|e| anyhow::anyhow!("--gpu-hour-price/--gpu-hour-currency: {e}"))?;
    let config = AgentConfig {
        price,
        controller_url: args.controller,
        tls,
        gpus,
        name,
        runtimes,
        loadgen: Arc::new(ProcessLoadRunner::new(loadgen, Some(pids), args.work_dir.join("loadgen"))),
        work_dir: args.work_dir,
        startup_timeout: Duration::from_secs(args.startup_timeout_s),
        gpu_check_interval: Duration::from_secs(60),
        leave_grace: Duration::from_secs(args.leave_grace_s),
    };
    let shutdown = Shutdown::new();
    let shared = benchfleet_agent::session::Shared::default();
    if let Some(addr) = &args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot serve metrics on {addr} (--metrics-listen)"))?;
        tracing::info!(addr = %listener.local_addr()?, "metrics at /metrics, probes at /healthz and /readyz");
        let (gpus, shared, stopped) = (config.gpus.clone(), shared.clone(), shutdown.now.clone());
        tokio::spawn(benchfleet_agent::observe::serve(gpus, shared, listener, stopped.cancelled_owned()));
    }
    let on_signal = shutdown.clone();
    // Installed before READY=1: a SIGTERM right after it is a leave, not a kill.
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    tokio::spawn(async move {
        // The first SIGTERM or SIGINT: leave (no new work, finish, exit);
        // the second: stop at once.
        let (Ok(mut term), Ok(mut int)) = (term, int) else {
            let _ = tokio::signal::ctrl_c().await;
            on_signal.now.cancel();
            return;
        };
        for n in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if n == 0 {
                tracing::info!("signalled: leaving (signal again to stop at once)");
                if let Err(e) = benchfleet_core::notify::notify("STOPPING=1") {
                    tracing::warn!("cannot tell the service manager this agent is stopping: {e}");
                }
                on_signal.leave.cancel();
            } else {
                tracing::info!("signalled again: stopping now");
                on_signal.now.cancel();
                return;
            }
        }
    });
    // Its GPUs and engine runtimes are checked: ready, whether or not the
    // controller answers yet (it reconnects on its own).
    if let Err(e) = benchfleet_core::notify::notify("READY=1") {
        tracing::warn!("cannot tell the service manager this agent is ready: {e}");
    }
    benchfleet_agent::run_with(config, shutdown, shared).await
}
