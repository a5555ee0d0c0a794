//! Webhook endpoints, their delivery records and the progress-event windows.
//!
//! | item | pk / sk |
//! |------|---------|
//! | endpoint | `ENDPOINTS#<len>:<owner>` / `ENDPOINT#<endpoint id>` |
//! | endpoint delivery | `EPDELIVERY#<endpoint id>` / `<job id>#<event>` |
//! | progress window | `PROGRESSHOOK#<job id>` / `WINDOW` |
//!
//! An owner's endpoints are one partition (at most the deployment's `TenantMaxEndpoints`, one
//! Query lists them all). An endpoint's deliveries are one partition too, one item per (job,
//! event) that each attempt overwrites — the latest progress event of a job, the one terminal
//! event, the one expiry reminder — sorted by job id (UUIDv7: newest job last). Delivery items
//! and progress windows carry a TTL (`expires_at`): the record retention for deliveries, a
//! minute past the window for windows.

use super::*;

use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, EndpointSpec, EndpointStatus,
};
use serde::Deserialize;

/// An endpoint as stored and shown (its owner only ever sees its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// Its id.
    pub endpoint_id: EndpointId,
    /// Whose it is.
    pub owner: Owner,
    /// URL, events, description.
    #[serde(flatten)]
    pub spec: EndpointSpec,
    /// Whether its events are delivered.
    pub status: EndpointStatus,
    /// Why it was disabled (while it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<DisabledReason>,
    /// When it was disabled (while it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_at: Option<Timestamp>,
    /// When the unbroken run of failed attempts it is in began; `None` after a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<Timestamp>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its spec or status last changed.
    pub updated_at: Timestamp,
    /// Bumped by every change of its spec; a change is written only over the version it read.
    /// Health writes (failing, recovered, disabled) do not bump it: they touch no spec field.
    pub version: u64,
}

impl EndpointRecord {
    /// A new, enabled endpoint of `owner`, made at `now`.
    pub fn new(owner: Owner, spec: EndpointSpec, now: Timestamp) -> Self {
        EndpointRecord {
            endpoint_id: EndpointId::new(),
            owner,
            spec,
            status: EndpointStatus::Enabled,
            disabled_reason: None,
            disabled_at: None,
            failing_since: None,
            created_at: now,
            updated_at: now,
            version: 1,
        }
    }

    /// Whether events are delivered to it now.
    pub fn enabled(&self) -> bool {
        self.status == EndpointStatus::Enabled
    }
}

/// One event's delivery to one endpoint: the latest attempt's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointDelivery {
    /// The `webhook-id` ([`longhaul_domain::endpoints::endpoint_message_id`]).
    pub webhook_id: String,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The job.
    pub job_id: JobId,
    /// The event.
    pub event: EndpointEvent,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Attempts made (0: queued, or recorded `failed` without one while the endpoint was
    /// disabled).
    pub attempts: u32,
    /// When it was first recorded (kept by later writes of the same delivery).
    pub created_at: Timestamp,
    /// When its last attempt was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<Timestamp>,
    /// The endpoint's answer to the last attempt, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// How long the last attempt took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// What went wrong with the last attempt (or why none was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The progress sequence a progress event reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_seq: Option<u64>,
}

/// A page of an endpoint's deliveries, newest job first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryPage {
    /// The deliveries.
    pub deliveries: Vec<EndpointDelivery>,
    /// Where the next page starts (an opaque position within the endpoint's deliveries), if
    /// there may be more.
    pub next: Option<String>,
}

/// The partition of `owner`'s endpoints.
pub fn endpoints_pk(owner: &Owner) -> String {
    format!("ENDPOINTS#{}:{owner}", owner.len())
}

/// The partition of an endpoint's deliveries.
pub fn endpoint_deliveries_pk(endpoint: &EndpointId) -> String {
    format!("EPDELIVERY#{endpoint}")
}

/// The partition of a job's progress-event window.
pub fn progress_window_pk(job: &JobId) -> String {
    format!("PROGRESSHOOK#{job}")
}
