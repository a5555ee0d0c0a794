//! SQS event source mappings: poll the queue, invoke the function with a batch, delete what
//! succeeded. With `ReportBatchItemFailures`, the failed messages named in the response stay
//! on the queue (they reappear after the visibility timeout and, after `maxReceiveCount`, the
//! emulator's redrive policy moves them to the DLQ); a function error keeps the whole batch.

use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use serde_json::{Value, json};

use std::sync::Arc;

use crate::checks::faults::Faults;
use crate::hosting::hosted::HostedFunction;
use crate::stack::model::EventSpec;

/// Pollers each mapping runs (AWS starts with five; two keep a laptop quiet).
const POLLERS_PER_MAPPING: usize = 2;

/// Starts the pollers of every SQS mapping. `sqs` talks to the emulator directly: polling is
/// the event source mapping's work, not the function's, so it is not counted as its calls.
pub fn spawn(
    functions: &[HostedFunction],
    sqs: &aws_sdk_sqs::Client,
    faults: &Arc<Faults>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for function in functions {
        for event in &function.spec.events {
            let EventSpec::Sqs { queue_url, queue_arn, batch_size, report_batch_item_failures } =
                event
            else {
                continue;
            };
            for _ in 0..POLLERS_PER_MAPPING {
                let mapping = Mapping {
                    function: function.clone(),
                    sqs: sqs.clone(),
                    queue_url: queue_url.clone(),
                    queue_arn: queue_arn.clone(),
                    batch_size: (*batch_size).clamp(1, 10),
                    report_batch_item_failures: *report_batch_item_failures,
                    faults: faults.clone(),
                };
                tasks.push(tokio::spawn(mapping.run()));
            }
        }
    }
    tasks
}

struct Mapping {
    function: HostedFunction,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    queue_arn: String,
    batch_size: i32,
    report_batch_item_failures: bool,
    faults: Arc<Faults>,
}

impl Mapping {
    async fn run(self) {
        loop {
            if let Err(err) = self.poll_once().await {
                tracing::warn!(queue = self.queue_url, error = %err, "polling failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }

    /// The messages a function's response names as failed (none without ReportBatchItemFailures).
    fn batch_item_failures(&self, response: &Value) -> Vec<String> {
        if !self.report_batch_item_failures {
            return Vec::new();
        }
        response["batchItemFailures"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["itemIdentifier"].as_str().map(str::to_owned))
            .collect()
    }

    async fn poll_once(&self) -> anyhow::Result<()> {
        let received = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(self.batch_size)
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| longhaul_aws::AwsError::new("receive", e))?;
        let messages = received.messages.unwrap_or_default();
        if messages.is_empty() {
            return Ok(());
        }
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                let attributes: serde_json::Map<String, Value> = m
                    .attributes()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.as_str().to_owned(), Value::String(v.clone())))
                            .collect()
                    })
                    .unwrap_or_default();
                json!({
                    "messageId": m.message_id(),
                    "receiptHandle": m.receipt_handle(),
                    "body": m.body(),
                    "attributes": attributes,
                    "messageAttributes": {},
                    "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs",
                    "eventSourceARN": self.queue_arn,
                    "awsRegion": crate::stack::template::REGION,
                })
            })
            .collect();
        let event = json!({ "Records": records });
        let outcome = if self.faults.duplicate_delivery() {
            // At-least-once delivery, at its worst: two invocations with the same batch at
            // once. A message is done only if both handled it.
            let (first, second) =
                futures::join!(self.function.invoke(event.clone()), self.function.invoke(event));
            match (first, second) {
                (Ok(first), Ok(second)) => {
                    let mut failures = self.batch_item_failures(&first);
                    failures.extend(self.batch_item_failures(&second));
                    Ok(failures)
                }
                (Err(diagnostic), _) | (_, Err(diagnostic)) => Err(diagnostic),
            }
        } else {
            self.function.invoke(event).await.map(|response| self.batch_item_failures(&response))
        };
        let failed: Vec<String> = match outcome {
            Ok(failed) => failed,
            Err(diagnostic) => {
                tracing::warn!(
                    function = self.function.spec.logical,
                    error_type = diagnostic.error_type,
                    error = diagnostic.error_message,
                    "batch failed; its messages return after the visibility timeout"
                );
                return Ok(());
            }
        };
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| !failed.iter().any(|f| Some(f.as_str()) == m.message_id()))
            .filter_map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle()?)
                    .build()
                    .ok()
            })
            .collect();
        if !entries.is_empty() {
            let output = self
                .sqs
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| longhaul_aws::AwsError::new("delete batch", e))?;
            if !output.failed.is_empty() {
                tracing::warn!(
                    count = output.failed.len(),
                    "some processed messages could not be deleted; they will be redelivered"
                );
            }
        }
        Ok(())
    }
}
