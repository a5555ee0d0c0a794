//! `POST /jobs`: the submission read and checked, its fingerprint and idempotency key.

use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, principal};
use longhaul_domain::admission::Priority;
use longhaul_domain::fingerprint::{derived_idempotency_key, fingerprint, submission_fingerprint};
use longhaul_domain::schedule;
use longhaul_domain::uploads::owns_upload;
use longhaul_domain::{Owner, Timestamp};
use serde::Deserialize;
use serde_json::json;

use crate::create::{NewJob, create};
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
    let (kind, inputs) = check_spec(deps, &body.job_type, &body.params)?;
    // Whether they are there is checked only by the request that creates the job (`create`):
    // a replay answers as the original did, without a HEAD.
    owns_uploads(&owner, &inputs)?;
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
    let key = match request.headers().get("idempotency-key") {
        Some(value) => {
            let key = value.to_str().ok().filter(|k| {
                !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic())
            });
            key.ok_or_else(|| {
                Problem::bad_request(format!(
                    "Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters."
                ))
            })?
            .to_owned()
        }
        // Over the whole request, callback included: a derived key never meets a different
        // request, so it never answers 422 (see `derived_idempotency_key`).
        None => derived_idempotency_key(&owner, &request_fingerprint),
    };

    let new = NewJob {
        owner: &owner,
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

/// Every upload a new job's params name exists: one that is not there is refused as one of
/// someone else's is — the same 404, nothing written — instead of a job accepted only to fail
/// when its stage reads it. One HEAD request per input, made only by the request that is
/// about to create the job (see `create`), never by a replay.
pub(crate) async fn uploads_present(deps: &Deps, inputs: &[String]) -> Result<(), Problem> {
    for input in inputs {
        match deps.uploads.exists(input).await {
            Ok(true) => {}
            Ok(false) => return Err(upload_not_found()),
            Err(err) => {
                tracing::error!(error = %err, "checking an upload failed");
                return Err(Problem::internal());
            }
        }
    }
    Ok(())
}
