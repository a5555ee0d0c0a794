//! **cancel** — `DELETE /jobs/{id}` and `POST /jobs/{id}/cancel`: the owner cancels a job;
//! `POST /jobs/{id}/pause` and `/resume` (see [`pause`]): the owner's other controls; and
//! `POST /jobs/{id}/signals/{name}` (and its signed link, see [`signals`]): a signal a job's
//! stage waits for.
//!
//! A `pending` or `queued` job is cancelled at once (and its execution, if one started, is
//! stopped); a `running` job gets a cooperative cancellation request that its stage honours
//! at its next progress write; a terminal job answers 409. Who asked and why is recorded.
//!
//! A request for a running job that was asked to stop before answers 202 with the first
//! request, and sets the progress record's flag again ([`JobStore::cancel`]): if the first
//! request's flag write failed (a 500 after the job record took the request), the retry is
//! what stops the worker. Should the worker die before it sees the flag, the reaper ends the
//! job `cancelled` with the same reason. A `paused` job is cancelled at once.
//!
//! A job that started stages its kind gave an undo ends through `compensating`: a `running`
//! one when its stage sees the request, a `pending`, `queued` or `paused` one at once (202
//! `compensating`), its worker then running the undos before it is `cancelled`. A
//! `compensating` job answers 409: it is ending already.

pub mod lambda;
mod pause;
mod signals;

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_response, path_job_id, principal, route_key, wrong_status};
use longhaul_aws::config::{ConfigError, Vars};
use std::sync::Arc;

use longhaul_aws::executions::{Executions, execution_name};
use longhaul_aws::jobs::{CancelOutcome, JobRecord, JobStore, StoreError};
use longhaul_aws::logs;
use longhaul_aws::metrics;
use longhaul_aws::ports::{
    Clock, DispatchQueue, JobCancellation, JobExecutions, JobPausing, JobReads, JobSignals,
    JobTransitions, SigningKey, SystemClock,
};
use longhaul_aws::queue::IntakeQueue;
use longhaul_aws::secrets::SecretKey;
use longhaul_domain::{Cancellation, JobStatus, Owner, Timestamp};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 4 * 1024;
/// Longest accepted reason.
pub const MAX_REASON_CHARS: usize = 500;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `STATE_MACHINE_ARN`: whose executions a cancellation stops.
    pub state_machine_arn: String,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS` (default 30 days): the TTL of a job it cancels.
    pub record_retention: longhaul_aws::jobs::RecordRetention,
    /// `INTAKE_QUEUE_URL`: where a resumed job is enqueued for dispatch.
    pub intake_queue_url: String,
    /// `STREAM_TOKEN_SECRET_ARN`: the secret whose value signs signal links (and, under
    /// another tag, stream links).
    pub token_secret_arn: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            record_retention: longhaul_aws::jobs::RecordRetention::from_vars(vars)?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            token_secret_arn: vars.required("STREAM_TOKEN_SECRET_ARN")?,
        })
    }
}

/// What the function needs of the job table: to read a job, to cancel, pause and resume it,
/// and to keep its signals.
pub trait Jobs: JobReads + JobTransitions + JobCancellation + JobPausing + JobSignals {}
impl<T: JobReads + JobTransitions + JobCancellation + JobPausing + JobSignals> Jobs for T {}

/// What the handler needs, built once per sandbox: its ports.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// The job state machine's executions, which a cancellation stops.
    pub executions: Arc<dyn JobExecutions>,
    /// What time it is: a cancellation's or pause's `requested_at`.
    pub clock: Arc<dyn Clock>,
    /// The intake queue, where a resumed job goes to be dispatched again.
    pub intake: Arc<dyn DispatchQueue>,
    /// The key signal links are signed with.
    pub token_key: Arc<dyn SigningKey>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table, and Step Functions (a cancel stops the job's execution).
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.executions.clone(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: Arc::new(
                JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                    .retaining(config.record_retention),
            ),
            executions: Arc::new(Executions::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sfn::Client::new),
                config.state_machine_arn.clone(),
            )),
            clock: Arc::new(SystemClock),
            intake: Arc::new(IntakeQueue::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
                config.intake_queue_url.clone(),
            )),
            token_key: Arc::new(SecretKey::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_secretsmanager::Client::new),
                config.token_secret_arn.clone(),
            )),
        }
    }
}

/// The body of a cancel or a pause (optional): `{"reason"?}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`logs`]): the principal from the token, the job id from the path,
/// the attempt once the job is read.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    let span = logs::job_span(None, None, principal(&request).as_ref());
    let answered = match route_key(&request).as_deref() {
        Some("POST /jobs/{id}/pause") => pause::pause(deps, &request).instrument(span).await,
        Some("POST /jobs/{id}/resume") => pause::resume(deps, &request).instrument(span).await,
        Some("POST /jobs/{id}/signals/{name}") => {
            signals::by_owner(deps, &request).instrument(span).await
        }
        Some("POST /jobs/{id}/signals/{name}/{token}") => {
            signals::by_link(deps, &request).instrument(span).await
        }
        _ => cancel(deps, &request).instrument(span).await,
    };
    answered.unwrap_or_else(Problem::into_response)
}

fn body(request: &Request) -> Result<CancelBody, Problem> {
    // The body is optional (DELETE usually has none).
    let bytes: &[u8] = request.body().as_ref();
    if bytes.is_empty() {
        return Ok(CancelBody::default());
    }
    let value = longhaul_aws::api::json_body(request, MAX_BODY_BYTES)?;
    let body: CancelBody = serde_json::from_value(value).map_err(|e| {
        Problem::bad_request(format!("The body does not match the schema ({{\"reason\"?}}): {e}"))
    })?;
    if body.reason.as_ref().is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
        return Err(Problem::bad_request(format!(
            "reason must be at most {MAX_REASON_CHARS} characters"
        )));
    }
    Ok(body)
}

/// The caller, the body (`{"reason"?}`) and the caller's job the path names (`404` for anyone
/// else's), read consistently — what every control starts from, recorded in the job's span.
async fn owned_job(
    deps: &Deps,
    request: &Request,
) -> Result<(Owner, CancelBody, JobRecord), Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let job_id = path_job_id(request)?;
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let body = body(request)?;
    let job = deps.jobs.job(&job_id).await.map_err(internal)?;
    let job = job.filter(|job| job.owner == owner).ok_or_else(Problem::not_found)?;
    logs::current_job(&job);
    Ok((owner, body, job))
}

async fn cancel(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let (owner, body, job) = owned_job(deps, request).await?;
    let job_id = job.job_id.clone();
    if job.status.is_terminal() {
        return Err(wrong_status(job.status, format!("The job is already {}.", job.status)));
    }
    let cancellation = Cancellation {
        requested_at: Timestamp::from(deps.clock.now()),
        requested_by: owner,
        reason: body.reason,
    };
    // The store cancels only a job that would not compensate; one that turned compensable in
    // the meantime (claimed, then parked or backing off) comes back here, read as it is now.
    let mut job = job;
    let mut rounds = 0;
    let job = loop {
        rounds += 1;
        if let Some(compensating) = compensate_instead(deps, &job, &cancellation).await? {
            return Ok(accepted(&compensating));
        }
        match deps.jobs.cancel(&job_id, &cancellation).await {
            Ok(CancelOutcome::Cancelled(job)) => {
                if job.transitions.iter().any(|t| t.state == JobStatus::Queued) {
                    // An execution may exist; stop it rather than let it find the job cancelled.
                    let name = job.execution.clone().unwrap_or_else(|| execution_name(&job_id, 1));
                    if let Err(err) = deps.executions.stop(&name, "cancelled by its owner").await {
                        // The job is cancelled either way: the execution's claim will be refused.
                        tracing::warn!(error = %err, "stopping the execution failed");
                    }
                }
                metrics::emit_end(&job);
                tracing::info!("cancelled");
                break job;
            }
            Ok(CancelOutcome::Requested(job)) => {
                tracing::info!("cancellation requested from the running stage");
                break job;
            }
            Err(StoreError::Conflict { current: Some(current) })
                if current.wants_compensation()
                    && matches!(
                        current.status,
                        JobStatus::Pending | JobStatus::Queued | JobStatus::Paused
                    )
                    && rounds < 3 =>
            {
                job = *current;
            }
            Err(StoreError::Conflict { current: Some(job) }) => {
                return Err(wrong_status(
                    job.status,
                    format!("The job is already {}.", job.status),
                ));
            }
            Err(err) => return Err(internal(err)),
        }
    };
    Ok(accepted(&job))
}

/// A `pending`, `queued` or `paused` job (as read) that started stages with an undo moves to
/// `compensating` instead of `cancelled`, unchanged since the read, and is sent to the
/// dispatcher, whose worker runs its undos and then ends it `cancelled`: the job, so moved.
/// `None`: it is cancelled as any other (or it moved meanwhile: the store's cancellation
/// then acts on it as it is now — a running one compensates when its stage sees the request).
async fn compensate_instead(
    deps: &Deps,
    job: &JobRecord,
    cancellation: &Cancellation,
) -> Result<Option<JobRecord>, Problem> {
    let from = job.status;
    if !job.wants_compensation()
        || !matches!(from, JobStatus::Pending | JobStatus::Queued | JobStatus::Paused)
    {
        return Ok(None);
    }
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Cancelled,
        reason: cancellation.log_reason(),
        error: None,
    };
    let request = longhaul_aws::jobs::compensation_request(
        &job.job_id,
        &[from],
        ending,
        cancellation.requested_at,
    )
    .unchanged_since(job.updated_at)
    .set("cancellation", cancellation);
    let moved = match deps.jobs.transition(request).await {
        Ok(moved) => moved,
        // Changed since the read: the store's cancellation acts on it as it is now (and
        // hands a job that is still compensable back to the caller's next round).
        Err(StoreError::Conflict { .. }) => return Ok(None),
        Err(err) => return Err(internal(err)),
    };
    if from == JobStatus::Queued {
        // Waiting out a backoff: the execution of its last attempt may not have ended yet.
        if let Some(name) = &moved.execution
            && let Err(err) = deps.executions.stop(name, "cancelled by its owner").await
        {
            tracing::warn!(error = %err, "stopping the execution failed");
        }
    }
    let message = longhaul_aws::queue::DispatchMessage::new(moved.job_id.clone());
    if let Err(err) = deps.intake.send(&message, &moved.owner).await {
        // Compensating is recorded: the reaper's compensating sweep sends it once it is due.
        tracing::warn!(error = %err, "sending the compensation failed; the reaper sends it later");
    }
    tracing::info!(%from, "cancelled; compensating first");
    Ok(Some(moved))
}

fn internal(err: StoreError) -> Problem {
    tracing::error!(error = %err, "job store failed");
    Problem::internal()
}

fn accepted(job: &JobRecord) -> Response<Body> {
    let location = format!("/jobs/{}", job.job_id);
    let mut response = json_response(
        StatusCode::ACCEPTED,
        &json!({
            "job_id": job.job_id,
            "status": job.status,
            "status_url": location,
            "cancellation": job.cancellation,
        }),
    );
    response
        .headers_mut()
        .insert(header::LOCATION, location.parse().expect("job ids are header-safe"));
    response
}

#[cfg(test)]
mod tests;
