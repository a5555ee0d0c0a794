//! The live progress stream (SSE) served through the events function's URL, with reads every
//! 100 ms and keep-alive comments every second.

use longhaul_domain::JobId;
use std::time::Duration;

use futures::StreamExt;
use longhaul_tests::{Api, Harness, harness_with, principal};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_STREAM_POLL_MS", "100"), ("LONGHAUL_STREAM_KEEPALIVE_SECONDS", "1")])
}

/// One server-sent event (or comment).
#[derive(Debug, Clone, Default)]
struct Event {
    id: Option<u64>,
    kind: String,
    data: Value,
    comment: bool,
}

fn parse(block: &str) -> Option<Event> {
    let mut event = Event::default();
    for line in block.lines() {
        if let Some(comment) = line.strip_prefix(':') {
            event.comment = true;
            event.kind = comment.trim().to_owned();
        } else if let Some(id) = line.strip_prefix("id: ") {
            event.id = id.parse().ok();
        } else if let Some(kind) = line.strip_prefix("event: ") {
            event.kind = kind.to_owned();
        } else if let Some(data) = line.strip_prefix("data: ") {
            event.data = serde_json::from_str(data).unwrap_or(Value::Null);
        } else if line.starts_with("retry: ") {
            return None;
        }
    }
    (event.comment || !event.kind.is_empty()).then_some(event)
}

/// Reads the stream at `url` until it ends or `stop` says so.
async fn read(
    url: &str,
    last_event_id: Option<u64>,
    stop: impl Fn(&[Event]) -> bool,
) -> (u16, String, Vec<Event>) {
    let header = last_event_id.map(|id| HeaderValue::from_str(&id.to_string()).unwrap());
    read_raw(url, header, stop).await
}

/// [`read`], with any `Last-Event-ID` header value (a problem's body is read as one event
/// of kind `problem`).
async fn read_raw(
    url: &str,
    last_event_id: Option<HeaderValue>,
    stop: impl Fn(&[Event]) -> bool,
) -> (u16, String, Vec<Event>) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(value) = last_event_id {
        request = request.header("last-event-id", value);
    }
    let response =
        tokio::time::timeout(Duration::from_secs(30), request.send()).await.unwrap().unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if content_type == "application/problem+json" {
        let data = response.json().await.unwrap();
        return (
            status,
            content_type,
            vec![Event { kind: "problem".into(), data, ..Event::default() }],
        );
    }
    let mut events = Vec::new();
    let mut buffer = String::new();
    let mut body = response.bytes_stream();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(30), body.next()).await {
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            events.extend(parse(&block));
        }
        if stop(&events) {
            break;
        }
    }
    (status, content_type, events)
}

async fn events_url(api: &Api, job_id: &JobId) -> String {
    let job = api.get(&format!("/jobs/{job_id}")).await.json;
    job["events_url"].as_str().expect("a live job has an events_url").to_owned()
}

#[tokio::test]
async fn progress_streams_monotonically_then_the_terminal_event_closes_it() {
    stack();
    let api = Api::new(&principal("watcher"));
    // Each job here runs for seconds, so that it is still live when its stream link is asked
    // for, on a busy machine too.
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 30, "item_ms": 150}})).await;
    let url = events_url(&api, &job_id).await;
    let (status, content_type, events) = read(&url, None, |_| false).await;
    assert_eq!((status, content_type.as_str()), (200, "text/event-stream"));
    let events: Vec<Event> = events.into_iter().filter(|e| !e.comment).collect();
    let last = events.last().expect("events");
    assert_eq!((last.kind.as_str(), last.data["status"].as_str()), ("status", Some("succeeded")));
    assert_eq!(last.data["result_url"], format!("/jobs/{job_id}/result"));
    assert!(events.iter().filter(|e| e.kind == "progress").count() >= 2, "{events:?}");
    let ids: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    let pcts: Vec<f64> = events
        .iter()
        .filter(|e| e.kind == "progress")
        .map(|e| e.data["pct"].as_f64().unwrap())
        .collect();
    assert!(pcts.windows(2).all(|w| w[0] <= w[1]), "progress never goes back: {pcts:?}");
    // A progress bar ends full: the event before `succeeded` is progress at 100 %.
    let before_last = &events[events.len() - 2];
    assert_eq!(
        (before_last.kind.as_str(), before_last.data["pct"].as_f64()),
        ("progress", Some(100.0))
    );
    // A terminal job has nothing to stream, and stays cacheable.
    assert!(api.get(&format!("/jobs/{job_id}")).await.json.get("events_url").is_none());
}

#[tokio::test]
async fn a_reconnect_with_last_event_id_resumes_without_repeats() {
    stack();
    let api = Api::new(&principal("reconnect"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 60, "item_ms": 100}})).await;
    let url = events_url(&api, &job_id).await;
    let (_, _, first) =
        read(&url, None, |events| events.iter().filter(|e| e.kind == "progress").count() >= 3)
            .await;
    let seen = first.iter().filter_map(|e| e.id).max().unwrap();
    let (_, _, rest) = read(&url, Some(seen), |_| false).await;
    let ids: Vec<u64> = rest.iter().filter_map(|e| e.id).collect();
    assert!(!ids.is_empty() && ids.iter().all(|id| *id > seen), "resumed after {seen}: {ids:?}");
    assert_eq!(rest.iter().rfind(|e| !e.comment).unwrap().kind, "status");
}

#[tokio::test]
async fn an_idle_stream_sends_keepalive_comments() {
    stack();
    let api = Api::new(&principal("idle"));
    // Stalled far longer than a busy machine takes to open the stream, so that the stream
    // surely meets the stall; the keepalives come every second of it.
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 5, "item_ms": 10, "stall_at": 2, "stall_ms": 60_000}})).await;
    let url = events_url(&api, &job_id).await;
    let (_, _, events) = read(&url, None, |events| events.iter().any(|e| e.comment)).await;
    assert!(events.iter().any(|e| e.comment && e.kind == "keepalive"), "{events:?}");
    let cancelled = api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.text);
}

#[tokio::test]
async fn streams_are_tenant_scoped() {
    stack();
    let owner = Api::new(&principal("stream-owner"));
    let stranger = Api::new(&principal("stream-stranger"));
    let job_id =
        owner.submit(&json!({"type": "demo", "params": {"items": 40, "item_ms": 150}})).await;
    assert_eq!(stranger.get(&format!("/jobs/{job_id}")).await.status, 404, "no link for strangers");
    let url = events_url(&owner, &job_id).await;
    let other_job =
        owner.submit(&json!({"type": "demo", "params": {"items": 41, "item_ms": 50}})).await;
    for bad in [
        url.replace(job_id.as_str(), &other_job),
        url.split("?token=").next().unwrap().to_owned(),
        format!("{}?token=1.AAAA", url.split("?token=").next().unwrap()),
    ] {
        let (status, content_type, _) = read(&bad, None, |_| true).await;
        assert_eq!((status, content_type.as_str()), (401, "application/problem+json"), "{bad}");
    }
}

#[tokio::test]
async fn hostile_last_event_ids_are_refused_or_ignored_never_a_crash() {
    stack();
    let api = Api::new(&principal("hostile-reconnect"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 20, "item_ms": 250}})).await;
    let url = events_url(&api, &job_id).await;
    let huge = "9".repeat(4_000);
    for bad in [
        "-1",
        "+1",
        "1.5",
        "1e3",
        "0x10",
        "abc",
        "5 5",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        huge.as_str(),
    ] {
        let value = HeaderValue::from_str(bad).unwrap();
        let (status, content_type, events) = read_raw(&url, Some(value), |_| true).await;
        assert_eq!((status, content_type.as_str()), (400, "application/problem+json"), "{bad}");
        assert_eq!(events[0].data["type"], "/problems/bad-request", "{bad}");
    }
    // Not text: UTF-8 digits of another script, and bytes that are no UTF-8 at all.
    for bad in ["١٢٣".as_bytes(), b"\xff\xfe"] {
        let value = HeaderValue::from_bytes(bad).unwrap();
        let (status, _, _) = read_raw(&url, Some(value), |_| true).await;
        assert_eq!(status, 400, "{bad:?}");
    }
    // Blank is what EventSource means by no id: the stream starts over.
    for blank in ["", "   "] {
        let value = HeaderValue::from_str(blank).unwrap();
        let (status, content_type, _) = read_raw(&url, Some(value), |_| true).await;
        assert_eq!((status, content_type.as_str()), (200, "text/event-stream"), "{blank:?}");
    }
    // The largest id accepted: nothing after it but the terminal event, whose id (one more)
    // is the largest u64, not a wrap to 0 nor a panic.
    let (status, _, events) = read(&url, Some(u64::MAX - 1), |_| false).await;
    assert_eq!(status, 200);
    let events: Vec<Event> = events.into_iter().filter(|e| !e.comment).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].kind.as_str(), events[0].id), ("status", Some(u64::MAX)));
    assert_eq!(events[0].data["status"], "succeeded");
}

/// The data of the last `progress` event, without the job id and status it carries besides
/// the progress: what `GET /jobs/{id}` shows as `progress`.
fn last_progress(events: &[Event]) -> Value {
    let mut data =
        events.iter().rev().find(|e| e.kind == "progress").expect("a progress event").data.clone();
    let object = data.as_object_mut().expect("an object");
    object.remove("job_id");
    object.remove("status");
    data
}

/// Streams `job_id` (delayed, so its stream is open before it starts) to its end; returns its
/// events and then its `GET /jobs/{id}`.
async fn stream_to_the_end(api: &Api, job_id: &JobId) -> (Vec<Event>, Value) {
    let url = events_url(api, job_id).await;
    let (status, _, events) =
        read(&url, None, |events| events.iter().any(|e| e.kind == "status")).await;
    assert_eq!(status, 200);
    let job = api.wait_terminal(job_id, Duration::from_secs(60)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let end = events.iter().rev().find(|e| !e.comment).expect("events");
    assert_eq!((end.kind.as_str(), end.data["status"].as_str()), ("status", Some("succeeded")));
    (events, job)
}

/// A job that ends within one progress interval (200 ms here) says what its end was, the same
/// in `GET /jobs/{id}` and in its stream: 100 %, every item done, nothing left — not its last
/// progress write.
#[tokio::test]
async fn a_job_shorter_than_a_progress_interval_ends_the_same_in_its_status_and_its_stream() {
    stack();
    let api = Api::new(&principal("short-job"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 3}, "delay_seconds": 5})).await;
    let (events, job) = stream_to_the_end(&api, &job_id).await;
    let progress = &job["progress"];
    assert_eq!(progress["pct"].as_f64(), Some(100.0), "{job}");
    assert_eq!(progress["items_total"], 3, "{job}");
    assert_eq!(progress["items_done"], progress["items_total"], "{job}");
    assert_eq!(progress["eta"], 0, "{job}");
    assert_eq!(&last_progress(&events), progress, "the stream ends where the status does");
}

/// A `csv_report` whose last stage (publish) ends within one progress interval leaves that
/// stage's first write (0 items, no total) as its last: its end shows no count rather than
/// that 0 — and the stream shows the same.
#[tokio::test]
async fn a_last_stage_that_never_counted_ends_with_no_count_in_status_and_stream() {
    stack();
    let api = Api::new(&principal("short-report"));
    let input =
        api.upload("small.csv", "text/csv", b"region,amount\neu,1\nus,2\neu,3\n".to_vec()).await;
    let job_id = api
        .submit(&json!({"type": "csv_report", "delay_seconds": 5, "params": {
            "input": input, "group_by": ["region"], "metrics": [{"op": "count"}]}}))
        .await;
    let (events, job) = stream_to_the_end(&api, &job_id).await;
    let progress = &job["progress"];
    assert_eq!(progress["pct"].as_f64(), Some(100.0), "{job}");
    assert_eq!((&progress["stage"], &progress["stage_index"]), (&json!("publish"), &json!(3)));
    assert_eq!(progress["items_done"], progress["items_total"], "{job}");
    assert_ne!(progress["items_done"], 0, "not a count from before the end: {job}");
    assert_eq!(progress["eta"], 0, "{job}");
    assert_eq!(&last_progress(&events), progress, "the stream ends where the status does");
}
