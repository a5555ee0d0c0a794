//! **The firing function** — the schedule queue's consumer: each firing submits the
//! schedule's job for its tick, or records why not.
//!
//! A firing is a tick of the expression (sent by the schedule's EventBridge Scheduler twin),
//! a `trigger` (the API), or the end of one of the schedule's jobs (the slots function, from
//! the table's stream). Exactly one job per tick: the job is submitted through submit's own
//! path with the tick's idempotency key, and the firing is recorded only if its tick is later
//! than the last one recorded — a firing delivered twice, or retried after its job was made,
//! finds the same job and records nothing twice. What a tick came to is always recorded:
//!
//! - **submitted** — the job's id becomes the schedule's live job;
//! - **skipped** — the schedule is paused, the tick came more than
//!   [`CATCH_UP_SECONDS`](longhaul_domain::schedules::CATCH_UP_SECONDS) late, or its live job
//!   still runs (`overlap: skip`; `buffer_one` holds one such tick and submits it when that job
//!   ends);
//! - **refused** — the submission was answered with a 4xx (a limit, a kind or params no longer
//!   accepted): the problem's detail is the reason, and `ScheduleTicksRefused` counts it.
//!
//! A failure worth retrying (a store or queue error, a 5xx from the submission) is the
//! firing's batch item failure: SQS redelivers it, and after the queue's `maxReceiveCount`
//! it goes to the schedule dead-letter queue (docs/runbook.md). A job of a
//! `pause_on_failure` schedule that failed pauses the schedule, with the reason shown.

use std::sync::Arc;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use longhaul_aws::AwsError;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{
    FireRecord, FireWrite, JobStore, ScheduleRecord, ScheduleWrite, ScheduledBy, StoreError,
};
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::ports::{ScheduleStore, ScheduleTwins};
use longhaul_aws::queue::handle_batch;
use longhaul_aws::scheduler::{FiringKind, ScheduleFiring, Scheduler, SchedulerTarget, Twin};
use longhaul_domain::schedules::{
    FireOutcome, Overlap, ScheduleId, ScheduleState, TickDecision, decide, too_late,
};
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};

/// The firing function's configuration.
#[derive(Debug, Clone)]
pub struct FireConfig {
    /// `TABLE_NAME`.
    pub table: String,
    /// Where twins live (a `pause_on_failure` pause disables its twin).
    pub target: SchedulerTarget,
    /// What a submission needs (submit's own configuration).
    pub submit: submit::Config,
}

impl FireConfig {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(FireConfig {
            table: vars.required("TABLE_NAME")?,
            target: SchedulerTarget::from_vars(vars)?,
            submit: submit::Config::from_vars(vars)?,
        })
    }
}

/// What the firing function needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct FireDeps {
    /// The schedules' records.
    pub store: Arc<dyn ScheduleStore>,
    /// Their twins.
    pub twins: Arc<dyn ScheduleTwins>,
    /// Submission, as `POST /jobs` does it (its job table also says whether a schedule's
    /// live job still runs).
    pub submit: submit::Deps,
}

impl FireDeps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the
    /// schedules' table, and the adapter a firing's job starts by.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.store.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.submit.start_adapter(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &FireConfig) -> Self {
        let store = JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone());
        FireDeps {
            store: Arc::new(store),
            twins: Arc::new(Scheduler::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_scheduler::Client::new),
                config.target.clone(),
            )),
            submit: submit::Deps::new(sdk, &config.submit),
        }
    }
}

/// Why a firing failed in a way worth retrying (or, unreadable, that no retry will change:
/// it goes to the dead-letter queue after the queue's retries, with the reason logged).
#[derive(Debug, thiserror::Error)]
pub enum FireError {
    /// The message is not a firing.
    #[error("unreadable firing: {0}")]
    Unreadable(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Scheduler failed.
    #[error(transparent)]
    Aws(#[from] AwsError),
    /// The submission failed on our side (a 5xx), or a change kept losing races.
    #[error("the firing failed: {0}")]
    Submission(String),
}

/// Handles one batch of firings; the ones that failed are its batch item failures.
pub async fn handle(deps: &FireDeps, event: SqsEvent) -> SqsBatchResponse {
    handle_batch(&event.records, |record: &SqsMessage| async move {
        let result = fire(deps, record.body.as_deref().unwrap_or_default()).await;
        if let Err(err) = &result {
            tracing::error!(
                message_id = record.message_id.as_deref().unwrap_or_default(),
                error = %err,
                "a firing failed; SQS delivers it again"
            );
        }
        result
    })
    .await
}

/// Handles one firing (the message body).
pub async fn fire(deps: &FireDeps, body: &str) -> Result<(), FireError> {
    let firing: ScheduleFiring =
        serde_json::from_str(body).map_err(|e| FireError::Unreadable(e.to_string()))?;
    let unreadable = |what: &str| FireError::Unreadable(format!("{what} of {body:.200}"));
    let owner: Owner = firing.owner.parse().map_err(|_| unreadable("the owner"))?;
    let id: ScheduleId = firing.schedule_id.parse().map_err(|_| unreadable("the schedule id"))?;
    let tick: Timestamp = firing.scheduled_at.parse().map_err(|_| unreadable("the time"))?;
    let Some(schedule) = deps.store.schedule(&owner, &id).await? else {
        tracing::info!(schedule_id = id.as_str(), "the schedule is gone; its firing does nothing");
        return Ok(());
    };
    match firing.kind {
        FiringKind::Tick | FiringKind::Trigger => {
            on_tick(deps, &schedule, tick, firing.kind == FiringKind::Trigger).await
        }
        FiringKind::Ended => {
            let (Some(job_id), Some(status)) = (firing.job_id, firing.status) else {
                return Err(unreadable("the ended job"));
            };
            on_end(deps, schedule, &job_id, status).await
        }
    }
}

/// A tick (or a trigger, which fires whatever the schedule's state).
async fn on_tick(
    deps: &FireDeps,
    schedule: &ScheduleRecord,
    tick: Timestamp,
    trigger: bool,
) -> Result<(), FireError> {
    let id = &schedule.schedule_id;
    // A tick of the expression after the ticks before it; a trigger once. (Kept apart: a
    // trigger never makes a tick delivered after it look stale, nor the other way round.)
    let recorded = if trigger {
        schedule.last_trigger == Some(tick)
    } else {
        schedule.last_tick.is_some_and(|last| last >= tick)
    };
    if recorded {
        tracing::info!(schedule_id = id.as_str(), %tick, trigger, "this firing (or a later tick) was recorded");
        return Ok(());
    }
    let skipped = |reason: String| FireRecord {
        tick,
        job_id: None,
        outcome: FireOutcome::Skipped,
        reason: Some(reason),
        hold: false,
        trigger,
    };
    let now = Timestamp::from(deps.submit.clock.now());
    let fire = if !trigger && schedule.state == ScheduleState::Paused {
        skipped("the schedule is paused".into())
    } else if let Some(reason) = (!trigger).then(|| outside_window(schedule, tick)).flatten() {
        skipped(reason)
    } else if !trigger && too_late(tick, now) {
        skipped(format!(
            "delivered {} s after its time; a tick more than {} s late is skipped",
            now.since(tick).as_secs(),
            longhaul_domain::schedules::CATCH_UP_SECONDS
        ))
    } else {
        let live = live_job(deps, schedule).await?;
        match decide(schedule.overlap, live.is_some(), schedule.held.is_some()) {
            TickDecision::Submit => {
                let (fire, made) = submit_tick(deps, schedule, tick).await?;
                return record(deps, schedule, &FireRecord { trigger, ..fire }, made).await;
            }
            TickDecision::Hold => FireRecord {
                hold: true,
                ..skipped(format!(
                    "held until job {} ends",
                    live.as_ref().map(|(id, _)| id.as_str()).unwrap_or_default()
                ))
            },
            TickDecision::Skip => skipped(match &live {
                Some((job, status)) if schedule.held.is_none() => {
                    format!("job {job} is still {status}")
                }
                Some((job, _)) => format!("a tick is already held until job {job} ends"),
                None => "skipped".into(),
            }),
        }
    };
    record(deps, schedule, &fire, false).await
}

/// The schedule's live job and its status, if it has one that has not ended — not read for
/// `overlap: allow`, which submits whatever runs (a read would be billed for nothing).
async fn live_job(
    deps: &FireDeps,
    schedule: &ScheduleRecord,
) -> Result<Option<(JobId, JobStatus)>, FireError> {
    let Some(job_id) = &schedule.live_job else { return Ok(None) };
    if schedule.overlap == Overlap::Allow {
        return Ok(None);
    }
    Ok(deps
        .submit
        .jobs
        .job(job_id)
        .await?
        .filter(|job| !job.status.is_terminal())
        .map(|job| (job.job_id, job.status)))
}

/// How often a submission whose key another delivery holds is asked again, and after how long
/// (the `Retry-After` of `request-in-flight`).
const IN_FLIGHT_RETRIES: usize = 3;
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Submits the schedule's job for `tick`: submitted, or refused with the problem's detail, and
/// whether this submission made the job (not an earlier delivery of the tick). A 5xx is an
/// error: the firing is retried.
async fn submit_tick(
    deps: &FireDeps,
    schedule: &ScheduleRecord,
    tick: Timestamp,
) -> Result<(FireRecord, bool), FireError> {
    let submission = submit::ScheduledSubmission {
        owner: schedule.owner.clone(),
        job_type: schedule.job_type.clone(),
        params: schedule.params.clone(),
        callback_url: schedule.callback_url.clone(),
        priority: schedule.priority,
        scheduled: ScheduledBy { schedule_id: schedule.schedule_id.clone(), scheduled_at: tick },
    };
    let mut submitted = submit::submit_scheduled(&deps.submit, &submission).await;
    // Another delivery of the same tick holds its key and is writing its job (a duplicate
    // delivered at the same moment): wait as `Retry-After` says and ask again, so this
    // delivery finds that job instead of waiting out the queue's visibility timeout.
    for _ in 0..IN_FLIGHT_RETRIES {
        match &submitted {
            Err(problem) if problem.slug == "request-in-flight" => {
                tokio::time::sleep(IN_FLIGHT_WAIT).await;
                submitted = submit::submit_scheduled(&deps.submit, &submission).await;
            }
            _ => break,
        }
    }
    match submitted {
        Ok(accepted) => Ok((
            FireRecord {
                tick,
                job_id: Some(accepted.job.job_id),
                outcome: FireOutcome::Submitted,
                reason: None,
                hold: false,
                trigger: false,
            },
            !accepted.replay,
        )),
        // Still in flight: that delivery records the tick; this one is retried by SQS and then
        // finds the job.
        Err(problem) if problem.slug == "request-in-flight" => {
            Err(FireError::Submission("another delivery of this tick is making its job".into()))
        }
        Err(problem) if problem.status.is_client_error() => Ok((
            FireRecord {
                tick,
                job_id: None,
                outcome: FireOutcome::Refused,
                reason: Some(format!("{}: {}", problem.title, problem.detail)),
                hold: false,
                trigger: false,
            },
            false,
        )),
        Err(problem) => {
            Err(FireError::Submission(format!("{}: {}", problem.title, problem.detail)))
        }
    }
}

/// Records `fire` and counts it (only if it was recorded: a duplicate counts nothing). A tick
/// whose record a later tick superseded — delivered out of order — is still counted if this
/// delivery made its job (`made`), so every job a schedule made is in its counts once.
async fn record(
    deps: &FireDeps,
    schedule: &ScheduleRecord,
    fire: &FireRecord,
    made: bool,
) -> Result<(), FireError> {
    let id = &schedule.schedule_id;
    match deps.store.record_fire(&schedule.owner, id, fire).await? {
        FireWrite::Recorded => count(schedule, fire),
        FireWrite::Superseded if made => {
            if deps.store.count_fire(&schedule.owner, id, fire).await? {
                count(schedule, fire);
            }
        }
        FireWrite::Superseded | FireWrite::Stale => {
            tracing::info!(schedule_id = id.as_str(), tick = %fire.tick, "this tick or a later one was recorded first");
        }
    }
    Ok(())
}

fn count(schedule: &ScheduleRecord, fire: &FireRecord) {
    let metric = match fire.outcome {
        FireOutcome::Submitted => Metric::ScheduleTicksSubmitted,
        FireOutcome::Skipped => Metric::ScheduleTicksSkipped,
        FireOutcome::Refused => Metric::ScheduleTicksRefused,
    };
    metrics::count_tick(metric, &schedule.job_type, schedule.schedule_id.as_str());
    tracing::info!(
        schedule_id = schedule.schedule_id.as_str(),
        tick = %fire.tick,
        outcome = ?fire.outcome,
        job_id = fire.job_id.as_ref().map(JobId::as_str),
        reason = fire.reason.as_deref(),
        "schedule fired"
    );
}

/// Why a tick falls outside the record's window, if it does. The record is the truth and its
/// twin a copy that can lag it (a change whose twin write failed waits for the repair sweep), so
/// a tick the twin sent before `start_at` or after `end_at` makes no job.
fn outside_window(schedule: &ScheduleRecord, tick: Timestamp) -> Option<String> {
    match (schedule.start_at, schedule.end_at) {
        (Some(start), _) if tick < start => {
            Some(format!("the tick is before the schedule's start_at ({start})"))
        }
        (_, Some(end)) if tick > end => {
            Some(format!("the tick is after the schedule's end_at ({end})"))
        }
        _ => None,
    }
}

/// One of the schedule's jobs ended: a failure pauses a `pause_on_failure` schedule, and the
/// end of its live job submits a held tick.
async fn on_end(
    deps: &FireDeps,
    mut schedule: ScheduleRecord,
    job_id: &JobId,
    status: JobStatus,
) -> Result<(), FireError> {
    if status == JobStatus::Failed {
        // A schedule whose jobs keep failing is alarmed on (ScheduleFailingAlarm).
        metrics::count_tick(
            Metric::ScheduledJobsFailed,
            &schedule.job_type,
            schedule.schedule_id.as_str(),
        );
    }
    if status == JobStatus::Failed && schedule.pause_on_failure {
        let paused_by_it = schedule.paused_by_job.as_ref() == Some(job_id);
        match schedule.state {
            ScheduleState::Enabled if paused_by_it => {
                // This end paused it once, and its owner resumed it since: delivered again,
                // it pauses nothing.
                tracing::info!(
                    job_id = job_id.as_str(),
                    "resumed since this job's failure paused it"
                );
            }
            ScheduleState::Enabled => {
                schedule = pause_after_failure(deps, schedule, job_id).await?
            }
            // Paused already — perhaps by this very end, delivered again because its twin's
            // write failed: the twin is written again (a write of the same twin is harmless).
            ScheduleState::Paused => disable_twin(&schedule, deps).await?,
        }
    }
    let Some(held) = schedule.held else { return Ok(()) };
    if schedule.live_job.as_ref() != Some(job_id) || schedule.state == ScheduleState::Paused {
        return Ok(());
    }
    let (fire, _) = submit_tick(deps, &schedule, held).await?;
    if deps.store.release_held(&schedule.owner, &schedule.schedule_id, &fire).await? {
        count(&schedule, &fire);
    }
    Ok(())
}

/// Writes the twin of `paused` (disabled) over the one there is. The firing function only
/// updates twins: a missing one (its write after a change failed) is the repair sweep's to
/// make, from the record, paused as it now is.
async fn disable_twin(paused: &ScheduleRecord, deps: &FireDeps) -> Result<(), FireError> {
    if !deps.twins.update_twin(&Twin::of(paused)).await? {
        tracing::warn!(
            schedule_id = paused.schedule_id.as_str(),
            "the paused schedule has no twin to disable; the repair sweep makes it, paused"
        );
    }
    Ok(())
}

/// Pauses `schedule` because its job `job_id` failed (re-reading it if it changed meanwhile).
async fn pause_after_failure(
    deps: &FireDeps,
    mut schedule: ScheduleRecord,
    job_id: &JobId,
) -> Result<ScheduleRecord, FireError> {
    for _ in 0..3 {
        // Paused meanwhile, or paused by this failure and resumed since (read again).
        if schedule.state == ScheduleState::Paused
            || schedule.paused_by_job.as_ref() == Some(job_id)
        {
            return Ok(schedule);
        }
        let read = schedule.version;
        let mut paused = schedule.clone();
        paused.state = ScheduleState::Paused;
        paused.paused_reason = Some(format!("job {job_id} failed (pause_on_failure)"));
        paused.paused_by_job = Some(job_id.clone());
        paused.updated_at = Timestamp::from(deps.submit.clock.now());
        paused.version = read + 1;
        match deps.store.replace_schedule(&paused, read).await? {
            ScheduleWrite::Written => {
                disable_twin(&paused, deps).await?;
                tracing::warn!(
                    schedule_id = paused.schedule_id.as_str(),
                    job_id = job_id.as_str(),
                    "schedule paused: its job failed"
                );
                return Ok(paused);
            }
            ScheduleWrite::Conflict(Some(current)) => schedule = *current,
            ScheduleWrite::Conflict(None) => return Ok(schedule),
        }
    }
    // Other changes kept winning: the firing is retried, and reads the schedule afresh.
    Err(FireError::Submission(format!(
        "pausing schedule {} after job {job_id} failed lost three races",
        schedule.schedule_id
    )))
}
