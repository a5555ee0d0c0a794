//! The reaper's sweeps at any count: with a page of two (`LONGHAUL_REAPER_PAGE=2`), a run
//! still judges every running job, not only the two oldest; and a pending job whose dispatch
//! is held back longer than many reaper runs is not failed for it.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::jobs::{JobStore, TransitionRequest, status_bucket};
use longhaul_domain::{JobId, JobStatus, Owner, format_rfc3339};
use longhaul_tests::{Api, Aws, Harness, fire, harness_with, principal, seeded_job};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_REAPER_PAGE", "2"),
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", "3"),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("LONGHAUL_PENDING_GRACE_SECONDS", "2"),
        ("LONGHAUL_QUEUED_GRACE_SECONDS", "2"),
        ("LONGHAUL_MAX_ATTEMPTS", "3"),
    ])
}

async fn store() -> JobStore {
    JobStore::new(Aws::new().await.dynamodb.clone(), stack().stack.resource("JobsTable"))
}

/// Stores a job as a stage leaves it after claiming it (its execution, which nothing runs,
/// named `<id>-seeded`), and returns its id. Every such job is in shard 0 of the running
/// bucket, so that a page of two holds only two of them.
async fn put_running(jobs: &JobStore, owner: &Owner) -> JobId {
    let now = format_rfc3339(chrono::Utc::now());
    let mut job = seeded_job(owner, now.clone());
    while status_bucket("running", &job.job_id) != "running#0" {
        job.job_id = longhaul_domain::JobId::new();
    }
    jobs.put_job(&job).await.unwrap();
    let execution = format!("{}-seeded", job.job_id);
    jobs.transition(
        TransitionRequest::new(&job.job_id, &[JobStatus::Pending], JobStatus::Queued, "dispatched")
            .set("execution", &execution)
            .set("dispatches", 1)
            .indexed_at(now),
    )
    .await
    .unwrap();
    jobs.claim(&job.job_id, &execution).await.unwrap();
    job.job_id
}

/// A long job that is alive: its heartbeat and progress are fresh for as long as the test runs.
async fn keep_alive(job_id: &JobId) {
    Aws::new()
        .await
        .dynamodb
        .update_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
        .key("sk", AttributeValue::S("PROGRESS".into()))
        .update_expression("SET heartbeat_at = :later, progress_changed_at = :later")
        .expression_attribute_values(":later", AttributeValue::S("2099-01-01T00:00:00Z".into()))
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_zombie_claimed_after_two_healthy_long_jobs_is_rescued_within_two_runs() {
    stack();
    let owner = principal("sweep");
    let api = Api::new(&owner);
    let jobs = store().await;
    // Two long, healthy jobs hold the oldest places of the running bucket: with a page of two,
    // a reaper that read only the first page would look at nothing else.
    for _ in 0..2 {
        let healthy = put_running(&jobs, &owner).await;
        keep_alive(&healthy).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let zombie = put_running(&jobs, &owner).await;
    // Past its heartbeat timeout (3 s)...
    tokio::time::sleep(Duration::from_secs(4)).await;
    // ...two runs rescue it (one is enough; the second allows for a run that began just
    // before the timeout passed).
    let mut rescued = Value::Null;
    for _ in 0..2 {
        fire("reaper").await;
        rescued = api.get(&format!("/jobs/{zombie}")).await.json;
        if rescued["attempt"].as_u64() >= Some(2) {
            break;
        }
    }
    assert!(rescued["attempt"].as_u64() >= Some(2), "not rescued in two runs: {rescued}");
    assert_eq!(api.wait_terminal(&zombie, TIMEOUT).await["status"], "succeeded");
}

#[tokio::test]
async fn a_pending_job_held_back_longer_than_six_reaper_runs_is_not_failed() {
    stack();
    let owner = principal("backlog");
    let api = Api::new(&owner);
    let jobs = store().await;
    // Accepted a while ago and never dispatched (as if its message were lost or waiting).
    let job =
        seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::seconds(30)));
    jobs.put_job(&job).await.unwrap();
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let http = reqwest::Client::new();
    let throttle = json!({"throttle": 1.0,
        "throttle_only": {"operation": "lambda:Invoke|states:StartExecution", "contains": job.job_id}});
    assert_eq!(http.post(&faults).json(&throttle).send().await.unwrap().status(), 200);
    // Every start of it — its direct run's invocation, an execution the reaper starts — is
    // throttled across eight runs, each past the grace: a reaper that counted its looks gave
    // up on the sixth.
    for _ in 0..8 {
        fire("reaper").await;
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    }
    let held = api.get(&format!("/jobs/{}", job.job_id)).await.json;
    let injected: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
    assert!(injected["injected"]["throttled"].as_u64() >= Some(1), "{injected}");
    assert!(held["status"] == "pending" || held["status"] == "queued", "{held}");
    // The throttling lifts: the job runs and succeeds.
    http.post(&faults).json(&json!({})).send().await.unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let now = api.get(&format!("/jobs/{}", job.job_id)).await.json;
        if now["status"] != "pending" && now["status"] != "queued" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never dispatched: {now}");
        fire("reaper").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(api.wait_terminal(&job.job_id, TIMEOUT).await["status"], "succeeded");
}

/// The owner and status indexes project exactly what `JobEntry` reads: no params (up to ~50 KB
/// a job), no transition log, no error. The template and the code name the same attributes, and
/// an entry read back from the status index carries nothing else. The backlog index, which is
/// only counted, projects keys only.
#[tokio::test]
async fn the_indexes_hold_only_what_the_sweeps_and_the_listing_read() {
    let template = &stack().stack.template;
    let table = &template.resources["JobsTable"]["Properties"];
    let mut read = longhaul_aws::jobs::INDEX_ATTRIBUTES.to_vec();
    read.sort();
    for index in table["GlobalSecondaryIndexes"].as_array().unwrap() {
        if index["IndexName"] == longhaul_aws::jobs::BACKLOG_INDEX {
            assert_eq!(index["Projection"]["ProjectionType"], "KEYS_ONLY", "{index}");
            continue;
        }
        assert_eq!(index["Projection"]["ProjectionType"], "INCLUDE", "{index}");
        let mut projected: Vec<&str> = index["Projection"]["NonKeyAttributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        projected.sort();
        assert_eq!(projected, read, "{}", index["IndexName"]);
    }

    let owner = principal("projection");
    let jobs = store().await;
    let mut job =
        seeded_job(&owner, format_rfc3339(chrono::Utc::now() - chrono::Duration::days(3)));
    job.params = json!({"items": 3, "padding": "x".repeat(20_000)});
    jobs.put_job(&job).await.unwrap();
    let page = jobs
        .due_page(
            "pending",
            status_bucket("pending", &job.job_id)[8..].parse().unwrap(),
            &format_rfc3339(chrono::Utc::now() - chrono::Duration::days(2)),
            1_000,
            None,
        )
        .await
        .unwrap();
    let item = page
        .items
        .into_iter()
        .find(|i| i.get("job_id").and_then(|v| v.as_s().ok()) == Some(&job.job_id.to_string()))
        .expect("the entry is in the index");
    let mut names: Vec<&str> = item.keys().map(String::as_str).collect();
    names.sort();
    assert!(!names.contains(&"params") && !names.contains(&"transitions"), "{names:?}");
    let entry = JobStore::entry_from(item.clone()).unwrap();
    assert_eq!((entry.job_id, entry.status), (job.job_id.clone(), JobStatus::Pending));
    // Taken out of the way of the other tests' sweeps (it is older than any grace).
    Aws::new()
        .await
        .dynamodb
        .delete_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(format!("JOB#{}", job.job_id)))
        .key("sk", AttributeValue::S("JOB".into()))
        .send()
        .await
        .unwrap();
}
