//! `benchfleet-controller`: the fleet's controller daemon.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use benchfleet_controller::{Controller, ControllerConfig, SledStore};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "benchfleet-controller", version, about = "benchfleet's controller")]
struct Args {
    /// Address to serve gRPC on.
    #[arg(long, env = "BENCHFLEET_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    /// URL agents' loadgen reach this controller at (default: http://LISTEN).
    #[arg(long, env = "BENCHFLEET_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// Where the sled store lives.
    #[arg(long, env = "BENCHFLEET_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let dir = benchfleet_controller::store::data_dir(args.data_dir.as_deref()).join("store");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let store = Arc::new(SledStore::open(&dir)?);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let advertise_url = args.advertise_url.unwrap_or_else(|| format!("http://{addr}"));
    tracing::info!(%addr, store = %dir.display(), "controller serving");
    let controller = Controller::new(store, ControllerConfig { advertise_url })?;
    benchfleet_controller::serve(controller, listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
