//! Backoff across attempts with a long step (a day's ceiling, so the jittered wait is hours):
//! a job whose attempt failed transiently waits `queued` with `retry_at` and `last_error`, its
//! execution ended, nothing starting it early (neither the dispatcher nor the reaper), and it
//! can be cancelled while it waits. (The short-step path, a job retried to success in its next
//! attempt, is in skeleton.rs.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use longhaul_tests::{Api, Aws, Harness, fire, harness_with, principal};
use serde_json::{Value, json};

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_RETRY_BASE_DELAY_SECONDS", "86400")])
}

fn at(job: &Value, field: &str) -> DateTime<Utc> {
    let text = job[field].as_str().unwrap_or_else(|| panic!("{field} of {job}"));
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

#[tokio::test]
async fn a_job_waiting_for_its_next_attempt_shows_when_and_why_and_can_be_cancelled() {
    stack();
    let api = Api::new(&principal("backoff"));
    // Fails every try of its first attempt (one and three state-machine retries).
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 5, "fail_at": 2, "fail_kind": "transient", "fail_times": 4}}))
        .await;
    let waiting = api
        .wait_for(&job_id, "the backoff after the first attempt", |job| {
            job["status"] == "queued" && job.get("retry_at").is_some()
        })
        .await;
    let now = Utc::now();
    let retry_at = at(&waiting, "retry_at");
    assert!(retry_at > now, "{waiting}");
    assert!(retry_at <= now + chrono::Duration::days(1), "{waiting}");
    assert_eq!(waiting["attempt"], 1, "{waiting}");
    assert_eq!(waiting["last_error"]["code"], "Job.Retryable", "{waiting}");
    assert_eq!(waiting["last_error"]["message"], "injected transient failure at item 2");
    assert!(waiting.get("error").is_none(), "a job that goes on has no error: {waiting}");
    // Nothing runs while it waits: its execution ended with the attempt.
    let aws = Aws::new().await;
    let entered = aws.states_entered(&job_id).await;
    assert_eq!(entered.last().map(String::as_str), Some("RetryScheduled"), "{entered:?}");

    // The reaper does not take it for a lost dispatch before its time.
    fire("reaper").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(still["status"], "queued", "{still}");
    assert_eq!(still["retry_at"], waiting["retry_at"], "{still}");
    assert_eq!(still["transitions"], waiting["transitions"], "{still}");

    let reply = api
        .send(
            "DELETE",
            &format!("/jobs/{job_id}"),
            Some(("application/json", br#"{"reason": "the partner is down"}"#.to_vec())),
            &[],
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(reply.json["status"], "cancelled", "{}", reply.text);
    let cancelled = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled.get("retry_at").is_none(), "{cancelled}");
    assert!(cancelled.get("result_url").is_none(), "{cancelled}");
}

/// The owner cancels while the stage records the attempt's failure — after it read the job,
/// before its write that schedules the next attempt. That write is refused (the job carries
/// the cancellation) and the job ends `cancelled` at once: not `queued` for a day, holding its
/// slots, until its next claim would have seen the flag.
#[tokio::test]
async fn a_cancel_that_lands_while_the_failure_is_recorded_ends_the_job() {
    stack();
    let api = Api::new(&principal("cancel-in-backoff"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 5, "item_ms": 500, "fail_at": 2, "fail_kind": "transient", "fail_times": 4}}))
        .await;
    // Hold the write that schedules the next attempt (it names the next execution,
    // `<id>-2`: nothing else the stage writes does) for 4 s. (Only an invocation holding the
    // job's lease pauses; the edge learns the lease from its journal of writes.)
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let plan = json!({"pause_functions": ["StageFunction"], "pause_before_call": 1.0,
        "pause_ms": 4000, "max_pauses": 1, "journal": true,
        "pause_only": {"operation": "dynamodb:UpdateItem", "contains": format!("{job_id}-2")}});
    let http = reqwest::Client::new();
    assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let counts: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
        if counts["injected"]["paused"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the retry never paused: {counts}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(
        (reply.status, reply.json["status"].as_str()),
        (202, Some("running")),
        "{}",
        reply.text
    );
    let ended = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(ended["attempt"], 1, "{ended}");
    assert!(ended.get("retry_at").is_none(), "{ended}");
    // Queued once (by the dispatcher), never again.
    let states: Vec<&str> = ended["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["state"].as_str())
        .collect();
    assert_eq!(states, ["pending", "queued", "running", "cancelled"], "{ended}");
    let aws = Aws::new().await;
    assert_eq!(aws.states_entered(&job_id).await.last().map(String::as_str), Some("Cancelled"));
}
