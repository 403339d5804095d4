//! Behaviour under load, in virtual time: batching, queueing, prefix caching, speculative decoding, startup failures.

use benchfleet_sim::{
    Scheduler, StartupError, parse_command_line_with_gpu,
    pipeline::{Pipeline, Stepper},
    profile::{Graphs, StepWork},
    simulate::{self, Arrival, RequestTiming, Summary, WorkItem, Workload, block_hashes},
};

fn config(line: &str) -> benchfleet_sim::SimConfig {
    let args: Vec<String> = line.split_whitespace().map(String::from).collect();
    parse_command_line_with_gpu(&args, None).expect("valid command line")
}

/// A closed loop of `concurrency` clients, each sending 4 requests of 512 prompt and 128 output tokens.
fn closed_loop(line: &str, concurrency: usize) -> Summary {
    let items = simulate::random(concurrency * 4, 512, 128, 7);
    let workload = Workload { items, arrival: Arrival::Closed { concurrency } };
    Summary::of(&simulate::simulate(&config(line), &workload).expect("fits"))
}

const ENGINE: &str = "vllm serve Qwen/Qwen3.5-9B --max-model-len 8192";

#[test]
fn throughput_rises_then_saturates_and_tpot_grows_with_the_batch() {
    let runs: Vec<Summary> = [1, 8, 64, 256].into_iter().map(|c| closed_loop(ENGINE, c)).collect();
    let tps: Vec<f64> = runs.iter().map(|s| s.total_token_throughput).collect();
    assert!(tps.windows(2).all(|w| w[1] > w[0]), "throughput rises with concurrency: {tps:?}");
    let gains: Vec<f64> = tps.windows(2).map(|w| w[1] / w[0]).collect();
    assert!(gains[2] < gains[0] && gains[2] < 2.5, "and saturates: gains {gains:?}");
    let tpot: Vec<f64> = runs.iter().map(|s| s.mean_tpot).collect();
    assert!(tpot.windows(2).all(|w| w[1] > w[0]), "TPOT grows with the batch: {tpot:?}");
}

#[test]
fn max_num_seqs_caps_the_batch_and_queues_requests() {
    let free = closed_loop(ENGINE, 64);
    let capped = closed_loop(&format!("{ENGINE} --max-num-seqs 8"), 64);
    assert!(capped.mean_ttft > 4.0 * free.mean_ttft, "queueing: {} vs {}", capped.mean_ttft, free.mean_ttft);
    assert!(capped.total_token_throughput < free.total_token_throughput);
    // With 8 running, a step decodes at most 8 tokens: TPOT is that of a small batch.
    assert!(capped.mean_tpot < free.mean_tpot);
}

#[test]
fn prefix_caching_skips_shared_prefixes_only_and_reset_makes_it_cold() {
    let shared = Workload {
        items: simulate::shared_prefix(64, 4, 2048, 64, 32),
        arrival: Arrival::Rate { rate: 16.0, max_concurrency: None },
    };
    let random = Workload { items: simulate::random(64, 2112, 32, 3), arrival: shared.arrival };
    let run = |engine: &str, flags: &str, workload: &Workload| {
        Summary::of(&simulate::simulate(&config(&format!("{engine} {flags}")), workload).expect("fits"))
    };
    // A transformer skips the shared prefixes.
    let transformer = "vllm serve Qwen/Qwen3-8B --max-model-len 8192";
    let (on, off) = (run(transformer, "", &shared), run(transformer, "--no-enable-prefix-caching", &shared));
    assert!(on.mean_ttft < 0.7 * off.mean_ttft, "shared prefixes: {} vs {}", on.mean_ttft, off.mean_ttft);
    // Qwen3.5 needs the recurrent state where a hit ends, which vLLM saved only where each prompt's
    // step ended, at its 2112th token: no prompt finds one within its 2048 shared tokens.
    let (on, off) = (run(ENGINE, "--enable-prefix-caching", &shared), run(ENGINE, "", &shared));
    assert!(on.mean_ttft >= off.mean_ttft, "a hybrid's shared prefixes: {} vs {}", on.mean_ttft, off.mean_ttft);
    // Nothing to find in random prompts; on a hybrid model vLLM's cache still saves each prompt's
    // recurrent state as it goes, which costs a little (a few percent on prompts this long).
    let (on, off) =
        (run(ENGINE, "--enable-prefix-caching", &random), run(ENGINE, "--no-enable-prefix-caching", &random));
    assert!(on.duration > off.duration && on.duration < 1.1 * off.duration, "random prompts: {on:?} vs {off:?}");
    assert_eq!(run(ENGINE, "", &random), off, "vLLM leaves the cache off for a hybrid model unless asked");

    let warmed = |engine: &str| {
        let mut engine = Scheduler::from_config(&config(engine)).expect("fits");
        let cold = Summary::of(&simulate::simulate_on(&mut engine, &random));
        let warm = Summary::of(&simulate::simulate_on(&mut engine, &random));
        let hits = engine.counters().prefix_cache_hits;
        engine.reset_prefix_cache();
        let again = Summary::of(&simulate::simulate_on(&mut engine, &random));
        (cold, warm, hits, again)
    };
    let (cold, warm, hits, again) = warmed(transformer);
    assert!(warm.mean_ttft < 0.5 * cold.mean_ttft, "the same prompts again: {} vs {}", warm.mean_ttft, cold.mean_ttft);
    assert!(hits > 0);
    assert_eq!(again, cold, "cold again after the reset");
    // The same 2112-token prompts again find nothing on Qwen3.5: a hit leaves the last token to
    // compute, so it can end at 1584 at most, where no state was saved.
    let (_, _, hits, _) = warmed(&format!("{ENGINE} --enable-prefix-caching"));
    assert_eq!(hits, 0);
}

#[test]
fn speculative_decoding_helps_at_low_load_and_hurts_at_high_load() {
    let mtp = |k: usize| format!("{ENGINE} --speculative-config={{\"method\":\"mtp\",\"num_speculative_tokens\":{k}}}");
    // One draft token at low load, as the latency study ran it: fewer steps per token.
    let (plain_1, spec_1) = (closed_loop(ENGINE, 1), closed_loop(&mtp(1), 1));
    assert!(spec_1.mean_tpot < 0.97 * plain_1.mean_tpot, "{} vs {}", spec_1.mean_tpot, plain_1.mean_tpot);
    // Four at high load: the verify tokens' work outweighs the tokens accepted.
    let (plain_256, spec_256) = (closed_loop(ENGINE, 256), closed_loop(&mtp(4), 256));
    assert!(spec_256.total_token_throughput < plain_256.total_token_throughput);
}

#[test]
fn runs_repeat_exactly_for_a_seed() {
    let spec = format!("{ENGINE} --speculative-config={{\"method\":\"mtp\",\"num_speculative_tokens\":2}}");
    let workload = Workload {
        items: simulate::sharegpt_like(200, 1),
        arrival: Arrival::Rate { rate: 50.0, max_concurrency: None },
    };
    let first = simulate::simulate(&config(&spec), &workload).expect("fits");
    assert_eq!(first, simulate::simulate(&config(&spec), &workload).expect("fits"));
}

/// `workload` on a fresh engine of `line`: its timings, and when each step ended.
fn with_step_ends(line: &str, workload: &Workload) -> (Vec<RequestTiming>, Vec<f64>) {
    let mut engine = Scheduler::from_config(&config(line)).expect("fits");
    let (mut now, mut step_ends) = (0.0, Vec::new());
    let timings = simulate::simulate_observed(&mut engine, workload, |step| {
        now += step.duration.as_secs_f64();
        step_ends.push(now);
    });
    (timings, step_ends)
}

/// The steps that ended after a request was sent, up to the one that gave its first token.
fn steps_waited(t: &RequestTiming, step_ends: &[f64]) -> usize {
    step_ends.iter().filter(|&&end| end > t.sent && end <= t.first_token + 1e-12).count()
}

/// The engines plan a step as they launch the one before it (vLLM's batch queue, SGLang's overlap
/// loop): a request that reaches a busy engine while a step runs is prefilled in the step after
/// the next, and one sent as a step ends, into the slot of a request that step ended, in the one
/// after that. An idle engine takes a request at once.
#[test]
fn a_busy_engine_plans_a_step_ahead_and_an_idle_one_at_once() {
    // Two clients: the first request decodes 64 tokens; the second ends after 2, and its client
    // sends the third at that instant, while the first still decodes.
    let mut items = simulate::random(3, 512, 2, 3);
    items[0].output_tokens = 64;
    let (t, step_ends) = with_step_ends(ENGINE, &Workload { items, arrival: Arrival::Closed { concurrency: 2 } });
    // The first two reach the idle engine together and are prefilled in its first step.
    assert_eq!((t[0].first_token, t[1].first_token), (step_ends[0], step_ends[0]));
    assert_eq!(t[1].completed, step_ends[1], "a first token, then one decode");
    assert_eq!(t[2].sent, t[1].completed, "sent as its client's slot freed");
    assert_eq!(steps_waited(&t[2], &step_ends), 3, "prefilled in the fifth step: {step_ends:?}");

    // At 1000 requests a second the second arrives 1 ms in, while the first one's prefill runs.
    let mut items = simulate::random(2, 512, 64, 3);
    items[1].output_tokens = 2;
    let (t, step_ends) =
        with_step_ends(ENGINE, &Workload { items, arrival: Arrival::Rate { rate: 1000.0, max_concurrency: None } });
    assert_eq!(t[0].first_token, step_ends[0], "the idle engine took the first at once");
    assert!(t[1].sent < step_ends[0]);
    assert_eq!(steps_waited(&t[1], &step_ends), 3, "prefilled in the third step: {step_ends:?}");
}

#[test]
fn a_full_kv_cache_makes_requests_wait() {
    // 27% of an H100 leaves about 0.7 GiB of KV cache: some 60k tokens, so 64 prompts of 8000 cannot all run.
    let small = config("vllm serve Qwen/Qwen3.5-9B --max-model-len 8192 --gpu-memory-utilization 0.27 --sim-gpu H100");
    let engine = Scheduler::from_config(&small).expect("fits");
    let capacity = engine.kv_capacity_tokens();
    assert!((8192..200_000).contains(&capacity), "{capacity}");
    let workload = Workload { items: simulate::random(64, 8000, 16, 1), arrival: Arrival::Closed { concurrency: 64 } };
    let timings = simulate::simulate(&small, &workload).expect("fits");
    let last_first_token = timings.iter().map(|t| t.first_token).fold(0.0, f64::max);
    let first_done = timings.iter().map(|t| t.completed).fold(f64::INFINITY, f64::min);
    assert!(last_first_token > first_done, "the last request starts after the first one ends");
}

#[test]
fn configurations_that_cannot_fit_fail_at_startup_like_the_engine() {
    let kv = Scheduler::from_config(&config(
        "vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 --gpu-memory-utilization 0.27 --max-model-len 131072",
    ))
    .expect_err("kv cache too small");
    assert!(matches!(kv, StartupError::KvCacheTooSmall { max_model_len: 131072, .. }), "{kv:?}");
    let message = kv.to_string();
    assert!(message.starts_with("ValueError: To serve at least one request with the models's max seq len (131072)"));
    assert!(message.contains("Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"), "{message}");

    let weights = Scheduler::from_config(&config("vllm serve Qwen/Qwen3-235B-A22B")).expect_err("470 GB on one H200");
    assert!(weights.to_string().starts_with("torch.OutOfMemoryError: CUDA out of memory"), "{weights}");
    // A 4-bit checkpoint of a model that does not fit one H100 in BF16 does; gpt-oss-120b's
    // MXFP4 experts fit one too.
    assert!(Scheduler::from_config(&config("vllm serve Qwen/Qwen2.5-72B-Instruct --sim-gpu H100")).is_err());
    assert!(Scheduler::from_config(&config("vllm serve Qwen/Qwen2.5-72B-Instruct-AWQ --sim-gpu H100")).is_ok());
    assert!(Scheduler::from_config(&config("vllm serve openai/gpt-oss-120b --sim-gpu H100")).is_ok());
    // The same model fits on eight GPUs, or in FP8 on four.
    assert!(Scheduler::from_config(&config("vllm serve Qwen/Qwen3-235B-A22B --tensor-parallel-size 8")).is_ok());
    assert!(Scheduler::from_config(&config("vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 4")).is_ok());
}

#[test]
fn the_cache_is_sized_as_told_where_the_engines_take_a_size() {
    let gib = 1024.0 * 1024.0 * 1024.0;
    let capacity = |line: &str| Scheduler::from_config(&config(line)).expect("fits").kv_capacity_tokens();
    let per_token = |line: &str| Scheduler::from_config(&config(line)).expect("fits").cost().kv_bytes_per_token;
    // vLLM's `--kv-cache-memory-bytes`: the cache's bytes per GPU, whatever the memory fraction.
    let h100 = "vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 --max-model-len 8192";
    for (flags, gpus) in [("--kv-cache-memory-bytes 4G", 1.0), ("--kv-cache-memory-bytes 4G -tp 2", 2.0)] {
        let line = format!("{h100} {flags} --gpu-memory-utilization 0.5");
        let tokens = capacity(&line) as f64;
        let expected = 4.0 * gib * gpus / per_token(&line);
        assert!((tokens / expected - 1.0).abs() < 0.01, "{flags}: {tokens} tokens, {expected} expected");
    }
    // More than the GPU holds beside the weights is CUDA's out of memory, as vLLM allocates it.
    let err = Scheduler::from_config(&config(&format!("{h100} --kv-cache-memory-bytes 70G"))).expect_err("too much");
    assert!(matches!(err, StartupError::KvCacheDoesNotFit { gpus: 1, .. }), "{err:?}");
    assert!(err.to_string().starts_with("torch.OutOfMemoryError: CUDA out of memory"), "{err}");

    // SGLang's `--max-total-tokens` caps its token pool; a pool smaller than the context still
    // starts, and takes requests of up to the pool's tokens.
    let sglang = "sglang serve --model-path Qwen/Qwen3.5-9B --sim-gpu H100 --context-length 32768";
    let free = Scheduler::from_config(&config(sglang)).expect("fits");
    assert!(free.max_request_tokens() >= 32768, "{}", free.max_request_tokens());
    let capped = Scheduler::from_config(&config(&format!("{sglang} --max-total-tokens 20000"))).expect("starts");
    assert_eq!(capped.max_request_tokens(), 19_999);
    assert!(capped.kv_capacity_tokens() < free.kv_capacity_tokens());
    // One request of the pool's size runs; a longer one never fits and ends at once.
    let run = |prompt: usize| {
        let items = simulate::random(1, prompt, 16, 3);
        let workload = Workload { items, arrival: Arrival::Closed { concurrency: 1 } };
        simulate::simulate(&config(&format!("{sglang} --max-total-tokens 20000")), &workload).expect("starts")[0]
    };
    assert_eq!(run(19_000).output_tokens, 16);
    // A pool that leaves no prompt room (SGLang's `max_req_input_len`, 6 tokens fewer) does not start.
    for tokens in [0, 6] {
        let line = format!("{sglang} --max-total-tokens {tokens}");
        let err = Scheduler::from_config(&config(&line)).expect_err("no room");
        assert!(err.to_string().starts_with("RuntimeError: Not enough memory"), "{tokens}: {err}");
    }
    assert!(run(25_000).completed == run(25_000).sent, "{:?}", run(25_000));
}

#[test]
fn a_transformers_cache_holds_the_tokens_its_architecture_gives() {
    // vLLM's log for Qwen3-235B-A22B-FP8 on four H100s: "Available KV cache memory: 8.11 GiB",
    // "GPU KV cache size: 178,880 tokens". Each GPU holds one of its 4 KV heads in each of 94 layers.
    let line = "vllm serve Qwen/Qwen3-235B-A22B-FP8 --sim-gpu H100 --tensor-parallel-size 4 \
                --max-model-len 32768 --kv-cache-memory-bytes 8708046192";
    let tokens = Scheduler::from_config(&config(line)).expect("fits").kv_capacity_tokens() as f64;
    assert!((tokens / 178_880.0 - 1.0).abs() < 0.015, "{tokens} tokens against vLLM's 178,880");
    // Llama-3.1-8B's 128 KiB a token: 4 GiB hold 32768 tokens, not a whole 131072-token context.
    let llama = "vllm serve meta-llama/Llama-3.1-8B-Instruct --sim-gpu H100 --kv-cache-memory-bytes 4G";
    let engine = Scheduler::from_config(&config(&format!("{llama} --max-model-len 32000"))).expect("fits");
    assert_eq!(engine.kv_capacity_tokens(), 32768);
    let err = Scheduler::from_config(&config(&format!("{llama} --max-model-len 131072"))).expect_err("too small");
    assert!(matches!(err, StartupError::KvCacheTooSmall { max_model_len: 131072, .. }), "{err:?}");
    // DeepSeek-R1 is 671B of FP8 weights, not the 8B a name without a size would be: it does
    // not fit one H200, and on eight each holds the whole latent cache, 61 x 576 x 2 bytes a token.
    let r1 = "vllm serve deepseek-ai/DeepSeek-R1 --sim-gpu H200 --max-model-len 32768";
    let err = Scheduler::from_config(&config(r1)).expect_err("671 GB on one H200");
    assert!(matches!(err, StartupError::WeightsDoNotFit { .. }), "{err:?}");
    let engine = Scheduler::from_config(&config(&format!("{r1} -tp 8 --kv-cache-memory-bytes 20G"))).expect("fits");
    let tokens = engine.kv_capacity_tokens() as f64;
    let expected = 20.0 * 1024.0 * 1024.0 * 1024.0 / (61.0 * 576.0 * 2.0);
    assert!((tokens / expected - 1.0).abs() < 0.001, "{tokens} tokens against {expected}");
}

#[test]
fn a_sliding_window_model_holds_its_window_beside_its_context() {
    // Gemma 3 27B's sequences of 4016 tokens hold 80 KiB a token in its 10 whole-context layers
    // and 1040 tokens of 416 KiB in its 52 windowed ones: 8 GiB runs 11 of them at once. (Every
    // layer keeping the whole context would run 4; the rule by its size, 8.)
    let line = "vllm serve google/gemma-3-27b-it --sim-gpu H100 --max-model-len 8192 --kv-cache-memory-bytes 8G";
    let mut engine = Scheduler::from_config(&config(line)).expect("fits");
    let workload = Workload { items: simulate::random(32, 4000, 16, 5), arrival: Arrival::Closed { concurrency: 32 } };
    let (mut most, mut first) = (0, None);
    simulate::simulate_observed(&mut engine, &workload, |step| {
        most = most.max(step.emissions.len());
        first.get_or_insert(step.work);
    });
    assert_eq!(most, 11);
    // A prefill chunk's windowed layers attend to at most the last 1024 tokens: the first 8192
    // tokens' chunk (two prompts of 4000 and 192 of a third) pairs each query with its window.
    let first = first.expect("a step");
    let expected = 2.0 * (1024.0 * 1024.0 / 2.0 + 2976.0 * 1024.0) + 192.0 * 192.0 / 2.0;
    assert_eq!(first.prefill_window_pairs, expected, "{first:?}");
}

#[test]
fn sglang_leaves_room_by_its_rule_for_what_its_prefills_graphs_and_drafts_take() {
    let sglang = "sglang serve --model-path Qwen/Qwen3.5-9B --context-length 8192";
    let fraction = |flags: &str| benchfleet_sim::default_memory_fraction(&config(&format!("{sglang} {flags}")));
    // SGLang 0.5.9 reserves at least 10 GB beside the weights and the pool on these GPUs, then
    // takes 0.95 x 0.958 of the rest for Qwen3.5's vision encoder.
    let vision = 0.95 * (1.0 - 0.1 * (27.0 * 1152.0 * 1152.0 / (24.0 * 1024.0 * 1024.0) - 1.0));
    let mib = |gpu: &str| benchfleet_sim::profile::gpu(gpu).expect("known").memory / (1024.0 * 1024.0);
    let expected = |gpu: &str, reserved: f64| ((mib(gpu) - reserved) / mib(gpu) * 1000.0).round() / 1000.0 * vision;
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // 512 + 8192 x 1.5 + 256 x 2 + 128 MB = 13440 MB by default; a 16k chunk adds 12 GB, graphs
    // to 512 sequences half a GB, an MTP draft 2 GB.
    assert!(close(fraction("--sim-gpu H100"), expected("H100", 13440.0)), "{}", fraction("--sim-gpu H100"));
    assert!(close(fraction(""), expected("H200", 13440.0)));
    assert!(close(fraction("--chunked-prefill-size 16384"), expected("H200", 25728.0)));
    assert!(close(fraction("--cuda-graph-max-bs 512"), expected("H200", 13952.0)));
    let nextn = "--speculative-algorithm NEXTN --speculative-num-steps 1";
    assert!(close(fraction(nextn), expected("H200", 13440.0 + 2048.0)));
    // Unchunked, it reserves for its largest prefill batch (16384 tokens); a small chunk, the 10 GB.
    assert!(close(fraction("--chunked-prefill-size -1"), expected("H200", 25728.0)));
    assert!(close(fraction("--chunked-prefill-size 1024"), expected("H200", 10240.0)));
    // Only a model with a vision encoder gives up the factor: a text model none, another vision
    // model's encoder taken as SGLang's baseline ViT-L/14 (0.95).
    let other = |model: &str| {
        let line = format!("sglang serve --model-path {model} --context-length 8192 --cuda-graph-max-bs 256");
        benchfleet_sim::default_memory_fraction(&config(&line))
    };
    assert!(close(other("Qwen/Qwen3-8B"), expected("H200", 13440.0) / vision));
    assert!(close(other("Qwen/Qwen2.5-VL-7B-Instruct"), expected("H200", 13440.0) / vision * 0.95));
    // So a larger chunk leaves a smaller pool, and a fraction given is taken as given.
    let pool = |flags: &str| {
        Scheduler::from_config(&config(&format!("{sglang} --sim-gpu H100 {flags}"))).expect("fits").kv_capacity_tokens()
    };
    assert!(pool("--chunked-prefill-size 16384") < pool(""));
    assert!(pool("--mem-fraction-static 0.9") > pool(""));
    assert_eq!(
        pool("--mem-fraction-static 0.9 --chunked-prefill-size 16384"),
        pool("--mem-fraction-static 0.9"),
        "a fraction given is SGLang's weights and pool, whatever the chunk"
    );
}

#[test]
fn sglang_runs_as_many_requests_as_its_state_pool_holds() {
    // SGLang 0.5.9 keeps a hybrid model's recurrent states in a pool of their own, sized before
    // its KV pool: by default 0.9/1.9 of the memory both share, a running request holding a third
    // of the states with the radix cache on.
    let sglang = "sglang serve --model-path Qwen/Qwen3.5-9B --sim-gpu H100";
    let engine = |flags: &str| Scheduler::from_config(&config(&format!("{sglang} {flags}"))).expect("fits");
    let running = |flags: &str| engine(flags).max_num_seqs();
    let state = engine("").cost().state_bytes();
    let pool_states = |flags: &str| {
        // The states are what the shared memory held less the KV pool left.
        let shared = engine(&format!("--disable-radix-cache --max-running-requests 1 {flags}"));
        let kv = |e: &Scheduler| e.kv_capacity_tokens() as f64 * e.cost().kv_bytes_per_token;
        ((kv(&shared) + state - kv(&engine(flags))) / state).round() as usize
    };
    let default = running("");
    assert!((100..200).contains(&default), "about 140 requests on an H100, got {default}");
    let states = pool_states("");
    assert_eq!(default, states / 3, "{states} states");
    // A larger limit runs no more; a smaller one is taken.
    assert_eq!(running("--max-running-requests 512"), default);
    assert_eq!(running("--max-running-requests 64"), 64);
    // The states' share of the memory, or their number, set the limit, at the KV pool's cost.
    let (more, more_states) = (running("--mamba-full-memory-ratio 2"), pool_states("--mamba-full-memory-ratio 2"));
    assert_eq!(more, more_states / 3);
    // 2/3 of the memory against 0.9/1.9.
    assert!((more_states as f64 / states as f64 - (2.0 / 3.0) / (0.9 / 1.9)).abs() < 0.01, "{more_states}");
    assert!(engine("--mamba-full-memory-ratio 2").kv_capacity_tokens() < engine("").kv_capacity_tokens());
    assert_eq!(running("--max-mamba-cache-size 600"), 200);
    assert_eq!(running("--max-mamba-cache-size 600 --mamba-scheduler-strategy extra_buffer"), 120);
    // Without the radix cache a request holds one state: three times the requests, or the limit
    // given, whose states alone are kept.
    assert_eq!(running("--disable-radix-cache"), states);
    assert_eq!(running("--disable-radix-cache --max-running-requests 300"), 300);
    assert!(
        engine("--disable-radix-cache --max-running-requests 300").kv_capacity_tokens()
            > engine("--disable-radix-cache").kv_capacity_tokens()
    );
    // States of 16-bit matrices are about half the size: twice the requests, and less to move a step.
    let half = engine("--mamba-ssm-dtype bfloat16");
    let ratio = half.cost().state_bytes() / state;
    assert!((ratio - 0.5115).abs() < 1e-3, "{ratio}");
    assert!(half.max_num_seqs() as f64 > 1.9 * default as f64, "{} against {default}", half.max_num_seqs());
    assert_eq!(running("--mamba-ssm-dtype float32"), default);
    let decode = StepWork { decode_tokens: 100, decode_context_tokens: 100 * 1000, ..Default::default() };
    assert!(half.cost().step_parts(&decode).attention < engine("").cost().step_parts(&decode).attention);
    // More memory, more states: an H200 runs more.
    let h200 = Scheduler::from_config(&config("sglang serve --model-path Qwen/Qwen3.5-9B --sim-gpu H200"))
        .expect("fits")
        .max_num_seqs();
    assert!(h200 > default, "{h200} on an H200 against {default}");
    // Speculative decoding runs 48 unless told, its draft tokens' states taken from the KV pool.
    let nextn = "--speculative-algorithm NEXTN --speculative-num-steps 3";
    assert_eq!(running(nextn), 48);
    assert!(
        engine(nextn).kv_capacity_tokens() < engine(&format!("{nextn} --max-running-requests 8")).kv_capacity_tokens()
    );
    // A transformer has no states: 512 requests a context of its pool, within 2048-4096.
    let transformer = |flags: &str| {
        Scheduler::from_config(&config(&format!("sglang serve --model-path Qwen/Qwen3-8B --sim-gpu H100 {flags}")))
            .expect("fits")
            .max_num_seqs()
    };
    assert_eq!(transformer(""), 4096);
    assert_eq!(transformer("--mem-fraction-static 0.22 --context-length 131072"), 2048);
    assert_eq!(transformer("--max-running-requests 8"), 8);
    // vLLM keeps the states in its KV cache, and runs what it is told.
    let vllm = Scheduler::from_config(&config("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100")).expect("fits");
    assert_eq!(vllm.max_num_seqs(), 1024);

    // Too few states for a request, or too many for the memory, and SGLang does not start.
    match Scheduler::from_config(&config(&format!("{sglang} --max-mamba-cache-size 2"))) {
        Err(err @ StartupError::StatesDoNotFit { states: 2, per_request: 3, .. }) => {
            assert!(err.to_string().contains("--max-mamba-cache-size"), "{err}")
        }
        other => panic!("{other:?}"),
    }
    for states in ["100000", "18446744073709551615"] {
        assert!(matches!(
            Scheduler::from_config(&config(&format!("{sglang} --max-mamba-cache-size {states}"))),
            Err(StartupError::KvCacheTooSmall { .. })
        ));
    }
    for ratio in ["0", "-1", "nan", "inf"] {
        let line = format!("{sglang} --mamba-full-memory-ratio {ratio}");
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        let err = parse_command_line_with_gpu(&args, None).expect_err(&line).to_string();
        assert!(err.contains("--mamba-full-memory-ratio") && err.contains("positive"), "{line}: {err}");
    }
}

#[test]
fn values_the_engine_refuses_fail_at_startup_in_its_words() {
    let refused = |line: &str, visible: Option<usize>| {
        let config = benchfleet_sim::SimConfig { visible_gpus: visible, ..config(line) };
        match Scheduler::from_config(&config) {
            Err(StartupError::Refused(why)) => why,
            other => panic!("{line} on {visible:?} GPUs: {other:?}"),
        }
    };
    let vllm = "vllm serve Qwen/Qwen3.5-9B";
    // vLLM's configurations are pydantic dataclasses: its checks fail as validation errors.
    let world = refused(&format!("{vllm} --tensor-parallel-size 2"), Some(1));
    let header = "pydantic_core._pydantic_core.ValidationError: 1 validation error for";
    let why = "Value error, World size (2) is larger than the number of available GPUs (1) in this node.";
    assert!(world.starts_with(&format!("{header} ParallelConfig\n  {why}")), "{world}");
    let sglang = refused("sglang serve --model-path Qwen/Qwen3.5-9B --tp-size 4", Some(2));
    assert!(sglang.contains("invalid device ordinal (the parallel sizes need 4 GPUs, 2 visible)"), "{sglang}");
    // Pipeline and data parallel ranks take GPUs too; SGLang's DP attention runs on its TP GPUs.
    let world = refused(&format!("{vllm} -tp 2 --pipeline-parallel-size 2"), Some(2));
    assert!(world.contains("World size (4) is larger than the number of available GPUs (2)"), "{world}");
    assert!(refused(&format!("{vllm} -dp 2"), Some(1)).contains("World size (2)"));
    let dp = |flags: &str| benchfleet_sim::SimConfig {
        visible_gpus: Some(2),
        ..config(&format!("sglang serve --model-path Qwen/Qwen3.5-9B --tp 2 --dp-size 2 {flags}"))
    };
    assert!(Scheduler::from_config(&dp("--enable-dp-attention")).is_ok());
    assert!(matches!(Scheduler::from_config(&dp("")), Err(StartupError::Refused(_))));
    assert_eq!(refused(vllm, Some(0)), "RuntimeError: No CUDA GPUs are available");
    // vLLM caches a hybrid model's prefixes in its `align` mode, which needs chunked prefill.
    let unchunked = "--max-model-len 8192 --no-enable-chunked-prefill";
    assert_eq!(
        refused(&format!("{vllm} {unchunked} --enable-prefix-caching"), None),
        "AssertionError: Chunked prefill is required for mamba cache mode 'align'."
    );
    // And a step that holds a whole block, 528 tokens on Qwen3.5-9B.
    assert_eq!(
        refused(&format!("{vllm} --enable-prefix-caching --max-num-batched-tokens 512 --max-num-seqs 256"), None),
        "AssertionError: In Mamba cache align mode, block_size (528) must be <= max_num_batched_tokens (512)."
    );
    for starts in [
        format!("{vllm} {unchunked}"),
        format!("vllm serve Qwen/Qwen3-8B {unchunked} --enable-prefix-caching"),
        format!("{vllm} --max-num-batched-tokens 512 --max-num-seqs 256"),
        format!("{vllm} --enable-prefix-caching --max-num-batched-tokens 528 --max-num-seqs 256"),
    ] {
        assert!(Scheduler::from_config(&config(&starts)).is_ok(), "{starts}");
    }
    assert!(
        refused(&format!("{vllm} --tensor-parallel-size 0"), None)
            .contains("--tensor-parallel-size must be at least 1")
    );
    // vLLM's budget must hold a decode of every sequence given: its default (8192) too. Its
    // default sequence limit follows a smaller budget instead.
    for (flags, budget, seqs) in
        [("--max-num-batched-tokens 512 --max-num-seqs 1024", 512, 1024), ("--max-num-seqs 16384", 8192, 16384)]
    {
        let why = format!("max_num_batched_tokens ({budget}) must be greater than or equal to max_num_seqs ({seqs}).");
        assert_eq!(
            refused(&format!("{vllm} {flags}"), None),
            format!("{header} SchedulerConfig\n  Value error, {why}")
        );
    }
    let small = config(&format!("{vllm} --max-num-batched-tokens 512"));
    assert_eq!((small.max_num_batched_tokens, small.max_num_seqs), (512, 512));
    assert!(Scheduler::from_config(&small).is_ok());
    // Unchunked, vLLM's prefill needs a budget of a whole context: its default rises to one.
    let unchunked = config(&format!("{vllm} --no-enable-chunked-prefill"));
    assert_eq!(unchunked.max_num_batched_tokens, 32768);
    assert!(Scheduler::from_config(&unchunked).is_ok());
    let short = refused(&format!("{vllm} --no-enable-chunked-prefill --max-num-batched-tokens 8k"), None);
    assert!(short.contains("Value error, max_num_batched_tokens (8000) is smaller than max_model_len (32768)."));
    // Asynchronous scheduling asked for beside a drafting method it cannot run with.
    let ngram = r#"--speculative-config={"method":"ngram","num_speculative_tokens":3}"#;
    assert!(Scheduler::from_config(&config(&format!("{vllm} {ngram}"))).is_ok());
    let async_ngram = refused(&format!("{vllm} {ngram} --async-scheduling"), None);
    assert!(async_ngram.contains("async scheduling is only supported with EAGLE/MTP/Draft Model"), "{async_ngram}");
    // CUDA graph sizes given two ways must agree.
    let graphs = refused(&format!("{vllm} --max-cudagraph-capture-size 64 --cudagraph-capture-sizes 8 16 32"), None);
    assert!(
        graphs.contains("VllmConfig\n  Value error, customized max_cudagraph_capture_size(=64) should be consistent"),
        "{graphs}"
    );
    let memory = refused(&format!("{vllm} --gpu-memory-utilization 1.5"), None);
    assert!(memory.ends_with("CacheConfig\n  Value error, GPU memory utilization must be less than 1.0. Got 1.5."));
    // SGLang raises plain errors.
    let sglang = refused("sglang serve --model-path m --mem-fraction-static 2", None);
    assert!(
        sglang.ends_with(
            "server_args.py\", in __post_init__\nValueError: --mem-fraction-static must be above 0 and at most 1, got 2"
        ),
        "{sglang}"
    );
    for (line, flag) in [
        (format!("{vllm} --gpu-memory-utilization 0"), "--gpu-memory-utilization must be above 0"),
        (format!("{vllm} --gpu-memory-utilization NaN"), "--gpu-memory-utilization must be above 0"),
        (format!("{vllm} --max-num-seqs 0"), "--max-num-seqs must be at least 1"),
        (
            "sglang serve --model-path m --max-running-requests 0".to_owned(),
            "--max-running-requests must be at least 1",
        ),
        (
            "sglang serve --model-path m --chunked-prefill-size 0".to_owned(),
            "--chunked-prefill-size must be at least 1",
        ),
        (format!("{vllm} --max-model-len 0"), "max_model_len must be at least 1"),
    ] {
        assert!(refused(&line, None).contains(flag), "{line}");
    }
    // SGLang's checks of its speculative options: EAGLE's draft tokens or top-k without its steps
    // (SGLang chooses the three together), and drafts it cannot run beside DP attention.
    let eagle = "sglang serve --model-path Qwen/Qwen3.5-9B --speculative-algorithm EAGLE";
    for flags in ["--speculative-num-draft-tokens 4", "--speculative-eagle-topk 2"] {
        assert!(refused(&format!("{eagle} {flags}"), None).contains("__post_init__\nAssertionError: "), "{flags}");
        let with_steps = config(&format!("{eagle} {flags} --speculative-num-steps 3"));
        assert!(Scheduler::from_config(&with_steps).is_ok(), "{flags}");
    }
    assert!(Scheduler::from_config(&config(eagle)).is_ok());
    let sglang = "sglang serve --model-path Qwen/Qwen3.5-9B --tp 2 --dp-size 2 --enable-dp-attention";
    for algorithm in ["NGRAM", "STANDALONE"] {
        let line = format!("{sglang} --speculative-algorithm {algorithm}");
        let why = format!(
            "ValueError: Currently {} speculative decoding does not support dp attention.",
            algorithm.to_lowercase()
        );
        assert!(refused(&line, None).ends_with(&format!("__post_init__\n{why}")), "{line}");
    }
    assert!(Scheduler::from_config(&config(&format!("{sglang} --speculative-algorithm NEXTN"))).is_ok());
    // As many GPUs as asked, or more, or an unset list (every GPU of the host): it starts.
    for visible in [Some(2), Some(8), None] {
        let config =
            benchfleet_sim::SimConfig { visible_gpus: visible, ..config(&format!("{vllm} --tensor-parallel-size 2")) };
        assert!(Scheduler::from_config(&config).is_ok(), "{visible:?}");
    }
    // A data-parallel size of 0 is refused as the others are; a context or a draft no memory holds
    // is refused as too large, however large.
    assert!(matches!(
        Pipeline::replicas(&config(&format!("{vllm} -dp 0"))),
        Err(StartupError::Refused(why)) if why.contains("--data-parallel-size must be at least 1")
    ));
    let huge = usize::MAX;
    for flags in [
        format!("--max-model-len {huge}"),
        format!(r#"--speculative-config {{"method":"mtp","num_speculative_tokens":{huge}}}"#),
    ] {
        let startup = Scheduler::from_config(&config(&format!("{vllm} {flags}")));
        assert!(matches!(startup, Err(StartupError::KvCacheTooSmall { .. })), "{flags}: {startup:?}");
    }
    // Unset, the host has 16 (no more replicas are built than a host could run, however many asked).
    assert!(Pipeline::replicas(&config(&format!("{vllm} -dp 16"))).is_ok_and(|r| r.len() == 16));
    for sizes in ["-dp 17", "-dp 4294967295 -tp 4294967295 -pp 4294967295"] {
        let why = refused(&format!("{vllm} {sizes}"), None);
        assert!(why.contains("is larger than the number of available GPUs (16)"), "{why}");
        assert!(matches!(Pipeline::replicas(&config(&format!("{vllm} {sizes}"))), Err(StartupError::Refused(_))));
    }
}

#[test]
fn sglang_without_chunked_prefill_prefills_a_long_prompt_in_one_step() {
    let line = "sglang serve --model-path Qwen/Qwen3.5-9B --context-length 32768";
    let items = simulate::random(1, 20_000, 4, 7);
    let workload = Workload { items, arrival: Arrival::Closed { concurrency: 1 } };
    let steps = |flags: &str| {
        let line = format!("{line} {flags}");
        assert_eq!(config(&line).max_num_batched_tokens, if flags.is_empty() { 8192 } else { 32768 });
        with_step_ends(&line, &workload).1.len()
    };
    // Chunked by 8192 tokens: three prefill steps, then three decodes; unchunked, one prefill.
    assert_eq!((steps(""), steps("--chunked-prefill-size -1")), (6, 4));
}

#[test]
fn speculative_decoding_past_its_failure_batch_fails_every_request_not_yet_running() {
    let mtp = "--speculative-config {\"method\":\"mtp\",\"num_speculative_tokens\":4}";
    let run = |flags: &str| {
        let items = simulate::random(300, 256, 64, 11);
        let workload = Workload { items, arrival: Arrival::Rate { rate: 1000.0, max_concurrency: Some(100) } };
        simulate::simulate(&config(&format!("{ENGINE} {flags}")), &workload).expect("fits")
    };
    // The first wave of 100 passes 90 running: it finishes; everything sent after fails.
    let timings = run(&format!("{mtp} --sim-spec-failure-batch 90"));
    let summary = Summary::of(&timings);
    assert_eq!(timings.len(), 300, "every request ends, failed or not");
    assert!((90..=110).contains(&summary.requests), "about the first wave succeeds: {}", summary.requests);
    assert_eq!(summary.requests + summary.failed, 300);
    assert!(timings.iter().filter(|t| t.failed).all(|t| t.output_tokens == 0), "a failed request emits nothing");
    let first_failure = timings.iter().filter(|t| t.failed).map(|t| t.sent).fold(f64::INFINITY, f64::min);
    let last_success_sent = timings.iter().filter(|t| !t.failed).map(|t| t.sent).fold(0.0, f64::max);
    assert!(last_success_sent <= first_failure + 1e-9, "the failures are the later requests");
    // Below the size, or without speculative decoding, nothing fails.
    assert_eq!(Summary::of(&run(&format!("{mtp} --sim-spec-failure-batch 100"))).failed, 0);
    assert_eq!(Summary::of(&run("--sim-spec-failure-batch 1")).failed, 0);
    assert_eq!(Summary::of(&run(mtp)).failed, 0);
}

#[test]
fn a_hybrid_models_recurrent_state_bounds_the_running_batch() {
    // 30% of an H100 leaves a few GiB for KV: a transformer runs all 512 short requests at once,
    // Qwen3.5's sequences each also hold their recurrent state in the pool, so fewer run.
    let most_running = |line: &str| {
        let mut engine = Scheduler::from_config(&config(line)).expect("fits");
        let (state, capacity) = (engine.cost().state_blocks(), engine.kv_capacity_tokens());
        let workload =
            Workload { items: simulate::random(512, 32, 16, 3), arrival: Arrival::Closed { concurrency: 512 } };
        let mut most = 0;
        simulate::simulate_observed(&mut engine, &workload, |step| most = most.max(step.emissions.len()));
        (most, state, capacity / 16)
    };
    let memory = "--sim-gpu H100 --gpu-memory-utilization 0.3 --max-model-len 4096";
    let (transformer, no_state, _) = most_running(&format!("vllm serve Qwen/Qwen3-8B {memory}"));
    assert_eq!((transformer, no_state), (512, 0));
    let (hybrid, state, blocks) = most_running(&format!("vllm serve Qwen/Qwen3.5-9B {memory}"));
    assert!(state > 0, "a hybrid model's state takes blocks");
    // Each sequence holds its state and one of vLLM's blocks of 528 tokens (33 of 16) for its 32
    // prompt and 16 output tokens.
    assert!(hybrid < 512, "{hybrid} running");
    assert!(
        (blocks / (state + 33) - 1..=blocks / (state + 33)).contains(&hybrid),
        "{hybrid} running in {blocks} blocks, {state} of state each"
    );
    // vLLM keeps the state matrices in FP32, as Qwen3.5's config asks, unless told 16 bits: about
    // half a state, so about twice the sequences in the same blocks.
    let (half, half_state, half_blocks) =
        most_running(&format!("vllm serve Qwen/Qwen3.5-9B {memory} --mamba-ssm-cache-dtype float16"));
    assert_eq!(half_blocks, blocks);
    assert!((half_state as f64 / state as f64 - 0.5115).abs() < 0.02, "{half_state} blocks against {state}");
    assert!(half as f64 > 1.6 * hybrid as f64, "{half} running against {hybrid}");
    for same in ["--mamba-ssm-cache-dtype auto", "--mamba-ssm-cache-dtype float32", "--mamba-cache-dtype float16"] {
        assert_eq!(most_running(&format!("vllm serve Qwen/Qwen3.5-9B {memory} {same}")).0, hybrid, "{same}");
    }
}

#[test]
fn vllm_shares_and_holds_whole_blocks_of_its_block_size() {
    // 64 prompts in 4 groups sharing 80 tokens, then 48 of their own; sent one at a time so each
    // finds its group's prefix cached.
    let workload =
        Workload { items: simulate::shared_prefix(64, 4, 80, 48, 16), arrival: Arrival::Closed { concurrency: 1 } };
    let run = |flags: &str| {
        let line = format!("vllm serve Qwen/Qwen3-8B --sim-gpu H100 --max-model-len 4096 {flags}");
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        simulate::simulate_on(&mut engine, &workload);
        let capacity = engine.kv_capacity_tokens();
        (engine.counters().prefix_cache_hits, capacity)
    };
    // The 60 prompts after each group's first find the shared tokens in whole blocks: 80 in
    // blocks of 16, 64 in blocks of 32 or 64, none in blocks of 128 (the prompt's 128 tokens are
    // all one block, computed at least in its last token).
    let (hits_16, capacity) = run("");
    assert_eq!(hits_16, 60 * 80);
    assert_eq!(run("--block-size 16"), (hits_16, capacity));
    assert_eq!(run("--block-size 32").0, 60 * 64);
    assert_eq!(run("--block-size 64").0, 60 * 64);
    assert_eq!(run("--block-size 128").0, 0);
    // The cache holds as many tokens, in whole blocks.
    assert_eq!(run("--block-size 64").1, capacity);
    // Drafting from the model's hidden states (EAGLE, MTP), vLLM recomputes the last block found:
    // 64 of the 80 tokens in blocks of 16, and none in blocks of 64. An n-gram draft finds all.
    let mtp = r#"--speculative-config {"method":"mtp","num_speculative_tokens":1}"#;
    assert_eq!(run(mtp).0, 60 * 64);
    assert_eq!(run(&format!("{mtp} --block-size 64")).0, 0);
    let ngram = r#"--speculative-config {"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4}"#;
    assert_eq!(run(ngram).0, hits_16);
    // A block of fewer than 16 tokens is taken at 16, and a hybrid model's is vLLM's own.
    assert_eq!(run("--block-size 8").0, hits_16);
    let hybrid = |flags: &str| {
        let line = format!("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 --enable-prefix-caching {flags}");
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        simulate::simulate_on(&mut engine, &workload);
        engine.counters().prefix_cache_hits
    };
    assert_eq!(hybrid("--block-size 128"), hybrid(""));
    assert!(config("vllm serve Qwen/Qwen3.5-9B --block-size 128").unmodelled.is_empty());
    // A hybrid model whose architecture the simulator does not know has a block it cannot size.
    assert_eq!(config("vllm serve Qwen/Qwen3.5-122B-A10B --block-size 128").unmodelled, ["--block-size 128"]);
    assert!(config("vllm serve Qwen/Qwen3.5-27B --block-size 128").unmodelled.is_empty());
    assert!(config("vllm serve Qwen/Qwen3-8B --block-size 128").unmodelled.is_empty());
    // A sequence holds whole blocks: one of 268 tokens holds 272 in blocks of 16 and 512 in blocks
    // of 256, so a cache of about 20000 tokens runs all 64 at once in the one and about 39 in the other.
    let full = |flags: &str| {
        let line = format!(
            "vllm serve Qwen/Qwen3-8B --sim-gpu H100 --max-model-len 4096 --kv-cache-memory-bytes 2816M {flags}"
        );
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        let workload =
            Workload { items: simulate::random(64, 260, 8, 5), arrival: Arrival::Closed { concurrency: 64 } };
        let mut most = 0;
        simulate::simulate_observed(&mut engine, &workload, |step| most = most.max(step.emissions.len()));
        most
    };
    let (whole, small) = (full("--block-size 256"), full(""));
    assert_eq!(small, 64);
    assert!((36..=42).contains(&whole), "{whole} running in blocks of 256");
}

#[test]
fn vllm_sizes_a_hybrid_models_block_to_its_state() {
    // An attention block holds at least a linear-attention layer's state (2146304 bytes in FP32):
    // Qwen3.5-9B's 4 KV heads of 256 take 4 KiB a token in BF16, so 528 tokens.
    let block = |line: &str| config(line).vllm_hybrid_block().map(|block| block.tokens);
    assert_eq!(block("vllm serve Qwen/Qwen3.5-9B"), Some(528));
    assert_eq!(block("vllm serve Qwen/Qwen3.5-9B --kv-cache-dtype fp8"), Some(1056));
    assert_eq!(block("vllm serve Qwen/Qwen3.5-9B --mamba-ssm-cache-dtype float16"), Some(272));
    // A smaller block asked is raised to it.
    assert_eq!(block("vllm serve Qwen/Qwen3.5-9B --block-size 256"), Some(528));
    // The 35B-A3B's 2 KV heads take 2 KiB; on 8 GPUs each rank holds an eighth of a state and one
    // KV head, 1 KiB a token.
    assert_eq!(block("vllm serve Qwen/Qwen3.5-35B-A3B-FP8"), Some(1056));
    assert_eq!(block("vllm serve Qwen/Qwen3.5-35B-A3B --tensor-parallel-size 8"), Some(272));
    // The 27B's layers keep 48 value heads (3207168 bytes), beside the 9B's 4 KV heads: 784.
    assert_eq!(block("vllm serve Qwen/Qwen3.5-27B"), Some(784));
    // Nothing for SGLang, a transformer, or a hybrid whose architecture the simulator lacks.
    for line in
        ["sglang serve --model-path Qwen/Qwen3.5-9B", "vllm serve Qwen/Qwen3-8B", "vllm serve Qwen/Qwen3.5-122B-A10B"]
    {
        assert_eq!(block(line), None, "{line}");
    }

    // Prefix caching finds only whole blocks: 60 prompts after their groups' first share 600
    // tokens, one block's worth of them found; 500 shared tokens are less than a block.
    let hits = |shared: usize, own: usize, flags: &str| {
        let workload = Workload {
            items: simulate::shared_prefix(64, 4, shared, own, 16),
            arrival: Arrival::Closed { concurrency: 1 },
        };
        let line =
            format!("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 --max-model-len 4096 --enable-prefix-caching {flags}");
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        simulate::simulate_on(&mut engine, &workload);
        engine.counters().prefix_cache_hits
    };
    assert_eq!(hits(600, 48, ""), 60 * 528);
    assert_eq!(hits(500, 48, ""), 0);
    // And only where a state was saved, at a step's end: a group's first prompt of 1700 tokens,
    // prefilled to its last boundary (1584) in one step, leaves a state there and none at 1056,
    // where the 1100 tokens its group shares end in whole blocks. Prefilled in steps of 528
    // tokens, it leaves one at every boundary.
    assert_eq!(hits(1100, 600, ""), 0);
    assert_eq!(hits(1100, 600, "--max-num-batched-tokens 600 --max-num-seqs 256"), 60 * 1056);

    // With prefix caching vLLM saves the state only where a step ends (its `align` mode), so a
    // prompt is prefilled up to its last block boundary first, and a chunk that does not end the
    // prompt is cut to whole blocks: a request waits for a step with a block's budget.
    let prefills = |flags: &str| {
        let line = format!("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 --max-model-len 4096 {flags}");
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        let workload = Workload { items: simulate::random(2, 1034, 4, 1), arrival: Arrival::Closed { concurrency: 2 } };
        let mut chunks = Vec::new();
        simulate::simulate_observed(&mut engine, &workload, |step| {
            if step.work.prefill_tokens > 0 {
                chunks.push(step.work.prefill_tokens);
            }
        });
        chunks
    };
    assert_eq!(prefills(""), [2068]);
    assert_eq!(prefills("--enable-prefix-caching"), [1056, 1012]);
    assert_eq!(prefills("--max-num-batched-tokens 600"), [600, 600, 599, 269]);
    assert_eq!(prefills("--enable-prefix-caching --max-num-batched-tokens 600"), [528, 506, 528, 506]);
    // The mode follows prefix caching whatever is asked.
    assert_eq!(prefills("--enable-prefix-caching --mamba-cache-mode all"), [1056, 1012]);
    assert_eq!(prefills("--mamba-cache-mode align"), [2068]);
    assert!(config("vllm serve Qwen/Qwen3.5-9B --mamba-cache-mode all").unmodelled.is_empty());
    // MTP drops a cached prefix's last block, so the boundary that counts is one block earlier:
    // here none.
    let mtp = r#"--speculative-config {"method":"mtp","num_speculative_tokens":1}"#;
    assert_eq!(prefills(&format!("--enable-prefix-caching {mtp}")), [2068]);
}

#[test]
fn a_conversations_next_turn_finds_the_reply_its_last_turn_cached() {
    // A first turn, then a second whose prompt carries the first's prompt and reply and asks more.
    // The first request names its reply's blocks too, as the server does, or not.
    let turns = |model: &str, prompt: usize, reply: usize, named: bool| {
        let sequence = block_hashes((0..((prompt + reply + 200) / 16) as u64).map(|b| b ^ 0x5eed));
        let first = if named { (prompt + reply) / 16 } else { prompt / 16 };
        let items = vec![
            WorkItem { prompt_tokens: prompt, output_tokens: reply, block_hashes: sequence[..first].to_vec() },
            WorkItem { prompt_tokens: prompt + reply + 200, output_tokens: 4, block_hashes: sequence.clone() },
        ];
        let line = format!("vllm serve {model} --sim-gpu H100 --max-model-len 4096 --enable-prefix-caching");
        let mut engine = Scheduler::from_config(&config(&line)).expect("fits");
        simulate::simulate_on(&mut engine, &Workload { items, arrival: Arrival::Closed { concurrency: 1 } });
        engine.counters().prefix_cache_hits
    };
    // A transformer caches every block whose KV it computed: 100 + 60 tokens less the last
    // sampled, 9 blocks, against the prompt's 6.
    assert_eq!(turns("Qwen/Qwen3-8B", 100, 60, true), 144);
    assert_eq!(turns("Qwen/Qwen3-8B", 100, 60, false), 96);
    // A hybrid model (vLLM's `align` mode) saves the state at each boundary its decode reaches,
    // 1056 tokens into a 600-token prompt's 500-token reply; its prompt alone left one at 528.
    assert_eq!(turns("Qwen/Qwen3.5-9B", 600, 500, true), 1056);
    assert_eq!(turns("Qwen/Qwen3.5-9B", 600, 500, false), 528);
}

#[test]
fn language_model_only_frees_a_vision_encoder_only_where_the_model_has_one() {
    // Without it, vLLM serving a model that takes images looks each step's embeddings up outside
    // the CUDA graph and holds the encoder's weights; a text-only model has neither to give up.
    let engine = |line: &str| Scheduler::from_config(&config(line)).expect("fits");
    let step = StepWork { decode_tokens: 8, decode_context_tokens: 8 * 1000, ..Default::default() };
    for (model, multimodal) in [
        ("Qwen/Qwen3.5-9B", true),
        ("Qwen/Qwen2.5-VL-7B-Instruct", true),
        ("google/gemma-3-27b-it", true),
        ("meta-llama/Llama-3.1-8B-Instruct", false),
        ("Qwen/Qwen3-8B", false),
        ("google/gemma-3-1b-it", false),
    ] {
        let with = engine(&format!("vllm serve {model} --sim-gpu H200"));
        let without = engine(&format!("vllm serve {model} --sim-gpu H200 --language-model-only"));
        let (kv, time) = (with.kv_capacity_tokens(), with.cost().step_time(&step));
        let (kv_only, time_only) = (without.kv_capacity_tokens(), without.cost().step_time(&step));
        if multimodal {
            assert!(kv_only > kv && time_only < time, "{model}: {kv_only} > {kv} tokens, {time_only:?} < {time:?}");
        } else {
            assert_eq!((kv_only, time_only), (kv, time), "{model}");
        }
    }
}

#[test]
fn a_recurrent_state_is_the_size_its_types_make_it() {
    let state = |flags: &str| {
        let engine = Scheduler::from_config(&config(&format!("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100 {flags}")))
            .expect("fits");
        let decode = StepWork { decode_tokens: 100, decode_context_tokens: 100 * 1000, ..Default::default() };
        (engine.cost().state_bytes(), engine.cost().step_parts(&decode).attention)
    };
    // 24 linear-attention layers of 32 value heads of 128 x 128 and a window of 3 x 8192, each
    // padded to vLLM's block ([`vllm_sizes_a_hybrid_models_block_to_its_state`]): 528 tokens of
    // 4 KiB of KV (4 heads of 256, keys and values in BF16) hold a layer's 2146304 bytes in FP32.
    let (fp32, fp32_step) = state("");
    assert_eq!(fp32, 24.0 * 528.0 * 4096.0);
    // 16-bit matrices: 1097728 bytes a layer, in 272 tokens' worth; less for a step to move.
    let (half, half_step) = state("--mamba-ssm-cache-dtype float16");
    assert_eq!(half, 24.0 * 272.0 * 4096.0);
    assert!(half_step < fp32_step);
    // An FP32 convolution window: its 48 KiB a layer twice over, 2195456 bytes in 544 tokens'.
    assert_eq!(state("--mamba-cache-dtype float32").0, 24.0 * 544.0 * 4096.0);
    // Both together: 1146880 bytes in 288 tokens'.
    assert_eq!(state("--mamba-ssm-cache-dtype float16 --mamba-cache-dtype float32").0, 24.0 * 288.0 * 4096.0);
    // SGLang keeps the states in a pool of their own, unpadded: 51.5 MB, and 0.5115 of it with
    // 16-bit matrices.
    let sglang = |flags: &str| {
        let line = format!("sglang serve --model-path Qwen/Qwen3.5-9B --sim-gpu H100 {flags}");
        Scheduler::from_config(&config(&line)).expect("fits").cost().state_bytes()
    };
    let layer = 32.0 * 128.0 * 128.0 * 4.0 + 3.0 * 8192.0 * 2.0;
    assert_eq!(sglang(""), 24.0 * layer);
    assert!((sglang("--mamba-ssm-dtype bfloat16") / sglang("") - 0.5115).abs() < 1e-3);
    // Qwen3-Next's config asks no type: vLLM keeps its matrices in the window's, BF16 unless the
    // window is FP32, where SGLang keeps FP32 (36 layers of the 80B-A3B on two H200s). Each rank
    // holds half a state and one of the two KV heads: 1 KiB of KV a token.
    let next = |line: &str| {
        let line = format!("{line} Qwen/Qwen3-Next-80B-A3B-Instruct --sim-gpu H200 --tensor-parallel-size 2");
        Scheduler::from_config(&config(&line)).expect("fits").cost().state_bytes() / 36.0
    };
    assert_eq!(next("sglang serve --model-path"), layer);
    assert_eq!(next("vllm serve"), 2.0 * 544.0 * 1024.0);
    assert_eq!(next("vllm serve --mamba-ssm-cache-dtype float32"), 2.0 * 1056.0 * 1024.0);
    // 2195456 bytes, 1072 tokens' exactly: nothing to pad.
    assert_eq!(next("vllm serve --mamba-cache-dtype float32"), layer + 3.0 * 8192.0 * 2.0);
    // A transformer has no state, whatever the option says.
    let transformer = Scheduler::from_config(&config(
        "vllm serve Qwen/Qwen3-8B --sim-gpu H100 --mamba-ssm-cache-dtype float16 --mamba-cache-dtype float32",
    ))
    .expect("fits");
    assert_eq!(transformer.cost().state_bytes(), 0.0);
}

#[test]
fn sharegpt_like_replies_have_the_reports_shape() {
    let items = simulate::sharegpt_like(20_000, 5);
    let mut outputs: Vec<f64> = items.iter().map(|i| i.output_tokens as f64).collect();
    outputs.sort_by(f64::total_cmp);
    let mean = outputs.iter().sum::<f64>() / outputs.len() as f64;
    assert!((mean - 281.412).abs() < 0.5, "mean {mean}");
    let at = |q: f64| outputs[(q * outputs.len() as f64) as usize] / mean;
    // The 9B latency study at 1 req/s: median 0.885 of the mean, P95 2.59, P99 3.0.
    for (q, published) in [(0.5, 0.885), (0.95, 2.59), (0.99, 3.0)] {
        assert!((at(q) / published - 1.0).abs() < 0.03, "quantile {q}: {} against {published}", at(q));
    }
    let prompts = items.iter().map(|i| i.prompt_tokens as f64).sum::<f64>() / items.len() as f64;
    assert!((prompts / 342.058 - 1.0).abs() < 0.01, "prompt mean {prompts}");
    // The same shapes at another tokenizer's means (Qwen3's, as `vllm bench serve` counted them).
    let other = simulate::sharegpt_shaped(20_000, 5, 217.393, 201.648);
    let mean = |f: fn(&simulate::WorkItem) -> usize| other.iter().map(|i| f(i) as f64).sum::<f64>() / 20_000.0;
    assert!((mean(|i| i.prompt_tokens) / 217.393 - 1.0).abs() < 0.01, "{}", mean(|i| i.prompt_tokens));
    assert!((mean(|i| i.output_tokens) / 201.648 - 1.0).abs() < 0.01, "{}", mean(|i| i.output_tokens));
}

#[test]
fn the_sharegpt_stand_in_reads_as_sharegpt_with_the_simulated_lengths() {
    let file = simulate::sharegpt_like_file(300, 9).to_string();
    // Read by the parser loadgen and the CLI share, one word a token as loadgen counts without a
    // tokenizer: every conversation usable, with the lengths `sharegpt_like` draws.
    let read = benchfleet_core::sharegpt::parse(file.as_bytes(), "stand-in.json").expect("a ShareGPT file");
    let items = simulate::sharegpt_like(300, 9);
    assert_eq!((read.entries.len(), read.total), (300, 300));
    for (entry, item) in read.entries.iter().zip(&items) {
        assert_eq!(entry.prompt.split_whitespace().count(), item.prompt_tokens);
        assert_eq!(entry.reply.split_whitespace().count(), item.output_tokens);
    }
    // No two prompts share their first block (16 words), so nothing is reused by prefix caching.
    let firsts: std::collections::HashSet<Vec<&str>> =
        read.entries.iter().map(|e| e.prompt.split_whitespace().take(16).collect()).collect();
    assert_eq!(firsts.len(), 300);
    // The same arguments, the same file.
    assert_eq!(simulate::sharegpt_like_file(300, 9).to_string(), file);
}

#[test]
fn sharegpt_like_writes_the_stand_in_and_refuses_what_it_cannot_count() {
    let sim = env!("CARGO_BIN_EXE_benchfleet-sim");
    let written = std::process::Command::new(sim).args(["sharegpt-like", "12", "9"]).output().expect("runs");
    assert!(written.status.success(), "{written:?}");
    let file: serde_json::Value = serde_json::from_slice(&written.stdout).expect("JSON");
    assert_eq!(file, simulate::sharegpt_like_file(12, 9));
    for (args, said) in [
        (&["0"][..], "CONVERSATIONS must be 1 to 1000000, not 0"),
        (&["many"][..], "CONVERSATIONS must be a whole number, not \"many\""),
        (&["5", "-1"][..], "SEED must be a whole number, not \"-1\""),
        (&["5", "1", "2"][..], "usage: benchfleet-sim sharegpt-like [CONVERSATIONS [SEED]]"),
    ] {
        let out = std::process::Command::new(sim).arg("sharegpt-like").args(args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said) && out.stdout.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn vllm_captures_cuda_graphs_up_to_twice_its_sequences_at_most_512_tokens() {
    let graph = |line: &str| Scheduler::from_config(&config(line)).expect("fits").cost().graphs;
    assert_eq!(graph(ENGINE), Graphs::Tokens(512));
    assert_eq!(graph(&format!("{ENGINE} --max-num-seqs 128")), Graphs::Tokens(256));
    assert_eq!(graph(&format!("{ENGINE} --max-num-seqs 128 --max-num-batched-tokens 200")), Graphs::Tokens(200));
    // A sequence with k draft tokens is 1 + k query tokens.
    let mtp = r#"--speculative-config {"method":"mtp","num_speculative_tokens":1}"#;
    assert_eq!(graph(&format!("{ENGINE} --max-num-seqs 64 {mtp}")), Graphs::Tokens(256));
    assert_eq!(graph(&format!("{ENGINE} --enforce-eager")), Graphs::Tokens(0));
    // Graphs off, or up to a size given (cut to the size below it that vLLM captures: steps of
    // 8 under 256, of 16 from there), or at the sizes given within the budget.
    assert_eq!(graph(&format!("{ENGINE} -cc.cudagraph_mode=NONE")), Graphs::Tokens(0));
    assert_eq!(graph(&format!("{ENGINE} --max-cudagraph-capture-size 100")), Graphs::Tokens(96));
    assert_eq!(graph(&format!("{ENGINE} --max-cudagraph-capture-size 1000")), Graphs::Tokens(992));
    assert_eq!(graph(&format!("{ENGINE} --cudagraph-capture-sizes 8 16 48 20000")), Graphs::Tokens(48));
}

const SGLANG: &str = "sglang serve --model-path Qwen/Qwen3.5-9B --context-length 8192";

#[test]
fn sglang_captures_decode_batches_up_to_its_graphs_largest_batch() {
    let graph = |line: &str| Scheduler::from_config(&config(line)).expect("fits").cost().graphs;
    // SGLang 0.5.9 on an H100 or H200: 256 sequences below 4-way tensor parallelism, 512 from it.
    assert_eq!(graph(SGLANG), Graphs::Decodes(256));
    assert_eq!(graph(&format!("{SGLANG} --sim-gpu H100 --tp-size 2")), Graphs::Decodes(256));
    assert_eq!(graph(&format!("{SGLANG} --tp-size 4")), Graphs::Decodes(512));
    // A limit given is cut to the largest size SGLang captures under it (steps of 8 to 256, of 16
    // to 512 and of 32 past it; finer below 64 with speculative decoding).
    for (max, largest) in [(1, 1), (3, 2), (13, 12), (100, 96), (270, 256), (300, 288), (512, 512), (600, 576)] {
        assert_eq!(graph(&format!("{SGLANG} --cuda-graph-max-bs {max}")), Graphs::Decodes(largest), "{max}");
    }
    let nextn = "--speculative-algorithm NEXTN --speculative-num-steps 1";
    for (max, largest) in [(9, 8), (33, 32), (47, 44), (70, 64), (100, 96), (300, 288)] {
        let line = format!("{SGLANG} {nextn} --cuda-graph-max-bs {max}");
        assert_eq!(graph(&line), Graphs::Decodes(largest), "{max} with speculative decoding");
    }
    // The sizes given set the largest; `--disable-cuda-graph` captures none.
    assert_eq!(graph(&format!("{SGLANG} --cuda-graph-bs 1 8 160 --cuda-graph-max-bs 512")), Graphs::Decodes(160));
    assert_eq!(graph(&format!("{SGLANG} --disable-cuda-graph")), Graphs::Decodes(0));
    let taken = config(&format!("{SGLANG} --disable-cuda-graph --cuda-graph-max-bs 64"));
    assert!(taken.unmodelled.is_empty(), "{:?}", taken.unmodelled);
    // vLLM's spelling is not SGLang's.
    let args: Vec<String> = format!("{SGLANG} --enforce-eager").split(' ').map(String::from).collect();
    assert_eq!(
        parse_command_line_with_gpu(&args, None).err(),
        Some(benchfleet_sim::ArgError::Unrecognized("--enforce-eager".into()))
    );
}

#[test]
fn enforce_eager_pays_the_launches_on_every_step_and_serves_slower() {
    for (graphs, eager) in [
        (ENGINE.to_owned(), format!("{ENGINE} --enforce-eager")),
        (SGLANG.to_owned(), format!("{SGLANG} --disable-cuda-graph")),
    ] {
        let (graphs, eager) = (closed_loop(&graphs, 8), closed_loop(&eager, 8));
        assert!(
            eager.mean_tpot > graphs.mean_tpot && eager.total_token_throughput < graphs.total_token_throughput,
            "eager {eager:?} against graphs {graphs:?}"
        );
    }
}

#[test]
fn a_step_over_the_largest_cuda_graph_pays_the_eager_launches() {
    let engine = Scheduler::from_config(&config(&format!("{ENGINE} --max-num-seqs 128"))).expect("fits");
    let cost = engine.cost();
    // Qwen3.5-9B's 32 layers, none of them a mixture of experts'.
    let eager = 32.0 * cost.coefficients.eager_layer_overhead;
    assert!(eager > 0.0);
    let step =
        |prefill_tokens: usize| cost.step_parts(&StepWork { prefill_tokens, decode_tokens: 100, ..Default::default() });
    // 256 tokens replay a graph; 257 do not.
    assert_eq!(step(156).overhead, cost.engine.step_overhead);
    assert_eq!(step(157).overhead, cost.engine.step_overhead + eager);

    // SGLang's graphs count decoding sequences, and its prefills run without a graph at any size.
    let engine = Scheduler::from_config(&config(&format!("{SGLANG} --max-running-requests 512 --disable-radix-cache")))
        .expect("fits");
    assert_eq!(engine.max_num_seqs(), 512);
    let cost = engine.cost();
    let step = |prefill_tokens: usize, decode_tokens: usize, draft_tokens: usize| {
        cost.step_parts(&StepWork { prefill_tokens, decode_tokens, draft_tokens, ..Default::default() }).overhead
    };
    assert_eq!(step(0, 256, 0), cost.engine.step_overhead);
    assert_eq!(step(1, 0, 0), cost.engine.step_overhead + eager);
    assert_eq!(step(8192, 0, 0), cost.engine.step_overhead + eager);
    assert_eq!(step(0, 257, 0), cost.engine.step_overhead + eager);
    // With 3 draft tokens, 1024 query tokens are 256 sequences.
    assert_eq!(step(0, 1024, 3), cost.engine.step_overhead);
}

#[test]
fn sglang_runs_a_transformer_with_vllms_fixed_step_and_launches_its_prefills() {
    // The fitted fixed step is the hybrid path's (the reports ran SGLang on Qwen3.5 alone); a
    // transformer's is vLLM's, and its prefills, which no graph covers, pay the launches.
    let engine =
        Scheduler::from_config(&config("sglang serve --model-path Qwen/Qwen3-8B --sim-gpu H100")).expect("fits");
    let cost = engine.cost();
    // Qwen3-8B's 36 layers.
    let (fixed, eager) = (cost.coefficients.vllm.step_overhead, 36.0 * cost.coefficients.eager_layer_overhead);
    assert_eq!(cost.engine.step_overhead, fixed);
    let step = |prefill_tokens: usize, decode_tokens: usize| {
        cost.step_parts(&StepWork { prefill_tokens, decode_tokens, ..Default::default() }).overhead
    };
    assert_eq!(step(0, 256), fixed);
    assert_eq!(step(0, 257), fixed + eager);
    assert_eq!(step(512, 0), fixed + eager);
}

#[test]
fn only_vllm_runs_a_hybrid_models_decodes_through_the_chunked_kernels_beside_a_prefill() {
    // vLLM mixes decodes into a step that prefills, and sends a hybrid model's every sequence
    // without drafts through the chunked linear-attention kernels then; SGLang prefills in steps
    // of their own, and a transformer has no linear attention.
    let chunked = |command: &str| Scheduler::from_config(&config(command)).expect("fits").cost().chunked_decode_states;
    assert!(chunked("vllm serve Qwen/Qwen3.5-9B --sim-gpu H100"));
    assert!(!chunked("vllm serve Qwen/Qwen3-8B --sim-gpu H100"));
    assert!(!chunked("sglang serve --model-path Qwen/Qwen3.5-9B --sim-gpu H100"));
}

#[test]
fn sglang_past_its_graphs_gains_less_from_more_running_requests() {
    // 512 clients of random 512/128: 256 running requests decode within the graphs; 512 decode
    // past them, launching every step's kernels, unless the graphs are captured that far. Without
    // the radix cache, the state pool holds the requests asked for.
    let run = |flags: &str| closed_loop(&format!("{SGLANG} --sim-gpu H100 --disable-radix-cache {flags}"), 512);
    let (r256, r512) = (run("--max-running-requests 256"), run("--max-running-requests 512"));
    let graphed = run("--max-running-requests 512 --cuda-graph-max-bs 512");
    assert!(
        graphed.total_token_throughput > r512.total_token_throughput,
        "graphs to 512: {graphed:?} against {r512:?}"
    );
    let (gain, graphed_gain) = (
        r512.total_token_throughput / r256.total_token_throughput,
        graphed.total_token_throughput / r256.total_token_throughput,
    );
    assert!(graphed_gain - gain > 0.03, "512 running: {gain:.3}x 256's, {graphed_gain:.3}x with graphs to 512");
}

/// A request of `prompt` tokens and `output` to generate.
fn request(id: u64, prompt: usize, output: usize) -> benchfleet_sim::SeqRequest {
    benchfleet_sim::SeqRequest { id, prompt_tokens: prompt, block_hashes: Vec::new(), max_tokens: output, seed: id }
}

#[test]
fn sglang_prefills_alone_and_decodes_between_unless_its_chunks_are_mixed() {
    // Two requests decoding, then a third arrives.
    let steps = |line: &str| {
        let mut engine = Scheduler::from_config(&config(line)).expect("fits");
        engine.add(request(1, 100, 50));
        engine.add(request(2, 100, 50));
        engine.step().expect("the prompts");
        engine.add(request(3, 3000, 50));
        let work = |engine: &mut Scheduler| {
            let w = engine.step().expect("a step").work;
            (w.prefill_tokens, w.decode_tokens)
        };
        [work(&mut engine), work(&mut engine)]
    };
    // SGLang's default: the prompt alone, the running requests waiting a step; then all three decode.
    assert_eq!(steps(SGLANG), [(3000, 0), (0, 3)]);
    // Its chunks mixed, and vLLM's always: the prompt beside the decodes.
    assert_eq!(steps(&format!("{SGLANG} --enable-mixed-chunk")), [(3000, 2), (0, 3)]);
    assert_eq!(steps(ENGINE), [(3000, 2), (0, 3)]);
    // A prompt longer than the budget prefills chunk by chunk, the decodes waiting for the last.
    let mut engine = Scheduler::from_config(&config(&format!("{SGLANG} --chunked-prefill-size 1024"))).expect("fits");
    engine.add(request(1, 100, 50));
    engine.step().expect("the prompt");
    engine.add(request(2, 2500, 50));
    let decoded: Vec<usize> = (0..4).map(|_| engine.step().expect("a step").work.decode_tokens).collect();
    assert_eq!(decoded, [0, 0, 0, 2]);
    // A request that cannot be admitted (the sequence limit reached) does not hold the decodes up.
    let mut engine = Scheduler::from_config(&config(&format!("{SGLANG} --max-running-requests 1"))).expect("fits");
    engine.add(request(1, 100, 50));
    engine.step().expect("the prompt");
    engine.add(request(2, 100, 50));
    assert_eq!(engine.step().expect("a step").work.decode_tokens, 1);

    // Under a steady stream with dozens of replies decoding, a prompt waits for no decode step (a
    // shorter time to its first token), and every decode waits for the prompts (a longer time per
    // output token). With a few decoding (128-token replies) the two first tokens come within 1%.
    let workload = Workload {
        items: simulate::random(400, 1024, 512, 7),
        arrival: Arrival::Rate { rate: 8.0, max_concurrency: None },
    };
    let run = |line: &str| Summary::of(&simulate::simulate(&config(line), &workload).expect("fits"));
    let (alone, mixed) = (run(SGLANG), run(&format!("{SGLANG} --enable-mixed-chunk")));
    assert!(alone.mean_ttft < mixed.mean_ttft && alone.mean_tpot > mixed.mean_tpot, "{alone:?} against {mixed:?}");
}

#[test]
fn data_parallel_replicas_each_serve_a_share_and_add_up() {
    // Saturated, two replicas serve twice one's clients in about one's time: twice the throughput.
    let one = closed_loop(ENGINE, 256);
    let two = closed_loop(&format!("{ENGINE} -dp 2"), 512);
    let ratio = two.total_token_throughput / one.total_token_throughput;
    assert!((1.9..=2.05).contains(&ratio), "two replicas: {ratio:.3}x one's throughput");
    // Tensor parallelism splits each step over the GPUs, data parallelism runs a step per GPU:
    // at saturation the second serves more (the steps' fixed costs are not split).
    let (tp, dp) = (format!("{ENGINE} -tp 2"), format!("{ENGINE} -dp 2"));
    assert!(closed_loop(&dp, 512).total_token_throughput > closed_loop(&tp, 512).total_token_throughput);

    // How the server spreads the requests: SGLang's in turn, vLLM's to the least loaded (a
    // waiting request counts four running ones), SGLang's `total_requests` to the fewest.
    let workload = Workload { items: simulate::random(400, 512, 128, 7), arrival: Arrival::Closed { concurrency: 64 } };
    let sglang = "sglang serve --model-path Qwen/Qwen3.5-9B --context-length 8192 --dp-size 2";
    for (line, even) in [
        (format!("{ENGINE} -dp 2"), false),
        (sglang.to_owned(), true),
        (format!("{sglang} --load-balance-method total_requests"), false),
        (format!("{sglang} --load-balance-method round_robin"), true),
    ] {
        let config = config(&line);
        let mut replicas = Pipeline::replicas(&config).expect("fits");
        assert_eq!(replicas.len(), 2, "{line}");
        let timings = simulate::simulate_replicas(&mut replicas, config.routing, &workload, |_| {});
        assert_eq!(timings.len(), 400, "{line}");
        let served: Vec<u64> = replicas.iter().map(|r| r.counters().finished).collect();
        if even {
            assert_eq!(served, [200, 200], "{line}");
        } else {
            assert!(served.iter().all(|&n| (180..=220).contains(&n)), "{line}: {served:?}");
        }
    }
    // SGLang's data-parallel attention shares the tensor-parallel GPUs: one replica.
    assert_eq!(config(&format!("{sglang} --tp 2 --enable-dp-attention")).data_replicas(), 1);
}

#[test]
fn a_pipeline_holds_a_model_no_gpu_holds_and_keeps_a_batch_in_flight_a_stage() {
    // 72B parameters in BF16 (144 GB) fit two H200s, not one.
    let big = "vllm serve Qwen/Qwen2.5-72B --sim-gpu H200 --max-model-len 8192";
    assert!(matches!(Scheduler::from_config(&config(big)), Err(StartupError::WeightsDoNotFit { .. })));
    let (pp, tp) = (format!("{big} -pp 2"), format!("{big} -tp 2"));
    let replicas = Pipeline::replicas(&config(&pp)).expect("fits two stages");
    assert_eq!((replicas.len(), replicas[0].batches().len()), (1, 2), "one replica, two batches in flight");
    // A request alone passes every stage in turn: tensor parallelism decodes it faster.
    let (pp_alone, tp_alone) = (closed_loop(&pp, 1).mean_tpot, closed_loop(&tp, 1).mean_tpot);
    assert!(tp_alone < 0.75 * pp_alone, "tp {tp_alone} pp {pp_alone}");

    // On a model one GPU holds: a request alone goes no faster through two stages than on one
    // GPU; saturated, the two batches in flight serve about what two replicas do (the bubbles
    // and the transfers between stages are not modelled).
    let (one, two) = (ENGINE.to_owned(), format!("{ENGINE} -pp 2"));
    let (alone, staged) = (closed_loop(&one, 1).mean_tpot, closed_loop(&two, 1).mean_tpot);
    assert!((staged / alone - 1.0).abs() < 0.05, "one GPU {alone}, two stages {staged}");
    let (replicas, pipeline) = (
        closed_loop(&format!("{ENGINE} -dp 2"), 512).total_token_throughput,
        closed_loop(&two, 512).total_token_throughput,
    );
    assert!((pipeline / replicas - 1.0).abs() < 0.1, "two replicas {replicas}, two stages {pipeline}");
    // Its batches share the engine's sequence limit (9: 5 and 4), and each takes the next request in turn.
    let mut replicas = Pipeline::replicas(&config(&format!("{ENGINE} -pp 2 --max-num-seqs 9"))).expect("fits");
    let pipeline = &mut replicas[0];
    for (id, item) in (1..).zip(simulate::random(16, 64, 64, 7)) {
        let request = benchfleet_sim::SeqRequest {
            id,
            prompt_tokens: item.prompt_tokens,
            block_hashes: item.block_hashes,
            max_tokens: item.output_tokens,
            seed: id,
        };
        pipeline.add(request);
    }
    let round = pipeline.step().expect("a round");
    let running: Vec<usize> = pipeline.batches().iter().map(Scheduler::running).collect();
    assert_eq!((running, pipeline.waiting(), round.emissions.len()), (vec![5, 4], 7, 9));
    // A round lasts as long as its slowest batch: a batch that prefills holds back one that decodes.
    let mut lone = Pipeline::replicas(&config(&two)).expect("fits");
    let long = simulate::random(1, 8192, 4, 9).remove(0);
    let short = simulate::random(1, 16, 64, 8).remove(0);
    let alone = simulate::simulate_replicas(
        &mut Pipeline::replicas(&config(&two)).expect("fits"),
        benchfleet_sim::Routing::RoundRobin,
        &Workload { items: vec![short.clone()], arrival: Arrival::Closed { concurrency: 1 } },
        |_| {},
    )[0];
    let beside = simulate::simulate_replicas(
        &mut lone,
        benchfleet_sim::Routing::RoundRobin,
        &Workload { items: vec![short, long], arrival: Arrival::Closed { concurrency: 2 } },
        |_| {},
    )[0];
    assert!(beside.first_token - beside.sent > 1.5 * (alone.first_token - alone.sent), "{alone:?} {beside:?}");
}
