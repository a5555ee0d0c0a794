//! The walking skeleton, end to end against the local stack: submit → dispatch → Step
//! Functions (the real ASL) → stage → S3 → succeeded; retries, failures, auth, bad input,
//! and the AWS call meter.

use longhaul_domain::JobId;
use std::time::Duration;

use longhaul_job_demo::DemoResult;
use longhaul_tests::{Api, Aws, assert_counted_once, metric_points, principal};
use serde_json::{Value, json};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

fn states(job: &Value) -> Vec<String> {
    job["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_demo_job_runs_to_success_with_its_result_kept_in_its_record() {
    let api = Api::new(&principal("happy"));
    let reply = api
        .post_json("/jobs", &json!({"type": "demo", "params": {"items": 25, "item_ms": 5}}))
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let job_id = reply.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    assert_eq!(uuid::Uuid::parse_str(&job_id).unwrap().get_version_num(), 7);
    assert_eq!(reply.header("location"), Some(format!("/jobs/{job_id}").as_str()));
    assert!(reply.header("retry-after").is_some());
    assert_eq!(reply.json["status"], "queued", "started in the request: {}", reply.text);
    assert_eq!(reply.json["status_url"], format!("/jobs/{job_id}"));

    let job = api.wait_terminal(&job_id, JOB_TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(states(&job), ["pending", "queued", "running", "succeeded"]);
    assert_eq!(job["type"], "demo");
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["progress"]["pct"], 100.0);
    assert_eq!(job["result_url"], format!("/jobs/{job_id}/result"));

    let result: DemoResult = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    assert_eq!(result, DemoResult::expected(25));
    // One invocation finished it: a direct run, no execution (no state transition billed).
    assert!(!Aws::new().await.execution_exists(&job_id).await, "no execution");

    // A terminal job is cacheable and answers conditional requests.
    let first = api.get(&format!("/jobs/{job_id}")).await;
    let etag = first.header("etag").expect("terminal jobs have an ETag").to_owned();
    assert!(first.header("retry-after").is_none());
    let again =
        api.send("GET", &format!("/jobs/{job_id}"), None, &[("if-none-match", &etag)]).await;
    assert_eq!(again.status, 304);
}

#[tokio::test]
async fn a_live_job_says_when_to_poll_again() {
    let api = Api::new(&principal("live"));
    // Long enough (4 s) to be still live when asked, on a busy machine too.
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 80, "item_ms": 50}})).await;
    let reply = api.get(&format!("/jobs/{job_id}")).await;
    assert_eq!(reply.status, 200);
    assert_ne!(reply.json["status"], "succeeded", "the job should still be live: {}", reply.json);
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert!(reply.header("retry-after").is_some());
    assert!(reply.header("etag").is_none());
    // Progress only moves forward while the job runs.
    let mut last = -1.0;
    loop {
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        let pct = job["progress"]["pct"].as_f64().unwrap();
        assert!(pct >= last, "progress went back from {last} to {pct}");
        last = pct;
        if job["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_transient_failure_is_retried_by_the_state_machine() {
    let api = Api::new(&principal("transient"));
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 10, "fail_at": 4, "fail_kind": "transient", "fail_times": 1}}))
        .await;
    let job = api.wait_terminal(&job_id, JOB_TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 1, "a retry re-runs the task within the same attempt");
    // The direct run failed; an execution took the job over and its `Run` went on.
    let runs = Aws::new().await.scheduled_tasks(&job_id).await;
    assert_eq!(runs.iter().filter(|s| *s == "Run").count(), 1, "{runs:?}");
    // Resumed from the checkpoint: every item processed exactly once.
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(10)
    );
}

#[tokio::test]
async fn a_fatal_failure_fails_the_job_without_retries() {
    let api = Api::new(&principal("fatal"));
    let job_id = api
        .submit(
            &json!({"type": "demo", "params": {"items": 10, "fail_at": 3, "fail_kind": "fatal"}}),
        )
        .await;
    let job = api.wait_terminal(&job_id, JOB_TIMEOUT).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(states(&job), ["pending", "queued", "running", "failed"]);
    assert_eq!(job["error"]["code"], "Job.Fatal");
    assert!(job["error"]["message"].as_str().unwrap().contains("fatal failure at item 3"), "{job}");
    assert!(job.get("result_url").is_none());
    // The direct run recorded the failure itself: no retry, no execution.
    assert!(!Aws::new().await.execution_exists(&job_id).await, "no execution");
}

/// The reasons of the job's transitions into `queued` after it first ran: one per attempt
/// that failed and was retried after a backoff.
fn retry_reasons(job: &Value) -> Vec<String> {
    let transitions = job["transitions"].as_array().unwrap();
    let first_run = transitions.iter().position(|t| t["state"] == "running").unwrap_or(0);
    transitions[first_run..]
        .iter()
        .filter(|t| t["state"] == "queued")
        .map(|t| t["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_failure_that_outlasts_an_attempt_is_retried_in_the_next_attempt_after_a_backoff() {
    let api = Api::new(&principal("outage"));
    // Six failures: the first attempt's five tries (its direct run's, then the execution's
    // one and three state-machine retries) and the second's direct run. The local stack's
    // backoff step is a second.
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 10, "fail_at": 4, "fail_kind": "transient", "fail_times": 6}}))
        .await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(180)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 2, "{job}");
    assert!(job.get("error").is_none() && job.get("last_error").is_none(), "{job}");
    let reasons = retry_reasons(&job);
    assert_eq!(reasons.len(), 1, "{job}");
    assert!(reasons[0].starts_with("attempt 1 of 3 failed (Job.Retryable:"), "{reasons:?}");
    // The first execution ended when its attempt did, having scheduled the next.
    let aws = Aws::new().await;
    let runs = aws.scheduled_tasks(&job_id).await;
    assert_eq!(runs.iter().filter(|s| *s == "Run").count(), 4, "{runs:?}");
    assert_eq!(runs.last().map(String::as_str), Some("RecordFailure"), "{runs:?}");
    let entered = aws.states_entered(&job_id).await;
    assert_eq!(entered.last().map(String::as_str), Some("RetryScheduled"), "{entered:?}");
    // The second attempt resumed from the first's checkpoint: every item processed once.
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&api.result(&job_id).await).unwrap(),
        DemoResult::expected(10)
    );
}

#[tokio::test]
async fn retries_are_bounded_by_the_attempts_then_the_job_fails() {
    let api = Api::new(&principal("exhausted"));
    // Fails more often than three attempts of five tries each (a direct run's, then an
    // execution's four): the job fails with the last error after the third attempt.
    let job_id = api
        .submit(&json!({"type": "demo", "params": {"items": 3, "fail_at": 0, "fail_kind": "transient", "fail_times": 20}}))
        .await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(240)).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["attempt"], 3, "{job}");
    assert_eq!(job["error"]["code"], "Job.Retryable");
    assert_eq!(retry_reasons(&job).len(), 2, "{job}");
    let runs = Aws::new().await.scheduled_tasks(&job_id).await;
    assert_eq!(
        runs.iter().filter(|s| *s == "Run").count(),
        4,
        "after the direct run, one try and three retries in the execution: {runs:?}"
    );
}

/// Cancelling a running job keeps where it got to: the stage, asked to stop, saves a final
/// checkpoint (here long before its kind's cadence — 1,000 items or a minute — would), and a
/// retry of the cancelled job resumes from exactly there.
#[tokio::test]
async fn cancelling_a_running_job_saves_a_final_checkpoint_that_a_retry_resumes_from() {
    let api = Api::new(&principal("final-checkpoint"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 400, "item_ms": 20}})).await;
    api.wait_for(&job_id, "past item 50", |j| j["progress"]["items_done"].as_u64() > Some(50))
        .await;
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let cancelled = api.wait_terminal(&job_id, JOB_TIMEOUT).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let stopped_at = cancelled["progress"]["items_done"].as_u64().unwrap();
    assert!((50..400).contains(&stopped_at), "{cancelled}");

    let retried = api.post_json(&format!("/jobs/{job_id}/retry"), &json!({})).await;
    assert_eq!(retried.status, 202, "{}", retried.text);
    let retried_id: JobId = retried.json["job_id"].as_str().unwrap().parse().unwrap();
    let done = api.wait_terminal(&retried_id, JOB_TIMEOUT).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["resumed_from"]["items_done"], stopped_at, "{done}");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(
            &api.result(&done["job_id"].as_str().unwrap().parse().unwrap()).await
        )
        .unwrap(),
        DemoResult::expected(400)
    );
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401() {
    let anonymous = Api::anonymous();
    let reply =
        anonymous.post_json("/jobs", &json!({"type": "demo", "params": {"items": 1}})).await;
    assert_eq!(reply.status, 401);
    assert_eq!(anonymous.get("/jobs/01a201a7-1000-711d-99cc-fc962b49387c").await.status, 401);
    let mut forged = Api::new(&principal("forged"));
    forged.token = Some(forged.token.unwrap() + "x");
    assert_eq!(forged.get("/jobs/01a201a7-1000-711d-99cc-fc962b49387c").await.status, 401);
}

#[tokio::test]
async fn unknown_ids_and_other_tenants_jobs_read_the_same_404() {
    let owner = Api::new(&principal("owner"));
    let stranger = Api::new(&principal("stranger"));
    let job_id = owner.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    let theirs = stranger.get(&format!("/jobs/{job_id}")).await;
    let unknown = stranger.get(&format!("/jobs/{}", uuid::Uuid::now_v7())).await;
    let garbage = stranger.get("/jobs/not-a-job-id").await;
    for reply in [&theirs, &unknown, &garbage] {
        assert_eq!(reply.status, 404);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    }
    assert_eq!(
        theirs.text, unknown.text,
        "another tenant's job must be indistinguishable from none"
    );
    assert_eq!(owner.get(&format!("/jobs/{job_id}")).await.status, 200);
}

#[tokio::test]
async fn bad_submissions_get_problem_json_and_write_nothing() {
    let who = principal("hostile");
    let api = Api::new(&who);
    let cases: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        ("malformed JSON", "application/json", b"{\"type\": \"demo\",".to_vec(), 400),
        ("not an object", "application/json", b"[1, 2]".to_vec(), 400),
        (
            "unknown type",
            "application/json",
            br#"{"type": "mine-bitcoin", "params": {}}"#.to_vec(),
            422,
        ),
        (
            "bad params",
            "application/json",
            br#"{"type": "demo", "params": {"items": -1}}"#.to_vec(),
            422,
        ),
        (
            "unknown field",
            "application/json",
            br#"{"type": "demo", "params": {"items": 1}, "x": 1}"#.to_vec(),
            400,
        ),
        (
            "huge number",
            "application/json",
            br#"{"type": "demo", "params": {"items": 1e400}}"#.to_vec(),
            400,
        ),
        (
            "wrong content type",
            "text/plain",
            br#"{"type": "demo", "params": {"items": 1}}"#.to_vec(),
            415,
        ),
        (
            "oversized body",
            "application/json",
            format!(r#"{{"type": "demo", "params": {{"pad": "{}"}}}}"#, "x".repeat(70_000))
                .into_bytes(),
            413,
        ),
        (
            "deep nesting",
            "application/json",
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            400,
        ),
    ];
    for (name, content_type, body, status) in cases {
        let reply = api.send("POST", "/jobs", Some((content_type, body)), &[]).await;
        assert_eq!(reply.status, status, "{name}: {}", reply.text);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{name}");
        assert_eq!(reply.json["status"], status, "{name}");
        assert!(reply.json["type"].as_str().is_some_and(|t| t.starts_with("/problems/")), "{name}");
        assert!(reply.json["title"].is_string() && reply.json["detail"].is_string(), "{name}");
    }
    assert!(
        Aws::new().await.items_of(&who).await.is_empty(),
        "a refused request wrote to the table"
    );
}

#[tokio::test]
async fn the_call_meter_counts_what_a_job_costs() {
    let api = Api::new(&principal("meter"));
    let before = api.get("/_local/aws-calls").await.json;
    let by_function_before = api.get("/_local/aws-calls/by-function").await.json;
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    assert_eq!(api.wait_terminal(&job_id, JOB_TIMEOUT).await["status"], "succeeded");
    let after = api.get("/_local/aws-calls").await.json;
    let by_function_after = api.get("/_local/aws-calls/by-function").await.json;
    let delta = |key: &str| after[key].as_u64().unwrap_or(0) - before[key].as_u64().unwrap_or(0);
    // Other tests run alongside, so these are lower bounds of this job's own calls.
    assert!(delta("dynamodb:PutItem") >= 2, "idempotency record and job record");
    assert!(delta("lambda:Invoke") >= 1, "one direct run claims, runs and completes the job");
    let submits = |calls: &Value| calls["SubmitFunction"]["lambda:Invoke"].as_u64().unwrap_or(0);
    assert!(
        submits(&by_function_after) > submits(&by_function_before),
        "submit starts the job itself: {by_function_after}"
    );
    assert!(delta("dynamodb:UpdateItem") >= 3, "queued, running, succeeded");
}

#[tokio::test]
async fn functions_emit_cloudwatch_metrics_as_emf() {
    let api = Api::new(&principal("metrics"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    assert_eq!(api.wait_terminal(&job_id, JOB_TIMEOUT).await["status"], "succeeded");
    // This job's life, each counted once.
    for name in ["JobsSubmitted", "JobsSucceeded"] {
        assert_counted_once(name, &job_id).await;
    }
    for name in ["QueueWait", "JobDuration"] {
        let points = metric_points(name, &job_id, 1).await;
        assert_eq!(points.len(), 1, "{name}: {points:?}");
        assert_eq!(points[0]["JobType"], "demo");
        assert!(points[0][name].as_f64().unwrap() >= 0.0, "{:?}", points[0]);
    }
    // Each line is a valid EMF document: the metric it declares is a member of it.
    let lines = api.get("/_local/metrics").await.json;
    for line in lines.as_array().unwrap() {
        let declared = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(declared["Namespace"], "longhaul");
        assert_eq!(declared["Dimensions"], json!([["JobType"], []]));
        assert!(line["_aws"]["Timestamp"].is_i64());
        let name = declared["Metrics"][0]["Name"].as_str().unwrap();
        assert!(line[name].is_number(), "{line}");
        assert!(line["JobType"].is_string());
        assert!(line["job_id"].is_string(), "each data point names its job: {line}");
    }
    assert!(metric_points("JobsFailed", &job_id, 0).await.is_empty());
}
