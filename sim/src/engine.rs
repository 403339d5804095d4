//! The engine loop: one task owns the running batch and turns time into tokens.
//!
//! HTTP handlers [`EngineHandle::submit`] a request and read its tokens from a
//! per-request channel. Each step of the loop:
//!
//! 1. drops requests whose client went away (their token channel is closed);
//! 2. admits waiting requests, first come first served, up to `max_num_seqs`;
//! 3. spends the step's token budget (`max_num_batched_tokens`): one token per
//!    decoding sequence, the rest on prefill chunks in admission order (chunked
//!    prefill, so a long prompt spans several steps);
//! 4. sleeps the [`step_time`] until an absolute deadline, so steps do not drift;
//! 5. gives one token to every sequence whose prefill is complete (the step
//!    that finishes a prefill also samples its first token).
//!
//! So TTFT grows with queueing and prefill, and TPOT with batch size.
//!
//! | coefficient | flag | default |
//! |---|---|---|
//! | prefill cost per prompt token | `--sim-prefill-us-per-token` | 20 µs |
//! | fixed cost of a step | `--sim-decode-base-ms` | 8 ms |
//! | extra cost per sequence in the step's batch | `--sim-decode-ms-per-seq` | 0.05 ms |
//!
//! `step = base + per_seq × batch + prefill_per_token × prefill tokens`.
//! Tokio's timer fires on whole milliseconds, so a token can leave up to 1 ms
//! after its deadline; deadlines stay exact, so the error never accumulates.
//!
//! Not modelled yet: KV-cache capacity and preemption, prefix caching,
//! speculative decoding, tensor parallelism.

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::{
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, sleep_until},
};

/// The latency model's coefficients (see the table in the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub prefill_per_token: Duration,
    pub decode_base: Duration,
    pub decode_per_seq: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            prefill_per_token: Duration::from_micros(20),
            decode_base: Duration::from_millis(8),
            decode_per_seq: Duration::from_micros(50),
        }
    }
}

/// Scheduler limits, from `--max-num-seqs` and `--max-num-batched-tokens`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
}

/// Duration of one step that prefills `prefill_tokens` and samples a token for `batch_size` sequences.
pub fn step_time(timing: &Timing, prefill_tokens: usize, batch_size: usize) -> Duration {
    let saturate = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    timing.decode_base
        + timing.decode_per_seq.saturating_mul(saturate(batch_size))
        + timing.prefill_per_token.saturating_mul(saturate(prefill_tokens))
}

/// Words the simulator "generates"; each starts with a space so their concatenation reads as text.
const VOCAB: [&str; 16] = [
    " alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta", " iota", " kappa", " lambda", " mu",
    " nu", " xi", " omicron", " pi",
];

/// What the engine needs to know about a request.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// Picks the generated words, so the same request yields the same text.
    pub seed: u64,
}

/// Gauges the engine keeps for `/metrics`.
#[derive(Debug, Default)]
pub struct Load {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
}

/// The engine loop has ended; only happens while the server shuts down.
#[derive(Debug, thiserror::Error)]
#[error("the engine loop has stopped")]
pub struct EngineStopped;

/// Cheap to clone; the loop ends once every handle is dropped and the batch is done.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    submissions: mpsc::UnboundedSender<Sequence>,
    pub load: Arc<Load>,
}

impl EngineHandle {
    /// Queues a request; its tokens arrive on the returned channel, which closes after the last.
    /// Dropping the receiver cancels the request.
    pub fn submit(&self, request: Request) -> Result<mpsc::UnboundedReceiver<&'static str>, EngineStopped> {
        let (tokens, receiver) = mpsc::unbounded_channel();
        let sequence =
            Sequence { request, prefilled: 0, generated: 0, rng: ChaCha8Rng::seed_from_u64(request.seed), tokens };
        self.submissions.send(sequence).map_err(|_| EngineStopped)?;
        Ok(receiver)
    }
}

#[derive(Debug)]
struct Sequence {
    request: Request,
    prefilled: usize,
    generated: usize,
    rng: ChaCha8Rng,
    tokens: mpsc::UnboundedSender<&'static str>,
}

impl Sequence {
    fn decoding(&self) -> bool {
        self.prefilled >= self.request.prompt_tokens
    }
}

/// Starts the engine loop on the current runtime.
pub fn start(timing: Timing, limits: Limits) -> (EngineHandle, JoinHandle<()>) {
    let (submissions, receiver) = mpsc::unbounded_channel();
    let load = Arc::new(Load::default());
    let task = tokio::spawn(run(receiver, timing, limits, load.clone()));
    (EngineHandle { submissions, load }, task)
}

async fn run(mut submissions: mpsc::UnboundedReceiver<Sequence>, timing: Timing, limits: Limits, load: Arc<Load>) {
    let mut waiting = VecDeque::new();
    let mut running: Vec<Sequence> = Vec::new();
    let mut deadline = Instant::now();
    loop {
        if waiting.is_empty() && running.is_empty() {
            match submissions.recv().await {
                Some(sequence) => waiting.push_back(sequence),
                None => return,
            }
            // An idle engine starts its next step now, not at a deadline in the past.
            deadline = Instant::now();
        }
        while let Ok(sequence) = submissions.try_recv() {
            waiting.push_back(sequence);
        }
        waiting.retain(|s| !s.tokens.is_closed());
        running.retain(|s| !s.tokens.is_closed());
        let admitted = limits.max_num_seqs.saturating_sub(running.len()).min(waiting.len());
        running.extend(waiting.drain(..admitted));
        load.running.store(running.len(), Ordering::Relaxed);
        load.waiting.store(waiting.len(), Ordering::Relaxed);
        if running.is_empty() {
            continue;
        }

        let decoding = running.iter().filter(|s| s.decoding()).count();
        let mut budget = limits.max_num_batched_tokens.saturating_sub(decoding);
        let mut prefill_tokens = 0;
        for sequence in running.iter_mut().filter(|s| !s.decoding()) {
            let chunk = (sequence.request.prompt_tokens - sequence.prefilled).min(budget);
            sequence.prefilled += chunk;
            prefill_tokens += chunk;
            budget -= chunk;
        }
        let batch_size = running.iter().filter(|s| s.decoding()).count();
        deadline += step_time(&timing, prefill_tokens, batch_size);
        sleep_until(deadline).await;

        for sequence in running.iter_mut().filter(|s| s.decoding()) {
            let word = VOCAB[sequence.rng.random_range(0..VOCAB.len())];
            // A failed send means the client went away; the retain below drops it.
            let _ = sequence.tokens.send(word);
            sequence.generated += 1;
        }
        running.retain(|s| s.generated < s.request.max_tokens && !s.tokens.is_closed());
        load.running.store(running.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_num_seqs: 256, max_num_batched_tokens: 8192 };

    #[test]
    fn step_time_grows_with_batch_and_prefill() {
        let t = Timing::default();
        assert_eq!(step_time(&t, 0, 1), Duration::from_micros(8050));
        assert_eq!(step_time(&t, 0, 64), Duration::from_micros(11200));
        assert_eq!(step_time(&t, 1000, 1), Duration::from_micros(28050));
    }

    /// Mean time per output token after the first, for `concurrency` identical requests.
    async fn tpot(concurrency: usize) -> Duration {
        let (engine, _task) = start(Timing::default(), LIMITS);
        let request = Request { prompt_tokens: 100, max_tokens: 21, seed: 7 };
        // One task per request, so each token is timed when it is sent, not when a reader gets to it.
        let readers: Vec<_> = (0..concurrency)
            .map(|_| {
                let mut tokens = engine.submit(request).expect("engine runs");
                tokio::spawn(async move {
                    tokens.recv().await.expect("first token");
                    let (first, mut count) = (Instant::now(), 1);
                    while tokens.recv().await.is_some() {
                        count += 1;
                    }
                    assert_eq!(count, request.max_tokens);
                    (Instant::now() - first) / 20
                })
            })
            .collect();
        let mut total = Duration::ZERO;
        for reader in readers {
            total += reader.await.expect("reader finishes");
        }
        total / u32::try_from(concurrency).expect("small")
    }

    /// Tokio's timer fires on whole milliseconds, so a token may come up to 1 ms after its deadline.
    fn assert_near(actual: Duration, expected: Duration, slack: Duration) {
        assert!(actual.abs_diff(expected) <= slack, "{actual:?} is not within {slack:?} of {expected:?}");
    }

    // Paused time makes the loop's clock exact: TPOT is the step time, not wall-clock noise.
    #[tokio::test(start_paused = true)]
    async fn tpot_grows_with_concurrency() {
        let (one, many) = (tpot(1).await, tpot(64).await);
        // 20 gaps between absolute deadlines: the millisecond rounding spreads over all of them.
        let slack = Duration::from_micros(50);
        assert_near(one, step_time(&Timing::default(), 0, 1), slack);
        assert_near(many, step_time(&Timing::default(), 0, 64), slack);
    }

    #[tokio::test(start_paused = true)]
    async fn queueing_and_chunked_prefill_delay_the_first_token() {
        let limits = Limits { max_num_seqs: 1, max_num_batched_tokens: 100 };
        let (engine, _task) = start(Timing::default(), limits);
        let start = Instant::now();
        let request = Request { prompt_tokens: 250, max_tokens: 2, seed: 1 };
        let mut first = engine.submit(request).expect("engine runs");
        let mut second = engine.submit(request).expect("engine runs");
        first.recv().await.expect("token");
        // Three prefill chunks of 100, 100 and 50 tokens: 3 × 8 ms + 250 × 20 µs + 50 µs.
        let ttft = Instant::now() - start;
        assert_near(ttft, Duration::from_micros(29_050), Duration::from_millis(1));
        second.recv().await.expect("token");
        assert!(Instant::now() - start > Duration::from_millis(60), "second waited for the first");
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_requests_leave_the_batch() {
        let (engine, _task) = start(Timing::default(), LIMITS);
        let request = Request { prompt_tokens: 1, max_tokens: 1000, seed: 1 };
        drop(engine.submit(request).expect("engine runs"));
        let mut kept = engine.submit(request).expect("engine runs");
        kept.recv().await.expect("token");
        kept.recv().await.expect("token");
        assert_eq!(engine.load.running.load(Ordering::Relaxed), 1);
    }
}
