//! The scheduler's core: a pure state machine. Domain events go in (an
//! agent says hello, a heartbeat, a job update, a timer tick, an operator's
//! command); commands come out (persist this, send that to an agent, open or
//! close an attempt's fence, plan the run's next stage). It does no I/O,
//! never reads a clock (every event carries its time) and never sees a prost
//! type; `driver` runs it on one thread, writes what it asks for to the
//! store before sending anything it asks to send.
//!
//! Leases (FLEET.md): an agent's lease is renewed by its heartbeats. Past
//! `suspect_after` without one it gets no new work; past `lease_ttl` it is
//! lost, and the attempts it held are abandoned and run again elsewhere,
//! except when most of the fleet goes silent at once (then the controller
//! assumes it is the one cut off and declares no one lost), and never before
//! `restart_grace` has passed since the controller started. Every attempt is
//! fenced by (run, job, attempt, epoch): a message of any other attempt, or
//! of an attempt that ended, changes nothing.
//!
//! This file holds the types and the shared core (restoring, the commands
//! out, the state's indexes); the events are handled by concern, each in
//! its own `impl Scheduler`: `agents` (sessions, heartbeats, leases, drains,
//! enrolment), `attempts` (reports, an attempt's end, abandonment), `runs`
//! (submit, stages, cancel, retry) and `placement` (the queue, dispatch, why
//! groups wait, `dry_run`). An operator's command that cannot be done is a
//! `SchedError`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use benchfleet_core::telemetry::Telemetry;
use tokio::time::Instant;

use benchfleet_study::model::{AgentId, AttemptKey, EngineConfig, FailureKind, Group, Job, Profile, Run, RunId};

use crate::records::{AgentRecord, Counters, GpuState, Write};

mod agents;
mod attempts;
mod placement;
mod runs;

use placement::Need;
pub use placement::{DryPlacement, DryRun, Targets};

#[cfg(test)]
mod prop;
#[cfg(test)]
mod tests;

/// A group of a run.
pub type GroupKey = (RunId, u64);

/// The scheduler's timings and limits.
#[derive(Clone, Debug)]
pub struct SchedConfig {
    /// How often agents send heartbeats.
    pub heartbeat_interval: Duration,
    /// Without a heartbeat this long, an agent gets no new work.
    pub suspect_after: Duration,
    /// Without a heartbeat this long, an agent's lease is lost.
    pub lease_ttl: Duration,
    /// After the controller starts, nobody is declared lost before this.
    pub restart_grace: Duration,
    /// Attempts a job may fail on its own account before it fails for good.
    pub attempt_cap: u32,
    /// Attempts a job may have in all (host failures included).
    pub max_attempts: u32,
    /// How long an attempt may run from its engine's start.
    pub attempt_deadline: Duration,
    /// With at least this many agents, most of them going silent at once
    /// holds all lease losses...
    pub mass_silence_min_agents: usize,
    /// ...for at most this long; then leases are enforced again (a fleet
    /// that is really gone must not hold its work forever).
    pub mass_silence_max_hold: Duration,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            heartbeat_interval: Duration::from_secs(1),
            suspect_after: Duration::from_secs(3),
            lease_ttl: Duration::from_secs(10),
            restart_grace: Duration::from_secs(30),
            attempt_cap: 3,
            max_attempts: 10,
            attempt_deadline: Duration::from_secs(4 * 3600),
            mass_silence_min_agents: 3,
            mass_silence_max_hold: Duration::from_secs(300),
        }
    }
}

/// The time of an event: monotonic for timers, wall clock for what is
/// stored and shown.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub at: Instant,
    pub unix_ms: i64,
}

/// An attempt as its messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence {
    pub key: AttemptKey,
    pub epoch: u64,
}

/// The first message of an agent's session.
#[derive(Clone, Debug, Default)]
pub struct Hello {
    pub name: String,
    pub hostname: String,
    pub version: String,
    /// Random per agent process.
    pub instance: String,
    pub gpus: Vec<GpuState>,
    pub runtimes: Vec<String>,
    /// Groups the agent process still holds.
    pub claims: Vec<Claim>,
    pub leaving: bool,
    /// Where the session comes from, for the operator.
    pub peer: String,
    /// Under TLS, the agent its certificate names (its id was written into
    /// the certificate at join): the agent is found by it, not by name.
    pub certified: Option<AgentId>,
    /// What an hour of one of its GPUs costs, when it says.
    pub price: Option<benchfleet_core::cost::Price>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub run: RunId,
    pub group: u64,
    pub attempts: Vec<Fence>,
}

/// The answer to a hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub agent: AgentId,
    /// The session's epoch: its id, and the lease epoch of what it is given.
    pub epoch: u64,
    pub heartbeat_interval: Duration,
    pub lease_ttl: Duration,
    /// Claimed groups that go on.
    pub keep: Vec<GroupKey>,
}

/// A job's state as an agent reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    StartingEngine,
    Running,
    Succeeded,
    Failed(FailureKind),
}

#[derive(Clone, Debug)]
pub struct Update {
    pub fence: Fence,
    pub state: Reported,
    pub error: Option<String>,
    pub log_tail: Option<String>,
    pub engine_startup_s: Option<f64>,
    pub gpu_fingerprint: Vec<String>,
    pub pull_progress: Option<String>,
    /// How the job's prefix cache was made cold, or why it may be warm.
    pub prefix_cache: Option<String>,
    pub engine_version: Option<String>,
    pub image_digest: Option<String>,
    pub loadgen_args: Vec<String>,
    pub loadgen_version: Option<String>,
    /// The job's telemetry: its summary goes on the job, its series to the
    /// store apart.
    pub telemetry: Option<Box<Telemetry>>,
}

impl Update {
    pub fn new(fence: Fence, state: Reported) -> Update {
        Update {
            fence,
            state,
            error: None,
            log_tail: None,
            engine_startup_s: None,
            gpu_fingerprint: Vec::new(),
            pull_progress: None,
            prefix_cache: None,
            engine_version: None,
            image_digest: None,
            loadgen_args: Vec::new(),
            loadgen_version: None,
            telemetry: None,
        }
    }
}

/// A group handed to an agent.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub run: RunId,
    pub group: u64,
    pub epoch: u64,
    pub config: EngineConfig,
    pub jobs: Vec<AssignedJob>,
    pub gpus: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AssignedJob {
    pub fence: Fence,
    pub profile: Profile,
    pub repeat: u32,
}

/// What the controller says to an agent.
#[derive(Clone, Debug, PartialEq)]
pub enum ToAgent {
    Assign(Box<Assignment>),
    Cancel { run: RunId, group: u64, reason: String },
    HeartbeatAck { seq: u64 },
}

/// What the scheduler asks its driver to do, in order; writes go to the
/// store before anything is sent.
// Commands live for one batch of events (see `Write`).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Persist(Write),
    /// To the session with this epoch, if it is still the agent's.
    Send {
        agent: AgentId,
        session: u64,
        msg: ToAgent,
    },
    CloseSession {
        agent: AgentId,
        session: u64,
        reason: String,
    },
    /// Records of this attempt are taken from now on...
    OpenFence(Fence),
    /// ...and refused from now on.
    CloseFence(AttemptKey),
    /// Removes the records of the job's attempts before this one.
    Purge(AttemptKey),
    /// Every job of the run reached a final state: plan its next stage or
    /// finish it.
    RunEnded(RunId),
}

/// Why a session was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Why an operator's command (or an agent's renewal) could not be done.
/// The texts are what the operator reads; `service` gives each kind its
/// gRPC code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// No run has this id (known only to the driver, which asks the store).
    #[error("run {0} does not exist")]
    NoSuchRun(RunId),
    /// The scheduler does not hold the run: it is over, or it never was.
    #[error("run {0} is not running")]
    NotRunning(RunId),
    #[error("run {0} is already over")]
    RunOver(RunId),
    #[error("run {0} is still running; retry it once it has ended")]
    StillRunning(RunId),
    #[error("run {0} has no failed or cancelled jobs to retry")]
    NothingToRetry(RunId),
    /// Neither the id nor the name of a known agent.
    #[error("no agent named '{0}' or with that id; `benchfleet agents` lists them")]
    NoSuchAgent(String),
    /// A renewal for an id no known agent has.
    #[error("{0} is not enrolled with this controller")]
    NotEnrolled(AgentId),
    /// The store failed while the driver read what the command needs.
    #[error("{0}")]
    Store(String),
}

/// An agent's liveness, as `benchfleet agents` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    Ready,
    /// Connected, but no heartbeat for `suspect_after`.
    Suspect,
    /// No session; its lease still runs.
    Disconnected,
    Lost,
}

impl Liveness {
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Ready => "ready",
            Liveness::Suspect => "suspect",
            Liveness::Disconnected => "disconnected",
            Liveness::Lost => "lost",
        }
    }
}

/// A run as the store holds it, for restoring the scheduler.
#[derive(Clone, Debug)]
pub struct RunData {
    pub run: Run,
    pub groups: Vec<Group>,
    pub jobs: Vec<Job>,
    /// Attempts whose summary is stored.
    pub summaries: Vec<AttemptKey>,
}

#[derive(Clone, Debug)]
struct Session {
    epoch: u64,
    instance: String,
    peer: String,
    /// What an hour of one of its GPUs costs, as its hello said: each
    /// attempt placed on it keeps it.
    price: Option<benchfleet_core::cost::Price>,
}

#[derive(Clone, Debug)]
struct AgentEntry {
    rec: AgentRecord,
    session: Option<Session>,
    /// When its last heartbeat (or hello) arrived; `None` since the
    /// controller started, until one does.
    last_heard: Option<Instant>,
    lost: bool,
    leaving: bool,
    groups: BTreeSet<GroupKey>,
    /// Free usable GPUs when last refreshed (0 when it may not take work).
    free: usize,
}

impl AgentEntry {
    /// An agent first seen now: by its hello, or by its join (which stores
    /// it before it ever connects).
    fn new(id: AgentId, name: &str, now: Now) -> AgentEntry {
        AgentEntry::of(AgentRecord {
            id,
            name: name.to_owned(),
            hostname: String::new(),
            version: String::new(),
            gpus: Vec::new(),
            runtimes: Vec::new(),
            drain: None,
            registered_unix_ms: now.unix_ms,
            connected_unix_ms: 0,
            epoch: 0,
            certificate: None,
        })
    }

    /// A known agent (from the store), not connected.
    fn of(rec: AgentRecord) -> AgentEntry {
        AgentEntry {
            rec,
            session: None,
            last_heard: None,
            lost: false,
            leaving: false,
            groups: BTreeSet::new(),
            free: 0,
        }
    }
}

#[derive(Clone, Debug)]
struct RunEntry {
    run: Run,
    groups: Vec<u64>,
    /// Jobs not yet in a final state.
    open: usize,
}

#[derive(Clone, Debug)]
struct JobEntry {
    job: Job,
    /// When the current attempt began (engine starting or load running).
    active_since: Option<Instant>,
    has_summary: bool,
}

#[derive(Clone, Debug)]
struct GroupEntry {
    group: Group,
    queued: bool,
    /// Its place in the queue, kept when it is queued again (a group whose
    /// agent was lost goes back where it was, not to the end).
    order: Option<u64>,
}

/// How an abandoned group's attempts count against the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Charge {
    /// Every job whose attempt had begun.
    Begun,
    /// Only this job.
    Only(u64),
    /// None.
    Nobody,
}

#[derive(Clone)]
pub struct Scheduler {
    config: SchedConfig,
    counters: Counters,
    /// Before this, nobody's lease is lost (the restart grace).
    grace_until: Instant,
    agents: BTreeMap<AgentId, AgentEntry>,
    by_name: HashMap<String, AgentId>,
    runs: BTreeMap<RunId, RunEntry>,
    groups: HashMap<GroupKey, GroupEntry>,
    jobs: HashMap<(RunId, u64), JobEntry>,
    /// Groups waiting for an agent, by what they need, each in the order
    /// it was queued (the number orders across needs).
    queue: BTreeMap<Need, VecDeque<(u64, GroupKey)>>,
    queued_seq: u64,
    /// Agents that may take work and have a free usable GPU.
    placeable: BTreeSet<AgentId>,
    /// Bumped whenever an agent may have become able to take more: a need
    /// found unplaceable is not looked at again until it changes, so a
    /// backlog no agent can take costs nothing per event.
    capacity: u64,
    /// Needs found unplaceable, at which `capacity`.
    blocked: HashMap<Need, u64>,
    /// Since when most of the fleet has been silent and losses are held.
    holding: Option<Instant>,
    out: Vec<Command>,
}

impl Scheduler {
    /// An empty scheduler (a new store).
    pub fn new(config: SchedConfig, now: Now) -> Scheduler {
        Scheduler::restore(config, now, Counters::default(), Vec::new(), Vec::new()).0
    }

    /// The scheduler of a restarted controller, from what the store holds:
    /// every known agent is given until the restart grace ends to come back
    /// and claim what it runs. Returns the commands to run first (fences of
    /// running attempts, runs that ended while no controller was there).
    pub fn restore(
        config: SchedConfig,
        now: Now,
        counters: Counters,
        agents: Vec<AgentRecord>,
        runs: Vec<RunData>,
    ) -> (Scheduler, Vec<Command>) {
        let mut s = Scheduler {
            grace_until: now.at + config.restart_grace,
            config,
            counters,
            agents: BTreeMap::new(),
            by_name: HashMap::new(),
            runs: BTreeMap::new(),
            groups: HashMap::new(),
            jobs: HashMap::new(),
            queue: BTreeMap::new(),
            queued_seq: 0,
            placeable: BTreeSet::new(),
            capacity: 0,
            blocked: HashMap::new(),
            holding: None,
            out: Vec::new(),
        };
        for rec in agents {
            s.counters.next_agent = s.counters.next_agent.max(rec.id.0 + 1);
            s.counters.next_epoch = s.counters.next_epoch.max(rec.epoch + 1);
            s.by_name.insert(rec.name.clone(), rec.id);
            s.agents.insert(rec.id, AgentEntry::of(rec));
        }
        for data in runs {
            s.insert_run(data, now);
        }
        let keys: Vec<AgentId> = s.agents.keys().copied().collect();
        for id in keys {
            s.refresh(id, now);
        }
        let out = std::mem::take(&mut s.out);
        (s, out)
    }

    /// Takes the commands produced so far.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.out)
    }

    pub fn config(&self) -> &SchedConfig {
        &self.config
    }

    fn persist(&mut self, w: Write) {
        self.out.push(Command::Persist(w));
    }

    fn persist_job(&mut self, key: (RunId, u64)) {
        if let Some(j) = self.jobs.get(&key) {
            self.out.push(Command::Persist(Write::Job(j.job.clone())));
        }
    }

    fn persist_group(&mut self, key: GroupKey) {
        if let Some(g) = self.groups.get(&key) {
            self.out.push(Command::Persist(Write::Group(g.group.clone())));
        }
    }

    fn persist_agent(&mut self, id: AgentId) {
        if let Some(a) = self.agents.get(&id) {
            self.out.push(Command::Persist(Write::Agent(a.rec.clone())));
        }
    }

    fn group_jobs(&self, key: GroupKey) -> impl Iterator<Item = &JobEntry> {
        let ids = self.groups.get(&key).map(|g| g.group.jobs.as_slice()).unwrap_or_default();
        ids.iter().filter_map(move |j| self.jobs.get(&(key.0, *j)))
    }

    fn active_fences(&self, key: GroupKey) -> Vec<Fence> {
        self.group_jobs(key)
            .filter(|j| j.job.state.is_active())
            .map(|j| Fence { key: j.job.key(), epoch: j.job.epoch })
            .collect()
    }

    /// The runs the scheduler holds: in progress, or over with groups still
    /// stopping.
    pub fn run_ids(&self) -> impl Iterator<Item = RunId> + '_ {
        self.runs.keys().copied()
    }

    pub fn agent_ids(&self) -> impl Iterator<Item = AgentId> + '_ {
        self.agents.keys().copied()
    }

    /// The run's jobs as the scheduler holds them (only runs in progress,
    /// or over with groups still stopping).
    pub fn run_jobs(&self, run: RunId) -> Option<(Run, Vec<&Job>, Vec<&Group>)> {
        let r = self.runs.get(&run)?;
        let groups: Vec<&Group> =
            r.groups.iter().filter_map(|g| self.groups.get(&(run, *g))).map(|g| &g.group).collect();
        let jobs: Vec<&Job> = groups
            .iter()
            .flat_map(|g| g.jobs.iter())
            .filter_map(|j| self.jobs.get(&(run, *j)))
            .map(|j| &j.job)
            .collect();
        Some((r.run.clone(), jobs, groups))
    }

    /// Whether lease losses are being held (most of the fleet is silent).
    pub fn holding(&self) -> bool {
        self.holding.is_some()
    }

    /// Groups queued, for metrics.
    pub fn queue_len(&self) -> usize {
        self.groups.values().filter(|g| g.queued).count()
    }
}

/// An agent for `benchfleet agents`.
#[derive(Clone, Debug)]
pub struct AgentView {
    pub rec: AgentRecord,
    pub liveness: Liveness,
    pub lease_age: Option<Duration>,
    pub connected: bool,
    pub session: Option<u64>,
    pub leaving: bool,
    pub groups: Vec<GroupKey>,
}

/// A duration as an operator reads it.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}
