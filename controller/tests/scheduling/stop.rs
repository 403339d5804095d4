//! How `serve` stops: only once every task the services spawned has ended
//! (an agent's session, an operator's watch, record streams, store work a
//! call left behind), whatever the clients do; a client that reads nothing
//! holds it back no longer than `UNREAD_STREAMS_GRACE` after that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use benchfleet_controller::service::UNREAD_STREAMS_GRACE;
use benchfleet_controller::{Controller, ControllerConfig, SledStore, Store, serve};
use benchfleet_proto as pb;
use benchfleet_study::model::{AttemptKey, RunId};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::refusals::Failing;
use super::{FakeAgent, agent, channel, gpu, submit};

/// A controller whose `serve` the test stops.
struct Served {
    url: String,
    store: Arc<dyn Store>,
    controller: Arc<Controller>,
    stop: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    _dir: tempfile::TempDir,
}

async fn served() -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(SledStore::open(dir.path()).expect("store"));
    served_over(store, dir).await
}

async fn served_over(store: Arc<dyn Store>, dir: tempfile::TempDir) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let controller = Controller::start(store.clone(), ControllerConfig::new(url.clone())).expect("controller");
    let stop = CancellationToken::new();
    let serving = tokio::spawn(serve(controller.clone(), listener, stop.clone().cancelled_owned()));
    Served { url, store, controller, stop, serving, _dir: dir }
}

impl Served {
    /// Stops it; how long `serve` took to return.
    async fn stop(self) -> (Arc<Controller>, Duration) {
        let began = Instant::now();
        self.stop.cancel();
        tokio::time::timeout(UNREAD_STREAMS_GRACE + Duration::from_secs(20), self.serving)
            .await
            .expect("serve returns")
            .expect("the task")
            .expect("serve ends cleanly");
        (self.controller, began.elapsed())
    }
}

/// An agent with a group assigned, holding its session.
async fn agent_with_a_group(url: &str) -> (FakeAgent, pb::AssignGroup) {
    let mut a = agent(url, vec![gpu(0, "NVIDIA H200")]).await;
    submit(url).await;
    let group = a.next().await;
    (a, group)
}

/// The attempt's key in the store.
fn key(attempt: &pb::AttemptRef) -> AttemptKey {
    AttemptKey { run: attempt.run_id.parse::<RunId>().expect("run id"), job: attempt.job, attempt: attempt.attempt }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_returns_only_once_every_task_it_spawned_has_ended() {
    let s = served().await;
    let (mut a, group) = agent_with_a_group(&s.url).await;
    let attempt = group.jobs[0].attempt.clone().expect("attempt");
    // An operator watches the run, reading only its first update.
    let mut op = pb::operator_service_client::OperatorServiceClient::new(channel(&s.url).await);
    let mut watch =
        op.watch_run(pb::WatchRunRequest { run_id: attempt.run_id.clone() }).await.expect("watch").into_inner();
    watch.next().await.expect("progress").expect("ok");
    // loadgen's record stream, open, one batch acknowledged.
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel(&s.url).await);
    let (batches, sent) = mpsc::channel(4);
    let mut acks = ingest.records(ReceiverStream::new(sent)).await.expect("stream").into_inner();
    batches
        .send(pb::RecordBatch { attempt: Some(attempt.clone()), batch: 0, ..Default::default() })
        .await
        .expect("sent");
    acks.next().await.expect("an ack").expect("ok");
    a.nothing_more().await;
    // The lease timer, the session, the watch, the stream's reader and its
    // acknowledgements: each a task of the controller's, each holding it
    // (but the timer, which holds it only while it ticks).
    let tasks = s.controller.tasks.len();
    assert!(tasks >= 5, "{tasks} tasks");

    let (controller, took) = s.stop().await;
    assert!(controller.tasks.is_closed() && controller.tasks.is_empty(), "{} tasks left", controller.tasks.len());
    assert_eq!(Arc::strong_count(&controller), 1, "a task still holds the controller");
    // Every client read what it was sent: no wait for unread streams.
    assert!(took < UNREAD_STREAMS_GRACE, "serve took {took:?}");
    // The clients see their streams end.
    assert!(watch.next().await.is_none_or(|end| end.is_err()));
    drop(batches);
    assert!(acks.next().await.is_none_or(|end| end.is_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_holds_serve_back_only_for_the_grace() {
    let s = served().await;
    let (_a, group) = agent_with_a_group(&s.url).await;
    let attempt = group.jobs[0].attempt.clone().expect("attempt");
    // A record stream whose client reads none of its acknowledgements: with
    // a stream window of nothing, the controller can send it none, and its
    // acknowledgements pile up in the controller until the task that sends
    // them can only wait.
    let stalled = Channel::from_shared(s.url.clone())
        .expect("url")
        .initial_stream_window_size(Some(0))
        .connect()
        .await
        .expect("connect");
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(stalled);
    let (batches, sent) = mpsc::channel(64);
    for batch in 0..64 {
        batches
            .send(pb::RecordBatch { attempt: Some(attempt.clone()), batch, ..Default::default() })
            .await
            .expect("sent");
    }
    let _acks = ingest.records(ReceiverStream::new(sent)).await.expect("stream").into_inner();
    // More batches stored, and so acknowledged, than the stream's queue of
    // acknowledgements holds (16).
    let key = key(&attempt);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.store.stored_batch(&key, 19).expect("read").is_none() {
        assert!(Instant::now() < deadline, "the batches were never stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (controller, took) = s.stop().await;
    assert!(controller.tasks.is_closed() && controller.tasks.is_empty(), "{} tasks left", controller.tasks.len());
    // The stalled connection cannot drain: it is given up on, the grace
    // after the tasks ended.
    assert!(took >= UNREAD_STREAMS_GRACE, "serve took {took:?}");
    drop(batches);
}

/// Opens the store's gate when dropped: a test that fails leaves no store
/// call waiting (the runtime waits for its blocking threads as it ends).
struct Opens(Arc<Failing>);

impl Drop for Opens {
    fn drop(&mut self) {
        self.0.files.open();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_the_store_work_of_a_call_whose_client_gave_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(Failing::new(SledStore::open(dir.path()).expect("store")));
    store.files.close();
    let opens = Opens(store.clone());
    let s = served_over(store.clone(), dir).await;
    // A call whose store work is under way when its client gives up: the
    // work goes on, on a blocking thread, with only the controller to wait
    // for it.
    let url = s.url.clone();
    let call = tokio::spawn(async move {
        let mut op = pb::operator_service_client::OperatorServiceClient::new(channel(&url).await);
        op.missing_files(pb::MissingFilesRequest { sha256: vec!["ab".repeat(32)] }).await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.files.waiting() == 0 {
        assert!(Instant::now() < deadline, "the call never reached the store");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()));

    let controller = s.controller.clone();
    let stopping = tokio::spawn(s.stop());
    // The controller stops and its tasks are closed: serve now waits for
    // them, however long the store work takes. Half a second of it is
    // plenty to see that serve does not return (with nothing to wait for,
    // no connection open, it would at once).
    while !controller.tasks.is_closed() {
        assert!(Instant::now() < deadline, "the controller never stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!stopping.is_finished(), "serve returned while store work of a call was under way");
    assert_eq!(store.files.waiting(), 1);
    drop(opens);
    let (_, took) = stopping.await.expect("the task");
    assert!(controller.tasks.is_empty(), "{} tasks left", controller.tasks.len());
    assert!(took < UNREAD_STREAMS_GRACE, "serve took {took:?}");
}
