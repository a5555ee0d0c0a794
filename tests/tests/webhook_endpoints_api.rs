//! The webhook endpoint routes against the local stack, through the HTTP API as deployed: the
//! template's routes and the `webhooks` function's IAM (every call fails on a refused AWS
//! call), every answer checked against docs/openapi.json by the harness. Deliveries are
//! recorded here as the deliverer records them (through the table adapter), then listed,
//! resent and recovered through the API.

use longhaul_aws::jobs::{EndpointDelivery, JobStore};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, endpoint_message_id,
    parse_endpoint_message_id,
};
use longhaul_domain::{JobId, Timestamp};
use longhaul_tests::{Api, Harness, Reply, harness_with, principal};
use serde_json::{Value, json};

const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Endpoint URLs on loopback (the local stack's rule); port 9 has no listener, so a queued
/// delivery fails fast.
fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1")])
}

const URL: &str = "http://127.0.0.1:9/hook";

async fn call(api: &Api, method: &str, path: &str, body: Option<&Value>) -> Reply {
    let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
    api.send(method, path, body, &[]).await
}

fn assert_problem(reply: &Reply, status: u16, slug: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert_eq!(reply.json["type"], format!("/problems/{slug}"), "{}", reply.text);
}

/// Creates an endpoint; its view (asserting 201 and its `Location`).
async fn create(api: &Api, body: &Value) -> Value {
    let reply = call(api, "POST", "/webhooks/endpoints", Some(body)).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let id = reply.json["endpoint_id"].as_str().unwrap();
    assert_eq!(reply.header("location"), Some(format!("/webhooks/endpoints/{id}").as_str()));
    reply.json
}

/// The job table, as the administrator (the deliverer's and the health writes).
async fn store() -> JobStore {
    let sdk = stack().stack.emulator_sdk_config().await;
    JobStore::new(aws_sdk_dynamodb::Client::new(&sdk), stack().stack.resource("JobsTable"))
}

/// A delivery of `event` of a new job to `endpoint` in `status`, recorded as the deliverer
/// records it.
async fn recorded(endpoint: &EndpointId, event: EndpointEvent, status: DeliveryStatus) -> String {
    let job = JobId::new();
    let delivery = EndpointDelivery {
        webhook_id: endpoint_message_id(endpoint, &job, event, None),
        endpoint_id: endpoint.clone(),
        job_id: job,
        event,
        status,
        attempts: 8,
        created_at: Timestamp::now(),
        last_attempt_at: Some(Timestamp::now()),
        status_code: Some(503),
        latency_ms: Some(4),
        error: Some("answered 503".into()),
        progress_seq: None,
        result_expires_at: None,
    };
    store().await.record_endpoint_delivery(&delivery).await.unwrap();
    delivery.webhook_id
}

fn statuses(reply: &Reply) -> Vec<(String, String)> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (d["webhook_id"].as_str().unwrap().to_owned(), d["status"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn an_endpoint_is_created_read_changed_and_deleted_by_its_owner_only() {
    stack();
    let who = principal("endpoints");
    let api = Api::new(&who);
    let view = create(&api, &json!({"url": URL, "events": ["job.succeeded", "job.failed"]})).await;
    let id = view["endpoint_id"].as_str().unwrap();
    let path = format!("/webhooks/endpoints/{id}");
    assert_eq!(view["events"], json!(["job.failed", "job.succeeded"]));
    assert_eq!(view["status"], "enabled");
    assert_eq!(call(&api, "GET", &path, None).await.json, view);
    let list = call(&api, "GET", "/webhooks/endpoints", None).await;
    assert_eq!(list.json, json!({"endpoints": [view.clone()]}));

    let patch = json!({"events": ["job.progress"], "description": "ops"});
    let changed = call(&api, "PATCH", &path, Some(&patch)).await;
    assert_eq!(changed.status, 200, "{}", changed.text);
    assert_eq!(changed.json["events"], json!(["job.progress"]));
    assert_eq!(changed.json["description"], "ops");
    assert_eq!(changed.json["url"], URL);

    // Another principal sees nothing of it and changes nothing.
    let other = Api::new(&principal("endpoints-other"));
    assert_problem(&call(&other, "GET", &path, None).await, 404, "not-found");
    assert_problem(&call(&other, "PATCH", &path, Some(&patch)).await, 404, "not-found");
    assert_problem(&call(&other, "DELETE", &path, None).await, 404, "not-found");
    assert_eq!(call(&other, "GET", "/webhooks/endpoints", None).await.json["endpoints"], json!([]));
    let malformed = call(&api, "GET", "/webhooks/endpoints/not-an-id", None).await;
    assert_problem(&malformed, 404, "not-found");

    // Refused specs write nothing.
    for body in [
        json!({"url": "http://10.0.0.1/hook", "events": ["job.failed"]}),
        json!({"url": URL, "events": []}),
        json!({"url": URL, "events": ["job.done"]}),
        json!({"url": URL, "events": ["job.failed"], "owner": "someone"}),
    ] {
        let reply = call(&api, "POST", "/webhooks/endpoints", Some(&body)).await;
        assert_problem(&reply, 422, "invalid-endpoint");
    }
    let bad_patch = call(&api, "PATCH", &path, Some(&json!({"url": "ftp://example.com"}))).await;
    assert_problem(&bad_patch, 422, "invalid-endpoint");
    assert_eq!(call(&api, "GET", &path, None).await.json, changed.json);

    let deleted = call(&api, "DELETE", &path, None).await;
    assert_eq!(deleted.status, 204, "{}", deleted.text);
    assert_problem(&call(&api, "GET", &path, None).await, 404, "not-found");
    assert!(store().await.endpoints(&who).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_principal_has_at_most_the_deployments_endpoints() {
    stack();
    let api = Api::new(&principal("endpoint-cap"));
    let body = json!({"url": URL, "events": ["job.failed"]});
    for _ in 0..longhaul_domain::endpoints::DEFAULT_MAX_ENDPOINTS {
        create(&api, &body).await;
    }
    let refused = call(&api, "POST", "/webhooks/endpoints", Some(&body)).await;
    assert_problem(&refused, 409, "endpoint-limit");
    assert_eq!(refused.json["limit"], 20);
    let list = call(&api, "GET", "/webhooks/endpoints", None).await;
    assert_eq!(list.json["endpoints"].as_array().unwrap().len(), 20);
}

#[tokio::test]
async fn failed_deliveries_are_listed_resent_and_recovered_and_a_disabled_endpoint_first_enabled() {
    stack();
    let who = principal("endpoint-deliveries");
    let api = Api::new(&who);
    let body = json!({
        "url": URL,
        "events": ["job.failed", "job.succeeded", "job.cancelled", "job.progress"]
    });
    let view = create(&api, &body).await;
    let id: EndpointId = view["endpoint_id"].as_str().unwrap().parse().unwrap();
    let path = format!("/webhooks/endpoints/{id}");
    let failed = recorded(&id, EndpointEvent::JobFailed, DeliveryStatus::Failed).await;
    let other_failed = recorded(&id, EndpointEvent::JobSucceeded, DeliveryStatus::Failed).await;
    let progress = recorded(&id, EndpointEvent::JobProgress, DeliveryStatus::Failed).await;
    let delivered = recorded(&id, EndpointEvent::JobSucceeded, DeliveryStatus::Delivered).await;

    let all = call(&api, "GET", &format!("{path}/deliveries"), None).await;
    assert_eq!(statuses(&all).len(), 4);
    assert_eq!(statuses(&all)[0].0, delivered, "newest job first");
    let only = call(&api, "GET", &format!("{path}/deliveries?status=failed&limit=2"), None).await;
    assert_eq!(statuses(&only).len(), 1, "two read, one of them failed: {}", only.text);
    let cursor = only.json["next_cursor"].as_str().unwrap();
    let next =
        call(&api, "GET", &format!("{path}/deliveries?status=failed&cursor={cursor}"), None).await;
    assert_eq!(statuses(&next).len(), 2, "{}", next.text);
    let bad = call(&api, "GET", &format!("{path}/deliveries?status=lost"), None).await;
    assert_problem(&bad, 400, "bad-request");
    let bad = call(&api, "GET", &format!("{path}/deliveries?cursor=nope"), None).await;
    assert_problem(&bad, 400, "bad-request");

    let resend = |webhook_id: &str| format!("/webhooks/deliveries/{webhook_id}/resend");
    let resent = call(&api, "POST", &resend(&failed), None).await;
    assert_eq!(resent.status, 202, "{}", resent.text);
    assert_eq!(resent.json, json!({"webhook_id": failed, "status": "pending"}));
    // (The stack's deliverer settles that one at once — its job does not exist, so it is
    // recorded failed again — so a pending one is written as such to see the refusal.)
    let pending = recorded(&id, EndpointEvent::JobCancelled, DeliveryStatus::Pending).await;
    assert_problem(&call(&api, "POST", &resend(&pending), None).await, 409, "delivery-pending");
    assert_problem(&call(&api, "POST", &resend(&progress), None).await, 409, "not-replayable");
    assert_eq!(call(&api, "POST", &resend(&delivered), None).await.status, 202);
    assert_problem(&call(&api, "POST", &resend("msg_garbage"), None).await, 404, "not-found");
    let other = Api::new(&principal("endpoint-deliveries-other"));
    assert_problem(&call(&other, "POST", &resend(&other_failed), None).await, 404, "not-found");

    // Disabled (the deliverer's health write): nothing is queued until it is enabled.
    let table = store().await;
    assert!(
        table
            .disable_endpoint(&who, &id, DisabledReason::Gone, None, Timestamp::now())
            .await
            .unwrap()
    );
    let since = json!({"since": Timestamp::from(chrono::Utc::now() - chrono::Duration::hours(1))});
    let recover = format!("{path}/recover");
    assert_problem(&call(&api, "POST", &recover, Some(&since)).await, 409, "endpoint-disabled");
    let refused = call(&api, "POST", &resend(&other_failed), None).await;
    assert_problem(&refused, 409, "endpoint-disabled");
    let shown = call(&api, "GET", &path, None).await;
    assert_eq!(
        (shown.json["status"].as_str(), shown.json["disabled_reason"].as_str()),
        (Some("disabled"), Some("gone"))
    );
    let enabled = call(&api, "POST", &format!("{path}/enable"), None).await;
    assert_eq!(enabled.status, 200, "{}", enabled.text);
    assert_eq!(enabled.json["status"], "enabled");
    assert!(enabled.json.get("disabled_reason").is_none(), "{}", enabled.text);

    let future = json!({"since": Timestamp::from(chrono::Utc::now() + chrono::Duration::hours(1))});
    assert_problem(&call(&api, "POST", &recover, Some(&future)).await, 400, "bad-request");
    // The two resent ones were attempted by the stack's deliverer, which found their jobs
    // gone and recorded them failed again, with the reason: recover finds those and the other.
    settled(&table, &id, &failed).await;
    settled(&table, &id, &delivered).await;
    let recovered = call(&api, "POST", &recover, Some(&since)).await;
    assert_eq!(recovered.status, 202, "{}", recovered.text);
    assert_eq!(recovered.json, json!({"requeued": 3, "complete": true}), "the failed ones");
    settled(&table, &id, &other_failed).await;
    let again = call(&api, "POST", &recover, Some(&since)).await;
    assert_eq!(again.json["complete"], true, "{}", again.text);
}

/// Waits until the delivery `webhook_id` of `endpoint` is recorded failed because its job is
/// gone (what the stack's deliverer records of these tests' made-up jobs).
async fn settled(table: &JobStore, endpoint: &EndpointId, webhook_id: &str) {
    let (_, job, event) = parse_endpoint_message_id(webhook_id).unwrap();
    let deadline = longhaul_tests::Deadline::new(format!("{webhook_id} settled failed"), TIMEOUT);
    loop {
        let stored = table.endpoint_delivery(endpoint, &job, event).await.unwrap().unwrap();
        if stored.status == DeliveryStatus::Failed
            && stored.error.as_deref() == Some("the job no longer exists")
        {
            return;
        }
        deadline.tick(std::time::Duration::from_millis(50), format!("{stored:?}")).await;
    }
}
