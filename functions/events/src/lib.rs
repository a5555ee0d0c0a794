//! **events** — `GET /jobs/{id}/events?token=…`: a `text/event-stream` of a job's progress,
//! then its terminal status, served with Lambda response streaming through a function URL
//! (HTTP APIs cannot stream; a function URL in `RESPONSE_STREAM` mode can, for up to the
//! function's 15 minutes, and the client reconnects with `Last-Event-ID` after that).
//!
//! The URL's token (from `GET /jobs/{id}`) names one job and its owner and expires within
//! minutes, so the stream is tenant-scoped without an `Authorization` header (which
//! `EventSource` cannot send). The token is checked before anything is read
//! ([`stream_token::verify`] needs only the key, the token and the path's job id): a missing,
//! malformed, tampered, expired or other job's token is a `401` that costs no DynamoDB call.
//! Only then is the job read, and it must still belong to the owner the token names (else
//! `404`, as for a job that no longer exists).
//!
//! Each event's `id:` is the progress sequence number; a reconnect with `Last-Event-ID: n`
//! resumes with the first state after `n`, never repeating one ([`last_event_id`] says which
//! values are accepted). A comment line every 15 s keeps proxies from closing an idle stream;
//! the stream ends after the terminal event.
//!
//! Each stream holds a slot of its job, of its owner and of the deployment ([`StreamSlots`]: at
//! most `LONGHAUL_MAX_STREAMS_PER_JOB`, `LONGHAUL_MAX_STREAMS_PER_TENANT` and
//! `LONGHAUL_MAX_STREAMS` open at once — the last below the function's reserved concurrency,
//! so streams past it are refused with a `429` rather than throttled by Lambda), taken
//! after the token check and the job read, before the stream starts: over a cap the request is
//! a `429` with `Retry-After`. The slot is a lease that expires a minute after the stream's
//! longest duration; the stream gives it back when it ends (or its client goes away), and a
//! crashed invocation's lease simply expires.

pub mod lambda;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use http_body_util::StreamBody;
use lambda_http::http::{HeaderMap, HeaderValue, StatusCode, header};
use lambda_http::{Request, RequestExt, Response};
use longhaul_aws::api::Problem;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobStore, JobView};
use longhaul_aws::limits::{SlotError, StreamLease, StreamSlots};
use longhaul_aws::logs;
use longhaul_aws::ports::{Clock, JobReads, SigningKey, StreamCaps, SystemClock};
use longhaul_aws::secrets::SecretKey;
use longhaul_domain::progress::ProgressView;
use longhaul_domain::{JobId, JobStatus, stream_token};
use secrecy::ExposeSecret;
use serde_json::json;
use tracing::Instrument;

/// The streamed body.
pub type EventBody =
    StreamBody<Pin<Box<dyn Stream<Item = Result<http_body::Frame<Bytes>, Infallible>> + Send>>>;

/// The function's configuration (its `Debug` redacts the token key).
#[derive(Clone)]
pub struct Config {
    /// `TABLE_NAME`.
    pub table: String,
    /// `STREAM_TOKEN_SECRET_ARN`: the Secrets Manager secret whose value signs stream tokens
    /// (read at init, never from the environment).
    pub token_secret_arn: String,
    /// `LONGHAUL_STREAM_POLL_MS` (1,000): how often the job is read while streaming.
    pub poll: Duration,
    /// `LONGHAUL_STREAM_KEEPALIVE_SECONDS` (15): idle comment interval.
    pub keepalive: Duration,
    /// `LONGHAUL_STREAM_MAX_SECONDS` (840): when a stream ends for the client to reconnect
    /// (before the function's 15-minute limit).
    pub max_duration: Duration,
    /// `LONGHAUL_MAX_STREAMS_PER_JOB` (5; 0 = no cap): streams one job may have open.
    pub max_streams_per_job: usize,
    /// `LONGHAUL_MAX_STREAMS_PER_TENANT` (20; 0 = no cap): streams one owner may have open.
    pub max_streams_per_tenant: usize,
    /// `LONGHAUL_MAX_STREAMS` (90; 0 = no cap): streams the deployment may have open, kept
    /// below the function's reserved concurrency (100 by default).
    pub max_streams: usize,
}

/// How long a stream's slot lease outlives the stream's longest duration: a crashed
/// invocation's slot frees this long after the stream would have ended anyway.
pub const LEASE_MARGIN: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("table", &self.table)
            .field("token_secret_arn", &self.token_secret_arn)
            .field("poll", &self.poll)
            .field("keepalive", &self.keepalive)
            .field("max_duration", &self.max_duration)
            .field("max_streams_per_job", &self.max_streams_per_job)
            .field("max_streams_per_tenant", &self.max_streams_per_tenant)
            .field("max_streams", &self.max_streams)
            .finish()
    }
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            token_secret_arn: vars.required("STREAM_TOKEN_SECRET_ARN")?,
            poll: Duration::from_millis(vars.parsed_or("LONGHAUL_STREAM_POLL_MS", 1_000)?),
            keepalive: Duration::from_secs(
                vars.parsed_or("LONGHAUL_STREAM_KEEPALIVE_SECONDS", 15)?,
            ),
            max_duration: Duration::from_secs(vars.parsed_or("LONGHAUL_STREAM_MAX_SECONDS", 840)?),
            max_streams_per_job: vars.parsed_or("LONGHAUL_MAX_STREAMS_PER_JOB", 5)?,
            max_streams_per_tenant: vars.parsed_or("LONGHAUL_MAX_STREAMS_PER_TENANT", 20)?,
            max_streams: vars.parsed_or("LONGHAUL_MAX_STREAMS", 90)?,
        })
    }
}

/// What the handler needs, built once per sandbox: its ports and settings.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table (read only).
    pub jobs: Arc<dyn JobReads>,
    /// The open-stream caps (leases in the job table).
    pub slots: Arc<dyn StreamCaps>,
    /// The key stream tokens are signed with.
    pub token_key: Arc<dyn SigningKey>,
    /// What time it is: whether a token has expired, when a stream's slot lease does, and
    /// what a stream's time limit and keepalives are measured by.
    pub clock: Arc<dyn Clock>,
    /// Settings.
    pub config: Config,
}

impl Deps {
    /// What init warms ([`longhaul_aws::sdk::warm_up`]), what the first event uses: the table, and the stream tokens' signing key.
    pub fn warm_set(&self) -> Vec<std::sync::Arc<dyn longhaul_aws::ports::Warm>> {
        vec![
            self.jobs.clone() as std::sync::Arc<dyn longhaul_aws::ports::Warm>,
            self.token_key.clone(),
        ]
    }

    /// Builds the AWS adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        Deps {
            jobs: Arc::new(JobStore::new(dynamodb.clone(), config.table.clone())),
            slots: Arc::new(StreamSlots::new(
                dynamodb,
                config.table.clone(),
                config.max_streams_per_job,
                config.max_streams_per_tenant,
                config.max_streams,
            )),
            token_key: Arc::new(SecretKey::new(
                longhaul_aws::client::LazyClient::of(sdk, aws_sdk_secretsmanager::Client::new),
                config.token_secret_arn.clone(),
            )),
            clock: Arc::new(SystemClock),
            config: config.clone(),
        }
    }
}

fn body(stream: impl Stream<Item = Bytes> + Send + 'static) -> EventBody {
    use futures::StreamExt;
    StreamBody::new(Box::pin(stream.map(|bytes| Ok(http_body::Frame::data(bytes)))))
}

fn problem_response(problem: Problem) -> Response<EventBody> {
    let (parts, content) = problem.into_response().into_parts();
    let bytes = Bytes::copy_from_slice(content.as_ref());
    Response::from_parts(parts, body(futures::stream::iter([bytes])))
}

/// Handles one request: a problem, or the event stream.
///
/// The request and every poll of the stream run in a `job` span ([`logs`]): the job id from
/// the path; the attempt and the principal (the job's owner, whom the token names) once the
/// token is verified and its owner matched against the job record. The token itself is
/// never logged (a refusal logs only its reason).
pub async fn handle(deps: Arc<Deps>, request: Request) -> Response<EventBody> {
    let span = logs::job_span(None, None, None);
    match open(&deps, &request).instrument(span.clone()).await {
        Ok((view, after, lease)) => {
            span.in_scope(|| tracing::info!(last_event_id = after, "stream opened"));
            let slot = Slot { deps: deps.clone(), lease: Some(lease) };
            let stream = stream(deps, view.job.job_id.clone(), view.job.attempt, after, span, slot);
            let mut response = Response::new(body(stream));
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(problem) => problem_response(problem),
    }
}

/// Checks the token and `Last-Event-ID` (both before any read), then reads the job and takes
/// a stream slot; returns the job, the last event id the client has and the slot's lease.
async fn open(deps: &Deps, request: &Request) -> Result<(JobView, u64, StreamLease), Problem> {
    // Function URLs have no routes (and no path parameters): the path is ours to read.
    let job_id =
        match request.uri().path().trim_matches('/').split('/').collect::<Vec<_>>().as_slice() {
            ["jobs", id, "events"] => id.parse::<JobId>().map_err(|_| Problem::not_found())?,
            _ => return Err(Problem::not_found()),
        };
    logs::record_job_id(&tracing::Span::current(), &job_id);
    let query = request.query_string_parameters();
    let token = query.first("token").unwrap_or_default();
    // Before any read: refusing a forged token must not cost a DynamoDB call (nor tell
    // whether the job exists). The key is in memory after the sandbox's first request.
    let key = deps.token_key.get().await.map_err(|err| {
        tracing::error!(error = %err, "reading the stream token key failed");
        Problem::internal()
    })?;
    let grant = stream_token::verify(
        key.expose_secret().as_bytes(),
        token,
        &job_id,
        deps.clock.now().timestamp(),
    )
    .map_err(|err| {
        tracing::info!(reason = %err, "stream token refused");
        token_problem(err)
    })?;
    let after = last_event_id(request.headers())?;
    let view = deps.jobs.view(&job_id).await.map_err(|err| {
        tracing::error!(error = %err, "reading the job failed");
        Problem::internal()
    })?;
    // A job that no longer exists, or (defence in depth) is not the token's owner's, reads
    // the same.
    let view = view.filter(|v| v.job.owner == grant.owner).ok_or_else(Problem::not_found)?;
    logs::current_job(&view.job);
    let expiry =
        deps.clock.now().timestamp() + (deps.config.max_duration + LEASE_MARGIN).as_secs() as i64;
    let lease = deps.slots.acquire(&grant.owner, &job_id, expiry).await.map_err(|err| match err {
        SlotError::Full { scope, full } => {
            tracing::info!(scope, open = full.open, cap = full.cap, "stream refused: too many open");
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-streams",
                "Too many open streams",
                format!(
                    "This {scope} already has {} progress streams open (at most {}); close one or retry later.",
                    full.open, full.cap
                ),
            )
            .header(header::RETRY_AFTER, full.retry_after.to_string())
        }
        SlotError::Aws(err) => {
            tracing::error!(error = %err, "taking a stream slot failed");
            Problem::internal()
        }
    })?;
    Ok((view, after, lease))
}

/// A stream's slot lease, given back when the stream ends ([`Slot::release`]) or, if the
/// stream is dropped first (its client went away), from `Drop` on a spawned task.
struct Slot {
    deps: Arc<Deps>,
    lease: Option<StreamLease>,
}

impl Slot {
    async fn release(&mut self) {
        if let Some(lease) = self.lease.take()
            && let Err(err) = self.deps.slots.release(&lease).await
        {
            // Not lost: the lease expires on its own (LEASE_MARGIN after the longest stream).
            tracing::warn!(error = %err, "releasing the stream slot failed; its lease will expire");
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        let deps = self.deps.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(err) = deps.slots.release(&lease).await {
                        tracing::warn!(error = %err, "releasing the stream slot failed; its lease will expire");
                    }
                });
            }
            Err(_) => {
                tracing::warn!("no runtime to release the stream slot; its lease will expire")
            }
        }
    }
}

/// The `401` for a refused stream token. An expired one says so (only authentic tokens are
/// told apart as expired), so a client knows to fetch a fresh link.
fn token_problem(err: stream_token::TokenError) -> Problem {
    let detail = match err {
        stream_token::TokenError::Expired => {
            "The stream link has expired. Get a fresh events_url from GET /jobs/{id}."
        }
        stream_token::TokenError::Malformed | stream_token::TokenError::BadSignature => {
            "The stream link's token is missing or invalid. Use the events_url from GET /jobs/{id}."
        }
    };
    Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", detail)
}

/// The last event id a reconnecting client has, from its `Last-Event-ID` header.
///
/// Absent, empty or blank (what `EventSource` means by no id) is `0`: from the start. Otherwise
/// it must be a decimal event id this stream can have sent — ASCII digits only, at most
/// `u64::MAX - 1` (the terminal event's id is one more than the last one, and must not
/// overflow). Anything else (negative, signed, not a number, too large, non-ASCII, several
/// values) is a `400`, never a panic or a wrapped number.
pub fn last_event_id(headers: &HeaderMap) -> Result<u64, Problem> {
    let Some(value) = headers.get("last-event-id") else { return Ok(0) };
    let bad = || {
        Problem::bad_request(
            "Last-Event-ID must be the decimal id of an event from this stream, or absent.",
        )
    };
    let text = value.to_str().map_err(|_| bad())?.trim();
    if text.is_empty() {
        return Ok(0);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse::<u64>().ok().filter(|id| id.checked_add(1).is_some()).ok_or_else(bad)
}

fn event(id: u64, kind: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: {kind}\ndata: {data}\n\n"))
}

/// Where a stream is.
struct State {
    deps: Arc<Deps>,
    job_id: JobId,
    /// The attempt the span shows.
    attempt: u32,
    /// The request's `job` span: every poll runs in it.
    span: tracing::Span,
    /// The stream's slot, released when the stream ends.
    slot: Slot,
    last_id: u64,
    last_sent: Instant,
    ends_at: Instant,
    done: bool,
    first: bool,
    /// Whether the last progress event sent was already the job's end
    /// ([`ProgressView::is_ended`]): a succeeded job's stream ends with that view before its
    /// status event, whatever the worker's last write said.
    complete_sent: bool,
    /// The live status the last progress event said (`None`: none sent yet): a move between
    /// live statuses that writes no progress — a pause, a resume — is sent as a progress event
    /// of its own, so a follower sees a job paused.
    status_sent: Option<JobStatus>,
}

/// The events of one job after event id `after`.
fn stream(
    deps: Arc<Deps>,
    job_id: JobId,
    attempt: u32,
    after: u64,
    span: tracing::Span,
    slot: Slot,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let started = deps.clock.instant();
    let state = State {
        ends_at: started + deps.config.max_duration,
        deps,
        job_id,
        attempt,
        span,
        slot,
        last_id: after,
        last_sent: started,
        done: false,
        first: true,
        status_sent: None,
        complete_sent: false,
    };
    futures::stream::unfold(state, |st| {
        let span = st.span.clone();
        poll(st).instrument(span)
    })
}

/// A `progress` event's data: the job, its status and `shown`, its progress as
/// `GET /jobs/{id}` shows it.
fn progress_data(view: &JobView, shown: ProgressView) -> serde_json::Value {
    let mut data = serde_json::to_value(shown).expect("progress views serialise");
    data["job_id"] = json!(view.job.job_id);
    data["status"] = json!(view.job.status);
    data["unit"] = view.job.progress_unit().into();
    data
}

/// One step of the stream: the next chunk to send, or its end.
async fn poll(mut st: State) -> Option<(Bytes, State)> {
    if st.done {
        st.slot.release().await;
        return None;
    }
    if std::mem::take(&mut st.first) {
        // Tell EventSource how soon to reconnect after the stream ends.
        return Some((Bytes::from_static(b"retry: 1000\n\n"), st));
    }
    loop {
        if st.deps.clock.instant() >= st.ends_at {
            st.done = true;
            tracing::info!(
                last_event_id = st.last_id,
                "stream ended at its time limit; the client reconnects"
            );
            return Some((
                Bytes::from_static(b": reconnect with Last-Event-ID to continue\n\n"),
                st,
            ));
        }
        let view = match st.deps.jobs.view(&st.job_id).await {
            Ok(Some(view)) => view,
            Ok(None) => {
                st.done = true;
                return Some((
                    Bytes::from_static(
                        b"event: error\ndata: {\"detail\":\"the job no longer exists\"}\n\n",
                    ),
                    st,
                ));
            }
            Err(err) => {
                tracing::warn!(error = %err, "reading the job failed; retrying");
                tokio::time::sleep(st.deps.config.poll).await;
                continue;
            }
        };
        if view.job.attempt != st.attempt {
            st.attempt = view.job.attempt;
            logs::record_attempt(&st.span, st.attempt);
        }
        let seq = view.progress.as_ref().map(|p| p.event_seq()).unwrap_or(0);
        if view.job.status == JobStatus::Succeeded && !st.complete_sent && st.last_id <= seq {
            // A progress bar ends full: the worker's last progress write may predate the end
            // of its last items (writes are spaced), so the stream sends the job's end itself —
            // the view `GET /jobs/{id}` shows ([`ProgressView::for_status`]) — as event
            // `seq + 1` (the status is `seq + 2`: a client that saw it resumes past it).
            st.complete_sent = true;
            st.last_id = seq.max(st.last_id).saturating_add(1);
            let shown = view.shown_progress();
            return Some((event(st.last_id, "progress", &progress_data(&view, shown)), st));
        }
        if view.job.status.is_terminal() {
            st.done = true;
            tracing::info!(status = %view.job.status, "stream ended: the job is terminal");
            // `last_id` is at most u64::MAX - 1 (`last_event_id`); saturating keeps a corrupt
            // record's seq from panicking or wrapping to 0.
            let id = seq.max(st.last_id).saturating_add(1);
            let mut data = json!({ "job_id": view.job.job_id, "status": view.job.status });
            if let Some(error) = &view.job.error {
                data["error"] = json!({ "code": error.code, "message": error.message });
            }
            if view.job.status == JobStatus::Succeeded {
                // Not once expired: the result is gone.
                data["result_url"] = format!("/jobs/{}/result", view.job.job_id).into();
            }
            return Some((event(id, "status", &data), st));
        }
        let status_moved = st.status_sent.is_some_and(|sent| sent != view.job.status);
        if let Some(progress) =
            view.progress.as_ref().filter(|p| p.event_seq() > st.last_id || status_moved)
        {
            // (A status move alone repeats the last event's id: no new progress to resume past.)
            st.last_id = progress.event_seq().max(st.last_id);
            st.last_sent = st.deps.clock.instant();
            st.status_sent = Some(view.job.status);
            let shown =
                progress.recorded().for_status(view.job.status, view.job.ended_at_stage.as_ref());
            // A write that already says what the end will: no second event at the end.
            st.complete_sent = shown.is_ended();
            return Some((event(st.last_id, "progress", &progress_data(&view, shown)), st));
        }
        if st.deps.clock.instant().saturating_duration_since(st.last_sent)
            >= st.deps.config.keepalive
        {
            st.last_sent = st.deps.clock.instant();
            return Some((Bytes::from_static(b": keepalive\n\n"), st));
        }
        tokio::time::sleep(st.deps.config.poll).await;
    }
}

#[cfg(test)]
mod tests;
