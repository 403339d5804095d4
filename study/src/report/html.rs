//! The report as one self-contained HTML page: the conclusion, charts drawn
//! as inline SVG (no script, no stylesheet or font to fetch: it opens from
//! a file with no network), the comparison table and every block.
//!
//! Charts: the objective per configuration on each profile with its 95%
//! interval; throughput against latency across the profiles (one line per
//! configuration, in the order of the profiles' rates); the TTFT and ITL
//! distributions on the primary profile (percentiles of the pooled
//! samples; at each configuration's capacity when it searches); and for
//! each search, each latency SLO against the load probed, with the bound.

use std::fmt::Write as _;

use benchfleet_core::metrics::Percentile;
use benchfleet_core::telemetry::Series;
use benchfleet_core::{Summary, pool, render_block_with};

use super::doc::*;

const PALETTE: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 60.0;

pub fn render(doc: &ReportDoc) -> String {
    let mut out = String::new();
    let title = format!("{}: run {}", doc.run.name, doc.run.id);
    let _ = writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 2em; max-width: 1100px; }}\n\
         pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; }}\n\
         table {{ border-collapse: collapse; margin: 1em 0; }}\n\
         td, th {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }}\n\
         svg text {{ font-size: 11px; }}\n.invalid {{ color: #b00; font-weight: bold; }}\n</style>\n</head>\n<body>",
        esc(&title)
    );
    let _ = writeln!(out, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(
        out,
        "<p>{} (<code>{}</code>): {} of {} jobs succeeded, {} failed. Objective: {}. Written by {}.</p>",
        esc(&doc.run.state),
        esc(&doc.run.matrix_file),
        doc.run.jobs_succeeded,
        doc.run.jobs_total,
        doc.run.jobs_failed,
        esc(&doc.run.objective),
        esc(&doc.generated_by)
    );

    if let Some(f) = &doc.fleet {
        out.push_str(&fleet_section(f));
    }

    let _ = writeln!(out, "<h2>Conclusion</h2>");
    match &doc.recommendation {
        Some(r) => {
            let _ = writeln!(out, "<p>Recommended: <code>{}</code>, {}.</p>", esc(&r.config), esc(&r.why));
            let _ = writeln!(out, "<pre>{}</pre>", esc(&r.serve_command));
            if !r.simulator_flags.is_empty() {
                let said = super::words::simulator_flags_left_out(&r.simulator_flags, "");
                let _ = writeln!(out, "<p>{}</p>", esc(&said));
            }
            if let Some(base) = &r.baseline {
                let _ = writeln!(
                    out,
                    "<table><tr><th>Profile</th><th>Baseline ({})</th><th>Optimized ({})</th></tr>",
                    esc(base),
                    esc(&r.config)
                );
                for row in &r.table {
                    let _ = writeln!(
                        out,
                        "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                        esc(&row.profile),
                        esc(row.baseline.as_deref().unwrap_or("no result")),
                        esc(row.optimized.as_deref().unwrap_or("no result"))
                    );
                }
                let _ = writeln!(out, "</table>");
            }
        }
        None => {
            let why = super::words::no_capacity(doc)
                .unwrap_or_else(|| "No configuration met the acceptance on the primary profile".to_owned());
            let _ = writeln!(out, "<p>{}: nothing is recommended.</p>", esc(&why));
        }
    }

    let _ = writeln!(out, "<h2>Charts</h2>");
    // A search's probes are its table's rows, and the points of the
    // throughput-latency curve.
    for p in doc.profiles.iter().filter(|p| p.probe_of.is_none()) {
        out.push_str(&objective_chart(doc, &p.name));
    }
    out.push_str(&throughput_latency_chart(doc));
    for sweep in &doc.pareto {
        out.push_str(&pareto_chart(sweep));
    }
    let (primary, blocks) = primary_blocks(doc);
    out.push_str(&distribution_chart(&primary, &blocks, "TTFT", |b| &b.ttft_ms));
    out.push_str(&distribution_chart(&primary, &blocks, "ITL", |b| &b.itl_ms));
    for (c, b) in &blocks {
        out.push_str(&telemetry_chart(&c.name, b));
    }
    out.push_str(&clock_chart(&primary, &blocks));

    if !doc.comparisons.is_empty() {
        let _ = writeln!(out, "<h2>Against the baseline</h2>");
        let _ = writeln!(
            out,
            "<table><tr><th>Profile</th><th>Configuration</th><th>Value</th><th>Baseline</th><th>Conclusion</th></tr>"
        );
        for r in &doc.comparisons {
            let v = |x: Option<f64>| x.map_or("no result".to_owned(), |x| format!("{x:.2}"));
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{} {}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.profile),
                esc(&r.config),
                esc(&r.metric),
                v(r.value),
                v(r.baseline_value),
                esc(&r.said)
            );
        }
        let _ = writeln!(out, "</table>");
    }

    for s in &doc.searches {
        let _ = writeln!(out, "<h2>SLO search: {}</h2>", esc(&s.profile));
        let _ = writeln!(
            out,
            "<p>The highest {} from {} to {} {} at which {} held.</p>",
            esc(&s.over),
            s.lo,
            s.hi,
            esc(&s.unit),
            esc(&s.slo.join(", "))
        );
        let _ = writeln!(
            out,
            "<table><tr><th>Configuration</th><th>Capacity</th><th>Probe</th><th>SLOs</th><th>Measured</th>\
             <th>Why not</th></tr>"
        );
        for r in &s.results {
            for (i, p) in r.probes.iter().enumerate() {
                let (config, capacity) = if i == 0 { (r.config.as_str(), r.capacity.as_str()) } else { ("", "") };
                let held = p.verdict();
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{held}</td><td>{}</td><td>{}</td></tr>",
                    esc(config),
                    esc(capacity),
                    esc(&p.profile),
                    esc(&p.measured),
                    esc(p.missed.as_deref().unwrap_or(""))
                );
            }
        }
        let _ = writeln!(out, "</table>");
        for (i, bound) in s.bounds.iter().enumerate() {
            out.push_str(&search_chart(s, i, bound));
        }
    }

    let _ = writeln!(out, "<h2>Results</h2>");
    for c in &doc.configurations {
        let _ = writeln!(out, "<h3>{}</h3>\n<pre>{}</pre>", esc(&c.name), esc(&c.serve_command));
        for b in &c.blocks {
            let _ = writeln!(out, "<h4>Profile {}</h4>", esc(&b.profile));
            match (&b.pooled, &b.not_pooled) {
                (Some(s), _) => {
                    if let Some(why) = &s.invalid {
                        let _ = writeln!(out, "<p class=\"invalid\">INVALID: {}</p>", esc(why));
                    }
                    let _ = writeln!(out, "<pre>{}</pre>", esc(&render_block_with(s, &b.sections())));
                    turns(&mut out, s);
                }
                (None, Some(why)) => {
                    let _ = writeln!(out, "<p>The repeats cannot be pooled: {}.</p>", esc(why));
                }
                (None, None) => {
                    let _ = writeln!(out, "<p>No successful repeat.</p>");
                }
            }
            for r in b.repeats.iter().filter(|r| r.state == "succeeded") {
                for t in &r.provenance.throttled {
                    let _ = writeln!(out, "<p class=\"invalid\">Repeat {}: GPU held down: {}</p>", r.repeat, esc(t));
                }
                if let Some(said) = r.provenance.telemetry.as_ref().and_then(super::words::telemetry) {
                    let _ = writeln!(out, "<p>Repeat {} during the job: {}</p>", r.repeat, esc(&said));
                }
            }
            for r in b.repeats.iter().filter(|r| r.state != "succeeded") {
                let _ = writeln!(
                    out,
                    "<p>Repeat {} {}: {}</p>",
                    r.repeat,
                    esc(&r.state),
                    esc(r.error.as_deref().unwrap_or("no reason given"))
                );
            }
        }
    }
    let _ = writeln!(out, "</body>\n</html>");
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Round steps for an axis from 0 (or `lo`) to `hi`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| span / s <= 6.0).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

fn label(x: f64) -> String {
    if x.abs() >= 1000.0 || x == x.trunc() { format!("{x:.0}") } else { format!("{x:.2}") }
}

/// The frame of a chart: axes, ticks, labels; returns the SVG so far and
/// the two scales.
struct Frame {
    svg: String,
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn new(title: &str, x_label: &str, y_label: &str, x: (f64, f64), y: (f64, f64)) -> Frame {
        let mut svg = format!(
            "<figure><svg role=\"img\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\">\n\
             <title>{}</title>\n<text x=\"{LEFT}\" y=\"18\" font-weight=\"bold\">{}</text>\n",
            esc(title),
            esc(title)
        );
        let f = Frame { svg: String::new(), x, y };
        let (x0, y0, x1, y1) = (LEFT, HEIGHT - BOTTOM, WIDTH - RIGHT, TOP);
        let _ = writeln!(svg, "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#333\"/>");
        let _ = writeln!(svg, "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x0}\" y2=\"{y1}\" stroke=\"#333\"/>");
        for t in ticks(y.0, y.1) {
            let py = f.py(t);
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" y1=\"{py:.1}\" x2=\"{x1}\" y2=\"{py:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                x0 - 4.0,
                py + 4.0,
                label(t)
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
             <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            (x0 + x1) / 2.0,
            HEIGHT - 8.0,
            esc(x_label),
            (y0 + y1) / 2.0,
            esc(y_label)
        );
        Frame { svg, ..f }
    }

    fn px(&self, v: f64) -> f64 {
        let span = (self.x.1 - self.x.0).max(f64::MIN_POSITIVE);
        LEFT + (v - self.x.0) / span * (WIDTH - LEFT - RIGHT)
    }

    fn py(&self, v: f64) -> f64 {
        let span = (self.y.1 - self.y.0).max(f64::MIN_POSITIVE);
        HEIGHT - BOTTOM - (v - self.y.0) / span * (HEIGHT - TOP - BOTTOM)
    }

    fn x_ticks(&mut self) {
        for t in ticks(self.x.0, self.x.1) {
            let px = self.px(t);
            let _ = writeln!(
                self.svg,
                "<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                HEIGHT - BOTTOM + 16.0,
                label(t)
            );
        }
    }

    fn legend(&mut self, names: &[&str]) {
        for (i, n) in names.iter().enumerate() {
            let (x, y) = (WIDTH - RIGHT - 200.0, TOP + 14.0 * i as f64);
            let _ = writeln!(
                self.svg,
                "<rect x=\"{x}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                y - 9.0,
                PALETTE[i % PALETTE.len()],
                x + 14.0,
                y,
                esc(n)
            );
        }
    }

    fn end(mut self, caption: &str) -> String {
        let _ = writeln!(self.svg, "</svg><figcaption>{}</figcaption></figure>", esc(caption));
        self.svg
    }
}

/// A fleet check: per cohort, a strip chart of each profile's headline
/// metric (a dot per target at the median of its repeats, a whisker over
/// them, the cohort's median and its warn and fail bands, outliers named),
/// then its table.
fn fleet_section(f: &FleetInfo) -> String {
    let mut out = format!("<h2>Fleet check (per {})</h2>\n", esc(&f.per));
    for c in &f.cohorts {
        let _ = writeln!(out, "<h3>{}</h3>", esc(&c.described));
        if c.too_few {
            let _ = writeln!(out, "<p>Too few peers for verdicts ({} targets).</p>", c.rows.len());
        }
        let headline = c.centres.first().map(|m| m.metric.clone());
        for centre in c.centres.iter().filter(|m| Some(&m.metric) == headline.as_ref()) {
            out.push_str(&strip_chart(c, centre, &f.thresholds));
        }
        let _ = writeln!(
            out,
            "<table><tr><th>Target</th><th>{}</th><th>Deviation</th><th>z</th><th>Run-to-run spread</th>\
             <th>Verdict</th><th>Evidence</th></tr>",
            esc(headline.as_deref().unwrap_or("Value"))
        );
        for r in &c.rows {
            let cells = r.metrics.first().map_or_else(
                || "<td>-</td><td>-</td><td>-</td><td>-</td>".to_owned(),
                |j| {
                    format!(
                        "<td>{:.2}</td><td>{:+.1}%</td><td>{}</td><td>{:.1}%</td>",
                        j.value,
                        j.deviation_pct,
                        j.z.map_or_else(|| "-".to_owned(), |z| format!("{z:+.1}")),
                        j.spread_pct
                    )
                },
            );
            let said: Vec<&str> = r.drift.iter().chain(&r.evidence).chain(&r.failures).map(String::as_str).collect();
            let class = if r.verdict > Some(crate::fleet::Verdict::Ok) { " class=\"invalid\"" } else { "" };
            let _ = writeln!(
                out,
                "<tr><td>{}</td>{cells}<td{class}>{}</td><td>{}</td></tr>",
                esc(&r.target),
                esc(&r.word()),
                esc(&said.join("; "))
            );
        }
        let _ = writeln!(out, "</table>");
    }
    if !f.skipped.is_empty() {
        let _ = writeln!(out, "<p>Left out:</p><ul>");
        for s in &f.skipped {
            let _ = writeln!(out, "<li>{}: {}</li>", esc(&s.host), esc(&s.reason));
        }
        let _ = writeln!(out, "</ul>");
    }
    out
}

fn strip_chart(c: &crate::fleet::CohortResult, centre: &crate::fleet::Centre, t: &crate::fleet::Thresholds) -> String {
    let points: Vec<(&str, &crate::fleet::Judged, bool)> = c
        .rows
        .iter()
        .filter_map(|r| {
            let j = r.metrics.iter().find(|j| j.metric == centre.metric && j.profile == centre.profile)?;
            Some((r.target.as_str(), j, r.verdict == Some(crate::fleet::Verdict::Outlier)))
        })
        .collect();
    if points.is_empty() || centre.median <= 0.0 {
        return String::new();
    }
    let band = |pct: f64| centre.median * pct / 100.0;
    let lo = points.iter().flat_map(|(_, j, _)| &j.repeats).fold(centre.median - band(t.fail_pct), |a, b| a.min(*b));
    let hi = points.iter().flat_map(|(_, j, _)| &j.repeats).fold(centre.median + band(t.fail_pct), |a, b| a.max(*b));
    let pad = (hi - lo) * 0.1;
    let title = format!("{} on {}", centre.metric, centre.profile);
    let mut f = Frame::new(&title, "target", &centre.metric, (0.0, points.len() as f64 + 1.0), (lo - pad, hi + pad));
    let (x0, x1) = (f.px(0.0), f.px(points.len() as f64 + 1.0));
    for (pct, fill) in [(t.fail_pct, "#fbe3e3"), (t.warn_pct, "#fff4d6")] {
        let (top, bottom) = (f.py(centre.median + band(pct)), f.py(centre.median - band(pct)));
        let _ = writeln!(
            f.svg,
            "<rect x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\"/>",
            x1 - x0,
            bottom - top
        );
    }
    let y = f.py(centre.median);
    let _ = writeln!(
        f.svg,
        "<line x1=\"{x0:.1}\" y1=\"{y:.1}\" x2=\"{x1:.1}\" y2=\"{y:.1}\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>"
    );
    for (i, (name, j, outlier)) in points.iter().enumerate() {
        let x = f.px(i as f64 + 1.0);
        let (rlo, rhi) = j.repeats.iter().fold((j.value, j.value), |(a, b), v| (a.min(*v), b.max(*v)));
        let color = if *outlier { "#d62728" } else { PALETTE[0] };
        let _ = writeln!(
            f.svg,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{color}\"/>\
             <circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"><title>{}: {:.2}</title></circle>",
            f.py(rlo),
            f.py(rhi),
            f.py(j.value),
            esc(name),
            j.value
        );
        if *outlier {
            let _ = writeln!(
                f.svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">{}</text>",
                x + 6.0,
                f.py(j.value) + 4.0,
                esc(name)
            );
        }
    }
    f.end(&format!(
        "Each target's median of its repeats (whisker: the repeats); dashed: the cohort's median; shaded: {}% and {}% from it.",
        t.warn_pct, t.fail_pct
    ))
}

/// A multi-turn run's figures by turn number, as a table.
fn turns(out: &mut String, s: &Summary) {
    let Some(sessions) = s.sessions.as_ref().filter(|x| !x.by_turn.is_empty()) else { return };
    let _ = writeln!(
        out,
        "<p>By turn: {} sessions, {:.2} turns a session.</p>\n<table><tr><th>Turn</th><th>Successful</th><th>Failed</th><th>Mean TTFT (ms)</th><th>Mean prompt tokens</th></tr>",
        sessions.sessions,
        sessions.turns_per_session()
    );
    for t in &sessions.by_turn {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td></tr>",
            t.label(),
            t.successful,
            t.failed,
            t.mean_ttft_ms,
            t.mean_prompt_tokens
        );
    }
    let _ = writeln!(out, "</table>");
}

/// The objective's metric name in a block's intervals and its value.
fn objective_of(doc: &ReportDoc) -> (&'static str, fn(&Summary) -> f64) {
    match doc.run.objective.as_str() {
        "mean_latency" => ("Mean E2E latency (ms)", |s| s.latency_s.mean * 1e3),
        "output_throughput" => ("Output token throughput (tok/s)", |s| s.output_throughput),
        _ => ("Total token throughput (tok/s)", |s| s.total_token_throughput),
    }
}

/// Bars of the objective per configuration on one profile, with the block's
/// 95% interval (over the repeats, or one repeat's own) as a whisker where
/// there is one.
fn objective_chart(doc: &ReportDoc, profile: &str) -> String {
    let (metric, value) = objective_of(doc);
    let axis = metric;
    let bars: Vec<(&str, f64, Option<f64>, bool)> = doc
        .configurations
        .iter()
        .filter_map(|c| {
            let b = c.block(profile)?;
            let s = b.pooled.as_ref()?;
            let half = b.intervals.iter().find(|i| i.metric == metric).and_then(|i| i.half_width);
            Some((c.name.as_str(), value(s), half, s.invalid.is_some()))
        })
        .collect();
    if bars.is_empty() {
        return String::new();
    }
    let top = bars.iter().map(|(_, v, h, _)| v + h.unwrap_or(0.0)).fold(0.0, f64::max) * 1.1;
    let mut f =
        Frame::new(&format!("{axis} on {profile}"), "configuration", axis, (0.0, bars.len() as f64), (0.0, top));
    let slot = (WIDTH - LEFT - RIGHT) / bars.len() as f64;
    for (i, (name, v, half, invalid)) in bars.iter().enumerate() {
        let x = LEFT + slot * i as f64 + slot * 0.15;
        let (y, base) = (f.py(*v), f.py(0.0));
        let fill = if *invalid { "#bbbbbb" } else { PALETTE[i % PALETTE.len()] };
        let _ = writeln!(
            f.svg,
            "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\">\
             <title>{}: {v:.2}{}</title></rect>",
            slot * 0.7,
            (base - y).max(0.0),
            esc(name),
            half.map_or(String::new(), |h| format!(" ± {h:.2}"))
        );
        if let Some(h) = half {
            let cx = x + slot * 0.35;
            let _ = writeln!(
                f.svg,
                "<line class=\"interval\" x1=\"{cx:.1}\" y1=\"{:.1}\" x2=\"{cx:.1}\" y2=\"{:.1}\" stroke=\"#000\"/>",
                f.py(v - h),
                f.py(v + h)
            );
        }
        let _ = writeln!(
            f.svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}{}</text>",
            x + slot * 0.35,
            HEIGHT - BOTTOM + 16.0,
            esc(name),
            if *invalid { " (INVALID)" } else { "" }
        );
    }
    f.end("Whiskers: 95% interval over the repeats, or one repeat's from its own requests. Grey: INVALID runs.")
}

/// Total token throughput against mean latency, one point per profile and
/// a line per configuration in the order of the profiles' offered rates.
fn throughput_latency_chart(doc: &ReportDoc) -> String {
    let mut order: Vec<&ProfileInfo> = doc.profiles.iter().collect();
    order.sort_by(|a, b| a.rate.unwrap_or(f64::INFINITY).total_cmp(&b.rate.unwrap_or(f64::INFINITY)));
    // (configuration, [(throughput, latency, profile)]).
    type Line<'a> = (&'a str, Vec<(f64, f64, &'a str)>);
    let lines: Vec<Line> = doc
        .configurations
        .iter()
        .map(|c| {
            let points = order
                .iter()
                .filter_map(|p| {
                    let b = c.block(&p.name)?;
                    let s = pool(&b.summaries().collect::<Vec<_>>(), None)?;
                    Some((s.total_token_throughput, s.latency_s.mean, p.name.as_str()))
                })
                .collect();
            (c.name.as_str(), points)
        })
        .filter(|(_, p): &(&str, Vec<_>)| !p.is_empty())
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let xmax = lines.iter().flat_map(|(_, p)| p).map(|p| p.0).fold(0.0, f64::max) * 1.1;
    let ymax = lines.iter().flat_map(|(_, p)| p).map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let mut f = Frame::new(
        "Throughput against latency across the profiles",
        "total token throughput (tok/s)",
        "mean E2E latency (s)",
        (0.0, xmax),
        (0.0, ymax),
    );
    f.x_ticks();
    for (i, (name, points)) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = points.iter().map(|(x, y, _)| format!("{:.1},{:.1}", f.px(*x), f.py(*y))).collect();
        let _ = writeln!(f.svg, "<polyline fill=\"none\" stroke=\"{color}\" points=\"{}\"/>", path.join(" "));
        for (x, y, profile) in points {
            let _ = writeln!(
                f.svg,
                "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\">\
                 <title>{} on {}: {x:.2} tok/s, {y:.3} s</title></circle>",
                f.px(*x),
                f.py(*y),
                esc(name),
                esc(profile)
            );
        }
    }
    let names: Vec<&str> = lines.iter().map(|(n, _)| *n).collect();
    f.legend(&names);
    f.end("One point per profile, joined in the order of the profiles' offered rates.")
}

/// A sweep's throughput per GPU against tokens per second per user, a line
/// per configuration; the Pareto set's points filled, the others hollow.
fn pareto_chart(sweep: &super::pareto::ParetoSweep) -> String {
    let points = || sweep.curves.iter().flat_map(|c| &c.points);
    let xmax = points().map(|p| p.per_user).fold(0.0, f64::max) * 1.1;
    let ymax = points().map(|p| p.per_gpu).fold(0.0, f64::max) * 1.1;
    let mut f = Frame::new(
        &format!("Pareto: {}", sweep.sweep),
        "output tokens per second per user (1000 / mean TPOT)",
        "output tok/s per GPU",
        (0.0, xmax),
        (0.0, ymax),
    );
    f.x_ticks();
    for (i, c) in sweep.curves.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let path: Vec<String> =
            c.points.iter().map(|p| format!("{:.1},{:.1}", f.px(p.per_user), f.py(p.per_gpu))).collect();
        let _ = writeln!(f.svg, "<polyline fill=\"none\" stroke=\"{color}\" points=\"{}\"/>", path.join(" "));
        for p in &c.points {
            let (fill, label) = if p.optimal { (color, ", Pareto-optimal") } else { ("#fff", "") };
            let _ = writeln!(
                f.svg,
                "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{color}\">\
                 <title>{} on {}: {:.2} tok/s per GPU, {:.2} tok/s per user{label}</title></circle>",
                f.px(p.per_user),
                f.py(p.per_gpu),
                esc(&c.configuration),
                esc(&p.profile),
                p.per_gpu,
                p.per_user
            );
        }
    }
    let names: Vec<&str> = sweep.curves.iter().map(|c| c.configuration.as_str()).collect();
    f.legend(&names);
    f.end("One point per sweep point, joined by tokens per second per user. Filled: the Pareto set across configurations.")
}

/// A distribution on one profile as its percentile curve (percentile on x,
/// the value on y), one line per configuration.
/// How far above its bound a search chart draws a statistic: the knee
/// stays readable when the upper bound's probe is far past it.
const SEARCH_CHART_CEILING: f64 = 3.0;

/// A search's latency SLO against the load probed: one line per
/// configuration through its probes, and the bound as a line of its own.
fn search_chart(s: &SearchInfo, i: usize, bound: &SloBound) -> String {
    let ceiling = bound.ms * SEARCH_CHART_CEILING;
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = s
        .results
        .iter()
        .map(|r| {
            let mut points: Vec<(f64, f64)> =
                r.probes.iter().filter_map(|p| p.values.get(i).map(|v| (p.point, v.min(ceiling)))).collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (r.config.clone(), points)
        })
        .collect();
    lines.push((format!("SLO: {} {} ms", bound.label, bound.ms), vec![(s.lo, bound.ms), (s.hi, bound.ms)]));
    line_chart(
        (&format!("{} against the load on {}", bound.label, s.profile), &s.unit, &format!("{} (ms)", bound.label)),
        Some(s.hi),
        "search",
        &lines,
        &format!(
            "Each probe's {} (the worst repeat's); the search keeps the highest load below the SLO line. Values \
             above {}x the bound are drawn at it.",
            bound.label, SEARCH_CHART_CEILING
        ),
    )
}

/// Each configuration's block on the primary profile, and the profile's
/// name for charts; when the primary profile searches, each one's block at
/// the load it found (`chat at capacity`).
fn primary_blocks(doc: &ReportDoc) -> (String, Vec<(&Configuration, &Block)>) {
    let primary = doc.run.primary_profile.as_str();
    let Some(search) = doc.searches.iter().find(|s| s.profile == primary) else {
        let blocks = doc.configurations.iter().filter_map(|c| c.block(primary).map(|b| (c, b))).collect();
        return (primary.to_owned(), blocks);
    };
    let blocks = doc
        .configurations
        .iter()
        .filter_map(|c| {
            let r = search.results.iter().find(|r| r.config == c.name)?;
            let probe = r.probes.iter().find(|p| Some(p.point) == r.found)?;
            c.block(&probe.profile).map(|b| (c, b))
        })
        .collect();
    (format!("{primary} at capacity"), blocks)
}

fn distribution_chart(
    profile: &str,
    blocks: &[(&Configuration, &Block)],
    name: &str,
    of: fn(&Block) -> &Vec<Percentile>,
) -> String {
    let lines: Vec<(String, Vec<(f64, f64)>)> =
        blocks.iter().map(|(c, b)| (c.name.clone(), of(b).iter().map(|p| (p.p, p.value)).collect())).collect();
    line_chart(
        (&format!("{name} distribution on {profile}"), "percentile", &format!("{name} (ms)")),
        Some(100.0),
        "distribution",
        &lines,
        &format!("The {name} of every request of the pooled repeats, by percentile."),
    )
}

/// Each configuration's GPUs' SM clocks during its first repeat on a
/// profile: a GPU held down shows as a line below the others.
fn clock_chart(profile: &str, blocks: &[(&Configuration, &Block)]) -> String {
    let lines: Vec<(String, Vec<(f64, f64)>)> = blocks
        .iter()
        .flat_map(|&(c, b)| {
            let several = b.telemetry.iter().filter(|s| s.name == "gpu_sm_clock_mhz").count() > 1;
            b.telemetry.iter().filter(|s| s.name == "gpu_sm_clock_mhz").map(move |s| {
                let name = if several { format!("{} {}", c.name, s.gpu) } else { c.name.clone() };
                (name, over_time(s, 1.0))
            })
        })
        .collect();
    line_chart(
        (&format!("GPU SM clock on {profile}"), "seconds into the job", "SM clock (MHz)"),
        None,
        "clock",
        &lines,
        "Read through NVML every 500 ms during each configuration's first repeat.",
    )
}

/// A block's engine over the job: its running and waiting requests (and
/// its KV cache use, as a share of 100), against seconds into the job.
fn telemetry_chart(config: &str, b: &Block) -> String {
    let wanted = [
        ("vllm:num_requests_running", "running requests", 1.0),
        ("sglang:num_running_reqs", "running requests", 1.0),
        ("vllm:num_requests_waiting", "waiting requests", 1.0),
        ("sglang:num_queue_reqs", "waiting requests", 1.0),
        ("vllm:kv_cache_usage_perc", "KV cache use (%)", 100.0),
        ("sglang:token_usage", "KV cache use (%)", 100.0),
    ];
    let lines: Vec<(String, Vec<(f64, f64)>)> = wanted
        .iter()
        .filter_map(|(name, label, scale)| {
            let s = b.telemetry.iter().find(|s| s.name == *name && s.gpu.is_empty())?;
            Some(((*label).to_owned(), over_time(s, *scale)))
        })
        .collect();
    line_chart(
        (&format!("{config} on {} during the job", b.profile), "seconds into the job", "requests, or %"),
        None,
        "telemetry",
        &lines,
        "The engine's /metrics, scraped each second during the first repeat.",
    )
}

/// A series as (seconds into the job, value x `scale`).
fn over_time(s: &Series, scale: f64) -> Vec<(f64, f64)> {
    s.points.iter().map(|&(ms, v)| (f64::from(ms) / 1e3, v * scale)).collect()
}

/// Named lines of (x, y) points, one polyline each (of `class`), labelled
/// (title, x axis, y axis); x runs from 0 to `x_max` or the largest x;
/// nothing when no line has a point.
fn line_chart(
    (title, x_label, y_label): (&str, &str, &str),
    x_max: Option<f64>,
    class: &str,
    lines: &[(String, Vec<(f64, f64)>)],
    caption: &str,
) -> String {
    let lines: Vec<&(String, Vec<(f64, f64)>)> = lines.iter().filter(|(_, p)| !p.is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let xmax = x_max.unwrap_or_else(|| lines.iter().flat_map(|(_, p)| p).map(|p| p.0).fold(0.0, f64::max).max(1.0));
    let ymax = lines.iter().flat_map(|(_, p)| p).map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let ymax = if ymax > 0.0 { ymax } else { 1.0 };
    let mut f = Frame::new(title, x_label, y_label, (0.0, xmax), (0.0, ymax));
    f.x_ticks();
    for (i, (name, points)) in lines.iter().enumerate() {
        let path: Vec<String> = points.iter().map(|(x, y)| format!("{:.1},{:.1}", f.px(*x), f.py(*y))).collect();
        let _ = writeln!(
            f.svg,
            "<polyline class=\"{class}\" fill=\"none\" stroke=\"{}\" points=\"{}\"><title>{}</title></polyline>",
            PALETTE[i % PALETTE.len()],
            path.join(" "),
            esc(name)
        );
    }
    let names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
    f.legend(&names);
    f.end(caption)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 9632.0), [0.0, 2000.0, 4000.0, 6000.0, 8000.0]);
        let t = ticks(0.0, 0.37);
        assert!(t.len() >= 3 && t.len() <= 7, "{t:?}");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
    }
}
