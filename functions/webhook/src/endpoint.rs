//! One event to one of an owner's webhook endpoints.
//!
//! Read before every attempt: the endpoint (deleted → the message is dropped; disabled → no
//! attempt, the delivery recorded `failed` for `recover` after `enable`) and the job (a
//! progress event is sent only while the job runs, with its progress *as it is now* — latest
//! wins; a reminder only while the result is there). Each attempt is counted against the
//! tenant's rate of endpoint attempts: over it, the message waits for the next minute without
//! using an attempt, so one tenant's flood — or its partner's outage, every attempt of which
//! may take the full timeout — takes at most its share of the function. The charge comes first,
//! before any read, so a delivery that waits costs one counter write per hop.
//!
//! After the attempt, the delivery record is overwritten with its outcome and the endpoint's
//! health follows ([`HealthChange::after_attempt`]): `410 Gone` disables it at once; an
//! unbroken run of failures as long as `disable_after` disables it too (counted by
//! `WebhookEndpointDisabled`). A failed terminal event or reminder is retried on the schedule,
//! as a callback is, and recorded `failed` when the schedule is spent; a progress event gets
//! one attempt (the next window's supersedes it).

use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord, JobRecord};
use longhaul_aws::limits::Admission;
use longhaul_aws::metrics::{self, Metric};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, HealthChange, endpoint_message_id,
};
use longhaul_domain::{JobStatus, Timestamp};
use serde_json::json;

use super::{Attempt, Deps, attempt, terminal_payload};
use longhaul_aws::endpoint_events::{DISABLED_ERROR, UNSUBSCRIBED_ERROR};
use longhaul_aws::queue::WebhookMessage;

/// Delivers (or settles without an attempt) `event` of the message's job to `endpoint_id`.
pub(crate) async fn process(
    deps: &Deps,
    message: &WebhookMessage,
    endpoint_id: &EndpointId,
    event: EndpointEvent,
) -> Result<(), String> {
    let at: Timestamp = deps.clock.now().into();
    // A delivery that cannot be made records why (a resend or recovery moved it to `pending`;
    // left there, neither could find it again). Progress is not recorded: a later one says more.
    let settle = async |reason: &str| -> Result<(), String> {
        tracing::info!(%endpoint_id, event = %event, reason, "endpoint event not sent");
        if !event.replayable() {
            return Ok(());
        }
        let unsent = EndpointDelivery::unsent(
            endpoint_id,
            &message.job_id,
            event,
            message.attempt.saturating_sub(1),
            at,
            reason,
            message.result_expires_at,
        );
        deps.endpoints.record_endpoint_delivery(&unsent).await.map_err(|e| e.to_string())
    };
    // The tenant's rate is charged before anything is read when the message names the owner
    // (every message queued since owners were carried): a delivery over the rate waits, or a
    // progress event is dropped, at the cost of one counter write, not three requests.
    let rate = if event == EndpointEvent::JobProgress { &deps.progress_rate } else { &deps.rate };
    let charged = match &message.owner {
        Some(owner) => {
            let admission = rate.charge(owner).await.map_err(|e| e.to_string())?;
            if let Admission::Limited { retry_after } = admission {
                return over_rate(deps, message, endpoint_id, event, retry_after, at).await;
            }
            true
        }
        None => false,
    };
    let (job, progress) = if event == EndpointEvent::JobProgress {
        match deps.jobs.view(&message.job_id).await.map_err(|e| e.to_string())? {
            Some(view) => (Some(view.job.clone()), view.progress),
            None => (None, None),
        }
    } else {
        (deps.jobs.job(&message.job_id).await.map_err(|e| e.to_string())?, None)
    };
    let Some(job) = job else {
        return settle("the job no longer exists").await;
    };
    longhaul_aws::logs::current_job(&job);
    let Some(endpoint) =
        deps.endpoints.endpoint(&job.owner, endpoint_id).await.map_err(|e| e.to_string())?
    else {
        // Deleted by its owner: nothing to record it on that anyone can read.
        tracing::info!(%endpoint_id, event = %event, "the endpoint was deleted; its event is dropped");
        return Ok(());
    };
    let progress_seq = progress.as_ref().map(|p| p.event_seq());
    let webhook_id = endpoint_message_id(endpoint_id, &job.job_id, event, progress_seq);
    let payload = match event {
        EndpointEvent::JobProgress => {
            if job.status != JobStatus::Running {
                tracing::info!(%endpoint_id, status = %job.status, "progress event of a job no longer running; dropped");
                return Ok(());
            }
            let shown = progress.as_ref().map_or_else(
                longhaul_domain::progress::ProgressView::unknown,
                longhaul_aws::jobs::ProgressRecord::recorded,
            );
            json!({
                "type": event.as_str(),
                "job_id": job.job_id,
                "status": job.status,
                "progress": shown,
                "timestamp": at,
            })
        }
        EndpointEvent::JobResultExpiring => {
            if job.status != JobStatus::Succeeded {
                return settle("the result is no longer there (the job is no longer succeeded)")
                    .await;
            }
            let Some(expires_at) = message.result_expires_at else {
                return settle("a reminder without the expiry it reminds of").await;
            };
            json!({
                "type": event.as_str(),
                "job_id": job.job_id,
                "status": job.status,
                "result_url": format!("/jobs/{}/result", job.job_id),
                "expires_at": expires_at,
                "timestamp": at,
            })
        }
        _ => terminal_payload(&job, message.status, at),
    };
    let record = |status, attempt: &Attempt| EndpointDelivery {
        webhook_id: webhook_id.clone(),
        endpoint_id: endpoint_id.clone(),
        job_id: job.job_id.clone(),
        event,
        status,
        attempts: message.attempt,
        created_at: at,
        last_attempt_at: Some(at),
        status_code: attempt.status_code,
        latency_ms: Some(attempt.latency_ms),
        error: attempt.error.clone(),
        progress_seq,
        result_expires_at: message.result_expires_at,
    };
    if !endpoint.enabled() {
        return settle(DISABLED_ERROR).await;
    }
    // The endpoint is read before every attempt, so a change of its events reaches the
    // deliveries already queued or retrying as well as the events to come.
    if !endpoint.spec.receives(event) {
        return settle(UNSUBSCRIBED_ERROR).await;
    }
    // A message without its owner is charged once the job says whose it is.
    if !charged
        && let Admission::Limited { retry_after } =
            rate.charge(&job.owner).await.map_err(|e| e.to_string())?
    {
        return over_rate(deps, message, endpoint_id, event, retry_after, at).await;
    }

    let tried = attempt(deps, &job.owner, &endpoint.spec.url, &webhook_id, &payload).await?;
    let change = HealthChange::after_attempt(
        endpoint.failing_since,
        tried.status_code,
        at,
        deps.config.disable_after,
    );
    let delivered = matches!(tried.status_code, Some(200..=299));
    // No retry after a 410, for progress (the next window supersedes it), or to an endpoint
    // this attempt disabled.
    let next_delay =
        (event.replayable() && !delivered && !matches!(change, HealthChange::Disable(_)))
            .then(|| deps.config.schedule.delay_before(message.attempt + 1))
            .flatten();
    let status = match (delivered, next_delay) {
        (true, _) => DeliveryStatus::Delivered,
        (false, Some(_)) => DeliveryStatus::Pending,
        (false, None) => DeliveryStatus::Failed,
    };
    deps.endpoints
        .record_endpoint_delivery(&record(status, &tried))
        .await
        .map_err(|e| e.to_string())?;
    // Neither the URL nor the request error (which names it) is logged: a partner's URL may
    // carry a token. The delivery record keeps them for the owner.
    tracing::info!(
        %endpoint_id,
        webhook_id,
        delivery_attempt = message.attempt,
        status_code = tried.status_code,
        latency_ms = tried.latency_ms,
        status = status.as_str(),
        "endpoint attempt made"
    );
    health(deps, &job, &endpoint, change, at).await?;
    match (status, next_delay) {
        (DeliveryStatus::Delivered, _) => metrics::count(Metric::WebhookDelivered, &job),
        (DeliveryStatus::Pending, Some(delay)) => {
            let next = WebhookMessage {
                attempt: message.attempt + 1,
                not_before: at.as_datetime().timestamp() + delay as i64,
                ..message.clone()
            };
            deps.queue.send(&next, delay).await.map_err(|e| e.to_string())?;
        }
        _ if event.replayable() => {
            metrics::count(Metric::WebhookFailed, &job);
            tracing::warn!(%endpoint_id, webhook_id, "endpoint delivery failed for good; `recover` can queue it again");
        }
        _ => {}
    }
    Ok(())
}

/// A delivery over its tenant's rate. Progress is counted apart (its own counter) and never
/// waits: it is dropped, superseded by the next, so it can never hold up a terminal event.
/// Any other event waits for the next minute without using an attempt.
async fn over_rate(
    deps: &Deps,
    message: &WebhookMessage,
    endpoint_id: &EndpointId,
    event: EndpointEvent,
    retry_after: u64,
    at: Timestamp,
) -> Result<(), String> {
    if event == EndpointEvent::JobProgress {
        tracing::info!(%endpoint_id, "the tenant's progress events are at their rate; dropped");
        return Ok(());
    }
    // Spread over the next seconds, not all at the minute's turn.
    let wait =
        retry_after.clamp(1, 60) + u64::from(at.as_datetime().timestamp_subsec_millis() % 10);
    let later = WebhookMessage {
        not_before: at.as_datetime().timestamp() + wait as i64,
        ..message.clone()
    };
    tracing::info!(%endpoint_id, event = %event, wait, "the tenant's endpoint attempts are at their rate; the delivery waits");
    deps.queue.send(&later, wait).await.map_err(|e| e.to_string())
}

/// Records `change`, what an attempt at `at` says of the endpoint's health, as the attempt
/// read it: a disablement for failing holds only if the run of failures it read still stands
/// (another attempt's success, or the owner's enable, may have ended it during this one).
async fn health(
    deps: &Deps,
    job: &JobRecord,
    endpoint: &EndpointRecord,
    change: HealthChange,
    at: Timestamp,
) -> Result<(), String> {
    let endpoint_id = &endpoint.endpoint_id;
    let result = match change {
        HealthChange::Unchanged => Ok(()),
        HealthChange::Recovered => deps.endpoints.mark_recovered(&job.owner, endpoint_id).await,
        HealthChange::StartedFailing => {
            deps.endpoints.mark_failing(&job.owner, endpoint_id, at).await
        }
        HealthChange::Disable(reason) => {
            let failing_since = match reason {
                DisabledReason::Failing => endpoint.failing_since,
                DisabledReason::Gone => None,
            };
            match deps
                .endpoints
                .disable_endpoint(&job.owner, endpoint_id, reason, failing_since, at)
                .await
            {
                Ok(true) => {
                    metrics::count(Metric::WebhookEndpointDisabled, job);
                    tracing::warn!(%endpoint_id, reason = reason.as_str(), "webhook endpoint disabled");
                    Ok(())
                }
                Ok(false) => Ok(()),
                Err(err) => Err(err),
            }
        }
    };
    result.map_err(|e| e.to_string())
}
