//! Webhook endpoints in memory: their records ([`EndpointStore`], [`EndpointHealth`]), their
//! delivery records ([`EndpointDeliveries`]) and the progress windows ([`ProgressWindows`]),
//! each write decided under one lock with the DynamoDB adapter's conditions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use longhaul_aws::jobs::{
    DeliveryPage, EndpointDelivery, EndpointRecord, ListError, MAX_DELIVERY_PAGE, StoreError,
    delivery_sk, parse_delivery_sk,
};
use longhaul_aws::ports::{
    EndpointDeliveries, EndpointHealth, EndpointStore, ProgressWindows, Warm,
};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, EndpointSpec, EndpointStatus,
};
use longhaul_domain::{JobId, Owner, Timestamp};

use crate::Outage;

#[derive(Debug, Default)]
struct Tables {
    /// By (owner, id), as an owner's partition holds them: by id, so oldest first.
    endpoints: BTreeMap<(Owner, EndpointId), EndpointRecord>,
    /// By (endpoint, [`delivery_sk`]), as an endpoint's partition sorts them.
    deliveries: BTreeMap<(EndpointId, String), EndpointDelivery>,
    /// When a resend or a recovery last queued each delivery again (its record's `queued_at`,
    /// which no other write touches).
    queued_at: HashMap<(EndpointId, String), Timestamp>,
    /// Each job's window: open until this time, and when its claimed trailing event is due.
    windows: HashMap<JobId, (Timestamp, Option<Timestamp>)>,
    /// How often each owner's endpoints were listed (what a test of a cache counts).
    listings: HashMap<Owner, usize>,
    /// Owners whose listing fails as an unavailable table does.
    failing_listings: HashSet<Owner>,
}

/// Endpoints, their deliveries and the progress windows, as the job table holds them. Every
/// write is decided under one lock, so it is atomic as a DynamoDB conditional write is; a
/// refused write changes nothing.
#[derive(Debug, Default)]
pub struct MemoryEndpoints {
    tables: Mutex<Tables>,
    outage: Outage,
}

impl MemoryEndpoints {
    /// No endpoints, deliveries or windows.
    pub fn new() -> Self {
        Self::default()
    }

    /// While `down`, every call fails as an unavailable table does (a retryable AWS error).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// A test's endpoint of `owner` at `url` receiving `events` — disabled (answered `410`),
    /// if `disabled` — stored as the API would have created it; the record.
    pub fn subscribe(
        &self,
        owner: &Owner,
        url: &str,
        events: &[EndpointEvent],
        disabled: bool,
    ) -> EndpointRecord {
        let spec = EndpointSpec {
            url: url.to_owned(),
            events: events.iter().copied().collect(),
            description: None,
        };
        let mut record = EndpointRecord::new(owner.clone(), spec, Timestamp::now());
        if disabled {
            record.status = EndpointStatus::Disabled;
            record.disabled_reason = Some(DisabledReason::Gone);
            record.disabled_at = Some(record.created_at);
        }
        let key = (owner.clone(), record.endpoint_id.clone());
        self.lock().endpoints.insert(key, record.clone());
        record
    }

    /// How often `owner`'s endpoints were listed.
    pub fn listings_of(&self, owner: &Owner) -> usize {
        self.lock().listings.get(owner).copied().unwrap_or(0)
    }

    /// While `failing`, listing `owner`'s endpoints fails as an unavailable table does (the
    /// other owners' are read as usual).
    pub fn fail_listing_of(&self, owner: &Owner, failing: bool) {
        let mut tables = self.lock();
        if failing {
            tables.failing_listings.insert(owner.clone());
        } else {
            tables.failing_listings.remove(owner);
        }
    }

    /// Every delivery record, by endpoint and then as the endpoint's partition sorts them
    /// (what a test checks the records a handler wrote by).
    pub fn all_deliveries(&self) -> Vec<EndpointDelivery> {
        self.lock().deliveries.values().cloned().collect()
    }

    /// Until when `job`'s progress window is open, if one was opened.
    pub fn window_until(&self, job: &JobId) -> Option<Timestamp> {
        self.lock().windows.get(job).map(|(until, _)| *until)
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, doing: &str) -> Result<(), StoreError> {
        self.outage.check(doing).map_err(StoreError::from)
    }

    /// Applies `change` to `owner`'s endpoint `id`, if there is one; what it returned.
    fn with_endpoint<T>(
        &self,
        owner: &Owner,
        id: &EndpointId,
        change: impl FnOnce(&mut EndpointRecord) -> T,
    ) -> Option<T> {
        self.lock().endpoints.get_mut(&(owner.clone(), id.clone())).map(change)
    }
}

impl Warm for MemoryEndpoints {}

#[async_trait]
impl EndpointStore for MemoryEndpoints {
    async fn create_endpoint(&self, record: &EndpointRecord, max: u32) -> Result<bool, StoreError> {
        self.check("create endpoint")?;
        let mut tables = self.lock();
        let owned = tables.endpoints.keys().filter(|(owner, _)| *owner == record.owner).count();
        if owned >= max as usize {
            return Ok(false);
        }
        let key = (record.owner.clone(), record.endpoint_id.clone());
        if tables.endpoints.contains_key(&key) {
            return Err(StoreError::Corrupt {
                key: format!("endpoint {}", record.endpoint_id),
                reason: "a fresh endpoint id was taken".into(),
            });
        }
        tables.endpoints.insert(key, record.clone());
        Ok(true)
    }

    async fn endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        self.check("read endpoint")?;
        Ok(self.with_endpoint(owner, id, |record| record.clone()))
    }

    async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError> {
        self.check("list endpoints")?;
        let mut tables = self.lock();
        *tables.listings.entry(owner.clone()).or_default() += 1;
        if tables.failing_listings.contains(owner) {
            return Err(crate::Outage::unavailable("list endpoints").into());
        }
        Ok(tables
            .endpoints
            .iter()
            .filter(|((o, _), _)| o == owner)
            .map(|(_, r)| r.clone())
            .collect())
    }

    async fn replace_endpoint_spec(
        &self,
        record: &EndpointRecord,
        read: u64,
    ) -> Result<bool, StoreError> {
        self.check("write endpoint")?;
        let written = self.with_endpoint(&record.owner, &record.endpoint_id, |stored| {
            if stored.version != read {
                return false;
            }
            stored.spec = record.spec.clone();
            stored.updated_at = record.updated_at;
            stored.version = record.version;
            true
        });
        Ok(written == Some(true))
    }

    async fn enable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        now: Timestamp,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        self.check("enable endpoint")?;
        Ok(self.with_endpoint(owner, id, |stored| {
            stored.status = EndpointStatus::Enabled;
            stored.updated_at = now;
            stored.disabled_reason = None;
            stored.disabled_at = None;
            stored.failing_since = None;
            stored.clone()
        }))
    }

    async fn delete_endpoint(&self, owner: &Owner, id: &EndpointId) -> Result<bool, StoreError> {
        self.check("delete endpoint")?;
        Ok(self.lock().endpoints.remove(&(owner.clone(), id.clone())).is_some())
    }
}

#[async_trait]
impl EndpointHealth for MemoryEndpoints {
    async fn mark_failing(
        &self,
        owner: &Owner,
        id: &EndpointId,
        since: Timestamp,
    ) -> Result<(), StoreError> {
        self.check("mark endpoint failing")?;
        self.with_endpoint(owner, id, |stored| {
            stored.failing_since.get_or_insert(since);
        });
        Ok(())
    }

    async fn mark_recovered(&self, owner: &Owner, id: &EndpointId) -> Result<(), StoreError> {
        self.check("mark endpoint recovered")?;
        self.with_endpoint(owner, id, |stored| stored.failing_since = None);
        Ok(())
    }

    async fn disable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        reason: DisabledReason,
        failing_since: Option<Timestamp>,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.check("disable endpoint")?;
        let disabled = self.with_endpoint(owner, id, |stored| {
            if !stored.enabled() || failing_since.is_some_and(|s| stored.failing_since != Some(s)) {
                return false;
            }
            stored.status = EndpointStatus::Disabled;
            stored.disabled_reason = Some(reason);
            stored.disabled_at = Some(at);
            stored.updated_at = at;
            true
        });
        Ok(disabled == Some(true))
    }
}

#[async_trait]
impl EndpointDeliveries for MemoryEndpoints {
    async fn record_endpoint_delivery(
        &self,
        delivery: &EndpointDelivery,
    ) -> Result<(), StoreError> {
        self.check("record delivery")?;
        let key = (delivery.endpoint_id.clone(), delivery_sk(&delivery.job_id, delivery.event));
        let mut tables = self.lock();
        let created_at = tables.deliveries.get(&key).map_or(delivery.created_at, |d| d.created_at);
        // `REMOVE #queued_at`: a record written ends a requeue's claim.
        tables.queued_at.remove(&key);
        tables.deliveries.insert(key, EndpointDelivery { created_at, ..delivery.clone() });
        Ok(())
    }

    async fn endpoint_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
    ) -> Result<Option<EndpointDelivery>, StoreError> {
        self.check("read delivery")?;
        Ok(self.lock().deliveries.get(&(endpoint.clone(), delivery_sk(job, event))).cloned())
    }

    /// As the DynamoDB query: `limit` records are read (newest first, after `after`) and then
    /// filtered, so a filtered page may be short and still have a `next`; `next` is the last
    /// read record's sort key, given when records remain after it.
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<DeliveryPage, ListError> {
        self.check("list deliveries")?;
        if after.is_some_and(|after| parse_delivery_sk(after).is_none()) {
            return Err(ListError::InvalidCursor);
        }
        let tables = self.lock();
        let mut partition =
            tables.deliveries.iter().rev().filter(|((e, sk), _)| {
                e == endpoint && after.is_none_or(|after| sk.as_str() < after)
            });
        let read: Vec<_> =
            partition.by_ref().take(limit.clamp(1, MAX_DELIVERY_PAGE) as usize).collect();
        let next = match (read.last(), partition.next()) {
            (Some(((_, sk), _)), Some(_)) => Some(sk.clone()),
            _ => None,
        };
        let deliveries = read
            .into_iter()
            .map(|(_, delivery)| delivery)
            .filter(|delivery| status.is_none_or(|status| delivery.status == status))
            .cloned()
            .collect();
        Ok(DeliveryPage { deliveries, next })
    }

    async fn requeue_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
        from: DeliveryStatus,
        now: Timestamp,
        quiet_since: Timestamp,
    ) -> Result<bool, StoreError> {
        self.check("requeue delivery")?;
        let mut tables = self.lock();
        let key = (endpoint.clone(), delivery_sk(job, event));
        let queued_at = tables.queued_at.get(&key).copied();
        match tables.deliveries.get_mut(&key) {
            Some(delivery) if delivery.status == from => {
                // From `pending`: `#created_at < :quiet AND (attribute_not_exists(#last_attempt_at)
                // OR #last_attempt_at < :quiet) AND (… #queued_at < :quiet)`.
                let quiet = |at: Option<Timestamp>| at.is_none_or(|at| at < quiet_since);
                if from == DeliveryStatus::Pending
                    && !(delivery.created_at < quiet_since
                        && quiet(delivery.last_attempt_at)
                        && quiet(queued_at))
                {
                    return Ok(false);
                }
                delivery.status = DeliveryStatus::Pending;
                tables.queued_at.insert(key, now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[async_trait]
impl ProgressWindows for MemoryEndpoints {
    async fn open_progress_window(
        &self,
        job: &JobId,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError> {
        self.check("open a progress window")?;
        let mut tables = self.lock();
        if tables.windows.get(job).is_some_and(|(open_until, _)| *open_until > now) {
            return Ok(false);
        }
        tables.windows.insert(job.clone(), (until, None));
        Ok(true)
    }

    async fn claim_trailing_event(
        &self,
        job: &JobId,
        now: Timestamp,
        window: std::time::Duration,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.check("claim a trailing progress event")?;
        let mut tables = self.lock();
        match tables.windows.get_mut(job) {
            Some((until, claimed)) if *until > now && claimed.is_none_or(|due| due <= now) => {
                let end = *until;
                let window = chrono::Duration::from_std(window).expect("a window fits");
                *until = Timestamp::from(end.as_datetime() + window);
                *claimed = Some(end);
                Ok(Some(end))
            }
            _ => Ok(None),
        }
    }
}
