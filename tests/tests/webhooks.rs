//! Partner webhooks against the local stack: a local receiver verifies Standard Webhooks
//! signatures; retries are compressed to one second apart (`LONGHAUL_WEBHOOK_SCHEDULE_SECONDS`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use longhaul_aws::jobs::{JobStore, TransitionRequest};
use longhaul_aws::queue::WebhookMessage;
use longhaul_domain::webhooks::SecretString;
use longhaul_domain::{JobId, JobStatus, Transition};
use longhaul_tests::partner::{Received, partner_url, received_until};
use longhaul_tests::{
    Api, Aws, Deadline, Harness, assert_counted_once, harness_with, metric_points, principal,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);

/// What a receiver checks (constant time), with a secret as the API hands it out.
fn verify(secret: &str, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    longhaul_domain::webhooks::verify(&SecretString::from(secret), id, timestamp, body, header)
}

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1"),
        ("LONGHAUL_WEBHOOK_SCHEDULE_SECONDS", "1,1,1"),
        ("LONGHAUL_WEBHOOK_TIMEOUT_MS", "500"),
    ])
}

/// What the receiver got for `key`, once it got `at_least` requests (the job has ended; its
/// retries are a second apart).
async fn received(key: &str, at_least: usize) -> Vec<Received> {
    let what = format!("{at_least} requests");
    received_until(key, &what, TIMEOUT, |got| got.len() >= at_least).await
}

/// The job's recorded deliveries, once there are `at_least`.
async fn deliveries(api: &Api, job_id: &JobId, at_least: usize) -> Vec<Value> {
    let deadline = Deadline::new(format!("{at_least} deliveries recorded for {job_id}"), TIMEOUT);
    loop {
        let reply = api.get(&format!("/jobs/{job_id}/deliveries")).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let list = reply.json["deliveries"].as_array().unwrap().clone();
        if list.len() >= at_least {
            return list;
        }
        deadline.tick(Duration::from_millis(50), reply.text).await;
    }
}

async fn secrets(api: &Api) -> Vec<String> {
    let reply = api.get("/webhooks/secret").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["secret"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_terminal_event_is_delivered_signed() {
    stack();
    let api = Api::new(&principal("partner"));
    let secret = secrets(&api).await.remove(0);
    assert_eq!(secrets(&api).await, std::slice::from_ref(&secret), "the secret is stable");
    let (url, key) = partner_url("ok");
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 2}, "callback_url": url})).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    let got = received(&key, 1).await;
    let message = &got[0];
    assert!(
        verify(&secret, message.id(), message.timestamp(), &message.body, message.signature()),
        "signature verifies"
    );
    assert!((chrono::Utc::now().timestamp() - message.timestamp()).abs() < 60);
    let payload: Value = serde_json::from_slice(&message.body).unwrap();
    assert_eq!(payload["type"], "job.succeeded");
    assert_eq!(payload["job_id"], job_id.as_str());
    assert_eq!(payload["status"], "succeeded");
    assert_eq!(payload["result_url"], format!("/jobs/{job_id}/result"));
    let recorded = deliveries(&api, &job_id, 1).await;
    assert_eq!(
        (recorded[0]["status_code"].as_u64(), recorded[0]["outcome"].as_str()),
        (Some(204), Some("delivered"))
    );
    assert_eq!(recorded[0]["webhook_id"], message.id());
    assert_counted_once("WebhookDelivered", &job_id).await;
    assert!(metric_points("WebhookFailed", &job_id, 0).await.is_empty());
    // Nobody else sees them.
    assert_eq!(
        Api::new(&principal("other")).get(&format!("/jobs/{job_id}/deliveries")).await.status,
        404
    );
}

#[tokio::test]
async fn failures_are_retried_with_the_same_id_then_dead_lettered() {
    stack();
    let api = Api::new(&principal("flaky-partner"));
    let (url, key) = partner_url("fail");
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 1, "fail_at": 0, "fail_kind": "fatal"}, "callback_url": url})).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "failed");
    let got = received(&key, 4).await;
    assert!(got.iter().all(|m| m.id() == got[0].id()), "every retry keeps the webhook-id");
    let payload: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(
        (payload["type"].as_str(), payload["error"]["code"].as_str()),
        (Some("job.failed"), Some("Job.Fatal"))
    );
    let recorded = deliveries(&api, &job_id, 4).await;
    let outcomes: Vec<&str> = recorded.iter().map(|d| d["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["retrying", "retrying", "retrying", "dead_lettered"]);
    assert!(recorded.iter().all(|d| d["status_code"] == 500));
    assert_counted_once("WebhookFailed", &job_id).await;
    assert!(metric_points("WebhookDelivered", &job_id, 0).await.is_empty());
    let aws = Aws::new().await;
    let dlq = stack().stack.resource("WebhookDeadLetterQueue");
    let deadline =
        Deadline::new("the exhausted delivery in the webhook dead-letter queue", TIMEOUT);
    loop {
        let messages = aws
            .sqs
            .receive_message()
            .queue_url(&dlq)
            .max_number_of_messages(10)
            .visibility_timeout(0)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        if messages.messages().iter().any(|m| m.body().is_some_and(|b| b.contains(job_id.as_str())))
        {
            return;
        }
        // (The receive itself waits a second.)
        let others = format!("{} other messages", messages.messages().len());
        deadline.tick(Duration::ZERO, others).await;
    }
}

#[tokio::test]
async fn a_timeout_is_retried_and_410_stops_deliveries() {
    stack();
    let api = Api::new(&principal("slow-partner"));
    let (url, key) = partner_url("slow");
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 1}, "callback_url": url})).await;
    api.wait_terminal(&job_id, TIMEOUT).await;
    let recorded = deliveries(&api, &job_id, 2).await;
    assert_eq!(recorded[0]["error"], "timed out");
    assert_eq!(recorded[0]["outcome"], "retrying");
    assert!(received(&key, 2).await.len() >= 2);

    let (url, key) = partner_url("gone");
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 3}, "callback_url": url})).await;
    api.wait_terminal(&job_id, TIMEOUT).await;
    let recorded = deliveries(&api, &job_id, 1).await;
    assert_eq!(recorded[0]["outcome"], "stopped");
    tokio::time::sleep(Duration::from_secs(3)).await; // longer than a retry interval
    assert_eq!(received(&key, 1).await.len(), 1, "no retry after 410");
    assert_eq!(deliveries(&api, &job_id, 1).await.len(), 1);
}

#[tokio::test]
async fn during_a_rotation_deliveries_carry_both_signatures() {
    stack();
    let api = Api::new(&principal("rotating-partner"));
    let old = secrets(&api).await.remove(0);
    let rotated = api.post_json("/webhooks/secret/rotate", &json!({})).await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let both = secrets(&api).await;
    assert_eq!(both.len(), 2);
    assert_eq!(both[1], old);
    let (url, key) = partner_url("ok");
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 1}, "callback_url": url})).await;
    api.wait_terminal(&job_id, TIMEOUT).await;
    let message = received(&key, 1).await.remove(0);
    for secret in &both {
        assert!(
            verify(secret, message.id(), message.timestamp(), &message.body, message.signature()),
            "{secret}"
        );
    }
    assert_eq!(message.signature().split(' ').count(), 2);
}

/// The outbox: whoever ends a job only writes its record; the table's stream carries the end
/// to the notifier. Here the test is the ender — a reaper or cancel that died right after its
/// transition leaves exactly this behind — and the partner still gets the event, once.
#[tokio::test]
async fn an_end_whose_ender_queued_nothing_is_still_delivered() {
    stack();
    let owner = principal("outbox-partner");
    let api = Api::new(&owner);
    let secret = secrets(&api).await.remove(0);
    let sdk = stack().stack.emulator_sdk_config().await;
    let jobs =
        JobStore::new(aws_sdk_dynamodb::Client::new(&sdk), stack().stack.resource("JobsTable"));
    let (url, key) = partner_url("ok");
    let now = longhaul_domain::now_rfc3339();
    let job_id = longhaul_domain::JobId::new();
    let record: longhaul_aws::jobs::JobRecord = serde_json::from_value(json!({
        "job_id": job_id, "owner": owner, "type": "demo", "params": {"items": 1}, "status": "running",
        "attempt": 1, "lease": "lease-1", "idempotency_key": "k", "fingerprint": "f", "callback_url": url,
        "created_at": now, "updated_at": now, "started_at": now,
        "transitions": [Transition { state: JobStatus::Running, at: now.parse().unwrap(), reason: "test".into() }],
    }))
    .unwrap();
    jobs.put_job(&record).await.unwrap();
    let ended = TransitionRequest::new(
        &job_id,
        &[JobStatus::Running],
        JobStatus::Failed,
        "its worker vanished",
    )
    .fenced("lease-1");
    jobs.transition(ended).await.unwrap();
    let got = received(&key, 1).await;
    assert!(verify(&secret, got[0].id(), got[0].timestamp(), &got[0].body, got[0].signature()));
    let payload: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(
        (payload["type"].as_str(), payload["job_id"].as_str()),
        (Some("job.failed"), Some(job_id.as_str()))
    );
    let recorded = deliveries(&api, &job_id, 1).await;
    assert_eq!(
        (recorded.len(), recorded[0]["outcome"].as_str()),
        (1, Some("delivered")),
        "one end, one delivery"
    );
}

/// A resolver whose answer changed since submission: the host now points inside.
struct Rebound;

impl webhook::Resolver for Rebound {
    fn resolve<'a>(
        &'a self,
        _host: &'a str,
        port: u16,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move {
            Ok(vec![
                SocketAddr::from(([10, 0, 0, 7], port)),
                SocketAddr::from(([93, 184, 216, 34], port)),
            ])
        })
    }
}

#[tokio::test]
async fn delivery_rechecks_dns_and_refuses_private_addresses() {
    stack();
    let owner = principal("rebinding");
    let sdk = stack().stack.emulator_sdk_config().await;
    let jobs =
        JobStore::new(aws_sdk_dynamodb::Client::new(&sdk), stack().stack.resource("JobsTable"));
    // A job whose callback host resolved to a public address when it was submitted.
    let now = longhaul_domain::now_rfc3339();
    let job_id = longhaul_domain::JobId::new();
    let record: longhaul_aws::jobs::JobRecord = serde_json::from_value(json!({
        "job_id": job_id, "owner": owner, "type": "demo", "params": {"items": 1}, "status": "succeeded",
        "attempt": 1, "idempotency_key": "k", "fingerprint": "f", "callback_url": "https://partner.example.com/hook",
        "created_at": now, "updated_at": now, "finished_at": now,
        "transitions": [Transition { state: JobStatus::Succeeded, at: now.parse().unwrap(), reason: "test".into() }],
    }))
    .unwrap();
    jobs.put_job(&record).await.unwrap();
    let mut vars = std::collections::HashMap::new();
    vars.insert("TABLE_NAME".to_string(), stack().stack.resource("JobsTable"));
    vars.insert(
        "WEBHOOK_QUEUE_URL".to_string(),
        stack()
            .stack
            .resource("WebhookQueue")
            .replace(&stack().stack.edge_url, &stack().stack.emulator.url),
    );
    vars.insert(
        "WEBHOOK_DLQ_URL".to_string(),
        stack()
            .stack
            .resource("WebhookDeadLetterQueue")
            .replace(&stack().stack.edge_url, &stack().stack.emulator.url),
    );
    let config = webhook::Config::from_vars(&longhaul_aws::config::Vars::from_map(vars)).unwrap();
    let deps = webhook::Deps::new(&sdk, &config, Arc::new(Rebound)).unwrap();
    webhook::process(&deps, &WebhookMessage::callback(job_id.clone(), JobStatus::Succeeded))
        .await
        .unwrap();
    let recorded = jobs.deliveries(&job_id).await.unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].error.as_deref(),
        Some("partner.example.com resolves to a non-public address")
    );
    assert_eq!(recorded[0].status_code, None, "no connection was made");
    assert_eq!(recorded[0].outcome, "retrying");
}

/// A job failed by an AWS error tells its owner what failed in their terms: its `error`, its
/// transition log and its `job.failed` webhook never carry the bucket's name, an ARN, the
/// account id or the SDK's error chain (the stage's log line does, with the job id). Here S3
/// refuses the stage's reads of the input (`AccessDenied`, worded as IAM words it, injected by
/// the local edge) until the retries run out.
/// The stack has one fault plan: the tests that set one take turns.
static FAULT_PLAN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn a_job_failed_by_an_aws_error_shows_no_internals() {
    stack();
    let _plan = FAULT_PLAN.lock().await;
    let api = Api::new(&principal("denied-input"));
    let input = api.upload("in.csv", "text/csv", b"region,amount\neu,3\n".to_vec()).await;
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let http = reqwest::Client::new();
    let plan = json!({"deny": {"operation": "s3:GetObject", "contains": input}});
    assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
    let (url, key) = partner_url("ok");
    let job_id = api
        .submit(&json!({"type": "csv_report", "params": {
            "input": input, "group_by": ["region"], "metrics": [{"op": "count"}], "format": "json",
        }, "callback_url": url}))
        .await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    let injected: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
    http.post(&faults).json(&json!({})).send().await.unwrap();
    assert!(injected["injected"]["denied"].as_u64() >= Some(1), "{injected}");
    assert_eq!(job["status"], "failed", "{job}");
    // Access denied is a refusal no retry changes: the job fails at once (Job.Fatal, no
    // retries spent), saying why without naming anything of ours.
    assert_eq!(
        job["error"],
        json!({"code": "Job.Fatal", "message": "the input upload could not be read: access was denied"}),
        "{job}"
    );
    // Recorded by the direct run itself: no retry, no execution.
    assert!(!Aws::new().await.execution_exists(&job_id).await, "retried a refusal");
    let payload: Value = serde_json::from_slice(&received(&key, 1).await[0].body).unwrap();
    assert_eq!(payload["error"], job["error"], "{payload}");
    let bucket = stack().stack.resource("DataBucket");
    let leaks = ["arn:", bucket.as_str(), "123456789012", "service error", "AccessDenied", "s3://"];
    for shown in [job.to_string(), payload.to_string()] {
        for leak in leaks {
            assert!(!shown.contains(leak), "{leak:?} shown to the client: {shown}");
        }
    }
}

/// Throttling is the opposite of a refusal: the stage retries it (the SDK, then the state
/// machine), and once the throttling stops the job succeeds.
#[tokio::test]
async fn a_throttled_input_is_retried_and_the_job_succeeds() {
    stack();
    let _plan = FAULT_PLAN.lock().await;
    let api = Api::new(&principal("throttled-input"));
    let input = api.upload("in.csv", "text/csv", b"region,amount\neu,3\n".to_vec()).await;
    let faults = format!("{}/_local/faults", stack().stack.api_url);
    let http = reqwest::Client::new();
    let plan =
        json!({"throttle": 1.0, "throttle_only": {"operation": "s3:GetObject", "contains": input}});
    assert_eq!(http.post(&faults).json(&plan).send().await.unwrap().status(), 200);
    let job_id = api
        .submit(&json!({"type": "csv_report", "params": {
            "input": input, "group_by": ["region"], "metrics": [{"op": "count"}], "format": "json",
        }}))
        .await;
    // Throttled past the SDK's own retries: the stage failed once, retryably.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let injected: Value = http.get(&faults).send().await.unwrap().json().await.unwrap();
        if injected["injected"]["throttled"].as_u64().unwrap_or(0) >= 4 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never throttled: {injected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    http.post(&faults).json(&json!({})).send().await.unwrap();
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
}
