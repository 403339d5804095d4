//! The engine model: a pure, deterministic continuous-batching scheduler that plans one step at a time.
//!
//! No clock and no I/O: [`Scheduler::step`] plans a step, applies it, and
//! returns how long the GPU would take and which tokens came out. The HTTP
//! server drives it in real time (`engine`), sleeping until each step's
//! deadline; [`crate::simulate`] drives it in virtual time, so a benchmark of
//! a thousand requests runs in milliseconds. Both see the same behaviour.
//!
//! A step, as vLLM's V1 scheduler does it:
//!
//! 1. running sequences first, in admission order: a decoding sequence takes
//!    `1 + k` tokens of the step's budget (`k` draft tokens with speculative
//!    decoding) and KV blocks for them; when the KV cache is full the most
//!    recently admitted sequence is preempted (its blocks freed, its prompt and
//!    output recomputed later); a sequence still in prefill takes the next chunk;
//! 2. then waiting requests, first come first served, while the batch has fewer
//!    than `max_num_seqs` sequences, budget is left, and the KV cache can hold
//!    the whole prompt: a request waits when it is full. Prompt blocks found in
//!    the prefix cache are not computed again;
//!    SGLang (unless `--enable-mixed-chunk`) plans the two apart: a step that can
//!    prefill (a chunk left of a prompt, or a waiting request that fits) does
//!    only that, and the running sequences decode in a step of their own when
//!    nothing can be prefilled ([`Limits::mixed`]);
//! 3. the step's duration is [`CostModel::step_time`] of the planned work; a
//!    sequence whose prefill completes samples its first token in that step, a
//!    decoding one emits one token plus the accepted draft tokens.
//!
//! Output always runs to `max_tokens`: the simulator never samples an end of
//! sequence (so `ignore_eos` and `min_tokens` change nothing).

use std::{collections::VecDeque, time::Duration};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{
    config::{EngineKind, SimConfig},
    kv::{BLOCK_TOKENS, KvCache, blocks_for},
    profile::{self, CostModel, Graphs, StepWork},
};

/// What the scheduler needs to know about a request.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqRequest {
    /// Chosen by the caller, unique among live requests.
    pub id: u64,
    pub prompt_tokens: usize,
    /// One hash per full [`BLOCK_TOKENS`] block of the prompt, each covering the whole prefix up to
    /// it, then those of the blocks its reply fills where the caller knows the reply's tokens (the
    /// server does: it names them as a later prompt that carries the reply would). vLLM caches
    /// both as it computes them, so a conversation's next turn finds the last turn's reply.
    pub block_hashes: Vec<u64>,
    pub max_tokens: usize,
    /// Seeds the draws of accepted draft tokens, so a request repeats.
    pub seed: u64,
}

/// Scheduler limits: `--max-num-seqs` and `--max-num-batched-tokens`, and how a step is composed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Whether a step decodes the running sequences beside its prefill chunks (vLLM's, and
    /// SGLang's with `--enable-mixed-chunk`), or prefills alone whenever it has a prompt to
    /// prefill, the running sequences decoding in the steps between (SGLang's default).
    pub mixed: bool,
}

/// Speculative decoding: `tokens` drafts per step, each accepted with `acceptance` if the ones before it were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speculation {
    pub tokens: usize,
    pub acceptance: f64,
    /// vLLM drafting from the model's hidden states (EAGLE, EAGLE3, MTP) recomputes the last block
    /// of a cached prefix for them: prefix caching drops the last block it finds
    /// (`FullAttentionManager.find_longest_cache_hit`).
    pub drops_cached_block: bool,
}

/// Tokens a request got from one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emission {
    pub id: u64,
    pub tokens: usize,
    pub finished: bool,
    /// The request failed with the engine's error ([`Scheduler::FAILURE`]); it emits nothing more.
    pub failed: bool,
}

/// One planned and applied step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub duration: Duration,
    pub emissions: Vec<Emission>,
    pub work: StepWork,
}

/// Monotonic counters, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache, and those found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub steps: u64,
}

impl std::ops::AddAssign for Counters {
    /// Two replicas' counters as one engine's.
    fn add_assign(&mut self, other: Counters) {
        self.prompt_tokens += other.prompt_tokens;
        self.generation_tokens += other.generation_tokens;
        self.prefix_cache_queries += other.prefix_cache_queries;
        self.prefix_cache_hits += other.prefix_cache_hits;
        self.preemptions += other.preemptions;
        self.finished += other.finished;
        self.steps += other.steps;
    }
}

#[derive(Debug)]
struct Seq {
    request: SeqRequest,
    /// Tokens whose KV must be computed before decoding: the prompt, plus the output after a preemption.
    target: usize,
    computed: usize,
    generated: usize,
    /// Anonymous KV blocks held, and shared (hashed) blocks referenced: the prompt's full blocks,
    /// then its reply's as they fill ([`SeqRequest::block_hashes`]).
    anonymous: usize,
    hashed: Vec<u64>,
    /// Blocks after which vLLM's `align` mode saved the sequence's state as a prefill chunk ended
    /// on a block boundary ([`AlignedChunks`]); marked in the cache as its blocks are registered.
    saved_states: Vec<usize>,
    rng: ChaCha8Rng,
}

impl Seq {
    fn decoding(&self) -> bool {
        self.computed >= self.target
    }

    fn blocks(&self) -> usize {
        self.anonymous + self.hashed.len()
    }
}

#[derive(Debug)]
pub struct Scheduler {
    cost: CostModel,
    limits: Limits,
    speculation: Option<Speculation>,
    kv: KvCache,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    counters: Counters,
    /// `--sim-spec-failure-batch`, and whether a step has passed it.
    spec_failure_batch: Option<usize>,
    spec_state_corrupt: bool,
    /// `--sim-step-jitter-pct` as a log-normal sigma, and its generator.
    jitter: Option<(f64, ChaCha8Rng)>,
    /// KV blocks a running sequence's recurrent state takes (a hybrid model's), held while it runs.
    state_blocks: usize,
    /// The engine's block in [`BLOCK_TOKENS`] blocks (vLLM's `--block-size` over 16): a sequence
    /// holds whole blocks of it, and only whole ones are cached and shared.
    page_blocks: usize,
    /// SGLang's `--max-total-tokens`, when given: its token pool's size, which bounds a request.
    token_pool: Option<usize>,
    /// vLLM caching a hybrid model's prefixes: prompts are prefilled in whole blocks.
    aligned: Option<AlignedChunks>,
}

/// vLLM's `align` mode of prefix caching on a hybrid model (`mamba_cache_mode`, its mode for
/// Qwen3.5 and Qwen3-Next, whose states it can save only where a step ends): a chunk that does not
/// finish a prompt is cut to whole blocks, and one that passes the prompt's last block boundary
/// ends there, so the state there is saved (`_mamba_block_aligned_split`). A chunk cut to nothing
/// waits: a running sequence for the next step, a waiting request with every one behind it.
#[derive(Debug, Clone, Copy)]
struct AlignedChunks {
    /// The block, tokens ([`crate::profile::HybridBlock::tokens`]).
    block: usize,
}

impl AlignedChunks {
    /// The chunk, of at most `chunk` tokens, that a sequence of `target` tokens with `computed`
    /// of them prefilled takes. With `drops_cached_block` ([`Speculation::drops_cached_block`])
    /// the last boundary that counts is one block earlier.
    fn cut(self, target: usize, computed: usize, chunk: usize, drops_cached_block: bool) -> usize {
        let mut last = target - target % self.block;
        if drops_cached_block {
            last = last.saturating_sub(self.block);
        }
        if computed + chunk < last {
            chunk - chunk % self.block
        } else if computed < last && last < computed + chunk {
            last - computed
        } else {
            chunk
        }
    }
}

/// KV blocks a sequence of `tokens` holds: its tokens' in whole engine blocks of `page_blocks`,
/// for a hybrid model its state's `state_blocks`, and for a model with sliding-window layers
/// their window's ([`CostModel::window_blocks`]).
fn held_blocks(cost: &CostModel, tokens: usize, page_blocks: usize, state_blocks: usize) -> usize {
    blocks_for(tokens).next_multiple_of(page_blocks) + state_blocks + cost.window_blocks(tokens)
}

/// `blocks` less a partial engine block of `page_blocks`: what prefix caching finds and shares.
fn whole_pages(blocks: usize, page_blocks: usize) -> usize {
    blocks - blocks % page_blocks
}

/// A standard normal from two uniforms (Box-Muller).
pub(crate) fn standard_normal(rng: &mut impl Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

impl Scheduler {
    /// What a request fails with once speculative decoding's state is corrupt (`--sim-spec-failure-batch`).
    pub const FAILURE: &str = "EngineCore encountered an issue: the speculative decoding state is corrupt after the batch passed its size (--sim-spec-failure-batch)";

    /// A scheduler over `kv`, a running sequence's state taking `state_blocks` of it besides its
    /// tokens (vLLM's; 0 where the states keep a pool of their own, as SGLang's do).
    pub fn new(
        cost: CostModel,
        limits: Limits,
        speculation: Option<Speculation>,
        kv: KvCache,
        state_blocks: usize,
    ) -> Scheduler {
        Scheduler {
            cost,
            limits,
            speculation,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
            spec_failure_batch: None,
            spec_state_corrupt: false,
            jitter: None,
            state_blocks,
            page_blocks: 1,
            token_pool: None,
            aligned: None,
        }
    }

    /// The next prefill chunk of a sequence of `target` tokens with `computed` prefilled, within
    /// `budget`: the rest of it, as [`AlignedChunks`] cuts it where it applies; 0 when it must wait.
    fn next_chunk(&self, target: usize, computed: usize, budget: usize) -> usize {
        let chunk = (target - computed).min(budget);
        self.aligned.map_or(chunk, |aligned| aligned.cut(target, computed, chunk, self.drops_cached_block()))
    }

    /// [`Speculation::drops_cached_block`].
    fn drops_cached_block(&self) -> bool {
        self.speculation.is_some_and(|s| s.drops_cached_block)
    }

    /// The engine's block as `blocks` of the simulator's [`BLOCK_TOKENS`]-token ones (vLLM's
    /// `--block-size` over 16).
    pub fn with_page_blocks(mut self, blocks: usize) -> Scheduler {
        self.page_blocks = blocks.max(1);
        self
    }

    /// vLLM's `align` mode on a hybrid model with prefix caching ([`AlignedChunks`]).
    fn with_aligned_chunks(mut self, aligned: Option<AlignedChunks>) -> Scheduler {
        self.aligned = aligned;
        self
    }

    /// KV blocks a sequence of `tokens` holds: its tokens' and, for a hybrid model, its state's.
    fn blocks_needed(&self, tokens: usize) -> usize {
        held_blocks(&self.cost, tokens, self.page_blocks, self.state_blocks)
    }

    /// Each step's time times a log-normal factor of mean 1 and standard deviation `pct` percent
    /// (0: none), drawn from `seed`: a GPU's own variation from step to step, and from run to run
    /// when each run has its own seed.
    pub fn with_step_jitter(mut self, pct: f64, seed: u64) -> Scheduler {
        // A log-normal's standard deviation is sqrt(exp(sigma^2) - 1) of its mean.
        let sigma = (1.0 + (pct / 100.0).powi(2)).ln().sqrt();
        self.jitter = (pct > 0.0).then(|| (sigma, ChaCha8Rng::seed_from_u64(seed)));
        self
    }

    /// The time of a step doing `work`, varied by the jitter.
    fn step_time(&mut self, work: &StepWork) -> Duration {
        let time = self.cost.step_time(work);
        let Some((sigma, rng)) = &mut self.jitter else { return time };
        time.mul_f64((*sigma * standard_normal(rng) - *sigma * *sigma / 2.0).exp())
    }

    /// SGLang's `--max-total-tokens`: a request holds at most this many tokens.
    pub fn with_token_pool(mut self, tokens: Option<usize>) -> Scheduler {
        self.token_pool = tokens;
        self
    }

    /// Models the reports' speculative-decoding failure at high load: once a step with speculative
    /// decoding runs more than `batch` sequences, every request not yet running fails.
    pub fn with_spec_failure(mut self, batch: Option<usize>) -> Scheduler {
        self.spec_failure_batch = batch;
        self
    }

    pub fn add(&mut self, request: SeqRequest) {
        let rng = ChaCha8Rng::seed_from_u64(request.seed);
        let target = request.prompt_tokens.max(1);
        self.counters.prompt_tokens += request.prompt_tokens as u64;
        self.waiting.push_back(Seq {
            request,
            target,
            computed: 0,
            generated: 0,
            anonymous: 0,
            hashed: Vec::new(),
            saved_states: Vec::new(),
            rng,
        });
    }

    /// Drops a request whose client went away; its KV blocks are freed.
    pub fn abort(&mut self, id: u64) {
        self.waiting.retain(|s| s.request.id != id);
        if let Some(index) = self.running.iter().position(|s| s.request.id == id) {
            let seq = self.running.remove(index);
            self.kv.release(seq.anonymous, &seq.hashed);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.kv.usage()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Empties the prefix cache of blocks no running request uses.
    pub fn reset_prefix_cache(&mut self) {
        self.kv.reset_prefix_cache();
    }

    /// The tokens a sliding-window layer attends to (0 where the model has none).
    fn window_tokens(&self) -> usize {
        self.cost.window.map_or(0, |w| w.tokens)
    }

    fn draft_tokens(&self) -> usize {
        self.speculation.map_or(0, |s| s.tokens)
    }

    /// Frees a running sequence's blocks and puts it first in line, to recompute later.
    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.kv.release(seq.anonymous, &seq.hashed);
        seq.anonymous = 0;
        seq.hashed.clear();
        seq.saved_states.clear();
        seq.target = seq.request.prompt_tokens.max(1) + seq.generated;
        seq.computed = 0;
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Plans and applies the next step; `None` when there is nothing to do.
    /// Plans the running sequences' part of a step: their decodes (`1 + k` tokens and the KV blocks
    /// for them, preempting the newest sequence when the cache is full) and the next chunks of
    /// those still prefilling, as `phase` allows.
    fn plan_running(
        &mut self,
        phase: Phase,
        draft: usize,
        budget: &mut usize,
        work: &mut StepWork,
        plan: &mut Vec<(usize, usize)>,
    ) {
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            if seq.decoding() {
                if !phase.decodes || *budget < 1 + draft {
                    index += 1;
                    continue;
                }
                let needed = self.blocks_needed(seq.request.prompt_tokens + seq.generated + 1 + draft);
                let extra = needed.saturating_sub(seq.blocks());
                if !self.kv.allocate(extra) {
                    // Preempt the newest sequence; if that is this one, it waits too.
                    let last = self.running.len() - 1;
                    self.preempt(last);
                    plan.retain(|(i, _)| *i < last);
                    if last == index {
                        break;
                    }
                    continue;
                }
                self.running[index].anonymous += extra;
                let seq = &self.running[index];
                *budget -= 1 + draft;
                work.decode_tokens += 1 + draft;
                work.draft_tokens = draft;
                work.decode_context_tokens += seq.request.prompt_tokens + seq.generated;
                work.decode_window_tokens += (seq.request.prompt_tokens + seq.generated).min(self.window_tokens());
                plan.push((index, 0));
            } else if phase.prefills && *budget > 0 {
                let chunk = self.next_chunk(seq.target, seq.computed, *budget);
                if chunk > 0 {
                    *budget -= chunk;
                    add_prefill(work, seq.computed, chunk, self.window_tokens());
                    plan.push((index, chunk));
                }
            }
            index += 1;
        }
    }

    /// Admits waiting requests, first come first served, while the batch has room for another
    /// sequence, budget is left and the KV cache holds the request; each prefills its first chunk
    /// in this step. A request that can never fit ends at once, in a step of its own (returned).
    fn admit(
        &mut self,
        draft: usize,
        budget: &mut usize,
        work: &mut StepWork,
        plan: &mut Vec<(usize, usize)>,
    ) -> Option<Step> {
        while *budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(seq) = self.waiting.front() else { break };
            // What the sequence computes: its prompt, and after a preemption the reply so far.
            let hashes = &seq.request.block_hashes[..(seq.target / BLOCK_TOKENS).min(seq.request.block_hashes.len())];
            let mut hit_blocks = whole_pages(self.kv.cached_prefix(hashes), self.page_blocks);
            if self.drops_cached_block() {
                hit_blocks = hit_blocks.saturating_sub(self.page_blocks);
            }
            if self.aligned.is_some() {
                // A hybrid model's hit also needs the state where it ends, and leaves a token to
                // compute (`max_length` is the prompt less one).
                let most = hit_blocks.min((seq.target - 1) / BLOCK_TOKENS);
                hit_blocks = self.kv.saved_state_within(hashes, most, self.page_blocks);
            }
            // vLLM always computes at least the prompt's last token, to sample from it.
            let hit_tokens = (hit_blocks * BLOCK_TOKENS).min(seq.target - 1);
            let chunk = self.next_chunk(seq.target, hit_tokens, *budget);
            if chunk == 0 {
                break;
            }
            let needed = self.blocks_needed(seq.request.prompt_tokens + seq.generated + 1 + draft);
            let anonymous = needed.saturating_sub(hit_blocks);
            // Longer than SGLang's token pool holds: the API's length check refuses it first.
            let too_long = self
                .token_pool
                .is_some_and(|pool| seq.request.prompt_tokens.saturating_add(seq.request.max_tokens) >= pool);
            if too_long || !self.kv.allocate(anonymous) {
                if too_long || (self.running.is_empty() && self.kv.available() == self.kv.capacity()) {
                    // It can never fit; the API's length check should have refused it.
                    let seq = self.waiting.pop_front()?;
                    return Some(Step {
                        duration: Duration::ZERO,
                        emissions: vec![Emission { id: seq.request.id, tokens: 0, finished: true, failed: false }],
                        work: *work,
                    });
                }
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            let shared = seq.request.block_hashes[..hit_blocks].to_vec();
            self.kv.share(&shared);
            self.counters.prefix_cache_queries += seq.target as u64;
            self.counters.prefix_cache_hits += hit_tokens as u64;
            seq.computed = hit_tokens;
            seq.anonymous = anonymous;
            seq.hashed = shared;
            *budget -= chunk;
            add_prefill(work, seq.computed, chunk, self.window_tokens());
            plan.push((self.running.len(), chunk));
            self.running.push(seq);
        }
        None
    }

    pub fn step(&mut self) -> Option<Step> {
        if self.is_idle() {
            return None;
        }
        if self.spec_state_corrupt && !self.waiting.is_empty() {
            let failed = self.waiting.drain(..).map(|seq| Emission {
                id: seq.request.id,
                tokens: 0,
                finished: true,
                failed: true,
            });
            return Some(Step { duration: Duration::ZERO, emissions: failed.collect(), work: StepWork::default() });
        }
        let draft = self.draft_tokens();
        let mut budget = self.limits.max_num_batched_tokens;
        let mut work = StepWork::default();
        // (index in running, prefill chunk); a chunk of 0 is a decode.
        let mut plan: Vec<(usize, usize)> = Vec::new();
        // SGLang, unmixed: a step prefills alone when it can, and decodes when it cannot.
        let decodes = self.limits.mixed;
        self.plan_running(Phase { decodes, prefills: true }, draft, &mut budget, &mut work, &mut plan);
        if let Some(never_fits) = self.admit(draft, &mut budget, &mut work, &mut plan) {
            return Some(never_fits);
        }
        if !decodes && plan.is_empty() {
            self.plan_running(Phase { decodes: true, prefills: false }, draft, &mut budget, &mut work, &mut plan);
        }

        if draft > 0 && self.spec_failure_batch.is_some_and(|batch| self.running.len() > batch) {
            self.spec_state_corrupt = true;
        }
        if plan.is_empty() {
            // Everything is preempted or waiting for room that a step cannot make; let time pass.
            return Some(Step { duration: self.step_time(&work), emissions: Vec::new(), work });
        }
        let duration = self.step_time(&work);
        let mut emissions = Vec::with_capacity(plan.len());
        let page_blocks = self.page_blocks;
        let aligned = self.aligned;
        for &(index, chunk) in &plan {
            let seq = &mut self.running[index];
            let tokens = if chunk > 0 {
                seq.computed += chunk;
                if aligned
                    .is_some_and(|a| seq.computed.is_multiple_of(a.block) && seq.computed <= seq.request.prompt_tokens)
                {
                    seq.saved_states.push(seq.computed / BLOCK_TOKENS);
                }
                if !seq.decoding() {
                    continue;
                }
                if self.kv.prefix_caching() {
                    // The prompt's full blocks are computed now: later requests can share them.
                    register_through(
                        &mut self.kv,
                        seq,
                        whole_pages(seq.request.prompt_tokens / BLOCK_TOKENS, page_blocks),
                    );
                    for blocks in std::mem::take(&mut seq.saved_states) {
                        if let Some(&hash) = seq.hashed.get(blocks.wrapping_sub(1)) {
                            self.kv.mark_state(hash);
                        }
                    }
                }
                1
            } else {
                let accepted = self
                    .speculation
                    .map_or(0, |s| (0..s.tokens).take_while(|_| seq.rng.random::<f64>() < s.acceptance).count());
                1 + accepted
            };
            let tokens = tokens.min(seq.request.max_tokens - seq.generated);
            seq.generated += tokens;
            self.counters.generation_tokens += tokens as u64;
            let finished = seq.generated >= seq.request.max_tokens;
            emissions.push(Emission { id: seq.request.id, tokens, finished, failed: false });
            if self.kv.prefix_caching() {
                self.cache_reply_blocks(index);
            }
        }
        let mut index = 0;
        while index < self.running.len() {
            let seq = &self.running[index];
            if seq.generated >= seq.request.max_tokens {
                let seq = self.running.remove(index);
                self.kv.release(seq.anonymous, &seq.hashed);
                self.counters.finished += 1;
            } else {
                index += 1;
            }
        }
        self.counters.steps += 1;
        Some(Step { duration, emissions, work })
    }
}

impl Scheduler {
    /// Caches the blocks a decoding sequence's reply has filled, as vLLM does: every whole page of
    /// the tokens whose KV is computed (all but the last sampled), named by the reply's hashes
    /// where the request carries them. In vLLM's `align` mode a step that ends on a block boundary
    /// also leaves the state there, where a later prompt's hit can end.
    fn cache_reply_blocks(&mut self, index: usize) {
        let seq = &mut self.running[index];
        let computed = seq.request.prompt_tokens + seq.generated - 1;
        register_through(&mut self.kv, seq, whole_pages(computed / BLOCK_TOKENS, self.page_blocks));
        if self.aligned.is_some_and(|a| computed > 0 && computed.is_multiple_of(a.block))
            && let Some(&hash) = seq.hashed.get(computed / BLOCK_TOKENS - 1)
        {
            self.kv.mark_state(hash);
        }
    }
}

/// Caches `seq`'s blocks up to the `full`th, those it has not yet: named by its request's hashes
/// (as far as they go), each one of the anonymous blocks it held.
fn register_through(kv: &mut KvCache, seq: &mut Seq, full: usize) {
    let full = full.min(seq.request.block_hashes.len());
    let Some(fresh) = seq.request.block_hashes.get(seq.hashed.len()..full) else { return };
    let fresh = &fresh[..fresh.len().min(seq.anonymous)];
    kv.register(fresh);
    seq.anonymous -= fresh.len();
    seq.hashed.extend_from_slice(fresh);
}

/// Which of the running sequences' work a step plans.
#[derive(Debug, Clone, Copy)]
struct Phase {
    decodes: bool,
    prefills: bool,
}

/// Adds a prefill chunk of `chunk` tokens after `computed` ones: its tokens, and its attention over
/// the prefix and over itself (causal, so half of the square), and within a sliding `window`
/// (each query token attends to at most its last `window` tokens).
fn add_prefill(work: &mut StepWork, computed: usize, chunk: usize, window: usize) {
    let n = chunk as f64;
    work.prefill_tokens += chunk;
    work.prefill_attention_pairs += n * computed as f64 + n * n / 2.0;
    // Query token p attends to about min(p, window) tokens: the sum over the chunk's p.
    let (a, b, w) = (computed as f64, (computed + chunk) as f64, window as f64);
    work.prefill_window_pairs += if b <= w {
        (a + b) / 2.0 * n
    } else if a >= w {
        n * w
    } else {
        (w - a) * (a + w) / 2.0 + (b - w) * w
    };
}

/// The engine could not start with this configuration; the wording is the engine's own, so a log
/// reader (and the agent's failure classifier) sees what a GPU run would show.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartupError {
    #[error(
        "{}: the weights of {model} need {weights_gib:.2} GiB but only {usable_gib:.2} GiB of GPU memory may be used; use more GPUs (--tensor-parallel-size), a quantized model, or a larger memory fraction",
        out_of_memory(*engine)
    )]
    WeightsDoNotFit { engine: EngineKind, model: String, weights_gib: f64, usable_gib: f64 },
    #[error(
        "{}",
        kv_too_small(*engine, *max_model_len, *needed_gib, *available_gib, *estimated_len)
    )]
    KvCacheTooSmall {
        engine: EngineKind,
        max_model_len: usize,
        needed_gib: f64,
        available_gib: f64,
        estimated_len: usize,
    },
    /// vLLM's `--kv-cache-memory-bytes` asks for more than the GPUs hold beside the weights: vLLM
    /// skips its memory profile and allocates what it was told, which CUDA cannot.
    #[error(
        "{}. Tried to allocate {asked_gib:.2} GiB for the KV cache (--kv-cache-memory-bytes, per GPU, on {gpus} GPUs); {free_gib:.2} GiB is free beside the weights",
        out_of_memory(EngineKind::Vllm)
    )]
    KvCacheDoesNotFit { asked_gib: f64, free_gib: f64, gpus: u64 },
    /// SGLang's state pool for a hybrid model holds no running request beside the states its
    /// radix cache keeps.
    #[error(
        "RuntimeError: Not enough memory for the state pool: {states} states of {state_gib:.3} GiB leave no running request ({per_request} states a request). Please set --max-mamba-cache-size or --mamba-full-memory-ratio higher, or increase --mem-fraction-static"
    )]
    StatesDoNotFit { states: usize, per_request: usize, state_gib: f64 },
    /// A value the engine's own checks refuse once its flags are parsed (too many GPUs asked,
    /// a token budget under the sequences, a memory fraction above 1).
    #[error("{0}")]
    Refused(String),
}

/// What the engine's configuration checks refuse, in its words, before anything is loaded. vLLM's
/// configurations are pydantic dataclasses: a check that fails raises a `ValidationError` naming
/// the configuration, its `Value error, ` line saying why. SGLang raises plain errors.
fn refusal(config: &SimConfig) -> Option<String> {
    let vllm = config.engine == EngineKind::Vllm;
    let refused = |section: &str, why: String| {
        Some(if vllm {
            format!(
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for {section}\n  Value error, {why}"
            )
        } else {
            server_args_error(&format!("ValueError: {why}"))
        })
    };
    if let Some(why) = &config.refused {
        return Some(server_args_error(why));
    }
    let tp = config.tensor_parallel_size as usize;
    let gpus = config.gpus_needed();
    let (tp_flag, seqs_flag, budget_flag, memory_flag) = if vllm {
        ("--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization")
    } else {
        ("--tp-size", "--max-running-requests", "--chunked-prefill-size", "--mem-fraction-static")
    };
    let (pp_flag, dp_flag) =
        if vllm { ("--pipeline-parallel-size", "--data-parallel-size") } else { ("--pp-size", "--dp-size") };
    for (flag, size) in
        [(tp_flag, tp as u32), (pp_flag, config.pipeline_parallel_size), (dp_flag, config.data_parallel_size)]
    {
        if size == 0 {
            return refused("ParallelConfig", format!("{flag} must be at least 1, got 0"));
        }
    }
    match config.visible_gpus.unwrap_or(crate::config::HOST_GPUS) {
        0 => return Some("RuntimeError: No CUDA GPUs are available".to_owned()),
        visible if gpus > visible as u64 && vllm => {
            return refused(
                "ParallelConfig",
                format!(
                    "World size ({gpus}) is larger than the number of available GPUs ({visible}) in this node. If \
                     this is intentional and you are using: - ray, set '--distributed-executor-backend ray'. - \
                     multiprocessing, set '--nnodes' appropriately."
                ),
            );
        }
        visible if gpus > visible as u64 => {
            return Some(format!(
                "RuntimeError: CUDA error: invalid device ordinal (the parallel sizes need {gpus} GPUs, {visible} visible)"
            ));
        }
        _ => {}
    }
    if config.max_model_len == 0 {
        return refused("ModelConfig", "max_model_len must be at least 1, got 0".to_owned());
    }
    if config.max_num_seqs == 0 {
        return refused("SchedulerConfig", format!("{seqs_flag} must be at least 1, got 0"));
    }
    if config.max_num_batched_tokens == 0 {
        return refused("SchedulerConfig", format!("{budget_flag} must be at least 1, got 0"));
    }
    if vllm && !config.chunked_prefill && config.max_num_batched_tokens < config.max_model_len {
        return refused(
            "SchedulerConfig",
            format!(
                "max_num_batched_tokens ({}) is smaller than max_model_len ({}). This effectively limits the maximum \
                 sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase \
                 max_num_batched_tokens or decrease max_model_len.",
                config.max_num_batched_tokens, config.max_model_len
            ),
        );
    }
    if vllm && config.model_shape().hybrid && config.enable_prefix_caching && !config.chunked_prefill {
        // vLLM caches a hybrid model's prefixes in its `align` mode, which prefills in whole blocks
        // (`MambaModelConfig.verify_and_update_config`).
        return Some("AssertionError: Chunked prefill is required for mamba cache mode 'align'.".to_owned());
    }
    // And a step that holds a whole block (`VllmConfig.__post_init__`), else no prompt longer
    // than one would ever be scheduled.
    let budget = config.max_num_batched_tokens;
    if let Some(block) = config.vllm_hybrid_block().filter(|b| config.enable_prefix_caching && b.tokens > budget) {
        return Some(format!(
            "AssertionError: In Mamba cache align mode, block_size ({}) must be <= max_num_batched_tokens ({budget}).",
            block.tokens
        ));
    }
    if vllm && config.max_num_batched_tokens < config.max_num_seqs {
        return refused(
            "SchedulerConfig",
            format!(
                "max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({}).",
                config.max_num_batched_tokens, config.max_num_seqs
            ),
        );
    }
    if vllm && config.async_scheduling == Some(true) && config.drafts_without_async() {
        return refused(
            "VllmConfig",
            "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model kind of speculative decoding."
                .to_owned(),
        );
    }
    if let (Some(max), Some(sizes)) = (config.max_capture_size, &config.capture_sizes) {
        let largest = sizes.iter().copied().filter(|&s| s <= config.max_num_batched_tokens).max().unwrap_or(0);
        if vllm && config.cuda_graphs && !config.enforce_eager && max != largest {
            return refused(
                "VllmConfig",
                format!(
                    "customized max_cudagraph_capture_size(={max}) should be consistent with the max value of \
                     cudagraph_capture_sizes(={largest})"
                ),
            );
        }
    }
    match config.gpu_memory_utilization {
        Some(f) if f > 1.0 && vllm => {
            refused("CacheConfig", format!("GPU memory utilization must be less than 1.0. Got {f}."))
        }
        Some(f) if !(f > 0.0 && f <= 1.0) => {
            refused("CacheConfig", format!("{memory_flag} must be above 0 and at most 1, got {f}"))
        }
        _ => None,
    }
}

/// An exception SGLang's `ServerArgs` checks raise, as its log ends: the traceback's innermost
/// frame in `server_args.py`, then the exception, which the agent reads as flags refused.
fn server_args_error(exception: &str) -> String {
    format!(
        "Traceback (most recent call last):\n  File \"/sgl-workspace/sglang/python/sglang/srt/server_args.py\", in \
         __post_init__\n{exception}"
    )
}

fn out_of_memory(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Vllm => "torch.OutOfMemoryError: CUDA out of memory",
        EngineKind::Sglang => "RuntimeError: Not enough memory (out of memory)",
    }
}

fn kv_too_small(engine: EngineKind, max_model_len: usize, needed: f64, available: f64, estimated: usize) -> String {
    match engine {
        EngineKind::Vllm => format!(
            "ValueError: To serve at least one request with the models's max seq len ({max_model_len}), ({needed:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({available:.2} GiB). Based on the available memory, the estimated maximum model length is {estimated}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        ),
        EngineKind::Sglang => format!(
            "RuntimeError: Not enough memory for the KV cache: a request of --context-length {max_model_len} needs {needed:.2} GiB, {available:.2} GiB is left (at most {estimated} tokens). Please try to increase --mem-fraction-static or decrease --context-length."
        ),
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl Scheduler {
    /// The engine a configuration describes: its step-time model, and a KV cache sized from GPU
    /// memory, weights and `--kv-cache-dtype`. Fails as the engine would when its checks refuse a value
    /// or the model does not fit. With pipeline parallelism this is one batch in flight of a
    /// replica's pipeline, with its share of the cache and sequences:
    /// [`crate::pipeline::Pipeline::replicas`] builds the whole engine.
    pub fn from_config(config: &SimConfig) -> Result<Scheduler, StartupError> {
        Scheduler::batch_of(config, 0)
    }

    /// Batch `batch` of a pipeline's batches in flight ([`Scheduler::from_config`]'s is the first).
    pub(crate) fn batch_of(config: &SimConfig, batch: usize) -> Result<Scheduler, StartupError> {
        if let Some(why) = refusal(config) {
            return Err(StartupError::Refused(why));
        }
        let c = &config.coefficients;
        let model = config.model_shape();
        let engine = config.engine_costs();
        let tp = f64::from(config.tensor_parallel_size);
        // A pipeline's stages hold the weights and the KV cache between them.
        let gpus = tp * f64::from(config.pipeline_parallel_size);
        // vLLM's `--kv-cache-memory-bytes` sizes the cache itself, whatever the memory fraction.
        let fraction = match config.kv_cache_memory_bytes {
            Some(_) => 1.0,
            None => config.gpu_memory_utilization.unwrap_or_else(|| default_memory_fraction(config)),
        };
        // vLLM's fraction holds the activations and graphs too; SGLang's is the weights' and the
        // KV pool's alone, its default leaving room for the rest (`sglang_mem_fraction_static`).
        let reserve = if config.engine == EngineKind::Vllm { c.runtime_reserve } else { 0.0 };
        let usable = config.gpu.memory * gpus * fraction - reserve * gpus;
        let vision = if config.language_model_only && model.multimodal { 1.0 - c.vision_encoder_fraction } else { 1.0 };
        let weights = model.weight_bytes() * vision;
        if weights >= usable {
            return Err(StartupError::WeightsDoNotFit {
                engine: config.engine,
                model: config.model.clone(),
                weights_gib: weights / GIB,
                usable_gib: usable.max(0.0) / GIB,
            });
        }
        let kv_fp8 = config.kv_fp8();
        let kv_bytes_per_token =
            model.kv_bytes_per_token_bf16(config.tensor_parallel_size) * if kv_fp8 { 0.5 } else { 1.0 };
        let mut kv_bytes = usable - weights;
        if let Some(per_gpu) = config.kv_cache_memory_bytes {
            let asked = per_gpu as f64 * gpus;
            if asked > kv_bytes {
                return Err(StartupError::KvCacheDoesNotFit {
                    asked_gib: asked / GIB,
                    free_gib: kv_bytes / GIB,
                    gpus: gpus as u64,
                });
            }
            kv_bytes = asked;
        }
        let speculation = speculation(config);
        let mut longest = config.max_model_len.saturating_add(speculation.map_or(0, |s| s.tokens)).saturating_add(1);
        let cost = CostModel {
            coefficients: config.coefficients,
            gpu: config.gpu,
            model,
            engine,
            tensor_parallel: tp,
            kv_bytes_per_token,
            kv_fp8,
            hybrid_prefix_caching: config.engine == EngineKind::Vllm && model.hybrid && config.enable_prefix_caching,
            multimodal_inputs: config.engine == EngineKind::Vllm && model.multimodal && !config.language_model_only,
            graphs: graphs(config, speculation),
            chunked_decode_states: config.engine == EngineKind::Vllm && model.hybrid,
            state_types: config.state_types,
            state_layer_page: config.vllm_hybrid_block().map_or(0.0, |block| block.layer_bytes),
            window: model.transformer.and_then(|a| a.window_cost(config.tensor_parallel_size)).map(|w| {
                profile::WindowCost { bytes_per_token: w.bytes_per_token * if kv_fp8 { 0.5 } else { 1.0 }, ..w }
            }),
        };
        // vLLM keeps a hybrid model's recurrent states in its KV cache, a sequence's state taking
        // blocks beside its tokens; SGLang keeps them in a pool of their own, and its pools set how
        // many requests it runs.
        let (mut max_num_seqs, mut state_blocks) = (config.max_num_seqs, cost.state_blocks());
        if config.engine == EngineKind::Sglang {
            (kv_bytes, max_num_seqs) = sglang_pools(config, &cost, kv_bytes, speculation)?;
            state_blocks = 0;
        }
        let mut capacity = (kv_bytes.max(0.0) / (kv_bytes_per_token * BLOCK_TOKENS as f64)) as usize;
        if let Some(tokens) = config.max_total_tokens {
            // SGLang's `--max-total-tokens` caps its KV pool.
            capacity = capacity.min(tokens / BLOCK_TOKENS);
        }
        // The tokens a request may hold: the cache's beside its state.
        let pool_tokens = capacity.saturating_sub(state_blocks) * BLOCK_TOKENS;
        let state_bytes = if state_blocks == 0 { 0.0 } else { cost.state_bytes() };
        // SGLang serves a context its pool cannot hold: it takes requests of up to the pool's tokens,
        // less one ([`Scheduler::max_request_tokens`]), and refuses to start only when that leaves
        // no prompt room (its `max_req_input_len`, 5 tokens fewer, must be positive).
        let context = longest;
        let page_blocks = config.page_blocks();
        let too_small = match config.engine {
            EngineKind::Sglang => {
                longest = longest.min(pool_tokens);
                pool_tokens <= 6
            }
            EngineKind::Vllm => capacity < held_blocks(&cost, longest, page_blocks, state_blocks),
        };
        if too_small {
            return Err(StartupError::KvCacheTooSmall {
                engine: config.engine,
                max_model_len: config.max_model_len,
                needed_gib: (context as f64 * kv_bytes_per_token + state_bytes) / GIB,
                available_gib: kv_bytes.max(0.0).min(pool_tokens as f64 * kv_bytes_per_token + state_bytes) / GIB,
                estimated_len: pool_tokens,
            });
        }
        // Each batch in flight through a pipeline takes its share of the running sequences and of
        // the cache, and a whole token budget: it is planned alone. A share holds at least one
        // longest request, which the whole cache does (with many stages and a context that
        // barely fits, the shares then add up to more than the cache: the engine's one cache
        // is not modelled).
        let stages = config.pipeline_parallel_size.max(1) as usize;
        let share_of = |total: usize| total / stages + usize::from(batch < total % stages);
        let limits = Limits {
            max_num_seqs: share_of(max_num_seqs).max(1),
            max_num_batched_tokens: config.max_num_batched_tokens,
            mixed: config.mixed_batches,
        };
        let share = share_of(capacity).max(held_blocks(&cost, longest, page_blocks, state_blocks));
        let kv = KvCache::new(share, config.enable_prefix_caching);
        Ok(Scheduler::new(cost, limits, speculation, kv, state_blocks)
            .with_page_blocks(page_blocks)
            .with_aligned_chunks(aligned_chunks(config))
            .with_token_pool(config.max_total_tokens.map(|tokens| tokens.min(pool_tokens)))
            .with_spec_failure(config.faults.spec_failure_batch)
            .with_step_jitter(config.faults.step_jitter_pct, config.faults.seed))
    }

    /// The step-time model this engine runs with.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The most sequences this scheduler runs at once: the limit given, or the engine's default,
    /// as its pools lower it (SGLang's state pool, [`Scheduler::from_config`]).
    pub fn max_num_seqs(&self) -> usize {
        self.limits.max_num_seqs
    }

    pub fn kv_capacity_tokens(&self) -> usize {
        self.kv.capacity() * BLOCK_TOKENS
    }

    /// The most tokens (prompt and output) a request may hold: what the cache holds beside one
    /// sequence's recurrent state, less one. SGLang starts with a pool smaller than its context
    /// and serves requests of up to this (its `max_req_len`); vLLM refuses to start instead.
    pub fn max_request_tokens(&self) -> usize {
        let cache = self.kv.capacity().saturating_sub(self.state_blocks) * BLOCK_TOKENS;
        cache.min(self.token_pool.unwrap_or(usize::MAX)).saturating_sub(1)
    }
}

/// SGLang's pools in `rest`, the bytes its memory fraction leaves beside the weights, and the
/// requests it runs: the KV pool's bytes and the sequence limit. A hybrid model's recurrent states
/// take a pool of their own first (`handle_max_mamba_cache`): `--max-mamba-cache-size` states,
/// else the sequence limit's without the radix cache when it is set, else as many as take
/// `--mamba-full-memory-ratio` (0.9) times the KV pool's memory; speculative decoding keeps
/// each running request's states for its draft tokens besides. The KV pool has the rest. The
/// limit (`init_memory_pool`) is the one given, else 512 requests a context's worth of the KV
/// pool's tokens, within 2048-4096, and no more than a third of the states with the radix cache
/// (which keeps cached prefixes' states too; fewer with `--mamba-scheduler-strategy
/// extra_buffer`), all of them without.
fn sglang_pools(
    config: &SimConfig,
    cost: &CostModel,
    rest: f64,
    speculation: Option<Speculation>,
) -> Result<(f64, usize), StartupError> {
    let state = cost.state_bytes();
    let mut kv_bytes = rest;
    let mut held = usize::MAX;
    if state > 0.0 {
        let pool = config.state_pool;
        if let Some(s) = speculation {
            kv_bytes -= state * config.max_num_seqs as f64 * (s.tokens + 1) as f64;
        }
        let states = match pool.size {
            Some(size) => size,
            None if !config.enable_prefix_caching && config.max_num_seqs_given => config.max_num_seqs,
            None => {
                let ratio = pool.full_memory_ratio;
                (kv_bytes.max(0.0) * ratio / (1.0 + ratio) / state) as usize
            }
        };
        kv_bytes -= states as f64 * state;
        let per_request = match (config.enable_prefix_caching, pool.extra_buffer, speculation) {
            (false, _, _) => 1,
            (true, false, _) => 3,
            (true, true, None) => 5,
            (true, true, Some(_)) => 4,
        };
        held = states / per_request;
        if held == 0 {
            return Err(StartupError::StatesDoNotFit { states, per_request, state_gib: state / GIB });
        }
    }
    let tokens = kv_bytes.max(0.0) / cost.kv_bytes_per_token;
    let asked = if config.max_num_seqs_given {
        config.max_num_seqs
    } else {
        ((tokens / config.max_model_len.max(1) as f64 * 512.0) as usize).clamp(2048, 4096)
    };
    Ok((kv_bytes, asked.min(held)))
}

/// The share of each GPU's memory the engine takes where `--gpu-memory-utilization` or
/// `--mem-fraction-static` is not given: vLLM's 0.9, SGLang's by its rule.
pub fn default_memory_fraction(config: &SimConfig) -> f64 {
    match config.engine {
        EngineKind::Vllm => 0.9,
        EngineKind::Sglang => sglang_mem_fraction_static(config),
    }
}

/// SGLang 0.5.9's `mem_fraction_static` where it is not given (`_handle_gpu_memory_settings`):
/// the GPU's memory less what it reserves for activations (1.5 MB a token of a prefill chunk, or
/// of `--max-prefill-tokens` unchunked, at least 2048), CUDA graphs (2 MB a batch size up to the
/// largest), the parallel ranks and a draft model, at least 10 GB on a GPU of more than 60 GB;
/// then, for a model with a vision encoder ([`crate::profile::ModelShape::multimodal`]), 0.95
/// times a factor for the encoder's size against a ViT-L/14's (Qwen3.5's: 27 layers of 1152, 0.958).
fn sglang_mem_fraction_static(config: &SimConfig) -> f64 {
    let mib = config.gpu.memory / (1024.0 * 1024.0);
    let tokens = if config.chunked_prefill { config.max_num_batched_tokens } else { 16384 };
    let graphs = sglang_cuda_graph_max_bs(config) as f64;
    let (tp, pp) = (f64::from(config.tensor_parallel_size), f64::from(config.pipeline_parallel_size));
    let mut reserved = 512.0 + tokens.max(2048) as f64 * 1.5 + graphs * 2.0 + tp * pp / 8.0 * 1024.0;
    if config.dp_attention {
        let dp = f64::from(config.data_parallel_size);
        reserved += graphs * dp * 3.0 + if graphs > 300.0 { graphs * dp * 1.5 } else { 0.0 };
    }
    if mib > 60.0 * 1024.0 {
        reserved = reserved.max(10.0 * 1024.0);
    }
    let method = config.speculative_config.as_ref().and_then(|s| s.get("method")).and_then(|m| m.as_str());
    reserved += match method {
        Some("draft_model") => 6.0 * 1024.0,
        Some("ngram") | None => 0.0,
        Some(_) => 2.0 * 1024.0,
    };
    let fraction = ((mib - reserved) / mib * 1000.0).round() / 1000.0;
    let model = config.model_shape();
    if !model.multimodal {
        return fraction;
    }
    // The vision encoder against a ViT-L/14 (24 layers of 1024), 0.1 less a doubling, within
    // 0.8-1.05: Qwen3.5's (the hybrid that takes images) 27 layers of 1152; another model's taken
    // as the baseline's, SGLang's own default where a config does not say, as the simulator knows
    // no other encoder.
    let complexity: f64 = if model.hybrid { 27.0 * 1152.0 * 1152.0 / (24.0 * 1024.0 * 1024.0) } else { 1.0 };
    fraction * 0.95 * (1.0 - 0.1 * (complexity - 1.0)).clamp(0.8, 1.05)
}

/// The steps the engine's captured CUDA graphs cover; none with `--enforce-eager` or graphs off.
fn graphs(config: &SimConfig, speculation: Option<Speculation>) -> Graphs {
    let on = config.cuda_graphs && !config.enforce_eager;
    match config.engine {
        EngineKind::Vllm => Graphs::Tokens(if on { vllm_graph_tokens(config, speculation) } else { 0 }),
        EngineKind::Sglang => Graphs::Decodes(if on { sglang_graph_batch(config, speculation) } else { 0 }),
    }
}

/// The largest step vLLM captures a CUDA graph for: twice `--max-num-seqs` query tokens (`1 + k`
/// a sequence with speculative decoding), at most 512, and no more than the step's token budget.
fn vllm_graph_tokens(config: &SimConfig, speculation: Option<Speculation>) -> usize {
    let budget = config.max_num_batched_tokens;
    if let Some(sizes) = &config.capture_sizes {
        // The sizes given, those within the token budget.
        return sizes.iter().copied().filter(|&s| s <= budget).max().unwrap_or(0);
    }
    let per_sequence = speculation.map_or(0, |s| s.tokens).saturating_add(1);
    let twice = config.max_num_seqs.saturating_mul(2).saturating_mul(per_sequence);
    let largest = config.max_capture_size.unwrap_or(twice.min(512)).min(budget);
    // vLLM captures 1, 2 and 4, then steps of 8 below 256 and of 16 from there: a limit between
    // two sizes is cut to the one below.
    match largest {
        0 | 1 => largest,
        2 | 3 => 2,
        4..8 => 4,
        8..256 => largest / 8 * 8,
        _ => 256 + (largest - 256) / 16 * 16,
    }
}

/// SGLang 0.5.9's `cuda_graph_max_bs`: the largest of `--cuda-graph-bs` when given, else
/// `--cuda-graph-max-bs`, whose default on an H100 or H200 (between 60 and 160 GB) is 256, and
/// 512 from 4-way tensor parallelism.
fn sglang_cuda_graph_max_bs(config: &SimConfig) -> usize {
    match &config.capture_sizes {
        Some(sizes) => sizes.iter().copied().max().unwrap_or(0),
        None => config.max_capture_size.unwrap_or(if config.tensor_parallel_size < 4 { 256 } else { 512 }),
    }
}

/// The largest decode batch SGLang captures a CUDA graph for: [`sglang_cuda_graph_max_bs`], the
/// sizes given as they are, a limit cut to the largest size SGLang captures under it.
fn sglang_graph_batch(config: &SimConfig, speculation: Option<Speculation>) -> usize {
    let max = sglang_cuda_graph_max_bs(config);
    if config.capture_sizes.is_some() {
        return max;
    }
    // The sizes SGLang captures (`_generate_cuda_graph_batch_sizes`), finer below 64 with
    // speculative decoding: a limit between two of them is cut to the one below.
    let floor = |n: usize, step: usize, from: usize| from + (n - from) / step * step;
    match (speculation.is_some(), max) {
        (false, 0..=1) => max,
        (false, 2..=3) => 2,
        (false, 4..=7) => 4,
        (false, 8..=11) => 8,
        (false, 12..=15) => 12,
        (false, 16..=271) => floor(max, 8, 16).min(256),
        (false, 272..=511) => floor(max, 16, 272),
        (false, _) => floor(max, 32, 512),
        (true, 0..=8) => max,
        (true, 9) => 8,
        (true, 10..=39) => floor(max, 2, 10).min(32),
        (true, 40..=71) => floor(max, 4, 40).min(64),
        (true, 72..=271) => floor(max, 8, 72).min(256),
        (true, _) => floor(max, 16, 272),
    }
}

/// vLLM's `align` mode where it applies: a hybrid model whose block the simulator knows, with
/// prefix caching.
fn aligned_chunks(config: &SimConfig) -> Option<AlignedChunks> {
    let block = config.vllm_hybrid_block().filter(|_| config.enable_prefix_caching)?;
    Some(AlignedChunks { block: block.tokens })
}

/// `--speculative-config`'s method and draft count, with the method's acceptance unless overridden.
fn speculation(config: &SimConfig) -> Option<Speculation> {
    let spec = config.speculative_config.as_ref()?;
    let tokens = usize::try_from(spec.get("num_speculative_tokens")?.as_u64()?).ok()?;
    let method = spec.get("method").and_then(serde_json::Value::as_str).unwrap_or("draft_model");
    (tokens > 0).then(|| Speculation {
        tokens,
        acceptance: config.spec_acceptance.unwrap_or(profile::acceptance(&config.coefficients, method)),
        drops_cached_block: config.engine == EngineKind::Vllm
            && (matches!(method, "eagle" | "eagle3" | "mtp") || method.ends_with("_mtp")),
    })
}
