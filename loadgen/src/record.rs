//! One record per request: the raw facts every metric is computed from.
//!
//! Times are nanoseconds since the load run's start, read from a monotonic
//! clock. Records are kept whole (every chunk's arrival) so that any metric
//! can be recomputed later from the store.

use serde::{Deserialize, Serialize};

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The server finished the response.
    Ok,
    /// The server answered with a non-2xx status.
    HttpError,
    /// A connect, first-token, idle or total timeout expired.
    Timeout,
    /// The run ended before the request did.
    Cancelled,
    /// The stream ended before the server said it was done, or was malformed.
    Incomplete,
    /// The connection could not be made or broke.
    TransportError,
}

impl Outcome {
    pub fn is_ok(self) -> bool {
        self == Outcome::Ok
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::HttpError => "http_error",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Incomplete => "incomplete",
            Outcome::TransportError => "transport_error",
        }
    }
}

/// A streamed chunk that carried text (content or reasoning).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Arrival time, ns since the run's start.
    pub at_ns: i64,
    /// Output tokens the chunk carried.
    pub tokens: u32,
}

/// Everything loadgen knows about one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the run's schedule, from 0.
    pub seq: u64,
    /// When the schedule said to send it.
    pub scheduled_ns: i64,
    /// When it was actually sent.
    pub sent_ns: i64,
    /// Arrival of the first chunk carrying text; `None` if none arrived.
    pub first_token_ns: Option<i64>,
    /// When the response ended (or the request failed).
    pub completed_ns: i64,
    /// Every text-carrying chunk, in arrival order.
    pub chunks: Vec<Chunk>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub outcome: Outcome,
    /// The HTTP status, when a response arrived.
    pub http_status: Option<u16>,
    /// What went wrong, for failed requests.
    pub error: Option<String>,
}

impl RequestRecord {
    /// E2E latency in ns, from the actual send.
    pub fn latency_ns(&self) -> i64 {
        self.completed_ns - self.sent_ns
    }

    /// TTFT in ns, from the actual send.
    pub fn ttft_ns(&self) -> Option<i64> {
        self.first_token_ns.map(|t| t - self.sent_ns)
    }

    /// TPOT in ns: decode time per token after the first. Only defined for
    /// requests with more than one output token, and never includes TTFT.
    pub fn tpot_ns(&self) -> Option<f64> {
        let first = self.first_token_ns?;
        (self.output_tokens > 1).then(|| (self.completed_ns - first) as f64 / f64::from(self.output_tokens - 1))
    }
}
