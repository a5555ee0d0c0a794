//! A clock a test sets: [`ManualClock`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use longhaul_aws::ports::{Clock, Warm};

/// A clock that moves only when a test moves it: [`set`](ManualClock::set) it to a time of
/// day or [`advance`](ManualClock::advance) it; or, made [`stepping`](ManualClock::stepping),
/// each reading is a fixed step later than the one before (a run that takes time, for a
/// handler's time budget). Its time of day and its monotonic instant move together, except
/// that the instant never goes back (setting the time of day back leaves it where it is).
#[derive(Debug)]
pub struct ManualClock {
    state: Mutex<Readings>,
    step: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Readings {
    now: DateTime<Utc>,
    instant: Instant,
}

impl Readings {
    fn move_on(&mut self, by: Duration) {
        self.instant += by;
        self.now += chrono::Duration::from_std(by).expect("a test's step fits chrono");
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock standing still at the machine's time of day now.
    pub fn new() -> Self {
        ManualClock::at(Utc::now())
    }

    /// A clock standing still at `now`.
    pub fn at(now: DateTime<Utc>) -> Self {
        ManualClock {
            state: Mutex::new(Readings { now, instant: Instant::now() }),
            step: Duration::ZERO,
        }
    }

    /// This clock, moved on by `step` after each reading (of either its time of day or its
    /// instant): the first reading is its time as it stands, the next `step` later, and so on.
    pub fn stepping(self, step: Duration) -> Self {
        ManualClock { step, ..self }
    }

    /// Sets the time of day to `now`; the instant moves on as far, if `now` is later.
    pub fn set(&self, now: DateTime<Utc>) {
        let mut state = self.lock();
        if let Ok(ahead) = (now - state.now).to_std() {
            state.instant += ahead;
        }
        state.now = now;
    }

    /// Moves the clock on by `by`.
    pub fn advance(&self, by: Duration) {
        self.lock().move_on(by);
    }

    /// Reads the clock, moving it on by its step.
    fn read(&self) -> Readings {
        let mut state = self.lock();
        let reading = *state;
        state.move_on(self.step);
        reading
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Readings> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl Warm for ManualClock {}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        self.read().now
    }

    fn instant(&self) -> Instant {
        self.read().instant
    }
}
