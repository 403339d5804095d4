//! The published reference studies as a table the simulator is fitted to and checked against.
//!
//! Every [`Row`] replays one published benchmark (model, GPU, engine flags,
//! profile) in virtual time. A row is a baseline (its absolute figure must
//! land within [`ABSOLUTE_BAND`]), an effect against an earlier row (within
//! [`EFFECT_BAND`] percentage points of the published effect), optionally a
//! stage the study rejected (it must stay below the stage it was tried
//! against), or a run whose published success rate was below 100% (the
//! simulated rate must land within the effect band). [`fit`] searches the
//! coefficients that minimise the misses; `docs/sim-calibration.md` is built
//! from [`evaluate`] by the calibration test, with the hold-out error of
//! coefficients fitted without each study ([`HOLD_OUT`]).

use rand::{SeedableRng, seq::SliceRandom};
use rand_chacha::ChaCha8Rng;

use crate::{
    Scheduler,
    config::{EngineKind, SimConfig, parse_command_line_with_gpu},
    profile::{COEFFICIENTS, Coefficients, EngineCosts, StepParts},
    simulate::{self, Arrival, Summary, Workload},
};

/// The orders of its requests a ShareGPT row is replayed in ([`Profile::workloads`]).
pub const ORDERS: usize = 4;

/// An effect must land within this many percentage points of the published one.
pub const EFFECT_BAND: f64 = 3.0;
/// A baseline's absolute figure must land within this fraction of the published one.
pub const ABSOLUTE_BAND: f64 = 0.10;

/// The reference studies. The Chinese and the Russian reports are one study (the 35B-A3B on the
/// H200) in two languages, so there are three to fit on and hold out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Study {
    Throughput35b,
    Throughput9b,
    Latency9b,
}

impl Study {
    pub const ALL: [Study; 3] = [Study::Throughput35b, Study::Throughput9b, Study::Latency9b];

    pub fn title(self) -> &'static str {
        match self {
            Study::Throughput35b => "Qwen3.5-35B-A3B on H200, throughput",
            Study::Throughput9b => "Qwen3.5-9B on H100, throughput",
            Study::Latency9b => "Qwen3.5-9B on H100, latency",
        }
    }

    /// A short name for command lines: `35b`, `9b`, `latency`.
    pub fn key(self) -> &'static str {
        match self {
            Study::Throughput35b => "35b",
            Study::Throughput9b => "9b",
            Study::Latency9b => "latency",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Profile {
    /// ShareGPT at 1000 req/s, 1000 requests, the client holding at most 512 in flight.
    ShareGpt,
    /// Random prompts (the reports' token totals per request), 1000 req/s, at most 512 in flight.
    Random { requests: usize, input: usize, output: usize },
    /// ShareGPT at a constant rate, 1000 requests (the latency study).
    ShareGptRate(f64),
}

impl Profile {
    pub fn name(self) -> String {
        match self {
            Profile::ShareGpt => "ShareGPT".into(),
            Profile::Random { input, output, .. } => format!("random {input}/{output}"),
            Profile::ShareGptRate(rate) => format!("ShareGPT {rate} req/s"),
        }
    }

    /// The orders a row's requests are replayed in, its figure the mean over them: ShareGPT's
    /// lengths vary, and which of them a run admits first and drains last moves a run's
    /// throughput by 0.4-0.9% (one standard deviation over orders), an effect by up to a point,
    /// and a latency near the engine's capacity by several percent; the same requests in
    /// [`ORDERS`] orders give the figure the lengths do, not one order's luck. Random prompts are
    /// all alike: one order.
    pub fn workloads(self) -> Vec<Workload> {
        let first = self.workload();
        match self {
            Profile::Random { .. } => vec![first],
            Profile::ShareGpt | Profile::ShareGptRate(_) => std::iter::once(first.clone())
                .chain((1..ORDERS as u64).map(|seed| {
                    let mut shuffled = first.clone();
                    shuffled.items.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
                    shuffled
                }))
                .collect(),
        }
    }

    /// The requests in the stand-in's order (the first of [`Profile::workloads`]).
    pub fn workload(self) -> Workload {
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
pub enum Objective {
    Throughput,
    Latency,
}

/// What a row must satisfy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// A baseline: its absolute figure within [`ABSOLUTE_BAND`] of the published one.
    Baseline,
    /// The change against row `base` within [`EFFECT_BAND`] points of the published change; with
    /// `below`, a stage the study rejected: it must also stay below row `below`.
    Effect { base: usize, below: Option<usize> },
    /// Published with this success rate (percent): the simulated rate within [`EFFECT_BAND`] points.
    Success(f64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub study: Study,
    pub gpu: &'static str,
    pub model: &'static str,
    pub engine: EngineKind,
    pub args: &'static str,
    pub profile: Profile,
    pub objective: Objective,
    /// The figure as the report prints it: a throughput line (tok/s), a mean latency (s), or a
    /// success rate (percent). The checks use [`Row::figure`].
    pub published: f64,
    /// The report's "Benchmark duration (s)" for the run (throughput rows; `None` for the latency
    /// study, whose objective is not a rate). The report's throughput lines do not divide the run's
    /// tokens by it but by guidellm's span from the run's first token event to its last, where vLLM's
    /// streamed thinking made no events: 0.1 to 16 seconds shorter and not by the same margin from
    /// run to run; see [`line_effect`] and [`outside_the_line`].
    pub duration: Option<f64>,
    pub check: Check,
}

impl Row {
    /// The figure the checks compare the simulator's with: a throughput run's tokens over its
    /// published duration, as benchfleet's loadgen, `vllm bench serve` and the simulator measure
    /// throughput (the report's throughput lines leave out a part of the run that depends on its
    /// client, see [`outside_the_line`]); else the published figure.
    pub fn figure(&self) -> f64 {
        match (self.duration, self.check, self.objective) {
            (Some(duration), Check::Baseline | Check::Effect { .. }, Objective::Throughput) => {
                self.tokens() as f64 / duration
            }
            _ => self.published,
        }
    }

    /// The prompt and output tokens of the row's requests, as the reports total them.
    pub fn tokens(&self) -> usize {
        self.profile.workload().items.iter().map(|item| item.prompt_tokens + item.output_tokens).sum()
    }

    /// The engine's command line, as an operator would type it.
    pub fn command(&self) -> String {
        match self.engine {
            EngineKind::Vllm => format!("vllm serve {} {}", self.model, self.args),
            EngineKind::Sglang => format!("python3 -m sglang.launch_server --model-path {} {}", self.model, self.args),
        }
    }
}

const MOE: &str = "Qwen/Qwen3.5-35B-A3B";
const MOE_FP8: &str = "Qwen/Qwen3.5-35B-A3B-FP8";
const DENSE: &str = "Qwen/Qwen3.5-9B";
const BASE_VLLM: &str = "--reasoning-parser=qwen3 --max-model-len=32768";
const BASE_SGLANG: &str = "--reasoning-parser=qwen3 --context-length=32768";
const RANDOM_1K: Profile = Profile::Random { requests: 1000, input: 1034, output: 128 };
const LONG: Profile = Profile::Random { requests: 100, input: 32010, output: 100 };
const GEN_HEAVY: Profile = Profile::Random { requests: 200, input: 1010, output: 2000 };
/// MTP with 4 draft tokens at high load. The reports' runs failed once the batch passed a size;
/// the calibration sets the simulator's flag for it (`--sim-spec-failure-batch`).
const MTP4: &str = "--reasoning-parser=qwen3 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":4} --max-model-len=32768 --sim-spec-failure-batch=470";

/// The published figures, row by row, with what each must satisfy.
#[rustfmt::skip]
pub fn rows() -> Vec<Row> {
    use Check::*;
    use EngineKind::{Sglang, Vllm};
    use Objective::{Latency, Throughput};
    use Study::*;
    let row = |study, gpu, model, engine, args, profile, objective, published, check| Row {
        study, gpu, model, engine, args, profile, objective, published, duration: None, check,
    };
    let timed = |row: Row, seconds: f64| Row { duration: Some(seconds), ..row };
    let effect = |base| Effect { base, below: None };
    let opt35 = "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --enable-prefix-caching";
    let opt9 = "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-seqs=512";
    let lat_opt = "--reasoning-parser=qwen3 --max-model-len=32768 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1} --language-model-only --performance-mode=interactivity";
    let s = Profile::ShareGpt;
    let (t35, t9, l9) = (Throughput35b, Throughput9b, Latency9b);
    vec![
        // 0..
        timed(row(t35, "H200", MOE, Vllm, BASE_VLLM, s, Throughput, 9632.01, Baseline), 70.72),
        timed(row(t35, "H200", MOE, Sglang, BASE_SGLANG, s, Throughput, 4995.66, effect(0)), 124.99),
        timed(row(t35, "H200", MOE_FP8, Vllm, BASE_VLLM, s, Throughput, 9942.93, effect(0)), 65.09),
        timed(row(t35, "H200", MOE_FP8, Vllm, "--reasoning-parser=qwen3 --enable-prefix-caching --max-model-len=32768", s, Throughput, 10338.96, effect(0)), 66.14),
        timed(row(t35, "H200", MOE_FP8, Vllm, opt35, s, Throughput, 10570.88, effect(0)), 65.25),
        // Rejected: below the stage before it.
        timed(row(t35, "H200", MOE_FP8, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --enable-prefix-caching --kv-cache-dtype=fp8", s, Throughput, 10363.77, Effect { base: 0, below: Some(4) }), 66.34),
        timed(row(t35, "H200", MOE_FP8, Vllm, MTP4, s, Throughput, 15514.15, Success(51.6)), 17.44),
        // 7..
        timed(row(t35, "H200", MOE, Vllm, BASE_VLLM, RANDOM_1K, Throughput, 37934.72, Baseline), 40.37),
        timed(row(t35, "H200", MOE_FP8, Vllm, opt35, RANDOM_1K, Throughput, 50464.84, effect(7)), 33.09),
        timed(row(t35, "H200", MOE, Vllm, BASE_VLLM, LONG, Throughput, 44993.20, Baseline), 73.72),
        timed(row(t35, "H200", MOE_FP8, Vllm, opt35, LONG, Throughput, 56424.42, effect(9)), 59.32),
        timed(row(t35, "H200", MOE, Vllm, BASE_VLLM, GEN_HEAVY, Throughput, 10455.38, Baseline), 57.74),
        timed(row(t35, "H200", MOE_FP8, Vllm, opt35, GEN_HEAVY, Throughput, 12258.79, effect(11)), 49.34),
        // 13..
        timed(row(t9, "H100", DENSE, Vllm, BASE_VLLM, s, Throughput, 11527.14, Baseline), 54.74),
        timed(row(t9, "H100", DENSE, Sglang, BASE_SGLANG, s, Throughput, 6499.41, effect(13)), 96.01),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --enable-prefix-caching --max-model-len=32768", s, Throughput, 11224.70, Effect { base: 13, below: Some(13) }), 56.47),
        timed(row(t9, "H100", DENSE, Vllm, MTP4, s, Throughput, 15059.89, Success(51.5)), 12.27),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768", s, Throughput, 11496.39, effect(13)), 54.66),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --max-model-len=32768 --max-num-seqs=1024", s, Throughput, 11532.64, effect(13)), 54.87),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=32768", s, Throughput, 11672.72, effect(13)), 54.20),
        // 20: the report's own pair, 512 against 256 sequences (+6.80%).
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-seqs=256", s, Throughput, 11019.18, effect(13)), 57.32),
        timed(row(t9, "H100", DENSE, Vllm, opt9, s, Throughput, 11768.22, effect(20)), 53.72),
        // 22: the rest of the report's batch-limit settings. Under the client's 512 requests in
        // flight, 512, 1024 (#18) and 2048 sequences run the same batches: their spread is the
        // report's noise.
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --max-model-len=32768 --max-num-seqs=512", s, Throughput, 11464.53, effect(13)), 54.89),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --max-model-len=32768 --max-num-seqs=2048", s, Throughput, 11388.13, effect(13)), 55.28),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=24576", s, Throughput, 11512.90, effect(13)), 54.56),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=32768 --max-num-seqs=512", s, Throughput, 11333.89, effect(13)), 55.33),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=49152 --max-num-seqs=512", s, Throughput, 11573.41, effect(13)), 54.48),
        timed(row(t9, "H100", DENSE, Vllm, "--reasoning-parser=qwen3 --performance-mode=throughput --max-model-len=32768 --max-num-batched-tokens=49152 --max-num-seqs=768", s, Throughput, 11628.47, effect(13)), 54.07),
        timed(row(t9, "H100", DENSE, Vllm, BASE_VLLM, RANDOM_1K, Throughput, 29822.16, Baseline), 43.00),
        timed(row(t9, "H100", DENSE, Vllm, opt9, RANDOM_1K, Throughput, 34470.14, effect(28)), 39.10),
        // 30..
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(8.0), Latency, 2.62, Baseline),
        row(l9, "H100", DENSE, Sglang, "--context-length=32768", Profile::ShareGptRate(8.0), Latency, 8.13, effect(30)),
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768 --enable-prefix-caching", Profile::ShareGptRate(8.0), Latency, 2.69, effect(30)),
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768 --max-num-batched-tokens=16384", Profile::ShareGptRate(8.0), Latency, 2.64, effect(30)),
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768 --max-num-seqs=128", Profile::ShareGptRate(8.0), Latency, 2.66, effect(30)),
        row(l9, "H100", DENSE, Vllm, "--speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1} --max-model-len=32768", Profile::ShareGptRate(8.0), Latency, 2.39, effect(30)),
        row(l9, "H100", DENSE, Vllm, "--performance-mode=interactivity --max-model-len=32768 --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1}", Profile::ShareGptRate(8.0), Latency, 2.38, effect(30)),
        row(l9, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(8.0), Latency, 2.32, effect(30)),
        // 38..
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(1.0), Latency, 2.09, Baseline),
        row(l9, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(1.0), Latency, 1.65, effect(38)),
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(4.0), Latency, 2.33, Baseline),
        row(l9, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(4.0), Latency, 1.90, effect(40)),
        row(l9, "H100", DENSE, Vllm, "--max-model-len=32768", Profile::ShareGptRate(16.0), Latency, 4.37, Baseline),
        row(l9, "H100", DENSE, Vllm, lat_opt, Profile::ShareGptRate(16.0), Latency, 3.72, effect(42)),
    ]
}

/// What the simulator gave for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Simulated {
    /// The objective over the successful requests, the mean over the row's orders.
    pub value: f64,
    /// Successful requests, percent, the mean over the row's orders.
    pub success: f64,
}

/// The engine `row` starts, on its GPU, with `coefficients`.
fn config_of(row: &Row, coefficients: &Coefficients) -> SimConfig {
    configured(&row.command(), row.gpu, coefficients)
}

/// The engine a published `command` starts on `gpu`, with `coefficients`.
fn configured(command: &str, gpu: &str, coefficients: &Coefficients) -> SimConfig {
    let args: Vec<String> = command.split_whitespace().map(String::from).collect();
    let mut config = parse_command_line_with_gpu(&args, Some(gpu)).expect("a published command line parses");
    config.coefficients = *coefficients;
    config
}

/// Replays `row` on the simulator with `coefficients`, in each of its profile's orders: the mean
/// of its figures and of its success rates.
pub fn simulate_row(row: &Row, coefficients: &Coefficients) -> Simulated {
    let config = config_of(row, coefficients);
    let runs: Vec<Simulated> = row
        .profile
        .workloads()
        .iter()
        .map(|workload| {
            let timings = simulate::simulate(&config, workload).expect("the reference configuration fits");
            let summary = Summary::of(&timings);
            let value = match row.objective {
                Objective::Throughput => summary.total_token_throughput,
                Objective::Latency => summary.mean_latency,
            };
            Simulated { value, success: 100.0 * summary.requests as f64 / timings.len().max(1) as f64 }
        })
        .collect();
    let mean = |f: fn(&Simulated) -> f64| runs.iter().map(f).sum::<f64>() / runs.len() as f64;
    Simulated { value: mean(|r| r.value), success: mean(|r| r.success) }
}

/// Where a row's engine time goes, and how full its batches ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Breakdown {
    /// Each part summed over the steps, the linear layers' side (compute or memory) counted only
    /// where it bound the step.
    pub parts: StepParts,
    /// Decoding sequences per step, weighted by the steps' durations.
    pub mean_decode_batch: f64,
    /// Sequences preempted for want of KV cache room.
    pub preemptions: u64,
    /// The steps, and those that prefilled (vLLM's mix decodes into them).
    pub steps: u64,
    pub prefill_steps: u64,
    /// The replay's own figures (duration, mean TTFT and latency), to set beside the report's block.
    pub summary: Summary,
}

/// Replays `row` (in its first order) and says where its engine time went.
pub fn breakdown(row: &Row, coefficients: &Coefficients) -> Breakdown {
    let mut scheduler =
        Scheduler::from_config(&config_of(row, coefficients)).expect("the reference configuration fits");
    let cost = *scheduler.cost();
    let mut sum = StepParts::default();
    let (mut busy, mut batch_time) = (0.0, 0.0);
    let (mut steps, mut prefill_steps) = (0, 0);
    let timings = simulate::simulate_observed(&mut scheduler, &row.profile.workload(), |step| {
        let parts = cost.step_parts(&step.work);
        if step.duration.is_zero() {
            return;
        }
        steps += 1;
        prefill_steps += u64::from(step.work.prefill_tokens > 0);
        let seconds = step.duration.as_secs_f64();
        let sequences = step.work.decoding_sequences();
        busy += seconds;
        batch_time += seconds * sequences as f64;
        sum.overhead += parts.overhead;
        sum.tokens += parts.tokens;
        sum.extras += parts.extras;
        sum.attention += parts.attention;
        if parts.compute >= parts.memory {
            sum.compute += parts.compute;
        } else {
            sum.memory += parts.memory;
        }
    });
    Breakdown {
        parts: sum,
        mean_decode_batch: if busy > 0.0 { batch_time / busy } else { 0.0 },
        preemptions: scheduler.counters().preemptions,
        steps,
        prefill_steps,
        summary: Summary::of(&timings),
    }
}

/// Relative change from `base` to `value`, signed so that positive is better for the objective.
pub fn gain(objective: Objective, base: f64, value: f64) -> f64 {
    match objective {
        Objective::Throughput => value / base - 1.0,
        Objective::Latency => base / value - 1.0,
    }
}

/// A throughput row's published effect by the report's throughput lines, percent, beside the one
/// the checks use (by the runs' durations, [`Row::figure`]). The lines leave out a part of each run
/// that differs from run to run ([`outside_the_line`]), so the two effects of one pair of runs can
/// differ by more than a band: +33.0% by the lines and +22.0% by the durations for the 35B-A3B's
/// random 1034/128. `None` for a row without an effect or a duration.
pub fn line_effect(rows: &[Row], row: &Row) -> Option<f64> {
    let Check::Effect { base, .. } = row.check else { return None };
    match (row.objective, rows[base].duration, row.duration) {
        (Objective::Throughput, Some(_), Some(_)) => Some(100.0 * (row.published / rows[base].published - 1.0)),
        _ => None,
    }
}

/// Seconds of a throughput row's run that its published throughput line leaves out: the duration
/// less the run's tokens over the line. The reports' client (guidellm, through GPUStack's benchmark
/// runner) divides by the span from its first token event to its last, and made no event of vLLM's
/// streamed thinking (`reasoning`), so a vLLM reply that never left the thinking has every token at
/// its first chunk. The second figure is the simulator's where that is all of a run: vLLM with a
/// reasoning parser on random prompts of 128 tokens or fewer, whose replies are all thinking, the
/// span then running from the first request's first token to the last request's first token (the
/// mean over the row's orders). `None` for a row without a duration, or whose requests half failed.
pub fn outside_the_line(row: &Row, coefficients: &Coefficients) -> Option<(f64, Option<f64>)> {
    let duration = row.duration?;
    if matches!(row.check, Check::Success(_)) {
        return None;
    }
    let published = duration - row.tokens() as f64 / row.published;
    let all_thinking = row.engine == EngineKind::Vllm
        && row.args.contains("--reasoning-parser")
        && matches!(row.profile, Profile::Random { output, .. } if output <= 128);
    let simulated = all_thinking.then(|| {
        let config = config_of(row, coefficients);
        let workloads = row.profile.workloads();
        let outside: f64 = workloads
            .iter()
            .map(|workload| {
                let timings = simulate::simulate(&config, workload).expect("the reference configuration fits");
                let extreme = |f: fn(&simulate::RequestTiming) -> f64, max: bool| {
                    let values = timings.iter().map(f);
                    if max { values.fold(f64::MIN, f64::max) } else { values.fold(f64::MAX, f64::min) }
                };
                let duration = extreme(|t| t.completed, true) - extreme(|t| t.sent, false);
                duration - (extreme(|t| t.first_token, true) - extreme(|t| t.first_token, false))
            })
            .sum();
        outside / workloads.len() as f64
    });
    Some((published, simulated))
}

/// One row checked: what was published and simulated, and by how much it missed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub simulated: Simulated,
    /// The published and simulated figures the check compares: percent effects against the base
    /// row, a baseline's error in percent (published 0), or success rates in percent.
    pub published_figure: f64,
    pub simulated_figure: f64,
    /// The band the two figures must agree within: points, or percent for a baseline.
    pub band: f64,
    /// How far outside its band the row is, in band widths (0 inside); [`loss`] prices it.
    pub miss: f64,
    /// Empty when the row holds; else what failed.
    pub failure: Option<String>,
}

/// Simulates every row of `rows` with `coefficients` and checks it.
pub fn evaluate(rows: &[Row], coefficients: &Coefficients) -> Vec<Outcome> {
    evaluate_studies(rows, coefficients, &Study::ALL).into_iter().map(|o| o.expect("every study evaluated")).collect()
}

/// [`evaluate`] for the rows of `studies` only (a row's base is always in its own study); the
/// others are `None`.
pub fn evaluate_studies(rows: &[Row], coefficients: &Coefficients, studies: &[Study]) -> Vec<Option<Outcome>> {
    let chosen: Vec<usize> = (0..rows.len()).filter(|&i| studies.contains(&rows[i].study)).collect();
    // Rows are independent and the model is pure: one thread per core, rows dealt round-robin.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(chosen.len().max(1));
    let mut simulated: Vec<Option<Simulated>> = vec![None; rows.len()];
    std::thread::scope(|scope| {
        let chosen = &chosen;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    chosen
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .map(|&i| (i, simulate_row(&rows[i], coefficients)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            for (i, sim) in worker.join().expect("a calibration row panicked") {
                simulated[i] = Some(sim);
            }
        }
    });
    rows.iter().zip(&simulated).map(|(row, sim)| sim.map(|sim| check(rows, &simulated, row, sim))).collect()
}

fn check(rows: &[Row], simulated: &[Option<Simulated>], row: &Row, sim: Simulated) -> Outcome {
    let of = |i: usize| simulated[i].expect("a row's base is in its study").value;
    // A decision the study took that the simulator would take the other way.
    let mut flipped = false;
    let (published_figure, simulated_figure, band, mut failure) = match row.check {
        Check::Baseline => {
            let error = 100.0 * (sim.value / row.figure() - 1.0);
            let failure = (error.abs() > ABSOLUTE_BAND * 100.0).then(|| format!("error {error:+.1}%"));
            (0.0, error, ABSOLUTE_BAND * 100.0, failure)
        }
        Check::Effect { base, below } => {
            let published = 100.0 * gain(row.objective, rows[base].figure(), row.figure());
            let effect = 100.0 * gain(row.objective, of(base), sim.value);
            let mut failure = ((effect - published).abs() > EFFECT_BAND)
                .then(|| format!("effect {effect:+.1}% against the published {published:+.1}%"));
            // A rejected stage may tie (a flag that is on by default changes nothing) but not win.
            if let Some(stage) = below
                && gain(row.objective, of(stage), sim.value) > 0.0
            {
                failure = Some(format!("better than #{stage}, which the study kept"));
                flipped = true;
            }
            (published, effect, EFFECT_BAND, failure)
        }
        Check::Success(published) => {
            let failure = ((sim.success - published).abs() > EFFECT_BAND)
                .then(|| format!("success rate {:.1}% against the published {published:.1}%", sim.success));
            (published, sim.success, EFFECT_BAND, failure)
        }
    };
    let miss = ((simulated_figure - published_figure).abs() / band - 1.0).max(0.0) + if flipped { 1.0 } else { 0.0 };
    if sim.success < 100.0 && !matches!(row.check, Check::Success(_)) && failure.is_none() {
        failure = Some(format!("only {:.1}% of the requests succeeded", sim.success));
    }
    Outcome { simulated: sim, published_figure, simulated_figure, band, miss, failure }
}

/// The loss [`fit`] minimises over `outcomes`: squared distances from the published figures in
/// band widths, a heavy price per band width left and a fixed one per row outside its band, so
/// that fewer rows outside beat a closer fit of most.
pub fn loss(outcomes: &[Outcome]) -> f64 {
    outcomes
        .iter()
        .map(|o| {
            let distance = (o.simulated_figure - o.published_figure) / o.band;
            distance * distance + 10.0 * o.miss + if o.miss > 0.0 { 5.0 } else { 0.0 }
        })
        .sum()
}

/// The [`loss`] a fit minimises over rows' outcomes by number ([`evaluate_studies`]'s: `None` for a
/// row of a study held out): every row's but those numbered in `left_out`.
pub fn fitted_loss(outcomes: Vec<Option<Outcome>>, left_out: &[usize]) -> f64 {
    let kept: Vec<Outcome> = outcomes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !left_out.contains(i))
        .filter_map(|(_, outcome)| outcome)
        .collect();
    loss(&kept)
}

/// One fitted coefficient: its name, how to read and write it, and the range it may take.
pub struct Knob {
    pub name: &'static str,
    pub get: fn(&Coefficients) -> f64,
    pub set: fn(&mut Coefficients, f64),
    pub range: (f64, f64),
}

/// The coefficients the fit moves; the rest are data-sheet numbers or structural.
pub fn knobs() -> Vec<Knob> {
    macro_rules! knob {
        ($name:literal, $($field:ident).+, $lo:expr, $hi:expr) => {
            Knob { name: $name, get: |c| c.$($field).+, set: |c, v| c.$($field).+ = v, range: ($lo, $hi) }
        };
    }
    vec![
        knob!("bandwidth efficiency", bandwidth_efficiency, 0.5, 0.95),
        knob!("MFU max, dense", mfu_max_dense, 0.2, 0.8),
        knob!("MFU max, MoE", mfu_max_moe, 0.05, 0.6),
        knob!("MFU half-saturation", mfu_half_tokens, 8.0, 120.0),
        knob!("FP8 linear gain", fp8_linear_gain, 0.0, 1.0),
        knob!("FP8 KV dequantisation", kv_fp8_dequant_cost, 0.0, 1e-6),
        knob!("recurrent state bytes", state_bytes_per_sqrt_b, 0.0, 64e6),
        knob!("hybrid prefix-cache cost", hybrid_prefix_cache_cost, 0.0, 4e-6),
        knob!("draft cost", draft_cost, 0.0, 5e-3),
        knob!("draft cost per sequence", draft_cost_per_sequence, 0.0, 200e-6),
        knob!("linear-attention efficiency", linear_attention_efficiency, 0.02, 1.0),
        knob!("kernel boundaries", kernel_boundaries, 0.0, 3e-3),
        knob!("multimodal inputs", multimodal_inputs_cost, 0.0, 2e-3),
        knob!("MTP acceptance", acceptance_mtp, 0.1, 0.95),
        knob!("vLLM hybrid step overhead", vllm_hybrid_step_overhead, 0.0, 20e-3),
        knob!("vLLM per-token overhead", vllm.decode_token_overhead, 0.0, 0.5e-3),
        knob!("vLLM overlap", vllm.overlap, 0.0, 1.0),
        knob!("vLLM mixed-step token factor", vllm.mixed_token_factor, 1.0, 6.0),
        knob!("eager layer overhead", eager_layer_overhead, 0.0, 1e-3),
        knob!("eager MoE layer overhead", eager_moe_layer_overhead, 0.0, 2e-3),
        knob!("SGLang step overhead", sglang.step_overhead, 0.1e-3, 40e-3),
        knob!("SGLang per-token overhead", sglang.decode_token_overhead, 0.0, 2e-3),
        knob!("SGLang overlap", sglang.overlap, 0.0, 1.0),
        knob!("interactivity step factor", interactivity_step_factor, 0.1, 1.0),
    ]
}

/// Fits `knobs` (of [`knobs`]) to the rows of `studies` by coordinate descent from `start`: each
/// coefficient in turn is moved up and down by a step, kept where the loss falls, and the steps
/// halve when no move helps. The rows numbered in `left_out` are replayed (others' effects are
/// measured against them) but their own checks do not count. Deterministic; `progress` sees each
/// improvement.
pub fn fit(
    start: Coefficients,
    studies: &[Study],
    left_out: &[usize],
    knobs: &[Knob],
    rounds: usize,
    mut progress: impl FnMut(f64, &Coefficients),
) -> Coefficients {
    let rows: Vec<Row> = rows();
    let score = |c: &Coefficients| fitted_loss(evaluate_studies(&rows, c, studies), left_out);
    let mut best = start;
    let mut best_loss = score(&best);
    progress(best_loss, &best);
    let mut steps: Vec<f64> = vec![0.25; knobs.len()];
    for _ in 0..rounds {
        let mut moved = false;
        for (knob, step) in knobs.iter().zip(steps.iter_mut()) {
            let (lo, hi) = knob.range;
            let moves: [&dyn Fn(f64, f64) -> f64; 3] =
                [&|v, s| v * (1.0 + s), &|v, s| v / (1.0 + s), &|v, s| v + (hi - lo) * s * 0.1];
            for step_to in moves {
                // A move that helps is repeated while it keeps helping.
                let mut helped = false;
                loop {
                    let value = (knob.get)(&best);
                    let candidate = step_to(value, *step).clamp(lo, hi);
                    if candidate == value {
                        break;
                    }
                    let mut trial = best;
                    (knob.set)(&mut trial, candidate);
                    let trial_loss = score(&trial);
                    if trial_loss >= best_loss {
                        break;
                    }
                    (best, best_loss, moved, helped) = (trial, trial_loss, true, true);
                    progress(best_loss, &best);
                }
                if helped {
                    break;
                }
            }
        }
        if !moved {
            steps.iter_mut().for_each(|s| *s /= 2.0);
            if steps[0] < 0.005 {
                break;
            }
        }
    }
    best
}

/// The rows whose own checks the committed fits leave out of their loss (their bands are still
/// checked, and other rows' effects are still measured against them): none. The 35B-A3B's
/// ShareGPT baseline was, while the model ran it 17% fast and fitted to it ran its study's other
/// runs slower, until a step past the CUDA graphs launched its kernels layer by layer, a mixture
/// of experts' more (docs/sim-calibration.md, "ran too fast"). `calibrate` leaves them out
/// unless `LEAVE_OUT` says otherwise.
pub const LEFT_OUT: &[usize] = &[];

/// Where every fit starts: the hand-set coefficients the simulator had before the first fit, with
/// the FP8 costs, the prefix-cache cost and vLLM's cost of a step without a CUDA graph, of the
/// mechanisms added since, switched off, and the
/// overlap, the mixed-step factor, the recurrent state and the linear-attention chunk kernels'
/// efficiency at rough hand estimates (the engines' defaults overlap fully; a piecewise step costs
/// twice a full graph's per token; Qwen3.5's linear-attention state is some tens of MB a sequence;
/// small tiles and a triangular solve reach about a quarter of the BF16 peak).
pub const START: Coefficients = Coefficients {
    bandwidth_efficiency: 0.9,
    mfu_max_dense: 0.7,
    mfu_max_moe: 0.35,
    mfu_half_tokens: 64.0,
    fp8_linear_gain: 1.0,
    kv_fp8_dequant_cost: 0.0,
    state_bytes_per_sqrt_b: 10e6,
    hybrid_prefix_cache_cost: 0.0,
    linear_attention_efficiency: 0.25,
    draft_cost: 0.4e-3,
    draft_cost_per_sequence: 0.0,
    kernel_boundaries: 0.5e-3,
    multimodal_inputs_cost: 0.1e-3,
    acceptance_mtp: 0.6,
    // Both engines overlap their CPU-side work with the GPU's by default (vLLM since 0.14).
    // vLLM's fixed step on a transformer is fitted to other runs (`fit_transformer_step`), not
    // to the studies: a hybrid model's adds the part the studies fit, started at nothing.
    vllm_hybrid_step_overhead: 0.0,
    vllm: EngineCosts { decode_token_overhead: 0.08e-3, mixed_token_factor: 2.0, overlap: 1.0, ..COEFFICIENTS.vllm },
    sglang: EngineCosts { step_overhead: 2.0e-3, decode_token_overhead: 0.33e-3, overlap: 1.0, ..COEFFICIENTS.sglang },
    eager_layer_overhead: 0.0,
    eager_moe_layer_overhead: 0.0,
    interactivity_step_factor: 0.8,
    ..COEFFICIENTS
};

/// The coefficients fitted without each study, to check the model on what it was not fitted to:
/// fitted from [`START`] (`cargo run --release -p benchfleet-sim --example calibrate -- STUDY`),
/// then, as mechanisms were added, refitted from the set before (`FROM=held-out`), which had not
/// seen the study either. Like the committed fit, they leave the rows of [`LEFT_OUT`] out of their
/// loss (the 35B-A3B's set, fitted without that row's study, never saw it).
#[rustfmt::skip]
pub const HOLD_OUT: [(Study, Coefficients); 3] = [
    (Study::Throughput35b, Coefficients { bandwidth_efficiency: 0.95, mfu_max_dense: 0.4587125, mfu_max_moe: 0.35, mfu_half_tokens: 120.0, fp8_linear_gain: 1.0, attention_efficiency: 0.5, linear_attention_efficiency: 0.12641975308641976, kv_bytes_per_token_per_sqrt_b: 4096.0, attention_flops_per_kv_byte: 4.0, kv_fp8_dequant_cost: 0.0, state_bytes_per_sqrt_b: 216861.84316589634, hybrid_prefix_cache_cost: 2.609999999999998e-6, runtime_reserve: 4294967296.0, vision_encoder_fraction: 0.02, load_bandwidth: 2000000000.0, load_warmup: 20.0, tensor_parallel_efficiency: 0.85, vllm_hybrid_step_overhead: 0.005473458394576919, eager_layer_overhead: 0.0006162500000000004, eager_moe_layer_overhead: 0.0, draft_cost: 0.003593513488769532, draft_cost_per_sequence: 0.0, kernel_boundaries: 0.0013878486728668216, multimodal_inputs_cost: 0.0007984985351562501, acceptance_mtp: 0.6484765625, acceptance_eagle: 0.6, acceptance_ngram: 0.3, acceptance_other: 0.5, default_params_b: 8.0, vllm: EngineCosts { step_overhead: 0.001204269, decode_token_overhead: 4.551111111111113e-5, default_max_num_seqs: 1024, default_max_num_batched_tokens: 8192, mixed_token_factor: 4.125, overlap: 1.0 }, sglang: EngineCosts { step_overhead: 0.0023238925199709514, decode_token_overhead: 0.00033, default_max_num_seqs: 4096, default_max_num_batched_tokens: 8192, mixed_token_factor: 1.0, overlap: 1.0 }, interactivity_step_factor: 1.0 }),
    (Study::Throughput9b, Coefficients { bandwidth_efficiency: 0.95, mfu_max_dense: 0.5838687499999998, mfu_max_moe: 0.30084876543209865, mfu_half_tokens: 120.0, fp8_linear_gain: 0.4327690000000001, attention_efficiency: 0.5, linear_attention_efficiency: 0.7046527777777777, kv_bytes_per_token_per_sqrt_b: 4096.0, attention_flops_per_kv_byte: 4.0, kv_fp8_dequant_cost: 1.673432436896142e-8, state_bytes_per_sqrt_b: 10623149.728736812, hybrid_prefix_cache_cost: 1.4937184233323942e-6, runtime_reserve: 4294967296.0, vision_encoder_fraction: 0.02, load_bandwidth: 2000000000.0, load_warmup: 20.0, tensor_parallel_efficiency: 0.85, vllm_hybrid_step_overhead: 0.00377136771875, eager_layer_overhead: 6.850700568856993e-11, eager_moe_layer_overhead: 0.0012999999999999997, draft_cost: 0.004581794738769533, draft_cost_per_sequence: 5.2526369186101854e-5, kernel_boundaries: 0.0011901739078822413, multimodal_inputs_cost: 0.001593921392184711, acceptance_mtp: 0.738125, acceptance_eagle: 0.6, acceptance_ngram: 0.3, acceptance_other: 0.5, default_params_b: 8.0, vllm: EngineCosts { step_overhead: 0.001204269, decode_token_overhead: 8.969696969696971e-5, default_max_num_seqs: 1024, default_max_num_batched_tokens: 8192, mixed_token_factor: 2.4987500000000002, overlap: 1.0 }, sglang: EngineCosts { step_overhead: 0.004718473746484632, decode_token_overhead: 0.00033, default_max_num_seqs: 4096, default_max_num_batched_tokens: 8192, mixed_token_factor: 1.0, overlap: 1.0 }, interactivity_step_factor: 0.1 }),
    (Study::Latency9b, Coefficients { bandwidth_efficiency: 0.95, mfu_max_dense: 0.8, mfu_max_moe: 0.38128138416986146, mfu_half_tokens: 120.0, fp8_linear_gain: 0.4403384444444446, attention_efficiency: 0.5, linear_attention_efficiency: 0.24311111111111114, kv_bytes_per_token_per_sqrt_b: 4096.0, attention_flops_per_kv_byte: 4.0, kv_fp8_dequant_cost: 2.403341919315431e-8, state_bytes_per_sqrt_b: 14553316.872427983, hybrid_prefix_cache_cost: 1.5039557767441125e-6, runtime_reserve: 4294967296.0, vision_encoder_fraction: 0.02, load_bandwidth: 2000000000.0, load_warmup: 20.0, tensor_parallel_efficiency: 0.85, vllm_hybrid_step_overhead: 0.0031639477075294394, eager_layer_overhead: 0.0005545584735898385, eager_moe_layer_overhead: 0.00030517578125, draft_cost: 0.00035369251555555556, draft_cost_per_sequence: 0.0, kernel_boundaries: 7.046681824958239e-5, multimodal_inputs_cost: 0.0007232556012802925, acceptance_mtp: 0.7961884469696969, acceptance_eagle: 0.6, acceptance_ngram: 0.3, acceptance_other: 0.5, default_params_b: 8.0, vllm: EngineCosts { step_overhead: 0.001204269, decode_token_overhead: 9.107692307692309e-5, default_max_num_seqs: 1024, default_max_num_batched_tokens: 8192, mixed_token_factor: 2.0854166666666667, overlap: 0.8125 }, sglang: EngineCosts { step_overhead: 0.0001, decode_token_overhead: 0.00033, default_max_num_seqs: 4096, default_max_num_batched_tokens: 8192, mixed_token_factor: 1.0, overlap: 1.0 }, interactivity_step_factor: 0.8 }),
];

/// A published run of a model the studies' fit never saw (four of them fit vLLM's step on a
/// transformer, [`fit_transformer_step`]): GPUStack's performance-lab studies of other
/// models (`docs/performance-lab/` in github.com/gpustack/gpustack), `vllm bench serve` sending
/// every request at once (or holding `concurrency` in flight) to vLLM 0.10.2-0.11.0 or SGLang
/// 0.5.3-0.5.5 on H100s (one but for gpt-oss-120b's `-tp` runs). Those vLLM releases scheduled
/// synchronously unless given `--async-scheduling`, so their commands are simulated with
/// `--no-async-scheduling`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OtherRun {
    /// The engine and its version.
    pub engine: &'static str,
    /// The serve command as published, and the simulator's flags beside it.
    pub command: &'static str,
    pub simulated_flags: &'static str,
    pub workload: OtherWorkload,
    /// The published "Benchmark duration", seconds.
    pub duration: f64,
    /// vLLM's fixed step on a transformer is fitted to this run ([`fit_transformer_step`]).
    pub fitted: bool,
}

/// What `vllm bench serve` sent in an [`OtherRun`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OtherWorkload {
    /// ShareGPT's first turns, with the run's mean tokens a request (its tokenizer's count, and
    /// the replies' lengths as the model wrote them).
    ShareGpt { requests: usize, input: f64, output: f64, concurrency: Option<usize> },
    /// Random prompts of `input` tokens asking for `output` (the run's mean where the model
    /// stopped before it).
    Random { requests: usize, input: usize, output: usize },
}

impl OtherWorkload {
    pub fn name(self) -> String {
        match self {
            OtherWorkload::ShareGpt { requests, concurrency: None, .. } => format!("ShareGPT, {requests} at once"),
            OtherWorkload::ShareGpt { requests, concurrency: Some(c), .. } => {
                format!("ShareGPT, {requests} at {c} in flight")
            }
            OtherWorkload::Random { requests, input, output } => format!("random {input}/{output}, {requests} at once"),
        }
    }

    pub fn workload(self) -> Workload {
        let at_once = |concurrency| Arrival::Rate { rate: 1e9, max_concurrency: concurrency };
        match self {
            OtherWorkload::ShareGpt { requests, input, output, concurrency } => Workload {
                items: simulate::sharegpt_shaped(requests, 42, input, output),
                arrival: at_once(concurrency),
            },
            OtherWorkload::Random { requests, input, output } => {
                Workload { items: simulate::random(requests, input, output, 42), arrival: at_once(None) }
            }
        }
    }
}

/// GPUStack's published runs of Qwen3-14B, Qwen3-8B, gpt-oss-20b and gpt-oss-120b on one H100
/// (gpt-oss-120b's `-tp` runs on two and four).
pub fn other_runs() -> Vec<OtherRun> {
    use OtherWorkload::{Random, ShareGpt};
    let sync = "--no-async-scheduling";
    let vllm11 = "vLLM 0.11.0";
    let share = |requests, input, output| ShareGpt { requests, input, output, concurrency: None };
    let qwen8 = |concurrency| ShareGpt { requests: 100, input: 232.6, output: 220.61, concurrency: Some(concurrency) };
    let run = |engine, command, simulated_flags, workload, duration| OtherRun {
        engine,
        command,
        simulated_flags,
        workload,
        duration,
        fitted: false,
    };
    // Qwen3-8B a few requests at a time on vLLM's synchronous scheduler: small decode steps that
    // show the whole of vLLM's fixed step on a transformer, fitted to them.
    let step_run = |concurrency, duration| OtherRun {
        fitted: true,
        ..run(vllm11, "vllm serve Qwen/Qwen3-8B", sync, qwen8(concurrency), duration)
    };
    let q14 = "vllm serve Qwen/Qwen3-14B";
    let q14_fp8 = "python3 -m sglang.launch_server --model-path Qwen/Qwen3-14B-FP8";
    let oss20 = "vllm serve openai/gpt-oss-20b";
    let oss120 = "vllm serve openai/gpt-oss-120b --max-model-len 32768";
    let sglang = "SGLang 0.5.5";
    vec![
        run(vllm11, q14, sync, share(1000, 217.393, 201.648), 63.53),
        run(vllm11, q14, sync, Random { requests: 100, input: 32000, output: 100 }, 386.80),
        run(vllm11, q14, sync, Random { requests: 500, input: 4000, output: 200 }, 227.57),
        run(vllm11, q14, sync, Random { requests: 500, input: 2000, output: 100 }, 98.91),
        run(vllm11, q14, sync, Random { requests: 1000, input: 128, output: 4 }, 22.72),
        run(
            sglang,
            "python3 -m sglang.launch_server --model-path Qwen/Qwen3-14B",
            "",
            share(1000, 217.393, 201.628),
            49.86,
        ),
        run(sglang, q14_fp8, "", share(1000, 217.393, 201.833), 40.21),
        run(sglang, q14_fp8, "", Random { requests: 100, input: 32000, output: 100 }, 320.54),
        run(sglang, q14_fp8, "", Random { requests: 500, input: 4000, output: 200 }, 171.14),
        run(sglang, q14_fp8, "", Random { requests: 500, input: 2000, output: 100 }, 70.99),
        run(sglang, q14_fp8, "", Random { requests: 1000, input: 128, output: 4 }, 7.80),
        step_run(1, 166.04),
        step_run(2, 85.78),
        step_run(4, 44.40),
        step_run(8, 24.05),
        run("SGLang 0.5.3", "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B", "", qwen8(4), 41.97),
        run("SGLang 0.5.3", "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B-FP8", "", qwen8(4), 33.54),
        run(vllm11, oss20, sync, share(1000, 215.312, 193.979), 24.81),
        run(vllm11, "vllm serve openai/gpt-oss-20b --async-scheduling", "", share(1000, 215.312, 193.919), 21.39),
        run(vllm11, oss20, sync, Random { requests: 100, input: 32000, output: 94 }, 107.95),
        run(vllm11, oss20, sync, Random { requests: 500, input: 4000, output: 105 }, 61.73),
        run(vllm11, oss20, sync, Random { requests: 500, input: 2000, output: 94 }, 32.58),
        run(vllm11, oss20, sync, Random { requests: 1000, input: 128, output: 4 }, 4.70),
        run(
            "SGLang 0.5.4",
            "python3 -m sglang.launch_server --model-path openai/gpt-oss-20b",
            "",
            share(1000, 215.312, 195.734),
            73.05,
        ),
        run(
            "SGLang 0.5.3",
            "python3 -m sglang.launch_server --model-path openai/gpt-oss-120b",
            "",
            share(1000, 215.312, 196.540),
            227.00,
        ),
        run("vLLM 0.10.2", oss120, sync, share(1000, 215.312, 195.544), 67.40),
        run(
            "vLLM 0.10.2",
            "vllm serve openai/gpt-oss-120b --max-model-len 32768 --async-scheduling",
            "",
            share(1000, 215.312, 187.289),
            63.65,
        ),
        run(
            "vLLM 0.10.2",
            "vllm serve openai/gpt-oss-120b --max-model-len 32768 --async-scheduling -tp 2",
            "",
            share(1000, 215.312, 196.205),
            25.65,
        ),
        run(
            "vLLM 0.10.2",
            "vllm serve openai/gpt-oss-120b --max-model-len 32768 --async-scheduling -tp 4",
            "",
            share(1000, 215.312, 196.174),
            17.32,
        ),
        run("vLLM 0.10.2", oss120, sync, Random { requests: 100, input: 32000, output: 99 }, 198.92),
        run("vLLM 0.10.2", oss120, sync, Random { requests: 500, input: 4000, output: 134 }, 145.04),
        run("vLLM 0.10.2", oss120, sync, Random { requests: 500, input: 2000, output: 98 }, 72.87),
        run("vLLM 0.10.2", oss120, sync, Random { requests: 1000, input: 128, output: 4 }, 7.72),
        run(
            "vLLM 0.10.2",
            oss120,
            sync,
            ShareGpt { requests: 100, input: 229.46, output: 216.91, concurrency: Some(4) },
            47.88,
        ),
    ]
}

/// An [`OtherRun`] replayed on the simulator under `coefficients` on an H100: its duration, seconds.
pub fn simulate_other(run: &OtherRun, coefficients: &Coefficients) -> f64 {
    let config = configured(&format!("{} {}", run.command, run.simulated_flags), "H100", coefficients);
    let timings = simulate::simulate(&config, &run.workload.workload()).expect("the engine starts");
    Summary::of(&timings).duration
}

/// vLLM's fixed step on a transformer ([`EngineCosts::step_overhead`]) fitted to the runs of
/// [`other_runs`] marked `fitted`, the rest of `coefficients` as they are: the step that makes the
/// sum of their squared log errors least, to a microsecond. The reports cannot fit it: every one
/// of their runs is of a hybrid model on an asynchronous scheduler, which hides most of a step.
pub fn fit_transformer_step(coefficients: &Coefficients) -> f64 {
    let runs: Vec<OtherRun> = other_runs().into_iter().filter(|r| r.fitted).collect();
    let loss = |step: f64| {
        let mut c = *coefficients;
        c.vllm.step_overhead = step;
        runs.iter().map(|r| (simulate_other(r, &c) / r.duration).ln().powi(2)).sum::<f64>()
    };
    // Golden-section search: each run's duration grows with the step, so the loss has one minimum.
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    let (mut lo, mut hi) = (0.0, 20e-3);
    let (mut a, mut b) = (hi - ratio * (hi - lo), lo + ratio * (hi - lo));
    let (mut loss_a, mut loss_b) = (loss(a), loss(b));
    while hi - lo > 1e-6 {
        if loss_a < loss_b {
            (hi, b, loss_b) = (b, a, loss_a);
            a = hi - ratio * (hi - lo);
            loss_a = loss(a);
        } else {
            (lo, a, loss_a) = (a, b, loss_b);
            b = lo + ratio * (hi - lo);
            loss_b = loss(b);
        }
    }
    (lo + hi) / 2.0
}
