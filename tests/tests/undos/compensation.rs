//! Compensation against the local stack: a demo job given an undo (`"compensate": true`) that
//! fails, or is cancelled while paused, moves to `compensating`, its worker runs the undo (sent
//! by the dispatcher through the real queue and async invocation), and it then ends as it was
//! going to, its `compensation` saying so; an undo that always fails (`"compensate_fails"`) is
//! retried with the job's backoff, given up once its attempts are spent, and the job ends all
//! the same.

use std::time::Duration;

use longhaul_domain::JobId;
use longhaul_tests::{Api, Harness, harness_with, principal};
use serde_json::{Value, json};

fn stack() -> &'static Harness {
    harness_with(&[])
}

/// The job's view once nothing about it moved for this long is a stuck job (the waits give
/// up only then, however slow the machine).
const STILL: Duration = Duration::from_secs(90);

fn states(job: &Value) -> Vec<String> {
    job["transitions"]
        .as_array()
        .expect("transitions")
        .iter()
        .filter_map(|t| t["state"].as_str().map(str::to_owned))
        .collect()
}

fn ends_through_compensating(job: &Value, ended: &str) {
    let states = states(job);
    let tail: Vec<&str> = states.iter().rev().take(2).rev().map(String::as_str).collect();
    assert_eq!(tail, ["compensating", ended], "{job}");
}

async fn control(api: &Api, job_id: &JobId, action: &str) -> (u16, Value) {
    let reply = api.post_json(&format!("/jobs/{job_id}/{action}"), &json!({})).await;
    (reply.status, reply.json)
}

#[tokio::test]
async fn a_failed_job_runs_its_undo_before_it_ends_failed() {
    stack();
    let api = Api::new(&principal("compensate-fail"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 5, "fail_at": 2,
            "fail_kind": "fatal", "compensate": true}}))
        .await;
    let ended = api.wait_terminal(&job_id, STILL).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["error"]["message"], "injected fatal failure at item 2", "{ended}");
    ends_through_compensating(&ended, "failed");
    let compensation = &ended["compensation"];
    assert_eq!(compensation["status"], "done", "{ended}");
    assert_eq!(compensation["ends_as"], "failed", "{ended}");
    let stages = compensation["stages"].as_array().expect("the undos");
    assert_eq!(stages.len(), 1, "{ended}");
    assert_eq!(stages[0]["stage"], "process");
    assert_eq!(stages[0]["status"], "done");
    assert_eq!(stages[0]["attempts"], 1);
    assert!(stages[0]["at"].is_string(), "{ended}");
}

#[tokio::test]
async fn an_undo_that_always_fails_is_retried_then_given_up_and_the_job_still_ends() {
    stack();
    let api = Api::new(&principal("compensate-gives-up"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 3, "fail_at": 1,
            "fail_kind": "fatal", "compensate": true, "compensate_fails": true}}))
        .await;
    let ended = api.wait_terminal(&job_id, STILL).await;
    assert_eq!(ended["status"], "failed", "{ended}");
    ends_through_compensating(&ended, "failed");
    let compensation = &ended["compensation"];
    assert_eq!(compensation["status"], "failed", "{ended}");
    let step = &compensation["stages"][0];
    assert_eq!(step["status"], "failed", "{ended}");
    let attempts = step["attempts"].as_u64().expect("attempts");
    assert_eq!(attempts, 3, "the job's attempts (the default policy's): {ended}");
    assert_eq!(step["error"], format!("injected undo failure (attempt {attempts})"), "{ended}");
}

#[tokio::test]
async fn a_started_job_cancelled_while_paused_compensates_then_is_cancelled() {
    stack();
    let api = Api::new(&principal("compensate-cancel"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 4, "compensate": true,
            "wait_for": {"signal": "go", "at_item": 2, "timeout_seconds": 3600}}}))
        .await;
    api.wait_for(&job_id, "waiting", |j| j["status"] == "paused").await;
    let (status, cancelled) = control(&api, &job_id, "cancel").await;
    assert_eq!(status, 202, "{cancelled}");
    assert_eq!(cancelled["status"], "compensating", "{cancelled}");
    let (status, again) = control(&api, &job_id, "cancel").await;
    assert!(status == 409 || again["status"] == "cancelled", "{status}: {again}");
    let ended = api.wait_terminal(&job_id, STILL).await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    ends_through_compensating(&ended, "cancelled");
    assert_eq!(ended["compensation"]["status"], "done", "{ended}");
    assert_eq!(ended["compensation"]["stages"][0]["stage"], "process", "{ended}");
    assert!(ended.get("result_url").is_none(), "{ended}");
}

#[tokio::test]
async fn a_job_that_never_started_is_cancelled_at_once_without_compensating() {
    stack();
    let api = Api::new(&principal("compensate-unstarted"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 1, "compensate": true},
            "delay_seconds": 3600}))
        .await;
    let (status, cancelled) = control(&api, &job_id, "cancel").await;
    assert_eq!(status, 202, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled", "nothing started, nothing to undo");
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    assert!(job.get("compensation").is_none(), "{job}");
}
