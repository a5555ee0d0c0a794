//! Recurring schedules end to end (issue 31): `/schedules` as a client sees it, the
//! EventBridge Scheduler twin each schedule has in the emulator, and the local stack's firer
//! (`longhaul_local::triggers::scheduler`) playing Scheduler — its ticks going through the
//! schedule queue to the firing function, which submits one job per tick.
//!
//! The stack runs with a cap of [`MAX_SCHEDULES`] schedules per tenant. Waits on the firer are
//! derived from the schedules' own interval ([`RATE`]): a tick is due within one interval, and
//! [`TICK_WAIT`] gives it three.

use std::time::Duration;

use chrono::{DateTime, Utc};
use longhaul_tests::{Api, Deadline, Harness, Reply, harness, harness_with, principal};
use serde_json::{Value, json};

/// Schedules a tenant may have on this binary's stack.
const MAX_SCHEDULES: usize = 3;
/// The interval of the schedules that fire on their own.
const RATE: Duration = Duration::from_secs(60);
/// How long a tick may take to fire (due within one interval, and fired within a look of
/// the firer after that): three intervals, for a machine busy with a build.
const TICK_WAIT: Duration = Duration::from_secs(3 * RATE.as_secs());
/// How long a firing sent to the schedule queue may take to become a job, or to be consumed.
const DELIVERY_WAIT: Duration = Duration::from_secs(90);
/// Between two looks of a wait.
const LOOK: Duration = Duration::from_millis(250);

/// Held by the tests that delete schedules and by the one that runs the repair sweep: a sweep
/// reading a schedule between its twin's delete and its record's would recreate the twin.
static DELETES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_TENANT_MAX_SCHEDULES", &MAX_SCHEDULES.to_string())])
}

/// A quick `demo` job's spec on `schedule`, ticks never skipped for a live job.
fn every(schedule: &str) -> Value {
    json!({"type": "demo", "params": {"items": 1}, "schedule": schedule, "overlap": "allow"})
}

/// `method path` as `api` with an optional JSON body (every answer checked against the
/// OpenAPI document, and for IAM refusals).
async fn call(api: &Api, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let bytes = body.map(|b| ("application/json", b.to_string().into_bytes()));
    api.send(method, path, bytes, &[]).await
}

/// Creates a schedule: `201`, its `Location`, its view.
async fn create(api: &Api, body: &Value) -> Value {
    let reply = call(api, "POST", "/schedules", Some(body)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let id = reply.json["schedule_id"].as_str().expect("schedule_id");
    assert_eq!(reply.header("location"), Some(format!("/schedules/{id}").as_str()));
    reply.json
}

async fn view(api: &Api, id: &str) -> Value {
    let reply = call(api, "GET", &format!("/schedules/{id}"), None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json
}

fn assert_problem(reply: &Reply, status: u16, slug: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{}", reply.text);
    assert_eq!(reply.json["type"], format!("/problems/{slug}"), "{}", reply.text);
}

/// The jobs of schedule `id`, as `GET /jobs/{id}` shows each.
async fn jobs_of(api: &Api, id: &str) -> Vec<Value> {
    let listed = call(api, "GET", &format!("/jobs?schedule_id={id}&limit=100"), None).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let mut jobs = Vec::new();
    for job in listed.json["jobs"].as_array().expect("jobs") {
        let job_id = job["job_id"].as_str().expect("job_id");
        let reply = call(api, "GET", &format!("/jobs/{job_id}"), None).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        assert_eq!(reply.json["schedule_id"], id, "{}", reply.text);
        jobs.push(reply.json);
    }
    jobs
}

fn time(value: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().unwrap_or_else(|| panic!("a time: {value}")))
        .unwrap_or_else(|e| panic!("{value}: {e}"))
        .to_utc()
}

/// Polls schedule `id` until `done` holds for its view; panics after `limit`.
async fn wait_schedule(
    api: &Api,
    id: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Deadline::new(format!("{what} (schedule {id})"), limit);
    loop {
        let seen = view(api, id).await;
        if done(&seen) {
            return seen;
        }
        deadline.tick(LOOK, seen).await;
    }
}

fn count(view: &Value, name: &str) -> u64 {
    view["counts"][name].as_u64().unwrap_or_else(|| panic!("counts.{name}: {view}"))
}

/// The emulator's EventBridge Scheduler (uncounted).
async fn scheduler() -> aws_sdk_scheduler::Client {
    aws_sdk_scheduler::Client::new(&harness().stack.emulator_sdk_config().await)
}

async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&harness().stack.emulator_sdk_config().await)
}

/// Schedule `id`'s twin in the stack's group, if it has one.
async fn twin(id: &str) -> Option<aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput> {
    let group = harness().stack.resource("ScheduleGroup");
    match scheduler().await.get_schedule().group_name(group).name(id).send().await {
        Ok(twin) => Some(twin),
        Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => {
            None
        }
        Err(err) => panic!("reading the twin of {id}: {err:?}"),
    }
}

fn twin_state(twin: &aws_sdk_scheduler::operation::get_schedule::GetScheduleOutput) -> &str {
    twin.state().map(|s| s.as_str()).unwrap_or_default()
}

/// Waits until the schedule queue holds no message, visible or in flight: every firing sent
/// before has been consumed (the firing function answered for it). A firing the function
/// failed comes back after the queue's visibility timeout: the wait allows for one.
async fn schedule_queue_drained() {
    use aws_sdk_sqs::types::QueueAttributeName as Name;
    let queue = harness().stack.resource("ScheduleQueue");
    let sqs = sqs().await;
    let attributes = |names: &[Name]| {
        sqs.get_queue_attributes()
            .queue_url(&queue)
            .set_attribute_names(Some(names.to_vec()))
            .send()
    };
    let visibility: u64 = attributes(&[Name::VisibilityTimeout])
        .await
        .expect("queue attributes")
        .attributes()
        .and_then(|a| a.get(&Name::VisibilityTimeout))
        .expect("a visibility timeout")
        .parse()
        .expect("seconds");
    let deadline = Deadline::new(
        "the schedule queue to drain",
        Duration::from_secs(visibility) + DELIVERY_WAIT,
    );
    loop {
        let counts = attributes(&[
            Name::ApproximateNumberOfMessages,
            Name::ApproximateNumberOfMessagesNotVisible,
        ])
        .await
        .expect("queue attributes");
        let held: u64 = counts
            .attributes()
            .into_iter()
            .flatten()
            .map(|(_, v)| v.parse::<u64>().expect("a count"))
            .sum();
        if held == 0 {
            return;
        }
        deadline.tick(LOOK, format!("{held} messages")).await;
    }
}

/// Fires schedule `id`'s next tick now (`POST /_local/scheduler/{id}`): the status, and the
/// firing's report.
async fn fire_next(id: &str) -> (u16, Value) {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/scheduler/{id}", harness().stack.api_url))
        .send()
        .await
        .expect("the local route answers");
    (reply.status().as_u16(), reply.json().await.expect("JSON"))
}

#[tokio::test]
async fn bad_schedules_are_422_problems_and_create_nothing() {
    stack();
    let owner = principal("bad-schedules");
    let api = Api::new(&owner);
    for (body, slug) in [
        (every("rate(30 seconds)"), "invalid-schedule"),
        (every("cron(0 10 * * * *)"), "invalid-schedule"),
        (every("at(2030-01-01T00:00:00)"), "invalid-schedule"),
        (
            json!({"type": "demo", "params": {"items": 1}, "schedule": "rate(1 hour)", "timezone": "Mars/Olympus_Mons"}),
            "invalid-timezone",
        ),
        (
            json!({"type": "no-such-kind", "params": {}, "schedule": "rate(1 hour)"}),
            "unknown-job-type",
        ),
        (
            json!({"type": "demo", "params": {"items": -1}, "schedule": "rate(1 hour)"}),
            "invalid-params",
        ),
    ] {
        let reply = call(&api, "POST", "/schedules", Some(&body)).await;
        assert_problem(&reply, 422, slug);
        assert!(reply.header("location").is_none(), "{}", reply.text);
    }
    let listed = call(&api, "GET", "/schedules", None).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(listed.json["schedules"], json!([]), "{}", listed.text);
    let items = longhaul_tests::Aws::new().await.items_of(&owner).await;
    assert!(items.is_empty(), "a refused schedule wrote {items:?}");
}

/// The firer for real: a `rate(1 minute)` schedule fires at its creation and then every
/// minute on its own, each tick one job (with `schedule_id` and `scheduled_at`) at the tick's
/// time; a paused schedule created beside it fires nothing over the same minute, and fires
/// again once resumed; `trigger` submits a job at once, paused or not.
#[tokio::test]
async fn a_rate_schedule_fires_on_its_own_once_per_tick_and_a_paused_one_does_not() {
    stack();
    let api = Api::new(&principal("ticks"));
    // The paused one first: its tick comes before the enabled one's.
    let paused = create(&api, &json!({"paused": true, "type": "demo", "params": {"items": 1}, "schedule": "rate(1 minute)", "overlap": "allow"})).await;
    let paused_id = paused["schedule_id"].as_str().unwrap().to_owned();
    assert_eq!(paused["state"], "paused", "{paused}");
    assert_eq!(paused["next_fire_at"], Value::Null, "{paused}");
    let created = create(&api, &every("rate(1 minute)")).await;
    let id = created["schedule_id"].as_str().unwrap().to_owned();
    assert_eq!(created["state"], "enabled", "{created}");
    assert_eq!(created["schedule"], "rate(1 minute)");
    assert!(created["next_fire_at"].is_string(), "{created}");

    // Each has its twin in the stack's group: the same expression, sending a firing of the
    // schedule to the schedule queue with Scheduler's placeholder for the tick's time.
    let twin = twin(&id).await.expect("the schedule's twin");
    assert_eq!(twin.schedule_expression(), Some("rate(1 minute)"));
    assert_eq!(twin_state(&twin), "ENABLED");
    let target = twin.target().expect("a target");
    let queue_arn = format!(
        "arn:aws:sqs:us-east-1:123456789012:{}",
        harness().stack.resource("ScheduleQueue").rsplit('/').next().unwrap()
    );
    assert_eq!(target.arn(), queue_arn);
    let input: Value = serde_json::from_str(target.input().expect("an input")).unwrap();
    assert_eq!(input["schedule_id"], id.as_str());
    assert_eq!(input["scheduled_at"], longhaul_local::triggers::scheduler::SCHEDULED_TIME);
    assert_eq!(twin_state(&self::twin(&paused_id).await.expect("its twin")), "DISABLED");
    let calls = harness().stack.calls.by_function();
    assert!(
        calls["SchedulesFunction"].get("scheduler:CreateSchedule").is_some_and(|n| *n >= 2),
        "the twins are written through the edge, counted: {calls:?}"
    );

    // Trigger: a job at once, even while paused (a trigger's time is now, not a tick).
    let triggered = call(&api, "POST", &format!("/schedules/{paused_id}/trigger"), None).await;
    assert_eq!(triggered.status, 202, "{}", triggered.text);
    let after = wait_schedule(&api, &paused_id, "the trigger's job", DELIVERY_WAIT, |v| {
        count(v, "submitted") == 1
    })
    .await;
    assert_eq!(after["state"], "paused", "{after}");
    assert_eq!(after["next_fire_at"], Value::Null, "{after}");
    let triggered_jobs = jobs_of(&api, &paused_id).await;
    assert_eq!(triggered_jobs.len(), 1, "{triggered_jobs:?}");
    assert_eq!(after["last_fire"]["job_id"], triggered_jobs[0]["job_id"], "{after}");

    // Two ticks on its own: the one at its creation, and one a minute later.
    wait_schedule(&api, &id, "two ticks submitted", TICK_WAIT, |v| count(v, "submitted") >= 2)
        .await;
    let jobs = jobs_of(&api, &id).await;
    assert!(jobs.len() >= 2, "{jobs:?}");
    let anchor = twin.creation_date().expect("a creation date").secs();
    let mut ticks: Vec<DateTime<Utc>> = jobs.iter().map(|j| time(&j["scheduled_at"])).collect();
    ticks.sort();
    for tick in &ticks {
        assert_eq!(tick.timestamp_subsec_millis(), 0, "a tick's time is to the second: {tick}");
        assert_eq!(
            (tick.timestamp() - anchor).rem_euclid(RATE.as_secs() as i64),
            0,
            "{tick} is not a tick of rate(1 minute) from the twin's creation ({anchor})"
        );
    }
    let mut distinct = ticks.clone();
    distinct.dedup();
    assert_eq!(distinct, ticks, "one job per tick: {jobs:?}");
    assert_eq!(ticks[0].timestamp(), anchor, "a rate fires at its creation first");
    let mut job_ids: Vec<&str> = jobs.iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    job_ids.sort();
    job_ids.dedup();
    assert_eq!(job_ids.len(), jobs.len());
    let seen = view(&api, &id).await;
    assert_eq!(count(&seen, "skipped"), 0, "{seen}");
    assert_eq!(seen["last_fire"]["outcome"], "submitted", "{seen}");

    // Over the same minute (its tick came before the enabled one's second), the paused one
    // fired nothing but the trigger (a tick sent while paused would count, skipped).
    schedule_queue_drained().await;
    let still = view(&api, &paused_id).await;
    assert_eq!(count(&still, "fired"), 1, "a paused schedule fired: {still}");
    assert_eq!(still["state"], "paused");
    assert_eq!(jobs_of(&api, &paused_id).await.len(), 1);
    let (status, refused) = fire_next(&paused_id).await;
    assert_eq!(status, 409, "a DISABLED twin never fires: {refused}");

    // Resumed, it fires again: its twin is enabled, and its next tick makes a job.
    let resumed = call(&api, "POST", &format!("/schedules/{paused_id}/resume"), None).await;
    assert_eq!(resumed.status, 200, "{}", resumed.text);
    assert_eq!(resumed.json["state"], "enabled");
    assert!(resumed.json["next_fire_at"].is_string(), "{}", resumed.text);
    assert_eq!(twin_state(&self::twin(&paused_id).await.unwrap()), "ENABLED");
    let (status, fired) = fire_next(&paused_id).await;
    assert_eq!(status, 200, "{fired}");
    wait_schedule(&api, &paused_id, "a tick after resuming", DELIVERY_WAIT, |v| {
        count(v, "submitted") == 2
    })
    .await;
    let jobs = jobs_of(&api, &paused_id).await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(
        jobs.iter().any(|j| time(&j["scheduled_at"]) == time(&fired["scheduled_at"])),
        "{fired} {jobs:?}"
    );
}

/// A tick delivered twice (Scheduler and SQS deliver at least once) makes one job. The
/// schedule's own ticks fall on leap days only (the next years away), so only the test's
/// firings reach it; its window is open, so a tick now is within it.
#[tokio::test]
async fn a_tick_delivered_twice_makes_one_job() {
    stack();
    let api = Api::new(&principal("twice"));
    let created = create(
        &api,
        &json!({"type": "demo", "params": {"items": 1}, "schedule": "cron(0 0 29 FEB ? *)"}),
    )
    .await;
    let id = created["schedule_id"].as_str().unwrap().to_owned();
    let input = twin(&id).await.expect("a twin").target().unwrap().input().unwrap().to_owned();
    // What Scheduler sends for a tick now, twice at once.
    let tick = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let firing = input.replace(longhaul_local::triggers::scheduler::SCHEDULED_TIME, &tick);
    let queue = harness().stack.resource("ScheduleQueue");
    let sqs = sqs().await;
    let send = || sqs.send_message().queue_url(&queue).message_body(&firing).send();
    let (first, second) = tokio::join!(send(), send());
    first.expect("sent");
    second.expect("sent");
    wait_schedule(&api, &id, "the tick recorded", DELIVERY_WAIT, |v| count(v, "fired") >= 1).await;
    schedule_queue_drained().await;
    let jobs = jobs_of(&api, &id).await;
    assert_eq!(jobs.len(), 1, "a tick delivered twice made {} jobs: {jobs:?}", jobs.len());
    assert_eq!(time(&jobs[0]["scheduled_at"]), time(&json!(tick)));
    let seen = view(&api, &id).await;
    assert_eq!((count(&seen, "fired"), count(&seen, "submitted")), (1, 1), "{seen}");
    assert_eq!(seen["last_fire"]["job_id"], jobs[0]["job_id"], "{seen}");
}

/// The firer's `/_local/` route fires the next tick now: each call a later tick of the
/// expression, each one job.
#[tokio::test]
async fn two_ticks_make_two_distinct_jobs() {
    stack();
    let api = Api::new(&principal("forced"));
    let created = create(&api, &every("cron(0 3 * * ? *)")).await;
    let id = created["schedule_id"].as_str().unwrap().to_owned();
    let (status, first) = fire_next(&id).await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = fire_next(&id).await;
    assert_eq!(status, 200, "{second}");
    let (first_tick, second_tick) = (time(&first["scheduled_at"]), time(&second["scheduled_at"]));
    assert_eq!(second_tick - first_tick, chrono::TimeDelta::days(1), "{first} {second}");
    assert_eq!(first_tick.format("%H:%M:%S").to_string(), "03:00:00", "a tick of the expression");
    assert!(first_tick > time(&created["created_at"]), "no tick from before the schedule");
    wait_schedule(&api, &id, "both ticks submitted", DELIVERY_WAIT, |v| count(v, "submitted") == 2)
        .await;
    let jobs = jobs_of(&api, &id).await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_ne!(jobs[0]["job_id"], jobs[1]["job_id"]);
    let mut ticks: Vec<DateTime<Utc>> = jobs.iter().map(|j| time(&j["scheduled_at"])).collect();
    ticks.sort();
    assert_eq!(ticks, vec![first_tick, second_tick]);
    let (status, _) = fire_next("no-such-schedule").await;
    assert_eq!(status, 404);
}

/// `PATCH` rewrites the schedule and its twin; a bad one is a 422 that changes neither.
#[tokio::test]
async fn patch_changes_the_expression_and_a_bad_patch_changes_nothing() {
    stack();
    let api = Api::new(&principal("patch"));
    let created = create(&api, &every("cron(0 10 * * ? *)")).await;
    let id = created["schedule_id"].as_str().unwrap().to_owned();
    let path = format!("/schedules/{id}");
    let patch = json!({"schedule": "cron(30 8 ? * MON-FRI *)", "timezone": "Europe/Berlin"});
    let patched = call(&api, "PATCH", &path, Some(&patch)).await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    assert_eq!(patched.json["schedule"], "cron(30 8 ? * MON-FRI *)");
    assert_eq!(patched.json["timezone"], "Europe/Berlin");
    // Its next fire is a time of the new expression in Berlin.
    let next = time(&patched.json["next_fire_at"]);
    let recurrence = longhaul_domain::recurrence::Recurrence::new(
        "cron(30 8 ? * MON-FRI *)".parse().unwrap(),
        "Europe/Berlin".parse().unwrap(),
        time(&created["created_at"]),
        None,
        None,
    )
    .unwrap();
    assert_eq!(recurrence.next_from(next), Some(next), "{next} is not a tick of the patch");
    let twin = twin(&id).await.expect("the twin");
    assert_eq!(twin.schedule_expression(), Some("cron(30 8 ? * MON-FRI *)"));
    assert_eq!(twin.schedule_expression_timezone(), Some("Europe/Berlin"));

    for (bad, slug) in [
        (json!({"schedule": "rate(0 minutes)"}), "invalid-schedule"),
        (json!({"timezone": "Europe/Atlantis"}), "invalid-timezone"),
        (json!({"params": {"items": -1}}), "invalid-params"),
    ] {
        let refused = call(&api, "PATCH", &path, Some(&bad)).await;
        assert_problem(&refused, 422, slug);
    }
    let unchanged = view(&api, &id).await;
    assert_eq!(unchanged["schedule"], patched.json["schedule"], "{unchanged}");
    assert_eq!(unchanged["timezone"], "Europe/Berlin");
    assert_eq!(unchanged["params"], json!({"items": 1}));
    assert_eq!(unchanged["updated_at"], patched.json["updated_at"], "{unchanged}");
    let twin = self::twin(&id).await.expect("the twin");
    assert_eq!(twin.schedule_expression(), Some("cron(30 8 ? * MON-FRI *)"));
    assert_eq!(twin.schedule_expression_timezone(), Some("Europe/Berlin"));
}

/// Another principal's schedule reads as missing, whatever it asks; the owner's delete is
/// `204`, then `404`, and takes the twin with it.
#[tokio::test]
async fn another_principal_gets_404_and_delete_removes_the_twin() {
    stack();
    let api = Api::new(&principal("owner"));
    let other = Api::new(&principal("other"));
    let created = create(&api, &every("cron(0 4 * * ? *)")).await;
    let id = created["schedule_id"].as_str().unwrap().to_owned();
    let path = format!("/schedules/{id}");
    for (method, path, body) in [
        ("GET", path.clone(), None),
        ("PATCH", path.clone(), Some(json!({"schedule": "rate(5 minutes)"}))),
        ("POST", format!("{path}/pause"), None),
        ("POST", format!("{path}/resume"), None),
        ("POST", format!("{path}/trigger"), None),
        ("DELETE", path.clone(), None),
    ] {
        let reply = call(&other, method, &path, body.as_ref()).await;
        assert_problem(&reply, 404, "not-found");
    }
    let listed = call(&other, "GET", "/schedules", None).await;
    assert_eq!(listed.json["schedules"], json!([]), "{}", listed.text);
    let untouched = view(&api, &id).await;
    assert_eq!(untouched["schedule"], "cron(0 4 * * ? *)", "{untouched}");
    assert_eq!(count(&untouched, "fired"), 0, "{untouched}");
    assert!(twin(&id).await.is_some());

    let deleting = DELETES.lock().await;
    let deleted = call(&api, "DELETE", &path, None).await;
    drop(deleting);
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert_problem(&call(&api, "GET", &path, None).await, 404, "not-found");
    assert_problem(&call(&api, "DELETE", &path, None).await, 404, "not-found");
    assert!(twin(&id).await.is_none(), "the twin outlived its schedule");
    assert_eq!(fire_next(&id).await.0, 404);
}

/// A tenant has at most `LONGHAUL_TENANT_MAX_SCHEDULES`: one more is `429`, creating nothing,
/// until one is deleted.
#[tokio::test]
async fn schedules_beyond_the_tenants_cap_are_429() {
    stack();
    let api = Api::new(&principal("cap"));
    let mut ids = Vec::new();
    for hour in 0..MAX_SCHEDULES {
        let created = create(&api, &every(&format!("cron(0 {hour} * * ? *)"))).await;
        ids.push(created["schedule_id"].as_str().unwrap().to_owned());
    }
    let refused = call(&api, "POST", "/schedules", Some(&every("cron(0 12 * * ? *)"))).await;
    assert_problem(&refused, 429, "too-many-schedules");
    assert!(refused.header("retry-after").is_some(), "{:?}", refused.headers);
    let listed = call(&api, "GET", "/schedules?limit=100", None).await;
    let listed: Vec<&str> = listed.json["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["schedule_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), MAX_SCHEDULES, "{listed:?}");
    // Another tenant is not held back by this one's count.
    create(&Api::new(&principal("cap-other")), &every("cron(0 12 * * ? *)")).await;
    let deleting = DELETES.lock().await;
    let deleted = call(&api, "DELETE", &format!("/schedules/{}", ids[0]), None).await;
    drop(deleting);
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    create(&api, &every("cron(0 12 * * ? *)")).await;
}

/// The hourly repair sweep makes every twin what its record says: one deleted behind the API's
/// back is recreated, one edited by hand (another expression, disabled) is rewritten.
#[tokio::test]
async fn the_repair_sweep_restores_a_missing_or_edited_twin() {
    stack();
    let api = Api::new(&principal("repair"));
    let missing = create(&api, &every("cron(0 5 * * ? *)")).await;
    let missing = missing["schedule_id"].as_str().unwrap().to_owned();
    let edited = create(&api, &every("cron(0 6 * * ? *)")).await;
    let edited = edited["schedule_id"].as_str().unwrap().to_owned();
    let group = harness().stack.resource("ScheduleGroup");
    let client = scheduler().await;
    client.delete_schedule().group_name(&group).name(&missing).send().await.expect("deleted");
    let original = twin(&edited).await.expect("its twin");
    client
        .update_schedule()
        .group_name(&group)
        .name(&edited)
        .schedule_expression("rate(5 minutes)")
        .state(aws_sdk_scheduler::types::ScheduleState::Disabled)
        .set_flexible_time_window(original.flexible_time_window().cloned())
        .set_target(original.target().cloned())
        .send()
        .await
        .expect("edited");

    let repairing = DELETES.lock().await;
    let run = longhaul_tests::fire("schedule-repair").await;
    drop(repairing);
    assert!(run["output"]["repaired"].as_u64().is_some_and(|n| n >= 2), "{run}");
    for (id, expression) in [(&missing, "cron(0 5 * * ? *)"), (&edited, "cron(0 6 * * ? *)")] {
        let restored = twin(id).await.unwrap_or_else(|| panic!("{id} has no twin: {run}"));
        assert_eq!(restored.schedule_expression(), Some(expression), "{restored:?}");
        assert_eq!(twin_state(&restored), "ENABLED", "{restored:?}");
        assert_eq!(
            restored.target().and_then(|t| t.input()),
            original.target().and_then(|t| t.input()).map(|i| i.replace(&edited, id)).as_deref()
        );
    }
}
