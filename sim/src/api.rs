//! The OpenAI-compatible HTTP layer: parses requests, submits them to the engine, and renders its tokens as vLLM does.
//!
//! Token counting: a prompt token is a whitespace-separated word (a prompt of
//! token ids counts one per id); a chat's prompt is its messages' contents
//! joined. Every 16 words make a KV block, named by a hash of its words and of
//! the blocks before it, which is what the prefix cache matches. Output is
//! exactly `max_tokens` tokens (16 when absent), so `finish_reason` is always
//! `"length"`; `ignore_eos` and `min_tokens` are accepted and change nothing.
//! A step that gives a request several tokens (speculative decoding) sends
//! them in one chunk. Error bodies follow vLLM's
//! `{"error":{"message","type","param","code"}}`.
//!
//! Faults (`--sim-fail-rate`, `--sim-stall-rate`, `--sim-disconnect-rate`) are
//! drawn per request, in arrival order, from a generator seeded by `--seed`.

use std::{
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
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    SimConfig,
    engine::{EngineHandle, Output, Request, Stats, reply_words},
    kv::BLOCK_TOKENS,
    simulate::{block_hashes, continue_block_hashes},
};

struct AppState {
    config: SimConfig,
    engine: EngineHandle,
    ready_at: Instant,
    /// Draws which requests fail, stall or disconnect; seeded, so a run repeats.
    fault_rng: Mutex<ChaCha8Rng>,
    next_id: AtomicU64,
    /// Cancelled when the server stops, so a stalled stream does not hold the shutdown up.
    stopping: CancellationToken,
}

/// What the fault draws decided for one request.
#[derive(Debug, Clone, Copy, Default)]
struct Fate {
    fail: bool,
    stall: bool,
    disconnect: bool,
}

pub fn router(config: SimConfig, engine: EngineHandle, stopping: CancellationToken) -> Router {
    // Each engine's own way to empty its prefix cache, and only that one.
    let reset = match config.engine {
        _ if config.faults.refuse_cache_reset => None,
        crate::config::EngineKind::Vllm => Some("/reset_prefix_cache"),
        crate::config::EngineKind::Sglang => Some("/flush_cache"),
    };
    let (config_engine, enable_metrics) = (config.engine, config.enable_metrics);
    let state = AppState {
        ready_at: Instant::now() + config.startup_delay,
        fault_rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed)),
        next_id: AtomicU64::new(0),
        config,
        engine,
        stopping,
    };
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions));
    // Each engine's own way to say its version; SGLang serves /metrics only when asked.
    let router = match config_engine {
        crate::config::EngineKind::Vllm => router.route("/version", get(version)),
        crate::config::EngineKind::Sglang => router.route("/get_server_info", get(server_info)),
    };
    let router = if enable_metrics { router.route("/metrics", get(metrics)) } else { router };
    match reset {
        Some(path) => router.route(path, post(reset_prefix_cache)),
        None => router,
    }
    // The engines' servers set no limit of their own; a million-token prompt is some megabytes.
    .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
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

async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Result<StatusCode, ApiError> {
    state.engine.reset_prefix_cache().map_err(|err| ApiError(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
    Ok(StatusCode::OK)
}

/// The version the simulator answers as either engine: its own, marked as the simulator's.
pub const ENGINE_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+benchfleet-sim");

/// vLLM's `GET /version`.
async fn version() -> Json<Value> {
    Json(json!({"version": ENGINE_VERSION}))
}

/// SGLang's `GET /get_server_info`: its server arguments, its version among them (a few of the
/// arguments only).
async fn server_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    let c = &state.config;
    Json(json!({
        "model_path": c.model, "served_model_name": c.served_model_name, "host": c.host, "port": c.port,
        "context_length": c.max_model_len, "max_running_requests": c.max_num_seqs, "tp_size": c.tensor_parallel_size,
        "enable_metrics": c.enable_metrics, "version": ENGINE_VERSION,
    }))
}

/// One series of `/metrics`: name, type, help and value.
type MetricLine = (&'static str, &'static str, &'static str, f64);

/// The series of the engine's `/metrics` that a benchmark reads, with the engine's names, types and
/// labels, from the scheduler's state: one label set per data-parallel replica, as the engines
/// label them (vLLM's `engine`, SGLang's `dp_rank` when it has several).
async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let model = &state.config.served_model_name;
    let replicas = state.engine.replica_stats();
    let mut text = String::new();
    let mut families: Vec<(MetricLine, Vec<(String, f64)>)> = Vec::new();
    for (rank, stats) in replicas.iter().enumerate() {
        let (labels, series) = engine_series(state.config.engine, model, rank, replicas.len(), stats);
        for (i, line) in series.into_iter().enumerate() {
            if rank == 0 {
                families.push((line, Vec::new()));
            }
            families[i].1.push((labels.clone(), line.3));
        }
    }
    for ((name, kind, help, _), samples) in families {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            // vLLM counts finished requests per finish reason; every simulated one runs to its length.
            let reason = if name == "vllm:request_success_total" { ",finished_reason=\"length\"" } else { "" };
            let _ = writeln!(text, "{name}{{{labels}{reason}}} {value:?}");
        }
    }
    let stats = state.engine.stats();
    // The simulator's own: how well its steps kept their deadlines.
    let t = stats.timing;
    let own: [MetricLine; 3] = [
        ("benchfleet_sim:steps_total", "counter", "Engine steps run.", t.steps as f64),
        (
            "benchfleet_sim:step_late_seconds_total",
            "counter",
            "Lateness of the steps' wake-ups past their deadlines: the machine's delay, not the engine's.",
            t.late.as_secs_f64(),
        ),
        (
            "benchfleet_sim:late_steps_total",
            "counter",
            "Steps that woke more than 2 ms past their deadline.",
            t.late_steps as f64,
        ),
    ];
    for (name, kind, help, value) in own {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value:?}");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// One replica's series: its labels, and each series' name, type, help and value.
fn engine_series(
    engine: crate::config::EngineKind,
    model: &str,
    rank: usize,
    replicas: usize,
    stats: &Stats,
) -> (String, Vec<MetricLine>) {
    let c = stats.counters;
    let (labels, mut series): (String, Vec<MetricLine>) = match engine {
        crate::config::EngineKind::Vllm => (
            format!("model_name={model:?},engine=\"{rank}\""),
            vec![
                (
                    "vllm:num_requests_running",
                    "gauge",
                    "Number of requests in model execution batches.",
                    stats.running as f64,
                ),
                (
                    "vllm:num_requests_waiting",
                    "gauge",
                    "Number of requests waiting to be processed.",
                    stats.waiting as f64,
                ),
                ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage),
                (
                    "vllm:prefix_cache_queries_total",
                    "counter",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    c.prefix_cache_queries as f64,
                ),
                (
                    "vllm:prefix_cache_hits_total",
                    "counter",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    c.prefix_cache_hits as f64,
                ),
                (
                    "vllm:num_preemptions_total",
                    "counter",
                    "Cumulative number of preemption from the engine.",
                    c.preemptions as f64,
                ),
                ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens as f64),
                (
                    "vllm:generation_tokens_total",
                    "counter",
                    "Number of generation tokens processed.",
                    c.generation_tokens as f64,
                ),
            ],
        ),
        crate::config::EngineKind::Sglang => {
            let hit_rate = if c.prefix_cache_queries == 0 {
                0.0
            } else {
                c.prefix_cache_hits as f64 / c.prefix_cache_queries as f64
            };
            (
                {
                    let dp = if replicas > 1 { format!(",dp_rank=\"{rank}\"") } else { String::new() };
                    format!("model_name={model:?},engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"{dp}")
                },
                vec![
                    ("sglang:num_running_reqs", "gauge", "The number of running requests.", stats.running as f64),
                    (
                        "sglang:num_queue_reqs",
                        "gauge",
                        "The number of requests in the waiting queue.",
                        stats.waiting as f64,
                    ),
                    ("sglang:token_usage", "gauge", "The token usage.", stats.kv_usage),
                    ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", hit_rate),
                    (
                        "sglang:num_retracted_requests_total",
                        "counter",
                        "Total number of retracted requests.",
                        c.preemptions as f64,
                    ),
                    (
                        "sglang:prompt_tokens_total",
                        "counter",
                        "Number of prefill tokens processed.",
                        c.prompt_tokens as f64,
                    ),
                    (
                        "sglang:generation_tokens_total",
                        "counter",
                        "Number of generation tokens processed.",
                        c.generation_tokens as f64,
                    ),
                    (
                        "sglang:cached_tokens_total",
                        "counter",
                        "Number of cached prompt tokens.",
                        c.prefix_cache_hits as f64,
                    ),
                    ("sglang:num_requests_total", "counter", "Number of requests processed.", c.finished as f64),
                ],
            )
        }
    };
    if engine == crate::config::EngineKind::Vllm {
        series.push((
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            c.finished as f64,
        ));
    }
    (labels, series)
}

/// The largest request body the server reads.
const MAX_BODY_BYTES: usize = 64 << 20;

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
    /// Choices per request: the simulator generates one.
    n: Option<u64>,
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

/// A prompt as the engine sees it: its tokens' count, their KV block hashes, and a hash of the whole
/// prompt that seeds the generated words, so the same request generates the same text.
struct Prompted {
    tokens: usize,
    block_hashes: Vec<u64>,
    hash: u64,
    /// A text prompt's words after its last full block, which the reply's first words fill: the
    /// blocks its reply fills are named as a later prompt carrying the reply names them. `None`
    /// for token ids, which the reply's words are not.
    tail: Option<Vec<String>>,
}

fn prompted<T: Hash>(tokens: &[T]) -> Prompted {
    Prompted {
        tokens: tokens.len(),
        block_hashes: block_hashes(tokens.chunks_exact(BLOCK_TOKENS).map(hash)),
        hash: hash(tokens),
        tail: None,
    }
}

fn prompted_text(words: &[&str]) -> Prompted {
    let tail = words[words.len() - words.len() % BLOCK_TOKENS..].iter().map(|w| (*w).to_owned()).collect();
    Prompted { tail: Some(tail), ..prompted(words) }
}

/// The hashes of every full block of the prompt and its reply of `max_tokens` words, which vLLM
/// caches as a request computes them: the prompt's, then those the reply fills (a block at a time,
/// so a long reply costs no more memory than its hashes).
fn sequence_hashes(prompt: Prompted, seed: u64, max_tokens: usize) -> Vec<u64> {
    let mut hashes = prompt.block_hashes;
    let Some(tail) = prompt.tail else { return hashes };
    // The prompt's last words (fewer than a block), then the reply's as a later prompt that
    // carries the reply splits them.
    let mut block: Vec<&str> = tail.iter().map(String::as_str).collect();
    let mut blocks = Vec::with_capacity((tail.len() + max_tokens) / BLOCK_TOKENS);
    for word in reply_words(seed, max_tokens) {
        block.push(word.trim_start());
        if block.len() == BLOCK_TOKENS {
            blocks.push(hash(&block[..]));
            block.clear();
        }
    }
    hashes.extend(continue_block_hashes(hashes.last().copied(), blocks));
    hashes
}

fn prompt_of(body: &GenerateBody, chat: bool) -> Result<Prompted, ApiError> {
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
        return Ok(prompted_text(&words(&prompt)));
    }
    match body.prompt.as_ref().ok_or_else(|| bad_request("a completion request needs `prompt`"))? {
        Prompt::Text(text) => Ok(prompted_text(&words(text))),
        Prompt::Texts(texts) if texts.len() == 1 => Ok(prompted_text(&words(&texts[0]))),
        Prompt::Ids(ids) => Ok(prompted(ids)),
        // `[]` reads as no texts as well as no token ids: an empty prompt either way.
        Prompt::Texts(texts) if texts.is_empty() => Ok(prompted::<u64>(&[])),
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
        && !config.other_model_names.contains(model)
    {
        return Err(ApiError(StatusCode::NOT_FOUND, format!("The model `{model}` does not exist.")));
    }
    if let Some(n) = body.n.filter(|&n| n != 1) {
        return Err(bad_request(format!(
            "the simulator generates one choice per request, not n={n}: send {n} requests instead"
        )));
    }
    let prompt = prompt_of(&body, chat)?;
    let prompt_tokens = prompt.tokens;
    // vLLM refuses a completion with nothing to prefill (its words); a chat request always has its
    // template's tokens. What SGLang answers is not known here, so it serves it.
    if prompt_tokens == 0 && !chat && config.engine == crate::config::EngineKind::Vllm {
        return Err(bad_request("The decoder prompt cannot be empty"));
    }
    let max_tokens = body.max_completion_tokens.or(body.max_tokens).unwrap_or(16);
    if max_tokens == 0 {
        return Err(bad_request("max_tokens must be at least 1"));
    }
    let limit = config.max_model_len;
    // Summed wide, as the engine's Python integers are: no count a client sends wraps under the limit.
    let requested =
        u128::try_from(prompt_tokens).unwrap_or(u128::MAX) + u128::try_from(max_tokens).unwrap_or(u128::MAX);
    if requested > limit as u128 {
        // vLLM's wording, so clients that recognise it behave the same here.
        return Err(bad_request(format!(
            "This model's maximum context length is {limit} tokens. However, you requested {requested} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion."
        )));
    }
    let fate = state.draw_fate();
    if fate.fail {
        return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, "simulated failure (--sim-fail-rate)".into()));
    }
    let seed = hash((config.seed, prompt.hash, max_tokens));
    // A cache that keeps nothing needs no names for the reply's blocks.
    let block_hashes =
        if config.enable_prefix_caching { sequence_hashes(prompt, seed, max_tokens) } else { prompt.block_hashes };
    let request = Request { prompt_tokens, block_hashes, max_tokens, seed };
    let tokens =
        state.engine.submit(request).map_err(|err| ApiError(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
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
    if body.stream {
        let faults = StreamFaults {
            stall: fate.stall.then_some(config.faults.stall),
            disconnect: fate.disconnect,
            stopping: state.stopping.clone(),
        };
        Ok(reply.stream(tokens, include_usage, faults))
    } else {
        reply.collect(tokens).await
    }
}

impl AppState {
    /// Draws all three faults for every request, so one rate does not shift another's draws.
    fn draw_fate(&self) -> Fate {
        let faults = &self.config.faults;
        let Ok(mut rng) = self.fault_rng.lock() else { return Fate::default() };
        let mut draw = |rate: f64| rng.random::<f64>() < rate;
        Fate { fail: draw(faults.fail_rate), stall: draw(faults.stall_rate), disconnect: draw(faults.disconnect_rate) }
    }
}

/// How a stream misbehaves once half of its tokens are out.
struct StreamFaults {
    /// Hold the connection open without sending for this long.
    stall: Option<std::time::Duration>,
    /// Cut the connection.
    disconnect: bool,
    stopping: CancellationToken,
}

/// Ends a response body abruptly: hyper drops the connection without finishing the chunked body.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CutStream(&'static str);

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
    fn stream(self, tokens: mpsc::UnboundedReceiver<Output>, include_usage: bool, faults: StreamFaults) -> Response {
        let state = StreamState { reply: self, tokens, sent: 0, include_usage, faults, done: false };
        let events = futures_util::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            let max = st.reply.max_tokens;
            if st.sent >= (max / 2).max(1) && st.sent < max {
                if st.faults.disconnect {
                    st.done = true;
                    return Some((Err(CutStream("simulated disconnect (--sim-disconnect-rate)")), st));
                }
                if let Some(stall) = st.faults.stall.take() {
                    tokio::select! {
                        _ = tokio::time::sleep(stall) => {}
                        _ = st.faults.stopping.cancelled() => {}
                    }
                }
            }
            let words = match st.tokens.recv().await {
                Some(Ok(words)) => words,
                Some(Err(message)) => {
                    // The engine failed the request: vLLM ends the stream with an error event.
                    st.done = true;
                    let error = json!({"error": {"message": message, "type": "InternalServerError", "param": null, "code": 500}});
                    return Some((Ok(format!("data: {error}\n\ndata: [DONE]\n\n")), st));
                }
                None => {
                    // The channel closed before the last token: the engine died. Cut the stream, as a dead engine does.
                    st.done = true;
                    return (st.sent < max)
                        .then_some((Err(CutStream("the engine stopped before the request finished")), st));
                }
            };
            let out = st.reply.render(&words, st.sent, st.include_usage);
            st.sent += words.len();
            st.done = st.sent >= max;
            Some((Ok::<_, CutStream>(out), st))
        });
        let headers = [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")];
        (headers, Body::from_stream(events)).into_response()
    }

    /// The events for one step's `words`, the first of which is output token number `index`.
    fn render(&self, words: &[&str], index: usize, include_usage: bool) -> String {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        let mut out = String::new();
        let mut event = |chunk: Value| {
            let _ = write!(out, "data: {chunk}\n\n");
        };
        let end = index + words.len();
        let finish = (end >= self.max_tokens).then_some("length");
        if self.chat {
            if index == 0 {
                // vLLM sends the role alone with the first output, so it never counts as a token.
                let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                event(self.envelope(object, role));
            }
            // A step's tokens can straddle the end of the reasoning: one delta for each side.
            let split = self.reasoning_tokens.clamp(index, end) - index;
            let parts = [("reasoning_content", &words[..split]), ("content", &words[split..])];
            let last = parts.iter().rposition(|(_, w)| !w.is_empty()).unwrap_or(1);
            for (i, (field, part)) in parts.iter().enumerate().filter(|(_, (_, w))| !w.is_empty()) {
                let finish = if i == last { finish } else { None };
                let delta =
                    json!([{"index": 0, "delta": {*field: part.concat()}, "logprobs": null, "finish_reason": finish}]);
                event(self.envelope(object, delta));
            }
        } else {
            let choice = json!([{"index": 0, "text": words.concat(), "logprobs": null, "finish_reason": finish, "stop_reason": null}]);
            event(self.envelope(object, choice));
        }
        if finish.is_some() {
            if include_usage {
                let mut chunk = self.envelope(object, json!([]));
                chunk["usage"] = self.usage();
                event(chunk);
            }
            out.push_str("data: [DONE]\n\n");
        }
        out
    }

    async fn collect(self, mut tokens: mpsc::UnboundedReceiver<Output>) -> Result<Response, ApiError> {
        let mut words = Vec::with_capacity(self.max_tokens);
        while let Some(chunk) = tokens.recv().await {
            match chunk {
                Ok(chunk) => words.extend(chunk),
                Err(message) => return Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, message.into())),
            }
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

/// A streaming response's progress.
struct StreamState {
    reply: Reply,
    tokens: mpsc::UnboundedReceiver<Output>,
    sent: usize,
    include_usage: bool,
    faults: StreamFaults,
    done: bool,
}

/// Prompt words: the simulator's tokens.
fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
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
