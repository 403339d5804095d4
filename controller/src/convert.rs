//! The one place where the controller's domain types cross to and from their
//! gRPC (prost) form.

use std::collections::BTreeMap;

use benchfleet_proto as pb;
use tonic::Status;

use crate::auth::IngestKey;
use crate::driver::{Outbound, Progress};
use crate::plan::Submission;
use crate::records::GpuState;
use crate::sched::{AgentView, Assignment, Claim, Fence, Hello, Reported, ToAgent, Update};
use crate::store::{RunCounts, Store, StoreError};
use benchfleet_study::model::{
    AgentId, AttemptKey, AttemptStats, EngineConfig, FailureKind, Group, Job, Progress as Counts, Run, RunId, RunState,
};

pub fn engine_spec(config: &EngineConfig) -> pb::EngineSpec {
    pb::EngineSpec {
        kind: config.kind.as_str().to_owned(),
        model: config.model.clone(),
        image: config.image.clone(),
        args: config.args.clone(),
        runtime: config.runtime.as_str().to_owned(),
        url: config.url.clone().unwrap_or_default(),
        config_name: config.name.clone(),
        allow_warm_cache: config.allow_warm_cache,
    }
}

pub fn attempt_ref(f: &Fence) -> pb::AttemptRef {
    pb::AttemptRef { run_id: f.key.run.to_string(), job: f.key.job, attempt: f.key.attempt, epoch: f.epoch }
}

pub fn fence(a: &pb::AttemptRef) -> Result<Fence, Status> {
    Ok(Fence { key: AttemptKey { run: run_id(&a.run_id)?, job: a.job, attempt: a.attempt }, epoch: a.epoch })
}

pub fn run_id(s: &str) -> Result<RunId, Status> {
    s.parse().map_err(Status::invalid_argument)
}

pub fn gpu_state(g: &pb::Gpu) -> GpuState {
    GpuState {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory_total_bytes: g.memory_total_bytes,
        usable: g.usable,
        reasons: g.reasons.clone(),
        driver_version: g.driver_version.clone(),
        cuda_driver_version: g.cuda_driver_version.clone(),
        fingerprint: g.fingerprint.clone(),
    }
}

pub fn gpu_message(g: &GpuState) -> pb::Gpu {
    pb::Gpu {
        index: g.index,
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        memory_total_bytes: g.memory_total_bytes,
        usable: g.usable,
        reasons: g.reasons.clone(),
        driver_version: g.driver_version.clone(),
        cuda_driver_version: g.cuda_driver_version.clone(),
        fingerprint: g.fingerprint.clone(),
        ..Default::default()
    }
}

pub fn hello(h: pb::Hello, peer: String, certified: Option<AgentId>) -> Result<Hello, Status> {
    let claims = h
        .running
        .iter()
        .map(|c| {
            Ok(Claim {
                run: run_id(&c.run_id)?,
                group: c.group,
                attempts: c.attempts.iter().map(fence).collect::<Result<_, Status>>()?,
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    let price = match h.gpu_hour_price {
        None => None,
        Some(p) => {
            let currency = if h.gpu_hour_currency.is_empty() { "USD" } else { h.gpu_hour_currency.as_str() };
            let price = benchfleet_core::cost::Price::checked(p, currency, false)
                .map_err(|e| Status::invalid_argument(format!("the agent's GPU-hour price: {e}")))?;
            Some(price)
        }
    };
    Ok(Hello {
        price,
        name: h.name,
        hostname: h.hostname,
        version: h.version,
        instance: h.instance,
        gpus: h.gpus.iter().map(gpu_state).collect(),
        runtimes: h.runtimes,
        claims,
        leaving: h.leaving,
        peer,
        certified,
    })
}

pub fn update(u: pb::JobUpdate) -> Result<Update, Status> {
    let fence = fence(u.attempt.as_ref().ok_or_else(|| Status::invalid_argument("job update without an attempt"))?)?;
    let state = match pb::JobState::try_from(u.state) {
        Ok(pb::JobState::StartingEngine) => Reported::StartingEngine,
        Ok(pb::JobState::Running) => Reported::Running,
        Ok(pb::JobState::Succeeded) => Reported::Succeeded,
        Ok(pb::JobState::Failed) => Reported::Failed(match pb::FailureKind::try_from(u.failure) {
            Ok(pb::FailureKind::Config) => FailureKind::Config,
            Ok(pb::FailureKind::Host) => FailureKind::Host,
            _ => FailureKind::Attempt,
        }),
        _ => return Err(Status::invalid_argument(format!("unexpected job state {}", u.state))),
    };
    let text = |s: String| (!s.is_empty()).then_some(s);
    Ok(Update {
        fence,
        state,
        error: text(u.error),
        log_tail: text(u.log_tail),
        engine_startup_s: (u.engine_startup_s > 0.0).then_some(u.engine_startup_s),
        gpu_fingerprint: u.gpu_fingerprint.into_iter().map(|g| g.fingerprint).collect(),
        pull_progress: text(u.pull_progress),
        prefix_cache: text(u.prefix_cache),
        engine_version: text(u.engine_version),
        image_digest: text(u.image_digest),
        loadgen_args: u.loadgen_args,
        loadgen_version: text(u.loadgen_version),
        telemetry: u.telemetry.map(|t| Box::new(benchfleet_core::telemetry::Telemetry::from(t))),
    })
}

fn assignment(a: &Assignment, ingest_url: &str, key: Option<&IngestKey>) -> pb::AssignGroup {
    pb::AssignGroup {
        run_id: a.run.to_string(),
        group: a.group,
        engine: Some(engine_spec(&a.config)),
        jobs: a
            .jobs
            .iter()
            .map(|j| pb::JobSpec {
                attempt: Some(attempt_ref(&j.fence)),
                profile: j.profile.name.clone(),
                repeat: j.repeat,
                load: Some(pb::LoadProfile::from(&j.profile.load)),
                ingest_token: key.map_or_else(String::new, |k| {
                    let f = &j.fence;
                    k.sign(&f.key.run.to_string(), f.key.job, f.key.attempt, f.epoch)
                }),
            })
            .collect(),
        ingest_url: ingest_url.to_owned(),
        gpu_uuids: a.gpus.clone(),
        epoch: a.epoch,
    }
}

pub fn outbound(o: &Outbound, ingest_url: &str, key: Option<&IngestKey>) -> pb::ControllerMessage {
    use pb::controller_message::Msg;
    let msg = match o {
        Outbound::Welcome(w) => Msg::Welcome(pb::Welcome {
            agent_id: w.agent.to_string(),
            epoch: w.epoch,
            heartbeat_interval_ms: w.heartbeat_interval.as_millis().min(u128::from(u32::MAX)) as u32,
            lease_ttl_ms: w.lease_ttl.as_millis().min(u128::from(u32::MAX)) as u32,
            keep: w.keep.iter().map(|(run, group)| pb::GroupRef { run_id: run.to_string(), group: *group }).collect(),
        }),
        Outbound::Msg(ToAgent::Assign(a)) => Msg::AssignGroup(assignment(a, ingest_url, key)),
        Outbound::Msg(ToAgent::Cancel { run, group, reason }) => {
            Msg::CancelGroup(pb::CancelGroup { run_id: run.to_string(), group: *group, reason: reason.clone() })
        }
        Outbound::Msg(ToAgent::HeartbeatAck { seq }) => Msg::HeartbeatAck(pb::HeartbeatAck { seq: *seq }),
    };
    pb::ControllerMessage { msg: Some(msg) }
}

pub fn submission(r: pb::SubmitRunRequest) -> Submission {
    Submission {
        matrix_name: r.matrix_name,
        matrix_yaml: r.matrix_yaml,
        files: r.files.into_iter().collect::<BTreeMap<_, _>>(),
        runtime_override: r.runtime_override,
        fleet_per: r.fleet_per,
        fleet_hosts: r.fleet_hosts,
    }
}

pub fn run_state(run: &Run, counts: &Counts) -> &'static str {
    match run.state {
        RunState::Running => "running",
        RunState::Cancelled => "cancelled",
        RunState::Finished if counts.failed > 0 => "finished with failures",
        RunState::Finished => "finished",
    }
}

pub fn run_info<'a>(run: &Run, jobs: impl IntoIterator<Item = &'a Job>, stage: u32) -> pb::RunInfo {
    counted_run(run, &Counts::of(jobs), stage)
}

/// A run as a listing shows it, from the counts the store keeps.
pub fn listed_run(run: &Run, counts: &RunCounts) -> pb::RunInfo {
    counted_run(run, &counts.progress(), counts.stage())
}

/// `ListRuns` (and `benchfleet runs` on a local store): every run, from the
/// store's counts, reading no job.
pub fn run_list(store: &dyn Store) -> Result<Vec<pb::RunInfo>, StoreError> {
    Ok(store.listed_runs()?.iter().map(|(run, counts)| listed_run(run, counts)).collect())
}

fn counted_run(run: &Run, p: &Counts, stage: u32) -> pb::RunInfo {
    pb::RunInfo {
        run_id: run.id.to_string(),
        name: run.name.clone(),
        state: run_state(run, p).to_owned(),
        jobs_total: p.total,
        jobs_done: p.done(),
        jobs_failed: p.failed,
        created_unix_ms: run.created_unix_ms,
        jobs_cancelled: p.cancelled,
        jobs_succeeded: p.succeeded,
        note: run.note.as_ref().map(ToString::to_string).unwrap_or_default(),
        stage,
        ended_unix_ms: run.ended_unix_ms.unwrap_or(0),
        fleet_check: run.fleet.is_some(),
    }
}

/// What a delete removed, as the operator's client is told.
pub fn deleted(d: &crate::store::Deleted) -> pb::DeleteRunResponse {
    pb::DeleteRunResponse { jobs: d.jobs, records: d.records, files: d.files.clone() }
}

/// What an import stored, as the operator's client is told.
pub fn imported(i: &crate::export::Imported) -> pb::ImportRunResponse {
    pb::ImportRunResponse {
        run_id: i.run.to_string(),
        original_run_id: i.original.to_string(),
        groups: i.counts.groups,
        jobs: i.counts.jobs,
        records: i.counts.records,
        missing_files: i
            .missing_files
            .iter()
            .map(|(name, sha256)| pb::StoredFile { name: name.clone(), sha256: sha256.clone() })
            .collect(),
    }
}

pub fn progress(run: pb::RunInfo, p: &Progress) -> pb::RunProgress {
    pb::RunProgress {
        finished: run.state != "running",
        run: Some(run),
        jobs_by_state: p.by_state.iter().map(|(s, n)| (s.as_str().to_owned(), *n)).collect(),
        agents: p
            .agents
            .iter()
            .map(|(id, name, running, done)| pb::AgentProgress {
                agent_id: id.to_string(),
                name: name.clone(),
                running: *running,
                done: *done,
            })
            .collect(),
        waiting: p.waiting.clone(),
        eta_s: p.eta_s,
    }
}

pub fn agent_info(v: &AgentView) -> pb::AgentInfo {
    pb::AgentInfo {
        agent_id: v.rec.id.to_string(),
        name: v.rec.name.clone(),
        hostname: v.rec.hostname.clone(),
        connected: v.connected,
        gpus: v.rec.gpus.iter().map(gpu_message).collect(),
        state: v.liveness.as_str().to_owned(),
        lease_age_ms: v.lease_age.map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
        drained: v.rec.drain.is_some(),
        drain_note: v.rec.drain.as_ref().map(ToString::to_string).unwrap_or_default(),
        running: v.groups.iter().map(|(run, group)| pb::GroupRef { run_id: run.to_string(), group: *group }).collect(),
        version: v.rec.version.clone(),
        epoch: v.session.unwrap_or(v.rec.epoch),
        leaving: v.leaving,
        certificate_expires_unix_ms: v
            .rec
            .certificate
            .as_ref()
            .map_or(0, |c| u64::try_from(c.not_after_unix_ms).unwrap_or_default()),
        revoked_note: v
            .rec
            .certificate
            .as_ref()
            .and_then(|c| c.revoked.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default(),
    }
}

pub fn job_info(job: &Job, group: Option<&Group>, stats: &BTreeMap<AttemptKey, AttemptStats>) -> pb::JobInfo {
    pb::JobInfo {
        job: job.id,
        group: job.group,
        config: group.map(|g| g.config.name.clone()).unwrap_or_default(),
        profile: job.profile.name.clone(),
        repeat: job.repeat,
        state: job.state.as_str().to_owned(),
        agent_id: job.agent.map(|a: AgentId| a.to_string()).unwrap_or_default(),
        error: job.error.clone().unwrap_or_default(),
        stage: group.map_or(1, |g| g.stage),
        attempts: job
            .attempts
            .iter()
            .map(|a| {
                let s = stats
                    .get(&AttemptKey { run: job.run, job: job.id, attempt: a.number })
                    .copied()
                    .unwrap_or_default();
                pb::AttemptInfo {
                    attempt: a.number,
                    epoch: a.epoch,
                    agent_id: a.agent.to_string(),
                    agent_name: a.agent_name.clone(),
                    outcome: a.outcome.as_str().to_owned(),
                    reason: a.reason.clone().unwrap_or_default(),
                    started_unix_ms: a.started_unix_ms,
                    ended_unix_ms: a.ended_unix_ms.unwrap_or(0),
                    records_stored: if s.removed { 0 } else { s.records },
                    requests_sent: s.sent,
                    records_removed: s.removed,
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_s_gpu_hour_price_is_checked_and_its_currency_defaults_to_usd() {
        let said = |price: Option<f64>, currency: &str| {
            let h = pb::Hello {
                name: "gpu-01".into(),
                gpu_hour_price: price,
                gpu_hour_currency: currency.into(),
                ..pb::Hello::default()
            };
            hello(h, "127.0.0.1:1".into(), None)
        };
        assert_eq!(said(None, "").expect("no price").price, None);
        let usd = said(Some(2.5), "").expect("a price").price.expect("kept");
        assert_eq!((usd.gpu_hour, usd.currency.as_str()), (2.5, "USD"));
        assert_eq!(said(Some(0.0), "EUR").expect("free").price.map(|p| p.currency), Some("EUR".into()));
        for (price, currency) in [(-1.0, "USD"), (f64::NAN, "USD"), (1.0, "US$")] {
            let e = said(Some(price), currency).expect_err("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("the agent's GPU-hour price: "), "{}", e.message());
        }
    }
}
