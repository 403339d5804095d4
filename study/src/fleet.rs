//! The fleet check: one engine configuration run on every host (or every
//! GPU), each host compared with its peers. Hosts are compared only within
//! their cohort (same GPU model and count, driver, engine image digest and
//! engine version); a cohort of fewer than `MIN_COHORT` gets no verdicts.
//!
//! For each profile and metric, a target's value is the median of its
//! repeats; the fleet's centre is the median of those medians and its
//! spread their MAD (median absolute deviation). A target is an `outlier`
//! when it is both `fail_pct` away from the centre and `z` robust z-scores
//! (0.6745 x (x - median) / MAD) out, so that a tight fleet does not flag
//! 0.5% and a loose one does not hide 10%; `warn` at `warn_pct` and the same
//! z; `unstable` when its own repeats of the headline metric differ by
//! more than `fail_pct` and `UNSTABLE_OVER_USUAL` times the cohort's usual
//! spread (its median cannot be judged against the fleet's). Pure: the report gathers
//! the samples from stored jobs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The fewest hosts a cohort needs for verdicts.
pub const MIN_COHORT: usize = 4;

/// A target is unstable when its repeats of the headline metric (the
/// objective) spread more than `fail_pct` and more than this many times its
/// cohort's median spread (a fleet that measures noisily makes no host
/// unstable). The other metrics' spreads are shown, not judged: a P99 over
/// a job's requests is noisier than any host.
pub const UNSTABLE_OVER_USUAL: f64 = 3.0;

/// Whether a check runs a job per host or per GPU (or disjoint GPU set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    #[default]
    Host,
    Gpu,
}

impl Per {
    pub fn parse(s: &str) -> Option<Per> {
        match s {
            "host" => Some(Per::Host),
            "gpu" => Some(Per::Gpu),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Per::Host => "host",
            Per::Gpu => "gpu",
        }
    }
}

/// The matrix's `fleet:` section: when a deviation is a warning or an
/// outlier, and how far a host may fall below its own last check.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub warn_pct: f64,
    pub fail_pct: f64,
    pub z: f64,
    pub drift_pct: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { warn_pct: 3.0, fail_pct: 7.0, z: 3.5, drift_pct: 5.0 }
    }
}

/// A fleet check as its matrix asks it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetSpec {
    pub per: Per,
    pub thresholds: Thresholds,
    /// Only these hosts (`fleet.hosts`, a `crate::hostlist` list, checked);
    /// `--hosts` given to `fleet check` stands in for it.
    #[serde(default)]
    pub hosts: Option<String>,
}

/// A host (or one GPU set of it) that was not run on, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub host: String,
    pub reason: String,
}

/// What makes hosts comparable: a host is judged only against hosts with
/// the same key.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CohortKey {
    pub gpu: String,
    pub gpus: usize,
    pub driver: String,
    pub image_digest: String,
    pub engine_version: String,
}

impl CohortKey {
    /// `NVIDIA H200 x1, driver 550.54.15, engine 0.11.0, image sha256:ab12…`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} x{}, driver {}", self.gpu, self.gpus, self.driver);
        if !self.engine_version.is_empty() {
            s.push_str(&format!(", engine {}", self.engine_version));
        }
        if !self.image_digest.is_empty() {
            let short: String = self.image_digest.chars().take(19).collect();
            s.push_str(&format!(", image {short}"));
        }
        s
    }
}

/// The metrics a check compares, each with the direction that is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricDef {
    pub name: &'static str,
    pub higher_is_better: bool,
}

/// A verdict, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Warn,
    Unstable,
    Outlier,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Unstable => "unstable",
            Verdict::Outlier => "outlier",
        }
    }
}

/// One target's measurements: each (profile, metric)'s value per repeat,
/// and the hardware evidence gathered from its jobs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetSample {
    /// `host` or `host GPU 2`.
    pub target: String,
    pub host: String,
    pub cohort: CohortKey,
    /// (profile, metric name) to each successful repeat's value.
    pub values: BTreeMap<(String, String), Vec<f64>>,
    /// The highest SM clock its GPUs reached during its jobs, MHz (a GPU
    /// held down by a power or heat cap never reaches its cohort's).
    pub sm_clock_mhz: Option<f64>,
    /// The PCIe link as the GPUs reported it: `gen5x16`.
    pub pcie: Option<String>,
    /// Its hottest GPU's peak temperature over its jobs, °C.
    pub temperature_c: Option<f64>,
    /// Its GPUs' mean power draw over its jobs, W a GPU.
    pub power_w: Option<f64>,
    /// The engine's preemptions (SGLang: retractions) a job, on average.
    pub preemptions: Option<f64>,
    /// The engine's peak KV cache usage over its jobs, 0 to 1.
    pub kv_cache_peak: Option<f64>,
    /// Throttle and hardware words from its jobs' provenance.
    pub evidence: Vec<String>,
    /// Repeats that failed, with the reason (INVALID ones too).
    pub failures: Vec<String>,
    /// Of those, the ones that say something of the host: the engine, the
    /// GPUs or the agent failed (an INVALID repeat is the load generator's
    /// miss of its schedule, no measurement either way).
    pub host_failures: usize,
    /// Its jobs.
    pub jobs: Vec<u64>,
}

/// One (profile, metric) of one target, judged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    pub profile: String,
    pub metric: String,
    /// The median of its repeats.
    pub value: f64,
    pub repeats: Vec<f64>,
    /// Against the cohort's median, percent (signed).
    pub deviation_pct: f64,
    /// Robust z-score; `None` when the cohort has no spread to measure it by.
    pub z: Option<f64>,
    /// Its own repeats' spread, (max - min) / median, percent.
    pub spread_pct: f64,
    pub verdict: Verdict,
    #[serde(default)]
    pub higher_is_better: bool,
}

/// A cohort's centre and spread on one (profile, metric).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Centre {
    pub profile: String,
    pub metric: String,
    pub median: f64,
    pub mad: f64,
}

/// One target's row.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetRow {
    pub target: String,
    pub host: String,
    /// `None` in a cohort too small to judge.
    pub verdict: Option<Verdict>,
    /// Every (profile, metric), the headline one first.
    pub metrics: Vec<Judged>,
    /// Hardware evidence, the likely cause first when one stands out.
    pub evidence: Vec<String>,
    pub failures: Vec<String>,
    /// How it fell below its own previous check, when by more than
    /// `drift_pct` (`drift`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    /// Its jobs (the CSV's rows name their target).
    #[serde(default)]
    pub jobs: Vec<u64>,
}

impl TargetRow {
    /// The word the console prints: `ok`, `warn`, `outlier`, `unstable`,
    /// `no verdict: too few peers`, `failed`.
    pub fn word(&self) -> String {
        match self.verdict {
            Some(v) => v.word().to_owned(),
            None if self.metrics.is_empty() => "failed".to_owned(),
            None => "no verdict: too few peers".to_owned(),
        }
    }
}

/// One cohort, its rows sorted by the headline metric's deviation, worst
/// first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CohortResult {
    pub key: CohortKey,
    pub described: String,
    pub too_few: bool,
    pub centres: Vec<Centre>,
    pub rows: Vec<TargetRow>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Judges every target against its cohort. `metrics` in order, the first
/// the headline (the objective); `primary` the profile the rows sort by.
pub fn judge(samples: &[TargetSample], metrics: &[MetricDef], primary: &str, t: &Thresholds) -> Vec<CohortResult> {
    let mut cohorts: BTreeMap<&CohortKey, Vec<&TargetSample>> = BTreeMap::new();
    for s in samples {
        cohorts.entry(&s.cohort).or_default().push(s);
    }
    cohorts.into_iter().map(|(key, members)| judge_cohort(key, &members, metrics, primary, t)).collect()
}

fn judge_cohort(
    key: &CohortKey,
    members: &[&TargetSample],
    metrics: &[MetricDef],
    primary: &str,
    t: &Thresholds,
) -> CohortResult {
    let judged_members: Vec<&&TargetSample> = members.iter().filter(|s| !s.values.is_empty()).collect();
    let too_few = judged_members.len() < MIN_COHORT;
    // Every (profile, metric) some member measured, headline first.
    let mut keys: Vec<(String, String)> = Vec::new();
    for s in members {
        for k in s.values.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    let rank = |k: &(String, String)| {
        let m = metrics.iter().position(|m| m.name == k.1).unwrap_or(usize::MAX);
        (k.0 != primary, m, k.0.clone())
    };
    keys.sort_by_key(rank);
    let mut centres = Vec::new();
    for k in &keys {
        let mut medians: Vec<f64> =
            members.iter().filter_map(|s| s.values.get(k)).map(|v| median(&mut v.clone())).collect();
        if medians.is_empty() {
            continue;
        }
        let centre = median(&mut medians);
        let mut dev: Vec<f64> = medians.iter().map(|x| (x - centre).abs()).collect();
        centres.push(Centre { profile: k.0.clone(), metric: k.1.clone(), median: centre, mad: median(&mut dev) });
    }
    let usual: Vec<f64> = centres
        .iter()
        .map(|c| {
            let mut spreads: Vec<f64> = members
                .iter()
                .filter_map(|s| s.values.get(&(c.profile.clone(), c.metric.clone())))
                .map(|r| spread(r))
                .collect();
            median(&mut spreads)
        })
        .collect();
    let mut rows: Vec<TargetRow> = members
        .iter()
        .map(|s| {
            let metrics_judged: Vec<Judged> = centres
                .iter()
                .zip(&usual)
                .filter_map(|(c, usual)| {
                    let repeats = s.values.get(&(c.profile.clone(), c.metric.clone()))?;
                    let def = metrics.iter().find(|m| m.name == c.metric);
                    let headline = metrics.first().is_some_and(|m| m.name == c.metric);
                    Some(judge_one(c, repeats, (def.is_none_or(|d| d.higher_is_better), headline), t, *usual))
                })
                .collect();
            // A repeat that failed (its engine, its GPUs, its host gone) is
            // never ok, however good the others were.
            let floor = if s.host_failures == 0 { Verdict::Ok } else { Verdict::Warn };
            let verdict = (!too_few && !metrics_judged.is_empty())
                .then(|| metrics_judged.iter().map(|j| j.verdict).fold(floor, Verdict::max));
            TargetRow {
                target: s.target.clone(),
                host: s.host.clone(),
                verdict,
                metrics: metrics_judged,
                evidence: Vec::new(),
                failures: s.failures.clone(),
                drift: Vec::new(),
                jobs: s.jobs.clone(),
            }
        })
        .collect();
    for (row, s) in rows.iter_mut().zip(members) {
        row.evidence = evidence(s, members);
    }
    // Worst deviation (in the bad direction of the headline) first.
    let headline = |r: &TargetRow| r.metrics.first().map_or(f64::INFINITY, |j| j.deviation_pct.abs());
    rows.sort_by(|a, b| headline(b).total_cmp(&headline(a)).then_with(|| a.target.cmp(&b.target)));
    CohortResult { key: key.clone(), described: key.describe(), too_few, centres, rows }
}

fn judge_one(
    c: &Centre,
    repeats: &[f64],
    (higher_is_better, headline): (bool, bool),
    t: &Thresholds,
    usual_spread: f64,
) -> Judged {
    let value = median(&mut repeats.to_vec());
    let deviation_pct = if c.median != 0.0 { (value - c.median) / c.median * 100.0 } else { 0.0 };
    let z = (c.mad > 0.0).then(|| 0.6745 * (value - c.median) / c.mad);
    let spread_pct = spread(repeats);
    // Only a deviation in the worse direction counts against a target.
    let worse = if higher_is_better { -deviation_pct } else { deviation_pct };
    // With no spread in the cohort, any difference is many z out; and a
    // difference smaller than a host's repeats usually differ by, or than
    // its own repeats differ by, is noise.
    let far = z.is_none_or(|z| z.abs() >= t.z) && worse >= usual_spread.max(spread_pct);
    let verdict = if worse >= t.fail_pct && far {
        Verdict::Outlier
    } else if headline && spread_pct > t.fail_pct.max(UNSTABLE_OVER_USUAL * usual_spread) {
        Verdict::Unstable
    } else if worse >= t.warn_pct && far {
        Verdict::Warn
    } else {
        Verdict::Ok
    };
    Judged {
        profile: c.profile.clone(),
        metric: c.metric.clone(),
        value,
        repeats: repeats.to_vec(),
        deviation_pct,
        z,
        spread_pct,
        verdict,
        higher_is_better,
    }
}

/// An SM clock this far below its cohort's (a share) is evidence.
const CLOCK_NOTED: f64 = 0.03;

/// Repeats' spread: (max - min) / median, percent; 0 for one repeat.
fn spread(repeats: &[f64]) -> f64 {
    let value = median(&mut repeats.to_vec());
    let (lo, hi) = repeats.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
    if value != 0.0 && repeats.len() > 1 { (hi - lo) / value.abs() * 100.0 } else { 0.0 }
}

/// Flags every target whose headline metric (the objective, on any
/// profile) fell more than `drift_pct` below its own value in the previous
/// check (`before`, run `run`), beyond what its cohort moved (a new image or
/// driver moves every host: the cohort's change is said with each flag),
/// even inside the fleet's spread: a `warn` at least.
pub fn drift(now: &mut [CohortResult], before: &[CohortResult], run: u64, drift_pct: f64) {
    let earlier: BTreeMap<&str, &TargetRow> =
        before.iter().flat_map(|c| &c.rows).map(|r| (r.target.as_str(), r)).collect();
    for c in now.iter_mut() {
        let Some(headline) = c.centres.first().map(|m| m.metric.clone()) else { continue };
        let mut changes: Vec<Change> = Vec::new();
        for (row, r) in c.rows.iter().enumerate() {
            let Some(was) = earlier.get(r.target.as_str()) else { continue };
            for j in r.metrics.iter().filter(|j| j.metric == headline) {
                let then = was.metrics.iter().find(|w| w.metric == j.metric && w.profile == j.profile);
                if let Some(then) = then.filter(|w| w.value != 0.0) {
                    let pct = (j.value - then.value) / then.value * 100.0;
                    changes.push(Change {
                        profile: j.profile.clone(),
                        row,
                        pct,
                        now: j.value,
                        then: then.value,
                        higher: j.higher_is_better,
                    });
                }
            }
        }
        let mut profiles: Vec<&str> = changes.iter().map(|c| c.profile.as_str()).collect();
        profiles.sort_unstable();
        profiles.dedup();
        let mut flags: Vec<(usize, String)> = Vec::new();
        for profile in profiles {
            let of: Vec<&Change> = changes.iter().filter(|c| c.profile == profile).collect();
            let cohort = median(&mut of.iter().map(|c| c.pct).collect::<Vec<_>>());
            for ch in of {
                let worse = if ch.higher { cohort - ch.pct } else { ch.pct - cohort };
                if worse > drift_pct {
                    flags.push((
                        ch.row,
                        format!(
                            "drift: {headline} on {profile} {:.2}, {:+.1}% from {:.2} in its last check (run {run}; its \
                             cohort {cohort:+.1}%)",
                            ch.now, ch.pct, ch.then
                        ),
                    ));
                }
            }
        }
        for (row, said) in flags {
            let r = &mut c.rows[row];
            r.drift.push(said);
            r.verdict = r.verdict.map(|v| v.max(Verdict::Warn));
        }
    }
}

/// One target's headline metric on one profile, against its last check.
struct Change {
    profile: String,
    row: usize,
    pct: f64,
    now: f64,
    then: f64,
    higher: bool,
}

/// The target's hardware evidence against its cohort: a likely cause first
/// when one stands out.
fn evidence(s: &TargetSample, cohort: &[&TargetSample]) -> Vec<String> {
    // What the GPUs said of themselves (a throttle and its reason) first.
    let mut out = s.evidence.clone();
    let mut clocks: Vec<f64> = cohort.iter().filter_map(|m| m.sm_clock_mhz).collect();
    if let Some(own) = s.sm_clock_mhz
        && clocks.len() > 1
    {
        let centre = median(&mut clocks);
        if centre > 0.0 && (own - centre) / centre < -CLOCK_NOTED {
            out.push(format!(
                "peak SM clock {:.0} MHz, cohort {:.0} MHz ({:+.1}%)",
                own,
                centre,
                (own - centre) / centre * 100.0
            ));
        }
    }
    out.extend(against_cohort(s, cohort));
    let mut links: BTreeMap<&str, usize> = BTreeMap::new();
    for m in cohort {
        if let Some(p) = &m.pcie {
            *links.entry(p.as_str()).or_default() += 1;
        }
    }
    if let (Some(own), Some((usual, _))) = (&s.pcie, links.iter().max_by_key(|(_, n)| **n))
        && own != usual
    {
        out.push(format!("PCIe {}, cohort {}", pcie_words(own), pcie_words(usual)));
    }
    out
}

/// A GPU this much hotter than its cohort's median is noted, °C.
const HOTTER_NOTED_C: f64 = 10.0;
/// Mean power this far from the cohort's median is noted, a fraction.
const POWER_NOTED: f64 = 0.10;
/// KV cache usage this much above the cohort's is noted, 0 to 1.
const KV_NOTED: f64 = 0.15;

/// Temperature, power, and the engine's preemptions and KV cache against
/// the cohort's medians, where they stand out.
fn against_cohort(s: &TargetSample, cohort: &[&TargetSample]) -> Vec<String> {
    let centre = |get: fn(&TargetSample) -> Option<f64>| {
        let mut v: Vec<f64> = cohort.iter().filter_map(|m| get(m)).collect();
        (v.len() > 1).then(|| median(&mut v))
    };
    let mut out = Vec::new();
    if let (Some(own), Some(c)) = (s.temperature_c, centre(|m| m.temperature_c))
        && own - c >= HOTTER_NOTED_C
    {
        out.push(format!("peak temperature {own:.0} °C, cohort {c:.0} °C"));
    }
    if let (Some(own), Some(c)) = (s.power_w, centre(|m| m.power_w))
        && c > 0.0
        && ((own - c) / c).abs() >= POWER_NOTED
    {
        out.push(format!("mean power {own:.0} W a GPU, cohort {c:.0} W ({:+.0}%)", (own - c) / c * 100.0));
    }
    if let (Some(own), Some(c)) = (s.preemptions, centre(|m| m.preemptions))
        && own >= 1.0
        && own > 2.0 * c + 1.0
    {
        out.push(format!("{own:.0} preemptions a job, cohort {c:.0} (the engine ran out of KV cache)"));
    }
    if let (Some(own), Some(c)) = (s.kv_cache_peak, centre(|m| m.kv_cache_peak))
        && own - c >= KV_NOTED
    {
        out.push(format!("KV cache peak {:.0}%, cohort {:.0}%", own * 100.0, c * 100.0));
    }
    out
}

/// `gen5x16` as `gen5 x16`.
fn pcie_words(link: &str) -> String {
    match link.split_once('x') {
        Some((gen_, width)) => format!("{gen_} x{width}"),
        None => link.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TPUT: MetricDef = MetricDef { name: "Output token throughput (tok/s)", higher_is_better: true };
    const TTFT: MetricDef = MetricDef { name: "Mean TTFT (ms)", higher_is_better: false };

    fn host(name: &str, tput: &[f64], ttft: &[f64]) -> TargetSample {
        let mut values = BTreeMap::new();
        values.insert(("p".to_owned(), TPUT.name.to_owned()), tput.to_vec());
        values.insert(("p".to_owned(), TTFT.name.to_owned()), ttft.to_vec());
        TargetSample {
            target: name.into(),
            host: name.into(),
            cohort: CohortKey { gpu: "NVIDIA H200".into(), gpus: 1, driver: "550".into(), ..CohortKey::default() },
            values,
            ..TargetSample::default()
        }
    }

    fn fleet(slow: Option<(usize, f64)>) -> Vec<TargetSample> {
        (0..8)
            .map(|i| {
                let noise = 1.0 + 0.004 * ((i as f64 * 1.7).sin());
                let f = match slow {
                    Some((n, f)) if n == i => f,
                    _ => 1.0,
                };
                let t = 1000.0 * noise * f;
                host(&format!("h{i}"), &[t, t * 1.002, t * 0.998], &[50.0 / f, 50.2 / f, 49.9 / f])
            })
            .collect()
    }

    fn row<'a>(c: &'a [CohortResult], name: &str) -> &'a TargetRow {
        c.iter().flat_map(|c| &c.rows).find(|r| r.target == name).expect("row")
    }

    #[test]
    fn a_slow_host_is_the_outlier_and_the_rest_are_ok() {
        let c = judge(&fleet(Some((3, 0.88))), &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].rows[0].target, "h3", "the worst first");
        assert_eq!(row(&c, "h3").verdict, Some(Verdict::Outlier));
        for i in [0, 1, 2, 4, 5, 6, 7] {
            assert_eq!(row(&c, &format!("h{i}")).verdict, Some(Verdict::Ok), "h{i}");
        }
        let j = &row(&c, "h3").metrics[0];
        assert!((j.deviation_pct + 12.0).abs() < 1.0, "{j:?}");
    }

    #[test]
    fn a_fleet_without_a_slow_host_has_no_warning() {
        let c = judge(&fleet(None), &[TPUT, TTFT], "p", &Thresholds::default());
        assert!(c[0].rows.iter().all(|r| r.verdict == Some(Verdict::Ok)), "{:?}", c[0].rows);
    }

    #[test]
    fn a_faster_host_is_not_flagged_and_a_latency_rise_is() {
        let mut f = fleet(None);
        f[1] = host("h1", &[1200.0; 3], &[50.0; 3]);
        f[2] = host("h2", &[1000.0; 3], &[60.0; 3]);
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(row(&c, "h1").verdict, Some(Verdict::Ok));
        assert_eq!(row(&c, "h2").verdict, Some(Verdict::Outlier));
    }

    #[test]
    fn a_host_with_a_failed_repeat_is_never_ok_and_one_with_none_has_failed() {
        let mut f = fleet(None);
        f[2].failures.push("p repeat 3: agent h2 is gone".into());
        f[2].host_failures = 1;
        f[3].failures.push("p repeat 2: INVALID: p99 dispatch lag 31 ms exceeds 25 ms".into());
        f[4].values.clear();
        f[4].failures.push("p repeat 1: engine exited".into());
        f[4].host_failures = 1;
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(row(&c, "h2").verdict, Some(Verdict::Warn), "its two good repeats are in line, but one failed");
        assert_eq!(row(&c, "h4").word(), "failed");
        assert_eq!(row(&c, "h1").verdict, Some(Verdict::Ok));
        assert_eq!(
            row(&c, "h3").verdict,
            Some(Verdict::Ok),
            "an INVALID repeat is no measurement, not the host's fault"
        );
    }

    #[test]
    fn repeats_that_disagree_are_unstable() {
        let mut f = fleet(None);
        f[5] = host("h5", &[1000.0, 1200.0, 1000.0], &[50.0; 3]);
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(row(&c, "h5").verdict, Some(Verdict::Unstable));
    }

    #[test]
    fn a_metric_every_host_measures_noisily_makes_none_unstable() {
        let f: Vec<TargetSample> =
            (0..6).map(|i| host(&format!("h{i}"), &[1000.0; 3], &[50.0, 55.0 + i as f64, 60.0])).collect();
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert!(c[0].rows.iter().all(|r| r.verdict == Some(Verdict::Ok)), "{:?}", c[0].rows);
    }

    #[test]
    fn a_host_that_fell_below_its_last_check_is_flagged_inside_the_fleet_spread() {
        let t = Thresholds { warn_pct: 10.0, fail_pct: 20.0, ..Thresholds::default() };
        let before = judge(&fleet(None), &[TPUT, TTFT], "p", &t);
        let mut now = judge(&fleet(Some((2, 0.92))), &[TPUT, TTFT], "p", &t);
        assert_eq!(row(&now, "h2").verdict, Some(Verdict::Ok), "inside the fleet's spread");
        drift(&mut now, &before, 7, t.drift_pct);
        let h2 = row(&now, "h2");
        assert_eq!(h2.verdict, Some(Verdict::Warn));
        assert!(h2.drift[0].contains("-8.0% from") && h2.drift[0].contains("(run 7;"), "{:?}", h2.drift);
        assert!(row(&now, "h1").drift.is_empty());
    }

    #[test]
    fn a_fleet_that_moved_together_flags_no_host_by_drift() {
        let before = judge(&fleet(None), &[TPUT, TTFT], "p", &Thresholds::default());
        let slower: Vec<TargetSample> = fleet(None)
            .into_iter()
            .map(|mut s| {
                s.values.values_mut().flatten().for_each(|v| *v *= 0.9);
                s
            })
            .collect();
        let mut now = judge(&slower, &[TPUT, TTFT], "p", &Thresholds::default());
        drift(&mut now, &before, 7, 5.0);
        assert!(now[0].rows.iter().all(|r| r.drift.is_empty() && r.verdict == Some(Verdict::Ok)), "{:?}", now[0].rows);
    }

    #[test]
    fn a_small_cohort_gets_no_verdict_and_another_driver_is_its_own_cohort() {
        let mut f = fleet(Some((0, 0.8)));
        f[7].cohort.driver = "560".into();
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(c.len(), 2);
        let lone = c.iter().find(|c| c.key.driver == "560").expect("its own cohort");
        assert!(lone.too_few);
        assert_eq!(lone.rows[0].verdict, None);
        assert_eq!(lone.rows[0].word(), "no verdict: too few peers");
        assert_eq!(row(&c, "h0").verdict, Some(Verdict::Outlier));
    }

    #[test]
    fn a_difference_within_what_repeats_usually_differ_by_is_noise() {
        // Every host's TTFT repeats spread about 8%: a host 5% off is not
        // told apart from the others, however tight their medians.
        let f: Vec<TargetSample> = (0..7)
            .map(|i| {
                let m = if i == 3 { 52.5 } else { 50.0 + 0.01 * i as f64 };
                host(&format!("h{i}"), &[1000.0; 3], &[m * 0.96, m, m * 1.04])
            })
            .collect();
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(row(&c, "h3").verdict, Some(Verdict::Ok), "{:?}", row(&c, "h3"));
    }

    #[test]
    fn a_tight_fleet_does_not_flag_half_a_percent() {
        let f: Vec<TargetSample> = (0..6)
            .map(|i| {
                let t = if i == 2 { 995.0 } else { 1000.0 + i as f64 * 0.01 };
                host(&format!("h{i}"), &[t; 3], &[50.0; 3])
            })
            .collect();
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(row(&c, "h2").verdict, Some(Verdict::Ok));
    }

    #[test]
    fn evidence_names_a_low_clock_and_a_narrow_link() {
        let mut f = fleet(Some((4, 0.88)));
        for (i, s) in f.iter_mut().enumerate() {
            s.sm_clock_mhz = Some(if i == 4 { 1742.0 } else { 1980.0 });
            s.pcie = Some(if i == 4 { "gen4x8".into() } else { "gen5x16".into() });
        }
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        let e = &row(&c, "h4").evidence;
        assert!(e[0].starts_with("peak SM clock 1742 MHz, cohort 1980 MHz"), "{e:?}");
        assert_eq!(e[1], "PCIe gen4 x8, cohort gen5 x16");
        f[4].evidence = vec!["SM clock 1,742 of 1,980 MHz for 80% of the job: power cap".into()];
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert!(row(&c, "h4").evidence[0].ends_with("power cap"), "the GPU's own word first");
        assert!(row(&c, "h1").evidence.is_empty());
    }

    #[test]
    fn evidence_names_heat_power_preemptions_and_kv_cache_that_stand_out() {
        let mut f = fleet(Some((4, 0.88)));
        for (i, s) in f.iter_mut().enumerate() {
            let odd = i == 4;
            s.temperature_c = Some(if odd { 84.0 } else { 66.0 + i as f64 });
            s.power_w = Some(if odd { 520.0 } else { 640.0 });
            s.preemptions = Some(if odd { 12.0 } else { 0.0 });
            s.kv_cache_peak = Some(if odd { 0.99 } else { 0.62 });
        }
        let c = judge(&f, &[TPUT, TTFT], "p", &Thresholds::default());
        assert_eq!(
            row(&c, "h4").evidence,
            [
                "peak temperature 84 °C, cohort 70 °C",
                "mean power 520 W a GPU, cohort 640 W (-19%)",
                "12 preemptions a job, cohort 0 (the engine ran out of KV cache)",
                "KV cache peak 99%, cohort 62%",
            ]
        );
        assert!(row(&c, "h7").evidence.is_empty(), "73 °C is within 10 °C of the cohort: {:?}", row(&c, "h7").evidence);
    }
}
