//! The metric definitions, applied to request records. This is the one place
//! they are computed: loadgen, the controller and the reports all call
//! [`summarize`]. See `docs/metrics.md` for the definitions in prose.

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;

const NS_PER_S: f64 = 1e9;
const NS_PER_MS: f64 = 1e6;

/// Mean and percentiles of one latency metric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub mean: f64,
    pub median: f64,
    pub p95: f64,
    pub p99: f64,
    /// Number of samples; 0 means every other field is 0.
    pub count: u64,
}

impl Distribution {
    /// Summarizes samples; percentiles interpolate linearly between the two
    /// nearest ranks (numpy's default, which `vllm bench serve` uses).
    pub fn of(mut samples: Vec<f64>) -> Distribution {
        if samples.is_empty() {
            return Distribution::default();
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        Distribution {
            mean,
            median: percentile(&samples, 50.0),
            p95: percentile(&samples, 95.0),
            p99: percentile(&samples, 99.0),
            count: samples.len() as u64,
        }
    }
}

/// The `p`th percentile of sorted, non-empty samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// The numbers of one "Serving Benchmark Result" block.
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
    /// Most output tokens that arrived in any 1-second window.
    pub peak_output_throughput: f64,
    /// Most requests in flight at once.
    pub peak_concurrent: u64,
    pub total_token_throughput: f64,
    pub latency_s: Distribution,
    pub ttft_ms: Distribution,
    pub tpot_ms: Distribution,
    /// Gaps between successive chunks (vLLM-compatible).
    pub itl_ms: Distribution,
}

impl Summary {
    /// Successful / sent, in 0..=1.
    pub fn success_rate(&self) -> f64 {
        let sent = self.successful + self.failed;
        if sent == 0 { 0.0 } else { self.successful as f64 / sent as f64 }
    }
}

/// Computes the block's numbers from a run's records.
pub fn summarize(records: &[RequestRecord], max_concurrency: Option<u64>) -> Summary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.outcome.is_ok()).collect();

    let first_send = records.iter().map(|r| r.sent_ns).min();
    let last_completion = records.iter().map(|r| r.completed_ns).max();
    let duration_s = match (first_send, last_completion) {
        (Some(start), Some(end)) if end > start => (end - start) as f64 / NS_PER_S,
        _ => 0.0,
    };
    let per_second = |x: f64| {
        if duration_s > 0.0 { x / duration_s } else { 0.0 }
    };

    let total_input_tokens: u64 = ok.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let total_output_tokens: u64 = ok.iter().map(|r| u64::from(r.output_tokens)).sum();

    let itl =
        ok.iter().flat_map(|r| r.chunks.windows(2).map(|w| (w[1].at_ns - w[0].at_ns) as f64 / NS_PER_MS)).collect();

    Summary {
        successful: ok.len() as u64,
        failed: (records.len() - ok.len()) as u64,
        max_concurrency,
        duration_s,
        total_input_tokens,
        total_output_tokens,
        request_throughput: per_second(ok.len() as f64),
        output_throughput: per_second(total_output_tokens as f64),
        peak_output_throughput: peak_tokens_per_second(&ok),
        peak_concurrent: peak_concurrency(records),
        total_token_throughput: per_second((total_input_tokens + total_output_tokens) as f64),
        latency_s: Distribution::of(ok.iter().map(|r| r.latency_ns() as f64 / NS_PER_S).collect()),
        ttft_ms: Distribution::of(ok.iter().filter_map(|r| r.ttft_ns()).map(|t| t as f64 / NS_PER_MS).collect()),
        tpot_ms: Distribution::of(ok.iter().filter_map(|r| r.tpot_ns()).map(|t| t / NS_PER_MS).collect()),
        itl_ms: Distribution::of(itl),
    }
}

/// The most output tokens that arrived in any window of one second, found by
/// sliding a window over every chunk arrival (tokens, not chunks, so a chunk
/// of k tokens counts k).
fn peak_tokens_per_second(ok: &[&RequestRecord]) -> f64 {
    let mut arrivals: Vec<(i64, u64)> =
        ok.iter().flat_map(|r| r.chunks.iter().map(|c| (c.at_ns, u64::from(c.tokens)))).collect();
    arrivals.sort_unstable();
    let window_ns = 1_000_000_000;
    let (mut best, mut in_window, mut start) = (0u64, 0u64, 0usize);
    for end in 0..arrivals.len() {
        in_window += arrivals[end].1;
        while arrivals[end].0 - arrivals[start].0 >= window_ns {
            in_window -= arrivals[start].1;
            start += 1;
        }
        best = best.max(in_window);
    }
    best as f64
}

/// The most requests in flight at once, from send to completion.
fn peak_concurrency(records: &[RequestRecord]) -> u64 {
    // A completion at the same instant as a send frees its slot first.
    let mut events: Vec<(i64, i64)> = records.iter().flat_map(|r| [(r.sent_ns, 1), (r.completed_ns, -1)]).collect();
    events.sort_unstable();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    peak as u64
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
            chunks,
            prompt_tokens: 10,
            output_tokens: tokens,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let d = Distribution::of(vec![4.0, 1.0, 3.0, 2.0]);
        assert!(close(d.mean, 2.5));
        assert!(close(d.median, 2.5));
        assert!(close(d.p95, 3.85));
        assert!(close(d.p99, 3.97));
        assert_eq!(d.count, 4);
        assert_eq!(Distribution::of(vec![]), Distribution::default());
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
        assert!(close(s.peak_output_throughput, 22.0));
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
        for c in &mut r.chunks {
            c.tokens = 4;
        }
        r.output_tokens = 120;
        // 30 chunks 100 ms apart: 10 fit in a 1-second window, 40 tokens.
        assert!(close(summarize(&[r], None).peak_output_throughput, 40.0));
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
