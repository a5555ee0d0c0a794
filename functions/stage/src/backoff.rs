//! A retryable failure that outlasted the state machine's quick retries ends the *attempt*:
//! the job goes back to `queued` with a `retry_at` and its last error, its execution ends, and
//! the dispatcher starts the next attempt (which resumes from the checkpoint) once the backoff
//! has passed ([`longhaul_domain::retry`]). Nothing runs or is billed meanwhile but a delayed
//! SQS message; the job can be cancelled while it waits. The reaper backs the message up: a
//! `queued` job is indexed at its `retry_at`, so one whose message was lost is started by the
//! reaper's lost-dispatch sweep a grace period later.

use std::time::Duration;

use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::{JobRecord, StoreError, TransitionRequest};
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::policy::JobPolicy;
use longhaul_domain::retry::{self, Backoff, FailureClass};
use longhaul_domain::{JobError, JobStatus, Timestamp, schedule};

use crate::stage_error::end_refused;
use crate::{Deps, StageError, TaskLease, store_failed};

/// When the job's next attempt starts: its backoff was scheduled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryScheduled {
    /// When the next attempt starts.
    pub retry_at: Timestamp,
}

/// Schedules the next attempt of `job` (running under `lease`) after `error`, if the error
/// is transient and the job's attempts are not spent; `None` means the job must fail now.
/// Idempotent: a repeated call (the state machine retries a task whose answer was lost) finds
/// the job already waiting under the next execution and only sends the message again.
/// [`StageError::Cancelled`]: the owner asked to cancel the job since `job` was read.
pub async fn schedule_retry(
    deps: &Deps,
    job: &JobRecord,
    lease: &TaskLease,
    error: &JobError,
) -> Result<Option<RetryScheduled>, StageError> {
    let max_attempts = deps.max_attempts.unwrap_or_else(|| job.policy_or_default().max_attempts);
    let class = retry::classify(&error.code);
    let ours = job.lease.as_deref() == Some(lease.token.as_str());
    if let (true, JobStatus::Queued, Some(retry_at)) = (ours, job.status, job.retry_at) {
        // This call's transition landed before (its answer was lost): send again.
        enqueue(deps, job, retry_at).await?;
        return Ok(Some(RetryScheduled { retry_at }));
    }
    // Not running under this lease any more: the failure is recorded as before (and refused
    // by its fence if another attempt owns the job).
    if !ours || job.status != JobStatus::Running {
        return Ok(None);
    }
    if !retry::retries(class, lease.attempt, max_attempts) {
        if class == FailureClass::Retryable {
            tracing::warn!(max_attempts, "retryable failure, but the attempts are spent");
        }
        return Ok(None);
    }
    let next_dispatch = job.dispatches.max(1) + 1;
    let next = execution_name(&job.job_id, next_dispatch);
    let now = deps.clock.now();
    let delay =
        backoff_of(deps.retry_delay, &job.policy_or_default()).delay(lease.attempt, random_unit());
    let retry_at = Timestamp::from(now + chrono::Duration::from_std(delay).unwrap_or_default());
    // The failed attempt's worker is this very call, but a duplicate of it (a retried task
    // whose first try is still running) must not write progress into the next attempt.
    deps.jobs.revoke_progress(&job.job_id, &lease.token).await.map_err(store_failed)?;
    let request = TransitionRequest::new(
        &job.job_id,
        &[JobStatus::Running],
        JobStatus::Queued,
        format!(
            "attempt {} of {max_attempts} failed ({}: {}); the next starts at {retry_at}",
            lease.attempt, error.code, error.message
        ),
    )
    .fenced(&lease.token)
    // A cancellation that landed since `job` was read is honoured now, not at the next claim.
    .unless_cancelled()
    .set("execution", &next)
    .set("dispatches", next_dispatch)
    .set("retry_at", retry_at)
    .set("last_error", error)
    // Indexed at its start: the reaper's lost-dispatch sweep looks at it only from then on.
    .indexed_at(retry_at.to_rfc3339());
    let queued = match deps.jobs.transition(request).await {
        Ok(job) => job,
        // Our own write, landed by a try whose answer was lost. (The reaper's re-dispatch
        // of a zombie also leaves the job queued under the old lease, but without a
        // `retry_at`: a claim removes it, and only this write sets it.)
        Err(StoreError::Conflict { current: Some(current) })
            if current.status == JobStatus::Queued
                && current.lease.as_deref() == Some(lease.token.as_str())
                && current.retry_at.is_some() =>
        {
            *current
        }
        Err(err) => return Err(end_refused(err, &lease.token)),
    };
    let retry_at = queued.retry_at.unwrap_or(retry_at);
    enqueue(deps, &queued, retry_at).await?;
    metrics::count(Metric::RetriesScheduled, &queued);
    tracing::warn!(
        code = error.code,
        %retry_at,
        delay_ms = delay.as_millis() as u64,
        "attempt failed; the next one is scheduled"
    );
    Ok(Some(RetryScheduled { retry_at }))
}

/// Sends the job's dispatch message, delayed until `retry_at` (or SQS's most, 15 minutes: the
/// dispatcher delays an early message again).
async fn enqueue(deps: &Deps, job: &JobRecord, retry_at: Timestamp) -> Result<(), StageError> {
    let delay = schedule::sqs_delay(retry_at.as_datetime(), deps.clock.now());
    let message = DispatchMessage::new(job.job_id.clone());
    deps.intake.send_delayed(&message, delay, &job.owner).await.map_err(StageError::from)
}

/// The wait before attempt `failed + 1` of something of a job with `policy` (an undo's), by the
/// same backoff as its attempts, jittered.
pub(crate) fn delay(deployment: Option<Duration>, policy: &JobPolicy, failed: u32) -> Duration {
    backoff_of(deployment, policy).delay(failed, random_unit())
}

/// The backoff of a job with `policy`: the deployment's step for every job if it sets one,
/// else the policy's.
fn backoff_of(deployment: Option<Duration>, policy: &JobPolicy) -> Backoff {
    Backoff { base: deployment.unwrap_or(Duration::from_secs(policy.retry_delay_seconds)) }
}

/// A number drawn uniformly from `[0, 1)` (the OS RNG; the midpoint should it fail).
fn random_unit() -> f64 {
    match getrandom::u64() {
        // The top 53 bits: every value an f64 in [0, 1) can hold at that spacing.
        Ok(bits) => (bits >> 11) as f64 / (1u64 << 53) as f64,
        Err(err) => {
            tracing::warn!(error = %err, "no randomness for the backoff's jitter; using half");
            0.5
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployments_step_overrides_the_policys() {
        let policy = JobPolicy { retry_delay_seconds: 300, ..JobPolicy::default() };
        assert_eq!(backoff_of(None, &policy).ceiling(1), Duration::from_secs(300));
        assert_eq!(backoff_of(None, &policy).ceiling(2), Duration::from_secs(1_500));
        let local = Some(Duration::from_secs(1));
        assert_eq!(backoff_of(local, &policy).ceiling(4), Duration::from_secs(60));
    }

    #[test]
    fn the_jitter_is_uniform_in_the_unit_interval() {
        for _ in 0..1_000 {
            let unit = random_unit();
            assert!((0.0..1.0).contains(&unit), "{unit}");
        }
    }
}
