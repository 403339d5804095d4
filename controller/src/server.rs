//! The controller: scheduling state, and the three gRPC services (agents,
//! ingest, operator) over it.
//!
//! The scheduling state lives in memory behind one lock that is never held
//! across an await; everything a restart must not lose is in the store. An
//! attempt is identified by (run, job, attempt): messages of any attempt but
//! the current one are ignored, so a job never counts twice.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use benchfleet_core::RequestRecord;
use benchfleet_proto as pb;
use futures_util::Stream;
use sha2::Digest;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::convert;
use crate::greedy::{self, Plan};
use crate::matrix::{self, Matrix, Strategy};
use crate::model::{AttemptKey, EngineConfig, Group, Job, JobState, Profile, Progress, Run, RunId, RuntimeKind};
use crate::report;
use crate::store::{Store, StoreError};

/// How often agents send heartbeats; three missed ones lose the lease.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
const MISSED_HEARTBEATS: u32 = 3;
/// Requests carry whole dataset files; a ShareGPT file of a few hundred MiB
/// must fit.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

type ServerStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        match e {
            StoreError::NotFound(what) => Status::not_found(format!("{what} not found")),
            other => Status::internal(other.to_string()),
        }
    }
}

/// What the controller needs to know at start.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The URL loadgen reaches the ingest service at, as agents see it.
    pub advertise_url: String,
}

pub struct Controller {
    store: Arc<dyn Store>,
    config: ControllerConfig,
    state: Mutex<State>,
    /// Held while deciding whether a run is over or its next greedy stage
    /// begins: two agents may end a stage's last jobs at once, and only one
    /// of them may add the next stage.
    planning: Mutex<()>,
    /// Bumped on every change a watcher may want to see.
    changed: watch::Sender<u64>,
}

/// A group running on an agent, and the GPUs it was given.
struct Placement {
    run: RunId,
    group: u64,
    gpus: Vec<String>,
}

impl AgentEntry {
    /// Usable GPUs of the wanted model that no running group holds.
    fn free_gpus(&self, model: Option<&str>) -> Vec<String> {
        self.gpus
            .iter()
            .filter(|g| g.usable)
            .filter(|g| model.is_none_or(|m| benchfleet_core::gpu::model_matches(&g.name, m)))
            .filter(|g| !self.running.iter().any(|p| p.gpus.contains(&g.uuid)))
            .map(|g| g.uuid.clone())
            .collect()
    }
}

#[derive(Default)]
struct State {
    agents: HashMap<String, AgentEntry>,
    /// Groups waiting for an agent, in submission order.
    queue: VecDeque<(RunId, u64)>,
    next_agent: u64,
}

struct AgentEntry {
    name: String,
    hostname: String,
    gpus: Vec<pb::Gpu>,
    runtimes: Vec<String>,
    /// Present while the agent holds its session.
    session: Option<mpsc::Sender<Result<pb::ControllerMessage, Status>>>,
    /// The groups the agent is running, each on its own GPUs.
    running: Vec<Placement>,
    /// Distinguishes this session from an earlier one of the same agent.
    epoch: u64,
}

impl Controller {
    /// Opens the controller over a store. Runs that were not finished when
    /// it last stopped are taken up again: their unfinished jobs are queued
    /// as new attempts once agents connect.
    pub fn new(store: Arc<dyn Store>, config: ControllerConfig) -> Result<Arc<Controller>, StoreError> {
        let controller = Arc::new(Controller {
            store,
            config,
            state: Mutex::new(State::default()),
            planning: Mutex::new(()),
            changed: watch::channel(0).0,
        });
        for run in controller.store.runs()?.into_iter().filter(|r| !r.finished) {
            let jobs = controller.store.jobs(run.id)?;
            for group in controller.store.groups(run.id)? {
                let unfinished = jobs.iter().any(|j| j.group == group.id && !j.state.is_terminal());
                if unfinished {
                    info!(run = %run.id, group = group.id, "taking up an unfinished group again");
                    controller.lock().queue.push_back((run.id, group.id));
                }
            }
            // The controller may have stopped between a stage's last job and
            // the next stage (or the run's end): decide now.
            if jobs.iter().all(|j| j.state.is_terminal())
                && let Err(e) = controller.finish_run_if_done(run.id)
            {
                warn!(run = %run.id, "cannot take up the run again: {}", e.message());
            }
        }
        Ok(controller)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the state is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Validates a matrix and stores the run with its jobs; nothing is stored
    /// when the matrix has an error.
    pub fn submit(&self, req: pb::SubmitRunRequest) -> Result<(RunId, u64), Status> {
        let hashes: HashMap<&str, String> =
            req.files.iter().map(|(path, content)| (path.as_str(), hex(&sha2::Sha256::digest(content)))).collect();
        let matrix = matrix::parse(&req.matrix_name, &req.matrix_yaml, &|path| hashes.get(path).cloned())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let runtime = match req.runtime_override.as_str() {
            "" => None,
            "process" => Some(RuntimeKind::Process),
            "docker" => Some(RuntimeKind::Docker),
            other => return Err(Status::invalid_argument(format!("unknown runtime override '{other}'"))),
        };
        for (path, content) in &req.files {
            if let Some(sha) = hashes.get(path.as_str()) {
                self.store.put_file(sha, content)?;
            }
        }

        let run = Run {
            id: self.store.next_run_id()?,
            name: matrix.name.clone(),
            matrix_file: req.matrix_name.clone(),
            matrix_yaml: req.matrix_yaml.clone(),
            created_unix_ms: unix_ms(),
            finished: false,
            files: hashes.iter().map(|(path, sha)| ((*path).to_owned(), sha.clone())).collect::<BTreeMap<_, _>>(),
            runtime_override: runtime,
        };
        let (configs, profiles, stage) = match matrix.strategy {
            Strategy::Grid => (matrix.configs.clone(), matrix.profiles.clone(), 1),
            // Later stages are planned when this one ends.
            Strategy::Greedy => match greedy::plan(&matrix, &greedy::Results::default()).plan {
                Plan::Next(s) => (s.configs, s.profiles, s.number),
                Plan::Done(o) => return Err(Status::invalid_argument(o.reason)),
            },
        };
        let (groups, jobs) = expand(&run, &matrix, &configs, &profiles, stage, (0, 0));
        self.store.create_run(&run, &groups, &jobs)?;
        info!(run = %run.id, name = %run.name, jobs = jobs.len(), "run submitted");
        self.lock().queue.extend(groups.iter().map(|g| (run.id, g.id)));
        self.dispatch();
        self.notify();
        Ok((run.id, jobs.len() as u64))
    }

    /// Hands queued groups to idle agents that can run them.
    fn dispatch(&self) {
        let mut state = self.lock();
        let mut waiting = VecDeque::new();
        while let Some((run, group_id)) = state.queue.pop_front() {
            let group = match self.store.groups(run).map(|gs| gs.into_iter().find(|g| g.id == group_id)) {
                Ok(Some(g)) => g,
                Ok(None) => continue,
                Err(e) => {
                    warn!(%run, group = group_id, "cannot read a queued group: {e}");
                    waiting.push_back((run, group_id));
                    continue;
                }
            };
            let runtime = group.config.runtime.as_str();
            let needed = group.gpus_per_job as usize;
            let agent = state.agents.iter_mut().find(|(_, a)| {
                a.session.is_some()
                    && a.runtimes.iter().any(|r| r == runtime)
                    && a.free_gpus(group.gpu.as_deref()).len() >= needed
            });
            let Some((agent_id, entry)) = agent else {
                waiting.push_back((run, group_id));
                continue;
            };
            let gpus: Vec<String> = entry.free_gpus(group.gpu.as_deref()).into_iter().take(needed).collect();
            match self.assignment(&group, agent_id, &gpus) {
                Ok(Some(msg)) => {
                    let sent = entry.session.as_ref().is_some_and(|s| {
                        s.try_send(Ok(pb::ControllerMessage {
                            msg: Some(pb::controller_message::Msg::AssignGroup(msg)),
                        }))
                        .is_ok()
                    });
                    if sent {
                        info!(%run, group = group_id, agent = %entry.name, ?gpus, "group assigned");
                        entry.running.push(Placement { run, group: group_id, gpus });
                    } else {
                        waiting.push_back((run, group_id));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(%run, group = group_id, "cannot assign a group: {e}");
                    waiting.push_back((run, group_id));
                }
            }
        }
        state.queue = waiting;
    }

    /// Starts a new attempt of each unfinished job of a group on an agent;
    /// `None` when nothing is left to run.
    fn assignment(
        &self,
        group: &Group,
        agent_id: &str,
        gpus: &[String],
    ) -> Result<Option<pb::AssignGroup>, StoreError> {
        let mut specs = Vec::new();
        for job_id in &group.jobs {
            let Some(mut job) = self.store.job(group.run, *job_id)? else { continue };
            if job.state.is_terminal() {
                continue;
            }
            job.attempt += 1;
            job.state = JobState::Assigned;
            job.agent = Some(agent_id.to_owned());
            job.summary = None;
            job.error = None;
            job.log_tail = None;
            job.gpu_fingerprint.clear();
            job.pull_progress = None;
            self.store.put_job(&job)?;
            let file = match &job.profile.dataset {
                crate::model::Dataset::Sharegpt { sha256, .. } => Some(
                    self.store.file(sha256)?.ok_or_else(|| StoreError::NotFound(format!("dataset file {sha256}")))?,
                ),
                crate::model::Dataset::Random { .. } => None,
            };
            specs.push(pb::JobSpec {
                attempt: Some(convert::attempt_ref(&job)),
                profile: job.profile.name.clone(),
                repeat: job.repeat,
                load: Some(convert::load_profile(&job.profile, file)),
            });
        }
        if specs.is_empty() {
            return Ok(None);
        }
        Ok(Some(pb::AssignGroup {
            run_id: group.run.to_string(),
            group: group.id,
            engine: Some(convert::engine_spec(&group.config)),
            jobs: specs,
            ingest_url: self.config.advertise_url.clone(),
            gpu_uuids: gpus.to_vec(),
        }))
    }

    /// Applies an agent's report on a job, unless it is about a stale attempt.
    fn job_update(&self, agent_id: &str, update: pb::JobUpdate) -> Result<(), Status> {
        let attempt = convert::attempt_key(
            update.attempt.as_ref().ok_or_else(|| Status::invalid_argument("job update without attempt"))?,
        )?;
        let Some(mut job) = self.store.job(attempt.run, attempt.job)? else {
            return Err(Status::not_found(format!("job {}/{}", attempt.run, attempt.job)));
        };
        if job.attempt != attempt.attempt || job.agent.as_deref() != Some(agent_id) || job.state.is_terminal() {
            debug!(?attempt, "ignoring an update of a stale attempt");
            return Ok(());
        }
        job.state = match pb::JobState::try_from(update.state) {
            Ok(pb::JobState::StartingEngine) => JobState::StartingEngine,
            Ok(pb::JobState::Running) => JobState::Running,
            Ok(pb::JobState::Succeeded) if job.summary.is_some() => JobState::Succeeded,
            Ok(pb::JobState::Succeeded) => {
                job.error = Some("loadgen finished, but its summary never reached the controller".to_owned());
                JobState::Failed
            }
            Ok(pb::JobState::Failed) => JobState::Failed,
            _ => return Err(Status::invalid_argument(format!("unexpected job state {}", update.state))),
        };
        if !update.error.is_empty() {
            job.error = Some(update.error);
        }
        if !update.log_tail.is_empty() {
            job.log_tail = Some(update.log_tail);
        }
        if update.engine_startup_s > 0.0 {
            job.engine_startup_s = Some(update.engine_startup_s);
        }
        if !update.gpu_fingerprint.is_empty() {
            job.gpu_fingerprint = update.gpu_fingerprint.iter().map(|g| g.fingerprint.clone()).collect();
        }
        if !update.pull_progress.is_empty() {
            job.pull_progress = Some(update.pull_progress);
        }
        self.store.put_job(&job)?;
        if job.state.is_terminal() {
            info!(run = %job.run, job = job.id, state = ?job.state, "job ended");
            self.finish_run_if_done(job.run)?;
        }
        self.notify();
        Ok(())
    }

    /// Once every job of a run has ended: a greedy run goes on with its
    /// next stage, if its planner has one; any other run is finished.
    fn finish_run_if_done(&self, run_id: RunId) -> Result<(), Status> {
        let _planning = self.planning.lock().unwrap_or_else(|e| e.into_inner());
        let jobs = self.store.jobs(run_id)?;
        if !jobs.iter().all(|j| j.state.is_terminal()) {
            return Ok(());
        }
        let Some(mut run) = self.store.run(run_id)? else { return Ok(()) };
        if run.finished {
            return Ok(());
        }
        // Greedy runs are planned again from the store alone, so that a
        // restarted controller takes up where the last one stopped.
        // Dataset hashes were recorded at submission; a run stored before
        // they were had no greedy stages to plan.
        let matrix = matrix::parse(&run.matrix_file, &run.matrix_yaml, &|path| {
            Some(run.files.get(path).cloned().unwrap_or_default())
        })
        .map_err(|e| Status::internal(format!("the stored matrix of run {run_id} no longer parses: {e}")))?;
        if matrix.strategy == Strategy::Greedy {
            let groups = self.store.groups(run_id)?;
            let results = greedy::Results::of(&groups, &jobs, &matrix.primary_profile);
            match greedy::plan(&matrix, &results).plan {
                Plan::Next(stage) => {
                    // Ids continue after the run's existing ones.
                    let first_group = groups.iter().map(|g| g.id + 1).max().unwrap_or(0);
                    let first_job = jobs.iter().map(|j| j.id + 1).max().unwrap_or(0);
                    let (groups, jobs) =
                        expand(&run, &matrix, &stage.configs, &stage.profiles, stage.number, (first_group, first_job));
                    self.store.add_groups(run_id, &groups, &jobs)?;
                    info!(run = %run_id, stage = stage.number, groups = groups.len(), jobs = jobs.len(), "greedy stage scheduled");
                    self.lock().queue.extend(groups.iter().map(|g| (run_id, g.id)));
                    self.dispatch();
                    return Ok(());
                }
                Plan::Done(outcome) => {
                    info!(run = %run_id, winner = ?outcome.winner, "greedy procedure done: {}", outcome.reason);
                }
            }
        }
        run.finished = true;
        self.store.put_run(&run)?;
        let p = Progress::of(&jobs);
        info!(run = %run_id, succeeded = p.succeeded, failed = p.failed, "run finished");
        Ok(())
    }

    /// The agent says it is done with a group: jobs it did not report on
    /// failed, and the agent is free.
    fn group_done(&self, agent_id: &str, run: RunId, group_id: u64) -> Result<(), Status> {
        let placed = self
            .lock()
            .agents
            .get(agent_id)
            .is_some_and(|a| a.running.iter().any(|p| (p.run, p.group) == (run, group_id)));
        if !placed {
            return Ok(());
        }
        for mut job in self.store.jobs(run)?.into_iter().filter(|j| j.group == group_id) {
            if !job.state.is_terminal() && job.agent.as_deref() == Some(agent_id) {
                job.state = JobState::Failed;
                job.error = Some("the agent ended the group without running this job".to_owned());
                self.store.put_job(&job)?;
            }
        }
        self.finish_run_if_done(run)?;
        if let Some(a) = self.lock().agents.get_mut(agent_id) {
            a.running.retain(|p| (p.run, p.group) != (run, group_id));
        }
        self.dispatch();
        self.notify();
        Ok(())
    }

    /// The agent's session ended (or its lease expired): its groups go back
    /// to the queue, and their jobs will run again as new attempts.
    fn session_lost(&self, agent_id: &str, epoch: u64) {
        {
            let mut state = self.lock();
            let Some(a) = state.agents.get_mut(agent_id) else { return };
            if a.epoch != epoch {
                return; // a newer session already replaced this one
            }
            a.session = None;
            let lost: Vec<Placement> = a.running.drain(..).collect();
            if lost.is_empty() {
                info!(agent = agent_id, "agent session ended");
            }
            for p in lost.into_iter().rev() {
                warn!(agent = agent_id, run = %p.run, group = p.group, "agent session ended during a group; its jobs will run again");
                state.queue.push_front((p.run, p.group));
            }
        }
        self.dispatch();
        self.notify();
    }

    /// The agent's GPUs as it checked them again: a GPU that failed gets no
    /// new group (a running group's agent checks its GPUs after each job);
    /// one that recovered can be given work again.
    fn gpu_report(&self, agent_id: &str, gpus: Vec<pb::Gpu>) {
        if let Some(a) = self.lock().agents.get_mut(agent_id) {
            for g in gpus.iter().filter(|g| !g.usable) {
                let was_usable = a.gpus.iter().any(|old| old.uuid == g.uuid && old.usable);
                if was_usable {
                    warn!(agent = %a.name, gpu = %g.uuid, "GPU no longer usable: {}", g.reasons.join("; "));
                }
            }
            a.gpus = gpus;
        }
        self.dispatch();
        self.notify();
    }

    /// Stores one batch of records of the current attempt of a job.
    fn ingest(&self, batch: pb::RecordBatch) -> Result<pb::RecordAck, Status> {
        let attempt = convert::attempt_key(
            batch.attempt.as_ref().ok_or_else(|| Status::invalid_argument("record batch without attempt"))?,
        )?;
        let job = self.current_job(&attempt)?;
        let records = batch
            .records
            .into_iter()
            .map(RequestRecord::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.store.put_records(&attempt, &records)?;
        let summary_stored = match batch.summary {
            Some(summary) => {
                let mut job = job;
                job.summary = Some(summary.into());
                self.store.put_job(&job)?;
                true
            }
            None => false,
        };
        Ok(pb::RecordAck { batch: batch.batch, summary_stored })
    }

    fn current_job(&self, attempt: &AttemptKey) -> Result<Job, Status> {
        let job = self
            .store
            .job(attempt.run, attempt.job)?
            .ok_or_else(|| Status::not_found(format!("job {}/{} does not exist", attempt.run, attempt.job)))?;
        if job.attempt != attempt.attempt || job.state.is_terminal() {
            return Err(Status::failed_precondition(format!(
                "attempt {} of job {}/{} is not current (current: {}, {:?})",
                attempt.attempt, attempt.run, attempt.job, job.attempt, job.state
            )));
        }
        Ok(job)
    }

    pub fn run_info(&self, run_id: RunId) -> Result<pb::RunInfo, Status> {
        let run = self.store.run(run_id)?.ok_or_else(|| Status::not_found(format!("run {run_id} does not exist")))?;
        Ok(convert::run_info(&run, &self.store.jobs(run_id)?))
    }
}

/// The groups and jobs of configurations on profiles: one group per
/// configuration, one job per profile and repeat; ids start at `first`
/// (group, job).
fn expand(
    run: &Run,
    matrix: &Matrix,
    configs: &[EngineConfig],
    profiles: &[Profile],
    stage: u32,
    first: (u64, u64),
) -> (Vec<Group>, Vec<Job>) {
    let (mut groups, mut jobs) = (Vec::new(), Vec::new());
    for (n, config) in configs.iter().enumerate() {
        let mut config = config.clone();
        if let Some(r) = run.runtime_override {
            config.runtime = r;
        }
        let mut group = Group {
            run: run.id,
            id: first.0 + n as u64,
            config,
            gpu: matrix.gpu.clone(),
            gpus_per_job: matrix.gpus_per_job,
            jobs: Vec::new(),
            stage,
        };
        for profile in profiles {
            for repeat in 1..=matrix.repeats {
                let id = first.1 + jobs.len() as u64;
                group.jobs.push(id);
                jobs.push(Job::new(run.id, id, group.id, profile.clone(), repeat));
            }
        }
        groups.push(group);
    }
    (groups, jobs)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The gRPC face of a controller.
#[derive(Clone)]
pub struct Services(pub Arc<Controller>);

#[tonic::async_trait]
impl pb::agent_service_server::AgentService for Services {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterResponse>, Status> {
        let req = req.into_inner();
        let mut state = self.0.lock();
        // An agent that registers again under its name keeps its id, so that
        // a restarted agent is recognised.
        let existing = state.agents.iter().find(|(_, a)| a.name == req.name).map(|(id, _)| id.clone());
        let id = existing.unwrap_or_else(|| {
            state.next_agent += 1;
            format!("agent-{}", state.next_agent)
        });
        let entry = state.agents.entry(id.clone()).or_insert_with(|| AgentEntry {
            name: req.name.clone(),
            hostname: String::new(),
            gpus: Vec::new(),
            runtimes: Vec::new(),
            session: None,
            running: Vec::new(),
            epoch: 0,
        });
        entry.hostname = req.hostname;
        entry.gpus = req.gpus;
        entry.runtimes = req.runtimes;
        info!(agent = %id, name = %req.name, gpus = entry.gpus.len(), "agent registered");
        Ok(Response::new(pb::RegisterResponse {
            agent_id: id,
            heartbeat_interval_ms: HEARTBEAT_INTERVAL.as_millis() as u32,
        }))
    }

    type SessionStream = ServerStream<pb::ControllerMessage>;

    async fn session(
        &self,
        req: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = req.into_inner();
        let hello = match inbound.next().await {
            Some(Ok(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(h)) })) => h,
            _ => return Err(Status::invalid_argument("a session starts with hello")),
        };
        let agent_id = hello.agent_id;
        let (tx, rx) = mpsc::channel(16);
        let epoch = {
            let mut state = self.0.lock();
            let Some(agent) = state.agents.get_mut(&agent_id) else {
                return Err(Status::not_found(format!("unknown agent {agent_id}; register first")));
            };
            agent.epoch += 1;
            agent.session = Some(tx);
            // A reconnecting agent abandoned what it ran before: those
            // groups run again as new attempts; it starts idle.
            let stale: Vec<Placement> = agent.running.drain(..).collect();
            for p in stale.into_iter().rev() {
                state.queue.push_front((p.run, p.group));
            }
            state.agents.get(&agent_id).map_or(0, |a| a.epoch)
        };
        info!(agent = %agent_id, "agent session started");
        self.0.dispatch();
        self.0.notify();

        let controller = self.0.clone();
        tokio::spawn(async move {
            let lease = HEARTBEAT_INTERVAL * MISSED_HEARTBEATS;
            loop {
                let msg = match tokio::time::timeout(lease, inbound.next()).await {
                    Err(_) => {
                        warn!(agent = %agent_id, "agent missed its heartbeats; lease lost");
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        debug!(agent = %agent_id, "session stream error: {e}");
                        break;
                    }
                    Ok(Some(Ok(m))) => m,
                };
                let result = match msg.msg {
                    Some(pb::agent_message::Msg::JobUpdate(u)) => controller.job_update(&agent_id, u),
                    Some(pb::agent_message::Msg::GroupDone(d)) => {
                        convert::run_id(&d.run_id).and_then(|run| controller.group_done(&agent_id, run, d.group))
                    }
                    Some(pb::agent_message::Msg::GpuReport(r)) => {
                        controller.gpu_report(&agent_id, r.gpus);
                        Ok(())
                    }
                    Some(pb::agent_message::Msg::Heartbeat(_)) | Some(pb::agent_message::Msg::Hello(_)) | None => {
                        Ok(())
                    }
                };
                if let Err(e) = result {
                    warn!(agent = %agent_id, "bad message from agent: {}", e.message());
                }
            }
            controller.session_lost(&agent_id, epoch);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl pb::ingest_service_server::IngestService for Services {
    type RecordsStream = ServerStream<pb::RecordAck>;

    async fn records(&self, req: Request<Streaming<pb::RecordBatch>>) -> Result<Response<Self::RecordsStream>, Status> {
        let mut inbound = req.into_inner();
        let controller = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Some(batch) = inbound.next().await {
                let reply = match batch {
                    Ok(batch) => {
                        let c = controller.clone();
                        // sled's flush blocks; keep it off the async workers.
                        tokio::task::spawn_blocking(move || c.ingest(batch))
                            .await
                            .unwrap_or_else(|e| Err(Status::internal(format!("ingest task failed: {e}"))))
                    }
                    Err(e) => Err(e),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[tonic::async_trait]
impl pb::operator_service_server::OperatorService for Services {
    async fn submit_run(&self, req: Request<pb::SubmitRunRequest>) -> Result<Response<pb::SubmitRunResponse>, Status> {
        let c = self.0.clone();
        let (run, jobs) = tokio::task::spawn_blocking(move || c.submit(req.into_inner()))
            .await
            .map_err(|e| Status::internal(format!("submit task failed: {e}")))??;
        Ok(Response::new(pb::SubmitRunResponse { run_id: run.to_string(), jobs }))
    }

    async fn list_runs(&self, _: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        let runs = self
            .0
            .store
            .runs()?
            .iter()
            .map(|r| Ok(convert::run_info(r, &self.0.store.jobs(r.id)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Response::new(pb::ListRunsResponse { runs }))
    }

    async fn get_report(&self, req: Request<pb::GetReportRequest>) -> Result<Response<pb::GetReportResponse>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        let text = report::render(self.0.store.as_ref(), run)?;
        Ok(Response::new(pb::GetReportResponse { text }))
    }

    type WatchRunStream = ServerStream<pb::RunProgress>;

    async fn watch_run(&self, req: Request<pb::WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        let run_id = convert::run_id(&req.into_inner().run_id)?;
        let controller = self.0.clone();
        controller.run_info(run_id)?;
        let mut changed = controller.changed.subscribe();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                changed.borrow_and_update();
                let progress = controller.run_info(run_id).map(|run| {
                    let finished = run.state != "running";
                    pb::RunProgress { run: Some(run), finished }
                });
                let done = progress.as_ref().map_or(true, |p| p.finished);
                if tx.send(progress).await.is_err() || done || changed.changed().await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_agents(&self, _: Request<pb::ListAgentsRequest>) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let state = self.0.lock();
        let mut agents: Vec<pb::AgentInfo> = state
            .agents
            .iter()
            .map(|(id, a)| pb::AgentInfo {
                agent_id: id.clone(),
                name: a.name.clone(),
                hostname: a.hostname.clone(),
                connected: a.session.is_some(),
                gpus: a.gpus.clone(),
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListAgentsResponse { agents }))
    }
}

/// Serves the controller's gRPC services on `listener` until `shutdown`.
pub async fn serve(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let services = Services(controller);
    tonic::transport::Server::builder()
        .add_service(
            pb::agent_service_server::AgentServiceServer::new(services.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            pb::ingest_service_server::IngestServiceServer::new(services.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            pb::operator_service_server::OperatorServiceServer::new(services)
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), shutdown)
        .await
}
