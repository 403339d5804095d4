//! `benchfleet`: the operator command line.

use clap::Parser as _;

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = benchfleet_cli::cli::Cli::parse();
    std::process::exit(benchfleet_cli::cli::main(cli).await);
}
