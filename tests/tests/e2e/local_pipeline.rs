//! The local pipeline end to end: submit the example matrix, every job
//! finishes, every request record is stored, the stored summaries agree with
//! a recomputation from the stored records, and the report has the block's
//! fields in order.

use std::path::Path;
use std::time::Duration;

use benchfleet_cli::client;
use benchfleet_loadgen::{Summary, summarize};
use benchfleet_study::model::{AttemptKey, JobState, RunId};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn assert_same(stored: &Summary, recomputed: &Summary) {
    assert_eq!(stored.successful, recomputed.successful);
    assert_eq!(stored.failed, recomputed.failed);
    assert_eq!(stored.total_input_tokens, recomputed.total_input_tokens);
    assert_eq!(stored.total_output_tokens, recomputed.total_output_tokens);
    assert_eq!(stored.peak_concurrent, recomputed.peak_concurrent);
    assert_eq!(stored.peak_output_throughput.is_some(), recomputed.peak_output_throughput.is_some());
    for (a, b) in [
        (stored.duration_s, recomputed.duration_s),
        (stored.request_throughput, recomputed.request_throughput),
        (stored.output_throughput, recomputed.output_throughput),
        (stored.total_token_throughput, recomputed.total_token_throughput),
        (stored.peak_output_throughput.unwrap_or(0.0), recomputed.peak_output_throughput.unwrap_or(0.0)),
        (stored.latency_s.mean, recomputed.latency_s.mean),
        (stored.latency_s.p99, recomputed.latency_s.p99),
        (stored.ttft_ms.mean, recomputed.ttft_ms.mean),
        (stored.ttft_ms.median, recomputed.ttft_ms.median),
        (stored.tpot_ms.mean, recomputed.tpot_ms.mean),
        (stored.tpot_ms.p95, recomputed.tpot_ms.p95),
        (stored.itl_ms.mean, recomputed.itl_ms.mean),
        (stored.itl_ms.p99, recomputed.itl_ms.p99),
    ] {
        assert!(close(a, b), "stored {a} vs recomputed {b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_matrix_runs_end_to_end() -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info").try_init();
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start(dir.path()).await?;
    let matrix = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart.yaml");
    let mut operator = client::connect(&fleet.url).await?;
    let submitted = client::submit(&mut operator, client::submission(&matrix, Some("process"))?).await?;
    assert_eq!(submitted.jobs, 4);
    let mut seen = Vec::new();
    let last = client::watch(&fleet.url, &submitted.run_id, Duration::from_secs(30), |p| {
        seen.push(p.run.as_ref().map_or(0, |r| r.jobs_done))
    })
    .await?;
    let run = last.run.unwrap_or_default();
    assert_eq!((run.jobs_done, run.jobs_failed, run.jobs_total), (4, 0, 4));
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "progress never goes back: {seen:?}");
    let report = operator
        .get_report(benchfleet_proto::GetReportRequest { run_id: submitted.run_id.clone(), format: String::new() })
        .await?
        .into_inner()
        .text;
    // Through the controller, each format; a format it has not got is bad input.
    for (format, starts) in
        [("markdown", "# "), ("json", "{"), ("csv", "run,configuration"), ("html", "<!DOCTYPE html>")]
    {
        let text = operator
            .get_report(benchfleet_proto::GetReportRequest {
                run_id: submitted.run_id.clone(),
                format: format.to_owned(),
            })
            .await?
            .into_inner()
            .text;
        assert!(text.starts_with(starts), "{format}: {}", &text[..text.len().min(200)]);
    }
    let refused = operator
        .get_report(benchfleet_proto::GetReportRequest { run_id: submitted.run_id.clone(), format: "pdf".into() })
        .await
        .expect_err("no pdf");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("unknown report format \"pdf\""), "{refused:?}");
    fleet.stop().await;

    let run_id: RunId = submitted.run_id.parse().map_err(anyhow::Error::msg)?;
    let jobs = store.jobs(run_id)?;
    assert_eq!(jobs.len(), 4);
    for job in &jobs {
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
        let stored = job.summary.as_ref().expect("a succeeded job has its summary");
        let records =
            crate::fleet::records(store.as_ref(), &AttemptKey { run: run_id, job: job.id, attempt: job.attempt })?;
        // Every request sent has its record, once.
        assert_eq!(records.len() as u64, job.profile.requests);
        assert_eq!(stored.successful + stored.failed, job.profile.requests);
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (0..job.profile.requests).collect::<Vec<_>>());
        assert_same(stored, &summarize(&records, stored.max_concurrency));
        assert!(stored.successful > 0 && stored.total_output_tokens > 0);
        // The GPUs the attempt ran on are stored with the result.
        assert!(job.gpu_fingerprint.iter().any(|g| g.starts_with("NVIDIA H200")), "{:?}", job.gpu_fingerprint);
    }

    // One block per (configuration, profile), each with its fields in order.
    assert_eq!(report.matches("============ Serving Benchmark Result ============").count(), 4, "{report}");
    let fields = [
        "Successful requests:",
        "Maximum request concurrency:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Peak output token throughput (tok/s):",
        "Peak concurrent requests:",
        "Total Token throughput (tok/s):",
        "Mean Latency(s):",
        "Median Latency(s):",
        "P95 Latency(s):",
        "P99 Latency(s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P95 TTFT (ms):",
        "P99 TTFT (ms):",
        "Mean TPOT (ms):",
        "Median TPOT (ms):",
        "P95 TPOT (ms):",
        "P99 TPOT (ms):",
        "Mean ITL (ms):",
        "Median ITL (ms):",
        "P95 ITL (ms):",
        "P99 ITL (ms):",
    ];
    for block in report.split("============ Serving Benchmark Result ============").skip(1) {
        let labels: Vec<&str> =
            block.lines().filter_map(|l| l.find(':').map(|i| &l[..=i])).take(fields.len()).collect();
        assert_eq!(labels, fields);
    }
    assert!(report.contains("GPU: NVIDIA H200"), "{report}");
    for config in ["## vllm\n", "## vllm+prefix-caching\n"] {
        assert!(report.contains(config), "{report}");
    }
    assert!(report.contains("vllm serve Qwen/Qwen3.5-9B --max-model-len=8192 --enable-prefix-caching"), "{report}");
    Ok(())
}

/// Runs a two-profile matrix on one engine and gives its jobs, by profile.
async fn two_profiles(engine: &str, extra: &str) -> anyhow::Result<(Vec<benchfleet_study::model::Job>, String)> {
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start(dir.path()).await?;
    let matrix = dir.path().join("cache.yaml");
    std::fs::write(
        &matrix,
        format!(
            "name: cache\nmodel: m\nhardware: {{ gpu: H200, gpus_per_job: 1 }}\n{extra}engines:\n  {engine}\n\
             profiles:\n  a: {{ dataset: {{ random: {{ input_tokens: 64, output_tokens: 4 }} }}, requests: 4 }}\n  \
             b: {{ dataset: {{ random: {{ input_tokens: 64, output_tokens: 4 }} }}, requests: 4 }}\n"
        ),
    )?;
    let (run_id, _) = crate::fleet::run_matrix(&fleet.url, &matrix, Some("process")).await?;
    let run = run_id.parse::<RunId>().map_err(anyhow::Error::msg)?;
    let mut jobs = store.jobs(run)?;
    jobs.sort_by(|a, b| a.profile.name.cmp(&b.profile.name));
    let report = benchfleet_controller::report::render(store.as_ref(), run)?.text;
    fleet.stop().await;
    Ok((jobs, report))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_starts_with_an_empty_prefix_cache_or_says_why_not() -> anyhow::Result<()> {
    // SGLang's engine is emptied its own way (the simulator serves only
    // /flush_cache for it, as SGLang does).
    let (jobs, _) = two_profiles("sglang: { kind: sglang, runtime: process }", "").await?;
    let cache: Vec<(JobState, Option<&str>)> = jobs.iter().map(|j| (j.state, j.prefix_cache.as_deref())).collect();
    assert_eq!(
        cache,
        [
            (JobState::Succeeded, Some("cold: a freshly started engine")),
            (JobState::Succeeded, Some("cold: POST /flush_cache before the job")),
        ]
    );

    // An engine whose cache cannot be emptied fails the later job, for good.
    let refusing = "vllm: { runtime: process, args: [--sim-refuse-cache-reset] }";
    let (jobs, _) = two_profiles(refusing, "").await?;
    assert_eq!(jobs[0].state, JobState::Succeeded);
    assert_eq!(jobs[1].state, JobState::Failed);
    let error = jobs[1].error.as_deref().unwrap_or_default();
    assert!(
        error.contains("cannot empty the engine's prefix cache before the job: POST /reset_prefix_cache answered 404"),
        "{error}"
    );
    assert_eq!(jobs[1].attempts.len(), 1, "a configuration's failure is not retried");

    // Unless the matrix allows warm runs: then it runs, and says so.
    let (jobs, report) = two_profiles(refusing, "allow_warm_cache: true\n").await?;
    assert_eq!(jobs[1].state, JobState::Succeeded);
    let said = jobs[1].prefix_cache.as_deref().unwrap_or_default();
    assert!(said.starts_with("warm: the cache could not be emptied (POST /reset_prefix_cache answered 404"), "{said}");
    assert!(report.contains(&format!("repeat 1 ran with its prefix cache {said}")), "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_every_request_failed_is_a_failed_job() -> anyhow::Result<()> {
    let (jobs, _) = two_profiles("vllm: { runtime: process, args: [--sim-fail-rate=1] }", "").await?;
    for job in &jobs {
        assert_eq!(job.state, JobState::Failed, "{job:?}");
        let error = job.error.as_deref().unwrap_or_default();
        assert!(error.contains("all 4 requests failed (http_error 4); the first: http 500"), "{error}");
    }
    Ok(())
}

/// A run's jobs, the store they are in, and the directory that holds it.
type Ran = (Vec<benchfleet_study::model::Job>, std::sync::Arc<dyn benchfleet_controller::Store>, tempfile::TempDir);

/// Runs `yaml` (with `files` beside it) on a one-GPU fleet to its end.
async fn run_alone(yaml: &str, files: &[(&str, &std::path::Path)]) -> anyhow::Result<Ran> {
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start(dir.path()).await?;
    for (name, from) in files {
        std::fs::copy(from, dir.path().join(name))?;
    }
    let matrix = dir.path().join("matrix.yaml");
    std::fs::write(&matrix, yaml)?;
    let (run_id, _) = crate::fleet::run_matrix(&fleet.url, &matrix, Some("process")).await?;
    let run = run_id.parse::<RunId>().map_err(anyhow::Error::msg)?;
    let jobs = store.jobs(run)?;
    fleet.stop().await;
    Ok((jobs, store, dir))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_loadgen_can_do_the_matrix_can_say() -> anyhow::Result<()> {
    let (jobs, _, _dir) = run_alone(
        "name: say\nmodel: m\nhardware: { gpu: H200 }\nengines:\n  vllm: { runtime: process }\nprofiles:\n  \
         prefixes:\n    dataset: { shared_prefix: { groups: 2, prefix_tokens: 32, suffix_tokens: 8, output_tokens: 3 } }\n    \
         mode: synchronous\n    requests: 10\n    warmup: 2\n    cooldown: 1\n    ignore_eos: true\n    \
         extra_body: { temperature: 0 }\n    max_duration: 5m\n    goodput: { ttft_ms: 60000, e2el_ms: 60000 }\n",
        &[],
    )
    .await?;
    let job = &jobs[0];
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let s = job.summary.as_ref().expect("a summary");
    // Every request well within a minute: all of them good, through the
    // agent, loadgen and the ingest's summary.
    let g = s.goodput.expect("the profile's goodput SLOs reached loadgen");
    assert_eq!((g.slo.ttft_ms, g.slo.e2el_ms, g.good), (Some(60000.0), Some(60000.0), 7));
    // Warm-up and cool-down are sent and recorded, not measured; one at a
    // time; every prompt 40 tokens, every reply 3.
    assert_eq!((s.successful, s.excluded, s.max_concurrency), (7, 3, Some(1)));
    assert_eq!((s.total_input_tokens, s.total_output_tokens), (7 * 40, 7 * 3));
    assert!(s.peak_concurrent <= 1, "{s:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenizer_file_travels_like_a_dataset_and_loadgen_counts_with_it() -> anyhow::Result<()> {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadgen/tests/fixtures/tokenizer.json");
    let (jobs, store, _dir) = run_alone(
        "name: tokens\nmodel: m\nprocessor: tokenizer.json\nhardware: { gpu: H200 }\nengines:\n  vllm: { runtime: process }\n\
         profiles:\n  a: { dataset: { random: { input_tokens: 32, output_tokens: 4 } }, requests: 4 }\n",
        &[("tokenizer.json", &fixture)],
    )
    .await?;
    let job = &jobs[0];
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let sha = job.profile.processor.as_ref().map(|f| f.sha256.clone()).expect("the job names the tokenizer");
    assert!(store.has_file(&sha)?, "uploaded once, stored by its hash");
    // Only a run with a tokenizer holds the server's counts against it.
    let check = job.summary.as_ref().and_then(|s| s.usage_check).expect("loadgen had the tokenizer");
    // Replies whose events agree with the server's count are tokenized one
    // in 16; every reply is accounted for either way.
    assert_eq!((check.prompts_compared, check.outputs_compared + check.outputs_by_events), (4, 4));
    assert!(check.outputs_compared >= 1, "the sample includes the first: {check:?}");
    Ok(())
}
