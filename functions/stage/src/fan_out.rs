//! A fanned-out stage in an execution: its shards each in their own invocation, under the
//! state machine's `FanOut` map (a Step Functions Distributed Map over a manifest in S3).
//!
//! The `work` op that reaches the stage splits it and writes the manifest
//! (`checkpoints/<job>/<stage>/a<attempt>-shards.json`, one item per shard: its index and
//! descriptor), keeps that in the stage's checkpoint, and answers `fan_out`. The map runs the
//! `shard` op once per item (`crate::shard`), at most the kind's `max_parallel_shards` at a
//! time (capped by the deployment), each shard retried alone. Then `Run` calls `work` again:
//! it reads the shards' records — all succeeded, it merges their outputs; one failed, the job
//! fails with its error; some unfinished (the map gave up on them, or was stopped), the attempt
//! fails retryably and the next one runs only the unfinished shards again. A `work` that did
//! not come from the map (a new execution after a pause, a retry, a direct run's hand-over)
//! answers `fan_out` again with the same manifest: the shards that succeeded are not run
//! again.

use futures::FutureExt;
use futures::future::BoxFuture;
use longhaul_aws::jobs::{JobRecord, ShardRecord, ShardStatus};
use longhaul_domain::progress::ShardCounts;
use longhaul_worker::fan_out::{Collected, ShardHost};
use longhaul_worker::{KindError, PublicMessage, Shard, ShardOutput};

use crate::Deps;
use crate::failure_message::{self, CHECKPOINT_FAILED};
use crate::wire::ManifestItem;

/// The deployment's settings for distributed stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOutSettings {
    /// The bucket the manifests are in (the map's `ItemReader` reads them).
    pub bucket: String,
    /// The most shards of one job's stage running at once, whatever a kind asks
    /// (`MaxParallelShards`).
    pub max_parallel_shards: u32,
}

/// The stage function as a [`ShardHost`]: the manifest in the bucket, the outcomes from the
/// shards' records.
pub(crate) struct MapHost<'a> {
    pub deps: &'a Deps,
    pub job: &'a JobRecord,
    pub stage: &'static str,
    pub stage_index: u32,
    pub attempt: u32,
    /// How the shards stood when last collected (exact, from their records).
    pub counts: Option<ShardCounts>,
}

impl ShardHost for MapHost<'_> {
    fn dispatch<'a>(&'a mut self, shards: &'a [Shard]) -> BoxFuture<'a, Result<String, KindError>> {
        async move {
            let key = format!(
                "{}{}/a{}-shards.json",
                longhaul_aws::objects::checkpoints_prefix(&self.job.job_id),
                self.stage,
                self.attempt
            );
            let items: Vec<ManifestItem> = shards
                .iter()
                .enumerate()
                .map(|(index, shard)| ManifestItem { index: index as u32, shard: shard.clone() })
                .collect();
            let body = serde_json::to_vec(&items).expect("manifests serialise");
            self.deps.objects.put(&key, body, "application/json").await.map_err(|e| {
                KindError::from(crate::StageError::from(failure_message::aws_failure(
                    CHECKPOINT_FAILED,
                    &e,
                )))
            })?;
            tracing::info!(shards = shards.len(), manifest = key, "stage fanned out");
            Ok(key)
        }
        .boxed()
    }

    fn collect(&mut self, shards: usize) -> BoxFuture<'_, Result<Collected, KindError>> {
        async move {
            let records = self
                .deps
                .jobs
                .shards(&self.job.job_id, self.stage_index)
                .await
                .map_err(|e| KindError::from(crate::store_failed(e)))?;
            self.counts = Some(counts(&records, shards));
            if let Some(failed) = records.iter().find(|r| r.status == ShardStatus::Failed) {
                let why = failed.error.as_deref().unwrap_or("it failed");
                return Err(KindError::fatal(PublicMessage::domain(format!(
                    "shard {} of stage `{}` failed: {why}",
                    failed.index, self.stage
                ))));
            }
            let done: Vec<&ShardRecord> =
                records.iter().filter(|r| r.status == ShardStatus::Succeeded).collect();
            if done.len() < shards {
                return Ok(Collected::Unfinished);
            }
            let outputs = done
                .iter()
                .map(|r| {
                    serde_json::from_str::<ShardOutput>(r.output.as_deref().unwrap_or("null"))
                        .map_err(|e| {
                            KindError::fatal(PublicMessage::fixed("a shard's output is unreadable"))
                                .because(e)
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Collected::Done(outputs))
        }
        .boxed()
    }
}

/// How `shards` shards stand by their records (a shard never taken is pending).
fn counts(records: &[ShardRecord], shards: usize) -> ShardCounts {
    let total = shards as u64;
    let of = |status| records.iter().filter(|r| r.status == status).count() as u64;
    let (running, succeeded, failed) =
        (of(ShardStatus::Running), of(ShardStatus::Succeeded), of(ShardStatus::Failed));
    ShardCounts {
        total,
        pending: total.saturating_sub(running + succeeded + failed),
        running,
        succeeded,
        failed,
        attempts: records.iter().map(|r| u64::from(r.attempts)).sum(),
    }
}
