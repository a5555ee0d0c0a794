//! The webhook deliverer under a partner whose DNS never answers, against the local stack:
//! the lookup is bounded, the hung delivery is a failed attempt of its own, and the batch's
//! other deliveries — other tenants' — go out regardless, concurrently.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_aws::jobs::JobStore;
use longhaul_aws::queue::WebhookMessage;
use longhaul_domain::{JobStatus, Transition};
use longhaul_tests::partner::{inbox, partner_url};
use longhaul_tests::{Harness, harness_with, principal};
use serde_json::json;

/// The lookup limit the test's deliverer uses.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(1500);

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1")])
}

/// `fast.partner.test` is the local receiver; every other name's lookup never answers.
/// Hangs every lookup but the fast partner's, noting when each hanging one started.
#[derive(Default)]
struct Hanging {
    hung_at: std::sync::Mutex<Vec<Instant>>,
}

impl webhook::Resolver for Hanging {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move {
            if host == "fast.partner.test" {
                Ok(vec![SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), port)])
            } else {
                self.hung_at.lock().unwrap().push(Instant::now());
                std::future::pending().await
            }
        })
    }
}

/// A finished job of its own owner whose callback is `url`.
async fn job_with_callback(jobs: &JobStore, url: &str) -> longhaul_domain::JobId {
    let now = longhaul_domain::now_rfc3339();
    let job_id = longhaul_domain::JobId::new();
    let record: longhaul_aws::jobs::JobRecord = serde_json::from_value(json!({
        "job_id": job_id, "owner": principal("tenant"), "type": "demo", "params": {"items": 1},
        "status": "succeeded", "attempt": 1, "idempotency_key": "k", "fingerprint": "f",
        "callback_url": url, "created_at": now, "updated_at": now, "finished_at": now,
        "transitions": [Transition { state: JobStatus::Succeeded, at: now.parse().unwrap(), reason: "test".into() }],
    }))
    .unwrap();
    jobs.put_job(&record).await.unwrap();
    job_id
}

/// The deliverer's dependencies, with `resolver` and a one-minute retry delay (the retries
/// this test queues stay out of its way).
async fn deps(resolver: Arc<dyn webhook::Resolver>) -> webhook::Deps {
    let stack = &stack().stack;
    let emulator = |name: &str| stack.resource(name).replace(&stack.edge_url, &stack.emulator.url);
    let vars = [
        ("TABLE_NAME".to_string(), stack.resource("JobsTable")),
        ("WEBHOOK_QUEUE_URL".to_string(), emulator("WebhookQueue")),
        ("WEBHOOK_DLQ_URL".to_string(), emulator("WebhookDeadLetterQueue")),
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS".to_string(), "1".to_string()),
        ("LONGHAUL_WEBHOOK_SCHEDULE_SECONDS".to_string(), "60".to_string()),
        ("LONGHAUL_WEBHOOK_TIMEOUT_MS".to_string(), "5000".to_string()),
        (
            "LONGHAUL_WEBHOOK_RESOLVE_TIMEOUT_MS".to_string(),
            RESOLVE_TIMEOUT.as_millis().to_string(),
        ),
    ];
    let vars = longhaul_aws::config::Vars::from_map(vars.into_iter().collect());
    let config = webhook::Config::from_vars(&vars).unwrap();
    assert_eq!(config.resolve_timeout, RESOLVE_TIMEOUT);
    webhook::Deps::new(&stack.emulator_sdk_config().await, &config, resolver).unwrap()
}

#[tokio::test]
async fn a_partner_whose_dns_hangs_fails_alone_and_does_not_hold_the_batch() {
    stack();
    let sdk = stack().stack.emulator_sdk_config().await;
    let jobs =
        JobStore::new(aws_sdk_dynamodb::Client::new(&sdk), stack().stack.resource("JobsTable"));
    // The shared local partner, under a name the test's resolver answers.
    let (url, key) = partner_url("ok");
    let fast = job_with_callback(&jobs, &url.replace("127.0.0.1", "fast.partner.test")).await;
    // Three partners whose lookups hang: delivered one after another they would take three
    // lookup limits; concurrently, one.
    let mut slow = Vec::new();
    for n in 0..3 {
        slow.push(job_with_callback(&jobs, &format!("http://slow{n}.partner.test/hook")).await);
    }
    let records: Vec<_> = slow
        .iter()
        .chain([&fast])
        .map(|job_id| {
            let message = WebhookMessage::callback(job_id.clone(), JobStatus::Succeeded);
            json!({"messageId": job_id, "body": serde_json::to_string(&message).unwrap()})
        })
        .collect();
    let event = serde_json::from_value(json!({ "Records": records })).unwrap();
    let resolver = Arc::new(Hanging::default());
    let deps = deps(resolver.clone()).await;

    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(20), webhook::handle(&deps, event))
        .await
        .expect("a batch with a hung DNS lookup finishes");
    let took = started.elapsed();
    assert!(response.batch_item_failures.is_empty(), "nothing is redelivered by SQS");
    // Concurrent, not one lookup limit after another: every hanging lookup began before the
    // first one's limit ran out (one after another, each would begin a limit after the last).
    // Measured between the lookups, not over the batch, whose AWS calls a busy machine slows.
    let hung_at = resolver.hung_at.lock().unwrap().clone();
    assert_eq!(hung_at.len(), 3, "one lookup per hanging partner ({took:?})");
    let spread = hung_at.iter().max().unwrap().duration_since(*hung_at.iter().min().unwrap());
    assert!(
        spread < RESOLVE_TIMEOUT,
        "the batch's deliveries run concurrently: lookups began {spread:?} apart ({took:?})"
    );

    // The other tenant's webhook went out, and is recorded as delivered.
    assert_eq!(inbox(&key).len(), 1);
    let delivered = jobs.deliveries(&fast).await.unwrap();
    assert_eq!(
        (delivered.len(), delivered[0].status_code, delivered[0].outcome.as_str()),
        (1, Some(204), "delivered")
    );
    // Each hung one is a failed attempt of its own, with the reason, retried on the schedule.
    for (n, job_id) in slow.iter().enumerate() {
        let recorded = jobs.deliveries(job_id).await.unwrap();
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        assert_eq!(
            recorded[0].error.as_deref(),
            Some(format!("slow{n}.partner.test did not resolve within 1500 ms").as_str())
        );
        assert_eq!(recorded[0].status_code, None, "no connection was made");
        assert_eq!(recorded[0].outcome, "retrying");
        assert_eq!(recorded[0].attempt, 1);
    }
}
