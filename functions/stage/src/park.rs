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

use longhaul_aws::jobs::{JobRecord, Lease, ResumeOutcome, StoreError};
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::signals::Wait;
use longhaul_domain::{JobId, JobStatus, Timestamp};

use crate::failure_message::PublicMessage;
use crate::{Deps, StageError, store_failed};

/// What became of a pause the stage saw.
#[derive(Debug)]
pub(crate) enum Parked {
    /// The job is `paused`.
    Paused,
    /// A resume withdrew the pause before it took effect: the stage goes on.
    Withdrawn,
    /// The owner cancelled the job since: it ends `cancelled` (the record that shows it).
    Cancelled(Box<JobRecord>),
}

/// Parks `job_id` under `lease` (see the module documentation). Re-reads and tries again if
/// the job was written between the read and the park (a counter, a stall flag, an owner's pause
/// landing on a wait); a lost lease is [`StageError::LeaseLost`].
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
        if job.cancellation.is_some() {
            return Ok(Parked::Cancelled(Box::new(job)));
        }
        match job.status {
            JobStatus::Running => {}
            // A retried call whose park landed: if it parked a wait, the signal is read again
            // (the call may have died between the park and that read).
            JobStatus::Paused => {
                if let Some(wait) = wait {
                    resume_if_signalled(deps, &job, wait).await?;
                }
                return Ok(Parked::Paused);
            }
            status => return Err(StageError::LeaseLost(format!("the job is {status}"))),
        }
        if let (None, Some(wait)) = (&job.pause, wait) {
            match park_waiting(deps, &job, lease, wait).await? {
                Some(parked) => return Ok(parked),
                // Its owner paused it meanwhile: read again, and parked as their pause.
                None => continue,
            }
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

/// Parks `job` waiting for `wait`, then reads the signal again (see the module documentation);
/// `None` if its owner paused it meanwhile (the caller parks it as their pause).
async fn park_waiting(
    deps: &Deps,
    job: &JobRecord,
    lease: &Lease,
    wait: &Wait,
) -> Result<Option<Parked>, StageError> {
    let now = Timestamp::from(deps.clock.now());
    let parked = match deps.jobs.park_waiting(job, &lease.token, wait, now).await {
        Ok(parked) => parked,
        // Cancelled meanwhile (it ends so), paused by its owner (their pause it is), or held
        // by another attempt (this stage stops).
        Err(StoreError::Conflict { current: Some(current) })
            if current.lease.as_deref() == Some(lease.token.as_str()) =>
        {
            return match current.cancellation {
                Some(_) => Ok(Some(Parked::Cancelled(current))),
                None => Ok(None),
            };
        }
        Err(StoreError::Conflict { .. }) => {
            return Err(StageError::LeaseLost("another attempt holds the job".into()));
        }
        Err(err) => return Err(store_failed(err)),
    };
    tracing::info!(signal = %wait.signal, until = %wait.until, "parked, waiting for a signal");
    resume_if_signalled(deps, &parked, wait).await?;
    Ok(Some(Parked::Paused))
}

/// Resumes `parked` — paused, waiting for `wait` — if its signal came (while it was being
/// parked, or before a retried park call looked), and dispatches it again.
async fn resume_if_signalled(
    deps: &Deps,
    parked: &JobRecord,
    wait: &Wait,
) -> Result<(), StageError> {
    if parked.pause.as_ref().and_then(|p| p.wait.as_ref()) != Some(wait) {
        return Ok(());
    }
    if deps.jobs.signal(&parked.job_id, &wait.signal).await.map_err(store_failed)?.is_none() {
        return Ok(());
    }
    let now = Timestamp::from(deps.clock.now());
    match deps.jobs.resume(parked, &format!("signal {} came", wait.signal), now).await {
        Ok(ResumeOutcome::Resumed(resumed)) => {
            let message = DispatchMessage::new(parked.job_id.clone());
            match deps.intake.send(&message, &resumed.owner).await {
                Ok(()) => {
                    tracing::info!(signal = %wait.signal, "the signal came as the job parked; resumed")
                }
                // Pending again either way: the reaper's pending sweep enqueues it.
                Err(err) => {
                    tracing::error!(error = %err, "enqueueing the resumed job failed; the reaper enqueues it")
                }
            }
            Ok(())
        }
        // Its sender (or the reaper) resumed it first.
        Ok(ResumeOutcome::Withdrawn(_)) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(err) => Err(store_failed(err)),
    }
}
