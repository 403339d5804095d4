//! Reporting to a controller: every record and the summary arrive, also
//! across a broken stream, and a controller that does not acknowledge fails
//! the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    report_run_with(behaviour, |sink| sink.retry_for = Duration::from_secs(1)).await
}

async fn report_run_with(
    behaviour: Behaviour,
    configure: impl FnOnce(&mut SinkConfig),
) -> (Result<benchfleet_loadgen::LoadResult, LoadError>, fake_ingest::Received) {
    let url = fake_openai::start(QUICK).await;
    let (ingest, received) = fake_ingest::start(behaviour).await;
    let mut config = random_load(&url, "good", 30, 10, 5);
    config.request_rate = Some(25.0);
    config.arrival = Arrival::Constant;
    let mut sink = SinkConfig::new(ingest, "run-1", 7, 2);
    configure(&mut sink);
    let result = run(config, Some(sink)).await;
    let received = std::mem::take(&mut *received.lock().expect("lock"));
    (result, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_and_the_summary_reach_the_controller() {
    let _machine = crate::beside().await;
    let (result, received) = report_run(Behaviour::default()).await;
    let result = result.expect("run");
    assert_eq!(received.stored.len(), 30);
    assert!(received.stored.values().all(|&n| n == 1));
    assert_eq!(received.summary.map(Summary::from), Some(result.summary));
    assert!(received.attempts.iter().all(|a| (a.run_id.as_str(), a.job, a.attempt) == ("run-1", 7, 2)));
    assert!(received.attempts.len() > 2, "records are sent as they complete, in several batches");
}

/// A run that keeps no records (the binary's, unless a file of them is
/// asked for) builds its summary as they come in: it is the summary of the
/// records the controller received, to the last digit.
/// On one worker and on three, whose records merge into one summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_keeps_no_records_summarizes_the_ones_it_sent() {
    let _machine = crate::beside().await;
    for workers in [1, 3] {
        keeps_no_records(workers).await;
    }
}

async fn keeps_no_records(workers: usize) {
    let url = fake_openai::start(QUICK).await;
    let (ingest, received) = fake_ingest::start(Behaviour::default()).await;
    let mut config = random_load(&url, "good", 60, 10, 5);
    config.request_rate = Some(50.0);
    config.keep_records = false;
    config.warmup = benchfleet_loadgen::Window::Requests(5);
    config.workers = workers;
    let result = run(config, Some(SinkConfig::new(ingest, "run-1", 7, 2))).await.expect("run");
    assert!(result.records.is_empty(), "none kept");
    let received = std::mem::take(&mut *received.lock().expect("lock"));
    let records: Vec<benchfleet_loadgen::RequestRecord> =
        received.records.into_values().map(|r| r.try_into().expect("a record")).collect();
    assert_eq!(records.len(), 60);
    let mut seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..60).collect::<Vec<_>>(), "each request once, on {workers} workers");
    let s = &result.summary;
    let mut again = benchfleet_loadgen::summarize_with(&records, benchfleet_loadgen::SummaryOptions::of(s));
    again.client_cpu_s = s.client_cpu_s;
    again.usage_check = s.usage_check;
    assert_eq!(&again, s);
    assert_eq!((s.successful, s.excluded), (55, 5));
    assert!(s.peak_output_throughput.is_some_and(|p| p > 0.0), "{s:?}");
}

/// A run longer than the bodies made ahead of it (about 1,000 of these
/// 20 KB ones, the rest made during the run on their own thread) sends
/// every prompt of its seed once, none lost, none twice.
/// A server whose usage counts half the tokens it streamed is caught
/// without a tokenizer, and its counts still go into the block as given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_below_the_events_streamed_is_flagged_without_a_tokenizer() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let mut config = random_load(&url, "undercount", 4, 5, 6);
    config.warmup = benchfleet_loadgen::Window::Requests(1);
    let result = run(config, None).await.expect("run");
    let s = &result.summary;
    assert_eq!((s.successful, s.usage_below_events), (3, 3), "the warm-up's is not counted");
    assert_eq!(s.total_output_tokens, 3 * 3, "the server's count is the one reported");
    let check = benchfleet_loadgen::block::render_self_check(s);
    assert!(check.contains("Usage below its events (replies):        3 (fewer tokens"), "{check}");

    let result = run(random_load(&url, "good", 2, 5, 6), None).await.expect("run");
    assert_eq!(result.summary.usage_below_events, 0);
    assert!(!benchfleet_loadgen::block::render_self_check(&result.summary).contains("Usage below"));
}

/// On one worker, and on four taking turns at the bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_made_during_the_run_are_each_the_seed_s_prompt_sent_once() {
    let _machine = crate::beside().await;
    for workers in [1, 4] {
        bodies_sent_once(workers).await;
    }
}

async fn bodies_sent_once(workers: usize) {
    let instant = Timing { ttft: Duration::ZERO, itl: Duration::ZERO, per_chunk: 1 };
    let (url, truth) = fake_openai::start_recorded(instant).await;
    let (n, words) = (1500, 4000);
    let mut config = random_load(&url, "good", n, words, 1);
    config.max_concurrency = Some(32);
    config.keep_records = false;
    config.workers = workers;
    let dataset = config.dataset.clone();
    let result = run(config, None).await.expect("run");
    assert_eq!(result.summary.successful, n as u64);
    // The cap holds across the workers (8 each).
    assert!(result.summary.peak_concurrent <= 32, "{}", result.summary.peak_concurrent);
    assert_eq!(result.summary.total_input_tokens, (n * words as usize) as u64);
    let mut sent: Vec<String> = truth.lock().expect("truth").iter().map(|s| s.prompt.clone()).collect();
    let mut seeded = benchfleet_loadgen::dataset::prompt_texts(&dataset, n, &benchfleet_loadgen::TokenCounter::Words);
    sent.sort_unstable();
    seeded.sort_unstable();
    assert!(sent == seeded, "the prompts sent are not the seed's, each once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_stops_at_once_and_is_not_resent() {
    let _machine = crate::beside().await;
    let (result, received) = report_run_with(Behaviour { abandon_after_one: true, ..Behaviour::default() }, |sink| {
        sink.retry_for = Duration::from_secs(10)
    })
    .await;
    let err = result.expect_err("the run fails");
    assert!(err.to_string().contains("refused the records: attempt 2 of job run-1/7 was abandoned"), "{err}");
    assert_eq!(received.streams, 1, "a refusal for good is not retried");
    // The run stopped at once instead of sending all 30 requests (1.2 s).
    assert!(received.stored.len() < 30, "{} records", received.stored.len());
    assert!(received.attempts.iter().all(|a| a.epoch == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_is_reopened_and_nothing_is_lost_or_doubled() {
    let _machine = crate::beside().await;
    let (result, received) = report_run(Behaviour { break_first_stream: true, ..Behaviour::default() }).await;
    let result = result.expect("run");
    assert!(received.streams >= 2, "the stream was reopened");
    let expected: Vec<u64> = (0..30).collect();
    assert_eq!(received.stored.keys().copied().collect::<Vec<_>>(), expected);
    assert!(received.stored.values().all(|&n| n == 1), "{:?}", received.stored);
    assert_eq!(received.summary.map(Summary::from), Some(result.summary));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_memory_bound_records_wait_in_a_file_until_the_controller_is_back() {
    let _machine = crate::beside().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // Watches the spill directory while the run goes on: the file must appear
    // (memory holds about one batch) and be gone at the end.
    let watched = dir.path().to_owned();
    let seen = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            loop {
                if std::fs::read_dir(&watched).is_ok_and(|mut d| d.next().is_some()) {
                    seen.store(true, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let behaviour =
        Behaviour { break_first_stream: true, refuse_for: Duration::from_millis(700), ..Behaviour::default() };
    let (result, received) = report_run_with(behaviour, |sink| {
        sink.retry_for = Duration::from_secs(10);
        sink.memory_bytes = 256;
        sink.spill_dir = dir.path().to_owned();
    })
    .await;
    watcher.abort();
    let result = result.expect("run");
    assert!(received.refused > 0, "the controller refused streams for a while");
    assert!(seen.load(Ordering::Relaxed), "batches past the bound went to a spill file");
    let expected: Vec<u64> = (0..30).collect();
    assert_eq!(received.stored.keys().copied().collect::<Vec<_>>(), expected);
    assert!(received.stored.values().all(|&n| n == 1), "{:?}", received.stored);
    assert_eq!(received.summary.map(Summary::from), Some(result.summary));
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("spill dir").collect();
    assert!(left.is_empty(), "the spill file is removed: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_never_acknowledges_fails_the_run() {
    let _machine = crate::beside().await;
    let (result, received) = report_run(Behaviour { never_ack: true, ..Behaviour::default() }).await;
    let err = result.expect_err("nothing was acknowledged");
    assert!(err.to_string().starts_with("30 of 30 records were not acknowledged"), "{err}");
    assert_eq!(received.stored.len(), 30, "records were sent anyway");
}

#[tokio::test]
async fn an_unreachable_controller_fails_before_the_load() {
    let _machine = crate::beside().await;
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
