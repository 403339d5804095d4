//! Multi-turn sessions: a conversation sent one user turn at a time, each
//! turn carrying the whole conversation so far (every earlier user turn and
//! the reply it actually got) and sent once the previous reply has arrived
//! and the user's think time has passed.
//!
//! The first turn of every session is made ahead like any prompt (on the
//! bodies' thread); a later turn is made by the dispatcher when the reply it
//! follows arrives, since it carries that reply. Its send is due at the
//! reply's end plus the think time: that is its scheduled time, so a client
//! that falls behind shows as dispatch lag as in any open loop.

use std::time::Duration;

use bytes::Bytes;

use crate::client::{self, BodyOptions};
use crate::record::{RequestRecord, Turn};

/// One user turn: its text and what it asks of the reply.
#[derive(Clone, Debug)]
pub(crate) struct UserTurn {
    pub text: String,
    /// Its tokens as counted: a turn's prompt tokens, where the server
    /// gives no usage, are the previous turn's prompt and reply and these.
    pub tokens: u32,
    pub max_tokens: u32,
    pub ignore_eos: bool,
}

/// A session as it runs: the conversation so far and the turns still to
/// come. It travels with its request while one is in flight.
#[derive(Debug)]
pub(crate) struct Session {
    /// Sessions are numbered from 0 in the order they begin.
    pub id: u64,
    /// The turn in flight (or about to be sent), from 1.
    pub turn: u32,
    /// The conversation so far: user, assistant, user, ..., the turn in
    /// flight last.
    messages: Vec<String>,
    /// The user turns still to send, the next first.
    rest: std::vec::IntoIter<UserTurn>,
    think: Duration,
}

impl Session {
    /// A session of `turns` (at least one), the first of which is about to
    /// be sent.
    pub fn new(id: u64, turns: Vec<UserTurn>, think: Duration) -> (Session, UserTurn) {
        let mut rest = turns.into_iter();
        let first = rest.next().expect("a session has a turn");
        (Session { id, turn: 1, messages: vec![first.text.clone()], rest, think }, first)
    }

    /// The turn in flight's place.
    pub fn place(&self) -> Turn {
        Turn { session: self.id, turn: self.turn }
    }

    /// Whether a turn follows the one in flight.
    pub fn continues(&self) -> bool {
        self.rest.len() > 0
    }

    /// The next turn, once `record` (the turn in flight's) came back with
    /// `reply`: its body, prompt tokens and reply length, and when it is
    /// due (ns on the run's clock). `None` when the session is over: its
    /// last turn, or a turn that failed (the conversation cannot go on
    /// without its reply).
    pub fn next(
        &mut self,
        options: &BodyOptions<'_>,
        record: &RequestRecord,
        reply: Option<String>,
    ) -> Option<(NextTurn, i64)> {
        let reply = reply.filter(|_| record.outcome.is_ok())?;
        let user = self.rest.next()?;
        self.messages.push(reply);
        self.messages.push(user.text);
        self.turn += 1;
        let body = client::conversation_body(options, &self.messages, user.max_tokens, user.ignore_eos);
        let prompt_tokens = record.prompt_tokens.saturating_add(record.output_tokens).saturating_add(user.tokens);
        let due = record.completed_ns.saturating_add(i64::try_from(self.think.as_nanos()).unwrap_or(i64::MAX));
        Some((NextTurn { body: Bytes::from(body), prompt_tokens, max_tokens: user.max_tokens }, due))
    }
}

/// A later turn's request, made from the conversation so far.
pub(crate) struct NextTurn {
    pub body: Bytes,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
}

/// How many sessions `requests` requests of sessions of `turns` turns
/// make: every session has `turns`, the last one what is left.
pub(crate) fn sessions_for(requests: usize, turns: u32) -> usize {
    requests.div_ceil(turns.max(1) as usize)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::client::Endpoint;
    use crate::record::{Chunks, Outcome, Phase};

    /// A turn's record: succeeded or not, its prompt and output tokens, and
    /// when it completed.
    pub(crate) fn record(ok: bool, prompt: u32, output: u32, completed_ns: i64) -> RequestRecord {
        RequestRecord {
            seq: 0,
            scheduled_ns: 0,
            sent_ns: 0,
            slot_ns: None,
            connect_ns: None,
            first_token_ns: Some(1),
            completed_ns,
            chunks: Chunks::default(),
            prompt_tokens: prompt,
            output_tokens: output,
            outcome: if ok { Outcome::Ok } else { Outcome::HttpError },
            http_status: Some(if ok { 200 } else { 500 }),
            error: None,
            phase: Phase::Measured,
            turn: None,
        }
    }

    fn user(text: &str) -> UserTurn {
        UserTurn { text: text.into(), tokens: crate::dataset::word_count(text), max_tokens: 3, ignore_eos: true }
    }

    #[test]
    fn each_turn_carries_the_conversation_and_is_due_after_the_think_time() {
        let extra = serde_json::Map::new();
        let options = BodyOptions { endpoint: Endpoint::Chat, model: "m", stream: true, extra: &extra };
        let (mut s, first) = Session::new(7, vec![user("a b"), user("c"), user("d e f")], Duration::from_millis(5));
        assert_eq!((first.text.as_str(), s.place()), ("a b", Turn { session: 7, turn: 1 }));
        assert!(s.continues());
        let (next, due) = s.next(&options, &record(true, 2, 3, 1_000), Some("x y z".into())).expect("turn 2");
        assert_eq!(due, 1_000 + 5_000_000, "the reply's end and the think time");
        assert_eq!(next.prompt_tokens, 2 + 3 + 1);
        let body: serde_json::Value = serde_json::from_slice(&next.body).expect("json");
        let said: Vec<(&str, &str)> = body["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| (m["role"].as_str().expect("role"), m["content"].as_str().expect("content")))
            .collect();
        assert_eq!(said, [("user", "a b"), ("assistant", "x y z"), ("user", "c")]);
        assert_eq!(s.place().turn, 2);
        // A failed turn ends the session; so does the last.
        let mut failed = Session::new(8, vec![user("a"), user("b")], Duration::ZERO).0;
        assert!(failed.next(&options, &record(false, 1, 0, 9), Some(String::new())).is_none());
        s.next(&options, &record(true, 6, 1, 2_000), Some("w".into())).expect("turn 3");
        assert!(!s.continues());
        assert!(s.next(&options, &record(true, 8, 1, 3_000), Some("v".into())).is_none());
    }

    #[test]
    fn a_completions_endpoint_gets_the_conversation_as_one_prompt() {
        let extra = serde_json::Map::new();
        let options = BodyOptions { endpoint: Endpoint::Completions, model: "m", stream: false, extra: &extra };
        let (mut s, _) = Session::new(0, vec![user("a b"), user("c")], Duration::ZERO);
        let (next, _) = s.next(&options, &record(true, 2, 1, 0), Some("x".into())).expect("turn 2");
        let body: serde_json::Value = serde_json::from_slice(&next.body).expect("json");
        assert_eq!(body["prompt"], "a b\nx\nc");
        assert_eq!(body["max_tokens"], 3);
    }

    #[test]
    fn requests_make_whole_sessions_and_a_last_short_one() {
        assert_eq!(sessions_for(10, 5), 2);
        assert_eq!(sessions_for(11, 5), 3);
        assert_eq!(sessions_for(3, 1), 3);
    }
}
