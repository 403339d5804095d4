//! The HTTP side: one streaming request to an OpenAI-compatible server,
//! recorded chunk by chunk.
//!
//! This is the hot path. It takes no locks and does no blocking I/O: request
//! bodies are serialized before the run, and each chunk's arrival time is
//! read before the chunk is parsed.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::clock::Clock;
use crate::dataset::Prompt;
use crate::record::{Chunk, Outcome, RequestRecord};

/// Which OpenAI API the requests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: the prompt as text, replies in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: the prompt as one user message, replies in
    /// `choices[0].delta.content` or `.reasoning_content`.
    ChatCompletions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }

    /// The endpoint served at `path`, if it is one of ours.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        [Endpoint::Completions, Endpoint::ChatCompletions].into_iter().find(|e| e.path() == path.trim_end_matches('/'))
    }
}

/// The JSON body of one request.
pub(crate) fn request_body(endpoint: Endpoint, model: &str, prompt: &Prompt) -> String {
    let mut body = json!({
        "model": model,
        "max_tokens": prompt.max_tokens,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    match endpoint {
        Endpoint::Completions => body["prompt"] = json!(prompt.text),
        Endpoint::ChatCompletions => body["messages"] = json!([{ "role": "user", "content": prompt.text }]),
    }
    if prompt.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    body.to_string()
}

/// What every request of a run shares.
pub(crate) struct Target {
    pub client: reqwest::Client,
    /// The full URL of the endpoint.
    pub url: String,
    pub api_key: Option<String>,
    /// Longest wait for the response headers or the next bytes of the stream.
    pub idle_timeout: Duration,
    /// Longest time a request may take, from its send.
    pub total_timeout: Duration,
    pub clock: Clock,
}

/// Sends one request and records it; failures are records too, never errors.
pub(crate) async fn send(
    target: &Target,
    seq: u64,
    scheduled_ns: i64,
    body: String,
    prompt_words: u32,
) -> RequestRecord {
    let mut record = RequestRecord {
        seq,
        scheduled_ns,
        sent_ns: target.clock.now_ns(),
        first_token_ns: None,
        completed_ns: 0,
        chunks: Vec::new(),
        prompt_tokens: prompt_words,
        output_tokens: 0,
        outcome: Outcome::Incomplete,
        http_status: None,
        error: None,
    };
    let mut usage = None;
    let streamed = tokio::time::timeout(target.total_timeout, stream(target, body, &mut record, &mut usage)).await;
    record.completed_ns = target.clock.now_ns();
    let (outcome, error) = match streamed {
        Ok(Ok(())) => (Outcome::Ok, None),
        Ok(Err(failure)) => failure,
        Err(_) => (Outcome::Timeout, Some(format!("no complete response within {:?}", target.total_timeout))),
    };
    record.outcome = outcome;
    record.error = error;
    let chunks = u32::try_from(record.chunks.len()).unwrap_or(u32::MAX);
    // The server's usage is the truth about tokens; chunks stay as they
    // arrived (one token each until a tokenizer exists).
    record.output_tokens = usage.and_then(|u: Usage| u.completion_tokens).unwrap_or(chunks);
    if let Some(prompt) = usage.and_then(|u| u.prompt_tokens) {
        record.prompt_tokens = prompt;
    }
    record
}

type Failure = (Outcome, Option<String>);

fn fail(outcome: Outcome, error: impl Into<String>) -> Failure {
    (outcome, Some(error.into()))
}

/// Streams the response into `record`; `Ok` once the server said `[DONE]`.
async fn stream(
    target: &Target,
    body: String,
    record: &mut RequestRecord,
    usage: &mut Option<Usage>,
) -> Result<(), Failure> {
    let mut request = target.client.post(&target.url).header("content-type", "application/json").body(body);
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    let idle = target.idle_timeout;
    let response = match tokio::time::timeout(idle, request.send()).await {
        Err(_) => {
            return Err(fail(Outcome::Timeout, format!("no response headers within {idle:?}")));
        }
        Ok(Err(e)) if e.is_timeout() => return Err(fail(Outcome::Timeout, error_chain(&e))),
        Ok(Err(e)) => return Err(fail(Outcome::TransportError, error_chain(&e))),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    record.http_status = Some(status.as_u16());
    if !status.is_success() {
        let body = tokio::time::timeout(idle, response.bytes()).await;
        let body = body.ok().and_then(Result::ok).unwrap_or_default();
        let head = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(fail(Outcome::HttpError, format!("http {status}: {head}")));
    }

    let mut events = response.bytes_stream().eventsource();
    loop {
        let next = tokio::time::timeout(idle, events.next()).await;
        let at_ns = target.clock.now_ns();
        let event = match next {
            Err(_) => return Err(fail(Outcome::Timeout, format!("no data for {idle:?}"))),
            Ok(None) => return Err(fail(Outcome::Incomplete, "stream ended before [DONE]")),
            Ok(Some(Err(e))) => {
                return Err(fail(Outcome::Incomplete, format!("stream broke before [DONE]: {}", error_chain(&e))));
            }
            Ok(Some(Ok(event))) => event,
        };
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(());
        }
        let chunk: StreamChunk = serde_json::from_str(data)
            .map_err(|e| fail(Outcome::Incomplete, format!("malformed chunk ({e}): {}", head(data))))?;
        if let Some(error) = chunk.error {
            return Err(fail(Outcome::Incomplete, format!("server error in stream: {}", head(&error.to_string()))));
        }
        if chunk.choices.first().is_some_and(Choice::carries_text) {
            record.first_token_ns.get_or_insert(at_ns);
            record.chunks.push(Chunk { at_ns, tokens: 1 });
        }
        if chunk.usage.is_some() {
            *usage = chunk.usage;
        }
    }
}

/// The first 200 bytes of `text`, cut at a character boundary.
fn head(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An error and its sources, as one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One `data:` payload of the stream; only the fields we read.
#[derive(Deserialize)]
struct StreamChunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    text: Option<String>,
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    /// vLLM's newer name for `reasoning_content`.
    reasoning: Option<String>,
}

impl Choice {
    /// A role-only, empty or usage-only chunk is not a token.
    fn carries_text(&self) -> bool {
        let some = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        some(&self.text)
            || self.delta.as_ref().is_some_and(|d| some(&d.content) || some(&d.reasoning_content) || some(&d.reasoning))
    }
}

#[derive(Clone, Copy, Deserialize)]
struct Usage {
    prompt_tokens: Option<u32>,
    completion_tokens: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_chunks_with_text_are_tokens() {
        let check = |data: &str, expected: bool| {
            let chunk: StreamChunk = serde_json::from_str(data).expect("valid chunk");
            assert_eq!(chunk.choices.first().is_some_and(Choice::carries_text), expected, "{data}");
        };
        check(r#"{"choices":[{"text":"hi"}]}"#, true);
        check(r#"{"choices":[{"text":""}]}"#, false);
        check(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, false);
        check(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#, false);
        check(r#"{"choices":[{"delta":{"content":"x"}}]}"#, true);
        check(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#, true);
        check(r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#, true);
        check(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#, false);
    }

    #[test]
    fn endpoints_round_trip_their_paths() {
        assert_eq!(Endpoint::from_path("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(Endpoint::from_path("/v1/chat/completions/"), Some(Endpoint::ChatCompletions));
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }
}
