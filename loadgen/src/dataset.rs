//! What each request asks for: random prompts of exact lengths, or the
//! conversations of a ShareGPT file.
//!
//! Until a tokenizer exists, one whitespace-separated word counts as one
//! token, as the simulated engine counts them.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

/// The prompts of a load run.
#[derive(Clone, Debug)]
pub enum Dataset {
    /// Prompts of exactly `input_tokens` words drawn from a seed; every
    /// response is asked for exactly `output_tokens` tokens (`ignore_eos`).
    Random { input_tokens: u32, output_tokens: u32, seed: u64 },
    /// The first exchange of each conversation, in file order, cycled when
    /// there are fewer entries than requests. `output_tokens` overrides the
    /// length of the recorded reply.
    ShareGpt { data: ShareGpt, output_tokens: Option<u32> },
}

/// The usable entries of a ShareGPT file.
#[derive(Clone, Debug)]
pub struct ShareGpt {
    /// The file's name, for messages.
    pub name: String,
    pub entries: Vec<ShareGptEntry>,
    /// Entries without a human turn followed by a reply.
    pub skipped: usize,
}

/// One usable ShareGPT exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGptEntry {
    /// The first human turn.
    pub prompt: String,
    /// Words in the reply that followed it, at least 1.
    pub output_tokens: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read dataset {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("dataset {name} is not a ShareGPT JSON array of conversations")]
    Parse {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "dataset {name} has no usable conversation ({skipped} skipped: each needs a human turn followed by a gpt reply)"
    )]
    Empty { name: String, skipped: usize },
}

/// Parses a ShareGPT file's bytes (`name` is only for messages). Broken
/// entries are skipped and counted, with a warning.
pub fn load_sharegpt(bytes: &[u8], name: &str) -> Result<ShareGpt, DatasetError> {
    let raw: Vec<RawEntry> =
        serde_json::from_slice(bytes).map_err(|source| DatasetError::Parse { name: name.to_owned(), source })?;
    let total = raw.len();
    let entries: Vec<ShareGptEntry> = raw.into_iter().filter_map(RawEntry::exchange).collect();
    let skipped = total - entries.len();
    if entries.is_empty() {
        return Err(DatasetError::Empty { name: name.to_owned(), skipped });
    }
    if skipped > 0 {
        tracing::warn!(
            dataset = name,
            skipped,
            used = entries.len(),
            "skipped ShareGPT entries without a human turn followed by a gpt reply"
        );
    }
    Ok(ShareGpt { name: name.to_owned(), entries, skipped })
}

/// Reads and parses a ShareGPT file.
pub fn read_sharegpt(path: &Path) -> Result<ShareGpt, DatasetError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| DatasetError::Read { path: name.clone(), source })?;
    load_sharegpt(&bytes, &name)
}

/// An entry as found in the file. Anything malformed inside one entry makes
/// it `Broken` instead of failing the whole file.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawEntry {
    Conversation { conversations: Vec<Turn> },
    Broken(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct Turn {
    from: String,
    value: String,
}

impl RawEntry {
    fn exchange(self) -> Option<ShareGptEntry> {
        let RawEntry::Conversation { conversations } = self else {
            return None;
        };
        let human = conversations.iter().position(|t| t.from == "human")?;
        let reply = conversations.get(human + 1).filter(|t| t.from == "gpt")?;
        let prompt = &conversations[human].value;
        if prompt.trim().is_empty() {
            return None;
        }
        Some(ShareGptEntry { prompt: prompt.clone(), output_tokens: word_count(&reply.value).max(1) })
    }
}

pub(crate) fn word_count(text: &str) -> u32 {
    u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
}

/// One request's prompt and the reply length it asks for.
#[derive(Clone, Debug)]
pub(crate) struct Prompt {
    pub text: String,
    /// Words in the prompt: its token count when the server gives no usage.
    pub words: u32,
    pub max_tokens: u32,
    /// Ask the server to generate exactly `max_tokens`.
    pub ignore_eos: bool,
}

/// Short common words, so that prompts look like text to a tokenizer.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he",
    "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
    "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "time", "people", "water", "light", "river", "stone", "cloud", "engine", "paper", "garden", "market", "window",
    "number", "story", "music", "field",
];

/// The prompts of `n` requests.
pub(crate) fn prompts(dataset: &Dataset, n: usize) -> Vec<Prompt> {
    match dataset {
        Dataset::Random { input_tokens, output_tokens, seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(*seed);
            (0..n)
                .map(|_| {
                    let words: Vec<&str> =
                        (0..*input_tokens).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect();
                    Prompt { text: words.join(" "), words: *input_tokens, max_tokens: *output_tokens, ignore_eos: true }
                })
                .collect()
        }
        Dataset::ShareGpt { data, output_tokens } => data
            .entries
            .iter()
            .cycle()
            .take(if data.entries.is_empty() { 0 } else { n })
            .map(|e| Prompt {
                text: e.prompt.clone(),
                words: word_count(&e.prompt),
                max_tokens: output_tokens.unwrap_or(e.output_tokens),
                ignore_eos: output_tokens.is_some(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_prompts_have_exact_lengths_and_follow_the_seed() {
        let d = |seed| Dataset::Random { input_tokens: 37, output_tokens: 5, seed };
        let a = prompts(&d(1), 3);
        assert!(a.iter().all(|p| word_count(&p.text) == 37 && p.words == 37 && p.max_tokens == 5 && p.ignore_eos));
        assert_ne!(a[0].text, a[1].text, "each request gets its own prompt");
        assert_eq!(a[2].text, prompts(&d(1), 3)[2].text);
        assert_ne!(a[0].text, prompts(&d(2), 1)[0].text);
    }

    const SHAREGPT: &str = r#"[
        {"id": "a", "conversations": [{"from": "human", "value": "hello there you"}, {"from": "gpt", "value": "hi  friend"}]},
        {"id": "no-reply", "conversations": [{"from": "human", "value": "anyone?"}]},
        {"id": "reply-first", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "y"}]},
        {"id": "no-conversations"},
        {"id": "wrong-type", "conversations": "nope"},
        {"id": "b", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "why"}, {"from": "gpt", "value": ""}]}
    ]"#;

    #[test]
    fn sharegpt_skips_and_counts_broken_entries() {
        let data = load_sharegpt(SHAREGPT.as_bytes(), "test.json").expect("parses");
        assert_eq!(data.skipped, 4);
        let expected = [("hello there you", 2), ("why", 1)];
        let got: Vec<(&str, u32)> = data.entries.iter().map(|e| (e.prompt.as_str(), e.output_tokens)).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn sharegpt_prompts_cycle_and_take_the_override() {
        let data = load_sharegpt(SHAREGPT.as_bytes(), "test.json").expect("parses");
        let cycled = prompts(&Dataset::ShareGpt { data: data.clone(), output_tokens: None }, 3);
        let got: Vec<(&str, u32, u32)> = cycled.iter().map(|p| (p.text.as_str(), p.words, p.max_tokens)).collect();
        assert_eq!(got, [("hello there you", 3, 2), ("why", 1, 1), ("hello there you", 3, 2)]);
        let fixed = prompts(&Dataset::ShareGpt { data, output_tokens: Some(9) }, 2);
        assert!(fixed.iter().all(|p| p.max_tokens == 9));
    }

    #[test]
    fn unusable_datasets_are_errors_that_name_the_file() {
        let check = |bytes: &[u8], expected: &str| {
            let err = load_sharegpt(bytes, "data/share.json").expect_err("must fail");
            assert!(err.to_string().contains(expected), "{err}");
            assert!(err.to_string().contains("data/share.json"), "{err}");
        };
        check(b"{not json", "is not a ShareGPT JSON array");
        check(b"{\"an\": \"object\"}", "is not a ShareGPT JSON array");
        check(br#"[{"conversations": []}]"#, "no usable conversation (1 skipped");

        let missing = read_sharegpt(Path::new("/nonexistent/share.json")).expect_err("must fail");
        assert_eq!(missing.to_string(), "cannot read dataset /nonexistent/share.json");
    }
}
