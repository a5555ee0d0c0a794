//! The endpoints' contract ([`EndpointStore`], [`EndpointHealth`], [`EndpointDeliveries`],
//! [`ProgressWindows`]), as the webhooks API, the notifier and the deliverer rely on it: an
//! endpoint is its owner's alone and the per-owner cap holds; a spec change is refused when
//! the endpoint changed since it was read, and leaves status and health as they are; a
//! failing run keeps its start, a disablement is made once and `enable` clears it; a
//! delivery's later writes keep its creation and drop what they lack; deliveries page newest
//! first to the end; a failed delivery is re-queued once; a job's progress window opens once
//! until it lapses.

use std::time::Duration;

use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord, ListError, delivery_sk};
use longhaul_aws::ports::{EndpointDeliveries, EndpointHealth, EndpointStore, ProgressWindows};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, EndpointSpec, EndpointStatus,
    endpoint_message_id,
};
use longhaul_domain::{JobId, Owner, Timestamp};

use super::fresh_owner;

/// Every endpoint port, as the contract exercises them together.
pub trait EndpointTable:
    EndpointStore + EndpointHealth + EndpointDeliveries + ProgressWindows
{
}

impl<T> EndpointTable for T where
    T: EndpointStore + EndpointHealth + EndpointDeliveries + ProgressWindows
{
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn endpoint_table(store: &impl EndpointTable) {
    endpoints_are_their_owners_and_capped(store).await;
    a_spec_change_is_conditional_and_keeps_status_and_health(store).await;
    health_is_recorded_once_and_enable_clears_it(store).await;
    a_delivery_keeps_its_creation_and_drops_what_a_write_lacks(store).await;
    deliveries_page_newest_first_to_the_end(store).await;
    a_failed_delivery_is_requeued_once(store).await;
    a_lost_pending_delivery_is_requeued_once_it_went_quiet(store).await;
    a_progress_window_opens_once_until_it_lapses(store).await;
}

/// `now` moved on by `seconds`.
fn later(now: Timestamp, seconds: u64) -> Timestamp {
    Timestamp::from(now.as_datetime() + Duration::from_secs(seconds))
}

fn record(owner: &Owner, events: &[EndpointEvent]) -> EndpointRecord {
    EndpointRecord::new(
        owner.clone(),
        EndpointSpec {
            url: "https://example.com/hooks".into(),
            events: events.iter().copied().collect(),
            description: Some("contract".into()),
        },
        Timestamp::now(),
    )
}

async fn read(store: &impl EndpointTable, owner: &Owner, id: &EndpointId) -> EndpointRecord {
    store.endpoint(owner, id).await.expect("read").expect("the endpoint is there")
}

async fn endpoints_are_their_owners_and_capped(store: &impl EndpointTable) {
    let owner = fresh_owner("endpoints");
    let other = fresh_owner("endpoints-other");
    assert_eq!(store.endpoints(&owner).await.expect("list"), vec![], "none before the first");

    let first = record(&owner, &[EndpointEvent::JobFailed]);
    assert!(store.create_endpoint(&first, 3).await.expect("create"), "under the cap");
    assert_eq!(read(store, &owner, &first.endpoint_id).await, first, "read back as written");
    assert_eq!(
        store.endpoint(&other, &first.endpoint_id).await.expect("read as another"),
        None,
        "another owner's endpoint reads as none"
    );
    assert_eq!(store.endpoint(&owner, &EndpointId::new()).await.expect("read"), None);

    // The cap: three fit, the fourth is refused and not written; caps are per owner.
    let second = record(&owner, &EndpointEvent::ALL);
    let third = record(&owner, &[EndpointEvent::JobProgress]);
    assert!(store.create_endpoint(&second, 3).await.expect("create"));
    assert!(store.create_endpoint(&third, 3).await.expect("create"));
    let fourth = record(&owner, &[EndpointEvent::JobSucceeded]);
    assert!(!store.create_endpoint(&fourth, 3).await.expect("create"), "over the cap");
    assert_eq!(store.endpoint(&owner, &fourth.endpoint_id).await.expect("read"), None);
    let theirs = record(&other, &[EndpointEvent::JobSucceeded]);
    assert!(store.create_endpoint(&theirs, 3).await.expect("create"), "caps are per owner");

    assert_eq!(
        store.endpoints(&owner).await.expect("list"),
        vec![first.clone(), second.clone(), third.clone()],
        "the owner's endpoints, whole, oldest first, and no one else's"
    );

    // Deleted once; the cap counts it no more.
    assert!(store.delete_endpoint(&owner, &third.endpoint_id).await.expect("delete"));
    assert!(!store.delete_endpoint(&owner, &third.endpoint_id).await.expect("delete again"));
    assert_eq!(store.endpoint(&owner, &third.endpoint_id).await.expect("read"), None);
    assert!(
        !store.delete_endpoint(&other, &first.endpoint_id).await.expect("delete as another"),
        "another owner cannot delete it"
    );
    assert_eq!(read(store, &owner, &first.endpoint_id).await, first, "and it is still there");
    assert!(store.create_endpoint(&fourth, 3).await.expect("create"), "a freed place");
}

async fn a_spec_change_is_conditional_and_keeps_status_and_health(store: &impl EndpointTable) {
    let owner = fresh_owner("endpoint-spec");
    let endpoint = record(&owner, &[EndpointEvent::JobFailed]);
    assert!(store.create_endpoint(&endpoint, 20).await.expect("create"));
    let id = &endpoint.endpoint_id;
    let since = later(endpoint.created_at, 1);
    store.mark_failing(&owner, id, since).await.expect("mark failing");
    let at = later(endpoint.created_at, 2);
    assert!(
        store.disable_endpoint(&owner, id, DisabledReason::Failing, None, at).await.expect("off")
    );

    let mut changed = endpoint.clone();
    changed.spec = EndpointSpec {
        url: "https://example.org/elsewhere".into(),
        events: [EndpointEvent::JobSucceeded, EndpointEvent::JobResultExpiring].into(),
        description: None,
    };
    changed.updated_at = later(endpoint.created_at, 3);
    changed.version = 2;
    assert!(store.replace_endpoint_spec(&changed, 1).await.expect("write"), "over its version");
    let stored = read(store, &owner, id).await;
    assert_eq!(stored.spec, changed.spec, "the spec is written, its description removed");
    assert_eq!((stored.updated_at, stored.version), (changed.updated_at, 2));
    assert_eq!(
        (stored.status, stored.disabled_reason, stored.disabled_at, stored.failing_since),
        (EndpointStatus::Disabled, Some(DisabledReason::Failing), Some(at), Some(since)),
        "status and health stay as they were"
    );
    assert_eq!((stored.created_at, &stored.owner), (endpoint.created_at, &owner));

    let mut stale = endpoint.clone();
    stale.spec.url = "https://example.net/stale".into();
    stale.version = 2;
    assert!(
        !store.replace_endpoint_spec(&stale, 1).await.expect("write"),
        "a write from a stale read is refused"
    );
    assert_eq!(read(store, &owner, id).await, stored, "and changes nothing");

    let mut gone = record(&owner, &[EndpointEvent::JobFailed]);
    gone.version = 2;
    assert!(
        !store.replace_endpoint_spec(&gone, 1).await.expect("write"),
        "a write of an endpoint that is not there is refused"
    );
    assert_eq!(store.endpoint(&owner, &gone.endpoint_id).await.expect("read"), None);
}

async fn health_is_recorded_once_and_enable_clears_it(store: &impl EndpointTable) {
    let owner = fresh_owner("endpoint-health");
    let endpoint = record(&owner, &[EndpointEvent::JobFailed]);
    assert!(store.create_endpoint(&endpoint, 20).await.expect("create"));
    let id = &endpoint.endpoint_id;
    let t = |seconds| later(endpoint.created_at, seconds);

    // A failing run keeps its first failure; a success ends it.
    store.mark_failing(&owner, id, t(10)).await.expect("mark failing");
    store.mark_failing(&owner, id, t(20)).await.expect("mark failing again");
    assert_eq!(read(store, &owner, id).await.failing_since, Some(t(10)), "the first stands");
    store.mark_recovered(&owner, id).await.expect("recovered");
    let recovered = read(store, &owner, id).await;
    assert_eq!(recovered.failing_since, None, "a success ends the run");
    store.mark_recovered(&owner, id).await.expect("recovered when not failing is no error");
    assert_eq!(read(store, &owner, id).await, recovered, "and changes nothing");
    store.mark_failing(&owner, id, t(30)).await.expect("a new run");
    assert_eq!(read(store, &owner, id).await.failing_since, Some(t(30)), "a new run, a new start");

    // A disablement for failing holds only for the run of failures its attempt read.
    assert!(
        !store
            .disable_endpoint(&owner, id, DisabledReason::Failing, Some(t(10)), t(35))
            .await
            .expect("off"),
        "a run that has ended since is no reason"
    );
    assert_eq!(read(store, &owner, id).await.status, EndpointStatus::Enabled);

    // Disabled once: the second disablement neither counts nor changes the reason.
    assert!(
        store.disable_endpoint(&owner, id, DisabledReason::Gone, None, t(40)).await.expect("off")
    );
    assert!(
        !store
            .disable_endpoint(&owner, id, DisabledReason::Failing, None, t(50))
            .await
            .expect("off"),
        "an endpoint is disabled once"
    );
    let disabled = read(store, &owner, id).await;
    assert_eq!(
        (disabled.status, disabled.disabled_reason, disabled.disabled_at, disabled.updated_at),
        (EndpointStatus::Disabled, Some(DisabledReason::Gone), Some(t(40)), t(40))
    );
    assert_eq!((disabled.spec, disabled.version), (endpoint.spec.clone(), endpoint.version));

    // Enabling clears the disablement and the failing run, and returns the record after.
    let enabled =
        store.enable_endpoint(&owner, id, t(60)).await.expect("enable").expect("it is there");
    assert_eq!(enabled, read(store, &owner, id).await, "the record after, as stored");
    assert_eq!(
        (enabled.status, enabled.disabled_reason, enabled.disabled_at, enabled.failing_since),
        (EndpointStatus::Enabled, None, None, None)
    );
    assert_eq!(enabled.updated_at, t(60));
    assert_eq!((enabled.spec, enabled.version), (endpoint.spec.clone(), endpoint.version));
    assert!(
        !store
            .disable_endpoint(&owner, id, DisabledReason::Failing, Some(t(30)), t(65))
            .await
            .expect("off"),
        "enabling ended the run the disablement read"
    );
    store.mark_failing(&owner, id, t(66)).await.expect("a new run");
    assert!(
        store
            .disable_endpoint(&owner, id, DisabledReason::Failing, Some(t(66)), t(70))
            .await
            .expect("off"),
        "once enabled, it can be disabled again, for the run that stands"
    );

    // Another owner's id, or none at all: nothing happens, and nothing is created.
    let other = fresh_owner("endpoint-health-other");
    store.mark_failing(&other, id, t(80)).await.expect("mark another's failing");
    store.mark_recovered(&other, id).await.expect("recover another's");
    assert!(
        !store.disable_endpoint(&other, id, DisabledReason::Gone, None, t(80)).await.expect("off")
    );
    assert_eq!(store.enable_endpoint(&other, id, t(80)).await.expect("enable"), None);
    assert_eq!(store.endpoint(&other, id).await.expect("read"), None, "nothing created");
    let missing = EndpointId::new();
    store.mark_failing(&owner, &missing, t(80)).await.expect("mark a missing one failing");
    assert_eq!(store.endpoint(&owner, &missing).await.expect("read"), None, "nothing created");
}

fn delivery(
    endpoint: &EndpointId,
    job: &JobId,
    event: EndpointEvent,
    status: DeliveryStatus,
    created_at: Timestamp,
) -> EndpointDelivery {
    EndpointDelivery {
        webhook_id: endpoint_message_id(endpoint, job, event, None),
        endpoint_id: endpoint.clone(),
        job_id: job.clone(),
        event,
        status,
        attempts: 0,
        created_at,
        last_attempt_at: None,
        status_code: None,
        latency_ms: None,
        error: None,
        progress_seq: None,
        result_expires_at: None,
    }
}

async fn a_delivery_keeps_its_creation_and_drops_what_a_write_lacks(store: &impl EndpointTable) {
    let (endpoint, job) = (EndpointId::new(), JobId::new());
    let event = EndpointEvent::JobFailed;
    assert_eq!(store.endpoint_delivery(&endpoint, &job, event).await.expect("read"), None);
    let created = Timestamp::now();
    let queued = delivery(&endpoint, &job, event, DeliveryStatus::Pending, created);
    store.record_endpoint_delivery(&queued).await.expect("record");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        Some(queued.clone()),
        "read back as written"
    );

    let failed = EndpointDelivery {
        status: DeliveryStatus::Failed,
        attempts: 1,
        created_at: later(created, 10),
        last_attempt_at: Some(later(created, 10)),
        status_code: Some(503),
        latency_ms: Some(250),
        error: Some("503 Service Unavailable".into()),
        ..queued.clone()
    };
    store.record_endpoint_delivery(&failed).await.expect("record an attempt");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        Some(EndpointDelivery { created_at: created, ..failed.clone() }),
        "each write overwrites the record, but its creation stays"
    );

    let delivered = EndpointDelivery {
        status: DeliveryStatus::Delivered,
        attempts: 2,
        created_at: later(created, 20),
        last_attempt_at: Some(later(created, 20)),
        status_code: Some(204),
        latency_ms: Some(80),
        error: None,
        ..queued.clone()
    };
    store.record_endpoint_delivery(&delivered).await.expect("record a success");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        Some(EndpointDelivery { created_at: created, ..delivered.clone() }),
        "what a later write lacks (the error) is gone"
    );

    // Progress: the latest of the job's progress events is its one record.
    let progress = EndpointEvent::JobProgress;
    for seq in [3, 4] {
        let mut sent = delivery(&endpoint, &job, progress, DeliveryStatus::Delivered, created);
        sent.webhook_id = endpoint_message_id(&endpoint, &job, progress, Some(seq));
        sent.progress_seq = Some(seq);
        store.record_endpoint_delivery(&sent).await.expect("record progress");
    }
    let latest = store.endpoint_delivery(&endpoint, &job, progress).await.expect("read");
    assert_eq!(latest.and_then(|d| d.progress_seq), Some(4), "the latest progress");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read").map(|d| d.status),
        Some(DeliveryStatus::Delivered),
        "one record per event: another event's record is another"
    );
}

async fn deliveries_page_newest_first_to_the_end(store: &impl EndpointTable) {
    let endpoint = EndpointId::new();
    let now = Timestamp::now();
    let jobs: Vec<JobId> = (0..4).map(|_| JobId::new()).collect();
    let records = [
        (&jobs[0], EndpointEvent::JobSucceeded, DeliveryStatus::Delivered),
        (&jobs[0], EndpointEvent::JobResultExpiring, DeliveryStatus::Failed),
        (&jobs[1], EndpointEvent::JobFailed, DeliveryStatus::Failed),
        (&jobs[2], EndpointEvent::JobProgress, DeliveryStatus::Pending),
        (&jobs[2], EndpointEvent::JobCancelled, DeliveryStatus::Delivered),
        (&jobs[3], EndpointEvent::JobSucceeded, DeliveryStatus::Failed),
    ];
    let mut all = Vec::new();
    for (job, event, status) in records {
        let record = delivery(&endpoint, job, event, status, now);
        store.record_endpoint_delivery(&record).await.expect("record");
        all.push(record);
    }
    // Another endpoint's delivery of the same job is not listed.
    let elsewhere = delivery(
        &EndpointId::new(),
        &jobs[3],
        EndpointEvent::JobFailed,
        DeliveryStatus::Failed,
        now,
    );
    store.record_endpoint_delivery(&elsewhere).await.expect("record");
    // Newest job first (job ids are UUIDv7); within a job, by event name, last first.
    all.sort_by_key(|d| std::cmp::Reverse(delivery_sk(&d.job_id, d.event)));
    assert_eq!(all[0].job_id, jobs[3], "the newest job first");

    for status in [None, Some(DeliveryStatus::Failed), Some(DeliveryStatus::Pending)] {
        for limit in [1, 2, 100] {
            let mut listed = Vec::new();
            let mut after: Option<String> = None;
            for page in 0.. {
                assert!(page <= all.len(), "the pages end ({status:?}, {limit})");
                let page = store
                    .endpoint_deliveries(&endpoint, status, limit, after.as_deref())
                    .await
                    .expect("list");
                assert!(page.deliveries.len() <= limit as usize, "a page holds at most its limit");
                listed.extend(page.deliveries);
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            let expected: Vec<_> =
                all.iter().filter(|d| status.is_none_or(|s| d.status == s)).cloned().collect();
            assert_eq!(listed, expected, "each delivery once, newest first ({status:?}, {limit})");
        }
    }

    let page = store.endpoint_deliveries(&endpoint, None, 0, None).await.expect("list");
    assert_eq!(page.deliveries, all[..1], "a limit of 0 reads as 1");
    for bad in ["garbage", "ENDPOINT#x", &format!("{}#job.exploded", jobs[0]), ""] {
        assert!(
            matches!(
                store.endpoint_deliveries(&endpoint, None, 10, Some(bad)).await,
                Err(ListError::InvalidCursor)
            ),
            "a position this store did not give is an invalid cursor: {bad:?}"
        );
    }
    let empty = store.endpoint_deliveries(&EndpointId::new(), None, 10, None).await.expect("list");
    assert_eq!((empty.deliveries, empty.next), (vec![], None), "an endpoint without deliveries");
}

/// A `pending` delivery moves only if it was neither recorded, attempted nor queued again
/// since the quiet time given; moving it counts as queueing it again.
async fn a_lost_pending_delivery_is_requeued_once_it_went_quiet(store: &impl EndpointTable) {
    let (endpoint, job) = (EndpointId::new(), JobId::new());
    let event = EndpointEvent::JobFailed;
    let at = |s: &str| -> Timestamp { s.parse().unwrap() };
    let requeue = async |now: &str, quiet: &str| {
        let (from, now, quiet) = (DeliveryStatus::Pending, at(now), at(quiet));
        store.requeue_delivery(&endpoint, &job, event, from, now, quiet).await.expect("requeue")
    };
    let created = at("2026-11-20T10:00:00.000Z");
    let pending = EndpointDelivery {
        attempts: 3,
        last_attempt_at: Some(at("2026-11-20T12:00:00.000Z")),
        ..delivery(&endpoint, &job, event, DeliveryStatus::Pending, created)
    };
    store.record_endpoint_delivery(&pending).await.expect("record");
    assert!(
        !requeue("2026-11-20T13:00:00.000Z", "2026-11-20T11:00:00.000Z").await,
        "attempted after the quiet time"
    );
    assert!(requeue("2026-11-21T13:00:00.000Z", "2026-11-21T02:00:00.000Z").await, "gone quiet");
    assert!(
        !requeue("2026-11-21T13:00:01.000Z", "2026-11-21T02:00:00.000Z").await,
        "of two resends, one moves it: it was queued again since"
    );
    // A record written — here put back as it was read, after the queue refused the message —
    // ends the requeue's claim: the next resend may take it at once.
    store.record_endpoint_delivery(&pending).await.expect("record");
    assert!(requeue("2026-11-21T13:00:02.000Z", "2026-11-21T02:00:00.000Z").await, "put back");
    assert!(
        requeue("2026-11-22T13:00:00.000Z", "2026-11-22T02:00:00.000Z").await,
        "quiet again since it was queued"
    );
    let failed = EndpointDelivery { status: DeliveryStatus::Failed, ..pending };
    store.record_endpoint_delivery(&failed).await.expect("record");
    assert!(
        !requeue("2026-11-23T13:00:00.000Z", "2026-11-23T02:00:00.000Z").await,
        "only a pending one moves from pending"
    );
}

async fn a_failed_delivery_is_requeued_once(store: &impl EndpointTable) {
    let (endpoint, job) = (EndpointId::new(), JobId::new());
    let now = Timestamp::now();
    let event = EndpointEvent::JobSucceeded;
    let requeue = async |from| {
        store.requeue_delivery(&endpoint, &job, event, from, now, now).await.expect("requeue")
    };
    assert!(!requeue(DeliveryStatus::Failed).await, "there is nothing to requeue");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        None,
        "and nothing is created"
    );
    let delivered = delivery(&endpoint, &job, event, DeliveryStatus::Delivered, now);
    store.record_endpoint_delivery(&delivered).await.expect("record");
    assert!(!requeue(DeliveryStatus::Failed).await, "a delivered one is not requeued from failed");
    let failed = EndpointDelivery {
        status: DeliveryStatus::Failed,
        attempts: 8,
        error: Some("timed out".into()),
        ..delivered.clone()
    };
    store.record_endpoint_delivery(&failed).await.expect("record");
    assert!(requeue(DeliveryStatus::Failed).await);
    assert!(!requeue(DeliveryStatus::Failed).await, "of two requeues, one moves it");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        Some(EndpointDelivery { status: DeliveryStatus::Pending, ..failed }),
        "pending, the rest as it was"
    );

    // A resend moves a delivered one, once.
    store.record_endpoint_delivery(&delivered).await.expect("record");
    assert!(requeue(DeliveryStatus::Delivered).await);
    assert!(!requeue(DeliveryStatus::Delivered).await, "of two resends, one moves it");
    assert_eq!(
        store.endpoint_delivery(&endpoint, &job, event).await.expect("read"),
        Some(EndpointDelivery { status: DeliveryStatus::Pending, ..delivered }),
    );
}

async fn a_progress_window_opens_once_until_it_lapses(store: &impl EndpointTable) {
    let job = JobId::new();
    let now = Timestamp::now();
    let t = |seconds| later(now, seconds);
    assert!(store.open_progress_window(&job, t(0), t(5)).await.expect("open"), "the first");
    assert!(
        !store.open_progress_window(&job, t(1), t(6)).await.expect("open"),
        "not while one is open"
    );
    assert!(
        !store.open_progress_window(&job, t(4), t(9)).await.expect("open"),
        "not while one is open"
    );
    assert!(
        store.open_progress_window(&job, t(5), t(10)).await.expect("open"),
        "again once it lapsed (its end is now)"
    );
    assert!(
        !store.open_progress_window(&job, t(9), t(14)).await.expect("open"),
        "the new window holds until its own end"
    );
    assert!(store.open_progress_window(&job, t(60), t(65)).await.expect("open"), "long after");
    assert!(
        store.open_progress_window(&JobId::new(), t(1), t(6)).await.expect("open"),
        "each job has its own window"
    );

    // The trailing event of a window: claimed once, due at the window's end, which moves on.
    let job = JobId::new();
    let five = std::time::Duration::from_secs(5);
    assert_eq!(
        store.claim_trailing_event(&job, t(0), five).await.expect("claim"),
        None,
        "no window"
    );
    assert!(store.open_progress_window(&job, t(0), t(5)).await.expect("open"));
    assert_eq!(store.claim_trailing_event(&job, t(1), five).await.expect("claim"), Some(t(5)));
    assert_eq!(
        store.claim_trailing_event(&job, t(2), five).await.expect("claim"),
        None,
        "claimed already"
    );
    assert!(
        !store.open_progress_window(&job, t(6), t(11)).await.expect("open"),
        "the window was extended for its trailing event"
    );
    assert_eq!(
        store.claim_trailing_event(&job, t(7), five).await.expect("claim"),
        Some(t(10)),
        "once the trailing event is due, the extension's own trailing event"
    );
    assert_eq!(
        store.claim_trailing_event(&job, t(8), five).await.expect("claim"),
        None,
        "one trailing event per window"
    );
    assert!(store.open_progress_window(&job, t(15), t(20)).await.expect("open"), "then anew");
    assert_eq!(
        store.claim_trailing_event(&job, t(16), five).await.expect("claim"),
        Some(t(20)),
        "the new window has its own trailing event"
    );
    assert_eq!(
        store.claim_trailing_event(&job, t(25), five).await.expect("claim"),
        None,
        "not once the window is over"
    );
}
