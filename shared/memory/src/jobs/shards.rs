//! A distributed stage's shards in memory ([`JobShards`]): taken, written and read as the
//! DynamoDB adapter's conditional updates do, and their progress added to the job's record.

use super::*;

use longhaul_aws::jobs::{
    ProgressRefused, ShardKey, ShardProgress, ShardRecord, ShardStatus, ShardTaken, ShardUpdate,
};
use longhaul_aws::ports::JobShards;

#[async_trait]
impl JobShards for MemoryJobStore {
    async fn take_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        (lease, attempt): (&str, u32),
        run: &str,
        continues: Option<&str>,
    ) -> Result<ShardTaken, StoreError> {
        self.check("take a shard")?;
        let mut table = self.lock();
        let now = Timestamp::now();
        let slot = table.shards.entry((job_id.clone(), key)).or_insert_with(|| ShardRecord {
            stage_index: key.stage_index,
            index: key.index,
            status: ShardStatus::Running,
            run: String::new(),
            lease: String::new(),
            job_attempt: attempt,
            attempts: 0,
            reported: 0,
            checkpoint_key: None,
            output: None,
            error: None,
            updated_at: now,
        });
        if slot.status != ShardStatus::Running {
            return Ok(ShardTaken::Ended(slot.clone()));
        }
        let continued = continues.is_some_and(|previous| slot.run == previous);
        if !continued && slot.job_attempt > attempt {
            return Err(StoreError::Conflict { current: None });
        }
        if !continued {
            slot.attempts += 1;
        }
        slot.run = run.to_owned();
        slot.lease = lease.to_owned();
        slot.job_attempt = attempt;
        slot.updated_at = now;
        Ok(ShardTaken::Taken { record: slot.clone(), continued })
    }

    async fn update_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        run: &str,
        update: &ShardUpdate,
    ) -> Result<(), StoreError> {
        self.check("write a shard")?;
        let mut table = self.lock();
        let Some(shard) = table
            .shards
            .get_mut(&(job_id.clone(), key))
            .filter(|s| s.status == ShardStatus::Running && s.run == run)
        else {
            return Err(StoreError::Conflict { current: None });
        };
        shard.updated_at = Timestamp::now();
        match update {
            ShardUpdate::Progress { reported, checkpoint_key } => {
                shard.reported = *reported;
                if let Some(key) = checkpoint_key {
                    shard.checkpoint_key = Some(key.clone());
                }
            }
            ShardUpdate::Succeeded { reported, output } => {
                shard.status = ShardStatus::Succeeded;
                shard.reported = *reported;
                shard.output = Some(output.clone());
            }
            ShardUpdate::Failed { error } => {
                shard.status = ShardStatus::Failed;
                shard.error = Some(error.clone());
            }
        }
        Ok(())
    }

    async fn shards(
        &self,
        job_id: &JobId,
        stage_index: u32,
    ) -> Result<Vec<ShardRecord>, StoreError> {
        self.check("read the shards")?;
        let table = self.lock();
        let from = (job_id.clone(), ShardKey { stage_index, index: 0 });
        let to = (job_id.clone(), ShardKey { stage_index, index: u32::MAX });
        Ok(table.shards.range(from..=to).map(|(_, shard)| shard.clone()).collect())
    }

    async fn add_shard_progress(
        &self,
        job_id: &JobId,
        lease: &str,
        add: &ShardProgress,
    ) -> Result<f64, ProgressRefused> {
        self.check("add a shard's progress").map_err(ProgressRefused::Store)?;
        let mut table = self.lock();
        let Some(p) = table.progress.get_mut(job_id).filter(|p| p.lease == lease) else {
            return Err(ProgressRefused::LeaseLost);
        };
        if p.cancel_requested_at.is_some() {
            return Err(ProgressRefused::Cancelled);
        }
        if p.pause_requested_at.is_some() {
            return Err(ProgressRefused::PauseRequested);
        }
        let Some(counts) = p.shards.as_mut() else {
            return Err(ProgressRefused::LeaseLost);
        };
        let moved = |count: u64, by: i64| count.saturating_add_signed(by);
        counts.pending = moved(counts.pending, -add.started);
        counts.running = moved(counts.running, add.running);
        counts.succeeded = moved(counts.succeeded, add.succeeded);
        counts.failed = moved(counts.failed, add.failed);
        counts.attempts = moved(counts.attempts, add.attempts);
        let now = Timestamp::now();
        p.items_done = p.items_done.saturating_add(add.items);
        p.pct += add.pct;
        p.heartbeat_at = now;
        p.updated_at = now;
        if add.items > 0 {
            p.progress_changed_at = Some(now);
        }
        if add.eta_seconds.is_some() {
            p.eta_seconds = add.eta_seconds;
        }
        p.shard_seq += 1;
        Ok(p.pct)
    }
}
