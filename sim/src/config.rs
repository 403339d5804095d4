//! Parses the engines' own command lines (`vllm serve`, `sglang serve`, `python3 -m sglang.launch_server`) into a [`SimConfig`].
//!
//! Flags take `--flag value` or `--flag=value`, like argparse. A flag the
//! engine would not know is rejected, so a typo in a matrix fails on the
//! simulator just as it would on a GPU.

use std::{fmt, str::FromStr, time::Duration};

use crate::profile::{self, COEFFICIENTS, Coefficients, EngineCosts, Gpu, ModelShape};

/// The environment variable an agent sets to tell the simulator which GPU it stands in for.
pub const GPU_ENV: &str = "BENCHFLEET_SIM_GPU";

/// The simulator's own flags, beside the engines': each with a sample
/// value (empty for a switch) and what it does. `--help` prints them; a
/// test checks the parser takes every one.
pub const SIM_FLAGS: [(&str, &str, &str); 14] = [
    ("--sim-gpu", "H100", "the GPU simulated: H100 or H200 (else $BENCHFLEET_SIM_GPU, else H200)"),
    ("--sim-startup-ms", "500", "how long /health answers 503, as weights load; `model` for the modelled time"),
    ("--sim-speedup", "10", "divide every simulated step time, for quick demos and tests (1: real time)"),
    ("--sim-spec-acceptance", "0.7", "the speculative draft acceptance probability, instead of the method's"),
    ("--sim-fail-rate", "0.1", "the share of requests answered with HTTP 500"),
    ("--sim-crash-after", "100", "die once this many requests have completed"),
    ("--sim-stall-rate", "0.1", "the share of streams that stop halfway, holding the connection"),
    ("--sim-stall-ms", "60000", "how long a stalled stream holds before going on"),
    ("--sim-disconnect-rate", "0.1", "the share of streams whose connection is cut halfway"),
    ("--sim-refuse-cache-reset", "", "the prefix cache cannot be emptied (its endpoint answers 404)"),
    (
        "--sim-spec-failure-batch",
        "500",
        "with speculative decoding, once more sequences than this run, every later request fails",
    ),
    ("--sim-slowdown-pct-per-s", "2", "every step takes this much longer per second served (a degrading engine)"),
    ("--sim-step-jitter-pct", "2", "each step's time varies by this much (its standard deviation, in percent)"),
    ("--sim-seed", "7", "the seed of the step times' variation"),
];

/// What `benchfleet-sim --help` prints.
pub fn help() -> String {
    let mut out = String::from(
        "benchfleet-sim: a simulated vLLM or SGLang server, on its command line\n\n\
         Usage:\n  benchfleet-sim vllm serve MODEL [vLLM flags] [--sim-* flags]\n  \
         benchfleet-sim sglang serve --model-path MODEL [SGLang flags] [--sim-* flags]\n  \
         benchfleet-sim python3 -m sglang.launch_server --model-path MODEL [...]\n  \
         benchfleet-sim sharegpt-like [CONVERSATIONS [SEED]]   a ShareGPT stand-in (JSON on stdout)\n\n\
         The engines' own flags are taken as they take them (--flag value or --flag=value); one the engine\n\
         would not know is an error, as it would be on a GPU. It serves the OpenAI API (/v1/completions,\n\
         /v1/chat/completions, /v1/models), /health, /metrics (SGLang's with --enable-metrics), the engine's\n\
         version (vLLM: GET /version, SGLang: GET /get_server_info) and its own cache reset\n\
         (vLLM: POST /reset_prefix_cache, SGLang: POST /flush_cache).\n\nSimulator flags:\n",
    );
    for (flag, sample, what) in SIM_FLAGS {
        let shown = if sample.is_empty() { flag.to_owned() } else { format!("{flag} {sample}") };
        out.push_str(&format!("  {shown:<28} {what}\n"));
    }
    out.push_str(
        "\nEnvironment:\n  BENCHFLEET_SIM_GPU           the GPU simulated when --sim-gpu is not given\n  \
         BENCHFLEET_SIM_SPEED         run at this factor of the modelled speed (a slow host: 0.88)\n  \
         CUDA_VISIBLE_DEVICES         the GPUs given, as CUDA lists them: a tensor-parallel size above their count\n                               fails at startup, as on a GPU (unset: as many as asked)\n  \
         RUST_LOG                     the log filter (default info)\n\n\
         Exit status: 0 after SIGINT or SIGTERM; 1 when the engine fails as a real one would (out of memory,\n\
         a crash, a port in use); 2 for a command line the engine would refuse.\n",
    );
    out
}

/// vLLM's `--kv-cache-dtype` choices.
const KV_CACHE_DTYPES: [&str; 6] = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"];
const PERFORMANCE_MODES: [&str; 3] = ["balanced", "interactivity", "throughput"];

/// Which engine's command line and defaults the simulator mimics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        })
    }
}

/// Everything the simulator was told, typed. Flags that only matter on a GPU
/// are kept so a later latency model can react to them.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub engine: EngineKind,
    pub model: String,
    /// Name clients must send as `model`; the model itself unless `--served-model-name`.
    pub served_model_name: String,
    /// 127.0.0.1 for both engines: a simulator should not listen on every interface by default.
    pub host: String,
    pub port: u16,
    /// `--max-model-len` / `--context-length`; default 32768.
    pub max_model_len: usize,
    /// `--max-num-seqs` / `--max-running-requests`; default the engine's (vLLM 1024, SGLang 128 on Qwen3.5).
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks plus decodes); default 8192, 16384 in throughput mode.
    pub max_num_batched_tokens: usize,
    /// On by default, as in vLLM's V1 engine and SGLang's radix cache, except in vLLM for a hybrid
    /// model (Qwen3.5), where it is experimental and off unless `--enable-prefix-caching`.
    pub enable_prefix_caching: bool,
    pub kv_cache_dtype: String,
    pub performance_mode: Option<String>,
    pub speculative_config: Option<serde_json::Value>,
    /// When set, chat streams start with `reasoning_content` deltas.
    pub reasoning_parser: Option<String>,
    /// Skips the vision encoder, whose memory then goes to the KV cache.
    pub language_model_only: bool,
    /// vLLM's `--enforce-eager`: no CUDA graphs, every step's kernels launched one by one.
    pub enforce_eager: bool,
    /// `--gpu-memory-utilization` / `--mem-fraction-static`; the engine's default when absent.
    pub gpu_memory_utilization: Option<f64>,
    pub tensor_parallel_size: u32,
    /// The GPUs the engine was given, as `CUDA_VISIBLE_DEVICES` lists them (an agent sets it to
    /// the job's GPUs, simulated ones too); `None` when unset, as on a host whose every GPU is
    /// visible: the simulator then has as many as `--tensor-parallel-size` asks.
    pub visible_gpus: Option<usize>,
    pub trust_remote_code: bool,
    /// SGLang serves `/metrics` only with `--enable-metrics`; vLLM always does.
    pub enable_metrics: bool,
    /// `--sim-gpu`, else `BENCHFLEET_SIM_GPU`, else H200.
    pub gpu: Gpu,
    /// Seeds the generated words, the draft acceptances and the fault draws, so runs repeat.
    pub seed: u64,
    /// How long `/health` answers 503, as an engine loading weights would (`--sim-startup-ms`, default 0;
    /// `--sim-startup-ms model` waits the modelled loading time).
    pub startup_delay: Duration,
    /// Divides every simulated step time (`--sim-speedup`), for quick demos and tests; 1 is real time.
    pub speedup: f64,
    /// `--sim-spec-acceptance`: overrides the method's draft acceptance probability.
    pub spec_acceptance: Option<f64>,
    /// The step-time model's numbers: [`COEFFICIENTS`] unless a calibration fit sets others.
    pub coefficients: Coefficients,
    pub faults: Faults,
}

/// Failures on request, for testing the rest of the system (`--sim-*` flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// `--sim-fail-rate`: fraction of requests answered with HTTP 500.
    pub fail_rate: f64,
    /// `--sim-crash-after N`: the engine dies once N requests have completed; the server exits with an error.
    pub crash_after: Option<u64>,
    /// `--sim-stall-rate`: fraction of streams that stop sending halfway, holding the connection open
    /// for `--sim-stall-ms` (default 60000) before going on.
    pub stall_rate: f64,
    pub stall: Duration,
    /// `--sim-disconnect-rate`: fraction of streams whose connection is cut halfway.
    pub disconnect_rate: f64,
    /// `--sim-refuse-cache-reset`: the prefix cache cannot be emptied (its endpoint answers 404, as vLLM's
    /// does outside development mode).
    pub refuse_cache_reset: bool,
    /// `--sim-slowdown-pct-per-s`: every step takes this many percent longer per second since the
    /// engine's first step (an engine degrading as it runs: its latency drifts).
    pub slowdown_pct_per_s: f64,
    /// `--sim-spec-failure-batch N`: with speculative decoding, once a step runs more than N
    /// sequences the engine's draft state is corrupt, and every request not yet running then, or sent
    /// later, fails with the engine's error (the reports' MTP runs at high load: about half failed).
    pub spec_failure_batch: Option<usize>,
    /// `--sim-step-jitter-pct`: each step's time varies by this much (the standard deviation of a
    /// log-normal factor with a mean of 1, in percent): a GPU's run-to-run variation, so that two
    /// identical runs differ as they do on hardware. `--sim-seed` seeds it.
    pub step_jitter_pct: f64,
    pub seed: u64,
}

impl SimConfig {
    pub fn model_shape(&self) -> ModelShape {
        ModelShape::from_name(&self.model)
    }

    pub fn engine_costs(&self) -> EngineCosts {
        EngineCosts::of(&self.coefficients, self.engine, self.performance_mode.as_deref())
    }
}

/// Why a command line was rejected; `main` prints it and exits with code 2, like argparse.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArgError {
    #[error(
        "unknown engine command {0:?}: expected `vllm serve MODEL`, `sglang serve --model-path MODEL` or `python3 -m sglang.launch_server --model-path MODEL`"
    )]
    UnknownCommand(String),
    #[error("the following arguments are required: {0}")]
    MissingModel(&'static str),
    #[error("unrecognized arguments: {0}")]
    Unrecognized(String),
    #[error("argument {0}: expected one argument")]
    MissingValue(String),
    #[error("argument {flag}: ignored explicit argument {value:?}")]
    ValueOnSwitch { flag: String, value: String },
    #[error("argument {flag}: invalid choice: '{value}' (choose from {choices})")]
    InvalidChoice { flag: String, value: String, choices: String },
    #[error("argument {flag}: invalid value {value:?}: {reason}")]
    InvalidValue { flag: String, value: String, reason: String },
}

/// The environment variable an agent sets to run a simulated engine at a
/// factor of its modelled speed (a staged slow host or GPU: 0.88 takes
/// 1/0.88 of every step time).
pub const SPEED_ENV: &str = "BENCHFLEET_SIM_SPEED";

/// The GPUs a CUDA process may use, as CUDA reads the variable: the entries
/// before the first empty or `-1` one (an empty value hides every GPU).
pub fn visible_gpus(cuda_visible_devices: &str) -> usize {
    cuda_visible_devices.split(',').map(str::trim).take_while(|d| !d.is_empty() && *d != "-1").count()
}

/// Parses argv without the program name, e.g. `["vllm", "serve", "Qwen/Qwen3-8B", "--port=8001"]`;
/// the GPU comes from `--sim-gpu`, else from `BENCHFLEET_SIM_GPU`; the speed is multiplied by
/// `BENCHFLEET_SIM_SPEED` when set; the GPUs it may use are `CUDA_VISIBLE_DEVICES`'s.
pub fn parse_command_line(args: &[String]) -> Result<SimConfig, ArgError> {
    let mut config = parse_command_line_with_gpu(args, std::env::var(GPU_ENV).ok().as_deref())?;
    config.visible_gpus = std::env::var("CUDA_VISIBLE_DEVICES").ok().map(|devices| visible_gpus(&devices));
    if let Ok(text) = std::env::var(SPEED_ENV) {
        let speed = text.trim().parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
            ArgError::InvalidValue {
                flag: SPEED_ENV.to_owned(),
                value: text.clone(),
                reason: "expected a speed factor above 0 (1: as modelled)".to_owned(),
            }
        })?;
        config.speedup *= speed;
    }
    Ok(config)
}

/// [`parse_command_line`] with the environment's GPU given, so tests do not depend on the environment.
pub fn parse_command_line_with_gpu(args: &[String], env_gpu: Option<&str>) -> Result<SimConfig, ArgError> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let (engine, rest) = match words.as_slice() {
        ["vllm", "serve", rest @ ..] => (EngineKind::Vllm, rest),
        ["sglang", "serve", rest @ ..] => (EngineKind::Sglang, rest),
        [python, "-m", "vllm.entrypoints.openai.api_server", rest @ ..] if python.starts_with("python") => {
            (EngineKind::Vllm, rest)
        }
        [python, "-m", "sglang.launch_server", rest @ ..] if python.starts_with("python") => (EngineKind::Sglang, rest),
        _ => return Err(ArgError::UnknownCommand(args.join(" "))),
    };
    let mut config = SimConfig {
        engine,
        model: String::new(),
        served_model_name: String::new(),
        host: "127.0.0.1".into(),
        port: if engine == EngineKind::Vllm { 8000 } else { 30000 },
        max_model_len: 32768,
        max_num_seqs: 0,
        max_num_batched_tokens: 0,
        enable_prefix_caching: true,
        kv_cache_dtype: "auto".into(),
        performance_mode: None,
        speculative_config: None,
        reasoning_parser: None,
        language_model_only: false,
        enforce_eager: false,
        gpu_memory_utilization: None,
        tensor_parallel_size: 1,
        visible_gpus: None,
        trust_remote_code: false,
        enable_metrics: engine == EngineKind::Vllm,
        gpu: profile::GPUS[1],
        seed: 0,
        startup_delay: Duration::ZERO,
        speedup: 1.0,
        spec_acceptance: None,
        coefficients: COEFFICIENTS,
        faults: Faults { stall: Duration::from_secs(60), ..Faults::default() },
    };
    let (mut max_seqs, mut batched_tokens, mut gpu_flag, mut startup_from_model) = (None, None, None, false);
    let mut prefix_caching = None;
    let mut rest = rest.iter();
    while let Some(&arg) = rest.next() {
        if !arg.starts_with('-') {
            // vLLM takes the model as its one positional argument, anywhere.
            if engine == EngineKind::Vllm && config.model.is_empty() {
                config.model = arg.into();
                continue;
            }
            return Err(ArgError::Unrecognized(arg.into()));
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (arg, None),
        };
        let switch = |on: bool| match inline {
            Some(value) => Err(ArgError::ValueOnSwitch { flag: name.into(), value: value.into() }),
            None => Ok(on),
        };
        let mut value = || match inline {
            Some(value) => Ok(value.to_string()),
            None => rest.next().map(|value| value.to_string()).ok_or_else(|| ArgError::MissingValue(name.into())),
        };
        use EngineKind::{Sglang, Vllm};
        match (engine, name) {
            (_, "--host") => config.host = value()?,
            (_, "--port") => config.port = parse(name, &value()?)?,
            (Vllm, "--model") | (Sglang, "--model-path" | "--model") => config.model = value()?,
            (_, "--served-model-name") => config.served_model_name = value()?,
            (Vllm, "--max-model-len") | (Sglang, "--context-length") => {
                config.max_model_len = parse(name, &value()?)?;
            }
            (Vllm, "--max-num-seqs") | (Sglang, "--max-running-requests") => {
                max_seqs = Some(parse(name, &value()?)?);
            }
            (Sglang, "--chunked-prefill-size") => {
                // -1 turns chunking off: a prompt is prefilled in one step, whatever its length.
                batched_tokens = match value()?.as_str() {
                    "-1" => Some(Budget::Unchunked),
                    text => Some(Budget::Tokens(parse(name, text)?)),
                };
            }
            (_, "--max-num-batched-tokens") => batched_tokens = Some(Budget::Tokens(parse(name, &value()?)?)),
            (_, "--enable-prefix-caching") => prefix_caching = Some(switch(true)?),
            (Vllm, "--no-enable-prefix-caching") | (Sglang, "--disable-radix-cache") => {
                prefix_caching = Some(switch(false)?);
            }
            (_, "--kv-cache-dtype") => config.kv_cache_dtype = choice(name, value()?, &KV_CACHE_DTYPES)?,
            (Vllm, "--performance-mode") => config.performance_mode = Some(choice(name, value()?, &PERFORMANCE_MODES)?),
            (_, "--speculative-config") => {
                let text = value()?;
                let json: serde_json::Value = serde_json::from_str(&text).map_err(|err| invalid(name, &text, err))?;
                if json.get("num_speculative_tokens").and_then(serde_json::Value::as_u64).is_none_or(|k| k == 0) {
                    return Err(invalid(name, &text, "num_speculative_tokens must be a positive integer"));
                }
                config.speculative_config = Some(json);
            }
            (_, "--reasoning-parser") => config.reasoning_parser = Some(value()?),
            (_, "--language-model-only") => config.language_model_only = switch(true)?,
            (Vllm, "--enforce-eager") => config.enforce_eager = switch(true)?,
            (Vllm, "--gpu-memory-utilization") | (Sglang, "--mem-fraction-static") => {
                config.gpu_memory_utilization = Some(parse(name, &value()?)?);
            }
            (_, "--tensor-parallel-size") | (Vllm, "-tp") | (Sglang, "--tp-size" | "--tp") => {
                config.tensor_parallel_size = parse(name, &value()?)?;
            }
            (_, "--trust-remote-code") => config.trust_remote_code = switch(true)?,
            (Sglang, "--enable-metrics") => config.enable_metrics = switch(true)?,
            (_, "--seed") | (Sglang, "--random-seed") => config.seed = parse(name, &value()?)?,
            (_, "--sim-gpu") => gpu_flag = Some(value()?),
            (_, "--sim-startup-ms") => match value()?.as_str() {
                "model" => startup_from_model = true,
                text => config.startup_delay = millis(name, text)?,
            },
            (_, "--sim-speedup") => {
                let text = value()?;
                config.speedup = parse(name, &text)?;
                if !(config.speedup.is_finite() && config.speedup > 0.0) {
                    return Err(invalid(name, &text, "must be a positive number"));
                }
            }
            (_, "--sim-spec-acceptance") => config.spec_acceptance = Some(fraction(name, &value()?)?),
            (_, "--sim-fail-rate") => config.faults.fail_rate = fraction(name, &value()?)?,
            (_, "--sim-crash-after") => config.faults.crash_after = Some(parse(name, &value()?)?),
            (_, "--sim-stall-rate") => config.faults.stall_rate = fraction(name, &value()?)?,
            (_, "--sim-stall-ms") => config.faults.stall = millis(name, &value()?)?,
            (_, "--sim-disconnect-rate") => config.faults.disconnect_rate = fraction(name, &value()?)?,
            (_, "--sim-spec-failure-batch") => config.faults.spec_failure_batch = Some(parse(name, &value()?)?),
            (_, "--sim-refuse-cache-reset") => config.faults.refuse_cache_reset = switch(true)?,
            (_, "--sim-step-jitter-pct") => {
                let text = value()?;
                config.faults.step_jitter_pct = parse(name, &text)?;
                if !(0.0..=50.0).contains(&config.faults.step_jitter_pct) {
                    return Err(invalid(name, &text, "must be 0 to 50 percent"));
                }
            }
            (_, "--sim-seed") => config.faults.seed = parse(name, &value()?)?,
            (_, "--sim-slowdown-pct-per-s") => {
                let text = value()?;
                config.faults.slowdown_pct_per_s = parse(name, &text)?;
                if !(config.faults.slowdown_pct_per_s.is_finite() && config.faults.slowdown_pct_per_s >= 0.0) {
                    return Err(invalid(name, &text, "must be 0 or more percent"));
                }
            }
            _ => return Err(ArgError::Unrecognized(arg.into())),
        }
    }
    if config.model.is_empty() {
        return Err(ArgError::MissingModel(match engine {
            EngineKind::Vllm => "model (vllm serve MODEL or --model MODEL)",
            EngineKind::Sglang => "--model-path",
        }));
    }
    if config.served_model_name.is_empty() {
        config.served_model_name = config.model.clone();
    }
    let gpu_name = gpu_flag.as_deref().or(env_gpu).unwrap_or("H200");
    config.gpu = profile::gpu(gpu_name).ok_or_else(|| {
        let flag = if gpu_flag.is_some() { "--sim-gpu" } else { GPU_ENV };
        invalid(flag, gpu_name, "the simulator knows H100 and H200")
    })?;
    let hybrid_in_vllm = engine == EngineKind::Vllm && config.model_shape().hybrid;
    config.enable_prefix_caching = prefix_caching.unwrap_or(!hybrid_in_vllm);
    let costs = config.engine_costs();
    config.max_num_seqs = max_seqs.unwrap_or(costs.default_max_num_seqs);
    config.max_num_batched_tokens = match batched_tokens {
        Some(Budget::Tokens(tokens)) => tokens,
        Some(Budget::Unchunked) => config.max_model_len.max(costs.default_max_num_batched_tokens),
        None => costs.default_max_num_batched_tokens,
    };
    if startup_from_model {
        let seconds =
            config.model_shape().weight_bytes() / config.coefficients.load_bandwidth + config.coefficients.load_warmup;
        config.startup_delay = Duration::from_secs_f64(seconds);
    }
    Ok(config)
}

/// A step's token budget as given.
enum Budget {
    Tokens(usize),
    /// SGLang's `--chunked-prefill-size -1`.
    Unchunked,
}

fn invalid(flag: &str, value: &str, reason: impl fmt::Display) -> ArgError {
    ArgError::InvalidValue { flag: flag.into(), value: value.into(), reason: reason.to_string() }
}

/// One of argparse's `choices`, with its wording.
fn choice(flag: &str, value: String, choices: &[&str]) -> Result<String, ArgError> {
    if choices.contains(&value.as_str()) {
        return Ok(value);
    }
    let listed: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
    Err(ArgError::InvalidChoice { flag: flag.into(), value, choices: listed.join(", ") })
}

/// A number between 0 and 1.
fn fraction(flag: &str, value: &str) -> Result<f64, ArgError> {
    let number: f64 = parse(flag, value)?;
    if !(0.0..=1.0).contains(&number) {
        return Err(invalid(flag, value, "must be between 0 and 1"));
    }
    Ok(number)
}

fn parse<T: FromStr<Err: fmt::Display>>(flag: &str, value: &str) -> Result<T, ArgError> {
    value.parse().map_err(|err| invalid(flag, value, err))
}

/// Milliseconds as a possibly fractional, non-negative number.
fn millis(flag: &str, value: &str) -> Result<Duration, ArgError> {
    let ms: f64 = parse(flag, value)?;
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|err| invalid(flag, value, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn check_err(line: &str, expected: &str) {
        let err = parse_command_line(&args(line)).expect_err(line);
        assert_eq!(err.to_string(), expected, "{line}");
    }

    #[test]
    fn visible_gpus_are_counted_as_cuda_counts_them() {
        for (devices, count) in [("0,1", 2), ("GPU-a, GPU-b ,GPU-c", 3), ("", 0), ("0,-1,2", 1), ("-1", 0), ("3,,4", 1)]
        {
            assert_eq!(visible_gpus(devices), count, "{devices:?}");
        }
        let spec = r#"--speculative-config={"method":"mtp","num_speculative_tokens":0}"#;
        assert!(matches!(
            parse_command_line_with_gpu(&args(&format!("vllm serve m {spec}")), None),
            Err(ArgError::InvalidValue { .. })
        ));
    }

    #[test]
    fn vllm_positional_model_and_both_flag_forms() {
        let c = parse_command_line(&args(
            "vllm serve Qwen/Qwen3-8B --port=8001 --max-model-len 4096 --max-num-seqs=64 \
             --enable-prefix-caching --kv-cache-dtype=fp8 --reasoning-parser qwen3 \
             --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":4} \
             --sim-speedup=2.5 --sim-gpu h100 --sim-crash-after 3 --sim-stall-rate 0.5 --sim-stall-ms 10",
        ))
        .expect("valid command line");
        assert_eq!(c.engine, EngineKind::Vllm);
        assert_eq!((c.model.as_str(), c.served_model_name.as_str()), ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"));
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8001));
        assert_eq!((c.max_model_len, c.max_num_seqs), (4096, 64));
        assert_eq!(c.kv_cache_dtype, "fp8");
        assert_eq!(c.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(c.speculative_config, Some(serde_json::json!({"method":"mtp","num_speculative_tokens":4})));
        assert_eq!((c.speedup, c.gpu.name), (2.5, "H100"));
        assert_eq!(
            c.faults,
            Faults { crash_after: Some(3), stall_rate: 0.5, stall: Duration::from_millis(10), ..c.faults.clone() }
        );
        // vLLM's short form of the tensor-parallel size.
        assert_eq!(parse_command_line(&args("vllm serve m -tp 2")).expect("-tp").tensor_parallel_size, 2);
    }

    #[test]
    fn vllm_model_flag_and_defaults() {
        let c = parse_command_line(&args("vllm serve --model m --served-model-name s")).expect("valid command line");
        assert_eq!((c.model.as_str(), c.served_model_name.as_str(), c.port), ("m", "s", 8000));
        assert_eq!((c.max_num_seqs, c.max_model_len, c.max_num_batched_tokens), (1024, 32768, 8192));
        assert!(c.enable_prefix_caching, "on by default, as in vLLM V1");
        let hybrid = |line: &str| parse_command_line(&args(line)).expect("valid command line").enable_prefix_caching;
        assert!(!hybrid("vllm serve Qwen/Qwen3.5-9B"), "off for a hybrid model unless asked");
        assert!(hybrid("vllm serve Qwen/Qwen3.5-9B --enable-prefix-caching"));
        assert!(hybrid("sglang serve --model-path Qwen/Qwen3.5-9B"), "SGLang's radix cache stays on");
        assert_eq!((c.gpu.name, c.startup_delay), ("H200", Duration::ZERO));
    }

    #[test]
    fn defaults_follow_the_engine_the_mode_and_the_environment() {
        let c = parse_command_line_with_gpu(&args("vllm serve m --performance-mode throughput"), Some("H100"))
            .expect("valid command line");
        assert_eq!((c.max_num_batched_tokens, c.gpu.name), (16384, "H100"));
        let c = parse_command_line_with_gpu(
            &args("vllm serve m --sim-gpu H200 --max-num-batched-tokens 2048"),
            Some("H100"),
        )
        .expect("valid command line");
        assert_eq!((c.max_num_batched_tokens, c.gpu.name), (2048, "H200"), "the flag wins over the environment");
        let c =
            parse_command_line(&args("sglang serve --model-path m --disable-radix-cache")).expect("valid command line");
        assert_eq!((c.max_num_seqs, c.enable_prefix_caching), (128, false));
        let c =
            parse_command_line(&args("vllm serve Qwen/Qwen3.5-9B --sim-startup-ms model")).expect("valid command line");
        // 18 GB at 2 GB/s, plus 20 s of warm-up.
        assert_eq!(c.startup_delay, Duration::from_secs(29));
        let err = parse_command_line_with_gpu(&args("vllm serve m"), Some("A100")).expect_err("unknown gpu");
        assert_eq!(
            err.to_string(),
            "argument BENCHFLEET_SIM_GPU: invalid value \"A100\": the simulator knows H100 and H200"
        );
    }

    #[test]
    fn sglang_forms() {
        for line in [
            "python3 -m sglang.launch_server --model-path m --context-length=2048 --max-running-requests 8 --tp-size 2",
            "sglang serve --model-path=m --context-length 2048 --max-running-requests=8 --tp-size=2",
            // argparse takes an unambiguous prefix: SGLang's users write --tp.
            "sglang serve --model-path m --context-length 2048 --max-running-requests 8 --tp 2",
        ] {
            let c = parse_command_line(&args(line)).expect(line);
            assert_eq!(c.engine, EngineKind::Sglang);
            assert_eq!((c.model.as_str(), c.port, c.max_model_len), ("m", 30000, 2048));
            assert_eq!((c.max_num_seqs, c.tensor_parallel_size), (8, 2));
        }
    }

    #[test]
    fn rejections() {
        check_err("vllm serve m --bogus 1", "unrecognized arguments: --bogus");
        check_err("vllm serve m --bogus=1", "unrecognized arguments: --bogus=1");
        check_err("vllm serve m extra", "unrecognized arguments: extra");
        check_err("vllm serve -z 2 m", "unrecognized arguments: -z");
        check_err("sglang serve --model-path m -tp 2", "unrecognized arguments: -tp");
        check_err("sglang serve --model-path m --max-num-seqs 4", "unrecognized arguments: --max-num-seqs");
        check_err(
            "vllm serve --port 1",
            "the following arguments are required: model (vllm serve MODEL or --model MODEL)",
        );
        check_err("sglang serve --port 1", "the following arguments are required: --model-path");
        check_err("vllm serve m --port", "argument --port: expected one argument");
        check_err("vllm serve m --port x", "argument --port: invalid value \"x\": invalid digit found in string");
        check_err(
            "vllm serve m --trust-remote-code=yes",
            "argument --trust-remote-code: ignored explicit argument \"yes\"",
        );
        check_err(
            "vllm serve m --sim-fail-rate 2",
            "argument --sim-fail-rate: invalid value \"2\": must be between 0 and 1",
        );
        check_err(
            "vllm serve m --kv-cache-dtype int4",
            "argument --kv-cache-dtype: invalid choice: 'int4' (choose from 'auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')",
        );
        check_err(
            "vllm serve m --performance-mode fast",
            "argument --performance-mode: invalid choice: 'fast' (choose from 'balanced', 'interactivity', 'throughput')",
        );
        check_err(
            "vllm serve m --speculative-config={\"method\":\"mtp\"}",
            "argument --speculative-config: invalid value \"{\\\"method\\\":\\\"mtp\\\"}\": num_speculative_tokens must be a positive integer",
        );
        check_err(
            "vllm serve m --sim-gpu A100",
            "argument --sim-gpu: invalid value \"A100\": the simulator knows H100 and H200",
        );
        assert!(matches!(parse_command_line(&args("tgi serve m")), Err(ArgError::UnknownCommand(_))));
    }
}
