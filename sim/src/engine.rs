//! The real-time driver: runs the [`Scheduler`] on a tokio task, one step per deadline, and streams each request's words.
//!
//! The API submits requests through an [`EngineHandle`] and reads each one's
//! output from its own channel: one message per step that gave it tokens (a
//! step can give several with speculative decoding). Each loop iteration
//! takes in the requests that arrived while the step before the last ran
//! (the engines plan a step as they launch the one before it; an idle engine
//! takes what arrives at once), drops those whose client went away, plans a step,
//! sleeps until `deadline += step time / speedup` (absolute deadlines, so
//! timer overshoot never accumulates), then delivers the step's tokens.
//! Tokio's timer fires on whole milliseconds, so a token can leave up to 1 ms
//! late; the deadlines stay exact.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
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
use tokio_util::sync::CancellationToken;

use crate::{
    config::Routing,
    pipeline::Stepper,
    scheduler::{Counters, Scheduler, SeqRequest},
};

/// Words the simulator "generates"; each starts with a space so their concatenation reads as text.
const VOCAB: [&str; 16] = [
    " alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta", " iota", " kappa", " lambda", " mu",
    " nu", " xi", " omicron", " pi",
];

/// The next word of a request's reply, from its generator seeded by [`Request::seed`].
fn next_word(rng: &mut ChaCha8Rng) -> &'static str {
    VOCAB[rng.random_range(0..VOCAB.len())]
}

/// The first `count` words a request seeded by `seed` generates: the reply it will stream, known
/// before it runs, so the API can name the KV blocks the reply will fill.
pub fn reply_words(seed: u64, count: usize) -> impl Iterator<Item = &'static str> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count).map(move |_| next_word(&mut rng))
}

/// What the engine needs to know about a request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt_tokens: usize,
    /// See [`SeqRequest::block_hashes`].
    pub block_hashes: Vec<u64>,
    pub max_tokens: usize,
    /// Picks the generated words and draft acceptances, so the same request yields the same text.
    pub seed: u64,
}

/// The words one step gave a request.
pub type Chunk = Vec<&'static str>;

/// What a request's channel carries: the words of a step, or the engine's error, after which nothing.
pub type Output = Result<Chunk, &'static str>;

/// The engine's state as `/metrics` shows it, refreshed every step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub counters: Counters,
    pub timing: Timing,
}

/// How well the loop kept its deadlines: a step whose wake-up came late
/// (the machine held the runtime) delays its tokens by as much, which is
/// the machine's timing, not the engine's. A benchmark of the simulator
/// reads these to tell the two apart.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Steps run.
    pub steps: u64,
    /// Their wake-ups' lateness past their deadlines, summed.
    pub late: Duration,
    /// Steps that woke more than [`Timing::LATE`] past their deadline.
    pub late_steps: u64,
}

impl Timing {
    /// Lateness beyond the timer's own (it fires on whole milliseconds).
    pub const LATE: Duration = Duration::from_millis(2);

    fn add(&mut self, late: Duration) {
        self.steps += 1;
        self.late += late;
        self.late_steps += u64::from(late > Timing::LATE);
    }
}

/// The engine died (`--sim-crash-after`), as an engine core process can.
#[derive(Debug, Clone, thiserror::Error)]
#[error("EngineDeadError: the engine core died after {completed} completed requests (--sim-crash-after)")]
pub struct EngineCrashed {
    pub completed: u64,
}

/// The engine loop has ended: the server is shutting down or the engine died.
#[derive(Debug, thiserror::Error)]
#[error("the engine loop has stopped")]
pub struct EngineStopped;

enum Command {
    Submit(Request, mpsc::UnboundedSender<Output>),
    ResetPrefixCache,
}

/// Cheap to clone; the loops end once every handle is dropped and their batches are done.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    replicas: Arc<[Replica]>,
    routing: Routing,
    /// Requests routed so far (round robin's turn), held while one is routed: two requests
    /// routed at once see each other's queueing.
    routed: Arc<Mutex<usize>>,
    /// Cancelled when the engine dies, so the server stops too.
    pub dead: CancellationToken,
}

/// One data-parallel replica's loop, as the server sees it.
#[derive(Debug)]
struct Replica {
    commands: mpsc::UnboundedSender<Command>,
    stats: Arc<Mutex<Stats>>,
    /// Requests sent to the loop that it has not taken in yet: waiting, to the router.
    queued: Arc<AtomicUsize>,
}

impl Replica {
    fn stats(&self) -> Stats {
        // A poisoned lock only means a panicking writer; the last numbers are still worth showing.
        *self.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Submit(..) => "Submit",
            Command::ResetPrefixCache => "ResetPrefixCache",
        })
    }
}

impl EngineHandle {
    /// Queues a request on the replica the routing picks; its words arrive on the returned
    /// channel, which closes after the last, or early if the engine dies. Dropping the receiver
    /// cancels the request.
    pub fn submit(&self, request: Request) -> Result<mpsc::UnboundedReceiver<Output>, EngineStopped> {
        let replica = {
            let mut routed = self.routed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let loads = self.replicas.iter().map(|r| {
                let stats = r.stats();
                (stats.waiting + r.queued.load(Ordering::Relaxed), stats.running)
            });
            let replica = &self.replicas[self.routing.pick(loads, *routed)];
            *routed += 1;
            replica.queued.fetch_add(1, Ordering::Relaxed);
            replica
        };
        let (tokens, receiver) = mpsc::unbounded_channel();
        if replica.commands.send(Command::Submit(request, tokens)).is_err() {
            replica.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(EngineStopped);
        }
        Ok(receiver)
    }

    /// Empties every replica's prefix cache at its next step boundary.
    pub fn reset_prefix_cache(&self) -> Result<(), EngineStopped> {
        for replica in self.replicas.iter() {
            replica.commands.send(Command::ResetPrefixCache).map_err(|_| EngineStopped)?;
        }
        Ok(())
    }

    /// Each data-parallel replica's state, in rank order.
    pub fn replica_stats(&self) -> Vec<Stats> {
        self.replicas.iter().map(Replica::stats).collect()
    }

    /// The replicas' state as one engine's.
    pub fn stats(&self) -> Stats {
        Stats::sum(&self.replica_stats())
    }
}

impl Stats {
    /// Several replicas' state as one's: requests, counters and step timing summed, the KV
    /// cache's usage their mean.
    pub fn sum(all: &[Stats]) -> Stats {
        let mut total = Stats::default();
        for stats in all {
            total.running += stats.running;
            total.waiting += stats.waiting;
            total.kv_usage += stats.kv_usage / all.len() as f64;
            total.counters += stats.counters;
            total.timing.steps += stats.timing.steps;
            total.timing.late += stats.timing.late;
            total.timing.late_steps += stats.timing.late_steps;
        }
        total
    }
}

/// Starts one engine loop per replica on the current runtime, requests spread over them by
/// `routing`. `speedup` divides every step time; `crash_after` kills the engine once that many
/// requests have completed (on all replicas together); `slowdown_pct_per_s` lengthens every
/// step by that many percent per second since the first.
pub fn start<S: Stepper + Send + 'static>(
    replicas: Vec<S>,
    routing: Routing,
    speedup: f64,
    crash_after: Option<u64>,
    slowdown_pct_per_s: f64,
) -> (EngineHandle, JoinHandle<Result<(), EngineCrashed>>) {
    assert!(!replicas.is_empty(), "an engine runs at least one replica");
    let dead = CancellationToken::new();
    let completed = Arc::new(AtomicU64::new(0));
    let first_step = Arc::new(OnceLock::new());
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for scheduler in replicas {
        let (commands, receiver) = mpsc::unbounded_channel();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let queued = Arc::new(AtomicUsize::new(0));
        let engine = EngineLoop {
            scheduler,
            sinks: HashMap::new(),
            next_id: 0,
            stats: stats.clone(),
            queued: queued.clone(),
            speedup,
            crash_after,
            completed: completed.clone(),
            finished: 0,
            slowdown_pct_per_s,
            first_step: first_step.clone(),
            timing: Timing::default(),
            arrived: Vec::new(),
        };
        tasks.push(tokio::spawn(engine.run(receiver, dead.clone())));
        handles.push(Replica { commands, stats, queued });
    }
    // The engine's result once every loop has ended: a replica's death (the lowest rank's when
    // several died).
    let task = tokio::spawn(async move {
        let mut result = Ok(());
        for task in tasks {
            match task.await {
                Ok(Err(crashed)) if result.is_ok() => result = Err(crashed),
                Ok(_) => {}
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => {}
            }
        }
        result
    });
    (EngineHandle { replicas: handles.into(), routing, routed: Arc::new(Mutex::new(0)), dead }, task)
}

/// Where a request's words go.
struct Sink {
    tokens: mpsc::UnboundedSender<Output>,
    rng: ChaCha8Rng,
}

struct EngineLoop<S> {
    scheduler: S,
    sinks: HashMap<u64, Sink>,
    next_id: u64,
    stats: Arc<Mutex<Stats>>,
    queued: Arc<AtomicUsize>,
    speedup: f64,
    crash_after: Option<u64>,
    /// Requests completed on every replica, and on this one as last added to it.
    completed: Arc<AtomicU64>,
    finished: u64,
    slowdown_pct_per_s: f64,
    /// When the engine's first step began, on any replica: a degrading engine slows from then.
    first_step: Arc<OnceLock<Instant>>,
    timing: Timing,
    /// Requests that reached the engine while its last step ran. The engines plan a step as they
    /// launch the one before it (vLLM's batch queue, SGLang's overlap loop), so these join the
    /// step after the next: the next one was planned before they came.
    arrived: Vec<SeqRequest>,
}

impl<S: Stepper> EngineLoop<S> {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        dead: CancellationToken,
    ) -> Result<(), EngineCrashed> {
        let result = self.steps(&mut commands).await;
        if result.is_err() {
            dead.cancel();
        }
        result
    }

    async fn steps(&mut self, commands: &mut mpsc::UnboundedReceiver<Command>) -> Result<(), EngineCrashed> {
        let mut deadline = Instant::now();
        loop {
            // The step planned now takes what had arrived when the step that just ended began.
            let planned = std::mem::take(&mut self.arrived);
            self.admit(planned);
            let idle = self.scheduler.is_idle();
            if idle {
                self.publish();
                match commands.recv().await {
                    Some(command) => self.handle(command),
                    None => return Ok(()),
                }
                // An idle engine starts its next step now, not at a deadline in the past.
                deadline = Instant::now();
            }
            while let Ok(command) = commands.try_recv() {
                self.handle(command);
            }
            if idle {
                // And with everything that has arrived: it had no step in flight to plan ahead of.
                let arrived = std::mem::take(&mut self.arrived);
                self.admit(arrived);
            }
            let gone: Vec<u64> = self.sinks.iter().filter(|(_, s)| s.tokens.is_closed()).map(|(id, _)| *id).collect();
            for id in gone {
                self.sinks.remove(&id);
                self.scheduler.abort(id);
            }
            let Some(step) = self.scheduler.step() else { continue };
            self.publish();
            let since = self.first_step.get_or_init(|| deadline).elapsed().as_secs_f64();
            let slower = 1.0 + self.slowdown_pct_per_s / 100.0 * since;
            // At most a day: a degrading engine's steps grow without bound.
            let wall = (step.duration.as_secs_f64() * slower / self.speedup).min(86_400.0);
            deadline += Duration::from_secs_f64(wall);
            sleep_until(deadline).await;
            self.timing.add(Instant::now().saturating_duration_since(deadline));
            for emission in step.emissions {
                let Some(sink) = self.sinks.get_mut(&emission.id) else { continue };
                if emission.failed {
                    let _ = sink.tokens.send(Err(Scheduler::FAILURE));
                    self.sinks.remove(&emission.id);
                    continue;
                }
                let words: Chunk = (0..emission.tokens).map(|_| next_word(&mut sink.rng)).collect();
                if !words.is_empty() {
                    // A failed send means the client went away; the next iteration aborts it.
                    let _ = sink.tokens.send(Ok(words));
                }
                if emission.finished {
                    self.sinks.remove(&emission.id);
                }
            }
            let finished = self.scheduler.counters().finished;
            let completed =
                self.completed.fetch_add(finished - self.finished, Ordering::Relaxed) + finished - self.finished;
            self.finished = finished;
            if self.crash_after.is_some_and(|limit| completed >= limit) {
                return Err(EngineCrashed { completed });
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(request, tokens) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                self.next_id += 1;
                let id = self.next_id;
                self.sinks.insert(id, Sink { tokens, rng: ChaCha8Rng::seed_from_u64(request.seed) });
                self.arrived.push(SeqRequest {
                    id,
                    prompt_tokens: request.prompt_tokens,
                    block_hashes: request.block_hashes,
                    max_tokens: request.max_tokens,
                    seed: request.seed,
                });
            }
            Command::ResetPrefixCache => self.scheduler.reset_prefix_cache(),
        }
    }

    /// Hands `requests` to the scheduler, but those whose client has gone away.
    fn admit(&mut self, requests: Vec<SeqRequest>) {
        for request in requests {
            if self.sinks.get(&request.id).is_some_and(|sink| !sink.tokens.is_closed()) {
                self.scheduler.add(request);
            } else {
                self.sinks.remove(&request.id);
            }
        }
    }

    fn publish(&self) {
        let stats = Stats {
            running: self.scheduler.running(),
            waiting: self.scheduler.waiting() + self.arrived.len(),
            kv_usage: self.scheduler.kv_usage(),
            counters: self.scheduler.counters(),
            timing: self.timing,
        };
        *self.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = stats;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{self, Arrival, Workload};

    /// On tokio's paused clock the server's loop keeps the replay's time, but for its timer's
    /// whole milliseconds: a request that arrives while a step runs is prefilled in the step after
    /// the next, in both drivers.
    #[tokio::test(start_paused = true)]
    async fn the_real_time_loop_admits_a_request_as_the_replay_does() {
        let line: Vec<String> =
            "vllm serve Qwen/Qwen3.5-9B --max-model-len 8192".split_whitespace().map(String::from).collect();
        let config = crate::parse_command_line_with_gpu(&line, None).expect("valid");
        // The first decodes 64 tokens; the second arrives 1 ms in, while the first one's prefill runs.
        let mut items = simulate::random(2, 512, 64, 3);
        items[1].output_tokens = 2;
        let replay = simulate::simulate(
            &config,
            &Workload { items: items.clone(), arrival: Arrival::Rate { rate: 1000.0, max_concurrency: None } },
        )
        .expect("fits");

        let replicas = crate::pipeline::Pipeline::replicas(&config).expect("fits");
        let (engine, _task) = start(replicas, config.routing, 1.0, None, 0.0);
        let request = |i: usize| Request {
            prompt_tokens: items[i].prompt_tokens,
            block_hashes: items[i].block_hashes.clone(),
            max_tokens: items[i].output_tokens,
            seed: i as u64 + 1,
        };
        let began = Instant::now();
        let mut first = engine.submit(request(0)).expect("running");
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut second = engine.submit(request(1)).expect("running");
        let mut first_token = Vec::new();
        for tokens in [&mut first, &mut second] {
            assert!(tokens.recv().await.expect("a chunk").is_ok());
            first_token.push(began.elapsed().as_secs_f64());
        }
        for (served, replayed) in first_token.iter().zip(&replay) {
            // Each wake-up is at most a millisecond late; the replay's steps are about 6 ms apart.
            assert!(
                (served - replayed.first_token).abs() < 0.002,
                "served {first_token:?}, replayed {:?}",
                replay.iter().map(|t| t.first_token).collect::<Vec<_>>()
            );
        }
    }
}
