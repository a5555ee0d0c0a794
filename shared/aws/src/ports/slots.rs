//! The running-slot pools and their waiting lists, as a port: what the dispatcher, the slots
//! function and the reaper need of [`Admitter`] (the rules and the item layout are
//! [`crate::slots`]).

use async_trait::async_trait;
use longhaul_domain::{JobId, Owner};

use super::Warm;
use crate::AwsError;
use crate::limits::Admission;
use crate::pool_rate::{Charged, RateCharge};
use crate::slots::{Admitter, Held, Pool, Seat, WaitingEntry};

/// Running-job slots of tenant and kind pools, their waiting lists, and the admission of
/// waiting jobs (a kind pool's tenants in turn, through its ring).
///
/// Slots: [`acquire`](SlotPools::acquire) refuses a full pool and is idempotent for a job that
/// holds one; [`give_back`](SlotPools::give_back) is idempotent and frees only the slots the
/// jobs named hold. Waiting lists are read in admission order (priority, then submission
/// time: the position's key order). [`admit`](SlotPools::admit) only *wakes* a job: it sends
/// the job's dispatch message to the intake queue (the adapter's own) and takes it out of its
/// list; the dispatcher takes the slot.
#[async_trait]
pub trait SlotPools: Warm {
    /// Takes a slot of `pool` (of `limit`) for run `run` of `job_id` (the job's `resumes`):
    /// `true` if the job holds one now (also when it already did: the slot is then run
    /// `run`'s), `false` if the pool is full (nothing changes). A pool no job holds gives its
    /// first slot whatever `limit` says.
    async fn acquire(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
    ) -> Result<bool, AwsError>;

    /// [`acquire`](SlotPools::acquire), counting one submission `rate` on the pool's item in
    /// the same write ([`crate::pool_rate`]): both or neither. A full pool answers
    /// [`Charged::Full`] before the window is looked at; a full window
    /// [`Charged::Limited`]. With no limit (`per_minute` 0) it is a plain acquire.
    async fn acquire_charged(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
        rate: RateCharge,
    ) -> Result<Charged, AwsError> {
        if rate.per_minute == 0 {
            let taken = self.acquire(pool, limit, job_id, run).await?;
            return Ok(Charged::of_acquire(taken));
        }
        self.acquire_counting(pool, limit, job_id, run, rate).await
    }

    /// The write of [`acquire_charged`](SlotPools::acquire_charged) under a limit
    /// (`per_minute` > 0): the slot and the submission together.
    async fn acquire_counting(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
        rate: RateCharge,
    ) -> Result<Charged, AwsError>;

    /// Counts one submission `rate` on the pool's item alone: the same counter
    /// [`acquire_charged`](SlotPools::acquire_charged) charges. With no limit (`per_minute` 0)
    /// every submission is admitted and nothing is written.
    async fn charge(&self, pool: &Pool, rate: RateCharge) -> Result<Admission, AwsError> {
        if rate.per_minute == 0 {
            return Ok(Admission::Admitted);
        }
        self.count_submission(pool, rate).await
    }

    /// The write of [`charge`](SlotPools::charge) under a limit (`per_minute` > 0).
    async fn count_submission(&self, pool: &Pool, rate: RateCharge) -> Result<Admission, AwsError>;

    /// Gives back the slots of `pool` that `job_ids` hold (none held: nothing changes), waking
    /// no one; answers the pool's holders and waiting mark as they are afterwards.
    async fn give_back(&self, pool: &Pool, job_ids: &[JobId]) -> Result<Held, AwsError>;

    /// Gives back `job_id`'s slot of `pool` unless a run later than `run` holds it (a pause's
    /// give-back: the job's next run may have taken the slot since), waking no one: `Some`
    /// with the pool's holders and waiting mark afterwards, `None` if a later run holds it
    /// (nothing changes).
    async fn give_back_run(
        &self,
        pool: &Pool,
        job_id: &JobId,
        run: u32,
    ) -> Result<Option<Held>, AwsError>;

    /// The jobs that hold a slot of `pool` (a consistent read; in no particular order).
    async fn holders(&self, pool: &Pool) -> Result<Vec<JobId>, AwsError>;

    /// Puts `job_id` of `owner` in its waiting list of `pool` at `position`
    /// ([`longhaul_domain::admission::waiting_sort_key`]); in a kind pool, makes sure the
    /// tenant has a place in the ring (at the back if it had none). Idempotent, both. Then sets
    /// the pool's waiting mark (see [`crate::slots`]), so that the next give-back says a job
    /// may wait.
    async fn enter_waiting(
        &self,
        pool: &Pool,
        position: &str,
        job_id: &JobId,
        owner: &Owner,
    ) -> Result<(), AwsError>;

    /// Takes the entry at `position` out of `owner`'s waiting list of `pool` (idempotent). A
    /// kind pool's ring keeps the tenant's place: the next admission that finds its list empty
    /// takes the place out.
    async fn leave_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<(), AwsError>;

    /// Whether `owner`'s waiting list of `pool` holds `position`.
    async fn is_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<bool, AwsError>;

    /// The first `n` entries of `owner`'s waiting list of `pool`, in admission order.
    async fn first_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        n: usize,
    ) -> Result<Vec<WaitingEntry>, AwsError>;

    /// Makes sure `owner`, whose jobs wait in kind pool `pool`, has its place in the ring
    /// (the reaper's check): [`Seat::Seated`] if it had, [`Seat::Joined`] if it had none and
    /// joined at the back, [`Seat::Restored`] if its member named a place that was missing.
    async fn seat(&self, pool: &Pool, owner: &Owner) -> Result<Seat, AwsError>;

    /// Wakes as many waiting jobs of `pool` as its free slots (`limit` less `held`) can take,
    /// each with a dispatch message, and takes them out of their lists; answers how many. A
    /// tenant pool wakes its first jobs in list order; a kind pool one job per turn of its
    /// ring (the tenant served least recently goes first, then to the back; a tenant whose
    /// list is empty leaves the ring). It reads the lists whatever the pool's waiting mark
    /// says (the reaper's admission, which finds a job whose mark was lost).
    async fn admit(&self, pool: &Pool, limit: u32, held: usize) -> Result<usize, AwsError>;

    /// [`admit`](SlotPools::admit) after a give-back that answered `held`: reads nothing and
    /// wakes no one unless the pool has a free slot and its waiting mark is set; takes the
    /// mark away (if it is still the one in `held`) when it finds no job waiting.
    async fn admit_marked(&self, pool: &Pool, limit: u32, held: &Held) -> Result<usize, AwsError>;

    /// Gives back `job_ids`' slots of `pool` and wakes as many waiting jobs as are free
    /// ([`admit_marked`](SlotPools::admit_marked)); answers how many were woken.
    async fn release(&self, pool: &Pool, limit: u32, job_ids: &[JobId]) -> Result<usize, AwsError> {
        let held = self.give_back(pool, job_ids).await?;
        self.admit_marked(pool, limit, &held).await
    }
}

// The DynamoDB adapter: the admitter's slot store and its intake queue.

#[async_trait]
impl Warm for Admitter {}

#[async_trait]
impl SlotPools for Admitter {
    async fn acquire(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
    ) -> Result<bool, AwsError> {
        self.slots.acquire(pool, limit, job_id, run).await
    }
    async fn acquire_counting(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
        rate: RateCharge,
    ) -> Result<Charged, AwsError> {
        self.slots.acquire_counting(pool, limit, job_id, run, rate).await
    }
    async fn count_submission(&self, pool: &Pool, rate: RateCharge) -> Result<Admission, AwsError> {
        self.slots.count_submission(pool, rate).await
    }
    async fn give_back(&self, pool: &Pool, job_ids: &[JobId]) -> Result<Held, AwsError> {
        self.slots.release(pool, job_ids).await
    }
    async fn give_back_run(
        &self,
        pool: &Pool,
        job_id: &JobId,
        run: u32,
    ) -> Result<Option<Held>, AwsError> {
        self.slots.give_back_run(pool, job_id, run).await
    }
    async fn holders(&self, pool: &Pool) -> Result<Vec<JobId>, AwsError> {
        self.slots.holders(pool).await
    }
    async fn enter_waiting(
        &self,
        pool: &Pool,
        position: &str,
        job_id: &JobId,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        self.slots.enter_waiting(pool, position, job_id, owner).await
    }
    async fn leave_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<(), AwsError> {
        self.slots.leave_waiting(pool, owner, position).await
    }
    async fn is_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<bool, AwsError> {
        self.slots.is_waiting(pool, owner, position).await
    }
    async fn first_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        n: usize,
    ) -> Result<Vec<WaitingEntry>, AwsError> {
        self.slots.first_waiting(pool, owner, n).await
    }
    async fn seat(&self, pool: &Pool, owner: &Owner) -> Result<Seat, AwsError> {
        self.slots.seat(pool, owner).await
    }
    async fn admit(&self, pool: &Pool, limit: u32, held: usize) -> Result<usize, AwsError> {
        Admitter::admit(self, pool, limit, held).await
    }
    async fn admit_marked(&self, pool: &Pool, limit: u32, held: &Held) -> Result<usize, AwsError> {
        Admitter::admit_marked(self, pool, limit, held).await
    }
    async fn release(&self, pool: &Pool, limit: u32, job_ids: &[JobId]) -> Result<usize, AwsError> {
        Admitter::release(self, pool, limit, job_ids).await
    }
}
