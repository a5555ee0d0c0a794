//! Jobs: identity, transitions and errors (kinds and their params: `longhaul-worker`).

use serde::{Deserialize, Serialize};
use std::str::FromStr;

use crate::Timestamp;
use crate::status::JobStatus;

/// A job's identity: a UUIDv7 (so ids sort by creation time), held in its canonical
/// hyphenated text — the form every key, URL and message carries, so it reads as a `&str`
/// without a copy. Only a canonical id parses (or deserialises): one job has one spelling.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct JobId(String);

impl JobId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        JobId(uuid::Uuid::now_v7().as_hyphenated().to_string())
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// When the id was made, to the millisecond: the time a UUIDv7 carries (`None` for an id
    /// of another version, which carries none).
    pub fn made_at(&self) -> Option<Timestamp> {
        let (seconds, nanos) = uuid::Uuid::try_parse(&self.0).ok()?.get_timestamp()?.to_unix();
        let at = chrono::DateTime::from_timestamp(i64::try_from(seconds).ok()?, nanos)?;
        Some(at.into())
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

text_newtype!(JobId);

impl FromStr for JobId {
    type Err = InvalidJobId;
    /// Accepts only the canonical hyphenated form, so one job has exactly one URL.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let id = uuid::Uuid::try_parse(s).map_err(|_| InvalidJobId)?;
        if id.as_hyphenated().to_string() != s {
            return Err(InvalidJobId);
        }
        Ok(JobId(s.to_owned()))
    }
}

/// A string that is not a job id.
#[derive(Debug, thiserror::Error)]
#[error("not a job id")]
pub struct InvalidJobId;

/// One entry of a job's transition log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// The state entered.
    pub state: JobStatus,
    /// When.
    pub at: Timestamp,
    /// Why, in words a person can act on.
    pub reason: String,
}

/// A cancellation request: who asked, when and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancellation {
    /// When.
    pub requested_at: Timestamp,
    /// The principal that asked.
    pub requested_by: crate::Owner,
    /// The reason they gave, if any.
    pub reason: Option<String>,
}

impl Cancellation {
    /// The job's transition log entry for it: who cancelled, and why if they said.
    pub fn log_reason(&self) -> String {
        match &self.reason {
            Some(reason) => format!("cancelled by {}: {reason}", self.requested_by),
            None => format!("cancelled by {}", self.requested_by),
        }
    }
}

/// An owner's pause of a job: who asked, when and why, and — once the job stopped — since
/// when it is `paused`. Kept while the pause is asked for or holds; `resume` removes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// When it was asked for.
    pub requested_at: Timestamp,
    /// The principal that asked.
    pub requested_by: crate::Owner,
    /// The reason they gave, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the job became `paused` (absent while a running job is still on its way there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<Timestamp>,
    /// A job its own stage parked to wait for a signal: the signal it waits for, and until
    /// when (then its stage is told the wait timed out). Absent on an owner's pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<crate::signals::Wait>,
}

impl Pause {
    /// The job's transition log entry for it: who paused, and why if they said — or what its
    /// stage waits for.
    pub fn log_reason(&self) -> String {
        match (&self.wait, &self.reason) {
            (Some(wait), _) => format!("waiting for signal {} until {}", wait.signal, wait.until),
            (None, Some(reason)) => format!("paused by {}: {reason}", self.requested_by),
            (None, None) => format!("paused by {}", self.requested_by),
        }
    }
}

/// Why a job failed: a stable code and a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    /// Stable, machine-readable: one of our [`ErrorCode`]s (`Job.Fatal`, `Job.Retryable`, …),
    /// or the name of the infrastructure error that ended the job (`States.Timeout`, …).
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

impl JobError {
    /// An error of one of our own codes.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        JobError { code: code.as_str().to_owned(), message: message.into() }
    }

    /// Whether it is of our `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code == code.as_str()
    }
}

/// The error names longhaul itself gives a job's failure — what the state machine matches on
/// (the stage's errors) and what a job's `error.code` says (also the reaper's verdicts). The
/// one place these strings are spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A transient failure: retried within the attempt, then in the next attempt.
    Retryable,
    /// Retrying cannot help (bad input, access denied, a kind's verdict on the owner's data).
    Fatal,
    /// Another attempt holds the job (the state machine stops the execution quietly).
    LeaseLost,
    /// The job was not waiting to be claimed.
    NotClaimable,
    /// The owner cancelled the running job (never recorded as a failure).
    Cancelled,
    /// The owner paused the running job (never recorded as a failure: the stage parks it).
    Paused,
    /// It ran longer than its policy's maximum runtime (the reaper).
    Timeout,
    /// Its worker died and its attempts were spent (the reaper).
    Abandoned,
    /// No execution could be started for it (the reaper).
    Undispatchable,
    /// A stage ran past its policy's stage timeout within the attempt (the stage): a transient
    /// failure that ends the attempt, retried in the next one within the retry budget.
    StageTimeout,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 10] = [
        ErrorCode::Retryable,
        ErrorCode::Fatal,
        ErrorCode::LeaseLost,
        ErrorCode::NotClaimable,
        ErrorCode::Cancelled,
        ErrorCode::Paused,
        ErrorCode::Timeout,
        ErrorCode::Abandoned,
        ErrorCode::Undispatchable,
        ErrorCode::StageTimeout,
    ];

    /// The prefix of every name of ours.
    pub const PREFIX: &'static str = "Job.";

    /// The name (`Job.Retryable`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Retryable => "Job.Retryable",
            ErrorCode::Fatal => "Job.Fatal",
            ErrorCode::LeaseLost => "Job.LeaseLost",
            ErrorCode::NotClaimable => "Job.NotClaimable",
            ErrorCode::Cancelled => "Job.Cancelled",
            ErrorCode::Paused => "Job.Paused",
            ErrorCode::Timeout => "Job.Timeout",
            ErrorCode::Abandoned => "Job.Abandoned",
            ErrorCode::Undispatchable => "Job.Undispatchable",
            ErrorCode::StageTimeout => "Job.StageTimeout",
        }
    }

    /// The code named `name`, if it is one of ours.
    pub fn parse(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// Whether `name` is in our namespace (`Job.*`), known or not.
    pub fn is_ours(name: &str) -> bool {
        name.starts_with(Self::PREFIX)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_id_tells_when_it_was_made() {
        let before = chrono::Utc::now().timestamp_millis();
        let made = JobId::new().made_at().expect("a UUIDv7 carries its time");
        let after = chrono::Utc::now().timestamp_millis();
        assert!((before..=after).contains(&made.as_datetime().timestamp_millis()));
        let at: JobId = "018bcfe5-6800-7000-8000-000000000000".parse().unwrap();
        assert_eq!(at.made_at().unwrap().as_datetime().timestamp_millis(), 0x018b_cfe5_6800);
        let v4: JobId = "6f1c2a44-1b1e-4c3b-9d7e-2f4a5b6c7d8e".parse().unwrap();
        assert_eq!(v4.made_at(), None, "a version 4 id carries no time");
    }

    #[test]
    fn error_codes_round_trip_and_are_ours() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert!(ErrorCode::is_ours(code.as_str()));
            assert!(JobError::new(code, "m").is(code));
        }
        assert_eq!(ErrorCode::parse("States.Timeout"), None);
        assert!(!ErrorCode::is_ours("States.Timeout"));
    }

    #[test]
    fn a_cancellation_reads_in_the_log_as_who_and_why() {
        let mut c = Cancellation {
            requested_at: "2026-11-24T18:00:00.000Z".parse().unwrap(),
            requested_by: "alice".parse().unwrap(),
            reason: Some("the partner is down".into()),
        };
        assert_eq!(c.log_reason(), "cancelled by alice: the partner is down");
        c.reason = None;
        assert_eq!(c.log_reason(), "cancelled by alice");
    }

    #[test]
    fn a_pause_reads_in_the_log_as_who_and_why() {
        let mut p = Pause {
            requested_at: "2026-11-24T18:00:00.000Z".parse().unwrap(),
            requested_by: "alice".parse().unwrap(),
            reason: Some("the month's close".into()),
            paused_at: None,
            wait: None,
        };
        assert_eq!(p.log_reason(), "paused by alice: the month's close");
        p.reason = None;
        assert_eq!(p.log_reason(), "paused by alice");
    }

    #[test]
    fn job_ids_are_v7_and_parse_canonically() {
        let id = JobId::new();
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 7);
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<JobId>(&json).unwrap(), id);
        for bad in ["\"j-1\"", "\"not-a-uuid\"", "42"] {
            assert!(serde_json::from_str::<JobId>(bad).is_err(), "{bad}");
        }
        assert!(id.to_string().to_uppercase().parse::<JobId>().is_err());
        assert!("not-a-uuid".parse::<JobId>().is_err());
        assert!("../etc/passwd".parse::<JobId>().is_err());
    }
}
