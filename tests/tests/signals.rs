//! Waits for signals against the local stack: a demo job that waits parks `paused` (its view
//! saying for what, until when, and the link to send it by), resumes when its owner's signal —
//! or a partner's, by the link, once — comes, and puts the payload in its result; a signal
//! sent before the wait is kept for it; a wait that times out (the reaper finds it) fails the
//! demo job, saying so. Compensation (`undos/compensation.rs`) runs on the same stack.

use std::time::Duration;

use longhaul_domain::JobId;
use longhaul_job_demo::domain::DemoResult;
use longhaul_tests::{Api, Harness, fire_until, harness_with, principal};
use serde_json::{Value, json};

fn stack() -> &'static Harness {
    harness_with(&[])
}

/// Compensation's tests share this binary's stack (each binary starts one).
#[path = "undos/compensation.rs"]
mod compensation;

/// The job's view once nothing about it moved for this long is a stuck job.
const STILL: Duration = Duration::from_secs(60);

/// A demo job of 10 items that waits for `signal` before item 3 for up to `timeout` seconds.
fn waiting(signal: &str, timeout: u64) -> Value {
    json!({"type": "demo", "params": {
        "items": 10, "item_ms": 10,
        "wait_for": {"signal": signal, "at_item": 3, "timeout_seconds": timeout},
    }})
}

async fn parked(api: &Api, job_id: &JobId) -> Value {
    api.wait_for(job_id, "parked waiting", |j| j["status"] == "paused").await
}

async fn result(api: &Api, job_id: &JobId) -> DemoResult {
    let done = api.wait_terminal(job_id, STILL).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    serde_json::from_slice(&api.result(job_id).await).expect("a demo result")
}

#[tokio::test]
async fn a_waiting_job_parks_and_its_owners_signal_resumes_it_with_the_payload() {
    stack();
    let api = Api::new(&principal("signal-owner"));
    let job_id = api.submit(&waiting("approval", 3_600)).await;
    let view = parked(&api, &job_id).await;
    assert_eq!(view["paused"]["reason"], "waiting", "{view}");
    assert_eq!(view["paused"]["signal"], "approval");
    assert!(view["paused"]["until"].is_string());
    assert_eq!(view["progress"]["items_done"], 3, "parked before item 3: {view}");

    let sent = api
        .post_json(&format!("/jobs/{job_id}/signals/approval"), &json!({"payload": {"by": "ops"}}))
        .await;
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert_eq!(sent.json["status"], "pending", "resumed");
    let result = result(&api, &job_id).await;
    assert_eq!(result.signals["approval"], json!({"by": "ops"}));
    assert_eq!(result.digest, DemoResult::expected(10).digest, "no item lost or repeated");

    let again = api.post_json(&format!("/jobs/{job_id}/signals/approval"), &json!({})).await;
    assert_eq!(again.status, 409, "the job ended: {}", again.text);
}

#[tokio::test]
async fn a_partner_sends_the_signal_by_the_link_once_without_a_bearer_token() {
    stack();
    let api = Api::new(&principal("signal-link"));
    let job_id = api.submit(&waiting("approval", 3_600)).await;
    let view = parked(&api, &job_id).await;
    let link = view["paused"]["signal_url"].as_str().expect("a link").to_owned();
    let partner = Api::anonymous();
    let forged = format!("{}x", link.trim_end_matches(|c: char| c != '.'));
    let refused = partner.post_json(&forged, &json!({"payload": 1})).await;
    assert_eq!(refused.status, 401, "{}", refused.text);
    let sent = partner.post_json(&link, &json!({"payload": "shipped"})).await;
    assert_eq!(sent.status, 202, "{}", sent.text);
    let again = partner.post_json(&link, &json!({"payload": "again"})).await;
    assert_eq!(again.status, 409, "one time: {}", again.text);
    assert_eq!(result(&api, &job_id).await.signals["approval"], json!("shipped"));
}

#[tokio::test]
async fn a_signal_sent_before_the_wait_is_kept_for_it() {
    stack();
    let api = Api::new(&principal("signal-early"));
    // A delayed job: it does not start for 5 s, so the signal surely comes before its wait.
    let mut body = waiting("file.arrived", 3_600);
    body["delay_seconds"] = json!(5);
    let job_id = api.submit(&body).await;
    let sent = api
        .post_json(&format!("/jobs/{job_id}/signals/file.arrived"), &json!({"payload": [1, 2]}))
        .await;
    assert_eq!(sent.status, 202, "{}", sent.text);
    assert_eq!(sent.json["status"], "pending", "kept, the job not started: {}", sent.text);
    let done = result(&api, &job_id).await;
    assert_eq!(done.signals["file.arrived"], json!([1, 2]));
    let view = api.get(&format!("/jobs/{job_id}")).await.json;
    let states: Vec<&str> = view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["state"].as_str())
        .collect();
    assert!(!states.contains(&"paused"), "the wait answered at once, never parked: {states:?}");
}

#[tokio::test]
async fn a_wait_that_times_out_fails_the_demo_job_saying_so() {
    stack();
    let api = Api::new(&principal("signal-timeout"));
    let job_id = api.submit(&waiting("approval", 1)).await;
    parked(&api, &job_id).await;
    // The reaper finds the wait timed out (its `until` a second after it parked), records it,
    // and resumes the job; its stage is told, and the demo fails.
    let ended = fire_until(&api, &job_id, "reaper", "the end", STILL, |j| {
        matches!(j["status"].as_str(), Some("failed" | "succeeded" | "cancelled"))
    })
    .await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(ended["error"]["message"], "waited 1 s for signal approval; it did not come");
    let late = api.post_json(&format!("/jobs/{job_id}/signals/approval"), &json!({})).await;
    assert_eq!(late.status, 409, "{}", late.text);
}
