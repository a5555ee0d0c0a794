//! The shards of a job's fanned-out stage, as the stage function's shard invocations keep them
//! (see `crate::jobs::shards`).

use async_trait::async_trait;
use longhaul_domain::JobId;

use super::Warm;
use crate::jobs::{
    JobStore, ProgressRefused, ShardKey, ShardProgress, ShardRecord, ShardTaken, ShardUpdate,
    StoreError,
};

/// A distributed stage's shards: taken by one invocation at a time, written only by it, read
/// together by the merge; and their progress added to the job's.
#[async_trait]
pub trait JobShards: Warm {
    /// Takes shard `key` for invocation `run` of attempt `lease.1` holding lease `lease.0`
    /// (continuing the run of `continues` if that still holds it, else as a new run); a shard
    /// that ended is answered as it is, one a later attempt holds is a conflict.
    async fn take_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        lease: (&str, u32),
        run: &str,
        continues: Option<&str>,
    ) -> Result<ShardTaken, StoreError>;
    /// Writes `update` for invocation `run`: [`StoreError::Conflict`] unless `run` holds the
    /// running shard.
    async fn update_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        run: &str,
        update: &ShardUpdate,
    ) -> Result<(), StoreError>;
    /// Every shard of stage `stage_index` ever taken, in index order.
    async fn shards(
        &self,
        job_id: &JobId,
        stage_index: u32,
    ) -> Result<Vec<ShardRecord>, StoreError>;
    /// Adds a shard's write to the job's progress record, fenced by `lease` and refused once
    /// a cancellation or a pause is flagged (or before the stage recorded its shards); answers
    /// the job's percentage after it.
    async fn add_shard_progress(
        &self,
        job_id: &JobId,
        lease: &str,
        add: &ShardProgress,
    ) -> Result<f64, ProgressRefused>;
}

#[async_trait]
impl JobShards for JobStore {
    async fn take_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        lease: (&str, u32),
        run: &str,
        continues: Option<&str>,
    ) -> Result<ShardTaken, StoreError> {
        JobStore::take_shard(self, job_id, key, lease, run, continues).await
    }
    async fn update_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        run: &str,
        update: &ShardUpdate,
    ) -> Result<(), StoreError> {
        JobStore::update_shard(self, job_id, key, run, update).await
    }
    async fn shards(
        &self,
        job_id: &JobId,
        stage_index: u32,
    ) -> Result<Vec<ShardRecord>, StoreError> {
        JobStore::shards(self, job_id, stage_index).await
    }
    async fn add_shard_progress(
        &self,
        job_id: &JobId,
        lease: &str,
        add: &ShardProgress,
    ) -> Result<f64, ProgressRefused> {
        JobStore::add_shard_progress(self, job_id, lease, add).await
    }
}
