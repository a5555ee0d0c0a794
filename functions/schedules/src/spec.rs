//! A schedule as a request gives it, checked: the body of `POST /schedules`, or a schedule's
//! current spec with a `PATCH` merged into it (JSON merge patch, RFC 7396: a member replaces,
//! `null` removes, `params` merges member by member) — one check for both, so a patch can never make a schedule `POST` would refuse.

use chrono::{DateTime, Utc};
use longhaul_aws::api::Problem;
use longhaul_aws::jobs::ScheduleRecord;
use longhaul_domain::Timestamp;
use longhaul_domain::admission::Priority;
use longhaul_domain::recurrence::{Recurrence, ScheduleExpression, ScheduleTimeZone};
use longhaul_domain::schedules::{Overlap, ScheduleState};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::Deps;

/// The members a schedule's spec has (the body of `POST /schedules`).
const MEMBERS: [&str; 11] = [
    "type",
    "params",
    "schedule",
    "timezone",
    "overlap",
    "callback_url",
    "priority",
    "paused",
    "start_at",
    "end_at",
    "pause_on_failure",
];

/// The body of `POST /schedules` (and a patched spec), as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    #[serde(rename = "type")]
    job_type: String,
    #[serde(default = "empty_object")]
    params: Value,
    schedule: String,
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    callback_url: Option<String>,
    #[serde(default)]
    priority: Option<String>,
    #[serde(default)]
    paused: Option<bool>,
    #[serde(default)]
    start_at: Option<String>,
    #[serde(default)]
    end_at: Option<String>,
    #[serde(default)]
    pause_on_failure: Option<bool>,
}

fn empty_object() -> Value {
    json!({})
}

/// A schedule's spec, checked.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) job_type: String,
    pub(crate) params: Value,
    /// Normalised, and checked as `POST /jobs` checks one.
    pub(crate) callback_url: Option<String>,
    pub(crate) priority: Priority,
    pub(crate) schedule: ScheduleExpression,
    pub(crate) timezone: ScheduleTimeZone,
    pub(crate) overlap: Overlap,
    pub(crate) start_at: Option<Timestamp>,
    pub(crate) end_at: Option<Timestamp>,
    pub(crate) pause_on_failure: bool,
    pub(crate) paused: bool,
}

/// Checks `body` as the spec of a schedule of `owner` created at `created_at`, at `now`.
pub(crate) async fn check(
    deps: &Deps,
    owner: &longhaul_domain::Owner,
    body: Value,
    created_at: DateTime<Utc>,
) -> Result<Spec, Problem> {
    let body: Body = serde_json::from_value(body).map_err(|e| {
        Problem::bad_request(format!("The body does not match the schedule schema: {e}"))
    })?;
    let schedule: ScheduleExpression = body.schedule.parse().map_err(|e| {
        Problem::unprocessable("invalid-schedule", "Invalid schedule expression", format!("{e}"))
    })?;
    let timezone: ScheduleTimeZone = match &body.timezone {
        None => ScheduleTimeZone::default(),
        Some(name) => name.parse().map_err(|e| {
            Problem::unprocessable("invalid-timezone", "Unknown time zone", format!("{e}"))
        })?,
    };
    let overlap = match body.overlap.as_deref() {
        None => Overlap::default(),
        Some(name) => serde_json::from_value(json!(name)).map_err(|_| {
            Problem::unprocessable(
                "invalid-overlap",
                "Invalid overlap",
                "overlap must be \"skip\", \"buffer_one\" or \"allow\"",
            )
        })?,
    };
    let priority = match body.priority.as_deref() {
        None => Priority::Normal,
        Some(name) => Priority::parse(name).ok_or_else(|| {
            Problem::unprocessable(
                "invalid-priority",
                "Invalid priority",
                "priority must be \"high\", \"normal\" or \"low\"",
            )
        })?,
    };
    let time = |name: &str, text: &Option<String>| -> Result<Option<Timestamp>, Problem> {
        text.as_deref()
            .map(|text| {
                text.parse::<Timestamp>().map_err(|_| {
                    Problem::unprocessable(
                        "invalid-window",
                        "Invalid schedule window",
                        format!(
                            "{name} must be an RFC 3339 time between the years 0000 and 9999 (UTC)"
                        ),
                    )
                })
            })
            .transpose()
    };
    let start_at = time("start_at", &body.start_at)?;
    let end_at = time("end_at", &body.end_at)?;
    let recurrence = Recurrence::new(
        schedule.clone(),
        timezone,
        created_at,
        start_at.map(Timestamp::as_datetime),
        end_at.map(Timestamp::as_datetime),
    )
    .map_err(|e| {
        Problem::unprocessable("invalid-window", "Invalid schedule window", format!("{e}"))
    })?;
    if recurrence.next_from(deps.clock.now()).is_none() {
        return Err(Problem::unprocessable(
            "never-fires",
            "The schedule would never fire",
            "No time from now on matches the expression within the schedule's window.",
        ));
    }
    let callback_url = submit::check_job_spec(
        &deps.registry,
        &deps.callbacks,
        owner,
        &body.job_type,
        &body.params,
        body.callback_url.as_deref(),
    )
    .await?;
    Ok(Spec {
        job_type: body.job_type,
        params: body.params,
        callback_url,
        priority,
        schedule,
        timezone,
        overlap,
        start_at,
        end_at,
        pause_on_failure: body.pause_on_failure.unwrap_or(false),
        paused: body.paused.unwrap_or(false),
    })
}

/// `record`'s spec as the body of `POST /schedules` would give it.
pub(crate) fn as_body(record: &ScheduleRecord) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("type".into(), json!(record.job_type));
    body.insert("params".into(), record.params.clone());
    body.insert("schedule".into(), json!(record.schedule));
    body.insert("timezone".into(), json!(record.timezone));
    body.insert("overlap".into(), json!(record.overlap));
    body.insert("priority".into(), json!(record.priority));
    body.insert("paused".into(), json!(record.state == ScheduleState::Paused));
    body.insert("pause_on_failure".into(), json!(record.pause_on_failure));
    if let Some(url) = &record.callback_url {
        body.insert("callback_url".into(), json!(url));
    }
    if let Some(at) = record.start_at {
        body.insert("start_at".into(), json!(at));
    }
    if let Some(at) = record.end_at {
        body.insert("end_at".into(), json!(at));
    }
    body
}

/// `current` with `patch` merged in (RFC 7396, by `json_patch::merge`): a member replaces,
/// `null` removes, an object member (`params`) is merged member by member. A top-level member
/// that is not part of a spec is a `400`; an empty patch changes nothing.
pub(crate) fn merged(current: Map<String, Value>, patch: Value) -> Result<Value, Problem> {
    let Value::Object(members) = &patch else {
        return Err(Problem::bad_request("A schedule patch is a JSON object."));
    };
    if let Some(name) = members.keys().find(|name| !MEMBERS.contains(&name.as_str())) {
        return Err(Problem::bad_request(format!(
            "unknown member {:?}; a schedule has {}",
            name.chars().take(64).collect::<String>(),
            MEMBERS.join(", ")
        )));
    }
    let mut body = Value::Object(current);
    json_patch::merge(&mut body, &patch);
    Ok(body)
}
