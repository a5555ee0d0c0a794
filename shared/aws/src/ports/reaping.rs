//! The reaper's own moves on job records: re-enqueueing a lost `pending` job (and when to look
//! at it again), pointing a `queued` job at a new execution, flagging a stall, and reading a
//! page's progress records at once.
//!
//! Each move is one conditional write that refuses with [`StoreError::Conflict`], carrying
//! the record as it is (`None` if there is no such job), when the job moved on meanwhile: of
//! two reapers that saw the same job, only one acts. The status-index entry moves as the
//! write says: these writes change its sort key (`gsi2sk`), never its bucket.

use longhaul_domain::JobId;
use std::collections::HashMap;

use async_trait::async_trait;
use longhaul_domain::Timestamp;

use super::Warm;
use crate::jobs::{JobRecord, JobStore, ProgressRecord, StoreError};

/// What the reaper writes to a job it finds lost or stalled (taking a zombie's progress
/// record from its lease is [`super::JobAttempts::revoke_progress`]).
#[async_trait]
pub trait JobReaping: Warm {
    /// Counts one more re-enqueue of a `pending` job (`enqueues` + 1, `updated_at` now) and
    /// moves its status-index entry to sort key `next_look` (when the reaper should look at
    /// it again), in the bucket it is in; the record afterwards. Refused unless `pending`.
    async fn count_enqueue(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<JobRecord, StoreError>;

    /// Moves a `pending` job's status-index entry to sort key `next_look` (a delayed job's
    /// start), changing nothing else. Refused unless `pending`.
    async fn defer_pending_look(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<(), StoreError>;

    /// Points a `queued` job whose execution ended without running it at a new execution
    /// `execution`, its dispatch number `seen_dispatches` + 1 (`updated_at` and the entry's
    /// sort key now); the record afterwards. Refused unless the job is `queued` with
    /// `seen_dispatches` dispatches (0 also when it has no count at all), so of two reapers
    /// only one starts the next execution.
    async fn redispatch_queued(
        &self,
        job_id: &JobId,
        seen_dispatches: u32,
        execution: &str,
    ) -> Result<JobRecord, StoreError>;

    /// Sets (`Some`) or clears (`None`) the `stalled_at` of a job running under `lease`,
    /// changing nothing else. Refused unless the job is `running` under `lease` and the flag
    /// is clear (to set it) or set (to clear it): of two reapers that saw one stall, one
    /// flags it and counts it.
    async fn mark_stalled(
        &self,
        job_id: &JobId,
        lease: &str,
        stalled_at: Option<Timestamp>,
    ) -> Result<(), StoreError>;

    /// The progress records of `job_ids`, by job id; a job without one (or no such job) is
    /// missing. Any number of ids (the AWS adapter reads 100 a request); the records may be
    /// a moment old (the caller re-reads, consistently, any job it is about to act on).
    async fn progress_records(
        &self,
        job_ids: &[JobId],
    ) -> Result<HashMap<JobId, ProgressRecord>, StoreError>;
}

#[async_trait]
impl JobReaping for JobStore {
    async fn count_enqueue(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        JobStore::count_enqueue(self, job_id, &next_look.to_rfc3339()).await
    }
    async fn defer_pending_look(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<(), StoreError> {
        JobStore::defer_pending_look(self, job_id, &next_look.to_rfc3339()).await
    }
    async fn redispatch_queued(
        &self,
        job_id: &JobId,
        seen_dispatches: u32,
        execution: &str,
    ) -> Result<JobRecord, StoreError> {
        JobStore::redispatch_queued(self, job_id, seen_dispatches, execution).await
    }
    async fn mark_stalled(
        &self,
        job_id: &JobId,
        lease: &str,
        stalled_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let at = stalled_at.map(Timestamp::to_rfc3339);
        JobStore::mark_stalled(self, job_id, lease, at.as_deref()).await
    }
    async fn progress_records(
        &self,
        job_ids: &[JobId],
    ) -> Result<HashMap<JobId, ProgressRecord>, StoreError> {
        JobStore::progress_records(self, job_ids).await
    }
}
