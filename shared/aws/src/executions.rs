//! Step Functions: starting a job's execution.

use aws_sdk_sfn::operation::start_execution::StartExecutionError;

use crate::AwsError;

/// What happened to a start request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// A new execution (or, for an identical repeat while it runs, the same one).
    Started {
        /// The execution's ARN.
        execution_arn: String,
    },
    /// An execution with this name exists already (finished, or started with other input):
    /// the job was dispatched before, and execution names make starting idempotent.
    AlreadyExists,
}

/// Starts executions of the job state machine.
#[derive(Debug, Clone)]
pub struct Executions {
    client: aws_sdk_sfn::Client,
    state_machine_arn: String,
}

impl Executions {
    /// An adapter for the state machine `state_machine_arn`.
    pub fn new(client: aws_sdk_sfn::Client, state_machine_arn: String) -> Self {
        Executions { client, state_machine_arn }
    }

    /// Starts an execution named `name` with `input`. Names are unique per state machine for
    /// 90 days, so a repeated start (a redelivered message) never runs the job twice.
    pub async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError> {
        let result = self
            .client
            .start_execution()
            .state_machine_arn(&self.state_machine_arn)
            .name(name)
            .input(input.to_string())
            .send()
            .await;
        match result {
            Ok(output) => Ok(StartOutcome::Started { execution_arn: output.execution_arn }),
            Err(err) if matches!(err.as_service_error(), Some(StartExecutionError::ExecutionAlreadyExists(_))) => {
                Ok(StartOutcome::AlreadyExists)
            }
            Err(err) => Err(AwsError::new(format!("start execution {name}"), err)),
        }
    }
}
