//! Compensation: a job ending `failed` or `cancelled` after starting stages its kind gave an
//! undo runs those undos, latest stage first, before it ends ([`longhaul_domain::compensation`]).
//!
//! The stage that would have ended the job moves it `running → compensating` instead
//! ([`begin`]) and sends it to the dispatcher, which invokes its worker with the `compensate`
//! op ([`run`]) — as the owner's cancellation of a paused or waiting job and the reaper's
//! failures do. The op plans the undos from the stages the job started (its progress record
//! says how far it got), then runs each, writing its outcome on the job before the next: an
//! attempt is counted before it runs (so one that crashed counts), a retryable failure waits
//! out the job's backoff in a delayed message (nothing runs meanwhile), and an undo whose
//! attempts are spent or that failed fatally is given up (counted in `UndosFailed`, which
//! alarms) while the others still run. Then the job ends as it was going to, its
//! `compensation` saying how it went, and the terminal webhook follows from the table's stream.
//!
//! Nothing here holds a lease: the job is no attempt's any more. Two invocations of the op
//! (a duplicate message, the reaper's backup) may run the same undo twice, which the
//! contract allows (undos are idempotent, keyed by [`Undo::key`]); every write is conditional
//! on the job still compensating, and the first end wins.

use std::time::{Duration, Instant};

use longhaul_aws::jobs::{
    COMPENSATION_SILENCE, JobRecord, Lease, StoreError, TransitionRequest, compensation_request,
};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::result_key;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::compensation::{Compensation, CompensationStatus, Ending, UndoStatus};
use longhaul_domain::{JobId, JobStatus, Timestamp, schedule};
use longhaul_worker::{ErrorClass, KindError, PublicMessage, Undo};
use serde_json::{Value, json};

use crate::{Deps, StageError, backoff, stage_error, store_failed, tidy_after_end};

/// Moves the job running under `lease` to `compensating`, to end as `ending` says, then
/// [`handed_over`]. A repeated call (its answer was lost) finds it compensating under the same
/// lease and hands it over again. `unless_cancelled`: refused, as [`StageError::Cancelled`], if
/// the owner asked to cancel meanwhile (a failure's end).
pub(crate) async fn begin(
    deps: &Deps,
    job: &JobRecord,
    lease: &Lease,
    ending: Ending,
    unless_cancelled: bool,
) -> Result<(), StageError> {
    let now = Timestamp::from(deps.clock.now());
    let ends_as = ending.status;
    let request =
        compensation_request(&job.job_id, &[JobStatus::Running], ending, now).fenced(&lease.token);
    let request = if unless_cancelled { request.unless_cancelled() } else { request };
    match deps.jobs.transition(request).await {
        Ok(_) => {}
        Err(StoreError::Conflict { current: Some(current) })
            if current.status == JobStatus::Compensating
                && current.lease.as_deref() == Some(&lease.token) => {}
        Err(err) => return Err(stage_error::end_refused(err, &lease.token)),
    }
    tracing::info!(ends_as = %ends_as, "compensating: its undos run before it ends");
    handed_over(deps, job, lease).await
}

/// What follows the job's move into compensating under `lease` (again, for a retried call
/// whose answer was lost): the lease loses the progress record, so a duplicate of the attempt's
/// worker still running stops at its next write rather than work beside the undos, and the job
/// is sent to be compensated.
pub(crate) async fn handed_over(
    deps: &Deps,
    job: &JobRecord,
    lease: &Lease,
) -> Result<(), StageError> {
    deps.jobs.revoke_progress(&job.job_id, &lease.token).await.map_err(store_failed)?;
    send(deps, job, 0).await
}

/// Sends the job to the dispatcher, to compensate after `delay_seconds`.
async fn send(deps: &Deps, job: &JobRecord, delay_seconds: u32) -> Result<(), StageError> {
    let message = DispatchMessage::new(job.job_id.clone());
    let sent = if delay_seconds == 0 {
        deps.intake.send(&message, &job.owner).await
    } else {
        deps.intake.send_delayed(&message, delay_seconds, &job.owner).await
    };
    sent.map_err(StageError::from)
}

/// The `compensate` op: runs the job's remaining undos and ends it, or stops where it must
/// wait (a retry's backoff, the Lambda deadline) having sent itself the message that goes on.
pub(crate) async fn run(
    deps: &Deps,
    job_id: &JobId,
    deadline: Instant,
) -> Result<Value, StageError> {
    let answer = |outcome: &str| Ok(json!({ "job_id": job_id, "outcome": outcome }));
    let Some(view) = deps.jobs.view(job_id).await.map_err(store_failed)? else {
        tracing::warn!("no such job; nothing to compensate");
        return answer("missing");
    };
    let job = view.job;
    logs::record_job(&tracing::Span::current(), &job);
    if job.status != JobStatus::Compensating {
        tracing::info!(status = %job.status, "the job is not compensating; nothing to do");
        return answer("not_compensating");
    }
    let Some(mut compensation) = job.compensation.clone() else {
        // Cannot be written so (the move into compensating carries it); ended rather than
        // left compensating for good.
        tracing::error!("a compensating job without its compensation record; it fails");
        let ending = Ending {
            status: JobStatus::Failed,
            reason: "its compensation record was lost: its undos did not run".into(),
            error: None,
        };
        let mut lost = Compensation::begin(ending, Timestamp::from(deps.clock.now()));
        lost.planned = true;
        lost.status = CompensationStatus::Failed;
        let answer = finish(deps, &job, lost).await?;
        // Counted once the end is recorded by this invocation (not by a duplicate's).
        if answer["outcome"] == JobStatus::Failed.as_str() {
            metrics::count(Metric::UndosFailed, &job);
        }
        return Ok(answer);
    };
    let kind = deps.registry.get(&job.job_type);
    if !compensation.planned {
        let reached = view.progress.as_ref().map(|p| p.stage.as_str());
        match kind {
            Some(kind) => {
                compensation.plan(&started_stages(kind.stages(), reached), &job.undo_stages)
            }
            // A kind this worker does not know (retired since): every undo it declared is
            // planned, and each fails as unknown — given up and counted, never called done.
            None => {
                let declared: Vec<&str> = job.undo_stages.iter().map(String::as_str).collect();
                compensation.plan(&declared, &job.undo_stages);
            }
        }
        if !record(deps, &job, &mut compensation, COMPENSATION_SILENCE).await? {
            return answer("moved_on");
        }
        tracing::info!(undos = compensation.stages.len(), "compensation planned");
    }
    let max_attempts =
        deps.max_attempts.unwrap_or_else(|| job.policy_or_default().max_attempts).max(1);
    while let Some(i) = compensation.next_step() {
        let now = Timestamp::from(deps.clock.now());
        let step = compensation.stages[i].clone();
        if let (UndoStatus::Retrying, Some(retry_at)) = (step.status, step.retry_at)
            && retry_at > now
        {
            // Woken early (a duplicate, the reaper's backup, a delay longer than SQS allows).
            send(deps, &job, schedule::sqs_delay(retry_at.as_datetime(), now.as_datetime()))
                .await?;
            return answer("retry_scheduled");
        }
        let silence = chrono::Duration::from_std(COMPENSATION_SILENCE).unwrap_or_default();
        if step.status == UndoStatus::Running
            && step.at.is_some_and(|at| now.as_datetime() - at.as_datetime() < silence)
        {
            // Another invocation runs it now (this one is a duplicate): it goes on, and should
            // it have died, the reaper sends the job again once it has been silent long enough.
            tracing::info!(stage = step.stage, "the undo is under way in another invocation");
            return answer("in_progress");
        }
        if deadline.saturating_duration_since(deps.clock.instant()) < deps.margin {
            send(deps, &job, 0).await?;
            return answer("continued");
        }
        let mut gave_up = None;
        let step_mut = &mut compensation.stages[i];
        if step.attempts >= max_attempts {
            // Its last attempt began and never recorded an end (the invocation died).
            step_mut.status = UndoStatus::Failed;
            step_mut.at = Some(now);
            let why = format!("the undo did not finish in {max_attempts} attempts");
            step_mut.error = Some(why.clone());
            gave_up = Some((step.stage.clone(), why));
        } else {
            step_mut.attempts += 1;
            step_mut.status = UndoStatus::Running;
            step_mut.at = Some(now);
            step_mut.retry_at = None;
            let undo = Undo {
                stage: step.stage.clone(),
                key: format!("{job_id}:undo:{}", step.stage),
                attempt: step_mut.attempts,
            };
            if !record(deps, &job, &mut compensation, COMPENSATION_SILENCE).await? {
                return answer("moved_on");
            }
            let result = match kind {
                Some(kind) => kind.undo(&undo, &job.params).await,
                None => Err(KindError::fatal(PublicMessage::domain(format!(
                    "job type {:?} is not known to this worker",
                    job.job_type.chars().take(64).collect::<String>()
                )))),
            };
            let now = Timestamp::from(deps.clock.now());
            let step_mut = &mut compensation.stages[i];
            step_mut.at = Some(now);
            match result {
                Ok(()) => {
                    step_mut.status = UndoStatus::Done;
                    step_mut.error = None;
                    tracing::info!(stage = undo.stage, attempt = undo.attempt, "undone");
                }
                Err(err) if err.class == ErrorClass::Retryable && undo.attempt < max_attempts => {
                    let policy = job.policy_or_default();
                    let delay = backoff::delay(deps.retry_delay, &policy, undo.attempt);
                    let retry_at = Timestamp::from(
                        now.as_datetime() + chrono::Duration::from_std(delay).unwrap_or_default(),
                    );
                    step_mut.status = UndoStatus::Retrying;
                    step_mut.retry_at = Some(retry_at);
                    step_mut.error = Some(err.public.as_str().to_owned());
                    tracing::warn!(stage = undo.stage, attempt = undo.attempt, error = %err, %retry_at, "undo failed; retried after a backoff");
                    if !record(deps, &job, &mut compensation, delay + COMPENSATION_SILENCE).await? {
                        return answer("moved_on");
                    }
                    send(
                        deps,
                        &job,
                        schedule::sqs_delay(retry_at.as_datetime(), now.as_datetime()),
                    )
                    .await?;
                    return answer("retry_scheduled");
                }
                Err(err) => {
                    step_mut.status = UndoStatus::Failed;
                    step_mut.error = Some(err.public.as_str().to_owned());
                    tracing::warn!(stage = undo.stage, attempt = undo.attempt, error = %err, "the undo failed for good");
                    gave_up = Some((undo.stage.clone(), err.public.as_str().to_owned()));
                }
            }
        }
        if !record(deps, &job, &mut compensation, COMPENSATION_SILENCE).await? {
            return answer("moved_on");
        }
        // Counted once its give-up is recorded (a retried invocation does not count it again).
        if let Some((stage, why)) = gave_up {
            give_up(&job, &stage, &why);
        }
    }
    finish(deps, &job, compensation).await
}

/// Counts an undo given up (the `UndosFailed` alarm).
fn give_up(job: &JobRecord, stage: &str, why: &str) {
    tracing::error!(stage, why, "an undo was given up: what its stage did stays done");
    metrics::count(Metric::UndosFailed, job);
}

/// The stages the job started, in order: every stage up to the one its progress record is at
/// (the first, if it has none: the job was claimed, so its first stage began).
fn started_stages<'a>(stages: &[&'a str], progress_stage: Option<&str>) -> Vec<&'a str> {
    let reached =
        progress_stage.and_then(|at| stages.iter().position(|stage| *stage == at)).unwrap_or(0);
    stages.iter().take(reached + 1).copied().collect()
}

/// Writes `compensation` on the job (its next revision), due to be heard of again within
/// `silence`; `false` if the job is no longer compensating, or another invocation wrote it
/// since this one read it (a duplicate: that one goes on, this one stops).
async fn record(
    deps: &Deps,
    job: &JobRecord,
    compensation: &mut Compensation,
    silence: Duration,
) -> Result<bool, StageError> {
    let due =
        Timestamp::from(deps.clock.now() + chrono::Duration::from_std(silence).unwrap_or_default());
    compensation.revision += 1;
    match deps.jobs.record_compensation(&job.job_id, compensation, due).await {
        Ok(_) => Ok(true),
        Err(StoreError::Conflict { current }) => {
            tracing::info!(status = ?current.map(|j| j.status), "the job moved on; this compensation stops");
            Ok(false)
        }
        Err(err) => Err(store_failed(err)),
    }
}

/// Ends the compensated job as it was going to end, with how its compensation went.
async fn finish(
    deps: &Deps,
    job: &JobRecord,
    mut compensation: Compensation,
) -> Result<Value, StageError> {
    if compensation.status == CompensationStatus::Running {
        compensation.status = compensation.outcome();
    }
    let ending = compensation.ending.clone();
    let job_id = &job.job_id;
    if ending.status == JobStatus::Cancelled {
        // A cancelled job never has a result object.
        deps.objects.delete_prefix(&result_key(job_id, "")).await?;
    }
    let outcome = match compensation.status {
        CompensationStatus::Failed => "an undo failed",
        _ => "undone",
    };
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Compensating],
        ending.status,
        format!("{} ({outcome})", ending.reason),
    )
    .set("compensation", &compensation);
    let request = match &ending.error {
        Some(error) => request.set("error", error),
        None => request,
    };
    let ended = match deps.jobs.transition(request).await {
        Ok(ended) => ended,
        Err(StoreError::Conflict { current: Some(current) }) if current.status.is_terminal() => {
            tracing::info!(status = %current.status, "another invocation ended the job");
            return Ok(json!({ "job_id": job_id, "outcome": current.status }));
        }
        Err(err) => return Err(store_failed(err)),
    };
    metrics::emit_end(&ended);
    tidy_after_end(deps, job_id, ending.status, None).await?;
    tracing::info!(status = %ended.status, compensation = ?compensation.status, "compensated and ended");
    Ok(json!({ "job_id": job_id, "outcome": ended.status }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stages_started_are_those_up_to_the_progress_records() {
        let stages = ["reserve", "charge", "ship"];
        assert_eq!(started_stages(&stages, None), ["reserve"]);
        assert_eq!(started_stages(&stages, Some("charge")), ["reserve", "charge"]);
        assert_eq!(started_stages(&stages, Some("ship")), stages);
        assert_eq!(started_stages(&stages, Some("gone")), ["reserve"]);
    }
}
