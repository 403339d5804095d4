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
    /// The server reported an error inside the stream.
    Incomplete,
    /// The connection ended (or broke) after the response began, before
    /// the server said it was done.
    Disconnected,
    /// Bad chunked framing, or a chunk or body that is not the JSON expected.
    Malformed,
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
            Outcome::Disconnected => "disconnected",
            Outcome::Malformed => "malformed",
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

/// Which part of the run a request belongs to. Warm-up and cool-down
/// requests are sent and recorded like any other, but the statistics leave
/// them out: the server is still filling (or already draining) its batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Measured,
    Warmup,
    Cooldown,
}

/// Everything loadgen knows about one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the run's schedule, from 0.
    pub seq: u64,
    /// When the schedule said to send it.
    pub scheduled_ns: i64,
    /// When it was actually sent: the request's first byte was written, after
    /// any connection setup (see `connect_ns`).
    pub sent_ns: i64,
    /// When a concurrency slot came free, for a request that was due while
    /// the cap was reached; `None` if it never waited. The dispatch lag is
    /// measured from the later of this and `scheduled_ns`, so that a binding
    /// cap is not mistaken for a client that fell behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_ns: Option<i64>,
    /// Time spent opening a new connection just before the send; `None` when
    /// the request reused an open one. Kept apart so that TCP setup does not
    /// inflate TTFT (it still shows in the from-scheduled times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_ns: Option<i64>,
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
    /// Warm-up and cool-down requests are kept but not measured.
    #[serde(default)]
    pub phase: Phase,
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

    /// E2E latency in ns, from the scheduled send: includes any wait for a
    /// concurrency slot and any lag of the client itself.
    pub fn latency_from_scheduled_ns(&self) -> i64 {
        self.completed_ns - self.scheduled_ns
    }

    /// TTFT in ns, from the scheduled send.
    pub fn ttft_from_scheduled_ns(&self) -> Option<i64> {
        self.first_token_ns.map(|t| t - self.scheduled_ns)
    }

    /// When the request was ready to go: its deadline, or later when it had
    /// to wait for a concurrency slot.
    pub fn ready_ns(&self) -> i64 {
        self.slot_ns.map_or(self.scheduled_ns, |slot| slot.max(self.scheduled_ns))
    }

    /// Dispatch lag in ns: how late the client itself sent the request.
    pub fn dispatch_lag_ns(&self) -> i64 {
        self.sent_ns - self.ready_ns()
    }

    /// TPOT in ns: decode time per token after the first. Only defined for
    /// requests with more than one output token, and never includes TTFT.
    pub fn tpot_ns(&self) -> Option<f64> {
        let first = self.first_token_ns?;
        (self.output_tokens > 1).then(|| (self.completed_ns - first) as f64 / f64::from(self.output_tokens - 1))
    }
}
