//! The reminders: a `job.result_expiring` event to the owner's endpoints subscribed to it,
//! once, when a succeeded job's result has at most [`RESULT_EXPIRING_LEAD`] left.
//!
//! Each run reads, shard by shard, the `succeeded` entries (sorted by when their result
//! expires) from where the previous run's reminders stopped up to `now` + the lead, and saves
//! where it stopped (`reminder#<shard>`) — after every page, so a run that dies re-reminds at
//! most one page (receivers deduplicate on the stable `webhook-id`). An entry is read once in
//! all, so a result whose expiry is already behind the saved position when the job succeeds —
//! one kept for less than the lead plus a run's interval — gets no reminder; its kind's
//! retention is in the docs' table of kinds. An owner's endpoints are read once per run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use longhaul_aws::endpoint_events::{EndpointCache, JobEvent, fan_out};
use longhaul_aws::jobs::{STATUS_SHARDS, sweep_name};
use longhaul_aws::ports::{IndexEntry, SweepCursor};
use longhaul_aws::queue::WebhookMessage;
use longhaul_domain::endpoints::{EndpointEvent, RESULT_EXPIRING_LEAD};
use longhaul_domain::{JobStatus, Timestamp, format_rfc3339};
use serde::Serialize;

use crate::{Deps, ExpirerError};

/// Owners whose endpoints one run keeps (beyond it, it reads them again).
const CACHED_OWNERS: usize = 10_000;

/// The name under which the reminders of `shard` keep their position.
fn cursor_name(shard: u32) -> String {
    sweep_name("reminder", shard)
}

/// What one run's reminders did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Reminders {
    /// Results whose reminder was looked at (entries read).
    pub looked_at: u32,
    /// Reminders queued (one per subscribed, enabled endpoint).
    pub queued: u32,
    /// Reminders recorded `failed` for a disabled endpoint.
    pub skipped: u32,
    /// Entries that could not be read (logged): the position moves past them — unless one is
    /// the last of its shard and has no job key to move past (the index holds none such: only
    /// job records enter the `succeeded` buckets), which is then read again by the next run.
    pub errors: u32,
}

impl Reminders {
    fn add(&mut self, other: Reminders) {
        self.looked_at += other.looked_at;
        self.queued += other.queued;
        self.skipped += other.skipped;
        self.errors += other.errors;
    }
}

/// Sends the reminders due at `now`, until `stop`.
pub async fn remind(
    deps: &Deps,
    now: DateTime<Utc>,
    stop: Instant,
) -> Result<Reminders, ExpirerError> {
    let cursors = deps.jobs.sweep_cursors().await.map_err(|e| ExpirerError(e.to_string()))?;
    let lead = chrono::Duration::from_std(RESULT_EXPIRING_LEAD).expect("a day fits");
    let horizon = format_rfc3339(now + lead);
    let cache = Arc::new(EndpointCache::new(Duration::from_secs(3600), CACHED_OWNERS));
    let shards = (0..STATUS_SHARDS).map(|shard| {
        let start = cursors.get(&cursor_name(shard)).cloned();
        remind_shard(deps, &cache, shard, start, &horizon, now, stop)
    });
    let mut report = Reminders::default();
    let mut failed = None;
    for (shard_report, error) in futures::future::join_all(shards).await {
        report.add(shard_report);
        failed = failed.or(error);
    }
    match failed {
        Some(err) => Err(err),
        None => Ok(report),
    }
}

async fn remind_shard(
    deps: &Deps,
    cache: &EndpointCache,
    shard: u32,
    mut start: Option<SweepCursor>,
    horizon: &str,
    now: DateTime<Utc>,
    stop: Instant,
) -> (Reminders, Option<ExpirerError>) {
    let bucket = JobStatus::Succeeded.as_str();
    let mut report = Reminders::default();
    while deps.clock.instant() < stop {
        let page =
            match deps.jobs.due_page(bucket, shard, horizon, deps.config.page, start.clone()).await
            {
                Ok(page) => page,
                Err(err) => return (report, Some(ExpirerError(err.to_string()))),
            };
        let last = page
            .entries
            .iter()
            .rev()
            .find_map(|e| e.as_ref().ok())
            .map(|e| e.cursor_after(bucket, shard));
        let outcomes: Vec<Result<Reminders, ExpirerError>> = futures::stream::iter(page.entries)
            .map(|entry| remind_entry(deps, cache, entry, now))
            .buffer_unordered(crate::IN_FLIGHT)
            .collect()
            .await;
        let mut failed = None;
        for outcome in outcomes {
            match outcome {
                Ok(outcome) => report.add(outcome),
                Err(err) => failed = failed.or(Some(err)),
            }
        }
        if let Some(err) = failed {
            // The position stays before this page: the next run reminds of it again (the
            // reminders that went out go out twice, with the same `webhook-id`).
            return (report, Some(err));
        }
        let done = page.next.is_none();
        let position = page.next.or(last);
        if position.is_some() && position != start {
            if let Err(err) =
                deps.jobs.save_sweep_cursor(&cursor_name(shard), position.clone()).await
            {
                return (report, Some(ExpirerError(err.to_string())));
            }
            start = position;
        }
        if done {
            break;
        }
    }
    (report, None)
}

/// The reminder of one entry's job to its owner's endpoints. An entry that cannot be read is
/// counted and logged and passed over (no run would read it better); a call that failed is
/// the error, and the page is tried again by the next run.
async fn remind_entry(
    deps: &Deps,
    cache: &EndpointCache,
    entry: Result<IndexEntry, longhaul_aws::jobs::StoreError>,
    now: DateTime<Utc>,
) -> Result<Reminders, ExpirerError> {
    let mut report = Reminders { looked_at: 1, ..Reminders::default() };
    let unreadable = |err: String| {
        tracing::error!(error = %err, "a succeeded job's index entry cannot be read; no reminder");
        Reminders { errors: 1, ..Reminders::default() }
    };
    let entry = match entry {
        Ok(entry) => entry,
        Err(err) => return Ok(unreadable(err.to_string())),
    };
    let (job, expires_at) = match (entry.job, entry.at.parse::<Timestamp>()) {
        (Ok(job), Ok(expires_at)) => (job, expires_at),
        (Err(err), _) => return Ok(unreadable(format!("{}: {err}", entry.job_id))),
        (_, Err(err)) => return Ok(unreadable(format!("{}: {err}", entry.job_id))),
    };
    if expires_at.as_datetime() <= now {
        return Ok(report); // Due for expiry: the expirer's own sweep takes it.
    }
    let failed = |err: String| ExpirerError(format!("reminder of {}: {err}", entry.job_id));
    let endpoints = cache
        .endpoints(deps.endpoints.as_ref(), &job.owner, deps.clock.instant())
        .await
        .map_err(|e| failed(e.to_string()))?;
    let event = JobEvent {
        result_expires_at: Some(expires_at),
        ..JobEvent::now(
            entry.job_id.clone(),
            job.owner.clone(),
            JobStatus::Succeeded,
            EndpointEvent::JobResultExpiring,
        )
    };
    let fanout = fan_out(&endpoints, &event, now.into());
    for skipped in &fanout.skipped {
        deps.endpoints
            .record_endpoint_delivery(skipped)
            .await
            .map_err(|e| failed(e.to_string()))?;
        report.skipped += 1;
    }
    for chunk in fanout.messages.chunks(10) {
        send(deps, chunk).await.map_err(failed)?;
        report.queued += chunk.len() as u32;
    }
    Ok(report)
}

/// Queues `messages` (at most ten); an entry SQS refused is an error.
async fn send(deps: &Deps, messages: &[WebhookMessage]) -> Result<(), String> {
    let queued = deps.webhooks.send_batch(messages).await.map_err(|e| e.to_string())?;
    match queued.iter().filter(|queued| !**queued).count() {
        0 => Ok(()),
        refused => {
            Err(format!("the webhook queue refused {refused} of {} reminders", messages.len()))
        }
    }
}
