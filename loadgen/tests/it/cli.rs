//! The binary: flags, the printed block, saved records and summary, exit
//! codes.

use std::time::Duration;

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
    let url = fake_openai::start(QUICK).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (records_path, summary_path) = (dir.path().join("records.jsonl"), dir.path().join("summary.json"));
    let output = loadgen()
        .args(["--base-url", &url, "--model", "good", "--endpoint", "/v1/chat/completions"])
        .args(["--random-input-len", "12", "--random-output-len", "6", "--num-prompts", "20"])
        .args(["--request-rate", "100", "--seed", "3", "--max-concurrency", "4", "--quiet"])
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
}

#[tokio::test]
async fn failures_exit_1_with_an_error_line() {
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
    assert!(stderr.contains("error: cannot read dataset /nonexistent/share.json: "), "{stderr}");
}
