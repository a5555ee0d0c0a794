//! Starting a written job: at once, in the request that wrote it, or through the dispatcher
//! (its message on the intake queue).

use dispatcher::seated::Seating;
use longhaul_aws::jobs::JobRecord;
use longhaul_aws::pool_rate::RateCharge;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::JobStatus;
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

/// A new job seated before it is written (`dispatcher::seated`): it holds a slot of each of
/// its pools, so it is written `queued` and its run invoked at once.
pub(crate) struct Seated<'a>(&'a dispatcher::Deps);

/// What [`seat`] did for a new job.
pub(crate) enum Seat<'a> {
    /// It holds its slots; `charged`: its submission was counted with its tenant pool's slot.
    Seated(Seated<'a>, bool),
    /// It holds none (a pool is full, it has none, it is delayed, this function starts no
    /// jobs, or taking a slot failed), and nothing was counted.
    Unseated,
    /// Its tenant's submissions for this minute are used up: it holds none.
    Limited {
        /// Seconds to the next window.
        retry_after: u64,
    },
}

/// Seats the new `job` where this function starts jobs and it is not delayed, counting its
/// submission with its tenant pool's slot (`dispatcher::seated::seat`). Not seated, it is
/// written `pending` and started by [`start`] as any job, which takes its slots again (a slot
/// held already is held once: the holder is the job).
pub(crate) async fn seat<'a>(deps: &'a Deps, job: &JobRecord) -> Seat<'a> {
    let Some(dispatch) = deps.start.as_deref().filter(|_| job.not_before.is_none()) else {
        return Seat::Unseated;
    };
    let rate =
        RateCharge { per_minute: deps.submissions_per_minute, now: deps.clock.now().timestamp() };
    match dispatcher::seated::seat(dispatch, job, rate).await {
        Ok(Seating::Seated { charged }) => Seat::Seated(Seated(dispatch), charged),
        Ok(Seating::NotSeated) => Seat::Unseated,
        Ok(Seating::Limited { retry_after }) => Seat::Limited { retry_after },
        Err(err) => {
            tracing::warn!(error = %err, "taking the new job's slots failed; it is written pending and dispatched");
            Seat::Unseated
        }
    }
}

impl Seated<'_> {
    /// The record to write: `queued`, as its dispatch would leave it.
    pub(crate) fn dispatched(&self, job: JobRecord) -> JobRecord {
        dispatcher::seated::dispatched(job)
    }

    /// Gives back the slots of a job that is not written after all. Failing, they stay
    /// held by a job that does not exist until the reaper's reconciliation gives them back
    /// (`longhaul_aws::slots::UNWRITTEN_HOLDER_GRACE` after the job id was made).
    pub(crate) async fn unseat(self, job: &JobRecord) {
        if let Err(err) = dispatcher::seated::unseat(self.0, job).await {
            tracing::error!(error = %err, "giving back the slots of a job not written failed; the reaper gives them back");
        }
    }

    /// Settles the slots taken for a job another request wrote first (`written`, as read):
    /// a `pending` one (waiting, or being dispatched) is dispatched as it is now, which moves
    /// it on with the slots it holds; an ended one gives them back; any other (queued,
    /// running, paused, compensating) keeps them as its own, a paused one's coming back with
    /// the reaper's reconciliation as any paused holder's.
    pub(crate) async fn settle(self, deps: &Deps, written: &JobRecord) {
        if written.status.is_terminal() {
            return self.unseat(written).await;
        }
        if written.status == JobStatus::Pending
            && let Err(err) = dispatcher::dispatch(self.0, &written.job_id).await
        {
            tracing::warn!(error = %err, "dispatching the job another request wrote failed; the intake queue carries it");
            enqueue(deps, written).await
        }
    }

    /// Starts the job written `queued`: its run invoked, or, failing that, its message on the
    /// intake queue (whose dispatch invokes the run of a `queued` job again).
    pub(crate) async fn start(self, deps: &Deps, job: &JobRecord) {
        match dispatcher::seated::run(self.0, job).await {
            Ok(()) => {}
            Err(err) => {
                tracing::warn!(error = %err, "invoking the job's run failed; the intake queue carries it");
                enqueue(deps, job).await
            }
        }
    }
}

/// Enqueues the job, its message carrying the record as written (the dispatcher then need
/// not read it: [`DispatchMessage::snapshot`]). A failure here leaves the job `pending` (or
/// `queued`, seated): it is already durable, and the reaper dispatches pending jobs that were
/// never dispatched and queued ones whose run never claimed them, so the client still gets 202.
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
        tracing::error!(error = %err, "enqueueing failed; the reaper's sweep of jobs not started finds it");
    }
}
