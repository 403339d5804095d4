//! benchfleet-loadgen: an OpenAI-compatible streaming load generator.
//!
//! Layout: `record` (one record per request) and `metrics` (the metric
//! definitions) are the shared core that the controller also uses; `block`
//! renders the "Serving Benchmark Result" block and the self-check, `output`
//! writes records and summaries as JSONL, JSON and CSV; `convert` is the only module
//! that sees the gRPC types besides `sink`, which streams records to the
//! controller. A run (`run`) takes its prompts from `dataset`, its send
//! deadlines from `schedule`, sends through `client` (the hot path) and
//! reads every time from `clock`; `rx` dates each read by when the kernel
//! received its bytes.

pub mod block;
mod client;
mod clock;
pub mod convert;
pub mod dataset;
pub mod metrics;
pub mod output;
pub mod record;
mod run;
pub mod rx;
pub mod schedule;
pub mod sink;

pub use block::render_block;
pub use client::{Endpoint, Timeouts};
pub use clock::cpu_time;
pub use dataset::{
    Dataset, DatasetError, Lengths, ShareGpt, ShareGptEntry, TokenCounter, load_sharegpt, read_sharegpt,
};
pub use metrics::{
    DEFAULT_PERCENTILES, Distribution, Failures, Percentile, Summary, SummaryOptions, summarize, summarize_with,
};
pub use record::{Chunk, ChunkIter, Chunks, Outcome, Phase, RequestRecord};
pub use run::{LoadConfig, LoadError, LoadResult, Progress, Window, run};
pub use schedule::{Arrival, send_times};
pub use sink::{SinkConfig, SinkError};
