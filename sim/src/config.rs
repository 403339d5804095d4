//! Parses the engines' own command lines (`vllm serve`, `sglang serve`, `python3 -m sglang.launch_server`) into a [`SimConfig`].
//!
//! Flags take `--flag value` or `--flag=value`, like argparse. A flag the
//! engine would not know is rejected, so a typo in a matrix fails on the
//! simulator just as it would on a GPU.

use std::{fmt, str::FromStr, time::Duration};

use benchfleet_core::flags::{self, Kind};

pub use benchfleet_core::engine::EngineKind;

use crate::profile::{self, COEFFICIENTS, Coefficients, EngineCosts, Gpu, HybridBlock, ModelShape, StateTypes};

/// The environment variable an agent sets to tell the simulator which GPU it stands in for.
pub const GPU_ENV: &str = "BENCHFLEET_SIM_GPU";

/// The simulator's own flags, beside the engines': each with a sample
/// value (empty for a switch) and what it does. `--help` prints them; a
/// test checks the parser takes every one.
pub const SIM_FLAGS: [(&str, &str, &str); 15] = [
    ("--sim-gpu", "H100", "the GPU simulated: H100 or H200 (else $BENCHFLEET_SIM_GPU, else H200)"),
    (
        "--sim-params",
        "355B-A32B",
        "the model's size where its name gives none: 8B, or a mixture of experts' total-active",
    ),
    ("--sim-startup-ms", "500", "how long /health answers 503, as weights load; `model` for the modelled time"),
    (
        "--sim-speedup",
        "10",
        "divide every simulated step time, 0.001 to 1000, for quick demos and tests (1: real time)",
    ),
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
         Every option of vLLM 0.17.1's and SGLang 0.5.9's command lines is taken as they take it (--flag\n\
         value, --flag=value, an unambiguous prefix); one the engine would not know is an error, as it would\n\
         be on a GPU. Those it does not simulate are named as it starts, and the run goes as without them.\n\
         It serves the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models), /health, /metrics\n\
         (SGLang's with --enable-metrics), the engine's version (vLLM: GET /version, SGLang: GET\n\
         /get_server_info) and its own cache reset (vLLM: POST /reset_prefix_cache, SGLang: POST\n\
         /flush_cache).\n\nSimulator flags:\n",
    );
    for (flag, sample, what) in SIM_FLAGS {
        let shown = if sample.is_empty() { flag.to_owned() } else { format!("{flag} {sample}") };
        out.push_str(&format!("  {shown:<28} {what}\n"));
    }
    out.push_str(
        "\nEnvironment:\n  BENCHFLEET_SIM_GPU           the GPU simulated when --sim-gpu is not given\n  \
         BENCHFLEET_SIM_SPEED         run at this factor of the modelled speed (a slow host: 0.88)\n  \
         CUDA_VISIBLE_DEVICES         the GPUs given, as CUDA lists them: parallel sizes that need more fail at\n                               startup, as on a GPU (unset: the host's 16)\n  \
         RUST_LOG                     the log filter (default info)\n\n\
         Exit status: 0 after SIGINT or SIGTERM; 1 when the engine fails as a real one would (out of memory,\n\
         a crash, a port in use); 2 for a command line the engine would refuse.\n",
    );
    out
}

/// Everything the simulator was told, typed. Flags that only matter on a GPU
/// are kept so a later latency model can react to them.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub engine: EngineKind,
    pub model: String,
    /// `--sim-params`: the model's size, where its name does not give it (or gives it wrongly).
    pub params: Option<profile::Params>,
    /// Name clients must send as `model`; the model itself unless `--served-model-name`.
    pub served_model_name: String,
    /// 127.0.0.1 for both engines: a simulator should not listen on every interface by default.
    pub host: String,
    pub port: u16,
    /// `--max-model-len` / `--context-length`; default 32768.
    pub max_model_len: usize,
    /// `--max-num-seqs` / `--max-running-requests`; default the engine's: vLLM's 1024, SGLang's
    /// 4096, which it lowers as it starts, from its pools (`Scheduler::max_num_seqs`).
    pub max_num_seqs: usize,
    /// The sequence limit was given, or set by SGLang's speculative decoding (48): SGLang's
    /// `max_running_requests` is then set, which sizes its state pool without its radix cache.
    pub max_num_seqs_given: bool,
    /// SGLang's pool of a hybrid model's recurrent states, kept apart from its KV pool.
    pub state_pool: StatePool,
    /// The types a hybrid model's recurrent states are kept in (either engine).
    pub state_types: StateTypes,
    /// vLLM's `--block-size`, tokens (16 unless given).
    pub block_size: Option<usize>,
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
    /// Skips a multimodal model's vision encoder, whose memory then goes to the KV cache.
    pub language_model_only: bool,
    /// vLLM's `--enforce-eager`: no CUDA graphs, every step's kernels launched one by one.
    pub enforce_eager: bool,
    /// `--gpu-memory-utilization` / `--mem-fraction-static`; the engine's default when absent.
    pub gpu_memory_utilization: Option<f64>,
    /// vLLM's `--kv-cache-memory-bytes`: the KV cache's bytes per GPU, whatever the memory fraction.
    pub kv_cache_memory_bytes: Option<usize>,
    /// SGLang's `--max-total-tokens`: at most this many tokens in its KV pool.
    pub max_total_tokens: Option<usize>,
    pub tensor_parallel_size: u32,
    /// `--pipeline-parallel-size` (SGLang's `--pp-size`): the layers split over that many stages,
    /// which hold as many batches in flight ([`crate::pipeline::Pipeline`]).
    pub pipeline_parallel_size: u32,
    /// `--data-parallel-size` (SGLang's `--dp-size`): that many replicas of the engine, each on
    /// its own tensor-parallel GPUs with its own scheduler and KV cache, behind one server that
    /// spreads the requests over them as [`SimConfig::routing`] says.
    pub data_parallel_size: u32,
    /// SGLang's `--enable-dp-attention`: its data-parallel ranks share the tensor-parallel GPUs
    /// (run as one replica).
    pub dp_attention: bool,
    /// How the server spreads requests over the data-parallel replicas.
    pub routing: Routing,
    /// What the engine's own processing of its options refuses, found as they were read (SGLang's
    /// checks of its speculative options): the server fails with it as it starts.
    pub refused: Option<String>,
    /// `--quantization fp8` (SGLang's `w8a8_fp8` too): a BF16 checkpoint's weights quantised to
    /// FP8 as they load, run as an FP8 checkpoint's.
    pub weights_fp8: bool,
    /// vLLM's `--enable-chunked-prefill` (on unless `--no-enable-chunked-prefill`), SGLang's unless
    /// `--chunked-prefill-size -1`: off, a prompt is prefilled whole and the default budget holds
    /// a whole context.
    pub chunked_prefill: bool,
    /// vLLM's `--async-scheduling` as given (`None`: on, unless the drafting method cannot).
    pub async_scheduling: Option<bool>,
    /// SGLang's overlap scheduler: off with `--disable-overlap-schedule` or speculative decoding.
    pub overlap_schedule: bool,
    /// A step decodes the running sequences beside its prefill chunks: vLLM's always do, SGLang's
    /// with `--enable-mixed-chunk`. Else (SGLang's default) a step prefills alone whenever a prompt
    /// can be prefilled, and the running sequences decode in the steps between.
    pub mixed_batches: bool,
    /// CUDA graphs at all: vLLM's `--compilation-config '{"cudagraph_mode": "NONE"}'` and SGLang's
    /// `--disable-cuda-graph` turn them off.
    pub cuda_graphs: bool,
    /// vLLM's `--max-cudagraph-capture-size` and `--cudagraph-capture-sizes` (or the same keys of
    /// `--compilation-config`), in tokens; SGLang's `--cuda-graph-max-bs` and `--cuda-graph-bs`,
    /// in sequences; when given.
    pub max_capture_size: Option<usize>,
    pub capture_sizes: Option<Vec<usize>>,
    /// The engine options taken as the engine takes them but not modelled, as given: the server
    /// names them as it starts, and runs as without them.
    pub unmodelled: Vec<String>,
    /// vLLM's further `--served-model-name`s, which requests may name too.
    pub other_model_names: Vec<String>,
    /// The GPUs the engine was given, as `CUDA_VISIBLE_DEVICES` lists them (an agent sets it to
    /// the job's GPUs, simulated ones too); `None` when unset, as on a host whose every GPU is
    /// visible: the simulated host then has [`HOST_GPUS`].
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

/// SGLang's pool of a hybrid model's linear-attention states (its mamba pool), as its options set it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatePool {
    /// `--max-mamba-cache-size`: the states it holds; else sized by the ratio below.
    pub size: Option<usize>,
    /// `--mamba-full-memory-ratio` (0.9): the states' memory against the KV pool's.
    pub full_memory_ratio: f64,
    /// `--mamba-scheduler-strategy extra_buffer`: more states kept a running request (SGLang's
    /// default, `auto`, is `no_buffer`).
    pub extra_buffer: bool,
}

impl Default for StatePool {
    fn default() -> StatePool {
        StatePool { size: None, full_memory_ratio: 0.9, extra_buffer: false }
    }
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
        let mut shape = ModelShape::sized(&self.model, self.params);
        if self.weights_fp8 {
            shape.bytes_per_param = 1.0;
            shape.fp8_compute = true;
        }
        shape
    }

    /// vLLM's block in the simulator's 16-token blocks: a sequence holds whole blocks, and prefix
    /// caching shares only whole ones. A hybrid model's is the one vLLM sizes to its state
    /// ([`SimConfig::vllm_hybrid_block`]), a transformer's its `--block-size`. 1 (16 tokens)
    /// otherwise: SGLang, a block of fewer tokens, or a hybrid whose architecture the simulator
    /// does not know.
    pub fn page_blocks(&self) -> usize {
        if self.engine != EngineKind::Vllm {
            return 1;
        }
        match (self.vllm_hybrid_block(), self.block_size) {
            (Some(block), _) => block.tokens / crate::kv::BLOCK_TOKENS,
            (None, Some(size)) if !self.model_shape().hybrid => (size / crate::kv::BLOCK_TOKENS).max(1),
            _ => 1,
        }
    }

    /// The block vLLM gives this hybrid model ([`ModelShape::vllm_hybrid_block`]); `None` for
    /// SGLang, a transformer, or a hybrid whose architecture the simulator does not know.
    pub fn vllm_hybrid_block(&self) -> Option<HybridBlock> {
        if self.engine != EngineKind::Vllm {
            return None;
        }
        self.model_shape().vllm_hybrid_block(
            self.state_types,
            self.kv_fp8(),
            self.tensor_parallel_size,
            self.block_size,
        )
    }

    /// `--kv-cache-dtype fp8` (or `fp8_e4m3`, `fp8_e5m2`): a KV cache of one byte an element.
    pub fn kv_fp8(&self) -> bool {
        self.kv_cache_dtype.starts_with("fp8")
    }

    /// The engine's costs in its mode, with the overlap of scheduling and the GPU its loop gives.
    /// vLLM without asynchronous scheduling hides nothing. SGLang's fitted overlap is its loop's
    /// without the overlap scheduler, as the reports' runs had it (Qwen3.5 with the radix cache,
    /// [`SimConfig::overlaps`]); with the scheduler it hides what vLLM's asynchronous scheduling,
    /// the same design, hides, or that, whichever is more (no report ran it).
    pub fn engine_costs(&self) -> EngineCosts {
        let hybrid = self.model_shape().hybrid;
        let mut costs = EngineCosts::of(&self.coefficients, self.engine, self.performance_mode.as_deref(), hybrid);
        // SGLang's fixed step is fitted on the reports' runs, all on Qwen3.5, where it carries the
        // hybrid path's work (its linear-attention backend and state pools). A transformer's step
        // is the same Python scheduler replaying the same model's graphs as vLLM's: vLLM's fixed
        // step on a transformer. Either way a step that prefills pays the launches
        // (`Graphs::Decodes`).
        if self.engine == EngineKind::Sglang && !hybrid {
            costs.step_overhead = self.coefficients.vllm.step_overhead;
        }
        match (self.engine, self.overlaps()) {
            (EngineKind::Vllm, false) => costs.overlap = 0.0,
            (EngineKind::Sglang, true) => costs.overlap = costs.overlap.max(self.coefficients.vllm.overlap),
            _ => {}
        }
        costs
    }

    /// Whether the engine plans a step while the one before it runs: vLLM's asynchronous
    /// scheduling (on unless `--no-async-scheduling`, or a drafting method it does not support),
    /// SGLang's overlap scheduler.
    pub fn overlaps(&self) -> bool {
        match self.engine {
            EngineKind::Vllm => self.async_scheduling.unwrap_or_else(|| !self.drafts_without_async()),
            EngineKind::Sglang => self.overlap_schedule,
        }
    }

    /// vLLM schedules asynchronously only with EAGLE-family, MTP or draft-model speculation.
    pub fn drafts_without_async(&self) -> bool {
        let method = self.speculative_config.as_ref().and_then(|s| s.get("method")).and_then(|m| m.as_str());
        matches!(method, Some("ngram" | "[ngram]" | "suffix" | "medusa" | "mlp_speculator"))
    }

    /// The GPUs the engine spreads over: tensor x pipeline x data parallel (SGLang's data
    /// parallel attention shares the tensor-parallel GPUs).
    pub fn gpus_needed(&self) -> u64 {
        u64::from(self.tensor_parallel_size)
            .saturating_mul(u64::from(self.pipeline_parallel_size))
            .saturating_mul(self.data_replicas() as u64)
    }

    /// The engine's data-parallel replicas: `--data-parallel-size` of them, one with SGLang's
    /// data-parallel attention.
    pub fn data_replicas(&self) -> usize {
        if self.dp_attention { 1 } else { self.data_parallel_size as usize }
    }
}

/// How a data-parallel server picks the replica for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// The replica with the least `waiting_weight x waiting + running` requests, the first of
    /// equals: vLLM's (a waiting request counts 4), SGLang's `--load-balance-method total_requests` (1).
    LeastLoaded { waiting_weight: usize },
    /// Each replica in turn: SGLang's default.
    RoundRobin,
}

impl Routing {
    pub fn of(engine: EngineKind) -> Routing {
        match engine {
            EngineKind::Vllm => Routing::LeastLoaded { waiting_weight: 4 },
            EngineKind::Sglang => Routing::RoundRobin,
        }
    }

    /// The replica for the next request, given each one's `(waiting, running)` requests and how
    /// many requests have been routed before this one.
    pub fn pick(self, loads: impl IntoIterator<Item = (usize, usize)>, routed: usize) -> usize {
        let loads = loads.into_iter();
        match self {
            Routing::RoundRobin => routed % loads.count().max(1),
            Routing::LeastLoaded { waiting_weight } => loads
                .enumerate()
                .min_by_key(|&(i, (waiting, running))| (waiting * waiting_weight + running, i))
                .map_or(0, |(i, _)| i),
        }
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
    #[error("argument {0}: expected at least one argument")]
    MissingValues(String),
    #[error("ambiguous option: {option} could match {matches}")]
    Ambiguous { option: String, matches: String },
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

/// The speeds `--sim-speedup` and [`SPEED_ENV`] may give, each.
const SPEEDS: std::ops::RangeInclusive<f64> = 0.001..=1000.0;

/// The GPUs of a simulated host where `CUDA_VISIBLE_DEVICES` is unset: as many as benchfleet's
/// largest job takes (`hardware.gpus_per_job`).
pub const HOST_GPUS: usize = 16;

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
        let speed =
            text.trim().parse::<f64>().ok().filter(|f| SPEEDS.contains(f)).ok_or_else(|| ArgError::InvalidValue {
                flag: SPEED_ENV.to_owned(),
                value: text.clone(),
                reason: "expected a speed factor of 0.001 to 1000 (1: as modelled)".to_owned(),
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
        params: None,
        served_model_name: String::new(),
        host: "127.0.0.1".into(),
        port: if engine == EngineKind::Vllm { 8000 } else { 30000 },
        max_model_len: 32768,
        max_num_seqs: 0,
        max_num_seqs_given: false,
        state_pool: StatePool::default(),
        state_types: StateTypes::default(),
        block_size: None,
        max_num_batched_tokens: 0,
        enable_prefix_caching: true,
        kv_cache_dtype: "auto".into(),
        performance_mode: None,
        speculative_config: None,
        reasoning_parser: None,
        language_model_only: false,
        enforce_eager: false,
        gpu_memory_utilization: None,
        kv_cache_memory_bytes: None,
        max_total_tokens: None,
        tensor_parallel_size: 1,
        pipeline_parallel_size: 1,
        data_parallel_size: 1,
        dp_attention: false,
        routing: Routing::of(engine),
        refused: None,
        weights_fp8: false,
        chunked_prefill: true,
        async_scheduling: None,
        overlap_schedule: true,
        mixed_batches: engine == EngineKind::Vllm,
        cuda_graphs: true,
        max_capture_size: None,
        capture_sizes: None,
        unmodelled: Vec::new(),
        other_model_names: Vec::new(),
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
    let mut given = Given::default();
    let words: Vec<String> = rest.iter().map(|word| flags::spelled(engine, word)).collect();
    let mut i = 0;
    while i < words.len() {
        let arg = words[i].as_str();
        i += 1;
        if !arg.starts_with('-') || arg == "-" {
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
        if name.starts_with("--sim-") {
            // A switch takes no value: the word after it is the next argument.
            let switch = SIM_FLAGS.iter().any(|(flag, sample, _)| *flag == name && sample.is_empty());
            let value = if switch { Ok(String::new()) } else { one_value(&words, &mut i, name, inline) };
            sim_flag(&mut config, &mut given, name, inline, value)?;
            continue;
        }
        // vLLM's `--section.key value`: one key of a JSON-valued option.
        let (option, key) = match name.split_once('.') {
            Some((option, key)) if engine == EngineKind::Vllm && !key.is_empty() => (option, Some(key)),
            _ => (name, None),
        };
        let (flag, negated) = match flags::resolve(engine, option) {
            flags::Resolved::Found(flag, negated) => (flag, negated),
            flags::Resolved::Ambiguous(matches) => {
                return Err(ArgError::Ambiguous { option: option.into(), matches: matches.join(", ") });
            }
            flags::Resolved::Unknown => return Err(ArgError::Unrecognized(arg.into())),
        };
        if let Some(key) = key
            && !flags::JSON_OPTIONS.contains(&flag.name())
        {
            return Err(invalid(option, key, "only a JSON-valued option takes keys one by one"));
        }
        // A key can only follow a JSON option, which takes one value.
        let values = match (flag.kind, key) {
            (Kind::Value, _) => vec![one_value(&words, &mut i, name, inline)?],
            (Kind::Switch | Kind::Bool, _) => match inline {
                Some(value) => return Err(ArgError::ValueOnSwitch { flag: name.into(), value: value.into() }),
                None => Vec::new(),
            },
            (Kind::Optional, _) => match inline {
                Some(value) => vec![value.to_owned()],
                None if words.get(i).is_some_and(|w| !flags::looks_like_option(w)) => {
                    i += 1;
                    vec![words[i - 1].clone()]
                }
                None => Vec::new(),
            },
            (Kind::Nargs, _) => match inline {
                Some(value) => vec![value.to_owned()],
                None => {
                    let start = i;
                    while words.get(i).is_some_and(|w| !flags::looks_like_option(w)) {
                        i += 1;
                    }
                    if i == start {
                        return Err(ArgError::MissingValues(name.into()));
                    }
                    words[start..i].to_vec()
                }
            },
        };
        if !flag.choices.is_empty() && key.is_none() {
            for value in &values {
                choice(name, value.clone(), flag.choices)?;
            }
        }
        let on = !negated;
        if !engine_flag(&mut config, &mut given, (flag.name(), key), on, &values)? {
            // Taken as the engine takes it, but nothing the simulator models: named at startup.
            config.unmodelled.push(std::iter::once(name.to_owned()).chain(values).collect::<Vec<_>>().join(" "));
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
    let gpu_name = given.gpu.as_deref().or(env_gpu).unwrap_or("H200");
    config.gpu = profile::gpu(gpu_name).ok_or_else(|| {
        let flag = if given.gpu.is_some() { "--sim-gpu" } else { GPU_ENV };
        invalid(flag, gpu_name, "the simulator knows H100 and H200")
    })?;
    finish(&mut config, given)?;
    Ok(config)
}

/// What the command line gave, where the engine's defaults depend on whether a flag was given.
#[derive(Default)]
struct Given {
    max_seqs: Option<usize>,
    budget: Option<Budget>,
    gpu: Option<String>,
    startup_from_model: bool,
    prefix_caching: Option<bool>,
    /// vLLM's `--speculative-config`, with any `--speculative-config.KEY` merged in.
    speculative: Option<serde_json::Map<String, serde_json::Value>>,
    /// vLLM's `--compilation-config` (`-cc`), with its keys given one by one merged in.
    compilation: serde_json::Map<String, serde_json::Value>,
    /// SGLang's `--speculative-algorithm`, `--speculative-num-steps` and `--speculative-num-draft-tokens`.
    sglang_speculation: (Option<String>, Option<usize>, Option<usize>),
    /// SGLang's `--speculative-eagle-topk` was given (taken, not modelled).
    eagle_topk: bool,
    /// vLLM's `--mamba-ssm-cache-dtype` and `--mamba-cache-dtype`, resolved against the model.
    mamba_dtypes: (Option<String>, Option<String>),
}

/// The one value of `name`: given inline, else the next word.
fn one_value(words: &[String], i: &mut usize, name: &str, inline: Option<&str>) -> Result<String, ArgError> {
    match inline {
        Some(value) => Ok(value.to_owned()),
        None => match words.get(*i) {
            Some(word) if !flags::looks_like_option(word) => {
                *i += 1;
                Ok(word.clone())
            }
            _ => Err(ArgError::MissingValue(name.into())),
        },
    }
}

/// The simulator's own `--sim-*` flags.
fn sim_flag(
    config: &mut SimConfig,
    given: &mut Given,
    name: &str,
    inline: Option<&str>,
    value: Result<String, ArgError>,
) -> Result<(), ArgError> {
    let switch = || match inline {
        Some(value) => Err(ArgError::ValueOnSwitch { flag: name.into(), value: value.into() }),
        None => Ok(true),
    };
    match name {
        "--sim-gpu" => given.gpu = Some(value?),
        "--sim-params" => {
            let text = value?;
            config.params = Some(profile::Params::parse(&text).ok_or_else(|| {
                invalid(name, &text, "must be a size as model names write it: 8B, 0.6B, 270M, 355B-A32B")
            })?);
        }
        "--sim-startup-ms" => match value?.as_str() {
            "model" => given.startup_from_model = true,
            text => config.startup_delay = millis(name, text)?,
        },
        "--sim-speedup" => {
            let text = value?;
            config.speedup = parse(name, &text)?;
            if !SPEEDS.contains(&config.speedup) {
                return Err(invalid(name, &text, "must be 0.001 to 1000"));
            }
        }
        "--sim-spec-acceptance" => config.spec_acceptance = Some(fraction(name, &value?)?),
        "--sim-fail-rate" => config.faults.fail_rate = fraction(name, &value?)?,
        "--sim-crash-after" => config.faults.crash_after = Some(parse(name, &value?)?),
        "--sim-stall-rate" => config.faults.stall_rate = fraction(name, &value?)?,
        "--sim-stall-ms" => config.faults.stall = millis(name, &value?)?,
        "--sim-disconnect-rate" => config.faults.disconnect_rate = fraction(name, &value?)?,
        "--sim-spec-failure-batch" => config.faults.spec_failure_batch = Some(parse(name, &value?)?),
        "--sim-refuse-cache-reset" => config.faults.refuse_cache_reset = switch()?,
        "--sim-step-jitter-pct" => {
            let text = value?;
            config.faults.step_jitter_pct = parse(name, &text)?;
            if !(0.0..=50.0).contains(&config.faults.step_jitter_pct) {
                return Err(invalid(name, &text, "must be 0 to 50 percent"));
            }
        }
        "--sim-seed" => config.faults.seed = parse(name, &value?)?,
        "--sim-slowdown-pct-per-s" => {
            let text = value?;
            config.faults.slowdown_pct_per_s = parse(name, &text)?;
            if !(0.0..=1000.0).contains(&config.faults.slowdown_pct_per_s) {
                return Err(invalid(name, &text, "must be 0 to 1000 percent"));
            }
        }
        _ => return Err(ArgError::Unrecognized(name.into())),
    }
    Ok(())
}

/// An engine option the simulator models, by the name [`flags`] knows it by (and a vLLM
/// option's JSON key, `--speculative-config.method`): `false` for one it takes but does not model.
fn engine_flag(
    config: &mut SimConfig,
    given: &mut Given,
    (name, key): (&str, Option<&str>),
    on: bool,
    values: &[String],
) -> Result<bool, ArgError> {
    use EngineKind::{Sglang, Vllm};
    let value = || values.first().cloned().unwrap_or_default();
    match (config.engine, name) {
        (_, "--host") => config.host = value(),
        (_, "--port") => config.port = parse(name, &value())?,
        (Vllm, "--model") | (Sglang, "--model-path") => config.model = value(),
        (_, "--served-model-name") => {
            config.served_model_name = value();
            config.other_model_names = values.iter().skip(1).cloned().collect();
        }
        (Vllm, "--max-model-len") => config.max_model_len = human_number(name, &value())?,
        (Sglang, "--context-length") => config.max_model_len = parse(name, &value())?,
        (Vllm, "--max-num-seqs") | (Sglang, "--max-running-requests") => given.max_seqs = Some(parse(name, &value())?),
        (Vllm, "--max-num-batched-tokens") => given.budget = Some(Budget::Tokens(human_number(name, &value())?)),
        // -1 turns chunking off: a prompt is prefilled in one step, whatever its length.
        (Sglang, "--chunked-prefill-size") => {
            given.budget = Some(match value().as_str() {
                "-1" => Budget::Unchunked,
                text => Budget::Tokens(parse(name, text)?),
            })
        }
        (Vllm, "--enable-chunked-prefill") => config.chunked_prefill = on,
        (Vllm, "--enable-prefix-caching") => given.prefix_caching = Some(on),
        (Sglang, "--disable-radix-cache") => given.prefix_caching = Some(false),
        (_, "--kv-cache-dtype") => {
            // An FP8 cache halves a block; SGLang's FP4 one is taken but sized as BF16.
            config.kv_cache_dtype = value();
            return Ok(config.kv_cache_dtype != "fp4_e2m1");
        }
        (Vllm, "--performance-mode") => config.performance_mode = Some(value()),
        (Vllm, "--speculative-config") => {
            let text = value();
            let spec = given.speculative.get_or_insert_default();
            match key {
                // A key given alone: its value as JSON where it reads as JSON, else as a string.
                Some(key) => {
                    let parsed = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                    spec.insert(key.to_owned(), parsed);
                }
                None => match serde_json::from_str::<serde_json::Value>(&text) {
                    Ok(serde_json::Value::Object(object)) => spec.extend(object),
                    Ok(_) => return Err(invalid(name, &text, "expected a JSON object")),
                    Err(err) => return Err(invalid(name, &text, err)),
                },
            }
        }
        (Vllm, "--compilation-config") => {
            let text = value();
            match key {
                Some(key) => {
                    let parsed = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                    given.compilation.insert(key.to_owned(), parsed);
                }
                // `-cc 3` is an optimization level, as `-O3`; the simulator models none of them.
                None if text.parse::<u8>().is_ok() => return Ok(false),
                None => match serde_json::from_str::<serde_json::Value>(&text) {
                    Ok(serde_json::Value::Object(object)) => given.compilation.extend(object),
                    _ => return Err(invalid(name, &text, "expected a JSON object")),
                },
            }
            return Ok(compilation_modelled(&given.compilation));
        }
        (Vllm, "--max-cudagraph-capture-size") => {
            given.compilation.insert("max_cudagraph_capture_size".into(), parse::<usize>(name, &value())?.into());
        }
        (Vllm, "--cudagraph-capture-sizes") => {
            let sizes = values.iter().map(|v| parse::<usize>(name, v)).collect::<Result<Vec<_>, _>>()?;
            given.compilation.insert("cudagraph_capture_sizes".into(), sizes.into());
        }
        (Sglang, "--cuda-graph-max-bs") => config.max_capture_size = Some(parse(name, &value())?),
        (Sglang, "--cuda-graph-bs") => {
            config.capture_sizes = Some(values.iter().map(|v| parse::<usize>(name, v)).collect::<Result<_, _>>()?);
        }
        (Sglang, "--disable-cuda-graph") => config.cuda_graphs = false,
        (Vllm, "--async-scheduling") => config.async_scheduling = Some(on),
        (Sglang, "--disable-overlap-schedule") => config.overlap_schedule = false,
        (Sglang, "--enable-mixed-chunk") => config.mixed_batches = true,
        (Sglang, "--speculative-algorithm") => given.sglang_speculation.0 = Some(value()),
        (Sglang, "--speculative-num-steps") => given.sglang_speculation.1 = Some(parse(name, &value())?),
        (Sglang, "--speculative-num-draft-tokens") => given.sglang_speculation.2 = Some(parse(name, &value())?),
        (Sglang, "--speculative-eagle-topk") => {
            // Tree drafting is not modelled; SGLang's checks of it are.
            given.eagle_topk = true;
            return Ok(false);
        }
        (_, "--reasoning-parser") => config.reasoning_parser = Some(value()),
        (Vllm, "--language-model-only") => config.language_model_only = on,
        (Vllm, "--enforce-eager") => config.enforce_eager = on,
        // 0 is vLLM's "not given": it profiles the memory as without it.
        (Vllm, "--kv-cache-memory-bytes") => {
            config.kv_cache_memory_bytes = Some(human_number(name, &value())?).filter(|&bytes| bytes > 0);
        }
        (Sglang, "--max-total-tokens") => config.max_total_tokens = Some(parse(name, &value())?),
        (Sglang, "--max-mamba-cache-size") => config.state_pool.size = Some(parse(name, &value())?),
        (Sglang, "--mamba-full-memory-ratio") => {
            let ratio: f64 = parse(name, &value())?;
            if !(ratio > 0.0 && ratio.is_finite()) {
                return Err(invalid(name, &value(), "must be a positive number"));
            }
            config.state_pool.full_memory_ratio = ratio;
        }
        (Sglang, "--mamba-scheduler-strategy") => config.state_pool.extra_buffer = value() == "extra_buffer",
        (Sglang, "--mamba-ssm-dtype") => config.state_types.matrices_16bit = value() != "float32",
        // The simulator's blocks are 16 tokens: 1 and 8 are taken at 16 (not modelled); a hybrid
        // model's block is the one vLLM sizes to its state (`SimConfig::vllm_hybrid_block`).
        (Vllm, "--block-size") => {
            let size: usize = parse(name, &value())?;
            config.block_size = Some(size);
            return Ok(size >= crate::kv::BLOCK_TOKENS);
        }
        // Qwen3.5's and Qwen3-Next's mode follows prefix caching whatever is asked: `none` without
        // it, `align` with it (`all` falls back to it: vLLM 0.17 supports it on neither). A
        // transformer has no state to cache.
        (Vllm, "--mamba-cache-mode") => {}
        (Vllm, "--mamba-ssm-cache-dtype") => given.mamba_dtypes.0 = Some(value()),
        (Vllm, "--mamba-cache-dtype") => given.mamba_dtypes.1 = Some(value()),
        (Vllm, "--gpu-memory-utilization") | (Sglang, "--mem-fraction-static") => {
            config.gpu_memory_utilization = Some(parse(name, &value())?);
        }
        (_, "--tensor-parallel-size") => config.tensor_parallel_size = parse(name, &value())?,
        (_, "--pipeline-parallel-size") => config.pipeline_parallel_size = parse(name, &value())?,
        (_, "--data-parallel-size") => config.data_parallel_size = parse(name, &value())?,
        (Sglang, "--load-balance-method") => match value().as_str() {
            "auto" | "round_robin" => config.routing = Routing::RoundRobin,
            "total_requests" => config.routing = Routing::LeastLoaded { waiting_weight: 1 },
            // By tokens in flight, or by a disaggregated prefill's room: taken, not modelled.
            _ => return Ok(false),
        },
        (Sglang, "--enable-dp-attention") => config.dp_attention = true,
        (Vllm, "--quantization") | (Sglang, "--quantization") => {
            // FP8 weights quantised as the engine loads them run as an FP8 checkpoint does; other
            // methods are taken but not modelled.
            config.weights_fp8 = matches!(value().as_str(), "fp8" | "w8a8_fp8");
            return Ok(config.weights_fp8);
        }
        (_, "--trust-remote-code") => config.trust_remote_code = on,
        (Sglang, "--enable-metrics") => config.enable_metrics = true,
        (Vllm, "--seed") | (Sglang, "--random-seed") => config.seed = parse(name, &value())?,
        (_, "--config") => {
            return Err(invalid(
                name,
                &value(),
                "the simulator does not read a file of options: give them on the command line",
            ));
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The types vLLM 0.17.1 keeps a linear-attention state in (`MambaStateDtypeCalculator`): the
/// convolution window in `--mamba-cache-dtype` (`auto`: the model's BF16), the matrices in
/// `--mamba-ssm-cache-dtype`, whose `auto` is what the model's config asks (Qwen3.5's: FP32, SGLang's
/// default too), else the window's type (Qwen3-Next: BF16).
fn vllm_state_types(model: &ModelShape, ssm: Option<&str>, conv: Option<&str>) -> StateTypes {
    let conv_fp32 = conv == Some("float32");
    let matrices_16bit = match ssm {
        Some("float16") => true,
        Some("float32") => false,
        _ => !model.config_fp32_states && !conv_fp32,
    };
    StateTypes { matrices_16bit, conv_fp32 }
}

/// Whether the simulator models what a compilation config sets: CUDA graphs off, or their sizes.
fn compilation_modelled(compilation: &serde_json::Map<String, serde_json::Value>) -> bool {
    compilation
        .keys()
        .any(|k| matches!(k.as_str(), "cudagraph_mode" | "max_cudagraph_capture_size" | "cudagraph_capture_sizes"))
}

/// The engine's defaults where the command line left them, as the engine derives them.
fn finish(config: &mut SimConfig, given: Given) -> Result<(), ArgError> {
    let engine = config.engine;
    let hybrid_in_vllm = engine == EngineKind::Vllm && config.model_shape().hybrid;
    if engine == EngineKind::Vllm {
        config.state_types =
            vllm_state_types(&config.model_shape(), given.mamba_dtypes.0.as_deref(), given.mamba_dtypes.1.as_deref());
        // A hybrid model's block is the one vLLM sizes to its state, or a larger one given; where
        // the simulator does not know the architecture, the option is named as not modelled (a
        // block under 16 tokens already is).
        let unknown = config.vllm_hybrid_block().is_none();
        if let Some(size) =
            config.block_size.filter(|&size| hybrid_in_vllm && unknown && size >= crate::kv::BLOCK_TOKENS)
        {
            config.unmodelled.push(format!("--block-size {size}"));
        }
    }
    config.enable_prefix_caching = given.prefix_caching.unwrap_or(!hybrid_in_vllm);
    if let Some(mut spec) = given.speculative {
        let method = spec.get("method").and_then(serde_json::Value::as_str).unwrap_or_default();
        let own_layers = method == "mtp" || method.ends_with("_mtp");
        if own_layers && config.model_shape().hybrid && !spec.contains_key("num_speculative_tokens") {
            // Drafted by the model's own MTP layers, vLLM drafts as many tokens as they predict
            // (`n_predict`): one in Qwen3.5 and Qwen3-Next.
            spec.insert("num_speculative_tokens".into(), 1.into());
        }
        let text = serde_json::Value::Object(spec.clone()).to_string();
        if spec.get("num_speculative_tokens").and_then(serde_json::Value::as_u64).is_none_or(|k| k == 0) {
            return Err(invalid("--speculative-config", &text, "num_speculative_tokens must be a positive integer"));
        }
        config.speculative_config = Some(serde_json::Value::Object(spec));
    }
    if let (Some(algorithm), steps, draft_tokens) = given.sglang_speculation {
        config.refused =
            sglang_speculation_refused(&algorithm, steps, draft_tokens, given.eagle_topk, config.dp_attention);
        // NEXTN is SGLang's name for a model's own MTP layers; EAGLE-family drafts take
        // `--speculative-num-steps` tokens a step (3 unless given, as SGLang picks for Qwen), n-gram
        // drafts their draft tokens less one (SGLang's default: its longest match window, 12).
        let (method, tokens) = match algorithm.as_str() {
            "NEXTN" => ("mtp", steps.unwrap_or(3)),
            "EAGLE" | "EAGLE3" => ("eagle", steps.unwrap_or(3)),
            "STANDALONE" => ("draft_model", steps.unwrap_or(3)),
            _ => ("ngram", draft_tokens.map_or(11, |d| d.saturating_sub(1))),
        };
        if tokens == 0 {
            return Err(match method {
                "ngram" => invalid(
                    "--speculative-num-draft-tokens",
                    &format!("{}", draft_tokens.unwrap_or(0)),
                    "must be at least 2",
                ),
                _ => invalid("--speculative-num-steps", "0", "must be a positive integer"),
            });
        }
        config.speculative_config = Some(serde_json::json!({ "method": method, "num_speculative_tokens": tokens }));
        // SGLang runs speculative decoding without its overlap scheduler, at 48 requests unless told.
        config.overlap_schedule = false;
    }
    if engine == EngineKind::Sglang {
        // SGLang 0.5.9's radix cache keeps a Qwen3.5 or Qwen3-Next prefix's states with no spare
        // buffer (`no_buffer`) unless `--mamba-scheduler-strategy extra_buffer`, and its overlap
        // scheduler cannot run beside that (`_handle_mamba_radix_cache`): the scheduler goes, or,
        // with speculative decoding, the radix cache. Pipeline stages run without it too.
        let no_buffer = config.model_shape().hybrid && config.enable_prefix_caching && !config.state_pool.extra_buffer;
        if no_buffer && config.speculative_config.is_some() {
            config.enable_prefix_caching = false;
        } else if no_buffer || config.pipeline_parallel_size > 1 {
            config.overlap_schedule = false;
        }
    }
    let costs = config.engine_costs();
    let sglang_speculating = engine == EngineKind::Sglang && config.speculative_config.is_some();
    let default_seqs = if sglang_speculating { 48 } else { costs.default_max_num_seqs };
    config.max_num_seqs = given.max_seqs.unwrap_or(default_seqs);
    config.max_num_seqs_given = given.max_seqs.is_some() || sglang_speculating;
    config.max_num_batched_tokens = match given.budget {
        Some(Budget::Tokens(tokens)) => tokens,
        Some(Budget::Unchunked) => {
            config.chunked_prefill = false;
            config.max_model_len.max(costs.default_max_num_batched_tokens)
        }
        None if engine == EngineKind::Vllm => {
            // vLLM: unchunked, at least a whole context; never more than its sequences can hold.
            let mut budget = costs.default_max_num_batched_tokens;
            if !config.chunked_prefill {
                budget = budget.max(config.max_model_len);
            }
            budget.min(config.max_num_seqs.saturating_mul(config.max_model_len))
        }
        None => costs.default_max_num_batched_tokens,
    };
    if engine == EngineKind::Vllm && given.max_seqs.is_none() {
        // vLLM's default sequence limit never passes its token budget.
        config.max_num_seqs = config.max_num_seqs.min(config.max_num_batched_tokens);
    }
    let compilation = &given.compilation;
    if compilation
        .get("cudagraph_mode")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|m| m.eq_ignore_ascii_case("none"))
    {
        config.cuda_graphs = false;
    }
    if engine == EngineKind::Vllm {
        let size = |v: &serde_json::Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
        config.max_capture_size = compilation.get("max_cudagraph_capture_size").and_then(size);
        config.capture_sizes = compilation
            .get("cudagraph_capture_sizes")
            .and_then(serde_json::Value::as_array)
            .map(|sizes| sizes.iter().filter_map(size).collect());
    }
    if given.startup_from_model {
        let seconds =
            config.model_shape().weight_bytes() / config.coefficients.load_bandwidth + config.coefficients.load_warmup;
        config.startup_delay = Duration::from_secs_f64(seconds);
    }
    Ok(())
}

/// What SGLang's checks of its speculative options refuse once they are parsed, in its words.
fn sglang_speculation_refused(
    algorithm: &str,
    steps: Option<usize>,
    draft_tokens: Option<usize>,
    eagle_topk: bool,
    dp_attention: bool,
) -> Option<String> {
    let eagle_family = matches!(algorithm, "NEXTN" | "EAGLE" | "EAGLE3" | "STANDALONE");
    if dp_attention && matches!(algorithm, "STANDALONE" | "NGRAM") {
        let name = algorithm.to_lowercase();
        return Some(format!("ValueError: Currently {name} speculative decoding does not support dp attention."));
    }
    // SGLang picks the steps, top-k and draft tokens together, and asserts that none was given.
    (eagle_family && steps.is_none() && (draft_tokens.is_some() || eagle_topk)).then(|| {
        "AssertionError: assert self.speculative_eagle_topk is None and self.speculative_num_draft_tokens is None \
         (SGLang chooses them with --speculative-num-steps when it is not given)"
            .to_owned()
    })
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

/// A count as vLLM reads one ([`flags::human_count`]).
fn human_number(flag: &str, value: &str) -> Result<usize, ArgError> {
    let count = flags::human_count(value).map_err(|reason| invalid(flag, value, reason))?;
    usize::try_from(count).map_err(|err| invalid(flag, value, err))
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
        assert_eq!((c.max_num_seqs, c.enable_prefix_caching), (4096, false));
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

    /// A value `flag` takes wherever the simulator reads it; `x` elsewhere.
    fn sample(flag: &flags::Flag) -> String {
        if let Some(choice) = flag.choices.first().filter(|_| !matches!(flag.name(), "--quantization" | "--block-size"))
        {
            return (*choice).to_owned();
        }
        let value = match flag.name() {
            "--port" => "8001",
            "--host" => "127.0.0.1",
            "--speculative-config" => r#"{"method":"mtp","num_speculative_tokens":2}"#,
            "--compilation-config" => r#"{"cudagraph_mode":"NONE"}"#,
            "--quantization" => "fp8",
            "--max-model-len" | "--context-length" => "4096",
            "--max-num-batched-tokens" | "--chunked-prefill-size" => "8192",
            "--gpu-memory-utilization" | "--mem-fraction-static" => "0.8",
            "--max-cudagraph-capture-size" | "--cudagraph-capture-sizes" => "64",
            "--cuda-graph-max-bs" | "--cuda-graph-bs" => "64",
            "--kv-cache-memory-bytes" => "8G",
            "--block-size" => "32",
            "--max-total-tokens" => "100000",
            "--max-mamba-cache-size" => "600",
            "--mamba-full-memory-ratio" => "1.5",
            name if name.contains("parallel-size")
                || name.ends_with("seed")
                || name.starts_with("--max-num")
                || name.starts_with("--speculative-num")
                || name == "--max-running-requests" =>
            {
                "2"
            }
            _ => "x",
        };
        value.to_owned()
    }

    /// The options the simulator models, by the name each engine's parser knows them by.
    const MODELLED: [(EngineKind, &[&str]); 2] = [
        (
            EngineKind::Vllm,
            &[
                "--host",
                "--port",
                "--model",
                "--served-model-name",
                "--max-model-len",
                "--max-num-seqs",
                "--max-num-batched-tokens",
                "--enable-chunked-prefill",
                "--enable-prefix-caching",
                "--kv-cache-dtype",
                "--performance-mode",
                "--speculative-config",
                "--compilation-config",
                "--max-cudagraph-capture-size",
                "--cudagraph-capture-sizes",
                "--async-scheduling",
                "--reasoning-parser",
                "--language-model-only",
                "--enforce-eager",
                "--mamba-cache-dtype",
                "--mamba-ssm-cache-dtype",
                "--mamba-cache-mode",
                "--block-size",
                "--gpu-memory-utilization",
                "--kv-cache-memory-bytes",
                "--tensor-parallel-size",
                "--pipeline-parallel-size",
                "--data-parallel-size",
                "--quantization",
                "--trust-remote-code",
                "--seed",
            ],
        ),
        (
            EngineKind::Sglang,
            &[
                "--host",
                "--port",
                "--model-path",
                "--served-model-name",
                "--context-length",
                "--max-running-requests",
                "--chunked-prefill-size",
                "--disable-radix-cache",
                "--kv-cache-dtype",
                "--disable-overlap-schedule",
                "--enable-mixed-chunk",
                "--cuda-graph-max-bs",
                "--cuda-graph-bs",
                "--disable-cuda-graph",
                "--speculative-algorithm",
                "--speculative-num-steps",
                "--speculative-num-draft-tokens",
                "--reasoning-parser",
                "--mem-fraction-static",
                "--max-total-tokens",
                "--max-mamba-cache-size",
                "--mamba-full-memory-ratio",
                "--mamba-scheduler-strategy",
                "--mamba-ssm-dtype",
                "--tensor-parallel-size",
                "--pipeline-parallel-size",
                "--data-parallel-size",
                "--load-balance-method",
                "--enable-dp-attention",
                "--quantization",
                "--trust-remote-code",
                "--enable-metrics",
                "--random-seed",
            ],
        ),
    ];

    #[test]
    fn routing_picks_the_least_loaded_replica_or_each_in_turn() {
        let vllm = Routing::of(EngineKind::Vllm);
        // (waiting, running): a waiting request weighs four running ones; equals go to the first.
        assert_eq!(vllm.pick([(1, 0), (0, 3)], 0), 1);
        assert_eq!(vllm.pick([(1, 0), (0, 5)], 0), 0);
        assert_eq!(vllm.pick([(0, 2), (0, 2), (0, 1)], 7), 2);
        assert_eq!(vllm.pick([(0, 0), (0, 0)], 9), 0);
        let fewest = Routing::LeastLoaded { waiting_weight: 1 };
        assert_eq!(fewest.pick([(1, 0), (0, 3)], 0), 0);
        let sglang = Routing::of(EngineKind::Sglang);
        assert_eq!((0..5).map(|n| sglang.pick([(9, 9), (0, 0), (0, 0)], n)).collect::<Vec<_>>(), [0, 1, 2, 0, 1]);
        assert_eq!(
            parse_command_line(&args("sglang serve --model-path m --load-balance-method total_requests"))
                .expect("valid")
                .routing,
            fewest
        );
        let c =
            parse_command_line(&args("sglang serve --model-path m --load-balance-method total_tokens")).expect("valid");
        assert_eq!(
            (c.routing, c.unmodelled),
            (Routing::RoundRobin, vec!["--load-balance-method total_tokens".to_owned()])
        );
    }

    #[test]
    fn every_option_of_both_engines_is_taken_and_the_unmodelled_are_named() {
        for (engine, modelled) in MODELLED {
            let start = if engine == EngineKind::Vllm { "vllm serve m" } else { "sglang serve --model-path m" };
            for name in modelled {
                assert!(flags::table(engine).iter().any(|f| f.name() == *name), "{engine} has no {name}");
            }
            for flag in flags::table(engine).iter().filter(|f| f.name() != "--config") {
                let value = match flag.kind {
                    Kind::Switch | Kind::Bool => String::new(),
                    _ => sample(flag),
                };
                // Every name of it, and the `--no-` form of a boolean.
                let mut forms: Vec<String> = flag.names.iter().map(|n| format!("{n} {value}")).collect();
                if flag.kind == Kind::Bool {
                    forms.push(format!("--no-{}", &flag.name()[2..]));
                }
                for form in forms {
                    let line = format!("{start} {form}");
                    let c = parse_command_line_with_gpu(&args(&line), None).unwrap_or_else(|e| panic!("{line}: {e}"));
                    // Modelled, it is read; else it is named as given, once.
                    let expected: Vec<String> =
                        if modelled.contains(&flag.name()) { Vec::new() } else { vec![form.trim_end().to_owned()] };
                    assert_eq!(c.unmodelled, expected, "{line}");
                }
            }
        }
        let c = parse_command_line(&args("vllm serve m --block-size 8 --async-scheduling --dtype=bfloat16 -O3"))
            .expect("vLLM takes them");
        assert_eq!(c.unmodelled, ["--block-size 8", "--dtype bfloat16", "--optimization-level 3"]);
        assert_eq!(c.async_scheduling, Some(true));
        // A simulator switch leaves the word after it alone: here, vLLM's model.
        let c = parse_command_line(&args("vllm serve --sim-refuse-cache-reset Qwen/Qwen3-8B --kv-transfer-config.x 1"))
            .expect("a switch, then the model");
        assert_eq!((c.model.as_str(), c.faults.refuse_cache_reset), ("Qwen/Qwen3-8B", true));
        assert_eq!(c.unmodelled, ["--kv-transfer-config.x 1"]);
    }

    #[test]
    fn options_are_read_as_each_engines_parser_reads_them() {
        let vllm = |line: &str| parse_command_line(&args(&format!("vllm serve Qwen/Qwen3.5-9B {line}"))).expect(line);
        // vLLM: underscores for dashes, human-readable counts, keys of a JSON option one by one.
        let c = vllm("--max_num_seqs 64 --max-model-len 32k --max-num-batched-tokens=16K");
        assert_eq!((c.max_num_seqs, c.max_model_len, c.max_num_batched_tokens), (64, 32_000, 16_384));
        assert_eq!(vllm("--max-model-len 25.6k").max_model_len, 25_600);
        let c = vllm("--speculative-config.method mtp --speculative-config.num_speculative_tokens 2");
        assert_eq!(c.speculative_config, Some(serde_json::json!({"method": "mtp", "num_speculative_tokens": 2})));
        // The model's own MTP layers draft as many tokens as they predict unless told: one.
        for given in [r#"--speculative-config {"method":"mtp"}"#, "--speculative-config.method qwen3_5_mtp"] {
            let tokens = vllm(given).speculative_config.and_then(|s| s.get("num_speculative_tokens").cloned());
            assert_eq!(tokens, Some(1.into()), "{given}");
        }
        // CUDA graphs: off, or up to a size (cut to one vLLM captures), or at the sizes given.
        assert!(!vllm("-cc.cudagraph_mode=NONE").cuda_graphs);
        assert!(!vllm(r#"--compilation-config {"cudagraph_mode":"NONE"}"#).cuda_graphs);
        assert_eq!(vllm("--max-cudagraph-capture-size 100").max_capture_size, Some(100));
        assert_eq!(vllm("--cudagraph-capture-sizes 8 16 48").capture_sizes, Some(vec![8, 16, 48]));
        // FP8 weights quantised as they load run as an FP8 checkpoint's; other methods are named.
        assert_eq!(vllm("-q fp8").model_shape().bytes_per_param, 1.0);
        let awq = vllm("--quantization awq");
        assert_eq!(
            (awq.model_shape().bytes_per_param, awq.unmodelled.as_slice()),
            (2.0, &["--quantization awq".to_owned()][..])
        );
        // Several served names: requests may use any.
        let c = vllm("--served-model-name a b");
        assert_eq!((c.served_model_name.as_str(), c.other_model_names.as_slice()), ("a", &["b".to_owned()][..]));
        // Asynchronous scheduling: on unless turned off or the drafting method cannot.
        assert!(vllm("").overlaps() && !vllm("--no-async-scheduling").overlaps());
        assert_eq!(vllm("--no-async-scheduling").engine_costs().overlap, 0.0);
        assert!(!vllm(r#"--speculative-config={"method":"ngram","num_speculative_tokens":3}"#).overlaps());
        assert!(vllm(r#"--speculative-config={"method":"qwen3_5_mtp","num_speculative_tokens":1}"#).overlaps());
        // A hybrid model's fixed step adds its linear-attention metadata to a transformer's, and a
        // mode's factor takes the whole step.
        let step = |line: &str| {
            parse_command_line(&args(&format!("vllm serve {line}"))).expect(line).engine_costs().step_overhead
        };
        let (transformer, hybrid) = (COEFFICIENTS.vllm.step_overhead, COEFFICIENTS.vllm_hybrid_step_overhead);
        assert!(transformer > 0.0 && hybrid > 0.0);
        assert_eq!(step("Qwen/Qwen3-8B"), transformer);
        assert_eq!(step("Qwen/Qwen3.5-9B"), transformer + hybrid);
        let interactive = step("Qwen/Qwen3.5-9B --performance-mode interactivity");
        assert_eq!(interactive, (transformer + hybrid) * COEFFICIENTS.interactivity_step_factor);
        // Unchunked prefill: the default budget holds a whole context.
        assert_eq!(vllm("--no-enable-chunked-prefill").max_num_batched_tokens, 32768);
        assert!(!vllm("--no-enable-chunked-prefill").chunked_prefill);

        let sglang = |line: &str| {
            parse_command_line(&args(&format!("sglang serve --model-path Qwen/Qwen3.5-9B {line}"))).expect(line)
        };
        // SGLang's MTP: NEXTN, three draft tokens unless told, 48 requests, no overlap scheduler.
        let c = sglang("--speculative-algorithm NEXTN");
        assert_eq!(c.speculative_config, Some(serde_json::json!({"method": "mtp", "num_speculative_tokens": 3})));
        assert_eq!((c.max_num_seqs, c.overlaps()), (48, false));
        let c = sglang("--speculative-algorithm EAGLE --speculative-num-steps 2 --max-running-requests 64");
        assert_eq!(c.speculative_config, Some(serde_json::json!({"method": "eagle", "num_speculative_tokens": 2})));
        assert_eq!(c.max_num_seqs, 64);
        // Qwen3.5's states, cached in the radix cache between steps, take the overlap scheduler
        // away unless a buffer keeps them; beside drafts, SGLang drops the radix cache instead.
        assert!(!sglang("").overlaps() && sglang("").enable_prefix_caching);
        assert!(sglang("--disable-radix-cache").overlaps());
        assert!(sglang("--mamba-scheduler-strategy extra_buffer").overlaps());
        assert!(!sglang("--disable-radix-cache --disable-overlap-schedule").overlaps());
        assert!(!sglang("--disable-radix-cache --pp-size 2").overlaps());
        // The fitted overlap is the reports' runs', without the scheduler; with it SGLang hides
        // at least as much as vLLM does.
        let fitted = COEFFICIENTS.sglang.overlap;
        assert_eq!(sglang("").engine_costs().overlap, fitted);
        assert_eq!(sglang("--disable-overlap-schedule").engine_costs().overlap, fitted);
        let scheduled = sglang("--disable-radix-cache").engine_costs().overlap;
        assert_eq!(scheduled, fitted.max(COEFFICIENTS.vllm.overlap));
        assert!(scheduled >= COEFFICIENTS.vllm.overlap);
        assert!(!sglang("--speculative-algorithm NEXTN").enable_prefix_caching);
        let extra = sglang("--speculative-algorithm NEXTN --mamba-scheduler-strategy extra_buffer");
        assert!(extra.enable_prefix_caching && !extra.overlaps());
        let transformer = |line: &str| {
            parse_command_line(&args(&format!("sglang serve --model-path Qwen/Qwen3-8B {line}"))).expect(line)
        };
        assert!(transformer("").overlaps() && transformer("").enable_prefix_caching);
        assert!(!transformer("--disable-overlap-schedule").overlaps());
        // Its fixed step is fitted on Qwen3.5 alone, where it carries the hybrid path's work; a
        // transformer's is vLLM's.
        assert_eq!(sglang("").engine_costs().step_overhead, COEFFICIENTS.sglang.step_overhead);
        assert_eq!(transformer("").engine_costs().step_overhead, COEFFICIENTS.vllm.step_overhead);
        // Data parallel attention shares the tensor-parallel GPUs.
        assert_eq!(sglang("--tp 2 --dp-size 2 --enable-dp-attention").gpus_needed(), 2);
        assert_eq!(sglang("--tp 2 --dp-size 2").gpus_needed(), 4);
        assert_eq!(sglang("--tensor-parallel-size 4").tensor_parallel_size, 4);
    }

    #[test]
    fn a_size_given_beside_the_model_sets_its_weights() {
        let c = parse_command_line(&args("vllm serve acme/house-model --sim-params 355B-A32B")).expect("valid");
        let shape = c.model_shape();
        assert_eq!((shape.total_params, shape.active_params, shape.size_guessed), (355e9, 32e9, false));
        // 710 GB of weights fit no one GPU; the name's guess of 8B does.
        assert!(crate::Scheduler::from_config(&c).is_err());
        let guessed = parse_command_line(&args("vllm serve acme/house-model")).expect("valid");
        assert!(guessed.model_shape().size_guessed && crate::Scheduler::from_config(&guessed).is_ok());
    }

    #[test]
    fn rejections() {
        // Speeds and slowdowns that would take a step past what a clock can hold.
        for speed in ["1e-300", "1e300", "0", "NaN"] {
            check_err(
                &format!("vllm serve m --sim-speedup {speed}"),
                &format!("argument --sim-speedup: invalid value \"{speed}\": must be 0.001 to 1000"),
            );
        }
        check_err(
            "vllm serve m --sim-slowdown-pct-per-s 1e300",
            "argument --sim-slowdown-pct-per-s: invalid value \"1e300\": must be 0 to 1000 percent",
        );
        check_err(
            "sglang serve --model-path m --speculative-algorithm NGRAM --speculative-num-draft-tokens 1",
            "argument --speculative-num-draft-tokens: invalid value \"1\": must be at least 2",
        );
        for size in ["8", "30B-A40B", "1e300B"] {
            check_err(
                &format!("vllm serve m --sim-params {size}"),
                &format!(
                    "argument --sim-params: invalid value \"{size}\": must be a size as model names write it: 8B, 0.6B, \
                     270M, 355B-A32B"
                ),
            );
        }
        check_err("vllm serve m --bogus 1", "unrecognized arguments: --bogus");
        check_err("vllm serve m --bogus=1", "unrecognized arguments: --bogus=1");
        check_err("vllm serve m extra", "unrecognized arguments: extra");
        check_err("vllm serve -z 2 m", "unrecognized arguments: -z");
        check_err("sglang serve --model-path m -tp 2", "unrecognized arguments: -tp");
        check_err("sglang serve --model-path m --max-num-seqs 4", "unrecognized arguments: --max-num-seqs");
        // vLLM's options SGLang does not have, and SGLang's own spelling of an FP8 cache.
        for option in ["--max-num-batched-tokens 8192", "--enable-prefix-caching", "--seed 1", "--language-model-only"]
        {
            let line = format!("sglang serve --model-path m {option}");
            let flag = option.split(' ').next().unwrap_or_default();
            check_err(&line, &format!("unrecognized arguments: {flag}"));
        }
        check_err(
            "sglang serve --model-path m --kv-cache-dtype fp8",
            "argument --kv-cache-dtype: invalid choice: 'fp8' (choose from 'auto', 'fp8_e5m2', 'fp8_e4m3', 'bf16', 'bfloat16', 'fp4_e2m1')",
        );
        // argparse's abbreviations: one option, or an error naming them all.
        check_err(
            "sglang serve --model-path m --pp 2",
            "ambiguous option: --pp could match --pp-size, --pp-max-micro-batch-size, --pp-async-batch-depth",
        );
        check_err(
            "vllm serve m --max-num 8",
            "ambiguous option: --max-num could match --max-num-batched-tokens, --max-num-seqs, --max-num-partial-prefills",
        );
        check_err(
            "vllm serve m --config opts.yaml",
            "argument --config: invalid value \"opts.yaml\": the simulator does not read a file of options: give them on the command line",
        );
        check_err("vllm serve m --served-model-name", "argument --served-model-name: expected at least one argument");
        check_err(
            "vllm serve m --max-model-len 1.5K",
            "argument --max-model-len: invalid value \"1.5K\": invalid digit found in string",
        );
        check_err(
            "vllm serve m --block-size 7",
            "argument --block-size: invalid choice: '7' (choose from '1', '8', '16', '32', '64', '128', '256')",
        );
        check_err(
            "vllm serve m --max-model-len.limit 3",
            "argument --max-model-len: invalid value \"limit\": only a JSON-valued option takes keys one by one",
        );
        check_err(
            "vllm serve m --no-trust-remote-code=1",
            "argument --no-trust-remote-code: ignored explicit argument \"1\"",
        );
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
            "argument --kv-cache-dtype: invalid choice: 'int4' (choose from 'auto', 'bfloat16', 'fp8', 'fp8_ds_mla', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')",
        );
        check_err(
            "vllm serve m --performance-mode fast",
            "argument --performance-mode: invalid choice: 'fast' (choose from 'balanced', 'interactivity', 'throughput')",
        );
        // A model without MTP layers has no draft count of its own to default to.
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
