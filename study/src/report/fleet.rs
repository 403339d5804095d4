//! A fleet check's section of the report: each target's repeats gathered
//! from its stored jobs (the group pinned to it), its cohort from the GPUs'
//! fingerprints and the engine's provenance, its hardware evidence from
//! the job's telemetry, then judged by `crate::fleet`.

use std::collections::BTreeMap;

use benchfleet_core::Summary;

use super::doc::FleetInfo;
use crate::fleet::{self, CohortKey, MetricDef, TargetSample, Thresholds};
use crate::greedy::Objective;
use crate::model::{AttemptOutcome, FleetRun, Group, Job, JobState};

/// A latency (mean or P99) needs this many successful requests in a job to
/// be judged: below it, which requests happened to queue decides a mean by
/// several percent, and one request is the whole tail. The objective is
/// judged at any size.
pub const LATENCY_MIN_REQUESTS: u64 = 100;

/// The energy a job's GPUs used per output token, from their counters.
pub const ENERGY_METRIC: &str = "Energy per output token (mJ)";

/// Energy per token is judged only over load runs this long, ms: over a
/// shorter one, the idle moments between requests and when the counter
/// last ticked decide a share of it (simulated GPUs, whose power follows
/// their engine's load as sampled, spread 20-50% between a host's repeats
/// of 2-second jobs). Benchmarks on real hosts run for minutes.
pub const ENERGY_MIN_MS: u64 = 10_000;

/// A metric with its reading from a job's summary.
type Measured = (MetricDef, Reading);
type Reading = fn(&Summary) -> f64;

/// The metrics a fleet check compares: the objective first.
fn metrics(objective: Objective) -> Vec<Measured> {
    let (name, value) = super::objective_metric(objective);
    let mut out: Vec<Measured> =
        vec![(MetricDef { name, higher_is_better: objective != Objective::MeanLatency }, value)];
    let latencies: [(&'static str, Reading); 3] = [
        ("Mean TTFT (ms)", |s| s.ttft_ms.mean),
        ("P99 TTFT (ms)", |s| s.ttft_ms.p99),
        ("Mean TPOT (ms)", |s| s.tpot_ms.mean),
    ];
    for (name, value) in latencies {
        out.push((MetricDef { name, higher_is_better: false }, value));
    }
    out
}

/// The fleet section of a run planned as a fleet check.
pub(super) fn gather(
    fleet_run: &FleetRun,
    thresholds: Thresholds,
    (groups, jobs): (&[Group], &[Job]),
    objective: Objective,
    primary: &str,
) -> FleetInfo {
    let metrics = metrics(objective);
    let samples: Vec<TargetSample> = groups
        .iter()
        .filter_map(|g| {
            let pin = g.pin.as_ref()?;
            let of_group: Vec<&Job> = jobs.iter().filter(|j| j.group == g.id).collect();
            Some(sample(&pin.label, &pin.host, &of_group, &metrics))
        })
        .collect();
    let mut defs: Vec<MetricDef> = metrics.iter().map(|(d, _)| *d).collect();
    defs.push(MetricDef { name: ENERGY_METRIC, higher_is_better: false });
    FleetInfo {
        per: fleet_run.per.as_str().to_owned(),
        thresholds,
        cohorts: fleet::judge(&samples, &defs, primary, &thresholds),
        skipped: fleet_run.skipped.clone(),
    }
}

fn sample(target: &str, host: &str, jobs: &[&Job], metrics: &[Measured]) -> TargetSample {
    let mut s = TargetSample { target: target.to_owned(), host: host.to_owned(), ..TargetSample::default() };
    let mut clocks = Vec::new();
    let (mut temps, mut powers, mut preemptions, mut kv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for j in jobs {
        s.jobs.push(j.id);
        // An attempt that failed and was run again (its GPUs threw an XID,
        // its engine died) says as much of the host as a failed repeat.
        let last = j.attempts.len().saturating_sub(1);
        for a in j.attempts.iter().take(last).filter(|a| a.outcome == AttemptOutcome::Failed) {
            let why = a.reason.as_deref().unwrap_or("no reason given");
            s.failures.push(format!("{} repeat {} attempt {}: {why}", j.profile.name, j.repeat, a.number));
            s.host_failures += 1;
        }
        let summary = j.summary.as_ref().filter(|_| j.state == JobState::Succeeded);
        let Some(summary) = summary.filter(|s| s.invalid.is_none()) else {
            if j.state.is_terminal() {
                let why = match (&j.error, summary.and_then(|s| s.invalid.as_ref())) {
                    (_, Some(invalid)) => format!("INVALID: {invalid}"),
                    (Some(e), None) => e.clone(),
                    (None, None) => j.state.as_str().to_owned(),
                };
                if summary.and_then(|s| s.invalid.as_ref()).is_none() && j.state != JobState::Cancelled {
                    s.host_failures += 1;
                }
                s.failures.push(format!("{} repeat {}: {why}", j.profile.name, j.repeat));
            }
            continue;
        };
        if s.cohort == CohortKey::default() {
            s.cohort = cohort(j);
            s.pcie = fingerprint_value(j.gpu_fingerprint.first().map_or("", String::as_str), "pcie");
        }
        for (n, (def, value)) in metrics.iter().enumerate() {
            // The first is the objective.
            if n > 0 && summary.successful < LATENCY_MIN_REQUESTS {
                continue;
            }
            s.values.entry((j.profile.name.clone(), def.name.to_owned())).or_default().push(value(summary));
        }
        // Energy per output token, where every GPU of the job kept a
        // counter over a load run long enough to judge it by.
        let energy = j.telemetry.as_ref().filter(|t| t.energy_duration_ms >= Some(ENERGY_MIN_MS));
        if let Some(e) = energy.and_then(|t| t.energy(summary.total_output_tokens)) {
            s.values.entry((j.profile.name.clone(), ENERGY_METRIC.to_owned())).or_default().push(e.mj_per_output_token);
        }
        if let Some(t) = &j.telemetry {
            let of_gpus = |name: &'static str| t.series.iter().filter(move |x| x.name == name && x.count > 0);
            clocks.extend(of_gpus("gpu_sm_clock_mhz").map(|x| x.max));
            temps.extend(of_gpus("gpu_temperature_c").map(|x| x.max));
            powers.extend(of_gpus("gpu_power_w").map(|x| x.mean));
            let engine = |names: [&str; 2]| t.series.iter().find(|x| x.count > 0 && names.contains(&x.name.as_str()));
            if let Some(p) = engine(["vllm:num_preemptions_total", "sglang:num_retracted_requests_total"]) {
                preemptions.push((p.last - p.first).max(0.0));
            }
            kv.extend(engine(["vllm:kv_cache_usage_perc", "sglang:token_usage"]).map(|k| k.max));
            for flag in t.pcie_flags().into_iter().chain(t.hardware_notes.iter().cloned()) {
                if !s.evidence.contains(&flag) {
                    s.evidence.push(flag);
                }
            }
        }
        // One line per way a GPU was held down, however many jobs saw it.
        for flag in j.throttle_flags() {
            if !s.evidence.iter().any(|e| throttle_kind(e) == throttle_kind(&flag)) {
                s.evidence.push(flag);
            }
        }
    }
    // Its slowest GPU's peak, over its jobs.
    s.sm_clock_mhz = clocks.into_iter().reduce(f64::min);
    s.temperature_c = temps.into_iter().reduce(f64::max);
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    s.power_w = mean(&powers);
    s.preemptions = mean(&preemptions);
    s.kv_cache_peak = kv.into_iter().reduce(f64::max);
    s
}

/// A throttle flag without its share of the job: `SM clock 1,742 of 1,980
/// MHz for 74% of the job: power cap` is (`SM clock 1,742 of 1,980 MHz`,
/// `power cap`).
fn throttle_kind(flag: &str) -> (&str, &str) {
    let clock = flag.split(" for ").next().unwrap_or(flag);
    (clock, flag.rsplit(": ").next().unwrap_or_default())
}

/// What makes a target comparable with another: its GPUs (model, count,
/// driver) as fingerprinted before the job, the engine's version and image.
fn cohort(j: &Job) -> CohortKey {
    let first = j.gpu_fingerprint.first().map_or("", String::as_str);
    CohortKey {
        gpu: first.split(" uuid=").next().unwrap_or_default().to_owned(),
        gpus: j.gpu_fingerprint.len(),
        driver: fingerprint_value(first, "driver").unwrap_or_default(),
        image_digest: j.image_digest.clone().unwrap_or_default(),
        engine_version: j.engine_version.clone().unwrap_or_default(),
    }
}

/// A `key=value` of a GPU's fingerprint line.
fn fingerprint_value(line: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    line.split_whitespace().find_map(|w| w.strip_prefix(prefix.as_str())).map(str::to_owned)
}

/// How many targets had each verdict word, for a one-line summary.
pub fn tally(info: &FleetInfo) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in info.cohorts.iter().flat_map(|c| &c.rows) {
        *out.entry(r.word()).or_default() += 1;
    }
    out
}

/// Fleet checks over time: each target's headline numbers, one per check.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct History {
    /// The checks, oldest first: (run id, when it was created, its name).
    pub checks: Vec<(u64, i64, String)>,
    /// Each target's cells, in the checks' order (`None`: not in that check).
    pub targets: Vec<(String, Vec<Option<HistoryCell>>)>,
}

/// One target in one check: its headline metric's median and its verdict.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HistoryCell {
    pub metric: String,
    pub profile: String,
    pub value: f64,
    pub verdict: String,
}

/// The history of these fleet checks' reports (oldest first after
/// sorting by run), for the targets of `host` or all.
pub fn history(docs: &[super::doc::ReportDoc], host: Option<&str>) -> History {
    let mut docs: Vec<&super::doc::ReportDoc> = docs.iter().filter(|d| d.fleet.is_some()).collect();
    docs.sort_by_key(|d| d.run.id);
    let mut out = History::default();
    for (n, doc) in docs.iter().enumerate() {
        out.checks.push((doc.run.id, doc.run.created_unix_ms, doc.run.name.clone()));
        let rows = doc.fleet.iter().flat_map(|f| &f.cohorts).flat_map(|c| &c.rows);
        for r in rows.filter(|r| host.is_none_or(|h| r.host == h)) {
            let Some(j) = r.metrics.first() else { continue };
            let at = match out.targets.iter().position(|(t, _)| *t == r.target) {
                Some(at) => at,
                None => {
                    out.targets.push((r.target.clone(), vec![None; docs.len()]));
                    out.targets.len() - 1
                }
            };
            out.targets[at].1[n] = Some(HistoryCell {
                metric: j.metric.clone(),
                profile: j.profile.clone(),
                value: j.value,
                verdict: r.word(),
            });
        }
    }
    out.targets.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The history as a table: a row per target, a column per check.
pub fn render_history(h: &History) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if h.checks.is_empty() {
        out.push_str("no finished fleet check is stored\n");
        return out;
    }
    let what = h.targets.iter().flat_map(|(_, cells)| cells.iter().flatten()).next();
    if let Some(c) = what {
        let _ = writeln!(out, "{} on {}, the median of each check's repeats:", c.metric, c.profile);
    }
    let _ = write!(out, "{:<24}", "TARGET");
    for (run, at, _) in &h.checks {
        let _ = write!(out, " {:<24}", format!("run {run} {}", super::words::utc(*at)));
    }
    out.push('\n');
    for (target, cells) in &h.targets {
        let _ = write!(out, "{target:<24}");
        for cell in cells {
            let shown = cell.as_ref().map_or_else(|| "-".to_owned(), |c| format!("{:.2} {}", c.value, c.verdict));
            let _ = write!(out, " {shown:<24}");
        }
        out.push('\n');
    }
    out
}

/// `-12.0%, z -24.9, spread 0.4%` for one judged metric.
fn figures(j: &fleet::Judged) -> String {
    let z = j.z.map_or_else(|| "z -".to_owned(), |z| format!("z {z:+.1}"));
    format!("{:+.1}%, {z}, spread {:.1}%", j.deviation_pct, j.spread_pct)
}

/// The console's fleet section: per cohort, its centre, then one line per
/// target (name, verdict word, the headline value and figures, evidence);
/// the hosts left out; the tally.
pub fn console(out: &mut String, info: &FleetInfo) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "\n## Fleet check (per {})\n", info.per);
    for c in &info.cohorts {
        let n = c.rows.len();
        let few = if c.too_few {
            format!("; too few peers for verdicts (at least {})", fleet::MIN_COHORT)
        } else {
            String::new()
        };
        let _ = writeln!(out, "Cohort: {} ({n} target{}{few})", c.described, if n == 1 { "" } else { "s" });
        if let Some(centre) = c.centres.first() {
            let _ = writeln!(
                out,
                "  {} on {}: median {:.2}, MAD {:.2}",
                centre.metric, centre.profile, centre.median, centre.mad
            );
        }
        for r in &c.rows {
            let headline = r.metrics.first().map_or_else(String::new, |j| format!("{:.2} ({})", j.value, figures(j)));
            let mut line = format!("  {:<24} {:<10} {headline}", r.target, r.word());
            let flagged: Vec<String> = r
                .metrics
                .iter()
                .skip(1)
                .filter(|j| j.verdict > fleet::Verdict::Ok)
                .map(|j| format!("{} on {} {:.2} ({}): {}", j.metric, j.profile, j.value, figures(j), j.verdict.word()))
                .collect();
            // An ok target's evidence is in the JSON; the console names what
            // explains a verdict.
            let evidence = if r.verdict == Some(fleet::Verdict::Ok) { &[][..] } else { &r.evidence[..] };
            for said in r.drift.iter().chain(&flagged).chain(evidence).chain(&r.failures) {
                line.push_str("; ");
                line.push_str(said);
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out.push('\n');
    }
    for s in &info.skipped {
        let _ = writeln!(out, "  {:<24} skipped: {}", s.host, s.reason);
    }
    let tally: Vec<String> = tally(info).into_iter().map(|(w, n)| format!("{n} {w}")).collect();
    let _ = writeln!(
        out,
        "Verdicts: {}{}",
        tally.join(", "),
        if info.skipped.is_empty() { String::new() } else { format!("; {} skipped", info.skipped.len()) }
    );
}

/// The Markdown's fleet section: a table per cohort sorted by deviation.
pub fn markdown(out: &mut String, info: &FleetInfo) {
    use std::fmt::Write as _;
    let t = &info.thresholds;
    let _ = writeln!(out, "## Fleet check\n");
    let _ = writeln!(
        out,
        "One job per {} on every profile, each target judged against its cohort: an outlier is at least {}% from the \
         cohort's median in the worse direction and {} robust z-scores out; a warning at {}%; unstable when its own \
         repeats differ by more than {}%.\n",
        info.per, t.fail_pct, t.z, t.warn_pct, t.fail_pct
    );
    for c in &info.cohorts {
        let _ = writeln!(out, "### {}\n", c.described);
        if c.too_few {
            let _ = writeln!(out, "Too few peers for verdicts ({} of at least {}).\n", c.rows.len(), fleet::MIN_COHORT);
        }
        let metric = c.centres.first().map_or("Value", |m| m.metric.as_str());
        let _ = writeln!(out, "| Target | {metric} | Deviation | z | Run-to-run spread | Verdict | Evidence |");
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---|---|");
        for r in &c.rows {
            let (value, dev, z, spread) = match r.metrics.first() {
                Some(j) => (
                    format!("{:.2}", j.value),
                    format!("{:+.1}%", j.deviation_pct),
                    j.z.map_or_else(|| "-".to_owned(), |z| format!("{z:+.1}")),
                    format!("{:.1}%", j.spread_pct),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let evidence: Vec<&str> =
                r.drift.iter().chain(&r.evidence).chain(&r.failures).map(String::as_str).collect();
            let _ = writeln!(
                out,
                "| {} | {value} | {dev} | {z} | {spread} | {} | {} |",
                r.target,
                r.word(),
                evidence.join("; ")
            );
        }
        out.push('\n');
    }
    if !info.skipped.is_empty() {
        let _ = writeln!(out, "Left out:\n");
        for s in &info.skipped {
            let _ = writeln!(out, "- {}: {}", s.host, s.reason);
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dataset, Profile};

    #[test]
    fn a_fingerprint_gives_the_cohort_and_the_link() {
        let line = "NVIDIA H200 uuid=GPU-1 serial=? memory_mib=143771 driver=550.54.15 cuda=12.4 sm_max_mhz=1980 \
                    mem_max_mhz=3201 power_limit_w=700 pcie=gen5x16 ecc=on mig=off";
        let profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 1);
        let mut j = Job::new(crate::model::RunId(1), 0, 0, profile, 1);
        j.gpu_fingerprint = vec![line.to_owned(), line.replace("GPU-1", "GPU-2")];
        j.engine_version = Some("0.11.0".into());
        let c = cohort(&j);
        assert_eq!((c.gpu.as_str(), c.gpus, c.driver.as_str()), ("NVIDIA H200", 2, "550.54.15"));
        assert_eq!(fingerprint_value(line, "pcie").as_deref(), Some("gen5x16"));
    }

    #[test]
    fn a_target_s_sample_keeps_retried_failures_hardware_notes_and_engine_figures() {
        use benchfleet_core::telemetry::{GpuTelemetry, SeriesStats, TelemetrySummary};
        let profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 1);
        let mut j = Job::new(crate::model::RunId(1), 0, 0, profile, 2);
        j.state = JobState::Succeeded;
        let summary =
            Summary { successful: 10, output_throughput: 1000.0, total_output_tokens: 48_000, ..Summary::default() };
        j.summary = Some(summary);
        let attempt = |number, outcome, reason: &str| crate::model::AttemptInfo {
            price: None,
            number,
            epoch: 1,
            agent: crate::model::AgentId(1),
            agent_name: "h1".into(),
            started_unix_ms: 0,
            ended_unix_ms: Some(1),
            outcome,
            reason: Some(reason.into()),
            charged: false,
            log_tail: None,
        };
        j.attempts = vec![
            attempt(1, AttemptOutcome::Failed, "attempt invalidated: XID 79 on GPU GPU-1"),
            attempt(2, AttemptOutcome::Succeeded, ""),
        ];
        let stats = |name: &str, gpu: &str, (mean, max, first, last): (f64, f64, f64, f64)| SeriesStats {
            name: name.into(),
            gpu: gpu.into(),
            count: 10,
            min: 0.0,
            mean,
            max,
            first,
            last,
        };
        j.telemetry = Some(TelemetrySummary {
            series: vec![
                stats("gpu_temperature_c", "GPU-1", (70.0, 83.0, 60.0, 80.0)),
                stats("gpu_power_w", "GPU-1", (610.0, 690.0, 100.0, 600.0)),
                stats("vllm:num_preemptions_total", "", (3.0, 7.0, 2.0, 7.0)),
                stats("vllm:kv_cache_usage_perc", "", (0.5, 0.97, 0.0, 0.4)),
            ],
            gpus: vec![GpuTelemetry {
                gpu: "GPU-1".into(),
                pcie_gen_loaded: Some(4),
                pcie_width_loaded: Some(16),
                pcie_gen_max: Some(5),
                pcie_width_max: Some(16),
                ..GpuTelemetry::default()
            }],
            hardware_notes: vec!["GPU GPU-1: 1 row remapped for correctable errors during the job".into()],
            energy_j: Some(120.0),
            energy_duration_ms: Some(12_000),
            ..TelemetrySummary::default()
        });
        let s = sample("h1", "h1", &[&j], &metrics(Objective::OutputThroughput));
        assert_eq!(s.failures, ["p repeat 2 attempt 1: attempt invalidated: XID 79 on GPU GPU-1"]);
        assert_eq!(s.host_failures, 1);
        assert_eq!(
            s.evidence,
            [
                "PCIe gen4 x16 under load, its maximum gen5 x16",
                "GPU GPU-1: 1 row remapped for correctable errors during the job"
            ]
        );
        assert_eq!(
            (s.temperature_c, s.power_w, s.preemptions, s.kv_cache_peak),
            (Some(83.0), Some(610.0), Some(5.0), Some(0.97))
        );
        let energy = ("p".to_owned(), ENERGY_METRIC.to_owned());
        assert_eq!(s.values.get(&energy), Some(&vec![2.5]), "120 J over 48,000 tokens");
        // Over a 2-second load run, energy is shown in its block but not judged.
        j.telemetry.as_mut().expect("telemetry").energy_duration_ms = Some(2_000);
        let s = sample("h1", "h1", &[&j], &metrics(Objective::OutputThroughput));
        assert_eq!(s.values.get(&energy), None);
    }

    #[test]
    fn throttle_flags_of_one_kind_differ_only_in_their_share() {
        let a = "SM clock 1,742 of 1,980 MHz for 74% of the job: power cap";
        let b = "SM clock 1,742 of 1,980 MHz for 59% of the job: power cap";
        assert_eq!(throttle_kind(a), ("SM clock 1,742 of 1,980 MHz", "power cap"));
        assert_eq!(throttle_kind(a), throttle_kind(b));
        assert_ne!(throttle_kind(a), throttle_kind("SM clock 1,742 of 1,980 MHz for 74% of the job: heat"));
    }
}
