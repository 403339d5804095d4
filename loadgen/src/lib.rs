//! benchfleet-loadgen: an OpenAI-compatible streaming load generator.
//!
//! Layout: the request record, the metric definitions, the block and their
//! gRPC conversion live in `benchfleet-core` (shared with the controller)
//! and are re-exported here as `record`, `metrics`, `block` and `convert`;
//! `output` writes records and summaries as JSONL, JSON and CSV; `sink`
//! streams records to the controller; `cli` is the binary's command line
//! (flags to a run). A run (`run`) takes its prompts from `dataset`, its send
//! deadlines from `schedule`, sends through `client` (the hot path) and
//! reads every time from `clock`; `rx` dates each read by when the kernel
//! received its bytes.

pub mod cli;
mod client;
mod clock;
pub mod dataset;
pub mod output;
mod run;
pub mod rx;
pub mod schedule;
mod session;
pub mod sink;
pub mod vllm;

pub use benchfleet_core::{block, convert, metrics, record, sharegpt, trace};

pub use block::render_block;
pub use client::{Endpoint, ErrorKind, RequestError, Timeouts};
pub use clock::cpu_time;
pub use dataset::{Dataset, DatasetError, Lengths, TokenCounter, read_sharegpt, read_sharegpt_with, read_trace};
pub use metrics::{
    DEFAULT_PERCENTILES, Distribution, Failures, Percentile, Summary, SummaryOptions, summarize, summarize_with,
};
pub use record::{Chunk, ChunkIter, Chunks, Outcome, Phase, RequestRecord};
pub use run::{LoadConfig, LoadError, LoadResult, Progress, Window, run};
pub use schedule::{Arrival, send_times};
pub use sink::{SinkConfig, SinkError};
