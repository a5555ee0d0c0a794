//! **schedules** — recurring jobs: the `/schedules` routes (this module) and the firing that
//! submits a schedule's job once per tick ([`fire`]).
//!
//! A schedule is a job spec (`type`, `params`, `callback_url`, `priority`, checked through the
//! registry as `POST /jobs` checks them) with an EventBridge Scheduler expression, a time zone,
//! an overlap rule and an optional window. Its record in the job table is the source of truth
//! (`longhaul_aws::jobs::ScheduleRecord`); its EventBridge Scheduler twin fires it
//! (`longhaul_aws::scheduler`), rewritten whole from the record after every change. Routes:
//! `POST /schedules` (201), `GET /schedules`, `GET|PATCH|DELETE /schedules/{id}`,
//! `POST /schedules/{id}/pause|resume|trigger`. Owner-scoped: another principal's schedule is
//! `404`. A tenant has at most `LONGHAUL_TENANT_MAX_SCHEDULES` (100) schedules; beyond, `429`.
//!
//! One concern per file: `spec` (a request's schedule, checked), `routes` (the routes),
//! `view` (what a schedule reads as), `fire` (the firing function), `repair` (the hourly sweep
//! that makes every twin what its record says).

pub mod fire;
pub mod lambda;
pub mod repair;
mod routes;
mod spec;
mod view;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, principal};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::JobStore;
use longhaul_aws::logs;
use longhaul_aws::ports::{Clock, ScheduleFirings, ScheduleStore, ScheduleTwins, SystemClock};
use longhaul_aws::queue::ScheduleQueue;
use longhaul_aws::scheduler::{Scheduler, SchedulerTarget};
use longhaul_domain::callback::CallbackPolicy;
use longhaul_worker::Registry;
use tracing::Instrument;

pub use view::render;

/// Schedules a tenant may have unless configured otherwise.
pub const DEFAULT_MAX_SCHEDULES: u32 = 100;
/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// Where twins live and what they send to.
    pub target: SchedulerTarget,
    /// `SCHEDULE_QUEUE_URL`: where a trigger is sent.
    pub queue_url: String,
    /// `LONGHAUL_TENANT_MAX_SCHEDULES`.
    pub max_schedules: u32,
    /// The kinds and callback rules `POST /jobs` applies (submit's configuration).
    pub submit: submit::Config,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            target: SchedulerTarget::from_vars(vars)?,
            queue_url: vars.required("SCHEDULE_QUEUE_URL")?,
            max_schedules: vars
                .parsed_or("LONGHAUL_TENANT_MAX_SCHEDULES", DEFAULT_MAX_SCHEDULES)?,
            submit: submit::Config::from_vars(vars)?,
        })
    }
}

/// What the routes need, built once per sandbox: their ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The schedules' records.
    pub store: Arc<dyn ScheduleStore>,
    /// Their EventBridge Scheduler twins.
    pub twins: Arc<dyn ScheduleTwins>,
    /// The firing queue (`trigger`).
    pub firings: Arc<dyn ScheduleFirings>,
    /// The job kinds a schedule may submit (as `POST /jobs` accepts them).
    pub registry: Registry,
    /// The callback URL rules.
    pub callbacks: CallbackPolicy,
    /// Schedules per tenant.
    pub max_schedules: u32,
    /// What time it is.
    pub clock: Arc<dyn Clock>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the schedules' table.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![self.store.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            store: Arc::new(JobStore::new(
                aws_sdk_dynamodb::Client::new(sdk),
                config.table.clone(),
            )),
            twins: Arc::new(Scheduler::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_scheduler::Client::new),
                config.target.clone(),
            )),
            firings: Arc::new(ScheduleQueue::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
                config.queue_url.clone(),
            )),
            registry: config.submit.registry(),
            callbacks: config.submit.callbacks(),
            max_schedules: config.max_schedules,
            clock: Arc::new(SystemClock),
        }
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`logs`]) carrying the principal only: a schedule is not a job.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    let span = logs::job_span(None, None, principal(&request).as_ref());
    routes::route(deps, &request).instrument(span).await.unwrap_or_else(Problem::into_response)
}
