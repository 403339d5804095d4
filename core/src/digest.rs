//! Per-run histograms of every distribution of a summary, which merge: the
//! way a block over repeats gets the percentiles of the union of their
//! samples without reading their records again.
//!
//! A [`Digest`] holds, for each distribution of a [`Summary`], every sample
//! rounded to the microsecond and counted (a histogram with one bucket per
//! microsecond, kept sparse), with the exact sum and count beside it. Merging
//! digests adds the counts, so the pooled percentiles are those of the union
//! of the repeats' samples, each within half a microsecond of what it was;
//! the pooled means are exact. The samples are those [`summarize`] takes
//! (`docs/metrics.md`); a test holds the two to the same numbers.
//!
//! [`pool`] makes the block of several repeats from their summaries (counts,
//! tokens and durations add up, throughputs are over the summed durations,
//! peaks are the highest) and their digests (the distributions).
//!
//! [`summarize`]: crate::metrics::summarize

use std::collections::HashMap;

use crate::metrics::{Distribution, Failures, Percentile, Summary, token_gaps_ns};
use crate::record::{Phase, RequestRecord};

/// The histogram of one distribution: samples rounded to the microsecond.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Samples (a weighted sample counts its weight).
    pub count: u64,
    /// Their sum as measured, ns: the mean is not rounded.
    pub sum_ns: f64,
    /// (value in µs, samples), ascending by value, no count 0.
    pub counts: Vec<(i64, u64)>,
}

impl Histogram {
    /// The samples of both.
    pub fn merge(&mut self, other: &Histogram) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        let mut merged = Vec::with_capacity(self.counts.len().max(other.counts.len()));
        let (mut a, mut b) = (self.counts.iter().peekable(), other.counts.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&(va, ca)), Some(&&(vb, cb))) => match va.cmp(&vb) {
                    std::cmp::Ordering::Less => a.next().map(|_| (va, ca)),
                    std::cmp::Ordering::Greater => b.next().map(|_| (vb, cb)),
                    std::cmp::Ordering::Equal => {
                        a.next();
                        b.next();
                        Some((va, ca + cb))
                    }
                },
                (Some(_), None) => a.next().copied(),
                (None, Some(_)) => b.next().copied(),
                (None, None) => None,
            };
            match next {
                Some(entry) => merged.push(entry),
                None => break,
            }
        }
        self.counts = merged;
    }

    /// The distribution in a unit of `unit_ns` nanoseconds (1e6 for ms),
    /// with the block's three percentiles and the `asked` ones; percentiles
    /// interpolate between the two nearest ranks, as
    /// [`Distribution::with_percentiles`] does.
    pub fn distribution(&self, unit_ns: f64, asked: &[f64]) -> Distribution {
        if self.count == 0 {
            let percentiles = asked.iter().map(|&p| Percentile { p, value: 0.0 }).collect();
            return Distribution { percentiles, ..Distribution::default() };
        }
        // The samples below each entry, to find a rank by binary search.
        let mut below = Vec::with_capacity(self.counts.len());
        let mut total = 0u64;
        for &(_, c) in &self.counts {
            below.push(total);
            total += c;
        }
        let at = |rank: u64| {
            let i = below.partition_point(|&b| b <= rank) - 1;
            self.counts[i].0 as f64 * 1e3 / unit_ns
        };
        let percentile = |p: f64| {
            let rank = (p / 100.0).clamp(0.0, 1.0) * (total - 1) as f64;
            let (lo, hi) = (at(rank.floor() as u64), at(rank.ceil() as u64));
            lo + (hi - lo) * (rank - rank.floor())
        };
        Distribution {
            mean: self.sum_ns / self.count as f64 / unit_ns,
            median: percentile(50.0),
            p95: percentile(95.0),
            p99: percentile(99.0),
            count: self.count,
            percentiles: asked.iter().map(|&p| Percentile { p, value: percentile(p) }).collect(),
        }
    }
}

/// Counts samples into a [`Histogram`]. The first few are simply kept (a
/// small run costs no more than its samples); past them, a dense array for
/// the common values (below 2^17 µs, 131 ms: gaps between tokens) and a map
/// beyond.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    count: u64,
    sum_ns: f64,
    /// (µs, weight) of the first samples, until there are `KEPT` of them.
    kept: Vec<(i64, u64)>,
    dense: Vec<u64>,
    sparse: HashMap<i64, u64>,
}

const KEPT: usize = 4096;
const DENSE_US: usize = 1 << 17;

impl Tally {
    pub(crate) fn add(&mut self, ns: f64, weight: u64) {
        self.count += weight;
        self.sum_ns += ns * weight as f64;
        let us = (ns / 1e3).round() as i64;
        if self.dense.is_empty() {
            if self.kept.len() < KEPT {
                self.kept.push((us, weight));
                return;
            }
            self.dense = vec![0; DENSE_US];
            for (us, weight) in std::mem::take(&mut self.kept) {
                self.count_one(us, weight);
            }
        }
        self.count_one(us, weight);
    }

    fn count_one(&mut self, us: i64, weight: u64) {
        match usize::try_from(us) {
            Ok(i) if i < DENSE_US => self.dense[i] += weight,
            _ => *self.sparse.entry(us).or_default() += weight,
        }
    }

    pub(crate) fn finish(self) -> Histogram {
        let mut counts: Vec<(i64, u64)> = self.sparse.into_iter().collect();
        counts.extend(self.dense.iter().enumerate().filter(|&(_, &c)| c > 0).map(|(i, &c)| (i as i64, c)));
        counts.extend(self.kept);
        counts.sort_unstable();
        // Kept samples of one value become one entry.
        counts.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 += next.1;
            }
            same
        });
        Histogram { count: self.count, sum_ns: self.sum_ns, counts }
    }
}

/// The histograms of a run's records, one per distribution of its summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Digest {
    /// Records it was made of, warm-up and cool-down included: the check
    /// that it covers what the summary does.
    pub records: u64,
    pub latency: Histogram,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub itl: Histogram,
    pub itl_per_token: Histogram,
    pub latency_from_scheduled: Histogram,
    pub ttft_from_scheduled: Histogram,
    pub connect: Histogram,
    pub dispatch_lag: Histogram,
}

impl Digest {
    /// The digest of records, as [`DigestBuilder`] makes it.
    pub fn of<'a>(records: impl IntoIterator<Item = &'a RequestRecord>) -> Digest {
        let mut b = DigestBuilder::default();
        for r in records {
            b.add(r);
        }
        b.finish()
    }

    /// Every histogram, in the order of the summary's fields.
    pub fn histograms(&self) -> [&Histogram; 9] {
        [
            &self.latency,
            &self.ttft,
            &self.tpot,
            &self.itl,
            &self.itl_per_token,
            &self.latency_from_scheduled,
            &self.ttft_from_scheduled,
            &self.connect,
            &self.dispatch_lag,
        ]
    }

    pub fn histograms_mut(&mut self) -> [&mut Histogram; 9] {
        [
            &mut self.latency,
            &mut self.ttft,
            &mut self.tpot,
            &mut self.itl,
            &mut self.itl_per_token,
            &mut self.latency_from_scheduled,
            &mut self.ttft_from_scheduled,
            &mut self.connect,
            &mut self.dispatch_lag,
        ]
    }

    /// The samples of both.
    pub fn merge(&mut self, other: &Digest) {
        self.records += other.records;
        for (mine, theirs) in self.histograms_mut().into_iter().zip(other.histograms()) {
            mine.merge(theirs);
        }
    }
}

/// Builds a [`Digest`] one record at a time, so that a run's records can be
/// streamed from the store rather than held.
#[derive(Debug, Default)]
pub struct DigestBuilder {
    records: u64,
    tallies: [Tally; 9],
}

impl DigestBuilder {
    /// Takes a record's samples: the same records and values as
    /// [`summarize`](crate::metrics::summarize) takes for each distribution.
    pub fn add(&mut self, r: &RequestRecord) {
        self.records += 1;
        if r.phase != Phase::Measured {
            return;
        }
        let [latency, ttft, tpot, itl, itl_per_token, latency_from_scheduled, ttft_from_scheduled, connect, lag] =
            &mut self.tallies;
        if let Some(ns) = r.connect_ns {
            connect.add(ns as f64, 1);
        }
        // The first wave of a closed loop is due at the very start: see
        // `summarize`.
        if r.ready_ns() > 0 {
            lag.add(r.dispatch_lag_ns() as f64, 1);
        }
        if !r.outcome.is_ok() {
            return;
        }
        latency.add(r.latency_ns() as f64, 1);
        latency_from_scheduled.add(r.latency_from_scheduled_ns() as f64, 1);
        if let Some(ns) = r.ttft_ns() {
            ttft.add(ns as f64, 1);
        }
        if let Some(ns) = r.ttft_from_scheduled_ns() {
            ttft_from_scheduled.add(ns as f64, 1);
        }
        if let Some(ns) = r.tpot_ns() {
            tpot.add(ns, 1);
        }
        for (a, b) in r.chunks.pairs() {
            itl.add((b.at_ns - a.at_ns) as f64, 1);
        }
        for (gap, n) in token_gaps_ns(r) {
            itl_per_token.add(gap, n as u64);
        }
    }

    pub fn finish(self) -> Digest {
        let [latency, ttft, tpot, itl, itl_per_token, latency_from_scheduled, ttft_from_scheduled, connect, lag] =
            self.tallies;
        Digest {
            records: self.records,
            latency: latency.finish(),
            ttft: ttft.finish(),
            tpot: tpot.finish(),
            itl: itl.finish(),
            itl_per_token: itl_per_token.finish(),
            latency_from_scheduled: latency_from_scheduled.finish(),
            ttft_from_scheduled: ttft_from_scheduled.finish(),
            connect: connect.finish(),
            dispatch_lag: lag.finish(),
        }
    }
}

/// The records a summary was made of, warm-up and cool-down included: what
/// its digest must cover.
pub fn records_of(s: &Summary) -> u64 {
    s.successful + s.failed + s.excluded
}

/// The block of several repeats of one profile, pooled: as if their records
/// had been one run, its repeats one after another. Counts, tokens and
/// durations add up; throughputs are over the summed durations; peaks are
/// the highest of any repeat; the offered and achieved rates are the
/// repeats' mean; one invalid repeat makes the block invalid, with its
/// reason. The distributions come from the merged `digests` (one per repeat,
/// in order): means exact, percentiles those of the union of the samples,
/// each rounded to the microsecond. One repeat is its own summary, unchanged.
///
/// Without digests (`None`) the distributions carry only the pooled mean and
/// count, their percentiles NaN: for callers that read throughputs and means.
pub fn pool(repeats: &[&Summary], digests: Option<&[&Digest]>) -> Option<Summary> {
    let first = *repeats.first()?;
    if repeats.len() == 1 {
        return Some(first.clone());
    }
    let sum = |f: &dyn Fn(&Summary) -> u64| repeats.iter().map(|s| f(s)).sum::<u64>();
    let mean = |f: &dyn Fn(&Summary) -> f64| repeats.iter().map(|s| f(s)).sum::<f64>() / repeats.len() as f64;
    let duration_s: f64 = repeats.iter().map(|s| s.duration_s).sum();
    let per_second = |x: f64| if duration_s > 0.0 { x / duration_s } else { 0.0 };
    let successful = sum(&|s| s.successful);
    let (input, output) = (sum(&|s| s.total_input_tokens), sum(&|s| s.total_output_tokens));
    let asked: Vec<f64> = first.latency_s.percentiles.iter().map(|q| q.p).collect();
    let merged = digests.map(|ds| {
        let mut all = Digest::default();
        for d in ds {
            all.merge(d);
        }
        all
    });
    let dist = |pick: &dyn Fn(&Summary) -> &Distribution, hist: &dyn Fn(&Digest) -> &Histogram, unit_ns: f64| {
        if let Some(d) = &merged {
            return hist(d).distribution(unit_ns, &asked);
        }
        let count: u64 = repeats.iter().map(|s| pick(s).count).sum();
        let total: f64 = repeats.iter().map(|s| pick(s).mean * pick(s).count as f64).sum();
        Distribution {
            mean: if count == 0 { 0.0 } else { total / count as f64 },
            median: f64::NAN,
            p95: f64::NAN,
            p99: f64::NAN,
            count,
            percentiles: asked.iter().map(|&p| Percentile { p, value: f64::NAN }).collect(),
        }
    };
    let (s, ms) = (1e9, 1e6);
    let invalid: Vec<String> = repeats
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.invalid.as_ref().map(|why| format!("repeat {}: {why}", i + 1)))
        .collect();
    Some(Summary {
        successful,
        failed: sum(&|s| s.failed),
        max_concurrency: first.max_concurrency,
        duration_s,
        total_input_tokens: input,
        total_output_tokens: output,
        request_throughput: per_second(successful as f64),
        output_throughput: per_second(output as f64),
        peak_output_throughput: repeats.iter().filter_map(|s| s.peak_output_throughput).reduce(f64::max),
        peak_concurrent: repeats.iter().map(|s| s.peak_concurrent).max().unwrap_or(0),
        total_token_throughput: per_second((input + output) as f64),
        latency_s: dist(&|x| &x.latency_s, &|d| &d.latency, s),
        ttft_ms: dist(&|x| &x.ttft_ms, &|d| &d.ttft, ms),
        tpot_ms: dist(&|x| &x.tpot_ms, &|d| &d.tpot, ms),
        itl_ms: dist(&|x| &x.itl_ms, &|d| &d.itl, ms),
        itl_per_token_ms: dist(&|x| &x.itl_per_token_ms, &|d| &d.itl_per_token, ms),
        latency_from_scheduled_s: dist(&|x| &x.latency_from_scheduled_s, &|d| &d.latency_from_scheduled, s),
        ttft_from_scheduled_ms: dist(&|x| &x.ttft_from_scheduled_ms, &|d| &d.ttft_from_scheduled, ms),
        connect_ms: dist(&|x| &x.connect_ms, &|d| &d.connect, ms),
        failures: Failures {
            http_error: sum(&|s| s.failures.http_error),
            timeout: sum(&|s| s.failures.timeout),
            cancelled: sum(&|s| s.failures.cancelled),
            incomplete: sum(&|s| s.failures.incomplete),
            transport_error: sum(&|s| s.failures.transport_error),
            disconnected: sum(&|s| s.failures.disconnected),
            malformed: sum(&|s| s.failures.malformed),
        },
        failure_reasons: {
            let mut counts = crate::metrics::ReasonCounts::default();
            for r in repeats.iter().flat_map(|s| &s.failure_reasons) {
                counts.add(r.reason.clone(), r.count);
            }
            counts.named()
        },
        excluded: sum(&|s| s.excluded),
        dispatch_lag_ms: dist(&|x| &x.dispatch_lag_ms, &|d| &d.dispatch_lag, ms),
        goodput: first.goodput.map(|g| {
            let good = sum(&|s| s.goodput.map_or(0, |g| g.good));
            crate::metrics::Goodput { slo: g.slo, good, request_goodput: per_second(good as f64) }
        }),
        offered_rate: first.offered_rate.map(|_| mean(&|s| s.offered_rate.unwrap_or(0.0))),
        achieved_rate: mean(&|s| s.achieved_rate),
        cap_waits: sum(&|s| s.cap_waits),
        lag_limit_ms: first.lag_limit_ms,
        rate_tolerance: first.rate_tolerance,
        client_cpu_s: repeats.iter().map(|s| s.client_cpu_s).sum(),
        invalid: (!invalid.is_empty()).then(|| invalid.join("; ")),
        usage_check: pool_usage(repeats),
        usage_below_events: sum(&|s| s.usage_below_events),
        // Each repeat has its own window.
        steady_state: if repeats.len() == 1 { first.steady_state.clone() } else { None },
        noise: if repeats.len() == 1 { first.noise.clone() } else { None },
        sessions: repeats
            .iter()
            .any(|s| s.sessions.is_some())
            .then(|| crate::metrics::sessions::Sessions::pool(repeats.iter().filter_map(|s| s.sessions.as_ref()))),
    })
}

/// The repeats' token-count checks together: counts summed, ratios weighted
/// by what each compared.
fn pool_usage(repeats: &[&Summary]) -> Option<crate::metrics::UsageCheck> {
    let checks: Vec<&crate::metrics::UsageCheck> = repeats.iter().filter_map(|s| s.usage_check.as_ref()).collect();
    if checks.is_empty() {
        return None;
    }
    let weighted = |n: &dyn Fn(&crate::metrics::UsageCheck) -> u64, r: &dyn Fn(&crate::metrics::UsageCheck) -> f64| {
        let total: u64 = checks.iter().map(|c| n(c)).sum();
        if total == 0 { 0.0 } else { checks.iter().map(|c| r(c) * n(c) as f64).sum::<f64>() / total as f64 }
    };
    Some(crate::metrics::UsageCheck {
        prompts_compared: checks.iter().map(|c| c.prompts_compared).sum(),
        prompts_off: checks.iter().map(|c| c.prompts_off).sum(),
        prompt_ratio: weighted(&|c| c.prompts_compared, &|c| c.prompt_ratio),
        outputs_compared: checks.iter().map(|c| c.outputs_compared).sum(),
        outputs_off: checks.iter().map(|c| c.outputs_off).sum(),
        output_ratio: weighted(&|c| c.outputs_compared, &|c| c.output_ratio),
        outputs_by_events: checks.iter().map(|c| c.outputs_by_events).sum(),
    })
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::metrics::{SummaryOptions, summarize_with};
    use crate::record::{Chunk, Outcome};

    /// Records of every kind a run has: failures, warm-up, slots, bundled
    /// chunks, a server whose usage disagrees with the chunks.
    fn records(seed: u64, n: usize) -> Vec<RequestRecord> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let scheduled_ns = rng.random_range(0..5_000_000_000i64);
                let slot_ns = rng.random_bool(0.2).then(|| scheduled_ns + rng.random_range(0..50_000_000));
                let sent_ns = slot_ns.unwrap_or(scheduled_ns) + rng.random_range(0..3_000_000);
                let first = sent_ns + rng.random_range(1_000_000..2_000_000_000);
                let mut chunks = crate::record::Chunks::new();
                let mut at = first;
                for _ in 0..rng.random_range(0..40) {
                    chunks.push(Chunk { at_ns: at, tokens: rng.random_range(0..4) });
                    at += rng.random_range(0..200_000_000);
                }
                let outcome = if rng.random_bool(0.9) { Outcome::Ok } else { Outcome::Timeout };
                RequestRecord {
                    seq: i as u64,
                    scheduled_ns,
                    sent_ns,
                    slot_ns,
                    connect_ns: rng.random_bool(0.5).then(|| rng.random_range(10_000..5_000_000)),
                    first_token_ns: (!chunks.is_empty()).then_some(first),
                    completed_ns: at,
                    chunks,
                    prompt_tokens: rng.random_range(1..500),
                    output_tokens: rng.random_range(0..60),
                    outcome,
                    http_status: Some(200),
                    error: None,
                    phase: if rng.random_bool(0.05) { Phase::Warmup } else { Phase::Measured },
                    turn: None,
                }
            })
            .collect()
    }

    /// Within the microsecond rounding (and float noise) of the exact value.
    fn near(digest: &Distribution, exact: &Distribution, unit_ns: f64, what: &str) {
        assert_eq!(digest.count, exact.count, "{what} count");
        let tolerance = 0.5e3 / unit_ns + 1e-9 * exact.mean.abs().max(1.0);
        assert!((digest.mean - exact.mean).abs() <= 1e-9 * exact.mean.abs().max(1.0), "{what} mean");
        for (d, e) in [(digest.median, exact.median), (digest.p95, exact.p95), (digest.p99, exact.p99)]
            .into_iter()
            .chain(digest.percentiles.iter().zip(&exact.percentiles).map(|(d, e)| (d.value, e.value)))
        {
            assert!((d - e).abs() <= tolerance, "{what}: {d} against {e}");
        }
    }

    fn check_against_summary(digest: &Digest, records: &[RequestRecord], asked: &[f64]) {
        let options = SummaryOptions { percentiles: asked.to_vec(), ..SummaryOptions::new(None) };
        let s = summarize_with(records, options);
        let (sec, ms) = (1e9, 1e6);
        let pairs: [(&Histogram, &Distribution, f64, &str); 9] = [
            (&digest.latency, &s.latency_s, sec, "latency"),
            (&digest.ttft, &s.ttft_ms, ms, "ttft"),
            (&digest.tpot, &s.tpot_ms, ms, "tpot"),
            (&digest.itl, &s.itl_ms, ms, "itl"),
            (&digest.itl_per_token, &s.itl_per_token_ms, ms, "itl per token"),
            (&digest.latency_from_scheduled, &s.latency_from_scheduled_s, sec, "latency from scheduled"),
            (&digest.ttft_from_scheduled, &s.ttft_from_scheduled_ms, ms, "ttft from scheduled"),
            (&digest.connect, &s.connect_ms, ms, "connect"),
            (&digest.dispatch_lag, &s.dispatch_lag_ms, ms, "dispatch lag"),
        ];
        for (hist, exact, unit, what) in pairs {
            near(&hist.distribution(unit, asked), exact, unit, what);
        }
        assert_eq!(digest.records, records_of(&s));
    }

    #[test]
    fn a_digest_gives_the_summary_s_distributions_to_the_microsecond() {
        for seed in 0..20 {
            let rs = records(seed, 1 + seed as usize * 37);
            check_against_summary(&Digest::of(&rs), &rs, &[0.0, 25.0, 50.0, 90.0, 99.9, 100.0]);
        }
    }

    #[test]
    fn merged_digests_are_the_digest_of_all_the_records() {
        let (a, b, c) = (records(1, 300), records(2, 5), records(3, 800));
        let mut merged = Digest::of(&a);
        merged.merge(&Digest::of(&b));
        merged.merge(&Digest::of(&c));
        let all: Vec<RequestRecord> = a.iter().chain(&b).chain(&c).cloned().collect();
        let whole = Digest::of(&all);
        for (m, w) in merged.histograms().into_iter().zip(whole.histograms()) {
            assert_eq!((m.count, &m.counts), (w.count, &w.counts));
            assert!((m.sum_ns - w.sum_ns).abs() <= 1e-9 * w.sum_ns.abs());
        }
        // And so the percentiles of the union, as a summary of them all
        // (their times overlap, which the distributions do not mind).
        check_against_summary(&merged, &all, &[50.0, 99.0]);
        let empty = Digest::default();
        let mut with_empty = whole.clone();
        with_empty.merge(&empty);
        assert_eq!(with_empty, whole);
    }

    /// A request sent at `sent_ms`: its first token after `ttft_us`, one
    /// more token `gap_us` later.
    fn request(sent_ms: i64, ttft_us: i64, gap_us: i64) -> RequestRecord {
        let first = sent_ms * 1_000_000 + ttft_us * 1_000;
        let mut chunks = crate::record::Chunks::new();
        chunks.push(Chunk { at_ns: first, tokens: 1 });
        chunks.push(Chunk { at_ns: first + gap_us * 1_000, tokens: 1 });
        RequestRecord {
            seq: 0,
            scheduled_ns: sent_ms * 1_000_000,
            sent_ns: sent_ms * 1_000_000,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: Some(first),
            completed_ns: first + gap_us * 1_000,
            chunks,
            prompt_tokens: 10,
            output_tokens: 2,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            phase: Phase::Measured,
            turn: None,
        }
    }

    #[test]
    fn two_repeats_pool_into_the_block_of_their_union() {
        // Repeat 1: TTFTs 100, 200, 300 ms; repeat 2: 400 ms. The union's
        // median is 250 ms (between the 2nd and 3rd of 4), its p99 397 ms
        // (rank 0.99 * 3 = 2.97: 300 + 0.97 * 100); the mean of the two
        // repeats' medians would have said 300.
        let one = vec![request(0, 100_000, 10_000), request(1000, 200_000, 10_000), request(2000, 300_000, 10_000)];
        let two = vec![request(0, 400_000, 30_000)];
        let (s1, s2) =
            (summarize_with(&one, SummaryOptions::new(None)), summarize_with(&two, SummaryOptions::new(None)));
        let (d1, d2) = (Digest::of(&one), Digest::of(&two));
        let p = pool(&[&s1, &s2], Some(&[&d1, &d2])).expect("pooled");
        assert_eq!((p.successful, p.total_output_tokens, p.total_input_tokens), (4, 8, 40));
        assert!((p.ttft_ms.median - 250.0).abs() < 1e-9, "{}", p.ttft_ms.median);
        assert!((p.ttft_ms.p99 - 397.0).abs() < 1e-9, "{}", p.ttft_ms.p99);
        assert!((p.ttft_ms.mean - 250.0).abs() < 1e-9);
        // ITL: 10, 10, 10, 30 ms.
        assert!((p.itl_ms.mean - 15.0).abs() < 1e-9 && (p.itl_ms.median - 10.0).abs() < 1e-9);
        // Repeat 1 ran 2.31 s, repeat 2 0.43 s: 4 requests in 2.74 s.
        assert!((p.duration_s - 2.74).abs() < 1e-9, "{}", p.duration_s);
        assert!((p.request_throughput - 4.0 / 2.74).abs() < 1e-9);
        assert!((p.total_token_throughput - 48.0 / 2.74).abs() < 1e-9);
        assert_eq!(p.peak_concurrent, 1);

        // Without digests: the means and counts, no percentiles.
        let plain = pool(&[&s1, &s2], None).expect("pooled");
        assert!((plain.ttft_ms.mean - 250.0).abs() < 1e-9 && plain.ttft_ms.count == 4);
        assert!(plain.ttft_ms.p99.is_nan());
        assert_eq!(plain.total_token_throughput, p.total_token_throughput);

        // One repeat is its own summary; none is nothing.
        assert_eq!(pool(&[&s1], Some(&[&d1])), Some(s1.clone()));
        assert_eq!(pool(&[], None), None);
    }

    #[test]
    fn one_invalid_repeat_makes_the_pooled_block_invalid() {
        let rs = vec![request(0, 100_000, 10_000)];
        let good = summarize_with(&rs, SummaryOptions::new(None));
        let bad = Summary { invalid: Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".to_owned()), ..good.clone() };
        let d = Digest::of(&rs);
        let p = pool(&[&good, &bad], Some(&[&d, &d])).expect("pooled");
        assert_eq!(p.invalid.as_deref(), Some("repeat 2: p99 dispatch lag 9.00 ms exceeds 5.00 ms"));
        assert_eq!(p.successful, 2);
    }
}
