//! Parking a job its owner paused while this stage ran it: the stage saw the pause at a
//! progress write, its kind saved its final checkpoint and stopped, and now the job becomes
//! `paused` under this lease ([`JobPausing::park`]) — its slot given back by the slots
//! function, no worker left running, its resume continuing from that checkpoint.
//!
//! The job is read again first (the pause landed after this invocation's read): a pause
//! withdrawn meanwhile by a resume means the stage just goes on; a cancellation since means
//! the job ends `cancelled` instead.
//!
//! A kind that waits for a signal that has not come parks the job the same way, waiting
//! (`pause.wait`, the status index keying it by when the wait times out) — unless its owner
//! asked to pause it, which parks it as their pause (its resume runs the stage again, and the
//! wait starts again). Then the signal is read once more: one that came between the kind's
//! look and the park (its sender found the job still running) resumes the job at once, so no
//! signal is left waiting for a job that waits for it.

use longhaul_aws::jobs::{Lease, ResumeOutcome, StoreError};
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::signals::Wait;
use longhaul_domain::{Cancellation, JobId, JobStatus, Timestamp};

use crate::failure_message::PublicMessage;
use crate::{Deps, StageError, store_failed};

/// What became of a pause the stage saw.
#[derive(Debug)]
pub(crate) enum Parked {
    /// The job is `paused`.
    Paused,
    /// A resume withdrew the pause before it took effect: the stage goes on.
    Withdrawn,
    /// The owner cancelled the job since: it ends `cancelled`.
    Cancelled(Cancellation),
}

/// Parks `job_id` under `lease` (see the module documentation). Re-reads and tries again if
/// the job was written between the read and the park (a counter, a stall flag); a lost lease
/// is [`StageError::LeaseLost`].
pub(crate) async fn park(
    deps: &Deps,
    job_id: &JobId,
    lease: &Lease,
    wait: Option<&Wait>,
) -> Result<Parked, StageError> {
    for _ in 0..3 {
        let job = deps.jobs.job(job_id).await.map_err(store_failed)?;
        let Some(job) = job.filter(|job| job.lease.as_deref() == Some(lease.token.as_str())) else {
            return Err(StageError::LeaseLost("another attempt holds the job".into()));
        };
        if let Some(cancellation) = job.cancellation {
            return Ok(Parked::Cancelled(cancellation));
        }
        match job.status {
            JobStatus::Running => {}
            // A retried call whose park landed.
            JobStatus::Paused => return Ok(Parked::Paused),
            status => return Err(StageError::LeaseLost(format!("the job is {status}"))),
        }
        if let (None, Some(wait)) = (&job.pause, wait) {
            return park_waiting(deps, &job, lease, wait).await;
        }
        if job.pause.is_none() {
            // The flag that stopped the stage asks for nothing any more (a racing request set
            // it again after the withdrawal): dropped under this lease, so the stage goes on
            // instead of stopping at it again.
            match deps.jobs.drop_stale_pause_flag(job_id, &lease.token).await {
                Ok(()) => {}
                Err(StoreError::Conflict { .. }) => {
                    return Err(StageError::LeaseLost("another attempt holds the job".into()));
                }
                Err(err) => return Err(store_failed(err)),
            }
            tracing::info!("the pause was withdrawn before it took effect; the stage goes on");
            return Ok(Parked::Withdrawn);
        }
        let now = Timestamp::from(deps.clock.now());
        let lapses_at = job.policy_or_default().pause_lapses_at(now);
        match deps.jobs.park(&job, &lease.token, now, lapses_at).await {
            Ok(_) => {
                tracing::info!(%lapses_at, "paused at its last checkpoint");
                return Ok(Parked::Paused);
            }
            // Written since the read: read again.
            Err(StoreError::Conflict { .. }) => {}
            Err(err) => return Err(store_failed(err)),
        }
    }
    Err(StageError::retryable(
        PublicMessage::fixed("the job could not be paused"),
        "the job record kept changing while the stage parked it",
    ))
}

/// Parks `job` waiting for `wait`, then reads the signal again (see the module documentation).
async fn park_waiting(
    deps: &Deps,
    job: &longhaul_aws::jobs::JobRecord,
    lease: &Lease,
    wait: &Wait,
) -> Result<Parked, StageError> {
    let now = Timestamp::from(deps.clock.now());
    let parked = match deps.jobs.park_waiting(job, &lease.token, wait, now).await {
        Ok(parked) => parked,
        // Cancelled meanwhile (the job ends so), or another attempt holds it (this stops).
        Err(StoreError::Conflict { current }) => {
            return match current.and_then(|job| job.cancellation) {
                Some(cancellation) => Ok(Parked::Cancelled(cancellation)),
                None => Err(StageError::LeaseLost("another attempt holds the job".into())),
            };
        }
        Err(err) => return Err(store_failed(err)),
    };
    tracing::info!(signal = %wait.signal, until = %wait.until, "parked, waiting for a signal");
    if deps.jobs.signal(&job.job_id, &wait.signal).await.map_err(store_failed)?.is_some() {
        // It came while the job was being parked: resumed at once, dispatched again.
        match deps.jobs.resume(&parked, &parked.owner, now).await {
            Ok(ResumeOutcome::Resumed(resumed)) => {
                let message = DispatchMessage { job_id: job.job_id.clone() };
                match deps.intake.send(&message, &resumed.owner).await {
                    Ok(()) => {
                        tracing::info!(signal = %wait.signal, "the signal came as the job parked; resumed")
                    }
                    // Pending again either way: the reaper's pending sweep enqueues it.
                    Err(err) => {
                        tracing::error!(error = %err, "enqueueing the resumed job failed; the reaper enqueues it")
                    }
                }
            }
            // Its sender (or the reaper) resumed it first.
            Ok(ResumeOutcome::Withdrawn(_)) | Err(StoreError::Conflict { .. }) => {}
            Err(err) => return Err(store_failed(err)),
        }
    }
    Ok(Parked::Paused)
}
