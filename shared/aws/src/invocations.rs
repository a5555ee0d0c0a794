//! Lambda: invoking a job's worker function asynchronously (the direct path of a job that one
//! invocation may finish: [`crate::runs`]).

use crate::AwsError;
use crate::client::LazyClient;

/// Invokes functions asynchronously (`InvocationType=Event`): Lambda queues the event,
/// answers at once, retries a failed invocation (twice, by the function's event-invoke
/// configuration) and sends an event it gave up on to the function's on-failure destination.
#[derive(Debug, Clone)]
pub struct Invocations {
    client: LazyClient<aws_sdk_lambda::Client>,
    warm_up_target: Option<String>,
}

impl Invocations {
    /// An adapter over `client`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_lambda::Client>>) -> Self {
        Invocations { client: client.into(), warm_up_target: None }
    }

    /// This adapter, whose [`warm`](Invocations::warm) checks an invocation of `function` (a
    /// function ARN the caller may invoke) without running it.
    pub fn warming(self, function: &str) -> Self {
        Invocations { warm_up_target: Some(function.to_owned()), ..self }
    }

    /// Opens (and pools) a connection to Lambda during init — see [`crate::sdk::warm_up`] for
    /// why. A `DryRun` invocation of the [`warming`](Invocations::warming) function: Lambda
    /// checks the parameters and the caller's `lambda:InvokeFunction` permission (the grant
    /// the caller invokes that function by anyway) and runs nothing. No target: nothing.
    pub async fn warm(&self) {
        let Some(function) = &self.warm_up_target else { return };
        let started = std::time::Instant::now();
        let result = self.dry_run_call(function).await;
        crate::sdk::log_warm_up("lambda", started, result);
    }

    /// Checks that an invocation of `function` would be accepted (its parameters and the
    /// caller's `lambda:InvokeFunction` permission) without running it: a `DryRun`.
    pub async fn dry_run(&self, function: &str) -> Result<(), AwsError> {
        self.dry_run_call(function)
            .await
            .map(drop)
            .map_err(|err| AwsError::new(format!("dry-run invoke {function}"), err))
    }

    async fn dry_run_call(
        &self,
        function: &str,
    ) -> Result<
        aws_sdk_lambda::operation::invoke::InvokeOutput,
        aws_smithy_runtime_api::client::result::SdkError<
            aws_sdk_lambda::operation::invoke::InvokeError,
            aws_smithy_runtime_api::client::orchestrator::HttpResponse,
        >,
    > {
        self.client
            .invoke()
            .function_name(function)
            .invocation_type(aws_sdk_lambda::types::InvocationType::DryRun)
            .send()
            .await
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
