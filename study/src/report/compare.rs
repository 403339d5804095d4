//! Two runs side by side (`benchfleet compare A B`): each configuration and
//! profile both ran, each headline number's change from A to B with Welch's
//! 95% interval over the repeats, and whether B regressed, as a CI gate.
//!
//! A gated metric regresses when B is worse than A by more than the
//! threshold and the interval of the difference excludes zero: Welch's over
//! the repeats when both have two or more; when both have one, the interval
//! their own requests give (each run's standard error by batch means,
//! `benchfleet_core::metrics::noise`, marked `(one run each)`; a mean
//! latency, TTFT or TPOT of two runs of the same requests by the batches'
//! paired differences); otherwise,
//! or for a figure without one (ITL, a run too short), there is no interval:
//! the threshold alone decides, and the table says so. A block that succeeded in A and
//! has no successful repeat in B fails the gate, as does an INVALID block
//! in B: neither can show that nothing regressed.
//!
//! A search profile compares the capacity each configuration's search
//! found (metric `capacity`): it regressed when B found less by more than
//! the threshold and B missed its SLOs at a load where A held them (the two
//! searches' brackets do not overlap). Its probes' blocks, at points each
//! search chose for itself, are not compared one by one.

use std::fmt::Write as _;

use benchfleet_core::Summary;
use benchfleet_core::stats::Difference;

use super::HEADLINE;
use super::doc::{Block, ReportDoc};

/// The metrics gated when none is named: A's objective, and the mean TTFT
/// and TPOT.
pub fn default_gate(a: &ReportDoc) -> Vec<String> {
    let objective = match a.run.objective.as_str() {
        "mean_latency" => "mean_latency_ms",
        "output_throughput" => "output_throughput",
        "capacity" => CAPACITY,
        _ => "total_token_throughput",
    };
    vec![objective.to_owned(), "mean_ttft_ms".to_owned(), "mean_tpot_ms".to_owned()]
}

/// The metric of a search profile: the load found within its SLOs.
pub const CAPACITY: &str = "capacity";

/// Checks `--metric` names.
pub fn check_metrics(names: &[String]) -> Result<(), String> {
    for n in names {
        if n != CAPACITY && !HEADLINE.iter().any(|h| h.key == n) {
            let known: Vec<&str> = HEADLINE.iter().map(|h| h.key).chain([CAPACITY]).collect();
            return Err(format!("unknown metric {n:?}: use one of {}", known.join(", ")));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Worse beyond the threshold (and the interval).
    Regression,
    Improvement,
    /// Within the threshold, or the interval holds zero.
    WithinNoise,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub config: String,
    pub profile: String,
    pub metric: &'static str,
    pub gated: bool,
    pub a: f64,
    pub b: f64,
    /// (b - a) / a.
    pub relative: f64,
    /// The 95% half-width, relative to a: Welch's over the repeats, or from
    /// each run's own requests (`one_run`); `None` without either.
    pub half_width: Option<f64>,
    /// The interval is from one run on each side, by its requests.
    pub one_run: bool,
    /// And from their batches' differences: both served the same requests.
    pub paired: bool,
    pub change: Change,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Blocks that fail the gate without a number: no successful repeat in
    /// B, or INVALID.
    pub failures: Vec<String>,
    /// What could not be compared and does not fail the gate.
    pub notes: Vec<String>,
}

impl Comparison {
    pub fn regressions(&self) -> usize {
        self.rows.iter().filter(|r| r.gated && r.change == Change::Regression).count()
    }

    /// Whether the gate holds.
    pub fn passed(&self) -> bool {
        self.regressions() == 0 && self.failures.is_empty()
    }
}

/// Compares B with A: every configuration and profile of A that B has too
/// (by their names), each headline number; `gate` names the metrics that
/// can fail it, `threshold` is a fraction.
pub fn compare(a: &ReportDoc, b: &ReportDoc, threshold: f64, gate: &[String]) -> Comparison {
    let mut out = Comparison::default();
    for ca in &a.configurations {
        let Some(cb) = b.configurations.iter().find(|c| c.name == ca.name) else {
            out.notes.push(format!("{} is not in run {}", ca.name, b.run.id));
            continue;
        };
        let probe = |block: &Block| a.profiles.iter().any(|p| p.name == block.profile && p.probe_of.is_some());
        for ba in ca.blocks.iter().filter(|b| !probe(b)) {
            let Some(bb) = cb.block(&ba.profile) else {
                out.notes.push(format!("{} on {} is not in run {}", ca.name, ba.profile, b.run.id));
                continue;
            };
            let what = format!("{} on {}", ca.name, ba.profile);
            let (ra, rb): (Vec<&Summary>, Vec<&Summary>) = (ba.summaries().collect(), bb.summaries().collect());
            if ra.is_empty() {
                out.notes.push(format!("{what}: no successful repeat in run {}", a.run.id));
                continue;
            }
            if rb.is_empty() {
                out.failures
                    .push(format!("{what}: no successful repeat in run {} (run {} had one)", b.run.id, a.run.id));
                continue;
            }
            if let Some(why) = invalid(bb) {
                out.failures.push(format!(
                    "{what}: run {} is INVALID ({why}); it cannot show there is no regression",
                    b.run.id
                ));
                continue;
            }
            if let Some(why) = invalid(ba) {
                out.notes.push(format!("{what}: run {} is INVALID ({why}); not compared", a.run.id));
                continue;
            }
            for h in &HEADLINE {
                let Judged { a: ma, b: mb, relative, half_width, one_run, paired, change } =
                    judge(h, &ra, &rb, threshold);
                let metric = h.key;
                out.rows.push(Row {
                    config: ca.name.clone(),
                    profile: ba.profile.clone(),
                    metric,
                    gated: gate.iter().any(|g| g == metric),
                    a: ma,
                    b: mb,
                    relative,
                    half_width,
                    one_run,
                    paired,
                    change,
                });
            }
        }
    }
    capacities(a, b, threshold, gate, &mut out);
    for cb in &b.configurations {
        if !a.configurations.iter().any(|c| c.name == cb.name) {
            out.notes.push(format!("{} is only in run {}", cb.name, b.run.id));
        }
    }
    out
}

/// One headline figure of B's repeats against A's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// The repeats' means.
    pub a: f64,
    pub b: f64,
    /// (b - a) / a.
    pub relative: f64,
    /// The 95% half-width relative to a, when there is an interval.
    pub half_width: Option<f64>,
    /// The interval is from one run on each side, by its requests.
    pub one_run: bool,
    /// And from their batches' differences: both served the same requests.
    pub paired: bool,
    pub change: Change,
}

/// Judges figure `h` of B's successful repeats (`rb`) against A's (`ra`,
/// neither empty): worse or better beyond `threshold` and beyond the
/// interval (Welch's over the repeats, or one run's own on each side),
/// else within noise.
pub fn judge(h: &super::Headline, ra: &[&Summary], rb: &[&Summary], threshold: f64) -> Judged {
    let (va, vb): (Vec<f64>, Vec<f64>) =
        (ra.iter().map(|s| (h.value)(s)).collect(), rb.iter().map(|s| (h.value)(s)).collect());
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (ma, mb) = (mean(&va), mean(&vb));
    let noise = |s: &[&Summary]| match s {
        [one] => one.noise.as_ref().and_then(|n| n.se(h.key)),
        _ => None,
    };
    // One run each of the same requests: a mean figure compared batch by batch.
    let paired = match (ra, rb) {
        ([a], [b]) => a.noise.as_ref().zip(b.noise.as_ref()).and_then(|(na, nb)| na.paired_se(nb, h.key)),
        _ => None,
    };
    let (d, one_run, paired) = match (paired, noise(ra), noise(rb)) {
        (Some(error), _, _) => (Difference::paired(mb - ma, error), true, true),
        (None, Some(ea), Some(eb)) => (Difference::of_errors(mb - ma, eb, ea), true, false),
        _ => (Difference::welch(&vb, &va), false, false),
    };
    let relative = if ma == 0.0 { 0.0 } else { (mb - ma) / ma.abs() };
    let gain = if h.higher_is_better { relative } else { -relative };
    let change = if gain.abs() <= threshold || d.contains_zero() == Some(true) {
        Change::WithinNoise
    } else if gain < 0.0 {
        Change::Regression
    } else {
        Change::Improvement
    };
    let half_width = d.half_width.filter(|_| ma != 0.0).map(|h| h / ma.abs());
    Judged { a: ma, b: mb, relative, half_width, one_run, paired, change }
}

/// Each search's capacity per configuration, B against A.
fn capacities(a: &ReportDoc, b: &ReportDoc, threshold: f64, gate: &[String], out: &mut Comparison) {
    for sa in &a.searches {
        let sb = b.searches.iter().find(|s| s.profile == sa.profile);
        for ra in &sa.results {
            let what = format!("{} on {}", ra.config, sa.profile);
            let Some(rb) = sb.and_then(|s| s.results.iter().find(|r| r.config == ra.config)) else {
                out.notes.push(format!("{what}: no search in run {}", b.run.id));
                continue;
            };
            if !ra.done {
                out.notes.push(format!("{what}: the search did not end in run {}", a.run.id));
                continue;
            }
            if !rb.done {
                out.failures.push(format!("{what}: the search did not end in run {}", b.run.id));
                continue;
            }
            let (fa, fb) = (ra.found.unwrap_or(0.0), rb.found.unwrap_or(0.0));
            let relative = if fa == 0.0 { 0.0 } else { (fb - fa) / fa };
            // Beyond the brackets: one held where the other missed.
            let dropped = ra.found.is_some_and(|f| rb.missed_at.is_some_and(|m| m <= f));
            let rose = rb.found.is_some_and(|f| ra.missed_at.is_some_and(|m| m <= f));
            let change = if relative.abs() <= threshold {
                Change::WithinNoise
            } else if relative < 0.0 && dropped {
                Change::Regression
            } else if relative > 0.0 && rose {
                Change::Improvement
            } else {
                Change::WithinNoise
            };
            out.rows.push(Row {
                config: ra.config.clone(),
                profile: sa.profile.clone(),
                metric: CAPACITY,
                gated: gate.iter().any(|g| g == CAPACITY),
                a: fa,
                b: fb,
                relative,
                half_width: None,
                one_run: false,
                paired: false,
                change,
            });
        }
    }
}

fn invalid(b: &Block) -> Option<&str> {
    b.pooled.as_ref().and_then(|s| s.invalid.as_deref())
}

/// The comparison as a table, the gated rows marked, then the failures and
/// notes and the verdict.
pub fn render(c: &Comparison, a: &ReportDoc, b: &ReportDoc, threshold: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run {} ({}) against run {} ({}); threshold {:.2}%, 95% intervals (Welch) over the repeats, or from \
         each run's own requests with one repeat each (paired: batch by batch, the same requests)\n",
        b.run.id,
        b.run.name,
        a.run.id,
        a.run.name,
        threshold * 100.0
    );
    let _ = writeln!(
        out,
        "{:<32} {:<16} {:<24} {:>14} {:>14} {:>20}  verdict",
        "configuration",
        "profile",
        "metric",
        format!("run {}", a.run.id),
        format!("run {}", b.run.id),
        "change"
    );
    for r in &c.rows {
        let change = match r.half_width {
            Some(h) if r.paired => format!("{:+.2}% ± {:.2}% (one run each, paired)", r.relative * 100.0, h * 100.0),
            Some(h) if r.one_run => format!("{:+.2}% ± {:.2}% (one run each)", r.relative * 100.0, h * 100.0),
            Some(h) => format!("{:+.2}% ± {:.2}%", r.relative * 100.0, h * 100.0),
            None => format!("{:+.2}% (no interval)", r.relative * 100.0),
        };
        let verdict = match r.change {
            Change::Regression if r.gated => "REGRESSION",
            Change::Regression => "worse (not gated)",
            Change::Improvement => "better",
            Change::WithinNoise => "within noise",
        };
        let _ = writeln!(
            out,
            "{:<32} {:<16} {:<24} {:>14.2} {:>14.2} {:>20}  {verdict}",
            r.config,
            r.profile,
            format!("{}{}", r.metric, if r.gated { " *" } else { "" }),
            r.a,
            r.b,
            change
        );
    }
    let _ = writeln!(out, "\n* gated metric");
    for f in &c.failures {
        let _ = writeln!(out, "FAILED: {f}");
    }
    for n in &c.notes {
        let _ = writeln!(out, "note: {n}");
    }
    if c.passed() {
        let _ = writeln!(out, "\nNo significant regression.");
    } else {
        let _ = writeln!(
            out,
            "\n{} significant regression(s), {} block(s) without a trustworthy result in run {}.",
            c.regressions(),
            c.failures.len(),
            b.run.id
        );
    }
    out
}

/// `5%`, `0.05` or `5` (percent when above 1).
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let v: f64 = num.parse().map_err(|_| format!("threshold {s:?} is not a number like 5% or 0.05"))?;
    let v = if pct || v > 1.0 { v / 100.0 } else { v };
    if !(0.0..1.0).contains(&v) || !v.is_finite() {
        return Err(format!("threshold {s:?} must be between 0% and 100%"));
    }
    Ok(v)
}
