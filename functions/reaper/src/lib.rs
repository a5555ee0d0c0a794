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
//! * **job-level timeout** — running longer than its job type's maximum: failed (`Job.Timeout`).
//!
//! Every run sweeps each bucket to its end, within a time budget (see [`sweep`]); every
//! action is a conditional write (status and lease), so two reapers running at once never act
//! twice on one job.

use std::time::{Duration, Instant};

mod sweep;
mod waiting;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use longhaul_aws::config::{ConfigError, ResultTtl, Vars};
use longhaul_aws::executions::{Executions, execution_name};
use longhaul_aws::jobs::{
    JobEntry, JobStore, ProgressRecord, RecordRetention, StoreError, TransitionRequest,
    WAITING_BUCKET,
};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
use longhaul_aws::slots::Admitter;
use longhaul_domain::reaper::{Rescue, Running, Thresholds, Verdict, judge, rescue};
use longhaul_domain::{ErrorCode, JobError, JobStatus, format_rfc3339, schedule};
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
    /// stopped for the next run (below the 60 s schedule, so runs do not pile up).
    pub budget: Duration,
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
            result_ttl: ResultTtl::from_vars(vars)?,
            record_retention: RecordRetention::from_vars(vars)?,
            tenant_max_running: vars.parsed_or("LONGHAUL_TENANT_MAX_RUNNING", 50)?,
            workers: longhaul_aws::workers::Workers::from_vars(vars)?,
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
    /// The intake queue.
    pub intake: IntakeQueue,
    /// The job state machine.
    pub executions: Executions,
    /// Settings.
    pub config: Config,
    /// Running slots and waiting lists (the reconciliation of waiting jobs' pools).
    pub admitter: Admitter,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                .retaining(config.record_retention),
            objects: ObjectStore::new(aws_sdk_s3::Client::new(sdk), config.bucket.clone()),
            intake: IntakeQueue::new(
                aws_sdk_sqs::Client::new(sdk),
                config.intake_queue_url.clone(),
            ),
            executions: Executions::new(
                aws_sdk_sfn::Client::new(sdk),
                config.state_machine_arn.clone(),
            ),
            config: config.clone(),
            admitter: Admitter::new(sdk, &config.table, &config.intake_queue_url),
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
    /// Live jobs by status at the start of the run (`pending`, `queued`, `running`), also
    /// emitted as the `ActiveJobs` gauge (dimension `Status`) for the dashboard. A status
    /// that could not be counted is missing (and counted in `errors`).
    pub active: std::collections::BTreeMap<String, u64>,
}

impl Report {
    /// Adds what another part of the run did.
    fn merge(&mut self, other: Report) {
        self.re_enqueued += other.re_enqueued;
        self.restarted += other.restarted;
        self.redispatched += other.redispatched;
        self.backfilled += other.backfilled;
        self.failed += other.failed;
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
    }
}

/// The live buckets the `ActiveJobs` gauge reports (the status index's): the statuses, and
/// `waiting` for the `pending` jobs that wait for a running slot.
pub const ACTIVE_STATUSES: [&str; 4] = ["pending", "waiting", "queued", "running"];

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

fn parse(time: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(time).ok().map(|t| t.to_utc())
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
    // The reaper runs every minute anyway: it is the one place that can afford to count the
    // live jobs for the dashboard's "active jobs by status" (a count query per shard).
    for status in ACTIVE_STATUSES {
        match deps.jobs.count_bucket(status).await {
            Ok(count) => {
                metrics::emit_status(Metric::ActiveJobs, count as f64, status);
                report.active.insert(status.to_owned(), count);
            }
            Err(err) => {
                tracing::error!(error = %err, status, "counting the live jobs failed");
                report.errors += 1;
            }
        }
    }
    // Every bucket is swept to its end (see `sweep`), within the run's budget. Each job is
    // handled in its `job` span (see `longhaul_aws::logs`). One job that cannot be handled (an
    // item this version cannot read, an AWS call that failed) is logged, counted and left for
    // the next run: failing the whole run would hold every job behind it up.
    let deadline = Instant::now() + deps.config.budget;
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
    let pending =
        sweep::sweep(deps, "pending", &pending_before, deadline, &cursors, |jobs| async move {
            let mut report = Report::default();
            for job in jobs {
                let span = logs::span_of(&job);
                let result =
                    lost_pending(deps, now, job, &mut report).instrument(span.clone()).await;
                counted(result, &span, &mut report);
            }
            report
        });
    let queued =
        sweep::sweep(deps, "queued", &queued_before, deadline, &cursors, |jobs| async move {
            let mut report = Report::default();
            for job in jobs {
                let span = logs::span_of(&job);
                let result =
                    lost_queued(deps, now, job, &mut report).instrument(span.clone()).await;
                counted(result, &span, &mut report);
            }
            report
        });
    let running = sweep::sweep(deps, "running", &running_before, deadline, &cursors, |jobs| {
        running_page(deps, now, jobs)
    });
    let reconciled = waiting::Reconciled::default();
    let waiting = sweep::sweep(deps, WAITING_BUCKET, &running_before, deadline, &cursors, |jobs| {
        waiting::waiting_page(deps, jobs, &reconciled)
    });
    let (pending, queued, running, waiting) = tokio::join!(pending, queued, running, waiting);
    for swept in [pending, queued, running, waiting] {
        report.merge(swept);
    }
    tracing::info!(report = ?report, "reaper run");
    Ok(report)
}

/// The job record an index returned, or `None` (logged and counted) if it cannot be read.
fn readable(item: longhaul_aws::jobs::Item, report: &mut Report) -> Option<JobEntry> {
    match JobStore::entry_from(item) {
        Ok(job) => Some(job),
        Err(err) => {
            tracing::error!(error = %err, "a job record in the status index cannot be read; skipped");
            report.errors += 1;
            None
        }
    }
}

/// Logs and counts a job that could not be handled this run.
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

/// A `pending` job past the grace: its message may have been lost (submit died between its
/// two writes, or the message dead-lettered), or may still wait in a backlog — SQS cannot say
/// which. Enqueueing it again is harmless either way (dispatch is a conditional transition and
/// executions are named by job and dispatch), so it is re-enqueued, at growing intervals so a
/// backlog is not multiplied (`pending_grace` × 2ⁿ, up to `max_enqueue_interval`); it fails
/// only when it has waited `max_pending` since it was accepted, never for a count of looks.
async fn lost_pending(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let accepted_at = parse(&job.created_at).unwrap_or(now);
    let waited = (now - accepted_at).to_std().unwrap_or_default();
    // A delayed job waits from its start, not from its submission: the index entry does not
    // say whether a job is delayed, so the record is read — only on this rare path.
    if waited >= deps.config.max_pending && !delayed_within(deps, now, &job).await? {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!(
                "not dispatched within {} s of being accepted ({} re-enqueues)",
                deps.config.max_pending.as_secs(),
                job.enqueues
            ),
        };
        let result = fail(deps, &job, &[JobStatus::Pending], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    let interval = deps
        .config
        .pending_grace
        .saturating_mul(1u32 << (job.enqueues + 1).min(20))
        .min(deps.config.max_enqueue_interval)
        .max(deps.config.pending_grace);
    // The sweep asks for entries whose sort key is older than the grace: an entry keyed
    // `now + interval − grace` is next due in `interval`.
    let next_look = now + chrono::Duration::from_std(interval).unwrap_or_default()
        - chrono::Duration::from_std(deps.config.pending_grace).unwrap_or_default();
    match deps.jobs.count_enqueue(&job.job_id, &at(next_look)).await {
        Ok(record) => {
            let message = DispatchMessage { job_id: job.job_id.clone() };
            match record.not_before.as_deref().and_then(parse).filter(|start| *start > now) {
                // A delayed job coming due (its entry was keyed 15 minutes before its start):
                // its message waits for the start, and the next look is after it.
                Some(start) => {
                    let delay = schedule::sqs_delay(start, now);
                    deps.intake.send_delayed(&message, delay, &record.owner).await?;
                    if start > next_look {
                        raced(deps.jobs.defer_pending_look(&job.job_id, &at(start)).await, report)?;
                    }
                    tracing::info!(delay, "delayed job coming due; enqueued for its start");
                }
                None => {
                    deps.intake.send(&message, &record.owner).await?;
                    tracing::warn!(
                        next_look_in_seconds = interval.as_secs(),
                        "pending job not dispatched yet; enqueued again"
                    );
                }
            }
            report.re_enqueued += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

/// Whether `job`, pending for longer than `max_pending` since it was accepted, is a delayed
/// job that has waited less than that since its start (so it is not undispatchable yet).
async fn delayed_within(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
) -> Result<bool, ReaperError> {
    let Some(record) = deps.jobs.job(&job.job_id).await? else { return Ok(false) };
    Ok(record
        .not_before
        .as_deref()
        .and_then(parse)
        .is_some_and(|start| (now - start).to_std().unwrap_or_default() < deps.config.max_pending))
}

async fn lost_queued(
    deps: &Deps,
    now: DateTime<Utc>,
    job: JobEntry,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let current =
        job.execution.clone().unwrap_or_else(|| execution_name(&job.job_id, job.dispatches.max(1)));
    match deps.executions.status(&current).await?.as_deref() {
        Some("RUNNING") => return Ok(()), // on its way (its claim may be retrying)
        Some(_) => {} // it ended without running the job: a new execution, within the budget
        None => return never_started(deps, now, &job, &current, report).await,
    }
    if job.dispatches >= deps.max_attempts(&job) {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!("its execution {current} ended without running it"),
        };
        let result = fail(deps, &job, &[JobStatus::Queued], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    let next = execution_name(&job.job_id, job.dispatches + 1);
    match deps.jobs.redispatch_queued(&job.job_id, job.dispatches, &next).await {
        Ok(_) => {
            deps.executions
                .start(
                    &next,
                    &deps.config.workers.execution_input(&job.job_id, &job.policy_or_default()),
                )
                .await?;
            tracing::warn!(
                execution = next,
                "queued job's execution ended without it; started another"
            );
            report.restarted += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

/// A `queued` job whose execution does not exist: its start was throttled or failed (an
/// outage of Step Functions, say), which is no evidence that the job cannot run. It is started
/// again under the same name (idempotent), spending no attempt of its budget; only a job that
/// has waited `max_pending` since it was accepted (or queued again for its next attempt, whose
/// dispatch message was lost) fails.
async fn never_started(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
    execution: &str,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // A job queued again for its next attempt (after a backoff) has waited since then.
    let since = if job.dispatches > 1 { &job.updated_at } else { &job.created_at };
    let waited = (now - parse(since).unwrap_or(now)).to_std().unwrap_or_default();
    if waited >= deps.config.max_pending {
        let error = JobError {
            code: ErrorCode::Undispatchable.as_str().into(),
            message: format!(
                "its execution could not be started within {} s of being accepted",
                deps.config.max_pending.as_secs()
            ),
        };
        let result = fail(deps, job, &[JobStatus::Queued], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    deps.executions
        .start(
            execution,
            &deps.config.workers.execution_input(&job.job_id, &job.policy_or_default()),
        )
        .await?;
    tracing::warn!(execution, "queued job's execution was never started; started it");
    report.restarted += 1;
    Ok(())
}

/// Judges a page of running jobs from what the index holds and their progress records (one
/// batch read), and handles, from a fresh consistent read, only those that do not look healthy.
async fn running_page(deps: &Deps, now: DateTime<Utc>, jobs: Vec<JobEntry>) -> Report {
    let mut report = Report::default();
    let ids: Vec<String> = jobs.iter().map(|job| job.job_id.clone()).collect();
    let progress = match deps.jobs.progress_records(&ids).await {
        Ok(progress) => Some(progress),
        Err(err) => {
            // Judge each job from its own consistent read instead: slower, nothing skipped.
            tracing::error!(error = %err, "reading a page of progress records failed");
            None
        }
    };
    for job in jobs {
        if let Some(progress) = &progress
            && let Some((_, state)) = running_state(&job, progress.get(&job.job_id), now, deps)
            && matches!(judge(now, &state, &deps.config.thresholds), Verdict::Healthy)
        {
            continue;
        }
        let span = logs::span_of(&job);
        let result = running(deps, now, &job.job_id, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    report
}

/// What the reaper judges a running job by (with its lease), or `None` if it is not running.
fn running_state(
    job: &JobEntry,
    progress: Option<&ProgressRecord>,
    now: DateTime<Utc>,
    deps: &Deps,
) -> Option<(String, Running)> {
    let (JobStatus::Running, Some(lease)) = (job.status, job.lease.clone()) else { return None };
    // A claim that died before handing the progress record over left the record to an
    // earlier attempt (or none at all): the lease's only sign of life is the claim itself.
    let claimed_at = parse(&job.updated_at).unwrap_or(now);
    let (heartbeat_at, progress_changed_at) = match progress.filter(|p| p.lease == lease) {
        Some(progress) => (
            parse(&progress.heartbeat_at).unwrap_or(now),
            progress.progress_changed_at.as_deref().and_then(parse).unwrap_or(now),
        ),
        None => (claimed_at, claimed_at),
    };
    let policy = job.policy_or_default();
    let state = Running {
        heartbeat_at,
        progress_changed_at,
        started_at: job.started_at.as_deref().and_then(parse).unwrap_or(now),
        stalled_at: job.stalled_at.as_deref().and_then(parse),
        max_runtime: deps.config.max_runtime.unwrap_or(policy.max_runtime()),
    };
    Some((lease, state))
}

async fn running(
    deps: &Deps,
    now: DateTime<Utc>,
    job_id: &str,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // The index is eventually consistent: judge the job and its progress as they are now.
    let Some(view) = deps.jobs.view(job_id).await? else { return Ok(()) };
    logs::current_job(&view.job);
    let job = JobEntry::from(&view.job);
    let Some((lease, state)) = running_state(&job, view.progress.as_ref(), now, deps) else {
        return Ok(());
    };
    match judge(now, &state, &deps.config.thresholds) {
        Verdict::Healthy => Ok(()),
        Verdict::Stalled => {
            let result = deps.jobs.mark_stalled(job_id, &lease, Some(&at(now))).await;
            if result.is_ok() {
                metrics::count(Metric::StalledJobs, &job);
                tracing::warn!("progress stalled while heartbeating");
                report.stalled += 1;
            }
            raced(result, report)
        }
        Verdict::Recovered => {
            let result = deps.jobs.mark_stalled(job_id, &lease, None).await;
            if result.is_ok() {
                report.recovered += 1;
            }
            raced(result, report)
        }
        Verdict::TimedOut(reason) => {
            let error = JobError::new(ErrorCode::Timeout, reason);
            let result = fail(deps, &job, &[JobStatus::Running], Some(&lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            raced(result, report)
        }
        Verdict::Zombie(reason) => zombie(deps, now, &job, &lease, reason, report).await,
    }
}

async fn zombie(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobEntry,
    lease: &str,
    reason: String,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let job_id = job.job_id.as_str();
    let result_key = deps.objects.first_key(&format!("results/{job_id}/{}/", job.attempt)).await?;
    let max_attempts = deps.max_attempts(job);
    let outcome = match rescue(result_key.is_some(), job.attempt, max_attempts) {
        Rescue::Backfill => {
            let key = result_key.unwrap_or_default();
            let expires = now
                + chrono::Duration::from_std(
                    deps.config.result_ttl.of(job.policy_or_default().result_retention()),
                )
                .unwrap_or_default();
            let request = TransitionRequest::new(
                job_id,
                &[JobStatus::Running],
                JobStatus::Succeeded,
                format!("{reason}; its result was already stored"),
            )
            .fenced(lease)
            .set("result_key", AttributeValue::S(key))
            .indexed_at(at(expires));
            let result = deps.jobs.transition(request).await;
            if let Ok(ended) = &result {
                revoke(deps, job_id, lease).await;
                metrics::emit_end(ended);
                stop_execution(deps, job, "the worker stopped after storing the result").await;
                tidy(deps, job_id, JobStatus::Succeeded).await?;
                report.backfilled += 1;
            }
            result.map(|_| ())
        }
        Rescue::Redispatch => {
            // First fence the old worker off its progress record: it may be alive after all.
            deps.jobs.revoke_progress(job_id, lease).await?;
            let next = execution_name(job_id, job.dispatches.max(1) + 1);
            let request = TransitionRequest::new(
                job_id,
                &[JobStatus::Running],
                JobStatus::Queued,
                format!(
                    "{reason}; re-dispatched as attempt {} of {}",
                    job.attempt + 1,
                    max_attempts
                ),
            )
            .fenced(lease)
            .set("execution", AttributeValue::S(next.clone()))
            .set("dispatches", AttributeValue::N((job.dispatches.max(1) + 1).to_string()));
            let result = deps.jobs.transition(request).await.map(|_| ());
            if result.is_ok() {
                stop_execution(deps, job, "superseded by a re-dispatch").await;
                deps.executions
                    .start(
                        &next,
                        &deps.config.workers.execution_input(job_id, &job.policy_or_default()),
                    )
                    .await?;
                tracing::warn!(execution = next, reason, "zombie re-dispatched");
                report.redispatched += 1;
            }
            result
        }
        Rescue::Fail => {
            let error = JobError {
                code: ErrorCode::Abandoned.as_str().into(),
                message: format!("{reason}; retry budget of {} attempts spent", max_attempts),
            };
            let result = fail(deps, job, &[JobStatus::Running], Some(lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            result
        }
    };
    // Counted only by the reaper whose fenced write rescued it (another may have raced it).
    if outcome.is_ok() {
        metrics::count(Metric::ZombiesReaped, job);
    }
    raced(outcome, report)
}

/// Fails a job (conditionally), stops its execution and tidies up after it.
async fn fail(
    deps: &Deps,
    job: &JobEntry,
    from: &[JobStatus],
    lease: Option<&str>,
    error: JobError,
) -> Result<(), StoreError> {
    let mut request =
        TransitionRequest::new(&job.job_id, from, JobStatus::Failed, error.message.clone())
            .set("error", serde_dynamo::to_attribute_value(&error).expect("errors serialise"));
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

/// Takes the progress record from the lease of a job the reaper just ended: its worker may be
/// alive (a job timed out while working, a zombie that was only slow), and its progress and
/// checkpoint writes must be refused from now on, as a re-dispatch's are.
async fn revoke(deps: &Deps, job_id: &str, lease: &str) {
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

async fn tidy(deps: &Deps, job_id: &str, ended: JobStatus) -> Result<(), ReaperError> {
    Ok(longhaul_aws::tidy_after_end(&deps.objects, job_id, ended).await?)
}
