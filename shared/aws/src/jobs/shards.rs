//! The shards of a job's fanned-out stage run by a Distributed Map (`SHARDS#<job>` /
//! `<stage>#<index>`): each taken by one invocation at a time (its `run`, which fences every
//! write of it), with its checkpoint pointer, the items it counted into the job's progress,
//! and how it ended. Apart from the job's own partition, so a job's view (one query of its
//! partition) never reads them; the merge reads a stage's shards with one query.
//!
//! A shard's progress reaches the job's progress record by [`JobStore::add_shard_progress`]:
//! arithmetic `SET`s (never a whole-record write), fenced by the attempt's lease and refused
//! once a cancellation or a pause is flagged — how a running shard learns of either.

use super::*;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::Timestamp;
use serde::{Deserialize, Serialize};

use crate::AwsError;

/// Which shard: the 1-based index of its stage and its index in the stage (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    /// 1-based index of the fanned-out stage.
    pub stage_index: u32,
    /// The shard's index (0-based, its place in the manifest).
    pub index: u32,
}

/// How a shard stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardStatus {
    /// Taken by an invocation (which may since have died: the next takes it again).
    Running,
    /// Done: its output is kept for the merge.
    Succeeded,
    /// Failed fatally: the job fails with its error.
    Failed,
}

/// One shard of a fanned-out stage, as its invocations keep it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// 1-based index of its stage.
    pub stage_index: u32,
    /// Its index in the stage.
    pub index: u32,
    /// How it stands.
    pub status: ShardStatus,
    /// The invocation that holds it: only that one's writes land.
    pub run: String,
    /// The job's lease it was taken under…
    pub lease: String,
    /// …and that lease's attempt: an invocation of an earlier attempt never takes it back.
    #[serde(default)]
    pub job_attempt: u32,
    /// Runs started: its first, and each later start that did not continue the run before
    /// it (a crash, a failure, a new attempt of the job).
    #[serde(default)]
    pub attempts: u32,
    /// Its items counted into the job's progress so far.
    #[serde(default)]
    pub reported: u64,
    /// Its current checkpoint object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_key: Option<String>,
    /// Succeeded: its output (JSON text, at most `MAX_SHARD_BYTES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Failed: what its owner is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Last write.
    pub updated_at: Timestamp,
}

/// What taking a shard came to ([`JobStore::take_shard`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ShardTaken {
    /// Taken, as it is now. `continued`: the same run goes on (the invocation that took it
    /// before was of the run this one continues), so no attempt was counted.
    Taken {
        /// The shard as taken.
        record: ShardRecord,
        /// Whether this continues the run before it.
        continued: bool,
    },
    /// It ended already (succeeded or failed): nothing to run.
    Ended(ShardRecord),
}

/// A fenced write of the invocation holding a shard ([`JobStore::update_shard`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ShardUpdate {
    /// Items counted into the job's progress so far, and the new checkpoint, if one.
    Progress {
        /// Items counted so far.
        reported: u64,
        /// The checkpoint now current.
        checkpoint_key: Option<String>,
    },
    /// Done, with its output (JSON text).
    Succeeded {
        /// Items counted so far.
        reported: u64,
        /// The output.
        output: String,
    },
    /// Failed fatally, saying why.
    Failed {
        /// What the job's owner is told.
        error: String,
    },
}

/// What one write of a shard adds to the job's progress record
/// ([`JobStore::add_shard_progress`]): items, percentage points and shard counts (each may be
/// negative but the items and points), and a heartbeat at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ShardProgress {
    /// Items of the stage done since the shard's last write.
    pub items: u64,
    /// Percentage points they are of the job.
    pub pct: f64,
    /// Shards that left `pending`.
    pub started: i64,
    /// Change of `running`.
    pub running: i64,
    /// Shards that succeeded.
    pub succeeded: i64,
    /// Shards that failed.
    pub failed: i64,
    /// Shard runs started.
    pub attempts: i64,
    /// The job's ETA as the shard estimates it (none: left as it is).
    pub eta_seconds: Option<u64>,
}

/// Who takes a shard: the attempt's lease, its number, and the invocation's run.
#[derive(Clone, Copy)]
struct Take<'a> {
    lease: &'a str,
    attempt: u32,
    run: &'a str,
}

/// The partition of a job's shard records.
pub fn shards_pk(job_id: &JobId) -> String {
    format!("SHARDS#{job_id}")
}

fn stage_prefix(stage_index: u32) -> String {
    format!("{stage_index:03}#")
}

fn shard_key(job_id: &JobId, key: ShardKey) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), s(shards_pk(job_id))),
        ("sk".to_owned(), s(format!("{}{:05}", stage_prefix(key.stage_index), key.index))),
    ])
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

impl JobStore {
    /// Takes shard `key` of `job_id` for invocation `run` of attempt `attempt`, holding
    /// `lease`: a shard not taken yet, or running (its last invocation done with or dead) under
    /// this attempt or an earlier one, is taken — continuing the run of `continues` if that
    /// still holds it, else as a new run (counted in `attempts`). A shard that ended is
    /// answered as it is; one a later attempt holds is a [`StoreError::Conflict`].
    pub async fn take_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        (lease, attempt): (&str, u32),
        run: &str,
        continues: Option<&str>,
    ) -> Result<ShardTaken, StoreError> {
        let take = Take { lease, attempt, run };
        if let Some(previous) = continues
            && let Some(record) = self.write_take(job_id, key, &take, Some(previous)).await?
        {
            return Ok(ShardTaken::Taken { record, continued: true });
        }
        match self.write_take(job_id, key, &take, None).await? {
            Some(record) => Ok(ShardTaken::Taken { record, continued: false }),
            None => match self.shard(job_id, key).await? {
                Some(record) if record.status != ShardStatus::Running => {
                    Ok(ShardTaken::Ended(record))
                }
                _ => Err(StoreError::Conflict { current: None }),
            },
        }
    }

    /// One take of [`JobStore::take_shard`]: from run `previous` only (no attempt counted), or
    /// (`None`) from whatever run holds it (one attempt counted); `None` when refused.
    async fn write_take(
        &self,
        job_id: &JobId,
        key: ShardKey,
        take: &Take<'_>,
        previous: Option<&str>,
    ) -> Result<Option<ShardRecord>, StoreError> {
        let Take { lease, attempt, run } = *take;
        let condition = match previous {
            Some(_) => "#status = :running AND #run = :previous",
            None => {
                "attribute_not_exists(pk) OR (#status = :running \
                 AND (attribute_not_exists(job_attempt) OR job_attempt <= :attempt))"
            }
        };
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(job_id, key)))
            .update_expression(
                "SET #run = :run, lease = :lease, job_attempt = :attempt_n, #status = :running, \
                 updated_at = :now, \
                 stage_index = :stage, #index = :index, expires_at = :ttl, \
                 attempts = if_not_exists(attempts, :zero) + :counted, \
                 reported = if_not_exists(reported, :zero)",
            )
            .condition_expression(condition)
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#run", "run")
            .expression_attribute_names("#index", "index")
            .expression_attribute_values(":run", s(run))
            .expression_attribute_values(":lease", s(lease))
            .expression_attribute_values(":attempt_n", n(attempt))
            .expression_attribute_values(":running", s("running"))
            .expression_attribute_values(":now", s(longhaul_domain::now_rfc3339()))
            .expression_attribute_values(":stage", n(key.stage_index))
            .expression_attribute_values(":index", n(key.index))
            .expression_attribute_values(":ttl", self.retention.ttl_from_now())
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":counted", n(u8::from(previous.is_none())))
            .return_values(ReturnValue::AllNew);
        request = match previous {
            Some(previous) => request.expression_attribute_values(":previous", s(previous)),
            None => request.expression_attribute_values(":attempt", n(attempt)),
        };
        match request.send().await {
            Ok(output) => Ok(Some(from_item(output.attributes.unwrap_or_default())?)),
            Err(err) if crate::condition_refused(&err) => Ok(None),
            Err(err) => {
                Err(AwsError::new(format!("take shard {} of {job_id}", key.index), err).into())
            }
        }
    }

    /// Shard `key` of `job_id`, if it was ever taken (strongly consistent).
    pub async fn shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
    ) -> Result<Option<ShardRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(job_id, key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read shard {} of {job_id}", key.index), e))?;
        output.item.map(from_item).transpose()
    }

    /// Writes `update` to shard `key` for invocation `run`: refused
    /// ([`StoreError::Conflict`]) unless `run` holds the running shard.
    pub async fn update_shard(
        &self,
        job_id: &JobId,
        key: ShardKey,
        run: &str,
        update: &ShardUpdate,
    ) -> Result<(), StoreError> {
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(shard_key(job_id, key)))
            .condition_expression("#status = :running AND #run = :run")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#run", "run")
            .expression_attribute_values(":running", s("running"))
            .expression_attribute_values(":run", s(run))
            .expression_attribute_values(":now", s(longhaul_domain::now_rfc3339()));
        request = match update {
            ShardUpdate::Progress { reported, checkpoint_key: Some(checkpoint) } => request
                .update_expression(
                    "SET reported = :reported, checkpoint_key = :checkpoint, updated_at = :now",
                )
                .expression_attribute_values(":reported", n(reported))
                .expression_attribute_values(":checkpoint", s(checkpoint)),
            ShardUpdate::Progress { reported, checkpoint_key: None } => request
                .update_expression("SET reported = :reported, updated_at = :now")
                .expression_attribute_values(":reported", n(reported)),
            ShardUpdate::Succeeded { reported, output } => request
                .update_expression(
                    "SET #status = :ended, reported = :reported, #output = :output, \
                     updated_at = :now",
                )
                .expression_attribute_names("#output", "output")
                .expression_attribute_values(":ended", s("succeeded"))
                .expression_attribute_values(":reported", n(reported))
                .expression_attribute_values(":output", s(output)),
            ShardUpdate::Failed { error } => request
                .update_expression("SET #status = :ended, #error = :error, updated_at = :now")
                .expression_attribute_names("#error", "error")
                .expression_attribute_values(":ended", s("failed"))
                .expression_attribute_values(":error", s(error)),
        };
        match request.send().await {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => {
                Err(StoreError::Conflict { current: None })
            }
            Err(err) => {
                Err(AwsError::new(format!("write shard {} of {job_id}", key.index), err).into())
            }
        }
    }

    /// Every shard of stage `stage_index` of `job_id` ever taken, in index order (one
    /// strongly consistent query, paged).
    pub async fn shards(
        &self,
        job_id: &JobId,
        stage_index: u32,
    ) -> Result<Vec<ShardRecord>, StoreError> {
        let mut records = Vec::new();
        let mut start = None;
        loop {
            let output = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND begins_with(sk, :stage)")
                .expression_attribute_values(":pk", s(shards_pk(job_id)))
                .expression_attribute_values(":stage", s(stage_prefix(stage_index)))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| AwsError::new(format!("read the shards of {job_id}"), e))?;
            for item in output.items.unwrap_or_default() {
                records.push(from_item::<ShardRecord>(item)?);
            }
            match output.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        Ok(records)
    }

    /// Adds `add` to the job's progress record for a shard of the attempt holding `lease`,
    /// with a heartbeat, and moves the record's `shard_seq` on (so a live stream sends it);
    /// answers the job's percentage after it. Refused as [`JobStore::record_progress`] is when
    /// another lease holds the record or a cancellation or pause is flagged.
    pub async fn add_shard_progress(
        &self,
        job_id: &JobId,
        lease: &str,
        add: &ShardProgress,
    ) -> Result<f64, ProgressRefused> {
        let now = longhaul_domain::now_rfc3339();
        let mut set = vec![
            "heartbeat_at = :now",
            "updated_at = :now",
            "shard_seq = if_not_exists(shard_seq, :zero) + :one",
            "items_done = items_done + :items",
            "pct = pct + :pct",
            "#shards.pending = #shards.pending - :started",
            "#shards.running = #shards.running + :running",
            "#shards.succeeded = #shards.succeeded + :succeeded",
            "#shards.failed = #shards.failed + :failed",
            "#shards.attempts = #shards.attempts + :attempts",
        ];
        if add.items > 0 {
            set.push("progress_changed_at = :now");
        }
        if add.eta_seconds.is_some() {
            set.push("eta_seconds = :eta");
        }
        let mut request = self
            .client
            .update_item()
            .set_key(Some(HashMap::from(Self::progress_key(job_id))))
            .table_name(&self.table)
            .update_expression(format!("SET {}", set.join(", ")))
            .condition_expression(
                "lease = :lease AND attribute_exists(#shards) \
                 AND attribute_not_exists(cancel_requested_at) \
                 AND attribute_not_exists(pause_requested_at)",
            )
            .expression_attribute_names("#shards", "shards")
            .expression_attribute_values(":lease", s(lease))
            .expression_attribute_values(":now", s(now))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":items", n(add.items))
            .expression_attribute_values(":pct", n(add.pct))
            .expression_attribute_values(":started", n(add.started))
            .expression_attribute_values(":running", n(add.running))
            .expression_attribute_values(":succeeded", n(add.succeeded))
            .expression_attribute_values(":failed", n(add.failed))
            .expression_attribute_values(":attempts", n(add.attempts))
            .return_values(ReturnValue::UpdatedNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(eta) = add.eta_seconds {
            request = request.expression_attribute_values(":eta", n(eta));
        }
        match request.send().await {
            Ok(output) => Ok(output
                .attributes
                .and_then(|a| a.get("pct").and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok()))
                .unwrap_or(0.0)),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let current =
                        failed.item().cloned().map(from_item::<ProgressRecord>).transpose();
                    Err(match current.ok().flatten() {
                        Some(p) if p.lease == lease && p.cancel_requested_at.is_some() => {
                            ProgressRefused::Cancelled
                        }
                        Some(p) if p.lease == lease && p.pause_requested_at.is_some() => {
                            ProgressRefused::PauseRequested
                        }
                        _ => ProgressRefused::LeaseLost,
                    })
                }
                _ => Err(ProgressRefused::Store(
                    AwsError::new(format!("add a shard's progress to {job_id}"), err).into(),
                )),
            },
        }
    }
}
