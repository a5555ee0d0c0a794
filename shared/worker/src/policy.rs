//! A kind's policy: how the framework runs, retries, times out and retains its jobs.

use std::time::Duration;

use serde::Serialize;

/// The shared stage function, which runs every kind that names no worker of its own.
pub const SHARED_WORKER: &str = "StageFunction";

/// How the framework treats a kind's jobs. Start from [`Policy::default`] and change what the
/// kind needs; a deployment may override some values (see the settings in docs/operations.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    /// Attempts before a job whose worker keeps dying fails.
    pub max_attempts: u32,
    /// Longest a job may run, all attempts together, before the reaper fails it.
    #[serde(rename = "max_runtime_seconds", serialize_with = "seconds")]
    pub max_runtime: Duration,
    /// Longest one stage may run within an attempt, across the invocations that continue it
    /// (each checkpoints and pauses before its Lambda deadline): the stage function ends a
    /// stage past it at its next progress or heartbeat write — or at its next invocation's
    /// start — with `Job.StageTimeout`, and the job is retried in a new attempt (from its last
    /// checkpoint, the stage's clock started afresh) within `max_attempts`. Set it shorter
    /// than the default (a day, the default `max_runtime`) when a stage running longer than
    /// some bound is stuck rather than slow.
    #[serde(rename = "stage_timeout_seconds", serialize_with = "seconds")]
    pub stage_timeout: Duration,
    /// How long a result is kept after the job succeeded.
    #[serde(rename = "result_retention_seconds", serialize_with = "seconds")]
    pub result_retention: Duration,
    /// Longest a job may stay paused by its owner: the reaper cancels one paused longer, with
    /// that reason. Paused time does not count towards `max_runtime`.
    #[serde(rename = "max_paused_seconds", serialize_with = "seconds")]
    pub max_paused: Duration,
    /// How often a stage should checkpoint (see `StageContext::checkpoint_due`).
    pub checkpoint: Cadence,
    /// Most jobs of this kind running at once, if limited.
    pub concurrency_limit: Option<u32>,
    /// The logical name of the worker function that runs the kind's stages.
    pub worker: &'static str,
    /// One step of the backoff between attempts after a transient failure outlasted the quick
    /// retries within an attempt: the next attempt waits up to 1, 5, 15, then 60 steps (with
    /// full jitter). A deployment may set it for every kind (`RetryBaseDelaySeconds`).
    #[serde(rename = "retry_delay_seconds", serialize_with = "seconds")]
    pub retry_delay: Duration,
    /// What a stage's `done` and `total` count (`items`, `bytes`, `lines`, …): shown as the
    /// job's `progress.unit` so that a client can label the numbers. The percentage is `done`
    /// of `total` whatever they count, and the checkpoint cadence's `items` counts the same.
    pub progress_unit: &'static str,
    /// Most shards of one fanned-out stage of a job running at once
    /// ([`crate::JobKind::fans_out`]): the Distributed Map's concurrency, capped by the
    /// deployment's `MaxParallelShards`. A fanned-out job still counts as one job against its
    /// tenant's and its kind's running limits.
    pub max_parallel_shards: u32,
}

/// Checkpoint every `items` items or every `interval`, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cadence {
    /// Items between checkpoints (a kind defines what an item is).
    pub items: u64,
    /// Longest time between checkpoints.
    #[serde(rename = "interval_seconds", serialize_with = "seconds")]
    pub interval: Duration,
}

impl Default for Policy {
    /// Three attempts a minute's backoff step apart (1, 5, 15 minutes), a day's runtime,
    /// stages of up to a day in an attempt, results kept a week, a week's pause at most, a
    /// checkpoint every 1,000
    /// items or minute, no concurrency limit, the shared stage function, progress counted in
    /// `items`, ten shards of a fanned-out stage at a time.
    fn default() -> Self {
        Policy {
            max_attempts: 3,
            max_runtime: Duration::from_secs(86_400),
            stage_timeout: Duration::from_secs(86_400),
            result_retention: Duration::from_secs(604_800),
            max_paused: Duration::from_secs(604_800),
            checkpoint: Cadence { items: 1_000, interval: Duration::from_secs(60) },
            concurrency_limit: None,
            worker: SHARED_WORKER,
            retry_delay: Duration::from_secs(60),
            progress_unit: "items",
            max_parallel_shards: 10,
        }
    }
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_secs())
}
