//! The progress record: the hot item an attempt writes (fenced by its lease), its checkpoint
//! pointer, and its hand-over between attempts.

use super::*;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::{Timestamp, now_rfc3339};
use serde::{Deserialize, Serialize};

use crate::AwsError;

/// A cancelled attempt's last checkpoint (see [`JobStore::record_final_checkpoint`]).
#[derive(Debug, Clone, Copy)]
pub struct FinalCheckpoint<'a> {
    /// The write's sequence number (above the record's).
    pub seq: u64,
    /// The stage it belongs to…
    pub stage: &'a str,
    /// …and its 1-based index.
    pub stage_index: u32,
    /// The checkpoint object.
    pub checkpoint_key: &'a str,
    /// Items of the stage it covers.
    pub items_done: u64,
}

/// The small, hot progress record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressRecord {
    /// 0 ..= 100.
    pub pct: f64,
    /// The current stage's name.
    pub stage: String,
    /// 1-based index of the current stage.
    pub stage_index: u32,
    /// How many stages the job type has.
    pub stages_total: u32,
    /// Items done in the current stage.
    pub items_done: u64,
    /// Items in the current stage, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_total: Option<u64>,
    /// Estimated seconds to completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// Strictly increasing per job; a write with a lower sequence is refused.
    pub seq: u64,
    /// Last sign of life from the worker.
    pub heartbeat_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// The lease of the attempt that owns this record: empty on a record no attempt has
    /// written yet (one an owner's request, or the reaper's revoke, wrote before the first
    /// claim's attempt made its first progress write), which that attempt may write.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lease: String,
    /// The current stage's latest checkpoint object (moved only under the lease, so a stale
    /// attempt can never make a newer checkpoint unreachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_key: Option<String>,
    /// Set by a cancellation request; progress writes are refused while it is set, which is
    /// how a running stage learns of the cancellation without an extra read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<Timestamp>,
    /// Set by a pause request of the running job; progress writes are refused while it is
    /// set, as for a cancellation, and the stage parks the job `paused` at its checkpoint.
    /// Removed by a resume (and by a claim of a job no pause is asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_requested_at: Option<Timestamp>,
    /// When `pct` or `items_done` last changed (heartbeats alone do not change it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_changed_at: Option<Timestamp>,
    /// The attempt whose lease owns this record (absent while no attempt holds it, e.g. a
    /// record seeded for a retry: any attempt may take it): a hand-over to an earlier attempt
    /// is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The job's owner, written by the stage with every progress write so that the table's
    /// stream tells the notifier whose endpoints a progress change goes to without a read
    /// of the job (absent on records written before it was added; a record seeded for a retry
    /// keeps the retried job's, the same owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// When the current stage started in the current attempt: what the stage's timeout
    /// (its policy's `stage_timeout_seconds`) counts from. Written by the stage function with
    /// every progress write, kept across the invocations that continue the stage (and by the
    /// hand-over to the same attempt's next claim); a clock of another attempt or stage is
    /// stale and the stage starts a new one. Absent on records from before it was kept and on
    /// a record seeded for a retry: the stage counts from its first look at the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_clock: Option<StageClock>,
    /// How the shards of the job's latest fanned-out stage stand, written with every progress
    /// write from that stage on (kept through later stages, so a job past it still shows
    /// them).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "counts_at_least_zero"
    )]
    pub shards: Option<longhaul_domain::progress::ShardCounts>,
    /// Writes of a distributed stage's shards ([`JobStore::add_shard_progress`]), which do
    /// not move `seq` (the attempt's own fence): a live stream's event id is the sum
    /// ([`ProgressRecord::event_seq`]). Carried by every write of the attempt.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard_seq: u64,
}

/// The shard counts as stored: a distributed stage's shards move them with arithmetic
/// updates, two writes apart from their records' own, so an invocation that died between the
/// two can leave one a step off — read as no less than 0, never as an unreadable record.
fn counts_at_least_zero<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<longhaul_domain::progress::ShardCounts>, D::Error> {
    #[derive(Deserialize)]
    struct Stored {
        total: i64,
        pending: i64,
        running: i64,
        succeeded: i64,
        failed: i64,
        attempts: i64,
    }
    let at_least_zero = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Option::<Stored>::deserialize(deserializer)?.map(|s| {
        longhaul_domain::progress::ShardCounts {
            total: at_least_zero(s.total),
            pending: at_least_zero(s.pending),
            running: at_least_zero(s.running),
            succeeded: at_least_zero(s.succeeded),
            failed: at_least_zero(s.failed),
            attempts: at_least_zero(s.attempts),
        }
    }))
}

/// When a stage started in an attempt (see [`ProgressRecord::stage_clock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageClock {
    /// The attempt…
    pub attempt: u32,
    /// …and the 1-based index of the stage it started…
    pub stage_index: u32,
    /// …after how many resumes of the job: a resumed run has the paused attempt's number, and
    /// starts the stage's clock afresh (time paused is not time run). Absent on clocks from
    /// before pauses existed: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// When.
    pub started_at: Timestamp,
}

impl ProgressRecord {
    /// What a live stream numbers this record's event by: every write of the attempt and of
    /// its shards moves it on.
    pub fn event_seq(&self) -> u64 {
        self.seq.saturating_add(self.shard_seq)
    }

    /// The record's numbers as written, for the client-facing progress view (the status and
    /// events functions both read a job's progress through this).
    pub fn recorded(&self) -> longhaul_domain::progress::ProgressView {
        longhaul_domain::progress::ProgressView::recorded(longhaul_domain::progress::Recorded {
            // A distributed stage's shards add their shares of points one write at a time:
            // shown to one decimal, rounded down past the sums' float error, at most 100.
            pct: ((self.pct * 10.0 + 1e-6).floor() / 10.0).clamp(0.0, 100.0),
            stage: &self.stage,
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            items_done: self.items_done,
            items_total: self.items_total,
            eta_seconds: self.eta_seconds,
            shards: self.shards,
        })
    }
}

impl ProgressRecord {
    /// This record as a retry `job_id` starts from ([`JobStore::seed_progress`]): its stage
    /// and checkpoint pointer, under a lease no attempt holds, as of now.
    pub fn seeded_for(&self, job_id: &JobId) -> ProgressRecord {
        let now = Timestamp::now();
        ProgressRecord {
            seq: 0,
            lease: format!("resumed:{job_id}"),
            heartbeat_at: now,
            updated_at: now,
            progress_changed_at: Some(now),
            eta_seconds: None,
            cancel_requested_at: None,
            pause_requested_at: None,
            attempt: None,
            stage_clock: None,
            ..self.clone()
        }
    }
}

/// A job without a progress record yet: nothing done, as of now.
impl Default for ProgressRecord {
    fn default() -> Self {
        let now = Timestamp::now();
        ProgressRecord {
            pct: 0.0,
            stage: String::new(),
            stage_index: 0,
            stages_total: 0,
            items_done: 0,
            items_total: None,
            eta_seconds: None,
            seq: 0,
            heartbeat_at: now,
            updated_at: now,
            lease: String::new(),
            checkpoint_key: None,
            cancel_requested_at: None,
            pause_requested_at: None,
            progress_changed_at: None,
            attempt: None,
            owner: None,
            stage_clock: None,
            shards: None,
            shard_seq: 0,
        }
    }
}

/// Why a progress write was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProgressRefused {
    /// The owner asked to cancel the job.
    #[error("cancellation requested")]
    Cancelled,
    /// The owner asked to pause the job.
    #[error("pause requested")]
    PauseRequested,
    /// Another attempt holds the job.
    #[error("lease lost")]
    LeaseLost,
    /// Our lease, but the record already has sequence `seq` or later (a duplicate worker).
    #[error("progress sequence {seq} already recorded")]
    Stale {
        /// The sequence number on record.
        seq: u64,
    },
    /// DynamoDB failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ProgressRefused {
    /// Why a progress write under `lease` was refused, from the record as the refusal found
    /// it (`None`: there was none, or it could not be read).
    pub fn of(current: Option<&ProgressRecord>, lease: &str) -> Self {
        match current {
            Some(p) if p.lease == lease || p.lease.is_empty() => {
                if p.cancel_requested_at.is_some() {
                    ProgressRefused::Cancelled
                } else if p.pause_requested_at.is_some() {
                    ProgressRefused::PauseRequested
                } else {
                    ProgressRefused::Stale { seq: p.seq }
                }
            }
            _ => ProgressRefused::LeaseLost,
        }
    }
}

/// A new record's counts and stage, set only where missing (a record's first write starts
/// from nothing done; a later one keeps what is there). Values `:zero` and `:empty`.
macro_rules! nothing_done_yet {
    () => {
        "seq = if_not_exists(seq, :zero), pct = if_not_exists(pct, :zero), \
         stage = if_not_exists(stage, :empty), stage_index = if_not_exists(stage_index, :zero), \
         stages_total = if_not_exists(stages_total, :zero), \
         items_done = if_not_exists(items_done, :zero)"
    };
}

/// The fields every progress record has, for a write that may be a record's first before its
/// attempt's own (an owner's request, a revoke, a cancelled attempt's final checkpoint: a
/// job's first claim hands no record over, see [`JobStore::claim_as`]): each set only where
/// it is missing, as the hand-over would set it. Its values are [`JobStore::record_defaults`].
pub(super) const RECORD_DEFAULTS: &str = concat!(
    nothing_done_yet!(),
    ", heartbeat_at = if_not_exists(heartbeat_at, :now), \
    updated_at = if_not_exists(updated_at, :now), \
    expires_at = if_not_exists(expires_at, :ttl)"
);

/// Who may write a progress record under `:lease`: the attempt that holds it, or any attempt
/// while no attempt does (see [`ProgressRecord::lease`]). A record a later claim handed over
/// always has that claim's lease, so a stale attempt never matches.
const HELD_OR_UNCLAIMED: &str = "(attribute_not_exists(lease) OR lease = :lease)";

impl JobStore {
    pub(super) fn progress_key(job_id: &JobId) -> [(String, AttributeValue); 2] {
        [("pk".into(), s(job_pk(job_id))), ("sk".into(), s(PROGRESS_SK))]
    }

    /// The values [`RECORD_DEFAULTS`] names.
    pub(super) fn record_defaults(
        &self,
        update: UpdateItemFluentBuilder,
    ) -> UpdateItemFluentBuilder {
        update
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":empty", s(""))
            .expression_attribute_values(":now", s(now_rfc3339()))
            .expression_attribute_values(":ttl", self.retention.ttl_from_now())
    }

    /// Takes the progress record from `lease` (the record keeps its stage and checkpoint
    /// pointer, under a lease no attempt holds), so that the attempt's progress and checkpoint
    /// writes are refused from now on. The reaper does this *before* re-dispatching a zombie:
    /// otherwise a worker declared dead but alive could go on writing progress while the job
    /// was queued again or claimed by the next attempt (until that claim's hand-over). A
    /// record that `lease` does not hold is left alone; a record no attempt holds yet (or none
    /// at all: a first claim's attempt that never wrote one) is written under the revoked
    /// lease, so that the attempt's first write is refused too.
    pub async fn revoke_progress(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()));
        let revoked = self
            .record_defaults(update)
            .update_expression(format!("SET lease = :revoked, {RECORD_DEFAULTS}"))
            .condition_expression(HELD_OR_UNCLAIMED)
            .expression_attribute_values(":revoked", s(format!("revoked:{lease}")))
            .expression_attribute_values(":lease", s(lease))
            .send()
            .await;
        match revoked {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Ok(()),
            Err(err) => {
                Err(AwsError::new(format!("revoke progress of {job_id} from its lease"), err)
                    .into())
            }
        }
    }

    /// Gives a new job, before it is enqueued, the progress record of the job it retries: its
    /// stage and checkpoint pointer, under a lease no attempt holds. Its first claim hands the
    /// record over keeping them ([`JobStore::claim`]), so the retry resumes from that
    /// checkpoint as a re-dispatched attempt would. Refused (harmlessly) if the new job has a
    /// progress record already.
    pub async fn seed_progress(
        &self,
        job_id: &JobId,
        from: &ProgressRecord,
    ) -> Result<(), StoreError> {
        let seeded = from.seeded_for(job_id);
        let mut item = to_item(&seeded);
        item.extend(Self::progress_key(job_id));
        item.insert("expires_at".into(), self.retention.ttl_from_now());
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Ok(()),
            Err(err) => Err(AwsError::new(format!("seed progress of {job_id}"), err).into()),
        }
    }

    /// Hands the progress record to a new attempt: its lease and a fresh heartbeat, keeping
    /// the stage and checkpoint pointer a previous attempt left (so a re-dispatched job
    /// resumes where it was) and any cancellation request. The write also removes any
    /// status-index keys (`gsi2pk`, `gsi2sk`) from the record: the running index is on the job
    /// record, and a progress record must never be an entry of it.
    ///
    /// Refused (a conflict) if a later attempt already holds the record: a claimer delayed
    /// between its two writes while the reaper re-dispatched the job must not take the
    /// record back from the attempt that claimed it since, or the newer attempt's progress
    /// writes would be refused and the stale claimer's accepted.
    pub(super) async fn take_progress(
        &self,
        job_id: &JobId,
        lease: &Lease,
    ) -> Result<ProgressRecord, StoreError> {
        // A pause flag stays (a resume removes it before the job can be claimed again; a
        // pause that outlived a failed attempt parks the next one at its first write).
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()));
        let taken = self
            .record_defaults(update)
            .update_expression(concat!(
                "SET lease = :lease, #attempt = :attempt, heartbeat_at = :now, updated_at = :now, \
                 progress_changed_at = :now, expires_at = :ttl, ",
                nothing_done_yet!(),
                " REMOVE gsi2pk, gsi2sk"
            ))
            .condition_expression("attribute_not_exists(#attempt) OR #attempt <= :attempt")
            .expression_attribute_names("#attempt", "attempt")
            .expression_attribute_values(":lease", s(&lease.token))
            .expression_attribute_values(":attempt", AttributeValue::N(lease.attempt.to_string()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await;
        match taken {
            Ok(output) => Ok(from_item(output.attributes.unwrap_or_default())?),
            Err(err) if crate::condition_refused(&err) => {
                Err(StoreError::Conflict { current: self.job(job_id).await?.map(Box::new) })
            }
            Err(err) => Err(AwsError::new(
                format!("hand progress of {job_id} to attempt {}", lease.attempt),
                err,
            )
            .into()),
        }
    }

    /// The progress records of `job_ids`, by job id (a job without one is missing): one
    /// `BatchGetItem` per 100 jobs, eventually consistent (a sweep re-reads, consistently,
    /// any job it is about to act on), keys DynamoDB left unprocessed asked again.
    pub async fn progress_records(
        &self,
        job_ids: &[JobId],
    ) -> Result<HashMap<JobId, ProgressRecord>, StoreError> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let mut out = HashMap::with_capacity(job_ids.len());
        for chunk in job_ids.chunks(100) {
            let keys = chunk
                .iter()
                .map(|id| {
                    HashMap::from([
                        ("pk".to_owned(), s(job_pk(id))),
                        ("sk".to_owned(), s(PROGRESS_SK)),
                    ])
                })
                .collect::<Vec<_>>();
            let mut request = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .build()
                    .map_err(|e| AwsError::new("build a progress batch", e))?,
            );
            let mut backoff = Duration::from_millis(20);
            while let Some(keys) = request.take() {
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, keys)
                    .send()
                    .await
                    .map_err(|e| AwsError::new("read a batch of progress records", e))?;
                for item in
                    output.responses.and_then(|mut r| r.remove(&self.table)).unwrap_or_default()
                {
                    let Some(job_id) = item
                        .get("pk")
                        .and_then(|v| v.as_s().ok())
                        .and_then(|pk| pk.strip_prefix("JOB#")?.parse::<JobId>().ok())
                    else {
                        continue;
                    };
                    out.insert(job_id, from_item::<ProgressRecord>(item)?);
                }
                request = output
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(&self.table))
                    .filter(|k| !k.keys.is_empty());
                if request.is_some() {
                    // DynamoDB sheds a batch's keys under load: back off before asking again.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
        Ok(out)
    }

    /// Records progress (a heartbeat, possibly a new checkpoint pointer) for the attempt
    /// holding `progress.lease` — or for any attempt while the record has none (a first
    /// claim's attempt makes the record with its first write). Refused when another attempt
    /// owns the job, when the sequence
    /// number does not advance (so progress never goes backwards), or when a cancellation (or,
    /// unless the write carries the flag itself, a pause) was requested — and the refusal says
    /// which, from the record as it is (same request).
    pub async fn record_progress(
        &self,
        job_id: &JobId,
        progress: &ProgressRecord,
    ) -> Result<(), ProgressRefused> {
        let mut item = to_item(progress);
        item.extend(Self::progress_key(job_id));
        // The record's TTL moves on with every write, so it lapses only once the job stopped
        // writing (it ended, or was taken from this attempt): no extra write, and no progress
        // record outlives its job by more than the retention.
        item.insert("expires_at".into(), self.retention.ttl_from_now());
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            // A write that carries the pause flag itself (a stage crossing a boundary on its
            // way to being parked) is not refused by it.
            .condition_expression(format!(
                "{HELD_OR_UNCLAIMED} AND (attribute_not_exists(seq) OR seq < :seq) \
                 AND attribute_not_exists(cancel_requested_at){}",
                if progress.pause_requested_at.is_some() {
                    ""
                } else {
                    " AND attribute_not_exists(pause_requested_at)"
                }
            ))
            .expression_attribute_values(":lease", s(&progress.lease))
            .expression_attribute_values(":seq", AttributeValue::N(progress.seq.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    let current = failed
                        .item()
                        .cloned()
                        .map(from_item::<ProgressRecord>)
                        .transpose()
                        .ok()
                        .flatten();
                    Err(ProgressRefused::of(current.as_ref(), &progress.lease))
                }
                _ => Err(ProgressRefused::Store(
                    AwsError::new(format!("write progress of {job_id}"), err).into(),
                )),
            },
        }
    }

    /// Makes `checkpoint_key` (covering `items_done` of the current stage) the job's current
    /// checkpoint after its owner asked to cancel it: the one write a cancelled attempt may
    /// still make, so that a retry of the job resumes from where it stopped. Fenced like a
    /// progress write (the lease, a newer `seq`), but it keeps the cancellation flag; and only
    /// while the record is not past the checkpoint's stage (`stage`, 1-based `stage_index`),
    /// so a checkpoint of a stage the job has moved past never becomes the input of the next
    /// one. The record is set to that stage (one cancelled before its first progress write
    /// still shows none), and made if a first claim's attempt had not made it yet.
    pub async fn record_final_checkpoint(
        &self,
        job_id: &JobId,
        lease: &str,
        checkpoint: FinalCheckpoint<'_>,
    ) -> Result<(), ProgressRefused> {
        let FinalCheckpoint { seq, stage, stage_index, checkpoint_key, items_done } = checkpoint;
        let now = now_rfc3339();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression(
                "SET checkpoint_key = :key, seq = :seq, items_done = :done, updated_at = :now, \
                 stage = :name, stage_index = :stage, lease = :lease, \
                 pct = if_not_exists(pct, :zero), stages_total = if_not_exists(stages_total, :zero), \
                 heartbeat_at = if_not_exists(heartbeat_at, :now), expires_at = if_not_exists(expires_at, :ttl)",
            )
            .condition_expression(format!(
                "{HELD_OR_UNCLAIMED} AND (attribute_not_exists(seq) OR seq < :seq) \
                 AND (attribute_not_exists(stage_index) OR stage_index <= :stage)"
            ))
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":ttl", self.retention.ttl_from_now())
            .expression_attribute_values(":name", s(stage))
            .expression_attribute_values(":key", s(checkpoint_key))
            .expression_attribute_values(":seq", AttributeValue::N(seq.to_string()))
            .expression_attribute_values(":done", AttributeValue::N(items_done.to_string()))
            .expression_attribute_values(":now", s(now))
            .expression_attribute_values(":lease", s(lease))
            .expression_attribute_values(":stage", AttributeValue::N(stage_index.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Err(ProgressRefused::LeaseLost),
            Err(err) => Err(ProgressRefused::Store(
                AwsError::new(format!("record the final checkpoint of {job_id}"), err).into(),
            )),
        }
    }
}

fn is_zero<N: Default + PartialEq>(n: &N) -> bool {
    *n == N::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count a dead shard invocation left a step below zero reads as 0, and the points its
    /// shards added up to show to one decimal, never above 100.
    #[test]
    fn shard_counts_and_points_read_within_bounds() {
        let mut stored = serde_json::to_value(ProgressRecord {
            pct: 37.499_999_999,
            ..ProgressRecord::default()
        })
        .unwrap();
        stored["shards"] = serde_json::json!({"total": 4, "pending": 1, "running": -1,
            "succeeded": 3, "failed": 0, "attempts": 5});
        let record: ProgressRecord = serde_json::from_value(stored.clone()).unwrap();
        let shards = record.shards.expect("the counts");
        assert_eq!((shards.running, shards.succeeded, shards.attempts), (0, 3, 5));
        assert_eq!(record.recorded().pct, 37.5);
        stored["pct"] = serde_json::json!(100.000_000_1);
        let over: ProgressRecord = serde_json::from_value(stored).unwrap();
        assert_eq!(over.recorded().pct, 100.0);
    }
}
