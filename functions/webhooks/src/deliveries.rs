//! An endpoint's deliveries: `GET /webhooks/endpoints/{endpoint_id}/deliveries` (a page,
//! newest job first), `POST /webhooks/deliveries/{webhook_id}/resend` (one delivery again)
//! and `POST /webhooks/endpoints/{endpoint_id}/recover` (every failed one since a time).
//!
//! A delivery is queued again with its own `webhook-id`, so a receiver that already had it
//! deduplicates it. A delivery is moved to `pending` before it is queued, by a conditional
//! write ([`EndpointDeliveries::requeue_delivery`](longhaul_aws::ports::EndpointDeliveries)):
//! of two resends or recoveries at once, one queues it. Recovery moves `failed` ones; a resend
//! also a `delivered` one — a receiver that lost what it was sent may ask again — so that a
//! delivery has at most one copy queued however often it is resent; a `pending` one is queued
//! already (`409`), unless it went untouched longer than the deliverer ever waits between
//! attempts (its message was lost: a resend takes it). Progress events are never resent (`409`): the next one, or the job's view,
//! says more. Nothing is queued for a disabled endpoint (`409`): enable it first.
//!
//! If the queue refuses a delivery this call moved to `pending`, the delivery is written back
//! as it was read (`failed` or `delivered`), so a later resend or recovery finds it; if even that write
//! fails it stays `pending` with no message coming — logged with its ids as an error, for an
//! operator — and neither resend nor recover will pick it up.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::api::{Problem, json_body, json_response};
use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord, ListError, MAX_DELIVERY_PAGE};
use longhaul_aws::queue::WebhookMessage;
use longhaul_domain::endpoints::{DeliveryStatus, EndpointEvent, parse_endpoint_message_id};
use longhaul_domain::{Owner, Timestamp};
use serde::Deserialize;
use serde_json::json;

use crate::endpoints::{endpoint_disabled, found, path_id};
use crate::{Deps, MAX_BODY_BYTES, internal, no_store, view};

/// Deliveries a page holds unless `limit` says otherwise.
pub const DEFAULT_PAGE: u32 = 20;
/// Pages of failed deliveries one recovery reads at most; call again with its `cursor`.
pub const RECOVER_PAGES: usize = 10;
/// Longest cursor accepted, checked before it is decoded (ours are about 90 bytes).
const MAX_CURSOR_LEN: usize = 256;
/// Messages one queue call takes (SQS's batch size).
const BATCH: usize = 10;
/// Seconds a client told that the queue is unavailable waits before repeating.
const RETRY_AFTER_SECONDS: &str = "5";

/// The opaque form of a page position (base64url, so it needs no escaping in a query).
fn encode_cursor(next: &str) -> String {
    URL_SAFE_NO_PAD.encode(next)
}

/// The page position a cursor holds; whether the store gave it is the store's to say.
fn decode_cursor(cursor: &str) -> Result<String, Problem> {
    let refused = || Problem::bad_request("cursor is not a cursor this API issued");
    if cursor.is_empty() || cursor.len() > MAX_CURSOR_LEN {
        return Err(refused());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| refused())?;
    String::from_utf8(bytes).map_err(|_| refused())
}

/// A page of `endpoint`'s deliveries; a cursor the store did not give is a `400`.
async fn page(
    deps: &Deps,
    endpoint: &EndpointRecord,
    status: Option<DeliveryStatus>,
    limit: u32,
    after: Option<&str>,
) -> Result<longhaul_aws::jobs::DeliveryPage, Problem> {
    deps.deliveries.endpoint_deliveries(&endpoint.endpoint_id, status, limit, after).await.map_err(
        |err| match err {
            ListError::InvalidCursor => {
                Problem::bad_request("cursor is not a cursor this API issued")
            }
            ListError::Store(err) => internal("listing deliveries")(err),
        },
    )
}

/// `GET /webhooks/endpoints/{endpoint_id}/deliveries`.
pub(crate) async fn list(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let id = path_id(request)?;
    let query = request.query_string_parameters();
    if let Some((name, _)) =
        query.iter().find(|(name, _)| !matches!(*name, "status" | "limit" | "cursor"))
    {
        return Err(Problem::bad_request(format!(
            "unknown query parameter {:?}: the parameters are status, limit and cursor",
            name.chars().take(64).collect::<String>()
        )));
    }
    let status = query
        .first("status")
        .map(|s| s.parse::<DeliveryStatus>())
        .transpose()
        .map_err(|_| Problem::bad_request("status must be pending, delivered or failed"))?;
    let limit = match query.first("limit") {
        None => DEFAULT_PAGE,
        Some(l) => {
            l.parse::<u32>().ok().filter(|l| (1..=MAX_DELIVERY_PAGE).contains(l)).ok_or_else(
                || {
                    Problem::bad_request(format!(
                        "limit must be an integer from 1 to {MAX_DELIVERY_PAGE}"
                    ))
                },
            )?
        }
    };
    let after = query.first("cursor").map(decode_cursor).transpose()?;
    let endpoint = found(deps, owner, &id).await?;
    let page = page(deps, &endpoint, status, limit, after.as_deref()).await?;
    let deliveries: Vec<_> = page.deliveries.iter().map(view::delivery).collect();
    let mut body = json!({ "deliveries": deliveries });
    if let Some(next) = &page.next {
        body["next_cursor"] = json!(encode_cursor(next));
    }
    Ok(no_store(json_response(StatusCode::OK, &body)))
}

/// The first attempt of `delivery` again, at once (a reminder with the expiry it reminds of);
/// `None` for an event never queued again.
fn message(delivery: &EndpointDelivery, owner: &Owner) -> Option<WebhookMessage> {
    let status = delivery.event.job_status().filter(|_| delivery.event.replayable())?;
    Some(WebhookMessage {
        result_expires_at: delivery.result_expires_at,
        ..WebhookMessage::to_endpoint(
            delivery.job_id.clone(),
            status,
            delivery.endpoint_id.clone(),
            delivery.event,
            0,
        )
        .of(owner)
    })
}

/// `409 not-replayable`, saying why (`detail`).
fn not_replayable(detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::CONFLICT, "not-replayable", "This event is not sent again", detail)
}

fn not_subscribed(event: EndpointEvent) -> Problem {
    not_replayable(format!(
        "The endpoint no longer subscribes to {event}: add it to the endpoint's events to resend it."
    ))
}

fn already_pending(delivery: &EndpointDelivery) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "delivery-pending",
        "The delivery is queued already",
        "The delivery is pending: it is queued, or being retried, already.",
    )
    .with("webhook_id", &delivery.webhook_id)
}

fn queue_unavailable(detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "queue-unavailable",
        "The webhook queue is unavailable",
        detail,
    )
    .header(header::RETRY_AFTER, RETRY_AFTER_SECONDS)
}

/// Writes back the deliveries this call moved to `pending` but could not queue, as they were
/// read (`failed`, or `delivered` for a resend), so a later resend or recovery finds them. One whose write fails stays
/// `pending` with nothing queued: logged, for an operator.
async fn restore(deps: &Deps, unqueued: &[&EndpointDelivery]) {
    for delivery in unqueued {
        if let Err(err) = deps.deliveries.record_endpoint_delivery(delivery).await {
            tracing::error!(
                endpoint_id = delivery.endpoint_id.as_str(),
                job_id = delivery.job_id.as_str(),
                webhook_id = delivery.webhook_id,
                error = %err,
                "a delivery moved to pending could not be queued nor written back as it was: \
                 it stays pending and nothing will send it"
            );
        }
    }
}

/// `POST /webhooks/deliveries/{webhook_id}/resend`.
pub(crate) async fn resend(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let (endpoint_id, job_id, event) = request
        .path_parameters()
        .first("webhook_id")
        .and_then(parse_endpoint_message_id)
        .ok_or_else(Problem::not_found)?;
    let endpoint = found(deps, owner, &endpoint_id).await?;
    let delivery = deps
        .deliveries
        .endpoint_delivery(&endpoint_id, &job_id, event)
        .await
        .map_err(internal("reading a delivery"))?
        .ok_or_else(Problem::not_found)?;
    let message = message(&delivery, owner).ok_or_else(|| {
        not_replayable(
            "Progress events are not resent: the next one, or GET /jobs/{id}, says more.",
        )
    })?;
    if !endpoint.enabled() {
        return Err(endpoint_disabled(&endpoint));
    }
    if !endpoint.spec.receives(event) {
        return Err(not_subscribed(event));
    }
    // A failed or delivered delivery is moved to pending before it is queued, so one copy at
    // most is in flight: a second resend meanwhile is refused, and repeating resends cannot
    // grow the webhook queue. A pending one is in flight — unless nothing was recorded,
    // attempted or queued for longer than the deliverer ever waits between attempts: its
    // message was lost (dead-lettered after the deliverer failed to record it), and a resend
    // takes it.
    let now = deps.clock.now();
    let lost_after = chrono::Duration::from_std(deps.lost_after).unwrap_or(chrono::Duration::MAX);
    // An absurd `lost_after` (beyond the calendar) makes nothing look lost, never a panic.
    let quiet_since =
        now.checked_sub_signed(lost_after).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let (now, quiet_since) = (Timestamp::from(now), Timestamp::from(quiet_since));
    let lost = delivery.status == DeliveryStatus::Pending
        && delivery.created_at < quiet_since
        && delivery.last_attempt_at.is_none_or(|at| at < quiet_since);
    if delivery.status == DeliveryStatus::Pending && !lost {
        return Err(already_pending(&delivery));
    }
    let moved = deps
        .deliveries
        .requeue_delivery(&endpoint_id, &job_id, event, delivery.status, now, quiet_since)
        .await
        .map_err(internal("requeueing a delivery"))?;
    if !moved {
        // Another resend or recovery queued it (or an attempt changed it) between the read
        // and this write.
        return Err(already_pending(&delivery));
    }
    if let Err(err) = deps.queue.send(&message, 0).await {
        tracing::error!(
            endpoint_id = endpoint_id.as_str(),
            job_id = job_id.as_str(),
            webhook_id = delivery.webhook_id,
            error = %err,
            "queueing a resent delivery failed"
        );
        restore(deps, &[&delivery]).await;
        return Err(queue_unavailable(
            "The delivery could not be queued; nothing was sent. Repeat the request shortly.",
        ));
    }
    tracing::info!(
        endpoint_id = endpoint_id.as_str(),
        job_id = job_id.as_str(),
        webhook_id = delivery.webhook_id,
        was = delivery.status.as_str(),
        "delivery resent"
    );
    Ok(no_store(json_response(
        StatusCode::ACCEPTED,
        &json!({"webhook_id": delivery.webhook_id, "status": DeliveryStatus::Pending}),
    )))
}

/// The body of a recovery.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecoverBody {
    since: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
}

/// `since` of a recovery at `now`: an RFC 3339 time, not in the future, and within the
/// record retention (older deliveries are no longer kept).
fn since(deps: &Deps, text: Option<&str>, now: Timestamp) -> Result<Timestamp, Problem> {
    let text =
        text.ok_or_else(|| Problem::bad_request("`since` (an RFC 3339 time) is required"))?;
    let since: Timestamp = text
        .parse()
        .map_err(|_| Problem::bad_request("`since` must be an RFC 3339 time with an offset"))?;
    if since > now {
        return Err(Problem::bad_request("`since` is in the future"));
    }
    let retention =
        chrono::Duration::from_std(deps.record_retention.0).unwrap_or(chrono::Duration::MAX);
    let oldest = now.as_datetime().checked_sub_signed(retention).map(Timestamp::from);
    if oldest.is_some_and(|oldest| since < oldest) {
        return Err(Problem::bad_request(format!(
            "`since` is older than the record retention ({} s): deliveries before then are no \
             longer kept",
            deps.record_retention.0.as_secs()
        )));
    }
    Ok(since)
}

/// Queues every failed delivery of `endpoint` made at or after `since` again — at most
/// [`RECOVER_PAGES`] pages of [`MAX_DELIVERY_PAGE`] per call, from `cursor` on — and says how
/// many, whether the walk is complete, and where the next call goes on from.
pub(crate) async fn recover(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let id = path_id(request)?;
    let body: RecoverBody =
        serde_json::from_value(json_body(request, MAX_BODY_BYTES)?).map_err(|e| {
            Problem::bad_request(format!("The body must be {{\"since\", \"cursor\"?}}: {e}"))
        })?;
    let since = since(deps, body.since.as_deref(), Timestamp::from(deps.clock.now()))?;
    let mut after = body.cursor.as_deref().map(decode_cursor).transpose()?;
    let endpoint = found(deps, owner, &id).await?;
    if !endpoint.enabled() {
        return Err(endpoint_disabled(&endpoint));
    }
    let mut requeued = 0usize;
    let mut complete = false;
    for _ in 0..RECOVER_PAGES {
        let page = page(
            deps,
            &endpoint,
            Some(DeliveryStatus::Failed),
            MAX_DELIVERY_PAGE,
            after.as_deref(),
        )
        .await?;
        let due: Vec<&EndpointDelivery> = page
            .deliveries
            .iter()
            .filter(|d| {
                d.status == DeliveryStatus::Failed
                    && d.event.replayable()
                    && endpoint.spec.receives(d.event)
                    && d.created_at >= since
            })
            .collect();
        for batch in due.chunks(BATCH) {
            requeued += requeue(deps, owner, batch, requeued).await?;
        }
        after = page.next;
        if after.is_none() {
            complete = true;
            break;
        }
    }
    tracing::info!(endpoint_id = id.as_str(), requeued, complete, "deliveries recovered");
    let mut body = json!({ "requeued": requeued, "complete": complete });
    if let Some(next) = after.as_deref().filter(|_| !complete) {
        body["cursor"] = json!(encode_cursor(next));
    }
    Ok(no_store(json_response(StatusCode::ACCEPTED, &body)))
}

/// Moves each of `batch` (at most [`BATCH`]) from `failed` to `pending` and queues those it
/// moved (one a concurrent resend or recovery moved first is theirs); how many were queued.
/// When the queue refuses some, they are written back `failed` and the answer is a `503`
/// naming the `before` + queued deliveries this recovery queued; when the table fails, those
/// moved are still queued and the answer is a `500` (a repeat skips what is now pending).
async fn requeue(
    deps: &Deps,
    owner: &Owner,
    batch: &[&EndpointDelivery],
    before: usize,
) -> Result<usize, Problem> {
    let moves = futures::future::join_all(batch.iter().map(|d| {
        let now = Timestamp::from(deps.clock.now());
        deps.deliveries.requeue_delivery(
            &d.endpoint_id,
            &d.job_id,
            d.event,
            DeliveryStatus::Failed,
            now,
            now,
        )
    }))
    .await;
    let mut moved: Vec<(&EndpointDelivery, WebhookMessage)> = Vec::new();
    let mut failure = None;
    for (delivery, result) in batch.iter().zip(moves) {
        match result {
            Ok(true) => moved.extend(message(delivery, owner).map(|m| (*delivery, m))),
            Ok(false) => {}
            Err(err) => failure = Some(err),
        }
    }
    let messages: Vec<WebhookMessage> = moved.iter().map(|(_, m)| m.clone()).collect();
    let accepted = if messages.is_empty() {
        Vec::new()
    } else {
        deps.queue.send_batch(&messages).await.unwrap_or_else(|err| {
            tracing::error!(error = %err, "queueing recovered deliveries failed");
            Vec::new()
        })
    };
    let mut queued = 0;
    let mut unqueued = Vec::new();
    for (i, (delivery, _)) in moved.iter().enumerate() {
        if accepted.get(i).copied().unwrap_or(false) {
            queued += 1;
        } else {
            tracing::error!(
                webhook_id = delivery.webhook_id,
                "a recovered delivery was not queued"
            );
            unqueued.push(*delivery);
        }
    }
    if !unqueued.is_empty() {
        restore(deps, &unqueued).await;
        let total = before + queued;
        return Err(queue_unavailable(format!(
            "The webhook queue could not be reached: {total} deliveries were queued before it \
             failed, the rest were not. Repeat the request shortly."
        ))
        .with("requeued", total));
    }
    match failure {
        Some(err) => Err(internal("moving a failed delivery back to pending")(err)),
        None => Ok(queued),
    }
}
