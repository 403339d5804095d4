//! A fake OpenAI-compatible server whose timings and tokens are known
//! exactly. The model name picks the behaviour: `good` streams normally (in
//! chat, the first chunk is reasoning), `http-500` fails, `every-4th-fails`
//! answers every fourth request with a 500, `drop-after-3` breaks the stream
//! after three chunks, `malformed` sends a chunk that is not JSON,
//! `undercount` says it generated half the tokens it streamed,
//! `stall-first` never sends a token, `stall-after-2` stops after two chunks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

/// When tokens come: the first chunk `ttft` after the request arrives, then
/// one chunk every `itl`, each of `per_chunk` tokens (the last may carry fewer).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ttft: Duration,
    pub itl: Duration,
    pub per_chunk: u64,
}

/// What the server really did for one streamed request: when each text
/// chunk left it and when the stream ended, from the request's arrival. The
/// server's timer overshoots its deadlines a little (more on a busy
/// machine); these are the truth a client's measurements are checked against.
#[derive(Clone, Debug, Default)]
pub struct Served {
    pub chunks: Vec<Duration>,
    pub done: Duration,
    /// The prompt it was sent: a chat's messages' contents, one line each.
    pub prompt: String,
    /// A chat's messages, (role, content) each.
    pub messages: Vec<(String, String)>,
    /// What it streamed as the reply's text.
    pub reply: String,
}

/// Every completed stream the server served, in completion order.
pub type Truth = Arc<Mutex<Vec<Served>>>;

#[derive(Clone)]
struct Server {
    timing: Timing,
    requests: Arc<AtomicU64>,
    truth: Truth,
}

/// Starts the server on a free port; returns its base URL.
pub async fn start(timing: Timing) -> String {
    start_recorded(timing).await.0
}

/// Starts the server on a free port; returns its base URL and the record of
/// what it served.
pub async fn start_recorded(timing: Timing) -> (String, Truth) {
    let truth = Truth::default();
    let app = axum::Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(generate))
        .route("/v1/chat/completions", post(generate))
        .with_state(Server { timing, requests: Arc::new(AtomicU64::new(0)), truth: truth.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    // Like uvicorn: without TCP_NODELAY, Nagle and delayed ACKs hold small
    // chunks back for up to 40 ms and the timings would be the kernel's.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).expect("nodelay"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("fake server") });
    (format!("http://{addr}"), truth)
}

async fn models() -> Json<Value> {
    let models = [
        "good",
        "http-500",
        "drop-after-3",
        "every-4th-fails",
        "malformed",
        "stall-first",
        "stall-after-2",
        "undercount",
    ];
    let data: Vec<Value> = models.iter().map(|m| json!({ "id": m })).collect();
    Json(json!({"object": "list", "data": data}))
}

async fn generate(State(server): State<Server>, Json(request): Json<Value>) -> Response {
    let arrived = Instant::now();
    let timing = server.timing;
    let n = server.requests.fetch_add(1, Ordering::Relaxed);
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    if model == "http-500" || (model == "every-4th-fails" && n % 4 == 3) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "engine exploded ".repeat(40)).into_response();
    }
    let chat = request.get("messages").is_some();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let messages: Vec<(String, String)> = request["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| (text(&m["role"]), text(&m["content"]))).collect())
        .unwrap_or_default();
    let prompt = if chat {
        messages.iter().map(|(_, content)| content.as_str()).collect::<Vec<_>>().join("\n")
    } else {
        text(&request["prompt"])
    };
    let prompt_tokens = prompt.split_whitespace().count();
    let tokens = request["max_tokens"].as_u64().expect("max_tokens");
    let stop_after = match model.as_str() {
        "drop-after-3" => Some(3),
        "stall-first" => Some(0),
        "stall-after-2" => Some(2),
        _ => None,
    };
    let stall = model.starts_with("stall");

    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let truth = server.truth.clone();
    tokio::spawn(async move {
        let mut served = Served { prompt, messages, ..Served::default() };
        let send = |data: String| tx.send(Ok(Bytes::from(format!("data: {data}\n\n"))));
        // Neither a role-only nor an empty chunk is a token.
        let empty = if chat {
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        } else {
            json!({"choices": [{"index": 0, "text": ""}]})
        };
        send(empty.to_string()).await.ok();
        let chunks = tokens.div_ceil(timing.per_chunk);
        for i in 0..chunks {
            // Absolute deadlines, so that timer overshoot does not add up.
            tokio::time::sleep_until(arrived + timing.ttft + timing.itl * i as u32).await;
            if stop_after == Some(i) {
                if stall {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                tx.send(Err(std::io::Error::other("dropped on purpose"))).await.ok();
                return;
            }
            if model == "malformed" && i == 1 {
                send("{not json".to_owned()).await.ok();
                continue;
            }
            let k = timing.per_chunk.min(tokens - i * timing.per_chunk);
            let text = "word ".repeat(k as usize);
            let chunk = match (chat, i) {
                // Reasoning counts as the first token.
                (true, 0) => json!({"choices": [{"index": 0, "delta": {"reasoning_content": text}}]}),
                (true, _) => json!({"choices": [{"index": 0, "delta": {"content": text}}]}),
                (false, _) => json!({"choices": [{"index": 0, "text": text}]}),
            };
            served.chunks.push(arrived.elapsed());
            served.reply.push_str(&text);
            send(chunk.to_string()).await.ok();
        }
        let counted = if model == "undercount" { tokens / 2 } else { tokens };
        let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": counted}});
        send(usage.to_string()).await.ok();
        served.done = arrived.elapsed();
        send("[DONE]".to_owned()).await.ok();
        truth.lock().expect("truth lock").push(served);
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .expect("response")
}
