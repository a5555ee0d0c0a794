//! **status** — `GET /jobs/{id}`: the job, its progress and its history, from one DynamoDB
//! query. A read-only function: its role cannot write.
//!
//! Live jobs answer with `Retry-After` and `Cache-Control: no-store`; terminal jobs are
//! immutable, so they carry an `ETag` and may be cached. An unknown id and another tenant's
//! id read the same (404), so job ids leak nothing.

use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::api::{Problem, principal};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, JobView};
use longhaul_domain::{JobId, JobStatus};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Seconds a client should wait between polls of a live job.
pub const POLL_AFTER_SECONDS: u64 = 2;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config { table: vars.required("TABLE_NAME")? })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table (read only).
    pub jobs: JobStore,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps { jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()) }
    }
}

/// Handles one request. Never fails: every error is a problem response.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    match status(deps, &request).await {
        Ok(response) => response,
        Err(problem) => problem.into_response(),
    }
}

async fn status(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let params = request.path_parameters();
    let job_id: JobId = params.first("id").and_then(|id| id.parse().ok()).ok_or_else(Problem::not_found)?;
    let view = deps.jobs.view(&job_id.to_string()).await.map_err(|err| {
        tracing::error!(%job_id, error = %err, "reading the job failed");
        Problem::internal()
    })?;
    let view = view.filter(|v| v.job.owner == owner).ok_or_else(Problem::not_found)?;
    let body = serde_json::to_vec(&render(&view)).expect("views always serialise");
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..32]);
    let terminal = view.job.status.is_terminal();
    let not_modified = terminal
        && request
            .headers()
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut response = if not_modified {
        let mut r = Response::new(Body::Empty);
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Body::Binary(body));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    };
    let headers = response.headers_mut();
    if terminal {
        headers.insert(header::ETAG, etag.parse().expect("hex is header-safe"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=60"));
    } else {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::RETRY_AFTER, POLL_AFTER_SECONDS.into());
    }
    Ok(response)
}

/// The public representation of a job.
pub fn render(view: &JobView) -> serde_json::Value {
    let job = &view.job;
    let progress = match (&view.progress, job.status) {
        (_, JobStatus::Succeeded | JobStatus::Expired) => json!({
            "pct": 100.0, "stage": view.progress.as_ref().map(|p| p.stage.clone()),
            "stage_index": view.progress.as_ref().map(|p| p.stages_total),
            "stages_total": view.progress.as_ref().map(|p| p.stages_total),
            "items_done": view.progress.as_ref().and_then(|p| p.items_total.or(Some(p.items_done))),
            "items_total": view.progress.as_ref().and_then(|p| p.items_total), "eta": 0,
        }),
        (Some(p), _) => json!({
            "pct": p.pct, "stage": if p.stage.is_empty() { None } else { Some(&p.stage) },
            "stage_index": p.stage_index, "stages_total": p.stages_total,
            "items_done": p.items_done, "items_total": p.items_total, "eta": p.eta_seconds,
        }),
        (None, _) => json!({
            "pct": 0.0, "stage": null, "stage_index": null, "stages_total": null,
            "items_done": 0, "items_total": null, "eta": null,
        }),
    };
    let mut body = json!({
        "job_id": job.job_id,
        "type": job.job_type,
        "status": job.status,
        "progress": progress,
        "attempt": job.attempt,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "transitions": job.transitions,
    });
    if let Some(error) = &job.error {
        body["error"] = json!({ "code": error.code, "message": error.message });
    }
    if matches!(job.status, JobStatus::Succeeded | JobStatus::Expired) {
        body["result_url"] = format!("/jobs/{}/result", job.job_id).into();
    }
    body
}
