//! A simulated LLM inference engine: an OpenAI-compatible server started with vLLM's or SGLang's own command line.
//!
//! A benchmark matrix runs on it as on a GPU, for demos, dry runs and tests.
//! Layout: `config` parses the engines' command lines into a [`SimConfig`],
//! `engine` is the scheduler loop and its latency model (the one place to make
//! the simulation more realistic), and `api` is the HTTP layer, which only
//! translates between OpenAI's wire format and the engine.

mod api;
mod config;
mod engine;

use std::future::Future;

use anyhow::Context as _;

pub use config::{ArgError, EngineKind, SimConfig, parse_command_line};
pub use engine::{Timing, step_time};

/// Serves `config`'s simulated engine on `listener` until `shutdown` resolves,
/// then lets in-flight requests finish.
pub async fn serve(
    config: SimConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let limits =
        engine::Limits { max_num_seqs: config.max_num_seqs, max_num_batched_tokens: config.max_num_batched_tokens };
    let (engine, engine_task) = engine::start(config.timing, limits);
    axum::serve(listener, api::router(config, engine))
        .with_graceful_shutdown(shutdown)
        .await
        .context("the http server failed")?;
    // The router held the last engine handle, so the loop ends once its batch is done.
    engine_task.await.context("the engine loop panicked")
}
