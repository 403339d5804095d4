//! The run's one monotonic clock: every time in a record is read here.
//!
//! Measurement needs the real clock, never `tokio::time`'s (which tests may
//! pause), so this is the only place that reads `std::time::Instant`.

use std::time::{Duration, Instant};

/// Nanoseconds since the start of a load run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    start: Instant,
}

impl Clock {
    /// Starts the run's clock now.
    pub(crate) fn start() -> Clock {
        Clock { start: Instant::now() }
    }

    /// Nanoseconds since the start; saturates after ~292 years.
    pub(crate) fn now_ns(&self) -> i64 {
        i64::try_from(self.start.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }

    /// The instant `offset` after the start, for `sleep_until`.
    pub(crate) fn at(&self, offset: Duration) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.start + offset)
    }
}

/// CPU time (user + system, all threads) this process has used so far, from
/// `/proc/self/stat`; `None` where that file does not exist. Read twice per
/// run, never on the hot path.
pub fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, in clock ticks
    // of 1/100 s (USER_HZ, fixed at 100 on every Linux ABI).
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}
