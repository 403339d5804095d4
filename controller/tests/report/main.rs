//! The report of a whole greedy study, as the reference reports run it
//! (Qwen3.5-35B-A3B on H200, throughput): the run is planned stage by stage
//! by the controller's own planner (`plan::prepare`, `plan::next`) in a real
//! store, each job given the numbers of the reference study's table, and
//! the report rendered in every format. The console, Markdown and CSV forms
//! are held to snapshot files (`BENCHFLEET_UPDATE_SNAPSHOTS=1` rewrites
//! them after a deliberate change: read the diff); the JSON form is read
//! back and held to its documentation; the HTML page to its charts.

use std::collections::BTreeMap;
use std::path::Path;

use benchfleet_study::model::{AgentId, AttemptInfo, AttemptOutcome, Job, JobState, RunId, RunState};

use benchfleet_controller::plan::{self, Next, Submission};
use benchfleet_controller::records::Write;
use benchfleet_controller::store::{RecordCommit, SledStore, Store};
use benchfleet_core::Summary;
use benchfleet_core::metrics::Distribution;
use benchfleet_study::greedy::{self, Plan};
use benchfleet_study::report::{Format, compare, doc::ReportDoc, render_as};
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
    study_of(MATRIX, summary)
}

/// A study's job summary: of (engine, variants, profile, requests).
type Numbers = fn(&str, &[String], &str, u64) -> Summary;

fn study_of(matrix: &str, summary: Numbers) -> (tempfile::TempDir, SledStore, RunId) {
    study_with(matrix, &|engine, variants, job| summary(engine, variants, &job.profile.name, job.profile.requests))
}

/// [`study_of`] with numbers that may also depend on the job (its repeat).
fn study_with(
    matrix: &str,
    summary: &dyn Fn(&str, &[String], &Job) -> Summary,
) -> (tempfile::TempDir, SledStore, RunId) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    let sha = benchfleet_controller::store::hex(&sha2::Sha256::digest(SHAREGPT.as_bytes()));
    let mut file = store.new_file().expect("file");
    file.write(SHAREGPT.as_bytes()).expect("write");
    file.finish(&sha, SHAREGPT.len() as u64).expect("finish");
    let sub = Submission {
        matrix_name: "qwen.yaml".into(),
        matrix_yaml: matrix.into(),
        files: BTreeMap::from([("sharegpt.json".to_owned(), sha)]),
        runtime_override: String::new(),
        fleet_per: String::new(),
        fleet_hosts: String::new(),
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
            let s = summary(&group.config.engine, &group.config.variants, job);
            let mut j: Job = job.clone();
            j.state = JobState::Succeeded;
            j.attempt = 1;
            j.gpu_fingerprint = vec!["NVIDIA H200, 143771 MiB, driver 570.124.06".into()];
            j.engine_startup_s = Some(92.4);
            j.prefix_cache = Some("cold: a freshly started engine".into());
            j.attempts = vec![AttemptInfo {
                price: None,
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

/// Holds `got` to `snapshots/NAME.snap` (`INSTA_UPDATE=always`, or
/// `cargo insta review`, takes a deliberate change: read the diff).
fn snapshot(name: &str, got: &str) {
    insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, got);
    });
}

fn doc_of(store: &SledStore, run: RunId) -> ReportDoc {
    benchfleet_controller::report::document(store, run, &|_, _| {}).expect("document")
}

#[test]
fn the_reference_study_reads_as_the_reference_report() {
    let (_dir, store, run) = study();
    let doc = doc_of(&store, run);
    let md = render_as(&doc, Format::Markdown);

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

    snapshot("throughput-study.md", &md);
    snapshot("throughput-study.txt", &render_as(&doc, Format::Console));
    snapshot("throughput-study.csv", &render_as(&doc, Format::Csv));
}

/// The latency study (Qwen3.5-9B on H100, mean latency): ShareGPT at four
/// rates, a sweep, decided at 8 requests/s.
const LATENCY: &str = "\
name: qwen3.5-9b-h100-latency
model: Qwen/Qwen3.5-9B
objective: mean_latency
hardware: { gpu: H100, gpus_per_job: 1 }
acceptance: { min_success_rate: 0.99 }
engines:
  vllm: { image: vllm/vllm-openai:v0.17.1, args: [--reasoning-parser=qwen3, --max-model-len=32768] }
  sglang: { image: lmsysorg/sglang:v0.5.9, args: [--reasoning-parser=qwen3, --context-length=32768] }
variants:
  prefix-caching: { engines: [vllm], args: [--enable-prefix-caching] }
  batched-16k: { engines: [vllm], group: max-batched-tokens, args: [--max-num-batched-tokens=16384] }
  batched-32k: { engines: [vllm], group: max-batched-tokens, args: [--max-num-batched-tokens=32768] }
  mtp: { engines: [vllm], args: ['--speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1}'] }
  interactivity: { engines: [vllm], args: [--performance-mode=interactivity] }
  language-only: { engines: [vllm], args: [--language-model-only] }
profiles:
  sharegpt: { dataset: { sharegpt: sharegpt.json }, rate: [1, 4, 8, 16], requests: 1000 }
primary_profile: sharegpt-r8
strategy: greedy
";

/// The latency study's numbers: vLLM's mean latency per rate, and what
/// each variant multiplies it by.
fn latency_summary(engine: &str, variants: &[String], profile: &str, requests: u64) -> Summary {
    let (mut latency, rate) = match profile {
        "sharegpt-r1" => (2.09, 1.0),
        "sharegpt-r4" => (2.33, 4.0),
        "sharegpt-r8" => (2.62, 8.0),
        _ => (4.37, 16.0),
    };
    if engine == "sglang" {
        latency *= 3.103;
    }
    for v in variants {
        latency *= match v.as_str() {
            "prefix-caching" => 1.027,
            "batched-16k" => 1.0076,
            "batched-32k" => 1.0077,
            "mtp" => 0.912,
            "interactivity" => 0.9958,
            "language-only" => 0.9748,
            other => panic!("no factor for {other}"),
        };
    }
    let duration_s = requests as f64 / rate * 1.02;
    let dist = |mean: f64| Distribution {
        mean,
        median: mean * 0.88,
        p95: mean * 2.6,
        p99: mean * 2.96,
        count: requests,
        percentiles: Vec::new(),
    };
    Summary {
        successful: requests,
        duration_s,
        total_input_tokens: 342 * requests,
        total_output_tokens: 281 * requests,
        request_throughput: requests as f64 / duration_s,
        output_throughput: 281.0 * requests as f64 / duration_s,
        peak_output_throughput: Some(2.0 * 281.0 * rate),
        peak_concurrent: (rate * latency).ceil() as u64,
        total_token_throughput: 623.0 * requests as f64 / duration_s,
        latency_s: dist(latency),
        ttft_ms: dist(latency * 15.7),
        tpot_ms: dist(latency * 0.51),
        itl_ms: dist(latency * 0.45),
        achieved_rate: rate,
        offered_rate: Some(rate),
        lag_limit_ms: 5.0,
        rate_tolerance: 0.05,
        ..Summary::default()
    }
}

/// A gain near the minimum effect, confirmed: performance mode's first run
/// gains 1.5%, under twice the 1% minimum, so it and the baseline run to
/// three repeats each in the store, whose mean puts it within noise.
#[test]
fn a_gain_near_the_minimum_effect_is_run_again_and_taken_on_its_repeats() {
    let matrix = MATRIX.replace("min_success_rate: 0.99 }", "min_success_rate: 0.99, confirm_repeats: 3 }");
    let (_dir, store, run) = study_with(&matrix, &|engine, variants, job| {
        let mut s = summary(engine, variants, &job.profile.name, job.profile.requests);
        if variants.iter().any(|v| v == "performance-mode") {
            let gain = if job.repeat == 1 { 1.015 } else { 0.996 };
            s.total_token_throughput *= gain / factor("performance-mode").0;
        }
        s
    });
    let repeats_of = |config: &str| {
        let groups = store.groups(run).expect("groups");
        let mut repeats: Vec<(u32, u32)> = store
            .jobs(run)
            .expect("jobs")
            .iter()
            .filter(|j| j.profile.name == "sharegpt")
            .filter(|j| groups.iter().any(|g| g.id == j.group && g.config.name == config))
            .map(|j| (groups.iter().find(|g| g.id == j.group).expect("its group").stage, j.repeat))
            .collect();
        repeats.sort();
        repeats
    };
    // Stage 2 ran both again, numbering their repeats after the first.
    assert_eq!(repeats_of("vllm"), [(1, 1), (2, 2), (2, 3)]);
    assert_eq!(repeats_of("vllm+performance-mode"), [(2, 1), (2, 2), (2, 3)]);
    // Far from the gate, the others ran once.
    assert_eq!(repeats_of("vllm+prefix-caching"), [(2, 1)]);
    let doc = doc_of(&store, run);
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains("over 3 and 3 repeats, within noise, not adopted"), "{md}");
    assert!(md.contains("1 repeat (3 where a decision was confirmed) per configuration and profile"), "{md}");
    assert!(md.contains("was taken again once both sides had run 3 times"), "{md}");
    assert!(md.contains("+4.00%, over 3 and 1 repeats, helps"), "{md}");
    let rec = doc.recommendation.as_ref().expect("a recommendation");
    assert!(!rec.config.contains("performance-mode"), "{}", rec.config);
    // While the confirmation ran, the planner (and a report read then) stood at stage 2, waiting
    // for it, on the repeats before it.
    let matrix = benchfleet_study::matrix::parse("qwen.yaml", &matrix, &|_| Some("ab".repeat(32))).expect("valid");
    let groups: Vec<_> = store.groups(run).expect("groups").into_iter().filter(|g| g.stage <= 2).collect();
    let mut jobs: Vec<Job> =
        store.jobs(run).expect("jobs").into_iter().filter(|j| groups.iter().any(|g| g.id == j.group)).collect();
    for j in jobs.iter_mut().filter(|j| j.repeat > 1) {
        j.state = JobState::Pending;
    }
    let planned = greedy::plan(&matrix, &greedy::Results::of(&groups, &jobs, &matrix));
    let Plan::Next(stage) = planned.plan else { panic!("the confirmation is still running: {planned:?}") };
    let names: Vec<&str> = stage.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!((stage.number, names, stage.repeats), (2, vec!["vllm", "vllm+performance-mode"], vec![2..=3, 2..=3]));
    // The confirmed configurations' repeats are pooled in their blocks.
    let vllm = doc.configurations.iter().find(|c| c.name == "vllm").expect("vllm");
    let sharegpt = vllm.blocks.iter().find(|b| b.profile == "sharegpt").expect("its sharegpt block");
    assert_eq!(sharegpt.repeats.len(), 3, "{md}");
}

#[test]
fn the_latency_study_compares_by_ratio_across_its_rates() {
    let (_dir, store, run) = study_of(LATENCY, latency_summary);
    let doc = doc_of(&store, run);
    let md = render_as(&doc, Format::Markdown);
    let rec = doc.recommendation.as_ref().expect("a recommendation");
    // Performance mode's 0.4% is within noise here: not adopted.
    assert_eq!(rec.config, "vllm+mtp+language-only", "{md}");
    assert!(
        md.contains("`vllm+interactivity`: 1.00x faster (2.62 s vs 2.61 s), below the 1.00% minimum effect"),
        "{md}"
    );
    // The before/after table in the latency form, per rate, in the matrix's order.
    assert!(
        md.contains(
            "| sharegpt-r1 | Mean latency: 2.09s/req | Mean latency: 1.86s/req (1.12x faster) |\n\
             | sharegpt-r4 | Mean latency: 2.33s/req | Mean latency: 2.07s/req (1.12x faster) |\n\
             | sharegpt-r8 | Mean latency: 2.62s/req | Mean latency: 2.33s/req (1.12x faster) |\n\
             | sharegpt-r16 | Mean latency: 4.37s/req | Mean latency: 3.89s/req (1.12x faster) |"
        ),
        "{md}"
    );
    assert!(md.contains("| `vllm+mtp` | Mean latency: 2.39s/req | Mean latency: 2.62s/req | 1.10x faster"), "{md}");
    // The engine stage says how much faster, in latency, TTFT and TPOT.
    assert!(
        md.contains("Summary: vllm Mean latency = 2.62s, sglang Mean latency = 8.13s. vllm faster by 5.51 s (3.10x faster). TTFT"),
        "{md}"
    );
    // The alternatives of a group stand for it one at a time, never both.
    assert!(!md.contains("batched-16k+batched-32k"), "{md}");
    snapshot("latency-study.md", &md);
    snapshot("latency-study.txt", &render_as(&doc, Format::Console));
}

/// A sweep's points on throughput per GPU against tokens per second per
/// user: at each rate the fastest configuration beats the others on tokens
/// per user at the same throughput, so the Pareto set is its four points.
#[test]
fn a_sweep_s_pareto_set_is_the_points_no_other_beats_on_both_axes() {
    let (_dir, store, run) = study_of(LATENCY, latency_summary);
    let doc = doc_of(&store, run);
    assert_eq!(doc.pareto.len(), 1, "{:?}", doc.pareto);
    let sweep = &doc.pareto[0];
    assert_eq!(sweep.sweep, "sharegpt");
    assert_eq!(sweep.curves.len(), doc.configurations.len());
    let set = sweep.optimal();
    let got: Vec<(&str, &str)> = set.iter().map(|(c, p)| (*c, p.profile.as_str())).collect();
    let best = "vllm+mtp+language-only";
    assert_eq!(got, [(best, "sharegpt-r16"), (best, "sharegpt-r8"), (best, "sharegpt-r4"), (best, "sharegpt-r1")]);
    // One GPU a job: its output throughput; per user: 1000 / mean TPOT.
    let r1 = set[3].1;
    let requests = doc.profiles.iter().find(|p| p.name == "sharegpt-r1").expect("r1").requests as f64;
    assert!((r1.per_gpu - 281.0 * requests / (requests * 1.02)).abs() < 1e-9, "{r1:?}");
    let tpot = 2.09 * 0.912 * 0.9748 * 0.51;
    assert!((r1.per_user - 1000.0 / tpot).abs() < 1e-6, "{r1:?}");
    // Every other point is beaten by one of those.
    let points = sweep.curves.iter().flat_map(|c| &c.points).count();
    assert!(points > 8, "the greedy stages measured the sweep on several configurations: {points}");
    for p in sweep.curves.iter().flat_map(|c| &c.points).filter(|p| !p.optimal) {
        assert!(set.iter().any(|(_, q)| q.per_gpu >= p.per_gpu && q.per_user > p.per_user), "{p:?}");
    }
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains("## Pareto\n\n### sharegpt\n"), "{md}");
    assert!(md.contains(&format!("| `{best}` | sharegpt-r1 | {:.2} | {:.2} |", r1.per_gpu, r1.per_user)), "{md}");
    let html = render_as(&doc, Format::Html);
    assert!(html.contains("Pareto: sharegpt") && html.contains("Pareto-optimal"), "the chart is drawn");
    // A grid without a sweep has none.
    let (_dir, store, run) = study();
    assert!(doc_of(&store, run).pareto.is_empty());
}

/// With a price per GPU-hour, every block says what its tokens cost and
/// the conclusion compares the recommendation's with its baseline's.
#[test]
fn a_price_per_gpu_hour_costs_every_block_and_the_conclusion() {
    let (_dir, store, run) = study_of(&format!("{MATRIX}cost: {{ gpu_hour: 3.5 }}\n"), summary);
    let doc = doc_of(&store, run);
    let r = doc.recommendation.as_ref().expect("a recommendation");
    let cost_of = |name: &str| {
        let c = doc.configurations.iter().find(|c| c.name == name).expect("configuration");
        let b = c.block(&r.profile).expect("its block");
        let done: Vec<&Summary> = b.repeats.iter().filter_map(|r| r.summary.as_ref()).collect();
        // One GPU a job (its fingerprint), for each repeat's duration.
        let hours: f64 = done.iter().map(|s| s.duration_s).sum::<f64>() / 3600.0;
        let output: u64 = done.iter().map(|s| s.total_output_tokens).sum();
        let cost = b.cost.clone().expect("a cost");
        assert!((cost.gpu_hours - hours).abs() < 1e-9, "{cost:?}");
        let expected = hours * 3.5 / output as f64 * 1e6;
        assert!((cost.per_million_output.expect("output") - expected).abs() < 1e-9 * expected, "{cost:?}");
        expected
    };
    let best = cost_of(&r.config);
    let base = cost_of(r.baseline.as_deref().expect("a baseline"));
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains("Cost per 1M output tokens (USD):"), "{md}");
    let line = format!(
        "At 3.50 USD a GPU-hour, a million output tokens cost {best:.4} USD on `{}`, against {base:.4} USD on the \
         baseline `{}` ({:+.1}%) (profile {}).",
        r.config,
        r.baseline.as_deref().unwrap_or_default(),
        (best / base - 1.0) * 100.0,
        r.profile
    );
    assert!(md.contains(&line), "{line}\n{md}");
    // Without a price there is no cost anywhere.
    let (_dir, store, run) = study();
    let plain = doc_of(&store, run);
    assert!(plain.configurations.iter().flat_map(|c| &c.blocks).all(|b| b.cost.is_none()));
    assert!(!render_as(&plain, Format::Markdown).contains("GPU-hour"));
}

#[test]
fn the_json_report_reads_back_and_every_field_is_documented() {
    let (_dir, store, run) = study();
    let doc = doc_of(&store, run);
    let json = render_as(&doc, Format::Json);
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
    block.intervals = vec![benchfleet_study::report::doc::Interval {
        metric: "Total token throughput (tok/s)".into(),
        mean: 9632.01,
        half_width: Some(120.0),
    }];
    let html = render_as(&doc, Format::Html);
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

    // With distributions (the stored samples' percentiles), a chart each
    // for TTFT and ITL too; read back by an HTML5 parser, every chart is a
    // figure with its caption, and nothing names a URL.
    for c in &mut doc.configurations {
        for b in c.blocks.iter_mut().filter(|b| b.profile == "sharegpt") {
            let curve = |scale: f64| {
                [1.0, 25.0, 50.0, 75.0, 99.0].map(|p| benchfleet_core::Percentile { p, value: p * scale }).to_vec()
            };
            (b.ttft_ms, b.itl_ms) = (curve(40.0), curve(0.2));
        }
    }
    let html = render_as(&doc, Format::Html);
    let page = scraper::Html::parse_document(&html);
    assert!(page.errors.is_empty(), "HTML parse errors: {:?}", page.errors);
    let select = |s: &str| scraper::Selector::parse(s).expect("a selector");
    let figures: Vec<_> = page.select(&select("figure")).collect();
    assert_eq!(figures.len(), doc.profiles.len() + 3, "a bar chart per profile, throughput-latency, TTFT, ITL");
    for f in &figures {
        assert_eq!(f.select(&select("svg")).count(), 1);
        assert!(f.select(&select("figcaption")).next().is_some_and(|c| !c.text().collect::<String>().is_empty()));
    }
    assert_eq!(page.select(&select("polyline.distribution")).count(), 2 * on_sharegpt);
    for element in page.select(&select("*")) {
        for (name, value) in element.value().attrs() {
            assert!(!value.contains("://") && !value.starts_with("//"), "{name}={value:?} names a URL");
        }
    }
    screenshot_is_not_blank(&html);
}

/// Renders the page in headless Chromium (which `scripts/test` installs) to
/// a PNG and checks it shows something: many pixels that are not white, of
/// more than a few colours.
fn screenshot_is_not_blank(html: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("report.html");
    let shot = dir.path().join("report.png");
    std::fs::write(&page, html).expect("write the page");
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| std::process::Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
        .expect("headless Chromium is needed (scripts/test installs Debian's chromium)");
    let out = std::process::Command::new(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,2400"])
        .arg(format!("--user-data-dir={}", dir.path().join("profile").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(shot.is_file(), "no screenshot: {}", String::from_utf8_lossy(&out.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).expect("open")));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).expect("its pixels");
    let channels = frame.color_type.samples();
    let pixels = &pixels[..frame.buffer_size()];
    let mut colours = std::collections::HashSet::new();
    let mut inked = 0usize;
    for px in pixels.chunks(channels) {
        if px[..3].iter().any(|&c| c < 230) {
            inked += 1;
        }
        colours.insert(px[..3].to_vec());
    }
    let total = pixels.len() / channels;
    assert!(inked * 100 > total, "{inked} of {total} pixels inked: blank");
    assert!(colours.len() > 8, "{} colours: blank", colours.len());
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

/// Three repeats of four requests each, every time chosen: TTFTs (ms) of
/// 10-40, 15-45 and 50-80, each request 30 ms after its first token, sent
/// 100 ms apart, 8 prompt and 4 output tokens.
fn hand_records(repeat: usize) -> Vec<benchfleet_core::RequestRecord> {
    use benchfleet_core::record::{Chunk, Outcome};
    let ttfts = [[10, 20, 30, 40], [15, 25, 35, 45], [50, 60, 70, 80]][repeat];
    let ms = 1_000_000i64;
    (0..4)
        .map(|i| {
            let sent = i as i64 * 100 * ms;
            let first = sent + ttfts[i] * ms;
            let done = first + 30 * ms;
            benchfleet_core::RequestRecord {
                seq: i as u64,
                scheduled_ns: sent,
                sent_ns: sent,
                slot_ns: None,
                connect_ns: None,
                first_token_ns: Some(first),
                completed_ns: done,
                chunks: [Chunk { at_ns: first, tokens: 1 }, Chunk { at_ns: done, tokens: 3 }].into_iter().collect(),
                prompt_tokens: 8,
                output_tokens: 4,
                outcome: Outcome::Ok,
                http_status: Some(200),
                error: None,
                phase: Default::default(),
                turn: None,
            }
        })
        .collect()
}

#[test]
fn a_pooled_block_and_its_intervals_are_the_hand_computed_ones() {
    let matrix = "\
name: by-hand
model: m
repeats: 3
engines: { vllm: { runtime: process } }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 4 } }, rate: 10, requests: 4 }
";
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    let sub = Submission { matrix_name: "m.yaml".into(), matrix_yaml: matrix.into(), ..Default::default() };
    let prepared = plan::prepare(&store, &sub, || store.next_run_id()).expect("prepare");
    let run = prepared.run.id;
    store.create_run(&prepared.run, &prepared.groups, &prepared.jobs).expect("create");
    let mut done = Vec::new();
    for (i, job) in prepared.jobs.iter().enumerate() {
        let records = hand_records(i);
        let mut j = job.clone();
        j.state = JobState::Succeeded;
        j.attempt = 1;
        let s = benchfleet_core::summarize(&records, None);
        j.summary = Some(s.clone());
        let stats = benchfleet_study::model::AttemptStats { records: 4, sent: 4, removed: false };
        let batch = benchfleet_controller::store::codec::encode_batch(&records);
        store
            .commit_records(&RecordCommit {
                batches: vec![(j.key(), 0, batch)],
                summaries: vec![(j.key(), s)],
                stats: vec![(j.key(), stats)],
                ..Default::default()
            })
            .expect("records");
        done.push(Write::Job(j));
    }
    store.apply(&done).expect("jobs");
    let doc = doc_of(&store, run);
    let block = &doc.configurations[0].blocks[0];
    let pooled = block.pooled.as_ref().expect("pooled");

    // The union of the TTFTs, sorted: 10 15 20 25 30 35 40 45 50 60 70 80.
    // Linear interpolation between the nearest ranks, rank p/100 * (n - 1):
    // the median at rank 5.5, halfway from 35 to 40; P99 at rank 10.89.
    let close = |got: f64, want: f64| (got - want).abs() < 1e-9;
    assert!(close(pooled.ttft_ms.mean, 480.0 / 12.0), "{:?}", pooled.ttft_ms);
    assert!(close(pooled.ttft_ms.median, 37.5), "{:?}", pooled.ttft_ms);
    assert!(close(pooled.ttft_ms.p99, 70.0 + 0.89 * 10.0), "{:?}", pooled.ttft_ms);
    assert_eq!(pooled.successful, 12);
    // Durations, first send to last completion: 370, 375 and 410 ms; 48
    // tokens each. Pooled: 144 tokens over their sum.
    let durations = [0.370, 0.375, 0.410];
    assert!(close(pooled.total_token_throughput, 144.0 / durations.iter().sum::<f64>()), "{pooled:?}");
    // The interval: the repeats' own throughputs, their mean, and Student's
    // t for 2 degrees of freedom from the table (4.302653).
    let tps: Vec<f64> = durations.iter().map(|d| 48.0 / d).collect();
    let mean = tps.iter().sum::<f64>() / 3.0;
    let sd = (tps.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    let half = 4.302_653 * sd / 3f64.sqrt();
    let interval = block.intervals.iter().find(|i| i.metric == "Total token throughput (tok/s)").expect("interval");
    assert!((interval.mean - mean).abs() < 1e-9, "{interval:?}");
    assert!((interval.half_width.expect("three repeats") - half).abs() < 1e-4, "{interval:?} against {half}");
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains(&format!("| Total token throughput (tok/s) | {mean:.2} | {half:.2} |")), "{md}");
}

/// A capacity study (Qwen3.5-9B on H100, ShareGPT in Poisson arrivals):
/// the primary profile searches for the highest rate at which P99 TTFT and
/// P99 TPOT hold, and the greedy strategy ranks by the rate found.
const CAPACITY: &str = "\
name: qwen3.5-9b-h100-capacity
model: Qwen/Qwen3.5-9B
hardware: { gpu: H100, gpus_per_job: 1 }
acceptance: { min_success_rate: 0.99 }
engines:
  vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192] }
  sglang: { image: lmsysorg/sglang:v0.5.9, args: [--context-length=8192] }
variants:
  prefix-caching: { engines: [vllm], args: [--enable-prefix-caching] }
  chunked-prefill: { engines: [vllm], args: [--max-num-batched-tokens=16384] }
  kv-fp8: { engines: [vllm], args: [--kv-cache-dtype=fp8] }
profiles:
  chat:
    dataset: { sharegpt: sharegpt.json }
    arrival: poisson
    requests: 1000
    search: { rate: [1, 32], steps: 5, slo: { ttft_p99_ms: 500, tpot_p99_ms: 50 } }
  throughput: { dataset: { random: { input_tokens: 1024, output_tokens: 128, seed: 42 } }, requests: 500 }
strategy: greedy
";

/// The capacity study's engine: each configuration has a knee (req/s)
/// where its P99 TTFT reaches 500 ms, steeply; P99 TPOT stays within 50 ms
/// to 1.2 times the knee.
fn capacity_summary(engine: &str, variants: &[String], profile: &str, requests: u64) -> Summary {
    let mut knee = if engine == "sglang" { 7.0 } else { 10.0 };
    for v in variants {
        knee *= match v.as_str() {
            "prefix-caching" => 1.25,
            "chunked-prefill" => 1.02,
            "kv-fp8" => 0.8,
            other => panic!("no factor for {other}"),
        };
    }
    let rate: Option<f64> = profile.split_once("@r").map(|(_, r)| r.parse().expect("a probe's rate"));
    let load = rate.map_or(1.0, |r| r / knee);
    let dist = |mean: f64, p99: f64| Distribution {
        mean,
        median: mean * 0.9,
        p95: (mean + p99) / 2.0,
        p99,
        count: requests,
        percentiles: Vec::new(),
    };
    let duration_s = rate.map_or(50.0 * 10.0 / knee, |r| requests as f64 / r);
    let ttft_p99 = 120.0 + 380.0 * load.powi(4);
    let tpot_p99 = 20.0 + 25.0 * load;
    Summary {
        successful: requests,
        duration_s,
        total_input_tokens: 342 * requests,
        total_output_tokens: 281 * requests,
        request_throughput: requests as f64 / duration_s,
        output_throughput: 281.0 * requests as f64 / duration_s,
        peak_output_throughput: Some(2.0 * 281.0 * requests as f64 / duration_s),
        peak_concurrent: 64,
        total_token_throughput: 623.0 * requests as f64 / duration_s,
        latency_s: dist(2.0 * load, 4.0 * load),
        ttft_ms: dist(ttft_p99 / 3.0, ttft_p99),
        tpot_ms: dist(tpot_p99 / 2.0, tpot_p99),
        itl_ms: dist(tpot_p99 / 2.2, tpot_p99 * 1.1),
        achieved_rate: rate.unwrap_or(0.0),
        offered_rate: rate,
        lag_limit_ms: 5.0,
        rate_tolerance: 0.05,
        ..Summary::default()
    }
}

#[test]
fn the_capacity_study_finds_each_configuration_s_rate_and_ranks_by_it() {
    let (_dir, store, run) = study_of(CAPACITY, capacity_summary);
    let doc = doc_of(&store, run);
    assert_eq!(doc.run.objective, "capacity");
    let search = doc.searches.iter().find(|s| s.profile == "chat").expect("the search");
    let found = |config: &str| {
        let r = search.results.iter().find(|r| r.config == config).expect(config);
        assert!(r.done, "{config}'s search ended");
        (r.found, r.missed_at, r.probes.len())
    };
    // Each knee lies in the bracket found, the bounds and five steps probed.
    assert_eq!(found("vllm"), (Some(9.73), Some(10.7), 7));
    assert_eq!(found("sglang"), (Some(6.82), Some(7.79), 7));
    assert_eq!(found("vllm+prefix-caching"), (Some(11.7), Some(12.6), 7));
    // Every probe is a job with its block.
    let vllm = doc.configurations.iter().find(|c| c.name == "vllm").expect("vllm");
    for p in &search.results[0].probes {
        assert!(vllm.block(&p.profile).is_some(), "no block for {}", p.profile);
    }

    let md = render_as(&doc, Format::Markdown);
    let rec = doc.recommendation.as_ref().expect("a recommendation");
    assert_eq!(rec.config, "vllm+prefix-caching", "{md}");
    // The planner's decisions rank by the capacity; a difference inside the
    // searches' resolution is none.
    let verdicts: Vec<String> =
        doc.stages.iter().flat_map(|s| &s.decisions).map(|d| format!("{}: {}", d.config, d.verdict)).collect();
    assert!(verdicts.contains(&"vllm: capacity 9.73 req/s within the SLOs, chosen".to_owned()), "{verdicts:#?}");
    assert!(
        verdicts.contains(&"vllm+prefix-caching: +20.25% (9.73 req/s vs 11.7 req/s), helps".to_owned()),
        "{verdicts:#?}"
    );
    assert!(verdicts.iter().any(|v| v.starts_with("vllm+kv-fp8: -") && v.ends_with("does not help")), "{verdicts:#?}");
    assert!(
        verdicts.iter().any(|v| v.starts_with("vllm+chunked-prefill: +0.00%") && v.contains("not adopted")),
        "{verdicts:#?}"
    );
    assert!(
        md.contains("| chat | Capacity: 9.73 req/s within P99 TTFT <= 500 ms, P99 TPOT <= 50 ms | Capacity: 11.7 req/s (+20.25%)"),
        "{md}"
    );
    assert!(md.contains("## SLO search"), "{md}");
    assert!(
        md.contains(
            "| chat@r12.6 | 12.6 req/s | missed | P99 TTFT 512.3 ms, P99 TPOT 45.2 ms | P99 TTFT 512.3 ms > 500 ms |"
        ),
        "{md}"
    );
    snapshot("capacity-study.md", &md);
    snapshot("capacity-study.txt", &render_as(&doc, Format::Console));

    // The JSON names every field it writes in its documentation.
    let json = render_as(&doc, Format::Json);
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report-json.md"))
        .expect("docs/report-json.md");
    let mut keys = std::collections::BTreeSet::new();
    collect_keys(&serde_json::from_str(&json).expect("json"), &mut keys);
    let missing: Vec<&String> = keys.iter().filter(|k| !docs.contains(&format!("`{k}`"))).collect();
    assert!(missing.is_empty(), "docs/report-json.md does not name {missing:?}");
    // The HTML page holds the search: its table, and a chart per SLO with
    // a line per configuration and the bound's.
    let html = render_as(&doc, Format::Html);
    assert!(html.contains("<td>chat@r12.6</td>"), "no probe in the page");
    assert_eq!(html.matches("<polyline class=\"search\"").count(), 2 * (5 + 1), "two SLOs, five configurations");
    assert!(html.contains("P99 TTFT against the load on chat"));
}

#[test]
fn a_capacity_that_dropped_beyond_its_bracket_fails_the_gate() {
    let (_dir, store, run) = study_of(CAPACITY, capacity_summary);
    let a = doc_of(&store, run);
    let same = compare::compare(&a, &a, 0.05, &compare::default_gate(&a));
    assert!(same.passed(), "{}", compare::render(&same, &a, &a, 0.05));
    let rows: Vec<&compare::Row> = same.rows.iter().filter(|r| r.metric == "capacity").collect();
    assert_eq!(rows.len(), 5, "one per configuration that searched");
    assert!(same.notes.iter().all(|n| !n.contains('@')), "probes are not compared one by one: {:?}", same.notes);

    // B: vllm found 8 req/s, missing at 8.75 where A held.
    let mut b = a.clone();
    b.run.id = 2;
    let r = b.searches[0].results.iter_mut().find(|r| r.config == "vllm").expect("vllm");
    (r.found, r.missed_at) = (Some(8.0), Some(8.75));
    let c = compare::compare(&a, &b, 0.05, &compare::default_gate(&a));
    let text = compare::render(&c, &a, &b, 0.05);
    assert_eq!(c.regressions(), 1, "{text}");
    assert!(text.contains("-17.78% (no interval)  REGRESSION"), "{text}");
    // 9, missing at 10: less, but B never held where A missed (10.7) nor
    // missed where A held (9.73): within the brackets.
    let r = b.searches[0].results.iter_mut().find(|r| r.config == "vllm").expect("vllm");
    (r.found, r.missed_at) = (Some(9.0), Some(10.0));
    assert!(compare::compare(&a, &b, 0.05, &compare::default_gate(&a)).passed());
    // A search that did not end in B cannot show there is no regression.
    let r = b.searches[0].results.iter_mut().find(|r| r.config == "vllm").expect("vllm");
    r.done = false;
    assert_eq!(compare::compare(&a, &b, 0.05, &compare::default_gate(&a)).failures.len(), 1);
}
