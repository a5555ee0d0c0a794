//! `running` jobs judged from their index entries and progress records: zombies rescued
//! (success back-filled, re-dispatched as a new attempt, or failed), stalls flagged and
//! cleared, overtime failed.

use crate::*;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::{JobEntry, ProgressRecord, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_domain::reaper::{Rescue, Running, Verdict, judge, rescue};
use longhaul_domain::{ErrorCode, JobError, JobStatus, Timestamp};
use tracing::Instrument;

/// Judges a page of running jobs from what the index holds and their progress records (one
/// batch read), and handles, from a fresh consistent read, only those that do not look healthy.
pub(crate) async fn running_page(deps: &Deps, now: DateTime<Utc>, jobs: Vec<JobEntry>) -> Report {
    let mut report = Report::default();
    let ids: Vec<String> = jobs.iter().map(|job| job.job_id.to_string()).collect();
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
            && let Some((_, state)) = running_state(&job, progress.get(job.job_id.as_str()), deps)
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
fn running_state(
    job: &JobEntry,
    progress: Option<&ProgressRecord>,
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
        started_at: job.started_at.unwrap_or(job.updated_at).as_datetime(),
        stalled_at: job.stalled_at.map(Timestamp::as_datetime),
        max_runtime: deps.config.max_runtime.unwrap_or(policy.max_runtime()),
    };
    Some((lease, state))
}

async fn running(
    deps: &Deps,
    now: DateTime<Utc>,
    job_id: &str,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // The index is eventually consistent: judge the job and its progress as they are now.
    let Some(view) = deps.jobs.view(job_id).await? else { return Ok(()) };
    logs::current_job(&view.job);
    let job = JobEntry::from(&view.job);
    let Some((lease, state)) = running_state(&job, view.progress.as_ref(), deps) else {
        return Ok(());
    };
    match judge(now, &state, &deps.config.thresholds) {
        Verdict::Healthy => Ok(()),
        Verdict::Stalled => {
            let result = deps.jobs.mark_stalled(job_id, &lease, Some(&at(now))).await;
            if result.is_ok() {
                metrics::count(Metric::StalledJobs, &job);
                tracing::warn!("progress stalled while heartbeating");
                report.stalled += 1;
            }
            raced(result, report)
        }
        Verdict::Recovered => {
            let result = deps.jobs.mark_stalled(job_id, &lease, None).await;
            if result.is_ok() {
                report.recovered += 1;
            }
            raced(result, report)
        }
        Verdict::TimedOut(reason) => {
            let error = JobError::new(ErrorCode::Timeout, reason);
            let result = fail(deps, &job, &[JobStatus::Running], Some(&lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            raced(result, report)
        }
        Verdict::Zombie(reason) => zombie(deps, now, &job, &lease, reason, report).await,
    }
}

async fn zombie(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
    lease: &str,
    reason: String,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let job_id = job.job_id.as_str();
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
            .set("result_key", AttributeValue::S(key))
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
            .set("execution", AttributeValue::S(next.clone()))
            .set("dispatches", AttributeValue::N((job.dispatches.max(1) + 1).to_string()));
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
