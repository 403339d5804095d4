//! The engines' command-line options as their releases' argument parsers declare them (vLLM
//! 0.17.1's `vllm serve`, SGLang 0.5.9's `sglang.launch_server`): every name and alias, whether
//! it takes a value, and the values argparse allows where it restricts them. The simulator takes
//! every one of them, so a matrix that runs on a GPU also runs there, and the matrix warns of an
//! option the engine would refuse before anything runs.
//!
//! Read from each release's parser, not written from its docs; `--help` is left out (the
//! simulator prints its own).

use crate::engine::EngineKind;

/// How an option takes its value, as argparse's action and `nargs` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `store_true`: no value.
    Switch,
    /// `BooleanOptionalAction`: no value; `--no-NAME` turns it off.
    Bool,
    /// Exactly one value.
    Value,
    /// One or more values (`nargs='+'`, or `'*'`).
    Nargs,
    /// A value or none (`nargs='?'`).
    Optional,
}

/// One option: its names (the first is the one the simulator knows it by), how it takes its
/// value, and the values allowed (empty: any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    pub names: &'static [&'static str],
    pub kind: Kind,
    pub choices: &'static [&'static str],
}

const fn flag(names: &'static [&'static str], kind: Kind, choices: &'static [&'static str]) -> Flag {
    Flag { names, kind, choices }
}

impl Flag {
    /// The name the simulator knows it by: the first of its names.
    pub fn name(&self) -> &'static str {
        self.names[0]
    }
}

/// The options of `engine`'s command line.
pub fn table(engine: EngineKind) -> &'static [Flag] {
    match engine {
        EngineKind::Vllm => VLLM,
        EngineKind::Sglang => SGLANG,
    }
}

/// What an option string on a command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The option, and whether it was written as `--no-NAME`.
    Found(&'static Flag, bool),
    /// A prefix of several long options.
    Ambiguous(Vec<String>),
    Unknown,
}

/// Resolves `option` (without any `=value`) as argparse does: an exact name, a `--no-` form of
/// a [`Kind::Bool`], else the one long option it is an unambiguous prefix of (both parsers allow
/// abbreviations).
pub fn resolve(engine: EngineKind, option: &str) -> Resolved {
    let strings = || {
        table(engine).iter().flat_map(|f| {
            let negated = f.names.iter().filter(|n| n.starts_with("--") && f.kind == Kind::Bool);
            f.names
                .iter()
                .map(move |n| ((*n).to_owned(), f, false))
                .chain(negated.map(move |n| (format!("--no-{}", &n[2..]), f, true)))
        })
    };
    if let Some((_, f, negated)) = strings().find(|(s, _, _)| s == option) {
        return Resolved::Found(f, negated);
    }
    if !option.starts_with("--") || option.len() < 3 {
        return Resolved::Unknown;
    }
    let matches: Vec<(String, &'static Flag, bool)> = strings().filter(|(s, _, _)| s.starts_with(option)).collect();
    match matches.as_slice() {
        [] => Resolved::Unknown,
        [(_, f, negated)] => Resolved::Found(f, *negated),
        many => Resolved::Ambiguous(many.iter().map(|(s, _, _)| s.clone()).collect()),
    }
}

/// vLLM's spelling of an option: its parser takes `--max_num_seqs` for `--max-num-seqs` (up to
/// the first `.`: a JSON option's keys keep theirs) and `-O3` for `--optimization-level 3`.
/// The simulator's own `--sim-*` flags are left as written.
pub fn spelled(engine: EngineKind, word: &str) -> String {
    if engine != EngineKind::Vllm {
        return word.to_owned();
    }
    if let Some(level) = word.strip_prefix("-O").filter(|l| !l.is_empty()) {
        return format!("--optimization-level={}", level.strip_prefix('=').unwrap_or(level));
    }
    match word.strip_prefix("--") {
        Some(option) if !option.starts_with("sim-") => {
            let (name, value) = option.split_once('=').map_or((option, None), |(n, v)| (n, Some(v)));
            let (name, key) = name.split_once('.').map_or((name, None), |(n, k)| (n, Some(k)));
            let name = name.replace('_', "-");
            let name = key.map_or(name.clone(), |key| format!("{name}.{key}"));
            value.map_or(format!("--{name}"), |value| format!("--{name}={value}"))
        }
        _ => word.to_owned(),
    }
}

/// Whether argparse reads `word` as an option rather than a value: a dash, unless a negative number.
pub fn looks_like_option(word: &str) -> bool {
    word.starts_with('-') && word.len() > 1 && word.parse::<f64>().is_err()
}

/// vLLM's options whose value is JSON, which its parser also takes one key at a time
/// (`--compilation-config.cudagraph_mode NONE`).
pub const JSON_OPTIONS: [&str; 22] = [
    "--compilation-config",
    "--attention-config",
    "--kernel-config",
    "--structured-outputs-config",
    "--profiler-config",
    "--eplb-config",
    "--speculative-config",
    "--kv-transfer-config",
    "--kv-events-config",
    "--ec-transfer-config",
    "--weight-transfer-config",
    "--additional-config",
    "--hf-overrides",
    "--model-loader-extra-config",
    "--pooler-config",
    "--limit-mm-per-prompt",
    "--media-io-kwargs",
    "--mm-processor-kwargs",
    "--override-generation-config",
    "--default-mm-loras",
    "--pt-load-map-location",
    "--default-chat-template-kwargs",
];

/// A count as vLLM reads one: `32768`, `32k` (thousands) or `32K` (binary thousands), and `m`,
/// `g`, `t` likewise; a decimal takes a decimal suffix (`25.6k`), a binary one only a whole
/// number. The error says what was wrong.
pub fn human_count(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let Some(suffix) = text.chars().last().filter(char::is_ascii_alphabetic) else {
        return text.parse().map_err(|err| format!("{err}"));
    };
    let power = match suffix.to_ascii_lowercase() {
        'k' => 1,
        'm' => 2,
        'g' => 3,
        't' => 4,
        _ => return Err("expected a number, or one with a k, m, g or t suffix".to_owned()),
    };
    let number = &text[..text.len() - 1];
    if suffix.is_ascii_uppercase() {
        let whole: u64 = number.parse().map_err(|err| format!("{err}"))?;
        return whole.checked_mul(1u64 << (10 * power)).ok_or_else(|| "too large".to_owned());
    }
    let decimal: f64 = number.parse().map_err(|err| format!("{err}"))?;
    let scaled = decimal * 1000f64.powi(power);
    if !(scaled.is_finite() && scaled >= 0.0 && scaled < u64::MAX as f64) {
        return Err("must be a positive number".to_owned());
    }
    Ok(scaled as u64)
}

/// What in `args` (a matrix's, for `engine`) its parser would refuse: an option it does not
/// have, a prefix of several, or a value outside an option's choices; each said once. The
/// simulator's own `--sim-*` flags are its own.
pub fn refused(engine: EngineKind, args: &[String]) -> Vec<String> {
    let words: Vec<String> = args.iter().map(|w| spelled(engine, w)).collect();
    let mut out: Vec<String> = Vec::new();
    for (i, word) in words.iter().enumerate().filter(|(_, w)| looks_like_option(w)) {
        let (option, inline) = word.split_once('=').map_or((word.as_str(), None), |(name, v)| (name, Some(v)));
        if option.starts_with("--sim-") {
            continue;
        }
        // vLLM's `--section.key`: the section is the option.
        let (option, keyed) = match option.split_once('.') {
            Some((section, _)) if engine == EngineKind::Vllm => (section, true),
            _ => (option, false),
        };
        let problem = match resolve(engine, option) {
            Resolved::Found(flag, _) if flag.kind != Value || flag.choices.is_empty() || keyed => continue,
            Resolved::Found(flag, _) => {
                let value = inline.or_else(|| words.get(i + 1).map(String::as_str).filter(|w| !looks_like_option(w)));
                match value {
                    Some(value) if !flag.choices.contains(&value) => {
                        format!("{option} {value} is not one of its values ({})", flag.choices.join(", "))
                    }
                    _ => continue,
                }
            }
            Resolved::Ambiguous(matches) => format!("{option} could be any of {}", matches.join(", ")),
            Resolved::Unknown => format!("{engine} {} has no option {option}", version(engine)),
        };
        if !out.contains(&problem) {
            out.push(problem);
        }
    }
    out
}

/// The simulator's own flags that take no value (`benchfleet-sim --help`); every other `--sim-*`
/// flag takes one.
pub const SIMULATOR_SWITCHES: [&str; 1] = ["--sim-refuse-cache-reset"];

/// `args` (a matrix's) apart: the engine's own, and the simulator's `--sim-*` flags with their
/// values, which a real engine would refuse; a serve command to publish leaves the latter out.
pub fn without_simulator_flags(args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut engine, mut simulator) = (Vec::new(), Vec::new());
    let mut words = args.iter().peekable();
    while let Some(word) = words.next() {
        if !word.starts_with("--sim-") {
            engine.push(word.clone());
            continue;
        }
        let mut flag = word.clone();
        let takes_value = !word.contains('=') && !SIMULATOR_SWITCHES.contains(&word.as_str());
        if let Some(value) = words.next_if(|next| takes_value && !looks_like_option(next)) {
            flag = format!("{flag} {value}");
        }
        simulator.push(flag);
    }
    (engine, simulator)
}

/// The release whose options [`table`] holds.
pub fn version(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Vllm => "0.17.1",
        EngineKind::Sglang => "0.5.9",
    }
}

use Kind::*;

/// vLLM 0.17.1's `vllm serve` (its positional MODEL aside).
#[rustfmt::skip]
pub const VLLM: &[Flag] = &[
    flag(&["--headless"], Switch, &[]),
    flag(&["--api-server-count", "-asc"], Value, &[]),
    flag(&["--config"], Value, &[]),
    flag(&["--lora-modules"], Nargs, &[]),
    flag(&["--chat-template"], Value, &[]),
    flag(&["--chat-template-content-format"], Value, &["auto", "openai", "string"]),
    flag(&["--trust-request-chat-template"], Bool, &[]),
    flag(&["--default-chat-template-kwargs"], Value, &[]),
    flag(&["--response-role"], Value, &[]),
    flag(&["--return-tokens-as-token-ids"], Bool, &[]),
    flag(&["--disable-frontend-multiprocessing"], Bool, &[]),
    flag(&["--enable-auto-tool-choice"], Bool, &[]),
    flag(&["--exclude-tools-when-tool-choice-none"], Bool, &[]),
    flag(&["--tool-call-parser"], Value, &[]),
    flag(&["--tool-parser-plugin"], Value, &[]),
    flag(&["--tool-server"], Value, &[]),
    flag(&["--log-config-file"], Value, &[]),
    flag(&["--max-log-len"], Value, &[]),
    flag(&["--enable-prompt-tokens-details"], Bool, &[]),
    flag(&["--enable-server-load-tracking"], Bool, &[]),
    flag(&["--enable-force-include-usage"], Bool, &[]),
    flag(&["--enable-tokenizer-info-endpoint"], Bool, &[]),
    flag(&["--enable-log-outputs"], Bool, &[]),
    flag(&["--enable-log-deltas"], Bool, &[]),
    flag(&["--log-error-stack"], Bool, &[]),
    flag(&["--tokens-only"], Bool, &[]),
    flag(&["--host"], Value, &[]),
    flag(&["--port"], Value, &[]),
    flag(&["--uds"], Value, &[]),
    flag(&["--uvicorn-log-level"], Value, &["critical", "debug", "error", "info", "trace", "warning"]),
    flag(&["--disable-uvicorn-access-log"], Bool, &[]),
    flag(&["--disable-access-log-for-endpoints"], Value, &[]),
    flag(&["--allow-credentials"], Bool, &[]),
    flag(&["--allowed-origins"], Value, &[]),
    flag(&["--allowed-methods"], Value, &[]),
    flag(&["--allowed-headers"], Value, &[]),
    flag(&["--api-key"], Nargs, &[]),
    flag(&["--ssl-keyfile"], Value, &[]),
    flag(&["--ssl-certfile"], Value, &[]),
    flag(&["--ssl-ca-certs"], Value, &[]),
    flag(&["--enable-ssl-refresh"], Bool, &[]),
    flag(&["--ssl-cert-reqs"], Value, &[]),
    flag(&["--ssl-ciphers"], Value, &[]),
    flag(&["--root-path"], Value, &[]),
    flag(&["--middleware"], Value, &[]),
    flag(&["--enable-request-id-headers"], Bool, &[]),
    flag(&["--disable-fastapi-docs"], Bool, &[]),
    flag(&["--h11-max-incomplete-event-size"], Value, &[]),
    flag(&["--h11-max-header-count"], Value, &[]),
    flag(&["--enable-offline-docs"], Bool, &[]),
    flag(&["--use-gpu-for-pooling-score"], Bool, &[]),
    flag(&["--model"], Value, &[]),
    flag(&["--runner"], Value, &["auto", "draft", "generate", "pooling"]),
    flag(&["--convert"], Value, &["auto", "classify", "embed", "none"]),
    flag(&["--tokenizer"], Value, &[]),
    flag(&["--tokenizer-mode"], Value, &[]),
    flag(&["--trust-remote-code"], Bool, &[]),
    flag(&["--dtype"], Value, &["auto", "bfloat16", "float", "float16", "float32", "half"]),
    flag(&["--seed"], Value, &[]),
    flag(&["--hf-config-path"], Value, &[]),
    flag(&["--allowed-local-media-path"], Value, &[]),
    flag(&["--allowed-media-domains"], Nargs, &[]),
    flag(&["--revision"], Value, &[]),
    flag(&["--code-revision"], Value, &[]),
    flag(&["--tokenizer-revision"], Value, &[]),
    flag(&["--max-model-len"], Value, &[]),
    flag(&["--quantization", "-q"], Value, &[]),
    flag(&["--allow-deprecated-quantization"], Bool, &[]),
    flag(&["--enforce-eager"], Bool, &[]),
    flag(&["--enable-return-routed-experts"], Bool, &[]),
    flag(&["--max-logprobs"], Value, &[]),
    flag(&["--logprobs-mode"], Value, &["processed_logits", "processed_logprobs", "raw_logits", "raw_logprobs"]),
    flag(&["--disable-sliding-window"], Bool, &[]),
    flag(&["--disable-cascade-attn"], Bool, &[]),
    flag(&["--skip-tokenizer-init"], Bool, &[]),
    flag(&["--enable-prompt-embeds"], Bool, &[]),
    flag(&["--served-model-name"], Nargs, &[]),
    flag(&["--config-format"], Value, &[]),
    flag(&["--hf-token"], Optional, &[]),
    flag(&["--hf-overrides"], Value, &[]),
    flag(&["--pooler-config"], Value, &[]),
    flag(&["--generation-config"], Value, &[]),
    flag(&["--override-generation-config"], Value, &[]),
    flag(&["--enable-sleep-mode"], Bool, &[]),
    flag(&["--model-impl"], Value, &[]),
    flag(&["--override-attention-dtype"], Value, &[]),
    flag(&["--logits-processors"], Nargs, &[]),
    flag(&["--io-processor-plugin"], Value, &[]),
    flag(&["--load-format"], Value, &[]),
    flag(&["--download-dir"], Value, &[]),
    flag(&["--safetensors-load-strategy"], Value, &[]),
    flag(&["--model-loader-extra-config"], Value, &[]),
    flag(&["--ignore-patterns"], Nargs, &[]),
    flag(&["--use-tqdm-on-load"], Bool, &[]),
    flag(&["--pt-load-map-location"], Value, &[]),
    flag(&["--attention-backend"], Value, &[]),
    flag(&["--reasoning-parser"], Value, &[]),
    flag(&["--reasoning-parser-plugin"], Value, &[]),
    flag(&["--distributed-executor-backend"], Value, &[]),
    flag(&["--pipeline-parallel-size", "-pp"], Value, &[]),
    flag(&["--master-addr"], Value, &[]),
    flag(&["--master-port"], Value, &[]),
    flag(&["--nnodes", "-n"], Value, &[]),
    flag(&["--node-rank", "-r"], Value, &[]),
    flag(&["--tensor-parallel-size", "-tp"], Value, &[]),
    flag(&["--decode-context-parallel-size", "-dcp"], Value, &[]),
    flag(&["--dcp-kv-cache-interleave-size"], Value, &[]),
    flag(&["--cp-kv-cache-interleave-size"], Value, &[]),
    flag(&["--prefill-context-parallel-size", "-pcp"], Value, &[]),
    flag(&["--data-parallel-size", "-dp"], Value, &[]),
    flag(&["--data-parallel-rank", "-dpn"], Value, &[]),
    flag(&["--data-parallel-start-rank", "-dpr"], Value, &[]),
    flag(&["--data-parallel-size-local", "-dpl"], Value, &[]),
    flag(&["--data-parallel-address", "-dpa"], Value, &[]),
    flag(&["--data-parallel-rpc-port", "-dpp"], Value, &[]),
    flag(&["--data-parallel-backend", "-dpb"], Value, &[]),
    flag(&["--data-parallel-hybrid-lb", "-dph"], Bool, &[]),
    flag(&["--data-parallel-external-lb", "-dpe"], Bool, &[]),
    flag(&["--enable-expert-parallel", "-ep"], Bool, &[]),
    flag(&["--all2all-backend"], Value, &["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "flashinfer_all2allv", "mori", "naive", "pplx"]),
    flag(&["--enable-dbo"], Bool, &[]),
    flag(&["--ubatch-size"], Value, &[]),
    flag(&["--enable-elastic-ep"], Bool, &[]),
    flag(&["--dbo-decode-token-threshold"], Value, &[]),
    flag(&["--dbo-prefill-token-threshold"], Value, &[]),
    flag(&["--disable-nccl-for-dp-synchronization"], Bool, &[]),
    flag(&["--enable-eplb"], Bool, &[]),
    flag(&["--eplb-config"], Value, &[]),
    flag(&["--expert-placement-strategy"], Value, &["linear", "round_robin"]),
    flag(&["--max-parallel-loading-workers"], Value, &[]),
    flag(&["--ray-workers-use-nsight"], Bool, &[]),
    flag(&["--disable-custom-all-reduce"], Bool, &[]),
    flag(&["--worker-cls"], Value, &[]),
    flag(&["--worker-extension-cls"], Value, &[]),
    flag(&["--block-size"], Value, &["1", "8", "16", "32", "64", "128", "256"]),
    flag(&["--gpu-memory-utilization"], Value, &[]),
    flag(&["--kv-cache-memory-bytes"], Value, &[]),
    flag(&["--swap-space"], Value, &[]),
    flag(&["--kv-cache-dtype"], Value, &["auto", "bfloat16", "fp8", "fp8_ds_mla", "fp8_e4m3", "fp8_e5m2", "fp8_inc"]),
    flag(&["--num-gpu-blocks-override"], Value, &[]),
    flag(&["--enable-prefix-caching"], Bool, &[]),
    flag(&["--prefix-caching-hash-algo"], Value, &["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]),
    flag(&["--calculate-kv-scales"], Bool, &[]),
    flag(&["--kv-sharing-fast-prefill"], Bool, &[]),
    flag(&["--mamba-cache-dtype"], Value, &["auto", "float16", "float32"]),
    flag(&["--mamba-ssm-cache-dtype"], Value, &["auto", "float16", "float32"]),
    flag(&["--mamba-block-size"], Value, &[]),
    flag(&["--mamba-cache-mode"], Value, &["align", "all", "none"]),
    flag(&["--kv-offloading-size"], Value, &[]),
    flag(&["--kv-offloading-backend"], Value, &["lmcache", "native"]),
    flag(&["--offload-backend"], Value, &["auto", "prefetch", "uva"]),
    flag(&["--cpu-offload-gb"], Value, &[]),
    flag(&["--cpu-offload-params"], Nargs, &[]),
    flag(&["--offload-group-size"], Value, &[]),
    flag(&["--offload-num-in-group"], Value, &[]),
    flag(&["--offload-prefetch-step"], Value, &[]),
    flag(&["--offload-params"], Nargs, &[]),
    flag(&["--language-model-only"], Bool, &[]),
    flag(&["--limit-mm-per-prompt"], Value, &[]),
    flag(&["--enable-mm-embeds"], Bool, &[]),
    flag(&["--media-io-kwargs"], Value, &[]),
    flag(&["--mm-processor-kwargs"], Value, &[]),
    flag(&["--mm-processor-cache-gb"], Value, &[]),
    flag(&["--mm-processor-cache-type"], Value, &["lru", "shm"]),
    flag(&["--mm-shm-cache-max-object-size-mb"], Value, &[]),
    flag(&["--mm-encoder-only"], Bool, &[]),
    flag(&["--mm-encoder-tp-mode"], Value, &["data", "weights"]),
    flag(&["--mm-encoder-attn-backend"], Value, &[]),
    flag(&["--interleave-mm-strings"], Bool, &[]),
    flag(&["--skip-mm-profiling"], Bool, &[]),
    flag(&["--video-pruning-rate"], Value, &[]),
    flag(&["--enable-lora"], Bool, &[]),
    flag(&["--max-loras"], Value, &[]),
    flag(&["--max-lora-rank"], Value, &["1", "8", "16", "32", "64", "128", "256", "320", "512"]),
    flag(&["--lora-dtype"], Value, &["auto", "bfloat16", "float16"]),
    flag(&["--enable-tower-connector-lora"], Bool, &[]),
    flag(&["--max-cpu-loras"], Value, &[]),
    flag(&["--fully-sharded-loras"], Bool, &[]),
    flag(&["--default-mm-loras"], Value, &[]),
    flag(&["--specialize-active-lora"], Bool, &[]),
    flag(&["--show-hidden-metrics-for-version"], Value, &[]),
    flag(&["--otlp-traces-endpoint"], Value, &[]),
    flag(&["--collect-detailed-traces"], Nargs, &["all", "model", "worker", "None"]),
    flag(&["--kv-cache-metrics"], Bool, &[]),
    flag(&["--kv-cache-metrics-sample"], Value, &[]),
    flag(&["--cudagraph-metrics"], Bool, &[]),
    flag(&["--enable-layerwise-nvtx-tracing"], Bool, &[]),
    flag(&["--enable-mfu-metrics"], Bool, &[]),
    flag(&["--enable-logging-iteration-details"], Bool, &[]),
    flag(&["--max-num-batched-tokens"], Value, &[]),
    flag(&["--max-num-seqs"], Value, &[]),
    flag(&["--max-num-partial-prefills"], Value, &[]),
    flag(&["--max-long-partial-prefills"], Value, &[]),
    flag(&["--long-prefill-token-threshold"], Value, &[]),
    flag(&["--scheduling-policy"], Value, &["fcfs", "priority"]),
    flag(&["--enable-chunked-prefill"], Bool, &[]),
    flag(&["--disable-chunked-mm-input"], Bool, &[]),
    flag(&["--scheduler-cls"], Value, &[]),
    flag(&["--disable-hybrid-kv-cache-manager"], Bool, &[]),
    flag(&["--async-scheduling"], Bool, &[]),
    flag(&["--stream-interval"], Value, &[]),
    flag(&["--cudagraph-capture-sizes"], Nargs, &[]),
    flag(&["--max-cudagraph-capture-size"], Value, &[]),
    flag(&["--enable-flashinfer-autotune"], Bool, &[]),
    flag(&["--moe-backend"], Value, &["aiter", "auto", "cutlass", "deep_gemm", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm", "marlin", "triton"]),
    flag(&["--speculative-config"], Value, &[]),
    flag(&["--kv-transfer-config"], Value, &[]),
    flag(&["--kv-events-config"], Value, &[]),
    flag(&["--ec-transfer-config"], Value, &[]),
    flag(&["--compilation-config", "-cc"], Value, &[]),
    flag(&["--attention-config", "-ac"], Value, &[]),
    flag(&["--kernel-config"], Value, &[]),
    flag(&["--additional-config"], Value, &[]),
    flag(&["--structured-outputs-config"], Value, &[]),
    flag(&["--profiler-config"], Value, &[]),
    flag(&["--optimization-level", "-O"], Value, &[]),
    flag(&["--performance-mode"], Value, &["balanced", "interactivity", "throughput"]),
    flag(&["--weight-transfer-config"], Value, &[]),
    flag(&["--disable-log-stats"], Switch, &[]),
    flag(&["--aggregate-engine-logging"], Switch, &[]),
    flag(&["--fail-on-environ-validation"], Bool, &[]),
    flag(&["--enable-log-requests"], Bool, &[]),
];

/// SGLang 0.5.9's `python3 -m sglang.launch_server` (and `sglang serve`).
#[rustfmt::skip]
pub const SGLANG: &[Flag] = &[
    flag(&["--model-path", "--model"], Value, &[]),
    flag(&["--tokenizer-path"], Value, &[]),
    flag(&["--tokenizer-mode"], Value, &["auto", "slow"]),
    flag(&["--tokenizer-worker-num"], Value, &[]),
    flag(&["--skip-tokenizer-init"], Switch, &[]),
    flag(&["--load-format"], Value, &["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes", "layered", "flash_rl", "remote", "remote_instance", "fastsafetensors", "private"]),
    flag(&["--model-loader-extra-config"], Value, &[]),
    flag(&["--trust-remote-code"], Switch, &[]),
    flag(&["--context-length"], Value, &[]),
    flag(&["--is-embedding"], Switch, &[]),
    flag(&["--enable-multimodal"], Switch, &[]),
    flag(&["--revision"], Value, &[]),
    flag(&["--model-impl"], Value, &[]),
    flag(&["--host"], Value, &[]),
    flag(&["--port"], Value, &[]),
    flag(&["--fastapi-root-path"], Value, &[]),
    flag(&["--grpc-mode"], Switch, &[]),
    flag(&["--skip-server-warmup"], Switch, &[]),
    flag(&["--warmups"], Value, &[]),
    flag(&["--nccl-port"], Value, &[]),
    flag(&["--checkpoint-engine-wait-weights-before-ready"], Switch, &[]),
    flag(&["--dtype"], Value, &["auto", "half", "float16", "bfloat16", "float", "float32"]),
    flag(&["--quantization"], Value, &["awq", "fp8", "mxfp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8", "mxfp4", "auto-round", "compressed-tensors", "modelslim", "quark_int4fp8_moe"]),
    flag(&["--quantization-param-path"], Value, &[]),
    flag(&["--kv-cache-dtype"], Value, &["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]),
    flag(&["--enable-fp32-lm-head"], Switch, &[]),
    flag(&["--modelopt-quant"], Value, &[]),
    flag(&["--modelopt-checkpoint-restore-path"], Value, &[]),
    flag(&["--modelopt-checkpoint-save-path"], Value, &[]),
    flag(&["--modelopt-export-path"], Value, &[]),
    flag(&["--quantize-and-serve"], Switch, &[]),
    flag(&["--rl-quant-profile"], Value, &[]),
    flag(&["--mem-fraction-static"], Value, &[]),
    flag(&["--max-running-requests"], Value, &[]),
    flag(&["--max-queued-requests"], Value, &[]),
    flag(&["--max-total-tokens"], Value, &[]),
    flag(&["--chunked-prefill-size"], Value, &[]),
    flag(&["--prefill-max-requests"], Value, &[]),
    flag(&["--enable-dynamic-chunking"], Switch, &[]),
    flag(&["--max-prefill-tokens"], Value, &[]),
    flag(&["--schedule-policy"], Value, &["lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key"]),
    flag(&["--enable-priority-scheduling"], Switch, &[]),
    flag(&["--abort-on-priority-when-disabled"], Switch, &[]),
    flag(&["--schedule-low-priority-values-first"], Switch, &[]),
    flag(&["--priority-scheduling-preemption-threshold"], Value, &[]),
    flag(&["--schedule-conservativeness"], Value, &[]),
    flag(&["--page-size"], Value, &[]),
    flag(&["--hybrid-kvcache-ratio"], Switch, &[]),
    flag(&["--swa-full-tokens-ratio"], Value, &[]),
    flag(&["--disable-hybrid-swa-memory"], Switch, &[]),
    flag(&["--radix-eviction-policy"], Value, &["lru", "lfu"]),
    flag(&["--enable-prefill-delayer"], Switch, &[]),
    flag(&["--prefill-delayer-max-delay-passes"], Value, &[]),
    flag(&["--prefill-delayer-token-usage-low-watermark"], Value, &[]),
    flag(&["--prefill-delayer-forward-passes-buckets"], Nargs, &[]),
    flag(&["--prefill-delayer-wait-seconds-buckets"], Nargs, &[]),
    flag(&["--device"], Value, &[]),
    flag(&["--tensor-parallel-size", "--tp-size"], Value, &[]),
    flag(&["--attention-context-parallel-size", "--attn-cp-size"], Value, &[]),
    flag(&["--moe-data-parallel-size", "--moe-dp-size"], Value, &[]),
    flag(&["--pipeline-parallel-size", "--pp-size"], Value, &[]),
    flag(&["--pp-max-micro-batch-size"], Value, &[]),
    flag(&["--pp-async-batch-depth"], Value, &[]),
    flag(&["--stream-interval"], Value, &[]),
    flag(&["--stream-output"], Switch, &[]),
    flag(&["--random-seed"], Value, &[]),
    flag(&["--constrained-json-whitespace-pattern"], Value, &[]),
    flag(&["--constrained-json-disable-any-whitespace"], Switch, &[]),
    flag(&["--watchdog-timeout"], Value, &[]),
    flag(&["--soft-watchdog-timeout"], Value, &[]),
    flag(&["--dist-timeout"], Value, &[]),
    flag(&["--download-dir"], Value, &[]),
    flag(&["--model-checksum"], Optional, &[]),
    flag(&["--base-gpu-id"], Value, &[]),
    flag(&["--gpu-id-step"], Value, &[]),
    flag(&["--sleep-on-idle"], Switch, &[]),
    flag(&["--custom-sigquit-handler"], Value, &[]),
    flag(&["--log-level"], Value, &[]),
    flag(&["--log-level-http"], Value, &[]),
    flag(&["--log-requests"], Switch, &[]),
    flag(&["--log-requests-level"], Value, &["0", "1", "2", "3"]),
    flag(&["--log-requests-format"], Value, &["text", "json"]),
    flag(&["--log-requests-target"], Nargs, &[]),
    flag(&["--uvicorn-access-log-exclude-prefixes"], Nargs, &[]),
    flag(&["--crash-dump-folder"], Value, &[]),
    flag(&["--show-time-cost"], Switch, &[]),
    flag(&["--enable-metrics"], Switch, &[]),
    flag(&["--enable-metrics-for-all-schedulers"], Switch, &[]),
    flag(&["--tokenizer-metrics-custom-labels-header"], Value, &[]),
    flag(&["--tokenizer-metrics-allowed-custom-labels"], Nargs, &[]),
    flag(&["--extra-metric-labels"], Value, &[]),
    flag(&["--bucket-time-to-first-token"], Nargs, &[]),
    flag(&["--bucket-inter-token-latency"], Nargs, &[]),
    flag(&["--bucket-e2e-request-latency"], Nargs, &[]),
    flag(&["--collect-tokens-histogram"], Switch, &[]),
    flag(&["--prompt-tokens-buckets"], Nargs, &[]),
    flag(&["--generation-tokens-buckets"], Nargs, &[]),
    flag(&["--gc-warning-threshold-secs"], Value, &[]),
    flag(&["--decode-log-interval"], Value, &[]),
    flag(&["--enable-request-time-stats-logging"], Switch, &[]),
    flag(&["--kv-events-config"], Value, &[]),
    flag(&["--enable-trace"], Switch, &[]),
    flag(&["--otlp-traces-endpoint"], Value, &[]),
    flag(&["--export-metrics-to-file"], Switch, &[]),
    flag(&["--export-metrics-to-file-dir"], Value, &[]),
    flag(&["--api-key"], Value, &[]),
    flag(&["--admin-api-key"], Value, &[]),
    flag(&["--served-model-name"], Value, &[]),
    flag(&["--weight-version"], Value, &[]),
    flag(&["--chat-template"], Value, &[]),
    flag(&["--hf-chat-template-name"], Value, &[]),
    flag(&["--completion-template"], Value, &[]),
    flag(&["--file-storage-path"], Value, &[]),
    flag(&["--enable-cache-report"], Switch, &[]),
    flag(&["--reasoning-parser"], Value, &["deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi", "kimi_k2", "qwen3", "qwen3-thinking", "minimax", "minimax-append-think", "step3", "step3p5", "nano_v3", "interns1"]),
    flag(&["--tool-call-parser"], Value, &["deepseekv3", "deepseekv31", "deepseekv32", "glm", "glm45", "glm47", "gpt-oss", "kimi_k2", "lfm2", "llama3", "mimo", "mistral", "pythonic", "qwen", "qwen25", "qwen3_coder", "step3", "step3p5", "minimax-m2", "trinity", "interns1", "hermes", "gigachat3"]),
    flag(&["--tool-server"], Value, &[]),
    flag(&["--sampling-defaults"], Value, &["openai", "model"]),
    flag(&["--data-parallel-size", "--dp-size"], Value, &[]),
    flag(&["--load-balance-method"], Value, &["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"]),
    flag(&["--prefill-round-robin-balance"], Switch, &[]),
    flag(&["--dist-init-addr", "--nccl-init-addr"], Value, &[]),
    flag(&["--nnodes"], Value, &[]),
    flag(&["--node-rank"], Value, &[]),
    flag(&["--json-model-override-args"], Value, &[]),
    flag(&["--preferred-sampling-params"], Value, &[]),
    flag(&["--enable-lora"], Switch, &[]),
    flag(&["--enable-lora-overlap-loading"], Switch, &[]),
    flag(&["--max-lora-rank"], Value, &[]),
    flag(&["--lora-target-modules"], Nargs, &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head", "all"]),
    flag(&["--lora-paths"], Nargs, &[]),
    flag(&["--max-loras-per-batch"], Value, &[]),
    flag(&["--max-loaded-loras"], Value, &[]),
    flag(&["--lora-eviction-policy"], Value, &["lru", "fifo"]),
    flag(&["--lora-backend"], Value, &["triton", "csgmv", "ascend", "torch_native"]),
    flag(&["--max-lora-chunk-size"], Value, &["16", "32", "64", "128"]),
    flag(&["--attention-backend"], Value, &["triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu"]),
    flag(&["--prefill-attention-backend"], Value, &["triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu"]),
    flag(&["--decode-attention-backend"], Value, &["triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla", "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu"]),
    flag(&["--sampling-backend"], Value, &["ascend", "pytorch", "flashinfer"]),
    flag(&["--grammar-backend"], Value, &["xgrammar", "outlines", "llguidance", "none"]),
    flag(&["--mm-attention-backend"], Value, &["sdpa", "fa3", "fa4", "triton_attn", "ascend_attn", "aiter_attn"]),
    flag(&["--nsa-prefill-backend"], Value, &["flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3", "tilelang", "aiter", "trtllm"]),
    flag(&["--nsa-decode-backend"], Value, &["flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3", "tilelang", "aiter", "trtllm"]),
    flag(&["--fp8-gemm-backend"], Value, &["auto", "deep_gemm", "flashinfer_trtllm", "flashinfer_deepgemm", "cutlass", "triton", "aiter"]),
    flag(&["--fp4-gemm-backend"], Value, &["auto", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm"]),
    flag(&["--disable-flashinfer-autotune"], Switch, &[]),
    flag(&["--speculative-algorithm"], Value, &["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]),
    flag(&["--speculative-draft-model-path", "--speculative-draft-model"], Value, &[]),
    flag(&["--speculative-draft-model-revision"], Value, &[]),
    flag(&["--speculative-draft-load-format"], Value, &["auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes", "layered", "flash_rl", "remote", "remote_instance", "fastsafetensors", "private"]),
    flag(&["--speculative-num-steps"], Value, &[]),
    flag(&["--speculative-eagle-topk"], Value, &[]),
    flag(&["--speculative-num-draft-tokens"], Value, &[]),
    flag(&["--speculative-accept-threshold-single"], Value, &[]),
    flag(&["--speculative-accept-threshold-acc"], Value, &[]),
    flag(&["--speculative-token-map"], Value, &[]),
    flag(&["--speculative-attention-mode"], Value, &["prefill", "decode"]),
    flag(&["--speculative-draft-attention-backend"], Value, &[]),
    flag(&["--speculative-moe-runner-backend"], Value, &["auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass"]),
    flag(&["--speculative-moe-a2a-backend"], Value, &["none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer"]),
    flag(&["--speculative-draft-model-quantization"], Value, &["awq", "fp8", "mxfp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8", "modelopt_fp4", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "qoq", "w4afp8", "mxfp4", "auto-round", "compressed-tensors", "modelslim", "quark_int4fp8_moe", "unquant"]),
    flag(&["--speculative-ngram-min-match-window-size"], Value, &[]),
    flag(&["--speculative-ngram-max-match-window-size"], Value, &[]),
    flag(&["--speculative-ngram-min-bfs-breadth"], Value, &[]),
    flag(&["--speculative-ngram-max-bfs-breadth"], Value, &[]),
    flag(&["--speculative-ngram-match-type"], Value, &["BFS", "PROB"]),
    flag(&["--speculative-ngram-branch-length"], Value, &[]),
    flag(&["--speculative-ngram-capacity"], Value, &[]),
    flag(&["--enable-multi-layer-eagle"], Switch, &[]),
    flag(&["--expert-parallel-size", "--ep-size", "--ep"], Value, &[]),
    flag(&["--moe-a2a-backend"], Value, &["none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer"]),
    flag(&["--moe-runner-backend"], Value, &["auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl", "cutlass"]),
    flag(&["--flashinfer-mxfp4-moe-precision"], Value, &["default", "bf16"]),
    flag(&["--enable-flashinfer-allreduce-fusion"], Switch, &[]),
    flag(&["--deepep-mode"], Value, &["normal", "low_latency", "auto"]),
    flag(&["--ep-num-redundant-experts"], Value, &[]),
    flag(&["--ep-dispatch-algorithm"], Value, &[]),
    flag(&["--init-expert-location"], Value, &[]),
    flag(&["--enable-eplb"], Switch, &[]),
    flag(&["--eplb-algorithm"], Value, &[]),
    flag(&["--eplb-rebalance-num-iterations"], Value, &[]),
    flag(&["--eplb-rebalance-layers-per-chunk"], Value, &[]),
    flag(&["--eplb-min-rebalancing-utilization-threshold"], Value, &[]),
    flag(&["--expert-distribution-recorder-mode"], Value, &[]),
    flag(&["--expert-distribution-recorder-buffer-size"], Value, &[]),
    flag(&["--enable-expert-distribution-metrics"], Switch, &[]),
    flag(&["--deepep-config"], Value, &[]),
    flag(&["--moe-dense-tp-size"], Value, &[]),
    flag(&["--elastic-ep-backend"], Value, &["none", "mooncake"]),
    flag(&["--mooncake-ib-device"], Value, &[]),
    flag(&["--max-mamba-cache-size"], Value, &[]),
    flag(&["--mamba-ssm-dtype"], Value, &["float32", "bfloat16", "float16"]),
    flag(&["--mamba-full-memory-ratio"], Value, &[]),
    flag(&["--mamba-scheduler-strategy"], Value, &["auto", "no_buffer", "extra_buffer"]),
    flag(&["--mamba-track-interval"], Value, &[]),
    flag(&["--mamba-backend"], Value, &["triton", "flashinfer"]),
    flag(&["--enable-hierarchical-cache"], Switch, &[]),
    flag(&["--hicache-ratio"], Value, &[]),
    flag(&["--hicache-size"], Value, &[]),
    flag(&["--hicache-write-policy"], Value, &["write_back", "write_through", "write_through_selective"]),
    flag(&["--hicache-io-backend"], Value, &["direct", "kernel", "kernel_ascend"]),
    flag(&["--hicache-mem-layout"], Value, &["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]),
    flag(&["--disable-hicache-numa-detect"], Switch, &[]),
    flag(&["--hicache-storage-backend"], Value, &["file", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic"]),
    flag(&["--hicache-storage-prefetch-policy"], Value, &["best_effort", "wait_complete", "timeout"]),
    flag(&["--hicache-storage-backend-extra-config"], Value, &[]),
    flag(&["--hierarchical-sparse-attention-extra-config"], Value, &[]),
    flag(&["--enable-lmcache"], Switch, &[]),
    flag(&["--kt-weight-path"], Value, &[]),
    flag(&["--kt-method"], Value, &[]),
    flag(&["--kt-cpuinfer"], Value, &[]),
    flag(&["--kt-threadpool-count"], Value, &[]),
    flag(&["--kt-num-gpu-experts"], Value, &[]),
    flag(&["--kt-max-deferred-experts-per-token"], Value, &[]),
    flag(&["--dllm-algorithm"], Value, &[]),
    flag(&["--dllm-algorithm-config"], Value, &[]),
    flag(&["--enable-double-sparsity"], Switch, &[]),
    flag(&["--ds-channel-config-path"], Value, &[]),
    flag(&["--ds-heavy-channel-num"], Value, &[]),
    flag(&["--ds-heavy-token-num"], Value, &[]),
    flag(&["--ds-heavy-channel-type"], Value, &[]),
    flag(&["--ds-sparse-decode-threshold"], Value, &[]),
    flag(&["--cpu-offload-gb"], Value, &[]),
    flag(&["--offload-group-size"], Value, &[]),
    flag(&["--offload-num-in-group"], Value, &[]),
    flag(&["--offload-prefetch-step"], Value, &[]),
    flag(&["--offload-mode"], Value, &[]),
    flag(&["--multi-item-scoring-delimiter"], Value, &[]),
    flag(&["--disable-radix-cache"], Switch, &[]),
    flag(&["--cuda-graph-max-bs"], Value, &[]),
    flag(&["--cuda-graph-bs"], Nargs, &[]),
    flag(&["--disable-cuda-graph"], Switch, &[]),
    flag(&["--disable-cuda-graph-padding"], Switch, &[]),
    flag(&["--enable-profile-cuda-graph"], Switch, &[]),
    flag(&["--enable-cudagraph-gc"], Switch, &[]),
    flag(&["--enable-layerwise-nvtx-marker"], Switch, &[]),
    flag(&["--enable-nccl-nvls"], Switch, &[]),
    flag(&["--enable-symm-mem"], Switch, &[]),
    flag(&["--disable-flashinfer-cutlass-moe-fp4-allgather"], Switch, &[]),
    flag(&["--enable-tokenizer-batch-encode"], Switch, &[]),
    flag(&["--disable-tokenizer-batch-decode"], Switch, &[]),
    flag(&["--disable-outlines-disk-cache"], Switch, &[]),
    flag(&["--disable-custom-all-reduce"], Switch, &[]),
    flag(&["--enable-mscclpp"], Switch, &[]),
    flag(&["--enable-torch-symm-mem"], Switch, &[]),
    flag(&["--disable-overlap-schedule"], Switch, &[]),
    flag(&["--enable-mixed-chunk"], Switch, &[]),
    flag(&["--enable-dp-attention"], Switch, &[]),
    flag(&["--enable-dp-lm-head"], Switch, &[]),
    flag(&["--enable-two-batch-overlap"], Switch, &[]),
    flag(&["--enable-single-batch-overlap"], Switch, &[]),
    flag(&["--tbo-token-distribution-threshold"], Value, &[]),
    flag(&["--enable-torch-compile"], Switch, &[]),
    flag(&["--enable-torch-compile-debug-mode"], Switch, &[]),
    flag(&["--enable-piecewise-cuda-graph"], Switch, &[]),
    flag(&["--piecewise-cuda-graph-tokens"], Nargs, &[]),
    flag(&["--piecewise-cuda-graph-compiler"], Value, &["eager", "inductor"]),
    flag(&["--torch-compile-max-bs"], Value, &[]),
    flag(&["--piecewise-cuda-graph-max-tokens"], Value, &[]),
    flag(&["--torchao-config"], Value, &[]),
    flag(&["--enable-nan-detection"], Switch, &[]),
    flag(&["--enable-p2p-check"], Switch, &[]),
    flag(&["--triton-attention-reduce-in-fp32"], Switch, &[]),
    flag(&["--triton-attention-num-kv-splits"], Value, &[]),
    flag(&["--triton-attention-split-tile-size"], Value, &[]),
    flag(&["--num-continuous-decode-steps"], Value, &[]),
    flag(&["--delete-ckpt-after-loading"], Switch, &[]),
    flag(&["--enable-memory-saver"], Switch, &[]),
    flag(&["--enable-weights-cpu-backup"], Switch, &[]),
    flag(&["--enable-draft-weights-cpu-backup"], Switch, &[]),
    flag(&["--allow-auto-truncate"], Switch, &[]),
    flag(&["--enable-custom-logit-processor"], Switch, &[]),
    flag(&["--flashinfer-mla-disable-ragged"], Switch, &[]),
    flag(&["--disable-shared-experts-fusion"], Switch, &[]),
    flag(&["--disable-chunked-prefix-cache"], Switch, &[]),
    flag(&["--disable-fast-image-processor"], Switch, &[]),
    flag(&["--keep-mm-feature-on-device"], Switch, &[]),
    flag(&["--enable-return-hidden-states"], Switch, &[]),
    flag(&["--enable-return-routed-experts"], Switch, &[]),
    flag(&["--scheduler-recv-interval"], Value, &[]),
    flag(&["--numa-node"], Nargs, &[]),
    flag(&["--enable-deterministic-inference"], Switch, &[]),
    flag(&["--rl-on-policy-target"], Value, &["fsdp"]),
    flag(&["--enable-attn-tp-input-scattered"], Switch, &[]),
    flag(&["--enable-nsa-prefill-context-parallel"], Switch, &[]),
    flag(&["--nsa-prefill-cp-mode"], Value, &["in-seq-split", "round-robin-split"]),
    flag(&["--enable-fused-qk-norm-rope"], Switch, &[]),
    flag(&["--enable-precise-embedding-interpolation"], Switch, &[]),
    flag(&["--enable-dynamic-batch-tokenizer"], Switch, &[]),
    flag(&["--dynamic-batch-tokenizer-batch-size"], Value, &[]),
    flag(&["--dynamic-batch-tokenizer-batch-timeout"], Value, &[]),
    flag(&["--debug-tensor-dump-output-folder"], Value, &[]),
    flag(&["--debug-tensor-dump-layers"], Nargs, &[]),
    flag(&["--debug-tensor-dump-input-file"], Value, &[]),
    flag(&["--debug-tensor-dump-inject"], Value, &[]),
    flag(&["--disaggregation-mode"], Value, &["null", "prefill", "decode"]),
    flag(&["--disaggregation-transfer-backend"], Value, &["mooncake", "nixl", "ascend", "fake", "mori"]),
    flag(&["--disaggregation-bootstrap-port"], Value, &[]),
    flag(&["--disaggregation-decode-tp"], Value, &[]),
    flag(&["--disaggregation-decode-dp"], Value, &[]),
    flag(&["--disaggregation-prefill-pp"], Value, &[]),
    flag(&["--disaggregation-ib-device"], Value, &[]),
    flag(&["--disaggregation-decode-enable-offload-kvcache"], Switch, &[]),
    flag(&["--num-reserved-decode-tokens"], Value, &[]),
    flag(&["--disaggregation-decode-polling-interval"], Value, &[]),
    flag(&["--encoder-only"], Switch, &[]),
    flag(&["--language-only"], Switch, &[]),
    flag(&["--encoder-transfer-backend"], Value, &["zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"]),
    flag(&["--encoder-urls"], Nargs, &[]),
    flag(&["--custom-weight-loader"], Nargs, &[]),
    flag(&["--weight-loader-disable-mmap"], Switch, &[]),
    flag(&["--remote-instance-weight-loader-seed-instance-ip"], Value, &[]),
    flag(&["--remote-instance-weight-loader-seed-instance-service-port"], Value, &[]),
    flag(&["--remote-instance-weight-loader-send-weights-group-ports"], Value, &[]),
    flag(&["--remote-instance-weight-loader-backend"], Value, &["transfer_engine", "nccl"]),
    flag(&["--remote-instance-weight-loader-start-seed-via-transfer-engine"], Switch, &[]),
    flag(&["--enable-pdmux"], Switch, &[]),
    flag(&["--pdmux-config-path"], Value, &[]),
    flag(&["--sm-group-num"], Value, &[]),
    flag(&["--config"], Value, &[]),
    flag(&["--mm-max-concurrent-calls"], Value, &[]),
    flag(&["--mm-per-request-timeout"], Value, &[]),
    flag(&["--enable-broadcast-mm-inputs-process"], Switch, &[]),
    flag(&["--mm-process-config"], Value, &[]),
    flag(&["--mm-enable-dp-encoder"], Switch, &[]),
    flag(&["--limit-mm-data-per-request"], Value, &[]),
    flag(&["--decrypted-config-file"], Value, &[]),
    flag(&["--decrypted-draft-config-file"], Value, &[]),
    flag(&["--enable-prefix-mm-cache"], Switch, &[]),
    flag(&["--forward-hooks"], Value, &[]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulators_flags_come_apart_from_the_engines_with_their_values() {
        let args: Vec<String> = [
            "--max-num-seqs=64",
            "--sim-speedup=4",
            "--sim-params",
            "355B-A32B",
            "--sim-refuse-cache-reset",
            "--enforce-eager",
            "--sim-seed",
            "7",
            "--kv-cache-dtype",
            "fp8",
        ]
        .map(String::from)
        .to_vec();
        let (engine, simulator) = without_simulator_flags(&args);
        assert_eq!(engine, ["--max-num-seqs=64", "--enforce-eager", "--kv-cache-dtype", "fp8"]);
        assert_eq!(
            simulator,
            ["--sim-speedup=4", "--sim-params 355B-A32B", "--sim-refuse-cache-reset", "--sim-seed 7"]
        );
        // A flag left without its value takes nothing from the next option.
        let (engine, simulator) = without_simulator_flags(&["--sim-gpu".into(), "--enforce-eager".into()]);
        assert_eq!((engine, simulator), (vec!["--enforce-eager".to_owned()], vec!["--sim-gpu".to_owned()]));
        let (engine, simulator) = without_simulator_flags(&[]);
        assert!(engine.is_empty() && simulator.is_empty());
    }

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_resolve_as_argparse_resolves_them() {
        let found = |engine, option| match resolve(engine, option) {
            Resolved::Found(flag, negated) => Some((flag.name(), negated)),
            _ => None,
        };
        use EngineKind::{Sglang, Vllm};
        assert_eq!(found(Vllm, "-tp"), Some(("--tensor-parallel-size", false)));
        assert_eq!(found(Vllm, "--no-enable-prefix-caching"), Some(("--enable-prefix-caching", true)));
        assert_eq!(found(Vllm, "--tensor-para"), Some(("--tensor-parallel-size", false)));
        assert_eq!(found(Sglang, "--tp"), Some(("--tensor-parallel-size", false)));
        // SGLang's booleans have no `--no-` form; an exact name wins over a longer one it prefixes.
        assert_eq!(found(Sglang, "--no-disable-radix-cache"), None);
        assert_eq!(found(Vllm, "--model"), Some(("--model", false)));
        assert!(matches!(resolve(Sglang, "--pp"), Resolved::Ambiguous(m) if m.len() == 3));
        assert_eq!(resolve(Vllm, "--bogus"), Resolved::Unknown);
        // Short options are not abbreviated.
        assert_eq!(resolve(Vllm, "-t"), Resolved::Unknown);
    }

    #[test]
    fn vllm_spells_options_its_own_ways() {
        assert_eq!(spelled(EngineKind::Vllm, "--max_num_seqs=8"), "--max-num-seqs=8");
        assert_eq!(
            spelled(EngineKind::Vllm, "--speculative_config.num_speculative_tokens"),
            "--speculative-config.num_speculative_tokens"
        );
        assert_eq!(spelled(EngineKind::Vllm, "-O3"), "--optimization-level=3");
        assert_eq!(spelled(EngineKind::Vllm, "--sim_gpu"), "--sim-gpu");
        assert_eq!(spelled(EngineKind::Sglang, "--tp_size"), "--tp_size");
        assert!(looks_like_option("--x") && !looks_like_option("-1") && !looks_like_option("-"));
        // Counts as vLLM reads them.
        for (text, count) in [("32768", 32768), ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("1M", 1 << 20)] {
            assert_eq!(human_count(text), Ok(count), "{text}");
        }
        assert!(human_count("1.5K").is_err() && human_count("8x").is_err() && human_count("-1").is_err());
        // Each JSON-valued option is one of vLLM's.
        for option in JSON_OPTIONS {
            assert!(matches!(resolve(EngineKind::Vllm, option), Resolved::Found(f, false) if f.name() == option));
        }
    }

    #[test]
    fn what_a_parser_would_refuse_is_said_once() {
        let vllm =
            refused(EngineKind::Vllm, &words("--max_num_seqs 8 -O3 -cc.mode=3 --sim-gpu H100 --bogus --bogus -1"));
        assert_eq!(vllm, ["vllm 0.17.1 has no option --bogus"]);
        let sglang = refused(EngineKind::Sglang, &words("--enable-prefix-caching --tp 2 --pp 2 --kv-cache-dtype fp8"));
        assert_eq!(
            sglang,
            [
                "sglang 0.5.9 has no option --enable-prefix-caching",
                "--pp could be any of --pp-size, --pp-max-micro-batch-size, --pp-async-batch-depth",
                "--kv-cache-dtype fp8 is not one of its values (auto, fp8_e5m2, fp8_e4m3, bf16, bfloat16, fp4_e2m1)",
            ]
        );
    }
}
