//! The job's load and loadgen's flags held to each other: any `LoadSpec`
//! written with `to_args` for any target reads back, through the binary's
//! own parser, as the spec and the target it was written from; and what it
//! reads back is the run the agent asked for.

use std::path::PathBuf;

use benchfleet_core::load::{
    Arrival, Endpoint, LoadDataset, LoadSpec, LoadTarget, ReportTo, StoredFile, TraceFormat, Window,
};
use benchfleet_core::metrics::Slo;
use benchfleet_loadgen::cli::{self, Args};
use clap::Parser;
use proptest::prelude::*;

fn finite() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("finite", |x| x.is_finite())
}

/// An SLO bound: ms, at least 0.
fn bound() -> impl Strategy<Value = f64> {
    use proptest::num::f64::{NORMAL, POSITIVE, SUBNORMAL, ZERO};
    POSITIVE | ZERO | NORMAL | SUBNORMAL
}

fn slo() -> impl Strategy<Value = Slo> {
    (proptest::option::of(bound()), proptest::option::of(bound()), proptest::option::of(bound()))
        .prop_filter("at least one bound", |b| b.0.is_some() || b.1.is_some() || b.2.is_some())
        .prop_map(|(ttft_ms, tpot_ms, e2el_ms)| Slo { ttft_ms, tpot_ms, e2el_ms })
}

/// A file's path: any text but the empty one, which names no file (and
/// which clap refuses for a path).
fn path() -> impl Strategy<Value = PathBuf> {
    any::<String>().prop_filter("a path", |p| !p.is_empty()).prop_map(PathBuf::from)
}

fn window() -> impl Strategy<Value = Window> {
    prop_oneof![any::<u64>().prop_map(Window::Requests), finite().prop_map(Window::Seconds)]
}

fn stored() -> impl Strategy<Value = StoredFile> {
    (any::<String>(), "[0-9a-f]{64}").prop_map(|(file, sha256)| StoredFile { file, sha256 })
}

fn dataset() -> impl Strategy<Value = LoadDataset> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(input_tokens, output_tokens, seed)| {
            LoadDataset::Random { input_tokens, output_tokens, seed }
        }),
        (stored(), proptest::option::of(any::<u32>()), proptest::option::of(any::<u64>())).prop_map(
            |(f, output_tokens, think)| LoadDataset::ShareGpt {
                file: f.file,
                sha256: f.sha256,
                output_tokens,
                sessions: think.map(|think_time_ms| benchfleet_core::load::Sessions { think_time_ms }),
            }
        ),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
            |(groups, prefix_tokens, suffix_tokens, output_tokens, seed)| LoadDataset::SharedPrefix {
                groups,
                prefix_tokens,
                suffix_tokens,
                output_tokens,
                seed
            }
        ),
        (stored(), prop_oneof![Just(TraceFormat::Mooncake), Just(TraceFormat::Jsonl)], finite())
            .prop_map(|(f, format, speed)| LoadDataset::Trace { file: f.file, sha256: f.sha256, format, speed }),
        (1..=u32::MAX, any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
            |(turns, user_tokens, output_tokens, think_time_ms, seed)| LoadDataset::MultiTurn {
                turns,
                user_tokens,
                output_tokens,
                think_time_ms,
                seed
            }
        ),
    ]
}

prop_compose! {
    fn spec()(
        dataset in dataset(),
        rate in proptest::option::of(finite()),
        arrival in prop_oneof![Just(Arrival::Constant), Just(Arrival::Poisson)],
        requests in any::<u64>(),
        max_concurrency in proptest::option::of(any::<u64>()),
        endpoint in prop_oneof![Just(Endpoint::Completions), Just(Endpoint::Chat)],
        seed in any::<u64>(),
        (lag_limit_ms, rate_tolerance, max_duration_s) in
            (proptest::option::of(finite()), proptest::option::of(finite()), proptest::option::of(finite())),
        (warmup, cooldown) in (proptest::option::of(window()), proptest::option::of(window())),
        ignore_eos in any::<bool>(),
        extra_body in proptest::option::of(any::<String>()),
        goodput in proptest::option::of(slo()),
        processor in proptest::option::of(stored()),
    ) -> LoadSpec {
        LoadSpec {
            dataset, rate, arrival, requests, max_concurrency, endpoint, seed, lag_limit_ms, rate_tolerance,
            warmup, cooldown, max_duration_s, ignore_eos, extra_body, goodput, processor,
        }
    }
}

prop_compose! {
    fn report()(
        url in any::<String>(),
        run_id in any::<String>(),
        job in any::<u64>(),
        attempt in any::<u32>(),
        epoch in any::<u64>(),
        ca in proptest::option::of(path()),
        insecure in any::<bool>(),
    ) -> ReportTo {
        ReportTo { url, run_id, job, attempt, epoch, ca, insecure }
    }
}

/// A spec and a target for it: the target has a path for each file the
/// spec names, and none for a file it does not (as the agent fetches them).
fn spec_and_target() -> impl Strategy<Value = (LoadSpec, LoadTarget)> {
    (
        spec(),
        (any::<String>(), any::<String>()),
        (path(), path()),
        proptest::option::of(report()),
        any::<bool>(),
        proptest::option::of(path()),
    )
        .prop_map(|(spec, (base_url, model), (dataset_path, processor_path), report, quiet, outcome_file)| {
            let target = LoadTarget {
                base_url,
                model,
                dataset_path: spec.dataset.file().is_some().then_some(dataset_path),
                processor_path: spec.processor.is_some().then_some(processor_path),
                report,
                quiet,
                outcome_file,
            };
            (spec, target)
        })
}

/// The spec as loadgen knows it: its files by the paths it was given, with
/// no hash (the agent fetched each by its hash).
fn on_disk(spec: &LoadSpec, target: &LoadTarget) -> LoadSpec {
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let mut spec = spec.clone();
    if let LoadDataset::ShareGpt { file, sha256, .. } | LoadDataset::Trace { file, sha256, .. } = &mut spec.dataset {
        (*file, *sha256) = (path(&target.dataset_path), String::new());
    }
    if let Some(f) = &mut spec.processor {
        *f = StoredFile { file: path(&target.processor_path), sha256: String::new() };
    }
    spec
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_spec_reads_back_from_its_flags_as_written((spec, target) in spec_and_target()) {
        let argv = spec.to_args(&target);
        let args = Args::try_parse_from(std::iter::once("benchfleet-loadgen".to_owned()).chain(argv.iter().cloned()))
            .map_err(|e| TestCaseError::fail(format!("{argv:?}: {e}")))?;
        let back = args.spec().map_err(|e| TestCaseError::fail(format!("{argv:?}: {e:#}")))?;
        prop_assert_eq!(back, on_disk(&spec, &target), "{:?}", argv);
        prop_assert_eq!(args.target(), target.clone(), "{:?}", argv);
        // The same through the library's entry point.
        let (spec_back, target_back) = cli::from_args(&argv).map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
        prop_assert_eq!((spec_back, target_back), (on_disk(&spec, &target), target));
    }
}

fn example() -> (LoadSpec, LoadTarget) {
    let spec = LoadSpec {
        rate: Some(12.5),
        arrival: Arrival::Poisson,
        max_concurrency: Some(9),
        endpoint: Endpoint::Chat,
        seed: 77,
        lag_limit_ms: Some(12.5),
        rate_tolerance: Some(0.025),
        warmup: Some(Window::Requests(7)),
        cooldown: Some(Window::Seconds(2.5)),
        max_duration_s: Some(90.0),
        ignore_eos: true,
        extra_body: Some(r#"{"temperature":0}"#.into()),
        goodput: Some(Slo { ttft_ms: Some(200.0), tpot_ms: Some(50.0), e2el_ms: None }),
        ..LoadSpec::new(LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed: 5 }, 321)
    };
    let target = LoadTarget {
        base_url: "http://127.0.0.1:8123".into(),
        model: "m".into(),
        outcome_file: Some("/var/lib/benchfleet-agent/loadgen/loadgen-17-4-2.json".into()),
        report: Some(ReportTo {
            url: "http://127.0.0.1:7070".into(),
            run_id: "17".into(),
            job: 4,
            attempt: 2,
            epoch: 9,
            ca: None,
            insecure: false,
        }),
        quiet: true,
        ..Default::default()
    };
    (spec, target)
}

#[test]
fn a_job_s_flags_read_as_vllm_bench_serve_s() {
    let (spec, target) = example();
    assert_eq!(
        spec.to_args(&target).join(" "),
        "--base-url http://127.0.0.1:8123 --endpoint /v1/chat/completions --model m --num-prompts 321 --quiet \
         --request-rate 12.5 --arrival poisson --max-concurrency 9 --lag-limit-ms 12.5 --rate-tolerance 0.025 \
         --warmup 7 --cooldown-time 2.5 --max-duration 90 --ignore-eos --extra-body {\"temperature\":0} \
         --goodput ttft:200 tpot:50 --dataset-name random --random-input-len 100 --random-output-len 20 --seed 5 \
         --arrival-seed 77 --outcome-file /var/lib/benchfleet-agent/loadgen/loadgen-17-4-2.json \
         --report-to http://127.0.0.1:7070 --run-id 17 --job 4 --attempt 2 --epoch 9"
    );
}

#[test]
fn the_flags_make_the_run_the_spec_describes() {
    use benchfleet_loadgen::{Arrival as Sends, Dataset, Window as Measured};
    let (spec, target) = example();
    let (_, config, sink) = cli::parse(&spec.to_args(&target)).expect("flags");
    assert_eq!((config.base_url.as_str(), config.model.as_str()), ("http://127.0.0.1:8123", "m"));
    assert_eq!(
        (config.endpoint, config.request_rate, config.arrival),
        (Endpoint::Chat, Some(12.5), Sends::Poisson { seed: 77 })
    );
    assert_eq!((config.num_requests, config.max_concurrency), (321, Some(9)));
    assert_eq!((config.lag_limit_ms, config.rate_tolerance), (Some(12.5), 0.025));
    assert_eq!(
        (config.warmup, config.cooldown),
        (Measured::Requests(7), Measured::Time(std::time::Duration::from_millis(2500)))
    );
    assert_eq!(config.max_duration, Some(std::time::Duration::from_secs(90)));
    assert_eq!(serde_json::Value::Object(config.extra_body), serde_json::json!({"temperature": 0, "ignore_eos": true}));
    assert_eq!(config.goodput, spec.goodput);
    assert!(matches!(config.dataset, Dataset::Random { input_tokens: 100, output_tokens: 20, seed: 5 }));
    let sink = sink.expect("records go to the controller");
    assert_eq!(
        (sink.url.as_str(), sink.run_id.as_str(), sink.job, sink.attempt, sink.epoch),
        ("http://127.0.0.1:7070", "17", 4, 2, 9)
    );
    // Without a tolerance in the spec, loadgen's own applies.
    let (_, config, _) = cli::parse(&LoadSpec { rate_tolerance: None, ..spec }.to_args(&target)).expect("flags");
    assert_eq!(config.rate_tolerance, benchfleet_loadgen::metrics::DEFAULT_RATE_TOLERANCE);
}

#[test]
fn values_that_look_like_flags_read_back_as_values() {
    let (spec, mut target) = example();
    let spec = LoadSpec { extra_body: Some("--quiet".into()), lag_limit_ms: Some(-1.5), ..spec };
    target.model = "-m".into();
    target.report.as_mut().expect("a report").run_id = "--job".into();
    target.outcome_file = Some("--quiet".into());
    let argv = spec.to_args(&target);
    assert!(argv.contains(&"--model=-m".to_owned()) && argv.contains(&"--extra-body=--quiet".to_owned()), "{argv:?}");
    assert_eq!(cli::from_args(&argv).expect("flags"), (spec, target));
}
