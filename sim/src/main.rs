//! `benchfleet-sim`: parses an engine command line, binds, and serves until SIGINT or SIGTERM.

use std::process::ExitCode;

use anyhow::Context as _;
use benchfleet_sim::{SimConfig, parse_command_line, serve};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    // As argparse does, --help anywhere prints the usage and exits 0.
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", benchfleet_sim::help());
        return if args.is_empty() { ExitCode::from(2) } else { ExitCode::SUCCESS };
    }
    if args.first().map(String::as_str) == Some("sharegpt-like") {
        return write_sharegpt_like(&args[1..]);
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("benchfleet-sim {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let config = match parse_command_line(&args) {
        Ok(config) => config,
        Err(err) => {
            // Exit code 2 and `error:` as argparse does, so callers see the engine's behaviour.
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in the agent's log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .init();
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Exit code 1, as a Python engine that raised: out of memory, a crash, a port in use.
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `benchfleet-sim sharegpt-like [CONVERSATIONS [SEED]]`: a ShareGPT stand-in on stdout.
fn write_sharegpt_like(args: &[String]) -> ExitCode {
    let number = |i: usize, name: &str, default: u64| match args.get(i) {
        None => Ok(default),
        Some(text) => text.parse::<u64>().map_err(|_| format!("{name} must be a whole number, not {text:?}")),
    };
    let parsed = number(0, "CONVERSATIONS", 1000).and_then(|count| Ok((count, number(1, "SEED", 42)?)));
    match parsed {
        Ok((count, _)) if count == 0 || count > 1_000_000 => {
            eprintln!("error: CONVERSATIONS must be 1 to 1000000, not {count}");
            ExitCode::from(2)
        }
        Ok((count, seed)) if args.len() <= 2 => {
            let file = benchfleet_sim::simulate::sharegpt_like_file(count as usize, seed);
            println!("{file}");
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("error: usage: benchfleet-sim sharegpt-like [CONVERSATIONS [SEED]]");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

async fn run(config: SimConfig) -> anyhow::Result<()> {
    let address = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("cannot listen on {address}: is another server using the port?"))?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    if !config.unmodelled.is_empty() {
        // The engine takes these; the simulator runs as if they were not given.
        tracing::warn!(
            "taken as {} takes them but not simulated (the run goes as without them): {}",
            config.engine,
            config.unmodelled.join(", ")
        );
    }
    tracing::info!(
        engine = %config.engine,
        model = %config.served_model_name,
        gpu = config.gpu.name,
        "benchfleet-sim listening on {address}"
    );
    let shutdown = async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down after in-flight requests finish");
    };
    serve(config, listener, shutdown).await
}
