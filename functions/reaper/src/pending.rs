//! Lost dispatches of `pending` jobs: enqueued again at growing intervals; failed only once
//! they waited `LONGHAUL_MAX_PENDING_SECONDS` since they were accepted (a delayed job counts from
//! its start).

use crate::*;

use chrono::{DateTime, Utc};
use longhaul_aws::jobs::JobEntry;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::{ErrorCode, JobError, JobStatus, Timestamp, schedule};

/// A `pending` job past the grace: its message may have been lost (submit died between its
/// two writes, or the message dead-lettered), or may still wait in a backlog — SQS cannot say
/// which. Enqueueing it again is harmless either way (dispatch is a conditional transition and
/// executions are named by job and dispatch), so it is re-enqueued, at growing intervals so a
/// backlog is not multiplied (`pending_grace` × 2ⁿ, up to `max_enqueue_interval`); it fails
/// only when it has waited `max_pending` since it was accepted, never for a count of looks.
pub(crate) async fn lost_pending(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let waited = (now - job.created_at.as_datetime()).to_std().unwrap_or_default();
    // A delayed job waits from its start, a resumed one from its resume, not from its
    // submission: the index entry says neither, so the record is read — only on this rare
    // path.
    if waited >= deps.config.max_pending && !startable_within(deps, now, &job).await? {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!(
                "not dispatched within {} s of being accepted ({} re-enqueues)",
                deps.config.max_pending.as_secs(),
                job.enqueues
            ),
        };
        let result = fail(deps, &job, &[JobStatus::Pending], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    let interval = deps
        .config
        .pending_grace
        .saturating_mul(1u32 << (job.enqueues + 1).min(20))
        .min(deps.config.max_enqueue_interval)
        .max(deps.config.pending_grace);
    // The sweep asks for entries whose sort key is older than the grace: an entry keyed
    // `now + interval − grace` is next due in `interval`.
    let next_look = now + chrono::Duration::from_std(interval).unwrap_or_default()
        - chrono::Duration::from_std(deps.config.pending_grace).unwrap_or_default();
    match deps.jobs.count_enqueue(&job.job_id, Timestamp::from(next_look)).await {
        Ok(record) => {
            let message = DispatchMessage::new(job.job_id.clone());
            match record.not_before.map(Timestamp::as_datetime).filter(|start| *start > now) {
                // A delayed job coming due (its entry was keyed 15 minutes before its start):
                // its message waits for the start, and the next look is after it.
                Some(start) => {
                    let delay = schedule::sqs_delay(start, now);
                    deps.intake.send_delayed(&message, delay, &record.owner).await?;
                    if start > next_look {
                        let deferred =
                            deps.jobs.defer_pending_look(&job.job_id, Timestamp::from(start)).await;
                        raced(deferred, report)?;
                    }
                    tracing::info!(delay, "delayed job coming due; enqueued for its start");
                }
                None => {
                    deps.intake.send(&message, &record.owner).await?;
                    tracing::warn!(
                        next_look_in_seconds = interval.as_secs(),
                        "pending job not dispatched yet; enqueued again"
                    );
                }
            }
            report.re_enqueued += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

/// Whether `job`, pending for longer than `max_pending` since it was accepted, has waited
/// less than that since it could start — a delayed job since its start, a resumed one since
/// its resume (its last move into `pending`) — so it is not undispatchable yet.
async fn startable_within(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
) -> Result<bool, ReaperError> {
    let Some(record) = deps.jobs.job(&job.job_id).await? else { return Ok(false) };
    let resumed = (record.resumes > 0)
        .then(|| record.transitions.iter().rev().find(|t| t.state == JobStatus::Pending))
        .flatten()
        .map(|t| t.at);
    Ok([record.not_before, resumed]
        .into_iter()
        .flatten()
        .max()
        .map(Timestamp::as_datetime)
        .is_some_and(|start| (now - start).to_std().unwrap_or_default() < deps.config.max_pending))
}
