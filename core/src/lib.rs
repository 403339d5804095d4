//! benchfleet-core: what the controller, the agent and loadgen share.
//!
//! Layout: `record` is one request's raw facts; `metrics` the metric
//! definitions, the only implementation of them (`summarize`, the
//! self-check), producing a `Summary`; `block` renders a summary as the
//! "Serving Benchmark Result" block; `digest` keeps a run's distributions as
//! histograms that merge, and pools repeats into one block; `gpu` matches GPU models to product
//! names; `sharegpt` reads ShareGPT files, counting what it skips and why
//! (and, for sessions, keeping each conversation's later exchanges); `trace`
//! reads request traces (Mooncake's, or JSON Lines) to replay; `telemetry`
//! summarizes what an agent samples during a job (engine `/metrics`, GPU
//! readings, the GPUs' energy) and words a throttled GPU; `convert` is the one place records, summaries and load specs cross to and
//! from their gRPC form; `tls` is the rule every client keeps to reach the
//! controller (https verified, plain text only to loopback or when asked);
//! `notify` tells systemd a daemon is ready or stopping; `config` is the
//! daemons' one precedence: flag, environment, `--config` file, default;
//! `load` is one job's load (`LoadSpec`), typed once, and the one mapping
//! from it to loadgen's flags; `engine` is an engine's command line, for
//! the agent that starts it and the reports that show it.

pub mod block;
pub mod config;
#[cfg(feature = "wire")]
pub mod convert;
pub mod cost;
pub mod digest;
pub mod engine;
pub mod flags;
pub mod gpu;
pub mod load;
pub mod metrics;
pub mod notify;
pub mod record;
pub mod sharegpt;
pub mod stats;
pub mod telemetry;
#[cfg(feature = "wire")]
pub mod tls;
pub mod trace;

pub use block::{Sections, render_block, render_block_with};
pub use digest::{Digest, DigestBuilder, Histogram, pool};
pub use metrics::{
    DEFAULT_PERCENTILES, Distribution, Failures, Percentile, Summary, SummaryBuilder, SummaryOptions, summarize,
    summarize_with,
};
pub use record::{Chunk, ChunkIter, Chunks, Outcome, Phase, RequestRecord, Turn};

/// A time as `2026-12-01 19:40:56 UTC`.
pub fn utc(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// This host's name, `None` when the kernel does not say (each caller
/// chooses its own stand-in).
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty())
}
