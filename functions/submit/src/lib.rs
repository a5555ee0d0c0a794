//! **submit** — the routes that create jobs: `POST /jobs` (validate, store the job under its
//! idempotency key, start it, answer `202 Accepted` at once) and `POST /jobs/{id}/retry`
//! (re-run a failed or cancelled job as a new job linked to the old one).
//!
//! Idempotency follows draft-ietf-httpapi-idempotency-key-header: the `Idempotency-Key`
//! header, or a key derived from (principal, type, canonical params, callback URL) when it is
//! absent. A key names its job until its record's `expires_at`, then it is free again.
//! Conditional writes on the idempotency record and the job record decide every race, so
//! concurrent identical requests create exactly one job and start it once. A
//! replay answers `200` with the job once its record is stored, and `409` only before.
//!
//! One concern per file: `config` (the variables), `submission` and `retry` (the two routes),
//! `validation` (kind, params, callback URL), `create` (the idempotent creation), `limits`
//! (backlog cap and rate), `record` (the new job's record), `start` (at once, or its dispatch message),
//! `response` (the answers).

pub mod lambda;

use std::sync::Arc;
use std::time::Duration;

use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, principal, route_key};
use longhaul_aws::jobs::JobStore;
use longhaul_aws::limits::TenantRateLimiter;
use longhaul_aws::logs;
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::pool_rate::PoolRateLimiter;
use longhaul_aws::ports::{
    Clock, DispatchQueue, JobCreation, JobReads, RateLimits, SlotPools, SystemClock, UploadPresence,
};
use longhaul_aws::queue::IntakeQueue;
use longhaul_aws::slots::Admitter;
use longhaul_domain::callback::CallbackPolicy;
use longhaul_domain::policy::PolicyOverrides;
use longhaul_worker::Registry;
use tracing::Instrument;

mod config;
mod create;
mod limits;
mod record;
mod response;
mod retry;
mod start;
mod submission;
mod validation;

#[cfg(test)]
mod tests;

pub use config::{Config, DEFAULT_MAX_PENDING, DEFAULT_SUBMISSIONS_PER_MINUTE};
pub use create::{Accepted, IN_FLIGHT_WINDOW};
pub use limits::BACKLOG_RETRY_AFTER_SECONDS;
pub use record::stored_policy;
pub use response::{IDEMPOTENT_REPLAYED, RETRY_AFTER_SECONDS};
pub use submission::{MAX_KEY_LEN, ScheduledSubmission, check_job_spec, submit_scheduled};

use retry::retry;
use submission::submit;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the function needs of the job table: to read a job (the one retried, the one a key
/// names) and to create one.
pub trait Jobs: JobReads + JobCreation {}
impl<T: JobReads + JobCreation> Jobs for T {}

/// What the handler needs, built once per sandbox: its ports and its settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// The per-tenant submission rate limit: counted on the tenant pool's item where tenants'
    /// running jobs are bounded (`longhaul_aws::pool_rate`), else an item per minute.
    pub limiter: Arc<dyn RateLimits>,
    /// Submissions one tenant may make per minute (0: unlimited): what a new job's seat
    /// counts with its tenant pool's slot, on the counter [`Deps::limiter`] charges.
    pub submissions_per_minute: u32,
    /// The intake queue.
    pub intake: Arc<dyn DispatchQueue>,
    /// The bucket's uploads, which a job's params may name.
    pub uploads: Arc<dyn UploadPresence>,
    /// Idempotency window.
    pub idempotency_ttl: Duration,
    /// The job kinds accepted (the registry, filtered by `ENABLED_JOB_TYPES`).
    pub registry: Registry,
    /// Callback URL policy (https and public addresses only, unless insecure is allowed).
    pub callbacks: CallbackPolicy,
    /// The deployment's policy overrides.
    pub policy_overrides: PolicyOverrides,
    /// Jobs one principal may have not yet running (0: no cap).
    pub max_pending: usize,
    /// What time it is: what a delayed start counts from, and how long its message waits.
    pub clock: Arc<dyn Clock>,
    /// The dispatcher's steps, with which a job not delayed is started in the request that
    /// writes it; `None`: every job goes through the intake queue.
    pub start: Option<Arc<dispatcher::Deps>>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table, and the adapter a new job starts by ([`Deps::start_adapter`]).
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.start_adapter(),
        ]
    }

    /// The adapter a new job starts by, whose connection init warms (see
    /// [`longhaul_aws::sdk::warm_up`]): Lambda, which runs the job at once, where jobs start in
    /// the request; else the intake queue. (A job started in the request goes through the queue
    /// only when it is delayed or waits.)
    pub fn start_adapter(&self) -> Arc<dyn longhaul_aws::ports::Warm> {
        match &self.start {
            Some(start) => start.invocations.clone(),
            None => self.intake.clone(),
        }
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let sqs = longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new);
        let start = config.start.as_ref().map(|start| {
            Arc::new(dispatcher::Deps::sharing(sdk, dynamodb.clone(), sqs.clone(), start))
        });
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        // One counter per tenant, whichever way its jobs start: the tenant pool's item when
        // there are tenant pools (the seat counts there too), else an item per minute.
        let limiter: Arc<dyn RateLimits> = if config.tenant_max_running > 0 {
            let slots: Arc<dyn SlotPools> = match &start {
                Some(start) => start.slots.clone(),
                None => Arc::new(Admitter::new(
                    dynamodb.clone(),
                    sqs.clone(),
                    &config.table,
                    &config.intake_queue_url,
                )),
            };
            Arc::new(PoolRateLimiter::new(slots, config.submissions_per_minute, clock.clone()))
        } else {
            Arc::new(TenantRateLimiter::new(
                dynamodb.clone(),
                config.table.clone(),
                config.submissions_per_minute,
            ))
        };
        Deps {
            jobs: Arc::new(JobStore::new(dynamodb, config.table.clone())),
            limiter,
            submissions_per_minute: config.submissions_per_minute,
            intake: Arc::new(IntakeQueue::new(sqs, config.intake_queue_url.clone())),
            uploads: Arc::new(ObjectStore::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_s3::Client::new),
                config.bucket.clone(),
            )),
            idempotency_ttl: Duration::from_secs(config.idempotency_ttl_seconds),
            registry: config.registry(),
            callbacks: config.callbacks(),
            max_pending: config.max_pending,
            policy_overrides: config.policy_overrides.clone(),
            clock,
            start,
        }
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`logs`]): the principal from the token, the job id once minted (or
/// found under the idempotency key) and its attempt — 0 for a job that has not run yet.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    let span = logs::job_span(None, None, principal(&request).as_ref());
    async {
        let result = match route_key(&request).as_deref() {
            Some("POST /jobs/{id}/retry") => retry(deps, &request).await,
            _ => submit(deps, &request).await,
        };
        result.unwrap_or_else(Problem::into_response)
    }
    .instrument(span)
    .await
}
