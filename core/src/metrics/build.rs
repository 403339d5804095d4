//! A summary built one record at a time, for a run too long to keep its
//! records: [`summarize_with`](super::summarize_with) is this, given them all.
//!
//! What it holds is a few numbers a request, not the request: each per-request
//! distribution's samples (8 bytes each, so every percentile stays exact),
//! the send and completion of each measured request (the peak concurrency),
//! and, for the gaps between chunks, the gaps themselves up to
//! [`GAPS_KEPT`] and past that a histogram at the microsecond (the
//! percentiles within half a microsecond, the means exact). The peak of
//! output tokens in a second slides its window over the arrivals in time
//! order: a record's chunks wait until the caller says no arrival before a
//! time can still come ([`SummaryBuilder::settle`]), so only the chunks of
//! the requests in flight about then are held.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::steady::{self, Done};
use super::{
    Distribution, Failures, Goodput, NS_PER_MS, NS_PER_S, Sum, Summary, SummaryOptions, chunk_gaps, lag_limit_for,
    token_scale, validity,
};
use super::{noise, sessions};
use crate::digest::Tally;
use crate::record::{ChunkCursor, Chunks, Outcome, Phase, RequestRecord};

/// Chunk gaps kept as they are (16 bytes each: 16 MiB, and 16 a request
/// for their send); a run with more counts them into histograms.
pub const GAPS_KEPT: usize = 1 << 20;

/// A run's summary, from its records given one at a time in any order.
pub struct SummaryBuilder {
    options: SummaryOptions,
    /// Records given, warm-up and cool-down included.
    records: u64,
    measured: u64,
    ok: u64,
    failures: Failures,
    input_tokens: u64,
    output_tokens: u64,
    latency_s: Vec<f64>,
    ttft_ms: Vec<f64>,
    tpot_ms: Vec<f64>,
    latency_from_scheduled_s: Vec<f64>,
    ttft_from_scheduled_ms: Vec<f64>,
    connect_ms: Vec<f64>,
    dispatch_lag_ms: Vec<f64>,
    /// Sends of the measured requests that failed (the successful ones'
    /// are in `done`), and completions of all the measured ones, ns.
    failed_sends: Vec<i64>,
    completions: Vec<i64>,
    scheduled: Span,
    sent: Span,
    cap_waits: u64,
    good: u64,
    /// `None` when the caller reads the gaps from records it still holds.
    gaps: Option<Gaps>,
    peak: PeakTokens,
    /// The error of the earliest request (by schedule) that has one.
    first_error: Option<(u64, String)>,
    /// Failed measured requests by reason.
    reasons: super::ReasonCounts,
    /// The successful requests, and the output tokens by arrival bin, for
    /// the steady state.
    done: Vec<Done>,
    /// Output tokens by arrival and prompt tokens by send, in millionths
    /// of a token, so that the sums are the same in any order.
    output_bins: Vec<u64>,
    input_bins: Vec<u64>,
    /// The successful requests' chunk gaps by their send's bin, for the
    /// mean ITL's noise.
    gap_bins: noise::GapBins,
    /// A multi-turn run's sessions.
    sessions: sessions::Tally,
}

impl SummaryBuilder {
    pub fn new(options: SummaryOptions) -> SummaryBuilder {
        SummaryBuilder::keeping(options, GAPS_KEPT)
    }

    /// One that keeps `gaps` chunk gaps before counting them into
    /// histograms (`usize::MAX`: every one, exact).
    pub fn keeping(options: SummaryOptions, gaps: usize) -> SummaryBuilder {
        SummaryBuilder {
            options,
            records: 0,
            measured: 0,
            ok: 0,
            failures: Failures::default(),
            input_tokens: 0,
            output_tokens: 0,
            latency_s: Vec::new(),
            ttft_ms: Vec::new(),
            tpot_ms: Vec::new(),
            latency_from_scheduled_s: Vec::new(),
            ttft_from_scheduled_ms: Vec::new(),
            connect_ms: Vec::new(),
            dispatch_lag_ms: Vec::new(),
            failed_sends: Vec::new(),
            completions: Vec::new(),
            scheduled: Span::default(),
            sent: Span::default(),
            cap_waits: 0,
            good: 0,
            gaps: Some(Gaps { kept: Vec::new(), senders: Vec::new(), limit: gaps, counted: None }),
            peak: PeakTokens::default(),
            first_error: None,
            reasons: super::ReasonCounts::default(),
            done: Vec::new(),
            output_bins: Vec::new(),
            input_bins: Vec::new(),
            gap_bins: noise::GapBins::default(),
            sessions: sessions::Tally::default(),
        }
    }

    /// Takes one record.
    pub fn add(&mut self, r: &RequestRecord) {
        self.records += 1;
        if let Some(error) = &r.error
            && self.first_error.as_ref().is_none_or(|(seq, _)| r.seq < *seq)
        {
            self.first_error = Some((r.seq, error.clone()));
        }
        self.sessions.add(r);
        if r.phase != Phase::Measured {
            return;
        }
        let ms = |ns: i64| ns as f64 / NS_PER_MS;
        self.measured += 1;
        self.completions.push(r.completed_ns);
        self.scheduled.add(r.scheduled_ns);
        self.sent.add(r.sent_ns);
        if r.slot_ns.is_some() {
            self.cap_waits += 1;
        }
        if let Some(ns) = r.connect_ns {
            self.connect_ms.push(ms(ns));
        }
        // The first wave of a closed loop (or of a run with everything due
        // at once) is due at the very start and necessarily goes out one
        // after another: that is the profile, not a client falling behind.
        if r.ready_ns() > 0 {
            self.dispatch_lag_ms.push(ms(r.dispatch_lag_ns()));
        }
        let f = &mut self.failures;
        match r.outcome {
            Outcome::Ok => {}
            Outcome::HttpError => f.http_error += 1,
            Outcome::Timeout => f.timeout += 1,
            Outcome::Cancelled => f.cancelled += 1,
            Outcome::Incomplete => f.incomplete += 1,
            Outcome::TransportError => f.transport_error += 1,
            Outcome::Disconnected => f.disconnected += 1,
            Outcome::Malformed => f.malformed += 1,
        }
        if !r.outcome.is_ok() {
            self.reasons.add(super::failure_reason(r), 1);
            self.failed_sends.push(r.sent_ns);
            return;
        }
        self.ok += 1;
        self.input_tokens += u64::from(r.prompt_tokens);
        self.output_tokens += u64::from(r.output_tokens);
        self.latency_s.push(r.latency_ns() as f64 / NS_PER_S);
        if let Some(ns) = r.ttft_ns() {
            self.ttft_ms.push(ms(ns));
        }
        if let Some(ns) = r.tpot_ns() {
            self.tpot_ms.push(ns / NS_PER_MS);
        }
        self.latency_from_scheduled_s.push(r.latency_from_scheduled_ns() as f64 / NS_PER_S);
        if let Some(ns) = r.ttft_from_scheduled_ns() {
            self.ttft_from_scheduled_ms.push(ms(ns));
        }
        if self.options.goodput.is_some_and(|slo| slo.met_by(r)) {
            self.good += 1;
        }
        if let Some(gaps) = &mut self.gaps {
            gaps.add(r);
        }
        let scale = token_scale(r);
        for c in &r.chunks {
            steady::bin_add(&mut self.output_bins, c.at_ns, (f64::from(c.tokens) * scale * 1e6).round() as u64);
        }
        steady::bin_add(&mut self.input_bins, r.sent_ns, u64::from(r.prompt_tokens) * 1_000_000);
        self.done.push(Done {
            seq: r.seq,
            sent_ns: r.sent_ns,
            ttft_ms: r.ttft_ns().map_or(f32::NAN, |ns| ms(ns) as f32),
            tpot_ms: r.tpot_ns().map_or(f32::NAN, |ns| (ns / NS_PER_MS) as f32),
            latency_ms: ms(r.latency_ns()) as f32,
            output_tokens: r.output_tokens,
        });
        if let (Some(first), Some(last)) = (r.chunks.first(), r.chunks.last()) {
            let gaps = r.chunks.len() as u64 - 1;
            steady::bin_add(&mut self.gap_bins.ns, r.sent_ns, u64::try_from(last.at_ns - first.at_ns).unwrap_or(0));
            steady::bin_add(&mut self.gap_bins.count, r.sent_ns, gaps);
        }
        self.peak.add(r.chunks.clone(), scale);
    }

    /// Says that no record still to come has a chunk that arrived before
    /// `before_ns`: the arrivals before it are counted into the peak and
    /// let go. Without it they are all held until [`SummaryBuilder::finish`].
    pub fn settle(&mut self, before_ns: i64) {
        self.peak.settle(before_ns);
    }

    /// Records given so far, warm-up and cool-down included.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The error of the earliest request (by schedule) that failed with one.
    pub fn first_error(&self) -> Option<&str> {
        self.first_error.as_ref().map(|(_, e)| e.as_str())
    }

    /// The summary of every record given.
    pub fn finish(mut self) -> Summary {
        let none = None::<fn() -> std::iter::Empty<(i64, f64)>>;
        let Some(gaps) = self.gaps.take() else {
            return self.finish_with(Default::default(), none);
        };
        let asked = &self.options.percentiles;
        match gaps.counted {
            Some(counted) => {
                let itl = counted.distributions(asked);
                self.finish_with(itl, none)
            }
            None => {
                let itl = itl_distributions(|| gaps.kept.iter().copied(), asked);
                self.finish_with(itl, Some(|| gaps.by_send()))
            }
        }
    }

    /// One that leaves the chunk gaps to [`SummaryBuilder::finish_with`].
    pub(super) fn without_gaps(options: SummaryOptions) -> SummaryBuilder {
        SummaryBuilder { gaps: None, ..SummaryBuilder::new(options) }
    }

    /// The summary, with the chunk and per-token ITL found elsewhere and,
    /// when they are kept, the chunk gaps (ms) with their request's send
    /// (ns) for their noise.
    pub(super) fn finish_with<I: Iterator<Item = (i64, f64)>>(
        mut self,
        (itl_ms, itl_per_token_ms): (Distribution, Distribution),
        gaps_by_send: Option<impl Fn() -> I>,
    ) -> Summary {
        self.peak.settle(i64::MAX);
        let options = self.options;
        let first_send = self.done.iter().map(|d| d.sent_ns).chain(self.failed_sends.iter().copied()).min();
        let last_completion = self.completions.iter().max().copied();
        let duration_s = match (first_send, last_completion) {
            (Some(start), Some(end)) if end > start => (end - start) as f64 / NS_PER_S,
            _ => 0.0,
        };
        let per_second = |x: f64| {
            if duration_s > 0.0 { x / duration_s } else { 0.0 }
        };
        let dist = |samples: Vec<f64>| Distribution::with_percentiles(samples, &options.percentiles);
        // In one order whatever order the records came in: the same sums.
        self.done.sort_unstable_by_key(|d| {
            (d.sent_ns, d.ttft_ms.to_bits(), d.tpot_ms.to_bits(), d.latency_ms.to_bits(), d.output_tokens)
        });
        self.failed_sends.sort_unstable();
        self.completions.sort_unstable();
        let sends = steady::Sends { done: &self.done, failed: &self.failed_sends };
        let steady_state = steady::steady_state(sends, &self.completions, &self.output_bins, &self.input_bins);
        let peak_concurrent = peak_concurrency(sends.iter(), &self.completions);
        let last_completion = self.completions.last().copied().unwrap_or(0);
        let noise = noise::noise(&self.done, last_completion, &self.input_bins, &self.gap_bins, gaps_by_send);
        self.done = Vec::new();
        let mut summary = Summary {
            successful: self.ok,
            failed: self.measured - self.ok,
            max_concurrency: options.max_concurrency,
            duration_s,
            total_input_tokens: self.input_tokens,
            total_output_tokens: self.output_tokens,
            request_throughput: per_second(self.ok as f64),
            output_throughput: per_second(self.output_tokens as f64),
            // Sums of fractional token shares: round away the float noise.
            peak_output_throughput: (duration_s >= 1.0).then(|| (self.peak.best * 1e6).round() / 1e6),
            peak_concurrent,
            total_token_throughput: per_second((self.input_tokens + self.output_tokens) as f64),
            latency_s: dist(self.latency_s),
            ttft_ms: dist(self.ttft_ms),
            tpot_ms: dist(self.tpot_ms),
            itl_ms,
            itl_per_token_ms,
            latency_from_scheduled_s: dist(self.latency_from_scheduled_s),
            ttft_from_scheduled_ms: dist(self.ttft_from_scheduled_ms),
            connect_ms: dist(self.connect_ms),
            failures: self.failures,
            failure_reasons: self.reasons.named(),
            excluded: self.records - self.measured,
            dispatch_lag_ms: dist(self.dispatch_lag_ms),
            offered_rate: self.scheduled.rate(),
            achieved_rate: self.sent.rate().unwrap_or(0.0),
            cap_waits: self.cap_waits,
            lag_limit_ms: 0.0,
            rate_tolerance: options.rate_tolerance,
            client_cpu_s: None,
            invalid: None,
            usage_check: None,
            usage_below_events: 0,
            steady_state,
            noise,
            sessions: self.sessions.finish(),
            goodput: options.goodput.map(|slo| Goodput {
                slo,
                good: self.good,
                request_goodput: per_second(self.good as f64),
            }),
        };
        let (limit, basis) = match options.lag_limit_ms {
            Some(limit) => (limit, "the limit asked for"),
            None => lag_limit_for(summary.offered_rate, summary.ttft_ms.median),
        };
        summary.lag_limit_ms = limit;
        summary.invalid = validity(&summary, basis);
        summary
    }
}

/// The count and span of some instants, for a rate over them: events per
/// second over their span, `None` for fewer than two or when they all fall
/// on one instant.
#[derive(Clone, Copy, Debug)]
struct Span {
    n: u64,
    lo: i64,
    hi: i64,
}

impl Default for Span {
    fn default() -> Span {
        Span { n: 0, lo: i64::MAX, hi: i64::MIN }
    }
}

impl Span {
    fn add(&mut self, t: i64) {
        self.n += 1;
        self.lo = self.lo.min(t);
        self.hi = self.hi.max(t);
    }

    fn rate(&self) -> Option<f64> {
        (self.n > 1 && self.hi > self.lo).then(|| (self.n - 1) as f64 / ((self.hi - self.lo) as f64 / NS_PER_S))
    }
}

/// Every gap between two chunks of a successful request: (ns, the later
/// chunk's tokens scaled to the server's count).
struct Gaps {
    kept: Vec<(i64, f64)>,
    /// Each request's send (ns) and how many of `kept` are its, in order.
    senders: Vec<(i64, u32)>,
    limit: usize,
    /// Past `limit`: the chunk gaps and the per-token gaps, counted.
    counted: Option<Box<Counted>>,
}

/// Gaps counted into histograms, ns, with the exact sums of their samples
/// (ms) beside them.
#[derive(Default)]
struct Counted {
    chunk: Tally,
    token: Tally,
    chunk_ms: Sum,
    token_ms: Sum,
}

impl Gaps {
    /// A successful request's chunk gaps.
    fn add(&mut self, r: &RequestRecord) {
        if let Some(counted) = &mut self.counted {
            for (gap_ns, tokens) in chunk_gaps(r) {
                count(counted, gap_ns, tokens);
            }
            return;
        }
        let before = self.kept.len();
        self.kept.extend(chunk_gaps(r));
        self.senders.push((r.sent_ns, (self.kept.len() - before) as u32));
        if self.kept.len() > self.limit {
            let mut counted = Box::default();
            for (gap_ns, tokens) in std::mem::take(&mut self.kept) {
                count(&mut counted, gap_ns, tokens);
            }
            self.senders = Vec::new();
            self.counted = Some(counted);
        }
    }

    /// Each kept gap (ms) with its request's send (ns).
    fn by_send(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        let sends = self.senders.iter().flat_map(|&(sent, n)| std::iter::repeat_n(sent, n as usize));
        sends.zip(&self.kept).map(|(sent, &(gap, _))| (sent, gap as f64 / NS_PER_MS))
    }
}

/// The chunk and per-token ITL of the gaps `gaps` gives, on each of a few
/// passes: (ns, the later chunk's tokens, scaled).
pub(super) fn itl_distributions<I: Iterator<Item = (i64, f64)>>(
    gaps: impl Fn() -> I,
    asked: &[f64],
) -> (Distribution, Distribution) {
    let chunk = Distribution::of_many(|| gaps().map(|(gap, _)| gap as f64 / NS_PER_MS), asked);
    let token = Distribution::of_many(
        || {
            gaps()
                .filter_map(|(gap, tokens)| per_token(gap, tokens))
                .flat_map(|(gap, n)| std::iter::repeat_n(gap / NS_PER_MS, n))
        },
        asked,
    );
    (chunk, token)
}

impl Counted {
    /// The vLLM-compatible ITL (a sample per gap) and the per-token one (a
    /// chunk of k tokens after a gap g gives k samples of g / k), ms.
    fn distributions(self, asked: &[f64]) -> (Distribution, Distribution) {
        let Counted { chunk, token, chunk_ms, token_ms } = self;
        let (mut chunk, mut token) =
            (chunk.finish().distribution(NS_PER_MS, asked), token.finish().distribution(NS_PER_MS, asked));
        (chunk.mean, token.mean) = (chunk_ms.mean(), token_ms.mean());
        (chunk, token)
    }
}

fn count(counted: &mut Counted, gap_ns: i64, tokens: f64) {
    counted.chunk.add(gap_ns as f64, 1);
    counted.chunk_ms.add(gap_ns as f64 / NS_PER_MS, 1);
    if let Some((gap, n)) = per_token(gap_ns, tokens) {
        counted.token.add(gap, n as u64);
        counted.token_ms.add(gap / NS_PER_MS, n);
    }
}

/// A gap shared by the `tokens` of the chunk after it: (per-token gap ns,
/// samples); none for a chunk without tokens.
pub(crate) fn per_token(gap_ns: i64, tokens: f64) -> Option<(f64, usize)> {
    (tokens > 0.0).then(|| (gap_ns as f64 / tokens, (tokens.round() as usize).max(1)))
}

/// The most output tokens that arrived in any window of one second (tokens,
/// not chunks: a chunk of k tokens counts k), the window sliding over every
/// arrival in time order.
#[derive(Default)]
struct PeakTokens {
    /// Records with arrivals not yet counted: their chunks, token scale and
    /// where the count stands; a slot is reused once its record is done.
    pending: Vec<Option<(Chunks, f64, ChunkCursor)>>,
    free: Vec<usize>,
    /// The next arrival of each pending record: (arrival, slot, tokens).
    next: BinaryHeap<Reverse<(i64, usize, u32)>>,
    /// The arrivals of the last second counted, and their tokens.
    window: VecDeque<(i64, f64)>,
    in_window: f64,
    best: f64,
}

impl PeakTokens {
    fn add(&mut self, chunks: Chunks, scale: f64) {
        let mut cursor = chunks.cursor();
        let Some(first) = chunks.next_at(&mut cursor) else {
            return;
        };
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.pending.push(None);
                self.pending.len() - 1
            }
        };
        self.pending[slot] = Some((chunks, scale, cursor));
        self.next.push(Reverse((first.at_ns, slot, first.tokens)));
    }

    fn settle(&mut self, before_ns: i64) {
        while let Some(&Reverse((at_ns, slot, tokens))) = self.next.peek()
            && at_ns < before_ns
        {
            self.next.pop();
            let Some((chunks, scale, cursor)) = &mut self.pending[slot] else {
                continue;
            };
            let tokens = f64::from(tokens) * *scale;
            match chunks.next_at(cursor) {
                Some(c) => self.next.push(Reverse((c.at_ns, slot, c.tokens))),
                None => {
                    self.pending[slot] = None;
                    self.free.push(slot);
                }
            }
            self.count(at_ns, tokens);
        }
    }

    fn count(&mut self, at_ns: i64, tokens: f64) {
        const WINDOW_NS: i64 = 1_000_000_000;
        self.in_window += tokens;
        self.window.push_back((at_ns, tokens));
        while let Some(&(from_ns, leaving)) = self.window.front()
            && at_ns - from_ns >= WINDOW_NS
        {
            self.in_window -= leaving;
            self.window.pop_front();
        }
        self.best = self.best.max(self.in_window);
    }
}

/// The most requests in flight at once, from send to completion; a
/// completion at the same instant as a send frees its slot first.
fn peak_concurrency(sends: impl Iterator<Item = i64>, completions: &[i64]) -> u64 {
    let (mut now, mut peak, mut done) = (0i64, 0i64, 0usize);
    for sent in sends {
        while completions.get(done).is_some_and(|&c| c <= sent) {
            done += 1;
            now -= 1;
        }
        now += 1;
        peak = peak.max(now);
    }
    peak as u64
}
