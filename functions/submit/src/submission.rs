//! `POST /jobs`: the submission read and checked, its fingerprint and idempotency key.

use futures::{StreamExt, TryStreamExt};
use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, principal};
use longhaul_aws::jobs::ScheduledBy;
use longhaul_domain::admission::Priority;
use longhaul_domain::callback::CallbackPolicy;
use longhaul_domain::fingerprint::{derived_idempotency_key, fingerprint, submission_fingerprint};
use longhaul_domain::schedule;
use longhaul_domain::schedules::{TICK_KEY_PREFIX, tick_idempotency_key};
use longhaul_domain::uploads::owns_upload;
use longhaul_domain::{Owner, Timestamp};
use longhaul_worker::Registry;
use serde::Deserialize;
use serde_json::json;

use crate::create::{Accepted, NewJob, create};
use crate::validation::{check_spec, validate_callback_url};
use crate::{Deps, MAX_BODY_BYTES};

/// Longest accepted `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 255;

/// The body of `POST /jobs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    #[serde(rename = "type")]
    job_type: String,
    #[serde(default = "empty_object")]
    params: serde_json::Value,
    #[serde(default)]
    callback_url: Option<String>,
    /// Delayed start, in seconds from now (validated by `longhaul_domain::schedule`, 422).
    #[serde(default)]
    delay_seconds: Option<serde_json::Value>,
    /// Delayed start, as an RFC 3339 time.
    #[serde(default)]
    not_before: Option<String>,
    /// `high`, `normal` (the default) or `low`: the order among the caller's waiting jobs.
    #[serde(default)]
    priority: Option<serde_json::Value>,
}

fn empty_object() -> serde_json::Value {
    json!({})
}

pub(crate) async fn submit(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let body: SubmitBody =
        serde_json::from_value(json_body(request, MAX_BODY_BYTES)?).map_err(|e| {
            Problem::bad_request(format!("The body does not match the job submission schema: {e}"))
        })?;
    let key = match request.headers().get("idempotency-key") {
        Some(value) => {
            let key = value.to_str().ok().filter(|k| {
                !k.is_empty()
                    && k.len() <= MAX_KEY_LEN
                    && k.bytes().all(|b| b.is_ascii_graphic())
                    && !k.starts_with(TICK_KEY_PREFIX)
            });
            Some(
                key.ok_or_else(|| {
                    Problem::bad_request(format!(
                        "Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters, \
                         not starting with `{TICK_KEY_PREFIX}` (reserved for schedules' ticks)."
                    ))
                })?
                .to_owned(),
            )
        }
        None => None,
    };
    submit_as(deps, &owner, &body, key, None).await.map(Accepted::into_response)
}

/// A job a schedule's tick submits, as the schedule's owner.
#[derive(Debug, Clone)]
pub struct ScheduledSubmission {
    /// The schedule's owner.
    pub owner: Owner,
    /// The job's kind.
    pub job_type: String,
    /// Its params.
    pub params: serde_json::Value,
    /// Its callback URL.
    pub callback_url: Option<String>,
    /// Its priority.
    pub priority: Priority,
    /// The tick.
    pub scheduled: ScheduledBy,
}

/// Submits a schedule's tick through the path `POST /jobs` takes — the kind's check, the
/// owner's uploads, the callback URL's, the backlog cap, the rate limit, fairness — under the
/// tick's idempotency key ([`tick_idempotency_key`]), so a firing delivered twice makes one
/// job. A problem is what `POST /jobs` would have answered: a 4xx refuses the tick, a 5xx is
/// a failure worth retrying.
pub async fn submit_scheduled(
    deps: &Deps,
    submission: &ScheduledSubmission,
) -> Result<Accepted, Problem> {
    let body = SubmitBody {
        job_type: submission.job_type.clone(),
        params: submission.params.clone(),
        callback_url: submission.callback_url.clone(),
        delay_seconds: None,
        not_before: None,
        priority: (!submission.priority.is_normal()).then(|| submission.priority.as_str().into()),
    };
    let key =
        tick_idempotency_key(&submission.scheduled.schedule_id, submission.scheduled.scheduled_at);
    submit_as(deps, &submission.owner, &body, Some(key), Some(submission.scheduled.clone())).await
}

/// A job spec as `POST /jobs` reads it (`type`, `params`, `callback_url`, `priority`), checked
/// for `owner` as a submission would be, without submitting: an unknown or disabled kind,
/// params the kind refuses, an upload that is not the owner's, a callback URL that may not be
/// called — each the `422` (or `404`) `POST /jobs` answers. Returns the
/// normalised callback URL.
pub async fn check_job_spec(
    registry: &Registry,
    callbacks: &CallbackPolicy,
    owner: &Owner,
    job_type: &str,
    params: &serde_json::Value,
    callback_url: Option<&str>,
) -> Result<Option<String>, Problem> {
    let (_, inputs) = check_spec(registry, job_type, params)?;
    owns_uploads(owner, &inputs)?;
    match callback_url {
        Some(url) => Ok(Some(validate_callback_url(url, callbacks).await?)),
        None => Ok(None),
    }
}

async fn submit_as(
    deps: &Deps,
    owner: &Owner,
    body: &SubmitBody,
    key: Option<String>,
    scheduled: Option<ScheduledBy>,
) -> Result<Accepted, Problem> {
    let (kind, inputs) = check_spec(&deps.registry, &body.job_type, &body.params)?;
    // Whether they are there is checked only by the request that creates the job (`create`):
    // a replay answers as the original did, without a HEAD.
    owns_uploads(owner, &inputs)?;
    let callback_url = match &body.callback_url {
        Some(url) => Some(validate_callback_url(url, &deps.callbacks).await?),
        None => None,
    };
    let not_before = schedule::not_before(
        body.delay_seconds.as_ref(),
        body.not_before.as_deref(),
        deps.clock.now(),
    )
    .map_err(|e| Problem::unprocessable("invalid-start", "Invalid delayed start", e.to_string()))?;
    let priority = match &body.priority {
        None => Priority::Normal,
        Some(value) => value.as_str().and_then(Priority::parse).ok_or_else(|| {
            Problem::unprocessable(
                "invalid-priority",
                "Invalid priority",
                "priority must be \"high\", \"normal\" or \"low\"",
            )
        })?,
    };
    let mut request_fingerprint =
        submission_fingerprint(kind.name(), &body.params, callback_url.as_deref());
    if !priority.is_normal() {
        // Like the delay: part of the request when given; requests without keep theirs.
        request_fingerprint = fingerprint(&json!({
            "request": request_fingerprint,
            "priority": priority.as_str(),
        }));
    }
    if body.delay_seconds.is_some() || body.not_before.is_some() {
        // When to start is part of the request (a same-key request with another delay is a
        // different request, 422); requests without a delay keep their fingerprint.
        request_fingerprint = fingerprint(&json!({
            "request": request_fingerprint,
            "delay_seconds": body.delay_seconds,
            "not_before": body.not_before,
        }));
    }
    // Over the whole request, callback included: a derived key never meets a different
    // request, so it never answers 422 (see `derived_idempotency_key`).
    let key = key.unwrap_or_else(|| derived_idempotency_key(owner, &request_fingerprint));

    let new = NewJob {
        owner,
        kind,
        params: &body.params,
        callback_url: &callback_url,
        key: &key,
        fingerprint: &request_fingerprint,
        retry_of: None,
        not_before: not_before.map(Timestamp::from),
        priority,
        resume: None,
        inputs: &inputs,
        scheduled,
    };
    create(deps, &new).await
}

/// The answer to a job whose params name an upload that is someone else's or is not there:
/// the same 404 for both.
fn upload_not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "upload-not-found",
        "Upload not found",
        "The job's params name an upload that is not one of yours, or that was never uploaded; create one with POST /uploads and PUT the file to its URL.",
    )
}

/// Every upload the job's params name is one of `owner`'s (no request): someone else's upload
/// reads exactly like one that does not exist ([`uploads_present`]).
fn owns_uploads(owner: &Owner, inputs: &[String]) -> Result<(), Problem> {
    if inputs.iter().any(|input| !owns_upload(owner, input)) {
        return Err(upload_not_found());
    }
    Ok(())
}

/// How many uploads' HEAD requests one submission has in flight at once.
pub const UPLOAD_CHECKS_IN_FLIGHT: usize = 16;

/// Every upload a new job's params name exists: one that is not there is refused as one of
/// someone else's is — the same 404, nothing written — instead of a job accepted only to fail
/// when its stage reads it. One HEAD request per distinct input, at most
/// [`UPLOAD_CHECKS_IN_FLIGHT`] at a time (a kind may take a thousand inputs, and the checks
/// must end well inside the function's timeout), made only by the request that is about to
/// create the job (see `create`), never by a replay.
pub(crate) async fn uploads_present(deps: &Deps, inputs: &[String]) -> Result<(), Problem> {
    let distinct: std::collections::BTreeSet<&str> = inputs.iter().map(String::as_str).collect();
    let checks: Vec<_> = distinct.into_iter().map(|input| deps.uploads.exists(input)).collect();
    futures::stream::iter(checks)
        .buffer_unordered(UPLOAD_CHECKS_IN_FLIGHT)
        .map(|checked| match checked {
            Ok(true) => Ok(()),
            Ok(false) => Err(upload_not_found()),
            Err(err) => {
                tracing::error!(error = %err, "checking an upload failed");
                Err(Problem::internal())
            }
        })
        .try_collect::<()>()
        .await
}
