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
use longhaul_domain::{JobId, JobStatus};
use longhaul_tests::{
    Api, Aws, Deadline, Faults, Harness, assert_counted_once, fire_until, harness_with,
    metric_points, principal,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
/// When a worker's heartbeat is stale (the reaper then judges it dead).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", HEARTBEAT_TIMEOUT.as_secs().to_string().as_str()),
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
async fn kill(job_id: &JobId) -> JobRecord {
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

/// The job's recorded webhook deliveries, once there is at least one (the job has ended: its
/// first delivery is due at once).
async fn deliveries(api: &Api, job_id: &JobId) -> Vec<Value> {
    let deadline = Deadline::new(format!("a webhook delivery recorded for {job_id}"), TIMEOUT);
    loop {
        let reply = api.get(&format!("/jobs/{job_id}/deliveries")).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let list = reply.json["deliveries"].as_array().unwrap().clone();
        if !list.is_empty() {
            return list;
        }
        deadline.tick(Duration::from_millis(50), reply.text).await;
    }
}

fn states(job: &Value) -> Vec<&str> {
    job["transitions"].as_array().unwrap().iter().filter_map(|t| t["state"].as_str()).collect()
}

/// A demo job of `api`'s principal (300 items of 100 ms, spanning stage invocations), once it
/// is seen running.
async fn running_job(api: &Api, callback: Option<&str>) -> JobId {
    let mut body = json!({"type": "demo", "params": {"items": 300, "item_ms": 100}});
    if let Some(url) = callback {
        body["callback_url"] = json!(url);
    }
    let job_id = api.submit(&body).await;
    api.wait_for(&job_id, "running", |j| {
        j["status"] == "running" && j["progress"]["items_done"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    job_id
}

/// `POST /jobs/{id}/cancel` with `reason` while a fault plan denies the write of the flag the
/// worker watches, the plan turned off before anything can fail (the tests of this binary
/// cancel too: call it on the [`CANCELS`] turn); asserts the write was denied, once, and the
/// client answered 500.
async fn cancel_with_the_flag_denied(api: &Api, job_id: &JobId, reason: &str) {
    // Only the cancellation's flag write says this: the worker's progress writes are
    // `PutItem`s, and no other update sets the flag.
    let faults = Faults::install(&json!({"deny": {"operation": "dynamodb:UpdateItem",
        "contains": "SET cancel_requested_at"}}))
    .await;
    // Straight to the API, not through `Api::send`: it fails a test on any 5xx, and this one
    // is expected.
    let answer = reqwest::Client::new()
        .post(format!("{}/jobs/{job_id}/cancel", api.base))
        .bearer_auth(api.token.as_deref().expect("a principal's token"))
        .json(&json!({"reason": reason}))
        .send()
        .await;
    let injected = faults.clear().await;
    let answer = answer.expect("the cancel request reaches the API");
    assert_eq!(answer.status(), 500, "{:?}", answer.text().await);
    assert_eq!(injected["injected"]["denied"], 1, "{injected}");
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
    let job_id = running_job(&api, Some(&callback)).await;
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
    // The reaper acts once the heartbeat is stale.
    let limit = HEARTBEAT_TIMEOUT * 10;
    let job =
        fire_until(&api, &job_id, "reaper", "the end", limit, |j| j["status"] != "running").await;
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
    let job_id = running_job(&api, None).await;
    {
        let _turn = CANCELS.lock().await;
        cancel_with_the_flag_denied(&api, &job_id, "first try").await;
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
    let job_id = running_job(&api, None).await;
    {
        let _turn = CANCELS.lock().await;
        cancel_with_the_flag_denied(&api, &job_id, "only try").await;
    }
    let progress = Aws::new().await.progress_record(&job_id).await;
    assert!(progress.cancel_requested_at.is_none(), "the flag was written: {progress:?}");
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    let last = job["transitions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["reason"], format!("cancelled by {owner}: only try"), "{job}");
    assert!(job["progress"]["items_done"].as_u64().unwrap() < 300, "it stopped early: {job}");
}
