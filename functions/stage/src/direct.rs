//! The `run` op: a direct run ([`longhaul_aws::runs`]). The invocation claims the job for
//! itself (its `claimant`), works through its stages, and ends the job — succeeded,
//! cancelled, or failed as the state machine's `RecordFailure` would record it — with no
//! execution; a stage that ran past its stage timeout ends the attempt the same way (the job
//! waits for its next attempt, or fails once its attempts are spent). A job that needs more
//! than this invocation (its deadline neared) or whose stage failed in a way worth retrying
//! within the attempt is handed over to an execution of the run's name, whose `Run` state
//! claims it again under the same lease and retries as it always does.
//!
//! An error this function answers (the job table or Step Functions failing at a step that
//! must not be skipped) makes Lambda retry the invocation, which claims the job again as its
//! own and resumes from its checkpoint; a run Lambda gives up on comes back to the
//! dispatcher, which hands it over.

use std::time::Instant;

use longhaul_aws::jobs::{JobRecord, Lease, StoreError};
use longhaul_aws::logs;
use longhaul_aws::runs::{self, DirectRun};
use longhaul_domain::{JobId, JobStatus};
use serde_json::{Value, json};

use crate::wire::{Next, Recorded, StateError, TaskLease, WorkState};
use crate::{Deps, StageError, record_failure, store_failed, work};

/// Runs `run` of `job_id` until the job ends or is handed over.
pub(crate) async fn run(
    deps: &Deps,
    job_id: &JobId,
    run: &DirectRun,
    deadline: Instant,
) -> Result<Value, StageError> {
    let (lease, claimed) =
        match work::claim_as(deps, job_id, &run.execution, Some(&run.claimant)).await? {
            Ok((lease, view)) => (lease, Some(view)),
            // Lambda's retry of this invocation after the job ended under it (its answer was
            // lost): the run answers its end again, doing the end's follow-up (metrics, tidying),
            // which may not have happened, again.
            Err(Some(job))
                if job.status.is_terminal()
                    && job.claimant.as_deref() == Some(run.claimant.as_str())
                    && job.lease.is_some() =>
            {
                let token = job.lease.clone().unwrap_or_default();
                let lease = Lease { attempt: job.attempt, token };
                (TaskLease { lease, principal: Some(job.owner) }, None)
            }
            // Lambda's retry of this invocation after it moved the job into compensating (its
            // answer was lost): the hand-over to the compensation is done again.
            Err(Some(job))
                if job.status == JobStatus::Compensating
                    && job.claimant.as_deref() == Some(run.claimant.as_str()) =>
            {
                let token = job.lease.clone().unwrap_or_default();
                let lease = Lease { attempt: job.attempt, token };
                crate::compensate::handed_over(deps, &job, &lease).await?;
                return Ok(json!({ "job_id": job_id, "outcome": "compensating" }));
            }
            Err(current) => return not_claimed(deps, run, current.as_deref()).await,
        };
    logs::record_attempt(&tracing::Span::current(), lease.attempt);
    let answer = |outcome: &str| Ok(json!({ "job_id": job_id, "outcome": outcome }));
    match work::work(deps, job_id, &lease, 1, deadline, claimed, None).await {
        Ok(output) => match output.next {
            Next::Done => answer("succeeded"),
            Next::Cancelled => answer("cancelled"),
            Next::Compensating => answer("compensating"),
            Next::Paused => answer("paused"),
            // The deadline neared (the stage checkpointed), or any answer an execution acts on.
            _ => hand_over(deps, run, &lease).await.and_then(|()| answer("handed_over")),
        },
        Err(StageError::LeaseLost(why)) => {
            tracing::info!(why, "another attempt holds the job; this run stops");
            answer("superseded")
        }
        // Ends the attempt: a fatal error fails the job, a stage timeout is retried in a new
        // attempt within the job's budget (as `RecordFailure` does; an execution's quick
        // retries could not help either, the attempt's stage clock having run out).
        Err(err @ (StageError::Fatal(_) | StageError::StageTimeout(_))) => {
            // As the state machine's Catch hands it to `RecordFailure`.
            tracing::error!(error_type = err.name(), error = %err, "task failed");
            let error = StateError {
                error: err.name().to_owned(),
                cause: json!({ "errorType": err.name(), "errorMessage": err.public_message() })
                    .to_string(),
            };
            let state = WorkState { lease: Some(lease), run: None };
            let recorded =
                record_failure::record_failure(deps, job_id, state, Some(&run.execution), error)
                    .await?;
            let outcome = match recorded {
                Recorded::Retry { .. } => "retry_scheduled",
                Recorded::Cancelled => "cancelled",
                Recorded::Compensating => "compensating",
                Recorded::Failed | Recorded::Unrecorded => "failed",
            };
            Ok(json!({ "job_id": job_id, "outcome": outcome, "recorded": recorded }))
        }
        Err(err) => {
            // Worth retrying: the execution's `Run` retries it with backoff, and records the
            // failure when its retries run out, as for any job.
            tracing::warn!(error_type = err.name(), error = %err, "the run failed; an execution takes the job over to retry it");
            hand_over(deps, run, &lease).await.and_then(|()| answer("handed_over"))
        }
    }
}

/// Hands the job over to an execution of the run's name; a lease no longer the job's means
/// another attempt holds it, and this run just stops.
async fn hand_over(deps: &Deps, run: &DirectRun, lease: &TaskLease) -> Result<(), StageError> {
    match runs::hand_over(&*deps.jobs, &*deps.executions, run, &lease.token).await {
        Ok(()) => Ok(()),
        Err(StoreError::Conflict { current }) => {
            tracing::info!(
                status = ?current.map(|j| j.status),
                "the job moved on before its hand-over; this run stops"
            );
            Ok(())
        }
        Err(err) => Err(store_failed(err)),
    }
}

/// The run's invocation did not get the job: it is not waiting for this run (ended, run by
/// another attempt or invocation) — or this run handed it over and the execution's start may
/// have failed, which is then made good (starting it is idempotent by name).
async fn not_claimed(
    deps: &Deps,
    run: &DirectRun,
    current: Option<&JobRecord>,
) -> Result<Value, StageError> {
    let status = current.map(|job| job.status);
    match current {
        Some(job) if job.status == JobStatus::Running && job.claimant.is_none() => {
            match job.execution.as_deref().filter(|e| runs::is_hand_over_of(e, run)) {
                Some(name) => {
                    runs::start_execution(&*deps.executions, run, name)
                        .await
                        .map_err(store_failed)?;
                }
                None => tracing::info!("an execution holds the job; nothing to do"),
            }
        }
        _ => tracing::info!(?status, "the job is not waiting for this run; nothing to do"),
    }
    Ok(json!({ "job_id": run.job_id, "outcome": "not_claimed" }))
}
