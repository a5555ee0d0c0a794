//! The DynamoDB job table: job records, progress records and idempotency records.
//!
//! | item        | pk / sk                        |
//! |-------------|--------------------------------|
//! | job         | `JOB#<id>` / `JOB`             |
//! | progress    | `JOB#<id>` / `PROGRESS`        |
//! | idempotency | `IDEM#<owner>#<key>` / `IDEM`  |
//! | secrets     | `SECRET#<len>:<owner>` / `WEBHOOK` |
//! | delivery    | `DELIVERY#<id>` / `WEBHOOK#<event>#<attempt>` |
//! | schedule    | `SCHEDULES#<len>:<owner>` / `SCHEDULE#<id>` |
//! | endpoint    | `ENDPOINTS#<len>:<owner>` / `ENDPOINT#<id>` |
//! | endpoint delivery | `EPDELIVERY#<endpoint id>` / `<job id>#<event>` |
//! | progress window | `PROGRESSHOOK#<job id>` / `WINDOW` |
//!
//! Every status change is one conditional `UpdateItem` (`#status IN (:from…)`, plus the lease
//! for the attempt's own writes), so the table, not the caller, decides races. The hot progress
//! record is kept apart from the large job record because DynamoDB bills writes per KB of the
//! whole item.
//!
//! One concern per file: item and index keys, the records and their views,
//! a status change ([`TransitionRequest`]), the job's other moves (claim, cancel, fenced
//! marks and counters), the progress record, idempotency records, the owner's listing, the
//! sweeps' index pages and cursors, webhook secrets and deliveries, webhook endpoints (their
//! delivery records and the progress windows).

mod compensation;
mod endpoints;
mod idempotency;
mod keys;
mod lifecycle;
mod listing;
mod pausing;
mod progress;
mod records;
mod schedules;
mod shards;
mod signals;
mod sweeps;
mod transition;
mod webhooks;

pub use compensation::*;
pub use endpoints::*;
pub use idempotency::*;
pub use keys::*;
pub use lifecycle::*;
pub use listing::*;
pub use pausing::*;
pub use progress::*;
pub use records::*;
pub use schedules::*;
pub use shards::*;
pub use signals::*;
pub use sweeps::*;
pub use transition::*;
pub use webhooks::*;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::{
    JobId, JobStatus, Owner, Timestamp, Transition, TransitionError, now_rfc3339,
};
use serde::Serialize;

use crate::AwsError;

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

fn transition_value(state: JobStatus, reason: &str, at: Timestamp) -> AttributeValue {
    serde_dynamo::to_attribute_value(vec![Transition { state, at, reason: reason.to_owned() }])
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

    /// Writes a new job record (step 2 of creating a job), refusing to overwrite one: the id
    /// comes from the idempotency record, so two requests finishing the same creation write
    /// it once. A new job is `pending`, or `queued` when its slots were taken before its write
    /// (`dispatcher::seated`).
    pub async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let mut item = to_item(job);
        item.insert("pk".into(), s(job_pk(&job.job_id)));
        item.insert("sk".into(), s(JOB_SK));
        item.insert("gsi1pk".into(), s(owner_index_pk(&job.owner)));
        item.insert("gsi1sk".into(), s(format!("{}#{}", job.created_at, job.job_id)));
        // Indexed in its status: `pending`, or `queued` when written already dispatched.
        item.insert("gsi2pk".into(), s(status_bucket(job.status.as_str(), &job.job_id)));
        // A delayed job is looked at by the reaper only from when its dispatch is due
        // (`longhaul_domain::schedule::pending_index_at`); any other from its creation.
        let index_at = match job.not_before {
            Some(at) => longhaul_domain::format_rfc3339(
                longhaul_domain::schedule::pending_index_at(at.as_datetime(), chrono::Utc::now()),
            ),
            None => job.created_at.to_rfc3339(),
        };
        item.insert("gsi2sk".into(), s(index_at));
        // In its owner's backlog until it first runs or ends (`TransitionRequest`, the claim).
        item.insert(BACKLOG_INDEX_PK.into(), s(owner_index_pk(&job.owner)));
        if let Some(scheduled) = &job.scheduled {
            // Listed by its schedule (`GET /jobs?schedule_id=`).
            item.insert(
                SCHEDULE_INDEX_PK.into(),
                s(schedule_index_pk(&job.owner, scheduled.schedule_id.as_str())),
            );
        }
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
            Err(err) if crate::condition_refused(&err) => {
                Err(StoreError::Conflict { current: None })
            }
            Err(err) => Err(AwsError::new(format!("create job {}", job.job_id), err).into()),
        }
    }

    /// A job and its progress, in one query (one billed read request).
    pub async fn view(&self, job_id: &JobId) -> Result<Option<JobView>, StoreError> {
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
    pub async fn job(&self, job_id: &JobId) -> Result<Option<JobRecord>, StoreError> {
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

    async fn update_job(
        &self,
        job_id: &JobId,
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

    /// A job's status-index entry, as a sweep's page holds it.
    pub fn entry_from(item: Item) -> Result<JobEntry, StoreError> {
        from_item(item)
    }

    /// An update of a running job's record, applied only while `lease` holds the job.
    async fn update_fenced(
        &self,
        job_id: &JobId,
        lease: &str,
        update: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<JobRecord, StoreError> {
        self.update_fenced_when(job_id, lease, update, None, values).await
    }

    /// [`Self::update_fenced`], refused also unless `also` holds.
    async fn update_fenced_when(
        &self,
        job_id: &JobId,
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
        job_id: &JobId,
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
}

impl JobStore {
    /// Opens (and pools) a connection to DynamoDB during init — see [`crate::sdk::warm_up`] for
    /// why. Reads the item at [`crate::sdk::WARM_UP_KEY`], which never exists: an eventually
    /// consistent read (half a read unit) that touches no job data.
    pub async fn warm(&self) {
        crate::sdk::warm_table(&self.client, &self.table).await;
    }
}

impl JobStore {
    /// Writes `item`, the record of a fresh id (a UUIDv7): a conditional put that refuses to
    /// overwrite, so an id taken after all is an error naming `what`, never a silent overwrite.
    /// What an owner's capped collections (schedules, endpoints) create their records with.
    async fn put_fresh(&self, item: Item, what: &str) -> Result<(), StoreError> {
        if self.put_if_absent(item, what).await? {
            return Ok(());
        }
        Err(StoreError::Corrupt {
            key: what.to_owned(),
            reason: format!("a fresh id was taken ({what})"),
        })
    }

    /// Writes `item` unless an item with its key exists (a conditional put): whether it did.
    /// `what` names it in an error.
    async fn put_if_absent(&self, item: Item, what: &str) -> Result<bool, StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => Err(AwsError::new(format!("write {what}"), err).into()),
        }
    }

    /// Deletes the item at `key`; whether there was one (`what` names it in errors).
    async fn delete_key(&self, key: Item, what: &str) -> Result<bool, StoreError> {
        let deleted = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("delete {what}"), e))?;
        Ok(deleted.attributes.is_some_and(|a| !a.is_empty()))
    }
}
