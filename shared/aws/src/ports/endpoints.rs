//! Webhook endpoints: their records, their health, their deliveries, and the windows that
//! space a job's progress events.

use async_trait::async_trait;
use longhaul_domain::endpoints::{DeliveryStatus, DisabledReason, EndpointEvent, EndpointId};
use longhaul_domain::{JobId, Owner, Timestamp};

use super::Warm;
use crate::jobs::{
    DeliveryPage, EndpointDelivery, EndpointRecord, JobStore, ListError, StoreError,
};

/// Owners' endpoints: what the API changes and what the notifier and deliverer read.
#[async_trait]
pub trait EndpointStore: Warm {
    /// Creates `record` unless its owner has `max` endpoints already (`Ok(false)`, nothing
    /// left written).
    async fn create_endpoint(&self, record: &EndpointRecord, max: u32) -> Result<bool, StoreError>;
    /// `owner`'s endpoint `id`, if there is one (a strongly consistent read).
    async fn endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError>;
    /// All of `owner`'s endpoints (at most the deployment's maximum), oldest first.
    async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError>;
    /// Writes `record`'s spec (url, events, description), `updated_at` and `version` if the
    /// stored version is still `read`; whether it was written (`false`: changed meanwhile, or
    /// deleted). Status and health are not touched.
    async fn replace_endpoint_spec(
        &self,
        record: &EndpointRecord,
        read: u64,
    ) -> Result<bool, StoreError>;
    /// Enables `owner`'s endpoint `id` at `now` (removing the reason, time and failing run of
    /// a disablement); the record after, `None` if there is no such endpoint.
    async fn enable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        now: Timestamp,
    ) -> Result<Option<EndpointRecord>, StoreError>;
    /// Deletes `owner`'s endpoint `id`; whether there was one. Its delivery records lapse with
    /// their TTL.
    async fn delete_endpoint(&self, owner: &Owner, id: &EndpointId) -> Result<bool, StoreError>;
}

/// What delivery attempts tell about an endpoint's health.
#[async_trait]
pub trait EndpointHealth: Warm {
    /// Records that an unbroken run of failures began at `since`, unless one is recorded (or
    /// the endpoint is gone).
    async fn mark_failing(
        &self,
        owner: &Owner,
        id: &EndpointId,
        since: Timestamp,
    ) -> Result<(), StoreError>;
    /// Ends the run of failures (an attempt succeeded).
    async fn mark_recovered(&self, owner: &Owner, id: &EndpointId) -> Result<(), StoreError>;
    /// Disables the endpoint for `reason` at `at` if it is enabled and, when `failing_since`
    /// is given, still failing since then (an attempt that read an older run of failures does
    /// not disable an endpoint that recovered, or was enabled, meanwhile); whether this call
    /// disabled it (so it is counted once).
    async fn disable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        reason: DisabledReason,
        failing_since: Option<Timestamp>,
        at: Timestamp,
    ) -> Result<bool, StoreError>;
}

/// Endpoints' delivery records.
#[async_trait]
pub trait EndpointDeliveries: Warm {
    /// Writes `delivery` over the record of the same (endpoint, job, event), keeping the
    /// stored `created_at` if there is one.
    async fn record_endpoint_delivery(&self, delivery: &EndpointDelivery)
    -> Result<(), StoreError>;
    /// The record of `event` of `job` to `endpoint`, if there is one.
    async fn endpoint_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
    ) -> Result<Option<EndpointDelivery>, StoreError>;
    /// A page of at most `limit` of `endpoint`'s deliveries (only those in `status`, if
    /// given), newest job first, starting after `after` (a previous page's `next`). A
    /// filtered page may hold fewer than `limit` and still have a `next`. An `after` that is
    /// not a `next` this store gave is [`ListError::InvalidCursor`] (the caller's mistake).
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<DeliveryPage, ListError>;
    /// Moves a delivery that is `from` (`failed`, or `delivered` or a lost `pending` for a
    /// resend) to `pending` at `now` (about to be queued again); whether it was `from`. Of two
    /// concurrent resends or recoveries, one moves it and queues it. From `pending`, only a
    /// delivery neither recorded, attempted nor queued again since `quiet_since` moves.
    async fn requeue_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
        from: DeliveryStatus,
        now: Timestamp,
        quiet_since: Timestamp,
    ) -> Result<bool, StoreError>;
}

/// The windows that space a job's progress events to at most one per window.
#[async_trait]
pub trait ProgressWindows: Warm {
    /// Opens `job`'s window until `until` unless one is still open at `now`; whether it
    /// opened (the caller then queues the window's one event).
    async fn open_progress_window(
        &self,
        job: &JobId,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError>;
    /// Claims the trailing event of `job`'s window open at `now`: `Some(end)`, the end of that
    /// window, when the event is due (the caller queues it for then) — and the window is
    /// extended by `window`, so that the trailing event has its own, whose trailing event can
    /// be claimed once the first is due; `None` if no window is open or its trailing event is
    /// claimed and not yet due (it will carry this change: it reads the progress when it is
    /// sent).
    async fn claim_trailing_event(
        &self,
        job: &JobId,
        now: Timestamp,
        window: std::time::Duration,
    ) -> Result<Option<Timestamp>, StoreError>;
}

#[async_trait]
impl EndpointStore for JobStore {
    async fn create_endpoint(&self, record: &EndpointRecord, max: u32) -> Result<bool, StoreError> {
        JobStore::create_endpoint(self, record, max).await
    }
    async fn endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        JobStore::endpoint(self, owner, id).await
    }
    async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError> {
        JobStore::endpoints(self, owner).await
    }
    async fn replace_endpoint_spec(
        &self,
        record: &EndpointRecord,
        read: u64,
    ) -> Result<bool, StoreError> {
        JobStore::replace_endpoint_spec(self, record, read).await
    }
    async fn enable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        now: Timestamp,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        JobStore::enable_endpoint(self, owner, id, now).await
    }
    async fn delete_endpoint(&self, owner: &Owner, id: &EndpointId) -> Result<bool, StoreError> {
        JobStore::delete_endpoint(self, owner, id).await
    }
}

#[async_trait]
impl EndpointHealth for JobStore {
    async fn mark_failing(
        &self,
        owner: &Owner,
        id: &EndpointId,
        since: Timestamp,
    ) -> Result<(), StoreError> {
        JobStore::mark_failing(self, owner, id, since).await
    }
    async fn mark_recovered(&self, owner: &Owner, id: &EndpointId) -> Result<(), StoreError> {
        JobStore::mark_recovered(self, owner, id).await
    }
    async fn disable_endpoint(
        &self,
        owner: &Owner,
        id: &EndpointId,
        reason: DisabledReason,
        failing_since: Option<Timestamp>,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        JobStore::disable_endpoint(self, owner, id, reason, failing_since, at).await
    }
}

#[async_trait]
impl EndpointDeliveries for JobStore {
    async fn record_endpoint_delivery(
        &self,
        delivery: &EndpointDelivery,
    ) -> Result<(), StoreError> {
        JobStore::record_endpoint_delivery(self, delivery).await
    }
    async fn endpoint_delivery(
        &self,
        endpoint: &EndpointId,
        job: &JobId,
        event: EndpointEvent,
    ) -> Result<Option<EndpointDelivery>, StoreError> {
        JobStore::endpoint_delivery(self, endpoint, job, event).await
    }
    async fn endpoint_deliveries(
        &self,
        endpoint: &EndpointId,
        status: Option<DeliveryStatus>,
        limit: u32,
        after: Option<&str>,
    ) -> Result<DeliveryPage, ListError> {
        JobStore::endpoint_deliveries(self, endpoint, status, limit, after).await
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
        JobStore::requeue_delivery(self, endpoint, job, event, from, now, quiet_since).await
    }
}

#[async_trait]
impl ProgressWindows for JobStore {
    async fn open_progress_window(
        &self,
        job: &JobId,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError> {
        JobStore::open_progress_window(self, job, now, until).await
    }
    async fn claim_trailing_event(
        &self,
        job: &JobId,
        now: Timestamp,
        window: std::time::Duration,
    ) -> Result<Option<Timestamp>, StoreError> {
        JobStore::claim_trailing_event(self, job, now, window).await
    }
}
