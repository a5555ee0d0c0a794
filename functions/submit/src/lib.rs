//! **submit** — `POST /jobs`: validate, store the job under its idempotency key, enqueue it,
//! answer `202 Accepted` at once.
//!
//! Idempotency follows draft-ietf-httpapi-idempotency-key-header: the `Idempotency-Key`
//! header, or a key derived from (principal, type, canonical params) when it is absent. The
//! job and its idempotency record are written in one DynamoDB transaction, so concurrent
//! identical requests create exactly one job and send exactly one message.

use std::time::Duration;

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{Problem, json_body, json_response, principal};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{IdempotencyRecord, JobRecord, JobStore, StoreError};
use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
use longhaul_domain::fingerprint::{derived_idempotency_key, fingerprint};
use longhaul_domain::{JobId, JobSpec, JobStatus, JobType, SpecError, Transition, now_rfc3339};
use serde::Deserialize;
use serde_json::json;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest accepted `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 255;
/// Seconds a client should wait before polling a job it just submitted.
pub const RETRY_AFTER_SECONDS: u64 = 2;
/// How long a pending job counts as "still being created" for a replay (→ 409).
pub const IN_FLIGHT_WINDOW: Duration = Duration::from_secs(10);

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `INTAKE_QUEUE_URL`: where new jobs are enqueued.
    pub intake_queue_url: String,
    /// `IDEMPOTENCY_TTL_SECONDS` (default 86,400): how long a key maps to its job.
    pub idempotency_ttl_seconds: u64,
    /// `ENABLED_JOB_TYPES` (comma-separated; default every type): the job types this
    /// deployment accepts, so an operator can switch off the diagnostic `demo` type.
    pub enabled_job_types: Vec<JobType>,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            idempotency_ttl_seconds: vars.parsed_or("IDEMPOTENCY_TTL_SECONDS", 86_400)?,
            enabled_job_types: match vars.required("ENABLED_JOB_TYPES") {
                Err(_) => JobType::ALL.to_vec(),
                Ok(list) => list
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(|name| {
                        name.parse::<JobType>().map_err(|e| ConfigError::Invalid {
                            name: "ENABLED_JOB_TYPES".into(),
                            value: list.clone(),
                            reason: e.to_string(),
                        })
                    })
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: JobStore,
    /// The intake queue.
    pub intake: IntakeQueue,
    /// Idempotency window.
    pub idempotency_ttl: Duration,
    /// Job types accepted.
    pub enabled_job_types: Vec<JobType>,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
            intake: IntakeQueue::new(aws_sdk_sqs::Client::new(sdk), config.intake_queue_url.clone()),
            idempotency_ttl: Duration::from_secs(config.idempotency_ttl_seconds),
            enabled_job_types: config.enabled_job_types.clone(),
        }
    }
}

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
}

fn empty_object() -> serde_json::Value {
    json!({})
}

/// Handles one request. Never fails: every error is a problem response.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    match submit(deps, &request).await {
        Ok(response) => response,
        Err(problem) => problem.into_response(),
    }
}

async fn submit(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let body: SubmitBody = serde_json::from_value(json_body(request, MAX_BODY_BYTES)?)
        .map_err(|e| Problem::bad_request(format!("The body does not match the job submission schema: {e}")))?;
    let spec = JobSpec::parse(&body.job_type, &body.params).map_err(|e| match e {
        SpecError::UnknownType(_) => {
            Problem::unprocessable("unknown-job-type", "Unknown job type", e.to_string())
        }
        SpecError::InvalidParams(_) => Problem::unprocessable("invalid-params", "Invalid job parameters", e.to_string()),
    })?;
    if !deps.enabled_job_types.contains(&spec.job_type()) {
        return Err(Problem::unprocessable(
            "unknown-job-type",
            "Unknown job type",
            format!("job type {:?} is not enabled on this deployment", spec.job_type().as_str()),
        ));
    }
    if let Some(url) = &body.callback_url {
        validate_callback_url(url)?;
    }
    let key = match request.headers().get("idempotency-key") {
        Some(value) => {
            let key = value.to_str().ok().filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN && k.bytes().all(|b| b.is_ascii_graphic()));
            key.ok_or_else(|| {
                Problem::bad_request(format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters."))
            })?
            .to_owned()
        }
        None => derived_idempotency_key(&owner, spec.job_type().as_str(), &body.params),
    };
    let request_fingerprint =
        fingerprint(&json!({"type": spec.job_type().as_str(), "params": body.params, "callback_url": body.callback_url}));

    let mut replacing: Option<String> = None;
    // A reused key races at most a few times (another request replacing the same failed job).
    for _ in 0..3 {
        let job = new_job(&owner, &spec, body.params.clone(), body.callback_url.clone(), &key, &request_fingerprint);
        let idempotency = IdempotencyRecord {
            job_id: job.job_id.clone(),
            fingerprint: request_fingerprint.clone(),
            expires_at: chrono::Utc::now().timestamp() + deps.idempotency_ttl.as_secs() as i64,
        };
        match deps.jobs.create(&job, &idempotency, replacing.as_deref()).await {
            Ok(()) => {
                enqueue(deps, &job.job_id).await;
                return Ok(accepted(StatusCode::ACCEPTED, &job, false));
            }
            Err(StoreError::KeyTaken) => {}
            Err(err) => {
                tracing::error!(error = %err, "storing a new job failed");
                return Err(Problem::internal());
            }
        }
        let Some(existing) = deps.jobs.idempotency(&owner, &key).await.map_err(internal)? else {
            replacing = None; // expired between our write and our read: try again afresh
            continue;
        };
        if existing.fingerprint != request_fingerprint {
            return Err(Problem::unprocessable(
                "idempotency-key-reused",
                "Idempotency-Key reused with a different request",
                "This Idempotency-Key was used for a different request; use a new key.",
            ));
        }
        let job = deps.jobs.job(&existing.job_id).await.map_err(internal)?.ok_or_else(|| {
            tracing::error!(job_id = %existing.job_id, "idempotency record points at a missing job");
            Problem::internal()
        })?;
        match job.status {
            JobStatus::Failed | JobStatus::Cancelled => replacing = Some(job.job_id),
            JobStatus::Pending if is_recent(&job.created_at) => {
                return Err(Problem::new(
                    StatusCode::CONFLICT,
                    "request-in-flight",
                    "The original request is still in progress",
                    "A request with this Idempotency-Key is still being processed; retry shortly.",
                )
                .header(header::RETRY_AFTER, "1"));
            }
            _ => return Ok(accepted(StatusCode::OK, &job, true)),
        }
    }
    Err(Problem::new(
        StatusCode::CONFLICT,
        "request-in-flight",
        "The original request is still in progress",
        "Concurrent requests are reusing this Idempotency-Key; retry shortly.",
    )
    .header(header::RETRY_AFTER, "1"))
}

fn internal(err: StoreError) -> Problem {
    tracing::error!(error = %err, "job store failed");
    Problem::internal()
}

/// Callback URLs must be absolute `https` URLs; delivery re-validates the resolved address.
fn validate_callback_url(url: &str) -> Result<(), Problem> {
    let ok = url.len() <= 2048
        && url.strip_prefix("https://").is_some_and(|rest| {
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            !host.is_empty() && !host.contains('@') && rest.chars().all(|c| c.is_ascii_graphic())
        });
    if ok {
        Ok(())
    } else {
        Err(Problem::unprocessable(
            "invalid-callback-url",
            "Invalid callback URL",
            "callback_url must be an absolute https URL of at most 2048 characters, without credentials.",
        ))
    }
}

fn is_recent(created_at: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(created_at)
        .map(|at| (chrono::Utc::now() - at.to_utc()).to_std().unwrap_or_default() < IN_FLIGHT_WINDOW)
        .unwrap_or(false)
}

fn new_job(
    owner: &str,
    spec: &JobSpec,
    params: serde_json::Value,
    callback_url: Option<String>,
    key: &str,
    request_fingerprint: &str,
) -> JobRecord {
    let now = now_rfc3339();
    JobRecord {
        job_id: JobId::new().to_string(),
        owner: owner.to_owned(),
        job_type: spec.job_type().as_str().to_owned(),
        params,
        status: JobStatus::Pending,
        attempt: 0,
        lease: None,
        execution: None,
        idempotency_key: key.to_owned(),
        fingerprint: request_fingerprint.to_owned(),
        callback_url,
        created_at: now.clone(),
        updated_at: now.clone(),
        started_at: None,
        finished_at: None,
        error: None,
        result_key: None,
        transitions: vec![Transition { state: JobStatus::Pending, at: now, reason: "submitted".into() }],
        injected_failures: 0,
    }
}

/// Enqueues the job. A failure here leaves the job `pending`: it is already durable, and the
/// reaper re-enqueues pending jobs that were never dispatched, so the client still gets 202.
async fn enqueue(deps: &Deps, job_id: &str) {
    if let Err(err) = deps.intake.send(&DispatchMessage { job_id: job_id.to_owned() }).await {
        tracing::error!(job_id, error = %err, "enqueueing failed; the job stays pending for the reaper");
    }
}

fn accepted(status: StatusCode, job: &JobRecord, replay: bool) -> Response<Body> {
    let location = format!("/jobs/{}", job.job_id);
    let mut response = json_response(
        status,
        &json!({
            "job_id": job.job_id,
            "status": job.status,
            "status_url": location,
            "created_at": job.created_at,
        }),
    );
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location.parse().expect("job ids are header-safe"));
    headers.insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    if replay {
        headers.insert("idempotent-replayed", "true".parse().expect("static"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(extra: &[(&str, &str)]) -> Vars {
        let mut map = HashMap::from([
            ("TABLE_NAME".to_string(), "t".to_string()),
            ("INTAKE_QUEUE_URL".to_string(), "q".to_string()),
        ]);
        map.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Vars::from_map(map)
    }

    #[test]
    fn enabled_job_types() {
        assert_eq!(Config::from_vars(&vars(&[])).unwrap().enabled_job_types, JobType::ALL.to_vec());
        assert_eq!(Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", " demo ")])).unwrap().enabled_job_types, vec![JobType::Demo]);
        assert!(Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", "demo,nope")])).is_err());
    }

    #[test]
    fn callback_urls() {
        assert!(validate_callback_url("https://partner.example/hook?x=1").is_ok());
        for bad in ["http://partner.example/", "https://", "https://user:pw@partner.example/", "ftp://x", "https://a b/"] {
            assert!(validate_callback_url(bad).is_err(), "{bad}");
        }
    }
}
