//! `schedule create|ls|show|pause|resume|trigger|rm`: recurring jobs (`/schedules`).

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::api::Api;
use crate::cli::{Pages, ScheduleCommand, ScheduleCreate, SchedulePause, ScheduleTrigger};
use crate::error::{CliError, Exit};
use crate::output::{Output, field, table};
use crate::params;

/// How many of a schedule's jobs `show` lists.
const RECENT_JOBS: u32 = 5;
/// How long `trigger --wait` waits for the tick to be processed (it normally takes a second).
const TICK_DEADLINE: Duration = Duration::from_secs(120);
/// How often `trigger --wait` reads the schedule meanwhile.
const TICK_POLL: Duration = Duration::from_millis(500);

/// Runs one `schedule` subcommand.
pub async fn dispatch(
    api: &Api,
    out: &Output,
    command: &ScheduleCommand,
) -> Result<Exit, CliError> {
    match command {
        ScheduleCommand::Create(args) => create(api, out, args).await,
        ScheduleCommand::Ls(args) => list(api, out, args).await,
        ScheduleCommand::Show(schedule) => show(api, out, &schedule.id).await,
        ScheduleCommand::Pause(args) => pause(api, out, args).await,
        ScheduleCommand::Resume(schedule) => resume(api, out, &schedule.id).await,
        ScheduleCommand::Trigger(args) => trigger(api, out, args).await,
        ScheduleCommand::Rm(schedule) => remove(api, out, &schedule.id).await,
    }
}

/// The `POST /schedules` body for `args` with its `params`: only what was given (the server
/// applies its defaults).
pub fn create_body(args: &ScheduleCreate, params: Value) -> Value {
    let mut body = json!({ "type": args.kind, "params": params, "schedule": args.schedule });
    let optional = [
        ("timezone", args.timezone.clone()),
        ("overlap", args.overlap.map(|o| o.as_str().to_owned())),
        ("callback_url", args.callback_url.clone()),
        ("priority", args.priority.map(|p| p.as_str().to_owned())),
        ("start_at", args.start_at.clone()),
        ("end_at", args.end_at.clone()),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            body[name] = value.into();
        }
    }
    if args.paused {
        body["paused"] = true.into();
    }
    if args.pause_on_failure {
        body["pause_on_failure"] = true.into();
    }
    body
}

/// `schedule create`: prints the new schedule's id (text, with when it fires next on stderr)
/// or the schedule (JSON).
async fn create(api: &Api, out: &Output, args: &ScheduleCreate) -> Result<Exit, CliError> {
    let body = create_body(args, params::load(&args.params)?);
    let schedule = api.post("/schedules", &body).await?.body;
    let id = schedule
        .get("schedule_id")
        .and_then(Value::as_str)
        .ok_or_else(|| CliError::Protocol("POST /schedules answered without a schedule_id".into()))?
        .to_owned();
    if !out.json {
        out.note(&format!("schedule {id} created: {}", when(&schedule)));
    }
    out.print(&schedule, || id.clone());
    Ok(Exit::Ok)
}

/// `schedule ls`: follows `next_cursor` until `--limit` schedules (or all with `--all`).
async fn list(api: &Api, out: &Output, args: &Pages) -> Result<Exit, CliError> {
    let limit = (!args.all).then_some(args.limit);
    let (schedules, cursor) =
        super::pages(api, "/schedules", "schedules", limit, |page, cursor| {
            let mut query = vec![("limit", page.to_string())];
            if let Some(cursor) = cursor {
                query.push(("cursor", cursor.to_owned()));
            }
            query
        })
        .await?;
    let document = json!({ "schedules": schedules, "next_cursor": cursor });
    out.print(&document, || {
        if schedules.is_empty() {
            return "no schedules".into();
        }
        let rows: Vec<Vec<String>> = schedules.iter().map(list_row).collect();
        let mut text = table(
            &["ID", "TYPE", "SCHEDULE", "TIMEZONE", "STATE", "NEXT FIRE", "LAST FIRE", "COUNTS"],
            &rows,
        );
        if cursor.is_some() {
            text.push_str("\n(more: raise --limit or use --all)");
        }
        text
    });
    Ok(Exit::Ok)
}

/// One schedule as a row of `schedule ls`.
pub fn list_row(schedule: &Value) -> Vec<String> {
    let last = match schedule.get("last_fire").filter(|f| f.is_object()) {
        Some(fire) => format!("{} {}", field(fire, "outcome"), field(fire, "scheduled_at")),
        None => "-".into(),
    };
    vec![
        field(schedule, "schedule_id"),
        field(schedule, "type"),
        field(schedule, "schedule"),
        field(schedule, "timezone"),
        field(schedule, "state"),
        field(schedule, "next_fire_at"),
        last,
        counts(schedule),
    ]
}

/// `fired 3 · submitted 2 · skipped 1 · refused 0`.
fn counts(schedule: &Value) -> String {
    let counts = schedule.get("counts").unwrap_or(&Value::Null);
    ["fired", "submitted", "skipped", "refused"]
        .map(|name| format!("{name} {}", counts.get(name).and_then(Value::as_u64).unwrap_or(0)))
        .join(" · ")
}

/// `cron(…) in Europe/Paris, next at …` / `…, paused (reason)`.
fn when(schedule: &Value) -> String {
    let mut text = format!("{} in {}", field(schedule, "schedule"), field(schedule, "timezone"));
    if field(schedule, "state") == "paused" {
        text.push_str(&format!(", paused ({})", field(schedule, "paused_reason")));
    } else if schedule.get("next_fire_at").is_some_and(Value::is_string) {
        text.push_str(&format!(", next at {}", field(schedule, "next_fire_at")));
    } else {
        text.push_str(", no tick left in its window");
    }
    text
}

/// `schedule show`: the schedule and its most recent jobs. With `--json`, the schedule with
/// its jobs' summaries as `recent_jobs`.
async fn show(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    let mut schedule = api.get(&format!("/schedules/{id}")).await?.body;
    let query = [("schedule_id", id.to_owned()), ("limit", RECENT_JOBS.to_string())];
    let request = api.request(Method::GET, "/jobs").query(&query);
    let page = api.send(request, "GET /jobs").await?.body;
    let jobs = page.get("jobs").cloned().unwrap_or_else(|| json!([]));
    out.print(
        &{
            if let Some(object) = schedule.as_object_mut() {
                object.insert("recent_jobs".into(), jobs.clone());
            }
            schedule.clone()
        },
        || {
            let mut text = describe_schedule(&schedule);
            let rows: Vec<Vec<String>> = jobs
                .as_array()
                .into_iter()
                .flatten()
                .map(|j| {
                    ["job_id", "status", "created_at", "finished_at"].map(|n| field(j, n)).to_vec()
                })
                .collect();
            if rows.is_empty() {
                text.push_str("\n\nno jobs yet");
            } else {
                text.push_str("\n\nrecent jobs:\n");
                text.push_str(&table(&["ID", "STATUS", "CREATED", "FINISHED"], &rows));
                if page.get("next_cursor").is_some_and(Value::is_string) {
                    text.push_str(&format!("\n(all of them: longhaul ls --schedule {id} --all)"));
                }
            }
            text
        },
    );
    Ok(Exit::Ok)
}

/// A schedule as a few `name: value` lines.
pub fn describe_schedule(schedule: &Value) -> String {
    let line = |name: &str, value: String| format!("{:<12}{value}", format!("{name}:"));
    let mut lines = vec![
        line("schedule", field(schedule, "schedule_id")),
        line("type", field(schedule, "type")),
        line("params", schedule.get("params").map_or("{}".into(), Value::to_string)),
        line("expression", field(schedule, "schedule")),
        line("timezone", field(schedule, "timezone")),
        line("overlap", field(schedule, "overlap")),
        line("priority", field(schedule, "priority")),
    ];
    let mut state = field(schedule, "state");
    if let Some(reason) = schedule.get("paused_reason").and_then(Value::as_str) {
        state.push_str(&format!(" ({reason})"));
    }
    lines.push(line("state", state));
    if schedule.get("pause_on_failure").and_then(Value::as_bool) == Some(true) {
        lines.push(line("on failure", "pause the schedule".into()));
    }
    for (name, label) in [("start_at", "starts"), ("end_at", "ends"), ("callback_url", "callback")]
    {
        if schedule.get(name).is_some_and(|v| !v.is_null()) {
            lines.push(line(label, field(schedule, name)));
        }
    }
    let next = match schedule.get("next_fire_at").and_then(Value::as_str) {
        Some(at) => at.to_owned(),
        None if field(schedule, "state") == "paused" => "- (paused)".into(),
        None => "- (no tick left in its window)".into(),
    };
    lines.push(line("next fire", next));
    let last = match schedule.get("last_fire").filter(|f| f.is_object()) {
        None => "- (never fired)".into(),
        Some(fire) => {
            let mut text = format!("{} {}", field(fire, "scheduled_at"), field(fire, "outcome"));
            if fire.get("job_id").is_some_and(Value::is_string) {
                text.push_str(&format!(": job {}", field(fire, "job_id")));
            }
            if fire.get("reason").is_some_and(Value::is_string) {
                text.push_str(&format!(": {}", field(fire, "reason")));
            }
            text
        }
    };
    lines.push(line("last fire", last));
    if let Some(held) = schedule.get("held").filter(|h| h.is_object()) {
        lines.push(line(
            "held",
            format!("tick {} (until the live job ends)", field(held, "scheduled_at")),
        ));
    }
    lines.push(line("counts", counts(schedule)));
    lines.push(line("created", field(schedule, "created_at")));
    lines.push(line("updated", field(schedule, "updated_at")));
    lines.join("\n")
}

/// `schedule pause`: prints `schedule <id> paused (<reason>)` or the schedule.
async fn pause(api: &Api, out: &Output, args: &SchedulePause) -> Result<Exit, CliError> {
    let path = format!("/schedules/{}/pause", args.id);
    let schedule = match &args.reason {
        Some(reason) => api.post(&path, &json!({ "reason": reason })).await?.body,
        None => api.post_empty(&path).await?.body,
    };
    out.print(&schedule, || {
        format!("schedule {} paused ({})", args.id, field(&schedule, "paused_reason"))
    });
    Ok(Exit::Ok)
}

/// `schedule resume`: prints `schedule <id> resumed: next at …` or the schedule.
async fn resume(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    let schedule = api.post_empty(&format!("/schedules/{id}/resume")).await?.body;
    out.print(&schedule, || format!("schedule {id} resumed: {}", when(&schedule)));
    Ok(Exit::Ok)
}

/// `schedule rm`: deletes the schedule (its jobs stay).
async fn remove(api: &Api, out: &Output, id: &str) -> Result<Exit, CliError> {
    api.delete(&format!("/schedules/{id}")).await?;
    out.print(&json!({ "schedule_id": id, "deleted": true }), || {
        format!("schedule {id} deleted (its jobs are kept)")
    });
    Ok(Exit::Ok)
}

/// `schedule trigger`: fires a tick now. Prints the tick and how to follow its job; with
/// `--wait`, waits for the tick's outcome and watches its job to the end (the exit code is
/// then the job's; a tick skipped or refused exits 4 saying why).
async fn trigger(api: &Api, out: &Output, args: &ScheduleTrigger) -> Result<Exit, CliError> {
    let id = &args.id;
    let reply = api.post_empty(&format!("/schedules/{id}/trigger")).await?.body;
    let tick = reply
        .get("scheduled_at")
        .and_then(Value::as_str)
        .ok_or_else(|| CliError::Protocol("the trigger answered without scheduled_at".into()))?
        .to_owned();
    if !args.wait {
        out.print(&reply, || {
            format!(
                "schedule {id}: tick {tick} fired\nits job: longhaul ls --schedule {id} (then \
                 longhaul watch <job id>), or trigger with --wait to follow it"
            )
        });
        return Ok(Exit::Ok);
    }
    if !out.json {
        out.note(&format!("schedule {id}: tick {tick} fired"));
    }
    let fire = tick_outcome(api, id, &tick).await?;
    let outcome = field(&fire, "outcome");
    match fire.get("job_id").and_then(Value::as_str) {
        Some(job_id) if outcome == "submitted" => {
            if !out.json {
                out.note(&format!("submitted job {job_id}"));
            }
            super::watch(api, out, job_id).await
        }
        _ => Err(CliError::Tick(format!(
            "schedule {id}: tick {tick} was {outcome}: {}",
            field(&fire, "reason")
        ))),
    }
}

/// What the schedule's tick `tick` came to (its `last_fire` once it is that tick), read until
/// it is known.
async fn tick_outcome(api: &Api, id: &str, tick: &str) -> Result<Value, CliError> {
    let deadline = Instant::now() + TICK_DEADLINE;
    loop {
        let schedule = api.get(&format!("/schedules/{id}")).await?.body;
        if let Some(fire) = schedule.get("last_fire").filter(|f| f.is_object()) {
            // Both times are the API's RFC 3339 with milliseconds in UTC: they sort as text.
            let at = field(fire, "scheduled_at");
            if at == tick {
                return Ok(fire.clone());
            }
            if at.as_str() > tick {
                return Err(CliError::Tick(format!(
                    "schedule {id}: a later tick ({at}) was recorded before tick {tick}, which \
                     fired nothing"
                )));
            }
        }
        if Instant::now() >= deadline {
            return Err(CliError::Tick(format!(
                "schedule {id}: tick {tick} was not processed within {}s; see longhaul \
                 schedule show {id}",
                TICK_DEADLINE.as_secs()
            )));
        }
        tokio::time::sleep(TICK_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parsed(args: &[&str]) -> ScheduleCreate {
        let mut line = vec!["longhaul", "schedule", "create"];
        line.extend_from_slice(args);
        match Cli::try_parse_from(line).unwrap().command {
            Command::Schedule(ScheduleCommand::Create(create)) => create,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_body_carries_only_what_was_given() {
        let args = parsed(&["--type", "demo", "--schedule", "rate(1 hour)"]);
        assert_eq!(
            create_body(&args, json!({})),
            json!({"type": "demo", "params": {}, "schedule": "rate(1 hour)"})
        );
        let args = parsed(&[
            "--type",
            "demo",
            "--schedule",
            "cron(0 2 * * ? *)",
            "--timezone",
            "Europe/Paris",
            "--overlap",
            "buffer_one",
            "--callback-url",
            "https://example.com/hook",
            "--priority",
            "low",
            "--paused",
            "--start-at",
            "2030-01-01T00:00:00Z",
            "--end-at",
            "2031-01-01T00:00:00Z",
            "--pause-on-failure",
        ]);
        assert_eq!(
            create_body(&args, json!({"items": 3})),
            json!({"type": "demo", "params": {"items": 3}, "schedule": "cron(0 2 * * ? *)",
                "timezone": "Europe/Paris", "overlap": "buffer_one",
                "callback_url": "https://example.com/hook", "priority": "low", "paused": true,
                "start_at": "2030-01-01T00:00:00Z", "end_at": "2031-01-01T00:00:00Z",
                "pause_on_failure": true})
        );
    }

    #[test]
    fn a_schedule_reads_as_lines() {
        let schedule = json!({"schedule_id": "s1", "type": "demo", "params": {"items": 1},
            "schedule": "cron(0 2 * * ? *)", "timezone": "Europe/Paris", "overlap": "skip",
            "priority": "normal", "pause_on_failure": true, "state": "paused",
            "paused_reason": "maintenance", "next_fire_at": null,
            "last_fire": {"scheduled_at": "2026-11-24T01:00:00.000Z", "outcome": "refused",
                "reason": "Too many jobs: wait"},
            "counts": {"fired": 3, "submitted": 2, "skipped": 0, "refused": 1},
            "created_at": "2026-11-20T10:00:00.000Z", "updated_at": "2026-11-24T09:00:00.000Z"});
        let text = describe_schedule(&schedule);
        for line in [
            "expression: cron(0 2 * * ? *)",
            "state:      paused (maintenance)",
            "next fire:  - (paused)",
            "last fire:  2026-11-24T01:00:00.000Z refused: Too many jobs: wait",
            "counts:     fired 3 · submitted 2 · skipped 0 · refused 1",
            "on failure: pause the schedule",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        let row = list_row(&schedule);
        assert_eq!(row[4], "paused");
        assert_eq!(row[6], "refused 2026-11-24T01:00:00.000Z");
    }
}
