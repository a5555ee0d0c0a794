//! Starting a written job: at once, in the request that wrote it, or through the dispatcher
//! (its message on the intake queue).

use longhaul_aws::jobs::JobRecord;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::{Timestamp, schedule};

use crate::Deps;

/// Starts the written job. A job not delayed is started at once where this function starts
/// jobs ([`Deps::start`]): the dispatcher's own steps, run here from the job as written
/// (`dispatcher::dispatch_snapshot`: its slots taken, or its place in a waiting list;
/// `pending → queued`; its worker invoked), so it skips the intake queue, the dispatcher's
/// invocation and its read of the job. A start that fails part-way is handed to the intake
/// queue: the dispatcher's steps are idempotent, so its dispatch finishes what this one
/// began. A delayed job, or every job where this function starts none, is enqueued.
pub(crate) async fn start(deps: &Deps, job: &JobRecord) {
    if let Some(dispatch) = deps.start.as_deref().filter(|_| job.not_before.is_none()) {
        match dispatcher::dispatch_snapshot(dispatch, job.clone()).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(error = %err, "starting the job at once failed; the intake queue carries it");
            }
        }
    }
    enqueue(deps, job).await
}

/// Enqueues the job, its message carrying the record as written (the dispatcher then need
/// not read it: [`DispatchMessage::snapshot`]). A failure here leaves the job `pending`: it is
/// already durable, and the reaper re-enqueues pending jobs that were never dispatched, so the
/// client still gets 202.
///
/// A delayed job's message is delayed until its start when SQS can hold it that long (15
/// minutes); a later start is not enqueued now: the reaper enqueues it 15 minutes before
/// (its pending index entry is keyed then — `longhaul_domain::schedule`).
async fn enqueue(deps: &Deps, job: &JobRecord) {
    let now = deps.clock.now();
    let start = job.not_before.map(Timestamp::as_datetime);
    let delay = match start {
        Some(at) if (at - now).num_seconds() > schedule::MAX_SQS_DELAY_SECONDS => {
            tracing::info!(not_before = %at, "delayed; the reaper enqueues it when due");
            return;
        }
        Some(at) => schedule::sqs_delay(at, now),
        None => 0,
    };
    let message = DispatchMessage::snapshot(job);
    if let Err(err) = deps.intake.send_delayed(&message, delay, &job.owner).await {
        tracing::error!(error = %err, "enqueueing failed; the job stays pending for the reaper");
    }
}
