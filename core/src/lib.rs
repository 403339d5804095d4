//! benchfleet-core: what the controller, the agent and loadgen share.
//!
//! Layout: `record` is one request's raw facts; `metrics` the metric
//! definitions, the only implementation of them (`summarize`, the
//! self-check), producing a `Summary`; `block` renders a summary as the
//! "Serving Benchmark Result" block; `digest` keeps a run's distributions as
//! histograms that merge, and pools repeats into one block; `gpu` matches GPU models to product
//! names; `sharegpt` reads ShareGPT files, counting what it skips and why; `telemetry`
//! summarizes what an agent samples during a job (engine `/metrics`, GPU
//! readings) and words a throttled GPU; `convert` is the one place records and summaries cross to and
//! from their gRPC form; `tls` is the rule every client keeps to reach the
//! controller (https verified, plain text only to loopback or when asked).

pub mod block;
pub mod convert;
pub mod digest;
pub mod gpu;
pub mod metrics;
pub mod record;
pub mod sharegpt;
pub mod stats;
pub mod telemetry;
pub mod tls;

pub use block::render_block;
pub use digest::{Digest, DigestBuilder, Histogram, pool};
pub use metrics::{
    DEFAULT_PERCENTILES, Distribution, Failures, Percentile, Summary, SummaryOptions, summarize, summarize_with,
};
pub use record::{Chunk, ChunkIter, Chunks, Outcome, Phase, RequestRecord};
