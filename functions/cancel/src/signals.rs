//! `POST /jobs/{id}/signals/{name}` — the owner sends a job signal `name` — and
//! `POST /jobs/{id}/signals/{name}/{token}` — whoever holds the link a waiting job's view offers
//! sends it (no bearer token: the link's token, an HMAC checked before any read, is the
//! credential). Body `{"payload"?: <any JSON>}`, the payload at most 64 KB.
//!
//! A job receives each name once. The first signal of a name is kept: a job waiting for it is
//! resumed at once (`202`, `pending`, dispatched again; its stage's wait answers the payload);
//! a job not waiting yet gets it when its wait starts (`202`, its status unchanged). A second
//! signal of a name, or one after its wait timed out, is `409`; so is a signal to a job waiting
//! for another one (the problem says which it waits for), or to a job that has ended.

use lambda_http::http::StatusCode;
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_aws::api::{Problem, json_body, json_response, path_job_id, principal, wrong_status};
use longhaul_aws::jobs::{JobRecord, ResumeOutcome, SignalKept, SignalRecord, StoreError};
use longhaul_aws::logs;
use longhaul_aws::queue::DispatchMessage;
use longhaul_domain::signals::{self, MAX_PAYLOAD_BYTES, MAX_SIGNALS_PER_JOB, SignalName};
use longhaul_domain::{JobId, JobStatus, Timestamp};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Deps, internal};

/// The body of a signal.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalBody {
    #[serde(default)]
    payload: Value,
}

/// `POST /jobs/{id}/signals/{name}`: the owner's signal.
pub(crate) async fn by_owner(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let owner = principal(request).ok_or_else(Problem::unauthorized)?;
    let (job_id, name) = path(request)?;
    let payload = payload(request)?;
    let job = deps.jobs.job(&job_id).await.map_err(internal)?;
    let job = job.filter(|job| job.owner == owner).ok_or_else(Problem::not_found)?;
    deliver(deps, job, &name, payload, Sender::Owner).await
}

/// Who sends a signal: the job's owner, or the holder of a link for one signal (who is told
/// nothing of the job's other signals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    Owner,
    Link,
}

/// `POST /jobs/{id}/signals/{name}/{token}`: a signal by the waiting job's link. The token is
/// checked before anything is read.
pub(crate) async fn by_link(deps: &Deps, request: &Request) -> Result<Response<Body>, Problem> {
    let (job_id, name) = path(request)?;
    let token = request.path_parameters().first("token").unwrap_or_default().to_owned();
    let key = deps.token_key.get().await.map_err(|err| {
        tracing::error!(error = %err, "reading the signal token key failed");
        Problem::internal()
    })?;
    let now = deps.clock.now().timestamp();
    signals::verify(key.expose_secret().as_bytes(), &token, &job_id, &name, now).map_err(
        |err| {
            tracing::info!(reason = %err, "signal token refused");
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "invalid-signal-link",
                "The signal link is not valid",
                "The link is unknown, altered, or past its expiry: ask the job's owner for its current link.",
            )
        },
    )?;
    let payload = payload(request)?;
    let job = deps.jobs.job(&job_id).await.map_err(internal)?.ok_or_else(Problem::not_found)?;
    deliver(deps, job, &name, payload, Sender::Link).await
}

/// The path's job id and signal name (`404` for a malformed id, `400` for a bad name).
fn path(request: &Request) -> Result<(JobId, SignalName), Problem> {
    let job_id = path_job_id(request)?;
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let name = request.path_parameters().first("name").unwrap_or_default().to_owned();
    let name = name.parse::<SignalName>().map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok((job_id, name))
}

/// The body's payload (none: `null`), at most [`MAX_PAYLOAD_BYTES`] of JSON.
fn payload(request: &Request) -> Result<Value, Problem> {
    if request.body().as_ref().is_empty() {
        return Ok(Value::Null);
    }
    let value = json_body(request, MAX_PAYLOAD_BYTES + 1024)?;
    let body: SignalBody = serde_json::from_value(value)
        .map_err(|e| Problem::bad_request(format!("The body is not {{\"payload\"?}}: {e}")))?;
    let size = serde_json::to_vec(&body.payload).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD_BYTES {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "The signal's payload is too large",
            format!("A payload is at most {MAX_PAYLOAD_BYTES} bytes of JSON; this one is {size}."),
        ));
    }
    Ok(body.payload)
}

/// Keeps signal `name` for `job` and resumes the job if it waits for it.
async fn deliver(
    deps: &Deps,
    job: JobRecord,
    name: &SignalName,
    payload: Value,
    sender: Sender,
) -> Result<Response<Body>, Problem> {
    logs::current_job(&job);
    if job.status.is_terminal() {
        return Err(wrong_status(job.status, format!("The job is already {}.", job.status)));
    }
    if job.status == JobStatus::Compensating {
        return Err(wrong_status(
            job.status,
            "The job is ending: it undoes its stages, and waits for no signal.".to_owned(),
        ));
    }
    let waits_for = job.pause.as_ref().and_then(|p| p.wait.as_ref()).map(|w| w.signal.clone());
    if let Some(other) = waits_for.as_ref().filter(|other| *other != name) {
        let detail = match sender {
            Sender::Owner => format!("The job waits for signal {other}, not {name}."),
            Sender::Link => format!("The job waits for another signal, not {name}."),
        };
        return Err(wrong_status(job.status, detail));
    }
    let now = Timestamp::from(deps.clock.now());
    let kept = match deps.jobs.put_signal(&job.job_id, name, &payload, now).await {
        Ok(kept) => kept,
        Err(StoreError::Conflict { current: None }) => return Err(Problem::not_found()),
        Err(err) => return Err(internal(err)),
    };
    if kept == SignalKept::Full {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "too-many-signals",
            "The job keeps as many signals as it may",
            format!(
                "A job keeps at most {MAX_SIGNALS_PER_JOB} signals, one per name; this one has \
                 them all. Signal names the job will wait for, or submit a new job."
            ),
        ));
    }
    if kept == SignalKept::Taken {
        // Kept before — and if the job still waits for it, the sender that kept it did not
        // get to resume it (it failed after the write): resumed now, so no wake-up is lost.
        if waits_for.as_ref() == Some(name)
            && job.status == JobStatus::Paused
            && let Some(SignalRecord::Received { .. }) =
                deps.jobs.signal(&job.job_id, name).await.map_err(internal)?
        {
            resume(deps, &job, name, now).await?;
        }
        let waits = match (sender, waits_for) {
            (Sender::Owner, Some(w)) if &w != name => format!(" It waits for {w}."),
            _ => String::new(),
        };
        return Err(wrong_status(
            job.status,
            format!("Signal {name} was already sent to this job (or its wait timed out).{waits}"),
        ));
    }
    tracing::info!(signal = %name, "signal kept");
    // Read again: the job may have parked for this signal since the read above (its stage
    // reads the signal after parking too, so one of the two resumes it).
    let job = deps.jobs.job(&job.job_id).await.map_err(internal)?.unwrap_or(job);
    let waiting = job.status == JobStatus::Paused
        && job.pause.as_ref().and_then(|p| p.wait.as_ref()).is_some_and(|w| &w.signal == name);
    let status = if waiting { resume(deps, &job, name, now).await? } else { job.status };
    Ok(json_response(
        StatusCode::ACCEPTED,
        &json!({"job_id": job.job_id, "signal": name, "status": status}),
    ))
}

/// Resumes `job`, parked waiting for the signal just kept, and enqueues it; its status now.
async fn resume(
    deps: &Deps,
    job: &JobRecord,
    name: &SignalName,
    now: Timestamp,
) -> Result<JobStatus, Problem> {
    match deps.jobs.resume(job, &format!("signal {name} came"), now).await {
        Ok(ResumeOutcome::Resumed(resumed)) => {
            let message = DispatchMessage::new(job.job_id.clone());
            if let Err(err) = deps.intake.send(&message, &resumed.owner).await {
                // Pending again either way: the reaper's pending sweep enqueues it.
                tracing::error!(error = %err, "enqueueing the resumed job failed; the reaper enqueues it");
            }
            tracing::info!("the job waited for the signal; resumed");
            Ok(resumed.status)
        }
        Ok(ResumeOutcome::Withdrawn(running)) => Ok(running.status),
        // Resumed first by its stage (which read the signal after parking).
        Err(StoreError::Conflict { current }) => {
            Ok(current.map_or(JobStatus::Pending, |job| job.status))
        }
        Err(err) => Err(internal(err)),
    }
}
