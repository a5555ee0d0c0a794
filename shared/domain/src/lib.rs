//! The longhaul domain: jobs and their state machine (job kinds live under `jobs/`, written
//! against `longhaul-worker`).
//!
//! This crate knows nothing about AWS or Lambda. Adapters (`longhaul-aws`) persist and move
//! these types; functions compose the two.

/// The conveniences of a text newtype that only valid text parses into (`JobId`, `Owner`):
/// it reads as its text without a copy (`Deref<Target = str>`, `AsRef<str>`), displays and
/// compares as it, turns into a `String`, and deserialises through its `FromStr`, so a stored
/// value that does not parse is an error, never a default. The type keeps its own `as_str`,
/// `FromStr` and `Serialize` (`#[serde(transparent)]`).
macro_rules! text_newtype {
    ($name:ident) => {
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl From<&$name> for String {
            fn from(value: &$name) -> String {
                value.0.clone()
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text =
                    <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod admission;
pub mod callback;
pub mod compensation;
pub mod cursor;
pub mod endpoints;
pub mod fingerprint;
pub mod inline_result;
pub mod job;
pub mod limits;
mod link_mac;
pub mod owner;
pub mod policy;
pub mod progress;
pub mod reaper;
pub mod recurrence;
pub mod result_link;
pub mod retry;
pub mod schedule;
pub mod schedules;
pub mod signals;
pub mod status;
pub mod stream_token;
pub mod time;
pub mod uploads;
pub mod webhooks;

pub use job::{Cancellation, ErrorCode, JobError, JobId, Pause, Transition};
pub use owner::{InvalidOwner, Owner};
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
