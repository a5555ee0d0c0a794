//! Loading the AWS SDK configuration once per function.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::result::SdkError;

/// The HTTP client every SDK client uses: rustls with ring, one TLS stack for the whole binary
/// (the SDK default would compile a second one and slow builds and cold starts).
pub fn http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https()
}

/// Standard SDK configuration from the environment (region, credentials, `AWS_ENDPOINT_URL`).
/// There is deliberately no "local" switch: the local stack sets the same standard variables.
pub async fn load_sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest()).http_client(http_client()).load().await
}

/// Makes rustls with ring the process's TLS provider (once; later calls do nothing). HTTP
/// clients built without an explicit TLS configuration need one.
pub fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none()
        && rustls::crypto::ring::default_provider().install_default().is_err()
    {
        // Another thread installed one between the check and the install: that one serves.
        tracing::debug!("a TLS provider was installed concurrently");
    }
}

/// How long a function's init may spend warming connections, all services together.
///
/// Warming is an optimisation, never a precondition: past this budget init goes on and the
/// first invocation opens whatever connection is still missing itself. A TCP+TLS handshake to
/// an in-region endpoint is a few round trips plus certificate verification, far inside this;
/// the budget only bounds the bad case (an endpoint that does not answer), so that it cannot
/// eat into the 10 s Lambda allows init.
pub const WARM_UP_BUDGET: std::time::Duration = std::time::Duration::from_millis(1500);

/// The partition and sort key of the item `JobStore::warm` reads. No item is ever written
/// there, and no job id or owner key can produce it (those keys all carry a `JOB#`, `IDEM#`,
/// `SECRET#`… prefix); functions whose policy grants no `GetItem` on the table are granted it on
/// this partition alone (`dynamodb:LeadingKeys` in template.yaml).
pub const WARM_UP_KEY: &str = "WARMUP";

/// The name of the execution `Executions::warm` describes. Executions are named after job ids
/// (UUIDv7), so none is ever called this; template.yaml grants `states:DescribeExecution` on
/// exactly this execution's ARN to the functions that do not already have it.
pub const WARM_UP_EXECUTION: &str = "warm-up";

/// Warms the SDK clients' connections during init: runs `calls` (the function's adapters'
/// `warm()` calls, joined so they run concurrently) for at most [`WARM_UP_BUDGET`], then returns
/// whatever happened. It never fails: each adapter logs its own outcome.
///
/// Why at init: for on-demand functions Lambda runs init on a full vCPU (not the share of one
/// that the memory size buys invocations; provisioned concurrency gets no such burst), and
/// before the first event is handed over, so the TCP and TLS handshakes (and the lazy parts of the SDK: loading the root certificates, resolving the
/// endpoint, signing) are done once here instead of inside the first invocation's latency —
/// the request that pays a cold start then pays only its own round trips. The connections stay
/// in the SDK's HTTP client pool (one pool for every client built from the same
/// [`load_sdk_config`]); a pooled connection the service closed in the meantime is replaced
/// transparently.
pub async fn warm_up(calls: impl Future<Output = ()>) {
    let started = std::time::Instant::now();
    match tokio::time::timeout(WARM_UP_BUDGET, calls).await {
        Ok(()) => {
            tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "warm-up done")
        }
        Err(_) => tracing::info!(
            budget_ms = WARM_UP_BUDGET.as_millis() as u64,
            "warm-up stopped at its time budget; the first invocation connects itself"
        ),
    }
}

/// Logs the outcome of one adapter's warm-up call. An error the *service* answered (no such
/// item, queue or execution; access denied) still means the connection was opened and pooled,
/// which is all a warm-up is for; only an error without a response (no connection, TLS failure,
/// timeout) means it was not.
pub(crate) fn log_warm_up<O, E, R>(
    service: &'static str,
    started: std::time::Instant,
    result: Result<O, SdkError<E, R>>,
) where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(_) => tracing::debug!(service, elapsed_ms, "connection warmed"),
        Err(err @ (SdkError::ServiceError(_) | SdkError::ResponseError(_))) => {
            tracing::debug!(service, elapsed_ms, answer = %crate::AwsError::new("warm-up", err), "connection warmed (the service answered an error)")
        }
        Err(err) => {
            tracing::info!(service, elapsed_ms, error = %crate::AwsError::new("warm-up", err), "connection not warmed")
        }
    }
}
