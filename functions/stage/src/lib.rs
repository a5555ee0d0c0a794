//! **stage** — the worker function that does a job's work: in a direct run, or as the Step
//! Functions task of an execution.
//!
//! One function serves both, selected by `op`: `run` (a direct run, the dispatcher's
//! asynchronous invocation: claim the job for this invocation, work through its stages and
//! record the end, or hand the job over to an execution of the run's name when it needs one
//! — [`longhaul_aws::runs`]), and the state machine's task states: `work` (the `Run` state:
//! claim the job if this execution holds no lease yet — `queued → running`, minting the
//! lease — then work through its stages until it is done or the Lambda deadline nears,
//! checkpointing, and record the success itself; answer `continue`, `continue_as_new`,
//! `cancelled` or `done`), `fail` (record why) and `continue_as_new` (start the next
//! execution of a long job before the history limit).
//!
//! Step Functions bills every state entered, so a job that one invocation finishes runs with
//! no execution at all, and one `work` call claims, crosses stage boundaries and completes,
//! rather than a state for each of those steps: an execution's happy path enters three
//! states (`Run`, `Next?`, `Succeeded`) whatever the job's number of stages.
//!
//! A running job is cancelled cooperatively: the stage learns of it when its next progress
//! write is refused, deletes partial results and ends the job `cancelled` with the reason.
//!
//! Errors carry stable names the state machine matches: `Job.Retryable` (retried with
//! backoff), `Job.Fatal` (fails the job), `Job.StageTimeout` (a stage ran past its policy's
//! stage timeout in this attempt, counted across the invocations that continue it: the
//! attempt ends and the job is retried in a new one, within its attempts), `Job.LeaseLost`
//! (another attempt owns the job: stop with no further side effects), `Job.NotClaimable` (the
//! job is not waiting to run). What a failure tells the job's owner is kept apart from what
//! the log is told ([`failure_message`]): the state machine, and so the job record and its
//! webhook, only ever gets the former.

pub mod lambda;

use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_aws::config::{ConfigError, ResultTtl, Vars};
use longhaul_aws::executions::Executions;
use longhaul_aws::jobs::{JobRecord, JobStore, Lease, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics;
use longhaul_aws::objects::{ObjectStore, result_key};
use longhaul_aws::ports::{
    Clock, DispatchQueue, JobAttempts, JobCompensation, JobExecutions, JobPausing, JobReads,
    JobShards, JobSignals, JobTransitions, MultipartUploads, Objects, SystemClock,
};
use longhaul_aws::queue::IntakeQueue;
use longhaul_domain::{JobId, JobStatus};
use longhaul_worker::Registry;
use serde_json::json;
use tracing::Instrument;

pub mod backoff;
mod compensate;
mod direct;
pub mod engine;
pub mod failure_message;
pub mod fan_out;
mod multipart;
mod park;
mod record_failure;
mod shard;
pub mod stage_error;
pub mod wire;
mod work;

#[cfg(test)]
mod tests;

pub use stage_error::StageError;
pub(crate) use stage_error::{fenced, store_failed};
pub use wire::{Next, Recorded, RunOutput, StageInput, StateError, TaskLease, WorkState};

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
    /// `LONGHAUL_RETRY_BASE_DELAY_SECONDS`: when set (and not 0), one step of the backoff
    /// between attempts for every job ([`longhaul_domain::retry`]), whatever its policy's
    /// `retry_delay_seconds` says (the local stack sets 1 s).
    pub retry_delay: Option<Duration>,
    /// `LONGHAUL_MAX_ATTEMPTS`: when set, the attempts every job gets, whatever its policy says
    /// (as the reaper reads it).
    pub max_attempts: Option<u32>,
    /// `LONGHAUL_MAX_PARALLEL_SHARDS` (default 20): the most shards of one job's fanned-out
    /// stage running at once, whatever its kind's policy asks (`MaxParallelShards`).
    pub max_parallel_shards: u32,
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
            retry_delay: vars
                .parsed::<u64>("LONGHAUL_RETRY_BASE_DELAY_SECONDS")?
                .filter(|seconds| *seconds > 0)
                .map(Duration::from_secs),
            max_attempts: vars.parsed("LONGHAUL_MAX_ATTEMPTS")?,
            max_parallel_shards: vars.parsed_or("LONGHAUL_MAX_PARALLEL_SHARDS", 20)?,
        })
    }
}

/// What the stage needs of the job table: to read a job, move its status, and make its
/// attempts' own writes (claim, progress, fenced marks).
pub trait Jobs:
    JobReads + JobTransitions + JobAttempts + JobPausing + JobSignals + JobCompensation + JobShards
{
}
impl<
    T: JobReads + JobTransitions + JobAttempts + JobPausing + JobSignals + JobCompensation + JobShards,
> Jobs for T
{
}

/// What the stage needs of the bucket: objects by key (and deleted by prefix), and results
/// uploaded in parts.
pub trait Bucket: Objects + MultipartUploads {}
impl<T: Objects + MultipartUploads> Bucket for T {}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// Results, checkpoints and inputs.
    pub objects: Arc<dyn Bucket>,
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
    pub executions: Arc<dyn JobExecutions>,
    /// Result retention.
    pub result_ttl: ResultTtl,
    /// The job kinds this worker runs.
    pub registry: Registry,
    /// Where a job goes to start its next attempt after a backoff.
    pub intake: Arc<dyn DispatchQueue>,
    /// The deployment's backoff step between attempts, if it sets one for every job.
    pub retry_delay: Option<Duration>,
    /// The deployment's override of every job's attempt budget.
    pub max_attempts: Option<u32>,
    /// What time it is: what the deadline, the progress, heartbeat and checkpoint cadence and
    /// a stage's time against its stage timeout are measured by, and what a backoff's
    /// `retry_at`, a result's expiry and the stamps of progress and checkpoints count from.
    pub clock: Arc<dyn Clock>,
    /// Set: a stage that fans out runs its shards each in its own invocation, under the
    /// state machine's `FanOut` map ([`fan_out`]); unset, one after another within the
    /// stage's invocations.
    pub fan_out: Option<fan_out::FanOutSettings>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table (a run's claim, its success), and S3 (a kind's inputs, a large result, a
    /// checkpoint). Step Functions opens its connection when a run first hands its job over to
    /// the workflow.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.objects.clone(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: Arc::new(
                JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                    .retaining(config.record_retention),
            ),
            objects: Arc::new(ObjectStore::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_s3::Client::new),
                config.bucket.clone(),
            )),
            margin: config.margin,
            progress_interval: config.progress_interval,
            heartbeat_interval: config.heartbeat_interval,
            checkpoint_items: config.checkpoint_items.map(|n| n.max(1)),
            checkpoint_interval: config.checkpoint_interval,
            runs_per_execution: config.runs_per_execution.max(1),
            executions: Arc::new(Executions::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sfn::Client::new),
                config.state_machine_arn.clone(),
            )),
            result_ttl: config.result_ttl.clone(),
            registry: longhaul_jobs::registry(),
            intake: Arc::new(IntakeQueue::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
                config.intake_queue_url.clone(),
            )),
            retry_delay: config.retry_delay,
            max_attempts: config.max_attempts,
            clock: Arc::new(SystemClock),
            fan_out: Some(fan_out::FanOutSettings {
                bucket: config.bucket.clone(),
                max_parallel_shards: config.max_parallel_shards.max(1),
            }),
        }
    }
}

/// The Lambda deadline (epoch milliseconds) as an instant of `clock`'s, the one the handler
/// measures its time budget by.
pub fn deadline_from_epoch_ms(clock: &dyn Clock, deadline_ms: u64) -> Instant {
    let now_ms = u64::try_from(clock.now().timestamp_millis()).unwrap_or_default();
    clock.instant() + Duration::from_millis(deadline_ms.saturating_sub(now_ms))
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
    let (job_id, lease) = match &input {
        StageInput::Run(run) => (Some(run.job_id.clone()), None),
        StageInput::Work { job_id, state, .. } => (job_id.parse().ok(), state.lease.as_ref()),
        StageInput::Fail { job_id, state, .. } => (job_id.parse().ok(), state.lease.as_ref()),
        StageInput::ContinueAsNew { job_id, lease, .. } => (job_id.parse().ok(), Some(lease)),
        StageInput::Compensate { job_id } => (job_id.parse().ok(), None),
        StageInput::Shard { job_id, lease, .. } => (job_id.parse().ok(), Some(lease)),
    };
    // The state machine copies the id from the execution's input: one that is not a job id
    // names no job, and is answered as a missing job is ([`no_such_job`]).
    let job_id: Option<JobId> = job_id;
    let span = logs::job_span(
        job_id.as_ref(),
        lease.map(|l| l.attempt),
        lease.and_then(|l| l.principal.as_ref()),
    );
    let result = match &job_id {
        Some(job_id) => task(deps, job_id, input, deadline).instrument(span.clone()).await,
        None => span.in_scope(|| no_such_job(input)),
    };
    // lambda_runtime logs a handler's error too, but after this span closed (a line about the
    // job without its id, attempt and principal): the stage's own line is the one that counts,
    // and lambda.rs drops the runtime's (`logs::init_subscriber`).
    if let Err(err) = &result {
        span.in_scope(|| tracing::error!(error_type = err.name(), error = %err, "task failed"));
    }
    result
}

async fn task(
    deps: &Deps,
    job_id: &JobId,
    input: StageInput,
    deadline: Instant,
) -> Result<serde_json::Value, StageError> {
    match input {
        StageInput::Run(run) => direct::run(deps, job_id, &run, deadline).await,
        StageInput::Work { execution, state, .. } => {
            let (lease, claimed) = match state.lease {
                Some(lease) => (lease, None),
                None => {
                    let (lease, view) = work::claim(deps, job_id, &execution).await?;
                    (lease, Some(view))
                }
            };
            let loops = state.run.as_ref().map_or(0, |run| run.loops) + 1;
            let fanned = state.run.filter(|run| run.next == Next::FanOut).map(|run| run.stage);
            let output = work::work(deps, job_id, &lease, loops, deadline, claimed, fanned).await?;
            Ok(json!({ "job_id": job_id, "lease": lease, "run": output }))
        }
        StageInput::ContinueAsNew { lease, worker_arn, .. } => {
            let name = continue_as_new(deps, job_id, &lease, worker_arn).await?;
            Ok(json!({ "execution": name }))
        }
        StageInput::Compensate { .. } => compensate::run(deps, job_id, deadline).await,
        StageInput::Shard { lease, stage_index, item, run, .. } => {
            shard::run(deps, job_id, &lease, stage_index, &item, run.as_ref(), deadline).await
        }
        StageInput::Fail { state, execution, error, .. } => {
            let recorded =
                record_failure::record_failure(deps, job_id, state, execution.as_deref(), error)
                    .await?;
            Ok(serde_json::to_value(recorded).expect("answers serialise"))
        }
    }
}

/// The answer to a task whose `job_id` is not a job id: what a job that does not exist gets
/// (no job is read or written) — a claim finds it missing, a continuation's fenced write is
/// refused, and a failure is nothing this execution holds.
fn no_such_job(input: StageInput) -> Result<serde_json::Value, StageError> {
    match input {
        StageInput::Work { job_id, .. } => {
            Err(StageError::NotClaimable(format!("job {job_id} is missing")))
        }
        StageInput::Run(run) => {
            Err(StageError::NotClaimable(format!("job {} is missing", run.job_id)))
        }
        StageInput::ContinueAsNew { .. } => {
            Err(StageError::LeaseLost("progress write refused".into()))
        }
        StageInput::Compensate { job_id } => {
            tracing::warn!(job_id, "asked to compensate a job id that is not one; nothing to do");
            Ok(json!({ "job_id": job_id, "outcome": "missing" }))
        }
        StageInput::Shard { job_id, .. } => {
            Err(StageError::LeaseLost(format!("job {job_id} is missing")))
        }
        StageInput::Fail { error, .. } => {
            tracing::warn!(
                error = error.error,
                "the execution failed before holding the job; nothing recorded"
            );
            Ok(serde_json::to_value(Recorded::Unrecorded).expect("answers serialise"))
        }
    }
}

/// Starts the next execution of this attempt (same lease, same worker) before the current
/// one's history limit; answers its name.
async fn continue_as_new(
    deps: &Deps,
    job_id: &JobId,
    lease: &TaskLease,
    worker_arn: Option<String>,
) -> Result<String, StageError> {
    let n = deps.jobs.count_continuation(job_id, &lease.token).await.map_err(fenced)?;
    let name = format!("{job_id}.a{}c{n}", lease.attempt);
    deps.jobs.record_execution(job_id, &lease.token, &name).await.map_err(fenced)?;
    let run = RunOutput { next: Next::Start, ..RunOutput::default() };
    let input = json!({ "job_id": job_id, "lease": lease, "run": run,
        longhaul_aws::workers::INPUT_KEY: worker_arn });
    deps.executions.start(&name, &input).await?;
    tracing::info!(execution = name, "continued as a new execution");
    Ok(name)
}

/// Ends a running job whose owner asked to cancel it: partial results are deleted first, so a
/// `cancelled` job never has a result object, then the job becomes `cancelled` (fenced) — or,
/// if it started stages with an undo, `compensating` ([`Next::Compensating`]), to end
/// `cancelled` once they ran. `known`: the caller's read of the job, if it shows the
/// cancellation (else the record is read for it: the request landed after that read).
async fn finish_cancellation(
    deps: &Deps,
    job_id: &JobId,
    lease: &Lease,
    known: Option<&JobRecord>,
) -> Result<Next, StageError> {
    let read;
    let job = match known.filter(|job| job.cancellation.is_some()) {
        Some(job) => Some(job),
        None => {
            read = deps.jobs.job(job_id).await.map_err(store_failed)?;
            read.as_ref()
        }
    };
    let reason = job
        .and_then(|j| j.cancellation.as_ref())
        .map_or_else(|| "cancelled".to_owned(), |c| c.log_reason());
    deps.objects.delete_prefix(&result_key(job_id, "")).await?;
    if let Some(job) = job.filter(|job| job.wants_compensation()) {
        let ending = longhaul_domain::compensation::Ending {
            status: JobStatus::Cancelled,
            reason,
            error: None,
        };
        compensate::begin(deps, job, lease, ending, false).await?;
        return Ok(Next::Compensating);
    }
    let request =
        TransitionRequest::new(job_id, &[JobStatus::Running], JobStatus::Cancelled, reason)
            .fenced(&lease.token);
    end_job(deps, request, lease, None).await?;
    tracing::info!("cancelled while running");
    Ok(Next::Cancelled)
}

/// Ends the job with `request` (a fenced move to a terminal status) and does what follows
/// every end: metrics are emitted, the job is tidied up (`leftovers`: what to delete by key,
/// if the caller knows). A request made [`TransitionRequest::unless_cancelled`] that the
/// owner's cancellation refused is [`StageError::Cancelled`]. A retried call whose transition
/// already landed does the follow-up again (it may not have happened). The partner's webhook
/// is not queued here: the notifier reads every end from the table's stream (the outbox).
async fn end_job(
    deps: &Deps,
    request: TransitionRequest,
    lease: &Lease,
    leftovers: Option<&[String]>,
) -> Result<(), StageError> {
    let status = request.to;
    let job_id = request.job_id.clone();
    let job = match deps.jobs.transition(request).await {
        Ok(job) => job,
        Err(StoreError::Conflict { current: Some(job) })
            if job.status == status && job.lease.as_deref() == Some(&lease.token) =>
        {
            *job
        }
        Err(err) => return Err(stage_error::end_refused(err, &lease.token)),
    };
    logs::record_principal(&tracing::Span::current(), &job.owner);
    metrics::emit_end(&job);
    tidy_after_end(deps, &job_id, status, leftovers).await
}

/// After a job ended (see [`longhaul_aws::tidy_after_end_with`]): `leftovers` by key when
/// known (no LIST), else by prefix.
pub(crate) async fn tidy_after_end(
    deps: &Deps,
    job_id: &JobId,
    ended: JobStatus,
    leftovers: Option<&[String]>,
) -> Result<(), StageError> {
    let leftovers =
        leftovers.map_or(longhaul_aws::Leftovers::Unknown, longhaul_aws::Leftovers::Keys);
    longhaul_aws::tidy_after_end_with(&*deps.objects, job_id, ended, leftovers)
        .await
        .map_err(|e| StageError::retryable(failure_message::CHECKPOINT_FAILED, e))
}
