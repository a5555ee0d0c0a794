//! What time it is: the wall clock a handler's decisions are taken by (what has expired, when
//! a delayed webhook is due, which secrets are still active) and the monotonic clock a run's
//! time budget is measured by.
//!
//! A port like the others, so that a handler's unit test sets the time (`ManualClock` in
//! `longhaul-memory`) instead of racing the machine's. Reading a clock does no I/O, so its
//! calls are not `async`; its "adapter" is the machine's clock, [`SystemClock`].

use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::Warm;

/// What time it is.
pub trait Clock: Warm {
    /// The time of day, in UTC: what a handler compares stored times with.
    fn now(&self) -> DateTime<Utc>;
    /// The monotonic clock's current instant: what durations and time budgets are measured by
    /// (it never goes back, whatever the time of day does).
    fn instant(&self) -> Instant;
}

/// The machine's clocks: [`Utc::now`] and [`Instant::now`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait]
impl Warm for SystemClock {}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}
