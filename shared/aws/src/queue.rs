//! The SQS intake queue: the buffer between accepting a job and starting its execution.

use crate::client::LazyClient;
use longhaul_domain::{JobId, Owner};
use serde::{Deserialize, Serialize};

use crate::AwsError;
use crate::jobs::JobRecord;

/// The message the dispatcher consumes: a job to dispatch, sent by submit (with the job's
/// [`snapshot`](DispatchMessage::snapshot)) and by whoever moves a job on (the reaper, the
/// slots function, a backoff, a resume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchMessage {
    /// The job to dispatch.
    pub job_id: JobId,
    /// The job's record as its sender wrote it, so that the dispatcher need not read it: only
    /// the fields a dispatch uses (no params, callback URL or idempotency key, which a message
    /// kept in the dead-letter queue must not carry). The dispatch that uses it writes only on
    /// condition that the job is unchanged since (`updated_at`); a job changed meanwhile is
    /// read and dispatched as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Box<JobRecord>>,
}

impl DispatchMessage {
    /// A message naming `job_id` only: the dispatcher reads the job.
    pub fn new(job_id: JobId) -> Self {
        DispatchMessage { job_id, job: None }
    }

    /// A message for `job` as just written, carrying its snapshot.
    pub fn snapshot(job: &JobRecord) -> Self {
        let mut snapshot = job.clone();
        snapshot.params = serde_json::Value::Null;
        snapshot.callback_url = None;
        snapshot.idempotency_key = String::new();
        DispatchMessage { job_id: job.job_id.clone(), job: Some(Box::new(snapshot)) }
    }
}

/// Sends dispatch messages to the intake queue.
#[derive(Debug, Clone)]
pub struct IntakeQueue {
    client: LazyClient<aws_sdk_sqs::Client>,
    url: String,
}

impl IntakeQueue {
    /// An adapter for the queue at `url`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_sqs::Client>>, url: String) -> Self {
        IntakeQueue { client: client.into(), url }
    }

    /// Enqueues `job_id` of `owner` for dispatch.
    pub async fn send(&self, message: &DispatchMessage, owner: &Owner) -> Result<(), AwsError> {
        self.send_delayed(message, 0, owner).await
    }

    /// Enqueues `job_id` of `owner` for dispatch after `delay_seconds` (SQS holds at most
    /// 900): a delayed job's message, timed for its start.
    ///
    /// The message's group is its tenant ([`message_group`]): the intake queue is an SQS
    /// *fair* queue, which serves a quiet tenant's messages ahead of a noisy tenant's backlog.
    pub async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        let body = serde_json::to_string(message).expect("a dispatch message always serialises");
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .message_group_id(message_group(owner))
            // Unset when 0: the queue's own default applies, as before delays existed.
            .set_delay_seconds((delay_seconds > 0).then(|| delay_seconds.min(900) as i32))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("enqueue job {}", message.job_id), e))?;
        Ok(())
    }
}

/// The SQS message group of `owner`'s dispatch messages: the owner itself when SQS takes it
/// as a group id (1 to 128 characters, letters, digits and ASCII punctuation), else a hash of
/// it, so every owner has one group of its own.
pub fn message_group(owner: &Owner) -> String {
    let valid = (1..=128).contains(&owner.len())
        && owner.bytes().all(|b| b.is_ascii_alphanumeric() || b.is_ascii_punctuation());
    if valid {
        owner.to_string()
    } else {
        let owner = serde_json::Value::String(owner.to_string());
        format!("h:{}", longhaul_domain::fingerprint::fingerprint(&owner))
    }
}

/// A webhook delivery to make: which job's event to which receiver (its callback, or one of
/// its owner's endpoints), which attempt, and — for delays longer than SQS allows per hop
/// (15 minutes) — not before when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookMessage {
    /// The job.
    pub job_id: JobId,
    /// The job's status when the event happened (the terminal status of an end).
    pub status: longhaul_domain::JobStatus,
    /// 1-based attempt number.
    pub attempt: u32,
    /// Epoch seconds before which the attempt must not be made.
    #[serde(default)]
    pub not_before: i64,
    /// The endpoint it goes to, with [`WebhookMessage::event`]; `None`: the job's own
    /// `callback_url`, which receives the terminal event `status` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_id: Option<longhaul_domain::endpoints::EndpointId>,
    /// The event, for an endpoint delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<longhaul_domain::endpoints::EndpointEvent>,
    /// When the job's result expires, for a `job.result_expiring` event (the expirer, which
    /// finds the event, knows it; the job record does not carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_expires_at: Option<longhaul_domain::Timestamp>,
    /// The job's owner: the message's group on the webhook queue ([`message_group`]), so that
    /// SQS hands out each tenant's deliveries fairly beside every other's and one tenant's
    /// backlog — a flood, or a partner's outage retried — does not hold others' up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

impl WebhookMessage {
    /// The first attempt of the terminal event of `job_id` (ended `status`) to the job's own
    /// `callback_url`.
    pub fn callback(job_id: JobId, status: longhaul_domain::JobStatus) -> Self {
        WebhookMessage {
            job_id,
            status,
            attempt: 1,
            not_before: 0,
            endpoint_id: None,
            event: None,
            result_expires_at: None,
            owner: None,
        }
    }

    /// This message, grouped on the queue as `owner`'s.
    pub fn of(self, owner: &Owner) -> Self {
        WebhookMessage { owner: Some(owner.clone()), ..self }
    }

    /// The first attempt of `event` of `job_id` (in `status` when the event happened) to
    /// `endpoint`, not before `not_before` (epoch seconds; 0: at once).
    pub fn to_endpoint(
        job_id: JobId,
        status: longhaul_domain::JobStatus,
        endpoint: longhaul_domain::endpoints::EndpointId,
        event: longhaul_domain::endpoints::EndpointEvent,
        not_before: i64,
    ) -> Self {
        WebhookMessage {
            job_id,
            status,
            attempt: 1,
            not_before,
            endpoint_id: Some(endpoint),
            event: Some(event),
            result_expires_at: None,
            owner: None,
        }
    }
}

/// The webhook queue (and its dead-letter queue for exhausted deliveries).
#[derive(Debug, Clone)]
pub struct WebhookQueue {
    client: LazyClient<aws_sdk_sqs::Client>,
    url: String,
}

impl WebhookQueue {
    /// An adapter for the queue at `url`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_sqs::Client>>, url: String) -> Self {
        WebhookQueue { client: client.into(), url }
    }

    /// Queues `message`, delivered after `delay_seconds` (at most 900).
    pub async fn send(&self, message: &WebhookMessage, delay_seconds: u64) -> Result<(), AwsError> {
        let body = serde_json::to_string(message).expect("webhook messages serialise");
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .set_message_group_id(message.owner.as_ref().map(message_group))
            .delay_seconds(delay_seconds.min(900) as i32)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("queue webhook of {}", message.job_id), e))?;
        Ok(())
    }

    /// Queues up to ten messages in one request (`SendMessageBatch`), each delivered at once or,
    /// if it is due later (`not_before`), then.
    /// Answers, in order, whether each message was queued: SQS accepts or refuses each entry
    /// of a batch on its own. An error means the request as a whole failed (none was queued).
    pub async fn send_batch(&self, messages: &[WebhookMessage]) -> Result<Vec<bool>, AwsError> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        assert!(messages.len() <= 10, "SQS takes at most ten messages per batch");
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let entries = messages
            .iter()
            .enumerate()
            .map(|(i, message)| {
                // A message due later (a progress window's trailing event) waits in the queue,
                // up to SQS's 15 minutes, instead of hopping through the function.
                let wait = (message.not_before - chrono::Utc::now().timestamp()).clamp(0, 900);
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(
                        serde_json::to_string(message).expect("webhook messages serialise"),
                    )
                    .delay_seconds(wait as i32)
                    .set_message_group_id(message.owner.as_ref().map(message_group))
                    .build()
                    .expect("id and body are set")
            })
            .collect();
        let output = self
            .client
            .send_message_batch()
            .queue_url(&self.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("queue {} webhooks", messages.len()), e))?;
        let mut queued = vec![false; messages.len()];
        for entry in output.successful() {
            if let Some(slot) = entry.id().parse::<usize>().ok().and_then(|i| queued.get_mut(i)) {
                *slot = true;
            }
        }
        Ok(queued)
    }
}

/// A dead-letter queue that takes what a function could not process, with the reason, for a
/// person to look at (docs/runbook.md).
#[derive(Debug, Clone)]
pub struct DeadLetterQueue {
    client: LazyClient<aws_sdk_sqs::Client>,
    url: String,
}

impl DeadLetterQueue {
    /// An adapter for the queue at `url`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_sqs::Client>>, url: String) -> Self {
        DeadLetterQueue { client: client.into(), url }
    }

    /// Sends `body` (a JSON document) to the queue.
    pub async fn send(&self, body: &serde_json::Value) -> Result<(), AwsError> {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body.to_string())
            .send()
            .await
            .map_err(|e| AwsError::new("dead-letter a message", e))?;
        Ok(())
    }
}

/// The schedule firing queue: what EventBridge Scheduler's twins send each tick to, and what
/// the API and the slots function (a scheduled job's end) send a trigger or an end to
/// ([`crate::scheduler::ScheduleFiring`]); the schedule firing function drains it.
#[derive(Debug, Clone)]
pub struct ScheduleQueue {
    client: LazyClient<aws_sdk_sqs::Client>,
    url: String,
}

impl ScheduleQueue {
    /// An adapter for the queue at `url`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_sqs::Client>>, url: String) -> Self {
        ScheduleQueue { client: client.into(), url }
    }

    /// Sends one firing.
    pub async fn send(&self, firing: &crate::scheduler::ScheduleFiring) -> Result<(), AwsError> {
        let body = serde_json::to_string(firing).expect("a firing always serialises");
        self.client.send_message().queue_url(&self.url).message_body(body).send().await.map_err(
            |e| AwsError::new(format!("send a firing of schedule {}", firing.schedule_id), e),
        )?;
        Ok(())
    }
}

/// Opens (and pools) a connection to SQS: asks for the queue's ARN, a read of metadata only.
async fn warm_queue(client: &aws_sdk_sqs::Client, url: &str) {
    let started = std::time::Instant::now();
    let result = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await;
    crate::sdk::log_warm_up("sqs", started, result);
}

impl IntakeQueue {
    /// Opens (and pools) a connection to SQS during init — see [`crate::sdk::warm_up`] for why.
    /// Every queue lives behind the same regional endpoint, so one warmed queue serves all.
    /// Needs `sqs:GetQueueAttributes` on the queue (template.yaml grants it for this alone).
    pub async fn warm(&self) {
        warm_queue(&self.client, &self.url).await;
    }
}

impl WebhookQueue {
    /// Opens (and pools) a connection to SQS during init — see [`IntakeQueue::warm`].
    pub async fn warm(&self) {
        warm_queue(&self.client, &self.url).await;
    }
}

/// Handles every record of an SQS batch at once (a batch holds at most ten) and reports the
/// ones that failed as batch item failures, so only those return to the queue — the partial
/// batch response every SQS consumer here gives (`ReportBatchItemFailures`).
pub async fn handle_batch<'a, F, Fut, E>(
    records: &'a [aws_lambda_events::sqs::SqsMessage],
    handle_record: F,
) -> aws_lambda_events::sqs::SqsBatchResponse
where
    F: Fn(&'a aws_lambda_events::sqs::SqsMessage) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let results = futures::future::join_all(records.iter().map(handle_record)).await;
    let mut response = aws_lambda_events::sqs::SqsBatchResponse::default();
    for (record, result) in records.iter().zip(results) {
        if result.is_err() {
            let mut failure = aws_lambda_events::sqs::BatchItemFailure::default();
            failure.item_identifier = record.message_id.clone().unwrap_or_default();
            response.batch_item_failures.push(failure);
        }
    }
    response
}
