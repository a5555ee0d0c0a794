//! **expirer** — runs on a schedule (`expirer`): a `succeeded` job whose result has passed its
//! retention (`LONGHAUL_RESULT_TTL_SECONDS`, default 7 days, per job type) loses its result
//! objects and becomes `expired` (`GET /jobs/{id}/result` → 410). Its records are then marked
//! for DynamoDB TTL after `LONGHAUL_RECORD_RETENTION_SECONDS` (default 30 days); the bucket's
//! lifecycle rules are only a backstop.

use std::time::Duration;

use chrono::{DateTime, Utc};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobRecord, JobStore, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Unit};
use longhaul_aws::objects::ObjectStore;
use longhaul_domain::{JobStatus, format_rfc3339};
use serde::Serialize;
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// `BUCKET_NAME`.
    pub bucket: String,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS` (2,592,000): how long an expired job's records stay.
    pub record_retention: Duration,
    /// `LONGHAUL_EXPIRER_PAGE` (200): most jobs expired per run.
    pub page: usize,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            record_retention: Duration::from_secs(
                vars.parsed_or("LONGHAUL_RECORD_RETENTION_SECONDS", 2_592_000)?,
            ),
            page: vars.parsed_or("LONGHAUL_EXPIRER_PAGE", 200)?,
        })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: JobStore,
    /// Results and checkpoints.
    pub objects: ObjectStore,
    /// Settings.
    pub config: Config,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
            objects: ObjectStore::new(aws_sdk_s3::Client::new(sdk), config.bucket.clone()),
            config: config.clone(),
        }
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Jobs expired.
    pub expired: u32,
    /// Objects deleted.
    pub objects_deleted: usize,
    /// Jobs that could not be handled this run (unreadable, or an AWS call failed), each
    /// logged with its reason. They are tried again next run; the others are not held up.
    pub errors: u32,
}

/// A run failed (it is retried at the next tick; nothing is half-done that a rerun cannot finish).
#[derive(Debug, thiserror::Error)]
#[error("expirer run failed: {0}")]
pub struct ExpirerError(String);

impl From<ExpirerError> for lambda_runtime::Diagnostic {
    fn from(err: ExpirerError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: "Expirer.Failed".into(),
            error_message: err.to_string(),
        }
    }
}

/// One run at `now`.
pub async fn handle(deps: &Deps, now: DateTime<Utc>) -> Result<Report, ExpirerError> {
    let mut report = Report::default();
    let due = deps
        .jobs
        .due("succeeded", &format_rfc3339(now), deps.config.page)
        .await
        .map_err(|e| ExpirerError(e.to_string()))?;
    // One job that cannot be handled is logged, counted and left for the next run: the index
    // is read oldest first, so failing the whole run would hold every job behind it up for good.
    for item in due {
        let job = match JobStore::job_from(item) {
            Ok(job) => job,
            Err(err) => {
                tracing::error!(error = %err, "a job record in the status index cannot be read; skipped");
                report.errors += 1;
                continue;
            }
        };
        // In the job's `job` span (see `longhaul_aws::logs`), from the record the index returned.
        let span = logs::span_of(&job);
        if let Err(err) = expire(deps, now, &job, &mut report).instrument(span.clone()).await {
            span.in_scope(|| tracing::error!(error = %err, "expiring the job failed; the next run tries again"));
            report.errors += 1;
        }
    }
    tracing::info!(report = ?report, "expirer run");
    Ok(report)
}

/// Expires one succeeded job whose retention passed (a job that changed meanwhile is skipped).
async fn expire(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobRecord,
    report: &mut Report,
) -> Result<(), ExpirerError> {
    // Objects first: a job marked expired must have no result left behind.
    for prefix in
        [format!("results/{}/", job.job_id), longhaul_aws::objects::checkpoints_prefix(&job.job_id)]
    {
        report.objects_deleted +=
            deps.objects.delete_prefix(&prefix).await.map_err(|e| ExpirerError(e.to_string()))?;
    }
    let request = TransitionRequest::new(
        &job.job_id,
        &[JobStatus::Succeeded],
        JobStatus::Expired,
        "result retention passed",
    );
    match deps.jobs.transition(request).await {
        Ok(_) => {}
        Err(StoreError::Conflict { .. }) => return Ok(()),
        Err(err) => return Err(ExpirerError(err.to_string())),
    }
    let retain_until =
        now + chrono::Duration::from_std(deps.config.record_retention).unwrap_or_default();
    deps.jobs
        .retain_until(&job.job_id, retain_until.timestamp())
        .await
        .map_err(|e| ExpirerError(e.to_string()))?;
    metrics::emit("JobsExpired", 1.0, Unit::Count, job);
    tracing::info!("expired: result retention passed");
    report.expired += 1;
    Ok(())
}
