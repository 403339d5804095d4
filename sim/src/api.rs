//! The OpenAI-compatible HTTP layer: parses requests, submits them to the engine, and renders its tokens as vLLM does.
//!
//! Token counting: a prompt token is a whitespace-separated word (a prompt of
//! token ids counts one per id); a chat's prompt is its messages' contents
//! joined. Output is exactly `max_tokens` tokens (16 when absent), so
//! `finish_reason` is always `"length"`. Error bodies follow vLLM's
//! `{"error":{"message","type","param","code"}}`.

use std::{
    convert::Infallible,
    fmt::Write as _,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::{
    SimConfig,
    engine::{EngineHandle, Request},
};

struct AppState {
    config: SimConfig,
    engine: EngineHandle,
    ready_at: Instant,
    /// Draws which requests fail under `--sim-fail-rate`; seeded, so a run repeats.
    fail_rng: Mutex<ChaCha8Rng>,
    next_id: AtomicU64,
}

pub fn router(config: SimConfig, engine: EngineHandle) -> Router {
    let state = AppState {
        ready_at: Instant::now() + config.startup_delay,
        fail_rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed)),
        next_id: AtomicU64::new(0),
        config,
        engine,
    };
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/metrics", get(metrics))
        // The prefix cache is not modelled yet, so there is nothing to reset; SGLang calls it /flush_cache.
        .route("/reset_prefix_cache", post(|| async { StatusCode::OK }))
        .route("/flush_cache", post(|| async { StatusCode::OK }))
        .with_state(Arc::new(state))
}

async fn health(State(state): State<Arc<AppState>>) -> StatusCode {
    if Instant::now() >= state.ready_at { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let c = &state.config;
    Json(json!({"object": "list", "data": [{
        "id": c.served_model_name, "object": "model", "created": unix_now(), "owned_by": "benchfleet-sim",
        "root": c.model, "max_model_len": c.max_model_len,
    }]}))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let (load, model) = (&state.engine.load, &state.config.served_model_name);
    let mut text = String::new();
    for (name, help, value) in [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", &load.running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", &load.waiting),
    ] {
        let value = value.load(Ordering::Relaxed);
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{model_name={model:?}}} {value}");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// The fields of a completion or chat request that shape the simulation; the
/// rest (temperature, ignore_eos, min_tokens, ...) are accepted and ignored.
#[derive(Deserialize)]
struct GenerateBody {
    model: Option<String>,
    prompt: Option<Prompt>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u64>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct Message {
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    text: Option<String>,
}

/// An OpenAI-style error reply, as vLLM writes it.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ApiError(status, message) = self;
        let kind = match status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
        (status, Json(body)).into_response()
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, message.into())
}

async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    generate(state, false, &body).await
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    generate(state, true, &body).await
}

/// Prompt token count and hash: the hash seeds the words, so the same request generates the same text.
fn prompt_of(body: &GenerateBody, chat: bool) -> Result<(usize, u64), ApiError> {
    if chat {
        let messages = body.messages.as_deref().ok_or_else(|| bad_request("a chat request needs `messages`"))?;
        let mut prompt = String::new();
        for content in messages.iter().filter_map(|m| m.content.as_ref()) {
            match content {
                Content::Text(text) => prompt.extend([" ", text]),
                Content::Parts(parts) => {
                    parts.iter().filter_map(|p| p.text.as_deref()).for_each(|t| prompt.extend([" ", t]))
                }
            }
        }
        return Ok((words(&prompt), hash(&prompt)));
    }
    match body.prompt.as_ref().ok_or_else(|| bad_request("a completion request needs `prompt`"))? {
        Prompt::Text(text) => Ok((words(text), hash(text))),
        Prompt::Texts(texts) if texts.len() == 1 => Ok((words(&texts[0]), hash(&texts[0]))),
        Prompt::Ids(ids) => Ok((ids.len(), hash(ids))),
        Prompt::Texts(_) => {
            Err(bad_request("the simulator takes one prompt per request: send batched prompts as separate requests"))
        }
    }
}

async fn generate(state: Arc<AppState>, chat: bool, body: &[u8]) -> Result<Response, ApiError> {
    let config = &state.config;
    if Instant::now() < state.ready_at {
        return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, "the engine is still starting up".into()));
    }
    let body: GenerateBody =
        serde_json::from_slice(body).map_err(|err| bad_request(format!("invalid request body: {err}")))?;
    if let Some(model) = &body.model
        && *model != config.served_model_name
    {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("The model `{model}` does not exist.")));
    }
    let (prompt_tokens, prompt_hash) = prompt_of(&body, chat)?;
    let max_tokens = body.max_completion_tokens.or(body.max_tokens).unwrap_or(16);
    if max_tokens == 0 {
        return Err(bad_request("max_tokens must be at least 1"));
    }
    let limit = config.max_model_len;
    if prompt_tokens + max_tokens > limit {
        // vLLM's wording, so clients that recognise it behave the same here.
        return Err(bad_request(format!(
            "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
            prompt_tokens + max_tokens
        )));
    }
    if config.fail_rate > 0.0 && state.fail_rng.lock().is_ok_and(|mut rng| rng.random::<f64>() < config.fail_rate) {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "simulated failure (--sim-fail-rate)".into()));
    }
    let seed = hash((config.seed, prompt_hash, max_tokens));
    let tokens = state
        .engine
        .submit(Request { prompt_tokens, max_tokens, seed })
        .map_err(|err| ApiError(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let reasoning = chat && config.reasoning_parser.is_some();
    let reply = Reply {
        id: format!("{}-{id:016x}", if chat { "chatcmpl" } else { "cmpl" }),
        created: unix_now(),
        model: config.served_model_name.clone(),
        chat,
        reasoning_tokens: if reasoning { max_tokens / 4 } else { 0 },
        prompt_tokens,
        max_tokens,
    };
    let include_usage = body.stream_options.is_some_and(|o| o.include_usage);
    if body.stream { Ok(reply.stream(tokens, include_usage)) } else { reply.collect(tokens).await }
}

/// One response's identity and shape, shared by its chunks.
struct Reply {
    id: String,
    created: u64,
    model: String,
    chat: bool,
    /// The first tokens of a chat go to `reasoning_content` when `--reasoning-parser` is set.
    reasoning_tokens: usize,
    prompt_tokens: usize,
    max_tokens: usize,
}

impl Reply {
    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices})
    }

    fn usage(&self) -> Value {
        let (prompt, completion) = (self.prompt_tokens, self.max_tokens);
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
    }

    /// Server-sent events as vLLM writes them: `data: {json}\n\n` per chunk, then `data: [DONE]`.
    fn stream(self, tokens: mpsc::UnboundedReceiver<&'static str>, include_usage: bool) -> Response {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        let event = |out: &mut String, chunk: Value| {
            let _ = write!(out, "data: {chunk}\n\n");
        };
        let events = UnboundedReceiverStream::new(tokens).enumerate().map(move |(index, word)| {
            let mut out = String::new();
            let finish = (index + 1 == self.max_tokens).then_some("length");
            if self.chat {
                if index == 0 {
                    // vLLM sends the role alone with the first output, so it never counts as a token.
                    let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                    event(&mut out, self.envelope(object, role));
                }
                let field = if index < self.reasoning_tokens { "reasoning_content" } else { "content" };
                let delta = json!([{"index": 0, "delta": {field: word}, "logprobs": null, "finish_reason": finish}]);
                event(&mut out, self.envelope(object, delta));
            } else {
                let choice = json!([{"index": 0, "text": word, "logprobs": null, "finish_reason": finish, "stop_reason": null}]);
                event(&mut out, self.envelope(object, choice));
            }
            if finish.is_some() {
                if include_usage {
                    let mut chunk = self.envelope(object, json!([]));
                    chunk["usage"] = self.usage();
                    event(&mut out, chunk);
                }
                out.push_str("data: [DONE]\n\n");
            }
            Ok::<_, Infallible>(out)
        });
        let headers = [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")];
        (headers, Body::from_stream(events)).into_response()
    }

    async fn collect(self, mut tokens: mpsc::UnboundedReceiver<&'static str>) -> Result<Response, ApiError> {
        let mut words = Vec::with_capacity(self.max_tokens);
        while let Some(word) = tokens.recv().await {
            words.push(word);
        }
        if words.len() < self.max_tokens {
            let message = "the engine stopped before the request finished".into();
            return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, message));
        }
        let mut body = if self.chat {
            let (reasoning, content) = words.split_at(self.reasoning_tokens);
            let message = json!({"role": "assistant", "content": content.concat(),
                "reasoning_content": (!reasoning.is_empty()).then(|| reasoning.concat())});
            self.envelope(
                "chat.completion",
                json!([{"index": 0, "message": message, "logprobs": null, "finish_reason": "length"}]),
            )
        } else {
            let choice = json!([{"index": 0, "text": words.concat(), "logprobs": null, "finish_reason": "length", "stop_reason": null}]);
            self.envelope("text_completion", choice)
        };
        body["usage"] = self.usage();
        Ok(Json(body).into_response())
    }
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

fn hash(value: impl Hash) -> u64 {
    // DefaultHasher::new() uses fixed keys, so a given build always generates the same words.
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
