//! The queues' contracts ([`DispatchQueue`], [`WebhookDispatch`], [`DeadLetters`]): what is
//! sent arrives as sent, once per send, delayed or not; a batch says which entries were taken.
//! (SQS refuses a delay beyond 15 minutes and the in-memory intake queue does too; the emulator
//! does not, so that clause is the memory adapter's own test.)
//!
//! `received` drains what the queue under test delivered so far: message bodies, as JSON.

use longhaul_aws::ports::{DeadLetters, DispatchQueue, WebhookDispatch};
use longhaul_aws::queue::{DispatchMessage, WebhookMessage};
use longhaul_domain::{JobId, JobStatus};
use serde_json::Value;

/// Runs the intake queue's contract on `queue`.
pub async fn dispatch_queue(
    queue: &impl DispatchQueue,
    received: impl AsyncFn(usize) -> Vec<Value>,
) {
    let owner = crate::owner("contract-owner");
    let first = DispatchMessage::new(JobId::new());
    // Submit's message: the job as written, carried whole (but for what it leaves out).
    let second =
        DispatchMessage::snapshot(&super::pending_job(&owner, longhaul_domain::Timestamp::now()));
    queue.send(&first, &owner).await.expect("a message is sent");
    queue.send_delayed(&second, 1, &owner).await.expect("a delayed one too");
    let mut got: Vec<DispatchMessage> = received(2)
        .await
        .iter()
        .map(|body| serde_json::from_value(body.clone()).expect("a dispatch message names its job"))
        .collect();
    got.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    let mut sent = vec![first, second];
    sent.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    assert_eq!(got, sent, "each message arrives once, as sent");
}

/// Runs the webhook queue's contract on `queue`.
pub async fn webhook_queue(
    queue: &impl WebhookDispatch,
    received: impl AsyncFn(usize) -> Vec<Value>,
) {
    let message = |attempt| WebhookMessage {
        attempt,
        ..WebhookMessage::callback(JobId::new(), JobStatus::Succeeded)
    };
    let batch: Vec<WebhookMessage> = (1..=3).map(message).collect();
    assert_eq!(queue.send_batch(&batch).await.unwrap(), [true, true, true], "every entry taken");
    assert!(queue.send_batch(&[]).await.unwrap().is_empty(), "an empty batch is nothing");
    let hop = message(4);
    queue.send(&hop, 0).await.expect("a message is sent");
    let mut got: Vec<(JobId, u64)> = received(4)
        .await
        .iter()
        .map(|body| {
            let message: WebhookMessage =
                serde_json::from_value(body.clone()).expect("a webhook message");
            (message.job_id, u64::from(message.attempt))
        })
        .collect();
    got.sort();
    let mut sent: Vec<(JobId, u64)> =
        batch.iter().chain([&hop]).map(|m| (m.job_id.clone(), u64::from(m.attempt))).collect();
    sent.sort();
    assert_eq!(got, sent, "each message arrives once, as sent");
}

/// Runs a dead-letter queue's contract on `queue`.
pub async fn dead_letters(queue: &impl DeadLetters, received: impl AsyncFn(usize) -> Vec<Value>) {
    let body = serde_json::json!({"reason": "contract", "job_id": JobId::new()});
    queue.send(&body).await.expect("a dead letter is kept");
    assert_eq!(received(1).await, vec![body], "kept as sent");
}
