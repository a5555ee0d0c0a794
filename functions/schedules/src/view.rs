//! What a schedule reads as: its spec, its state, when it fires next, its last firing and
//! its counts.

use chrono::{DateTime, Utc};
use longhaul_aws::jobs::ScheduleRecord;
use longhaul_domain::Timestamp;
use longhaul_domain::recurrence::Recurrence;
use longhaul_domain::schedules::ScheduleState;
use serde_json::{Value, json};

/// When `record` fires next after `now`: `None` while paused, or when no tick is left in its
/// window.
pub fn next_fire_at(record: &ScheduleRecord, now: DateTime<Utc>) -> Option<Timestamp> {
    if record.state == ScheduleState::Paused {
        return None;
    }
    let recurrence = Recurrence::new(
        record.schedule.clone(),
        record.timezone,
        record.created_at.as_datetime(),
        record.start_at.map(Timestamp::as_datetime),
        record.end_at.map(Timestamp::as_datetime),
    )
    .ok()?;
    // From now on (a rate's first tick is its anchor itself), but never a tick already fired.
    match (recurrence.next_from(now), record.last_tick) {
        (Some(next), Some(last)) if next <= last.as_datetime() => {
            recurrence.next_after(last.as_datetime()).map(Timestamp::from)
        }
        (next, _) => next.map(Timestamp::from),
    }
}

/// The schedule's view at `now`.
pub fn render(record: &ScheduleRecord, now: DateTime<Utc>) -> Value {
    let mut view = json!({
        "schedule_id": record.schedule_id,
        "type": record.job_type,
        "params": record.params,
        "schedule": record.schedule,
        "timezone": record.timezone,
        "overlap": record.overlap,
        "priority": record.priority,
        "pause_on_failure": record.pause_on_failure,
        "state": record.state,
        "next_fire_at": next_fire_at(record, now),
        "counts": {
            "fired": record.fired,
            "submitted": record.submitted,
            "skipped": record.skipped,
            "refused": record.refused,
        },
        "jobs_url": format!("/jobs?schedule_id={}", record.schedule_id),
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    });
    let optional = [
        ("callback_url", record.callback_url.as_ref().map(|u| json!(u))),
        ("start_at", record.start_at.map(|at| json!(at))),
        ("end_at", record.end_at.map(|at| json!(at))),
        ("paused_reason", record.paused_reason.as_ref().map(|r| json!(r))),
        ("last_fire", record.last_fire.as_ref().map(|f| json!(f))),
        ("held", record.held.map(|at| json!({"scheduled_at": at}))),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            view[name] = value;
        }
    }
    view
}
