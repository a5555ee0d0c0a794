//! **notifier** — the outbox's reader: turns the job table's stream into webhook messages.
//!
//! A job ends in one fenced write of its record, and whoever makes it (a stage, the cancel
//! function, the reaper) queues nothing itself. The table's stream carries that write here —
//! filtered by the event source mapping to job records that moved into a terminal status and
//! to progress records carrying their job's owner — and this function queues the first
//! delivery attempts on the webhook queue: the job's own `callback_url` (its terminal event),
//! and each of the owner's webhook endpoints subscribed to the event
//! ([`longhaul_aws::endpoint_events`]). An ender that dies right after its transition
//! therefore loses no event: the stream keeps the change (24 hours) until it is queued.
//!
//! **Progress.** A progress change of a job whose owner has an enabled endpoint subscribed to
//! `job.progress` is sent at once if it opens the job's window ([`PROGRESS_WINDOW`], a
//! conditional write); a change while the window is open claims the window's one trailing
//! event, due at its end, which extends the window by one more window (whose own trailing
//! event a change after that due time claims). The webhook function sends the job's progress
//! *as it is when it sends* (latest wins), so changes while a claimed trailing event is not
//! yet due queue nothing: it will carry them. An endpoint gets at most one progress event per
//! job per window, the first without delay, the last change carried by one; a terminal event
//! never waits for one. Progress is lossy by design: an event whose message SQS refused is
//! superseded by the next, not retried (its window's claim is spent).
//!
//! Records are handled in stream order. A record that cannot be read (no retry will change
//! that) goes, whole and with the reason, to the notifier dead-letter queue, and the records
//! after it go on: Lambda would otherwise retry it and dead-letter the rest of its batch with
//! it. The first record whose messages could not all be queued (SQS or the table failed: worth
//! retrying) is the batch item failure: Lambda retries from it (the records before it are
//! done), bisects a batch that keeps failing, and after `MaximumRetryAttempts` sends the
//! batch's shard and sequence range to the same dead-letter queue
//! (docs/runbook.md#notifier-dead-letters). A retried batch may queue an event twice; receivers
//! deduplicate by `webhook-id`.

pub mod lambda;
mod records;

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::dynamodb::{Event, EventRecord};
use aws_lambda_events::streams::DynamoDbEventResponse;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::endpoint_events::{EndpointCache, JobEvent, fan_out};
use longhaul_aws::jobs::{JobStore, StoreError};
use longhaul_aws::logs;
use longhaul_aws::ports::{
    Clock, DeadLetters, EndpointDeliveries, EndpointStore, ProgressWindows, SystemClock,
    WebhookDispatch,
};
use longhaul_aws::queue::{DeadLetterQueue, WebhookMessage, WebhookQueue};
pub use longhaul_aws::streams::RecordError;
use longhaul_aws::streams::failure_at;
use longhaul_domain::endpoints::{EndpointEvent, PROGRESS_WINDOW};
use longhaul_domain::{JobStatus, Timestamp};
pub use records::{Change, Ended, Progressed, change};
use tracing::Instrument;

/// Most messages one `SendMessageBatch` takes.
const SQS_BATCH: usize = 10;

/// Owners whose endpoints one sandbox keeps at once.
const CACHED_OWNERS: usize = 10_000;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: owners' endpoints, their delivery records, the progress windows.
    pub table: String,
    /// `WEBHOOK_QUEUE_URL`: where first delivery attempts go.
    pub webhook_queue_url: String,
    /// `NOTIFIER_DLQ_URL`: where records that cannot be read go.
    pub dead_letter_url: String,
    /// `LONGHAUL_ENDPOINT_CACHE_SECONDS` (10): how long a sandbox keeps an owner's endpoints;
    /// a change to an endpoint reaches its events within it.
    pub endpoint_cache: Duration,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS`: how long delivery records are kept (their TTL).
    pub record_retention: longhaul_aws::jobs::RecordRetention,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            webhook_queue_url: vars.required("WEBHOOK_QUEUE_URL")?,
            dead_letter_url: vars.required("NOTIFIER_DLQ_URL")?,
            endpoint_cache: Duration::from_secs(
                vars.parsed_or("LONGHAUL_ENDPOINT_CACHE_SECONDS", 10)?,
            ),
            record_retention: longhaul_aws::jobs::RecordRetention::from_vars(vars)?,
        })
    }
}

/// What the notifier needs of the job table: owners' endpoints, their delivery records (a
/// disabled endpoint's skipped events) and the progress windows.
pub trait Endpoints: EndpointStore + EndpointDeliveries + ProgressWindows {}
impl<T: EndpointStore + EndpointDeliveries + ProgressWindows> Endpoints for T {}

/// What the handler needs, built once per sandbox: its ports and the endpoint cache.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The webhook queue.
    pub webhooks: Arc<dyn WebhookDispatch>,
    /// Records that cannot be read.
    pub dead_letters: Arc<dyn DeadLetters>,
    /// Endpoints, their delivery records, progress windows.
    pub endpoints: Arc<dyn Endpoints>,
    /// What time it is (windows, records; the cache's age).
    pub clock: Arc<dyn Clock>,
    /// Owners' endpoints as this sandbox read them.
    pub cache: Arc<EndpointCache>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the webhook queue (the table stream's records arrive in the event).
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![self.webhooks.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let sqs = longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new);
        Deps {
            webhooks: Arc::new(WebhookQueue::new(sqs.clone(), config.webhook_queue_url.clone())),
            dead_letters: Arc::new(DeadLetterQueue::new(sqs, config.dead_letter_url.clone())),
            endpoints: Arc::new(
                JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                    .retaining(config.record_retention),
            ),
            clock: Arc::new(SystemClock),
            cache: Arc::new(EndpointCache::new(config.endpoint_cache, CACHED_OWNERS)),
        }
    }
}

/// A message to queue, with the record it came from (the one to resume from if it is not
/// queued).
type Pending<'a> = Vec<(&'a EventRecord, WebhookMessage, tracing::Span)>;

/// Handles one batch of stream records, in order. Never fails: the first record whose
/// messages could not be queued (or, unreadable, not dead-lettered) is reported, so Lambda
/// resumes the shard from it.
pub async fn handle(deps: &Deps, event: Event) -> DynamoDbEventResponse {
    let mut pending: Pending = Vec::new();
    for record in &event.records {
        let (messages, span) = match change(record) {
            Ok(Some(change)) => {
                // In the job's `job` span ([`logs`]): its id, attempt and owner.
                let span =
                    logs::job_span(Some(change.job_id()), change.attempt(), Some(change.owner()));
                match messages(deps, &change).instrument(span.clone()).await {
                    Ok(messages) => (messages, span),
                    // A progress event that cannot be made is superseded by the next change or
                    // by the job's end, which a retry of this record would hold up: logged and
                    // passed.
                    Err(err) if matches!(change, Change::Progressed(_)) => {
                        span.in_scope(|| tracing::error!(error = %err, "a progress event could not be queued; the next progress change or the job's end supersedes it"));
                        continue;
                    }
                    Err(err) => {
                        span.in_scope(|| tracing::error!(error = %err, "reading or recording endpoint deliveries failed; the stream retries the record"));
                        return failure_at(queue(deps, &mut pending).await.unwrap_or(record));
                    }
                }
            }
            Ok(None) => continue,
            Err(err) => {
                tracing::error!(error = %err, sequence = record.change.sequence_number, "a job record on the stream cannot be read");
                let dead_letter = serde_json::json!({"reason": err.to_string(), "record": record});
                if let Err(send) = deps.dead_letters.send(&dead_letter).await {
                    tracing::error!(error = %send, "dead-lettering the unreadable record failed; the stream retries it");
                    // Queue what came before it, so the retry starts at this record.
                    return failure_at(queue(deps, &mut pending).await.unwrap_or(record));
                }
                continue;
            }
        };
        pending.extend(messages.into_iter().map(|message| (record, message, span.clone())));
        while pending.len() >= SQS_BATCH {
            if let Some(failed) = queue(deps, &mut pending).await {
                return failure_at(failed);
            }
        }
    }
    match queue(deps, &mut pending).await {
        Some(failed) => failure_at(failed),
        None => DynamoDbEventResponse::default(),
    }
}

/// The first attempts `change` makes: the job's callback and its owner's subscribed endpoints
/// (having recorded the events of disabled ones as skipped), or for progress, one per
/// subscribed endpoint when it opens a window.
async fn messages(deps: &Deps, change: &Change) -> Result<Vec<WebhookMessage>, StoreError> {
    let clock = deps.clock.now();
    let now = Timestamp::from(clock);
    let endpoints =
        deps.cache.endpoints(deps.endpoints.as_ref(), change.owner(), deps.clock.instant()).await?;
    match change {
        Change::Ended(ended) => {
            let mut messages = Vec::new();
            if ended.callback {
                messages.push(
                    WebhookMessage::callback(ended.job_id.clone(), ended.status).of(&ended.owner),
                );
            }
            let Some(event) = EndpointEvent::of_terminal(ended.status) else {
                return Ok(messages);
            };
            let event =
                JobEvent::now(ended.job_id.clone(), ended.owner.clone(), ended.status, event);
            let fanout = fan_out(&endpoints, &event, now);
            for skipped in &fanout.skipped {
                deps.endpoints.record_endpoint_delivery(skipped).await?;
                tracing::info!(endpoint_id = %skipped.endpoint_id, event = %event.event, "endpoint disabled: event recorded as failed, not attempted");
            }
            messages.extend(fanout.messages);
            Ok(messages)
        }
        Change::Progressed(progressed) => {
            let event = JobEvent::now(
                progressed.job_id.clone(),
                progressed.owner.clone(),
                JobStatus::Running,
                EndpointEvent::JobProgress,
            );
            if !endpoints.iter().any(|e| e.enabled() && e.spec.receives(event.event)) {
                return Ok(Vec::new());
            }
            let window = chrono::Duration::from_std(PROGRESS_WINDOW).expect("seconds fit");
            let until = Timestamp::from(clock + window);
            let windows = &deps.endpoints;
            let not_before = if windows.open_progress_window(&progressed.job_id, now, until).await?
            {
                0
            } else if let Some(end) =
                windows.claim_trailing_event(&progressed.job_id, now, PROGRESS_WINDOW).await?
            {
                // Whole seconds, rounded up: never before the window's end.
                (end.as_datetime().timestamp_millis() + 999).div_euclid(1000)
            } else {
                return Ok(Vec::new());
            };
            Ok(fan_out(&endpoints, &JobEvent { not_before, ..event }, now).messages)
        }
    }
}

/// Queues up to ten of the pending messages in one request and removes them from `pending`.
/// Answers the first record one of whose messages was not queued.
async fn queue<'a>(deps: &Deps, pending: &mut Pending<'a>) -> Option<&'a EventRecord> {
    if pending.is_empty() {
        return None;
    }
    let chunk: Pending = pending.drain(..pending.len().min(SQS_BATCH)).collect();
    let messages: Vec<WebhookMessage> = chunk.iter().map(|(_, m, _)| m.clone()).collect();
    let queued = match deps.webhooks.send_batch(&messages).await {
        Ok(queued) => queued,
        Err(err) => {
            tracing::error!(error = %err, count = messages.len(), "queueing webhooks failed; the stream retries them");
            vec![false; messages.len()]
        }
    };
    let mut first_failed = None;
    for ((record, message, span), queued) in chunk.into_iter().zip(queued) {
        let _entered = span.enter();
        let event = message.event.map_or("callback", EndpointEvent::as_str);
        if queued {
            tracing::info!(status = %message.status, event, endpoint_id = ?message.endpoint_id, "webhook queued");
        } else if message.event == Some(EndpointEvent::JobProgress) {
            // Lossy by design: the next change or the job's end supersedes it, and a retry
            // of its record would hold up the terminal events behind it on the stream.
            tracing::warn!(event, endpoint_id = ?message.endpoint_id, "queueing a progress event failed; superseded by the next");
        } else {
            tracing::warn!(status = %message.status, event, endpoint_id = ?message.endpoint_id, "queueing the webhook failed; the stream retries it");
            first_failed.get_or_insert(record);
        }
    }
    first_failed
}

#[cfg(test)]
mod tests;
