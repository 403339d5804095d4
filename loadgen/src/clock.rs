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
