//! Running one engine group: check its GPUs, start the engine once, wait
//! until it serves, run loadgen for each job in order (with a prefix cache
//! reset between jobs, a GPU error check around each, and the job's
//! telemetry sampled while loadgen runs), and stop the engine. Every step can be stopped (`Stop`): the engine and loadgen are
//! then stopped and awaited here, never left to `Drop`, and the jobs not
//! run are reported as given up.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use benchfleet_core::load::LoadTarget;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::engine::{Engine, EngineError, EngineRuntime, wait_until_serving};
use crate::gpu::{GpuInfo, GpuProbe};
use crate::job::{Attempt, EngineLaunch, Failure, GroupAssignment, JobReport, LoadJob, LoadRun, Reported};
use crate::load::LoadRunner;
use crate::telemetry::{Sampling, Sources};
use crate::verdict::{hardware_changes, new_errors, new_xids};

/// Where a group's reports go (the session keeps the latest of each attempt
/// and forwards it to the controller).
pub trait Reports: Send + Sync {
    fn report(&self, report: JobReport);
}

/// Dataset and tokenizer files by their hash, fetched from the controller
/// into the agent's cache.
#[tonic::async_trait]
pub trait Files: Send + Sync {
    async fn fetch(&self, sha256: &str, name: &str) -> anyhow::Result<PathBuf>;
}

/// Why and how a group is being stopped.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    token: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    /// Stops the group; the first reason given is the one reported.
    pub fn stop(&self, reason: impl Into<String>) {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| reason.into());
        self.token.cancel();
    }

    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn stopped(&self) {
        self.token.cancelled().await;
    }

    /// The token loadgen's runner watches.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn reason(&self) -> String {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_else(|| "stopped".to_owned())
    }
}

/// What a group needs from its agent.
#[derive(Clone)]
pub struct GroupContext {
    pub agent_name: String,
    pub gpus: Arc<dyn GpuProbe>,
    pub runtimes: HashMap<String, Arc<dyn EngineRuntime>>,
    pub loadgen: Arc<dyn LoadRunner>,
    pub files: Arc<dyn Files>,
    pub startup_timeout: Duration,
    /// How loadgen reaches the ingest service.
    pub report: crate::job::ReportTls,
}

/// Runs a group to its end (or until `stop`); the engine is stopped when
/// this returns.
pub async fn run_group(ctx: &GroupContext, mut group: GroupAssignment, out: &dyn Reports, stop: &Stop) {
    info!(run = %group.run_id, group = group.group, config = %group.engine.config_name, "starting engine group");
    let Some(first) = group.jobs.first().cloned() else { return };
    let give_up = |from: usize, failure: Failure, error: &str, log_tail: &str| {
        for job in &group.jobs[from..] {
            out.report(JobReport { log_tail: log_tail.to_owned(), ..JobReport::failed(&job.attempt, failure, error) });
        }
    };
    out.report(JobReport::new(&first.attempt, Reported::StartingEngine));
    if let Err(error) = check_gpus(ctx, &group.gpu_uuids).await {
        warn!(config = %group.engine.config_name, "{error}");
        give_up(0, Failure::Host, &error, "");
        return;
    }
    name_engine(ctx, &mut group.engine, &group.gpu_uuids, &first.attempt);
    let (mut engine, serving) = match bring_up(ctx, &group.engine, &first.attempt, out, stop).await {
        Ok(up) => up,
        Err((failure, error, tail)) => {
            give_up(0, failure, &error, &tail);
            return;
        }
    };
    // Which jobs have had their final report: on a stop, the rest get one.
    let mut ended = vec![false; group.jobs.len()];
    for (i, job) in group.jobs.iter().enumerate() {
        if stop.is_stopped() {
            break;
        }
        let Some(report) = run_job(ctx, &group, (i, job), (engine.as_mut(), &serving), out, stop).await else {
            break;
        };
        ended[i] = true;
        out.report(report);
    }
    engine.stop().await;
    if stop.is_stopped() {
        let reason = stop.reason();
        for (job, _) in group.jobs.iter().zip(&ended).filter(|(_, done)| !**done) {
            out.report(JobReport::failed(&job.attempt, Failure::Host, reason.clone()));
        }
    }
}

/// The GPUs are checked again right before the engine starts: one that
/// failed since registration must not produce a number.
async fn check_gpus(ctx: &GroupContext, assigned: &[String]) -> Result<(), String> {
    let unusable: Vec<String> = match probe(&ctx.gpus).await {
        Ok(gpus) => assigned
            .iter()
            .filter_map(|uuid| match gpus.iter().find(|g| &g.uuid == uuid) {
                None => Some(format!("GPU {uuid} is gone")),
                Some(g) if !g.usable() => Some(format!("GPU {uuid}: {}", g.reasons.join("; "))),
                Some(_) => None,
            })
            .collect(),
        Err(e) => vec![format!("cannot read the GPUs: {e:#}")],
    };
    if unusable.is_empty() {
        return Ok(());
    }
    Err(format!("GPU check before engine start failed: {}", unusable.join("; ")))
}

/// The engine's instance name, labels and GPUs, from its first attempt.
fn name_engine(ctx: &GroupContext, engine: &mut EngineLaunch, gpu_uuids: &[String], first: &Attempt) {
    engine.instance_name = format!("benchfleet-{}-{}-{}", first.run_id, first.job, first.attempt);
    engine.labels = vec![
        ("benchfleet.run".into(), first.run_id.clone()),
        ("benchfleet.job".into(), first.job.to_string()),
        ("benchfleet.attempt".into(), first.attempt.to_string()),
        ("benchfleet.agent".into(), ctx.agent_name.clone()),
    ];
    engine.gpu_uuids = gpu_uuids.to_vec();
}

/// A serving engine's facts, which every result of the group carries.
struct Serving {
    http: reqwest::Client,
    startup: Duration,
    engine_version: Option<String>,
    image_digest: Option<String>,
}

/// Starts the engine and waits until it serves; on any failure (a stop
/// included) the engine is stopped, and the failure, its error and the
/// engine's log tail are returned for every job.
async fn bring_up(
    ctx: &GroupContext,
    launch: &EngineLaunch,
    first: &Attempt,
    out: &dyn Reports,
    stop: &Stop,
) -> Result<(Box<dyn Engine>, Serving), (Failure, String, String)> {
    let Some(runtime) = ctx.runtimes.get(&launch.runtime) else {
        let error = format!(
            "runtime `{}` is not available on agent {}: {}",
            launch.runtime,
            ctx.agent_name,
            crate::policy::not_offered(&launch.runtime)
        );
        return Err((Failure::Host, error, String::new()));
    };
    let started = tokio::select! {
        () = stop.stopped() => return Err((Failure::Host, stop.reason(), String::new())),
        r = start_engine(runtime.as_ref(), launch, first, out) => r,
    };
    let mut engine = match started {
        Ok(engine) => engine,
        Err(e) => {
            warn!(config = %launch.config_name, "engine did not start: {e}");
            return Err((failure_of(&e), format!("engine did not start: {e}"), String::new()));
        }
    };
    // From here the engine exists: every way out stops it first.
    let waited = tokio::select! {
        () = stop.stopped() => None,
        r = wait_until_serving(engine.as_mut(), &launch.model, ctx.startup_timeout) => Some(r),
    };
    let startup = match waited {
        None => {
            engine.stop().await;
            return Err((Failure::Host, stop.reason(), String::new()));
        }
        Some(Err(e)) => {
            let tail = engine.log_tail();
            engine.stop().await;
            warn!(config = %launch.config_name, "engine did not start: {e}");
            return Err((failure_of(&e), format!("engine did not start: {e}"), tail));
        }
        Some(Ok(took)) => took,
    };
    info!(config = %launch.config_name, "engine serving after {:.1} s", startup.as_secs_f64());
    let http = reqwest::Client::new();
    let engine_version = crate::engine::engine_version(&http, &engine.base_url(), &launch.kind).await;
    let image_digest = engine.image_digest();
    Ok((engine, Serving { http, startup, engine_version, image_digest }))
}

/// Runs the group's `i`th job on the serving engine: its final report, or
/// `None` when the group was stopped during it.
async fn run_job(
    ctx: &GroupContext,
    group: &GroupAssignment,
    (i, job): (usize, &LoadJob),
    (engine, serving): (&mut dyn Engine, &Serving),
    out: &dyn Reports,
    stop: &Stop,
) -> Option<JobReport> {
    // Taken first: an XID from here on (the cache reset included) is
    // during this job's attempt.
    let xid_mark = ctx.gpus.xid_mark();
    if let Some(status) = engine.exit_status() {
        let error = format!("the engine exited ({status}) before this job");
        return Some(JobReport {
            log_tail: engine.log_tail(),
            ..JobReport::failed(&job.attempt, Failure::Attempt, error)
        });
    }
    let prefix_cache = match empty_prefix_cache(&group.engine, engine.base_url(), i, &serving.http).await {
        Ok(how) => how,
        Err(error) => return Some(JobReport::failed(&job.attempt, Failure::Config, error)),
    };
    // Read right before the job: its fingerprint goes with the result, and
    // its error counts are the baseline the job is checked against.
    let before = probe(&ctx.gpus).await.inspect_err(|e| warn!("cannot read the GPUs before the job: {e:#}")).ok();
    let uuids = attempt_gpus(before.as_deref().unwrap_or_default(), &group.gpu_uuids);
    out.report(JobReport {
        engine_startup_s: Some(serving.startup.as_secs_f64()),
        prefix_cache,
        gpus: before.iter().flatten().filter(|g| uuids.contains(&g.uuid)).cloned().collect(),
        engine_version: serving.engine_version.clone(),
        image_digest: serving.image_digest.clone(),
        ..JobReport::new(&job.attempt, Reported::Running)
    });
    let [dataset_path, processor_path] = match fetch_files(ctx, job, stop).await {
        _ if stop.is_stopped() => return None,
        Ok(paths) => paths,
        Err(error) => return Some(JobReport::failed(&job.attempt, Failure::Attempt, error)),
    };
    let run = LoadRun {
        job: job.clone(),
        target: LoadTarget {
            base_url: engine.base_url(),
            model: group.engine.model.clone(),
            dataset_path,
            processor_path,
            report: Some(ctx.report.report_to(&group.ingest_url, &job.attempt)),
            // Progress would only crowd loadgen's log tail out.
            quiet: true,
            outcome_file: ctx.loadgen.outcome_file(&job.attempt),
        },
    };
    let loadgen_args = crate::load::loadgen_args(&run);
    let loadgen_version = ctx.loadgen.version().await;
    // The engine's /metrics and the GPUs, sampled for as long as loadgen runs.
    let sources = Sources {
        http: serving.http.clone(),
        base_url: engine.base_url(),
        kind: group.engine.kind.clone(),
        gpus: ctx.gpus.clone(),
        uuids: uuids.clone(),
    };
    let sampling = CancellationToken::new();
    let telemetry = tokio::spawn(crate::telemetry::record(sources, Sampling::default(), sampling.clone()));
    // The runner stops loadgen itself when `stop` fires, and waits for it.
    let result = ctx.loadgen.run(&run, stop.token()).await;
    sampling.cancel();
    let mut telemetry = telemetry.await.inspect_err(|e| warn!("the job's telemetry was lost: {e}")).ok();
    if stop.is_stopped() {
        return None;
    }
    let after = gpus_after_job(&ctx.gpus, before.as_deref(), xid_mark, &uuids).await;
    if let Some(t) = telemetry.as_mut() {
        t.summary.hardware_notes = after.notes;
    }
    // What the final report of a job loadgen ran for carries.
    let ran = |report: JobReport| JobReport {
        engine_version: serving.engine_version.clone(),
        image_digest: serving.image_digest.clone(),
        loadgen_args,
        loadgen_version,
        telemetry: telemetry.map(Box::new),
        ..report
    };
    // A GPU error during the attempt makes its numbers worthless, whatever
    // loadgen says.
    if let Some(error) = after.error {
        warn!(job = job.attempt.job, "{error}");
        return Some(ran(JobReport::failed(&job.attempt, Failure::Host, error)));
    }
    let mut exited = engine.exit_status();
    if result.is_err() && exited.is_none() {
        // A load that failed because the engine died may fail before the
        // death is seen (a refused connection comes before the container's
        // exit event): the engine's fault, if it is, is told as such.
        for _ in 0..ENGINE_EXIT_POLLS {
            tokio::time::sleep(Duration::from_millis(50)).await;
            exited = engine.exit_status();
            if exited.is_some() {
                break;
            }
        }
    }
    let report = match (result, exited) {
        // Numbers measured against an engine that died are no result.
        (Ok(()), Some(status)) => JobReport {
            log_tail: engine.log_tail(),
            ..JobReport::failed(&job.attempt, Failure::Attempt, format!("the engine exited ({status}) during the job"))
        },
        (Ok(()), None) => JobReport::new(&job.attempt, Reported::Succeeded),
        (Err(e), exited) => {
            warn!(job = job.attempt.job, "job failed: {e}");
            // The engine's log when it died, else loadgen's.
            let (error, tail) = match &exited {
                Some(status) => (format!("the engine exited ({status}) during the job: {e}"), engine.log_tail()),
                None => (e.to_string(), e.log_tail().to_owned()),
            };
            JobReport { log_tail: tail, ..JobReport::failed(&job.attempt, Failure::Attempt, error) }
        }
    };
    Some(ran(report))
}

/// Each job starts with an empty prefix cache: the first on a fresh engine,
/// each later one after the engine's own reset. How it was emptied, or the
/// configuration's error when it cannot be and warm runs are not allowed.
async fn empty_prefix_cache(
    launch: &EngineLaunch,
    base_url: String,
    i: usize,
    http: &reqwest::Client,
) -> Result<String, String> {
    if i == 0 {
        return Ok("cold: a freshly started engine".to_owned());
    }
    let path = crate::engine::cache_reset_path(&launch.kind);
    let failed = match http.post(format!("{base_url}{path}")).send().await {
        Ok(r) if r.status().is_success() => None,
        Ok(r) => Some(format!("POST {path} answered {}", r.status())),
        Err(e) => Some(format!("POST {path} failed: {e}")),
    };
    match failed {
        None => Ok(format!("cold: POST {path} before the job")),
        Some(why) if launch.allow_warm_cache => {
            warn!("the prefix cache may be warm: {why}");
            Ok(format!("warm: the cache could not be emptied ({why}); the matrix allows warm runs"))
        }
        Some(why) => Err(format!(
            "cannot empty the engine's prefix cache before the job: {why} \
             (allow_warm_cache: true in the matrix runs it warm instead)"
        )),
    }
}

/// The files the job names (its ShareGPT file or trace, its tokenizer), fetched by
/// their hashes: their paths, or what could not be fetched. A stop ends the
/// fetching early (the caller looks at `stop`).
async fn fetch_files(ctx: &GroupContext, job: &LoadJob, stop: &Stop) -> Result<[Option<PathBuf>; 2], String> {
    let dataset = job.load.dataset.file().map(|(file, sha256)| (file, sha256, "dataset"));
    let processor = job.load.processor.as_ref().map(|f| (f.file.as_str(), f.sha256.as_str(), "tokenizer"));
    let mut paths = [None, None];
    for (slot, (name, sha256, what)) in paths.iter_mut().zip([dataset, processor]).filter_map(|(s, f)| Some((s, f?))) {
        let fetched = tokio::select! {
            () = stop.stopped() => break,
            r = ctx.files.fetch(sha256, name) => r,
        };
        *slot = Some(fetched.map_err(|e| format!("cannot fetch the {what} {name}: {e:#}"))?);
    }
    Ok(paths)
}

/// How many times (50 ms apart) a failed job looks for its engine's exit.
const ENGINE_EXIT_POLLS: u32 = 40;

/// A failed engine start: a flag the engine rejects fails everywhere, and
/// what the agent's policy refuses is not tried on other hosts.
fn failure_of(e: &EngineError) -> Failure {
    match e {
        EngineError::BadFlag { .. } | EngineError::NotAllowed { .. } => Failure::Config,
        EngineError::Unsupported(_) => Failure::Host,
        _ => Failure::Attempt,
    }
}

/// Prepares the runtime (a container image pull), reporting its progress
/// with STARTING_ENGINE reports, then starts the engine.
async fn start_engine(
    runtime: &dyn EngineRuntime,
    launch: &EngineLaunch,
    attempt: &Attempt,
    out: &dyn Reports,
) -> Result<Box<dyn Engine>, EngineError> {
    let progress = |line: String| {
        info!(config = %launch.config_name, "{line}");
        out.report(JobReport { pull_progress: line, ..JobReport::new(attempt, Reported::StartingEngine) });
    };
    runtime.prepare(launch, &progress).await?;
    runtime.start(launch).await
}

/// Probes the GPUs off the async threads: NVML calls block, at times for
/// long (a GPU that fell off the bus).
pub async fn probe(gpus: &Arc<dyn GpuProbe>) -> anyhow::Result<Vec<GpuInfo>> {
    let gpus = gpus.clone();
    tokio::task::spawn_blocking(move || gpus.probe()).await?
}

/// The GPUs an attempt runs on: those the controller gave its group, or
/// every GPU of the host when it gave none.
fn attempt_gpus(gpus: &[GpuInfo], assigned: &[String]) -> Vec<String> {
    if assigned.is_empty() { gpus.iter().map(|g| g.uuid.clone()).collect() } else { assigned.to_vec() }
}

/// What the GPUs say of an attempt once it is over.
#[derive(Debug, Default, PartialEq)]
pub struct AfterJob {
    /// Why the attempt is invalid, if it is.
    pub error: Option<String>,
    /// What changed without invalidating it (`verdict::hardware_changes`).
    pub notes: Vec<String>,
}

/// The GPUs after an attempt: invalid with new uncorrectable ECC errors
/// since `before` (not compared when the GPUs could not be read before the
/// job) or XID events since `xid_mark`; noted with rows remapped, XIDs the
/// policy ignores and the like.
pub async fn gpus_after_job(
    gpus: &Arc<dyn GpuProbe>,
    before: Option<&[GpuInfo]>,
    xid_mark: u64,
    uuids: &[String],
) -> AfterJob {
    let (mut errors, mut notes) = match before {
        Some(before) => match probe(gpus).await {
            Ok(after) => (new_errors(before, &after, uuids), hardware_changes(before, &after, uuids)),
            // A GPU that cannot be read after the job may have failed during it.
            Err(e) => (vec![format!("cannot read the GPUs after the job: {e:#}")], Vec::new()),
        },
        None => (Vec::new(), Vec::new()),
    };
    errors.extend(new_xids(&gpus.xid_events_after(xid_mark), uuids));
    let ignored = new_xids(&gpus.xid_events_ignored_after(xid_mark), uuids);
    notes.extend(ignored.into_iter().map(|xid| format!("{xid} during the job, which the agent's policy ignores")));
    let error = (!errors.is_empty()).then(|| format!("attempt invalidated: {}", errors.join("; ")));
    AfterJob { error, notes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::XidEvent;

    /// GPUs whose inventory a test changes between probes, and a fixed XID
    /// log of which only the events after a mark are returned (apart: the
    /// XID numbers its policy ignores).
    struct Changing {
        gpus: Mutex<Vec<GpuInfo>>,
        xids: Vec<XidEvent>,
        ignored: Vec<u64>,
    }

    impl GpuProbe for Changing {
        fn probe(&self) -> anyhow::Result<Vec<GpuInfo>> {
            Ok(self.gpus.lock().expect("not poisoned").clone())
        }

        fn xid_mark(&self) -> u64 {
            1
        }

        fn xid_events_after(&self, mark: u64) -> Vec<XidEvent> {
            self.xids.iter().filter(|e| e.seq > mark && !self.ignored.contains(&e.xid)).cloned().collect()
        }

        fn xid_events_ignored_after(&self, mark: u64) -> Vec<XidEvent> {
            self.xids.iter().filter(|e| e.seq > mark && self.ignored.contains(&e.xid)).cloned().collect()
        }
    }

    /// A runtime that only counts what it is asked.
    #[derive(Default)]
    struct Untouched(std::sync::atomic::AtomicUsize);

    #[tonic::async_trait]
    impl EngineRuntime for Untouched {
        async fn prepare(&self, _: &EngineLaunch, _: &(dyn Fn(String) + Send + Sync)) -> Result<(), EngineError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        async fn start(&self, _: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(EngineError::Unsupported("untouched".into()))
        }
    }

    impl Reports for Mutex<Vec<JobReport>> {
        fn report(&self, report: JobReport) {
            self.lock().expect("not poisoned").push(report);
        }
    }

    #[tokio::test]
    async fn an_engine_the_policy_refuses_is_never_prepared_and_fails_as_the_configuration_s() {
        let untouched = Arc::new(Untouched::default());
        let policy = Arc::new(crate::policy::EnginePolicy::default());
        let runtimes = policy.offered([("docker".to_owned(), untouched.clone() as Arc<dyn EngineRuntime>)]);
        let launch = EngineLaunch {
            kind: "vllm".into(),
            model: "m".into(),
            image: "evil/miner:latest".into(),
            runtime: "docker".into(),
            ..EngineLaunch::default()
        };
        let reports = Mutex::new(Vec::new());
        let Err(e) = start_engine(runtimes["docker"].as_ref(), &launch, &Attempt::default(), &reports).await else {
            panic!("the image is refused");
        };
        assert_eq!(
            format!("engine did not start: {e}"),
            "engine did not start: image 'evil/miner:latest' is not allowed on this agent: \
             add it to [engines] images in the agent's config file"
        );
        assert_eq!(failure_of(&e), Failure::Config);
        assert_eq!(untouched.0.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was pulled or started");
        assert!(reports.lock().expect("not poisoned").is_empty(), "no pull progress either");
    }

    #[test]
    fn what_the_policy_refuses_is_the_configuration_s_fault() {
        let refused = EngineError::NotAllowed { what: "image 'x'".into(), allow: "add it".into() };
        assert_eq!(failure_of(&refused), Failure::Config, "not tried again on another host");
        assert_eq!(failure_of(&EngineError::Unsupported("x".into())), Failure::Host);
    }

    #[tokio::test]
    async fn rows_remapped_during_an_attempt_are_noted_without_invalidating_it() {
        use crate::gpu::RemappedRows;
        let gpu = |uuid: &str| GpuInfo {
            uuid: uuid.into(),
            remapped_rows: Some(RemappedRows::default()),
            ..GpuInfo::default()
        };
        let before = vec![gpu("GPU-0"), gpu("GPU-1")];
        let changing = Arc::new(Changing { gpus: Mutex::new(before.clone()), xids: Vec::new(), ignored: Vec::new() });
        {
            let mut now = changing.gpus.lock().expect("not poisoned");
            now[0].remapped_rows = Some(RemappedRows { corrected: 2, pending: true, ..RemappedRows::default() });
            // Another attempt's GPU: not this one's to note.
            now[1].remapped_rows = Some(RemappedRows { uncorrected: 1, ..RemappedRows::default() });
        }
        let probe: Arc<dyn GpuProbe> = changing.clone();
        let after = gpus_after_job(&probe, Some(&before), probe.xid_mark(), &["GPU-0".to_owned()]).await;
        assert_eq!(after.error, None);
        assert_eq!(
            after.notes,
            [
                "GPU GPU-0: 2 rows remapped for correctable errors during the job",
                "GPU GPU-0: a row remap is pending (applied at the next GPU reset)"
            ]
        );
    }

    #[tokio::test]
    async fn ecc_errors_and_xids_during_an_attempt_are_both_named() {
        let gpu = |uuid: &str| GpuInfo { uuid: uuid.into(), ecc_uncorrectable_volatile: Some(0), ..GpuInfo::default() };
        let xid = |seq, uuid: &str, xid| XidEvent { seq, uuid: uuid.into(), xid, at_unix_ms: 0 };
        let before = vec![gpu("GPU-0"), gpu("GPU-1")];
        let changing = Arc::new(Changing {
            gpus: Mutex::new(before.clone()),
            // Before the mark, and on a GPU of another attempt: neither counts.
            xids: vec![xid(1, "GPU-0", 13), xid(2, "GPU-1", 79), xid(3, "GPU-0", 79)],
            ignored: Vec::new(),
        });
        let probe: Arc<dyn GpuProbe> = changing.clone();
        let mark = probe.xid_mark();
        let attempt = ["GPU-0".to_owned()];
        assert_eq!(
            gpus_after_job(&probe, Some(&before), mark, &attempt).await.error.as_deref(),
            Some("attempt invalidated: XID 79 on GPU GPU-0")
        );
        changing.gpus.lock().expect("not poisoned")[0].ecc_uncorrectable_volatile = Some(2);
        assert_eq!(
            gpus_after_job(&probe, Some(&before), mark, &attempt).await.error.as_deref(),
            Some("attempt invalidated: new uncorrectable ECC errors on GPU GPU-0: 2; XID 79 on GPU GPU-0")
        );
        // Without a reading before the job, XIDs still count.
        assert_eq!(
            gpus_after_job(&probe, None, mark, &attempt).await.error.as_deref(),
            Some("attempt invalidated: XID 79 on GPU GPU-0")
        );
        changing.gpus.lock().expect("not poisoned")[0].ecc_uncorrectable_volatile = Some(0);
        assert_eq!(gpus_after_job(&probe, Some(&before), 3, &attempt).await.error, None, "nothing after this mark");
    }

    #[tokio::test]
    async fn an_xid_the_policy_ignores_is_noted_and_does_not_invalidate() {
        let xid = |seq, xid| XidEvent { seq, uuid: "GPU-0".into(), xid, at_unix_ms: 0 };
        let before = vec![GpuInfo { uuid: "GPU-0".into(), ..GpuInfo::default() }];
        let changing = Arc::new(Changing {
            gpus: Mutex::new(before.clone()),
            xids: vec![xid(2, 43), xid(3, 43), xid(4, 43)],
            ignored: vec![43],
        });
        let probe: Arc<dyn GpuProbe> = changing.clone();
        let after = gpus_after_job(&probe, Some(&before), probe.xid_mark(), &["GPU-0".to_owned()]).await;
        assert_eq!(after.error, None);
        assert_eq!(after.notes, ["XID 43 on GPU GPU-0 (3 times) during the job, which the agent's policy ignores"]);
        let other = gpus_after_job(&probe, Some(&before), probe.xid_mark(), &["GPU-1".to_owned()]).await;
        assert!(other.notes.is_empty(), "another attempt's GPU");
    }

    /// An engine that serves nothing and never exits.
    struct Idle;

    #[tonic::async_trait]
    impl Engine for Idle {
        fn base_url(&self) -> String {
            "http://127.0.0.1:9".into()
        }
        fn log_tail(&self) -> String {
            "the engine's own log".into()
        }
        fn exit_status(&mut self) -> Option<String> {
            None
        }
        async fn stop(self: Box<Self>) {}
    }

    struct NoFiles;

    #[tonic::async_trait]
    impl Files for NoFiles {
        async fn fetch(&self, _: &str, name: &str) -> anyhow::Result<PathBuf> {
            anyhow::bail!("no file {name} here")
        }
    }

    #[tokio::test]
    async fn loadgen_s_failure_reaches_the_job_s_report_in_its_own_words_with_its_stderr_as_the_log_tail() {
        // As the binary does: reqwest has no crypto provider of its own.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("tempdir");
        let outcome =
            r#"{"exit":"none_succeeded","code":4,"error":"all 3 requests failed (http_error 3); the first: http 500"}"#;
        let script = crate::load::tests::fake_loadgen(dir.path(), "loadgen", 4, Some(outcome));
        let runner = crate::load::ProcessLoadRunner::new(script, None, dir.path().join("outcomes"));
        let gpus: Arc<dyn GpuProbe> =
            Arc::new(Changing { gpus: Mutex::new(Vec::new()), xids: Vec::new(), ignored: Vec::new() });
        let ctx = GroupContext {
            agent_name: "a".into(),
            gpus,
            runtimes: HashMap::new(),
            loadgen: Arc::new(runner),
            files: Arc::new(NoFiles),
            startup_timeout: Duration::from_secs(1),
            report: crate::job::ReportTls::default(),
        };
        let attempt = Attempt { run_id: "7".into(), job: 1, attempt: 1, epoch: 1 };
        let job = LoadJob {
            attempt: attempt.clone(),
            profile: "p".into(),
            repeat: 0,
            load: benchfleet_core::load::LoadSpec::new(
                benchfleet_core::load::LoadDataset::Random { input_tokens: 4, output_tokens: 4, seed: 0 },
                3,
            ),
            ingest_token: None,
        };
        let group = GroupAssignment {
            run_id: "7".into(),
            group: 0,
            epoch: 1,
            engine: EngineLaunch { kind: "vllm".into(), model: "m".into(), ..EngineLaunch::default() },
            jobs: vec![job.clone()],
            ingest_url: "http://127.0.0.1:7070".into(),
            gpu_uuids: Vec::new(),
        };
        let serving =
            Serving { http: reqwest::Client::new(), startup: Duration::ZERO, engine_version: None, image_digest: None };
        let reports = Mutex::new(Vec::new());
        let mut engine = Idle;
        let mut report = None;
        for _ in 0..20 {
            let ran = run_job(&ctx, &group, (0, &job), (&mut engine, &serving), &reports, &Stop::new()).await;
            let ran = ran.expect("a final report");
            // The script was still open in a child another test forked
            // (ETXTBSY): again.
            if !ran.error.contains("os error 26") {
                report = Some(ran);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let report = report.expect("the fake loadgen ran");
        assert_eq!(report.state, Reported::Failed(Failure::Attempt));
        assert_eq!(
            report.error,
            "loadgen failed (exit status: 4): all 3 requests failed (http_error 3); the first: http 500"
        );
        assert_eq!(report.log_tail, "progress: 1/3 requests done\nerror: a line on stderr is not the verdict");
        let ran = &report.loadgen_args;
        assert!(ran.iter().any(|a| a == "--outcome-file"), "what loadgen ran with is what is reported: {ran:?}");
    }
}
