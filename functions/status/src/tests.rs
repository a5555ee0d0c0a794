//! The handler over in-memory adapters: every route, every path and every refusal.

use super::*;
use longhaul_aws::jobs::ProgressRecord;
use longhaul_domain::progress::ShardCounts;

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::jobs::{DeliveryRecord, JobRecord, ResumedFrom, TransitionRequest};
use longhaul_aws::ports::{DeliveryLog, JobCreation, JobReads, JobTransitions, Warm};
use longhaul_domain::admission::{Priority, WaitReason, Waiting};
use longhaul_domain::webhooks::DeliveryOutcome;
use longhaul_domain::{Cancellation, JobError, JobId, Owner, Timestamp};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryJobStore, MemoryObjects, MemorySigningKey, nth_job, owner,
};
use secrecy::SecretString;

const KEY: &str = "stream-token-key";
const EVENTS: &str = "https://events.memory.invalid";

struct World {
    jobs: Arc<MemoryJobStore>,
    objects: Arc<MemoryObjects>,
    /// The handler's clock: standing still at the time the world was made.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world() -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let objects = Arc::new(MemoryObjects::new());
    let clock = Arc::new(ManualClock::new());
    let deps = Deps {
        jobs: jobs.clone(),
        objects: objects.clone(),
        events_url: EVENTS.into(),
        stream_token_key: Arc::new(MemorySigningKey::new(KEY)),
        stream_token_ttl_seconds: STREAM_TOKEN_TTL_SECONDS,
        registry: longhaul_jobs::registry().enabled(&["demo".to_owned()]),
        clock: clock.clone(),
    };
    World { jobs, objects, clock, deps }
}

fn at(seconds_ago: i64) -> Timestamp {
    Timestamp::from(chrono::Utc::now() - chrono::Duration::seconds(seconds_ago))
}

impl World {
    /// A job of `owner`'s, created `age` seconds ago, brought to `status` the way the other
    /// functions bring it there.
    async fn job_aged(&self, owner: &Owner, status: JobStatus, age: i64) -> JobId {
        let job = pending_job(owner, at(age));
        let id = job.job_id.clone();
        self.jobs.put_job(&job).await.unwrap();
        let path: &[JobStatus] = match status {
            JobStatus::Pending => &[],
            JobStatus::Queued => &[JobStatus::Queued],
            JobStatus::Running => &[JobStatus::Queued, JobStatus::Running],
            JobStatus::Succeeded => &[JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded],
            JobStatus::Failed => &[JobStatus::Queued, JobStatus::Running, JobStatus::Failed],
            JobStatus::Cancelled => &[JobStatus::Cancelled],
            JobStatus::Paused => &[JobStatus::Paused],
            JobStatus::Compensating => {
                &[JobStatus::Queued, JobStatus::Running, JobStatus::Compensating]
            }
            JobStatus::Expired => {
                &[JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Expired]
            }
        };
        let mut from = JobStatus::Pending;
        for &to in path {
            let mut request = TransitionRequest::new(&id, &[from], to, "arranged");
            match to {
                JobStatus::Running => request = request.set("lease", "l-1").set("attempt", 1),
                JobStatus::Succeeded => {
                    request = request.set("result_key", format!("results/{id}/result.json"))
                }
                JobStatus::Failed => {
                    request = request.set(
                        "error",
                        JobError { code: "Job.Fatal".into(), message: "bad input".into() },
                    )
                }
                JobStatus::Paused => {
                    request = request.set(
                        "pause",
                        longhaul_domain::Pause {
                            requested_at: at(30),
                            requested_by: owner.clone(),
                            reason: Some("month end".into()),
                            paused_at: Some(at(30)),
                            wait: None,
                        },
                    )
                }
                JobStatus::Compensating => {
                    let ending = longhaul_domain::compensation::Ending {
                        status: JobStatus::Failed,
                        reason: "bad input".into(),
                        error: None,
                    };
                    request = request.set(
                        "compensation",
                        longhaul_domain::compensation::Compensation::begin(ending, at(5)),
                    )
                }
                JobStatus::Cancelled => {
                    request = request.set(
                        "cancellation",
                        Cancellation {
                            requested_at: Timestamp::now(),
                            requested_by: owner.clone(),
                            reason: Some("no longer needed".into()),
                        },
                    )
                }
                _ => {}
            }
            self.jobs.transition(request).await.unwrap();
            from = to;
        }
        id
    }

    async fn job(&self, owner: &Owner, status: JobStatus) -> JobId {
        self.job_aged(owner, status, 60).await
    }

    async fn record(&self, id: &JobId) -> JobRecord {
        self.jobs.job(id).await.unwrap().unwrap()
    }

    async fn call(&self, request: ApiRequest) -> Response<Body> {
        handle(&self.deps, request.build()).await
    }

    async fn get(&self, principal: &str, id: &str) -> Response<Body> {
        self.call(get_job(principal, id)).await
    }

    async fn list(&self, principal: &str, query: &[(&str, &str)]) -> Response<Body> {
        let mut request = ApiRequest::new("GET", "/jobs", principal).route("GET /jobs");
        for (name, value) in query {
            request = request.query(name, value);
        }
        self.call(request).await
    }
}

/// `GET /jobs/{id}` as API Gateway passes it: the token's principal and the path's id as sent
/// (so are [`on_job`]'s and [`World::list`]'s).
fn get_job(principal: &str, id: &str) -> ApiRequest {
    ApiRequest::new("GET", &format!("/jobs/{id}"), principal)
        .route("GET /jobs/{id}")
        .param("id", id)
}

fn on_job(route: &str, principal: &str, id: &str) -> ApiRequest {
    let path = route.trim_start_matches("GET ").replace("{id}", id);
    ApiRequest::new("GET", &path, principal).route(route).param("id", id)
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

fn problem_type(response: &Response<Body>) -> String {
    json_of(response)["type"].as_str().unwrap_or_default().to_owned()
}

// GET /jobs/{id}

#[tokio::test]
async fn a_live_job_is_not_cached_says_when_to_poll_and_links_its_stream() {
    let w = world();
    for status in [JobStatus::Pending, JobStatus::Queued, JobStatus::Running] {
        let id = w.job(&owner("alice"), status).await;
        let response = w.get("alice", &id).await;
        assert_eq!(response.status(), 200, "{status}");
        assert_eq!(header(&response, "cache-control"), Some("no-store"));
        assert_eq!(header(&response, "retry-after"), Some("2"));
        assert_eq!(header(&response, "etag"), None, "a live job changes");
        assert_eq!(header(&response, "content-type"), Some("application/json"));
        let view = json_of(&response);
        assert_eq!(
            (view["job_id"].as_str(), view["status"].as_str()),
            (Some(id.as_str()), Some(status.as_str()))
        );
        assert!(view.get("result_url").is_none());
        let link = view["events_url"].as_str().unwrap();
        let prefix = format!("{EVENTS}/jobs/{id}/events?token=");
        let token = link.strip_prefix(&prefix).unwrap_or_else(|| panic!("{link}"));
        let now = chrono::Utc::now().timestamp();
        let grant = stream_token::verify(KEY.as_bytes(), token, &id, now).unwrap();
        assert_eq!(grant.owner, "alice");
        assert!((now + STREAM_TOKEN_TTL_SECONDS - grant.expires).abs() <= 2, "15 minutes");
        assert!(
            stream_token::verify(KEY.as_bytes(), token, &JobId::new(), now).is_err(),
            "the link is for this job only"
        );
        // A live job is never answered 304, whatever the client holds.
        let again = w.call(get_job("alice", &id).header("if-none-match", "*")).await;
        assert_eq!(again.status(), 200);
    }
}

#[tokio::test]
async fn the_stream_links_lifetime_is_configurable() {
    let mut w = world();
    w.deps.stream_token_ttl_seconds = 5;
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    let view = json_of(&w.get("alice", &id).await);
    let token = view["events_url"].as_str().unwrap().rsplit("token=").next().unwrap().to_owned();
    let now = chrono::Utc::now().timestamp();
    let grant = stream_token::verify(KEY.as_bytes(), &token, &id, now).unwrap();
    assert!(grant.expires <= now + 5);
}

#[tokio::test]
async fn the_stream_link_expires_its_lifetime_after_the_clocks_time() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    // A time the machine's clock is not at: the handler reads the clock it is given.
    let issued: Timestamp = "2031-02-03T04:05:06Z".parse().unwrap();
    w.clock.set(issued.as_datetime());
    let view = json_of(&w.get("alice", &id).await);
    let token = view["events_url"].as_str().unwrap().rsplit("token=").next().unwrap().to_owned();
    let expires = issued.as_datetime().timestamp() + STREAM_TOKEN_TTL_SECONDS;
    let grant = stream_token::verify(KEY.as_bytes(), &token, &id, expires).unwrap();
    assert_eq!(grant.expires, expires);
    assert_eq!(
        stream_token::verify(KEY.as_bytes(), &token, &id, expires + 1),
        Err(stream_token::TokenError::Expired),
        "refused once the clock passes its expiry"
    );
}

#[tokio::test]
async fn a_running_jobs_view_shows_its_last_progress_write() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    let before = json_of(&w.get("alice", &id).await);
    assert_eq!(before["progress"]["pct"], 0.0, "no write yet: unknown");
    assert!(before["progress"]["stage"].is_null());
    assert_eq!(before["stalled"], false);
    assert_eq!(before["attempt"], 1);
    w.jobs.put_progress(
        &id,
        ProgressRecord {
            pct: 40.0,
            stage: "render".into(),
            stage_index: 2,
            stages_total: 3,
            items_done: 4,
            items_total: Some(10),
            eta_seconds: Some(30),
            lease: "l-1".into(),
            shards: Some(ShardCounts {
                total: 8,
                pending: 3,
                running: 2,
                succeeded: 2,
                failed: 1,
                attempts: 6,
            }),
            ..Default::default()
        },
    );
    let view = json_of(&w.get("alice", &id).await);
    let progress = &view["progress"];
    assert_eq!(
        progress["shards"],
        json!({"total": 8, "pending": 3, "running": 2, "succeeded": 2, "failed": 1, "attempts": 6})
    );
    assert!(before["progress"]["shards"].is_null(), "no fan-out: none");
    assert_eq!(progress["pct"], 40.0);
    assert_eq!(progress["stage"], "render");
    assert_eq!(progress["stage_index"], 2);
    assert_eq!(progress["stages_total"], 3);
    assert_eq!(progress["items_done"], 4);
    assert_eq!(progress["items_total"], 10);
    assert_eq!(progress["eta"], 30);
    let text = view.to_string();
    assert!(!text.contains("l-1"), "the lease never leaves: {text}");
    let mut stalled = w.record(&id).await;
    stalled.stalled_at = Some(Timestamp::now());
    w.jobs.put_record(stalled);
    assert_eq!(json_of(&w.get("alice", &id).await)["stalled"], true);
}

#[tokio::test]
async fn a_terminal_job_is_cacheable_by_its_etag_and_revalidates_to_304() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    w.jobs.put_progress(
        &id,
        ProgressRecord { pct: 90.0, items_done: 9, items_total: Some(10), ..Default::default() },
    );
    let response = w.get("alice", &id).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "cache-control"), Some("private, max-age=60"));
    assert_eq!(header(&response, "retry-after"), None);
    let etag = header(&response, "etag").unwrap().to_owned();
    let digest = hex::encode(Sha256::digest(response.body().as_ref()));
    assert_eq!(etag, format!("\"{}\"", &digest[..32]), "the ETag is the body's digest");
    let view = json_of(&response);
    assert!(view.get("events_url").is_none(), "nothing to stream");
    assert_eq!(view["result_url"], format!("/jobs/{id}/result"));
    assert_eq!(view["progress"]["pct"], 100.0, "a succeeded job shows its end");
    assert_eq!(view["progress"]["items_done"], 10);
    assert!(view["finished_at"].is_string());
    assert_eq!(header(&w.get("alice", &id).await, "etag"), Some(etag.as_str()), "stable");

    for held in [etag.clone(), "*".to_owned(), format!("\"other\", {etag}")] {
        let response = w.call(get_job("alice", &id).header("if-none-match", &held)).await;
        assert_eq!(response.status(), 304, "{held}");
        assert!(response.body().is_empty(), "{held}");
        assert_eq!(header(&response, "etag"), Some(etag.as_str()));
        assert_eq!(header(&response, "cache-control"), Some("private, max-age=60"));
    }
    let changed = w.call(get_job("alice", &id).header("if-none-match", "\"stale\"")).await;
    assert_eq!(changed.status(), 200, "a tag that no longer matches gets the body");
}

#[tokio::test]
async fn a_paused_jobs_view_says_who_paused_it_since_when_and_when_the_pause_lapses() {
    let w = world();
    let paused = w.job(&owner("alice"), JobStatus::Paused).await;
    let view = json_of(&w.get("alice", &paused).await);
    assert_eq!(view["status"], "paused");
    assert_eq!(view["paused"]["reason"], "month end", "{view}");
    assert!(view["paused"].get("signal_url").is_none(), "an owner's pause offers no link");
    let pause = &view["pause"];
    assert_eq!(
        (pause["requested_by"].as_str(), pause["reason"].as_str()),
        (Some("alice"), Some("month end"))
    );
    let paused_at: Timestamp = pause["paused_at"].as_str().unwrap().parse().unwrap();
    let lapses_at: Timestamp = pause["lapses_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(lapses_at.since(paused_at).as_secs(), 604_800, "a week: the default max_paused");
    assert!(view.get("paused_seconds").is_none(), "not resumed yet: {view}");
}

#[tokio::test]
async fn a_compensating_jobs_view_shows_its_undos_and_the_status_filter_finds_it() {
    use longhaul_domain::compensation::UndoStatus;
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Compensating).await;
    let mut job = w.record(&id).await;
    let retry_at = at(-50);
    let compensation = job.compensation.as_mut().expect("arranged");
    compensation.plan(&["reserve", "charge"], &["reserve".into(), "charge".into()]);
    compensation.stages[0].status = UndoStatus::Retrying;
    compensation.stages[0].attempts = 1;
    compensation.stages[0].at = Some(at(10));
    compensation.stages[0].retry_at = Some(retry_at);
    compensation.stages[0].error = Some("refund refused".into());
    w.jobs.put_record(job);
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["status"], "compensating", "{view}");
    let shown = &view["compensation"];
    assert_eq!((&shown["status"], &shown["ends_as"]), (&json!("running"), &json!("failed")));
    let first = &shown["stages"][0];
    assert_eq!(first["stage"], "charge");
    assert_eq!((&first["status"], &first["attempts"]), (&json!("retrying"), &json!(1)));
    assert_eq!(first["error"], "refund refused");
    assert_eq!(first["retry_at"], retry_at.to_string());
    let second = &shown["stages"][1];
    assert_eq!((&second["status"], &second["at"]), (&json!("pending"), &serde_json::Value::Null));
    assert!(second.get("retry_at").is_none() && second.get("error").is_none(), "{view}");
    assert!(shown.get("ending").is_none(), "the record's inner fields are not shown: {view}");
    let listed = json_of(&w.list("alice", &[("status", "compensating")]).await);
    assert_eq!(listed["jobs"][0]["job_id"], id.as_str(), "{listed}");
}

#[tokio::test]
async fn a_job_waiting_for_a_signal_shows_what_it_waits_for_and_the_link_to_send_it_by() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Paused).await;
    let mut job = w.record(&id).await;
    let until = at(-3_600);
    let wait = longhaul_domain::signals::Wait { signal: "approval".parse().unwrap(), until };
    job.pause =
        Some(longhaul_domain::Pause { wait: Some(wait), reason: None, ..job.pause.unwrap() });
    w.jobs.put_record(job);
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["paused"]["reason"], "waiting", "{view}");
    assert_eq!(view["paused"]["signal"], "approval");
    assert_eq!(view["paused"]["until"], until.to_string());
    let link = view["paused"]["signal_url"].as_str().expect("a link");
    let token = link.rsplit('/').next().unwrap();
    assert_eq!(link, format!("/jobs/{id}/signals/approval/{token}"));
    let name = "approval".parse().unwrap();
    let now = chrono::Utc::now().timestamp();
    assert_eq!(longhaul_domain::signals::verify(KEY.as_bytes(), token, &id, &name, now), Ok(()));
}

#[tokio::test]
async fn failed_cancelled_and_expired_views_say_how_the_job_ended() {
    let w = world();
    let failed = w.job(&owner("alice"), JobStatus::Failed).await;
    w.jobs.put_progress(
        &failed,
        ProgressRecord { pct: 20.0, eta_seconds: Some(9), ..Default::default() },
    );
    let view = json_of(&w.get("alice", &failed).await);
    assert_eq!(view["error"], json!({"code": "Job.Fatal", "message": "bad input"}));
    assert!(view["progress"]["eta"].is_null(), "it will not complete");
    assert_eq!(view["progress"]["pct"], 20.0);

    let cancelled = w.job(&owner("alice"), JobStatus::Cancelled).await;
    let response = w.get("alice", &cancelled).await;
    assert!(header(&response, "etag").is_some());
    let view = json_of(&response);
    assert_eq!(view["cancellation"]["requested_by"], "alice");
    assert_eq!(view["cancellation"]["reason"], "no longer needed");

    let expired = w.job(&owner("alice"), JobStatus::Expired).await;
    let view = json_of(&w.get("alice", &expired).await);
    assert_eq!(view["status"], "expired");
    assert!(view.get("result_url").is_none(), "the result is gone");
    let states: Vec<&str> = view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "queued", "running", "succeeded", "expired"]);
}

#[tokio::test]
async fn optional_fields_show_only_while_they_apply() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Queued).await;
    let mut job = w.record(&id).await;
    job.retry_at = Some(at(-30));
    job.last_error = Some(JobError { code: "Job.Retryable".into(), message: "timeout".into() });
    let retried = nth_job(1);
    job.retry_of = Some(retried.clone());
    job.resumed_from =
        Some(ResumedFrom { job_id: retried.clone(), stage: "render".into(), items_done: 7 });
    job.callback_url = Some("https://hooks.example/done".into());
    job.not_before = Some(at(-3600));
    job.priority = Priority::High;
    let schedule_id = longhaul_domain::schedules::ScheduleId::new();
    let tick = at(60);
    job.scheduled = Some(longhaul_aws::jobs::ScheduledBy {
        schedule_id: schedule_id.clone(),
        scheduled_at: tick,
    });
    w.jobs.put_record(job.clone());
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["schedule_id"], schedule_id.as_str());
    assert_eq!(view["scheduled_at"], tick.to_string());
    assert_eq!(view["retry_at"], job.retry_at.unwrap().to_string());
    assert_eq!(view["last_error"], json!({"code": "Job.Retryable", "message": "timeout"}));
    assert_eq!(view["retry_of"], retried.as_str());
    assert_eq!(view["resumed_from"], json!({"stage": "render", "items_done": 7}));
    assert_eq!(view["callback_url"], "https://hooks.example/done");
    assert_eq!(view["not_before"], job.not_before.unwrap().to_string());
    assert_eq!(view["priority"], "high");
    assert!(view.get("stalled").is_none(), "only a running job is or is not stalled");
    assert!(view.get("waiting").is_none(), "only a pending job waits");
    let unscheduled =
        json_of(&w.get("alice", &w.job(&owner("alice"), JobStatus::Queued).await).await);
    assert!(unscheduled.get("schedule_id").is_none() && unscheduled.get("scheduled_at").is_none());

    // Not queued: no retry time; succeeded: the last error no longer matters.
    let mut done = job.clone();
    done.status = JobStatus::Succeeded;
    w.jobs.put_record(done);
    let view = json_of(&w.get("alice", &id).await);
    assert!(view.get("retry_at").is_none() && view.get("last_error").is_none(), "{view}");

    let pending = w.job(&owner("alice"), JobStatus::Pending).await;
    let mut job = w.record(&pending).await;
    job.waiting = Some(Waiting {
        reason: WaitReason::TenantLimit,
        limit: 2,
        since: Timestamp::now(),
        position: "p".into(),
    });
    w.jobs.put_record(job);
    let view = json_of(&w.get("alice", &pending).await);
    assert_eq!(view["waiting"]["reason"], "tenant_limit");
    assert_eq!(view["waiting"]["limit"], 2);
    assert_eq!(view["waiting"]["message"], WaitReason::TenantLimit.message(2));
    assert_eq!(view["priority"], "normal");
}

// Refusals common to every route about one job.

const JOB_ROUTES: [&str; 3] =
    ["GET /jobs/{id}", "GET /jobs/{id}/result", "GET /jobs/{id}/deliveries"];

#[tokio::test]
async fn another_tenants_job_and_unknown_ids_read_the_same_404() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    for route in JOB_ROUTES {
        for (who, target) in
            [("mallory", id.as_str()), ("alice", "01J00000000000000000000000"), ("alice", "nope")]
        {
            let response = w.call(on_job(route, who, target)).await;
            assert_eq!(response.status(), 404, "{route} {who} {target}");
            assert_eq!(problem_type(&response), "/problems/not-found");
            let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
            assert!(!text.contains("alice"), "nothing about the owner: {text}");
        }
    }
}

#[tokio::test]
async fn a_request_without_a_principal_is_401() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    for route in JOB_ROUTES {
        let response = w.call(on_job(route, "alice", &id).anonymous()).await;
        assert_eq!(response.status(), 401, "{route}");
    }
    let list = ApiRequest::new("GET", "/jobs", "alice").route("GET /jobs").anonymous();
    assert_eq!(w.call(list).await.status(), 401);
    // A principal that is no owner (empty, a control character, too long) is no principal:
    // the same problem, whoever the job's owner is.
    let anonymous = json_of(&w.call(get_job("alice", &id).anonymous()).await);
    let too_long = "a".repeat(Owner::MAX_BYTES + 1);
    for principal in ["", "alice\u{7}", too_long.as_str()] {
        let response = w.call(get_job(principal, &id)).await;
        assert_eq!(response.status(), 401, "{principal:?}");
        assert_eq!(json_of(&response), anonymous, "{principal:?}");
        assert_eq!(w.list(principal, &[]).await.status(), 401, "{principal:?}");
    }
}

#[tokio::test]
async fn a_failing_table_is_a_500_that_names_nothing_inside() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    w.jobs.set_unavailable(true);
    let mut responses = Vec::new();
    for route in JOB_ROUTES {
        responses.push(w.call(on_job(route, "alice", &id)).await);
    }
    responses.push(w.list("alice", &[]).await);
    for response in responses {
        assert_eq!(response.status(), 500);
        let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
        assert!(!text.contains("unavailable") && !text.contains("read job"), "{text}");
    }
}

/// A signing key that cannot be read (Secrets Manager down).
#[derive(Debug)]
struct Unreadable;

#[async_trait]
impl Warm for Unreadable {}

#[async_trait]
impl SigningKey for Unreadable {
    async fn get(&self) -> Result<&SecretString, AwsError> {
        Err(AwsError {
            context: "get secret value".into(),
            detail: "service unavailable".into(),
            refusal: None,
        })
    }
}

#[tokio::test]
async fn an_unreadable_stream_key_fails_a_live_view_but_not_a_terminal_one() {
    let mut w = world();
    w.deps.stream_token_key = Arc::new(Unreadable);
    let live = w.job(&owner("alice"), JobStatus::Running).await;
    let response = w.get("alice", &live).await;
    assert_eq!(response.status(), 500);
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    assert!(!text.contains("secret"), "{text}");
    let done = w.job(&owner("alice"), JobStatus::Succeeded).await;
    assert_eq!(w.get("alice", &done).await.status(), 200, "a terminal job links no stream");
}

// GET /jobs

fn ids_of(response: &Response<Body>) -> Vec<JobId> {
    json_of(response)["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn the_listing_is_the_callers_jobs_newest_first_paged_to_its_end() {
    let w = world();
    let mut ids = Vec::new();
    for age in (1..=5).rev() {
        ids.push(w.job_aged(&owner("alice"), JobStatus::Pending, age * 10).await);
    }
    w.job(&owner("bob"), JobStatus::Pending).await;
    let newest_first: Vec<JobId> = ids.iter().rev().cloned().collect();

    let first = w.list("alice", &[("limit", "2")]).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "cache-control"), Some("no-store"));
    let summary = &json_of(&first)["jobs"][0];
    assert_eq!(summary["job_id"], newest_first[0].as_str());
    assert_eq!(summary["type"], "demo");
    assert_eq!(summary["status"], "pending");
    assert_eq!(summary["status_url"], format!("/jobs/{}", newest_first[0]));
    assert!(summary["created_at"].is_string() && summary["updated_at"].is_string());
    assert!(summary.get("params").is_none(), "a summary, not the job");

    let mut seen = ids_of(&first);
    let mut cursor = json_of(&first)["next_cursor"].as_str().map(str::to_owned);
    let mut pages = 1;
    while let Some(next) = cursor {
        let page = w.list("alice", &[("limit", "2"), ("cursor", &next)]).await;
        assert_eq!(page.status(), 200);
        assert!(ids_of(&page).len() <= 2);
        seen.extend(ids_of(&page));
        cursor = json_of(&page)["next_cursor"].as_str().map(str::to_owned);
        pages += 1;
        assert!(pages <= 5, "the pages end");
    }
    assert_eq!(seen, newest_first, "every job once, newest first, none of bob's");
    let last = w.list("bob", &[]).await;
    assert_eq!(ids_of(&last).len(), 1);
    assert!(json_of(&last)["next_cursor"].is_null());
}

#[tokio::test]
async fn a_page_holds_twenty_jobs_unless_asked_otherwise() {
    let w = world();
    for age in 0..(DEFAULT_PAGE as i64 + 1) {
        w.job_aged(&owner("alice"), JobStatus::Pending, age + 1).await;
    }
    let page = w.list("alice", &[]).await;
    assert_eq!(ids_of(&page).len(), DEFAULT_PAGE);
    assert!(json_of(&page)["next_cursor"].is_string());
    let all = w.list("alice", &[("limit", &MAX_PAGE.to_string())]).await;
    assert_eq!(ids_of(&all).len(), DEFAULT_PAGE + 1);
    assert!(json_of(&all)["next_cursor"].is_null());
    assert!(ids_of(&w.list("carol", &[]).await).is_empty(), "no jobs: an empty page");
}

#[tokio::test]
async fn the_listing_filters_by_status_and_type() {
    let w = world();
    let queued = w.job(&owner("alice"), JobStatus::Queued).await;
    let pending = w.job(&owner("alice"), JobStatus::Pending).await;
    let mut report = w.record(&pending).await;
    report.job_type = "csv_report".into();
    w.jobs.put_record(report);
    assert_eq!(
        ids_of(&w.list("alice", &[("status", "queued")]).await),
        std::slice::from_ref(&queued)
    );
    assert_eq!(
        ids_of(&w.list("alice", &[("type", "csv_report")]).await),
        std::slice::from_ref(&pending)
    );
    assert_eq!(ids_of(&w.list("alice", &[("status", "queued"), ("type", "demo")]).await), [queued]);
    assert!(ids_of(&w.list("alice", &[("status", "failed")]).await).is_empty());
    // A type is at most 64 characters: a longer filter is cut, and matches nothing here.
    let long = "x".repeat(100);
    let response = w.list("alice", &[("type", &long)]).await;
    assert_eq!(response.status(), 200);
    assert!(ids_of(&response).is_empty());
}

#[tokio::test]
async fn bad_query_values_are_400() {
    let w = world();
    w.job(&owner("alice"), JobStatus::Pending).await;
    w.job(&owner("bob"), JobStatus::Pending).await;
    w.job(&owner("bob"), JobStatus::Pending).await;
    let bobs = w.list("bob", &[("limit", "1")]).await;
    let bobs_cursor = json_of(&bobs)["next_cursor"].as_str().unwrap().to_owned();
    let too_many = (MAX_PAGE + 1).to_string();
    for query in [
        vec![("sort", "asc")],
        vec![("status", "done")],
        vec![("status", "")],
        vec![("limit", "0")],
        vec![("limit", too_many.as_str())],
        vec![("limit", "ten")],
        vec![("limit", "-1")],
        vec![("cursor", "not-a-cursor")],
        vec![("cursor", bobs_cursor.as_str())],
    ] {
        let response = w.list("alice", &query).await;
        assert_eq!(response.status(), 400, "{query:?}");
        assert_eq!(problem_type(&response), "/problems/bad-request", "{query:?}");
    }
    let cursor = w.list("alice", &[("cursor", &bobs_cursor)]).await;
    assert!(json_of(&cursor)["detail"].as_str().unwrap().contains("cursor"));
    assert_eq!(w.list("bob", &[("cursor", &bobs_cursor)]).await.status(), 200, "bob's own");
}

// GET /jobs/{id}/result

#[tokio::test]
async fn a_succeeded_jobs_result_is_a_303_to_a_fresh_link() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let response = w.call(on_job("GET /jobs/{id}/result", "alice", &id)).await;
    assert_eq!(response.status(), 303);
    let location = header(&response, "location").unwrap();
    assert!(location.contains(&format!("/results/{id}/result.json?")), "{location}");
    assert!(location.contains("X-Amz-Expires=900"), "{location}");
    assert_eq!(header(&response, "cache-control"), Some("no-store"));
    assert!(response.body().is_empty());
}

#[tokio::test]
async fn a_result_that_is_not_there_is_409_or_410() {
    let w = world();
    for status in [
        JobStatus::Pending,
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Failed,
        JobStatus::Cancelled,
    ] {
        let id = w.job(&owner("alice"), status).await;
        let response = w.call(on_job("GET /jobs/{id}/result", "alice", &id)).await;
        assert_eq!(response.status(), 409, "{status}");
        assert_eq!(json_of(&response)["status_now"], status.as_str());
    }
    let expired = w.job(&owner("alice"), JobStatus::Expired).await;
    let response = w.call(on_job("GET /jobs/{id}/result", "alice", &expired)).await;
    assert_eq!(response.status(), 410);
    assert_eq!(problem_type(&response), "/problems/result-expired");
    // A succeeded job without a result key (a record this version did not write).
    let odd = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let mut job = w.record(&odd).await;
    job.result_key = None;
    w.jobs.put_record(job);
    let response = w.call(on_job("GET /jobs/{id}/result", "alice", &odd)).await;
    assert_eq!(response.status(), 409);
    assert_eq!(json_of(&response)["status_now"], "succeeded");
}

#[tokio::test]
async fn a_failing_presigner_is_a_500() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    w.objects.set_unavailable(true);
    let response = w.call(on_job("GET /jobs/{id}/result", "alice", &id)).await;
    assert_eq!(response.status(), 500);
    assert_eq!(header(&response, "location"), None);
}

// GET /jobs/{id}/result/{token}: a small result kept in the job's record

impl World {
    /// A succeeded job of `owner`'s whose result `body` is kept in its record.
    async fn inline_job(&self, owner: &Owner, content_type: &str, body: &[u8]) -> JobId {
        let id = self.job(owner, JobStatus::Succeeded).await;
        let mut job = self.record(&id).await;
        job.result_key = None;
        job.result_inline =
            longhaul_domain::inline_result::InlineResult::of(content_type, body.to_vec());
        assert!(job.result_inline.is_some());
        self.jobs.put_record(job);
        id
    }

    /// The link `GET /jobs/{id}/result` answers `owner` with, for the job `id`: the path a
    /// client resolves its `Location` to (relative to the request's URL).
    async fn result_link(&self, owner: &str, id: &JobId) -> String {
        let response = self.call(on_job("GET /jobs/{id}/result", owner, id.as_str())).await;
        assert_eq!(response.status(), 303);
        assert_eq!(header(&response, "cache-control"), Some("no-store"));
        let location = header(&response, "location").unwrap();
        assert!(location.starts_with("result/"), "relative to the request: {location}");
        format!("/jobs/{id}/{location}")
    }
}

/// `GET <link>` as API Gateway passes it on the link's route: no principal (no authorizer).
fn by_link(link: &str) -> ApiRequest {
    let segments: Vec<&str> = link.split('/').collect();
    let [_, "jobs", id, "result", token] = segments[..] else {
        panic!("not a result link: {link}")
    };
    ApiRequest::new("GET", link, "nobody")
        .anonymous()
        .route("GET /jobs/{id}/result/{token}")
        .param("id", id)
        .param("token", token)
}

#[tokio::test]
async fn a_small_result_is_a_303_to_a_link_of_ours_that_serves_it_without_a_bearer_token() {
    let w = world();
    let body = br#"{"items":10,"digest":"abc"}"#;
    let id = w.inline_job(&owner("alice"), "application/json", body).await;
    let link = w.result_link("alice", &id).await;
    assert!(link.starts_with(&format!("/jobs/{id}/result/")), "{link}");
    let response = w.call(by_link(&link)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.body().as_ref(), body);
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    assert_eq!(header(&response, "cache-control"), Some("private, no-store"));
    assert_eq!(header(&response, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&response, "referrer-policy"), Some("no-referrer"));
    let policy = header(&response, "content-security-policy").unwrap();
    assert!(policy.starts_with("sandbox"), "{policy}");
    // Bytes that are not text come back as they were.
    let binary = w.inline_job(&owner("alice"), "application/octet-stream", &[0, 0xff, 7]).await;
    let response = w.call(by_link(&w.result_link("alice", &binary).await)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.body().as_ref(), [0, 0xff, 7]);
}

#[tokio::test]
async fn a_result_link_that_is_not_valid_is_401_before_anything_is_read() {
    let w = world();
    let id = w.inline_job(&owner("alice"), "text/plain", b"42").await;
    let other = w.inline_job(&owner("alice"), "text/plain", b"43").await;
    let link = w.result_link("alice", &id).await;
    let token = link.rsplit('/').next().unwrap().to_owned();
    let now = w.clock.now().timestamp();
    let alice = owner("alice");
    let stream = stream_token::issue(KEY.as_bytes(), &id, &alice, now + 600);
    let forged = result_link::issue(b"not-the-key", &id, &alice, now + 600);
    let expired = result_link::issue(KEY.as_bytes(), &id, &alice, now - 1);
    // The table is down: a refusal that read anything would be a 500.
    w.jobs.set_unavailable(true);
    for (link, why) in [
        (format!("/jobs/{other}/result/{token}"), "another job's"),
        (format!("/jobs/{id}/result/{stream}"), "a stream token"),
        (format!("/jobs/{id}/result/{forged}"), "signed with another key"),
        (format!("/jobs/{id}/result/{expired}"), "expired"),
        (format!("/jobs/{id}/result/garbage"), "garbage"),
        (format!("/jobs/{id}/result/{}x", &token), "altered"),
    ] {
        let response = w.call(by_link(&link)).await;
        assert_eq!(response.status(), 401, "{why}");
        assert_eq!(problem_type(&response), "/problems/invalid-result-link", "{why}");
    }
    w.jobs.set_unavailable(false);
    assert_eq!(w.call(by_link(&link)).await.status(), 200, "the link itself");
}

#[tokio::test]
async fn a_result_link_opens_nothing_once_the_job_expired_or_changed_hands() {
    let w = world();
    let id = w.inline_job(&owner("alice"), "text/plain", b"42").await;
    let link = w.result_link("alice", &id).await;
    // The token names alice: a record that is not hers answers as an unknown job would.
    let mut job = w.record(&id).await;
    job.owner = owner("mallory");
    w.jobs.put_record(job.clone());
    assert_eq!(w.call(by_link(&link)).await.status(), 404);
    // Expired (the expirer removes the result in the same write): 410, as the result route.
    job.owner = owner("alice");
    job.status = JobStatus::Expired;
    job.result_inline = None;
    w.jobs.put_record(job);
    let response = w.call(by_link(&link)).await;
    assert_eq!(response.status(), 410);
    assert_eq!(problem_type(&response), "/problems/result-expired");
    // A stored result has no such link: its job's record holds no bytes to serve.
    let stored = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let token = result_link::issue(
        KEY.as_bytes(),
        &stored,
        &owner("alice"),
        w.clock.now().timestamp() + 60,
    );
    assert_eq!(w.call(by_link(&format!("/jobs/{stored}/result/{token}"))).await.status(), 404);
}

#[tokio::test]
async fn a_result_link_lives_fifteen_minutes() {
    let w = world();
    let id = w.inline_job(&owner("alice"), "text/plain", b"42").await;
    let link = w.result_link("alice", &id).await;
    w.clock.advance(RESULT_URL_TTL);
    assert_eq!(w.call(by_link(&link)).await.status(), 200, "valid to the second");
    w.clock.advance(Duration::from_secs(1));
    assert_eq!(w.call(by_link(&link)).await.status(), 401);
}

// GET /jobs/{id}/deliveries

#[tokio::test]
async fn deliveries_are_listed_oldest_first() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let empty = w.call(on_job("GET /jobs/{id}/deliveries", "alice", &id)).await;
    assert_eq!(empty.status(), 200);
    assert_eq!(json_of(&empty), json!({"job_id": id, "deliveries": []}));
    let delivery = |attempt: u32, outcome| DeliveryRecord {
        webhook_id: format!("msg_{id}"),
        event: "job.succeeded".into(),
        attempt,
        at: Timestamp::now(),
        status_code: Some(if attempt == 1 { 500 } else { 200 }),
        latency_ms: 12,
        error: None,
        outcome,
    };
    w.jobs.record_delivery(&id, &delivery(2, DeliveryOutcome::Delivered)).await.unwrap();
    w.jobs.record_delivery(&id, &delivery(1, DeliveryOutcome::Retrying)).await.unwrap();
    let response = w.call(on_job("GET /jobs/{id}/deliveries", "alice", &id)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "cache-control"), Some("no-store"));
    let body = json_of(&response);
    let attempts: Vec<u64> = body["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2]);
    assert_eq!(body["deliveries"][0]["status_code"], 500);
}

// The other routes.

#[tokio::test]
async fn job_types_lists_the_enabled_kinds() {
    let w = world();
    let response =
        w.call(ApiRequest::new("GET", "/job-types", "alice").route("GET /job-types")).await;
    assert_eq!(response.status(), 200);
    let body = json_of(&response);
    let kinds: Vec<&str> =
        body["job_types"].as_array().unwrap().iter().map(|k| k["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["demo"], "only what the deployment enables");
    assert!(body["job_types"][0]["params_schema"].is_object());
    assert!(body["job_types"][0]["stages"].is_array());
}

#[tokio::test]
async fn the_api_description_is_served_as_is() {
    let w = world();
    let response =
        w.call(ApiRequest::new("GET", "/openapi.json", "alice").route("GET /openapi.json")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    assert_eq!(header(&response, "cache-control"), Some("public, max-age=300"));
    assert_eq!(response.body().as_ref(), OPENAPI.as_bytes());
}

#[tokio::test]
async fn another_method_on_a_known_path_is_405_with_allow_and_anything_else_404() {
    let w = world();
    let allowed = |response: &Response<Body>| {
        let mut methods: Vec<String> =
            header(response, "allow").unwrap().split(", ").map(str::to_owned).collect();
        methods.sort();
        methods
    };
    for (method, path, allow) in [
        ("DELETE", "/jobs", vec!["GET", "POST"]),
        ("PUT", "/jobs/01J00000000000000000000000", vec!["DELETE", "GET"]),
        ("GET", "/jobs/x/cancel", vec!["POST"]),
        ("PATCH", "/webhooks/secret", vec!["GET"]),
        ("POST", "/console/app.js", vec!["GET"]),
    ] {
        let response = w.call(ApiRequest::new(method, path, "alice").route("$default")).await;
        assert_eq!(response.status(), 405, "{method} {path}");
        assert_eq!(problem_type(&response), "/problems/method-not-allowed");
        assert_eq!(allowed(&response), allow, "{method} {path}");
    }
    for path in ["/nowhere", "/jobs/x/y/z", "/jobs//result", "/"] {
        let response = w.call(ApiRequest::new("GET", path, "alice").route("$default")).await;
        assert_eq!(response.status(), 404, "{path}");
        assert_eq!(header(&response, "allow"), None);
    }
    // No route at all (a direct invocation) is the same fallback.
    let response = w.call(ApiRequest::new("DELETE", "/jobs", "alice")).await;
    assert_eq!(response.status(), 405);
}

#[tokio::test]
async fn a_kinds_summary_shows_beside_the_result() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let view = json_of(&w.get("alice", &id).await);
    assert!(view.get("summary").is_none(), "no summary unless the kind gave one: {view}");
    let mut job = w.jobs.job(&id).await.unwrap().unwrap();
    job.summary = Some(json!({"rows_scanned": 3, "invalid_cells": {"amount": 1}}));
    w.jobs.put_record(job);
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["summary"], json!({"rows_scanned": 3, "invalid_cells": {"amount": 1}}));
}

#[tokio::test]
async fn progress_says_what_its_numbers_count() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["progress"]["unit"], "items", "the default unit: {view}");
    let mut job = w.jobs.job(&id).await.unwrap().unwrap();
    job.policy = Some(longhaul_domain::policy::JobPolicy {
        progress_unit: "bytes".into(),
        ..Default::default()
    });
    w.jobs.put_record(job);
    let view = json_of(&w.get("alice", &id).await);
    assert_eq!(view["progress"]["unit"], "bytes", "as the job's kind declared: {view}");
}
