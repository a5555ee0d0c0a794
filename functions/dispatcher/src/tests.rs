//! The handler over in-memory adapters: every path of a dispatch message, the limits that
//! make a job wait, the races a dispatch can lose, and the failures SQS retries.

use super::*;
use longhaul_domain::Owner;

use std::sync::Mutex;

use async_trait::async_trait;
use aws_lambda_events::sqs::SqsMessage;
use longhaul_aws::jobs::{FinalCheckpoint, JobView, Lease, ProgressRecord, ProgressRefused};
use longhaul_aws::ports::{JobCreation, Warm};
use longhaul_aws::workers::Workers;
use longhaul_domain::admission::{WaitReason, waiting_sort_key};
use longhaul_domain::policy::JobPolicy;
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryExecutions, MemoryInvocations, MemoryJobStore,
    MemorySlotPools, owner,
};
use serde_json::{Value, json};

const STAGE_ARN: &str = "arn:aws:lambda:us-east-1:123456789012:function:longhaul-StageFunction";

fn config(tenant_max_running: u32) -> Config {
    Config {
        table: "jobs".into(),
        state_machine_arn: "arn:aws:states:us-east-1:123456789012:stateMachine:job".into(),
        intake_queue_url: "https://sqs.memory.invalid/intake".into(),
        tenant_max_running,
        workers: Workers::parse(&format!(r#"{{"StageFunction": "{STAGE_ARN}"}}"#)).unwrap(),
    }
}

/// Something another message, the cancel function or the state machine does to the job
/// between two of the dispatcher's steps.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Race {
    /// Its owner cancels it.
    Cancel,
    /// A duplicate message queues it first.
    Queue,
    /// A duplicate message queues it and its execution claims it.
    Run,
}

/// Where a [`Race`] cuts in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Before {
    /// The `pending → queued` write.
    Queueing,
    /// The `waiting` mark.
    MarkingWaiting,
}

/// The memory job table, with a race that cuts in once before one of the dispatcher's writes.
#[derive(Debug)]
struct Racing {
    store: Arc<MemoryJobStore>,
    race: Mutex<Option<(Before, Race)>>,
    /// The jobs the handler read.
    reads: std::sync::atomic::AtomicUsize,
}

impl Racing {
    async fn cut_in(&self, at: Before, job_id: &JobId) {
        let race = {
            let mut race = self.race.lock().unwrap();
            match *race {
                Some((before, what)) if before == at => race.take().map(|_| what),
                _ => None,
            }
        };
        let Some(race) = race else { return };
        let steps: &[(JobStatus, JobStatus)] = match race {
            Race::Cancel => &[(JobStatus::Pending, JobStatus::Cancelled)],
            Race::Queue => &[(JobStatus::Pending, JobStatus::Queued)],
            Race::Run => {
                &[(JobStatus::Pending, JobStatus::Queued), (JobStatus::Queued, JobStatus::Running)]
            }
        };
        for (from, to) in steps {
            let mut request = TransitionRequest::new(job_id, &[*from], *to, "raced");
            if *to == JobStatus::Queued {
                request = request.set("execution", execution_name(job_id, 1)).set("dispatches", 1);
            }
            self.store.transition(request).await.unwrap();
        }
    }
}

#[async_trait]
impl Warm for Racing {}

#[async_trait]
impl JobReads for Racing {
    async fn job(&self, job_id: &JobId) -> Result<Option<JobRecord>, StoreError> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.job(job_id).await
    }
    async fn view(&self, job_id: &JobId) -> Result<Option<JobView>, StoreError> {
        self.store.view(job_id).await
    }
}

#[async_trait]
impl JobTransitions for Racing {
    async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        self.cut_in(Before::Queueing, &request.job_id).await;
        self.store.transition(request).await
    }
}

/// The attempts' writes go straight to the store (no race cuts into them).
#[async_trait]
impl JobAttempts for Racing {
    async fn claim_as(
        &self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<(Lease, JobView), StoreError> {
        self.store.claim_as(job_id, execution, claimant).await
    }
    async fn record_progress(
        &self,
        job_id: &JobId,
        progress: &ProgressRecord,
    ) -> Result<(), ProgressRefused> {
        self.store.record_progress(job_id, progress).await
    }
    async fn record_final_checkpoint(
        &self,
        job_id: &JobId,
        lease: &str,
        checkpoint: FinalCheckpoint<'_>,
    ) -> Result<(), ProgressRefused> {
        self.store.record_final_checkpoint(job_id, lease, checkpoint).await
    }
    async fn revoke_progress(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        self.store.revoke_progress(job_id, lease).await
    }
    async fn forget_resume(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        self.store.forget_resume(job_id, lease).await
    }
    async fn count_continuation(&self, job_id: &JobId, lease: &str) -> Result<u32, StoreError> {
        self.store.count_continuation(job_id, lease).await
    }
    async fn record_execution(
        &self,
        job_id: &JobId,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError> {
        self.store.record_execution(job_id, lease, name).await
    }
    async fn count_injected_failure(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<JobRecord, StoreError> {
        self.store.count_injected_failure(job_id, lease).await
    }
}

#[async_trait]
impl JobDispatchMarks for Racing {
    async fn mark_waiting(
        &self,
        job_id: &JobId,
        waiting: &longhaul_domain::admission::Waiting,
    ) -> Result<JobRecord, StoreError> {
        self.cut_in(Before::MarkingWaiting, job_id).await;
        self.store.mark_waiting(job_id, waiting).await
    }
}

struct World {
    jobs: Arc<MemoryJobStore>,
    racing: Arc<Racing>,
    invocations: Arc<MemoryInvocations>,
    executions: Arc<MemoryExecutions>,
    slots: Arc<MemorySlotPools>,
    queue: Arc<MemoryDispatchQueue>,
    /// The handler's clock: standing still at the time the world was made.
    clock: Arc<ManualClock>,
    deps: Deps,
}

/// A tenant may run `tenant_max_running` jobs at once (0: no limit).
fn world(tenant_max_running: u32) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let racing =
        Arc::new(Racing { store: jobs.clone(), race: Mutex::new(None), reads: Default::default() });
    let invocations = Arc::new(MemoryInvocations::new());
    let executions = Arc::new(MemoryExecutions::new());
    let queue = Arc::new(MemoryDispatchQueue::new());
    let slots = Arc::new(MemorySlotPools::new(queue.clone()));
    let clock = Arc::new(ManualClock::new());
    let deps = Deps {
        jobs: racing.clone(),
        invocations: invocations.clone(),
        executions: executions.clone(),
        slots: slots.clone(),
        intake: queue.clone(),
        clock: clock.clone(),
        config: config(tenant_max_running),
    };
    World { jobs, racing, invocations, executions, slots, queue, clock, deps }
}

fn message(id: &str, body: &str) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.body = Some(body.to_owned());
    message
}

fn dispatch_body(job_id: &JobId) -> String {
    serde_json::to_string(&DispatchMessage::new(job_id.clone())).unwrap()
}

fn tenant(name: &str) -> Pool {
    Pool::Tenant(owner(name))
}

fn position(job: &JobRecord) -> String {
    waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), &job.job_id)
}

impl World {
    /// A pending job of `owner`, as submit writes it, changed by `edit`.
    async fn job_with(&self, owner: &Owner, edit: impl FnOnce(&mut JobRecord)) -> JobRecord {
        let mut job = pending_job(owner, Timestamp::now());
        edit(&mut job);
        self.jobs.put_job(&job).await.unwrap();
        job
    }

    async fn job(&self, owner: &Owner) -> JobRecord {
        self.job_with(owner, |_| {}).await
    }

    /// A job of alice's queued for its next attempt (execution `attempt-2`), waiting out a
    /// backoff that ends `ahead` of the clock's now.
    fn backing_off(&self, ahead: chrono::Duration) -> JobRecord {
        let job = JobRecord {
            status: JobStatus::Queued,
            retry_at: Some(Timestamp::from(self.clock.now() + ahead)),
            execution: Some("attempt-2".into()),
            ..pending_job(&owner("alice"), Timestamp::now())
        };
        self.jobs.put_record(job.clone());
        job
    }

    /// Delivers one batch; answers the ids of the messages SQS is to retry.
    async fn deliver(&self, messages: Vec<SqsMessage>) -> Vec<String> {
        let mut event = SqsEvent::default();
        event.records = messages;
        let response = handle(&self.deps, event).await;
        response.batch_item_failures.into_iter().map(|f| f.item_identifier).collect()
    }

    /// Delivers each job's dispatch message (message ids `m-<job id>`) in one batch.
    async fn dispatch(&self, jobs: &[&JobRecord]) -> Vec<String> {
        let messages = jobs
            .iter()
            .map(|job| message(&format!("m-{}", job.job_id), &dispatch_body(&job.job_id)))
            .collect();
        self.deliver(messages).await
    }

    async fn record(&self, job: &JobRecord) -> JobRecord {
        self.jobs.job(&job.job_id).await.unwrap().unwrap()
    }

    /// The runs queued (their names, each once, in order): a job still `queued` may get
    /// another invocation of its run, never a second run.
    fn started(&self) -> Vec<String> {
        let mut runs: Vec<String> = Vec::new();
        for (_, payload) in self.invocations.queued() {
            let run: DirectRun = serde_json::from_value(payload).unwrap();
            if !runs.contains(&run.execution) {
                runs.push(run.execution);
            }
        }
        runs
    }

    /// The invocations queued, as runs.
    fn invocations(&self) -> Vec<DirectRun> {
        let queued = self.invocations.queued();
        queued.into_iter().map(|(_, payload)| serde_json::from_value(payload).unwrap()).collect()
    }

    async fn holders(&self, pool: &Pool) -> Vec<JobId> {
        self.slots.holders(pool).await.unwrap()
    }

    async fn waiting(&self, pool: &Pool, owner: &Owner) -> Vec<JobId> {
        let list = self.slots.first_waiting(pool, owner, 100).await.unwrap();
        list.into_iter().map(|e| e.job_id).collect()
    }

    /// The job ids of the dispatch messages sent (wake-ups and delays), in order.
    fn sent(&self) -> Vec<JobId> {
        self.queue.sent().into_iter().map(|(m, _, _)| m.job_id).collect()
    }

    /// Delivers `job`'s message as submit sends it, carrying the job as written.
    async fn dispatch_snapshot(&self, job: &JobRecord) -> Vec<String> {
        let body = serde_json::to_string(&DispatchMessage::snapshot(job)).unwrap();
        self.deliver(vec![message(&format!("m-{}", job.job_id), &body)]).await
    }

    /// How many times the handler read a job.
    fn reads(&self) -> usize {
        self.racing.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn race(&self, before: Before, race: Race) {
        *self.racing.race.lock().unwrap() = Some((before, race));
    }
}

#[tokio::test]
async fn a_queued_message_starts_one_execution_and_a_redelivery_no_second() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    assert!(w.dispatch(&[&job]).await.is_empty());
    let record = w.record(&job).await;
    assert_eq!(record.status, JobStatus::Queued);
    assert_eq!(record.execution.as_deref(), Some(execution_name(&id, 1).as_str()));
    assert_eq!(record.dispatches, 1);
    assert!(record.waiting.is_none());
    let queued = w.invocations.queued();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].0, STAGE_ARN, "in the job's worker function");
    let run = &w.invocations()[0];
    assert_eq!(queued[0].1["op"], "run");
    assert_eq!((&run.job_id, run.execution.as_str()), (&id, execution_name(&id, 1).as_str()));
    assert_eq!(run.worker_arn, STAGE_ARN);
    assert!(w.executions.started().is_empty(), "no execution for a direct run");
    assert_eq!(w.holders(&tenant("alice")).await, [id.as_str()], "it holds its tenant's slot");

    // Redelivered, alone and twice in one batch: the same run, never a second — invoked again
    // while the job is still queued, each invocation as its own claimant (only one claims it).
    assert!(w.dispatch(&[&job]).await.is_empty());
    let twice = vec![message("r1", &dispatch_body(&id)), message("r2", &dispatch_body(&id))];
    assert!(w.deliver(twice).await.is_empty());
    assert_eq!(w.started(), [execution_name(&id, 1)]);
    let mut claimants: Vec<String> = w.invocations().into_iter().map(|r| r.claimant).collect();
    assert_eq!(claimants.len(), 4);
    claimants.dedup();
    assert_eq!(claimants.len(), 4, "every invocation claims as itself");
    assert_eq!(w.record(&job).await.dispatches, 1);
    assert_eq!(w.holders(&tenant("alice")).await, [id], "one slot, however many messages");
}

#[tokio::test]
async fn two_copies_of_a_new_jobs_message_in_one_batch_start_one_execution() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    let copies = vec![message("c1", &dispatch_body(&id)), message("c2", &dispatch_body(&id))];
    assert!(w.deliver(copies).await.is_empty());
    assert_eq!(w.started(), [execution_name(&id, 1)]);
    assert_eq!(w.record(&job).await.status, JobStatus::Queued);
    assert_eq!(w.holders(&tenant("alice")).await, [id]);
}

#[tokio::test]
async fn a_tenant_at_its_running_limit_waits_without_an_execution_until_a_slot_frees() {
    let w = world(1);
    let first = w.job(&owner("alice")).await;
    let second = w.job(&owner("alice")).await;
    let other = w.job(&owner("bob")).await;
    assert!(w.dispatch(&[&first]).await.is_empty());
    assert!(w.dispatch(&[&second, &other]).await.is_empty());

    let waiting = w.record(&second).await;
    assert_eq!(waiting.status, JobStatus::Pending);
    let mark = waiting.waiting.expect("marked waiting");
    assert_eq!((mark.reason, mark.limit), (WaitReason::TenantLimit, 1));
    assert_eq!(mark.position, position(&second));
    assert_eq!(w.waiting(&tenant("alice"), &owner("alice")).await, [second.job_id.as_str()]);
    assert_eq!(w.holders(&tenant("alice")).await, [first.job_id.as_str()]);
    let started = w.started();
    assert!(!started.contains(&execution_name(&second.job_id, 1)), "{started:?}");
    assert_eq!(w.record(&other).await.status, JobStatus::Queued, "another tenant is not held up");

    // The first job ends: its slot goes back (the slots function) and the second is woken.
    let woken =
        w.slots.release(&tenant("alice"), 1, std::slice::from_ref(&first.job_id)).await.unwrap();
    assert_eq!(woken, 1);
    assert_eq!(w.sent(), [second.job_id.as_str()]);
    assert!(w.waiting(&tenant("alice"), &owner("alice")).await.is_empty());
    assert!(w.dispatch(&[&second]).await.is_empty());
    let record = w.record(&second).await;
    assert_eq!(record.status, JobStatus::Queued);
    assert!(record.waiting.is_none(), "the mark goes with the wait");
    assert!(w.started().contains(&execution_name(&second.job_id, 1)));
    assert_eq!(w.holders(&tenant("alice")).await, [second.job_id.as_str()]);
}

#[tokio::test]
async fn a_kind_at_its_limit_makes_a_job_wait_and_gives_its_tenant_slot_back() {
    let w = world(5);
    let limited = |job: &mut JobRecord| {
        job.policy = Some(JobPolicy { concurrency_limit: Some(1), ..JobPolicy::default() });
    };
    let first = w.job_with(&owner("alice"), limited).await;
    let second = w.job_with(&owner("bob"), limited).await;
    let kind = Pool::Kind(first.job_type.clone());
    assert!(w.dispatch(&[&first]).await.is_empty());
    assert!(w.dispatch(&[&second]).await.is_empty());

    let record = w.record(&second).await;
    assert_eq!(record.status, JobStatus::Pending);
    let mark = record.waiting.expect("marked waiting");
    assert_eq!((mark.reason, mark.limit), (WaitReason::KindLimit, 1));
    assert_eq!(w.waiting(&kind, &owner("bob")).await, [second.job_id.as_str()]);
    assert_eq!(w.slots.ring(&kind), ["bob"], "its tenant takes a place in the kind's ring");
    assert!(w.holders(&tenant("bob")).await.is_empty(), "the tenant slot it took went back");
    assert_eq!(w.holders(&kind).await, [first.job_id.as_str()]);
    assert_eq!(w.started(), [execution_name(&first.job_id, 1)]);

    // The kind's slot frees: bob's turn.
    assert_eq!(w.slots.release(&kind, 1, std::slice::from_ref(&first.job_id)).await.unwrap(), 1);
    assert!(w.dispatch(&[&second]).await.is_empty());
    assert_eq!(w.record(&second).await.status, JobStatus::Queued);
    assert_eq!(w.holders(&tenant("bob")).await, [second.job_id.as_str()]);
}

#[tokio::test]
async fn a_woken_job_its_tenant_keeps_waiting_passes_the_kinds_slot_on() {
    // Tenant limit 1, kind limit 1. Bob runs the kind's one job; alice's and carol's wait for
    // the kind; alice then takes her tenant's one slot with a job of no kind limit.
    let w = world(1);
    let limited = |job: &mut JobRecord| {
        job.policy = Some(JobPolicy { concurrency_limit: Some(1), ..JobPolicy::default() });
    };
    let running = w.job_with(&owner("bob"), limited).await;
    let alices = w.job_with(&owner("alice"), limited).await;
    let carols = w.job_with(&owner("carol"), limited).await;
    let kind = Pool::Kind(running.job_type.clone());
    for job in [&running, &alices, &carols] {
        assert!(w.dispatch(&[job]).await.is_empty());
    }
    assert_eq!(w.slots.ring(&kind), ["alice", "carol"]);
    let other = w.job(&owner("alice")).await;
    assert!(w.dispatch(&[&other]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [other.job_id.as_str()]);

    // Bob's job ends: alice's turn in the kind, but her tenant is at its limit.
    w.slots.release(&kind, 1, std::slice::from_ref(&running.job_id)).await.unwrap();
    assert_eq!(w.sent(), [alices.job_id.as_str()]);
    assert!(w.dispatch(&[&alices]).await.is_empty());
    assert_eq!(w.record(&alices).await.status, JobStatus::Pending, "waits for its tenant");
    assert_eq!(w.waiting(&tenant("alice"), &owner("alice")).await, [alices.job_id.as_str()]);
    // The kind's free slot is not left idle: carol's job is woken.
    assert_eq!(w.sent(), [alices.job_id.as_str(), carols.job_id.as_str()]);
    assert!(w.dispatch(&[&carols]).await.is_empty());
    assert_eq!(w.record(&carols).await.status, JobStatus::Queued);
    assert_eq!(w.holders(&kind).await, [carols.job_id.as_str()]);
}

#[tokio::test]
async fn a_job_that_moved_on_or_is_gone_is_not_started() {
    let w = world(50);
    let mut moved_on = Vec::new();
    for status in
        [JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled]
    {
        let job = pending_job(&owner("alice"), Timestamp::now());
        w.jobs.put_record(JobRecord { status, ..job.clone() });
        moved_on.push(job);
    }
    let gone = pending_job(&owner("alice"), Timestamp::now());
    let all: Vec<&JobRecord> = moved_on.iter().chain([&gone]).collect();
    assert!(w.dispatch(&all).await.is_empty(), "nothing to retry: the messages are done");
    assert!(w.started().is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty(), "no slot taken");
    for job in &moved_on {
        assert_eq!(w.record(job).await.transitions, job.transitions, "untouched");
    }
    assert!(w.jobs.job(&gone.job_id).await.unwrap().is_none());
}

#[tokio::test]
async fn a_job_cancelled_while_it_waits_for_a_slot_leaves_the_list() {
    let w = world(1);
    let first = w.job(&owner("alice")).await;
    let second = w.job(&owner("alice")).await;
    assert!(w.dispatch(&[&first]).await.is_empty());
    w.race(Before::MarkingWaiting, Race::Cancel);
    assert!(w.dispatch(&[&second]).await.is_empty());
    assert_eq!(w.record(&second).await.status, JobStatus::Cancelled);
    assert!(w.waiting(&tenant("alice"), &owner("alice")).await.is_empty(), "it waits for nothing");
    assert_eq!(w.started(), [execution_name(&first.job_id, 1)]);
    assert_eq!(w.holders(&tenant("alice")).await, [first.job_id.as_str()]);
}

#[tokio::test]
async fn a_resumed_job_takes_its_entry_left_from_a_pause_while_it_waited_out_of_the_list() {
    let w = world(1);
    // Paused while it waited, resumed before the slots function saw the pause: its resume
    // removed its `waiting` mark, and its entry was left in the list.
    let job = w.job_with(&owner("alice"), |job| job.resumes = 1).await;
    w.slots
        .enter_waiting(&tenant("alice"), &position(&job), &job.job_id, &owner("alice"))
        .await
        .unwrap();
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job.job_id.as_str()]);
    assert!(
        w.waiting(&tenant("alice"), &owner("alice")).await.is_empty(),
        "no entry left to wake it again, instead of whoever waits next"
    );
}

#[tokio::test]
async fn a_job_cancelled_while_it_took_its_slots_gives_them_back_to_who_waits() {
    let w = world(1);
    let job = w.job(&owner("alice")).await;
    let waiter = w.job(&owner("alice")).await;
    w.slots
        .enter_waiting(&tenant("alice"), &position(&waiter), &waiter.job_id, &owner("alice"))
        .await
        .unwrap();
    w.race(Before::Queueing, Race::Cancel);
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.record(&job).await.status, JobStatus::Cancelled);
    assert!(w.started().is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty(), "its slot went back");
    assert_eq!(w.sent(), [waiter.job_id.as_str()], "and the waiting job was woken");
}

#[tokio::test]
async fn a_message_that_lost_the_race_to_queue_starts_the_same_execution() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    w.race(Before::Queueing, Race::Queue);
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.started(), [execution_name(&id, 1)], "started under the winner's name");
    assert_eq!(w.holders(&tenant("alice")).await, [id.as_str()], "the slot stays the job's");
    // The winner's own start then finds it there.
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.started(), [execution_name(&id, 1)]);
}

#[tokio::test]
async fn a_duplicate_that_finds_the_job_running_keeps_its_slots_and_starts_nothing() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    w.race(Before::Queueing, Race::Run);
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert!(w.started().is_empty(), "the execution that runs it is the winner's");
    assert_eq!(w.holders(&tenant("alice")).await, [id], "a running job's slot is not freed");
    assert!(w.sent().is_empty());
}

#[tokio::test]
async fn a_message_before_its_jobs_start_is_sent_again_with_the_remaining_delay() {
    let w = world(50);
    let start = Timestamp::from(w.clock.now() + chrono::Duration::seconds(120));
    let delayed = w.job_with(&owner("alice"), |job| job.not_before = Some(start)).await;
    assert!(w.dispatch(&[&delayed]).await.is_empty());
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].0.job_id.as_str(), sent[0].2.as_str()), (delayed.job_id.as_str(), "alice"));
    assert!((110..=120).contains(&sent[0].1), "delay {}", sent[0].1);
    assert_eq!(w.record(&delayed).await.status, JobStatus::Pending);
    assert!(w.started().is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty(), "no slot held while it waits");

    // A queued job waiting out its backoff likewise.
    let backing_off = w.backing_off(chrono::Duration::seconds(60));
    assert!(w.dispatch(&[&backing_off]).await.is_empty());
    let sent = w.queue.sent();
    assert_eq!(sent.len(), 2);
    assert!((50..=60).contains(&sent[1].1), "delay {}", sent[1].1);
    assert!(w.started().is_empty());
}

#[tokio::test]
async fn a_delayed_or_backing_off_job_starts_once_the_clock_passes_its_start() {
    let w = world(50);
    // A start an hour ahead of the clock, which the machine's own clock does not reach while
    // the test runs: only the handler's clock, moved by the test, lets the job start.
    let start = Timestamp::from(w.clock.now() + chrono::Duration::hours(1));
    let delayed = w.job_with(&owner("alice"), |job| job.not_before = Some(start)).await;
    w.clock.set(start.as_datetime() - chrono::Duration::seconds(30));
    assert!(w.dispatch(&[&delayed]).await.is_empty());
    assert_eq!(w.queue.sent()[0].1, 30, "sent again with the delay left by the clock");
    assert_eq!(w.record(&delayed).await.status, JobStatus::Pending);
    assert!(w.started().is_empty());
    w.clock.set(start.as_datetime());
    assert!(w.dispatch(&[&delayed]).await.is_empty());
    assert_eq!(w.record(&delayed).await.status, JobStatus::Queued);
    assert_eq!(w.started(), [execution_name(&delayed.job_id, 1)]);
    assert_eq!(w.queue.sent().len(), 1, "no second delay");

    // A queued job waiting out its backoff starts its next attempt at the clock's `retry_at`.
    let backing_off = w.backing_off(chrono::Duration::hours(1));
    assert!(w.dispatch(&[&backing_off]).await.is_empty());
    assert_eq!(w.queue.sent()[1].1, 900, "SQS's longest delay, then again");
    assert_eq!(w.started().len(), 1);
    w.clock.advance(std::time::Duration::from_secs(3600));
    assert!(w.dispatch(&[&backing_off]).await.is_empty());
    assert_eq!(w.started()[1], "attempt-2");
}

#[tokio::test]
async fn a_queued_job_is_started_again_under_its_own_execution_name() {
    let w = world(50);
    let job = pending_job(&owner("alice"), Timestamp::now());
    let past = Timestamp::from(w.clock.now() - chrono::Duration::seconds(1));
    w.jobs.put_record(JobRecord {
        status: JobStatus::Queued,
        execution: Some("job-2".into()),
        retry_at: Some(past),
        ..job.clone()
    });
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.started(), ["job-2"]);
}

#[tokio::test]
async fn a_malformed_message_is_retried_alone() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let batch = vec![message("poison", "not json"), message("good", &dispatch_body(&job.job_id))];
    assert_eq!(w.deliver(batch).await, ["poison"]);
    assert_eq!(w.record(&job).await.status, JobStatus::Queued);
    assert_eq!(w.started().len(), 1);
}

#[tokio::test]
async fn a_failing_job_table_fails_every_message_and_loses_none() {
    let w = world(50);
    let (a, b) = (w.job(&owner("alice")).await, w.job(&owner("bob")).await);
    w.jobs.set_unavailable(true);
    let mut failed = w.dispatch(&[&a, &b]).await;
    failed.sort();
    let mut expected = [format!("m-{}", a.job_id), format!("m-{}", b.job_id)];
    expected.sort();
    assert_eq!(failed, expected, "both retried");
    assert!(w.started().is_empty());
    w.jobs.set_unavailable(false);
    assert!(w.dispatch(&[&a, &b]).await.is_empty(), "the retry dispatches them");
    assert_eq!(w.started().len(), 2);
}

#[tokio::test]
async fn a_failing_slot_store_fails_the_message_and_starts_nothing() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    w.slots.set_unavailable(true);
    assert_eq!(w.dispatch(&[&job]).await, [format!("m-{}", job.job_id)]);
    assert_eq!(w.record(&job).await.status, JobStatus::Pending, "not queued without its slot");
    assert!(w.started().is_empty());
    w.slots.set_unavailable(false);
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.started().len(), 1);
}

#[tokio::test]
async fn a_failed_start_is_retried_and_starts_the_job_once() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    w.invocations.set_unavailable(true);
    assert_eq!(w.dispatch(&[&job]).await, [format!("m-{}", job.job_id)]);
    // Queued, holding its slot: the retried message starts it (and the reaper would too).
    assert_eq!(w.record(&job).await.status, JobStatus::Queued);
    assert_eq!(w.holders(&tenant("alice")).await, [job.job_id.as_str()]);
    w.invocations.set_unavailable(false);
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert!(w.dispatch(&[&job]).await.is_empty());
    assert_eq!(w.started(), [execution_name(&job.job_id, 1)]);
}

#[tokio::test]
async fn a_delay_the_queue_refuses_is_retried() {
    let w = world(50);
    let start = Timestamp::from(w.clock.now() + chrono::Duration::seconds(120));
    let delayed = w.job_with(&owner("alice"), |job| job.not_before = Some(start)).await;
    w.queue.set_unavailable(true);
    assert_eq!(w.dispatch(&[&delayed]).await, [format!("m-{}", delayed.job_id)]);
    w.queue.set_unavailable(false);
    assert!(w.dispatch(&[&delayed]).await.is_empty());
    assert_eq!(w.sent(), [delayed.job_id.as_str()]);
}

/// Lambda's record of a direct run it gave up on (what the worker functions' on-failure
/// destination sends to the intake queue).
fn given_up_body(run: &DirectRun) -> String {
    json!({
        "version": "1.0",
        "requestContext": {"condition": "RetriesExhausted", "approximateInvokeCount": 3,
            "functionArn": format!("{STAGE_ARN}:$LATEST")},
        "requestPayload": run.payload(),
        "responsePayload": {"errorType": "Runtime.ExitError", "errorMessage": "exited"}
    })
    .to_string()
}

#[tokio::test]
async fn a_run_lambda_gave_up_on_is_taken_over_by_an_execution_under_its_lease() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    assert!(w.dispatch(&[&job]).await.is_empty());
    let run = w.invocations().remove(0);
    let (lease, _) = w.jobs.claim_as(&id, &run.execution, Some(&run.claimant)).await.unwrap();

    assert!(w.deliver(vec![message("g", &given_up_body(&run))]).await.is_empty());
    let started = w.executions.started();
    assert_eq!(started.len(), 1, "one execution takes the job over");
    let name = started[0].name.clone();
    assert!(runs::is_hand_over_of(&name, &run), "a hand-over's new execution: {name}");
    assert_eq!(started[0].input, json!({"job_id": id, "worker_arn": STAGE_ARN}));
    let record = w.record(&job).await;
    assert_eq!(record.claimant, None, "the run's hold on the job ended");
    assert_eq!(record.execution.as_deref(), Some(name.as_str()));
    assert_eq!(record.lease.as_deref(), Some(lease.token.as_str()), "the lease goes on");
    let retry = w.jobs.claim_as(&id, &run.execution, Some(&run.claimant)).await;
    assert!(retry.is_err(), "a late retry of the run's invocation does not get the job");
    let (taken, _) = w.jobs.claim(&id, &name).await.unwrap();
    assert_eq!(taken, lease, "the execution's claim gets the run's lease");

    // The same record again (SQS redelivers): the execution is started again, idempotently.
    assert!(w.deliver(vec![message("g2", &given_up_body(&run))]).await.is_empty());
    assert_eq!(w.executions.start_calls(), [name.clone(), name]);
    assert_eq!(w.executions.started().len(), 1);
}

#[tokio::test]
async fn a_run_no_invocation_claimed_is_claimed_by_an_execution_and_a_moved_on_one_is_left() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    assert!(w.dispatch(&[&job]).await.is_empty());
    let run = w.invocations().remove(0);
    // The event aged out of Lambda's queue: the job is still queued for the run.
    assert!(w.deliver(vec![message("g", &given_up_body(&run))]).await.is_empty());
    assert_eq!(w.executions.started().len(), 1);
    assert_eq!(w.executions.started()[0].name, run.execution);
    assert_eq!(w.record(&job).await.status, JobStatus::Queued, "the execution claims it");

    // Another invocation of the run claimed the job: the given-up one is not its holder.
    let other = w.job(&owner("bob")).await;
    assert!(w.dispatch(&[&other]).await.is_empty());
    let first = w.invocations().pop().unwrap();
    let second = DirectRun::new(&first.job_id, &first.execution, &first.worker_arn);
    w.jobs.claim_as(&other.job_id, &second.execution, Some(&second.claimant)).await.unwrap();
    assert!(w.deliver(vec![message("g3", &given_up_body(&first))]).await.is_empty());
    assert_eq!(w.executions.started().len(), 1, "nothing taken over");
    assert_eq!(w.record(&other).await.claimant.as_deref(), Some(second.claimant.as_str()));
}

#[tokio::test]
async fn a_take_over_the_state_machine_refuses_is_retried() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    assert!(w.dispatch(&[&job]).await.is_empty());
    let run = w.invocations().remove(0);
    w.jobs.claim_as(&job.job_id, &run.execution, Some(&run.claimant)).await.unwrap();
    w.executions.set_unavailable(true);
    assert_eq!(w.deliver(vec![message("g", &given_up_body(&run))]).await, ["g"]);
    w.executions.set_unavailable(false);
    // The hold ended before the start failed: the retried record starts the execution.
    assert!(w.executions.start_calls().is_empty());
    assert!(w.deliver(vec![message("g", &given_up_body(&run))]).await.is_empty());
    assert_eq!(w.executions.started().len(), 1);
    let name = &w.executions.started()[0].name;
    assert_eq!(w.record(&job).await.execution.as_ref(), Some(name), "the one the job names");
}

/// A job of alice's that failed with stages to undo, as the stage leaves it: `compensating`.
async fn compensating(w: &World) -> JobRecord {
    let job = w.job_with(&owner("alice"), |job| job.undo_stages = vec!["process".into()]).await;
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Failed,
        reason: "boom".into(),
        error: None,
    };
    let request = longhaul_aws::jobs::compensation_request(
        &job.job_id,
        &[JobStatus::Pending],
        ending,
        Timestamp::now(),
    );
    w.jobs.transition(request).await.unwrap()
}

#[tokio::test]
async fn a_compensating_job_has_its_worker_run_its_undos_without_a_slot_or_an_execution() {
    let w = world(50);
    let job = compensating(&w).await;
    assert!(w.dispatch(&[&job]).await.is_empty());
    let queued = w.invocations.queued();
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_eq!(queued[0].0, STAGE_ARN, "in the job's worker function");
    assert_eq!(queued[0].1, json!({"op": "compensate", "job_id": job.job_id}));
    assert!(w.executions.started().is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty(), "no slot taken");
    assert_eq!(w.record(&job).await.status, JobStatus::Compensating, "the worker ends it");
}

#[tokio::test]
async fn a_compensation_lambda_gave_up_on_is_acknowledged_for_the_reaper_to_send_again() {
    let w = world(50);
    let job = compensating(&w).await;
    let given_up = json!({
        "version": "1.0",
        "requestContext": {"condition": "RetriesExhausted", "approximateInvokeCount": 3,
            "functionArn": format!("{STAGE_ARN}:$LATEST")},
        "requestPayload": runs::compensation_payload(&job.job_id),
        "responsePayload": {"errorType": "Runtime.ExitError", "errorMessage": "exited"}
    });
    let failed = w.deliver(vec![message("g", &given_up.to_string())]).await;
    assert!(failed.is_empty(), "not a malformed message: {failed:?}");
    assert!(w.invocations.queued().is_empty(), "no loop of invocations");
    assert_eq!(w.record(&job).await.status, JobStatus::Compensating);
}

#[tokio::test]
async fn a_message_carrying_the_job_dispatches_it_without_reading_it() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    let body: Value = serde_json::to_value(DispatchMessage::snapshot(&job)).unwrap();
    assert_eq!(body["job"]["params"], Value::Null, "no params in the message");
    assert!(w.dispatch_snapshot(&job).await.is_empty());
    assert_eq!(w.reads(), 0);
    let record = w.record(&job).await;
    assert_eq!((record.status, record.dispatches), (JobStatus::Queued, 1));
    assert_eq!(w.started(), [execution_name(&id, 1)]);
    assert_eq!(w.holders(&tenant("alice")).await, std::slice::from_ref(&id));
    // Redelivered, the snapshot is stale (the job is queued): the run is invoked again under
    // the name it has, never a second run, and the slot stays the job's.
    assert!(w.dispatch_snapshot(&job).await.is_empty());
    assert_eq!(w.started(), [execution_name(&id, 1)]);
    assert_eq!(w.holders(&tenant("alice")).await, [id]);
}

#[tokio::test]
async fn a_job_changed_since_its_message_was_sent_is_dispatched_as_it_is_now() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let id = job.job_id.clone();
    // Paused and resumed while its message waited: one resume, a later write.
    let later = Timestamp::from(job.updated_at.as_datetime() + chrono::Duration::seconds(1));
    w.jobs.put_record(JobRecord { resumes: 1, updated_at: later, ..job.clone() });
    assert!(w.dispatch_snapshot(&job).await.is_empty());
    let record = w.record(&job).await;
    assert_eq!((record.status, record.dispatches), (JobStatus::Queued, 1));
    assert_eq!(w.started(), [execution_name(&id, 1)]);
    let pool = tenant("alice");
    assert_eq!(w.holders(&pool).await, std::slice::from_ref(&id));
    // The slot is the resumed run's (1), not the snapshot's (0): a late give-back of run 0
    // frees nothing.
    assert_eq!(w.slots.give_back_run(&pool, &id, 0).await.unwrap(), None);
}

#[tokio::test]
async fn a_job_cancelled_since_its_message_was_sent_starts_nothing_and_keeps_no_slot() {
    let w = world(50);
    let job = w.job(&owner("alice")).await;
    let request =
        TransitionRequest::new(&job.job_id, &[JobStatus::Pending], JobStatus::Cancelled, "test");
    w.jobs.transition(request).await.unwrap();
    assert!(w.dispatch_snapshot(&job).await.is_empty());
    assert_eq!(w.record(&job).await.status, JobStatus::Cancelled);
    assert!(w.started().is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty());
}
