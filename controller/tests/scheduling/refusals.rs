//! What an operator's command that cannot be done answers, through the real
//! services: NOT_FOUND for a run or agent that does not exist,
//! FAILED_PRECONDITION for a run whose state refuses it, INTERNAL for a store
//! that fails; and a controller whose store keeps refusing the scheduler's
//! writes stops itself (its binary then exits with an error). `Failing`, the
//! store that misbehaves on demand, also serves `stop`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use benchfleet_study::model::{AttemptKey, AttemptStats, Group, Job, Run, RunId};

use benchfleet_controller::records::{AgentRecord, Counters, Write};
use benchfleet_controller::store::{FileWriter, RecordCommit, Records, StoreError};
use benchfleet_controller::{Controller, ControllerConfig, SledStore, Store, serve};
use benchfleet_core::telemetry::Series;
use benchfleet_core::{Digest, Summary};
use benchfleet_proto as pb;
use tonic::Code;

use super::{agent_on, channel, controller, gpu, submit};

type Operator = pb::operator_service_client::OperatorServiceClient<tonic::transport::Channel>;

async fn operator(url: &str) -> Operator {
    Operator::new(channel(url).await)
}

fn refused<T: std::fmt::Debug>(answer: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
    answer.expect_err("refused")
}

#[tokio::test]
async fn commands_on_a_run_or_agent_that_does_not_exist_answer_not_found() {
    let f = controller().await;
    let mut op = operator(&f.url).await;
    let retry = refused(op.retry_run(pb::RetryRunRequest { run_id: "99".into() }).await);
    assert_eq!((retry.code(), retry.message()), (Code::NotFound, "run 99 does not exist"));
    let cancel = refused(op.cancel_run(pb::CancelRunRequest { run_id: "99".into(), ..Default::default() }).await);
    assert_eq!((cancel.code(), cancel.message()), (Code::NotFound, "run 99 does not exist"));
    let drain = refused(op.drain_agent(pb::DrainAgentRequest { agent: "nobody".into(), ..Default::default() }).await);
    assert_eq!(drain.code(), Code::NotFound);
    assert_eq!(drain.message(), "no agent named 'nobody' or with that id; `benchfleet agents` lists them");
    let undrain = refused(op.undrain_agent(pb::UndrainAgentRequest { agent: "agent-7".into() }).await);
    assert_eq!(undrain.code(), Code::NotFound);
    // A run id that is not one is the argument's fault.
    let bad = refused(op.retry_run(pb::RetryRunRequest { run_id: "seven".into() }).await);
    assert_eq!(bad.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_command_the_run_s_state_refuses_answers_failed_precondition() {
    let f = controller().await;
    // No agent: the run waits.
    let run = submit(&f.url).await;
    let mut op = operator(&f.url).await;
    let retry = refused(op.retry_run(pb::RetryRunRequest { run_id: run.clone() }).await);
    assert_eq!(retry.code(), Code::FailedPrecondition);
    assert_eq!(retry.message(), format!("run {run} is still running; retry it once it has ended"));
    op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), ..Default::default() }).await.expect("cancelled");
    let again = refused(op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), ..Default::default() }).await);
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert_eq!(again.message(), format!("run {run} is not running"));
    // Every job was cancelled: a retry runs them all again.
    let retried = op.retry_run(pb::RetryRunRequest { run_id: run.clone() }).await.expect("retried").into_inner();
    let jobs = f.store.jobs(run.parse().expect("a run id")).expect("jobs");
    assert_eq!(retried.jobs, jobs.len() as u64);
}

/// A sled store that misbehaves when told to: reads of a run, or the
/// scheduler's writes, fail; looking a file up waits while `files` is
/// closed.
pub(super) struct Failing {
    inner: SledStore,
    reads: AtomicBool,
    writes: AtomicBool,
    pub(super) files: Gate,
}

impl Failing {
    pub(super) fn new(inner: SledStore) -> Failing {
        Failing { inner, reads: AtomicBool::new(false), writes: AtomicBool::new(false), files: Gate::default() }
    }
}

/// Where a store call waits while the test holds it: (closed, calls
/// waiting).
#[derive(Default)]
pub(super) struct Gate {
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    pub(super) fn close(&self) {
        self.state.lock().expect("gate").0 = true;
    }

    pub(super) fn open(&self) {
        self.state.lock().expect("gate").0 = false;
        self.changed.notify_all();
    }

    /// Calls waiting at the gate now.
    pub(super) fn waiting(&self) -> usize {
        self.state.lock().expect("gate").1
    }

    fn pass(&self) {
        let mut state = self.state.lock().expect("gate");
        state.1 += 1;
        while state.0 {
            state = self.changed.wait(state).expect("gate");
        }
        state.1 -= 1;
    }
}

fn broken() -> StoreError {
    StoreError::Io(std::io::Error::other("Input/output error (os error 5)"))
}

impl Store for Failing {
    fn next_run_id(&self) -> Result<RunId, StoreError> {
        self.inner.next_run_id()
    }
    fn claim_run_id(&self, id: RunId) -> Result<bool, StoreError> {
        self.inner.claim_run_id(id)
    }
    fn create_run(&self, run: &Run, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        self.inner.create_run(run, groups, jobs)
    }
    fn add_groups(&self, run: RunId, groups: &[Group], jobs: &[Job]) -> Result<(), StoreError> {
        self.inner.add_groups(run, groups, jobs)
    }
    fn apply(&self, writes: &[Write]) -> Result<(), StoreError> {
        if self.writes.load(Ordering::Relaxed) {
            return Err(broken());
        }
        self.inner.apply(writes)
    }
    fn run(&self, id: RunId) -> Result<Option<Run>, StoreError> {
        if self.reads.load(Ordering::Relaxed) {
            return Err(broken());
        }
        self.inner.run(id)
    }
    fn runs(&self) -> Result<Vec<Run>, StoreError> {
        self.inner.runs()
    }
    fn groups(&self, run: RunId) -> Result<Vec<Group>, StoreError> {
        self.inner.groups(run)
    }
    fn jobs(&self, run: RunId) -> Result<Vec<Job>, StoreError> {
        self.inner.jobs(run)
    }
    fn job(&self, run: RunId, job: u64) -> Result<Option<Job>, StoreError> {
        self.inner.job(run, job)
    }
    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        self.inner.agents()
    }
    fn counters(&self) -> Result<Counters, StoreError> {
        self.inner.counters()
    }
    fn commit_records(&self, commit: &RecordCommit) -> Result<(), StoreError> {
        self.inner.commit_records(commit)
    }
    fn stored_batch(&self, attempt: &AttemptKey, batch: u64) -> Result<Option<u64>, StoreError> {
        self.inner.stored_batch(attempt, batch)
    }
    fn records(&self, attempt: &AttemptKey) -> Records<'_> {
        self.inner.records(attempt)
    }
    fn summary(&self, attempt: &AttemptKey) -> Result<Option<Summary>, StoreError> {
        self.inner.summary(attempt)
    }
    fn telemetry(&self, attempt: &AttemptKey) -> Result<Option<Vec<Series>>, StoreError> {
        self.inner.telemetry(attempt)
    }
    fn digest(&self, attempt: &AttemptKey) -> Result<Option<Digest>, StoreError> {
        self.inner.digest(attempt)
    }
    fn has_digest(&self, attempt: &AttemptKey) -> Result<bool, StoreError> {
        self.inner.has_digest(attempt)
    }
    fn summarized(&self, run: RunId) -> Result<Vec<AttemptKey>, StoreError> {
        self.inner.summarized(run)
    }
    fn attempt_stats(&self, run: RunId) -> Result<BTreeMap<AttemptKey, AttemptStats>, StoreError> {
        self.inner.attempt_stats(run)
    }
    fn stats(&self, attempt: &AttemptKey) -> Result<Option<AttemptStats>, StoreError> {
        self.inner.stats(attempt)
    }
    fn has_file(&self, sha256: &str) -> Result<bool, StoreError> {
        self.files.pass();
        self.inner.has_file(sha256)
    }
    fn new_file(&self) -> Result<FileWriter, StoreError> {
        self.inner.new_file()
    }
    fn open_file(&self, sha256: &str) -> Result<Option<(std::fs::File, u64)>, StoreError> {
        self.inner.open_file(sha256)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }
}

/// A controller over a `Failing` store, serving on a free loopback port
/// until it stops.
async fn failing_controller(
    dir: &std::path::Path,
) -> (String, Arc<Failing>, Arc<Controller>, tokio::task::JoinHandle<()>) {
    let store = Arc::new(Failing::new(SledStore::open(dir).expect("store")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let c = Controller::start(store.clone(), ControllerConfig::new(url.clone())).expect("controller");
    let served = c.clone();
    let serving = tokio::spawn(async move {
        serve(served, listener, std::future::pending()).await.expect("served");
    });
    (url, store, c, serving)
}

#[tokio::test]
async fn a_store_that_fails_under_a_command_answers_internal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, store, _c, _served) = failing_controller(dir.path()).await;
    let run = submit(&url).await;
    let mut op = operator(&url).await;
    op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), ..Default::default() }).await.expect("cancelled");
    store.reads.store(true, Ordering::Relaxed);
    let retry = refused(op.retry_run(pb::RetryRunRequest { run_id: run.clone() }).await);
    assert_eq!(retry.code(), Code::Internal, "{retry:?}");
    assert!(retry.message().contains("Input/output error"), "{}", retry.message());
    // The scheduler no longer holds the cancelled run: whether it exists is
    // the store's to say.
    let cancel = refused(op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), ..Default::default() }).await);
    assert_eq!(cancel.code(), Code::Internal, "{cancel:?}");
    store.reads.store(false, Ordering::Relaxed);
    op.retry_run(pb::RetryRunRequest { run_id: run }).await.expect("retried once the store reads again");
}

#[tokio::test]
async fn a_controller_whose_store_refuses_the_scheduler_s_writes_stops_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (url, store, c, served) = failing_controller(dir.path()).await;
    store.writes.store(true, Ordering::Relaxed);
    // A hello must be stored before it is welcomed: it never is.
    let hello = agent_on(channel(&url).await, vec![gpu(0, "NVIDIA H200")], "i1", Vec::new()).await;
    let refused = hello.err().expect("no welcome");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let halted = c.halted().expect("halted").to_string();
    assert!(halted.contains("Input/output error"), "{halted}");
    assert!(c.shutdown.is_cancelled());
    tokio::time::timeout(Duration::from_secs(10), served).await.expect("serve returns").expect("joined");
}
