//! SLO search profiles: instead of a fixed load, a profile may ask for the
//! highest request rate (or concurrency) at which its SLOs hold, found by
//! bisection between two bounds, as vLLM's auto_tune and AIPerf's adaptive
//! search do. Every probed point is a job of its own (profile `NAME@r8`,
//! `NAME@c64`), judged on its stored summary; the planner (`plan::next`)
//! adds one round of probes per configuration whenever the run's jobs have
//! all ended, from the store alone, so a restarted controller goes on.
//!
//! A round: first both bounds at once; then, while the SLOs hold at the
//! lower bound and not at the upper one, the midpoint of the highest point
//! that held and the lowest that did not, for at most `steps` probes. A
//! point holds when every repeat there succeeded, was valid, met the
//! matrix's success rate and kept every SLO; the worst repeat decides.

use std::collections::{BTreeMap, HashMap};

use benchfleet_core::Summary;

use crate::model::{Group, Job, JobState, Profile};
use crate::slo::{Over, Probe, Search, number, show};

/// The profile of the job probing `point` of the search profile `base`:
/// its load set to the point, named `NAME@r8` or `NAME@c64` (no matrix
/// profile may hold an '@').
pub fn probe_profile(base: &Profile, search: &Search, point: f64) -> Profile {
    let mut p = base.clone();
    let tag = match search.over {
        Over::Rate => {
            p.rate = Some(point);
            "r"
        }
        Over::Concurrency => {
            p.max_concurrency = Some(point as u64);
            "c"
        }
    };
    p.name = format!("{}@{tag}{}", base.name, number(point));
    // The search is the matrix's; the probe holds only its point.
    p.search = None;
    p.probe = Some(Probe { search: base.name.clone(), point });
    p
}

/// How one probed point went.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    pub point: f64,
    pub held: bool,
    /// What was measured there, the worst repeat's: `P99 TTFT 152.3 ms,
    /// P99 TPOT 41.0 ms`.
    pub measured: String,
    /// Why the SLOs did not hold, when they did not: `P99 TTFT 312.4 ms >
    /// 200 ms`, `job failed: ...`, `INVALID: ...`.
    pub missed: Option<String>,
    /// Each latency SLO's statistic there, ms, the worst repeat's, in the
    /// order of `Search::slo`; empty when no repeat succeeded.
    pub values: Vec<f64>,
}

/// Judges a point from its jobs (its repeats); `None` while one has not
/// ended.
pub fn judge(search: &Search, point: f64, jobs: &[&Job], min_success_rate: f64) -> Option<Judged> {
    if jobs.is_empty() || jobs.iter().any(|j| !j.state.is_terminal()) {
        return None;
    }
    let mut missed: Vec<String> = Vec::new();
    let mut summaries: Vec<&Summary> = Vec::new();
    for j in jobs {
        match (&j.state, &j.summary) {
            (JobState::Succeeded, Some(s)) => summaries.push(s),
            (JobState::Succeeded, None) => missed.push(format!("repeat {}: no summary stored", j.repeat)),
            (state, _) => {
                let why = j.error.as_deref().unwrap_or("no reason given");
                missed.push(format!("repeat {} {}: {why}", j.repeat, state.as_str()));
            }
        }
    }
    for s in &summaries {
        if let Some(why) = &s.invalid {
            missed.push(format!("INVALID: {why}"));
        }
        if s.success_rate() < min_success_rate {
            missed.push(format!("success rate {:.1}% < {:.1}%", s.success_rate() * 100.0, min_success_rate * 100.0));
        }
    }
    // The worst repeat's value of each bound.
    let mut measured: Vec<String> = Vec::new();
    let mut values: Vec<f64> = Vec::new();
    if !summaries.is_empty() {
        for b in &search.slo {
            let worst = summaries.iter().map(|s| b.value(s)).fold(f64::MIN, f64::max);
            values.push(worst);
            measured.push(format!("{} {worst:.1} ms", b.label()));
            if worst > b.ms {
                missed.push(format!("{} {worst:.1} ms > {} ms", b.label(), number(b.ms)));
            }
        }
        if let Some(share) = search.goodput {
            let worst = summaries
                .iter()
                .map(|s| match &s.goodput {
                    Some(g) if s.successful + s.failed > 0 => g.good as f64 / (s.successful + s.failed) as f64,
                    _ => 0.0,
                })
                .fold(f64::MAX, f64::min);
            measured.push(format!("goodput {:.1}% of requests", worst * 100.0));
            if worst < share {
                missed.push(format!("goodput {:.1}% < {}%", worst * 100.0, number(share * 100.0)));
            }
        }
    }
    missed.dedup();
    Some(Judged {
        point,
        held: missed.is_empty(),
        measured: measured.join(", "),
        missed: (!missed.is_empty()).then(|| missed.join("; ")),
        values,
    })
}

/// What a finished search found.
#[derive(Clone, Debug, PartialEq)]
pub struct Capacity {
    pub over: Over,
    /// The highest point where the SLOs held; `None` when they did not
    /// hold even at the lower bound.
    pub found: Option<f64>,
    /// The lowest point above it where they did not; `None` when they held
    /// at the upper bound.
    pub missed_at: Option<f64>,
    /// Why they did not hold at the lower bound, when nothing held: an SLO
    /// beyond its bound, or the jobs' own failure.
    pub why_none: Option<String>,
}

impl Capacity {
    /// The value a comparison ranks by: the load found, 0 for none.
    pub fn value(&self) -> f64 {
        self.found.unwrap_or(0.0)
    }

    /// `12.5 req/s` (`at least 32 req/s (the upper bound)`, `none`).
    pub fn shown(&self) -> String {
        match (self.found, self.missed_at) {
            (None, _) => "none".to_owned(),
            (Some(f), None) => format!("at least {} (the upper bound)", show(self.over, f)),
            (Some(f), Some(_)) => show(self.over, f),
        }
    }

    /// The bracket the true capacity lies in: `12.5-14.2 req/s`.
    pub fn bracket(&self) -> String {
        match (self.found, self.missed_at) {
            (Some(f), Some(m)) => format!("{}-{} {}", number(f), number(m), self.over.unit()),
            (Some(f), None) => format!("at least {}", show(self.over, f)),
            (None, Some(m)) => format!("below {}", show(self.over, m)),
            (None, None) => "none".to_owned(),
        }
    }
}

/// Where a search stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// The points to probe next.
    Probe(Vec<f64>),
    /// A probed point has not been judged yet.
    Waiting,
    Done(Capacity),
}

/// The next step of a search from its judged points.
pub fn step(search: &Search, judged: &[Option<Judged>]) -> Step {
    if judged.is_empty() {
        return Step::Probe(vec![search.lo, search.hi]);
    }
    let Some(judged): Option<Vec<&Judged>> = judged.iter().map(Option::as_ref).collect() else {
        return Step::Waiting;
    };
    let at = |x: f64| judged.iter().find(|j| j.point == x);
    let (Some(lo), Some(hi)) = (at(search.lo), at(search.hi)) else {
        // A bound was never probed (a search stored by another build):
        // probe what is missing.
        let missing = [search.lo, search.hi].into_iter().filter(|x| at(*x).is_none()).collect();
        return Step::Probe(missing);
    };
    if !lo.held {
        return Step::Done(Capacity {
            over: search.over,
            found: None,
            missed_at: Some(search.lo),
            why_none: lo.missed.clone(),
        });
    }
    if hi.held {
        return Step::Done(Capacity { over: search.over, found: Some(search.hi), missed_at: None, why_none: None });
    }
    // The lowest point that missed, and the highest below it that held.
    let missed_at = judged.iter().filter(|j| !j.held).map(|j| j.point).fold(f64::MAX, f64::min);
    let found = judged.iter().filter(|j| j.held && j.point < missed_at).map(|j| j.point).fold(search.lo, f64::max);
    let done =
        Step::Done(Capacity { over: search.over, found: Some(found), missed_at: Some(missed_at), why_none: None });
    let probed_between = judged.len().saturating_sub(2);
    if probed_between >= search.steps as usize {
        return done;
    }
    match midpoint(search.over, found, missed_at) {
        Some(mid) if at(mid).is_none() => Step::Probe(vec![mid]),
        _ => done,
    }
}

/// A point strictly between two, or `None` when there is none worth a job:
/// concurrencies are whole, rates have three significant digits.
pub fn midpoint(over: Over, a: f64, b: f64) -> Option<f64> {
    let mid = match over {
        Over::Concurrency => ((a + b) / 2.0).floor(),
        Over::Rate => {
            let m = (a + b) / 2.0;
            let scale = 10f64.powi(2 - m.abs().log10().floor() as i32);
            // Halves round up, as written: 11.65 is 11.7, not the 11.6
            // its binary value would round to.
            (m * scale * (1.0 + 1e-12)).round() / scale
        }
    };
    (mid > a && mid < b).then_some(mid)
}

/// Each configuration's jobs, with its first group, in the order the
/// configurations were planned (a greedy run measures one again in a group
/// of a later stage).
pub fn jobs_by_config<'a>(groups: &'a [Group], jobs: &'a [Job]) -> Vec<(&'a Group, Vec<&'a Job>)> {
    let mut out: Vec<(&Group, Vec<&Job>)> = Vec::new();
    let mut at_name: HashMap<&str, usize> = HashMap::new();
    let mut at_group: HashMap<u64, usize> = HashMap::new();
    for g in groups {
        let i = match at_name.get(g.config.name.as_str()) {
            Some(&i) => i,
            None => {
                out.push((g, Vec::new()));
                at_name.insert(&g.config.name, out.len() - 1);
                out.len() - 1
            }
        };
        at_group.insert(g.id, i);
    }
    for j in jobs {
        if let Some(&i) = at_group.get(&j.group) {
            out[i].1.push(j);
        }
    }
    out
}

/// A configuration's jobs of one search, by the point they probe, in
/// order of the points.
pub fn probes_of<'a>(search: &str, jobs: impl IntoIterator<Item = &'a Job>) -> Vec<(f64, Vec<&'a Job>)> {
    let mut by_point: BTreeMap<u64, (f64, Vec<&Job>)> = BTreeMap::new();
    for j in jobs {
        if let Some(p) = j.profile.probe.as_ref().filter(|p| p.search == search) {
            by_point.entry(p.point.to_bits()).or_insert((p.point, Vec::new())).1.push(j);
        }
    }
    let mut points: Vec<(f64, Vec<&Job>)> = by_point.into_values().collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// A search's points judged, in order of the points, and where it stands.
pub fn state(search: &Search, probes: &[(f64, Vec<&Job>)], min_success_rate: f64) -> (Vec<Option<Judged>>, Step) {
    let judged: Vec<Option<Judged>> =
        probes.iter().map(|(point, jobs)| judge(search, *point, jobs, min_success_rate)).collect();
    let step = step(search, &judged);
    (judged, step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dataset, RunId};
    use crate::slo::{Bound, Metric, Stat};

    fn search(over: Over, lo: f64, hi: f64, steps: u32) -> Search {
        Search {
            over,
            lo,
            hi,
            steps,
            slo: vec![Bound { metric: Metric::Ttft, stat: Stat::P99, ms: 200.0 }],
            goodput: None,
        }
    }

    /// Runs a search against an engine whose P99 TTFT is `ttft(load)`,
    /// each round's probes judged as the planner would judge their jobs;
    /// the points probed, round by round, and the capacity.
    fn run(s: &Search, ttft: impl Fn(f64) -> f64) -> (Vec<Vec<f64>>, Capacity) {
        let base = Profile::new("cap", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 10);
        let mut jobs: Vec<Job> = Vec::new();
        let mut rounds = Vec::new();
        loop {
            let probes = probes_of("cap", &jobs);
            match state(s, &probes, 1.0).1 {
                Step::Probe(points) => {
                    for &point in &points {
                        let mut j = Job::new(RunId(1), jobs.len() as u64, 0, probe_profile(&base, s, point), 1);
                        j.state = JobState::Succeeded;
                        let mut summary = Summary { successful: 10, ..Summary::default() };
                        summary.ttft_ms.p99 = ttft(point);
                        j.summary = Some(summary);
                        jobs.push(j);
                    }
                    rounds.push(points);
                }
                Step::Waiting => panic!("every probe was judged"),
                Step::Done(c) => return (rounds, c),
            }
            assert!(rounds.len() < 50, "the search ends");
        }
    }

    #[test]
    fn bisection_finds_the_highest_rate_within_the_slo() {
        // TTFT crosses 200 ms at 10.5 req/s.
        let (rounds, c) = run(&search(Over::Rate, 1.0, 32.0, 5), |r| 20.0 * r - 10.0);
        assert_eq!(rounds, vec![vec![1.0, 32.0], vec![16.5], vec![8.75], vec![12.6], vec![10.7], vec![9.73]]);
        assert_eq!(c, Capacity { over: Over::Rate, found: Some(9.73), missed_at: Some(10.7), why_none: None });
        assert_eq!(c.shown(), "9.73 req/s");
        assert_eq!(c.bracket(), "9.73-10.7 req/s");
    }

    #[test]
    fn concurrency_is_whole_and_stops_at_adjacent_caps() {
        let (rounds, c) = run(&search(Over::Concurrency, 1.0, 64.0, 20), |n| if n <= 37.0 { 100.0 } else { 300.0 });
        assert_eq!(c, Capacity { over: Over::Concurrency, found: Some(37.0), missed_at: Some(38.0), why_none: None });
        assert!(rounds.iter().flatten().all(|p| p.fract() == 0.0), "{rounds:?}");
        assert_eq!(rounds.len(), 1 + 6, "log2(64) bisections after the bounds: {rounds:?}");
    }

    #[test]
    fn the_bounds_decide_alone_when_they_both_hold_or_both_miss() {
        let (rounds, c) = run(&search(Over::Rate, 1.0, 32.0, 5), |_| 50.0);
        assert_eq!(rounds, vec![vec![1.0, 32.0]]);
        assert_eq!(c.shown(), "at least 32 req/s (the upper bound)");
        let (rounds, c) = run(&search(Over::Rate, 1.0, 32.0, 5), |_| 500.0);
        assert_eq!(rounds, vec![vec![1.0, 32.0]]);
        assert_eq!((c.found, c.shown()), (None, "none".to_owned()));
        assert_eq!(c.why_none.as_deref(), Some("P99 TTFT 500.0 ms > 200 ms"));
    }

    #[test]
    fn no_steps_is_the_bounds_only() {
        let (rounds, c) = run(&search(Over::Rate, 2.0, 8.0, 0), |r| r * 30.0);
        assert_eq!(rounds, vec![vec![2.0, 8.0]]);
        assert_eq!(c.bracket(), "2-8 req/s");
    }

    fn job(state: JobState, summary: Option<Summary>, repeat: u32) -> Job {
        let base = Profile::new("cap", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 10);
        let mut j = Job::new(RunId(1), u64::from(repeat), 0, base, repeat);
        j.state = state;
        j.summary = summary;
        j.error = (state == JobState::Failed).then(|| "engine exited with code 1".to_owned());
        j
    }

    #[test]
    fn a_point_holds_only_when_every_repeat_does() {
        let s = search(Over::Rate, 1.0, 8.0, 3);
        let ok = |p99: f64| {
            let mut s = Summary { successful: 100, ..Summary::default() };
            s.ttft_ms.p99 = p99;
            s
        };
        let (a, b) = (job(JobState::Succeeded, Some(ok(150.0)), 1), job(JobState::Succeeded, Some(ok(250.0)), 2));
        let j = judge(&s, 4.0, &[&a, &b], 1.0).expect("judged");
        assert!(!j.held);
        assert_eq!(j.measured, "P99 TTFT 250.0 ms");
        assert_eq!(j.missed.as_deref(), Some("P99 TTFT 250.0 ms > 200 ms"));

        let failed = job(JobState::Failed, None, 2);
        let j = judge(&s, 4.0, &[&a, &failed], 1.0).expect("judged");
        assert_eq!(j.missed.as_deref(), Some("repeat 2 failed: engine exited with code 1"));

        let mut short = ok(100.0);
        short.failed = 5;
        short.invalid = Some("the client fell behind".to_owned());
        let c = job(JobState::Succeeded, Some(short), 1);
        let j = judge(&s, 4.0, &[&c], 0.99).expect("judged");
        assert_eq!(j.missed.as_deref(), Some("INVALID: the client fell behind; success rate 95.2% < 99.0%"));

        let running = job(JobState::Running, None, 2);
        assert_eq!(judge(&s, 4.0, &[&a, &running], 1.0), None, "not yet");
    }

    #[test]
    fn goodput_is_the_share_of_requests_within_the_profile_s_slos() {
        let mut s = search(Over::Rate, 1.0, 8.0, 3);
        s.slo.clear();
        s.goodput = Some(0.9);
        let with = |good: u64| {
            let goodput = benchfleet_core::metrics::Goodput { good, ..Default::default() };
            Summary { successful: 100, goodput: Some(goodput), ..Summary::default() }
        };
        let held = job(JobState::Succeeded, Some(with(95)), 1);
        assert!(judge(&s, 2.0, &[&held], 1.0).expect("judged").held);
        let missed = job(JobState::Succeeded, Some(with(80)), 1);
        let j = judge(&s, 2.0, &[&missed], 1.0).expect("judged");
        assert_eq!(j.missed.as_deref(), Some("goodput 80.0% < 90%"));
    }

    #[test]
    fn slo_keys_read_back_as_written() {
        for key in ["ttft_p99_ms", "tpot_mean_ms", "itl_p95_ms", "e2el_median_ms"] {
            assert_eq!(Bound::parse(key, 1.0).expect(key).key(), key);
        }
        assert_eq!(Bound::parse("ttft_p50_ms", 1.0).map(|b| b.key()).as_deref(), Some("ttft_median_ms"));
        for bad in ["ttft_p99", "ttft_p90_ms", "latency_p99_ms", "p99_ms"] {
            assert_eq!(Bound::parse(bad, 1.0), None, "{bad}");
        }
        let mut s = Summary::default();
        s.latency_s.p99 = 1.5;
        assert_eq!(Bound::parse("e2el_p99_ms", 0.0).expect("key").value(&s), 1500.0);
    }

    #[test]
    fn midpoints_are_strictly_inside() {
        assert_eq!(midpoint(Over::Rate, 1.0, 32.0), Some(16.5));
        assert_eq!(midpoint(Over::Rate, 0.1, 0.2), Some(0.15));
        assert_eq!(midpoint(Over::Rate, 9.99, 10.0), None);
        assert_eq!(midpoint(Over::Concurrency, 8.0, 9.0), None);
        assert_eq!(midpoint(Over::Concurrency, 8.0, 11.0), Some(9.0));
    }
}
