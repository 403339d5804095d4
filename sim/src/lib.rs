//! A simulated LLM inference engine: an OpenAI-compatible server started with vLLM's or SGLang's own command line.
//!
//! A benchmark matrix runs on it as on a GPU, for demos, dry runs and tests:
//! it reacts to load and to the engines' flags the way the engines do, within
//! the calibration documented in `docs/sim-calibration.md`.
//!
//! Layout:
//! - `config` parses the engines' command lines into a [`SimConfig`];
//! - `profile` holds the hardware and model profiles and the step-time model:
//!   every coefficient of the simulation, in one table;
//! - `kv` is the KV cache in blocks, with prefix caching;
//! - `scheduler` is the engine model: a pure, deterministic continuous-batching
//!   scheduler that plans one step at a time and knows no clock;
//! - `engine` drives it in real time for the server, `simulate` in virtual
//!   time for whole benchmarks in milliseconds;
//! - `calibration` is the published reference studies as rows the model is
//!   fitted to (`examples/calibrate.rs`) and checked against (its test);
//! - `api` is the HTTP layer, which only translates between OpenAI's wire
//!   format and the engine, and serves each engine's `/metrics` (its names,
//!   from the scheduler's state) and version endpoint.

mod api;
pub mod calibration;
mod config;
mod engine;
mod kv;
pub mod pipeline;
pub mod profile;
mod scheduler;
pub mod simulate;

use std::future::Future;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use tokio_util::sync::CancellationToken;

pub use api::ENGINE_VERSION;
pub use config::{
    ArgError, EngineKind, Faults, GPU_ENV, Routing, SIM_FLAGS, SimConfig, help, parse_command_line,
    parse_command_line_with_gpu,
};
pub use engine::EngineCrashed;
pub use scheduler::{Counters, Scheduler, SeqRequest, StartupError, Step, default_memory_fraction};

/// Serves `config`'s simulated engine on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish. Fails at once with the engine's own message when the model does not fit
/// ([`StartupError`]), and with [`EngineCrashed`] when `--sim-crash-after` kills the engine.
pub async fn serve(
    mut config: SimConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let replicas = pipeline::Pipeline::replicas(&config)?;
    let shape = config.model_shape();
    for note in [shape.guessed_size(), shape.estimated_kv()].into_iter().flatten() {
        tracing::warn!("{}: {note}", config.model);
    }
    // SGLang starts with a KV pool smaller than its context, and takes requests its pool holds.
    let pool = replicas.iter().map(pipeline::Pipeline::max_request_tokens).min().unwrap_or(0);
    if pool < config.max_model_len {
        tracing::warn!(
            "the KV cache holds {pool} tokens: requests are limited to them, not --context-length {}",
            config.max_model_len
        );
        config.max_model_len = pool;
    }
    // SGLang's pools set how many requests it runs, which its server info gives.
    if let Some(replica) = replicas.first() {
        config.max_num_seqs = replica.max_num_seqs();
        let tokens: usize = replica.batches().iter().map(Scheduler::kv_capacity_tokens).sum();
        tracing::info!(
            "a replica's KV cache holds {tokens} tokens; at most {} requests run at once",
            config.max_num_seqs
        );
    }
    let (engine, engine_task) = engine::start(
        replicas,
        config.routing,
        config.speedup,
        config.faults.crash_after,
        config.faults.slowdown_pct_per_s,
    );
    let (stopping, dead) = (CancellationToken::new(), engine.dead.clone());
    let stop = stopping.clone();
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = dead.cancelled() => {}
        }
        stop.cancel();
    };
    // As uvicorn serves vLLM: without TCP_NODELAY, Nagle holds a stream's
    // next small chunk until the client acknowledges the last, which a
    // delayed ACK puts off by up to 40 ms, and every reply would arrive in
    // bursts at the kernel's pace instead of the engine's.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, api::router(config, engine, stopping))
        .with_graceful_shutdown(shutdown)
        .await
        .context("the http server failed")?;
    // The router held the last engine handle, so the loop ends once its batch is done.
    engine_task.await.context("the engine loop panicked")??;
    Ok(())
}
