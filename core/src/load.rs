//! One job's load, typed once: `LoadSpec` is what the controller stores in
//! a profile, what an assignment carries to the agent (`convert` maps it to
//! and from `LoadProfile`), and what loadgen's command line says.
//! `to_args` is the one way a spec becomes loadgen's flags, with the
//! `LoadTarget` the agent adds (the engine, the files on disk, where the
//! records go); loadgen's own parser reads them back (`cli::Args::spec`),
//! and a property test in loadgen holds the two to each other.
//!
//! A file travels by its hash to the agent and by its path to loadgen: a
//! spec read back from a command line names each file by the path it was
//! given, with no hash.
//!
//! How a run ended is typed here too, for both sides: loadgen's exit status
//! is a `LoadExit`, and what it writes to `--outcome-file` as it exits a
//! `LoadOutcome`, which the agent reads instead of loadgen's stderr.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::metrics::Slo;
pub use crate::trace::TraceFormat;

/// The OpenAI endpoint a job sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/completions`: the prompt as text, replies in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: the prompt as one user message, replies in
    /// `choices[0].delta.content` or `.reasoning_content`.
    Chat,
}

impl Endpoint {
    /// As the matrix and the reports name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }

    /// The API path, as loadgen's `--endpoint` takes it.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }

    /// The endpoint served at `path`, if it is one of ours.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        [Endpoint::Completions, Endpoint::Chat].into_iter().find(|e| e.path() == path.trim_end_matches('/'))
    }
}

/// How requests arrive when the job has a rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// One request every 1/rate seconds.
    Constant,
    /// Exponential gaps of mean 1/rate, from the spec's seed.
    Poisson,
}

impl Arrival {
    /// As the matrix, loadgen's `--arrival` and the reports name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
        }
    }
}

/// A stretch at the start or the end of a job whose requests are sent and
/// recorded but not measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    Requests(u64),
    Seconds(f64),
}

/// How a dataset's conversations go as sessions: the spec's `requests`
/// count turns, and its rate, arrivals and concurrency cap are of sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sessions {
    /// Between a reply's end and the session's next turn.
    pub think_time_ms: u64,
}

/// A file a matrix names, as the controller stores it: by its SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// As the matrix names it.
    pub file: String,
    pub sha256: String,
}

/// Where a job's prompts come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadDataset {
    Random {
        input_tokens: u32,
        output_tokens: u32,
        seed: u64,
    },
    /// A ShareGPT file, stored by the controller under its SHA-256. It has
    /// no seed of its own: the spec's orders its conversations.
    #[serde(rename = "sharegpt")]
    ShareGpt {
        file: String,
        sha256: String,
        output_tokens: Option<u32>,
        /// Each conversation sent as a multi-turn session (its user turns
        /// in order, each carrying the conversation so far), rather than
        /// its first exchange as one request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sessions: Option<Sessions>,
    },
    /// `groups` random prefixes; request i sends prefix i mod groups and a
    /// suffix of its own (prefix caching's workload).
    SharedPrefix {
        groups: u32,
        prefix_tokens: u32,
        suffix_tokens: u32,
        output_tokens: u32,
        seed: u64,
    },
    /// A request trace (`crate::trace`), stored like a ShareGPT file,
    /// replayed on its own schedule `speed` times as fast as recorded; the
    /// spec's `requests` are its first ones.
    Trace {
        file: String,
        sha256: String,
        format: TraceFormat,
        speed: f64,
    },
    /// Multi-turn sessions: each of `turns` user turns of `user_tokens`
    /// random words carries the conversation so far (the earlier turns and
    /// the replies they got) and is sent `think_time_ms` after the previous
    /// reply; each reply is asked for `output_tokens`. The spec's `requests`
    /// are turns; its rate, arrivals and concurrency cap are of sessions.
    MultiTurn {
        turns: u32,
        user_tokens: u32,
        output_tokens: u32,
        think_time_ms: u64,
        seed: u64,
    },
}

impl LoadDataset {
    /// Tokens of each prompt, when the dataset fixes them.
    pub fn input_tokens(&self) -> Option<u32> {
        match self {
            LoadDataset::Random { input_tokens, .. } => Some(*input_tokens),
            LoadDataset::SharedPrefix { prefix_tokens, suffix_tokens, .. } => Some(prefix_tokens + suffix_tokens),
            LoadDataset::ShareGpt { .. } | LoadDataset::Trace { .. } | LoadDataset::MultiTurn { .. } => None,
        }
    }

    /// The file it reads (a ShareGPT file or a trace): its name as the
    /// matrix gives it, and its SHA-256.
    pub fn file(&self) -> Option<(&str, &str)> {
        match self {
            LoadDataset::ShareGpt { file, sha256, .. } | LoadDataset::Trace { file, sha256, .. } => {
                Some((file, sha256))
            }
            LoadDataset::Random { .. } | LoadDataset::SharedPrefix { .. } | LoadDataset::MultiTurn { .. } => None,
        }
    }

    /// Tokens of each reply, when the dataset fixes them.
    pub fn output_tokens(&self) -> Option<u32> {
        match self {
            LoadDataset::Random { output_tokens, .. }
            | LoadDataset::SharedPrefix { output_tokens, .. }
            | LoadDataset::MultiTurn { output_tokens, .. } => Some(*output_tokens),
            LoadDataset::ShareGpt { output_tokens, .. } => *output_tokens,
            LoadDataset::Trace { .. } => None,
        }
    }
}

/// The traffic one job sends. Its serde form is the one the controller has
/// always stored in a profile (field for field, in this order), so stored
/// jobs read as they were written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadSpec {
    pub dataset: LoadDataset,
    /// Requests per second (finite, above 0); `None` sends everything at
    /// once.
    pub rate: Option<f64>,
    pub arrival: Arrival,
    pub requests: u64,
    pub max_concurrency: Option<u64>,
    pub endpoint: Endpoint,
    /// Of the arrivals (and of a ShareGPT file's order); a generated
    /// dataset's prompts have their own.
    pub seed: u64,
    /// The P99 dispatch lag limit, ms; `None`: the one the load kind gives.
    #[serde(default)]
    pub lag_limit_ms: Option<f64>,
    /// The share of the offered rate the achieved rate may fall short by;
    /// `None`: loadgen's default (5%).
    #[serde(default)]
    pub rate_tolerance: Option<f64>,
    #[serde(default)]
    pub warmup: Option<Window>,
    #[serde(default)]
    pub cooldown: Option<Window>,
    /// Sending stops after this long; requests in flight are cancelled.
    #[serde(default)]
    pub max_duration_s: Option<f64>,
    /// Every reply runs to its max_tokens (random datasets always do).
    #[serde(default)]
    pub ignore_eos: bool,
    /// A JSON object merged into every request body.
    #[serde(default)]
    pub extra_body: Option<String>,
    /// vLLM's goodput SLOs: the summary counts the requests within them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Slo>,
    /// The model's tokenizer (`tokenizer.json`): exact token counts for
    /// prompts and replies.
    #[serde(default)]
    pub processor: Option<StoredFile>,
}

/// What a command line adds to a spec: the engine it loads, the spec's
/// files where they lie on disk, and where the records go.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadTarget {
    /// The engine's root URL.
    pub base_url: String,
    /// The served model name.
    pub model: String,
    /// The ShareGPT file, for a ShareGPT spec.
    pub dataset_path: Option<PathBuf>,
    /// The tokenizer file, for a spec that names one.
    pub processor_path: Option<PathBuf>,
    /// The controller's ingest service and the attempt the records are of.
    pub report: Option<ReportTo>,
    /// No progress on stderr (a child whose stderr is kept for its log).
    pub quiet: bool,
    /// Where loadgen writes its `LoadOutcome` as it exits.
    pub outcome_file: Option<PathBuf>,
}

/// Where loadgen streams a job's records: the ingest service, the attempt's
/// fence, and how it reaches the service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportTo {
    pub url: String,
    pub run_id: String,
    pub job: u64,
    pub attempt: u32,
    pub epoch: u64,
    /// The CA the controller's certificate must chain to (a file: loadgen
    /// is another process).
    pub ca: Option<PathBuf>,
    /// Plain text to a host other than loopback.
    pub insecure: bool,
}

impl LoadSpec {
    /// `requests` of `dataset` all at once to the completions endpoint,
    /// with every other field at its default: what a matrix profile with
    /// only those fields makes.
    pub fn new(dataset: LoadDataset, requests: u64) -> LoadSpec {
        LoadSpec {
            dataset,
            rate: None,
            arrival: Arrival::Constant,
            requests,
            max_concurrency: None,
            endpoint: Endpoint::Completions,
            seed: 0,
            lag_limit_ms: None,
            rate_tolerance: None,
            warmup: None,
            cooldown: None,
            max_duration_s: None,
            ignore_eos: false,
            extra_body: None,
            goodput: None,
            processor: None,
        }
    }

    /// loadgen's command line for this load against `target`, with `vllm
    /// bench serve`'s flag names: the one mapping from a spec to flags.
    /// A generated dataset's seed makes the prompts (`--seed`), the spec's
    /// the arrivals (`--arrival-seed`); a ShareGPT file's order and its
    /// arrivals both follow the spec's (`--seed`).
    pub fn to_args(&self, target: &LoadTarget) -> Vec<String> {
        let mut args = Args::default();
        args.value("--base-url", &target.base_url);
        args.value("--endpoint", self.endpoint.path());
        args.value("--model", &target.model);
        args.value("--num-prompts", self.requests);
        if target.quiet {
            args.flag("--quiet");
        }
        if let Some(rate) = self.rate {
            args.value("--request-rate", rate);
        }
        // Said even without a rate, so that the flags read back as the spec.
        args.value("--arrival", self.arrival.as_str());
        if let Some(n) = self.max_concurrency {
            args.value("--max-concurrency", n);
        }
        if let Some(ms) = self.lag_limit_ms {
            args.value("--lag-limit-ms", ms);
        }
        if let Some(share) = self.rate_tolerance {
            args.value("--rate-tolerance", share);
        }
        for (window, requests, seconds) in
            [(self.warmup, "--warmup", "--warmup-time"), (self.cooldown, "--cooldown", "--cooldown-time")]
        {
            match window {
                Some(Window::Requests(n)) => args.value(requests, n),
                Some(Window::Seconds(s)) => args.value(seconds, s),
                None => {}
            }
        }
        if let Some(s) = self.max_duration_s {
            args.value("--max-duration", s);
        }
        if self.ignore_eos {
            args.flag("--ignore-eos");
        }
        if let Some(body) = &self.extra_body {
            args.value("--extra-body", body);
        }
        let goodput = self.goodput.map(|g| g.words()).unwrap_or_default();
        if !goodput.is_empty() {
            args.flag("--goodput");
            args.0.extend(goodput);
        }
        if let Some(path) = &target.processor_path {
            args.value("--processor", path.display());
        }
        match &self.dataset {
            LoadDataset::Random { input_tokens, output_tokens, seed } => {
                args.value("--dataset-name", "random");
                args.value("--random-input-len", input_tokens);
                args.value("--random-output-len", output_tokens);
                args.value("--seed", seed);
                args.value("--arrival-seed", self.seed);
            }
            LoadDataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
                args.value("--dataset-name", "prefix");
                args.value("--prefix-groups", groups);
                args.value("--prefix-len", prefix_tokens);
                args.value("--random-input-len", suffix_tokens);
                args.value("--random-output-len", output_tokens);
                args.value("--seed", seed);
                args.value("--arrival-seed", self.seed);
            }
            LoadDataset::ShareGpt { output_tokens, sessions, .. } => {
                args.value("--dataset-name", "sharegpt");
                args.value("--seed", self.seed);
                if let Some(path) = &target.dataset_path {
                    args.value("--dataset-path", path.display());
                }
                if let Some(n) = output_tokens {
                    args.value("--sharegpt-output-len", n);
                }
                if let Some(s) = sessions {
                    args.flag("--sharegpt-sessions");
                    args.value("--multi-turn-think-ms", s.think_time_ms);
                }
            }
            LoadDataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed } => {
                args.value("--dataset-name", "multi-turn");
                args.value("--multi-turn-turns", turns);
                args.value("--random-input-len", user_tokens);
                args.value("--random-output-len", output_tokens);
                args.value("--multi-turn-think-ms", think_time_ms);
                args.value("--seed", seed);
                args.value("--arrival-seed", self.seed);
            }
            LoadDataset::Trace { format, speed, .. } => {
                args.value("--dataset-name", "trace");
                // Unused by a trace; said so that the flags read back as the spec.
                args.value("--seed", self.seed);
                args.value("--trace-format", format.name());
                args.value("--trace-speed", speed);
                if let Some(path) = &target.dataset_path {
                    args.value("--dataset-path", path.display());
                }
            }
        }
        if let Some(path) = &target.outcome_file {
            args.value("--outcome-file", path.display());
        }
        if let Some(r) = &target.report {
            args.value("--report-to", &r.url);
            args.value("--run-id", &r.run_id);
            args.value("--job", r.job);
            args.value("--attempt", r.attempt);
            args.value("--epoch", r.epoch);
            if let Some(ca) = &r.ca {
                args.value("--report-ca", ca.display());
            }
            if r.insecure {
                args.flag("--report-insecure");
            }
        }
        args.0
    }
}

/// How a loadgen run ended: one exit status per verdict (its `--help`
/// lists them). Another status, or none (a signal), is no verdict of
/// loadgen's: it crashed or was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadExit {
    /// 0: the run completed, its records (and summary) wherever they were
    /// to go. INVALID or not, unless `--fail-on-invalid`.
    Completed,
    /// 1: an error: a flag's value refused, a server that cannot be reached
    /// or does not serve the model, a dataset that cannot be read, records
    /// the controller did not take.
    Error,
    /// 2: the command line does not parse (clap's usage error). No outcome
    /// file is written: its path was not read.
    Usage,
    /// 3: with `--fail-on-invalid`, the run is INVALID.
    Invalid,
    /// 4: requests were sent and none succeeded: the run measured nothing.
    NoneSucceeded,
}

impl LoadExit {
    pub const ALL: [LoadExit; 5] =
        [LoadExit::Completed, LoadExit::Error, LoadExit::Usage, LoadExit::Invalid, LoadExit::NoneSucceeded];

    /// The process's exit status.
    pub fn code(self) -> u8 {
        match self {
            LoadExit::Completed => 0,
            LoadExit::Error => 1,
            LoadExit::Usage => 2,
            LoadExit::Invalid => 3,
            LoadExit::NoneSucceeded => 4,
        }
    }

    /// The verdict an exit status gives; `None` for one loadgen never
    /// exits with.
    pub fn from_code(code: i32) -> Option<LoadExit> {
        LoadExit::ALL.into_iter().find(|e| i32::from(e.code()) == code)
    }

    /// What it means, in a few words.
    pub fn meaning(self) -> &'static str {
        match self {
            LoadExit::Completed => "the run completed",
            LoadExit::Error => "an error",
            LoadExit::Usage => "the command line does not parse",
            LoadExit::Invalid => "the run is INVALID",
            LoadExit::NoneSucceeded => "no request succeeded",
        }
    }
}

/// What loadgen writes to `--outcome-file` (JSON) as it exits: the exit
/// status it exits with and, unless the run completed, why in its own
/// words. Whoever started it takes its verdict from the status, and its
/// message from here, never from its stderr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadOutcome {
    pub exit: LoadExit,
    /// `exit`'s number, for a reader that has not the type.
    pub code: u8,
    /// Why the run did not complete (the error, or why it is INVALID);
    /// `None` when it did.
    pub error: Option<String>,
}

impl LoadOutcome {
    pub fn new(exit: LoadExit, error: Option<String>) -> LoadOutcome {
        LoadOutcome { exit, code: exit.code(), error }
    }
}

/// A command line being written.
#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn flag(&mut self, flag: &str) {
        self.0.push(flag.to_owned());
    }

    /// `FLAG VALUE`, or `FLAG=VALUE` for a value a parser would take for a
    /// flag of its own (one that starts with `-`).
    fn value(&mut self, flag: &str, value: impl std::fmt::Display) {
        let value = value.to_string();
        if value.starts_with('-') {
            self.0.push(format!("{flag}={value}"));
        } else {
            self.0.extend([flag.to_owned(), value]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random() -> LoadSpec {
        LoadSpec::new(LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed: 5 }, 321)
    }

    #[test]
    fn a_generated_dataset_s_seed_makes_the_prompts_and_the_spec_s_the_arrivals() {
        let spec = LoadSpec { seed: 77, rate: Some(12.5), arrival: Arrival::Poisson, ..random() };
        let target = LoadTarget { base_url: "http://127.0.0.1:8123".into(), model: "m".into(), ..Default::default() };
        assert_eq!(
            spec.to_args(&target).join(" "),
            "--base-url http://127.0.0.1:8123 --endpoint /v1/completions --model m --num-prompts 321 \
             --request-rate 12.5 --arrival poisson --dataset-name random --random-input-len 100 \
             --random-output-len 20 --seed 5 --arrival-seed 77"
        );
        let sharegpt = LoadSpec {
            dataset: LoadDataset::ShareGpt {
                file: "d.json".into(),
                sha256: "ab".into(),
                output_tokens: Some(4),
                sessions: None,
            },
            ..spec
        };
        let target = LoadTarget { dataset_path: Some("/cache/ab".into()), quiet: true, ..target };
        assert!(
            sharegpt.to_args(&target).join(" ").ends_with(
                "--quiet --request-rate 12.5 --arrival poisson --dataset-name sharegpt --seed 77 \
                 --dataset-path /cache/ab --sharegpt-output-len 4"
            ),
            "{:?}",
            sharegpt.to_args(&target)
        );
    }

    #[test]
    fn every_exit_status_reads_back_as_its_verdict() {
        for exit in LoadExit::ALL {
            assert_eq!(LoadExit::from_code(i32::from(exit.code())), Some(exit));
        }
        assert_eq!(LoadExit::from_code(101), None, "a panic is no verdict");
        assert_eq!(LoadExit::from_code(-1), None);
        let outcome = LoadOutcome::new(LoadExit::NoneSucceeded, Some("all 3 requests failed".into()));
        let json = serde_json::to_string(&outcome).expect("json");
        assert_eq!(json, r#"{"exit":"none_succeeded","code":4,"error":"all 3 requests failed"}"#);
        assert_eq!(serde_json::from_str::<LoadOutcome>(&json).expect("reads back"), outcome);
    }

    #[test]
    fn a_value_that_looks_like_a_flag_is_joined_to_its_flag() {
        let target = LoadTarget { model: "-m".into(), ..Default::default() };
        let args = random().to_args(&target);
        assert!(args.contains(&"--model=-m".to_owned()), "{args:?}");
    }

    #[test]
    fn the_serde_form_is_the_one_profiles_were_stored_in() {
        let spec = LoadSpec {
            dataset: LoadDataset::ShareGpt {
                file: "d.json".into(),
                sha256: "ab".into(),
                output_tokens: None,
                sessions: None,
            },
            warmup: Some(Window::Seconds(2.5)),
            processor: Some(StoredFile { file: "t.json".into(), sha256: "cd".into() }),
            ..random()
        };
        let json = serde_json::to_string(&spec).expect("json");
        assert_eq!(
            json,
            r#"{"dataset":{"sharegpt":{"file":"d.json","sha256":"ab","output_tokens":null}},"rate":null,"arrival":"constant","requests":321,"max_concurrency":null,"endpoint":"completions","seed":0,"lag_limit_ms":null,"rate_tolerance":null,"warmup":{"seconds":2.5},"cooldown":null,"max_duration_s":null,"ignore_eos":false,"extra_body":null,"processor":{"file":"t.json","sha256":"cd"}}"#
        );
        assert_eq!(serde_json::from_str::<LoadSpec>(&json).expect("reads back"), spec);
    }
}
