//! The reaper's moves' contract ([`JobReaping`]): each move applies only to a job in the
//! status it is for (and, for a stall flag, under the job's lease, once per flag state), and
//! refuses otherwise with the record as it is (`None` for a job that is not there), changing
//! nothing; a re-enqueue is counted and moves the job's status-index entry to the next look,
//! in the bucket it is in; a deferred look moves only the entry; a re-dispatch happens once per
//! dispatch number seen; progress records are read by job, any number at once, a job without
//! one missing.
//!
//! Its jobs end (`cancelled`) within their clause, so no reaper sweep on a shared table acts
//! on them; the sort keys it writes are in the far future.

use chrono::Utc;
use longhaul_aws::jobs::{JobRecord, Lease, ProgressRecord, StoreError, TransitionRequest};
use longhaul_aws::ports::{
    JobAttempts, JobCompensation, JobCreation, JobDispatchMarks, JobReads, JobReaping,
    JobTransitions, StatusIndex, SweepCursor,
};
use longhaul_domain::admission::{WaitReason, Waiting};
use longhaul_domain::compensation::{Compensation, Ending, UndoStatus};
use longhaul_domain::{JobId, JobStatus, Timestamp, format_rfc3339};

use super::{fresh_owner, pending_job, shard_of};

/// The job-table ports the reaping contract arranges its jobs with, and the reaper's own.
pub trait ReapedTable:
    JobReads
    + JobCreation
    + JobTransitions
    + JobAttempts
    + JobDispatchMarks
    + StatusIndex
    + JobReaping
    + JobCompensation
{
}

impl<T> ReapedTable for T where
    T: JobReads
        + JobCreation
        + JobTransitions
        + JobAttempts
        + JobDispatchMarks
        + StatusIndex
        + JobReaping
        + JobCompensation
{
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn job_reaping(store: &impl ReapedTable) {
    a_re_enqueue_is_counted_and_looks_again_later(store).await;
    a_deferred_look_moves_only_the_entry(store).await;
    a_queued_job_is_redispatched_once_per_dispatch(store).await;
    a_stall_is_flagged_and_cleared_once_under_the_lease(store).await;
    progress_records_are_read_by_job(store).await;
    a_compensation_is_recorded_only_while_compensating_and_indexed_as_due(store).await;
}

/// A compensating job's undos are written while it compensates, each write moving its entry
/// in the `compensating` bucket to when its worker is next due, and only over the revision the
/// writer read (a second writer of the same revision is refused); once it ended, a write is
/// refused with the record as it is, and the entry is gone.
async fn a_compensation_is_recorded_only_while_compensating_and_indexed_as_due(
    store: &impl ReapedTable,
) {
    let job = created(store, "compensation").await;
    let id = &job.job_id;
    let missing = JobId::new();
    let ending = Ending { status: JobStatus::Cancelled, reason: "contract".into(), error: None };
    let mut compensation = Compensation::begin(ending.clone(), Timestamp::now());
    compensation.revision = 1;
    match store.record_compensation(&missing, &compensation, far(7)).await {
        Err(StoreError::Conflict { current: None }) => {}
        other => panic!("a missing job's compensation is refused with none: {other:?}"),
    }
    match store.record_compensation(id, &compensation, far(7)).await {
        Err(StoreError::Conflict { current: Some(current) }) => {
            assert_eq!(current.status, JobStatus::Pending, "refused as it is")
        }
        other => panic!("a pending job's compensation is refused: {other:?}"),
    }
    let begin = longhaul_aws::jobs::compensation_request(
        id,
        &[JobStatus::Pending],
        ending,
        Timestamp::now(),
    );
    let began = store.transition(begin).await.expect("pending → compensating");
    assert_eq!(began.status, JobStatus::Compensating);
    assert_eq!(began.compensation.as_ref().map(|c| c.planned), Some(false));
    let mut planned = began.compensation.clone().unwrap();
    planned.plan(&["a", "b"], &["a".into(), "b".into()]);
    planned.stages[0].status = UndoStatus::Done;
    planned.stages[0].attempts = 1;
    planned.revision = 1;
    let recorded = store.record_compensation(id, &planned, far(8)).await.expect("recorded");
    assert_eq!(recorded.compensation.as_ref(), Some(&planned));
    // A second writer that read revision 0 too is refused: only one goes on.
    let mut stale = planned.clone();
    stale.stages[0].status = UndoStatus::Failed;
    match store.record_compensation(id, &stale, far(9)).await {
        Err(StoreError::Conflict { current: Some(current) }) => {
            assert_eq!(current.compensation.as_ref(), Some(&planned), "unchanged")
        }
        other => panic!("a stale revision is refused: {other:?}"),
    }
    assert_eq!(store.job(id).await.unwrap().unwrap().compensation, Some(planned.clone()));
    assert_eq!(entry_in(store, "compensating", id).await, Some(far(8).to_rfc3339()));
    let end = TransitionRequest::new(id, &[JobStatus::Compensating], JobStatus::Cancelled, "end")
        .set("compensation", &planned);
    store.transition(end).await.expect("compensating → cancelled");
    planned.revision = 2;
    match store.record_compensation(id, &planned, far(9)).await {
        Err(StoreError::Conflict { current: Some(current) }) => {
            assert_eq!(current.status, JobStatus::Cancelled)
        }
        other => panic!("an ended job's compensation is refused: {other:?}"),
    }
    assert_eq!(entry_in(store, "compensating", id).await, None, "out of the bucket once ended");
}

/// A sort key in the far future (no sweep looks there), distinct per `n`.
fn far(n: u32) -> Timestamp {
    format!("9998-01-01T00:00:{n:02}.000Z").parse().expect("a timestamp")
}

/// `job_id`'s entry in bucket `kind` (its shard's), if it is there: its sort key.
async fn entry_in(store: &impl ReapedTable, kind: &str, job_id: &JobId) -> Option<String> {
    let mut start: Option<SweepCursor> = None;
    let mut found = Vec::new();
    for pages in 1.. {
        assert!(pages < 10_000, "the pages of {kind} end");
        let page = store
            .due_page(kind, shard_of(job_id), "9999-12-31T23:59:59.999Z", 100, start)
            .await
            .expect("a page");
        found.extend(
            page.entries.into_iter().flatten().filter(|e| e.job_id == *job_id).map(|e| e.at),
        );
        match page.next {
            Some(next) => start = Some(next),
            None => break,
        }
    }
    assert!(found.len() <= 1, "{job_id} is in {kind} once: {found:?}");
    found.pop()
}

async fn created(store: &impl ReapedTable, label: &str) -> JobRecord {
    let job = pending_job(&fresh_owner(label), Timestamp::now());
    store.put_job(&job).await.expect("a new job is written");
    job
}

/// A job `queued` for `execution` with `dispatches` dispatches (none written if `None`),
/// indexed in the far future.
async fn queued(
    store: &impl ReapedTable,
    label: &str,
    execution: &str,
    dispatches: Option<u32>,
) -> JobId {
    let id = created(store, label).await.job_id.clone();
    let mut request = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "q")
        .set("execution", execution)
        .indexed_at(far(1).to_rfc3339());
    if let Some(dispatches) = dispatches {
        request = request.set("dispatches", dispatches);
    }
    store.transition(request).await.expect("pending → queued");
    id
}

/// A job claimed by its first execution (its progress record handed to the lease).
async fn running(store: &impl ReapedTable, label: &str) -> (JobId, Lease) {
    let execution = format!("contract-{}", JobId::new());
    let id = queued(store, label, &execution, Some(1)).await;
    let (lease, _) = store.claim(&id, &execution).await.expect("the execution claims its job");
    (id, lease)
}

async fn read(store: &impl ReapedTable, id: &JobId) -> JobRecord {
    store.job(id).await.expect("a read").expect("the job is there")
}

/// Ends the job (`cancelled`), so it leaves the status index.
async fn end(store: &impl ReapedTable, id: &JobId) {
    let job = read(store, id).await;
    let mut request =
        TransitionRequest::new(id, &[job.status], JobStatus::Cancelled, "contract done");
    if let Some(lease) = job.lease.as_deref().filter(|_| job.status == JobStatus::Running) {
        request = request.fenced(lease);
    }
    store.transition(request).await.unwrap_or_else(|e| panic!("{id} ends: {e}"));
}

/// The record a refusal carries (`None`: it carried none); panics if `result` is no refusal.
fn refused<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) -> Option<JobRecord> {
    match result {
        Err(StoreError::Conflict { current }) => current.map(|job| *job),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

async fn a_re_enqueue_is_counted_and_looks_again_later(store: &impl ReapedTable) {
    let job = created(store, "enqueue").await;
    let id = job.job_id.clone();
    let counted = store.count_enqueue(&id, far(2)).await.expect("a pending job is re-enqueued");
    assert_eq!((counted.status, counted.enqueues), (JobStatus::Pending, 1), "counted once");
    assert!(counted.updated_at >= job.updated_at, "stamped");
    assert_eq!(read(store, &id).await.enqueues, 1, "the count is stored");
    assert_eq!(
        entry_in(store, "pending", &id).await,
        Some(far(2).to_rfc3339()),
        "the entry is keyed at the next look"
    );
    let again = store.count_enqueue(&id, far(3)).await.expect("again");
    assert_eq!(again.enqueues, 2, "each re-enqueue counts");
    assert_eq!(entry_in(store, "pending", &id).await, Some(far(3).to_rfc3339()));

    // A waiting job's entry stays in `waiting`: the write moves the sort key only.
    let waits = created(store, "enqueue-waiting").await.job_id.clone();
    let waiting =
        Waiting { reason: WaitReason::TenantLimit, limit: 1, since: far(4), position: "p".into() };
    store.mark_waiting(&waits, &waiting).await.expect("a pending job waits");
    store.count_enqueue(&waits, far(5)).await.expect("a waiting job is pending");
    assert_eq!(entry_in(store, "waiting", &waits).await, Some(far(5).to_rfc3339()));
    assert_eq!(entry_in(store, "pending", &waits).await, None, "… and not in `pending`");

    let moved_on = queued(store, "enqueue-queued", "contract-e", Some(1)).await;
    let current = refused(store.count_enqueue(&moved_on, far(6)).await, "a queued job")
        .expect("the refusal carries the record");
    assert_eq!((current.status, current.enqueues), (JobStatus::Queued, 0), "as it is");
    assert_eq!(read(store, &moved_on).await.enqueues, 0, "a refusal counts nothing");
    assert_eq!(
        entry_in(store, "queued", &moved_on).await,
        Some(far(1).to_rfc3339()),
        "a refusal moves no entry"
    );
    let missing = JobId::new();
    assert!(refused(store.count_enqueue(&missing, far(6)).await, "a missing job").is_none());
    assert!(store.job(&missing).await.unwrap().is_none(), "a refusal writes no record");
    for id in [&id, &waits, &moved_on] {
        end(store, id).await;
    }
}

async fn a_deferred_look_moves_only_the_entry(store: &impl ReapedTable) {
    let job = created(store, "defer").await;
    let id = job.job_id.clone();
    store.defer_pending_look(&id, far(7)).await.expect("a pending job's look is deferred");
    assert_eq!(entry_in(store, "pending", &id).await, Some(far(7).to_rfc3339()));
    let after = read(store, &id).await;
    assert_eq!(
        (after.enqueues, after.updated_at, after.status),
        (job.enqueues, job.updated_at, JobStatus::Pending),
        "nothing else changes"
    );
    end(store, &id).await;
    let current = refused(store.defer_pending_look(&id, far(8)).await, "an ended job")
        .expect("the refusal carries the record");
    assert_eq!(current.status, JobStatus::Cancelled);
    assert_eq!(entry_in(store, "pending", &id).await, None, "an ended job gets no entry back");
    let missing = JobId::new();
    assert!(refused(store.defer_pending_look(&missing, far(8)).await, "a missing job").is_none());
}

async fn a_queued_job_is_redispatched_once_per_dispatch(store: &impl ReapedTable) {
    let id = queued(store, "redispatch", "contract-r-1", Some(1)).await;
    let before = format_rfc3339(Utc::now() - chrono::Duration::seconds(1));
    let job = store.redispatch_queued(&id, 1, "contract-r-2").await.expect("re-dispatched");
    let after = format_rfc3339(Utc::now() + chrono::Duration::seconds(1));
    assert_eq!(
        (job.status, job.dispatches, job.execution.as_deref()),
        (JobStatus::Queued, 2, Some("contract-r-2")),
        "the next dispatch, in the new execution"
    );
    let at = entry_in(store, "queued", &id).await.expect("still in `queued`");
    assert!(before <= at && at <= after, "indexed now: {at}");
    let current = refused(store.redispatch_queued(&id, 1, "contract-r-2b").await, "seen twice")
        .expect("the refusal carries the record");
    assert_eq!(
        (current.dispatches, current.execution.as_deref()),
        (2, Some("contract-r-2")),
        "of two reapers that saw dispatch 1, one re-dispatches"
    );

    // A job with no dispatch count reads as 0 dispatches.
    let uncounted = queued(store, "redispatch-uncounted", "contract-u-0", None).await;
    let job = store.redispatch_queued(&uncounted, 0, "contract-u-1").await.expect("from 0");
    assert_eq!(job.dispatches, 1);
    assert!(refused(store.redispatch_queued(&uncounted, 0, "x").await, "0 again").is_some());

    let pending = created(store, "redispatch-pending").await.job_id.clone();
    let current = refused(store.redispatch_queued(&pending, 0, "x").await, "a pending job")
        .expect("the refusal carries the record");
    assert_eq!((current.status, current.execution), (JobStatus::Pending, None), "unchanged");
    let missing = JobId::new();
    assert!(refused(store.redispatch_queued(&missing, 0, "x").await, "a missing job").is_none());
    for id in [&id, &uncounted, &pending] {
        end(store, id).await;
    }
}

async fn a_stall_is_flagged_and_cleared_once_under_the_lease(store: &impl ReapedTable) {
    let (id, lease) = running(store, "stall").await;
    let claimed = read(store, &id).await;
    let at = Timestamp::now();
    store.mark_stalled(&id, &lease.token, Some(at)).await.expect("a stall is flagged");
    let flagged = read(store, &id).await;
    assert_eq!(flagged.stalled_at, Some(at), "flagged at the given time");
    assert_eq!(
        (flagged.updated_at, flagged.status),
        (claimed.updated_at, JobStatus::Running),
        "nothing else changes"
    );
    let current = refused(
        store.mark_stalled(&id, &lease.token, Some(Timestamp::now())).await,
        "a flag set twice",
    )
    .expect("the refusal carries the record");
    assert_eq!(current.stalled_at, Some(at), "the first flag stands");
    assert!(
        refused(store.mark_stalled(&id, "another-lease", None).await, "another lease").is_some()
    );
    assert_eq!(read(store, &id).await.stalled_at, Some(at), "another lease clears nothing");
    store.mark_stalled(&id, &lease.token, None).await.expect("a flag is cleared");
    assert_eq!(read(store, &id).await.stalled_at, None);
    assert!(refused(store.mark_stalled(&id, &lease.token, None).await, "cleared twice").is_some());
    end(store, &id).await;
    let current = refused(store.mark_stalled(&id, &lease.token, Some(at)).await, "an ended job")
        .expect("the refusal carries the record");
    assert_eq!((current.status, current.stalled_at), (JobStatus::Cancelled, None));
    let missing = JobId::new();
    assert!(refused(store.mark_stalled(&missing, "l", Some(at)).await, "a missing job").is_none());
}

async fn progress_records_are_read_by_job(store: &impl ReapedTable) {
    let (first, first_lease) = running(store, "progress-a").await;
    let (second, second_lease) = running(store, "progress-b").await;
    // A first claim makes no record: each attempt's first write does.
    for (id, lease) in [(&first, &first_lease), (&second, &second_lease)] {
        let write = ProgressRecord { seq: 1, lease: lease.token.clone(), ..Default::default() };
        store.record_progress(id, &write).await.expect("the first write");
    }
    let pending = created(store, "progress-none").await.job_id.clone();
    // More ids than one request of the AWS adapter reads, most of them no job's.
    let mut ids: Vec<JobId> = (0..150).map(|_| JobId::new()).collect();
    ids.insert(3, first.clone());
    ids.insert(120, second.clone());
    ids.push(pending.clone());
    let records = store.progress_records(&ids).await.expect("a batch read");
    let mut found: Vec<&JobId> = records.keys().collect();
    found.sort_unstable();
    let mut expected = vec![&first, &second];
    expected.sort_unstable();
    assert_eq!(found, expected, "each job with a record, by its id; the others missing");
    assert_eq!(records[&first].lease, first_lease.token, "each job's own record");
    assert_eq!(records[&second].lease, second_lease.token);
    assert!(store.progress_records(&[]).await.expect("no ids").is_empty());
    for id in [&first, &second, &pending] {
        end(store, id).await;
    }
}
