//! The execution engine against the local stack, with the stage's deadline shortened to
//! ~2 s per invocation (`LONGHAUL_STAGE_MARGIN_SECONDS` = timeout − 2), a checkpoint every
//! 10 items, and a new execution every 3 runs — so continuation, crashes and resumption
//! happen within seconds. Its own test binary, so these settings touch no other test.

use longhaul_domain::JobId;
use std::time::Duration;

use longhaul_job_demo::DemoResult;
use longhaul_tests::{Api, Aws, Deadline, Harness, harness_with, principal};
use serde_json::{Value, json};

const CHECKPOINT_ITEMS: u64 = 10;
const TIMEOUT: Duration = Duration::from_secs(120);

/// Held by the tests that install a fault plan: the plan is the stack's, one at a time.
static FAULT_PLAN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_STAGE_MARGIN_SECONDS", "898"),
        ("LONGHAUL_CHECKPOINT_ITEMS", "10"),
        ("LONGHAUL_RUNS_PER_EXECUTION", "3"),
        ("LONGHAUL_PROGRESS_INTERVAL_MS", "100"),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "1"),
    ])
}

/// [`Api::wait_for`], failing at once if the job ends before `pred` holds.
async fn wait_for(api: &Api, job_id: &JobId, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    api.wait_for(job_id, what, |job| {
        pred(job) || {
            assert!(
                !matches!(job["status"].as_str(), Some("succeeded" | "failed" | "cancelled")),
                "ended before {what}: {job}"
            );
            false
        }
    })
    .await
}

async fn executions_of(aws: &Aws, job_id: &JobId) -> Vec<String> {
    aws.executions_named(job_id.as_str()).await
}

/// Crashes the stage invocation running `job_id` (the local stack kills it mid-run).
async fn crash_stage(job_id: &JobId) {
    let crash = reqwest::Client::new()
        .post(format!(
            "{}/_local/functions/StageFunction/crash?job_id={job_id}",
            stack().stack.api_url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(crash.status(), 200);
}

#[tokio::test]
async fn long_jobs_continue_across_invocations_and_executions() {
    stack();
    let owner = principal("long");
    let api = Api::new(&owner);
    // ~9 s of work in ~2 s slices: the direct run's, then at least 3 runs of the execution
    // that takes it over, and more than 3 means a new execution.
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 180, "item_ms": 50}})).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 1, "continuation keeps the attempt and its lease");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(180)
    );
    let aws = Aws::new().await;
    let executions = executions_of(&aws, &job_id).await;
    assert!(executions.len() >= 2, "continued as a new execution: {executions:?}");
    // The record names the execution that ran the job last (the one the reaper would stop).
    let record = aws.items_of(&owner).await;
    let job_record = record.iter().find(|i| i["sk"].as_s().unwrap() == "JOB").expect("the job");
    let named = job_record["execution"].as_s().unwrap();
    assert!(named.contains(".a1c"), "still names the first execution: {named}");
    assert!(executions.iter().any(|e| e == named), "{named} is not one of {executions:?}");
    let mut runs = 0;
    for name in &executions {
        runs += aws.scheduled_tasks(name).await.iter().filter(|s| *s == "Run").count();
    }
    assert!(runs >= 3, "{runs} runs");
}

#[tokio::test]
async fn a_crash_mid_run_resumes_from_the_last_checkpoint() {
    stack();
    let api = Api::new(&principal("crash"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 120, "item_ms": 15}})).await;
    wait_for(&api, &job_id, "30 items", |j| {
        j["progress"]["items_done"].as_u64().unwrap_or(0) >= 30
    })
    .await;
    crash_stage(&job_id).await;
    let aws = Aws::new().await;
    let progress = aws.progress_record(&job_id).await;
    let key = progress.checkpoint_key.clone().expect("a checkpoint before the crash");
    let object = aws
        .s3
        .get_object()
        .bucket(stack().stack.resource("DataBucket"))
        .key(&key)
        .send()
        .await
        .unwrap();
    let checkpoint: Value =
        serde_json::from_slice(&object.body.collect().await.unwrap().into_bytes()).unwrap();
    let resumed_from = checkpoint["state"]["next_item"].as_u64().unwrap();
    let rework = progress.items_done - resumed_from;
    assert!(
        rework <= CHECKPOINT_ITEMS,
        "rework of {rework} items is more than one checkpoint interval"
    );

    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(120)
    );
}

/// A fanned-out stage on the deployed engine: the `FanOut` map runs its shards at once, each
/// in its own invocation; a crashed shard is retried alone from its checkpoint; the progress
/// sums the shards' items and never goes back; the result is the digest of the shards'
/// digests in shard order.
#[tokio::test]
async fn a_fanned_out_stage_runs_its_shards_across_invocations_and_a_crash() {
    stack();
    let api = Api::new(&principal("shards"));
    // Each shard takes at least 40 × 50 ms: the four overlap however slow the machine is.
    let params = json!({"items": 160, "item_ms": 50, "shards": 4});
    let job_id = api.submit(&json!({"type": "demo", "params": params})).await;
    let last_done = std::cell::Cell::new(0);
    let most_running = std::cell::Cell::new(0);
    let job = wait_for(&api, &job_id, "60 items", |job| {
        let done = job["progress"]["items_done"].as_u64().unwrap_or(0);
        assert!(done >= last_done.get(), "progress went back: {last_done:?}→{done}");
        last_done.set(done);
        let running = job["progress"]["shards"]["running"].as_u64().unwrap_or(0);
        most_running.set(most_running.get().max(running));
        done >= 60
    })
    .await;
    assert_eq!(job["progress"]["items_total"], 160, "the shards' items summed: {job}");
    let shards = &job["progress"]["shards"];
    assert_eq!(shards["total"], 4, "{job}");
    let sum: u64 = ["pending", "running", "succeeded", "failed"]
        .iter()
        .map(|k| shards[k].as_u64().unwrap())
        .sum();
    assert_eq!(sum, 4, "{job}");
    assert!(most_running.get() >= 2, "the shards ran at once: {job}");
    crash_stage(&job_id).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let shards = &job["progress"]["shards"];
    assert_eq!(
        (&shards["succeeded"], &shards["pending"], &shards["running"]),
        (&json!(4), &json!(0), &json!(0)),
        "{job}"
    );
    assert!(shards["attempts"].as_u64().unwrap() >= 4, "{job}");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected_sharded(160, 4)
    );
}

/// A cancellation reaches every running shard of a fanned-out stage at its next progress
/// write: the job ends `cancelled`, without a result, once the map is done with them.
#[tokio::test]
async fn cancelling_a_fanned_out_job_stops_every_shard() {
    stack();
    let api = Api::new(&principal("shards-cancel"));
    let params = json!({"items": 400, "item_ms": 50, "shards": 4});
    let job_id = api.submit(&json!({"type": "demo", "params": params})).await;
    wait_for(&api, &job_id, "shards running", |j| {
        j["progress"]["shards"]["running"].as_u64().unwrap_or(0) >= 2
            && j["progress"]["items_done"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    assert!(job["progress"]["items_done"].as_u64().unwrap() < 400, "stopped early: {job}");
    assert!(Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty());
    // Stopped before all were done, and the counts still add up to the shards.
    let shards = &job["progress"]["shards"];
    assert!(shards["succeeded"].as_u64().unwrap() < 4, "{job}");
    let sum: u64 = ["pending", "running", "succeeded", "failed"]
        .iter()
        .map(|k| shards[k].as_u64().unwrap())
        .sum();
    assert_eq!(sum, 4, "{job}");
}

#[tokio::test]
async fn a_checkpoint_of_another_schema_version_is_never_consumed() {
    stack();
    let api = Api::new(&principal("schema"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 100, "item_ms": 15}})).await;
    wait_for(&api, &job_id, "a checkpoint", |j| {
        j["progress"]["items_done"].as_u64().unwrap_or(0) >= 25
    })
    .await;
    let aws = Aws::new().await;
    let key = aws.progress_record(&job_id).await.checkpoint_key.expect("a checkpoint");
    // A checkpoint from a future schema with a state that would corrupt the result if read.
    let forged = json!({"schema_version": 999, "stage": "process", "attempt": 1, "written_at": "2026-01-01T00:00:00Z",
        "state": {"next_item": 90, "digest": "00"}});
    aws.s3
        .put_object()
        .bucket(stack().stack.resource("DataBucket"))
        .key(&key)
        .body(forged.to_string().into_bytes().into())
        .send()
        .await
        .unwrap();
    reqwest::Client::new()
        .post(format!(
            "{}/_local/functions/StageFunction/crash?job_id={job_id}",
            stack().stack.api_url
        ))
        .send()
        .await
        .unwrap();
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(100),
        "the stage restarted instead of consuming the mismatched checkpoint"
    );
}

#[tokio::test]
async fn stale_leases_and_duplicate_executions_change_nothing() {
    stack();
    let api = Api::new(&principal("stale"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 60, "item_ms": 20}})).await;
    wait_for(&api, &job_id, "running", |j| j["status"] == "running").await;
    let invoke = |payload: Value| async move {
        let url = format!(
            "{}/2015-03-31/functions/{}/invocations",
            stack().stack.edge_url,
            stack().stack.template.physical_name("StageFunction").unwrap()
        );
        let response = reqwest::Client::new().post(url).json(&payload).send().await.unwrap();
        let error =
            response.headers().get("x-amz-function-error").map(|v| v.to_str().unwrap().to_owned());
        (error, response.json::<Value>().await.unwrap())
    };
    let forged = json!({"attempt": 1, "token": "not-the-lease"});
    let (error, body) = invoke(json!({"op": "work", "job_id": job_id, "execution": job_id, "state": {"job_id": job_id, "lease": forged}})).await;
    assert_eq!(
        (error.as_deref(), body["errorType"].as_str()),
        (Some("Unhandled"), Some("Job.LeaseLost")),
        "{body}"
    );
    // Another execution's first call cannot claim a running job; nor can its failure end it.
    let (_, body) = invoke(json!({"op": "work", "job_id": job_id, "execution": "another", "state": {"job_id": job_id}})).await;
    assert_eq!(body["errorType"], "Job.NotClaimable", "{body}");
    let (error, _) = invoke(
        json!({"op": "fail", "job_id": job_id, "execution": "another", "state": {"job_id": job_id},
        "error": {"Error": "States.Timeout", "Cause": "another execution"}}),
    )
    .await;
    assert_eq!(error, None, "nothing of the job is that execution's to record");
    // A forged lease can neither fail the job nor schedule its retry.
    for error in ["Job.Fatal", "Job.Retryable"] {
        let (_, body) = invoke(json!({"op": "fail", "job_id": job_id,
            "state": {"job_id": job_id, "lease": forged},
            "error": {"Error": error, "Cause": "forged"}}))
        .await;
        assert_eq!(body["errorType"], "Job.LeaseLost", "{body}");
    }
    // The previous definition's ops are gone: refused, nothing done.
    let (error, _) = invoke(json!({"op": "complete", "job_id": job_id, "lease": forged,
        "run": {"next": "done", "result_key": format!("results/{job_id}/forged.json")}}))
    .await;
    assert_eq!(error.as_deref(), Some("Unhandled"));

    // A second execution for the same job (in its worker, as every start names) cannot claim it.
    let aws = Aws::new().await;
    let worker = format!(
        "arn:aws:lambda:us-east-1:123456789012:function:{}",
        stack().stack.template.physical_name("StageFunction").unwrap()
    );
    let duplicate = aws
        .sfn
        .start_execution()
        .state_machine_arn(stack().stack.resource("JobStateMachine"))
        .name(format!("{job_id}-duplicate"))
        .input(json!({"job_id": job_id, "worker_arn": worker}).to_string())
        .send()
        .await
        .unwrap();

    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 1);
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(60)
    );
    let deadline = Deadline::new("the duplicate execution to end", TIMEOUT);
    loop {
        let described = aws
            .sfn
            .describe_execution()
            .execution_arn(duplicate.execution_arn())
            .send()
            .await
            .unwrap();
        if described.status().as_str() != "RUNNING" {
            assert_eq!(
                described.status().as_str(),
                "FAILED",
                "the duplicate ends without touching the job"
            );
            return;
        }
        deadline.tick(Duration::from_millis(50), described.status().as_str()).await;
    }
}

#[tokio::test]
async fn progress_is_monotonic_with_an_eta_only_after_ten_percent() {
    stack();
    let api = Api::new(&principal("progress"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 150, "item_ms": 20}})).await;
    let (mut last_pct, mut last_done, mut saw_eta) = (-1.0, 0, false);
    loop {
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        let progress = &job["progress"];
        let pct = progress["pct"].as_f64().unwrap();
        let done = progress["items_done"].as_u64().unwrap_or(0);
        assert!(
            pct >= last_pct && done >= last_done,
            "progress went back: {last_pct}→{pct}, {last_done}→{done}"
        );
        if job["status"] == "running" {
            if pct < 10.0 {
                assert!(progress["eta"].is_null(), "an ETA before 10 %: {progress}");
            } else if progress["eta"].is_u64() {
                saw_eta = true;
            }
            if !progress["stage"].is_null() {
                assert_eq!(progress["stage"], "process");
                assert_eq!(
                    (progress["stage_index"].as_u64(), progress["stages_total"].as_u64()),
                    (Some(1), Some(1))
                );
            }
        }
        (last_pct, last_done) = (pct, done);
        if job["status"] == "succeeded" {
            break;
        }
        assert_eq!(
            job["status"].as_str().map(|s| s == "failed" || s == "cancelled"),
            Some(false),
            "{job}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(saw_eta, "an ETA once past 10 %");
}

fn report(input: &str) -> Value {
    json!({"type": "csv_report", "params": {
        "input": input, "group_by": ["region", "product"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "min", "column": "amount"},
                    {"op": "max", "column": "amount"}, {"op": "mean", "column": "amount"}],
    }})
}

/// ~30 MB of CSV: a scan that spans several 2-second invocations and 10 MiB checkpoints.
fn big_csv(seed: u64) -> (Vec<longhaul_tests::csvgen::Row>, Vec<u8>) {
    let rows = longhaul_tests::csvgen::Gen::new(seed).rows(900_000);
    let bytes = longhaul_tests::csvgen::csv_bytes(&rows);
    (rows, bytes)
}

#[tokio::test]
async fn a_crash_mid_scan_resumes_from_the_checkpoint_with_an_identical_report() {
    stack();
    let api = Api::new(&principal("scan-crash"));
    let (rows, bytes) = big_csv(5);
    let input = api.upload("big.csv", "text/csv", bytes).await;
    let job_id = api.submit(&report(&input)).await;
    let mib = 1024 * 1024;
    wait_for(&api, &job_id, "12 MiB scanned", |j| {
        j["progress"]["stage"] == "scan"
            && j["progress"]["items_done"].as_u64().unwrap_or(0) >= 12 * mib
    })
    .await;
    // csv_report runs in its own worker function (its policy's `worker`).
    reqwest::Client::new()
        .post(format!(
            "{}/_local/functions/CsvReportWorkerFunction/crash?job_id={job_id}",
            stack().stack.api_url
        ))
        .send()
        .await
        .unwrap();
    let aws = Aws::new().await;
    let progress = aws.progress_record(&job_id).await;
    let key = progress.checkpoint_key.clone().expect("a scan checkpoint before the crash");
    let object = aws
        .s3
        .get_object()
        .bucket(stack().stack.resource("DataBucket"))
        .key(&key)
        .send()
        .await
        .unwrap();
    let checkpoint: Value =
        serde_json::from_slice(&object.body.collect().await.unwrap().into_bytes()).unwrap();
    assert_eq!(checkpoint["stage"], "scan");
    let resumed_from = checkpoint["state"]["offset"].as_u64().unwrap();
    let rework = progress.items_done.saturating_sub(resumed_from);
    assert!(
        rework <= CHECKPOINT_ITEMS * mib + mib,
        "rework of {rework} bytes is more than one checkpoint interval"
    );

    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let result: Value = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    assert_eq!(result["rows_scanned"], 900_000);
    let (expected, invalid) = longhaul_tests::csvgen::expected(&rows);
    assert_eq!(result["invalid"]["amount"], invalid);
    for (a, e) in result["rows"].as_array().unwrap().iter().zip(&expected) {
        assert!(longhaul_tests::csvgen::rows_match(a, e), "{a} ≠ {e}");
    }
}

/// A render that died right after its checkpoint moved the progress record's pointer to the
/// rendered report (before the stage boundary) is done: the retry must not read that pointer
/// as the scan's output (it once failed the job with `Job.Fatal`).
#[tokio::test]
async fn a_render_that_died_after_its_checkpoint_is_done_on_retry() {
    stack();
    let _plan = FAULT_PLAN.lock().await;
    let api = Api::new(&principal("render-crash"));
    let rows = longhaul_tests::csvgen::Gen::new(17).rows(20_000);
    let input = api.upload("r.csv", "text/csv", longhaul_tests::csvgen::csv_bytes(&rows)).await;
    let job_id = api.submit(&report(&input)).await;
    // Crash the stage once, just after the progress write that points at the rendered report.
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let plan = json!({"crash_functions": ["CsvReportWorkerFunction"], "crash_after_call": 1.0, "max_crashes_per_job": 1,
        "crash_only": {"operation": "dynamodb:PutItem", "contains": format!("checkpoints/{job_id}/render/")}});
    let http = reqwest::Client::new();
    assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    let injected: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
    http.post(&faults).json(&json!({})).send().await.unwrap();
    assert_eq!(
        injected["injected"]["crash_sites"],
        json!({"CsvReportWorkerFunction dynamodb:PutItem after": 1}),
        "{injected}"
    );
    assert_eq!(job["status"], "succeeded", "{job}");
    let result: Value = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    let (expected, _) = longhaul_tests::csvgen::expected(&rows);
    assert_eq!(result["rows_scanned"], 20_000);
    for (a, e) in result["rows"].as_array().unwrap().iter().zip(&expected) {
        assert!(longhaul_tests::csvgen::rows_match(a, e), "{a} ≠ {e}");
    }
}

#[tokio::test]
async fn cancelling_mid_scan_ends_cancelled_without_a_result() {
    stack();
    let api = Api::new(&principal("scan-cancel"));
    let (_, bytes) = big_csv(9);
    let input = api.upload("big.csv", "text/csv", bytes).await;
    let job_id = api.submit(&report(&input)).await;
    wait_for(&api, &job_id, "scanning", |j| {
        j["progress"]["stage"] == "scan" && j["progress"]["items_done"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "cancelled", "{job}");
    assert!(Aws::new().await.keys(&format!("results/{job_id}/")).await.is_empty());
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 409);
}

/// A retry resumes: a 900-item job cancelled past item 300 keeps its last checkpoint, and
/// `POST /jobs/{id}/retry` starts the new job from it — it shows where it took over, and its
/// result equals an uninterrupted run's byte for byte. `{"from": "start"}` starts over.
#[tokio::test]
async fn a_retry_resumes_from_the_cancelled_jobs_last_checkpoint() {
    stack();
    let api = Api::new(&principal("resume"));
    // Long enough (9 s) that the cancellation lands well before the job's end.
    let body = json!({"type": "demo", "params": {"items": 900, "item_ms": 10}});
    let job_id = api.submit(&body).await;
    wait_for(&api, &job_id, "past item 300", |j| {
        j["progress"]["items_done"].as_u64().unwrap_or(0) > 300
    })
    .await;
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "cancelled");

    let retried = api.post_json(&format!("/jobs/{job_id}/retry"), &json!({})).await;
    assert_eq!(retried.status, 202, "{}", retried.text);
    let retry_id = retried.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let done = api.wait_terminal(&retry_id, TIMEOUT).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["retry_of"], job_id.as_str());
    let resumed = done["resumed_from"]["items_done"].as_u64().expect("resumed_from");
    assert!(resumed > 250, "resumed from item {resumed}: {done}");
    assert_eq!(done["resumed_from"]["stage"], "process");
    let result = api.result(&retry_id).await;
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&result).unwrap(),
        DemoResult::expected(900),
        "the resumed run's result differs from an uninterrupted run's"
    );
    let fresh = api.submit(&json!({"type": "demo", "params": {"items": 900, "item_ms": 0}})).await;
    api.wait_terminal(&fresh, TIMEOUT).await;
    assert_eq!(api.result(&fresh).await, result, "not byte for byte an uninterrupted run's");

    // From the start, on request; a body of any other shape is refused.
    let other = api.submit(&json!({"type": "demo", "params": {"items": 120, "item_ms": 50}})).await;
    wait_for(&api, &other, "a checkpoint", |j| j["progress"]["items_done"].as_u64() >= Some(20))
        .await;
    let reply = api.send("DELETE", &format!("/jobs/{other}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(api.wait_terminal(&other, TIMEOUT).await["status"], "cancelled");
    let bad = api.post_json(&format!("/jobs/{other}/retry"), &json!({"from": "middle"})).await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    let over = api.post_json(&format!("/jobs/{other}/retry"), &json!({"from": "start"})).await;
    assert_eq!(over.status, 202, "{}", over.text);
    let over =
        api.wait_terminal(&over.json["job_id"].as_str().unwrap().parse().unwrap(), TIMEOUT).await;
    assert_eq!(over["status"], "succeeded", "{over}");
    assert!(over.get("resumed_from").is_none(), "started over: {over}");
}

/// The owner cancels while the stage records the attempt's failure — after it read the job,
/// before its write that schedules the next attempt. That write is refused (the job carries
/// the cancellation) and the job ends `cancelled` at once: not `queued` for a day, holding its
/// slots, until its next claim would have seen the flag. (Here, not in retries.rs: the pause
/// strikes only an invocation that holds the lease in its input, i.e. after a `work` answered —
/// the short invocations here make the attempt fail in its third, after the direct run's and
/// the first of the execution that took the job over: at most 20 items of 100 ms in each.)
#[tokio::test]
async fn a_cancel_that_lands_while_the_failure_is_recorded_ends_the_job() {
    stack();
    let _plan = FAULT_PLAN.lock().await;
    let api = Api::new(&principal("cancel-in-backoff"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 60, "item_ms": 100, "fail_at": 50, "fail_kind": "transient", "fail_times": 5}}))
        .await;
    // Hold the write that schedules the next attempt (it names the next execution,
    // `<id>-2`: nothing else the stage writes does) for 4 s.
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let plan = json!({"pause_functions": ["StageFunction"], "pause_before_call": 1.0,
        "pause_ms": 4000, "max_pauses": 1,
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
    http.post(&faults).json(&json!({})).send().await.unwrap();
}
