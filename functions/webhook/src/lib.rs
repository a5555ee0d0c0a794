//! **webhook** — delivers partners' events from the webhook queue, signed per Standard
//! Webhooks, with every attempt recorded: a job's terminal event to its own `callback_url`,
//! and its owner's webhook endpoints' events (see [`endpoint`] for what differs for them:
//! health, disabling, the tenant's rate, progress and expiry reminders).
//!
//! * 2xx → delivered; `410 Gone` → the partner asked us to stop; anything else (another
//!   status, a timeout, a refused connection) → retried on a schedule of growing delays that
//!   spans more than a day (SQS delays a message at most 15 minutes, so longer waits hop), then
//!   the delivery goes to the webhook dead-letter queue. Every retry keeps the `webhook-id`.
//! * SSRF: the callback URL is checked again now, its host resolved once, every address
//!   checked, and the request connects to the checked address (no second lookup, and no proxy
//!   from the environment: a proxy would resolve the host itself), follows no redirects, gives
//!   up after 10 s and reads at most 4 KiB of the answer.
//! * Bounded: the lookup gets 2 s, the request (connect, answer, body) 10 s; running out of
//!   either is a failed attempt of that delivery alone, retried on the schedule. A batch's
//!   records are delivered concurrently ([`longhaul_aws::queue::handle_batch`]), so a batch
//!   takes as long as its slowest delivery (≤ 12 s by default), not their sum, and one slow
//!   partner cannot time the function out and have SQS redeliver everyone else's webhooks.

mod endpoint;
pub mod lambda;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::future::BoxFuture;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{DeliveryRecord, JobStore};
use longhaul_aws::limits::{RateCounter, TenantRateLimiter};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::ports::{
    Clock, DeliveryLog, EndpointDeliveries, EndpointHealth, EndpointStore, JobReads, RateLimits,
    SystemClock, WebhookDispatch, WebhookSecrets,
};
use longhaul_aws::queue::{WebhookMessage, WebhookQueue};
use longhaul_domain::JobStatus;
use longhaul_domain::callback::{CallbackPolicy, Host, check_address, parse_callback_url};
use longhaul_domain::webhooks::{DeliveryOutcome, RetrySchedule, event_type, message_id, sign};
use serde_json::json;
use tracing::Instrument;

/// Most bytes of a receiver's answer that are read.
pub const MAX_RESPONSE_BYTES: usize = 4096;

/// Resolves callback hosts. The deliverer resolves once and connects to what it checked;
/// tests swap in answers that change after submission.
pub trait Resolver: Send + Sync {
    /// The addresses of `host`.
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver.
#[derive(Debug, Clone, Copy)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// `WEBHOOK_QUEUE_URL`: where retries go.
    pub queue_url: String,
    /// `WEBHOOK_DLQ_URL`: where exhausted deliveries go.
    pub dead_letter_url: String,
    /// `LONGHAUL_WEBHOOK_SCHEDULE_SECONDS` (comma-separated delays; default 5 s … 10 h, ~27.6 h).
    pub schedule: RetrySchedule,
    /// `LONGHAUL_WEBHOOK_TIMEOUT_MS` (10,000): the whole request — connect, answer and the
    /// bounded read of its body.
    pub timeout: Duration,
    /// `LONGHAUL_WEBHOOK_RESOLVE_TIMEOUT_MS` (2,000): the lookup of the callback's host. With
    /// `timeout`, it bounds one delivery; keep their sum well under the function's 30 s.
    pub resolve_timeout: Duration,
    /// `LONGHAUL_ALLOW_INSECURE_CALLBACKS=1` (local stack only).
    pub allow_insecure: bool,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS`: how long delivery records are kept (their TTL).
    pub record_retention: longhaul_aws::jobs::RecordRetention,
    /// `LONGHAUL_ENDPOINT_DISABLE_AFTER_SECONDS` (432,000: 5 days): how long every attempt to
    /// an endpoint may fail before it is disabled.
    pub disable_after: Duration,
    /// `LONGHAUL_TENANT_WEBHOOK_RATE` (600): attempts to a tenant's endpoints per minute, and
    /// as many progress events, counted apart (0: unlimited); a delivery over it waits for the
    /// next minute without using an attempt, a progress event over it is dropped.
    pub tenant_rate: u32,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let schedule = longhaul_aws::config::webhook_schedule(vars)?;
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            queue_url: vars.required("WEBHOOK_QUEUE_URL")?,
            dead_letter_url: vars.required("WEBHOOK_DLQ_URL")?,
            schedule,
            timeout: Duration::from_millis(vars.parsed_or("LONGHAUL_WEBHOOK_TIMEOUT_MS", 10_000)?),
            resolve_timeout: Duration::from_millis(
                vars.parsed_or("LONGHAUL_WEBHOOK_RESOLVE_TIMEOUT_MS", 2_000)?,
            ),
            allow_insecure: vars.parsed_or("LONGHAUL_ALLOW_INSECURE_CALLBACKS", 0u8)? == 1,
            record_retention: longhaul_aws::jobs::RecordRetention::from_vars(vars)?,
            disable_after: Duration::from_secs(vars.parsed_or(
                "LONGHAUL_ENDPOINT_DISABLE_AFTER_SECONDS",
                longhaul_domain::endpoints::DEFAULT_DISABLE_AFTER.as_secs(),
            )?),
            tenant_rate: vars.parsed_or("LONGHAUL_TENANT_WEBHOOK_RATE", 600)?,
        })
    }
}

/// What the function needs of the job table: to read a job, its owner's signing secrets, and
/// to record each callback delivery attempt.
pub trait Jobs: JobReads + WebhookSecrets + DeliveryLog {}
impl<T: JobReads + WebhookSecrets + DeliveryLog> Jobs for T {}

/// What the function needs of owners' webhook endpoints: to read one, to record what an
/// attempt says of its health, and to record each delivery.
pub trait Endpoints: EndpointStore + EndpointHealth + EndpointDeliveries {}
impl<T: EndpointStore + EndpointHealth + EndpointDeliveries> Endpoints for T {}

/// What the handler needs, built once per sandbox: its ports, settings and resolver.
#[derive(Clone)]
pub struct Deps {
    /// The job table (jobs, secrets, delivery records).
    pub jobs: Arc<dyn Jobs>,
    /// Owners' webhook endpoints and their delivery records.
    pub endpoints: Arc<dyn Endpoints>,
    /// The webhook queue (retries).
    pub queue: Arc<dyn WebhookDispatch>,
    /// The webhook dead-letter queue.
    pub dead_letters: Arc<dyn WebhookDispatch>,
    /// Each tenant's rate of attempts to its endpoints (terminal events and reminders).
    pub rate: Arc<dyn RateLimits>,
    /// Each tenant's rate of progress events to its endpoints, counted apart.
    pub progress_rate: Arc<dyn RateLimits>,
    /// Settings.
    pub config: Config,
    /// Callback host resolution.
    pub resolver: Arc<dyn Resolver>,
    /// What time it is: whether a message is due, when its retry is, which secrets sign, when
    /// an attempt was made.
    pub clock: Arc<dyn Clock>,
    tls: Arc<rustls::ClientConfig>,
}

/// The TLS configuration of deliveries: rustls with ring and Mozilla's root certificates,
/// compiled in (`webpki-roots`: the set the system stores of Debian and Amazon Linux are made
/// from, already in the form rustls uses — reading and decoding the system store took more
/// than half of this function's init; BENCHMARKS.md, "Cold start").
pub fn tls_config() -> Result<rustls::ClientConfig, ConfigError> {
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Invalid {
            name: "TLS".into(),
            value: String::new(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table (delivery records), and the webhook queue (a retry).
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>, self.queue.clone()]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(
        sdk: &aws_config::SdkConfig,
        config: &Config,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, ConfigError> {
        longhaul_aws::sdk::install_tls_provider();
        let sqs = longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new);
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let store = Arc::new(
            JobStore::new(dynamodb.clone(), config.table.clone())
                .retaining(config.record_retention),
        );
        Ok(Deps {
            jobs: store.clone(),
            endpoints: store,
            queue: Arc::new(WebhookQueue::new(sqs.clone(), config.queue_url.clone())),
            dead_letters: Arc::new(WebhookQueue::new(sqs, config.dead_letter_url.clone())),
            rate: Arc::new(
                TenantRateLimiter::new(dynamodb.clone(), config.table.clone(), config.tenant_rate)
                    .counting(RateCounter::Deliveries),
            ),
            progress_rate: Arc::new(
                TenantRateLimiter::new(dynamodb, config.table.clone(), config.tenant_rate)
                    .counting(RateCounter::ProgressDeliveries),
            ),
            config: config.clone(),
            resolver,
            clock: Arc::new(SystemClock),
            tls: Arc::new(tls_config()?),
        })
    }
}

/// Delivers a batch; returns the messages to retry through SQS (unexpected failures only:
/// a receiver's failure is retried on the webhook schedule, not by redelivery).
pub async fn handle(deps: &Deps, event: SqsEvent) -> SqsBatchResponse {
    longhaul_aws::queue::handle_batch(&event.records, |record| process_record(deps, record)).await
}

/// One record, in its job's `job` span ([`logs`]): the job id from the message, the job's
/// attempt and principal from its record once read (a delay hop reads nothing and logs
/// nothing). `delivery_attempt` is the webhook's own attempt number.
async fn process_record(deps: &Deps, record: &SqsMessage) -> Result<(), String> {
    let message_id = record.message_id.as_deref().unwrap_or_default();
    let message: WebhookMessage = match serde_json::from_str(
        record.body.as_deref().unwrap_or_default(),
    ) {
        Ok(message) => message,
        Err(err) => {
            let err = format!("not a webhook message: {err}");
            tracing::error!(message_id, error = %err, "webhook processing failed; the message will be retried");
            return Err(err);
        }
    };
    let span = logs::job_span(Some(&message.job_id), None, None);
    async {
        let result = process(deps, &message).await;
        if let Err(err) = &result {
            tracing::error!(message_id, delivery_attempt = message.attempt, error = %err,
                "webhook processing failed; the message will be retried");
        }
        result
    }
    .instrument(span)
    .await
}

/// One delivery attempt (or a hop of a long delay). Records the job's attempt and principal
/// in the current `job` span.
pub async fn process(deps: &Deps, message: &WebhookMessage) -> Result<(), String> {
    let at = deps.clock.now();
    let now = at.timestamp();
    if message.not_before > now {
        let wait = (message.not_before - now) as u64;
        return deps.queue.send(message, wait).await.map_err(|e| e.to_string());
    }
    if let (Some(endpoint), Some(event)) = (&message.endpoint_id, message.event) {
        return endpoint::process(deps, message, endpoint, event).await;
    }
    let Some(job) = deps.jobs.job(&message.job_id).await.map_err(|e| e.to_string())? else {
        tracing::warn!("webhook for a job that no longer exists; dropped");
        return Ok(());
    };
    logs::current_job(&job);
    let (Some(url), Some(event)) = (job.callback_url.clone(), event_type(message.status)) else {
        return Ok(());
    };
    let webhook_id = message_id(&job.job_id, message.status);
    let payload = terminal_payload(&job, message.status, at.into());
    let Attempt { status_code, error, latency_ms } =
        attempt(deps, &job.owner, &url, &webhook_id, &payload).await?;
    let further = deps.config.schedule.delay_before(message.attempt + 1).is_some();
    let outcome = DeliveryOutcome::of(status_code, further);
    let record = DeliveryRecord {
        webhook_id: webhook_id.clone(),
        event: event.to_owned(),
        attempt: message.attempt,
        at: deps.clock.now().into(),
        status_code,
        latency_ms,
        error,
        outcome,
    };
    deps.jobs.record_delivery(&job.job_id, &record).await.map_err(|e| e.to_string())?;
    // Neither the callback URL nor the request error (which names the URL) is logged: a
    // partner's URL may carry a token. The delivery record keeps them for the owner.
    tracing::info!(
        webhook_id,
        delivery_attempt = message.attempt,
        status_code,
        latency_ms,
        outcome = outcome.as_str(),
        "webhook attempt made"
    );
    match outcome {
        DeliveryOutcome::Delivered => metrics::count(Metric::WebhookDelivered, &job),
        DeliveryOutcome::Retrying => {
            let delay = deps.config.schedule.delay_before(message.attempt + 1).unwrap_or(0);
            let next = WebhookMessage {
                attempt: message.attempt + 1,
                not_before: now + delay as i64,
                ..message.clone()
            };
            deps.queue.send(&next, delay).await.map_err(|e| e.to_string())?;
        }
        DeliveryOutcome::DeadLettered => {
            deps.dead_letters.send(message, 0).await.map_err(|e| e.to_string())?;
            metrics::count(Metric::WebhookFailed, &job);
            tracing::warn!(
                webhook_id,
                delivery_attempt = message.attempt,
                "webhook retries exhausted; dead-lettered"
            );
        }
        DeliveryOutcome::Stopped => tracing::info!(
            webhook_id,
            delivery_attempt = message.attempt,
            "receiver answered 410 Gone; no more attempts"
        ),
    }
    Ok(())
}

/// The body of a job's terminal event (`job.succeeded`, `job.failed`, `job.cancelled`), the
/// same for its callback and its owner's endpoints; a job that compensated says how it went.
pub fn terminal_payload(
    job: &longhaul_aws::jobs::JobRecord,
    status: JobStatus,
    at: longhaul_domain::Timestamp,
) -> serde_json::Value {
    let mut payload = json!({
        "type": event_type(status),
        "job_id": job.job_id,
        "status": status,
        "timestamp": job.finished_at.unwrap_or(at),
    });
    if status == JobStatus::Succeeded {
        payload["result_url"] = format!("/jobs/{}/result", job.job_id).into();
        if let Some(summary) = &job.summary {
            payload["summary"] = summary.clone();
        }
    }
    if let Some(error) = &job.error {
        payload["error"] = json!({ "code": error.code, "message": error.message });
    }
    if let Some(compensation) = &job.compensation {
        // Sent once the undos ran: how they went (`failed`: one was given up, and which).
        payload["compensation"] = json!({
            "status": compensation.status,
            "stages": compensation.stages.iter().map(|step| {
                let mut shown = json!({"stage": step.stage, "status": step.status, "at": step.at});
                if let Some(error) = &step.error {
                    shown["error"] = error.as_str().into();
                }
                shown
            }).collect::<Vec<_>>(),
        });
    }
    payload
}

/// What one HTTP attempt came to.
struct Attempt {
    /// The receiver's status code, if it answered.
    status_code: Option<u16>,
    /// Why it did not answer.
    error: Option<String>,
    /// How long the attempt took.
    latency_ms: u64,
}

/// Signs `payload` as message `webhook_id` with `owner`'s active secrets and POSTs it to
/// `url` (checked against SSRF again, pinned to the checked address). `Err` only when the
/// secrets could not be read (the message is retried by SQS).
async fn attempt(
    deps: &Deps,
    owner: &longhaul_domain::Owner,
    url: &str,
    webhook_id: &str,
    payload: &serde_json::Value,
) -> Result<Attempt, String> {
    let at = deps.clock.now();
    let now = at.timestamp();
    let body = serde_json::to_vec(payload).expect("payloads serialise");
    let secrets = deps.jobs.webhook_secrets(owner).await.map_err(|e| e.to_string())?;
    let signature = secrets
        .active(at.into())
        .iter()
        .filter_map(|s| sign(&s.secret, webhook_id, now, &body).ok())
        .collect::<Vec<_>>()
        .join(" ");
    let started = Instant::now();
    let result = deliver(deps, url, webhook_id, now, &signature, body).await;
    let latency_ms = started.elapsed().as_millis() as u64;
    Ok(match result {
        Ok(code) => Attempt { status_code: Some(code), error: None, latency_ms },
        Err(err) => Attempt { status_code: None, error: Some(err), latency_ms },
    })
}

/// The client of one delivery: `host` connects to `address` (the checked one) and nowhere
/// else. No proxy — reqwest would otherwise use `HTTP(S)_PROXY`/`ALL_PROXY`, and a proxy
/// resolves the host itself, bypassing the check; no redirects; `timeout` bounds the whole
/// request, from connecting to the end of the body.
pub fn delivery_client(
    host: &str,
    address: SocketAddr,
    timeout: Duration,
    tls: rustls::ClientConfig,
) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .resolve(host, address)
        .tls_backend_preconfigured(tls)
        .build()
}

/// Makes the HTTP request to the checked address; the status code, or why there is none.
async fn deliver(
    deps: &Deps,
    url: &str,
    webhook_id: &str,
    timestamp: i64,
    signature: &str,
    body: Vec<u8>,
) -> Result<u16, String> {
    let policy = CallbackPolicy { allow_insecure: deps.config.allow_insecure };
    let callback =
        parse_callback_url(url, &policy).map_err(|e| format!("callback URL refused: {e}"))?;
    let port = callback.port();
    let (host, address) = match callback.host() {
        Host::Ip(ip) => (ip.to_string(), SocketAddr::new(ip, port)),
        Host::Domain(name) => {
            // A lookup that hangs fails this attempt only; it must not eat the time of the
            // batch's other deliveries (the function's own timeout would redeliver them all).
            let limit = deps.config.resolve_timeout;
            let addresses = tokio::time::timeout(limit, deps.resolver.resolve(&name, port))
                .await
                .map_err(|_| format!("{name} did not resolve within {} ms", limit.as_millis()))?
                .map_err(|e| format!("{name} does not resolve: {e}"))?;
            for address in &addresses {
                check_address(address.ip(), &policy)
                    .map_err(|_| format!("{name} resolves to a non-public address"))?;
            }
            let first = *addresses.first().ok_or_else(|| format!("{name} has no addresses"))?;
            (name, first)
        }
    };
    let client = delivery_client(&host, address, deps.config.timeout, (*deps.tls).clone())
        .map_err(|e| format!("client: {e}"))?;
    let mut response = client
        .post(callback.url().clone())
        .header("content-type", "application/json")
        .header("user-agent", "longhaul-webhooks/1")
        .header("webhook-id", webhook_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() { "timed out".to_owned() } else { format!("request failed: {e}") }
        })?;
    let status = response.status().as_u16();
    // Read (and discard) a bounded part of the answer, so a slow or huge body cannot hold us.
    let mut read = 0;
    while read < MAX_RESPONSE_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            Ok(None) | Err(_) => break,
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests;
