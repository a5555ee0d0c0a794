//! What an endpoint and a delivery read as. Never the owner: a caller only ever sees its own.

use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord};
use serde_json::{Value, json};

/// An endpoint's view: its spec (events sorted by name), its status and health, its times.
pub fn endpoint(record: &EndpointRecord) -> Value {
    let mut events: Vec<&str> = record.spec.events.iter().map(|e| e.as_str()).collect();
    events.sort_unstable();
    let mut view = json!({
        "endpoint_id": record.endpoint_id,
        "url": record.spec.url,
        "events": events,
        "status": record.status,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    });
    let optional = [
        ("description", record.spec.description.as_ref().map(|d| json!(d))),
        ("disabled_reason", record.disabled_reason.map(|r| json!(r))),
        ("disabled_at", record.disabled_at.map(|at| json!(at))),
        ("failing_since", record.failing_since.map(|at| json!(at))),
    ];
    with(view.as_object_mut().expect("an object"), optional);
    view
}

/// A delivery's view: which event of which job, where it stands, and its last attempt.
pub fn delivery(record: &EndpointDelivery) -> Value {
    let mut view = json!({
        "webhook_id": record.webhook_id,
        "job_id": record.job_id,
        "event": record.event,
        "status": record.status,
        "attempts": record.attempts,
        "created_at": record.created_at,
    });
    let optional = [
        ("last_attempt_at", record.last_attempt_at.map(|at| json!(at))),
        ("status_code", record.status_code.map(|code| json!(code))),
        ("latency_ms", record.latency_ms.map(|ms| json!(ms))),
        ("error", record.error.as_ref().map(|e| json!(e))),
    ];
    with(view.as_object_mut().expect("an object"), optional);
    view
}

/// `view` with each optional member that has a value.
fn with<const N: usize>(
    view: &mut serde_json::Map<String, Value>,
    optional: [(&str, Option<Value>); N],
) {
    for (name, value) in optional {
        if let Some(value) = value {
            view.insert(name.to_owned(), value);
        }
    }
}
