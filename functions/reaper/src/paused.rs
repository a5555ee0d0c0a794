//! `paused` jobs whose pause lapsed: paused longer than their policy's `max_paused`, they are
//! cancelled with that reason (the owner is told by the `job.cancelled` webhook, as for any
//! cancellation); waiting for a signal past the wait's `until`, the wait is recorded timed out
//! and the job resumed, its stage told so. The status index keys a paused job by when its pause
//! lapses (or its wait times out), so the sweep reads only those due.

use crate::*;

use chrono::{DateTime, Utc};
use longhaul_aws::jobs::ResumeOutcome;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::{Cancellation, Timestamp};

/// A paused job whose index entry says its pause lapsed: read again (the index is eventually
/// consistent, and a job resumed and paused again lapses later), then cancelled if it still
/// is paused, unchanged since the read.
pub(crate) async fn lapsed(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let Some(record) = deps.jobs.job(&job.job_id).await? else { return Ok(()) };
    let Some(paused_at) = record.pause.as_ref().and_then(|p| p.paused_at) else {
        return Ok(()); // resumed (or ended) since
    };
    if record.status != JobStatus::Paused {
        return Ok(());
    }
    if let Some(wait) = record.pause.as_ref().and_then(|p| p.wait.clone()) {
        return timed_out(deps, now, &record, &wait, report).await;
    }
    let policy = record.policy_or_default();
    let lapses_at = policy.pause_lapses_at(paused_at);
    if lapses_at.as_datetime() > now {
        return Ok(());
    }
    let reason = format!(
        "paused since {paused_at}, longer than its max_paused ({} s)",
        policy.max_paused_seconds
    );
    let cancellation = Cancellation {
        requested_at: Timestamp::from(now),
        requested_by: record.owner.clone(),
        reason: Some(reason.clone()),
    };
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Cancelled,
        reason: format!("cancelled by the reaper: {reason}"),
        error: None,
    };
    let read = Some(&record);
    match compensate_instead(
        deps,
        &job,
        &[JobStatus::Paused],
        None,
        ending,
        Some(&cancellation),
        read,
    )
    .await
    {
        Ok(true) => {
            tracing::warn!(%paused_at, %lapses_at, "the pause lapsed; the job compensates, then is cancelled");
            report.cancelled += 1;
            return Ok(());
        }
        Ok(false) => {}
        Err(err) => return raced(Err(err), report),
    }
    let request = TransitionRequest::new(
        &job.job_id,
        &[JobStatus::Paused],
        JobStatus::Cancelled,
        format!("cancelled by the reaper: {reason}"),
    )
    .unchanged_since(record.updated_at)
    .set("cancellation", &cancellation);
    match deps.jobs.transition(request).await {
        Ok(ended) => {
            metrics::emit_end(&ended);
            tracing::warn!(%paused_at, %lapses_at, "the pause lapsed; the job is cancelled");
            report.cancelled += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

/// A job waiting for a signal whose wait timed out: the timeout is recorded (unless the signal
/// came first) and the job resumed, dispatched again — its stage's `wait_for` then answers
/// `TimedOut` (or the signal).
async fn timed_out(
    deps: &Deps,
    now: DateTime<Utc>,
    record: &longhaul_aws::jobs::JobRecord,
    wait: &longhaul_domain::signals::Wait,
    report: &mut Report,
) -> Result<(), ReaperError> {
    if wait.until.as_datetime() > now {
        return Ok(());
    }
    let at = Timestamp::from(now);
    let recorded = deps.jobs.time_out_signal(&record.job_id, &wait.signal, at).await?;
    match deps
        .jobs
        .resume(record, &format!("the wait for signal {} timed out", wait.signal), at)
        .await
    {
        Ok(ResumeOutcome::Resumed(resumed)) => {
            let message = DispatchMessage::new(record.job_id.clone());
            deps.intake.send(&message, &resumed.owner).await?;
            tracing::info!(signal = %wait.signal, timed_out = recorded, "the wait ended; the job resumes");
            report.resumed += 1;
            Ok(())
        }
        Ok(ResumeOutcome::Withdrawn(_)) => Ok(()),
        Err(err) => raced(Err(err), report),
    }
}
