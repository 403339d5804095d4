//! The one place where the controller's domain types cross to and from their
//! gRPC (prost) form.

use benchfleet_proto as pb;

use crate::model::{Arrival, AttemptKey, Dataset, Endpoint, EngineConfig, Job, Profile, Progress, Run, RunId};

pub fn engine_spec(config: &EngineConfig) -> pb::EngineSpec {
    pb::EngineSpec {
        kind: config.kind.as_str().to_owned(),
        model: config.model.clone(),
        image: config.image.clone(),
        args: config.args.clone(),
        runtime: config.runtime.as_str().to_owned(),
        url: config.url.clone().unwrap_or_default(),
        config_name: config.name.clone(),
    }
}

/// The load profile a job sends, with the dataset file's content when the
/// profile reads one.
pub fn load_profile(profile: &Profile, file: Option<Vec<u8>>) -> pb::LoadProfile {
    let dataset = match &profile.dataset {
        Dataset::Random { input_tokens, output_tokens, seed } => pb::load_profile::Dataset::Random(pb::RandomDataset {
            input_tokens: *input_tokens,
            output_tokens: *output_tokens,
            seed: *seed,
        }),
        Dataset::Sharegpt { file: name, sha256, output_tokens } => {
            pb::load_profile::Dataset::Sharegpt(pb::ShareGptDataset {
                name: name.clone(),
                sha256: sha256.clone(),
                content: file.unwrap_or_default(),
                output_tokens: output_tokens.unwrap_or(0),
            })
        }
    };
    pb::LoadProfile {
        rate: profile.rate.unwrap_or(0.0),
        max_concurrency: profile.max_concurrency.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        requests: profile.requests,
        dataset: Some(dataset),
        arrival: match profile.arrival {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
        }
        .to_owned(),
        seed: profile.seed,
        endpoint: match profile.endpoint {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
        .to_owned(),
    }
}

pub fn attempt_ref(job: &Job) -> pb::AttemptRef {
    pb::AttemptRef { run_id: job.run.to_string(), job: job.id, attempt: job.attempt }
}

pub fn attempt_key(a: &pb::AttemptRef) -> Result<AttemptKey, tonic::Status> {
    Ok(AttemptKey { run: run_id(&a.run_id)?, job: a.job, attempt: a.attempt })
}

pub fn run_id(s: &str) -> Result<RunId, tonic::Status> {
    s.parse().map_err(tonic::Status::invalid_argument)
}

pub fn run_info(run: &Run, jobs: &[Job]) -> pb::RunInfo {
    let p = Progress::of(jobs);
    let state = if !run.finished {
        "running"
    } else if p.failed > 0 {
        "finished with failures"
    } else {
        "finished"
    };
    pb::RunInfo {
        run_id: run.id.to_string(),
        name: run.name.clone(),
        state: state.to_owned(),
        jobs_total: p.total,
        jobs_done: p.done(),
        jobs_failed: p.failed,
        created_unix_ms: run.created_unix_ms,
    }
}
