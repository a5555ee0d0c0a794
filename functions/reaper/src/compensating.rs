//! `compensating` jobs whose worker has gone silent: keyed by when it should next have been
//! heard of (the compensation's last write, plus [`COMPENSATION_SILENCE`]), those due are sent
//! to the dispatcher again, which invokes their worker's `compensate` op. One still
//! compensating [`GIVE_UP_AFTER`] after it began (its worker cannot run: a broken deployment,
//! a kind no longer deployed) is ended as it was going to end, its unfinished undos given up
//! and counted (`UndosFailed`): a compensation always ends.

use crate::*;

use chrono::{DateTime, Utc};
use longhaul_aws::jobs::{COMPENSATION_SILENCE, JobRecord};
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::Timestamp;
use longhaul_domain::compensation::{Compensation, CompensationStatus, Ending, UndoStatus};

/// How long a compensation may take in all before the reaper ends it.
pub(crate) const GIVE_UP_AFTER: std::time::Duration = std::time::Duration::from_secs(86_400);

/// A compensating job whose index entry is due: read again (the index is eventually
/// consistent, and the worker may have written since), then dispatched again, or ended.
pub(crate) async fn silent(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let Some(record) = deps.jobs.job(&job.job_id).await? else { return Ok(()) };
    if record.status != JobStatus::Compensating {
        return Ok(());
    }
    let began = record.compensation.as_ref().map_or(record.updated_at, |c| c.started_at);
    if now.signed_duration_since(began.as_datetime()).to_std().unwrap_or_default() >= GIVE_UP_AFTER
    {
        return give_up(deps, &record, report).await;
    }
    if now.signed_duration_since(record.updated_at.as_datetime()).to_std().unwrap_or_default()
        < COMPENSATION_SILENCE
    {
        return Ok(()); // heard of since the index entry was read
    }
    // Looked at again a silence later (each look sends at most one message), and a worker
    // that wrote since this read goes on: this write is refused.
    if let Some(mut compensation) = record.compensation.clone() {
        compensation.revision += 1;
        let due = Timestamp::from(
            now + chrono::Duration::from_std(COMPENSATION_SILENCE).unwrap_or_default(),
        );
        if let Err(err) = deps.jobs.record_compensation(&record.job_id, &compensation, due).await {
            return raced(Err(err), report);
        }
    }
    let message = DispatchMessage::new(record.job_id.clone());
    deps.intake.send(&message, &record.owner).await?;
    tracing::warn!(updated_at = %record.updated_at, "compensating job's worker went silent; dispatched again");
    report.re_enqueued += 1;
    Ok(())
}

/// Ends `record` as its compensation says it was going to end, its unfinished undos given up.
async fn give_up(deps: &Deps, record: &JobRecord, report: &mut Report) -> Result<(), ReaperError> {
    let mut compensation = match record.compensation.clone() {
        Some(compensation) => compensation,
        None => {
            // Cannot be written so (the move into compensating carries it): ended failed
            // rather than left compensating for good.
            tracing::error!("a compensating job without its compensation record; it fails");
            let ending = Ending {
                status: JobStatus::Failed,
                reason: "its compensation record was lost: its undos did not run".into(),
                error: None,
            };
            Compensation::begin(ending, Timestamp::from(deps.clock.now()))
        }
    };
    let now = Timestamp::from(deps.clock.now());
    let unfinished = "the undo did not run: the compensation did not end within a day";
    let mut given_up = 0;
    for step in compensation.stages.iter_mut().filter(|step| !step.status.is_settled()) {
        step.status = UndoStatus::Failed;
        step.at = Some(now);
        step.error = Some(unfinished.to_owned());
        given_up += 1;
    }
    if !compensation.planned {
        // Not even planned: what its stages did is unknown, and not undone.
        given_up += 1;
        compensation.status = CompensationStatus::Failed;
    } else {
        compensation.status = compensation.outcome();
    }
    let ending = compensation.ending.clone();
    let mut request = TransitionRequest::new(
        &record.job_id,
        &[JobStatus::Compensating],
        ending.status,
        format!("{} (the reaper ended its compensation after a day)", ending.reason),
    )
    .unchanged_since(record.updated_at)
    .set("compensation", &compensation);
    if let Some(error) = &ending.error {
        request = request.set("error", error);
    }
    match deps.jobs.transition(request).await {
        Ok(ended) => {
            // Counted once the give-up is recorded (a lost race is counted by its winner).
            for _ in 0..given_up {
                metrics::count(Metric::UndosFailed, record);
            }
            metrics::emit_end(&ended);
            tracing::error!(status = %ended.status, "compensation given up after a day");
            if let Err(err) = tidy(deps, &record.job_id, ended.status).await {
                tracing::warn!(error = %err, "cleanup after the job's end failed; the lifecycle rule is the backstop");
            }
            report.failed += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}
