//! The handler over in-memory adapters: every path and every refusal.

use super::*;

use longhaul_aws::jobs::{ProgressRecord, TransitionRequest};
use longhaul_aws::ports::{JobCreation, JobTransitions};
use longhaul_domain::{JobId, Owner, Timestamp};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryExecutions, MemoryJobStore, MemorySigningKey, owner,
};

/// The key signal links are signed with in these tests.
const KEY: &str = "signal-link-key";

struct World {
    jobs: Arc<MemoryJobStore>,
    executions: Arc<MemoryExecutions>,
    intake: Arc<MemoryDispatchQueue>,
    /// The handler's clock: standing still at the time the world was made.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world() -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let executions = Arc::new(MemoryExecutions::new());
    let clock = Arc::new(ManualClock::new());
    let intake = Arc::new(MemoryDispatchQueue::default());
    let deps = Deps {
        jobs: jobs.clone(),
        executions: executions.clone(),
        clock: clock.clone(),
        intake: intake.clone(),
        token_key: Arc::new(MemorySigningKey::new(KEY)),
    };
    World { jobs, executions, intake, clock, deps }
}

impl World {
    async fn job(&self, owner: &Owner, status: JobStatus) -> JobId {
        let job = pending_job(owner, Timestamp::now());
        let id = job.job_id.clone();
        self.jobs.put_job(&job).await.unwrap();
        let mut at = JobStatus::Pending;
        for next in [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded] {
            if at == status {
                break;
            }
            let mut request = TransitionRequest::new(&id, &[at], next, "arranged");
            if next == JobStatus::Queued {
                request = request.set("execution", &id);
                self.executions.start(&id, &json!({})).await.unwrap();
            }
            if next == JobStatus::Running {
                request = request.set("lease", "lease-1").set("attempt", 1);
            }
            self.jobs.transition(request).await.unwrap();
            at = next;
        }
        id
    }

    /// `POST /jobs/{id}/cancel` as API Gateway passes it: the path's id and the token's
    /// principal as sent.
    async fn cancel(
        &self,
        principal: &str,
        id: &str,
        body: Option<serde_json::Value>,
    ) -> Response<Body> {
        let mut request =
            ApiRequest::new("POST", &format!("/jobs/{id}/cancel"), principal).param("id", id);
        if let Some(body) = body {
            request = request.json(&body);
        }
        handle(&self.deps, request.build()).await
    }

    /// `POST /jobs/{id}/<control>` (`pause` or `resume`) as API Gateway routes it.
    async fn control(
        &self,
        control: &str,
        principal: &str,
        id: &str,
        body: Option<serde_json::Value>,
    ) -> Response<Body> {
        let mut request = ApiRequest::new("POST", &format!("/jobs/{id}/{control}"), principal)
            .route(&format!("POST /jobs/{{id}}/{control}"))
            .param("id", id);
        if let Some(body) = body {
            request = request.json(&body);
        }
        handle(&self.deps, request.build()).await
    }

    async fn status(&self, id: &JobId) -> JobStatus {
        self.jobs.job(id).await.unwrap().unwrap().status
    }
}

#[tokio::test]
async fn a_pending_job_is_cancelled_at_once_with_who_and_why() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    let response = w.cancel("alice", &id, Some(json!({"reason": "changed my mind"}))).await;
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["location"], format!("/jobs/{id}").as_str());
    let body = json_of(&response);
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["cancellation"]["requested_by"], "alice");
    assert_eq!(body["cancellation"]["reason"], "changed my mind");
    let job = w.jobs.job(&id).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Cancelled);
    assert!(job.transitions.last().unwrap().reason.contains("changed my mind"));
    assert!(w.executions.started().is_empty(), "a job never queued has no execution to stop");
}

#[tokio::test]
async fn a_request_is_stamped_with_the_clocks_time() {
    let w = world();
    let pending = w.job(&owner("alice"), JobStatus::Pending).await;
    let running = w.job(&owner("alice"), JobStatus::Running).await;
    w.jobs.put_progress(&running, ProgressRecord { lease: "lease-1".into(), ..Default::default() });
    // A time the machine's clock is not at: the handler reads the clock it is given.
    let at: Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(at.as_datetime());
    for id in [&pending, &running] {
        let response = w.cancel("alice", id, None).await;
        assert_eq!(response.status(), 202);
        assert_eq!(json_of(&response)["cancellation"]["requested_at"], at.to_string(), "{id}");
        let job = w.jobs.job(id).await.unwrap().unwrap();
        assert_eq!(job.cancellation.unwrap().requested_at, at, "{id}");
    }
}

#[tokio::test]
async fn a_queued_jobs_execution_is_stopped() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Queued).await;
    let response = w.cancel("alice", &id, None).await;
    assert_eq!(response.status(), 202);
    assert_eq!(w.status(&id).await, JobStatus::Cancelled);
    let started = w.executions.started();
    assert_eq!(started[0].status, "ABORTED", "{started:?}");
    assert_eq!(started[0].stopped_because.as_deref(), Some("cancelled by its owner"));
}

#[tokio::test]
async fn a_failed_stop_leaves_the_job_cancelled() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Queued).await;
    w.executions.set_unavailable(true);
    let response = w.cancel("alice", &id, None).await;
    assert_eq!(response.status(), 202, "the execution's claim will be refused");
    assert_eq!(w.status(&id).await, JobStatus::Cancelled);
}

#[tokio::test]
async fn a_running_job_gets_a_request_its_stage_sees_and_a_repeat_keeps_the_first() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    w.jobs.put_progress(&id, ProgressRecord { lease: "lease-1".into(), ..Default::default() });
    let first = w.cancel("alice", &id, Some(json!({"reason": "first"}))).await;
    assert_eq!(first.status(), 202);
    let body = json_of(&first);
    assert_eq!(body["status"], "running", "the stage stops at its next progress write");
    assert_eq!(body["cancellation"]["reason"], "first");
    let flag = w.jobs.progress(&id).unwrap().cancel_requested_at;
    assert!(flag.is_some(), "the progress record is flagged");
    let again = w.cancel("alice", &id, Some(json!({"reason": "second"}))).await;
    assert_eq!(again.status(), 202);
    assert_eq!(json_of(&again)["cancellation"]["reason"], "first", "the first request stands");
    assert_eq!(w.jobs.progress(&id).unwrap().cancel_requested_at, flag);
    assert_eq!(w.status(&id).await, JobStatus::Running);
}

#[tokio::test]
async fn a_terminal_job_is_a_conflict_naming_its_status() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Succeeded).await;
    let response = w.cancel("alice", &id, None).await;
    assert_eq!(response.status(), 409);
    let problem = json_of(&response);
    assert_eq!(problem["status_now"], "succeeded");
    assert_eq!(w.status(&id).await, JobStatus::Succeeded);
}

#[tokio::test]
async fn another_tenants_job_and_unknown_ids_read_the_same_404() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    for (who, target) in
        [("mallory", id.as_str()), ("alice", "01J00000000000000000000000"), ("alice", "nope")]
    {
        let response = w.cancel(who, target, None).await;
        assert_eq!(response.status(), 404, "{who} {target}");
        assert_eq!(json_of(&response)["status"], 404);
    }
    assert_eq!(w.status(&id).await, JobStatus::Pending, "nothing changed");
}

#[tokio::test]
async fn bad_bodies_are_refused_and_change_nothing() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    let long = "x".repeat(MAX_REASON_CHARS + 1);
    for body in [json!({"reason": long}), json!({"why": "unknown field"}), json!({"reason": 5})] {
        let response = w.cancel("alice", &id, Some(body.clone())).await;
        assert_eq!(response.status(), 400, "{body}");
    }
    let not_json = ApiRequest::new("POST", "/", "alice")
        .param("id", &id)
        .header("content-type", "text/plain")
        .raw_body(b"stop");
    let response = handle(&w.deps, not_json.build()).await;
    assert!(response.status().is_client_error(), "{}", response.status());
    assert_eq!(w.status(&id).await, JobStatus::Pending);
}

#[tokio::test]
async fn a_request_without_a_principal_is_401() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    let request = ApiRequest::new("POST", "/", "alice").anonymous().param("id", &id);
    assert_eq!(handle(&w.deps, request.build()).await.status(), 401);
    assert_eq!(w.status(&id).await, JobStatus::Pending);
}

#[tokio::test]
async fn a_failing_table_is_a_500_that_names_nothing_inside() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    w.jobs.set_unavailable(true);
    let response = w.cancel("alice", &id, None).await;
    assert_eq!(response.status(), 500);
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    assert!(!text.contains("unavailable") && !text.contains("cancel job"), "{text}");
    w.jobs.set_unavailable(false);
    assert_eq!(w.status(&id).await, JobStatus::Pending);
}

// ---------------------------------------------------------------------------------------------
// POST /jobs/{id}/pause and /resume
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_pending_or_queued_job_pauses_at_once_and_resumes_through_dispatch() {
    for from in [JobStatus::Pending, JobStatus::Queued] {
        let w = world();
        // (Queued: dispatched, not yet claimed — never started either.)
        let id = w.job(&owner("alice"), from).await;
        let at: Timestamp = "2031-02-03T04:05:06.000Z".parse().unwrap();
        w.clock.set(at.as_datetime());
        let paused = w.control("pause", "alice", &id, Some(json!({"reason": "month end"}))).await;
        assert_eq!(paused.status(), 202, "{from}");
        let body = json_of(&paused);
        assert_eq!(body["status"], "paused");
        assert_eq!(body["pause"]["reason"], "month end");
        assert_eq!(body["pause"]["requested_by"], "alice");
        assert_eq!(body["pause"]["paused_at"], at.to_string());
        let job = w.jobs.job(&id).await.unwrap().unwrap();
        assert_eq!(job.status, JobStatus::Paused);
        assert_eq!(job.transitions.last().unwrap().reason, "paused by alice: month end");
        // Its pause lapses a week on (the default max_paused): the reaper's index says so.
        let (bucket, lapses) = w.jobs.index_entry(&id).expect("indexed while paused");
        assert!(bucket.starts_with("paused#"), "{bucket}");
        assert_eq!(lapses, "2031-02-10T04:05:06.000Z");
        assert!(w.intake.sent().is_empty(), "nothing dispatched while paused");

        // Pausing again changes nothing.
        let again = w.control("pause", "alice", &id, Some(json!({"reason": "other"}))).await;
        assert_eq!(again.status(), 200);
        assert_eq!(json_of(&again)["pause"]["reason"], "month end", "the first pause stands");

        // An hour later it resumes: pending, enqueued for dispatch. (The hour is not added to
        // its runtime's allowance: it had not started, its runtime has yet to begin.)
        w.clock.set(at.as_datetime() + std::time::Duration::from_secs(3600));
        let resumed = w.control("resume", "alice", &id, None).await;
        assert_eq!(resumed.status(), 202);
        assert_eq!(json_of(&resumed)["status"], "pending");
        let job = w.jobs.job(&id).await.unwrap().unwrap();
        assert_eq!((job.status, job.pause.is_none()), (JobStatus::Pending, true));
        assert_eq!((job.paused_seconds, job.resumes), (0, 1));
        assert_eq!(job.transitions.last().unwrap().reason, "resumed by alice");
        let sent = w.intake.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!((&sent[0].0.job_id, sent[0].1, &sent[0].2), (&id, 0, &owner("alice")));

        // Resuming a job that is not paused is a conflict naming its status.
        let not_paused = w.control("resume", "alice", &id, None).await;
        assert_eq!(not_paused.status(), 409);
        assert_eq!(json_of(&not_paused)["status_now"], "pending");
    }
}

#[tokio::test]
async fn a_running_job_is_asked_to_pause_and_a_resume_before_it_paused_withdraws_it() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    w.jobs.put_progress(&id, ProgressRecord { lease: "lease-1".into(), ..Default::default() });
    let asked = w.control("pause", "alice", &id, None).await;
    assert_eq!(asked.status(), 202);
    let body = json_of(&asked);
    assert_eq!(body["status"], "running", "the stage pauses at its next progress write");
    assert!(body["pause"]["paused_at"].is_null(), "{body}");
    assert!(w.jobs.progress(&id).unwrap().pause_requested_at.is_some(), "the record is flagged");
    assert_eq!(w.control("pause", "alice", &id, None).await.status(), 200, "asked already");

    let withdrawn = w.control("resume", "alice", &id, None).await;
    assert_eq!(withdrawn.status(), 200);
    assert_eq!(json_of(&withdrawn)["status"], "running");
    let job = w.jobs.job(&id).await.unwrap().unwrap();
    assert_eq!((job.status, job.pause.is_none()), (JobStatus::Running, true));
    assert!(w.jobs.progress(&id).unwrap().pause_requested_at.is_none(), "the flag is gone");
    assert!(w.intake.sent().is_empty(), "a running job is not dispatched again");
}

#[tokio::test]
async fn a_paused_job_can_be_cancelled_and_ended_or_cancelling_jobs_are_409() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    assert_eq!(w.control("pause", "alice", &id, None).await.status(), 202);
    let cancelled = w.cancel("alice", &id, Some(json!({"reason": "not needed"}))).await;
    assert_eq!(cancelled.status(), 202);
    assert_eq!(w.status(&id).await, JobStatus::Cancelled);
    assert_eq!(w.jobs.index_entry(&id), None, "out of the paused bucket");
    for control in ["pause", "resume"] {
        let refused = w.control(control, "alice", &id, None).await;
        assert_eq!(refused.status(), 409, "{control}");
        assert_eq!(json_of(&refused)["status_now"], "cancelled");
    }

    // A running job its owner is cancelling cannot be paused.
    let running = w.job(&owner("alice"), JobStatus::Running).await;
    w.jobs.put_progress(&running, ProgressRecord { lease: "lease-1".into(), ..Default::default() });
    assert_eq!(w.cancel("alice", &running, None).await.status(), 202);
    let refused = w.control("pause", "alice", &running, None).await;
    assert_eq!(refused.status(), 409);
    assert!(json_of(&refused)["detail"].as_str().unwrap().contains("being cancelled"));
    assert!(w.jobs.progress(&running).unwrap().pause_requested_at.is_none());
}

#[tokio::test]
async fn pause_and_resume_are_the_owners_alone_and_bad_bodies_change_nothing() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    for control in ["pause", "resume"] {
        for (who, target) in [("mallory", id.as_str()), ("alice", "nope")] {
            let response = w.control(control, who, target, None).await;
            assert_eq!(response.status(), 404, "{control} {who} {target}");
        }
        for body in [json!({"reason": "x".repeat(501)}), json!({"why": "no"}), json!([1])] {
            let response = w.control(control, "alice", &id, Some(body.clone())).await;
            assert_eq!(response.status(), 400, "{control} {body}");
        }
    }
    assert_eq!(w.status(&id).await, JobStatus::Pending);
    assert!(w.intake.sent().is_empty());
}

// ---------------------------------------------------------------------------------------------
// POST /jobs/{id}/signals/{name} and its signed link
// ---------------------------------------------------------------------------------------------

use longhaul_aws::jobs::SignalRecord;
use longhaul_aws::ports::{JobPausing, JobSignals};
use longhaul_domain::signals::{self as signal_links, SignalName, Wait};

impl World {
    /// A running job of `owner`'s, parked by its stage waiting for `signal`.
    async fn waiting(&self, owner: &Owner, signal: &str) -> JobId {
        let id = self.job(owner, JobStatus::Running).await;
        let job = self.jobs.job(&id).await.unwrap().unwrap();
        let until = Timestamp::from(self.clock.now() + chrono_hours(1));
        let wait = Wait { signal: signal.parse().unwrap(), until };
        self.jobs
            .park_waiting(&job, "lease-1", &wait, Timestamp::from(self.clock.now()))
            .await
            .unwrap();
        id
    }

    /// `POST /jobs/{id}/signals/{name}` by `principal`, or (`link`) by its signed link.
    async fn signal(
        &self,
        principal: &str,
        id: &str,
        name: &str,
        link: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Response<Body> {
        let mut request = match link {
            Some(token) => {
                ApiRequest::new("POST", &format!("/jobs/{id}/signals/{name}/{token}"), principal)
                    .anonymous()
                    .route("POST /jobs/{id}/signals/{name}/{token}")
                    .param("token", token)
            }
            None => ApiRequest::new("POST", &format!("/jobs/{id}/signals/{name}"), principal)
                .route("POST /jobs/{id}/signals/{name}"),
        }
        .param("id", id)
        .param("name", name);
        if let Some(body) = body {
            request = request.json(&body);
        }
        handle(&self.deps, request.build()).await
    }

    async fn kept(&self, id: &JobId, name: &str) -> Option<SignalRecord> {
        self.jobs.signal(id, &name.parse::<SignalName>().unwrap()).await.unwrap()
    }
}

fn chrono_hours(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n * 3_600)
}

#[tokio::test]
async fn a_signal_resumes_the_job_that_waits_for_it_with_its_payload_kept() {
    let w = world();
    let id = w.waiting(&owner("alice"), "approval").await;
    let sent =
        w.signal("alice", &id, "approval", None, Some(json!({"payload": {"ok": true}}))).await;
    assert_eq!(sent.status(), 202, "{:?}", json_of(&sent));
    assert_eq!(json_of(&sent)["status"], "pending", "resumed");
    assert_eq!(w.status(&id).await, JobStatus::Pending);
    assert!(
        matches!(w.kept(&id, "approval").await, Some(SignalRecord::Received { payload, .. }) if payload == json!({"ok": true}))
    );
    assert_eq!(w.intake.sent().len(), 1, "dispatched again");
    // A second signal of the name is refused, and changes nothing.
    let again = w.signal("alice", &id, "approval", None, Some(json!({"payload": 2}))).await;
    assert_eq!(again.status(), 409);
    assert!(
        matches!(w.kept(&id, "approval").await, Some(SignalRecord::Received { payload, .. }) if payload == json!({"ok": true}))
    );
}

#[tokio::test]
async fn a_signal_before_its_wait_is_kept_and_one_for_another_wait_is_409_naming_it() {
    let w = world();
    let running = w.job(&owner("alice"), JobStatus::Running).await;
    let early = w.signal("alice", &running, "file.arrived", None, None).await;
    assert_eq!(early.status(), 202);
    assert_eq!(json_of(&early)["status"], "running", "kept for the wait to come");
    assert!(
        matches!(w.kept(&running, "file.arrived").await, Some(SignalRecord::Received { payload, .. }) if payload.is_null())
    );
    assert!(w.intake.sent().is_empty());

    let waiting = w.waiting(&owner("alice"), "approval").await;
    let other = w.signal("alice", &waiting, "rejection", None, None).await;
    assert_eq!(other.status(), 409);
    assert!(json_of(&other)["detail"].as_str().unwrap().contains("waits for signal approval"));
    assert!(w.kept(&waiting, "rejection").await.is_none(), "nothing kept");
}

#[tokio::test]
async fn a_job_keeps_a_bounded_number_of_signals_and_says_so() {
    let w = world();
    let running = w.job(&owner("alice"), JobStatus::Running).await;
    let bound = longhaul_domain::signals::MAX_SIGNALS_PER_JOB;
    for i in 0..bound {
        let kept = w.signal("alice", &running, &format!("s{i}"), None, None).await;
        assert_eq!(kept.status(), 202, "signal {i}");
    }
    let refused = w.signal("alice", &running, "one-more", None, None).await;
    assert_eq!(refused.status(), 409);
    let problem = json_of(&refused);
    assert_eq!(problem["type"], "/problems/too-many-signals", "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains(&format!("at most {bound}")));
    assert!(w.kept(&running, "one-more").await.is_none(), "nothing kept");
    let again = w.signal("alice", &running, "s3", None, None).await;
    assert!(json_of(&again)["detail"].as_str().unwrap().contains("already sent"), "still taken");
}

#[tokio::test]
async fn a_signed_link_sends_the_signal_without_a_bearer_and_a_bad_one_reads_nothing() {
    let w = world();
    let id = w.waiting(&owner("alice"), "approval").await;
    let now = w.clock.now().timestamp();
    let name: SignalName = "approval".parse().unwrap();
    let token = signal_links::issue(KEY.as_bytes(), &id, &name, now + 3_600);
    let forged = signal_links::issue(b"not the key", &id, &name, now + 3_600);
    let expired = signal_links::issue(KEY.as_bytes(), &id, &name, now - 1);
    // The table is down: a refusal that read anything would be a 500.
    w.jobs.set_unavailable(true);
    for bad in [forged.as_str(), expired.as_str(), "nonsense"] {
        let refused = w.signal("", &id, "approval", Some(bad), Some(json!({"payload": 1}))).await;
        assert_eq!(refused.status(), 401, "{bad}: refused before any read");
    }
    w.jobs.set_unavailable(false);
    let other_name = w.signal("", &id, "rejection", Some(&token), None).await;
    assert_eq!(other_name.status(), 401, "a link opens its own signal only");
    let sent = w.signal("", &id, "approval", Some(&token), Some(json!({"payload": "yes"}))).await;
    assert_eq!(sent.status(), 202);
    assert_eq!(w.status(&id).await, JobStatus::Pending);
    let again =
        w.signal("", &id, "approval", Some(&token), Some(json!({"payload": "again"}))).await;
    assert_eq!(again.status(), 409, "one time");
}

#[tokio::test]
async fn bad_signals_are_4xx_and_keep_nothing() {
    let w = world();
    let id = w.waiting(&owner("alice"), "approval").await;
    let big = json!({"payload": "x".repeat(64 * 1024)});
    let cases = [
        ("alice", "approval", Some(big), 413),
        ("alice", "approval", Some(json!({"payload": 1, "extra": 2})), 400),
        ("alice", "bad%20name", None, 400),
        ("mallory", "approval", None, 404),
    ];
    for (who, name, body, status) in cases {
        let response = w.signal(who, &id, name, None, body).await;
        assert_eq!(response.status(), status, "{who} {name}");
    }
    assert!(w.kept(&id, "approval").await.is_none());
    let done = w.job(&owner("alice"), JobStatus::Succeeded).await;
    assert_eq!(w.signal("alice", &done, "approval", None, None).await.status(), 409);
}

#[tokio::test]
async fn a_waiting_job_is_neither_paused_nor_resumed_by_its_owner_but_can_be_cancelled() {
    let w = world();
    let id = w.waiting(&owner("alice"), "approval").await;
    for control in ["pause", "resume"] {
        let refused = w.control(control, "alice", &id, None).await;
        assert_eq!(refused.status(), 409, "{control}");
        assert!(
            json_of(&refused)["detail"].as_str().unwrap().contains("waits for signal approval")
        );
    }
    assert_eq!(w.status(&id).await, JobStatus::Paused);
    assert_eq!(w.cancel("alice", &id, None).await.status(), 202);
    assert_eq!(w.status(&id).await, JobStatus::Cancelled);
}

#[tokio::test]
async fn a_signal_kept_whose_resume_failed_is_resumed_by_the_next_try() {
    let w = world();
    let id = w.waiting(&owner("alice"), "approval").await;
    // The first sender's write landed, then it died before resuming the job.
    let name: SignalName = "approval".parse().unwrap();
    w.jobs.put_signal(&id, &name, &json!("yes"), Timestamp::now()).await.unwrap();
    assert_eq!(w.status(&id).await, JobStatus::Paused);
    let again = w.signal("alice", &id, "approval", None, None).await;
    assert_eq!(again.status(), 409, "sent already");
    assert_eq!(w.status(&id).await, JobStatus::Pending, "but the job it waited for resumed");
    assert_eq!(w.intake.sent().len(), 1);
}

/// A job of alice's that started (and was paused at its checkpoint, or waits out a backoff
/// `queued`), its kind giving its stage an undo.
async fn started_with_undo(w: &World, status: JobStatus) -> JobId {
    let id = w.job(&owner("alice"), JobStatus::Running).await;
    let mut job = w.jobs.job(&id).await.unwrap().unwrap();
    // As its claim stamps it.
    job.started_at = Some(Timestamp::now());
    job.undo_stages = vec!["process".into()];
    w.jobs.put_record(job);
    let request =
        TransitionRequest::new(&id, &[JobStatus::Running], status, "arranged").fenced("lease-1");
    w.jobs.transition(request).await.unwrap();
    id
}

#[tokio::test]
async fn a_started_job_with_undos_cancelled_while_paused_or_backing_off_compensates_first() {
    for status in [JobStatus::Paused, JobStatus::Queued] {
        let w = world();
        let id = started_with_undo(&w, status).await;
        let response = w.cancel("alice", &id, Some(json!({"reason": "not needed"}))).await;
        assert_eq!(response.status(), 202, "{status}");
        let body = json_of(&response);
        assert_eq!(body["status"], "compensating", "{status}: {body}");
        assert_eq!(body["cancellation"]["reason"], "not needed");
        let job = w.jobs.job(&id).await.unwrap().unwrap();
        assert_eq!(job.status, JobStatus::Compensating);
        let compensation = job.compensation.expect("to be planned by the worker");
        assert_eq!(compensation.ending.status, JobStatus::Cancelled);
        assert!(compensation.ending.reason.contains("not needed"), "{compensation:?}");
        let sent = w.intake.sent();
        assert_eq!(sent.len(), 1, "sent to its worker to undo: {sent:?}");
        assert_eq!(sent[0].0.job_id, id);
        // It is ending already: a second cancellation, a pause, a resume or a signal is
        // refused, and no signal is kept.
        for control in ["cancel", "pause", "resume", "signal"] {
            let refused = match control {
                "cancel" => w.cancel("alice", &id, None).await,
                "signal" => {
                    let body = Some(json!({"payload": {"ok": true}}));
                    w.signal("alice", &id, "approval", None, body).await
                }
                _ => w.control(control, "alice", &id, None).await,
            };
            assert_eq!(refused.status(), 409, "{control}");
            assert_eq!(json_of(&refused)["status_now"], "compensating", "{control}");
        }
        assert_eq!(w.kept(&id, "approval").await, None);
    }
}

#[tokio::test]
async fn a_job_with_undos_that_never_started_is_cancelled_at_once() {
    let w = world();
    let id = w.job(&owner("alice"), JobStatus::Pending).await;
    let mut job = w.jobs.job(&id).await.unwrap().unwrap();
    job.undo_stages = vec!["process".into()];
    w.jobs.put_record(job);
    let response = w.cancel("alice", &id, None).await;
    assert_eq!(response.status(), 202);
    assert_eq!(w.status(&id).await, JobStatus::Cancelled, "nothing started: nothing to undo");
    assert!(w.intake.sent().is_empty());
}
