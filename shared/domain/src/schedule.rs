//! Delayed start: when a job may start, from `delay_seconds` or `not_before` on `POST /jobs`.
//!
//! A delayed job is stored `pending` with its `not_before` and costs nothing while it waits:
//! no execution and no polling. A wait SQS can hold (≤ [`MAX_SQS_DELAY_SECONDS`]) is the
//! intake message's delay; a longer one is not enqueued at submission — the job's pending
//! index entry is keyed [`MAX_SQS_DELAY_SECONDS`] before its start, so the reaper's pending
//! sweep enqueues it then, with the rest as the message's delay. The dispatcher refuses to
//! start a job before its `not_before` (it delays the message again instead).

use chrono::{DateTime, DurationRound, Utc};

/// The longest delay: 30 days.
pub const MAX_DELAY_SECONDS: i64 = 2_592_000;
/// The longest delay SQS gives one message (15 minutes).
pub const MAX_SQS_DELAY_SECONDS: i64 = 900;
/// How far in the past a `not_before` may be (client clock skew) and still mean "now".
pub const PAST_TOLERANCE_SECONDS: i64 = 60;

/// Why a requested start is refused (`422`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Both fields were given.
    #[error("give delay_seconds or not_before, not both")]
    Both,
    /// `delay_seconds` is not an integer from 0 to 2,592,000.
    #[error("delay_seconds must be an integer from 0 to {MAX_DELAY_SECONDS}")]
    BadDelay,
    /// `not_before` is not an RFC 3339 timestamp.
    #[error("not_before must be an RFC 3339 timestamp with an offset, e.g. 2026-01-31T12:00:00Z")]
    BadTimestamp,
    /// `not_before` is further in the past than the tolerance.
    #[error("not_before is in the past (more than {PAST_TOLERANCE_SECONDS} s ago)")]
    InThePast,
    /// `not_before` is more than the longest delay away.
    #[error("not_before is more than {MAX_DELAY_SECONDS} s (30 days) from now")]
    TooFar,
}

/// When a job submitted at `now` may start: `None` for at once, else its `not_before`.
///
/// `delay_seconds` 0, or a `not_before` that is not later than `now` (within the tolerance),
/// means at once. The result is truncated to milliseconds, as every stored timestamp is.
pub fn not_before(
    delay_seconds: Option<&serde_json::Value>,
    not_before: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, ScheduleError> {
    let at = match (delay_seconds, not_before) {
        (Some(_), Some(_)) => return Err(ScheduleError::Both),
        (None, None) => return Ok(None),
        (Some(delay), None) => {
            let delay = delay
                .as_i64()
                .filter(|d| (0..=MAX_DELAY_SECONDS).contains(d))
                .ok_or(ScheduleError::BadDelay)?;
            now + chrono::Duration::seconds(delay)
        }
        (None, Some(text)) => {
            let at = DateTime::parse_from_rfc3339(text)
                .map_err(|_| ScheduleError::BadTimestamp)?
                .to_utc();
            if at < now - chrono::Duration::seconds(PAST_TOLERANCE_SECONDS) {
                return Err(ScheduleError::InThePast);
            }
            if at > now + chrono::Duration::seconds(MAX_DELAY_SECONDS) {
                return Err(ScheduleError::TooFar);
            }
            at
        }
    };
    let at = at.duration_trunc(chrono::Duration::milliseconds(1)).unwrap_or(at);
    Ok((at > now).then_some(at))
}

/// Seconds from `now` until `at`, rounded up (so a message delayed by it never arrives
/// early), and at most what SQS allows per message.
pub fn sqs_delay(at: DateTime<Utc>, now: DateTime<Utc>) -> u32 {
    let ms = (at - now).num_milliseconds().max(0);
    ((ms + 999) / 1000).min(MAX_SQS_DELAY_SECONDS) as u32
}

/// The pending index key of a job that may start at `at` (submitted at `now`): when its
/// dispatch message must exist. A start within SQS's reach is enqueued at submission with a
/// delay, and the job counts as lost only after `at` (key `at`); a later one is enqueued by
/// the reaper [`MAX_SQS_DELAY_SECONDS`] before `at` (key `at − 900 s`).
pub fn pending_index_at(at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    if at - now <= chrono::Duration::seconds(MAX_SQS_DELAY_SECONDS) {
        at
    } else {
        at - chrono::Duration::seconds(MAX_SQS_DELAY_SECONDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    #[test]
    fn delays_and_timestamps_resolve_to_a_start() {
        let now = t("2026-01-01T00:00:00Z");
        assert_eq!(not_before(None, None, now), Ok(None));
        assert_eq!(not_before(Some(&json!(0)), None, now), Ok(None));
        assert_eq!(not_before(Some(&json!(15)), None, now), Ok(Some(t("2026-01-01T00:00:15Z"))));
        assert_eq!(
            not_before(Some(&json!(MAX_DELAY_SECONDS)), None, now),
            Ok(Some(t("2026-01-31T00:00:00Z")))
        );
        assert_eq!(
            not_before(None, Some("2026-01-01T01:00:00+01:00"), now),
            Ok(None),
            "an offset is honoured: that is now"
        );
        assert_eq!(
            not_before(None, Some("2026-01-02T00:00:00Z"), now),
            Ok(Some(t("2026-01-02T00:00:00Z")))
        );
        assert_eq!(not_before(None, Some("2025-12-31T23:59:30Z"), now), Ok(None), "skew");
    }

    #[test]
    fn bad_starts_are_refused() {
        let now = t("2026-01-01T00:00:00Z");
        for bad in [json!(-1), json!(1.5), json!("10"), json!(MAX_DELAY_SECONDS + 1), json!(null)] {
            assert_eq!(not_before(Some(&bad), None, now), Err(ScheduleError::BadDelay), "{bad}");
        }
        assert_eq!(not_before(Some(&json!(1)), Some("x"), now), Err(ScheduleError::Both));
        assert_eq!(not_before(None, Some("tomorrow"), now), Err(ScheduleError::BadTimestamp));
        assert_eq!(
            not_before(None, Some("2026-01-01T00:00:00"), now),
            Err(ScheduleError::BadTimestamp),
            "no offset"
        );
        assert_eq!(
            not_before(None, Some("2025-12-31T23:58:00Z"), now),
            Err(ScheduleError::InThePast)
        );
        assert_eq!(not_before(None, Some("2026-03-01T00:00:00Z"), now), Err(ScheduleError::TooFar));
    }

    #[test]
    fn sqs_delays_round_up_and_are_capped() {
        let now = t("2026-01-01T00:00:00Z");
        assert_eq!(sqs_delay(t("2026-01-01T00:00:14.001Z"), now), 15);
        assert_eq!(sqs_delay(t("2025-01-01T00:00:00Z"), now), 0);
        assert_eq!(sqs_delay(t("2026-01-02T00:00:00Z"), now), 900);
    }

    #[test]
    fn long_waits_are_indexed_a_message_delay_before_their_start() {
        let now = t("2026-01-01T00:00:00Z");
        let soon = t("2026-01-01T00:15:00Z");
        assert_eq!(pending_index_at(soon, now), soon);
        let later = t("2026-01-02T00:00:00Z");
        assert_eq!(pending_index_at(later, now), t("2026-01-01T23:45:00Z"));
    }
}
