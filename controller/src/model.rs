//! The controller's domain types: runs, engine groups, jobs and attempts, as
//! they are scheduled and stored.

use std::collections::BTreeMap;
use std::fmt;

use benchfleet_core::Summary;
use serde::{Deserialize, Serialize};

/// A run's number, unique within one store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(pub u64);

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for RunId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim_start_matches("run-")
            .parse()
            .map(RunId)
            .map_err(|_| format!("'{s}' is not a run id (a number, as `benchfleet runs` lists them)"))
    }
}

/// One stored run: a submitted matrix and where it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub id: RunId,
    pub name: String,
    pub matrix_file: String,
    pub matrix_yaml: String,
    pub created_unix_ms: i64,
    pub finished: bool,
    /// The SHA-256 of each dataset file the matrix names, by its path in the
    /// matrix: a greedy run parses its matrix again for every stage.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The runtime the submitter asked every engine to use instead of the
    /// matrix's, which later stages must honour too.
    #[serde(default)]
    pub runtime_override: Option<RuntimeKind>,
}

/// How an engine is run by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    Process,
    Docker,
    External,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Process => "process",
            RuntimeKind::Docker => "docker",
            RuntimeKind::External => "external",
        }
    }
}

/// The inference engine a configuration runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }
}

/// One engine configuration: an engine with a set of variants applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineConfig {
    /// `vllm`, or `vllm+prefix-caching` for the engine with one variant.
    pub name: String,
    pub engine: String,
    pub kind: EngineKind,
    pub variants: Vec<String>,
    pub model: String,
    pub image: String,
    pub args: Vec<String>,
    pub runtime: RuntimeKind,
    /// For the external runtime.
    pub url: Option<String>,
}

impl EngineConfig {
    /// The command line that serves this configuration, as a report shows it.
    pub fn serve_command(&self) -> String {
        let mut words = match self.kind {
            EngineKind::Vllm => vec!["vllm".to_owned(), "serve".to_owned(), self.model.clone()],
            EngineKind::Sglang => {
                vec!["python3 -m sglang.launch_server".to_owned(), "--model-path".to_owned(), self.model.clone()]
            }
        };
        words.extend(self.args.iter().cloned());
        words.join(" ")
    }
}

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    Constant,
    Poisson,
}

/// The OpenAI endpoint a profile sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Where a profile's prompts come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dataset {
    Random {
        input_tokens: u32,
        output_tokens: u32,
        seed: u64,
    },
    /// A ShareGPT file, stored by the controller under its SHA-256.
    Sharegpt {
        file: String,
        sha256: String,
        output_tokens: Option<u32>,
    },
}

/// A load profile: the traffic one job sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub dataset: Dataset,
    /// Requests per second; `None` sends everything at once.
    pub rate: Option<f64>,
    pub arrival: Arrival,
    pub requests: u64,
    pub max_concurrency: Option<u64>,
    pub endpoint: Endpoint,
    pub seed: u64,
}

/// The engine configuration that one agent starts once and runs jobs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub run: RunId,
    pub id: u64,
    pub config: EngineConfig,
    /// The GPU model the matrix asks for (matched on the product name).
    pub gpu: Option<String>,
    /// GPUs the engine is given.
    #[serde(default = "one_gpu")]
    pub gpus_per_job: u32,
    /// In the order they run.
    pub jobs: Vec<u64>,
    /// The greedy stage that scheduled the group; 1 for a grid run.
    #[serde(default = "first_stage")]
    pub stage: u32,
}

fn one_gpu() -> u32 {
    1
}

fn first_stage() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Assigned,
    StartingEngine,
    Running,
    Succeeded,
    Failed,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

/// One (engine configuration, profile, repeat).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub run: RunId,
    pub id: u64,
    pub group: u64,
    pub profile: Profile,
    /// From 1.
    pub repeat: u32,
    pub state: JobState,
    /// The current attempt, from 1; 0 before the first assignment. Messages
    /// of any other attempt are stale and ignored.
    pub attempt: u32,
    pub agent: Option<String>,
    pub error: Option<String>,
    pub log_tail: Option<String>,
    pub engine_startup_s: Option<f64>,
    /// loadgen's summary of the current attempt, once it arrived.
    pub summary: Option<Summary>,
    /// The GPUs the current attempt ran on, one fingerprint line each
    /// (name, UUID, driver, CUDA, clocks), as probed before it started.
    #[serde(default)]
    pub gpu_fingerprint: Vec<String>,
    /// The last image pull progress the agent reported, while starting.
    #[serde(default)]
    pub pull_progress: Option<String>,
}

impl Job {
    /// A job not yet assigned to any agent.
    pub fn new(run: RunId, id: u64, group: u64, profile: Profile, repeat: u32) -> Job {
        Job {
            run,
            id,
            group,
            profile,
            repeat,
            state: JobState::Pending,
            attempt: 0,
            agent: None,
            error: None,
            log_tail: None,
            engine_startup_s: None,
            summary: None,
            gpu_fingerprint: Vec::new(),
            pull_progress: None,
        }
    }
}

/// Names one attempt of one job.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttemptKey {
    pub run: RunId,
    pub job: u64,
    pub attempt: u32,
}

/// Counts of a run's jobs, for progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub total: u64,
    pub succeeded: u64,
    pub failed: u64,
}

impl Progress {
    pub fn of(jobs: &[Job]) -> Progress {
        Progress {
            total: jobs.len() as u64,
            succeeded: jobs.iter().filter(|j| j.state == JobState::Succeeded).count() as u64,
            failed: jobs.iter().filter(|j| j.state == JobState::Failed).count() as u64,
        }
    }

    pub fn done(&self) -> u64 {
        self.succeeded + self.failed
    }
}
