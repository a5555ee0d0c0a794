//! **notifier** — the outbox's reader: turns the job table's stream into webhook messages.
//!
//! A job ends in one fenced write of its record, and whoever makes it (a stage, the cancel
//! function, the reaper) queues nothing itself. The table's stream carries that write here —
//! filtered by the event source mapping to job records that moved into a terminal status and
//! have a callback URL — and this function queues the first delivery attempt on the webhook
//! queue. An ender that dies right after its transition therefore loses no event: the stream
//! keeps the change (24 hours) until it is queued.
//!
//! Records are handled in stream order. A record that cannot be read (no retry will change
//! that) goes, whole and with the reason, to the notifier dead-letter queue, and the records
//! after it go on: Lambda would otherwise retry it and dead-letter the rest of its batch with
//! it. The first record that could not be queued (SQS failed: worth retrying) is the batch
//! item failure: Lambda retries from it (the records before it are done), bisects a batch that
//! keeps failing, and after `MaximumRetryAttempts` sends the batch's shard and sequence range
//! to the same dead-letter queue (docs/runbook.md#notifier-dead-letters). A retried batch may
//! queue an event twice; receivers deduplicate by `webhook-id`.

pub mod lambda;

use std::sync::Arc;

use aws_lambda_events::dynamodb::{Event, EventRecord};
use aws_lambda_events::streams::DynamoDbEventResponse;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::logs;
use longhaul_aws::ports::{DeadLetters, WebhookDispatch};
use longhaul_aws::queue::{DeadLetterQueue, WebhookMessage, WebhookQueue};
pub use longhaul_aws::streams::RecordError;
use longhaul_aws::streams::{failure_at, job_end};
use longhaul_domain::webhooks::event_type;
use longhaul_domain::{JobId, JobStatus, Owner};
use serde::Deserialize;

/// Most messages one `SendMessageBatch` takes.
const SQS_BATCH: usize = 10;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `WEBHOOK_QUEUE_URL`: where first delivery attempts go.
    pub webhook_queue_url: String,
    /// `NOTIFIER_DLQ_URL`: where records that cannot be read go.
    pub dead_letter_url: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            webhook_queue_url: vars.required("WEBHOOK_QUEUE_URL")?,
            dead_letter_url: vars.required("NOTIFIER_DLQ_URL")?,
        })
    }
}

/// What the handler needs, built once per sandbox: its ports.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The webhook queue.
    pub webhooks: Arc<dyn WebhookDispatch>,
    /// Records that cannot be read.
    pub dead_letters: Arc<dyn DeadLetters>,
}

impl Deps {
    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let sqs = aws_sdk_sqs::Client::new(sdk);
        Deps {
            webhooks: Arc::new(WebhookQueue::new(sqs.clone(), config.webhook_queue_url.clone())),
            dead_letters: Arc::new(DeadLetterQueue::new(sqs, config.dead_letter_url.clone())),
        }
    }
}

/// The fields of a job record's image this function reads.
#[derive(Debug, Deserialize)]
struct JobImage {
    job_id: JobId,
    owner: Owner,
    status: JobStatus,
    attempt: u32,
    #[serde(default)]
    callback_url: Option<String>,
}

/// A job's end that has a webhook to send, read from one stream record.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// The first delivery attempt of the job's terminal event.
    pub message: WebhookMessage,
    /// The job's owner (for the log lines about it).
    pub owner: Owner,
    /// The job's attempt when it ended (for the log lines about it).
    pub attempt: u32,
}

/// Reads one stream record: `Some` if it is a job record moving into a terminal status that
/// has an event and a callback URL, `None` for every other change of the table. The event
/// source mapping's filter passes only the former; this check does not depend on it.
pub fn ended(record: &EventRecord) -> Result<Option<Ended>, RecordError> {
    let Some(new) = job_end::<JobImage>(record)? else { return Ok(None) };
    if new.callback_url.is_none() || event_type(new.status).is_none() {
        return Ok(None);
    }
    Ok(Some(Ended {
        message: WebhookMessage::callback(new.job_id, new.status),
        owner: new.owner,
        attempt: new.attempt,
    }))
}

/// Handles one batch of stream records, in order. Never fails: the first record that could
/// not be queued (or, unreadable, not dead-lettered) is reported, so Lambda resumes the shard
/// from it.
pub async fn handle(deps: &Deps, event: Event) -> DynamoDbEventResponse {
    let mut pending: Vec<(&EventRecord, Ended)> = Vec::with_capacity(SQS_BATCH);
    for record in &event.records {
        match ended(record) {
            Ok(Some(ended)) => {
                pending.push((record, ended));
                if pending.len() == SQS_BATCH
                    && let Some(failed) = queue(deps, &mut pending).await
                {
                    return failure_at(failed);
                }
            }
            Ok(None) => {}
            Err(err) => {
                tracing::error!(error = %err, sequence = record.change.sequence_number, "a job record on the stream cannot be read");
                let dead_letter = serde_json::json!({"reason": err.to_string(), "record": record});
                if let Err(send) = deps.dead_letters.send(&dead_letter).await {
                    tracing::error!(error = %send, "dead-lettering the unreadable record failed; the stream retries it");
                    // Queue what came before it, so the retry starts at this record.
                    return failure_at(queue(deps, &mut pending).await.unwrap_or(record));
                }
            }
        }
    }
    match queue(deps, &mut pending).await {
        Some(failed) => failure_at(failed),
        None => DynamoDbEventResponse::default(),
    }
}

/// Queues the pending messages (at most ten) in one request and empties `pending`. Answers
/// the first record whose message was not queued.
async fn queue<'a>(
    deps: &Deps,
    pending: &mut Vec<(&'a EventRecord, Ended)>,
) -> Option<&'a EventRecord> {
    if pending.is_empty() {
        return None;
    }
    let messages: Vec<WebhookMessage> =
        pending.iter().map(|(_, ended)| ended.message.clone()).collect();
    let queued = match deps.webhooks.send_batch(&messages).await {
        Ok(queued) => queued,
        Err(err) => {
            tracing::error!(error = %err, count = messages.len(), "queueing webhooks failed; the stream retries them");
            vec![false; messages.len()]
        }
    };
    let mut first_failed = None;
    for ((record, ended), queued) in pending.drain(..).zip(queued) {
        let span =
            logs::job_span(Some(&ended.message.job_id), Some(ended.attempt), Some(&ended.owner));
        let _entered = span.enter();
        if queued {
            tracing::info!(status = %ended.message.status, "webhook queued");
        } else {
            tracing::warn!(status = %ended.message.status, "queueing the webhook failed; the stream retries it");
            first_failed.get_or_insert(record);
        }
    }
    first_failed
}

#[cfg(test)]
mod tests;
