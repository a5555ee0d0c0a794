//! Asynchronous invocations of the worker functions.

use async_trait::async_trait;

use super::Warm;
use crate::AwsError;
use crate::invocations::Invocations;

/// Queues invocations of a job's worker function (the direct path: [`crate::runs`]).
#[async_trait]
pub trait WorkerInvocations: Warm {
    /// Queues one invocation of `function` (its ARN) with `payload`; Lambda runs it, retries it
    /// if it fails and hands an event it gave up on to the function's on-failure destination.
    async fn invoke_async(
        &self,
        function: &str,
        payload: &serde_json::Value,
    ) -> Result<(), AwsError>;
}

#[async_trait]
impl Warm for Invocations {
    async fn warm(&self) {
        Invocations::warm(self).await
    }
}

#[async_trait]
impl WorkerInvocations for Invocations {
    async fn invoke_async(
        &self,
        function: &str,
        payload: &serde_json::Value,
    ) -> Result<(), AwsError> {
        Invocations::invoke_async(self, function, payload).await
    }
}
