//! The stored form of request records: a compact binary encoding, versioned
//! by its first byte. Times are LEB128 varints, most of them as differences
//! (send after schedule, each chunk after the previous one): a streamed
//! chunk takes about five bytes (a gap of milliseconds in nanoseconds, and
//! its token count), a tenth of its JSON.
//!
//! A stored batch is a version byte, a record count, then each record.
//!
//! An attempt's digest (`benchfleet_core::Digest`, its distributions as
//! histograms) has its own version byte, then the records it covers and
//! each histogram: its count, its sum (an f64), its entries, each as the
//! step from the previous value (µs) and its count.

use benchfleet_core::{Chunk, Chunks, Digest, Histogram, Outcome, Phase, RequestRecord, Turn};

/// The encoding's version; a decoder refuses any other.
const VERSION: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record encoding version {0} is not one this build reads (it reads {VERSION})")]
    Version(u8),
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("bad value at byte {at}: {what}")]
    Bad { at: usize, what: &'static str },
}

fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    put_u64(out, ((v << 1) ^ (v >> 63)) as u64);
}

const HAS_SLOT: u8 = 1;
const HAS_CONNECT: u8 = 2;
const HAS_FIRST_TOKEN: u8 = 4;
const HAS_STATUS: u8 = 8;
const HAS_ERROR: u8 = 16;
const HAS_TURN: u8 = 32;

fn outcome_code(o: Outcome) -> u8 {
    match o {
        Outcome::Ok => 0,
        Outcome::HttpError => 1,
        Outcome::Timeout => 2,
        Outcome::Cancelled => 3,
        Outcome::Incomplete => 4,
        Outcome::Disconnected => 5,
        Outcome::Malformed => 6,
        Outcome::TransportError => 7,
    }
}

fn outcome_of(code: u8) -> Option<Outcome> {
    Some(match code {
        0 => Outcome::Ok,
        1 => Outcome::HttpError,
        2 => Outcome::Timeout,
        3 => Outcome::Cancelled,
        4 => Outcome::Incomplete,
        5 => Outcome::Disconnected,
        6 => Outcome::Malformed,
        7 => Outcome::TransportError,
        _ => return None,
    })
}

fn encode_one(out: &mut Vec<u8>, r: &RequestRecord) {
    let mut flags = 0;
    for (set, bit) in [
        (r.slot_ns.is_some(), HAS_SLOT),
        (r.connect_ns.is_some(), HAS_CONNECT),
        (r.first_token_ns.is_some(), HAS_FIRST_TOKEN),
        (r.http_status.is_some(), HAS_STATUS),
        (r.error.is_some(), HAS_ERROR),
        (r.turn.is_some(), HAS_TURN),
    ] {
        if set {
            flags |= bit;
        }
    }
    out.push(flags);
    out.push(outcome_code(r.outcome));
    out.push(match r.phase {
        Phase::Measured => 0,
        Phase::Warmup => 1,
        Phase::Cooldown => 2,
    });
    put_u64(out, r.seq);
    put_i64(out, r.scheduled_ns);
    put_i64(out, r.sent_ns.wrapping_sub(r.scheduled_ns));
    if let Some(slot) = r.slot_ns {
        put_i64(out, slot.wrapping_sub(r.scheduled_ns));
    }
    if let Some(c) = r.connect_ns {
        put_i64(out, c);
    }
    if let Some(t) = r.first_token_ns {
        put_i64(out, t.wrapping_sub(r.sent_ns));
    }
    put_i64(out, r.completed_ns.wrapping_sub(r.sent_ns));
    put_u64(out, r.prompt_tokens.into());
    put_u64(out, r.output_tokens.into());
    if let Some(s) = r.http_status {
        put_u64(out, s.into());
    }
    if let Some(e) = &r.error {
        put_u64(out, e.len() as u64);
        out.extend_from_slice(e.as_bytes());
    }
    if let Some(t) = r.turn {
        put_u64(out, t.session);
        put_u64(out, t.turn.into());
    }
    put_u64(out, r.chunks.len() as u64);
    let mut last = r.sent_ns;
    for c in &r.chunks {
        put_i64(out, c.at_ns.wrapping_sub(last));
        put_u64(out, c.tokens.into());
        last = c.at_ns;
    }
}

/// Encodes a batch of records.
pub fn encode_batch(records: &[RequestRecord]) -> Vec<u8> {
    let chunks: usize = records.iter().map(|r| r.chunks.len()).sum();
    let mut out = Vec::with_capacity(1 + records.len() * 32 + chunks * 4);
    out.push(VERSION);
    put_u64(&mut out, records.len() as u64);
    for r in records {
        encode_one(&mut out, r);
    }
    out
}

/// The digest encoding's version; a decoder refuses any other, and the
/// store then builds the digest again from the records.
pub const DIGEST_VERSION: u8 = 1;

/// Encodes a digest.
pub fn encode_digest(d: &Digest) -> Vec<u8> {
    let entries: usize = d.histograms().iter().map(|h| h.counts.len()).sum();
    let mut out = Vec::with_capacity(16 + entries * 3);
    out.push(DIGEST_VERSION);
    put_u64(&mut out, d.records);
    for h in d.histograms() {
        put_u64(&mut out, h.count);
        out.extend_from_slice(&h.sum_ns.to_le_bytes());
        put_u64(&mut out, h.counts.len() as u64);
        let mut previous = 0i64;
        for &(value, count) in &h.counts {
            put_i64(&mut out, value.wrapping_sub(previous));
            put_u64(&mut out, count);
            previous = value;
        }
    }
    out
}

/// Reads a digest back, checking that each histogram is one (values
/// ascending, counts that add up to its count).
pub fn decode_digest(buf: &[u8]) -> Result<Digest, DecodeError> {
    let mut r = BatchReader { buf, at: 0, left: 0 };
    let v = r.byte()?;
    if v != DIGEST_VERSION {
        return Err(DecodeError::Version(v));
    }
    let mut d = Digest { records: r.u64()?, ..Digest::default() };
    for h in d.histograms_mut() {
        let count = r.u64()?;
        let sum_ns = f64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
        let n = r.u64()?;
        // Each entry takes two bytes at least: a corrupt length must not
        // allocate what the buffer cannot hold.
        if n > (buf.len() - r.at) as u64 / 2 {
            return Err(DecodeError::Bad { at: r.at, what: "more histogram entries than bytes" });
        }
        let mut counts = Vec::with_capacity(n as usize);
        let (mut value, mut total) = (0i64, 0u64);
        for i in 0..n {
            let at = r.at;
            let next = value.wrapping_add(r.i64()?);
            if i > 0 && next <= value {
                return Err(DecodeError::Bad { at, what: "histogram values not ascending" });
            }
            value = next;
            let c = r.u64()?;
            if c == 0 {
                return Err(DecodeError::Bad { at, what: "histogram entry of count 0" });
            }
            total = total.saturating_add(c);
            counts.push((value, c));
        }
        if total != count {
            return Err(DecodeError::Bad { at: r.at, what: "histogram counts do not add up to its count" });
        }
        *h = Histogram { count, sum_ns, counts };
    }
    if r.at != buf.len() {
        return Err(DecodeError::Bad { at: r.at, what: "bytes after the digest" });
    }
    Ok(d)
}

/// Reads one stored batch, record by record.
pub struct BatchReader<'a> {
    buf: &'a [u8],
    at: usize,
    left: u64,
}

impl<'a> BatchReader<'a> {
    pub fn new(buf: &'a [u8]) -> Result<BatchReader<'a>, DecodeError> {
        let mut r = BatchReader { buf, at: 0, left: 0 };
        let v = r.byte()?;
        if v != VERSION {
            return Err(DecodeError::Version(v));
        }
        r.left = r.u64()?;
        Ok(r)
    }

    /// The number of records in the batch.
    pub fn count(buf: &[u8]) -> Result<u64, DecodeError> {
        Ok(BatchReader::new(buf)?.left)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.at).ok_or(DecodeError::Truncated(self.at))?;
        self.at += 1;
        Ok(b)
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let b = self.buf.get(self.at..self.at + n).ok_or(DecodeError::Truncated(self.buf.len()))?;
        self.at += n;
        Ok(b)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::Bad { at: self.at, what: "varint longer than 10 bytes" })
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        let v = self.u64()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let at = self.at;
        u32::try_from(self.u64()?).map_err(|_| DecodeError::Bad { at, what: "count above u32" })
    }

    fn record(&mut self) -> Result<RequestRecord, DecodeError> {
        let at = self.at;
        let flags = self.byte()?;
        if flags & !(HAS_SLOT | HAS_CONNECT | HAS_FIRST_TOKEN | HAS_STATUS | HAS_ERROR | HAS_TURN) != 0 {
            return Err(DecodeError::Bad { at, what: "unknown flags" });
        }
        let at = self.at;
        let outcome = outcome_of(self.byte()?).ok_or(DecodeError::Bad { at, what: "unknown outcome" })?;
        let at = self.at;
        let phase = match self.byte()? {
            0 => Phase::Measured,
            1 => Phase::Warmup,
            2 => Phase::Cooldown,
            _ => return Err(DecodeError::Bad { at, what: "unknown phase" }),
        };
        let seq = self.u64()?;
        let scheduled_ns = self.i64()?;
        let sent_ns = scheduled_ns.wrapping_add(self.i64()?);
        let slot_ns = if flags & HAS_SLOT != 0 { Some(scheduled_ns.wrapping_add(self.i64()?)) } else { None };
        let connect_ns = if flags & HAS_CONNECT != 0 { Some(self.i64()?) } else { None };
        let first_token_ns = if flags & HAS_FIRST_TOKEN != 0 { Some(sent_ns.wrapping_add(self.i64()?)) } else { None };
        let completed_ns = sent_ns.wrapping_add(self.i64()?);
        let prompt_tokens = self.u32()?;
        let output_tokens = self.u32()?;
        let http_status = if flags & HAS_STATUS != 0 {
            let at = self.at;
            Some(u16::try_from(self.u64()?).map_err(|_| DecodeError::Bad { at, what: "HTTP status above 65535" })?)
        } else {
            None
        };
        let error = if flags & HAS_ERROR != 0 {
            let len = self.u64()? as usize;
            let end =
                self.at.checked_add(len).filter(|&e| e <= self.buf.len()).ok_or(DecodeError::Truncated(self.at))?;
            let text = String::from_utf8_lossy(&self.buf[self.at..end]).into_owned();
            self.at = end;
            Some(text)
        } else {
            None
        };
        let turn = if flags & HAS_TURN != 0 {
            let session = self.u64()?;
            let at = self.at;
            let turn = self.u32()?;
            if turn == 0 {
                return Err(DecodeError::Bad { at, what: "turn 0 (turns count from 1)" });
            }
            Some(Turn { session, turn })
        } else {
            None
        };
        let n = self.u64()?;
        // Each chunk takes at least two bytes: a length beyond what is left
        // is corruption, not a reason to allocate.
        if n > (self.buf.len() - self.at) as u64 / 2 {
            return Err(DecodeError::Truncated(self.at));
        }
        let mut chunks = Chunks::with_capacity(n as usize);
        let mut last = sent_ns;
        for _ in 0..n {
            let at_ns = last.wrapping_add(self.i64()?);
            chunks.push(Chunk { at_ns, tokens: self.u32()? });
            last = at_ns;
        }
        Ok(RequestRecord {
            seq,
            scheduled_ns,
            sent_ns,
            slot_ns,
            connect_ns,
            first_token_ns,
            completed_ns,
            chunks,
            prompt_tokens,
            output_tokens,
            outcome,
            http_status,
            error,
            phase,
            turn,
        })
    }
}

impl Iterator for BatchReader<'_> {
    type Item = Result<RequestRecord, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = self.record();
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

/// Decodes a whole stored batch.
pub fn decode_batch(buf: &[u8]) -> Result<Vec<RequestRecord>, DecodeError> {
    BatchReader::new(buf)?.collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn outcome() -> impl Strategy<Value = Outcome> {
        (0u8..8).prop_map(|c| outcome_of(c).expect("0..8 are outcomes"))
    }

    prop_compose! {
        fn record()(
            seq in any::<u64>(),
            scheduled in any::<i64>(),
            sent in any::<i64>(),
            slot in proptest::option::of(any::<i64>()),
            connect in proptest::option::of(0i64..10_000_000_000),
            first in proptest::option::of(any::<i64>()),
            completed in any::<i64>(),
            chunks in proptest::collection::vec((any::<i64>(), any::<u32>()), 0..40),
            prompt in any::<u32>(),
            output in any::<u32>(),
            outcome in outcome(),
            status in proptest::option::of(any::<u16>()),
            error in proptest::option::of(".{0,40}"),
            phase in 0u8..3,
            turn in proptest::option::of((any::<u64>(), 1..=u32::MAX)),
        ) -> RequestRecord {
            RequestRecord {
                seq,
                scheduled_ns: scheduled,
                sent_ns: sent,
                slot_ns: slot,
                connect_ns: connect,
                first_token_ns: first,
                completed_ns: completed,
                chunks: chunks.into_iter().map(|(at_ns, tokens)| Chunk { at_ns, tokens }).collect(),
                prompt_tokens: prompt,
                output_tokens: output,
                outcome,
                http_status: status,
                error,
                phase: [Phase::Measured, Phase::Warmup, Phase::Cooldown][phase as usize],
                turn: turn.map(|(session, turn)| Turn { session, turn }),
            }
        }
    }

    proptest! {
        #[test]
        fn batches_read_back_as_written(records in proptest::collection::vec(record(), 0..20)) {
            let bytes = encode_batch(&records);
            prop_assert_eq!(decode_batch(&bytes).expect("decodes"), records.clone());
            prop_assert_eq!(BatchReader::count(&bytes).expect("count"), records.len() as u64);
        }

        #[test]
        fn corrupt_bytes_are_an_error_not_a_panic(records in proptest::collection::vec(record(), 1..5), cut in any::<prop::sample::Index>(), flip in any::<u8>()) {
            let mut bytes = encode_batch(&records);
            let i = cut.index(bytes.len());
            bytes[i] ^= flip | 1;
            let _ = decode_batch(&bytes);
            bytes.truncate(i);
            let _ = decode_batch(&bytes);
        }
    }

    /// A flag this build does not know is refused, not skipped: what it
    /// marks would be read as the next field.
    #[test]
    fn unknown_flags_and_turn_zero_are_refused() {
        let r = RequestRecord {
            seq: 1,
            scheduled_ns: 0,
            sent_ns: 0,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: None,
            completed_ns: 0,
            chunks: Chunks::default(),
            prompt_tokens: 0,
            output_tokens: 0,
            outcome: Outcome::Ok,
            http_status: None,
            error: None,
            phase: Phase::Measured,
            turn: Some(Turn { session: 3, turn: 1 }),
        };
        let mut bytes = encode_batch(std::slice::from_ref(&r));
        assert_eq!(decode_batch(&bytes), Ok(vec![r]));
        // Version, count, then the record's flags.
        bytes[2] |= 64;
        assert_eq!(decode_batch(&bytes), Err(DecodeError::Bad { at: 2, what: "unknown flags" }));
        bytes[2] &= !64;
        // The turn: after flags, outcome, phase, seq, schedule, send and
        // completion (one byte each), prompt and output, and the session.
        let at = bytes.len() - 2;
        assert_eq!(bytes[at], 1, "turn 1 where expected");
        bytes[at] = 0;
        assert!(matches!(decode_batch(&bytes), Err(DecodeError::Bad { what: "turn 0 (turns count from 1)", .. })));
    }

    prop_compose! {
        fn histogram()(entries in proptest::collection::btree_map(any::<i64>(), 1u64..1_000_000, 0..50), sum in any::<f64>()) -> Histogram {
            let counts: Vec<(i64, u64)> = entries.into_iter().collect();
            Histogram { count: counts.iter().map(|c| c.1).sum(), sum_ns: sum, counts }
        }
    }

    prop_compose! {
        fn digest()(records in any::<u64>(), h in proptest::collection::vec(histogram(), 9)) -> Digest {
            let mut d = Digest { records, ..Digest::default() };
            for (slot, h) in d.histograms_mut().into_iter().zip(h) {
                *slot = h;
            }
            d
        }
    }

    proptest! {
        #[test]
        fn digests_read_back_as_written(d in digest()) {
            let back = decode_digest(&encode_digest(&d)).expect("decodes");
            // NaN sums compare unequal: compare their bits.
            for (a, b) in back.histograms().into_iter().zip(d.histograms()) {
                prop_assert_eq!((a.count, &a.counts, a.sum_ns.to_bits()), (b.count, &b.counts, b.sum_ns.to_bits()));
            }
            prop_assert_eq!(back.records, d.records);
        }

        #[test]
        fn a_corrupt_digest_is_an_error_not_a_panic(d in digest(), cut in any::<prop::sample::Index>(), flip in any::<u8>()) {
            let mut bytes = encode_digest(&d);
            let i = cut.index(bytes.len());
            bytes[i] ^= flip | 1;
            let _ = decode_digest(&bytes);
            bytes.truncate(i);
            prop_assert!(decode_digest(&bytes).is_err());
        }
    }

    #[test]
    fn a_streamed_chunk_takes_about_five_bytes() {
        let sent = 5_000_000_000;
        let record = RequestRecord {
            seq: 917,
            scheduled_ns: sent - 20_000,
            sent_ns: sent,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: Some(sent + 80_000_000),
            completed_ns: sent + 80_000_000 + 127 * 12_000_000,
            chunks: (0..128).map(|i| Chunk { at_ns: sent + 80_000_000 + i * 12_000_000, tokens: 1 }).collect(),
            prompt_tokens: 1024,
            output_tokens: 128,
            outcome: Outcome::Ok,
            http_status: Some(200),
            error: None,
            phase: Phase::Measured,
            turn: None,
        };
        let bytes = encode_batch(std::slice::from_ref(&record));
        // 12 ms gaps take 4 bytes as varints, a token count 1.
        assert!(bytes.len() < 128 * 5 + 40, "{} bytes", bytes.len());
        assert_eq!(decode_batch(&bytes).expect("decodes"), vec![record]);
    }

    #[test]
    fn another_version_is_refused() {
        assert_eq!(decode_batch(&[9, 0]).err(), Some(DecodeError::Version(9)));
        assert_eq!(decode_batch(&[]).err(), Some(DecodeError::Truncated(0)));
    }
}
