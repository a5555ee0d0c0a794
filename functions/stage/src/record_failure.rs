//! The `fail` op (the state machine's `RecordFailure` state): records why the attempt failed —
//! the job's next attempt after a backoff ([`crate::backoff`]), its end `failed`, or, when its
//! owner had asked, `cancelled`.

use longhaul_aws::jobs::{JobRecord, Lease, TransitionRequest};
use longhaul_aws::logs;
use longhaul_domain::{JobError, JobId, JobStatus};

use longhaul_domain::compensation::Ending;

use crate::wire::{Next, Recorded, StateError, TaskLease, WorkState};
use crate::{
    Deps, StageError, backoff, compensate, end_job, failure_message, finish_cancellation,
    store_failed,
};

/// Records the failure `error` of `job_id`'s attempt held by this execution (the lease in
/// `state`, or the job's if this `execution` holds it).
pub(crate) async fn record_failure(
    deps: &Deps,
    job_id: &JobId,
    state: WorkState,
    execution: Option<&str>,
    error: StateError,
) -> Result<Recorded, StageError> {
    // One consistent read serves both: whose lease the failure is recorded under, and what
    // becomes of the job.
    let job = deps.jobs.job(job_id).await.map_err(store_failed)?;
    let Some(lease) = failing_lease(job.as_ref(), state.lease, execution) else {
        // Never claimed by this execution: nothing of the job is this execution's to end.
        tracing::warn!(
            error = error.error,
            "the execution failed before holding the job; nothing recorded"
        );
        return Ok(Recorded::Unrecorded);
    };
    let span = tracing::Span::current();
    logs::record_attempt(&span, lease.attempt);
    if let Some(principal) = &lease.principal {
        logs::record_principal(&span, principal);
    }
    // Only a message written for the client is recorded (the job's `error`, its
    // transition log, its webhook); a cause it replaces goes to the log.
    let (message, replaced) = failure_message::recorded_message(&error.error, &error.cause);
    if replaced {
        tracing::warn!(
            error = error.error,
            cause = error.cause,
            "the failure's cause is not shown to the client; recorded as {message:?}"
        );
    }
    let running_ours = job.as_ref().is_some_and(|job| {
        job.status == JobStatus::Running && job.lease.as_deref() == Some(&lease.token)
    });
    let cancel_requested = job.as_ref().is_some_and(|job| job.cancellation.is_some());
    if error.error == StageError::Cancelled.name() || (running_ours && cancel_requested) {
        // A cancellation that surfaced as an error (raised where the run could not end
        // the job itself), or a failure after the owner asked to cancel: the job ends
        // `cancelled`, as its owner asked, neither `failed` nor retried.
        let next = finish_cancellation(deps, job_id, &lease, job.as_ref()).await?;
        return Ok(cancelled(next));
    }
    let job_error = JobError { code: error.error, message };
    match end_attempt(deps, job_id, job.as_ref(), &lease, job_error).await {
        // The owner asked to cancel since the job was read: that is how it ends.
        Err(StageError::Cancelled) => {
            let next = finish_cancellation(deps, job_id, &lease, None).await?;
            Ok(cancelled(next))
        }
        other => other,
    }
}

/// What a cancellation's end is recorded as: `cancelled`, or `compensating` first.
fn cancelled(next: Next) -> Recorded {
    match next {
        Next::Compensating => Recorded::Compensating,
        _ => Recorded::Cancelled,
    }
}

/// The failed attempt's end: the job's next attempt after a backoff, or its end `failed` —
/// through `compensating` if it started stages with an undo. None applies once the owner
/// asked to cancel ([`StageError::Cancelled`]).
async fn end_attempt(
    deps: &Deps,
    job_id: &JobId,
    job: Option<&JobRecord>,
    lease: &TaskLease,
    job_error: JobError,
) -> Result<Recorded, StageError> {
    if let Some(job) = job
        && let Some(scheduled) = backoff::schedule_retry(deps, job, lease, &job_error).await?
    {
        return Ok(Recorded::Retry { retry_at: scheduled.retry_at });
    }
    if let Some(job) = job.filter(|job| job.wants_compensation()) {
        let ending = Ending {
            status: JobStatus::Failed,
            reason: job_error.message.clone(),
            error: Some(job_error.clone()),
        };
        compensate::begin(deps, job, lease, ending, true).await?;
        tracing::warn!(code = job_error.code, "failed; compensating first");
        return Ok(Recorded::Compensating);
    }
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Running],
        JobStatus::Failed,
        job_error.message.clone(),
    )
    .fenced(&lease.token)
    .unless_cancelled()
    .set("error", &job_error);
    end_job(deps, request, lease, None).await?;
    fence_off(deps, job_id, lease).await;
    tracing::warn!(code = job_error.code, "failed");
    Ok(Recorded::Failed)
}

/// Takes the job's progress record from the failed attempt's lease, once the job is failed
/// (a retry's move takes it before, [`backoff::schedule_retry`]). A worker of the attempt
/// still running — a shard of a fanned-out stage whose map failed on another shard (Step
/// Functions stops the map's executions, not the invocations under way), a `Run` invocation
/// that outlived its task — then has its next progress write refused and stops, instead of
/// working on and counting into the failed job's progress until its own deadline. A
/// revocation that fails leaves that worker to run out its invocation, writing progress
/// nobody acts on: logged, not a reason to record the failure again.
async fn fence_off(deps: &Deps, job_id: &JobId, lease: &Lease) {
    if let Err(err) = deps.jobs.revoke_progress(job_id, &lease.token).await {
        tracing::warn!(error = %err, "the failed attempt's progress record could not be taken from its lease; a worker of it still running writes on until its deadline");
    }
}

/// The lease a `fail` task records the failure under: the one passed, or — when the
/// execution's first `work` failed before answering — the job's, if this execution holds it
/// (no direct run of the same name does: [`JobRecord::holds_claim`]).
fn failing_lease(
    job: Option<&JobRecord>,
    given: Option<TaskLease>,
    execution: Option<&str>,
) -> Option<TaskLease> {
    if given.is_some() {
        return given;
    }
    let (execution, job) = (execution?, job?);
    match (job.status, &job.lease) {
        (JobStatus::Running, Some(token)) if job.holds_claim(execution, None) => Some(TaskLease {
            lease: Lease { attempt: job.attempt, token: token.clone() },
            principal: Some(job.owner.clone()),
        }),
        _ => None,
    }
}
