//! Loading the AWS SDK configuration once per function.

use aws_config::environment::EnvironmentVariableCredentialsProvider;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

use std::sync::Arc;

use crate::config::{ConfigError, Vars};
use crate::ports::Warm;

/// The root certificates of Amazon Trust Services (Amazon Root CA 1–4 and Starfield Services
/// Root G2), which every AWS service endpoint's certificate chains to. Compiled in: see
/// [`SdkTrust`].
pub const AMAZON_TRUST_SERVICES_ROOTS: &[u8] = include_bytes!("../certs/amazon-trust-services.pem");

/// The environment variable that chooses [`SdkTrust`] (`amazon`, the default, or `system`).
pub const SDK_TRUST_VAR: &str = "LONGHAUL_SDK_TRUST";

/// Which root certificates the SDK's TLS connections trust.
///
/// The SDK only ever talks to AWS service endpoints, so by default it trusts only the five
/// Amazon Trust Services roots, compiled into the binary: a narrower trust than the system
/// store's ~150 roots, and no cost at init — loading the system store (reading the bundle and
/// the certificate directory, decoding every PEM in constant time) was most of a function's
/// init (BENCHMARKS.md, "Cold start"). `system` trusts the platform's store instead, for a
/// partition whose endpoints chain to other roots, or a TLS-inspecting proxy's own CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SdkTrust {
    /// Amazon Trust Services' roots only (compiled in).
    #[default]
    Amazon,
    /// The platform's root store (read when the first connection is made).
    System,
}

impl std::str::FromStr for SdkTrust {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "amazon" => Ok(SdkTrust::Amazon),
            "system" => Ok(SdkTrust::System),
            other => Err(format!("{other:?} is not a trust choice; expected amazon or system")),
        }
    }
}

impl SdkTrust {
    /// The choice `LONGHAUL_SDK_TRUST` makes (unset: [`SdkTrust::Amazon`]; any other value is
    /// an error, never a default).
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(vars.parsed(SDK_TRUST_VAR)?.unwrap_or_default())
    }

    fn trust_store(self) -> TrustStore {
        match self {
            SdkTrust::Amazon => {
                TrustStore::empty().with_pem_certificate(AMAZON_TRUST_SERVICES_ROOTS)
            }
            SdkTrust::System => TrustStore::default(),
        }
    }
}

/// The HTTP client every SDK client uses: rustls with ring, one TLS stack for the whole binary
/// (the SDK default would compile a second one and slow builds and cold starts), trusting the
/// Amazon Trust Services roots ([`SdkTrust::Amazon`]).
pub fn http_client() -> SharedHttpClient {
    http_client_trusting(SdkTrust::Amazon)
}

/// [`http_client`] with the roots `trust` chooses.
pub fn http_client_trusting(trust: SdkTrust) -> SharedHttpClient {
    let context = TlsContext::builder()
        .with_trust_store(trust.trust_store())
        .build()
        .expect("a TLS context of a trust store and no other setting is always valid");
    SharedHttpClient::new(ConnectorOnFirstUse(
        aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .tls_context(context)
            .build_https(),
    ))
}

/// The SDK's hyper client, less the connector it builds to check the configuration of every
/// client constructed from it.
///
/// `aws_smithy_http_client`'s client builds a whole connector (a rustls configuration: every
/// root certificate decoded, a root store built) in `validate_base_client_config`, which runs
/// in each service client's constructor, and throws it away, so that a system root store is
/// read at init rather than by the first request. Our roots are compiled in and cost nothing
/// to find; what that check costs is one connector per client built, at every cold start. The
/// connector the requests use is built on first use and shared by every client of the same
/// settings, as before; a TLS setting that cannot be built fails that first request instead
/// of the constructor (ours is the same every time, and the warm-up makes the first request
/// at init).
///
/// It forwards every method of `HttpClient` but that one: a method the trait gains with a
/// default body would take the default here until it is forwarded too.
#[derive(Debug)]
struct ConnectorOnFirstUse(SharedHttpClient);

impl HttpClient for ConnectorOnFirstUse {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn validate_final_config(
        &self,
        runtime_components: &RuntimeComponents,
        cfg: &ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.validate_final_config(runtime_components, cfg)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// A Lambda function's SDK configuration, from its environment `vars` (read once at init, with
/// the function's own configuration): region and endpoint from the standard variables
/// (`AWS_REGION`, `AWS_ENDPOINT_URL`), the execution role's credentials from the variables
/// Lambda sets (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), and the
/// roots `LONGHAUL_SDK_TRUST` chooses. There is deliberately no "local" switch: the local stack
/// sets the same standard variables.
///
/// Credentials come from the environment alone because that is where Lambda puts them: the
/// SDK's default chain would also build its profile, SSO, web-identity (an STS client, which
/// loads the system root store at once) and instance-metadata providers at init, for nothing.
/// For the same reason the configuration is built from those variables directly rather than
/// by `aws_config`'s loader, which would look for profile files and build a provider chain
/// for every setting. Besides region, endpoint and credentials it reads
/// `AWS_USE_FIPS_ENDPOINT` and `AWS_USE_DUALSTACK_ENDPOINT` (for a partition that needs them)
/// and sets standard retries (3 attempts) whatever the behaviour version; every other setting
/// takes the service client's default (timeouts, stalled-stream protection, the identity
/// cache, the tokio sleep). Other SDK variables (`AWS_ENDPOINT_URL_<SERVICE>`,
/// `AWS_MAX_ATTEMPTS`, `AWS_RETRY_MODE`…) are not read: Lambda sets none of them.
pub fn sdk_config_from(vars: &Vars) -> Result<SdkConfig, ConfigError> {
    let trust = SdkTrust::from_vars(vars)?;
    let region = match vars.parsed::<String>("AWS_REGION")? {
        Some(region) => region,
        None => vars.required("AWS_DEFAULT_REGION")?,
    };
    let mut config = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .retry_config(aws_config::retry::RetryConfig::standard())
        .use_fips(vars.parsed::<bool>("AWS_USE_FIPS_ENDPOINT")?.unwrap_or(false))
        .use_dual_stack(vars.parsed::<bool>("AWS_USE_DUALSTACK_ENDPOINT")?.unwrap_or(false))
        .region(aws_config::Region::new(region))
        .credentials_provider(SharedCredentialsProvider::new(
            EnvironmentVariableCredentialsProvider::new(),
        ))
        .http_client(http_client_trusting(trust));
    if let Some(endpoint) = vars.parsed::<String>("AWS_ENDPOINT_URL")? {
        config = config.endpoint_url(endpoint);
    }
    Ok(config.build())
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

/// Opens (and pools) a connection to DynamoDB during init — see [`warm_up`] for why. Reads
/// the item at [`WARM_UP_KEY`] of `table`, which never exists: an eventually consistent read
/// (half a read unit) that touches no data.
pub async fn warm_table(client: &aws_sdk_dynamodb::Client, table: &str) {
    let started = std::time::Instant::now();
    let key = aws_sdk_dynamodb::types::AttributeValue::S(WARM_UP_KEY.to_owned());
    let result =
        client.get_item().table_name(table).key("pk", key.clone()).key("sk", key).send().await;
    log_warm_up("dynamodb", started, result);
}

/// The name of the execution `Executions::warm` describes. Executions are named after job ids
/// (UUIDv7), so none is ever called this; template.yaml grants `states:DescribeExecution` on
/// exactly this execution's ARN to the functions that do not already have it.
pub const WARM_UP_EXECUTION: &str = "warm-up";

/// Warms the SDK clients' connections during init: runs the `adapters`' `warm()` calls, each
/// a task of its own (their CPU work — TLS, signing, the endpoint rules — runs on every
/// worker thread there is, their round trips overlap), for at most [`WARM_UP_BUDGET`], then
/// returns whatever happened; a call still running then is stopped. It never fails: each
/// adapter logs its own outcome.
///
/// Why at init: for on-demand functions Lambda runs init on a full vCPU (not the share of one
/// that the memory size buys invocations; provisioned concurrency gets no such burst), and
/// before the first event is handed over, so the TCP and TLS handshakes (and the lazy parts of the SDK: building the TLS configuration, resolving the
/// endpoint, signing) are done once here instead of inside the first invocation's latency —
/// the request that pays a cold start then pays only its own round trips. The connections stay
/// in the SDK's HTTP client pool (one pool for every client built from the same
/// [`sdk_config_from`]); a pooled connection the service closed in the meantime is replaced
/// transparently.
pub async fn warm_up(adapters: impl IntoIterator<Item = Arc<dyn Warm>>) {
    let started = std::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for adapter in adapters {
        calls.spawn(async move { adapter.warm().await });
    }
    let all_done = async {
        while let Some(done) = calls.join_next().await {
            if let Err(err) = done {
                tracing::warn!(error = %err, "a warm-up call failed; the first request connects itself");
            }
        }
    };
    match tokio::time::timeout(WARM_UP_BUDGET, all_done).await {
        Ok(()) => {
            tracing::debug!(elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "warm-up done")
        }
        Err(_) => tracing::info!(
            budget_ms = WARM_UP_BUDGET.as_millis() as u64,
            "warm-up stopped at its time budget; the first invocation connects itself"
        ),
    }
    // Dropping the set stops any call still running.
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

#[cfg(test)]
mod trust_tests {
    use super::*;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn the_compiled_in_roots_are_the_five_amazon_trust_services_roots_and_all_parse() {
        let certs: Vec<CertificateDer<'_>> =
            CertificateDer::pem_slice_iter(AMAZON_TRUST_SERVICES_ROOTS)
                .collect::<Result<_, _>>()
                .expect("the compiled-in PEM parses");
        assert_eq!(certs.len(), 5);
        let mut roots = rustls::RootCertStore::empty();
        let (valid, invalid) = roots.add_parsable_certificates(certs);
        assert_eq!((valid, invalid), (5, 0), "every root is a usable trust anchor");
    }

    #[test]
    fn the_sdk_configuration_takes_region_and_endpoint_from_the_lambda_environment() {
        let vars = |pairs: &[(&str, &str)]| {
            Vars::from_map(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
        };
        let config = sdk_config_from(&vars(&[
            ("AWS_REGION", "eu-west-1"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:4566"),
        ]))
        .unwrap();
        assert_eq!(config.region().map(|r| r.as_ref()), Some("eu-west-1"));
        assert_eq!(config.endpoint_url(), Some("http://127.0.0.1:4566"));
        assert!(config.credentials_provider().is_some());
        assert!(config.http_client().is_some());
        assert!(config.behavior_version().is_some());
        assert_eq!(config.retry_config().map(|r| r.max_attempts()), Some(3));
        assert_eq!((config.use_fips(), config.use_dual_stack()), (Some(false), Some(false)));
        let config = sdk_config_from(&vars(&[
            ("AWS_REGION", "us-gov-west-1"),
            ("AWS_USE_FIPS_ENDPOINT", "true"),
            ("AWS_USE_DUALSTACK_ENDPOINT", "true"),
        ]))
        .unwrap();
        assert_eq!((config.use_fips(), config.use_dual_stack()), (Some(true), Some(true)));
        let err = sdk_config_from(&vars(&[("AWS_REGION", "x"), ("AWS_USE_FIPS_ENDPOINT", "yes")]))
            .unwrap_err();
        assert!(err.to_string().contains("AWS_USE_FIPS_ENDPOINT"), "{err}");

        let config = sdk_config_from(&vars(&[("AWS_DEFAULT_REGION", "us-east-1")])).unwrap();
        assert_eq!(config.region().map(|r| r.as_ref()), Some("us-east-1"));
        assert_eq!(config.endpoint_url(), None, "no endpoint: the SDK resolves the region's");

        let err = sdk_config_from(&vars(&[])).unwrap_err();
        assert!(err.to_string().contains("AWS_DEFAULT_REGION"), "{err}");
        let err = sdk_config_from(&vars(&[("AWS_REGION", "eu-west-1"), (SDK_TRUST_VAR, "none")]))
            .unwrap_err();
        assert!(err.to_string().contains(SDK_TRUST_VAR), "{err}");
    }

    #[test]
    fn the_trust_choice_is_amazon_unless_set_and_a_wrong_value_is_an_error() {
        let vars = |pairs: &[(&str, &str)]| {
            Vars::from_map(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
        };
        assert_eq!(SdkTrust::from_vars(&vars(&[])).unwrap(), SdkTrust::Amazon);
        assert_eq!(
            SdkTrust::from_vars(&vars(&[(SDK_TRUST_VAR, "amazon")])).unwrap(),
            SdkTrust::Amazon
        );
        assert_eq!(
            SdkTrust::from_vars(&vars(&[(SDK_TRUST_VAR, "system")])).unwrap(),
            SdkTrust::System
        );
        for wrong in ["System", "native", "none"] {
            let err = SdkTrust::from_vars(&vars(&[(SDK_TRUST_VAR, wrong)])).unwrap_err();
            assert!(err.to_string().contains(SDK_TRUST_VAR), "{err}");
        }
    }
}
