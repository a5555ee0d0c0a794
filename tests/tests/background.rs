//! Background operations against the local stack, with thresholds shortened (a heartbeat is
//! stale after 3 s, progress stalls after 2 s (a zombie 30 s later), results live 3 s) and schedules fired on demand
//! through `POST /_local/schedules/{name}`.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::jobs::{JobRecord, JobStore, ProgressRecord, ProgressRefused, TransitionRequest};
use longhaul_domain::{JobId, JobStatus, format_rfc3339};
use longhaul_job_demo::DemoResult;
use longhaul_tests::{
    Api, Aws, Deadline, Harness, assert_counted_once, fire, harness_with, metric_points, principal,
    seeded_job,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stalled job that still heartbeats is left before it counts as a zombie.
const STALL_GRACE: Duration = Duration::from_secs(30);
/// When a worker's heartbeat is stale (the reaper then judges it dead).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", HEARTBEAT_TIMEOUT.as_secs().to_string().as_str()),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("LONGHAUL_STALL_SECONDS", "2"),
        // Long enough that a stalled job's flag is counted (and the test looks) well before
        // the grace ends and the job, re-dispatched, stalls and is flagged again.
        ("LONGHAUL_STALL_GRACE_SECONDS", STALL_GRACE.as_secs().to_string().as_str()),
        ("LONGHAUL_PENDING_GRACE_SECONDS", "2"),
        ("LONGHAUL_QUEUED_GRACE_SECONDS", "2"),
        ("LONGHAUL_RESULT_TTL_SECONDS", "3"),
        // No maximum runtime override: each job keeps its kind's (a day), so no test here
        // depends on how fast the machine runs its job; the overtime test moves its job's
        // start back instead.
        ("LONGHAUL_MAX_ATTEMPTS", "2"),
    ])
}

/// Fires `schedule` until `done(job)` holds (the thresholds are time-based: this awaits them,
/// for up to four times the longest threshold here, the stall grace).
async fn fire_until(
    api: &Api,
    job_id: &JobId,
    schedule: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    longhaul_tests::fire_until(api, job_id, schedule, what, STALL_GRACE * 4, done).await
}

async fn store() -> JobStore {
    longhaul_tests::job_store().await
}

/// The worker dies (see [`longhaul_tests::kill_worker`]).
async fn kill(job_id: &JobId) -> JobRecord {
    longhaul_tests::kill_worker(job_id).await
}

/// Whether a job ran to success: `succeeded`, or `expired` already (results here live 3 s, so
/// a poll can miss the `succeeded` in between).
fn succeeded(job: &Value) -> bool {
    job["status"] == "succeeded" || job["status"] == "expired"
}

fn reasons(job: &Value) -> Vec<String> {
    job["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| format!("{}: {}", t["state"].as_str().unwrap(), t["reason"].as_str().unwrap()))
        .collect()
}

async fn invoke_stage(payload: Value) -> Value {
    let url = format!(
        "{}/2015-03-31/functions/{}/invocations",
        stack().stack.edge_url,
        stack().stack.template.physical_name("StageFunction").unwrap()
    );
    reqwest::Client::new().post(url).json(&payload).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn a_zombie_is_redispatched_and_its_stale_worker_is_fenced_off() {
    stack();
    let api = Api::new(&principal("zombie"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 30, "item_ms": 100}})).await;
    api.wait_for(&job_id, "progress", |j| j["progress"]["items_done"].as_u64().unwrap_or(0) >= 10)
        .await;
    let old = kill(&job_id).await;
    let job = fire_until(&api, &job_id, "reaper", "re-dispatch", |j| j["attempt"] == 2).await;
    assert!(
        reasons(&job).iter().any(|r| r.starts_with("queued: no heartbeat for")),
        "{:?}",
        reasons(&job)
    );
    assert_counted_once("ZombiesReaped", &job_id).await;

    // The old worker comes back: every write of its lease is refused.
    let old_lease = json!({"attempt": 1, "token": old.lease.clone().unwrap()});
    let run = invoke_stage(json!({"op": "work", "job_id": job_id, "execution": old.execution,
        "state": {"job_id": job_id, "lease": old_lease}}))
    .await;
    assert_eq!(run["errorType"], "Job.LeaseLost", "{run}");
    let fail = invoke_stage(json!({"op": "fail", "job_id": job_id,
        "state": {"job_id": job_id, "lease": old_lease},
        "error": {"Error": "Job.Retryable", "Cause": "the old worker's last try"}}))
    .await;
    assert_eq!(fail["errorType"], "Job.LeaseLost", "{fail}");
    let stale = ProgressRecord {
        seq: u64::MAX - 1,
        lease: old.lease.clone().unwrap(),
        pct: 99.0,
        ..Default::default()
    };
    assert!(matches!(
        store().await.record_progress(&job_id, &stale).await,
        Err(ProgressRefused::LeaseLost)
    ));

    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(
        (job["status"].as_str(), job["attempt"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{job}"
    );
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(30)
    );
}

/// What the reaper does first to a zombie it re-dispatches: the old lease loses the progress
/// record (its writes are refused from then on, even before the next attempt claims the
/// job), and the stage and checkpoint pointer stay for the next attempt to resume from.
#[tokio::test]
async fn a_revoked_progress_record_refuses_the_old_lease_and_keeps_its_checkpoint() {
    stack();
    let api = Api::new(&principal("revoke"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 30, "item_ms": 100}})).await;
    api.wait_for(&job_id, "progress", |j| j["progress"]["items_done"].as_u64().unwrap_or(0) >= 10)
        .await;
    let lease = kill(&job_id).await.lease.expect("a running job's lease");
    let aws = Aws::new().await;
    let before = aws.progress_record(&job_id).await;
    store().await.revoke_progress(&job_id, &lease).await.unwrap();
    let after = aws.progress_record(&job_id).await;
    assert_ne!(after.lease, lease);
    assert_eq!(
        (&after.checkpoint_key, after.stage_index),
        (&before.checkpoint_key, before.stage_index)
    );
    let stale =
        ProgressRecord { seq: u64::MAX - 1, lease: lease.clone(), pct: 99.0, ..Default::default() };
    assert!(matches!(
        store().await.record_progress(&job_id, &stale).await,
        Err(ProgressRefused::LeaseLost)
    ));
    // Revoking what the lease no longer holds changes nothing.
    store().await.revoke_progress(&job_id, &lease).await.unwrap();
    assert_eq!(aws.progress_record(&job_id).await.lease, after.lease);

    fire_until(&api, &job_id, "reaper", "re-dispatch", |j| j["attempt"] == 2).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(
        (job["status"].as_str(), job["attempt"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{job}"
    );
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(30)
    );
}

#[tokio::test]
async fn a_result_written_before_the_status_was_lost_is_backfilled() {
    stack();
    let api = Api::new(&principal("backfill"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 50, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) > 2
    })
    .await;
    kill(&job_id).await;
    // As if the worker stored its result and died before recording success.
    let result = serde_json::to_vec(&DemoResult::expected(50)).unwrap();
    Aws::new()
        .await
        .s3
        .put_object()
        .bucket(stack().stack.resource("DataBucket"))
        .key(format!("results/{job_id}/1/result.json"))
        .body(result.clone().into())
        .send()
        .await
        .unwrap();
    let job = fire_until(&api, &job_id, "reaper", "backfill", |j| j["status"] != "running").await;
    // Back-filled as succeeded. (This stack keeps results 3 s: the expirer, fired by another
    // test, may have expired it by the time the reaper's run returned.)
    let backfilled = job["transitions"].as_array().unwrap().iter().any(|t| {
        t["state"] == "succeeded"
            && t["reason"].as_str().unwrap_or_default().contains("its result was already stored")
    });
    assert!(backfilled, "{:?}", reasons(&job));
    if job["status"] == "succeeded" {
        assert_eq!(api.result(&job_id).await, result);
    } else {
        assert_eq!(job["status"], "expired", "{job}");
    }
    // The reaper ended the job: it counts the success and its duration, once.
    assert_counted_once("JobsSucceeded", &job_id).await;
    assert_eq!(metric_points("JobDuration", &job_id, 1).await.len(), 1, "one duration per end");
}

#[tokio::test]
async fn a_zombie_past_its_retry_budget_fails_with_the_reason() {
    stack();
    let api = Api::new(&principal("budget"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 80, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) > 2
    })
    .await;
    kill(&job_id).await;
    fire_until(&api, &job_id, "reaper", "re-dispatch", |j| j["attempt"] == 2).await;
    api.wait_for(&job_id, "attempt 2 running", |j| j["status"] == "running" && j["attempt"] == 2)
        .await;
    kill(&job_id).await;
    let job = fire_until(&api, &job_id, "reaper", "failure", |j| j["status"] == "failed").await;
    assert_eq!(job["error"]["code"], "Job.Abandoned");
    assert_eq!(metric_points("ZombiesReaped", &job_id, 2).await.len(), 2, "one per dead attempt");
    assert_counted_once("JobsFailed", &job_id).await;
    assert_eq!(metric_points("JobDuration", &job_id, 1).await.len(), 1, "one duration per end");
    assert!(metric_points("JobsDeadLettered", &job_id, 0).await.is_empty(), "it was dispatched");
    assert!(job["error"]["message"].as_str().unwrap().contains("retry budget"), "{job}");
    assert!(
        Aws::new().await.keys(&format!("checkpoints/{job_id}/")).await.is_empty(),
        "checkpoints cleaned up"
    );
}

#[tokio::test]
async fn two_reapers_at_once_act_once() {
    stack();
    let api = Api::new(&principal("twins"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 50, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) > 2
    })
    .await;
    kill(&job_id).await;
    let deadline = Deadline::new("the reapers to re-dispatch the zombie", HEARTBEAT_TIMEOUT * 20);
    loop {
        futures::future::join(fire("reaper"), fire("reaper")).await;
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        if job["attempt"] != 1 {
            break;
        }
        deadline.tick(Duration::from_millis(250), job).await;
    }
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["attempt"], 2, "exactly one re-dispatch: {job}");
    let redispatches = reasons(&job).iter().filter(|r| r.contains("re-dispatched")).count();
    assert_eq!(redispatches, 1, "{:?}", reasons(&job));
    assert_eq!(job["status"], "succeeded");
    assert_counted_once("ZombiesReaped", &job_id).await;
}

#[tokio::test]
async fn stalled_progress_is_flagged_then_treated_as_a_zombie() {
    stack();
    let api = Api::new(&principal("stall"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 20, "item_ms": 50, "stall_at": 5, "stall_ms": 60000}})).await;
    api.wait_for(&job_id, "the stall", |j| j["progress"]["items_done"].as_u64().unwrap_or(0) >= 5)
        .await;
    let job =
        fire_until(&api, &job_id, "reaper", "the stalled flag", |j| j["stalled"] == true).await;
    assert_eq!(job["status"], "running");
    fire("reaper").await;
    assert_counted_once("StalledJobs", &job_id).await;
    // Heartbeats keep coming: it is not a zombie until the grace has passed.
    let job = fire_until(&api, &job_id, "reaper", "stall → zombie", |j| j["attempt"] == 2).await;
    assert!(reasons(&job).iter().any(|r| r.contains("stalled")), "{:?}", reasons(&job));
    assert_eq!(api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await.status, 202);
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "cancelled");
}

/// Stores a job as the dispatcher leaves it: `queued` for its `dispatches`-th execution,
/// `{job_id}-{execution}`, which nothing starts; indexed as queued since `since`.
async fn put_queued(
    jobs: &JobStore,
    job: &JobRecord,
    execution: &str,
    dispatches: u32,
    since: String,
) -> String {
    jobs.put_job(job).await.unwrap();
    let execution = format!("{}-{execution}", job.job_id);
    jobs.transition(
        TransitionRequest::new(&job.job_id, &[JobStatus::Pending], JobStatus::Queued, "dispatched")
            .set("execution", &execution)
            .set("dispatches", dispatches)
            .indexed_at(since),
    )
    .await
    .unwrap();
    execution
}

/// The claim is two writes (job, then progress). One that died between them, with nothing
/// left to retry it (its execution stopped), must not leave a running job the reaper cannot
/// see: CI once caught exactly that when a kill landed between the writes.
#[tokio::test]
async fn a_claim_that_died_before_handing_over_progress_is_rescued() {
    stack();
    let owner = principal("half-claim");
    let api = Api::new(&owner);
    let jobs = store().await;
    let job = seeded_job(&owner, format_rfc3339(chrono::Utc::now()));
    let execution = put_queued(&jobs, &job, "stopped", 1, format_rfc3339(chrono::Utc::now())).await;
    jobs.claim(&job.job_id, &execution).await.unwrap();
    // As if the claim died after its first write: no progress record names the lease.
    Aws::new()
        .await
        .dynamodb
        .delete_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(format!("JOB#{}", job.job_id)))
        .key("sk", AttributeValue::S("PROGRESS".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(api.get(&format!("/jobs/{}", job.job_id)).await.json["status"], "running");

    let rescued =
        fire_until(&api, &job.job_id, "reaper", "re-dispatch", |j| j["attempt"] == 2).await;
    assert!(
        reasons(&rescued).iter().any(|r| r.starts_with("queued: no heartbeat for")),
        "{:?}",
        reasons(&rescued)
    );
    let done = api.wait_terminal(&job.job_id, TIMEOUT).await;
    assert_eq!(
        (done["status"].as_str(), done["attempt"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{done}"
    );
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job.job_id).await).unwrap(),
        DemoResult::expected(3)
    );
}

/// Only the execution a queued job was last dispatched to may claim it: a superseded one that
/// starts late (the reaper re-dispatched the job meanwhile, or a backoff named the next
/// attempt's execution) must not run it beside the current one.
#[tokio::test]
async fn a_superseded_execution_cannot_claim_the_job() {
    stack();
    let owner = principal("late-claim");
    let jobs = store().await;
    let job = seeded_job(&owner, format_rfc3339(chrono::Utc::now()));
    let current = put_queued(&jobs, &job, "current", 2, format_rfc3339(chrono::Utc::now())).await;
    let late = jobs.claim(&job.job_id, &format!("{}-superseded", job.job_id)).await;
    match late {
        Err(longhaul_aws::jobs::StoreError::Conflict { current: Some(now) }) => {
            assert_eq!((now.status, now.attempt), (JobStatus::Queued, 0), "{now:?}")
        }
        other => panic!("a superseded execution claimed the job: {other:?}"),
    }
    let (lease, claimed) = jobs.claim(&job.job_id, &current).await.unwrap();
    assert_eq!((claimed.status, lease.attempt), (JobStatus::Running, 1));
    end(&jobs, &job.job_id, &lease.token).await;
}

/// Ends a job a test claimed by hand (nothing runs it), so the reaper, fired by the other
/// tests of this binary, does not re-dispatch it into real executions while they run.
async fn end(jobs: &JobStore, job_id: &JobId, lease: &str) {
    jobs.transition(
        TransitionRequest::new(job_id, &[JobStatus::Running], JobStatus::Failed, "test over")
            .fenced(lease),
    )
    .await
    .unwrap();
}

/// A cancelled attempt's final checkpoint is refused once the progress record has moved past
/// its stage (it would become the next stage's input), and sets the record's stage otherwise.
#[tokio::test]
async fn a_final_checkpoint_never_lands_in_a_later_stage() {
    use longhaul_aws::jobs::FinalCheckpoint;
    stack();
    let owner = principal("final-checkpoint");
    let jobs = store().await;
    let job = seeded_job(&owner, format_rfc3339(chrono::Utc::now()));
    let execution = put_queued(&jobs, &job, "x", 1, format_rfc3339(chrono::Utc::now())).await;
    let (lease, _) = jobs.claim(&job.job_id, &execution).await.unwrap();
    let at = |seq, stage_index| FinalCheckpoint {
        seq,
        stage: if stage_index == 1 { "first" } else { "second" },
        stage_index,
        checkpoint_key: "checkpoints/x/final.json",
        items_done: 5,
    };
    // Cancelled before its first progress write: the record shows no stage yet.
    jobs.record_final_checkpoint(&job.job_id, &lease.token, at(1, 2)).await.unwrap();
    let progress = jobs.view(&job.job_id).await.unwrap().unwrap().progress.unwrap();
    assert_eq!(
        (progress.stage.as_str(), progress.stage_index, progress.items_done),
        ("second", 2, 5)
    );
    // The record is at stage 2: a stage-1 checkpoint (a newer seq, the same lease) is refused.
    let stale = jobs.record_final_checkpoint(&job.job_id, &lease.token, at(2, 1)).await;
    assert!(matches!(stale, Err(ProgressRefused::LeaseLost)), "{stale:?}");
    let progress = jobs.view(&job.job_id).await.unwrap().unwrap().progress.unwrap();
    assert_eq!((progress.stage_index, progress.seq), (2, 1));
    end(&jobs, &job.job_id, &lease.token).await;
}

/// Tidying deletes a few keys one by one (free) and a larger page in one batch; either way
/// nothing under the prefix survives and nothing outside it is touched.
/// Checkpoints are write-once: a second write at a key (a stale or duplicate worker) is
/// refused and leaves the first object as it was; and no two checkpoint keys are the same,
/// even for the same job, stage, sequence number and attempt.
#[tokio::test]
async fn a_checkpoint_object_is_never_overwritten() {
    use longhaul_aws::objects::{ObjectStore, PutNewError, checkpoint_key};
    stack();
    let aws = Aws::new().await;
    let objects = ObjectStore::new(aws.s3.clone(), stack().stack.resource("DataBucket"));
    let job = JobId::new();
    let key = checkpoint_key(&job, "scan", 7, 1);
    assert_ne!(key, checkpoint_key(&job, "scan", 7, 1), "every checkpoint key is new");
    objects.put_new(&key, b"first".to_vec(), "application/json").await.unwrap();
    let again = objects.put_new(&key, b"second".to_vec(), "application/json").await;
    assert!(matches!(again, Err(PutNewError::Exists(_))), "{again:?}");
    assert_eq!(objects.get(&key).await.unwrap().as_deref(), Some(&b"first"[..]));
}

#[tokio::test]
async fn deleting_a_prefix_removes_every_key_under_it_and_nothing_else() {
    stack();
    let aws = Aws::new().await;
    let objects = longhaul_aws::objects::ObjectStore::new(
        aws.s3.clone(),
        stack().stack.resource("DataBucket"),
    );
    let run = uuid::Uuid::new_v4();
    for (prefix, count) in [("few", 3), ("many", 9)] {
        for i in 0..count {
            objects
                .put(
                    &format!("checkpoints/{run}-{prefix}/{i}.json"),
                    b"{}".to_vec(),
                    "application/json",
                )
                .await
                .unwrap();
        }
    }
    objects
        .put(&format!("checkpoints/{run}-fewer/kept.json"), b"{}".to_vec(), "application/json")
        .await
        .unwrap();
    assert_eq!(objects.delete_prefix(&format!("checkpoints/{run}-few/")).await.unwrap(), 3);
    assert_eq!(objects.delete_prefix(&format!("checkpoints/{run}-many/")).await.unwrap(), 9);
    assert!(aws.keys(&format!("checkpoints/{run}-few/")).await.is_empty());
    assert!(aws.keys(&format!("checkpoints/{run}-many/")).await.is_empty());
    assert_eq!(aws.keys(&format!("checkpoints/{run}-fewer/")).await.len(), 1);
}

#[tokio::test]
async fn lost_dispatches_are_recovered() {
    stack();
    let owner = principal("lost");
    let api = Api::new(&owner);
    let jobs = store().await;
    // Submit died between storing the job and enqueueing it.
    let pending =
        seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::seconds(30)));
    jobs.put_job(&pending).await.unwrap();
    // The dispatcher recorded `queued`, but its execution never started.
    let queued = seeded_job(&owner, format_rfc3339(chrono::Utc::now()));
    put_queued(
        &jobs,
        &queued,
        "never-started",
        1,
        format_rfc3339(chrono::Utc::now() - chrono::Duration::seconds(30)),
    )
    .await;
    for job_id in [&pending.job_id, &queued.job_id] {
        let job = fire_until(&api, job_id, "reaper", "recovery", |j| {
            j["status"] == "running" || succeeded(j)
        })
        .await;
        assert_ne!(job["status"], "failed");
        let done = api.wait_terminal(job_id, TIMEOUT).await;
        assert!(succeeded(&done), "{done}");
    }
}

/// A job the reaper gives up dispatching fails with the reason and is counted as dead-lettered:
/// a pending job accepted longer ago than `LONGHAUL_MAX_PENDING_SECONDS` (a day), and a queued
/// job whose last allowed execution (`LONGHAUL_MAX_ATTEMPTS` = 2) ended without running it.
#[tokio::test]
async fn a_job_that_cannot_be_dispatched_fails_and_is_counted() {
    stack();
    let owner = principal("undispatchable");
    let api = Api::new(&owner);
    let jobs = store().await;
    let old = || format_rfc3339(chrono::Utc::now() - chrono::Duration::seconds(30));
    let pending = JobRecord {
        enqueues: 3,
        ..seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::days(2)))
    };
    jobs.put_job(&pending).await.unwrap();
    let queued = seeded_job(&owner, old());
    let execution = put_queued(&jobs, &queued, "ended", 2, old()).await;
    // Its execution ran and ended without claiming the job (it was started for another).
    let aws = Aws::new().await;
    let machine = stack().stack.resource("JobStateMachine");
    aws.sfn
        .start_execution()
        .state_machine_arn(&machine)
        .name(&execution)
        .input(
            json!({"job_id": "no-such-job", "worker_arn": format!(
                "arn:aws:lambda:us-east-1:123456789012:function:{}",
                stack().stack.template.physical_name("StageFunction").unwrap()
            )})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let arn = format!("{}:{execution}", machine.replace(":stateMachine:", ":execution:"));
    let deadline = Deadline::new(format!("the execution {execution} to end"), TIMEOUT);
    loop {
        let described = aws.sfn.describe_execution().execution_arn(&arn).send().await.unwrap();
        if described.status.as_str() != "RUNNING" {
            break;
        }
        deadline.tick(Duration::from_millis(100), described.status.as_str()).await;
    }
    for (job, message) in [
        (&pending, "not dispatched within 86400 s of being accepted (3 re-enqueues)".to_owned()),
        (&queued, format!("its execution {execution} ended without running it")),
    ] {
        let failed = fire_until(&api, &job.job_id, "reaper", "giving up", |j| {
            j["status"] != "pending" && j["status"] != "queued"
        })
        .await;
        assert_eq!(
            (failed["status"].as_str(), failed["error"]["code"].as_str()),
            (Some("failed"), Some("Job.Undispatchable")),
            "{failed}"
        );
        assert_eq!(failed["error"]["message"], message.as_str());
        assert_counted_once("JobsFailed", &job.job_id).await;
        assert_counted_once("JobsDeadLettered", &job.job_id).await;
    }
}

#[tokio::test]
async fn a_job_running_past_its_maximum_times_out() {
    stack();
    let api = Api::new(&principal("overtime"));
    // Five minutes of work at full speed: still running when its start is moved back.
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 3000, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| j["status"] == "running").await;
    let job =
        fire_until(&api, &job_id, "reaper", "a first look", |j| j["status"] == "running").await;
    assert_eq!(job["status"], "running", "within its maximum runtime, a working job runs on");
    // Started more than its maximum runtime (the policy stored on it: a day) ago.
    let policy_max =
        store().await.job(&job_id).await.unwrap().unwrap().policy_or_default().max_runtime();
    let long_ago = chrono::Utc::now()
        - chrono::Duration::from_std(policy_max).unwrap()
        - chrono::Duration::minutes(1);
    Aws::new()
        .await
        .dynamodb
        .update_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(longhaul_aws::jobs::job_pk(&job_id)))
        .key("sk", AttributeValue::S(longhaul_aws::jobs::JOB_SK.into()))
        .update_expression("SET started_at = :then")
        .expression_attribute_values(":then", AttributeValue::S(format_rfc3339(long_ago)))
        .send()
        .await
        .unwrap();
    let job = fire_until(&api, &job_id, "reaper", "the timeout", |j| j["status"] == "failed").await;
    assert_eq!(job["error"]["code"], "Job.Timeout", "{job}");
    // Its worker is alive and working: the reaper took the progress record from its lease, so
    // its next progress write is refused (it stops) rather than landing on an ended job.
    let progress = Aws::new().await.progress_record(&job_id).await;
    assert!(progress.lease.starts_with("revoked:"), "progress still leased: {progress:?}");
}

#[tokio::test]
async fn expired_results_are_deleted_and_answer_410() {
    stack();
    let api = Api::new(&principal("expiry"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 303);
    let job = fire_until(&api, &job_id, "expirer", "expiry", |j| j["status"] == "expired").await;
    assert_eq!(reasons(&job).last().unwrap(), "expired: result retention passed");
    fire("expirer").await;
    assert_counted_once("JobsExpired", &job_id).await;
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 410);
    assert!(Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty());
}

#[tokio::test]
async fn a_run_over_500_mixed_jobs_changes_only_what_is_due() {
    stack();
    let owner = principal("mixed");
    let aws = Aws::new().await;
    let table = stack().stack.resource("JobsTable");
    let now = chrono::Utc::now();
    let mut due = Vec::new();
    let mut not_due = Vec::new();
    for i in 0..500 {
        let mut job = seeded_job(&owner, format_rfc3339(now - chrono::Duration::hours(1)));
        let (status, index) = match i % 5 {
            0 | 1 => {
                (JobStatus::Succeeded, Some(format_rfc3339(now - chrono::Duration::minutes(1))))
            }
            2 => (JobStatus::Succeeded, Some(format_rfc3339(now + chrono::Duration::days(1)))),
            3 => (JobStatus::Failed, None),
            _ => (JobStatus::Cancelled, None),
        };
        job.status = status;
        let mut item: std::collections::HashMap<String, AttributeValue> =
            serde_dynamo::to_item(&job).unwrap();
        item.insert("pk".into(), AttributeValue::S(format!("JOB#{}", job.job_id)));
        item.insert("sk".into(), AttributeValue::S("JOB".into()));
        if let Some(index) = &index {
            item.insert(
                "gsi2pk".into(),
                AttributeValue::S(longhaul_aws::jobs::status_bucket("succeeded", &job.job_id)),
            );
            item.insert("gsi2sk".into(), AttributeValue::S(index.clone()));
        }
        aws.dynamodb.put_item().table_name(&table).set_item(Some(item)).send().await.unwrap();
        if i % 5 < 2 { due.push(job.job_id) } else { not_due.push((job.job_id, status)) }
    }
    for _ in 0..10 {
        let report = fire("expirer").await;
        fire("reaper").await;
        if report["output"]["expired"] == 0 {
            break;
        }
    }
    let jobs = store().await;
    for job_id in &due {
        assert_eq!(jobs.job(job_id).await.unwrap().expect("not lost").status, JobStatus::Expired);
    }
    for (job_id, status) in &not_due {
        let job = jobs.job(job_id).await.unwrap().expect("not lost");
        assert_eq!(job.status, *status, "{job_id} changed");
        assert_eq!(job.transitions.len(), 1, "{job_id} was touched");
    }
}

#[tokio::test]
async fn a_poison_message_goes_to_the_dead_letter_queue_without_blocking_its_batch() {
    stack();
    let aws = Aws::new().await;
    let intake = stack().stack.resource("IntakeQueue");
    let dlq = stack().stack.resource("IntakeDeadLetterQueue");
    // Redeliveries after one second instead of 90, so five receives take seconds.
    aws.sqs
        .set_queue_attributes()
        .queue_url(&intake)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "1")
        .send()
        .await
        .unwrap();
    let poison = format!("not a dispatch message {}", uuid::Uuid::new_v4());
    // Delayed past the pollers' current long polls, which still use the old timeout.
    aws.sqs
        .send_message()
        .queue_url(&intake)
        .message_body(&poison)
        .delay_seconds(2)
        .send()
        .await
        .unwrap();
    // A good job sent alongside is dispatched as usual.
    let api = Api::new(&principal("poison"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    let deadline = Deadline::new("the poison message in the dead-letter queue", TIMEOUT);
    loop {
        let received = aws
            .sqs
            .receive_message()
            .queue_url(&dlq)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
        if received.messages().iter().any(|m| m.body() == Some(poison.as_str())) {
            return;
        }
        // (The receive itself waits a second.)
        deadline
            .tick(Duration::ZERO, format!("{} other messages", received.messages().len()))
            .await;
    }
}

/// The outbox's dead letters: a job's end the notifier cannot read goes, whole and with the
/// reason, to the notifier dead-letter queue — and the ends after it still flow (retrying it
/// would change nothing, and Lambda would dead-letter the rest of its batch with it).
#[tokio::test]
async fn an_unreadable_end_on_the_stream_is_dead_lettered_and_the_ends_after_it_flow() {
    stack();
    let aws = Aws::new().await;
    let jobs = store().await;
    let table = stack().stack.resource("JobsTable");
    let owner = principal("outbox-poison");
    let running = |mut job: JobRecord| {
        job.status = JobStatus::Running;
        job.attempt = 1;
        job.lease = Some("lease-1".into());
        job.callback_url = Some("https://partner.example.com/hook".into());
        job
    };
    // A job record this version cannot read (its attempt is not a number), then its end (which
    // takes it out of the status index, as every end does).
    let poison = running(seeded_job(&owner, longhaul_domain::now_rfc3339()));
    jobs.put_job(&poison).await.unwrap();
    aws.dynamodb
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(longhaul_aws::jobs::job_pk(&poison.job_id)))
        .key("sk", AttributeValue::S(longhaul_aws::jobs::JOB_SK.into()))
        .update_expression("SET attempt = :bad, #status = :failed REMOVE gsi2pk, gsi2sk")
        .expression_attribute_names("#status", "status")
        .expression_attribute_values(":bad", AttributeValue::S("one".into()))
        .expression_attribute_values(":failed", AttributeValue::S("failed".into()))
        .send()
        .await
        .unwrap();
    // A good end right after it, in the same stretch of the stream.
    let good = running(seeded_job(&owner, longhaul_domain::now_rfc3339()));
    jobs.put_job(&good).await.unwrap();
    jobs.transition(
        TransitionRequest::new(&good.job_id, &[JobStatus::Running], JobStatus::Failed, "test")
            .fenced("lease-1"),
    )
    .await
    .unwrap();

    let dlq = stack().stack.resource("NotifierDeadLetterQueue");
    let deadline = Deadline::new("the unreadable end in the notifier dead-letter queue", TIMEOUT);
    let dead_letter = loop {
        let received = aws
            .sqs
            .receive_message()
            .queue_url(&dlq)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        if let Some(body) = received.messages().first().and_then(|m| m.body()) {
            break serde_json::from_str::<Value>(body).unwrap();
        }
        // (The receive itself waits a second.)
        deadline.tick(Duration::ZERO, "an empty queue").await;
    };
    assert_eq!(
        dead_letter["record"]["dynamodb"]["NewImage"]["job_id"]["S"],
        poison.job_id.as_str(),
        "{dead_letter}"
    );
    assert_eq!(
        dead_letter["record"]["dynamodb"]["NewImage"]["status"]["S"], "failed",
        "{dead_letter}"
    );
    assert!(
        dead_letter["reason"].as_str().is_some_and(|r| r.contains("cannot be read")),
        "{dead_letter}"
    );
    // The good end after it was queued and its delivery attempted.
    let deadline = Deadline::new("a delivery of the end after the unreadable one", TIMEOUT);
    while jobs.deliveries(&good.job_id).await.unwrap().is_empty() {
        deadline.tick(Duration::from_millis(100), "no delivery").await;
    }
    assert!(
        jobs.deliveries(&poison.job_id).await.unwrap().is_empty(),
        "nothing was sent for the unreadable end"
    );
}

/// The reaper reads each status bucket oldest first: one job record it cannot read (or cannot
/// act on) is logged, counted and skipped, and the jobs behind it are still looked after.
#[tokio::test]
async fn an_unreadable_job_record_does_not_hold_up_the_reaper() {
    stack();
    let owner = principal("unreadable");
    let api = Api::new(&owner);
    let jobs = store().await;
    let aws = Aws::new().await;
    let table = stack().stack.resource("JobsTable");
    let key = |job_id: &JobId| {
        [
            ("pk".to_owned(), AttributeValue::S(longhaul_aws::jobs::job_pk(job_id))),
            ("sk".to_owned(), AttributeValue::S(longhaul_aws::jobs::JOB_SK.into())),
        ]
    };
    // An old pending job whose record this version cannot read, first in its bucket. It is
    // written unreadable in one step: a reaper run of another test between a readable write
    // and the change would re-enqueue it and move it to the back of its bucket.
    let unreadable =
        seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::hours(1)));
    let mut item: std::collections::HashMap<String, AttributeValue> =
        serde_dynamo::to_item(&unreadable).unwrap();
    item.extend(key(&unreadable.job_id));
    item.insert(
        "gsi2pk".into(),
        AttributeValue::S(longhaul_aws::jobs::status_bucket("pending", &unreadable.job_id)),
    );
    item.insert("gsi2sk".into(), AttributeValue::S(unreadable.created_at.to_rfc3339()));
    item.insert("attempt".into(), AttributeValue::S("one".into()));
    aws.dynamodb.put_item().table_name(&table).set_item(Some(item)).send().await.unwrap();
    // ...and a lost dispatch behind it.
    let lost =
        seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::seconds(30)));
    jobs.put_job(&lost).await.unwrap();
    let report = fire("reaper").await;
    assert!(
        report["output"]["errors"].as_u64().is_some_and(|n| n >= 1),
        "the unreadable record is counted: {report}"
    );
    fire_until(&api, &lost.job_id, "reaper", "recovery", |j| {
        j["status"] == "running" || succeeded(j)
    })
    .await;
    let done = api.wait_terminal(&lost.job_id, TIMEOUT).await;
    assert!(succeeded(&done), "{done}");
    aws.dynamodb
        .delete_item()
        .table_name(&table)
        .set_key(Some(key(&unreadable.job_id).into_iter().collect()))
        .send()
        .await
        .unwrap();
}

/// The dashboard's "active jobs by status": each reaper run counts the live jobs of each
/// status in the status index and emits them as the `ActiveJobs` gauge (dimension `Status`),
/// each reading marked exact (`ActiveJobsTruncated` 0) or a lower bound (1).
#[tokio::test]
async fn the_reaper_counts_active_jobs_by_status_for_the_dashboard() {
    stack();
    let api = Api::new(&principal("active"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 40, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| j["status"] == "running").await;
    let report = fire("reaper").await;
    let active = &report["output"]["active"];
    for status in ["pending", "queued", "running"] {
        assert!(active[status].is_u64(), "{status} counted: {report}");
    }
    assert!(active["running"].as_u64().unwrap() >= 1, "our running job is counted: {report}");
    let gauges: Vec<Value> = stack()
        .stack
        .metrics
        .parsed()
        .into_iter()
        .filter(|l| l.get("ActiveJobs").is_some())
        .collect();
    for status in ["pending", "queued", "running"] {
        assert!(
            gauges.iter().any(|g| g["Status"] == status),
            "an ActiveJobs point for {status}: {gauges:?}"
        );
    }
    assert!(
        gauges.iter().any(|g| g["Status"] == "running" && g["ActiveJobs"].as_f64().unwrap() >= 1.0),
        "the running job reached the gauge: {gauges:?}"
    );
    assert!(
        gauges
            .iter()
            .all(|g| g["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == json!([["Status"]])),
        "{gauges:?}"
    );
    // A small table is counted to its end: every reading says it is exact.
    assert_eq!(report["output"]["active_at_least"], json!([]), "{report}");
    let marks: Vec<Value> = stack()
        .stack
        .metrics
        .parsed()
        .into_iter()
        .filter(|l| l.get("ActiveJobsTruncated").is_some())
        .collect();
    for status in ["pending", "queued", "running"] {
        assert!(
            marks.iter().any(|m| m["Status"] == status && m["ActiveJobsTruncated"] == 0.0),
            "an exact ActiveJobs reading for {status}: {marks:?}"
        );
    }
    api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
}
