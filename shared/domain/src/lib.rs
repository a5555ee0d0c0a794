//! The longhaul domain: jobs and their state machine (job kinds live under `jobs/`, written
//! against `longhaul-worker`).
//!
//! This crate knows nothing about AWS or Lambda. Adapters (`longhaul-aws`) persist and move
//! these types; functions compose the two.

pub mod admission;
pub mod callback;
pub mod cursor;
pub mod fingerprint;
pub mod job;
pub mod limits;
pub mod policy;
pub mod progress;
pub mod reaper;
pub mod retry;
pub mod schedule;
pub mod status;
pub mod stream_token;
pub mod time;
pub mod uploads;
pub mod webhooks;

pub use job::{Cancellation, ErrorCode, JobError, JobId, Transition};
pub use status::{JobStatus, TransitionError};
pub use time::{InvalidTimestamp, Timestamp};

/// The current time as the RFC 3339 string (UTC, milliseconds) stored on every record.
pub fn now_rfc3339() -> String {
    format_rfc3339(chrono::Utc::now())
}

/// Formats a timestamp the way every longhaul record stores it (UTC, millisecond precision),
/// so that lexical order equals time order.
pub fn format_rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
