//! The record reader's cases, and the handler over in-memory queues: every path (an end with a
//! callback queued, every other change ignored, batches of ten), and every refusal (a queue
//! that refuses some entries or the whole request, unreadable records, a dead-letter queue
//! that is down) — each ending with every end queued, dead-lettered or named for the retry.

use std::collections::HashSet;
use std::sync::Mutex;

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::ports::Warm;
use longhaul_memory::{MemoryDeadLetters, MemoryWebhookQueue};

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

#[test]
fn a_job_moving_into_a_terminal_status_is_its_first_delivery() {
    let end = ended(&record(|_| {})).unwrap().unwrap();
    assert_eq!(
        end.message,
        WebhookMessage::callback(
            "01a201ea-fb15-7355-87ef-3777d21385c6".parse().unwrap(),
            JobStatus::Succeeded
        )
    );
    assert_eq!((end.owner.as_str(), end.attempt), ("alice", 1));
    for status in ["failed", "cancelled"] {
        let end = ended(&record(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!(status)))
            .unwrap()
            .unwrap();
        assert_eq!(end.message.status.as_str(), status);
    }
}

/// A named change to the sample record.
type Case = (&'static str, Box<dyn FnOnce(&mut Value)>);

#[test]
fn every_other_change_is_not_an_end() {
    let cases: [Case; 6] = [
        (
            "no callback",
            Box::new(|r| {
                drop(r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url"))
            }),
        ),
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
    assert!(matches!(ended(&no_old), Err(RecordError::NoOldImage)));
    let unreadable = record(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("on-fire"));
    assert!(matches!(ended(&unreadable), Err(RecordError::Unreadable(_))));
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
    deps: Deps,
}

fn world() -> World {
    let sqs = Arc::new(Sqs::default());
    let dead_letters = Arc::new(MemoryDeadLetters::new());
    let deps = Deps { webhooks: sqs.clone(), dead_letters: dead_letters.clone() };
    World { sqs, dead_letters, deps }
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
    assert_eq!(sent, [(WebhookMessage::callback(job(1), JobStatus::Failed), 0)]);
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
