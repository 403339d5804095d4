//! `benchfleet-loadgen`: the command-line face of the library, with flags
//! modelled on `vllm bench serve`.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use benchfleet_loadgen::{
    Arrival, Dataset, Endpoint, LoadConfig, Progress, SinkConfig, read_sharegpt, render_block, run,
};
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(name = "benchfleet-loadgen", version, about = "OpenAI-compatible streaming load generator")]
struct Args {
    /// The server's root URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// The API path: /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    endpoint: String,
    /// The served model name.
    #[arg(long)]
    model: String,
    /// Where prompts come from.
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    dataset_name: DatasetName,
    /// The ShareGPT JSON file, for --dataset-name sharegpt.
    #[arg(long)]
    dataset_path: Option<PathBuf>,
    /// Prompt tokens of each random request.
    #[arg(long, default_value_t = 1024)]
    random_input_len: u32,
    /// Output tokens of each random request.
    #[arg(long, default_value_t = 128)]
    random_output_len: u32,
    /// Output tokens of each ShareGPT request, instead of the recorded reply's.
    #[arg(long)]
    sharegpt_output_len: Option<u32>,
    /// Seed of the random prompts and the Poisson arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    num_prompts: usize,
    /// Requests per second; inf sends them all at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    request_rate: f64,
    /// Arrival process when a rate is given (default poisson).
    #[arg(long, value_enum)]
    arrival: Option<ArrivalName>,
    /// Most requests in flight at once (no cap when absent).
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Sent as `Authorization: Bearer`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Seconds without data before a request times out.
    #[arg(long, default_value_t = 600.0)]
    idle_timeout: f64,
    /// Seconds one request may take in all.
    #[arg(long, default_value_t = 21600.0)]
    timeout: f64,
    /// The controller's gRPC URL to stream records to (needs --run-id, --job,
    /// --attempt).
    #[arg(long, requires_all = ["run_id", "job", "attempt"])]
    report_to: Option<String>,
    /// The run the records belong to, for --report-to.
    #[arg(long)]
    run_id: Option<String>,
    /// The job within the run, for --report-to.
    #[arg(long)]
    job: Option<u64>,
    /// The attempt of the job, for --report-to.
    #[arg(long)]
    attempt: Option<u32>,
    /// Write every request record here, one JSON object per line.
    #[arg(long)]
    save_records: Option<PathBuf>,
    /// Write the summary here as JSON.
    #[arg(long)]
    save_summary: Option<PathBuf>,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DatasetName {
    Random,
    Sharegpt,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ArrivalName {
    Constant,
    Poisson,
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let result = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(start(Args::parse())));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> anyhow::Result<()> {
    let Some(endpoint) = Endpoint::from_path(&args.endpoint) else {
        bail!("unknown endpoint {}: use /v1/completions or /v1/chat/completions", args.endpoint);
    };
    let dataset = match args.dataset_name {
        DatasetName::Random => Dataset::Random {
            input_tokens: args.random_input_len,
            output_tokens: args.random_output_len,
            seed: args.seed,
        },
        DatasetName::Sharegpt => {
            let path = args.dataset_path.as_deref().context("--dataset-name sharegpt needs --dataset-path")?;
            Dataset::ShareGpt { data: read_sharegpt(path)?, output_tokens: args.sharegpt_output_len }
        }
    };
    let rate = args.request_rate.is_finite().then_some(args.request_rate);
    let arrival = match args.arrival {
        Some(ArrivalName::Constant) => Arrival::Constant,
        Some(ArrivalName::Poisson) | None => Arrival::Poisson { seed: args.seed },
    };
    let seconds = |name: &str, s: f64| {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("{name} must be positive seconds, got {s}"))
    };
    let progress = Arc::new(Progress::default());
    let mut config = LoadConfig::new(args.base_url, args.model, dataset, args.num_prompts);
    config.endpoint = endpoint;
    config.request_rate = rate;
    config.arrival = arrival;
    config.max_concurrency = args.max_concurrency;
    config.api_key = args.api_key;
    config.idle_timeout = seconds("--idle-timeout", args.idle_timeout)?;
    config.total_timeout = seconds("--timeout", args.timeout)?;
    config.progress = Some(Arc::clone(&progress));
    let sink = match (args.report_to, args.run_id, args.job, args.attempt) {
        (Some(url), Some(run_id), Some(job), Some(attempt)) => Some(SinkConfig::new(url, run_id, job, attempt)),
        _ => None,
    };

    let reporter = (!args.quiet).then(|| tokio::spawn(report_progress(progress, args.num_prompts as u64)));
    let result = run(config, sink).await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    let result = result?;

    if let Some(path) = &args.save_records {
        let write = || -> std::io::Result<()> {
            let mut out = BufWriter::new(std::fs::File::create(path)?);
            for record in &result.records {
                serde_json::to_writer(&mut out, record)?;
                out.write_all(b"\n")?;
            }
            out.flush()
        };
        write().with_context(|| format!("cannot write records to {}", path.display()))?;
    }
    if let Some(path) = &args.save_summary {
        let json = serde_json::to_vec_pretty(&result.summary).context("cannot encode the summary")?;
        std::fs::write(path, json).with_context(|| format!("cannot write the summary to {}", path.display()))?;
    }
    print!("{}", render_block(&result.summary));
    Ok(())
}

/// Progress on stderr: a bar on a terminal, else a line every few seconds
/// (logs of headless runs stay readable).
async fn report_progress(progress: Arc<Progress>, total: u64) {
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests, {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        loop {
            bar.set_position(progress.done());
            bar.set_message(format!("{} failed", progress.failed()));
            if progress.done() >= total {
                bar.finish();
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tick.tick().await;
        eprintln!("progress: {}/{total} requests done, {} failed", progress.done(), progress.failed());
        if progress.done() >= total {
            return;
        }
    }
}
