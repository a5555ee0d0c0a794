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
use longhaul_aws::jobs::{DeliveryRecord, JobRecord, RecordRetention};
use longhaul_domain::webhooks::verify;
use longhaul_domain::{JobError, JobStatus, Timestamp};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{ManualClock, MemoryJobStore, MemoryWebhookQueue, owner};
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
    }
}

struct World {
    jobs: Arc<MemoryJobStore>,
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
    let deps = Deps {
        jobs: jobs.clone(),
        queue: queue.clone(),
        dead_letters: dead_letters.clone(),
        config,
        resolver: dns.clone(),
        clock: clock.clone(),
        tls: Arc::new(tls_config().unwrap()),
    };
    World { jobs, queue, dead_letters, dns, clock, deps }
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
