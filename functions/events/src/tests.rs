//! `Last-Event-ID`'s parsing, and the handler over in-memory adapters: a stream's events from
//! its first progress to the job's end, resumes, keepalives and the time limit, every refusal
//! (tokens before any read, jobs that are gone or someone else's, full caps) and failure, and
//! the slot a stream gives back however it ends.
//!
//! The stream is driven by reading its frames: each poll of the body is one step of the
//! stream, so a test changes the job between reads and waits for the frame that follows.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use http_body_util::BodyExt;
use longhaul_aws::AwsError;
use longhaul_aws::jobs::JobRecord;
use longhaul_aws::ports::Warm;
use longhaul_domain::{JobError, Owner, Timestamp};
use longhaul_memory::api::ApiRequest;
use longhaul_memory::contract::pending_job;
use longhaul_memory::{ManualClock, MemoryJobStore, MemorySigningKey, MemoryStreamSlots, owner};
use secrecy::SecretString;
use serde_json::Value;

use super::*;
use longhaul_aws::jobs::ProgressRecord;

fn parsed(value: &[u8]) -> Result<u64, StatusCode> {
    let mut headers = HeaderMap::new();
    headers.insert("last-event-id", HeaderValue::from_bytes(value).unwrap());
    last_event_id(&headers).map_err(|p| p.status)
}

#[test]
fn last_event_id_accepts_event_ids_and_treats_blank_as_absent() {
    assert_eq!(last_event_id(&HeaderMap::new()), Ok(0));
    assert_eq!(parsed(b""), Ok(0));
    assert_eq!(parsed(b"   "), Ok(0));
    assert_eq!(parsed(b"0"), Ok(0));
    assert_eq!(parsed(b" 42 "), Ok(42));
    assert_eq!(parsed(b"007"), Ok(7));
    assert_eq!(parsed(b"18446744073709551614"), Ok(u64::MAX - 1));
}

#[test]
fn last_event_id_refuses_anything_else_with_400() {
    let huge = "9".repeat(10_000);
    for value in [
        "-1",
        "+1",
        "1.5",
        "1e3",
        "0x10",
        "abc",
        "5 5",
        "5,6",
        "\u{663}",
        "١٢٣",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        huge.as_str(),
    ] {
        assert_eq!(parsed(value.as_bytes()), Err(StatusCode::BAD_REQUEST), "{value:?}");
    }
    assert_eq!(parsed(b"\xff\xfe"), Err(StatusCode::BAD_REQUEST), "not text");
}

// The handler.

const KEY: &str = "stream-token-key";
const ALICE: &str = "alice";

/// The job table as the function reads it, counting every read; `gone` makes every job read
/// as absent (its record deleted, as the table's TTL does to an expired job).
#[derive(Debug, Default)]
struct Table {
    store: MemoryJobStore,
    reads: AtomicUsize,
    gone: AtomicBool,
}

impl Table {
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Warm for Table {}

#[async_trait]
impl JobReads for Table {
    async fn job(
        &self,
        job_id: &JobId,
    ) -> Result<Option<JobRecord>, longhaul_aws::jobs::StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let job = self.store.job(job_id).await?;
        Ok(job.filter(|_| !self.gone.load(Ordering::SeqCst)))
    }

    async fn view(
        &self,
        job_id: &JobId,
    ) -> Result<Option<JobView>, longhaul_aws::jobs::StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let view = self.store.view(job_id).await?;
        Ok(view.filter(|_| !self.gone.load(Ordering::SeqCst)))
    }
}

/// A key that cannot be read (Secrets Manager down, or the role lost its grant).
#[derive(Debug)]
struct NoKey;

#[async_trait]
impl Warm for NoKey {}

#[async_trait]
impl SigningKey for NoKey {
    async fn get(&self) -> Result<&SecretString, AwsError> {
        Err(AwsError {
            context: "read secret arn:aws:secretsmanager:us-east-1:123456789012:secret:key".into(),
            detail: "AccessDeniedException".into(),
            refusal: None,
        })
    }
}

/// Polls every 5 ms; no keepalive or time limit unless a test sets one; caps 2, 3 and 5.
fn config() -> Config {
    Config {
        table: "jobs".into(),
        token_secret_arn: "arn:aws:secretsmanager:us-east-1:123456789012:secret:key".into(),
        poll: Duration::from_millis(5),
        keepalive: Duration::from_secs(3_600),
        max_duration: Duration::from_secs(3_600),
        max_streams_per_job: 2,
        max_streams_per_tenant: 3,
        max_streams: 5,
    }
}

struct World {
    table: Arc<Table>,
    slots: Arc<MemoryStreamSlots>,
    /// The handler's clock.
    clock: Arc<ManualClock>,
    deps: Arc<Deps>,
}

/// A world whose clock moves on a millisecond at each reading, as time passes while a stream
/// polls (a keepalive or time limit of a few milliseconds comes after a few polls).
fn world_with(config: Config) -> World {
    world_on(config, ManualClock::new().stepping(Duration::from_millis(1)))
}

fn world_on(config: Config, clock: ManualClock) -> World {
    let clock = Arc::new(clock);
    let table = Arc::new(Table::default());
    let slots = Arc::new(MemoryStreamSlots::new(
        config.max_streams_per_job,
        config.max_streams_per_tenant,
        config.max_streams,
    ));
    let deps = Arc::new(Deps {
        jobs: table.clone(),
        slots: slots.clone(),
        token_key: Arc::new(MemorySigningKey::new(KEY)),
        clock: clock.clone(),
        config,
    });
    World { table, slots, clock, deps }
}

fn world() -> World {
    world_with(config())
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A token for `owner`'s `job_id`, valid for ten minutes.
fn token(job_id: &JobId, owner: &Owner) -> String {
    stream_token::issue(KEY.as_bytes(), job_id, owner, now() + 600)
}

/// `GET path` as the function URL hands it over, with `token` and `Last-Event-ID`.
fn get(path: &str, token: Option<&str>, last_event_id: Option<&str>) -> Request {
    let mut request = ApiRequest::new("GET", path, "").anonymous();
    if let Some(token) = token {
        request = request.query("token", token);
    }
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    request.build()
}

fn events_path(job_id: &JobId) -> String {
    format!("/jobs/{job_id}/events")
}

impl World {
    /// A running job of `owner`, without progress yet.
    fn running(&self, owner: &Owner) -> JobRecord {
        let mut job = pending_job(owner, Timestamp::now());
        job.status = JobStatus::Running;
        job.attempt = 1;
        self.table.store.put_record(job.clone());
        job
    }

    /// The job's progress write `seq`: `done` of 10 items of its one stage.
    fn progress(&self, job: &JobRecord, seq: u64, done: u64) {
        let record = ProgressRecord {
            pct: done as f64 * 10.0,
            stage: "scan".into(),
            stage_index: 1,
            stages_total: 1,
            items_done: done,
            items_total: Some(10),
            seq,
            lease: "lease-1".into(),
            ..Default::default()
        };
        self.table.store.put_progress(&job.job_id, record);
    }

    /// The job ends `status` (a failure with its error).
    fn end(&self, job: &JobRecord, status: JobStatus) {
        let mut ended = job.clone();
        ended.status = status;
        ended.finished_at = Some(Timestamp::now());
        if status == JobStatus::Failed {
            ended.error = Some(JobError { code: "Job.Fatal".into(), message: "bad row".into() });
        }
        self.table.store.put_record(ended);
    }

    /// Opens `owner`'s stream of `job` from `last_event_id`.
    async fn open(&self, job: &JobRecord, last_event_id: Option<&str>) -> Response<EventBody> {
        let owner = &job.owner;
        let id = &job.job_id;
        handle(self.deps.clone(), get(&events_path(id), Some(&token(id, owner)), last_event_id))
            .await
    }

    /// Opens a stream that must be accepted.
    async fn stream(&self, job: &JobRecord, last_event_id: Option<&str>) -> Sse {
        let response = self.open(job, last_event_id).await;
        assert_eq!(response.status(), 200);
        let headers = response.headers();
        assert_eq!(headers[header::CONTENT_TYPE], "text/event-stream");
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        let mut sse = Sse(response.into_body());
        assert_eq!(sse.chunk().await.as_deref(), Some("retry: 1000\n\n"), "reconnect advice first");
        sse
    }

    /// The job's open streams, as its slot item counts them.
    fn open_streams(&self, job: &JobRecord) -> usize {
        self.slots.open_of_job(&job.owner, &job.job_id)
    }

    /// Waits until the job's open streams are `count` (a dropped stream gives its slot back
    /// on a spawned task).
    async fn until_open_streams(&self, job: &JobRecord, count: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.open_streams(job) != count {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{} streams still open, not {count}", self.open_streams(job)));
    }
}

/// A stream's body, read chunk by chunk.
struct Sse(EventBody);

/// One event of the stream.
#[derive(Debug)]
struct Event {
    id: u64,
    kind: String,
    data: Value,
}

impl Sse {
    /// The next chunk, `None` at the end; fails if the stream does not move within 10 s.
    async fn chunk(&mut self) -> Option<String> {
        let frame = tokio::time::timeout(Duration::from_secs(10), self.0.frame())
            .await
            .expect("the stream moved within 10 s")?;
        let bytes = frame.unwrap_or_else(|never| match never {}).into_data().expect("data");
        Some(String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// The next chunk, which must be an event.
    async fn event(&mut self) -> Event {
        let chunk = self.chunk().await.expect("an event, not the end");
        let mut lines = chunk.strip_suffix("\n\n").expect("one chunk, one message").lines();
        let mut field = |name: &str| {
            let line = lines.next().unwrap_or_else(|| panic!("no {name} in {chunk:?}"));
            line.strip_prefix(&format!("{name}: "))
                .unwrap_or_else(|| panic!("{chunk:?}"))
                .to_owned()
        };
        let (id, kind, data) = (field("id"), field("event"), field("data"));
        Event { id: id.parse().unwrap(), kind, data: serde_json::from_str(&data).unwrap() }
    }

    async fn end(&mut self) {
        assert_eq!(self.chunk().await, None, "the stream ended");
    }
}

/// A problem response's status and body.
async fn problem(response: Response<EventBody>) -> (StatusCode, HeaderMap, Value) {
    let (parts, body) = response.into_parts();
    assert_eq!(parts.headers[header::CONTENT_TYPE], "application/problem+json");
    let bytes = body.collect().await.unwrap_or_else(|never| match never {}).to_bytes();
    (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn a_valid_token_streams_the_progress_then_the_full_bar_and_the_end() {
    let w = world();
    let job = w.running(&owner(ALICE));
    w.progress(&job, 1, 1);
    let mut sse = w.stream(&job, None).await;
    let first = sse.event().await;
    assert_eq!((first.id, first.kind.as_str()), (1, "progress"));
    assert_eq!(first.data["job_id"], job.job_id.as_str());
    assert_eq!(first.data["status"], "running");
    assert_eq!(
        (first.data["items_done"].as_u64(), first.data["pct"].as_f64()),
        (Some(1), Some(10.0))
    );
    assert_eq!(w.open_streams(&job), 1, "the stream holds a slot");
    assert_eq!(w.slots.open_of_tenant(&owner(ALICE)), 1);
    assert_eq!(w.slots.open_in_deployment(), 1);

    w.progress(&job, 2, 5);
    let second = sse.event().await;
    assert_eq!((second.id, second.data["items_done"].as_u64()), (2, Some(5)));

    // The worker's last write said 5 of 10; the job succeeded: the bar ends full, then the end.
    w.end(&job, JobStatus::Succeeded);
    let full = sse.event().await;
    assert_eq!((full.id, full.kind.as_str()), (3, "progress"));
    assert_eq!(
        (full.data["pct"].as_f64(), full.data["items_done"].as_u64()),
        (Some(100.0), Some(10))
    );
    assert_eq!(full.data["status"], "succeeded");
    let end = sse.event().await;
    assert_eq!((end.id, end.kind.as_str()), (4, "status"));
    assert_eq!(
        end.data,
        json!({
            "job_id": job.job_id,
            "status": "succeeded",
            "result_url": format!("/jobs/{}/result", job.job_id),
        })
    );
    sse.end().await;
    assert_eq!(w.open_streams(&job), 0, "the slot went back when the stream ended");
    assert_eq!(w.slots.open_in_deployment(), 0);
}

#[tokio::test]
async fn a_pause_and_a_resume_are_sent_though_they_write_no_progress() {
    let w = world();
    let job = w.running(&owner(ALICE));
    w.progress(&job, 1, 3);
    let mut sse = w.stream(&job, None).await;
    assert_eq!(sse.event().await.data["status"], "running");
    let mut paused = job.clone();
    paused.status = JobStatus::Paused;
    w.table.store.put_record(paused.clone());
    let pause = sse.event().await;
    assert_eq!((pause.id, pause.kind.as_str()), (1, "progress"), "no new progress: its id again");
    assert_eq!(
        (pause.data["status"].as_str(), pause.data["items_done"].as_u64()),
        (Some("paused"), Some(3))
    );
    let mut resumed = paused;
    resumed.status = JobStatus::Pending;
    w.table.store.put_record(resumed);
    assert_eq!(sse.event().await.data["status"], "pending", "the stream goes on: not an end");
    w.progress(&job, 2, 4);
    let next = sse.event().await;
    assert_eq!((next.id, next.data["items_done"].as_u64()), (2, Some(4)));
}

#[tokio::test]
async fn a_job_that_failed_or_was_cancelled_ends_with_its_status_alone() {
    let w = world();
    let failed = w.running(&owner(ALICE));
    w.progress(&failed, 3, 4);
    w.end(&failed, JobStatus::Failed);
    let mut sse = w.stream(&failed, None).await;
    let end = sse.event().await;
    assert_eq!((end.id, end.kind.as_str()), (4, "status"));
    assert_eq!(
        end.data,
        json!({"job_id": failed.job_id, "status": "failed", "error": {"code": "Job.Fatal", "message": "bad row"}})
    );
    sse.end().await;
    let cancelled = w.running(&owner(ALICE));
    w.end(&cancelled, JobStatus::Cancelled);
    let mut sse = w.stream(&cancelled, None).await;
    let end = sse.event().await;
    assert_eq!((end.id, end.data["status"].as_str()), (1, Some("cancelled")), "no progress: id 1");
    assert!(end.data.get("result_url").is_none());
    sse.end().await;
    assert_eq!(w.slots.open_in_deployment(), 0);
}

#[tokio::test]
async fn last_event_id_resumes_after_what_the_client_has_and_never_repeats_it() {
    let w = world_with(Config { keepalive: Duration::from_millis(10), ..config() });
    let job = w.running(&owner(ALICE));
    w.progress(&job, 5, 5);
    // Behind: the latest state at once (ids are progress sequence numbers; states between
    // are not replayed).
    let mut sse = w.stream(&job, Some("3")).await;
    assert_eq!(sse.event().await.id, 5);
    drop(sse);
    // Up to date: nothing until the job moves (a keepalive meanwhile), then the next state.
    let mut sse = w.stream(&job, Some("5")).await;
    assert_eq!(sse.chunk().await.as_deref(), Some(": keepalive\n\n"), "5 is not sent again");
    w.progress(&job, 6, 6);
    assert_eq!(sse.event().await.id, 6);
    drop(sse);
    // A client that saw the full bar of a succeeded job (id seq + 1) gets only the status.
    w.end(&job, JobStatus::Succeeded);
    let mut sse = w.stream(&job, Some("7")).await;
    let end = sse.event().await;
    assert_eq!((end.id, end.kind.as_str()), (8, "status"));
    sse.end().await;
    // Blank is from the start.
    let mut sse = w.stream(&job, Some("  ")).await;
    assert_eq!((sse.event().await.id, sse.event().await.id), (7, 8));
}

#[tokio::test]
async fn a_bad_last_event_id_is_400_before_any_read() {
    let w = world();
    let job = w.running(&owner(ALICE));
    for bad in ["-1", "abc", "18446744073709551615"] {
        let (status, _, body) = problem(w.open(&job, Some(bad)).await).await;
        assert_eq!(status, 400, "{bad}");
        assert!(body["detail"].as_str().unwrap().contains("Last-Event-ID"));
    }
    assert_eq!((w.table.reads(), w.slots.acquires()), (0, 0));
}

#[tokio::test]
async fn a_missing_forged_expired_or_other_jobs_token_is_401_before_any_read() {
    let w = world();
    let job = w.running(&owner(ALICE));
    let other = w.running(&owner(ALICE));
    let id = &job.job_id;
    let path = events_path(id);
    let valid = token(id, &owner(ALICE));
    let (expires, rest) = valid.split_once('.').unwrap();
    let extended = format!("{}.{rest}", expires.parse::<i64>().unwrap() + 3_600);
    let refused = [
        None,
        Some(String::new()),
        Some("garbage".to_owned()),
        Some(extended),
        Some(stream_token::issue(b"not-the-key", id, &owner(ALICE), now() + 600)),
        Some(token(&other.job_id, &owner(ALICE))),
        Some(format!("{valid}x")),
        Some("A".repeat(6_000)),
    ];
    for bad in &refused {
        let (status, _, body) =
            problem(handle(w.deps.clone(), get(&path, bad.as_deref(), None)).await).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("/problems/unauthorized")),
            "{bad:?}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("missing or invalid"), "{bad:?}: {detail}");
        assert!(!detail.contains(&valid), "never echoes a token");
    }
    let expired = stream_token::issue(KEY.as_bytes(), id, &owner(ALICE), now() - 60);
    let (status, _, body) =
        problem(handle(w.deps.clone(), get(&path, Some(&expired), None)).await).await;
    assert_eq!(status, 401);
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "an authentic token is told it expired"
    );
    assert_eq!(w.table.reads(), 0, "refusing {} tokens read nothing", refused.len() + 1);
    assert_eq!(w.slots.acquires(), 0, "and took no slot");
}

#[tokio::test]
async fn a_token_is_refused_once_the_clock_passes_its_expiry() {
    // A time the machine's clock is not at: the handler reads the clock it is given.
    let issued: Timestamp = "2031-02-03T04:05:06Z".parse().unwrap();
    let w = world_on(config(), ManualClock::at(issued.as_datetime()));
    let job = w.running(&owner(ALICE));
    let expires = issued.as_datetime().timestamp() + 600;
    let token = stream_token::issue(KEY.as_bytes(), &job.job_id, &owner(ALICE), expires);
    let path = events_path(&job.job_id);
    w.clock.advance(Duration::from_secs(600));
    let response = handle(w.deps.clone(), get(&path, Some(&token), None)).await;
    assert_eq!(response.status(), 200, "valid up to its expiry");
    drop(response);
    w.clock.advance(Duration::from_secs(1));
    let (status, _, body) =
        problem(handle(w.deps.clone(), get(&path, Some(&token), None)).await).await;
    assert_eq!(status, 401);
    assert!(body["detail"].as_str().unwrap().contains("expired"), "{body}");
}

#[tokio::test]
async fn paths_that_name_no_job_stream_are_404_before_any_read() {
    let w = world();
    let job = w.running(&owner(ALICE));
    let id = &job.job_id;
    for path in [
        format!("/jobs/{id}"),
        "/jobs/not-a-job/events".to_owned(),
        format!("/jobs/{id}/events/more"),
        "/".to_owned(),
    ] {
        let (status, _, _) = problem(
            handle(w.deps.clone(), get(&path, Some(&token(id, &owner(ALICE))), None)).await,
        )
        .await;
        assert_eq!(status, 404, "{path}");
    }
    assert_eq!((w.table.reads(), w.slots.acquires()), (0, 0));
}

#[tokio::test]
async fn an_authentic_token_opens_nothing_of_a_job_that_is_gone_or_someone_elses() {
    let w = world();
    let job = w.running(&owner(ALICE));
    let id = &job.job_id;
    // The key signed a token naming mallory for alice's job: the record's owner decides.
    let mallory = stream_token::issue(KEY.as_bytes(), id, &owner("mallory"), now() + 600);
    let (status, _, _) =
        problem(handle(w.deps.clone(), get(&events_path(id), Some(&mallory), None)).await).await;
    assert_eq!(status, 404);
    let never = pending_job(&owner(ALICE), Timestamp::now()).job_id.clone();
    let (status, _, _) = problem(
        handle(
            w.deps.clone(),
            get(&events_path(&never), Some(&token(&never, &owner(ALICE))), None),
        )
        .await,
    )
    .await;
    assert_eq!(status, 404, "reads the same as someone else's");
    assert_eq!(w.table.reads(), 2);
    assert_eq!(w.slots.acquires(), 0, "no slot for what cannot be streamed");
}

#[tokio::test]
async fn a_key_table_or_slot_failure_is_a_500_that_names_nothing_inside() {
    let job_of = |w: &World| w.running(&owner(ALICE));
    let inside = |body: &Value| {
        let text = body.to_string();
        assert!(
            !text.contains("arn:") && !text.contains("unavailable") && !text.contains("Denied"),
            "{text}"
        );
    };
    // The key: nothing is read.
    let w = world();
    let job = job_of(&w);
    let deps = Arc::new(Deps { token_key: Arc::new(NoKey), ..(*w.deps).clone() });
    let id = &job.job_id;
    let (status, _, body) =
        problem(handle(deps, get(&events_path(id), Some(&token(id, &owner(ALICE))), None)).await)
            .await;
    assert_eq!(status, 500);
    inside(&body);
    assert_eq!((w.table.reads(), w.slots.acquires()), (0, 0));
    // The table: no slot is taken.
    let w = world();
    let job = job_of(&w);
    w.table.store.set_unavailable(true);
    let (status, _, body) = problem(w.open(&job, None).await).await;
    assert_eq!(status, 500);
    inside(&body);
    assert_eq!(w.slots.acquires(), 0);
    // The slots.
    let w = world();
    let job = job_of(&w);
    w.slots.set_unavailable(true);
    let (status, _, body) = problem(w.open(&job, None).await).await;
    assert_eq!(status, 500);
    inside(&body);
    w.slots.set_unavailable(false);
    assert_eq!(w.slots.open_in_deployment(), 0);
}

#[tokio::test]
async fn a_full_job_tenant_or_deployment_is_429_with_retry_after_and_a_freed_slot_reopens() {
    let w = world();
    let [one, two, three] =
        [w.running(&owner(ALICE)), w.running(&owner(ALICE)), w.running(&owner(ALICE))];
    let refusal = |response| async move {
        let (status, headers, body) = problem(response).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("/problems/too-many-streams"))
        );
        let retry_after: u64 = headers[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry_after), "{retry_after}");
        body["detail"].as_str().unwrap().to_owned()
    };
    let held_one = [w.stream(&one, None).await, w.stream(&one, None).await];
    let detail = refusal(w.open(&one, None).await).await;
    assert!(
        detail.starts_with("This job already has 2 progress streams open (at most 2)"),
        "{detail}"
    );
    let _held_two = w.stream(&two, None).await;
    let detail = refusal(w.open(&three, None).await).await;
    assert!(detail.starts_with("This tenant already has 3"), "{detail}");
    assert_eq!(w.open_streams(&three), 0, "the refused stream holds nothing");
    let bob = [w.running(&owner("bob")), w.running(&owner("bob"))];
    let _held_bob = w.stream(&bob[0], None).await;
    let _held_bob_too = w.stream(&bob[0], None).await;
    let detail = refusal(w.open(&bob[1], None).await).await;
    assert!(detail.starts_with("This deployment already has 5"), "{detail}");
    // One of alice's clients goes away: its slot comes back, and a new stream opens.
    drop(held_one);
    w.until_open_streams(&one, 0).await;
    let _reopened = w.stream(&three, None).await;
}

#[tokio::test]
async fn an_idle_stream_sends_keepalives() {
    let w = world_with(Config { keepalive: Duration::from_millis(10), ..config() });
    let job = w.running(&owner(ALICE));
    w.progress(&job, 1, 1);
    let mut sse = w.stream(&job, None).await;
    assert_eq!(sse.event().await.id, 1);
    for _ in 0..2 {
        assert_eq!(sse.chunk().await.as_deref(), Some(": keepalive\n\n"));
    }
    w.progress(&job, 2, 2);
    assert_eq!(sse.event().await.id, 2, "the stream goes on after keepalives");
}

#[tokio::test]
async fn a_stream_ends_at_its_time_limit_for_the_client_to_reconnect() {
    let w = world_with(Config { max_duration: Duration::from_millis(20), ..config() });
    let job = w.running(&owner(ALICE));
    let mut sse = w.stream(&job, None).await;
    assert_eq!(
        sse.chunk().await.as_deref(),
        Some(": reconnect with Last-Event-ID to continue\n\n")
    );
    sse.end().await;
    assert_eq!(w.open_streams(&job), 0, "its slot went back");
}

#[tokio::test]
async fn keepalives_and_the_time_limit_follow_the_clock() {
    let config = Config {
        keepalive: Duration::from_secs(60),
        max_duration: Duration::from_secs(300),
        ..config()
    };
    let w = world_on(config, ManualClock::new());
    let job = w.running(&owner(ALICE));
    w.progress(&job, 1, 1);
    let mut sse = w.stream(&job, None).await;
    assert_eq!(sse.event().await.id, 1);
    // Neither comes while the clock stands still, however long the test's machine takes.
    w.clock.advance(Duration::from_secs(60));
    assert_eq!(sse.chunk().await.as_deref(), Some(": keepalive\n\n"));
    w.clock.advance(Duration::from_secs(240));
    assert_eq!(
        sse.chunk().await.as_deref(),
        Some(": reconnect with Last-Event-ID to continue\n\n")
    );
    sse.end().await;
}

#[tokio::test]
async fn a_client_that_goes_away_gives_its_slot_back() {
    let w = world();
    let job = w.running(&owner(ALICE));
    let sse = w.stream(&job, None).await;
    assert_eq!(w.open_streams(&job), 1);
    drop(sse);
    w.until_open_streams(&job, 0).await;
    assert_eq!(w.slots.open_of_tenant(&owner(ALICE)), 0);
    assert_eq!(w.slots.open_in_deployment(), 0);
}

#[tokio::test]
async fn a_stream_outlives_failing_reads_and_ends_when_its_job_is_gone() {
    let w = world();
    let job = w.running(&owner(ALICE));
    w.progress(&job, 1, 1);
    let mut sse = w.stream(&job, None).await;
    assert_eq!(sse.event().await.id, 1);
    // The table fails while the stream waits for the next state: it keeps polling.
    w.table.store.set_unavailable(true);
    let reads = w.table.reads();
    let next = tokio::spawn(async move { (sse.event().await, sse) });
    tokio::time::timeout(Duration::from_secs(10), async {
        while w.table.reads() < reads + 3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the stream retried its reads");
    w.table.store.set_unavailable(false);
    w.progress(&job, 2, 2);
    let (event, mut sse) = next.await.unwrap();
    assert_eq!(event.id, 2);
    // Its record is deleted (expired and swept): an error event, then the end.
    w.table.gone.store(true, Ordering::SeqCst);
    assert_eq!(
        sse.chunk().await.as_deref(),
        Some("event: error\ndata: {\"detail\":\"the job no longer exists\"}\n\n")
    );
    sse.end().await;
    assert_eq!(w.open_streams(&job), 0);
}
