//! A fake OpenAI-compatible server whose timings and tokens are known
//! exactly. The model name picks the behaviour: `good` streams normally,
//! `http-500` fails, `drop-after-3` breaks the stream after three tokens.

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

/// When tokens come: the first `ttft` after the request arrives, then one
/// every `itl`.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ttft: Duration,
    pub itl: Duration,
}

/// Starts the server on a free port; returns its base URL.
pub async fn start(timing: Timing) -> String {
    let app = axum::Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(generate))
        .route("/v1/chat/completions", post(generate))
        .with_state(timing);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    // Like uvicorn: without TCP_NODELAY, Nagle and delayed ACKs hold small
    // chunks back for up to 40 ms and the timings would be the kernel's.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).expect("nodelay"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("fake server") });
    format!("http://{addr}")
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": "good"}, {"id": "http-500"}, {"id": "drop-after-3"}]}))
}

async fn generate(State(timing): State<Timing>, Json(request): Json<Value>) -> Response {
    let arrived = Instant::now();
    let model = request["model"].as_str().unwrap_or_default().to_owned();
    if model == "http-500" {
        return (StatusCode::INTERNAL_SERVER_ERROR, "engine exploded ".repeat(40)).into_response();
    }
    let chat = request.get("messages").is_some();
    let prompt = if chat { &request["messages"][0]["content"] } else { &request["prompt"] };
    let prompt_tokens = prompt.as_str().unwrap_or_default().split_whitespace().count();
    let tokens = request["max_tokens"].as_u64().expect("max_tokens");
    let drop_after = (model == "drop-after-3").then_some(3);

    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        let send = |data: String| tx.send(Ok(Bytes::from(format!("data: {data}\n\n"))));
        // Neither a role-only nor an empty chunk is a token.
        let empty = if chat {
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        } else {
            json!({"choices": [{"index": 0, "text": ""}]})
        };
        send(empty.to_string()).await.ok();
        for i in 0..tokens {
            // Absolute deadlines, so that timer overshoot does not add up.
            tokio::time::sleep_until(arrived + timing.ttft + timing.itl * i as u32).await;
            if drop_after == Some(i) {
                tx.send(Err(std::io::Error::other("dropped on purpose"))).await.ok();
                return;
            }
            let chunk = if chat {
                json!({"choices": [{"index": 0, "delta": {"content": "word "}}]})
            } else {
                json!({"choices": [{"index": 0, "text": "word "}]})
            };
            send(chunk.to_string()).await.ok();
        }
        let usage = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}});
        send(usage.to_string()).await.ok();
        send("[DONE]".to_owned()).await.ok();
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .expect("response")
}
