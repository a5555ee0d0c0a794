//! **webhooks** — the caller's webhooks: its signing secrets ([`secrets`]), its webhook
//! endpoints ([`endpoints`]) and their deliveries ([`deliveries`]).
//!
//! * `GET /webhooks/secret` (created on first use), `POST /webhooks/secret/rotate`.
//! * `POST /webhooks/endpoints` (201), `GET /webhooks/endpoints`,
//!   `GET|PATCH|DELETE /webhooks/endpoints/{endpoint_id}`,
//!   `POST /webhooks/endpoints/{endpoint_id}/enable`.
//! * `GET /webhooks/endpoints/{endpoint_id}/deliveries`,
//!   `POST /webhooks/deliveries/{webhook_id}/resend`,
//!   `POST /webhooks/endpoints/{endpoint_id}/recover`.
//!
//! Everything is the principal's own: another principal's endpoint, or a delivery of it, is
//! `404`, as a malformed id is. Every refusal is a problem (`application/problem+json`) and
//! writes nothing. One concern per file: `secrets`, `endpoints` (the endpoint routes),
//! `deliveries` (listing, resending and recovering deliveries), `view` (what an endpoint and
//! a delivery read as).

pub mod lambda;

mod deliveries;
mod endpoints;
mod secrets;
mod view;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_deliveries;
#[cfg(test)]
mod tests_endpoints;

use std::sync::Arc;

use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, principal, route_key};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, RecordRetention};
use longhaul_aws::ports::{
    Clock, EndpointDeliveries, EndpointStore, SystemClock, WebhookDispatch, WebhookSecrets,
};
use longhaul_aws::queue::WebhookQueue;
use longhaul_domain::callback::CallbackPolicy;
use longhaul_domain::endpoints::DEFAULT_MAX_ENDPOINTS;

pub use secrets::ROTATION_OVERLAP;

/// Largest accepted request body (an endpoint's spec, a recovery): a URL is at most 2 KiB and
/// a description 256 characters.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// `WEBHOOK_QUEUE_URL`: where resent and recovered deliveries are queued.
    pub queue_url: String,
    /// `LONGHAUL_MAX_ENDPOINTS` (the template's `TenantMaxEndpoints`; default
    /// [`DEFAULT_MAX_ENDPOINTS`]): endpoints per principal.
    pub max_endpoints: u32,
    /// `LONGHAUL_ALLOW_INSECURE_CALLBACKS=1` (local stack only): endpoint URLs may be `http`
    /// and loopback, as callback URLs may.
    pub allow_insecure: bool,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS`: how long delivery records are kept, so how far
    /// back a recovery may reach.
    pub record_retention: RecordRetention,
    /// How long a `pending` delivery may go with nothing recorded, attempted or queued before
    /// a resend takes it as lost: the deliverer's longest delay between attempts
    /// (`LONGHAUL_WEBHOOK_SCHEDULE_SECONDS`, read as the deliverer reads it) and an hour.
    pub lost_after: std::time::Duration,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            queue_url: vars.required("WEBHOOK_QUEUE_URL")?,
            max_endpoints: vars.parsed_or("LONGHAUL_MAX_ENDPOINTS", DEFAULT_MAX_ENDPOINTS)?,
            allow_insecure: vars.parsed_or("LONGHAUL_ALLOW_INSECURE_CALLBACKS", 0u8)? == 1,
            record_retention: RecordRetention::from_vars(vars)?,
            lost_after: std::time::Duration::from_secs(
                longhaul_aws::config::webhook_schedule(vars)?.longest_delay() + 3_600,
            ),
        })
    }
}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The owners' webhook secret records.
    pub secrets: Arc<dyn WebhookSecrets>,
    /// The owners' endpoints.
    pub endpoints: Arc<dyn EndpointStore>,
    /// The endpoints' delivery records.
    pub deliveries: Arc<dyn EndpointDeliveries>,
    /// The webhook queue: resent and recovered deliveries go there.
    pub queue: Arc<dyn WebhookDispatch>,
    /// The rules an endpoint's URL follows (a job's `callback_url`'s).
    pub callbacks: CallbackPolicy,
    /// Endpoints per principal.
    pub max_endpoints: u32,
    /// How long delivery records are kept.
    pub record_retention: RecordRetention,
    /// How long a `pending` delivery goes untouched before a resend takes it as lost.
    pub lost_after: std::time::Duration,
    /// What time it is.
    pub clock: Arc<dyn Clock>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the endpoints' table.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![self.endpoints.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let table = Arc::new(
            JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                .retaining(config.record_retention),
        );
        Deps {
            secrets: table.clone(),
            endpoints: table.clone(),
            deliveries: table,
            queue: Arc::new(WebhookQueue::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
                config.queue_url.clone(),
            )),
            callbacks: CallbackPolicy { allow_insecure: config.allow_insecure },
            max_endpoints: config.max_endpoints,
            record_retention: config.record_retention,
            lost_after: config.lost_after,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`longhaul_aws::logs`]) carrying the principal only: secrets and
/// endpoints belong to the principal, not to a job (no `job_id`, no `attempt`).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    use tracing::Instrument;
    let span = longhaul_aws::logs::job_span(None, None, principal(&request).as_ref());
    route(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}

async fn route(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = &principal(request).ok_or_else(Problem::unauthorized)?;
    match route_key(request).unwrap_or_default().as_str() {
        "GET /webhooks/secret" => secrets::get(deps, owner).await,
        "POST /webhooks/secret/rotate" => secrets::rotate(deps, owner).await,
        "POST /webhooks/endpoints" => endpoints::create(deps, request, owner).await,
        "GET /webhooks/endpoints" => endpoints::list(deps, owner).await,
        "GET /webhooks/endpoints/{endpoint_id}" => endpoints::get(deps, request, owner).await,
        "PATCH /webhooks/endpoints/{endpoint_id}" => endpoints::patch(deps, request, owner).await,
        "DELETE /webhooks/endpoints/{endpoint_id}" => endpoints::delete(deps, request, owner).await,
        "POST /webhooks/endpoints/{endpoint_id}/enable" => {
            endpoints::enable(deps, request, owner).await
        }
        "GET /webhooks/endpoints/{endpoint_id}/deliveries" => {
            deliveries::list(deps, request, owner).await
        }
        "POST /webhooks/deliveries/{webhook_id}/resend" => {
            deliveries::resend(deps, request, owner).await
        }
        "POST /webhooks/endpoints/{endpoint_id}/recover" => {
            deliveries::recover(deps, request, owner).await
        }
        _ => Err(Problem::not_found()),
    }
}

/// A store failure, logged with what was being done; the caller gets a plain `500`.
fn internal(doing: &'static str) -> impl Fn(longhaul_aws::jobs::StoreError) -> Problem {
    move |err| {
        tracing::error!(error = %err, "{doing} failed");
        Problem::internal()
    }
}

/// `response` marked never to be cached (what it shows changes, or is a secret).
fn no_store(mut response: Response<Body>) -> Response<Body> {
    use lambda_http::http::{HeaderValue, header};
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
