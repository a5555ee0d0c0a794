//! `POST /jobs/{id}/retry`: a failed or cancelled job runs again as a new job.

use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, path_job_id, principal, wrong_status};
use longhaul_aws::logs;
use longhaul_domain::JobStatus;
use longhaul_domain::fingerprint::{fingerprint, retry_idempotency_key};
use serde::Deserialize;
use serde_json::json;

use crate::create::{Accepted, NewJob, create};
use crate::response::internal;
use crate::validation::check_spec;
use crate::{Deps, MAX_BODY_BYTES};

/// `POST /jobs/{id}/retry`: a failed or cancelled job runs again as a new job with the same
/// type, params and callback, linked by `retry_of`. Idempotent: retrying the same job again
/// answers with the job the first retry created (unless that one failed too).
pub(crate) async fn retry(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let job_id = path_job_id(request)?;
    // Until the new job is minted, the lines are about the one being retried.
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let from = retry_from(request)?;
    let view = deps.jobs.view(&job_id).await.map_err(internal)?;
    let view = view.filter(|v| v.job.owner == owner).ok_or_else(Problem::not_found)?;
    let original = view.job;
    logs::current_job(&original);
    if !matches!(original.status, JobStatus::Failed | JobStatus::Cancelled) {
        return Err(wrong_status(
            original.status,
            format!(
                "Only failed or cancelled jobs can be retried; this one is {}.",
                original.status
            ),
        ));
    }
    // A type switched off since the job ran stays off for its retries too.
    let (kind, _) = check_spec(&deps.registry, &original.job_type, &original.params)?;
    let key = retry_idempotency_key(&job_id);
    let request_fingerprint = fingerprint(&json!({ "retry_of": job_id }));
    let new = NewJob {
        owner: &owner,
        kind,
        params: &original.params,
        callback_url: &original.callback_url,
        key: &key,
        fingerprint: &request_fingerprint,
        retry_of: Some(&job_id),
        // A retry runs now, whatever the original waited for.
        not_before: None,
        priority: original.priority,
        // From the last checkpoint it left, unless asked to start over (or it left none) — or
        // it compensated: what its stages did was undone, so the retry starts over.
        resume: view
            .progress
            .filter(|p| from == RetryFrom::Checkpoint && p.checkpoint_key.is_some())
            .filter(|_| original.compensation.is_none())
            .map(|p| (job_id.clone(), p)),
        // The retried job's inputs are not checked again (as before the presence check
        // moved into `create`): a retry whose upload is gone fails when its stage reads it.
        inputs: &[],
        // A retry is its owner's new job, not a tick of the schedule that made the original.
        scheduled: None,
    };
    create(deps, &new).await.map(Accepted::into_response)
}

/// Where `POST /jobs/{id}/retry` starts the new job (body `{"from": "checkpoint" | "start"}`,
/// optional).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RetryFrom {
    /// The retried job's last checkpoint (when it left one).
    #[default]
    Checkpoint,
    /// The beginning.
    Start,
}

/// The retry's body, if any: `{"from": "checkpoint" | "start"}`.
fn retry_from(request: &Request) -> Result<RetryFrom, Problem> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct RetryBody {
        #[serde(default)]
        from: RetryFrom,
    }
    if request.body().is_empty() {
        return Ok(RetryFrom::default());
    }
    let body: RetryBody =
        serde_json::from_value(json_body(request, MAX_BODY_BYTES)?).map_err(|e| {
            Problem::bad_request(format!(
                "The body must be {{\"from\": \"checkpoint\"}} or {{\"from\": \"start\"}}: {e}"
            ))
        })?;
    Ok(body.from)
}
