//! Loading the AWS SDK configuration once per function.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls;

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
