//! The scheduler's driver: the one thread that owns the [`Scheduler`],
//! feeds it the events the gRPC services send, and carries out what it
//! asks, in order: the store writes of a whole batch of events in one
//! transaction and one flush, then the fences (to the ingest committer),
//! then the messages to agents. Nothing is sent before what it depends on is
//! durable, and no store I/O happens on the async threads.
//!
//! `Controller` is the handle the services hold: it sends events (stamped
//! with their time of arrival, so a busy driver costs nobody a lease) and
//! awaits the answers of those that have one. The driver's inbox is bounded
//! (`INBOX`): a sender that finds it full waits for room, so a flood is held
//! back where it comes from (an agent's session stream stops being read)
//! instead of growing the controller's memory. It also keeps `tasks`, the
//! tracker every task the services spawn runs under, so that `serve` can
//! wait for them all when it stops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::digests::Digester;
use crate::ingest::Ingest;
use crate::plan::{self, Next, Prepared};
use crate::records::GpuState;
use crate::sched::{
    self, AgentView, Command, Hello, Now, Refused, RunData, SchedConfig, SchedError, Scheduler, ToAgent, Update,
    Welcome,
};
use crate::store::{Store, StoreError};
use benchfleet_study::model::{AgentId, AttemptKey, JobState, Note, RunId};

/// What the controller needs to know at start.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The URL loadgen reaches the ingest service at, as agents see it.
    pub advertise_url: String,
    pub sched: SchedConfig,
    /// How often leases and deadlines are checked.
    pub tick: Duration,
    /// TLS, with client certificates checked by `auth`; `None` serves plain
    /// text and checks no one.
    pub tls: Option<crate::pki::ServerTls>,
    /// The CA, to sign agents' certificates at join and renewal; `None`
    /// when this controller holds no CA key.
    pub ca: Option<Arc<crate::pki::Ca>>,
    /// Under TLS, the key of the attempts' ingest credentials: record
    /// batches need their attempt's. `None`: ingest checks no credential.
    pub ingest_key: Option<crate::auth::IngestKey>,
    /// How long the certificates agents get at join and renewal last.
    pub agent_lifetime: Duration,
}

impl ControllerConfig {
    /// Serves TLS with `tls`; with `pki` (the `--pki-dir`) holding the CA's
    /// key, agents can join and renew; record batches then need their
    /// attempt's credential, under `pki`'s ingest key (made when missing).
    pub fn secure(&mut self, tls: crate::pki::ServerTls, pki: &std::path::Path) -> Result<(), crate::pki::PkiError> {
        if pki.join(crate::pki::CA_KEY).is_file() && pki.join(crate::pki::CA_CERT).is_file() {
            self.ca = Some(Arc::new(crate::pki::Ca::load(pki)?));
        }
        self.ingest_key = Some(crate::auth::IngestKey::read_or_make(pki)?);
        self.tls = Some(tls);
        Ok(())
    }

    pub fn new(advertise_url: impl Into<String>) -> ControllerConfig {
        ControllerConfig {
            advertise_url: advertise_url.into(),
            sched: SchedConfig::default(),
            tick: Duration::from_millis(250),
            tls: None,
            ca: None,
            ingest_key: None,
            agent_lifetime: crate::pki::AGENT_LIFETIME,
        }
    }
}

/// What goes down an agent's session.
#[derive(Clone, Debug)]
pub enum Outbound {
    Welcome(Welcome),
    Msg(ToAgent),
}

/// An agent session's sending side, held by the driver while the session
/// is the agent's.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    pub tx: tokio::sync::mpsc::Sender<Outbound>,
    /// Cancelled when the controller ends the session.
    pub closed: CancellationToken,
}

/// Events without an answer.
#[derive(Debug)]
pub enum Event {
    Heartbeat { agent: AgentId, session: u64, seq: u64 },
    SessionClosed { agent: AgentId, session: u64 },
    Leaving { agent: AgentId, session: u64 },
    GpuReport { agent: AgentId, session: u64, gpus: Vec<GpuState> },
    JobUpdate { agent: AgentId, session: u64, update: Box<Update> },
    GroupDone { agent: AgentId, session: u64, run: RunId, group: u64, epoch: u64 },
    SummaryStored(AttemptKey),
    Tick,
}

type Query = Box<dyn FnOnce(&Scheduler, Now) + Send>;
/// A change of the scheduler's state; what it returns is sent once the
/// batch's writes are stored.
type Change = Box<dyn FnOnce(&mut Scheduler, Now) -> Reply + Send>;

enum Input {
    Event(Now, Event),
    Hello(Now, Box<Hello>, SessionHandle, oneshot::Sender<Result<Welcome, Refused>>),
    Submit(Now, Box<Prepared>, oneshot::Sender<Vec<String>>),
    DryRun(Now, Box<Prepared>, oneshot::Sender<crate::sched::DryRun>),
    FleetTargets(Now, crate::plan::FleetAsk, oneshot::Sender<crate::sched::Targets>),
    Cancel(Now, RunId, Note, oneshot::Sender<Result<(), SchedError>>),
    Retry(Now, RunId, oneshot::Sender<Result<u64, SchedError>>),
    Drain(Now, String, Option<Note>, oneshot::Sender<Result<AgentId, SchedError>>),
    Query(Now, Query),
    Change(Now, Change),
    Stop(oneshot::Sender<()>),
}

/// Most events taken into one batch.
const MAX_BATCH: usize = 1024;

/// Inputs waiting for the driver: one batch's worth, queued while the batch
/// before it is applied, so a driver that keeps up takes all that waited
/// into its next batch and no sender waits on it. It also bounds what a
/// flood can make the controller hold: this many inputs, each from at most
/// one gRPC message (`service::MAX_MESSAGE_BYTES`; a job update with its
/// telemetry series is the largest, a heartbeat a few dozen bytes). A
/// sender that finds it full waits for room, in turn: a session's task then
/// stops reading its agent's stream, whose HTTP/2 window holds the agent
/// back; the ingest committer's thread waits before it acknowledges.
/// Nothing is dropped, and each sender's inputs stay in the order it sent
/// them.
pub const INBOX: usize = MAX_BATCH;

/// The running controller's scheduling side.
pub struct Controller {
    tx: mpsc::Sender<Input>,
    store: Arc<dyn Store>,
    pub ingest: Ingest,
    pub config: ControllerConfig,
    changed: watch::Sender<u64>,
    /// Cancelled when the controller stops: streams end.
    pub shutdown: CancellationToken,
    /// Every task spawned for a session, stream or call (and the lease
    /// timer): `serve` closes it when the controller stops and waits until
    /// they have all ended. A task under it ends soon after `shutdown`:
    /// none waits on a client once the controller stops.
    pub tasks: TaskTracker,
    /// Set when the driver stopped the controller itself.
    halted: Arc<OnceLock<Halted>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    digester: Digester,
    /// The certificates no longer trusted.
    pub revoked: crate::auth::Revoked,
    /// Join tokens, agents' certificates, revocations (`enrol`).
    enrolment: Mutex<crate::enrol::Enrolment>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The time of an event, read as it arrives.
pub fn now() -> Now {
    Now { at: Instant::now(), unix_ms: plan::unix_ms() }
}

impl Controller {
    /// Changes the enrolment state and stores it (flushed) before it
    /// answers; a change the store refuses is not kept.
    pub fn enrol<T>(&self, change: impl FnOnce(&mut crate::enrol::Enrolment) -> T) -> Result<T, StoreError> {
        let mut state = self.enrolment.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = state.clone();
        let out = change(&mut next);
        if next != *state {
            self.store.put_enrolment(&next.to_json())?;
            *state = next;
        }
        Ok(out)
    }
    /// Opens the controller over a store: the scheduler is restored from it
    /// (runs in progress go on, known agents get the restart grace to come
    /// back), and what a restart owes (fences of running attempts, stages
    /// that ended while no controller ran) is done before this returns.
    /// Must be called inside a Tokio runtime (the lease timer runs on it).
    pub fn start(store: Arc<dyn Store>, config: ControllerConfig) -> Result<Arc<Controller>, StoreError> {
        let enrolment = match store.enrolment()? {
            Some(json) => crate::enrol::Enrolment::from_json(&json)
                .map_err(|reason| StoreError::Corrupt { what: "enrolment".to_owned(), reason })?,
            None => crate::enrol::Enrolment::default(),
        };
        let revoked = crate::auth::Revoked::default();
        for r in &enrolment.revoked {
            revoked.insert(r.name.clone(), r.at_unix);
        }
        let (tx, rx) = mpsc::channel(INBOX);
        let summaries = tx.clone();
        let (digester, digest_rx) = Digester::new();
        let to_digest = digester.queue();
        let (ingest, ingest_thread) = Ingest::start(store.clone(), move |key, summary| {
            // On the committer's thread, before the batch is acknowledged:
            // the event is queued ahead of whatever the agent sends once
            // loadgen has the ack. While the inbox is full, this wait holds
            // the acknowledgements back.
            let _ = summaries.blocking_send(Input::Event(now(), Event::SummaryStored(key)));
            let _ = to_digest.send(Some((key, benchfleet_core::digest::records_of(summary))));
        });
        let digest_thread = digester.run(store.clone(), ingest.clone(), digest_rx);
        let mut runs = Vec::new();
        for run in store.runs()? {
            let groups = store.groups(run.id)?;
            // Over runs matter only while a group of theirs still holds GPUs.
            if run.is_over() && groups.iter().all(|g| g.placement.is_none()) {
                continue;
            }
            let mut jobs = store.jobs(run.id)?;
            for j in &mut jobs {
                j.summary = None;
            }
            runs.push(RunData { summaries: store.summarized(run.id)?, run, groups, jobs });
        }
        let at = now();
        let (sched, first) = Scheduler::restore(config.sched.clone(), at, store.counters()?, store.agents()?, runs);
        let changed = watch::channel(0).0;
        let shutdown = CancellationToken::new();
        let halted = Arc::new(OnceLock::new());
        let mut driver = Driver {
            sched,
            store: store.clone(),
            ingest: ingest.clone(),
            sessions: HashMap::new(),
            changed: changed.clone(),
            shutdown: shutdown.clone(),
            halted: halted.clone(),
        };
        if let Err(e) = driver.execute(first, at) {
            ingest.stop();
            digester.stop();
            return Err(e);
        }
        let thread = std::thread::Builder::new()
            .name("scheduler".to_owned())
            .spawn(move || driver.run(rx))
            .expect("a thread can be spawned");
        let controller = Arc::new(Controller {
            tx,
            store,
            ingest,
            config,
            changed,
            shutdown,
            tasks: TaskTracker::new(),
            halted,
            threads: Mutex::new(vec![thread, ingest_thread, digest_thread]),
            digester,
            revoked,
            enrolment: Mutex::new(enrolment),
        });
        let ticker = Arc::downgrade(&controller);
        let every = controller.config.tick;
        let stop = controller.shutdown.clone();
        controller.tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(c) = ticker.upgrade() else { return };
                c.event(Event::Tick).await;
            }
        });
        Ok(controller)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Why the controller stopped itself, if it did (its shutdown token is
    /// then cancelled, so `serve` returns): the binary exits with an error.
    pub fn halted(&self) -> Option<&Halted> {
        self.halted.get()
    }

    /// Queues an input, waiting while the inbox is full; false once the
    /// driver has stopped.
    async fn send(&self, input: Input) -> bool {
        self.tx.send(input).await.is_ok()
    }

    /// Sends an event, stamped now; it is applied in arrival order. Waits
    /// while the driver's inbox is full (`INBOX`).
    pub async fn event(&self, event: Event) {
        self.send(Input::Event(now(), event)).await;
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Input) -> Result<T, Stopped> {
        let (reply, rx) = oneshot::channel();
        if !self.send(make(reply)).await {
            return Err(Stopped);
        }
        rx.await.map_err(|_| Stopped)
    }

    pub async fn hello(&self, hello: Hello, session: SessionHandle) -> Result<Result<Welcome, Refused>, Stopped> {
        self.ask(|r| Input::Hello(now(), Box::new(hello), session, r)).await
    }

    /// Queues a stored run; answers with warnings for the operator.
    pub async fn submit(&self, prepared: Prepared) -> Result<Vec<String>, Stopped> {
        self.ask(|r| Input::Submit(now(), Box::new(prepared), r)).await
    }

    /// Where a prepared run would be placed now; nothing is stored or sent.
    pub async fn dry_run(&self, prepared: Prepared) -> Result<crate::sched::DryRun, Stopped> {
        self.ask(|r| Input::DryRun(now(), Box::new(prepared), r)).await
    }

    /// What a fleet check would run on now, and the hosts it leaves out.
    pub async fn fleet_targets(&self, ask: crate::plan::FleetAsk) -> Result<crate::sched::Targets, Stopped> {
        self.ask(|r| Input::FleetTargets(now(), ask, r)).await
    }

    pub async fn cancel(&self, run: RunId, note: Note) -> Result<Result<(), SchedError>, Stopped> {
        self.ask(|r| Input::Cancel(now(), run, note, r)).await
    }

    pub async fn retry(&self, run: RunId) -> Result<Result<u64, SchedError>, Stopped> {
        self.ask(|r| Input::Retry(now(), run, r)).await
    }

    /// Drains (with a note) or undrains (without) an agent, by id or name.
    pub async fn drain(&self, agent: String, note: Option<Note>) -> Result<Result<AgentId, SchedError>, Stopped> {
        self.ask(|r| Input::Drain(now(), agent, note, r)).await
    }

    /// Runs `f` over the scheduler's state, on its thread.
    pub async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Scheduler, Now) -> T + Send + 'static,
    ) -> Result<T, Stopped> {
        self.ask(|reply| {
            Input::Query(
                now(),
                Box::new(move |s: &Scheduler, now: Now| {
                    let _ = reply.send(f(s, now));
                }),
            )
        })
        .await
    }

    /// Changes the scheduler's state with `f`, on its thread; answers once
    /// what it asked to store is stored.
    pub async fn change<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Scheduler, Now) -> T + Send + 'static,
    ) -> Result<T, Stopped> {
        self.ask(|reply| {
            Input::Change(
                now(),
                Box::new(move |s: &mut Scheduler, now: Now| {
                    let out = f(s, now);
                    let reply: Reply = Box::new(move || {
                        let _ = reply.send(out);
                    });
                    reply
                }),
            )
        })
        .await
    }

    pub async fn agents(&self) -> Result<Vec<AgentView>, Stopped> {
        self.query(|s, now| s.agent_ids().filter_map(|id| s.agent_view(id, now)).collect()).await
    }

    /// Bumped after every batch of events.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Stops the controller: every stream ends, what is queued is written,
    /// and the driver and committer threads end.
    pub async fn stop(&self) {
        self.shutdown.cancel();
        self.digester.stop();
        let _ = self.ask(Input::Stop).await;
        let threads: Vec<_> = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// The controller has stopped.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the controller is shutting down")]
pub struct Stopped;

/// Why the driver stopped the controller: writing the scheduler's state
/// kept failing, and going on would let memory and the store disagree (a
/// restart takes up from what was stored).
#[derive(Debug, Clone, thiserror::Error)]
#[error("writing the scheduler's state keeps failing ({0}); the controller stopped")]
pub struct Halted(pub String);

struct Driver {
    sched: Scheduler,
    store: Arc<dyn Store>,
    ingest: Ingest,
    /// The current session of each connected agent.
    sessions: HashMap<AgentId, (u64, SessionHandle)>,
    changed: watch::Sender<u64>,
    /// The controller's, cancelled when the driver halts.
    shutdown: CancellationToken,
    halted: Arc<OnceLock<Halted>>,
}

/// An answer sent once the batch's writes are durable.
type Reply = Box<dyn FnOnce()>;

impl Driver {
    /// Takes inputs until `Stop`; the inbox closes when this returns (it
    /// owns the receiver), so senders still waiting for room are told the
    /// controller stopped.
    fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        loop {
            let Some(first) = rx.blocking_recv() else { break };
            let mut replies: Vec<Reply> = Vec::new();
            let mut welcomes: Vec<(AgentId, u64, SessionHandle, Welcome)> = Vec::new();
            let mut stop = None;
            let mut last = now();
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(input) = next.take() {
                taken += 1;
                match input {
                    Input::Stop(reply) => stop = Some(reply),
                    other => last = self.handle(other, &mut replies, &mut welcomes),
                }
                // Inputs that read the store wait for the writes before them.
                if taken < MAX_BATCH && stop.is_none() {
                    next = rx.try_recv().ok();
                    if matches!(next, Some(Input::Retry(..)))
                        && let Err(e) = self.finish_batch(last, &mut welcomes, &mut replies)
                    {
                        return self.halt(&e);
                    }
                }
            }
            if let Err(e) = self.finish_batch(last, &mut welcomes, &mut replies) {
                return self.halt(&e);
            }
            if let Some(reply) = stop {
                self.close_all("the controller is shutting down");
                self.ingest.stop();
                if let Err(e) = self.store.flush() {
                    tracing::error!("flushing the store at shutdown failed: {e}");
                }
                let _ = reply.send(());
                return;
            }
        }
        self.ingest.stop();
    }

    /// Stops the controller after a write of the scheduler's state failed
    /// for good: nothing that depends on it is sent, answers still owed are
    /// dropped (their callers see `Stopped`), every session ends, and the
    /// controller's shutdown begins.
    fn halt(&mut self, e: &StoreError) {
        let halted = Halted(e.to_string());
        tracing::error!("{halted}");
        let _ = self.halted.set(halted);
        self.close_all("the controller is stopping");
        self.ingest.stop();
        self.shutdown.cancel();
    }

    /// Dispatches, carries out the batch's commands, then delivers welcomes
    /// and answers; a write that fails for good stops it there.
    fn finish_batch(
        &mut self,
        now: Now,
        welcomes: &mut Vec<(AgentId, u64, SessionHandle, Welcome)>,
        replies: &mut Vec<Reply>,
    ) -> Result<(), StoreError> {
        self.sched.dispatch(now);
        let mut commands = self.sched.take_commands();
        // Welcomes go out right after the writes they depend on, before
        // anything else is sent down their sessions.
        let (writes, rest): (Vec<Command>, Vec<Command>) =
            commands.drain(..).partition(|c| matches!(c, Command::Persist(_)));
        self.execute(writes, now)?;
        for (agent, epoch, handle, welcome) in welcomes.drain(..) {
            if handle.tx.try_send(Outbound::Welcome(welcome)).is_ok() {
                if let Some((_, old)) = self.sessions.insert(agent, (epoch, handle)) {
                    old.closed.cancel();
                }
            } else {
                self.sched.session_closed(now, agent, epoch);
            }
        }
        self.execute(rest, now)?;
        for reply in replies.drain(..) {
            reply();
        }
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    fn handle(
        &mut self,
        input: Input,
        replies: &mut Vec<Reply>,
        welcomes: &mut Vec<(AgentId, u64, SessionHandle, Welcome)>,
    ) -> Now {
        match input {
            Input::Event(now, event) => {
                self.apply(now, event);
                now
            }
            Input::Hello(now, hello, handle, reply) => {
                let answer = self.sched.hello(now, *hello);
                if let Ok(w) = &answer {
                    welcomes.push((w.agent, w.epoch, handle, w.clone()));
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::Submit(now, prepared, reply) => {
                let Prepared { run, groups, jobs, .. } = *prepared;
                let id = run.id;
                self.sched.submit(now, run, groups, jobs);
                self.sched.dispatch(now);
                let warnings = self.sched.submit_warnings(id, now);
                replies.push(Box::new(move || {
                    let _ = reply.send(warnings);
                }));
                now
            }
            Input::FleetTargets(now, ask, reply) => {
                let answer = self.sched.fleet_targets(
                    now,
                    ask.per,
                    (ask.gpu.as_deref(), ask.gpus_per_job),
                    ask.runtime,
                    ask.hosts.as_ref(),
                );
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::DryRun(now, prepared, reply) => {
                let Prepared { run, groups, jobs, .. } = *prepared;
                let answer = self.sched.dry_run(now, run, groups, jobs);
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::Cancel(now, run, note, reply) => {
                let answer = self.sched.cancel(now, run, note).map_err(|e| self.known(e));
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::Retry(now, run, reply) => {
                let answer = self.load(run).and_then(|data| self.sched.retry(now, data));
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::Drain(now, agent, note, reply) => {
                let answer = match note {
                    Some(note) => self.sched.drain(now, &agent, note),
                    None => self.sched.undrain(now, &agent),
                };
                replies.push(Box::new(move || {
                    let _ = reply.send(answer);
                }));
                now
            }
            Input::Query(now, f) => {
                f(&self.sched, now);
                now
            }
            Input::Change(now, f) => {
                replies.push(f(&mut self.sched, now));
                now
            }
            Input::Stop(_) => now(),
        }
    }

    /// A run the scheduler does not hold is over, or was never submitted:
    /// the store tells which.
    fn known(&self, e: SchedError) -> SchedError {
        let SchedError::NotRunning(run) = e else { return e };
        match self.store.run(run) {
            Ok(Some(_)) => e,
            Ok(None) => SchedError::NoSuchRun(run),
            Err(e) => SchedError::Store(e.to_string()),
        }
    }

    /// A run as the store holds it, for a retry.
    fn load(&self, run: RunId) -> Result<RunData, SchedError> {
        let read = || -> Result<Option<RunData>, StoreError> {
            let Some(r) = self.store.run(run)? else { return Ok(None) };
            let mut jobs = self.store.jobs(run)?;
            for j in &mut jobs {
                j.summary = None;
            }
            Ok(Some(RunData { groups: self.store.groups(run)?, jobs, summaries: self.store.summarized(run)?, run: r }))
        };
        match read() {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err(SchedError::NoSuchRun(run)),
            Err(e) => Err(SchedError::Store(e.to_string())),
        }
    }

    fn apply(&mut self, now: Now, event: Event) {
        let s = &mut self.sched;
        match event {
            Event::Heartbeat { agent, session, seq } => s.heartbeat(now, agent, session, seq),
            Event::SessionClosed { agent, session } => {
                s.session_closed(now, agent, session);
                if self.sessions.get(&agent).is_some_and(|(e, _)| *e == session) {
                    self.sessions.remove(&agent);
                }
            }
            Event::Leaving { agent, session } => s.leaving(now, agent, session),
            Event::GpuReport { agent, session, gpus } => s.gpu_report(now, agent, session, gpus),
            Event::JobUpdate { agent, session, update } => {
                if !s.job_update(now, agent, session, *update) {
                    tracing::debug!(%agent, "ignored an update of a stale attempt");
                }
            }
            Event::GroupDone { agent, session, run, group, epoch } => {
                if !s.group_done(now, agent, session, run, group, epoch) {
                    tracing::debug!(%agent, %run, group, "ignored the end of a group not placed there");
                }
            }
            Event::SummaryStored(key) => s.summary_stored(key),
            Event::Tick => s.tick(now),
        }
    }

    /// Carries out commands until the scheduler has none left (planning a
    /// stage or a failed send makes more); nothing after a write that failed
    /// for good.
    fn execute(&mut self, mut commands: Vec<Command>, now: Now) -> Result<(), StoreError> {
        while !commands.is_empty() {
            let mut writes = Vec::new();
            let mut rest = Vec::new();
            for c in commands {
                match c {
                    Command::Persist(w) => writes.push(w),
                    other => rest.push(other),
                }
            }
            self.persist(&writes)?;
            let mut more = false;
            for c in rest {
                match c {
                    Command::Persist(_) => {}
                    Command::OpenFence(f) => self.ingest.open(f),
                    Command::CloseFence(k) => self.ingest.close(k),
                    Command::Purge(k) => self.ingest.purge(k),
                    Command::Send { agent, session, msg } => {
                        let sent = match self.sessions.get(&agent) {
                            Some((epoch, h)) if *epoch == session => h.tx.try_send(Outbound::Msg(msg)).is_ok(),
                            // The session is gone; the lease decides.
                            _ => true,
                        };
                        if !sent {
                            // A session that cannot take a message (full or
                            // closed) is ended: the agent reconnects and says
                            // what it runs, so nothing is lost in between.
                            tracing::warn!(%agent, "the agent's session is not taking messages; ending it");
                            self.close(agent, session);
                            self.sched.session_closed(now, agent, session);
                            more = true;
                        }
                    }
                    Command::CloseSession { agent, session, reason } => {
                        tracing::info!(%agent, "ending session: {reason}");
                        self.close(agent, session);
                    }
                    Command::RunEnded(run) => {
                        match plan::next(self.store.as_ref(), run) {
                            Ok(Next::Stage { groups, jobs }) => self.sched.add_stage(now, run, groups, jobs),
                            Ok(Next::Finished) => self.sched.finish_run(now, run),
                            Err(e) => {
                                tracing::error!(%run, "cannot plan the run's next stage, so it ends here: {e}");
                                self.sched.finish_run(now, run);
                            }
                        }
                        more = true;
                    }
                }
            }
            if more {
                self.sched.dispatch(now);
            }
            commands = self.sched.take_commands();
        }
        Ok(())
    }

    /// Writes the scheduler's state, trying again a few times (about 1.5 s
    /// in all); an error here is for good.
    fn persist(&self, writes: &[crate::records::Write]) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut wait = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match self.store.apply(writes) {
                Ok(()) => return Ok(()),
                Err(e) if attempt < 6 => {
                    tracing::error!("writing the scheduler's state failed (try {attempt}): {e}");
                    std::thread::sleep(wait);
                    wait *= 2;
                    attempt += 1;
                }
                // Going on would let memory and the store disagree.
                Err(e) => return Err(e),
            }
        }
    }

    fn close(&mut self, agent: AgentId, session: u64) {
        if self.sessions.get(&agent).is_some_and(|(e, _)| *e == session)
            && let Some((_, h)) = self.sessions.remove(&agent)
        {
            h.closed.cancel();
        }
    }

    fn close_all(&mut self, reason: &str) {
        for (agent, (_, h)) in self.sessions.drain() {
            tracing::debug!(%agent, "ending session: {reason}");
            h.closed.cancel();
        }
    }
}

/// A run's progress as `watch` shows it, from the scheduler's state.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub by_state: Vec<(JobState, u64)>,
    /// (agent, name, running, done)
    pub agents: Vec<(AgentId, String, u64, u64)>,
    pub waiting: Vec<String>,
    pub eta_s: Option<f64>,
    pub stage: u32,
}

/// The progress of a run the scheduler holds; `None` for one it does not
/// (over, or unknown).
pub fn progress(s: &Scheduler, run: RunId, now: Now) -> Option<Progress> {
    let (_, jobs, groups) = s.run_jobs(run)?;
    let mut by_state: HashMap<JobState, u64> = HashMap::new();
    let mut per_agent: std::collections::BTreeMap<AgentId, (u64, u64)> = Default::default();
    for j in &jobs {
        *by_state.entry(j.state).or_default() += 1;
        if let Some(a) = j.agent {
            let e = per_agent.entry(a).or_default();
            if j.state.is_active() {
                e.0 += 1;
            } else if j.state == JobState::Succeeded {
                e.1 += 1;
            }
        }
    }
    let stage = groups.iter().map(|g| g.stage).max().unwrap_or(1);
    let in_stage: Vec<&&benchfleet_study::model::Job> =
        jobs.iter().filter(|j| groups.iter().any(|g| g.id == j.group && g.stage == stage)).collect();
    let durations: Vec<f64> = in_stage
        .iter()
        .filter(|j| j.state == JobState::Succeeded)
        .filter_map(|j| j.current())
        .filter_map(|a| a.ended_unix_ms.map(|e| (e - a.started_unix_ms) as f64 / 1e3))
        .collect();
    let left = in_stage.iter().filter(|j| !j.state.is_terminal()).count() as f64;
    let placed = groups.iter().filter(|g| g.stage == stage && g.placement.is_some()).count().max(1) as f64;
    let eta_s = (!durations.is_empty() && left > 0.0)
        .then(|| durations.iter().sum::<f64>() / durations.len() as f64 * (left / placed).ceil());
    let agents = per_agent
        .into_iter()
        .map(|(id, (running, done))| {
            let name = s.agent_view(id, now).map(|v| v.rec.name).unwrap_or_default();
            (id, name, running, done)
        })
        .collect();
    let mut by_state: Vec<(JobState, u64)> = by_state.into_iter().collect();
    by_state.sort_by_key(|(state, _)| JobState::ALL.iter().position(|s| s == state));
    Some(Progress { by_state, agents, waiting: s.waiting(run, now), eta_s, stage })
}

pub use sched::human;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// More events than the inbox holds, sent while the driver is busy:
    /// the sender fills the inbox and then waits (nothing more is queued);
    /// once the driver goes on, every event is applied, in the order sent.
    #[tokio::test]
    async fn a_flood_waits_for_room_in_the_inbox_and_nothing_is_lost_or_reordered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(crate::SledStore::open(dir.path()).expect("store"));
        let mut config = ControllerConfig::new("http://127.0.0.1:1");
        // The lease timer's first tick, at start, and no other.
        config.tick = Duration::from_secs(3600);
        let c = Controller::start(store, config).expect("controller");
        let mut batches = c.subscribe();
        batches.wait_for(|n| *n >= 1).await.expect("the first tick is applied");

        let flood = INBOX as u64 + 100;
        let (tx, mut session) = mpsc::channel(flood as usize + 1);
        let handle = SessionHandle { tx, closed: CancellationToken::new() };
        let hello = Hello { name: "host-1".into(), instance: "i1".into(), ..Default::default() };
        let welcome = c.hello(hello, handle).await.expect("running").expect("welcome");
        assert!(matches!(session.recv().await, Some(Outbound::Welcome(_))));

        // The driver is held by a query until the test lets it go.
        let (entered, held) = oneshot::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = tokio::spawn({
            let c = c.clone();
            async move {
                c.query(move |_, _| {
                    let _ = entered.send(());
                    let _ = wait.recv();
                })
                .await
            }
        });
        held.await.expect("the driver runs the query");

        let sent = Arc::new(AtomicU64::new(0));
        let sender = tokio::spawn({
            let (c, sent) = (c.clone(), sent.clone());
            async move {
                for seq in 1..=flood {
                    c.event(Event::Heartbeat { agent: welcome.agent, session: welcome.epoch, seq }).await;
                    sent.store(seq, Ordering::SeqCst);
                }
            }
        });
        // Until the inbox is full, nothing stops the sender; then each
        // further event can only wait for the driver, which is held.
        while sent.load(Ordering::SeqCst) < INBOX as u64 {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(c.tx.capacity(), 0, "the inbox is full");
        assert_eq!(sent.load(Ordering::SeqCst), INBOX as u64, "nothing is queued beyond the inbox");
        assert!(!sender.is_finished());

        release.send(()).expect("the query waits");
        busy.await.expect("the task").expect("answered");
        sender.await.expect("the sender");
        for seq in 1..=flood {
            match session.recv().await {
                Some(Outbound::Msg(ToAgent::HeartbeatAck { seq: acked })) => assert_eq!(acked, seq),
                other => panic!("expected the acknowledgement of heartbeat {seq}, got {other:?}"),
            }
        }
        c.stop().await;
    }
}
