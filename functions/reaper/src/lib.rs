//! **reaper** — runs every minute (EventBridge schedule `reaper`) so that no job sits in a
//! live state forever:
//!
//! * **lost dispatch** — a `pending` job older than the grace (submit died between storing the
//!   job and enqueueing it, or its message dead-lettered, or it still waits in a backlog) is
//!   enqueued again at growing intervals, and fails only once it has waited
//!   `LONGHAUL_MAX_PENDING_SECONDS` since it was accepted; a `queued` job whose execution was
//!   never started is started again under the same name; one whose execution ended without
//!   running it gets a new execution, within the retry budget, then fails;
//! * **zombies** — a `running` job without a heartbeat for the timeout: if its result is
//!   already in S3, the success is recorded; else it is re-dispatched as a new attempt (the
//!   old execution stopped, the old lease dead, the new attempt resuming from the checkpoint)
//!   while the retry budget lasts; else it fails with the reason;
//! * **stalled progress** — heartbeats but no progress for the stall threshold: the job is
//!   flagged (`"stalled": true`) and counted; still stalled after the grace, it is a zombie;
//! * **job-level timeout** — running longer than its job type's maximum: failed (`Job.Timeout`);
//! * **requested cancellation** — a zombie or overtime job whose owner asked to cancel it (the
//!   job record holds the cancellation) is neither rescued nor failed: it ends `cancelled` with
//!   the requester's reason, its partial results deleted, as its stage would have ended it;
//!   a zombie whose owner asked to pause it is parked `paused`, as its stage would have, its
//!   attempt unspent (its resume continues from the last checkpoint it saved);
//! * **lapsed pauses** — a `paused` job paused longer than its kind's `max_paused` (a week by
//!   default) is cancelled with that reason; one whose stage waits for a signal past the wait's
//!   timeout is resumed, the timeout recorded for its stage. Paused jobs are otherwise left alone, and their
//!   paused time does not count towards `max_runtime`.
//!
//! One file per sweep, as River has one per maintenance service: [`pending`], [`queued`],
//! [`running`], [`waiting`] (the pools of jobs waiting for a running slot), [`paused`]; the
//! buckets they sweep are a [`Bucket`].
//!
//! Every run sweeps each bucket to its end, within a time budget (see [`sweep`]); every
//! action is a conditional write (status and lease), so two reapers running at once never act
//! twice on one job. After the sweeps, with what is left of the budget, it counts each bucket's
//! live jobs for the `ActiveJobs` gauge — at most a few index pages per shard, whatever the
//! bucket holds, so a bucket larger than that is reported as a lower bound (see [`count`]).
//!
//! The handler works through ports ([`Deps`]): the AWS adapters in Lambda, the in-memory ones
//! of `longhaul-memory` in its unit tests (`tests.rs`).

pub mod lambda;

use std::sync::Arc;
use std::time::Duration;

mod bucket;
mod compensating;
mod count;
mod paused;
mod pending;
mod queued;
mod running;
mod sweep;
mod waiting;

pub use bucket::{Bucket, UnknownBucket};
pub use longhaul_aws::ports::{Clock, SystemClock};

use chrono::{DateTime, Utc};
use longhaul_aws::config::{ConfigError, ResultTtl, Vars};
use longhaul_aws::executions::Executions;
use longhaul_aws::jobs::{JobEntry, JobStore, RecordRetention, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::ports::{
    DispatchQueue, JobAttempts, JobCompensation, JobExecutions, JobPausing, JobReads, JobReaping,
    JobSignals, JobTransitions, ObjectCleanup, SlotPools, StatusIndex, SweepCursors,
};
use longhaul_aws::queue::IntakeQueue;
use longhaul_aws::slots::Admitter;
use longhaul_domain::reaper::Thresholds;
use longhaul_domain::{ErrorCode, JobError, JobId, JobStatus, format_rfc3339};
use serde::Serialize;
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`, `BUCKET_NAME`, `INTAKE_QUEUE_URL`, `STATE_MACHINE_ARN`.
    pub table: String,
    /// See `table`.
    pub bucket: String,
    /// See `table`.
    pub intake_queue_url: String,
    /// See `table`.
    pub state_machine_arn: String,
    /// `LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS` (90), `LONGHAUL_STALL_SECONDS` (300),
    /// `LONGHAUL_STALL_GRACE_SECONDS` (600).
    pub thresholds: Thresholds,
    /// `LONGHAUL_MAX_ATTEMPTS`: when set, the attempts every job gets, whatever its policy
    /// says (by default each job's own `max_attempts`, stored at submit).
    pub max_attempts: Option<u32>,
    /// `LONGHAUL_PENDING_GRACE_SECONDS` (60): a pending job older than this was not dispatched.
    pub pending_grace: Duration,
    /// `LONGHAUL_QUEUED_GRACE_SECONDS` (120): a queued job older than this should be running.
    pub queued_grace: Duration,
    /// `LONGHAUL_MAX_PENDING_SECONDS` (86,400): a job still `pending` this long after it was
    /// accepted fails (`Job.Undispatchable`). Re-enqueues alone never fail a job: a message
    /// may wait in a backlog for a long time without being lost.
    pub max_pending: Duration,
    /// `LONGHAUL_MAX_ENQUEUE_INTERVAL_SECONDS` (900): the longest wait between two re-enqueues
    /// of a pending job (they are spaced `pending_grace` × 2ⁿ, up to this).
    pub max_enqueue_interval: Duration,
    /// `LONGHAUL_MAX_RUNTIME_SECONDS`: when set, the longest any job may run, whatever its
    /// policy says (by default each job's own `max_runtime_seconds`, stored at submit).
    pub max_runtime: Option<Duration>,
    /// `LONGHAUL_REAPER_PAGE` (100): entries per index page of a sweep (a run reads as many
    /// pages as the buckets hold, within its budget).
    pub page: usize,
    /// `LONGHAUL_REAPER_BUDGET_SECONDS` (40): how long a run sweeps before it saves where it
    /// stopped for the next run (below the 60 s schedule, so runs do not pile up). The counts
    /// of the live jobs get what the sweeps leave of it.
    pub budget: Duration,
    /// `LONGHAUL_REAPER_COUNT_PAGE` (1,000): entries per page (request) of the count of a
    /// bucket's shard for the `ActiveJobs` gauge (see [`count`]).
    pub count_page: usize,
    /// `LONGHAUL_REAPER_COUNT_MAX_PAGES` (2): the most pages a run counts of each shard of each
    /// bucket (4 shards: 8 requests a bucket); a bucket larger than that is reported as a lower
    /// bound (`ActiveJobsTruncated`). 0: no counts.
    pub count_max_pages: u32,
    /// Result retention (for a backfilled success).
    pub result_ttl: ResultTtl,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS`: how long the records of a job it ends are kept.
    pub record_retention: RecordRetention,
    /// `LONGHAUL_TENANT_MAX_RUNNING` (50; 0 = no limit), as the dispatcher has it.
    pub tenant_max_running: u32,
    /// `LONGHAUL_WORKERS`: the worker functions, by logical name (a re-dispatched job's
    /// execution runs in the one its policy names).
    pub workers: longhaul_aws::workers::Workers,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let secs =
            |name: &str, default: u64| vars.parsed_or(name, default).map(Duration::from_secs);
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            thresholds: Thresholds {
                heartbeat_timeout: secs("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", 90)?,
                stall: secs("LONGHAUL_STALL_SECONDS", 300)?,
                stall_grace: secs("LONGHAUL_STALL_GRACE_SECONDS", 600)?,
            },
            max_attempts: vars.parsed("LONGHAUL_MAX_ATTEMPTS")?,
            pending_grace: secs("LONGHAUL_PENDING_GRACE_SECONDS", 60)?,
            queued_grace: secs("LONGHAUL_QUEUED_GRACE_SECONDS", 120)?,
            max_pending: secs("LONGHAUL_MAX_PENDING_SECONDS", 86_400)?,
            max_enqueue_interval: secs("LONGHAUL_MAX_ENQUEUE_INTERVAL_SECONDS", 900)?,
            max_runtime: vars.parsed("LONGHAUL_MAX_RUNTIME_SECONDS")?.map(Duration::from_secs),
            page: vars.parsed_or("LONGHAUL_REAPER_PAGE", 100)?,
            budget: secs("LONGHAUL_REAPER_BUDGET_SECONDS", 40)?,
            count_page: vars.parsed_or("LONGHAUL_REAPER_COUNT_PAGE", 1_000)?,
            count_max_pages: vars.parsed_or("LONGHAUL_REAPER_COUNT_MAX_PAGES", 2)?,
            result_ttl: ResultTtl::from_vars(vars)?,
            record_retention: RecordRetention::from_vars(vars)?,
            tenant_max_running: vars.parsed_or("LONGHAUL_TENANT_MAX_RUNNING", 50)?,
            workers: longhaul_aws::workers::Workers::from_vars(vars)?,
        })
    }
}

/// What the reaper needs of the job table: to read a job (with its progress) and move it, to
/// take an ended or re-dispatched attempt's progress record from its lease
/// ([`JobAttempts::revoke_progress`]), its own moves ([`JobReaping`]), and to page through the
/// status index from where the last run stopped.
pub trait Jobs:
    JobReads
    + JobCompensation
    + JobTransitions
    + JobAttempts
    + JobPausing
    + JobSignals
    + JobReaping
    + StatusIndex
    + SweepCursors
{
}

impl<T> Jobs for T where
    T: JobReads
        + JobCompensation
        + JobTransitions
        + JobAttempts
        + JobPausing
        + JobSignals
        + JobReaping
        + StatusIndex
        + SweepCursors
{
}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// Results and checkpoints.
    pub objects: Arc<dyn ObjectCleanup>,
    /// The intake queue (re-enqueued pending jobs, and waiting jobs whose limit is off).
    pub intake: Arc<dyn DispatchQueue>,
    /// The job state machine.
    pub executions: Arc<dyn JobExecutions>,
    /// Running slots and waiting lists (the reconciliation of waiting jobs' pools); the jobs
    /// it admits are woken through the same intake queue.
    pub slots: Arc<dyn SlotPools>,
    /// What a run's time budget is measured by.
    pub clock: Arc<dyn Clock>,
    /// Settings.
    pub config: Config,
}

impl Deps {
    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        // One client per service, shared by the adapters that use it.
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let sqs = longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new);
        Deps {
            slots: Arc::new(Admitter::new(
                dynamodb.clone(),
                sqs.clone(),
                &config.table,
                &config.intake_queue_url,
            )),
            jobs: Arc::new(
                JobStore::new(dynamodb, config.table.clone()).retaining(config.record_retention),
            ),
            objects: Arc::new(ObjectStore::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_s3::Client::new),
                config.bucket.clone(),
            )),
            intake: Arc::new(IntakeQueue::new(sqs, config.intake_queue_url.clone())),
            executions: Arc::new(Executions::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sfn::Client::new),
                config.state_machine_arn.clone(),
            )),
            clock: Arc::new(SystemClock),
            config: config.clone(),
        }
    }

    /// The attempts `job` gets: the deployment's `LONGHAUL_MAX_ATTEMPTS` if set, else the
    /// job's policy's.
    pub fn max_attempts(&self, job: &JobEntry) -> u32 {
        self.config.max_attempts.unwrap_or_else(|| job.policy_or_default().max_attempts)
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Pending jobs enqueued again.
    pub re_enqueued: u32,
    /// Queued jobs given a new execution.
    pub restarted: u32,
    /// Zombies re-dispatched as a new attempt.
    pub redispatched: u32,
    /// Zombies whose result was found: recorded as succeeded.
    pub backfilled: u32,
    /// Jobs failed (budget spent, timed out, undispatchable).
    pub failed: u32,
    /// Running jobs whose owner had asked to cancel them, ended `cancelled` because their
    /// worker will not (it stopped heartbeating, or the job ran past its maximum); and paused
    /// jobs whose pause lapsed (`max_paused`).
    pub cancelled: u32,
    /// Running jobs whose owner had asked to pause them, parked `paused` because their worker
    /// died before it could.
    pub parked: u32,
    /// Jobs waiting for a signal whose wait timed out, resumed (their stage told so).
    pub resumed: u32,
    /// Jobs newly flagged stalled.
    pub stalled: u32,
    /// Stalled flags cleared.
    pub recovered: u32,
    /// Actions another reaper (or the job itself) got to first.
    pub raced: u32,
    /// Jobs that could not be handled this run (unreadable, or an AWS call failed), each
    /// logged with its reason. They are tried again next run; the others are not held up.
    pub errors: u32,
    /// Index entries the sweeps read.
    pub examined: u64,
    /// Bucket shards whose sweep ran out of the run's budget (the next run resumes them).
    pub unfinished: u32,
    /// Running slots given back because the job holding them had ended (the slots function
    /// missed it).
    pub slots_reclaimed: u32,
    /// Waiting jobs woken because their pool had free slots.
    pub admitted: u32,
    /// Waiting jobs put back in a waiting list they were missing from.
    pub waiting_restored: u32,
    /// Live jobs by bucket after the sweeps (`pending`, `waiting`, `queued`, `running`), also
    /// emitted as the `ActiveJobs` gauge (dimension `Status`) for the dashboard: exact, or a
    /// lower bound for the buckets in `active_at_least` (see [`count`]). A bucket that could
    /// not be counted is missing (counted in `errors` if its count failed; none if the sweeps
    /// left no budget to count it).
    pub active: std::collections::BTreeMap<Bucket, u64>,
    /// The buckets whose count in `active` stopped at its page cap or the run's deadline: at
    /// least that many (`ActiveJobsTruncated` = 1).
    pub active_at_least: std::collections::BTreeSet<Bucket>,
}

impl Report {
    /// Adds what another part of the run did.
    fn merge(&mut self, other: Report) {
        self.re_enqueued += other.re_enqueued;
        self.restarted += other.restarted;
        self.redispatched += other.redispatched;
        self.backfilled += other.backfilled;
        self.failed += other.failed;
        self.cancelled += other.cancelled;
        self.parked += other.parked;
        self.resumed += other.resumed;
        self.stalled += other.stalled;
        self.recovered += other.recovered;
        self.raced += other.raced;
        self.errors += other.errors;
        self.examined += other.examined;
        self.unfinished += other.unfinished;
        self.slots_reclaimed += other.slots_reclaimed;
        self.admitted += other.admitted;
        self.waiting_restored += other.waiting_restored;
        self.active.extend(other.active);
        self.active_at_least.extend(other.active_at_least);
    }
}

/// A run failed as a whole (it is retried at the next tick).
#[derive(Debug, thiserror::Error)]
#[error("reaper run failed: {0}")]
pub struct ReaperError(String);

impl From<StoreError> for ReaperError {
    fn from(err: StoreError) -> Self {
        ReaperError(err.to_string())
    }
}

impl From<longhaul_aws::AwsError> for ReaperError {
    fn from(err: longhaul_aws::AwsError) -> Self {
        ReaperError(err.to_string())
    }
}

fn at(time: DateTime<Utc>) -> String {
    format_rfc3339(time)
}

impl From<ReaperError> for lambda_runtime::Diagnostic {
    fn from(err: ReaperError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: "Reaper.Failed".into(),
            error_message: err.to_string(),
        }
    }
}

/// One reaper run at `now`.
pub async fn handle(deps: &Deps, now: DateTime<Utc>) -> Result<Report, ReaperError> {
    let mut report = Report::default();
    let grace = |d: Duration| at(now - chrono::Duration::from_std(d).unwrap_or_default());
    // Every bucket is swept to its end (see `sweep`), within the run's budget. Each job is
    // handled in its `job` span (see `longhaul_aws::logs`). One job that cannot be handled (an
    // item this version cannot read, an AWS call that failed) is logged, counted and left for
    // the next run: failing the whole run would hold every job behind it up.
    let deadline = deps.clock.instant() + deps.config.budget;
    let cursors = match deps.jobs.sweep_cursors().await {
        Ok(cursors) => cursors,
        Err(err) => {
            // Sweep from the oldest entries: nothing is skipped, some may be read twice.
            tracing::error!(error = %err, "reading the sweep cursors failed");
            report.errors += 1;
            Default::default()
        }
    };
    let (pending_before, queued_before, running_before) = (
        grace(deps.config.pending_grace),
        grace(deps.config.queued_grace),
        at(now + chrono::Duration::seconds(1)),
    );
    let pending = sweep::sweep(
        deps,
        Bucket::Pending,
        &pending_before,
        deadline,
        &cursors,
        each_job!(deps, now, pending::lost_pending),
    );
    let queued = sweep::sweep(
        deps,
        Bucket::Queued,
        &queued_before,
        deadline,
        &cursors,
        each_job!(deps, now, queued::lost_queued),
    );
    let running =
        sweep::sweep(deps, Bucket::Running, &running_before, deadline, &cursors, |jobs| {
            running::running_page(deps, now, jobs)
        });
    let reconciled = waiting::Reconciled::default();
    let waiting =
        sweep::sweep(deps, Bucket::Waiting, &running_before, deadline, &cursors, |jobs| {
            waiting::waiting_page(deps, jobs, &reconciled)
        });
    // Paused jobs are keyed by when their pause lapses: those due now.
    let lapsed_before = at(now);
    let paused = sweep::sweep(
        deps,
        Bucket::Paused,
        &lapsed_before,
        deadline,
        &cursors,
        each_job!(deps, now, paused::lapsed),
    );
    // Compensating jobs are keyed by when their worker should next have been heard of.
    let silent_before = at(now);
    let compensating = sweep::sweep(
        deps,
        Bucket::Compensating,
        &silent_before,
        deadline,
        &cursors,
        each_job!(deps, now, compensating::silent),
    );
    let (pending, queued, running, waiting, paused, compensating) =
        tokio::join!(pending, queued, running, waiting, paused, compensating);
    for swept in [pending, queued, running, waiting, paused, compensating] {
        report.merge(swept);
    }
    // The reaper runs every minute anyway: it is the one place that can afford to count the
    // live jobs for the dashboard's "active jobs by status" — a few pages per shard, with what
    // the sweeps left of the budget, so the count never delays them (see `count`).
    report.merge(count::count(deps, deadline).await);
    tracing::info!(report = ?report, "reaper run");
    Ok(report)
}

/// The job an index entry holds, or `None` (logged and counted) if it cannot be read.
fn readable(
    entry: Result<longhaul_aws::ports::IndexEntry, StoreError>,
    report: &mut Report,
) -> Option<JobEntry> {
    match entry.and_then(|entry| entry.job) {
        Ok(job) => Some(job),
        Err(err) => {
            tracing::error!(error = %err, "a job record in the status index cannot be read; skipped");
            report.errors += 1;
            None
        }
    }
}

/// Logs and counts a job that could not be handled this run.
/// A sweep's page handler that judges its jobs one by one with `$handle(deps, now, job,
/// &mut report)`, each in its job's span, an error counted and logged, not stopping the page.
macro_rules! each_job {
    ($deps:expr, $now:expr, $handle:path) => {
        |jobs| async move {
            let mut report = Report::default();
            for job in jobs {
                let span = logs::span_of(&job);
                let result = $handle($deps, $now, job, &mut report).instrument(span.clone()).await;
                counted(result, &span, &mut report);
            }
            report
        }
    };
}
use each_job;

pub(crate) fn counted(result: Result<(), ReaperError>, span: &tracing::Span, report: &mut Report) {
    if let Err(err) = result {
        span.in_scope(
            || tracing::error!(error = %err, "handling the job failed; the next run tries again"),
        );
        report.errors += 1;
    }
}

/// Counts a lost race (someone else changed the job first): not an error.
fn raced(result: Result<(), StoreError>, report: &mut Report) -> Result<(), ReaperError> {
    match result {
        Ok(()) => Ok(()),
        Err(StoreError::Conflict { .. }) => {
            report.raced += 1;
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

/// Fails a job (conditionally), stops its execution and tidies up after it — or, if it
/// started stages with an undo, moves it to `compensating` (to end `failed` once they ran)
/// and sends it to the dispatcher, which has its worker run them.
async fn fail(
    deps: &Deps,
    job: &JobEntry,
    from: &[JobStatus],
    lease: Option<&str>,
    error: JobError,
) -> Result<(), StoreError> {
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Failed,
        reason: error.message.clone(),
        error: Some(error.clone()),
    };
    if compensate_instead(deps, job, from, lease, ending, None, None).await? {
        tracing::warn!(
            code = error.code,
            message = error.message,
            "failed by the reaper; compensating first"
        );
        if error.is(ErrorCode::Undispatchable) {
            metrics::count(Metric::JobsDeadLettered, job);
        }
        return Ok(());
    }
    let mut request =
        TransitionRequest::new(&job.job_id, from, JobStatus::Failed, error.message.clone())
            .set("error", &error);
    if let Some(lease) = lease {
        request = request.fenced(lease);
    }
    let ended = deps.jobs.transition(request).await?;
    if let Some(lease) = lease {
        revoke(deps, &job.job_id, lease).await;
    }
    metrics::emit_end(&ended);
    if error.is(ErrorCode::Undispatchable) {
        metrics::count(Metric::JobsDeadLettered, job);
    }
    tracing::warn!(code = error.code, message = error.message, "failed by the reaper");
    stop_execution(deps, job, &error.message).await;
    if let Err(err) = tidy(deps, &job.job_id, JobStatus::Failed).await {
        tracing::warn!(error = %err, "cleanup after failing the job failed; the lifecycle rule is the backstop");
    }
    Ok(())
}

/// If `job` started stages with an undo, moves it from `from` to `compensating`, to end as
/// `ending` says once they ran — fenced by `lease`, and only if the record is unchanged since
/// `read` (the caller's read its verdict rests on; none: read here, as the index entry does
/// not carry the kind's undos) — takes the progress record from the lease, stops its execution
/// and sends it to the dispatcher, which has its worker run them: `true`. `false`: it ends
/// now, as the caller was going to end it. A job whose worker may still be alive (held by
/// `lease`) is sent only after the heartbeat timeout, by when that worker has met its revoked
/// lease and stopped: an undo never runs beside the work it undoes.
async fn compensate_instead(
    deps: &Deps,
    job: &JobEntry,
    from: &[JobStatus],
    lease: Option<&str>,
    ending: longhaul_domain::compensation::Ending,
    cancellation: Option<&longhaul_domain::Cancellation>,
    read: Option<&longhaul_aws::jobs::JobRecord>,
) -> Result<bool, StoreError> {
    let fresh;
    let record = match read {
        Some(record) => record,
        None => match deps.jobs.job(&job.job_id).await? {
            Some(record) => {
                fresh = record;
                &fresh
            }
            None => return Ok(false),
        },
    };
    if !record.wants_compensation() {
        return Ok(false);
    }
    let now = longhaul_domain::Timestamp::from(deps.clock.now());
    let cause = ending.reason.clone();
    let mut request = longhaul_aws::jobs::compensation_request(&job.job_id, from, ending, now)
        .unchanged_since(record.updated_at);
    if let Some(lease) = lease {
        request = request.fenced(lease);
    }
    if let Some(cancellation) = cancellation {
        request = request.set("cancellation", cancellation);
    }
    deps.jobs.transition(request).await?;
    if let Some(lease) = lease {
        revoke(deps, &job.job_id, lease).await;
    }
    stop_execution(deps, job, &cause).await;
    let message = longhaul_aws::queue::DispatchMessage::new(record.job_id.clone());
    let sent = match lease {
        Some(_) => {
            let delay = deps.config.thresholds.heartbeat_timeout.as_secs().clamp(1, 900) as u32;
            deps.intake.send_delayed(&message, delay, &record.owner).await
        }
        None => deps.intake.send(&message, &record.owner).await,
    };
    if let Err(err) = sent {
        // Compensating is recorded: the compensating sweep dispatches it once it is due.
        tracing::warn!(error = %err, "sending the compensation failed; the reaper's sweep sends it later");
    }
    Ok(true)
}

/// Takes the progress record from the lease of a job the reaper just ended: its worker may be
/// alive (a job timed out while working, a zombie that was only slow), and its progress and
/// checkpoint writes must be refused from now on, as a re-dispatch's are.
async fn revoke(deps: &Deps, job_id: &JobId, lease: &str) {
    if let Err(err) = deps.jobs.revoke_progress(job_id, lease).await {
        // The job's end is recorded; a write the old worker still makes changes nothing of it.
        tracing::warn!(error = %err, "revoking the ended job's progress record failed");
    }
}

async fn stop_execution(deps: &Deps, job: &JobEntry, cause: &str) {
    if let Some(execution) = &job.execution
        && let Err(err) = deps.executions.stop(execution, cause).await
    {
        // The job's state is already decided; a stale execution's writes are fenced off.
        tracing::warn!(execution, error = %err, "stopping the old execution failed");
    }
}

async fn tidy(deps: &Deps, job_id: &JobId, ended: JobStatus) -> Result<(), ReaperError> {
    Ok(longhaul_aws::tidy_after_end(&*deps.objects, job_id, ended).await?)
}

#[cfg(test)]
mod tests;
