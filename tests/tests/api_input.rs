//! The job API against input that tries its edges: crafted list cursors, idempotency records
//! past their expiry, derived keys of requests that differ only in their callback, and a
//! retry of a job whose type this deployment no longer accepts. Every response the API
//! answers here is also checked against docs/openapi.json by the harness.

use longhaul_domain::JobId;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use lambda_http::request::LambdaRequest;
use longhaul_aws::config::Vars;
use longhaul_aws::jobs::{IDEM_SK, idempotency_pk};
use longhaul_domain::fingerprint::retry_idempotency_key;
use longhaul_local::function_identity;
use longhaul_tests::{Api, Aws, Harness, harness_with, principal};
use serde_json::{Value, json};

const JOB_TIMEOUT: Duration = Duration::from_secs(90);

/// The stack of this binary: callbacks to loopback are allowed, so a test can name callback
/// URLs that need no DNS (nothing listens there; deliveries fail, which no test looks at).
fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1")])
}

fn demo(items: u64) -> Value {
    json!({"type": "demo", "params": {"items": items}})
}

/// base64url without padding, as the API's cursors are written.
fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn job_ids(reply: &longhaul_tests::Reply) -> Vec<JobId> {
    reply.json["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("a job list: {}", reply.text))
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn crafted_list_cursors_are_400_problems_and_never_reach_another_tenant() {
    stack();
    let victim = Api::new(&principal("cursor-victim"));
    let first = victim.submit(&demo(1)).await;
    let second = victim.submit(&demo(2)).await;
    let page = victim.get("/jobs?limit=1").await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert_eq!(job_ids(&page), [second.as_str()]);
    let victims_cursor = page.json["next_cursor"].as_str().expect("a second page").to_owned();
    // The cursor works for the one it was issued to.
    let next = victim.get(&format!("/jobs?limit=1&cursor={victims_cursor}")).await;
    assert_eq!((next.status, job_ids(&next)), (200, vec![first.clone()]), "{}", next.text);
    let created_at = victim.get(&format!("/jobs/{second}")).await.json["created_at"]
        .as_str()
        .unwrap()
        .to_owned();

    let attacker_id = principal("cursor-attacker");
    let attacker = Api::new(&attacker_id);
    let own = attacker.submit(&demo(3)).await;
    let b = |text: &str| b64url(text.as_bytes());
    let cases: Vec<(&str, String)> = vec![
        ("empty", String::new()),
        ("garbage", "%25%25%25".into()),
        ("not base64", "not*base64!".into()),
        ("base64 of impossible length", "A".into()),
        ("padded base64", "e30%3D".into()),
        ("a NUL", "%00".into()),
        ("not ASCII", "%F0%9F%98%80".into()),
        ("over-long", "A".repeat(4000)),
        ("valid base64 of non-JSON", b("hello, cursor")),
        ("valid base64 of invalid UTF-8", b64url(b"\xff\xfe\xfd")),
        ("JSON null", b("null")),
        ("an empty JSON object", b("{}")),
        ("a JSON number", b("42")),
        ("an array of wrong types", b("[1, 2, 3]")),
        ("a key of the wrong type", b(r#"["JOB#x", "JOB", 5]"#)),
        ("empty key parts", b(r#"["JOB#", "JOB", ""]"#)),
        (
            "over-long key parts",
            b(&json!([format!("JOB#{}", "x".repeat(3000)), "JOB", "y".repeat(150)]).to_string()),
        ),
        (
            "another tenant's job as the position",
            b(&json!([format!("JOB#{second}"), "JOB", format!("{created_at}#{second}")])
                .to_string()),
        ),
        (
            "keys naming another owner's index",
            b(&json!({"gsi1pk": format!("OWNER#{attacker_id}"), "gsi1sk": "~", "pk": "JOB#x", "sk": "JOB"}).to_string()),
        ),
        ("another tenant's cursor", victims_cursor.clone()),
    ];
    for (what, cursor) in &cases {
        let reply = attacker.get(&format!("/jobs?cursor={cursor}")).await;
        assert_eq!(reply.status, 400, "{what} ({cursor}): {}", reply.text);
        assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{what}");
        assert_eq!(reply.json["type"], "/problems/bad-request", "{what}");
    }
    // The attacker's own listing is untouched by all that, and shows only their own job.
    let mine = attacker.get("/jobs").await;
    assert_eq!((mine.status, job_ids(&mine)), (200, vec![own]), "{}", mine.text);
}

#[tokio::test]
async fn an_expired_idempotency_record_starts_a_new_job() {
    stack();
    let owner = principal("idem-expired");
    let api = Api::new(&owner);
    let key = "nightly-2026-01-01";
    let send = |body: Value| {
        let api = &api;
        async move {
            api.send(
                "POST",
                "/jobs",
                Some(("application/json", body.to_string().into_bytes())),
                &[("idempotency-key", key)],
            )
            .await
        }
    };
    let aws = Aws::new().await;
    // What DynamoDB's TTL deletion (which may lag by days) has not removed yet.
    let expire = || {
        aws.dynamodb
            .update_item()
            .table_name(stack().stack.resource("JobsTable"))
            .key("pk", AttributeValue::S(idempotency_pk(&owner, key)))
            .key("sk", AttributeValue::S(IDEM_SK.into()))
            .update_expression("SET expires_at = :past")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(
                ":past",
                AttributeValue::N((chrono::Utc::now().timestamp() - 60).to_string()),
            )
            .send()
    };

    let first = send(demo(2)).await;
    assert_eq!(first.status, 202, "{}", first.text);
    let first_id = first.json["job_id"].as_str().unwrap().to_owned();
    let replay = send(demo(2)).await;
    assert_eq!((replay.status, replay.json["job_id"].as_str()), (200, Some(first_id.as_str())));

    expire().await.expect("the record is there to expire");
    let after = send(demo(2)).await;
    assert_eq!(after.status, 202, "an expired key names no job: {}", after.text);
    let second_id = after.json["job_id"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first_id);
    assert_eq!(after.header("idempotent-replayed"), None);
    // The key now names the new job, for a fresh window.
    let replay = send(demo(2)).await;
    assert_eq!((replay.status, replay.json["job_id"].as_str()), (200, Some(second_id.as_str())));
    let different = send(demo(3)).await;
    assert_eq!(different.status, 422, "{}", different.text);

    // Once expired, the key may carry a different request too.
    expire().await.expect("the record is there to expire");
    let reused = send(demo(3)).await;
    assert_eq!(reused.status, 202, "{}", reused.text);
    assert_ne!(reused.json["job_id"], second_id.as_str());
}

#[tokio::test]
async fn derived_keys_of_requests_differing_only_in_callback_are_different_jobs() {
    stack();
    let api = Api::new(&principal("derived-callback"));
    let with_callback =
        |url: &str| json!({"type": "demo", "params": {"items": 2}, "callback_url": url});
    let a = api.post_json("/jobs", &with_callback("http://127.0.0.1:9/hook-a")).await;
    assert_eq!(a.status, 202, "{}", a.text);
    let a_id = a.json["job_id"].as_str().unwrap().to_owned();
    let b = api.post_json("/jobs", &with_callback("http://127.0.0.1:9/hook-b")).await;
    assert_eq!(b.status, 202, "a different callback is a different request: {}", b.text);
    let b_id = b.json["job_id"].as_str().unwrap().to_owned();
    assert_ne!(a_id, b_id);
    assert_eq!(
        api.get(&format!("/jobs/{b_id}")).await.json["callback_url"],
        "http://127.0.0.1:9/hook-b"
    );
    // A double submit of either is still one job.
    let again = api.post_json("/jobs", &with_callback("http://127.0.0.1:9/hook-a")).await;
    assert_eq!((again.status, again.json["job_id"].as_str()), (200, Some(a_id.as_str())));
}

/// The submit function's configuration as the template declares it.
fn submit_config() -> submit::Config {
    let functions = longhaul_local::model::functions(&stack().stack.template).unwrap();
    let spec = functions.into_iter().find(|f| f.logical == "SubmitFunction").unwrap();
    submit::Config::from_vars(&Vars::from_map(spec.env.into_iter().collect())).unwrap()
}

/// `POST /jobs/{id}/retry` by `owner`, as API Gateway hands it to the function.
fn retry_request(owner: &str, job_id: &str) -> lambda_http::Request {
    let event = json!({
        "version": "2.0",
        "routeKey": "POST /jobs/{id}/retry",
        "rawPath": format!("/jobs/{job_id}/retry"),
        "rawQueryString": "",
        "headers": {"host": "api.example.com"},
        "pathParameters": {"id": job_id},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abcdef1234",
            "domainName": "abcdef1234.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "abcdef1234",
            "http": {
                "method": "POST",
                "path": format!("/jobs/{job_id}/retry"),
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "test"
            },
            "requestId": "retry-disabled",
            "routeKey": "POST /jobs/{id}/retry",
            "stage": "$default",
            "time": "22/Nov/2026:05:00:00 +0000",
            "timeEpoch": 1795323600000u64,
            "authorizer": {"jwt": {"claims": {"sub": owner}, "scopes": null}}
        },
        "isBase64Encoded": false
    });
    serde_json::from_value::<LambdaRequest>(event).expect("an API Gateway event").into()
}

#[tokio::test]
async fn a_retry_of_a_job_whose_type_is_disabled_is_refused_and_writes_nothing() {
    let h = stack();
    let owner = principal("retry-disabled");
    let api = Api::new(&owner);
    let failed = api
        .submit(
            &json!({"type": "demo", "params": {"items": 1, "fail_at": 0, "fail_kind": "fatal"}}),
        )
        .await;
    assert_eq!(api.wait_terminal(&failed, JOB_TIMEOUT).await["status"], "failed");

    // The same function, on a deployment that has since switched `demo` off.
    let sdk = longhaul_local::sdk_config(&h.stack.edge_url).await;
    let mut config = submit_config();
    config.enabled_job_types = vec!["csv_report".to_owned()];
    let deps = submit::Deps::new(&function_identity(&sdk, "SubmitFunction"), &config);
    let aws = Aws::new().await;
    let before = aws.items_of(&owner).await.len();
    let response = submit::handle(&deps, retry_request(&owner, &failed)).await;
    assert_eq!(response.status(), 422);
    assert_eq!(
        response.headers().get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let problem: Value = serde_json::from_slice(response.body().as_ref()).unwrap();
    assert_eq!(problem["type"], "/problems/unknown-job-type", "{problem}");
    assert_eq!(aws.items_of(&owner).await.len(), before, "no job was written");
    let key = aws
        .dynamodb
        .get_item()
        .table_name(h.stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(idempotency_pk(&owner, &retry_idempotency_key(&failed))))
        .key("sk", AttributeValue::S(IDEM_SK.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(key.item.is_none(), "no idempotency record was written: {:?}", key.item);

    // With the type enabled, the same retry goes through (the refusal was the type's).
    config.enabled_job_types = vec!["demo".to_owned(), "csv_report".to_owned()];
    let deps = submit::Deps::new(&function_identity(&sdk, "SubmitFunction"), &config);
    let response = submit::handle(&deps, retry_request(&owner, &failed)).await;
    assert_eq!(response.status(), 202);
}
