//! One record per request: the raw facts every metric is computed from.
//!
//! Times are nanoseconds since the load run's start, read from a monotonic
//! clock. Records are kept whole (every chunk's arrival) so that any metric
//! can be recomputed later from the store. Chunk arrivals are held compactly
//! ([`Chunks`]): a run keeps one per token of every request.

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
    /// Bad chunked framing, a chunk or body that is not the JSON expected, a
    /// streamed reply that is not an event stream, or a reply without text.
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

/// Every text-carrying chunk of a request, in arrival order, in 8 bytes a
/// chunk instead of a [`Chunk`]'s 16: each arrival is kept as the gap since
/// the previous one, in nanoseconds, which fits in a `u32` for any gap below
/// 4.29 s. Longer (or negative) gaps, rare, are kept whole aside, so nothing
/// is rounded. Reads, (de)serializes and converts as a list of [`Chunk`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<Chunk>", into = "Vec<Chunk>")]
pub struct Chunks {
    /// Arrival of the first chunk; the base of the first gap.
    first_ns: i64,
    /// Arrival of the last chunk: where the next gap starts.
    last_ns: i64,
    /// (gap since the previous arrival, tokens); the first gap is 0.
    packed: Vec<(u32, u32)>,
    /// The gaps marked [`LONG_GAP`] in `packed`, in order.
    long_gaps: Vec<i64>,
}

/// Marks a gap kept in `Chunks::long_gaps`.
const LONG_GAP: u32 = u32::MAX;

impl Chunks {
    pub fn new() -> Chunks {
        Chunks::default()
    }

    /// Room for `n` chunks without regrowth.
    pub fn with_capacity(n: usize) -> Chunks {
        Chunks { packed: Vec::with_capacity(n), ..Chunks::default() }
    }

    pub fn push(&mut self, chunk: Chunk) {
        if self.packed.is_empty() {
            self.first_ns = chunk.at_ns;
            self.last_ns = chunk.at_ns;
        }
        let gap = chunk.at_ns.wrapping_sub(self.last_ns);
        let packed = match u32::try_from(gap) {
            Ok(gap) if gap != LONG_GAP => gap,
            _ => {
                self.long_gaps.push(gap);
                LONG_GAP
            }
        };
        self.packed.push((packed, chunk.tokens));
        self.last_ns = chunk.at_ns;
    }

    pub fn len(&self) -> usize {
        self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.packed.capacity()
    }

    pub fn shrink_to_fit(&mut self) {
        self.packed.shrink_to_fit();
    }

    /// The chunks, in arrival order.
    pub fn iter(&self) -> ChunkIter<'_> {
        ChunkIter { packed: self.packed.iter(), long_gaps: self.long_gaps.iter(), at_ns: self.first_ns }
    }

    /// Each chunk with the one before it: (previous, chunk).
    pub fn pairs(&self) -> impl Iterator<Item = (Chunk, Chunk)> + '_ {
        self.iter().zip(self.iter().skip(1))
    }

    pub fn first(&self) -> Option<Chunk> {
        self.iter().next()
    }

    pub fn last(&self) -> Option<Chunk> {
        self.packed.last().map(|&(_, tokens)| Chunk { at_ns: self.last_ns, tokens })
    }

    pub fn to_vec(&self) -> Vec<Chunk> {
        self.iter().collect()
    }

    /// Where a walk through the chunks starts: for a walk that outlives a
    /// borrow (an iterator would hold one), see [`Chunks::next_at`].
    pub fn cursor(&self) -> ChunkCursor {
        ChunkCursor { next: 0, long: 0, at_ns: self.first_ns }
    }

    /// The chunk at `cursor`, moving it on; `None` past the last.
    pub fn next_at(&self, cursor: &mut ChunkCursor) -> Option<Chunk> {
        let &(gap, tokens) = self.packed.get(cursor.next)?;
        cursor.next += 1;
        let gap = if gap == LONG_GAP {
            cursor.long += 1;
            self.long_gaps.get(cursor.long - 1).copied().unwrap_or(0)
        } else {
            i64::from(gap)
        };
        cursor.at_ns = cursor.at_ns.wrapping_add(gap);
        Some(Chunk { at_ns: cursor.at_ns, tokens })
    }
}

/// A position in a [`Chunks`], apart from it.
#[derive(Clone, Copy, Debug)]
pub struct ChunkCursor {
    next: usize,
    long: usize,
    at_ns: i64,
}

/// The chunks of [`Chunks::iter`].
#[derive(Clone, Debug)]
pub struct ChunkIter<'a> {
    packed: std::slice::Iter<'a, (u32, u32)>,
    long_gaps: std::slice::Iter<'a, i64>,
    at_ns: i64,
}

impl Iterator for ChunkIter<'_> {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        let &(gap, tokens) = self.packed.next()?;
        let gap = if gap == LONG_GAP { self.long_gaps.next().copied().unwrap_or(0) } else { i64::from(gap) };
        self.at_ns = self.at_ns.wrapping_add(gap);
        Some(Chunk { at_ns: self.at_ns, tokens })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.packed.size_hint()
    }
}

impl ExactSizeIterator for ChunkIter<'_> {}

impl<'a> IntoIterator for &'a Chunks {
    type Item = Chunk;
    type IntoIter = ChunkIter<'a>;

    fn into_iter(self) -> ChunkIter<'a> {
        self.iter()
    }
}

impl FromIterator<Chunk> for Chunks {
    fn from_iter<I: IntoIterator<Item = Chunk>>(chunks: I) -> Chunks {
        let chunks = chunks.into_iter();
        let mut all = Chunks::with_capacity(chunks.size_hint().0);
        chunks.for_each(|c| all.push(c));
        all
    }
}

impl From<Vec<Chunk>> for Chunks {
    fn from(chunks: Vec<Chunk>) -> Chunks {
        chunks.into_iter().collect()
    }
}

impl From<Chunks> for Vec<Chunk> {
    fn from(chunks: Chunks) -> Vec<Chunk> {
        chunks.to_vec()
    }
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

/// A request's place in a multi-turn session: the session (numbered from 0
/// in the order they began) and its turn in it (from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub session: u64,
    pub turn: u32,
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
    pub chunks: Chunks,
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
    /// Its session and turn, for a multi-turn dataset's request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<Turn>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(arrivals: &[i64]) {
        let chunks: Vec<Chunk> =
            arrivals.iter().enumerate().map(|(i, &at_ns)| Chunk { at_ns, tokens: i as u32 % 3 + 1 }).collect();
        let compact = Chunks::from(chunks.clone());
        assert_eq!(compact.to_vec(), chunks);
        assert_eq!(
            (compact.len(), compact.first(), compact.last()),
            (chunks.len(), chunks.first().copied(), chunks.last().copied())
        );
        let pairs: Vec<(Chunk, Chunk)> = chunks.windows(2).map(|w| (w[0], w[1])).collect();
        assert_eq!(compact.pairs().collect::<Vec<_>>(), pairs);
        // A cursor walks the same arrivals.
        let mut cursor = compact.cursor();
        let walked: Vec<Chunk> = std::iter::from_fn(|| compact.next_at(&mut cursor)).collect();
        assert_eq!(walked, chunks);
        // On the wire (JSON) it is the plain list, both ways.
        let json = serde_json::to_string(&compact).expect("json");
        assert_eq!(json, serde_json::to_string(&chunks).expect("json"));
        assert_eq!(serde_json::from_str::<Chunks>(&json).expect("read back"), compact);
    }

    #[test]
    fn chunks_keep_every_arrival_exactly() {
        check(&[]);
        check(&[5]);
        check(&[1_000, 1_000, 11_000_000, 21_000_000]);
        // Gaps that do not fit in 32 bits: long, negative, the marker itself.
        check(&[0, 10_000_000_000, 9_000_000_000, 9_000_000_000 + i64::from(u32::MAX), i64::MAX, i64::MIN, 7]);
    }
}
