//! Jobs: identity, transitions and errors (kinds and their params: `longhaul-worker`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::status::JobStatus;

/// A job's identity: a UUIDv7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(uuid::Uuid);

impl JobId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        JobId(uuid::Uuid::now_v7())
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.as_hyphenated().fmt(f)
    }
}

impl FromStr for JobId {
    type Err = InvalidJobId;
    /// Accepts only the canonical hyphenated form, so one job has exactly one URL.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let id = uuid::Uuid::try_parse(s).map_err(|_| InvalidJobId)?;
        if id.as_hyphenated().to_string() != s {
            return Err(InvalidJobId);
        }
        Ok(JobId(id))
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
    /// When (RFC 3339, UTC).
    pub at: String,
    /// Why, in words a person can act on.
    pub reason: String,
}

/// A cancellation request: who asked, when and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancellation {
    /// When (RFC 3339, UTC).
    pub requested_at: String,
    /// The principal that asked.
    pub requested_by: String,
    /// The reason they gave, if any.
    pub reason: Option<String>,
}

/// Why a job failed: a stable code and a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    /// Stable, machine-readable (e.g. `Job.Fatal`, `Job.Retryable`).
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_v7_and_parse_canonically() {
        let id = JobId::new();
        assert_eq!(id.0.get_version_num(), 7);
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
        assert!(id.to_string().to_uppercase().parse::<JobId>().is_err());
        assert!("not-a-uuid".parse::<JobId>().is_err());
        assert!("../etc/passwd".parse::<JobId>().is_err());
    }
}
