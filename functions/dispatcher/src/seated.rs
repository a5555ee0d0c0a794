//! Starting a new job in the request that writes it, seated before it is written: its
//! running slots taken first, so its record is written `queued` — already dispatched — and
//! its run is invoked at once. No `pending → queued` write follows the creation, and (while
//! it holds its slots) no read of its tenant's backlog comes before it: a job that does not
//! wait adds nothing to what waits.
//!
//! A slot is held before its job exists. Whoever finds such a holder — the reaper's
//! reconciliation, giving back the slots of jobs that are gone — leaves it alone for
//! [`longhaul_aws::slots::UNWRITTEN_HOLDER_GRACE`] after the job id was made (ids are UUIDv7,
//! so they carry it): longer than the request that took it can live. A request that dies
//! between taking the slot and writing the job leaves the slot to that reconciliation.

use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::JobRecord;
use longhaul_aws::pool_rate::{Charged, RateCharge};
use longhaul_aws::slots::Pool;
use longhaul_domain::{JobStatus, Timestamp, Transition};

use crate::{Deps, DispatchError, give_back, pools_of_job};

/// The reason a job written already dispatched logs for its `queued` transition: the same as
/// a dispatch's.
pub const DISPATCHED: &str = "dispatched";

/// What [`seat`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seating {
    /// The job holds a slot of each of its pools; `charged`: its submission was counted with
    /// its tenant pool's slot (it has one, and a limit is set), so it is not to be counted again.
    Seated {
        /// Whether the submission was counted in the tenant pool's write.
        charged: bool,
    },
    /// A pool is full, or the job has none: it holds no slot, and nothing was counted.
    NotSeated,
    /// Its tenant used up this minute's submissions: it holds no slot; retry after this many
    /// seconds.
    Limited {
        /// Seconds to the next window.
        retry_after: u64,
    },
}

/// Takes a slot of each of the new `job`'s pools (its kind's, then its tenant's), counting its
/// submission `rate` with its tenant pool's slot, in the same write ([`longhaul_aws::pool_rate`]):
/// [`Seating::Seated`] when it holds every one, and has at least one (a job with no pool is not
/// seated: nothing bounds how many of them there are but its tenant's backlog, which must be
/// read then). A full pool gives back the slots taken before it and answers
/// [`Seating::NotSeated`]: the job is then written `pending` and dispatched as any other,
/// which makes it wait. The tenant pool comes last so that a submission is counted only once
/// it is seated (one that waits is counted after its backlog is checked).
pub async fn seat(
    deps: &Deps,
    job: &JobRecord,
    rate: RateCharge,
) -> Result<Seating, DispatchError> {
    let mut pools = pools_of_job(deps, job);
    if pools.is_empty() {
        return Ok(Seating::NotSeated);
    }
    pools.sort_by_key(|(pool, _)| matches!(pool, Pool::Tenant(_)));
    let mut taken: Vec<&(Pool, u32)> = Vec::with_capacity(pools.len());
    let mut charged = false;
    for pool in &pools {
        let (slots_of, limit) = pool;
        let acquired = match slots_of {
            Pool::Tenant(_) => {
                charged = rate.per_minute > 0;
                deps.slots.acquire_charged(slots_of, *limit, &job.job_id, job.resumes, rate).await
            }
            Pool::Kind(_) => {
                let acquired = deps.slots.acquire(slots_of, *limit, &job.job_id, job.resumes);
                acquired.await.map(Charged::of_acquire)
            }
        };
        let refused = match acquired {
            Ok(Charged::Taken) => {
                taken.push(pool);
                continue;
            }
            Ok(Charged::Full) => Seating::NotSeated,
            Ok(Charged::Limited { retry_after }) => Seating::Limited { retry_after },
            Err(err) => {
                // The slots taken go back (failing that, the job's dispatch takes them again,
                // or the reaper frees them); the error is the seat's.
                if let Err(back) = give_back(deps, &job.job_id, &taken).await {
                    tracing::warn!(error = %back, "giving back the slots of a failed seat failed");
                }
                return Err(err.into());
            }
        };
        give_back(deps, &job.job_id, &taken).await?;
        return Ok(refused);
    }
    Ok(Seating::Seated { charged })
}

/// Gives back the slots [`seat`] took for a job that is not written after all (its
/// submission refused, or its write failed), waking whoever waits for them.
pub async fn unseat(deps: &Deps, job: &JobRecord) -> Result<(), DispatchError> {
    let pools = pools_of_job(deps, job);
    give_back(deps, &job.job_id, &pools.iter().collect::<Vec<_>>()).await
}

/// The seated job's record as it is written: `queued` under its first run's name, as its
/// dispatch would leave it (`pending` first in its log, then `queued`, at its creation).
pub fn dispatched(mut job: JobRecord) -> JobRecord {
    let name = execution_name(&job.job_id, job.dispatches + 1);
    job.dispatches += 1;
    job.execution = Some(name);
    job.status = JobStatus::Queued;
    let at: Timestamp = job.created_at;
    job.transitions.push(Transition { state: JobStatus::Queued, at, reason: DISPATCHED.into() });
    job
}

/// Invokes the run of a job written [`dispatched`]: the dispatch's last step. Failing, the
/// job is still `queued`, and a dispatch message for it (or the reaper's sweep of jobs
/// queued too long) invokes it again.
pub async fn run(deps: &Deps, job: &JobRecord) -> Result<(), DispatchError> {
    crate::start(deps, job, &execution_name(&job.job_id, job.dispatches)).await
}
