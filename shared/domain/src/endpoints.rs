//! Webhook endpoints: a URL an owner registers to receive the events of **all** its jobs (the
//! per-job `callback_url` receives one job's terminal event only).
//!
//! An endpoint subscribes to [`EndpointEvent`]s. Every event to it is its own delivery, signed
//! with the owner's secrets, with a `webhook-id` that names the endpoint, the job and the event
//! ([`endpoint_message_id`]), so a resent or recovered delivery carries the id the receiver
//! already deduplicates on. An endpoint that answers `410 Gone` is disabled at once; one whose
//! every attempt failed for the deployment's `disable_after` is disabled too
//! ([`HealthChange::after_attempt`]). Nothing is attempted while it is disabled; re-enabling it
//! and recovering its failed deliveries fills the gap.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::callback::{CallbackPolicy, parse_callback_url};
use crate::{JobId, JobStatus, Timestamp};

/// Progress events to one endpoint: at most one per job per this window, carrying the progress
/// of the window's end (latest wins).
pub const PROGRESS_WINDOW: Duration = Duration::from_secs(5);

/// How long before a result's retention ends its `job.result_expiring` event is sent.
pub const RESULT_EXPIRING_LEAD: Duration = Duration::from_secs(24 * 3600);

/// How long every attempt to an endpoint may fail before it is disabled (the deployment's
/// `EndpointDisableAfterSeconds` overrides it).
pub const DEFAULT_DISABLE_AFTER: Duration = Duration::from_secs(5 * 24 * 3600);

/// How many endpoints an owner may have (the deployment's `TenantMaxEndpoints` overrides it).
pub const DEFAULT_MAX_ENDPOINTS: u32 = 20;

/// Longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 256;

/// An endpoint's identity: a UUIDv7 in its canonical hyphenated text, as a job id is; only a
/// canonical id parses, so one endpoint has one URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct EndpointId(String);

impl EndpointId {
    /// A fresh, time-ordered id.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        EndpointId(uuid::Uuid::now_v7().as_hyphenated().to_string())
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(EndpointId);

impl FromStr for EndpointId {
    type Err = InvalidEndpointId;
    /// Accepts only the canonical hyphenated form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let id = uuid::Uuid::try_parse(s).map_err(|_| InvalidEndpointId)?;
        if id.as_hyphenated().to_string() != s {
            return Err(InvalidEndpointId);
        }
        Ok(EndpointId(s.to_owned()))
    }
}

/// A string that is not an endpoint id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an endpoint id")]
pub struct InvalidEndpointId;

/// An event an endpoint can subscribe to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EndpointEvent {
    /// A job succeeded.
    #[serde(rename = "job.succeeded")]
    JobSucceeded,
    /// A job failed.
    #[serde(rename = "job.failed")]
    JobFailed,
    /// A job was cancelled.
    #[serde(rename = "job.cancelled")]
    JobCancelled,
    /// A running job made progress (at most one per job per [`PROGRESS_WINDOW`]).
    #[serde(rename = "job.progress")]
    JobProgress,
    /// A succeeded job's result expires within [`RESULT_EXPIRING_LEAD`].
    #[serde(rename = "job.result_expiring")]
    JobResultExpiring,
}

impl EndpointEvent {
    /// Every event, in the order the docs list them.
    pub const ALL: [EndpointEvent; 5] = [
        EndpointEvent::JobSucceeded,
        EndpointEvent::JobFailed,
        EndpointEvent::JobCancelled,
        EndpointEvent::JobProgress,
        EndpointEvent::JobResultExpiring,
    ];

    /// Its name, as the API and the payload's `type` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointEvent::JobSucceeded => "job.succeeded",
            EndpointEvent::JobFailed => "job.failed",
            EndpointEvent::JobCancelled => "job.cancelled",
            EndpointEvent::JobProgress => "job.progress",
            EndpointEvent::JobResultExpiring => "job.result_expiring",
        }
    }

    /// The short tag a `webhook-id` carries.
    fn tag(self) -> &'static str {
        match self {
            EndpointEvent::JobSucceeded => "succeeded",
            EndpointEvent::JobFailed => "failed",
            EndpointEvent::JobCancelled => "cancelled",
            EndpointEvent::JobProgress => "progress",
            EndpointEvent::JobResultExpiring => "expiring",
        }
    }

    /// The event of a job's end in `status`, `None` for a status that is not an end with an
    /// event (`expired` is not: its reminder came a day before).
    pub fn of_terminal(status: JobStatus) -> Option<Self> {
        match status {
            JobStatus::Succeeded => Some(EndpointEvent::JobSucceeded),
            JobStatus::Failed => Some(EndpointEvent::JobFailed),
            JobStatus::Cancelled => Some(EndpointEvent::JobCancelled),
            _ => None,
        }
    }

    /// The status of the job when the event happens: the one it ended in (a reminder's job
    /// succeeded); `None` for progress, which happens while it runs.
    pub fn job_status(self) -> Option<JobStatus> {
        match self {
            EndpointEvent::JobSucceeded | EndpointEvent::JobResultExpiring => {
                Some(JobStatus::Succeeded)
            }
            EndpointEvent::JobFailed => Some(JobStatus::Failed),
            EndpointEvent::JobCancelled => Some(JobStatus::Cancelled),
            EndpointEvent::JobProgress => None,
        }
    }

    /// Whether a failed delivery of it is worth sending again: retried on the webhook
    /// schedule, recorded when it cannot be sent, resent, recovered. A progress event is not:
    /// the next one (or the job's view) says more, and a stale one would mislead.
    pub fn replayable(self) -> bool {
        self != EndpointEvent::JobProgress
    }
}

impl fmt::Display for EndpointEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EndpointEvent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EndpointEvent::ALL.into_iter().find(|e| e.as_str() == s).ok_or_else(|| {
            let names: Vec<_> = EndpointEvent::ALL.iter().map(|e| e.as_str()).collect();
            format!("unknown event {s:?}: events are {}", names.join(", "))
        })
    }
}

/// Whether an endpoint receives events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointStatus {
    /// Its events are delivered.
    Enabled,
    /// Nothing is attempted; its events are recorded `failed` for `recover` after `enable`.
    Disabled,
}

impl EndpointStatus {
    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointStatus::Enabled => "enabled",
            EndpointStatus::Disabled => "disabled",
        }
    }
}

/// Why an endpoint was disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisabledReason {
    /// It answered `410 Gone`: its owner told us to stop.
    Gone,
    /// Every attempt failed for the deployment's `disable_after`.
    Failing,
}

impl DisabledReason {
    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DisabledReason::Gone => "gone",
            DisabledReason::Failing => "failing",
        }
    }
}

/// What one attempt to an endpoint does to its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Nothing to write.
    Unchanged,
    /// It was failing and answered 2xx: clear `failing_since`.
    Recovered,
    /// Its first failure after a success (or ever): `failing_since` = now.
    StartedFailing,
    /// Disable it, for this reason.
    Disable(DisabledReason),
}

impl HealthChange {
    /// The change after an attempt answered `status_code` (`None`: no answer) at `now`, for an
    /// endpoint failing since `failing_since` (`None`: its last attempt succeeded), under the
    /// deployment's `disable_after`.
    pub fn after_attempt(
        failing_since: Option<Timestamp>,
        status_code: Option<u16>,
        now: Timestamp,
        disable_after: Duration,
    ) -> Self {
        match (status_code, failing_since) {
            (Some(200..=299), Some(_)) => HealthChange::Recovered,
            (Some(200..=299), None) => HealthChange::Unchanged,
            (Some(410), _) => HealthChange::Disable(DisabledReason::Gone),
            (_, None) => HealthChange::StartedFailing,
            (_, Some(since)) if now >= since && now.since(since) >= disable_after => {
                HealthChange::Disable(DisabledReason::Failing)
            }
            (_, Some(_)) => HealthChange::Unchanged,
        }
    }
}

/// Where one endpoint delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Queued; an attempt (or a retry) is to come.
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Its attempts are spent, the endpoint answered 410, or it was disabled: `resend` and
    /// `recover` can queue it again.
    Failed,
}

impl DeliveryStatus {
    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
        }
    }
}

impl FromStr for DeliveryStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(DeliveryStatus::Pending),
            "delivered" => Ok(DeliveryStatus::Delivered),
            "failed" => Ok(DeliveryStatus::Failed),
            other => Err(format!(
                "unknown delivery status {other:?}: statuses are pending, delivered, failed"
            )),
        }
    }
}

/// The `webhook-id` of `event` of job `job` to endpoint `endpoint`: the same for every attempt,
/// resend and recovery of that delivery, so receivers deduplicate on it. A progress event's id
/// also carries the progress sequence it reports (each is a new event).
pub fn endpoint_message_id(
    endpoint: &EndpointId,
    job: &JobId,
    event: EndpointEvent,
    progress_seq: Option<u64>,
) -> String {
    let mut id =
        format!("msg_{}_{}_{}", endpoint.replace('-', ""), job.replace('-', ""), event.tag());
    if let Some(seq) = progress_seq {
        id.push_str(&format!("_{seq}"));
    }
    id
}

/// The endpoint, job and event an [`endpoint_message_id`] names, `None` for any other text
/// (a per-job callback's id, or garbage).
pub fn parse_endpoint_message_id(id: &str) -> Option<(EndpointId, JobId, EndpointEvent)> {
    let mut parts = id.strip_prefix("msg_")?.split('_');
    let endpoint = hyphenated(parts.next()?)?.parse().ok()?;
    let job = hyphenated(parts.next()?)?.parse().ok()?;
    let tag = parts.next()?;
    let event = EndpointEvent::ALL.into_iter().find(|e| e.tag() == tag)?;
    match (event, parts.next(), parts.next()) {
        (_, None, _) => Some((endpoint, job, event)),
        (EndpointEvent::JobProgress, Some(seq), None) if seq.parse::<u64>().is_ok() => {
            Some((endpoint, job, event))
        }
        _ => None,
    }
}

/// `0189…` (32 lower-case hex digits) as a canonical hyphenated UUID.
fn hyphenated(simple: &str) -> Option<String> {
    if simple.len() != 32 || !simple.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    Some(uuid::Uuid::try_parse(simple).ok()?.as_hyphenated().to_string())
}

/// What an owner says an endpoint is: its URL, the events it receives and a description. Its
/// `Debug` leaves the URL out: a partner's URL may carry a token, and no log may hold it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// Where events go: `https`, public addresses only (the rules of a job's `callback_url`).
    pub url: String,
    /// What it receives; never empty.
    pub events: BTreeSet<EndpointEvent>,
    /// The owner's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl fmt::Debug for EndpointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointSpec")
            .field("url", &"[REDACTED]")
            .field("events", &self.events)
            .field("description", &self.description)
            .finish()
    }
}

/// Why an endpoint spec was refused; the message is for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidEndpoint(pub String);

impl EndpointSpec {
    /// The spec of a `POST /webhooks/endpoints` body: `url` and `events` required,
    /// `description` optional, nothing else.
    pub fn parse(
        body: &serde_json::Value,
        policy: &CallbackPolicy,
    ) -> Result<EndpointSpec, InvalidEndpoint> {
        let object = body
            .as_object()
            .ok_or_else(|| InvalidEndpoint("The body must be a JSON object.".into()))?;
        unknown_members(object)?;
        let url = object
            .get("url")
            .ok_or_else(|| InvalidEndpoint("`url` is required.".into()))
            .and_then(|url| parse_url(url, policy))?;
        let events = object
            .get("events")
            .ok_or_else(|| InvalidEndpoint("`events` is required.".into()))
            .and_then(parse_events)?;
        let description = match object.get("description") {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(parse_description(value)?),
        };
        Ok(EndpointSpec { url, events, description })
    }

    /// This spec changed by a `PATCH` body: each member present replaces its value
    /// (`"description": null` removes the description); members absent keep theirs.
    pub fn patched(
        &self,
        body: &serde_json::Value,
        policy: &CallbackPolicy,
    ) -> Result<EndpointSpec, InvalidEndpoint> {
        let object = body
            .as_object()
            .ok_or_else(|| InvalidEndpoint("The body must be a JSON object.".into()))?;
        unknown_members(object)?;
        let mut spec = self.clone();
        if let Some(url) = object.get("url") {
            spec.url = parse_url(url, policy)?;
        }
        if let Some(events) = object.get("events") {
            spec.events = parse_events(events)?;
        }
        match object.get("description") {
            None => {}
            Some(serde_json::Value::Null) => spec.description = None,
            Some(value) => spec.description = Some(parse_description(value)?),
        }
        Ok(spec)
    }

    /// Whether it receives `event`.
    pub fn receives(&self, event: EndpointEvent) -> bool {
        self.events.contains(&event)
    }
}

fn unknown_members(
    object: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), InvalidEndpoint> {
    match object.keys().find(|k| !matches!(k.as_str(), "url" | "events" | "description")) {
        Some(unknown) => Err(InvalidEndpoint(format!(
            "Unknown member `{unknown}`: an endpoint has `url`, `events` and `description`."
        ))),
        None => Ok(()),
    }
}

fn parse_url(
    value: &serde_json::Value,
    policy: &CallbackPolicy,
) -> Result<String, InvalidEndpoint> {
    let raw = value.as_str().ok_or_else(|| InvalidEndpoint("`url` must be a string.".into()))?;
    let url =
        parse_callback_url(raw, policy).map_err(|e| InvalidEndpoint(format!("`url`: {e}")))?;
    // Stored as parsed (normalised), as a job's callback URL is: what is shown is what is
    // called, and two spellings of one URL are one URL.
    Ok(url.as_str().to_owned())
}

fn parse_events(value: &serde_json::Value) -> Result<BTreeSet<EndpointEvent>, InvalidEndpoint> {
    let list = value
        .as_array()
        .ok_or_else(|| InvalidEndpoint("`events` must be an array of event names.".into()))?;
    let mut events = BTreeSet::new();
    for item in list {
        let name = item
            .as_str()
            .ok_or_else(|| InvalidEndpoint("`events` must be an array of event names.".into()))?;
        events.insert(name.parse::<EndpointEvent>().map_err(InvalidEndpoint)?);
    }
    if events.is_empty() {
        return Err(InvalidEndpoint("`events` must name at least one event.".into()));
    }
    Ok(events)
}

fn parse_description(value: &serde_json::Value) -> Result<String, InvalidEndpoint> {
    let text =
        value.as_str().ok_or_else(|| InvalidEndpoint("`description` must be a string.".into()))?;
    if text.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(InvalidEndpoint(format!(
            "`description` is longer than {MAX_DESCRIPTION_CHARS} characters."
        )));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const STRICT: CallbackPolicy = CallbackPolicy { allow_insecure: false };

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_spec_is_parsed_and_checked() {
        let spec = EndpointSpec::parse(
            &json!({"url": "https://example.com/hook", "events": ["job.failed", "job.progress", "job.failed"], "description": "ops"}),
            &STRICT,
        )
        .unwrap();
        assert_eq!(spec.url, "https://example.com/hook");
        assert_eq!(
            spec.events.iter().copied().collect::<Vec<_>>(),
            vec![EndpointEvent::JobFailed, EndpointEvent::JobProgress]
        );
        assert!(spec.receives(EndpointEvent::JobProgress));
        assert!(!spec.receives(EndpointEvent::JobSucceeded));
        for (body, says) in [
            (json!([]), "JSON object"),
            (json!({"events": ["job.failed"]}), "`url` is required"),
            (json!({"url": "https://example.com"}), "`events` is required"),
            (json!({"url": "http://example.com", "events": ["job.failed"]}), "`url`"),
            (json!({"url": "https://10.0.0.1/x", "events": ["job.failed"]}), "`url`"),
            (json!({"url": 3, "events": ["job.failed"]}), "must be a string"),
            (json!({"url": "https://example.com", "events": []}), "at least one"),
            (json!({"url": "https://example.com", "events": "job.failed"}), "array"),
            (json!({"url": "https://example.com", "events": ["job.done"]}), "unknown event"),
            (json!({"url": "https://example.com", "events": ["job.failed"], "x": 1}), "`x`"),
            (
                json!({"url": "https://example.com", "events": ["job.failed"], "description": "é".repeat(257)}),
                "longer than 256",
            ),
        ] {
            let err = EndpointSpec::parse(&body, &STRICT).unwrap_err();
            assert!(err.0.contains(says), "{body}: {err}");
        }
    }

    #[test]
    fn a_patch_replaces_what_it_names_and_keeps_the_rest() {
        let spec = EndpointSpec::parse(
            &json!({"url": "https://example.com/a", "events": ["job.failed"], "description": "d"}),
            &STRICT,
        )
        .unwrap();
        let patched = spec.patched(&json!({"events": ["job.succeeded"]}), &STRICT).unwrap();
        assert_eq!(patched.url, spec.url);
        assert_eq!(patched.description.as_deref(), Some("d"));
        assert!(patched.receives(EndpointEvent::JobSucceeded));
        assert!(!patched.receives(EndpointEvent::JobFailed));
        let cleared = spec.patched(&json!({"description": null}), &STRICT).unwrap();
        assert_eq!(cleared.description, None);
        assert_eq!(spec.patched(&json!({}), &STRICT).unwrap(), spec);
        assert!(spec.patched(&json!({"events": []}), &STRICT).is_err());
        assert!(spec.patched(&json!({"url": "ftp://example.com"}), &STRICT).is_err());
        assert!(spec.patched(&json!({"status": "enabled"}), &STRICT).is_err());
    }

    #[test]
    fn health_follows_the_attempts() {
        let after = Duration::from_secs(3600);
        let now = at("2026-11-26T12:00:00Z");
        let change = |since: Option<&str>, code| {
            HealthChange::after_attempt(since.map(at), code, now, after)
        };
        assert_eq!(change(None, Some(204)), HealthChange::Unchanged);
        assert_eq!(change(Some("2026-11-26T11:59:00Z"), Some(200)), HealthChange::Recovered);
        assert_eq!(change(None, Some(410)), HealthChange::Disable(DisabledReason::Gone));
        assert_eq!(change(None, Some(500)), HealthChange::StartedFailing);
        assert_eq!(change(None, None), HealthChange::StartedFailing);
        assert_eq!(change(Some("2026-11-26T11:30:00Z"), Some(503)), HealthChange::Unchanged);
        assert_eq!(
            change(Some("2026-11-26T11:00:00Z"), None),
            HealthChange::Disable(DisabledReason::Failing),
            "exactly disable_after of failures"
        );
        assert_eq!(
            change(Some("2026-11-26T13:00:00Z"), None),
            HealthChange::Unchanged,
            "a failing_since in the future (clock skew) never disables"
        );
    }

    #[test]
    fn message_ids_name_endpoint_job_and_event() {
        let endpoint = EndpointId::new();
        let job = JobId::new();
        for event in EndpointEvent::ALL {
            let id = endpoint_message_id(&endpoint, &job, event, None);
            assert!(id.starts_with("msg_"), "{id}");
            assert_eq!(
                parse_endpoint_message_id(&id),
                Some((endpoint.clone(), job.clone(), event))
            );
        }
        let progress = endpoint_message_id(&endpoint, &job, EndpointEvent::JobProgress, Some(12));
        assert!(progress.ends_with("_progress_12"), "{progress}");
        assert_eq!(
            parse_endpoint_message_id(&progress),
            Some((endpoint.clone(), job.clone(), EndpointEvent::JobProgress))
        );
        assert_ne!(
            progress,
            endpoint_message_id(&endpoint, &job, EndpointEvent::JobProgress, Some(13))
        );
        let callback = crate::webhooks::message_id(&job, JobStatus::Succeeded);
        for bad in [
            callback.as_str(),
            "msg_",
            "garbage",
            "msg_zz_zz_failed",
            &format!("{}_1", endpoint_message_id(&endpoint, &job, EndpointEvent::JobFailed, None)),
            &format!(
                "{}_x",
                endpoint_message_id(&endpoint, &job, EndpointEvent::JobProgress, None)
            ),
        ] {
            assert_eq!(parse_endpoint_message_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_round_trip() {
        for event in EndpointEvent::ALL {
            assert_eq!(serde_json::to_value(event).unwrap(), event.as_str());
            assert_eq!(event.as_str().parse::<EndpointEvent>().unwrap(), event);
        }
        assert_eq!(EndpointEvent::of_terminal(JobStatus::Failed), Some(EndpointEvent::JobFailed));
        assert_eq!(EndpointEvent::of_terminal(JobStatus::Expired), None);
        assert_eq!(EndpointEvent::of_terminal(JobStatus::Running), None);
        assert!(!EndpointEvent::JobProgress.replayable());
        assert!(EndpointEvent::JobResultExpiring.replayable());
        for status in [DeliveryStatus::Pending, DeliveryStatus::Delivered, DeliveryStatus::Failed] {
            assert_eq!(status.as_str().parse::<DeliveryStatus>().unwrap(), status);
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
        assert!("done".parse::<DeliveryStatus>().is_err());
        assert_eq!(serde_json::to_value(DisabledReason::Gone).unwrap(), "gone");
        assert_eq!(serde_json::to_value(EndpointStatus::Disabled).unwrap(), "disabled");
        let id = EndpointId::new();
        assert_eq!(id.as_str().parse::<EndpointId>().unwrap(), id);
        assert!(id.to_uppercase().parse::<EndpointId>().is_err());
    }
}
