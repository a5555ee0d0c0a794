//! `POST /jobs/{id}/pause` and `POST /jobs/{id}/resume`: the owner pauses a job and resumes it.
//!
//! A `pending` or `queued` job is paused at once (`202`, `paused`); a `running` one gets a
//! pause request its stage honours at its next progress write — it saves its checkpoint and
//! the job becomes `paused` (`202`, still `running`, with the request under `pause`). Asking
//! again changes nothing (`200`, the first request); a terminal job, or one being cancelled,
//! is `409`. A paused job holds no running slot and runs nothing: only its records remain.
//!
//! `resume` moves a paused job back to `pending` and enqueues it, so it takes a running slot
//! again through the normal dispatch — waiting if its tenant is at its limit — and its stage
//! continues from the checkpoint (`202`, `pending`); a pause not yet taken effect is withdrawn
//! (`200`, `running`). Anything else is `409`. Should the enqueue fail after the job is
//! `pending` again, the reaper's sweep of pending jobs enqueues it.

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_response, wrong_status};
use longhaul_aws::jobs::{JobRecord, PauseOutcome, ResumeOutcome, StoreError};
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::{JobStatus, Pause, Timestamp};
use serde_json::json;

use crate::{Deps, internal, owned_job};

/// `POST /jobs/{id}/pause` (`{"reason"?}`).
pub(crate) async fn pause(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let (owner, body, job) = owned_job(deps, request).await?;
    let job_id = job.job_id.clone();
    refuse_ended(&job)?;
    refuse_waiting(&job)?;
    let now = Timestamp::from(deps.clock.now());
    let lapses_at = job.policy_or_default().pause_lapses_at(now);
    let pause = Pause {
        requested_at: now,
        requested_by: owner,
        reason: body.reason,
        paused_at: None,
        wait: None,
    };
    let (status, job) = match deps.jobs.pause(&job_id, &pause, lapses_at).await {
        Ok(PauseOutcome::Paused(job)) => {
            tracing::info!(%lapses_at, "paused");
            (StatusCode::ACCEPTED, job)
        }
        Ok(PauseOutcome::Requested(job)) => {
            tracing::info!("pause requested from the running stage");
            (StatusCode::ACCEPTED, job)
        }
        Ok(PauseOutcome::Already(job)) => (StatusCode::OK, job),
        Err(StoreError::Conflict { current: Some(job) }) => {
            refuse_ended(&job)?;
            let detail = if job.cancellation.is_some() {
                "The job is being cancelled."
            } else {
                "The job changed while it was being paused; try again."
            };
            return Err(wrong_status(job.status, detail));
        }
        Err(err) => return Err(internal(err)),
    };
    Ok(answer(status, &job))
}

/// `POST /jobs/{id}/resume`.
pub(crate) async fn resume(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    // No body is needed; one that is sent must still be a well-formed one.
    let (owner, _, mut job) = owned_job(deps, request).await?;
    let job_id = job.job_id.clone();
    refuse_waiting(&job)?;
    // A job written between the read and the resume (its stage parking it, a heartbeat's
    // flag) is read again from the refusal: a few rounds are plenty.
    for _ in 0..3 {
        if !resumable(&job) {
            break;
        }
        let now = Timestamp::from(deps.clock.now());
        match deps.jobs.resume(&job, &format!("resumed by {owner}"), now).await {
            Ok(ResumeOutcome::Resumed(resumed)) => {
                let message = DispatchMessage::new(job_id.clone());
                if let Err(err) = deps.intake.send(&message, &resumed.owner).await {
                    // Pending again either way: the reaper's pending sweep enqueues it.
                    tracing::error!(error = %err, "enqueueing the resumed job failed; the reaper enqueues it");
                }
                tracing::info!(paused_seconds = resumed.paused_seconds, "resumed");
                return Ok(answer(StatusCode::ACCEPTED, &resumed));
            }
            Ok(ResumeOutcome::Withdrawn(running)) => {
                tracing::info!("the pause was withdrawn before it took effect");
                return Ok(answer(StatusCode::OK, &running));
            }
            Err(StoreError::Conflict { current: Some(current) }) => job = *current,
            Err(err) => return Err(internal(err)),
        }
    }
    Err(wrong_status(job.status, format!("The job is not paused; it is {}.", job.status)))
}

/// Whether `job` is paused, or on its way there (a running job asked to pause).
fn resumable(job: &JobRecord) -> bool {
    match job.status {
        JobStatus::Paused => true,
        JobStatus::Running => job.pause.is_some(),
        _ => false,
    }
}

/// A job its stage parked to wait for a signal is neither paused again nor resumed by its
/// owner: the signal (or the wait's timeout) resumes it, and cancelling stops it.
fn refuse_waiting(job: &JobRecord) -> Result<(), Problem> {
    match job.pause.as_ref().and_then(|p| p.wait.as_ref()) {
        Some(wait) if job.status == JobStatus::Paused => Err(wrong_status(
            job.status,
            format!(
                "The job waits for signal {}, until {}: send it (POST /jobs/{}/signals/{}), or cancel the job.",
                wait.signal, wait.until, job.job_id, wait.signal
            ),
        )),
        _ => Ok(()),
    }
}

fn refuse_ended(job: &JobRecord) -> Result<(), Problem> {
    if job.status.is_terminal() {
        return Err(wrong_status(job.status, format!("The job is already {}.", job.status)));
    }
    if job.status == JobStatus::Compensating {
        return Err(wrong_status(
            job.status,
            "The job is ending: it undoes its stages.".to_owned(),
        ));
    }
    Ok(())
}

fn answer(status: StatusCode, job: &JobRecord) -> Response<Body> {
    let location = format!("/jobs/{}", job.job_id);
    let mut response = json_response(
        status,
        &json!({
            "job_id": job.job_id,
            "status": job.status,
            "status_url": location,
            "pause": job.pause,
        }),
    );
    response
        .headers_mut()
        .insert(header::LOCATION, location.parse().expect("job ids are header-safe"));
    response
}
