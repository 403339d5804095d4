//! What the controller asks an agent to do, as domain types, and the one
//! place they are converted from their gRPC form.

use std::path::PathBuf;

use benchfleet_proto as pb;

/// Identifies one attempt of one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    pub run_id: String,
    pub job: u64,
    pub attempt: u32,
}

/// How to start one engine configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineLaunch {
    /// "vllm" or "sglang".
    pub kind: String,
    pub model: String,
    pub image: String,
    pub args: Vec<String>,
    /// "process", "docker" or "external".
    pub runtime: String,
    pub url: Option<String>,
    pub config_name: String,
    /// Set by the agent for the attempt that starts the engine: the
    /// container name (`benchfleet-<run>-<job>-<attempt>`, from the group's
    /// first job) and labels naming run, job, attempt and agent.
    pub instance_name: String,
    pub labels: Vec<(String, String)>,
    /// The GPUs the engine may use, by UUID.
    pub gpu_uuids: Vec<String>,
}

/// Where a job's prompts come from.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadDataset {
    Random {
        input_tokens: u32,
        output_tokens: u32,
        seed: u64,
    },
    /// The file as the controller sent it; written to disk before loadgen runs.
    ShareGpt {
        name: String,
        sha256: String,
        content: Vec<u8>,
        output_tokens: Option<u32>,
    },
}

/// One job: the traffic loadgen sends to the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadJob {
    pub attempt: Attempt,
    pub profile: String,
    pub repeat: u32,
    /// "completions" or "chat".
    pub endpoint: String,
    /// None: all requests at once.
    pub rate: Option<f64>,
    /// "constant" or "poisson".
    pub arrival: String,
    pub requests: u64,
    pub max_concurrency: Option<u64>,
    pub seed: u64,
    pub dataset: LoadDataset,
}

/// A group of jobs on one engine, in the order they run.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupAssignment {
    pub run_id: String,
    pub group: u64,
    pub engine: EngineLaunch,
    pub jobs: Vec<LoadJob>,
    /// Where loadgen streams its records.
    pub ingest_url: String,
    /// The GPUs the controller gave this group.
    pub gpu_uuids: Vec<String>,
}

/// Everything loadgen needs to run one job against a serving engine.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadRun {
    pub job: LoadJob,
    pub base_url: String,
    pub model: String,
    pub ingest_url: String,
    /// The ShareGPT file on disk, for ShareGPT jobs.
    pub dataset_path: Option<PathBuf>,
}

impl From<&pb::AttemptRef> for Attempt {
    fn from(a: &pb::AttemptRef) -> Self {
        Attempt { run_id: a.run_id.clone(), job: a.job, attempt: a.attempt }
    }
}

impl From<&Attempt> for pb::AttemptRef {
    fn from(a: &Attempt) -> Self {
        pb::AttemptRef { run_id: a.run_id.clone(), job: a.job, attempt: a.attempt }
    }
}

impl TryFrom<pb::AssignGroup> for GroupAssignment {
    type Error = String;

    fn try_from(g: pb::AssignGroup) -> Result<Self, String> {
        let engine = g.engine.ok_or("assignment without an engine")?;
        let jobs = g
            .jobs
            .into_iter()
            .map(|j| {
                let attempt = j.attempt.as_ref().map(Attempt::from).ok_or("job without an attempt")?;
                let load = j.load.ok_or("job without a load profile")?;
                let dataset = match load.dataset.ok_or("job without a dataset")? {
                    pb::load_profile::Dataset::Random(r) => LoadDataset::Random {
                        input_tokens: r.input_tokens,
                        output_tokens: r.output_tokens,
                        seed: r.seed,
                    },
                    pb::load_profile::Dataset::Sharegpt(s) => LoadDataset::ShareGpt {
                        name: s.name,
                        sha256: s.sha256,
                        content: s.content,
                        output_tokens: (s.output_tokens != 0).then_some(s.output_tokens),
                    },
                };
                Ok(LoadJob {
                    attempt,
                    profile: j.profile,
                    repeat: j.repeat,
                    endpoint: load.endpoint,
                    rate: (load.rate > 0.0).then_some(load.rate),
                    arrival: load.arrival,
                    requests: load.requests,
                    max_concurrency: (load.max_concurrency != 0).then_some(u64::from(load.max_concurrency)),
                    seed: load.seed,
                    dataset,
                })
            })
            .collect::<Result<Vec<_>, &str>>()?;
        Ok(GroupAssignment {
            run_id: g.run_id,
            group: g.group,
            engine: EngineLaunch {
                kind: engine.kind,
                model: engine.model,
                image: engine.image,
                args: engine.args,
                runtime: engine.runtime,
                url: (!engine.url.is_empty()).then_some(engine.url),
                config_name: engine.config_name,
                instance_name: String::new(),
                labels: Vec::new(),
                gpu_uuids: Vec::new(),
            },
            jobs,
            ingest_url: g.ingest_url,
            gpu_uuids: g.gpu_uuids,
        })
    }
}
