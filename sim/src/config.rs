//! Parses the engines' own command lines (`vllm serve`, `sglang serve`, `python3 -m sglang.launch_server`) into a [`SimConfig`].
//!
//! Flags take `--flag value` or `--flag=value`, like argparse. A flag the
//! engine would not know is rejected, so a typo in a matrix fails on the
//! simulator just as it would on a GPU.

use std::{fmt, str::FromStr, time::Duration};

use crate::engine::Timing;

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
    /// `--max-num-seqs` / `--max-running-requests`, else `--sim-max-num-seqs` (256).
    pub max_num_seqs: usize,
    /// Token budget of one engine step (prefill chunks plus decodes); default 8192.
    pub max_num_batched_tokens: usize,
    pub enable_prefix_caching: bool,
    pub kv_cache_dtype: String,
    pub performance_mode: Option<String>,
    pub speculative_config: Option<serde_json::Value>,
    /// When set, chat streams start with `reasoning_content` deltas.
    pub reasoning_parser: Option<String>,
    pub language_model_only: bool,
    pub gpu_memory_utilization: Option<f64>,
    pub tensor_parallel_size: u32,
    pub trust_remote_code: bool,
    /// Seeds the generated words and the failure draws, so runs repeat.
    pub seed: u64,
    /// How long `/health` answers 503, as an engine loading weights would.
    pub startup_delay: Duration,
    pub timing: Timing,
    /// Fraction of requests answered with HTTP 500.
    pub fail_rate: f64,
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
    #[error("argument {flag}: invalid value {value:?}: {reason}")]
    InvalidValue { flag: String, value: String, reason: String },
}

/// Parses argv without the program name, e.g. `["vllm", "serve", "Qwen/Qwen3-8B", "--port=8001"]`.
pub fn parse_command_line(args: &[String]) -> Result<SimConfig, ArgError> {
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
        max_num_batched_tokens: 8192,
        enable_prefix_caching: true,
        kv_cache_dtype: "auto".into(),
        performance_mode: None,
        speculative_config: None,
        reasoning_parser: None,
        language_model_only: false,
        gpu_memory_utilization: None,
        tensor_parallel_size: 1,
        trust_remote_code: false,
        seed: 0,
        startup_delay: Duration::ZERO,
        timing: Timing::default(),
        fail_rate: 0.0,
    };
    let (mut engine_max_seqs, mut sim_max_seqs) = (None, 256);
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
                engine_max_seqs = Some(parse(name, &value()?)?);
            }
            (_, "--max-num-batched-tokens") | (Sglang, "--chunked-prefill-size") => {
                config.max_num_batched_tokens = parse(name, &value()?)?;
            }
            (_, "--enable-prefix-caching") => config.enable_prefix_caching = switch(true)?,
            (Vllm, "--no-enable-prefix-caching") | (Sglang, "--disable-radix-cache") => {
                config.enable_prefix_caching = switch(false)?;
            }
            (_, "--kv-cache-dtype") => config.kv_cache_dtype = value()?,
            (_, "--performance-mode") => config.performance_mode = Some(value()?),
            (_, "--speculative-config") => {
                let text = value()?;
                let json = serde_json::from_str(&text).map_err(|err| invalid(name, &text, err))?;
                config.speculative_config = Some(json);
            }
            (_, "--reasoning-parser") => config.reasoning_parser = Some(value()?),
            (_, "--language-model-only") => config.language_model_only = switch(true)?,
            (Vllm, "--gpu-memory-utilization") | (Sglang, "--mem-fraction-static") => {
                config.gpu_memory_utilization = Some(parse(name, &value()?)?);
            }
            (_, "--tensor-parallel-size") | (Sglang, "--tp-size") => {
                config.tensor_parallel_size = parse(name, &value()?)?;
            }
            (_, "--trust-remote-code") => config.trust_remote_code = switch(true)?,
            (_, "--seed") | (Sglang, "--random-seed") => config.seed = parse(name, &value()?)?,
            (_, "--sim-startup-ms") => config.startup_delay = millis(name, &value()?)?,
            (_, "--sim-prefill-us-per-token") => {
                config.timing.prefill_per_token = millis(name, &value()?)? / 1000;
            }
            (_, "--sim-decode-base-ms") => config.timing.decode_base = millis(name, &value()?)?,
            (_, "--sim-decode-ms-per-seq") => {
                config.timing.decode_per_seq = millis(name, &value()?)?;
            }
            (_, "--sim-max-num-seqs") => sim_max_seqs = parse(name, &value()?)?,
            (_, "--sim-fail-rate") => {
                let text = value()?;
                config.fail_rate = parse(name, &text)?;
                if !(0.0..=1.0).contains(&config.fail_rate) {
                    return Err(invalid(name, &text, "must be between 0 and 1"));
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
    config.max_num_seqs = engine_max_seqs.unwrap_or(sim_max_seqs).max(1);
    Ok(config)
}

fn invalid(flag: &str, value: &str, reason: impl fmt::Display) -> ArgError {
    ArgError::InvalidValue { flag: flag.into(), value: value.into(), reason: reason.to_string() }
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
    fn vllm_positional_model_and_both_flag_forms() {
        let c = parse_command_line(&args(
            "vllm serve Qwen/Qwen3-8B --port=8001 --max-model-len 4096 --max-num-seqs=64 \
             --enable-prefix-caching --kv-cache-dtype=fp8 --reasoning-parser qwen3 \
             --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":4} \
             --sim-decode-base-ms=2.5 --sim-prefill-us-per-token 10",
        ))
        .expect("valid command line");
        assert_eq!(c.engine, EngineKind::Vllm);
        assert_eq!((c.model.as_str(), c.served_model_name.as_str()), ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"));
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8001));
        assert_eq!((c.max_model_len, c.max_num_seqs), (4096, 64));
        assert_eq!(c.kv_cache_dtype, "fp8");
        assert_eq!(c.reasoning_parser.as_deref(), Some("qwen3"));
        assert_eq!(c.speculative_config, Some(serde_json::json!({"method":"mtp","num_speculative_tokens":4})));
        assert_eq!(c.timing.decode_base, Duration::from_micros(2500));
        assert_eq!(c.timing.prefill_per_token, Duration::from_micros(10));
    }

    #[test]
    fn vllm_model_flag_and_defaults() {
        let c = parse_command_line(&args("vllm serve --model m --served-model-name s")).expect("valid command line");
        assert_eq!((c.model.as_str(), c.served_model_name.as_str(), c.port), ("m", "s", 8000));
        assert_eq!((c.max_num_seqs, c.max_model_len, c.max_num_batched_tokens), (256, 32768, 8192));
    }

    #[test]
    fn sglang_forms() {
        for line in [
            "python3 -m sglang.launch_server --model-path m --context-length=2048 --max-running-requests 8 --tp-size 2",
            "sglang serve --model-path=m --context-length 2048 --max-running-requests=8 --tp-size=2",
        ] {
            let c = parse_command_line(&args(line)).expect(line);
            assert_eq!(c.engine, EngineKind::Sglang);
            assert_eq!((c.model.as_str(), c.port, c.max_model_len), ("m", 30000, 2048));
            assert_eq!((c.max_num_seqs, c.tensor_parallel_size), (8, 2));
        }
        let c =
            parse_command_line(&args("sglang serve --model-path m --sim-max-num-seqs 32")).expect("valid command line");
        assert_eq!(c.max_num_seqs, 32);
    }

    #[test]
    fn rejections() {
        check_err("vllm serve m --bogus 1", "unrecognized arguments: --bogus");
        check_err("vllm serve m --bogus=1", "unrecognized arguments: --bogus=1");
        check_err("vllm serve m extra", "unrecognized arguments: extra");
        check_err("vllm serve -tp 2 m", "unrecognized arguments: -tp");
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
        assert!(matches!(parse_command_line(&args("tgi serve m")), Err(ArgError::UnknownCommand(_))));
    }
}
