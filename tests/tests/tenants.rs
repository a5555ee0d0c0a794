//! Tenants cannot hurt each other: the per-tenant submission rate limit and the caps on open
//! progress streams, against the local stack with low limits (3 submissions a minute, 2
//! streams per job and per tenant); and delayed start (`delay_seconds`, `not_before`).

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_aws::jobs::{JobRecord, JobStore};
use longhaul_domain::{JobId, format_rfc3339};
use longhaul_tests::{Api, Aws, Deadline, Harness, Reply, harness_with, principal};
use serde_json::{Value, json};

const SUBMISSIONS_PER_MINUTE: usize = 3;
/// How often an open stream writes a keepalive (and so learns that its client left).
const KEEPALIVE: Duration = Duration::from_secs(1);

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE", "3"),
        ("LONGHAUL_MAX_STREAMS_PER_JOB", "2"),
        ("LONGHAUL_MAX_STREAMS_PER_TENANT", "2"),
        ("LONGHAUL_MAX_STREAMS", "3"),
        ("LONGHAUL_STREAM_POLL_MS", "100"),
        ("LONGHAUL_STREAM_KEEPALIVE_SECONDS", KEEPALIVE.as_secs().to_string().as_str()),
    ])
}

/// A demo job that runs for about a minute (long enough to stream, then cancelled).
fn long_job() -> Value {
    json!({"type": "demo", "params": {"items": 600, "item_ms": 100}})
}

/// Waits, if needed, until the current minute has at least 15 s left, so that a test's
/// submissions all fall in one rate window.
async fn fresh_window() {
    let second = chrono::Utc::now().timestamp().rem_euclid(60);
    if second > 45 {
        tokio::time::sleep(Duration::from_secs((61 - second) as u64)).await;
    }
}

/// The rate window (minute) it is now.
fn minute() -> i64 {
    chrono::Utc::now().timestamp().div_euclid(60)
}

fn assert_problem(reply: &Reply, status: u16, slug: &str) {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"), "{}", reply.text);
    assert_eq!(reply.json["type"], format!("/problems/{slug}"), "{}", reply.text);
}

#[tokio::test]
async fn submissions_beyond_the_tenants_rate_are_429_and_write_nothing() {
    stack();
    let aws = Aws::new().await;
    let owner = principal("noisy");
    let api = Api::new(&owner);
    fresh_window().await;
    let window = minute();
    let mut accepted = Vec::new();
    for i in 0..SUBMISSIONS_PER_MINUTE {
        let reply = api.submit_with_key(&long_job(), &format!("k{i}")).await;
        assert_eq!(reply.status, 202, "{}", reply.text);
        accepted.push(reply.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap());
    }
    let before = aws.items_of(&owner).await.len();

    let refused = api.submit_with_key(&long_job(), "one-too-many").await;
    assert_problem(&refused, 429, "rate-limited");
    let retry_after: u64 = refused.header("retry-after").expect("Retry-After").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    // Nothing written: no job, no idempotency record.
    assert_eq!(aws.items_of(&owner).await.len(), before, "the refused submission wrote");
    let record = aws
        .dynamodb
        .get_item()
        .table_name(stack().stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(longhaul_aws::jobs::idempotency_pk(&owner, "one-too-many")))
        .key("sk", AttributeValue::S(longhaul_aws::jobs::IDEM_SK.into()))
        .send()
        .await
        .unwrap();
    assert!(record.item.is_none(), "no idempotency record for a refused submission");
    // A key-less (derived-key) submission is refused the same way.
    assert_problem(
        &api.post_json("/jobs", &json!({"type": "demo", "params": {"items": 1}})).await,
        429,
        "rate-limited",
    );

    // Replays do not count and are still answered.
    let replay = api.submit_with_key(&long_job(), "k0").await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.json["job_id"], accepted[0].as_str());

    // A retry is a submission too: over the limit it is refused, nothing written.
    let cancelled = api.post_json(&format!("/jobs/{}/cancel", accepted[1]), &json!({})).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.text);
    api.wait_for(&accepted[1], "cancelled", |j| j["status"] == "cancelled").await;
    // On a busy machine the cancellation may carry the test into the next minute: that
    // window's submissions are used up first, so the retry meets a full window as well.
    fresh_window().await;
    if minute() != window {
        for i in 0..SUBMISSIONS_PER_MINUTE {
            let filler = json!({"type": "demo", "params": {"items": 1}});
            let reply = api.submit_with_key(&filler, &format!("filler{i}")).await;
            assert_eq!(reply.status, 202, "{}", reply.text);
        }
    }
    let before = aws.items_of(&owner).await.len();
    assert_problem(
        &api.post_json(&format!("/jobs/{}/retry", accepted[1]), &json!({})).await,
        429,
        "rate-limited",
    );
    assert_eq!(aws.items_of(&owner).await.len(), before, "the refused retry wrote");

    // Another tenant is unaffected.
    let quiet = Api::new(&principal("quiet"));
    let other = quiet.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    quiet.wait_terminal(&other, Duration::from_secs(60)).await;

    for job_id in accepted {
        api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    }
}

/// The stream tests count open streams against the deployment's cap (3): one at a time.
static STREAM_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An open stream: the response is held (its body unread) until dropped.
async fn open_stream(url: &str) -> reqwest::Response {
    tokio::time::timeout(Duration::from_secs(30), reqwest::Client::new().get(url).send())
        .await
        .expect("the events function answers")
        .expect("request")
}

async fn events_url(api: &Api, job_id: &JobId) -> String {
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    job["events_url"].as_str().expect("a live job has an events_url").to_owned()
}

async fn assert_refused(url: &str, scope: &str) {
    let response = open_stream(url).await;
    assert_eq!(response.status(), 429);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/too-many-streams");
    assert!(problem["detail"].as_str().unwrap().contains(scope), "{problem}");
}

/// Opens streams at `url` until one is accepted again (a closed stream's slot is given back
/// as the stream's invocation ends: at its next keepalive), for up to sixty keepalives.
async fn reopens(url: &str) -> reqwest::Response {
    let deadline = Deadline::new("the closed stream's slot to be given back", KEEPALIVE * 60);
    loop {
        let response = open_stream(url).await;
        if response.status() == 200 {
            return response;
        }
        assert_eq!(response.status(), 429);
        deadline.tick(Duration::from_millis(100), response.status()).await;
    }
}

#[tokio::test]
async fn a_third_stream_of_a_job_is_429_until_one_closes() {
    stack();
    let _one_at_a_time = STREAM_TESTS.lock().await;
    let api = Api::new(&principal("watcher"));
    let job_id = api.submit(&long_job()).await;
    let url = events_url(&api, &job_id).await;
    let first = open_stream(&url).await;
    let second = open_stream(&url).await;
    assert_eq!((first.status().as_u16(), second.status().as_u16()), (200, 200));
    assert_refused(&url, "job").await;
    drop(first);
    let third = reopens(&url).await;
    drop((second, third));
    api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
}

#[tokio::test]
async fn a_third_stream_of_a_tenant_is_429_until_one_ends() {
    stack();
    let _one_at_a_time = STREAM_TESTS.lock().await;
    let api = Api::new(&principal("many-jobs"));
    let mut jobs = Vec::new();
    for items in 600..603 {
        // Three different jobs (identical bodies would be one job: a derived key's replay).
        jobs.push(
            api.submit(&json!({"type": "demo", "params": {"items": items, "item_ms": 100}})).await,
        );
    }
    let mut urls = Vec::new();
    for job_id in &jobs {
        urls.push(events_url(&api, job_id).await);
    }
    let a = open_stream(&urls[0]).await;
    let b = open_stream(&urls[1]).await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    assert_refused(&urls[2], "tenant").await;
    // A stream that ends by itself (its job ended) gives its slot back too.
    api.post_json(&format!("/jobs/{}/cancel", jobs[0]), &json!({})).await;
    let text = tokio::time::timeout(Duration::from_secs(30), a.text()).await.unwrap().unwrap();
    assert!(text.contains("event: status"), "{text}");
    let c = reopens(&urls[2]).await;
    // Another tenant's streams are not counted against this one.
    let other = Api::new(&principal("other-watcher"));
    let other_job = other.submit(&long_job()).await;
    assert_eq!(open_stream(&events_url(&other, &other_job).await).await.status(), 200);
    drop((b, c));
    for job_id in jobs.iter().skip(1).chain([&other_job]) {
        let api = if *job_id == other_job { &other } else { &api };
        api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    }
}

/// Streams past the deployment's cap are refused whoever opens them, so the events
/// function's reserved concurrency always has room: two tenants within their own caps (2 each)
/// cannot open a fourth stream between them when the deployment allows 3.
#[tokio::test]
async fn streams_past_the_deployments_cap_are_429_until_one_ends() {
    stack();
    let _one_at_a_time = STREAM_TESTS.lock().await;
    let (first, second) = (Api::new(&principal("cap-a")), Api::new(&principal("cap-b")));
    let mut jobs = Vec::new();
    for (api, items) in [(&first, 600), (&first, 601), (&second, 602), (&second, 603)] {
        let job_id =
            api.submit(&json!({"type": "demo", "params": {"items": items, "item_ms": 100}})).await;
        jobs.push((api, job_id.clone(), events_url(api, &job_id).await));
    }
    let mut open = Vec::new();
    for (_, _, url) in &jobs[..3] {
        let stream = open_stream(url).await;
        assert_eq!(stream.status(), 200);
        open.push(stream);
    }
    assert_refused(&jobs[3].2, "deployment").await;
    drop(open.remove(0));
    let fourth = reopens(&jobs[3].2).await;
    drop((open, fourth));
    for (api, job_id, _) in &jobs {
        api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    }
}

fn time(value: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(value.as_str().expect("a timestamp")).unwrap().to_utc()
}

/// Asserts that `job` (as `GET /jobs/{id}` shows it, once it ran) stayed `pending` until its
/// stored start: its own history says so — every transition to another state is at or after
/// it — whatever the machine's speed, which a read made "before the start" cannot promise.
fn assert_pending_until_its_start(job: &Value) {
    let start = time(&job["not_before"]);
    let transitions = job["transitions"].as_array().expect("its transitions");
    assert_eq!(transitions[0]["state"], "pending", "submitted pending: {job}");
    assert!(transitions.iter().any(|t| t["state"] == "queued"), "it was dispatched: {job}");
    for transition in transitions.iter().filter(|t| t["state"] != "pending") {
        assert!(time(&transition["at"]) >= start, "left pending before its start: {job}");
    }
}

#[tokio::test]
async fn a_delayed_job_waits_pending_until_its_start_then_runs() {
    stack();
    let api = Api::new(&principal("later"));
    let delay = chrono::Duration::seconds(15);
    let submitted = chrono::Utc::now();
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 2}, "delay_seconds": 15})).await;
    let accepted = chrono::Utc::now();
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    let not_before = time(&job["not_before"]);
    // Its start is the delay after the request was accepted (whole seconds, as stored).
    let second = chrono::Duration::seconds(1);
    assert!(
        not_before >= submitted + delay - second && not_before <= accepted + delay + second,
        "{job}"
    );
    let done = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(time(&done["started_at"]) >= not_before, "started before its start: {done}");
    assert_pending_until_its_start(&done);
    assert_eq!(done["not_before"], job["not_before"], "shown for the job's whole life");
}

#[tokio::test]
async fn a_delayed_job_can_be_cancelled_while_it_waits_and_never_runs() {
    stack();
    let api = Api::new(&principal("never"));
    // Cancelled at once, long before its start (a busy machine's requests take their time).
    let soon =
        api.submit(&json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 8})).await;
    let reply = api.post_json(&format!("/jobs/{soon}/cancel"), &json!({})).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    // Beyond SQS's reach: not even enqueued until 15 minutes before its start.
    let not_before = format_rfc3339(chrono::Utc::now() + chrono::Duration::hours(2));
    let later = api
        .submit(&json!({"type": "demo", "params": {"items": 1}, "not_before": not_before}))
        .await;
    assert_eq!(api.get(&format!("/jobs/{later}")).await.json["not_before"], not_before);
    let reply = api.post_json(&format!("/jobs/{later}/cancel"), &json!({})).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    // Past `soon`'s start: it never ran.
    tokio::time::sleep(Duration::from_secs(11)).await;
    for job_id in [&soon, &later] {
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        assert_eq!(job["status"], "cancelled", "{job}");
        assert_eq!((job["attempt"].as_u64(), &job["started_at"]), (Some(0), &Value::Null), "{job}");
    }
}

#[tokio::test]
async fn bad_delayed_starts_are_422_and_the_delay_is_part_of_the_request() {
    stack();
    let api = Api::new(&principal("bad-start"));
    let past = format_rfc3339(chrono::Utc::now() - chrono::Duration::minutes(5));
    let far = format_rfc3339(chrono::Utc::now() + chrono::Duration::days(31));
    for body in [
        json!({"type": "demo", "params": {"items": 1}, "not_before": past}),
        json!({"type": "demo", "params": {"items": 1}, "not_before": far}),
        json!({"type": "demo", "params": {"items": 1}, "not_before": "next tuesday"}),
        json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 2_592_001}),
        json!({"type": "demo", "params": {"items": 1}, "delay_seconds": -1}),
        json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 5, "not_before": far}),
    ] {
        assert_problem(&api.post_json("/jobs", &body).await, 422, "invalid-start");
    }
    // The same key with another delay is another request.
    let delayed =
        |seconds: u64| json!({"type": "demo", "params": {"items": 1}, "delay_seconds": seconds});
    let first = api.submit_with_key(&delayed(600), "d").await;
    assert_eq!(first.status, 202, "{}", first.text);
    let other = api.submit_with_key(&delayed(601), "d").await;
    assert_problem(&other, 422, "idempotency-key-reused");
    // The same delay is the same request: a replay, answered with the job the first made.
    let replay = api.submit_with_key(&delayed(600), "d").await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    let job_id = first.json["job_id"].as_str().unwrap();
    api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
}

/// A long-delayed job as the reaper finds it once it comes due (its index entry, keyed 15
/// minutes before its start, passed the grace): the reaper enqueues it for its start, and an
/// undelayed message that reaches the dispatcher early is delayed again, never started.
#[tokio::test]
async fn the_reaper_enqueues_a_due_delayed_job_for_its_start_and_the_dispatcher_never_starts_it_early()
 {
    stack();
    let owner = principal("due");
    let api = Api::new(&owner);
    let aws = Aws::new().await;
    let table = stack().stack.resource("JobsTable");
    let jobs = JobStore::new(aws.dynamodb.clone(), table.clone());
    // Accepted two days ago (past LONGHAUL_MAX_PENDING_SECONDS: it must not fail for that).
    let created = format_rfc3339(chrono::Utc::now() - chrono::Duration::days(2));
    // Far enough ahead that the reaper's run and the early message's handling are normally
    // over before it (the check below holds whether they are or not).
    let start = chrono::Utc::now() + chrono::Duration::seconds(20);
    let job = JobRecord {
        params: json!({"items": 1}),
        not_before: Some(start.into()),
        ..longhaul_tests::seeded_job(&owner, created)
    };
    jobs.put_job(&job).await.unwrap();
    aws.dynamodb
        .update_item()
        .table_name(&table)
        .key("pk", AttributeValue::S(longhaul_aws::jobs::job_pk(&job.job_id)))
        .key("sk", AttributeValue::S(longhaul_aws::jobs::JOB_SK.into()))
        .update_expression("SET gsi2sk = :due")
        .expression_attribute_values(
            ":due",
            AttributeValue::S(format_rfc3339(chrono::Utc::now() - chrono::Duration::minutes(5))),
        )
        .send()
        .await
        .unwrap();
    // An early message, straight to the intake queue.
    aws.sqs
        .send_message()
        .queue_url(stack().stack.resource("IntakeQueue"))
        .message_body(json!({"job_id": job.job_id}).to_string())
        .send()
        .await
        .unwrap();
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/schedules/reaper", stack().stack.api_url))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let done = api.wait_terminal(&job.job_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(time(&done["started_at"]) >= start, "started early: {done}");
    // The early message and the reaper's were both handled before the start or not: either
    // way the job's history shows it left `pending` only at its start.
    assert_pending_until_its_start(&done);
}

/// `demo` is off in a deployment by default (anyone could hold workers with it) and on in the
/// local stack, which adds it to the template's list — the tests rely on it explicitly.
#[tokio::test]
async fn demo_is_off_in_the_templates_default_and_on_locally() {
    let template = longhaul_local::template::Template::load(
        &longhaul_tests::root().join("template.yaml"),
        "longhaul",
        "",
        "",
        &Default::default(),
    )
    .unwrap();
    let default = &template.parameters["EnabledJobTypes"];
    assert!(!default.split(',').any(|k| k.trim() == "demo"), "template default: {default}");
    let local = longhaul_local::local_parameters(&template.parameters);
    let kinds: Vec<&str> = local["EnabledJobTypes"].split(',').collect();
    assert!(kinds.contains(&"demo"), "{kinds:?}");
    assert!(default.split(',').all(|k| kinds.contains(&k.trim())), "keeps the template's kinds");
    // And the local stack of these tests accepts it.
    stack();
    let api = Api::new(&principal("demo-on"));
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    let done = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
}
