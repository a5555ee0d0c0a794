//! Reaper runs over in-memory adapters, one module per sweep ([`pending`], [`queued`],
//! [`running`], [`waiting`]) and, here, what holds of a run as a whole: the live jobs counted
//! (exactly, or as a lower bound past the count's page cap), every page of every shard judged, the time budget and the saved cursors, and failures
//! reported rather than lost.
//!
//! Nothing here depends on the machine's speed: records are backdated from the run's `now`
//! instead of waiting for time to pass, and a run's budget is measured by a [`ManualClock`] that
//! stands still (or steps a fixed amount at each reading), never by the machine's clock.

mod compensating;
mod paused;
mod pending;
mod queued;
mod running;
mod waiting;

use super::*;

use std::collections::HashMap;

use chrono::Duration as Span;
use longhaul_aws::config::Vars;
use longhaul_aws::executions::execution_name;
use longhaul_aws::jobs::{JobRecord, ProgressRecord, STATUS_SHARDS};
use longhaul_aws::ports::{JobCreation, JobExecutions};
use longhaul_domain::{ErrorCode, JobId, JobStatus, Timestamp};
use longhaul_memory::contract::{pending_job, shard_of};
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryExecutions, MemoryJobStore, MemoryObjects,
    MemorySlotPools, owner,
};

/// The owner of the tests' jobs.
const OWNER: &str = "alice";

/// The lease of the tests' running jobs.
const LEASE: &str = "lease-1";

/// A fresh job id whose status-index entries are in shard `shard`.
fn id_in_shard(shard: u32) -> JobId {
    loop {
        let id = JobId::new();
        if shard_of(&id) == shard {
            return id;
        }
    }
}

/// The reaper's settings as the template's defaults leave them, changed by `vars`.
fn config(vars: &[(&str, &str)]) -> Config {
    let mut map: HashMap<String, String> = [
        ("TABLE_NAME", "jobs"),
        ("BUCKET_NAME", "data"),
        ("INTAKE_QUEUE_URL", "https://sqs.memory.invalid/intake"),
        ("STATE_MACHINE_ARN", "arn:aws:states:us-east-1:123456789012:stateMachine:job"),
        (
            "LONGHAUL_WORKERS",
            r#"{"StageFunction": "arn:aws:lambda:us-east-1:123456789012:function:stage"}"#,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    map.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_vars(&Vars::from_map(map)).expect("the tests' settings read")
}

/// The in-memory adapters a run works on, and the run's time.
struct World {
    jobs: Arc<MemoryJobStore>,
    objects: Arc<MemoryObjects>,
    intake: Arc<MemoryDispatchQueue>,
    executions: Arc<MemoryExecutions>,
    slots: Arc<MemorySlotPools>,
    deps: Deps,
    /// When the run happens: the real time (the in-memory adapters stamp their writes with
    /// it), which the arranged records are backdated from.
    now: DateTime<Utc>,
}

fn world() -> World {
    world_with(&[], ManualClock::new())
}

fn world_of(vars: &[(&str, &str)]) -> World {
    world_with(vars, ManualClock::new())
}

/// A run's clock stands still, or (`ManualClock::stepping`) each reading is a step later.
fn world_with(vars: &[(&str, &str)], clock: ManualClock) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let objects = Arc::new(MemoryObjects::new());
    let intake = Arc::new(MemoryDispatchQueue::new());
    let executions = Arc::new(MemoryExecutions::new());
    let slots = Arc::new(MemorySlotPools::new(intake.clone()));
    let deps = Deps {
        jobs: jobs.clone(),
        objects: objects.clone(),
        intake: intake.clone(),
        executions: executions.clone(),
        slots: slots.clone(),
        clock: Arc::new(clock),
        config: config(vars),
    };
    World { jobs, objects, intake, executions, slots, deps, now: Timestamp::now().as_datetime() }
}

/// How a running job stands, `now` less these many seconds.
#[derive(Debug, Clone)]
struct Running {
    /// Its attempt (and dispatch): its execution is named by it.
    attempt: u32,
    started: i64,
    heartbeat: i64,
    progress_changed: i64,
    stalled: Option<i64>,
}

impl Running {
    /// A job claimed 10 minutes ago whose worker heartbeats and progresses.
    fn healthy() -> Self {
        Running { attempt: 1, started: 600, heartbeat: 5, progress_changed: 5, stalled: None }
    }

    /// A job claimed 10 minutes ago whose worker has been silent for 5 (the timeout is 90 s).
    fn zombie() -> Self {
        Running { heartbeat: 300, progress_changed: 300, ..Running::healthy() }
    }
}

impl World {
    fn ago(&self, seconds: i64) -> DateTime<Utc> {
        self.now - Span::seconds(seconds)
    }

    fn at_ago(&self, seconds: i64) -> Timestamp {
        Timestamp::from(self.ago(seconds))
    }

    /// A job submitted `seconds` ago, `edit`ed, stored as submit stores it (indexed in
    /// `pending` at its creation, or as its start says).
    async fn submitted_with(&self, seconds: i64, edit: impl FnOnce(&mut JobRecord)) -> JobRecord {
        let mut job = pending_job(&owner(OWNER), self.at_ago(seconds));
        edit(&mut job);
        self.jobs.put_job(&job).await.expect("a new job is stored");
        job
    }

    async fn submitted(&self, seconds: i64) -> JobId {
        self.submitted_with(seconds, |_| {}).await.job_id.clone()
    }

    /// A job dispatched `seconds` ago (its `dispatches`-th execution), not claimed yet.
    async fn queued(&self, seconds: i64, dispatches: u32) -> JobId {
        let id = self.submitted(seconds + 1).await;
        let request =
            TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "dispatched")
                .set("execution", execution_name(&id, dispatches))
                .set("dispatches", dispatches)
                .indexed_at(at(self.ago(seconds)));
        self.jobs.transition(request).await.expect("pending → queued");
        id
    }

    /// A job running as `how` says under [`LEASE`], `edit`ed, in shard `shard` if given: its
    /// record, its progress record and its running execution.
    async fn running_with(
        &self,
        how: &Running,
        shard: Option<u32>,
        edit: impl FnOnce(&mut JobRecord),
    ) -> JobId {
        let mut job = pending_job(&owner(OWNER), self.at_ago(how.started + 60));
        if let Some(shard) = shard {
            job.job_id = id_in_shard(shard);
        }
        self.jobs.put_job(&job).await.expect("a new job is stored");
        let id = job.job_id.clone();
        let execution = execution_name(&id, how.attempt);
        let started = self.at_ago(how.started);
        job.status = JobStatus::Running;
        job.lease = Some(LEASE.into());
        job.attempt = how.attempt;
        job.dispatches = how.attempt;
        job.execution = Some(execution.clone());
        job.started_at = Some(started);
        job.updated_at = started;
        job.stalled_at = how.stalled.map(|s| self.at_ago(s));
        edit(&mut job);
        self.jobs.put_record(job);
        self.jobs.put_index_entry(&id, "running", &started.to_rfc3339());
        self.jobs.put_progress(
            &id,
            ProgressRecord {
                pct: 40.0,
                stage: "render".into(),
                stage_index: 1,
                stages_total: 2,
                items_done: 40,
                seq: 7,
                heartbeat_at: self.at_ago(how.heartbeat),
                updated_at: self.at_ago(how.heartbeat),
                lease: LEASE.into(),
                progress_changed_at: Some(self.at_ago(how.progress_changed)),
                attempt: Some(how.attempt),
                ..ProgressRecord::default()
            },
        );
        let input = self.deps.config.workers.execution_input(&id, &Default::default());
        self.executions.start(&execution, &input).await.expect("its execution runs");
        id
    }

    async fn running(&self, how: &Running) -> JobId {
        self.running_with(how, None, |_| {}).await
    }

    /// One run at the world's `now`.
    async fn run(&self) -> Report {
        self.run_at(self.now).await
    }

    /// One run at `now`.
    async fn run_at(&self, now: DateTime<Utc>) -> Report {
        handle(&self.deps, now).await.expect("a run reports, it does not fail")
    }

    async fn job(&self, id: &JobId) -> JobRecord {
        self.jobs.job(id).await.unwrap().expect("the job is there")
    }

    /// The message of the job's failure, which must have code `code`.
    async fn failure(&self, id: &JobId, code: ErrorCode) -> String {
        let job = self.job(id).await;
        assert_eq!(job.status, JobStatus::Failed, "{id} failed");
        let error = job.error.expect("a failure says why");
        assert_eq!(error.code, code.as_str(), "{id}: {}", error.message);
        error.message
    }

    /// The job's status-index entry: its bucket (without the shard) and sort key.
    fn entry(&self, id: &JobId) -> Option<(String, String)> {
        self.jobs.index_entry(id).map(|(bucket, at)| {
            let kind = bucket.rsplit_once('#').map(|(kind, _)| kind.to_owned());
            (kind.expect("a bucket names its shard"), at)
        })
    }

    /// The names of the executions started so far.
    fn started(&self) -> Vec<String> {
        self.executions.started().into_iter().map(|e| e.name).collect()
    }

    /// The jobs sent to the intake queue so far, with their delays.
    fn sent(&self) -> Vec<(JobId, u32)> {
        self.intake.sent().into_iter().map(|(m, delay, _)| (m.job_id, delay)).collect()
    }
}

/// How many buckets a run sweeps (each in [`STATUS_SHARDS`] shards).
const SWEPT: usize = Bucket::ALL.len();

/// The report of a run that found nothing to do but read `examined` entries.
fn quiet(examined: u64, active: [u64; 6]) -> Report {
    Report { examined, active: Bucket::ALL.into_iter().zip(active).collect(), ..Report::default() }
}

#[tokio::test]
async fn an_empty_table_is_counted_and_swept_without_a_trace() {
    let world = world();
    assert_eq!(world.run().await, quiet(0, [0; 6]));
    assert!(world.started().is_empty() && world.sent().is_empty());
}

#[tokio::test]
async fn a_run_counts_the_live_jobs_of_each_bucket() {
    let world = world();
    world.submitted(1).await;
    world.submitted(2).await;
    world.queued(1, 1).await;
    world.running(&Running::healthy()).await;
    let waits = world.submitted(3).await;
    world.jobs.put_index_entry(&waits, "waiting", &at(world.ago(3)));
    let report = world.run().await;
    let active: Vec<(&str, u64)> = report.active.iter().map(|(b, n)| (b.as_str(), *n)).collect();
    assert_eq!(
        active,
        [
            ("pending", 2),
            ("waiting", 1),
            ("queued", 1),
            ("running", 1),
            ("paused", 0),
            ("compensating", 0)
        ]
    );
    assert!(report.active_at_least.is_empty(), "small buckets are counted exactly: {report:?}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["active"]["waiting"], 1, "the report names each bucket: {json}");
    assert_eq!(json["active_at_least"], serde_json::json!([]), "{json}");
}

/// `n` jobs submitted a second ago (within the pending grace: no sweep acts on them), all in
/// shard `shard` of `pending`.
async fn pending_in_shard(world: &World, shard: u32, n: usize) {
    for _ in 0..n {
        world.submitted_with(1, |job| job.job_id = id_in_shard(shard)).await;
    }
}

#[tokio::test]
async fn a_bucket_larger_than_the_count_cap_is_reported_as_a_lower_bound_at_a_bounded_cost() {
    // Pages of 2, at most 3 per shard: a shard of 7 is counted as at least 6.
    let world =
        world_of(&[("LONGHAUL_REAPER_COUNT_PAGE", "2"), ("LONGHAUL_REAPER_COUNT_MAX_PAGES", "3")]);
    pending_in_shard(&world, 1, 7).await;
    let waits = world.submitted(1).await;
    world.jobs.put_index_entry(&waits, "waiting", &at(world.ago(1)));
    let report = world.run().await;
    assert_eq!(report.active.get(&Bucket::Pending), Some(&6), "the pages read: {report:?}");
    assert_eq!(report.active.get(&Bucket::Waiting), Some(&1), "{report:?}");
    assert_eq!(
        report.active_at_least.iter().copied().collect::<Vec<_>>(),
        [Bucket::Pending],
        "only the bucket cut short is a lower bound"
    );
    // 3 pages of shard 1 of `pending`; one page of every other shard of every bucket (it ends
    // there: an empty page, or the waiting job's).
    let cap = 3 + (SWEPT * STATUS_SHARDS as usize - 1);
    assert_eq!(world.jobs.count_pages_read(), cap, "never more than the cap of pages");

    // Ten times as many jobs cost not one request more.
    pending_in_shard(&world, 1, 63).await;
    let report = world.run().await;
    assert_eq!(report.active.get(&Bucket::Pending), Some(&6));
    assert!(report.active_at_least.contains(&Bucket::Pending));
    assert_eq!(world.jobs.count_pages_read(), 2 * cap, "the same cost at 70 jobs as at 7");
}

#[tokio::test]
async fn a_bucket_within_the_count_cap_is_counted_exactly() {
    let world =
        world_of(&[("LONGHAUL_REAPER_COUNT_PAGE", "2"), ("LONGHAUL_REAPER_COUNT_MAX_PAGES", "3")]);
    // 5 entries in a shard: pages of 2, 2 and 1, the last naming no next page.
    pending_in_shard(&world, 2, 5).await;
    pending_in_shard(&world, 3, 1).await;
    let report = world.run().await;
    assert_eq!(report.active.get(&Bucket::Pending), Some(&6), "{report:?}");
    assert!(report.active_at_least.is_empty(), "every shard was counted to its end: {report:?}");
    assert_eq!(world.jobs.count_pages_read(), 3 + (SWEPT * STATUS_SHARDS as usize - 1));
}

#[tokio::test]
async fn the_count_starts_no_page_once_the_sweeps_spent_the_budget() {
    let world = world_of(&[("LONGHAUL_REAPER_BUDGET_SECONDS", "0")]);
    pending_in_shard(&world, 0, 3).await;
    let report = world.run().await;
    assert_eq!(world.jobs.count_pages_read(), 0, "no count past the deadline");
    assert!(report.active.is_empty() && report.active_at_least.is_empty(), "{report:?}");
    assert_eq!(report.errors, 0, "a bucket left uncounted is no error: {report:?}");
}

#[tokio::test]
async fn a_count_cut_by_the_deadline_is_a_lower_bound() {
    // Each reading of the clock is a second later and the budget is 26 s: one reading sets the
    // deadline, the 24 sweeps (empty but for one shard of `pending`, whose jobs are within the
    // grace) read the clock once each before their first and only page, so the counts start
    // with one second left: the first count to read the clock reads one page, and every later
    // reading (every other shard's, and that count's before its second page) is too late.
    let world = world_with(
        &[
            ("LONGHAUL_REAPER_BUDGET_SECONDS", "26"),
            ("LONGHAUL_REAPER_COUNT_PAGE", "2"),
            ("LONGHAUL_REAPER_COUNT_MAX_PAGES", "3"),
        ],
        ManualClock::new().stepping(Duration::from_secs(1)),
    );
    pending_in_shard(&world, 0, 5).await;
    let report = world.run().await;
    assert_eq!(report.unfinished, 0, "the sweeps ended within the budget: {report:?}");
    assert_eq!(world.jobs.count_pages_read(), 1, "no page started past the deadline");
    assert_eq!(report.active.len(), 1, "only the bucket of which a page was read: {report:?}");
    for (bucket, jobs) in &report.active {
        assert!(report.active_at_least.contains(bucket), "{bucket}: {jobs} is a lower bound");
    }
}

#[tokio::test]
async fn every_job_is_judged_whatever_the_page_size() {
    let world = world_of(&[("LONGHAUL_REAPER_PAGE", "2")]);
    let mut zombies = Vec::new();
    for n in 0..9 {
        // Healthy jobs claimed before and between them: a page of them hides nothing.
        world.running(&Running { started: 900 - n, ..Running::healthy() }).await;
        zombies.push(world.running(&Running { started: 800 - n, ..Running::zombie() }).await);
    }
    let report = world.run().await;
    assert_eq!((report.examined, report.redispatched, report.unfinished), (18, 9, 0));
    for id in &zombies {
        assert_eq!(world.job(id).await.status, JobStatus::Queued, "{id} re-dispatched");
    }
}

#[tokio::test]
async fn a_run_out_of_budget_saves_where_it_stopped_and_the_next_goes_on_from_there() {
    // Each reading of the clock is a second later and a run's budget is 21 s: 20 readings
    // before its deadline, one before each page. Whatever order the 20 shards run in, the 19
    // without jobs take one each at most, so the one with jobs reads at least one page of one
    // entry, and never the 17 it takes to reach its end (16 entries, then an empty page).
    let mut world = world_with(
        &[("LONGHAUL_REAPER_PAGE", "1"), ("LONGHAUL_REAPER_BUDGET_SECONDS", "21")],
        ManualClock::new().stepping(Duration::from_secs(1)),
    );
    let shard = 0;
    let mut zombies = Vec::new();
    for n in 0..8 {
        // Healthy jobs claimed before each zombie: they stay in the bucket, so a run that
        // started over from the oldest entry would read them again.
        let healthy = Running { started: 900 - 2 * n, ..Running::healthy() };
        world.running_with(&healthy, Some(shard), |_| {}).await;
        let zombie = Running { started: 899 - 2 * n, ..Running::zombie() };
        zombies.push(world.running_with(&zombie, Some(shard), |_| {}).await);
    }
    let name = longhaul_aws::jobs::sweep_name("running", shard);

    let first = world.run().await;
    assert!(first.unfinished > 0 && first.examined < 16, "the budget ran out: {first:?}");
    assert!(first.redispatched < 8, "part of the sweep: {first:?}");
    let saved = world.jobs.sweep_cursors().await.unwrap();
    assert!(saved.contains_key(&name), "where {name} stopped is saved: {saved:?}");

    world.deps.config.budget = Duration::from_secs(1_000);
    let second = world.run().await;
    assert_eq!((second.unfinished, second.errors), (0, 0), "{second:?}");
    // Each entry read once over the two runs: the second went on where the first stopped.
    assert_eq!(first.examined + second.examined, 16, "{first:?} then {second:?}");
    assert_eq!(first.redispatched + second.redispatched, 8);
    for id in &zombies {
        let job = world.job(id).await;
        assert_eq!((job.status, job.dispatches), (JobStatus::Queued, 2), "{id} once");
    }
    assert!(
        !world.jobs.sweep_cursors().await.unwrap().contains_key(&name),
        "a sweep that reached its end starts from the oldest entry next time"
    );
    assert_eq!(world.run().await.examined, 8, "the healthy jobs, from the oldest");
}

#[tokio::test]
async fn a_budget_spent_before_the_first_page_skips_no_job() {
    let mut world = world_of(&[("LONGHAUL_REAPER_BUDGET_SECONDS", "0")]);
    let zombie = world.running(&Running::zombie()).await;
    let report = world.run().await;
    assert_eq!((report.examined, report.unfinished), (0, SWEPT as u32 * STATUS_SHARDS));
    assert!(report.active.is_empty(), "nor counted: {report:?}");
    assert_eq!(world.job(&zombie).await.status, JobStatus::Running, "not judged yet");
    world.deps.config.budget = Duration::from_secs(40);
    assert_eq!(world.run().await.redispatched, 1, "judged at the next run");
}

#[tokio::test]
async fn an_unavailable_table_is_reported_and_the_next_run_does_the_work() {
    let world = world();
    let zombie = world.running(&Running::zombie()).await;
    world.jobs.set_unavailable(true);
    let report = world.run().await;
    // Each bucket's count, the saved cursors, and each shard's first page.
    let failures = Bucket::ALL.len() as u32 + 1 + SWEPT as u32 * STATUS_SHARDS;
    assert_eq!(report, Report { errors: failures, ..Report::default() });
    world.jobs.set_unavailable(false);
    assert_eq!(world.job(&zombie).await.status, JobStatus::Running, "nothing half-done");
    let report = world.run().await;
    assert_eq!((report.redispatched, report.errors), (1, 0));
}

#[tokio::test]
async fn an_unreadable_entry_is_reported_and_holds_no_other_job_up() {
    let world = world();
    let zombie = world.running_with(&Running::zombie(), Some(1), |_| {}).await;
    world.jobs.put_stray_index_entry("SWEEP#stray", "running", 1, &at(world.ago(900)));
    let report = world.run().await;
    assert_eq!((report.examined, report.errors, report.redispatched), (2, 1, 1));
    assert_eq!(world.job(&zombie).await.status, JobStatus::Queued);
}
