//! Files a run leaves behind: every record as JSON lines or CSV, the summary
//! as JSON, and its latency metrics with every asked percentile as CSV. The JSON forms read back into the same types, so any metric can
//! be recomputed from them with `summarize_with`.

use std::io::{self, Write};

use crate::metrics::{Distribution, Summary};
use crate::record::RequestRecord;

/// One JSON object per record, one per line.
pub fn write_jsonl(out: &mut impl Write, records: &[RequestRecord]) -> io::Result<()> {
    for record in records {
        serde_json::to_writer(&mut *out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Reads records written by [`write_jsonl`]; `name` is for messages.
pub fn read_jsonl(text: &str, name: &str) -> Result<Vec<RequestRecord>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{name}:{}: not a request record: {e}", i + 1)))
        .collect()
}

/// The summary as pretty JSON.
pub fn summary_json(summary: &Summary) -> serde_json::Result<String> {
    serde_json::to_string_pretty(summary)
}

/// The CSV header of [`write_csv`].
pub const CSV_HEADER: &str = "seq,phase,outcome,http_status,scheduled_ms,sent_ms,connect_ms,ttft_ms,latency_ms,\
ttft_from_scheduled_ms,dispatch_lag_ms,prompt_tokens,output_tokens,chunks,error";

/// One row per record, times in ms; the chunk arrivals stay in the JSONL.
pub fn write_csv(out: &mut impl Write, records: &[RequestRecord]) -> io::Result<()> {
    writeln!(out, "{CSV_HEADER}")?;
    let ms = |ns: i64| ns as f64 / 1e6;
    let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.3}"));
    for r in records {
        writeln!(
            out,
            "{},{},{},{},{:.3},{:.3},{},{},{:.3},{},{:.3},{},{},{},{}",
            r.seq,
            phase_name(r),
            r.outcome.as_str(),
            r.http_status.map_or_else(String::new, |s| s.to_string()),
            ms(r.scheduled_ns),
            ms(r.sent_ns),
            opt(r.connect_ns.map(ms)),
            opt(r.ttft_ns().map(ms)),
            ms(r.latency_ns()),
            opt(r.ttft_from_scheduled_ns().map(ms)),
            ms(r.dispatch_lag_ns()),
            r.prompt_tokens,
            r.output_tokens,
            r.chunks.len(),
            csv_field(r.error.as_deref().unwrap_or_default()),
        )?;
    }
    out.flush()
}

/// The summary's latency metrics, one row each: count, mean and every
/// percentile the run asked for (one column per percentile, named `p90`,
/// `p99.9`), values in the metric's unit (`_s` or `_ms`).
pub fn write_summary_csv(out: &mut impl Write, s: &Summary) -> io::Result<()> {
    let rows: [(&str, &Distribution); 4] =
        [("latency_s", &s.latency_s), ("ttft_ms", &s.ttft_ms), ("tpot_ms", &s.tpot_ms), ("itl_ms", &s.itl_ms)];
    let asked: Vec<f64> = if s.latency_s.percentiles.is_empty() {
        crate::metrics::DEFAULT_PERCENTILES.to_vec()
    } else {
        s.latency_s.percentiles.iter().map(|q| q.p).collect()
    };
    write!(out, "metric,count,mean")?;
    for p in &asked {
        write!(out, ",p{p}")?;
    }
    writeln!(out)?;
    for (name, d) in rows {
        write!(out, "{name},{},{:.6}", d.count, d.mean)?;
        for &p in &asked {
            match d.percentile(p) {
                Some(v) => write!(out, ",{v:.6}")?,
                None => write!(out, ",")?,
            }
        }
        writeln!(out)?;
    }
    out.flush()
}

fn phase_name(r: &RequestRecord) -> &'static str {
    match r.phase {
        crate::record::Phase::Measured => "measured",
        crate::record::Phase::Warmup => "warmup",
        crate::record::Phase::Cooldown => "cooldown",
    }
}

/// Quotes a field when it needs it (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_csv_has_a_column_per_asked_percentile() {
        let options = crate::metrics::SummaryOptions {
            percentiles: vec![50.0, 90.0, 99.9],
            ..crate::metrics::SummaryOptions::new(None)
        };
        let s = crate::metrics::summarize_with(&[], options);
        let mut out = Vec::new();
        write_summary_csv(&mut out, &s).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "metric,count,mean,p50,p90,p99.9");
        assert_eq!(lines[2], "ttft_ms,0,0.000000,0.000000,0.000000,0.000000");
        assert_eq!(lines.len(), 5);
        // The JSON summary carries them too, and reads back the same.
        let json = summary_json(&s).expect("json");
        assert!(json.contains("\"p\": 99.9"), "{json}");
        assert_eq!(serde_json::from_str::<Summary>(&json).expect("read back"), s);
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("http 500: a, \"b\""), "\"http 500: a, \"\"b\"\"\"");
    }
}
