//! Pause and resume against the local stack: a running demo job pauses at its checkpoint,
//! gives its tenant's only running slot to another job, runs nothing while paused, and resumed
//! finishes with the digest of a run never paused (no item lost or repeated); a job not yet
//! running pauses at once and a paused job is cancelled at once; the refusals say why.
//!
//! Its own stack: a tenant runs one job at a time (so a slot given back is seen), and a stage
//! invocation works about 5 s before it continues in the next (so the paused job is held by
//! an execution of the real state machine, as a long one is in AWS, which the pause ends).

use std::time::Duration;

use longhaul_domain::JobId;
use longhaul_tests::{Api, Harness, harness_with, principal};
use serde_json::{Value, json};

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_TENANT_MAX_RUNNING", "1"), ("LONGHAUL_STAGE_MARGIN_SECONDS", "895")])
}

/// The job's view once nothing about it moved for this long is a stuck job (the waits give
/// up only then, however slow the machine).
const STILL: Duration = Duration::from_secs(60);

/// A demo job long enough to be paused mid-run, in its second invocation or later: 600 items
/// of 50 ms (an invocation works about 5 s: 100 items at most), so that the pause, asked once
/// 150 are done, lands with at least 22 s of sleeps still ahead however slow the machine.
const ITEMS: u64 = 600;

fn long_demo() -> Value {
    json!({"type": "demo", "params": {"items": ITEMS, "item_ms": 50}})
}

async fn control(api: &Api, job_id: &JobId, action: &str, body: Value) -> (u16, Value) {
    let reply = api.post_json(&format!("/jobs/{job_id}/{action}"), &body).await;
    (reply.status, reply.json)
}

fn items_done(job: &Value) -> u64 {
    job["progress"]["items_done"].as_u64().unwrap_or(0)
}

fn digest(result: &[u8]) -> String {
    let result: Value = serde_json::from_slice(result).expect("a JSON result");
    assert_eq!(result["items"], ITEMS, "{result}");
    result["digest"].as_str().expect("a digest").to_owned()
}

#[tokio::test]
async fn a_running_job_pauses_at_its_checkpoint_frees_its_slot_and_resumes_without_losing_an_item()
{
    stack();
    let api = Api::new(&principal("pause-running"));
    let job_id = api.submit(&long_demo()).await;
    api.wait_for(&job_id, "running on", |j| j["status"] == "running" && items_done(j) >= 150).await;
    let record = longhaul_tests::job_store().await.job(&job_id).await.unwrap().expect("the job");
    assert_eq!(record.claimant, None, "an execution holds the job, not its direct run");

    let (status, asked) = control(&api, &job_id, "pause", json!({"reason": "month end"})).await;
    assert_eq!(status, 202, "{asked}");
    assert_eq!(asked["status"], "running", "the stage pauses at its next progress write");
    assert_eq!(asked["pause"]["reason"], "month end");
    let paused = api.wait_for(&job_id, "paused", |j| j["status"] == "paused").await;
    assert!(paused["pause"]["paused_at"].is_string(), "{paused}");
    assert!(paused["pause"]["lapses_at"].is_string(), "{paused}");
    let done_at_pause = items_done(&paused);
    assert!(done_at_pause < ITEMS, "paused before the end: {paused}");

    // Its tenant's one running slot is free: another of its jobs runs to its end meanwhile.
    let other = api.submit(&json!({"type": "demo", "params": {"items": 3, "item_ms": 10}})).await;
    let ended = api.wait_terminal(&other, STILL).await;
    assert_eq!(ended["status"], "succeeded", "{ended}");
    // …and the paused job ran nothing in all that time.
    let still = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!((still["status"].as_str(), items_done(&still)), (Some("paused"), done_at_pause));

    let (status, resumed) = control(&api, &job_id, "resume", json!({})).await;
    assert_eq!(status, 202, "{resumed}");
    assert_eq!(resumed["status"], "pending");
    let finished = api.wait_terminal(&job_id, STILL).await;
    assert_eq!(finished["status"], "succeeded", "{finished}");
    assert!(finished["paused_seconds"].as_u64().is_some(), "the pause is counted: {finished}");
    let states: Vec<&str> = finished["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["state"].as_str())
        .collect();
    assert!(states.windows(2).any(|w| w == ["running", "paused"]), "{states:?}");
    assert!(states.windows(2).any(|w| w == ["paused", "pending"]), "{states:?}");

    // The digest of the same work never paused: no item lost or repeated.
    let expected = longhaul_job_demo::domain::DemoResult::expected(ITEMS);
    assert_eq!(digest(&api.result(&job_id).await), expected.digest);
}

#[tokio::test]
async fn a_job_not_yet_running_pauses_at_once_and_a_paused_job_is_cancelled_at_once() {
    stack();
    let api = Api::new(&principal("pause-pending"));
    // A delayed job stays pending for the test's whole length.
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 3_600})).await;
    let (status, paused) = control(&api, &job_id, "pause", json!({})).await;
    assert_eq!(status, 202, "{paused}");
    assert_eq!(paused["status"], "paused");
    let (status, again) = control(&api, &job_id, "pause", json!({"reason": "again"})).await;
    assert_eq!(status, 200, "pausing a paused job changes nothing: {again}");
    assert!(again["pause"]["reason"].is_null(), "the first pause stands: {again}");
    let listed = api.get("/jobs?status=paused").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(listed.json["jobs"][0]["job_id"], job_id.as_str(), "{}", listed.text);

    let cancelled = api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.text);
    assert_eq!(cancelled.json["status"], "cancelled");
    for action in ["pause", "resume"] {
        let (status, problem) = control(&api, &job_id, action, json!({})).await;
        assert_eq!(status, 409, "{action}: {problem}");
        assert_eq!(problem["status_now"], "cancelled");
    }
}

#[tokio::test]
async fn another_principal_cannot_pause_or_resume_and_a_job_not_paused_cannot_resume() {
    stack();
    let api = Api::new(&principal("pause-owner"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 3_600})).await;
    let mallory = Api::new(&principal("pause-mallory"));
    for action in ["pause", "resume"] {
        let (status, problem) = control(&mallory, &job_id, action, json!({})).await;
        assert_eq!(status, 404, "{action}: {problem}");
    }
    let (status, problem) = control(&api, &job_id, "resume", json!({})).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["status_now"], "pending");
    let (status, problem) = control(&api, &job_id, "pause", json!({"reason": 7})).await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(api.get(&format!("/jobs/{job_id}")).await.json["status"], "pending");
}
