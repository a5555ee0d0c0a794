//! The DynamoDB job table: job records, progress records and idempotency records.
//!
//! | item        | pk / sk                        |
//! |-------------|--------------------------------|
//! | job         | `JOB#<id>` / `JOB`             |
//! | progress    | `JOB#<id>` / `PROGRESS`        |
//! | idempotency | `IDEM#<owner>#<key>` / `IDEM`  |
//! | secrets     | `SECRET#<len>:<owner>` / `WEBHOOK` |
//! | delivery    | `DELIVERY#<id>` / `WEBHOOK#<event>#<attempt>` |
//!
//! Every status change is one conditional `UpdateItem` (`#status IN (:from…)`, plus the lease
//! for the attempt's own writes), so the table, not the caller, decides races. The hot progress
//! record is kept apart from the large job record because DynamoDB bills writes per KB of the
//! whole item.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::admission::{Priority, Waiting};
use longhaul_domain::cursor;
use longhaul_domain::policy::JobPolicy;
use longhaul_domain::{
    Cancellation, JobError, JobStatus, Transition, TransitionError, now_rfc3339,
};
use serde::{Deserialize, Serialize};

use crate::AwsError;
use longhaul_domain::webhooks::{ExposeSecret, SecretString};

/// A DynamoDB item as the SDK reads and writes it.
pub type Item = HashMap<String, AttributeValue>;

/// Sort key of a job record.
pub const JOB_SK: &str = "JOB";
/// Sort key of a progress record.
pub const PROGRESS_SK: &str = "PROGRESS";
/// Sort key of an idempotency record.
pub const IDEM_SK: &str = "IDEM";

/// Partition key of everything about one job.
pub fn job_pk(job_id: &str) -> String {
    format!("JOB#{job_id}")
}

/// Partition key of an idempotency record: scoped to the owner, so keys never collide
/// across tenants. The owner is length-prefixed: with a plain separator, owner `a#b` with key
/// `c` and owner `a` with key `b#c` would share a record.
pub fn idempotency_pk(owner: &str, key: &str) -> String {
    format!("IDEM#{}:{owner}#{key}", owner.len())
}

/// Partition key of the owner index (`OwnerIndex`): a principal's jobs, newest first.
pub fn owner_index_pk(owner: &str) -> String {
    format!("OWNER#{owner}")
}

/// The job record. Its `Debug` leaves out what must not reach a log: the params, the
/// callback URL, the idempotency key and the lease token (see [`crate::logs`]).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// UUIDv7.
    pub job_id: String,
    /// The principal (token `sub`) that submitted the job; the only one who can see it.
    pub owner: String,
    /// The job type's name.
    #[serde(rename = "type")]
    pub job_type: String,
    /// The validated parameters, as submitted.
    pub params: serde_json::Value,
    /// Where the job is in its life.
    pub status: JobStatus,
    /// How many times the job was claimed (0 until it first runs).
    pub attempt: u32,
    /// The current attempt's fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The execution that holds the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// The idempotency key (sent or derived) the job was created under.
    pub idempotency_key: String,
    /// SHA-256 of the canonical request, to tell a replay from a conflicting reuse of the key.
    pub fingerprint: String,
    /// Where to deliver the terminal event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// RFC 3339 timestamps.
    pub created_at: String,
    /// Last change of any kind.
    pub updated_at: String,
    /// First claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Entry into a terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why the job failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
    /// The result object's key in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// Every status change, oldest first.
    pub transitions: Vec<Transition>,
    /// Failures injected so far by a diagnostic kind (`StageContext::count_failure`).
    #[serde(default)]
    pub injected_failures: u32,
    /// The failed or cancelled job this one re-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// Who asked to cancel the job, when and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<Cancellation>,
    /// How many times the current attempt continued as a new execution.
    #[serde(default)]
    pub continuations: u32,
    /// How many executions were started for the job (the dispatcher's, then re-dispatches).
    #[serde(default)]
    pub dispatches: u32,
    /// How many times the reaper re-enqueued the job while it was pending.
    #[serde(default)]
    pub enqueues: u32,
    /// When the reaper saw progress stop while heartbeats went on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_at: Option<String>,
    /// A delayed job: not started before this time (RFC 3339, as stored). See
    /// [`longhaul_domain::schedule`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    /// How urgent it is among its tenant's waiting jobs (left off when `normal`).
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
    /// Its policy, as its kind and the deployment said when it was submitted (absent only on
    /// records from before policies were stored: [`JobRecord::policy_or_default`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<JobPolicy>,
    /// Why the job waits for a running slot, and since when; only while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// A retry that starts from the retried job's last checkpoint: where it took over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<ResumedFrom>,
    /// A `queued` job whose last attempt failed retryably: when its next attempt starts
    /// (RFC 3339, as stored; see [`longhaul_domain::retry`]). Removed by the next claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// Why the job's last failed attempt failed (the job goes on: this is not its `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<JobError>,
}

/// Where a retry took over from the job it retries (`POST /jobs/{id}/retry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumedFrom {
    /// The retried job.
    pub job_id: String,
    /// The stage it had reached.
    pub stage: String,
    /// Items of that stage its last checkpoint covers.
    pub items_done: u64,
}

impl JobRecord {
    /// Most jobs of its kind that may run at once, if its policy limits them.
    pub fn concurrency_limit(&self) -> Option<u32> {
        self.policy.as_ref().and_then(|p| p.concurrency_limit)
    }

    /// Its policy; a record from before policies were stored gets the default policy.
    pub fn policy_or_default(&self) -> JobPolicy {
        self.policy.clone().unwrap_or_default()
    }
}

impl std::fmt::Debug for JobRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::logs::Redacted;
        let redacted = |present: bool| present.then_some(Redacted);
        f.debug_struct("JobRecord")
            .field("job_id", &self.job_id)
            .field("owner", &self.owner)
            .field("job_type", &self.job_type)
            .field("params", &Redacted)
            .field("status", &self.status)
            .field("attempt", &self.attempt)
            .field("lease", &redacted(self.lease.is_some()))
            .field("execution", &self.execution)
            .field("idempotency_key", &Redacted)
            .field("fingerprint", &self.fingerprint)
            .field("callback_url", &redacted(self.callback_url.is_some()))
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .field("started_at", &self.started_at)
            .field("finished_at", &self.finished_at)
            .field("error", &self.error)
            .field("result_key", &self.result_key)
            .field("transitions", &self.transitions)
            .field("injected_failures", &self.injected_failures)
            .field("retry_of", &self.retry_of)
            .field("cancellation", &self.cancellation)
            .field("continuations", &self.continuations)
            .field("dispatches", &self.dispatches)
            .field("enqueues", &self.enqueues)
            .field("stalled_at", &self.stalled_at)
            .field("not_before", &self.not_before)
            .finish()
    }
}

/// What the indexes hold of a job record (their projection, `template.yaml`): enough for the
/// reaper to judge and act on a job, for a listing to summarise it, and for logs and metrics
/// to name it — not the params, the transition log or the error, so a burst of large
/// submissions costs the indexes no more than small ones, and the writes that change only
/// those attributes write nothing to the indexes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEntry {
    /// The job id.
    pub job_id: String,
    /// The principal that owns the job.
    pub owner: String,
    /// The job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Current status.
    pub status: JobStatus,
    /// Attempt number (0 until first claimed).
    pub attempt: u32,
    /// Whether a lease is held, and which (see [`JobRecord::lease`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The execution name of the current dispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// When the job was accepted.
    pub created_at: String,
    /// When the record last changed (for a running job: its claim).
    pub updated_at: String,
    /// When the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the reaper flagged its progress stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_at: Option<String>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Dispatches so far.
    #[serde(default)]
    pub dispatches: u32,
    /// Re-enqueues of a pending job so far.
    #[serde(default)]
    pub enqueues: u32,
    /// Its policy (see [`JobRecord::policy`]): what the reaper judges it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<JobPolicy>,
}

impl JobEntry {
    /// Its policy; a record from before policies were stored gets the default policy.
    pub fn policy_or_default(&self) -> JobPolicy {
        self.policy.clone().unwrap_or_default()
    }
}

/// The attributes of a job record both indexes project (`template.yaml` must list the same; a
/// test compares them).
pub const INDEX_ATTRIBUTES: [&str; 15] = [
    "job_id",
    "owner",
    "type",
    "status",
    "attempt",
    "lease",
    "execution",
    "created_at",
    "updated_at",
    "started_at",
    "stalled_at",
    "finished_at",
    "dispatches",
    "enqueues",
    "policy",
];

impl From<&JobRecord> for JobEntry {
    fn from(job: &JobRecord) -> Self {
        JobEntry {
            job_id: job.job_id.clone(),
            owner: job.owner.clone(),
            job_type: job.job_type.clone(),
            status: job.status,
            attempt: job.attempt,
            lease: job.lease.clone(),
            execution: job.execution.clone(),
            created_at: job.created_at.clone(),
            updated_at: job.updated_at.clone(),
            started_at: job.started_at.clone(),
            stalled_at: job.stalled_at.clone(),
            finished_at: job.finished_at.clone(),
            dispatches: job.dispatches,
            enqueues: job.enqueues,
            policy: job.policy.clone(),
        }
    }
}

/// What logs and metrics name a job by, from its whole record or its index entry.
pub trait JobIdentity {
    /// The job id.
    fn job_id(&self) -> &str;
    /// The job type.
    fn job_type(&self) -> &str;
    /// The owning principal.
    fn owner(&self) -> &str;
    /// The attempt number.
    fn attempt(&self) -> u32;
}

macro_rules! job_identity {
    ($($record:ty),*) => {$(
        impl JobIdentity for $record {
            fn job_id(&self) -> &str {
                &self.job_id
            }
            fn job_type(&self) -> &str {
                &self.job_type
            }
            fn owner(&self) -> &str {
                &self.owner
            }
            fn attempt(&self) -> u32 {
                self.attempt
            }
        }
    )*};
}
job_identity!(JobRecord, JobEntry);

/// The small, hot progress record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
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
    pub heartbeat_at: String,
    /// Last change.
    pub updated_at: String,
    /// The lease of the attempt that owns this record.
    pub lease: String,
    /// The current stage's latest checkpoint object (moved only under the lease, so a stale
    /// attempt can never make a newer checkpoint unreachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_key: Option<String>,
    /// Set by a cancellation request; progress writes are refused while it is set, which is
    /// how a running stage learns of the cancellation without an extra read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested_at: Option<String>,
    /// When `pct` or `items_done` last changed (heartbeats alone do not change it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_changed_at: Option<String>,
    /// The attempt whose lease owns this record (absent in records older than the field): a
    /// hand-over to an earlier attempt is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// An idempotency record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The job created under the key.
    pub job_id: String,
    /// The request fingerprint that created it.
    pub fingerprint: String,
    /// When the key was claimed (RFC 3339).
    pub created_at: String,
    /// Epoch seconds at which the record stops naming its job: from then on the key is free
    /// (see [`JobStore::claim_key`]), whether or not DynamoDB TTL has deleted the record yet.
    pub expires_at: i64,
}

/// A job with its progress: what `GET /jobs/{id}` shows, read in one query.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    /// The job record.
    pub job: JobRecord,
    /// Its progress, once a stage has claimed it.
    pub progress: Option<ProgressRecord>,
}

/// A job's lease: what every write of one attempt is fenced by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The attempt number (1 for the first claim).
    pub attempt: u32,
    /// The random fencing token.
    pub token: String,
}

/// Why a store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The job is not in a state that allows the change (or the lease is not ours).
    #[error("job is {}", current.as_ref().map(|j| j.status.as_str()).unwrap_or("missing"))]
    Conflict {
        /// The record as it is now, if it exists.
        current: Option<Box<JobRecord>>,
    },
    /// The idempotency key is already taken; here is its record.
    #[error("idempotency key already used")]
    KeyTaken(Box<IdempotencyRecord>),
    /// The FSM forbids the move; nothing was sent to DynamoDB.
    #[error(transparent)]
    Illegal(#[from] TransitionError),
    /// A record in the table does not match our schema.
    #[error("corrupt record {key}: {reason}")]
    Corrupt {
        /// Which record.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// DynamoDB failed.
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// How many signing secrets a principal has at most: the newest, and during a rotation's
/// overlap the one before it. A rotation while two are active retires the older at once.
pub const MAX_ACTIVE_SECRETS: usize = 2;

/// A principal's webhook signing secrets (`SECRET#<len>:<owner>` / `WEBHOOK`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SecretsRecord {
    /// Bumped by every rotation, which is conditional on the version it read: of two
    /// concurrent rotations one is written and the other refused, so no secret that was
    /// handed out is ever overwritten unseen. Records from before versioning read as 0.
    #[serde(default)]
    pub version: u64,
    /// Newest first; during a rotation the previous one stays until its `expires_at`. At
    /// most [`MAX_ACTIVE_SECRETS`].
    pub secrets: Vec<WebhookSecret>,
}

/// One signing secret. The secret is a [`SecretString`]: its `Debug` prints `[REDACTED]`,
/// and it is exposed only to sign and to hand it to its owner (and to store it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// `whsec_…`.
    #[serde(serialize_with = "expose_secret", deserialize_with = "secret_string")]
    pub secret: SecretString,
    /// When it was made.
    pub created_at: String,
    /// When a rotated-out secret stops signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

fn expose_secret<S: serde::Serializer>(secret: &SecretString, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(secret.expose_secret())
}

fn secret_string<'de, D: serde::Deserializer<'de>>(input: D) -> Result<SecretString, D::Error> {
    String::deserialize(input).map(SecretString::from)
}

impl WebhookSecret {
    /// A fresh secret from the OS random generator, made now.
    pub fn generate(now: &str) -> Result<Self, StoreError> {
        let secret = longhaul_domain::webhooks::generate_secret()
            .map_err(|e| AwsError::new("generate a webhook secret", e))?;
        Ok(WebhookSecret { secret, created_at: now.to_owned(), expires_at: None })
    }
}

impl SecretsRecord {
    /// The secrets that sign now.
    pub fn active(&self, now: &str) -> Vec<&WebhookSecret> {
        self.secrets.iter().filter(|s| s.expires_at.as_deref().is_none_or(|at| at > now)).collect()
    }

    /// The record after rotating in `new` at `now`: `new` signs from now on, the newest
    /// active secret keeps signing until `overlap_until` (or its earlier expiry), and every
    /// other one — expired, or the older of two still in their overlap — is retired, so at
    /// most [`MAX_ACTIVE_SECRETS`] remain.
    pub fn rotated(&self, new: WebhookSecret, now: &str, overlap_until: &str) -> SecretsRecord {
        let mut secrets = vec![new];
        if let Some(previous) = self.active(now).first() {
            let mut previous = (*previous).clone();
            previous.expires_at = Some(match previous.expires_at {
                Some(at) if at.as_str() < overlap_until => at,
                _ => overlap_until.to_owned(),
            });
            secrets.push(previous);
        }
        debug_assert!(secrets.len() <= MAX_ACTIVE_SECRETS);
        SecretsRecord { version: self.version + 1, secrets }
    }
}

/// What a rotation came to.
#[derive(Debug, Clone)]
pub enum Rotation {
    /// Written: the record now holds these secrets (the new one first).
    Rotated(SecretsRecord),
    /// Another rotation was written first, between our read and our write; ours was not
    /// written (its secret was never handed out). The record as the winner left it.
    Lost(SecretsRecord),
}

/// One webhook delivery attempt (`DELIVERY#<job id>` / `WEBHOOK#<event>#<attempt>`): in a
/// partition of its own, not the job's, so the webhook function's role can be granted writes
/// of delivery records only (`dynamodb:LeadingKeys` constrains the partition key, never the
/// sort key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// The `webhook-id`.
    pub webhook_id: String,
    /// The event type (`job.succeeded`, …).
    pub event: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// When it was made.
    pub at: String,
    /// The receiver's status code, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// How long it took.
    pub latency_ms: u64,
    /// What went wrong, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `delivered`, `retrying`, `stopped` (410) or `dead_lettered`.
    pub outcome: String,
}

fn secrets_pk(owner: &str) -> String {
    format!("SECRET#{}:{owner}", owner.len())
}

fn secrets_key(owner: &str) -> Item {
    HashMap::from([("pk".to_owned(), s(secrets_pk(owner))), ("sk".to_owned(), s("WEBHOOK"))])
}

/// The partition of a job's delivery records.
pub fn delivery_pk(job_id: &str) -> String {
    format!("DELIVERY#{job_id}")
}

/// Name of the owner index (`template.yaml`).
pub const OWNER_INDEX: &str = "OwnerIndex";
/// Name of the sparse status index (`template.yaml`): `gsi2pk = <status>#<shard>`,
/// `gsi2sk` = when the entry becomes interesting (created, queued, claimed, result expiry,
/// expired). Only job records in `pending`, `queued`, `running` and `succeeded` are in it,
/// and `expired` ones until the expirer finished with them, so the reaper and the expirer
/// read only what may need them. A job enters and leaves a bucket in
/// the same conditional write that changes its status, so no crash between two writes can
/// leave a live job outside the index (and the hot progress record, rewritten at every
/// heartbeat, pays for no index writes).
pub const STATUS_INDEX: &str = "StatusIndex";
/// The status-index bucket of `pending` jobs that wait for a running slot (their status
/// stays `pending`; see [`JobStore::mark_waiting`]).
pub const WAITING_BUCKET: &str = "waiting";
/// Shards per status, so one busy status never concentrates on one index partition.
pub const STATUS_SHARDS: u32 = 4;

/// The status-index bucket of a job in `status`.
pub fn status_bucket(status: &str, job_id: &str) -> String {
    let shard = job_id.chars().last().and_then(|c| c.to_digit(16)).unwrap_or(0) % STATUS_SHARDS;
    format!("{status}#{shard}")
}

/// One page of a status-index bucket (see [`JobStore::due_page`]).
#[derive(Debug, Default)]
pub struct DuePage {
    /// The page's job records, oldest first.
    pub items: Vec<Item>,
    /// Where the next page starts; `None` once the shard is done.
    pub next: Option<Item>,
}

/// The key of the item that remembers where unfinished sweeps of the status-index buckets
/// stopped (`SWEEP` / `CURSORS`, one attribute per bucket shard).
fn sweep_key() -> Item {
    HashMap::from([("pk".to_owned(), s("SWEEP")), ("sk".to_owned(), s("CURSORS"))])
}

/// The name under which the sweep of bucket `kind`, shard `shard`, keeps its cursor.
pub fn sweep_name(kind: &str, shard: u32) -> String {
    format!("{kind}#{shard}")
}

/// Filters of a job listing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only jobs in this status.
    pub status: Option<JobStatus>,
    /// Only jobs of this type.
    pub job_type: Option<String>,
}

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The cursor is not one we issued to this caller.
    #[error("invalid cursor")]
    InvalidCursor,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a progress write was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProgressRefused {
    /// The owner asked to cancel the job.
    #[error("cancellation requested")]
    Cancelled,
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

/// What a cancellation did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The job was not running yet and is now `cancelled`.
    Cancelled(Box<JobRecord>),
    /// The job is running; its stage will stop at its next progress write.
    Requested(Box<JobRecord>),
}

/// The cursor of the owner-index position `key` (a query's `LastEvaluatedKey`) in `owner`'s
/// listing; see [`longhaul_domain::cursor`] for its format.
fn encode_cursor(owner: &str, key: &Item) -> Result<String, StoreError> {
    let sort_key = key.get("gsi1sk").and_then(|v| v.as_s().ok());
    let position = sort_key.and_then(|k| cursor::ListPosition::from_index_sort_key(k));
    match position {
        Some(position) => Ok(cursor::encode(owner, &position)),
        // Every job record is written by `put_job`, whose sort key always parses.
        None => Err(StoreError::Corrupt {
            key: format!("{:?}", key.get("pk").and_then(|v| v.as_s().ok())),
            reason: format!("owner index sort key {sort_key:?} is not <created_at>#<job id>"),
        }),
    }
}

/// The `ExclusiveStartKey` a cursor stands for. Every part of it is rebuilt from the decoded,
/// validated position, and its partition is always `owner`'s own index: nothing a client
/// sends reaches DynamoDB as a key it did not get from us, nor another tenant's partition.
fn decode_cursor(owner: &str, cursor: &str) -> Result<Item, ListError> {
    let position = cursor::decode(owner, cursor).map_err(|_| ListError::InvalidCursor)?;
    Ok(HashMap::from([
        ("pk".to_owned(), s(job_pk(&position.job_id.to_string()))),
        ("sk".to_owned(), s(JOB_SK)),
        ("gsi1pk".to_owned(), s(owner_index_pk(owner))),
        ("gsi1sk".to_owned(), s(position.index_sort_key())),
    ]))
}

/// A conditional status change.
#[derive(Debug, Clone)]
pub struct TransitionRequest {
    /// The job.
    pub job_id: String,
    /// Statuses the job may be in for the change to apply.
    pub from: Vec<JobStatus>,
    /// The new status.
    pub to: JobStatus,
    /// Why, for the transition log.
    pub reason: String,
    /// When set, the change applies only while this lease holds.
    pub fence: Option<String>,
    /// Further attributes to set in the same write.
    pub set: Vec<(String, AttributeValue)>,
    /// The status index's sort key for the new status (default: now); for `succeeded` it is
    /// when the result expires.
    pub index_at: Option<String>,
    /// When set (a time as stored), the change applies only to a job without a `not_before`
    /// or whose `not_before` is not later: a delayed job is not dispatched early.
    pub due_at: Option<String>,
    /// Attributes removed in the same write.
    pub remove: Vec<String>,
}

impl TransitionRequest {
    /// A change from any of `from` to `to`.
    pub fn new(job_id: &str, from: &[JobStatus], to: JobStatus, reason: impl Into<String>) -> Self {
        TransitionRequest {
            job_id: job_id.to_owned(),
            from: from.to_vec(),
            to,
            reason: reason.into(),
            fence: None,
            set: Vec::new(),
            index_at: None,
            due_at: None,
            remove: Vec::new(),
        }
    }

    /// Also removes attribute `name`.
    pub fn remove(mut self, name: &str) -> Self {
        self.remove.push(name.to_owned());
        self
    }

    /// Applies only if the job's `not_before` (if any) is not later than `now`.
    pub fn due(mut self, now: &str) -> Self {
        self.due_at = Some(now.to_owned());
        self
    }

    /// Indexes the job under `at` in its new status (see [`TransitionRequest::index_at`]).
    pub fn indexed_at(mut self, at: String) -> Self {
        self.index_at = Some(at);
        self
    }

    /// Applies only while `lease` holds the job.
    pub fn fenced(mut self, lease: &str) -> Self {
        self.fence = Some(lease.to_owned());
        self
    }

    /// Also sets `name` to `value`.
    pub fn set(mut self, name: &str, value: AttributeValue) -> Self {
        self.set.push((name.to_owned(), value));
        self
    }
}

/// How long a job's records stay once the job ended (`failed`, `cancelled`, `expired`):
/// `LONGHAUL_RECORD_RETENTION_SECONDS` (default 2,592,000 = 30 days). The records then carry
/// `expires_at` (epoch seconds), the table's TTL attribute, set in the write that ends the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRetention(pub Duration);

impl Default for RecordRetention {
    fn default() -> Self {
        RecordRetention(Duration::from_secs(2_592_000))
    }
}

impl RecordRetention {
    /// Reads `LONGHAUL_RECORD_RETENTION_SECONDS`.
    pub fn from_vars(vars: &crate::config::Vars) -> Result<Self, crate::config::ConfigError> {
        Ok(RecordRetention(Duration::from_secs(
            vars.parsed_or("LONGHAUL_RECORD_RETENTION_SECONDS", Self::default().0.as_secs())?,
        )))
    }

    /// The TTL (epoch seconds) of a record whose retention starts at `from`.
    pub fn expires_at(&self, from: chrono::DateTime<chrono::Utc>) -> i64 {
        from.timestamp().saturating_add(self.0.as_secs().min(i64::MAX as u64) as i64)
    }

    /// [`RecordRetention::expires_at`] from now, as a DynamoDB number.
    fn ttl_from_now(&self) -> AttributeValue {
        AttributeValue::N(self.expires_at(chrono::Utc::now()).to_string())
    }
}

/// The DynamoDB job table.
#[derive(Debug, Clone)]
pub struct JobStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
    retention: RecordRetention,
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn to_item<T: Serialize>(value: &T) -> Item {
    serde_dynamo::to_item(value).expect("records always serialise to DynamoDB items")
}

fn from_item<T: serde::de::DeserializeOwned>(item: Item) -> Result<T, StoreError> {
    let key = format!(
        "{:?}/{:?}",
        item.get("pk").and_then(|v| v.as_s().ok()),
        item.get("sk").and_then(|v| v.as_s().ok())
    );
    serde_dynamo::from_item(item).map_err(|e| StoreError::Corrupt { key, reason: e.to_string() })
}

fn transition_value(state: JobStatus, reason: &str, at: &str) -> AttributeValue {
    serde_dynamo::to_attribute_value(vec![Transition {
        state,
        at: at.to_owned(),
        reason: reason.to_owned(),
    }])
    .expect("transitions always serialise")
}

impl JobStore {
    /// An adapter for `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: String) -> Self {
        JobStore { client, table, retention: RecordRetention::default() }
    }

    /// Keeps ended jobs' records for `retention` (default [`RecordRetention::default`]): a
    /// function that ends jobs or writes progress builds its store with its configured value.
    pub fn retaining(mut self, retention: RecordRetention) -> Self {
        self.retention = retention;
        self
    }

    /// Deletes job `job_id` while it is still `pending` and was never dispatched (a submission
    /// refused after its record was written); a job that moved on is left alone.
    pub async fn delete_unqueued(&self, job_id: &str) -> Result<(), StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(job_pk(job_id)))
            .key("sk", s(JOB_SK))
            .condition_expression("#status = :pending")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":pending", s(JobStatus::Pending.as_str()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(err) => Err(AwsError::new(format!("delete refused job {job_id}"), err).into()),
        }
    }

    /// Gives back `owner`'s idempotency `key` that this request claimed for `job_id` and will
    /// not use (its submission was refused after the claim): deleted only if it still names
    /// that job, so a request that took the key over meanwhile keeps it.
    pub async fn release_key(
        &self,
        owner: &str,
        key: &str,
        job_id: &str,
    ) -> Result<(), StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(idempotency_pk(owner, key)))
            .key("sk", s("IDEM"))
            .condition_expression("job_id = :job")
            .expression_attribute_values(":job", s(job_id))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(err) => Err(AwsError::new("release an idempotency key", err).into()),
        }
    }

    /// Claims `owner`'s idempotency `key` for the job in `record` (step 1 of creating a job).
    /// A record past its `expires_at` counts as absent and is taken over in the same
    /// conditional write: DynamoDB's TTL deletion may lag expiry by days, and the published
    /// window is the record's own expiry, not the deletion. `replacing` names the job a
    /// reused key pointed at (a failed or cancelled one): the record is then replaced only if
    /// it still points there (or has expired meanwhile). When the key is taken, the error
    /// carries the record as it is, read in the same request.
    pub async fn claim_key(
        &self,
        owner: &str,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut item = to_item(record);
        item.insert("pk".into(), s(idempotency_pk(owner, key)));
        item.insert("sk".into(), s(IDEM_SK));
        let now = chrono::Utc::now().timestamp();
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        request = match replacing {
            None => request.condition_expression("attribute_not_exists(pk) OR expires_at < :now"),
            Some(old) => request
                .condition_expression("job_id = :old OR expires_at < :now")
                .expression_attribute_values(":old", s(old)),
        };
        match request.send().await {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item().cloned() {
                        Some(item) => Err(StoreError::KeyTaken(Box::new(from_item(item)?))),
                        // Replacing, and the record vanished (TTL): the caller starts afresh.
                        None => Err(StoreError::Conflict { current: None }),
                    }
                }
                _ => Err(AwsError::new("claim idempotency key", err).into()),
            },
        }
    }

    /// Writes a new job record (step 2 of creating a job), refusing to overwrite one: the id
    /// comes from the idempotency record, so two requests finishing the same creation write
    /// it once.
    pub async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let mut item = to_item(job);
        item.insert("pk".into(), s(job_pk(&job.job_id)));
        item.insert("sk".into(), s(JOB_SK));
        item.insert("gsi1pk".into(), s(owner_index_pk(&job.owner)));
        item.insert("gsi1sk".into(), s(format!("{}#{}", job.created_at, job.job_id)));
        item.insert("gsi2pk".into(), s(status_bucket(JobStatus::Pending.as_str(), &job.job_id)));
        // A delayed job is looked at by the reaper only from when its dispatch is due
        // (`longhaul_domain::schedule::pending_index_at`); any other from its creation.
        let index_at = match job.not_before.as_deref().map(chrono::DateTime::parse_from_rfc3339) {
            Some(Ok(at)) => longhaul_domain::format_rfc3339(
                longhaul_domain::schedule::pending_index_at(at.to_utc(), chrono::Utc::now()),
            ),
            _ => job.created_at.clone(),
        };
        item.insert("gsi2sk".into(), s(index_at));
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
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(StoreError::Conflict { current: None })
            }
            Err(err) => Err(AwsError::new(format!("create job {}", job.job_id), err).into()),
        }
    }

    /// The idempotency record for `owner`'s `key`, if there is one that has not expired (an
    /// expired one names no job any more, though TTL may not have deleted it yet).
    pub async fn idempotency(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(idempotency_pk(owner, key)))
            .key("sk", s(IDEM_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read idempotency record", e))?;
        let record: Option<IdempotencyRecord> = output.item.map(from_item).transpose()?;
        let now = chrono::Utc::now().timestamp();
        Ok(record.filter(|r| r.expires_at >= now))
    }

    /// A job and its progress, in one query (one billed read request).
    pub async fn view(&self, job_id: &str) -> Result<Option<JobView>, StoreError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(job_pk(job_id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read job {job_id}"), e))?;
        let mut job = None;
        let mut progress = None;
        for item in output.items.unwrap_or_default() {
            match item.get("sk").and_then(|v| v.as_s().ok()).map(String::as_str) {
                Some(JOB_SK) => job = Some(from_item::<JobRecord>(item)?),
                Some(PROGRESS_SK) => progress = Some(from_item::<ProgressRecord>(item)?),
                _ => {}
            }
        }
        Ok(job.map(|job| JobView { job, progress }))
    }

    /// The job record alone.
    pub async fn job(&self, job_id: &str) -> Result<Option<JobRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(job_pk(job_id)))
            .key("sk", s(JOB_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read job {job_id}"), e))?;
        output.item.map(from_item).transpose()
    }

    /// Applies a conditional status change and returns the record as it is afterwards. A failed
    /// condition comes back as [`StoreError::Conflict`] with the record as it is now (read in
    /// the same request, never a second round trip).
    pub async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        for from in &request.from {
            from.transition(request.to)?;
        }
        let now = now_rfc3339();
        let mut update = String::from(
            "SET #status = :to, updated_at = :now, transitions = list_append(transitions, :t)",
        );
        let mut names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let mut values = HashMap::from([
            (":to".to_owned(), s(request.to.as_str())),
            (":now".to_owned(), s(&now)),
            (":t".to_owned(), transition_value(request.to, &request.reason, &now)),
        ]);
        if request.to.is_terminal() {
            update.push_str(", finished_at = :now");
        }
        // A job that ends for good gets its TTL in the write that ends it: no follow-up write
        // to lose. (A succeeded job's records get theirs when its result expires.)
        if matches!(request.to, JobStatus::Failed | JobStatus::Cancelled | JobStatus::Expired) {
            update.push_str(", expires_at = :ttl");
            values.insert(":ttl".into(), self.retention.ttl_from_now());
        }
        for (i, (name, value)) in request.set.into_iter().enumerate() {
            update.push_str(&format!(", #s{i} = :s{i}"));
            names.insert(format!("#s{i}"), name);
            values.insert(format!(":s{i}"), value);
        }
        let mut removed: Vec<String> = Vec::new();
        for (i, name) in request.remove.into_iter().enumerate() {
            removed.push(format!("#r{i}"));
            names.insert(format!("#r{i}"), name);
        }
        // The status index holds only what the reaper and the expirer look for. An expired
        // job stays (in `expired#<shard>`) until the expirer has deleted its objects and
        // marked its progress record ([`JobStore::retain_until`] takes it out): a run that
        // dies in between leaves the rest to the next run.
        match (request.to, request.index_at) {
            (
                JobStatus::Queued | JobStatus::Running | JobStatus::Succeeded | JobStatus::Expired,
                at,
            ) => {
                update.push_str(", gsi2pk = :bucket, gsi2sk = :index_at");
                values.insert(
                    ":bucket".into(),
                    s(status_bucket(request.to.as_str(), &request.job_id)),
                );
                values.insert(":index_at".into(), s(at.unwrap_or_else(|| now.clone())));
            }
            _ => removed.extend(["gsi2pk".to_owned(), "gsi2sk".to_owned()]),
        }
        if !removed.is_empty() {
            update.push_str(&format!(" REMOVE {}", removed.join(", ")));
        }
        let from: Vec<String> = request
            .from
            .iter()
            .enumerate()
            .map(|(i, status)| {
                values.insert(format!(":from{i}"), s(status.as_str()));
                format!(":from{i}")
            })
            .collect();
        let mut condition = format!("#status IN ({})", from.join(", "));
        if let Some(lease) = request.fence {
            condition.push_str(" AND #lease = :lease");
            names.insert("#lease".into(), "lease".into());
            values.insert(":lease".into(), s(lease));
        }
        if let Some(now) = request.due_at {
            // Stored timestamps share one format, so they compare as strings.
            condition.push_str(" AND (attribute_not_exists(not_before) OR not_before <= :due)");
            values.insert(":due".into(), s(now));
        }
        self.update_job(&request.job_id, update, condition, names, values).await
    }

    async fn update_job(
        &self,
        job_id: &str,
        update: String,
        condition: String,
        names: HashMap<String, String>,
        values: HashMap<String, AttributeValue>,
    ) -> Result<JobRecord, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(job_pk(job_id)))
            .key("sk", s(JOB_SK))
            .update_expression(update)
            .condition_expression(format!("attribute_exists(pk) AND {condition}"))
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(output) => from_item(output.attributes.unwrap_or_default()),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let current = failed.item().cloned().map(from_item::<JobRecord>).transpose()?;
                    Err(StoreError::Conflict { current: current.map(Box::new) })
                }
                _ => Err(AwsError::new(format!("update job {job_id}"), err).into()),
            },
        }
    }

    /// A page of `owner`'s jobs, newest first, optionally filtered; returns the jobs and the
    /// cursor of the next page. Reads a few index pages if a filter thins them out, so pages
    /// are full whenever more jobs exist.
    pub async fn list(
        &self,
        owner: &str,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Vec<JobEntry>, Option<String>), ListError> {
        let mut start = cursor.map(|c| decode_cursor(owner, c)).transpose()?;
        let mut jobs = Vec::new();
        for _ in 0..5 {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(OWNER_INDEX)
                .key_condition_expression("gsi1pk = :owner")
                .expression_attribute_values(":owner", s(owner_index_pk(owner)))
                .scan_index_forward(false)
                .limit((limit - jobs.len()) as i32)
                .set_exclusive_start_key(start.take());
            let mut filters = Vec::new();
            if let Some(status) = filter.status {
                filters.push("#status = :status");
                query = query
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":status", s(status.as_str()));
            }
            if let Some(job_type) = &filter.job_type {
                filters.push("#type = :type");
                query = query
                    .expression_attribute_names("#type", "type")
                    .expression_attribute_values(":type", s(job_type));
            }
            if !filters.is_empty() {
                query = query.filter_expression(filters.join(" AND "));
            }
            let page =
                query.send().await.map_err(|e| StoreError::from(AwsError::new("list jobs", e)))?;
            for item in page.items.unwrap_or_default() {
                jobs.push(from_item::<JobEntry>(item)?);
            }
            start = page.last_evaluated_key;
            if start.is_none() || jobs.len() >= limit {
                break;
            }
        }
        let next = start.map(|key| encode_cursor(owner, &key)).transpose()?;
        Ok((jobs, next))
    }

    /// Cancels a job for its owner: a `pending` or `queued` job becomes `cancelled` at once;
    /// a `running` job gets a cancellation request that its stage sees at its next progress
    /// write (the flag is set on the progress record too, which that write is conditional on).
    /// Repeating the request for a running job is harmless. A terminal job is a conflict.
    pub async fn cancel(
        &self,
        job_id: &str,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError> {
        let value: AttributeValue =
            serde_dynamo::to_attribute_value(cancellation).expect("cancellations serialise");
        let reason = match &cancellation.reason {
            Some(reason) => format!("cancelled by {}: {reason}", cancellation.requested_by),
            None => format!("cancelled by {}", cancellation.requested_by),
        };
        let request = TransitionRequest::new(
            job_id,
            &[JobStatus::Pending, JobStatus::Queued],
            JobStatus::Cancelled,
            reason,
        )
        .set("cancellation", value.clone());
        let current = match self.transition(request).await {
            Ok(job) => return Ok(CancelOutcome::Cancelled(Box::new(job))),
            Err(StoreError::Conflict { current: Some(job) })
                if job.status == JobStatus::Running =>
            {
                job
            }
            Err(err) => return Err(err),
        };
        if current.cancellation.is_some() {
            return Ok(CancelOutcome::Requested(current));
        }
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":running".to_owned(), s(JobStatus::Running.as_str())),
            (":c".to_owned(), value),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        let job = match self
            .update_job(
                job_id,
                "SET cancellation = :c, updated_at = :now".into(),
                "#status = :running AND attribute_not_exists(cancellation)".into(),
                names,
                values,
            )
            .await
        {
            Ok(job) => job,
            // Another request got there first, or the job just ended: report what is.
            Err(StoreError::Conflict { current: Some(job) })
                if job.status == JobStatus::Running =>
            {
                return Ok(CancelOutcome::Requested(job));
            }
            Err(err) => return Err(err),
        };
        let flagged = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression("SET cancel_requested_at = :now")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":now", s(&cancellation.requested_at))
            .send()
            .await;
        match flagged {
            Ok(_) => {}
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
            Err(err) => {
                return Err(AwsError::new(format!("flag cancellation of {job_id}"), err).into());
            }
        }
        Ok(CancelOutcome::Requested(Box::new(job)))
    }

    /// `queued → running` for `execution`, minting a new lease (the job enters the reaper's
    /// running index in the same write), then hands the progress record to it. Idempotent per
    /// execution: if this execution already holds the job (the claim's response was lost and
    /// the state machine retried it), the existing lease is returned and the hand-over is
    /// done again — the first call may have died between the two writes (fault injection
    /// found exactly that). If nothing retries it, the reaper judges the lease by its claim
    /// time: no hand-over, no heartbeat.
    pub async fn claim(
        &self,
        job_id: &str,
        execution: &str,
    ) -> Result<(Lease, JobRecord), StoreError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let request = TransitionRequest::new(
            job_id,
            &[JobStatus::Queued],
            JobStatus::Running,
            "claimed by a stage",
        )
        .set("lease", s(&token))
        .set("execution", s(execution));
        match self.claim_update(request).await {
            Ok(job) => {
                let lease = Lease { attempt: job.attempt, token };
                self.take_progress(job_id, &lease).await?;
                Ok((lease, job))
            }
            Err(StoreError::Conflict { current: Some(job) })
                if job.status == JobStatus::Running
                    && job.execution.as_deref() == Some(execution) =>
            {
                let lease =
                    Lease { attempt: job.attempt, token: job.lease.clone().unwrap_or_default() };
                self.take_progress(job_id, &lease).await?;
                Ok((lease, *job))
            }
            Err(err) => Err(err),
        }
    }

    async fn claim_update(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        // The claim is a transition that also counts the attempt and stamps the first start.
        let now = now_rfc3339();
        let mut names = HashMap::from([
            ("#status".to_owned(), "status".to_owned()),
            ("#attempt".to_owned(), "attempt".to_owned()),
        ]);
        let mut values = HashMap::from([
            (":to".to_owned(), s(request.to.as_str())),
            (":from".to_owned(), s(JobStatus::Queued.as_str())),
            (":now".to_owned(), s(&now)),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":t".to_owned(), transition_value(request.to, &request.reason, &now)),
        ]);
        let mut update = String::from(
            "SET #status = :to, updated_at = :now, started_at = if_not_exists(started_at, :now), \
             transitions = list_append(transitions, :t)",
        );
        for (i, (name, value)) in request.set.into_iter().enumerate() {
            update.push_str(&format!(", #s{i} = :s{i}"));
            names.insert(format!("#s{i}"), name);
            values.insert(format!(":s{i}"), value);
        }
        // The claimed job enters the running bucket in this same write: if the claim dies
        // before handing the progress record over, the reaper still finds the job.
        // A job back from a backoff no longer waits for its `retry_at`.
        update.push_str(", gsi2pk = :bucket, gsi2sk = :now ADD #attempt :one REMOVE retry_at");
        values.insert(
            ":bucket".to_owned(),
            s(status_bucket(JobStatus::Running.as_str(), &request.job_id)),
        );
        self.update_job(&request.job_id, update, "#status = :from".into(), names, values).await
    }

    fn progress_key(job_id: &str) -> [(String, AttributeValue); 2] {
        [("pk".into(), s(job_pk(job_id))), ("sk".into(), s(PROGRESS_SK))]
    }

    /// Takes the progress record from `lease` (the record keeps its stage and checkpoint
    /// pointer, under a lease no attempt holds), so that the attempt's progress and checkpoint
    /// writes are refused from now on. The reaper does this *before* re-dispatching a zombie:
    /// otherwise a worker declared dead but alive could go on writing progress while the job
    /// was queued again or claimed by the next attempt (until that claim's hand-over), as the
    /// fault checker's paused workers did. A record that `lease` does not hold is left alone.
    pub async fn revoke_progress(&self, job_id: &str, lease: &str) -> Result<(), StoreError> {
        let revoked = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression("SET lease = :revoked, updated_at = :now")
            .condition_expression("lease = :lease")
            .expression_attribute_values(":revoked", s(format!("revoked:{lease}")))
            .expression_attribute_values(":now", s(now_rfc3339()))
            .expression_attribute_values(":lease", s(lease))
            .send()
            .await;
        match revoked {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
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
        job_id: &str,
        from: &ProgressRecord,
    ) -> Result<(), StoreError> {
        let now = now_rfc3339();
        let seeded = ProgressRecord {
            seq: 0,
            lease: format!("resumed:{job_id}"),
            heartbeat_at: now.clone(),
            updated_at: now.clone(),
            progress_changed_at: Some(now),
            eta_seconds: None,
            cancel_requested_at: None,
            attempt: None,
            ..from.clone()
        };
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
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(err) => Err(AwsError::new(format!("seed progress of {job_id}"), err).into()),
        }
    }

    /// Hands the progress record to a new attempt: its lease and a fresh heartbeat, keeping
    /// the stage and checkpoint pointer a previous attempt left (so a re-dispatched job
    /// resumes where it was) and any cancellation request. (Progress records written before
    /// the running index moved to the job record leave the index here.)
    ///
    /// Refused (a conflict) if a later attempt already holds the record: a claimer delayed
    /// between its two writes while the reaper re-dispatched the job must not take the
    /// record back from the attempt that claimed it since (the fault checker's paused
    /// workers did exactly that, and the newer attempt's progress writes were then refused).
    async fn take_progress(&self, job_id: &str, lease: &Lease) -> Result<(), StoreError> {
        let now = now_rfc3339();
        let zero = AttributeValue::N("0".into());
        let taken = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression(
                "SET lease = :lease, #attempt = :attempt, heartbeat_at = :now, updated_at = :now, progress_changed_at = :now, \
                 seq = if_not_exists(seq, :zero), pct = if_not_exists(pct, :zero), \
                 stage = if_not_exists(stage, :empty), stage_index = if_not_exists(stage_index, :zero), \
                 stages_total = if_not_exists(stages_total, :zero), items_done = if_not_exists(items_done, :zero), \
                 expires_at = :ttl REMOVE gsi2pk, gsi2sk",
            )
            .condition_expression("attribute_not_exists(#attempt) OR #attempt <= :attempt")
            .expression_attribute_names("#attempt", "attempt")
            .expression_attribute_values(":lease", s(&lease.token))
            .expression_attribute_values(":attempt", AttributeValue::N(lease.attempt.to_string()))
            .expression_attribute_values(":now", s(&now))
            .expression_attribute_values(":zero", zero)
            .expression_attribute_values(":empty", s(""))
            .expression_attribute_values(":ttl", self.retention.ttl_from_now())
            .send()
            .await;
        match taken {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(StoreError::Conflict { current: self.job(job_id).await?.map(Box::new) })
            }
            Err(err) => Err(AwsError::new(
                format!("hand progress of {job_id} to attempt {}", lease.attempt),
                err,
            )
            .into()),
        }
    }

    /// One page of status-index bucket `kind`, shard `shard`: up to `limit` entries whose sort
    /// key is before `before`, oldest first, starting after `start` (the previous page's
    /// [`DuePage::next`]). Sweeps that must see every entry, whatever their number, page with it.
    pub async fn due_page(
        &self,
        kind: &str,
        shard: u32,
        before: &str,
        limit: usize,
        start: Option<Item>,
    ) -> Result<DuePage, StoreError> {
        let page = self
            .bucket_query(kind, shard, "AND gsi2sk < :before")
            .expression_attribute_values(":before", s(before))
            .limit(limit.clamp(1, i32::MAX as usize) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("query the {kind} index (shard {shard})"), e))?;
        Ok(DuePage { items: page.items.unwrap_or_default(), next: page.last_evaluated_key })
    }

    /// The progress records of `job_ids`, by job id (a job without one is missing): one
    /// `BatchGetItem` per 100 jobs, eventually consistent (a sweep re-reads, consistently,
    /// any job it is about to act on), keys DynamoDB left unprocessed asked again.
    pub async fn progress_records(
        &self,
        job_ids: &[String],
    ) -> Result<HashMap<String, ProgressRecord>, StoreError> {
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
                        .and_then(|pk| pk.strip_prefix("JOB#"))
                        .map(str::to_owned)
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

    /// Where the last unfinished sweeps of the status-index buckets stopped, by
    /// [`sweep_name`] (a bucket's shard missing from it starts from its oldest entry): one
    /// read per run for every sweep. See [`JobStore::save_sweep_cursor`].
    pub async fn sweep_cursors(&self) -> Result<HashMap<String, Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(sweep_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read the sweep cursors", e))?;
        Ok(output
            .item
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, value)| Some((name, value.as_m().ok()?.clone())))
            .collect())
    }

    /// Records where the sweep named `name` ([`sweep_name`]) stopped (`Some`: the next run
    /// starts there) or that it reached the end (`None`: the next run starts from the oldest).
    pub async fn save_sweep_cursor(
        &self,
        name: &str,
        start: Option<Item>,
    ) -> Result<(), StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(sweep_key()))
            .expression_attribute_names("#sweep", name);
        let update = match start {
            Some(start) => update
                .update_expression("SET #sweep = :start")
                .expression_attribute_values(":start", AttributeValue::M(start)),
            None => update.update_expression("REMOVE #sweep"),
        };
        update
            .send()
            .await
            .map_err(|e| AwsError::new(format!("save the {name} sweep cursor"), e))?;
        Ok(())
    }

    /// How many job records status-index bucket `kind` holds (all shards): a `Select=COUNT`
    /// query per shard and page, so only the count crosses the wire (billed by the index data
    /// read, as any query).
    pub async fn count_bucket(&self, kind: &str) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for shard in 0..STATUS_SHARDS {
            let mut start = None;
            loop {
                let page = self
                    .bucket_query(kind, shard, "")
                    .select(aws_sdk_dynamodb::types::Select::Count)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| AwsError::new(format!("count the {kind} index"), e))?;
                total += page.count.max(0) as u64;
                start = page.last_evaluated_key;
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// A Query of status-index bucket `kind`, shard `shard` (`gsi2pk = :bucket`, then
    /// `sort_condition` on `gsi2sk`, whose values the caller adds).
    fn bucket_query(
        &self,
        kind: &str,
        shard: u32,
        sort_condition: &str,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .index_name(STATUS_INDEX)
            .key_condition_expression(
                format!("gsi2pk = :bucket {sort_condition}").trim_end().to_owned(),
            )
            .expression_attribute_values(":bucket", s(format!("{kind}#{shard}")))
    }

    /// `owner`'s webhook secrets, created on first use (a conditional put, so concurrent
    /// first uses agree on one secret).
    pub async fn webhook_secrets(&self, owner: &str) -> Result<SecretsRecord, StoreError> {
        let existing = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(secrets_key(owner)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read webhook secrets", e))?;
        if let Some(item) = existing.item {
            return from_item(item);
        }
        let record =
            SecretsRecord { version: 1, secrets: vec![WebhookSecret::generate(&now_rfc3339())?] };
        let mut item = to_item(&record);
        item.extend(secrets_key(owner));
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(record),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed))
                    if failed.item().is_some() =>
                {
                    from_item(failed.item().cloned().unwrap_or_default())
                }
                _ => Err(AwsError::new("create webhook secret", err).into()),
            },
        }
    }

    /// Rotates `owner`'s secret: a new one signs from now on; the current one keeps signing
    /// (alongside) until `overlap_until`, so receivers can switch without losing messages,
    /// and any older one is retired ([`SecretsRecord::rotated`]: at most two are active).
    ///
    /// The write is conditional on the version read: of two concurrent rotations one is
    /// written and the other comes back [`Rotation::Lost`] with the winner's record, so a
    /// secret handed to a caller is never silently replaced by another caller's.
    pub async fn rotate_webhook_secret(
        &self,
        owner: &str,
        overlap_until: &str,
    ) -> Result<Rotation, StoreError> {
        let current = self.webhook_secrets(owner).await?;
        self.rotate_webhook_secret_from(owner, &current, overlap_until).await
    }

    /// The write of a rotation made from `read`, the record as the caller read it: written
    /// only if the record is still at `read.version` ([`Rotation::Lost`] otherwise). Public so
    /// that a test can replay the stale read of a concurrent rotation.
    pub async fn rotate_webhook_secret_from(
        &self,
        owner: &str,
        read: &SecretsRecord,
        overlap_until: &str,
    ) -> Result<Rotation, StoreError> {
        let now = now_rfc3339();
        let record = read.rotated(WebhookSecret::generate(&now)?, &now, overlap_until);
        let mut item = to_item(&record);
        item.extend(secrets_key(owner));
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            // A record from before versioning has no `version`: it reads as 0.
            .condition_expression(if read.version == 0 {
                "attribute_exists(pk) AND attribute_not_exists(#version)"
            } else {
                "#version = :read"
            })
            .expression_attribute_names("#version", "version")
            .set_expression_attribute_values((read.version > 0).then(|| {
                HashMap::from([(":read".to_owned(), AttributeValue::N(read.version.to_string()))])
            }))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Rotation::Rotated(record)),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item() {
                        Some(item) => Ok(Rotation::Lost(from_item(item.clone())?)),
                        None => Err(StoreError::Corrupt {
                            key: secrets_pk(owner),
                            reason: "the webhook secrets vanished during a rotation".into(),
                        }),
                    }
                }
                _ => Err(AwsError::new("rotate webhook secret", err).into()),
            },
        }
    }

    /// Records one delivery attempt, in the job's delivery partition ([`delivery_pk`]).
    pub async fn record_delivery(
        &self,
        job_id: &str,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        let mut item = to_item(delivery);
        item.insert("pk".into(), s(delivery_pk(job_id)));
        item.insert("sk".into(), s(format!("WEBHOOK#{}#{:04}", delivery.event, delivery.attempt)));
        // Written after the job ended, outside its partition (which the expirer marks for
        // TTL): each attempt carries its own, so the last one lapses a retention after it.
        item.insert("expires_at".into(), self.retention.ttl_from_now());
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("record webhook delivery of {job_id}"), e))?;
        Ok(())
    }

    /// A job's delivery attempts, oldest first.
    pub async fn deliveries(&self, job_id: &str) -> Result<Vec<DeliveryRecord>, StoreError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(delivery_pk(job_id)))
            .expression_attribute_values(":prefix", s("WEBHOOK#"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read deliveries of {job_id}"), e))?;
        output.items.unwrap_or_default().into_iter().map(from_item).collect()
    }

    /// A job's status-index entry, as a sweep's page holds it.
    pub fn entry_from(item: Item) -> Result<JobEntry, StoreError> {
        from_item(item)
    }

    /// Sets (or clears) the job's `stalled_at` while it runs under `lease`. Refused
    /// ([`StoreError::Conflict`]) if it is already set (or already clear), so of two reapers
    /// that saw the same stall only one flags it and counts it.
    pub async fn mark_stalled(
        &self,
        job_id: &str,
        lease: &str,
        stalled_at: Option<&str>,
    ) -> Result<(), StoreError> {
        match stalled_at {
            Some(at) => {
                let values = HashMap::from([(":at".to_owned(), s(at))]);
                self.update_fenced_when(
                    job_id,
                    lease,
                    "SET stalled_at = :at",
                    Some("attribute_not_exists(stalled_at)"),
                    values,
                )
                .await?
            }
            None => {
                self.update_fenced_when(
                    job_id,
                    lease,
                    "REMOVE stalled_at",
                    Some("attribute_exists(stalled_at)"),
                    HashMap::new(),
                )
                .await?
            }
        };
        Ok(())
    }

    /// Counts one more dispatch of a `pending` job (the reaper re-enqueueing it), moves its
    /// status-index entry to `index_key` (when the reaper should look again) and returns the
    /// record; refused if the job moved on meanwhile.
    pub async fn count_enqueue(
        &self,
        job_id: &str,
        index_key: &str,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":now".to_owned(), s(now_rfc3339())),
            (":look".to_owned(), s(index_key)),
        ]);
        self.update_job(
            job_id,
            "SET updated_at = :now, gsi2sk = :look ADD enqueues :one".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
    }

    /// Records that a `pending` job waits for a running slot (`waiting`) and moves its
    /// status-index entry to the `waiting` bucket, where the reaper reconciles the pools of
    /// waiting jobs rather than re-enqueueing them as lost; refused if the job moved on.
    pub async fn mark_waiting(
        &self,
        job_id: &str,
        waiting: &Waiting,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":now".to_owned(), s(now_rfc3339())),
            (
                ":waiting".to_owned(),
                serde_dynamo::to_attribute_value(waiting).expect("a wait always serialises"),
            ),
            (":bucket".to_owned(), s(status_bucket(WAITING_BUCKET, job_id))),
            (":since".to_owned(), s(&waiting.since)),
        ]);
        self.update_job(
            job_id,
            "SET updated_at = :now, waiting = :waiting, gsi2pk = :bucket, gsi2sk = :since".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
    }

    /// Moves a `pending` job's status-index entry to `index_key` (when the reaper should look
    /// at it next: a delayed job's start); refused if the job moved on meanwhile.
    pub async fn defer_pending_look(
        &self,
        job_id: &str,
        index_key: &str,
    ) -> Result<(), StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":look".to_owned(), s(index_key)),
        ]);
        self.update_job(
            job_id,
            "SET gsi2sk = :look".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
        .map(|_| ())
    }

    /// Points a `queued` job whose execution ended without running it at a new execution
    /// (dispatch number `dispatch`, named `execution`); refused if someone else did first.
    pub async fn redispatch_queued(
        &self,
        job_id: &str,
        seen_dispatches: u32,
        execution: &str,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":queued".to_owned(), s(JobStatus::Queued.as_str())),
            (":seen".to_owned(), AttributeValue::N(seen_dispatches.to_string())),
            (":next".to_owned(), AttributeValue::N((seen_dispatches + 1).to_string())),
            (":execution".to_owned(), s(execution)),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_job(
            job_id,
            "SET execution = :execution, dispatches = :next, updated_at = :now, gsi2sk = :now"
                .into(),
            if seen_dispatches == 0 {
                "#status = :queued AND (attribute_not_exists(dispatches) OR dispatches = :seen)"
                    .into()
            } else {
                "#status = :queued AND dispatches = :seen".into()
            },
            names,
            values,
        )
        .await
    }

    /// Marks an expired job's records for DynamoDB TTL (epoch seconds) and takes the job out
    /// of the status index (its `expired#<shard>` entry): the last step of expiring a job, so
    /// the entry stays until everything before it is done. The progress record goes first.
    pub async fn retain_until(&self, job_id: &str, epoch_seconds: i64) -> Result<(), StoreError> {
        for sk in [PROGRESS_SK, JOB_SK] {
            let result = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(job_pk(job_id)))
                .key("sk", s(sk))
                .update_expression("SET expires_at = :ttl REMOVE gsi2pk, gsi2sk")
                .condition_expression("attribute_exists(pk)")
                .expression_attribute_values(":ttl", AttributeValue::N(epoch_seconds.to_string()))
                .send()
                .await;
            match result {
                Ok(_) => {}
                Err(err)
                    if err
                        .as_service_error()
                        .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
                Err(err) => {
                    return Err(AwsError::new(format!("set retention of {job_id}"), err).into());
                }
            }
        }
        Ok(())
    }

    /// Records progress (a heartbeat, possibly a new checkpoint pointer) for the attempt
    /// holding `progress.lease`. Refused when another attempt owns the job, when the sequence
    /// number does not advance (so progress never goes backwards), or when a cancellation was
    /// requested — and the refusal says which, from the record as it is (same request).
    pub async fn record_progress(
        &self,
        job_id: &str,
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
            .condition_expression(
                "lease = :lease AND seq < :seq AND attribute_not_exists(cancel_requested_at)",
            )
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
                    Err(match current {
                        Some(p) if p.lease == progress.lease && p.cancel_requested_at.is_some() => {
                            ProgressRefused::Cancelled
                        }
                        Some(p) if p.lease == progress.lease => {
                            ProgressRefused::Stale { seq: p.seq }
                        }
                        _ => ProgressRefused::LeaseLost,
                    })
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
    /// progress write (the lease, a newer `seq`), but it keeps the cancellation flag.
    pub async fn record_final_checkpoint(
        &self,
        job_id: &str,
        lease: &str,
        seq: u64,
        checkpoint_key: &str,
        items_done: u64,
    ) -> Result<(), ProgressRefused> {
        let now = now_rfc3339();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression(
                "SET checkpoint_key = :key, seq = :seq, items_done = :done, updated_at = :now",
            )
            .condition_expression("lease = :lease AND seq < :seq")
            .expression_attribute_values(":key", s(checkpoint_key))
            .expression_attribute_values(":seq", AttributeValue::N(seq.to_string()))
            .expression_attribute_values(":done", AttributeValue::N(items_done.to_string()))
            .expression_attribute_values(":now", s(now))
            .expression_attribute_values(":lease", s(lease))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(ProgressRefused::LeaseLost)
            }
            Err(err) => Err(ProgressRefused::Store(
                AwsError::new(format!("record the final checkpoint of {job_id}"), err).into(),
            )),
        }
    }

    /// An update of a running job's record, applied only while `lease` holds the job.
    async fn update_fenced(
        &self,
        job_id: &str,
        lease: &str,
        update: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<JobRecord, StoreError> {
        self.update_fenced_when(job_id, lease, update, None, values).await
    }

    /// [`Self::update_fenced`], refused also unless `also` holds.
    async fn update_fenced_when(
        &self,
        job_id: &str,
        lease: &str,
        update: &str,
        also: Option<&str>,
        mut values: HashMap<String, AttributeValue>,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([
            ("#status".to_owned(), "status".to_owned()),
            ("#lease".to_owned(), "lease".to_owned()),
        ]);
        values.insert(":running".into(), s(JobStatus::Running.as_str()));
        values.insert(":lease".into(), s(lease));
        let mut condition = "#status = :running AND #lease = :lease".to_owned();
        if let Some(also) = also {
            condition = format!("{condition} AND {also}");
        }
        self.update_job(job_id, update.into(), condition, names, values).await
    }

    /// Adds one to the counter `attribute` of a running job (fenced by `lease`).
    async fn count_fenced(
        &self,
        job_id: &str,
        lease: &str,
        attribute: &str,
    ) -> Result<JobRecord, StoreError> {
        let values = HashMap::from([
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_fenced(
            job_id,
            lease,
            &format!("SET updated_at = :now ADD {attribute} :one"),
            values,
        )
        .await
    }

    /// Counts one continuation of the job's execution (fenced) and returns the new count,
    /// which names the next execution.
    pub async fn count_continuation(&self, job_id: &str, lease: &str) -> Result<u32, StoreError> {
        Ok(self.count_fenced(job_id, lease, "continuations").await?.continuations)
    }

    /// Records that the attempt holding `lease` goes on in execution `name` (a continuation):
    /// whoever stops the job's execution (the reaper, ending or re-dispatching it) must stop
    /// the one that runs it now, not the one it continued from.
    pub async fn record_execution(
        &self,
        job_id: &str,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError> {
        let values = HashMap::from([
            (":execution".to_owned(), s(name)),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_fenced(job_id, lease, "SET updated_at = :now, execution = :execution", values)
            .await
    }

    /// Counts one injected failure of a diagnostic kind, fenced by the lease (so it survives
    /// the retry that follows and a stale attempt cannot count).
    pub async fn count_injected_failure(
        &self,
        job_id: &str,
        lease: &str,
    ) -> Result<JobRecord, StoreError> {
        self.count_fenced(job_id, lease, "injected_failures").await
    }
}

impl JobStore {
    /// Opens (and pools) a connection to DynamoDB during init — see [`crate::sdk::warm_up`] for
    /// why. Reads the item at [`crate::sdk::WARM_UP_KEY`], which never exists: an eventually
    /// consistent read (half a read unit) that touches no job data.
    pub async fn warm(&self) {
        let started = std::time::Instant::now();
        let key = crate::sdk::WARM_UP_KEY;
        let result = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(key))
            .key("sk", s(key))
            .send()
            .await;
        crate::sdk::log_warm_up("dynamodb", started, result);
    }
}

#[cfg(test)]
mod cursor_tests {
    use super::*;

    fn position_key(owner: &str, job_id: &str) -> Item {
        HashMap::from([
            ("pk".to_owned(), s(job_pk(job_id))),
            ("sk".to_owned(), s(JOB_SK)),
            ("gsi1pk".to_owned(), s(owner_index_pk(owner))),
            ("gsi1sk".to_owned(), s(format!("2026-01-02T03:04:05.678Z#{job_id}"))),
        ])
    }

    #[test]
    fn a_cursor_is_the_start_key_it_was_made_from_in_the_callers_index_only() {
        let id = longhaul_domain::JobId::new().to_string();
        let key = position_key("alice", &id);
        let cursor = encode_cursor("alice", &key).unwrap();
        assert_eq!(decode_cursor("alice", &cursor).unwrap(), key);
        assert!(matches!(decode_cursor("bob", &cursor), Err(ListError::InvalidCursor)));
        // Whatever was in the key, the start key's partition is the caller's.
        let theirs = position_key("bob", &id);
        let cursor = encode_cursor("alice", &theirs).unwrap();
        assert_eq!(decode_cursor("alice", &cursor).unwrap()["gsi1pk"], s("OWNER#alice"));
    }

    #[test]
    fn a_start_key_that_is_not_ours_is_corrupt_not_a_cursor() {
        let mut key = position_key("alice", &longhaul_domain::JobId::new().to_string());
        key.insert("gsi1sk".into(), s("garbage"));
        assert!(matches!(encode_cursor("alice", &key), Err(StoreError::Corrupt { .. })));
    }
}
