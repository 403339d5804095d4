//! Calibration against the published reports: regenerates `docs/sim-calibration.md` and checks it.
//!
//! Every row replays one published benchmark (model, GPU, engine flags,
//! profile) in virtual time. The checks: each vLLM baseline within 25% of its
//! published value, SGLang's defaults worse than vLLM's, and every variant
//! whose published effect exceeds 5% moving the simulated number the same way.
//! The committed document must equal the generated one; run with
//! `UPDATE_CALIBRATION=1` to rewrite it after changing a coefficient.

use std::fmt::Write as _;

use benchfleet_sim::{
    EngineKind, parse_command_line_with_gpu,
    profile::{COEFFICIENTS, EngineCosts, GPUS},
    simulate::{self, Arrival, Summary, Workload},
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Profile {
    /// ShareGPT at 1000 req/s, 1000 requests, the client holding at most 512 in flight.
    ShareGpt,
    /// Random prompts (the reports' token totals per request), 1000 req/s.
    Random { requests: usize, input: usize, output: usize },
    /// ShareGPT at a constant rate, 1000 requests (the latency study).
    ShareGptRate(f64),
}

impl Profile {
    fn name(self) -> String {
        match self {
            Profile::ShareGpt => "ShareGPT".into(),
            Profile::Random { input, output, .. } => format!("random {input}/{output}"),
            Profile::ShareGptRate(rate) => format!("ShareGPT {rate} req/s"),
        }
    }

    fn workload(self) -> Workload {
        let capped = Arrival::Rate { rate: 1000.0, max_concurrency: Some(512) };
        match self {
            Profile::ShareGpt => Workload { items: simulate::sharegpt_like(1000, 42), arrival: capped },
            Profile::Random { requests, input, output } => {
                Workload { items: simulate::random(requests, input, output, 42), arrival: capped }
            }
            Profile::ShareGptRate(rate) => Workload {
                items: simulate::sharegpt_like(1000, 42),
                arrival: Arrival::Rate { rate, max_concurrency: None },
            },
        }
    }
}

/// What a study optimises: total token throughput (higher is better) or mean latency (lower is better).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Objective {
    Throughput,
    Latency,
}

/// What a row must satisfy.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Check {
    /// A vLLM baseline: within 25% of the published value.
    Within25,
    /// Worse than row `0` (SGLang's defaults against vLLM's).
    WorseThan(usize),
    /// Compared with row `0`: if the published effect exceeds 5%, the simulated one goes the same way.
    Versus(usize),
    /// Published with a success rate below 100%: not comparable, shown for the record.
    Excluded(&'static str),
}

struct Row {
    study: &'static str,
    gpu: &'static str,
    model: &'static str,
    engine: EngineKind,
    args: &'static str,
    profile: Profile,
    objective: Objective,
    published: f64,
    check: Check,
}

const THROUGHPUT_35B: &str = "Qwen3.5-35B-A3B on H200, throughput";
const THROUGHPUT_9B: &str = "Qwen3.5-9B on H100, throughput";
const LATENCY_9B: &str = "Qwen3.5-9B on H100, latency";
const MOE: &str = "Qwen/Qwen3.5-35B-A3B";
const MOE_FP8: &str = "Qwen/Qwen3.5-35B-A3B-FP8";
const DENSE: &str = "Qwen/Qwen3.5-9B";
const BASE_VLLM: &str = "--reasoning-parser=qwen3 --max-model-len=32768";
const BASE_SGLANG: &str = "--reasoning-parser=qwen3 --context-length=32768";
const RANDOM_1K: Profile = Profile::Random { requests: 1000, input: 1034, output: 128 };
const LONG: Profile = Profile::Random { requests: 100, input: 32010, output: 100 };
const GEN_HEAVY: Profile = Profile::Random { requests: 200, input: 1010, output: 2000 };

#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use Check::*;
    use EngineKind::{Sglang, Vllm};
    use Objective::{Latency, Throughput};
    let row = |study, gpu, model, engine, args, profile, objective, published, check| Row {
        study, gpu, model, engine, args, profile, objective, published, check,
    };
    let opt35 = "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --enable-prefix-caching";
    let opt9 = "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-seqs=512";
    let lat_opt = "--reasoning-parser=qwen3 --max-model-len=32768 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1} --language-model-only --performance-mode=interactivity";
    let s = Profile::ShareGpt;
    vec![
        // 0..
        row(THROUGHPUT_35B, "H200", MOE, Vllm, BASE_VLLM, s, Throughput, 9632.01, Within25),
        row(THROUGHPUT_35B, "H200", MOE, Sglang, BASE_SGLANG, s, Throughput, 4995.66, WorseThan(0)),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, BASE_VLLM, s, Throughput, 9942.93, Versus(0)),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, "--reasoning-parser=qwen3 --enable-prefix-caching --max-model-len=32768", s, Throughput, 10338.96, Versus(0)),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, opt35, s, Throughput, 10570.88, Versus(0)),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --enable-prefix-caching --kv-cache-dtype=fp8", s, Throughput, 10363.77, Versus(0)),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, "--reasoning-parser=qwen3 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":4} --max-model-len=32768", s, Throughput, 15514.15, Excluded("success rate 51.6%")),
        // 7..
        row(THROUGHPUT_35B, "H200", MOE, Vllm, BASE_VLLM, RANDOM_1K, Throughput, 37934.72, Within25),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, opt35, RANDOM_1K, Throughput, 50464.84, Versus(7)),
        row(THROUGHPUT_35B, "H200", MOE, Vllm, BASE_VLLM, LONG, Throughput, 44993.20, Within25),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, opt35, LONG, Throughput, 56424.42, Versus(9)),
        row(THROUGHPUT_35B, "H200", MOE, Vllm, BASE_VLLM, GEN_HEAVY, Throughput, 10455.38, Within25),
        row(THROUGHPUT_35B, "H200", MOE_FP8, Vllm, opt35, GEN_HEAVY, Throughput, 12258.79, Versus(11)),
        // 13..
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, BASE_VLLM, s, Throughput, 11527.14, Within25),
        row(THROUGHPUT_9B, "H100", DENSE, Sglang, BASE_SGLANG, s, Throughput, 6499.41, WorseThan(13)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --enable-prefix-caching --max-model-len=32768", s, Throughput, 11224.70, Versus(13)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":4} --max-model-len=32768", s, Throughput, 15059.89, Excluded("success rate 51.5%")),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768", s, Throughput, 11496.39, Versus(13)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --max-model-len=32768 --max-num-seqs=1024", s, Throughput, 11532.64, Versus(13)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=32768", s, Throughput, 11672.72, Versus(13)),
        // 20: the report's own pair, 512 against 256 sequences (+6.80%).
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-seqs=256", s, Throughput, 11019.18, Versus(13)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, opt9, s, Throughput, 11768.22, Versus(20)),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, BASE_VLLM, RANDOM_1K, Throughput, 29822.16, Within25),
        row(THROUGHPUT_9B, "H100", DENSE, Vllm, opt9, RANDOM_1K, Throughput, 34470.14, Versus(22)),
        // 24..
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(8.0), Latency, 2.62, Within25),
        row(LATENCY_9B, "H100", DENSE, Sglang, "--context-length=32768", Profile::ShareGptRate(8.0), Latency, 8.13, WorseThan(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768 --enable-prefix-caching", Profile::ShareGptRate(8.0), Latency, 2.69, Versus(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768 --max-num-batched-tokens=16384", Profile::ShareGptRate(8.0), Latency, 2.64, Versus(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768 --max-num-seqs=128", Profile::ShareGptRate(8.0), Latency, 2.66, Versus(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1} --max-model-len=32768", Profile::ShareGptRate(8.0), Latency, 2.39, Versus(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--performance-mode=interactivity --max-model-len=32768 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1}", Profile::ShareGptRate(8.0), Latency, 2.38, Versus(24)),
        row(LATENCY_9B, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(8.0), Latency, 2.32, Versus(24)),
        // 32..
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(1.0), Latency, 2.09, Within25),
        row(LATENCY_9B, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(1.0), Latency, 1.65, Versus(32)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(4.0), Latency, 2.33, Within25),
        row(LATENCY_9B, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(4.0), Latency, 1.90, Versus(34)),
        row(LATENCY_9B, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(16.0), Latency, 4.37, Within25),
        row(LATENCY_9B, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(16.0), Latency, 3.72, Versus(36)),
    ]
}

fn simulated(row: &Row) -> f64 {
    let command = match row.engine {
        EngineKind::Vllm => format!("vllm serve {} {}", row.model, row.args),
        EngineKind::Sglang => format!("python3 -m sglang.launch_server --model-path {} {}", row.model, row.args),
    };
    let args: Vec<String> = command.split_whitespace().map(String::from).collect();
    let config = parse_command_line_with_gpu(&args, Some(row.gpu)).expect("a reference command line parses");
    let timings = simulate::simulate(&config, &row.profile.workload()).expect("the reference configuration fits");
    let summary = Summary::of(&timings);
    match row.objective {
        Objective::Throughput => summary.total_token_throughput,
        Objective::Latency => summary.mean_latency,
    }
}

/// Relative change from `base` to `value`, signed so that positive is better for the objective.
fn gain(objective: Objective, base: f64, value: f64) -> f64 {
    match objective {
        Objective::Throughput => value / base - 1.0,
        Objective::Latency => base / value - 1.0,
    }
}

fn number(objective: Objective, value: f64) -> String {
    match objective {
        Objective::Throughput => format!("{value:.0} tok/s"),
        Objective::Latency => format!("{value:.2} s"),
    }
}

/// Builds the document and the list of failed checks.
fn calibrate() -> (String, Vec<String>) {
    let rows = rows();
    let values: Vec<f64> = rows.iter().map(simulated).collect();
    let mut failures = Vec::new();
    let mut table = String::from(
        "| # | study | profile | engine and flags | published | simulated | published vs | simulated vs | check |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (i, (row, &value)) in rows.iter().zip(&values).enumerate() {
        let (reference, verdict, ok) = match row.check {
            Check::Within25 => {
                let error = value / row.published - 1.0;
                let ok = error.abs() <= 0.25;
                (format!("error {:+.1}%", error * 100.0), if ok { "within 25%" } else { "OUT OF 25%" }, ok)
            }
            Check::WorseThan(base) => {
                let ok = gain(row.objective, values[base], value) < 0.0;
                let published = gain(row.objective, rows[base].published, row.published);
                let simulated = gain(row.objective, values[base], value);
                let verdict = if ok { "worse than vLLM" } else { "NOT WORSE" };
                (format!("{:+.1}% / {:+.1}% vs #{base}", published * 100.0, simulated * 100.0), verdict, ok)
            }
            Check::Versus(base) => {
                let published = gain(row.objective, rows[base].published, row.published);
                let simulated = gain(row.objective, values[base], value);
                let (verdict, ok) = if published.abs() <= 0.05 {
                    ("effect under 5%", true)
                } else if published.signum() == simulated.signum() {
                    ("same direction", true)
                } else {
                    ("WRONG DIRECTION", false)
                };
                (format!("{:+.1}% / {:+.1}% vs #{base}", published * 100.0, simulated * 100.0), verdict, ok)
            }
            Check::Excluded(why) => (String::new(), why, true),
        };
        if !ok {
            failures.push(format!("#{i} {} {} {}: {verdict}", row.study, row.profile.name(), row.args));
        }
        let (published_vs, simulated_vs) = reference
            .split_once(" / ")
            .map_or((reference.clone(), String::new()), |(a, b)| (a.to_owned(), b.to_owned()));
        let engine = match row.engine {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
        };
        let _ = writeln!(
            table,
            "| {i} | {} | {} | {engine} `{}` {} | {} | {} | {published_vs} | {simulated_vs} | {verdict} |",
            row.study,
            row.profile.name(),
            row.model.trim_start_matches("Qwen/"),
            row.args,
            number(row.objective, row.published),
            number(row.objective, value),
        );
    }
    (document(&table), failures)
}

fn document(table: &str) -> String {
    let c = &COEFFICIENTS;
    let mut doc = String::from(include_str!("calibration_intro.md"));
    let _ = writeln!(doc, "\n## Coefficients\n\n| coefficient | value |\n|---|---|");
    for gpu in GPUS {
        let _ = writeln!(
            doc,
            "| {} | {:.1} GiB, {:.2} TB/s, {:.0} TFLOP/s BF16, {:.0} TFLOP/s FP8 |",
            gpu.name,
            gpu.memory / 1024f64.powi(3),
            gpu.bandwidth / 1e12,
            gpu.bf16_flops / 1e12,
            gpu.fp8_flops / 1e12
        );
    }
    for (name, value) in [
        ("HBM bandwidth efficiency", format!("{}", c.bandwidth_efficiency)),
        ("MFU max, dense / mixture of experts", format!("{} / {}", c.mfu_max_dense, c.mfu_max_moe)),
        ("MFU half-saturation, tokens per step", format!("{}", c.mfu_half_tokens)),
        ("attention efficiency", format!("{}", c.attention_efficiency)),
        ("KV bytes per token (BF16) per √(B params)", format!("{}", c.kv_bytes_per_token_per_sqrt_b)),
        ("attention FLOPs per token pair per KV byte", format!("{}", c.attention_flops_per_kv_byte)),
        ("runtime memory reserve per GPU", format!("{} GiB", c.runtime_reserve / 1024f64.powi(3))),
        ("vision encoder share of weights", format!("{}", c.vision_encoder_fraction)),
        ("tensor-parallel efficiency", format!("{}", c.tensor_parallel_efficiency)),
        ("draft cost per draft token per step", format!("{} ms", c.draft_cost * 1e3)),
        (
            "draft acceptance: mtp / eagle / ngram / other",
            format!("{} / {} / {} / {}", c.acceptance_mtp, c.acceptance_eagle, c.acceptance_ngram, c.acceptance_other),
        ),
        ("model load: bandwidth, warm-up", format!("{} GB/s, {} s", c.load_bandwidth / 1e9, c.load_warmup)),
    ] {
        let _ = writeln!(doc, "| {name} | {value} |");
    }
    let _ = writeln!(
        doc,
        "\n| engine, mode | step overhead | per decode token | max seqs | batched tokens | memory fraction |\n|---|---|---|---|---|---|"
    );
    for (engine, mode) in [
        (EngineKind::Vllm, None),
        (EngineKind::Vllm, Some("throughput")),
        (EngineKind::Vllm, Some("interactivity")),
        (EngineKind::Sglang, None),
    ] {
        let e = EngineCosts::of(engine, mode);
        let _ = writeln!(
            doc,
            "| {engine} {} | {:.2} ms | {:.3} ms | {} | {} | {} |",
            mode.unwrap_or("default"),
            e.step_overhead * 1e3,
            e.decode_token_overhead * 1e3,
            e.default_max_num_seqs,
            e.default_max_num_batched_tokens,
            e.default_memory_fraction
        );
    }
    let _ = writeln!(
        doc,
        "\n## Published against simulated\n\nGenerated by `cargo test -p benchfleet-sim calibration`; do not edit by hand.\n\"vs\" columns: the change against row #n, positive when better for the study's objective (higher throughput, lower latency).\n\n{table}"
    );
    doc
}

#[test]
fn calibration_matches_the_published_reports_and_the_docs() {
    let (doc, failures) = calibrate();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/sim-calibration.md");
    if std::env::var_os("UPDATE_CALIBRATION").is_some() {
        std::fs::write(&path, &doc).expect("write docs/sim-calibration.md");
    }
    assert!(failures.is_empty(), "calibration checks failed:\n{}\n\n{doc}", failures.join("\n"));
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == doc,
        "docs/sim-calibration.md is out of date: rerun with UPDATE_CALIBRATION=1 and commit it\n\n{doc}"
    );
}
