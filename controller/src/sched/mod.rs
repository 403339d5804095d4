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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use benchfleet_core::telemetry::Telemetry;
use tokio::time::Instant;

use crate::model::{
    AgentCertificate, AgentId, AgentRecord, AttemptInfo, AttemptKey, AttemptOutcome, Counters, EngineConfig,
    FailureKind, GpuState, Group, Job, JobState, Note, Placement, Profile, Run, RunId, RunState, RuntimeKind, Write,
};

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

/// What a group needs of an agent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Need {
    gpu: Option<String>,
    gpus: u32,
    runtime: RuntimeKind,
}

impl Need {
    fn of(g: &Group) -> Need {
        Need { gpu: g.gpu.as_ref().map(|m| m.to_ascii_lowercase()), gpus: g.gpus_per_job, runtime: g.config.runtime }
    }

    /// The agent's GPUs of the wanted model, usable or not.
    fn gpus<'a>(&'a self, a: &'a AgentRecord) -> impl Iterator<Item = &'a GpuState> {
        of_model(&a.gpus, self.gpu.as_deref())
    }

    /// Whether the agent could ever run such a group: the runtime, and
    /// enough GPUs of the model (whether free or passing their checks now).
    fn could_run(&self, a: &AgentRecord) -> bool {
        a.runtimes.iter().any(|r| r == self.runtime.as_str()) && self.gpus(a).count() >= self.gpus as usize
    }

    /// "an A100", "2 H200s", "a GPU".
    fn describe(&self) -> String {
        let model = self.gpu.as_deref().map_or("GPU".to_owned(), str::to_uppercase);
        if self.gpus > 1 {
            return format!("{} {model}s", self.gpus);
        }
        let vowel_sound = model.starts_with(['A', 'E', 'F', 'H', 'I', 'L', 'M', 'N', 'O', 'R', 'S', 'X']);
        format!("{} {model}", if vowel_sound { "an" } else { "a" })
    }
}

/// The GPUs of a model (all of them without one).
fn of_model<'a>(gpus: &'a [GpuState], model: Option<&'a str>) -> impl Iterator<Item = &'a GpuState> {
    gpus.iter().filter(move |g| model.is_none_or(|m| benchfleet_core::gpu::model_matches(&g.name, m)))
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

    /// Adds a run and its groups and jobs (from the store, or newly
    /// submitted); groups placed on a known agent stay placed there.
    fn insert_run(&mut self, data: RunData, now: Now) {
        let RunData { run, groups, jobs, summaries } = data;
        let id = run.id;
        let summaries: BTreeSet<AttemptKey> = summaries.into_iter().collect();
        let mut entry = RunEntry { run, groups: Vec::new(), open: 0 };
        for job in jobs {
            if !job.state.is_terminal() {
                entry.open += 1;
            }
            let has_summary = summaries.contains(&job.key());
            self.jobs.insert((id, job.id), JobEntry { job, active_since: None, has_summary });
        }
        let ended = entry.open == 0 && !entry.run.is_over();
        self.runs.insert(id, entry);
        for group in groups {
            self.add_group(group, now);
        }
        if ended {
            self.out.push(Command::RunEnded(id));
        }
    }

    fn add_group(&mut self, group: Group, now: Now) {
        let key = (group.run, group.id);
        if let Some(r) = self.runs.get_mut(&group.run) {
            r.groups.push(group.id);
        }
        let placed = group.placement.as_ref().map(|p| p.agent).filter(|a| self.agents.contains_key(a));
        self.groups.insert(key, GroupEntry { group, queued: false, order: None });
        match placed {
            Some(agent) => {
                // A restored placement: its active attempts take records
                // again until the agent says whether it still runs them.
                if let Some(a) = self.agents.get_mut(&agent) {
                    a.groups.insert(key);
                }
                for fence in self.active_fences(key) {
                    self.out.push(Command::OpenFence(fence));
                }
            }
            None => {
                if self.groups.get(&key).is_some_and(|g| g.group.placement.is_some()) {
                    // Placed on an agent the store does not know: lost.
                    self.abandon_group(key, "its agent is unknown to this controller", Charge::Nobody, now);
                } else {
                    // Attempts left active without a placement cannot go on.
                    let stray: Vec<u64> =
                        self.group_jobs(key).filter(|j| j.job.state.is_active()).map(|j| j.job.id).collect();
                    for job in stray {
                        self.end_attempt(
                            (key.0, job),
                            AttemptOutcome::Abandoned,
                            "the controller lost track of it",
                            false,
                            FailureKind::Host,
                            now,
                        );
                    }
                    self.enqueue(key);
                }
            }
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

    /// Queues a group that has jobs left to run.
    fn enqueue(&mut self, key: GroupKey) {
        let has_pending = self.group_jobs(key).any(|j| j.job.state == JobState::Pending);
        let Some(g) = self.groups.get_mut(&key) else { return };
        if g.queued || g.group.placement.is_some() || !has_pending {
            return;
        }
        g.queued = true;
        let order = *g.order.get_or_insert_with(|| {
            self.queued_seq += 1;
            self.queued_seq
        });
        let q = self.queue.entry(Need::of(&g.group)).or_default();
        let at = q.partition_point(|(o, _)| *o < order);
        q.insert(at, (order, key));
    }

    // ------------------------------------------------------------ agents --

    /// An agent's session begins.
    pub fn hello(&mut self, now: Now, hello: Hello) -> Result<Welcome, Refused> {
        if hello.name.trim().is_empty() {
            return Err(Refused("an agent must have a name".to_owned()));
        }
        let existing = match hello.certified {
            Some(id) => {
                let a = self.agents.get(&id).ok_or_else(|| {
                    Refused(format!(
                        "agent '{}' ({id}) is not enrolled with this controller (its store was replaced?): join it \
                         again with a new token",
                        hello.name
                    ))
                })?;
                if a.rec.name != hello.name {
                    return Err(Refused(format!("{id} is agent '{}', not '{}'", a.rec.name, hello.name)));
                }
                if let Some(note) = a.rec.certificate.as_ref().and_then(|c| c.revoked.as_ref()) {
                    return Err(Refused(format!("agent '{}' ({id}) was revoked by {}", hello.name, note.by)));
                }
                Some(id)
            }
            None => self.by_name.get(&hello.name).copied(),
        };
        if let Some(id) = existing
            && let Some(a) = self.agents.get(&id)
            && let Some(s) = &a.session
            && s.instance != hello.instance
            && !a.lost
        {
            return Err(Refused(format!(
                "another agent already holds the name '{}' ({id}, host {}, connected from {}): two agents may not \
                 share a name; give this one another name (--name), or stop the other one (its lease ends {} s \
                 after its last heartbeat)",
                hello.name,
                a.rec.hostname,
                s.peer,
                self.config.lease_ttl.as_secs()
            )));
        }
        let id = existing.unwrap_or_else(|| {
            let id = AgentId(self.counters.next_agent.max(1));
            self.counters.next_agent = id.0 + 1;
            id
        });
        let epoch = self.counters.next_epoch.max(1);
        self.counters.next_epoch = epoch + 1;
        self.persist(Write::Counters(self.counters));

        let entry = self.agents.entry(id).or_insert_with(|| AgentEntry::new(id, &hello.name, now));
        if let Some(old) = entry.session.take() {
            self.out.push(Command::CloseSession {
                agent: id,
                session: old.epoch,
                reason: "replaced by a newer session of the same agent".to_owned(),
            });
        }
        let entry = self.agents.get_mut(&id).expect("inserted above");
        entry.rec.hostname = hello.hostname;
        entry.rec.version = hello.version;
        entry.rec.gpus = hello.gpus;
        entry.rec.runtimes = hello.runtimes;
        entry.rec.connected_unix_ms = now.unix_ms;
        entry.rec.epoch = epoch;
        entry.session = Some(Session { epoch, instance: hello.instance, peer: hello.peer });
        entry.last_heard = Some(now.at);
        entry.lost = false;
        entry.leaving = hello.leaving;
        self.by_name.insert(entry.rec.name.clone(), id);
        let held: Vec<GroupKey> = entry.groups.iter().copied().collect();
        // New GPUs or runtimes may fit needs nothing else could.
        self.capacity += 1;
        self.persist_agent(id);

        // What the agent claims goes on if it is what this controller gave
        // it; everything else it held is abandoned.
        let claimed: HashMap<GroupKey, &Claim> = hello.claims.iter().map(|c| ((c.run, c.group), c)).collect();
        let mut keep = Vec::new();
        for key in held {
            let kept = claimed.get(&key).is_some_and(|c| self.claim_holds(key, c));
            if kept {
                keep.push(key);
            } else if self.runs.get(&key.0).is_some_and(|r| r.run.is_over()) {
                // A cancelled run's group: nothing left to abandon.
                self.release(key, id, now);
            } else {
                let reason =
                    format!("agent {} came back without it (restarted, or it stopped the work itself)", hello.name);
                self.abandon(key, &reason, Charge::Begun, false, now);
            }
        }
        self.refresh(id, now);
        Ok(Welcome {
            agent: id,
            epoch,
            heartbeat_interval: self.config.heartbeat_interval,
            lease_ttl: self.config.lease_ttl,
            keep,
        })
    }

    /// Whether a claim matches the group's active attempts exactly enough to
    /// let it go on: every active attempt of the group is claimed with its
    /// fence.
    fn claim_holds(&self, key: GroupKey, claim: &Claim) -> bool {
        let active = self.active_fences(key);
        !active.is_empty() && active.iter().all(|f| claim.attempts.contains(f))
    }

    /// Whether `session` is the agent's current one.
    fn session_is(&self, agent: AgentId, session: u64) -> bool {
        self.agents.get(&agent).and_then(|a| a.session.as_ref()).is_some_and(|s| s.epoch == session)
    }

    pub fn heartbeat(&mut self, now: Now, agent: AgentId, session: u64, seq: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        let Some(a) = self.agents.get_mut(&agent) else { return };
        if a.lost {
            // A lost agent that comes back starts over, GPU checks first.
            a.session = None;
            self.out.push(Command::CloseSession {
                agent,
                session,
                reason: "this agent's lease was lost; reconnect".to_owned(),
            });
        } else {
            a.last_heard = Some(now.at);
            self.out.push(Command::Send { agent, session, msg: ToAgent::HeartbeatAck { seq } });
        }
        self.refresh(agent, now);
    }

    pub fn session_closed(&mut self, now: Now, agent: AgentId, session: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.session = None;
        }
        self.refresh(agent, now);
    }

    /// The agent is shutting down: no new work.
    pub fn leaving(&mut self, now: Now, agent: AgentId, session: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.leaving = true;
        }
        self.refresh(agent, now);
    }

    pub fn gpu_report(&mut self, now: Now, agent: AgentId, session: u64, gpus: Vec<GpuState>) {
        if !self.session_is(agent, session) {
            return;
        }
        let Some(a) = self.agents.get_mut(&agent) else { return };
        let verdicts =
            |g: &[GpuState]| g.iter().map(|g| (g.uuid.clone(), g.usable, g.reasons.clone())).collect::<Vec<_>>();
        let changed = verdicts(&a.rec.gpus) != verdicts(&gpus);
        a.rec.gpus = gpus;
        if changed {
            self.capacity += 1;
            self.persist_agent(agent);
        }
        self.refresh(agent, now);
    }

    /// Drains an agent (by id or name): its current work finishes, it gets
    /// no new work.
    pub fn drain(&mut self, now: Now, agent: &str, note: Note) -> Result<AgentId, String> {
        let id = self.find_agent(agent)?;
        if let Some(a) = self.agents.get_mut(&id) {
            a.rec.drain = Some(note);
        }
        self.persist_agent(id);
        self.refresh(id, now);
        Ok(id)
    }

    pub fn undrain(&mut self, now: Now, agent: &str) -> Result<AgentId, String> {
        let id = self.find_agent(agent)?;
        if let Some(a) = self.agents.get_mut(&id) {
            a.rec.drain = None;
        }
        self.persist_agent(id);
        self.refresh(id, now);
        Ok(id)
    }

    pub fn find_agent(&self, agent: &str) -> Result<AgentId, String> {
        if let Ok(id) = agent.parse::<AgentId>()
            && self.agents.contains_key(&id)
        {
            return Ok(id);
        }
        self.by_name
            .get(agent)
            .copied()
            .ok_or_else(|| format!("no agent named '{agent}' or with that id; `benchfleet agents` lists them"))
    }

    fn liveness_of(&self, a: &AgentEntry, now: Instant) -> Liveness {
        if a.lost {
            Liveness::Lost
        } else if a.session.is_none() {
            Liveness::Disconnected
        } else if a.last_heard.is_none_or(|t| now.saturating_duration_since(t) >= self.config.suspect_after) {
            Liveness::Suspect
        } else {
            Liveness::Ready
        }
    }

    /// Usable GPUs of the wanted model that no placed group holds, by index.
    fn free_gpus(&self, a: &AgentEntry, model: Option<&str>) -> Vec<String> {
        let taken: BTreeSet<&str> = a
            .groups
            .iter()
            .filter_map(|k| self.groups.get(k))
            .filter_map(|g| g.group.placement.as_ref())
            .flat_map(|p| p.gpus.iter().map(String::as_str))
            .collect();
        let mut gpus: Vec<&GpuState> =
            of_model(&a.rec.gpus, model).filter(|g| g.usable && !taken.contains(g.uuid.as_str())).collect();
        gpus.sort_by_key(|g| g.index);
        gpus.into_iter().map(|g| g.uuid.clone()).collect()
    }

    fn may_take_work(&self, a: &AgentEntry, now: Instant) -> bool {
        self.liveness_of(a, now) == Liveness::Ready && a.rec.drain.is_none() && !a.leaving
    }

    /// Recomputes whether an agent may be given work.
    fn refresh(&mut self, id: AgentId, now: Now) {
        let free =
            self.agents.get(&id).filter(|a| self.may_take_work(a, now.at)).map_or(0, |a| self.free_gpus(a, None).len());
        if free > 0 {
            self.placeable.insert(id);
        } else {
            self.placeable.remove(&id);
        }
        if let Some(a) = self.agents.get_mut(&id) {
            if free > a.free {
                self.capacity += 1;
            }
            a.free = free;
        }
    }

    // -------------------------------------------------------------- jobs --

    /// The job an agent's message names, if the message is current: the
    /// session is the agent's, the attempt is the job's current one, granted
    /// under that epoch to that agent, and not ended.
    fn current(&self, agent: AgentId, session: u64, fence: Fence) -> Option<(RunId, u64)> {
        if !self.session_is(agent, session) {
            return None;
        }
        let key = (fence.key.run, fence.key.job);
        let j = &self.jobs.get(&key)?.job;
        let current = j.attempt == fence.key.attempt
            && j.epoch == fence.epoch
            && j.agent == Some(agent)
            && j.state.is_active()
            && j.current().is_some_and(|a| a.outcome == AttemptOutcome::Running);
        current.then_some(key)
    }

    /// An agent's report on one attempt; `false` when it was stale and
    /// changed nothing.
    pub fn job_update(&mut self, now: Now, agent: AgentId, session: u64, mut u: Update) -> bool {
        let Some(key) = self.current(agent, session, u.fence) else { return false };
        let Some(entry) = self.jobs.get_mut(&key) else { return false };
        let job = &mut entry.job;
        if u.log_tail.is_some() {
            job.log_tail = u.log_tail.clone();
        }
        if u.engine_startup_s.is_some() {
            job.engine_startup_s = u.engine_startup_s;
        }
        if !u.gpu_fingerprint.is_empty() {
            job.gpu_fingerprint = u.gpu_fingerprint.clone();
        }
        if u.prefix_cache.is_some() {
            job.prefix_cache = u.prefix_cache.clone();
        }
        if u.engine_version.is_some() {
            job.engine_version = u.engine_version.clone();
        }
        if u.image_digest.is_some() {
            job.image_digest = u.image_digest.clone();
        }
        if !u.loadgen_args.is_empty() {
            job.loadgen_args = u.loadgen_args.clone();
        }
        if u.loadgen_version.is_some() {
            job.loadgen_version = u.loadgen_version.clone();
        }
        if let Some(t) = u.telemetry.take() {
            let Telemetry { summary, series } = *t;
            job.telemetry = Some(summary);
            // Written with the job's own update, in the same transaction.
            self.out.push(Command::Persist(Write::Telemetry(job.key(), series)));
        }
        match u.state {
            Reported::StartingEngine | Reported::Running => {
                job.state = if u.state == Reported::Running { JobState::Running } else { JobState::StartingEngine };
                if u.pull_progress.is_some() {
                    job.pull_progress = u.pull_progress;
                }
                entry.active_since.get_or_insert(now.at);
                self.persist_job(key);
            }
            Reported::Succeeded if entry.has_summary => {
                self.end_attempt(key, AttemptOutcome::Succeeded, "", false, FailureKind::Attempt, now);
            }
            Reported::Succeeded => {
                let reason = "loadgen finished, but its summary never reached the controller";
                self.end_attempt(key, AttemptOutcome::Failed, reason, true, FailureKind::Attempt, now);
            }
            Reported::Failed(kind) => {
                let reason = u.error.unwrap_or_else(|| "failed (the agent gave no reason)".to_owned());
                let group = (key.0, self.jobs[&key].job.group);
                if kind != FailureKind::Host
                    && let Some(g) = self.groups.get_mut(&group)
                    && !g.group.failed_on.contains(&agent)
                {
                    g.group.failed_on.push(agent);
                    self.persist_group(group);
                }
                self.end_attempt(key, AttemptOutcome::Failed, &reason, kind == FailureKind::Attempt, kind, now);
            }
        }
        true
    }

    /// loadgen's summary of an attempt was stored.
    pub fn summary_stored(&mut self, key: AttemptKey) {
        if let Some(j) = self.jobs.get_mut(&(key.run, key.job))
            && j.job.attempt == key.attempt
        {
            j.has_summary = true;
        }
    }

    /// Ends a job's current attempt and decides what becomes of the job:
    /// final, or pending for another attempt.
    fn end_attempt(
        &mut self,
        key: (RunId, u64),
        outcome: AttemptOutcome,
        reason: &str,
        charged: bool,
        kind: FailureKind,
        now: Now,
    ) {
        let (cap, max) = (self.config.attempt_cap, self.config.max_attempts);
        // A failure of the attempt's own is tried again only on an agent it
        // has not failed on: with none left, it is final.
        let nowhere_else = outcome == AttemptOutcome::Failed
            && kind == FailureKind::Attempt
            && self
                .jobs
                .get(&key)
                .and_then(|j| self.groups.get(&(key.0, j.job.group)))
                .is_some_and(|g| !self.capable_elsewhere(&g.group));
        let Some(entry) = self.jobs.get_mut(&key) else { return };
        let job = &mut entry.job;
        let was_active = job.state.is_active();
        let log_tail = job.log_tail.clone();
        if let Some(a) = job.current_mut()
            && a.outcome == AttemptOutcome::Running
        {
            a.outcome = outcome;
            a.ended_unix_ms = Some(now.unix_ms);
            a.reason = (!reason.is_empty()).then(|| reason.to_owned());
            a.charged = charged;
            a.log_tail = log_tail;
        }
        entry.active_since = None;
        job.pull_progress = None;
        let next = match outcome {
            AttemptOutcome::Succeeded => {
                job.error = None;
                JobState::Succeeded
            }
            AttemptOutcome::Cancelled => JobState::Cancelled,
            AttemptOutcome::Running => return,
            AttemptOutcome::Failed | AttemptOutcome::Abandoned => {
                let since = &job.attempts[(job.retry_base as usize).min(job.attempts.len())..];
                let failed: Vec<&AttemptInfo> = since.iter().filter(|a| a.charged).collect();
                if kind == FailureKind::Config {
                    job.error = Some(reason.to_owned());
                    JobState::Failed
                } else if failed.len() as u32 >= cap || nowhere_else {
                    let hosts: BTreeSet<AgentId> = failed.iter().map(|a| a.agent).collect();
                    job.error = Some(if hosts.len() > 1 {
                        format!("failed on {} hosts: {reason}", hosts.len())
                    } else if failed.len() > 1 {
                        format!("failed {} times on {}: {reason}", failed.len(), failed[0].agent_name)
                    } else {
                        reason.to_owned()
                    });
                    JobState::Failed
                } else if since.len() as u32 >= max {
                    job.error = Some(format!("gave up after {} attempts: {reason}", since.len()));
                    JobState::Failed
                } else {
                    job.error = Some(format!("attempt {} {}: {reason}", job.attempt, outcome.as_str()));
                    JobState::Pending
                }
            }
        };
        job.state = next;
        if was_active {
            self.out.push(Command::CloseFence(AttemptKey {
                run: key.0,
                job: key.1,
                attempt: self.jobs[&key].job.attempt,
            }));
        }
        self.persist_job(key);
        if next.is_terminal() {
            self.job_ended(key.0);
        }
    }

    fn job_ended(&mut self, run: RunId) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        r.open = r.open.saturating_sub(1);
        if r.open == 0 && !r.run.is_over() {
            self.out.push(Command::RunEnded(run));
        }
    }

    /// The agent is done with a group: its GPUs are free. Jobs it did not
    /// report on run again.
    pub fn group_done(&mut self, now: Now, agent: AgentId, session: u64, run: RunId, group: u64, epoch: u64) -> bool {
        let key = (run, group);
        let placed_here = self
            .groups
            .get(&key)
            .and_then(|g| g.group.placement.as_ref())
            .is_some_and(|p| p.agent == agent && p.epoch == epoch);
        if !self.session_is(agent, session) || !placed_here {
            return false;
        }
        let left: Vec<u64> = self.group_jobs(key).filter(|j| j.job.state.is_active()).map(|j| j.job.id).collect();
        for job in left {
            let reason = "the agent ended the group without running this job";
            self.end_attempt((run, job), AttemptOutcome::Failed, reason, false, FailureKind::Host, now);
        }
        self.release(key, agent, now);
        true
    }

    /// A group leaves its agent: GPUs free, queued again if jobs are left.
    fn release(&mut self, key: GroupKey, agent: AgentId, now: Now) {
        if let Some(g) = self.groups.get_mut(&key) {
            g.group.placement = None;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.groups.remove(&key);
        }
        self.persist_group(key);
        self.enqueue(key);
        self.refresh(agent, now);
        self.forget_if_over(key.0);
    }

    /// Gives up a placed group's active attempts and queues it again; the
    /// agent, if it still listens, is told to stop it.
    fn abandon_group(&mut self, key: GroupKey, reason: &str, charge: Charge, now: Now) {
        self.abandon(key, reason, charge, true, now);
    }

    /// `abandon_group`, telling the agent to stop the group only with
    /// `tell`: an agent that came back without it does not hold it.
    fn abandon(&mut self, key: GroupKey, reason: &str, charge: Charge, tell: bool, now: Now) {
        let Some(placement) = self.groups.get(&key).and_then(|g| g.group.placement.clone()) else { return };
        let active: Vec<(u64, bool)> = self
            .group_jobs(key)
            .filter(|j| j.job.state.is_active())
            .map(|j| (j.job.id, j.job.state != JobState::Assigned))
            .collect();
        for (job, begun) in active {
            let charged = match charge {
                Charge::Begun => begun,
                Charge::Only(j) => j == job,
                Charge::Nobody => false,
            };
            self.end_attempt((key.0, job), AttemptOutcome::Abandoned, reason, charged, FailureKind::Attempt, now);
        }
        if let Some(session) = self.agents.get(&placement.agent).and_then(|a| a.session.as_ref()).map(|s| s.epoch)
            && tell
        {
            self.out.push(Command::Send {
                agent: placement.agent,
                session,
                msg: ToAgent::Cancel { run: key.0, group: key.1, reason: reason.to_owned() },
            });
        }
        self.release(key, placement.agent, now);
    }

    /// Whether some known agent on which the group has not failed could
    /// run it (now or once it is back).
    fn capable_elsewhere(&self, g: &Group) -> bool {
        let need = Need::of(g);
        self.agents.values().any(|a| !a.lost && !g.failed_on.contains(&a.rec.id) && need.could_run(&a.rec))
    }

    // -------------------------------------------------------------- runs --

    /// A newly submitted run (already stored) joins the queue.
    pub fn submit(&mut self, now: Now, run: Run, groups: Vec<Group>, jobs: Vec<Job>) {
        self.insert_run(RunData { run, groups, jobs, summaries: Vec::new() }, now);
    }

    /// A greedy run's next stage (already stored).
    pub fn add_stage(&mut self, now: Now, run: RunId, groups: Vec<Group>, jobs: Vec<Job>) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        r.open += jobs.iter().filter(|j| !j.state.is_terminal()).count();
        for job in jobs {
            self.jobs.insert((run, job.id), JobEntry { job, active_since: None, has_summary: false });
        }
        for g in groups {
            self.add_group(g, now);
        }
    }

    /// The run is over: every job ended and no stage is left.
    pub fn finish_run(&mut self, now: Now, run: RunId) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        if r.run.is_over() || r.open > 0 {
            return;
        }
        r.run.state = RunState::Finished;
        r.run.ended_unix_ms = Some(now.unix_ms);
        self.persist(Write::Run(self.runs[&run].run.clone()));
        self.forget_if_over(run);
    }

    /// Cancels a run: queued groups leave the queue, running ones are told
    /// to stop (their GPUs stay held until the agent says it is done), and
    /// every job not yet ended is cancelled.
    pub fn cancel(&mut self, now: Now, run: RunId, note: Note) -> Result<(), String> {
        let Some(r) = self.runs.get_mut(&run) else {
            return Err(format!("run {run} is not running"));
        };
        if r.run.is_over() {
            return Err(format!("run {run} is already over"));
        }
        r.run.state = RunState::Cancelled;
        r.run.ended_unix_ms = Some(now.unix_ms);
        let reason = format!("run cancelled {note}");
        r.run.note = Some(note);
        let groups = r.groups.clone();
        self.persist(Write::Run(self.runs[&run].run.clone()));
        for g in groups {
            let key = (run, g);
            if let Some(entry) = self.groups.get_mut(&key) {
                entry.queued = false;
            }
            let open: Vec<u64> =
                self.group_jobs(key).filter(|j| !j.job.state.is_terminal()).map(|j| j.job.id).collect();
            for job in open {
                let jk = (run, job);
                if self.jobs[&jk].job.state.is_active() {
                    self.end_attempt(jk, AttemptOutcome::Cancelled, &reason, false, FailureKind::Host, now);
                } else if let Some(e) = self.jobs.get_mut(&jk) {
                    e.job.state = JobState::Cancelled;
                    e.job.error = Some(reason.clone());
                    self.persist_job(jk);
                }
            }
            let placement = self.groups.get(&key).and_then(|g| g.group.placement.clone());
            if let Some(p) = placement
                && let Some(session) = self.agents.get(&p.agent).and_then(|a| a.session.as_ref()).map(|s| s.epoch)
            {
                self.out.push(Command::Send {
                    agent: p.agent,
                    session,
                    msg: ToAgent::Cancel { run, group: g, reason: reason.clone() },
                });
            }
        }
        if let Some(r) = self.runs.get_mut(&run) {
            r.open = 0;
        }
        self.forget_if_over(run);
        Ok(())
    }

    /// Runs a finished (or cancelled) run's failed and cancelled jobs again,
    /// each with a fresh attempt cap; returns how many.
    pub fn retry(&mut self, now: Now, data: RunData) -> Result<u64, String> {
        let id = data.run.id;
        if self.runs.get(&id).is_some_and(|r| !r.run.is_over()) {
            return Err(format!("run {id} is still running; retry it once it has ended"));
        }
        let again =
            data.jobs.iter().filter(|j| matches!(j.state, JobState::Failed | JobState::Cancelled)).count() as u64;
        if again == 0 {
            return Err(format!("run {id} has no failed or cancelled jobs to retry"));
        }
        // A cancelled run's groups may still be stopping on their agents:
        // those placements are kept.
        let placements: HashMap<u64, Option<Placement>> = self
            .runs
            .get(&id)
            .map(|r| {
                r.groups
                    .iter()
                    .map(|g| (*g, self.groups.get(&(id, *g)).and_then(|e| e.group.placement.clone())))
                    .collect()
            })
            .unwrap_or_default();
        self.forget(id);
        let RunData { mut run, mut groups, mut jobs, summaries } = data;
        run.state = RunState::Running;
        run.ended_unix_ms = None;
        run.note = None;
        for j in jobs.iter_mut().filter(|j| matches!(j.state, JobState::Failed | JobState::Cancelled)) {
            j.state = JobState::Pending;
            j.error = None;
            j.retry_base = j.attempts.len() as u32;
        }
        for g in &mut groups {
            if let Some(p) = placements.get(&g.id) {
                g.placement = p.clone();
            }
            g.failed_on.clear();
        }
        self.persist(Write::Run(run.clone()));
        for j in jobs.iter().filter(|j| j.state == JobState::Pending) {
            self.persist(Write::Job(j.clone()));
        }
        for g in &groups {
            self.persist(Write::Group(g.clone()));
        }
        self.insert_run(RunData { run, groups, jobs, summaries }, now);
        Ok(again)
    }

    /// Drops an over run from memory once none of its groups holds GPUs.
    fn forget_if_over(&mut self, run: RunId) {
        let Some(r) = self.runs.get(&run) else { return };
        if !r.run.is_over() {
            return;
        }
        let placed = r.groups.iter().any(|g| self.groups.get(&(run, *g)).is_some_and(|e| e.group.placement.is_some()));
        if !placed {
            self.forget(run);
        }
    }

    fn forget(&mut self, run: RunId) {
        let Some(r) = self.runs.remove(&run) else { return };
        for g in r.groups {
            if let Some(e) = self.groups.remove(&(run, g)) {
                for j in e.group.jobs {
                    self.jobs.remove(&(run, j));
                }
            }
        }
    }

    // ------------------------------------------------------------ timers --

    /// Leases and deadlines, at `now`.
    pub fn tick(&mut self, now: Now) {
        let ids: Vec<AgentId> = self.agents.keys().copied().collect();
        for id in &ids {
            self.refresh(*id, now);
        }
        // Agents whose lease has run out.
        let ttl = self.config.lease_ttl;
        let watched: Vec<AgentId> = ids
            .iter()
            .copied()
            .filter(|id| self.agents.get(id).is_some_and(|a| !a.lost && (a.session.is_some() || !a.groups.is_empty())))
            .collect();
        let expired: Vec<AgentId> = watched
            .iter()
            .copied()
            .filter(|id| {
                let a = &self.agents[id];
                // An agent not heard from since the controller started has
                // until the restart grace ends.
                let expires = a.last_heard.map_or(self.grace_until, |t| t + ttl);
                now.at >= expires
            })
            .collect();
        let mass = watched.len() >= self.config.mass_silence_min_agents && expired.len() * 2 > watched.len();
        let held_since = *self.holding.get_or_insert(now.at);
        if mass && now.at < held_since + self.config.mass_silence_max_hold {
            if held_since == now.at {
                tracing::warn!(
                    silent = expired.len(),
                    of = watched.len(),
                    "most agents missed their heartbeats at once; assuming this controller is the one cut off: \
                     no agent is declared lost until they return (for at most {})",
                    human(self.config.mass_silence_max_hold)
                );
            }
        } else {
            if !mass {
                if held_since != now.at {
                    tracing::info!("agents are heard again; leases are enforced again");
                }
                self.holding = None;
            }
            for id in expired {
                self.lose(id, now);
            }
        }
        // Attempts past their deadline.
        let deadline = self.config.attempt_deadline;
        let late: Vec<(RunId, u64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.job.state.is_active() && j.active_since.is_some_and(|t| now.at >= t + deadline))
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            let Some(group) = self.jobs.get(&key).map(|j| j.job.group) else { continue };
            let reason = format!("job {} exceeded the attempt deadline of {}", key.1, human(deadline));
            self.abandon_group((key.0, group), &reason, Charge::Only(key.1), now);
        }
    }

    fn lose(&mut self, id: AgentId, now: Now) {
        let Some(a) = self.agents.get_mut(&id) else { return };
        a.lost = true;
        let name = a.rec.name.clone();
        let silent = a.last_heard.map(|t| now.at.saturating_duration_since(t));
        let groups: Vec<GroupKey> = a.groups.iter().copied().collect();
        let session = a.session.as_ref().map(|s| s.epoch);
        let reason = match silent {
            Some(d) => format!("agent {name} lost its lease (no heartbeat for {})", human(d)),
            None => format!("agent {name} did not come back within the controller's restart grace"),
        };
        tracing::warn!(agent = %id, %name, groups = groups.len(), "{reason}");
        for key in groups {
            self.abandon_group(key, &reason, Charge::Begun, now);
        }
        if let Some(session) = session {
            self.out.push(Command::CloseSession { agent: id, session, reason: reason.clone() });
        }
        if let Some(a) = self.agents.get_mut(&id) {
            a.session = None;
        }
        self.refresh(id, now);
    }

    // ---------------------------------------------------------- dispatch --

    /// Hands queued groups to agents that can run them, oldest first.
    pub fn dispatch(&mut self, now: Now) {
        if self.placeable.is_empty() {
            return;
        }
        let mut needs: Vec<(u64, Need)> =
            self.queue.iter().filter_map(|(n, q)| q.front().map(|(seq, _)| (*seq, n.clone()))).collect();
        needs.sort();
        for (_, need) in needs {
            if self.blocked.get(&need) == Some(&self.capacity) {
                continue;
            }
            loop {
                if self.placeable.is_empty() {
                    return;
                }
                let Some(&(_, key)) = self.queue.get(&need).and_then(|q| q.front()) else { break };
                let live = self.groups.get(&key).is_some_and(|g| g.queued && g.group.placement.is_none());
                let pending = self.group_jobs(key).any(|j| j.job.state == JobState::Pending);
                if !live || !pending {
                    self.pop(&need);
                    if let Some(g) = self.groups.get_mut(&key) {
                        g.queued = false;
                    }
                    continue;
                }
                let Some((agent, gpus)) = self.find_place(key, &need, now) else {
                    self.blocked.insert(need.clone(), self.capacity);
                    break;
                };
                self.pop(&need);
                self.place(key, agent, gpus, now);
            }
        }
    }

    fn pop(&mut self, need: &Need) {
        if let Some(q) = self.queue.get_mut(need) {
            q.pop_front();
            if q.is_empty() {
                self.queue.remove(need);
            }
        }
    }

    /// An agent for a group, preferring one it has not failed on.
    fn find_place(&self, key: GroupKey, need: &Need, now: Now) -> Option<(AgentId, Vec<String>)> {
        let failed_on = &self.groups.get(&key)?.group.failed_on;
        let model = self.groups.get(&key)?.group.gpu.clone();
        let fits = |id: &AgentId| -> Option<Vec<String>> {
            let a = self.agents.get(id)?;
            if !self.may_take_work(a, now.at) || !a.rec.runtimes.iter().any(|r| r == need.runtime.as_str()) {
                return None;
            }
            let free = self.free_gpus(a, model.as_deref());
            (free.len() >= need.gpus as usize).then(|| free.into_iter().take(need.gpus as usize).collect())
        };
        let fresh =
            self.placeable.iter().filter(|id| !failed_on.contains(id)).find_map(|id| fits(id).map(|g| (*id, g)));
        fresh.or_else(|| {
            self.placeable.iter().filter(|id| failed_on.contains(id)).find_map(|id| fits(id).map(|g| (*id, g)))
        })
    }

    fn place(&mut self, key: GroupKey, agent: AgentId, gpus: Vec<String>, now: Now) {
        let Some(a) = self.agents.get_mut(&agent) else { return };
        let Some(session) = a.session.as_ref().map(|s| s.epoch) else { return };
        let agent_name = a.rec.name.clone();
        a.groups.insert(key);
        let Some(g) = self.groups.get_mut(&key) else { return };
        g.queued = false;
        g.group.placement = Some(Placement { agent, gpus: gpus.clone(), epoch: session, since_unix_ms: now.unix_ms });
        let config = g.group.config.clone();
        let job_ids = g.group.jobs.clone();
        let mut jobs = Vec::new();
        for id in job_ids {
            let jk = (key.0, id);
            let Some(e) = self.jobs.get_mut(&jk) else { continue };
            if e.job.state != JobState::Pending {
                continue;
            }
            let j = &mut e.job;
            j.attempt += 1;
            j.epoch = session;
            j.state = JobState::Assigned;
            j.agent = Some(agent);
            j.error = None;
            j.log_tail = None;
            j.engine_startup_s = None;
            j.gpu_fingerprint.clear();
            j.pull_progress = None;
            j.prefix_cache = None;
            j.engine_version = None;
            j.image_digest = None;
            j.loadgen_args.clear();
            j.loadgen_version = None;
            j.telemetry = None;
            j.attempts.push(AttemptInfo {
                number: j.attempt,
                epoch: session,
                agent,
                agent_name: agent_name.clone(),
                started_unix_ms: now.unix_ms,
                ended_unix_ms: None,
                outcome: AttemptOutcome::Running,
                reason: None,
                charged: false,
                log_tail: None,
            });
            e.has_summary = false;
            e.active_since = None;
            let fence = Fence { key: j.key(), epoch: session };
            jobs.push(AssignedJob { fence, profile: j.profile.clone(), repeat: j.repeat });
            self.persist_job(jk);
            if fence.key.attempt > 1 {
                self.out.push(Command::Purge(fence.key));
            }
            self.out.push(Command::OpenFence(fence));
        }
        self.persist_group(key);
        tracing::info!(run = %key.0, group = key.1, %agent, name = %agent_name, ?gpus, "group assigned");
        self.out.push(Command::Send {
            agent,
            session,
            msg: ToAgent::Assign(Box::new(Assignment { run: key.0, group: key.1, epoch: session, config, jobs, gpus })),
        });
        self.refresh(agent, now);
    }

    // ----------------------------------------------------------- queries --

    /// Why a run's queued groups wait, one line per kind of need.
    pub fn waiting(&self, run: RunId, now: Now) -> Vec<String> {
        self.waits(run, now).into_iter().map(|(why, _)| why).collect()
    }

    /// Where a run's groups would go if it were submitted now, on a copy of
    /// the scheduler (nothing here changes, nothing is sent): each group's
    /// agent and GPU indices, or why it would wait, after the groups already
    /// queued took their turn.
    pub fn dry_run(&self, now: Now, run: Run, groups: Vec<Group>, jobs: Vec<Job>) -> DryRun {
        let id = run.id;
        let mut copy = self.clone();
        copy.out.clear();
        copy.submit(now, run, groups, jobs);
        copy.dispatch(now);
        let mut placed = Vec::new();
        for command in &copy.out {
            if let Command::Send { agent, msg: ToAgent::Assign(a), .. } = command
                && a.run == id
                && let Some(entry) = copy.agents.get(agent)
            {
                let gpus = a
                    .gpus
                    .iter()
                    .filter_map(|uuid| entry.rec.gpus.iter().find(|g| &g.uuid == uuid).map(|g| g.index))
                    .collect();
                placed.push(DryPlacement { group: a.group, agent: entry.rec.name.clone(), gpus });
            }
        }
        DryRun { placed, waiting: copy.waiting(id, now) }
    }

    /// Warnings for a run just submitted: groups that no agent can take now
    /// for another reason than that their GPUs are busy.
    pub fn submit_warnings(&self, run: RunId, now: Now) -> Vec<String> {
        self.waits(run, now).into_iter().filter(|(_, busy)| !busy).map(|(why, _)| why).collect()
    }

    /// Why each kind of need of the run waits, and whether only because
    /// the GPUs it could use are busy.
    fn waits(&self, run: RunId, now: Now) -> Vec<(String, bool)> {
        let mut needs: Vec<Need> = self
            .runs
            .get(&run)
            .map(|r| {
                r.groups
                    .iter()
                    .filter_map(|g| self.groups.get(&(run, *g)))
                    .filter(|g| g.queued)
                    .map(|g| Need::of(&g.group))
                    .collect()
            })
            .unwrap_or_default();
        needs.sort();
        needs.dedup();
        needs.iter().map(|n| self.why_waiting(n, now)).collect()
    }

    /// What keeps groups of a need from being placed, and whether it is only
    /// that the GPUs are busy.
    fn why_waiting(&self, need: &Need, now: Now) -> (String, bool) {
        let why = |s: String| (s, false);
        let what = need.describe();
        let with_runtime: Vec<&AgentEntry> =
            self.agents.values().filter(|a| a.rec.runtimes.iter().any(|r| r == need.runtime.as_str())).collect();
        let capable: Vec<&AgentEntry> = with_runtime.iter().copied().filter(|a| need.could_run(&a.rec)).collect();
        if self.agents.is_empty() {
            return why(format!("waiting for an agent: none has connected (each job needs {what})"));
        }
        if with_runtime.is_empty() {
            return why(format!("no agent runs engines with the {} runtime", need.runtime.as_str()));
        }
        if capable.is_empty() {
            return why(format!("no agent has {what}"));
        }
        let names = |v: &[&AgentEntry]| v.iter().map(|a| a.rec.name.as_str()).collect::<Vec<_>>().join(", ");
        let live: Vec<&AgentEntry> =
            capable.iter().copied().filter(|a| self.liveness_of(a, now.at) == Liveness::Ready).collect();
        if live.is_empty() {
            return why(format!("the agents with {what} ({}) are not connected", names(&capable)));
        }
        let open: Vec<&AgentEntry> = live.iter().copied().filter(|a| a.rec.drain.is_none() && !a.leaving).collect();
        if open.is_empty() {
            return why(format!("the agents with {what} ({}) are drained or shutting down", names(&live)));
        }
        let usable = |a: &AgentEntry| need.gpus(&a.rec).filter(|g| g.usable).count() >= need.gpus as usize;
        if !open.iter().any(|a| usable(a)) {
            let reasons: Vec<String> = open
                .iter()
                .flat_map(|a| {
                    a.rec
                        .gpus
                        .iter()
                        .filter(|g| !g.usable)
                        .map(move |g| format!("{} GPU {}: {}", a.rec.name, g.index, g.reasons.join("; ")))
                })
                .collect();
            return why(format!("no agent has {what} that passes its GPU checks ({})", reasons.join("; ")));
        }
        (format!("waiting for free GPUs: every agent with {what} is busy"), true)
    }

    /// The runs the scheduler holds: in progress, or over with groups still
    /// stopping.
    pub fn run_ids(&self) -> impl Iterator<Item = RunId> + '_ {
        self.runs.keys().copied()
    }

    pub fn agent_ids(&self) -> impl Iterator<Item = AgentId> + '_ {
        self.agents.keys().copied()
    }

    /// One agent as the operator sees it.
    pub fn agent_view(&self, id: AgentId, now: Now) -> Option<AgentView> {
        let a = self.agents.get(&id)?;
        Some(AgentView {
            rec: a.rec.clone(),
            liveness: self.liveness_of(a, now.at),
            lease_age: a.last_heard.map(|t| now.at.saturating_duration_since(t)),
            connected: a.session.is_some(),
            session: a.session.as_ref().map(|s| s.epoch),
            leaving: a.leaving,
            groups: a.groups.iter().copied().collect(),
        })
    }

    /// Whether a group placed on the agent named `agent` has a job that
    /// names the file `sha256` (its ShareGPT dataset or its tokenizer): an
    /// agent may fetch only those.
    pub fn agent_needs_file(&self, agent: &str, sha256: &str) -> bool {
        let Ok(id) = self.find_agent(agent) else { return false };
        let Some(a) = self.agents.get(&id) else { return false };
        a.groups.iter().filter_map(|key| self.groups.get(key)).any(|g| {
            g.group.jobs.iter().filter_map(|j| self.jobs.get(&(g.group.run, *j))).any(|j| {
                let p = &j.job.profile;
                matches!(&p.dataset, crate::model::Dataset::Sharegpt { sha256: s, .. } if s == sha256)
                    || p.processor.as_ref().is_some_and(|f| f.sha256 == sha256)
            })
        })
    }

    /// A new agent id, never given before (a joining agent's, written into
    /// its certificate).
    pub fn next_agent_id(&mut self) -> AgentId {
        let id = AgentId(self.counters.next_agent.max(1));
        self.counters.next_agent = id.0 + 1;
        self.persist(Write::Counters(self.counters));
        id
    }

    /// An agent joined with a certificate for `id` (from `next_agent_id`):
    /// its record is stored before it ever connects, and its name is its
    /// from now on (an earlier agent of that name keeps its own id).
    pub fn enrolled(&mut self, now: Now, id: AgentId, name: &str, certificate: AgentCertificate) {
        let entry = self.agents.entry(id).or_insert_with(|| AgentEntry::new(id, name, now));
        entry.rec.certificate = Some(certificate);
        self.by_name.insert(name.to_owned(), id);
        self.persist_agent(id);
    }

    /// An agent's certificate was renewed.
    pub fn renewed(&mut self, id: AgentId, certificate: AgentCertificate) -> Result<(), String> {
        let a = self.agents.get_mut(&id).ok_or_else(|| format!("{id} is not enrolled with this controller"))?;
        a.rec.certificate = Some(certificate);
        self.persist_agent(id);
        Ok(())
    }

    /// Every agent of `name` that holds a certificate is revoked: the note
    /// is kept on its record, and a live session is closed (its lease then
    /// runs out as any silent agent's). Returns how many.
    pub fn revoke(&mut self, name: &str, note: Note) -> usize {
        let ids: Vec<AgentId> = self
            .agents
            .iter()
            .filter(|(_, a)| a.rec.name == name && a.rec.certificate.as_ref().is_some_and(|c| c.revoked.is_none()))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            let Some(a) = self.agents.get_mut(id) else { continue };
            if let Some(c) = a.rec.certificate.as_mut() {
                c.revoked = Some(note.clone());
            }
            if let Some(s) = &a.session {
                self.out.push(Command::CloseSession {
                    agent: *id,
                    session: s.epoch,
                    reason: format!("its certificate was revoked by {}", note.by),
                });
            }
            self.persist_agent(*id);
        }
        ids.len()
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

/// What submitting a run now would do (`Scheduler::dry_run`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DryRun {
    pub placed: Vec<DryPlacement>,
    /// Why the groups not placed would wait.
    pub waiting: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DryPlacement {
    pub group: u64,
    pub agent: String,
    /// GPU indices on the agent.
    pub gpus: Vec<u32>,
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
