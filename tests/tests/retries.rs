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
    // Fails every try of its first attempt (its direct run's, then the execution's one and
    // three state-machine retries).
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 5, "fail_at": 2, "fail_kind": "transient", "fail_times": 5}}))
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
