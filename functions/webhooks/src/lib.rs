//! **webhooks** — the caller's webhook signing secrets: `GET /webhooks/secret` (created on
//! first use) and `POST /webhooks/secret/rotate` (a new secret signs from now on; the previous
//! one keeps signing alongside it for 24 hours, so receivers can switch without a gap).
//!
//! At most two secrets are active ([`MAX_ACTIVE_SECRETS`]): a rotation within 24 hours of the
//! previous one retires the oldest at once. Rotations are conditional writes: of two at the
//! same time one wins and the other is answered `409` (`/problems/rotation-conflict`) — its
//! secret was never stored, so it is never handed out; `GET /webhooks/secret` shows the
//! winner's. Secrets are [`SecretString`](longhaul_domain::webhooks::SecretString)s, exposed
//! here only to be returned to their owner.

pub mod lambda;

use std::sync::Arc;
use std::time::Duration;

use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_response, principal, route_key};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, MAX_ACTIVE_SECRETS, Rotation, SecretsRecord};
use longhaul_aws::ports::{Clock, SystemClock, WebhookSecrets};
use longhaul_domain::Timestamp;
use longhaul_domain::webhooks::ExposeSecret;
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

/// What the handler needs, built once per sandbox: its ports.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table's webhook secret records.
    pub jobs: Arc<dyn WebhookSecrets>,
    /// What time it is: when a rotation's overlap ends, which secrets are still shown.
    pub clock: Arc<dyn Clock>,
}

impl Deps {
    /// Builds the AWS adapter from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: Arc::new(JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())),
            clock: Arc::new(SystemClock),
        }
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`longhaul_aws::logs`]) carrying the principal only: webhook
/// secrets belong to the principal, not to a job (no `job_id`, no `attempt`).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    use tracing::Instrument;
    let span = longhaul_aws::logs::job_span(None, None, principal(&request).as_ref());
    secrets(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}

async fn secrets(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let failed = |err: longhaul_aws::jobs::StoreError| {
        tracing::error!(error = %err, "webhook secrets failed");
        Problem::internal()
    };
    let record = match route_key(request).as_deref() {
        Some("POST /webhooks/secret/rotate") => {
            let until = deps.clock.now()
                + chrono::Duration::from_std(ROTATION_OVERLAP).expect("a day fits");
            match deps.jobs.rotate_webhook_secret(&owner, until.into()).await {
                Ok(Rotation::Rotated(record)) => record,
                Ok(Rotation::Lost(_)) => {
                    tracing::info!("a concurrent rotation won; this one was not stored");
                    return Err(rotation_conflict());
                }
                Err(err) => return Err(failed(err)),
            }
        }
        _ => deps.jobs.webhook_secrets(&owner).await.map_err(failed)?,
    };
    let mut response = json_response(StatusCode::OK, &render(&record, deps.clock.now().into()));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// 409: another rotation was stored between this one's read and its write.
fn rotation_conflict() -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "rotation-conflict",
        "Another rotation won",
        "Another rotation of your webhook secret was made at the same time and won; this one \
         was not made. GET /webhooks/secret shows the secrets that sign now.",
    )
}

/// The body of both routes, at `now`. The one place a secret is exposed outside signing: to
/// its owner.
fn render(record: &SecretsRecord, now: Timestamp) -> serde_json::Value {
    let secrets: Vec<_> = record
        .active(now)
        .into_iter()
        .take(MAX_ACTIVE_SECRETS)
        .map(|s| {
            json!({
                "secret": s.secret.expose_secret(),
                "created_at": s.created_at,
                "expires_at": s.expires_at,
            })
        })
        .collect();
    json!({ "secrets": secrets })
}

#[cfg(test)]
mod tests;
