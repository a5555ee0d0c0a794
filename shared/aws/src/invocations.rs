//! Lambda: invoking a job's worker function asynchronously (the direct path of a job that one
//! invocation may finish: [`crate::runs`]).

use crate::AwsError;

/// Invokes functions asynchronously (`InvocationType=Event`): Lambda queues the event,
/// answers at once, retries a failed invocation (twice, by the function's event-invoke
/// configuration) and sends an event it gave up on to the function's on-failure destination.
#[derive(Debug, Clone)]
pub struct Invocations {
    client: aws_sdk_lambda::Client,
}

impl Invocations {
    /// An adapter over `client`.
    pub fn new(client: aws_sdk_lambda::Client) -> Self {
        Invocations { client }
    }

    /// Queues one invocation of `function` (a function ARN) with `payload`.
    pub async fn invoke_async(
        &self,
        function: &str,
        payload: &serde_json::Value,
    ) -> Result<(), AwsError> {
        self.client
            .invoke()
            .function_name(function)
            .invocation_type(aws_sdk_lambda::types::InvocationType::Event)
            .payload(aws_sdk_lambda::primitives::Blob::new(payload.to_string()))
            .send()
            .await
            .map(drop)
            .map_err(|err| AwsError::new(format!("invoke {function}"), err))
    }
}
