//! The study's domain types: runs, engine groups, jobs and attempts, as the
//! controller schedules and stores them and the reports read them. What only
//! the control plane keeps (agents' records, counters, the scheduler's
//! writes) is the controller's `records`.

use std::collections::BTreeMap;
use std::fmt;

use benchfleet_core::Summary;
use benchfleet_core::telemetry::TelemetrySummary;
use serde::{Deserialize, Serialize};

/// A run's number, unique within one store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(pub u64);

impl fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {} of job {}/{}", self.attempt, self.run, self.job)
    }
}

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
    pub state: RunState,
    /// When the run finished or was cancelled.
    #[serde(default)]
    pub ended_unix_ms: Option<i64>,
    /// Who cancelled the run, and why.
    #[serde(default)]
    pub note: Option<Note>,
    /// The SHA-256 of each dataset file the matrix names, by its path in the
    /// matrix: a greedy run parses its matrix again for every stage.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The runtime the submitter asked every engine to use instead of the
    /// matrix's, which later stages must honour too.
    #[serde(default)]
    pub runtime_override: Option<RuntimeKind>,
    /// A fleet check's targets as planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetRun>,
}

impl Run {
    pub fn is_over(&self) -> bool {
        self.state != RunState::Running
    }
}

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    /// Every job reached a final state (some may have failed).
    Finished,
    /// An operator cancelled it.
    Cancelled,
}

/// Who did something to a run or an agent, why, and when. Until operators
/// authenticate, `by` is what the operator's client says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    pub by: String,
    pub reason: String,
    pub at_unix_ms: i64,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.by.is_empty(), self.reason.is_empty()) {
            (true, true) => write!(f, "no reason given"),
            (true, false) => write!(f, "{}", self.reason),
            (false, true) => write!(f, "by {}", self.by),
            (false, false) => write!(f, "by {}: {}", self.by, self.reason),
        }
    }
}

/// An agent's stable id, given by the controller the first time an agent
/// of that name registers and kept across restarts of either side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AgentId(pub u64);

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "agent-{}", self.0)
    }
}

impl std::str::FromStr for AgentId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix("agent-")
            .and_then(|n| n.parse().ok())
            .map(AgentId)
            .ok_or_else(|| format!("'{s}' is not an agent id (agent-N, as `benchfleet agents` lists them)"))
    }
}

/// How an engine is run by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

/// The inference engine a configuration runs: core's, which writes its
/// command line.
pub use benchfleet_core::engine::EngineKind;

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
    /// A job may run with a warm prefix cache when the engine's cannot be
    /// emptied (the matrix's `allow_warm_cache`); otherwise it fails.
    #[serde(default)]
    pub allow_warm_cache: bool,
    /// The profiles it runs (the matrix's engine and variants limit them);
    /// `None`: every profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiles: Option<Vec<String>>,
}

#[cfg(feature = "testing")]
impl EngineConfig {
    /// vLLM as a local process on model `m`, named `name`, with `variants`:
    /// what the controller's unit tests build groups of.
    pub fn test(name: &str, variants: &[&str]) -> EngineConfig {
        EngineConfig {
            name: name.to_owned(),
            engine: "vllm".into(),
            kind: EngineKind::Vllm,
            variants: variants.iter().map(|v| (*v).to_owned()).collect(),
            model: "m".into(),
            image: String::new(),
            args: Vec::new(),
            runtime: RuntimeKind::Process,
            url: None,
            allow_warm_cache: false,
            profiles: None,
        }
    }
}

impl EngineConfig {
    /// Whether it runs the profile of this name.
    pub fn runs(&self, profile: &str) -> bool {
        self.profiles.as_ref().is_none_or(|names| names.iter().any(|n| n == profile))
    }

    /// The command line that serves this configuration, as a report shows
    /// it: the agent's, without the address it listens on.
    pub fn serve_command(&self) -> String {
        benchfleet_core::engine::one_line(self.kind, &self.model, &self.args)
    }
}

/// A job's load and its parts are core's (`benchfleet_core::load`), under
/// the names the controller gives them.
pub use benchfleet_core::load::{
    Arrival, Endpoint, LoadDataset as Dataset, LoadSpec, Sessions, StoredFile, TraceFormat, Window,
};

/// The successful repeats pooled for their throughputs, means and success
/// rate (no percentiles: no digest is read). The planners and the report
/// both pool jobs this way.
pub fn pooled(jobs: &[&Job]) -> Option<Summary> {
    let summaries: Vec<&Summary> =
        jobs.iter().filter(|j| j.state == JobState::Succeeded).filter_map(|j| j.summary.as_ref()).collect();
    benchfleet_core::pool(&summaries, None)
}

/// A load profile: the traffic one job sends (its `load`) under the
/// matrix's name, and what a search profile searches. Stored with the
/// load's fields flattened into the profile's, the shape profiles had
/// before the load was a type of its own, so both read alike. A profile
/// reads as its load (`Deref`): `profile.rate` is `profile.load.rate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    #[serde(flatten)]
    pub load: LoadSpec,
    /// A search profile: the load is found (`search`), not given; its jobs
    /// are probes, each at one point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<crate::slo::Search>,
    /// A probe of a search: the point this job's load is set to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::slo::Probe>,
    /// A point of a sweep (`NAME-r8`): the swept profile's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_of: Option<String>,
}

impl Profile {
    /// `requests` of `dataset` all at once to the completions endpoint,
    /// with every other field at its default: what a matrix profile with
    /// only those fields makes.
    pub fn new(name: &str, dataset: Dataset, requests: u64) -> Profile {
        Profile {
            name: name.to_owned(),
            load: LoadSpec::new(dataset, requests),
            search: None,
            probe: None,
            sweep_of: None,
        }
    }
}

impl std::ops::Deref for Profile {
    type Target = LoadSpec;

    fn deref(&self) -> &LoadSpec {
        &self.load
    }
}

impl std::ops::DerefMut for Profile {
    fn deref_mut(&mut self) -> &mut LoadSpec {
        &mut self.load
    }
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
    /// Where the group runs now, if it was handed to an agent.
    #[serde(default)]
    pub placement: Option<Placement>,
    /// Agents on which an attempt of the group's jobs failed: a rerun goes
    /// elsewhere when it can.
    #[serde(default)]
    pub failed_on: Vec<AgentId>,
    /// A fleet check's group runs on one agent (and GPUs) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
}

/// Where a fleet check's group must run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub agent: AgentId,
    /// The agent's name when the check was planned.
    pub host: String,
    /// The GPUs (UUIDs) of a check per GPU; empty: any of the agent's.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// What the report calls the target: `host`, or `host GPU 2`.
    pub label: String,
}

/// A fleet check as it was planned: what it ran a job on, and the hosts it
/// could not, each with the reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetRun {
    pub per: crate::fleet::Per,
    pub skipped: Vec<crate::fleet::Skipped>,
}

/// A group handed to an agent, with the GPUs it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub agent: AgentId,
    pub gpus: Vec<String>,
    /// The lease epoch it was assigned under.
    pub epoch: u64,
    pub since_unix_ms: i64,
}

fn one_gpu() -> u32 {
    1
}

fn first_stage() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Assigned,
    StartingEngine,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }

    /// Handed to an agent and not yet ended.
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Assigned | JobState::StartingEngine | JobState::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Assigned => "assigned",
            JobState::StartingEngine => "starting_engine",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Assigned,
        JobState::StartingEngine,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];
}

/// Whose fault a failed attempt is; decides whether the job runs again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The attempt's own failure: run again elsewhere, up to the cap.
    Attempt,
    /// The configuration cannot work anywhere: not run again.
    Config,
    /// Not the job's doing (the host's or the lease's): run again without
    /// counting against the cap.
    Host,
}

/// How one attempt ended, or that it has not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Running,
    Succeeded,
    Failed,
    /// Given up by the controller (lost lease, deadline, agent restart); its
    /// messages and records are refused from then on.
    Abandoned,
    Cancelled,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Abandoned => "abandoned",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }
}

/// One attempt of a job, kept in the job's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptInfo {
    /// From 1.
    pub number: u32,
    pub epoch: u64,
    pub agent: AgentId,
    pub agent_name: String,
    pub started_unix_ms: i64,
    pub ended_unix_ms: Option<i64>,
    pub outcome: AttemptOutcome,
    pub reason: Option<String>,
    /// Whether it counts against the attempt cap: it began (the engine was
    /// starting or the load running) and failed or was lost on its own
    /// account.
    pub charged: bool,
    /// The engine's last log lines, when it failed.
    #[serde(default)]
    pub log_tail: Option<String>,
    /// What an hour of one of its agent's GPUs costs, as the agent said
    /// (`--gpu-hour-price`): the report's cost of this attempt, before the
    /// matrix's price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<benchfleet_core::cost::Price>,
}

/// What the controller stored of one attempt's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptStats {
    /// Records stored (each batch counted once, however often it was sent).
    pub records: u64,
    /// Requests loadgen said it had sent, in its latest batch.
    pub sent: u64,
    /// The records were removed when a later attempt started.
    pub removed: bool,
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
    /// The lease epoch the current attempt was granted under.
    #[serde(default)]
    pub epoch: u64,
    pub agent: Option<AgentId>,
    pub error: Option<String>,
    pub log_tail: Option<String>,
    pub engine_startup_s: Option<f64>,
    /// loadgen's summary of the current attempt, once stored. Kept apart in
    /// the store (not serialized with the job): the store fills it in when
    /// it reads a run's jobs; the scheduler never holds it.
    #[serde(skip)]
    pub summary: Option<Summary>,
    /// The GPUs the current attempt ran on, one fingerprint line each
    /// (name, UUID, driver, CUDA, clocks), as probed before it started.
    #[serde(default)]
    pub gpu_fingerprint: Vec<String>,
    /// The last image pull progress the agent reported, while starting.
    #[serde(default)]
    pub pull_progress: Option<String>,
    /// How the current attempt's prefix cache was made cold ("cold: ..."),
    /// or why it may have been warm ("warm: ...").
    #[serde(default)]
    pub prefix_cache: Option<String>,
    /// Every attempt so far, oldest first.
    #[serde(default)]
    pub attempts: Vec<AttemptInfo>,
    /// Attempts made before the latest `retry`: the cap counts from there.
    #[serde(default)]
    pub retry_base: u32,
    /// The current attempt's engine version, as its own endpoint says it
    /// (vLLM's `/version`, SGLang's `/get_server_info`); `None` for an engine
    /// that does not say.
    #[serde(default)]
    pub engine_version: Option<String>,
    /// The digest of the engine's image (Docker: its repository digest, else
    /// its id); `None` for engines run otherwise.
    #[serde(default)]
    pub image_digest: Option<String>,
    /// loadgen's command line as the agent ran it for the current attempt,
    /// machine-local paths and URLs included (`--report-to`, the dataset and
    /// tokenizer files in the agent's cache); empty before it ran.
    #[serde(default)]
    pub loadgen_args: Vec<String>,
    #[serde(default)]
    pub loadgen_version: Option<String>,
    /// The summary of the current attempt's telemetry (the engine's
    /// `/metrics`, the GPUs' readings); its series are in the store apart
    /// (`Store::telemetry`).
    #[serde(default)]
    pub telemetry: Option<TelemetrySummary>,
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
            epoch: 0,
            agent: None,
            error: None,
            log_tail: None,
            engine_startup_s: None,
            summary: None,
            gpu_fingerprint: Vec::new(),
            pull_progress: None,
            prefix_cache: None,
            attempts: Vec::new(),
            retry_base: 0,
            engine_version: None,
            image_digest: None,
            loadgen_args: Vec::new(),
            loadgen_version: None,
            telemetry: None,
        }
    }

    /// Each GPU that throttled during the current attempt, worded as a
    /// report shows it: "SM clock 1,410 of 1,980 MHz for 38% of the job:
    /// power cap" (with several GPUs, each starts with its UUID).
    pub fn throttle_flags(&self) -> Vec<String> {
        self.telemetry.as_ref().map(TelemetrySummary::throttle_flags).unwrap_or_default()
    }

    /// The most memory one of the attempt's GPUs held during it.
    pub fn peak_gpu_memory_bytes(&self) -> Option<u64> {
        self.telemetry.as_ref().and_then(|t| t.peak_gpu_memory_bytes)
    }

    /// The loadgen command that reproduces the attempt's load: its version
    /// (when known) and its arguments as the agent ran them, shell-quoted.
    pub fn loadgen_command(&self) -> Option<String> {
        if self.loadgen_args.is_empty() {
            return None;
        }
        let mut words = vec!["benchfleet-loadgen".to_owned()];
        words.extend(self.loadgen_args.iter().map(|a| shell_word(a)));
        Some(words.join(" "))
    }

    /// The current attempt's entry in the history.
    pub fn current(&self) -> Option<&AttemptInfo> {
        self.attempts.last().filter(|a| a.number == self.attempt)
    }

    pub fn current_mut(&mut self) -> Option<&mut AttemptInfo> {
        let n = self.attempt;
        self.attempts.last_mut().filter(|a| a.number == n)
    }

    pub fn key(&self) -> AttemptKey {
        AttemptKey { run: self.run, job: self.id, attempt: self.attempt }
    }
}

/// `word` as a POSIX shell reads it back: bare when it is plain, else in
/// single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,+@%".contains(&b));
    if plain { word.to_owned() } else { format!("'{}'", word.replace('\'', "'\\''")) }
}

#[cfg(test)]
mod job_tests {
    use super::*;

    #[test]
    fn profiles_stored_before_the_load_had_a_type_read_and_write_as_they_were() {
        // A probe of a ShareGPT profile with every load field set, as the
        // store held it when `Profile` carried the load's fields itself.
        let stored = concat!(
            r#"{"name":"chat@r8","dataset":{"sharegpt":{"file":"data/chat.json","sha256":"ab","output_tokens":64}},"#,
            r#""rate":8.0,"arrival":"poisson","requests":200,"max_concurrency":32,"endpoint":"chat","seed":7,"#,
            r#""lag_limit_ms":20.0,"rate_tolerance":0.025,"warmup":{"requests":5},"cooldown":{"seconds":2.5},"#,
            r#""max_duration_s":120.0,"ignore_eos":true,"extra_body":"{\"temperature\":0}","#,
            r#""goodput":{"ttft_ms":200.0,"tpot_ms":null,"e2el_ms":5000.0},"#,
            r#""processor":{"file":"tok.json","sha256":"cd"},"probe":{"search":"chat","point":8.0}}"#
        );
        let p: Profile = serde_json::from_str(stored).expect("an old profile reads");
        assert_eq!(p.name, "chat@r8");
        assert_eq!(
            p.load,
            LoadSpec {
                rate: Some(8.0),
                arrival: Arrival::Poisson,
                max_concurrency: Some(32),
                endpoint: Endpoint::Chat,
                seed: 7,
                lag_limit_ms: Some(20.0),
                rate_tolerance: Some(0.025),
                warmup: Some(Window::Requests(5)),
                cooldown: Some(Window::Seconds(2.5)),
                max_duration_s: Some(120.0),
                ignore_eos: true,
                extra_body: Some(r#"{"temperature":0}"#.into()),
                goodput: Some(benchfleet_core::metrics::Slo {
                    ttft_ms: Some(200.0),
                    tpot_ms: None,
                    e2el_ms: Some(5000.0)
                }),
                processor: Some(StoredFile { file: "tok.json".into(), sha256: "cd".into() }),
                ..LoadSpec::new(
                    Dataset::ShareGpt {
                        file: "data/chat.json".into(),
                        sha256: "ab".into(),
                        output_tokens: Some(64),
                        sessions: None
                    },
                    200
                )
            }
        );
        assert_eq!(p.probe, Some(crate::slo::Probe { search: "chat".into(), point: 8.0 }));
        // Written again, byte for byte: an export or a store a newer build
        // wrote reads the same in an older one.
        assert_eq!(serde_json::to_string(&p).expect("json"), stored);
        // Older still: before the lag limit, the windows and the rest.
        let oldest = concat!(
            r#"{"name":"p","dataset":{"random":{"input_tokens":8,"output_tokens":4,"seed":1}},"rate":null,"#,
            r#""arrival":"constant","requests":10,"max_concurrency":null,"endpoint":"completions","seed":0}"#
        );
        let p: Profile = serde_json::from_str(oldest).expect("an oldest profile reads");
        assert_eq!(p, Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 4, seed: 1 }, 10));
    }

    #[test]
    fn the_loadgen_command_quotes_what_a_shell_would_split() {
        let mut job = Job::new(
            RunId(1),
            1,
            1,
            Profile::new("p", Dataset::Random { input_tokens: 1, output_tokens: 1, seed: 1 }, 1),
            1,
        );
        assert_eq!(job.loadgen_command(), None);
        job.loadgen_args =
            ["--model", "Qwen/Qwen3-8B", "--extra-body", r#"{"temperature": 0}"#, "--dataset-path", "/tmp/it's.json"]
                .map(String::from)
                .to_vec();
        assert_eq!(
            job.loadgen_command().as_deref(),
            Some(
                r#"benchfleet-loadgen --model Qwen/Qwen3-8B --extra-body '{"temperature": 0}' --dataset-path '/tmp/it'\''s.json'"#
            )
        );
    }
}

/// Names one attempt of one job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    pub cancelled: u64,
}

impl Progress {
    pub fn of<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Progress {
        let mut p = Progress::default();
        for j in jobs {
            p.total += 1;
            match j.state {
                JobState::Succeeded => p.succeeded += 1,
                JobState::Failed => p.failed += 1,
                JobState::Cancelled => p.cancelled += 1,
                _ => {}
            }
        }
        p
    }

    pub fn done(&self) -> u64 {
        self.succeeded + self.failed + self.cancelled
    }
}
