//! Load runs against the fake OpenAI server: measured metrics match the
//! server's known timings, failures are recorded, bad targets fail fast.

use std::time::Duration;

use benchfleet_loadgen::{Endpoint, LoadError, Outcome, run};

use crate::fake_openai::{self, Timing};
use crate::random_load;

const TIMING: Timing = Timing { ttft: Duration::from_millis(80), itl: Duration::from_millis(15), per_chunk: 1 };

/// The client's mean timings against what the server recorded doing, on
/// both endpoints; a server that itself fell more than 10% off its nominal
/// timing (a busy machine) makes the attempt inconclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_metrics_match_the_servers_timings() {
    let _machine = crate::alone().await;
    let (url, served) = fake_openai::start_recorded(TIMING).await;
    crate::attempts("the servers' timings", || {
        let (url, served) = (url.clone(), served.clone());
        async move {
            let mut misses = Vec::new();
            for endpoint in [Endpoint::Completions, Endpoint::Chat] {
                served.lock().expect("truth").clear();
                let mut config = random_load(&url, "good", 24, 50, 20);
                config.endpoint = endpoint;
                config.max_concurrency = Some(8);
                let result = run(config, None).await.expect("run");
                let s = &result.summary;

                assert_eq!((s.successful, s.failed), (24, 0), "{endpoint:?}");
                assert_eq!(s.total_input_tokens, 24 * 50);
                assert_eq!(s.total_output_tokens, 24 * 20);
                assert_eq!(s.max_concurrency, Some(8));
                assert!(s.peak_concurrent <= 8, "cap exceeded: {}", s.peak_concurrent);
                let seqs: Vec<u64> = result.records.iter().map(|r| r.seq).collect();
                assert_eq!(seqs, (0..24).collect::<Vec<_>>());
                for r in &result.records {
                    assert_eq!(r.chunks.len(), 20, "empty and role-only chunks are not tokens");
                    assert_eq!(r.http_status, Some(200));
                    assert!(r.sent_ns >= r.scheduled_ns);
                }
                // With a cap of 8 and everything due at once, the later
                // waves wait for slots: their send is later than their
                // schedule (a busy machine only makes it later).
                let last = &result.records[23];
                assert!(last.sent_ns - last.scheduled_ns > 200_000_000, "the third wave waited for a slot");

                let served = served.lock().expect("truth").clone();
                assert_eq!(served.len(), 24);
                let ms = |d: &Duration| d.as_secs_f64() * 1e3;
                let mean = |f: &dyn Fn(&fake_openai::Served) -> Vec<f64>| {
                    let all: Vec<f64> = served.iter().flat_map(f).collect();
                    all.iter().sum::<f64>() / all.len() as f64
                };
                let ttft = mean(&|r| vec![ms(&r.chunks[0])]);
                let tpot = mean(&|r| vec![(ms(&r.done) - ms(&r.chunks[0])) / 19.0]);
                let itl = mean(&|r| r.chunks.windows(2).map(|w| ms(&w[1]) - ms(&w[0])).collect());
                crate::near(&mut misses, "the server's own ttft", ttft, 80.0, 0.1);
                crate::near(&mut misses, "the server's own itl", itl, 15.0, 0.1);
                crate::near(&mut misses, &format!("{endpoint:?} mean ttft"), s.ttft_ms.mean, ttft, 0.1);
                crate::near(&mut misses, &format!("{endpoint:?} mean tpot"), s.tpot_ms.mean, tpot, 0.1);
                crate::near(&mut misses, &format!("{endpoint:?} mean itl"), s.itl_ms.mean, itl, 0.1);
            }
            misses
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_recorded_and_counted() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(TIMING).await;
    let check = |model: &'static str, outcome: Outcome, error: &'static str| {
        let url = url.clone();
        async move {
            let result = run(random_load(&url, model, 5, 10, 8), None).await.expect("run");
            assert_eq!((result.summary.successful, result.summary.failed), (0, 5), "{model}");
            for r in &result.records {
                assert_eq!(r.outcome, outcome, "{model}: {r:?}");
                let message = r.error.as_deref().unwrap_or_default();
                assert!(message.contains(error), "{model}: {message}");
                assert!(message.len() < 300, "{model}: the body is cut: {message}");
            }
            result.records
        }
    };
    let errors = check("http-500", Outcome::HttpError, "engine exploded").await;
    assert!(errors.iter().all(|r| r.http_status == Some(500) && r.chunks.is_empty()));
    let dropped = check("drop-after-3", Outcome::Disconnected, "before [DONE]").await;
    assert!(dropped.iter().all(|r| r.chunks.len() == 3 && r.output_tokens == 3));
}

#[tokio::test]
async fn a_server_that_is_down_or_lacks_the_model_fails_the_run() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(TIMING).await;
    let err = run(random_load(&url, "other-model", 1, 1, 1), None).await.expect_err("unknown model");
    assert!(matches!(err, LoadError::ModelNotServed { .. }), "{err:?}");
    assert!(err.to_string().contains("\"other-model\" is not served"), "{err}");
    assert!(err.to_string().contains("good, http-500"), "{err}");

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let down = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let err = run(random_load(&down, "good", 1, 1, 1), None).await.expect_err("server down");
    assert!(err.to_string().starts_with(&format!("cannot reach the server at {down}/v1/models")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_is_sent_on_its_own_schedule_at_its_speed() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(TIMING).await;
    // Out of time order in the file, sent in time order.
    let lines = [(0, 40, 3, "[1]"), (600, 30, 2, "[1]"), (200, 520, 4, "[1, 2]"), (900, 10, 1, "[]")]
        .map(|(t, i, o, ids)| {
            format!(r#"{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": {ids}}}"#)
        })
        .join("\n");
    let trace =
        benchfleet_loadgen::trace::parse(lines.as_bytes(), "t.jsonl", benchfleet_loadgen::trace::TraceFormat::Mooncake)
            .expect("parses");
    let trace = std::sync::Arc::new(trace);
    let dataset = benchfleet_loadgen::Dataset::Trace { trace: trace.clone(), speed: 2.0 };
    let mut config = benchfleet_loadgen::LoadConfig::new(url.as_str(), "good", dataset, 4);
    config.workers = 2;
    let result = run(config, None).await.expect("run");
    let s = &result.summary;
    assert_eq!((s.successful, s.failed), (4, 0));
    assert_eq!(s.total_input_tokens, 40 + 520 + 30 + 10);
    assert_eq!(s.total_output_tokens, 3 + 4 + 2 + 1);
    let scheduled: Vec<i64> = result.records.iter().map(|r| r.scheduled_ns).collect();
    assert_eq!(scheduled, [0, 100_000_000, 300_000_000, 450_000_000], "the trace's times, halved");
    // Sent at its time (within what a busy machine may add).
    for r in &result.records {
        assert!(r.sent_ns >= r.scheduled_ns && r.sent_ns - r.scheduled_ns < 250_000_000, "{r:?}");
    }
    assert!(s.offered_rate.is_some_and(|r| (r - 3.0 / 0.45).abs() < 1e-6), "{:?}", s.offered_rate);

    // What a trace refuses: a rate of its own, more requests than it has, a
    // speed of 0.
    for (rate, n, speed, said) in [
        (Some(5.0), 4, 1.0, "a trace sends on its own schedule"),
        (None, 5, 1.0, "5 requests asked of the trace t.jsonl, which has 4"),
        (None, 4, 0.0, "the trace speed must be above 0, got 0"),
    ] {
        let dataset = benchfleet_loadgen::Dataset::Trace { trace: trace.clone(), speed };
        let mut config = benchfleet_loadgen::LoadConfig::new(url.as_str(), "good", dataset, n);
        config.request_rate = rate;
        let e = run(config, None).await.expect_err(said);
        assert!(matches!(&e, LoadError::Config(m) if m.contains(said)), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_reports_its_steady_state_window() {
    let _machine = crate::alone().await;
    let quick = Timing { ttft: Duration::from_millis(20), itl: Duration::from_millis(5), per_chunk: 1 };
    let url = fake_openai::start(quick).await;
    crate::attempts("the steady-state window", || {
        let url = url.clone();
        async move {
            let mut config = crate::random_load(&url, "good", 200, 16, 10);
            config.max_concurrency = Some(8);
            let result = run(config, None).await.expect("run");
            let s = &result.summary;
            let w = s.steady_state.as_ref().expect("a steady state");
            assert!(w.reached && w.level == 8, "{w:?}");
            let span = w.end_s - w.start_s;
            assert!((w.request_throughput * span - w.requests as f64).abs() < 1e-6, "{w:?}");
            assert!((w.output_throughput / w.request_throughput - 10.0).abs() < 1.0, "{w:?}");
            assert!(w.mean_ttft_ms >= 19.0, "{w:?}");
            let block = benchfleet_loadgen::render_block(s, None);
            assert!(block.contains("Steady state:") && block.contains("8 or more in flight"), "{block}");
            // Eight users busy from the first send until the last requests
            // run out: the window holds nearly the whole run (about 1.7 s).
            // A busy machine leaves a slot empty a moment now and then and
            // the first wave slow to go, which makes an attempt inconclusive.
            let mut misses = Vec::new();
            let mut check = |ok: bool, what: &str| {
                if !ok {
                    misses.push(format!("{what}: {w:?} of {} s", s.duration_s));
                }
            };
            check(w.held > 0.75, "held 8 in flight for under 0.75 of the window");
            check(w.start_s < 0.1, "began after 100 ms");
            check(w.end_s > 0.8 * s.duration_s, "ended before 0.8 of the run");
            check(w.requests >= 180, "fewer than 180 requests");
            // A request takes 20 ms and 9 gaps of 5 ms: 8 of them every 65 ms
            // at best, and the window's figures are its own requests'.
            let truth = 8.0 / 0.065;
            check(w.request_throughput < 1.05 * truth, "faster than the server can serve");
            check(w.request_throughput > 0.5 * truth, "under half the server's rate");
            check(w.mean_ttft_ms < 60.0, "mean TTFT over 60 ms");
            misses
        }
    })
    .await;
}

/// Multi-turn sessions: each turn goes its think time after the previous
/// reply, carrying the conversation so far with the reply the server
/// actually gave; the cap holds sessions, not requests; the records say
/// each request's session and turn, and the summary its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_send_each_turn_after_its_reply_with_the_conversation_so_far() {
    let _machine = crate::beside().await;
    let quick = Timing { ttft: Duration::from_millis(20), itl: Duration::from_millis(2), per_chunk: 1 };
    let (url, truth) = fake_openai::start_recorded(quick).await;
    let think = Duration::from_millis(30);
    for workers in [1, 2] {
        truth.lock().expect("truth").clear();
        let dataset = benchfleet_loadgen::Dataset::MultiTurn {
            turns: 3,
            user_tokens: 4,
            output_tokens: 5,
            think_time: think,
            seed: 1,
        };
        // Ten requests: sessions of 3, 3, 3 and 1 turns, two at a time.
        let mut config = benchfleet_loadgen::LoadConfig::new(url.as_str(), "good", dataset, 10);
        config.endpoint = Endpoint::Chat;
        config.max_concurrency = Some(2);
        config.workers = workers;
        let result = run(config, None).await.expect("run");
        let s = &result.summary;
        assert_eq!((s.successful, s.failed), (10, 0), "workers {workers}");
        let mut sessions: Vec<Vec<&benchfleet_loadgen::RequestRecord>> = vec![Vec::new(); 4];
        for r in &result.records {
            let turn = r.turn.expect("a session's request");
            sessions[turn.session as usize].push(r);
        }
        for (id, turns) in sessions.iter_mut().enumerate() {
            turns.sort_by_key(|r| r.turn.map(|t| t.turn));
            let numbers: Vec<u32> = turns.iter().filter_map(|r| r.turn.map(|t| t.turn)).collect();
            assert_eq!(numbers, if id == 3 { vec![1] } else { vec![1, 2, 3] }, "session {id}");
            for pair in turns.windows(2) {
                let due = pair[0].completed_ns + think.as_nanos() as i64;
                assert_eq!(pair[1].scheduled_ns, due, "due its think time after the reply");
                assert!(pair[1].sent_ns >= due, "{:?}", pair[1]);
            }
            // The server's count of the whole conversation: 4 user words a
            // turn and 5 of each reply.
            let prompts: Vec<u32> = turns.iter().map(|r| r.prompt_tokens).collect();
            assert_eq!(prompts, [4, 13, 22][..turns.len()], "session {id}");
        }
        // At most two sessions under way at once, from a first send to a
        // last reply (think times included).
        let mut edges: Vec<(i64, i32)> =
            sessions.iter().flat_map(|t| [(t[0].sent_ns, 1), (t.last().expect("a turn").completed_ns, -1)]).collect();
        edges.sort_unstable_by_key(|&(at, step)| (at, step));
        let most = edges.iter().scan(0, |open, &(_, step)| {
            *open += step;
            Some(*open)
        });
        assert_eq!(most.max(), Some(2), "workers {workers}");
        // Each turn carried the conversation so far, the replies as streamed.
        let served = truth.lock().expect("truth").clone();
        assert_eq!(served.len(), 10);
        for request in &served {
            let roles: Vec<&str> = request.messages.iter().map(|(role, _)| role.as_str()).collect();
            assert_eq!(roles.len() % 2, 1, "{roles:?}");
            assert!(roles.iter().enumerate().all(|(i, r)| *r == ["user", "assistant"][i % 2]), "{roles:?}");
            if roles.len() > 1 {
                let before = &request.messages[..roles.len() - 2];
                let earlier = served.iter().find(|other| other.messages == before).expect("the turn before");
                assert_eq!(request.messages[roles.len() - 2].1, earlier.reply, "the reply it got");
            }
        }
        let figures = s.sessions.as_ref().expect("sessions");
        assert_eq!((figures.sessions, figures.turns), (4, 10));
        let rows: Vec<(u32, u64, f64)> =
            figures.by_turn.iter().map(|t| (t.turn, t.successful, t.mean_prompt_tokens)).collect();
        assert_eq!(rows, [(1, 4, 4.0), (2, 3, 13.0), (3, 3, 22.0)]);
    }
}

/// A turn that fails ends its session: nothing more of it is sent, its
/// slot goes to the next session, and the summary counts the turns that
/// were sent. The run's maximum duration ends the sessions still going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_ends_its_session_and_the_maximum_duration_ends_them_all() {
    let _machine = crate::beside().await;
    let quick = Timing { ttft: Duration::from_millis(5), itl: Duration::from_millis(1), per_chunk: 1 };
    let url = fake_openai::start(quick).await;
    let sessions = |think_ms| benchfleet_loadgen::Dataset::MultiTurn {
        turns: 3,
        user_tokens: 3,
        output_tokens: 2,
        think_time: Duration::from_millis(think_ms),
        seed: 4,
    };
    // Every fourth request the server gets fails.
    let mut config = benchfleet_loadgen::LoadConfig::new(url.as_str(), "every-4th-fails", sessions(0), 30);
    config.endpoint = Endpoint::Chat;
    config.max_concurrency = Some(1);
    let result = run(config, None).await.expect("run");
    let s = &result.summary;
    assert_eq!(s.failed, s.failures.http_error);
    assert!(s.failed > 0 && s.successful + s.failed < 30, "failures cut sessions short: {s:?}");
    let figures = s.sessions.as_ref().expect("sessions");
    assert_eq!(figures.sessions, 10, "every session began");
    assert_eq!(figures.turns, s.successful + s.failed);
    // One session at a time: in send order, a failed turn is its session's
    // last, and the next request is the next session's first turn.
    let mut records = result.records.clone();
    records.sort_by_key(|r| r.sent_ns);
    for pair in records.windows(2) {
        let (a, b) = (pair[0].turn.expect("a turn"), pair[1].turn.expect("a turn"));
        if !pair[0].outcome.is_ok() || a.turn == 3 {
            assert_eq!((b.session, b.turn), (a.session + 1, 1), "{a:?} then {b:?}");
        } else {
            assert_eq!((b.session, b.turn), (a.session, a.turn + 1), "{a:?} then {b:?}");
        }
    }

    // Sessions that think for a second each turn, cut at 300 ms: every
    // session sent its first turn and no other.
    let mut config = benchfleet_loadgen::LoadConfig::new(url.as_str(), "good", sessions(1000), 12);
    config.endpoint = Endpoint::Chat;
    config.max_concurrency = Some(4);
    config.max_duration = Some(Duration::from_millis(300));
    let result = run(config, None).await.expect("run");
    let turns: Vec<u32> = result.records.iter().filter_map(|r| r.turn.map(|t| t.turn)).collect();
    assert_eq!(turns, [1, 1, 1, 1], "four sessions under way, each at its first turn");
    assert_eq!(result.summary.sessions.as_ref().map(|s| (s.sessions, s.turns)), Some((4, 4)));
}
