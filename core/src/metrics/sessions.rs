//! What a multi-turn run's sessions did: how many began, how many turns
//! each sent, and TTFT and prompt length by turn number, so that the first
//! turn (nothing cached) can be read against the later ones (whose
//! conversation so far the engine may have cached).
//!
//! Sessions and turns count every record (a session begun in the warm-up
//! is still a session); the figures by turn are of the measured successful
//! requests, as every other latency is.

use serde::{Deserialize, Serialize};

use crate::record::{Phase, RequestRecord};

/// Turn numbers with a row of their own; later turns share the last row.
pub const TURN_ROWS: u32 = 32;

/// A multi-turn run's sessions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sessions {
    /// Sessions whose first turn was sent.
    pub sessions: u64,
    /// Turns sent, in all sessions.
    pub turns: u64,
    /// By turn number, ascending, only those with a measured request; the
    /// row of turn [`TURN_ROWS`] also holds every later one.
    pub by_turn: Vec<TurnFigures>,
}

/// One turn number's measured requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnFigures {
    /// From 1.
    pub turn: u32,
    pub successful: u64,
    pub failed: u64,
    /// Of the successful ones.
    pub mean_ttft_ms: f64,
    pub mean_prompt_tokens: f64,
}

impl TurnFigures {
    /// The row's turn as a table shows it: `32+` for the last row, which
    /// holds every turn from [`TURN_ROWS`] on.
    pub fn label(&self) -> String {
        if self.turn >= TURN_ROWS { format!("{}+", self.turn) } else { self.turn.to_string() }
    }
}

impl Sessions {
    /// Turns sent per session.
    pub fn turns_per_session(&self) -> f64 {
        if self.sessions == 0 { 0.0 } else { self.turns as f64 / self.sessions as f64 }
    }

    /// The mean TTFT of the successful turns whose number `which` takes,
    /// ms; `None` when there are none.
    pub fn mean_ttft_ms(&self, which: impl Fn(u32) -> bool) -> Option<f64> {
        let rows = self.by_turn.iter().filter(|t| which(t.turn) && t.successful > 0);
        let (n, sum) =
            rows.fold((0u64, 0.0), |(n, sum), t| (n + t.successful, sum + t.mean_ttft_ms * t.successful as f64));
        (n > 0).then(|| sum / n as f64)
    }

    /// The sessions of several runs together (a block over repeats).
    pub fn pool<'a>(parts: impl IntoIterator<Item = &'a Sessions>) -> Sessions {
        let mut tally = Tally::default();
        for s in parts {
            tally.sessions += s.sessions;
            tally.turns += s.turns;
            for t in &s.by_turn {
                let row = tally.row(t.turn);
                row.successful += t.successful;
                row.failed += t.failed;
                row.ttft_ms += t.mean_ttft_ms * t.successful as f64;
                row.prompt_tokens += t.mean_prompt_tokens * t.successful as f64;
            }
        }
        tally.finish().unwrap_or_default()
    }
}

/// Sessions counted one record at a time, in any order, to the same sums.
#[derive(Debug, Default)]
pub(super) struct Tally {
    sessions: u64,
    turns: u64,
    rows: Vec<Row>,
}

#[derive(Clone, Debug, Default)]
struct Row {
    successful: u64,
    failed: u64,
    /// Sums as floats only when pooling figures; the records' own are
    /// whole nanoseconds and tokens, summed exactly.
    ttft_ms: f64,
    prompt_tokens: f64,
    ttft_ns: i128,
    prompt: u64,
}

impl Tally {
    fn row(&mut self, turn: u32) -> &mut Row {
        let i = (turn.clamp(1, TURN_ROWS) - 1) as usize;
        if self.rows.len() <= i {
            self.rows.resize(i + 1, Row::default());
        }
        &mut self.rows[i]
    }

    pub(super) fn add(&mut self, r: &RequestRecord) {
        let Some(t) = r.turn else { return };
        self.turns += 1;
        if t.turn == 1 {
            self.sessions += 1;
        }
        if r.phase != Phase::Measured {
            return;
        }
        let row = self.row(t.turn);
        if r.outcome.is_ok() {
            // A success has its first token (`Outcome::Ok`).
            row.successful += 1;
            row.ttft_ns += i128::from(r.ttft_ns().unwrap_or(0));
            row.prompt += u64::from(r.prompt_tokens);
        } else {
            row.failed += 1;
        }
    }

    /// `None` for a run with no session.
    pub(super) fn finish(self) -> Option<Sessions> {
        if self.turns == 0 {
            return None;
        }
        let by_turn = (1..)
            .zip(self.rows)
            .filter(|(_, row)| row.successful + row.failed > 0)
            .map(|(turn, row)| {
                let n = row.successful.max(1) as f64;
                TurnFigures {
                    turn,
                    successful: row.successful,
                    failed: row.failed,
                    mean_ttft_ms: (row.ttft_ns as f64 / 1e6 + row.ttft_ms) / n,
                    mean_prompt_tokens: (row.prompt as f64 + row.prompt_tokens) / n,
                }
            })
            .collect();
        Some(Sessions { sessions: self.sessions, turns: self.turns, by_turn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Chunk, Chunks, Outcome, Turn};

    fn turn(session: u64, turn: u32, ttft_ms: i64, prompt: u32, ok: bool, phase: Phase) -> RequestRecord {
        let ttft = ttft_ms * 1_000_000;
        RequestRecord {
            seq: 0,
            scheduled_ns: 0,
            sent_ns: 0,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: ok.then_some(ttft),
            completed_ns: ttft + 1,
            chunks: if ok { [Chunk { at_ns: ttft, tokens: 1 }].into_iter().collect() } else { Chunks::default() },
            prompt_tokens: prompt,
            output_tokens: u32::from(ok),
            outcome: if ok { Outcome::Ok } else { Outcome::HttpError },
            http_status: Some(if ok { 200 } else { 500 }),
            error: None,
            phase,
            turn: Some(Turn { session, turn }),
        }
    }

    #[test]
    fn turns_are_counted_and_later_turns_read_against_the_first() {
        let m = Phase::Measured;
        let records = [
            turn(0, 1, 100, 10, true, Phase::Warmup),
            turn(0, 2, 30, 30, true, m),
            turn(1, 1, 120, 10, true, m),
            turn(1, 2, 40, 30, true, m),
            turn(1, 3, 0, 50, false, m),
            turn(2, 1, 80, 10, true, m),
        ];
        let mut tally = Tally::default();
        // Any order gives the same figures.
        for r in records.iter().rev() {
            tally.add(r);
        }
        let s = tally.finish().expect("sessions");
        assert_eq!((s.sessions, s.turns), (3, 6));
        assert_eq!(s.turns_per_session(), 2.0);
        let rows: Vec<(u32, u64, u64, f64, f64)> =
            s.by_turn.iter().map(|t| (t.turn, t.successful, t.failed, t.mean_ttft_ms, t.mean_prompt_tokens)).collect();
        assert_eq!(rows, [(1, 2, 0, 100.0, 10.0), (2, 2, 0, 35.0, 30.0), (3, 0, 1, 0.0, 0.0)]);
        assert_eq!(s.mean_ttft_ms(|t| t == 1), Some(100.0));
        assert_eq!(s.mean_ttft_ms(|t| t > 1), Some(35.0));
        assert_eq!(s.mean_ttft_ms(|t| t > 3), None);
        // Two repeats pooled: counts add, means weigh by requests.
        let pooled = Sessions::pool([&s, &s]);
        assert_eq!((pooled.sessions, pooled.turns, pooled.by_turn[1].successful), (6, 12, 4));
        assert!((pooled.by_turn[1].mean_ttft_ms - 35.0).abs() < 1e-9);
        assert!(Tally::default().finish().is_none(), "no session, no figures");
    }

    #[test]
    fn turns_past_the_last_row_share_it() {
        let mut tally = Tally::default();
        tally.add(&turn(0, TURN_ROWS, 10, 1, true, Phase::Measured));
        tally.add(&turn(0, TURN_ROWS + 5, 30, 3, true, Phase::Measured));
        let s = tally.finish().expect("sessions");
        assert_eq!(s.by_turn.len(), 1);
        assert_eq!((s.by_turn[0].turn, s.by_turn[0].successful, s.by_turn[0].mean_ttft_ms), (TURN_ROWS, 2, 20.0));
        assert_eq!(s.by_turn[0].label(), "32+", "the last row says it holds the later turns");
        let first = TurnFigures { turn: 1, ..s.by_turn[0].clone() };
        assert_eq!(first.label(), "1");
    }
}
