//! What the controller asks an agent to do and what the agent tells it back,
//! as domain types, and the one place they cross to and from their gRPC
//! form.

use std::path::PathBuf;

use benchfleet_proto as pb;

use benchfleet_core::load::{LoadSpec, LoadTarget, ReportTo};
use benchfleet_core::telemetry::Telemetry;

use crate::gpu::GpuInfo;

/// Identifies one attempt of one job, and the lease epoch it was granted
/// under.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    pub run_id: String,
    pub job: u64,
    pub attempt: u32,
    pub epoch: u64,
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
    /// A job may run with a warm prefix cache when the engine's cannot be
    /// emptied; otherwise it fails.
    pub allow_warm_cache: bool,
}

/// One job: the traffic loadgen sends to the engine, and the attempt it is.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadJob {
    pub attempt: Attempt,
    pub profile: String,
    pub repeat: u32,
    pub load: LoadSpec,
    /// Under TLS, the attempt's ingest credential: loadgen gets it in its
    /// environment (`BENCHFLEET_INGEST_TOKEN`), never on its command line.
    pub ingest_token: Option<crate::docker::Secret>,
}

/// A group of jobs on one engine, in the order they run.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupAssignment {
    pub run_id: String,
    pub group: u64,
    /// The lease epoch of the assignment.
    pub epoch: u64,
    pub engine: EngineLaunch,
    pub jobs: Vec<LoadJob>,
    /// Where loadgen streams its records.
    pub ingest_url: String,
    /// The GPUs the controller gave this group.
    pub gpu_uuids: Vec<String>,
}

impl GroupAssignment {
    pub fn key(&self) -> GroupKey {
        (self.run_id.clone(), self.group)
    }
}

/// A group, as (run, group).
pub type GroupKey = (String, u64);

/// Everything loadgen needs to run one job against a serving engine: the
/// job, and what its command line adds to its load (the engine, the files
/// fetched, the ingest service and the attempt's fence).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadRun {
    pub job: LoadJob,
    pub target: LoadTarget,
}

/// What loadgen holds to reach the ingest service: the fleet's CA (a file:
/// loadgen is another process) and whether plain text may go to another
/// host, as the agent's own session.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReportTls {
    pub ca: Option<PathBuf>,
    pub insecure: bool,
}

impl ReportTls {
    /// Where loadgen streams an attempt's records: `url`, under this rule.
    pub fn report_to(&self, url: &str, attempt: &Attempt) -> ReportTo {
        ReportTo {
            url: url.to_owned(),
            run_id: attempt.run_id.clone(),
            job: attempt.job,
            attempt: attempt.attempt,
            epoch: attempt.epoch,
            ca: self.ca.clone(),
            insecure: self.insecure,
        }
    }
}

/// A job's state as the agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    StartingEngine,
    Running,
    Succeeded,
    Failed(Failure),
}

/// Whose fault a failed attempt is (see the proto's `FailureKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The attempt's own: run again elsewhere, up to the cap.
    Attempt,
    /// The configuration's: never run again.
    Config,
    /// The host's or the agent's: run again, not counted.
    Host,
}

/// One report on one attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct JobReport {
    pub attempt: Attempt,
    pub state: Reported,
    pub error: String,
    pub log_tail: String,
    pub engine_startup_s: Option<f64>,
    pub pull_progress: String,
    pub gpus: Vec<GpuInfo>,
    /// How the job's prefix cache was made cold ("cold: ..."), or why it may
    /// be warm ("warm: ..."); empty when not said.
    pub prefix_cache: String,
    /// The engine's version as its own endpoint says it, and its image's
    /// digest (Docker): set once it serves.
    pub engine_version: Option<String>,
    pub image_digest: Option<String>,
    /// loadgen's command line as the agent ran it, and its version: set in
    /// the final report of a job loadgen ran for.
    pub loadgen_args: Vec<String>,
    pub loadgen_version: Option<String>,
    /// The engine's `/metrics` and the GPUs' readings during the job.
    pub telemetry: Option<Box<Telemetry>>,
}

impl JobReport {
    pub fn new(attempt: &Attempt, state: Reported) -> JobReport {
        JobReport {
            attempt: attempt.clone(),
            state,
            error: String::new(),
            log_tail: String::new(),
            engine_startup_s: None,
            pull_progress: String::new(),
            gpus: Vec::new(),
            prefix_cache: String::new(),
            engine_version: None,
            image_digest: None,
            loadgen_args: Vec::new(),
            loadgen_version: None,
            telemetry: None,
        }
    }

    pub fn failed(attempt: &Attempt, failure: Failure, error: impl Into<String>) -> JobReport {
        JobReport { error: error.into(), ..JobReport::new(attempt, Reported::Failed(failure)) }
    }
}

impl From<&pb::AttemptRef> for Attempt {
    fn from(a: &pb::AttemptRef) -> Self {
        Attempt { run_id: a.run_id.clone(), job: a.job, attempt: a.attempt, epoch: a.epoch }
    }
}

impl From<&Attempt> for pb::AttemptRef {
    fn from(a: &Attempt) -> Self {
        pb::AttemptRef { run_id: a.run_id.clone(), job: a.job, attempt: a.attempt, epoch: a.epoch }
    }
}

/// A GPU as the controller stores it: inventory, verdict and fingerprint.
pub fn gpu_message(g: &GpuInfo) -> pb::Gpu {
    pb::Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory_total_bytes: g.memory_total_bytes,
        usable: g.usable(),
        reasons: g.reasons.clone(),
        serial: g.serial.clone().unwrap_or_default(),
        driver_version: g.driver_version.clone(),
        cuda_driver_version: g.cuda_driver_version.clone(),
        memory_used_bytes: g.memory_used_bytes.unwrap_or_default(),
        sm_clock_max_mhz: g.sm_clock_max_mhz.unwrap_or_default(),
        memory_clock_max_mhz: g.memory_clock_max_mhz.unwrap_or_default(),
        power_limit_w: g.power_limit_w.unwrap_or_default(),
        pcie_gen_max: g.pcie_gen_max.unwrap_or_default(),
        pcie_width_max: g.pcie_width_max.unwrap_or_default(),
        pcie_width: g.pcie_width.unwrap_or_default(),
        mig_enabled: g.mig_enabled.unwrap_or_default(),
        ecc_enabled: g.ecc_enabled.unwrap_or_default(),
        ecc_uncorrectable_volatile: g.ecc_uncorrectable_volatile.unwrap_or_default(),
        ecc_uncorrectable_aggregate: g.ecc_uncorrectable_aggregate.unwrap_or_default(),
        temperature_c: g.temperature_c.unwrap_or_default(),
        fingerprint: g.fingerprint(),
    }
}

impl From<&JobReport> for pb::JobUpdate {
    fn from(r: &JobReport) -> Self {
        let (state, failure) = match r.state {
            Reported::StartingEngine => (pb::JobState::StartingEngine, pb::FailureKind::Attempt),
            Reported::Running => (pb::JobState::Running, pb::FailureKind::Attempt),
            Reported::Succeeded => (pb::JobState::Succeeded, pb::FailureKind::Attempt),
            Reported::Failed(f) => (
                pb::JobState::Failed,
                match f {
                    Failure::Attempt => pb::FailureKind::Attempt,
                    Failure::Config => pb::FailureKind::Config,
                    Failure::Host => pb::FailureKind::Host,
                },
            ),
        };
        pb::JobUpdate {
            attempt: Some((&r.attempt).into()),
            state: state as i32,
            error: r.error.clone(),
            log_tail: r.log_tail.clone(),
            engine_startup_s: r.engine_startup_s.unwrap_or(0.0),
            pull_progress: r.pull_progress.clone(),
            // The verdicts were given before the engine started; judged
            // now, the engine's own memory would read as a foreign process.
            gpu_fingerprint: r
                .gpus
                .iter()
                .map(|g| pb::Gpu { usable: true, reasons: Vec::new(), ..gpu_message(g) })
                .collect(),
            failure: failure as i32,
            prefix_cache: r.prefix_cache.clone(),
            engine_version: r.engine_version.clone().unwrap_or_default(),
            image_digest: r.image_digest.clone().unwrap_or_default(),
            loadgen_args: r.loadgen_args.clone(),
            loadgen_version: r.loadgen_version.clone().unwrap_or_default(),
            telemetry: r.telemetry.as_deref().map(pb::JobTelemetry::from),
        }
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
                Ok(LoadJob {
                    attempt,
                    profile: j.profile,
                    repeat: j.repeat,
                    load: LoadSpec::try_from(load).map_err(|e| e.to_string())?,
                    ingest_token: (!j.ingest_token.is_empty()).then(|| crate::docker::Secret::new(j.ingest_token)),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(GroupAssignment {
            run_id: g.run_id,
            group: g.group,
            epoch: g.epoch,
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
                allow_warm_cache: engine.allow_warm_cache,
            },
            jobs,
            ingest_url: g.ingest_url,
            gpu_uuids: g.gpu_uuids,
        })
    }
}

impl From<&GroupAssignment> for pb::GroupClaim {
    fn from(g: &GroupAssignment) -> Self {
        pb::GroupClaim {
            run_id: g.run_id.clone(),
            group: g.group,
            attempts: g.jobs.iter().map(|j| (&j.attempt).into()).collect(),
        }
    }
}
