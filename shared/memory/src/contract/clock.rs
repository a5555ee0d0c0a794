//! The clock's contract ([`Clock`]): neither the time of day nor the monotonic instant goes
//! back from one reading to the next, the two move on together, and the time of day is UTC
//! as it is today (not a clock's zero).

use std::time::Duration;

use chrono::{TimeZone, Utc};
use longhaul_aws::ports::Clock;

/// Runs the whole contract on `clock`. Panics, naming the clause, on the first breach.
pub async fn clock(clock: &impl Clock) {
    let (first_now, first_instant) = (clock.now(), clock.instant());
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (then_now, then_instant) = (clock.now(), clock.instant());
    assert!(then_instant >= first_instant, "the instant never goes back");
    assert!(then_now >= first_now, "the time of day does not go back: {first_now} {then_now}");
    let by_day = (then_now - first_now).to_std().expect("not back");
    let by_instant = then_instant - first_instant;
    assert!(
        by_day.abs_diff(by_instant) < Duration::from_secs(1),
        "they move on together: {by_day:?} by the time of day, {by_instant:?} by the instant"
    );
    let since = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap();
    assert!(first_now > since, "a time of day of today's, in UTC: {first_now}");
}
