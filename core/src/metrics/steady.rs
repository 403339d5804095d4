//! The steady state of a run: the window in which the requests in flight
//! stay at or above 90% of the run's peak (as vLLM's Rust client defines
//! it), the run's figures over that window alone, and a test of whether
//! they hold still in it.
//!
//! The window opens the first time the requests in flight reach 90% of the
//! peak (rounded up) and closes the last time they fall below it; the share
//! of the window spent at or above that level is `held`. A run reached a
//! steady state when it held that level for at least half its window and
//! sent at least [`MIN_REQUESTS`] requests in it: a closed loop does, once
//! its users are all busy; an open loop below saturation mostly does not
//! (its requests in flight follow its arrivals).
//!
//! Within the window: output tokens are counted at their arrival (so the
//! throughput is that of the window exactly, to a [`BIN_NS`] bin), prompt
//! tokens and requests at their send; TTFT and TPOT are those of the
//! successful requests sent in it.
//!
//! Stationarity: the window is cut into [`BATCHES`] equal spans; the mean
//! TTFT of the requests sent in each, and the output tokens per second
//! arriving in each, are tested for a trend with the Mann-Kendall test
//! (no assumption on their distribution; batches of many requests make
//! their means near independent). A series drifts when its trend is
//! significant at 5% and Sen's slope over the window moves it by at least
//! [`DRIFT_PCT`] of its median: a run whose latency climbs all through its
//! window has not settled, however long it ran.

use serde::{Deserialize, Serialize};

/// Output tokens are counted into bins of this many ns by arrival.
pub const BIN_NS: i64 = 10_000_000;
/// Equal spans of the window the stationarity test compares.
pub const BATCHES: usize = 10;
/// Fewest requests sent in a window that counts as a steady state.
pub const MIN_REQUESTS: u64 = 20;
/// Smallest move over the window, in percent of the median, that counts
/// as drift.
pub const DRIFT_PCT: f64 = 5.0;

/// A run's steady state, or why it has none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SteadyState {
    /// Whether the run reached one (held at least half its window, with
    /// enough requests in it); the figures below are the window's either way.
    pub reached: bool,
    /// The window, seconds from the run's first send.
    pub start_s: f64,
    pub end_s: f64,
    /// Requests in flight it takes to be in the window: 90% of the peak.
    pub level: u64,
    /// Share of the window at or above that level.
    pub held: f64,
    /// Successful requests sent in the window.
    pub requests: u64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub mean_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    /// The trend over the window of the batches' mean TTFT and output
    /// throughput, in percent of their median, when it is significant.
    pub ttft_drift_pct: Option<f64>,
    pub throughput_drift_pct: Option<f64>,
}

impl SteadyState {
    /// Whether a figure moved by at least `DRIFT_PCT` over the window.
    pub fn drifts(&self) -> bool {
        [self.ttft_drift_pct, self.throughput_drift_pct].into_iter().flatten().any(|d| d.abs() >= DRIFT_PCT)
    }

    /// What the block says of it.
    pub fn words(&self) -> String {
        let span = format!("{:.1}-{:.1} s", self.start_s, self.end_s);
        if !self.reached {
            return format!(
                "never reached: {} or more in flight for {:.0}% of {span}, {} requests sent in it (fewer than {MIN_REQUESTS}, or held under half the window)",
                self.level,
                self.held * 100.0,
                self.requests
            );
        }
        let mut drifts = Vec::new();
        if let Some(d) = self.ttft_drift_pct.filter(|d| d.abs() >= DRIFT_PCT) {
            drifts.push(format!("mean TTFT {d:+.1}%"));
        }
        if let Some(d) = self.throughput_drift_pct.filter(|d| d.abs() >= DRIFT_PCT) {
            drifts.push(format!("output throughput {d:+.1}%"));
        }
        if drifts.is_empty() {
            format!("{span}, {} or more in flight, stationary", self.level)
        } else {
            format!("{span}, {} or more in flight, drifting: {} over the window", self.level, drifts.join(", "))
        }
    }
}

/// One successful request, as the steady state and the noise need it (24
/// bytes: a run of a million requests holds 24 MB of them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Done {
    /// Its place in the run's schedule (`RequestRecord::seq`).
    pub seq: u64,
    pub sent_ns: i64,
    /// NaN when the request has none.
    pub ttft_ms: f32,
    pub tpot_ms: f32,
    pub latency_ms: f32,
    pub output_tokens: u32,
}

impl Done {
    fn ttft(&self) -> Option<f64> {
        (!self.ttft_ms.is_nan()).then_some(f64::from(self.ttft_ms))
    }

    fn tpot(&self) -> Option<f64> {
        (!self.tpot_ms.is_nan()).then_some(f64::from(self.tpot_ms))
    }
}

/// Tokens by the bin of their time: millionths of a token in
/// `[i, i + 1) * BIN_NS`.
pub(super) type Bins = [u64];

/// Adds `millionths` of a token at `at_ns` to `bins`.
pub(super) fn bin_add(bins: &mut Vec<u64>, at_ns: i64, millionths: u64) {
    let i = usize::try_from(at_ns.max(0) / BIN_NS).unwrap_or(0);
    if bins.len() <= i {
        bins.resize(i + 1, 0);
    }
    bins[i] += millionths;
}

/// A run's measured requests' sends in time order: the successful ones'
/// (`done`, sorted by send) and the failed ones' (sorted), merged; the
/// successful ones' are not kept twice.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sends<'a> {
    pub done: &'a [Done],
    pub failed: &'a [i64],
}

impl<'a> Sends<'a> {
    pub fn len(&self) -> usize {
        self.done.len() + self.failed.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = i64> + 'a {
        let mut a = self.done.iter().map(|d| d.sent_ns).peekable();
        let mut b = self.failed.iter().copied().peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(&x), Some(&y)) if y < x => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        })
    }
}

/// Calls `f(t, before, after)` at each send and completion in time order
/// (a completion before a send at one instant, as the peak counts them),
/// with the requests in flight just before and after it.
fn walk(sends: Sends<'_>, completions: &[i64], mut f: impl FnMut(i64, i64, i64)) {
    let (mut j, mut now) = (0usize, 0i64);
    for t in sends.iter() {
        while j < completions.len() && completions[j] <= t {
            f(completions[j], now, now - 1);
            now -= 1;
            j += 1;
        }
        f(t, now, now + 1);
        now += 1;
    }
    for &c in &completions[j..] {
        f(c, now, now - 1);
        now -= 1;
    }
}

/// The steady state of a run from its measured requests' sends (its
/// successful requests sorted by send, and the failed ones' sends) and
/// completions (sorted), its output tokens by arrival bin and prompt tokens
/// by send bin; `None` for a run of fewer than two requests.
pub(super) fn steady_state(
    sends: Sends<'_>,
    completions: &[i64],
    output_bins: &Bins,
    input_bins: &Bins,
) -> Option<SteadyState> {
    let done = sends.done;
    if sends.len() < 2 {
        return None;
    }
    let mut peak = 0i64;
    walk(sends, completions, |_, _, after| peak = peak.max(after));
    let level = ((peak as f64) * 0.9).ceil().max(1.0) as i64;
    // The first instant at the level, the last one it falls below it, and
    // the time at or above it between.
    let (mut start, mut end, mut held_ns, mut above_since, mut last) = (None, None, 0i64, None::<i64>, 0i64);
    walk(sends, completions, |t, before, after| {
        last = t;
        if after >= level && before < level {
            start.get_or_insert(t);
            above_since = Some(t);
        } else if before >= level && after < level {
            end = Some(t);
            if let Some(s) = above_since.take() {
                held_ns += t - s;
            }
        }
    });
    let start = start?;
    let end = end.unwrap_or(last);
    let first = sends.iter().next().unwrap_or(0);
    let span_ns = (end - start).max(1);
    let span_s = span_ns as f64 / 1e9;
    // The successful requests sent in [a, b): a run of `done`.
    let sent_in = |a: i64, b: i64| {
        let lo = done.partition_point(|d| d.sent_ns < a);
        let hi = done.partition_point(|d| d.sent_ns < b);
        &done[lo..hi.max(lo)]
    };
    let bin = |t: i64| usize::try_from(t.max(0) / BIN_NS).unwrap_or(0);
    let between = |bins: &Bins, a: i64, b: i64| -> f64 {
        bins.get(bin(a)..bin(b).min(bins.len())).unwrap_or(&[]).iter().sum::<u64>() as f64 / 1e6
    };
    let sent = sent_in(start, end);
    let requests = sent.len() as u64;
    let output = between(output_bins, start, end);
    let input = between(input_bins, start, end);
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let (n, sum) = v.fold((0u64, 0.0), |(n, sum), x| (n + 1, sum + x));
        if n == 0 { 0.0 } else { sum / n as f64 }
    };
    let mut ttft: Vec<f32> = sent.iter().filter(|d| !d.ttft_ms.is_nan()).map(|d| d.ttft_ms).collect();
    ttft.sort_unstable_by(f32::total_cmp);
    let p99 = if ttft.is_empty() {
        0.0
    } else {
        let rank = 0.99 * (ttft.len() - 1) as f64;
        let (lo, hi) = (f64::from(ttft[rank.floor() as usize]), f64::from(ttft[rank.ceil() as usize]));
        lo + (hi - lo) * rank.fract()
    };
    drop(ttft);
    // Ten equal spans: each one's mean TTFT (by send) and output tokens
    // per second (by arrival).
    let edges: Vec<i64> = (0..=BATCHES).map(|i| start + span_ns * i as i64 / BATCHES as i64).collect();
    let mut ttft_means = Vec::with_capacity(BATCHES);
    let mut throughputs = Vec::with_capacity(BATCHES);
    for w in edges.windows(2) {
        let batch = sent_in(w[0], w[1]);
        if batch.iter().any(|d| d.ttft().is_some()) {
            ttft_means.push(mean(&mut batch.iter().filter_map(Done::ttft)));
        }
        let secs = (w[1] - w[0]) as f64 / 1e9;
        if secs > 0.0 {
            throughputs.push(between(output_bins, w[0], w[1]) / secs);
        }
    }
    let held = held_ns as f64 / span_ns as f64;
    Some(SteadyState {
        reached: held >= 0.5 && requests >= MIN_REQUESTS,
        start_s: (start - first) as f64 / 1e9,
        end_s: (end - first) as f64 / 1e9,
        level: level as u64,
        held,
        requests,
        request_throughput: requests as f64 / span_s,
        output_throughput: output / span_s,
        total_token_throughput: (output + input) / span_s,
        mean_ttft_ms: mean(&mut sent.iter().filter_map(Done::ttft)),
        p99_ttft_ms: p99,
        mean_tpot_ms: mean(&mut sent.iter().filter_map(Done::tpot)),
        ttft_drift_pct: drift(&ttft_means),
        throughput_drift_pct: drift(&throughputs),
    })
}

/// The move of a series over its length in percent of its median (Sen's
/// slope times its length), when the Mann-Kendall test finds a trend at
/// the 5% level; `None` without one, or with fewer than 4 points.
pub fn drift(series: &[f64]) -> Option<f64> {
    let n = series.len();
    if n < 4 {
        return None;
    }
    let mut s = 0i64;
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            s += match series[j].total_cmp(&series[i]) {
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
            };
            slopes.push((series[j] - series[i]) / (j - i) as f64);
        }
    }
    // The normal approximation with the continuity correction (no ties
    // correction: means of many samples rarely tie).
    let nf = n as f64;
    let variance = nf * (nf - 1.0) * (2.0 * nf + 5.0) / 18.0;
    let z = if s > 0 {
        (s - 1) as f64 / variance.sqrt()
    } else if s < 0 {
        (s + 1) as f64 / variance.sqrt()
    } else {
        0.0
    };
    if z.abs() < 1.96 {
        return None;
    }
    slopes.sort_by(f64::total_cmp);
    let m = slopes.len();
    let sen = if m % 2 == 1 { slopes[m / 2] } else { (slopes[m / 2 - 1] + slopes[m / 2]) / 2.0 };
    let mut sorted = series.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
    (median != 0.0).then(|| sen * (nf - 1.0) / median.abs() * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// A closed loop of `users` users each sending `per_user` requests of
    /// `latency(i)` ms one after another; a token a ms while a request runs.
    fn closed_loop(users: usize, per_user: usize, latency: impl Fn(usize) -> i64) -> SteadyState {
        let (mut sends, mut completions, mut done) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tokens, mut input): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
        for u in 0..users {
            let mut t = 0i64;
            for k in 0..per_user {
                let i = k * users + u;
                let l = latency(i) * MS;
                sends.push(t);
                completions.push(t + l);
                done.push(Done {
                    seq: i as u64,
                    sent_ns: t,
                    ttft_ms: (l / MS / 10) as f32,
                    tpot_ms: 1.0,
                    latency_ms: (l / MS) as f32,
                    output_tokens: 1,
                });
                bin_add(&mut input, t, 100_000_000);
                for ms in 0..l / MS {
                    bin_add(&mut tokens, t + ms * MS, 1_000_000);
                }
                t += l;
            }
        }
        drop(sends);
        completions.sort_unstable();
        done.sort_by_key(|d| d.sent_ns);
        steady_state(Sends { done: &done, failed: &[] }, &completions, &tokens, &input).expect("a steady state")
    }

    #[test]
    fn a_closed_loop_is_steady_once_its_users_are_busy_and_until_they_run_out() {
        // 8 users, requests of 100 ms: 8 in flight until the last ones end.
        let s = closed_loop(8, 25, |_| 100);
        assert!(s.reached, "{s:?}");
        assert_eq!((s.level, s.start_s), (8, 0.0));
        assert!((s.end_s - 2.5).abs() < 1e-9, "{s:?}");
        assert!((s.held - 1.0).abs() < 1e-9);
        assert_eq!(s.requests, 200);
        assert!((s.request_throughput - 80.0).abs() < 1e-6, "{s:?}");
        // 8 requests at a time, each a token a ms.
        assert!((s.output_throughput - 8000.0).abs() < 1.0, "{s:?}");
        assert!((s.mean_ttft_ms - 10.0).abs() < 1e-9);
        assert_eq!((s.ttft_drift_pct, s.throughput_drift_pct), (None, None));
        assert!(s.words().ends_with("8 or more in flight, stationary"), "{}", s.words());
    }

    #[test]
    fn latency_that_climbs_through_the_window_is_drift() {
        // Each request 1% slower than the one before it.
        let s = closed_loop(8, 25, |i| 100 + i as i64);
        assert!(s.reached);
        let d = s.ttft_drift_pct.expect("a TTFT trend");
        assert!(d > 50.0, "{d}");
        assert!(s.drifts());
        assert!(s.words().contains("drifting: mean TTFT +"), "{}", s.words());
    }

    #[test]
    fn a_lone_peak_is_not_a_steady_state() {
        // One request at a time, and once three together.
        let mut sends: Vec<i64> = (0..40).map(|i| i * 100 * MS).collect();
        let mut completions: Vec<i64> = sends.iter().map(|s| s + 50 * MS).collect();
        sends.extend([2000 * MS + 10, 2000 * MS + 20]);
        completions.extend([2000 * MS + 30 * MS, 2000 * MS + 40 * MS]);
        sends.sort_unstable();
        completions.sort_unstable();
        let done: Vec<Done> = sends
            .iter()
            .enumerate()
            .map(|(i, &s)| Done {
                seq: i as u64,
                sent_ns: s,
                ttft_ms: 5.0,
                tpot_ms: f32::NAN,
                latency_ms: 6.0,
                output_tokens: 1,
            })
            .collect();
        let s = steady_state(Sends { done: &done, failed: &[] }, &completions, &[], &[]).expect("computed");
        assert_eq!(s.level, 3);
        assert!(!s.reached, "{s:?}");
        assert!(s.words().starts_with("never reached: 3 or more in flight for"), "{}", s.words());
    }

    #[test]
    fn mann_kendall_finds_trends_and_not_noise() {
        assert_eq!(drift(&[1.0, 2.0, 3.0]), None, "too few points");
        let up: Vec<f64> = (0..10).map(|i| 100.0 + i as f64).collect();
        let d = drift(&up).expect("a trend");
        assert!((d - 9.0 / 104.5 * 100.0).abs() < 1e-9, "{d}");
        let flat = [100.0, 103.0, 98.0, 101.0, 99.0, 102.0, 100.5, 97.0, 101.5, 99.5];
        assert_eq!(drift(&flat), None);
        let down: Vec<f64> = up.iter().rev().copied().collect();
        assert!(drift(&down).is_some_and(|d| d < 0.0));
    }
}
