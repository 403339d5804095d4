//! The report as CSV: one row per configuration x profile x repeat, each
//! repeat's own numbers (RFC 4180 quoting), for spreadsheets and pipelines.
//! Columns are only ever added at the end of a row.

use benchfleet_core::Summary;
use benchfleet_core::telemetry::Energy;

use super::doc::ReportDoc;

type Column = (&'static str, fn(&Summary) -> String);

/// An energy column: its name and its figure.
type EnergyColumn = (&'static str, fn(&Energy) -> f64);

const NUMBERS: [Column; 27] = [
    ("successful", |s| s.successful.to_string()),
    ("failed", |s| s.failed.to_string()),
    ("duration_s", |s| f(s.duration_s)),
    ("total_input_tokens", |s| s.total_input_tokens.to_string()),
    ("total_output_tokens", |s| s.total_output_tokens.to_string()),
    ("request_throughput", |s| f(s.request_throughput)),
    ("output_throughput", |s| f(s.output_throughput)),
    ("peak_output_throughput", |s| s.peak_output_throughput.map_or(String::new(), f)),
    ("total_token_throughput", |s| f(s.total_token_throughput)),
    ("peak_concurrent", |s| s.peak_concurrent.to_string()),
    ("mean_latency_s", |s| f(s.latency_s.mean)),
    ("median_latency_s", |s| f(s.latency_s.median)),
    ("p99_latency_s", |s| f(s.latency_s.p99)),
    ("mean_ttft_ms", |s| f(s.ttft_ms.mean)),
    ("median_ttft_ms", |s| f(s.ttft_ms.median)),
    ("p99_ttft_ms", |s| f(s.ttft_ms.p99)),
    ("mean_tpot_ms", |s| f(s.tpot_ms.mean)),
    ("median_tpot_ms", |s| f(s.tpot_ms.median)),
    ("p99_tpot_ms", |s| f(s.tpot_ms.p99)),
    ("mean_itl_ms", |s| f(s.itl_ms.mean)),
    ("median_itl_ms", |s| f(s.itl_ms.median)),
    ("p99_itl_ms", |s| f(s.itl_ms.p99)),
    ("p99_dispatch_lag_ms", |s| f(s.dispatch_lag_ms.p99)),
    ("lag_limit_ms", |s| f(s.lag_limit_ms)),
    ("offered_rate", |s| s.offered_rate.map_or(String::new(), f)),
    ("achieved_rate", |s| f(s.achieved_rate)),
    ("invalid", |s| s.invalid.clone().unwrap_or_default()),
];

/// The repeat's GPU energy, after every other column (so that readers of
/// the earlier columns find each where it was); empty when not known.
const ENERGY: [EnergyColumn; 4] = [
    ("energy_j", |e| e.joules),
    ("mean_gpu_power_w", |e| e.mean_power_w),
    ("energy_per_output_token_mj", |e| e.mj_per_output_token),
    ("output_tokens_per_joule", |e| e.output_tokens_per_joule),
];

fn f(x: f64) -> String {
    format!("{x:.4}")
}

pub fn render(doc: &ReportDoc) -> String {
    let mut head: Vec<&str> = vec![
        "run",
        "configuration",
        "engine",
        "variants",
        "stage",
        "profile",
        "repeat",
        "job",
        "state",
        "host",
        "attempt",
        "started_unix_ms",
        "ended_unix_ms",
    ];
    head.extend(NUMBERS.iter().map(|(name, _)| *name));
    head.push("error");
    // A fleet check's rows say which target ran them and its verdict.
    let targets: std::collections::HashMap<u64, (&str, String)> = doc
        .fleet
        .iter()
        .flat_map(|f| &f.cohorts)
        .flat_map(|c| &c.rows)
        .flat_map(|r| r.jobs.iter().map(move |j| (*j, (r.target.as_str(), r.word()))))
        .collect();
    head.extend(ENERGY.iter().map(|(name, _)| *name));
    if doc.fleet.is_some() {
        head.extend(["target", "fleet_verdict"]);
    }
    let mut out = line(head.iter().map(|s| s.to_string()));
    for c in &doc.configurations {
        for b in &c.blocks {
            for r in &b.repeats {
                let p = &r.provenance;
                let mut row = vec![
                    doc.run.id.to_string(),
                    c.name.clone(),
                    c.engine.clone(),
                    c.variants.join("+"),
                    c.stage.to_string(),
                    b.profile.clone(),
                    r.repeat.to_string(),
                    r.job.to_string(),
                    r.state.clone(),
                    p.host.clone().unwrap_or_default(),
                    p.attempt.to_string(),
                    p.started_unix_ms.map_or(String::new(), |t| t.to_string()),
                    p.ended_unix_ms.map_or(String::new(), |t| t.to_string()),
                ];
                match &r.summary {
                    Some(s) => row.extend(NUMBERS.iter().map(|(_, value)| value(s))),
                    None => row.extend(NUMBERS.iter().map(|_| String::new())),
                }
                row.push(r.error.clone().unwrap_or_default());
                let energy = r.energy();
                row.extend(ENERGY.iter().map(|(_, value)| energy.as_ref().map_or(String::new(), |e| f(value(e)))));
                if doc.fleet.is_some() {
                    let (target, verdict) = targets.get(&r.job).cloned().unwrap_or_default();
                    row.extend([target.to_owned(), verdict]);
                }
                out.push_str(&line(row.into_iter()));
            }
        }
    }
    out
}

/// One record: fields quoted when they hold a comma, a quote or a line end.
fn line(fields: impl Iterator<Item = String>) -> String {
    let mut out = fields
        .map(|v| if v.contains([',', '"', '\n', '\r']) { format!("\"{}\"", v.replace('"', "\"\"")) } else { v })
        .collect::<Vec<_>>()
        .join(",");
    out.push_str("\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_when_they_must_be() {
        let l = line(["a".to_owned(), "b,c".to_owned(), "say \"hi\"".to_owned(), "x\ny".to_owned()].into_iter());
        assert_eq!(l, "a,\"b,c\",\"say \"\"hi\"\"\",\"x\ny\"\r\n");
    }
}
