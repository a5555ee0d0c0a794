//! **dispatcher** — consumes the intake queue and starts each job: a direct run of its worker
//! function ([`longhaul_aws::runs`]), which a Step Functions execution takes over only when
//! the job needs one.
//!
//! Order matters: the job moves `pending → queued` *before* its run is queued, so the
//! worker's claim (`queued → running`) can never arrive first. Redelivered messages are
//! harmless: a job still `queued` gets another invocation of the same run, and only one
//! invocation claims it (each carries its own claimant). Failed records are reported as batch
//! item failures, so SQS retries them and, after `maxReceiveCount`, moves them to the
//! dead-letter queue.
//!
//! **No read for a new job.** Submit's message carries the job as it wrote it
//! ([`DispatchMessage::snapshot`]), so its dispatch reads nothing: its `pending → queued` write
//! is made on condition that the job is unchanged since (`updated_at`). A job that changed
//! while the message waited (cancelled, paused and resumed, dispatched by the reaper's
//! message, marked waiting by this dispatch) is handled by what the refused write answers: as
//! any lost dispatch, or — still `pending` — its slots go back and it is dispatched as it is
//! now ([`dispatch_snapshot`]). Every other sender's message names the job only.
//!
//! **Runs Lambda gave up on.** The worker functions' on-failure destination is the intake
//! queue: a run whose invocation failed on every try (or aged out of Lambda's queue) comes
//! back here as Lambda's invocation record, and the job is handed over to an execution of
//! the run's name — under the run's lease if the run had claimed the job, else to claim it —
//! whose retries and failure recording then apply ([`take_over`]).
//!
//! **Running-job limits.** Before its execution starts, a job takes a slot of its tenant's
//! pool (`LONGHAUL_TENANT_MAX_RUNNING`) and of its kind's (the policy's `concurrency_limit`);
//! a full pool makes it *wait* — still `pending`, in the pool's waiting list (in a kind pool,
//! its tenant's list there, its tenant given a place in the pool's ring of tenants), no
//! execution — until whoever frees a slot (the slots function, when a job ends; the reaper's
//! reconciliation) wakes it with a new message. See `longhaul_aws::slots`.
//!
//! A delayed job (`not_before`) is never started early: the `pending → queued` write is
//! conditional on its start having come, and a message that arrives before it (the reaper's,
//! sent up to 15 minutes early, or a redelivery) is sent again with the remaining delay.

pub mod lambda;
pub mod seated;

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::executions::{Executions, execution_name};
use longhaul_aws::invocations::Invocations;
use longhaul_aws::jobs::{JobRecord, JobStore, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::ports::{
    Clock, DispatchQueue, JobAttempts, JobDispatchMarks, JobExecutions, JobReads, JobTransitions,
    SlotPools, SystemClock, WorkerInvocations,
};
use longhaul_aws::queue::DispatchMessage;
use longhaul_aws::runs::{self, DirectRun, GivenUpCompensation, GivenUpRun};
use longhaul_aws::slots::{Admitter, Pool, pools_of};
use longhaul_aws::workers::Workers;
use longhaul_domain::admission::{Waiting, waiting_sort_key};
use longhaul_domain::policy::SHARED_WORKER;
use longhaul_domain::{JobId, JobStatus, Timestamp, format_rfc3339, schedule};
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `STATE_MACHINE_ARN`: the job state machine (which takes over runs Lambda gave up on).
    pub state_machine_arn: String,
    /// `INTAKE_QUEUE_URL`: where a message that came before its job's start is sent again.
    pub intake_queue_url: String,
    /// `LONGHAUL_TENANT_MAX_RUNNING` (50): jobs one tenant may have between dispatch and their
    /// end; 0 = no limit.
    pub tenant_max_running: u32,
    /// `LONGHAUL_WORKERS`: the worker functions, by logical name (a job's policy names its
    /// own).
    pub workers: Workers,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            tenant_max_running: vars.parsed_or("LONGHAUL_TENANT_MAX_RUNNING", 50)?,
            workers: Workers::from_vars(vars)?,
        })
    }
}

/// What the function needs of the job table: to read a job, to move it on, to mark it
/// waiting, and to end a run's hold on it when an execution takes it over.
pub trait Jobs: JobReads + JobTransitions + JobDispatchMarks + JobAttempts {}
impl<T: JobReads + JobTransitions + JobDispatchMarks + JobAttempts> Jobs for T {}

/// What the handler needs, built once per sandbox: its ports.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// The worker functions, invoked asynchronously for a direct run.
    pub invocations: Arc<dyn WorkerInvocations>,
    /// The job state machine, which takes over a run Lambda gave up on.
    pub executions: Arc<dyn JobExecutions>,
    /// Running slots and waiting lists (which wake waiting jobs when a dispatch gives slots
    /// back).
    pub slots: Arc<dyn SlotPools>,
    /// The intake queue, to delay an early message again.
    pub intake: Arc<dyn DispatchQueue>,
    /// What time it is: whether a job's `not_before` or `retry_at` has come, and since when
    /// a job waits for a slot.
    pub clock: Arc<dyn Clock>,
    /// The configuration.
    pub config: Config,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table, and Lambda to start the job's run (Step Functions only takes over a run
    /// Lambda gave up on).
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.invocations.clone(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Self::sharing(
            sdk,
            aws_sdk_dynamodb::Client::new(sdk),
            longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
            config,
        )
    }

    /// [`Deps::new`] with the DynamoDB and SQS clients a caller built already (submit, which
    /// starts jobs with these steps): a client built twice costs init its construction twice
    /// (its endpoint rules and partitions read again) for nothing.
    pub fn sharing(
        sdk: &aws_config::SdkConfig,
        dynamodb: aws_sdk_dynamodb::Client,
        sqs: longhaul_aws::client::LazyClient<aws_sdk_sqs::Client>,
        config: &Config,
    ) -> Self {
        let admitter =
            Admitter::new(dynamodb.clone(), sqs, &config.table, &config.intake_queue_url);
        Deps {
            jobs: Arc::new(JobStore::new(dynamodb, config.table.clone())),
            invocations: Arc::new(
                Invocations::new(longhaul_aws::client::LazyClient::of(
                    sdk,
                    aws_sdk_lambda::Client::new,
                ))
                .warming(config.workers.function_arn(SHARED_WORKER)),
            ),
            executions: Arc::new(Executions::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sfn::Client::new),
                config.state_machine_arn.clone(),
            )),
            intake: Arc::new(admitter.intake.clone()),
            slots: Arc::new(admitter),
            clock: Arc::new(SystemClock),
            config: config.clone(),
        }
    }
}

/// The pools a job takes a slot of (its tenant's, its kind's), by the deployment's limits.
pub(crate) fn pools_of_job(deps: &Deps, job: &JobRecord) -> Vec<(Pool, u32)> {
    pools_of(&job.owner, &job.job_type, job.concurrency_limit(), deps.config.tenant_max_running)
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
    /// Lambda or Step Functions failed.
    #[error(transparent)]
    Aws(#[from] longhaul_aws::AwsError),
}

/// Dispatches a batch; returns the messages to retry.
pub async fn handle(deps: &Deps, event: SqsEvent) -> SqsBatchResponse {
    longhaul_aws::queue::handle_batch(&event.records, |record| dispatch_record(deps, record)).await
}

/// What the intake queue carries.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum IntakeMessage {
    /// A job to dispatch (from submit, the reaper, a backoff, a freed slot).
    Dispatch(DispatchMessage),
    /// A direct run Lambda gave up on (the worker functions' on-failure destination).
    GivenUp(Box<GivenUpRun>),
    /// A compensation Lambda gave up on (the same destination).
    GivenUpCompensation(GivenUpCompensation),
}

/// One record, in its job's `job` span ([`logs`]): the job id from the message, the attempt
/// and the principal from the record the transition returns (no extra read). Only when that
/// first write fails are they unknown; a malformed message is about no job.
async fn dispatch_record(deps: &Deps, record: &SqsMessage) -> Result<(), DispatchError> {
    let message_id = record.message_id.as_deref().unwrap_or_default();
    let message: IntakeMessage = match serde_json::from_str(
        record.body.as_deref().unwrap_or_default(),
    ) {
        Ok(message) => message,
        Err(err) => {
            let err = DispatchError::Malformed(err);
            tracing::error!(message_id, error = %err, "dispatch failed; the message will be retried");
            return Err(err);
        }
    };
    let job_id = match &message {
        IntakeMessage::Dispatch(message) => &message.job_id,
        IntakeMessage::GivenUp(given_up) => &given_up.request_payload.job_id,
        IntakeMessage::GivenUpCompensation(given_up) => &given_up.request_payload.job_id,
    };
    let span = logs::job_span(Some(job_id), None, None);
    async {
        let result = match &message {
            IntakeMessage::Dispatch(message) => match &message.job {
                Some(job) if job.job_id == message.job_id => {
                    dispatch_snapshot(deps, (**job).clone()).await
                }
                _ => dispatch(deps, &message.job_id).await,
            },
            IntakeMessage::GivenUp(given_up) => take_over(deps, given_up).await,
            // Its undos' attempts are counted before they run, so a compensation that keeps
            // crashing gives its undos up; the reaper dispatches it again once its worker has
            // been silent for long enough (not at once: an outage is waited out, not looped).
            IntakeMessage::GivenUpCompensation(_) => {
                tracing::error!("Lambda gave up on the job's compensation; the reaper dispatches it again later");
                Ok(())
            }
        };
        if let Err(err) = &result {
            tracing::error!(message_id, error = %err, "dispatch failed; the message will be retried");
        }
        result
    }
    .instrument(span)
    .await
}

/// A direct run Lambda gave up on: an execution takes the job over — a new one under the run's
/// lease if this run holds the job (its hold ends first, see [`runs::hand_over`]), or, if no
/// invocation of the run claimed it, one of the run's name to claim it. A job that moved on
/// (ended, or held by another attempt, invocation or execution) is left as it is.
pub async fn take_over(deps: &Deps, given_up: &GivenUpRun) -> Result<(), DispatchError> {
    let run = &given_up.request_payload;
    tracing::warn!(
        condition = given_up.request_context.condition,
        invocations = given_up.request_context.approximate_invoke_count,
        response = ?given_up.response_payload,
        execution = run.execution,
        "Lambda gave up on the job's direct run"
    );
    let Some(job) = deps.jobs.job(&run.job_id).await? else {
        tracing::warn!("the job does not exist; nothing to take over");
        return Ok(());
    };
    logs::current_job(&job);
    let current = job.execution.as_deref().unwrap_or_default();
    let (ours, handed_over) = (current == run.execution, runs::is_hand_over_of(current, run));
    if !ours && !handed_over {
        tracing::info!(status = %job.status, "the job moved on to another dispatch; nothing to take over");
        return Ok(());
    }
    match (job.status, job.claimant.as_deref(), job.lease.as_deref()) {
        (JobStatus::Running, Some(claimant), Some(lease)) if ours && claimant == run.claimant => {
            match runs::hand_over(&*deps.jobs, &*deps.executions, run, lease).await {
                Err(StoreError::Conflict { .. }) => {
                    tracing::info!("the job moved on meanwhile; nothing to take over");
                    Ok(())
                }
                other => Ok(other?),
            }
        }
        // Handed over already (its execution's start is made good: idempotent by name).
        (JobStatus::Running, None, _) if handed_over => {
            Ok(runs::start_execution(&*deps.executions, run, current).await?)
        }
        // No invocation claimed it: an execution of the run's name does (as the reaper's).
        (JobStatus::Queued, _, _) if ours => {
            Ok(runs::start_execution(&*deps.executions, run, &run.execution).await?)
        }
        (status, _, _) => {
            tracing::info!(%status, "another invocation holds the job, or it ended; nothing to take over");
            Ok(())
        }
    }
}

/// Takes the job's running slots, moves it to `queued` and starts its execution;
/// idempotent. A job whose tenant or kind is at its limit waits instead (see
/// [`take_slot`]). Records the job's attempt and principal in the current `job` span.
pub async fn dispatch(deps: &Deps, job_id: &JobId) -> Result<(), DispatchError> {
    let Some(job) = deps.jobs.job(job_id).await? else {
        tracing::error!("dispatch message for a job that does not exist; dropping it");
        return Ok(());
    };
    logs::current_job(&job);
    dispatch_job(deps, job, Read::Now).await
}

/// [`dispatch`] of the job its message carries as submit wrote it, without reading it: its
/// `pending → queued` write is made on condition that the job is unchanged since. A job that
/// changed (cancelled, paused, dispatched by another message, or marked waiting by this
/// dispatch) is handled as that write's refusal says: a job still `pending` has the slots
/// this dispatch took given back, and is dispatched as the refusal returned it (no read).
pub async fn dispatch_snapshot(deps: &Deps, job: JobRecord) -> Result<(), DispatchError> {
    logs::current_job(&job);
    dispatch_job(deps, job, Read::Snapshot).await
}

/// Where a dispatch's record of the job comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Read from the table by this dispatch (or returned by its refused write).
    Now,
    /// Carried by the message ([`DispatchMessage::job`]): perhaps stale.
    Snapshot,
}

async fn dispatch_job(deps: &Deps, job: JobRecord, read: Read) -> Result<(), DispatchError> {
    let now = deps.clock.now();
    let job_id = &job.job_id.clone();
    match job.status {
        JobStatus::Pending => {}
        JobStatus::Queued => {
            // A job waiting out the backoff after a failed attempt starts its next one only at
            // its `retry_at` (SQS delays a message by 15 minutes at most).
            let retry_at = job.retry_at.map(Timestamp::as_datetime);
            if let Some(retry_at) = retry_at.filter(|at| *at > now) {
                return delay_again(deps, &job, retry_at, now).await;
            }
            tracing::info!("job already queued; starting its execution again (idempotent)");
            let name = job.execution.clone().unwrap_or_else(|| execution_name(job_id, 1));
            return start(deps, &job, &name).await;
        }
        JobStatus::Compensating => return compensate(deps, &job).await,
        status => {
            tracing::info!(%status, "job is past dispatch; nothing to do");
            return Ok(());
        }
    }
    // Not before its delayed start, nor — a job paused while it waited out a backoff and
    // resumed since — before its next attempt's `retry_at`.
    let start_at = [job.not_before, job.retry_at].into_iter().flatten().max();
    if let Some(start_at) = start_at.map(Timestamp::as_datetime).filter(|at| *at > now) {
        return delay_again(deps, &job, start_at, now).await;
    }
    let pools = pools_of_job(deps, &job);
    let mut taken: Vec<&(Pool, u32)> = Vec::with_capacity(pools.len());
    // A resumed job may have been paused while it waited: its resume took its `waiting` mark
    // away, and the slots function leaves its list entries to the resumed run (they may be
    // its own again), so that run takes them out once it holds its slots.
    let mut waited = job.waiting.is_some() || job.resumes > 0;
    for (tried, pool) in pools.iter().enumerate() {
        match take_slot(deps, &job, pool, now).await? {
            Slot::Taken { waited: w } => {
                waited |= w;
                taken.push(pool);
            }
            Slot::Full => {
                // Waits in this pool's list; slots of the other pools go back at once.
                give_back(deps, job_id, &taken).await?;
                if job.waiting.is_some() {
                    // A job that waited was woken, perhaps by a later pool's free slot (a
                    // kind's, on its tenant's turn) that this pool now keeps it from: that
                    // slot would stay idle, so the later pools admit whoever else waits.
                    pass_on(deps, &pools[tried + 1..]).await?;
                }
                return Ok(());
            }
            Slot::MovedOn(status) => {
                // Another message dispatched it (or it ended) while this one took slots: the
                // slots taken are the running job's own unless it ended.
                if after_lost_dispatch(status) == LostDispatch::GiveBack {
                    give_back_lost(deps, &job, status, &taken).await?;
                }
                return Ok(());
            }
        }
    }
    if waited {
        let position = waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), job_id);
        for (pool, _) in &pools {
            deps.slots.leave_waiting(pool, &job.owner, &position).await?;
        }
    }
    // A resumed job was dispatched before: its run gets a name of its own, so no run of an
    // earlier dispatch can claim it.
    let dispatch = job.dispatches + 1;
    let name = execution_name(job_id, dispatch);
    let mut request =
        TransitionRequest::new(job_id, &[JobStatus::Pending], JobStatus::Queued, "dispatched")
            .set("execution", &name)
            .set("dispatches", dispatch)
            .remove("waiting")
            .due(&format_rfc3339(now));
    if read == Read::Snapshot {
        request = request.unchanged_since(job.updated_at);
    }
    let job = match deps.jobs.transition(request).await {
        Ok(job) => {
            logs::current_job(&job);
            job
        }
        Err(StoreError::Conflict { current }) => {
            let status = current.as_ref().map(|j| j.status);
            return match (after_lost_dispatch(status), current) {
                (LostDispatch::StartAgain, Some(job)) => {
                    tracing::info!("job already queued; starting its execution again (idempotent)");
                    start(deps, &job, job.execution.as_deref().unwrap_or(&name)).await
                }
                (LostDispatch::KeepSlots, _) => {
                    tracing::info!(status = ?status, "dispatched by another message meanwhile; its slots stay the job's");
                    Ok(())
                }
                // The snapshot was stale: the slots this dispatch took (for the run it named)
                // go back, and the job is dispatched as it is now.
                (LostDispatch::GiveBack, Some(current))
                    if read == Read::Snapshot && current.status == JobStatus::Pending =>
                {
                    tracing::info!(
                        "the job changed since its message was sent; dispatched as it is now"
                    );
                    give_back_lost(deps, &job, status, &pools.iter().collect::<Vec<_>>()).await?;
                    logs::current_job(&current);
                    Box::pin(dispatch_job(deps, *current, Read::Now)).await
                }
                (LostDispatch::GiveBack | LostDispatch::StartAgain, _) => {
                    tracing::info!(status = ?status, "job ended while dispatched; its slots are given back");
                    give_back_lost(deps, &job, status, &pools.iter().collect::<Vec<_>>()).await
                }
            };
        }
        Err(err) => return Err(err.into()),
    };
    start(deps, &job, &name).await
}

/// What a dispatch does when its `pending → queued` write is refused, by the job's status then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LostDispatch {
    /// Another message queued it first, under the same slots (they are the job's, not the
    /// message's): start its execution again (Step Functions deduplicates by name).
    StartAgain,
    /// Another message dispatched it and it runs on (or waits out a backoff, or was
    /// re-dispatched): its slots are the job's until it ends. Giving them back here would let
    /// a duplicate message free a running job's slots for the rest of its runtime.
    KeepSlots,
    /// It ended (cancelled while it took its slots) or is gone: the slots go back to who waits.
    GiveBack,
}

fn after_lost_dispatch(status: Option<JobStatus>) -> LostDispatch {
    match status {
        Some(JobStatus::Queued) => LostDispatch::StartAgain,
        Some(JobStatus::Running) => LostDispatch::KeepSlots,
        // Still pending (the write was refused for another reason: it is dispatched again
        // later, taking its slots again), ended, or gone.
        _ => LostDispatch::GiveBack,
    }
}

/// Queues an invocation of the job's run `name` in the worker function its policy names (again,
/// for a job still `queued`: only one invocation claims it).
async fn start(deps: &Deps, job: &JobRecord, name: &str) -> Result<(), DispatchError> {
    let worker = deps.config.workers.worker_of(&job.policy_or_default());
    let run = DirectRun::new(&job.job_id, name, worker);
    deps.invocations.invoke_async(worker, &run.payload()).await?;
    tracing::info!(execution = name, "run queued");
    Ok(())
}

/// Invokes the job's worker to run its undos (its `compensate` op), which holds no slot: the
/// job keeps the ones it ran with until it ends.
async fn compensate(deps: &Deps, job: &JobRecord) -> Result<(), DispatchError> {
    let worker = deps.config.workers.worker_of(&job.policy_or_default());
    deps.invocations.invoke_async(worker, &runs::compensation_payload(&job.job_id)).await?;
    tracing::info!("compensation queued");
    Ok(())
}

/// A message that came before its job's start (a delayed job's `not_before`, a retried job's
/// `retry_at`) is sent again with the remaining delay.
async fn delay_again(
    deps: &Deps,
    job: &JobRecord,
    start_at: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), DispatchError> {
    let delay = schedule::sqs_delay(start_at, now).max(1);
    tracing::info!(start_at = %format_rfc3339(start_at), delay, "before the job's start; delayed again");
    let message = DispatchMessage::new(job.job_id.clone());
    deps.intake.send_delayed(&message, delay, &job.owner).await?;
    Ok(())
}

/// Whether a job got a slot of a pool.
enum Slot {
    /// It holds one (`waited`: after entering the pool's waiting list).
    Taken { waited: bool },
    /// The pool is full: the job waits in its list, marked `waiting`.
    Full,
    /// The pool is full, and the job is no longer pending (its status now, `None`: gone):
    /// another message dispatched it, or it was cancelled.
    MovedOn(Option<JobStatus>),
}

/// Takes a slot of `pool` for `job`. A full pool puts the job in its waiting list and marks
/// it waiting, then tries once more: a slot freed between the refusal and the entry would
/// otherwise wake no one (whoever frees a slot reads the list only after freeing it).
async fn take_slot(
    deps: &Deps,
    job: &JobRecord,
    (pool, limit): &(Pool, u32),
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Slot, DispatchError> {
    let slots = &deps.slots;
    if slots.acquire(pool, *limit, &job.job_id, job.resumes).await? {
        return Ok(Slot::Taken { waited: false });
    }
    let position = waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), &job.job_id);
    slots.enter_waiting(pool, &position, &job.job_id, &job.owner).await?;
    let waiting = Waiting { reason: pool.reason(), limit: *limit, since: now.into(), position };
    match deps.jobs.mark_waiting(&job.job_id, &waiting).await {
        Ok(_) => {}
        Err(StoreError::Conflict { current }) => {
            // Cancelled meanwhile (or dispatched by a duplicate message): it waits for nothing.
            slots.leave_waiting(pool, &job.owner, &waiting.position).await?;
            return Ok(Slot::MovedOn(current.map(|j| j.status)));
        }
        Err(err) => return Err(err.into()),
    }
    if slots.acquire(pool, *limit, &job.job_id, job.resumes).await? {
        return Ok(Slot::Taken { waited: true });
    }
    tracing::info!(reason = ?waiting.reason, limit, "at its limit; the job waits for a slot");
    Ok(Slot::Full)
}

/// Admits, in each of `pools`, whoever waits for a slot it has free (nothing is given back).
async fn pass_on(deps: &Deps, pools: &[(Pool, u32)]) -> Result<(), DispatchError> {
    release(deps, &[], pools.iter()).await
}

/// Gives `job_id`'s slots of `pools` back, admitting whoever waits for them.
async fn give_back(
    deps: &Deps,
    job_id: &JobId,
    pools: &[&(Pool, u32)],
) -> Result<(), DispatchError> {
    release(deps, std::slice::from_ref(job_id), pools.iter().copied()).await
}

/// Gives back the slots of `pools` this dispatch of `job` took, after it lost the job to
/// `status`: an ended or gone job's outright; a job that is not running (paused, or pending
/// again) only while the run this dispatch read still holds them — it may have been resumed
/// and dispatched again since, and its next run's slots are not this dispatch's to free.
async fn give_back_lost(
    deps: &Deps,
    job: &JobRecord,
    status: Option<JobStatus>,
    pools: &[&(Pool, u32)],
) -> Result<(), DispatchError> {
    if status.is_none_or(|s| s.is_terminal()) {
        return give_back(deps, &job.job_id, pools).await;
    }
    for (pool, limit) in pools.iter().copied() {
        if let Some(held) = deps.slots.give_back_run(pool, &job.job_id, job.resumes).await? {
            deps.slots.admit_marked(pool, *limit, &held).await?;
        }
    }
    Ok(())
}

/// Gives `job_ids`' slots of each of `pools` back (none: gives nothing back) and admits whoever
/// waits for the slots each has free.
async fn release<'a>(
    deps: &Deps,
    job_ids: &[JobId],
    pools: impl Iterator<Item = &'a (Pool, u32)>,
) -> Result<(), DispatchError> {
    for (pool, limit) in pools {
        deps.slots.release(pool, *limit, job_ids).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod lost_dispatch_tests {
    use super::*;

    /// A duplicate message that read the job pending, took its (already held) slots and then
    /// lost the race to queue it must not free the slots of the job the other message
    /// dispatched: only an ended or missing job's go back.
    #[test]
    fn a_duplicate_dispatch_keeps_a_running_jobs_slots() {
        assert_eq!(after_lost_dispatch(Some(JobStatus::Queued)), LostDispatch::StartAgain);
        assert_eq!(after_lost_dispatch(Some(JobStatus::Running)), LostDispatch::KeepSlots);
        for ended in
            [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled, JobStatus::Expired]
        {
            assert_eq!(after_lost_dispatch(Some(ended)), LostDispatch::GiveBack, "{ended:?}");
        }
        assert_eq!(after_lost_dispatch(None), LostDispatch::GiveBack);
        assert_eq!(after_lost_dispatch(Some(JobStatus::Pending)), LostDispatch::GiveBack);
    }
}
