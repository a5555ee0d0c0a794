//! The expirer and record retention against the local stack: one run drains everything due
//! a page at a time (`LONGHAUL_EXPIRER_PAGE` = 2 here), a job is marked expired before its
//! objects go and a run that died half-way is finished by the next, and every ended job's
//! records carry a TTL (`LONGHAUL_RECORD_RETENTION_SECONDS`, 1 day here, so the tests see the
//! setting rather than the 30-day default).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::jobs::{JobRecord, JobStore, status_bucket};
use longhaul_domain::{JobId, JobStatus, Owner, format_rfc3339};
use longhaul_tests::{Api, Aws, Deadline, Harness, harness_with, principal};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
/// How long a succeeded job's result is kept.
const RESULT_TTL: Duration = Duration::from_secs(3);
const RETENTION_SECONDS: i64 = 86_400;

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_EXPIRER_PAGE", "2"),
        ("LONGHAUL_RESULT_TTL_SECONDS", RESULT_TTL.as_secs().to_string().as_str()),
        ("LONGHAUL_RECORD_RETENTION_SECONDS", "86400"),
    ])
}

/// The tests that fire the expirer take turns: a fault plan aimed at one test's job must not
/// crash a run another test is counting on.
static EXPIRER_RUNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Fires the expirer once: its output (200) or its error (502, a crashed or failed run).
async fn fire_expirer() -> (u16, Value) {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/schedules/expirer", stack().stack.api_url))
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    (status, reply.json::<Value>().await.unwrap_or_default())
}

async fn set_faults(plan: &Value) -> Value {
    let url = format!("{}/_local/faults", stack().stack.api_url);
    let http = reqwest::Client::new();
    let injected = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(http.post(&url).json(plan).send().await.unwrap().status(), 200);
    injected
}

fn table() -> String {
    stack().stack.resource("JobsTable")
}

async fn store() -> JobStore {
    JobStore::new(Aws::new().await.dynamodb.clone(), table())
}

/// A job's record (`sk` = `JOB` or `PROGRESS`) as stored, index keys and TTL included.
async fn raw(job_id: &JobId, sk: &str) -> HashMap<String, AttributeValue> {
    Aws::new()
        .await
        .dynamodb
        .get_item()
        .table_name(table())
        .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
        .key("sk", AttributeValue::S(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap_or_else(|| panic!("{job_id} has no {sk} record"))
}

fn expires_at(item: &HashMap<String, AttributeValue>) -> Option<i64> {
    item.get("expires_at").and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok())
}

/// The record's TTL is the retention after `from` (give or take the test's own delays).
fn assert_ttl(item: &HashMap<String, AttributeValue>, from: chrono::DateTime<chrono::Utc>) {
    let ttl = expires_at(item).unwrap_or_else(|| panic!("no expires_at on {item:?}"));
    let expected = from.timestamp() + RETENTION_SECONDS;
    assert!((ttl - expected).abs() <= 120, "expires_at {ttl}, expected about {expected}");
}

fn record(owner: &Owner, status: JobStatus) -> JobRecord {
    let at = format_rfc3339(chrono::Utc::now() - chrono::Duration::hours(1));
    JobRecord { status, ..longhaul_tests::seeded_job(owner, at) }
}

/// Stores a succeeded job whose result expires at `expires` (indexed as the stage leaves it).
async fn put_succeeded(owner: &Owner, expires: chrono::DateTime<chrono::Utc>) -> JobId {
    let job = record(owner, JobStatus::Succeeded);
    let mut item: HashMap<String, AttributeValue> = serde_dynamo::to_item(&job).unwrap();
    item.insert("pk".into(), AttributeValue::S(format!("JOB#{}", job.job_id)));
    item.insert("sk".into(), AttributeValue::S("JOB".into()));
    item.insert("gsi2pk".into(), AttributeValue::S(status_bucket("succeeded", &job.job_id)));
    item.insert("gsi2sk".into(), AttributeValue::S(format_rfc3339(expires)));
    Aws::new()
        .await
        .dynamodb
        .put_item()
        .table_name(table())
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
    job.job_id
}

#[tokio::test]
async fn one_run_expires_every_due_job_a_page_at_a_time() {
    stack();
    let _turn = EXPIRER_RUNS.lock().await;
    let owner = principal("drain");
    let now = chrono::Utc::now();
    let mut due = Vec::new();
    for _ in 0..6 {
        due.push(put_succeeded(&owner, now - chrono::Duration::minutes(1)).await);
    }
    let later = put_succeeded(&owner, now + chrono::Duration::days(1)).await;
    let (status, report) = fire_expirer().await;
    assert_eq!(status, 200, "{report}");
    let ran = chrono::Utc::now();
    // Pages of two: the six (spread over the shards) take more than one query somewhere.
    assert!(report["output"]["expired"].as_u64().unwrap() >= 6, "{report}");
    assert_eq!(report["output"]["budget_spent"], false, "{report}");
    let jobs = store().await;
    for job_id in &due {
        assert_eq!(jobs.job(job_id).await.unwrap().unwrap().status, JobStatus::Expired, "{job_id}");
        // Finished in the same run: records marked, out of the status index.
        let item = raw(job_id, "JOB").await;
        assert_ttl(&item, ran);
        assert!(!item.contains_key("gsi2pk"), "{job_id} is still indexed: {item:?}");
    }
    assert_eq!(jobs.job(&later).await.unwrap().unwrap().status, JobStatus::Succeeded);
}

/// The job is marked expired before its objects are deleted, so a run that dies after deleting
/// the result leaves a job that answers 410 (not a 303 to a deleted object); and the rest of
/// its follow-up (the checkpoints, the records' TTL, the index entry) is done by the next run.
#[tokio::test]
async fn a_run_that_died_mid_expiry_leaves_410_and_the_next_run_finishes_the_job() {
    stack();
    let _turn = EXPIRER_RUNS.lock().await;
    let api = Api::new(&principal("died-mid-expiry"));
    // A transient failure first: its checkpoint writes the progress record whose TTL the
    // follow-up sets (a job that ends before its first progress write has none).
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 2, "fail_at": 1}})).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    let aws = Aws::new().await;
    let checkpoint = format!("checkpoints/{job_id}/run/left-behind");
    // The demo's result is kept in its record; a larger kind's result is an object, deleted
    // first: one stands here for it (the crash below strikes just after its delete).
    let stored_result = format!("results/{job_id}/1/large.bin");
    for key in [&checkpoint, &stored_result] {
        aws.s3
            .put_object()
            .bucket(stack().stack.resource("DataBucket"))
            .key(key)
            .body(b"{}".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    // The run dies just after the result object's delete took effect.
    set_faults(&json!({"crash_functions": ["ExpirerFunction"], "crash_after_call": 1.0,
        "max_crashes_per_job": 1, "crash_only": {"operation": "s3:DeleteObject", "contains": job_id}}))
    .await;
    // Its result is due once its TTL has passed. (The plan goes before anything can fail.)
    let deadline = Deadline::new("the expirer to reach the job", RESULT_TTL * 40);
    let mut crashed = false;
    while !crashed && !deadline.passed() {
        crashed = fire_expirer().await.0 != 200;
        if !crashed {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let injected = set_faults(&json!({})).await;
    assert!(crashed, "the expirer never reached the job in {:?}: {injected}", RESULT_TTL * 40);
    assert_eq!(
        injected["injected"]["crash_sites"],
        json!({"ExpirerFunction s3:DeleteObject after": 1}),
        "{injected}"
    );
    assert!(aws.keys(&format!("results/{job_id}/")).await.is_empty());
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(job["status"], "expired", "{job}");
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 410);
    assert!(raw(&job_id, "JOB").await.contains_key("gsi2pk"), "the follow-up is not done yet");

    let (status, report) = fire_expirer().await;
    assert_eq!(status, 200, "{report}");
    assert!(report["output"]["resumed"].as_u64().unwrap() >= 1, "{report}");
    assert!(aws.keys(&format!("checkpoints/{job_id}/")).await.is_empty());
    let expired_at = chrono::DateTime::parse_from_rfc3339(job["finished_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    let item = raw(&job_id, "JOB").await;
    assert!(!item.contains_key("gsi2pk"), "{item:?}");
    assert_ttl(&item, expired_at);
    assert_ttl(&raw(&job_id, "PROGRESS").await, expired_at);
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 410);
}

#[tokio::test]
async fn failed_and_cancelled_jobs_get_their_ttl_in_the_write_that_ends_them() {
    stack();
    let owner = principal("ttl");
    let api = Api::new(&owner);
    // Failed by its stage.
    let failed = api
        .submit(
            &json!({"type": "demo", "params": {"items": 3, "fail_at": 1, "fail_kind": "fatal"}}),
        )
        .await;
    // Cancelled while running (its stage ends it).
    let running =
        api.submit(&json!({"type": "demo", "params": {"items": 600, "item_ms": 100}})).await;
    api.wait_for(&running, "running", |j| j["status"] == "running").await;
    let reply = api.send("DELETE", &format!("/jobs/{running}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    // Cancelled before it ran (the cancel function ends it).
    let pending = record(&owner, JobStatus::Pending);
    store().await.put_job(&pending).await.unwrap();
    let reply = api.send("DELETE", &format!("/jobs/{}", pending.job_id), None, &[]).await;
    assert!(reply.status < 300, "{} {}", reply.status, reply.text);

    for (job_id, status) in
        [(&failed, "failed"), (&running, "cancelled"), (&pending.job_id.clone(), "cancelled")]
    {
        let job = api.wait_terminal(job_id, TIMEOUT).await;
        assert_eq!(job["status"], status, "{job}");
        let ended = chrono::DateTime::parse_from_rfc3339(job["finished_at"].as_str().unwrap())
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_ttl(&raw(job_id, "JOB").await, ended);
    }
    // The progress record's TTL moved on with each write: a retention after the last one.
    for job_id in [&failed, &running] {
        let progress = Aws::new().await.progress_record(job_id).await;
        let last = progress.updated_at.as_datetime();
        assert_ttl(&raw(job_id, "PROGRESS").await, last);
    }
}
