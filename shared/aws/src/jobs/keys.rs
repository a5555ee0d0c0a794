//! Keys of the job table's items and of its three indexes.

use longhaul_domain::{JobId, Owner};
use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

/// A DynamoDB item as the SDK reads and writes it.
pub type Item = HashMap<String, AttributeValue>;

/// Sort key of a job record.
pub const JOB_SK: &str = "JOB";
/// Sort key of a progress record.
pub const PROGRESS_SK: &str = "PROGRESS";
/// Sort key of an idempotency record.
pub const IDEM_SK: &str = "IDEM";

/// Partition key of everything about one job.
pub fn job_pk(job_id: &JobId) -> String {
    format!("JOB#{job_id}")
}

/// Partition key of an idempotency record: scoped to the owner, so keys never collide
/// across tenants. The owner is length-prefixed: with a plain separator, owner `a#b` with key
/// `c` and owner `a` with key `b#c` would share a record.
pub fn idempotency_pk(owner: &Owner, key: &str) -> String {
    format!("IDEM#{}:{owner}#{key}", owner.len())
}

/// Partition key of the owner index (`OwnerIndex`): a principal's jobs, newest first.
pub fn owner_index_pk(owner: &Owner) -> String {
    format!("OWNER#{owner}")
}

/// Name of the backlog index (`template.yaml`): keys only, sparse — a job record is in it,
/// under [`BACKLOG_INDEX_PK`] = its owner's [`owner_index_pk`], from its submission until it
/// first runs or ends. What submit counts a tenant's jobs not yet running by.
pub const BACKLOG_INDEX: &str = "BacklogIndex";
/// The job record's attribute that puts it in the backlog index.
pub const BACKLOG_INDEX_PK: &str = "gsi3pk";

/// Name of the schedule index (`template.yaml`): sparse — only a job a schedule's tick
/// submitted is in it, under [`SCHEDULE_INDEX_PK`] = [`schedule_index_pk`], sorted by the owner
/// index's sort key. What `GET /jobs?schedule_id=` reads.
pub const SCHEDULE_INDEX: &str = "ScheduleIndex";
/// The job record's attribute that puts it in the schedule index.
pub const SCHEDULE_INDEX_PK: &str = "gsi4pk";

/// The schedule index's partition of `owner`'s schedule `schedule_id`: owner-scoped, so a
/// listing by another owner's schedule id reads nothing.
pub fn schedule_index_pk(owner: &Owner, schedule_id: &str) -> String {
    format!("SCHEDULE#{}:{owner}#{schedule_id}", owner.len())
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
pub fn status_bucket(status: &str, job_id: &JobId) -> String {
    let shard = job_id.chars().last().and_then(|c| c.to_digit(16)).unwrap_or(0) % STATUS_SHARDS;
    format!("{status}#{shard}")
}
