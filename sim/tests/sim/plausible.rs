//! Answers for flag combinations no report measured: whatever the engine, GPU, model, parallelism
//! and flags, a step takes longer for more work and no longer on more or faster hardware or with
//! FP8 weights, and no configuration serves faster than its GPUs' tensor cores could compute or
//! decodes faster than their memory can read its weights.

use benchfleet_sim::{
    Scheduler, parse_command_line_with_gpu,
    profile::{CostModel, StepWork},
    simulate::{self, Arrival, Summary, Workload},
};
use proptest::prelude::*;

/// Models of the sizes and kinds the name parser knows: dense and mixture of experts, hybrid and
/// transformer (grouped-query and latent attention, architectures known and not), from 0.6B to 671B.
const MODELS: [&str; 11] = [
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3.5-9B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3.5-35B-A3B",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen3-235B-A22B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "google/gemma-3-27b-it",
    "deepseek-ai/DeepSeek-R1",
    "zai-org/GLM-4.5-Air",
    "MiniMaxAI/MiniMax-M2",
];

/// An engine command line: engine, model, FP8 weights, GPU, tensor-parallel size and flags.
#[derive(Debug, Clone)]
struct Line {
    sglang: bool,
    model: &'static str,
    fp8: bool,
    gpu: &'static str,
    tp: u32,
    kv_fp8: bool,
    prefix_caching: bool,
    mode: Option<&'static str>,
    eager: bool,
    max_seqs: Option<usize>,
}

impl Line {
    fn text(&self) -> String {
        let model = if self.fp8 { format!("{}-FP8", self.model) } else { self.model.to_owned() };
        let mut words = if self.sglang {
            vec![format!("sglang serve --model-path {model} --tp-size {}", self.tp)]
        } else {
            vec![format!("vllm serve {model} --tensor-parallel-size {}", self.tp)]
        };
        let context = if self.sglang { "--context-length" } else { "--max-model-len" };
        words.push(format!("--sim-gpu {} {context} 8192", self.gpu));
        if self.kv_fp8 {
            words.push(if self.sglang { "--kv-cache-dtype fp8_e4m3" } else { "--kv-cache-dtype fp8" }.into());
        }
        // SGLang's radix cache is on unless turned off; vLLM leaves a hybrid model's off unless asked.
        match (self.sglang, self.prefix_caching) {
            (true, false) => words.push("--disable-radix-cache".into()),
            (false, true) => words.push("--enable-prefix-caching".into()),
            _ => {}
        }
        if let Some(seqs) = self.max_seqs {
            words.push(format!("{} {seqs}", if self.sglang { "--max-running-requests" } else { "--max-num-seqs" }));
        }
        if !self.sglang
            && let Some(mode) = self.mode
        {
            words.push(format!("--performance-mode {mode}"));
        }
        if self.eager {
            words.push(if self.sglang { "--disable-cuda-graph" } else { "--enforce-eager" }.into());
        }
        words.join(" ")
    }

    /// The engine this line starts, or `None` where the model does not fit.
    fn engine(&self) -> Option<Scheduler> {
        let args: Vec<String> = self.text().split_whitespace().map(String::from).collect();
        Scheduler::from_config(&parse_command_line_with_gpu(&args, None).expect("a valid command line")).ok()
    }

    fn cost(&self) -> Option<CostModel> {
        self.engine().map(|e| *e.cost())
    }
}

fn line() -> impl Strategy<Value = Line> {
    (
        (any::<bool>(), 0..MODELS.len(), any::<bool>(), prop_oneof![Just("H100"), Just("H200")], 0..4u32),
        (
            any::<bool>(),
            any::<bool>(),
            prop_oneof![Just(None), Just(Some("throughput")), Just(Some("interactivity"))],
            any::<bool>(),
            prop_oneof![Just(None), Just(Some(16)), Just(Some(256)), Just(Some(1024))],
        ),
    )
        .prop_map(|((sglang, model, fp8, gpu, tp), (kv_fp8, prefix_caching, mode, eager, max_seqs))| Line {
            sglang,
            model: MODELS[model],
            fp8,
            gpu,
            tp: 1 << tp,
            kv_fp8,
            prefix_caching,
            mode,
            eager,
            max_seqs,
        })
}

fn work() -> impl Strategy<Value = StepWork> {
    (0..16_384usize, 0..1024usize, 0..4096usize).prop_map(|(prefill, decodes, mean_context)| StepWork {
        prefill_tokens: prefill,
        prefill_attention_pairs: (prefill * prefill / 2) as f64,
        decode_tokens: decodes,
        decode_context_tokens: decodes * mean_context,
        draft_tokens: 0,
        // As a sliding window of 1024 tokens takes them.
        prefill_window_pairs: (prefill * prefill.min(1024)) as f64,
        decode_window_tokens: decodes * mean_context.min(1024),
    })
}

fn seconds(cost: &CostModel, work: &StepWork) -> f64 {
    cost.step_time(work).as_secs_f64()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_step_takes_longer_for_more_work(line in line(), work in work(), more in 1..512usize, pick in 0..3u8) {
        let Some(cost) = line.cost() else { return Ok(()) };
        let mut bigger = work;
        match pick {
            0 => {
                bigger.prefill_tokens += more;
                bigger.prefill_attention_pairs += (more * (work.prefill_tokens + more)) as f64;
            }
            1 => {
                bigger.decode_tokens += more;
                bigger.decode_context_tokens += more * 512;
            }
            _ => bigger.decode_context_tokens += more * 1024,
        }
        let (t, longer) = (seconds(&cost, &work), seconds(&cost, &bigger));
        prop_assert!(t.is_finite() && t > 0.0, "{}: {t}", line.text());
        prop_assert!(longer >= t, "{}: {work:?} {t} s, {bigger:?} {longer} s", line.text());
    }

    #[test]
    fn faster_or_more_hardware_and_fp8_weights_never_slow_a_step(line in line(), work in work()) {
        let Some(cost) = line.cost() else { return Ok(()) };
        let t = seconds(&cost, &work);
        let faster = [
            Line { gpu: "H200", ..line.clone() },
            Line { tp: line.tp * 2, ..line.clone() },
            Line { fp8: true, ..line.clone() },
        ];
        for other in faster {
            if let Some(other_cost) = other.cost() {
                let u = seconds(&other_cost, &work);
                prop_assert!(u <= t * (1.0 + 1e-12), "{} {u} s against {} {t} s", other.text(), line.text());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_configuration_outruns_its_gpus_compute_or_memory(line in line(), concurrency in 1..128usize) {
        let Some(_) = line.engine() else { return Ok(()) };
        let args: Vec<String> = line.text().split_whitespace().map(String::from).collect();
        let config = parse_command_line_with_gpu(&args, None).expect("a valid command line");
        let items = simulate::random(2 * concurrency, 512, 64, 11);
        let timings = simulate::simulate(&config, &Workload { items, arrival: Arrival::Closed { concurrency } })
            .expect("it started above");
        let summary = Summary::of(&timings);
        prop_assert_eq!(summary.requests, 2 * concurrency);
        let shape = config.model_shape();
        let peak = if shape.fp8_compute { config.gpu.fp8_flops } else { config.gpu.bf16_flops };
        // Every token served passes through the active weights once: two FLOPs a parameter.
        let flops = summary.total_token_throughput * 2.0 * shape.active_params;
        prop_assert!(
            summary.total_token_throughput.is_finite() && flops <= peak * f64::from(line.tp),
            "{}: {:.0} tok/s is {:.0} TFLOP/s on {} GPUs of {:.0}",
            line.text(), summary.total_token_throughput, flops / 1e12, line.tp, peak / 1e12
        );
        // A sequence decodes a token a step, and a step reads at least the active weights.
        let least_read = shape.active_params * shape.bytes_per_param / (config.gpu.bandwidth * f64::from(line.tp));
        prop_assert!(
            summary.mean_tpot >= least_read,
            "{}: a token every {:.2} ms, where reading the weights takes {:.2} ms",
            line.text(), summary.mean_tpot * 1e3, least_read * 1e3
        );
    }
}
