//! A run over in-memory adapters: what it expires, deletes and marks, what it leaves, how it
//! pages, and how it stops.

use super::*;
use longhaul_domain::JobId;

use chrono::Duration as Span;
use longhaul_aws::jobs::ProgressRecord;
use longhaul_aws::ports::{JobCreation, JobReads};
use longhaul_memory::contract::{pending_job, shard_of};
use longhaul_memory::{ManualClock, MemoryJobStore, MemoryObjects, owner};

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
    objects: Arc<MemoryObjects>,
    /// The run's clock: standing still at the time the world was made, unless a test moves it.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn config(page: usize) -> Config {
    Config {
        table: "jobs".into(),
        bucket: "data".into(),
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
    let deps = Deps { jobs: jobs.clone(), objects: objects.clone(), clock: clock.clone(), config };
    World { jobs, objects, clock, deps }
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
            budget_spent: false
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
    let close = Instant::now() + PAGE_MARGIN - Duration::from_secs(1);
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
