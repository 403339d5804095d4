//! Hardware, model and engine profiles, and the step-time model built from them: the one table of coefficients.
//!
//! A step of a continuous-batching engine runs one forward pass over every
//! token scheduled in it: prefill chunks and one (or, with speculative
//! decoding, `1 + k`) query tokens per decoding sequence. Its duration is
//!
//! ```text
//! step = cpu + gpu - overlap × min(cpu, gpu)              (overlap: the engine's asynchronous scheduling)
//! cpu  = engine step overhead (vLLM on a hybrid model: + its linear-attention metadata)
//!        + engine per-token overhead × decode query tokens
//!        (× the mixed-step factor when the step also prefills)
//!      + eager launches                                   (a step no captured CUDA graph covers)
//! gpu  = kernel boundaries (a fixed GPU time per step)
//!      + multimodal inputs (a fixed GPU time per step)     (vLLM without --language-model-only)
//!      + (draft cost + draft cost per sequence × decoding sequences) × k   (speculative decoding only)
//!      + FP8 KV dequantisation × context tokens read       (--kv-cache-dtype fp8 only)
//!      + state saving × prefilled tokens                   (vLLM caching a hybrid model's prefixes)
//!      + max(compute, memory)                              (the linear layers)
//!      + attention                                         (the attention layers' kernels)
//! compute   = 2 × active params × tokens / (peak linear FLOP/s × MFU(tokens))
//! memory    = weights touched / (HBM bandwidth × BANDWIDTH_EFFICIENCY)
//! attention = prefill attention FLOPs / (peak BF16 FLOP/s × ATTENTION_EFFICIENCY)
//!           + linear-attention chunks × chunk FLOPs / (peak BF16 FLOP/s × LINEAR_ATTENTION_EFFICIENCY)
//!             (a hybrid model: prefilled tokens / 64, and in a vLLM step that also prefills,
//!             one padded chunk a decoding sequence)
//!           + (KV cache read + recurrent state read and written) / (HBM bandwidth × BANDWIDTH_EFFICIENCY)
//!             (the state × StateTypes::chunked_passes in a vLLM step that also prefills)
//! MFU(n)    = MFU_MAX × n / (n + MFU_HALF_TOKENS)
//! ```
//!
//! A step's kernels run one after another: a linear layer's GEMM takes all the step's tokens at
//! once and is bound by its FLOPs or by the weights it reads, whichever is longer; the attention
//! and linear-attention kernels that follow it read the decoding sequences' KV cache and
//! recurrent state on their own, so a prefill chunk's FLOPs do not hide those reads.
//!
//! The roofline parts come from the hardware's data
//! sheet and the model's size; the two engine overheads are what the
//! published reports show beyond the roofline (scheduling, sampling, kernel
//! launches and the linear-attention state of Qwen3.5's hybrid layers), fitted
//! to them, but for vLLM's fixed step on a transformer, which the reports (all
//! of hybrid models) cannot show and other models' runs fit
//! (`calibration::fit_transformer_step`). The calibration test
//! (`docs/sim-calibration.md`) keeps them honest.
//!
//! Every coefficient is in [`COEFFICIENTS`] or in [`GPUS`]; nothing else in
//! the crate holds a number that shapes the simulated performance (the
//! calibration's `START` and `HOLD_OUT` are other sets it fits and compares).

use std::time::Duration;

use crate::config::EngineKind;

/// One GPU model's data-sheet numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    /// Total memory, bytes.
    pub memory: f64,
    /// HBM bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Dense BF16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// Dense FP8 tensor-core peak, FLOP/s.
    pub fp8_flops: f64,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The GPUs `--sim-gpu` knows: H100 SXM 80GB and H200 141GB (same compute, more and faster memory).
pub const GPUS: [Gpu; 2] = [
    Gpu { name: "H100", memory: 79.6 * GIB, bandwidth: 3.35e12, bf16_flops: 989e12, fp8_flops: 1979e12 },
    Gpu { name: "H200", memory: 139.8 * GIB, bandwidth: 4.8e12, bf16_flops: 989e12, fp8_flops: 1979e12 },
];

/// Finds a GPU by a name as operators write it: `H100`, `h200`, `NVIDIA H100 80GB HBM3`.
pub fn gpu(name: &str) -> Option<Gpu> {
    let upper = name.to_ascii_uppercase();
    GPUS.into_iter().find(|g| upper.contains(g.name))
}

/// The numbers that shape the simulation, in one place; see the module doc for the formula.
/// [`COEFFICIENTS`] is the fitted set every engine runs with; the calibration fits others
/// (`benchfleet_sim::calibration`), which is why a [`CostModel`] carries its own copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coefficients {
    /// Fraction of peak HBM bandwidth a decode step reaches.
    pub bandwidth_efficiency: f64,
    /// Best model-FLOPs utilisation of the linear layers, reached by large prefill chunks.
    pub mfu_max_dense: f64,
    /// Mixture-of-experts layers spread a step's tokens over many small expert GEMMs: lower utilisation.
    pub mfu_max_moe: f64,
    /// Tokens in a step at which the linear layers reach half of `mfu_max`.
    pub mfu_half_tokens: f64,
    /// The share of the data sheet's FP8 advantage over BF16 that FP8 linear layers realise (0: none,
    /// 1: all of it). Block-scaled FP8 kernels quantise activations and rescale partial sums, and a
    /// mixture of experts' small expert GEMMs are bound by memory more than by the tensor cores.
    pub fp8_linear_gain: f64,
    /// Fraction of BF16 peak the attention kernels reach on long prefills.
    pub attention_efficiency: f64,
    /// Fraction of BF16 peak a hybrid model's chunked linear-attention kernels
    /// (`chunk_gated_delta_rule`) reach on their 64-token chunks ([`CHUNK_FLOPS_PER_VALUE_HEAD`]):
    /// small tiles, a triangular solve and a state carried from chunk to chunk. A prefill's
    /// tokens fill their chunks; a decode that vLLM sends through those kernels beside a prefill
    /// is a chunk of one token, padded to 64.
    pub linear_attention_efficiency: f64,
    /// KV-cache bytes per token (BF16) per square root of the billions of parameters. Sized like
    /// Qwen3.5's hybrid attention, where only one layer in four keeps a KV cache.
    pub kv_bytes_per_token_per_sqrt_b: f64,
    /// Attention FLOPs per (query token, context token) pair, per BF16 KV byte of a token.
    pub attention_flops_per_kv_byte: f64,
    /// An FP8 KV cache on a hybrid model: seconds per context token a decode reads. It stands for
    /// what the reports' one FP8-cache run lost (the 35B-A3B, about 2 points below the run without),
    /// not a mechanism the simulator knows: vLLM's FlashAttention 3 multiplies an FP8 cache as it
    /// is, quantising the queries. Fitted on Qwen3.5's few attention layers of few KV heads, it is
    /// not carried to a transformer, whose FP8 cache only halves what it holds and reads.
    pub kv_fp8_dequant_cost: f64,
    /// Bytes of recurrent state per sequence per square root of the billions of parameters, as a
    /// decode step moves it: Qwen3.5's linear-attention layers read and write each decoding
    /// sequence's state every step, whatever the weights' or the KV cache's type, so FP8 does not
    /// shrink it. Fitted: for the 9B it comes to 43.5 MB (its architecture's state is 51.5),
    /// for the 35B-A3B to 1.3 times its architecture's, standing for per-sequence work of its
    /// experts the model lacks. The memory a state holds, and what the chunked kernels' extra
    /// passes copy ([`CostModel::state_tensor_bytes`]), is the architecture's where the
    /// simulator knows it ([`ModelShape::linear_layers`]), else this.
    pub state_bytes_per_sqrt_b: f64,
    /// vLLM's prefix caching on a hybrid model (experimental, off unless `--enable-prefix-caching`)
    /// saves each sequence's recurrent state at every cached block boundary: seconds per prefilled token.
    pub hybrid_prefix_cache_cost: f64,
    /// GPU memory that is neither weights nor KV cache (activations, CUDA graphs, allocator), bytes.
    pub runtime_reserve: f64,
    /// Fraction of a multimodal model's weights its vision encoder holds; `--language-model-only`
    /// frees its memory.
    pub vision_encoder_fraction: f64,
    /// Loading weights from local disk, bytes/s, plus a fixed warm-up (compile, CUDA graphs):
    /// what `--sim-startup-ms model` waits.
    pub load_bandwidth: f64,
    pub load_warmup: f64,
    /// Per-GPU efficiency of tensor parallelism (all-reduce between GPUs).
    pub tensor_parallel_efficiency: f64,
    /// vLLM's CPU-side work a step for a hybrid model's linear-attention layers, beyond a
    /// transformer's step ([`EngineCosts::step_overhead`]), seconds. vLLM's hybrid KV-cache manager
    /// splits a 3:1 hybrid's linear-attention layers into three cache groups, and every step builds
    /// each group's linear-attention metadata again (its prefill and decode split, its chunk
    /// indices and convolution metadata, with host syncs among them). Fitted to the reports, all of
    /// them on Qwen3.5; the transformer's step under it is fitted to runs of a transformer
    /// (`calibration::fit_transformer_step`).
    pub vllm_hybrid_step_overhead: f64,
    /// The CPU-side cost of a step no captured CUDA graph replays ([`CostModel::graphs`]): its
    /// kernels are launched one by one, layer by layer ([`ModelShape::layers`]). Seconds a layer.
    /// The same model's kernels in either engine: fitted to vLLM's steps past its graphs and to
    /// SGLang's prefills, which no graph covers (no report ran SGLang's decodes past its own).
    pub eager_layer_overhead: f64,
    /// What a mixture of experts' layer launches beyond a dense one's, seconds a layer: its router,
    /// top-k, the sorting of tokens by expert, the grouped expert GEMMs and the shared expert,
    /// each a kernel (and for vLLM's fused MoE, Python) of its own where a dense MLP has two GEMMs.
    pub eager_moe_layer_overhead: f64,
    /// Cost of one draft token of speculative decoding per step (the MTP head is one layer), seconds:
    /// a fixed part (the draft head's weights read and its kernels launched) and a part per decoding
    /// sequence (the head's forward pass, its sampling and the draft's bookkeeping), so drafting is
    /// cheap beside a small batch and dear beside a large one.
    pub draft_cost: f64,
    pub draft_cost_per_sequence: f64,
    /// GPU time a step spends outside the roofline, seconds: a forward pass is several hundred
    /// kernels (a hybrid model's linear-attention layers add small ones of their own), each waiting
    /// for the one before it to drain, plus the sampler and the copies of the step's inputs. It
    /// is on the GPU's timeline, so the engines' asynchronous scheduling does not hide it, and it
    /// weighs on a small batch's short step where a large batch's long one hides it in the roofline.
    pub kernel_boundaries: f64,
    /// vLLM serving a multimodal model ([`ModelShape::multimodal`]) looks
    /// each step's token embeddings up eagerly, outside the CUDA graph, and feeds the graph their
    /// vectors (`inputs_embeds`), so that image features could be merged in; `--language-model-only`
    /// turns multimodal inputs off and the graph takes the token ids. Seconds per step, GPU side.
    pub multimodal_inputs_cost: f64,
    /// Probability that a draft token is accepted given the ones before it were, per method.
    pub acceptance_mtp: f64,
    pub acceptance_eagle: f64,
    pub acceptance_ngram: f64,
    pub acceptance_other: f64,
    /// A model name without a size (`m`, `my-model`) is simulated as a dense model of this many billions.
    pub default_params_b: f64,
    /// The engines' own costs and defaults, and what `--performance-mode` changes in vLLM's.
    pub vllm: EngineCosts,
    pub sglang: EngineCosts,
    /// `interactivity`: the fixed step cost of every step is multiplied by this fitted factor.
    /// vLLM's mode captures a CUDA graph for every batch size up to 32, whose padding the model
    /// does not have; the factor stands for what the reports' interactivity runs gained.
    pub interactivity_step_factor: f64,
}

/// The coefficients every simulated engine runs with. The knobs of `calibration::knobs` are fitted
/// to the reference studies (`cargo run --release -p benchfleet-sim --example calibrate`); the
/// data-sheet numbers, the memory sizes and the load times are not.
pub const COEFFICIENTS: Coefficients = Coefficients {
    bandwidth_efficiency: 0.95,
    mfu_max_dense: 0.8,
    mfu_max_moe: 0.341492,
    mfu_half_tokens: 117.475,
    fp8_linear_gain: 0.7625119,
    attention_efficiency: 0.5,
    linear_attention_efficiency: 0.1985459,
    kv_bytes_per_token_per_sqrt_b: 4.0 * 1024.0,
    attention_flops_per_kv_byte: 4.0,
    kv_fp8_dequant_cost: 1.834053e-8,
    state_bytes_per_sqrt_b: 1.439253e+07,
    hybrid_prefix_cache_cost: 3.915462e-6,
    runtime_reserve: 4.0 * GIB,
    vision_encoder_fraction: 0.02,
    load_bandwidth: 2.0e9,
    load_warmup: 20.0,
    tensor_parallel_efficiency: 0.85,
    eager_layer_overhead: 3.848109e-4,
    eager_moe_layer_overhead: 7.68e-4,
    // The reports' fit of vLLM's step on a hybrid model (5.714 ms) less a transformer's (below).
    vllm_hybrid_step_overhead: 4.509719e-3,
    draft_cost: 4.294605e-3,
    draft_cost_per_sequence: 1.045385e-4,
    kernel_boundaries: 1.129271e-3,
    multimodal_inputs_cost: 5.231382e-4,
    acceptance_mtp: 0.8769345,
    acceptance_eagle: 0.6,
    acceptance_ngram: 0.3,
    acceptance_other: 0.5,
    default_params_b: 8.0,
    // vLLM 0.17 on an H100/H200 (1024 sequences, 8192 tokens), and SGLang 0.5.9, whose
    // default of 2048-4096 requests its pools lower as it starts (a hybrid model's state pool to
    // 143 for Qwen3.5-9B on an H100, 324 on an H200: `Scheduler::max_num_seqs`).
    vllm: EngineCosts {
        // A transformer's, fitted to GPUStack's Qwen3-8B runs at 1 to 8 requests in flight on
        // vLLM 0.11's synchronous scheduler (`calibration::fit_transformer_step`).
        step_overhead: 1.204269e-3,
        decode_token_overhead: 8.463184e-5,
        default_max_num_seqs: 1024,
        default_max_num_batched_tokens: 8192,
        mixed_token_factor: 2.449422,
        overlap: 0.9319832,
    },
    sglang: EngineCosts {
        step_overhead: 1.140578e-2,
        decode_token_overhead: 1.852507e-4,
        default_max_num_seqs: 4096,
        default_max_num_batched_tokens: 8192,
        mixed_token_factor: 1.0,
        overlap: 1.0,
    },
    interactivity_step_factor: 0.4245107,
};

/// What an engine adds to the roofline, and its scheduler defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineCosts {
    /// Fixed cost of a step: scheduling, kernel launches, seconds. vLLM's is a transformer's (a
    /// hybrid model's adds [`Coefficients::vllm_hybrid_step_overhead`]); SGLang's, fitted on
    /// Qwen3.5 alone, a hybrid model's.
    pub step_overhead: f64,
    /// Cost per decode query token: sampling, detokenising, per-sequence state, seconds.
    pub decode_token_overhead: f64,
    /// Default cap on running sequences (`--max-num-seqs` / `--max-running-requests`).
    pub default_max_num_seqs: usize,
    /// Default token budget per step (`--max-num-batched-tokens` / `--chunked-prefill-size`).
    pub default_max_num_batched_tokens: usize,
    /// The per-token overhead of a step that mixes prefill chunks with decodes, over a pure decode
    /// step's: vLLM replays a pure decode batch as one full CUDA graph, and runs a mixed one
    /// piecewise, launching its attention (and the linear-attention layers' prefill kernels)
    /// layer by layer (`FULL_AND_PIECEWISE`, its default).
    pub mixed_token_factor: f64,
    /// The share of the CPU-side overheads hidden behind the GPU's work: vLLM's asynchronous
    /// scheduling (on by default since 0.14) plans step `n + 1` and processes the outputs of step
    /// `n - 1` while the GPU runs step `n`. SGLang's is its loop's without its overlap scheduler,
    /// which 0.5.9 turns off for Qwen3.5 and Qwen3-Next with the radix cache, as in the reports'
    /// runs; with it, SGLang hides at least vLLM's share ([`crate::SimConfig::engine_costs`]).
    pub overlap: f64,
}

impl EngineCosts {
    /// The costs of `engine` in `--performance-mode` (vLLM's; SGLang has none) under `c`, serving
    /// a `hybrid` model or a transformer. vLLM's fixed step on a hybrid model adds
    /// [`Coefficients::vllm_hybrid_step_overhead`] to a transformer's, and its modes' factors
    /// take the whole; SGLang's fitted step is already a hybrid's ([`crate::SimConfig::engine_costs`]).
    pub fn of(c: &Coefficients, engine: EngineKind, performance_mode: Option<&str>, hybrid: bool) -> EngineCosts {
        let mut costs = match engine {
            EngineKind::Vllm => c.vllm,
            EngineKind::Sglang => c.sglang,
        };
        if engine == EngineKind::Vllm && hybrid {
            costs.step_overhead += c.vllm_hybrid_step_overhead;
        }
        match performance_mode {
            // What vLLM 0.17's mode does, and all it does: the default batch limits double. The
            // reports' throughput-mode runs need nothing more (docs/sim-calibration.md).
            Some("throughput") => {
                costs.default_max_num_seqs *= 2;
                costs.default_max_num_batched_tokens *= 2;
            }
            Some("interactivity") => costs.step_overhead *= c.interactivity_step_factor,
            _ => {}
        }
        costs
    }
}

/// A model's size as its name tells it: `Qwen/Qwen3.5-35B-A3B-FP8` is a 35B mixture of experts
/// with 3B active parameters, stored in FP8.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub total_params: f64,
    pub active_params: f64,
    /// 2 for BF16 weights, 1 for FP8 or INT8, 0.53 for 4-bit formats (AWQ, GPTQ, NVFP4, MXFP4:
    /// 4 bits and a 16-bit scale and zero a group of 128), as a checkpoint's name says.
    pub bytes_per_param: f64,
    /// The linear layers multiply in FP8 (or INT8): FP8 and W8A8 checkpoints. Weight-only formats
    /// (AWQ, GPTQ, 4-bit, gpt-oss's MXFP4 experts) dequantise to BF16 on these GPUs, so they read
    /// fewer bytes but compute as BF16 does.
    pub fp8_compute: bool,
    /// A hybrid of linear-attention and attention layers (Qwen3.5, Qwen3-Next): each sequence
    /// carries a recurrent state, and vLLM leaves prefix caching off unless asked.
    pub hybrid: bool,
    /// The linear-attention layers of a hybrid model whose architecture the simulator knows (three
    /// in four of Qwen3.5's and Qwen3-Next's: 24 of the 4B's and 9B's 32, 30 of the 35B-A3B's 40,
    /// 36 of Qwen3-Next-80B-A3B's 48, 48 of the 27B's 64), each holding a state a sequence
    /// ([`StateTypes::layer_bytes`]).
    pub linear_layers: Option<u32>,
    /// The value heads of each of those layers, each a 128 x 128 state matrix a sequence: 32 in
    /// Qwen3.5's 4B, 9B and 35B-A3B and in Qwen3-Next, 48 in the 27B.
    pub linear_value_heads: u32,
    /// The KV heads of each attention layer of such a model (of [`ATTENTION_HEAD_DIM`]): 4 in
    /// Qwen3.5-4B and -9B, 2 in the 35B-A3B and Qwen3-Next-80B-A3B. vLLM sizes its block by them
    /// ([`ModelShape::vllm_hybrid_block`]).
    pub attention_kv_heads: Option<u32>,
    /// A transformer's attention layers, where the simulator knows its architecture
    /// ([`AttentionShape::of`]): they set its KV bytes a token and its attention's FLOPs.
    pub transformer: Option<AttentionShape>,
    /// The model takes images as well as text, and carries a vision encoder: its name says so
    /// ([`ModelShape::from_name`]). vLLM then looks each step's embeddings up outside the CUDA
    /// graph unless `--language-model-only`, which also frees the encoder's memory.
    pub multimodal: bool,
    /// The model's config asks for a linear-attention state's matrices in FP32 (`mamba_ssm_dtype`,
    /// Qwen3.5's); Qwen3-Next's says nothing, so vLLM keeps them in the window's type.
    pub config_fp32_states: bool,
    /// Neither the name nor [`KNOWN_MODELS`] nor `--sim-params` gave the size: it is
    /// [`Coefficients::default_params_b`] of a dense model ([`ModelShape::guessed_size`]).
    pub size_guessed: bool,
}

/// A model's size in billions of parameters: all of them, and a mixture of experts' active ones
/// (a token's pass), as `--sim-params` gives them and model names write them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub total: f64,
    pub active: Option<f64>,
}

impl Params {
    /// A size as model names write it: `355B-A32B`, `8B`, `0.6B`, `270M`; `None` for anything else
    /// (an active count of more than the total among it).
    pub fn parse(text: &str) -> Option<Params> {
        let upper = text.trim().to_ascii_uppercase();
        let (total, active) = match upper.split_once('-') {
            Some((total, active)) => (total, Some(active.strip_prefix('A')?)),
            None => (upper.as_str(), None),
        };
        let active = match active {
            Some(active) => Some(billions(active)?),
            None => None,
        };
        let params = Params { total: billions(total)?, active };
        params.active.is_none_or(|a| a <= params.total).then_some(params)
    }
}

/// Billions of parameters as a part of a model's name writes them: `35B`, `0.6B`, `270M`; more
/// than 100,000 is no model's.
fn billions(part: &str) -> Option<f64> {
    let (number, scale) = match part.strip_suffix('B') {
        Some(number) => (number, 1.0),
        None => (part.strip_suffix('M')?, 1e-3),
    };
    number.parse::<f64>().ok().map(|n| n * scale).filter(|n| *n > 0.0 && *n <= 1e5)
}

/// A Qwen3.5-9B or Qwen3-Next linear-attention layer's state for one sequence, bytes: 32 value
/// heads of 128 x 128 in FP32 (as Qwen3.5's config sets it, SGLang's default) and a convolution
/// window ([`StateTypes::layer_bytes`]).
pub const LINEAR_LAYER_STATE_BYTES: f64 = StateTypes { matrices_16bit: false, conv_fp32: false }.layer_bytes(32);

/// The elements of one value head's state matrix: 128 x 128.
const STATE_MATRIX_ELEMENTS: usize = 128 * 128;

/// A linear-attention layer's query and key heads of 128 channels each (16 of each), which its
/// convolution window holds beside the value heads'.
const CONV_QUERY_KEY_CHANNELS: usize = 2 * 16 * 128;

/// The tokens of a chunk of the chunked linear-attention kernels (`chunk_gated_delta_rule`).
pub const LINEAR_ATTENTION_CHUNK: f64 = 64.0;

/// FLOPs of one chunk of `chunk_gated_delta_rule` for one value head of 128 x 128 (keys and
/// values of 128 channels, C = 64 tokens): five C x C x 128 products (the keys' Gram matrix, the
/// WY representation's w and u, the queries against the keys and the intra-chunk output), three
/// C x 128 x 128 ones (the values against the state carried in, the state's update and the
/// queries against it), and the C x C triangular solve (C³/3 multiply-adds).
pub const CHUNK_FLOPS_PER_VALUE_HEAD: f64 = {
    let (c, d) = (LINEAR_ATTENTION_CHUNK, 128.0);
    5.0 * 2.0 * c * c * d + 3.0 * 2.0 * c * d * d + 2.0 * c * c * c / 3.0
};

/// The head size of Qwen3.5's and Qwen3-Next's attention layers.
pub const ATTENTION_HEAD_DIM: usize = 256;

/// KV bytes a token (BF16) per square root of the active billions of parameters, for a
/// transformer whose architecture the simulator does not know: Llama-3.1-8B's and Qwen3-8B's 128
/// and 144 KiB come to 45 and 51 KiB a square root, Qwen3-30B-A3B's 96 KiB to 55 (by its 3B
/// active), Llama-3.1-70B's 320 KiB to 38.
pub const TRANSFORMER_KV_BYTES_PER_SQRT_B: f64 = 48.0 * 1024.0;

/// A transformer's attention, as its config sets it (`num_hidden_layers`, `num_attention_heads`,
/// `num_key_value_heads`, `head_dim`; DeepSeek's latent attention `kv_lora_rank` and the rotary
/// and value head sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub layers: u32,
    pub query_heads: u32,
    /// The KV heads a layer caches. Latent attention caches one latent vector a token, which
    /// every tensor-parallel rank holds whole.
    pub kv_heads: u32,
    /// Elements a KV head caches a token: a key and a value (twice the head size), or the latent
    /// vector and its rotary key (512 + 64 in DeepSeek-V3).
    pub cached: u32,
    /// Elements a query head multiplies each context token by: its key's and its value's (twice
    /// the head size; DeepSeek-V3's prefill, 192 + 128).
    pub multiplied: u32,
    /// Layers of the same heads that attend to a sliding window of the last tokens only, beside
    /// the `layers` that attend to the whole context (Gemma 3's five in six, gpt-oss's every
    /// other). vLLM keeps only the window's blocks of them.
    pub window: Option<SlidingWindow>,
}

/// Sliding-window attention layers: how many, and the tokens each attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    pub layers: u32,
    pub tokens: u32,
}

/// What a model's sliding-window layers cost, as a cost model takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowCost {
    /// The tokens each attends to, and so the most a sequence keeps in them.
    pub tokens: usize,
    /// Their KV bytes a token on all the ranks, as configured (an FP8 cache halves them).
    pub bytes_per_token: f64,
    /// Their attention FLOPs per (query token, context token) pair.
    pub flops_per_pair: f64,
}

/// Models the simulator knows by name: how their names start, their total and active billions of
/// parameters, their checkpoints' bytes a parameter, and whether those multiply in FP8. A start
/// names a model where the name goes on with no letter or digit (`GLM-4.6` names `GLM-4.6-FP8`,
/// not `GLM-4.6V`), and a longer start comes before a shorter one (`GLM-4.5-Air` before
/// `GLM-4.5`). A start that carries a size names that model, whatever the size says (gpt-oss's is
/// its total, Llama 4's `17B` its active parameters); one that does not, a family whose names
/// carry no size (DeepSeek-V3 and R1, whose distillations' names carry theirs). DeepSeek, Kimi K2
/// and MiniMax-M2 publish block-scaled FP8 weights; Kimi-K2-Thinking INT4 experts beside BF16
/// attention (594 GB); gpt-oss MXFP4 experts beside BF16 attention (65 GB for the 120B, 13.8 GB
/// for the 20B). A dense model's active parameters are its total.
pub const KNOWN_MODELS: [(&str, f64, f64, f64, bool); 17] = [
    ("DEEPSEEK-V3", 671.0, 37.0, 1.0, true),
    ("DEEPSEEK-R1", 671.0, 37.0, 1.0, true),
    ("KIMI-K2-THINKING", 1040.0, 32.0, 0.57, false),
    ("KIMI-K2", 1040.0, 32.0, 1.0, true),
    ("GLM-4.5-AIR", 106.0, 12.0, 2.0, false),
    ("GLM-4.5", 355.0, 32.0, 2.0, false),
    ("GLM-4.6", 355.0, 32.0, 2.0, false),
    ("MINIMAX-M2", 230.0, 10.0, 1.0, true),
    ("PHI-4-MINI", 3.8, 3.8, 2.0, false),
    ("PHI-4-MULTIMODAL", 5.6, 5.6, 2.0, false),
    ("PHI-4", 14.7, 14.7, 2.0, false),
    ("MIXTRAL-8X7B", 46.7, 12.9, 2.0, false),
    ("MIXTRAL-8X22B", 140.6, 39.1, 2.0, false),
    ("GPT-OSS-120B", 116.8, 5.1, 0.56, false),
    ("GPT-OSS-20B", 20.9, 3.6, 0.66, false),
    ("LLAMA-4-SCOUT-17B-16E", 109.0, 17.0, 2.0, false),
    ("LLAMA-4-MAVERICK-17B-128E", 400.0, 17.0, 2.0, false),
];

/// Bytes a parameter of a 4-bit checkpoint: 4 bits, and a 16-bit scale and zero for each group
/// of 128.
pub const FOUR_BIT_BYTES: f64 = (4.0 + 32.0 / 128.0) / 8.0;

impl AttentionShape {
    /// Grouped-query attention: `kv_heads` keys and values of `head_dim` a layer.
    const fn grouped(layers: u32, query_heads: u32, kv_heads: u32, head_dim: u32) -> AttentionShape {
        AttentionShape { layers, query_heads, kv_heads, cached: 2 * head_dim, multiplied: 2 * head_dim, window: None }
    }

    /// Of `layers`, those but the `global` attend to a window of `tokens`.
    const fn windowed(self, global: u32, tokens: u32) -> AttentionShape {
        let window = SlidingWindow { layers: self.layers - global, tokens };
        AttentionShape { layers: global, window: Some(window), ..self }
    }

    /// The attention of the transformer families the simulator knows, by the upper-cased model
    /// name and its total and active billions of parameters: Llama 3.x, Qwen3 (and Qwen3-VL's
    /// language model), Qwen2.5 (and its VL and Omni models'), Mistral 7B, Mixtral, Gemma 3,
    /// gpt-oss, Llama 4, GLM-4.5 and 4.6, MiniMax-M2, Phi-4, and DeepSeek-V3, R1 and Kimi K2's
    /// latent attention. A family's fine-tunes share its shapes. Others (DeepSeek-V3.2's sparse
    /// attention among them) are not known.
    pub fn of(upper: &str, total: f64, active: Option<f64>) -> Option<AttentionShape> {
        let grouped = AttentionShape::grouped;
        let family = |prefixes: &[&str]| prefixes.iter().any(|p| upper.starts_with(p));
        if family(&["LLAMA-3", "META-LLAMA-3"]) && !upper.contains("VISION") {
            return match (total, active) {
                (1.0, None) => Some(grouped(16, 32, 8, 64)),
                (3.0, None) => Some(grouped(28, 24, 8, 128)),
                (8.0, None) => Some(grouped(32, 32, 8, 128)),
                (70.0, None) => Some(grouped(80, 64, 8, 128)),
                (405.0, None) => Some(grouped(126, 128, 8, 128)),
                _ => None,
            };
        }
        if family(&["QWEN3-"]) && !family(&["QWEN3-NEXT"]) {
            return match (total, active) {
                (0.6 | 1.7 | 2.0, None) => Some(grouped(28, 16, 8, 128)),
                (4.0 | 8.0, None) => Some(grouped(36, 32, 8, 128)),
                (14.0, None) => Some(grouped(40, 40, 8, 128)),
                (32.0, None) => Some(grouped(64, 64, 8, 128)),
                (30.0, Some(3.0)) => Some(grouped(48, 32, 4, 128)),
                (235.0, Some(22.0)) => Some(grouped(94, 64, 4, 128)),
                _ => None,
            };
        }
        if family(&["QWEN2.5-"]) {
            return match (total, active) {
                (0.5, None) => Some(grouped(24, 14, 2, 64)),
                (1.5, None) => Some(grouped(28, 12, 2, 128)),
                (3.0, None) => Some(grouped(36, 16, 2, 128)),
                (7.0, None) => Some(grouped(28, 28, 4, 128)),
                (14.0, None) => Some(grouped(48, 40, 8, 128)),
                (32.0, None) => Some(grouped(64, 40, 8, 128)),
                (72.0, None) => Some(grouped(80, 64, 8, 128)),
                _ => None,
            };
        }
        // DeepSeek-V3's latent attention: one vector of 512 and a rotary key of 64 a token, which
        // each query head multiplies by its 192 key and 128 value elements in prefill. Kimi K2
        // is the architecture with half the heads.
        let latent = |query_heads| AttentionShape {
            layers: 61,
            query_heads,
            kv_heads: 1,
            cached: 512 + 64,
            multiplied: 192 + 128,
            window: None,
        };
        if family(&["DEEPSEEK-V3", "DEEPSEEK-R1"]) && !upper.contains("V3.2") && (total, active) == (671.0, Some(37.0))
        {
            return Some(latent(128));
        }
        if family(&["KIMI-K2"]) && (total, active) == (1040.0, Some(32.0)) {
            return Some(latent(64));
        }
        // Gemma 3: one layer in six attends to the whole context, the others to the last 1024
        // tokens (512 in the 1B). gpt-oss: every other layer to the last 128.
        if family(&["GEMMA-3-"]) {
            return match (total, active) {
                (1.0, None) => Some(grouped(26, 4, 1, 256).windowed(4, 512)),
                (4.0, None) => Some(grouped(34, 8, 4, 256).windowed(5, 1024)),
                (12.0, None) => Some(grouped(48, 16, 8, 256).windowed(8, 1024)),
                (27.0, None) => Some(grouped(62, 32, 16, 128).windowed(10, 1024)),
                _ => None,
            };
        }
        // Llama 4: three layers in four attend within chunks of 8192 tokens, taken as a window of
        // them (which holds what vLLM holds, and reads up to twice what they read past the first).
        match total {
            109.0 | 400.0 if family(&["LLAMA-4-SCOUT", "LLAMA-4-MAVERICK"]) => {
                Some(grouped(48, 40, 8, 128).windowed(12, 8192))
            }
            116.8 if family(&["GPT-OSS-120B"]) => Some(grouped(36, 64, 8, 64).windowed(18, 128)),
            20.9 if family(&["GPT-OSS-20B"]) => Some(grouped(24, 64, 8, 64).windowed(12, 128)),
            7.0 if family(&["MISTRAL-7B"]) => Some(grouped(32, 32, 8, 128)),
            355.0 if family(&["GLM-4.5", "GLM-4.6"]) => Some(grouped(92, 96, 8, 128)),
            106.0 if family(&["GLM-4.5-AIR"]) => Some(grouped(46, 96, 8, 128)),
            230.0 if family(&["MINIMAX-M2"]) => Some(grouped(62, 48, 8, 128)),
            14.7 if family(&["PHI-4"]) => Some(grouped(40, 40, 10, 128)),
            3.8 | 5.6 if family(&["PHI-4-MINI", "PHI-4-MULTIMODAL"]) => Some(grouped(32, 24, 8, 128)),
            _ if family(&["MIXTRAL-8X7B"]) => Some(grouped(32, 32, 8, 128)),
            _ if family(&["MIXTRAL-8X22B"]) => Some(grouped(56, 48, 8, 128)),
            _ => None,
        }
    }

    /// BF16 KV bytes a token on `tensor_parallel` GPUs together: what each KV head caches in each
    /// layer that attends to the whole context. Each rank holds at least one head, so ranks
    /// beyond the heads copy them (vLLM's, and latent attention's one vector on every rank).
    pub fn kv_bytes_bf16(self, tensor_parallel: u32) -> f64 {
        self.layer_kv_bytes_bf16(tensor_parallel) * f64::from(self.layers)
    }

    fn layer_kv_bytes_bf16(self, tensor_parallel: u32) -> f64 {
        f64::from(self.kv_heads.max(tensor_parallel.max(1)) * self.cached * 2)
    }

    /// What the sliding-window layers cost, BF16 (see [`WindowCost`]).
    pub fn window_cost(self, tensor_parallel: u32) -> Option<WindowCost> {
        self.window.map(|w| WindowCost {
            tokens: w.tokens as usize,
            bytes_per_token: self.layer_kv_bytes_bf16(tensor_parallel) * f64::from(w.layers),
            flops_per_pair: self.pair_flops(w.layers),
        })
    }

    /// FLOPs per (query token, context token) pair in the layers that attend to the whole
    /// context ([`AttentionShape::pair_flops`]).
    pub fn flops_per_pair(self) -> f64 {
        self.pair_flops(self.layers)
    }

    /// FLOPs per (query token, context token) pair in `layers` layers: each query head's products
    /// with the context token's key and value, two FLOPs a multiply-add.
    fn pair_flops(self, layers: u32) -> f64 {
        f64::from(2 * layers * self.query_heads * self.multiplied)
    }
}

/// The block vLLM gives a hybrid model ([`ModelShape::vllm_hybrid_block`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HybridBlock {
    /// Tokens an attention layer's block holds: a sequence holds whole blocks, and prefix caching
    /// finds, shares and (vLLM's `align` mode) prefills up to whole ones.
    pub tokens: usize,
    /// The bytes of one layer's block on all the ranks: each linear-attention layer's state takes
    /// one, padded to it.
    pub layer_bytes: f64,
}

impl ModelShape {
    /// The shape `name` gives: its size as [`KNOWN_MODELS`] has it where it knows the name, else
    /// as the name writes it (`35B`, `A3B`), else [`Coefficients::default_params_b`] of a dense
    /// model ([`ModelShape::size_guessed`]).
    pub fn from_name(name: &str) -> ModelShape {
        ModelShape::sized(name, None)
    }

    /// [`ModelShape::from_name`], with the size `params` where given (`--sim-params`) instead of
    /// the name's or the known model's.
    pub fn sized(name: &str, params: Option<Params>) -> ModelShape {
        let base = name.rsplit('/').next().unwrap_or(name);
        let upper = base.to_ascii_uppercase();
        let parts: Vec<&str> = upper.split(['-', '_']).filter(|p| !p.is_empty()).collect();
        // "35B", "0.6B" or "270M" (total) and "A3B" (active); "Qwen3.5" does not end in B.
        let total = parts.iter().find_map(|p| billions(p));
        let active = parts.iter().find_map(|p| p.strip_prefix('A').and_then(billions));
        // A model the simulator knows by name, where no size is given; a name without a size is
        // else a dense one of `default_params_b`.
        let names = |start: &str| {
            upper.strip_prefix(start).is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_alphanumeric()))
        };
        let known = KNOWN_MODELS.iter().find(|(start, ..)| {
            params.is_none() && names(start) && (total.is_none() || start.split('-').any(|p| billions(p).is_some()))
        });
        let size_guessed = params.is_none() && known.is_none() && total.is_none();
        let (total, active) = match (params, known) {
            (Some(p), _) => (p.total, p.active),
            (None, Some(k)) => (k.1, Some(k.2)),
            (None, None) => (total.unwrap_or(COEFFICIENTS.default_params_b), active),
        };
        // The checkpoint's format: weight-only ones (AWQ, GPTQ: 4 bits unless `Int8`) dequantise.
        let has = |markers: &[&str]| parts.iter().flat_map(|p| p.split('.')).any(|p| markers.contains(&p));
        let weight_only = has(&["AWQ", "GPTQ", "W4A16", "W8A16"]);
        let four_bit = has(&["AWQ", "INT4", "W4A16", "NVFP4", "MXFP4", "FP4"]) || (has(&["GPTQ"]) && !has(&["INT8"]));
        let eight_bit = has(&["FP8", "INT8", "W8A8", "W8A16"]);
        let (bytes_per_param, fp8_compute) = match known {
            _ if four_bit => (FOUR_BIT_BYTES, false),
            _ if eight_bit => (1.0, !weight_only),
            Some(k) if !has(&["BF16"]) => (k.3, k.4),
            _ => (2.0, false),
        };
        let (qwen35, next) = (upper.starts_with("QWEN3.5"), upper.starts_with("QWEN3-NEXT"));
        let (linear_layers, attention_kv_heads, linear_value_heads) = match (qwen35, next, total, active) {
            (true, _, 4.0 | 9.0, None) => (Some(24), Some(4), 32),
            (true, _, 27.0, None) => (Some(48), Some(4), 48),
            (true, _, 35.0, Some(3.0)) => (Some(30), Some(2), 32),
            (_, true, 80.0, Some(3.0)) => (Some(36), Some(2), 32),
            _ => (None, None, 32),
        };
        // Every Qwen3.5 takes images; elsewhere the families and suffixes that mark a vision model.
        let vision_family = ["LLAMA-4", "PIXTRAL", "LLAVA", "INTERNVL", "OMNI", "MULTIMODAL"]
            .iter()
            .any(|f| upper.contains(f))
            || parts.iter().any(|p| p.strip_prefix("VL").is_some_and(|v| v.bytes().all(|b| b.is_ascii_digit())))
            || (upper.starts_with("GEMMA-3") && !upper.starts_with("GEMMA-3-1B") && !upper.starts_with("GEMMA-3-270M"));
        ModelShape {
            total_params: total * 1e9,
            active_params: active.unwrap_or(total).min(total) * 1e9,
            bytes_per_param,
            fp8_compute,
            hybrid: qwen35 || next,
            linear_layers,
            linear_value_heads,
            attention_kv_heads,
            transformer: if qwen35 || next { None } else { AttentionShape::of(&upper, total, active) },
            multimodal: qwen35 || vision_family,
            config_fp32_states: qwen35,
            size_guessed,
        }
    }

    pub fn weight_bytes(&self) -> f64 {
        self.total_params * self.bytes_per_param
    }

    /// The block vLLM 0.17 gives this hybrid model (`HybridAttentionMambaModelConfig`), where the
    /// simulator knows its architecture: an attention layer's block must hold at least a
    /// linear-attention layer's state, so it is the fewest multiple of 16 tokens whose KV bytes
    /// (per rank: `tensor_parallel` splits the state and the KV heads, at least one each) reach
    /// the state's, or the `asked` `--block-size` where that is larger; the state is padded to the
    /// block. 528 tokens for Qwen3.5-9B and 1056 for the 35B-A3B in BF16.
    pub fn vllm_hybrid_block(
        &self,
        types: StateTypes,
        kv_fp8: bool,
        tensor_parallel: u32,
        asked: Option<usize>,
    ) -> Option<HybridBlock> {
        let heads = self.attention_kv_heads.filter(|_| self.hybrid && self.linear_layers.is_some())?;
        let ranks = tensor_parallel.max(1);
        let token_bytes = 2 * (heads / ranks).max(1) as usize * ATTENTION_HEAD_DIM * if kv_fp8 { 1 } else { 2 };
        let state = types.layer_bytes(self.linear_value_heads) / f64::from(ranks);
        let least = 16 * (state / (16 * token_bytes) as f64).ceil() as usize;
        let tokens = asked.filter(|&asked| asked > least).unwrap_or(least);
        Some(HybridBlock { tokens, layer_bytes: (tokens * token_bytes) as f64 * f64::from(ranks) })
    }

    /// BF16 KV bytes per token on `tensor_parallel` GPUs together. A transformer's are its
    /// architecture's ([`ModelShape::transformer`]), else [`TRANSFORMER_KV_BYTES_PER_SQRT_B`] a
    /// square root of its active billions; a hybrid model's are fitted
    /// ([`Coefficients::kv_bytes_per_token_per_sqrt_b`]).
    pub fn kv_bytes_per_token_bf16(&self, tensor_parallel: u32) -> f64 {
        match self.transformer {
            Some(attention) => attention.kv_bytes_bf16(tensor_parallel),
            None if self.hybrid => COEFFICIENTS.kv_bytes_per_token_per_sqrt_b * (self.total_params / 1e9).sqrt(),
            None => TRANSFORMER_KV_BYTES_PER_SQRT_B * (self.active_params / 1e9).sqrt(),
        }
    }

    /// Where the simulator does not know this model's attention, what its KV bytes a token and
    /// its state are taken as instead: the startup log says so, since they set how many requests
    /// the cache holds.
    pub fn estimated_kv(&self) -> Option<String> {
        let kib = self.kv_bytes_per_token_bf16(1) / 1024.0;
        match (self.transformer, self.hybrid, self.linear_layers) {
            (Some(_), ..) | (None, true, Some(_)) => None,
            (None, true, None) => Some(format!(
                "a hybrid model whose architecture the simulator does not know: its KV cache is taken as \
                 {kib:.0} KiB a token and its recurrent state as {:.1} MB a sequence, by its size",
                COEFFICIENTS.state_bytes_per_sqrt_b * (self.total_params / 1e9).sqrt() / 1e6
            )),
            (None, false, _) => Some(format!(
                "an architecture the simulator does not know: its KV cache is taken as {kib:.0} KiB a token \
                 (BF16), by its {:.1}B active parameters",
                self.active_params / 1e9
            )),
        }
    }

    /// Where the size is [`Coefficients::default_params_b`] for want of one, what the startup log
    /// says of it: every figure the engine serves turns on it.
    pub fn guessed_size(&self) -> Option<String> {
        self.size_guessed.then(|| {
            format!(
                "no size in its name, and not a model the simulator knows: simulated as a dense model of \
                 {:.0}B parameters; --sim-params gives its size (e.g. 355B-A32B, 8B)",
                self.total_params / 1e9
            )
        })
    }

    /// Attention FLOPs per (query token, context token) pair: a known transformer's own, else
    /// [`Coefficients::attention_flops_per_kv_byte`] per BF16 KV byte of a token.
    pub fn attention_flops_per_pair(&self, c: &Coefficients) -> f64 {
        match self.transformer {
            Some(attention) => attention.flops_per_pair(),
            None => c.attention_flops_per_kv_byte * self.kv_bytes_per_token_bf16(1),
        }
    }

    fn is_moe(&self) -> bool {
        self.active_params < self.total_params
    }

    /// The model's layers: its architecture's where the simulator knows it (a known transformer's,
    /// its windowed ones too; a hybrid's linear-attention layers and, one in four, its attention
    /// layers, as Qwen3.5 and Qwen3-Next stack them), else 16 times the cube root of its active
    /// billions of parameters (32 for an 8B: Llama 3's 8B has 32, its 70B 80, its 405B 126).
    pub fn layers(&self) -> f64 {
        match (self.transformer, self.linear_layers) {
            (Some(attention), _) => f64::from(attention.layers + attention.window.map_or(0, |w| w.layers)),
            (None, Some(linear)) => f64::from(linear + linear / 3),
            (None, None) => (16.0 * (self.active_params / 1e9).cbrt()).round().max(1.0),
        }
    }
}

/// The work of one step, as the scheduler planned it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepWork {
    /// Prompt tokens computed in this step (chunked prefill).
    pub prefill_tokens: usize,
    /// (query, context) token pairs of the prefill chunks' attention.
    pub prefill_attention_pairs: f64,
    /// Query tokens of decoding sequences: one each, `1 + k` with speculative decoding.
    pub decode_tokens: usize,
    /// Context tokens the decoding sequences' attention reads, summed.
    pub decode_context_tokens: usize,
    /// Draft tokens per decoding sequence (0 without speculative decoding).
    pub draft_tokens: usize,
    /// What sliding-window layers attend to: the prefill chunks' pairs within the window, and the
    /// decoding sequences' context tokens within it, summed.
    pub prefill_window_pairs: f64,
    pub decode_window_tokens: usize,
}

impl StepWork {
    /// The sequences decoding in the step.
    pub fn decoding_sequences(&self) -> usize {
        self.decode_tokens / self.draft_tokens.saturating_add(1)
    }
}

/// The step-time model of one engine configuration on one GPU group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub coefficients: Coefficients,
    pub gpu: Gpu,
    pub model: ModelShape,
    pub engine: EngineCosts,
    pub tensor_parallel: f64,
    /// Bytes per token of the KV cache as configured (`--kv-cache-dtype fp8` halves it).
    pub kv_bytes_per_token: f64,
    /// `--kv-cache-dtype fp8`: the attention kernels dequantise what they read.
    pub kv_fp8: bool,
    /// vLLM caching prefixes of a hybrid model: the recurrent state is saved as prompts are prefilled.
    pub hybrid_prefix_caching: bool,
    /// vLLM accepting multimodal inputs (no `--language-model-only`): embeddings outside the graph.
    pub multimodal_inputs: bool,
    /// Which steps replay a captured CUDA graph; the others pay
    /// [`Coefficients::eager_layer_overhead`] a layer.
    pub graphs: Graphs,
    /// The types the linear-attention layers' states are kept in, as the engine's options set them.
    pub state_types: StateTypes,
    /// vLLM pads each linear-attention layer's state to its attention block's bytes
    /// ([`HybridBlock::layer_bytes`]); 0 where nothing pads it (SGLang, a transformer).
    pub state_layer_page: f64,
    /// The model's sliding-window layers, as configured ([`AttentionShape::window`]).
    pub window: Option<WindowCost>,
    /// vLLM on a hybrid model: a step that prefills runs its decoding sequences' linear attention
    /// through the chunked kernels, which move each state [`StateTypes::chunked_passes`] times as
    /// much as a decode step does (the passes beyond a decode's move the state tensors,
    /// [`CostModel::state_tensor_bytes`]) and compute a padded chunk for each
    /// ([`CostModel::linear_attention_chunk_flops`]); sequences with drafts take the decode kernel
    /// even then.
    pub chunked_decode_states: bool,
}

/// The types a hybrid model's linear-attention states are kept in. The default is Qwen3.5's: its
/// config keeps the state matrices in FP32 (`mamba_ssm_dtype`), which vLLM and SGLang both follow
/// unless told otherwise, and the convolution window in the model's BF16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateTypes {
    /// The matrices in 16 bits: vLLM's `--mamba-ssm-cache-dtype float16` (and its default for a
    /// model whose config names no type, Qwen3-Next), SGLang's `--mamba-ssm-dtype bfloat16` or
    /// `float16`.
    pub matrices_16bit: bool,
    /// The convolution window in FP32: vLLM's `--mamba-cache-dtype float32`.
    pub conv_fp32: bool,
}

impl StateTypes {
    /// A Qwen3.5-9B linear-attention layer's state in these types against its default: about half
    /// with 16-bit matrices (0.5115, the window staying), 1.02 with an FP32 window.
    pub fn fraction(self) -> f64 {
        self.layer_bytes(32) / LINEAR_LAYER_STATE_BYTES
    }

    /// A linear-attention layer's state for one sequence in these types, bytes: a 128 x 128
    /// matrix for each of its `value_heads`, and a convolution window of the last 3 tokens'
    /// query, key and value channels (BF16 unless `conv_fp32`).
    pub const fn layer_bytes(self, value_heads: u32) -> f64 {
        let heads = value_heads as usize;
        let matrices = heads * STATE_MATRIX_ELEMENTS * if self.matrices_16bit { 2 } else { 4 };
        let window = 3 * (CONV_QUERY_KEY_CHANNELS + heads * 128) * if self.conv_fp32 { 4 } else { 2 };
        (matrices + window) as f64
    }

    /// What a decoding sequence's state moves in a vLLM step that also prefills, over the read and
    /// the write of a step that only decodes. Such a step sends every sequence without drafts
    /// through the chunked prefill kernels (`chunk_gated_delta_rule`), a decode as a chunk of one
    /// token: the states are gathered into a new tensor (a read and a write), the kernel reads them,
    /// writes and reads back a snapshot of each in the keys' BF16 and writes the final state in
    /// FP32, which is cast to the cache's type where that is 16-bit (a read and a write) and
    /// scattered back (a read and a write). In FP32 that is 7 passes of a state to a decode's 2.
    /// The convolution window, a fortieth of a state, is counted with the matrices.
    pub fn chunked_passes(self) -> f64 {
        // The cache's bytes an element, against the snapshot's 2 and the final state's 4.
        let cache = if self.matrices_16bit { 2.0 } else { 4.0 };
        let gather = 2.0;
        let kernel = 1.0 + 2.0 * 2.0 / cache + 4.0 / cache;
        let cast = if self.matrices_16bit { 4.0 / cache + 1.0 } else { 0.0 };
        let scatter = 2.0;
        (gather + kernel + cast + scatter) / 2.0
    }
}

/// Which steps an engine's captured CUDA graphs cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Graphs {
    /// vLLM: a step of at most this many tokens, prefill chunks and decodes together (twice
    /// `--max-num-seqs` × `1 + k` query tokens, at most 512 and within the token budget; 0 with
    /// `--enforce-eager`).
    Tokens(usize),
    /// SGLang: a step that only decodes, at most this many sequences (`--cuda-graph-max-bs`; 0
    /// with `--disable-cuda-graph`). A step that prefills runs without a graph whatever its size,
    /// SGLang 0.5.9's extend batches being eager, and pays the launches, as vLLM's does.
    Decodes(usize),
}

impl Graphs {
    /// Whether `work` replays a captured graph.
    pub fn cover(self, work: &StepWork) -> bool {
        match self {
            Graphs::Tokens(tokens) => work.prefill_tokens + work.decode_tokens <= tokens,
            Graphs::Decodes(sequences) => work.prefill_tokens == 0 && work.decoding_sequences() <= sequences,
        }
    }
}

/// A step's duration by part, seconds: what [`CostModel::step_time`] adds up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepParts {
    /// The engine's fixed cost of a step.
    pub overhead: f64,
    /// The engine's per-decode-token cost.
    pub tokens: f64,
    /// Kernel boundaries, multimodal inputs, drafting, FP8 KV dequantisation and saving recurrent
    /// states for the prefix cache.
    pub extras: f64,
    /// The linear layers' roofline: their FLOPs against the weights they read; the step takes the larger.
    pub compute: f64,
    pub memory: f64,
    /// The attention layers' own kernels, after the linear layers': prefill attention's FLOPs, and
    /// the KV cache and recurrent state the decoding sequences read (and write).
    pub attention: f64,
    /// The share of the CPU-side parts (overhead and tokens) hidden behind the GPU-side ones.
    pub overlap: f64,
}

impl StepParts {
    /// The GPU side of the step.
    pub fn gpu(&self) -> f64 {
        self.extras + self.attention + self.compute.max(self.memory)
    }

    pub fn total(&self) -> f64 {
        let (cpu, gpu) = (self.overhead + self.tokens, self.gpu());
        // cpu + gpu - overlap × min(cpu, gpu), written so that full overlap gives the longer side
        // to the bit, whatever the shorter.
        cpu.max(gpu) + (1.0 - self.overlap) * cpu.min(gpu)
    }
}

impl CostModel {
    /// Duration of a step doing `work`.
    pub fn step_time(&self, work: &StepWork) -> Duration {
        Duration::from_secs_f64(self.step_parts(work).total())
    }

    /// [`CostModel::step_time`] by part.
    pub fn step_parts(&self, work: &StepWork) -> StepParts {
        let c = &self.coefficients;
        let scale = self.tensor_parallel * if self.tensor_parallel > 1.0 { c.tensor_parallel_efficiency } else { 1.0 };
        let tokens = (work.prefill_tokens + work.decode_tokens) as f64;
        let linear_peak = if self.model.fp8_compute {
            self.gpu.bf16_flops + (self.gpu.fp8_flops - self.gpu.bf16_flops) * c.fp8_linear_gain
        } else {
            self.gpu.bf16_flops
        };
        let mfu_max = if self.model.is_moe() { c.mfu_max_moe } else { c.mfu_max_dense };
        let mfu = mfu_max * tokens / (tokens + c.mfu_half_tokens);
        let linear =
            if tokens > 0.0 { 2.0 * self.model.active_params * tokens / (linear_peak * scale * mfu) } else { 0.0 };
        // Decode attention is bound by reading the KV cache, which `memory` counts.
        let window = self.window.unwrap_or(WindowCost { tokens: 0, bytes_per_token: 0.0, flops_per_pair: 0.0 });
        let attention_flops = self.model.attention_flops_per_pair(c) * work.prefill_attention_pairs
            + window.flops_per_pair * work.prefill_window_pairs;
        let attention = attention_flops / (self.gpu.bf16_flops * scale * c.attention_efficiency);
        let sequences = work.decoding_sequences() as f64;
        let chunked = self.chunked_decode_states && work.prefill_tokens > 0 && work.draft_tokens == 0;
        // A decode reads and writes its fitted state; the chunked path's extra passes copy and
        // snapshot the state tensor itself, the architecture's bytes.
        let extra_passes = if chunked { self.state_types.chunked_passes() - 1.0 } else { 0.0 };
        let state = 2.0 * sequences * (self.state_step_bytes() + extra_passes * self.state_tensor_bytes());
        // The linear-attention layers' chunk kernels: the prefilled tokens' chunks, and in a vLLM
        // step that also prefills, a padded chunk for each decoding sequence.
        let chunks = work.prefill_tokens as f64 / LINEAR_ATTENTION_CHUNK + if chunked { sequences } else { 0.0 };
        let linear_attention = chunks * self.linear_attention_chunk_flops()
            / (self.gpu.bf16_flops * scale * c.linear_attention_efficiency);
        let state_saving =
            if self.hybrid_prefix_caching { c.hybrid_prefix_cache_cost * work.prefill_tokens as f64 } else { 0.0 };
        let bandwidth = self.gpu.bandwidth * scale * c.bandwidth_efficiency;
        let memory = self.weights_touched(tokens) / bandwidth;
        let kv_read = self.kv_bytes_per_token * work.decode_context_tokens as f64
            + window.bytes_per_token * work.decode_window_tokens as f64;
        let decode_memory = (kv_read + state) / bandwidth;
        let draft = if work.decode_tokens > 0 {
            (c.draft_cost + c.draft_cost_per_sequence * sequences) * work.draft_tokens as f64
        } else {
            0.0
        };
        let multimodal = if self.multimodal_inputs { c.multimodal_inputs_cost } else { 0.0 };
        // Fitted on the reports' hybrid models, and not carried to a transformer (see the knob).
        let dequant = if self.kv_fp8 && self.model.hybrid {
            c.kv_fp8_dequant_cost * work.decode_context_tokens as f64
        } else {
            0.0
        };
        let eager = if self.graphs.cover(work) {
            0.0
        } else {
            let moe = if self.model.is_moe() { c.eager_moe_layer_overhead } else { 0.0 };
            self.model.layers() * (c.eager_layer_overhead + moe)
        };
        StepParts {
            overhead: self.engine.step_overhead + eager,
            tokens: self.engine.decode_token_overhead
                * work.decode_tokens as f64
                * if work.prefill_tokens > 0 { self.engine.mixed_token_factor } else { 1.0 },
            extras: c.kernel_boundaries + multimodal + draft + dequant + state_saving,
            compute: linear,
            memory,
            attention: attention + linear_attention + decode_memory,
            overlap: self.engine.overlap,
        }
    }

    /// The memory a hybrid model's recurrent state holds a sequence, bytes (0 for a transformer):
    /// its architecture's ([`ModelShape::linear_layers`], each layer padded to
    /// [`CostModel::state_layer_page`]), else [`CostModel::state_step_bytes`].
    pub fn state_bytes(&self) -> f64 {
        match self.model.linear_layers {
            Some(layers) if self.model.hybrid => {
                f64::from(layers)
                    * self.state_types.layer_bytes(self.model.linear_value_heads).max(self.state_layer_page)
            }
            _ => self.state_step_bytes(),
        }
    }

    /// FLOPs of one chunk of [`LINEAR_ATTENTION_CHUNK`] tokens through all of a hybrid model's
    /// linear-attention layers ([`CHUNK_FLOPS_PER_VALUE_HEAD`] for each value head of each): its
    /// architecture's heads where the simulator knows it, else as many FP32 matrices as the fitted
    /// state a sequence holds ([`Coefficients::state_bytes_per_sqrt_b`]: the type the states are
    /// kept in changes their bytes, not the kernels' FLOPs); 0 for a transformer.
    pub fn linear_attention_chunk_flops(&self) -> f64 {
        let heads = match self.model.linear_layers {
            _ if !self.model.hybrid => 0.0,
            Some(layers) => f64::from(layers) * f64::from(self.model.linear_value_heads),
            None => {
                self.coefficients.state_bytes_per_sqrt_b * (self.model.total_params / 1e9).sqrt()
                    / (STATE_MATRIX_ELEMENTS * 4) as f64
            }
        };
        heads * CHUNK_FLOPS_PER_VALUE_HEAD
    }

    /// A hybrid model's recurrent state tensors for one sequence, in the types they are kept in,
    /// bytes: its architecture's linear-attention layers where the simulator knows them (without
    /// the page that pads them in memory: a copy moves the state, not the padding), else the
    /// fitted [`CostModel::state_step_bytes`]; 0 for a transformer. What the chunked kernels'
    /// gathers, snapshots and scatters move ([`StateTypes::chunked_passes`]).
    pub fn state_tensor_bytes(&self) -> f64 {
        match self.model.linear_layers {
            Some(layers) if self.model.hybrid => {
                f64::from(layers) * self.state_types.layer_bytes(self.model.linear_value_heads)
            }
            _ => self.state_step_bytes(),
        }
    }

    /// A hybrid model's recurrent state per sequence as a decode step reads it and writes it back,
    /// bytes each way (0 for a transformer): fitted, [`Coefficients::state_bytes_per_sqrt_b`].
    pub fn state_step_bytes(&self) -> f64 {
        if !self.model.hybrid {
            return 0.0;
        }
        self.coefficients.state_bytes_per_sqrt_b * (self.model.total_params / 1e9).sqrt() * self.state_types.fraction()
    }

    /// KV blocks of [`crate::kv::BLOCK_TOKENS`] tokens that one sequence's recurrent state takes:
    /// vLLM keeps it in the KV cache's pool (and SGLang in a pool of its own), so it bounds how many
    /// sequences run at once. FP8 KV halves a block, not the state.
    pub fn state_blocks(&self) -> usize {
        (self.state_bytes() / (self.kv_bytes_per_token * crate::kv::BLOCK_TOKENS as f64)).ceil() as usize
    }

    /// KV blocks (of the whole-context layers' [`crate::kv::BLOCK_TOKENS`] tokens) that a
    /// sequence of `tokens` holds in its sliding-window layers: vLLM frees the blocks that leave
    /// the window, so they hold at most the window and a block.
    pub fn window_blocks(&self, tokens: usize) -> usize {
        self.window.map_or(0, |w| {
            let held = tokens.min(w.tokens + crate::kv::BLOCK_TOKENS) as f64;
            (held * w.bytes_per_token / (self.kv_bytes_per_token * crate::kv::BLOCK_TOKENS as f64)).ceil() as usize
        })
    }

    /// Weight bytes a step reads: all of a dense model; for a mixture of experts, the experts its
    /// tokens were routed to: with `n` tokens each touching a fraction `f`, `1 - (1 - f)^n` of them.
    fn weights_touched(&self, tokens: f64) -> f64 {
        let all = self.model.weight_bytes();
        if !self.model.is_moe() {
            return all;
        }
        let fraction = self.model.active_params / self.model.total_params;
        let touched = 1.0 - (1.0 - fraction).powf(tokens.max(1.0));
        all * (fraction + (1.0 - fraction) * touched)
    }
}

/// The acceptance probability of one draft token for a `--speculative-config` method.
pub fn acceptance(c: &Coefficients, method: &str) -> f64 {
    match method {
        // vLLM's model-specific MTP names (qwen3_5_mtp, deepseek_mtp...) are its `mtp`.
        m if m == "mtp" || m.ends_with("_mtp") => c.acceptance_mtp,
        m if m.starts_with("eagle") => c.acceptance_eagle,
        "ngram" | "[ngram]" => c.acceptance_ngram,
        _ => c.acceptance_other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_shape(name: &str, total_b: f64, active_b: f64, bytes: f64) {
        let shape = ModelShape::from_name(name);
        assert_eq!(
            (shape.total_params / 1e9, shape.active_params / 1e9, shape.bytes_per_param),
            (total_b, active_b, bytes),
            "{name}"
        );
    }

    #[test]
    fn a_size_given_beside_the_name_is_taken_over_it() {
        let params = |text: &str| Params::parse(text).map(|p| (p.total, p.active));
        assert_eq!(params("355B-A32B"), Some((355.0, Some(32.0))));
        assert_eq!(params("8b"), Some((8.0, None)));
        assert_eq!(params(" 0.6B "), Some((0.6, None)));
        assert_eq!(params("270M"), Some((0.27, None)));
        for bad in
            ["", "8", "B", "-1B", "0B", "NaNB", "infB", "1e300B", "8B-32B", "8B-A", "30B-A40B", "8B-A3B-A1B", "eight"]
        {
            assert_eq!(params(bad), None, "{bad:?}");
        }
        let sized = |name: &str, text: &str| {
            let s = ModelShape::sized(name, Params::parse(text));
            (s.total_params / 1e9, s.active_params / 1e9, s.bytes_per_param, s.size_guessed)
        };
        assert_eq!(sized("zai-org/GLM-4.7", "355B-A32B"), (355.0, 32.0, 2.0, false));
        // The name's format stays; its size, or the known model's, gives way.
        assert_eq!(sized("acme/house-model-FP8", "70B"), (70.0, 70.0, 1.0, false));
        assert_eq!(sized("Qwen/Qwen3-8B", "14B"), (14.0, 14.0, 2.0, false));
        assert_eq!(sized("moonshotai/Kimi-K2-Instruct", "100B-A10B"), (100.0, 10.0, 2.0, false));
        // Without one, a name that gives none is a dense 8B, and the startup log says so.
        let note = ModelShape::from_name("acme/house-model").guessed_size().expect("guessed");
        assert!(note.contains("dense model of 8B parameters; --sim-params"), "{note}");
        assert_eq!(ModelShape::from_name("Qwen/Qwen3-8B").guessed_size(), None);
    }

    #[test]
    fn a_name_says_whether_the_model_takes_images() {
        for name in [
            "Qwen/Qwen3.5-9B",
            "Qwen/Qwen3.5-35B-A3B-FP8",
            "Qwen/Qwen2.5-VL-7B-Instruct",
            "Qwen/Qwen3-VL-30B-A3B-Instruct",
            "Qwen/Qwen2.5-Omni-7B",
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            "google/gemma-3-27b-it",
            "mistralai/Pixtral-12B-2409",
            "llava-hf/llava-1.5-7b-hf",
            "OpenGVLab/InternVL3-8B",
            "deepseek-ai/deepseek-vl2-small",
        ] {
            assert!(ModelShape::from_name(name).multimodal, "{name}");
        }
        for name in [
            "Qwen/Qwen3-8B",
            "Qwen/Qwen3-Next-80B-A3B-Instruct",
            "meta-llama/Llama-3.1-70B-Instruct",
            "google/gemma-3-1b-it",
            "deepseek-ai/DeepSeek-V3",
            "vllm-test-model",
            "m",
        ] {
            assert!(!ModelShape::from_name(name).multimodal, "{name}");
        }
    }

    #[test]
    fn model_sizes_from_names() {
        check_shape("Qwen/Qwen3.5-9B", 9.0, 9.0, 2.0);
        check_shape("Qwen/Qwen3.5-35B-A3B", 35.0, 3.0, 2.0);
        check_shape("Qwen/Qwen3.5-35B-A3B-FP8", 35.0, 3.0, 1.0);
        check_shape("Qwen/Qwen3-0.6B", 0.6, 0.6, 2.0);
        check_shape("meta-llama/Llama-3.1-70B-Instruct", 70.0, 70.0, 2.0);
        check_shape("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", 235.0, 22.0, 1.0);
        check_shape("m", 8.0, 8.0, 2.0);
        // Names that carry no size: DeepSeek-V3 and R1 publish FP8 weights, Mixtral BF16.
        check_shape("deepseek-ai/DeepSeek-R1", 671.0, 37.0, 1.0);
        check_shape("deepseek-ai/DeepSeek-V3.1-Terminus", 671.0, 37.0, 1.0);
        check_shape("unsloth/DeepSeek-V3-0324-BF16", 671.0, 37.0, 2.0);
        check_shape("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 12.9, 2.0);
        check_shape("mistralai/Mixtral-8x22B-Instruct-v0.1", 140.6, 39.1, 2.0);
        // Weight-only and 4-bit checkpoints read fewer bytes and multiply in BF16.
        let shape = |name: &str| {
            let s = ModelShape::from_name(name);
            (s.total_params / 1e9, s.active_params / 1e9, s.bytes_per_param, s.fp8_compute)
        };
        assert_eq!(shape("Qwen/Qwen3-8B-FP8"), (8.0, 8.0, 1.0, true));
        assert_eq!(shape("neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w8a8"), (8.0, 8.0, 1.0, true));
        assert_eq!(shape("Qwen/Qwen2.5-72B-Instruct-AWQ"), (72.0, 72.0, FOUR_BIT_BYTES, false));
        assert_eq!(shape("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4"), (7.0, 7.0, FOUR_BIT_BYTES, false));
        assert_eq!(shape("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8"), (7.0, 7.0, 1.0, false));
        assert_eq!(shape("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16"), (8.0, 8.0, FOUR_BIT_BYTES, false));
        assert_eq!(shape("nvidia/Llama-3.3-70B-Instruct-FP4"), (70.0, 70.0, FOUR_BIT_BYTES, false));
        assert_eq!(shape("Qwen/Qwen3-8B"), (8.0, 8.0, 2.0, false));
        // gpt-oss: MXFP4 experts beside BF16 attention, a few billion parameters active.
        assert_eq!(shape("openai/gpt-oss-120b"), (116.8, 5.1, 0.56, false));
        assert_eq!(shape("openai/gpt-oss-20b"), (20.9, 3.6, 0.66, false));
        // Llama 4's `17B` is its active parameters.
        assert_eq!(shape("meta-llama/Llama-4-Scout-17B-16E-Instruct"), (109.0, 17.0, 2.0, false));
        assert_eq!(shape("meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"), (400.0, 17.0, 1.0, true));
        // A size in the name is the name's: R1's distillations are dense.
        check_shape("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 7.0, 7.0, 2.0);
        // Millions, as small models write them.
        check_shape("google/gemma-3-270m-it", 0.27, 0.27, 2.0);
        check_shape("HuggingFaceTB/SmolLM2-135M-Instruct", 0.135, 0.135, 2.0);
        // Families whose names carry no size; a start names a model only where the name goes on
        // with no letter or digit, the longer starts first.
        assert_eq!(shape("moonshotai/Kimi-K2-Instruct-0905"), (1040.0, 32.0, 1.0, true));
        assert_eq!(shape("moonshotai/Kimi-K2-Thinking"), (1040.0, 32.0, 0.57, false));
        assert_eq!(shape("zai-org/GLM-4.5-Air"), (106.0, 12.0, 2.0, false));
        assert_eq!(shape("zai-org/GLM-4.5-Air-FP8"), (106.0, 12.0, 1.0, true));
        assert_eq!(shape("zai-org/GLM-4.6"), (355.0, 32.0, 2.0, false));
        assert_eq!(shape("zai-org/GLM-4.6-FP8"), (355.0, 32.0, 1.0, true));
        assert_eq!(shape("MiniMaxAI/MiniMax-M2.1"), (230.0, 10.0, 1.0, true));
        assert_eq!(shape("microsoft/phi-4"), (14.7, 14.7, 2.0, false));
        assert_eq!(shape("microsoft/Phi-4-mini-instruct"), (3.8, 3.8, 2.0, false));
        assert_eq!(shape("microsoft/Phi-4-multimodal-instruct"), (5.6, 5.6, 2.0, false));
        assert!(ModelShape::from_name("microsoft/Phi-4-multimodal-instruct").multimodal);
        // GLM-4.6V (a vision model of another size) is not GLM-4.6: its size is guessed.
        let guessed = |name: &str| ModelShape::from_name(name).size_guessed;
        assert!(guessed("zai-org/GLM-4.6V") && guessed("m") && guessed("vllm-test-model"));
        assert!(!guessed("zai-org/GLM-4.6") && !guessed("Qwen/Qwen3-8B") && !guessed("deepseek-ai/DeepSeek-V3.1"));
        assert!(
            ModelShape::from_name("Qwen/Qwen3.5-9B").hybrid && ModelShape::from_name("Qwen/Qwen3-Next-80B-A3B").hybrid
        );
        assert!(!ModelShape::from_name("Qwen/Qwen3-8B").hybrid && !ModelShape::from_name("m").hybrid);
        // The linear-attention layers of the architectures known; others keep the fitted state.
        let layers = |name: &str| ModelShape::from_name(name).linear_layers;
        assert_eq!(layers("Qwen/Qwen3.5-9B-FP8"), Some(24));
        assert_eq!(layers("Qwen/Qwen3.5-35B-A3B-FP8"), Some(30));
        assert_eq!(layers("Qwen/Qwen3-Next-80B-A3B-Instruct"), Some(36));
        assert_eq!(layers("Qwen/Qwen3.5-27B"), Some(48));
        assert_eq!((layers("Qwen/Qwen3.5-122B-A10B"), layers("Qwen/Qwen3-8B")), (None, None));
        let (nine, moe) = (model("Qwen/Qwen3.5-9B", "H100"), model("Qwen/Qwen3.5-35B-A3B", "H200"));
        assert!((nine.state_bytes() / 1e6 - 51.5).abs() < 0.1 && (moe.state_bytes() / 1e6 - 64.4).abs() < 0.1);
        // The 27B's layers keep 48 value heads' matrices and a window of 80 heads' channels.
        let dense = model("Qwen/Qwen3.5-27B", "H100");
        assert_eq!(dense.state_bytes(), 48.0 * (48.0 * 128.0 * 128.0 * 4.0 + 3.0 * 80.0 * 128.0 * 2.0));
        let fitted = model("Qwen/Qwen3.5-122B-A10B", "H100");
        assert_eq!(fitted.state_bytes(), fitted.state_step_bytes());
        assert_eq!(fitted.state_tensor_bytes(), fitted.state_step_bytes());
        // A copy of a known architecture's states moves them unpadded, in the types they are kept in.
        let mut padded = moe;
        padded.state_layer_page = 4.0e6;
        assert_eq!(padded.state_tensor_bytes(), 30.0 * StateTypes::default().layer_bytes(32));
        padded.state_types.matrices_16bit = true;
        let halved = 30.0 * StateTypes { matrices_16bit: true, conv_fp32: false }.layer_bytes(32);
        assert_eq!(padded.state_tensor_bytes(), halved);
        let dense_8b = model("Qwen/Qwen3-8B", "H100");
        assert_eq!((dense_8b.state_bytes(), dense_8b.state_tensor_bytes()), (0.0, 0.0));
    }

    #[test]
    fn a_known_transformers_kv_bytes_and_attention_flops_are_its_architectures() {
        let kib = |name: &str, tp: u32| ModelShape::from_name(name).kv_bytes_per_token_bf16(tp) / 1024.0;
        // Layers x KV heads x head size x key and value x 2 bytes.
        assert_eq!(kib("meta-llama/Llama-3.1-8B-Instruct", 1), 128.0);
        assert_eq!(kib("meta-llama/Meta-Llama-3.1-70B-Instruct", 1), 320.0);
        assert_eq!(kib("meta-llama/Llama-3.2-1B-Instruct", 1), 32.0);
        assert_eq!(kib("Qwen/Qwen3-8B", 1), 144.0);
        assert_eq!(kib("Qwen/Qwen3-0.6B", 1), 112.0);
        assert_eq!(kib("Qwen/Qwen3-30B-A3B", 1), 96.0);
        assert_eq!(kib("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", 1), 188.0);
        assert_eq!(kib("Qwen/Qwen2.5-7B-Instruct", 1), 56.0);
        assert_eq!(kib("Qwen/Qwen2.5-VL-7B-Instruct", 1), 56.0);
        assert_eq!(kib("mistralai/Mistral-7B-Instruct-v0.3", 1), 128.0);
        assert_eq!(kib("mistralai/Mixtral-8x7B-Instruct-v0.1", 1), 128.0);
        // gpt-oss's full-attention layers: 18 of 8 KV heads of 64 (its sliding ones left out).
        assert_eq!(kib("openai/gpt-oss-120b", 1), 36.0);
        assert_eq!(kib("openai/gpt-oss-20b", 1), 24.0);
        assert_eq!(kib("mistralai/Mixtral-8x22B-Instruct-v0.1", 1), 224.0);
        // Gemma 3 27B: the 10 of its 62 layers that attend to the whole context; the other 52
        // keep a window of 1024 tokens, 416 KiB a token.
        assert_eq!(kib("google/gemma-3-27b-it", 1), 80.0);
        let window = |name: &str| ModelShape::from_name(name).transformer.and_then(|a| a.window_cost(1));
        let gemma = window("google/gemma-3-27b-it").expect("a window");
        assert_eq!((gemma.tokens, gemma.bytes_per_token / 1024.0), (1024, 416.0));
        assert_eq!(gemma.flops_per_pair, 2.0 * 52.0 * 32.0 * 256.0);
        assert_eq!(window("google/gemma-3-1b-it").map(|w| w.tokens), Some(512));
        assert_eq!(window("openai/gpt-oss-120b").map(|w| (w.tokens, w.bytes_per_token)), Some((128, 36.0 * 1024.0)));
        assert_eq!(window("meta-llama/Llama-3.1-8B-Instruct"), None);
        assert_eq!(kib("meta-llama/Llama-4-Scout-17B-16E-Instruct", 1), 48.0);
        assert_eq!(window("meta-llama/Llama-4-Scout-17B-16E-Instruct").map(|w| w.tokens), Some(8192));
        // DeepSeek's latent attention caches 576 elements a layer, 61 layers, on every rank.
        assert_eq!(kib("deepseek-ai/DeepSeek-R1-0528", 1), 61.0 * 576.0 * 2.0 / 1024.0);
        assert_eq!(kib("deepseek-ai/DeepSeek-V3", 8), 8.0 * 61.0 * 576.0 * 2.0 / 1024.0);
        // Kimi K2's too (its 64 query heads show in its FLOPs, below); GLM-4.5's and 4.6's 92
        // layers of 8 KV heads, the Air's 46; MiniMax-M2's 62; Phi-4's 40 of 10.
        assert_eq!(kib("moonshotai/Kimi-K2-Instruct", 1), 61.0 * 576.0 * 2.0 / 1024.0);
        assert_eq!(kib("zai-org/GLM-4.6", 1), 92.0 * 8.0 * 256.0 * 2.0 / 1024.0);
        assert_eq!(kib("zai-org/GLM-4.5-Air-FP8", 1), 46.0 * 8.0 * 256.0 * 2.0 / 1024.0);
        assert_eq!(kib("MiniMaxAI/MiniMax-M2", 1), 62.0 * 8.0 * 256.0 * 2.0 / 1024.0);
        assert_eq!(kib("microsoft/phi-4", 1), 40.0 * 10.0 * 256.0 * 2.0 / 1024.0);
        assert_eq!(kib("microsoft/Phi-4-mini-instruct", 1), 32.0 * 8.0 * 256.0 * 2.0 / 1024.0);
        // Ranks beyond the KV heads hold a copy each: Qwen3-235B-A22B's 4 on 8 GPUs are 8.
        assert_eq!(kib("Qwen/Qwen3-235B-A22B", 4), 188.0);
        assert_eq!(kib("Qwen/Qwen3-235B-A22B", 8), 376.0);
        // The startup log says which models' KV is estimated.
        assert_eq!(ModelShape::from_name("Qwen/Qwen3-8B").estimated_kv(), None);
        assert_eq!(ModelShape::from_name("Qwen/Qwen3.5-9B").estimated_kv(), None);
        let granite = ModelShape::from_name("ibm-granite/granite-3.1-8b-instruct").estimated_kv().expect("estimated");
        assert!(granite.contains("taken as 136 KiB a token (BF16), by its 8.0B active"), "{granite}");
        let hybrid = ModelShape::from_name("Qwen/Qwen3.5-122B-A10B").estimated_kv().expect("estimated");
        assert!(hybrid.starts_with("a hybrid model whose architecture"), "{hybrid}");
        // A transformer the simulator does not know (Gemma 3's sliding window, DeepSeek's latent
        // attention, a size the family lacks) takes the rule by its active parameters.
        let rule = |b: f64| TRANSFORMER_KV_BYTES_PER_SQRT_B * b.sqrt() / 1024.0;
        assert_eq!(kib("ibm-granite/granite-3.1-8b-instruct", 1), rule(8.0));
        assert_eq!(kib("google/gemma-3-270m-it", 1), rule(0.27));
        assert_eq!(kib("Qwen/Qwen3-30B-A6B", 1), rule(6.0));
        assert_eq!(kib("meta-llama/Llama-3.2-11B-Vision-Instruct", 1), rule(11.0));
        assert_eq!(kib("deepseek-ai/DeepSeek-V3.2-Exp", 1), rule(37.0));
        assert_eq!(kib("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", 1), rule(7.0));
        // A hybrid model's stay fitted, whatever the tensor-parallel size.
        let fitted = COEFFICIENTS.kv_bytes_per_token_per_sqrt_b * 3.0 / 1024.0;
        assert_eq!(kib("Qwen/Qwen3.5-9B", 1), fitted);
        assert_eq!(kib("Qwen/Qwen3.5-9B", 4), fitted);
        assert_eq!(ModelShape::from_name("Qwen/Qwen3-Next-80B-A3B-Instruct").transformer, None);

        // Attention FLOPs a (query, context) pair: 4 x layers x query heads x head size.
        let flops = |name: &str| ModelShape::from_name(name).attention_flops_per_pair(&COEFFICIENTS);
        assert_eq!(flops("meta-llama/Llama-3.1-8B"), 4.0 * 32.0 * 32.0 * 128.0);
        assert_eq!(flops("Qwen/Qwen3-235B-A22B"), 4.0 * 94.0 * 64.0 * 128.0);
        // DeepSeek's prefill: 128 heads' keys of 192 and values of 128.
        assert_eq!(flops("deepseek-ai/DeepSeek-V3"), 2.0 * 61.0 * 128.0 * 320.0);
        assert_eq!(flops("moonshotai/Kimi-K2-Instruct"), 2.0 * 61.0 * 64.0 * 320.0);
        assert_eq!(flops("zai-org/GLM-4.5"), 4.0 * 92.0 * 96.0 * 128.0);
        let hybrid = ModelShape::from_name("Qwen/Qwen3.5-9B");
        assert_eq!(
            flops("Qwen/Qwen3.5-9B"),
            COEFFICIENTS.attention_flops_per_kv_byte * hybrid.kv_bytes_per_token_bf16(1)
        );
    }

    #[test]
    fn a_transformers_decode_at_long_context_is_bound_by_its_kv_cache() {
        // Llama-3.1-8B decoding 256 sequences of 2048 tokens reads 256 x 2048 x 128 KiB = 69 GB of
        // KV cache a step, four times its 16 GB of weights; an FP8 cache halves the read.
        let mut m = model("meta-llama/Llama-3.1-8B-Instruct", "H100");
        let work = StepWork { decode_tokens: 256, decode_context_tokens: 256 * 2048, ..Default::default() };
        let parts = m.step_parts(&work);
        let bandwidth = m.gpu.bandwidth * COEFFICIENTS.bandwidth_efficiency;
        let kv = 256.0 * 2048.0 * 128.0 * 1024.0 / bandwidth;
        assert!((parts.attention - kv).abs() < 1e-9, "{parts:?}");
        assert!(parts.attention > 4.0 * parts.memory, "{parts:?}");
        m.kv_bytes_per_token /= 2.0;
        m.kv_fp8 = true;
        assert!((m.step_parts(&work).attention - kv / 2.0).abs() < 1e-9);
        // And costs nothing more: the fitted FP8 cache cost is a hybrid model's.
        assert_eq!(m.step_parts(&work).extras, parts.extras);
        let mut hybrid = model("Qwen/Qwen3.5-9B", "H100");
        let plain = hybrid.step_parts(&work).extras;
        hybrid.kv_fp8 = true;
        let extra = hybrid.step_parts(&work).extras - plain;
        assert!((extra - COEFFICIENTS.kv_fp8_dequant_cost * 256.0 * 2048.0).abs() < 1e-12, "{extra}");
    }

    #[test]
    fn a_sliding_window_layer_reads_only_its_window() {
        // Gemma 3 27B decoding at 4096 tokens: its 10 whole-context layers read them all, its 52
        // windowed ones the last 1024.
        let m = model("google/gemma-3-27b-it", "H100");
        let work = StepWork {
            decode_tokens: 1,
            decode_context_tokens: 4096,
            decode_window_tokens: 1024,
            ..Default::default()
        };
        let bandwidth = m.gpu.bandwidth * COEFFICIENTS.bandwidth_efficiency;
        let bytes = (4096.0 * 80.0 + 1024.0 * 416.0) * 1024.0;
        assert!((m.step_parts(&work).attention - bytes / bandwidth).abs() < 1e-12);
        // A sequence holds its window's blocks beside its tokens': at most the window and a block.
        assert_eq!(m.window_blocks(160), (160.0_f64 * 5.2 / 16.0).ceil() as usize);
        assert_eq!(m.window_blocks(4096), m.window_blocks(20_000));
        assert_eq!(m.window_blocks(4096), (1040.0_f64 * 5.2 / 16.0).ceil() as usize);
        assert_eq!(model("meta-llama/Llama-3.1-8B-Instruct", "H100").window_blocks(4096), 0);
    }

    #[test]
    fn weight_only_checkpoints_read_fewer_bytes_and_compute_as_bf16() {
        let (bf16, awq, fp8) = (
            model("Qwen/Qwen2.5-7B-Instruct", "H100"),
            model("Qwen/Qwen2.5-7B-Instruct-AWQ", "H100"),
            model("Qwen/Qwen2.5-7B-Instruct-FP8", "H100"),
        );
        // A large prefill is bound by its FLOPs: AWQ's dequantised weights multiply at BF16's
        // rate, FP8's faster.
        let prefill = StepWork { prefill_tokens: 8192, ..Default::default() };
        assert_eq!(awq.step_parts(&prefill).compute, bf16.step_parts(&prefill).compute);
        assert!(fp8.step_parts(&prefill).compute < bf16.step_parts(&prefill).compute);
        // A decode is bound by the weights' read: a quarter of BF16's, and some scales.
        let decode = StepWork { decode_tokens: 1, decode_context_tokens: 100, ..Default::default() };
        let ratio = awq.step_parts(&decode).memory / bf16.step_parts(&decode).memory;
        assert!((ratio - FOUR_BIT_BYTES / 2.0).abs() < 1e-12, "{ratio}");
    }

    #[test]
    fn a_step_past_the_graphs_launches_each_layer_and_a_mixture_of_experts_more() {
        let layers = |name: &str| ModelShape::from_name(name).layers();
        // Qwen3.5: three linear-attention layers to one attention layer.
        assert_eq!(layers("Qwen/Qwen3.5-9B"), 32.0);
        assert_eq!(layers("Qwen/Qwen3.5-27B"), 64.0);
        assert_eq!(layers("Qwen/Qwen3.5-35B-A3B-FP8"), 40.0);
        assert_eq!(layers("Qwen/Qwen3-Next-80B-A3B-Instruct"), 48.0);
        // A known transformer's, its windowed layers too; another's by its size.
        assert_eq!(layers("meta-llama/Llama-3.1-70B-Instruct"), 80.0);
        assert_eq!(layers("google/gemma-3-27b-it"), 62.0);
        assert_eq!(layers("openai/gpt-oss-120b"), 36.0);
        assert_eq!(layers("some/model-8B"), 32.0);
        assert_eq!(layers("some/model-64B"), 64.0);
        // Past its graphs, a step launches its layers' kernels; a mixture of experts' cost more.
        let eager = |name: &str| {
            let m = model(name, "H200");
            let work = StepWork { prefill_tokens: 2048, decode_tokens: 100, ..Default::default() };
            m.step_parts(&work).overhead - m.engine.step_overhead
        };
        let c = COEFFICIENTS;
        assert!((eager("Qwen/Qwen3.5-9B") - 32.0 * c.eager_layer_overhead).abs() < 1e-15);
        let moe = 40.0 * (c.eager_layer_overhead + c.eager_moe_layer_overhead);
        assert!((eager("Qwen/Qwen3.5-35B-A3B") - moe).abs() < 1e-15);
        assert!(c.eager_moe_layer_overhead > 0.0);
    }

    #[test]
    fn gpus_by_name() {
        assert_eq!(gpu("h100").map(|g| g.name), Some("H100"));
        assert_eq!(gpu("NVIDIA H200").map(|g| g.name), Some("H200"));
        assert_eq!(gpu("A100"), None);
    }

    fn model(name: &str, gpu_name: &str) -> CostModel {
        let model = ModelShape::from_name(name);
        CostModel {
            coefficients: COEFFICIENTS,
            gpu: gpu(gpu_name).expect("known gpu"),
            model,
            engine: EngineCosts::of(&COEFFICIENTS, EngineKind::Vllm, None, model.hybrid),
            tensor_parallel: 1.0,
            kv_bytes_per_token: model.kv_bytes_per_token_bf16(1),
            kv_fp8: false,
            hybrid_prefix_caching: false,
            multimodal_inputs: true,
            graphs: Graphs::Tokens(512),
            state_types: StateTypes::default(),
            state_layer_page: 0.0,
            window: model.transformer.and_then(|a| a.window_cost(1)),
            chunked_decode_states: true,
        }
    }

    #[test]
    fn decode_is_memory_bound_and_grows_with_batch() {
        let m = model("Qwen/Qwen3.5-9B", "H100");
        let decode = |n: usize| {
            m.step_time(&StepWork { decode_tokens: n, decode_context_tokens: n * 600, ..Default::default() })
        };
        let one = decode(1).as_secs_f64();
        // 18 GB of weights at most at 3.35 TB/s (5.4 ms), plus the engine's overheads: 6 to 9 ms.
        assert!((0.006..0.009).contains(&one), "{one}");
        assert!(decode(64) > decode(8) && decode(512) > decode(64));
        // H200's faster memory makes the same step shorter.
        let h200 = model("Qwen/Qwen3.5-9B", "H200").step_time(&StepWork { decode_tokens: 1, ..Default::default() });
        assert!(
            h200 < decode(1),
            "{h200:?} on an H200, {:?} on an H100 {:?}",
            decode(1),
            m.step_parts(&StepWork { decode_tokens: 1, ..Default::default() })
        );
    }

    #[test]
    fn cpu_work_overlaps_the_gpu_and_mixed_steps_cost_more_per_token() {
        let mut m = model("Qwen/Qwen3.5-9B", "H100");
        let decode = StepWork { decode_tokens: 256, decode_context_tokens: 256 * 600, ..Default::default() };
        let parts = m.step_parts(&decode);
        let (cpu, gpu) = (parts.overhead + parts.tokens, parts.gpu());
        // Fully overlapped, the step takes the longer side; not at all, both.
        m.engine.overlap = 1.0;
        assert!((m.step_parts(&decode).total() - cpu.max(gpu)).abs() < 1e-12);
        m.engine.overlap = 0.0;
        assert!((m.step_parts(&decode).total() - (cpu + gpu)).abs() < 1e-12);
        // The same decodes beside a prefill chunk pay the mixed step's per-token cost.
        m.engine.mixed_token_factor = 2.0;
        let mixed = m.step_parts(&StepWork { prefill_tokens: 512, ..decode });
        assert!((mixed.tokens - 2.0 * parts.tokens).abs() < 1e-12, "{} vs {}", mixed.tokens, parts.tokens);
    }

    #[test]
    fn a_mixed_step_reads_its_decodes_kv_and_state_after_the_prefills_compute() {
        let m = model("Qwen/Qwen3.5-9B", "H100");
        let prefill = StepWork { prefill_tokens: 7680, prefill_attention_pairs: 7680.0 * 512.0, ..Default::default() };
        let decodes = StepWork { decode_tokens: 512, decode_context_tokens: 512 * 1100, ..Default::default() };
        let mixed = StepWork {
            prefill_tokens: prefill.prefill_tokens,
            prefill_attention_pairs: prefill.prefill_attention_pairs,
            ..decodes
        };
        let (alone, beside) = (m.step_parts(&prefill), m.step_parts(&mixed));
        // The prefill's linear layers are bound by their FLOPs, which hide the weights' read...
        assert!(alone.compute > alone.memory, "{alone:?}");
        // ...but not the decodes' KV cache and recurrent state, read by kernels of their own.
        let reads = m.step_parts(&decodes).attention;
        let bandwidth = m.gpu.bandwidth * COEFFICIENTS.bandwidth_efficiency;
        let bytes = m.kv_bytes_per_token * decodes.decode_context_tokens as f64 + 2.0 * m.state_step_bytes() * 512.0;
        assert!((reads - bytes / bandwidth).abs() < 1e-9, "{reads} s for {bytes} bytes");
        assert!(beside.gpu() - alone.gpu() >= reads, "{beside:?} against {alone:?}: the decodes' {reads} s hidden");
    }

    #[test]
    fn a_vllm_step_that_prefills_runs_its_decodes_states_through_the_chunked_kernels() {
        // FP32 states: gathered (a read and a write), read by the kernel, a BF16 snapshot written
        // and read (half a state each), the final state written, scattered back: 7 to a decode's 2.
        assert_eq!(StateTypes::default().chunked_passes(), 3.5);
        // 16-bit states: the snapshot is a state's size, the final FP32 state twice it, cast back.
        assert_eq!(StateTypes { matrices_16bit: true, conv_fp32: false }.chunked_passes(), 6.0);
        let mut m = model("Qwen/Qwen3.5-9B", "H100");
        let decodes = StepWork { decode_tokens: 512, decode_context_tokens: 512 * 1100, ..Default::default() };
        let mixed = StepWork { prefill_tokens: 1024, ..decodes };
        let bandwidth = m.gpu.bandwidth * COEFFICIENTS.bandwidth_efficiency;
        // The extra passes move the state tensors themselves: the architecture's 24 layers, not
        // the fitted bytes a decode moves.
        assert_eq!(m.state_tensor_bytes(), 24.0 * StateTypes::default().layer_bytes(32));
        assert_ne!(m.state_tensor_bytes(), m.state_step_bytes());
        let state = 2.0 * m.state_tensor_bytes() * 512.0 / bandwidth;
        // A chunk through the chunked kernels; the prefill's 1024 tokens fill 16 of them.
        let chunk = m.linear_attention_chunk_flops() / (m.gpu.bf16_flops * COEFFICIENTS.linear_attention_efficiency);
        let prefill_chunks = 16.0 * chunk;
        let attention = |m: &CostModel, work: &StepWork| m.step_parts(work).attention;
        let extra = attention(&m, &mixed) - attention(&m, &decodes);
        // Each decode is also a chunk of its own, padded.
        let expected = 2.5 * state + prefill_chunks + 512.0 * chunk;
        assert!((extra - expected).abs() < 1e-9, "{extra} s beside a prefill, against {expected} s");
        // Sequences with drafts take the decode kernel beside a prefill too.
        let drafted = StepWork { decode_tokens: 1024, draft_tokens: 1, ..decodes };
        let drafted_mixed = StepWork { prefill_tokens: 1024, ..drafted };
        let extra = attention(&m, &drafted_mixed) - attention(&m, &drafted);
        assert!((extra - prefill_chunks).abs() < 1e-12, "{extra} s against the prefill's {prefill_chunks} s");
        // Where decodes never take that path (SGLang), a prefill adds only its own chunks.
        m.chunked_decode_states = false;
        let extra = attention(&m, &mixed) - attention(&m, &decodes);
        assert!((extra - prefill_chunks).abs() < 1e-12, "{extra} s against the prefill's {prefill_chunks} s");
    }

    #[test]
    fn a_hybrid_models_linear_attention_chunks_cost_their_flops() {
        // Five 64 x 64 x 128 products, three 64 x 128 x 128 ones and a 64 x 64 triangular solve.
        assert!((CHUNK_FLOPS_PER_VALUE_HEAD - 11_709_098.67).abs() < 0.01, "{CHUNK_FLOPS_PER_VALUE_HEAD}");
        // Every value head of every linear-attention layer, where the architecture is known.
        let nine = model("Qwen/Qwen3.5-9B", "H100");
        assert_eq!(nine.linear_attention_chunk_flops(), 24.0 * 32.0 * CHUNK_FLOPS_PER_VALUE_HEAD);
        let moe = model("Qwen/Qwen3.5-35B-A3B", "H200");
        assert_eq!(moe.linear_attention_chunk_flops(), 30.0 * 32.0 * CHUNK_FLOPS_PER_VALUE_HEAD);
        // Else as many heads as the fitted state holds FP32 matrices.
        let unknown = model("Qwen/Qwen3.5-122B-A10B", "H200");
        assert_eq!(unknown.model.linear_layers, None);
        let state = COEFFICIENTS.state_bytes_per_sqrt_b * 122f64.sqrt();
        let heads = state / (128.0 * 128.0 * 4.0);
        assert!((unknown.linear_attention_chunk_flops() / CHUNK_FLOPS_PER_VALUE_HEAD - heads).abs() < 1e-9);
        // A transformer has none, so its prefill costs only its attention and linear layers.
        let dense = model("Qwen/Qwen3-8B", "H100");
        assert_eq!(dense.linear_attention_chunk_flops(), 0.0);
        // A prefill of 8192 tokens runs 128 chunks.
        let prefill = StepWork { prefill_tokens: 8192, ..Default::default() };
        let with = nine.step_parts(&prefill).attention;
        let chunks = 128.0 * nine.linear_attention_chunk_flops()
            / (nine.gpu.bf16_flops * COEFFICIENTS.linear_attention_efficiency);
        let mut without = nine;
        without.coefficients.linear_attention_efficiency = f64::INFINITY;
        assert!((with - without.step_parts(&prefill).attention - chunks).abs() < 1e-12);
    }

    #[test]
    fn prefill_is_compute_bound_and_fp8_weights_help() {
        let work = StepWork { prefill_tokens: 8192, prefill_attention_pairs: 8192.0 * 4096.0, ..Default::default() };
        let bf16 = model("Qwen/Qwen3.5-35B-A3B", "H200").step_time(&work);
        let fp8 = model("Qwen/Qwen3.5-35B-A3B-FP8", "H200").step_time(&work);
        assert!(fp8 < bf16, "{fp8:?} < {bf16:?}");
        // A mixture of experts reads only the experts its tokens use: one token touches few of them.
        let moe = model("Qwen/Qwen3.5-35B-A3B", "H200");
        assert!(moe.weights_touched(1.0) < 0.2 * moe.model.weight_bytes());
        assert!(moe.weights_touched(256.0) > 0.99 * moe.model.weight_bytes());
    }
}
