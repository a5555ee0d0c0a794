//! **dispatcher** — consumes the intake queue and starts one Step Functions execution per job.
//!
//! Order matters: the job moves `pending → queued` *before* the execution starts, so the
//! state machine's claim (`queued → running`) can never arrive first. Redelivered messages
//! are harmless: a job already `queued` is started again under the same execution name,
//! which Step Functions deduplicates. Failed records are reported as batch item failures, so
//! SQS retries them and, after `maxReceiveCount`, moves them to the dead-letter queue.
//!
//! A delayed job (`not_before`) is never started early: the `pending → queued` write is
//! conditional on its start having come, and a message that arrives before it (the reaper's,
//! sent up to 15 minutes early, or a redelivery) is sent again with the remaining delay.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::executions::{Executions, StartOutcome, execution_name};
use longhaul_aws::jobs::{JobStore, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
use longhaul_domain::{JobStatus, format_rfc3339, schedule};
use serde_json::json;
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `STATE_MACHINE_ARN`: the job state machine.
    pub state_machine_arn: String,
    /// `INTAKE_QUEUE_URL`: where a message that came before its job's start is sent again.
    pub intake_queue_url: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
        })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: JobStore,
    /// The job state machine.
    pub executions: Executions,
    /// The intake queue (to delay an early message again).
    pub intake: IntakeQueue,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
            executions: Executions::new(
                aws_sdk_sfn::Client::new(sdk),
                config.state_machine_arn.clone(),
            ),
            intake: IntakeQueue::new(
                aws_sdk_sqs::Client::new(sdk),
                config.intake_queue_url.clone(),
            ),
        }
    }
}

/// Why one message could not be dispatched (it will be retried, then dead-lettered).
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The body is not a dispatch message (a poison message: it ends in the DLQ).
    #[error("message body is not a dispatch message: {0}")]
    Malformed(serde_json::Error),
    /// The job table failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Step Functions failed.
    #[error(transparent)]
    Aws(#[from] longhaul_aws::AwsError),
}

/// Dispatches a batch; returns the messages to retry.
pub async fn handle(deps: &Deps, event: SqsEvent) -> SqsBatchResponse {
    longhaul_aws::queue::handle_batch(&event.records, |record| dispatch_record(deps, record)).await
}

/// One record, in its job's `job` span ([`logs`]): the job id from the message, the attempt
/// and the principal from the record the transition returns (no extra read). Only when that
/// first write fails are they unknown; a malformed message is about no job.
async fn dispatch_record(deps: &Deps, record: &SqsMessage) -> Result<(), DispatchError> {
    let message_id = record.message_id.as_deref().unwrap_or_default();
    let message: DispatchMessage = match serde_json::from_str(
        record.body.as_deref().unwrap_or_default(),
    ) {
        Ok(message) => message,
        Err(err) => {
            let err = DispatchError::Malformed(err);
            tracing::error!(message_id, error = %err, "dispatch failed; the message will be retried");
            return Err(err);
        }
    };
    let span = logs::job_span(Some(&message.job_id), None, None);
    async {
        let result = dispatch(deps, &message.job_id).await;
        if let Err(err) = &result {
            tracing::error!(message_id, error = %err, "dispatch failed; the message will be retried");
        }
        result
    }
    .instrument(span)
    .await
}

/// Moves the job to `queued` and starts its execution; idempotent. Records the job's
/// attempt and principal in the current `job` span.
pub async fn dispatch(deps: &Deps, job_id: &str) -> Result<(), DispatchError> {
    let mut name = execution_name(job_id, 1);
    let now = chrono::Utc::now();
    let request =
        TransitionRequest::new(job_id, &[JobStatus::Pending], JobStatus::Queued, "dispatched")
            .set("execution", AttributeValue::S(name.clone()))
            .set("dispatches", AttributeValue::N("1".into()))
            .due(&format_rfc3339(now));
    match deps.jobs.transition(request).await {
        Ok(job) => logs::current_job(&job),
        Err(StoreError::Conflict { current: Some(job) }) if job.status == JobStatus::Queued => {
            logs::current_job(&job);
            tracing::info!("job already queued; starting its execution again (idempotent)");
            if let Some(execution) = job.execution {
                name = execution;
            }
        }
        Err(StoreError::Conflict { current: Some(job) }) if job.status == JobStatus::Pending => {
            // Still pending, so the condition that failed is the start time: too early.
            logs::current_job(&job);
            let start = job
                .not_before
                .as_deref()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .map(|at| at.to_utc())
                .unwrap_or(now);
            let delay = schedule::sqs_delay(start, now).max(1);
            tracing::info!(
                not_before = job.not_before,
                delay,
                "before the job's start; delayed again"
            );
            let message = DispatchMessage { job_id: job_id.to_owned() };
            deps.intake.send_delayed(&message, delay).await?;
            return Ok(());
        }
        Err(StoreError::Conflict { current: Some(job) }) => {
            logs::current_job(&job);
            tracing::info!(status = %job.status, "job is past dispatch; nothing to do");
            return Ok(());
        }
        Err(StoreError::Conflict { current: None }) => {
            tracing::error!("dispatch message for a job that does not exist; dropping it");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    }
    match deps.executions.start(&name, &json!({ "job_id": job_id })).await? {
        StartOutcome::Started { execution_arn } => {
            tracing::info!(execution_arn, "execution started")
        }
        StartOutcome::AlreadyExists => tracing::info!("execution already exists"),
    }
    Ok(())
}
