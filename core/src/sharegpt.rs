//! ShareGPT conversation files: which conversations a benchmark can use, and
//! why each of the others is skipped. One parser for loadgen (which sends
//! them) and the operator's CLI (which checks a matrix's files before it
//! submits).
//!
//! The rule: an entry is an object whose `conversations` is an array of
//! turns `{ "from": ..., "value": ... }`. The first turn from `human` (or
//! `user`) is the prompt; the turn right after it is the reply, and must be
//! from `gpt` (or `assistant`, `chatgpt`). Both values must be strings with
//! more than whitespace. Every entry that breaks the rule is skipped and
//! counted by the first reason it breaks it.
//!
//! The file is read as a stream: one entry at a time is held whole, and of
//! the entries used only their prompt and reply are kept, so a file of
//! hundreds of megabytes loads in about the memory of what it sends.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde_json::Value;

/// The usable conversations of a ShareGPT file.
#[derive(Clone, Debug, Default)]
pub struct ShareGpt {
    /// The file's name, for messages.
    pub name: String,
    /// In file order.
    pub entries: Vec<Exchange>,
    /// Entries in the file.
    pub total: usize,
    pub skipped: Skipped,
}

/// One usable exchange: the prompt and the reply that followed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub prompt: String,
    pub reply: String,
    /// The exchanges that followed it in its conversation, when they are
    /// kept (`parse_with`'s `turns`): each a further user turn and the reply
    /// to it, up to the first turn that breaks the rule (not a user turn
    /// followed by an assistant's, or an empty one).
    pub more: Vec<Exchange>,
}

impl Exchange {
    /// Its conversation's user turns: 1 and those that followed.
    pub fn turns(&self) -> usize {
        1 + self.more.len()
    }
}

/// Why entries were skipped, counted by the first rule each broke.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub not_an_object: usize,
    pub no_conversations: usize,
    pub bad_turn: usize,
    pub no_human_turn: usize,
    pub non_string_value: usize,
    pub empty_prompt: usize,
    pub no_reply: usize,
    pub reply_not_from_gpt: usize,
    pub empty_reply: usize,
}

impl Skipped {
    fn counts(&self) -> [(&'static str, usize); 9] {
        [
            ("not an object", self.not_an_object),
            ("no conversations array", self.no_conversations),
            ("a turn without from and value", self.bad_turn),
            ("no human turn", self.no_human_turn),
            ("non-string value", self.non_string_value),
            ("empty prompt", self.empty_prompt),
            ("no reply", self.no_reply),
            ("reply not from gpt", self.reply_not_from_gpt),
            ("empty reply", self.empty_reply),
        ]
    }

    pub fn total(&self) -> usize {
        self.counts().iter().map(|(_, n)| n).sum()
    }

    /// "empty reply 5, no reply 4", the largest first.
    pub fn describe(&self) -> String {
        let mut counts: Vec<(&str, usize)> = self.counts().into_iter().filter(|(_, n)| *n > 0).collect();
        counts.sort_by_key(|c| std::cmp::Reverse(c.1));
        counts.iter().map(|(why, n)| format!("{why} {n}")).collect::<Vec<_>>().join(", ")
    }
}

impl ShareGpt {
    /// "used 16 of 30 conversations; skipped: empty reply 5, no reply 4".
    pub fn describe(&self) -> String {
        let used = format!("used {} of {} conversations", self.entries.len(), self.total);
        if self.skipped.total() == 0 { used } else { format!("{used}; skipped: {}", self.skipped.describe()) }
    }
}

impl ShareGpt {
    /// What to say when `requests` turns of sessions are asked of fewer
    /// than the conversations hold (read with their later exchanges): the
    /// conversations are sent again, in the same order.
    pub fn reuse_turns(&self, requests: usize) -> Option<String> {
        let have: usize = self.entries.iter().map(Exchange::turns).sum();
        (requests > have && have > 0).then(|| {
            format!(
                "{requests} turns asked of {}, whose {} usable conversation{} hold {have}: they are sent again, in \
                 the same order",
                self.name,
                self.entries.len(),
                if self.entries.len() == 1 { "" } else { "s" }
            )
        })
    }

    /// What to say when `requests` prompts are asked of fewer
    /// conversations: they are sent again, in the same order.
    pub fn reuse(&self, requests: usize) -> Option<String> {
        let have = self.entries.len();
        (requests > have && have > 0).then(|| {
            let (least, more) = (requests / have, requests % have);
            let times = if more == 0 { format!("{least} times") } else { format!("{least} or {} times", least + 1) };
            format!(
                "{requests} prompts asked of {}, which has {have} usable conversation{}: each is sent {times}, \
                 in the same order",
                self.name,
                if have == 1 { "" } else { "s" }
            )
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShareGptError {
    #[error("cannot read the ShareGPT file {name}")]
    Read {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the ShareGPT file {name} is empty")]
    Empty { name: String },
    #[error("the ShareGPT file {name} is not a JSON array of conversations: it is {found}")]
    NotAnArray { name: String, found: &'static str },
    #[error("the ShareGPT file {name} is not valid JSON at line {line}, column {column}: {message}")]
    Syntax { name: String, line: usize, column: usize, message: String },
    #[error("the ShareGPT file {name} has no usable conversation: {}", describe_none(*.total, .skipped))]
    NoneUsable { name: String, total: usize, skipped: Skipped },
}

fn describe_none(total: usize, skipped: &Skipped) -> String {
    if total == 0 {
        "the array is empty".to_owned()
    } else {
        format!("all {total} skipped ({}); each needs a human turn followed by a gpt reply", skipped.describe())
    }
}

/// Reads a ShareGPT file as a stream; `name` is how messages name it.
pub fn read(path: &Path, name: &str) -> Result<ShareGpt, ShareGptError> {
    read_with(path, name, false)
}

/// Reads a ShareGPT file, keeping each conversation's later exchanges
/// (`Exchange::more`) with `turns`.
pub fn read_with(path: &Path, name: &str, turns: bool) -> Result<ShareGpt, ShareGptError> {
    let file = std::fs::File::open(path).map_err(|source| ShareGptError::Read { name: name.to_owned(), source })?;
    parse_with(BufReader::with_capacity(1 << 20, file), name, turns)
}

/// Parses a ShareGPT file from `reader` (a UTF-8 byte-order mark is
/// skipped).
pub fn parse(reader: impl BufRead, name: &str) -> Result<ShareGpt, ShareGptError> {
    parse_with(reader, name, false)
}

/// Parses a ShareGPT file, keeping each conversation's later exchanges
/// with `turns` (a multi-turn run's sessions; without it only the first
/// exchange is held, so a large file costs about what a run sends).
pub fn parse_with(mut reader: impl BufRead, name: &str, turns: bool) -> Result<ShareGpt, ShareGptError> {
    let read_err = |source| ShareGptError::Read { name: name.to_owned(), source };
    if reader.fill_buf().map_err(read_err)?.starts_with(b"\xEF\xBB\xBF") {
        reader.consume(3);
    }
    let mut de = serde_json::Deserializer::from_reader(reader);
    let mut found = Found::default();
    let result = (&mut de).deserialize_any(Entries { name, turns, out: &mut found });
    let result = result.and_then(|()| de.end());
    if let Err(e) = result {
        return Err(match found.kind {
            _ if e.is_io() => read_err(std::io::Error::other(e.to_string())),
            None if e.is_eof() => ShareGptError::Empty { name: name.to_owned() },
            Some(kind) if kind != "an array" => ShareGptError::NotAnArray { name: name.to_owned(), found: kind },
            _ => ShareGptError::Syntax {
                name: name.to_owned(),
                line: e.line(),
                column: e.column(),
                message: message_of(&e),
            },
        });
    }
    let data = found.data;
    if data.entries.is_empty() {
        return Err(ShareGptError::NoneUsable { name: name.to_owned(), total: data.total, skipped: data.skipped });
    }
    Ok(ShareGpt { name: name.to_owned(), ..data })
}

/// serde_json's message without its " at line L column C".
fn message_of(e: &serde_json::Error) -> String {
    let text = e.to_string();
    text.split(" at line ").next().unwrap_or(&text).to_owned()
}

#[derive(Default)]
struct Found {
    /// What the top-level value turned out to be.
    kind: Option<&'static str>,
    data: ShareGpt,
}

struct Entries<'a> {
    name: &'a str,
    turns: bool,
    out: &'a mut Found,
}

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: a JSON array of conversations", self.name)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.kind = Some("an array");
        while let Some(entry) = seq.next_element::<Value>()? {
            self.out.data.total += 1;
            match exchange(entry, self.turns) {
                Ok(e) => self.out.data.entries.push(e),
                Err(why) => why(&mut self.out.data.skipped),
            }
        }
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        self.out.kind = Some("an object");
        Err(serde::de::Error::custom("not an array"))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.out.kind = Some("a string");
        Err(E::custom("not an array"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.out.kind = Some("a number");
        Err(E::custom("not an array"))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.visit_f64(v as f64)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.visit_f64(v as f64)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.out.kind = Some("a boolean");
        Err(E::custom("not an array"))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.out.kind = Some("null");
        Err(E::custom("not an array"))
    }
}

type Reason = fn(&mut Skipped);

/// The exchange of one entry (and with `keep`, those that followed), or
/// the reason it is skipped.
fn exchange(entry: Value, keep: bool) -> Result<Exchange, Reason> {
    let Value::Object(mut entry) = entry else { return Err(|s| s.not_an_object += 1) };
    let Some(Value::Array(turns)) = entry.remove("conversations") else { return Err(|s| s.no_conversations += 1) };
    let mut turns: Vec<(String, Value)> = turns
        .into_iter()
        .map(|t| match t {
            Value::Object(mut t) => match (t.remove("from"), t.remove("value")) {
                (Some(Value::String(from)), Some(value)) => Ok((from, value)),
                _ => Err(()),
            },
            _ => Err(()),
        })
        .collect::<Result<_, ()>>()
        .map_err(|()| (|s: &mut Skipped| s.bad_turn += 1) as Reason)?;
    let human = turns.iter().position(|(from, _)| matches!(from.as_str(), "human" | "user"));
    let Some(human) = human else { return Err(|s| s.no_human_turn += 1) };
    let later = if keep && human + 2 < turns.len() { turns.split_off(human + 2) } else { Vec::new() };
    let reply = (human + 1 < turns.len()).then(|| turns.swap_remove(human + 1));
    let (_, prompt) = turns.swap_remove(human);
    let Value::String(prompt) = prompt else { return Err(|s| s.non_string_value += 1) };
    if prompt.trim().is_empty() {
        return Err(|s| s.empty_prompt += 1);
    }
    let Some((from, reply)) = reply else { return Err(|s| s.no_reply += 1) };
    if !matches!(from.as_str(), "gpt" | "assistant" | "chatgpt") {
        return Err(|s| s.reply_not_from_gpt += 1);
    }
    let Value::String(reply) = reply else { return Err(|s| s.non_string_value += 1) };
    if reply.trim().is_empty() {
        return Err(|s| s.empty_reply += 1);
    }
    Ok(Exchange { prompt, reply, more: later_exchanges(later) })
}

/// The exchanges of a conversation's later turns, in pairs of a user turn
/// and an assistant's reply, both text with more than whitespace, up to
/// the first pair that is not.
fn later_exchanges(turns: Vec<(String, Value)>) -> Vec<Exchange> {
    let mut more = Vec::new();
    let mut turns = turns.into_iter();
    while let (Some((asker, Value::String(prompt))), Some((answerer, Value::String(reply)))) =
        (turns.next(), turns.next())
    {
        let usable = matches!(asker.as_str(), "human" | "user")
            && matches!(answerer.as_str(), "gpt" | "assistant" | "chatgpt")
            && !prompt.trim().is_empty()
            && !reply.trim().is_empty();
        if !usable {
            break;
        }
        more.push(Exchange { prompt, reply, more: Vec::new() });
    }
    more
}

/// Parses a whole file held in memory.
pub fn parse_bytes(bytes: &[u8], name: &str) -> Result<ShareGpt, ShareGptError> {
    parse(bytes, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"[
        {"id": "a", "conversations": [{"from": "human", "value": "hello there you"}, {"from": "gpt", "value": "hi  friend"}]},
        {"id": "no-reply", "conversations": [{"from": "human", "value": "anyone?"}]},
        {"id": "reply-first", "conversations": [{"from": "gpt", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"id": "no-conversations"},
        {"id": "wrong-type", "conversations": "nope"},
        {"id": "empty-reply", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "why"}, {"from": "gpt", "value": "  "}]},
        {"id": "number", "conversations": [{"from": "human", "value": 42}, {"from": "gpt", "value": "x"}]},
        {"id": "user-roles", "conversations": [{"from": "user", "value": "why not"}, {"from": "assistant", "value": "because"}]},
        {"id": "two-humans", "conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]},
        {"id": "blank", "conversations": [{"from": "human", "value": "\n"}, {"from": "gpt", "value": "b"}]},
        {"id": "bad-turn", "conversations": [{"value": "a"}]},
        7
    ]"#;

    #[test]
    fn every_skipped_entry_is_counted_by_its_reason() {
        let data = parse_bytes(FILE.as_bytes(), "share.json").expect("parses");
        let used: Vec<(&str, &str)> = data.entries.iter().map(|e| (e.prompt.as_str(), e.reply.as_str())).collect();
        assert_eq!(used, [("hello there you", "hi  friend"), ("why not", "because")]);
        assert_eq!(data.total, 12);
        assert_eq!(
            data.skipped,
            Skipped {
                not_an_object: 1,
                no_conversations: 2,
                bad_turn: 1,
                no_human_turn: 1,
                non_string_value: 1,
                empty_prompt: 1,
                no_reply: 1,
                reply_not_from_gpt: 1,
                empty_reply: 1,
            }
        );
        let said = data.describe();
        assert!(said.starts_with("used 2 of 12 conversations; skipped: no conversations array 2, "), "{said}");
        assert!(said.contains("empty reply 1"), "{said}");
    }

    #[test]
    fn later_exchanges_are_kept_when_asked_up_to_the_first_that_breaks_the_rule() {
        let file = r#"[
            {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                {"from": "user", "value": "c"}, {"from": "assistant", "value": "d"}, {"from": "human", "value": "e"},
                {"from": "gpt", "value": " "}, {"from": "human", "value": "f"}, {"from": "gpt", "value": "g"}]},
            {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}, {"from": "human", "value": "z"}]},
            {"conversations": [{"from": "human", "value": "p"}, {"from": "gpt", "value": "q"}, {"from": "gpt", "value": "r"}, {"from": "gpt", "value": "t"}]}
        ]"#;
        let pairs = |e: &Exchange| -> Vec<(String, String)> {
            std::iter::once(e).chain(&e.more).map(|x| (x.prompt.clone(), x.reply.clone())).collect()
        };
        let kept = parse_with(file.as_bytes(), "s.json", true).expect("parses");
        let got: Vec<Vec<(String, String)>> = kept.entries.iter().map(pairs).collect();
        let own = |v: &[(&str, &str)]| v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<Vec<_>>();
        assert_eq!(got, [own(&[("a", "b"), ("c", "d")]), own(&[("x", "y")]), own(&[("p", "q")])]);
        assert_eq!(kept.entries.iter().map(Exchange::turns).collect::<Vec<_>>(), [2, 1, 1]);
        // Without it, each entry is its first exchange alone, as before.
        let first = parse(file.as_bytes(), "s.json").expect("parses");
        assert!(first.entries.iter().all(|e| e.more.is_empty()));
        assert_eq!(first.entries[0].prompt, "a");
    }

    #[test]
    fn files_that_are_no_dataset_say_what_they_are() {
        let check = |bytes: &[u8], expected: &str| {
            let e = parse_bytes(bytes, "data/share.json").expect_err("refused");
            assert_eq!(e.to_string(), expected);
        };
        check(b"", "the ShareGPT file data/share.json is empty");
        check(b"  \n ", "the ShareGPT file data/share.json is empty");
        check(b"{\"a\": 1}", "the ShareGPT file data/share.json is not a JSON array of conversations: it is an object");
        check(b"\"x\"", "the ShareGPT file data/share.json is not a JSON array of conversations: it is a string");
        check(b"[]", "the ShareGPT file data/share.json has no usable conversation: the array is empty");
        check(
            b"[{\"conversations\": []}]",
            "the ShareGPT file data/share.json has no usable conversation: all 1 skipped (no human turn 1); \
             each needs a human turn followed by a gpt reply",
        );
        check(
            b"[\n{\"conversations\": [}\n]",
            "the ShareGPT file data/share.json is not valid JSON at line 2, column 20: expected value",
        );
        check(
            b"[1] [2]",
            "the ShareGPT file data/share.json is not valid JSON at line 1, column 5: trailing characters",
        );
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let with_bom = [b"\xEF\xBB\xBF".as_slice(), FILE.as_bytes()].concat();
        assert_eq!(parse_bytes(&with_bom, "s").expect("parses").entries.len(), 2);
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = read(Path::new("/nonexistent/share.json"), "share.json").expect_err("refused");
        assert_eq!(e.to_string(), "cannot read the ShareGPT file share.json");
        assert!(std::error::Error::source(&e).is_some(), "the reason is the source");
    }
}
