//! `queued` jobs whose execution never started (started again under its name, at no cost to
//! the attempts) or ended without running them (a new execution, within the budget).

use crate::*;

use chrono::{DateTime, Utc};
use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::JobEntry;
use longhaul_domain::{ErrorCode, JobError, JobStatus};

/// A `queued` job past the grace that is not running: its execution is looked up, and started
/// again (never started) or replaced by a new one (ended without running the job), within the
/// attempt budget.
pub(crate) async fn lost_queued(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let current =
        job.execution.clone().unwrap_or_else(|| execution_name(&job.job_id, job.dispatches.max(1)));
    match deps.executions.status(&current).await?.as_deref() {
        Some("RUNNING") => return Ok(()), // on its way (its claim may be retrying)
        Some(_) => {} // it ended without running the job: a new execution, within the budget
        None => return never_started(deps, now, &job, &current, report).await,
    }
    // A resume dispatches a job again without spending an attempt: the record says how many
    // (read only on this rare path).
    if job.dispatches >= deps.max_attempts(&job) && !resumed_within(deps, &job).await? {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!("its execution {current} ended without running it"),
        };
        let result = fail(deps, &job, &[JobStatus::Queued], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    let next = execution_name(&job.job_id, job.dispatches + 1);
    match deps.jobs.redispatch_queued(&job.job_id, job.dispatches, &next).await {
        Ok(_) => {
            deps.executions
                .start(
                    &next,
                    &deps.config.workers.execution_input(&job.job_id, &job.policy_or_default()),
                )
                .await?;
            tracing::warn!(
                execution = next,
                "queued job's execution ended without it; started another"
            );
            report.restarted += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

/// Whether `job`'s dispatches, less those its resumes made, are still within its budget.
async fn resumed_within(deps: &Deps, job: &JobEntry) -> Result<bool, ReaperError> {
    let Some(record) = deps.jobs.job(&job.job_id).await? else { return Ok(false) };
    Ok(record.resumes > 0
        && record.dispatches.saturating_sub(record.resumes) < deps.max_attempts(job))
}

/// A `queued` job whose execution does not exist: its start was throttled or failed (an
/// outage of Step Functions, say), which is no evidence that the job cannot run. It is started
/// again under the same name (idempotent), spending no attempt of its budget; only a job that
/// has waited `max_pending` since it was accepted (or queued again for its next attempt, whose
/// dispatch message was lost) fails.
async fn never_started(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
    execution: &str,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // A job queued again for its next attempt (after a backoff) has waited since then.
    let since = if job.dispatches > 1 { job.updated_at } else { job.created_at };
    let waited = (now - since.as_datetime()).to_std().unwrap_or_default();
    if waited >= deps.config.max_pending {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!(
                "its execution could not be started within {} s of being accepted",
                deps.config.max_pending.as_secs()
            ),
        };
        let result = fail(deps, job, &[JobStatus::Queued], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    deps.executions
        .start(
            execution,
            &deps.config.workers.execution_input(&job.job_id, &job.policy_or_default()),
        )
        .await?;
    tracing::warn!(execution, "queued job's execution was never started; started it");
    report.restarted += 1;
    Ok(())
}
