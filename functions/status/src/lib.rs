//! **status** — the read path of the API; its role cannot write anything.
//!
//! * `GET /jobs/{id}` — the job, its progress and history, from one DynamoDB query. Live jobs
//!   answer with `Retry-After` and `Cache-Control: no-store`; terminal jobs are immutable, so
//!   they carry an `ETag` and may be cached.
//! * `GET /jobs` — the caller's jobs, newest first, filtered, with an opaque cursor.
//! * `GET /jobs/{id}/result` — `303 See Other` to a link minted for this request: a presigned
//!   URL of the stored result, or (a result kept in the job's record) the signed link below.
//! * `GET /jobs/{id}/result/{token}` — a small result kept in the job's record; no bearer
//!   token, the link's own, checked before anything is read (`401` when it is not valid).
//! * `GET /jobs/{id}/deliveries` — the job's webhook delivery attempts.
//! * `GET /openapi.json` — the API description, the same document the tests hold the API to.
//! * `GET /job-types` — the job kinds this deployment accepts: stages, params schema, policy.
//! * anything else (the catch-all route) — `405` with `Allow` on a known path, else `404`.
//!
//! An unknown id and another tenant's id read the same (404), so job ids leak nothing.

pub mod lambda;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use lambda_http::http::{HeaderValue, Method, StatusCode, header};
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::api::{Problem, json_response, path_job_id, principal, route_key, wrong_status};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobEntry, JobStore, JobView, ListError, ListFilter};
use longhaul_aws::logs;
use longhaul_aws::objects::ObjectStore;
use longhaul_aws::ports::{
    Clock, DeliveryLog, JobListing, JobReads, ObjectLinks, SigningKey, SystemClock,
};
use longhaul_aws::secrets::SecretKey;
use longhaul_domain::compensation::UndoStatus;
use longhaul_domain::{JobStatus, result_link, stream_token};
use longhaul_worker::Registry;
use secrecy::ExposeSecret;
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::Instrument;

/// Seconds a client should wait between polls of a live job.
pub const POLL_AFTER_SECONDS: u64 = 2;
/// How long a stream link lives (`LONGHAUL_STREAM_TOKEN_TTL_SECONDS` shortens it, for tests
/// of clients that must fetch a fresh link).
pub const STREAM_TOKEN_TTL_SECONDS: i64 = 15 * 60;
/// How long a result link lives.
pub const RESULT_URL_TTL: Duration = Duration::from_secs(15 * 60);
/// Default and largest page size of `GET /jobs`.
pub const DEFAULT_PAGE: usize = 20;
/// Largest page size of `GET /jobs`.
pub const MAX_PAGE: usize = 100;

/// The API description, served as is and held true by the end-to-end tests.
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// The paths of the API with their methods, read from the API description.
static PATHS: LazyLock<Vec<(Vec<String>, Vec<String>)>> = LazyLock::new(|| {
    let doc: serde_json::Value =
        serde_json::from_str(OPENAPI).expect("docs/openapi.json is valid JSON");
    doc["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(path, item)| {
            let segments = path.trim_start_matches('/').split('/').map(str::to_owned).collect();
            let methods = item
                .as_object()
                .into_iter()
                .flatten()
                .map(|(m, _)| m.to_uppercase())
                .filter(|m| m != "PARAMETERS")
                .collect();
            (segments, methods)
        })
        .collect()
});

/// The function's configuration (its `Debug` redacts the stream token key).
#[derive(Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `BUCKET_NAME`: where results live.
    pub bucket: String,
    /// `EVENTS_URL`: base URL of the live progress stream (the events function's URL).
    pub events_url: String,
    /// `STREAM_TOKEN_SECRET_ARN`: the Secrets Manager secret whose value signs the stream's
    /// job-scoped tokens (read at init, never from the environment).
    pub stream_token_secret_arn: String,
    /// `LONGHAUL_STREAM_TOKEN_TTL_SECONDS` (900): how long a stream link lives.
    pub stream_token_ttl_seconds: i64,
    /// `ENABLED_JOB_TYPES` (comma-separated; default every registered kind): the kinds
    /// `GET /job-types` lists (the same setting as the submit function's).
    pub enabled_job_types: Vec<String>,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            events_url: vars.required("EVENTS_URL")?.trim_end_matches('/').to_owned(),
            stream_token_secret_arn: vars.required("STREAM_TOKEN_SECRET_ARN")?,
            stream_token_ttl_seconds: vars
                .parsed_or("LONGHAUL_STREAM_TOKEN_TTL_SECONDS", STREAM_TOKEN_TTL_SECONDS)?,
            enabled_job_types: {
                let list = vars.required("ENABLED_JOB_TYPES").ok();
                longhaul_jobs::registry().enabled_names(list.as_deref()).map_err(|e| {
                    ConfigError::Invalid {
                        name: "ENABLED_JOB_TYPES".into(),
                        value: list.unwrap_or_default(),
                        reason: e.to_string(),
                    }
                })?
            },
        })
    }
}

/// What the function needs of the job table: to read a job, list an owner's jobs and read
/// a job's webhook deliveries (never to write).
pub trait Jobs: JobReads + JobListing + DeliveryLog {}
impl<T: JobReads + JobListing + DeliveryLog> Jobs for T {}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Clone)]
pub struct Deps {
    /// The job table (read only).
    pub jobs: Arc<dyn Jobs>,
    /// Links to results (read only).
    pub objects: Arc<dyn ObjectLinks>,
    /// Base URL of the live progress stream.
    pub events_url: String,
    /// Signs stream tokens, signal links and result links, and checks result links.
    pub stream_token_key: Arc<dyn SigningKey>,
    /// How long a stream link lives, seconds.
    pub stream_token_ttl_seconds: i64,
    /// The enabled job kinds (`GET /job-types`).
    pub registry: Registry,
    /// What time it is: when a stream link handed out expires.
    pub clock: Arc<dyn Clock>,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table, and the stream tokens' signing key.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.stream_token_key.clone(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: Arc::new(JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone())),
            objects: Arc::new(ObjectStore::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_s3::Client::new),
                config.bucket.clone(),
            )),
            events_url: config.events_url.clone(),
            stream_token_key: Arc::new(SecretKey::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_secretsmanager::Client::new),
                config.stream_token_secret_arn.clone(),
            )),
            stream_token_ttl_seconds: config.stream_token_ttl_seconds,
            registry: longhaul_jobs::registry().enabled(&config.enabled_job_types),
            clock: Arc::new(SystemClock),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("table", &self.table)
            .field("bucket", &self.bucket)
            .field("events_url", &self.events_url)
            .field("stream_token_secret_arn", &self.stream_token_secret_arn)
            .field("enabled_job_types", &self.enabled_job_types)
            .finish()
    }
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("jobs", &self.jobs)
            .field("objects", &self.objects)
            .field("events_url", &self.events_url)
            .field("stream_token_key", &self.stream_token_key)
            .field("registry", &self.registry)
            .field("clock", &self.clock)
            .finish()
    }
}

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`logs`]): the principal from the token; the job id, attempt and
/// owner once the caller's job is read (a listing is about no one job).
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    let span = logs::job_span(None, None, principal(&request).as_ref());
    async {
        let result = match route_key(&request).as_deref() {
            Some("GET /openapi.json") => Ok(openapi()),
            Some("GET /job-types") => Ok(json_response(StatusCode::OK, &deps.registry.describe())),
            Some("GET /jobs/{id}") => get_job(deps, &request).await,
            Some("GET /jobs") => list_jobs(deps, &request).await,
            Some("GET /jobs/{id}/result") => result(deps, &request).await,
            Some("GET /jobs/{id}/result/{token}") => inline_result(deps, &request).await,
            Some("GET /jobs/{id}/deliveries") => deliveries(deps, &request).await,
            _ => Err(fallback(request.method(), request.uri().path())),
        };
        result.unwrap_or_else(Problem::into_response)
    }
    .instrument(span)
    .await
}

fn openapi() -> Response<Body> {
    let mut response = Response::new(Body::from(OPENAPI));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

/// 405 with `Allow` for another method on a known path; 404 otherwise.
fn fallback(method: &Method, path: &str) -> Problem {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let known = PATHS.iter().find(|(segments, _)| {
        segments.len() == parts.len()
            && segments
                .iter()
                .zip(&parts)
                .all(|(s, p)| (s.starts_with('{') && !p.is_empty()) || s == p)
    });
    match known {
        Some((_, methods)) => Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            format!("{method} is not supported here; use {}.", methods.join(" or ")),
        )
        .header(header::ALLOW, methods.join(", ")),
        None => Problem::not_found(),
    }
}

/// The caller's view of a job, or 404.
async fn owned_view(deps: &Deps, request: &Request) -> Result<JobView, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let job_id = path_job_id(request)?;
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let view = deps.jobs.view(&job_id).await.map_err(|err| {
        tracing::error!(error = %err, "reading the job failed");
        Problem::internal()
    })?;
    let view = view.filter(|v| v.job.owner == owner).ok_or_else(Problem::not_found)?;
    logs::current_job(&view.job);
    Ok(view)
}

async fn get_job(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let view = owned_view(deps, request).await?;
    let mut rendered = render(&view);
    if !view.job.status.is_terminal() {
        // A job-scoped link to the live stream, valid for 15 minutes (EventSource cannot send
        // an Authorization header). Terminal jobs have nothing to stream and stay cacheable.
        let expires = deps.clock.now().timestamp() + deps.stream_token_ttl_seconds;
        let key = signing_key(deps).await?;
        let token = stream_token::issue(
            key.expose_secret().as_bytes(),
            &view.job.job_id,
            &view.job.owner,
            expires,
        );
        rendered["events_url"] =
            format!("{}/jobs/{}/events?token={token}", deps.events_url, view.job.job_id).into();
        // A job parked waiting for a signal offers the link a partner sends it by (no bearer
        // token: the link's own, valid until the wait times out).
        if let Some(wait) = view.job.pause.as_ref().and_then(|p| p.wait.as_ref())
            && view.job.status == JobStatus::Paused
        {
            let token = longhaul_domain::signals::issue(
                key.expose_secret().as_bytes(),
                &view.job.job_id,
                &wait.signal,
                wait.until.as_datetime().timestamp(),
            );
            rendered["paused"]["signal_url"] =
                format!("/jobs/{}/signals/{}/{token}", view.job.job_id, wait.signal).into();
        }
    }
    let body = serde_json::to_vec(&rendered).expect("views always serialise");
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

async fn list_jobs(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let query = request.query_string_parameters();
    for (name, _) in query.iter() {
        if !matches!(name, "status" | "type" | "limit" | "cursor" | "schedule_id") {
            return Err(Problem::bad_request(format!("unknown query parameter {name:?}")));
        }
    }
    let status = match query.first("status") {
        None => None,
        Some(s) => Some(s.parse::<JobStatus>().map_err(|_| {
            let statuses: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
            Problem::bad_request(format!("status must be one of {}", statuses.join(", ")))
        })?),
    };
    let job_type = query.first("type").map(|t| t.chars().take(64).collect::<String>());
    let limit = match query.first("limit") {
        None => DEFAULT_PAGE,
        Some(l) => {
            l.parse::<usize>().ok().filter(|l| (1..=MAX_PAGE).contains(l)).ok_or_else(|| {
                Problem::bad_request(format!("limit must be an integer from 1 to {MAX_PAGE}"))
            })?
        }
    };
    let schedule_id = match query.first("schedule_id") {
        None => None,
        Some(id) => Some(id.parse().map_err(|_| {
            Problem::bad_request("schedule_id must be a schedule id (GET /schedules lists yours)")
        })?),
    };
    let filter = ListFilter { status, job_type, schedule_id };
    let (jobs, next) =
        deps.jobs.list(&owner, &filter, limit, query.first("cursor")).await.map_err(
            |err| match err {
                ListError::InvalidCursor => {
                    Problem::bad_request("cursor is not a cursor this API issued to you")
                }
                ListError::Store(err) => {
                    tracing::error!(error = %err, "listing jobs failed");
                    Problem::internal()
                }
            },
        )?;
    let jobs: Vec<_> = jobs.iter().map(summary).collect();
    let mut response = json_response(StatusCode::OK, &json!({ "jobs": jobs, "next_cursor": next }));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

async fn result(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let view = owned_view(deps, request).await?;
    let job = &view.job;
    let url = match (job.status, &job.result_inline, &job.result_key) {
        (JobStatus::Succeeded, Some(_), _) => {
            // Kept in the record: a link of our own, which needs no bearer token either.
            let key = signing_key(deps).await?;
            let expires = deps.clock.now().timestamp() + RESULT_URL_TTL.as_secs() as i64;
            let token = result_link::issue(
                key.expose_secret().as_bytes(),
                &job.job_id,
                &job.owner,
                expires,
            );
            // Relative to this request's URL (`…/jobs/{id}/result/{token}`): it holds behind
            // any path prefix an app's origin puts the API under.
            format!("result/{token}")
        }
        (JobStatus::Succeeded, None, Some(key)) => {
            deps.objects.presign_get(key, RESULT_URL_TTL).await.map_err(|err| {
                tracing::error!(error = %err, "presigning the result failed");
                Problem::internal()
            })?
        }
        (JobStatus::Expired, ..) => return Err(result_expired()),
        (status, ..) => {
            return Err(wrong_status(
                status,
                format!("The job is {status}; its result exists once it has succeeded."),
            ));
        }
    };
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::SEE_OTHER;
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, url.parse().map_err(|_| Problem::internal())?);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `GET /jobs/{id}/result/{token}`: a result kept in the job's record, by the link
/// [`result`] handed out. The token is checked before anything is read; then the job must
/// still be the token's owner's and hold the result.
///
/// The body is a kind's output served from the API's own origin, so it is sandboxed: a
/// `Content-Security-Policy` of `sandbox` gives a document no origin of ours (no script of a
/// result can reach the console's storage), and `nosniff` holds browsers to its media type.
async fn inline_result(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let job_id = path_job_id(request)?;
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let token = request.path_parameters().first("token").unwrap_or_default().to_owned();
    let key = signing_key(deps).await?;
    let now = deps.clock.now().timestamp();
    let grant = result_link::verify(key.expose_secret().as_bytes(), &token, &job_id, now).map_err(
        |err| {
            tracing::info!(reason = %err, "result link refused");
            let detail = match err {
                result_link::TokenError::Expired => {
                    "The link has expired: ask GET /jobs/{id}/result for a new one."
                }
                _ => "The link is unknown or altered: ask GET /jobs/{id}/result for a new one.",
            };
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "invalid-result-link",
                "The result link is not valid",
                detail,
            )
        },
    )?;
    let view = deps.jobs.view(&job_id).await.map_err(|err| {
        tracing::error!(error = %err, "reading the job failed");
        Problem::internal()
    })?;
    let job = view.map(|v| v.job).filter(|job| job.owner == grant.owner);
    let job = job.ok_or_else(Problem::not_found)?;
    logs::current_job(&job);
    let inline = match (job.status, job.result_inline) {
        (JobStatus::Succeeded, Some(inline)) => inline,
        (JobStatus::Expired, _) => return Err(result_expired()),
        _ => return Err(Problem::not_found()),
    };
    let body = inline.bytes().map_err(|err| {
        tracing::error!(error = %err, "the job's inline result is corrupt");
        Problem::internal()
    })?;
    let mut response = Response::new(Body::Binary(body));
    let headers = response.headers_mut();
    let content_type = HeaderValue::from_str(&inline.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_TYPE, content_type);
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // The link is a credential: a page of the result never sends it on as a referrer.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    Ok(response)
}

/// The key links are signed with.
async fn signing_key(deps: &Deps) -> Result<&secrecy::SecretString, Problem> {
    deps.stream_token_key.get().await.map_err(|err| {
        tracing::error!(error = %err, "reading the link signing key failed");
        Problem::internal()
    })
}

/// `410` for a result past its retention.
fn result_expired() -> Problem {
    Problem::new(
        StatusCode::GONE,
        "result-expired",
        "The result has expired",
        "The job's result passed its retention period and was deleted.",
    )
}

/// The job's webhook delivery attempts, oldest first.
async fn deliveries(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let view = owned_view(deps, request).await?;
    let attempts = deps.jobs.deliveries(&view.job.job_id).await.map_err(|err| {
        tracing::error!(error = %err, "reading deliveries failed");
        Problem::internal()
    })?;
    let mut response = json_response(
        StatusCode::OK,
        &json!({ "job_id": view.job.job_id, "deliveries": attempts }),
    );
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

fn summary(job: &JobEntry) -> serde_json::Value {
    json!({
        "job_id": job.job_id,
        "type": job.job_type,
        "status": job.status,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "finished_at": job.finished_at,
        "status_url": format!("/jobs/{}", job.job_id),
    })
}

/// The public representation of a job.
pub fn render(view: &JobView) -> serde_json::Value {
    let job = &view.job;
    // The same view as the live stream's: a succeeded job's is its end, not its last write.
    let progress = view.shown_progress();
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
    // What the numbers count, as the job's kind says.
    body["progress"]["unit"] = job.progress_unit().into();
    if let Some(error) = &job.error {
        body["error"] = json!({ "code": error.code, "message": error.message });
    }
    if let Some(retry_at) = job.retry_at.as_ref().filter(|_| job.status == JobStatus::Queued) {
        // Its last attempt failed transiently: the next one starts then.
        body["retry_at"] = retry_at.to_string().into();
    }
    if let Some(last) = &job.last_error {
        // Why the last failed attempt failed (the job went on); shown until the job ends well.
        if job.status != JobStatus::Succeeded && job.status != JobStatus::Expired {
            body["last_error"] = json!({ "code": last.code, "message": last.message });
        }
    }
    if job.status == JobStatus::Succeeded {
        // Not once expired: the result is gone (`/result` answers 410).
        body["result_url"] = format!("/jobs/{}/result", job.job_id).into();
    }
    if let Some(summary) = &job.summary {
        // The kind's small outcome beside the result; kept when the result expires.
        body["summary"] = summary.clone();
    }
    if let Some(retry_of) = &job.retry_of {
        body["retry_of"] = retry_of.as_str().into();
    }
    if let Some(scheduled) = &job.scheduled {
        // The schedule tick that submitted it.
        body["schedule_id"] = scheduled.schedule_id.as_str().into();
        body["scheduled_at"] = json!(scheduled.scheduled_at);
    }
    if let Some(resumed) = &job.resumed_from {
        // A retry that started from the retried job's last checkpoint.
        body["resumed_from"] = json!({"stage": resumed.stage, "items_done": resumed.items_done});
    }
    if let Some(url) = &job.callback_url {
        body["callback_url"] = url.clone().into();
    }
    if job.status == JobStatus::Running {
        body["stalled"] = job.stalled_at.is_some().into();
    }
    if let Some(not_before) = &job.not_before {
        // A delayed job: it does not start before then (shown for its whole life).
        body["not_before"] = not_before.to_string().into();
    }
    if let Some(cancellation) = &job.cancellation {
        body["cancellation"] = serde_json::to_value(cancellation).expect("cancellations serialise");
    }
    if let Some(pause) = job.pause.as_ref().filter(|_| !job.status.is_terminal()) {
        // Paused since `paused_at` (cancelled at `lapses_at` unless resumed), or — a running
        // job without `paused_at` — asked to pause at its stage's next progress write.
        body["pause"] = serde_json::to_value(pause).expect("pauses serialise");
        // (An owner's pause lapses; a wait times out at its `until` instead.)
        if let Some(paused_at) = pause.paused_at.filter(|_| pause.wait.is_none()) {
            body["pause"]["lapses_at"] =
                job.policy_or_default().pause_lapses_at(paused_at).to_string().into();
        }
    }
    if let Some(pause) = job.pause.as_ref().filter(|_| job.status == JobStatus::Paused) {
        // Why it is paused: its owner's pause (until it lapses), or its stage waiting for a
        // signal (until the wait times out; `GET /jobs/{id}` adds the link to send it by).
        body["paused"] = match &pause.wait {
            Some(wait) => json!({
                "reason": "waiting",
                "signal": wait.signal,
                "since": pause.paused_at,
                "until": wait.until,
            }),
            None => json!({
                "reason": pause.reason.as_deref().unwrap_or("paused by its owner"),
                "since": pause.paused_at,
                "until": pause.paused_at.map(|at| job.policy_or_default().pause_lapses_at(at)),
            }),
        };
    }
    if let Some(compensation) = &job.compensation {
        // The undos of the stages it started: running while it is `compensating`, and how they
        // went on the job it ended (`failed`: one was given up).
        body["compensation"] = json!({
            "status": compensation.status,
            "ends_as": compensation.ending.status,
            "stages": compensation.stages.iter().map(|step| {
                let mut shown = json!({
                    "stage": step.stage,
                    "status": step.status,
                    "at": step.at,
                    "attempts": step.attempts,
                });
                if let Some(error) = &step.error {
                    shown["error"] = error.as_str().into();
                }
                if let Some(retry_at) = step.retry_at.filter(|_| step.status == UndoStatus::Retrying) {
                    shown["retry_at"] = json!(retry_at);
                }
                shown
            }).collect::<Vec<_>>(),
        });
    }
    if job.resumes > 0 {
        // Time spent paused, all pauses together: not counted towards `max_runtime`.
        body["paused_seconds"] = job.paused_seconds.into();
    }
    body["priority"] = job.priority.as_str().into();
    if let Some(waiting) = job.waiting.as_ref().filter(|_| job.status == JobStatus::Pending) {
        // Why a pending job has not started: the limit it waits for.
        body["waiting"] = json!({
            "reason": waiting.reason,
            "limit": waiting.limit,
            "since": waiting.since,
            "message": waiting.reason.message(waiting.limit),
        });
    }
    body
}

#[cfg(test)]
mod tests;
