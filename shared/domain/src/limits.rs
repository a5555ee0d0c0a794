//! Per-tenant limits that keep one principal from taking the whole deployment: the submission
//! rate (a fixed one-minute window per tenant), the bytes of uploads a day, and the count of open progress streams (leases
//! that expire, so a crashed stream cannot hold its slot forever).
//!
//! Pure arithmetic only; the store (`longhaul_aws::limits`) keeps the counters in DynamoDB.

use std::collections::BTreeMap;

/// Length of a submission-rate window, in seconds.
pub const RATE_WINDOW_SECONDS: i64 = 60;
/// Length of an upload-quota window (a UTC day), in seconds.
pub const UPLOAD_QUOTA_WINDOW_SECONDS: i64 = 86_400;

/// The fixed window a submission at `now` (Unix seconds) is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    /// The window's number: `now / 60` (the minute since the epoch).
    pub index: i64,
    /// Seconds from `now` until the next window opens (1 … the window's length): what
    /// `Retry-After` says to a refused request.
    pub retry_after: u64,
    /// The window's length in seconds.
    pub seconds: i64,
}

impl RateWindow {
    /// The one-minute window `now` falls in.
    pub fn at(now: i64) -> Self {
        RateWindow::of(now, RATE_WINDOW_SECONDS)
    }

    /// The upload-quota window (the UTC day) `now` falls in.
    pub fn day_of(now: i64) -> Self {
        RateWindow::of(now, UPLOAD_QUOTA_WINDOW_SECONDS)
    }

    fn of(now: i64, seconds: i64) -> Self {
        let index = now.div_euclid(seconds);
        let next = (index + 1) * seconds;
        RateWindow { index, retry_after: (next - now).max(1) as u64, seconds }
    }

    /// When the window's counter may be deleted (DynamoDB TTL): an hour after it closed, so
    /// a lagging TTL never matters (the next window is another item anyway).
    pub fn expires_at(&self) -> i64 {
        (self.index + 1) * self.seconds + 3_600
    }
}

/// Open streams of one job or one tenant: stream id → lease expiry (Unix seconds).
///
/// A stream holds its slot as a lease that expires a little after the stream's longest
/// duration: a stream that ends releases it at once, one whose invocation crashed stops
/// counting once its lease has expired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamLeases(pub BTreeMap<String, i64>);

/// Why a stream was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{open} streams are open (the cap is {cap}); retry in {retry_after} s")]
pub struct LeasesFull {
    /// Live leases.
    pub open: usize,
    /// The cap.
    pub cap: usize,
    /// Seconds until a slot frees for sure (the earliest lease's expiry, capped at
    /// [`MAX_STREAM_RETRY_AFTER`]: a stream usually closes well before its lease expires).
    pub retry_after: u64,
}

/// The longest `Retry-After` a refused stream is told.
pub const MAX_STREAM_RETRY_AFTER: u64 = 60;

impl StreamLeases {
    /// Drops the leases that expired before `now`.
    pub fn prune(&mut self, now: i64) {
        self.0.retain(|_, expiry| *expiry >= now);
    }

    /// Prunes expired leases, then adds `stream` with `expiry` if fewer than `cap` remain.
    pub fn admit(
        &mut self,
        stream: &str,
        expiry: i64,
        now: i64,
        cap: usize,
    ) -> Result<(), LeasesFull> {
        self.prune(now);
        if self.0.len() >= cap {
            let earliest = self.0.values().min().copied().unwrap_or(now);
            return Err(LeasesFull {
                open: self.0.len(),
                cap,
                retry_after: ((earliest - now).max(1) as u64).min(MAX_STREAM_RETRY_AFTER),
            });
        }
        self.0.insert(stream.to_owned(), expiry);
        Ok(())
    }

    /// The latest expiry of any lease (the item's TTL), or `None` when there is none.
    pub fn latest(&self) -> Option<i64> {
        self.0.values().max().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_windows_are_minutes_and_retry_after_counts_to_the_next() {
        assert_eq!(RateWindow::at(120), RateWindow { index: 2, retry_after: 60, seconds: 60 });
        assert_eq!(RateWindow::at(179), RateWindow { index: 2, retry_after: 1, seconds: 60 });
        let day = RateWindow::day_of(86_400 + 600);
        assert_eq!((day.index, day.retry_after), (1, 86_400 - 600));
        assert_eq!(day.expires_at(), 2 * 86_400 + 3_600);
        assert_eq!(RateWindow::at(150).retry_after, 30);
        assert_eq!(RateWindow::at(150).expires_at(), 180 + 3_600);
        assert_eq!(RateWindow::at(-1).index, -1, "never panics before the epoch");
    }

    #[test]
    fn leases_admit_up_to_the_cap_and_expired_ones_free_their_slot() {
        let mut leases = StreamLeases::default();
        assert!(leases.admit("a", 1_000, 100, 2).is_ok());
        assert!(leases.admit("b", 1_010, 100, 2).is_ok());
        let full = leases.admit("c", 1_020, 100, 2).unwrap_err();
        assert_eq!((full.open, full.cap), (2, 2));
        assert_eq!(full.retry_after, MAX_STREAM_RETRY_AFTER, "capped");
        assert_eq!(leases.admit("c", 1_020, 990, 2).unwrap_err().retry_after, 10);
        // "a" expired: its slot is free again, and pruned from the map.
        assert!(leases.admit("c", 2_000, 1_001, 2).is_ok());
        assert_eq!(leases.0.keys().collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(leases.latest(), Some(2_000));
        // A cap of 0 admits nothing.
        assert!(StreamLeases::default().admit("x", 10, 0, 0).is_err());
    }
}
