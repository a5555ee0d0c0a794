//! A tenant's backlog is bounded: at `LONGHAUL_TENANT_MAX_PENDING` (2 here) of its jobs not
//! yet running, a `POST /jobs` or `POST /jobs/{id}/retry` whose job would wait (a delayed
//! start, a full running pool) answers `429` with `Retry-After` and writes nothing, until one
//! of its jobs runs or ends; one whose job takes a free running slot at once (one a tenant
//! here: `LONGHAUL_TENANT_MAX_RUNNING`) adds nothing to what waits and is accepted. Other
//! tenants are not counted against it.

use longhaul_domain::Owner;
use longhaul_tests::{Api, Aws, Harness, Reply, harness_with, principal};
use serde_json::{Value, json};

const MAX_PENDING: usize = 2;

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_TENANT_MAX_PENDING", MAX_PENDING.to_string().as_str()),
        ("LONGHAUL_TENANT_MAX_RUNNING", "1"),
    ])
}

/// A job that runs until it is cancelled (days of work): it holds its tenant's only slot.
fn endless() -> Value {
    json!({"type": "demo", "params": {"items": 10_000_000, "item_ms": 60_000}})
}

/// A job that stays pending for ten minutes (a delayed start): it counts until then.
fn delayed(items: u64) -> Value {
    json!({"type": "demo", "params": {"items": items}, "delay_seconds": 600})
}

fn assert_backlog_full(reply: &Reply) {
    assert_eq!(reply.status, 429, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{}", reply.text);
    assert_eq!(reply.json["type"], "/problems/backlog-full", "{}", reply.text);
    assert_eq!(reply.json["max_pending"], MAX_PENDING, "{}", reply.text);
    let retry_after: u64 = reply.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!(retry_after > 0, "{retry_after}");
}

/// The job records of `owner` (every item that is one).
async fn job_records(owner: &Owner) -> usize {
    let items = Aws::new().await.items_of(owner).await;
    items.iter().filter(|item| item["sk"].as_s().is_ok_and(|sk| sk == "JOB")).count()
}

#[tokio::test]
async fn a_tenants_jobs_not_yet_running_are_capped_and_a_refusal_writes_nothing() {
    stack();
    let owner = principal("backlog");
    let api = Api::new(&owner);
    let first = api.submit(&delayed(1)).await;
    api.submit(&delayed(2)).await;

    // Full: refused, nothing written — and the same key is free for a later try.
    let refused = api.submit_with_key(&delayed(3), "third").await;
    assert_backlog_full(&refused);
    assert_eq!(job_records(&owner).await, 2, "a refused submission wrote no job");

    // Another tenant is not counted against it.
    let other = Api::new(&principal("backlog-other"));
    other.submit(&delayed(1)).await;

    // A job that takes the tenant's free running slot waits for nothing: accepted. It holds
    // the slot from then on, so every job after it would wait.
    let running = api.submit(&endless()).await;

    // A job that ended leaves the backlog: the same request is accepted now.
    let cancel = api.send("DELETE", &format!("/jobs/{first}"), None, &[]).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    let accepted = api.submit_with_key(&delayed(3), "third").await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);

    // A retry is a submission too: full again, and it would wait for the slot: refused.
    let retry = api.send("POST", &format!("/jobs/{first}/retry"), None, &[]).await;
    assert_backlog_full(&retry);
    assert_eq!(job_records(&owner).await, 4, "the refused retry wrote no job");
    let cancel = api.send("DELETE", &format!("/jobs/{running}"), None, &[]).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
}

/// A job that started running is no longer in its owner's backlog.
#[tokio::test]
async fn a_job_that_runs_leaves_the_backlog() {
    stack();
    let api = Api::new(&principal("backlog-runs"));
    let quick = api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    let done = api.wait_terminal(&quick, std::time::Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    api.submit(&delayed(1)).await;
    // One job pending, one that ran: room for one more.
    let reply = api.post_json("/jobs", &delayed(2)).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_backlog_full(&api.post_json("/jobs", &delayed(3)).await);
}
