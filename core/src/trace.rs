//! Request traces: production traffic replayed as it arrived. One parser
//! for loadgen (which replays them) and the controller (which checks a
//! matrix's trace before any engine starts).
//!
//! A trace is JSON Lines, one request per line:
//!
//! - `mooncake`: Mooncake's published form, `{"timestamp": ms,
//!   "input_length": n, "output_length": m, "hash_ids": [..]}`. Each hash id
//!   names a block of [`BLOCK_TOKENS`] prompt tokens in order; two requests
//!   that share an id share that block, so a replay shows the engine's prefix
//!   cache the reuse production had. The ids of a request cover its input:
//!   at most `ceil(input_length / 512)` of them; tokens past the last id
//!   are the request's own.
//! - `jsonl`: the same fields, `hash_ids` optional, and `prompt` (the text
//!   itself) in place of `input_length` where the trace has the prompts.
//!
//! Timestamps are milliseconds from any origin; the replay starts at the
//! earliest. Lines need not be in time order: requests are sent in time
//! order, lines with one timestamp in file order. Blank lines are skipped;
//! fields other than these are ignored (traces carry their own). Any other
//! fault is an error naming the line.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Prompt tokens a hash id stands for (Mooncake's block).
pub const BLOCK_TOKENS: u32 = 512;

/// The longest input or output a trace line may ask for.
pub const MAX_LENGTH: u64 = 1 << 20;

/// The form of a trace's lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    #[default]
    Mooncake,
    Jsonl,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::Jsonl => "jsonl",
        }
    }

    pub fn from_name(name: &str) -> Option<TraceFormat> {
        match name {
            "mooncake" => Some(TraceFormat::Mooncake),
            "jsonl" => Some(TraceFormat::Jsonl),
            _ => None,
        }
    }
}

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// When it arrives, ms from the trace's origin.
    pub at_ms: f64,
    /// Its prompt's tokens (counted by the replay's tokenizer when the line
    /// gives the prompt itself).
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Its prompt's blocks, in order.
    pub hash_ids: Vec<u64>,
    /// The prompt itself, where the trace has it.
    pub prompt: Option<String>,
    /// Its line in the file, from 1.
    pub line: usize,
}

/// A trace's requests, in time order.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The file's name, for messages.
    pub name: String,
    pub requests: Vec<TraceRequest>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read the trace {name}")]
    Io {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} line {line}: {reason}")]
    Line { name: String, line: usize, reason: String },
    #[error("the trace {name} has no requests")]
    Empty { name: String },
}

/// Reads the trace at `path`; `name` is what messages call it.
pub fn read(path: &Path, name: &str, format: TraceFormat) -> Result<Trace, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io { name: name.to_owned(), source })?;
    parse(std::io::BufReader::with_capacity(1 << 20, file), name, format)
}

/// Parses a trace from `reader`; `name` is what messages call it.
pub fn parse(reader: impl BufRead, name: &str, format: TraceFormat) -> Result<Trace, TraceError> {
    let mut requests = Vec::new();
    for (i, text) in reader.lines().enumerate() {
        let line = i + 1;
        let text = text.map_err(|source| TraceError::Io { name: name.to_owned(), source })?;
        if text.trim().is_empty() {
            continue;
        }
        let request = parse_line(&text, line, format).map_err(|reason| TraceError::Line {
            name: name.to_owned(),
            line,
            reason,
        })?;
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty { name: name.to_owned() });
    }
    // Stable: one timestamp keeps the file's order.
    requests.sort_by(|a: &TraceRequest, b| a.at_ms.total_cmp(&b.at_ms));
    Ok(Trace { name: name.to_owned(), requests })
}

fn parse_line(text: &str, line: usize, format: TraceFormat) -> Result<TraceRequest, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".to_owned());
    };
    let at_ms = match fields.get("timestamp") {
        None => return Err("no timestamp (ms)".to_owned()),
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| format!("timestamp must be a number of milliseconds, 0 or more, got {v}"))?,
    };
    let length = |key: &str| -> Result<Option<u32>, String> {
        match fields.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_LENGTH).contains(n))
                .map(|n| Some(n as u32))
                .ok_or_else(|| format!("{key} must be a whole number of tokens from 1 to {MAX_LENGTH}, got {v}")),
        }
    };
    let output_tokens = length("output_length")?.ok_or("no output_length")?;
    let hash_ids = match fields.get("hash_ids") {
        None if format == TraceFormat::Mooncake => return Err("no hash_ids (a Mooncake trace names its blocks)".into()),
        None => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| id.as_u64().ok_or_else(|| format!("hash_ids must be whole numbers 0 or more, got {id}")))
            .collect::<Result<Vec<u64>, String>>()?,
        Some(v) => return Err(format!("hash_ids must be an array of whole numbers, got {v}")),
    };
    let prompt = match fields.get("prompt") {
        None => None,
        Some(_) if format == TraceFormat::Mooncake => {
            return Err("a Mooncake trace has no prompt field; use format jsonl for a trace of prompts".into());
        }
        Some(Value::String(p)) if !p.trim().is_empty() => Some(p.clone()),
        Some(v) => return Err(format!("prompt must be a string with more than whitespace, got {v}")),
    };
    let input_tokens = match (length("input_length")?, &prompt) {
        (Some(_), Some(_)) => return Err("give input_length or prompt, not both".to_owned()),
        (Some(n), None) => n,
        // Counted by the replay's tokenizer.
        (None, Some(_)) => 0,
        (None, None) => return Err("no input_length".to_owned()),
    };
    if prompt.is_some() && !hash_ids.is_empty() {
        return Err("hash_ids build a prompt; a line with its prompt has none".to_owned());
    }
    let most = input_tokens.div_ceil(BLOCK_TOKENS) as usize;
    if hash_ids.len() > most {
        return Err(format!(
            "{} hash_ids for an input of {input_tokens} tokens: at most {most} blocks of {BLOCK_TOKENS} tokens",
            hash_ids.len()
        ));
    }
    Ok(TraceRequest { at_ms, input_tokens, output_tokens, hash_ids, prompt, line })
}

impl Trace {
    /// The send times of its first `n` requests replayed `speed` times as
    /// fast as recorded, as offsets from the first.
    pub fn send_times(&self, n: usize, speed: f64) -> Vec<Duration> {
        let origin = self.requests.first().map_or(0.0, |r| r.at_ms);
        self.requests
            .iter()
            .take(n)
            .map(|r| Duration::from_secs_f64((r.at_ms - origin).max(0.0) / 1e3 / speed))
            .collect()
    }

    /// Whether it holds `requests` requests; what a profile that asks for
    /// more is told.
    pub fn holds(&self, requests: u64) -> Result<(), String> {
        if requests > self.requests.len() as u64 {
            return Err(format!(
                "{requests} requests asked of the trace {}, which has {}: ask for at most that many",
                self.name,
                self.requests.len()
            ));
        }
        Ok(())
    }

    /// The time from its first request to its last, ms.
    pub fn span_ms(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.at_ms - a.at_ms,
            _ => 0.0,
        }
    }

    /// Of the prompt blocks its first `n` requests name, the share named by
    /// an earlier request (at the same place of a prompt: the reuse a prefix
    /// cache can find when nothing is evicted).
    pub fn block_reuse(&self, n: usize) -> f64 {
        let mut seen = std::collections::HashSet::new();
        let (mut blocks, mut again) = (0u64, 0u64);
        for r in self.requests.iter().take(n) {
            for id in &r.hash_ids {
                blocks += 1;
                if !seen.insert(*id) {
                    again += 1;
                }
            }
        }
        if blocks == 0 { 0.0 } else { again as f64 / blocks as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str, format: TraceFormat) -> Result<Trace, TraceError> {
        parse(text.as_bytes(), "t.jsonl", format)
    }

    #[test]
    fn a_mooncake_trace_is_read_in_time_order() {
        let text = concat!(
            r#"{"timestamp": 1200, "input_length": 1030, "output_length": 7, "hash_ids": [1, 2, 3]}"#,
            "\n\n",
            r#"{"timestamp": 200, "input_length": 600, "output_length": 9, "hash_ids": [1, 4], "extra": "kept out"}"#,
            "\n",
            r#"{"timestamp": 1200, "input_length": 10, "output_length": 1, "hash_ids": []}"#,
            "\n",
        );
        let t = parse_str(text, TraceFormat::Mooncake).expect("parses");
        let lines: Vec<usize> = t.requests.iter().map(|r| r.line).collect();
        assert_eq!(lines, [3, 1, 4], "time order, ties in file order");
        assert_eq!(t.requests[0].hash_ids, [1, 4]);
        assert_eq!((t.requests[1].input_tokens, t.requests[1].output_tokens), (1030, 7));
        assert_eq!(t.span_ms(), 1000.0);
        assert_eq!(t.send_times(3, 2.0), [0, 500, 500].map(Duration::from_millis));
        assert_eq!(t.send_times(1, 1.0), [Duration::ZERO]);
        // Block 1 is named twice of the five blocks.
        assert!((t.block_reuse(3) - 0.2).abs() < 1e-12);
        assert_eq!(t.block_reuse(1), 0.0);
        assert_eq!(t.holds(3), Ok(()));
        assert_eq!(
            t.holds(4),
            Err("4 requests asked of the trace t.jsonl, which has 3: ask for at most that many".to_owned())
        );
    }

    #[test]
    fn a_jsonl_trace_may_carry_prompts_and_leave_out_blocks() {
        let text = concat!(
            r#"{"timestamp": 0.5, "prompt": "tell me a story", "output_length": 30}"#,
            "\n",
            r#"{"timestamp": 3, "input_length": 64, "output_length": 2}"#,
        );
        let t = parse_str(text, TraceFormat::Jsonl).expect("parses");
        assert_eq!(t.requests[0].prompt.as_deref(), Some("tell me a story"));
        assert!(t.requests[1].hash_ids.is_empty() && t.requests[1].prompt.is_none());
        assert_eq!(t.send_times(2, 1.0)[1], Duration::from_micros(2500));
    }

    #[test]
    fn bad_lines_are_errors_that_name_the_line() {
        let ok = r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}"#;
        for (bad, format, said) in [
            ("{not json", TraceFormat::Mooncake, "t.jsonl line 2: not JSON"),
            ("[1, 2]", TraceFormat::Mooncake, "line 2: not a JSON object"),
            (r#"{"input_length": 1, "output_length": 1, "hash_ids": []}"#, TraceFormat::Mooncake, "no timestamp"),
            (
                r#"{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}"#,
                TraceFormat::Mooncake,
                "timestamp must be a number of milliseconds, 0 or more, got -1",
            ),
            (
                r#"{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}"#,
                TraceFormat::Mooncake,
                "input_length must be a whole number of tokens from 1 to 1048576, got 0",
            ),
            (
                r#"{"timestamp": 1, "input_length": 5, "output_length": 2.5, "hash_ids": []}"#,
                TraceFormat::Mooncake,
                "output_length must be a whole number",
            ),
            (r#"{"timestamp": 1, "input_length": 5, "output_length": 2}"#, TraceFormat::Mooncake, "no hash_ids"),
            (
                r#"{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1, -2]}"#,
                TraceFormat::Mooncake,
                "hash_ids must be whole numbers 0 or more, got -2",
            ),
            (
                r#"{"timestamp": 1, "input_length": 513, "output_length": 2, "hash_ids": [1, 2, 3]}"#,
                TraceFormat::Mooncake,
                "3 hash_ids for an input of 513 tokens: at most 2 blocks of 512 tokens",
            ),
            (r#"{"timestamp": 1, "output_length": 2}"#, TraceFormat::Jsonl, "no input_length"),
            (r#"{"timestamp": 1, "input_length": 4}"#, TraceFormat::Jsonl, "no output_length"),
            (
                r#"{"timestamp": 1, "prompt": "hi", "input_length": 4, "output_length": 1}"#,
                TraceFormat::Jsonl,
                "give input_length or prompt, not both",
            ),
            (
                r#"{"timestamp": 1, "prompt": "hi", "output_length": 1, "hash_ids": []}"#,
                TraceFormat::Mooncake,
                "a Mooncake trace has no prompt field",
            ),
            (r#"{"timestamp": 1, "prompt": " ", "output_length": 1}"#, TraceFormat::Jsonl, "prompt must be a string"),
        ] {
            let e = parse_str(&format!("{ok}\n{bad}\n{ok}\n"), format).expect_err(bad).to_string();
            assert!(e.starts_with("t.jsonl line 2: ") && e.contains(said), "{bad}: {e}");
        }
        let e = parse_str("\n  \n", TraceFormat::Jsonl).expect_err("empty").to_string();
        assert_eq!(e, "the trace t.jsonl has no requests");
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = read(Path::new("/nonexistent/trace.jsonl"), "trace.jsonl", TraceFormat::Jsonl).expect_err("no file");
        assert_eq!(e.to_string(), "cannot read the trace trace.jsonl");
        assert_eq!(TraceFormat::from_name("jsonl"), Some(TraceFormat::Jsonl));
        assert_eq!(TraceFormat::from_name(TraceFormat::Mooncake.name()), Some(TraceFormat::Mooncake));
        assert_eq!(TraceFormat::from_name("csv"), None);
    }
}
