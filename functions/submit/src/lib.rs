//! **submit** — the routes that create jobs: `POST /jobs` (validate, store the job under its
//! idempotency key, enqueue it, answer `202 Accepted` at once) and `POST /jobs/{id}/retry`
//! (re-run a failed or cancelled job as a new job linked to the old one).
//!
//! Idempotency follows draft-ietf-httpapi-idempotency-key-header: the `Idempotency-Key`
//! header, or a key derived from (principal, type, canonical params, callback URL) when it is
//! absent. A key names its job until its record's `expires_at`, then it is free again.
//! Conditional writes on the idempotency record and the job record decide every race, so
//! concurrent identical requests create exactly one job and send exactly one message. A
//! replay answers `200` with the job once its record is stored, and `409` only before.

use std::time::Duration;

use lambda_http::http::{StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::{
    Problem, json_body, json_response, path_job_id, principal, route_key, wrong_status,
};
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{
    IdempotencyRecord, JobRecord, JobStore, ProgressRecord, ResumedFrom, StoreError,
};
use longhaul_aws::limits::{Admission, SubmissionLimiter};
use longhaul_aws::logs;
use longhaul_aws::metrics::{self, Metric};
use longhaul_aws::queue::{DispatchMessage, IntakeQueue};
use longhaul_domain::admission::Priority;
use longhaul_domain::callback::{CallbackPolicy, Host, check_address, parse_callback_url};
use longhaul_domain::fingerprint::{
    derived_idempotency_key, fingerprint, is_derived_key, retry_idempotency_key,
    submission_fingerprint,
};
use longhaul_domain::policy::{JobPolicy, PolicyOverrides};
use longhaul_domain::schedule;
use longhaul_domain::uploads::owns_upload;
use longhaul_domain::{JobId, JobStatus, Timestamp, Transition};
use longhaul_worker::{DynKind, Registry};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest accepted `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 255;
/// Seconds a client should wait before polling a job it just submitted.
pub const RETRY_AFTER_SECONDS: u64 = 2;
/// How long a claimed idempotency key whose job record is not written yet counts as "the
/// original request is still being processed" (→ `409`). After it, the claimant is taken for
/// dead and the next request with the key finishes the creation. A key whose job record
/// exists is never in flight, however young the job: the replay answers `200` with it.
pub const IN_FLIGHT_WINDOW: Duration = Duration::from_secs(10);
/// The response header that marks an answer as a replay of an earlier request's
/// (`Idempotent-Replayed: true`).
pub const IDEMPOTENT_REPLAYED: header::HeaderName =
    header::HeaderName::from_static("idempotent-replayed");

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `INTAKE_QUEUE_URL`: where new jobs are enqueued.
    pub intake_queue_url: String,
    /// `IDEMPOTENCY_TTL_SECONDS` (default 86,400): how long a key maps to its job.
    pub idempotency_ttl_seconds: u64,
    /// `ENABLED_JOB_TYPES` (comma-separated; default every registered kind): the job kinds
    /// this deployment accepts, so an operator can switch off a diagnostic kind.
    pub enabled_job_types: Vec<String>,
    /// `LONGHAUL_ALLOW_INSECURE_CALLBACKS=1`: accept `http` and loopback callback URLs. For
    /// the local stack only; the template never sets it.
    pub allow_insecure_callbacks: bool,
    /// `LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE` (default 600; 0 = unlimited): submissions one
    /// principal may make per minute (`POST /jobs` and `POST /jobs/{id}/retry`; idempotent
    /// replays do not count). Beyond it: `429` with `Retry-After`, nothing written.
    pub submissions_per_minute: u32,
    /// `LONGHAUL_TENANT_MAX_PENDING` (default 10,000; 0 = no cap): jobs one principal may have
    /// that have not yet run (pending or queued). Beyond it: `429` with `Retry-After`,
    /// nothing written.
    pub max_pending: usize,
    /// `LONGHAUL_POLICY_OVERRIDES` (JSON `{"<type>": {"max_attempts": 5, …}}`, default none):
    /// the deployment's changes to kinds' policies, applied to the policy stored on each job.
    pub policy_overrides: PolicyOverrides,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            idempotency_ttl_seconds: vars.parsed_or("IDEMPOTENCY_TTL_SECONDS", 86_400)?,
            enabled_job_types: parse_enabled_job_types(vars, &longhaul_jobs::registry())?,
            allow_insecure_callbacks: vars.parsed_or("LONGHAUL_ALLOW_INSECURE_CALLBACKS", 0u8)?
                == 1,
            submissions_per_minute: vars.parsed_or(
                "LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE",
                DEFAULT_SUBMISSIONS_PER_MINUTE,
            )?,
            max_pending: vars.parsed_or("LONGHAUL_TENANT_MAX_PENDING", DEFAULT_MAX_PENDING)?,
            policy_overrides: parse_policy_overrides(vars, &longhaul_jobs::registry())?,
        })
    }
}

/// `LONGHAUL_POLICY_OVERRIDES`, checked against the registered kinds (a typo fails the start).
fn parse_policy_overrides(
    vars: &Vars,
    registry: &Registry,
) -> Result<PolicyOverrides, ConfigError> {
    let text = vars.required("LONGHAUL_POLICY_OVERRIDES").unwrap_or_default();
    PolicyOverrides::parse(&text, &registry.names()).map_err(|e| ConfigError::Invalid {
        name: "LONGHAUL_POLICY_OVERRIDES".into(),
        value: text.clone(),
        reason: e.to_string(),
    })
}

/// The policy stored on a new job of `kind`: the kind's, with the deployment's overrides.
pub fn stored_policy(kind: &dyn DynKind, overrides: &PolicyOverrides) -> JobPolicy {
    // The worker API's `Policy` serialises to the stored shape (it is what GET /job-types shows).
    let value = serde_json::to_value(kind.policy()).expect("a policy always serialises");
    let policy = serde_json::from_value(value).expect("a kind's policy is a stored policy");
    overrides.apply(kind.name(), policy)
}

/// Default of `LONGHAUL_TENANT_MAX_PENDING`.
pub const DEFAULT_MAX_PENDING: usize = 10_000;

/// How long a client refused for its backlog is asked to wait: its jobs start at the pace its
/// running limit allows, so a minute frees some room in most cases.
pub const BACKLOG_RETRY_AFTER_SECONDS: u64 = 60;

/// Default of `LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE`.
pub const DEFAULT_SUBMISSIONS_PER_MINUTE: u32 = 600;

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: JobStore,
    /// The per-tenant submission rate limit.
    pub limiter: SubmissionLimiter,
    /// The intake queue.
    pub intake: IntakeQueue,
    /// Idempotency window.
    pub idempotency_ttl: Duration,
    /// The job kinds accepted (the registry, filtered by `ENABLED_JOB_TYPES`).
    pub registry: Registry,
    /// Callback URL policy (https and public addresses only, unless insecure is allowed).
    pub callbacks: CallbackPolicy,
    /// The deployment's policy overrides.
    pub policy_overrides: PolicyOverrides,
    /// Jobs one principal may have not yet running (0: no cap).
    pub max_pending: usize,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
            limiter: SubmissionLimiter::new(
                aws_sdk_dynamodb::Client::new(sdk),
                config.table.clone(),
                config.submissions_per_minute,
            ),
            intake: IntakeQueue::new(
                aws_sdk_sqs::Client::new(sdk),
                config.intake_queue_url.clone(),
            ),
            idempotency_ttl: Duration::from_secs(config.idempotency_ttl_seconds),
            registry: longhaul_jobs::registry().enabled(&config.enabled_job_types),
            callbacks: CallbackPolicy { allow_insecure: config.allow_insecure_callbacks },
            max_pending: config.max_pending,
            policy_overrides: config.policy_overrides.clone(),
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

/// Handles one request. Never fails: every error is a problem response.
///
/// Runs in a `job` span ([`logs`]): the principal from the token, the job id once minted (or
/// found under the idempotency key) and its attempt — 0 for a job that has not run yet.
pub async fn handle(deps: &Deps, request: Request) -> Response<Body> {
    let span = logs::job_span(None, None, principal(&request).as_deref());
    async {
        let result = match route_key(&request).as_deref() {
            Some("POST /jobs/{id}/retry") => retry(deps, &request).await,
            _ => submit(deps, &request).await,
        };
        result.unwrap_or_else(Problem::into_response)
    }
    .instrument(span)
    .await
}

/// `POST /jobs/{id}/retry`: a failed or cancelled job runs again as a new job with the same
/// type, params and callback, linked by `retry_of`. Idempotent: retrying the same job again
/// answers with the job the first retry created (unless that one failed too).
async fn retry(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let job_id = path_job_id(request)?.to_string();
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
    let (kind, _) = check_spec(deps, &original.job_type, &original.params)?;
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
        // From the last checkpoint it left, unless asked to start over (or it left none).
        resume: view
            .progress
            .filter(|p| from == RetryFrom::Checkpoint && p.checkpoint_key.is_some())
            .map(|p| (job_id.clone(), p)),
    };
    create(deps, &new).await
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

/// `ENABLED_JOB_TYPES`: comma-separated names of registered kinds; unset, every kind.
fn parse_enabled_job_types(vars: &Vars, registry: &Registry) -> Result<Vec<String>, ConfigError> {
    let list = vars.required("ENABLED_JOB_TYPES").ok();
    registry.enabled_names(list.as_deref()).map_err(|e| ConfigError::Invalid {
        name: "ENABLED_JOB_TYPES".into(),
        value: list.unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// The enabled kind `job_type` names and the uploads `params` read, or the 422 that says why
/// not: an unknown or disabled kind (naming the enabled ones), or params the kind refuses.
fn check_spec<'d>(
    deps: &'d Deps,
    job_type: &str,
    params: &serde_json::Value,
) -> Result<(&'d dyn DynKind, Vec<String>), Problem> {
    let kind = deps.registry.get(job_type).ok_or_else(|| {
        let known: Vec<String> = deps.registry.names().iter().map(|n| format!("{n:?}")).collect();
        Problem::unprocessable(
            "unknown-job-type",
            "Unknown job type",
            format!(
                "unknown job type {:?}; this deployment accepts {}",
                job_type.chars().take(64).collect::<String>(),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ),
        )
    })?;
    let inputs = kind.check(params).map_err(|e| {
        Problem::unprocessable("invalid-params", "Invalid job parameters", e.to_string())
    })?;
    Ok((kind, inputs))
}

async fn submit(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let body: SubmitBody =
        serde_json::from_value(json_body(request, MAX_BODY_BYTES)?).map_err(|e| {
            Problem::bad_request(format!("The body does not match the job submission schema: {e}"))
        })?;
    let (kind, inputs) = check_spec(deps, &body.job_type, &body.params)?;
    if inputs.iter().any(|input| !owns_upload(&owner, input)) {
        // Someone else's upload reads exactly like one that does not exist.
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "upload-not-found",
            "Upload not found",
            "The job's params name an upload that is not one of yours; create one with POST /uploads.",
        ));
    }
    let callback_url = match &body.callback_url {
        Some(url) => Some(validate_callback_url(url, &deps.callbacks).await?),
        None => None,
    };
    let not_before = schedule::not_before(
        body.delay_seconds.as_ref(),
        body.not_before.as_deref(),
        chrono::Utc::now(),
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
    };
    create(deps, &new).await
}

/// What a submission asks for, validated.
struct NewJob<'a> {
    owner: &'a str,
    kind: &'a dyn DynKind,
    params: &'a serde_json::Value,
    callback_url: &'a Option<String>,
    key: &'a str,
    fingerprint: &'a str,
    retry_of: Option<&'a str>,
    /// A delayed start (as stored), or `None` to start at once.
    not_before: Option<Timestamp>,
    /// Its order among the owner's waiting jobs.
    priority: Priority,
    /// A retry from the retried job's last checkpoint: that job, and its progress record.
    resume: Option<(String, ProgressRecord)>,
}

/// A retry that resumes gets, before its record is written (and so before it can be
/// dispatched), the progress record of the job it retries ([`JobStore::seed_progress`]). If
/// that write fails, it runs from the start, and its record says so (no `resumed_from`).
async fn resumable(deps: &Deps, mut job: JobRecord, new: &NewJob<'_>) -> JobRecord {
    if let Some((from, progress)) = &new.resume
        && let Err(err) = deps.jobs.seed_progress(&job.job_id, progress).await
    {
        tracing::warn!(error = %err, retry_of = from, "seeding the retry's progress failed; it runs from the start");
        job.resumed_from = None;
    }
    job
}

/// Creates the job under its idempotency key, or answers for the job the key already names.
///
/// Two conditional writes, no transaction: (1) claim the key for a fresh job id, (2) write
/// the job under that id. The request that claimed the key charges the tenant's submission
/// rate between the two, so a written job record means its creator is past every point where
/// it could refuse: what it answers is settled (`202` with that job; enqueueing cannot change
/// it, see [`enqueue`]). That record is the only mark "the original request is done" needs:
/// a request that finds the key taken answers `200` with the job as soon as the job record
/// exists ([`KeyTaken::Replay`]), and `409` only while it does not ([`KeyTaken::InFlight`]).
/// A claim older than [`IN_FLIGHT_WINDOW`] without its job was left by a request that died
/// between its writes: the next request with the same key finishes the creation itself with
/// the recorded id. The job write is conditional, so however many requests race, one job is
/// written and only its writer enqueues it and answers `202`.
///
/// Only the request that claimed the key is charged: a key that already names a live record
/// (a replay, a conflicting reuse, a request in flight) is answered without counting, and a
/// refused submission gives its claim back and writes nothing else.
async fn create(deps: &Deps, new: &NewJob<'_>) -> Result<Response<Body>, Problem> {
    let mut replacing: Option<JobId> = None;
    // A reused key races at most a few times (another request replacing the same failed job).
    for _ in 0..4 {
        let job = resumable(deps, new_job(deps, new, JobId::new()), new).await;
        logs::current_job(&job);
        let record = IdempotencyRecord {
            job_id: job.job_id.to_string(),
            fingerprint: new.fingerprint.to_owned(),
            created_at: job.created_at.to_rfc3339(),
            expires_at: chrono::Utc::now().timestamp() + deps.idempotency_ttl.as_secs() as i64,
        };
        let existing =
            match deps.jobs.claim_key(new.owner, new.key, &record, replacing.as_deref()).await {
                Ok(()) => return create_claimed(deps, new, &job).await,
                Err(StoreError::KeyTaken(existing)) => existing,
                Err(StoreError::Conflict { .. }) => {
                    replacing = None; // the record we meant to replace expired: claim afresh
                    continue;
                }
                Err(err) => return Err(internal(err)),
            };
        if existing.fingerprint != new.fingerprint {
            return Err(Problem::unprocessable(
                "idempotency-key-reused",
                "Idempotency-Key reused with a different request",
                "This Idempotency-Key was used for a different request; use a new key.",
            ));
        }
        logs::record_job_id(&tracing::Span::current(), &existing.job_id);
        let found = deps.jobs.job(&existing.job_id).await.map_err(internal)?;
        let claimed_recently = existing.created_at.parse().is_ok_and(is_recent);
        match key_taken(new.key, found, claimed_recently) {
            KeyTaken::InFlight => return Err(in_flight()),
            KeyTaken::Replay(job) => {
                logs::current_job(&job);
                return Ok(accepted(StatusCode::OK, &job, true));
            }
            KeyTaken::Replace(job_id) => replacing = Some(job_id),
            KeyTaken::Abandoned => {
                // The request that claimed the key never wrote its job: finish it.
                // The key's record names the job and its creation time; either unreadable
                // is a corrupt record, not a default.
                let corrupt = |err: &dyn std::fmt::Display| {
                    tracing::error!(error = %err, "an unreadable idempotency record");
                    Problem::internal()
                };
                let job_id = existing.job_id.parse().map_err(|e| corrupt(&e))?;
                let mut job = resumable(deps, new_job(deps, new, job_id), new).await;
                job.created_at = existing.created_at.parse().map_err(|e| corrupt(&e))?;
                logs::current_job(&job);
                match deps.jobs.put_job(&job).await {
                    Ok(()) => {
                        tracing::info!(
                            job_type = job.job_type,
                            "submitted (finishing an interrupted request)"
                        );
                        enqueue(deps, &job).await;
                        return Ok(accepted(StatusCode::ACCEPTED, &job, false));
                    }
                    Err(StoreError::Conflict { .. }) => continue, // another request finished it
                    Err(err) => return Err(internal(err)),
                }
            }
        }
    }
    Err(in_flight())
}

/// What a request that found its idempotency key taken (by a record with its own
/// fingerprint) does, decided by what the key's creation has written — never by how far the
/// job has got, beyond the statuses that free a key.
#[derive(Debug, PartialEq)]
enum KeyTaken {
    /// The key is claimed but its job not written yet, and the claim is younger than
    /// [`IN_FLIGHT_WINDOW`]: the original request is still being processed (`409`).
    InFlight,
    /// The key is claimed, its job was never written and the claim is older than
    /// [`IN_FLIGHT_WINDOW`]: its request died between its writes; this one finishes it.
    Abandoned,
    /// The key's job ended in a way that frees the key: a new job replaces it.
    Replace(JobId),
    /// The key's job exists: the original request's answer is settled, and this one is
    /// answered with the job (`200`, `Idempotent-Replayed: true`), whatever its status — a
    /// `pending` one included, even one its creator died before enqueueing (the reaper
    /// enqueues it after `LONGHAUL_PENDING_GRACE_SECONDS`, as it does when enqueueing fails).
    Replay(Box<JobRecord>),
}

/// Decides [`KeyTaken`] from the key's job as read (`None`: not written) and whether the
/// key's claim is younger than [`IN_FLIGHT_WINDOW`].
fn key_taken(key: &str, job: Option<JobRecord>, claimed_recently: bool) -> KeyTaken {
    match job {
        None if claimed_recently => KeyTaken::InFlight,
        None => KeyTaken::Abandoned,
        Some(job) => match job.status {
            JobStatus::Failed | JobStatus::Cancelled => KeyTaken::Replace(job.job_id),
            // A derived key stands for "this request": once its job's result expired, the
            // request runs again. A client's own key keeps naming its job.
            JobStatus::Expired if is_derived_key(key) => KeyTaken::Replace(job.job_id),
            JobStatus::Pending
            | JobStatus::Queued
            | JobStatus::Running
            | JobStatus::Succeeded
            | JobStatus::Expired => KeyTaken::Replay(Box::new(job)),
        },
    }
}

/// Creates the job whose key this request has just claimed: charges the tenant's submission
/// rate, writes the job record, enqueues it and answers `202`.
///
/// The charge comes before the job's write, not beside it: once the job record exists,
/// requests with the same key answer with it ([`KeyTaken::Replay`]), so it must not be
/// written by a request that may still be refused. Refused, the request gives its claim back
/// (only if it still names this request's job) and has written nothing else.
async fn create_claimed(
    deps: &Deps,
    new: &NewJob<'_>,
    job: &JobRecord,
) -> Result<Response<Body>, Problem> {
    let admitted = match within_backlog(deps, new.owner).await {
        Ok(()) => charge(deps, new.owner).await,
        Err(refused) => Err(refused),
    };
    if let Err(refused) = admitted {
        deps.jobs.release_key(new.owner, new.key, &job.job_id).await.map_err(internal)?;
        return Err(refused);
    }
    match deps.jobs.put_job(job).await {
        Ok(()) => {
            metrics::count(Metric::JobsSubmitted, job);
            // Never the params, the callback URL or the idempotency key (see `longhaul_aws::logs`).
            tracing::info!(job_type = job.job_type, retry_of = job.retry_of, "submitted");
            enqueue(deps, job).await;
            Ok(accepted(StatusCode::ACCEPTED, job, false))
        }
        // A fresh UUIDv7 is taken only when this request stalled past `IN_FLIGHT_WINDOW`
        // between its writes and another request with the key finished the creation (and
        // enqueued the job): answered as that request's replay.
        Err(StoreError::Conflict { .. }) => match deps.jobs.job(&job.job_id).await {
            Ok(Some(written)) => {
                logs::current_job(&written);
                Ok(accepted(StatusCode::OK, &written, true))
            }
            Ok(None) => {
                tracing::error!("the job record this request's write collided with is gone");
                Err(Problem::internal())
            }
            Err(err) => Err(internal(err)),
        },
        Err(err) => Err(internal(err)),
    }
}

/// Refuses (`429`) a submission of `owner` whose jobs not yet running are at the cap; checked
/// before the rate is charged, so a refused submission writes nothing.
async fn within_backlog(deps: &Deps, owner: &str) -> Result<(), Problem> {
    if deps.max_pending == 0 {
        return Ok(());
    }
    let backlog = deps.jobs.backlog(owner, deps.max_pending).await.map_err(internal)?;
    if backlog < deps.max_pending {
        return Ok(());
    }
    tracing::info!(
        backlog,
        cap = deps.max_pending,
        "submission refused: the tenant's backlog is full"
    );
    Err(Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "backlog-full",
        "Too many jobs not yet running",
        format!(
            "This principal has {} jobs that have not started yet (at most {}); submit more once some have started.",
            backlog, deps.max_pending
        ),
    )
    .with("max_pending", deps.max_pending)
    .header(header::RETRY_AFTER, BACKLOG_RETRY_AFTER_SECONDS.to_string()))
}

/// Counts a submission of `owner` against its per-minute limit, or refuses it (`429`).
async fn charge(deps: &Deps, owner: &str) -> Result<(), Problem> {
    match deps.limiter.charge(owner).await {
        Ok(Admission::Admitted) => Ok(()),
        Ok(Admission::Limited { retry_after }) => {
            tracing::info!(retry_after, "submission refused: the tenant's rate limit is reached");
            Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "Too many submissions",
                format!(
                    "This principal has used its submissions for this minute; retry in {retry_after} s."
                ),
            )
            .header(header::RETRY_AFTER, retry_after.to_string()))
        }
        Err(err) => {
            tracing::error!(error = %err, "the submission rate limiter failed");
            Err(Problem::internal())
        }
    }
}

fn in_flight() -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "request-in-flight",
        "The original request is still in progress",
        "A request with this Idempotency-Key is still being processed; retry shortly.",
    )
    .header(header::RETRY_AFTER, "1")
}

fn internal(err: StoreError) -> Problem {
    tracing::error!(error = %err, "job store failed");
    Problem::internal()
}

/// How long resolving a callback host may take at submission.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Validates a callback URL now (delivery checks again, against the address it connects
/// to): `https`, no credentials, and a host that is — and resolves only to — public
/// addresses. Returns the normalised URL.
async fn validate_callback_url(raw: &str, policy: &CallbackPolicy) -> Result<String, Problem> {
    let invalid = |detail: String| {
        Problem::unprocessable("invalid-callback-url", "Invalid callback URL", detail)
    };
    let url = parse_callback_url(raw, policy).map_err(|e| invalid(e.to_string()))?;
    if let Host::Domain(name) = url.host() {
        let lookup = tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tokio::net::lookup_host((name.as_str(), url.port())),
        )
        .await;
        let addresses: Vec<_> = match lookup {
            Ok(Ok(addresses)) => addresses.collect(),
            _ => return Err(invalid(format!("The callback host {name} does not resolve."))),
        };
        if addresses.is_empty() {
            return Err(invalid(format!("The callback host {name} does not resolve.")));
        }
        for address in addresses {
            check_address(address.ip(), policy).map_err(|_| {
                invalid(format!("The callback host {name} resolves to a non-public address."))
            })?;
        }
    }
    Ok(url.as_str().to_owned())
}

fn is_recent(created_at: Timestamp) -> bool {
    Timestamp::now().since(created_at) < IN_FLIGHT_WINDOW
}

fn new_job(deps: &Deps, new: &NewJob<'_>, job_id: JobId) -> JobRecord {
    let now = Timestamp::now();
    JobRecord {
        job_id,
        owner: new.owner.to_owned(),
        job_type: new.kind.name().to_owned(),
        params: new.params.clone(),
        status: JobStatus::Pending,
        attempt: 0,
        lease: None,
        execution: None,
        idempotency_key: new.key.to_owned(),
        fingerprint: new.fingerprint.to_owned(),
        callback_url: new.callback_url.clone(),
        created_at: now,
        updated_at: now,
        started_at: None,
        finished_at: None,
        error: None,
        result_key: None,
        transitions: vec![Transition {
            state: JobStatus::Pending,
            at: now.to_rfc3339(),
            reason: "submitted".into(),
        }],
        injected_failures: 0,
        retry_of: new.retry_of.map(str::to_owned),
        cancellation: None,
        continuations: 0,
        dispatches: 0,
        enqueues: 0,
        priority: new.priority,
        policy: Some(stored_policy(new.kind, &deps.policy_overrides)),
        resumed_from: new.resume.as_ref().map(|(from, progress)| ResumedFrom {
            job_id: from.clone(),
            stage: progress.stage.clone(),
            items_done: progress.items_done,
        }),
        waiting: None,
        stalled_at: None,
        not_before: new.not_before,
        retry_at: None,
        last_error: None,
    }
}

/// Enqueues the job. A failure here leaves the job `pending`: it is already durable, and the
/// reaper re-enqueues pending jobs that were never dispatched, so the client still gets 202.
///
/// A delayed job's message is delayed until its start when SQS can hold it that long (15
/// minutes); a later start is not enqueued now: the reaper enqueues it 15 minutes before
/// (its pending index entry is keyed then — `longhaul_domain::schedule`).
async fn enqueue(deps: &Deps, job: &JobRecord) {
    let now = chrono::Utc::now();
    let start = job.not_before.map(Timestamp::as_datetime);
    let delay = match start {
        Some(at) if (at - now).num_seconds() > schedule::MAX_SQS_DELAY_SECONDS => {
            tracing::info!(not_before = %at, "delayed; the reaper enqueues it when due");
            return;
        }
        Some(at) => schedule::sqs_delay(at, now),
        None => 0,
    };
    let message = DispatchMessage { job_id: job.job_id.to_string() };
    if let Err(err) = deps.intake.send_delayed(&message, delay, &job.owner).await {
        tracing::error!(error = %err, "enqueueing failed; the job stays pending for the reaper");
    }
}

fn accepted(status: StatusCode, job: &JobRecord, replay: bool) -> Response<Body> {
    let location = format!("/jobs/{}", job.job_id);
    let mut body = json!({
        "job_id": job.job_id,
        "status": job.status,
        "status_url": location,
        "created_at": job.created_at,
    });
    if let Some(retry_of) = &job.retry_of {
        body["retry_of"] = retry_of.clone().into();
    }
    let mut response = json_response(status, &body);
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, location.parse().expect("job ids are header-safe"));
    headers.insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().expect("static"));
    if replay {
        headers.insert(IDEMPOTENT_REPLAYED, header::HeaderValue::from_static("true"));
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
        let first = longhaul_jobs::registry().names()[0];
        assert_eq!(
            Config::from_vars(&vars(&[])).unwrap().enabled_job_types,
            longhaul_jobs::registry().names()
        );
        assert_eq!(
            Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", &format!(" {first} "))]))
                .unwrap()
                .enabled_job_types,
            vec![first.to_owned()]
        );
        let unknown = format!("{first},nope");
        assert!(Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", &unknown)])).is_err());
    }

    #[test]
    fn every_kinds_policy_is_stored_as_it_publishes_it_with_overrides_applied() {
        let registry = longhaul_jobs::registry();
        let none = PolicyOverrides::default();
        for kind in registry.kinds() {
            let stored = serde_json::to_value(stored_policy(kind, &none)).unwrap();
            let published = serde_json::to_value(kind.policy()).unwrap();
            for field in ["max_attempts", "max_runtime_seconds", "result_retention_seconds"] {
                assert_eq!(stored[field], published[field], "{} {field}", kind.name());
            }
            assert_eq!(stored["checkpoint"], published["checkpoint"], "{}", kind.name());
            assert_eq!(stored["worker"], published["worker"], "{}", kind.name());
        }
        let name = registry.names()[0];
        let overrides =
            PolicyOverrides::parse(&format!(r#"{{"{name}": {{"max_attempts": 9}}}}"#), &[name])
                .unwrap();
        let kind = registry.get(name).unwrap();
        assert_eq!(stored_policy(kind, &overrides).max_attempts, 9);
        // The stored default is the worker API's default.
        let default = serde_json::to_value(longhaul_worker::Policy::default()).unwrap();
        let default: JobPolicy = serde_json::from_value(default).unwrap();
        assert_eq!(default, JobPolicy::default());
    }

    /// A job record as submit writes it, in `status`.
    fn job_in(status: JobStatus) -> JobRecord {
        let now = Timestamp::now().to_rfc3339();
        serde_json::from_value(json!({
            "job_id": JobId::new(),
            "owner": "alice",
            "type": "demo",
            "params": {"items": 1},
            "status": status,
            "attempt": 0,
            "idempotency_key": "order-42",
            "fingerprint": "f",
            "created_at": now,
            "updated_at": now,
            "transitions": [],
        }))
        .unwrap()
    }

    fn replayed(decision: KeyTaken) -> JobRecord {
        match decision {
            KeyTaken::Replay(job) => *job,
            other => panic!("not a replay: {other:?}"),
        }
    }

    #[test]
    fn a_written_job_is_replayed_however_young_even_pending() {
        // The first request wrote its job and may not have enqueued it yet (or died before
        // it): the job exists, so the answer is the job, not "still in progress".
        for recently in [true, false] {
            let job = job_in(JobStatus::Pending);
            assert_eq!(replayed(key_taken("order-42", Some(job.clone()), recently)), job);
        }
        for status in [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded] {
            let job = job_in(status);
            assert_eq!(replayed(key_taken("order-42", Some(job.clone()), true)), job);
        }
    }

    #[test]
    fn only_a_claim_without_its_job_is_in_flight_and_only_for_the_window() {
        assert_eq!(key_taken("order-42", None, true), KeyTaken::InFlight);
        assert_eq!(key_taken("order-42", None, false), KeyTaken::Abandoned);
        let young = Timestamp::now();
        assert!(is_recent(young));
        let old: Timestamp = (chrono::Utc::now()
            - chrono::Duration::from_std(IN_FLIGHT_WINDOW).unwrap()
            - chrono::Duration::seconds(1))
        .into();
        assert!(!is_recent(old));
    }

    #[test]
    fn a_failed_cancelled_or_derived_expired_job_frees_its_key() {
        for status in [JobStatus::Failed, JobStatus::Cancelled] {
            let job = job_in(status);
            assert_eq!(
                key_taken("order-42", Some(job.clone()), true),
                KeyTaken::Replace(job.job_id)
            );
        }
        let expired = job_in(JobStatus::Expired);
        let derived = derived_idempotency_key("alice", "f");
        assert_eq!(
            key_taken(&derived, Some(expired.clone()), false),
            KeyTaken::Replace(expired.job_id.clone())
        );
        // A client's own key keeps naming its job.
        assert_eq!(replayed(key_taken("order-42", Some(expired.clone()), false)), expired);
    }

    #[test]
    fn a_replay_answers_200_with_the_job_its_location_and_the_replayed_mark() {
        let job = job_in(JobStatus::Pending);
        let replay = accepted(StatusCode::OK, &job, true);
        assert_eq!(replay.status(), StatusCode::OK);
        let location = format!("/jobs/{}", job.job_id);
        assert_eq!(replay.headers()[header::LOCATION], location.as_str());
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        let Body::Binary(bytes) = replay.body() else { panic!("a JSON body") };
        let body: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(body["job_id"], job.job_id.as_str());
        assert_eq!(body["status_url"], location.as_str());

        let first = accepted(StatusCode::ACCEPTED, &job, false);
        assert_eq!(first.status(), StatusCode::ACCEPTED);
        assert_eq!(first.headers()[header::LOCATION], location.as_str());
        assert!(first.headers().get(IDEMPOTENT_REPLAYED).is_none());
    }

    #[test]
    fn in_flight_is_a_409_with_retry_after() {
        let problem = in_flight().into_response();
        assert_eq!(problem.status(), StatusCode::CONFLICT);
        assert_eq!(problem.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn bad_policy_overrides_stop_the_start() {
        let err = Config::from_vars(&vars(&[("LONGHAUL_POLICY_OVERRIDES", r#"{"nope": {}}"#)]));
        assert!(err.is_err());
        assert!(Config::from_vars(&vars(&[("LONGHAUL_POLICY_OVERRIDES", "")])).is_ok());
    }
}
