//! Per-tenant limits kept in the job table: the rates of submissions and of webhook endpoint
//! attempts, and the open progress streams (the arithmetic is [`longhaul_domain::limits`]).
//!
//! | item | pk / sk |
//! |------|---------|
//! | submissions in one minute | `RATE#<len>:<owner>` / `SUBMIT#<minute>` — `n`, `expires_at` (TTL) |
//! | endpoint attempts in one minute | `WEBHOOKRATE#<len>:<owner>` / `WEBHOOK#<minute>`, `PROGRESS#<minute>` — likewise |
//! | upload bytes declared in one UTC day | `UPLOADQUOTA#<len>:<owner>` / `DAY#<day>` — `bytes`, `expires_at` (TTL) |
//! | a tenant's open streams | `STREAMS#<len>:<owner>` / `TENANT` — `leases` (stream id → expiry), `version` |
//! | a job's open streams | `STREAMS#<len>:<owner>` / `JOB#<id>` — likewise |
//! | the deployment's open streams | `STREAMS#ALL` / `DEPLOYMENT` — likewise |
//!
//! The owner is length-prefixed as in the idempotency and secret keys, so no owner name can
//! reach another's items; the prefixes let IAM grant each function its own item kinds
//! (`dynamodb:LeadingKeys`).

use longhaul_domain::{JobId, Owner};
use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::limits::{LeasesFull, RateWindow, StreamLeases};

use crate::AwsError;

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// Partition key of an owner's submission-rate counters.
pub fn rate_pk(owner: &Owner) -> String {
    format!("RATE#{}:{owner}", owner.len())
}

/// Partition key of an owner's upload-quota counters.
pub fn upload_quota_pk(owner: &Owner) -> String {
    format!("UPLOADQUOTA#{}:{owner}", owner.len())
}

/// Partition key of an owner's open-stream leases.
pub fn streams_pk(owner: &Owner) -> String {
    format!("STREAMS#{}:{owner}", owner.len())
}

/// Partition key of the deployment's open-stream leases (no owner's key can be this: theirs
/// start with the owner's length).
pub const DEPLOYMENT_STREAMS_PK: &str = "STREAMS#ALL";

/// Sort key of the deployment's open-stream leases.
const DEPLOYMENT_STREAMS_SK: &str = "DEPLOYMENT";

/// What the submission limiter decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Counted; go ahead.
    Admitted,
    /// The owner used up this window: retry after this many seconds (the next window).
    Limited {
        /// Seconds to the next window.
        retry_after: u64,
    },
}

/// What a [`TenantRateLimiter`] counts: each has its own counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateCounter {
    /// Job submissions (`RATE#<len>:<owner>` / `SUBMIT#<minute>`).
    Submissions,
    /// Attempts to deliver terminal events and reminders to webhook endpoints
    /// (`WEBHOOKRATE#<len>:<owner>` / `WEBHOOK#<minute>`).
    Deliveries,
    /// Progress events to webhook endpoints, counted apart so that they never use up the
    /// terminal events' share (`WEBHOOKRATE#<len>:<owner>` / `PROGRESS#<minute>`).
    ProgressDeliveries,
}

impl RateCounter {
    /// The partition of `owner`'s counters: webhook counters apart from submission counters,
    /// so the webhook function's grant reaches no submission counter.
    fn partition(self, owner: &Owner) -> String {
        match self {
            RateCounter::Submissions => rate_pk(owner),
            RateCounter::Deliveries | RateCounter::ProgressDeliveries => {
                format!("WEBHOOKRATE#{}:{owner}", owner.len())
            }
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            RateCounter::Submissions => "SUBMIT",
            RateCounter::Deliveries => "WEBHOOK",
            RateCounter::ProgressDeliveries => "PROGRESS",
        }
    }
}

/// A fixed one-minute window of one [`RateCounter`] per tenant: one conditional `UpdateItem`
/// per admitted event (`ADD n :one` if `n < :limit`), and the same one refused — no read.
#[derive(Debug, Clone)]
pub struct TenantRateLimiter {
    client: aws_sdk_dynamodb::Client,
    table: String,
    /// Events a tenant may have per minute; 0 means unlimited (no write at all).
    per_minute: u32,
    counter: RateCounter,
}

impl TenantRateLimiter {
    /// A limiter of `per_minute` submissions per tenant (0: off) on `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: String, per_minute: u32) -> Self {
        TenantRateLimiter { client, table, per_minute, counter: RateCounter::Submissions }
    }

    /// The same limiter counting `counter` instead.
    pub fn counting(self, counter: RateCounter) -> Self {
        TenantRateLimiter { counter, ..self }
    }

    /// Counts one event of `owner` in the current window, unless the window is full.
    pub async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        if self.per_minute == 0 {
            return Ok(Admission::Admitted);
        }
        let window = RateWindow::at(chrono::Utc::now().timestamp());
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(self.counter.partition(owner)))
            .key("sk", s(format!("{}#{}", self.counter.prefix(), window.index)))
            .update_expression("ADD n :one SET expires_at = :exp")
            .condition_expression("attribute_not_exists(n) OR n < :limit")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":exp", n(window.expires_at()))
            .expression_attribute_values(":limit", n(self.per_minute))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Admission::Admitted),
            Err(err) if crate::condition_refused(&err) => {
                Ok(Admission::Limited { retry_after: window.retry_after })
            }
            Err(err) => Err(AwsError::new(format!("count a {:?} event", self.counter), err)),
        }
    }
}

/// A daily quota of upload bytes per tenant: what `POST /uploads` declares (`size_bytes`) is
/// counted in the tenant's UTC day, up to `bytes_per_day` (0: off). An upload is stored for at
/// most a week (the bucket's `uploads/` lifecycle rule), so a tenant's uploads take at most
/// seven days' quota of storage.
#[derive(Debug, Clone)]
pub struct UploadQuota {
    client: aws_sdk_dynamodb::Client,
    table: String,
    bytes_per_day: u64,
}

impl UploadQuota {
    /// A quota of `bytes_per_day` per tenant (0: off) on `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: String, bytes_per_day: u64) -> Self {
        UploadQuota { client, table, bytes_per_day }
    }

    /// Opens (and pools) the table's connection during init ([`crate::sdk::warm_table`]).
    pub async fn warm(&self) {
        crate::sdk::warm_table(&self.client, &self.table).await;
    }

    /// Counts `bytes` of `owner`'s uploads in today's window, unless they do not fit in what
    /// is left of it (nothing is counted then).
    pub async fn charge(&self, owner: &Owner, bytes: u64) -> Result<Admission, AwsError> {
        if self.bytes_per_day == 0 {
            return Ok(Admission::Admitted);
        }
        let window = RateWindow::day_of(chrono::Utc::now().timestamp());
        let Some(room) = self.bytes_per_day.checked_sub(bytes) else {
            return Ok(Admission::Limited { retry_after: window.retry_after });
        };
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(upload_quota_pk(owner)))
            .key("sk", s(format!("DAY#{}", window.index)))
            .update_expression("ADD bytes :bytes SET expires_at = :exp")
            .condition_expression("attribute_not_exists(bytes) OR bytes <= :room")
            .expression_attribute_values(":bytes", n(bytes))
            .expression_attribute_values(":room", n(room))
            .expression_attribute_values(":exp", n(window.expires_at()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Admission::Admitted),
            Err(err) if crate::condition_refused(&err) => {
                Ok(Admission::Limited { retry_after: window.retry_after })
            }
            Err(err) => Err(AwsError::new("count an upload's bytes", err)),
        }
    }
}

/// What one stream holds: its leases on the job's, the tenant's and the deployment's slot
/// items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLease {
    /// The owner (the token's).
    pub owner: Owner,
    /// The job streamed.
    pub job_id: JobId,
    /// This stream's id (random), the key of its lease in both items.
    pub stream_id: String,
}

/// Why a stream got no slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The job, the tenant or the deployment has its cap of streams open.
    #[error("{scope}: {full}")]
    Full {
        /// `job`, `tenant` or `deployment`.
        scope: &'static str,
        /// How full, and when to retry.
        full: LeasesFull,
    },
    /// DynamoDB failed (or kept losing the race for the item).
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// Caps on open progress streams per job, per tenant and per deployment, held as expiring
/// leases. The deployment's cap keeps every open stream within the events function's reserved
/// concurrency (each open stream is one running invocation): a few principals at their tenant
/// cap cannot take the whole reservation and leave everyone else's streams throttled.
///
/// Each slot item holds a map of stream id → lease expiry and a `version`. Acquiring reads
/// the item, drops expired leases, refuses if the cap is reached, and otherwise writes the map
/// back with the new lease, conditional on the version it read (optimistic concurrency: two
/// streams racing for the last slot cannot both get it). Releasing removes the stream's lease
/// and bumps the version. A stream whose invocation crashed never releases: its lease stops
/// counting once it expires (a little after the longest a stream can last).
#[derive(Debug, Clone)]
pub struct StreamSlots {
    client: aws_sdk_dynamodb::Client,
    table: String,
    /// Streams one job may have open (0: no cap).
    pub per_job: usize,
    /// Streams one tenant may have open (0: no cap).
    pub per_tenant: usize,
    /// Streams the whole deployment may have open (0: no cap).
    pub per_deployment: usize,
}

/// How often an acquire retries after losing the race for the same item.
const ACQUIRE_ATTEMPTS: usize = 8;

impl StreamSlots {
    /// Caps of `per_job`, `per_tenant` and `per_deployment` open streams (0: that cap is off).
    pub fn new(
        client: aws_sdk_dynamodb::Client,
        table: String,
        per_job: usize,
        per_tenant: usize,
        per_deployment: usize,
    ) -> Self {
        StreamSlots { client, table, per_job, per_tenant, per_deployment }
    }

    /// The slot items a stream of `lease` takes, with their caps: the job's, the tenant's,
    /// the deployment's (those whose cap is on), in the order they are taken.
    fn items(&self, lease: &StreamLease) -> Vec<(SlotItem, usize)> {
        let owner = streams_pk(&lease.owner);
        [
            (SlotItem::new("job", &owner, &format!("JOB#{}", lease.job_id)), self.per_job),
            (SlotItem::new("tenant", &owner, "TENANT"), self.per_tenant),
            (
                SlotItem::new("deployment", DEPLOYMENT_STREAMS_PK, DEPLOYMENT_STREAMS_SK),
                self.per_deployment,
            ),
        ]
        .into_iter()
        .filter(|(_, cap)| *cap > 0)
        .collect()
    }

    /// Takes a slot of the job, of the tenant and of the deployment for a stream whose lease
    /// expires at `expiry` (Unix seconds), or says which cap is reached (nothing is held then).
    pub async fn acquire(
        &self,
        owner: &Owner,
        job_id: &JobId,
        expiry: i64,
    ) -> Result<StreamLease, SlotError> {
        let lease = StreamLease {
            owner: owner.to_owned(),
            job_id: job_id.to_owned(),
            stream_id: uuid::Uuid::new_v4().simple().to_string(),
        };
        let items = self.items(&lease);
        for (taken, (item, cap)) in items.iter().enumerate() {
            if let Err(err) = self.take(item, &lease.stream_id, expiry, *cap).await {
                // Give back what was taken; a slot that fails to go back expires on its own.
                for (held, _) in &items[..taken] {
                    if let Err(undo) = self.give(held, &lease.stream_id).await {
                        tracing::warn!(error = %undo, scope = held.scope, "releasing a stream slot failed; its lease will expire");
                    }
                }
                return Err(err.scoped(item.scope));
            }
        }
        Ok(lease)
    }

    /// Gives back every slot of `lease`.
    pub async fn release(&self, lease: &StreamLease) -> Result<(), AwsError> {
        let items = self.items(lease);
        let given = futures::future::join_all(
            items.iter().map(|(item, _)| self.give(item, &lease.stream_id)),
        )
        .await;
        given.into_iter().collect()
    }

    /// Adds a lease to one slot item (see the type's docs).
    async fn take(
        &self,
        item: &SlotItem,
        stream_id: &str,
        expiry: i64,
        cap: usize,
    ) -> Result<(), TakeError> {
        let (pk, sk) = (&item.pk, &item.sk);
        for attempt in 0..ACQUIRE_ATTEMPTS {
            if attempt > 0 {
                // Streams opened at the same moment race for the same item: back off a little
                // more each time, staggered by the stream's own id, so they stop colliding.
                let stagger =
                    stream_id.bytes().fold(0u64, |h, b| h.wrapping_mul(31) + u64::from(b));
                let millis = (5u64 << attempt.min(5)) + stagger % 10;
                tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
            }
            let item = self
                .client
                .get_item()
                .table_name(&self.table)
                .key("pk", s(pk.as_str()))
                .key("sk", s(sk.as_str()))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| AwsError::new("read stream slots", e))?
                .item;
            let version = item.as_ref().and_then(|i| i.get("version")).cloned();
            let mut leases = item.as_ref().map(read_leases).unwrap_or_default();
            let now = chrono::Utc::now().timestamp();
            leases.admit(stream_id, expiry, now, cap).map_err(TakeError::Full)?;
            let map: HashMap<String, AttributeValue> =
                leases.0.iter().map(|(id, at)| (id.clone(), n(at))).collect();
            let next_version = version
                .as_ref()
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            let mut put = self
                .client
                .put_item()
                .table_name(&self.table)
                .item("pk", s(pk.as_str()))
                .item("sk", s(sk.as_str()))
                .item("leases", AttributeValue::M(map))
                .item("version", n(next_version))
                // TTL: the item goes once its last lease has long expired.
                .item("expires_at", n(leases.latest().unwrap_or(expiry) + 3_600));
            put = match version {
                Some(v) => {
                    put.condition_expression("version = :v").expression_attribute_values(":v", v)
                }
                None => put.condition_expression("attribute_not_exists(pk)"),
            };
            match put.send().await {
                Ok(_) => return Ok(()),
                Err(err) if crate::condition_refused(&err) => {
                    continue; // another stream changed the item: read it again
                }
                Err(err) => return Err(AwsError::new("take a stream slot", err).into()),
            }
        }
        Err(AwsError {
            context: "take a stream slot".into(),
            detail: format!("lost the race for {sk} {ACQUIRE_ATTEMPTS} times"),
            refusal: None,
        }
        .into())
    }

    /// Removes a lease from one slot item (and bumps its version, so an acquire that read the
    /// lease cannot write it back). Nothing to do if the item is gone.
    async fn give(&self, item: &SlotItem, stream_id: &str) -> Result<(), AwsError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&item.pk))
            .key("sk", s(&item.sk))
            .update_expression("REMOVE leases.#id ADD version :one")
            .condition_expression("attribute_exists(leases)")
            .expression_attribute_names("#id", stream_id)
            .expression_attribute_values(":one", n(1))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Ok(()),
            Err(err) => Err(AwsError::new("release a stream slot", err)),
        }
    }
}

/// One slot item of the stream caps: its key, and the scope a refusal names.
#[derive(Debug)]
struct SlotItem {
    scope: &'static str,
    pk: String,
    sk: String,
}

impl SlotItem {
    fn new(scope: &'static str, pk: &str, sk: &str) -> Self {
        SlotItem { scope, pk: pk.to_owned(), sk: sk.to_owned() }
    }
}

/// Why one slot item refused a lease.
#[derive(Debug)]
enum TakeError {
    Full(LeasesFull),
    Aws(AwsError),
}

impl From<AwsError> for TakeError {
    fn from(err: AwsError) -> Self {
        TakeError::Aws(err)
    }
}

impl TakeError {
    fn scoped(self, scope: &'static str) -> SlotError {
        match self {
            TakeError::Full(full) => SlotError::Full { scope, full },
            TakeError::Aws(err) => SlotError::Aws(err),
        }
    }
}

/// The leases of a slot item; an entry that is not a number is dropped (it cannot be honoured).
fn read_leases(item: &HashMap<String, AttributeValue>) -> StreamLeases {
    let mut leases = StreamLeases::default();
    if let Some(AttributeValue::M(map)) = item.get("leases") {
        for (id, value) in map {
            if let Some(at) = value.as_n().ok().and_then(|v| v.parse::<i64>().ok()) {
                leases.0.insert(id.clone(), at);
            }
        }
    }
    leases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_length_prefixed_per_owner() {
        let owner = |name: &str| -> Owner { name.parse().unwrap() };
        assert_eq!(rate_pk(&owner("a#b")), "RATE#3:a#b");
        assert_eq!(streams_pk(&owner("alice")), "STREAMS#5:alice");
        assert_ne!(rate_pk(&owner("a:1")), rate_pk(&owner("a")));
    }

    #[test]
    fn leases_are_read_from_the_item_and_bad_entries_dropped() {
        let item = HashMap::from([(
            "leases".to_string(),
            AttributeValue::M(HashMap::from([
                ("a".to_string(), n(10)),
                ("b".to_string(), s("not a number")),
            ])),
        )]);
        assert_eq!(read_leases(&item).0.into_iter().collect::<Vec<_>>(), [("a".to_string(), 10)]);
        assert!(read_leases(&HashMap::new()).0.is_empty());
    }
}
