//! The console report of small stored runs: acceptance, missing records,
//! INVALID baselines and variants within noise.

use super::*;
use crate::store::SledStore;
use benchfleet_study::model::{Dataset, EngineConfig, Group, Job, JobState, Profile, Run};
use benchfleet_study::report::{Format, render_as, reproduce};

const MATRIX: &str = "\
name: acceptance
model: m
acceptance: { min_success_rate: 0.99 }
engines: { vllm: {} }
variants:
  mtp: { args: [--mtp] }
  fp8: { model: m-fp8 }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 1000 }
";

fn group(id: u64, variants: &[&str]) -> Group {
    Group {
        run: RunId(1),
        id,
        config: EngineConfig::test(
            &std::iter::once("vllm").chain(variants.iter().copied()).collect::<Vec<_>>().join("+"),
            variants,
        ),
        gpu: None,
        gpus_per_job: 1,
        jobs: vec![id],
        stage: 1,
        placement: None,
        failed_on: Vec::new(),
        pin: None,
    }
}

fn job(group: u64, tps: f64, successful: u64) -> Job {
    let profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 1000);
    let mut job = Job::new(RunId(1), group, group, profile, 1);
    job.state = JobState::Succeeded;
    job.summary =
        Some(Summary { successful, failed: 1000 - successful, total_token_throughput: tps, ..Summary::default() });
    job
}

/// A store holding run 1 of `MATRIX` (finished) with its groups, jobs
/// and their summaries.
fn stored(name: &str, groups: &[Group], jobs: &[Job]) -> (tempfile::TempDir, SledStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    store.create_run(&finished_run(name), groups, jobs).expect("create");
    let summaries = jobs.iter().map(|j| (j.key(), j.summary.clone().expect("set above"))).collect();
    store.commit_records(&crate::store::RecordCommit { summaries, ..Default::default() }).expect("summaries");
    (dir, store)
}

/// Run 1 of `MATRIX`, finished.
fn finished_run(name: &str) -> Run {
    Run {
        id: RunId(1),
        name: name.into(),
        matrix_file: "m.yaml".into(),
        matrix_yaml: MATRIX.into(),
        created_unix_ms: 0,
        state: benchfleet_study::model::RunState::Finished,
        ended_unix_ms: None,
        note: None,
        files: Default::default(),
        runtime_override: None,
        fleet: None,
    }
}

#[test]
fn variants_below_the_acceptance_are_reported_but_not_adopted() {
    let groups = [group(0, &[]), group(1, &["mtp"]), group(2, &["fp8"])];
    let jobs = [job(0, 9632.01, 1000), job(1, 15514.15, 516), job(2, 9942.93, 1000)];
    let (_dir, store) = stored("acceptance", &groups, &jobs);
    let report = render(&store, RunId(1)).expect("render").text;
    // mtp has the highest throughput but failed half its requests.
    assert!(
        report.contains("## Recommended\n\nvllm serve m\n\n(vllm+fp8: the best total token throughput"),
        "{report}"
    );
    let lines: Vec<&str> = report.lines().filter(|l| l.contains("| baseline")).collect();
    assert_eq!(
        lines,
        [
            "  vllm+mtp                                 Total TPS: 15514.15 (success rate 51.6%, not adopted) \
             Mean TPOT(ms): 0.00 | baseline Total TPS: 9632.01 Mean TPOT(ms): 0.00",
            "  vllm+fp8                                 Total TPS: 9942.93 (+3.23%, better) \
             Mean TPOT(ms): 0.00 | baseline Total TPS: 9632.01 Mean TPOT(ms): 0.00",
        ]
    );
}

#[test]
fn the_recommended_command_leaves_the_simulators_flags_out_and_says_so() {
    // A rehearsal on the simulator: every configuration runs with its flags, which no engine takes.
    let with_sim_flags = |mut g: Group| {
        g.config.args = ["--sim-speedup=4", "--max-num-seqs", "64", "--sim-params", "8B"].map(String::from).to_vec();
        g
    };
    let groups = [with_sim_flags(group(0, &[])), with_sim_flags(group(1, &["fp8"]))];
    let (_dir, store) = stored("acceptance", &groups, &[job(0, 9632.01, 1000), job(1, 9942.93, 1000)]);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(
        report.contains(
            "## Recommended\n\nvllm serve m --max-num-seqs 64\n\nRun on the simulator with --sim-speedup=4, \
             --sim-params 8B, which a real engine would refuse: left out above.\n"
        ),
        "{report}"
    );
    // Each configuration's own command stays as it ran.
    assert!(report.contains("vllm serve m --sim-speedup=4 --max-num-seqs 64 --sim-params 8B"), "{report}");
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains("```shell\nvllm serve m \\\n    --max-num-seqs \\\n    64\n```"), "{md}");
    assert!(md.contains("Run on the simulator with `--sim-speedup=4`, `--sim-params 8B`"), "{md}");
    let json: serde_json::Value = serde_json::from_str(&render_as(&doc, Format::Json)).expect("a JSON report");
    assert_eq!(json["recommendation"]["serve_command"], "vllm serve m --max-num-seqs 64");
    assert_eq!(json["recommendation"]["simulator_flags"], serde_json::json!(["--sim-speedup=4", "--sim-params 8B"]));
    // Without them, nothing is said.
    let (_dir, store) = stored("acceptance", &[group(0, &[])], &[job(0, 9632.01, 1000)]);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(!report.contains("Run on the simulator"), "{report}");
}

/// `job` as a closed loop that reached a steady state of `steady_tps`.
fn closed(mut job: Job, steady_tps: f64) -> Job {
    let summary = job.summary.as_mut().expect("set");
    summary.max_concurrency = Some(64);
    summary.steady_state = Some(benchfleet_core::metrics::steady::SteadyState {
        reached: true,
        start_s: 1.0,
        end_s: 9.0,
        level: 58,
        held: 0.9,
        requests: 800,
        request_throughput: 1.0,
        output_throughput: steady_tps / 2.0,
        total_token_throughput: steady_tps,
        mean_ttft_ms: 10.0,
        p99_ttft_ms: 20.0,
        mean_tpot_ms: 5.0,
        ttft_drift_pct: None,
        throughput_drift_pct: None,
    });
    job
}

#[test]
fn a_change_taken_in_the_steady_state_says_so_beside_the_whole_runs_figures() {
    // Closed loops that reached a steady state are compared by it: the variant's whole run is
    // a little faster than the baseline's, its steady state 5% slower, and the line says which.
    let groups = [group(0, &[]), group(1, &["fp8"])];
    let jobs = [closed(job(0, 9000.0, 1000), 10000.0), closed(job(1, 9090.0, 1000), 9500.0)];
    let (_dir, store) = stored("acceptance", &groups, &jobs);
    let report = render(&store, RunId(1)).expect("render");
    let line = report.text.lines().find(|l| l.contains("| baseline")).expect("a comparison line");
    assert!(
        line.contains("Total TPS: 9090.00 (steady state: -5.00%, worse)")
            && line.contains("baseline Total TPS: 9000.00"),
        "{line}"
    );
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    let json: serde_json::Value = serde_json::from_str(&render_as(&doc, Format::Json)).expect("a JSON report");
    assert_eq!(json["comparisons"][0]["steady_state"], true, "{json}");
    // Open loops, or runs without one, are compared by their whole runs, and say nothing more.
    let (_dir, store) = stored("acceptance", &groups, &[job(0, 9000.0, 1000), job(1, 9090.0, 1000)]);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(report.contains("Total TPS: 9090.00 (+1.00%, better)"), "{report}");
}

#[test]
fn repeats_whose_records_are_missing_are_shown_one_by_one() {
    let (first, mut second) = (job(0, 100.0, 1000), job(0, 200.0, 1000));
    (second.id, second.repeat) = (1, 2);
    let jobs = [first, second];
    let (_dir, store) = stored("repeats", &[group(0, &[])], &jobs);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(
        report.contains(
            "(the 2 repeats cannot be pooled: attempt 0 of job 1/0 has 0 records stored but its summary counts 1000; each is shown alone)"
        ),
        "{report}"
    );
    assert_eq!(report.matches("Serving Benchmark Result").count(), 2, "{report}");
}

#[test]
fn an_invalid_baseline_is_not_compared() {
    let mut base = job(0, 5000.0, 1000);
    if let Some(s) = base.summary.as_mut() {
        s.invalid = Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".into());
    }
    let jobs = [base, job(2, 9942.93, 1000)];
    let (_dir, store) = stored("invalid", &[group(0, &[]), group(2, &["fp8"])], &jobs);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(
        report.contains(
            "Total TPS: 9942.93 (baseline run INVALID: p99 dispatch lag 9.00 ms exceeds 5.00 ms; not compared)"
        ),
        "{report}"
    );
    assert!(report.contains("One repeat: no confidence intervals."), "{report}");
    assert_eq!(render(&store, RunId(1)).expect("render").recommended.as_deref(), Some("vllm+fp8"));

    // Every configuration INVALID: nothing is recommended, and it says so.
    let mut fp8 = jobs[1].clone();
    if let Some(s) = fp8.summary.as_mut() {
        s.invalid = Some("achieved 1.00 req/s is below 95% of the offered 2.00 req/s".into());
    }
    store
        .commit_records(&crate::store::RecordCommit {
            summaries: vec![(fp8.key(), fp8.summary.clone().expect("set"))],
            ..Default::default()
        })
        .expect("summary");
    store.apply(&[crate::records::Write::Job(fp8)]).expect("job");
    let r = render(&store, RunId(1)).expect("render");
    assert_eq!(r.recommended, None);
    assert!(r.text.contains("## No recommendation\n\nNo configuration met the acceptance"), "{}", r.text);
}

#[test]
fn a_variant_within_noise_of_its_baseline_is_not_recommended() {
    // +0.01%: the best throughput, but within noise.
    let jobs = [job(0, 9632.01, 1000), job(2, 9633.0, 1000)];
    let (_dir, store) = stored("noise", &[group(0, &[]), group(2, &["fp8"])], &jobs);
    let r = render(&store, RunId(1)).expect("render");
    assert_eq!(r.recommended.as_deref(), Some("vllm"), "{}", r.text);
    assert!(r.text.contains("(+0.01%, below the 1.00% minimum effect, within noise)"), "{}", r.text);
}

#[test]
fn the_reproduce_command_drops_the_fleet_and_names_the_matrix_files() {
    let mut j = job(0, 100.0, 1000);
    j.profile.dataset = Dataset::ShareGpt {
        file: "data/my chats.json".into(),
        sha256: "ab".repeat(32),
        output_tokens: None,
        sessions: None,
    };
    j.profile.processor =
        Some(benchfleet_study::model::StoredFile { file: "tok.json".into(), sha256: "cd".repeat(32) });
    let args = "--base-url http://127.0.0.1:29542 --model m --num-prompts 10 --quiet --processor /cache/cd \
                --dataset-name sharegpt --dataset-path /cache/ab --report-to http://127.0.0.1:7070 --run-id 1 \
                --job 0 --attempt 1 --epoch 3 --report-ca /var/lib/benchfleet-agent/identity/ca.pem --report-insecure \
                --outcome-file /var/lib/benchfleet-agent/loadgen/loadgen-1-0-1.json";
    j.loadgen_args = args.split(' ').map(str::to_owned).collect();
    assert_eq!(
        reproduce(&j).as_deref(),
        Some(
            "benchfleet-loadgen --base-url \"$ENGINE_URL\" --model m --num-prompts 10 --processor tok.json \
             --dataset-name sharegpt --dataset-path 'data/my chats.json'"
        )
    );
    j.loadgen_args.clear();
    assert_eq!(reproduce(&j), None, "a job loadgen never ran has none");
}

#[test]
fn a_gpu_held_down_is_told_with_the_block() {
    use benchfleet_core::telemetry::{GpuTelemetry, TelemetrySummary};
    let mut j = job(0, 9632.01, 1000);
    let gpu = GpuTelemetry {
        gpu: "GPU-1".into(),
        samples: 100,
        sm_clock_max_mhz: Some(1980),
        held_down_ms: 38_000,
        held_down_sm_clock_mhz: Some(1410),
        held_down_reasons: vec!["sw_power_cap".into()],
        ..GpuTelemetry::default()
    };
    j.telemetry = Some(TelemetrySummary { duration_ms: 100_000, gpus: vec![gpu], ..TelemetrySummary::default() });
    let (_dir, store) = stored("held", &[group(0, &[])], &[j]);
    let report = render(&store, RunId(1)).expect("render").text;
    assert!(
        report.contains("repeat 1: GPU held down: SM clock 1,410 of 1,980 MHz for 38% of the job: power cap"),
        "{report}"
    );
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    let md = render_as(&doc, Format::Markdown);
    assert!(md.contains("**GPU held down**: SM clock 1,410 of 1,980 MHz for 38% of the job: power cap"), "{md}");
}

/// `j` with its GPUs' energy over its load run (`joules` over `seconds`, or
/// not known) and the output tokens it generated.
fn with_energy(mut j: Job, joules: Option<f64>, seconds: u64, tokens: u64) -> Job {
    use benchfleet_core::telemetry::TelemetrySummary;
    let duration = joules.map(|_| seconds * 1000);
    j.telemetry =
        Some(TelemetrySummary { energy_j: joules, energy_duration_ms: duration, ..TelemetrySummary::default() });
    if let Some(s) = &mut j.summary {
        s.total_output_tokens = tokens;
    }
    j
}

/// The energy section of a block of `joules` over `seconds` and `tokens`.
fn energy_section(joules: f64, seconds: f64, tokens: f64) -> String {
    format!(
        "-----------------------Energy---------------------\n{:<40} {joules:.2}\n{:<40} {:.2}\n{:<40} {:.2}\n\
         {:<40} {:.2}\n==================================================\n",
        "GPU energy (J):",
        "Mean GPU power (W):",
        joules / seconds,
        "Energy per output token (mJ):",
        joules * 1000.0 / tokens,
        "Output tokens per joule:",
        tokens / joules
    )
}

#[test]
fn a_block_shows_its_gpu_energy_in_every_format() {
    use benchfleet_core::telemetry::Energy;
    let j = with_energy(job(0, 9632.01, 1000), Some(6_000.0), 10, 20_000);
    let (_dir, store) = stored("energy", &[group(0, &[])], &[j]);
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    let block = &doc.configurations[0].blocks[0];
    assert_eq!(block.energy, Energy::of(6_000.0, 10.0, 20_000));
    let section = energy_section(6_000.0, 10.0, 20_000.0);
    assert!(section.contains("Mean GPU power (W):                      600.00\n"), "{section}");
    let console = render(&store, RunId(1)).expect("render").text;
    assert!(console.contains(&format!("P99 ITL (ms):                            0.00\n{section}")), "{console}");
    assert!(render_as(&doc, Format::Markdown).contains(&section));
    assert!(render_as(&doc, Format::Html).contains(&section));
    let json: serde_json::Value = serde_json::from_str(&render_as(&doc, Format::Json)).expect("JSON");
    let energy = &json["configurations"][0]["blocks"][0]["energy"];
    assert_eq!((energy["joules"].as_f64(), energy["mj_per_output_token"].as_f64()), (Some(6_000.0), Some(300.0)));
    let csv = render_as(&doc, Format::Csv);
    let rows: Vec<&str> = csv.lines().collect();
    assert!(
        rows[0].ends_with(",error,energy_j,mean_gpu_power_w,energy_per_output_token_mj,output_tokens_per_joule"),
        "new columns at the end: {}",
        rows[0]
    );
    assert!(rows[1].ends_with(",,6000.0000,600.0000,300.0000,3.3333"), "{}", rows[1]);
}

#[test]
fn a_block_s_energy_sums_its_repeats_and_is_unknown_when_one_is() {
    use benchfleet_core::telemetry::Energy;
    let first = with_energy(job(0, 100.0, 1000), Some(6_000.0), 10, 20_000);
    let mut second = with_energy(job(0, 200.0, 1000), Some(1_500.0), 5, 5_000);
    (second.id, second.repeat) = (1, 2);
    let (_dir, store) = stored("energy", &[group(0, &[])], &[first.clone(), second.clone()]);
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    assert_eq!(doc.configurations[0].blocks[0].energy, Energy::of(7_500.0, 15.0, 25_000));
    // Not pooled (no records stored): each repeat's block has its own energy.
    let console = render(&store, RunId(1)).expect("render").text;
    for section in [energy_section(6_000.0, 10.0, 20_000.0), energy_section(1_500.0, 5.0, 5_000.0)] {
        assert!(console.contains(&section), "{section}\n{console}");
    }

    let unknown = with_energy(second, None, 5, 5_000);
    let (_dir, store) = stored("energy", &[group(0, &[])], &[first, unknown]);
    let doc = document(&store, RunId(1), &|_, _| {}).expect("doc");
    assert_eq!(doc.configurations[0].blocks[0].energy, None, "never a part taken for the whole");
    let csv = render_as(&doc, Format::Csv);
    assert!(csv.lines().nth(2).is_some_and(|row| row.ends_with(",,,,,")), "{csv}");
}
