//! The agent's side of the control plane: one session with the controller
//! at a time, and the groups that outlive sessions.
//!
//! A session says hello (with the groups this process still holds, so a
//! controller that restarted, or a connection that broke, costs no work),
//! heartbeats on its own task, reports GPUs on another, and runs what it is
//! assigned. The latest report of every attempt is kept (`Held`), so after a
//! reconnect the controller is told again what a broken connection may have
//! lost: reports are state, not messages. Heartbeat acknowledgements renew
//! the lease; `Shared::lease_expired` tells the agent when it has gone
//! unacknowledged too long and must stop its work.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use benchfleet_proto as pb;
use sha2::Digest as _;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::gpu::GpuInfo;
use crate::group::{self, Files, GroupContext, Reports, Stop};
use crate::job::{GroupAssignment, GroupKey, JobReport, Reported, gpu_message};

/// Largest message the agent takes: assignments and file chunks.
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// A group this agent process holds, running or done.
struct Held {
    assignment: GroupAssignment,
    stop: Stop,
    /// The latest report of each attempt, by job.
    latest: BTreeMap<u64, JobReport>,
    /// When the group ended (its engine stopped).
    done_at: Option<Instant>,
    /// The controller no longer counts it (not kept at a hello, or the
    /// lease was lost): it is stopped, and never claimed again.
    disowned: bool,
    task: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    groups: HashMap<GroupKey, Held>,
    /// The current session's outgoing stream.
    out: Option<mpsc::UnboundedSender<pb::AgentMessage>>,
    channel: Option<tonic::transport::Channel>,
    /// The send time of the latest acknowledged heartbeat, and the lease's
    /// length: the lease runs until their sum.
    renewed: Option<Instant>,
    lease_ttl: Option<Duration>,
    /// Send times of heartbeats not yet acknowledged, by seq.
    beats: BTreeMap<u64, Instant>,
    next_seq: u64,
    acked_seq: u64,
    leaving: bool,
}

/// The agent's session and work, as its metrics show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStatus {
    /// A session with the controller is open.
    pub connected: bool,
    /// The agent was told to leave: it takes no new work.
    pub leaving: bool,
    /// Engine groups not yet ended.
    pub running: usize,
}

/// What the agent keeps across sessions.
#[derive(Clone, Default)]
pub struct Shared(Arc<Mutex<State>>);

fn msg(m: pb::agent_message::Msg) -> pb::AgentMessage {
    pb::AgentMessage { msg: Some(m) }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(state: &State, m: pb::agent_message::Msg) {
        if let Some(out) = &state.out {
            let _ = out.send(msg(m));
        }
    }

    /// What `/metrics` and `/readyz` say of this agent's work.
    pub fn status(&self) -> SessionStatus {
        let s = self.lock();
        SessionStatus {
            // An aborted session leaves its sender behind, closed.
            connected: s.out.as_ref().is_some_and(|out| !out.is_closed()),
            leaving: s.leaving,
            running: s.groups.values().filter(|h| h.done_at.is_none()).count(),
        }
    }

    /// Whether any group still runs.
    pub fn running(&self) -> usize {
        self.lock().groups.values().filter(|h| h.done_at.is_none()).count()
    }

    /// Whether the lease has gone unrenewed past its length.
    pub fn lease_expired(&self, now: Instant) -> Option<Duration> {
        let s = self.lock();
        let (renewed, ttl) = (s.renewed?, s.lease_ttl?);
        let silent = now.saturating_duration_since(renewed);
        (silent >= ttl).then_some(silent)
    }

    /// Stops every running group, for `reason`; with `disown`, they are
    /// never claimed again (the lease under them was lost), and the lease
    /// is forgotten until the next welcome.
    pub fn stop_all(&self, reason: &str, disown: bool) {
        let mut s = self.lock();
        if disown {
            s.renewed = None;
        }
        for h in s.groups.values_mut().filter(|h| h.done_at.is_none()) {
            h.stop.stop(reason);
            h.disowned |= disown;
        }
    }

    /// Waits until every group's runner has ended, at most `limit`.
    pub async fn join_all(&self, limit: Duration) {
        let tasks: Vec<_> = self.lock().groups.values_mut().filter_map(|h| h.task.take()).collect();
        let all = futures_util::future::join_all(tasks);
        if tokio::time::timeout(limit, all).await.is_err() {
            warn!("some engine groups did not stop within {limit:?}");
        }
    }

    /// The agent is leaving: no new work. The controller is told now (and
    /// in every hello from here on).
    pub fn leave(&self) {
        let mut s = self.lock();
        s.leaving = true;
        Self::send(&s, pb::agent_message::Msg::Leaving(pb::Leaving {}));
    }

    /// Waits until the controller has processed everything sent so far (a
    /// heartbeat sent after it is acknowledged), at most `limit`.
    pub async fn sync(&self, limit: Duration) -> bool {
        let after = self.lock().next_seq;
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.lock().acked_seq > after {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Forgets groups that ended long enough ago that no reconnect can
    /// still need their reports.
    pub fn forget_old(&self, now: Instant) {
        let mut s = self.lock();
        let keep_for = s.lease_ttl.unwrap_or(Duration::from_secs(10)) * 2;
        s.groups.retain(|_, h| h.done_at.is_none_or(|t| now.saturating_duration_since(t) < keep_for));
    }

    fn claims(&self) -> Vec<pb::GroupClaim> {
        self.lock().groups.values().filter(|h| !h.disowned).map(|h| (&h.assignment).into()).collect()
    }
}

/// Reports of one group: kept as the latest of each attempt, and sent.
struct GroupReports {
    shared: Shared,
    key: GroupKey,
}

impl Reports for GroupReports {
    fn report(&self, r: JobReport) {
        let mut s = self.shared.lock();
        let update = pb::JobUpdate::from(&r);
        // Only this assignment's attempts (an older runner of the same group
        // may still be stopping).
        if let Some(h) =
            s.groups.get_mut(&self.key).filter(|h| h.assignment.jobs.iter().any(|j| j.attempt == r.attempt))
        {
            // A pull progress line never hides an attempt's end.
            let ended = |old: &JobReport| matches!(old.state, Reported::Succeeded | Reported::Failed(_));
            if !h.latest.get(&r.attempt.job).is_some_and(ended)
                || matches!(r.state, Reported::Succeeded | Reported::Failed(_))
            {
                h.latest.insert(r.attempt.job, r);
            }
        }
        Shared::send(&s, pb::agent_message::Msg::JobUpdate(update));
    }
}

/// Files from the controller, cached by hash in `dir`.
pub struct ControllerFiles {
    pub shared: Shared,
    pub dir: PathBuf,
}

#[tonic::async_trait]
impl Files for ControllerFiles {
    async fn fetch(&self, sha256: &str, name: &str) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()),
            "'{sha256}' is not a SHA-256"
        );
        let path = self.dir.join(sha256);
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(path);
        }
        tokio::fs::create_dir_all(&self.dir).await?;
        let mut wait = Duration::from_millis(200);
        let mut last = String::new();
        for _ in 0..8 {
            let channel = self.shared.lock().channel.clone();
            if let Some(channel) = channel {
                match download(channel, sha256, &self.dir).await {
                    Ok(tmp) => {
                        tokio::fs::rename(&tmp, &path).await?;
                        info!(file = %name, %sha256, "dataset file fetched");
                        return Ok(path);
                    }
                    Err(e) if e.downcast_ref::<tonic::Status>().is_some_and(|s| s.code() == tonic::Code::NotFound) => {
                        return Err(e);
                    }
                    Err(e) => last = format!("{e:#}"),
                }
            } else {
                last = "no session with the controller".to_owned();
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
        anyhow::bail!("cannot fetch {name} ({sha256}) from the controller: {last}")
    }
}

/// Downloads a file into a temporary file in `dir`, checking its hash;
/// returns the temporary file's path.
async fn download(channel: tonic::transport::Channel, sha256: &str, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let mut client =
        pb::agent_service_client::AgentServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut chunks = client.fetch_file(pb::FetchFileRequest { sha256: sha256.to_owned() }).await?.into_inner();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".partial-{}-{n}", std::process::id()));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp).await?;
        let mut hasher = sha2::Sha256::new();
        let mut size = 0u64;
        let mut expected = None;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if expected.is_none() {
                expected = Some(chunk.size);
            }
            hasher.update(&chunk.data);
            size += chunk.data.len() as u64;
            file.write_all(&chunk.data).await?;
        }
        file.sync_all().await?;
        let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        anyhow::ensure!(got == sha256.to_ascii_lowercase(), "the file arrived with SHA-256 {got}, not {sha256}");
        anyhow::ensure!(expected.is_none_or(|e| e == size), "the file arrived with {size} bytes, not {expected:?}");
        Ok(())
    }
    .await;
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}

/// What a session needs.
pub struct SessionConfig {
    pub controller_url: String,
    pub tls: benchfleet_core::tls::ClientTls,
    /// Under https, the identity directory: read again at every connect
    /// (a renewal replaces it) and renewed at 2/3 of its certificate's life.
    pub identity: Option<PathBuf>,
    pub name: String,
    pub hostname: String,
    pub instance: String,
    pub runtimes: Vec<String>,
    pub gpu_check_interval: Duration,
    pub group: GroupContext,
    pub price: Option<benchfleet_core::cost::Price>,
}

/// How a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Another live agent holds this agent's name.
    #[error("the controller refused this agent: {0}")]
    Refused(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// One session, until the controller or the connection ends it.
pub async fn session(cfg: Arc<SessionConfig>, shared: Shared) -> Result<(), SessionError> {
    let (cfg, shared) = (cfg.as_ref(), &shared);
    let tls = match &cfg.identity {
        Some(dir) => {
            crate::identity::finish_renewal(dir);
            benchfleet_core::tls::ClientTls {
                insecure: cfg.tls.insecure,
                ..benchfleet_core::tls::ClientTls::from_dir(dir, "agent").map_err(anyhow::Error::from)?
            }
        }
        None => cfg.tls.clone(),
    };
    let channel = benchfleet_core::tls::endpoint(&cfg.controller_url, &tls)
        .map_err(anyhow::Error::from)?
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect: {e}"))?;
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // The GPUs are checked at every hello: an agent that comes back after
    // losing its lease says how its GPUs are before it takes work.
    let gpus = group::probe(&cfg.group.gpus).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let leaving = shared.lock().leaving;
    let hello = pb::Hello {
        name: cfg.name.clone(),
        hostname: cfg.hostname.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        gpus: gpus.iter().map(gpu_message).collect(),
        runtimes: cfg.runtimes.clone(),
        instance: cfg.instance.clone(),
        running: shared.claims(),
        leaving,
        gpu_hour_price: cfg.price.as_ref().map(|p| p.gpu_hour),
        gpu_hour_currency: cfg.price.as_ref().map(|p| p.currency.clone()).unwrap_or_default(),
    };
    let _ = tx.send(msg(pb::agent_message::Msg::Hello(hello)));
    let call = client.session(UnboundedReceiverStream::new(rx));
    let mut inbound = match tokio::time::timeout(Duration::from_secs(15), call).await {
        Err(_) => return Err(anyhow::anyhow!("no answer to hello within 15 s").into()),
        Ok(Err(status)) if status.code() == tonic::Code::AlreadyExists => {
            return Err(SessionError::Refused(status.message().to_owned()));
        }
        Ok(Err(status)) => return Err(anyhow::anyhow!("{}", status.message()).into()),
        Ok(Ok(r)) => r.into_inner(),
    };
    let welcome = match tokio::time::timeout(Duration::from_secs(15), inbound.next()).await {
        Ok(Some(Ok(pb::ControllerMessage { msg: Some(pb::controller_message::Msg::Welcome(w)) }))) => w,
        Ok(Some(Err(status))) => return Err(anyhow::anyhow!("{}", status.message()).into()),
        _ => return Err(anyhow::anyhow!("the controller did not welcome this agent").into()),
    };
    let beat = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(50)));
    let ttl = Duration::from_millis(u64::from(welcome.lease_ttl_ms.max(welcome.heartbeat_interval_ms * 2)));
    info!(agent = %welcome.agent_id, epoch = welcome.epoch, kept = welcome.keep.len(), "session with the controller started");
    {
        let mut s = shared.lock();
        let keep: Vec<GroupKey> = welcome.keep.iter().map(|g| (g.run_id.clone(), g.group)).collect();
        s.groups.retain(|key, h| {
            if keep.contains(key) {
                return true;
            }
            if h.done_at.is_none() {
                if !h.disowned {
                    warn!(run = %key.0, group = key.1, "the controller no longer counts this group: stopping it");
                }
                h.stop.stop("the controller no longer counts this group (its lease was lost)");
                // Kept until its runner ends, but never claimed again.
                h.disowned = true;
                return true;
            }
            false
        });
        for key in &keep {
            if let Some(h) = s.groups.get(key) {
                for r in h.latest.values() {
                    let _ = tx.send(msg(pb::agent_message::Msg::JobUpdate(r.into())));
                }
                if h.done_at.is_some() {
                    let done = pb::GroupDone { run_id: key.0.clone(), group: key.1, epoch: h.assignment.epoch };
                    let _ = tx.send(msg(pb::agent_message::Msg::GroupDone(done)));
                }
            }
        }
        s.out = Some(tx.clone());
        s.channel = Some(channel);
        s.lease_ttl = Some(ttl);
        s.renewed = Some(Instant::now());
        s.beats.clear();
        if leaving {
            let _ = tx.send(msg(pb::agent_message::Msg::Leaving(pb::Leaving {})));
        }
    }

    let over = CancellationToken::new();
    let _end = over.clone().drop_guard();
    // Heartbeats on their own task: nothing else the agent does delays them.
    tokio::spawn(heartbeats(shared.clone(), tx.clone(), beat, over.clone()));
    tokio::spawn(gpu_reports(cfg.group.gpus.clone(), tx.clone(), cfg.gpu_check_interval, gpus, over.clone()));
    if let (Some(dir), Some(channel)) = (&cfg.identity, shared.lock().channel.clone()) {
        tokio::spawn(renewals(channel, dir.clone(), cfg.name.clone(), over.clone()));
    }

    let ended = loop {
        let next = inbound.next().await;
        use pb::controller_message::Msg;
        match next {
            None => break Ok(()),
            Some(Err(status)) => break Err(anyhow::anyhow!("session broke: {}", status.message()).into()),
            Some(Ok(pb::ControllerMessage { msg: Some(Msg::AssignGroup(g)) })) => match GroupAssignment::try_from(g) {
                Ok(group) => start_group(cfg, shared, group),
                Err(e) => warn!("ignoring a malformed assignment: {e}"),
            },
            Some(Ok(pb::ControllerMessage { msg: Some(Msg::CancelGroup(c)) })) => {
                let s = shared.lock();
                if let Some(h) = s.groups.get(&(c.run_id.clone(), c.group)) {
                    info!(run = %c.run_id, group = c.group, "the controller cancelled the group: {}", c.reason);
                    h.stop.stop(format!("cancelled by the controller: {}", c.reason));
                }
            }
            Some(Ok(pb::ControllerMessage { msg: Some(Msg::HeartbeatAck(a)) })) => {
                let mut s = shared.lock();
                if let Some(sent) = s.beats.get(&a.seq).copied() {
                    s.renewed = Some(sent);
                    s.acked_seq = s.acked_seq.max(a.seq);
                    s.beats = s.beats.split_off(&(a.seq + 1));
                }
            }
            Some(Ok(_)) => {}
        }
    };
    let mut s = shared.lock();
    s.out = None;
    s.channel = None;
    ended
}

/// Renews the agent's certificate at 2/3 of its life, for as long as the
/// session lasts; a failure is tried again within a minute.
async fn renewals(channel: tonic::transport::Channel, dir: PathBuf, name: String, over: CancellationToken) {
    loop {
        let wait = crate::identity::renewal_due(&dir)
            .and_then(|at| at.duration_since(std::time::SystemTime::now()).ok())
            .unwrap_or_default();
        tokio::select! {
            () = over.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match crate::identity::renew(channel.clone(), &dir, &name).await {
            Ok(until) => info!(until = %benchfleet_core::utc(until.saturating_mul(1000)), "certificate renewed"),
            Err(e) => {
                warn!("cannot renew the agent's certificate: {e:#}");
                tokio::select! {
                    () = over.cancelled() => return,
                    () = tokio::time::sleep((wait / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))) => {}
                }
            }
        }
    }
}

async fn heartbeats(
    shared: Shared,
    tx: mpsc::UnboundedSender<pb::AgentMessage>,
    every: Duration,
    over: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = over.cancelled() => return,
            _ = tick.tick() => {}
        }
        let seq = {
            let mut s = shared.lock();
            s.next_seq += 1;
            let seq = s.next_seq;
            s.beats.insert(seq, Instant::now());
            seq
        };
        if tx.send(msg(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq }))).is_err() {
            return;
        }
    }
}

/// The GPUs checked again on a timer, so that a GPU that fails between jobs
/// stops being given work.
async fn gpu_reports(
    gpus: Arc<dyn crate::gpu::GpuProbe>,
    tx: mpsc::UnboundedSender<pb::AgentMessage>,
    every: Duration,
    first: Vec<GpuInfo>,
    over: CancellationToken,
) {
    let verdicts = |g: &[GpuInfo]| g.iter().map(|g| (g.uuid.clone(), g.reasons.clone())).collect::<Vec<_>>();
    let mut last = verdicts(&first);
    let mut tick = tokio::time::interval_at(Instant::now() + every, every.max(Duration::from_millis(100)));
    loop {
        tokio::select! {
            () = over.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = match group::probe(&gpus).await {
            Ok(g) => g,
            Err(e) => {
                warn!("cannot read the GPUs: {e:#}");
                continue;
            }
        };
        if verdicts(&now) != last {
            for g in now.iter().filter(|g| !g.usable()) {
                warn!(gpu = %g.uuid, "GPU not usable: {}", g.reasons.join("; "));
            }
            last = verdicts(&now);
        }
        let report = pb::GpuReport { gpus: now.iter().map(gpu_message).collect() };
        if tx.send(msg(pb::agent_message::Msg::GpuReport(report))).is_err() {
            return;
        }
    }
}

/// Starts a group's runner, unless this process already holds it.
fn start_group(cfg: &SessionConfig, shared: &Shared, group: GroupAssignment) {
    let key = group.key();
    let mut s = shared.lock();
    // The same assignment again changes nothing; a new one for a group this
    // process ran before (a retry, or after a lost lease) replaces the old
    // entry, whose runner, if it is still stopping, no longer counts.
    if let Some(old) = s.groups.get(&key)
        && (old.assignment == group || (old.done_at.is_none() && !old.disowned))
    {
        return;
    }
    let stop = Stop::new();
    let (ctx, runner_shared, runner_stop, runner_group) =
        (cfg.group.clone(), shared.clone(), stop.clone(), group.clone());
    let task = tokio::spawn(async move {
        let reports = GroupReports { shared: runner_shared.clone(), key: runner_group.key() };
        let (run_id, id, epoch) = (runner_group.run_id.clone(), runner_group.group, runner_group.epoch);
        let mine = runner_group.clone();
        group::run_group(&ctx, runner_group, &reports, &runner_stop).await;
        let mut s = runner_shared.lock();
        let disowned = match s.groups.get_mut(&(run_id.clone(), id)).filter(|h| h.assignment == mine) {
            Some(h) => {
                h.done_at = Some(Instant::now());
                h.disowned
            }
            None => true,
        };
        if !disowned {
            Shared::send(&s, pb::agent_message::Msg::GroupDone(pb::GroupDone { run_id, group: id, epoch }));
        }
    });
    s.groups.insert(
        key,
        Held { assignment: group, stop, latest: BTreeMap::new(), done_at: None, disowned: false, task: Some(task) },
    );
}
