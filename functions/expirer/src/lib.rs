//! **expirer** — runs on a schedule (`expirer`, hourly): a `succeeded` job whose result has
//! passed its retention (`LONGHAUL_RESULT_TTL_SECONDS`, default 7 days, per job type) becomes
//! `expired` (`GET /jobs/{id}/result` → 410), then loses its result and checkpoint objects,
//! then its records are marked for DynamoDB TTL after `LONGHAUL_RECORD_RETENTION_SECONDS`
//! (default 30 days); the bucket's lifecycle rules are only a backstop.
//!
//! **Order.** The job is marked `expired` *first*, in one conditional write that also moves
//! its status-index entry to the `expired#<shard>` bucket: from then on the result route
//! answers 410, never a 303 to an object about to be deleted. The follow-up (delete the
//! objects, mark the records, take the entry out of the index) is idempotent, and a run that
//! fails or dies before it ends leaves the entry where the next run's sweep of the `expired`
//! bucket finds it and finishes the work.
//!
//! **Volume.** One run drains everything due: it pages through every shard of both buckets
//! (`LONGHAUL_EXPIRER_PAGE` entries a query), the shards side by side and the jobs of a page
//! a few at a time, until nothing is due or its time budget is spent — the sooner of
//! `LONGHAUL_EXPIRER_BUDGET_SECONDS` (240) after it started and [`PAGE_MARGIN`] before the
//! Lambda deadline. What is left is the oldest of what remains, and the next run starts there.

pub mod lambda;
pub mod reminders;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, RecordRetention, STATUS_SHARDS, StoreError, TransitionRequest};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::ports::{
    Clock, EndpointDeliveries, EndpointStore, IndexEntry, JobRetention, JobTransitions,
    ObjectCleanup, StatusIndex, SweepCursors, SystemClock, WebhookDispatch,
};
use longhaul_aws::queue::WebhookQueue;
use longhaul_domain::{JobId, JobStatus, Timestamp, format_rfc3339};
use serde::Serialize;
use tracing::Instrument;

/// A run starts no page later than this before the Lambda deadline, so the page in flight
/// (at most `LONGHAUL_EXPIRER_PAGE` jobs, [`IN_FLIGHT`] at a time) ends before Lambda stops it.
pub const PAGE_MARGIN: Duration = Duration::from_secs(30);

/// Jobs of a page handled at once, in each shard: every job costs a few sequential round
/// trips (a write, two object listings and deletes, two writes), so one at a time would cap a
/// run at a few thousand jobs.
pub const IN_FLIGHT: usize = 8;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// `BUCKET_NAME`.
    pub bucket: String,
    /// `WEBHOOK_QUEUE_URL`: where result reminders go.
    pub webhook_queue_url: String,
    /// `LONGHAUL_RECORD_RETENTION_SECONDS` (2,592,000): how long an expired job's records stay.
    pub record_retention: RecordRetention,
    /// `LONGHAUL_EXPIRER_PAGE` (200): index entries read per query (per shard and page).
    pub page: usize,
    /// `LONGHAUL_EXPIRER_BUDGET_SECONDS` (240, under the function's 300 s timeout): how long a
    /// run goes on starting pages; the next run continues where it stopped.
    pub budget: Duration,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            webhook_queue_url: vars.required("WEBHOOK_QUEUE_URL")?,
            record_retention: RecordRetention::from_vars(vars)?,
            page: vars.parsed_or("LONGHAUL_EXPIRER_PAGE", 200usize)?.max(1),
            budget: Duration::from_secs(vars.parsed_or("LONGHAUL_EXPIRER_BUDGET_SECONDS", 240)?),
        })
    }
}

/// What the function needs of the job table: to page through the status index, to expire a
/// job, to mark an expired job's records for deletion, and to keep where its reminders
/// stopped.
pub trait Jobs: StatusIndex + JobTransitions + JobRetention + SweepCursors {}
impl<T: StatusIndex + JobTransitions + JobRetention + SweepCursors> Jobs for T {}

/// What the reminders need of the job table: owners' endpoints, and their delivery records
/// (a disabled endpoint's skipped reminder).
pub trait Endpoints: EndpointStore + EndpointDeliveries {}
impl<T: EndpointStore + EndpointDeliveries> Endpoints for T {}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: Arc<dyn Jobs>,
    /// Results and checkpoints.
    pub objects: Arc<dyn ObjectCleanup>,
    /// Owners' endpoints and their delivery records ([`reminders`]).
    pub endpoints: Arc<dyn Endpoints>,
    /// The webhook queue, where reminders go.
    pub webhooks: Arc<dyn WebhookDispatch>,
    /// What time it is: a run's time ([`run`]) and what its budget is measured by.
    pub clock: Arc<dyn Clock>,
    /// Settings.
    pub config: Config,
}

impl Deps {
    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let store = Arc::new(
            JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())
                .retaining(config.record_retention),
        );
        Deps {
            jobs: store.clone(),
            endpoints: store,
            webhooks: Arc::new(WebhookQueue::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new),
                config.webhook_queue_url.clone(),
            )),
            objects: Arc::new(ObjectStore::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_s3::Client::new),
                config.bucket.clone(),
            )),
            clock: Arc::new(SystemClock),
            config: config.clone(),
        }
    }
}

/// What one run did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Jobs expired (`succeeded` → `expired`).
    pub expired: u32,
    /// Expired jobs whose follow-up was done: objects deleted, records marked, index entry
    /// removed — those expired in this run and those an earlier run left unfinished.
    pub finished: u32,
    /// Of `finished`, the ones an earlier run left unfinished.
    pub resumed: u32,
    /// Objects deleted.
    pub objects_deleted: usize,
    /// Jobs that could not be handled this run (unreadable, or an AWS call failed), each
    /// logged with its reason. They are tried again next run; the others are not held up.
    pub errors: u32,
    /// Index pages read.
    pub pages: u32,
    /// The run stopped at its time budget with shards not yet read to their end: the next
    /// run goes on with what is left.
    pub budget_spent: bool,
    /// What the reminders did ([`reminders`]).
    pub reminders: reminders::Reminders,
}

impl Report {
    fn add(&mut self, other: Report) {
        self.expired += other.expired;
        self.finished += other.finished;
        self.resumed += other.resumed;
        self.objects_deleted += other.objects_deleted;
        self.errors += other.errors;
        self.pages += other.pages;
        self.budget_spent |= other.budget_spent;
    }
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

/// The Lambda deadline (epoch milliseconds, as the runtime's context gives it) as an `Instant`.
pub fn deadline_from_epoch_ms(deadline_ms: u64) -> Instant {
    let now_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// When a run that starts at `started` stops starting pages: `budget` after it started, or
/// [`PAGE_MARGIN`] before the Lambda `deadline`, whichever comes first.
pub fn stop_at(started: Instant, deadline: Instant, budget: Duration) -> Instant {
    let by_deadline = deadline.checked_sub(PAGE_MARGIN).unwrap_or(started).max(started);
    (started + budget).min(by_deadline)
}

/// The two status-index buckets a run sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// `expired#<shard>`: jobs an earlier run expired without finishing the follow-up.
    Unfinished,
    /// `succeeded#<shard>` up to now: jobs whose result retention passed.
    Due,
}

impl Sweep {
    fn bucket(self) -> &'static str {
        match self {
            Sweep::Unfinished => JobStatus::Expired.as_str(),
            Sweep::Due => JobStatus::Succeeded.as_str(),
        }
    }
}

/// One run at the time of [`Deps::clock`]: [`handle`] at its `now`.
pub async fn run(deps: &Deps, deadline: Instant) -> Result<Report, ExpirerError> {
    handle(deps, deps.clock.now(), deadline).await
}

/// One run at `now` (what is due is what expired strictly before it), to stop starting pages
/// by `deadline` (the Lambda deadline) or its budget, both measured by [`Deps::clock`]'s
/// instant (`deadline` is one of its instants: the machine's in Lambda,
/// [`deadline_from_epoch_ms`]).
pub async fn handle(
    deps: &Deps,
    now: DateTime<Utc>,
    deadline: Instant,
) -> Result<Report, ExpirerError> {
    let stop = stop_at(deps.clock.instant(), deadline, deps.config.budget);
    let before = format_rfc3339(now);
    let mut report = Report::default();
    let mut failed = None;
    // Unfinished follow-ups first: they are older than anything this run expires.
    for sweep in [Sweep::Unfinished, Sweep::Due] {
        let shards = (0..STATUS_SHARDS).map(|shard| sweep_shard(deps, sweep, shard, &before, stop));
        for (shard_report, error) in futures::future::join_all(shards).await {
            report.add(shard_report);
            failed = failed.or(error);
        }
    }
    // The reminders after the expiries (what is due comes first), within the same budget.
    match reminders::remind(deps, now, stop).await {
        Ok(reminders) => report.reminders = reminders,
        Err(err) => {
            tracing::error!(error = %err, "sending reminders failed; the next run goes on from where they stopped");
            failed = failed.or(Some(err));
        }
    }
    tracing::info!(report = ?report, "expirer run");
    match failed {
        // Whatever was done is done (and logged above); the next run reads the index again.
        Some(err) => Err(err),
        None => Ok(report),
    }
}

/// Pages through one shard of `sweep`'s bucket until nothing is due or the time is up; an
/// index query that fails ends the shard's sweep (and fails the run, after the other shards).
async fn sweep_shard(
    deps: &Deps,
    sweep: Sweep,
    shard: u32,
    before: &str,
    stop: Instant,
) -> (Report, Option<ExpirerError>) {
    let mut report = Report::default();
    let mut start = None;
    loop {
        if deps.clock.instant() >= stop {
            report.budget_spent = true;
            return (report, None);
        }
        let page = match deps
            .jobs
            .due_page(sweep.bucket(), shard, before, deps.config.page, start)
            .await
        {
            Ok(page) => page,
            Err(err) => {
                tracing::error!(error = %err, bucket = sweep.bucket(), shard, "reading the status index failed");
                return (report, Some(ExpirerError(err.to_string())));
            }
        };
        report.pages += 1;
        // Each job leaves the bucket once handled; the cursor steps over those that could not
        // be (an unreadable entry, a failed call), so they never hold the others up.
        let outcomes: Vec<Report> = futures::stream::iter(page.entries)
            .map(|entry| handle_entry(deps, sweep, entry))
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for outcome in outcomes {
            report.add(outcome);
        }
        start = page.next;
        if start.is_none() {
            return (report, None);
        }
    }
}

/// Handles one entry (its job id and sort key are read from its keys alone, so any
/// projection holds them); what happened, counted.
async fn handle_entry(deps: &Deps, sweep: Sweep, entry: Result<IndexEntry, StoreError>) -> Report {
    let mut report = Report::default();
    let IndexEntry { job_id, at, .. } = match entry {
        Ok(entry) => entry,
        Err(err) => {
            tracing::error!(
                error = %err,
                bucket = sweep.bucket(),
                "a status-index entry without a job id or sort key; skipped"
            );
            report.errors += 1;
            return report;
        }
    };
    // In the job's `job` span (see `longhaul_aws::logs`); the rest of it once the record is read.
    let span = logs::job_span(Some(&job_id), None, None);
    let result = match sweep {
        Sweep::Due => expire(deps, &job_id, &mut report).instrument(span.clone()).await,
        Sweep::Unfinished => {
            // The entry's sort key is when the job expired; one that is no time is an error
            // of this entry (counted), not "now".
            let done = match at.parse::<Timestamp>() {
                Ok(at) => finish(deps, &job_id, at, &mut report).instrument(span.clone()).await,
                Err(err) => Err(ExpirerError(err.to_string())),
            };
            if done.is_ok() {
                report.resumed += 1;
            }
            done
        }
    };
    if let Err(err) = result {
        span.in_scope(|| {
            tracing::error!(error = %err, "expiring the job failed; the next run goes on from here")
        });
        report.errors += 1;
    }
    report
}

/// Expires one succeeded job whose retention passed (a job that changed meanwhile is skipped),
/// then finishes it.
async fn expire(deps: &Deps, job_id: &JobId, report: &mut Report) -> Result<(), ExpirerError> {
    let request = TransitionRequest::new(
        job_id,
        &[JobStatus::Succeeded],
        JobStatus::Expired,
        "result retention passed",
    )
    // A result kept in the record goes with the transition: nothing serves it from then on.
    .remove("result_inline");
    let job = match deps.jobs.transition(request).await {
        Ok(job) => job,
        // Expired by a concurrent run (which, or the next sweep, finishes it), or gone.
        Err(StoreError::Conflict { .. }) => return Ok(()),
        Err(err) => return Err(ExpirerError(err.to_string())),
    };
    logs::current_job(&job);
    // Counted at the transition, which happens once, whoever finishes the follow-up.
    metrics::count(Metric::JobsExpired, &job);
    tracing::info!("expired: result retention passed");
    report.expired += 1;
    // Set by the transition that made it `expired`.
    let expired_at = job.finished_at.unwrap_or_else(|| deps.clock.now().into());
    finish(deps, job_id, expired_at, report).await
}

/// The follow-up of an expired job (idempotent): deletes its objects, then marks its records
/// for TTL `record_retention` after `expired_at` and takes it out of the index.
async fn finish(
    deps: &Deps,
    job_id: &JobId,
    expired_at: Timestamp,
    report: &mut Report,
) -> Result<(), ExpirerError> {
    for prefix in [format!("results/{job_id}/"), longhaul_aws::objects::checkpoints_prefix(job_id)]
    {
        report.objects_deleted +=
            deps.objects.delete_prefix(&prefix).await.map_err(|e| ExpirerError(e.to_string()))?;
    }
    deps.jobs
        .retain_until(job_id, deps.config.record_retention.expires_at(expired_at.as_datetime()))
        .await
        .map_err(|e| ExpirerError(e.to_string()))?;
    report.finished += 1;
    Ok(())
}

#[cfg(test)]
mod tests;
