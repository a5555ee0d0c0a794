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

/// A charge of the submission rate kept on an item with other attributes (the tenant pool's
/// holders item, so that a job's slot and its submission are one write): the window's index
/// and count live in two attributes of that item, not in an item per window. DynamoDB's update
/// expressions have no `max()`, so a charge either adds to the stored window's count or opens
/// a newer window at one, each under its own condition; a refused charge reads the item it
/// was refused by (returned with the refusal) to tell which it should have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowCharge {
    /// Add one to window `index`'s count: it is the stored window, and not full.
    Add {
        /// The window.
        index: i64,
    },
    /// Open window `index` at a count of one: the stored window is older, or there is none.
    Open {
        /// The window.
        index: i64,
    },
}

impl WindowCharge {
    /// The first try in window `index`: [`WindowCharge::Add`] when the last charge this
    /// process saw stored was in it, else [`WindowCharge::Open`] — right for every charge but
    /// the first one a process makes in a window another process opened.
    pub fn first(index: i64, last_seen: Option<i64>) -> Self {
        if last_seen == Some(index) {
            WindowCharge::Add { index }
        } else {
            WindowCharge::Open { index }
        }
    }

    /// The window this charge counts in.
    pub fn index(self) -> i64 {
        match self {
            WindowCharge::Add { index } | WindowCharge::Open { index } => index,
        }
    }

    /// After a charge in window `index` was refused by an item storing `stored` (its window
    /// and count; `None`: no window): the charge to try next, or `None` when the stored
    /// window is full. The next window (another process's clock a little ahead, at a minute's
    /// turn) is the one charged; one further ahead is taken for stale, as an older one is, so
    /// a clock far off cannot lock a tenant out until its minute comes.
    pub fn after_refusal(index: i64, stored: Option<(i64, u64)>, per_minute: u32) -> Option<Self> {
        match stored {
            None => Some(WindowCharge::Open { index }),
            Some((window, _)) if window < index || window > index + 1 => {
                Some(WindowCharge::Open { index })
            }
            Some((_, count)) if count >= u64::from(per_minute) => None,
            Some((window, _)) => Some(WindowCharge::Add { index: window }),
        }
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
    use super::WindowCharge;

    #[test]
    fn a_window_charge_adds_where_it_saw_the_window_and_learns_from_a_refusal() {
        assert_eq!(WindowCharge::first(7, Some(7)), WindowCharge::Add { index: 7 });
        assert_eq!(WindowCharge::first(7, Some(6)), WindowCharge::Open { index: 7 });
        assert_eq!(WindowCharge::first(7, None), WindowCharge::Open { index: 7 });
        // Refused: what the item stores decides.
        let next = |stored| WindowCharge::after_refusal(7, stored, 3);
        assert_eq!(next(None), Some(WindowCharge::Open { index: 7 }), "no window stored");
        assert_eq!(next(Some((6, 3))), Some(WindowCharge::Open { index: 7 }), "an older one");
        assert_eq!(next(Some((7, 2))), Some(WindowCharge::Add { index: 7 }), "opened already");
        assert_eq!(next(Some((7, 3))), None, "full");
        assert_eq!(next(Some((8, 0))), Some(WindowCharge::Add { index: 8 }), "a clock ahead");
        assert_eq!(next(Some((8, 3))), None, "a clock ahead, full");
        assert_eq!(next(Some((9, 3))), Some(WindowCharge::Open { index: 7 }), "far ahead: stale");
        assert_eq!(WindowCharge::Add { index: 8 }.index(), 8);
    }

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
