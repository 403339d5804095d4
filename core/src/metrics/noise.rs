//! How far one run's figures would move if it were run again, from its own
//! requests: the standard error of each headline figure by batch means.
//!
//! The successful requests, in the order they were sent, are cut into
//! [`BATCHES`] batches of equal count. Requests next to each other in time
//! share the engine's state (its batch, its queue), so they are not
//! independent and a bootstrap over single requests would understate the
//! spread; batches of many consecutive requests are near independent of
//! each other, and the spread of a figure across them says how much the
//! whole run's figure varies (the method of batch means, and for
//! percentiles Seila's batch quantiles):
//!
//! - a mean or a percentile: computed in each batch; its standard error is
//!   the batches' standard deviation over sqrt(B);
//! - a throughput (requests, output or all tokens per second): each batch's
//!   tokens `t_b` over its share of the run's time `d_b` (from its first send
//!   to the next batch's first send; the last to the run's last completion),
//!   so that the batches' sums are the run's; its standard error is the
//!   ratio estimator's, sqrt(sum (t_b - R d_b)^2 / (B (B - 1))) / mean(d_b).
//!
//! - the mean ITL, a mean over chunk gaps rather than requests: each
//!   batch's gaps summed over their count, as a ratio likewise (a request's
//!   gaps, summed and counted by its send's 10 ms bin as the prompts are,
//!   stay in its batch: they share its stream).
//!
//! - the ITL's median and P99, quantiles over chunk gaps: each batch's
//!   gaps (those of the requests sent in its time, from its first send to
//!   the next batch's), when the run's gaps are kept as they are (up to
//!   [`GAPS_KEPT`](super::build::GAPS_KEPT)); past that, counted into a
//!   histogram, they have none.
//!
//!   Only when the sends are spread over the run: when a batch's span is
//!   under [`MIN_SPAN_SHARE`] of an even split (a burst, or the first wave a
//!   concurrency cap lets in at once, as a rate far above the engine's pace
//!   with a cap does), the throughputs have none.
//!
//! Two runs of the same requests (one profile: the same dataset, seed and
//! count) compare their mean latency, TTFT and TPOT batch by batch as well:
//! the successful requests are also cut by their place in the schedule into
//! B batches, each named by a digest of the places it holds, and each
//! mean's value in each batch is kept. When two runs' batches hold the same
//! places, the difference of their means has the standard error of the B
//! batch differences (a paired comparison: what the requests themselves
//! vary by, a ShareGPT reply of 10 tokens or of 1,000, is in both sides of
//! each difference and cancels, and what is left is the engines'). Unpaired,
//! a 1,000-request ShareGPT run's mean latency moves by about 3% from its
//! reply lengths alone, and an 8% gain was within noise; paired, it is many
//! standard errors out. Where the prompts at a place differ (a dataset
//! drawn anew each run), the batch differences carry both runs' spread: the
//! interval is as wide as the unpaired one, and as honest.
//!
//! Each has B - 1 degrees of freedom. A batch of fewer than
//! [`MIN_PER_BATCH`] requests (or gaps) gives nothing (too short a run says
//! nothing of its noise); a P99 needs [`MIN_PER_BATCH_P99`] a batch (fewer,
//! and a batch's P99 is its maximum).

use serde::{Deserialize, Serialize};

use super::steady::{BIN_NS, Bins, Done};
use crate::stats::t_quantile;

/// Batches a run's successful requests are cut into.
pub const BATCHES: usize = 10;
/// Fewest requests a batch for any figure, and for a P99.
pub const MIN_PER_BATCH: usize = 5;
pub const MIN_PER_BATCH_P99: usize = 100;
/// The least span of time a batch may have, as a share of an even split of the run's, for its
/// throughputs to have an interval (below it the sends came in a burst).
pub const MIN_SPAN_SHARE: f64 = 0.25;

/// One run's standard errors, by headline figure.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// Batches the requests were cut into (each figure has one fewer
    /// degrees of freedom).
    pub batches: u32,
    /// By the figure's name as `compare --metric` takes it, in its unit
    /// there (ms for latencies, per second for throughputs).
    pub metrics: Vec<MetricNoise>,
    /// The successful requests cut by their place in the schedule into
    /// `batches` batches: a digest of each batch's requests (their places),
    /// which two runs must share to be compared batch by batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_requests: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricNoise {
    pub metric: String,
    pub se: f64,
    /// A mean figure's value in each of `Noise::batch_requests`' batches
    /// (empty for the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_means: Vec<f64>,
}

impl Noise {
    /// The standard error of `metric` and its degrees of freedom.
    pub fn se(&self, metric: &str) -> Option<(f64, f64)> {
        let m = self.metrics.iter().find(|m| m.metric == metric)?;
        Some((m.se, f64::from(self.batches.saturating_sub(1))))
    }

    /// The standard error of `metric`'s difference between this run and
    /// `other`, and its degrees of freedom, from their batches' differences:
    /// only when both served the same requests in each batch and kept the
    /// figure's batch means (a mean latency, TTFT or TPOT).
    pub fn paired_se(&self, other: &Noise, metric: &str) -> Option<(f64, f64)> {
        if self.batch_requests.len() < 2 || self.batch_requests != other.batch_requests {
            return None;
        }
        fn means<'a>(n: &'a Noise, metric: &str) -> Option<&'a [f64]> {
            let m = n.metrics.iter().find(|m| m.metric == metric)?;
            (m.batch_means.len() == n.batch_requests.len()).then_some(m.batch_means.as_slice())
        }
        let (a, b) = (means(self, metric)?, means(other, metric)?);
        let differences: Vec<f64> = a.iter().zip(b).map(|(a, b)| b - a).collect();
        Some((spread(&differences)?, (differences.len() - 1) as f64))
    }
}

/// The successful requests' chunk gaps by the bin of their request's send:
/// their sum (ns) and their count.
#[derive(Debug, Default)]
pub(super) struct GapBins {
    pub ns: Vec<u64>,
    pub count: Vec<u64>,
}

/// The noise of a run from its successful requests sorted by send, its
/// last completion, its prompt tokens, its chunk gaps by send bin and, when
/// they are kept, each chunk gap (ms) with its request's send (ns); `None`
/// for too few.
pub(super) fn noise<I: Iterator<Item = (i64, f64)>>(
    done: &[Done],
    last_completion: i64,
    input_bins: &Bins,
    gaps: &GapBins,
    gap_values: Option<impl Fn() -> I>,
) -> Option<Noise> {
    let n = done.len();
    if n < BATCHES * MIN_PER_BATCH {
        return None;
    }
    let batch = |b: usize| &done[b * n / BATCHES..(b + 1) * n / BATCHES];
    let mut metrics = Vec::new();
    let mut add = |metric: &str, se: Option<f64>| {
        if let Some(se) = se {
            metrics.push(MetricNoise { metric: metric.to_owned(), se, batch_means: Vec::new() });
        }
    };
    // The same requests cut by their place in the schedule, for comparisons batch by batch.
    let mut by_seq: Vec<&Done> = done.iter().collect();
    by_seq.sort_unstable_by_key(|d| d.seq);
    let by_seq_batch = |b: usize| &by_seq[b * n / BATCHES..(b + 1) * n / BATCHES];
    let batch_requests: Vec<u64> = (0..BATCHES).map(|b| digest(by_seq_batch(b).iter().map(|d| d.seq))).collect();
    let mut paired: Vec<(String, Vec<f64>)> = Vec::new();
    // A figure computed in each batch: the spread of the batches' values.
    let each = |values: Option<Vec<f64>>| values.and_then(|v| spread(&v));
    type Pick = fn(&Done) -> f32;
    let figures: [(&str, Pick); 3] =
        [("latency_ms", |d| d.latency_ms), ("ttft_ms", |d| d.ttft_ms), ("tpot_ms", |d| d.tpot_ms)];
    for (name, pick) in figures {
        let batches: Vec<Vec<f64>> = (0..BATCHES)
            .map(|b| sorted(batch(b).iter().map(pick).filter(|x| !x.is_nan()).map(f64::from).collect()))
            .collect();
        let means = batches.iter().map(|v| (v.len() >= MIN_PER_BATCH).then(|| v.iter().sum::<f64>() / v.len() as f64));
        add(&format!("mean_{name}"), each(means.collect()));
        let paired_means: Option<Vec<f64>> = (0..BATCHES)
            .map(|b| {
                let v: Vec<f64> =
                    by_seq_batch(b).iter().map(|d| pick(d)).filter(|x| !x.is_nan()).map(f64::from).collect();
                (v.len() >= MIN_PER_BATCH).then(|| v.iter().sum::<f64>() / v.len() as f64)
            })
            .collect();
        if let Some(means) = paired_means {
            paired.push((format!("mean_{name}"), means));
        }
        add(&format!("median_{name}"), each(batches.iter().map(|v| quantile(v, 0.5, MIN_PER_BATCH)).collect()));
        add(&format!("p99_{name}"), woodruff(&batches, 0.99, MIN_PER_BATCH_P99));
    }
    let starts: Vec<i64> = (0..BATCHES).map(|b| batch(b)[0].sent_ns).collect();
    if let Some(gap_values) = gap_values {
        // Each batch's gaps: those of the requests sent from its first send
        // to the next batch's.
        let mut batches = vec![Vec::new(); BATCHES];
        for (sent, gap) in gap_values() {
            batches[starts.partition_point(|&s| s <= sent).saturating_sub(1)].push(gap);
        }
        let batches: Vec<Vec<f64>> = batches.into_iter().map(sorted).collect();
        add("median_itl_ms", each(batches.iter().map(|v| quantile(v, 0.5, MIN_PER_BATCH)).collect()));
        add("p99_itl_ms", woodruff(&batches, 0.99, MIN_PER_BATCH_P99));
    }
    // Throughputs: each batch's share of the run's time.
    let spans: Vec<f64> = (0..BATCHES)
        .map(|b| {
            let end = starts.get(b + 1).copied().unwrap_or(last_completion);
            (end - starts[b]).max(0) as f64 / 1e9
        })
        .collect();
    let bin = |t: i64| usize::try_from(t.max(0) / BIN_NS).unwrap_or(0);
    // A batch's bins: from its first send's to the next batch's.
    let in_batch = |b: usize, bins: &Bins| -> f64 {
        let (from, to) = (bin(starts[b]), starts.get(b + 1).map_or(bins.len(), |&t| bin(t)));
        bins.get(from..to.min(bins.len())).unwrap_or(&[]).iter().sum::<u64>() as f64
    };
    let input = |b: usize| in_batch(b, input_bins) / 1e6;
    let output = |b: usize| batch(b).iter().map(|d| f64::from(d.output_tokens)).sum::<f64>();
    let throughputs: [(&str, &dyn Fn(usize) -> f64); 3] = [
        ("request_throughput", &|b| batch(b).len() as f64),
        ("output_throughput", &output),
        ("total_token_throughput", &|b| output(b) + input(b)),
    ];
    // Batches by send are spans of the run's time only when the sends are spread over it: a burst
    // (everything at once, or the first wave a concurrency cap lets in, then a send per completion)
    // leaves its first batches a few milliseconds for many requests' tokens, and their ratio swings
    // by the size of the throughput itself. Such a run says nothing of its throughputs' noise.
    let even = spans.iter().sum::<f64>() / BATCHES as f64;
    let spread_sends = spans.iter().all(|&span| span >= MIN_SPAN_SHARE * even);
    for (name, tokens) in throughputs.into_iter().filter(|_| spread_sends) {
        let t: Vec<f64> = (0..BATCHES).map(tokens).collect();
        if let Some(se) = ratio_se(&t, &spans) {
            metrics.push(MetricNoise { metric: name.to_owned(), se, batch_means: Vec::new() });
        }
    }
    let (sums, counts): (Vec<f64>, Vec<f64>) =
        (0..BATCHES).map(|b| (in_batch(b, &gaps.ns) / 1e6, in_batch(b, &gaps.count))).unzip();
    if counts.iter().all(|&c| c > 0.0)
        && let Some(se) = ratio_se(&sums, &counts)
    {
        metrics.push(MetricNoise { metric: "mean_itl_ms".to_owned(), se, batch_means: Vec::new() });
    }
    for (name, means) in paired {
        if let Some(m) = metrics.iter_mut().find(|m| m.metric == name) {
            m.batch_means = means;
        }
    }
    Some(Noise { batches: BATCHES as u32, metrics, batch_requests })
}

/// FNV-1a over the places of a batch's requests, in order.
fn digest(seqs: impl Iterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seqs.flat_map(u64::to_le_bytes) {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `q` quantile of the sorted `v` (linear between ranks), when it holds
/// at least `least` values.
fn quantile(v: &[f64], q: f64, least: usize) -> Option<f64> {
    (v.len() >= least.max(1)).then(|| {
        let rank = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
        let (lo, hi) = (v[rank.floor() as usize], v[rank.ceil() as usize]);
        lo + (hi - lo) * rank.fract()
    })
}

/// The standard error of the whole run's `q` quantile (a P99), each of
/// the sorted `batches` holding at least `least` values, by Woodruff's
/// method with batch means: the share of each batch at or below the run's
/// quantile is a mean, whose standard error the batches give (the ratio
/// estimator: batches of gaps differ in size), never below an independent
/// sample's sqrt(q (1 - q) / n); the run's own quantiles at q plus and
/// minus t times that error bound the quantile, and half their distance
/// over t is its error. A batch's own P99 is its one or two largest
/// values, whose spread understated the run-to-run spread (two sittings of
/// 20 identical pairs moved beyond it in 3 and 5); the run's quantiles at
/// the shifted shares use every value of the tail.
fn woodruff(batches: &[Vec<f64>], q: f64, least: usize) -> Option<f64> {
    if batches.len() < 2 || batches.iter().any(|v| v.len() < least) {
        return None;
    }
    let all = sorted(batches.concat());
    let at = |p: f64| quantile(&all, p, 1);
    let x = at(q)?;
    let below: Vec<f64> = batches.iter().map(|v| v.partition_point(|&y| y <= x) as f64).collect();
    let sizes: Vec<f64> = batches.iter().map(|v| v.len() as f64).collect();
    let independent = (q * (1.0 - q) / all.len() as f64).sqrt();
    let se_share = ratio_se(&below, &sizes)?.max(independent);
    let t = t_quantile(0.975, (batches.len() - 1) as f64);
    Some((at(q + t * se_share)? - at(q - t * se_share)?) / (2.0 * t))
}

/// The standard error of the mean of `values`: their standard deviation
/// over sqrt(n).
fn spread(values: &[f64]) -> Option<f64> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64;
    Some((var / n as f64).sqrt())
}

/// The standard error of the ratio sum(t) / sum(d) over batches.
fn ratio_se(t: &[f64], d: &[f64]) -> Option<f64> {
    let b = t.len();
    let (st, sd): (f64, f64) = (t.iter().sum(), d.iter().sum());
    if b < 2 || sd <= 0.0 {
        return None;
    }
    let r = st / sd;
    let mean_d = sd / b as f64;
    let ss: f64 = t.iter().zip(d).map(|(t, d)| (t - r * d) * (t - r * d)).sum();
    Some((ss / (b * (b - 1)) as f64).sqrt() / mean_d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// `n` requests one every 10 ms, each of `ttft(i)` ms to its first
    /// token and 10 output tokens, 2 ms apart.
    fn run(n: usize, ttft: impl Fn(usize) -> f32) -> Option<Noise> {
        run_with(n, ttft, |_| 18)
    }

    /// The same, request i's nine gaps summing to `gaps_ms(i)`.
    fn run_with(n: usize, ttft: impl Fn(usize) -> f32, gaps_ms: impl Fn(usize) -> i64) -> Option<Noise> {
        let done: Vec<Done> = (0..n)
            .map(|i| Done {
                seq: i as u64,
                sent_ns: i as i64 * 10 * MS,
                ttft_ms: ttft(i),
                tpot_ms: 2.0,
                latency_ms: ttft(i) + 18.0,
                output_tokens: 10,
            })
            .collect();
        let (mut input, mut gaps) = (Vec::new(), GapBins::default());
        for (i, d) in done.iter().enumerate() {
            super::super::steady::bin_add(&mut input, d.sent_ns, 50_000_000);
            super::super::steady::bin_add(&mut gaps.ns, d.sent_ns, (gaps_ms(i) * MS) as u64);
            super::super::steady::bin_add(&mut gaps.count, d.sent_ns, 9);
        }
        // Each request's nine gaps, equal.
        let values = || (0..n).flat_map(|i| std::iter::repeat_n((i as i64 * 10 * MS, gaps_ms(i) as f64 / 9.0), 9));
        noise(&done, (n as i64 - 1) * 10 * MS + 40 * MS, &input, &gaps, Some(values))
    }

    /// Requests `seqs` sent 100 ms apart in that order, request `seq`'s
    /// reply 10 to 1,000 tokens long (the same in every run) at `tpot` ms a
    /// token after a 30 ms TTFT; with each run's mean latency.
    fn served(seqs: &[u64], tpot: f32) -> (Noise, f64) {
        let reply = |seq: u64| 10 + (seq.wrapping_mul(2_654_435_761) >> 7) % 991;
        let done: Vec<Done> = seqs
            .iter()
            .enumerate()
            .map(|(k, &seq)| Done {
                seq,
                sent_ns: k as i64 * 100 * MS,
                ttft_ms: 30.0,
                tpot_ms: tpot,
                latency_ms: 30.0 + reply(seq) as f32 * tpot,
                output_tokens: reply(seq) as u32,
            })
            .collect();
        let mean = done.iter().map(|d| f64::from(d.latency_ms)).sum::<f64>() / done.len() as f64;
        let no_gaps = None::<fn() -> std::iter::Empty<(i64, f64)>>;
        let last = seqs.len() as i64 * 100 * MS + 10_000 * MS;
        (noise(&done, last, &Vec::new(), &GapBins::default(), no_gaps).expect("enough requests"), mean)
    }

    #[test]
    fn two_runs_of_the_same_requests_compare_their_means_batch_by_batch() {
        use crate::stats::Difference;
        let seqs: Vec<u64> = (0..1000).collect();
        // B decodes 2% faster; it sent its requests in a slightly different order.
        let mut shuffled = seqs.clone();
        for pair in shuffled.chunks_mut(2) {
            pair.swap(0, 1);
        }
        let ((a, mean_a), (b, mean_b)) = (served(&seqs, 10.0), served(&shuffled, 9.8));
        let key = "mean_latency_ms";
        // Each run's mean moves by what its replies' lengths vary by: the gain is within that.
        let unpaired = Difference::of_errors(mean_b - mean_a, b.se(key).expect("b's"), a.se(key).expect("a's"));
        assert_eq!(unpaired.contains_zero(), Some(true), "{unpaired:?}");
        // Batch by batch the lengths cancel: the gain stands many errors out.
        let paired = Difference::paired(mean_b - mean_a, a.paired_se(&b, key).expect("the same requests"));
        assert_eq!(paired.contains_zero(), Some(false), "{paired:?}");
        let (p, u) = (paired.half_width.expect("paired"), unpaired.half_width.expect("unpaired"));
        assert!(p < u / 10.0, "paired ±{p} against ±{u}");
        // The TPOTs are the same in every batch: their difference has no error.
        assert_eq!(a.paired_se(&b, "mean_tpot_ms"), Some((0.0, 9.0)));
        // Nothing pairs other requests, a throughput, or a figure one side lacks.
        let (other, _) = served(&(1..1001).collect::<Vec<u64>>(), 9.8);
        assert_eq!(a.paired_se(&other, key), None, "other requests");
        assert_eq!(a.paired_se(&b, "total_token_throughput"), None);
        let mut blind = b.clone();
        blind.metrics.iter_mut().for_each(|m| m.batch_means.clear());
        assert_eq!(a.paired_se(&blind, key), None);
        // A summary stored before batches were kept reads as unpaired.
        let old: Noise = serde_json::from_str(r#"{"batches":10,"metrics":[{"metric":"mean_latency_ms","se":1.0}]}"#)
            .expect("an old summary's noise");
        assert_eq!(a.paired_se(&old, key), None);
    }

    #[test]
    fn a_figure_that_never_moves_has_no_noise_and_one_that_does_has_its_spread() {
        let steady = run(1000, |_| 20.0).expect("enough requests");
        assert_eq!(steady.batches, 10);
        assert_eq!(steady.se("mean_ttft_ms"), Some((0.0, 9.0)));
        assert_eq!(steady.se("p99_latency_ms").map(|s| s.0), Some(0.0));
        // One request every 10 ms: every batch's throughput is the same but
        // the last, which holds the final request's 40 ms.
        let (se, _) = steady.se("request_throughput").expect("a throughput");
        assert!(se > 0.0 && se < 0.5, "{se}");
        // Batches whose mean TTFT alternates 10 and 30 ms: a standard
        // deviation of 10.54 over sqrt(10).
        let moving = run(1000, |i| if (i / 100) % 2 == 0 { 10.0 } else { 30.0 }).expect("enough");
        let (se, df) = moving.se("mean_ttft_ms").expect("a mean");
        assert!((se - (100.0f64 * 10.0 / 9.0).sqrt() / 10f64.sqrt()).abs() < 1e-9, "{se}");
        assert_eq!(df, 9.0);
        assert_eq!(moving.se("mean_itl_ms"), Some((0.0, 9.0)), "every gap 2 ms");
        assert_eq!(moving.se("p99_itl_ms"), Some((0.0, 9.0)), "every gap 2 ms");
        // Batches whose gaps alternate 2 and 4 ms: the mean ITL's standard
        // error is that of the batches' ITLs (each the same count of gaps).
        let itl = run_with(1000, |_| 20.0, |i| if (i / 100) % 2 == 0 { 18 } else { 36 }).expect("enough");
        let (se, _) = itl.se("mean_itl_ms").expect("an ITL");
        assert!((se - (10.0f64 / 9.0).sqrt() / 10f64.sqrt()).abs() < 1e-9, "{se}");
        // Every batch's gaps are all 2 or all 4 ms: so is its median; the
        // run's P99 is 4 ms, and so is every quantile near it.
        let (se, _) = itl.se("median_itl_ms").expect("the gaps are kept");
        assert!((se - (10.0f64 / 9.0).sqrt() / 10f64.sqrt()).abs() < 1e-9, "{se}");
        assert_eq!(itl.se("p99_itl_ms"), Some((0.0, 9.0)));
    }

    #[test]
    fn the_itls_quantiles_take_each_batchs_gaps_and_need_them_kept() {
        // A slow gap (40 ms against 2) for one request in 20 in the even
        // batches of 100 requests and one in 10 in the odd ones: 5 or 10 of
        // a batch's 900 gaps, 75 of the run's 9,000.
        let slow = |i: usize| if (i / 100).is_multiple_of(2) { i.is_multiple_of(20) } else { i.is_multiple_of(10) };
        let done: Vec<Done> = (0..1000)
            .map(|i| Done {
                seq: i as u64,
                sent_ns: i as i64 * 10 * MS,
                ttft_ms: 20.0,
                tpot_ms: 2.0,
                latency_ms: 38.0,
                output_tokens: 10,
            })
            .collect();
        let (mut input, mut bins) = (Vec::new(), GapBins::default());
        for d in &done {
            super::super::steady::bin_add(&mut input, d.sent_ns, 50_000_000);
            super::super::steady::bin_add(&mut bins.ns, d.sent_ns, (18 * MS) as u64);
            super::super::steady::bin_add(&mut bins.count, d.sent_ns, 9);
        }
        let gap = |i: usize, k: usize| if slow(i) && k == 0 { 40.0 } else { 2.0 };
        let values = || (0..1000).flat_map(move |i| (0..9).map(move |k| (i as i64 * 10 * MS, gap(i, k))));
        let last = 1000 * 10 * MS;
        let with = noise(&done, last, &input, &bins, Some(values)).expect("enough");
        // The run's P99 (rank 8,909.01 of 9,000) is a 2 ms gap; the share at
        // or below it, 895 or 890 of a batch's 900, has a standard error of
        // 0.00093 by the batches, under an independent sample's
        // sqrt(0.99 x 0.01 / 9,000) = 0.00105, which it takes: t x that
        // either side reaches from a 2 ms gap (rank 8,887.7) to a slow one
        // (8,930.4), so the interval is 2 to 40 ms.
        let (se, df) = with.se("p99_itl_ms").expect("kept gaps");
        let t = t_quantile(0.975, 9.0);
        assert!((se - 38.0 / (2.0 * t)).abs() < 1e-9 && df == 9.0, "{se}");
        assert_eq!(with.se("median_itl_ms"), Some((0.0, 9.0)), "the median gap is 2 ms everywhere");
        let without = noise(&done, last, &input, &bins, None::<fn() -> std::iter::Empty<(i64, f64)>>).expect("enough");
        assert_eq!(without.se("p99_itl_ms"), None, "gaps counted into a histogram have none");
        assert!(without.se("mean_itl_ms").is_some(), "the mean's comes from the bins");
    }

    #[test]
    fn a_burst_held_by_a_concurrency_cap_has_no_throughput_interval() {
        // 1000 requests at 1000 req/s, at most 500 in flight, each taking 10 s: the first 500 go at
        // once, the rest one per completion. Batches by send: five of them span a millisecond.
        let sent = |i: usize| if i < 500 { i as i64 * MS } else { 10_000 * MS + (i as i64 - 500) * 20 * MS };
        let done: Vec<Done> = (0..1000)
            .map(|i| Done {
                seq: i as u64,
                sent_ns: sent(i),
                ttft_ms: 50.0,
                tpot_ms: 20.0,
                latency_ms: 10_000.0,
                output_tokens: 500,
            })
            .collect();
        let (mut input, mut gaps) = (Vec::new(), GapBins::default());
        for d in &done {
            super::super::steady::bin_add(&mut input, d.sent_ns, 300_000_000);
            super::super::steady::bin_add(&mut gaps.ns, d.sent_ns, (9_950 * MS) as u64);
            super::super::steady::bin_add(&mut gaps.count, d.sent_ns, 499);
        }
        let last = sent(999) + 10_000 * MS;
        let burst = noise(&done, last, &input, &gaps, None::<fn() -> std::iter::Empty<(i64, f64)>>).expect("enough");
        for metric in ["request_throughput", "output_throughput", "total_token_throughput"] {
            assert_eq!(burst.se(metric), None, "{metric}");
        }
        // Its latencies' batches are still batches of requests.
        assert_eq!(burst.se("mean_latency_ms"), Some((0.0, 9.0)));
        // Sends spread over the run, one every 10 ms, keep theirs.
        assert!(run(1000, |_| 20.0).expect("enough").se("total_token_throughput").is_some());
    }

    #[test]
    fn too_few_requests_say_nothing_of_their_noise() {
        assert_eq!(run(49, |_| 20.0), None);
        let some = run(50, |_| 20.0).expect("five a batch");
        assert!(some.se("mean_ttft_ms").is_some());
        assert_eq!(some.se("p99_ttft_ms"), None, "a P99 needs a hundred a batch");
        assert!(run(1000, |_| 20.0).expect("a thousand").se("p99_ttft_ms").is_some());
    }

    #[test]
    fn the_ratio_estimator_is_the_spread_of_a_rate_over_unequal_spans() {
        // Two batches: 10 tokens in 1 s and 30 in 1 s: R = 20, residuals
        // -10 and 10, se = sqrt(200 / 2) / 1 = 10.
        assert!((ratio_se(&[10.0, 30.0], &[1.0, 1.0]).expect("se") - 10.0).abs() < 1e-12);
        assert_eq!(ratio_se(&[10.0, 20.0], &[1.0, 2.0]), Some(0.0), "one rate throughout");
    }
}
