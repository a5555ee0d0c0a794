//! The SQS intake queue: the buffer between accepting a job and starting its execution.

use serde::{Deserialize, Serialize};

use crate::AwsError;

/// The message submit sends and the dispatcher consumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchMessage {
    /// The job to dispatch.
    pub job_id: String,
}

/// Sends dispatch messages to the intake queue.
#[derive(Debug, Clone)]
pub struct IntakeQueue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl IntakeQueue {
    /// An adapter for the queue at `url`.
    pub fn new(client: aws_sdk_sqs::Client, url: String) -> Self {
        IntakeQueue { client, url }
    }

    /// Enqueues `job_id` for dispatch.
    pub async fn send(&self, message: &DispatchMessage) -> Result<(), AwsError> {
        let body = serde_json::to_string(message).expect("a dispatch message always serialises");
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("enqueue job {}", message.job_id), e))?;
        Ok(())
    }
}
