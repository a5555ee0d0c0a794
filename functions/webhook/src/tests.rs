//! The deliverer over in-memory adapters and a local partner: every outcome of an attempt
//! (delivered, retried on the schedule, stopped, dead-lettered), the signature, the SSRF guard
//! (nothing is sent to a non-public address), lookups that fail or hang, delays longer than a
//! hop, jobs that are gone, and the failures SQS redelivers.
//!
//! The partner is a small HTTP server on 127.0.0.1; callbacks name a public-looking host that
//! the test's resolver answers with the server's address, under the local stack's insecure
//! policy (http and loopback allowed) unless a test says otherwise.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lambda_events::sqs::SqsEvent;
use longhaul_aws::endpoint_events::{DISABLED_ERROR, UNSUBSCRIBED_ERROR};
use longhaul_aws::jobs::{
    DeliveryRecord, EndpointDelivery, EndpointRecord, JobRecord, ProgressRecord, RecordRetention,
};
use longhaul_domain::endpoints::{
    DeliveryStatus, DisabledReason, EndpointEvent, EndpointStatus, endpoint_message_id,
};
use longhaul_domain::webhooks::verify;
use longhaul_domain::{JobError, JobStatus, Timestamp};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryEndpoints, MemoryJobStore, MemoryRateLimits, MemoryWebhookQueue, owner,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const HOST: &str = "partner.example.com";
const OWNER: &str = "alice";

/// One request the partner received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    /// Lower-cased names.
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// How the partner answers.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    /// Reads the request and never answers.
    Never,
}

/// A partner on 127.0.0.1: what it received, and how many connections it accepted.
struct Partner {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    connections: Arc<AtomicUsize>,
}

impl Partner {
    async fn start(answer: Answer) -> Partner {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (inbox, count) = (received.clone(), connections.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let inbox = inbox.clone();
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else { return };
                    inbox.lock().unwrap().push(request);
                    match answer {
                        Answer::Status(code) => {
                            let answer = format!(
                                "HTTP/1.1 {code} Whatever\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                            );
                            socket.write_all(answer.as_bytes()).await.ok();
                        }
                        Answer::Never => std::future::pending::<()>().await,
                    }
                });
            }
        });
        Partner { port, received, connections }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{HOST}:{}{path}", self.port)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Reads one HTTP/1.1 request with a `content-length` body.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let read = socket.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, path) = (request_line.next()?.to_owned(), request_line.next()?.to_owned());
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let read = socket.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&chunk[..read]);
    }
    Some(Received { method, path, headers, body })
}

/// What a lookup answers.
#[derive(Debug, Clone)]
enum Lookup {
    Addresses(Vec<IpAddr>),
    Fails,
    Hangs,
}

/// The test's DNS: [`HOST`] answers `lookup`; every lookup is counted.
struct Dns {
    lookup: Lookup,
    asked: Mutex<Vec<(String, u16)>>,
}

impl Dns {
    fn answering(lookup: Lookup) -> Arc<Dns> {
        Arc::new(Dns { lookup, asked: Mutex::new(Vec::new()) })
    }

    fn asked(&self) -> Vec<(String, u16)> {
        self.asked.lock().unwrap().clone()
    }
}

impl Resolver for Dns {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        self.asked.lock().unwrap().push((host.to_owned(), port));
        Box::pin(async move {
            assert_eq!(host, HOST, "only the partner's host is looked up");
            match &self.lookup {
                Lookup::Addresses(ips) => {
                    Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
                }
                Lookup::Fails => Err(std::io::Error::other("NXDOMAIN")),
                Lookup::Hangs => std::future::pending().await,
            }
        })
    }
}

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Attempts 1 … 3: retries after 5 s and 300 s, then dead letters.
fn config() -> Config {
    Config {
        table: "jobs".into(),
        queue_url: "webhooks".into(),
        dead_letter_url: "webhooks-dlq".into(),
        schedule: RetrySchedule(vec![5, 300]),
        timeout: Duration::from_secs(5),
        resolve_timeout: Duration::from_millis(300),
        allow_insecure: true,
        record_retention: RecordRetention::default(),
        disable_after: Duration::from_secs(3_600),
        tenant_rate: 0,
    }
}

struct World {
    jobs: Arc<MemoryJobStore>,
    endpoints: Arc<MemoryEndpoints>,
    rate: Arc<MemoryRateLimits>,
    queue: Arc<MemoryWebhookQueue>,
    dead_letters: Arc<MemoryWebhookQueue>,
    dns: Arc<Dns>,
    /// The deliverer's clock: standing still at the time the world was made, unless a test
    /// moves it.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world_with(config: Config, lookup: Lookup) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let queue = Arc::new(MemoryWebhookQueue::new());
    let dead_letters = Arc::new(MemoryWebhookQueue::new());
    let dns = Dns::answering(lookup);
    let clock = Arc::new(ManualClock::new());
    let rate = Arc::new(MemoryRateLimits::new(0));
    let endpoints = Arc::new(MemoryEndpoints::new());
    let deps = Deps {
        jobs: jobs.clone(),
        endpoints: endpoints.clone(),
        queue: queue.clone(),
        dead_letters: dead_letters.clone(),
        rate: rate.clone(),
        progress_rate: Arc::new(MemoryRateLimits::new(0)),
        config,
        resolver: dns.clone(),
        clock: clock.clone(),
        tls: Arc::new(tls_config().unwrap()),
    };
    World { jobs, endpoints, rate, queue, dead_letters, dns, clock, deps }
}

/// The partner's host resolves to the local partner.
fn world() -> World {
    world_with(config(), Lookup::Addresses(vec![LOOPBACK]))
}

impl World {
    /// A job of [`OWNER`] that ended `status`, with `callback` (as submit stored it).
    fn ended(&self, status: JobStatus, callback: Option<&str>) -> JobRecord {
        let mut job = pending_job(&owner(OWNER), Timestamp::now());
        job.status = status;
        job.attempt = 1;
        job.callback_url = callback.map(str::to_owned);
        job.finished_at = Some(Timestamp::now());
        if status == JobStatus::Failed {
            job.error = Some(JobError { code: "Job.Fatal".into(), message: "bad input".into() });
        }
        self.jobs.put_record(job.clone());
        job
    }

    async fn deliveries(&self, job: &JobRecord) -> Vec<DeliveryRecord> {
        self.jobs.deliveries(&job.job_id).await.unwrap()
    }

    /// The one attempt recorded for `job`.
    async fn attempt(&self, job: &JobRecord) -> DeliveryRecord {
        let mut recorded = self.deliveries(job).await;
        assert_eq!(recorded.len(), 1, "{recorded:?}");
        recorded.remove(0)
    }

    fn nothing_queued(&self) {
        assert!(self.queue.sent().is_empty(), "retries: {:?}", self.queue.sent());
        assert!(
            self.dead_letters.sent().is_empty(),
            "dead letters: {:?}",
            self.dead_letters.sent()
        );
    }
}

fn message(job: &JobRecord, attempt: u32) -> WebhookMessage {
    WebhookMessage { attempt, ..WebhookMessage::callback(job.job_id.clone(), job.status) }
}

impl World {
    /// The deliverer's time, in epoch seconds (what `not_before` and signatures are in).
    fn now(&self) -> i64 {
        self.clock.now().timestamp()
    }
}

#[tokio::test]
async fn a_2xx_is_delivered_once_signed_to_the_checked_address_and_recorded() {
    let w = world();
    let partner = Partner::start(Answer::Status(204)).await;
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hooks/longhaul?t=1")));
    process(&w.deps, &message(&job, 1)).await.unwrap();

    let received = partner.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/hooks/longhaul?t=1"));
    // The lookup happened once, and the connection went to its checked answer under the
    // partner's name.
    assert_eq!(w.dns.asked(), [(HOST.to_owned(), partner.port)]);
    assert_eq!(request.headers["host"], format!("{HOST}:{}", partner.port));
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.headers["user-agent"], "longhaul-webhooks/1");
    let id = &request.headers["webhook-id"];
    assert_eq!(id, &message_id(&job.job_id, JobStatus::Succeeded));
    let timestamp: i64 = request.headers["webhook-timestamp"].parse().unwrap();
    assert_eq!(timestamp, w.now(), "signed at the time it is sent");
    let secrets = w.jobs.webhook_secrets(&owner(OWNER)).await.unwrap();
    let signature = &request.headers["webhook-signature"];
    assert!(verify(&secrets.secrets[0].secret, id, timestamp, &request.body, signature));
    assert!(!verify(&secrets.secrets[0].secret, id, timestamp + 1, &request.body, signature));
    let mut tampered = request.body.clone();
    tampered[0] = b' ';
    assert!(!verify(&secrets.secrets[0].secret, id, timestamp, &tampered, signature));

    let payload: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        payload,
        json!({
            "type": "job.succeeded",
            "job_id": job.job_id,
            "status": "succeeded",
            "timestamp": job.finished_at,
            "result_url": format!("/jobs/{}/result", job.job_id),
        })
    );

    let attempt = w.attempt(&job).await;
    assert_eq!(attempt.outcome, DeliveryOutcome::Delivered);
    assert_eq!((attempt.status_code, attempt.error.as_deref()), (Some(204), None));
    assert_eq!(
        (attempt.webhook_id.as_str(), attempt.event.as_str()),
        (id.as_str(), "job.succeeded")
    );
    assert_eq!(attempt.attempt, 1);
    w.nothing_queued();
}

#[tokio::test]
async fn an_attempt_is_recorded_at_the_clocks_time() {
    let w = world();
    let partner = Partner::start(Answer::Status(204)).await;
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    // A time the machine's clock is not at: the handler reads the clock it is given.
    let at: Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(at.as_datetime());
    process(&w.deps, &message(&job, 1)).await.unwrap();
    assert_eq!(w.attempt(&job).await.at, at);
    // A job without its end's time (an old record) is announced at the clock's time.
    let unstamped =
        JobRecord { finished_at: None, ..w.ended(JobStatus::Failed, Some(&partner.url("/hook"))) };
    w.jobs.put_record(unstamped.clone());
    process(&w.deps, &message(&unstamped, 1)).await.unwrap();
    let payload: Value = serde_json::from_slice(&partner.received()[1].body).unwrap();
    assert_eq!(payload["timestamp"], at.to_string());
    assert_eq!(w.attempt(&unstamped).await.at, at);
}

#[tokio::test]
async fn a_compensated_jobs_event_says_how_its_undos_went() {
    use longhaul_domain::compensation::{Compensation, CompensationStatus, Ending, UndoStatus};
    let w = world();
    let partner = Partner::start(Answer::Status(200)).await;
    let mut job = w.ended(JobStatus::Failed, Some(&partner.url("/hook")));
    let ending = Ending { status: JobStatus::Failed, reason: "bad input".into(), error: None };
    let mut compensation = Compensation::begin(ending, Timestamp::now());
    compensation.plan(&["reserve", "charge"], &["reserve".into(), "charge".into()]);
    compensation.stages[0].status = UndoStatus::Failed;
    compensation.stages[0].error = Some("refund refused".into());
    compensation.stages[1].status = UndoStatus::Done;
    compensation.status = CompensationStatus::Failed;
    job.compensation = Some(compensation);
    w.jobs.put_record(job.clone());
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let payload: Value = serde_json::from_slice(&partner.received()[0].body).unwrap();
    assert_eq!(payload["type"], "job.failed");
    assert_eq!(payload["compensation"]["status"], "failed", "{payload}");
    let stages = &payload["compensation"]["stages"];
    assert_eq!(stages[0]["stage"], "charge");
    assert_eq!(
        (&stages[0]["status"], &stages[0]["error"]),
        (&json!("failed"), &json!("refund refused"))
    );
    assert_eq!(stages[1]["status"], "done");
    assert!(stages[1].get("error").is_none(), "{payload}");
}

#[tokio::test]
async fn a_failed_jobs_event_carries_its_error_and_no_result_link() {
    let w = world();
    let partner = Partner::start(Answer::Status(200)).await;
    let job = w.ended(JobStatus::Failed, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let payload: Value = serde_json::from_slice(&partner.received()[0].body).unwrap();
    assert_eq!(payload["type"], "job.failed");
    assert_eq!(payload["error"], json!({"code": "Job.Fatal", "message": "bad input"}));
    assert!(payload.get("result_url").is_none(), "{payload}");
    let attempt = w.attempt(&job).await;
    assert_eq!(
        (attempt.event.as_str(), attempt.outcome),
        ("job.failed", DeliveryOutcome::Delivered)
    );
}

#[tokio::test]
async fn during_a_rotation_the_old_and_the_new_secret_both_sign() {
    let w = world();
    let partner = Partner::start(Answer::Status(200)).await;
    let old = w.jobs.webhook_secrets(&owner(OWNER)).await.unwrap().secrets[0].secret.clone();
    let overlap_until = Timestamp::from(chrono::Utc::now() + chrono::Duration::hours(1));
    w.jobs.rotate_webhook_secret(&owner(OWNER), overlap_until).await.unwrap();
    let new = w.jobs.webhook_secrets(&owner(OWNER)).await.unwrap().secrets[0].secret.clone();
    let job = w.ended(JobStatus::Cancelled, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let request = &partner.received()[0];
    let (id, signature) = (&request.headers["webhook-id"], &request.headers["webhook-signature"]);
    let timestamp: i64 = request.headers["webhook-timestamp"].parse().unwrap();
    assert_eq!(signature.split(' ').count(), 2, "{signature}");
    for secret in [&old, &new] {
        assert!(verify(secret, id, timestamp, &request.body, signature));
    }
    let stranger =
        w.jobs.webhook_secrets(&owner("mallory")).await.unwrap().secrets[0].secret.clone();
    assert!(!verify(&stranger, id, timestamp, &request.body, signature), "another tenant's key");
}

#[tokio::test]
async fn a_5xx_is_retried_after_the_schedules_delay_with_the_same_webhook_id() {
    let w = world();
    let partner = Partner::start(Answer::Status(503)).await;
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let attempt = w.attempt(&job).await;
    assert_eq!((attempt.status_code, attempt.outcome), (Some(503), DeliveryOutcome::Retrying));
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1);
    let (next, delay) = &sent[0];
    assert_eq!((next.attempt, *delay), (2, 5), "attempt 2 after the schedule's first delay");
    assert_eq!(next.not_before, w.now() + 5, "{next:?}");
    assert_eq!((next.job_id.as_str(), next.status), (job.job_id.as_str(), job.status));
    // Attempt 2 fails too: attempt 3 after the second delay, recorded beside the first.
    process(&w.deps, &WebhookMessage { not_before: 0, ..next.clone() }).await.unwrap();
    let (third, delay) = w.queue.sent()[1].clone();
    assert_eq!((third.attempt, delay), (3, 300));
    let recorded = w.deliveries(&job).await;
    assert_eq!(recorded.iter().map(|d| d.attempt).collect::<Vec<_>>(), [1, 2]);
    let received = partner.received();
    assert_eq!(
        received[0].headers["webhook-id"], received[1].headers["webhook-id"],
        "receivers deduplicate by webhook-id"
    );
    assert!(w.dead_letters.sent().is_empty());
}

#[tokio::test]
async fn a_partner_that_never_answers_or_refuses_the_connection_is_a_failed_attempt() {
    let w = world_with(
        Config { timeout: Duration::from_millis(300), ..config() },
        Lookup::Addresses(vec![LOOPBACK]),
    );
    let silent = Partner::start(Answer::Never).await;
    let job = w.ended(JobStatus::Succeeded, Some(&silent.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    assert_eq!(silent.received().len(), 1, "the request was sent");
    let attempt = w.attempt(&job).await;
    assert_eq!((attempt.status_code, attempt.error.as_deref()), (None, Some("timed out")));
    assert_eq!(attempt.outcome, DeliveryOutcome::Retrying);
    assert_eq!(w.queue.sent()[0].0.attempt, 2);

    // Nothing listens on a port freed just now.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let job = w.ended(JobStatus::Succeeded, Some(&format!("http://{HOST}:{closed}/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let attempt = w.attempt(&job).await;
    let error = attempt.error.unwrap();
    assert!(error.starts_with("request failed"), "{error}");
    assert_eq!((attempt.status_code, attempt.outcome), (None, DeliveryOutcome::Retrying));
    assert_eq!(w.queue.sent().len(), 2);
}

#[tokio::test]
async fn a_410_stops_the_deliveries() {
    let w = world();
    let partner = Partner::start(Answer::Status(410)).await;
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let attempt = w.attempt(&job).await;
    assert_eq!((attempt.status_code, attempt.outcome), (Some(410), DeliveryOutcome::Stopped));
    w.nothing_queued();
}

#[tokio::test]
async fn the_last_attempt_of_the_schedule_is_dead_lettered_when_it_fails() {
    let w = world();
    let failing = Partner::start(Answer::Status(500)).await;
    let job = w.ended(JobStatus::Succeeded, Some(&failing.url("/hook")));
    let last = message(&job, 3);
    process(&w.deps, &last).await.unwrap();
    let attempt = w.attempt(&job).await;
    assert_eq!((attempt.attempt, attempt.outcome), (3, DeliveryOutcome::DeadLettered));
    assert_eq!(w.dead_letters.sent(), [(last, 0)], "the message as it came, at once");
    assert!(w.queue.sent().is_empty(), "no further attempt");

    // The last attempt answered: delivered, or stopped; nothing dead-lettered.
    for (code, outcome) in [(202, DeliveryOutcome::Delivered), (410, DeliveryOutcome::Stopped)] {
        let w = world();
        let partner = Partner::start(Answer::Status(code)).await;
        let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
        process(&w.deps, &message(&job, 3)).await.unwrap();
        assert_eq!(w.attempt(&job).await.outcome, outcome);
        w.nothing_queued();
    }
}

#[tokio::test]
async fn a_host_resolving_to_a_non_public_address_gets_no_request() {
    let partner = Partner::start(Answer::Status(204)).await;
    // One private answer among public ones refuses the host.
    let mixed = vec![IpAddr::from([93, 184, 216, 34]), IpAddr::from([10, 0, 0, 7]), LOOPBACK];
    let w = world_with(config(), Lookup::Addresses(mixed));
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let attempt = w.attempt(&job).await;
    assert_eq!(
        (attempt.status_code, attempt.error.as_deref()),
        (None, Some("partner.example.com resolves to a non-public address"))
    );
    assert_eq!(attempt.outcome, DeliveryOutcome::Retrying, "retried: DNS may change back");
    // Outside the local stack, loopback is refused too: the partner listening there sees
    // nothing.
    let strict = Config { allow_insecure: false, ..config() };
    let w = world_with(strict, Lookup::Addresses(vec![LOOPBACK]));
    let job = w.ended(JobStatus::Succeeded, Some(&format!("https://{HOST}:{}/hook", partner.port)));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let attempt = w.attempt(&job).await;
    assert_eq!(
        attempt.error.as_deref(),
        Some("partner.example.com resolves to a non-public address")
    );
    // Address literals are checked without a lookup: private, link-local (the metadata
    // service), or plain http outside the local stack.
    let w = world();
    for url in [
        format!("http://10.1.2.3:{}/hook", partner.port),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        format!("http://[::ffff:192.168.0.1]:{}/", partner.port),
    ] {
        let job = w.ended(JobStatus::Succeeded, Some(&url));
        process(&w.deps, &message(&job, 1)).await.unwrap();
        let error = w.attempt(&job).await.error.unwrap();
        assert!(error.starts_with("callback URL refused"), "{url}: {error}");
    }
    let w = world_with(Config { allow_insecure: false, ..config() }, Lookup::Addresses(vec![]));
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let error = w.attempt(&job).await.error.unwrap();
    assert!(error.contains("scheme `http` is not allowed"), "{error}");
    assert!(w.dns.asked().is_empty(), "literals and refused URLs are not looked up");
    assert_eq!(partner.connections(), 0, "no request reached any address");
}

#[tokio::test]
async fn a_lookup_that_fails_hangs_or_finds_nothing_is_a_failed_attempt() {
    let partner = Partner::start(Answer::Status(204)).await;
    for (lookup, expected) in [
        (Lookup::Fails, "partner.example.com does not resolve: NXDOMAIN"),
        (Lookup::Hangs, "partner.example.com did not resolve within 300 ms"),
        (Lookup::Addresses(vec![]), "partner.example.com has no addresses"),
    ] {
        let w = world_with(config(), lookup.clone());
        let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
        process(&w.deps, &message(&job, 1)).await.unwrap();
        let attempt = w.attempt(&job).await;
        assert_eq!(attempt.error.as_deref(), Some(expected), "{lookup:?}");
        assert_eq!((attempt.status_code, attempt.outcome), (None, DeliveryOutcome::Retrying));
        assert_eq!(w.queue.sent().len(), 1);
    }
    assert_eq!(partner.connections(), 0);
}

#[tokio::test]
async fn a_delay_longer_than_a_hop_is_waited_out_without_reading_the_job() {
    let w = world();
    let job = w.ended(JobStatus::Succeeded, Some("http://partner.example.com/hook"));
    let later = WebhookMessage { not_before: w.now() + 3_600, ..message(&job, 4) };
    // The table is down: a hop does not read it.
    w.jobs.set_unavailable(true);
    process(&w.deps, &later).await.unwrap();
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, later, "the same message, its attempt and due time unchanged");
    // The wait asked for is the rest of the hour; SQS delays at most 15 minutes, so the
    // message comes back then and hops again.
    assert_eq!(sent[0].1, 900, "SQS's longest delay");
    w.jobs.set_unavailable(false);
    assert!(w.deliveries(&job).await.is_empty(), "no attempt was made");
    assert!(w.dns.asked().is_empty());
}

#[tokio::test]
async fn a_delay_within_a_hop_is_waited_out_exactly_then_the_message_is_delivered() {
    let w = world();
    let job = w.ended(JobStatus::Succeeded, Some("http://partner.example.com/hook"));
    // The table is down: a hop does not read it.
    w.jobs.set_unavailable(true);
    // Up to SQS's 15 minutes, a message waits exactly the rest of its delay, in one hop;
    // beyond them, 15 minutes at a time.
    for (ahead, delay) in [(1, 1), (300, 300), (899, 899), (900, 900), (901, 900)] {
        let soon = WebhookMessage { not_before: w.now() + ahead, ..message(&job, 4) };
        process(&w.deps, &soon).await.unwrap();
        assert_eq!(w.queue.sent().last(), Some(&(soon, delay)), "{ahead} s ahead");
    }
    // Come back when due (a second early: one more hop, of that second), it is no longer
    // held: it reads the job (here a table that is down, an error SQS redelivers).
    let soon = WebhookMessage { not_before: w.now() + 300, ..message(&job, 4) };
    w.clock.advance(Duration::from_secs(299));
    process(&w.deps, &soon).await.unwrap();
    assert_eq!(w.queue.sent().last(), Some(&(soon.clone(), 1)));
    w.clock.advance(Duration::from_secs(1));
    let hops = w.queue.sent().len();
    assert!(process(&w.deps, &soon).await.is_err(), "due: the job is read");
    assert_eq!(w.queue.sent().len(), hops, "no hop when due");
    w.jobs.set_unavailable(false);
    assert!(w.deliveries(&job).await.is_empty(), "no attempt while the table was down");
}

#[tokio::test]
async fn a_job_that_is_gone_or_sends_no_webhook_is_dropped() {
    let w = world();
    let partner = Partner::start(Answer::Status(204)).await;
    let gone = pending_job(&owner(OWNER), Timestamp::now());
    let gone = WebhookMessage::callback(gone.job_id.clone(), JobStatus::Succeeded);
    process(&w.deps, &gone).await.unwrap();
    assert!(w.jobs.deliveries(&gone.job_id).await.unwrap().is_empty());
    let no_callback = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &message(&no_callback, 1)).await.unwrap();
    assert!(w.deliveries(&no_callback).await.is_empty());
    // A status with no event (the message cannot have come from the notifier).
    let running = w.ended(JobStatus::Running, Some(&partner.url("/hook")));
    process(&w.deps, &message(&running, 1)).await.unwrap();
    assert!(w.deliveries(&running).await.is_empty());
    w.nothing_queued();
    assert_eq!(partner.connections(), 0);
}

#[tokio::test]
async fn failures_of_the_table_or_the_queues_are_errors_for_sqs_to_redeliver() {
    let partner = Partner::start(Answer::Status(500)).await;
    // The job cannot be read: nothing is sent.
    let w = world();
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    w.jobs.set_unavailable(true);
    assert!(process(&w.deps, &message(&job, 1)).await.is_err());
    assert_eq!(partner.connections(), 0);
    w.jobs.set_unavailable(false);
    // The retry cannot be queued, nor the dead letter kept: the attempt is recorded, and the
    // message comes back.
    w.queue.set_unavailable(true);
    assert!(process(&w.deps, &message(&job, 1)).await.is_err());
    assert_eq!(w.attempt(&job).await.outcome, DeliveryOutcome::Retrying);
    let job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hook")));
    w.dead_letters.set_unavailable(true);
    assert!(process(&w.deps, &message(&job, 3)).await.is_err());
    assert_eq!(w.attempt(&job).await.outcome, DeliveryOutcome::DeadLettered);
    // A hop that cannot be queued.
    let later = WebhookMessage { not_before: w.now() + 3_600, ..message(&job, 2) };
    assert!(process(&w.deps, &later).await.is_err());
}

#[tokio::test]
async fn a_batch_reports_only_the_records_sqs_must_redeliver() {
    let w = world();
    let ok = Partner::start(Answer::Status(204)).await;
    let failing = Partner::start(Answer::Status(500)).await;
    let delivered = w.ended(JobStatus::Succeeded, Some(&ok.url("/hook")));
    let retried = w.ended(JobStatus::Failed, Some(&failing.url("/hook")));
    let records = json!({"Records": [
        {"messageId": "m-delivered", "body": serde_json::to_string(&message(&delivered, 1)).unwrap()},
        {"messageId": "m-garbage", "body": "{\"job_id\": 7}"},
        {"messageId": "m-retried", "body": serde_json::to_string(&message(&retried, 1)).unwrap()},
    ]});
    let event: SqsEvent = serde_json::from_value(records).unwrap();
    let response = handle(&w.deps, event).await;
    let failed: Vec<&str> =
        response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
    assert_eq!(failed, ["m-garbage"], "a receiver's failure is retried on the schedule instead");
    assert_eq!(w.attempt(&delivered).await.outcome, DeliveryOutcome::Delivered);
    assert_eq!(w.attempt(&retried).await.outcome, DeliveryOutcome::Retrying);
    assert_eq!(w.queue.sent().len(), 1);
}

#[tokio::test]
async fn a_succeeded_jobs_summary_travels_in_its_event() {
    let w = world();
    let partner = Partner::start(Answer::Status(204)).await;
    let mut job = w.ended(JobStatus::Succeeded, Some(&partner.url("/hooks")));
    job.summary = Some(json!({"rows_scanned": 5000}));
    w.jobs.put_record(job.clone());
    process(&w.deps, &message(&job, 1)).await.unwrap();
    let received = partner.received();
    let payload: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(payload["summary"], json!({"rows_scanned": 5000}), "{payload}");
    assert_eq!(payload["result_url"], format!("/jobs/{}/result", job.job_id));
}

// Webhook endpoints.

use EndpointEvent::{JobFailed, JobProgress, JobResultExpiring, JobSucceeded};

/// Every metric line this test binary printed (the process-wide sink, set once).
fn metric_lines() -> &'static Mutex<Vec<String>> {
    static LINES: std::sync::OnceLock<Mutex<Vec<String>>> = std::sync::OnceLock::new();
    LINES.get_or_init(|| {
        longhaul_aws::metrics::set_sink(Box::new(|line| {
            metric_lines().lock().unwrap().push(line.to_owned())
        }));
        Mutex::new(Vec::new())
    })
}

/// How many times `metric` was counted about `job` in this test binary.
fn counted(metric: &str, job: &JobRecord) -> usize {
    metric_lines()
        .lock()
        .unwrap()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line.get(metric).is_some() && line["job_id"] == job.job_id.as_str())
        .count()
}

/// A world whose tenants may make `per_minute` endpoint attempts a minute.
fn world_rated(per_minute: u32) -> World {
    let mut w = world();
    w.rate = Arc::new(MemoryRateLimits::on_clock(per_minute, w.clock.clone()));
    w.deps.rate = w.rate.clone();
    w
}

impl World {
    /// The deliverer's time.
    fn at(&self) -> Timestamp {
        self.clock.now().into()
    }

    /// An endpoint of `owner_name` at `url` receiving `events`.
    async fn endpoint_of(
        &self,
        owner_name: &str,
        url: &str,
        events: &[EndpointEvent],
    ) -> EndpointRecord {
        self.endpoints.subscribe(&owner(owner_name), url, events, false)
    }

    /// An endpoint of [`OWNER`] at `url` receiving `events`.
    async fn endpoint(&self, url: &str, events: &[EndpointEvent]) -> EndpointRecord {
        self.endpoint_of(OWNER, url, events).await
    }

    /// `endpoint` as it is stored now.
    async fn stored(&self, endpoint: &EndpointRecord) -> EndpointRecord {
        self.endpoints.endpoint(&endpoint.owner, &endpoint.endpoint_id).await.unwrap().unwrap()
    }

    /// The delivery record of `event` of `job` to `endpoint`.
    async fn delivery(
        &self,
        endpoint: &EndpointRecord,
        job: &JobRecord,
        event: EndpointEvent,
    ) -> EndpointDelivery {
        self.endpoints
            .endpoint_delivery(&endpoint.endpoint_id, &job.job_id, event)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no record of {event} of {} to the endpoint", job.job_id))
    }

    /// A running job of [`OWNER`] whose progress record is `progress`.
    fn running(&self, progress: ProgressRecord) -> JobRecord {
        let mut job = pending_job(&owner(OWNER), Timestamp::now());
        job.status = JobStatus::Running;
        job.attempt = 1;
        self.jobs.put_record(job.clone());
        self.jobs.put_progress(&job.job_id, progress);
        job
    }

    /// Starts `endpoint` failing at `since`.
    async fn failing_since(&self, endpoint: &EndpointRecord, since: Timestamp) {
        let (owner, id) = (&endpoint.owner, &endpoint.endpoint_id);
        self.endpoints.mark_failing(owner, id, since).await.unwrap();
    }
}

/// A world, a partner answering `code`, and an endpoint of [`OWNER`] at the partner's `/hook`
/// receiving `events`.
async fn endpoint_world(code: u16, events: &[EndpointEvent]) -> (World, Partner, EndpointRecord) {
    let w = world();
    let partner = Partner::start(Answer::Status(code)).await;
    let endpoint = w.endpoint(&partner.url("/hook"), events).await;
    (w, partner, endpoint)
}

impl World {
    /// Nothing reached `partner`, nothing was recorded of any endpoint, nothing was queued.
    fn nothing_happened(&self, partner: &Partner) {
        assert_eq!(partner.connections(), 0);
        assert!(
            self.endpoints.all_deliveries().is_empty(),
            "{:?}",
            self.endpoints.all_deliveries()
        );
        self.nothing_queued();
    }
}

/// The first attempt of `event` of `job` (in its status) to `endpoint`, due at once.
fn to_endpoint(job: &JobRecord, endpoint: &EndpointRecord, event: EndpointEvent) -> WebhookMessage {
    let id = endpoint.endpoint_id.clone();
    WebhookMessage::to_endpoint(job.job_id.clone(), job.status, id, event, 0).of(&job.owner)
}

/// `at`, `seconds` later.
fn plus(at: Timestamp, seconds: i64) -> Timestamp {
    Timestamp::from(at.as_datetime() + chrono::Duration::seconds(seconds))
}

/// A progress record of a running job: 42.5 %, 17 of 40 items of stage 1 of 3, sequence 7.
fn scanning() -> ProgressRecord {
    ProgressRecord {
        pct: 42.5,
        stage: "scan".into(),
        stage_index: 1,
        stages_total: 3,
        items_done: 17,
        items_total: Some(40),
        eta_seconds: Some(12),
        seq: 7,
        ..ProgressRecord::default()
    }
}

#[tokio::test]
async fn an_endpoint_event_is_delivered_signed_under_the_endpoints_webhook_id_and_recorded() {
    let w = world();
    let partner = Partner::start(Answer::Status(204)).await;
    let endpoint = w.endpoint(&partner.url("/partner/events?k=1"), &[JobSucceeded]).await;
    let job = w.ended(JobStatus::Succeeded, None);
    // Through the queue's JSON, as SQS hands it over.
    let message = to_endpoint(&job, &endpoint, JobSucceeded);
    let body = serde_json::to_string(&message).unwrap();
    let event: SqsEvent =
        serde_json::from_value(json!({"Records": [{"messageId": "m-1", "body": body}]})).unwrap();
    assert!(handle(&w.deps, event).await.batch_item_failures.is_empty());

    let received = partner.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/partner/events?k=1"));
    assert_eq!(w.dns.asked(), [(HOST.to_owned(), partner.port)], "resolved once, checked");
    let id = &request.headers["webhook-id"];
    assert_eq!(id, &endpoint_message_id(&endpoint.endpoint_id, &job.job_id, JobSucceeded, None));
    let timestamp: i64 = request.headers["webhook-timestamp"].parse().unwrap();
    assert_eq!(timestamp, w.now());
    let signature = &request.headers["webhook-signature"];
    let secret = w.jobs.webhook_secrets(&owner(OWNER)).await.unwrap().secrets[0].secret.clone();
    assert!(verify(&secret, id, timestamp, &request.body, signature));
    let stranger =
        w.jobs.webhook_secrets(&owner("mallory")).await.unwrap().secrets[0].secret.clone();
    assert!(!verify(&stranger, id, timestamp, &request.body, signature));
    let payload: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        payload,
        json!({
            "type": "job.succeeded",
            "job_id": job.job_id,
            "status": "succeeded",
            "timestamp": job.finished_at,
            "result_url": format!("/jobs/{}/result", job.job_id),
        })
    );

    let recorded = w.delivery(&endpoint, &job, JobSucceeded).await;
    assert_eq!(
        recorded,
        EndpointDelivery {
            webhook_id: id.clone(),
            endpoint_id: endpoint.endpoint_id.clone(),
            job_id: job.job_id.clone(),
            event: JobSucceeded,
            status: DeliveryStatus::Delivered,
            attempts: 1,
            created_at: w.at(),
            last_attempt_at: Some(w.at()),
            status_code: Some(204),
            latency_ms: recorded.latency_ms,
            error: None,
            progress_seq: None,
            result_expires_at: None,
        }
    );
    assert!(recorded.latency_ms.is_some());
    assert_eq!(w.endpoints.all_deliveries().len(), 1);
    assert!(w.deliveries(&job).await.is_empty(), "no callback delivery of a job without one");
    w.nothing_queued();
    let stored = w.stored(&endpoint).await;
    assert_eq!((stored.status, stored.failing_since), (EndpointStatus::Enabled, None));
}

#[tokio::test]
async fn an_endpoint_hears_a_jobs_end_in_the_shape_its_callback_does() {
    for status in [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled] {
        let event = EndpointEvent::of_terminal(status).unwrap();
        let (w, partner, endpoint) = endpoint_world(200, &[event]).await;
        let mut job = w.ended(status, Some(&partner.url("/callback")));
        if status == JobStatus::Succeeded {
            job.summary = Some(json!({"rows": 3}));
            w.jobs.put_record(job.clone());
        }
        process(&w.deps, &message(&job, 1)).await.unwrap();
        process(&w.deps, &to_endpoint(&job, &endpoint, event)).await.unwrap();
        let received = partner.received();
        let bodies: Vec<Value> =
            received.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
        assert_eq!(bodies.len(), 2, "{status}");
        assert_eq!(bodies[0], bodies[1], "{status}");
        assert_eq!(bodies[1]["type"], event.as_str());
        assert_eq!(received[1].path, "/hook");
        assert_ne!(received[0].headers["webhook-id"], received[1].headers["webhook-id"]);
        assert_eq!(w.delivery(&endpoint, &job, event).await.status, DeliveryStatus::Delivered);
    }
}

#[tokio::test]
async fn a_progress_event_carries_the_jobs_progress_as_it_is_when_sent() {
    let (w, partner, endpoint) = endpoint_world(200, &[JobProgress]).await;
    let job = w.running(scanning());
    // Queued due at its window's end: held until then, unread and unsent.
    let due =
        WebhookMessage { not_before: w.now() + 5, ..to_endpoint(&job, &endpoint, JobProgress) };
    process(&w.deps, &due).await.unwrap();
    assert_eq!(w.queue.sent(), [(due.clone(), 5)]);
    assert_eq!(partner.connections(), 0);
    // Meanwhile the job got on: the event carries where it is now (latest wins).
    let later =
        ProgressRecord { pct: 60.0, items_done: 24, eta_seconds: Some(8), seq: 9, ..scanning() };
    w.jobs.put_progress(&job.job_id, later);
    w.clock.advance(Duration::from_secs(5));
    process(&w.deps, &due).await.unwrap();
    let received = partner.received();
    assert_eq!(received.len(), 1);
    let mut payload: Value = serde_json::from_slice(&received[0].body).unwrap();
    let progress = payload.as_object_mut().unwrap().remove("progress").unwrap();
    assert_eq!(
        payload,
        json!({
            "type": "job.progress",
            "job_id": job.job_id,
            "status": "running",
            "timestamp": w.at(),
        })
    );
    // The members docs/api.md names (the ETA's name: see the ignored test below).
    for (member, value) in [
        ("pct", json!(60.0)),
        ("stage", json!("scan")),
        ("items_done", json!(24)),
        ("items_total", json!(40)),
    ] {
        assert_eq!(progress[member], value, "{member}: {progress}");
    }
    let id = endpoint_message_id(&endpoint.endpoint_id, &job.job_id, JobProgress, Some(9));
    assert_eq!(received[0].headers["webhook-id"], id, "each progress is its own event");
    let secret = w.jobs.webhook_secrets(&owner(OWNER)).await.unwrap().secrets[0].secret.clone();
    let timestamp: i64 = received[0].headers["webhook-timestamp"].parse().unwrap();
    let signature = &received[0].headers["webhook-signature"];
    assert!(verify(&secret, &id, timestamp, &received[0].body, signature));
    let recorded = w.delivery(&endpoint, &job, JobProgress).await;
    assert_eq!((recorded.status, recorded.progress_seq), (DeliveryStatus::Delivered, Some(9)));
    assert_eq!((recorded.webhook_id, recorded.attempts), (id, 1));
    assert_eq!(w.queue.sent().len(), 1, "only the hop");
}

/// docs/api.md: `progress` as `GET /jobs/{id}` shows it (its ETA is `eta`).
#[tokio::test]
async fn a_progress_events_eta_is_named_as_documented() {
    let (w, partner, endpoint) = endpoint_world(200, &[JobProgress]).await;
    let job = w.running(scanning());
    process(&w.deps, &to_endpoint(&job, &endpoint, JobProgress)).await.unwrap();
    let payload: Value = serde_json::from_slice(&partner.received()[0].body).unwrap();
    assert_eq!(payload["progress"]["eta"], 12, "{payload}");
}

#[tokio::test]
async fn a_progress_event_of_a_job_no_longer_running_is_dropped_unsent() {
    let (w, partner, endpoint) = endpoint_world(200, &[JobProgress]).await;
    for status in [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Queued] {
        let job = JobRecord { status, ..w.running(scanning()) };
        w.jobs.put_record(job.clone());
        let message = WebhookMessage {
            status: JobStatus::Running,
            ..to_endpoint(&job, &endpoint, JobProgress)
        };
        process(&w.deps, &message).await.unwrap();
    }
    w.nothing_happened(&partner);
}

#[tokio::test]
async fn a_progress_event_that_fails_is_not_retried_but_counts_against_the_endpoint() {
    let (w, partner, endpoint) = endpoint_world(500, &[JobProgress]).await;
    let job = w.running(scanning());
    process(&w.deps, &to_endpoint(&job, &endpoint, JobProgress)).await.unwrap();
    assert_eq!(partner.received().len(), 1);
    let recorded = w.delivery(&endpoint, &job, JobProgress).await;
    assert_eq!(
        (recorded.status, recorded.attempts, recorded.status_code),
        (DeliveryStatus::Failed, 1, Some(500))
    );
    w.nothing_queued();
    assert_eq!(w.stored(&endpoint).await.failing_since, Some(w.at()));
}

#[tokio::test]
async fn a_reminder_carries_when_the_result_expires_and_only_while_it_is_there() {
    let (w, partner, endpoint) = endpoint_world(200, &[JobResultExpiring]).await;
    let job = w.ended(JobStatus::Succeeded, None);
    let expires = plus(w.at(), 20 * 3600);
    let reminder = WebhookMessage {
        result_expires_at: Some(expires),
        ..to_endpoint(&job, &endpoint, JobResultExpiring)
    };
    process(&w.deps, &reminder).await.unwrap();
    let received = partner.received();
    assert_eq!(received.len(), 1);
    let payload: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(
        payload,
        json!({
            "type": "job.result_expiring",
            "job_id": job.job_id,
            "status": "succeeded",
            "result_url": format!("/jobs/{}/result", job.job_id),
            "expires_at": expires,
            "timestamp": w.at(),
        })
    );
    let id = endpoint_message_id(&endpoint.endpoint_id, &job.job_id, JobResultExpiring, None);
    assert_eq!(received[0].headers["webhook-id"], id);
    let recorded = w.delivery(&endpoint, &job, JobResultExpiring).await;
    assert_eq!(recorded.status, DeliveryStatus::Delivered);
    assert_eq!(recorded.result_expires_at, Some(expires), "what a resend puts back");

    // A result that is no longer there (expired early, or a stray message): not sent, and
    // recorded failed with the reason.
    let expired = w.ended(JobStatus::Expired, None);
    let stale = WebhookMessage {
        result_expires_at: Some(expires),
        ..to_endpoint(&expired, &endpoint, JobResultExpiring)
    };
    process(&w.deps, &stale).await.unwrap();
    assert_eq!(partner.received().len(), 1);
    let unsent = w.delivery(&endpoint, &expired, JobResultExpiring).await;
    assert_eq!(unsent.status, DeliveryStatus::Failed);
    assert!(unsent.error.as_deref().is_some_and(|e| e.contains("no longer there")), "{unsent:?}");
    w.nothing_queued();
}

#[tokio::test]
async fn a_failed_attempt_is_pending_retried_on_the_schedule_and_starts_the_endpoint_failing() {
    let (w, partner, endpoint) = endpoint_world(500, &[JobFailed]).await;
    let job = w.ended(JobStatus::Failed, None);
    let first = to_endpoint(&job, &endpoint, JobFailed);
    let started = w.at();
    process(&w.deps, &first).await.unwrap();
    let recorded = w.delivery(&endpoint, &job, JobFailed).await;
    assert_eq!(
        (recorded.status, recorded.attempts, recorded.status_code),
        (DeliveryStatus::Pending, 1, Some(500))
    );
    let second = WebhookMessage { attempt: 2, not_before: w.now() + 5, ..first.clone() };
    assert_eq!(w.queue.sent(), [(second.clone(), 5)], "the same event, the next attempt");
    assert_eq!(w.stored(&endpoint).await.failing_since, Some(started), "its first failure");

    w.clock.advance(Duration::from_secs(5));
    process(&w.deps, &second).await.unwrap();
    let third = WebhookMessage { attempt: 3, not_before: w.now() + 300, ..first.clone() };
    assert_eq!(w.queue.sent()[1..], [(third.clone(), 300)]);
    let recorded = w.delivery(&endpoint, &job, JobFailed).await;
    assert_eq!((recorded.status, recorded.attempts), (DeliveryStatus::Pending, 2));
    assert_eq!(recorded.created_at, started, "one record of the delivery, first made then");
    assert_eq!(w.stored(&endpoint).await.failing_since, Some(started), "still the first");

    // The schedule's last attempt fails: failed for good (`recover` can queue it again).
    w.clock.advance(Duration::from_secs(300));
    process(&w.deps, &third).await.unwrap();
    let recorded = w.delivery(&endpoint, &job, JobFailed).await;
    assert_eq!((recorded.status, recorded.attempts), (DeliveryStatus::Failed, 3));
    assert_eq!(recorded.last_attempt_at, Some(w.at()));
    assert_eq!(w.queue.sent().len(), 2, "no further attempt");
    let ids: Vec<String> =
        partner.received().iter().map(|r| r.headers["webhook-id"].clone()).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| *id == recorded.webhook_id), "{ids:?}");
    assert_eq!(w.stored(&endpoint).await.status, EndpointStatus::Enabled, "within disable_after");
}

#[tokio::test]
async fn an_event_the_endpoint_no_longer_subscribes_to_is_recorded_not_sent() {
    // Queued (or retrying) while the endpoint received job.failed; its events have been
    // changed since to job.succeeded alone.
    let (w, partner, endpoint) = endpoint_world(204, &[JobSucceeded]).await;
    let job = w.ended(JobStatus::Failed, None);
    let mut retry = to_endpoint(&job, &endpoint, JobFailed);
    retry.attempt = 3;
    process(&w.deps, &retry).await.unwrap();
    assert_eq!(partner.connections(), 0, "not sent");
    w.nothing_queued();
    let recorded = w.delivery(&endpoint, &job, JobFailed).await;
    assert_eq!(
        (recorded.status, recorded.attempts, recorded.error.as_deref()),
        (DeliveryStatus::Failed, 2, Some(UNSUBSCRIBED_ERROR))
    );
    // What it does subscribe to is sent.
    let other = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&other, &endpoint, JobSucceeded)).await.unwrap();
    assert_eq!(partner.connections(), 1);
    assert_eq!(w.delivery(&endpoint, &other, JobSucceeded).await.status, DeliveryStatus::Delivered);
}

#[tokio::test]
async fn a_410_disables_the_endpoint_at_once_and_counts_it() {
    metric_lines(); // Installs the sink before anything is counted.
    let (w, partner, endpoint) = endpoint_world(410, &[JobSucceeded]).await;
    let job = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&job, &endpoint, JobSucceeded)).await.unwrap();
    let recorded = w.delivery(&endpoint, &job, JobSucceeded).await;
    assert_eq!(
        (recorded.status, recorded.attempts, recorded.status_code),
        (DeliveryStatus::Failed, 1, Some(410))
    );
    w.nothing_queued();
    let stored = w.stored(&endpoint).await;
    assert_eq!(stored.status, EndpointStatus::Disabled);
    assert_eq!(
        (stored.disabled_reason, stored.disabled_at),
        (Some(DisabledReason::Gone), Some(w.at()))
    );
    assert_eq!(counted("WebhookEndpointDisabled", &job), 1);

    // The next event to it is not attempted: recorded failed, for `recover` after `enable`.
    let next = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&next, &endpoint, JobSucceeded)).await.unwrap();
    assert_eq!(partner.connections(), 1);
    let skipped = w.delivery(&endpoint, &next, JobSucceeded).await;
    assert_eq!(
        (skipped.status, skipped.attempts, skipped.error.as_deref()),
        (DeliveryStatus::Failed, 0, Some(DISABLED_ERROR))
    );
    assert_eq!((skipped.status_code, skipped.last_attempt_at), (None, None));
    w.nothing_queued();
    assert_eq!(counted("WebhookEndpointDisabled", &next), 0, "disabled once");
}

#[tokio::test]
async fn an_endpoint_failing_for_disable_after_is_disabled_and_one_failing_less_is_not() {
    metric_lines(); // Installs the sink before anything is counted.
    let (w, partner, long) = endpoint_world(503, &[JobSucceeded]).await;
    let recent = w.endpoint(&partner.url("/recent"), &[JobSucceeded]).await;
    // The config's disable_after is an hour.
    w.failing_since(&long, plus(w.at(), -3_600)).await;
    w.failing_since(&recent, plus(w.at(), -3_599)).await;
    let job = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&job, &long, JobSucceeded)).await.unwrap();
    process(&w.deps, &to_endpoint(&job, &recent, JobSucceeded)).await.unwrap();
    assert_eq!(partner.received().len(), 2);
    let long = w.stored(&long).await;
    assert_eq!(long.status, EndpointStatus::Disabled);
    assert_eq!(
        (long.disabled_reason, long.disabled_at),
        (Some(DisabledReason::Failing), Some(w.at()))
    );
    let recent = w.stored(&recent).await;
    assert_eq!(recent.status, EndpointStatus::Enabled);
    assert_eq!(recent.failing_since, Some(plus(w.at(), -3_599)), "the run it is in");
    assert_eq!(counted("WebhookEndpointDisabled", &job), 1);
}

/// The design: "retry on the schedule unless progress (one attempt) or disabled"; the issue:
/// "nothing is queued for it while disabled".
#[tokio::test]
async fn the_attempt_that_disables_a_failing_endpoint_queues_no_retry() {
    let (w, partner, endpoint) = endpoint_world(503, &[JobSucceeded]).await;
    w.failing_since(&endpoint, plus(w.at(), -3_600)).await;
    let job = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&job, &endpoint, JobSucceeded)).await.unwrap();
    assert_eq!(w.stored(&endpoint).await.status, EndpointStatus::Disabled);
    assert_eq!(partner.received().len(), 1);
    w.nothing_queued();
    let recorded = w.delivery(&endpoint, &job, JobSucceeded).await;
    assert_eq!(recorded.status, DeliveryStatus::Failed, "recoverable after `enable`");
}

#[tokio::test]
async fn a_success_ends_the_endpoints_run_of_failures() {
    let (w, partner, endpoint) = endpoint_world(202, &[JobSucceeded]).await;
    w.failing_since(&endpoint, plus(w.at(), -600)).await;
    let job = w.ended(JobStatus::Succeeded, None);
    process(&w.deps, &to_endpoint(&job, &endpoint, JobSucceeded)).await.unwrap();
    let stored = w.stored(&endpoint).await;
    assert_eq!((stored.status, stored.failing_since), (EndpointStatus::Enabled, None));
    assert_eq!(w.delivery(&endpoint, &job, JobSucceeded).await.status, DeliveryStatus::Delivered);
    assert_eq!(partner.received().len(), 1);
}

#[tokio::test]
async fn a_disabled_endpoint_is_not_attempted_its_event_recorded_failed() {
    let (w, partner, endpoint) = endpoint_world(200, &[JobSucceeded, JobProgress]).await;
    let (owner, id) = (&endpoint.owner, &endpoint.endpoint_id);
    let disabled_at = plus(w.at(), -60);
    assert!(
        w.endpoints
            .disable_endpoint(owner, id, DisabledReason::Failing, None, disabled_at)
            .await
            .unwrap()
    );
    let job = w.ended(JobStatus::Succeeded, None);
    // A retry that was queued before it was disabled: the attempts made so far.
    let retry = WebhookMessage { attempt: 3, ..to_endpoint(&job, &endpoint, JobSucceeded) };
    process(&w.deps, &retry).await.unwrap();
    let skipped = w.delivery(&endpoint, &job, JobSucceeded).await;
    assert_eq!(
        skipped,
        EndpointDelivery {
            webhook_id: endpoint_message_id(id, &job.job_id, JobSucceeded, None),
            endpoint_id: id.clone(),
            job_id: job.job_id.clone(),
            event: JobSucceeded,
            status: DeliveryStatus::Failed,
            attempts: 2,
            created_at: w.at(),
            last_attempt_at: None,
            status_code: None,
            latency_ms: None,
            error: Some(DISABLED_ERROR.to_owned()),
            progress_seq: None,
            result_expires_at: None,
        }
    );
    // Progress to it: not attempted, and not recorded (a later event supersedes it).
    let running = w.running(scanning());
    process(&w.deps, &to_endpoint(&running, &endpoint, JobProgress)).await.unwrap();
    assert_eq!(w.endpoints.all_deliveries().len(), 1);
    assert_eq!(partner.connections(), 0);
    assert!(w.dns.asked().is_empty());
    w.nothing_queued();
    let stored = w.stored(&endpoint).await;
    assert_eq!(stored.disabled_at, Some(disabled_at), "left as it was");
}

#[tokio::test]
async fn an_event_to_an_endpoint_that_is_gone_or_not_the_owners_is_dropped_and_one_of_a_gone_job_recorded_failed()
 {
    let (w, partner, deleted) = endpoint_world(200, &[JobSucceeded]).await;
    assert!(w.endpoints.delete_endpoint(&deleted.owner, &deleted.endpoint_id).await.unwrap());
    let bobs = w.endpoint_of("bob", &partner.url("/bob"), &[JobSucceeded]).await;
    let job = w.ended(JobStatus::Succeeded, None);
    for endpoint in [&deleted, &bobs] {
        process(&w.deps, &to_endpoint(&job, endpoint, JobSucceeded)).await.unwrap();
    }
    // And a job that is gone.
    let gone = pending_job(&owner(OWNER), Timestamp::now());
    let endpoint = w.endpoint(&partner.url("/live"), &[JobSucceeded]).await;
    let message = WebhookMessage {
        status: JobStatus::Succeeded,
        ..to_endpoint(&gone, &endpoint, JobSucceeded)
    };
    process(&w.deps, &message).await.unwrap();
    // Nothing sent or queued; the gone job's event is recorded failed with the reason (a
    // resend that moved it to `pending` must not leave it there).
    assert_eq!(partner.connections(), 0);
    w.nothing_queued();
    let recorded = w.endpoints.all_deliveries();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(
        (recorded[0].job_id.clone(), recorded[0].status, recorded[0].error.as_deref()),
        (gone.job_id.clone(), DeliveryStatus::Failed, Some("the job no longer exists"))
    );
}

#[tokio::test]
async fn over_its_tenants_rate_a_delivery_waits_for_the_next_minute_without_an_attempt() {
    // The in-memory rate counts in the deliverer's minutes (its clock stands still).
    let w = world_rated(1);
    let partner = Partner::start(Answer::Status(200)).await;
    let endpoint = w.endpoint(&partner.url("/alice"), &[JobSucceeded]).await;
    let bobs = w.endpoint_of("bob", &partner.url("/bob"), &[JobSucceeded]).await;
    let (first, second) =
        (w.ended(JobStatus::Succeeded, None), w.ended(JobStatus::Succeeded, None));
    let mut bob_job = pending_job(&owner("bob"), Timestamp::now());
    bob_job.status = JobStatus::Succeeded;
    w.jobs.put_record(bob_job.clone());
    process(&w.deps, &to_endpoint(&first, &endpoint, JobSucceeded)).await.unwrap();
    let held = WebhookMessage { attempt: 2, ..to_endpoint(&second, &endpoint, JobSucceeded) };
    process(&w.deps, &held).await.unwrap();
    process(&w.deps, &to_endpoint(&bob_job, &bobs, JobSucceeded)).await.unwrap();
    let paths: Vec<String> = partner.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/alice", "/bob"], "another tenant's delivery is not held up");
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (later, wait) = sent[0].clone();
    // Until the next minute, then spread over up to 9 more seconds by the clock's millis.
    let spread = u64::from(w.clock.now().timestamp_subsec_millis() % 10);
    assert!((1..=60).contains(&(wait - spread)), "until the next minute: {wait} - {spread}");
    assert_eq!(later, WebhookMessage { not_before: w.now() + wait as i64, ..held });
    assert_eq!(later.attempt, 2, "no attempt used");
    assert!(
        w.endpoints
            .endpoint_delivery(&endpoint.endpoint_id, &second.job_id, JobSucceeded)
            .await
            .unwrap()
            .is_none(),
        "nothing recorded of the delivery that waits"
    );
    assert_eq!(w.endpoints.all_deliveries().len(), 2);

    // The charge comes before any read: a delivery over the rate waits even for a job
    // that is gone (it would have been settled, had the job been read first).
    let mut gone = pending_job(&owner("alice"), Timestamp::now());
    gone.status = JobStatus::Succeeded;
    process(&w.deps, &to_endpoint(&gone, &endpoint, JobSucceeded)).await.unwrap();
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 2, "the gone job's delivery waits too: {sent:?}");
    assert_eq!(sent[1].0.job_id, gone.job_id);
    assert_eq!(w.endpoints.all_deliveries().len(), 2, "and nothing was read or recorded");
}
