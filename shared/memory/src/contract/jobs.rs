//! The job table's contract: a conditional write that does not hold refuses, changes nothing
//! and returns the record as it is; a missing item is absent; pages end and hold every item once;
//! a key is taken once.

use chrono::{Duration as Span, Utc};
use longhaul_aws::jobs::{
    CancelOutcome, DeliveryRecord, IdempotencyRecord, JobRecord, ListError, ListFilter,
    ProgressRecord, Rotation, StoreError, TransitionRequest,
};
use longhaul_aws::ports::{
    DeliveryLog, JobCancellation, JobCreation, JobDispatchMarks, JobListing, JobReads,
    JobTransitions, WebhookSecrets,
};
use longhaul_domain::Owner;
use longhaul_domain::admission::{WaitReason, Waiting};
use longhaul_domain::webhooks::DeliveryOutcome;
use longhaul_domain::{Cancellation, JobId, JobStatus, Timestamp, Transition};

/// Every job-table port, as the contract exercises them together.
pub trait JobTable:
    JobReads
    + JobTransitions
    + JobCancellation
    + JobListing
    + JobCreation
    + JobDispatchMarks
    + WebhookSecrets
    + DeliveryLog
{
}

impl<T> JobTable for T where
    T: JobReads
        + JobTransitions
        + JobCancellation
        + JobListing
        + JobCreation
        + JobDispatchMarks
        + WebhookSecrets
        + DeliveryLog
{
}

/// A `pending` `demo` job record of `owner`, accepted at `created_at`, as submit stores it.
pub fn pending_job(owner: &Owner, created_at: Timestamp) -> JobRecord {
    JobRecord {
        job_id: JobId::new(),
        owner: owner.clone(),
        job_type: "demo".into(),
        params: serde_json::json!({"items": 3}),
        status: JobStatus::Pending,
        attempt: 0,
        lease: None,
        execution: None,
        claimant: None,
        ended_at_stage: None,
        idempotency_key: format!("k-{}", JobId::new()),
        fingerprint: "f".into(),
        callback_url: None,
        created_at,
        updated_at: created_at,
        started_at: None,
        finished_at: None,
        error: None,
        result_key: None,
        result_inline: None,
        transitions: vec![Transition {
            state: JobStatus::Pending,
            at: created_at,
            reason: "submitted".into(),
        }],
        injected_failures: 0,
        retry_of: None,
        cancellation: None,
        pause: None,
        paused_seconds: 0,
        undo_stages: Vec::new(),
        compensation: None,
        resumes: 0,
        continuations: 0,
        dispatches: 0,
        enqueues: 0,
        priority: Default::default(),
        policy: None,
        resumed_from: None,
        waiting: None,
        stalled_at: None,
        not_before: None,
        retry_at: None,
        last_error: None,
        summary: None,
        scheduled: None,
    }
}

/// A fresh principal, so that runs on a shared table never meet.
pub fn fresh_owner(label: &str) -> Owner {
    crate::owner(&format!("contract-{label}-{}", JobId::new()))
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn job_table(store: &impl JobTable) {
    absent_items_are_absent(store).await;
    a_job_is_created_once(store).await;
    transitions_are_conditional(store).await;
    cancellation_follows_the_status(store).await;
    pages_end_and_hold_every_job_once(store).await;
    idempotency_keys_are_taken_once(store).await;
    the_backlog_counts_jobs_not_yet_run(store).await;
    waiting_marks_only_a_pending_job(store).await;
    deliveries_and_secrets_are_kept(store).await;
}

async fn created(store: &impl JobTable, owner: &Owner) -> JobRecord {
    let job = pending_job(owner, Timestamp::now());
    store.put_job(&job).await.expect("a new job is written");
    job
}

async fn running(store: &impl JobTable, owner: &Owner, lease: &str) -> JobRecord {
    let job = created(store, owner).await;
    let id = job.job_id.clone();
    let queued = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "queued");
    store.transition(queued).await.expect("pending → queued");
    let claim = TransitionRequest::new(&id, &[JobStatus::Queued], JobStatus::Running, "claimed")
        .set("lease", lease)
        .set("attempt", 1);
    store.transition(claim).await.expect("queued → running")
}

fn conflict_status(result: Result<JobRecord, StoreError>) -> JobStatus {
    match result {
        Err(StoreError::Conflict { current: Some(job) }) => job.status,
        other => panic!("expected a conflict carrying the record, got {other:?}"),
    }
}

async fn absent_items_are_absent(store: &impl JobTable) {
    let missing = JobId::new();
    assert!(store.job(&missing).await.unwrap().is_none(), "a missing job reads as absent");
    assert!(store.view(&missing).await.unwrap().is_none(), "a missing view reads as absent");
    let request =
        TransitionRequest::new(&missing, &[JobStatus::Pending], JobStatus::Queued, "nothing");
    assert!(
        matches!(store.transition(request).await, Err(StoreError::Conflict { current: None })),
        "a missing job's transition is a conflict without a record"
    );
    assert!(store.deliveries(&missing).await.unwrap().is_empty());
}

async fn a_job_is_created_once(store: &impl JobTable) {
    let owner = fresh_owner("create");
    let job = created(store, &owner).await;
    let id = job.job_id.clone();
    assert_eq!(store.job(&id).await.unwrap().as_ref(), Some(&job), "read as written");
    let view = store.view(&id).await.unwrap().expect("the view of a new job");
    assert_eq!(view.job, job);
    assert!(view.progress.is_none(), "a new job has no progress record");
    assert!(
        matches!(store.put_job(&job).await, Err(StoreError::Conflict { current: None })),
        "a second write of the same id is refused"
    );
    // A retry's seeded progress is written once; a second seed leaves the first.
    let from = ProgressRecord {
        stage: "scan".into(),
        stage_index: 1,
        items_done: 7,
        ..Default::default()
    };
    store.seed_progress(&id, &from).await.unwrap();
    let again = ProgressRecord { items_done: 99, ..from.clone() };
    store.seed_progress(&id, &again).await.unwrap();
    let progress = store.view(&id).await.unwrap().unwrap().progress.expect("seeded");
    assert_eq!((progress.items_done, progress.seq), (7, 0), "the first seed stands");
    assert_eq!(progress.lease, format!("resumed:{id}"), "held by no attempt");
}

async fn transitions_are_conditional(store: &impl JobTable) {
    let owner = fresh_owner("transition");
    let job = created(store, &owner).await;
    let id = job.job_id.clone();
    // From a status the job is not in: refused with the record, nothing changed.
    let wrong = TransitionRequest::new(&id, &[JobStatus::Queued], JobStatus::Running, "early");
    assert_eq!(conflict_status(store.transition(wrong).await), JobStatus::Pending);
    assert_eq!(store.job(&id).await.unwrap().unwrap(), job, "a refused write changes nothing");
    // The FSM refuses an illegal move before any write.
    let illegal = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Succeeded, "x");
    assert!(matches!(store.transition(illegal).await, Err(StoreError::Illegal(_))));
    // A delayed job is not dispatched early.
    let later = Utc::now() + Span::hours(1);
    let delayed = JobRecord {
        not_before: Some(Timestamp::from(later)),
        ..pending_job(&owner, Timestamp::now())
    };
    store.put_job(&delayed).await.unwrap();
    let delayed_id = delayed.job_id.clone();
    let early =
        TransitionRequest::new(&delayed_id, &[JobStatus::Pending], JobStatus::Queued, "due?")
            .due(&Timestamp::now().to_rfc3339());
    assert_eq!(conflict_status(store.transition(early).await), JobStatus::Pending);
    let due = TransitionRequest::new(&delayed_id, &[JobStatus::Pending], JobStatus::Queued, "due")
        .due(&Timestamp::from(later + Span::seconds(1)).to_rfc3339());
    let queued = store.transition(due).await.expect("due at its start");
    assert_eq!(queued.status, JobStatus::Queued);
    assert_eq!(queued.transitions.len(), 2, "every change is logged");
    assert_eq!(queued.transitions.last().map(|t| t.reason.as_str()), Some("due"));

    // A fenced write applies only under its lease; attributes are set and removed with it.
    let run = running(store, &owner, "lease-a").await;
    let run_id = run.job_id.clone();
    assert_eq!(run.lease.as_deref(), Some("lease-a"));
    let stale = TransitionRequest::new(&run_id, &[JobStatus::Running], JobStatus::Succeeded, "s")
        .fenced("lease-b");
    assert_eq!(conflict_status(store.transition(stale).await), JobStatus::Running);
    let done = TransitionRequest::new(&run_id, &[JobStatus::Running], JobStatus::Succeeded, "ok")
        .fenced("lease-a")
        .set("result_key", "results/x")
        .remove("lease");
    let done = store.transition(done).await.expect("the lease holder ends its job");
    assert_eq!(done.status, JobStatus::Succeeded);
    assert_eq!(done.result_key.as_deref(), Some("results/x"));
    assert!(done.lease.is_none(), "removed in the same write");
    assert!(done.finished_at.is_some(), "an end is stamped");

    // An attempt's end that would hide an owner's cancellation is refused.
    let asked = running(store, &owner, "lease-c").await;
    let asked_id = asked.job_id.clone();
    store.cancel(&asked_id, &cancellation(&owner)).await.expect("requested");
    let retry = TransitionRequest::new(&asked_id, &[JobStatus::Running], JobStatus::Queued, "r")
        .fenced("lease-c")
        .unless_cancelled();
    assert_eq!(conflict_status(store.transition(retry).await), JobStatus::Running);
}

fn cancellation(owner: &Owner) -> Cancellation {
    Cancellation {
        requested_at: Timestamp::now(),
        requested_by: owner.to_owned(),
        reason: Some("contract".into()),
    }
}

async fn cancellation_follows_the_status(store: &impl JobTable) {
    let owner = fresh_owner("cancel");
    let job = created(store, &owner).await;
    let id = job.job_id.clone();
    let asked = cancellation(&owner);
    match store.cancel(&id, &asked).await.unwrap() {
        CancelOutcome::Cancelled(job) => {
            assert_eq!(job.status, JobStatus::Cancelled);
            assert_eq!(job.cancellation.as_ref(), Some(&asked), "who asked is recorded");
        }
        other => panic!("a pending job is cancelled at once, got {other:?}"),
    }
    let again = store.cancel(&id, &asked).await;
    assert!(
        matches!(&again, Err(StoreError::Conflict { current: Some(job) }) if job.status == JobStatus::Cancelled),
        "a terminal job's cancel is a conflict, got {again:?}"
    );

    let run = running(store, &owner, "lease-r").await;
    let run_id = run.job_id.clone();
    let progress = ProgressRecord { lease: "lease-r".into(), ..Default::default() };
    store.seed_progress(&run_id, &progress).await.unwrap();
    let first = cancellation(&owner);
    let CancelOutcome::Requested(requested) = store.cancel(&run_id, &first).await.unwrap() else {
        panic!("a running job's cancel is a request");
    };
    assert_eq!(requested.status, JobStatus::Running);
    assert_eq!(requested.cancellation.as_ref(), Some(&first));
    let second = Cancellation { reason: Some("again".into()), ..cancellation(&owner) };
    let CancelOutcome::Requested(repeated) = store.cancel(&run_id, &second).await.unwrap() else {
        panic!("a repeated request is a request");
    };
    assert_eq!(repeated.cancellation.as_ref(), Some(&first), "the first request stands");
    let flagged = store.view(&run_id).await.unwrap().unwrap().progress.unwrap();
    assert_eq!(
        flagged.cancel_requested_at,
        Some(first.requested_at),
        "the progress record is flagged with the first request's time"
    );
}

async fn pages_end_and_hold_every_job_once(store: &impl JobTable) {
    let owner = fresh_owner("list");
    let start = Utc::now() - Span::minutes(10);
    let mut ids = Vec::new();
    let schedule = longhaul_domain::schedules::ScheduleId::new();
    let tick = |job: &mut JobRecord| {
        job.scheduled = Some(longhaul_aws::jobs::ScheduledBy {
            schedule_id: schedule.clone(),
            scheduled_at: job.created_at,
        })
    };
    for i in 0..5 {
        let mut job = pending_job(&owner, Timestamp::from(start + Span::seconds(i)));
        if i != 1 && i != 4 {
            tick(&mut job);
        }
        store.put_job(&job).await.unwrap();
        ids.push(job.job_id.clone());
    }
    let other = fresh_owner("list-other");
    let mut theirs = pending_job(&other, Timestamp::now());
    tick(&mut theirs);
    store.put_job(&theirs).await.unwrap();
    let queued = TransitionRequest::new(&ids[1], &[JobStatus::Pending], JobStatus::Queued, "q");
    store.transition(queued).await.unwrap();

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 10, "the listing's pages end");
        let (jobs, next) =
            store.list(&owner, &ListFilter::default(), 2, cursor.as_deref()).await.unwrap();
        assert!(jobs.len() <= 2, "a page holds at most its limit");
        seen.extend(jobs.into_iter().map(|j| j.job_id.clone()));
        match next {
            Some(next) => {
                assert!(
                    matches!(
                        store.list(&other, &ListFilter::default(), 2, Some(&next)).await,
                        Err(ListError::InvalidCursor)
                    ),
                    "a cursor is its owner's alone"
                );
                cursor = Some(next);
            }
            None => break,
        }
    }
    let newest_first: Vec<JobId> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first, "every job once, newest first, none of another owner's");
    let filter = ListFilter { status: Some(JobStatus::Queued), job_type: None, schedule_id: None };
    let (queued, next) = store.list(&owner, &filter, 10, None).await.unwrap();
    assert_eq!(queued.iter().map(|j| j.job_id.clone()).collect::<Vec<_>>(), vec![ids[1].clone()]);
    assert!(next.is_none());
    assert!(matches!(
        store.list(&owner, &ListFilter::default(), 2, Some("not-a-cursor")).await,
        Err(ListError::InvalidCursor)
    ));

    // A schedule's jobs: only those its ticks submitted, newest first, paged, its owner's only.
    let by_schedule = ListFilter { schedule_id: Some(schedule.clone()), ..ListFilter::default() };
    let (first, next) = store.list(&owner, &by_schedule, 2, None).await.unwrap();
    let next = next.expect("a third of the schedule's jobs follows");
    let (rest, last) = store.list(&owner, &by_schedule, 2, Some(&next)).await.unwrap();
    let listed: Vec<JobId> = first.iter().chain(&rest).map(|j| j.job_id.clone()).collect();
    assert_eq!(listed, vec![ids[3].clone(), ids[2].clone(), ids[0].clone()], "a schedule's jobs");
    assert!(last.is_none(), "its pages end");
    let (seen_by_other, _) = store.list(&other, &by_schedule, 10, None).await.unwrap();
    assert_eq!(
        seen_by_other.iter().map(|j| j.job_id.clone()).collect::<Vec<_>>(),
        vec![theirs.job_id.clone()],
        "a schedule id lists its caller's jobs only"
    );
}

async fn idempotency_keys_are_taken_once(store: &impl JobTable) {
    let owner = fresh_owner("keys");
    let now = Utc::now().timestamp();
    let record = |job: u32, expires_at: i64| IdempotencyRecord {
        job_id: crate::nth_job(job),
        fingerprint: "f".into(),
        created_at: Timestamp::now(),
        expires_at,
    };
    let first = record(1, now + 3600);
    store.claim_key(&owner, "k", &first, None).await.expect("a free key is claimed");
    match store.claim_key(&owner, "k", &record(2, now + 3600), None).await {
        Err(StoreError::KeyTaken(existing)) => assert_eq!(*existing, first),
        other => panic!("a taken key says by whom, got {other:?}"),
    }
    assert_eq!(store.idempotency(&owner, "k").await.unwrap(), Some(first.clone()));
    assert_eq!(store.idempotency(&fresh_owner("keys"), "k").await.unwrap(), None, "per owner");
    store.release_key(&owner, "k", &crate::nth_job(2)).await.unwrap();
    assert_eq!(store.idempotency(&owner, "k").await.unwrap(), Some(first), "not job-2's to give");
    store.release_key(&owner, "k", &crate::nth_job(1)).await.unwrap();
    assert_eq!(store.idempotency(&owner, "k").await.unwrap(), None, "given back");
    // Replacing: only while the key still names the job it replaces.
    store.claim_key(&owner, "r", &record(3, now + 3600), None).await.unwrap();
    assert!(matches!(
        store.claim_key(&owner, "r", &record(4, now + 3600), Some(&crate::nth_job(9))).await,
        Err(StoreError::KeyTaken(_))
    ));
    store.claim_key(&owner, "r", &record(4, now + 3600), Some(&crate::nth_job(3))).await.unwrap();
    // An expired record names no job and is taken over.
    store.claim_key(&owner, "e", &record(5, now - 10), None).await.unwrap();
    assert_eq!(store.idempotency(&owner, "e").await.unwrap(), None, "expired reads as absent");
    store.claim_key(&owner, "e", &record(6, now + 3600), None).await.expect("taken over");
}

async fn the_backlog_counts_jobs_not_yet_run(store: &impl JobTable) {
    let owner = fresh_owner("backlog");
    assert_eq!(store.backlog(&owner, 10).await.unwrap(), 0);
    let a = created(store, &owner).await;
    created(store, &owner).await;
    let queued =
        TransitionRequest::new(&a.job_id, &[JobStatus::Pending], JobStatus::Queued, "queued");
    store.transition(queued).await.unwrap();
    assert_eq!(store.backlog(&owner, 10).await.unwrap(), 2, "pending and queued both wait");
    running(store, &owner, "lease-b").await;
    assert_eq!(store.backlog(&owner, 10).await.unwrap(), 2, "a running job has left it");
    let cancelled =
        TransitionRequest::new(&a.job_id, &[JobStatus::Queued], JobStatus::Cancelled, "cancelled");
    store.transition(cancelled).await.unwrap();
    assert_eq!(store.backlog(&owner, 10).await.unwrap(), 1, "an ended job has left it");
    // Counted up to `at_most`: below it exactly; at or over it, at least `at_most` and never
    // more than there are (the DynamoDB adapter stops at the page that reaches it, so it may
    // pass it within that page).
    created(store, &owner).await;
    created(store, &owner).await;
    assert_eq!(store.backlog(&owner, 4).await.unwrap(), 3, "below at_most: exact");
    assert_eq!(store.backlog(&owner, 3).await.unwrap(), 3, "at at_most: all of them");
    for at_most in [1, 2] {
        let counted = store.backlog(&owner, at_most).await.unwrap();
        assert!((at_most..=3).contains(&counted), "counted up to {at_most}: {counted}");
    }
}

async fn waiting_marks_only_a_pending_job(store: &impl JobTable) {
    let owner = fresh_owner("waiting");
    let job = created(store, &owner).await;
    let waiting = Waiting {
        reason: WaitReason::TenantLimit,
        limit: 2,
        since: Timestamp::now(),
        position: "p".into(),
    };
    let marked = store.mark_waiting(&job.job_id, &waiting).await.unwrap();
    assert_eq!(marked.waiting.as_ref(), Some(&waiting));
    let run = running(store, &owner, "lease-w").await;
    assert_eq!(
        conflict_status(store.mark_waiting(&run.job_id, &waiting).await),
        JobStatus::Running
    );
}

async fn deliveries_and_secrets_are_kept(store: &impl JobTable) {
    let job = JobId::new();
    let delivery = |attempt: u32| DeliveryRecord {
        webhook_id: format!("msg_{job}"),
        event: "job.succeeded".into(),
        attempt,
        at: Timestamp::now(),
        status_code: Some(500),
        latency_ms: 3,
        error: None,
        outcome: DeliveryOutcome::Retrying,
    };
    store.record_delivery(&job, &delivery(2)).await.unwrap();
    store.record_delivery(&job, &delivery(1)).await.unwrap();
    let attempts: Vec<u32> =
        store.deliveries(&job).await.unwrap().iter().map(|d| d.attempt).collect();
    assert_eq!(attempts, vec![1, 2], "oldest attempt first");

    let owner = fresh_owner("secrets");
    let first = store.webhook_secrets(&owner).await.unwrap();
    let again = store.webhook_secrets(&owner).await.unwrap();
    assert_eq!(first.version, again.version, "created once");
    assert_eq!(first.secrets.len(), 1);
    let until = Timestamp::from(Utc::now() + Span::hours(1));
    match store.rotate_webhook_secret(&owner, until).await.unwrap() {
        Rotation::Rotated(record) => {
            assert_eq!(record.version, first.version + 1);
            assert_eq!(record.secrets.len(), 2, "the old secret overlaps the new");
        }
        Rotation::Lost(_) => panic!("an uncontested rotation is written"),
    }
}
