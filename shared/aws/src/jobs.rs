//! The DynamoDB job table: job records, progress records and idempotency records.
//!
//! | item        | pk / sk                        |
//! |-------------|--------------------------------|
//! | job         | `JOB#<id>` / `JOB`             |
//! | progress    | `JOB#<id>` / `PROGRESS`        |
//! | idempotency | `IDEM#<owner>#<key>` / `IDEM`  |
//!
//! Every status change is one conditional `UpdateItem` (`#status IN (:from…)`, plus the lease
//! for the attempt's own writes), so the table, not the caller, decides races. The hot progress
//! record is kept apart from the large job record because DynamoDB bills writes per KB of the
//! whole item.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::{
    Cancellation, JobError, JobStatus, Transition, TransitionError, now_rfc3339,
};
use serde::{Deserialize, Serialize};

use crate::AwsError;

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
    /// Failures injected so far by the demo job's `fail_times`.
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
            .finish()
    }
}

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
    /// Epoch seconds after which DynamoDB TTL may delete the record.
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

/// A principal's webhook signing secrets (`SECRET#<len>:<owner>` / `WEBHOOK`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SecretsRecord {
    /// Newest first; during a rotation the previous one stays until its `expires_at`.
    pub secrets: Vec<WebhookSecret>,
}

/// One signing secret. Its `Debug` redacts the secret.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// `whsec_…`.
    pub secret: String,
    /// When it was made.
    pub created_at: String,
    /// When a rotated-out secret stops signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSecret")
            .field("secret", &crate::logs::Redacted)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

impl SecretsRecord {
    /// The secrets that sign now.
    pub fn active(&self, now: &str) -> Vec<&WebhookSecret> {
        self.secrets.iter().filter(|s| s.expires_at.as_deref().is_none_or(|at| at > now)).collect()
    }
}

/// One webhook delivery attempt (`JOB#<id>` / `WEBHOOK#<event>#<attempt>`).
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

/// Name of the owner index (`template.yaml`).
pub const OWNER_INDEX: &str = "OwnerIndex";
/// Name of the sparse status index (`template.yaml`): `gsi2pk = <status>#<shard>`,
/// `gsi2sk` = when the entry becomes interesting (created, queued, claimed, result expiry).
/// Only job records in `pending`, `queued`, `running` and `succeeded` are in it, so the
/// reaper and the expirer read only what may need them. A job enters and leaves a bucket in
/// the same conditional write that changes its status, so no crash between two writes can
/// leave a live job outside the index (and the hot progress record, rewritten at every
/// heartbeat, pays for no index writes).
pub const STATUS_INDEX: &str = "StatusIndex";
/// Shards per status, so one busy status never concentrates on one index partition.
pub const STATUS_SHARDS: u32 = 4;

/// The status-index bucket of a job in `status`.
pub fn status_bucket(status: &str, job_id: &str) -> String {
    let shard = job_id.chars().last().and_then(|c| c.to_digit(16)).unwrap_or(0) % STATUS_SHARDS;
    format!("{status}#{shard}")
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

/// Cursor: the index position (`pk`, `sk`, `gsi1sk`) of the last job, base64url JSON. The
/// owner is not in it — it is the caller's — so a cursor cannot reach another tenant's jobs.
fn encode_cursor(key: &Item) -> String {
    use base64::Engine;
    let get = |name: &str| key.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
    let json = serde_json::json!([get("pk"), get("sk"), get("gsi1sk")]).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

fn decode_cursor(owner: &str, cursor: &str) -> Result<Item, ListError> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| ListError::InvalidCursor)?;
    let [pk, sk, gsi1sk]: [String; 3] =
        serde_json::from_slice(&bytes).map_err(|_| ListError::InvalidCursor)?;
    if !pk.starts_with("JOB#") || sk != JOB_SK || gsi1sk.len() > 200 {
        return Err(ListError::InvalidCursor);
    }
    Ok(HashMap::from([
        ("pk".to_owned(), s(pk)),
        ("sk".to_owned(), s(sk)),
        ("gsi1pk".to_owned(), s(owner_index_pk(owner))),
        ("gsi1sk".to_owned(), s(gsi1sk)),
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
        }
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

/// The DynamoDB job table.
#[derive(Debug, Clone)]
pub struct JobStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
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
        JobStore { client, table }
    }

    /// Claims `owner`'s idempotency `key` for the job in `record` (step 1 of creating a job).
    /// `replacing` names the job a reused key pointed at (a failed or cancelled one): the
    /// record is then replaced only if it still points there. When the key is taken, the
    /// error carries the record as it is, read in the same request.
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
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        request = match replacing {
            None => request.condition_expression("attribute_not_exists(pk)"),
            Some(old) => request
                .condition_expression("job_id = :old")
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
        item.insert("gsi2sk".into(), s(&job.created_at));
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

    /// The idempotency record for `owner`'s `key`, if any.
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
        output.item.map(from_item).transpose()
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
        for (i, (name, value)) in request.set.into_iter().enumerate() {
            update.push_str(&format!(", #s{i} = :s{i}"));
            names.insert(format!("#s{i}"), name);
            values.insert(format!(":s{i}"), value);
        }
        // The status index holds only what the reaper and the expirer look for.
        match (request.to, request.index_at) {
            (JobStatus::Queued | JobStatus::Running | JobStatus::Succeeded, at) => {
                update.push_str(", gsi2pk = :bucket, gsi2sk = :index_at");
                values.insert(
                    ":bucket".into(),
                    s(status_bucket(request.to.as_str(), &request.job_id)),
                );
                values.insert(":index_at".into(), s(at.unwrap_or_else(|| now.clone())));
            }
            _ => update.push_str(" REMOVE gsi2pk, gsi2sk"),
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
    ) -> Result<(Vec<JobRecord>, Option<String>), ListError> {
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
                jobs.push(from_item::<JobRecord>(item)?);
            }
            start = page.last_evaluated_key;
            if start.is_none() || jobs.len() >= limit {
                break;
            }
        }
        Ok((jobs, start.map(|key| encode_cursor(&key))))
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
        update.push_str(", gsi2pk = :bucket, gsi2sk = :now ADD #attempt :one");
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
                 stages_total = if_not_exists(stages_total, :zero), items_done = if_not_exists(items_done, :zero) \
                 REMOVE gsi2pk, gsi2sk",
            )
            .condition_expression("attribute_not_exists(#attempt) OR #attempt <= :attempt")
            .expression_attribute_names("#attempt", "attempt")
            .expression_attribute_values(":lease", s(&lease.token))
            .expression_attribute_values(":attempt", AttributeValue::N(lease.attempt.to_string()))
            .expression_attribute_values(":now", s(&now))
            .expression_attribute_values(":zero", zero)
            .expression_attribute_values(":empty", s(""))
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

    /// Up to `limit` entries of status-index bucket `kind` (all shards) whose sort key is
    /// before `before`, oldest first (job records).
    pub async fn due(
        &self,
        kind: &str,
        before: &str,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        let mut out = Vec::new();
        for shard in 0..STATUS_SHARDS {
            let page = self
                .bucket_query(kind, shard, "AND gsi2sk < :before")
                .expression_attribute_values(":before", s(before))
                .limit(limit as i32)
                .send()
                .await
                .map_err(|e| AwsError::new(format!("query the {kind} index"), e))?;
            out.extend(page.items.unwrap_or_default());
        }
        out.sort_by(|a, b| {
            let key =
                |i: &Item| i.get("gsi2sk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
            key(a).cmp(&key(b))
        });
        out.truncate(limit);
        Ok(out)
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
        let key = || [("pk".to_owned(), s(secrets_pk(owner))), ("sk".to_owned(), s("WEBHOOK"))];
        let existing = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key().into_iter().collect()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read webhook secrets", e))?;
        if let Some(item) = existing.item {
            return from_item(item);
        }
        let record = SecretsRecord {
            secrets: vec![WebhookSecret {
                secret: longhaul_domain::webhooks::generate_secret(),
                created_at: now_rfc3339(),
                expires_at: None,
            }],
        };
        let mut item = to_item(&record);
        item.extend(key());
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
    /// (alongside) until `overlap_until`, so receivers can switch without losing messages.
    pub async fn rotate_webhook_secret(
        &self,
        owner: &str,
        overlap_until: &str,
    ) -> Result<SecretsRecord, StoreError> {
        let now = now_rfc3339();
        let current = self.webhook_secrets(owner).await?;
        let mut secrets = vec![WebhookSecret {
            secret: longhaul_domain::webhooks::generate_secret(),
            created_at: now.clone(),
            expires_at: None,
        }];
        for old in current.active(&now) {
            let mut old = old.clone();
            if old.expires_at.is_none() {
                old.expires_at = Some(overlap_until.to_owned());
            }
            secrets.push(old);
        }
        let record = SecretsRecord { secrets };
        let mut item = to_item(&record);
        item.insert("pk".into(), s(secrets_pk(owner)));
        item.insert("sk".into(), s("WEBHOOK"));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| AwsError::new("rotate webhook secret", e))?;
        Ok(record)
    }

    /// Records one delivery attempt.
    pub async fn record_delivery(
        &self,
        job_id: &str,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        let mut item = to_item(delivery);
        item.insert("pk".into(), s(job_pk(job_id)));
        item.insert("sk".into(), s(format!("WEBHOOK#{}#{:04}", delivery.event, delivery.attempt)));
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
            .expression_attribute_values(":pk", s(job_pk(job_id)))
            .expression_attribute_values(":prefix", s("WEBHOOK#"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read deliveries of {job_id}"), e))?;
        output.items.unwrap_or_default().into_iter().map(from_item).collect()
    }

    /// Decodes a job record read from an index.
    pub fn job_from(item: Item) -> Result<JobRecord, StoreError> {
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

    /// Counts one more dispatch of a `pending` job (the reaper re-enqueueing it) and returns
    /// the record; refused if the job moved on meanwhile.
    pub async fn count_enqueue(&self, job_id: &str) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
        let values = HashMap::from([
            (":pending".to_owned(), s(JobStatus::Pending.as_str())),
            (":one".to_owned(), AttributeValue::N("1".into())),
            (":now".to_owned(), s(now_rfc3339())),
        ]);
        self.update_job(
            job_id,
            "SET updated_at = :now, gsi2sk = :now ADD enqueues :one".into(),
            "#status = :pending".into(),
            names,
            values,
        )
        .await
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

    /// Marks an expired job's records for DynamoDB TTL (epoch seconds).
    pub async fn retain_until(&self, job_id: &str, epoch_seconds: i64) -> Result<(), StoreError> {
        for sk in [JOB_SK, PROGRESS_SK] {
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

    /// Counts one injected demo failure, fenced by the lease (so it survives the retry that
    /// follows and a stale attempt cannot count).
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
