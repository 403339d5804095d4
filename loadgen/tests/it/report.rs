//! Reporting to a controller: every record and the summary arrive, also
//! across a broken stream, and a controller that does not acknowledge fails
//! the run.

use std::time::Duration;

use benchfleet_loadgen::{Arrival, LoadError, SinkConfig, Summary, run};

use crate::fake_ingest::{self, Behaviour};
use crate::fake_openai::{self, Timing};
use crate::random_load;

const QUICK: Timing = Timing { ttft: Duration::from_millis(20), itl: Duration::from_millis(5), per_chunk: 1 };

/// 30 requests over about 1.2 s: several batches of records.
async fn report_run(
    behaviour: Behaviour,
) -> (Result<benchfleet_loadgen::LoadResult, LoadError>, fake_ingest::Received) {
    let url = fake_openai::start(QUICK).await;
    let (ingest, received) = fake_ingest::start(behaviour).await;
    let mut config = random_load(&url, "good", 30, 10, 5);
    config.request_rate = Some(25.0);
    config.arrival = Arrival::Constant;
    let mut sink = SinkConfig::new(ingest, "run-1", 7, 2);
    sink.retry_for = Duration::from_secs(1);
    let result = run(config, Some(sink)).await;
    let received = std::mem::take(&mut *received.lock().expect("lock"));
    (result, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_and_the_summary_reach_the_controller() {
    let (result, received) = report_run(Behaviour::default()).await;
    let result = result.expect("run");
    assert_eq!(received.stored.len(), 30);
    assert!(received.stored.values().all(|&n| n == 1));
    assert_eq!(received.summary.map(Summary::from), Some(result.summary));
    assert!(received.attempts.iter().all(|a| (a.run_id.as_str(), a.job, a.attempt) == ("run-1", 7, 2)));
    assert!(received.attempts.len() > 2, "records are sent as they complete, in several batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_is_reopened_and_nothing_is_lost_or_doubled() {
    let (result, received) = report_run(Behaviour { break_first_stream: true, ..Behaviour::default() }).await;
    let result = result.expect("run");
    assert!(received.streams >= 2, "the stream was reopened");
    let expected: Vec<u64> = (0..30).collect();
    assert_eq!(received.stored.keys().copied().collect::<Vec<_>>(), expected);
    assert!(received.stored.values().all(|&n| n == 1), "{:?}", received.stored);
    assert_eq!(received.summary.map(Summary::from), Some(result.summary));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_never_acknowledges_fails_the_run() {
    let (result, received) = report_run(Behaviour { never_ack: true, ..Behaviour::default() }).await;
    let err = result.expect_err("nothing was acknowledged");
    assert!(err.to_string().starts_with("30 of 30 records were not acknowledged"), "{err}");
    assert_eq!(received.stored.len(), 30, "records were sent anyway");
}

#[tokio::test]
async fn an_unreachable_controller_fails_before_the_load() {
    let url = fake_openai::start(QUICK).await;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let down = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let mut sink = SinkConfig::new(down.clone(), "run-1", 0, 0);
    sink.retry_for = Duration::from_millis(300);
    let err = run(random_load(&url, "good", 1, 1, 1), Some(sink)).await.expect_err("controller down");
    assert!(matches!(err, LoadError::Sink(_)), "{err:?}");
    assert!(err.to_string().starts_with(&format!("cannot reach the controller at {down}")), "{err}");
}
