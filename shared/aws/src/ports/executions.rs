//! Executions of the job state machine.

use async_trait::async_trait;

use super::Warm;
use crate::AwsError;
use crate::executions::{Executions, StartOutcome};

/// Executions of the job state machine.
#[async_trait]
pub trait JobExecutions: Warm {
    /// Starts execution `name` with `input`; a name used before is
    /// [`StartOutcome::AlreadyExists`], never a second run.
    async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError>;
    /// The status of execution `name` (`RUNNING`, `SUCCEEDED`, …), `None` if there is none.
    async fn status(&self, name: &str) -> Result<Option<String>, AwsError>;
    /// Stops execution `name` if it runs; stopping one that does not exist is not an error.
    async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError>;
}

#[async_trait]
impl Warm for Executions {
    async fn warm(&self) {
        Executions::warm(self).await
    }
}

#[async_trait]
impl JobExecutions for Executions {
    async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError> {
        Executions::start(self, name, input).await
    }
    async fn status(&self, name: &str) -> Result<Option<String>, AwsError> {
        Executions::status(self, name).await
    }
    async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError> {
        Executions::stop(self, name, cause).await
    }
}
