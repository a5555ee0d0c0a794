//! Jobs: identity, validated specifications, transitions and errors.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::csv_report::CsvReportParams;
use crate::demo::DemoParams;
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

/// The kinds of work longhaul runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobType {
    /// A diagnostic job: hashes `items` items, `item_ms` apart, with optional injected failures.
    Demo,
    /// Group-by aggregates over an uploaded CSV file.
    CsvReport,
}

impl JobType {
    /// Every job type, for listings and error messages.
    pub const ALL: [JobType; 2] = [JobType::Demo, JobType::CsvReport];

    /// The name clients use in `"type"`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Demo => "demo",
            JobType::CsvReport => "csv_report",
        }
    }
}

impl FromStr for JobType {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| SpecError::UnknownType(s.chars().take(64).collect()))
    }
}

/// A job's type with its parameters, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum JobSpec {
    /// See [`DemoParams`].
    Demo(DemoParams),
    /// See [`CsvReportParams`].
    CsvReport(CsvReportParams),
}

impl JobSpec {
    /// Validates `params` for the job type named `job_type`.
    pub fn parse(job_type: &str, params: &serde_json::Value) -> Result<JobSpec, SpecError> {
        match job_type.parse::<JobType>()? {
            JobType::Demo => {
                let params: DemoParams = serde_json::from_value(params.clone())
                    .map_err(|e| SpecError::InvalidParams(e.to_string()))?;
                params.validate()?;
                Ok(JobSpec::Demo(params))
            }
            JobType::CsvReport => {
                let params: CsvReportParams = serde_json::from_value(params.clone())
                    .map_err(|e| SpecError::InvalidParams(e.to_string()))?;
                params.validate()?;
                Ok(JobSpec::CsvReport(params))
            }
        }
    }

    /// The job's type.
    pub fn job_type(&self) -> JobType {
        match self {
            JobSpec::Demo(_) => JobType::Demo,
            JobSpec::CsvReport(_) => JobType::CsvReport,
        }
    }

    /// The upload the job reads, if any (it must be the submitter's own).
    pub fn input(&self) -> Option<&str> {
        match self {
            JobSpec::Demo(_) => None,
            JobSpec::CsvReport(params) => Some(&params.input),
        }
    }
}

/// Why a submitted job specification was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// `type` names no job type.
    #[error("unknown job type {0:?}")]
    UnknownType(String),
    /// `params` do not fit the job type.
    #[error("invalid params: {0}")]
    InvalidParams(String),
}

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
    use serde_json::json;

    #[test]
    fn job_ids_are_v7_and_parse_canonically() {
        let id = JobId::new();
        assert_eq!(id.0.get_version_num(), 7);
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
        assert!(id.to_string().to_uppercase().parse::<JobId>().is_err());
        assert!("not-a-uuid".parse::<JobId>().is_err());
        assert!("../etc/passwd".parse::<JobId>().is_err());
    }

    #[test]
    fn spec_parsing() {
        assert!(matches!(
            JobSpec::parse("demo", &json!({"items": 3, "item_ms": 1})),
            Ok(JobSpec::Demo(_))
        ));
        assert!(matches!(JobSpec::parse("nope", &json!({})), Err(SpecError::UnknownType(_))));
        assert!(matches!(
            JobSpec::parse("demo", &json!({"items": "3"})),
            Err(SpecError::InvalidParams(_))
        ));
        assert!(matches!(
            JobSpec::parse("demo", &json!({"items": 3, "extra": true})),
            Err(SpecError::InvalidParams(_))
        ));
    }
}
