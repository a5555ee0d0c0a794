//! An event of one job, fanned out to its owner's webhook endpoints: what the notifier (job
//! ends, progress) and the expirer (result reminders) share.
//!
//! Each endpoint subscribed to the event gets its own message on the webhook queue (its own
//! delivery, retries and record), so one endpoint's failures never touch another's. A
//! *disabled* subscribed endpoint gets no message — nothing is attempted while it is disabled —
//! but a delivery record `failed` ("endpoint disabled"), so that `recover` after `enable`
//! fills the gap. Progress events are not recorded that way: a later one supersedes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_domain::endpoints::{EndpointEvent, EndpointId};
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};

use crate::jobs::{EndpointDelivery, EndpointRecord, StoreError};
use crate::ports::EndpointStore;
use crate::queue::WebhookMessage;

/// The error of a delivery record written instead of an attempt to a disabled endpoint.
pub const DISABLED_ERROR: &str = "endpoint disabled: not attempted";

/// The error of a delivery record written instead of an attempt of an event its endpoint no
/// longer subscribes to (its `events` were changed while the delivery was queued or retried).
pub const UNSUBSCRIBED_ERROR: &str =
    "the endpoint no longer subscribes to this event: not attempted";

/// What one event of one job comes to for its owner's endpoints.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fanout {
    /// One first attempt per enabled endpoint subscribed to the event.
    pub messages: Vec<WebhookMessage>,
    /// One `failed` record per disabled endpoint subscribed to it (none for progress).
    pub skipped: Vec<EndpointDelivery>,
}

/// One event of one job, as its owner's endpoints are to hear of it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    /// The job.
    pub job_id: JobId,
    /// Its owner, whose endpoints hear of it.
    pub owner: Owner,
    /// The job's status when the event happened.
    pub status: JobStatus,
    /// The event.
    pub event: EndpointEvent,
    /// Epoch seconds before which its deliveries are not attempted (0: at once).
    pub not_before: i64,
    /// When the job's result expires (`job.result_expiring` only).
    pub result_expires_at: Option<Timestamp>,
}

impl JobEvent {
    /// An event due at once.
    pub fn now(job_id: JobId, owner: Owner, status: JobStatus, event: EndpointEvent) -> Self {
        JobEvent { job_id, owner, status, event, not_before: 0, result_expires_at: None }
    }

    /// Its first attempt to `endpoint`.
    pub fn message(&self, endpoint: &EndpointId) -> WebhookMessage {
        WebhookMessage {
            result_expires_at: self.result_expires_at,
            owner: Some(self.owner.clone()),
            ..WebhookMessage::to_endpoint(
                self.job_id.clone(),
                self.status,
                endpoint.clone(),
                self.event,
                self.not_before,
            )
        }
    }
}

/// What `event` comes to for `endpoints` (its job's owner's), at `now`.
pub fn fan_out(endpoints: &[EndpointRecord], event: &JobEvent, now: Timestamp) -> Fanout {
    let mut fanout = Fanout::default();
    for endpoint in endpoints.iter().filter(|e| e.spec.receives(event.event)) {
        if endpoint.enabled() {
            fanout.messages.push(event.message(&endpoint.endpoint_id));
        } else if event.event.replayable() {
            fanout.skipped.push(EndpointDelivery::unsent(
                &endpoint.endpoint_id,
                &event.job_id,
                event.event,
                0,
                now,
                DISABLED_ERROR,
                event.result_expires_at,
            ));
        }
    }
    fanout
}

/// Owners' endpoints as a sandbox read them, each kept for `ttl`: a stream batch, or the
/// batches of a busy stretch, read an owner's endpoints once instead of once per event. A
/// change to an endpoint reaches events within `ttl` (the webhook function reads the endpoint
/// itself before every attempt, so a deleted or disabled one is never attempted regardless).
#[derive(Debug)]
pub struct EndpointCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<Owner, CachedEndpoints>>,
}

/// An owner's endpoints, and when they were read.
type CachedEndpoints = (Instant, Arc<Vec<EndpointRecord>>);

impl EndpointCache {
    /// A cache keeping each owner's endpoints for `ttl` (zero: every call reads), for at most
    /// `capacity` owners at once.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        EndpointCache { ttl, capacity: capacity.max(1), entries: Mutex::new(HashMap::new()) }
    }

    /// `owner`'s endpoints as of at most `ttl` before `now` (a monotonic instant).
    pub async fn endpoints(
        &self,
        store: &dyn EndpointStore,
        owner: &Owner,
        now: Instant,
    ) -> Result<Arc<Vec<EndpointRecord>>, StoreError> {
        if let Some((read_at, endpoints)) = self.lock().get(owner)
            && now.saturating_duration_since(*read_at) < self.ttl
        {
            return Ok(endpoints.clone());
        }
        let endpoints = Arc::new(store.endpoints(owner).await?);
        if !self.ttl.is_zero() {
            let mut entries = self.lock();
            if entries.len() >= self.capacity {
                let ttl = self.ttl;
                entries.retain(|_, (read_at, _)| now.saturating_duration_since(*read_at) < ttl);
                if entries.len() >= self.capacity {
                    entries.clear();
                }
            }
            entries.insert(owner.clone(), (now, endpoints.clone()));
        }
        Ok(endpoints)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, CachedEndpoints>> {
        // A panic while holding the lock leaves a map that is still a valid cache.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_domain::endpoints::{DeliveryStatus, endpoint_message_id};
    use longhaul_domain::endpoints::{EndpointSpec, EndpointStatus};

    fn endpoint(events: &[EndpointEvent], status: EndpointStatus) -> EndpointRecord {
        let spec = EndpointSpec {
            url: "https://example.com/hook".into(),
            events: events.iter().copied().collect(),
            description: None,
        };
        EndpointRecord {
            status,
            ..EndpointRecord::new("owner".parse().unwrap(), spec, Timestamp::now())
        }
    }

    #[test]
    fn each_subscribed_endpoint_gets_its_own_message_and_disabled_ones_a_failed_record() {
        use EndpointEvent::*;
        let endpoints = [
            endpoint(&[JobSucceeded, JobFailed], EndpointStatus::Enabled),
            endpoint(&[JobFailed], EndpointStatus::Enabled),
            endpoint(&[JobProgress], EndpointStatus::Enabled),
            endpoint(&[JobFailed, JobProgress], EndpointStatus::Disabled),
        ];
        let job = JobId::new();
        let now = Timestamp::now();
        let failed = fan_out(
            &endpoints,
            &JobEvent::now(job.clone(), "owner".parse().unwrap(), JobStatus::Failed, JobFailed),
            now,
        );
        let to: Vec<_> = failed.messages.iter().map(|m| m.endpoint_id.clone().unwrap()).collect();
        assert_eq!(to, [endpoints[0].endpoint_id.clone(), endpoints[1].endpoint_id.clone()]);
        assert!(failed.messages.iter().all(|m| m.event == Some(JobFailed) && m.attempt == 1));
        assert_eq!(failed.skipped.len(), 1);
        let skipped = &failed.skipped[0];
        assert_eq!(skipped.endpoint_id, endpoints[3].endpoint_id);
        assert_eq!(skipped.status, DeliveryStatus::Failed);
        assert_eq!(
            skipped.webhook_id,
            endpoint_message_id(&skipped.endpoint_id, &job, JobFailed, None)
        );

        let progress = JobEvent {
            not_before: 42,
            ..JobEvent::now(job.clone(), "owner".parse().unwrap(), JobStatus::Running, JobProgress)
        };
        let progress = fan_out(&endpoints, &progress, now);
        assert_eq!(progress.messages.len(), 1);
        assert_eq!(progress.messages[0].not_before, 42);
        assert!(progress.skipped.is_empty(), "no record of progress to a disabled endpoint");

        let cancelled = JobEvent::now(
            job.clone(),
            "owner".parse().unwrap(),
            JobStatus::Cancelled,
            JobCancelled,
        );
        assert_eq!(fan_out(&endpoints, &cancelled, now), Fanout::default());
        let expiring = JobEvent {
            result_expires_at: Some(now),
            ..JobEvent::now(
                job.clone(),
                "owner".parse().unwrap(),
                JobStatus::Succeeded,
                JobResultExpiring,
            )
        };
        assert_eq!(fan_out(&endpoints, &expiring, now), Fanout::default());
    }

    /// Owners' endpoints as a table holds them, counting the reads of each owner's; while
    /// `down`, every read fails.
    #[derive(Debug, Default)]
    struct Table {
        endpoints: Mutex<HashMap<Owner, Vec<EndpointRecord>>>,
        reads: Mutex<Vec<Owner>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl Table {
        fn put(&self, owner: &Owner, events: &[EndpointEvent]) -> EndpointRecord {
            let record = EndpointRecord {
                owner: owner.clone(),
                ..endpoint(events, EndpointStatus::Enabled)
            };
            self.endpoints.lock().unwrap().entry(owner.clone()).or_default().push(record.clone());
            record
        }

        fn reads_of(&self, owner: &Owner) -> usize {
            self.reads.lock().unwrap().iter().filter(|o| *o == owner).count()
        }
    }

    #[async_trait::async_trait]
    impl crate::ports::Warm for Table {}

    #[async_trait::async_trait]
    impl EndpointStore for Table {
        async fn create_endpoint(&self, _: &EndpointRecord, _: u32) -> Result<bool, StoreError> {
            unreachable!("the cache only reads")
        }
        async fn endpoint(
            &self,
            _: &Owner,
            _: &EndpointId,
        ) -> Result<Option<EndpointRecord>, StoreError> {
            unreachable!("the cache reads an owner's endpoints")
        }
        async fn endpoints(&self, owner: &Owner) -> Result<Vec<EndpointRecord>, StoreError> {
            self.reads.lock().unwrap().push(owner.clone());
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Corrupt { key: owner.to_string(), reason: "down".into() });
            }
            Ok(self.endpoints.lock().unwrap().get(owner).cloned().unwrap_or_default())
        }
        async fn replace_endpoint_spec(
            &self,
            _: &EndpointRecord,
            _: u64,
        ) -> Result<bool, StoreError> {
            unreachable!("the cache only reads")
        }
        async fn enable_endpoint(
            &self,
            _: &Owner,
            _: &EndpointId,
            _: Timestamp,
        ) -> Result<Option<EndpointRecord>, StoreError> {
            unreachable!("the cache only reads")
        }
        async fn delete_endpoint(&self, _: &Owner, _: &EndpointId) -> Result<bool, StoreError> {
            unreachable!("the cache only reads")
        }
    }

    fn ids(endpoints: &[EndpointRecord]) -> Vec<EndpointId> {
        endpoints.iter().map(|e| e.endpoint_id.clone()).collect()
    }

    #[tokio::test]
    async fn an_owners_endpoints_are_read_once_per_ttl_and_a_change_shows_after_it() {
        use EndpointEvent::*;
        let table = Table::default();
        let (alice, bob): (Owner, Owner) = ("alice".parse().unwrap(), "bob".parse().unwrap());
        let first = table.put(&alice, &[JobSucceeded]);
        let bobs = table.put(&bob, &[JobFailed]);
        let cache = EndpointCache::new(Duration::from_secs(10), 16);
        let t0 = Instant::now();

        let read = cache.endpoints(&table, &alice, t0).await.unwrap();
        assert_eq!(ids(&read), std::slice::from_ref(&first.endpoint_id));
        // A change within the ttl is not seen, and the table is not read again.
        let second = table.put(&alice, &[JobProgress]);
        let within = t0 + Duration::from_millis(9_999);
        let cached = cache.endpoints(&table, &alice, within).await.unwrap();
        assert!(Arc::ptr_eq(&read, &cached), "the same read");
        assert_eq!(table.reads_of(&alice), 1);
        // Another owner's endpoints are their own read.
        assert_eq!(ids(&cache.endpoints(&table, &bob, within).await.unwrap()), [bobs.endpoint_id]);
        assert_eq!(table.reads_of(&bob), 1);
        // At the ttl, read again: the change shows.
        let fresh = cache.endpoints(&table, &alice, t0 + Duration::from_secs(10)).await.unwrap();
        assert_eq!(ids(&fresh), [first.endpoint_id.clone(), second.endpoint_id.clone()]);
        assert_eq!(table.reads_of(&alice), 2);
        // An instant before the one read at (another sandbox thread's clock) is still fresh.
        cache.endpoints(&table, &alice, t0).await.unwrap();
        assert_eq!(table.reads_of(&alice), 2);
    }

    #[tokio::test]
    async fn a_zero_ttl_reads_every_time_and_a_failed_read_is_not_kept() {
        let table = Table::default();
        let alice: Owner = "alice".parse().unwrap();
        table.put(&alice, &[EndpointEvent::JobSucceeded]);
        let t0 = Instant::now();
        let uncached = EndpointCache::new(Duration::ZERO, 16);
        for _ in 0..3 {
            assert_eq!(uncached.endpoints(&table, &alice, t0).await.unwrap().len(), 1);
        }
        assert_eq!(table.reads_of(&alice), 3);

        let cache = EndpointCache::new(Duration::from_secs(10), 16);
        table.down.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(cache.endpoints(&table, &alice, t0).await.is_err());
        table.down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(cache.endpoints(&table, &alice, t0).await.unwrap().len(), 1, "read again");
        assert_eq!(table.reads_of(&alice), 5);
    }

    #[tokio::test]
    async fn a_full_cache_still_answers_each_owner_with_its_own_endpoints() {
        let table = Table::default();
        let owners: Vec<Owner> = (0..5).map(|n| format!("owner-{n}").parse().unwrap()).collect();
        let mine: Vec<EndpointId> =
            owners.iter().map(|o| table.put(o, &[EndpointEvent::JobFailed]).endpoint_id).collect();
        let cache = EndpointCache::new(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        for round in 0..3u64 {
            let at = t0 + Duration::from_secs(round);
            for (owner, id) in owners.iter().zip(&mine) {
                let read = cache.endpoints(&table, owner, at).await.unwrap();
                assert_eq!(ids(&read), std::slice::from_ref(id), "{owner} in round {round}");
            }
        }
        // Two owners fit: cycling through five, each read finds its owner evicted.
        assert!(owners.iter().all(|o| table.reads_of(o) >= 2), "{:?}", table.reads.lock());
    }
}
