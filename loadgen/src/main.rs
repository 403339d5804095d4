//! `benchfleet-loadgen`: the command-line face of the library, with flags
//! modelled on `vllm bench serve`.

use std::io::{BufWriter, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use benchfleet_loadgen::block::render_self_check;
use benchfleet_loadgen::output::{summary_json, write_csv, write_jsonl, write_summary_csv};
use benchfleet_loadgen::{
    Arrival, Dataset, Endpoint, Lengths, LoadConfig, LoadResult, Progress, SinkConfig, TokenCounter, Window,
    read_sharegpt, render_block, run,
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
    /// Where prompts come from: random text, prompts sharing prefixes
    /// (prefix), or a ShareGPT file.
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    dataset_name: DatasetName,
    /// The model's tokenizer.json (or a directory holding it): exact token
    /// counts for prompts and replies. Without it one word is one token.
    #[arg(long)]
    processor: Option<PathBuf>,
    /// The ShareGPT JSON file, for --dataset-name sharegpt.
    #[arg(long)]
    dataset_path: Option<PathBuf>,
    /// Prompt tokens of each random request.
    #[arg(long, default_value_t = 1024)]
    random_input_len: u32,
    /// Output tokens of each random request.
    #[arg(long, default_value_t = 128)]
    random_output_len: u32,
    /// Standard deviation of the random input lengths (0: all exact).
    #[arg(long, default_value_t = 0.0)]
    random_input_std: f64,
    /// Shortest random input.
    #[arg(long)]
    random_input_min: Option<u32>,
    /// Longest random input.
    #[arg(long)]
    random_input_max: Option<u32>,
    /// Standard deviation of the random output lengths (0: all exact).
    #[arg(long, default_value_t = 0.0)]
    random_output_std: f64,
    /// Shortest random output.
    #[arg(long)]
    random_output_min: Option<u32>,
    /// Longest random output.
    #[arg(long)]
    random_output_max: Option<u32>,
    /// Groups of prompts sharing a prefix, for --dataset-name prefix.
    #[arg(long, default_value_t = 8)]
    prefix_groups: u32,
    /// Tokens of each shared prefix; each prompt adds --random-input-len of
    /// its own.
    #[arg(long, default_value_t = 512)]
    prefix_len: u32,
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
    /// Most requests in flight at once (no cap when absent; never a hidden
    /// one). With no rate it makes a closed loop of this many users.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// A load profile instead of --request-rate/--arrival/--max-concurrency:
    /// synchronous (one at a time), throughput (all at once), or sweep
    /// (synchronous, throughput, then --sweep-steps rates between).
    #[arg(long, value_enum)]
    profile: Option<ProfileName>,
    /// Rates a sweep tries between the synchronous and the throughput rate.
    #[arg(long, default_value_t = 5)]
    sweep_steps: usize,
    /// Stop sending after this many seconds; requests in flight then are
    /// recorded as cancelled.
    #[arg(long)]
    max_duration: Option<f64>,
    /// Requests at the start that are recorded but not measured.
    #[arg(long, conflicts_with = "warmup_time")]
    warmup: Option<usize>,
    /// Seconds at the start whose requests are recorded but not measured.
    #[arg(long)]
    warmup_time: Option<f64>,
    /// Requests at the end that are recorded but not measured.
    #[arg(long, conflicts_with = "cooldown_time")]
    cooldown: Option<usize>,
    /// Seconds at the end whose requests are recorded but not measured.
    #[arg(long)]
    cooldown_time: Option<f64>,
    /// Ask for whole responses instead of streams (TTFT is then the latency).
    #[arg(long)]
    no_stream: bool,
    /// Ask the server to ignore end-of-sequence, so every reply has exactly
    /// its max_tokens (random datasets always do).
    #[arg(long)]
    ignore_eos: bool,
    /// A JSON object merged into every request body, e.g. '{"temperature":0}'.
    #[arg(long)]
    extra_body: Option<String>,
    /// The P99 dispatch lag (ms) above which the run is marked INVALID.
    #[arg(long, default_value_t = 5.0)]
    lag_limit_ms: f64,
    /// Percentiles (0 to 100) of latency, TTFT, TPOT and ITL to report, e.g.
    /// 50,90,95,99. The block shows P95 and P99 (N/A when not asked); the
    /// JSON summary and --save-summary-csv carry every one.
    #[arg(long, value_delimiter = ',', default_values_t = benchfleet_loadgen::DEFAULT_PERCENTILES)]
    percentiles: Vec<f64>,
    /// Exit with status 3 when the run is INVALID.
    #[arg(long)]
    fail_on_invalid: bool,
    /// Sent as `Authorization: Bearer`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A PEM file of CA certificates to trust for an https server, besides
    /// the system's (a lab's own CA, a self-signed server).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Seconds to open a connection before the request times out.
    #[arg(long, default_value_t = 10.0)]
    connect_timeout: f64,
    /// Seconds from the send to the first token before the request times out.
    #[arg(long, default_value_t = 600.0)]
    first_token_timeout: f64,
    /// Seconds without data between chunks before a request times out.
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
    /// The lease epoch the attempt was granted under, for --report-to.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// MiB of records not yet acknowledged by the controller kept in memory,
    /// for --report-to; past it they wait in a temporary file.
    #[arg(long, default_value_t = 16)]
    report_buffer_mib: usize,
    /// Write every request record here, one JSON object per line.
    #[arg(long)]
    save_records: Option<PathBuf>,
    /// Write the summary here as JSON.
    #[arg(long)]
    save_summary: Option<PathBuf>,
    /// Write one CSV row per request here.
    #[arg(long)]
    save_csv: Option<PathBuf>,
    /// Write the latency metrics with every asked percentile here as CSV.
    #[arg(long)]
    save_summary_csv: Option<PathBuf>,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DatasetName {
    Random,
    Prefix,
    Sharegpt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProfileName {
    Synchronous,
    Throughput,
    Sweep,
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
        // The certificate verifier logs a failure it also returns: the run's
        // error says it once, with what to do.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rustls_platform_verifier=off".into()),
        )
        .init();
    let result = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(start(Args::parse())));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> anyhow::Result<ExitCode> {
    let config = load_config(&args)?;
    let sink = match (&args.report_to, &args.run_id, args.job, args.attempt) {
        (Some(url), Some(run_id), Some(job), Some(attempt)) => {
            let mut sink = SinkConfig::new(url.clone(), run_id.clone(), job, attempt);
            sink.epoch = args.epoch;
            sink.memory_bytes = args.report_buffer_mib.saturating_mul(1 << 20);
            Some(sink)
        }
        _ => None,
    };
    // Ctrl-C ends the run early; what was sent is still recorded.
    let stop = config.stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });

    let mut invalid = false;
    if args.profile == Some(ProfileName::Sweep) {
        if sink.is_some() {
            bail!("--profile sweep makes several runs and cannot stream them to --report-to: run each rate as a job");
        }
        let mut summaries = Vec::new();
        let step = |name: String, config: LoadConfig, args: &Args| {
            let quiet = args.quiet;
            async move {
                println!("--- sweep: {name} ---");
                let result = run_one(config, None, quiet).await?;
                Ok::<_, anyhow::Error>(result)
            }
        };
        let mut sync = config.clone();
        (sync.request_rate, sync.max_concurrency) = (None, Some(1));
        let low = step("synchronous".into(), sync, &args).await?;
        let mut all = config.clone();
        (all.request_rate, all.max_concurrency) = (None, None);
        let high = step("throughput".into(), all, &args).await?;
        let (lo, hi) = (low.summary.request_throughput, high.summary.request_throughput);
        let mut results = vec![("synchronous".to_owned(), low), ("throughput".to_owned(), high)];
        for rate in benchfleet_loadgen::schedule::sweep_rates(lo, hi, args.sweep_steps) {
            let mut c = config.clone();
            (c.request_rate, c.max_concurrency) = (Some(rate), args.max_concurrency);
            let name = format!("{rate:.2} req/s");
            results.push((name.clone(), step(name, c, &args).await?));
        }
        for (i, (name, result)) in results.iter().enumerate() {
            invalid |= result.summary.invalid.is_some();
            save(&args, result, Some(i))?;
            summaries.push(serde_json::json!({ "step": name, "summary": result.summary }));
        }
        if let Some(path) = &args.save_summary {
            let json = serde_json::to_vec_pretty(&summaries).context("cannot encode the summaries")?;
            std::fs::write(path, json).with_context(|| format!("cannot write the summaries to {}", path.display()))?;
        }
    } else {
        let result = run_one(config, sink, args.quiet).await?;
        save(&args, &result, None)?;
        if let Some(path) = &args.save_summary {
            let json = summary_json(&result.summary).context("cannot encode the summary")?;
            std::fs::write(path, json).with_context(|| format!("cannot write the summary to {}", path.display()))?;
        }
        invalid = result.summary.invalid.is_some();
    }
    Ok(if invalid && args.fail_on_invalid { ExitCode::from(3) } else { ExitCode::SUCCESS })
}

/// The run the flags describe.
fn load_config(args: &Args) -> anyhow::Result<LoadConfig> {
    let Some(endpoint) = Endpoint::from_path(&args.endpoint) else {
        bail!("unknown endpoint {}: use /v1/completions or /v1/chat/completions", args.endpoint);
    };
    let tokens = match &args.processor {
        Some(path) => TokenCounter::load(path)?,
        None => TokenCounter::Words,
    };
    let lengths = |mean: u32, std: f64, min: Option<u32>, max: Option<u32>| Lengths {
        mean,
        std,
        min: min.unwrap_or(if std > 0.0 { 1 } else { mean }),
        max: max.unwrap_or(if std > 0.0 { u32::MAX } else { mean }),
    };
    let dataset = match args.dataset_name {
        DatasetName::Random if args.random_input_std == 0.0 && args.random_output_std == 0.0 => {
            let exact = [args.random_input_min, args.random_input_max, args.random_output_min, args.random_output_max];
            if exact.iter().any(Option::is_some) {
                bail!("--random-*-min/max need a --random-*-std above 0");
            }
            Dataset::Random {
                input_tokens: args.random_input_len,
                output_tokens: args.random_output_len,
                seed: args.seed,
            }
        }
        DatasetName::Random => Dataset::RandomSpread {
            input: lengths(args.random_input_len, args.random_input_std, args.random_input_min, args.random_input_max),
            output: lengths(
                args.random_output_len,
                args.random_output_std,
                args.random_output_min,
                args.random_output_max,
            ),
            seed: args.seed,
        },
        DatasetName::Prefix => Dataset::SharedPrefix {
            groups: args.prefix_groups,
            prefix_tokens: args.prefix_len,
            suffix_tokens: args.random_input_len,
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
    let mut config = LoadConfig::new(args.base_url.clone(), args.model.clone(), dataset, args.num_prompts);
    config.endpoint = endpoint;
    config.request_rate = rate;
    config.arrival = arrival;
    config.max_concurrency = args.max_concurrency;
    match args.profile {
        Some(ProfileName::Synchronous) => (config.request_rate, config.max_concurrency) = (None, Some(1)),
        Some(ProfileName::Throughput) => (config.request_rate, config.max_concurrency) = (None, None),
        Some(ProfileName::Sweep) | None => {}
    }
    config.api_key = args.api_key.clone();
    config.ca_cert = args.ca_cert.clone();
    config.connect_timeout = seconds("--connect-timeout", args.connect_timeout)?;
    config.first_token_timeout = seconds("--first-token-timeout", args.first_token_timeout)?;
    config.idle_timeout = seconds("--idle-timeout", args.idle_timeout)?;
    config.total_timeout = seconds("--timeout", args.timeout)?;
    config.max_duration = args.max_duration.map(|s| seconds("--max-duration", s)).transpose()?;
    config.warmup = match (args.warmup, args.warmup_time) {
        (Some(n), _) => Window::Requests(n),
        (None, Some(s)) => Window::Time(seconds("--warmup-time", s)?),
        (None, None) => Window::None,
    };
    config.cooldown = match (args.cooldown, args.cooldown_time) {
        (Some(n), _) => Window::Requests(n),
        (None, Some(s)) => Window::Time(seconds("--cooldown-time", s)?),
        (None, None) => Window::None,
    };
    config.stream = !args.no_stream;
    if let Some(extra) = &args.extra_body {
        let value: serde_json::Value = serde_json::from_str(extra).context("--extra-body is not valid JSON")?;
        let serde_json::Value::Object(fields) = value else {
            bail!("--extra-body must be a JSON object, got {extra}");
        };
        config.extra_body = fields;
    }
    if args.ignore_eos {
        config.extra_body.insert("ignore_eos".into(), serde_json::Value::Bool(true));
    }
    config.lag_limit_ms = args.lag_limit_ms;
    config.percentiles = args.percentiles.clone();
    config.tokens = tokens;
    Ok(config)
}

/// One run with its progress display; prints its blocks.
async fn run_one(mut config: LoadConfig, sink: Option<SinkConfig>, quiet: bool) -> anyhow::Result<LoadResult> {
    let progress = Arc::new(Progress::default());
    config.progress = Some(Arc::clone(&progress));
    let total = config.num_requests as u64;
    let reporter = (!quiet).then(|| tokio::spawn(report_progress(progress, total)));
    let result = run(config, sink).await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    let result = result?;
    print!("{}", render_block(&result.summary));
    print!("{}", render_self_check(&result.summary));
    Ok(result)
}

/// Writes the records as JSONL and CSV where asked; `step` numbers the runs
/// of a sweep.
fn save(args: &Args, result: &LoadResult, step: Option<usize>) -> anyhow::Result<()> {
    let named = |path: &Path| match step {
        None => path.to_owned(),
        Some(i) => {
            let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
            path.with_extension(format!("{i}.{ext}"))
        }
    };
    if let Some(path) = args.save_records.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_jsonl(&mut BufWriter::new(f), &result.records))
            .with_context(|| format!("cannot write records to {}", path.display()))?;
    }
    if let Some(path) = args.save_csv.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_csv(&mut BufWriter::new(f), &result.records))
            .with_context(|| format!("cannot write the CSV to {}", path.display()))?;
    }
    if let Some(path) = args.save_summary_csv.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_summary_csv(&mut BufWriter::new(f), &result.summary))
            .with_context(|| format!("cannot write the summary CSV to {}", path.display()))?;
    }
    Ok(())
}

/// Progress on stderr: a bar on a terminal, else a line every few seconds
/// (logs of headless runs stay readable).
async fn report_progress(progress: Arc<Progress>, total: u64) {
    let started = Instant::now();
    let status = || {
        let (done, secs) = (progress.done(), started.elapsed().as_secs_f64());
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 { format!("{:.0}s", total.saturating_sub(done) as f64 / rate) } else { "?".into() };
        format!("{rate:.1} req/s, {} in flight, {} failed, eta {eta}", progress.sent() - done, progress.failed())
    };
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests, {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        loop {
            bar.set_position(progress.done());
            bar.set_message(status());
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
        eprintln!("progress: {}/{total} requests done, {}", progress.done(), status());
        if progress.done() >= total {
            return;
        }
    }
}
