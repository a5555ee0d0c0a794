//! A run over in-memory adapters: what it expires, deletes and marks, what it leaves, how it
//! pages, and how it stops.

use super::*;
use longhaul_domain::JobId;

use crate::reminders::Reminders;
use chrono::Duration as Span;
use longhaul_aws::endpoint_events::DISABLED_ERROR;
use longhaul_aws::jobs::{EndpointDelivery, EndpointRecord, ProgressRecord};
use longhaul_aws::ports::{JobCreation, JobReads};
use longhaul_aws::queue::WebhookMessage;
use longhaul_domain::endpoints::{DeliveryStatus, EndpointEvent, endpoint_message_id};
use longhaul_memory::contract::{pending_job, shard_of};
use longhaul_memory::{
    ManualClock, MemoryEndpoints, MemoryJobStore, MemoryObjects, MemoryWebhookQueue, owner,
};

#[test]
fn a_run_stops_at_its_budget_or_before_the_deadline_whichever_is_sooner() {
    let t = Instant::now();
    let min = |m: u64| Duration::from_secs(60 * m);
    // The budget is sooner.
    assert_eq!(stop_at(t, t + min(5), min(4)), t + min(4));
    // The deadline (less the page margin) is sooner.
    assert_eq!(stop_at(t, t + min(2), min(4)), t + min(2) - PAGE_MARGIN);
    // A deadline closer than the margin: no page is started.
    assert_eq!(stop_at(t, t + Duration::from_secs(10), min(4)), t);
}

struct World {
    jobs: Arc<MemoryJobStore>,
    endpoints: Arc<MemoryEndpoints>,
    webhooks: Arc<MemoryWebhookQueue>,
    objects: Arc<MemoryObjects>,
    /// The run's clock: standing still at the time the world was made, unless a test moves it.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn config(page: usize) -> Config {
    Config {
        table: "jobs".into(),
        bucket: "data".into(),
        webhook_queue_url: "webhooks".into(),
        record_retention: RecordRetention(Duration::from_secs(1_000)),
        page,
        budget: Duration::from_secs(240),
    }
}

fn world() -> World {
    world_of(config(200))
}

fn world_of(config: Config) -> World {
    world_with(config, ManualClock::new())
}

fn world_with(config: Config, clock: ManualClock) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let objects = Arc::new(MemoryObjects::new());
    let clock = Arc::new(clock);
    let endpoints = Arc::new(MemoryEndpoints::new());
    let webhooks = Arc::new(MemoryWebhookQueue::new());
    let deps = Deps {
        jobs: jobs.clone(),
        objects: objects.clone(),
        endpoints: endpoints.clone(),
        webhooks: webhooks.clone(),
        clock: clock.clone(),
        config,
    };
    World { jobs, endpoints, webhooks, objects, clock, deps }
}

/// Shards a run sweeps: every shard of the `expired` bucket, then of the `succeeded` one.
const SWEEPS: u32 = 2 * STATUS_SHARDS;

fn at(time: DateTime<Utc>) -> String {
    format_rfc3339(time)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(900)
}

impl World {
    /// A succeeded job whose result expires at `expires`, in shard `shard` if given, with a
    /// result, a checkpoint and a progress record.
    async fn succeeded(&self, expires: DateTime<Utc>, shard: Option<u32>) -> JobId {
        let job = loop {
            let job = pending_job(&owner("alice"), Timestamp::now());
            if shard.is_none_or(|s| shard_of(&job.job_id) == s) {
                break job;
            }
        };
        let id = job.job_id.clone();
        self.jobs.put_job(&job).await.unwrap();
        let steps = [
            (JobStatus::Pending, JobStatus::Queued),
            (JobStatus::Queued, JobStatus::Running),
            (JobStatus::Running, JobStatus::Succeeded),
        ];
        for (from, to) in steps {
            let mut request = TransitionRequest::new(&id, &[from], to, "arranged");
            if to == JobStatus::Running {
                request = request.set("lease", "l-1").set("attempt", 1);
            }
            if to == JobStatus::Succeeded {
                request = request
                    .set("result_key", format!("results/{id}/result.json"))
                    .indexed_at(at(expires));
            }
            self.jobs.transition(request).await.unwrap();
        }
        self.jobs.put_progress(&id, ProgressRecord { pct: 100.0, ..Default::default() });
        self.objects.insert(&format!("results/{id}/result.json"), b"{}", "application/json");
        self.objects.insert(&format!("checkpoints/{id}/render-0001"), b"c", "application/json");
        id
    }

    /// A job an earlier run expired at `expired` without finishing the follow-up.
    async fn unfinished(&self, expired: DateTime<Utc>) -> JobId {
        let id = self.succeeded(Utc::now() - Span::days(1), None).await;
        let request =
            TransitionRequest::new(&id, &[JobStatus::Succeeded], JobStatus::Expired, "earlier")
                .indexed_at(at(expired));
        self.jobs.transition(request).await.unwrap();
        id
    }

    async fn run(&self) -> Report {
        handle(&self.deps, Utc::now(), deadline()).await.expect("the run succeeds")
    }

    async fn status(&self, id: &JobId) -> JobStatus {
        self.jobs.job(id).await.unwrap().unwrap().status
    }

    fn objects_of(&self, id: &JobId) -> Vec<String> {
        self.objects.keys().into_iter().filter(|k| k.contains(id.as_str())).collect()
    }
}

#[tokio::test]
async fn a_due_result_is_expired_its_objects_deleted_and_its_records_marked() {
    let w = world();
    let due = w.succeeded(Utc::now() - Span::hours(1), None).await;
    let kept = w.succeeded(Utc::now() + Span::hours(1), None).await;
    w.objects.insert("uploads/abc/1/data.csv", b"x", "text/csv");
    let report = w.run().await;
    assert_eq!(
        report,
        Report {
            expired: 1,
            finished: 1,
            resumed: 0,
            objects_deleted: 2,
            errors: 0,
            pages: SWEEPS,
            budget_spent: false,
            // The kept result expires within the reminders' lead: looked at, and no endpoint
            // of its owner wants the reminder.
            reminders: crate::reminders::Reminders { looked_at: 1, ..Default::default() },
        }
    );
    let job = w.jobs.job(&due).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Expired);
    assert_eq!(job.transitions.last().unwrap().reason, "result retention passed");
    assert!(w.objects_of(&due).is_empty(), "its result and checkpoints are deleted");
    let ttl = RecordRetention(Duration::from_secs(1_000))
        .expires_at(job.finished_at.unwrap().as_datetime());
    assert_eq!(w.jobs.retained_until(&due), Some(ttl), "kept the record retention after expiry");
    assert_eq!(w.jobs.progress_retained_until(&due), Some(ttl), "the progress record too");
    assert_eq!(w.jobs.index_entry(&due), None, "out of the index once finished");

    assert_eq!(w.status(&kept).await, JobStatus::Succeeded, "a result not yet due stays");
    assert_eq!(w.objects_of(&kept).len(), 2);
    assert!(w.jobs.index_entry(&kept).is_some());
    assert_eq!(w.jobs.retained_until(&kept), None);
    assert!(w.objects.keys().contains(&"uploads/abc/1/data.csv".to_owned()), "uploads stay");

    let again = w.run().await;
    assert_eq!((again.expired, again.finished, again.objects_deleted), (0, 0, 0), "done once");
}

#[tokio::test]
async fn a_result_kept_in_the_record_goes_with_the_expiry() {
    let w = world();
    let due = w.succeeded(Utc::now() - Span::hours(1), None).await;
    let mut job = w.jobs.job(&due).await.unwrap().unwrap();
    job.result_key = None;
    job.result_inline =
        longhaul_domain::inline_result::InlineResult::of("application/json", b"{}".to_vec());
    w.jobs.put_record(job);
    assert_eq!(w.run().await.expired, 1);
    let job = w.jobs.job(&due).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Expired);
    assert_eq!(job.result_inline, None, "removed in the write that made it expired");
}

#[tokio::test]
async fn a_result_due_exactly_now_waits_for_the_next_run() {
    let w = world();
    let now = Utc::now();
    let id = w.succeeded(now, None).await;
    let report = handle(&w.deps, now, deadline()).await.unwrap();
    assert_eq!(report.expired, 0, "due is strictly before the run's time");
    assert_eq!(w.status(&id).await, JobStatus::Succeeded);
    let later = handle(&w.deps, now + Span::milliseconds(1), deadline()).await.unwrap();
    assert_eq!(later.expired, 1);
}

#[tokio::test]
async fn an_unfinished_expiry_is_finished_from_when_it_expired() {
    let w = world();
    let expired_at = Utc::now() - Span::hours(3);
    let id = w.unfinished(expired_at).await;
    let report = w.run().await;
    assert_eq!((report.expired, report.finished, report.resumed), (0, 1, 1));
    assert_eq!(report.objects_deleted, 2);
    assert!(w.objects_of(&id).is_empty());
    let ttl = RecordRetention(Duration::from_secs(1_000))
        .expires_at(at(expired_at).parse::<Timestamp>().unwrap().as_datetime());
    assert_eq!(w.jobs.retained_until(&id), Some(ttl), "retention counts from the expiry");
    assert_eq!(w.jobs.index_entry(&id), None);
}

#[tokio::test]
async fn a_failed_follow_up_is_finished_by_the_next_run() {
    let w = world();
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    w.objects.set_unavailable(true);
    let first = w.run().await;
    assert_eq!((first.expired, first.finished, first.errors), (1, 0, 1));
    assert_eq!(w.status(&id).await, JobStatus::Expired, "expired first: /result answers 410");
    assert_eq!(w.objects_of(&id).len(), 2);
    assert_eq!(w.jobs.retained_until(&id), None, "not marked before its objects are gone");
    let (bucket, _) = w.jobs.index_entry(&id).expect("left where the next run finds it");
    assert!(bucket.starts_with("expired#"), "{bucket}");

    w.objects.set_unavailable(false);
    // The next run, a while later (an entry is due strictly before a run's time).
    let second = handle(&w.deps, Utc::now() + Span::seconds(1), deadline()).await.unwrap();
    assert_eq!((second.expired, second.finished, second.resumed, second.errors), (0, 1, 1, 0));
    assert!(w.objects_of(&id).is_empty());
    let job = w.jobs.job(&id).await.unwrap().unwrap();
    let ttl = RecordRetention(Duration::from_secs(1_000))
        .expires_at(job.finished_at.unwrap().as_datetime());
    assert_eq!(w.jobs.retained_until(&id), Some(ttl));
}

#[tokio::test]
async fn an_unreadable_entry_is_counted_and_holds_no_other_up() {
    let w = world();
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    let shard = shard_of(&id);
    let older = at(Utc::now() - Span::days(2));
    w.jobs.put_stray_index_entry("SWEEP#x", "succeeded", shard, &older);
    // An unfinished entry whose sort key is no time: an error of that entry, not "now".
    let odd = w.unfinished(Utc::now() - Span::hours(2)).await;
    w.jobs.put_index_entry(&odd, "expired", "0000-not-a-time");
    let report = w.run().await;
    assert_eq!((report.expired, report.finished, report.resumed, report.errors), (1, 1, 0, 2));
    assert_eq!(w.status(&id).await, JobStatus::Expired);
    assert_eq!(w.objects_of(&odd).len(), 2, "the odd entry's job is left for an operator");
    assert!(w.jobs.index_entry(&odd).is_some());
}

#[tokio::test]
async fn a_job_that_changed_or_went_meanwhile_is_skipped() {
    let w = world();
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    // Expired by a concurrent run after this one read the page: its entry is still here.
    let mut job = w.jobs.job(&id).await.unwrap().unwrap();
    job.status = JobStatus::Expired;
    w.jobs.put_record(job);
    let gone = pending_job(&owner("alice"), Timestamp::now()).job_id.clone();
    w.jobs.put_index_entry(&gone, "succeeded", &at(Utc::now() - Span::hours(1)));
    let report = w.run().await;
    assert_eq!((report.expired, report.finished, report.errors), (0, 0, 0));
    assert_eq!(w.objects_of(&id).len(), 2, "whoever expired it finishes it");
}

#[tokio::test]
async fn one_run_drains_every_page_of_every_shard() {
    let w = world_of(config(1));
    let due = Utc::now() - Span::hours(1);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(w.succeeded(due, Some(2)).await);
    }
    ids.push(w.succeeded(due, Some(0)).await);
    ids.push(w.unfinished(Utc::now() - Span::hours(2)).await);
    let report = w.run().await;
    assert_eq!((report.expired, report.finished, report.resumed, report.errors), (4, 5, 1, 0));
    for id in &ids {
        assert_eq!(w.status(id).await, JobStatus::Expired);
        assert!(w.objects_of(id).is_empty());
    }
    // A page of one: every shard's sweep reads a page per entry, and the page after its last
    // (a full page names a cursor, as DynamoDB's does), or one empty page.
    assert_eq!(report.pages, SWEEPS + 3 + 1 + 1);
    assert!(!report.budget_spent);
}

#[tokio::test]
async fn a_spent_budget_starts_no_page() {
    let mut config = config(200);
    config.budget = Duration::ZERO;
    let w = world_of(config);
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    let report = w.run().await;
    assert!(report.budget_spent);
    assert_eq!((report.pages, report.expired), (0, 0));
    assert_eq!(w.status(&id).await, JobStatus::Succeeded, "the next run goes on");

    // A Lambda deadline closer than the page margin stops it the same way.
    let w = world();
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    // Of the run's clock, which stands still: the machine's would drift on a busy machine.
    let close = w.clock.instant() + PAGE_MARGIN - Duration::from_secs(1);
    let report = handle(&w.deps, Utc::now(), close).await.unwrap();
    assert!(report.budget_spent);
    assert_eq!(report.pages, 0);
    assert_eq!(w.status(&id).await, JobStatus::Succeeded);
}

#[tokio::test]
async fn an_unreadable_index_fails_the_run_and_changes_nothing() {
    let w = world();
    let id = w.succeeded(Utc::now() - Span::hours(1), None).await;
    w.jobs.set_unavailable(true);
    let err = handle(&w.deps, Utc::now(), deadline()).await.unwrap_err();
    assert!(err.to_string().starts_with("expirer run failed"), "{err}");
    let diagnostic = lambda_runtime::Diagnostic::from(err);
    assert_eq!(diagnostic.error_type, "Expirer.Failed");
    w.jobs.set_unavailable(false);
    assert_eq!(w.status(&id).await, JobStatus::Succeeded);
    assert_eq!(w.objects_of(&id).len(), 2);
}

#[tokio::test]
async fn a_result_is_expired_once_the_clock_passes_its_expiry() {
    let w = world();
    let expires = w.clock.now() + Span::hours(1);
    let id = w.succeeded(expires, None).await;
    // A run at the clock's time, with the Lambda deadline as far ahead of it as ever (the
    // deadline is an instant: of the clock's, which the test moves, not the machine's).
    let expired = async || {
        let report = run(&w.deps, w.clock.instant() + Duration::from_secs(900)).await.unwrap();
        assert!(!report.budget_spent && report.pages >= SWEEPS, "every shard read: {report:?}");
        report.expired
    };
    assert_eq!(expired().await, 0, "an hour early");
    w.clock.advance(Duration::from_secs(3600) - Duration::from_millis(1));
    assert_eq!(expired().await, 0, "a millisecond early");
    w.clock.set(expires);
    assert_eq!(expired().await, 0, "due strictly before the run's time");
    assert_eq!(w.status(&id).await, JobStatus::Succeeded);
    w.clock.advance(Duration::from_millis(1));
    assert_eq!(expired().await, 1, "a millisecond past its expiry");
    assert_eq!(w.status(&id).await, JobStatus::Expired);
}

#[tokio::test]
async fn a_run_stops_starting_pages_once_its_clock_passes_the_budget() {
    // Each reading of the clock is a second later, and the budget is 1.5 s: the first check
    // before a page (a second after the run's start) passes, every later one is past it —
    // whichever shard reads first, the run reads one page in all.
    let config = Config { budget: Duration::from_millis(1_500), ..config(1) };
    let w = world_with(config, ManualClock::new().stepping(Duration::from_secs(1)));
    let due = Utc::now() - Span::hours(1);
    let ids = [w.succeeded(due, Some(0)).await, w.succeeded(due, Some(1)).await];
    let report = w.run().await;
    assert!(report.budget_spent);
    assert_eq!(report.pages, 1, "{report:?}");
    // The next run, with time to spare (a clock that stands still), does the rest.
    let rested = Deps { clock: Arc::new(ManualClock::new()), ..w.deps.clone() };
    let next = handle(&rested, Utc::now(), deadline()).await.unwrap();
    assert!(!next.budget_spent);
    assert_eq!(report.expired + next.expired, 2);
    for id in &ids {
        assert_eq!(w.status(id).await, JobStatus::Expired);
    }
}

// Reminders.

use EndpointEvent::{JobFailed, JobProgress, JobResultExpiring, JobSucceeded};

impl World {
    /// An endpoint of `owner_name` receiving `events` (disabled, if `disabled`).
    fn subscribed(
        &self,
        owner_name: &str,
        events: &[EndpointEvent],
        disabled: bool,
    ) -> EndpointRecord {
        let url = "https://hooks.example.com/longhaul";
        self.endpoints.subscribe(&owner(owner_name), url, events, disabled)
    }

    /// A run at the clock's time, with time to spare.
    async fn run_at_clock(&self) -> Result<Report, ExpirerError> {
        run(&self.deps, self.clock.instant() + Duration::from_secs(900)).await
    }

    /// What the reminders of a run that succeeded did.
    async fn remind(&self) -> Reminders {
        self.run_at_clock().await.expect("the run succeeds").reminders
    }

    /// Every message queued, each at once, in order.
    fn sent(&self) -> Vec<WebhookMessage> {
        let sent = self.webhooks.sent();
        assert!(sent.iter().all(|(_, delay)| *delay == 0), "{sent:?}");
        sent.into_iter().map(|(message, _)| message).collect()
    }
}

/// The reminder of job `id`'s result, expiring at `expires`, to `endpoint`.
fn reminder(id: &JobId, endpoint: &EndpointRecord, expires: DateTime<Utc>) -> WebhookMessage {
    let event = JobResultExpiring;
    WebhookMessage {
        result_expires_at: Some(at(expires).parse().unwrap()),
        ..WebhookMessage::to_endpoint(
            id.clone(),
            JobStatus::Succeeded,
            endpoint.endpoint_id.clone(),
            event,
            0,
        )
        .of(&endpoint.owner)
    }
}

fn reminded(looked_at: u32, queued: u32, skipped: u32, errors: u32) -> Reminders {
    Reminders { looked_at, queued, skipped, errors }
}

#[tokio::test]
async fn a_result_expiring_within_a_day_is_reminded_once_to_each_subscribed_endpoint() {
    let w = world();
    let first = w.subscribed("alice", &[JobResultExpiring], false);
    let second = w.subscribed("alice", &[JobSucceeded, JobResultExpiring], false);
    w.subscribed("alice", &[JobSucceeded, JobFailed, JobProgress], false);
    w.subscribed("bob", &[JobResultExpiring], false);
    let expires = w.clock.now() + Span::hours(2);
    let id = w.succeeded(expires, None).await;
    assert_eq!(w.remind().await, reminded(1, 2, 0, 0));
    assert_eq!(w.sent(), [reminder(&id, &first, expires), reminder(&id, &second, expires)]);
    assert!(w.endpoints.all_deliveries().is_empty(), "nothing recorded for enabled endpoints");
    // The next runs pass it: each saved where its shard's reminders stopped.
    assert_eq!(w.remind().await, Reminders::default());
    w.clock.advance(Duration::from_secs(3_600));
    assert_eq!(w.remind().await, Reminders::default());
    assert_eq!(w.sent().len(), 2);
    assert_eq!(w.status(&id).await, JobStatus::Succeeded, "a reminder changes nothing");
}

#[tokio::test]
async fn a_result_expiring_later_is_reminded_once_less_than_a_day_is_left() {
    let t0 = DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap();
    let w = world_with(config(200), ManualClock::at(t0));
    let endpoint = w.subscribed("alice", &[JobResultExpiring], false);
    let expires = t0 + Span::hours(30);
    let id = w.succeeded(expires, None).await;
    assert_eq!(w.remind().await, Reminders::default(), "30 hours ahead");
    w.clock.advance(Duration::from_secs(6 * 3_600));
    assert_eq!(w.remind().await, Reminders::default(), "exactly a day ahead");
    w.clock.advance(Duration::from_millis(1));
    assert_eq!(w.remind().await, reminded(1, 1, 0, 0), "less than a day ahead");
    assert_eq!(w.sent(), [reminder(&id, &endpoint, expires)]);
    w.clock.advance(Duration::from_secs(3_600));
    assert_eq!(w.remind().await, Reminders::default());
    assert_eq!(w.sent().len(), 1);
}

#[tokio::test]
async fn no_reminder_goes_where_no_endpoint_of_the_owner_wants_it() {
    let w = world();
    w.subscribed("alice", &[JobSucceeded, JobProgress], false);
    w.subscribed("bob", &[JobResultExpiring], false);
    w.succeeded(w.clock.now() + Span::hours(2), None).await;
    assert_eq!(w.remind().await, reminded(1, 0, 0, 0));
    assert!(w.webhooks.sent().is_empty());
    assert!(w.endpoints.all_deliveries().is_empty());
}

#[tokio::test]
async fn a_disabled_endpoints_reminder_is_recorded_failed_and_not_queued() {
    let w = world();
    let enabled = w.subscribed("alice", &[JobResultExpiring], false);
    let disabled = w.subscribed("alice", &[JobResultExpiring, JobSucceeded], true);
    w.subscribed("alice", &[JobSucceeded], true);
    let expires = w.clock.now() + Span::hours(2);
    let id = w.succeeded(expires, None).await;
    assert_eq!(w.remind().await, reminded(1, 1, 1, 0));
    assert_eq!(w.sent(), [reminder(&id, &enabled, expires)]);
    assert_eq!(
        w.endpoints.all_deliveries(),
        [EndpointDelivery {
            webhook_id: endpoint_message_id(&disabled.endpoint_id, &id, JobResultExpiring, None),
            endpoint_id: disabled.endpoint_id.clone(),
            job_id: id.clone(),
            event: JobResultExpiring,
            status: DeliveryStatus::Failed,
            attempts: 0,
            created_at: w.clock.now().into(),
            last_attempt_at: None,
            status_code: None,
            latency_ms: None,
            error: Some(DISABLED_ERROR.to_owned()),
            progress_seq: None,
            result_expires_at: Some(at(expires).parse().unwrap()),
        }],
        "what `recover` after `enable` puts back on its message"
    );
}

#[tokio::test]
async fn a_reminder_that_could_not_be_sent_fails_the_run_and_the_next_run_sends_it() {
    let w = world();
    let endpoint = w.subscribed("alice", &[JobResultExpiring], false);
    let expires = w.clock.now() + Span::hours(2);
    let id = w.succeeded(expires, None).await;
    // The webhook queue, then the endpoints' table, is down.
    let outages: [&dyn Fn(bool); 2] =
        [&|down| w.webhooks.set_unavailable(down), &|down| w.endpoints.set_unavailable(down)];
    for outage in outages {
        outage(true);
        let err = w.run_at_clock().await.unwrap_err();
        assert!(err.to_string().contains(&format!("reminder of {id}")), "{err}");
        outage(false);
        assert!(w.webhooks.sent().is_empty());
    }
    assert_eq!(w.remind().await, reminded(1, 1, 0, 0));
    assert_eq!(w.sent(), [reminder(&id, &endpoint, expires)]);
    assert_eq!(w.remind().await, Reminders::default());
}

#[tokio::test]
async fn page_by_page_every_result_in_every_shard_is_reminded_exactly_once() {
    let w = world_of(config(1));
    let endpoint = w.subscribed("alice", &[JobResultExpiring], false);
    let now = w.clock.now();
    let mut ids = Vec::new();
    for hours in [3, 1, 2] {
        ids.push(w.succeeded(now + Span::hours(hours), Some(2)).await);
    }
    ids.push(w.succeeded(now + Span::hours(2), Some(0)).await);
    ids.push(w.succeeded(now + Span::hours(5), Some(3)).await);
    let later = w.succeeded(now + Span::hours(30), Some(2)).await;
    assert_eq!(w.remind().await, reminded(5, 5, 0, 0));
    let mut reminded_of: Vec<JobId> = w.sent().into_iter().map(|m| m.job_id).collect();
    reminded_of.sort();
    ids.sort();
    assert_eq!(reminded_of, ids, "each once; none of {later}, a day and more ahead");
    assert!(w.sent().iter().all(|m| m.endpoint_id.as_ref() == Some(&endpoint.endpoint_id)));
    assert_eq!(w.remind().await, Reminders::default());
    // A result that succeeded since, expiring after where its shard stopped: it alone.
    let new = w.succeeded(now + Span::hours(4), Some(2)).await;
    assert_eq!(w.remind().await, reminded(1, 1, 0, 0));
    assert_eq!(w.sent().last().map(|m| m.job_id.clone()), Some(new));
    assert_eq!(w.sent().len(), 6);
}

#[tokio::test]
async fn an_entry_the_reminders_cannot_read_is_counted_and_passed_over() {
    let w = world();
    let endpoint = w.subscribed("alice", &[JobResultExpiring], false);
    let now = w.clock.now();
    let expires = now + Span::hours(3);
    let id = w.succeeded(expires, None).await;
    // Before it in its shard: an item that is no job's; and a job whose record is gone.
    w.jobs.put_stray_index_entry("SWEEP#x", "succeeded", shard_of(&id), &at(now + Span::hours(1)));
    let gone = pending_job(&owner("alice"), Timestamp::now()).job_id.clone();
    w.jobs.put_index_entry(&gone, "succeeded", &at(now + Span::hours(2)));
    let report = w.run_at_clock().await.expect("an unreadable entry does not fail the run");
    let Reminders { queued, skipped, errors, .. } = report.reminders;
    assert_eq!((queued, skipped, errors), (1, 0, 2));
    assert_eq!(w.sent(), [reminder(&id, &endpoint, expires)]);
    assert_eq!(w.remind().await, Reminders::default(), "passed over for good");
}
