//! Files a run leaves behind: every record as JSON lines or CSV, the summary
//! as JSON. The JSON forms read back into the same types, so any metric can
//! be recomputed from them with `summarize_with`.

use std::io::{self, Write};

use crate::metrics::Summary;
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
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("http 500: a, \"b\""), "\"http 500: a, \"\"b\"\"\"");
    }
}
