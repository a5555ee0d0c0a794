//! Reading the stream's records, and the handler over in-memory slot pools: what an end gives
//! back, whom it wakes, and what a failure leaves for the stream's retry.

use super::*;
use longhaul_domain::Owner;

use longhaul_aws::slots::Pool;
use longhaul_memory::{
    MemoryDispatchQueue, MemoryJobStore, MemoryScheduleFirings, MemorySlotPools, job_named, owner,
};
use serde_json::{Value, json};

/// The notifier's sample (a job's move from `running` to `succeeded`), changed by `edit`.
fn record(edit: impl FnOnce(&mut Value)) -> EventRecord {
    let text = include_str!("../../../events/notifier.json");
    let mut event: Value = serde_json::from_str(text).unwrap();
    let mut record = event["Records"][0].take();
    record["dynamodb"]["NewImage"]["created_at"] = json!({"S": "2026-11-24T09:00:00.000Z"});
    edit(&mut record);
    serde_json::from_value(record).unwrap()
}

#[test]
fn every_end_frees_slots_with_or_without_a_callback() {
    let job = ended(&record(|_| {})).unwrap().unwrap();
    assert_eq!(job.job_id, "01a201ea-fb15-7355-87ef-3777d21385c6");
    assert_eq!((job.owner.as_str(), job.priority), ("alice", Priority::Normal));
    let no_callback = record(|r| {
        r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("callback_url");
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("cancelled");
        r["dynamodb"]["NewImage"]["priority"] = json!({"S": "high"});
        r["dynamodb"]["NewImage"]["policy"] = json!({"M": {"concurrency_limit": {"N": "3"}}});
    });
    let job = ended(&no_callback).unwrap().unwrap();
    assert_eq!(
        (job.status, job.priority, job.policy.and_then(|p| p.concurrency_limit)),
        (JobStatus::Cancelled, Priority::High, Some(3))
    );
}

#[test]
fn other_changes_free_nothing() {
    let still = record(|r| r["dynamodb"]["NewImage"]["status"]["S"] = json!("queued"));
    assert_eq!(ended(&still).unwrap(), None);
    let expired = record(|r| {
        r["dynamodb"]["OldImage"]["status"]["S"] = json!("succeeded");
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("expired");
    });
    assert_eq!(ended(&expired).unwrap(), None);
    let progress = record(|r| r["dynamodb"]["Keys"]["sk"]["S"] = json!("PROGRESS"));
    assert_eq!(ended(&progress).unwrap(), None);
    let no_old = record(|r| drop(r["dynamodb"].as_object_mut().unwrap().remove("OldImage")));
    assert!(matches!(ended(&no_old), Err(RecordError::NoOldImage)));
}

/// Kind `demo`'s limit in these tests (stored on its jobs' policy).
const KIND_LIMIT: u32 = 1;

struct World {
    slots: Arc<MemorySlotPools>,
    queue: Arc<MemoryDispatchQueue>,
    firings: Arc<MemoryScheduleFirings>,
    jobs: Arc<MemoryJobStore>,
    deps: Deps,
}

/// Tenants may run `tenant_max_running` jobs at once.
fn world(tenant_max_running: u32) -> World {
    let queue = Arc::new(MemoryDispatchQueue::new());
    let slots = Arc::new(MemorySlotPools::new(queue.clone()));
    let config = Config {
        table: "jobs".into(),
        intake_queue_url: "https://sqs.memory.invalid/intake".into(),
        tenant_max_running,
        schedule_queue_url: "https://sqs.memory.invalid/schedules".into(),
    };
    let firings = Arc::new(MemoryScheduleFirings::new());
    let jobs = Arc::new(MemoryJobStore::new());
    World {
        slots: slots.clone(),
        queue,
        firings: firings.clone(),
        jobs: jobs.clone(),
        deps: Deps { slots, firings, jobs, config },
    }
}

fn tenant(name: &str) -> Pool {
    Pool::Tenant(owner(name))
}

fn kind() -> Pool {
    Pool::Kind("demo".to_owned())
}

/// Jobs submitted at the same time wait in the order of their ids.
fn position(job_id: &JobId) -> String {
    waiting_sort_key(Priority::Normal, "2026-11-24T09:00:00.000Z", job_id)
}

/// The stream record of `job_id` of `owner` ending `succeeded`, at `sequence`, with the
/// kind's limit on its policy; changed by `edit`.
fn end_of(
    job_id: &JobId,
    owner: &Owner,
    sequence: &str,
    edit: impl FnOnce(&mut Value),
) -> EventRecord {
    record(|r| {
        r["dynamodb"]["Keys"]["pk"] = json!({"S": format!("JOB#{job_id}")});
        for image in ["NewImage", "OldImage"] {
            r["dynamodb"][image]["job_id"] = json!({"S": job_id});
            r["dynamodb"][image]["owner"] = json!({"S": owner});
        }
        r["dynamodb"]["NewImage"]["policy"] =
            json!({"M": {"concurrency_limit": {"N": KIND_LIMIT.to_string()}}});
        r["dynamodb"]["SequenceNumber"] = json!(sequence);
        edit(r);
    })
}

impl World {
    /// Sends the batch; answers the sequence numbers reported as failures.
    async fn stream(&self, records: Vec<EventRecord>) -> Vec<String> {
        let mut event = Event::default();
        event.records = records;
        let response = handle(&self.deps, event).await;
        response.batch_item_failures.into_iter().filter_map(|f| f.item_identifier).collect()
    }

    async fn holds(&self, pool: &Pool, job_id: &JobId, limit: u32) {
        self.holds_in_run(pool, job_id, limit, 0).await;
    }

    /// `job_id`'s run `run` (after `run` resumes) holds a slot of `pool`.
    async fn holds_in_run(&self, pool: &Pool, job_id: &JobId, limit: u32, run: u32) {
        assert!(self.slots.acquire(pool, limit, job_id, run).await.unwrap());
    }

    async fn waits(&self, pool: &Pool, job_id: &JobId, owner: &Owner) {
        self.slots.enter_waiting(pool, &position(job_id), job_id, owner).await.unwrap();
    }

    async fn holders(&self, pool: &Pool) -> Vec<JobId> {
        self.slots.holders(pool).await.unwrap()
    }

    async fn waiting(&self, pool: &Pool, owner: &Owner) -> Vec<JobId> {
        let list = self.slots.first_waiting(pool, owner, 100).await.unwrap();
        list.into_iter().map(|e| e.job_id).collect()
    }

    /// The jobs woken, in order, with their message's owner.
    fn woken(&self) -> Vec<(JobId, Owner)> {
        self.queue.sent().into_iter().map(|(m, _, owner)| (m.job_id, owner)).collect()
    }
}

#[tokio::test]
async fn an_end_gives_back_the_tenant_and_kind_slots_and_wakes_who_waits_for_each() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("done"), 1).await;
    w.holds(&kind(), &job_named("done"), KIND_LIMIT).await;
    w.waits(&tenant("alice"), &job_named("alices-next"), &owner("alice")).await;
    w.waits(&kind(), &job_named("bobs-next"), &owner("bob")).await;
    assert!(
        w.stream(vec![end_of(&job_named("done"), &owner("alice"), "1", |_| {})]).await.is_empty()
    );
    assert!(w.holders(&tenant("alice")).await.is_empty());
    assert!(w.holders(&kind()).await.is_empty());
    assert_eq!(
        w.woken(),
        [(job_named("alices-next"), owner("alice")), (job_named("bobs-next"), owner("bob"))],
        "each pool wakes its next job, in its owner's message group"
    );
    assert!(w.waiting(&tenant("alice"), &owner("alice")).await.is_empty());
    assert!(w.waiting(&kind(), &owner("bob")).await.is_empty());
}

#[tokio::test]
async fn a_job_without_a_kind_limit_frees_only_its_tenant_slot() {
    let w = world(2);
    w.holds(&tenant("alice"), &job_named("done"), 2).await;
    w.holds(&kind(), &job_named("other"), KIND_LIMIT).await;
    let end = end_of(&job_named("done"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"].as_object_mut().unwrap().remove("policy");
    });
    assert!(w.stream(vec![end]).await.is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty());
    assert_eq!(w.holders(&kind()).await, [job_named("other")], "the kind pool is not its");
}

#[tokio::test]
async fn a_job_cancelled_while_it_waited_leaves_its_lists_and_frees_no_one_elses_slot() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("running"), 1).await;
    w.waits(&tenant("alice"), &job_named("cancelled"), &owner("alice")).await;
    w.waits(&tenant("alice"), &job_named("next"), &owner("alice")).await;
    let end = end_of(&job_named("cancelled"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("cancelled");
        r["dynamodb"]["NewImage"]["waiting"] = json!({"M": {"reason": {"S": "tenant_limit"}}});
    });
    assert!(w.stream(vec![end]).await.is_empty());
    assert_eq!(
        w.waiting(&tenant("alice"), &owner("alice")).await,
        [job_named("next")],
        "out of the list"
    );
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("running")]);
    assert!(w.woken().is_empty(), "no slot freed: no one woken");
}

impl World {
    /// A job record named `name`, of `owner`, `paused` after `resumes` resumes (as the slots
    /// function reads it again).
    fn paused_job(&self, name: &str, owner_name: &str, resumes: u32) {
        let mut job = longhaul_memory::contract::pending_job(
            &owner(owner_name),
            longhaul_domain::Timestamp::now(),
        );
        job.job_id = job_named(name);
        job.status = JobStatus::Paused;
        job.resumes = resumes;
        self.jobs.put_record(job);
    }
}

#[tokio::test]
async fn a_pause_whose_job_was_resumed_since_gives_back_nothing() {
    let w = world(1);
    // Paused, resumed and dispatched again (its new run holds the slot) before the pause's
    // record came: the record of that pause frees nothing.
    w.holds(&tenant("alice"), &job_named("quick"), 1).await;
    w.paused_job("quick", "alice", 0);
    let mut resumed = w.jobs.job(&job_named("quick")).await.unwrap().unwrap();
    resumed.status = JobStatus::Running;
    resumed.resumes = 1;
    w.jobs.put_record(resumed);
    w.holds_in_run(&tenant("alice"), &job_named("quick"), 1, 1).await;
    let paused = end_of(&job_named("quick"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
    });
    assert!(w.stream(vec![paused]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("quick")], "its run's slot stays");
    // Paused again since (its second pause): the first pause's late record frees nothing
    // either; the second's does.
    w.paused_job("quick", "alice", 1);
    let first = end_of(&job_named("quick"), &owner("alice"), "2", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
    });
    assert!(w.stream(vec![first]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("quick")]);
    let second = end_of(&job_named("quick"), &owner("alice"), "3", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
        r["dynamodb"]["NewImage"]["resumes"] = json!({"N": "1"});
    });
    assert!(w.stream(vec![second]).await.is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty());
}

#[tokio::test]
async fn a_pause_read_as_current_frees_no_slot_its_next_run_took_meanwhile() {
    let w = world(1);
    // The record read again still says paused (pause 0), but between that read and the
    // give-back the job was resumed and its next run took the slot (run 1): the give-back is
    // the paused run's only, so the running job keeps its slot and the pool stays full.
    w.paused_job("racing", "alice", 0);
    w.holds_in_run(&tenant("alice"), &job_named("racing"), 1, 1).await;
    w.holds_in_run(&kind(), &job_named("racing"), KIND_LIMIT, 1).await;
    w.waits(&tenant("alice"), &job_named("next"), &owner("alice")).await;
    let paused = end_of(&job_named("racing"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
    });
    assert!(w.stream(vec![paused]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("racing")]);
    assert_eq!(w.holders(&kind()).await, [job_named("racing")]);
    assert!(w.woken().is_empty(), "no slot freed, no one woken");
}

#[tokio::test]
async fn a_paused_job_gives_back_its_slots_and_leaves_its_lists_but_ends_nothing() {
    let w = world(1);
    w.paused_job("paused", "alice", 0);
    w.paused_job("waiting", "alice", 0);
    w.holds(&tenant("alice"), &job_named("paused"), 1).await;
    w.waits(&tenant("alice"), &job_named("next"), &owner("alice")).await;
    let paused = end_of(&job_named("paused"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
        r["dynamodb"]["NewImage"]["scheduled"] = json!({"M": {
            "schedule_id": {"S": "01a21879-8a98-706a-b1c3-6532b71d601b"},
            "scheduled_at": {"S": "2026-11-24T09:00:00.000Z"},
        }});
    });
    assert!(w.stream(vec![paused]).await.is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty(), "its slot is given back");
    assert_eq!(w.woken(), [(job_named("next"), owner("alice"))], "and the next job woken");
    assert!(w.firings.take().is_empty(), "a pause is no end: its schedule hears nothing");

    // Paused while it waited: out of the lists. A later write to the paused job frees nothing.
    w.waits(&tenant("alice"), &job_named("waiting"), &owner("alice")).await;
    let waiting = end_of(&job_named("waiting"), &owner("alice"), "2", |r| {
        r["dynamodb"]["OldImage"]["status"]["S"] = json!("pending");
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
        r["dynamodb"]["NewImage"]["waiting"] = json!({"M": {"reason": {"S": "tenant_limit"}}});
    });
    let again = record(|r| {
        r["dynamodb"]["OldImage"]["status"]["S"] = json!("paused");
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("paused");
    });
    assert_eq!(ended(&again).unwrap(), None);
    assert!(w.stream(vec![waiting, again]).await.is_empty());
    assert!(w.waiting(&tenant("alice"), &owner("alice")).await.is_empty());
}

#[tokio::test]
async fn changes_that_are_not_ends_free_nothing() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("busy"), 1).await;
    w.waits(&tenant("alice"), &job_named("next"), &owner("alice")).await;
    let queued = end_of(&job_named("busy"), &owner("alice"), "1", |r| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("queued");
    });
    let progress = end_of(&job_named("busy"), &owner("alice"), "2", |r| {
        r["dynamodb"]["Keys"]["sk"]["S"] = json!("PROGRESS");
    });
    assert!(w.stream(vec![queued, progress]).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("busy")]);
    assert!(w.woken().is_empty());
}

#[tokio::test]
async fn an_unreadable_record_is_skipped_and_the_batch_goes_on() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("done"), 1).await;
    let unreadable = end_of(&job_named("lost"), &owner("alice"), "1", |r| {
        r["dynamodb"].as_object_mut().unwrap().remove("OldImage");
    });
    let end = end_of(&job_named("done"), &owner("alice"), "2", |_| {});
    assert!(w.stream(vec![unreadable, end]).await.is_empty(), "no retry would change it");
    assert!(w.holders(&tenant("alice")).await.is_empty(), "the next record was handled");
}

#[tokio::test]
async fn a_failing_store_reports_the_first_record_and_its_retry_frees_every_slot() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("a"), 1).await;
    w.holds(&tenant("bob"), &job_named("b"), 1).await;
    let batch = || {
        vec![
            end_of(&job_named("a"), &owner("alice"), "10", |_| {}),
            end_of(&job_named("b"), &owner("bob"), "11", |_| {}),
        ]
    };
    w.slots.set_unavailable(true);
    assert_eq!(w.stream(batch()).await, ["10"], "the shard resumes from the first");
    w.slots.set_unavailable(false);
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("a")], "nothing was given back");
    assert!(w.stream(batch()).await.is_empty());
    assert!(w.holders(&tenant("alice")).await.is_empty());
    assert!(w.holders(&tenant("bob")).await.is_empty());
}

#[tokio::test]
async fn a_wake_up_the_queue_refuses_is_retried_from_its_record_and_loses_no_one() {
    let w = world(1);
    w.holds(&tenant("alice"), &job_named("a"), 1).await;
    w.holds(&tenant("bob"), &job_named("b"), 1).await;
    w.waits(&tenant("bob"), &job_named("bobs-next"), &owner("bob")).await;
    w.queue.set_unavailable(true);
    let first = end_of(&job_named("a"), &owner("alice"), "10", |_| {});
    let second = end_of(&job_named("b"), &owner("bob"), "11", |_| {});
    assert_eq!(w.stream(vec![first, second.clone()]).await, ["11"]);
    assert!(w.holders(&tenant("alice")).await.is_empty(), "the first record was done");
    assert_eq!(
        w.waiting(&tenant("bob"), &owner("bob")).await,
        [job_named("bobs-next")],
        "still in its list"
    );
    w.queue.set_unavailable(false);
    assert!(w.stream(vec![second]).await.is_empty());
    assert_eq!(w.woken(), [(job_named("bobs-next"), owner("bob"))]);
    assert!(w.waiting(&tenant("bob"), &owner("bob")).await.is_empty());
}

#[tokio::test]
async fn a_retried_end_gives_back_nothing_twice() {
    let w = world(2);
    w.holds(&tenant("alice"), &job_named("done"), 2).await;
    w.holds(&tenant("alice"), &job_named("still-running"), 2).await;
    w.waits(&tenant("alice"), &job_named("w1"), &owner("alice")).await;
    w.waits(&tenant("alice"), &job_named("w2"), &owner("alice")).await;
    let end = || vec![end_of(&job_named("done"), &owner("alice"), "1", |_| {})];
    assert!(w.stream(end()).await.is_empty());
    assert_eq!(w.holders(&tenant("alice")).await, [job_named("still-running")]);
    assert_eq!(w.woken(), [(job_named("w1"), owner("alice"))]);
    assert!(w.stream(end()).await.is_empty());
    assert_eq!(
        w.holders(&tenant("alice")).await,
        [job_named("still-running")],
        "its slot is not freed again"
    );
    // The pool still has a free slot (the woken job has not taken it yet), so the repeat
    // wakes the next job too: the dispatcher gives the slot to one of them and sends the
    // other back to wait.
    assert_eq!(w.woken().len(), 2);
}

/// A job a schedule submitted is announced to its schedule when it ends (with how it ended);
/// any other job is not; and an announcement the queue refuses is retried from its record.
#[tokio::test]
async fn a_scheduled_jobs_end_is_sent_to_its_schedule_and_retried_until_it_is() {
    use longhaul_aws::scheduler::FiringKind;
    let w = world(1);
    let schedule_id = longhaul_domain::schedules::ScheduleId::new();
    let scheduled = |r: &mut Value| {
        r["dynamodb"]["NewImage"]["status"]["S"] = json!("failed");
        r["dynamodb"]["NewImage"]["scheduled"] = json!({"M": {
            "schedule_id": {"S": schedule_id.as_str()},
            "scheduled_at": {"S": "2026-11-26T02:00:00.000Z"},
        }});
    };
    let plain = end_of(&job_named("plain"), &owner("alice"), "1", |_| {});
    assert!(w.stream(vec![plain]).await.is_empty());
    assert_eq!(w.firings.take(), vec![], "a job no schedule made is announced to none");

    w.firings.set_unavailable(true);
    let tick = end_of(&job_named("ticked"), &owner("alice"), "2", scheduled);
    assert_eq!(w.stream(vec![tick.clone()]).await, vec!["2".to_owned()], "retried from it");
    w.firings.set_unavailable(false);
    assert!(w.stream(vec![tick]).await.is_empty());
    let sent = w.firings.take();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].kind, FiringKind::Ended);
    assert_eq!(sent[0].schedule_id, schedule_id.as_str());
    assert_eq!(sent[0].owner, "alice");
    assert_eq!(sent[0].scheduled_at, "2026-11-26T02:00:00.000Z");
    assert_eq!(sent[0].job_id.as_ref(), Some(&job_named("ticked")));
    assert_eq!(sent[0].status, Some(JobStatus::Failed));
}
