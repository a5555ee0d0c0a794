//! Step Functions: starting a job's execution.

use crate::client::LazyClient;
use aws_sdk_sfn::operation::start_execution::StartExecutionError;
use aws_sdk_sfn::operation::stop_execution::StopExecutionError;
use longhaul_domain::JobId;

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
    client: LazyClient<aws_sdk_sfn::Client>,
    state_machine_arn: String,
}

impl Executions {
    /// An adapter for the state machine `state_machine_arn`.
    pub fn new(
        client: impl Into<LazyClient<aws_sdk_sfn::Client>>,
        state_machine_arn: String,
    ) -> Self {
        Executions { client: client.into(), state_machine_arn }
    }

    /// Starts an execution named `name` with `input`. Names are unique per state machine for
    /// 90 days, so a repeated start (a redelivered message) never runs the job twice.
    pub async fn start(
        &self,
        name: &str,
        input: &serde_json::Value,
    ) -> Result<StartOutcome, AwsError> {
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
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(StartExecutionError::ExecutionAlreadyExists(_))
                ) =>
            {
                Ok(StartOutcome::AlreadyExists)
            }
            Err(err) => Err(AwsError::new(format!("start execution {name}"), err)),
        }
    }

    /// The ARN of this state machine's execution called `name`.
    pub fn execution_arn(&self, name: &str) -> String {
        format!("{}:{name}", self.state_machine_arn.replacen(":stateMachine:", ":execution:", 1))
    }

    /// The status of execution `name` (`RUNNING`, `SUCCEEDED`, `FAILED`, …), or `None` if it
    /// does not exist.
    pub async fn status(&self, name: &str) -> Result<Option<String>, AwsError> {
        match self.client.describe_execution().execution_arn(self.execution_arn(name)).send().await
        {
            Ok(output) => Ok(Some(output.status.as_str().to_owned())),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_execution_does_not_exist()) => {
                Ok(None)
            }
            Err(err) => Err(AwsError::new(format!("describe execution {name}"), err)),
        }
    }

    /// Stops the execution `name` (if it exists and runs), recording `cause`.
    pub async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError> {
        let result = self
            .client
            .stop_execution()
            .execution_arn(self.execution_arn(name))
            .error(longhaul_domain::ErrorCode::Cancelled.as_str())
            .cause(cause)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(StopExecutionError::ExecutionDoesNotExist(_))
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(AwsError::new(format!("stop execution {name}"), err)),
        }
    }
}

/// The execution name of a job's `dispatch`-th dispatch: the job id, so a repeated start is
/// deduplicated by Step Functions; later re-dispatches get a suffix.
pub fn execution_name(job_id: &JobId, dispatch: u32) -> String {
    if dispatch <= 1 { job_id.to_string() } else { format!("{job_id}-{dispatch}") }
}

impl Executions {
    /// Opens (and pools) a connection to Step Functions during init — see
    /// [`crate::sdk::warm_up`] for why. Describes the execution [`crate::sdk::WARM_UP_EXECUTION`],
    /// which never exists (the answer is `ExecutionDoesNotExist`); template.yaml grants
    /// `states:DescribeExecution` on that one ARN to functions that lack it.
    pub async fn warm(&self) {
        let started = std::time::Instant::now();
        let arn = self.execution_arn(crate::sdk::WARM_UP_EXECUTION);
        let result = self.client.describe_execution().execution_arn(arn).send().await;
        crate::sdk::log_warm_up("sfn", started, result);
    }
}
