//! The controller's gRPC face: the agent, ingest and operator services over
//! the driver, plus gRPC health and reflection, and `serve`, which runs them
//! until the shutdown signal, then stops the controller and waits for every
//! task the services spawned (each runs under `Controller::tasks`, and none
//! waits on a client once the controller stops). Wire types are converted in
//! `convert`; nothing here decides anything about scheduling.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use benchfleet_core::RequestRecord;
use benchfleet_proto as pb;
use futures_util::Stream;
use tokio::io::AsyncReadExt as _;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::convert;
use crate::driver::{self, Controller, Event, Outbound, SessionHandle, Stopped};
use crate::export::{self, ExportError, ImportError};
use crate::ingest::{Batch, IngestError};
use crate::plan::{self, SubmitError};
use crate::report;
use crate::sched::SchedError;
use crate::store::{StoreError, codec};
use benchfleet_study::model::{AgentId, Note, RunId};

/// Most bytes of one message: matrices are at most 1 MiB, files travel in
/// 1 MiB chunks, record batches are cut at 1 MiB by loadgen.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Most bytes of one answer to an operator: a report's JSON grows with its
/// jobs (a 100-host fleet check's 300 jobs are about 5 MB of it), job and
/// run listings with the store.
pub const MAX_REPLY_BYTES: usize = 256 << 20;
/// Record batches: 256 records of a few thousand chunks each can pass the
/// above before loadgen's size cut.
pub const MAX_BATCH_BYTES: usize = 16 << 20;
/// The size of a file chunk.
pub const FILE_CHUNK_BYTES: usize = 1 << 20;
/// Largest file accepted.
pub const MAX_FILE_BYTES: u64 = 64 << 30;

type ServerStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Status {
        match e {
            StoreError::NotFound(what) => Status::not_found(format!("{what} not found")),
            StoreError::Invalid(what) => Status::invalid_argument(what),
            StoreError::NotOver(why) => Status::failed_precondition(why),
            other => Status::internal(other.to_string()),
        }
    }
}

/// The one mapping of the scheduler's refusals to gRPC codes: what does not
/// exist is NOT_FOUND, what its state does not allow FAILED_PRECONDITION, and
/// a store that failed INTERNAL.
impl From<SchedError> for Status {
    fn from(e: SchedError) -> Status {
        let message = e.to_string();
        match e {
            SchedError::NoSuchRun(_) | SchedError::NoSuchAgent(_) | SchedError::NotEnrolled(_) => {
                Status::not_found(message)
            }
            SchedError::NotRunning(_)
            | SchedError::RunOver(_)
            | SchedError::StillRunning(_)
            | SchedError::NothingToRetry(_) => Status::failed_precondition(message),
            SchedError::Store(_) => Status::internal(message),
        }
    }
}

impl From<ExportError> for Status {
    fn from(e: ExportError) -> Status {
        match e {
            ExportError::NotFound(_) => Status::not_found(e.to_string()),
            ExportError::NotOver(why) => Status::failed_precondition(why),
            ExportError::Store(e) => e.into(),
            ExportError::Write(e) => Status::aborted(format!("the export stopped: {e}")),
        }
    }
}

impl From<ImportError> for Status {
    fn from(e: ImportError) -> Status {
        match e {
            ImportError::Store(e) => e.into(),
            ImportError::Read { .. } => Status::aborted(e.to_string()),
            ImportError::Line { .. } | ImportError::Empty | ImportError::Truncated { .. } => {
                Status::invalid_argument(e.to_string())
            }
        }
    }
}

impl From<Stopped> for Status {
    fn from(_: Stopped) -> Status {
        Status::unavailable("the controller is shutting down")
    }
}

/// A submission refused: the operator's to fix, or the store's failure.
fn refused(e: SubmitError) -> Status {
    match e {
        SubmitError::Invalid(why) => Status::invalid_argument(why),
        SubmitError::Store(e) => e.into(),
    }
}

/// Runs store I/O off the async threads, as one of the controller's tasks:
/// a call whose client went away leaves it running, and `serve` waits for
/// it to end.
async fn blocking<T: Send + 'static>(
    c: &Controller,
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    c.tasks.spawn_blocking(f).await.map_err(|e| Status::internal(format!("task failed: {e}")))?
}

/// Sends an item down a response stream, waiting for room as long as the
/// controller runs; false when the client is gone, or when the controller
/// has stopped and the stream has no room (a client that stopped reading
/// holds no task after the stop). While the stream has room, the item goes,
/// stopping or not.
async fn deliver<T>(tx: &mpsc::Sender<T>, item: T, stop: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        sent = tx.send(item) => sent.is_ok(),
        () = stop.cancelled() => false,
    }
}

/// The gRPC face of a controller.
#[derive(Clone, Debug)]
pub struct Services(pub Arc<Controller>);

#[tonic::async_trait]
impl pb::agent_service_server::AgentService for Services {
    type SessionStream = ServerStream<pb::ControllerMessage>;

    async fn session(
        &self,
        req: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = req.remote_addr().map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        // Under TLS the agent is who its certificate says, whatever its
        // hello claims.
        // (A revocation ends the session through the scheduler.)
        let certificate = crate::auth::caller(&req).cloned();
        let certified = certificate.as_ref().map(|p| p.name.clone());
        let mut inbound = req.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), inbound.next()).await;
        let hello = match first {
            Ok(Some(Ok(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(h)) }))) => h,
            Err(_) => return Err(Status::deadline_exceeded("no hello within 10 s")),
            _ => return Err(Status::invalid_argument("a session starts with hello")),
        };
        let name = hello.name.clone();
        if let Some(certified) = certified.filter(|c| *c != name) {
            warn!(%name, %certified, %peer, "session refused: a hello naming another agent");
            return Err(Status::permission_denied(format!(
                "this certificate is agent '{certified}'s; a hello may not name '{name}'"
            )));
        }
        // Under TLS the agent is found by the id its certificate carries.
        let certified = match &certificate {
            None => None,
            Some(c) => Some(AgentId(c.agent_id.ok_or_else(|| {
                Status::permission_denied(format!(
                    "the certificate of agent '{}' carries no agent id: join it again (`benchfleet-agent join`)",
                    c.name
                ))
            })?)),
        };
        let hello = convert::hello(hello, peer.clone(), certified)?;
        let (tx, rx) = mpsc::channel(256);
        let closed = self.0.shutdown.child_token();
        let handle = SessionHandle { tx, closed: closed.clone() };
        let welcome = self.0.hello(hello, handle).await?.map_err(|refused| {
            warn!(%name, %peer, "session refused: {refused}");
            Status::already_exists(refused.0)
        })?;
        let (agent, session) = (welcome.agent, welcome.epoch);
        info!(%agent, %name, %peer, epoch = session, kept = welcome.keep.len(), "agent session started");
        let controller = self.0.clone();
        let ended = closed.clone();
        self.0.tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    () = ended.cancelled() => break,
                    next = inbound.next() => next,
                };
                let msg = match next {
                    None => break,
                    Some(Err(e)) => {
                        debug!(%agent, "session stream error: {e}");
                        break;
                    }
                    Some(Ok(m)) => m,
                };
                // The next message is read only once the driver took this
                // one: a full inbox holds the agent back in its own stream.
                if let Err(e) = on_agent_message(&controller, agent, session, msg).await {
                    warn!(%agent, "bad message from the agent: {}", e.message());
                }
            }
            info!(%agent, epoch = session, "agent session ended");
            controller.event(Event::SessionClosed { agent, session }).await;
        });
        let url = self.0.config.advertise_url.clone();
        let key = self.0.config.ingest_key.clone();
        // The stream ends when the driver drops its sender or ends the
        // session (a lost lease, a newer session, shutdown).
        let out = ReceiverStream::new(rx).map(move |o: Outbound| Ok(convert::outbound(&o, &url, key.as_ref())));
        let out = futures_util::StreamExt::take_until(out, async move { closed.cancelled().await });
        Ok(Response::new(Box::pin(out)))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewResponse>, Status> {
        let caller = crate::auth::caller(&req).cloned();
        let (name, id) = match caller {
            Some(crate::pki::Peer { name, agent_id: Some(id), .. }) => (name, AgentId(id)),
            _ => return Err(Status::failed_precondition("renewal is for agents holding a certificate from join")),
        };
        let issued = self.issue_agent(req.into_inner().csr_pem, name.clone(), Some(id)).await?;
        info!(agent = %id, %name, serial = %issued.serial, "agent certificate renewed");
        Ok(Response::new(pb::RenewResponse {
            certificate_pem: issued.cert_pem,
            expires_unix_ms: crate::enrol::wire_ms(issued.not_after_unix),
        }))
    }

    type FetchFileStream = ServerStream<pb::FileChunk>;

    async fn fetch_file(&self, req: Request<pb::FetchFileRequest>) -> Result<Response<Self::FetchFileStream>, Status> {
        let agent = crate::auth::caller(&req).map(|p| p.name.clone());
        let sha = req.into_inner().sha256;
        // Under TLS an agent fetches only what its own groups' jobs name.
        if let Some(agent) = agent {
            let wanted = sha.clone();
            let name = agent.clone();
            if !self.0.query(move |s, _| s.agent_needs_file(&name, &wanted)).await? {
                warn!(%agent, sha256 = %sha, "a file no group of the agent names was refused");
                return Err(Status::permission_denied(format!(
                    "agent '{agent}' runs no job that names the file {sha}"
                )));
            }
        }
        let store = self.0.store().clone();
        let wanted = sha.clone();
        let (file, size) = blocking(&self.0, move || Ok(store.open_file(&wanted)?))
            .await?
            .ok_or_else(|| Status::not_found(format!("no file with SHA-256 {sha} is stored")))?;
        let (tx, rx) = mpsc::channel(4);
        let stop = self.0.shutdown.clone();
        self.0.tasks.spawn(async move {
            let mut file = tokio::fs::File::from_std(file);
            let mut first = true;
            loop {
                let mut data = vec![0; FILE_CHUNK_BYTES];
                let n = match file.read(&mut data).await {
                    Ok(n) => n,
                    Err(e) => {
                        deliver(&tx, Err(Status::internal(format!("reading the file failed: {e}"))), &stop).await;
                        return;
                    }
                };
                if n == 0 && !first {
                    return;
                }
                data.truncate(n);
                let chunk = pb::FileChunk {
                    sha256: if first { sha.clone() } else { String::new() },
                    size: if first { size } else { 0 },
                    name: String::new(),
                    data,
                };
                first = false;
                if !deliver(&tx, Ok(chunk), &stop).await || n == 0 {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Turns one session message into a driver event and queues it (waiting
/// while the driver's inbox is full). Identity comes from the session, never
/// from the message.
async fn on_agent_message(c: &Controller, agent: AgentId, session: u64, msg: pb::AgentMessage) -> Result<(), Status> {
    use pb::agent_message::Msg;
    let event = match msg.msg {
        Some(Msg::Heartbeat(h)) => Event::Heartbeat { agent, session, seq: h.seq },
        Some(Msg::JobUpdate(u)) => Event::JobUpdate { agent, session, update: Box::new(convert::update(u)?) },
        Some(Msg::GroupDone(d)) => {
            Event::GroupDone { agent, session, run: convert::run_id(&d.run_id)?, group: d.group, epoch: d.epoch }
        }
        Some(Msg::GpuReport(r)) => {
            Event::GpuReport { agent, session, gpus: r.gpus.iter().map(convert::gpu_state).collect() }
        }
        Some(Msg::Leaving(_)) => Event::Leaving { agent, session },
        Some(Msg::Hello(_)) => return Err(Status::invalid_argument("hello in the middle of a session")),
        None => return Ok(()),
    };
    c.event(event).await;
    Ok(())
}

#[tonic::async_trait]
impl pb::ingest_service_server::IngestService for Services {
    type RecordsStream = ServerStream<pb::RecordAck>;

    async fn records(&self, req: Request<Streaming<pb::RecordBatch>>) -> Result<Response<Self::RecordsStream>, Status> {
        // Under TLS a batch is taken only under its own attempt's
        // credential, which the stream carries once.
        let credential = match &self.0.config.ingest_key {
            None => None,
            Some(key) => {
                let token = req
                    .metadata()
                    .get(crate::auth::INGEST_TOKEN_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        Status::permission_denied(
                            "record batches need their attempt's ingest credential (loadgen reads it from \
                             BENCHFLEET_INGEST_TOKEN, which the agent sets)",
                        )
                    })?;
                Some((key.clone(), token))
            }
        };
        let mut inbound = req.into_inner();
        let controller = self.0.clone();
        let (tx, rx) = mpsc::channel(16);
        // Batches go to the committer as they come; acks go back in order
        // as their commits land.
        // At most 8 batches of a stream wait for their commit: a stream that
        // sends faster than the store flushes is held back, not buffered.
        let (pending_tx, mut pending_rx) =
            mpsc::channel::<(u64, tokio::sync::oneshot::Receiver<Result<bool, IngestError>>)>(8);
        let acks = tx.clone();
        let stop = self.0.shutdown.clone();
        let stopped = stop.clone();
        self.0.tasks.spawn(async move {
            while let Some((batch, reply)) = pending_rx.recv().await {
                let ack = match reply.await {
                    Ok(Ok(summary_stored)) => Ok(pb::RecordAck { batch, summary_stored }),
                    Ok(Err(IngestError::Stale(why))) => Err(Status::failed_precondition(why)),
                    Ok(Err(IngestError::ShuttingDown)) | Err(_) => {
                        Err(Status::unavailable("the controller is shutting down"))
                    }
                    Ok(Err(e)) => Err(Status::internal(e.to_string())),
                };
                let failed = ack.is_err();
                if !deliver(&acks, ack, &stopped).await || failed {
                    return;
                }
            }
        });
        self.0.tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => return,
                    next = inbound.next() => next,
                };
                let batch = match next {
                    None => return,
                    Some(Err(e)) => {
                        debug!("record stream error: {e}");
                        return;
                    }
                    Some(Ok(b)) => b,
                };
                let number = batch.batch;
                if let (Some((key, token)), Some(a)) = (&credential, &batch.attempt)
                    && !key.verify(&a.run_id, a.job, a.attempt, a.epoch, token)
                {
                    // Says nothing of which attempt the credential is for.
                    warn!(run = %a.run_id, job = a.job, "a record batch under another attempt's credential was refused");
                    let refused = Status::permission_denied("the ingest credential is not this batch's attempt's");
                    deliver(&tx, Err(refused), &stop).await;
                    return;
                }
                let reply = match to_batch(batch) {
                    Ok(b) => controller.ingest.submit(b),
                    Err(status) => {
                        deliver(&tx, Err(status), &stop).await;
                        return;
                    }
                };
                if pending_tx.send((number, reply)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn to_batch(b: pb::RecordBatch) -> Result<Batch, Status> {
    let fence =
        convert::fence(b.attempt.as_ref().ok_or_else(|| Status::invalid_argument("record batch without an attempt"))?)?;
    let records = b
        .records
        .into_iter()
        .map(RequestRecord::try_from)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(Batch {
        fence,
        number: b.batch,
        encoded: codec::encode_batch(&records),
        records: records.len() as u64,
        sent: b.sent,
        summary: b.summary.map(Into::into),
    })
}

/// Who made an operator's call: its certificate's name under TLS, else
/// what the client says (`by`, its user name).
fn operator<T>(req: &Request<T>, said: impl Fn(&T) -> &String) -> String {
    match crate::auth::caller(req) {
        Some(peer) => peer.name.clone(),
        None => said(req.get_ref()).clone(),
    }
}

fn note(by: String, reason: String) -> Note {
    Note { by, reason, at_unix_ms: plan::unix_ms() }
}

#[tonic::async_trait]
impl pb::operator_service_server::OperatorService for Services {
    async fn missing_files(
        &self,
        req: Request<pb::MissingFilesRequest>,
    ) -> Result<Response<pb::MissingFilesResponse>, Status> {
        let store = self.0.store().clone();
        let wanted = req.into_inner().sha256;
        let missing = blocking(&self.0, move || {
            let mut missing = Vec::new();
            for sha in wanted {
                if !store.has_file(&sha)? {
                    missing.push(sha);
                }
            }
            Ok(missing)
        })
        .await?;
        Ok(Response::new(pb::MissingFilesResponse { sha256: missing }))
    }

    async fn upload_file(
        &self,
        req: Request<Streaming<pb::FileChunk>>,
    ) -> Result<Response<pb::UploadFileResponse>, Status> {
        let mut inbound = req.into_inner();
        let first = inbound.next().await.ok_or_else(|| Status::invalid_argument("an upload without chunks"))??;
        let (sha, size, name) = (first.sha256.to_ascii_lowercase(), first.size, first.name.clone());
        if !crate::store::is_sha256(&sha) {
            return Err(Status::invalid_argument(format!("{name}: '{sha}' is not a SHA-256")));
        }
        if size > MAX_FILE_BYTES {
            return Err(Status::invalid_argument(format!(
                "{name} is {size} bytes; at most {MAX_FILE_BYTES} are accepted"
            )));
        }
        let store = self.0.store().clone();
        let mut writer = blocking(&self.0, move || Ok(store.new_file()?)).await?;
        let mut data = first.data;
        loop {
            if writer.size() + data.len() as u64 > size {
                return Err(Status::invalid_argument(format!("{name} is longer than the {size} bytes it was sent as")));
            }
            let chunk = std::mem::take(&mut data);
            writer = blocking(&self.0, move || {
                writer.write(&chunk)?;
                Ok(writer)
            })
            .await?;
            match inbound.next().await {
                None => break,
                Some(chunk) => data = chunk?.data,
            }
        }
        let shown = sha.clone();
        blocking(&self.0, move || Ok(writer.finish(&sha, size)?))
            .await
            .map_err(|e| Status::new(e.code(), format!("{name}: {}", e.message())))?;
        info!(file = %name, sha256 = %shown, size, "file stored");
        Ok(Response::new(pb::UploadFileResponse { sha256: shown, size }))
    }

    async fn submit_run(&self, req: Request<pb::SubmitRunRequest>) -> Result<Response<pb::SubmitRunResponse>, Status> {
        let submission = convert::submission(req.into_inner());
        let store = self.0.store().clone();
        let planner = store.clone();
        let mut prepared = blocking(&self.0, move || {
            plan::prepare(planner.as_ref(), &submission, || planner.next_run_id()).map_err(refused)
        })
        .await?;
        // A fleet check's groups are one per target the fleet has now.
        if let Some(ask) = prepared.fleet.clone() {
            let targets = self.0.fleet_targets(ask).await?;
            prepared = plan::pin(prepared, targets).map_err(refused)?;
        }
        let prepared = blocking(&self.0, move || {
            store.create_run(&prepared.run, &prepared.groups, &prepared.jobs)?;
            Ok(prepared)
        })
        .await?;
        let (run, jobs) = (prepared.run.id, prepared.jobs.len() as u64);
        info!(%run, name = %prepared.run.name, jobs, "run submitted");
        let mut warnings = prepared.warnings.clone();
        warnings.extend(self.0.submit(prepared).await?);
        for w in &warnings {
            warn!(%run, "{w}");
        }
        Ok(Response::new(pb::SubmitRunResponse { run_id: run.to_string(), jobs, warnings }))
    }

    async fn plan_run(&self, req: Request<pb::SubmitRunRequest>) -> Result<Response<pb::PlanRunResponse>, Status> {
        let submission = convert::submission(req.into_inner());
        // A run id no stored run has: the plan is never stored.
        let mut prepared =
            blocking(&self.0, move || plan::prepare_dry(&submission, || Ok(RunId(u64::MAX))).map_err(refused)).await?;
        if let Some(ask) = prepared.fleet.clone() {
            let targets = self.0.fleet_targets(ask).await?;
            prepared = plan::pin(prepared, targets).map_err(refused)?;
        }
        let strategy = match (prepared.greedy, prepared.fleet.is_some()) {
            (true, _) => "greedy",
            (_, true) => "fleet",
            _ => "grid",
        };
        let groups: Vec<pb::PlannedGroup> = prepared
            .groups
            .iter()
            .map(|g| pb::PlannedGroup {
                group: g.id,
                config: g.config.name.clone(),
                stage: g.stage,
                jobs: prepared
                    .jobs
                    .iter()
                    .filter(|j| j.group == g.id)
                    .map(|j| pb::PlannedJob { job: j.id, profile: j.profile.name.clone(), repeat: j.repeat })
                    .collect(),
                agent: String::new(),
                gpus: Vec::new(),
            })
            .collect();
        let warnings = prepared.warnings.clone();
        let dry = self.0.dry_run(prepared).await?;
        let groups = groups
            .into_iter()
            .map(|mut g| {
                if let Some(p) = dry.placed.iter().find(|p| p.group == g.group) {
                    g.agent = p.agent.clone();
                    g.gpus = p.gpus.clone();
                }
                g
            })
            .collect();
        Ok(Response::new(pb::PlanRunResponse { strategy: strategy.to_owned(), groups, warnings, waiting: dry.waiting }))
    }

    async fn list_runs(&self, _: Request<pb::ListRunsRequest>) -> Result<Response<pb::ListRunsResponse>, Status> {
        let store = self.0.store().clone();
        let runs = blocking(&self.0, move || Ok(convert::run_list(store.as_ref())?)).await?;
        Ok(Response::new(pb::ListRunsResponse { runs }))
    }

    async fn delete_run(&self, req: Request<pb::DeleteRunRequest>) -> Result<Response<pb::DeleteRunResponse>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        // Hidden on the scheduler's thread, so that no retry or next stage
        // takes the run up meanwhile; then removed off it.
        let store = self.0.store().clone();
        self.0
            .query(move |s, _| match s.run_jobs(run) {
                Some(_) => Err(StoreError::NotOver(format!(
                    "run {run} is still scheduled (running, or a group of it still holds GPUs); delete it once \
                     it has ended"
                ))),
                None => store.hide_run(run),
            })
            .await??;
        let store = self.0.store().clone();
        let deleted = blocking(&self.0, move || Ok(store.purge_run(run)?)).await?;
        info!(%run, jobs = deleted.jobs, records = deleted.records, files = deleted.files.len(), "run deleted");
        Ok(Response::new(convert::deleted(&deleted)))
    }

    async fn get_report(&self, req: Request<pb::GetReportRequest>) -> Result<Response<pb::GetReportResponse>, Status> {
        let req = req.into_inner();
        let run = convert::run_id(&req.run_id)?;
        let format = benchfleet_study::report::Format::parse(&req.format).map_err(Status::invalid_argument)?;
        let store = self.0.store().clone();
        let ingest = self.0.ingest.clone();
        let keep = move |key, digest: &benchfleet_core::Digest| ingest.digest(key, digest);
        let doc = blocking(&self.0, move || Ok(report::document(store.as_ref(), run, &keep)?)).await?;
        Ok(Response::new(pb::GetReportResponse {
            text: benchfleet_study::report::render_as(&doc, format),
            recommended: doc.recommendation.map(|r| r.config).unwrap_or_default(),
        }))
    }

    type WatchRunStream = ServerStream<pb::RunProgress>;

    async fn watch_run(&self, req: Request<pb::WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        let controller = self.0.clone();
        let first = progress(&controller, run).await?;
        let mut changed = controller.subscribe();
        let (tx, rx) = mpsc::channel(4);
        let stop = controller.shutdown.clone();
        self.0.tasks.spawn(async move {
            let mut next = Some(first);
            loop {
                let Some(p) = next.take() else { return };
                let done = p.finished;
                if !deliver(&tx, Ok(p), &stop).await || done {
                    return;
                }
                // At most a few updates a second, however busy the fleet.
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = changed.changed() => if r.is_err() { return },
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
                changed.borrow_and_update();
                next = match progress(&controller, run).await {
                    Ok(p) => Some(p),
                    Err(e) => {
                        deliver(&tx, Err(e), &stop).await;
                        return;
                    }
                };
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn list_jobs(&self, req: Request<pb::ListJobsRequest>) -> Result<Response<pb::ListJobsResponse>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        let store = self.0.store().clone();
        let jobs = blocking(&self.0, move || {
            store.run(run)?.ok_or_else(|| Status::not_found(format!("run {run} does not exist")))?;
            let groups = store.groups(run)?;
            let stats = store.attempt_stats(run)?;
            Ok(store
                .jobs(run)?
                .iter()
                .map(|j| convert::job_info(j, groups.iter().find(|g| g.id == j.group), &stats))
                .collect())
        })
        .await?;
        Ok(Response::new(pb::ListJobsResponse { jobs }))
    }

    async fn list_agents(&self, _: Request<pb::ListAgentsRequest>) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let mut agents: Vec<pb::AgentInfo> = self.0.agents().await?.iter().map(convert::agent_info).collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListAgentsResponse { agents }))
    }

    async fn cancel_run(&self, req: Request<pb::CancelRunRequest>) -> Result<Response<pb::RunInfo>, Status> {
        let by = operator(&req, |r| &r.by);
        let req = req.into_inner();
        let run = convert::run_id(&req.run_id)?;
        self.0.cancel(run, note(by, req.reason)).await??;
        info!(%run, "run cancelled");
        Ok(Response::new(run_info(&self.0, run).await?))
    }

    async fn retry_run(&self, req: Request<pb::RetryRunRequest>) -> Result<Response<pb::RetryRunResponse>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        let jobs = self.0.retry(run).await??;
        info!(%run, jobs, "run retried");
        Ok(Response::new(pb::RetryRunResponse { run: Some(run_info(&self.0, run).await?), jobs }))
    }

    type ExportRunStream = ServerStream<pb::ExportChunk>;

    async fn export_run(&self, req: Request<pb::ExportRunRequest>) -> Result<Response<Self::ExportRunStream>, Status> {
        let run = convert::run_id(&req.into_inner().run_id)?;
        let store = self.0.store().clone();
        // A run that cannot be exported is refused as the call's answer,
        // before any chunk.
        let checked = store.clone();
        blocking(&self.0, move || Ok(export::exportable(checked.as_ref(), run).map(drop)?)).await?;
        let (tx, rx) = mpsc::channel(4);
        let mut out = Chunks { tx, stop: self.0.shutdown.clone(), runtime: tokio::runtime::Handle::current() };
        self.0.tasks.spawn_blocking(move || match export::export(store.as_ref(), run, &mut out) {
            Ok(counts) => info!(%run, records = counts.records, "run exported"),
            // The client stopped reading, or the controller is stopping: no
            // one to tell.
            Err(ExportError::Write(e)) => debug!(%run, "export stopped: {e}"),
            Err(e) => {
                warn!(%run, "export failed: {e}");
                out.send(Err(e.into()));
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn import_run(
        &self,
        req: Request<Streaming<pb::ExportChunk>>,
    ) -> Result<Response<pb::ImportRunResponse>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(4);
        let stop = self.0.shutdown.clone();
        self.0.tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => Some(Err(Status::unavailable("the controller is shutting down"))),
                    next = inbound.next() => next,
                };
                let item = match next {
                    None => return,
                    Some(Ok(chunk)) => Ok(chunk.data),
                    Some(Err(e)) => Err(std::io::Error::other(format!("the upload broke off: {}", e.message()))),
                };
                let failed = item.is_err();
                // The import stopped reading (a bad line), or the upload did.
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let store = self.0.store().clone();
        let upload = std::io::BufReader::with_capacity(1 << 20, Upload { rx, chunk: Vec::new(), at: 0 });
        let imported = blocking(&self.0, move || Ok(export::import(store.as_ref(), upload)?)).await?;
        info!(run = %imported.run, original = %imported.original, records = imported.counts.records, "run imported");
        Ok(Response::new(convert::imported(&imported)))
    }

    async fn drain_agent(&self, req: Request<pb::DrainAgentRequest>) -> Result<Response<pb::AgentInfo>, Status> {
        let by = operator(&req, |r| &r.by);
        let req = req.into_inner();
        let id = self.0.drain(req.agent, Some(note(by, req.reason))).await??;
        info!(agent = %id, "agent drained");
        Ok(Response::new(agent_info(&self.0, id).await?))
    }

    async fn undrain_agent(&self, req: Request<pb::UndrainAgentRequest>) -> Result<Response<pb::AgentInfo>, Status> {
        let id = self.0.drain(req.into_inner().agent, None).await??;
        info!(agent = %id, "agent undrained");
        Ok(Response::new(agent_info(&self.0, id).await?))
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let req = req.into_inner();
        let ca = self.0.config.ca.as_ref().ok_or_else(no_ca)?;
        let ca_hash = ca.hash().map_err(|e| Status::internal(e.to_string()))?;
        let agent = Some(req.agent).filter(|a| !a.is_empty());
        let now = crate::enrol::now_s();
        let (token, expires) = self
            .0
            .enrol(|e| e.create_token(now, req.ttl_s, agent, req.uses))?
            .map_err(|e| Status::internal(e.to_string()))?;
        info!(expires, "join token created");
        Ok(Response::new(pb::CreateTokenResponse {
            token,
            expires_unix_ms: crate::enrol::wire_ms(expires),
            ca_hash,
            url: self.0.config.advertise_url.clone(),
        }))
    }

    async fn revoke(&self, req: Request<pb::RevokeRequest>) -> Result<Response<pb::RevokeResponse>, Status> {
        let by = crate::auth::caller(&req).map_or_else(|| "an operator".to_owned(), |p| p.name.clone());
        let req = req.into_inner();
        if !crate::pki::valid_name(&req.name) {
            return Err(Status::invalid_argument(format!("'{}' is not a certificate's name", req.name)));
        }
        let now = crate::enrol::now_s();
        let reason = req.reason.clone();
        let (certificates, at) = self.0.enrol(|e| e.revoke(now, &req.name, by.clone(), reason))?;
        self.0.revoked.insert(req.name.clone(), at);
        let (name, note) = (req.name.clone(), note(by.clone(), req.reason.clone()));
        self.0.change(move |s, _| s.revoke(&name, note)).await?;
        warn!(name = %req.name, %by, reason = %req.reason, "certificates revoked");
        Ok(Response::new(pb::RevokeResponse { certificates }))
    }
}

fn no_ca() -> Status {
    Status::failed_precondition(
        "this controller holds no CA key: start it with the --pki-dir `benchfleet certs init` made",
    )
}

impl Services {
    /// An agent's certificate for a CSR: a new agent (`id` none: its id is
    /// taken now and written into the certificate, and its record stored
    /// before the certificate goes out) or a renewal of agent `id`.
    async fn issue_agent(&self, csr: String, name: String, id: Option<AgentId>) -> Result<crate::pki::Issued, Status> {
        let ca = self.0.config.ca.clone().ok_or_else(no_ca)?;
        let lifetime = self.0.config.agent_lifetime;
        let issued = self
            .0
            .change(move |s, now| {
                let id = id.unwrap_or_else(|| s.next_agent_id());
                let issued = ca.sign_csr(&csr, &name, crate::pki::Role::Agent, Some(id.0), lifetime)?;
                let certificate = crate::records::AgentCertificate {
                    serial: issued.serial.clone(),
                    not_after_unix_ms: issued.not_after_unix.saturating_mul(1000),
                    revoked: None,
                };
                match s.renewed(id, certificate.clone()) {
                    Ok(()) => {}
                    Err(_) => s.enrolled(now, id, &name, certificate),
                }
                Ok::<_, crate::pki::PkiError>((name, issued))
            })
            .await?
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (name, issued) = issued;
        let now = crate::enrol::now_s();
        self.0.enrol(|e| {
            e.enrolled(
                now,
                crate::enrol::Enrolled {
                    name,
                    serial: issued.serial.clone(),
                    issued_unix: issued.not_before_unix,
                    not_after_unix: issued.not_after_unix,
                },
            );
        })?;
        Ok(issued)
    }
}

#[tonic::async_trait]
impl pb::enroll_service_server::EnrollService for Services {
    async fn join(&self, req: Request<pb::JoinRequest>) -> Result<Response<pb::JoinResponse>, Status> {
        let from = req.remote_addr().map_or_else(|| "an unknown address".to_owned(), |a| a.to_string());
        let req = req.into_inner();
        let ca = self.0.config.ca.clone().ok_or_else(no_ca)?;
        let now = crate::enrol::now_s();
        // The token is checked (and a use taken) before anything is signed;
        // a CSR that cannot be read costs that use.
        self.0.enrol(|e| e.join(now, &req.token, &req.name))?.map_err(|e| {
            warn!(name = %req.name, %from, "join refused: {e}");
            Status::permission_denied(e.to_string())
        })?;
        let issued = self.issue_agent(req.csr_pem, req.name.clone(), None).await?;
        info!(name = %req.name, %from, serial = %issued.serial, "agent joined");
        Ok(Response::new(pb::JoinResponse {
            certificate_pem: issued.cert_pem,
            ca_pem: ca.cert_pem().to_owned(),
            expires_unix_ms: crate::enrol::wire_ms(issued.not_after_unix),
        }))
    }
}

/// An export's bytes, sent as chunks down a response stream from a
/// blocking thread; a stop ends a write that waits on a client that does
/// not read.
struct Chunks {
    tx: mpsc::Sender<Result<pb::ExportChunk, Status>>,
    stop: CancellationToken,
    /// Waits for room in the stream (or for the stop) on this thread.
    runtime: tokio::runtime::Handle,
}

impl Chunks {
    /// False when the client is gone, or the controller stopped while the
    /// client was not reading.
    fn send(&self, item: Result<pb::ExportChunk, Status>) -> bool {
        self.runtime.block_on(deliver(&self.tx, item, &self.stop))
    }
}

impl std::io::Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for part in buf.chunks(FILE_CHUNK_BYTES) {
            if !self.send(Ok(pb::ExportChunk { data: part.to_vec() })) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the client stopped reading, or the controller is stopping",
                ));
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An upload's chunks, read as one stream of bytes (on a blocking thread).
struct Upload {
    rx: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl std::io::Read for Upload {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

async fn agent_info(c: &Controller, id: AgentId) -> Result<pb::AgentInfo, Status> {
    c.query(move |s, now| s.agent_view(id, now))
        .await?
        .map(|v| convert::agent_info(&v))
        .ok_or_else(|| SchedError::NoSuchAgent(id.to_string()).into())
}

async fn run_info(c: &Controller, run: RunId) -> Result<pb::RunInfo, Status> {
    Ok(progress(c, run).await?.run.unwrap_or_default())
}

/// A run's progress: from the scheduler while it holds the run, else from
/// the store.
async fn progress(c: &Controller, run: RunId) -> Result<pb::RunProgress, Status> {
    let live = c
        .query(move |s, now| {
            let p = driver::progress(s, run, now)?;
            let (r, jobs, _) = s.run_jobs(run)?;
            Some(convert::progress(convert::run_info(&r, jobs, p.stage), &p))
        })
        .await?;
    if let Some(p) = live {
        return Ok(p);
    }
    let store = c.store().clone();
    blocking(c, move || {
        let r = store.run(run)?.ok_or_else(|| Status::not_found(format!("run {run} does not exist")))?;
        let jobs = store.jobs(run)?;
        let stage = store.groups(run)?.iter().map(|g| g.stage).max().unwrap_or(1);
        let mut p = driver::Progress { stage, ..Default::default() };
        for state in benchfleet_study::model::JobState::ALL {
            let n = jobs.iter().filter(|j| j.state == state).count() as u64;
            if n > 0 {
                p.by_state.push((state, n));
            }
        }
        Ok(convert::progress(convert::run_info(&r, &jobs, stage), &p))
    })
    .await
}

/// How long connections get, once the controller has stopped and every task
/// it spawned has ended, to deliver what their response streams still hold.
/// Only a client that stopped reading needs it: its HTTP/2 stream cannot
/// drain, so its connection would never close; `serve` then returns anyway.
pub const UNREAD_STREAMS_GRACE: Duration = Duration::from_secs(5);

/// Serves the controller's gRPC services on `listener` until `shutdown`
/// (or until the controller stops itself), then stops: the controller ends
/// every session, watch and record stream (agents and loadgen reconnect to
/// the next controller) and writes what is queued; every task the services
/// spawned (`Controller::tasks`) is waited for; then connections close.
/// It returns once they have, or `UNREAD_STREAMS_GRACE` after the tasks
/// ended, whichever is first: never before those tasks ended.
pub async fn serve(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let services = Services(controller.clone());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<pb::agent_service_server::AgentServiceServer<Services>>().await;
    health.set_serving::<pb::ingest_service_server::IngestServiceServer<Services>>().await;
    health.set_serving::<pb::operator_service_server::OperatorServiceServer<Services>>().await;
    health.set_serving::<pb::enroll_service_server::EnrollServiceServer<Services>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1();
    let stopping = controller.shutdown.clone();
    let signalled = async move {
        tokio::select! {
            () = shutdown => {}
            () = stopping.cancelled() => {}
        }
    };
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let stopper = controller.clone();
    let graceful = async move {
        signalled.await;
        info!("controller stopping");
        stopper.stop().await;
        // Each task ends on the shutdown token, by itself: none waits on a
        // client after it (`deliver`).
        stopper.tasks.close();
        stopper.tasks.wait().await;
        let _ = done_tx.send(());
    };
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &controller.config.tls {
        server = server.tls_config(tls.config())?;
    }
    let auth = crate::auth::AuthLayer { enabled: controller.config.tls.is_some(), revoked: controller.revoked.clone() };
    let mut router = server
        .layer(auth)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(health_service)
        .add_service(
            pb::agent_service_server::AgentServiceServer::new(services.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            pb::ingest_service_server::IngestServiceServer::new(services.clone())
                .max_decoding_message_size(MAX_BATCH_BYTES),
        )
        .add_service(pb::enroll_service_server::EnrollServiceServer::new(services.clone()))
        .add_service(
            pb::operator_service_server::OperatorServiceServer::new(services)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_REPLY_BYTES),
        );
    if let Ok(reflection) = reflection {
        router = router.add_service(reflection);
    }
    let serving =
        router.serve_with_incoming_shutdown(tokio_stream::wrappers::TcpListenerStream::new(listener), graceful);
    tokio::pin!(serving);
    tokio::select! {
        r = &mut serving => r,
        // The server's graceful end waits for every connection to close; a
        // client that never reads keeps its own open (its stream cannot
        // drain), so the connections get a bound, counted from when the
        // controller's own tasks have all ended.
        () = async {
            match done_rx.await {
                Ok(()) => tokio::time::sleep(UNREAD_STREAMS_GRACE).await,
                // The server ended before any stop: its answer is the one.
                Err(_) => std::future::pending().await,
            }
        } => {
            warn!(
                "some connections did not close within {UNREAD_STREAMS_GRACE:?} of the controller stopping (clients \
                 not reading); closing them"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    /// Bytes that show where they were cut: no two windows alike.
    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn each_refusal_of_the_scheduler_has_its_code_and_keeps_its_text() {
        use tonic::Code;
        let run = RunId(7);
        for (e, code) in [
            (SchedError::NoSuchRun(run), Code::NotFound),
            (SchedError::NoSuchAgent("gpu-a".into()), Code::NotFound),
            (SchedError::NotEnrolled(AgentId(3)), Code::NotFound),
            (SchedError::NotRunning(run), Code::FailedPrecondition),
            (SchedError::RunOver(run), Code::FailedPrecondition),
            (SchedError::StillRunning(run), Code::FailedPrecondition),
            (SchedError::NothingToRetry(run), Code::FailedPrecondition),
            (SchedError::Store("store i/o failed: disk full".into()), Code::Internal),
        ] {
            let text = e.to_string();
            let status = Status::from(e);
            assert_eq!((status.code(), status.message()), (code, text.as_str()));
        }
    }

    /// A runtime for `Chunks` to wait on, as the controller's would be.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    }

    #[test]
    fn an_export_goes_out_in_chunks_of_at_most_a_mib() {
        let data = bytes(3 * FILE_CHUNK_BYTES + 5);
        let (tx, mut rx) = mpsc::channel(2);
        let sent = data.clone();
        let runtime = runtime();
        let out = Chunks { tx, stop: CancellationToken::new(), runtime: runtime.handle().clone() };
        let writer = std::thread::spawn(move || {
            let mut out = out;
            out.write_all(&sent[..10])?;
            out.write_all(&sent[10..])
        });
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while let Some(chunk) = rx.blocking_recv() {
            let chunk = chunk.expect("data");
            sizes.push(chunk.data.len());
            got.extend(chunk.data);
        }
        writer.join().expect("thread").expect("written");
        assert_eq!(got, data);
        assert_eq!(sizes, [10, FILE_CHUNK_BYTES, FILE_CHUNK_BYTES, FILE_CHUNK_BYTES - 5]);
    }

    #[test]
    fn a_stop_ends_an_export_its_client_does_not_read() {
        // A client that is there (its receiver is held) but reads nothing.
        let (tx, mut rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let runtime = runtime();
        let out = Chunks { tx, stop: stop.clone(), runtime: runtime.handle().clone() };
        let (wrote, written) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut out = out;
            // The first chunk fills the stream; the second can only wait
            // for room, which never comes, or for the stop.
            let _ = wrote.send(out.write_all(b"first"));
            let _ = wrote.send(out.write_all(b"second"));
        });
        written.recv().expect("the first write").expect("room for it");
        stop.cancel();
        let e = written.recv().expect("the second write").expect_err("no room, and stopping");
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        writer.join().expect("the writing thread ends");
        // The stream still held only the first chunk: nothing was lost but
        // what could not be sent.
        assert_eq!(rx.try_recv().expect("the first chunk").expect("data").data, b"first");
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn an_upload_reads_as_one_stream_whatever_its_chunks() {
        let data = bytes(100_000);
        let (tx, rx) = mpsc::channel(2);
        let sent = data.clone();
        let sender = std::thread::spawn(move || {
            let mut at = 0;
            for size in [1, 0, 7, 4096, 65_536].into_iter().cycle() {
                let end = (at + size).min(sent.len());
                if tx.blocking_send(Ok(sent[at..end].to_vec())).is_err() || end == sent.len() {
                    break;
                }
                at = end;
            }
            let _ = tx.blocking_send(Err(std::io::Error::other("the upload broke off: reset")));
        });
        let mut upload = Upload { rx, chunk: Vec::new(), at: 0 };
        let mut got = vec![0; data.len()];
        upload.read_exact(&mut got).expect("all of it");
        assert_eq!(got, data);
        let e = upload.read(&mut [0; 8]).expect_err("then the break");
        assert_eq!(e.to_string(), "the upload broke off: reset");
        sender.join().expect("thread");
    }
}
