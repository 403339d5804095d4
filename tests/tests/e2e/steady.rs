//! The steady state of a closed loop against the simulator: the window the
//! records say (the requests in flight at 90% of their peak, the drain left
//! out), and an engine that slows as it runs flagged as drifting. And one
//! run's own noise: identical runs compare as within noise, a slower engine
//! does not.

use benchfleet_loadgen::{Dataset, Lengths, LoadConfig, RequestRecord, run};

/// A simulated engine serving until the returned sender is dropped.
async fn sim(flags: &str) -> (String, tokio::sync::oneshot::Sender<()>) {
    let line = format!("vllm serve Qwen/Qwen3.5-9B --max-model-len 8192 --sim-startup-ms 0 {flags}");
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    let config = benchfleet_sim::parse_command_line(&args).expect("valid command line");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(benchfleet_sim::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    (url, stop)
}

/// A closed loop of 16 users, lengths spread so that they fall out of step.
async fn closed_loop(url: &str, requests: usize) -> benchfleet_loadgen::LoadResult {
    let dataset = Dataset::RandomSpread {
        input: Lengths { mean: 256, std: 64.0, min: 64, max: 512 },
        output: Lengths { mean: 48, std: 16.0, min: 8, max: 96 },
        seed: 5,
    };
    let mut config = LoadConfig::new(url, "Qwen/Qwen3.5-9B", dataset, requests);
    config.max_concurrency = Some(16);
    run(config, None).await.expect("the run")
}

/// The window as the records say: from the first instant the requests in
/// flight reach 90% of their peak to the last they fall below it, ns.
fn window_of(records: &[RequestRecord]) -> (i64, i64, i64) {
    let mut events: Vec<(i64, i64)> = records.iter().flat_map(|r| [(r.sent_ns, 1), (r.completed_ns, -1)]).collect();
    events.sort();
    let mut now = 0;
    let peak = events
        .iter()
        .map(|(_, d)| {
            now += d;
            now
        })
        .max()
        .expect("events");
    let level = (peak as f64 * 0.9).ceil() as i64;
    let (mut start, mut end, mut now) = (None, 0, 0);
    for (t, d) in events {
        let before = now;
        now += d;
        if before < level && now >= level && start.is_none() {
            start = Some(t);
        }
        if before >= level && now < level {
            end = t;
        }
    }
    (start.expect("reached"), end, level)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_s_window_is_the_records_and_a_slowing_engine_drifts() {
    let (url, _stop) = sim("--sim-speedup 4").await;
    let result = closed_loop(&url, 320).await;
    let s = &result.summary;
    assert_eq!(s.successful, 320);
    let w = s.steady_state.as_ref().expect("a steady state");
    let first = result.records.iter().map(|r| r.sent_ns).min().expect("records");
    let (start, end, level) = window_of(&result.records);
    assert_eq!(w.level as i64, level);
    assert!(w.reached, "{w:?}");
    assert!((w.start_s - (start - first) as f64 / 1e9).abs() < 1e-9, "{w:?}");
    assert!((w.end_s - (end - first) as f64 / 1e9).abs() < 1e-9, "{w:?}");
    // The drain is left out: the window ends after the last send, before the
    // last completion.
    let last_send = result.records.iter().map(|r| r.sent_ns).max().expect("records");
    let last_done = result.records.iter().map(|r| r.completed_ns).max().expect("records");
    assert!(end >= last_send && end < last_done, "{w:?}");
    let inside = result.records.iter().filter(|r| r.sent_ns >= start && r.sent_ns < end).count() as u64;
    assert_eq!(w.requests, inside);
    eprintln!("steady: {}", w.words());

    // The same load on an engine whose steps take 20% longer every second.
    let (url, _stop) = sim("--sim-speedup 4 --sim-slowdown-pct-per-s 20").await;
    let slowing = closed_loop(&url, 320).await;
    let w = slowing.summary.steady_state.as_ref().expect("a steady state");
    assert!(w.reached && w.drifts(), "{w:?}");
    assert!(w.throughput_drift_pct.is_some_and(|d| d < -5.0), "{w:?}");
    assert!(w.words().contains("drifting:"), "{}", w.words());
}

/// The run of the noise test: 1,000 requests (a P99 needs 100 a batch) of
/// short prompts, 16 users, on an engine without a prefix cache (a second
/// run of the same prompts would find them cached: not the same run).
async fn short_run(url: &str) -> benchfleet_loadgen::Summary {
    let dataset = Dataset::RandomSpread {
        input: Lengths { mean: 128, std: 32.0, min: 32, max: 256 },
        output: Lengths { mean: 24, std: 8.0, min: 4, max: 48 },
        seed: 9,
    };
    let mut config = LoadConfig::new(url, "Qwen/Qwen3.5-9B", dataset, 1000);
    config.max_concurrency = Some(16);
    config.keep_records = false;
    run(config, None).await.expect("the run").summary
}

/// Two identical runs compare as within noise on every mean, median and
/// throughput but the ITL's in at least 19 of 20 tries, with the interval
/// each run's own requests give (one repeat each: no repeats to take it
/// from); the same load on an engine 10% slower is a regression every time.
/// (The P99s and the ITL are not held to it yet. Measured alone, on this
/// simulator at ten times its speed, two sittings of 20 pairs: the P99 TTFT
/// moved beyond its interval in 0 and 3 pairs (6.6-11.1%); the mean ITL
/// moved 1.6-9.9% in the first, before it had an interval, and beyond its
/// interval (the batches' ratio of gap sums to gap counts) in 2 pairs of
/// the second (21-36%); the P99 ITL, which has no interval from one run
/// (its gaps are not kept by request), moved 6-90% in 17 of 20 pairs.)
///
/// Run alone (`cargo test -p benchfleet-tests --test e2e -- --ignored
/// identical_runs`): beside the other end-to-end tests on two cores, their
/// load moved one run's TPOT by 29% (18 of 20 once), which is the machine's
/// noise between the two runs, not either run's own. Right after the suite
/// (its daemons and containers winding down) one pair's TPOT moved 191%
/// and it passed 17 of 20: not a gate CI can hold yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it alone"]
async fn identical_runs_are_within_their_own_noise_and_a_10_percent_slowdown_is_caught() {
    use benchfleet_study::report::{HEADLINE, compare};
    let (url, _stop) = sim("--sim-speedup 10 --no-enable-prefix-caching").await;
    let (slow_url, _slow) = sim("--sim-speedup 9 --no-enable-prefix-caching").await;
    let threshold = 0.05;
    let held = |key: &str| !key.contains("itl") && !key.starts_with("p99");
    let mut quiet = 0;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let (a, b) = (short_run(&url).await, short_run(&url).await);
        let moved: Vec<String> = HEADLINE
            .iter()
            .filter(|h| held(h.key))
            .filter_map(|h| {
                let j = compare::judge(h, &[&a], &[&b], threshold);
                assert!(j.one_run, "{}: an interval from one run each", h.key);
                (j.change != compare::Change::WithinNoise).then(|| format!("{} {:+.1}%", h.key, j.relative * 100.0))
            })
            .collect();
        if moved.is_empty() {
            quiet += 1;
        }
        seen.push(moved);
    }
    assert!(quiet >= 19, "identical runs within noise in {quiet} of 20: {seen:?}");
    for _ in 0..3 {
        let (a, b) = (short_run(&url).await, short_run(&slow_url).await);
        let gate = ["total_token_throughput", "mean_ttft_ms", "mean_tpot_ms"];
        let caught: Vec<&str> = HEADLINE
            .iter()
            .filter(|h| gate.contains(&h.key))
            .filter(|h| compare::judge(h, &[&a], &[&b], threshold).change == compare::Change::Regression)
            .map(|h| h.key)
            .collect();
        assert!(!caught.is_empty(), "a 10% slower engine passed the gate");
    }
}
