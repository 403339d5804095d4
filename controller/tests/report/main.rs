//! The report of a whole greedy study, as the reference reports run it
//! (Qwen3.5-35B-A3B on H200, throughput): the run is planned stage by stage
//! by the controller's own planner (`plan::prepare`, `plan::next`) in a real
//! store, each job given the numbers of the reference study's table, and
//! the report rendered in every format. The console, Markdown and CSV forms
//! are held to snapshot files (`BENCHFLEET_UPDATE_SNAPSHOTS=1` rewrites
//! them after a deliberate change: read the diff); the JSON form is read
//! back and held to its documentation; the HTML page to its charts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use benchfleet_controller::model::{AgentId, AttemptInfo, AttemptOutcome, Job, JobState, RunId, RunState, Write};
use benchfleet_controller::plan::{self, Next, Submission};
use benchfleet_controller::report::{self, Format, compare, doc::ReportDoc};
use benchfleet_controller::store::{RecordCommit, SledStore, Store};
use benchfleet_core::Summary;
use benchfleet_core::metrics::Distribution;
use sha2::Digest as _;

const MATRIX: &str = "\
name: qwen3.5-35b-a3b-h200-throughput
model: Qwen/Qwen3.5-35B-A3B
objective: total_token_throughput
hardware: { gpu: H200, gpus_per_job: 1 }
acceptance: { min_success_rate: 0.99 }
repeats: 1
engines:
  vllm: { image: vllm/vllm-openai:v0.17.1, args: [--reasoning-parser=qwen3, --max-model-len=32768] }
  sglang: { image: lmsysorg/sglang:v0.5.9, args: [--reasoning-parser=qwen3, --context-length=32768] }
variants:
  quantization: { model: Qwen/Qwen3.5-35B-A3B-FP8 }
  prefix-caching: { engines: [vllm], args: [--enable-prefix-caching] }
  performance-mode: { engines: [vllm], args: [--performance-mode=throughput] }
  kv-fp8: { engines: [vllm], args: [--kv-cache-dtype=fp8] }
  mtp: { engines: [vllm], args: ['--speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1}'] }
profiles:
  sharegpt: { dataset: { sharegpt: sharegpt.json }, rate: 1000, requests: 1000 }
  throughput: { dataset: { random: { input_tokens: 1024, output_tokens: 128, seed: 42 } }, rate: 1000, requests: 1000 }
  long-context: { dataset: { random: { input_tokens: 32000, output_tokens: 100, seed: 42 } }, rate: 1000, requests: 100 }
  generation: { dataset: { random: { input_tokens: 1000, output_tokens: 2000, seed: 42 } }, rate: 1000, requests: 200 }
primary_profile: sharegpt
strategy: greedy
";

const SHAREGPT: &str = r#"[{"id":"a","conversations":[{"from":"human","value":"Say hello."},{"from":"gpt","value":"Hello there, friend."}]}]"#;

/// The reference study's baseline numbers per profile: vLLM's total token
/// throughput and mean TPOT.
fn baseline(profile: &str) -> (f64, f64) {
    match profile {
        "sharegpt" => (9632.01, 25.89),
        "throughput" => (37934.72, 45.39),
        "long-context" => (44993.20, 319.79),
        _ => (10455.38, 2.48),
    }
}

/// Each variant's effect on throughput, and the success rate it leaves.
fn factor(variant: &str) -> (f64, f64) {
    match variant {
        "quantization" => (1.0323, 1.0),
        "prefix-caching" => (1.04, 1.0),
        "performance-mode" => (1.0224, 1.0),
        "kv-fp8" => (0.98, 1.0),
        "mtp" => (1.6107, 0.516),
        other => panic!("no factor for variant {other}"),
    }
}

/// A job's summary with the study's numbers for its configuration.
fn summary(engine: &str, variants: &[String], profile: &str, requests: u64) -> Summary {
    let (mut tps, mut tpot) = baseline(profile);
    let mut success = 1.0;
    if engine == "sglang" {
        (tps, tpot) = (tps * 0.5186, tpot * 6.98);
    }
    for v in variants {
        let (f, s) = factor(v);
        (tps, tpot) = (tps * f, tpot / f.sqrt());
        success *= s;
    }
    let successful = (requests as f64 * success).round() as u64;
    let duration_s = 70.72 * 9632.01 / tps;
    let dist = |mean: f64| Distribution {
        mean,
        median: mean * 0.91,
        p95: mean * 2.1,
        p99: mean * 2.5,
        count: successful,
        percentiles: Vec::new(),
    };
    let latency_s = tpot * 1.1;
    Summary {
        successful,
        failed: requests - successful,
        duration_s,
        total_input_tokens: 342 * successful,
        total_output_tokens: 281 * successful,
        request_throughput: successful as f64 / duration_s,
        output_throughput: tps * 0.45,
        peak_output_throughput: Some(tps * 0.9),
        peak_concurrent: successful.min(512),
        total_token_throughput: tps,
        latency_s: dist(latency_s),
        ttft_ms: dist(latency_s * 130.0),
        tpot_ms: dist(tpot),
        itl_ms: dist(tpot * 0.44),
        achieved_rate: 1000.0,
        offered_rate: Some(1000.0),
        lag_limit_ms: 5.0,
        rate_tolerance: 0.05,
        ..Summary::default()
    }
}

/// The study run to its end in a store: each stage the planner asks for,
/// every job succeeded on one host with the numbers above.
fn study() -> (tempfile::TempDir, SledStore, RunId) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    let sha = benchfleet_controller::store::hex(&sha2::Sha256::digest(SHAREGPT.as_bytes()));
    let mut file = store.new_file().expect("file");
    file.write(SHAREGPT.as_bytes()).expect("write");
    file.finish(&sha, SHAREGPT.len() as u64).expect("finish");
    let sub = Submission {
        matrix_name: "qwen.yaml".into(),
        matrix_yaml: MATRIX.into(),
        files: BTreeMap::from([("sharegpt.json".to_owned(), sha)]),
        runtime_override: String::new(),
    };
    let mut prepared = plan::prepare(&store, &sub, || store.next_run_id()).expect("prepare");
    prepared.run.created_unix_ms = 1_796_000_000_000;
    let run = prepared.run.id;
    store.create_run(&prepared.run, &prepared.groups, &prepared.jobs).expect("create");
    let mut clock = 1_796_000_000_000;
    let (mut groups, mut jobs) = (prepared.groups, prepared.jobs);
    loop {
        let mut done = Vec::new();
        let mut summaries = Vec::new();
        for job in &jobs {
            let group = groups.iter().find(|g| g.id == job.group).expect("its group");
            let s = summary(&group.config.engine, &group.config.variants, &job.profile.name, job.profile.requests);
            let mut j: Job = job.clone();
            j.state = JobState::Succeeded;
            j.attempt = 1;
            j.gpu_fingerprint = vec!["NVIDIA H200, 143771 MiB, driver 570.124.06".into()];
            j.engine_startup_s = Some(92.4);
            j.prefix_cache = Some("cold: a freshly started engine".into());
            j.attempts = vec![AttemptInfo {
                number: 1,
                epoch: 1,
                agent: AgentId(1),
                agent_name: "h200-01".into(),
                started_unix_ms: clock,
                ended_unix_ms: Some(clock + (s.duration_s * 1000.0) as i64),
                outcome: AttemptOutcome::Succeeded,
                reason: None,
                charged: false,
                log_tail: None,
            }];
            clock += 200_000;
            j.summary = Some(s.clone());
            summaries.push((j.key(), s));
            done.push(Write::Job(j));
        }
        store.commit_records(&RecordCommit { summaries, ..Default::default() }).expect("summaries");
        store.apply(&done).expect("jobs");
        match plan::next(&store, run).expect("next") {
            Next::Stage { groups: g, jobs: j } => (groups, jobs) = (g, j),
            Next::Finished => break,
        }
    }
    let mut finished = store.run(run).expect("run").expect("stored");
    finished.state = RunState::Finished;
    finished.ended_unix_ms = Some(clock);
    store.apply(&[Write::Run(finished)]).expect("finish");
    (dir, store, run)
}

fn snapshot(name: &str, got: &str) {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/report/snapshots").join(name);
    if std::env::var_os("BENCHFLEET_UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        std::fs::write(&path, got).expect("write snapshot");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with BENCHFLEET_UPDATE_SNAPSHOTS=1 to write it", path.display()));
    if want != got {
        let line = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{} differs from the report at line {}:\n  want: {:?}\n  got:  {:?}\n(BENCHFLEET_UPDATE_SNAPSHOTS=1 rewrites it)",
            path.display(),
            line + 1,
            want.lines().nth(line).unwrap_or("<end>"),
            got.lines().nth(line).unwrap_or("<end>")
        );
    }
}

fn doc_of(store: &SledStore, run: RunId) -> ReportDoc {
    report::document(store, run, &|_, _| {}).expect("document")
}

#[test]
fn the_reference_study_reads_as_the_reference_report() {
    let (_dir, store, run) = study();
    let doc = doc_of(&store, run);
    let md = report::render_as(&doc, Format::Markdown);

    // The conclusion: the serve command one argument a line, and the
    // before/after table per profile in the reference's words.
    let rec = doc.recommendation.as_ref().expect("a recommendation");
    assert_eq!(rec.config, "vllm+quantization+prefix-caching+performance-mode", "{md}");
    assert!(
        md.contains(
            "```shell\nvllm serve Qwen/Qwen3.5-35B-A3B-FP8 \\\n    --reasoning-parser=qwen3 \\\n    --max-model-len=32768 \\\n"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| sharegpt | Total TPS: 9632.01 Mean TPOT(ms): 25.89 | Total TPS: 10572.48 (+9.76%) Mean TPOT(ms): 24.71 |"
        ),
        "{md}"
    );
    // The engine stage's summary sentence.
    assert!(
        md.contains(
            "Summary: vllm Total TPS = 9632.01, sglang Total TPS = 4995.16. vllm higher by 4,636.85 tok/s (92.8%); \
             Mean TPOT = 25.89 ms vs 180.71 ms, lower by 154.82 ms (85.67%)."
        ),
        "{md}"
    );
    // A stage ranks only what could be adopted.
    assert!(
        md.contains("vllm+mtp Total TPS = 15514.28 (success rate 51.6%, not adopted). vllm+prefix-caching higher by"),
        "{md}"
    );
    // The optimizations tried, the rejected ones marked.
    assert!(md.contains("success rate 51.6%, not adopted"), "{md}");
    assert!(md.contains("| `vllm+kv-fp8` |"), "{md}");
    for section in [
        "## Conclusion",
        "## Notes",
        "## Setup",
        "## Benchmark profiles",
        "## Results",
        "## Summary of the optimizations",
        "## Other benchmark profiles",
    ] {
        assert!(md.contains(section), "no {section}:\n{md}");
    }
    // Every block has its provenance.
    let blocks = md.matches("Serving Benchmark Result").count();
    assert!(blocks >= 12, "{blocks} blocks\n{md}");
    assert_eq!(md.matches("- repeat 1: job ").count(), blocks, "{md}");

    snapshot("reference-study.md", &md);
    snapshot("reference-study.txt", &report::render_as(&doc, Format::Console));
    snapshot("reference-study.csv", &report::render_as(&doc, Format::Csv));
}

#[test]
fn the_json_report_reads_back_and_every_field_is_documented() {
    let (_dir, store, run) = study();
    let doc = doc_of(&store, run);
    let json = report::render_as(&doc, Format::Json);
    let back: ReportDoc = serde_json::from_str(&json).expect("reads back");
    assert_eq!(back, doc);
    assert_eq!(back.schema, "benchfleet.report/v1");

    // Every key the report writes is named in docs/report-json.md.
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report-json.md"))
        .expect("docs/report-json.md");
    let value: serde_json::Value = serde_json::from_str(&json).expect("json");
    let mut keys = std::collections::BTreeSet::new();
    collect_keys(&value, &mut keys);
    let missing: Vec<&String> = keys.iter().filter(|k| !docs.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "docs/report-json.md does not name {missing:?}");
}

/// Keys of every object.
fn collect_keys(v: &serde_json::Value, keys: &mut std::collections::BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                keys.insert(k.clone());
                collect_keys(v, keys);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_keys(v, keys)),
        _ => {}
    }
}

#[test]
fn the_html_page_draws_its_charts_and_needs_no_network() {
    let (_dir, store, run) = study();
    let mut doc = doc_of(&store, run);
    // Intervals on one block, as three repeats would give.
    let block = doc.configurations[0].blocks.iter_mut().find(|b| b.profile == "sharegpt").expect("block");
    block.intervals = vec![benchfleet_controller::report::doc::Interval {
        metric: "Total token throughput (tok/s)".into(),
        mean: 9632.01,
        half_width: Some(120.0),
    }];
    let html = report::render_as(&doc, Format::Html);
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    // One bar chart per profile and the throughput-latency chart; no
    // distribution charts without stored samples.
    assert_eq!(html.matches("<svg").count(), doc.profiles.len() + 1, "{html}");
    let on_sharegpt = doc.configurations.iter().filter(|c| c.block("sharegpt").is_some()).count();
    let bars = html.matches("class=\"bar\"").count();
    let all_blocks: usize = doc.configurations.iter().map(|c| c.blocks.len()).sum();
    assert_eq!(bars, all_blocks, "a bar per block");
    assert!(on_sharegpt >= 8);
    assert_eq!(html.matches("class=\"interval\"").count(), 1);
    assert_eq!(html.matches("class=\"point\"").count(), all_blocks);
    for fetch in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(fetch), "the page would fetch something: {fetch}");
    }
}

#[test]
fn a_run_compared_with_itself_passes_and_a_slower_one_fails() {
    let (_dir, store, run) = study();
    let a = doc_of(&store, run);
    let same = compare::compare(&a, &a, 0.05, &compare::default_gate(&a));
    assert!(same.passed(), "{:?}", same);
    assert!(same.rows.iter().all(|r| r.change == compare::Change::WithinNoise));

    // B: the baseline 10% slower on the primary profile.
    let mut b = a.clone();
    b.run.id = 2;
    let block = b.configurations[0].blocks.iter_mut().find(|x| x.profile == "sharegpt").expect("block");
    for r in &mut block.repeats {
        if let Some(s) = r.summary.as_mut() {
            s.total_token_throughput *= 0.9;
        }
    }
    let c = compare::compare(&a, &b, 0.05, &compare::default_gate(&a));
    assert_eq!(c.regressions(), 1, "{}", compare::render(&c, &a, &b, 0.05));
    let text = compare::render(&c, &a, &b, 0.05);
    assert!(text.contains("-10.00% (no interval)  REGRESSION"), "{text}");
    // Below the threshold it is noise.
    assert!(compare::compare(&a, &b, 0.15, &compare::default_gate(&a)).passed());
    // Not gated, it is reported and passes.
    let ungated = compare::compare(&a, &b, 0.05, &["mean_ttft_ms".to_owned()]);
    assert!(ungated.passed());
    assert!(compare::render(&ungated, &a, &b, 0.05).contains("worse (not gated)"));

    // A block that failed in B fails the gate.
    let mut failed = a.clone();
    let block = failed.configurations[0].blocks.iter_mut().find(|x| x.profile == "sharegpt").expect("block");
    for r in &mut block.repeats {
        r.state = "failed".into();
        r.summary = None;
    }
    let c = compare::compare(&a, &failed, 0.05, &compare::default_gate(&a));
    assert!(!c.passed() && c.failures.len() == 1, "{c:?}");
}

#[test]
fn thresholds_and_metrics_are_checked() {
    assert_eq!(compare::parse_threshold("5%"), Ok(0.05));
    assert_eq!(compare::parse_threshold("0.05"), Ok(0.05));
    assert_eq!(compare::parse_threshold("5"), Ok(0.05));
    assert!(compare::parse_threshold("fast").expect_err("not a number").contains("not a number"));
    assert!(compare::parse_threshold("150%").expect_err("too big").contains("between"));
    assert!(compare::check_metrics(&["p99_itl_ms".into()]).is_ok());
    assert!(compare::check_metrics(&["p42".into()]).expect_err("unknown").contains("unknown metric \"p42\""));
}
