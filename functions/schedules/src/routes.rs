//! The `/schedules` routes.

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::AwsError;
use longhaul_aws::api::{Problem, json_body, json_response, principal, route_key};
use longhaul_aws::jobs::{ScheduleRecord, ScheduleWrite, StoreError};
use longhaul_aws::scheduler::{FiringKind, ScheduleFiring, Twin};
use longhaul_domain::schedules::{ScheduleId, ScheduleState};
use longhaul_domain::{Owner, Timestamp};
use serde_json::json;

use crate::spec::{self, Spec};
use crate::view::render;
use crate::{Deps, MAX_BODY_BYTES};

/// Schedules a page holds unless `limit` says otherwise.
pub const DEFAULT_PAGE: u32 = 20;
/// The most a page holds.
pub const MAX_PAGE: u32 = 100;
/// How often a change that lost a race with another change is re-read and re-applied.
const WRITE_ATTEMPTS: usize = 3;
/// Seconds a client told to slow down (`429`) waits before creating again.
const RETRY_AFTER_SECONDS: u64 = 60;
/// Longest `reason` a pause takes.
const MAX_REASON_LEN: usize = 500;

pub(crate) async fn route(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    match route_key(request).as_deref() {
        Some("POST /schedules") => create(deps, request, &owner).await,
        Some("GET /schedules") => list(deps, request, &owner).await,
        Some("GET /schedules/{id}") => {
            let record = found(deps, &owner, &path_id(request)?).await?;
            Ok(ok(&record, deps))
        }
        Some("PATCH /schedules/{id}") => {
            let patch = json_body(request, MAX_BODY_BYTES)?;
            change(deps, &owner, &path_id(request)?, Change::Patch(patch)).await
        }
        Some("DELETE /schedules/{id}") => delete(deps, &owner, &path_id(request)?).await,
        Some("POST /schedules/{id}/pause") => {
            let pause = Change::State(ScheduleState::Paused, reason(request)?);
            change(deps, &owner, &path_id(request)?, pause).await
        }
        Some("POST /schedules/{id}/resume") => {
            let resume = Change::State(ScheduleState::Enabled, None);
            change(deps, &owner, &path_id(request)?, resume).await
        }
        Some("POST /schedules/{id}/trigger") => trigger(deps, &owner, &path_id(request)?).await,
        _ => Err(Problem::not_found()),
    }
}

/// The schedule id in the path; anything else reads as an unknown schedule.
fn path_id(request: &Request) -> Result<ScheduleId, Problem> {
    request
        .path_parameters()
        .first("id")
        .and_then(|id| id.parse().ok())
        .ok_or_else(Problem::not_found)
}

fn internal(err: StoreError) -> Problem {
    tracing::error!(error = %err, "schedule store failed");
    Problem::internal()
}

fn twin_failed(id: &ScheduleId, err: AwsError) -> Problem {
    tracing::error!(schedule_id = id.as_str(), error = %err, "writing the schedule's twin failed");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "scheduler-unavailable",
        "The scheduler is unavailable",
        "The schedule could not be handed to the scheduler; repeat the request shortly.",
    )
    .header(header::RETRY_AFTER, "5")
}

/// `owner`'s schedule `id`, or `404`.
async fn found(deps: &Deps, owner: &Owner, id: &ScheduleId) -> Result<ScheduleRecord, Problem> {
    deps.store.schedule(owner, id).await.map_err(internal)?.ok_or_else(Problem::not_found)
}

fn ok(record: &ScheduleRecord, deps: &Deps) -> Response<Body> {
    no_store(json_response(StatusCode::OK, &render(record, deps.clock.now())))
}

fn no_store(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    response
}

/// `spec` written into `record` (everything but its identity and its firings).
fn apply(record: &mut ScheduleRecord, spec: Spec) {
    record.job_type = spec.job_type;
    record.params = spec.params;
    record.callback_url = spec.callback_url;
    record.priority = spec.priority;
    record.schedule = spec.schedule;
    record.timezone = spec.timezone;
    record.overlap = spec.overlap;
    record.start_at = spec.start_at;
    record.end_at = spec.end_at;
    record.pause_on_failure = spec.pause_on_failure;
    let state = if spec.paused { ScheduleState::Paused } else { ScheduleState::Enabled };
    if state != record.state {
        record.paused_reason = spec.paused.then(|| "paused by its owner".to_owned());
    }
    record.state = state;
}

async fn create(deps: &Deps, request: &Request, owner: &Owner) -> Result<Response<Body>, Problem> {
    let body = json_body(request, MAX_BODY_BYTES)?;
    let now = deps.clock.now();
    let spec = spec::check(deps, owner, body, now).await?;
    let now = Timestamp::from(now);
    let mut record = ScheduleRecord::new(
        owner.clone(),
        spec.job_type.clone(),
        spec.params.clone(),
        spec.schedule.clone(),
        spec.timezone,
        now,
    );
    apply(&mut record, spec);
    if !deps.store.create_schedule(&record, deps.max_schedules).await.map_err(internal)? {
        return Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-schedules",
            "Too many schedules",
            format!(
                "You have {} schedules, the most this deployment allows; delete one first.",
                deps.max_schedules
            ),
        )
        .with("limit", deps.max_schedules)
        .header(header::RETRY_AFTER, RETRY_AFTER_SECONDS.to_string()));
    }
    if let Err(err) = deps.twins.put_twin(&Twin::of(&record)).await {
        // No schedule without its twin: take the record back, so nothing half-made stays.
        if let Err(undo) = deps.store.delete_schedule(owner, &record.schedule_id).await {
            tracing::error!(
                schedule_id = record.schedule_id.as_str(),
                error = %undo,
                "taking back a schedule whose twin could not be written failed; the sweep repairs it"
            );
        }
        return Err(twin_failed(&record.schedule_id, err));
    }
    tracing::info!(
        schedule_id = record.schedule_id.as_str(),
        job_type = record.job_type,
        "schedule created"
    );
    let location = format!("/schedules/{}", record.schedule_id);
    let mut response =
        no_store(json_response(StatusCode::CREATED, &render(&record, now.as_datetime())));
    response.headers_mut().insert(header::LOCATION, location.parse().expect("ids are header-safe"));
    Ok(response)
}

async fn list(deps: &Deps, request: &Request, owner: &Owner) -> Result<Response<Body>, Problem> {
    let query = request.query_string_parameters();
    for (name, _) in query.iter() {
        if !matches!(name, "limit" | "cursor") {
            return Err(Problem::bad_request(format!(
                "unknown query parameter {:?}",
                name.chars().take(64).collect::<String>()
            )));
        }
    }
    let limit = match query.first("limit") {
        None => DEFAULT_PAGE,
        Some(l) => {
            l.parse::<u32>().ok().filter(|l| (1..=MAX_PAGE).contains(l)).ok_or_else(|| {
                Problem::bad_request(format!("limit must be an integer from 1 to {MAX_PAGE}"))
            })?
        }
    };
    let after =
        match query.first("cursor") {
            None => None,
            Some(cursor) => Some(cursor.parse::<ScheduleId>().map_err(|_| {
                Problem::bad_request("cursor is not a cursor this API issued to you")
            })?),
        };
    let page = deps.store.schedules(owner, limit, after.as_ref()).await.map_err(internal)?;
    let now = deps.clock.now();
    let schedules: Vec<_> = page.schedules.iter().map(|record| render(record, now)).collect();
    Ok(no_store(json_response(
        StatusCode::OK,
        &json!({"schedules": schedules, "next_cursor": page.next}),
    )))
}

/// A change of a schedule's spec or state.
enum Change {
    /// A `PATCH` (a JSON merge patch of the spec).
    Patch(serde_json::Value),
    /// Pause (with the reason) or resume.
    State(ScheduleState, Option<String>),
}

/// `change` applied to `record` (as read).
async fn changed(
    deps: &Deps,
    read: ScheduleRecord,
    change: &Change,
) -> Result<ScheduleRecord, Problem> {
    let mut record = read.clone();
    match change {
        Change::Patch(patch) => {
            let body = spec::merged(spec::as_body(&record), patch.clone())?;
            let owner = record.owner.clone();
            let spec = spec::check(deps, &owner, body, record.created_at.as_datetime()).await?;
            apply(&mut record, spec);
        }
        Change::State(state, _) if *state == record.state => {}
        Change::State(state, reason) => {
            record.state = *state;
            record.paused_reason = (*state == ScheduleState::Paused)
                .then(|| reason.clone().unwrap_or_else(|| "paused by its owner".to_owned()));
        }
    }
    if record != read {
        record.updated_at = Timestamp::from(deps.clock.now());
    }
    Ok(record)
}

/// Writes `change` to `owner`'s schedule `id` — re-reading and re-applying it when another
/// change won the race — then rewrites the twin, and answers with the schedule.
async fn change(
    deps: &Deps,
    owner: &Owner,
    id: &ScheduleId,
    change: Change,
) -> Result<Response<Body>, Problem> {
    let mut current = found(deps, owner, id).await?;
    for _ in 0..WRITE_ATTEMPTS {
        let read = current.version;
        let mut next = changed(deps, current.clone(), &change).await?;
        if next == current {
            // Nothing to change (pausing a paused schedule, a repeated patch): the record is
            // not written again, but the twin is — a repeat is how a change whose twin write
            // failed is completed.
            deps.twins.put_twin(&Twin::of(&current)).await.map_err(|e| twin_failed(id, e))?;
            return Ok(ok(&current, deps));
        }
        next.version = read + 1;
        match deps.store.replace_schedule(&next, read).await.map_err(internal)? {
            ScheduleWrite::Written => {
                deps.twins.put_twin(&Twin::of(&next)).await.map_err(|e| twin_failed(id, e))?;
                return Ok(ok(&next, deps));
            }
            ScheduleWrite::Conflict(Some(now)) => current = *now,
            ScheduleWrite::Conflict(None) => return Err(Problem::not_found()),
        }
    }
    Err(Problem::new(
        StatusCode::CONFLICT,
        "schedule-changing",
        "The schedule is being changed",
        "Other changes to this schedule kept winning; repeat the request.",
    ))
}

/// The body of `POST /schedules/{id}/pause`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default)]
    reason: Option<String>,
}

/// The optional `{"reason"}` of a pause (an empty body is none).
fn reason(request: &Request) -> Result<Option<String>, Problem> {
    if request.body().is_empty() {
        return Ok(None);
    }
    let body: PauseBody = serde_json::from_value(json_body(request, MAX_BODY_BYTES)?)
        .map_err(|e| Problem::bad_request(format!("The body must be {{\"reason\"?}}: {e}")))?;
    match body.reason {
        Some(reason) if reason.chars().count() > MAX_REASON_LEN => Err(Problem::bad_request(
            format!("reason must be a string of at most {MAX_REASON_LEN} characters"),
        )),
        reason => Ok(reason),
    }
}

async fn delete(deps: &Deps, owner: &Owner, id: &ScheduleId) -> Result<Response<Body>, Problem> {
    found(deps, owner, id).await?;
    // The record first: once it is gone no firing makes a job (a firing finds no schedule),
    // and a twin that cannot be deleted now is an orphan the hourly repair deletes.
    deps.store.delete_schedule(owner, id).await.map_err(internal)?;
    if let Err(err) = deps.twins.delete_twin(id.as_str()).await {
        tracing::error!(
            schedule_id = id.as_str(),
            error = %err,
            "deleting a deleted schedule's twin failed; the repair sweep deletes it"
        );
    }
    tracing::info!(schedule_id = id.as_str(), "schedule deleted");
    Ok(Response::builder().status(StatusCode::NO_CONTENT).body(Body::Empty).expect("a response"))
}

async fn trigger(deps: &Deps, owner: &Owner, id: &ScheduleId) -> Result<Response<Body>, Problem> {
    found(deps, owner, id).await?;
    let scheduled_at = Timestamp::from(deps.clock.now());
    let firing = ScheduleFiring {
        owner: owner.to_string(),
        schedule_id: id.to_string(),
        scheduled_at: scheduled_at.to_string(),
        kind: FiringKind::Trigger,
        job_id: None,
        status: None,
    };
    deps.firings.send_firing(&firing).await.map_err(|err| {
        tracing::error!(schedule_id = id.as_str(), error = %err, "sending a trigger failed");
        Problem::internal()
    })?;
    Ok(no_store(json_response(
        StatusCode::ACCEPTED,
        &json!({"schedule_id": id, "scheduled_at": scheduled_at, "jobs_url": format!("/jobs?schedule_id={id}")}),
    )))
}
