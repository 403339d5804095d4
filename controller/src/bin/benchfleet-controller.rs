//! `benchfleet-controller`: the fleet's controller daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_controller::pki::{self, ServerTls};
use benchfleet_controller::{Controller, ControllerConfig, SledStore};
use benchfleet_core::config;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "benchfleet-controller",
    version,
    about = "benchfleet's controller",
    after_help = "Environment: the flags' variables (shown with each), RUST_LOG (the log filter), XDG_DATA_HOME and \
                  HOME (where the store lives without --data-dir).\n\nExit status: 0 after SIGINT or SIGTERM once \
                  what was acknowledged is stored; 1 on an error (a store it cannot open, an address in use); 70 \
                  when writing the scheduler's state to the store kept failing (a restart takes up from what was \
                  stored)."
)]
struct Args {
    /// A TOML file of these flags (each a key: its name with `_` for `-`, e.g. `lease_ttl_ms = 10000`); a flag or
    /// its variable beats the file, the file beats the default. See deploy/controller.example.toml.
    #[arg(long, env = "BENCHFLEET_CONTROLLER_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the configuration these flags, variables and file make (each value's source as a comment), and exit.
    #[arg(long)]
    print_config: bool,
    /// Address to serve gRPC on.
    #[arg(long, env = "BENCHFLEET_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    /// URL agents' loadgen reach this controller at (default: http://LISTEN).
    #[arg(long, env = "BENCHFLEET_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// Where the sled store lives.
    #[arg(long, env = "BENCHFLEET_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Where the CA, the controller's certificate and the ingest key live (`benchfleet certs init`); default
    /// DATA_DIR/pki.
    #[arg(long, env = "BENCHFLEET_PKI_DIR", value_name = "DIR")]
    pki_dir: Option<PathBuf>,
    /// The controller's certificate chain (PEM; default PKI_DIR/controller.pem).
    #[arg(long, env = "BENCHFLEET_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The controller's key (PEM; default PKI_DIR/controller-key.pem).
    #[arg(long, env = "BENCHFLEET_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The CA clients' certificates must chain to (PEM; default PKI_DIR/ca.pem).
    #[arg(long, env = "BENCHFLEET_CLIENT_CA", value_name = "FILE")]
    client_ca: Option<PathBuf>,
    /// How long an agent's identity lasts from its join or renewal (agents renew at 2/3 of it).
    #[arg(long, default_value_t = 7 * 24 * 3600, value_name = "S")]
    agent_identity_lifetime_s: u64,
    /// Serve plain text, unauthenticated, even on an address other hosts reach.
    #[arg(long)]
    insecure: bool,
    /// Address to serve Prometheus `/metrics` on (HTTP); "off" for none.
    #[arg(long, env = "BENCHFLEET_METRICS_LISTEN", default_value = "127.0.0.1:7071")]
    metrics_listen: String,
    #[command(flatten)]
    leases: LeaseArgs,
}

/// Leases and attempts (ARCHITECTURE.md: `sched`, and the invariants on attempts and epochs).
#[derive(clap::Args, Debug)]
struct LeaseArgs {
    /// How often agents send heartbeats.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    heartbeat_interval_ms: u64,
    /// An agent without a heartbeat this long gets no new work.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    suspect_after_ms: u64,
    /// An agent without a heartbeat this long loses its lease: its attempts are abandoned and run again elsewhere.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    lease_ttl_ms: u64,
    /// After this controller starts, no agent is declared lost before this much time has passed.
    #[arg(long, default_value_t = 30_000, value_name = "MS")]
    restart_grace_ms: u64,
    /// Attempts a job may fail on its own account before it fails for good.
    #[arg(long, default_value_t = 3)]
    attempt_cap: u32,
    /// How long one attempt may run from its engine's start.
    #[arg(long, default_value_t = 4 * 3600, value_name = "S")]
    attempt_deadline_s: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let spec = config::Spec { config: "config", print: "print_config", daemon: None, tables: &[] };
    let (args, layered) = config::parse::<Args>(&spec)?;
    if layered.print {
        print!("{}", layered.render());
        return Ok(());
    }
    let base = benchfleet_controller::store::data_dir(args.data_dir.as_deref());
    // Refused before anything binds or opens.
    let tls = server_tls(&args, &base)?;
    let dir = base.join("store");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let store = Arc::new(SledStore::open(&dir)?);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let advertised = match &args.advertise_url {
        Some(url) => url.clone(),
        // An address no one else can dial is advertised by the host's name
        // (which `certs init` puts in the controller's certificate).
        None if addr.ip().is_unspecified() => {
            format!("{scheme}://{}:{}", benchfleet_core::hostname().unwrap_or_else(|| "localhost".into()), addr.port())
        }
        None => format!("{scheme}://{addr}"),
    };
    let mut config = ControllerConfig::new(advertised);
    // With the CA's key at hand, agents can join and renew.
    if let Some(tls) = tls {
        config.secure(tls, &args.pki_dir.clone().unwrap_or_else(|| base.join("pki")))?;
    }
    config.agent_lifetime = Duration::from_secs(args.agent_identity_lifetime_s.max(3));
    let l = &args.leases;
    let ms = Duration::from_millis;
    config.sched.heartbeat_interval = ms(l.heartbeat_interval_ms.max(50));
    config.sched.suspect_after = ms(l.suspect_after_ms);
    config.sched.lease_ttl = ms(l.lease_ttl_ms);
    config.sched.restart_grace = ms(l.restart_grace_ms);
    config.sched.attempt_cap = l.attempt_cap.max(1);
    config.sched.attempt_deadline = Duration::from_secs(l.attempt_deadline_s);
    anyhow::ensure!(
        config.sched.lease_ttl > config.sched.heartbeat_interval * 2,
        "--lease-ttl-ms must be more than twice --heartbeat-interval-ms, or agents lose leases between heartbeats"
    );
    tracing::info!(%addr, store = %dir.display(), tls = config.tls.is_some(), "controller serving");
    let controller = Controller::start(store, config)?;
    if args.metrics_listen != "off" {
        let metrics = tokio::net::TcpListener::bind(&args.metrics_listen).await.with_context(|| {
            format!("cannot serve metrics on {} (--metrics-listen off to go without)", args.metrics_listen)
        })?;
        tracing::info!(addr = %metrics.local_addr()?, "metrics at /metrics");
        let stopping = controller.shutdown.clone();
        tokio::spawn(benchfleet_controller::metrics::serve(controller.clone(), metrics, stopping.cancelled_owned()));
    }
    let stop = stop_signal();
    if let Err(e) = benchfleet_core::notify::notify("READY=1") {
        tracing::warn!("cannot tell the service manager this controller is ready: {e}");
    }
    benchfleet_controller::serve(controller.clone(), listener, stop).await?;
    // The driver said why when it halted.
    if controller.halted().is_some() {
        std::process::exit(EXIT_HALTED);
    }
    tracing::info!("controller stopped");
    Ok(())
}

/// The exit status when the controller stopped itself because its store
/// kept refusing the scheduler's writes (EX_SOFTWARE).
const EXIT_HALTED: i32 = 70;

/// The TLS material, or none: plain text only on loopback, or with
/// --insecure (said at every start).
fn server_tls(args: &Args, base: &Path) -> anyhow::Result<Option<ServerTls>> {
    if args.insecure {
        tracing::warn!(
            listen = %args.listen,
            "--insecure: serving plain text; anyone who reaches this address can register agents, submit runs \
             and read results"
        );
        return Ok(None);
    }
    let pki = args.pki_dir.clone().unwrap_or_else(|| base.join("pki"));
    let given = args.tls_cert.is_some() || args.tls_key.is_some() || args.client_ca.is_some();
    let cert = args.tls_cert.clone().unwrap_or_else(|| pki.join(pki::CONTROLLER_CERT));
    let key = args.tls_key.clone().unwrap_or_else(|| pki.join(pki::CONTROLLER_KEY));
    let ca = args.client_ca.clone().unwrap_or_else(|| pki.join(pki::CA_CERT));
    if given || cert.exists() {
        return Ok(Some(ServerTls::read(&cert, &key, &ca)?));
    }
    anyhow::ensure!(
        listens_on_loopback(&args.listen),
        "refusing to serve {} in plain text: give --tls-cert, --tls-key and --client-ca (or run `benchfleet certs \
         init` for {}), or --insecure",
        args.listen,
        pki.display()
    );
    Ok(None)
}

/// Whether `HOST:PORT` is a loopback address (a name is looked up as the
/// client rule reads it: only `localhost`).
fn listens_on_loopback(listen: &str) -> bool {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().is_loopback(),
        Err(_) => listen.rsplit_once(':').is_some_and(|(host, _)| benchfleet_core::tls::is_loopback(host)),
    }
}

/// SIGTERM or SIGINT (Ctrl-C).
/// The handlers are installed when this is called, not when it is first
/// awaited: a SIGTERM right after READY=1 is a stop, not a kill.
fn stop_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: stopping"),
                _ = int.recv() => tracing::info!("SIGINT: stopping"),
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!("cannot watch for SIGTERM and SIGINT: {e}");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        if let Err(e) = benchfleet_core::notify::notify("STOPPING=1") {
            tracing::warn!("cannot tell the service manager this controller is stopping: {e}");
        }
    }
}
