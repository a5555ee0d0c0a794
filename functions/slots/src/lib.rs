//! **slots** — gives a job's running slots back when it ends or is paused, and wakes the jobs
//! that wait for them.
//!
//! A job ends in one conditional write of its record, made by whoever ends it (a stage, the
//! cancel function, the reaper); none of them frees slots itself. The table's stream carries
//! that write here — filtered by the event source mapping to job records that moved into a
//! terminal status, or into `paused` — so a job frees its slots however it ends, even when its
//! ender dies right after the write (the stream keeps the change 24 hours); a paused job takes
//! a slot again through dispatch when it resumes. For each end this function gives
//! back the job's slot of its tenant's pool and of its kind's (`DELETE` from the holders set:
//! idempotent, so a retried batch frees nothing twice), takes the job out of the waiting
//! lists if it ended while waiting (a cancel), and sends a dispatch message for as many
//! waiting jobs as the pool now has free slots (`longhaul_aws::slots::Admitter`): a tenant
//! pool's in priority order, a kind pool's one tenant at a time, in turn. The give-back
//! returns the pool's waiting mark, and the lists are read only when it is set (a job entered
//! one since an admission last found them empty): most ends cost one write per pool. A job a schedule
//! submitted is also announced to its schedule (the schedule queue: a `buffer_one` schedule's
//! held tick is submitted now, a `pause_on_failure` schedule pauses when its job failed).
//!
//! The first record that could not be handled is the batch item failure: Lambda retries the
//! shard from it. A record that cannot be read is logged and skipped (no retry would change
//! it): a slot it held is found by the reaper's reconciliation, which gives back slots held by
//! jobs that ended.

pub mod lambda;

use std::sync::Arc;

use aws_lambda_events::dynamodb::{Event, EventRecord};
use aws_lambda_events::streams::DynamoDbEventResponse;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::JobStore;
use longhaul_aws::jobs::ScheduledBy;
use longhaul_aws::logs;
use longhaul_aws::ports::{JobReads, ScheduleFirings, SlotPools};
use longhaul_aws::queue::ScheduleQueue;
use longhaul_aws::scheduler::{FiringKind, ScheduleFiring};
use longhaul_aws::slots::{Admitter, pools_of};
pub use longhaul_aws::streams::RecordError;
use longhaul_aws::streams::{failure_at, job_end, job_paused};
use longhaul_domain::admission::{Priority, waiting_sort_key};
use longhaul_domain::{JobId, JobStatus, Owner};
use serde::Deserialize;
use tracing::Instrument;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table (its slot and waiting-list items).
    pub table: String,
    /// `INTAKE_QUEUE_URL`: where a woken job's dispatch message goes.
    pub intake_queue_url: String,
    /// `LONGHAUL_TENANT_MAX_RUNNING` (50; 0 = no limit), as the dispatcher has it.
    pub tenant_max_running: u32,
    /// `SCHEDULE_QUEUE_URL`: where a scheduled job's end is sent to its schedule.
    pub schedule_queue_url: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            tenant_max_running: vars.parsed_or("LONGHAUL_TENANT_MAX_RUNNING", 50)?,
            schedule_queue_url: vars.required("SCHEDULE_QUEUE_URL")?,
        })
    }
}

/// What the handler needs, built once per sandbox: its port.
#[derive(Debug, Clone)]
pub struct Deps {
    /// Slots and waiting lists (which wake waiting jobs through the intake queue).
    pub slots: Arc<dyn SlotPools>,
    /// The schedule queue: a scheduled job's end goes to its schedule.
    pub firings: Arc<dyn ScheduleFirings>,
    /// The job table: a pause is read again before its slots go back (see [`still_paused`]).
    pub jobs: Arc<dyn JobReads>,
    /// The configuration.
    pub config: Config,
}

impl Deps {
    /// Builds the AWS adapter from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let sqs = longhaul_aws::client::LazyClient::of(sdk, aws_sdk_sqs::Client::new);
        Deps {
            slots: Arc::new(Admitter::new(
                dynamodb.clone(),
                sqs.clone(),
                &config.table,
                &config.intake_queue_url,
            )),
            firings: Arc::new(ScheduleQueue::new(sqs, config.schedule_queue_url.clone())),
            jobs: Arc::new(JobStore::new(dynamodb, config.table.clone())),
            config: config.clone(),
        }
    }
}

/// The fields of a job record's image this function reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EndedJob {
    /// The job.
    pub job_id: JobId,
    /// Its tenant.
    pub owner: Owner,
    /// Its kind.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Its status now (terminal, or `paused`).
    pub status: JobStatus,
    /// Its attempt.
    #[serde(default)]
    pub attempt: u32,
    /// How many times it was resumed (which pause this is, for a pause).
    #[serde(default)]
    pub resumes: u32,
    /// When it was submitted (its waiting-list position).
    pub created_at: String,
    /// Its priority (its waiting-list position).
    #[serde(default)]
    pub priority: Priority,
    /// Its policy's concurrency limit (as stored at submit).
    #[serde(default)]
    pub policy: Option<PolicyLimit>,
    /// Set while it waited for a slot (the dispatcher removes it when it admits the job, the
    /// cancel that ends a waiting job does not): only then is it in a waiting list.
    #[serde(default)]
    pub waiting: Option<serde_json::Value>,
    /// The schedule tick that submitted it, if one did.
    #[serde(default)]
    pub scheduled: Option<ScheduledBy>,
}

/// The part of a job's stored policy this function reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PolicyLimit {
    /// Most jobs of the kind running at once.
    #[serde(default)]
    pub concurrency_limit: Option<u32>,
}

/// Reads one stream record: `Some` if it is a job record moving into a terminal status or
/// into `paused`, `None` for every other change of the table.
pub fn ended(record: &EventRecord) -> Result<Option<EndedJob>, RecordError> {
    match job_end(record)? {
        Some(ended) => Ok(Some(ended)),
        None => job_paused(record),
    }
}

/// Handles one batch of stream records, in order. Never fails: the first record whose slots
/// could not be given back is reported, so Lambda resumes the shard from it.
pub async fn handle(deps: &Deps, event: Event) -> DynamoDbEventResponse {
    for record in &event.records {
        let job = match ended(record) {
            Ok(Some(job)) => job,
            Ok(None) => continue,
            Err(err) => {
                tracing::error!(error = %err, sequence = record.change.sequence_number, "a job record on the stream cannot be read; its slots are left to the reaper's reconciliation");
                continue;
            }
        };
        let span = logs::job_span(Some(&job.job_id), Some(job.attempt), Some(&job.owner));
        let freed = async {
            if job.status == JobStatus::Paused && !still_paused(deps, &job).await? {
                tracing::info!("resumed since it paused: its slots are its run's again");
                return Ok(());
            }
            free(deps, &job).await
        };
        if let Err(err) = freed.instrument(span.clone()).await {
            span.in_scope(|| {
                tracing::error!(error = %err, "giving back the job's slots failed; the stream retries it")
            });
            return failure_at(record);
        }
    }
    DynamoDbEventResponse::default()
}

/// Whether the job a pause record is about is still in that pause: a resume dispatches it
/// again at once, and its new run may wait in the lists the pause would leave. (An end needs
/// no such read: nothing follows it.) The read and the writes after it are not one step, so
/// the slots themselves are given back on condition that the paused run still holds them
/// ([`SlotPools::give_back_run`]).
async fn still_paused(deps: &Deps, paused: &EndedJob) -> Result<bool, longhaul_aws::AwsError> {
    let job = deps.jobs.job(&paused.job_id).await.map_err(|err| longhaul_aws::AwsError {
        context: format!("read job {}", paused.job_id),
        detail: err.to_string(),
        refusal: None,
    })?;
    Ok(job.is_some_and(|job| job.status == JobStatus::Paused && job.resumes == paused.resumes))
}

/// Gives back `job`'s slots, takes it out of the waiting lists, and wakes who waits.
pub async fn free(deps: &Deps, job: &EndedJob) -> Result<(), longhaul_aws::AwsError> {
    let pools = pools_of(
        &job.owner,
        &job.job_type,
        job.policy.as_ref().and_then(|p| p.concurrency_limit),
        deps.config.tenant_max_running,
    );
    let position = waiting_sort_key(job.priority, &job.created_at, &job.job_id);
    for (pool, limit) in &pools {
        // Only a job that ended (a cancel) or was paused while it waited is in a list: every
        // other end would pay a delete of nothing.
        if job.waiting.is_some() {
            deps.slots.leave_waiting(pool, &job.owner, &position).await?;
        }
        let held = if job.status == JobStatus::Paused {
            // Only the paused run's slot: a resume may have dispatched the job again since
            // `still_paused` read it, and its next run's slot is not this pause's to free.
            match deps.slots.give_back_run(pool, &job.job_id, job.resumes).await? {
                Some(held) => held,
                None => {
                    tracing::info!(pool = ?pool, "resumed since it paused: the slot is its next run's");
                    continue;
                }
            }
        } else {
            deps.slots.give_back(pool, std::slice::from_ref(&job.job_id)).await?
        };
        deps.slots.admit_marked(pool, *limit, &held).await?;
    }
    tracing::info!(status = %job.status, pools = pools.len(), "the job's slots are given back");
    if let Some(scheduled) = job.scheduled.as_ref().filter(|_| job.status.is_terminal()) {
        // Its schedule may hold a tick until it ends, or pause because it failed.
        let firing = ScheduleFiring {
            owner: job.owner.to_string(),
            schedule_id: scheduled.schedule_id.to_string(),
            scheduled_at: scheduled.scheduled_at.to_string(),
            kind: FiringKind::Ended,
            job_id: Some(job.job_id.clone()),
            status: Some(job.status),
        };
        deps.firings.send_firing(&firing).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
