//! What each request asks for: random prompts of exact lengths, prompts
//! that share prefixes, or the conversations of a ShareGPT file.
//!
//! Token counts come from the model's `tokenizer.json` (the `--processor`)
//! when one is given; without one, one whitespace-separated word counts as one
//! token, as the simulated engine counts them. Prompts come from a seeded
//! ChaCha generator, so one seed gives the same prompts on every machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use benchfleet_core::sharegpt::{ShareGpt, ShareGptError};
use benchfleet_core::trace::{BLOCK_TOKENS, Trace, TraceError, TraceFormat, TraceRequest};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::session::{Session, UserTurn};

/// The prompts of a load run.
#[derive(Clone, Debug)]
pub enum Dataset {
    /// Prompts of exactly `input_tokens` words drawn from a seed; every
    /// response is asked for exactly `output_tokens` tokens (`ignore_eos`).
    Random { input_tokens: u32, output_tokens: u32, seed: u64 },
    /// The usable exchanges of a ShareGPT file (`benchfleet_core::sharegpt`
    /// says which), shuffled by `shuffle`'s seed as vLLM's bench does, or in
    /// file order without one; cycled in that order when there are fewer
    /// than requests. `output_tokens` overrides the length of the recorded
    /// reply. With `sessions` (a think time), each conversation is a
    /// multi-turn session of its exchanges (`crate::session`; read with
    /// its later exchanges kept), taken in that order until their turns
    /// make the requests, the last one cut short.
    ShareGpt { data: ShareGpt, output_tokens: Option<u32>, shuffle: Option<u64>, sessions: Option<std::time::Duration> },
    /// Random prompts whose lengths spread around a mean.
    RandomSpread { input: Lengths, output: Lengths, seed: u64 },
    /// `groups` prefixes of `prefix_tokens` each; request i uses prefix
    /// i mod groups, followed by its own `suffix_tokens`: for prefix caching.
    SharedPrefix { groups: u32, prefix_tokens: u32, suffix_tokens: u32, output_tokens: u32, seed: u64 },
    /// A request trace (`benchfleet_core::trace`), sent on its own schedule
    /// `speed` times as fast as recorded: request i is the trace's i-th in
    /// time order. Its prompts are its own where it has them; otherwise
    /// each hash id is a block of 512 tokens made from the id alone (the
    /// same block wherever the id appears, in any run), and tokens past
    /// the blocks are the request's own. Every reply runs to the trace's
    /// output length.
    Trace { trace: Arc<Trace>, speed: f64 },
    /// Multi-turn sessions (`crate::session`) of `turns` user turns of
    /// `user_tokens` words each drawn from a seed, each reply asked for
    /// exactly `output_tokens`, the next turn sent `think_time` after the
    /// reply; `n` requests make `ceil(n / turns)` sessions, the last one
    /// shorter where `turns` does not divide `n`.
    MultiTurn { turns: u32, user_tokens: u32, output_tokens: u32, think_time: std::time::Duration, seed: u64 },
}

impl Dataset {
    /// The sessions `n` requests make, for a multi-turn dataset: the run's
    /// schedule is of their first turns.
    pub fn sessions(&self, n: usize) -> Option<usize> {
        match self {
            Dataset::MultiTurn { turns, .. } => Some(crate::session::sessions_for(n, *turns)),
            Dataset::ShareGpt { data, shuffle, sessions: Some(_), .. } => {
                Some(sharegpt_sessions(data, &sharegpt_order(data, *shuffle), n))
            }
            _ => None,
        }
    }

    /// The send times of its first `n` requests, when the dataset has a
    /// schedule of its own (a trace).
    pub fn send_times(&self, n: usize) -> Option<Vec<std::time::Duration>> {
        match self {
            Dataset::Trace { trace, speed } => Some(trace.send_times(n, *speed)),
            _ => None,
        }
    }
}

/// Lengths drawn from a normal distribution, rounded, clamped to
/// `min..=max`; a `std` of 0 gives exactly `mean`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    pub mean: u32,
    pub std: f64,
    pub min: u32,
    pub max: u32,
}

impl Lengths {
    /// Exactly `n` every time.
    pub fn exact(n: u32) -> Lengths {
        Lengths { mean: n, std: 0.0, min: n, max: n }
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> u32 {
        if self.std <= 0.0 {
            return self.mean.clamp(self.min, self.max.max(self.min));
        }
        // Box-Muller; ChaCha and these operations are the same on every
        // platform, so a seed gives the same lengths everywhere.
        let (u1, u2): (f64, f64) = (rng.random(), rng.random());
        let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let n = (f64::from(self.mean) + self.std * z).round();
        (n.max(0.0) as u32).clamp(self.min, self.max.max(self.min))
    }
}

/// How tokens are counted: the model's tokenizer, or one word per token.
#[derive(Clone, Debug, Default)]
pub enum TokenCounter {
    #[default]
    Words,
    Tokenizer(Arc<Model>),
}

/// A model's tokenizer, and the words that build its random prompts.
#[derive(Debug)]
pub struct Model {
    tokenizer: tokenizers::Tokenizer,
    /// Vocabulary entries that are a space and a short ASCII word, each one
    /// token alone and, as checked at load, in any sequence: a prompt of n
    /// of them is n tokens with no encoding. `None` when the tokenizer has
    /// too few or does not keep them apart (its pre-tokenizer does not split
    /// on spaces): prompts are then made by decoding random ids and encoding
    /// again until the count is exact, which costs far more.
    pieces: Option<Vec<String>>,
}

/// The most words kept for building prompts, and the fewest worth it.
const MAX_PIECES: usize = 4096;
const MIN_PIECES: usize = 64;

impl TokenCounter {
    /// Loads `tokenizer.json` from `path`: the file itself, or a model
    /// directory that holds one.
    pub fn load(path: &Path) -> Result<TokenCounter, DatasetError> {
        let file: PathBuf = if path.is_dir() { path.join("tokenizer.json") } else { path.to_owned() };
        let tokenizer = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| DatasetError::Tokenizer { path: file.display().to_string(), reason: e.to_string() })?;
        let pieces = word_pieces(&tokenizer);
        if pieces.is_none() {
            tracing::info!(
                tokenizer = %file.display(),
                "random prompts are built by decoding and encoding again: this tokenizer does not keep words apart"
            );
        }
        Ok(TokenCounter::Tokenizer(Arc::new(Model { tokenizer, pieces })))
    }

    /// The same tokenizer, building random prompts the slow way (decoding
    /// random ids, encoding again until the count is exact): what the fast
    /// way is measured and tested against.
    pub fn without_word_pieces(&self) -> TokenCounter {
        match self {
            TokenCounter::Words => TokenCounter::Words,
            TokenCounter::Tokenizer(m) => {
                TokenCounter::Tokenizer(Arc::new(Model { tokenizer: m.tokenizer.clone(), pieces: None }))
            }
        }
    }

    /// Whether random prompts are built from word pieces, with no encoding.
    pub fn has_word_pieces(&self) -> bool {
        matches!(self, TokenCounter::Tokenizer(m) if m.pieces.is_some())
    }

    /// Tokens in `text` (without special tokens).
    pub fn count(&self, text: &str) -> u32 {
        match self {
            TokenCounter::Words => word_count(text),
            TokenCounter::Tokenizer(m) => m
                .tokenizer
                .encode_fast(text, false)
                .map_or_else(|_| word_count(text), |e| u32::try_from(e.len()).unwrap_or(u32::MAX)),
        }
    }

    /// Whether replies must be kept to count their tokens.
    pub(crate) fn needs_text(&self) -> bool {
        matches!(self, TokenCounter::Tokenizer(_))
    }

    /// A random text of exactly `n` tokens (as near as the tokenizer allows:
    /// a byte-level BPE may merge across a boundary), and its count when it
    /// is known without encoding it. Texts built of word pieces begin with
    /// a space, and two of them joined are still exact.
    fn random_text(&self, n: u32, rng: &mut ChaCha8Rng) -> (String, Option<u32>) {
        match self {
            TokenCounter::Words => {
                let words: Vec<&str> = (0..n).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect();
                (words.join(" "), Some(n))
            }
            TokenCounter::Tokenizer(m) if let Some(pieces) = &m.pieces => {
                let mut text = String::with_capacity(n as usize * 8);
                for _ in 0..n {
                    text.push_str(&pieces[rng.random_range(0..pieces.len())]);
                }
                (text, Some(n))
            }
            TokenCounter::Tokenizer(m) => {
                let t = &m.tokenizer;
                let vocab = u32::try_from(t.get_vocab_size(false)).unwrap_or(u32::MAX).max(1);
                let target = n as usize;
                let mut ids: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab)).collect();
                let mut text = String::new();
                // Decoding and encoding again does not always give back the
                // same ids: trim or top up until the count is exact.
                for _ in 0..16 {
                    text = t.decode(&ids, true).unwrap_or_default();
                    let again = t.encode_fast(text.as_str(), false).map(|e| e.get_ids().to_vec()).unwrap_or_default();
                    if again.len() == target {
                        break;
                    }
                    ids = again;
                    if ids.len() > target {
                        ids.truncate(target);
                    } else {
                        ids.extend((ids.len()..target).map(|_| rng.random_range(0..vocab)));
                    }
                }
                (text, None)
            }
        }
    }

    /// Joins a shared prefix and a suffix as `random_text` made them.
    fn join(&self, prefix: &str, suffix: &str) -> String {
        if self.has_word_pieces() { format!("{prefix}{suffix}") } else { format!("{prefix} {suffix}") }
    }
}

/// The vocabulary's entries that are a space and 2 to 12 ASCII letters and
/// encode alone to themselves, in id order (at most `MAX_PIECES`); `None`
/// unless random sequences of them, checked here, always encode to one
/// token each (true of byte-level BPEs, whose pre-tokenizer splits words
/// apart, as GPT-2's, Llama 3's and Qwen's do).
fn word_pieces(t: &tokenizers::Tokenizer) -> Option<Vec<String>> {
    let mut ids: Vec<u32> = t.get_vocab(false).into_values().collect();
    ids.sort_unstable();
    let mut pieces = Vec::new();
    for id in ids {
        let Ok(text) = t.decode(&[id], false) else { continue };
        let Some(word) = text.strip_prefix(' ') else { continue };
        if !(2..=12).contains(&word.len()) || !word.bytes().all(|b| b.is_ascii_alphabetic()) {
            continue;
        }
        if t.encode_fast(text.as_str(), false).ok().is_none_or(|e| e.get_ids() != [id]) {
            continue;
        }
        pieces.push(text);
        if pieces.len() == MAX_PIECES {
            break;
        }
    }
    if pieces.len() < MIN_PIECES {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    for n in [1usize, 2, 3, 17, 100, 1000, 4000] {
        for _ in 0..4 {
            let chosen: Vec<u32> = (0..n).map(|_| rng.random_range(0..pieces.len()) as u32).collect();
            let text: String = chosen.iter().map(|&i| pieces[i as usize].as_str()).collect();
            let again = t.encode_fast(text.as_str(), false).ok()?;
            if again.len() != n {
                return None;
            }
        }
    }
    Some(pieces)
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error(transparent)]
    ShareGpt(#[from] ShareGptError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("cannot load the tokenizer {path}: {reason}")]
    Tokenizer { path: String, reason: String },
}

/// Reads a ShareGPT file, saying what it used and skipped.
pub fn read_sharegpt(path: &Path) -> Result<ShareGpt, DatasetError> {
    read_sharegpt_with(path, false)
}

/// Reads a ShareGPT file, keeping each conversation's later exchanges with
/// `turns` (its sessions), saying what it used and skipped.
pub fn read_sharegpt_with(path: &Path, turns: bool) -> Result<ShareGpt, DatasetError> {
    let name = path.display().to_string();
    let data = benchfleet_core::sharegpt::read_with(path, &name, turns)?;
    if data.skipped.total() > 0 {
        tracing::warn!(dataset = %name, "{}", data.describe());
    } else {
        tracing::info!(dataset = %name, "{}", data.describe());
    }
    Ok(data)
}

/// Reads a request trace, saying what it holds.
pub fn read_trace(path: &Path, format: TraceFormat) -> Result<Trace, DatasetError> {
    let name = path.display().to_string();
    let trace = benchfleet_core::trace::read(path, &name, format)?;
    tracing::info!(
        trace = %name,
        requests = trace.requests.len(),
        span_s = trace.span_ms() / 1e3,
        block_reuse = trace.block_reuse(trace.requests.len()),
        "trace read"
    );
    Ok(trace)
}

/// The prompt of a trace request without one: its hash ids' blocks, each
/// made from the id alone (ChaCha stream 0), then tokens of its own from
/// its line (stream 1), and its token count.
fn trace_prompt(r: &TraceRequest, counter: &TokenCounter) -> (String, u32) {
    let mut text = String::new();
    let (mut left, mut exact, mut known) = (r.input_tokens, true, 0u32);
    let mut add = |n: u32, rng: &mut ChaCha8Rng, text: &mut String| {
        let (part, count) = counter.random_text(n, rng);
        // As `join` joins them.
        if !text.is_empty() && !counter.has_word_pieces() {
            text.push(' ');
        }
        text.push_str(&part);
        match count {
            Some(c) => known += c,
            None => exact = false,
        }
    };
    for id in &r.hash_ids {
        let n = left.min(BLOCK_TOKENS);
        if n == 0 {
            break;
        }
        add(n, &mut ChaCha8Rng::seed_from_u64(*id), &mut text);
        left -= n;
    }
    if left > 0 {
        let mut own = ChaCha8Rng::seed_from_u64(r.line as u64);
        own.set_stream(1);
        add(left, &mut own, &mut text);
    }
    // Words joined by spaces, or word pieces, keep their counts.
    let tokens =
        if exact && (counter.has_word_pieces() || !counter.needs_text()) { known } else { counter.count(&text) };
    (text, tokens)
}

pub(crate) fn word_count(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

/// One request's prompt and the reply length it asks for.
#[derive(Debug)]
pub(crate) struct Prompt {
    pub text: String,
    /// Tokens in the prompt: its count when the server gives no usage.
    pub tokens: u32,
    pub max_tokens: u32,
    /// Ask the server to generate exactly `max_tokens`.
    pub ignore_eos: bool,
    /// The session whose first turn it is, for a multi-turn dataset.
    pub session: Option<Box<Session>>,
}

/// Short common words, so that prompts look like text to a tokenizer.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he",
    "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
    "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "time", "people", "water", "light", "river", "stone", "cloud", "engine", "paper", "garden", "market", "window",
    "number", "story", "music", "field",
];

/// The order a ShareGPT file's conversations are sent in: shuffled by the
/// seed, as vLLM's bench does, or the file's.
fn sharegpt_order(data: &ShareGpt, shuffle: Option<u64>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..data.entries.len()).collect();
    if let Some(seed) = shuffle {
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    }
    order
}

/// The first turn of session `id` of the user turns `user`, the session
/// travelling with it.
fn session_prompt(id: u64, user: Vec<UserTurn>, think: std::time::Duration) -> Prompt {
    let (session, first) = Session::new(id, user, think);
    Prompt {
        text: first.text,
        tokens: first.tokens,
        max_tokens: first.max_tokens,
        ignore_eos: first.ignore_eos,
        session: Some(Box::new(session)),
    }
}

/// How many of a ShareGPT file's conversations, taken in `order` (and
/// again from its start), make `n` turns: the last may be cut short.
fn sharegpt_sessions(data: &ShareGpt, order: &[usize], n: usize) -> usize {
    let mut turns = 0;
    order
        .iter()
        .cycle()
        .take_while(|&&i| {
            let more = turns < n;
            turns += data.entries[i].turns();
            more
        })
        .count()
}

/// The text of the prompts a run of `n` requests of `dataset` sends, in
/// order: what a seed decides.
pub fn prompt_texts(dataset: &Dataset, n: usize, counter: &TokenCounter) -> Vec<String> {
    prompt_iter(dataset.clone(), n, counter.clone()).map(|p| p.text).collect()
}

/// The prompts of `n` requests, their tokens counted by `counter`.
#[cfg(test)]
pub(crate) fn prompts(dataset: &Dataset, n: usize, counter: &TokenCounter) -> Vec<Prompt> {
    prompt_iter(dataset.clone(), n, counter.clone()).collect()
}

/// The prompts of `n` requests, made one at a time as they are taken (a
/// run of a million requests does not hold them all), their tokens counted
/// by `counter`. Its size hint is exact. For a multi-turn dataset, the
/// first turns of the sessions the `n` requests make.
pub(crate) fn prompt_iter(
    dataset: Dataset,
    n: usize,
    counter: TokenCounter,
) -> Box<dyn Iterator<Item = Prompt> + Send> {
    let random = |input: Lengths,
                  output: Lengths,
                  seed: u64,
                  counter: TokenCounter|
     -> Box<dyn Iterator<Item = Prompt> + Send> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        Box::new((0..n).map(move |_| {
            let (input, output) = (input.draw(&mut rng), output.draw(&mut rng));
            let (text, known) = counter.random_text(input, &mut rng);
            let tokens = known.unwrap_or_else(|| counter.count(&text));
            Prompt { tokens, text, max_tokens: output.max(1), ignore_eos: true, session: None }
        }))
    };
    match dataset {
        Dataset::Random { input_tokens, output_tokens, seed } => {
            random(Lengths::exact(input_tokens), Lengths::exact(output_tokens), seed, counter)
        }
        Dataset::RandomSpread { input, output, seed } => random(input, output, seed, counter),
        Dataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let prefixes: Vec<(String, Option<u32>)> =
                (0..groups.max(1)).map(|_| counter.random_text(prefix_tokens, &mut rng)).collect();
            Box::new((0..n).map(move |i| {
                let (suffix, known_suffix) = counter.random_text(suffix_tokens, &mut rng);
                let (prefix, known_prefix) = &prefixes[i % prefixes.len()];
                let text = counter.join(prefix, &suffix);
                let tokens = match (known_prefix, known_suffix) {
                    (Some(p), Some(s)) if counter.has_word_pieces() => p + s,
                    _ => counter.count(&text),
                };
                Prompt { tokens, text, max_tokens: output_tokens.max(1), ignore_eos: true, session: None }
            }))
        }
        Dataset::ShareGpt { data, output_tokens, shuffle, sessions: Some(think) } => {
            let order = sharegpt_order(&data, shuffle);
            let count = sharegpt_sessions(&data, &order, n);
            let mut left = n;
            let mut next = order.into_iter().cycle();
            Box::new((0..count as u64).map(move |id| {
                let i = next.next().expect("a conversation: there are some, cycled");
                let e = &data.entries[i];
                let user: Vec<UserTurn> = std::iter::once(e)
                    .chain(&e.more)
                    .take(left)
                    .map(|x| UserTurn {
                        text: x.prompt.clone(),
                        tokens: counter.count(&x.prompt),
                        max_tokens: output_tokens.unwrap_or_else(|| counter.count(&x.reply).max(1)),
                        ignore_eos: output_tokens.is_some(),
                    })
                    .collect();
                left -= user.len();
                session_prompt(id, user, think)
            }))
        }
        Dataset::ShareGpt { data, output_tokens, shuffle, sessions: None } => {
            let order = sharegpt_order(&data, shuffle);
            // Each entry is counted once, however often it is reused.
            let mut counted: Vec<Option<(u32, u32)>> = vec![None; data.entries.len()];
            let n = if order.is_empty() { 0 } else { n };
            Box::new((0..n).map(move |k| {
                let i = order[k % order.len()];
                let e = &data.entries[i];
                let (tokens, max_tokens) = *counted[i].get_or_insert_with(|| {
                    let reply = output_tokens.unwrap_or_else(|| counter.count(&e.reply).max(1));
                    (counter.count(&e.prompt), reply)
                });
                Prompt {
                    text: e.prompt.clone(),
                    tokens,
                    max_tokens,
                    ignore_eos: output_tokens.is_some(),
                    session: None,
                }
            }))
        }
        Dataset::Trace { trace, .. } => {
            let n = n.min(trace.requests.len());
            Box::new((0..n).map(move |i| {
                let r = &trace.requests[i];
                let (text, tokens) = match &r.prompt {
                    Some(p) => (p.clone(), counter.count(p)),
                    None => trace_prompt(r, &counter),
                };
                Prompt { text, tokens, max_tokens: r.output_tokens, ignore_eos: true, session: None }
            }))
        }
        Dataset::MultiTurn { turns, user_tokens, output_tokens, think_time, seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let turns = turns.max(1) as usize;
            let sessions = crate::session::sessions_for(n, turns as u32);
            Box::new((0..sessions).map(move |i| {
                let these = turns.min(n - i * turns);
                let user: Vec<UserTurn> = (0..these)
                    .map(|_| {
                        let (text, known) = counter.random_text(user_tokens, &mut rng);
                        let tokens = known.unwrap_or_else(|| counter.count(&text));
                        UserTurn { text, tokens, max_tokens: output_tokens.max(1), ignore_eos: true }
                    })
                    .collect();
                session_prompt(i as u64, user, think_time)
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_prompts_have_exact_lengths_and_follow_the_seed() {
        let d = |seed| Dataset::Random { input_tokens: 37, output_tokens: 5, seed };
        let w = TokenCounter::Words;
        let a = prompts(&d(1), 3, &w);
        assert!(a.iter().all(|p| word_count(&p.text) == 37 && p.tokens == 37 && p.max_tokens == 5 && p.ignore_eos));
        assert_ne!(a[0].text, a[1].text, "each request gets its own prompt");
        assert_eq!(a[2].text, prompts(&d(1), 3, &w)[2].text);
        assert_ne!(a[0].text, prompts(&d(2), 1, &w)[0].text);
    }

    const SHAREGPT: &str = r#"[
        {"id": "a", "conversations": [{"from": "human", "value": "hello there you"}, {"from": "gpt", "value": "hi  friend"}]},
        {"id": "no-reply", "conversations": [{"from": "human", "value": "anyone?"}]},
        {"id": "b", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "why"}, {"from": "gpt", "value": "because"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "one more"}, {"from": "gpt", "value": "a b c"}]}
    ]"#;

    fn sharegpt() -> ShareGpt {
        benchfleet_core::sharegpt::parse_bytes(SHAREGPT.as_bytes(), "test.json").expect("parses")
    }

    #[test]
    fn sharegpt_prompts_cycle_and_take_the_override() {
        let data = sharegpt();
        let d = Dataset::ShareGpt { data: data.clone(), output_tokens: None, shuffle: None, sessions: None };
        let cycled = prompts(&d, 4, &TokenCounter::Words);
        let got: Vec<(&str, u32, u32)> = cycled.iter().map(|p| (p.text.as_str(), p.tokens, p.max_tokens)).collect();
        assert_eq!(got, [("hello there you", 3, 2), ("why", 1, 1), ("one more", 2, 3), ("hello there you", 3, 2)]);
        let fixed = prompts(
            &Dataset::ShareGpt { data, output_tokens: Some(9), shuffle: None, sessions: None },
            2,
            &TokenCounter::Words,
        );
        assert!(fixed.iter().all(|p| p.max_tokens == 9 && p.ignore_eos));
    }

    /// Each conversation is a session of its exchanges, in the file's order
    /// (cycled), until their turns make the requests: the last one cut.
    #[test]
    fn sharegpt_sessions_take_whole_conversations_until_the_requests_are_made() {
        let file = r#"[
            {"conversations": [{"from": "human", "value": "a b"}, {"from": "gpt", "value": "c"},
                {"from": "human", "value": "d"}, {"from": "gpt", "value": "e f g"}]},
            {"conversations": [{"from": "human", "value": "h"}, {"from": "gpt", "value": "i j"}]}
        ]"#;
        let data = benchfleet_core::sharegpt::parse_with(file.as_bytes(), "s.json", true).expect("parses");
        let think = std::time::Duration::from_millis(7);
        let d = Dataset::ShareGpt { data, output_tokens: None, shuffle: None, sessions: Some(think) };
        // 2 + 1 + 2 turns, and 1 of the next conversation's 2.
        assert_eq!(d.sessions(6), Some(4));
        assert_eq!(d.sessions(5), Some(3));
        let firsts = prompts(&d, 6, &TokenCounter::Words);
        let got: Vec<(&str, u32, u32, u64, bool)> = firsts
            .iter()
            .map(|p| {
                let s = p.session.as_ref().expect("a session");
                (p.text.as_str(), p.tokens, p.max_tokens, s.id, s.continues())
            })
            .collect();
        assert_eq!(
            got,
            [("a b", 2, 1, 0, true), ("h", 1, 2, 1, false), ("a b", 2, 1, 2, true), ("h", 1, 2, 3, false)],
            "the first conversation again is cut to the one turn left"
        );
        let extra = serde_json::Map::new();
        let options = crate::client::BodyOptions {
            endpoint: crate::client::Endpoint::Chat,
            model: "m",
            stream: true,
            extra: &extra,
        };
        let mut first = firsts.into_iter().next().and_then(|p| p.session).expect("session 0");
        let record = crate::session::tests::record(true, 2, 1, 10);
        let (next, due) = first.next(&options, &record, Some("served".into())).expect("turn 2");
        // The recorded reply's length is the turn's max_tokens, as for one exchange.
        assert_eq!((next.max_tokens, due), (3, 10 + 7_000_000));
        let body: serde_json::Value = serde_json::from_slice(&next.body).expect("json");
        assert_eq!(body["messages"][1]["content"], "served", "the reply the server gave, not the file's");
        assert_eq!(body["messages"][2]["content"], "d");
    }

    #[test]
    fn sharegpt_prompts_are_shuffled_by_the_seed() {
        let texts = |shuffle| {
            let d = Dataset::ShareGpt { data: sharegpt(), output_tokens: None, shuffle, sessions: None };
            prompt_texts(&d, 6, &TokenCounter::Words)
        };
        let seeds: Vec<Vec<String>> = (0..8).map(|s| texts(Some(s))).collect();
        // Each order holds every exchange once before any repeats.
        for order in &seeds {
            let mut first: Vec<&String> = order[..3].iter().collect();
            first.sort();
            assert_eq!(first, ["hello there you", "one more", "why"]);
            assert_eq!(order[..3], order[3..], "cycled in the same order");
        }
        assert_eq!(texts(Some(3)), seeds[3], "a seed gives one order");
        assert!(seeds.iter().any(|o| o[..3] != seeds[0][..3]), "seeds give different orders");
    }

    #[test]
    fn asking_for_more_prompts_than_the_file_has_says_how_they_are_reused() {
        let data = sharegpt();
        assert_eq!(data.reuse(3), None);
        let said = data.reuse(7).expect("a warning");
        assert_eq!(
            said,
            "7 prompts asked of test.json, which has 3 usable conversations: each is sent 2 or 3 times, in the same order"
        );
        assert!(data.reuse(6).expect("a warning").contains("each is sent 2 times"));
    }

    fn fixture_tokenizer() -> TokenCounter {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        TokenCounter::load(&path).expect("the fixture tokenizer loads")
    }

    fn bpe_tokenizer() -> TokenCounter {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bpe/tokenizer.json");
        TokenCounter::load(&path).expect("the BPE fixture loads")
    }

    #[test]
    fn a_byte_level_bpe_builds_prompts_from_word_pieces_of_exact_counts() {
        let t = bpe_tokenizer();
        assert!(t.has_word_pieces());
        for n in [1, 2, 7, 128, 1024, 5000] {
            let d = Dataset::Random { input_tokens: n, output_tokens: 3, seed: u64::from(n) };
            let a = prompts(&d, 5, &t);
            for p in &a {
                assert_eq!((t.count(&p.text), p.tokens), (n, n), "{}", p.text);
            }
            let again = prompts(&d, 5, &t);
            assert_eq!(
                a.iter().map(|p| &p.text).collect::<Vec<_>>(),
                again.iter().map(|p| &p.text).collect::<Vec<_>>()
            );
            let other = prompts(&Dataset::Random { input_tokens: n, output_tokens: 3, seed: 99 }, 5, &t);
            assert_ne!(a[0].text, other[0].text, "another seed, other prompts");
        }
        // Prefixes and suffixes joined stay exact, and the prefixes shared.
        let d = Dataset::SharedPrefix { groups: 3, prefix_tokens: 200, suffix_tokens: 31, output_tokens: 4, seed: 2 };
        let ps = prompts(&d, 9, &t);
        for p in &ps {
            assert_eq!((t.count(&p.text), p.tokens), (231, 231), "{}", p.text);
        }
        assert!(ps[3].text.starts_with(&ps[0].text[..200]));

        // The slow way comes near (a byte-level BPE merges across the ids'
        // boundaries: decoding and encoding again need not settle on the
        // count), and records the count it reached.
        let slow = t.without_word_pieces();
        assert!(!slow.has_word_pieces());
        let d = Dataset::Random { input_tokens: 64, output_tokens: 3, seed: 1 };
        for p in prompts(&d, 3, &slow) {
            assert_eq!(slow.count(&p.text), p.tokens, "{}", p.text);
            assert!(p.tokens.abs_diff(64) <= 4, "{} tokens: {}", p.tokens, p.text);
        }
    }

    #[test]
    fn tokenizer_prompts_have_exact_token_counts_and_follow_the_seed() {
        let t = fixture_tokenizer();
        // A word-level tokenizer has no space-led words: the slow way.
        assert!(!t.has_word_pieces());
        assert_eq!(t.count("hello world of water"), 4);
        let d = Dataset::Random { input_tokens: 50, output_tokens: 7, seed: 5 };
        let a = prompts(&d, 4, &t);
        for p in &a {
            assert_eq!((t.count(&p.text), p.tokens, p.max_tokens), (50, 50, 7), "{}", p.text);
        }
        let again = prompts(&d, 4, &t);
        assert_eq!(a.iter().map(|p| &p.text).collect::<Vec<_>>(), again.iter().map(|p| &p.text).collect::<Vec<_>>());
    }

    #[test]
    fn spread_lengths_stay_in_range_and_prefixes_are_shared() {
        let input = Lengths { mean: 100, std: 30.0, min: 60, max: 140 };
        let d = Dataset::RandomSpread { input, output: Lengths::exact(3), seed: 1 };
        let lens: Vec<u32> = prompts(&d, 200, &TokenCounter::Words).iter().map(|p| p.tokens).collect();
        assert!(lens.iter().all(|&n| (60..=140).contains(&n)));
        let mean = lens.iter().map(|&n| f64::from(n)).sum::<f64>() / 200.0;
        assert!((mean - 100.0).abs() < 6.0, "mean {mean}");
        assert!(lens.iter().any(|&n| n != lens[0]), "lengths spread");

        let d = Dataset::SharedPrefix { groups: 3, prefix_tokens: 20, suffix_tokens: 5, output_tokens: 4, seed: 2 };
        let p = prompts(&d, 6, &TokenCounter::Words);
        assert!(p.iter().all(|p| p.tokens == 25 && p.max_tokens == 4));
        let prefix = |i: usize| p[i].text.split(' ').take(20).collect::<Vec<_>>().join(" ");
        assert_eq!(prefix(0), prefix(3));
        assert_ne!(prefix(0), prefix(1));
        assert_ne!(p[0].text, p[3].text, "suffixes differ");
    }

    fn trace(text: &str, format: TraceFormat) -> Dataset {
        let trace = benchfleet_core::trace::parse(text.as_bytes(), "t.jsonl", format).expect("parses");
        Dataset::Trace { trace: Arc::new(trace), speed: 2.0 }
    }

    const MOONCAKE: &str = concat!(
        r#"{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]}"#,
        "\n",
        r#"{"timestamp": 40, "input_length": 600, "output_length": 3, "hash_ids": [7, 10]}"#,
        "\n",
        r#"{"timestamp": 90, "input_length": 700, "output_length": 2, "hash_ids": [7]}"#,
        "\n",
    );

    #[test]
    fn a_trace_builds_shared_blocks_from_its_hash_ids_on_its_own_schedule() {
        for counter in [TokenCounter::Words, bpe_tokenizer()] {
            let d = trace(MOONCAKE, TraceFormat::Mooncake);
            let p = prompts(&d, 3, &counter);
            let lens: Vec<(u32, u32, bool)> = p.iter().map(|p| (p.tokens, p.max_tokens, p.ignore_eos)).collect();
            assert_eq!(lens, [(1100, 5, true), (600, 3, true), (700, 2, true)]);
            for q in &p {
                assert_eq!(counter.count(&q.text), q.tokens, "exact counts");
            }
            // Block 7 opens all three prompts; the second's 88 tokens of
            // block 10 are its own; the third's 188 past its one block are
            // its own.
            let words = |i: usize, from: usize, to: usize| -> String {
                let all: Vec<&str> = p[i].text.split_whitespace().collect();
                all[from..to].join(" ")
            };
            assert_eq!(words(0, 0, 512), words(1, 0, 512));
            assert_eq!(words(0, 0, 512), words(2, 0, 512));
            assert_ne!(words(0, 512, 600), words(1, 512, 600), "blocks 8 and 10 differ");
            assert_ne!(words(1, 512, 600), words(2, 512, 600), "the third's own tokens");
            // The same ids give the same text in any run; a partial block is
            // the start of the whole one.
            let again = prompts(&trace(MOONCAKE, TraceFormat::Mooncake), 3, &counter);
            assert_eq!(p[1].text, again[1].text);
            let short = trace(
                r#"{"timestamp": 5, "input_length": 100, "output_length": 1, "hash_ids": [8]}"#,
                TraceFormat::Mooncake,
            );
            assert_eq!(
                prompts(&short, 1, &counter)[0].text.split_whitespace().collect::<Vec<_>>().join(" "),
                words(0, 512, 612)
            );
        }
        let d = trace(MOONCAKE, TraceFormat::Mooncake);
        assert_eq!(d.send_times(3), Some([0, 20, 45].map(std::time::Duration::from_millis).to_vec()));
        assert_eq!(prompts(&d, 2, &TokenCounter::Words).len(), 2, "the first requests");
        assert_eq!(Dataset::Random { input_tokens: 1, output_tokens: 1, seed: 1 }.send_times(3), None);
    }

    #[test]
    fn a_jsonl_trace_sends_its_own_prompts() {
        let d = trace(
            concat!(
                r#"{"timestamp": 10, "prompt": "why is the sky blue", "output_length": 4}"#,
                "\n",
                r#"{"timestamp": 12, "input_length": 9, "output_length": 1}"#,
            ),
            TraceFormat::Jsonl,
        );
        let p = prompts(&d, 2, &TokenCounter::Words);
        assert_eq!((p[0].text.as_str(), p[0].tokens, p[0].max_tokens), ("why is the sky blue", 5, 4));
        assert_eq!((word_count(&p[1].text), p[1].tokens), (9, 9));
    }

    #[test]
    fn a_sharegpt_file_is_read_from_disk_and_errors_name_it() {
        let dir = std::env::temp_dir().join(format!("loadgen-sharegpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("share.json");
        std::fs::write(&path, SHAREGPT).expect("write");
        let data = read_sharegpt(&path).expect("reads");
        assert_eq!((data.entries.len(), data.skipped.no_reply), (3, 1));
        std::fs::write(&path, "{not json").expect("write");
        let e = read_sharegpt(&path).expect_err("refused");
        assert!(e.to_string().contains(&format!("{} is not", path.display())), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
