//! The handler over in-memory adapters: every path of `POST /jobs` and `POST /jobs/{id}/retry`,
//! every refusal, and what a failing table or queue leaves.

use super::*;

use longhaul_aws::jobs::JobRecord;
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};
use serde_json::json;

/// A job record as submit writes it, in `status`.
pub(crate) fn job_in(status: JobStatus) -> JobRecord {
    let now = Timestamp::now().to_rfc3339();
    serde_json::from_value(json!({
        "job_id": JobId::new(),
        "owner": "alice",
        "type": "demo",
        "params": {"items": 1},
        "status": status,
        "attempt": 0,
        "idempotency_key": "order-42",
        "fingerprint": "f",
        "created_at": now,
        "updated_at": now,
        "transitions": [],
    }))
    .unwrap()
}

use std::sync::Arc;

use lambda_http::http::header;
use longhaul_aws::jobs::{IdempotencyRecord, ListFilter, ProgressRecord};
use longhaul_aws::ports::{JobCreation, JobListing, JobReads, SlotPools};
use longhaul_aws::slots::Pool;
use longhaul_domain::fingerprint::{retry_idempotency_key, submission_fingerprint};
use longhaul_domain::policy::PolicyOverrides;
use longhaul_domain::uploads::owner_prefix;
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryExecutions, MemoryInvocations, MemoryJobStore,
    MemoryObjects, MemoryRateLimits, MemorySlotPools, owner,
};
use serde_json::Value;

struct World {
    jobs: Arc<MemoryJobStore>,
    limits: Arc<MemoryRateLimits>,
    queue: Arc<MemoryDispatchQueue>,
    uploads: Arc<MemoryObjects>,
    /// The handler's clock: standing still at the time the world was made, unless moved.
    clock: Arc<ManualClock>,
    /// The runs invoked by jobs started at once ([`world_starting`]).
    invocations: Arc<MemoryInvocations>,
    /// The running slots and waiting lists the jobs started at once use.
    slots: Arc<MemorySlotPools>,
    deps: Deps,
}

/// `per_minute` submissions a minute per tenant, at most `max_pending` jobs not yet running;
/// the demo and CSV report kinds enabled.
fn world_limited(per_minute: u32, max_pending: usize) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let clock = Arc::new(ManualClock::new());
    let limits = Arc::new(MemoryRateLimits::on_clock(per_minute, clock.clone()));
    let queue = Arc::new(MemoryDispatchQueue::new());
    let uploads = Arc::new(MemoryObjects::new());
    let deps = Deps {
        jobs: jobs.clone(),
        limiter: limits.clone(),
        submissions_per_minute: per_minute,
        intake: queue.clone(),
        uploads: uploads.clone(),
        idempotency_ttl: std::time::Duration::from_secs(86_400),
        registry: longhaul_jobs::registry().enabled(&["demo".into(), "csv_report".into()]),
        callbacks: longhaul_domain::callback::CallbackPolicy { allow_insecure: false },
        policy_overrides: Default::default(),
        max_pending,
        clock: clock.clone(),
        start: None,
    };
    let invocations = Arc::new(MemoryInvocations::new());
    let slots = Arc::new(MemorySlotPools::new(queue.clone()));
    World { jobs, limits, queue, uploads, clock, invocations, slots, deps }
}

const STAGE_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:longhaul-StageFunction";

/// A world whose submissions start their jobs at once, as the submit function's do (`world`'s
/// enqueue every job, as the schedules function's do): a tenant runs `tenant_max_running`
/// jobs at once.
fn world_starting(tenant_max_running: u32) -> World {
    starting(world(), tenant_max_running)
}

/// `w`, its submissions starting their jobs at once ([`world_starting`]); with tenant pools,
/// its submissions are counted on them, as the submit function's are.
fn starting(mut w: World, tenant_max_running: u32) -> World {
    if tenant_max_running > 0 {
        w.deps.limiter = Arc::new(longhaul_aws::pool_rate::PoolRateLimiter::new(
            w.slots.clone(),
            w.deps.submissions_per_minute,
            w.clock.clone(),
        ));
    }
    let workers = format!(r#"{{"StageFunction": "{STAGE_ARN}"}}"#);
    w.deps.start = Some(Arc::new(dispatcher::Deps {
        jobs: w.jobs.clone(),
        invocations: w.invocations.clone(),
        executions: Arc::new(MemoryExecutions::new()),
        slots: w.slots.clone(),
        intake: w.queue.clone(),
        clock: w.clock.clone(),
        config: dispatcher::Config {
            table: "jobs".into(),
            state_machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:job".into(),
            intake_queue_url: "https://sqs.memory.invalid/intake".into(),
            tenant_max_running,
            workers: longhaul_aws::workers::Workers::parse(&workers).unwrap(),
        },
    }));
    w
}

fn world() -> World {
    world_limited(600, 10_000)
}

fn demo() -> Value {
    json!({"type": "demo", "params": {"items": 1}})
}

fn problem_type(response: &Response<Body>) -> String {
    assert_eq!(
        response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "a problem"
    );
    json_of(response)["type"].as_str().unwrap_or_default().to_owned()
}

fn header_of<'r>(response: &'r Response<Body>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

impl World {
    /// `POST /jobs` from `principal`, as API Gateway passes it.
    async fn post(&self, principal: &str, body: &Value, key: Option<&str>) -> Response<Body> {
        let mut request =
            ApiRequest::new("POST", "/jobs", principal).route("POST /jobs").json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        handle(&self.deps, request.build()).await
    }

    /// `POST /jobs/{id}/retry` from `principal`, with the path's id as sent.
    async fn retry(&self, principal: &str, id: &str, body: Option<Value>) -> Response<Body> {
        let mut request = ApiRequest::new("POST", &format!("/jobs/{id}/retry"), principal)
            .route("POST /jobs/{id}/retry")
            .param("id", id);
        if let Some(body) = body {
            request = request.json(&body);
        }
        handle(&self.deps, request.build()).await
    }

    /// Submits `body` and answers the new job's id (asserting the 202).
    async fn submitted(&self, principal: &str, body: &Value, key: Option<&str>) -> JobId {
        let response = self.post(principal, body, key).await;
        assert_eq!(response.status(), 202, "{}", json_of(&response));
        json_of(&response)["job_id"].as_str().unwrap().parse().unwrap()
    }

    async fn record(&self, job_id: &JobId) -> JobRecord {
        self.jobs.job(job_id).await.unwrap().expect("the job is written")
    }

    /// Sets the job's status as it stands (what its run did meanwhile).
    async fn set_status(&self, job_id: &JobId, status: JobStatus) {
        let record = self.record(job_id).await;
        self.jobs.put_record(JobRecord { status, ..record });
    }

    /// The ids of `owner`'s jobs, newest first.
    async fn jobs_of(&self, owner: &Owner) -> Vec<JobId> {
        let (page, _) = self.jobs.list(owner, &ListFilter::default(), 100, None).await.unwrap();
        page.into_iter().map(|entry| entry.job_id).collect()
    }

    /// The jobs enqueued: id, delay, owner.
    fn enqueued(&self) -> Vec<(JobId, u32, Owner)> {
        self.queue.sent().into_iter().map(|(m, delay, owner)| (m.job_id, delay, owner)).collect()
    }

    /// The jobs whose runs were invoked (started at once), in order.
    fn invoked(&self) -> Vec<JobId> {
        let runs = self.invocations.queued().into_iter();
        runs.map(|(_, run)| run["job_id"].as_str().unwrap().parse().unwrap()).collect()
    }

    async fn key(&self, owner: &Owner, key: &str) -> Option<IdempotencyRecord> {
        self.jobs.idempotency(owner, key).await.unwrap()
    }

    /// Leaves the job a checkpoint of its `work` stage, 7 items in: what a retry resumes from.
    fn checkpointed(&self, id: &JobId) {
        self.jobs.put_progress(
            id,
            ProgressRecord {
                stage: "work".into(),
                items_done: 7,
                checkpoint_key: Some(format!("checkpoints/{id}/1")),
                ..Default::default()
            },
        )
    }

    /// The jobs that have a progress record, in order.
    fn with_progress(&self) -> Vec<JobId> {
        let mut ids = self.jobs.progress_ids();
        ids.sort();
        ids
    }
}

#[tokio::test]
async fn a_new_job_is_accepted_written_once_and_enqueued() {
    let w = world();
    let response = w.post("alice", &demo(), None).await;
    assert_eq!(response.status(), 202);
    let body = json_of(&response);
    let id = body["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let location = format!("/jobs/{id}");
    assert_eq!(header_of(&response, "location"), Some(location.as_str()));
    assert_eq!(header_of(&response, "retry-after"), Some("2"));
    assert_eq!(header_of(&response, "cache-control"), Some("no-store"));
    assert!(response.headers().get(IDEMPOTENT_REPLAYED).is_none());
    assert_eq!(
        (body["status"].as_str(), body["status_url"].as_str()),
        (Some("pending"), Some(location.as_str()))
    );

    let job = w.record(&id).await;
    assert_eq!((job.owner.as_str(), job.job_type.as_str()), ("alice", "demo"));
    assert_eq!(
        (job.status, job.attempt, job.params.clone()),
        (JobStatus::Pending, 0, json!({"items": 1}))
    );
    assert_eq!(
        job.policy,
        Some(stored_policy(w.deps.registry.get("demo").unwrap(), &Default::default()))
    );
    assert!(job.not_before.is_none() && job.retry_of.is_none() && job.callback_url.is_none());
    assert_eq!(w.jobs_of(&owner("alice")).await, [id.as_str()], "written once");
    assert_eq!(w.enqueued(), [(id.clone(), 0, owner("alice"))], "enqueued at once");
    // The message carries the job as written (the dispatcher need not read it), without its
    // params, callback URL or idempotency key.
    let (message, _, _) = w.queue.sent().pop().unwrap();
    let snapshot = *message.job.expect("the job as written");
    assert_eq!(snapshot.params, Value::Null);
    assert!(snapshot.callback_url.is_none() && snapshot.idempotency_key.is_empty());
    assert_eq!(
        JobRecord {
            params: job.params.clone(),
            idempotency_key: job.idempotency_key.clone(),
            ..snapshot
        },
        job
    );
    let key =
        w.key(&owner("alice"), &job.idempotency_key).await.expect("its derived key is claimed");
    assert_eq!(key.job_id, id);
}

#[tokio::test]
async fn a_delayed_start_is_enqueued_with_its_delay_or_left_to_the_reaper() {
    let w = world();
    let soon = w
        .submitted(
            "alice",
            &json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 120}),
            None,
        )
        .await;
    let job = w.record(&soon).await;
    let start = job.not_before.expect("its start is stored").as_datetime();
    let ahead = (start - chrono::Utc::now()).num_seconds();
    assert!((110..=120).contains(&ahead), "{ahead}");
    let sent = w.enqueued();
    assert_eq!((sent[0].0.as_str(), sent[0].2.as_str()), (soon.as_str(), "alice"));
    assert!((110..=120).contains(&sent[0].1), "delayed by {}", sent[0].1);

    // Beyond what SQS can hold (15 minutes): not enqueued now; the reaper enqueues it when due.
    let later = w
        .submitted(
            "alice",
            &json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 3600}),
            None,
        )
        .await;
    assert!(w.record(&later).await.not_before.is_some());
    assert_eq!(w.enqueued().len(), 1, "only the first");
}

#[tokio::test]
async fn a_replay_answers_200_with_the_same_job_and_counts_nothing() {
    // One submission a minute: a replay that were charged would be refused.
    let w = world_limited(1, 10_000);
    let first = w.post("alice", &demo(), Some("order-42")).await;
    assert_eq!(first.status(), 202);
    let id = json_of(&first)["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    for _ in 0..2 {
        let again = w.post("alice", &demo(), Some("order-42")).await;
        assert_eq!(again.status(), 200);
        assert_eq!(header_of(&again, "idempotent-replayed"), Some("true"));
        assert_eq!(json_of(&again)["job_id"], id.as_str());
        assert_eq!(header_of(&again, "location"), Some(format!("/jobs/{id}").as_str()));
    }
    assert_eq!(w.jobs_of(&owner("alice")).await, [id.as_str()]);
    assert_eq!(w.enqueued().len(), 1, "enqueued once");
    // The same request without a key is replayed by its derived key (another tenant's is not).
    let unkeyed = world();
    let id = unkeyed.submitted("alice", &demo(), None).await;
    let again = unkeyed.post("alice", &demo(), None).await;
    assert_eq!(
        (again.status().as_u16(), json_of(&again)["job_id"].as_str()),
        (200, Some(id.as_str()))
    );
    let bobs = unkeyed.submitted("bob", &demo(), None).await;
    assert_ne!(bobs, id);
}

#[tokio::test]
async fn the_same_key_for_another_request_is_422_and_changes_nothing() {
    let w = world();
    let id = w.submitted("alice", &demo(), Some("order-42")).await;
    let other = json!({"type": "demo", "params": {"items": 2}});
    let response = w.post("alice", &other, Some("order-42")).await;
    assert_eq!(response.status(), 422);
    assert_eq!(problem_type(&response), "/problems/idempotency-key-reused");
    assert_eq!(w.jobs_of(&owner("alice")).await, [id.as_str()]);
    assert_eq!(
        w.key(&owner("alice"), "order-42").await.unwrap().job_id,
        id,
        "the key names the first"
    );
    assert_eq!(w.enqueued().len(), 1);
}

#[tokio::test]
async fn a_key_claimed_by_a_request_still_in_flight_is_409_and_one_left_behind_is_finished() {
    let w = world();
    let fingerprint = submission_fingerprint("demo", &json!({"items": 1}), None);
    let claim = |job_id: &JobId, created_at: chrono::DateTime<chrono::Utc>| IdempotencyRecord {
        job_id: job_id.clone(),
        fingerprint: fingerprint.clone(),
        created_at: Timestamp::from(created_at),
        expires_at: chrono::Utc::now().timestamp() + 3600,
    };
    let young = JobId::new();
    w.jobs
        .claim_key(&owner("alice"), "young", &claim(&young, chrono::Utc::now()), None)
        .await
        .unwrap();
    let response = w.post("alice", &demo(), Some("young")).await;
    assert_eq!(response.status(), 409);
    assert_eq!(problem_type(&response), "/problems/request-in-flight");
    assert_eq!(header_of(&response, "retry-after"), Some("1"));
    assert!(w.jobs_of(&owner("alice")).await.is_empty());
    assert!(w.enqueued().is_empty());

    // A claim older than the window whose job was never written: this request finishes it,
    // under the recorded id and creation time.
    let claimed_at = chrono::Utc::now() - chrono::Duration::seconds(60);
    let old = JobId::new();
    w.jobs.claim_key(&owner("alice"), "old", &claim(&old, claimed_at), None).await.unwrap();
    let response = w.post("alice", &demo(), Some("old")).await;
    assert_eq!(response.status(), 202);
    assert_eq!(json_of(&response)["job_id"], old.as_str());
    let job = w.record(&old).await;
    assert_eq!(job.created_at.to_rfc3339(), Timestamp::from(claimed_at).to_rfc3339());
    assert_eq!(w.enqueued(), [(old.clone(), 0, owner("alice"))]);
}

#[tokio::test]
async fn a_claim_left_behind_is_finished_only_within_the_tenants_limits() {
    // One submission a minute, one job not yet running: alice's first job uses both.
    let w = world_limited(1, 1);
    assert_eq!(w.post("alice", &demo(), None).await.status(), 202);
    let fingerprint = submission_fingerprint("demo", &json!({"items": 1}), None);
    let left = JobId::new();
    let claim = IdempotencyRecord {
        job_id: left.clone(),
        fingerprint,
        created_at: Timestamp::from(chrono::Utc::now() - chrono::Duration::seconds(60)),
        expires_at: chrono::Utc::now().timestamp() + 3600,
    };
    w.jobs.claim_key(&owner("alice"), "left", &claim, None).await.unwrap();
    let response = w.post("alice", &demo(), Some("left")).await;
    assert_eq!(response.status(), 429, "a full backlog refuses it as it refuses a new job");
    assert!(w.jobs.job(&left).await.unwrap().is_none(), "nothing written");
    assert_eq!(w.key(&owner("alice"), "left").await.unwrap().job_id, left, "the claim stays");
}

#[tokio::test]
async fn a_job_and_its_key_are_stamped_with_the_clocks_time() {
    let w = world();
    // Not the machine's time: what the handler stamps is its clock's.
    let now: Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(now.as_datetime());
    let id = w.submitted("alice", &demo(), Some("order-42")).await;
    let job = w.record(&id).await;
    assert_eq!((job.created_at, job.updated_at), (now, now));
    assert_eq!(job.transitions[0].at, now, "submitted then");
    let key = w.key(&owner("alice"), "order-42").await.unwrap();
    assert_eq!(key.created_at, now);
    assert_eq!(key.expires_at, now.as_datetime().timestamp() + 86_400, "a day after, by the clock");
}

#[tokio::test]
async fn a_claim_is_in_flight_until_the_clock_passes_its_window() {
    let w = world();
    // A claim made at the clock's time, ahead of the machine's: only the handler's clock, moved
    // by the test, takes it out of the window.
    let claimed_at = w.clock.now() + chrono::Duration::hours(1);
    w.clock.set(claimed_at);
    let left = JobId::new();
    let claim = IdempotencyRecord {
        job_id: left.clone(),
        fingerprint: submission_fingerprint("demo", &json!({"items": 1}), None),
        created_at: Timestamp::from(claimed_at),
        expires_at: claimed_at.timestamp() + 3600,
    };
    w.jobs.claim_key(&owner("alice"), "left", &claim, None).await.unwrap();
    w.clock.advance(IN_FLIGHT_WINDOW - std::time::Duration::from_millis(1));
    assert_eq!(w.post("alice", &demo(), Some("left")).await.status(), 409);
    w.clock.advance(std::time::Duration::from_millis(1));
    let response = w.post("alice", &demo(), Some("left")).await;
    assert_eq!(response.status(), 202, "left behind: this request finishes it");
    assert_eq!(json_of(&response)["job_id"], left.as_str());
}

#[tokio::test]
async fn a_failed_or_cancelled_jobs_key_is_taken_by_a_new_job() {
    let w = world();
    for ended in [JobStatus::Failed, JobStatus::Cancelled] {
        let first = w.submitted("alice", &demo(), Some("order-42")).await;
        w.set_status(&first, ended).await;
        let second = w.submitted("alice", &demo(), Some("order-42")).await;
        assert_ne!(first, second, "{ended:?}");
        assert_eq!(w.key(&owner("alice"), "order-42").await.unwrap().job_id, second);
        w.set_status(&second, ended).await;
    }
    assert_eq!(w.enqueued().len(), 4);
}

#[tokio::test]
async fn a_failed_job_is_retried_as_a_new_job_linked_to_it_once() {
    let w = world();
    let failed = w
        .submitted(
            "alice",
            &json!({"type": "demo", "params": {"items": 3}, "priority": "high"}),
            None,
        )
        .await;
    w.set_status(&failed, JobStatus::Failed).await;
    let response = w.retry("alice", &failed, None).await;
    assert_eq!(response.status(), 202);
    let body = json_of(&response);
    assert_eq!(body["retry_of"], failed.as_str());
    let retried = body["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let job = w.record(&retried).await;
    assert_eq!(job.retry_of.as_deref(), Some(failed.as_str()));
    assert_eq!((job.params.clone(), job.priority.as_str()), (json!({"items": 3}), "high"));
    assert_eq!(job.idempotency_key, retry_idempotency_key(&failed));
    assert!(job.resumed_from.is_none(), "it left no checkpoint: from the start");
    assert_eq!(w.enqueued().last().unwrap().0, retried);

    let again = w.retry("alice", &failed, None).await;
    assert_eq!(again.status(), 200, "the same retry, replayed");
    assert_eq!(header_of(&again, "idempotent-replayed"), Some("true"));
    assert_eq!(json_of(&again)["job_id"], retried.as_str());
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 2);
}

#[tokio::test]
async fn a_retry_resumes_from_the_checkpoint_unless_asked_to_start_over() {
    let w = world();
    let first = w.submitted("alice", &demo(), Some("a")).await;
    w.set_status(&first, JobStatus::Cancelled).await;
    w.checkpointed(&first);
    let resumed = json_of(&w.retry("alice", &first, None).await)["job_id"]
        .as_str()
        .unwrap()
        .parse::<JobId>()
        .unwrap();
    let job = w.record(&resumed).await;
    let from = job.resumed_from.expect("resumed");
    assert_eq!((from.job_id.as_str(), from.items_done), (first.as_str(), 7));
    let seeded = w.jobs.progress(&resumed).expect("its progress is seeded");
    assert_eq!(seeded.checkpoint_key, Some(format!("checkpoints/{first}/1")));

    let second = w.submitted("alice", &demo(), Some("b")).await;
    w.set_status(&second, JobStatus::Failed).await;
    w.checkpointed(&second);
    let response = w.retry("alice", &second, Some(json!({"from": "start"}))).await;
    let fresh = json_of(&response)["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert!(w.record(&fresh).await.resumed_from.is_none());
    assert!(w.jobs.progress(&fresh).is_none());
}

/// A job that compensated had what its stages did undone: its retry starts over, never from
/// its checkpoint (which would skip the undone stages).
#[tokio::test]
async fn a_retry_of_a_job_that_compensated_starts_over() {
    use longhaul_domain::compensation::{Compensation, Ending};
    let w = world();
    let first = w.submitted("alice", &demo(), Some("a")).await;
    w.set_status(&first, JobStatus::Failed).await;
    w.checkpointed(&first);
    let mut job = w.record(&first).await;
    let ending = Ending { status: JobStatus::Failed, reason: "boom".into(), error: None };
    job.compensation = Some(Compensation::begin(ending, Timestamp::now()));
    w.jobs.put_record(job);
    let response = w.retry("alice", &first, None).await;
    let fresh = json_of(&response)["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert!(w.record(&fresh).await.resumed_from.is_none(), "from the start");
    assert!(w.jobs.progress(&fresh).is_none());
}

#[tokio::test]
async fn a_retry_is_refused_for_a_job_not_ended_in_failure_and_for_others_jobs() {
    let w = world();
    let job = w.submitted("alice", &demo(), None).await;
    for status in [JobStatus::Pending, JobStatus::Running, JobStatus::Succeeded] {
        w.set_status(&job, status).await;
        let response = w.retry("alice", &job, None).await;
        assert_eq!(response.status(), 409, "{status:?}");
        assert_eq!(json_of(&response)["status_now"], status.to_string());
    }
    w.set_status(&job, JobStatus::Failed).await;
    for (who, target) in
        [("mallory", job.as_str()), ("alice", "01J00000000000000000000000"), ("alice", "nope")]
    {
        let response = w.retry(who, target, None).await;
        assert_eq!(response.status(), 404, "{who} {target}");
    }
    let response = w.retry("alice", &job, Some(json!({"from": "the middle"}))).await;
    assert_eq!(response.status(), 400);
    assert_eq!(problem_type(&response), "/problems/bad-request");
    assert_eq!(w.jobs_of(&owner("alice")).await, [job.as_str()], "no retry written");
    assert!(w.key(&owner("alice"), &retry_idempotency_key(&job)).await.is_none(), "no key claimed");
    assert!(w.jobs_of(&owner("mallory")).await.is_empty());
    assert_eq!(w.enqueued().len(), 1);
}

#[tokio::test]
async fn a_retry_of_a_kind_switched_off_since_is_422_and_writes_nothing() {
    let mut w = world();
    let failed = w.submitted("alice", &demo(), None).await;
    w.set_status(&failed, JobStatus::Failed).await;
    w.deps.registry = longhaul_jobs::registry().enabled(&["csv_report".into()]);
    let response = w.retry("alice", &failed, None).await;
    assert_eq!(response.status(), 422);
    assert_eq!(problem_type(&response), "/problems/unknown-job-type");
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 1);
    assert!(w.key(&owner("alice"), &retry_idempotency_key(&failed)).await.is_none());
}

#[tokio::test]
async fn the_rate_limit_refuses_with_retry_after_and_writes_nothing() {
    let w = world_limited(1, 10_000);
    let id = w.submitted("alice", &demo(), None).await;
    let other = json!({"type": "demo", "params": {"items": 2}});
    let response = w.post("alice", &other, Some("second")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(problem_type(&response), "/problems/rate-limited");
    let retry_after: u64 = header_of(&response, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(w.jobs_of(&owner("alice")).await, [id]);
    assert!(w.key(&owner("alice"), "second").await.is_none(), "its key is given back");
    assert_eq!(w.enqueued().len(), 1);
    // A retry is a submission too.
    let failed = w.jobs_of(&owner("alice")).await.remove(0);
    w.set_status(&failed, JobStatus::Failed).await;
    assert_eq!(w.retry("alice", &failed, None).await.status(), 429);
    assert!(w.key(&owner("alice"), &retry_idempotency_key(&failed)).await.is_none());
    // Another tenant has its own.
    assert_eq!(w.post("bob", &other, None).await.status(), 202);
}

#[tokio::test]
async fn a_full_backlog_refuses_with_backlog_full_before_charging_the_rate() {
    let w = world_limited(2, 1);
    let first = w.submitted("alice", &demo(), None).await;
    let other = json!({"type": "demo", "params": {"items": 2}});
    let response = w.post("alice", &other, Some("second")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(problem_type(&response), "/problems/backlog-full");
    assert_eq!(header_of(&response, "retry-after"), Some("60"));
    assert_eq!(json_of(&response)["max_pending"], 1);
    assert_eq!(w.jobs_of(&owner("alice")).await, [first.as_str()]);
    assert!(w.key(&owner("alice"), "second").await.is_none());
    assert_eq!(w.enqueued().len(), 1);
    // Once the first runs there is room; the refusal was not charged (two a minute).
    w.set_status(&first, JobStatus::Running).await;
    assert_eq!(w.post("alice", &other, Some("second")).await.status(), 202);
}

#[tokio::test]
async fn every_bad_input_is_a_problem_that_changes_nothing() {
    let w = world();
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut body = demo();
        edit(&mut body);
        body
    };
    let someone_elses = format!("{}0123/in.csv", owner_prefix(&owner("mallory")));
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("unknown field", with(&|b| b["bogus"] = json!(1)), 400, "bad-request"),
        ("unknown type", json!({"type": "nope"}), 422, "unknown-job-type"),
        ("disabled type", json!({"type": "archive", "params": {}}), 422, "unknown-job-type"),
        ("params refused", json!({"type": "demo", "params": {"items": 0}}), 422, "invalid-params"),
        (
            "params of the wrong shape",
            json!({"type": "demo", "params": {"items": "many"}}),
            422,
            "invalid-params",
        ),
        (
            "someone else's upload",
            json!({"type": "csv_report", "params": {"input": someone_elses, "metrics": [{"op": "count"}]}}),
            404,
            "upload-not-found",
        ),
        (
            "callback not https",
            with(&|b| b["callback_url"] = json!("http://203.0.113.7/hook")),
            422,
            "invalid-callback-url",
        ),
        (
            "callback to a private address",
            with(&|b| b["callback_url"] = json!("https://10.0.0.1/hook")),
            422,
            "invalid-callback-url",
        ),
        (
            "callback not a URL",
            with(&|b| b["callback_url"] = json!("not a url")),
            422,
            "invalid-callback-url",
        ),
        ("unknown priority", with(&|b| b["priority"] = json!("urgent")), 422, "invalid-priority"),
        ("priority not a name", with(&|b| b["priority"] = json!(1)), 422, "invalid-priority"),
        ("negative delay", with(&|b| b["delay_seconds"] = json!(-5)), 422, "invalid-start"),
        (
            "delay and start both",
            with(&|b| {
                b["delay_seconds"] = json!(5);
                b["not_before"] = json!("2030-01-01T00:00:00Z")
            }),
            422,
            "invalid-start",
        ),
        ("start not a time", with(&|b| b["not_before"] = json!("tomorrow")), 422, "invalid-start"),
    ];
    for (what, body, status, slug) in cases {
        let response = w.post("alice", &body, Some("k")).await;
        assert_eq!(response.status(), status, "{what}: {}", json_of(&response));
        assert_eq!(problem_type(&response), format!("/problems/{slug}"), "{what}");
    }
    let request = |build: &dyn Fn(ApiRequest) -> ApiRequest| {
        build(ApiRequest::new("POST", "/jobs", "alice").route("POST /jobs")).build()
    };
    let raw: Vec<(&str, Request, u16)> = vec![
        (
            "not JSON",
            request(&|r| r.header("content-type", "application/json").raw_body(b"{")),
            400,
        ),
        (
            "not a JSON body",
            request(&|r| r.header("content-type", "text/plain").raw_body(b"{}")),
            415,
        ),
        (
            "too large",
            request(&|r| {
                r.json(&json!({"type": "demo", "params": {"pad": "x".repeat(MAX_BODY_BYTES)}}))
            }),
            413,
        ),
        (
            "a key too long",
            request(&|r| r.json(&demo()).header("idempotency-key", &"k".repeat(MAX_KEY_LEN + 1))),
            400,
        ),
        (
            "a key with spaces",
            request(&|r| r.json(&demo()).header("idempotency-key", "a key")),
            400,
        ),
        (
            "a key a schedule's tick could hold",
            request(&|r| {
                r.json(&demo()).header(
                    "idempotency-key",
                    "schedule:0193a1b2-0000-7000-8000-000000000000:2099-03-02T09:00:00.000Z",
                )
            }),
            400,
        ),
        ("no principal", request(&|r| r.json(&demo()).anonymous()), 401),
    ];
    for (what, request, status) in raw {
        let response = handle(&w.deps, request).await;
        assert_eq!(response.status(), status, "{what}: {}", json_of(&response));
        problem_type(&response);
    }
    assert!(w.jobs_of(&owner("alice")).await.is_empty(), "no job");
    assert!(w.key(&owner("alice"), "k").await.is_none(), "no key left claimed");
    assert!(w.enqueued().is_empty(), "nothing enqueued");
}

#[tokio::test]
async fn a_failing_table_is_a_500_that_names_nothing_and_writes_nothing() {
    let w = world();
    w.jobs.set_unavailable(true);
    let response = w.post("alice", &demo(), Some("k")).await;
    assert_eq!(response.status(), 500);
    assert_eq!(problem_type(&response), "/problems/internal");
    assert!(!json_of(&response).to_string().contains("unavailable"), "nothing inside is named");
    w.jobs.set_unavailable(false);
    assert!(w.jobs_of(&owner("alice")).await.is_empty());
    assert!(w.key(&owner("alice"), "k").await.is_none());
    assert!(w.enqueued().is_empty());
    assert_eq!(w.post("alice", &demo(), Some("k")).await.status(), 202, "the retry goes through");
}

#[tokio::test]
async fn a_failing_rate_limiter_is_a_500_that_gives_its_key_back() {
    let w = world();
    w.limits.set_unavailable(true);
    let response = w.post("alice", &demo(), Some("k")).await;
    assert_eq!(response.status(), 500);
    assert!(w.jobs_of(&owner("alice")).await.is_empty());
    assert!(w.key(&owner("alice"), "k").await.is_none());
    assert!(w.enqueued().is_empty());
    w.limits.set_unavailable(false);
    assert_eq!(w.post("alice", &demo(), Some("k")).await.status(), 202);
}

#[tokio::test]
async fn a_failed_enqueue_still_accepts_the_job_and_leaves_it_pending_for_the_reaper() {
    let w = world();
    w.queue.set_unavailable(true);
    let response = w.post("alice", &demo(), Some("k")).await;
    assert_eq!(response.status(), 202, "the job is durable: the answer is settled");
    let id = json_of(&response)["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert!(w.enqueued().is_empty());
    // What the reaper's pending sweep finds it by: pending, never dispatched, in the backlog.
    let job = w.record(&id).await;
    assert_eq!((job.status, job.dispatches, job.enqueues), (JobStatus::Pending, 0, 0));
    let pending =
        ListFilter { status: Some(JobStatus::Pending), job_type: None, schedule_id: None };
    let (listed, _) = w.jobs.list(&owner("alice"), &pending, 10, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(w.jobs.backlog(&owner("alice"), 10).await.unwrap(), 1);
    // A replay answers with it, and enqueues nothing either.
    w.queue.set_unavailable(false);
    let again = w.post("alice", &demo(), Some("k")).await;
    assert_eq!(
        (again.status().as_u16(), json_of(&again)["job_id"].as_str()),
        (200, Some(id.as_str()))
    );
    assert!(w.enqueued().is_empty());
}

#[tokio::test]
async fn an_upload_of_ones_own_that_is_not_there_is_404_like_anyone_elses() {
    let w = world();
    let own = format!("{}0123/in.csv", owner_prefix(&owner("alice")));
    let body =
        json!({"type": "csv_report", "params": {"input": own, "metrics": [{"op": "count"}]}});
    let response = w.post("alice", &body, Some("k1")).await;
    assert_eq!(response.status(), 404, "named but never uploaded");
    assert_eq!(problem_type(&response), "/problems/upload-not-found");
    assert!(w.jobs_of(&owner("alice")).await.is_empty(), "nothing written");
    assert!(w.key(&owner("alice"), "k1").await.is_none(), "no key claimed");
    assert!(w.enqueued().is_empty());

    // Once the file is there, the same request is accepted.
    w.uploads.insert(&own, b"a,b\n1,2\n", "text/csv");
    assert_eq!(w.post("alice", &body, Some("k1")).await.status(), 202);
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 1);

    // A bucket that cannot answer is a 500 naming nothing, and nothing is written.
    w.uploads.set_unavailable(true);
    let response = w.post("alice", &body, Some("k2")).await;
    assert_eq!(response.status(), 500);
    let text = String::from_utf8_lossy(response.body().as_ref()).to_string();
    assert!(!text.contains("unavailable") && !text.contains("upload"), "{text}");
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 1);
}

#[tokio::test]
async fn each_distinct_upload_is_checked_once_however_often_it_is_named() {
    let w = world();
    let prefix = owner_prefix(&owner("alice"));
    let uploads: Vec<String> = (0..40).map(|i| format!("{prefix}{i:04}/in.csv")).collect();
    for upload in &uploads {
        w.uploads.insert(upload, b"a\n1\n", "text/csv");
    }
    // A thousand names of forty uploads: forty HEADs.
    let named: Vec<String> = uploads.iter().cycle().take(1_000).cloned().collect();
    crate::submission::uploads_present(&w.deps, &named).await.expect("all there");
    assert_eq!(w.uploads.heads(), 40);
    // One missing among them is the 404.
    let mut with_missing = named.clone();
    with_missing.push(format!("{prefix}9999/gone.csv"));
    let refused = crate::submission::uploads_present(&w.deps, &with_missing).await.unwrap_err();
    assert_eq!(refused.into_response().status(), 404);
}

#[tokio::test]
async fn a_replay_checks_no_upload_and_answers_as_the_original_after_it_is_deleted() {
    use longhaul_aws::ports::ObjectCleanup;
    let w = world();
    let own = format!("{}0123/in.csv", owner_prefix(&owner("alice")));
    w.uploads.insert(&own, b"a,b\n1,2\n", "text/csv");
    let body =
        json!({"type": "csv_report", "params": {"input": own, "metrics": [{"op": "count"}]}});
    let id = w.submitted("alice", &body, Some("k")).await;
    assert_eq!(w.uploads.heads(), 1, "the request that creates the job checks its upload");
    let again = w.post("alice", &body, Some("k")).await;
    assert_eq!(
        (again.status().as_u16(), json_of(&again)["job_id"].as_str()),
        (200, Some(id.as_str()))
    );
    assert_eq!(w.uploads.heads(), 1, "a replay makes no HEAD");

    // The owner deletes the input once the job has read it: a replay still answers with the
    // job, as the original request did — not 404 — and asks nothing of the bucket.
    w.uploads.delete_prefix(&own).await.unwrap();
    let replay = w.post("alice", &body, Some("k")).await;
    assert_eq!(replay.status(), 200, "{}", json_of(&replay));
    assert_eq!(header_of(&replay, "idempotent-replayed"), Some("true"));
    assert_eq!(json_of(&replay)["job_id"], id.as_str());
    assert_eq!(w.uploads.heads(), 1, "no HEAD");
    // A new request for it is checked, refused, and gives its key back.
    let other = w.post("alice", &body, Some("k2")).await;
    assert_eq!(other.status(), 404);
    assert_eq!(problem_type(&other), "/problems/upload-not-found");
    assert_eq!(w.uploads.heads(), 2);
    assert!(w.key(&owner("alice"), "k2").await.is_none(), "its key is given back");
    assert_eq!(w.jobs_of(&owner("alice")).await, [id.as_str()]);
    assert_eq!(w.enqueued().len(), 1);
}

#[tokio::test]
async fn a_refused_or_replayed_resuming_retry_seeds_no_progress() {
    // Two submissions a minute: the original and its first retry.
    let w = world_limited(2, 10_000);
    let first = w.submitted("alice", &demo(), Some("a")).await;
    w.set_status(&first, JobStatus::Failed).await;
    w.checkpointed(&first);
    let retried = w.retry("alice", &first, None).await;
    assert_eq!(retried.status(), 202);
    let retried = json_of(&retried)["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert!(w.jobs.progress(&retried).is_some(), "the retry resumes from the checkpoint");
    let mut expected = vec![first.clone(), retried.clone()];
    expected.sort();
    assert_eq!(w.with_progress(), expected);

    // Replayed: answered with the retry, and no progress seeded for a job never written.
    let again = w.retry("alice", &first, None).await;
    assert_eq!(again.status(), 200);
    assert_eq!(json_of(&again)["job_id"], retried.as_str());
    assert_eq!(w.with_progress(), expected, "a replay seeds nothing");

    // Refused (the minute's submissions are used): it seeds nothing either.
    w.set_status(&retried, JobStatus::Failed).await;
    w.checkpointed(&retried);
    let refused = w.retry("alice", &retried, None).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(w.with_progress(), expected, "a refused retry seeds nothing");
}

#[tokio::test]
async fn a_delayed_start_counts_from_the_handlers_clock_to_the_second() {
    use chrono::TimeZone;
    let w = world();
    // Not the machine's time: what the handler decides by is its clock.
    let now = chrono::Utc.with_ymd_and_hms(2030, 1, 1, 12, 0, 0).unwrap();
    w.clock.set(now);
    let at =
        |seconds: i64| longhaul_domain::format_rfc3339(now + chrono::Duration::seconds(seconds));
    let start = |extra: Value| {
        let mut body = json!({"type": "demo", "params": {"items": 1}});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let cases = [
        ("a delay", start(json!({"delay_seconds": 120})), Some(120), Some(120)),
        ("a start within SQS's reach", start(json!({"not_before": at(900)})), Some(900), Some(900)),
        ("a start beyond it: the reaper's", start(json!({"not_before": at(901)})), Some(901), None),
        ("a start just past: at once", start(json!({"not_before": at(-60)})), None, Some(0)),
    ];
    for (what, body, ahead, delay) in cases {
        let sent = w.enqueued().len();
        let id = w.submitted("alice", &body, None).await;
        let stored = w.record(&id).await.not_before.map(|at| at.as_datetime());
        assert_eq!(stored, ahead.map(|s| now + chrono::Duration::seconds(s)), "{what}");
        let enqueued = w.enqueued();
        match delay {
            Some(delay) => assert_eq!(enqueued[sent..], [(id, delay, owner("alice"))], "{what}"),
            None => assert_eq!(enqueued.len(), sent, "{what}: not enqueued now"),
        }
    }
    let past = w.post("alice", &start(json!({"not_before": at(-61)})), None).await;
    assert_eq!(past.status(), 422, "further in the past than the tolerance");
    assert_eq!(problem_type(&past), "/problems/invalid-start");
    // Ten minutes later by the clock, a start ten minutes after `now` is due: at once.
    w.clock.advance(std::time::Duration::from_secs(600));
    let due = w.submitted("alice", &start(json!({"not_before": at(600)})), None).await;
    assert_eq!(w.record(&due).await.not_before, None);
    assert_eq!(w.enqueued().last(), Some(&(due, 0, owner("alice"))));
}

#[tokio::test]
async fn a_job_is_started_in_the_request_that_writes_it_without_a_message() {
    let w = world_starting(50);
    let id = w.submitted("alice", &demo(), None).await;
    let job = w.record(&id).await;
    assert_eq!((job.status, job.dispatches), (JobStatus::Queued, 1), "written queued");
    assert_eq!(job.execution.as_deref(), Some(id.as_str()), "its first run's name");
    let log: Vec<_> = job.transitions.iter().map(|t| (t.state, t.reason.as_str())).collect();
    assert_eq!(log, [(JobStatus::Pending, "submitted"), (JobStatus::Queued, "dispatched")]);
    let queued = ListFilter { status: Some(JobStatus::Queued), job_type: None, schedule_id: None };
    let (listed, _) = w.jobs.list(&owner("alice"), &queued, 10, None).await.unwrap();
    assert_eq!(listed.len(), 1, "listed as queued");
    assert_eq!(w.invoked(), std::slice::from_ref(&id), "its run invoked");
    assert_eq!(w.invocations.queued()[0].0, STAGE_ARN, "in its worker function");
    assert_eq!(
        w.slots.holders(&Pool::Tenant(owner("alice"))).await.unwrap(),
        std::slice::from_ref(&id)
    );
    assert!(w.enqueued().is_empty(), "no message");
    // A replay starts nothing again.
    assert_eq!(w.post("alice", &demo(), None).await.status(), 200);
    assert_eq!(w.invoked(), [id]);
    assert!(w.enqueued().is_empty());
}

#[tokio::test]
async fn a_delayed_job_is_enqueued_and_one_over_the_tenants_limit_waits() {
    let w = world_starting(1);
    let delayed = json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 120});
    let later = w.submitted("alice", &delayed, None).await;
    assert_eq!(w.record(&later).await.status, JobStatus::Pending);
    assert_eq!(w.enqueued().iter().map(|m| &m.0).collect::<Vec<_>>(), [&later]);
    assert!(w.invoked().is_empty(), "not started before its time");

    let first = w.submitted("alice", &demo(), None).await;
    let second = w.submitted("alice", &json!({"type": "demo", "params": {"items": 2}}), None).await;
    assert_eq!(w.invoked(), [first], "one at a time");
    let waiting = w.record(&second).await;
    assert_eq!(waiting.status, JobStatus::Pending);
    assert!(waiting.waiting.is_some(), "marked waiting");
    let pool = Pool::Tenant(owner("alice"));
    let list = w.slots.first_waiting(&pool, &owner("alice"), 10).await.unwrap();
    assert_eq!(list.iter().map(|e| &e.job_id).collect::<Vec<_>>(), [&second], "in its list");
    assert_eq!(w.enqueued().len(), 1, "no message: a freed slot wakes it");
}

#[tokio::test]
async fn a_start_that_fails_part_way_is_handed_to_the_intake_queue() {
    // The slots are unavailable: the job stays pending, and its message carries it on. (No
    // rate limit: with tenant pools, submissions are counted on their items, down too.)
    let w = starting(world_limited(0, 10_000), 50);
    w.slots.set_unavailable(true);
    let id = w.submitted("alice", &demo(), None).await;
    assert_eq!(w.record(&id).await.status, JobStatus::Pending);
    assert!(w.invoked().is_empty());
    assert_eq!(w.enqueued(), [(id.clone(), 0, owner("alice"))]);
    // Its worker cannot be invoked: the job is queued by then, and its message finishes the
    // start (the dispatcher invokes the run of the job as it stands).
    let w = world_starting(50);
    w.invocations.set_unavailable(true);
    let id = w.submitted("alice", &demo(), None).await;
    assert_eq!(w.record(&id).await.status, JobStatus::Queued);
    assert_eq!(w.enqueued(), [(id, 0, owner("alice"))]);
}

#[tokio::test]
async fn a_job_that_takes_its_slot_is_not_held_to_the_backlog_and_one_that_would_wait_is() {
    // One job not yet running at most; two running slots.
    let w = starting(world_limited(600, 1), 2);
    let first = w.submitted("alice", &demo(), None).await;
    let second = w.submitted("alice", &json!({"type": "demo", "params": {"items": 2}}), None).await;
    assert_eq!(w.jobs.backlog(&owner("alice"), 10).await.unwrap(), 2, "both queued, not running");
    assert_eq!(w.invoked(), [first.clone(), second.clone()], "each took a slot: both started");
    // A third would wait for a slot: it is held to the backlog, which is full.
    let third = json!({"type": "demo", "params": {"items": 3}});
    let response = w.post("alice", &third, Some("third")).await;
    assert_eq!(response.status(), 429);
    assert_eq!(problem_type(&response), "/problems/backlog-full");
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 2, "nothing written");
    assert!(w.key(&owner("alice"), "third").await.is_none(), "its key given back");
    let mut holders = w.slots.holders(&Pool::Tenant(owner("alice"))).await.unwrap();
    holders.sort();
    assert_eq!(holders, [first, second], "no slot taken for it");
}

#[tokio::test]
async fn a_submission_over_its_rate_takes_no_slot_and_writes_nothing() {
    // One submission a minute; demo jobs also hold a slot of their kind's pool (3 at once).
    let mut w = starting(world_limited(1, 10), 5);
    let names = w.deps.registry.names();
    w.deps.policy_overrides =
        PolicyOverrides::parse(r#"{"demo": {"concurrency_limit": 3}}"#, &names).unwrap();
    let first = w.submitted("alice", &demo(), None).await;
    let kind = Pool::Kind("demo".into());
    assert_eq!(w.slots.holders(&kind).await.unwrap(), std::slice::from_ref(&first));
    // The second is refused by the write that would take its tenant slot (its submission
    // counted in the same write): the kind's slot it took first is given back.
    let response = w.post("alice", &json!({"type": "demo", "params": {"items": 2}}), None).await;
    assert_eq!(response.status(), 429);
    assert_eq!(problem_type(&response), "/problems/rate-limited");
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    let only_first = std::slice::from_ref(&first);
    assert_eq!(w.slots.holders(&Pool::Tenant(owner("alice"))).await.unwrap(), only_first);
    assert_eq!(w.slots.holders(&kind).await.unwrap(), only_first, "the kind's slot given back");
    assert_eq!(w.jobs_of(&owner("alice")).await, only_first);
    assert_eq!(w.invoked(), only_first);
    // The next minute, it is accepted.
    w.clock.advance(std::time::Duration::from_secs(60));
    w.submitted("alice", &json!({"type": "demo", "params": {"items": 2}}), None).await;
}

#[tokio::test]
async fn a_submission_that_waits_is_counted_on_the_counter_its_seat_would_have_used() {
    // One running job per tenant, two submissions a minute.
    let w = starting(world_limited(2, 10), 1);
    let first = w.submitted("alice", &demo(), None).await;
    assert_eq!(w.record(&first).await.status, JobStatus::Queued, "seated, counted with its slot");
    // The pool is full: the second waits, counted on its own (the same counter).
    let second = w.submitted("alice", &json!({"type": "demo", "params": {"items": 2}}), None).await;
    assert_eq!(w.record(&second).await.status, JobStatus::Pending);
    let third = w.post("alice", &json!({"type": "demo", "params": {"items": 3}}), None).await;
    assert_eq!(third.status(), 429);
    assert_eq!(problem_type(&third), "/problems/rate-limited");
    assert_eq!(w.jobs_of(&owner("alice")).await.len(), 2, "nothing written");
    // Another tenant's counter is its own.
    w.submitted("bob", &demo(), None).await;
}

#[tokio::test]
async fn slots_taken_for_a_job_another_request_wrote_are_settled_by_how_it_stands() {
    // A request that stalled past the in-flight window finds its job written by another (the
    // same id): the slots it took are that job's.
    let w = world_starting(5);
    let pool = Pool::Tenant(owner("alice"));
    let cases = [
        (JobStatus::Pending, true, true), // dispatched with them: queued, its run invoked
        (JobStatus::Running, true, false), // its own
        (JobStatus::Cancelled, false, false), // given back
    ];
    for (status, kept, started) in cases {
        let job = job_in(status);
        w.jobs.put_record(job.clone());
        let crate::start::Seat::Seated(seated, _) = crate::start::seat(&w.deps, &job).await else {
            panic!("a free slot")
        };
        seated.settle(&w.deps, &job).await;
        let holders = w.slots.holders(&pool).await.unwrap();
        assert_eq!(holders.contains(&job.job_id), kept, "{status}: slot held");
        assert_eq!(w.invoked().contains(&job.job_id), started, "{status}: started");
        if status == JobStatus::Pending {
            assert_eq!(w.record(&job.job_id).await.status, JobStatus::Queued);
        }
    }
}
