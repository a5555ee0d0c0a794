//! **reaper** — runs every minute (EventBridge schedule `reaper`) so that no job sits in a
//! live state forever:
//!
//! * **lost dispatch** — a `pending` job older than the grace (submit died between storing the
//!   job and enqueueing it, or its message dead-lettered) is enqueued again, a bounded number
//!   of times, then failed; a `queued` job whose execution has ended (or never started)
//!   without running it gets a new execution, within the retry budget, then fails;
//! * **zombies** — a `running` job without a heartbeat for the timeout: if its result is
//!   already in S3, the success is recorded; else it is re-dispatched as a new attempt (the
//!   old execution stopped, the old lease dead, the new attempt resuming from the checkpoint)
//!   while the retry budget lasts; else it fails with the reason;
//! * **stalled progress** — heartbeats but no progress for the stall threshold: the job is
//!   flagged (`"stalled": true`) and counted; still stalled after the grace, it is a zombie;
//! * **job-level timeout** — running longer than its job type's maximum: failed (`Job.Timeout`).
//!
//! Every action is a conditional write (status and lease), so two reapers running at once
//! never act twice on one job; each run reads a bounded number of index pages.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use longhaul_aws::config::{ConfigError, ResultTtl, Vars};
use longhaul_aws::executions::{Executions, execution_name};
use longhaul_aws::jobs::{JobRecord, JobStore, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Unit};
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
use longhaul_domain::reaper::{Rescue, Running, Thresholds, Verdict, judge, rescue};
use longhaul_domain::{JobError, JobStatus, JobType, format_rfc3339};
use serde::Serialize;
use serde_json::json;
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
    /// `LONGHAUL_STALL_GRACE_SECONDS` (600), `LONGHAUL_MAX_ATTEMPTS` (3).
    pub thresholds: Thresholds,
    /// `LONGHAUL_PENDING_GRACE_SECONDS` (60): a pending job older than this was not dispatched.
    pub pending_grace: Duration,
    /// `LONGHAUL_QUEUED_GRACE_SECONDS` (120): a queued job older than this should be running.
    pub queued_grace: Duration,
    /// `LONGHAUL_MAX_ENQUEUES` (5): re-enqueues of a pending job before it fails.
    pub max_enqueues: u32,
    /// `LONGHAUL_MAX_RUNTIME_SECONDS` (86,400), per type `LONGHAUL_MAX_RUNTIME_SECONDS_<TYPE>`.
    pub max_runtime: Vec<(JobType, Duration)>,
    /// See `max_runtime`.
    pub default_max_runtime: Duration,
    /// `LONGHAUL_REAPER_PAGE` (100): most jobs of each kind looked at per run.
    pub page: usize,
    /// Result retention (for a backfilled success).
    pub result_ttl: ResultTtl,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let secs =
            |name: &str, default: u64| vars.parsed_or(name, default).map(Duration::from_secs);
        let mut max_runtime = Vec::new();
        for job_type in JobType::ALL {
            let name = format!("LONGHAUL_MAX_RUNTIME_SECONDS_{}", job_type.as_str().to_uppercase());
            if let Some(s) = vars.parsed::<u64>(&name)? {
                max_runtime.push((job_type, Duration::from_secs(s)));
            }
        }
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            state_machine_arn: vars.required("STATE_MACHINE_ARN")?,
            thresholds: Thresholds {
                heartbeat_timeout: secs("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", 90)?,
                stall: secs("LONGHAUL_STALL_SECONDS", 300)?,
                stall_grace: secs("LONGHAUL_STALL_GRACE_SECONDS", 600)?,
                max_attempts: vars.parsed_or("LONGHAUL_MAX_ATTEMPTS", 3)?,
            },
            pending_grace: secs("LONGHAUL_PENDING_GRACE_SECONDS", 60)?,
            queued_grace: secs("LONGHAUL_QUEUED_GRACE_SECONDS", 120)?,
            max_enqueues: vars.parsed_or("LONGHAUL_MAX_ENQUEUES", 5)?,
            max_runtime,
            default_max_runtime: secs("LONGHAUL_MAX_RUNTIME_SECONDS", 86_400)?,
            page: vars.parsed_or("LONGHAUL_REAPER_PAGE", 100)?,
            result_ttl: ResultTtl::from_vars(vars)?,
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
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
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
        }
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
    /// Live jobs by status at the start of the run (`pending`, `queued`, `running`), also
    /// emitted as the `ActiveJobs` gauge (dimension `Status`) for the dashboard. A status
    /// that could not be counted is missing (and counted in `errors`).
    pub active: std::collections::BTreeMap<String, u64>,
}

/// The live statuses the `ActiveJobs` gauge reports (the status index's live buckets).
pub const ACTIVE_STATUSES: [&str; 3] = ["pending", "queued", "running"];

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
                metrics::emit_status("ActiveJobs", count as f64, status);
                report.active.insert(status.to_owned(), count);
            }
            Err(err) => {
                tracing::error!(error = %err, status, "counting the live jobs failed");
                report.errors += 1;
            }
        }
    }
    // Each job is handled in its `job` span (see `longhaul_aws::logs`): pending and queued
    // jobs come from the index with their whole record; a running job's record is read anyway.
    // One job that cannot be handled (an item this version cannot read, an AWS call that
    // failed) is logged, counted and left for the next run: the index is read oldest first, so
    // failing the whole run would hold every job behind it up for good.
    for item in
        deps.jobs.due("pending", &grace(deps.config.pending_grace), deps.config.page).await?
    {
        let Some(job) = readable(item, &mut report) else { continue };
        let span = logs::span_of(&job);
        let result = lost_pending(deps, job, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    for item in deps.jobs.due("queued", &grace(deps.config.queued_grace), deps.config.page).await? {
        let Some(job) = readable(item, &mut report) else { continue };
        let span = logs::span_of(&job);
        let result = lost_queued(deps, job, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    for item in
        deps.jobs.due("running", &at(now + chrono::Duration::seconds(1)), deps.config.page).await?
    {
        let Some(job) = readable(item, &mut report) else { continue };
        let span = logs::span_of(&job);
        let result = running(deps, now, &job.job_id, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    tracing::info!(report = ?report, "reaper run");
    Ok(report)
}

/// The job record an index returned, or `None` (logged and counted) if it cannot be read.
fn readable(item: longhaul_aws::jobs::Item, report: &mut Report) -> Option<JobRecord> {
    match JobStore::job_from(item) {
        Ok(job) => Some(job),
        Err(err) => {
            tracing::error!(error = %err, "a job record in the status index cannot be read; skipped");
            report.errors += 1;
            None
        }
    }
}

/// Logs and counts a job that could not be handled this run.
fn counted(result: Result<(), ReaperError>, span: &tracing::Span, report: &mut Report) {
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

async fn lost_pending(deps: &Deps, job: JobRecord, report: &mut Report) -> Result<(), ReaperError> {
    if job.enqueues >= deps.config.max_enqueues {
        let error = JobError {
            code: "Job.Undispatchable".into(),
            message: format!("could not be dispatched after {} attempts", job.enqueues + 1),
        };
        let result = fail(deps, &job, &[JobStatus::Pending], None, error).await;
        if result.is_ok() {
            report.failed += 1;
        }
        return raced(result, report);
    }
    match deps.jobs.count_enqueue(&job.job_id).await {
        Ok(_) => {
            deps.intake.send(&DispatchMessage { job_id: job.job_id.clone() }).await?;
            tracing::warn!("pending job was never dispatched; enqueued again");
            report.re_enqueued += 1;
            Ok(())
        }
        Err(err) => raced(Err(err), report),
    }
}

async fn lost_queued(deps: &Deps, job: JobRecord, report: &mut Report) -> Result<(), ReaperError> {
    let current =
        job.execution.clone().unwrap_or_else(|| execution_name(&job.job_id, job.dispatches.max(1)));
    if deps.executions.status(&current).await?.as_deref() == Some("RUNNING") {
        return Ok(()); // on its way (its claim may be retrying)
    }
    if job.dispatches >= deps.config.thresholds.max_attempts {
        let error = JobError {
            code: "Job.Undispatchable".into(),
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
            deps.executions.start(&next, &json!({ "job_id": job.job_id })).await?;
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

async fn running(
    deps: &Deps,
    now: DateTime<Utc>,
    job_id: &str,
    report: &mut Report,
) -> Result<(), ReaperError> {
    // The index is eventually consistent: judge the job and its progress as they are now.
    let Some(view) = deps.jobs.view(job_id).await? else { return Ok(()) };
    let job = view.job;
    logs::current_job(&job);
    let (JobStatus::Running, Some(lease)) = (job.status, job.lease.clone()) else { return Ok(()) };
    // A claim that died before handing the progress record over left the record to an
    // earlier attempt (or none at all): the lease's only sign of life is the claim itself.
    let claimed_at = parse(&job.updated_at).unwrap_or(now);
    let (heartbeat_at, progress_changed_at) = match view.progress.filter(|p| p.lease == lease) {
        Some(progress) => (
            parse(&progress.heartbeat_at).unwrap_or(now),
            progress.progress_changed_at.as_deref().and_then(parse).unwrap_or(now),
        ),
        None => (claimed_at, claimed_at),
    };
    let job_type = job.job_type.parse::<JobType>().unwrap_or(JobType::Demo);
    let state = Running {
        heartbeat_at,
        progress_changed_at,
        started_at: job.started_at.as_deref().and_then(parse).unwrap_or(now),
        stalled_at: job.stalled_at.as_deref().and_then(parse),
        max_runtime: deps
            .config
            .max_runtime
            .iter()
            .find(|(t, _)| *t == job_type)
            .map(|(_, d)| *d)
            .unwrap_or(deps.config.default_max_runtime),
    };
    match judge(now, &state, &deps.config.thresholds) {
        Verdict::Healthy => Ok(()),
        Verdict::Stalled => {
            let result = deps.jobs.mark_stalled(job_id, &lease, Some(&at(now))).await;
            if result.is_ok() {
                metrics::emit("StalledJobs", 1.0, Unit::Count, &job);
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
            let error = JobError { code: "Job.Timeout".into(), message: reason };
            let result = fail(deps, &job, &[JobStatus::Running], Some(&lease), error).await;
            if result.is_ok() {
                report.failed += 1;
            }
            raced(result, report)
        }
        Verdict::Zombie(reason) => zombie(deps, now, &job, &lease, job_type, reason, report).await,
    }
}

async fn zombie(
    deps: &Deps,
    now: DateTime<Utc>,
    job: &JobRecord,
    lease: &str,
    job_type: JobType,
    reason: String,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let job_id = job.job_id.as_str();
    let result_key = deps.objects.first_key(&format!("results/{job_id}/{}/", job.attempt)).await?;
    let outcome = match rescue(result_key.is_some(), job.attempt, &deps.config.thresholds) {
        Rescue::Backfill => {
            let key = result_key.unwrap_or_default();
            let expires = now
                + chrono::Duration::from_std(deps.config.result_ttl.of(job_type))
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
                metrics::emit_end(ended);
                stop_execution(deps, job, "the worker stopped after storing the result").await;
                tidy(deps, job_id).await?;
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
                    deps.config.thresholds.max_attempts
                ),
            )
            .fenced(lease)
            .set("execution", AttributeValue::S(next.clone()))
            .set("dispatches", AttributeValue::N((job.dispatches.max(1) + 1).to_string()));
            let result = deps.jobs.transition(request).await.map(|_| ());
            if result.is_ok() {
                stop_execution(deps, job, "superseded by a re-dispatch").await;
                deps.executions.start(&next, &json!({ "job_id": job_id })).await?;
                tracing::warn!(execution = next, reason, "zombie re-dispatched");
                report.redispatched += 1;
            }
            result
        }
        Rescue::Fail => {
            let error = JobError {
                code: "Job.Abandoned".into(),
                message: format!(
                    "{reason}; retry budget of {} attempts spent",
                    deps.config.thresholds.max_attempts
                ),
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
        metrics::emit("ZombiesReaped", 1.0, Unit::Count, job);
    }
    raced(outcome, report)
}

/// Fails a job (conditionally), stops its execution and tidies up after it.
async fn fail(
    deps: &Deps,
    job: &JobRecord,
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
    metrics::emit_end(&ended);
    if error.code == "Job.Undispatchable" {
        metrics::emit("JobsDeadLettered", 1.0, Unit::Count, job);
    }
    tracing::warn!(code = error.code, message = error.message, "failed by the reaper");
    stop_execution(deps, job, &error.message).await;
    if let Err(err) = tidy(deps, &job.job_id).await {
        tracing::warn!(error = %err, "cleanup after failing the job failed; the lifecycle rule is the backstop");
    }
    Ok(())
}

async fn stop_execution(deps: &Deps, job: &JobRecord, cause: &str) {
    if let Some(execution) = &job.execution
        && let Err(err) = deps.executions.stop(execution, cause).await
    {
        // The job's state is already decided; a stale execution's writes are fenced off.
        tracing::warn!(execution, error = %err, "stopping the old execution failed");
    }
}

async fn tidy(deps: &Deps, job_id: &str) -> Result<(), ReaperError> {
    Ok(longhaul_aws::tidy_after_end(&deps.objects, job_id).await?)
}
