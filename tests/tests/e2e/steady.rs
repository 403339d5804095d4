//! The steady state of a closed loop against the simulator: the window the
//! records say (the requests in flight at 90% of their peak, the drain left
//! out), and an engine that slows as it runs flagged as drifting.

use benchfleet_loadgen::{Dataset, Lengths, LoadConfig, RequestRecord, run};

/// A simulated engine serving until the returned sender is dropped.
async fn sim(flags: &str) -> (String, tokio::sync::oneshot::Sender<()>) {
    let line = format!("vllm serve Qwen/Qwen3.5-9B --max-model-len 8192 --sim-startup-ms 0 --sim-speedup 4 {flags}");
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
    let (url, _stop) = sim("").await;
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
    let (url, _stop) = sim("--sim-slowdown-pct-per-s 20").await;
    let slowing = closed_loop(&url, 320).await;
    let w = slowing.summary.steady_state.as_ref().expect("a steady state");
    assert!(w.reached && w.drifts(), "{w:?}");
    assert!(w.throughput_drift_pct.is_some_and(|d| d < -5.0), "{w:?}");
    assert!(w.words().contains("drifting:"), "{}", w.words());
}
