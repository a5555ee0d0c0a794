//! The delivery routes over the in-memory adapters: listing an endpoint's deliveries (filter,
//! pages, refusals), resending one (what may be resent and what is refused), recovering the
//! failed ones since a time (bounded per call, continued by cursor), and a queue that refuses.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use lambda_http::Body;
use longhaul_aws::jobs::EndpointDelivery;
use longhaul_aws::ports::{Clock, EndpointDeliveries, EndpointHealth};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointId, endpoint_message_id,
};
use longhaul_domain::{JobId, JobStatus, Timestamp};
use longhaul_memory::api::{ApiRequest, json_of};
use longhaul_memory::{nth_job, owner};
use serde_json::{Value, json};

use crate::handle;
use crate::tests::{World, world};
use crate::tests_endpoints::{call, created, problem, spec};

/// A delivery record of `event` of job `job` to `endpoint`, first recorded `created_at`.
fn delivery(
    endpoint: &EndpointId,
    job: &JobId,
    event: EndpointEvent,
    status: DeliveryStatus,
    created_at: Timestamp,
) -> EndpointDelivery {
    let seq = (event == EndpointEvent::JobProgress).then_some(7);
    EndpointDelivery {
        webhook_id: endpoint_message_id(endpoint, job, event, seq),
        endpoint_id: endpoint.clone(),
        job_id: job.clone(),
        event,
        status,
        attempts: if status == DeliveryStatus::Pending { 0 } else { 3 },
        created_at,
        last_attempt_at: (status != DeliveryStatus::Pending).then_some(created_at),
        status_code: (status != DeliveryStatus::Pending).then_some(503),
        latency_ms: (status != DeliveryStatus::Pending).then_some(12),
        error: (status == DeliveryStatus::Failed).then(|| "answered 503".to_owned()),
        progress_seq: seq,
        result_expires_at: (event == EndpointEvent::JobResultExpiring)
            .then(|| "2026-12-01T00:00:00Z".parse().unwrap()),
    }
}

/// Records `delivery`.
async fn seed(w: &World, delivery: &EndpointDelivery) {
    w.endpoints.record_endpoint_delivery(delivery).await.unwrap();
}

/// An endpoint of alice's.
/// An endpoint of alice's that receives every event these tests deliver.
async fn endpoint(w: &World) -> EndpointId {
    let mut every = spec();
    every["events"] = json!([
        "job.succeeded",
        "job.failed",
        "job.cancelled",
        "job.progress",
        "job.result_expiring"
    ]);
    created(&w.deps, "alice", &every).await.parse().unwrap()
}

fn now(w: &World) -> Timestamp {
    Timestamp::from(w.clock.now())
}

fn ago(w: &World, seconds: i64) -> Timestamp {
    Timestamp::from(w.clock.now() - chrono::Duration::seconds(seconds))
}

/// `GET /webhooks/endpoints/{endpoint_id}/deliveries` as `who` with `query`.
async fn list(
    w: &World,
    who: &str,
    id: &str,
    query: &[(&str, &str)],
) -> lambda_http::Response<Body> {
    let mut request = ApiRequest::new("GET", &format!("/webhooks/endpoints/{id}/deliveries"), who)
        .route("GET /webhooks/endpoints/{endpoint_id}/deliveries")
        .param("endpoint_id", id);
    for (name, value) in query {
        request = request.query(name, value);
    }
    handle(&w.deps, request.build()).await
}

async fn resend(w: &World, who: &str, webhook_id: &str) -> lambda_http::Response<Body> {
    let request =
        ApiRequest::new("POST", &format!("/webhooks/deliveries/{webhook_id}/resend"), who)
            .route("POST /webhooks/deliveries/{webhook_id}/resend")
            .param("webhook_id", webhook_id);
    handle(&w.deps, request.build()).await
}

async fn recover(w: &World, who: &str, id: &str, body: &Value) -> lambda_http::Response<Body> {
    call(&w.deps, who, "POST /webhooks/endpoints/{endpoint_id}/recover", Some(id), Some(body)).await
}

async fn stored(w: &World, d: &EndpointDelivery) -> EndpointDelivery {
    w.endpoints.endpoint_delivery(&d.endpoint_id, &d.job_id, d.event).await.unwrap().unwrap()
}

fn webhook_ids(page: &Value) -> Vec<String> {
    page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["webhook_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn deliveries_are_listed_newest_job_first_filtered_and_paged() {
    let w = world();
    let id = endpoint(&w).await;
    let failed =
        delivery(&id, &nth_job(1), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 60));
    let delivered = delivery(
        &id,
        &nth_job(2),
        EndpointEvent::JobSucceeded,
        DeliveryStatus::Delivered,
        ago(&w, 50),
    );
    let pending = delivery(
        &id,
        &nth_job(3),
        EndpointEvent::JobCancelled,
        DeliveryStatus::Pending,
        ago(&w, 40),
    );
    let progress =
        delivery(&id, &nth_job(4), EndpointEvent::JobProgress, DeliveryStatus::Failed, ago(&w, 30));
    for d in [&failed, &delivered, &pending, &progress] {
        seed(&w, d).await;
    }
    // Another endpoint's delivery is not this one's.
    let other = endpoint(&w).await;
    seed(
        &w,
        &delivery(&other, &nth_job(5), EndpointEvent::JobFailed, DeliveryStatus::Failed, now(&w)),
    )
    .await;

    let response = list(&w, "alice", id.as_str(), &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "no-store");
    let page = json_of(&response);
    assert_eq!(
        webhook_ids(&page),
        [&progress, &pending, &delivered, &failed].map(|d| d.webhook_id.clone()),
        "newest job first"
    );
    assert!(page.get("next_cursor").is_none(), "{page}");
    let shown = &page["deliveries"][3];
    assert_eq!(
        *shown,
        json!({
            "webhook_id": failed.webhook_id, "job_id": nth_job(1), "event": "job.failed",
            "status": "failed", "attempts": 3, "created_at": failed.created_at,
            "last_attempt_at": failed.created_at, "status_code": 503, "latency_ms": 12,
            "error": "answered 503",
        })
    );
    assert_eq!(
        page["deliveries"][1],
        json!({
            "webhook_id": pending.webhook_id, "job_id": nth_job(3), "event": "job.cancelled",
            "status": "pending", "attempts": 0, "created_at": pending.created_at,
        }),
        "nothing unset is shown"
    );

    let only_failed = json_of(&list(&w, "alice", id.as_str(), &[("status", "failed")]).await);
    assert_eq!(webhook_ids(&only_failed), [&progress, &failed].map(|d| d.webhook_id.clone()));

    // Pages of one, to the end.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("limit", "1")];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.as_str()));
        }
        let page = json_of(&list(&w, "alice", id.as_str(), &query).await);
        seen.extend(webhook_ids(&page));
        match page.get("next_cursor") {
            Some(next) => cursor = Some(next.as_str().unwrap().to_owned()),
            None => break,
        }
        assert!(seen.len() <= 4, "pages end");
    }
    assert_eq!(seen, webhook_ids(&page), "the pages hold the listing, once each");
}

#[tokio::test]
async fn a_listing_with_bad_parameters_or_of_someone_elses_endpoint_is_refused() {
    let w = world();
    let id = endpoint(&w).await;
    let garbage = URL_SAFE_NO_PAD.encode("not a position");
    let long = "x".repeat(300);
    for query in [
        vec![("status", "lost")],
        vec![("status", "")],
        vec![("limit", "0")],
        vec![("limit", "101")],
        vec![("limit", "ten")],
        vec![("cursor", "")],
        vec![("cursor", "!!!")],
        vec![("cursor", garbage.as_str())],
        vec![("cursor", long.as_str())],
        vec![("sort", "asc")],
    ] {
        let response = list(&w, "alice", id.as_str(), &query).await;
        problem(&response, 400, "bad-request");
    }
    problem(&list(&w, "bob", id.as_str(), &[]).await, 404, "not-found");
    problem(&list(&w, "alice", "nope", &[]).await, 404, "not-found");
    problem(&list(&w, "alice", EndpointId::new().as_str(), &[]).await, 404, "not-found");
    let limit = list(&w, "alice", id.as_str(), &[("limit", "100"), ("status", "pending")]).await;
    assert_eq!(json_of(&limit), json!({"deliveries": []}));
}

#[tokio::test]
async fn a_failed_delivery_is_resent_once_with_its_own_webhook_id() {
    let w = world();
    let id = endpoint(&w).await;
    let failed = delivery(
        &id,
        &nth_job(1),
        EndpointEvent::JobCancelled,
        DeliveryStatus::Failed,
        ago(&w, 60),
    );
    seed(&w, &failed).await;
    let response = resend(&w, "alice", &failed.webhook_id).await;
    assert_eq!(response.status(), 202);
    assert_eq!(json_of(&response), json!({"webhook_id": failed.webhook_id, "status": "pending"}));
    assert_eq!(stored(&w, &failed).await.status, DeliveryStatus::Pending);
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1);
    let (message, delay) = &sent[0];
    assert_eq!(*delay, 0);
    assert_eq!(message.job_id, nth_job(1));
    assert_eq!(message.status, JobStatus::Cancelled);
    assert_eq!(message.endpoint_id.as_ref(), Some(&id));
    assert_eq!(message.event, Some(EndpointEvent::JobCancelled));
    assert_eq!(message.attempt, 1);

    // Queued already: a second resend queues nothing more.
    problem(&resend(&w, "alice", &failed.webhook_id).await, 409, "delivery-pending");
    assert_eq!(w.queue.sent().len(), 1);
}

#[tokio::test]
async fn a_delivered_event_may_be_asked_for_again_one_copy_at_a_time() {
    let w = world();
    let id = endpoint(&w).await;
    for (n, event, status) in [
        (1, EndpointEvent::JobSucceeded, JobStatus::Succeeded),
        (2, EndpointEvent::JobFailed, JobStatus::Failed),
        (3, EndpointEvent::JobResultExpiring, JobStatus::Succeeded),
    ] {
        let delivered = delivery(&id, &nth_job(n), event, DeliveryStatus::Delivered, ago(&w, 60));
        seed(&w, &delivered).await;
        let response = resend(&w, "alice", &delivered.webhook_id).await;
        assert_eq!(response.status(), 202, "{event}");
        assert_eq!(
            stored(&w, &delivered).await,
            EndpointDelivery { status: DeliveryStatus::Pending, ..delivered.clone() },
            "moved to pending before it was queued"
        );
        let (message, _) = w.queue.sent().pop().unwrap();
        assert_eq!((message.event, message.status), (Some(event), status));
        assert_eq!(message.result_expires_at, delivered.result_expires_at, "{event}");
        // While that copy is queued, resending again queues nothing: a client looping on
        // resend cannot grow the queue.
        problem(&resend(&w, "alice", &delivered.webhook_id).await, 409, "delivery-pending");
    }
    assert_eq!(w.queue.sent().len(), 3);
}

#[tokio::test]
async fn a_pending_delivery_that_went_quiet_is_lost_and_resent_once() {
    let w = world();
    let id = endpoint(&w).await;
    let lost_after = crate::tests::LOST_AFTER.as_secs() as i64;
    // Attempted within the deliverer's longest wait: still being retried.
    let retrying = EndpointDelivery {
        attempts: 4,
        last_attempt_at: Some(ago(&w, lost_after - 60)),
        ..delivery(
            &id,
            &nth_job(1),
            EndpointEvent::JobFailed,
            DeliveryStatus::Pending,
            ago(&w, 2 * lost_after),
        )
    };
    // Its last attempt recorded longer ago than that: its message was lost.
    let lost = EndpointDelivery {
        attempts: 4,
        last_attempt_at: Some(ago(&w, lost_after + 60)),
        ..delivery(
            &id,
            &nth_job(2),
            EndpointEvent::JobFailed,
            DeliveryStatus::Pending,
            ago(&w, 2 * lost_after),
        )
    };
    for d in [&retrying, &lost] {
        seed(&w, d).await;
    }
    problem(&resend(&w, "alice", &retrying.webhook_id).await, 409, "delivery-pending");
    assert!(w.queue.sent().is_empty());
    assert_eq!(resend(&w, "alice", &lost.webhook_id).await.status(), 202);
    assert_eq!(w.queue.sent().len(), 1, "queued again");
    // Queued again just now: a second resend is refused until it goes quiet again.
    problem(&resend(&w, "alice", &lost.webhook_id).await, 409, "delivery-pending");
    assert_eq!(w.queue.sent().len(), 1);

    // One whose requeue the queue refused is put back as it was: the repeat the 503 asks
    // for takes it at once.
    let refused = EndpointDelivery {
        attempts: 4,
        last_attempt_at: Some(ago(&w, lost_after + 60)),
        ..delivery(
            &id,
            &nth_job(3),
            EndpointEvent::JobFailed,
            DeliveryStatus::Pending,
            ago(&w, 2 * lost_after),
        )
    };
    seed(&w, &refused).await;
    w.queue.set_unavailable(true);
    assert_eq!(resend(&w, "alice", &refused.webhook_id).await.status(), 503);
    w.queue.set_unavailable(false);
    assert_eq!(resend(&w, "alice", &refused.webhook_id).await.status(), 202);
    assert_eq!(w.queue.sent().len(), 2);
}

#[tokio::test]
async fn what_cannot_be_resent_is_refused_and_nothing_is_queued() {
    let w = world();
    let id = endpoint(&w).await;
    let progress =
        delivery(&id, &nth_job(1), EndpointEvent::JobProgress, DeliveryStatus::Failed, ago(&w, 9));
    let failed =
        delivery(&id, &nth_job(2), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 9));
    for d in [&progress, &failed] {
        seed(&w, d).await;
    }
    problem(&resend(&w, "alice", &progress.webhook_id).await, 409, "not-replayable");
    // Not an endpoint delivery's id, or no such delivery, or not alice's endpoint: 404.
    let callback = longhaul_domain::webhooks::message_id(&nth_job(2), JobStatus::Failed);
    let missing = endpoint_message_id(&id, &nth_job(3), EndpointEvent::JobFailed, None);
    let elsewhere =
        endpoint_message_id(&EndpointId::new(), &nth_job(2), EndpointEvent::JobFailed, None);
    for unknown in ["garbage", "msg_", callback.as_str(), missing.as_str(), elsewhere.as_str()] {
        problem(&resend(&w, "alice", unknown).await, 404, "not-found");
    }
    problem(&resend(&w, "bob", &failed.webhook_id).await, 404, "not-found");

    let at = now(&w);
    w.endpoints
        .disable_endpoint(&owner("alice"), &id, DisabledReason::Failing, None, at)
        .await
        .unwrap();
    let refused = problem(&resend(&w, "alice", &failed.webhook_id).await, 409, "endpoint-disabled");
    assert!(refused["detail"].as_str().unwrap().contains("enable it first"), "{refused}");
    assert_eq!(refused["disabled_reason"], "failing");
    assert!(w.queue.sent().is_empty(), "nothing was queued");
    assert_eq!(stored(&w, &failed).await, failed, "nothing was written");
}

#[tokio::test]
async fn an_event_the_endpoint_no_longer_subscribes_to_is_neither_resent_nor_recovered() {
    let w = world();
    let id: EndpointId = created(&w.deps, "alice", &spec()).await.parse().unwrap();
    // Failed while the endpoint received job.cancelled; its events were changed since.
    let unsubscribed = delivery(
        &id,
        &nth_job(1),
        EndpointEvent::JobCancelled,
        DeliveryStatus::Failed,
        ago(&w, 60),
    );
    let subscribed =
        delivery(&id, &nth_job(2), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 60));
    for d in [&unsubscribed, &subscribed] {
        seed(&w, d).await;
    }
    let refused =
        problem(&resend(&w, "alice", &unsubscribed.webhook_id).await, 409, "not-replayable");
    assert!(refused["detail"].as_str().unwrap().contains("job.cancelled"), "{refused}");
    assert_eq!(stored(&w, &unsubscribed).await, unsubscribed, "unchanged");
    let response = recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 3600)})).await;
    assert_eq!(response.status(), 202);
    assert_eq!(json_of(&response)["requeued"], 1, "only the subscribed one");
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.event, Some(EndpointEvent::JobFailed));
    assert_eq!(stored(&w, &unsubscribed).await.status, DeliveryStatus::Failed);
}

#[tokio::test]
async fn a_resend_the_queue_refuses_is_503_and_leaves_the_delivery_as_it_was() {
    let w = world();
    let id = endpoint(&w).await;
    for (n, status) in [(1, DeliveryStatus::Failed), (2, DeliveryStatus::Delivered)] {
        let read = delivery(&id, &nth_job(n), EndpointEvent::JobFailed, status, ago(&w, 9));
        seed(&w, &read).await;
        w.queue.set_unavailable(true);
        let response = resend(&w, "alice", &read.webhook_id).await;
        let refused = problem(&response, 503, "queue-unavailable");
        assert_eq!(response.headers()["retry-after"], "5");
        assert!(!refused.to_string().contains("in-memory"), "{refused}");
        assert_eq!(stored(&w, &read).await.status, status, "written back");
        w.queue.set_unavailable(false);
        assert_eq!(
            resend(&w, "alice", &read.webhook_id).await.status(),
            202,
            "so it can be resent"
        );
    }
    assert_eq!(w.queue.sent().len(), 2);
}

#[tokio::test]
async fn recover_queues_the_failed_replayable_deliveries_since_a_time() {
    let w = world();
    let id = endpoint(&w).await;
    let since = ago(&w, 3600);
    let recent = [
        delivery(&id, &nth_job(1), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 60)),
        delivery(&id, &nth_job(2), EndpointEvent::JobResultExpiring, DeliveryStatus::Failed, since),
        // An old job's delivery made recently: recovered (the job's age does not matter).
        delivery(&id, &nth_job(0), EndpointEvent::JobSucceeded, DeliveryStatus::Failed, ago(&w, 5)),
    ];
    let skipped = [
        delivery(&id, &nth_job(3), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 3601)),
        delivery(&id, &nth_job(4), EndpointEvent::JobProgress, DeliveryStatus::Failed, ago(&w, 60)),
        delivery(
            &id,
            &nth_job(5),
            EndpointEvent::JobFailed,
            DeliveryStatus::Delivered,
            ago(&w, 60),
        ),
        delivery(&id, &nth_job(6), EndpointEvent::JobFailed, DeliveryStatus::Pending, ago(&w, 60)),
    ];
    for d in recent.iter().chain(&skipped) {
        seed(&w, d).await;
    }
    let response = recover(&w, "alice", id.as_str(), &json!({"since": since})).await;
    assert_eq!(response.status(), 202);
    assert_eq!(json_of(&response), json!({"requeued": 3, "complete": true}));
    for d in &recent {
        assert_eq!(stored(&w, d).await.status, DeliveryStatus::Pending, "{}", d.webhook_id);
    }
    for d in &skipped {
        assert_eq!(stored(&w, d).await, *d, "{}", d.webhook_id);
    }
    let mut queued: Vec<(JobId, Option<EndpointEvent>, JobStatus)> =
        w.queue.sent().into_iter().map(|(m, _)| (m.job_id, m.event, m.status)).collect();
    queued.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        queued,
        [
            (nth_job(0), Some(EndpointEvent::JobSucceeded), JobStatus::Succeeded),
            (nth_job(1), Some(EndpointEvent::JobFailed), JobStatus::Failed),
            (nth_job(2), Some(EndpointEvent::JobResultExpiring), JobStatus::Succeeded),
        ]
    );
    // Again: nothing is failed any more, nothing is queued twice.
    let again = recover(&w, "alice", id.as_str(), &json!({"since": since})).await;
    assert_eq!(json_of(&again), json!({"requeued": 0, "complete": true}));
    assert_eq!(w.queue.sent().len(), 3);
}

#[tokio::test]
async fn a_recovery_is_bounded_per_call_and_goes_on_from_its_cursor() {
    let w = world();
    let id = endpoint(&w).await;
    for n in 0..1050 {
        let d = delivery(
            &id,
            &nth_job(n),
            EndpointEvent::JobFailed,
            DeliveryStatus::Failed,
            ago(&w, 60),
        );
        seed(&w, &d).await;
    }
    let since = json!(ago(&w, 3600));
    let first = json_of(&recover(&w, "alice", id.as_str(), &json!({"since": since})).await);
    assert_eq!(first["requeued"], 1000, "ten pages of a hundred");
    assert_eq!(first["complete"], false);
    let cursor = first["cursor"].as_str().unwrap();
    assert_eq!(w.queue.sent().len(), 1000);
    let rest = recover(&w, "alice", id.as_str(), &json!({"since": since, "cursor": cursor})).await;
    assert_eq!(json_of(&rest), json!({"requeued": 50, "complete": true}));
    let mut jobs: Vec<JobId> = w.queue.sent().into_iter().map(|(m, _)| m.job_id).collect();
    jobs.sort();
    jobs.dedup();
    assert_eq!(jobs.len(), 1050, "each once");
    assert!(w.endpoints.all_deliveries().iter().all(|d| d.status == DeliveryStatus::Pending));
}

#[tokio::test]
async fn a_recovery_with_a_bad_since_or_cursor_or_of_a_disabled_endpoint_is_refused() {
    let w = world();
    let id = endpoint(&w).await;
    let failed =
        delivery(&id, &nth_job(1), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 60));
    seed(&w, &failed).await;
    let future = now(&w).as_datetime() + chrono::Duration::seconds(60);
    let too_old = ago(&w, 31 * 24 * 3600);
    for body in [
        json!({}),
        json!({"since": null}),
        json!({"since": "yesterday"}),
        json!({"since": "2026-01-01"}),
        json!({"since": 1_700_000_000}),
        json!({"since": Timestamp::from(future)}),
        json!({"since": too_old}),
        json!({"since": ago(&w, 60), "cursor": "!!"}),
        json!({"since": ago(&w, 60), "cursor": URL_SAFE_NO_PAD.encode("x#y")}),
        json!({"since": ago(&w, 60), "until": now(&w)}),
        json!([]),
    ] {
        let response = recover(&w, "alice", id.as_str(), &body).await;
        problem(&response, 400, "bad-request");
    }
    problem(
        &recover(&w, "bob", id.as_str(), &json!({"since": ago(&w, 60)})).await,
        404,
        "not-found",
    );
    problem(&recover(&w, "alice", "x", &json!({"since": ago(&w, 60)})).await, 404, "not-found");
    w.endpoints
        .disable_endpoint(&owner("alice"), &id, DisabledReason::Gone, None, now(&w))
        .await
        .unwrap();
    let disabled = recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 60)})).await;
    problem(&disabled, 409, "endpoint-disabled");
    assert!(w.queue.sent().is_empty());
    assert_eq!(stored(&w, &failed).await, failed, "nothing was written");

    // Enabled again, the recovery fills the gap.
    let route = "POST /webhooks/endpoints/{endpoint_id}/enable";
    assert_eq!(call(&w.deps, "alice", route, Some(id.as_str()), None).await.status(), 200);
    let recovered = recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 60)})).await;
    assert_eq!(json_of(&recovered)["requeued"], 1);
}

#[tokio::test]
async fn a_recovery_the_queue_refuses_is_503_and_leaves_what_was_not_queued_failed() {
    let w = world();
    let id = endpoint(&w).await;
    let failed: Vec<_> = (1..=3)
        .map(|n| {
            delivery(
                &id,
                &nth_job(n),
                EndpointEvent::JobFailed,
                DeliveryStatus::Failed,
                ago(&w, 60),
            )
        })
        .collect();
    for d in &failed {
        seed(&w, d).await;
    }
    w.queue.set_unavailable(true);
    let response = recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 600)})).await;
    let refused = problem(&response, 503, "queue-unavailable");
    assert_eq!(refused["requeued"], 0);
    assert_eq!(response.headers()["retry-after"], "5");
    for d in &failed {
        assert_eq!(stored(&w, d).await.status, DeliveryStatus::Failed, "written back");
    }
    w.queue.set_unavailable(false);
    let response = recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 600)})).await;
    assert_eq!(json_of(&response), json!({"requeued": 3, "complete": true}));
}

#[tokio::test]
async fn a_failing_table_is_a_500_and_the_routes_wait_for_a_principal() {
    let w = world();
    let id = endpoint(&w).await;
    let failed =
        delivery(&id, &nth_job(1), EndpointEvent::JobFailed, DeliveryStatus::Failed, ago(&w, 60));
    seed(&w, &failed).await;
    w.endpoints.set_unavailable(true);
    problem(&list(&w, "alice", id.as_str(), &[]).await, 500, "internal");
    problem(&resend(&w, "alice", &failed.webhook_id).await, 500, "internal");
    problem(
        &recover(&w, "alice", id.as_str(), &json!({"since": ago(&w, 600)})).await,
        500,
        "internal",
    );
    w.endpoints.set_unavailable(false);
    let anonymous = ApiRequest::new("POST", "/webhooks/deliveries/x/resend", "alice")
        .route("POST /webhooks/deliveries/{webhook_id}/resend")
        .param("webhook_id", &failed.webhook_id)
        .anonymous();
    assert_eq!(handle(&w.deps, anonymous.build()).await.status(), 401);
    assert!(w.queue.sent().is_empty());
    assert_eq!(stored(&w, &failed).await, failed);
}

/// A deployment whose deliverer's longest wait is beyond the calendar (a misconfigured
/// schedule) never takes a pending delivery for lost: a resend is refused, never a panic.
#[tokio::test]
async fn an_absurd_longest_wait_makes_nothing_look_lost() {
    let mut w = world();
    w.deps.lost_after = std::time::Duration::from_secs(u64::MAX);
    let id = endpoint(&w).await;
    let pending = EndpointDelivery {
        attempts: 4,
        last_attempt_at: Some(ago(&w, 10 * 86_400)),
        ..delivery(
            &id,
            &nth_job(1),
            EndpointEvent::JobFailed,
            DeliveryStatus::Pending,
            ago(&w, 20 * 86_400),
        )
    };
    seed(&w, &pending).await;
    problem(&resend(&w, "alice", &pending.webhook_id).await, 409, "delivery-pending");
    assert!(w.queue.sent().is_empty());
}
