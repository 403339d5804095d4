//! The metric definitions, applied to request records. This is the one place
//! they are computed: loadgen, the controller and the reports all call
//! [`summarize`]. See `docs/metrics.md` for the definitions in prose.

use serde::{Deserialize, Serialize};

use crate::record::{Phase, RequestRecord};

mod build;
pub mod noise;
pub mod sessions;
pub mod steady;

pub use build::{GAPS_KEPT, SummaryBuilder};

const NS_PER_S: f64 = 1e9;
const NS_PER_MS: f64 = 1e6;

/// Mean and percentiles of one latency metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub mean: f64,
    /// The block's three percentiles, always computed (the self-check and
    /// the validity rules read them) whatever else was asked.
    pub median: f64,
    pub p95: f64,
    pub p99: f64,
    /// Number of samples; 0 means every other field is 0.
    pub count: u64,
    /// The percentiles the run asked for, in its order. Empty in summaries
    /// stored before they could be chosen: the three above were then the
    /// ones asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub percentiles: Vec<Percentile>,
}

/// The `p`th percentile (0..=100) of a metric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentile {
    pub p: f64,
    pub value: f64,
}

/// The percentiles asked when none are: those of the reference block.
pub const DEFAULT_PERCENTILES: [f64; 3] = [50.0, 95.0, 99.0];

impl Distribution {
    /// Summarizes samples with the default percentiles; see
    /// [`Distribution::with_percentiles`].
    pub fn of(samples: Vec<f64>) -> Distribution {
        Distribution::with_percentiles(samples, &DEFAULT_PERCENTILES)
    }

    /// Summarizes samples; percentiles interpolate linearly between the two
    /// nearest ranks (numpy's default, which `vllm bench serve` uses). `asked`
    /// are in 0..=100.
    pub fn with_percentiles(mut samples: Vec<f64>, asked: &[f64]) -> Distribution {
        if samples.is_empty() {
            let percentiles = asked.iter().map(|&p| Percentile { p, value: 0.0 }).collect();
            return Distribution { percentiles, ..Distribution::default() };
        }
        let mean = Sum::of(samples.iter().copied()).mean();
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        Distribution::from_ranks(n, mean, asked, |rank| samples[rank])
    }

    /// Summarizes samples too many to copy (a gap per chunk of every
    /// request of a long run, say): `samples` gives them again for each of a
    /// few passes, and only the samples near each percentile are ever held
    /// at once. The numbers are exactly those of [`Distribution::with_percentiles`].
    pub fn of_many<I: Iterator<Item = f64>>(samples: impl Fn() -> I, asked: &[f64]) -> Distribution {
        let sum = Sum::of(samples());
        let n = sum.n;
        if n <= SORT_LIMIT {
            return Distribution::with_percentiles(samples().collect(), asked);
        }
        let mut ranks: Vec<usize> = [50.0, 95.0, 99.0]
            .iter()
            .chain(asked)
            .flat_map(|&p| {
                let rank = rank_of(n, p);
                [rank.floor() as usize, rank.ceil() as usize]
            })
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let values = select_ranks(&samples, n, &ranks);
        let at = |rank: usize| ranks.binary_search(&rank).map_or(f64::NAN, |i| values[i]);
        Distribution::from_ranks(n, sum.mean(), asked, at)
    }

    /// The summary of `n` samples whose mean is `mean`, given the sample of
    /// each rank in sorted order.
    fn from_ranks(n: usize, mean: f64, asked: &[f64], at: impl Fn(usize) -> f64) -> Distribution {
        let percentile = |p: f64| {
            let rank = rank_of(n, p);
            let (lo, hi) = (at(rank.floor() as usize), at(rank.ceil() as usize));
            lo + (hi - lo) * (rank - rank.floor())
        };
        Distribution {
            mean,
            median: percentile(50.0),
            p95: percentile(95.0),
            p99: percentile(99.0),
            count: n as u64,
            percentiles: asked.iter().map(|&p| Percentile { p, value: percentile(p) }).collect(),
        }
    }

    /// The `p`th percentile, when it was asked (or, for a summary stored
    /// before percentiles could be chosen, when it is one of the block's).
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if self.percentiles.is_empty() {
            return [(50.0, self.median), (95.0, self.p95), (99.0, self.p99)]
                .into_iter()
                .find(|&(q, _)| q == p)
                .map(|(_, value)| value);
        }
        self.percentiles.iter().find(|q| q.p == p).map(|q| q.value)
    }
}

/// A sum of samples that is the same in whatever order they come (a run's
/// records come back in the order they finish, and are stored in the order
/// they were sent): each is added as a fixed-point number of 2^-60 units,
/// exactly, and the sum is rounded once, at the end.
#[derive(Clone, Copy, Debug, Default)]
struct Sum {
    n: usize,
    units: i128,
}

impl Sum {
    const UNIT: f64 = (1u64 << 60) as f64;

    fn of(samples: impl Iterator<Item = f64>) -> Sum {
        let mut sum = Sum::default();
        for x in samples {
            sum.add(x, 1);
        }
        sum
    }

    /// Adds `times` samples of `x`.
    fn add(&mut self, x: f64, times: usize) {
        self.n += times;
        // Exact for every sample from 2^-8 up to 2^67 (a duration in ms or
        // s); a smaller one loses what is below 2^-60.
        self.units += (x * Sum::UNIT) as i128 * times as i128;
    }

    fn mean(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.units as f64 / Sum::UNIT / self.n as f64 }
    }
}

/// Where the `p`th percentile falls among `n` sorted samples: percentiles
/// interpolate linearly between the two nearest ranks (numpy's default).
fn rank_of(n: usize, p: f64) -> f64 {
    (p / 100.0).clamp(0.0, 1.0) * n.saturating_sub(1) as f64
}

/// Up to this many samples are simply sorted.
const SORT_LIMIT: usize = 1 << 16;

/// The samples of the given `ranks` (sorted, each below `n`) in the sorted
/// order of `samples`, without sorting them all: a radix selection that
/// narrows each rank down to the samples sharing 16 more bits of its sort
/// key per pass, and sorts them once there are few enough.
fn select_ranks<I: Iterator<Item = f64>>(samples: &impl Fn() -> I, n: usize, ranks: &[usize]) -> Vec<f64> {
    // The key sorts as `f64::total_cmp` does.
    let key = |x: f64| {
        let bits = x.to_bits();
        if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
    };
    let value = |key: u64| f64::from_bits(if key >> 63 == 1 { key & !(1 << 63) } else { !key });
    /// Where a rank's search stands: its sample is the `rank`th of the
    /// `count` samples whose key starts with the `known` bits of `prefix`.
    #[derive(Clone, Copy)]
    struct Search {
        rank: usize,
        prefix: u64,
        known: u32,
        count: usize,
    }
    let mut searches: Vec<Search> = ranks.iter().map(|&rank| Search { rank, prefix: 0, known: 0, count: n }).collect();
    let mut found: Vec<Option<f64>> = vec![None; ranks.len()];
    loop {
        for (s, f) in searches.iter().zip(found.iter_mut()) {
            if f.is_none() && s.known == 64 {
                *f = Some(value(s.prefix));
            }
        }
        // The groups of samples still to look into; ranks may share one
        // (and those that do are next to each other: the ranks are sorted,
        // and so are the key prefixes they narrowed down to).
        let mut groups: Vec<(u64, u32, usize)> = searches
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(s, _)| (s.prefix, s.known, s.count))
            .collect();
        groups.dedup();
        if groups.is_empty() {
            break;
        }
        let collect: Vec<bool> = groups.iter().map(|&(_, _, count)| count <= SORT_LIMIT).collect();
        let mut kept: Vec<Vec<f64>> =
            groups.iter().zip(&collect).map(|(g, &c)| Vec::with_capacity(if c { g.2 } else { 0 })).collect();
        let mut counts: Vec<Vec<u32>> =
            collect.iter().map(|&c| if c { Vec::new() } else { vec![0; 1 << 16] }).collect();
        for x in samples() {
            let k = key(x);
            for (g, &(prefix, known, _)) in groups.iter().enumerate() {
                if known == 0 || k >> (64 - known) == prefix {
                    if collect[g] {
                        kept[g].push(x);
                    } else {
                        counts[g][((k >> (48 - known)) & 0xffff) as usize] += 1;
                    }
                }
            }
        }
        for (s, f) in searches.iter_mut().zip(found.iter_mut()).filter(|(_, f)| f.is_none()) {
            let Some(g) = groups.iter().position(|&(prefix, known, _)| (prefix, known) == (s.prefix, s.known)) else {
                continue;
            };
            if collect[g] {
                kept[g].sort_unstable_by(f64::total_cmp);
                // Always found; NaN only if `samples` gave different samples
                // on another pass, which must not loop forever.
                *f = Some(kept[g].get(s.rank).copied().unwrap_or(f64::NAN));
                continue;
            }
            // As above: a rank past the counts (samples that changed) ends
            // the search with NaN.
            *f = Some(f64::NAN);
            let mut before = 0usize;
            for (bucket, &count) in counts[g].iter().enumerate() {
                if before + count as usize > s.rank {
                    *s = Search {
                        rank: s.rank - before,
                        prefix: (s.prefix << 16) | bucket as u64,
                        known: s.known + 16,
                        count: count as usize,
                    };
                    *f = None;
                    break;
                }
                before += count as usize;
            }
        }
    }
    found.into_iter().map(|f| f.unwrap_or(f64::NAN)).collect()
}

/// Failed requests by outcome; their sum is `Summary::failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failures {
    pub http_error: u64,
    pub timeout: u64,
    pub cancelled: u64,
    /// The server reported an error inside the stream.
    pub incomplete: u64,
    pub transport_error: u64,
    /// The connection ended after the response began, before it was done.
    #[serde(default)]
    pub disconnected: u64,
    /// Bad framing, or a chunk that is not the JSON expected.
    #[serde(default)]
    pub malformed: u64,
}

/// Failed requests that share a reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureReason {
    pub reason: String,
    pub count: u64,
}

/// The most reasons a summary names; the rest are counted as one.
pub const REASONS_NAMED: usize = 8;

/// Distinct reasons counted before any further one is counted as "other".
const REASONS_COUNTED: usize = 1024;

/// What the rest of the reasons are named as.
const OTHER_REASONS: &str = "other reasons";

/// Counts of failed requests by reason, as they come.
#[derive(Clone, Debug, Default)]
pub struct ReasonCounts(std::collections::BTreeMap<String, u64>);

impl ReasonCounts {
    pub fn add(&mut self, reason: String, count: u64) {
        let key = if self.0.len() >= REASONS_COUNTED && !self.0.contains_key(&reason) {
            OTHER_REASONS.to_owned()
        } else {
            reason
        };
        *self.0.entry(key).or_default() += count;
    }

    /// The commonest `REASONS_NAMED` (most first, then by name), and the
    /// rest as one.
    pub fn named(self) -> Vec<FailureReason> {
        let mut all: Vec<FailureReason> =
            self.0.into_iter().map(|(reason, count)| FailureReason { reason, count }).collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        if all.len() > REASONS_NAMED {
            let rest: u64 = all.drain(REASONS_NAMED - 1..).map(|r| r.count).sum();
            all.push(FailureReason { reason: OTHER_REASONS.to_owned(), count: rest });
        }
        all
    }
}

/// The reason a failed request is counted under: for a server's refusal, or
/// an error the server sent in the body or the stream of a response, its
/// status and the message of its JSON error (vLLM's `message`, OpenAI's
/// `error.message`, a `detail`) with every number in it written N, so that
/// "maximum context length is 8192 tokens, you requested 9000" is one
/// reason however long each prompt was; else the client's error.
pub fn failure_reason(r: &RequestRecord) -> String {
    let error = r.error.as_deref().unwrap_or(r.outcome.as_str());
    let reason = match error.split_once(": ") {
        Some((status, body)) if status.starts_with("http ") || status.starts_with("server error") => {
            let json: Option<serde_json::Value> = serde_json::from_str(body).ok();
            let message = json.as_ref().and_then(|v| {
                [&v["message"], &v["error"]["message"], &v["detail"], &v["error"]].into_iter().find_map(|m| m.as_str())
            });
            format!("{status}: {}", numbers_as_n(message.unwrap_or(body)))
        }
        _ => error.to_owned(),
    };
    let mut end = reason.len().min(160);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].trim_end().to_owned()
}

fn numbers_as_n(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// The numbers of one "Serving Benchmark Result" block, and the load
/// generator's check of itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub successful: u64,
    /// Requests sent that did not succeed (every non-ok outcome).
    pub failed: u64,
    /// The configured concurrency cap, if one was set.
    pub max_concurrency: Option<u64>,
    /// First send to last completion.
    pub duration_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    /// Most output tokens that arrived in any 1-second window; `None` for a
    /// run shorter than the window, whose every token would fit in it (a
    /// "peak" below the mean).
    pub peak_output_throughput: Option<f64>,
    /// Most requests in flight at once.
    pub peak_concurrent: u64,
    pub total_token_throughput: f64,
    pub latency_s: Distribution,
    pub ttft_ms: Distribution,
    pub tpot_ms: Distribution,
    /// Gaps between successive chunks (vLLM-compatible).
    pub itl_ms: Distribution,
    /// The same gaps per token: a gap before a chunk of k tokens counts k
    /// times as gap / k, so bundled tokens do not show as an ITL of 0.
    #[serde(default)]
    pub itl_per_token_ms: Distribution,
    /// Latency from the scheduled send: a client that fell behind, or a
    /// binding cap, shows here.
    #[serde(default)]
    pub latency_from_scheduled_s: Distribution,
    /// TTFT from the scheduled send.
    #[serde(default)]
    pub ttft_from_scheduled_ms: Distribution,
    /// Connection setup of the requests that opened one.
    #[serde(default)]
    pub connect_ms: Distribution,
    /// Failed requests by outcome.
    #[serde(default)]
    pub failures: Failures,
    /// Failed requests by reason (`failure_reason`), the commonest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_reasons: Vec<FailureReason>,
    /// Requests sent during warm-up or cool-down: recorded, not measured.
    #[serde(default)]
    pub excluded: u64,
    /// Sent minus ready (the deadline, or the moment a concurrency slot came
    /// free): how late the client itself was.
    #[serde(default)]
    pub dispatch_lag_ms: Distribution,
    /// The schedule's rate over the measured requests, requests per second;
    /// `None` when they were all due at once.
    #[serde(default)]
    pub offered_rate: Option<f64>,
    /// Sends per second over the measured requests.
    #[serde(default)]
    pub achieved_rate: f64,
    /// Requests that waited for a concurrency slot: when > 0 the cap was
    /// binding and the achieved rate may rightly fall short of the offered one.
    #[serde(default)]
    pub cap_waits: u64,
    /// The P99 dispatch lag above which the run is invalid, ms: the one
    /// asked for, or the one its load kind gives (see `lag_limit_for`).
    #[serde(default = "default_lag_limit_ms")]
    pub lag_limit_ms: f64,
    /// The share of the offered rate the achieved rate may fall short by
    /// (with no binding cap) before the run is invalid.
    #[serde(default = "default_rate_tolerance")]
    pub rate_tolerance: f64,
    /// CPU time (user + system) the load generator used during the run, s.
    #[serde(default)]
    pub client_cpu_s: Option<f64>,
    /// Why the run cannot be trusted, when it cannot: the client did not keep
    /// its own schedule.
    #[serde(default)]
    pub invalid: Option<String>,
    /// The server's token counts against the tokenizer's, when loadgen had
    /// one; like the CPU time, loadgen's own account, not the records'.
    #[serde(default)]
    pub usage_check: Option<UsageCheck>,
    /// The requests within the goodput SLOs, when some were given.
    #[serde(default)]
    pub goodput: Option<Goodput>,
    /// Successful replies whose usage counted fewer tokens than the reply
    /// streamed events that carried text: no server streams a token in two
    /// events, so their counts cannot be true (the tokens-per-second and
    /// TPOT figures rest on them). Counted with or without a tokenizer;
    /// like the CPU time, loadgen's own account.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub usage_below_events: u64,
    /// The window in which the requests in flight held at 90% of their
    /// peak, the figures over it and whether they held still
    /// (`steady::SteadyState`); `None` for fewer than two requests, and for
    /// a block pooled from repeats (each repeat has its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady_state: Option<steady::SteadyState>,
    /// Each headline figure's standard error from the run's own requests
    /// (batch means, `noise::Noise`): what one run says of its own noise;
    /// `None` for too few requests, and for a block pooled from repeats
    /// (their spread says it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<noise::Noise>,
    /// A multi-turn run's sessions: how many, their turns, and TTFT by
    /// turn number (`sessions::Sessions`); `None` for any other run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<sessions::Sessions>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// vLLM's goodput SLOs (`--goodput ttft:200 tpot:50 e2el:5000`, ms): a
/// successful request is good when its TTFT, its TPOT (decode time over
/// its output tokens after the first; 0 for one token) and its end-to-end
/// latency are each within the bound given; an absent bound is no bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// `KEY:VALUE` items as vLLM takes them: keys `ttft`, `tpot`, `e2el`,
    /// values in ms, at least 0.
    pub fn parse(items: &[String]) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for item in items {
            let Some((key, value)) = item.split_once(':') else {
                return Err(format!("'{item}' is not KEY:VALUE (e.g. ttft:200, tpot:50, e2el:5000, in ms)"));
            };
            let ms: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("'{item}': the bound must be a number of ms, at least 0"))?;
            let slot = match key.trim() {
                "ttft" => &mut slo.ttft_ms,
                "tpot" => &mut slo.tpot_ms,
                "e2el" => &mut slo.e2el_ms,
                other => return Err(format!("'{item}': unknown metric '{other}'; the SLOs are ttft, tpot and e2el")),
            };
            if slot.replace(ms).is_some() {
                return Err(format!("'{item}': {key} is given twice"));
            }
        }
        if slo == Slo::default() {
            return Err("no SLO given: ttft:MS, tpot:MS or e2el:MS".to_owned());
        }
        Ok(slo)
    }

    /// Whether a successful request met every bound.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let within = |bound: Option<f64>, ns: f64| bound.is_none_or(|ms| ns / NS_PER_MS <= ms);
        within(self.ttft_ms, r.ttft_ns().unwrap_or(0) as f64)
            && within(self.tpot_ms, r.tpot_ns().unwrap_or(0.0))
            && within(self.e2el_ms, r.latency_ns() as f64)
    }

    /// As `--goodput` takes them: `ttft:200 tpot:50`.
    pub fn words(&self) -> Vec<String> {
        [("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|ms| format!("{k}:{ms}")))
            .collect()
    }
}

#[cfg(test)]
mod goodput_tests {
    use super::*;
    use crate::record::{Chunk, Outcome};

    fn request(ttft_ms: i64, decode_ms: i64, tokens: u32) -> RequestRecord {
        let ms = 1_000_000;
        let first = 10 * ms + ttft_ms * ms;
        let done = first + decode_ms * ms;
        RequestRecord {
            seq: 0,
            scheduled_ns: 10 * ms,
            sent_ns: 10 * ms,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: Some(first),
            completed_ns: done,
            chunks: [Chunk { at_ns: first, tokens: 1 }, Chunk { at_ns: done, tokens: tokens - 1 }]
                .into_iter()
                .collect(),
            prompt_tokens: 8,
            output_tokens: tokens,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            phase: Default::default(),
            turn: None,
        }
    }

    #[test]
    fn a_request_is_good_when_every_bound_given_holds() {
        let slo = Slo::parse(&["ttft:200".into(), "tpot:50".into()]).expect("vLLM's form");
        assert_eq!(slo, Slo { ttft_ms: Some(200.0), tpot_ms: Some(50.0), e2el_ms: None });
        assert_eq!(slo.words(), ["ttft:200", "tpot:50"]);
        // TTFT 150 ms, 11 tokens over 400 ms after the first: TPOT 40 ms.
        assert!(slo.met_by(&request(150, 400, 11)));
        assert!(!slo.met_by(&request(250, 400, 11)), "TTFT over");
        assert!(!slo.met_by(&request(150, 600, 11)), "TPOT 60 ms over");
        // Exactly on the bound is within it (vLLM: slo >= value).
        assert!(slo.met_by(&request(200, 500, 11)));
        let e2el = Slo::parse(&["e2el:500".into()]).expect("e2el");
        assert!(e2el.met_by(&request(100, 400, 5)) && !e2el.met_by(&request(100, 401, 5)));
        for bad in [vec![], vec!["ttft:200".into(), "ttft:100".into()]] {
            assert!(Slo::parse(&bad).is_err(), "{bad:?}");
        }

        // The summary counts them, per second of the run.
        let records = vec![request(150, 400, 11), request(250, 400, 11), request(150, 600, 11), request(100, 100, 11)];
        let options = SummaryOptions { goodput: Some(slo), ..SummaryOptions::new(None) };
        let s = summarize_with(&records, options);
        let g = s.goodput.expect("goodput asked for");
        assert_eq!(g.good, 2);
        assert!((g.request_goodput - 2.0 / s.duration_s).abs() < 1e-9, "{g:?}");
        let line = format!("{:<40} {:.2}\n", "Request goodput (req/s):", g.request_goodput);
        assert!(crate::block::render_block(&s, None).contains(&line), "{}", crate::block::render_block(&s, None));
        assert_eq!(SummaryOptions::of(&s).goodput, Some(slo), "recomputed with the same SLOs");
        assert_eq!(summarize(&records, None).goodput, None);
    }
}

/// The requests within the SLOs over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub slo: Slo,
    /// Successful requests that met every bound.
    pub good: u64,
    /// `good` per second of the run's duration (vLLM's `request_goodput`).
    pub request_goodput: f64,
}

/// The server's token counts (its `usage`) against the tokenizer's, over the
/// measured successful requests. Prompts are compared on the completions
/// endpoint only (a chat template adds tokens of its own); a count is off
/// when it differs by more than [`USAGE_TOLERANCE`] and 2 tokens (a BOS, an
/// EOS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageCheck {
    pub prompts_compared: u64,
    pub prompts_off: u64,
    /// The server's prompt tokens over the tokenizer's, all compared.
    pub prompt_ratio: f64,
    pub outputs_compared: u64,
    pub outputs_off: u64,
    /// The server's completion tokens over the tokenizer's count of the
    /// streamed text, all compared.
    pub output_ratio: f64,
    /// Replies whose server count equalled the text events they streamed
    /// (one token an event, as vLLM and SGLang stream): the stream itself
    /// agrees with the server, and they were not tokenized again, but for
    /// one in `USAGE_SAMPLE` (those are in `outputs_compared`).
    #[serde(default)]
    pub outputs_by_events: u64,
}

/// Of the replies whose count the stream's events already agree with, one
/// in this many is tokenized again all the same: a server that counts
/// wrongly in step with its events is still caught.
pub const USAGE_SAMPLE: u64 = 128;

/// How far a server's token count may be from the tokenizer's.
pub const USAGE_TOLERANCE: f64 = 0.05;

impl UsageCheck {
    /// Whether a server's count is off from the tokenizer's.
    pub fn off(server: u32, tokenizer: u32) -> bool {
        let diff = f64::from(server.abs_diff(tokenizer));
        diff > 2.0 && diff > USAGE_TOLERANCE * f64::from(tokenizer)
    }

    /// What to tell the reader, when any count was off.
    pub fn describe(&self) -> Option<String> {
        let mut said = Vec::new();
        if self.prompts_off > 0 {
            said.push(format!(
                "the server's prompt token counts differ from the tokenizer's on {} of {} requests (server / \
                 tokenizer {:.2}): is --processor the served model's tokenizer, and does the server count tokens?",
                self.prompts_off, self.prompts_compared, self.prompt_ratio
            ));
        }
        if self.outputs_off > 0 {
            said.push(format!(
                "the server's completion token counts differ from the streamed text's on {} of {} requests \
                 (server / tokenizer {:.2})",
                self.outputs_off, self.outputs_compared, self.output_ratio
            ));
        }
        (!said.is_empty()).then(|| said.join("; "))
    }
}

/// The P99 dispatch lag limit of summaries recorded before the limit
/// followed the load, ms: what reading one of them assumes.
pub const DEFAULT_LAG_LIMIT_MS: f64 = 5.0;

fn default_lag_limit_ms() -> f64 {
    DEFAULT_LAG_LIMIT_MS
}

/// A closed loop's P99 dispatch lag may be this share of its median TTFT.
pub const LAG_SHARE_OF_TTFT: f64 = 0.10;

/// No lag limit is below this, ms: the resolution of the client's timers.
pub const MIN_LAG_LIMIT_MS: f64 = 1.0;

/// The achieved rate may fall this share short of the offered one (with no
/// binding cap) before a run is invalid.
pub const DEFAULT_RATE_TOLERANCE: f64 = 0.05;

fn default_rate_tolerance() -> f64 {
    DEFAULT_RATE_TOLERANCE
}

/// The P99 dispatch lag limit a run's load kind gives, ms, and what it is.
/// A tenth of the median TTFT, past which the client's own delay is a
/// visible part of what each request measures and, in a closed loop, of its
/// cycle. An open loop (a rate) may also lag up to one mean inter-arrival
/// gap, within which the arrivals keep the order and spacing offered: at a
/// low rate the gap is the larger, at a high rate the TTFT. Never below
/// [`MIN_LAG_LIMIT_MS`].
pub fn lag_limit_for(offered_rate: Option<f64>, median_ttft_ms: f64) -> (f64, &'static str) {
    let ttft = (LAG_SHARE_OF_TTFT * median_ttft_ms, "a tenth of the median TTFT");
    let (limit, basis) = match offered_rate {
        Some(rate) if rate > 0.0 && 1000.0 / rate > ttft.0 => (1000.0 / rate, "one mean inter-arrival gap"),
        _ => ttft,
    };
    if limit < MIN_LAG_LIMIT_MS { (MIN_LAG_LIMIT_MS, "the client's timer resolution") } else { (limit, basis) }
}

impl Summary {
    /// The steady state, where a block says it: one reached, or a closed
    /// loop's that was not (an open loop's requests in flight follow its
    /// arrivals: it is not expected to hold them level).
    pub fn steady_state_said(&self) -> Option<&steady::SteadyState> {
        let closed_loop = self.offered_rate.is_none() && self.max_concurrency.is_some();
        self.steady_state.as_ref().filter(|w| w.reached || closed_loop)
    }

    /// The steady state a tuner ranks a closed loop by: one reached. A
    /// closed loop's throughput over the whole run mixes in its ramp-up
    /// and its drain, which say more of the request count than of the
    /// engine; an open loop's follows its offered rate, so it is ranked
    /// over the whole run.
    pub fn steady_state_ranked(&self) -> Option<&steady::SteadyState> {
        let closed_loop = self.offered_rate.is_none() && self.max_concurrency.is_some();
        self.steady_state.as_ref().filter(|w| w.reached && closed_loop)
    }

    /// Successful / sent, in 0..=1.
    pub fn success_rate(&self) -> f64 {
        let sent = self.successful + self.failed;
        if sent == 0 { 0.0 } else { self.successful as f64 / sent as f64 }
    }

    /// `success rate 80.0% (1 failed: http 400: ...)`, or `(55 failed, 10
    /// of them: ...)`: the rate and, where the failures were counted by
    /// reason, the commonest.
    pub fn success_said(&self) -> String {
        let rate = format!("success rate {:.1}%", self.success_rate() * 100.0);
        match self.failure_reasons.first() {
            Some(r) if r.count == self.failed => format!("{rate} ({} failed: {})", self.failed, r.reason),
            Some(r) => format!("{rate} ({} failed, {} of them: {})", self.failed, r.count, r.reason),
            None => rate,
        }
    }
}

/// What a summary needs besides the records.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryOptions {
    /// The configured concurrency cap, if one was set.
    pub max_concurrency: Option<u64>,
    /// The P99 dispatch lag above which the run is invalid, ms; `None`:
    /// the one the load kind gives (`lag_limit_for`).
    pub lag_limit_ms: Option<f64>,
    /// The share of the offered rate the achieved rate may fall short by.
    pub rate_tolerance: f64,
    /// The percentiles (0..=100) every distribution carries.
    pub percentiles: Vec<f64>,
    /// The goodput SLOs, when the run has them.
    pub goodput: Option<Slo>,
}

impl SummaryOptions {
    pub fn new(max_concurrency: Option<u64>) -> SummaryOptions {
        SummaryOptions {
            max_concurrency,
            lag_limit_ms: None,
            rate_tolerance: DEFAULT_RATE_TOLERANCE,
            percentiles: DEFAULT_PERCENTILES.to_vec(),
            goodput: None,
        }
    }

    /// The options a summary was made with, so that it can be recomputed
    /// from its records.
    pub fn of(summary: &Summary) -> SummaryOptions {
        let asked = &summary.latency_s.percentiles;
        SummaryOptions {
            max_concurrency: summary.max_concurrency,
            lag_limit_ms: Some(summary.lag_limit_ms),
            rate_tolerance: summary.rate_tolerance,
            percentiles: if asked.is_empty() {
                DEFAULT_PERCENTILES.to_vec()
            } else {
                asked.iter().map(|q| q.p).collect()
            },
            goodput: summary.goodput.map(|g| g.slo),
        }
    }
}

/// Computes the block's numbers from a run's records, with the limits its
/// load kind gives.
pub fn summarize(records: &[RequestRecord], max_concurrency: Option<u64>) -> Summary {
    summarize_with(records, SummaryOptions::new(max_concurrency))
}

/// Computes the block's numbers from a run's records. Warm-up and cool-down
/// records are counted in `excluded` and nowhere else. Everything but the
/// client's CPU time comes from the records, so a summary can always be
/// recomputed from them.
pub fn summarize_with(all: &[RequestRecord], options: SummaryOptions) -> Summary {
    let percentiles = options.percentiles.clone();
    let mut builder = SummaryBuilder::without_gaps(options);
    // After each record, no later one has a chunk before the earliest first
    // arrival among them: the peak's window settles up to there.
    let mut horizons = vec![i64::MAX; all.len()];
    for i in (1..all.len()).rev() {
        let first = all[i].chunks.first().map_or(i64::MAX, |c| c.at_ns);
        horizons[i - 1] = horizons[i].min(first);
    }
    for (r, horizon) in all.iter().zip(horizons) {
        builder.add(r);
        builder.settle(horizon);
    }
    // The chunk gaps are read from the records again on each pass, not
    // copied: they are the most numerous samples.
    let ok = || all.iter().filter(|r| r.phase == Phase::Measured && r.outcome.is_ok());
    // The gaps' noise as a builder gives it: only when they would be kept.
    let by_send = || ok().flat_map(|r| chunk_gaps(r).map(|(gap, _)| (r.sent_ns, gap as f64 / NS_PER_MS)));
    let kept = ok().map(|r| r.chunks.len().saturating_sub(1)).sum::<usize>() <= build::GAPS_KEPT;
    builder.finish_with(build::itl_distributions(|| ok().flat_map(chunk_gaps), &percentiles), kept.then_some(by_send))
}

/// Why a run is not to be trusted: the client lagged behind its schedule, or
/// (with no binding cap to explain it) sent slower than offered.
fn validity(s: &Summary, basis: &str) -> Option<String> {
    let mut reasons = Vec::new();
    if s.dispatch_lag_ms.count > 0 && s.dispatch_lag_ms.p99 > s.lag_limit_ms {
        reasons.push(format!(
            "p99 dispatch lag {:.2} ms exceeds {:.2} ms ({basis}): the load generator could not keep its schedule",
            s.dispatch_lag_ms.p99, s.lag_limit_ms
        ));
    }
    let share = 1.0 - s.rate_tolerance;
    if let Some(offered) = s.offered_rate
        && s.cap_waits == 0
        && s.achieved_rate < share * offered
    {
        reasons.push(format!(
            "achieved {:.2} req/s is below {}% of the offered {:.2} req/s and the concurrency cap was not binding",
            s.achieved_rate,
            (share * 1000.0).round() / 10.0,
            offered
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// How many output tokens one counted chunk token is worth in `r`: the
/// server's usage is the truth about the total, the chunk counts (the
/// tokenizer's, or words) only say how it is spread over the chunks.
fn token_scale(r: &RequestRecord) -> f64 {
    let counted: u64 = r.chunks.iter().map(|c| u64::from(c.tokens)).sum();
    if counted == 0 || r.output_tokens == 0 { 1.0 } else { f64::from(r.output_tokens) / counted as f64 }
}

/// Each gap between two chunks of `r`: (ns, the later chunk's tokens scaled
/// to the server's count).
fn chunk_gaps(r: &RequestRecord) -> impl Iterator<Item = (i64, f64)> + '_ {
    let scale = token_scale(r);
    r.chunks.pairs().map(move |(a, b)| (b.at_ns - a.at_ns, f64::from(b.tokens) * scale))
}

/// Each gap between two chunks of `r` as (per-token gap ns, tokens): the
/// chunk's tokens, scaled to the server's count, share the gap before it.
pub(crate) fn token_gaps_ns(r: &RequestRecord) -> impl Iterator<Item = (f64, usize)> + '_ {
    chunk_gaps(r).filter_map(|(gap, tokens)| build::per_token(gap, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Chunk, Outcome};

    /// A request sent at `sent_ms` whose tokens arrive one per chunk, the
    /// first after `ttft_ms` and then every `gap_ms`.
    fn streamed(seq: u64, sent_ms: i64, ttft_ms: i64, gap_ms: i64, tokens: u32) -> RequestRecord {
        let ms = 1_000_000;
        let first = (sent_ms + ttft_ms) * ms;
        let chunks: Vec<Chunk> =
            (0..i64::from(tokens)).map(|i| Chunk { at_ns: first + i * gap_ms * ms, tokens: 1 }).collect();
        RequestRecord {
            seq,
            scheduled_ns: sent_ms * ms,
            sent_ns: sent_ms * ms,
            first_token_ns: Some(first),
            completed_ns: chunks.last().map_or(first, |c| c.at_ns),
            chunks: chunks.into(),
            prompt_tokens: 10,
            output_tokens: tokens,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            slot_ns: None,
            connect_ns: None,
            phase: Phase::Measured,
            turn: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    /// A failed record with `error`.
    fn failed_with(error: &str) -> RequestRecord {
        RequestRecord { outcome: Outcome::HttpError, error: Some(error.into()), ..streamed(0, 0, 0, 0, 0) }
    }

    #[test]
    fn a_server_s_refusals_group_by_their_message_whatever_its_numbers() {
        let vllm = |n: u32| {
            format!(
                r#"http 400: {{"object":"error","message":"This model's maximum context length is 8192 tokens. However, you requested {n} tokens in the messages.","type":"BadRequestError","param":null,"code":400}}"#
            )
        };
        let said = "http 400: This model's maximum context length is N tokens. However, you requested N tokens in the messages.";
        assert_eq!(failure_reason(&failed_with(&vllm(9000))), said);
        assert_eq!(failure_reason(&failed_with(&vllm(12_345))), said);
        let openai =
            r#"http 429: {"error":{"message":"Rate limit reached: 60 requests a minute","type":"rate_limit"}}"#;
        assert_eq!(failure_reason(&failed_with(openai)), "http 429: Rate limit reached: N requests a minute");
        assert_eq!(failure_reason(&failed_with(r#"http 422: {"detail":"bad field"}"#)), "http 422: bad field");
        assert_eq!(failure_reason(&failed_with("http 503: busy, retry in 5 s")), "http 503: busy, retry in N s");
        // An error the server sent inside a response counts by its message too.
        let in_stream = r#"server error in stream: {"code":500,"message":"EngineCore died at step 12"}"#;
        assert_eq!(failure_reason(&failed_with(in_stream)), "server error in stream: EngineCore died at step N");
        let in_body = r#"server error: {"error":{"message":"out of memory (3 GiB)"}}"#;
        assert_eq!(failure_reason(&failed_with(in_body)), "server error: out of memory (N GiB)");
        // The client's own errors are said as they are; an excerpt cut short
        // (not JSON) is its text.
        assert_eq!(failure_reason(&failed_with("first-token timeout after 600 s")), "first-token timeout after 600 s");
        assert_eq!(failure_reason(&failed_with("http 500: {\"message\":\"cut")), "http 500: {\"message\":\"cut");
        let long = format!("http 500: {}", "é".repeat(200));
        assert!(failure_reason(&failed_with(&long)).len() <= 160);
        let none = RequestRecord { outcome: Outcome::Cancelled, ..streamed(0, 0, 0, 0, 0) };
        assert_eq!(failure_reason(&none), "cancelled");
    }

    #[test]
    fn a_summary_names_the_commonest_reasons_and_counts_the_rest_as_one() {
        let mut records: Vec<RequestRecord> = Vec::new();
        for (i, n) in (1..=10u64).enumerate() {
            for _ in 0..n {
                records.push(RequestRecord {
                    seq: records.len() as u64,
                    ..failed_with(&format!("reason {}", (b'a' + i as u8) as char))
                });
            }
        }
        records.push(streamed(records.len() as u64, 0, 10, 5, 4));
        let s = summarize(&records, None);
        assert_eq!(s.failed, 55);
        let named: Vec<(&str, u64)> = s.failure_reasons.iter().map(|r| (r.reason.as_str(), r.count)).collect();
        assert_eq!(
            named,
            [
                ("reason j", 10),
                ("reason i", 9),
                ("reason h", 8),
                ("reason g", 7),
                ("reason f", 6),
                ("reason e", 5),
                ("reason d", 4),
                ("other reasons", 6)
            ]
        );
        assert_eq!(s.success_said(), "success rate 1.8% (55 failed, 10 of them: reason j)");
        // Pooled repeats add up by reason.
        let mut again = ReasonCounts::default();
        for r in s.failure_reasons.iter().chain(&s.failure_reasons) {
            again.add(r.reason.clone(), r.count);
        }
        assert_eq!(again.named()[0], FailureReason { reason: "reason j".into(), count: 20 });
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let d = Distribution::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert!(close(d.mean, 2.5));
        assert!(close(d.median, 2.5));
        assert!(close(d.p95, 3.85));
        assert!(close(d.p99, 3.97));
        assert_eq!(d.count, 4);
        let empty = Distribution::of(vec![]);
        assert_eq!((empty.count, empty.mean, empty.percentile(95.0)), (0, 0.0, Some(0.0)));
    }

    #[test]
    fn many_samples_summarize_exactly_as_sorted_ones() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let n = 3 * SORT_LIMIT + 17;
        let sets: Vec<(&str, Vec<f64>)> = vec![
            ("uniform", (0..n).map(|_| rng.random_range(0.0..100.0)).collect()),
            ("all equal", vec![10.0; n]),
            ("few values", (0..n).map(|_| f64::from(rng.random_range(0..5u8)) * 2.5).collect()),
            ("signed", (0..n).map(|_| rng.random_range(-1e6..1e6)).collect()),
            ("clustered", (0..n).map(|_| 10.0 + rng.random_range(0.0..1e-9)).collect()),
            ("just over", (0..SORT_LIMIT + 1).map(|i| i as f64).collect()),
        ];
        let asked = [0.0, 1.0, 50.0, 99.9, 100.0];
        for (name, samples) in sets {
            let many = Distribution::of_many(|| samples.iter().copied(), &asked);
            assert_eq!(many, Distribution::with_percentiles(samples.clone(), &asked), "{name}");
        }
    }

    #[test]
    fn asked_percentiles_come_in_the_order_asked() {
        let d = Distribution::with_percentiles(vec![4.0, 1.0, 3.0, 2.0], &[90.0, 50.0, 100.0]);
        let asked: Vec<(f64, f64)> = d.percentiles.iter().map(|q| (q.p, q.value)).collect();
        assert_eq!(asked.len(), 3);
        assert!(asked.iter().zip([(90.0, 3.7), (50.0, 2.5), (100.0, 4.0)]).all(|(a, b)| a.0 == b.0 && close(a.1, b.1)));
        // Not asked: absent, though the block's three are still computed.
        assert_eq!(d.percentile(95.0), None);
        assert!(close(d.p95, 3.85));
        // A summary stored before percentiles could be chosen still answers
        // for the block's three.
        let old: Distribution =
            serde_json::from_str(r#"{"mean":1,"median":2,"p95":3,"p99":4,"count":5}"#).expect("old");
        assert_eq!((old.percentile(95.0), old.percentile(90.0)), (Some(3.0), None));
    }

    #[test]
    fn known_timings_give_known_metrics() {
        let records = vec![streamed(0, 0, 100, 10, 11), streamed(1, 50, 100, 10, 11)];
        let s = summarize(&records, Some(4));
        assert_eq!(s.successful, 2);
        assert_eq!(s.total_output_tokens, 22);
        assert_eq!(s.total_input_tokens, 20);
        assert!(close(s.ttft_ms.mean, 100.0));
        assert!(close(s.tpot_ms.mean, 10.0));
        assert!(close(s.itl_ms.median, 10.0));
        // First send at 0, last completion at 50 + 100 + 100 ms.
        assert!(close(s.duration_s, 0.25));
        assert!(close(s.latency_s.mean, 0.2));
        assert_eq!(s.peak_concurrent, 2);
        // A quarter of a second: every token would fit in the 1 s window.
        assert_eq!(s.peak_output_throughput, None);
        assert_eq!(s.max_concurrency, Some(4));
    }

    #[test]
    fn tpot_excludes_the_first_token_and_single_token_requests() {
        let s = summarize(&[streamed(0, 0, 500, 20, 5), streamed(1, 0, 500, 0, 1)], None);
        assert_eq!(s.tpot_ms.count, 1);
        assert!(close(s.tpot_ms.mean, 20.0));
    }

    #[test]
    fn peak_counts_tokens_not_chunks() {
        let mut r = streamed(0, 0, 0, 100, 30);
        r.chunks = r.chunks.iter().map(|c| Chunk { tokens: 4, ..c }).collect();
        r.output_tokens = 120;
        // 30 chunks 100 ms apart: 10 fit in a 1-second window, 40 tokens.
        assert!(close(summarize(&[r], None).peak_output_throughput.expect("measurable"), 40.0));
    }

    #[test]
    fn the_peak_window_over_overlapping_requests_is_that_of_every_arrival_sorted() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..20 {
            // Requests that overlap in time, with gaps of their own: the
            // merge of their chunk lists must slide the window as a sorted
            // list of every arrival does.
            let records: Vec<RequestRecord> = (0..40)
                .map(|i| {
                    let mut r = streamed(
                        i,
                        rng.random_range(0..3000),
                        rng.random_range(10..200),
                        rng.random_range(5..120),
                        rng.random_range(1..40),
                    );
                    r.chunks = r.chunks.iter().map(|c| Chunk { tokens: rng.random_range(1..4), ..c }).collect();
                    r.output_tokens = r.chunks.iter().map(|c| c.tokens).sum();
                    r
                })
                .collect();
            let all: Vec<Chunk> = records.iter().flat_map(|r| r.chunks.iter()).collect();
            let brute = all
                .iter()
                .map(|end| {
                    let from = end.at_ns - 1_000_000_000;
                    all.iter().filter(|c| c.at_ns > from && c.at_ns <= end.at_ns).map(|c| f64::from(c.tokens)).sum()
                })
                .fold(0f64, f64::max);
            // More than a second long, so that the peak is measured.
            let s = summarize(&records, None);
            assert!(s.duration_s >= 1.0);
            assert_eq!(s.peak_output_throughput, Some(brute));
        }
    }

    /// A mixed run: overlapping streamed requests with chunks of several
    /// tokens and usage counts that rescale them, failures, warm-up,
    /// cap waits, new connections, and the server's long pauses.
    fn mixed_run(rng: &mut rand_chacha::ChaCha8Rng, n: u64) -> Vec<RequestRecord> {
        use rand::Rng;
        (0..n)
            .map(|i| {
                let mut r = streamed(
                    i,
                    i as i64 * 3 + rng.random_range(0..5),
                    rng.random_range(10..300),
                    rng.random_range(1..40),
                    rng.random_range(1..60),
                );
                r.scheduled_ns -= rng.random_range(0..2_000_000);
                r.chunks = r.chunks.iter().map(|c| Chunk { tokens: rng.random_range(0..4), ..c }).collect();
                r.output_tokens = r.chunks.iter().map(|c| c.tokens).sum::<u32>() + rng.random_range(0..3);
                if rng.random_range(0..40) == 0 {
                    // A stall of five seconds before the last chunk.
                    let mut chunks = r.chunks.to_vec();
                    if let Some(last) = chunks.last_mut() {
                        last.at_ns += 5_000_000_000;
                        r.completed_ns = last.at_ns;
                    }
                    r.chunks = chunks.into();
                }
                match rng.random_range(0..20) {
                    0 => {
                        r.outcome = Outcome::Timeout;
                        r.error = Some(format!("request {i} timed out"));
                    }
                    1 => r.phase = Phase::Warmup,
                    2 => r.slot_ns = Some(r.sent_ns - 1_000),
                    3 => r.connect_ns = Some(rng.random_range(50_000..900_000)),
                    _ => {}
                }
                r
            })
            .collect()
    }

    /// What the builder makes of records given in completion order, its
    /// window settled as a load generator settles it (at the earliest send
    /// still in flight), is what `summarize_with` makes of them all: every
    /// figure, with the chunk gaps kept and with them counted into
    /// histograms (within half a microsecond there).
    #[test]
    fn a_summary_built_as_records_complete_is_the_summary_of_them_all() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for round in 0..6 {
            let records = mixed_run(&mut rng, 700);
            let options = SummaryOptions {
                goodput: Some(Slo { ttft_ms: Some(150.0), tpot_ms: None, e2el_ms: None }),
                percentiles: vec![10.0, 50.0, 90.0, 99.9],
                ..SummaryOptions::new(Some(64))
            };
            let all = summarize_with(&records, options.clone());
            let mut done: Vec<&RequestRecord> = records.iter().collect();
            done.sort_by_key(|r| (r.completed_ns, r.seq));
            let gaps: usize = records.iter().map(|r| r.chunks.len().saturating_sub(1)).sum();
            let kept = if round % 2 == 0 { usize::MAX } else { gaps / 3 };
            let mut builder = SummaryBuilder::keeping(options, kept);
            for (i, r) in done.iter().enumerate() {
                builder.add(r);
                // Still in flight: those sent and not yet given.
                let in_flight = done[i + 1..].iter().map(|r| r.sent_ns).min().unwrap_or(i64::MAX);
                builder.settle(in_flight);
            }
            assert_eq!(builder.first_error(), records.iter().find_map(|r| r.error.as_deref()));
            let streamed = builder.finish();
            let same = |a: &Distribution, b: &Distribution, tolerance: f64, what: &str| {
                assert_eq!(a.count, b.count, "{what}");
                let pairs = [(a.mean, b.mean), (a.median, b.median), (a.p95, b.p95), (a.p99, b.p99)];
                let asked = a.percentiles.iter().zip(&b.percentiles).map(|(x, y)| (x.value, y.value));
                for (x, y) in pairs.into_iter().chain(asked) {
                    assert!((x - y).abs() <= tolerance, "{what} (round {round}): {x} against {y}");
                }
            };
            for (a, b, what) in [
                (&streamed.latency_s, &all.latency_s, "latency"),
                (&streamed.ttft_ms, &all.ttft_ms, "ttft"),
                (&streamed.tpot_ms, &all.tpot_ms, "tpot"),
                (&streamed.latency_from_scheduled_s, &all.latency_from_scheduled_s, "latency from scheduled"),
                (&streamed.ttft_from_scheduled_ms, &all.ttft_from_scheduled_ms, "ttft from scheduled"),
                (&streamed.connect_ms, &all.connect_ms, "connect"),
                (&streamed.dispatch_lag_ms, &all.dispatch_lag_ms, "dispatch lag"),
            ] {
                same(a, b, 0.0, what);
            }
            // Counted into histograms: within half a microsecond, in ms;
            // the means exact all the same.
            let itl_tolerance = if kept == usize::MAX { 0.0 } else { 0.0005 };
            same(&streamed.itl_ms, &all.itl_ms, itl_tolerance, "itl");
            same(&streamed.itl_per_token_ms, &all.itl_per_token_ms, itl_tolerance, "itl per token");
            assert_eq!(streamed.itl_ms.mean, all.itl_ms.mean);
            assert_eq!(streamed.itl_per_token_ms.mean, all.itl_per_token_ms.mean);
            let (mut a, mut b) = (streamed.clone(), all.clone());
            for s in [&mut a, &mut b] {
                for d in [
                    &mut s.latency_s,
                    &mut s.ttft_ms,
                    &mut s.tpot_ms,
                    &mut s.itl_ms,
                    &mut s.itl_per_token_ms,
                    &mut s.latency_from_scheduled_s,
                    &mut s.ttft_from_scheduled_ms,
                    &mut s.connect_ms,
                    &mut s.dispatch_lag_ms,
                ] {
                    *d = Distribution::default();
                }
            }
            // The ITL's quantiles have noise only from kept gaps.
            let itl_quantiles = |s: &Summary| {
                let noise = s.noise.as_ref().expect("enough requests");
                ["median_itl_ms", "p99_itl_ms"].map(|m| noise.se(m).is_some())
            };
            assert_eq!(itl_quantiles(&all), [true, true], "round {round}");
            if kept != usize::MAX {
                assert_eq!(itl_quantiles(&a), [false, false], "round {round}");
                b.noise
                    .as_mut()
                    .expect("noise")
                    .metrics
                    .retain(|m| !m.metric.ends_with("_itl_ms") || m.metric == "mean_itl_ms");
            }
            // Every other figure is the same number.
            assert_eq!(a, b, "round {round}");
            assert!(all.peak_output_throughput.is_some_and(|p| p > 0.0) && all.failed > 0 && all.excluded > 0);
        }
    }

    /// Requests due every 10 ms, sent `lag_ms` late.
    fn at_rate(n: u64, lag_ms: i64, sent_every_ms: i64) -> Vec<RequestRecord> {
        (0..n)
            .map(|i| {
                let mut r = streamed(i, i as i64 * sent_every_ms + lag_ms, 50, 10, 3);
                r.scheduled_ns = i as i64 * 10_000_000;
                r
            })
            .collect()
    }

    #[test]
    fn a_client_that_lags_or_under_delivers_makes_the_run_invalid() {
        let s = summarize(&at_rate(100, 1, 10), None);
        assert!(s.invalid.is_none(), "{:?}", s.invalid);
        assert!(close(s.dispatch_lag_ms.p99, 1.0));
        assert!(close(s.offered_rate.expect("rate"), 100.0) && close(s.achieved_rate, 100.0));

        // At a rate, the limit is one mean inter-arrival gap: 10 ms here.
        let s = summarize(&at_rate(100, 8, 10), None);
        assert!(s.invalid.is_none(), "{:?}", s.invalid);
        assert!(close(s.lag_limit_ms, 10.0));
        let s = summarize(&at_rate(100, 12, 10), None);
        let said = s.invalid.as_deref().unwrap_or_default();
        assert!(said.contains("p99 dispatch lag 12.00 ms exceeds 10.00 ms (one mean inter-arrival gap)"), "{said}");
        // At a high rate a tenth of the TTFT is the larger: a 3 ms lag at
        // 1,000 req/s against a 50 ms TTFT is within it.
        let fast: Vec<RequestRecord> = (0..200)
            .map(|i| {
                let mut r = streamed(i, i as i64 + 3, 50, 10, 3);
                r.scheduled_ns = i as i64 * 1_000_000;
                r
            })
            .collect();
        let s = summarize(&fast, None);
        assert!(close(s.lag_limit_ms, 5.0) && s.invalid.is_none(), "{:?} {:?}", s.lag_limit_ms, s.invalid);
        // A limit asked for replaces it.
        let asked = SummaryOptions { lag_limit_ms: Some(5.0), ..SummaryOptions::new(None) };
        let said = summarize_with(&at_rate(100, 8, 10), asked).invalid.unwrap_or_default();
        assert!(said.contains("p99 dispatch lag 8.00 ms exceeds 5.00 ms (the limit asked for)"), "{said}");

        // Sent every 11 ms for a 10 ms schedule: 91% of the offered rate.
        let mut slow = at_rate(100, 0, 11);
        let s = summarize(&slow, None);
        assert!(s.invalid.as_deref().is_some_and(|r| r.contains("below 95% of the offered 100.00 req/s")), "{s:?}");
        // The same, explained by a binding cap and measured from the slot: valid.
        for r in &mut slow {
            r.slot_ns = Some(r.sent_ns);
        }
        let s = summarize(&slow, Some(4));
        assert_eq!(s.cap_waits, 100);
        assert!(s.invalid.is_none(), "{:?}", s.invalid);
        assert!(
            summarize_with(
                &at_rate(100, 8, 10),
                SummaryOptions { lag_limit_ms: Some(10.0), ..SummaryOptions::new(None) }
            )
            .invalid
            .is_none()
        );
        // A tolerance of 10% lets 91% of the offered rate through.
        // (Its lag grows to 99 ms: a limit it keeps, to look at the rate alone.)
        let tolerant = SummaryOptions { rate_tolerance: 0.10, lag_limit_ms: Some(1e3), ..SummaryOptions::new(None) };
        assert!(summarize_with(&at_rate(100, 0, 11), tolerant).invalid.is_none());
        let strict = SummaryOptions { rate_tolerance: 0.025, lag_limit_ms: Some(1e3), ..SummaryOptions::new(None) };
        let said = summarize_with(&at_rate(100, 0, 11), strict).invalid.unwrap_or_default();
        assert!(said.contains("below 97.5% of the offered"), "{said}");
    }

    /// A closed loop: each request takes its slot when the one before it
    /// ends, and is sent `lag_ms` after.
    fn closed_loop(n: u64, ttft_ms: i64, lag_ms: i64) -> Vec<RequestRecord> {
        let mut at = 0;
        (0..n)
            .map(|i| {
                let mut r = streamed(i, at + lag_ms, ttft_ms, 10, 3);
                r.scheduled_ns = 0;
                r.slot_ns = (i > 0).then_some(at * 1_000_000);
                at = r.completed_ns / 1_000_000;
                r
            })
            .collect()
    }

    #[test]
    fn a_closed_loop_s_lag_is_held_to_a_tenth_of_its_ttft() {
        // TTFT 200 ms: a lag of 15 ms is within 20 ms, one of 30 is not.
        let s = summarize(&closed_loop(50, 200, 15), Some(1));
        assert_eq!(s.offered_rate, None);
        assert!(close(s.lag_limit_ms, 20.0) && s.invalid.is_none(), "{s:?}");
        let said = summarize(&closed_loop(50, 200, 30), Some(1)).invalid.unwrap_or_default();
        assert!(said.contains("p99 dispatch lag 30.00 ms exceeds 20.00 ms (a tenth of the median TTFT)"), "{said}");
        // Never below a millisecond, however fast the server.
        assert!(close(summarize(&closed_loop(50, 2, 0), Some(1)).lag_limit_ms, 1.0));
    }

    #[test]
    fn warmup_and_cooldown_are_counted_apart() {
        let mut records = at_rate(10, 0, 10);
        records[0].phase = Phase::Warmup;
        records[9].phase = Phase::Cooldown;
        records[9].outcome = Outcome::Cancelled;
        let s = summarize(&records, None);
        assert_eq!((s.successful, s.failed, s.excluded), (8, 0, 2));
    }

    #[test]
    fn bundled_tokens_give_a_per_token_itl() {
        let mut r = streamed(0, 0, 100, 40, 10);
        r.chunks = r.chunks.iter().map(|c| Chunk { tokens: 4, ..c }).collect();
        r.output_tokens = 40;
        let s = summarize(&[r.clone()], None);
        assert!(close(s.itl_ms.mean, 40.0) && close(s.itl_per_token_ms.median, 10.0));
        assert_eq!((s.itl_ms.count, s.itl_per_token_ms.count), (9, 36));
        // The server's usage wins over the chunk counts: 80 tokens in 40
        // counted means each counted token is worth two.
        r.output_tokens = 80;
        let s = summarize(&[r], None);
        assert!(close(s.itl_per_token_ms.mean, 5.0));
        // The peak counts the same way, over a run long enough to have one:
        // chunks 400 ms apart, at most 3 in a second, 4 counted tokens each
        // worth two.
        let mut long = streamed(0, 0, 100, 400, 10);
        long.chunks = long.chunks.iter().map(|c| Chunk { tokens: 4, ..c }).collect();
        long.output_tokens = 80;
        assert!(close(summarize(&[long], None).peak_output_throughput.expect("measurable"), 24.0));
    }

    #[test]
    fn failures_count_but_do_not_enter_latency() {
        let mut bad = streamed(1, 0, 5000, 0, 1);
        bad.outcome = Outcome::HttpError;
        bad.http_status = Some(500);
        let s = summarize(&[streamed(0, 0, 100, 10, 3), bad], None);
        assert_eq!((s.successful, s.failed), (1, 1));
        assert_eq!(s.ttft_ms.count, 1);
        assert!(close(s.success_rate(), 0.5));
    }
}
