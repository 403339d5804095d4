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

/// One successful request, as the steady state needs it (20 bytes: a run
/// of a million requests holds 24 MB of them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Done {
    pub sent_ns: i64,
    /// NaN when the request has none.
    pub ttft_ms: f32,
    pub tpot_ms: f32,
    pub input_tokens: u32,
}

impl Done {
    fn ttft(&self) -> Option<f64> {
        (!self.ttft_ms.is_nan()).then_some(f64::from(self.ttft_ms))
    }

    fn tpot(&self) -> Option<f64> {
        (!self.tpot_ms.is_nan()).then_some(f64::from(self.tpot_ms))
    }
}

/// The steady state of a run from its measured requests' sends and
/// completions, its successful requests (in send order), and its output
/// tokens by arrival bin (`tokens[i]` millionths of a token arrived in
/// `[i, i + 1) * BIN_NS`); `None` for a run of fewer than two requests.
pub(super) fn steady_state(sends: &[i64], completions: &[i64], done: &[Done], tokens: &[u64]) -> Option<SteadyState> {
    if sends.len() < 2 {
        return None;
    }
    let mut events: Vec<(i64, i32)> =
        sends.iter().map(|&t| (t, 1)).chain(completions.iter().map(|&t| (t, -1))).collect();
    // A completion before a send at one instant, as the peak counts them.
    events.sort_unstable();
    let mut now = 0i64;
    let mut peak = 0i64;
    for &(_, d) in &events {
        now += i64::from(d);
        peak = peak.max(now);
    }
    let level = ((peak as f64) * 0.9).ceil().max(1.0) as i64;
    // The first instant at the level, the last one it falls below it, and
    // the time at or above it between.
    let (mut start, mut end, mut held_ns, mut above_since) = (None, None, 0i64, None::<i64>);
    now = 0;
    for &(t, d) in &events {
        let before = now >= level;
        now += i64::from(d);
        let after = now >= level;
        if after && !before {
            start.get_or_insert(t);
            above_since = Some(t);
        } else if before && !after {
            end = Some(t);
            if let Some(s) = above_since.take() {
                held_ns += t - s;
            }
        }
    }
    let start = start?;
    let end = end.unwrap_or_else(|| events.last().map_or(start, |e| e.0));
    let first = sends.iter().min().copied().unwrap_or(0);
    let span_ns = (end - start).max(1);
    let span_s = span_ns as f64 / 1e9;
    let inside = |t: i64| t >= start && t < end;
    let sent: Vec<&Done> = done.iter().filter(|d| inside(d.sent_ns)).collect();
    let requests = sent.len() as u64;
    let bin = |t: i64| usize::try_from(t.max(0) / BIN_NS).unwrap_or(0);
    let tokens_between = |a: i64, b: i64| -> f64 {
        tokens.get(bin(a)..bin(b).min(tokens.len())).unwrap_or(&[]).iter().sum::<u64>() as f64 / 1e6
    };
    let output = tokens_between(start, end);
    let input: f64 = sent.iter().map(|d| f64::from(d.input_tokens)).sum();
    let mut ttft: Vec<f64> = sent.iter().filter_map(|d| d.ttft()).collect();
    let tpot: Vec<f64> = sent.iter().filter_map(|d| d.tpot()).collect();
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    ttft.sort_by(f64::total_cmp);
    let p99 = if ttft.is_empty() {
        0.0
    } else {
        let rank = 0.99 * (ttft.len() - 1) as f64;
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        ttft[lo] + (ttft[hi] - ttft[lo]) * (rank - lo as f64)
    };
    // Ten equal spans: each one's mean TTFT (by send) and output tokens
    // per second (by arrival).
    let edges: Vec<i64> = (0..=BATCHES).map(|i| start + span_ns * i as i64 / BATCHES as i64).collect();
    let mut ttft_means = Vec::with_capacity(BATCHES);
    let mut throughputs = Vec::with_capacity(BATCHES);
    for w in edges.windows(2) {
        let batch: Vec<f64> =
            done.iter().filter(|d| d.sent_ns >= w[0] && d.sent_ns < w[1]).filter_map(Done::ttft).collect();
        if !batch.is_empty() {
            ttft_means.push(mean(&batch));
        }
        let secs = (w[1] - w[0]) as f64 / 1e9;
        if secs > 0.0 {
            throughputs.push(tokens_between(w[0], w[1]) / secs);
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
        mean_ttft_ms: mean(&ttft),
        p99_ttft_ms: p99,
        mean_tpot_ms: mean(&tpot),
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
        let mut tokens: Vec<u64> = Vec::new();
        for u in 0..users {
            let mut t = 0i64;
            for k in 0..per_user {
                let i = k * users + u;
                let l = latency(i) * MS;
                sends.push(t);
                completions.push(t + l);
                done.push(Done { sent_ns: t, ttft_ms: (l / MS / 10) as f32, tpot_ms: 1.0, input_tokens: 100 });
                for ms in 0..l / MS {
                    let b = ((t + ms * MS) / BIN_NS) as usize;
                    if tokens.len() <= b {
                        tokens.resize(b + 1, 0);
                    }
                    tokens[b] += 1_000_000;
                }
                t += l;
            }
        }
        steady_state(&sends, &completions, &done, &tokens).expect("a steady state")
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
        let done: Vec<Done> =
            sends.iter().map(|&s| Done { sent_ns: s, ttft_ms: 5.0, tpot_ms: f32::NAN, input_tokens: 1 }).collect();
        let s = steady_state(&sends, &completions, &done, &[]).expect("computed");
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
