//! Webhook endpoints, their delivery records and the progress-event windows.
//!
//! | item | pk / sk |
//! |------|---------|
//! | endpoint | `ENDPOINTS#<len>:<owner>` / `ENDPOINT#<endpoint id>` |
//! | endpoint delivery | `EPDELIVERY#<endpoint id>` / `<job id>#<event>` |
//! | progress window | `PROGRESSHOOK#<job id>` / `WINDOW` |
//!
//! An owner's endpoints are one partition (at most the deployment's `TenantMaxEndpoints`, one
//! Query lists them all). An endpoint's deliveries are one partition too, one item per (job,
//! event) that each attempt overwrites — the latest progress event of a job, the one terminal
//! event, the one expiry reminder — sorted by job id (UUIDv7: newest job last). Delivery items
//! and progress windows carry a TTL (`expires_at`): the record retention for deliveries, a
//! minute past the window for windows.

use super::*;

use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, EndpointSpec, EndpointStatus,
};
use serde::Deserialize;

/// An endpoint as stored and shown (its owner only ever sees its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// Its id.
    pub endpoint_id: EndpointId,
    /// Whose it is.
    pub owner: Owner,
    /// URL, events, description.
    #[serde(flatten)]
    pub spec: EndpointSpec,
    /// Whether its events are delivered.
    pub status: EndpointStatus,
    /// Why it was disabled (while it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<DisabledReason>,
    /// When it was disabled (while it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_at: Option<Timestamp>,
    /// When the unbroken run of failed attempts it is in began; `None` after a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<Timestamp>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its spec or status last changed.
    pub updated_at: Timestamp,
    /// Bumped by every change of its spec; a change is written only over the version it read.
    /// Health writes (failing, recovered, disabled) do not bump it: they touch no spec field.
    pub version: u64,
}

impl EndpointRecord {
    /// A new, enabled endpoint of `owner`, made at `now`.
    pub fn new(owner: Owner, spec: EndpointSpec, now: Timestamp) -> Self {
        EndpointRecord {
            endpoint_id: EndpointId::new(),
            owner,
            spec,
            status: EndpointStatus::Enabled,
            disabled_reason: None,
            disabled_at: None,
            failing_since: None,
            created_at: now,
            updated_at: now,
            version: 1,
        }
    }

    /// Whether events are delivered to it now.
    pub fn enabled(&self) -> bool {
        self.status == EndpointStatus::Enabled
    }
}

/// One event's delivery to one endpoint: the latest attempt's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointDelivery {
    /// The `webhook-id` ([`longhaul_domain::endpoints::endpoint_message_id`]).
    pub webhook_id: String,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The job.
    pub job_id: JobId,
    /// The event.
    pub event: EndpointEvent,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made (0: queued, or recorded `failed` without one while the endpoint was
    /// disabled).
    pub attempts: u32,
    /// When it was first recorded (kept by later writes of the same delivery).
    pub created_at: Timestamp,
    /// When its last attempt was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<Timestamp>,
    /// The endpoint's answer to the last attempt, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// How long the last attempt took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// What went wrong with the last attempt (or why none was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The progress sequence a progress event reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_seq: Option<u64>,
    /// When the job's result expires, for a `job.result_expiring` event (what a resend or a
    /// recovery puts back on its message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_expires_at: Option<Timestamp>,
}

impl EndpointDelivery {
    /// `event` of `job` to `endpoint` recorded `failed` at `at` without an attempt (after
    /// `attempts` earlier ones), for `reason`: an event to a disabled endpoint, or one that
    /// could not be sent (its job gone, its result expired). `recover` and `resend` find it.
    pub fn unsent(
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
        attempts: u32,
        at: Timestamp,
        reason: &str,
        result_expires_at: Option<Timestamp>,
    ) -> Self {
        EndpointDelivery {
            webhook_id: longhaul_domain::endpoints::endpoint_message_id(endpoint, job, event, None),
            endpoint_id: endpoint.clone(),
            job_id: job.clone(),
            event,
            status: DeliveryStatus::Failed,
            attempts,
            created_at: at,
            last_attempt_at: None,
            status_code: None,
            latency_ms: None,
            error: Some(reason.to_owned()),
            progress_seq: None,
            result_expires_at,
        }
    }
}

/// A page of an endpoint's deliveries, newest job first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryPage {
    /// The deliveries.
    pub deliveries: Vec<EndpointDelivery>,
    /// Where the next page starts (an opaque position within the endpoint's deliveries), if
    /// there may be more.
    pub next: Option<String>,
}

/// A number attribute.
fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The partition of `owner`'s endpoints.
pub fn endpoints_pk(owner: &Owner) -> String {
    format!("ENDPOINTS#{}:{owner}", owner.len())
}

/// The partition of an endpoint's deliveries.
pub fn endpoint_deliveries_pk(endpoint: &EndpointId) -> String {
    format!("EPDELIVERY#{endpoint}")
}

/// The partition of a job's progress-event window.
pub fn progress_window_pk(job: &JobId) -> String {
    format!("PROGRESSHOOK#{job}")
}

/// Sort-key prefix of an endpoint record.
const ENDPOINT_SK_PREFIX: &str = "ENDPOINT#";

/// Sort key of a job's progress window.
const PROGRESS_WINDOW_SK: &str = "WINDOW";

/// How long a progress window's item stays after its window closed, until its TTL.
const PROGRESS_WINDOW_TTL_GRACE_SECONDS: i64 = 60;

/// The most deliveries one page holds (a larger `limit` reads as this).
pub const MAX_DELIVERY_PAGE: u32 = 100;

/// The attributes a change of the spec writes ([`JobStore::replace_endpoint_spec`]); the
/// rest (keys, id, owner, creation, status and health) stay as stored.
const SPEC_ATTRIBUTES: [&str; 5] = ["url", "events", "description", "updated_at", "version"];

/// The attributes every write of a delivery writes ([`JobStore::record_endpoint_delivery`]):
/// all of the record's but `created_at`, which the first write sets.
/// A delivery record's attribute noting when a resend or a recovery last queued it (apart
/// from the record's fields: only a requeue writes it).
const QUEUED_AT: &str = "queued_at";

const DELIVERY_ATTRIBUTES: [&str; 12] = [
    "webhook_id",
    "endpoint_id",
    "job_id",
    "event",
    "status",
    "attempts",
    "last_attempt_at",
    "status_code",
    "latency_ms",
    "error",
    "progress_seq",
    "result_expires_at",
];

/// The sort key of the delivery of `event` of `job`, in its endpoint's partition; also what a
/// [`DeliveryPage`]'s `next` holds.
pub fn delivery_sk(job: &JobId, event: EndpointEvent) -> String {
    format!("{job}#{event}")
}

/// The job and event a delivery sort key names, `None` for any other text (a page's `after`
/// that is not a `next` this store gave).
pub fn parse_delivery_sk(sk: &str) -> Option<(JobId, EndpointEvent)> {
    let (job, event) = sk.split_once('#')?;
    Some((job.parse().ok()?, event.parse().ok()?))
}

fn endpoint_key(owner: &Owner, id: &EndpointId) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(endpoints_pk(owner))),
        ("sk".to_owned(), s(format!("{ENDPOINT_SK_PREFIX}{id}"))),
    ])
}

fn delivery_key(endpoint: &EndpointId, job: &JobId, event: EndpointEvent) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(endpoint_deliveries_pk(endpoint))),
        ("sk".to_owned(), s(delivery_sk(job, event))),
    ])
}

/// An `UpdateItem`'s expression and what it names: attribute `a` is `#a`, a value `:v`.
#[derive(Debug, Default)]
struct Update {
    set: Vec<String>,
    remove: Vec<String>,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl Update {
    /// Writes `attributes` as `item` holds them: each it holds is set to its value, each it
    /// lacks (an optional field that is `None`) is removed, so nothing of an earlier write of
    /// the record lingers.
    fn record(mut self, item: &Item, attributes: &[&str]) -> Self {
        for name in attributes {
            self = match item.get(*name) {
                Some(value) => self.set(name, value.clone()),
                None => self.remove(name),
            };
        }
        self
    }

    /// Sets attribute `name` to `value` (as `:name`).
    fn set(mut self, name: &str, value: AttributeValue) -> Self {
        self.set.push(format!("#{name} = :{name}"));
        self.value(&format!(":{name}"), value).name(name)
    }

    /// Sets attribute `name` to `value` unless the item has it.
    fn set_if_absent(mut self, name: &str, value: AttributeValue) -> Self {
        self.set.push(format!("#{name} = if_not_exists(#{name}, :{name})"));
        self.value(&format!(":{name}"), value).name(name)
    }

    /// Removes attribute `name`.
    fn remove(mut self, name: &str) -> Self {
        self.remove.push(format!("#{name}"));
        self.name(name)
    }

    /// Names attribute `name` `#name`, for a condition.
    fn name(mut self, name: &str) -> Self {
        self.names.insert(format!("#{name}"), name.to_owned());
        self
    }

    /// Gives `placeholder` (`:…`) the value `value`, for a condition.
    fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.to_owned(), value);
        self
    }

    fn expression(&self) -> String {
        let mut expression = Vec::new();
        if !self.set.is_empty() {
            expression.push(format!("SET {}", self.set.join(", ")));
        }
        if !self.remove.is_empty() {
            expression.push(format!("REMOVE {}", self.remove.join(", ")));
        }
        expression.join(" ")
    }
}

impl JobStore {
    /// Applies `update` to the item at `key` if `condition` holds (always, without one): the
    /// item after, `None` if the condition refused the write.
    async fn update_if(
        &self,
        key: Item,
        update: Update,
        condition: Option<&str>,
        doing: &str,
    ) -> Result<Option<Item>, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .update_expression(update.expression())
            .set_condition_expression(condition.map(str::to_owned))
            .set_expression_attribute_names((!update.names.is_empty()).then_some(update.names))
            .set_expression_attribute_values((!update.values.is_empty()).then_some(update.values))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(output) => Ok(Some(output.attributes.unwrap_or_default())),
            Err(err) if crate::condition_refused(&err) => Ok(None),
            Err(err) => Err(AwsError::new(doing, err).into()),
        }
    }

    /// Creates `record` unless its owner has `max` endpoints already (`Ok(false)`). The count
    /// is checked before the write and again after it: of racing creations that together
    /// pass the cap, each sees the excess after its write and takes its own back, so the cap
    /// holds however many race (a creation refused that way is answered as over the cap).
    /// The count is the listing's length: an owner's partition is one small page, and a
    /// `Select=COUNT` query would be billed the same.
    pub async fn create_endpoint(
        &self,
        record: &EndpointRecord,
        max: u32,
    ) -> Result<bool, StoreError> {
        if self.endpoints(&record.owner).await?.len() >= max as usize {
            return Ok(false);
        }
        let mut item = to_item(record);
        item.extend(endpoint_key(&record.owner, &record.endpoint_id));
        self.put_fresh(item, &format!("endpoint {}", record.endpoint_id)).await?;
        if self.endpoints(&record.owner).await?.len() > max as usize {
            self.delete_endpoint(&record.owner, &record.endpoint_id).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// `owner`'s endpoint `id`, if there is one (another owner's reads as none); a strongly
    /// consistent read.
    pub async fn endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(endpoint_key(owner, id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read endpoint {id}"), e))?;
        read.item.map(from_item).transpose()
    }

    /// All of `owner`'s endpoints, oldest first (by id: UUIDv7), read to the partition's end.
    pub async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError> {
        let mut endpoints = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .expression_attribute_values(":pk", s(endpoints_pk(owner)))
                .expression_attribute_values(":prefix", s(ENDPOINT_SK_PREFIX))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| AwsError::new("list endpoints", e))?;
            for item in page.items.unwrap_or_default() {
                endpoints.push(from_item(item)?);
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                return Ok(endpoints);
            }
        }
    }

    /// Writes `record`'s spec (url, events, description), `updated_at` and `version` if the
    /// stored version is still `read`; whether it was written (`false`: changed meanwhile, or
    /// deleted). Status and health stay as stored.
    pub async fn replace_endpoint_spec(
        &self,
        record: &EndpointRecord,
        read: u64,
    ) -> Result<bool, StoreError> {
        let update = Update::default()
            .record(&to_item(record), &SPEC_ATTRIBUTES)
            .value(":read", AttributeValue::N(read.to_string()));
        let written = self
            .update_if(
                endpoint_key(&record.owner, &record.endpoint_id),
                update,
                Some("#version = :read"),
                &format!("write endpoint {}", record.endpoint_id),
            )
            .await?;
        Ok(written.is_some())
    }

    /// Enables `owner`'s endpoint `id` at `now`, removing the reason, time and failing run of
    /// a disablement; the record after, `None` if there is no such endpoint.
    pub async fn enable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        now: Timestamp,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        let update = Update::default()
            .set("status", s(EndpointStatus::Enabled.as_str()))
            .set("updated_at", s(now.to_rfc3339()))
            .remove("disabled_reason")
            .remove("disabled_at")
            .remove("failing_since");
        let after = self
            .update_if(
                endpoint_key(owner, id),
                update,
                Some("attribute_exists(pk)"),
                &format!("enable endpoint {id}"),
            )
            .await?;
        after.map(from_item).transpose()
    }

    /// Deletes `owner`'s endpoint `id`; whether there was one. Its delivery records lapse
    /// with their TTL.
    pub async fn delete_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<bool, StoreError> {
        self.delete_key(endpoint_key(owner, id), &format!("endpoint {id}")).await
    }

    /// Records that the endpoint's unbroken run of failures began at `since`, unless one is
    /// recorded (its first failure stands) or the endpoint is gone.
    pub async fn mark_failing(
        &self,
        owner: &Owner,
        id: &EndpointId,
        since: Timestamp,
    ) -> Result<(), StoreError> {
        let update = Update::default().set("failing_since", s(since.to_rfc3339()));
        self.update_if(
            endpoint_key(owner, id),
            update,
            Some("attribute_exists(pk) AND attribute_not_exists(#failing_since)"),
            &format!("mark endpoint {id} failing"),
        )
        .await?;
        Ok(())
    }

    /// Ends the endpoint's run of failures, if it is in one.
    pub async fn mark_recovered(&self, owner: &Owner, id: &EndpointId) -> Result<(), StoreError> {
        let update = Update::default().remove("failing_since");
        self.update_if(
            endpoint_key(owner, id),
            update,
            Some("attribute_exists(#failing_since)"),
            &format!("mark endpoint {id} recovered"),
        )
        .await?;
        Ok(())
    }

    /// Disables the endpoint for `reason` at `at` if it is enabled and, when `failing_since`
    /// is given, still failing since then; whether this call disabled it (`false`: disabled
    /// already, recovered or enabled since, or gone).
    pub async fn disable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        reason: DisabledReason,
        failing_since: Option<Timestamp>,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut update = Update::default()
            .set("status", s(EndpointStatus::Disabled.as_str()))
            .set("disabled_reason", s(reason.as_str()))
            .set("disabled_at", s(at.to_rfc3339()))
            .set("updated_at", s(at.to_rfc3339()))
            .value(":enabled", s(EndpointStatus::Enabled.as_str()));
        let condition = match failing_since {
            Some(since) => {
                update = update.name("failing_since").value(":since", s(since.to_rfc3339()));
                "#status = :enabled AND #failing_since = :since"
            }
            None => "#status = :enabled",
        };
        let written = self
            .update_if(
                endpoint_key(owner, id),
                update,
                Some(condition),
                &format!("disable endpoint {id}"),
            )
            .await?;
        Ok(written.is_some())
    }

    /// Writes `delivery` over the record of the same (endpoint, job, event): every attribute
    /// as given (an optional one it lacks is removed), but `created_at`, which the first write
    /// sets. Each write renews the record's TTL (`expires_at`): a retention from now.
    pub async fn record_endpoint_delivery(
        &self,
        delivery: &EndpointDelivery,
    ) -> Result<(), StoreError> {
        // A record written (an attempt's, or one put back as it was read) ends a requeue's
        // claim: its `queued_at` goes, so a resend the queue refused may be repeated at once.
        let update = Update::default()
            .record(&to_item(delivery), &DELIVERY_ATTRIBUTES)
            .remove(QUEUED_AT)
            .set_if_absent("created_at", s(delivery.created_at.to_rfc3339()))
            .set("expires_at", self.retention.ttl_from_now());
        self.update_if(
            delivery_key(&delivery.endpoint_id, &delivery.job_id, delivery.event),
            update,
            None,
            &format!("record delivery {}", delivery.webhook_id),
        )
        .await?;
        Ok(())
    }

    /// The record of `event` of `job` to `endpoint`, if there is one.
    pub async fn endpoint_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
    ) -> Result<Option<EndpointDelivery>, StoreError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(delivery_key(endpoint, job, event)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read delivery of {job} to {endpoint}"), e))?;
        read.item.map(from_item).transpose()
    }

    /// A page of `endpoint`'s deliveries, newest job first: one query reading at most `limit`
    /// (1 to [`MAX_DELIVERY_PAGE`]) records after `after`, of which those in `status` (all,
    /// without one) — so a filtered page may hold fewer than `limit` and still have a `next`.
    /// An `after` that is not a `next` of this store ([`parse_delivery_sk`]) is
    /// [`ListError::InvalidCursor`]: it never reaches DynamoDB, and the partition read is
    /// always `endpoint`'s.
    pub async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<DeliveryPage, ListError> {
        let start = after
            .map(|after| {
                let (job, event) = parse_delivery_sk(after).ok_or(ListError::InvalidCursor)?;
                Ok::<_, ListError>(delivery_key(endpoint, &job, event))
            })
            .transpose()?;
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(endpoint_deliveries_pk(endpoint)))
            .scan_index_forward(false)
            .limit(limit.clamp(1, MAX_DELIVERY_PAGE) as i32)
            .set_exclusive_start_key(start);
        if let Some(status) = status {
            query = query
                .filter_expression("#status = :status")
                .expression_attribute_names("#status", "status")
                .expression_attribute_values(":status", s(status.as_str()));
        }
        let page = query.send().await.map_err(|e| {
            StoreError::from(AwsError::new(format!("list deliveries of {endpoint}"), e))
        })?;
        let deliveries =
            page.items.unwrap_or_default().into_iter().map(from_item).collect::<Result<_, _>>()?;
        let next = match page.last_evaluated_key {
            Some(key) => match key.get("sk").and_then(|v| v.as_s().ok()) {
                Some(sk) => Some(sk.clone()),
                None => {
                    return Err(StoreError::Corrupt {
                        key: endpoint_deliveries_pk(endpoint),
                        reason: "a page's last evaluated key has no sort key".into(),
                    }
                    .into());
                }
            },
            None => None,
        };
        Ok(DeliveryPage { deliveries, next })
    }

    /// Moves a delivery that is `from` to `pending` at `now` (noting when it was queued
    /// again, `queued_at`); whether it was `from` (of two concurrent resends or recoveries,
    /// one moves it). From `pending` — a delivery whose retries stopped without a record —
    /// only if it was neither recorded, attempted nor queued again since `quiet_since`.
    pub async fn requeue_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
        from: DeliveryStatus,
        now: Timestamp,
        quiet_since: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut update = Update::default()
            .set("status", s(DeliveryStatus::Pending.as_str()))
            .set(QUEUED_AT, s(now.to_rfc3339()))
            .value(":from", s(from.as_str()));
        let mut condition = "#status = :from".to_owned();
        if from == DeliveryStatus::Pending {
            update = update
                .name("created_at")
                .name("last_attempt_at")
                .value(":quiet", s(quiet_since.to_rfc3339()));
            condition.push_str(
                " AND #created_at < :quiet \
                 AND (attribute_not_exists(#last_attempt_at) OR #last_attempt_at < :quiet) \
                 AND (attribute_not_exists(#queued_at) OR #queued_at < :quiet)",
            );
        }
        let written = self
            .update_if(
                delivery_key(endpoint, job, event),
                update,
                Some(&condition),
                &format!("requeue delivery of {job} to {endpoint}"),
            )
            .await?;
        Ok(written.is_some())
    }

    /// Opens `job`'s progress window until `until` unless one is still open at `now`;
    /// whether it opened. The window's end is kept in epoch milliseconds (`until_ms`), so that
    /// [`JobStore::claim_trailing_event`] can extend it in the same write that claims it; the
    /// item lapses with its TTL a minute after the window (a new window replaces the item, and
    /// with it the claim of the previous window's trailing event).
    pub async fn open_progress_window(
        &self,
        job: &JobId,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError> {
        let expires_at =
            until.as_datetime().timestamp().saturating_add(PROGRESS_WINDOW_TTL_GRACE_SECONDS);
        let item = HashMap::from([
            ("pk".to_owned(), s(progress_window_pk(job))),
            ("sk".to_owned(), s(PROGRESS_WINDOW_SK)),
            ("until_ms".to_owned(), n(until.as_datetime().timestamp_millis())),
            ("expires_at".to_owned(), n(expires_at)),
        ]);
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR until_ms <= :now")
            .expression_attribute_values(":now", n(now.as_datetime().timestamp_millis()))
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => {
                Err(AwsError::new(format!("open the progress window of {job}"), err).into())
            }
        }
    }

    /// Claims the trailing event of `job`'s window open at `now` (see
    /// [`crate::ports::ProgressWindows::claim_trailing_event`]): one conditional write that
    /// records when the claimed event is due (`trailing_at`, the window's end) and extends the
    /// window (and its TTL) by `window`.
    pub async fn claim_trailing_event(
        &self,
        job: &JobId,
        now: Timestamp,
        window: std::time::Duration,
    ) -> Result<Option<Timestamp>, StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(progress_window_pk(job)))
            .key("sk", s(PROGRESS_WINDOW_SK))
            .update_expression(
                "SET trailing_at = until_ms, until_ms = until_ms + :window, \
                 expires_at = expires_at + :window_s",
            )
            // The window is open, and its trailing event is not claimed — or is already due
            // (the claim then is the extension's own trailing event).
            .condition_expression(
                "until_ms > :now AND (attribute_not_exists(trailing_at) OR trailing_at <= :now)",
            )
            .expression_attribute_values(":now", n(now.as_datetime().timestamp_millis()))
            .expression_attribute_values(":window", n(window.as_millis()))
            .expression_attribute_values(":window_s", n(window.as_secs().max(1)))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedOld)
            .send()
            .await;
        let old = match update {
            Ok(output) => output.attributes.unwrap_or_default(),
            Err(err) if crate::condition_refused(&err) => return Ok(None),
            Err(err) => {
                return Err(AwsError::new(
                    format!("claim the trailing progress event of {job}"),
                    err,
                )
                .into());
            }
        };
        let end = old
            .get("until_ms")
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(chrono::DateTime::from_timestamp_millis)
            .ok_or_else(|| StoreError::Corrupt {
                key: progress_window_pk(job),
                reason: "a progress window without its end".into(),
            })?;
        Ok(Some(Timestamp::from(end)))
    }
}
