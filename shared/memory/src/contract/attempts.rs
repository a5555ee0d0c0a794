//! The attempts' contract ([`JobAttempts`]): only the execution a job was last dispatched to
//! claims it, once per execution; a job's first claim hands no progress record over (its
//! attempt's first write makes it), every later claim hands the record over, never back to an
//! earlier attempt; a progress write applies only under the record's lease (or to a record no
//! attempt holds) with a higher sequence and no cancellation flagged, and its refusal says
//! which did not hold; a request or a revoke before the first write makes the record, so that
//! write finds it; the fenced marks apply only under the job's lease.

use longhaul_aws::jobs::{
    FinalCheckpoint, JobRecord, Lease, ProgressRecord, ProgressRefused, ResumedFrom, StoreError,
    TransitionRequest,
};
use longhaul_aws::ports::{JobAttempts, JobCancellation, JobCreation, JobReads, JobTransitions};
use longhaul_domain::{Cancellation, JobId, JobStatus, Timestamp};

use super::{fresh_owner, pending_job};

/// The job-table ports the attempts' contract arranges its jobs with, and the attempts' own.
pub trait AttemptTable:
    JobReads + JobTransitions + JobCreation + JobCancellation + JobAttempts
{
}

impl<T> AttemptTable for T where
    T: JobReads + JobTransitions + JobCreation + JobCancellation + JobAttempts
{
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn job_attempts(store: &impl AttemptTable) {
    only_the_dispatched_execution_claims_once(store).await;
    a_direct_run_claims_once_per_claimant_until_an_execution_takes_over(store).await;
    a_claim_hands_the_progress_record_over_never_back(store).await;
    progress_writes_are_fenced_and_say_why_not(store).await;
    a_cancelled_attempt_records_its_final_checkpoint(store).await;
    a_revoked_record_refuses_its_attempt(store).await;
    a_request_before_the_first_write_reaches_it(store).await;
    marks_and_counters_apply_under_the_lease(store).await;
}

/// A `queued` job dispatched to `execution` (the first dispatch), its next attempt due.
async fn queued(store: &impl AttemptTable, label: &str, execution: &str) -> JobId {
    let job = pending_job(&fresh_owner(label), Timestamp::now());
    let id = job.job_id.clone();
    store.put_job(&job).await.expect("a new job is written");
    let queue = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "queued")
        .set("execution", execution)
        .set("dispatches", 1)
        .set("retry_at", Timestamp::now());
    store.transition(queue).await.expect("pending → queued");
    id
}

/// The job, running under `lease`, back to `queued` for `execution` (as a backoff leaves it).
async fn requeued(store: &impl AttemptTable, id: &JobId, lease: &Lease, execution: &str) {
    let back = TransitionRequest::new(id, &[JobStatus::Running], JobStatus::Queued, "backoff")
        .fenced(&lease.token)
        .set("execution", execution);
    store.transition(back).await.expect("running → queued under the lease");
}

fn conflict(result: Result<(Lease, JobRecord), StoreError>) -> JobStatus {
    match result {
        Err(StoreError::Conflict { current: Some(job) }) => job.status,
        other => panic!("expected a conflict carrying the record, got {other:?}"),
    }
}

async fn progress_of(store: &impl AttemptTable, id: &JobId) -> ProgressRecord {
    store.view(id).await.unwrap().expect("the job").progress.expect("a progress record")
}

/// A progress write of `lease` at `seq`.
fn written(lease: &Lease, seq: u64, stage_index: u32, items_done: u64) -> ProgressRecord {
    ProgressRecord {
        pct: 12.5,
        stage: format!("stage-{stage_index}"),
        stage_index,
        stages_total: 2,
        items_done,
        items_total: Some(100),
        seq,
        lease: lease.token.clone(),
        checkpoint_key: Some(format!("checkpoints/x/{seq}.json")),
        progress_changed_at: Some(Timestamp::now()),
        attempt: Some(lease.attempt),
        ..ProgressRecord::default()
    }
}

async fn only_the_dispatched_execution_claims_once(store: &impl AttemptTable) {
    let missing = JobId::new();
    assert!(
        matches!(store.claim(&missing, "x").await, Err(StoreError::Conflict { current: None })),
        "a missing job's claim is a conflict without a record"
    );
    let id = queued(store, "claim", "exec-1").await;
    let before = store.job(&id).await.unwrap().unwrap();
    assert_eq!(
        conflict(store.claim(&id, "exec-0").await),
        JobStatus::Queued,
        "a superseded execution does not claim the job"
    );
    assert_eq!(store.job(&id).await.unwrap().unwrap(), before, "a refused claim changes nothing");
    assert!(store.view(&id).await.unwrap().unwrap().progress.is_none(), "nor hands anything over");

    let (lease, job) = store.claim(&id, "exec-1").await.expect("the dispatched execution claims");
    assert_eq!((job.status, job.attempt, lease.attempt), (JobStatus::Running, 1, 1));
    assert_eq!(job.lease.as_deref(), Some(lease.token.as_str()), "the lease is minted on the job");
    assert!(!lease.token.is_empty());
    assert!(job.started_at.is_some(), "the first start is stamped");
    assert!(job.retry_at.is_none(), "a backoff's retry_at goes with the claim");
    assert_eq!(job.transitions.last().map(|t| t.state), Some(JobStatus::Running));
    assert_eq!(store.job(&id).await.unwrap().unwrap(), job, "the claim answers the record");
    assert!(job.is_first_claim());
    let view = store.view(&id).await.unwrap().unwrap();
    assert!(view.progress.is_none(), "a first claim hands no record over: there is none");

    let (again, same) = store.claim(&id, "exec-1").await.expect("a repeated claim answers again");
    assert_eq!(again, lease, "idempotent per execution: the same lease");
    assert_eq!(same.attempt, 1, "not counted twice");
    // The repeat may follow an invocation that wrote progress: it hands the record over.
    let progress = progress_of(store, &id).await;
    assert_eq!(progress.lease, lease.token, "the progress record is handed over");
    assert_eq!((progress.attempt, progress.seq, progress.items_done), (Some(1), 0, 0));
    assert_eq!(
        conflict(store.claim(&id, "exec-0").await),
        JobStatus::Running,
        "another execution does not take a running job"
    );
}

async fn a_direct_run_claims_once_per_claimant_until_an_execution_takes_over(
    store: &impl AttemptTable,
) {
    let id = queued(store, "direct", "run-1").await;
    let (lease, view) =
        store.claim_as(&id, "run-1", Some("first")).await.expect("the run's invocation claims");
    assert_eq!(
        view.job.claimant.as_deref(),
        Some("first"),
        "the claimant is stored with the claim"
    );
    assert_eq!(
        Some(&view),
        store.view(&id).await.unwrap().as_ref(),
        "the claim answers the job and its progress as a read after it does"
    );
    let (again, _) =
        store.claim_as(&id, "run-1", Some("first")).await.expect("Lambda's retry claims again");
    assert_eq!(again, lease, "the same claimant gets the lease back");
    assert_eq!(
        conflict(store.claim_as(&id, "run-1", Some("second")).await.map(|(l, v)| (l, v.job))),
        JobStatus::Running,
        "a second invocation of the same run does not work beside the first"
    );
    assert_eq!(
        conflict(store.claim(&id, "run-1").await),
        JobStatus::Running,
        "an execution does not take a job a run holds"
    );
    let handed = store.record_execution(&id, &lease.token, "run-1").await.unwrap();
    assert_eq!(handed.claimant, None, "recording the execution ends the run's hold");
    let (taken, _) =
        store.claim(&id, "run-1").await.expect("an execution of the run's name takes it over");
    assert_eq!(taken, lease, "under the run's lease");
    assert_eq!(
        conflict(store.claim_as(&id, "run-1", Some("first")).await.map(|(l, v)| (l, v.job))),
        JobStatus::Running,
        "the run's retry no longer gets the lease once an execution holds the job"
    );
    assert_eq!(store.claim(&id, "run-1").await.unwrap().0, lease, "the execution still does");

    // A run's attempt that goes back to the queue (the reaper re-dispatched it while Lambda
    // was still to retry the run): the next attempt's execution claims it as its own alone.
    let id = queued(store, "direct-requeued", "run-1").await;
    let (lease, _) = store.claim_as(&id, "run-1", Some("first")).await.unwrap();
    requeued(store, &id, &lease, "exec-2").await;
    let (next, job) = store.claim(&id, "exec-2").await.expect("the next attempt claims");
    assert_eq!(job.claimant, None, "no run holds the next attempt");
    let (again, _) = store.claim(&id, "exec-2").await.expect("its retried claim gets it back");
    assert_eq!(again, next);
}

async fn a_claim_hands_the_progress_record_over_never_back(store: &impl AttemptTable) {
    let id = queued(store, "handover", "exec-1").await;
    let (first, claimed) = store.claim(&id, "exec-1").await.unwrap();
    store.record_progress(&id, &written(&first, 1, 1, 40)).await.expect("the holder writes");
    requeued(store, &id, &first, "exec-2").await;
    let (second, job) = store.claim(&id, "exec-2").await.expect("the next attempt claims");
    assert_eq!((second.attempt, job.attempt), (2, 2));
    assert_ne!(second.token, first.token, "each attempt has its own lease");
    assert_eq!(job.started_at, claimed.started_at, "the first start stands");
    let progress = progress_of(store, &id).await;
    assert_eq!((progress.lease.as_str(), progress.attempt), (second.token.as_str(), Some(2)));
    assert_eq!(
        (progress.stage_index, progress.items_done, progress.seq),
        (1, 40, 1),
        "the hand-over keeps where the job was"
    );
    assert_eq!(progress.checkpoint_key.as_deref(), Some("checkpoints/x/1.json"));
    assert!(
        matches!(
            store.record_progress(&id, &written(&first, 2, 1, 41)).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "the earlier attempt's writes are refused from the hand-over on"
    );

    // A first claim's attempt (which hands nothing over) cannot write a record a later
    // attempt holds.
    let late = TransitionRequest::new(&id, &[JobStatus::Running], JobStatus::Queued, "late")
        .fenced(&second.token)
        .set("execution", "exec-first")
        .set("attempt", 0);
    store.transition(late).await.unwrap();
    let (first_again, _) = store.claim(&id, "exec-first").await.expect("claimed as a first");
    assert!(
        matches!(
            store.record_progress(&id, &written(&first_again, 9, 1, 50)).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "its first write finds the record held"
    );

    // A claimer of an earlier attempt (delayed between its two writes while the job moved
    // on) does not take the record back from the attempt that holds it.
    let late = TransitionRequest::new(&id, &[JobStatus::Running], JobStatus::Queued, "late")
        .fenced(&first_again.token)
        .set("execution", "exec-late")
        .set("attempt", 0)
        .set("resumes", 1);
    store.transition(late).await.unwrap();
    match store.claim(&id, "exec-late").await {
        Err(StoreError::Conflict { current: Some(job) }) => {
            assert_eq!((job.status, job.attempt), (JobStatus::Running, 1))
        }
        other => panic!("a hand-over to an earlier attempt is a conflict, got {other:?}"),
    }
    let progress = progress_of(store, &id).await;
    assert_eq!(
        (progress.lease.as_str(), progress.attempt),
        (second.token.as_str(), Some(2)),
        "the record stays with the later attempt"
    );
}

async fn progress_writes_are_fenced_and_say_why_not(store: &impl AttemptTable) {
    let id = queued(store, "progress", "exec-1").await;
    let (lease, _) = store.claim(&id, "exec-1").await.unwrap();
    let first = written(&lease, 1, 1, 10);
    store.record_progress(&id, &first).await.expect("the first write makes the record");
    assert_eq!(progress_of(store, &id).await, first, "read back as written");
    let stale = written(&lease, 1, 1, 11);
    assert!(
        matches!(store.record_progress(&id, &stale).await, Err(ProgressRefused::Stale { seq: 1 })),
        "a seq not above the record's is stale and names the record's"
    );
    let other = Lease { attempt: 1, token: "someone-else".into() };
    assert!(matches!(
        store.record_progress(&id, &written(&other, 9, 1, 12)).await,
        Err(ProgressRefused::LeaseLost)
    ));
    assert_eq!(progress_of(store, &id).await, first, "a refused write changes nothing");
    let second = written(&lease, 5, 2, 0);
    store.record_progress(&id, &second).await.expect("any higher seq");
    assert_eq!(progress_of(store, &id).await.stage_index, 2);

    let job = store.job(&id).await.unwrap().unwrap();
    let asked = Cancellation {
        requested_at: Timestamp::now(),
        requested_by: job.owner.clone(),
        reason: None,
    };
    store.cancel(&id, &asked).await.expect("a cancellation request");
    assert!(
        matches!(
            store.record_progress(&id, &written(&lease, 6, 2, 1)).await,
            Err(ProgressRefused::Cancelled)
        ),
        "a flagged record refuses its holder as cancelled"
    );
    assert!(
        matches!(
            store.record_progress(&id, &written(&other, 7, 2, 1)).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "and anyone else as not theirs"
    );
    assert_eq!(progress_of(store, &id).await.seq, 5);
}

async fn a_cancelled_attempt_records_its_final_checkpoint(store: &impl AttemptTable) {
    let id = queued(store, "final", "exec-1").await;
    let (lease, job) = store.claim(&id, "exec-1").await.unwrap();
    store.record_progress(&id, &written(&lease, 3, 2, 5)).await.unwrap();
    let asked = Cancellation {
        requested_at: Timestamp::now(),
        requested_by: job.owner.clone(),
        reason: Some("contract".into()),
    };
    store.cancel(&id, &asked).await.unwrap();
    let checkpoint = |seq, stage_index, key| FinalCheckpoint {
        seq,
        stage: "stage-2",
        stage_index,
        checkpoint_key: key,
        items_done: 8,
    };
    let refused =
        |result: Result<(), ProgressRefused>| matches!(result, Err(ProgressRefused::LeaseLost));
    assert!(
        refused(store.record_final_checkpoint(&id, "other", checkpoint(4, 2, "k/other")).await),
        "another lease's is refused"
    );
    assert!(
        refused(store.record_final_checkpoint(&id, &lease.token, checkpoint(3, 2, "k/old")).await),
        "one not above the record's seq is refused"
    );
    assert!(
        refused(store.record_final_checkpoint(&id, &lease.token, checkpoint(4, 1, "k/back")).await),
        "one of a stage the record is past is refused"
    );
    store
        .record_final_checkpoint(&id, &lease.token, checkpoint(4, 2, "k/final"))
        .await
        .expect("the cancelled attempt's last checkpoint");
    let progress = progress_of(store, &id).await;
    assert_eq!(progress.checkpoint_key.as_deref(), Some("k/final"));
    assert_eq!((progress.seq, progress.items_done, progress.stage_index), (4, 8, 2));
    assert!(progress.cancel_requested_at.is_some(), "the flag stays");
}

async fn a_revoked_record_refuses_its_attempt(store: &impl AttemptTable) {
    // Before the attempt's first write (a first claim's zombie): the revoke makes the record.
    let id = queued(store, "revoke-first", "exec-1").await;
    let (lease, _) = store.claim(&id, "exec-1").await.unwrap();
    store.revoke_progress(&id, &lease.token).await.expect("revoked before any write");
    assert_eq!(progress_of(store, &id).await.lease, format!("revoked:{}", lease.token));
    assert!(
        matches!(
            store.record_progress(&id, &written(&lease, 1, 1, 1)).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "the attempt's first write is refused"
    );

    let id = queued(store, "revoke", "exec-1").await;
    let (lease, _) = store.claim(&id, "exec-1").await.unwrap();
    store.record_progress(&id, &written(&lease, 1, 1, 1)).await.expect("the first write");
    store.revoke_progress(&id, "not-the-holder").await.expect("a non-holder's revoke is a no-op");
    assert_eq!(progress_of(store, &id).await.lease, lease.token, "left alone");
    store.revoke_progress(&id, &lease.token).await.expect("the holder's record is revoked");
    store.revoke_progress(&id, &lease.token).await.expect("again: nothing to do");
    assert_eq!(progress_of(store, &id).await.lease, format!("revoked:{}", lease.token));
    assert!(matches!(
        store.record_progress(&id, &written(&lease, 1, 1, 1)).await,
        Err(ProgressRefused::LeaseLost)
    ));
    store.revoke_progress(&JobId::new(), "x").await.expect("no record: nothing");
}

async fn marks_and_counters_apply_under_the_lease(store: &impl AttemptTable) {
    let mut job = pending_job(&fresh_owner("marks"), Timestamp::now());
    job.resumed_from =
        Some(ResumedFrom { job_id: JobId::new(), stage: "scan".into(), items_done: 3 });
    let id = job.job_id.clone();
    store.put_job(&job).await.unwrap();
    let queue = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "queued")
        .set("execution", "exec-1");
    store.transition(queue).await.unwrap();
    let (lease, _) = store.claim(&id, "exec-1").await.unwrap();
    let fenced_off = |result: Result<_, StoreError>, what: &str| match result {
        Err(StoreError::Conflict { current: Some(job) }) => {
            assert_eq!(job.status, JobStatus::Running, "{what}: the record as it is")
        }
        other => panic!("{what}: another lease's is a conflict, got {other:?}"),
    };

    fenced_off(store.forget_resume(&id, "other").await.map(|_| ()), "forget_resume");
    store.forget_resume(&id, &lease.token).await.expect("taken back");
    assert!(store.job(&id).await.unwrap().unwrap().resumed_from.is_none());
    store.forget_resume(&id, &lease.token).await.expect("again: already said");

    assert_eq!(store.count_continuation(&id, &lease.token).await.unwrap(), 1);
    assert_eq!(store.count_continuation(&id, &lease.token).await.unwrap(), 2);
    fenced_off(store.count_continuation(&id, "other").await.map(|_| ()), "count_continuation");
    let moved = store.record_execution(&id, &lease.token, "exec-1.a1c2").await.unwrap();
    assert_eq!(moved.execution.as_deref(), Some("exec-1.a1c2"));
    fenced_off(store.record_execution(&id, "other", "x").await.map(|_| ()), "record_execution");
    let counted = store.count_injected_failure(&id, &lease.token).await.unwrap();
    assert_eq!(counted.injected_failures, 1);
    fenced_off(
        store.count_injected_failure(&id, "other").await.map(|_| ()),
        "count_injected_failure",
    );
    let job = store.job(&id).await.unwrap().unwrap();
    assert_eq!((job.continuations, job.injected_failures), (2, 1), "refusals counted nothing");
    assert_eq!(job.execution.as_deref(), Some("exec-1.a1c2"));

    // Once the job ended, nothing is the attempt's to mark.
    let end = TransitionRequest::new(&id, &[JobStatus::Running], JobStatus::Failed, "ended")
        .fenced(&lease.token);
    store.transition(end).await.unwrap();
    match store.count_continuation(&id, &lease.token).await {
        Err(StoreError::Conflict { current: Some(job) }) => {
            assert_eq!(job.status, JobStatus::Failed)
        }
        other => panic!("an ended job's counter is a conflict, got {other:?}"),
    }
    assert!(matches!(
        store.record_execution(&JobId::new(), "x", "y").await,
        Err(StoreError::Conflict { current: None })
    ));
}

/// An owner's request that lands before a first claim's attempt has written its record makes
/// the record (under no lease) with the flag: the attempt's first write finds it and is
/// refused for it, and a cancelled attempt's final checkpoint still lands.
async fn a_request_before_the_first_write_reaches_it(store: &impl AttemptTable) {
    let id = queued(store, "early-cancel", "exec-1").await;
    let (lease, job) = store.claim(&id, "exec-1").await.unwrap();
    assert!(store.view(&id).await.unwrap().unwrap().progress.is_none());
    let asked = Cancellation {
        requested_at: Timestamp::now(),
        requested_by: job.owner.clone(),
        reason: None,
    };
    store.cancel(&id, &asked).await.expect("a cancellation request");
    let flagged = progress_of(store, &id).await;
    assert!(flagged.cancel_requested_at.is_some(), "the request made the record");
    assert_eq!((flagged.lease.as_str(), flagged.seq, flagged.stage_index), ("", 0, 0));
    assert!(
        matches!(
            store.record_progress(&id, &written(&lease, 1, 1, 1)).await,
            Err(ProgressRefused::Cancelled)
        ),
        "the first write learns of the cancellation"
    );
    store
        .record_final_checkpoint(
            &id,
            &lease.token,
            FinalCheckpoint {
                seq: 1,
                stage: "stage-1",
                stage_index: 1,
                checkpoint_key: "k/early",
                items_done: 2,
            },
        )
        .await
        .expect("the cancelled attempt's checkpoint");
    let progress = progress_of(store, &id).await;
    assert_eq!(progress.lease, lease.token, "now held by the attempt");
    assert_eq!(progress.checkpoint_key.as_deref(), Some("k/early"));
    assert!(progress.cancel_requested_at.is_some(), "the flag stays");
    let other = Lease { attempt: 1, token: "someone-else".into() };
    assert!(matches!(
        store.record_progress(&id, &written(&other, 9, 1, 3)).await,
        Err(ProgressRefused::LeaseLost)
    ));
}
