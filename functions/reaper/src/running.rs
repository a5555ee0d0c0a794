//! `running` jobs judged from their index entries and progress records: zombies rescued
//! (success back-filled, re-dispatched as a new attempt, or failed), stalls flagged and
//! cleared, overtime failed — and a zombie or overtime job whose owner asked to cancel it
//! ended `cancelled` instead (see [`action`]).

use crate::*;

use chrono::{DateTime, Utc};
use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::{JobEntry, ProgressRecord, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::result_key;
use longhaul_domain::reaper::{Rescue, Running, Verdict, judge, rescue};
use longhaul_domain::{Cancellation, ErrorCode, JobError, JobId, JobStatus, Timestamp};
use tracing::Instrument;

/// Judges a page of running jobs from what the index holds and their progress records (one
/// batch read), and handles, from a fresh consistent read, only those that do not look healthy.
pub(crate) async fn running_page(deps: &Deps, now: DateTime<Utc>, jobs: Vec<JobEntry>) -> Report {
    let mut report = Report::default();
    let ids: Vec<JobId> = jobs.iter().map(|job| job.job_id.clone()).collect();
    let progress = match deps.jobs.progress_records(&ids).await {
        Ok(progress) => Some(progress),
        Err(err) => {
            // Judge each job from its own consistent read instead: slower, nothing skipped.
            tracing::error!(error = %err, "reading a page of progress records failed");
            None
        }
    };
    for job in jobs {
        if let Some(progress) = &progress
            // (The index does not hold the time a job spent paused: one that looks overtime
            // is judged again from its record, which does.)
            && let Some((_, state)) = running_state(&job, progress.get(&job.job_id), 0, deps)
            && matches!(judge(now, &state, &deps.config.thresholds), Verdict::Healthy)
        {
            continue;
        }
        let span = logs::span_of(&job);
        let result = running(deps, now, &job.job_id, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    report
}

/// What the reaper judges a running job by (with its lease), or `None` if it is not running.
/// `paused_seconds`: how long it spent paused, which its runtime does not count.
fn running_state(
    job: &JobEntry,
    progress: Option<&ProgressRecord>,
    paused_seconds: u64,
    deps: &Deps,
) -> Option<(String, Running)> {
    let (JobStatus::Running, Some(lease)) = (job.status, job.lease.clone()) else { return None };
    // A claim that died before handing the progress record over left the record to an
    // earlier attempt (or none at all): the lease's only sign of life is the claim itself.
    let claimed_at = job.updated_at.as_datetime();
    let (heartbeat_at, progress_changed_at) = match progress.filter(|p| p.lease == lease) {
        Some(progress) => (
            progress.heartbeat_at.as_datetime(),
            // Written with the first progress write, as the heartbeat is.
            progress.progress_changed_at.unwrap_or(progress.heartbeat_at).as_datetime(),
        ),
        None => (claimed_at, claimed_at),
    };
    let policy = job.policy_or_default();
    let state = Running {
        heartbeat_at,
        progress_changed_at,
        // A running job was claimed: a record without a start is from before `started_at`
        // existed, judged by its claim.
        started_at: paused_for(job.started_at.unwrap_or(job.updated_at), paused_seconds),
        stalled_at: job.stalled_at.map(Timestamp::as_datetime),
        max_runtime: deps.config.max_runtime.unwrap_or(policy.max_runtime()),
    };
    Some((lease, state))
}

/// `started`, moved on by the `seconds` the job spent paused: where its runtime counts from.
fn paused_for(started: Timestamp, seconds: u64) -> DateTime<Utc> {
    let started = started.as_datetime();
    let paused = chrono::Duration::try_seconds(i64::try_from(seconds).unwrap_or(0));
    paused.and_then(|paused| started.checked_add_signed(paused)).unwrap_or(started)
}

async fn running(
    deps: &Deps,
    now: DateTime<Utc>,
    job_id: &JobId,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // The index is eventually consistent: judge the job and its progress as they are now.
    let Some(view) = deps.jobs.view(job_id).await? else { return Ok(()) };
    logs::current_job(&view.job);
    let job = JobEntry::from(&view.job);
    let Some((lease, state)) =
        running_state(&job, view.progress.as_ref(), view.job.paused_seconds, deps)
    else {
        return Ok(());
    };
    let verdict = judge(now, &state, &deps.config.thresholds);
    match action(verdict, view.job.cancellation.as_ref(), view.job.pause.is_some()) {
        Action::Leave => Ok(()),
        Action::FlagStalled => {
            let result = deps.jobs.mark_stalled(job_id, &lease, Some(Timestamp::from(now))).await;
            if result.is_ok() {
                metrics::count(Metric::StalledJobs, &job);
                tracing::warn!("progress stalled while heartbeating");
                report.stalled += 1;
            }
            raced(result, report)
        }
        Action::ClearStalled => {
            let result = deps.jobs.mark_stalled(job_id, &lease, None).await;
            if result.is_ok() {
                report.recovered += 1;
            }
            raced(result, report)
        }
        Action::TimeOut(reason) => {
            let error = JobError::new(ErrorCode::Timeout, reason);
            let result = fail(deps, &job, &[JobStatus::Running], Some(&lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            raced(result, report)
        }
        Action::Rescue(reason) => zombie(deps, now, &job, &lease, reason, report).await,
        Action::Park(why) => {
            let at = Timestamp::from(now);
            let lapses_at = view.job.policy_or_default().pause_lapses_at(at);
            let result = deps.jobs.park(&view.job, &lease, at, lapses_at).await;
            if result.is_ok() {
                revoke(deps, job_id, &lease).await;
                stop_execution(deps, &job, "paused by its owner").await;
                tracing::warn!(why, "paused by the reaper: its owner asked, and its worker cannot");
                report.parked += 1;
            }
            raced(result.map(|_| ()), report)
        }
        Action::Cancel { cancellation, why, worker_gone } => {
            let result = cancel(deps, &job, &lease, &cancellation, &why).await;
            if result.is_ok() {
                report.cancelled += 1;
                if worker_gone {
                    // Counted only by the reaper whose fenced write ended it.
                    metrics::count(Metric::ZombiesReaped, &job);
                }
            }
            raced(result, report)
        }
    }
}

/// What the reaper does about a running job.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    /// Nothing: it is healthy. (A live worker honours a cancellation itself, at its next
    /// progress write.)
    Leave,
    /// Heartbeats, no progress: flag it stalled.
    FlagStalled,
    /// Progress moved again: clear its stalled flag.
    ClearStalled,
    /// Ran past its maximum: fail it (`Job.Timeout`), with the reason.
    TimeOut(String),
    /// Its worker is gone: rescue it ([`zombie`]), with the reason.
    Rescue(String),
    /// Its owner asked to pause it and its worker is gone: park it `paused` (the reason, for
    /// the log).
    Park(String),
    /// Its owner asked to cancel it and its worker will not end it: end it `cancelled`
    /// ([`cancel`]) with the requester's reason.
    Cancel {
        /// The owner's request, as the job record holds it.
        cancellation: Cancellation,
        /// Why the worker will not end it (the verdict's reason), for the log.
        why: String,
        /// The worker stopped heartbeating (a zombie), rather than overran its maximum.
        worker_gone: bool,
    },
}

/// Decides what to do about a running job from the reaper's `verdict` and the cancellation
/// its owner requested, if any. A requested cancellation outranks a rescue or a timeout: a
/// job whose owner asked to cancel it must not be re-dispatched, back-filled as a success or
/// failed (`Job.Abandoned`, `Job.Timeout`, and a `job.failed` webhook) just because its
/// worker died (or overran) before it saw the request. Stall flags are left as they are: a
/// stalled worker still heartbeats, and its next refused progress write stops it. A requested
/// pause (`paused`) turns a zombie's rescue into a park: its worker died before parking it.
fn action(verdict: Verdict, cancellation: Option<&Cancellation>, paused: bool) -> Action {
    match (verdict, cancellation) {
        (Verdict::Healthy, _) => Action::Leave,
        (Verdict::Stalled, _) => Action::FlagStalled,
        (Verdict::Recovered, _) => Action::ClearStalled,
        (Verdict::Zombie(why), Some(cancellation)) => {
            Action::Cancel { cancellation: cancellation.clone(), why, worker_gone: true }
        }
        (Verdict::TimedOut(why), Some(cancellation)) => {
            Action::Cancel { cancellation: cancellation.clone(), why, worker_gone: false }
        }
        (Verdict::TimedOut(reason), None) => Action::TimeOut(reason),
        (Verdict::Zombie(why), None) if paused => Action::Park(why),
        (Verdict::Zombie(reason), None) => Action::Rescue(reason),
    }
}

/// Ends a running job whose owner asked to cancel it and whose worker will not, as the
/// stage's own cancellation does: partial results are deleted first, so a `cancelled` job
/// never has a result object, then the job becomes `cancelled` with the requester's reason
/// (fenced by `lease`: a worker that ended the job meanwhile wins, and this is a lost race).
/// Then, as after any end the reaper makes, the lease loses the progress record (a worker
/// that was only slow has its next write refused), the end is counted, the execution is
/// stopped and the job tidied. A step before the transition that fails leaves the job
/// `running` for the next run to end.
async fn cancel(
    deps: &Deps,
    job: &JobEntry,
    lease: &str,
    cancellation: &Cancellation,
    why: &str,
) -> Result<(), StoreError> {
    let job_id = &job.job_id;
    deps.objects.delete_prefix(&result_key(job_id, "")).await?;
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Cancelled,
        reason: cancellation.log_reason(),
        error: None,
    };
    if compensate_instead(deps, job, &[JobStatus::Running], Some(lease), ending, None, None).await?
    {
        tracing::warn!(
            why,
            "its owner asked to cancel it, and its worker cannot: compensating first"
        );
        return Ok(());
    }
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Running],
        JobStatus::Cancelled,
        cancellation.log_reason(),
    )
    .fenced(lease);
    let ended = deps.jobs.transition(request).await?;
    revoke(deps, job_id, lease).await;
    metrics::emit_end(&ended);
    tracing::warn!(why, "cancelled by the reaper: its owner asked, and its worker cannot");
    stop_execution(deps, job, "cancelled by its owner").await;
    if let Err(err) = tidy(deps, job_id, JobStatus::Cancelled).await {
        tracing::warn!(error = %err, "cleanup after cancelling the job failed; the lifecycle rule is the backstop");
    }
    Ok(())
}

async fn zombie(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
    lease: &str,
    reason: String,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let job_id = &job.job_id;
    let result_key = deps.objects.first_key(&format!("results/{job_id}/{}/", job.attempt)).await?;
    let max_attempts = deps.max_attempts(job);
    let outcome = match rescue(result_key.is_some(), job.attempt, max_attempts) {
        Rescue::Backfill => {
            let key = result_key.unwrap_or_default();
            let expires = now
                + chrono::Duration::from_std(
                    deps.config.result_ttl.of(job.policy_or_default().result_retention()),
                )
                .unwrap_or_default();
            let request = TransitionRequest::new(
                job_id,
                &[JobStatus::Running],
                JobStatus::Succeeded,
                format!("{reason}; its result was already stored"),
            )
            .fenced(lease)
            .set("result_key", key)
            .indexed_at(at(expires));
            let result = deps.jobs.transition(request).await;
            if let Ok(ended) = &result {
                revoke(deps, job_id, lease).await;
                metrics::emit_end(ended);
                stop_execution(deps, job, "the worker stopped after storing the result").await;
                tidy(deps, job_id, JobStatus::Succeeded).await?;
                report.backfilled += 1;
            }
            result.map(|_| ())
        }
        Rescue::Redispatch => {
            // First fence the old worker off its progress record: it may be alive after all.
            deps.jobs.revoke_progress(job_id, lease).await?;
            let next = execution_name(job_id, job.dispatches.max(1) + 1);
            let request = TransitionRequest::new(
                job_id,
                &[JobStatus::Running],
                JobStatus::Queued,
                format!(
                    "{reason}; re-dispatched as attempt {} of {}",
                    job.attempt + 1,
                    max_attempts
                ),
            )
            .fenced(lease)
            .set("execution", &next)
            .set("dispatches", job.dispatches.max(1) + 1);
            let result = deps.jobs.transition(request).await.map(|_| ());
            if result.is_ok() {
                stop_execution(deps, job, "superseded by a re-dispatch").await;
                deps.executions
                    .start(
                        &next,
                        &deps.config.workers.execution_input(job_id, &job.policy_or_default()),
                    )
                    .await?;
                tracing::warn!(execution = next, reason, "zombie re-dispatched");
                report.redispatched += 1;
            }
            result
        }
        Rescue::Fail => {
            let error = JobError {
                code: ErrorCode::Abandoned.as_str().into(),
                message: format!("{reason}; retry budget of {} attempts spent", max_attempts),
            };
            let result = fail(deps, job, &[JobStatus::Running], Some(lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            result
        }
    };
    // Counted only by the reaper whose fenced write rescued it (another may have raced it).
    if outcome.is_ok() {
        metrics::count(Metric::ZombiesReaped, job);
    }
    raced(outcome, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cancellation() -> Cancellation {
        Cancellation {
            requested_at: "2025-01-01T00:00:00Z".parse().unwrap(),
            requested_by: "alice".parse().unwrap(),
            reason: Some("wrong input".into()),
        }
    }

    #[test]
    fn a_requested_cancellation_ends_a_zombie_cancelled_instead_of_rescuing_it() {
        let asked = cancellation();
        assert_eq!(
            action(Verdict::Zombie("no heartbeat for 95 s".into()), Some(&asked), false),
            Action::Cancel {
                cancellation: asked.clone(),
                why: "no heartbeat for 95 s".into(),
                worker_gone: true,
            }
        );
        assert_eq!(
            action(Verdict::Zombie("no heartbeat for 95 s".into()), None, false),
            Action::Rescue("no heartbeat for 95 s".into())
        );
    }

    #[test]
    fn a_requested_cancellation_ends_an_overtime_job_cancelled_instead_of_failing_it() {
        let asked = cancellation();
        assert_eq!(
            action(
                Verdict::TimedOut("ran longer than its maximum of 40 s".into()),
                Some(&asked),
                false
            ),
            Action::Cancel {
                cancellation: asked.clone(),
                why: "ran longer than its maximum of 40 s".into(),
                worker_gone: false,
            }
        );
        assert_eq!(
            action(Verdict::TimedOut("ran longer than its maximum of 40 s".into()), None, false),
            Action::TimeOut("ran longer than its maximum of 40 s".into())
        );
    }

    #[test]
    fn a_requested_pause_parks_a_zombie_but_a_cancellation_outranks_it() {
        let why = || "no heartbeat for 95 s".to_owned();
        assert_eq!(action(Verdict::Zombie(why()), None, true), Action::Park(why()));
        let asked = cancellation();
        assert!(matches!(
            action(Verdict::Zombie(why()), Some(&asked), true),
            Action::Cancel { worker_gone: true, .. }
        ));
        // A live worker parks the job itself; an overtime one is timed out as before.
        assert_eq!(action(Verdict::Healthy, None, true), Action::Leave);
        assert!(matches!(
            action(Verdict::TimedOut("ran too long".into()), None, true),
            Action::TimeOut(_)
        ));
    }

    #[test]
    fn a_live_worker_is_left_to_honour_the_cancellation_itself() {
        let asked = cancellation();
        for cancellation in [None, Some(&asked)] {
            assert_eq!(action(Verdict::Healthy, cancellation, false), Action::Leave);
            assert_eq!(action(Verdict::Stalled, cancellation, false), Action::FlagStalled);
            assert_eq!(action(Verdict::Recovered, cancellation, false), Action::ClearStalled);
        }
    }
}
