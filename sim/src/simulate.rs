//! The virtual-time driver: runs a whole benchmark against the engine model in milliseconds.
//!
//! A [`Workload`] is a list of requests and how a client sends them: at a
//! constant rate (with the client's concurrency cap, as guidellm has), or as a
//! closed loop of N clients each sending its next request when the last one
//! ends. [`simulate`] replays it step by step on a virtual clock, with the same
//! [`Scheduler`] the HTTP server drives in real time, and returns when each
//! request was sent, got its first token and finished. The calibration test
//! and `docs/sim-calibration.md` are built with it.
//!
//! Datasets: `random` (unique prompts of exact lengths), `sharegpt_like`
//! (ShareGPT's length distribution, scaled to the reference reports' token
//! totals: 342,058 prompt and 281,412 output tokens per 1000 requests) and
//! `shared_prefix` (groups of requests that share a long prompt prefix).

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{
    config::{Routing, SimConfig},
    kv::BLOCK_TOKENS,
    pipeline::{Pipeline, Stepper},
    scheduler::{Emission, Scheduler, SeqRequest, StartupError, Step, standard_normal},
};

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// The prompt's block hashes (see [`SeqRequest::block_hashes`]): equal prefixes, equal hashes.
    pub block_hashes: Vec<u64>,
}

/// How the client sends the requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// At `rate` per second from time 0, at most `max_concurrency` in flight (later ones wait for a slot).
    Rate { rate: f64, max_concurrency: Option<usize> },
    /// `concurrency` clients, each sending its next request as soon as the previous one ends.
    Closed { concurrency: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub items: Vec<WorkItem>,
    pub arrival: Arrival,
}

/// What a benchmark client would record for one request, in seconds from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestTiming {
    pub sent: f64,
    pub first_token: f64,
    pub completed: f64,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Failed with the engine's error (`--sim-spec-failure-batch`): left out of the [`Summary`].
    pub failed: bool,
}

/// The headline numbers of a run, defined as loadgen defines them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Successful requests; the figures below are theirs, as a benchmark client reports them.
    pub requests: usize,
    pub failed: usize,
    /// First send to last completion, seconds.
    pub duration: f64,
    pub total_token_throughput: f64,
    pub output_throughput: f64,
    pub mean_ttft: f64,
    /// Mean over requests with more than one output token of (completion - first token) / (tokens - 1).
    pub mean_tpot: f64,
    pub mean_latency: f64,
}

impl Summary {
    pub fn of(all: &[RequestTiming]) -> Summary {
        let timings: Vec<RequestTiming> = all.iter().filter(|t| !t.failed).copied().collect();
        let timings = &timings[..];
        let n = timings.len().max(1) as f64;
        let start = timings.iter().map(|t| t.sent).fold(f64::INFINITY, f64::min);
        let end = timings.iter().map(|t| t.completed).fold(0.0, f64::max);
        let duration = (end - start).max(f64::MIN_POSITIVE);
        let tokens = |f: fn(&RequestTiming) -> usize| timings.iter().map(f).sum::<usize>() as f64;
        let (input, output) = (tokens(|t| t.prompt_tokens), tokens(|t| t.output_tokens));
        let decoding: Vec<f64> = timings
            .iter()
            .filter(|t| t.output_tokens > 1)
            .map(|t| (t.completed - t.first_token) / (t.output_tokens - 1) as f64)
            .collect();
        Summary {
            requests: timings.len(),
            failed: all.len() - timings.len(),
            duration,
            total_token_throughput: (input + output) / duration,
            output_throughput: output / duration,
            mean_ttft: timings.iter().map(|t| t.first_token - t.sent).sum::<f64>() / n,
            mean_tpot: decoding.iter().sum::<f64>() / decoding.len().max(1) as f64,
            mean_latency: timings.iter().map(|t| t.completed - t.sent).sum::<f64>() / n,
        }
    }
}

/// Runs `workload` on a fresh engine built from `config`: its data-parallel replicas behind the
/// server's routing ([`Pipeline::replicas`]).
pub fn simulate(config: &SimConfig, workload: &Workload) -> Result<Vec<RequestTiming>, StartupError> {
    let mut replicas = Pipeline::replicas(config)?;
    Ok(simulate_replicas(&mut replicas, config.routing, workload, |_| {}))
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    item: usize,
    sent: f64,
    first_token: Option<f64>,
    tokens: usize,
}

/// Runs `workload` on an existing engine, whose prefix cache may be warm from an earlier run.
/// Timings are in seconds from this run's start.
pub fn simulate_on(scheduler: &mut Scheduler, workload: &Workload) -> Vec<RequestTiming> {
    simulate_observed(scheduler, workload, |_| {})
}

/// [`simulate_on`], showing `observe` every step the engine takes.
pub fn simulate_observed(
    scheduler: &mut Scheduler,
    workload: &Workload,
    observe: impl FnMut(&Step),
) -> Vec<RequestTiming> {
    simulate_replicas(std::slice::from_mut(scheduler), Routing::RoundRobin, workload, observe)
}

/// One replica's place on the virtual clock.
#[derive(Default)]
struct Clock {
    /// Requests routed to it and not yet taken into a step, with when each was sent.
    arrived: Vec<(SeqRequest, f64)>,
    /// When the step in flight began and ends, and what it gives then.
    step: Option<(f64, f64, Vec<Emission>)>,
    /// An idle replica plans its next step at this time, with every request sent by then.
    wake: Option<f64>,
}

/// Runs `workload` on `replicas`, each request routed as it is sent. Each replica steps on its
/// own: the engines plan a step as they launch the one before it (vLLM's batch queue, SGLang's
/// overlap loop), so the step a replica plans as one ends takes what had reached it by the time
/// that one began, and what arrives while a step runs joins the step after the next; an idle
/// replica plans at once with what has arrived. At one instant the steps that end go first
/// (freeing their requests' client slots), then the sends, then the idle replicas' planning.
pub fn simulate_replicas<S: Stepper>(
    replicas: &mut [S],
    routing: Routing,
    workload: &Workload,
    mut observe: impl FnMut(&Step),
) -> Vec<RequestTiming> {
    let items = &workload.items;
    if replicas.is_empty() {
        // No engine to answer: no request completes.
        return Vec::new();
    }
    let (rate, cap) = match workload.arrival {
        Arrival::Rate { rate, max_concurrency } => (rate, max_concurrency.unwrap_or(usize::MAX)),
        Arrival::Closed { concurrency } => (f64::INFINITY, concurrency.max(1)),
    };
    // Scheduled send times: a closed loop has every request ready at 0, sent as clients free up.
    let mut queue: VecDeque<(usize, f64)> =
        (0..items.len()).map(|i| (i, if rate.is_finite() { i as f64 / rate } else { 0.0 })).collect();
    // When each free client slot became free, oldest first: all are free at the start, and a
    // request that ends frees its slot at the end of the step that ended it.
    let mut free_slots: VecDeque<f64> = std::iter::repeat_n(0.0, cap.min(items.len())).collect();
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let mut timings: Vec<Option<RequestTiming>> = vec![None; items.len()];
    let mut clocks: Vec<Clock> = replicas.iter().map(|_| Clock::default()).collect();
    let mut next_id = 0_u64;
    // Plans replica `r`'s next step at `now` with the requests sent before `horizon` (all of them when idle).
    let mut plan = |replica: &mut S, clock: &mut Clock, now: f64, horizon: Option<f64>| {
        let (taken, later) = std::mem::take(&mut clock.arrived)
            .into_iter()
            .partition::<Vec<_>, _>(|(_, sent)| horizon.is_none_or(|h| *sent < h));
        clock.arrived = later;
        for (request, _) in taken {
            replica.add(request);
        }
        clock.step = replica.step().map(|step| {
            observe(&step);
            (now, now + step.duration.as_secs_f64(), step.emissions)
        });
    };
    loop {
        let ending = (0..clocks.len())
            .filter_map(|r| clocks[r].step.as_ref().map(|&(_, ends, _)| (ends, r)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let send = match (queue.front(), free_slots.front()) {
            (Some(&(_, scheduled)), Some(&free)) => Some(scheduled.max(free)),
            _ => None,
        };
        let waking =
            (0..clocks.len()).filter_map(|r| clocks[r].wake.map(|at| (at, r))).min_by(|a, b| a.0.total_cmp(&b.0));
        let before = |t: f64, other: Option<f64>| other.is_none_or(|o| t <= o);
        match (ending, send, waking) {
            (Some((now, r)), send, waking) if before(now, send) && before(now, waking.map(|w| w.0)) => {
                let (began, _, emissions) = clocks[r].step.take().expect("a step in flight");
                for emission in emissions {
                    let Some(request) = in_flight.get_mut(&emission.id) else { continue };
                    if emission.tokens > 0 && request.first_token.is_none() {
                        request.first_token = Some(now);
                    }
                    request.tokens += emission.tokens;
                    if emission.finished || emission.failed {
                        let done = *request;
                        in_flight.remove(&emission.id);
                        free_slots.push_back(now);
                        let work = &items[done.item];
                        timings[done.item] = Some(RequestTiming {
                            sent: done.sent,
                            first_token: done.first_token.unwrap_or(now),
                            completed: now,
                            prompt_tokens: work.prompt_tokens,
                            output_tokens: done.tokens,
                            failed: emission.failed,
                        });
                    }
                }
                if replicas[r].is_idle() {
                    // With every request sent by now, this instant's sends too.
                    clocks[r].wake = Some(now);
                } else {
                    plan(&mut replicas[r], &mut clocks[r], now, Some(began));
                }
            }
            (_, Some(sent), waking) if before(sent, waking.map(|w| w.0)) => {
                let (item, _) = queue.pop_front().expect("a request to send");
                free_slots.pop_front();
                let work = &items[item];
                next_id += 1;
                let loads = replicas.iter().zip(&clocks).map(|(e, c)| (e.waiting() + c.arrived.len(), e.running()));
                let r = routing.pick(loads, next_id as usize - 1);
                let request = SeqRequest {
                    id: next_id,
                    prompt_tokens: work.prompt_tokens,
                    block_hashes: work.block_hashes.clone(),
                    max_tokens: work.output_tokens.max(1),
                    seed: next_id,
                };
                clocks[r].arrived.push((request, sent));
                if clocks[r].step.is_none() && clocks[r].wake.is_none() {
                    clocks[r].wake = Some(sent);
                }
                in_flight.insert(next_id, InFlight { item, sent, first_token: None, tokens: 0 });
            }
            (_, _, Some((now, r))) => {
                clocks[r].wake = None;
                plan(&mut replicas[r], &mut clocks[r], now, None);
            }
            _ => break,
        }
    }
    timings.into_iter().flatten().collect()
}

/// Chains block hashes: block `i`'s hash covers its content and every block before it.
pub fn block_hashes(blocks: impl IntoIterator<Item = u64>) -> Vec<u64> {
    continue_block_hashes(None, blocks)
}

/// Chains the hashes of `blocks` after a block whose hash is `last` (`None`: from the start), as
/// [`block_hashes`] would have had they followed it.
pub fn continue_block_hashes(last: Option<u64>, blocks: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut previous = last.unwrap_or(0xcbf2_9ce4_8422_2325_u64);
    blocks
        .into_iter()
        .map(|content| {
            previous = mix(previous ^ content.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            previous
        })
        .collect()
}

/// A 64-bit finaliser (SplitMix64's): spreads every input bit over the output.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `count` unique prompts of exactly `input` tokens, each asking for `output` tokens.
pub fn random(count: usize, input: usize, output: usize, seed: u64) -> Vec<WorkItem> {
    (0..count)
        .map(|i| {
            let content = mix(seed ^ mix(i as u64 + 1));
            WorkItem {
                prompt_tokens: input,
                output_tokens: output,
                block_hashes: block_hashes((0..input / BLOCK_TOKENS).map(|b| content ^ mix(b as u64))),
            }
        })
        .collect()
}

/// Requests shaped as the reference reports' ShareGPT runs: prompt lengths long-tailed
/// (log-normal), output lengths from [`SHAREGPT_OUTPUT_QUANTILES`], both scaled so their means are
/// the reports' (342.058 prompt and 281.412 output tokens per request).
pub fn sharegpt_like(count: usize, seed: u64) -> Vec<WorkItem> {
    sharegpt_shaped(count, seed, 342.058, 281.412)
}

/// [`sharegpt_like`]'s shapes scaled to other means: ShareGPT as another tokenizer and chat
/// template count it (`vllm bench serve`'s runs of Qwen3 count 217.4 and 201.6 tokens a request).
pub fn sharegpt_shaped(count: usize, seed: u64, input_mean: f64, output_mean: f64) -> Vec<WorkItem> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let raw: Vec<(f64, f64)> =
        (0..count).map(|_| ((1.0 * standard_normal(&mut rng)).exp(), output_quantile(rng.random()))).collect();
    let scale = |mean: f64, pick: fn(&(f64, f64)) -> f64| mean * count as f64 / raw.iter().map(pick).sum::<f64>();
    let (input_scale, output_scale) = (scale(input_mean, |r| r.0), scale(output_mean, |r| r.1));
    raw.iter()
        .enumerate()
        .map(|(i, (input, output))| {
            let prompt_tokens = ((input * input_scale).round() as usize).clamp(4, 8192);
            let content = mix(seed ^ mix(i as u64 + 1));
            WorkItem {
                prompt_tokens,
                output_tokens: ((output * output_scale).round() as usize).clamp(1, 4096),
                block_hashes: block_hashes((0..prompt_tokens / BLOCK_TOKENS).map(|b| content ^ mix(b as u64))),
            }
        })
        .collect()
}

/// A ShareGPT file (`[{"conversations": [{"from": "human", ...}, {"from": "gpt", ...}]}]`) whose
/// conversations have [`sharegpt_like`]'s lengths, one word a token (as loadgen counts without a
/// tokenizer, and as the simulator does): the stand-in for `ShareGPT_V3_unfiltered_cleaned_split.json`
/// when a study is rehearsed where that file cannot be downloaded. Every prompt starts with its own
/// words, so no two share a cached prefix (ShareGPT's first turns rarely do).
pub fn sharegpt_like_file(count: usize, seed: u64) -> serde_json::Value {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5348_4152_4547_5054);
    let mut text = |words: usize| {
        let mut out = String::with_capacity(words * 3);
        for i in 0..words {
            if i > 0 {
                out.push(' ');
            }
            let n: u32 = rng.random_range(0..26 * 26);
            out.push(char::from(b'a' + (n / 26) as u8));
            out.push(char::from(b'a' + (n % 26) as u8));
        }
        out
    };
    let conversations: Vec<serde_json::Value> = sharegpt_like(count, seed)
        .iter()
        .enumerate()
        .map(|(i, item)| {
            // The conversation's number first: a prefix of its own whatever the random words.
            let prompt = format!("c{i} {}", text(item.prompt_tokens - 1));
            serde_json::json!({
                "id": format!("sim-{i}"),
                "conversations": [
                    { "from": "human", "value": prompt },
                    { "from": "gpt", "value": text(item.output_tokens) },
                ],
            })
        })
        .collect();
    serde_json::Value::Array(conversations)
}

/// ShareGPT's reply lengths as the reference reports show them, as (share, length over the mean)
/// points of their quantile function: at 1 and 4 req/s a request's latency is its length times a
/// near-constant step, and the 9B latency study's latencies there have their median at 0.885 of
/// the mean, P95 at 2.59 and P99 at 3.0; the 0.8 point makes the mean 1, the ends close it. A
/// log-normal cannot hold both a median that close to the mean and a tail that short.
pub const SHAREGPT_OUTPUT_QUANTILES: [(f64, f64); 6] =
    [(0.0, 0.02), (0.5, 0.885), (0.8, 1.37), (0.95, 2.59), (0.99, 3.0), (1.0, 3.3)];

/// The length (over the mean) at share `u` of [`SHAREGPT_OUTPUT_QUANTILES`], linear between points.
fn output_quantile(u: f64) -> f64 {
    let points = &SHAREGPT_OUTPUT_QUANTILES;
    let i = points.iter().position(|(q, _)| *q >= u).unwrap_or(points.len() - 1).max(1);
    let ((q0, v0), (q1, v1)) = (points[i - 1], points[i]);
    v0 + (v1 - v0) * (u - q0) / (q1 - q0)
}

/// `count` requests in `groups` groups; a group's prompts share their first `prefix` tokens and
/// differ in the last `suffix`.
pub fn shared_prefix(count: usize, groups: usize, prefix: usize, suffix: usize, output: usize) -> Vec<WorkItem> {
    (0..count)
        .map(|i| {
            let group = (i % groups.max(1)) as u64 + 1;
            let blocks = (prefix + suffix) / BLOCK_TOKENS;
            let shared = prefix / BLOCK_TOKENS;
            let content =
                (0..blocks).map(|b| if b < shared { mix(group) ^ b as u64 } else { mix(!(i as u64)) ^ b as u64 });
            WorkItem { prompt_tokens: prefix + suffix, output_tokens: output, block_hashes: block_hashes(content) }
        })
        .collect()
}
