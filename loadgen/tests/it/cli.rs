//! The binary: flags, the printed block, saved records and summary, exit
//! codes.

use std::time::Duration;

use benchfleet_core::load::{LoadExit, LoadOutcome};
use benchfleet_loadgen::{RequestRecord, Summary, summarize};
use tokio::process::Command;

use crate::fake_openai::{self, Timing};

const QUICK: Timing = Timing { ttft: Duration::from_millis(20), itl: Duration::from_millis(5), per_chunk: 1 };

fn loadgen() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_benchfleet-loadgen"));
    command.env_remove("OPENAI_API_KEY");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_records_recompute_to_the_saved_summary() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (records_path, summary_path) = (dir.path().join("records.jsonl"), dir.path().join("summary.json"));
    let output = loadgen()
        .args(["--base-url", &url, "--model", "good", "--endpoint", "/v1/chat/completions"])
        .args(["--random-input-len", "12", "--random-output-len", "6", "--num-prompts", "20"])
        .args(["--request-rate", "100", "--seed", "3", "--max-concurrency", "4", "--quiet"])
        // Three workers, with 2, 1 and 1 of the cap's 4 slots.
        .args(["--workers", "3"])
        .arg("--save-records")
        .arg(&records_path)
        .arg("--save-summary")
        .arg(&summary_path)
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("============ Serving Benchmark Result ============\n"), "{stdout}");
    assert!(stdout.contains("Successful requests:                     20\n"), "{stdout}");
    assert!(stdout.contains("Maximum request concurrency:             4\n"), "{stdout}");

    let jsonl = std::fs::read_to_string(&records_path).expect("records");
    let records: Vec<RequestRecord> = jsonl.lines().map(|l| serde_json::from_str(l).expect("record")).collect();
    assert_eq!(records.len(), 20);
    // Compared as written: serde_json's default float parser may be one ulp
    // off, its writer is exact.
    let saved = std::fs::read_to_string(&summary_path).expect("summary");
    let mut recomputed = summarize(&records, Some(4));
    // The client's CPU time is the one number the records cannot give.
    let parsed: Summary = serde_json::from_str(&saved).expect("json");
    recomputed.client_cpu_s = parsed.client_cpu_s;
    assert_eq!(serde_json::to_string_pretty(&recomputed).expect("json"), saved);
    let saved: Summary = serde_json::from_str(&saved).expect("json");
    assert_eq!(saved.total_output_tokens, 20 * 6);
    assert!(saved.peak_concurrent <= 4, "{}", saved.peak_concurrent);

    let output =
        loadgen().args(["--base-url", &url, "--model", "good", "--workers", "0"]).output().await.expect("runs");
    assert_eq!(output.status.code(), Some(2), "no run on no thread");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--workers"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asked_percentiles_reach_the_json_and_the_csv_and_the_block_says_n_a() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (summary_path, csv_path) = (dir.path().join("summary.json"), dir.path().join("summary.csv"));
    let output = loadgen()
        .args(["--base-url", &url, "--model", "good", "--num-prompts", "10", "--quiet"])
        .args(["--random-input-len", "4", "--random-output-len", "4", "--percentiles", "50,90,99"])
        .arg("--save-summary")
        .arg(&summary_path)
        .arg("--save-summary-csv")
        .arg(&csv_path)
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("P95 Latency(s):                           N/A\n"), "{stdout}");
    assert!(stdout.contains("P95 TTFT (ms):                           N/A\n"), "{stdout}");
    assert!(!stdout.contains("P99 TTFT (ms):                           N/A"), "{stdout}");

    let summary: Summary = serde_json::from_str(&std::fs::read_to_string(&summary_path).expect("json")).expect("json");
    for d in [&summary.latency_s, &summary.ttft_ms, &summary.tpot_ms, &summary.itl_ms] {
        assert_eq!(d.percentiles.iter().map(|q| q.p).collect::<Vec<_>>(), [50.0, 90.0, 99.0]);
    }
    let csv = std::fs::read_to_string(&csv_path).expect("csv");
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "metric,count,mean,p50,p90,p99");
    assert_eq!(
        rows.iter().skip(1).map(|r| r.split(',').next().unwrap_or_default()).collect::<Vec<_>>(),
        ["latency_s", "ttft_ms", "tpot_ms", "itl_ms"]
    );

    let output = loadgen()
        .args(["--base-url", &url, "--model", "good", "--num-prompts", "1", "--percentiles", "50,101"])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("percentile 101 is not between 0 and 100"), "{stderr}");
}

#[tokio::test]
async fn failures_exit_1_with_an_error_line() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let output =
        loadgen().args(["--base-url", &url, "--model", "nope", "--num-prompts", "1"]).output().await.expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: model \"nope\" is not served"), "{stderr}");

    let output = loadgen()
        .args(["--model", "good", "--dataset-name", "sharegpt", "--dataset-path", "/nonexistent/share.json"])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: cannot read the ShareGPT file /nonexistent/share.json: No such file"), "{stderr}");
}

#[tokio::test]
async fn a_run_in_which_no_request_succeeded_exits_4_saying_why() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let output = loadgen()
        .args(["--base-url", &url, "--model", "http-500", "--num-prompts", "3", "--quiet"])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: all 3 requests failed (http_error 3); the first: http 500"), "{stderr}");
    // Some failed, some did not: a result, with its failures counted.
    let output = loadgen()
        .args(["--base-url", &url, "--model", "every-4th-fails", "--num-prompts", "8", "--quiet"])
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Runs loadgen with `args` and `--outcome-file`: its exit status, the
/// outcome it left (if any) and its stderr.
async fn outcome_of(args: &[&str]) -> (Option<i32>, Option<LoadOutcome>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("outcome.json");
    let output = loadgen().args(args).arg("--outcome-file").arg(&path).output().await.expect("runs");
    let outcome = std::fs::read(&path).ok().map(|b| serde_json::from_slice(&b).expect("an outcome"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").flatten().map(|e| e.file_name()).collect();
    assert!(leftovers.len() <= 1, "nothing but the outcome is left: {leftovers:?}");
    (output.status.code(), outcome, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test]
async fn the_outcome_file_says_what_the_exit_status_says_with_the_error() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let run = |model: &'static str, extra: &'static [&'static str]| {
        let mut args = vec!["--base-url", url.as_str(), "--model", model, "--num-prompts", "3", "--quiet"];
        args.extend(["--random-input-len", "4", "--random-output-len", "4"]);
        args.extend(extra);
        args
    };

    let (code, outcome, stderr) = outcome_of(&run("good", &[])).await;
    assert_eq!(outcome, Some(LoadOutcome::new(LoadExit::Completed, None)), "{stderr}");
    assert_eq!(code, Some(0));

    // An error: the words stderr has after "error: ", typed.
    let (code, outcome, stderr) = outcome_of(&run("nope", &[])).await;
    let outcome = outcome.expect("an outcome");
    assert_eq!((code, outcome.exit, outcome.code), (Some(1), LoadExit::Error, 1));
    let error = outcome.error.expect("the error");
    assert!(error.starts_with("model \"nope\" is not served by "), "{error}");
    assert!(stderr.contains(&format!("error: {error}")), "{stderr}");
    // A server that is not there, and a dataset that is not there.
    let (code, outcome, _) =
        outcome_of(&["--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "1"]).await;
    let error = outcome.and_then(|o| o.error).unwrap_or_default();
    assert_eq!(code, Some(1));
    assert!(error.starts_with("cannot reach the server at http://127.0.0.1:9/v1/models; is it running?"), "{error}");
    let (code, outcome, _) =
        outcome_of(&["--model", "m", "--dataset-name", "sharegpt", "--dataset-path", "/nonexistent/share.json"]).await;
    let error = outcome.and_then(|o| o.error).unwrap_or_default();
    assert_eq!(code, Some(1));
    assert!(error.starts_with("cannot read the ShareGPT file /nonexistent/share.json"), "{error}");

    // A command line that does not parse: clap's usage error, before any
    // outcome file is known.
    let (code, outcome, stderr) = outcome_of(&run("good", &["--no-such-flag"])).await;
    assert_eq!((code, outcome), (Some(2), None), "{stderr}");

    // INVALID, with --fail-on-invalid: why, from the summary.
    let (code, outcome, stderr) =
        outcome_of(&run("good", &["--request-rate", "200", "--lag-limit-ms", "0.000001", "--fail-on-invalid"])).await;
    let outcome = outcome.expect("an outcome");
    assert_eq!((code, outcome.exit), (Some(3), LoadExit::Invalid), "{stderr}");
    let error = outcome.error.expect("why");
    assert!(error.starts_with("the run is INVALID: "), "{error}");
    assert!(!stderr.contains("error: "), "an INVALID run is no error: {stderr}");
    // Without it, the run completed.
    let (code, outcome, _) = outcome_of(&run("good", &["--request-rate", "200", "--lag-limit-ms", "0.000001"])).await;
    assert_eq!((code, outcome.map(|o| o.exit)), (Some(0), Some(LoadExit::Completed)));

    // None succeeded.
    let (code, outcome, _) = outcome_of(&run("http-500", &[])).await;
    let outcome = outcome.expect("an outcome");
    assert_eq!((code, outcome.exit, outcome.code), (Some(4), LoadExit::NoneSucceeded, 4));
    let error = outcome.error.expect("why");
    assert!(error.starts_with("all 3 requests failed (http_error 3); the first: http 500"), "{error}");
}

#[tokio::test]
async fn a_vllm_bench_serve_command_line_runs_unchanged_and_writes_vllm_s_result() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let port = url.rsplit(':').next().expect("a port").to_owned();
    let tmp = tempfile::tempdir().expect("tempdir");
    // A result directory that does not exist yet: made, as vLLM makes it.
    let dir = tmp.path().join("results/today");
    let tokenizer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer.json");
    // Every flag docs/loadgen.md maps for random prompts, as vLLM takes them.
    let vllm_line = [
        "--backend",
        "vllm",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--endpoint",
        "/v1/completions",
        "--model",
        "good",
        "--tokenizer",
        tokenizer.to_str().expect("utf-8"),
        "--dataset-name",
        "random",
        "--random-range-ratio",
        "0.0",
        "--random-input-len",
        "8",
        "--random-output-len",
        "4",
        "--num-prompts",
        "5",
        "--request-rate",
        "50",
        "--burstiness",
        "1.0",
        "--max-concurrency",
        "4",
        "--disable-shuffle",
        "--label",
        "nightly",
        "--ignore-eos",
        "--save-result",
        "--result-dir",
        dir.to_str().expect("utf-8"),
        "--result-filename",
        "r.json",
        "--metric-percentiles",
        "50,99",
        "--percentile-metrics",
        "ttft,e2el",
        "--seed",
        "7",
        "--goodput",
        "ttft:60000",
        "e2el:60000",
        "--quiet",
    ];
    let output = loadgen().args(vllm_line).output().await.expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).expect("the result file")).expect("json");
    assert_eq!((result["completed"].as_u64(), result["failed"].as_u64()), (Some(5), Some(0)));
    assert_eq!((result["backend"].as_str(), result["request_rate"].as_f64()), (Some("openai"), Some(50.0)));
    assert_eq!((result["label"].as_str(), result["max_concurrency"].as_u64()), (Some("nightly"), Some(4)));
    assert_eq!(result["input_lens"].as_array().map(Vec::len), Some(5));
    assert_eq!(result["output_lens"], serde_json::json!([4, 4, 4, 4, 4]));
    for key in ["mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "p99_e2el_ms"] {
        assert!(result[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {}", result[key]);
    }
    assert!(result.get("mean_tpot_ms").is_none(), "only the metrics asked for");
    assert!(result["total_token_throughput"].as_f64().is_some_and(|v| v > 0.0));
    // Every request was well within a minute: all of them good.
    assert_eq!(result["request_goodput"], result["request_throughput"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Request goodput (req/s):"), "{stdout}");

    // What loadgen cannot honour as vLLM would is refused, naming the flag.
    for (extra, said) in [
        (&["--burstiness", "0.5"][..], "--burstiness 0.5: loadgen's arrivals are Poisson"),
        (&["--random-range-ratio", "0.1"][..], "--random-range-ratio 0.1: loadgen spreads random lengths normally"),
        (&["--backend", "tgi"][..], "--backend tgi: loadgen speaks the OpenAI API"),
    ] {
        let output = loadgen()
            .args(["--base-url", &url, "--model", "good", "--num-prompts", "1"])
            .args(extra)
            .output()
            .await
            .expect("runs");
        assert_eq!(output.status.code(), Some(1), "{extra:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{extra:?}: {stderr}");
    }
    // SLOs that are not vLLM's are refused, saying what is wrong.
    for (slo, said) in [
        ("ttft:fast", "'ttft:fast': the bound must be a number of ms, at least 0"),
        ("ttfb:200", "'ttfb:200': unknown metric 'ttfb'; the SLOs are ttft, tpot and e2el"),
        ("ttft", "'ttft' is not KEY:VALUE"),
        ("tpot:-1", "'tpot:-1': the bound must be a number of ms"),
    ] {
        let output = loadgen()
            .args(["--base-url", &url, "--model", "good", "--num-prompts", "1", "--goodput", slo])
            .output()
            .await
            .expect("runs");
        assert!(!output.status.success(), "{slo}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("--goodput: {said}")), "{slo}: {stderr}");
    }
}

#[tokio::test]
async fn a_trace_replays_from_the_command_line_and_its_faults_name_the_line() {
    let _machine = crate::beside().await;
    let url = fake_openai::start(QUICK).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("trace.jsonl");
    let good = r#"{"timestamp": 0, "input_length": 30, "output_length": 2, "hash_ids": [5]}
{"timestamp": 80, "input_length": 600, "output_length": 3, "hash_ids": [5, 6]}
{"timestamp": 160, "input_length": 12, "output_length": 1, "hash_ids": [5]}
"#;
    let trace = |extra: &[&str]| {
        let mut args = vec!["--base-url", &url, "--model", "good", "--dataset-name", "trace"];
        args.extend(["--dataset-path", path.to_str().expect("utf-8")]);
        args.extend(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    std::fs::write(&path, good).expect("write");
    let json = dir.path().join("result.json");
    let output = loadgen()
        .args(trace(&["--num-prompts", "3", "--trace-speed", "4", "--save-result", "--result-filename"]))
        .arg(&json)
        .output()
        .await
        .expect("runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("saved")).expect("json");
    assert_eq!((result["completed"].as_u64(), result["total_input_tokens"].as_u64()), (Some(3), Some(642)), "{result}");

    for (text, extra, said) in [
        (good, &["--num-prompts", "4"][..], "--num-prompts: 4 requests asked of the trace"),
        (good, &["--num-prompts", "3", "--request-rate", "5"][..], "a trace sends on its own schedule"),
        (good, &["--num-prompts", "3", "--trace-speed", "0"][..], "--trace-speed must be above 0, got 0"),
        (
            "{\"timestamp\": 0, \"input_length\": 3, \"output_length\": 1, \"hash_ids\": []}\n{\"timestamp\": 1}\n",
            &["--num-prompts", "1"][..],
            "line 2: no output_length",
        ),
        (good, &["--num-prompts", "1", "--trace-format", "jsonl"][..], ""),
    ] {
        std::fs::write(&path, text).expect("write");
        let output = loadgen().args(trace(extra)).output().await.expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        if said.is_empty() {
            assert!(output.status.success(), "{extra:?}: {stderr}");
        } else {
            assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
            assert!(stderr.contains(said), "{extra:?}: {stderr}");
        }
    }
}
