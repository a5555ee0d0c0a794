//! The last step of expiring a job: its records marked for the table's TTL.

use async_trait::async_trait;
use longhaul_domain::JobId;

use super::Warm;
use crate::jobs::{JobStore, StoreError};

/// Marking an expired job's records for deletion.
#[async_trait]
pub trait JobRetention: Warm {
    /// Marks the job's progress record, then its job record, for the table's TTL at
    /// `epoch_seconds`, and takes the job out of the status index (its `expired#<shard>`
    /// entry). A record that is not there is skipped: marking a job twice, or one that is
    /// gone, is not an error.
    async fn retain_until(&self, job_id: &JobId, epoch_seconds: i64) -> Result<(), StoreError>;
}

#[async_trait]
impl JobRetention for JobStore {
    async fn retain_until(&self, job_id: &JobId, epoch_seconds: i64) -> Result<(), StoreError> {
        JobStore::retain_until(self, job_id, epoch_seconds).await
    }
}
