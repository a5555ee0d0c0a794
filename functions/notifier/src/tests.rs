//! The record reader's cases, and the handler over in-memory queues: every path (an end with a
//! callback queued, every other change ignored, batches of ten), and every refusal (a queue
//! that refuses some entries or the whole request, unreadable records, a dead-letter queue
//! that is down) — each ending with every end queued, dead-lettered or named for the retry.

use std::collections::HashSet;
use std::sync::Mutex;

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::endpoint_events::DISABLED_ERROR;
use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord, PROGRESS_SK};
use longhaul_aws::ports::Warm;
use longhaul_domain::JobId;
use longhaul_domain::endpoints::{DeliveryStatus, EndpointEvent, EndpointId, endpoint_message_id};
use longhaul_memory::{ManualClock, MemoryDeadLetters, MemoryEndpoints, MemoryWebhookQueue, owner};

use super::*;
use serde_json::{Value, json};

/// The sample in `events/` (a job's move from `running` to `succeeded`), changed by `edit`.
fn record(edit: impl FnOnce(&mut Value)) -> EventRecord {
    let text = include_str!("../../../events/notifier.json");
    let mut event: Value = serde_json::from_str(text).unwrap();
    let mut record = event["Records"][0].take();
    edit(&mut record);
    serde_json::from_value(record).unwrap()
}

/// The end `record` reads as.
fn ended(record: &EventRecord) -> Result<Option<Ended>, RecordError> {
    Ok(change(record)?.map(|change| match change {
        Change::Ended(ended) => ended,
        other => panic!("not an end: {other:?}"),
    }))
}

#[test]
fn a_job_moving_into_a_terminal_status_is_an_end() {
    let end = ended(&record(|_| {})).unwrap().unwrap();
    assert_eq!(
        end,
        Ended {
            job_id: "01a201ea-fb15-7355-87ef-3777d21385c6".parse().unwrap(),
            owner: "alice".parse().unwrap(),
            status: JobStatus::Succeeded,
            attempt: 1,
            callback: true,
        }
    );
    for status in ["failed", "cancelled"] {
        let end = ended(&record(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!(status)))
            .unwrap()
            .unwrap();
        assert_eq!(end.status.as_str(), status);
    }
    let no_callback =
        record(|r| drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url")));
    let end = ended(&no_callback).unwrap().unwrap();
    assert!(!end.callback, "an end without a callback is still an end (for endpoints)");
}

/// A named change to the sample record.
type Case = (&'static str, Box<dyn FnOnce(&mut Value)>);

#[test]
fn every_other_change_is_not_an_end() {
    let cases: [Case; 5] = [
        (
            "still running",
            Box::new(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("running")),
        ),
        (
            "already ended",
            Box::new(|r| r["dynamodb"]["OldImage"]["status"]["S"] = json!("cancelled")),
        ),
        (
            "expired",
            Box::new(|r| {
                r["dynamodb"]["OldImage"]["status"]["S"] = json!("succeeded");
                r["dynamodb"]["NewImage"]["status"]["S"] = json!("expired");
            }),
        ),
        ("an insert", Box::new(|r| r["eventName"] = json!("INSERT"))),
        ("another item", Box::new(|r| r["dynamodb"]["Keys"]["sk"]["S"] = json!("PROGRESS"))),
    ];
    for (case, edit) in cases {
        assert_eq!(ended(&record(edit)).unwrap(), None, "{case}");
    }
}

#[test]
fn a_stream_without_old_images_or_an_unreadable_image_is_an_error() {
    let no_old = record(|r| drop(r["dynamodb"].as_object_mut().unwrap().remove("OldImage")));
    assert!(matches!(change(&no_old), Err(RecordError::NoOldImage)));
    let unreadable = record(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("on-fire"));
    assert!(matches!(change(&unreadable), Err(RecordError::Unreadable(_))));
}

#[test]
fn the_failure_names_the_record_to_resume_from() {
    let response = failure_at(&record(|_| {}));
    assert_eq!(response.batch_item_failures.len(), 1);
    assert_eq!(
        response.batch_item_failures[0].item_identifier.as_deref(),
        Some("1100000000017454423010")
    );
}

// The handler.

/// The webhook queue as SQS answers `SendMessageBatch`: at most ten entries a request (more is
/// a bug, as the SDK's request would be refused), each accepted or refused on its own. Entries
/// of the jobs in `refused` are refused; the rest go to the in-memory queue, whose outage fails
/// the whole request.
#[derive(Debug, Default)]
struct Sqs {
    queue: MemoryWebhookQueue,
    refused: Mutex<HashSet<JobId>>,
    /// The size of each batch request.
    batches: Mutex<Vec<usize>>,
}

impl Sqs {
    fn refuse(&self, job_id: &JobId) {
        self.refused.lock().unwrap().insert(job_id.clone());
    }

    fn accept_all(&self) {
        self.refused.lock().unwrap().clear();
    }

    /// The jobs whose first delivery was queued, in order.
    fn queued(&self) -> Vec<JobId> {
        self.queue
            .sent()
            .into_iter()
            .map(|(message, delay)| {
                assert_eq!(
                    (message.attempt, message.not_before, delay),
                    (1, 0, 0),
                    "a first attempt, now"
                );
                message.job_id
            })
            .collect()
    }
}

#[async_trait]
impl Warm for Sqs {}

#[async_trait]
impl WebhookDispatch for Sqs {
    async fn send(&self, _: &WebhookMessage, _: u64) -> Result<(), AwsError> {
        panic!("the notifier queues in batches")
    }

    async fn send_batch(&self, messages: &[WebhookMessage]) -> Result<Vec<bool>, AwsError> {
        assert!((1..=10).contains(&messages.len()), "SQS takes 1 … 10 entries: {}", messages.len());
        self.batches.lock().unwrap().push(messages.len());
        let refused = self.refused.lock().unwrap().clone();
        let accepted: Vec<WebhookMessage> =
            messages.iter().filter(|m| !refused.contains(&m.job_id)).cloned().collect();
        self.queue.send_batch(&accepted).await?;
        Ok(messages.iter().map(|m| !refused.contains(&m.job_id)).collect())
    }
}

struct World {
    sqs: Arc<Sqs>,
    dead_letters: Arc<MemoryDeadLetters>,
    endpoints: Arc<MemoryEndpoints>,
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world() -> World {
    let sqs = Arc::new(Sqs::default());
    let dead_letters = Arc::new(MemoryDeadLetters::new());
    let endpoints = Arc::new(MemoryEndpoints::new());
    let clock = Arc::new(ManualClock::new());
    let deps = Deps {
        webhooks: sqs.clone(),
        dead_letters: dead_letters.clone(),
        endpoints: endpoints.clone(),
        clock: clock.clone(),
        cache: Arc::new(EndpointCache::new(Duration::ZERO, 16)),
    };
    World { sqs, dead_letters, endpoints, clock, deps }
}

/// The owner of the sample's jobs.
fn alice() -> longhaul_domain::Owner {
    "alice".parse().unwrap()
}

/// Job `n`'s id.
fn job(n: u64) -> JobId {
    format!("01a201ea-fb15-7355-87ef-{n:012}").parse().unwrap()
}

/// Stream record `n`: job `n` moving from `running` to `status`, with a callback, changed by
/// `edit`.
fn end(n: u64, status: &str, edit: impl FnOnce(&mut Value)) -> EventRecord {
    record(|r| {
        r["dynamodb"]["SequenceNumber"] = json!(format!("{n}"));
        for image in ["NewImage", "OldImage"] {
            r["dynamodb"][image]["job_id"]["S"] = json!(job(n));
        }
        r["dynamodb"]["NewImage"]["status"]["S"] = json!(status);
        edit(r);
    })
}

fn succeeded(n: u64) -> EventRecord {
    end(n, "succeeded", |_| {})
}

fn batch(records: Vec<EventRecord>) -> Event {
    let mut event = Event::default();
    event.records = records;
    event
}

/// The sequence numbers the response names (Lambda resumes the shard from the first).
fn failures(response: &DynamoDbEventResponse) -> Vec<String> {
    response.batch_item_failures.iter().map(|f| f.item_identifier.clone().unwrap()).collect()
}

#[tokio::test]
async fn a_job_that_ended_with_a_callback_gets_one_first_delivery() {
    let w = world();
    let response = handle(&w.deps, batch(vec![end(1, "failed", |_| {})])).await;
    assert!(failures(&response).is_empty());
    let sent = w.sqs.queue.sent();
    assert_eq!(sent, [(WebhookMessage::callback(job(1), JobStatus::Failed).of(&alice()), 0)]);
    assert!(w.dead_letters.kept().is_empty());
}

#[tokio::test]
async fn every_other_change_is_passed_over_and_the_ends_around_it_are_queued() {
    let w = world();
    let records = vec![
        succeeded(1),
        end(2, "succeeded", |r| {
            drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url"))
        }),
        end(3, "running", |r| r["dynamodb"]["OldImage"]["status"]["S"] = json!("queued")),
        end(4, "cancelled", |r| r["dynamodb"]["OldImage"]["status"]["S"] = json!("failed")),
        end(5, "succeeded", |r| r["eventName"] = json!("INSERT")),
        end(6, "succeeded", |r| r["dynamodb"]["Keys"]["sk"]["S"] = json!("PROGRESS")),
        end(7, "succeeded", |r| r["eventName"] = json!("REMOVE")),
        end(8, "cancelled", |_| {}),
    ];
    let response = handle(&w.deps, batch(records)).await;
    assert!(failures(&response).is_empty());
    assert_eq!(w.sqs.queued(), [job(1), job(8)], "only the ends with a callback, in order");
    assert_eq!(*w.sqs.batches.lock().unwrap(), [2], "in one request");
    assert!(w.dead_letters.kept().is_empty());
    // Nothing to queue at all: no request.
    let w = world();
    let response = handle(&w.deps, batch(vec![end(1, "running", |_| {})])).await;
    assert!(failures(&response).is_empty());
    assert!(w.sqs.batches.lock().unwrap().is_empty(), "no empty request");
    assert!(failures(&handle(&w.deps, batch(Vec::new())).await).is_empty());
}

#[tokio::test]
async fn ends_are_queued_ten_to_a_request_in_stream_order() {
    let w = world();
    let response = handle(&w.deps, batch((1..=25).map(succeeded).collect())).await;
    assert!(failures(&response).is_empty());
    assert_eq!(w.sqs.queued(), (1..=25).map(job).collect::<Vec<_>>());
    assert_eq!(*w.sqs.batches.lock().unwrap(), [10, 10, 5]);
}

#[tokio::test]
async fn an_entry_the_queue_refuses_is_where_the_stream_resumes_and_nothing_is_lost() {
    let w = world();
    let records: Vec<EventRecord> = (1..=14).map(succeeded).collect();
    w.sqs.refuse(&job(4));
    w.sqs.refuse(&job(7));
    let response = handle(&w.deps, batch(records.clone())).await;
    assert_eq!(failures(&response), ["4"], "the first refused record, and only it");
    // The rest of its request went in (a retry may queue them twice: receivers deduplicate by
    // webhook-id); the records after that request were not tried.
    let first = w.sqs.queued();
    let expected: Vec<JobId> = [1, 2, 3, 5, 6, 8, 9, 10].into_iter().map(job).collect();
    assert_eq!(first, expected);
    assert_eq!(*w.sqs.batches.lock().unwrap(), [10], "the batch stopped at the failed request");
    // Lambda retries from the named record: then every end has been queued at least once.
    w.sqs.accept_all();
    let retried = handle(&w.deps, batch(records[3..].to_vec())).await;
    assert!(failures(&retried).is_empty());
    let queued: HashSet<JobId> = w.sqs.queued().into_iter().collect();
    assert_eq!(queued, (1..=14).map(job).collect::<HashSet<_>>(), "no end is lost");
    assert!(w.dead_letters.kept().is_empty(), "a queue failure is retried, not dead-lettered");
}

#[tokio::test]
async fn a_failed_request_names_its_first_record_and_the_requests_before_it_stand() {
    let w = world();
    // The second request (records 11 … 12) fails whole: the first ten are queued.
    let records: Vec<EventRecord> = (1..=12).map(succeeded).collect();
    w.sqs.refuse(&job(11));
    w.sqs.refuse(&job(12));
    let response = handle(&w.deps, batch(records)).await;
    assert_eq!(failures(&response), ["11"]);
    assert_eq!(w.sqs.queued(), (1..=10).map(job).collect::<Vec<_>>());
    // An unreachable queue: the first end is named, even after a change that is passed over.
    let w = world();
    w.sqs.queue.set_unavailable(true);
    let records = vec![end(1, "running", |_| {}), succeeded(2), succeeded(3)];
    let response = handle(&w.deps, batch(records)).await;
    assert_eq!(failures(&response), ["2"]);
    assert!(w.sqs.queued().is_empty());
    assert!(w.dead_letters.kept().is_empty());
}

#[tokio::test]
async fn an_unreadable_record_is_dead_lettered_with_its_reason_and_the_rest_go_on() {
    let w = world();
    let records = vec![
        succeeded(1),
        end(2, "succeeded", |r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("on-fire")),
        end(3, "failed", |r| drop(r["dynamodb"].as_object_mut().unwrap().remove("OldImage"))),
        end(4, "succeeded", |r| {
            drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("owner"))
        }),
        succeeded(5),
    ];
    let response = handle(&w.deps, batch(records)).await;
    assert!(failures(&response).is_empty(), "no retry would read them");
    assert_eq!(w.sqs.queued(), [job(1), job(5)]);
    let kept = w.dead_letters.kept();
    assert_eq!(kept.len(), 3, "{kept:?}");
    for (letter, (sequence, reason)) in
        kept.iter().zip([("2", "cannot be read"), ("3", "no old image"), ("4", "cannot be read")])
    {
        assert_eq!(letter["record"]["dynamodb"]["SequenceNumber"], sequence, "the whole record");
        let text = letter["reason"].as_str().unwrap();
        assert!(text.contains(reason), "{sequence}: {text}");
    }
}

#[tokio::test]
async fn an_unreadable_record_the_dead_letter_queue_refuses_is_retried_after_the_ends_before_it() {
    let w = world();
    w.dead_letters.set_unavailable(true);
    let unreadable =
        end(3, "succeeded", |r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("on-fire"));
    let records = vec![succeeded(1), succeeded(2), unreadable.clone(), succeeded(4)];
    let response = handle(&w.deps, batch(records)).await;
    assert_eq!(failures(&response), ["3"], "resumed from the unreadable record");
    assert_eq!(w.sqs.queued(), [job(1), job(2)], "the ends before it were queued first");
    assert!(w.dead_letters.kept().is_empty());
    // And if one of those could not be queued either, the stream resumes from that one.
    let w = world();
    w.dead_letters.set_unavailable(true);
    w.sqs.refuse(&job(2));
    let records = vec![succeeded(1), succeeded(2), unreadable, succeeded(4)];
    let response = handle(&w.deps, batch(records)).await;
    assert_eq!(failures(&response), ["2"]);
    assert_eq!(w.sqs.queued(), [job(1)]);
}

// Endpoints.

/// A world whose owners' endpoints are kept for `cache` (the in-memory table counts how often
/// it lists them).
struct Counted {
    sqs: Arc<Sqs>,
    dead_letters: Arc<MemoryDeadLetters>,
    table: Arc<MemoryEndpoints>,
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn counted(cache: Duration) -> Counted {
    let w = world();
    let table = Arc::new(MemoryEndpoints::new());
    let deps =
        Deps { endpoints: table.clone(), cache: Arc::new(EndpointCache::new(cache, 16)), ..w.deps };
    Counted { sqs: w.sqs, dead_letters: w.dead_letters, table, clock: w.clock, deps }
}

/// Registers an endpoint of `owner_name` receiving `events` in `endpoints` (disabled, if
/// `disabled`).
fn subscribe(
    endpoints: &MemoryEndpoints,
    owner_name: &str,
    events: &[EndpointEvent],
    disabled: bool,
) -> EndpointRecord {
    endpoints.subscribe(&owner(owner_name), "https://hooks.example.com/longhaul", events, disabled)
}

/// The first attempts `w`'s queue was sent, with their delays.
fn sent(sqs: &Sqs) -> Vec<(WebhookMessage, u64)> {
    sqs.queue.sent()
}

/// The first attempt of the terminal event of job `n` to `endpoint`, at once.
fn to_endpoint(n: u64, status: JobStatus, endpoint: &EndpointRecord) -> WebhookMessage {
    let event = EndpointEvent::of_terminal(status).unwrap();
    WebhookMessage::to_endpoint(job(n), status, endpoint.endpoint_id.clone(), event, 0)
        .of(&endpoint.owner)
}

#[tokio::test]
async fn an_end_goes_to_its_callback_and_to_each_of_the_owners_subscribed_endpoints() {
    use EndpointEvent::*;
    let w = world();
    let both = subscribe(&w.endpoints, "alice", &[JobSucceeded, JobFailed], false);
    let failures_only = subscribe(&w.endpoints, "alice", &[JobFailed], false);
    let progress_only = subscribe(&w.endpoints, "alice", &[JobProgress], false);
    let succeeded_too = subscribe(&w.endpoints, "alice", &[JobSucceeded], false);
    let bobs = subscribe(&w.endpoints, "bob", &[JobSucceeded, JobFailed], false);
    let response = handle(&w.deps, batch(vec![succeeded(1), end(2, "failed", |_| {})])).await;
    assert!(failures(&response).is_empty());
    assert_eq!(
        sent(&w.sqs),
        [
            (WebhookMessage::callback(job(1), JobStatus::Succeeded).of(&alice()), 0),
            (to_endpoint(1, JobStatus::Succeeded, &both), 0),
            (to_endpoint(1, JobStatus::Succeeded, &succeeded_too), 0),
            (WebhookMessage::callback(job(2), JobStatus::Failed).of(&alice()), 0),
            (to_endpoint(2, JobStatus::Failed, &both), 0),
            (to_endpoint(2, JobStatus::Failed, &failures_only), 0),
        ],
        "the callback first, then the endpoints oldest first; none to {} nor to bob's {}",
        progress_only.endpoint_id,
        bobs.endpoint_id
    );
    assert_eq!(*w.sqs.batches.lock().unwrap(), [6], "in one request");
    assert!(w.endpoints.all_deliveries().is_empty(), "nothing recorded for enabled endpoints");
    assert!(w.dead_letters.kept().is_empty());
}

#[tokio::test]
async fn an_end_without_a_callback_still_reaches_the_endpoints() {
    let w = world();
    let endpoint = subscribe(&w.endpoints, "alice", &[EndpointEvent::JobCancelled], false);
    let record = end(1, "cancelled", |r| {
        drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url"))
    });
    let response = handle(&w.deps, batch(vec![record])).await;
    assert!(failures(&response).is_empty());
    assert_eq!(sent(&w.sqs), [(to_endpoint(1, JobStatus::Cancelled, &endpoint), 0)]);
    // An end of an owner without endpoints and without a callback: nothing, no request.
    let w = world();
    let record = end(2, "succeeded", |r| {
        drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url"))
    });
    assert!(failures(&handle(&w.deps, batch(vec![record])).await).is_empty());
    assert!(w.sqs.batches.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_disabled_endpoint_gets_a_failed_record_of_the_event_and_no_message() {
    use EndpointEvent::*;
    let w = world();
    let enabled = subscribe(&w.endpoints, "alice", &[JobFailed], false);
    let disabled = subscribe(&w.endpoints, "alice", &[JobFailed, JobProgress], true);
    let unsubscribed = subscribe(&w.endpoints, "alice", &[JobSucceeded], true);
    let response = handle(&w.deps, batch(vec![end(1, "failed", |_| {})])).await;
    assert!(failures(&response).is_empty());
    assert_eq!(
        sent(&w.sqs),
        [
            (WebhookMessage::callback(job(1), JobStatus::Failed).of(&alice()), 0),
            (to_endpoint(1, JobStatus::Failed, &enabled), 0)
        ]
    );
    let recorded = w.endpoints.all_deliveries();
    assert_eq!(
        recorded,
        [EndpointDelivery {
            webhook_id: endpoint_message_id(&disabled.endpoint_id, &job(1), JobFailed, None),
            endpoint_id: disabled.endpoint_id.clone(),
            job_id: job(1),
            event: JobFailed,
            status: DeliveryStatus::Failed,
            attempts: 0,
            created_at: w.clock.now().into(),
            last_attempt_at: None,
            status_code: None,
            latency_ms: None,
            error: Some(DISABLED_ERROR.to_owned()),
            progress_seq: None,
            result_expires_at: None,
        }],
        "none for {}, which does not receive the event",
        unsubscribed.endpoint_id
    );
}

/// Stream record `n` of job `n`'s progress record (owned by alice): an INSERT whose progress
/// changed at `changed`, or with `old` a MODIFY from an image whose progress changed at `old`;
/// then changed by `edit`.
fn progress(
    n: u64,
    old: Option<&str>,
    changed: &str,
    edit: impl FnOnce(&mut Value),
) -> EventRecord {
    let image = |changed: &str| {
        json!({
            "pk": {"S": format!("JOB#{}", job(n))},
            "sk": {"S": PROGRESS_SK},
            "owner": {"S": "alice"},
            "pct": {"N": "42.5"},
            "seq": {"N": "7"},
            "heartbeat_at": {"S": "2026-11-22T12:00:09.000Z"},
            "progress_changed_at": {"S": changed},
        })
    };
    record(|r| {
        let stream = &mut r["dynamodb"];
        stream["SequenceNumber"] = json!(format!("{n}"));
        stream["Keys"] = json!({"pk": {"S": format!("JOB#{}", job(n))}, "sk": {"S": PROGRESS_SK}});
        stream["NewImage"] = image(changed);
        match old {
            Some(old) => stream["OldImage"] = image(old),
            None => {
                r["eventName"] = json!("INSERT");
                drop(r["dynamodb"].as_object_mut().unwrap().remove("OldImage"));
            }
        }
        edit(r);
    })
}

const T1: &str = "2026-11-22T12:00:01.000Z";
const T2: &str = "2026-11-22T12:00:02.000Z";
const T3: &str = "2026-11-22T12:00:03.000Z";

#[test]
fn a_progress_record_is_a_change_only_when_its_progress_changed_and_it_names_an_owner() {
    let progressed = |record: &EventRecord| change(record).unwrap();
    let expected = Some(Change::Progressed(Progressed {
        job_id: job(1),
        owner: owner("alice"),
        attempt: None,
    }));
    assert_eq!(progressed(&progress(1, None, T1, |_| {})), expected, "an insert");
    assert_eq!(progressed(&progress(1, Some(T1), T2, |_| {})), expected, "a change");
    assert_eq!(progressed(&progress(1, Some(T1), T1, |_| {})), None, "a heartbeat");
    let no_owner =
        |r: &mut Value| drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("owner"));
    assert_eq!(progressed(&progress(1, Some(T1), T2, no_owner)), None, "no owner");
    assert_eq!(progressed(&progress(1, None, T1, no_owner)), None, "no owner");
    let removed = progress(1, Some(T1), T2, |r| r["eventName"] = json!("REMOVE"));
    assert_eq!(progressed(&removed), None, "a removal");
    let no_old = progress(1, Some(T1), T2, |r| {
        drop(r["dynamodb"].as_object_mut().unwrap().remove("OldImage"))
    });
    assert!(matches!(change(&no_old), Err(RecordError::NoOldImage)));
    let bad_key = progress(1, None, T1, |r| r["dynamodb"]["Keys"]["pk"]["S"] = json!("JOB#x"));
    assert!(matches!(change(&bad_key), Err(RecordError::Unreadable(_))));
}

/// The first attempt of job `n`'s progress event to `endpoint`, due at `due` (0: at once).
fn progress_to(n: u64, endpoint: &EndpointRecord, due: i64) -> WebhookMessage {
    let id = endpoint.endpoint_id.clone();
    WebhookMessage::to_endpoint(job(n), JobStatus::Running, id, EndpointEvent::JobProgress, due)
        .of(&endpoint.owner)
}

/// `at` in whole epoch seconds, rounded up (a trailing event is never due before its
/// window's end).
fn seconds_up(at: Timestamp) -> i64 {
    (at.as_datetime().timestamp_millis() + 999).div_euclid(1000)
}

#[tokio::test]
async fn a_progress_change_opening_a_window_is_sent_at_once_to_each_subscribed_endpoint() {
    use EndpointEvent::*;
    let w = world();
    let first = subscribe(&w.endpoints, "alice", &[JobProgress], false);
    let second = subscribe(&w.endpoints, "alice", &[JobProgress, JobSucceeded], false);
    subscribe(&w.endpoints, "alice", &[JobSucceeded], false);
    subscribe(&w.endpoints, "alice", &[JobProgress], true);
    subscribe(&w.endpoints, "bob", &[JobProgress], false);
    let opened = Timestamp::from(w.clock.now());
    let response = handle(&w.deps, batch(vec![progress(1, Some(T1), T2, |_| {})])).await;
    assert!(failures(&response).is_empty());
    assert_eq!(sent(&w.sqs), [(progress_to(1, &first, 0), 0), (progress_to(1, &second, 0), 0)]);
    let until = Timestamp::from(opened.as_datetime() + chrono::Duration::seconds(5));
    assert_eq!(w.endpoints.window_until(&job(1)), Some(until));
    assert!(w.endpoints.all_deliveries().is_empty(), "no record of progress to a disabled one");
    // A heartbeat is nothing, and leaves the window as it is.
    let heartbeat = progress(1, Some(T2), T2, |_| {});
    assert!(failures(&handle(&w.deps, batch(vec![heartbeat])).await).is_empty());
    assert_eq!(sent(&w.sqs).len(), 2);
    assert_eq!(w.endpoints.window_until(&job(1)), Some(until));
}

#[tokio::test]
async fn changes_within_a_window_claim_its_one_trailing_event_due_at_its_end() {
    let w = world();
    let endpoint = subscribe(&w.endpoints, "alice", &[EndpointEvent::JobProgress], false);
    // A clock a fraction into a second: the trailing event's due time is rounded up.
    w.clock.set("2031-02-03T04:05:06.250Z".parse::<Timestamp>().unwrap().as_datetime());
    let t0 = Timestamp::from(w.clock.now());
    let after =
        |millis: i64| Timestamp::from(t0.as_datetime() + chrono::Duration::milliseconds(millis));
    // Each record a change of job 1's progress.
    let change = || batch(vec![progress(1, Some(T1), T2, |_| {})]);
    let run = async || assert!(failures(&handle(&w.deps, change()).await).is_empty());

    run().await;
    assert_eq!(sent(&w.sqs), [(progress_to(1, &endpoint, 0), 0)], "the leading event, at once");
    w.clock.advance(Duration::from_secs(2));
    run().await;
    let end = after(5_000);
    assert_eq!(
        sent(&w.sqs)[1..],
        [(progress_to(1, &endpoint, seconds_up(end)), 0)],
        "the trailing event, due at the window's end"
    );
    assert_eq!(seconds_up(end), end.as_datetime().timestamp() + 1);
    assert_eq!(w.endpoints.window_until(&job(1)), Some(after(10_000)), "extended by a window");
    // Further changes up to the window's end: carried by that trailing event, nothing more.
    w.clock.set(after(4_999).as_datetime());
    run().await;
    assert_eq!(sent(&w.sqs).len(), 2, "{:?}", sent(&w.sqs));
    // A change once it is due claims the extension's own trailing event, at its end; the
    // changes after that, until then, are carried by it.
    for at in [5_000, 9_999] {
        w.clock.set(after(at).as_datetime());
        run().await;
    }
    assert_eq!(sent(&w.sqs)[2..], [(progress_to(1, &endpoint, seconds_up(after(10_000))), 0)]);
    assert_eq!(w.endpoints.window_until(&job(1)), Some(after(15_000)), "extended again");
    // Once every window lapsed, a change opens the next: sent at once.
    w.clock.set(after(15_000).as_datetime());
    run().await;
    assert_eq!(sent(&w.sqs)[3..], [(progress_to(1, &endpoint, 0), 0)]);
    assert_eq!(w.endpoints.window_until(&job(1)), Some(after(20_000)));
    w.clock.set(after(16_000).as_datetime());
    run().await;
    assert_eq!(sent(&w.sqs)[4..], [(progress_to(1, &endpoint, seconds_up(after(20_000))), 0)]);
}

#[tokio::test]
async fn each_jobs_progress_has_its_own_window() {
    let w = world();
    let endpoint = subscribe(&w.endpoints, "alice", &[EndpointEvent::JobProgress], false);
    let records = vec![progress(1, None, T1, |_| {}), progress(2, Some(T1), T2, |_| {})];
    assert!(failures(&handle(&w.deps, batch(records)).await).is_empty());
    assert_eq!(
        sent(&w.sqs),
        [(progress_to(1, &endpoint, 0), 0), (progress_to(2, &endpoint, 0), 0)]
    );
}

#[tokio::test]
async fn progress_no_endpoint_subscribes_to_opens_no_window_and_queues_nothing() {
    use EndpointEvent::*;
    let w = world();
    subscribe(&w.endpoints, "alice", &[JobSucceeded, JobFailed], false);
    subscribe(&w.endpoints, "alice", &[JobProgress], true);
    subscribe(&w.endpoints, "bob", &[JobProgress], false);
    let records = vec![progress(1, Some(T1), T2, |_| {}), progress(2, None, T1, |_| {})];
    assert!(failures(&handle(&w.deps, batch(records)).await).is_empty());
    assert!(w.sqs.batches.lock().unwrap().is_empty(), "{:?}", sent(&w.sqs));
    for n in [1, 2] {
        assert_eq!(w.endpoints.window_until(&job(n)), None, "no window for job {n}");
    }
    assert!(w.endpoints.all_deliveries().is_empty());
    // A progress record without an owner (written before owners were copied onto it) is
    // passed over, not dead-lettered.
    subscribe(&w.endpoints, "alice", &[JobProgress], false);
    let ownerless = progress(3, Some(T1), T2, |r| {
        drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("owner"))
    });
    assert!(failures(&handle(&w.deps, batch(vec![ownerless])).await).is_empty());
    assert!(w.sqs.batches.lock().unwrap().is_empty());
    assert_eq!(w.endpoints.window_until(&job(3)), None);
    assert!(w.dead_letters.kept().is_empty());
}

#[tokio::test]
async fn an_endpoints_table_that_fails_names_its_record_after_queueing_the_ones_before_it() {
    let c = counted(Duration::ZERO);
    let alices = subscribe(&c.table, "alice", &[EndpointEvent::JobSucceeded], false);
    c.table.fail_listing_of(&owner("bob"), true);
    let bobs = end(3, "succeeded", |r| r["dynamodb"]["NewImage"]["owner"]["S"] = json!("bob"));
    let records = vec![succeeded(1), succeeded(2), bobs.clone(), succeeded(4)];
    let response = handle(&c.deps, batch(records)).await;
    assert_eq!(failures(&response), ["3"], "resumed from the record whose endpoints failed");
    assert_eq!(
        c.sqs.queue.sent().into_iter().map(|(m, _)| m).collect::<Vec<_>>(),
        [
            WebhookMessage::callback(job(1), JobStatus::Succeeded).of(&alice()),
            to_endpoint(1, JobStatus::Succeeded, &alices),
            WebhookMessage::callback(job(2), JobStatus::Succeeded).of(&alice()),
            to_endpoint(2, JobStatus::Succeeded, &alices),
        ],
        "the ends before it, and nothing of it or after it"
    );
    assert_eq!(c.table.listings_of(&owner("alice")), 2, "record 4 was not read");
    // Endpoints read (here: kept from an earlier batch), but the table fails when a disabled
    // endpoint's event is recorded: retried too.
    let c = counted(Duration::from_secs(10));
    subscribe(&c.table, "alice", &[EndpointEvent::JobSucceeded], true);
    subscribe(&c.table, "alice", &[EndpointEvent::JobProgress], false);
    assert!(failures(&handle(&c.deps, batch(vec![succeeded(1)])).await).is_empty());
    let before = c.sqs.queue.sent().len();
    c.table.set_unavailable(true);
    assert_eq!(failures(&handle(&c.deps, batch(vec![succeeded(2)])).await), ["2"]);
    // A progress event whose window cannot be written is passed over (the next change, or
    // the job's end, supersedes it): no retry holds the shard up, nothing is queued.
    let records = vec![progress(3, None, T1, |_| {}), progress(4, Some(T1), T2, |_| {})];
    assert!(failures(&handle(&c.deps, batch(records)).await).is_empty());
    c.table.set_unavailable(false);
    assert_eq!(c.sqs.queue.sent().len(), before, "nothing queued for any of them");
    assert_eq!(c.table.listings_of(&owner("alice")), 1, "the endpoints were read from the cache");
    assert_eq!(c.table.window_until(&job(3)), None);
    // Nor when the endpoints cannot be read.
    let c = counted(Duration::ZERO);
    subscribe(&c.table, "alice", &[EndpointEvent::JobProgress], false);
    c.table.fail_listing_of(&owner("alice"), true);
    let records = vec![progress(1, None, T1, |_| {}), succeeded(2)];
    assert_eq!(failures(&handle(&c.deps, batch(records)).await), ["2"], "the end is retried");
    assert!(c.sqs.queue.sent().is_empty());
    assert!(c.dead_letters.kept().is_empty(), "not dead-lettered either");
}

#[tokio::test]
async fn an_owners_endpoints_are_read_once_within_the_cache_ttl() {
    let c = counted(Duration::from_secs(10));
    let first = subscribe(&c.table, "alice", &[EndpointEvent::JobSucceeded], false);
    let records = vec![succeeded(1), succeeded(2), succeeded(3)];
    assert!(failures(&handle(&c.deps, batch(records)).await).is_empty());
    assert_eq!(c.table.listings_of(&owner("alice")), 1, "once for the batch");
    // A new endpoint reaches events only once the cached read is older than the ttl.
    let second = subscribe(&c.table, "alice", &[EndpointEvent::JobSucceeded], false);
    c.clock.advance(Duration::from_millis(9_999));
    assert!(failures(&handle(&c.deps, batch(vec![succeeded(4)])).await).is_empty());
    assert_eq!(c.table.listings_of(&owner("alice")), 1, "a later batch within the ttl");
    c.clock.advance(Duration::from_millis(1));
    assert!(failures(&handle(&c.deps, batch(vec![succeeded(5)])).await).is_empty());
    assert_eq!(c.table.listings_of(&owner("alice")), 2);
    let to: Vec<(JobId, EndpointId)> = c
        .sqs
        .queue
        .sent()
        .into_iter()
        .filter_map(|(m, _)| Some((m.job_id, m.endpoint_id?)))
        .collect();
    let mut expected: Vec<(JobId, EndpointId)> =
        (1..=5).map(|n| (job(n), first.endpoint_id.clone())).collect();
    expected.push((job(5), second.endpoint_id.clone()));
    assert_eq!(to, expected);
}

#[tokio::test]
async fn an_end_for_many_endpoints_goes_ten_messages_to_a_request() {
    let w = world();
    let mut endpoints = Vec::new();
    for _ in 0..12 {
        endpoints.push(subscribe(&w.endpoints, "alice", &[EndpointEvent::JobSucceeded], false));
    }
    let response = handle(&w.deps, batch(vec![succeeded(1), succeeded(2)])).await;
    assert!(failures(&response).is_empty());
    assert_eq!(*w.sqs.batches.lock().unwrap(), [10, 10, 6], "26 messages");
    let messages: Vec<WebhookMessage> = sent(&w.sqs).into_iter().map(|(m, _)| m).collect();
    for n in [1, 2] {
        let mut expected =
            vec![WebhookMessage::callback(job(n), JobStatus::Succeeded).of(&alice())];
        expected.extend(endpoints.iter().map(|e| to_endpoint(n, JobStatus::Succeeded, e)));
        let of_job: Vec<_> = messages.iter().filter(|m| m.job_id == job(n)).cloned().collect();
        assert_eq!(of_job, expected, "job {n}");
    }
    // The request holding the second end's first messages is refused: the stream resumes
    // from it, the first end's thirteen all queued.
    let w = world();
    for _ in 0..12 {
        subscribe(&w.endpoints, "alice", &[EndpointEvent::JobSucceeded], false);
    }
    w.sqs.refuse(&job(2));
    let response = handle(&w.deps, batch(vec![succeeded(1), succeeded(2), succeeded(3)])).await;
    assert_eq!(failures(&response), ["2"]);
    assert_eq!(*w.sqs.batches.lock().unwrap(), [10, 10]);
    let queued = sent(&w.sqs);
    assert_eq!(queued.len(), 13);
    assert!(queued.iter().all(|(m, _)| m.job_id == job(1)));
}

/// Progress is lossy by design: a trailing event whose message SQS refused is not retried (that
/// would hold up the terminal events behind it), and a redelivery of its record queues nothing
/// (its window's claim is spent); the next change after it was due is queued.
#[tokio::test]
async fn a_trailing_progress_event_that_could_not_be_queued_is_superseded_by_the_next() {
    let w = world();
    subscribe(&w.endpoints, "alice", &[EndpointEvent::JobProgress], false);
    assert!(
        failures(&handle(&w.deps, batch(vec![progress(1, None, T1, |_| {})])).await).is_empty()
    );
    assert_eq!(sent(&w.sqs).len(), 1, "the leading event");
    w.clock.advance(Duration::from_secs(1));
    let record = progress(1, Some(T1), T2, |_| {});
    w.sqs.refuse(&job(1));
    assert!(
        failures(&handle(&w.deps, batch(vec![record.clone()])).await).is_empty(),
        "a refused progress event holds up no record behind it"
    );
    w.sqs.accept_all();
    assert!(failures(&handle(&w.deps, batch(vec![record])).await).is_empty());
    assert_eq!(sent(&w.sqs).len(), 1, "the refused trailing event is not queued again");
    // Past its due time, the next change claims the extension's trailing event.
    w.clock.advance(Duration::from_secs(5));
    let later = progress(1, Some(T2), T1, |_| {});
    assert!(failures(&handle(&w.deps, batch(vec![later])).await).is_empty());
    assert_eq!(sent(&w.sqs).len(), 2, "{:?}", sent(&w.sqs));
}

/// "Changes while a trailing event is claimed queue nothing: it will carry them" — but the
/// trailing event is sent at the window's end, and the window is extended past it: a change
/// after it was sent is carried by no event unless another change follows the extension.
#[tokio::test]
async fn the_last_change_of_a_job_is_announced_even_after_a_trailing_event() {
    let w = world();
    subscribe(&w.endpoints, "alice", &[EndpointEvent::JobProgress], false);
    let t0 = w.clock.now();
    let change = |old, new| progress(1, Some(old), new, |_| {});
    for (at, record) in [(0, change(T1, T2)), (1, change(T2, T3))] {
        w.clock.set(t0 + chrono::Duration::seconds(at));
        assert!(failures(&handle(&w.deps, batch(vec![record])).await).is_empty());
    }
    assert_eq!(sent(&w.sqs).len(), 2, "the leading event, and the trailing one due at t0 + 5");
    // The trailing event reads the progress at t0 + 5; the change at t0 + 6 is the job's
    // latest (say it then works a long while without another).
    w.clock.set(t0 + chrono::Duration::seconds(6));
    assert!(failures(&handle(&w.deps, batch(vec![change(T3, T1)])).await).is_empty());
    assert_eq!(sent(&w.sqs).len(), 3, "an event that carries it: {:?}", sent(&w.sqs));
}
