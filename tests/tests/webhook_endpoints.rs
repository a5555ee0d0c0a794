//! Webhook endpoints against the local stack: every event type reaches a subscribed endpoint
//! signed, and the reference Standard Webhooks library (`standardwebhooks`) verifies each; an
//! endpoint that answers `410 Gone` or keeps failing is disabled, nothing is attempted while it
//! is, and `enable` + `recover` fill the gap with the same `webhook-id`s; `resend` queues one
//! delivery again; another owner's endpoints hear nothing.
//!
//! Retries are compressed to a second apart, an endpoint is disabled after 3 s of failures, the
//! endpoint cache is off (a new endpoint hears the very next event), and results are kept an
//! hour, so the expirer's run reminds of every fresh result at once.

use std::collections::BTreeSet;
use std::time::Duration;

use longhaul_domain::JobId;
use longhaul_tests::partner::{Received, inbox, partner_url};
use longhaul_tests::{Api, Deadline, Harness, harness_with, principal};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1"),
        ("LONGHAUL_WEBHOOK_SCHEDULE_SECONDS", "1,1,1,1,1,1"),
        ("LONGHAUL_WEBHOOK_TIMEOUT_MS", "500"),
        ("LONGHAUL_ENDPOINT_CACHE_SECONDS", "0"),
        ("LONGHAUL_ENDPOINT_DISABLE_AFTER_SECONDS", "3"),
        ("LONGHAUL_RESULT_TTL_SECONDS", "3600"),
    ])
}

/// What `key` received, once `done` holds of it.
async fn received_until(
    key: &str,
    what: &str,
    done: impl Fn(&[Received]) -> bool,
) -> Vec<Received> {
    longhaul_tests::partner::received_until(key, what, TIMEOUT, done).await
}

/// The types of the events received.
fn types(got: &[Received]) -> BTreeSet<String> {
    got.iter().map(|r| r.payload()["type"].as_str().unwrap().to_owned()).collect()
}

async fn create_endpoint(api: &Api, url: &str, events: &[&str]) -> String {
    let reply = api.post_json("/webhooks/endpoints", &json!({"url": url, "events": events})).await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    assert_eq!(reply.json["status"], "enabled");
    reply.json["endpoint_id"].as_str().unwrap().to_owned()
}

async fn endpoint(api: &Api, id: &str) -> Value {
    let reply = api.get(&format!("/webhooks/endpoints/{id}")).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json
}

async fn secret(api: &Api) -> String {
    let reply = api.get("/webhooks/secret").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["secrets"][0]["secret"].as_str().unwrap().to_owned()
}

/// The endpoint's deliveries (in `status`, if given), once `done` holds of them.
async fn deliveries_until(
    api: &Api,
    id: &str,
    status: Option<&str>,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let path = match status {
        Some(status) => format!("/webhooks/endpoints/{id}/deliveries?status={status}"),
        None => format!("/webhooks/endpoints/{id}/deliveries"),
    };
    let deadline = Deadline::new(format!("{what} recorded for endpoint {id}"), TIMEOUT);
    loop {
        let reply = api.get(&path).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
        let list = reply.json["deliveries"].as_array().unwrap().clone();
        if done(&list) {
            return list;
        }
        deadline.tick(Duration::from_millis(100), reply.text).await;
    }
}

async fn fire_expirer() {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/schedules/expirer", stack().stack.api_url))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap_or_default());
}

async fn ends(api: &Api, job_id: &JobId, status: &str) {
    assert_eq!(api.wait_terminal(job_id, TIMEOUT).await["status"], status, "{job_id}");
}

#[tokio::test]
async fn every_event_type_reaches_the_endpoint_and_the_reference_library_verifies_it() {
    stack();
    let api = Api::new(&principal("endpoint-partner"));
    let secret = secret(&api).await;
    let (url, key) = partner_url("ok");
    let all =
        ["job.succeeded", "job.failed", "job.cancelled", "job.progress", "job.result_expiring"];
    let endpoint_id = create_endpoint(&api, &url, &all).await;
    // Another owner's endpoint, subscribed to everything, hears none of it.
    let other = Api::new(&principal("endpoint-bystander"));
    let (other_url, other_key) = partner_url("ok");
    create_endpoint(&other, &other_url, &all).await;

    // A success; a fatal failure; a long job, cancelled once its progress was heard.
    let succeeded =
        api.submit(&json!({"type": "demo", "params": {"items": 4, "item_ms": 10}})).await;
    let failed = api
        .submit(
            &json!({"type": "demo", "params": {"items": 1, "fail_at": 0, "fail_kind": "fatal"}}),
        )
        .await;
    let cancelled =
        api.submit(&json!({"type": "demo", "params": {"items": 600, "item_ms": 100}})).await;
    received_until(&key, "a progress event of the long job", |got| {
        got.iter().any(|r| {
            r.payload()["type"] == "job.progress" && r.payload()["job_id"] == cancelled.as_str()
        })
    })
    .await;
    let reply = api.post_json(&format!("/jobs/{cancelled}/cancel"), &json!({})).await;
    assert!(matches!(reply.status, 200 | 202), "{}", reply.text);
    ends(&api, &succeeded, "succeeded").await;
    ends(&api, &failed, "failed").await;
    ends(&api, &cancelled, "cancelled").await;
    // The succeeded job's result is kept an hour: this run reminds of it.
    fire_expirer().await;

    let got = received_until(&key, "every event type", |got| types(got).len() == all.len()).await;
    assert_eq!(types(&got), all.iter().map(|t| t.to_string()).collect());
    let reference = standardwebhooks::Webhook::new(&secret).expect("a whsec_ secret");
    for request in &got {
        reference.verify(&request.body, &request.headers).unwrap_or_else(|err| {
            panic!("{} does not verify: {err:?} — {:?}", request.id(), request.payload())
        });
        assert!(request.id().starts_with("msg_"), "{}", request.id());
    }
    let of = |event: &str, job: &JobId| {
        got.iter()
            .filter(|r| r.payload()["type"] == event && r.payload()["job_id"] == job.as_str())
            .count()
    };
    assert_eq!(of("job.succeeded", &succeeded), 1);
    assert_eq!(of("job.failed", &failed), 1);
    assert_eq!(of("job.cancelled", &cancelled), 1);
    assert_eq!(of("job.result_expiring", &succeeded), 1);
    assert!(of("job.progress", &cancelled) >= 1, "waited for above");
    let reminder = got.iter().find(|r| r.payload()["type"] == "job.result_expiring").unwrap();
    assert_eq!(reminder.payload()["result_url"], format!("/jobs/{succeeded}/result"));
    assert!(reminder.payload()["expires_at"].is_string(), "{:?}", reminder.payload());
    let progress = got.iter().find(|r| r.payload()["type"] == "job.progress").unwrap();
    assert!(progress.payload()["progress"]["pct"].is_number(), "{:?}", progress.payload());
    // Each progress event is a new event: its own webhook-id.
    let progress_events: Vec<&Received> =
        got.iter().filter(|r| r.payload()["type"] == "job.progress").collect();
    let progress_ids: BTreeSet<&str> = progress_events.iter().map(|r| r.id()).collect();
    assert_eq!(progress_ids.len(), progress_events.len(), "each a new event id");

    // The deliveries are recorded, delivered, and the endpoint is healthy.
    let recorded =
        deliveries_until(&api, &endpoint_id, Some("delivered"), "four deliveries", |d| {
            d.iter().filter(|d| d["event"] != "job.progress").count() >= 4
        })
        .await;
    assert!(recorded.iter().all(|d| d["status_code"] == 204), "{recorded:?}");
    assert_eq!(endpoint(&api, &endpoint_id).await["failing_since"], Value::Null);
    assert!(inbox(&other_key).is_empty(), "another owner's endpoint heard nothing");
}

#[tokio::test]
async fn a_gone_endpoint_is_disabled_and_enable_then_recover_fills_the_gap() {
    stack();
    let api = Api::new(&principal("gone-partner"));
    let (gone_url, gone_key) = partner_url("gone");
    let id = create_endpoint(&api, &gone_url, &["job.succeeded"]).await;
    let first = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    ends(&api, &first, "succeeded").await;
    received_until(&gone_key, "the 410", |got| got.len() == 1).await;
    let deadline = Deadline::new("the endpoint disabled", TIMEOUT);
    let view = loop {
        let view = endpoint(&api, &id).await;
        if view["status"] == "disabled" {
            break view;
        }
        deadline.tick(Duration::from_millis(100), view.to_string()).await;
    };
    assert_eq!(view["disabled_reason"], "gone");
    let since = view["disabled_at"].as_str().unwrap().to_owned();

    // While it is disabled nothing is attempted; the event is recorded failed.
    let missed = api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    ends(&api, &missed, "succeeded").await;
    let failed = deliveries_until(&api, &id, Some("failed"), "the missed event", |d| {
        d.iter().any(|d| d["job_id"] == missed.as_str())
    })
    .await;
    let missed_delivery = failed.iter().find(|d| d["job_id"] == missed.as_str()).unwrap();
    assert_eq!(missed_delivery["attempts"], 0, "{missed_delivery}");
    assert_eq!(inbox(&gone_key).len(), 1, "nothing attempted while disabled");
    let resend = api
        .post_json(
            &format!(
                "/webhooks/deliveries/{}/resend",
                missed_delivery["webhook_id"].as_str().unwrap()
            ),
            &json!({}),
        )
        .await;
    assert_eq!(resend.status, 409, "a disabled endpoint is enabled first: {}", resend.text);

    // The receiver is back somewhere else: move it, enable it, recover what it missed.
    let (ok_url, ok_key) = partner_url("ok");
    let patched = api
        .send(
            "PATCH",
            &format!("/webhooks/endpoints/{id}"),
            Some(("application/json", json!({"url": ok_url}).to_string().into_bytes())),
            &[],
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    let enabled = api.post_json(&format!("/webhooks/endpoints/{id}/enable"), &json!({})).await;
    assert_eq!(enabled.status, 200, "{}", enabled.text);
    assert_eq!(enabled.json["status"], "enabled");
    let recovered =
        api.post_json(&format!("/webhooks/endpoints/{id}/recover"), &json!({"since": since})).await;
    assert_eq!(recovered.status, 202, "{}", recovered.text);
    assert_eq!(recovered.json["complete"], true, "{}", recovered.text);
    assert!(recovered.json["requeued"].as_u64().unwrap() >= 1, "{}", recovered.text);
    let got = received_until(&ok_key, "the recovered event", |got| {
        got.iter().any(|r| r.payload()["job_id"] == missed.as_str())
    })
    .await;
    let recovered = got.iter().find(|r| r.payload()["job_id"] == missed.as_str()).unwrap();
    assert_eq!(recovered.id(), missed_delivery["webhook_id"].as_str().unwrap(), "the same id");

    // And a delivered one can be sent again on request, with its id.
    let delivered = deliveries_until(&api, &id, Some("delivered"), "the recovered delivery", |d| {
        d.iter().any(|d| d["job_id"] == missed.as_str())
    })
    .await;
    let webhook_id = delivered[0]["webhook_id"].as_str().unwrap().to_owned();
    let resend =
        api.post_json(&format!("/webhooks/deliveries/{webhook_id}/resend"), &json!({})).await;
    assert_eq!(resend.status, 202, "{}", resend.text);
    received_until(&ok_key, "the resent event", |got| {
        got.iter().filter(|r| r.id() == webhook_id).count() == 2
    })
    .await;
    // Another owner can neither see nor resend it.
    let stranger = Api::new(&principal("gone-stranger"));
    assert_eq!(stranger.get(&format!("/webhooks/endpoints/{id}")).await.status, 404);
    let foreign =
        stranger.post_json(&format!("/webhooks/deliveries/{webhook_id}/resend"), &json!({})).await;
    assert_eq!(foreign.status, 404, "{}", foreign.text);
}

#[tokio::test]
async fn an_endpoint_whose_every_attempt_fails_long_enough_is_disabled() {
    stack();
    let api = Api::new(&principal("failing-partner"));
    let (url, key) = partner_url("fail");
    let id = create_endpoint(&api, &url, &["job.failed"]).await;
    let job = api
        .submit(
            &json!({"type": "demo", "params": {"items": 1, "fail_at": 0, "fail_kind": "fatal"}}),
        )
        .await;
    ends(&api, &job, "failed").await;
    // Attempts a second apart; the endpoint is disabled once its failures span 3 s.
    let deadline = Deadline::new("the failing endpoint disabled", TIMEOUT);
    let view = loop {
        let view = endpoint(&api, &id).await;
        if view["status"] == "disabled" {
            break view;
        }
        deadline.tick(Duration::from_millis(100), view.to_string()).await;
    };
    assert_eq!(view["disabled_reason"], "failing");
    assert!(view["failing_since"].is_string() || view["disabled_at"].is_string(), "{view}");
    let attempts = inbox(&key).len();
    assert!(attempts >= 2, "{attempts} attempts before it was disabled");
    let failed = deliveries_until(&api, &id, Some("failed"), "the failed delivery", |d| {
        d.iter().any(|d| d["job_id"] == job.as_str())
    })
    .await;
    // The attempt that disabled it is the last: failed, with its answer, and no retry.
    assert_eq!(failed[0]["status_code"], 500, "{}", failed[0]);
    // No further attempt follows the disablement.
    let later = api
        .submit(
            &json!({"type": "demo", "params": {"items": 2, "fail_at": 0, "fail_kind": "fatal"}}),
        )
        .await;
    ends(&api, &later, "failed").await;
    deliveries_until(&api, &id, Some("failed"), "the skipped event", |d| {
        d.iter().any(|d| d["job_id"] == later.as_str())
    })
    .await;
    assert!(inbox(&key).iter().all(|r| r.payload()["job_id"] == job.as_str()));
}
