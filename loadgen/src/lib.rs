//! benchfleet-loadgen: an OpenAI-compatible streaming load generator.
//!
//! Layout: `record` (one record per request) and `metrics` (the metric
//! definitions) are the shared core that the controller also uses; `block`
//! renders the "Serving Benchmark Result" block; `convert` is the only module
//! that sees the gRPC types besides `sink`, which streams records to the
//! controller. A run (`run`) takes its prompts from `dataset`, its send
//! deadlines from `schedule`, sends through `client` (the hot path) and
//! reads every time from `clock`.

pub mod block;
mod client;
mod clock;
pub mod convert;
pub mod dataset;
pub mod metrics;
pub mod record;
mod run;
pub mod schedule;
pub mod sink;

pub use block::render_block;
pub use client::Endpoint;
pub use dataset::{Dataset, DatasetError, ShareGpt, ShareGptEntry, load_sharegpt, read_sharegpt};
pub use metrics::{Distribution, Summary, summarize};
pub use record::{Chunk, Outcome, RequestRecord};
pub use run::{LoadConfig, LoadError, LoadResult, Progress, run};
pub use schedule::{Arrival, send_times};
pub use sink::{SinkConfig, SinkError};
