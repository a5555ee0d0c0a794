//! **webhooks** — the caller's webhook signing secrets: `GET /webhooks/secret` (created on
//! first use) and `POST /webhooks/secret/rotate` (a new secret signs from now on; the previous
//! one keeps signing alongside it for 24 hours, so receivers can switch without a gap).

use std::time::Duration;

use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_response, principal, route_key};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, SecretsRecord};
use longhaul_domain::{format_rfc3339, now_rfc3339};
use serde_json::json;

/// How long a rotated-out secret keeps signing.
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config { table: vars.required("TABLE_NAME")? })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table (secret records).
    pub jobs: JobStore,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps { jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()) }
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`longhaul_aws::logs`]) carrying the principal only: webhook
/// secrets belong to the principal, not to a job (no `job_id`, no `attempt`).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    use tracing::Instrument;
    let span = longhaul_aws::logs::job_span(None, None, principal(&request).as_deref());
    secrets(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}

async fn secrets(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let record = match route_key(request).as_deref() {
        Some("POST /webhooks/secret/rotate") => {
            let until = chrono::Utc::now()
                + chrono::Duration::from_std(ROTATION_OVERLAP).expect("a day fits");
            deps.jobs.rotate_webhook_secret(&owner, &format_rfc3339(until)).await
        }
        _ => deps.jobs.webhook_secrets(&owner).await,
    }
    .map_err(|err| {
        tracing::error!(error = %err, "webhook secrets failed");
        Problem::internal()
    })?;
    let mut response = json_response(StatusCode::OK, &render(&record));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

fn render(record: &SecretsRecord) -> serde_json::Value {
    let secrets: Vec<_> = record
        .active(&now_rfc3339())
        .into_iter()
        .map(|s| json!({ "secret": s.secret, "created_at": s.created_at, "expires_at": s.expires_at }))
        .collect();
    json!({ "secrets": secrets })
}
