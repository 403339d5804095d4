//! Proof of the metric definitions against a server whose timing is known
//! exactly: every metric equals the truth within 2%, tokens bundled k to a
//! chunk included, and the records recompute to the summary. The truth is
//! what the server recorded doing (its timer overshoots its deadlines by a
//! little, more on a busy machine), computed with the same statistics.

use std::time::Duration;

use benchfleet_loadgen::output::{read_jsonl, write_jsonl};
use benchfleet_loadgen::{Distribution, Endpoint, Outcome, Phase, SummaryOptions, Window, run, summarize_with};

use crate::fake_openai::{self, Timing};
use crate::random_load;

/// Delays large against scheduling noise (a timer tick is 1 ms); a gap of
/// 30 ms puts 34 chunks of a stream in any 1-second window with 10 ms to
/// spare, so the peak is exact.
const TIMING: Timing = Timing { ttft: Duration::from_millis(200), itl: Duration::from_millis(30), per_chunk: 4 };
const CHUNKS: u64 = 60;
const TOKENS: u32 = 240;

fn within_2_percent(name: &str, measured: f64, truth: f64) {
    assert!((measured - truth).abs() <= 0.02 * truth.abs(), "{name}: measured {measured:.4}, truth {truth:.4}");
}

/// A timing further than 2% from its truth, said in `misses`.
fn near(misses: &mut Vec<String>, name: &str, measured: f64, truth: f64) {
    crate::near(misses, name, measured, truth, 0.02);
}

/// A P99 over six streams shows a busy machine's few milliseconds: an
/// attempt that missed runs again (`crate::attempts`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_equals_the_truth_with_bundled_tokens_and_failures() {
    let _machine = crate::alone().await;
    crate::attempts("the truth test", truth_attempt).await;
}

/// One run against the recording server on each endpoint: what counts
/// asserts at once; the timings that missed their truth are returned.
async fn truth_attempt() -> Vec<String> {
    let mut misses = Vec::new();
    let (url, served) = fake_openai::start_recorded(TIMING).await;
    // The chat run on three workers: their records make one summary, the
    // peak's window settled across them.
    for (endpoint, workers) in [(Endpoint::Completions, 1), (Endpoint::Chat, 3)] {
        served.lock().expect("truth lock").clear();
        // 8 at once; the server fails every 4th: 6 streams, 2 errors.
        let mut config = random_load(&url, "every-4th-fails", 8, 30, TOKENS);
        config.endpoint = endpoint;
        config.workers = workers;
        let result = run(config, None).await.expect("run");
        let s = &result.summary;

        assert_eq!((s.successful, s.failed, s.failures.http_error), (6, 2, 2), "{endpoint:?}");
        assert_eq!(s.failure_reasons.len(), 1, "{:?}", s.failure_reasons);
        assert_eq!(s.failure_reasons[0].count, 2);
        assert!(s.failure_reasons[0].reason.starts_with("http 500: engine exploded engine"), "{:?}", s.failure_reasons);
        assert_eq!(s.total_output_tokens, 6 * u64::from(TOKENS));
        assert_eq!(s.total_input_tokens, 6 * 30);
        let (ttft, gap) = (200.0, 30.0);
        let decode = gap * (CHUNKS - 1) as f64;
        // The server's own account, through the same statistics.
        let served = served.lock().expect("truth lock").clone();
        assert_eq!(served.len(), 6);
        let ms = |d: &std::time::Duration| d.as_secs_f64() * 1e3;
        let truth =
            |f: &dyn Fn(&fake_openai::Served) -> Vec<f64>| Distribution::of(served.iter().flat_map(f).collect());
        let true_ttft = truth(&|r| vec![ms(&r.chunks[0])]);
        let true_tpot = truth(&|r| vec![(ms(&r.done) - ms(&r.chunks[0])) / f64::from(TOKENS - 1)]);
        let true_itl = truth(&|r| r.chunks.windows(2).map(|w| ms(&w[1]) - ms(&w[0])).collect());
        let true_itl_per_token = truth(&|r| r.chunks.windows(2).map(|w| (ms(&w[1]) - ms(&w[0])) / 4.0).collect());
        let true_latency = truth(&|r| vec![r.done.as_secs_f64()]);
        // The server kept its schedule to within 2% too: the truth is the
        // nominal timing, give or take the timer.
        near(&mut misses, "server's own ttft", true_ttft.mean, ttft);
        near(&mut misses, "server's own itl", true_itl.mean, gap);
        for (name, d, truth) in [
            ("ttft", &s.ttft_ms, &true_ttft),
            ("tpot", &s.tpot_ms, &true_tpot),
            ("itl", &s.itl_ms, &true_itl),
            ("itl per token", &s.itl_per_token_ms, &true_itl_per_token),
            ("latency", &s.latency_s, &true_latency),
        ] {
            near(&mut misses, &format!("{endpoint:?} mean {name}"), d.mean, truth.mean);
            near(&mut misses, &format!("{endpoint:?} median {name}"), d.median, truth.median);
        }
        near(&mut misses, "p99 ttft", s.ttft_ms.p99, true_ttft.p99);
        // From the schedule, the client's own dispatch adds to the server's
        // time: exactly the send lag of each request, and little of it. The
        // bound catches a client that sends on the wrong schedule (a whole
        // TTFT late), not a machine busy with other work: 10 ms of lag on
        // a shared machine once failed a 5% bound.
        let ok: Vec<_> = result.records.iter().filter(|r| r.outcome.is_ok()).collect();
        let lag_ms = ok.iter().map(|r| (r.sent_ns - r.scheduled_ns) as f64 / 1e6).sum::<f64>() / ok.len() as f64;
        assert!((s.ttft_from_scheduled_ms.mean - (s.ttft_ms.mean + lag_ms)).abs() < 1e-6);
        assert!((s.latency_from_scheduled_s.mean - (s.latency_s.mean + lag_ms / 1e3)).abs() < 1e-9);
        assert!(s.ttft_from_scheduled_ms.mean < ttft * 1.25, "{:?}", s.ttft_from_scheduled_ms);
        near(&mut misses, "p99 latency", s.latency_s.p99, true_latency.p99);
        // The block's ITL counts a 4-token chunk once; per token it is a quarter.
        assert_eq!(s.itl_ms.count, 6 * (CHUNKS - 1));
        assert_eq!(s.itl_per_token_ms.count, 6 * (CHUNKS - 1) * 4);
        let duration = (ttft + decode) / 1000.0;
        near(&mut misses, "duration", s.duration_s, duration);
        near(&mut misses, "output throughput", s.output_throughput, 6.0 * f64::from(TOKENS) / duration);
        near(&mut misses, "request throughput", s.request_throughput, 6.0 / duration);
        // Tokens, not chunks: 6 streams x 34 chunks x 4 tokens.
        let peak = s.peak_output_throughput.expect("a run over a second has a peak");
        near(&mut misses, "peak output throughput", peak, 6.0 * 34.0 * 4.0);
        assert!(s.peak_concurrent >= 6 && s.peak_concurrent <= 8, "{}", s.peak_concurrent);
        assert!((s.success_rate() - 0.75).abs() < 1e-9);

        // The records, through JSONL, give the summary back.
        let mut jsonl = Vec::new();
        write_jsonl(&mut jsonl, &result.records).expect("write");
        let records = read_jsonl(std::str::from_utf8(&jsonl).expect("utf-8"), "records.jsonl").expect("read");
        let mut again = summarize_with(&records, SummaryOptions::of(s));
        again.client_cpu_s = s.client_cpu_s;
        assert_eq!(&again, s);
    }
    misses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_a_rate_keeps_its_schedule_and_says_so() {
    let _machine = crate::alone().await;
    let url = fake_openai::start(TIMING).await;
    let mut config = random_load(&url, "good", 40, 10, 8);
    config.request_rate = Some(40.0);
    config.warmup = Window::Requests(5);
    config.cooldown = Window::Requests(5);
    // Two workers keep the one schedule between them.
    config.workers = 2;
    let result = run(config, None).await.expect("run");
    let s = &result.summary;
    assert_eq!((s.successful, s.excluded), (30, 10));
    assert!(result.records.iter().take(5).all(|r| r.phase == Phase::Warmup));
    assert!(result.records.iter().skip(35).all(|r| r.phase == Phase::Cooldown));
    // The offered rate is the schedule's own (Poisson, seeded).
    let offered = s.offered_rate.expect("a rate was offered");
    within_2_percent("achieved rate", s.achieved_rate, offered);
    assert_eq!(s.dispatch_lag_ms.count, 30, "every measured request");
    assert!(s.invalid.is_none(), "{:?} (lag {:?})", s.invalid, s.dispatch_lag_ms);
    assert!(s.client_cpu_s.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_malformed_streams_and_the_end_of_the_run_are_outcomes() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(TIMING).await;
    let check = |model: &'static str, outcome: Outcome, error: &'static str| {
        let url = url.clone();
        async move {
            let mut config = random_load(&url, model, 2, 5, TOKENS);
            config.first_token_timeout = Duration::from_millis(400);
            config.idle_timeout = Duration::from_millis(150);
            config.max_duration = (model == "good").then_some(Duration::from_millis(500));
            // One request a worker: the end of the run reaches both.
            config.workers = 2;
            let result = run(config, None).await.expect("run");
            assert_eq!(result.summary.failed, 2, "{model}");
            for r in &result.records {
                assert_eq!(r.outcome, outcome, "{model}: {r:?}");
                assert!(r.error.as_deref().unwrap_or_default().starts_with(error), "{model}: {r:?}");
            }
        }
    };
    check("stall-first", Outcome::Timeout, "first-token timeout").await;
    check("stall-after-2", Outcome::Timeout, "idle timeout").await;
    check("malformed", Outcome::Malformed, "malformed stream").await;
    // 200 ms + 59 x 30 ms does not fit in the run's 500 ms.
    check("good", Outcome::Cancelled, "cancelled").await;
}
