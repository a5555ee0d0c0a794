//! A job's policy as stored on its record: how the framework runs, retries, times out and
//! retains it.
//!
//! Written once, at submit, from the kind's policy (the worker API's `Policy`, which
//! serialises to this shape) with the deployment's overrides applied
//! (`LONGHAUL_POLICY_OVERRIDES`, the template's `JobPolicyOverrides`). Everything that acts on
//! a job later — the dispatcher (concurrency limit), the stage (checkpoint cadence, result
//! retention, stage timeout), the reaper (attempts, runtime) — reads it from the job, so no function needs
//! per-kind configuration, and a deployment that changes a policy never changes the rules
//! of a job already accepted.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The logical name of the shared stage function, which runs every kind whose policy names no
/// worker function of its own.
pub const SHARED_WORKER: &str = "StageFunction";

/// Checkpoint every `items` items or every `interval_seconds`, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCadence {
    /// Items between checkpoints.
    pub items: u64,
    /// Longest time between checkpoints.
    pub interval_seconds: u64,
}

/// A job's policy (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPolicy {
    /// Claims the job gets in all (the first and the re-dispatches).
    pub max_attempts: u32,
    /// Longest the job may run, all attempts together.
    pub max_runtime_seconds: u64,
    /// Longest one stage may run within an attempt, across the invocations that continue it:
    /// a stage past it ends the attempt with `Job.StageTimeout`, retried in the next attempt
    /// (from its checkpoint, the stage's clock started afresh) within `max_attempts`.
    pub stage_timeout_seconds: u64,
    /// How long its result is kept after it succeeded.
    pub result_retention_seconds: u64,
    /// Longest it may stay paused: the reaper cancels it then. Records from before it was
    /// stored get the default, a week.
    #[serde(default = "default_max_paused")]
    pub max_paused_seconds: u64,
    /// How often its stages checkpoint.
    pub checkpoint: CheckpointCadence,
    /// Most jobs of its kind running at once, if limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u32>,
    /// The logical name of the worker function that runs its stages.
    pub worker: String,
    /// One step of the backoff between its attempts ([`crate::retry::Backoff`]); records from
    /// before it was stored get the default, a minute.
    #[serde(default = "default_retry_delay")]
    pub retry_delay_seconds: u64,
    /// What its stages' progress counts (`items`, `bytes`, …), as its kind declared it.
    #[serde(default = "default_progress_unit")]
    pub progress_unit: String,
}

fn default_retry_delay() -> u64 {
    60
}

fn default_max_paused() -> u64 {
    604_800
}

/// The longest `max_paused_seconds` a deployment may set: under the 30 days a job's progress
/// record and checkpoints are kept after their last write (`LONGHAUL_RECORD_RETENTION_SECONDS`
/// and the bucket's lifecycle, by default), so a paused job's checkpoint outlives its pause.
pub const MAX_PAUSED_LIMIT_SECONDS: u64 = 29 * 86_400;

fn default_progress_unit() -> String {
    "items".into()
}

impl Default for JobPolicy {
    /// The worker API's default policy (three attempts, a day's runtime, stages of up to a day,
    /// results kept a week, a checkpoint every 1,000 items or minute, no limit, the shared
    /// stage function): what a record from before policies were stored is judged by.
    fn default() -> Self {
        JobPolicy {
            max_attempts: 3,
            max_runtime_seconds: 86_400,
            stage_timeout_seconds: 86_400,
            result_retention_seconds: 604_800,
            max_paused_seconds: default_max_paused(),
            checkpoint: CheckpointCadence { items: 1_000, interval_seconds: 60 },
            concurrency_limit: None,
            worker: SHARED_WORKER.into(),
            retry_delay_seconds: default_retry_delay(),
            progress_unit: default_progress_unit(),
        }
    }
}

impl JobPolicy {
    /// The longest the job may run.
    pub fn max_runtime(&self) -> Duration {
        Duration::from_secs(self.max_runtime_seconds)
    }

    /// The longest one of its stages may run within an attempt.
    pub fn stage_timeout(&self) -> Duration {
        Duration::from_secs(self.stage_timeout_seconds)
    }

    /// How long its result is kept.
    pub fn result_retention(&self) -> Duration {
        Duration::from_secs(self.result_retention_seconds)
    }

    /// The longest it may stay paused.
    pub fn max_paused(&self) -> Duration {
        Duration::from_secs(self.max_paused_seconds)
    }

    /// When a pause that began at `paused_at` lapses (the reaper cancels the job then).
    pub fn pause_lapses_at(&self, paused_at: crate::Timestamp) -> crate::Timestamp {
        let seconds = i64::try_from(self.max_paused_seconds).unwrap_or(i64::MAX);
        let lapse = chrono::Duration::try_seconds(seconds).unwrap_or(chrono::Duration::MAX);
        crate::Timestamp::from(
            paused_at
                .as_datetime()
                .checked_add_signed(lapse)
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
        )
    }
}

/// What a deployment changes in one kind's policy (every field optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyOverride {
    /// See [`JobPolicy::max_attempts`].
    pub max_attempts: Option<u32>,
    /// See [`JobPolicy::max_runtime_seconds`].
    pub max_runtime_seconds: Option<u64>,
    /// See [`JobPolicy::stage_timeout_seconds`].
    pub stage_timeout_seconds: Option<u64>,
    /// See [`JobPolicy::result_retention_seconds`].
    pub result_retention_seconds: Option<u64>,
    /// See [`JobPolicy::max_paused_seconds`].
    pub max_paused_seconds: Option<u64>,
    /// See [`JobPolicy::checkpoint`].
    pub checkpoint: Option<CheckpointCadence>,
    /// See [`JobPolicy::concurrency_limit`]; `0` removes the kind's limit.
    pub concurrency_limit: Option<u32>,
    /// See [`JobPolicy::retry_delay_seconds`].
    pub retry_delay_seconds: Option<u64>,
}

/// Why a deployment's overrides were refused (at start-up: a typo must not pass silently).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OverrideError {
    /// Not a JSON object of kind name → override.
    #[error("not a JSON object of job type → policy fields: {0}")]
    Malformed(String),
    /// Names a kind this deployment does not have.
    #[error("no job type {0:?} (known: {1})")]
    UnknownKind(String, String),
    /// A value out of range.
    #[error("{kind}: {field} must be at least 1")]
    Zero {
        /// The kind.
        kind: String,
        /// The field.
        field: &'static str,
    },
    /// A value longer than what it must stay under.
    #[error("{kind}: {field} must be at most {max}")]
    TooLong {
        /// The kind.
        kind: String,
        /// The field.
        field: &'static str,
        /// Its largest value.
        max: u64,
    },
}

/// A deployment's overrides, by kind name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyOverrides(BTreeMap<String, PolicyOverride>);

impl PolicyOverrides {
    /// Parses `text` (JSON: `{"<kind>": {"max_attempts": 5, …}}`; empty means none), checking
    /// every kind is one of `known`.
    pub fn parse(text: &str, known: &[&str]) -> Result<Self, OverrideError> {
        if text.trim().is_empty() {
            return Ok(PolicyOverrides::default());
        }
        let map: BTreeMap<String, PolicyOverride> =
            serde_json::from_str(text).map_err(|e| OverrideError::Malformed(e.to_string()))?;
        for (kind, o) in &map {
            if !known.contains(&kind.as_str()) {
                return Err(OverrideError::UnknownKind(kind.clone(), known.join(", ")));
            }
            let zero = |field| Err(OverrideError::Zero { kind: kind.clone(), field });
            if o.max_attempts == Some(0) {
                return zero("max_attempts");
            }
            if o.max_runtime_seconds == Some(0) {
                return zero("max_runtime_seconds");
            }
            if o.stage_timeout_seconds == Some(0) {
                return zero("stage_timeout_seconds");
            }
            if o.max_paused_seconds == Some(0) {
                return zero("max_paused_seconds");
            }
            if o.max_paused_seconds.is_some_and(|s| s > MAX_PAUSED_LIMIT_SECONDS) {
                return Err(OverrideError::TooLong {
                    kind: kind.clone(),
                    field: "max_paused_seconds",
                    max: MAX_PAUSED_LIMIT_SECONDS,
                });
            }
            if o.checkpoint.is_some_and(|c| c.items == 0 || c.interval_seconds == 0) {
                return zero("checkpoint");
            }
            if o.retry_delay_seconds == Some(0) {
                return zero("retry_delay_seconds");
            }
        }
        Ok(PolicyOverrides(map))
    }

    /// `policy` of kind `kind` with this deployment's overrides applied (and its pause bounded
    /// by [`MAX_PAUSED_LIMIT_SECONDS`], whatever the kind asks).
    pub fn apply(&self, kind: &str, mut policy: JobPolicy) -> JobPolicy {
        policy.max_paused_seconds = policy.max_paused_seconds.min(MAX_PAUSED_LIMIT_SECONDS);
        let Some(o) = self.0.get(kind) else { return policy };
        policy.max_attempts = o.max_attempts.unwrap_or(policy.max_attempts);
        policy.max_runtime_seconds = o.max_runtime_seconds.unwrap_or(policy.max_runtime_seconds);
        policy.stage_timeout_seconds =
            o.stage_timeout_seconds.unwrap_or(policy.stage_timeout_seconds);
        policy.result_retention_seconds =
            o.result_retention_seconds.unwrap_or(policy.result_retention_seconds);
        policy.max_paused_seconds = o.max_paused_seconds.unwrap_or(policy.max_paused_seconds);
        policy.checkpoint = o.checkpoint.unwrap_or(policy.checkpoint);
        policy.retry_delay_seconds = o.retry_delay_seconds.unwrap_or(policy.retry_delay_seconds);
        if let Some(limit) = o.concurrency_limit {
            policy.concurrency_limit = (limit > 0).then_some(limit);
        }
        policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> JobPolicy {
        JobPolicy { concurrency_limit: Some(4), ..JobPolicy::default() }
    }

    #[test]
    fn overrides_change_only_what_they_name() {
        let o = PolicyOverrides::parse(
            r#"{"demo": {"max_attempts": 5, "concurrency_limit": 0}}"#,
            &["demo", "csv_report"],
        )
        .unwrap();
        let demo = o.apply("demo", policy());
        assert_eq!((demo.max_attempts, demo.concurrency_limit), (5, None));
        assert_eq!(demo.retry_delay_seconds, 60, "not named: unchanged");
        let slower = PolicyOverrides::parse(r#"{"demo": {"retry_delay_seconds": 300}}"#, &["demo"]);
        assert_eq!(slower.unwrap().apply("demo", policy()).retry_delay_seconds, 300);
        assert_eq!(demo.max_runtime_seconds, 86_400);
        assert_eq!(o.apply("csv_report", policy()), policy());
        assert_eq!(PolicyOverrides::parse(" ", &[]).unwrap(), PolicyOverrides::default());
    }

    #[test]
    fn bad_overrides_are_refused() {
        let known = ["demo"];
        assert!(matches!(
            PolicyOverrides::parse(r#"{"dmeo": {}}"#, &known),
            Err(OverrideError::UnknownKind(..))
        ));
        assert!(matches!(
            PolicyOverrides::parse(r#"{"demo": {"max_attempt": 5}}"#, &known),
            Err(OverrideError::Malformed(_))
        ));
        assert!(matches!(
            PolicyOverrides::parse(r#"{"demo": {"max_attempts": 0}}"#, &known),
            Err(OverrideError::Zero { .. })
        ));
        assert!(matches!(
            PolicyOverrides::parse(r#"{"demo": {"retry_delay_seconds": 0}}"#, &known),
            Err(OverrideError::Zero { field: "retry_delay_seconds", .. })
        ));
        assert!(matches!(
            PolicyOverrides::parse(r#"{"demo": {"max_paused_seconds": 2592000}}"#, &known),
            Err(OverrideError::TooLong { field: "max_paused_seconds", .. })
        ));
        let month = PolicyOverrides::parse(r#"{"demo": {"max_paused_seconds": 2505600}}"#, &known);
        assert_eq!(month.unwrap().apply("demo", policy()).max_paused_seconds, 2_505_600);
        assert!(PolicyOverrides::parse("[]", &known).is_err());
    }

    #[test]
    fn the_stored_shape_round_trips() {
        let json = serde_json::to_value(policy()).unwrap();
        assert_eq!(json["checkpoint"]["interval_seconds"], 60);
        assert_eq!(serde_json::from_value::<JobPolicy>(json).unwrap(), policy());
    }
}
