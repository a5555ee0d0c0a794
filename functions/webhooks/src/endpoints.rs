//! The endpoint routes: `POST /webhooks/endpoints` (201), `GET /webhooks/endpoints`,
//! `GET|PATCH|DELETE /webhooks/endpoints/{endpoint_id}` and
//! `POST /webhooks/endpoints/{endpoint_id}/enable`.
//!
//! An endpoint's URL follows a job's `callback_url`'s rules ([`EndpointSpec::parse`]) and its
//! host is resolved when it is created or changed, every address public
//! ([`longhaul_aws::callbacks::check_host`]); the deliverer checks again at every attempt.

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::api::{Problem, json_body, json_response};
use longhaul_aws::callbacks::check_host;
use longhaul_aws::jobs::EndpointRecord;
use longhaul_domain::callback::parse_callback_url;
use longhaul_domain::endpoints::{EndpointId, EndpointSpec, InvalidEndpoint};
use longhaul_domain::{Owner, Timestamp};
use serde_json::json;

use crate::{Deps, MAX_BODY_BYTES, internal, no_store, view};

/// How often a change that lost a race with another change is re-read and re-applied.
const WRITE_ATTEMPTS: usize = 3;

/// The endpoint id in the path; anything else reads as an unknown endpoint.
pub(crate) fn path_id(request: &Request) -> Result<EndpointId, Problem> {
    request
        .path_parameters()
        .first("endpoint_id")
        .and_then(|id| id.parse().ok())
        .ok_or_else(Problem::not_found)
}

/// `owner`'s endpoint `id`, or `404`.
pub(crate) async fn found(
    deps: &Deps,
    owner: &Owner,
    id: &EndpointId,
) -> Result<EndpointRecord, Problem> {
    deps.endpoints
        .endpoint(owner, id)
        .await
        .map_err(internal("reading an endpoint"))?
        .ok_or_else(Problem::not_found)
}

/// 409: nothing is delivered to a disabled endpoint, so nothing is queued for it.
pub(crate) fn endpoint_disabled(record: &EndpointRecord) -> Problem {
    let reason = record.disabled_reason.map(|r| r.as_str()).unwrap_or("unknown");
    Problem::new(
        StatusCode::CONFLICT,
        "endpoint-disabled",
        "The endpoint is disabled",
        format!(
            "The endpoint is disabled ({reason}), so nothing is sent to it; enable it first \
             (POST /webhooks/endpoints/{}/enable).",
            record.endpoint_id
        ),
    )
    .with("disabled_reason", record.disabled_reason)
}

/// 422: the spec is not acceptable.
fn invalid(detail: impl Into<String>) -> Problem {
    Problem::unprocessable("invalid-endpoint", "Invalid endpoint", detail)
}

fn invalid_spec(err: InvalidEndpoint) -> Problem {
    invalid(err.0)
}

/// Resolves `url`'s host now: it must resolve, and only to public addresses (loopback too on
/// the local stack).
async fn check_url(deps: &Deps, url: &str) -> Result<(), Problem> {
    let parsed =
        parse_callback_url(url, &deps.callbacks).map_err(|e| invalid(format!("`url`: {e}")))?;
    check_host(&parsed, &deps.callbacks).await.map_err(|e| invalid(format!("`url`: the host {e}.")))
}

fn ok(record: &EndpointRecord) -> Response<Body> {
    no_store(json_response(StatusCode::OK, &view::endpoint(record)))
}

/// `POST /webhooks/endpoints`.
pub(crate) async fn create(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let body = json_body(request, MAX_BODY_BYTES)?;
    let spec = EndpointSpec::parse(&body, &deps.callbacks).map_err(invalid_spec)?;
    check_url(deps, &spec.url).await?;
    let record = EndpointRecord::new(owner.clone(), spec, Timestamp::from(deps.clock.now()));
    let created = deps
        .endpoints
        .create_endpoint(&record, deps.max_endpoints)
        .await
        .map_err(internal("creating an endpoint"))?;
    if !created {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "endpoint-limit",
            "Too many endpoints",
            format!(
                "You have {} webhook endpoints, the most this deployment allows; delete one \
                 first.",
                deps.max_endpoints
            ),
        )
        .with("limit", deps.max_endpoints));
    }
    tracing::info!(endpoint_id = record.endpoint_id.as_str(), "webhook endpoint created");
    let location = format!("/webhooks/endpoints/{}", record.endpoint_id);
    let mut response = no_store(json_response(StatusCode::CREATED, &view::endpoint(&record)));
    response.headers_mut().insert(header::LOCATION, location.parse().expect("ids are header-safe"));
    Ok(response)
}

/// `GET /webhooks/endpoints`.
pub(crate) async fn list(deps: &Deps, owner: &Owner) -> Result<Response<Body>, Problem> {
    let records = deps.endpoints.endpoints(owner).await.map_err(internal("listing endpoints"))?;
    let endpoints: Vec<_> = records.iter().map(view::endpoint).collect();
    Ok(no_store(json_response(StatusCode::OK, &json!({ "endpoints": endpoints }))))
}

/// `GET /webhooks/endpoints/{endpoint_id}`.
pub(crate) async fn get(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    Ok(ok(&found(deps, owner, &path_id(request)?).await?))
}

/// `PATCH /webhooks/endpoints/{endpoint_id}`.
pub(crate) async fn patch(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let patch = json_body(request, MAX_BODY_BYTES)?;
    change(deps, owner, &path_id(request)?, &patch).await
}

/// Applies the merge `patch` to `owner`'s endpoint `id` — re-reading and re-applying it when
/// another change won the race — and answers with the endpoint. A changed URL's host is
/// resolved (once per request) before anything is written.
async fn change(
    deps: &Deps,
    owner: &Owner,
    id: &EndpointId,
    patch: &serde_json::Value,
) -> Result<Response<Body>, Problem> {
    let mut current = found(deps, owner, id).await?;
    let mut checked: Option<String> = None;
    for _ in 0..WRITE_ATTEMPTS {
        let spec = current.spec.patched(patch, &deps.callbacks).map_err(invalid_spec)?;
        if spec == current.spec {
            return Ok(ok(&current));
        }
        if spec.url != current.spec.url && checked.as_deref() != Some(spec.url.as_str()) {
            check_url(deps, &spec.url).await?;
            checked = Some(spec.url.clone());
        }
        let read = current.version;
        let next = EndpointRecord {
            spec,
            version: read + 1,
            updated_at: Timestamp::from(deps.clock.now()),
            ..current
        };
        let written = deps
            .endpoints
            .replace_endpoint_spec(&next, read)
            .await
            .map_err(internal("changing an endpoint"))?;
        if written {
            tracing::info!(endpoint_id = id.as_str(), "webhook endpoint changed");
            return Ok(ok(&next));
        }
        // Changed meanwhile (or deleted: then 404): apply the patch to what it is now.
        current = found(deps, owner, id).await?;
    }
    Err(Problem::new(
        StatusCode::CONFLICT,
        "endpoint-changing",
        "The endpoint is being changed",
        "Other changes to this endpoint kept winning; repeat the request.",
    ))
}

/// `DELETE /webhooks/endpoints/{endpoint_id}`.
pub(crate) async fn delete(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let id = &path_id(request)?;
    let deleted = deps
        .endpoints
        .delete_endpoint(owner, id)
        .await
        .map_err(internal("deleting an endpoint"))?;
    if !deleted {
        return Err(Problem::not_found());
    }
    tracing::info!(endpoint_id = id.as_str(), "webhook endpoint deleted");
    Ok(Response::builder().status(StatusCode::NO_CONTENT).body(Body::Empty).expect("a response"))
}

/// `POST /webhooks/endpoints/{endpoint_id}/enable`: enables the endpoint (an enabled one is
/// answered as it is, nothing written). Events are delivered to it again from now on;
/// `recover` queues what failed meanwhile.
pub(crate) async fn enable(
    deps: &Deps,
    request: &Request,
    owner: &Owner,
) -> Result<Response<Body>, Problem> {
    let id = &path_id(request)?;
    let current = found(deps, owner, id).await?;
    if current.enabled() {
        return Ok(ok(&current));
    }
    let now = Timestamp::from(deps.clock.now());
    let enabled = deps
        .endpoints
        .enable_endpoint(owner, id, now)
        .await
        .map_err(internal("enabling an endpoint"))?
        .ok_or_else(Problem::not_found)?;
    tracing::info!(
        endpoint_id = id.as_str(),
        disabled_reason = current.disabled_reason.map(|r| r.as_str()),
        "webhook endpoint enabled"
    );
    Ok(ok(&enabled))
}
