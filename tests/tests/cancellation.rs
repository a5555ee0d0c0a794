//! Cancelling a running job when something goes wrong on the way: the worker dies before it
//! sees the request (the reaper ends the job `cancelled`, not re-dispatched or failed), or the
//! request's write of the flag the worker watches fails (a retried cancel sets it).
//!
//! Its own stack: the reaper is fired only by the test that needs it (a heartbeat is stale after
//! 10 s, so the live workers of the other test are never judged dead on a loaded machine), each
//! job has one attempt (a zombie the reaper does not cancel fails at once, `Job.Abandoned`), and
//! callbacks may be loopback URLs (the webhook's event is checked).

use std::time::Duration;

use longhaul_aws::jobs::{JobRecord, JobStore};
use longhaul_domain::JobStatus;
use longhaul_tests::{
    Api, Aws, Harness, assert_counted_once, fire, harness_with, metric_points, principal,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", "10"),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("LONGHAUL_MAX_ATTEMPTS", "1"),
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1"),
        ("LONGHAUL_WEBHOOK_SCHEDULE_SECONDS", "1,1,1"),
        // A stage invocation works about 5 s (of the function's 900) and continues in the
        // next: a job here spans invocations, as a long one does in AWS.
        ("LONGHAUL_STAGE_MARGIN_SECONDS", "895"),
    ])
}

/// The stack has one fault plan, and the plan below fails every cancellation's flag write:
/// the tests that cancel take turns.
static CANCELS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn store() -> JobStore {
    longhaul_tests::job_store().await
}

/// The worker dies (see [`longhaul_tests::kill_worker`]).
async fn kill(job_id: &str) -> JobRecord {
    longhaul_tests::kill_worker(job_id).await
}

/// A local partner that answers 204 to every webhook (the test reads what it got from the
/// job's recorded deliveries).
async fn receiver() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/{key}", axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/{}", uuid::Uuid::new_v4().simple())
}

/// The job's recorded webhook deliveries, once there is at least one.
async fn deliveries(api: &Api, job_id: &str) -> Vec<Value> {
    for _ in 0..600 {
        let reply = api.get(&format!("/jobs/{job_id}/deliveries")).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let list = reply.json["deliveries"].as_array().unwrap().clone();
        if !list.is_empty() {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no webhook delivery recorded for {job_id}");
}

fn states(job: &Value) -> Vec<&str> {
    job["transitions"].as_array().unwrap().iter().filter_map(|t| t["state"].as_str()).collect()
}

/// The owner cancels a running job whose worker has died (it will never see the request):
/// the reaper, finding the zombie, ends it `cancelled` with the requester's reason — its
/// partial results deleted, its webhook `job.cancelled` — where it used to re-dispatch it, or
/// (here, with one attempt) fail it `Job.Abandoned` with a `job.failed` webhook.
#[tokio::test]
async fn a_cancelled_job_whose_worker_died_is_ended_cancelled_by_the_reaper() {
    stack();
    let owner = principal("cancel-zombie");
    let api = Api::new(&owner);
    let callback = receiver().await;
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 300, "item_ms": 100},
            "callback_url": callback}))
        .await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let lease = kill(&job_id).await.lease.expect("a running job's lease");
    {
        let _turn = CANCELS.lock().await;
        let reply = api
            .send(
                "POST",
                &format!("/jobs/{job_id}/cancel"),
                Some(("application/json", br#"{"reason": "no longer needed"}"#.to_vec())),
                &[],
            )
            .await;
        assert_eq!(
            (reply.status, reply.json["status"].as_str()),
            (202, Some("running")),
            "{}",
            reply.text
        );
    }
    // The reaper acts once the heartbeat is 10 s old.
    let mut job = Value::Null;
    for _ in 0..240 {
        fire("reaper").await;
        job = api.get(&format!("/jobs/{job_id}")).await.json;
        if job["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(job["status"], "cancelled", "{job}");
    assert_eq!(job["attempt"], 1, "not re-dispatched: {job}");
    assert!(job.get("error").is_none_or(Value::is_null), "{job}");
    assert_eq!(states(&job), ["pending", "queued", "running", "cancelled"], "{job}");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["reason"], format!("cancelled by {owner}: no longer needed"), "{job}");
    assert!(Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty());
    // The dead worker's lease lost its progress record: were it only slow, its next write
    // would be refused.
    let progress = Aws::new().await.progress_record(&job_id).await;
    assert_eq!(progress.lease, format!("revoked:{lease}"), "{progress:?}");
    assert_counted_once("JobsCancelled", &job_id).await;
    assert_counted_once("ZombiesReaped", &job_id).await;
    assert!(metric_points("JobsFailed", &job_id, 0).await.is_empty(), "counted as failed");
    let events: Vec<String> = deliveries(&api, &job_id)
        .await
        .iter()
        .map(|d| d["event"].as_str().unwrap().to_owned())
        .collect();
    assert!(events.iter().all(|e| e == "job.cancelled"), "{events:?}");
}

/// The first cancel's write of the flag the worker watches fails after the job record took
/// the request (the client gets a 500). The client retries: the retry answers 202 with the
/// first request on record and sets the flag, and the worker stops at its next progress write
/// — where the retry used to answer 202 without the flag, and the worker ran on to the end of
/// its invocation (here: the job's end, `succeeded`).
#[tokio::test]
async fn a_retried_cancel_sets_the_flag_the_first_one_failed_to_write() {
    stack();
    let owner = principal("cancel-retry");
    let api = Api::new(&owner);
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 300, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let http = reqwest::Client::new();
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    {
        let _turn = CANCELS.lock().await;
        // Only the cancellation's flag write says this: the worker's progress writes are
        // `PutItem`s, and no other update sets the flag.
        let plan = json!({"deny": {"operation": "dynamodb:UpdateItem",
            "contains": "SET cancel_requested_at"}});
        assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
        // Straight to the API, not through `Api::send`: it fails a test on any 5xx, and
        // this one is expected.
        let first = http
            .post(format!("{}/jobs/{job_id}/cancel", api.base))
            .bearer_auth(api.token.as_deref().expect("a principal's token"))
            .json(&json!({"reason": "first try"}))
            .send()
            .await;
        // The plan goes before anything can fail: the other test cancels too.
        let injected: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
        assert_eq!(http.post(&faults).json(&json!({})).send().await.unwrap().status(), 200);
        let first = first.expect("the cancel request reaches the API");
        assert_eq!(first.status(), 500, "{:?}", first.text().await);
        assert_eq!(injected["injected"]["denied"], 1, "{injected}");
        let record = store().await.job(&job_id).await.unwrap().unwrap();
        assert_eq!(record.status, JobStatus::Running);
        assert!(record.cancellation.is_some(), "the job record took the request: {record:?}");
        let progress = Aws::new().await.progress_record(&job_id).await;
        assert!(progress.cancel_requested_at.is_none(), "the flag was written: {progress:?}");

        let retry = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
        assert_eq!(
            (retry.status, retry.json["status"].as_str()),
            (202, Some("running")),
            "{}",
            retry.text
        );
        assert_eq!(retry.json["cancellation"]["reason"], "first try", "{}", retry.text);
    }
    let progress = Aws::new().await.progress_record(&job_id).await;
    assert!(progress.cancel_requested_at.is_some(), "the retry set no flag: {progress:?}");
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["reason"], format!("cancelled by {owner}: first try"), "{job}");
    assert!(job["progress"]["items_done"].as_u64().unwrap() < 300, "it stopped early: {job}");
    assert_eq!(job["attempt"], 1, "{job}");
}

/// A cancel whose flag write failed and that the client never retried: the job record holds
/// the request, the flag a working stage watches is missing. The stage's next invocation reads
/// the job, sees the request, and ends the job `cancelled` with its reason.
#[tokio::test]
async fn a_cancel_whose_flag_was_never_written_is_honoured_by_the_next_invocation() {
    stack();
    let owner = principal("cancel-unflagged");
    let api = Api::new(&owner);
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 300, "item_ms": 100}})).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    let http = reqwest::Client::new();
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    {
        let _turn = CANCELS.lock().await;
        let plan = json!({"deny": {"operation": "dynamodb:UpdateItem",
            "contains": "SET cancel_requested_at"}});
        assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
        let only = http
            .post(format!("{}/jobs/{job_id}/cancel", api.base))
            .bearer_auth(api.token.as_deref().expect("a principal's token"))
            .json(&json!({"reason": "only try"}))
            .send()
            .await;
        assert_eq!(http.post(&faults).json(&json!({})).send().await.unwrap().status(), 200);
        assert_eq!(only.expect("the cancel request reaches the API").status(), 500);
    }
    let progress = Aws::new().await.progress_record(&job_id).await;
    assert!(progress.cancel_requested_at.is_none(), "the flag was written: {progress:?}");
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["reason"], format!("cancelled by {owner}: only try"), "{job}");
    assert!(job["progress"]["items_done"].as_u64().unwrap() < 300, "it stopped early: {job}");
}
