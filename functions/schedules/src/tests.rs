//! Unit tests of the routes and the firing over the in-memory adapters.
//!
//! Every test builds a [`World`]: the routes' [`Deps`] and the firing's [`FireDeps`] over the
//! same in-memory schedules, twins, firing queue and job table, with one [`ManualClock`]
//! standing at [`NOW`] (a Monday, 08:30 UTC). Schedules are made through `POST /schedules`,
//! and firings are delivered as the schedule queue delivers them (a message body), so each
//! test runs the path a schedule takes in production.

use super::*;

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
use chrono::{DateTime, Utc};
use lambda_http::http::header;
use longhaul_aws::AwsError;
use longhaul_aws::jobs::{
    FireRecord, FireWrite, IdempotencyRecord, JobRecord, ListFilter, SchedulePage, ScheduleRecord,
    ScheduleWrite, ScheduledBy, StoreError,
};
use longhaul_aws::ports::{JobCreation, JobListing, JobReads, RateLimits, ScheduleTwins, Warm};
use longhaul_aws::scheduler::{FiringKind, SCHEDULED_TIME, ScheduleFiring, Twin};
use longhaul_domain::admission::Priority;
use longhaul_domain::fingerprint::submission_fingerprint;
use longhaul_domain::schedules::{
    CATCH_UP_SECONDS, FireOutcome, Overlap, ScheduleId, ScheduleState, tick_idempotency_key,
};
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryJobStore, MemoryObjects, MemoryRateLimits,
    MemoryScheduleFirings, MemoryScheduleTwins, MemorySchedules, owner,
};
use serde_json::{Value, json};

use crate::fire::{FireDeps, FireError};

/// Where every world's clock stands: Monday 2 March 2099, 08:30 UTC. Later than the machine's
/// clock on purpose: the in-memory job table expires idempotency keys by the machine's clock,
/// so a world standing in the past would find every tick's key expired.
const NOW: &str = "2099-03-02T08:30:00Z";
/// A daily expression: 09:00 in the schedule's zone.
const DAILY: &str = "cron(0 9 * * ? *)";
/// A public callback address that needs no name lookup.
const CALLBACK: &str = "https://93.184.216.34/hook";

fn t(text: &str) -> Timestamp {
    text.parse().expect("a test time")
}

fn dt(text: &str) -> DateTime<Utc> {
    t(text).as_datetime()
}

/// The body of `POST /schedules` for a daily demo job.
fn daily() -> Value {
    json!({"type": "demo", "params": {"items": 1}, "schedule": DAILY})
}

/// `daily()` with `members` set (or, `null`, removed).
fn daily_with(members: Value) -> Value {
    let mut body = daily();
    for (name, value) in members.as_object().expect("members").clone() {
        if value.is_null() {
            body.as_object_mut().unwrap().remove(&name);
        } else {
            body[name] = value;
        }
    }
    body
}

/// The status and problem type (`/problems/<slug>`'s slug) of a problem response.
fn problem(response: &Response<Body>) -> (u16, String) {
    assert_eq!(
        response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "a problem: {}",
        String::from_utf8_lossy(response.body().as_ref())
    );
    let body = json_of(response);
    assert_eq!(body["status"], response.status().as_u16(), "{body}");
    let slug = body["type"].as_str().unwrap_or_default().trim_start_matches("/problems/");
    (response.status().as_u16(), slug.to_owned())
}

fn header_of<'r>(response: &'r Response<Body>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

// ---------------------------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------------------------

/// The in-memory schedules, with faults a test arranges.
#[derive(Debug, Default)]
struct Schedules {
    memory: MemorySchedules,
    /// Every read and write of these schedules fails (a throttled partition).
    broken: Mutex<HashSet<ScheduleId>>,
    /// The next firing's record fails (after its job was submitted).
    fail_next_fire: AtomicBool,
    /// Written, as another request's change would be, just before the next replace.
    interloper: Mutex<Option<ScheduleRecord>>,
    /// Recorded, as a later tick's concurrent delivery would be, just before the next firing's
    /// record.
    overtaker: Mutex<Option<FireRecord>>,
}

fn outage(doing: &str) -> StoreError {
    StoreError::Aws(AwsError {
        context: doing.to_owned(),
        detail: "service unavailable (a test's fault)".to_owned(),
        refusal: None,
    })
}

impl Schedules {
    fn check(&self, id: &ScheduleId, doing: &str) -> Result<(), StoreError> {
        if self.broken.lock().unwrap().contains(id) {
            return Err(outage(doing));
        }
        Ok(())
    }
}

impl Warm for Schedules {}

#[async_trait]
impl longhaul_aws::ports::ScheduleSweep for Schedules {
    async fn schedule_entries(
        &self,
        shard: u32,
        after: Option<&ScheduleId>,
        limit: u32,
    ) -> Result<longhaul_aws::jobs::ScheduleEntries, StoreError> {
        self.memory.schedule_entries(shard, after, limit).await
    }
}

#[async_trait]
impl ScheduleStore for Schedules {
    async fn create_schedule(&self, record: &ScheduleRecord, max: u32) -> Result<bool, StoreError> {
        self.memory.create_schedule(record, max).await
    }
    async fn schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        self.check(id, "read schedule")?;
        self.memory.schedule(owner, id).await
    }
    async fn schedules(
        &self,
        owner: &Owner,
        limit: u32,
        after: Option<&ScheduleId>,
    ) -> Result<SchedulePage, StoreError> {
        self.memory.schedules(owner, limit, after).await
    }
    async fn replace_schedule(
        &self,
        record: &ScheduleRecord,
        read: u64,
    ) -> Result<ScheduleWrite, StoreError> {
        self.check(&record.schedule_id, "write schedule")?;
        let interloper = self.interloper.lock().unwrap().take();
        if let Some(other) = interloper {
            let written = self.memory.replace_schedule(&other, other.version - 1).await?;
            assert_eq!(written, ScheduleWrite::Written, "the other change is written first");
        }
        self.memory.replace_schedule(record, read).await
    }
    async fn delete_schedule(&self, owner: &Owner, id: &ScheduleId) -> Result<bool, StoreError> {
        self.check(id, "delete schedule")?;
        self.memory.delete_schedule(owner, id).await
    }
    async fn record_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<FireWrite, StoreError> {
        self.check(id, "record a firing")?;
        if self.fail_next_fire.swap(false, Ordering::SeqCst) {
            return Err(outage("record a firing"));
        }
        let overtaker = self.overtaker.lock().unwrap().take();
        if let Some(later) = overtaker {
            let written = self.memory.record_fire(owner, id, &later).await?;
            assert_eq!(written, FireWrite::Recorded, "the later tick is recorded first");
        }
        self.memory.record_fire(owner, id, fire).await
    }
    async fn count_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        self.check(id, "count a firing")?;
        self.memory.count_fire(owner, id, fire).await
    }
    async fn release_held(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        self.check(id, "release a held tick")?;
        self.memory.release_held(owner, id, fire).await
    }
}

struct World {
    schedules: Arc<Schedules>,
    twins: Arc<MemoryScheduleTwins>,
    firings: Arc<MemoryScheduleFirings>,
    jobs: Arc<MemoryJobStore>,
    limits: Arc<MemoryRateLimits>,
    queue: Arc<MemoryDispatchQueue>,
    /// Both functions' clock: standing at [`NOW`] unless moved.
    clock: Arc<ManualClock>,
    /// The routes'.
    deps: Deps,
    /// The firing's.
    fire: FireDeps,
}

/// A world without a rate limit or a backlog cap.
fn world() -> World {
    world_limited(0, 0)
}

/// `per_minute` submissions a minute per tenant (0: no limit), at most `max_pending` jobs
/// not yet running (0: no cap); the demo and CSV report kinds enabled; 100 schedules a tenant.
fn world_limited(per_minute: u32, max_pending: usize) -> World {
    let schedules = Arc::new(Schedules::default());
    let twins = Arc::new(MemoryScheduleTwins::new());
    let firings = Arc::new(MemoryScheduleFirings::new());
    let jobs = Arc::new(MemoryJobStore::new());
    let clock = Arc::new(ManualClock::at(dt(NOW)));
    let limits = Arc::new(MemoryRateLimits::on_clock(per_minute, clock.clone()));
    let queue = Arc::new(MemoryDispatchQueue::new());
    let registry = longhaul_jobs::registry().enabled(&["demo".into(), "csv_report".into()]);
    let callbacks = longhaul_domain::callback::CallbackPolicy { allow_insecure: false };
    let deps = Deps {
        store: schedules.clone(),
        twins: twins.clone(),
        firings: firings.clone(),
        registry: registry.clone(),
        callbacks,
        max_schedules: DEFAULT_MAX_SCHEDULES,
        clock: clock.clone(),
    };
    let fire = FireDeps {
        store: schedules.clone(),
        twins: twins.clone(),
        submit: submit::Deps {
            jobs: jobs.clone(),
            limiter: limits.clone(),
            submissions_per_minute: per_minute,
            intake: queue.clone(),
            uploads: Arc::new(MemoryObjects::new()),
            idempotency_ttl: Duration::from_secs(86_400),
            registry,
            callbacks,
            policy_overrides: Default::default(),
            max_pending,
            clock: clock.clone(),
            // As deployed: the schedules function enqueues every job it submits.
            start: None,
        },
    };
    World { schedules, twins, firings, jobs, limits, queue, clock, deps, fire }
}

fn alice() -> Owner {
    owner("alice")
}

impl World {
    // The routes.

    async fn call(&self, request: ApiRequest) -> Response<Body> {
        handle(&self.deps, request.build()).await
    }

    /// `POST /schedules` from `principal`.
    async fn create(&self, principal: &str, body: &Value) -> Response<Body> {
        self.call(
            ApiRequest::new("POST", "/schedules", principal).route("POST /schedules").json(body),
        )
        .await
    }

    /// Alice's schedule made of `body` (asserting the `201`).
    async fn created(&self, body: &Value) -> ScheduleId {
        let response = self.create("alice", body).await;
        assert_eq!(response.status(), 201, "{}", json_of(&response));
        json_of(&response)["schedule_id"].as_str().unwrap().parse().unwrap()
    }

    /// `method /schedules/{id}<suffix>` on the route `route`.
    fn on(&self, method: &str, principal: &str, id: &str, suffix: &str) -> ApiRequest {
        ApiRequest::new(method, &format!("/schedules/{id}{suffix}"), principal)
            .route(&format!("{method} /schedules/{{id}}{suffix}"))
            .param("id", id)
    }

    async fn get(&self, principal: &str, id: &str) -> Response<Body> {
        self.call(self.on("GET", principal, id, "")).await
    }

    async fn list(&self, principal: &str, query: &[(&str, &str)]) -> Response<Body> {
        let mut request = ApiRequest::new("GET", "/schedules", principal).route("GET /schedules");
        for (name, value) in query {
            request = request.query(name, value);
        }
        self.call(request).await
    }

    async fn patch(&self, principal: &str, id: &str, body: &Value) -> Response<Body> {
        self.call(self.on("PATCH", principal, id, "").json(body)).await
    }

    async fn delete(&self, principal: &str, id: &str) -> Response<Body> {
        self.call(self.on("DELETE", principal, id, "")).await
    }

    /// `POST /schedules/{id}/<action>` (`pause`, `resume`, `trigger`), with a body if given.
    async fn act(
        &self,
        principal: &str,
        id: &str,
        action: &str,
        body: Option<&Value>,
    ) -> Response<Body> {
        let mut request = self.on("POST", principal, id, &format!("/{action}"));
        if let Some(body) = body {
            request = request.json(body);
        }
        self.call(request).await
    }

    /// Alice's schedule as stored.
    async fn record(&self, id: &ScheduleId) -> Option<ScheduleRecord> {
        self.schedules.memory.schedule(&alice(), id).await.unwrap()
    }

    /// How many schedules `owner` has.
    async fn count(&self, owner: &Owner) -> usize {
        self.schedules.memory.schedules(owner, 1_000, None).await.unwrap().schedules.len()
    }

    fn twin(&self, id: &ScheduleId) -> Option<Twin> {
        self.twins.all().get(id.as_str()).cloned()
    }

    // The firing.

    /// Delivers `firing` as the schedule queue does.
    async fn deliver(&self, firing: &ScheduleFiring) -> Result<(), FireError> {
        fire::fire(&self.fire, &serde_json::to_string(firing).unwrap()).await
    }

    /// Delivers the tick `at` of alice's schedule 5 s after its time.
    async fn tick(&self, id: &ScheduleId, at: &str) -> Result<(), FireError> {
        self.clock.set(dt(at) + chrono::Duration::seconds(5));
        self.deliver(&firing(id, at, FiringKind::Tick)).await
    }

    /// Brings `job` to `status` and delivers the `ended` firing the slots function sends.
    async fn end(&self, id: &ScheduleId, job: &JobId, status: JobStatus) -> Result<(), FireError> {
        self.set_status(job, status).await;
        let at = self
            .job(job)
            .await
            .scheduled
            .map_or_else(|| NOW.to_owned(), |s| s.scheduled_at.to_string());
        let mut ended = firing(id, &at, FiringKind::Ended);
        ended.job_id = Some(job.clone());
        ended.status = Some(status);
        self.deliver(&ended).await
    }

    async fn job(&self, id: &JobId) -> JobRecord {
        self.jobs.job(id).await.unwrap().expect("the job is written")
    }

    async fn set_status(&self, id: &JobId, status: JobStatus) {
        let job = self.job(id).await;
        self.jobs.put_record(JobRecord { status, ..job });
    }

    /// The jobs of alice's schedule `id`, oldest first.
    async fn jobs_of(&self, id: &ScheduleId) -> Vec<JobRecord> {
        let filter = ListFilter { schedule_id: Some(id.clone()), ..Default::default() };
        let (page, _) = self.jobs.list(&alice(), &filter, 100, None).await.unwrap();
        let mut jobs = Vec::new();
        for entry in page {
            jobs.push(self.job(&entry.job_id).await);
        }
        jobs.sort_by_key(|job| job.job_id.clone());
        jobs
    }

    /// The ticks alice's schedule `id` has jobs for, in the order the jobs were made.
    async fn ticks_of(&self, id: &ScheduleId) -> Vec<String> {
        self.jobs_of(id)
            .await
            .iter()
            .map(|job| job.scheduled.as_ref().expect("a scheduled job").scheduled_at.to_string())
            .collect()
    }

    /// Every job of alice's, whatever made it.
    async fn all_jobs(&self) -> usize {
        self.jobs.list(&alice(), &ListFilter::default(), 100, None).await.unwrap().0.len()
    }
}

/// Alice's firing of schedule `id` for the time `at`.
fn firing(id: &ScheduleId, at: &str, kind: FiringKind) -> ScheduleFiring {
    ScheduleFiring {
        owner: "alice".into(),
        schedule_id: id.to_string(),
        scheduled_at: at.into(),
        kind,
        job_id: None,
        status: None,
    }
}

fn message(id: &str, body: &str) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.body = Some(body.to_owned());
    message
}

/// The last firing's outcome and reason.
fn last(record: &ScheduleRecord) -> (FireOutcome, String) {
    let fire = record.last_fire.as_ref().expect("a firing was recorded");
    (fire.outcome, fire.reason.clone().unwrap_or_default())
}

/// `(fired, submitted, skipped, refused)`.
fn counts(record: &ScheduleRecord) -> (u64, u64, u64, u64) {
    (record.fired, record.submitted, record.skipped, record.refused)
}

// ---------------------------------------------------------------------------------------------
// POST /schedules
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_new_schedule_is_created_with_its_twin_and_answered_with_its_view() {
    let w = world();
    let response = w.create("alice", &daily()).await;
    assert_eq!(response.status(), 201, "{}", json_of(&response));
    let view = json_of(&response);
    let id: ScheduleId = view["schedule_id"].as_str().unwrap().parse().unwrap();
    let location = format!("/schedules/{id}");
    assert_eq!(header_of(&response, "location"), Some(location.as_str()));
    assert_eq!(header_of(&response, "cache-control"), Some("no-store"));
    assert_eq!(
        view,
        json!({
            "schedule_id": id,
            "type": "demo",
            "params": {"items": 1},
            "schedule": DAILY,
            "timezone": "UTC",
            "overlap": "skip",
            "priority": "normal",
            "pause_on_failure": false,
            "state": "enabled",
            "next_fire_at": "2099-03-02T09:00:00.000Z",
            "counts": {"fired": 0, "submitted": 0, "skipped": 0, "refused": 0},
            "jobs_url": format!("/jobs?schedule_id={id}"),
            "created_at": "2099-03-02T08:30:00.000Z",
            "updated_at": "2099-03-02T08:30:00.000Z",
        })
    );

    let record = w.record(&id).await.expect("the record is written");
    assert_eq!((record.owner.as_str(), record.version), ("alice", 1));
    assert_eq!(
        (record.state, record.overlap, record.priority),
        (ScheduleState::Enabled, Overlap::Skip, Priority::Normal)
    );
    assert!(record.last_tick.is_none() && record.live_job.is_none() && record.held.is_none());

    let twins = w.twins.all();
    assert_eq!(twins.len(), 1, "one twin");
    let twin = &twins[id.as_str()];
    assert_eq!(
        (twin.name.as_str(), twin.expression.as_str(), twin.timezone.as_str()),
        (id.as_str(), DAILY, "UTC")
    );
    assert_eq!((twin.start_at, twin.end_at, twin.enabled), (None, None, true));
    let input: ScheduleFiring = serde_json::from_str(&twin.input).expect("the input is a firing");
    assert_eq!(
        input,
        ScheduleFiring {
            owner: "alice".into(),
            schedule_id: id.to_string(),
            scheduled_at: SCHEDULED_TIME.into(),
            kind: FiringKind::Tick,
            job_id: None,
            status: None,
        }
    );
    assert!(w.firings.take().is_empty(), "creating fires nothing");
    assert_eq!(w.all_jobs().await, 0, "creating submits nothing");

    // It reads back as it was answered.
    let read = w.get("alice", id.as_str()).await;
    assert_eq!(read.status(), 200);
    assert_eq!(json_of(&read), view);
}

#[tokio::test]
async fn every_member_of_a_spec_is_kept_and_reaches_the_twin() {
    let w = world();
    let body = json!({
        "type": "demo",
        "params": {"items": 3, "item_ms": 5},
        "schedule": "cron(0 9 ? * mon-fri *)",
        "timezone": "Europe/Berlin",
        "overlap": "buffer_one",
        "callback_url": CALLBACK,
        "priority": "high",
        "start_at": "2099-03-10T00:00:00Z",
        "end_at": "2099-12-31T00:00:00+01:00",
        "pause_on_failure": true,
    });
    let response = w.create("alice", &body).await;
    assert_eq!(response.status(), 201, "{}", json_of(&response));
    let view = json_of(&response);
    let id: ScheduleId = view["schedule_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(view["schedule"], "cron(0 9 ? * MON-FRI *)", "the canonical text");
    assert_eq!(view["params"], json!({"items": 3, "item_ms": 5}));
    assert_eq!(
        (&view["timezone"], &view["overlap"], &view["priority"], &view["callback_url"]),
        (&json!("Europe/Berlin"), &json!("buffer_one"), &json!("high"), &json!(CALLBACK))
    );
    assert_eq!(
        (&view["start_at"], &view["end_at"], &view["pause_on_failure"]),
        (&json!("2099-03-10T00:00:00.000Z"), &json!("2099-12-30T23:00:00.000Z"), &json!(true))
    );
    // The first weekday 09:00 in Berlin (UTC+1 in March) on or after the start: Tue 10 March.
    assert_eq!(view["next_fire_at"], "2099-03-10T08:00:00.000Z");
    assert_eq!(view["state"], "enabled");

    let record = w.record(&id).await.unwrap();
    assert_eq!(record.callback_url.as_deref(), Some(CALLBACK));
    assert_eq!(
        (record.overlap, record.priority, record.pause_on_failure),
        (Overlap::BufferOne, Priority::High, true)
    );
    let twin = w.twin(&id).unwrap();
    assert_eq!(
        (twin.expression.as_str(), twin.timezone.as_str(), twin.enabled),
        ("cron(0 9 ? * MON-FRI *)", "Europe/Berlin", true)
    );
    assert_eq!(
        (twin.start_at, twin.end_at),
        (Some(t("2099-03-10T00:00:00Z")), Some(t("2099-12-30T23:00:00Z")))
    );
}

#[tokio::test]
async fn the_next_fire_time_is_read_in_the_schedules_time_zone() {
    let w = world();
    // 09:00 in Berlin is 08:00 UTC, already past at 08:30 UTC: tomorrow's.
    let berlin = w.created(&daily_with(json!({"timezone": "Europe/Berlin"}))).await;
    let view = json_of(&w.get("alice", berlin.as_str()).await);
    assert_eq!(view["next_fire_at"], "2099-03-03T08:00:00.000Z");
    // 09:00 in New York is 14:00 UTC (EST, UTC-5, before 8 March).
    let new_york = w.created(&daily_with(json!({"timezone": "America/New_York"}))).await;
    let view = json_of(&w.get("alice", new_york.as_str()).await);
    assert_eq!(view["next_fire_at"], "2099-03-02T14:00:00.000Z");
    // The clock moves: the view is computed at read time.
    w.clock.set(dt("2099-03-02T14:00:00.001Z"));
    let view = json_of(&w.get("alice", new_york.as_str()).await);
    assert_eq!(view["next_fire_at"], "2099-03-03T14:00:00.000Z");
}

#[tokio::test]
async fn a_schedule_created_paused_has_a_disabled_twin_and_no_next_fire() {
    let w = world();
    let response = w.create("alice", &daily_with(json!({"paused": true}))).await;
    assert_eq!(response.status(), 201);
    let view = json_of(&response);
    let id: ScheduleId = view["schedule_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        (&view["state"], &view["paused_reason"]),
        (&json!("paused"), &json!("paused by its owner"))
    );
    assert!(view["next_fire_at"].is_null(), "{view}");
    assert_eq!(w.record(&id).await.unwrap().state, ScheduleState::Paused);
    assert!(!w.twin(&id).unwrap().enabled, "its twin does not fire");
}

#[tokio::test]
async fn every_bad_input_is_a_problem_that_creates_nothing() {
    let w = world();
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("not an object", json!([daily()]), 400, "bad-request"),
        ("no type", daily_with(json!({"type": null})), 400, "bad-request"),
        ("no schedule", daily_with(json!({"schedule": null})), 400, "bad-request"),
        ("an unknown member", daily_with(json!({"bogus": 1})), 400, "bad-request"),
        ("a job's member", daily_with(json!({"delay_seconds": 60})), 400, "bad-request"),
        ("schedule not a string", daily_with(json!({"schedule": 5})), 400, "bad-request"),
        ("paused not a bool", daily_with(json!({"paused": "yes"})), 400, "bad-request"),
        ("priority not a string", daily_with(json!({"priority": 1})), 400, "bad-request"),
        ("unparsable", daily_with(json!({"schedule": "every day"})), 422, "invalid-schedule"),
        (
            "five cron fields",
            daily_with(json!({"schedule": "cron(0 9 * * *)"})),
            422,
            "invalid-schedule",
        ),
        (
            "under a minute",
            daily_with(json!({"schedule": "rate(30 seconds)"})),
            422,
            "invalid-schedule",
        ),
        ("no ? day", daily_with(json!({"schedule": "cron(0 9 * * * *)"})), 422, "invalid-schedule"),
        (
            "30 February",
            daily_with(json!({"schedule": "cron(0 9 30 FEB ? *)"})),
            422,
            "invalid-schedule",
        ),
        (
            "unknown zone",
            daily_with(json!({"timezone": "Mars/Olympus_Mons"})),
            422,
            "invalid-timezone",
        ),
        ("offset, not a zone", daily_with(json!({"timezone": "+02:00"})), 422, "invalid-timezone"),
        ("unknown overlap", daily_with(json!({"overlap": "queue"})), 422, "invalid-overlap"),
        ("unknown priority", daily_with(json!({"priority": "urgent"})), 422, "invalid-priority"),
        ("start not a time", daily_with(json!({"start_at": "tomorrow"})), 422, "invalid-window"),
        (
            "end not a time",
            daily_with(json!({"end_at": "2099-13-01T00:00:00Z"})),
            422,
            "invalid-window",
        ),
        (
            "start whose offset moves it before year 0000",
            daily_with(json!({"start_at": "0000-01-01T00:30:00+01:00"})),
            422,
            "invalid-window",
        ),
        (
            "end whose offset moves it past year 9999",
            daily_with(json!({"end_at": "9999-12-31T23:59:59-01:00"})),
            422,
            "invalid-window",
        ),
        (
            "end before start",
            daily_with(
                json!({"start_at": "2099-06-01T00:00:00Z", "end_at": "2099-05-01T00:00:00Z"}),
            ),
            422,
            "invalid-window",
        ),
        (
            "end at start",
            daily_with(
                json!({"start_at": "2099-06-01T00:00:00Z", "end_at": "2099-06-01T00:00:00Z"}),
            ),
            422,
            "invalid-window",
        ),
        ("ended", daily_with(json!({"end_at": "2099-03-01T00:00:00Z"})), 422, "never-fires"),
        (
            "ends before its next tick",
            daily_with(json!({"end_at": "2099-03-02T08:59:59Z"})),
            422,
            "never-fires",
        ),
        (
            "a year gone",
            daily_with(json!({"schedule": "cron(0 9 * * ? 2025)"})),
            422,
            "never-fires",
        ),
        ("unknown type", daily_with(json!({"type": "nope"})), 422, "unknown-job-type"),
        (
            "disabled type",
            daily_with(json!({"type": "archive", "params": {}})),
            422,
            "unknown-job-type",
        ),
        ("params refused", daily_with(json!({"params": {"items": 0}})), 422, "invalid-params"),
        (
            "params of the wrong shape",
            daily_with(json!({"params": {"items": "many"}})),
            422,
            "invalid-params",
        ),
        (
            "callback not https",
            daily_with(json!({"callback_url": "http://93.184.216.34/hook"})),
            422,
            "invalid-callback-url",
        ),
        (
            "callback to a private address",
            daily_with(json!({"callback_url": "https://10.0.0.1/hook"})),
            422,
            "invalid-callback-url",
        ),
    ];
    for (name, body, status, slug) in cases {
        let response = w.create("alice", &body).await;
        assert_eq!(problem(&response), (status, slug.to_owned()), "{name}: {}", json_of(&response));
        assert_eq!(w.count(&alice()).await, 0, "{name}: no record");
        assert!(w.twins.all().is_empty(), "{name}: no twin");
    }

    // Not JSON at all.
    let raw = ApiRequest::new("POST", "/schedules", "alice")
        .route("POST /schedules")
        .header("content-type", "application/json")
        .raw_body(b"{\"type\": ");
    assert_eq!(problem(&w.call(raw).await), (400, "bad-request".into()));
    let text = ApiRequest::new("POST", "/schedules", "alice")
        .route("POST /schedules")
        .raw_body(daily().to_string().as_bytes());
    assert_eq!(problem(&w.call(text).await), (415, "unsupported-media-type".into()));
    let huge = daily_with(json!({"params": {"items": 1, "pad": "x".repeat(MAX_BODY_BYTES)}}));
    assert_eq!(problem(&w.create("alice", &huge).await), (413, "payload-too-large".into()));
    assert_eq!(w.count(&alice()).await, 0);
    assert!(w.twins.all().is_empty());
}

#[tokio::test]
async fn a_tenant_at_its_cap_is_refused_429_and_nothing_is_written() {
    let mut w = world();
    w.deps.max_schedules = 2;
    let first = w.created(&daily()).await;
    w.created(&daily()).await;
    let response = w.create("alice", &daily()).await;
    assert_eq!(problem(&response), (429, "too-many-schedules".into()));
    assert_eq!(header_of(&response, "retry-after"), Some("60"));
    assert_eq!(json_of(&response)["limit"], 2);
    assert_eq!(w.count(&alice()).await, 2, "no third record");
    assert_eq!(w.twins.all().len(), 2, "no third twin");

    // The cap is the tenant's: another one still creates.
    assert_eq!(w.create("bob", &daily()).await.status(), 201);
    // And a deleted schedule frees its place.
    assert_eq!(w.delete("alice", first.as_str()).await.status(), 204);
    assert_eq!(w.create("alice", &daily()).await.status(), 201);
    assert_eq!(w.count(&alice()).await, 2);
}

#[tokio::test]
async fn a_twin_that_cannot_be_written_takes_the_record_back() {
    let w = world();
    w.twins.set_unavailable(true);
    let response = w.create("alice", &daily()).await;
    assert_eq!(problem(&response), (503, "scheduler-unavailable".into()));
    assert_eq!(header_of(&response, "retry-after"), Some("5"));
    assert_eq!(w.count(&alice()).await, 0, "the record is taken back");
    w.twins.set_unavailable(false);
    assert!(w.twins.all().is_empty());
    // Repeated once the scheduler is back, it is made whole.
    let id = w.created(&daily()).await;
    assert!(w.twin(&id).is_some());
    assert_eq!(w.count(&alice()).await, 1);
}

#[tokio::test]
async fn a_store_that_fails_is_a_500_and_leaves_no_twin() {
    let w = world();
    w.schedules.memory.set_unavailable(true);
    assert_eq!(problem(&w.create("alice", &daily()).await), (500, "internal".into()));
    assert!(w.twins.all().is_empty());
    assert_eq!(problem(&w.list("alice", &[]).await), (500, "internal".into()));
}

#[tokio::test]
async fn a_request_without_a_principal_or_off_the_routes_is_refused() {
    let w = world();
    let anonymous = ApiRequest::new("POST", "/schedules", "x")
        .route("POST /schedules")
        .json(&daily())
        .anonymous();
    assert_eq!(problem(&w.call(anonymous).await), (401, "unauthorized".into()));
    let other =
        ApiRequest::new("PUT", "/schedules", "alice").route("PUT /schedules").json(&daily());
    assert_eq!(problem(&w.call(other).await), (404, "not-found".into()));
    assert_eq!(w.count(&alice()).await, 0);
}

// ---------------------------------------------------------------------------------------------
// GET /schedules, GET /schedules/{id}
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_list_pages_through_the_owners_schedules_only() {
    let w = world();
    let mut made = HashSet::new();
    for _ in 0..5 {
        made.insert(w.created(&daily()).await.to_string());
    }
    w.create("bob", &daily()).await;

    let first = w.list("alice", &[]).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header_of(&first, "cache-control"), Some("no-store"));
    let body = json_of(&first);
    assert_eq!(body["schedules"].as_array().unwrap().len(), 5, "a default page holds them all");
    assert!(body["next_cursor"].is_null(), "{body}");
    assert_eq!(body["schedules"][0]["counts"]["fired"], 0, "each is a view");

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut query = vec![("limit", "2")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.as_str()));
        }
        let body = json_of(&w.list("alice", &query).await);
        let page = body["schedules"].as_array().unwrap();
        assert!(page.len() <= 2, "{body}");
        seen.extend(page.iter().map(|s| s["schedule_id"].as_str().unwrap().to_owned()));
        pages += 1;
        match body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "the pages end");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5, "each once: {seen:?}");
    assert_eq!(seen.into_iter().collect::<HashSet<_>>(), made);

    let bobs = json_of(&w.list("bob", &[]).await);
    assert_eq!(bobs["schedules"].as_array().unwrap().len(), 1);
    assert!(!made.contains(bobs["schedules"][0]["schedule_id"].as_str().unwrap()));
    assert_eq!(json_of(&w.list("carol", &[]).await), json!({"schedules": [], "next_cursor": null}));
}

#[tokio::test]
async fn a_bad_query_is_a_400() {
    let w = world();
    w.created(&daily()).await;
    for query in [
        vec![("limit", "0")],
        vec![("limit", "101")],
        vec![("limit", "ten")],
        vec![("limit", "-1")],
        vec![("cursor", "not-a-cursor")],
        vec![("cursor", "")],
        vec![("status", "paused")],
        vec![("limit", "5"), ("schedule_id", "x")],
    ] {
        assert_eq!(
            problem(&w.list("alice", &query).await),
            (400, "bad-request".into()),
            "{query:?}"
        );
    }
    assert_eq!(w.list("alice", &[("limit", "100")]).await.status(), 200);
    assert_eq!(w.list("alice", &[("limit", "1")]).await.status(), 200);
}

#[tokio::test]
async fn an_unknown_or_malformed_id_is_a_404() {
    let w = world();
    let id = w.created(&daily()).await;
    let unknown = ScheduleId::new().to_string();
    let upper = id.as_str().to_uppercase();
    for id in [unknown.as_str(), "nope", upper.as_str()] {
        assert_eq!(problem(&w.get("alice", id).await), (404, "not-found".into()), "{id}");
        assert_eq!(problem(&w.patch("alice", id, &json!({"priority": "low"})).await).0, 404);
        assert_eq!(problem(&w.delete("alice", id).await).0, 404);
        for action in ["pause", "resume", "trigger"] {
            assert_eq!(problem(&w.act("alice", id, action, None).await).0, 404, "{action}");
        }
    }
    assert!(w.firings.take().is_empty());
}

#[tokio::test]
async fn another_principals_schedule_is_a_404_on_every_route_and_stays_as_it_is() {
    let w = world();
    let id = w.created(&daily_with(json!({"callback_url": CALLBACK}))).await;
    let before = w.record(&id).await.unwrap();
    let twin = w.twin(&id).unwrap();
    let id = id.as_str();
    let responses = [
        ("get", w.get("mallory", id).await),
        ("patch", w.patch("mallory", id, &json!({"schedule": "rate(1 minute)"})).await),
        ("delete", w.delete("mallory", id).await),
        ("pause", w.act("mallory", id, "pause", Some(&json!({"reason": "mine now"}))).await),
        ("resume", w.act("mallory", id, "resume", None).await),
        ("trigger", w.act("mallory", id, "trigger", None).await),
    ];
    for (route, response) in responses {
        assert_eq!(problem(&response), (404, "not-found".into()), "{route}");
    }
    let mallorys = json_of(&w.list("mallory", &[]).await);
    assert_eq!(mallorys["schedules"], json!([]));
    assert_eq!(w.record(&before.schedule_id).await.unwrap(), before, "unchanged");
    assert_eq!(w.twin(&before.schedule_id).unwrap(), twin, "its twin unchanged");
    assert!(w.firings.take().is_empty(), "nothing fired");
}

// ---------------------------------------------------------------------------------------------
// PATCH /schedules/{id}
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_patch_changes_what_it_names_and_rewrites_the_twin() {
    let w = world();
    let id = w.created(&daily_with(json!({"callback_url": CALLBACK, "priority": "high"}))).await;
    w.clock.set(dt("2099-03-02T08:40:00Z"));
    let response = w.patch("alice", id.as_str(), &json!({"schedule": "cron(30 10 * * ? *)"})).await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    assert_eq!(header_of(&response, "cache-control"), Some("no-store"));
    let view = json_of(&response);
    assert_eq!(view["schedule"], "cron(30 10 * * ? *)");
    assert_eq!(view["next_fire_at"], "2099-03-02T10:30:00.000Z");
    assert_eq!(view["updated_at"], "2099-03-02T08:40:00.000Z");
    assert_eq!(view["created_at"], "2099-03-02T08:30:00.000Z");
    // What the patch did not name stays.
    assert_eq!((&view["params"], &view["priority"]), (&json!({"items": 1}), &json!("high")));
    assert_eq!(view["callback_url"], CALLBACK);

    let record = w.record(&id).await.unwrap();
    assert_eq!((record.schedule.as_str(), record.version), ("cron(30 10 * * ? *)", 2));
    assert_eq!(w.twin(&id).unwrap().expression, "cron(30 10 * * ? *)", "the twin follows");
    assert_eq!(json_of(&w.get("alice", id.as_str()).await), view);

    // Several members at once; the time zone reaches the twin too.
    let response = w
        .patch(
            "alice",
            id.as_str(),
            &json!({"timezone": "Asia/Tokyo", "overlap": "allow", "params": {"items": 9}, "pause_on_failure": true}),
        )
        .await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    let record = w.record(&id).await.unwrap();
    assert_eq!((record.timezone.as_str(), record.overlap), ("Asia/Tokyo", Overlap::Allow));
    assert_eq!(
        (record.params.clone(), record.pause_on_failure, record.version),
        (json!({"items": 9}), true, 3)
    );
    assert_eq!(w.twin(&id).unwrap().timezone, "Asia/Tokyo");
    // An empty patch changes nothing but answers the schedule.
    let response = w.patch("alice", id.as_str(), &json!({})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(json_of(&response)["params"], json!({"items": 9}));
}

#[tokio::test]
async fn a_null_member_removes_it() {
    let w = world();
    let id = w
        .created(&daily_with(json!({
            "callback_url": CALLBACK,
            "end_at": "2099-12-31T00:00:00Z",
            "start_at": "2099-03-01T00:00:00Z",
            "priority": "low",
            "timezone": "Europe/Paris",
        })))
        .await;
    assert_eq!(w.twin(&id).unwrap().end_at, Some(t("2099-12-31T00:00:00Z")));
    let response = w
        .patch(
            "alice",
            id.as_str(),
            &json!({"callback_url": null, "end_at": null, "priority": null, "timezone": null}),
        )
        .await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    let view = json_of(&response);
    assert!(view.get("callback_url").is_none() && view.get("end_at").is_none(), "{view}");
    assert_eq!(view["start_at"], "2099-03-01T00:00:00.000Z", "what was not named stays");
    assert_eq!(
        (&view["priority"], &view["timezone"]),
        (&json!("normal"), &json!("UTC")),
        "back to the defaults"
    );
    let record = w.record(&id).await.unwrap();
    assert!(record.callback_url.is_none() && record.end_at.is_none());
    let twin = w.twin(&id).unwrap();
    assert_eq!(
        (twin.end_at, twin.start_at, twin.timezone.as_str()),
        (None, Some(t("2099-03-01T00:00:00Z")), "UTC")
    );
}

#[tokio::test]
async fn a_bad_patch_is_a_problem_that_changes_nothing() {
    let w = world();
    let id = w.created(&daily_with(json!({"callback_url": CALLBACK}))).await;
    let before = w.record(&id).await.unwrap();
    let twin = w.twin(&id).unwrap();
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("not an object", json!(["schedule"]), 400, "bad-request"),
        ("a string", json!("rate(1 hour)"), 400, "bad-request"),
        ("an unknown member", json!({"bogus": 1}), 400, "bad-request"),
        ("the id", json!({"schedule_id": ScheduleId::new()}), 400, "bad-request"),
        ("the state", json!({"state": "paused"}), 400, "bad-request"),
        ("type removed", json!({"type": null}), 400, "bad-request"),
        ("schedule removed", json!({"schedule": null}), 400, "bad-request"),
        ("paused not a bool", json!({"paused": "yes"}), 400, "bad-request"),
        ("under a minute", json!({"schedule": "rate(30 seconds)"}), 422, "invalid-schedule"),
        ("unknown zone", json!({"timezone": "Mars/Base"}), 422, "invalid-timezone"),
        ("unknown overlap", json!({"overlap": "queue"}), 422, "invalid-overlap"),
        ("unknown priority", json!({"priority": "urgent"}), 422, "invalid-priority"),
        (
            "end before start",
            json!({"start_at": "2099-06-01T00:00:00Z", "end_at": "2099-05-01T00:00:00Z"}),
            422,
            "invalid-window",
        ),
        ("ended", json!({"end_at": "2099-03-01T00:00:00Z"}), 422, "never-fires"),
        ("unknown type", json!({"type": "nope"}), 422, "unknown-job-type"),
        ("disabled type", json!({"type": "archive"}), 422, "unknown-job-type"),
        ("params refused", json!({"params": {"items": 0}}), 422, "invalid-params"),
        (
            "callback not https",
            json!({"callback_url": "http://93.184.216.34/hook"}),
            422,
            "invalid-callback-url",
        ),
        // Good members do not carry a bad one through.
        ("one bad of two", json!({"priority": "low", "overlap": "queue"}), 422, "invalid-overlap"),
    ];
    for (name, patch, status, slug) in cases {
        let response = w.patch("alice", id.as_str(), &patch).await;
        assert_eq!(problem(&response), (status, slug.to_owned()), "{name}: {}", json_of(&response));
        assert_eq!(w.record(&id).await.unwrap(), before, "{name}: the record is unchanged");
        assert_eq!(w.twin(&id).unwrap(), twin, "{name}: the twin is unchanged");
    }
    let text = w.on("PATCH", "alice", id.as_str(), "").raw_body(b"{\"priority\": \"low\"}");
    assert_eq!(problem(&w.call(text).await), (415, "unsupported-media-type".into()));
    assert_eq!(w.record(&id).await.unwrap(), before);
}

#[tokio::test]
async fn a_patch_is_checked_through_the_registry_as_a_submission_is() {
    let mut w = world();
    let id = w.created(&daily()).await;
    let response =
        w.patch("alice", id.as_str(), &json!({"params": {"items": 7, "item_ms": 2}})).await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    assert_eq!(w.record(&id).await.unwrap().params, json!({"items": 7, "item_ms": 2}));
    let response =
        w.patch("alice", id.as_str(), &json!({"params": {"items": 3, "item_ms": 600_000}})).await;
    assert_eq!(problem(&response), (422, "invalid-params".into()));
    // The kind is turned off for the deployment: every change of a schedule of that kind is
    // refused, since the spec as a whole is re-checked.
    w.deps.registry = longhaul_jobs::registry().enabled(&["csv_report".into()]);
    let before = w.record(&id).await.unwrap();
    let response = w.patch("alice", id.as_str(), &json!({"priority": "low"})).await;
    assert_eq!(problem(&response), (422, "unknown-job-type".into()));
    assert_eq!(w.record(&id).await.unwrap(), before);
}

#[tokio::test]
async fn a_patch_that_lost_a_race_is_applied_to_the_schedule_as_it_now_is() {
    let w = world();
    let id = w.created(&daily()).await;
    // Another request pauses the schedule between this patch's read and its write.
    let mut paused = w.record(&id).await.unwrap();
    paused.state = ScheduleState::Paused;
    paused.paused_reason = Some("someone else".into());
    paused.version = 2;
    *w.schedules.interloper.lock().unwrap() = Some(paused);
    let response = w.patch("alice", id.as_str(), &json!({"priority": "high"})).await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    let record = w.record(&id).await.unwrap();
    assert_eq!(record.version, 3, "written over the other change");
    assert_eq!(
        (record.priority, record.state),
        (Priority::High, ScheduleState::Paused),
        "both changes kept"
    );
    assert_eq!(record.paused_reason.as_deref(), Some("someone else"));
    assert!(!w.twin(&id).unwrap().enabled, "the twin is written from the record as it is");
}

#[tokio::test]
async fn paused_through_a_patch_and_back() {
    let w = world();
    let id = w.created(&daily()).await;
    let view = json_of(&w.patch("alice", id.as_str(), &json!({"paused": true})).await);
    assert_eq!(
        (&view["state"], &view["paused_reason"]),
        (&json!("paused"), &json!("paused by its owner"))
    );
    assert!(!w.twin(&id).unwrap().enabled);
    // A patch of something else leaves it paused.
    let view = json_of(&w.patch("alice", id.as_str(), &json!({"priority": "low"})).await);
    assert_eq!(view["state"], "paused");
    assert!(!w.twin(&id).unwrap().enabled);
    let view = json_of(&w.patch("alice", id.as_str(), &json!({"paused": false})).await);
    assert_eq!(view["state"], "enabled");
    assert!(view.get("paused_reason").is_none(), "{view}");
    assert!(w.twin(&id).unwrap().enabled);
}

#[tokio::test]
async fn a_change_whose_twin_cannot_be_written_is_a_503_that_a_repeat_completes() {
    let w = world();
    let id = w.created(&daily()).await;
    w.twins.set_unavailable(true);
    let response = w.patch("alice", id.as_str(), &json!({"schedule": "rate(1 hour)"})).await;
    assert_eq!(problem(&response), (503, "scheduler-unavailable".into()));
    assert_eq!(header_of(&response, "retry-after"), Some("5"));
    let response = w.act("alice", id.as_str(), "pause", None).await;
    assert_eq!(problem(&response), (503, "scheduler-unavailable".into()));
    w.twins.set_unavailable(false);
    // Repeated, as the problem asks: the twin ends up as the record says.
    assert_eq!(
        w.patch("alice", id.as_str(), &json!({"schedule": "rate(1 hour)"})).await.status(),
        200
    );
    assert_eq!(w.act("alice", id.as_str(), "pause", None).await.status(), 200);
    let twin = w.twin(&id).unwrap();
    assert_eq!((twin.expression.as_str(), twin.enabled), ("rate(1 hour)", false));
    assert_eq!(w.record(&id).await.unwrap().state, ScheduleState::Paused);
}

// ---------------------------------------------------------------------------------------------
// pause, resume, DELETE, trigger
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn pause_and_resume_change_the_state_the_view_and_the_twin() {
    let w = world();
    let id = w.created(&daily()).await;
    let response = w.act("alice", id.as_str(), "pause", None).await;
    assert_eq!(response.status(), 200, "{}", json_of(&response));
    let view = json_of(&response);
    assert_eq!(
        (&view["state"], &view["paused_reason"]),
        (&json!("paused"), &json!("paused by its owner"))
    );
    assert!(view["next_fire_at"].is_null(), "{view}");
    assert!(!w.twin(&id).unwrap().enabled);
    assert_eq!(w.record(&id).await.unwrap().version, 2);

    let response = w.act("alice", id.as_str(), "resume", None).await;
    assert_eq!(response.status(), 200);
    let view = json_of(&response);
    assert_eq!(view["state"], "enabled");
    assert!(view.get("paused_reason").is_none(), "{view}");
    assert_eq!(view["next_fire_at"], "2099-03-02T09:00:00.000Z");
    assert!(w.twin(&id).unwrap().enabled);
    let record = w.record(&id).await.unwrap();
    assert_eq!((record.state, record.paused_reason.clone()), (ScheduleState::Enabled, None));

    // With a reason; the longest one allowed; the reason shows until resumed.
    let reason = "r".repeat(500);
    let response = w.act("alice", id.as_str(), "pause", Some(&json!({"reason": reason}))).await;
    assert_eq!(response.status(), 200);
    assert_eq!(json_of(&response)["paused_reason"], reason);
    assert_eq!(w.record(&id).await.unwrap().paused_reason.as_deref(), Some(reason.as_str()));
    let again = w.act("alice", id.as_str(), "resume", Some(&json!({}))).await;
    assert_eq!(again.status(), 200);
    let response =
        w.act("alice", id.as_str(), "pause", Some(&json!({"reason": "quarter close"}))).await;
    assert_eq!(json_of(&response)["paused_reason"], "quarter close");
    // Resuming an enabled schedule, or pausing a paused one, is no error.
    assert_eq!(w.act("alice", id.as_str(), "pause", None).await.status(), 200);
    assert_eq!(w.record(&id).await.unwrap().paused_reason.as_deref(), Some("quarter close"));
}

#[tokio::test]
async fn a_bad_pause_reason_is_a_400_that_changes_nothing() {
    let w = world();
    let id = w.created(&daily()).await;
    let before = w.record(&id).await.unwrap();
    for body in [json!({"reason": "r".repeat(501)}), json!({"reason": 5}), json!({"reason": ["a"]})]
    {
        let response = w.act("alice", id.as_str(), "pause", Some(&body)).await;
        assert_eq!(problem(&response), (400, "bad-request".into()), "{body}");
    }
    let raw = w
        .on("POST", "alice", id.as_str(), "/pause")
        .header("content-type", "application/json")
        .raw_body(b"{\"reason\"");
    assert_eq!(problem(&w.call(raw).await), (400, "bad-request".into()));
    assert_eq!(w.record(&id).await.unwrap(), before);
    assert!(w.twin(&id).unwrap().enabled);
}

#[tokio::test]
async fn a_deleted_schedule_and_its_twin_are_gone() {
    let w = world();
    let id = w.created(&daily()).await;
    let kept = w.created(&daily()).await;
    let response = w.delete("alice", id.as_str()).await;
    assert_eq!(response.status(), 204);
    assert!(response.body().is_empty());
    assert!(w.twin(&id).is_none(), "its twin is deleted");
    assert!(w.record(&id).await.is_none(), "its record is deleted");
    assert_eq!(problem(&w.get("alice", id.as_str()).await), (404, "not-found".into()));
    assert_eq!(problem(&w.delete("alice", id.as_str()).await), (404, "not-found".into()));
    assert_eq!(problem(&w.act("alice", id.as_str(), "trigger", None).await).0, 404);
    let list = json_of(&w.list("alice", &[]).await);
    assert_eq!(list["schedules"].as_array().unwrap().len(), 1);
    assert!(w.twin(&kept).is_some() && w.record(&kept).await.is_some(), "the other stays");
}

#[tokio::test]
async fn a_delete_whose_twin_cannot_be_deleted_leaves_an_orphan_the_repair_removes() {
    let w = world();
    let id = w.created(&daily()).await;
    w.twins.set_unavailable(true);
    assert_eq!(w.delete("alice", id.as_str()).await.status(), 204, "the schedule is gone");
    assert!(w.record(&id).await.is_none());
    w.twins.set_unavailable(false);
    assert!(w.twin(&id).is_some(), "its twin is left");
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.all_jobs().await, 0, "and fires into nothing");
    let repair = crate::repair::RepairDeps {
        store: w.schedules.clone(),
        sweep: w.schedules.clone(),
        twins: w.twins.clone(),
        budget: std::time::Duration::from_secs(60),
    };
    assert_eq!(crate::repair::repair(&repair).await.orphans, 1);
    assert!(w.twin(&id).is_none(), "until the repair deletes it");
}

#[tokio::test]
async fn a_trigger_sends_one_firing_now_and_submits_nothing_itself() {
    let w = world();
    let id = w.created(&daily()).await;
    w.clock.set(dt("2099-03-02T08:31:02.345Z"));
    let response = w.act("alice", id.as_str(), "trigger", None).await;
    assert_eq!(response.status(), 202, "{}", json_of(&response));
    assert_eq!(
        json_of(&response),
        json!({
            "schedule_id": id,
            "scheduled_at": "2099-03-02T08:31:02.345Z",
            "jobs_url": format!("/jobs?schedule_id={id}"),
        })
    );
    let sent = w.firings.take();
    assert_eq!(
        sent,
        [ScheduleFiring {
            owner: "alice".into(),
            schedule_id: id.to_string(),
            scheduled_at: "2099-03-02T08:31:02.345Z".into(),
            kind: FiringKind::Trigger,
            job_id: None,
            status: None,
        }]
    );
    assert_eq!(w.all_jobs().await, 0, "the firing submits, not the route");
    assert_eq!(w.record(&id).await.unwrap().fired, 0);

    // The firing it sent submits the job.
    w.deliver(&sent[0]).await.unwrap();
    let jobs = w.jobs_of(&id).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].scheduled.as_ref().unwrap().scheduled_at, t("2099-03-02T08:31:02.345Z"));

    // A queue that cannot take it is a 500, and nothing is sent.
    w.firings.set_unavailable(true);
    assert_eq!(
        problem(&w.act("alice", id.as_str(), "trigger", None).await),
        (500, "internal".into())
    );
    w.firings.set_unavailable(false);
    assert!(w.firings.take().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The firing
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_tick_submits_one_job_as_the_owner_and_records_it() {
    let w = world();
    let id = w.created(&daily_with(json!({"priority": "high", "callback_url": CALLBACK}))).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();

    let jobs = w.jobs_of(&id).await;
    assert_eq!(jobs.len(), 1, "one job");
    let job = &jobs[0];
    assert_eq!((job.owner.as_str(), job.job_type.as_str()), ("alice", "demo"));
    assert_eq!(
        (job.params.clone(), job.priority, job.status),
        (json!({"items": 1}), Priority::High, JobStatus::Pending)
    );
    assert_eq!(job.callback_url.as_deref(), Some(CALLBACK));
    assert_eq!(
        job.scheduled,
        Some(ScheduledBy { schedule_id: id.clone(), scheduled_at: t("2099-03-02T09:00:00Z") })
    );
    let key = tick_idempotency_key(&id, t("2099-03-02T09:00:00Z"));
    let claimed = w.jobs.idempotency(&alice(), &key).await.unwrap().expect("the tick's key");
    assert_eq!(claimed.job_id, job.job_id.as_str(), "under the tick's key");
    let enqueued: Vec<_> = w.queue.sent().into_iter().map(|(m, _, o)| (m.job_id, o)).collect();
    assert_eq!(enqueued, [(job.job_id.clone(), alice())], "enqueued once");

    let record = w.record(&id).await.unwrap();
    assert_eq!(record.last_tick, Some(t("2099-03-02T09:00:00Z")));
    let fire = record.last_fire.clone().unwrap();
    assert_eq!(
        (fire.scheduled_at, fire.job_id.clone(), fire.outcome, fire.reason.clone()),
        (t("2099-03-02T09:00:00Z"), Some(job.job_id.clone()), FireOutcome::Submitted, None)
    );
    assert_eq!(counts(&record), (1, 1, 0, 0));
    assert_eq!(record.live_job.as_ref(), Some(&job.job_id));
    assert_eq!(record.version, 1, "a firing is not a change of the spec");

    let view = json_of(&w.get("alice", id.as_str()).await);
    assert_eq!(
        view["last_fire"],
        json!({"scheduled_at": "2099-03-02T09:00:00.000Z", "job_id": job.job_id, "outcome": "submitted"})
    );
    assert_eq!(view["counts"], json!({"fired": 1, "submitted": 1, "skipped": 0, "refused": 0}));
    assert_eq!(view["next_fire_at"], "2099-03-03T09:00:00.000Z", "after the tick fired");
}

#[tokio::test]
async fn the_same_tick_again_makes_no_second_job_and_counts_nothing() {
    let w = world();
    let id = w.created(&daily()).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let once = w.record(&id).await.unwrap();
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    // The same time written another way is the same tick.
    w.tick(&id, "2099-03-02T10:00:00+01:00").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 1, "one job");
    assert_eq!(w.queue.sent().len(), 1, "enqueued once");
    assert_eq!(w.record(&id).await.unwrap(), once, "nothing counted twice");
}

#[tokio::test]
async fn a_tick_retried_after_its_record_failed_finds_its_job() {
    let w = world();
    let id = w.created(&daily()).await;
    w.schedules.fail_next_fire.store(true, Ordering::SeqCst);
    let failed = w.tick(&id, "2099-03-02T09:00:00Z").await;
    assert!(matches!(failed, Err(FireError::Store(_))), "{failed:?}");
    let jobs = w.jobs_of(&id).await;
    assert_eq!(jobs.len(), 1, "the job was made");
    assert_eq!(w.record(&id).await.unwrap().fired, 0, "but not recorded");

    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 1, "still one job");
    let record = w.record(&id).await.unwrap();
    assert_eq!(counts(&record), (1, 1, 0, 0));
    assert_eq!(record.live_job.as_ref(), Some(&jobs[0].job_id), "the job the first delivery made");
}

#[tokio::test]
async fn an_earlier_tick_after_a_later_one_does_nothing() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "allow", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    let after_later = w.record(&id).await.unwrap();
    // The 09:00 tick, delivered late (within the catch-up window), after 09:05's.
    w.clock.set(dt("2099-03-02T09:05:10Z"));
    w.deliver(&firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).await.unwrap();
    assert_eq!(w.ticks_of(&id).await, ["2099-03-02T09:05:00.000Z"], "no job for 09:00");
    assert_eq!(w.record(&id).await.unwrap(), after_later, "nothing recorded");
}

#[tokio::test]
async fn two_ticks_racing_out_of_order_both_count_and_the_later_stays_last() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "allow", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    // 09:05's delivery records first while 09:00's, which read the schedule before it, is
    // submitting its job.
    let later_job = JobId::new();
    let later = FireRecord {
        tick: "2099-03-02T09:05:00Z".parse().unwrap(),
        job_id: Some(later_job.clone()),
        outcome: FireOutcome::Submitted,
        reason: None,
        hold: false,
        trigger: false,
    };
    *w.schedules.overtaker.lock().unwrap() = Some(later.clone());
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.ticks_of(&id).await, ["2099-03-02T09:00:00.000Z"], "09:00's job was made");
    let record = w.record(&id).await.unwrap();
    assert_eq!(counts(&record), (2, 2, 0, 0), "both ticks' jobs are counted");
    assert_eq!(record.last_fire, Some(later.last_fire()), "the later tick stays the last firing");
    assert_eq!(record.live_job, Some(later_job), "and its job the live one");

    // 09:00 delivered again finds its job and counts nothing twice.
    w.deliver(&firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).await.unwrap();
    assert_eq!(counts(&w.record(&id).await.unwrap()), (2, 2, 0, 0));
}

#[tokio::test]
async fn overlap_skip_skips_a_tick_while_the_previous_job_is_live() {
    let w = world();
    let id = w.created(&daily_with(json!({"schedule": "cron(0/5 * * * ? *)"}))).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 1, "no second job");
    let record = w.record(&id).await.unwrap();
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Skipped);
    assert!(reason.contains(first.as_str()) && reason.contains("pending"), "{reason}");
    assert_eq!(record.last_fire.as_ref().unwrap().scheduled_at, t("2099-03-02T09:05:00Z"));
    assert_eq!(counts(&record), (2, 1, 1, 0));
    assert_eq!(record.live_job.as_ref(), Some(&first));
    assert!(record.held.is_none(), "skip holds nothing");

    // Running is live too.
    w.set_status(&first, JobStatus::Running).await;
    w.tick(&id, "2099-03-02T09:10:00Z").await.unwrap();
    assert!(last(&w.record(&id).await.unwrap()).1.contains("running"));
    // Once it has ended the next tick submits, without waiting for its `ended` firing.
    w.set_status(&first, JobStatus::Succeeded).await;
    w.tick(&id, "2099-03-02T09:15:00Z").await.unwrap();
    let jobs = w.jobs_of(&id).await;
    assert_eq!(jobs.len(), 2);
    let record = w.record(&id).await.unwrap();
    assert_eq!(last(&record).0, FireOutcome::Submitted);
    assert_eq!(record.live_job.as_ref(), Some(&jobs[1].job_id));
    assert_eq!(counts(&record), (4, 2, 2, 0));
}

#[tokio::test]
async fn overlap_buffer_one_holds_one_tick_and_submits_it_when_the_live_job_ends() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "buffer_one", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();

    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!(record.held, Some(t("2099-03-02T09:05:00Z")), "held");
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Skipped);
    assert!(reason.contains("held") && reason.contains(first.as_str()), "{reason}");
    let view = json_of(&w.get("alice", id.as_str()).await);
    assert_eq!(view["held"], json!({"scheduled_at": "2099-03-02T09:05:00.000Z"}));

    // A second tick while one is held is skipped; the held one stays.
    w.tick(&id, "2099-03-02T09:10:00Z").await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!(record.held, Some(t("2099-03-02T09:05:00Z")));
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Skipped);
    assert!(reason.contains("already held") && reason.contains(first.as_str()), "{reason}");
    assert_eq!(w.jobs_of(&id).await.len(), 1, "nothing submitted while live");

    // The end of another job releases nothing.
    let stranger = pending_job(&alice(), t(NOW));
    w.jobs.put_job(&stranger).await.unwrap();
    w.end(&id, &stranger.job_id, JobStatus::Succeeded).await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 1);

    // The live job ends: the held tick is submitted, and no longer held.
    w.clock.set(dt("2099-03-02T09:12:00Z"));
    w.end(&id, &first, JobStatus::Succeeded).await.unwrap();
    assert_eq!(w.ticks_of(&id).await, ["2099-03-02T09:00:00.000Z", "2099-03-02T09:05:00.000Z"]);
    let second = w.jobs_of(&id).await[1].job_id.clone();
    let record = w.record(&id).await.unwrap();
    assert!(record.held.is_none(), "released");
    assert_eq!(record.live_job.as_ref(), Some(&second));
    let fire = record.last_fire.clone().unwrap();
    assert_eq!((fire.outcome, fire.job_id.as_ref()), (FireOutcome::Submitted, Some(&second)));
    assert_eq!((record.fired, record.submitted), (3, 2));
    assert!(json_of(&w.get("alice", id.as_str()).await).get("held").is_none());

    // Its `ended` firing delivered again releases nothing more.
    w.end(&id, &first, JobStatus::Succeeded).await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 2);
    assert_eq!(w.record(&id).await.unwrap(), record);

    // The next tick while the released job is live is held again.
    w.tick(&id, "2099-03-02T09:15:00Z").await.unwrap();
    assert_eq!(w.record(&id).await.unwrap().held, Some(t("2099-03-02T09:15:00Z")));
}

#[tokio::test]
async fn overlap_allow_submits_whatever_runs() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "allow", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();
    w.set_status(&first, JobStatus::Running).await;
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    let jobs = w.jobs_of(&id).await;
    assert_eq!(jobs.len(), 2, "submitted while the first runs");
    let record = w.record(&id).await.unwrap();
    assert_eq!(counts(&record), (2, 2, 0, 0));
    assert_eq!(record.live_job.as_ref(), Some(&jobs[1].job_id));
    assert!(record.held.is_none());
}

#[tokio::test]
async fn a_paused_schedules_tick_is_skipped_but_a_trigger_submits() {
    let w = world();
    let id = w.created(&daily_with(json!({"paused": true}))).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.all_jobs().await, 0);
    let record = w.record(&id).await.unwrap();
    assert_eq!(last(&record), (FireOutcome::Skipped, "the schedule is paused".into()));
    assert_eq!(counts(&record), (1, 0, 1, 0));

    w.clock.set(dt("2099-03-02T09:30:00Z"));
    assert_eq!(w.act("alice", id.as_str(), "trigger", None).await.status(), 202);
    let sent = w.firings.take();
    assert_eq!(sent.len(), 1);
    w.deliver(&sent[0]).await.unwrap();
    assert_eq!(w.ticks_of(&id).await, ["2099-03-02T09:30:00.000Z"]);
    let record = w.record(&id).await.unwrap();
    assert_eq!(last(&record).0, FireOutcome::Submitted);
    assert_eq!(
        (counts(&record), record.state),
        ((2, 1, 1, 0), ScheduleState::Paused),
        "still paused"
    );
}

#[tokio::test]
async fn a_tick_outside_the_records_window_is_skipped_whatever_the_twin_sent() {
    // The twin lags the record (its write after a change failed): ticks it still sends before
    // start_at or after end_at make no job; a trigger still submits.
    let w = world();
    let id = w
        .created(&daily_with(json!({
            "schedule": "cron(0/5 * * * ? *)",
            "start_at": "2099-03-02T09:00:00Z",
            "end_at": "2099-03-02T10:00:00Z",
        })))
        .await;
    w.clock.set(dt("2099-03-02T08:55:00Z"));
    w.tick(&id, "2099-03-02T08:55:00Z").await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!(
        last(&record),
        (
            FireOutcome::Skipped,
            "the tick is before the schedule's start_at (2099-03-02T09:00:00.000Z)".into()
        )
    );
    assert_eq!(w.all_jobs().await, 0, "no job");
    // The window's end fires.
    w.clock.set(dt("2099-03-02T10:00:00Z"));
    w.tick(&id, "2099-03-02T10:00:00Z").await.unwrap();
    assert_eq!(w.ticks_of(&id).await, ["2099-03-02T10:00:00.000Z"]);
    w.clock.set(dt("2099-03-02T10:05:00Z"));
    w.tick(&id, "2099-03-02T10:05:00Z").await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!(
        last(&record),
        (
            FireOutcome::Skipped,
            "the tick is after the schedule's end_at (2099-03-02T10:00:00.000Z)".into()
        )
    );
    assert_eq!(w.all_jobs().await, 1, "no job after the end");
}

#[tokio::test]
async fn a_tick_delivered_too_late_is_skipped() {
    let w = world();
    let late = w.created(&daily()).await;
    let in_time = w.created(&daily()).await;
    let tick = "2099-03-02T09:00:00Z";
    w.clock.set(dt(tick) + chrono::Duration::seconds(CATCH_UP_SECONDS + 1));
    w.deliver(&firing(&late, tick, FiringKind::Tick)).await.unwrap();
    assert_eq!(w.jobs_of(&late).await.len(), 0, "no job");
    let record = w.record(&late).await.unwrap();
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Skipped);
    assert!(reason.contains("3601 s") && reason.contains("late"), "{reason}");
    assert_eq!((counts(&record), record.last_tick), ((1, 0, 1, 0), Some(t(tick))));

    // Exactly the catch-up window late still submits.
    w.clock.set(dt(tick) + chrono::Duration::seconds(CATCH_UP_SECONDS));
    w.deliver(&firing(&in_time, tick, FiringKind::Tick)).await.unwrap();
    assert_eq!(w.jobs_of(&in_time).await.len(), 1);
    // A trigger is never late.
    w.clock.set(dt("2099-03-02T12:00:00Z"));
    w.deliver(&firing(&late, "2099-03-02T10:00:00Z", FiringKind::Trigger)).await.unwrap();
    assert_eq!(w.jobs_of(&late).await.len(), 1);
}

#[tokio::test]
async fn a_tick_refused_by_the_rate_limit_is_recorded_as_refused() {
    let w = world_limited(1, 0);
    let id = w.created(&daily()).await;
    w.clock.set(dt("2099-03-02T09:00:05Z"));
    // The tenant's one submission this minute is spent already.
    assert!(matches!(
        w.limits.charge(&alice()).await.unwrap(),
        longhaul_aws::limits::Admission::Admitted
    ));
    w.deliver(&firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).await.unwrap();
    assert_eq!(w.all_jobs().await, 0, "no job");
    assert!(w.queue.sent().is_empty());
    let record = w.record(&id).await.unwrap();
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Refused);
    assert!(reason.contains("Too many submissions"), "{reason}");
    assert_eq!(counts(&record), (1, 0, 0, 1));
    assert!(record.live_job.is_none());
    let view = json_of(&w.get("alice", id.as_str()).await);
    assert_eq!(view["last_fire"]["outcome"], "refused");
    assert_eq!(view["counts"]["refused"], 1);
    // The refused tick's key was given back: nothing claims it.
    let key = tick_idempotency_key(&id, t("2099-03-02T09:00:00Z"));
    assert!(w.jobs.idempotency(&alice(), &key).await.unwrap().is_none());
}

#[tokio::test]
async fn a_tick_refused_by_the_backlog_cap_is_recorded_and_the_next_one_submits() {
    let w = world_limited(0, 1);
    let id = w
        .created(&daily_with(json!({"overlap": "allow", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    let record = w.record(&id).await.unwrap();
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Refused);
    assert!(reason.contains("Too many jobs not yet running"), "{reason}");
    assert_eq!(counts(&record), (2, 1, 0, 1));
    assert_eq!(record.live_job.as_ref(), Some(&first), "the refused tick leaves the live job");
    assert_eq!(w.jobs_of(&id).await.len(), 1);
    // Once the first has started, there is room again.
    w.set_status(&first, JobStatus::Running).await;
    w.tick(&id, "2099-03-02T09:10:00Z").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 2);
    assert_eq!(counts(&w.record(&id).await.unwrap()), (3, 2, 0, 1));
}

#[tokio::test]
async fn a_tick_of_a_kind_no_longer_enabled_is_refused() {
    let mut w = world();
    let id = w.created(&daily()).await;
    w.fire.submit.registry = longhaul_jobs::registry().enabled(&["csv_report".into()]);
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.all_jobs().await, 0);
    let record = w.record(&id).await.unwrap();
    let (outcome, reason) = last(&record);
    assert_eq!(outcome, FireOutcome::Refused);
    assert!(reason.contains("Unknown job type") && reason.contains("demo"), "{reason}");
    assert_eq!(counts(&record), (1, 0, 0, 1));
}

#[tokio::test]
async fn a_submission_that_fails_on_our_side_is_an_error_and_records_nothing() {
    let w = world();
    let id = w.created(&daily()).await;
    w.jobs.set_unavailable(true);
    let failed = w.tick(&id, "2099-03-02T09:00:00Z").await;
    assert!(matches!(failed, Err(FireError::Submission(_))), "{failed:?}");
    let record = w.record(&id).await.unwrap();
    assert!(record.last_tick.is_none() && record.last_fire.is_none(), "retried, not recorded");
    assert_eq!(record.fired, 0);
    // Redelivered once the table is back, it submits.
    w.jobs.set_unavailable(false);
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 1);
    assert_eq!(counts(&w.record(&id).await.unwrap()), (1, 1, 0, 0));
}

#[tokio::test]
async fn a_store_failure_is_an_error_and_fails_only_its_message() {
    let w = world();
    let broken = w.created(&daily()).await;
    let fine = w.created(&daily()).await;
    w.schedules.broken.lock().unwrap().insert(broken.clone());
    w.clock.set(dt("2099-03-02T09:00:05Z"));
    let body = |id: &ScheduleId| {
        serde_json::to_string(&firing(id, "2099-03-02T09:00:00Z", FiringKind::Tick)).unwrap()
    };

    let direct = fire::fire(&w.fire, &body(&broken)).await;
    assert!(matches!(direct, Err(FireError::Store(_))), "{direct:?}");

    let mut event = SqsEvent::default();
    event.records = vec![
        message("m-fine", &body(&fine)),
        message("m-broken", &body(&broken)),
        message("m-unreadable", "{\"owner\": \"alice\"}"),
    ];
    let response = fire::handle(&w.fire, event).await;
    let failed: Vec<_> =
        response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed, ["m-broken", "m-unreadable"]);
    assert_eq!(w.jobs_of(&fine).await.len(), 1, "the good message is handled");
    assert_eq!(w.jobs_of(&broken).await.len(), 0);

    // An all-good batch has no failures.
    w.schedules.broken.lock().unwrap().clear();
    let mut event = SqsEvent::default();
    event.records = vec![message("m-again", &body(&broken))];
    assert!(fire::handle(&w.fire, event).await.batch_item_failures.is_empty());
    assert_eq!(w.jobs_of(&broken).await.len(), 1);
}

#[tokio::test]
async fn an_unreadable_firing_is_an_error() {
    let w = world();
    let id = w.created(&daily()).await;
    let valid =
        serde_json::to_value(firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).unwrap();
    let with = |name: &str, value: Value| {
        let mut body = valid.clone();
        body[name] = value;
        body.to_string()
    };
    let ended_without_job = with("kind", json!("ended"));
    let ended_without_status = {
        let mut body = valid.clone();
        body["kind"] = json!("ended");
        body["job_id"] = json!(JobId::new());
        body.to_string()
    };
    let bodies = [
        "".to_owned(),
        "not json".to_owned(),
        "{}".to_owned(),
        json!([valid]).to_string(),
        with("owner", json!("")),
        with("schedule_id", json!("nope")),
        with("scheduled_at", json!("yesterday")),
        with("scheduled_at", json!(SCHEDULED_TIME)),
        with("kind", json!("backfill")),
        with("extra", json!(1)),
        ended_without_job,
        ended_without_status,
    ];
    for body in bodies {
        let result = fire::fire(&w.fire, &body).await;
        assert!(matches!(result, Err(FireError::Unreadable(_))), "{body}: {result:?}");
    }
    assert_eq!(w.all_jobs().await, 0);
    assert_eq!(w.record(&id).await.unwrap().fired, 0);
}

#[tokio::test]
async fn a_failed_job_pauses_a_pause_on_failure_schedule() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"pause_on_failure": true, "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let job = w.jobs_of(&id).await[0].job_id.clone();
    w.clock.set(dt("2099-03-02T09:03:00Z"));
    w.end(&id, &job, JobStatus::Failed).await.unwrap();

    let record = w.record(&id).await.unwrap();
    assert_eq!(record.state, ScheduleState::Paused);
    let reason = record.paused_reason.clone().unwrap();
    assert!(reason.contains(job.as_str()) && reason.contains("failed"), "{reason}");
    assert_eq!((record.version, record.updated_at), (2, t("2099-03-02T09:03:00Z")));
    assert!(!w.twin(&id).unwrap().enabled, "its twin is disabled");
    let view = json_of(&w.get("alice", id.as_str()).await);
    assert_eq!((&view["state"], &view["paused_reason"]), (&json!("paused"), &json!(reason)));
    assert!(view["next_fire_at"].is_null());

    // Its next tick is skipped; resumed, it fires again.
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    assert_eq!(last(&w.record(&id).await.unwrap()).1, "the schedule is paused");
    assert_eq!(w.act("alice", id.as_str(), "resume", None).await.status(), 200);
    assert!(w.twin(&id).unwrap().enabled);
    w.tick(&id, "2099-03-02T09:10:00Z").await.unwrap();
    assert_eq!(w.jobs_of(&id).await.len(), 2);

    // The failed job's end, delivered again after the resume, pauses nothing; another job's
    // failure does.
    w.end(&id, &job, JobStatus::Failed).await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!(record.state, ScheduleState::Enabled, "{record:?}");
    assert!(w.twin(&id).unwrap().enabled);
    let next = w.jobs_of(&id).await.into_iter().find(|j| j.job_id != job).unwrap().job_id;
    w.end(&id, &next, JobStatus::Failed).await.unwrap();
    let record = w.record(&id).await.unwrap();
    assert_eq!((record.state, record.paused_by_job.as_ref()), (ScheduleState::Paused, Some(&next)));
}

#[tokio::test]
async fn only_a_failure_of_a_pause_on_failure_schedule_pauses_it() {
    let w = world();
    let plain = w.created(&daily()).await;
    let careful = w.created(&daily_with(json!({"pause_on_failure": true}))).await;
    w.tick(&plain, "2099-03-02T09:00:00Z").await.unwrap();
    w.tick(&careful, "2099-03-02T09:00:00Z").await.unwrap();
    let plain_job = w.jobs_of(&plain).await[0].job_id.clone();
    let careful_job = w.jobs_of(&careful).await[0].job_id.clone();
    w.end(&plain, &plain_job, JobStatus::Failed).await.unwrap();
    w.end(&careful, &careful_job, JobStatus::Succeeded).await.unwrap();
    for id in [&plain, &careful] {
        let record = w.record(id).await.unwrap();
        assert_eq!((record.state, record.version), (ScheduleState::Enabled, 1));
        assert!(w.twin(id).unwrap().enabled);
    }
    // A schedule paused by its owner keeps the owner's reason.
    assert_eq!(
        w.act("alice", careful.as_str(), "pause", Some(&json!({"reason": "mine"}))).await.status(),
        200
    );
    w.end(&careful, &careful_job, JobStatus::Failed).await.unwrap();
    assert_eq!(w.record(&careful).await.unwrap().paused_reason.as_deref(), Some("mine"));
}

#[tokio::test]
async fn a_firing_of_a_deleted_or_someone_elses_schedule_does_nothing() {
    let w = world();
    let id = w.created(&daily()).await;
    assert_eq!(w.delete("alice", id.as_str()).await.status(), 204);
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let mut ended = firing(&id, "2099-03-02T09:00:00Z", FiringKind::Ended);
    ended.job_id = Some(JobId::new());
    ended.status = Some(JobStatus::Failed);
    w.deliver(&ended).await.unwrap();
    assert_eq!(w.all_jobs().await, 0);
    assert!(w.record(&id).await.is_none(), "nothing recreated");

    // Alice's schedule, fired as mallory's: no such schedule of mallory's.
    let hers = w.created(&daily()).await;
    let mut forged = firing(&hers, "2099-03-02T09:00:00Z", FiringKind::Tick);
    forged.owner = "mallory".into();
    w.deliver(&forged).await.unwrap();
    assert_eq!(w.all_jobs().await, 0);
    assert_eq!(w.record(&hers).await.unwrap().fired, 0);
}

// ---------------------------------------------------------------------------------------------
// Edges a review found (each failed before its fix)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_held_tick_does_not_outlive_a_pause() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "buffer_one", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap(); // held
    assert_eq!(w.act("alice", id.as_str(), "pause", None).await.status(), 200);
    w.end(&id, &first, JobStatus::Succeeded).await.unwrap(); // paused: nothing released
    assert_eq!(w.act("alice", id.as_str(), "resume", None).await.status(), 200);
    w.tick(&id, "2099-03-02T09:10:00Z").await.unwrap(); // nothing live: submits
    let second = w.jobs_of(&id).await[1].job_id.clone();
    w.tick(&id, "2099-03-02T09:15:00Z").await.unwrap(); // live: should be held
    w.end(&id, &second, JobStatus::Succeeded).await.unwrap(); // releases what is held
    // The 09:15 tick was the one held while the 09:10 job ran; the 09:05 tick from before
    // the pause is long superseded. Today: 09:15 is skipped ("a tick is already held") and
    // 09:05 is submitted after the 09:10 job.
    assert_eq!(
        w.ticks_of(&id).await,
        ["2099-03-02T09:00:00.000Z", "2099-03-02T09:10:00.000Z", "2099-03-02T09:15:00.000Z"]
    );
}

#[tokio::test]
async fn a_tick_whose_job_is_being_made_by_another_delivery_is_not_refused() {
    let w = world();
    let id = w.created(&daily()).await;
    let tick = t("2099-03-02T09:00:00Z");
    w.clock.set(dt("2099-03-02T09:00:05Z"));
    // Another delivery of the tick has claimed its key and not yet written its job.
    let mut job = pending_job(&alice(), Timestamp::from(dt("2099-03-02T09:00:05Z")));
    job.params = json!({"items": 1});
    job.scheduled = Some(ScheduledBy { schedule_id: id.clone(), scheduled_at: tick });
    let claim = IdempotencyRecord {
        job_id: job.job_id.clone(),
        fingerprint: submission_fingerprint("demo", &json!({"items": 1}), None),
        created_at: job.created_at,
        expires_at: job.created_at.as_datetime().timestamp() + 86_400,
    };
    w.jobs.claim_key(&alice(), &tick_idempotency_key(&id, tick), &claim, None).await.unwrap();
    let _ = w.deliver(&firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).await;
    // That delivery writes its job; this tick is delivered again (SQS retries an error).
    w.jobs.put_job(&job).await.unwrap();
    let _ = w.deliver(&firing(&id, "2099-03-02T09:00:00Z", FiringKind::Tick)).await;
    let record = w.record(&id).await.unwrap();
    assert_eq!(last(&record).0, FireOutcome::Submitted, "{:?}", record.last_fire);
    assert_eq!(record.live_job.as_ref(), Some(&job.job_id));
    assert_eq!(record.refused, 0);
}

#[tokio::test]
async fn a_pause_on_failure_retried_after_its_twin_write_failed_disables_the_twin() {
    let w = world();
    let id = w.created(&daily_with(json!({"pause_on_failure": true}))).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let job = w.jobs_of(&id).await[0].job_id.clone();
    w.twins.set_unavailable(true);
    let failed = w.end(&id, &job, JobStatus::Failed).await;
    assert!(matches!(failed, Err(FireError::Aws(_))), "{failed:?}");
    assert_eq!(w.record(&id).await.unwrap().state, ScheduleState::Paused, "the record is paused");
    w.twins.set_unavailable(false);
    w.end(&id, &job, JobStatus::Failed).await.unwrap(); // SQS's redelivery
    assert!(!w.twin(&id).unwrap().enabled, "the twin of a paused schedule still fires");
}

#[tokio::test]
async fn a_pause_on_failure_of_a_schedule_whose_twin_is_missing_creates_none() {
    // The firing function only updates twins: a missing one is the repair sweep's to make.
    let w = world();
    let id = w.created(&daily_with(json!({"pause_on_failure": true}))).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let job = w.jobs_of(&id).await[0].job_id.clone();
    let name = Twin::of(&w.record(&id).await.unwrap()).name;
    assert!(w.twins.delete_twin(&name).await.unwrap());
    w.end(&id, &job, JobStatus::Failed).await.expect("no error: nothing to retry");
    assert_eq!(w.record(&id).await.unwrap().state, ScheduleState::Paused, "the record is paused");
    assert!(w.twin(&id).is_none(), "no twin made by the firing function");
}

#[tokio::test]
async fn the_counts_of_a_released_tick_add_up() {
    let w = world();
    let id = w
        .created(&daily_with(json!({"overlap": "buffer_one", "schedule": "cron(0/5 * * * ? *)"})))
        .await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let first = w.jobs_of(&id).await[0].job_id.clone();
    w.tick(&id, "2099-03-02T09:05:00Z").await.unwrap();
    w.end(&id, &first, JobStatus::Succeeded).await.unwrap();
    let record = w.record(&id).await.unwrap();
    let (fired, submitted, skipped, refused) = counts(&record);
    assert_eq!(fired, submitted + skipped + refused, "{:?}", counts(&record));
}

#[tokio::test]
async fn a_new_rate_schedules_next_fire_is_its_first() {
    let w = world();
    let response = w.create("alice", &daily_with(json!({"schedule": "rate(1 hour)"}))).await;
    assert_eq!(response.status(), 201);
    assert_eq!(json_of(&response)["next_fire_at"], "2099-03-02T08:30:00.000Z");
}

#[tokio::test]
async fn a_patch_of_params_merges_as_rfc_7396_says() {
    let w = world();
    let id = w.created(&daily_with(json!({"params": {"items": 1, "item_ms": 3}}))).await;
    let response = w.patch("alice", id.as_str(), &json!({"params": {"items": 5}})).await;
    assert_eq!(response.status(), 200);
    assert_eq!(w.record(&id).await.unwrap().params, json!({"items": 5, "item_ms": 3}));
}

/// A trigger and the ticks of the expression are recorded apart: a tick delivered after a
/// later trigger still submits its job, and the same trigger delivered twice records once.
#[tokio::test]
async fn a_tick_delivered_after_a_later_trigger_is_not_lost() {
    let w = world();
    let id = w.created(&json!({"type": "demo", "params": {"items": 1}, "schedule": "rate(1 minute)", "overlap": "allow"})).await;
    w.clock.set(dt("2099-03-02T09:00:02Z"));
    assert_eq!(w.act("alice", id.as_str(), "trigger", None).await.status(), 202);
    let trigger = w.firings.take().remove(0);
    w.deliver(&trigger).await.unwrap();
    w.deliver(&trigger).await.unwrap();
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let mut ticks = w.ticks_of(&id).await;
    ticks.sort();
    assert_eq!(
        ticks,
        ["2099-03-02T09:00:00.000Z", "2099-03-02T09:00:02.000Z"],
        "one job for the trigger, one for the tick delivered after it"
    );
    let record = w.record(&id).await.unwrap();
    assert_eq!(counts(&record), (2, 2, 0, 0), "the trigger delivered twice counts once");
}

/// Every metric line this test binary's functions printed (the process-wide sink, set once).
fn metric_lines() -> &'static Mutex<Vec<String>> {
    static LINES: std::sync::OnceLock<Mutex<Vec<String>>> = std::sync::OnceLock::new();
    LINES.get_or_init(|| {
        longhaul_aws::metrics::set_sink(Box::new(|line| {
            metric_lines().lock().unwrap().push(line.to_owned())
        }));
        Mutex::new(Vec::new())
    })
}

/// A scheduled job's failure is counted for the schedule's alarm, whatever the schedule's
/// `pause_on_failure`; a success is not.
#[tokio::test]
async fn a_scheduled_jobs_failure_is_counted_with_its_schedule() {
    let lines = metric_lines();
    let w = world();
    let id = w.created(&daily()).await;
    w.tick(&id, "2099-03-02T09:00:00Z").await.unwrap();
    let job = w.jobs_of(&id).await[0].job_id.clone();
    w.end(&id, &job, JobStatus::Succeeded).await.unwrap();
    w.end(&id, &job, JobStatus::Failed).await.unwrap();
    let failed: Vec<Value> = lines
        .lock()
        .unwrap()
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("ScheduledJobsFailed").is_some() && l["schedule_id"] == id.as_str())
        .collect();
    assert_eq!(failed.len(), 1, "one failure, no success: {failed:?}");
    assert_eq!(failed[0]["JobType"], "demo");
}
