//! **stage** — the Step Functions task that does a job's work.
//!
//! One function serves every task state of the job state machine, selected by `op`:
//! `work` (the state machine's `Run` state: claim the job if this execution holds no lease
//! yet — `queued → running`, minting the lease — then work through its stages until it is
//! done or the Lambda deadline nears, checkpointing, and record the success itself; answer
//! `continue`, `continue_as_new`, `cancelled` or `done`), `fail` (record why) and
//! `continue_as_new` (start the next execution of a long job before the history limit).
//!
//! Step Functions bills every state entered, so one `work` call does what once took the
//! `Claim`, `Start`, `Run`, `StageBoundary` and `Complete` states: a job's happy path enters
//! three states (`Run`, `Next?`, `Succeeded`) whatever its number of stages. The former ops
//! `claim`, `run` (one stage per call) and `complete` still answer, for executions started
//! under the previous definition while a deployment rolls over.
//!
//! A running job is cancelled cooperatively: the stage learns of it when its next progress
//! write is refused, deletes partial results and ends the job `cancelled` with the reason.
//!
//! Errors carry stable names the state machine matches: `Job.Retryable` (retried with
//! backoff), `Job.Fatal` (fails the job), `Job.LeaseLost` (another attempt owns the job: stop
//! with no further side effects), `Job.NotClaimable` (the job is not waiting to run). What a
//! failure tells the job's owner is kept apart from what the log is told ([`failure`]): the
//! state machine, and so the job record and its webhook, only ever gets the former.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lambda_runtime::Diagnostic;
use longhaul_aws::config::{ConfigError, ResultTtl, Vars};
use longhaul_aws::jobs::{JobStore, Lease, StoreError, TransitionRequest};
pub mod backoff;
pub mod engine;
pub mod failure;

use longhaul_aws::executions::Executions;
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::{ObjectStore, result_key};
use longhaul_aws::queue::IntakeQueue;
use longhaul_domain::retry::Backoff;
use longhaul_domain::{ErrorCode, JobError, JobStatus};
use longhaul_worker::{Cadence, Registry, StageOutcome};

use crate::engine::{Ctx, KindRun};
use crate::failure::{Failure, PublicMessage};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `BUCKET_NAME`: results and checkpoints.
    pub bucket: String,
    /// `LONGHAUL_STAGE_MARGIN_SECONDS` (default 30): stop and checkpoint this long before the
    /// Lambda deadline.
    pub margin: Duration,
    /// `LONGHAUL_PROGRESS_INTERVAL_MS` (default 2,000): least time between progress writes
    /// (a checkpoint or a stage boundary writes at once).
    pub progress_interval: Duration,
    /// `LONGHAUL_HEARTBEAT_INTERVAL_SECONDS` (default 30): most time between writes.
    pub heartbeat_interval: Duration,
    /// `LONGHAUL_CHECKPOINT_ITEMS` and `LONGHAUL_CHECKPOINT_SECONDS`: when set, override
    /// every kind's checkpoint cadence (its policy's, by default 1,000 items or 60 s).
    pub checkpoint_items: Option<u64>,
    /// See `checkpoint_items`.
    pub checkpoint_interval: Option<Duration>,
    /// `LONGHAUL_RUNS_PER_EXECUTION` (default 500): `run` invocations before the job
    /// continues in a new execution (a Standard execution is capped at 25,000 history
    /// events; one loop costs about 7).
    pub runs_per_execution: u32,
    /// `STATE_MACHINE_ARN`: for continuing as a new execution.
    pub state_machine_arn: String,
    /// `LONGHAUL_RESULT_TTL_SECONDS`: when set, how long every result is kept (else the
    /// kind's policy says).
    pub result_ttl: ResultTtl,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS` (default 30 days): the TTL of the records of a job
    /// this function ends (failed, cancelled), and of the progress records it writes.
    pub record_retention: longhaul_aws::jobs::RecordRetention,
    /// `INTAKE_QUEUE_URL`: where a job that failed an attempt is sent to start its next one.
    pub intake_queue_url: String,
    /// `LONGHAUL_RETRY_BASE_DELAY_SECONDS` (default 60): one step of the backoff between
    /// attempts ([`longhaul_domain::retry`]).
    pub backoff: Backoff,
    /// `LONGHAUL_MAX_ATTEMPTS`: when set, the attempts every job gets, whatever its policy says
    /// (as the reaper reads it).
    pub max_attempts: Option<u32>,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            margin: Duration::from_secs(vars.parsed_or("LONGHAUL_STAGE_MARGIN_SECONDS", 30)?),
            progress_interval: Duration::from_millis(
                vars.parsed_or("LONGHAUL_PROGRESS_INTERVAL_MS", 2_000)?,
            ),
            heartbeat_interval: Duration::from_secs(
                vars.parsed_or("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", 30)?,
            ),
            checkpoint_items: vars.parsed("LONGHAUL_CHECKPOINT_ITEMS")?,
            checkpoint_interval: vars
                .parsed("LONGHAUL_CHECKPOINT_SECONDS")?
                .map(Duration::from_secs),
            runs_per_execution: vars.parsed_or("LONGHAUL_RUNS_PER_EXECUTION", 500)?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            result_ttl: ResultTtl::from_vars(vars)?,
            record_retention: longhaul_aws::jobs::RecordRetention::from_vars(vars)?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            backoff: Backoff {
                base: Duration::from_secs(vars.parsed_or("LONGHAUL_RETRY_BASE_DELAY_SECONDS", 60)?),
            },
            max_attempts: vars.parsed("LONGHAUL_MAX_ATTEMPTS")?,
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
    /// Stop this long before the deadline.
    pub margin: Duration,
    /// Least time between progress writes.
    pub progress_interval: Duration,
    /// Most time between writes.
    pub heartbeat_interval: Duration,
    /// Checkpoint every so many items… (the deployment's override of the kinds' cadence)
    pub checkpoint_items: Option<u64>,
    /// …or so often.
    pub checkpoint_interval: Option<Duration>,
    /// `run` invocations per execution.
    pub runs_per_execution: u32,
    /// The job state machine (to continue as a new execution).
    pub executions: Executions,
    /// Result retention.
    pub result_ttl: ResultTtl,
    /// The job kinds this worker runs.
    pub registry: Registry,
    /// Where a job goes to start its next attempt after a backoff.
    pub intake: IntakeQueue,
    /// The backoff between attempts.
    pub backoff: Backoff,
    /// The deployment's override of every job's attempt budget.
    pub max_attempts: Option<u32>,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                .retaining(config.record_retention),
            objects: ObjectStore::new(aws_sdk_s3::Client::new(sdk), config.bucket.clone()),
            margin: config.margin,
            progress_interval: config.progress_interval,
            heartbeat_interval: config.heartbeat_interval,
            checkpoint_items: config.checkpoint_items.map(|n| n.max(1)),
            checkpoint_interval: config.checkpoint_interval,
            runs_per_execution: config.runs_per_execution.max(1),
            executions: Executions::new(
                aws_sdk_sfn::Client::new(sdk),
                config.state_machine_arn.clone(),
            ),
            result_ttl: config.result_ttl.clone(),
            registry: longhaul_jobs::registry(),
            intake: IntakeQueue::new(
                aws_sdk_sqs::Client::new(sdk),
                config.intake_queue_url.clone(),
            ),
            backoff: config.backoff,
            max_attempts: config.max_attempts,
        }
    }
}

/// The error a state's `Catch` hands to `fail` (`ResultPath: $.error`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StateError {
    /// The error name (`Job.Fatal`, `States.Timeout`, …).
    #[serde(rename = "Error")]
    pub error: String,
    /// The cause; for a Lambda error, JSON `{"errorType", "errorMessage"}`.
    #[serde(rename = "Cause", default)]
    pub cause: String,
}

/// An execution's state as the state machine carries it (`$`): what `work` reads, and (with
/// the lease and its answer) returns in place of it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct WorkState {
    /// The lease this execution holds: none before its first `work` (a continued execution
    /// starts with the lease of the attempt it continues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<TaskLease>,
    /// The previous `work` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunOutput>,
}

/// A task state's input.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StageInput {
    /// Claim the job if needed, work through its stages, record success.
    Work {
        /// The job.
        job_id: String,
        /// The execution's name (claims are idempotent per execution).
        execution: String,
        /// The execution's state (`$`).
        #[serde(default)]
        state: WorkState,
    },
    /// Take the job: `queued → running` (the previous definition's `Claim` state).
    Claim {
        /// The job.
        job_id: String,
        /// The execution's name (claims are idempotent per execution).
        execution: String,
    },
    /// Work on the current stage (the previous definition's `Run` state).
    Run {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: TaskLease,
        /// `run` invocations so far in this execution.
        #[serde(default)]
        loops: u32,
    },
    /// Start the next execution of this attempt (same lease) and let this one end.
    ContinueAsNew {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: TaskLease,
        /// The function ARN this execution's task states invoke (its input's `worker_arn`):
        /// the next execution runs in the same worker.
        #[serde(default)]
        worker_arn: Option<String>,
    },
    /// Mark the job succeeded (the previous definition's `Complete` state).
    Complete {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: TaskLease,
        /// What `run` returned.
        run: RunOutput,
    },
    /// Record a failure.
    Fail {
        /// The job.
        job_id: String,
        /// The claim's lease (the previous definition passes it here)…
        #[serde(default)]
        lease: Option<TaskLease>,
        /// …or the execution's state carries it…
        #[serde(default)]
        state: WorkState,
        /// …or, when the first `work` failed before answering, the job record names this
        /// execution as the one holding it.
        #[serde(default)]
        execution: Option<String>,
        /// What went wrong.
        error: StateError,
    },
}

/// The lease as the state machine carries it (`$.lease`, the claim's output): the
/// attempt's [`Lease`] plus the job's owner, so that every task of the attempt puts the
/// principal on its log lines without reading the job. A lease minted before the principal
/// was carried (or forged by a test) has none; `run` and the terminal tasks then take it from
/// the record they read or write anyway.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct TaskLease {
    /// The fencing lease.
    #[serde(flatten)]
    pub lease: Lease,
    /// The job's owner, for log context only (never for authorization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

impl std::ops::Deref for TaskLease {
    type Target = Lease;
    fn deref(&self) -> &Lease {
        &self.lease
    }
}

/// What `run` returns.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct RunOutput {
    /// `continue`, `continue_as_new`, `cancelled` or `done` (and from the one-stage `run`
    /// op, `next_stage`).
    pub next: String,
    /// The stage now current (its name shows in the execution history).
    #[serde(default)]
    pub stage: String,
    /// `run` invocations so far in this execution.
    #[serde(default)]
    pub loops: u32,
    /// When done: the result object's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// When done: how long the job type's results are kept (so `complete` needs no read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ttl_seconds: Option<u64>,
}

/// A stage failure, named for the state machine. Its `Display` is the log's form (with the
/// internal detail); the state machine gets only [`StageError::public_message`].
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Worth retrying (throttling, a transient dependency failure).
    #[error("{0}")]
    Retryable(Failure),
    /// Retrying cannot help.
    #[error("{0}")]
    Fatal(Failure),
    /// Another attempt holds the job; stop without side effects. (Never recorded on the job:
    /// the state machine ends such an execution without a failure.)
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The job is not waiting to be claimed. (Never recorded on the job either.)
    #[error("{0}")]
    NotClaimable(String),
    /// The owner asked to cancel the running job.
    #[error("cancellation requested")]
    Cancelled,
}

impl StageError {
    /// The stable error name the state machine matches on.
    pub fn name(&self) -> &'static str {
        match self {
            StageError::Retryable(_) => ErrorCode::Retryable.as_str(),
            StageError::Fatal(_) => ErrorCode::Fatal.as_str(),
            StageError::LeaseLost(_) => ErrorCode::LeaseLost.as_str(),
            StageError::NotClaimable(_) => ErrorCode::NotClaimable.as_str(),
            StageError::Cancelled => ErrorCode::Cancelled.as_str(),
        }
    }
}

impl StageError {
    /// A failure worth retrying: `public` for the job's owner, `internal` for the log only.
    pub fn retryable(public: PublicMessage, internal: impl std::fmt::Display) -> Self {
        StageError::Retryable(Failure::because(public, internal))
    }

    /// A failure retrying cannot help: `public` for the job's owner, `internal` for the log.
    pub fn fatal(public: PublicMessage, internal: impl std::fmt::Display) -> Self {
        StageError::Fatal(Failure::because(public, internal))
    }

    /// The message the state machine gets (and for `Job.Retryable` and `Job.Fatal`, the job's
    /// `error.message`): never the internal detail.
    pub fn public_message(&self) -> String {
        match self {
            StageError::Retryable(failure) | StageError::Fatal(failure) => {
                failure.public.to_string()
            }
            other => other.to_string(),
        }
    }
}

impl From<StageError> for Diagnostic {
    fn from(err: StageError) -> Diagnostic {
        Diagnostic { error_type: err.name().to_owned(), error_message: err.public_message() }
    }
}

/// An AWS call failed where no more particular message applies: the client is told a
/// dependency failed (and why, if the service refused for good: then it is not retried), the
/// log gets the chain.
impl From<longhaul_aws::AwsError> for StageError {
    fn from(err: longhaul_aws::AwsError) -> Self {
        StageError::from(failure::aws_failure(failure::SERVICE_FAILED, &err))
    }
}

/// A store failure during an attempt's own writes: a refused condition means the lease is
/// gone; anything else is worth retrying.
pub(crate) fn fenced(err: StoreError) -> StageError {
    match err {
        StoreError::Conflict { current } => StageError::LeaseLost(match current {
            Some(job) => format!("job is {} (attempt {})", job.status, job.attempt),
            None => "progress write refused".into(),
        }),
        StoreError::Illegal(e) => StageError::fatal(
            PublicMessage::fixed("the job is not in a state that allows this step"),
            e,
        ),
        other => store_failed(other),
    }
}

/// The job table failed (retried).
pub(crate) fn store_failed(err: StoreError) -> StageError {
    StageError::retryable(failure::STORE_FAILED, err)
}

/// The Lambda deadline (epoch milliseconds) as an `Instant`.
pub fn deadline_from_epoch_ms(deadline_ms: u64) -> Instant {
    let now_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// Handles one task invocation; `deadline` is when Lambda would stop the invocation.
///
/// Runs in the job's `job` span ([`logs`]): the job id from the input; the attempt and the
/// principal from the lease the state machine passes (the claim from the record it returns).
pub async fn handle(
    deps: &Deps,
    input: StageInput,
    deadline: Instant,
) -> Result<serde_json::Value, StageError> {
    let with_lease = |job_id: &str, lease: Option<&TaskLease>| {
        logs::job_span(
            Some(job_id),
            lease.map(|l| l.attempt),
            lease.and_then(|l| l.principal.as_deref()),
        )
    };
    let span = match &input {
        StageInput::Claim { job_id, .. } => with_lease(job_id, None),
        StageInput::Work { job_id, state, .. } => with_lease(job_id, state.lease.as_ref()),
        StageInput::Fail { job_id, lease, state, .. } => {
            with_lease(job_id, lease.as_ref().or(state.lease.as_ref()))
        }
        StageInput::Run { job_id, lease, .. }
        | StageInput::ContinueAsNew { job_id, lease, .. }
        | StageInput::Complete { job_id, lease, .. } => with_lease(job_id, Some(lease)),
    };
    let result = task(deps, input, deadline).instrument(span.clone()).await;
    // lambda_runtime logs a handler's error too, but after this span closed (a line about the
    // job without its id, attempt and principal): the stage's own line is the one that counts,
    // and main.rs drops the runtime's (`logs::init_subscriber`).
    if let Err(err) = &result {
        span.in_scope(|| tracing::error!(error_type = err.name(), error = %err, "task failed"));
    }
    result
}

/// `queued → running` for `execution` (idempotent per execution), minting the lease.
async fn claim(deps: &Deps, job_id: &str, execution: &str) -> Result<TaskLease, StageError> {
    let (lease, job) = deps.jobs.claim(job_id, execution).await.map_err(|err| match err {
        StoreError::Conflict { current } => StageError::NotClaimable(format!(
            "job {job_id} is {}",
            current.map(|j| j.status.as_str()).unwrap_or("missing")
        )),
        other => store_failed(other),
    })?;
    logs::record_job(&tracing::Span::current(), &job);
    tracing::info!("claimed");
    if lease.attempt == 1
        && let (Ok(created), Some(Ok(started))) = (
            chrono::DateTime::parse_from_rfc3339(&job.created_at),
            job.started_at.as_deref().map(chrono::DateTime::parse_from_rfc3339),
        )
    {
        metrics::emit(Metric::QueueWait, (started - created).num_milliseconds() as f64, &job);
    }
    Ok(TaskLease { lease, principal: Some(job.owner.clone()) })
}

/// Works through the job's stages until it needs the state machine again: stage boundaries
/// are crossed within the invocation, and success is recorded here, not in a state of its own.
async fn work(
    deps: &Deps,
    job_id: &str,
    lease: &TaskLease,
    loops: u32,
    deadline: Instant,
) -> Result<RunOutput, StageError> {
    loop {
        let output = run(deps, job_id, lease, loops, deadline).await?;
        match output.next.as_str() {
            // The next stage reads the progress record `run` just moved on (one strong read).
            "next_stage" => continue,
            "done" => {
                complete(deps, job_id, lease, &output).await?;
                return Ok(output);
            }
            _ => return Ok(output),
        }
    }
}

/// `running → succeeded` with the result `run` stored (fenced).
async fn complete(
    deps: &Deps,
    job_id: &str,
    lease: &Lease,
    run: &RunOutput,
) -> Result<(), StageError> {
    let result_key = run.result_key.clone().ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::fixed("the job ended without a result")))
    })?;
    let ttl = run
        .result_ttl_seconds
        .map(Duration::from_secs)
        .unwrap_or_else(|| deps.result_ttl.default_ttl());
    let expires =
        chrono::Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(7));
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Running],
        JobStatus::Succeeded,
        "result stored",
    )
    .fenced(&lease.token)
    .set("result_key", aws_sdk_dynamodb::types::AttributeValue::S(result_key))
    .indexed_at(longhaul_domain::format_rfc3339(expires));
    end_job(deps, request, lease).await?;
    tracing::info!("succeeded");
    Ok(())
}

/// The lease a `fail` task records the failure under: the one passed, or — when the
/// execution's first `work` failed before answering — the job's, if this execution holds it.
async fn failing_lease(
    deps: &Deps,
    job_id: &str,
    given: Option<TaskLease>,
    execution: Option<&str>,
) -> Result<Option<TaskLease>, StageError> {
    if given.is_some() {
        return Ok(given);
    }
    let Some(execution) = execution else { return Ok(None) };
    let job = deps.jobs.job(job_id).await.map_err(store_failed)?;
    Ok(job.and_then(|job| match (job.status, job.lease) {
        (JobStatus::Running, Some(token)) if job.execution.as_deref() == Some(execution) => {
            Some(TaskLease {
                lease: Lease { attempt: job.attempt, token },
                principal: Some(job.owner),
            })
        }
        _ => None,
    }))
}

async fn task(
    deps: &Deps,
    input: StageInput,
    deadline: Instant,
) -> Result<serde_json::Value, StageError> {
    match input {
        StageInput::Work { job_id, execution, state } => {
            let lease = match state.lease {
                Some(lease) => lease,
                None => claim(deps, &job_id, &execution).await?,
            };
            let loops = state.run.map_or(0, |run| run.loops) + 1;
            let output = work(deps, &job_id, &lease, loops, deadline).await?;
            Ok(json!({ "job_id": job_id, "lease": lease, "run": output }))
        }
        StageInput::Claim { job_id, execution } => {
            let lease = claim(deps, &job_id, &execution).await?;
            Ok(serde_json::to_value(lease).expect("leases serialise"))
        }
        StageInput::Run { job_id, lease, loops } => {
            let output = run(deps, &job_id, &lease, loops + 1, deadline).await?;
            Ok(serde_json::to_value(output).expect("outputs serialise"))
        }
        StageInput::ContinueAsNew { job_id, lease, worker_arn } => {
            let n = deps.jobs.count_continuation(&job_id, &lease.token).await.map_err(fenced)?;
            let name = format!("{job_id}.a{}c{n}", lease.attempt);
            deps.jobs.record_execution(&job_id, &lease.token, &name).await.map_err(fenced)?;
            let input = json!({ "job_id": job_id, "lease": lease, "run": { "next": "start", "loops": 0 },
                longhaul_aws::workers::INPUT_KEY: worker_arn });
            deps.executions.start(&name, &input).await?;
            tracing::info!(execution = name, "continued as a new execution");
            Ok(json!({ "execution": name }))
        }
        StageInput::Complete { job_id, lease, run } => {
            complete(deps, &job_id, &lease, &run).await?;
            Ok(json!({}))
        }
        StageInput::Fail { job_id, lease, state, execution, error } => {
            let Some(lease) =
                failing_lease(deps, &job_id, lease.or(state.lease), execution.as_deref()).await?
            else {
                // Never claimed by this execution: nothing of the job is this execution's to end.
                tracing::warn!(
                    error = error.error,
                    "the execution failed before holding the job; nothing recorded"
                );
                return Ok(json!({ "next": "unrecorded" }));
            };
            let span = tracing::Span::current();
            logs::record_attempt(&span, lease.attempt);
            if let Some(principal) = &lease.principal {
                logs::record_principal(&span, principal);
            }
            // Only a message written for the client is recorded (the job's `error`, its
            // transition log, its webhook); a cause it replaces goes to the log.
            let (message, replaced) = failure::recorded_message(&error.error, &error.cause);
            if replaced {
                tracing::warn!(
                    error = error.error,
                    cause = error.cause,
                    "the failure's cause is not shown to the client; recorded as {message:?}"
                );
            }
            let job = deps.jobs.job(&job_id).await.map_err(store_failed)?;
            let running_ours = job.as_ref().is_some_and(|job| {
                job.status == JobStatus::Running && job.lease.as_deref() == Some(&lease.token)
            });
            let cancel_requested = job.as_ref().is_some_and(|job| job.cancellation.is_some());
            if error.error == StageError::Cancelled.name() || (running_ours && cancel_requested) {
                // A cancellation that surfaced as an error (raised where the run could not end
                // the job itself), or a failure after the owner asked to cancel: the job ends
                // `cancelled`, as its owner asked, neither `failed` nor retried.
                finish_cancellation(deps, &job_id, &lease).await?;
                return Ok(json!({ "next": "cancelled" }));
            }
            let job_error = JobError { code: error.error, message };
            if let Some(job) = &job
                && let Some(scheduled) =
                    backoff::schedule_retry(deps, job, &lease, &job_error).await?
            {
                return Ok(json!({ "next": "retry", "retry_at": scheduled.retry_at }));
            }
            let request = TransitionRequest::new(
                &job_id,
                &[JobStatus::Running],
                JobStatus::Failed,
                job_error.message.clone(),
            )
            .fenced(&lease.token)
            .set("error", serde_dynamo::to_attribute_value(&job_error).expect("errors serialise"));
            end_job(deps, request, &lease).await?;
            tracing::warn!(code = job_error.code, "failed");
            Ok(json!({ "next": "failed" }))
        }
    }
}

async fn run(
    deps: &Deps,
    job_id: &str,
    lease: &TaskLease,
    loops: u32,
    deadline: Instant,
) -> Result<RunOutput, StageError> {
    let view = deps.jobs.view(job_id).await.map_err(store_failed)?;
    let view = view.ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::fixed("the job does not exist")))
    })?;
    let job = &view.job;
    if lease.principal.is_none() {
        logs::record_principal(&tracing::Span::current(), &job.owner);
    }
    let ours = job.lease.as_deref() == Some(&lease.token);
    let ended = |next: &str, result_key: Option<String>| RunOutput {
        next: next.into(),
        loops,
        result_key,
        ..RunOutput::default()
    };
    match job.status {
        JobStatus::Running if ours => {}
        // A retried call whose end already landed: answer it again, so the end's follow-up
        // (metrics, tidying), which may not have happened, is done again.
        JobStatus::Succeeded if ours => return Ok(ended("done", job.result_key.clone())),
        JobStatus::Cancelled if ours => {
            finish_cancellation(deps, job_id, lease).await?;
            return Ok(ended("cancelled", None));
        }
        _ => {
            return Err(StageError::LeaseLost(format!(
                "job is {} under another lease",
                job.status
            )));
        }
    }
    // A job's kind was checked at submit: one this worker does not know (switched off in the
    // code since) or params it no longer accepts cannot be helped by retrying.
    let kind = deps.registry.get(&job.job_type).ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::domain(format!(
            "job type {:?} is not known to this worker",
            job.job_type.chars().take(64).collect::<String>()
        ))))
    })?;
    let inputs = kind
        .check(&job.params)
        .map_err(|e| StageError::Fatal(Failure::new(PublicMessage::domain(e))))?;
    let stages = kind.stages();
    // The policy stored on the job at submit rules it (a record from before policies were
    // stored: the kind's current one).
    let kind_policy = kind.policy();
    let (cadence, result_retention) = match &job.policy {
        Some(stored) => (
            Cadence {
                items: stored.checkpoint.items,
                interval: Duration::from_secs(stored.checkpoint.interval_seconds),
            },
            stored.result_retention(),
        ),
        None => (kind_policy.checkpoint, kind_policy.result_retention),
    };
    let progress = view.progress.clone().unwrap_or_default();
    let run = KindRun { inputs, cadence, weights: kind.stage_weights() };
    let mut ctx = Ctx::new(deps, job, lease, stages, &progress, deadline, &run);
    let outcome = if job.cancellation.is_some() || progress.cancel_requested_at.is_some() {
        Err(StageError::Cancelled)
    } else {
        kind.run_stage(&mut ctx, &job.params).await.map_err(StageError::from)
    };
    let output = |next: &str, result_key: Option<String>, stage: &str| RunOutput {
        next: next.into(),
        stage: stage.into(),
        loops,
        result_key,
        result_ttl_seconds: None,
    };
    match outcome {
        // The owner cancelled and the stage stopped as asked (having saved its final
        // checkpoint), or finished anyway: the job ends `cancelled`, any result deleted.
        Ok(_) if ctx.cancelled() => {
            finish_cancellation(deps, job_id, lease).await?;
            Ok(output("cancelled", None, ctx.stage))
        }
        Ok(StageOutcome::Paused) if loops >= deps.runs_per_execution => {
            Ok(output("continue_as_new", None, ctx.stage))
        }
        Ok(StageOutcome::Paused) => Ok(output("continue", None, ctx.stage)),
        Ok(StageOutcome::StageDone) => {
            let next = stages[ctx.stage_index as usize];
            match ctx.advance(next).await {
                Ok(()) => {}
                // The boundary write is refused because the owner cancelled meanwhile: the
                // job ends `cancelled`, never `failed` (Job.Cancelled is not a failure).
                Err(StageError::Cancelled) => {
                    finish_cancellation(deps, job_id, lease).await?;
                    return Ok(output("cancelled", None, ctx.stage));
                }
                Err(err) => return Err(err),
            }
            tracing::info!(stage = next, "stage boundary");
            Ok(output("next_stage", None, next))
        }
        Ok(StageOutcome::Finished(result)) => {
            // `ResultRef`s come from this host's `write_result`/`publish`; one that names
            // anything but this attempt's results (another job's, say) is refused, so no kind
            // can point a job's result link elsewhere.
            let own = result_key(job_id, &format!("{}/", lease.attempt));
            if !result.location().starts_with(&own) {
                return Err(StageError::Fatal(Failure::new(PublicMessage::fixed(
                    "the job kind finished with a result that is not its own",
                ))));
            }
            Ok(RunOutput {
                result_ttl_seconds: Some(deps.result_ttl.of(result_retention).as_secs()),
                ..output("done", Some(result.location().to_owned()), ctx.stage)
            })
        }
        Err(StageError::Cancelled) => {
            finish_cancellation(deps, job_id, lease).await?;
            Ok(output("cancelled", None, ctx.stage))
        }
        Err(err) => Err(err),
    }
}

/// Ends a running job whose owner asked to cancel it: partial results are deleted first, so a
/// `cancelled` job never has a result object, then the job becomes `cancelled` (fenced).
async fn finish_cancellation(deps: &Deps, job_id: &str, lease: &Lease) -> Result<(), StageError> {
    let job = deps.jobs.job(job_id).await.map_err(store_failed)?;
    let cancellation = job.and_then(|j| j.cancellation);
    deps.objects.delete_prefix(&result_key(job_id, "")).await?;
    let reason = match &cancellation {
        Some(c) => match &c.reason {
            Some(reason) => format!("cancelled by {}: {reason}", c.requested_by),
            None => format!("cancelled by {}", c.requested_by),
        },
        None => "cancelled".to_owned(),
    };
    let request =
        TransitionRequest::new(job_id, &[JobStatus::Running], JobStatus::Cancelled, reason)
            .fenced(&lease.token);
    end_job(deps, request, lease).await?;
    tracing::info!("cancelled while running");
    Ok(())
}

/// Ends the job with `request` (a fenced move to a terminal status) and does what follows
/// every end: metrics are emitted, the job is tidied up. A retried call whose transition
/// already landed does the follow-up again (it may not have happened). The partner's webhook
/// is not queued here: the notifier reads every end from the table's stream (the outbox).
async fn end_job(deps: &Deps, request: TransitionRequest, lease: &Lease) -> Result<(), StageError> {
    let status = request.to;
    let job_id = request.job_id.clone();
    let job = match deps.jobs.transition(request).await {
        Ok(job) => job,
        Err(StoreError::Conflict { current: Some(job) })
            if job.status == status && job.lease.as_deref() == Some(&lease.token) =>
        {
            *job
        }
        Err(err) => return Err(fenced(err)),
    };
    logs::record_principal(&tracing::Span::current(), &job.owner);
    metrics::emit_end(&job);
    tidy_after_end(deps, &job_id, status).await
}

/// After a job ended (see [`longhaul_aws::tidy_after_end`]).
pub(crate) async fn tidy_after_end(
    deps: &Deps,
    job_id: &str,
    ended: JobStatus,
) -> Result<(), StageError> {
    longhaul_aws::tidy_after_end(&deps.objects, job_id, ended)
        .await
        .map_err(|e| StageError::retryable(failure::CHECKPOINT_FAILED, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_machine_gets_the_public_message_and_the_log_the_chain() {
        let chain = longhaul_aws::AwsError {
            context: "get s3://longhaul-data/uploads/u/x.csv from byte 0".into(),
            detail: "service error: unhandled error (AccessDenied): User: \
                arn:aws:sts::123456789012:assumed-role/StageRole/Stage is not authorized"
                .into(),
            refusal: None,
        };
        let err = StageError::retryable(failure::INPUT_UNREADABLE, &chain);
        assert!(err.to_string().contains("arn:aws:sts::123456789012"), "the log keeps it: {err}");
        let diagnostic = Diagnostic::from(err);
        assert_eq!(diagnostic.error_type, "Job.Retryable");
        assert_eq!(diagnostic.error_message, "the input upload could not be read");

        // An AWS error with no particular message, and a store error: generic, retried.
        let diagnostic = Diagnostic::from(StageError::from(chain));
        assert_eq!(
            (diagnostic.error_type.as_str(), diagnostic.error_message.as_str()),
            ("Job.Retryable", "a service the job depends on failed")
        );
        let store = StoreError::Aws(longhaul_aws::AwsError {
            context: "update job j".into(),
            detail: "arn:aws:dynamodb:eu-west-1:123456789012:table/jobs".into(),
            refusal: None,
        });
        let diagnostic = Diagnostic::from(fenced(store));
        assert_eq!(diagnostic.error_message, "the job's record could not be read or updated");
    }

    #[test]
    fn a_refusal_fails_at_once_saying_why_and_naming_nothing() {
        let denied = longhaul_aws::AwsError {
            context: "get s3://longhaul-data/uploads/u/x.csv".into(),
            detail: "AccessDenied: arn:aws:iam::123456789012:role/Stage".into(),
            refusal: Some(longhaul_aws::Refusal::AccessDenied),
        };
        let diagnostic = Diagnostic::from(StageError::from(denied));
        assert_eq!(
            (diagnostic.error_type.as_str(), diagnostic.error_message.as_str()),
            ("Job.Fatal", "a service the job depends on failed: access was denied")
        );
        let missing = longhaul_aws::AwsError {
            context: "get".into(),
            detail: "NoSuchKey".into(),
            refusal: Some(longhaul_aws::Refusal::NotFound),
        };
        let err = failure::aws_failure(failure::INPUT_UNREADABLE, &missing);
        assert_eq!(err.class, longhaul_worker::ErrorClass::Fatal);
        assert_eq!(err.public.as_str(), "the input upload could not be read: it does not exist");
    }

    #[test]
    fn what_a_job_kind_says_about_the_owners_data_is_shown_as_it_is() {
        let err = StageError::Fatal(Failure::new(PublicMessage::domain(
            "column \"country\" is not in the CSV header row",
        )));
        assert_eq!(
            Diagnostic::from(err).error_message,
            "column \"country\" is not in the CSV header row"
        );
    }
}
