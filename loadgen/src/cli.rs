//! The command line of `benchfleet-loadgen`, flags modelled on `vllm bench
//! serve`, and what they make: the job's load as the fleet types it
//! ([`Args::spec`], [`Args::target`]: what `LoadSpec::to_args` wrote, read
//! back by this one parser), the run's [`LoadConfig`] and where its records
//! go ([`SinkConfig`]). In the library so that whoever starts loadgen
//! in-process (the end-to-end tests) goes through the very flags the agent
//! gives the binary.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use benchfleet_core::load::{self, LoadDataset, LoadSpec, LoadTarget, ReportTo, StoredFile, TraceFormat};
use clap::{Parser, ValueEnum};

use crate::{
    Arrival, Dataset, Endpoint, Lengths, LoadConfig, SinkConfig, TokenCounter, Window, read_sharegpt_with, read_trace,
};

#[derive(Parser, Debug)]
#[command(
    name = "benchfleet-loadgen",
    version,
    about = "OpenAI-compatible streaming load generator",
    after_help = "Environment: OPENAI_API_KEY (as --api-key), BENCHFLEET_INGEST_TOKEN (the attempt's ingest credential, for --report-to), RUST_LOG (the log filter).\n\nExit status: 0 when the run completed; 1 on an error (a flag's value refused, a server that \
                  cannot be reached, a dataset that cannot be read); 2 when the command line does not parse; 3 with \
                  --fail-on-invalid when the run is INVALID; 4 when requests were sent and none succeeded. \
                  --outcome-file FILE says the same as JSON, with the error (docs/loadgen.md)."
)]
pub struct Args {
    /// The server's root URL.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// The API path: /v1/completions or /v1/chat/completions.
    #[arg(long, default_value = "/v1/completions")]
    pub endpoint: String,
    /// The served model name.
    #[arg(long)]
    pub model: String,
    /// Where prompts come from: random text, prompts sharing prefixes
    /// (prefix), a ShareGPT file, a request trace, or multi-turn sessions
    /// of random user turns (multi-turn: --random-input-len words a user
    /// turn, --random-output-len tokens a reply).
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    pub dataset_name: DatasetName,
    /// The model's tokenizer.json (or a directory holding it): exact token
    /// counts for prompts and replies. Without it one word is one token.
    #[arg(long)]
    pub processor: Option<PathBuf>,
    /// The ShareGPT JSON file, for --dataset-name sharegpt.
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Prompt tokens of each random request.
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u32,
    /// Output tokens of each random request.
    #[arg(long, default_value_t = 128)]
    pub random_output_len: u32,
    /// Standard deviation of the random input lengths (0: all exact).
    #[arg(long, default_value_t = 0.0)]
    pub random_input_std: f64,
    /// Shortest random input.
    #[arg(long)]
    pub random_input_min: Option<u32>,
    /// Longest random input.
    #[arg(long)]
    pub random_input_max: Option<u32>,
    /// Standard deviation of the random output lengths (0: all exact).
    #[arg(long, default_value_t = 0.0)]
    pub random_output_std: f64,
    /// Shortest random output.
    #[arg(long)]
    pub random_output_min: Option<u32>,
    /// Longest random output.
    #[arg(long)]
    pub random_output_max: Option<u32>,
    /// Groups of prompts sharing a prefix, for --dataset-name prefix.
    #[arg(long, default_value_t = 8)]
    pub prefix_groups: u32,
    /// Tokens of each shared prefix; each prompt adds --random-input-len of
    /// its own.
    #[arg(long, default_value_t = 512)]
    pub prefix_len: u32,
    /// Output tokens of each ShareGPT request, instead of the recorded reply's.
    #[arg(long)]
    pub sharegpt_output_len: Option<u32>,
    /// Send each ShareGPT conversation as a multi-turn session: its user
    /// turns in order, each carrying the conversation so far with the
    /// replies the server gave, --multi-turn-think-ms after the previous
    /// reply; --num-prompts counts turns, the rate and --max-concurrency
    /// are of sessions.
    #[arg(long)]
    pub sharegpt_sessions: bool,
    /// The form of the --dataset-path trace, for --dataset-name trace:
    /// Mooncake's (timestamp, input_length, output_length, hash_ids) or
    /// JSON Lines of the same fields, hash_ids optional, or a prompt.
    #[arg(long, value_enum, default_value_t = TraceFormatName::Mooncake)]
    pub trace_format: TraceFormatName,
    /// Replay the trace this many times as fast as it was recorded.
    #[arg(long, default_value_t = 1.0)]
    pub trace_speed: f64,
    /// User turns of each session, for --dataset-name multi-turn: each
    /// carries the conversation so far; --num-prompts counts turns, and
    /// the rate, arrivals and --max-concurrency are of sessions.
    #[arg(long, default_value_t = 5)]
    pub multi_turn_turns: u32,
    /// Milliseconds between a reply's end and the session's next turn.
    #[arg(long, default_value_t = 0)]
    pub multi_turn_think_ms: u64,
    /// Seed of the prompts (random and prefix datasets; the order of a
    /// ShareGPT file's conversations) and, without --arrival-seed, of the
    /// Poisson arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send a ShareGPT file's conversations in file order, not shuffled by
    /// --seed.
    #[arg(long)]
    pub disable_shuffle: bool,
    /// Seed of the Poisson arrivals, when it differs from --seed.
    #[arg(long)]
    pub arrival_seed: Option<u64>,
    /// Requests to send.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Requests per second; inf sends them all at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Arrival process when a rate is given (default poisson).
    #[arg(long, value_enum)]
    pub arrival: Option<ArrivalName>,
    /// Most requests in flight at once (no cap when absent; never a hidden
    /// one). With no rate it makes a closed loop of this many users.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Threads the requests run on, each with its own connections and an
    /// even share of the schedule and the cap (default: the cores this
    /// process may use; never more than the cap or the requests).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: Option<u16>,
    /// A load profile instead of --request-rate/--arrival/--max-concurrency:
    /// synchronous (one at a time), throughput (all at once), or sweep
    /// (synchronous, throughput, then --sweep-steps rates between).
    #[arg(long, value_enum)]
    pub profile: Option<ProfileName>,
    /// Rates a sweep tries between the synchronous and the throughput rate.
    #[arg(long, default_value_t = 5)]
    pub sweep_steps: usize,
    /// Stop sending after this many seconds; requests in flight then are
    /// recorded as cancelled.
    #[arg(long)]
    pub max_duration: Option<f64>,
    /// Requests at the start that are recorded but not measured.
    #[arg(long, conflicts_with = "warmup_time")]
    pub warmup: Option<usize>,
    /// Seconds at the start whose requests are recorded but not measured.
    #[arg(long)]
    pub warmup_time: Option<f64>,
    /// Requests at the end that are recorded but not measured.
    #[arg(long, conflicts_with = "cooldown_time")]
    pub cooldown: Option<usize>,
    /// Seconds at the end whose requests are recorded but not measured.
    #[arg(long)]
    pub cooldown_time: Option<f64>,
    /// Ask for whole responses instead of streams (TTFT is then the latency).
    #[arg(long)]
    pub no_stream: bool,
    /// Ask the server to ignore end-of-sequence, so every reply has exactly
    /// its max_tokens (random datasets always do).
    #[arg(long)]
    pub ignore_eos: bool,
    /// A JSON object merged into every request body, e.g. '{"temperature":0}'.
    #[arg(long)]
    pub extra_body: Option<String>,
    /// The P99 dispatch lag (ms) above which the run is marked INVALID.
    /// Without it, the load kind decides: one mean inter-arrival gap at a
    /// rate, a tenth of the median TTFT in a closed loop (never below 1 ms).
    #[arg(long)]
    pub lag_limit_ms: Option<f64>,
    /// How far (a share, 0.05 = 5%) the achieved rate may fall short of the
    /// offered one, with no binding concurrency cap, before the run is
    /// marked INVALID [default: 0.05].
    #[arg(long)]
    pub rate_tolerance: Option<f64>,
    /// Percentiles (0 to 100) of latency, TTFT, TPOT and ITL to report, e.g.
    /// 50,90,95,99. The block shows P95 and P99 (N/A when not asked); the
    /// JSON summary and --save-summary-csv carry every one.
    #[arg(long, value_delimiter = ',', default_values_t = crate::DEFAULT_PERCENTILES)]
    pub percentiles: Vec<f64>,
    /// Exit with status 3 when the run is INVALID.
    #[arg(long)]
    pub fail_on_invalid: bool,
    /// Sent as `Authorization: Bearer`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A PEM file of CA certificates to trust for an https server, besides
    /// the system's (a lab's own CA, a self-signed server).
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// Seconds to open a connection before the request times out.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Seconds from the send to the first token before the request times out.
    #[arg(long, default_value_t = 600.0)]
    pub first_token_timeout: f64,
    /// Seconds without data between chunks before a request times out.
    #[arg(long, default_value_t = 600.0)]
    pub idle_timeout: f64,
    /// Seconds one request may take in all.
    #[arg(long, default_value_t = 21600.0)]
    pub timeout: f64,
    /// The controller's gRPC URL to stream records to (needs --run-id, --job,
    /// --attempt).
    #[arg(long, requires_all = ["run_id", "job", "attempt"])]
    pub report_to: Option<String>,
    /// The run the records belong to, for --report-to.
    #[arg(long)]
    pub run_id: Option<String>,
    /// The job within the run, for --report-to.
    #[arg(long)]
    pub job: Option<u64>,
    /// The attempt of the job, for --report-to.
    #[arg(long)]
    pub attempt: Option<u32>,
    /// The lease epoch the attempt was granted under, for --report-to.
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// The CA the controller's certificate must chain to, for an https:// --report-to (PEM).
    #[arg(long, value_name = "FILE")]
    pub report_ca: Option<PathBuf>,
    /// Allow an http:// --report-to on a host other than this one (plain text).
    #[arg(long)]
    pub report_insecure: bool,
    /// MiB of records not yet acknowledged by the controller kept in memory,
    /// for --report-to; past it they wait in a temporary file.
    #[arg(long, default_value_t = 16)]
    pub report_buffer_mib: usize,
    /// Write every request record here, one JSON object per line.
    #[arg(long)]
    pub save_records: Option<PathBuf>,
    /// Write the summary here as JSON.
    #[arg(long)]
    pub save_summary: Option<PathBuf>,
    /// Write one CSV row per request here.
    #[arg(long)]
    pub save_csv: Option<PathBuf>,
    /// Write the latency metrics with every asked percentile here as CSV.
    #[arg(long)]
    pub save_summary_csv: Option<PathBuf>,
    /// Write how the run ended here as JSON when loadgen exits (the exit
    /// status, its name, and the error unless the run completed): for
    /// whoever started it, so that it need not read stderr.
    #[arg(long, value_name = "FILE")]
    pub outcome_file: Option<PathBuf>,
    /// No progress on stderr.
    #[arg(long)]
    pub quiet: bool,

    // `vllm bench serve`'s names for what loadgen does (docs/loadgen.md).
    /// The server's host, with --port, instead of --base-url (vLLM's flags).
    #[arg(long, conflicts_with = "base_url")]
    pub host: Option<String>,
    /// The server's port, with --host.
    #[arg(long, conflicts_with = "base_url")]
    pub port: Option<u16>,
    /// vLLM's --backend (or --endpoint-type): openai or vllm (completions), openai-chat (chat completions).
    #[arg(long, visible_alias = "endpoint-type")]
    pub backend: Option<String>,
    /// vLLM's name for --processor.
    #[arg(long, conflicts_with = "processor")]
    pub tokenizer: Option<PathBuf>,
    /// vLLM's name for --percentiles (comma-separated, e.g. 99 or 50,90,99).
    #[arg(long, value_delimiter = ',', conflicts_with = "percentiles")]
    pub metric_percentiles: Option<Vec<f64>>,
    /// The metrics whose percentiles the --save-result file holds: of ttft, tpot, itl, e2el.
    #[arg(long, value_delimiter = ',', default_value = "ttft,tpot,itl")]
    pub percentile_metrics: Vec<String>,
    /// Write the result as `vllm bench serve --save-result` does, in its JSON schema.
    #[arg(long)]
    pub save_result: bool,
    /// The directory of the --save-result file (default: here).
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// The --save-result file's name (default: vLLM's, from the backend, the rate, the model and the time).
    #[arg(long)]
    pub result_filename: Option<String>,
    /// The label vLLM puts in the result and its file name (default: the backend).
    #[arg(long)]
    pub label: Option<String>,
    /// vLLM's gamma-distributed arrivals: loadgen has only 1.0 (Poisson); another value is refused.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// vLLM's uniform spread of random lengths: loadgen has only 0; use --random-input-std instead.
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// vLLM's goodput SLOs, KEY:VALUE in ms (ttft:200 tpot:50 e2el:5000): the summary counts the requests
    /// within every bound given ("Request goodput (req/s)", request_goodput in --save-result).
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
}

impl Args {
    /// The flags of `vllm bench serve` that loadgen takes but cannot honour
    /// as asked: an error that names each, never a silent difference.
    pub fn refused(&self) -> Option<String> {
        if self.burstiness != 1.0 {
            return Some(format!(
                "--burstiness {}: loadgen's arrivals are Poisson (vLLM's burstiness 1.0) or constant; leave it out or use \
                 --arrival constant",
                self.burstiness
            ));
        }
        if self.random_range_ratio != 0.0 {
            return Some(format!(
                "--random-range-ratio {}: loadgen spreads random lengths normally, not uniformly; use --random-input-std \
                 and --random-input-min/max",
                self.random_range_ratio
            ));
        }
        if let Some(bad) =
            self.percentile_metrics.iter().find(|m| !["ttft", "tpot", "itl", "e2el"].contains(&m.as_str()))
        {
            return Some(format!("--percentile-metrics: unknown metric '{bad}'; use ttft, tpot, itl and e2el"));
        }
        None
    }

    /// The API path, with vLLM's --backend taken into account.
    pub fn endpoint_path(&self) -> anyhow::Result<&str> {
        match self.backend.as_deref() {
            None | Some("openai" | "vllm") => Ok(&self.endpoint),
            Some("openai-chat") => Ok("/v1/chat/completions"),
            Some(other) => {
                bail!("--backend {other}: loadgen speaks the OpenAI API; use openai, vllm or openai-chat")
            }
        }
    }

    /// The backend as vLLM's result names it: openai or openai-chat.
    pub fn backend_name(&self) -> &'static str {
        if self.endpoint_path().is_ok_and(|e| e.contains("chat")) { "openai-chat" } else { "openai" }
    }

    /// The server's root URL: --base-url, or vLLM's --host and --port.
    pub fn server_url(&self) -> String {
        match (&self.host, self.port) {
            (None, None) => self.base_url.clone(),
            (host, port) => format!("http://{}:{}", host.as_deref().unwrap_or("127.0.0.1"), port.unwrap_or(8000)),
        }
    }

    /// The tokenizer file: --processor, or vLLM's --tokenizer.
    pub fn processor_path(&self) -> Option<&PathBuf> {
        self.processor.as_ref().or(self.tokenizer.as_ref())
    }

    /// The job's load these flags describe: what `LoadSpec::to_args` wrote
    /// reads back as the spec it was written from (a file named by its path,
    /// with no hash). A generated dataset's prompts follow --seed and its
    /// arrivals --arrival-seed (else --seed); a ShareGPT file's arrivals
    /// follow --arrival-seed, else --seed. The flags the spec has no place
    /// for (random spreads, sweeps, shuffling, timeouts, outputs) are
    /// loadgen's own, and left out.
    pub fn spec(&self) -> anyhow::Result<LoadSpec> {
        let Some(endpoint) = Endpoint::from_path(self.endpoint_path()?) else {
            bail!("unknown endpoint {}: use /v1/completions or /v1/chat/completions", self.endpoint);
        };
        let dataset = match self.dataset_name {
            DatasetName::Random => LoadDataset::Random {
                input_tokens: self.random_input_len,
                output_tokens: self.random_output_len,
                seed: self.seed,
            },
            DatasetName::Prefix => LoadDataset::SharedPrefix {
                groups: self.prefix_groups,
                prefix_tokens: self.prefix_len,
                suffix_tokens: self.random_input_len,
                output_tokens: self.random_output_len,
                seed: self.seed,
            },
            DatasetName::Sharegpt => {
                let path = self.dataset_path.as_deref().context("--dataset-name sharegpt needs --dataset-path")?;
                LoadDataset::ShareGpt {
                    file: path.display().to_string(),
                    sha256: String::new(),
                    output_tokens: self.sharegpt_output_len,
                    sessions: self
                        .sharegpt_sessions
                        .then_some(load::Sessions { think_time_ms: self.multi_turn_think_ms }),
                }
            }
            DatasetName::MultiTurn => LoadDataset::MultiTurn {
                turns: self.multi_turn_turns,
                user_tokens: self.random_input_len,
                output_tokens: self.random_output_len,
                think_time_ms: self.multi_turn_think_ms,
                seed: self.seed,
            },
            DatasetName::Trace => {
                let path = self.dataset_path.as_deref().context("--dataset-name trace needs --dataset-path")?;
                LoadDataset::Trace {
                    file: path.display().to_string(),
                    sha256: String::new(),
                    format: match self.trace_format {
                        TraceFormatName::Mooncake => TraceFormat::Mooncake,
                        TraceFormatName::Jsonl => TraceFormat::Jsonl,
                    },
                    speed: self.trace_speed,
                }
            }
        };
        let rate = self.request_rate.is_finite().then_some(self.request_rate);
        let (rate, max_concurrency) = match self.profile {
            Some(ProfileName::Synchronous) => (None, Some(1)),
            Some(ProfileName::Throughput) => (None, None),
            Some(ProfileName::Sweep) | None => (rate, self.max_concurrency.map(|n| n as u64)),
        };
        let goodput = if self.goodput.is_empty() {
            None
        } else {
            Some(crate::metrics::Slo::parse(&self.goodput).map_err(|e| anyhow::anyhow!("--goodput: {e}"))?)
        };
        Ok(LoadSpec {
            dataset,
            rate,
            arrival: match self.arrival {
                Some(ArrivalName::Constant) => load::Arrival::Constant,
                Some(ArrivalName::Poisson) | None => load::Arrival::Poisson,
            },
            requests: self.num_prompts as u64,
            max_concurrency,
            endpoint,
            seed: self.arrival_seed.unwrap_or(self.seed),
            lag_limit_ms: self.lag_limit_ms,
            rate_tolerance: self.rate_tolerance,
            warmup: self
                .warmup
                .map(|n| load::Window::Requests(n as u64))
                .or(self.warmup_time.map(load::Window::Seconds)),
            cooldown: self
                .cooldown
                .map(|n| load::Window::Requests(n as u64))
                .or(self.cooldown_time.map(load::Window::Seconds)),
            max_duration_s: self.max_duration,
            ignore_eos: self.ignore_eos,
            extra_body: self.extra_body.clone(),
            goodput,
            processor: self
                .processor_path()
                .map(|p| StoredFile { file: p.display().to_string(), sha256: String::new() }),
        })
    }

    /// What these flags add to the spec: the server, the files on disk and
    /// where the records go.
    pub fn target(&self) -> LoadTarget {
        let report = match (&self.report_to, &self.run_id, self.job, self.attempt) {
            (Some(url), Some(run_id), Some(job), Some(attempt)) => Some(ReportTo {
                url: url.clone(),
                run_id: run_id.clone(),
                job,
                attempt,
                epoch: self.epoch,
                ca: self.report_ca.clone(),
                insecure: self.report_insecure,
            }),
            _ => None,
        };
        LoadTarget {
            base_url: self.server_url(),
            model: self.model.clone(),
            dataset_path: self.dataset_path.clone(),
            processor_path: self.processor_path().cloned(),
            report,
            quiet: self.quiet,
            outcome_file: self.outcome_file.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DatasetName {
    Random,
    Prefix,
    Sharegpt,
    Trace,
    MultiTurn,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TraceFormatName {
    Mooncake,
    Jsonl,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProfileName {
    Synchronous,
    Throughput,
    Sweep,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ArrivalName {
    Constant,
    Poisson,
}

/// The run the flags describe: the job's load ([`Args::spec`]) with
/// loadgen's own flags applied.
pub fn load_config(args: &Args) -> anyhow::Result<LoadConfig> {
    if let Some(why) = args.refused() {
        bail!("{why}");
    }
    let spec = args.spec()?;
    let tokens = match args.processor_path() {
        Some(path) => TokenCounter::load(path)?,
        None => TokenCounter::Words,
    };
    let lengths = |mean: u32, std: f64, min: Option<u32>, max: Option<u32>| Lengths {
        mean,
        std,
        min: min.unwrap_or(if std > 0.0 { 1 } else { mean }),
        max: max.unwrap_or(if std > 0.0 { u32::MAX } else { mean }),
    };
    let requests = usize::try_from(spec.requests).unwrap_or(usize::MAX);
    let dataset = match spec.dataset {
        LoadDataset::Random { input_tokens, output_tokens, seed }
            if args.random_input_std == 0.0 && args.random_output_std == 0.0 =>
        {
            let exact = [args.random_input_min, args.random_input_max, args.random_output_min, args.random_output_max];
            if exact.iter().any(Option::is_some) {
                bail!("--random-*-min/max need a --random-*-std above 0");
            }
            Dataset::Random { input_tokens, output_tokens, seed }
        }
        LoadDataset::Random { input_tokens, output_tokens, seed } => Dataset::RandomSpread {
            input: lengths(input_tokens, args.random_input_std, args.random_input_min, args.random_input_max),
            output: lengths(output_tokens, args.random_output_std, args.random_output_min, args.random_output_max),
            seed,
        },
        LoadDataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
            Dataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed }
        }
        LoadDataset::ShareGpt { output_tokens, sessions, .. } => {
            let path = args.dataset_path.as_deref().context("--dataset-name sharegpt needs --dataset-path")?;
            let data = read_sharegpt_with(path, sessions.is_some())?;
            if let Some(warning) = data.reuse(requests).filter(|_| sessions.is_none()) {
                tracing::warn!("{warning}");
            }
            // --seed orders the file, as vLLM's does; the arrivals may have
            // a seed of their own.
            let shuffle = (!args.disable_shuffle).then_some(args.seed);
            let sessions = sessions.map(|s| Duration::from_millis(s.think_time_ms));
            Dataset::ShareGpt { data, output_tokens, shuffle, sessions }
        }
        LoadDataset::Trace { format, speed, .. } => {
            let path = args.dataset_path.as_deref().context("--dataset-name trace needs --dataset-path")?;
            if args.profile.is_some() || spec.rate.is_some() {
                bail!(
                    "a trace sends on its own schedule: give no --profile or --request-rate (--trace-speed scales it)"
                );
            }
            if !(speed.is_finite() && speed > 0.0) {
                bail!("--trace-speed must be above 0, got {speed}");
            }
            let trace = read_trace(path, format)?;
            trace.holds(requests as u64).map_err(|e| anyhow::anyhow!("--num-prompts: {e}"))?;
            Dataset::Trace { trace: Arc::new(trace), speed }
        }
        LoadDataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed } => {
            if turns == 0 {
                bail!("--multi-turn-turns must be at least 1");
            }
            Dataset::MultiTurn {
                turns,
                user_tokens,
                output_tokens,
                think_time: Duration::from_millis(think_time_ms),
                seed,
            }
        }
    };
    let seconds = |name: &str, s: f64| {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("{name} must be positive seconds, got {s}"))
    };
    let window = |name: &str, w: Option<load::Window>| -> anyhow::Result<Window> {
        Ok(match w {
            None => Window::None,
            Some(load::Window::Requests(n)) => Window::Requests(usize::try_from(n).unwrap_or(usize::MAX)),
            Some(load::Window::Seconds(s)) => Window::Time(seconds(name, s)?),
        })
    };
    let mut config = LoadConfig::new(args.server_url(), args.model.clone(), dataset, requests);
    config.endpoint = spec.endpoint;
    config.request_rate = spec.rate;
    config.arrival = match spec.arrival {
        load::Arrival::Constant => Arrival::Constant,
        load::Arrival::Poisson => Arrival::Poisson { seed: spec.seed },
    };
    config.max_concurrency = spec.max_concurrency.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    config.api_key = args.api_key.clone();
    config.ca_cert = args.ca_cert.clone();
    config.connect_timeout = seconds("--connect-timeout", args.connect_timeout)?;
    config.first_token_timeout = seconds("--first-token-timeout", args.first_token_timeout)?;
    config.idle_timeout = seconds("--idle-timeout", args.idle_timeout)?;
    config.total_timeout = seconds("--timeout", args.timeout)?;
    config.max_duration = spec.max_duration_s.map(|s| seconds("--max-duration", s)).transpose()?;
    config.warmup = window("--warmup-time", spec.warmup)?;
    config.cooldown = window("--cooldown-time", spec.cooldown)?;
    config.stream = !args.no_stream;
    if let Some(extra) = &spec.extra_body {
        let value: serde_json::Value = serde_json::from_str(extra).context("--extra-body is not valid JSON")?;
        let serde_json::Value::Object(fields) = value else {
            bail!("--extra-body must be a JSON object, got {extra}");
        };
        config.extra_body = fields;
    }
    if spec.ignore_eos {
        config.extra_body.insert("ignore_eos".into(), serde_json::Value::Bool(true));
    }
    config.lag_limit_ms = spec.lag_limit_ms;
    config.rate_tolerance = spec.rate_tolerance.unwrap_or(crate::metrics::DEFAULT_RATE_TOLERANCE);
    config.percentiles = args.metric_percentiles.clone().unwrap_or_else(|| args.percentiles.clone());
    config.goodput = spec.goodput;
    config.tokens = tokens;
    // Only a file of them needs the records at the end: the summary is built
    // as they come in, and the controller has them as they do.
    config.keep_records = args.save_records.is_some() || args.save_csv.is_some() || args.save_result;
    config.workers = match args.workers {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
    };
    Ok(config)
}

/// Where the flags send the records, if anywhere.
pub fn sink_config(args: &Args) -> anyhow::Result<Option<SinkConfig>> {
    match (&args.report_to, &args.run_id, args.job, args.attempt) {
        (Some(url), Some(run_id), Some(job), Some(attempt)) => {
            let mut sink = SinkConfig::new(url.clone(), run_id.clone(), job, attempt);
            sink.epoch = args.epoch;
            sink.memory_bytes = args.report_buffer_mib.saturating_mul(1 << 20);
            sink.tls.insecure = args.report_insecure;
            // From the environment, never a flag: argv shows in `ps`.
            sink.token =
                std::env::var("BENCHFLEET_INGEST_TOKEN").ok().filter(|t| !t.is_empty()).map(crate::sink::Token);
            if let Some(ca) = &args.report_ca {
                sink.tls.ca = Some(std::fs::read(ca).with_context(|| format!("--report-ca {}", ca.display()))?);
            }
            // The URL is checked now: a refusal is the command line's error,
            // not a controller that cannot be reached.
            benchfleet_core::tls::endpoint(url, &sink.tls).map_err(|e| anyhow::anyhow!("--report-to: {e}"))?;
            Ok(Some(sink))
        }
        _ => Ok(None),
    }
}

/// Parses a command line (without the program's name) into the run and its
/// sink, as the binary does.
pub fn parse(args: &[String]) -> anyhow::Result<(Args, LoadConfig, Option<SinkConfig>)> {
    let args = parse_args(args)?;
    let config = load_config(&args)?;
    let sink = sink_config(&args)?;
    Ok((args, config, sink))
}

/// A command line (without the program's name) read back as the job's load
/// and its target: the inverse of `LoadSpec::to_args`, through the binary's
/// own parser. Reads no file.
pub fn from_args(args: &[String]) -> anyhow::Result<(LoadSpec, LoadTarget)> {
    let args = parse_args(args)?;
    Ok((args.spec()?, args.target()))
}

fn parse_args(args: &[String]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("benchfleet-loadgen").chain(args.iter().map(String::as_str)))
}
