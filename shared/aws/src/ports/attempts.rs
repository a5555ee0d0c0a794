//! An attempt's own writes to the job table: its claim (which mints the lease and hands the
//! progress record over), its lease-fenced progress, and the fenced counters and marks a
//! running attempt keeps on its job.

use async_trait::async_trait;
use longhaul_domain::JobId;

use super::Warm;
use crate::jobs::{
    FinalCheckpoint, JobRecord, JobStore, JobView, Lease, ProgressRecord, ProgressRefused,
    StoreError,
};

/// A job's attempts, as the stage runs them. Every write but the claim is fenced by the
/// attempt's lease: a refused fence is [`StoreError::Conflict`] carrying the job as it is
/// (for a progress write, the [`ProgressRefused`] that says why).
#[async_trait]
pub trait JobAttempts: Warm {
    /// `queued → running` for `execution` (only the execution the job was last dispatched
    /// to), minting a new lease, then hands the progress record to it. Idempotent per
    /// execution: the execution that holds the job already gets its lease back (and the
    /// hand-over again). A hand-over to an attempt earlier than the record's is a conflict.
    async fn claim(
        &self,
        job_id: &JobId,
        execution: &str,
    ) -> Result<(Lease, JobRecord), StoreError> {
        let (lease, view) = self.claim_as(job_id, execution, None).await?;
        Ok((lease, view.job))
    }
    /// [`Self::claim`] for a direct run's invocation `claimant` (see [`JobRecord::holds_claim`]):
    /// only the same claimant gets the lease back. Answers the job as the claim left it with
    /// the progress record as the hand-over left it: what a strongly consistent read of both
    /// would answer then, so the claimer need not read them again.
    async fn claim_as(
        &self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<(Lease, JobView), StoreError>;
    /// Writes `progress` as the job's progress record, if its lease (`progress.lease`) holds
    /// the record, its `seq` is above the record's and no cancellation is flagged; else says
    /// which did not hold.
    async fn record_progress(
        &self,
        job_id: &JobId,
        progress: &ProgressRecord,
    ) -> Result<(), ProgressRefused>;
    /// Makes a cancelled attempt's last checkpoint current (the flag stays): fenced by the
    /// lease and a higher `seq`, and only while the record is not past the checkpoint's stage.
    async fn record_final_checkpoint(
        &self,
        job_id: &JobId,
        lease: &str,
        checkpoint: FinalCheckpoint<'_>,
    ) -> Result<(), ProgressRefused>;
    /// Takes the progress record from `lease`, so the attempt's progress writes are refused
    /// from now on; a record `lease` does not hold is left alone.
    async fn revoke_progress(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError>;
    /// Takes back the job's `resumed_from` (fenced); nothing to do if it says no resume.
    async fn forget_resume(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError>;
    /// Counts one more continuation of the job's execution (fenced); the new count.
    async fn count_continuation(&self, job_id: &JobId, lease: &str) -> Result<u32, StoreError>;
    /// Records that the attempt goes on in execution `name` (fenced), ending a direct run's hold
    /// on it: the run's claimant gets no lease back from now on ([`JobRecord::holds_claim`]).
    async fn record_execution(
        &self,
        job_id: &JobId,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError>;
    /// Counts one injected failure of a diagnostic kind (fenced).
    async fn count_injected_failure(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<JobRecord, StoreError>;
}

#[async_trait]
impl JobAttempts for JobStore {
    async fn claim_as(
        &self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<(Lease, JobView), StoreError> {
        JobStore::claim_as(self, job_id, execution, claimant).await
    }
    async fn record_progress(
        &self,
        job_id: &JobId,
        progress: &ProgressRecord,
    ) -> Result<(), ProgressRefused> {
        JobStore::record_progress(self, job_id, progress).await
    }
    async fn record_final_checkpoint(
        &self,
        job_id: &JobId,
        lease: &str,
        checkpoint: FinalCheckpoint<'_>,
    ) -> Result<(), ProgressRefused> {
        JobStore::record_final_checkpoint(self, job_id, lease, checkpoint).await
    }
    async fn revoke_progress(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        JobStore::revoke_progress(self, job_id, lease).await
    }
    async fn forget_resume(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        JobStore::forget_resume(self, job_id, lease).await
    }
    async fn count_continuation(&self, job_id: &JobId, lease: &str) -> Result<u32, StoreError> {
        JobStore::count_continuation(self, job_id, lease).await
    }
    async fn record_execution(
        &self,
        job_id: &JobId,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError> {
        JobStore::record_execution(self, job_id, lease, name).await
    }
    async fn count_injected_failure(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<JobRecord, StoreError> {
        JobStore::count_injected_failure(self, job_id, lease).await
    }
}
