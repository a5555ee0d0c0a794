//! The status index's contract ([`StatusIndex`], [`SweepCursors`], [`JobRetention`]): a job's
//! entry is in the bucket of its status (its shard's), under the sort key the write that moved
//! it gave (a new job's: its creation, in the status it is written in), and in no other bucket; a job that ends otherwise leaves the index; pages hold the
//! entries before `before`, oldest first, each once, and end; a cursor goes on where its page
//! stopped, saved and read back or not; a count reads a shard page by page, each page counting
//! at most its limit, and its pages together count the shard's entries; marking a job for its
//! TTL takes it out of the index, may be repeated, and skips a job that is not there.
//!
//! Whether a full page names a cursor when nothing follows is left open: DynamoDB does (the
//! next page is then empty), the local stack's emulator does not, and no sweep depends on it.

use chrono::{Duration as Span, Utc};
use longhaul_aws::jobs::{JobRecord, TransitionRequest, status_bucket, sweep_name};
use longhaul_aws::ports::{
    CountPage, IndexEntry, JobCreation, JobDispatchMarks, JobReads, JobRetention, JobTransitions,
    StatusIndex, SweepCursor, SweepCursors,
};
use longhaul_domain::Owner;
use longhaul_domain::admission::{WaitReason, Waiting};
use longhaul_domain::{JobId, JobStatus, Timestamp, format_rfc3339};

use super::{fresh_owner, pending_job};

/// Every port the sweeps use, with those that arrange the jobs they find.
pub trait SweptTable:
    JobReads
    + JobCreation
    + JobTransitions
    + JobDispatchMarks
    + StatusIndex
    + SweepCursors
    + JobRetention
{
}

impl<T> SweptTable for T where
    T: JobReads
        + JobCreation
        + JobTransitions
        + JobDispatchMarks
        + StatusIndex
        + SweepCursors
        + JobRetention
{
}

/// Later than any sort key.
const END: &str = "9999-12-31T23:59:59.999Z";

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
///
/// Its jobs are fresh; the ones it leaves in `pending`, `waiting`, `queued` or `running` are
/// indexed where no reaper sweep looks (the future) or moved on within the clause.
pub async fn status_index(store: &impl SweptTable) {
    an_entry_follows_its_job(store).await;
    pages_hold_what_is_due_oldest_first_and_end(store).await;
    a_saved_cursor_goes_on_where_it_stopped(store).await;
    a_count_goes_page_by_page_and_counts_every_entry(store).await;
    retention_takes_a_job_out_of_the_index(store).await;
}

/// The shard of `job_id`'s entries.
pub fn shard_of(job_id: &JobId) -> u32 {
    let bucket = status_bucket("any", job_id);
    bucket.rsplit('#').next().and_then(|s| s.parse().ok()).expect("a bucket ends in its shard")
}

/// Every entry of bucket `kind`'s shard `shard` before `before`, page by page (`limit` each),
/// with the number of pages read.
async fn sweep_all(
    store: &impl SweptTable,
    kind: &str,
    shard: u32,
    before: &str,
    limit: usize,
) -> (Vec<IndexEntry>, usize) {
    let mut entries = Vec::new();
    let mut start: Option<SweepCursor> = None;
    for pages in 1.. {
        assert!(pages < 10_000, "the pages of {kind}#{shard} end");
        let page = store.due_page(kind, shard, before, limit, start).await.expect("a page");
        assert!(page.entries.len() <= limit, "a page holds at most its limit");
        entries.extend(page.entries.into_iter().map(|e| e.expect("a job's entry reads")));
        match page.next {
            Some(next) => start = Some(next),
            None => return (entries, pages),
        }
    }
    unreachable!()
}

/// `job_id`'s entry in bucket `kind`, if it is there.
async fn entry_in(store: &impl SweptTable, kind: &str, job_id: &JobId) -> Option<IndexEntry> {
    let (entries, _) = sweep_all(store, kind, shard_of(job_id), END, 50).await;
    let mut mine: Vec<IndexEntry> = entries.into_iter().filter(|e| e.job_id == *job_id).collect();
    assert!(mine.len() <= 1, "{job_id} is in {kind} once: {mine:?}");
    mine.pop()
}

async fn moved(store: &impl SweptTable, request: TransitionRequest) -> JobRecord {
    let what = format!("{:?} → {}", request.from, request.to);
    store.transition(request).await.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A job of `owner` created now, in shard `shard` if given.
async fn created(store: &impl SweptTable, owner: &Owner, shard: Option<u32>) -> JobRecord {
    let job = loop {
        let job = pending_job(owner, Timestamp::now());
        if shard.is_none_or(|s| shard_of(&job.job_id) == s) {
            break job;
        }
    };
    store.put_job(&job).await.expect("a new job is written");
    job
}

/// A job of `owner` in shard `shard`, succeeded with its result expiring at `expires`.
async fn succeeded(store: &impl SweptTable, owner: &Owner, shard: u32, expires: &str) -> JobRecord {
    let job = created(store, owner, Some(shard)).await;
    let id = job.job_id.clone();
    let steps = [
        (JobStatus::Pending, JobStatus::Queued, END),
        (JobStatus::Queued, JobStatus::Running, END),
        (JobStatus::Running, JobStatus::Succeeded, expires),
    ];
    let mut job = job;
    for (from, to, at) in steps {
        let mut request =
            TransitionRequest::new(&id, &[from], to, "arranged").indexed_at(at.into());
        if to == JobStatus::Running {
            request = request.set("lease", "lease-s").set("attempt", 1);
        }
        job = moved(store, request).await;
    }
    job
}

async fn an_entry_follows_its_job(store: &impl SweptTable) {
    let owner = fresh_owner("index");
    let job = created(store, &owner, None).await;
    let id = job.job_id.clone();
    let entry = entry_in(store, "pending", &id).await.expect("a new job is in `pending`");
    assert_eq!(entry.at, job.created_at.to_rfc3339(), "a new job is indexed at its creation");
    let read = entry.job.expect("the entry reads as the job");
    assert_eq!((&read.job_id, read.status), (&id, JobStatus::Pending));
    assert_eq!(read.owner, owner);

    let since = Timestamp::now().to_rfc3339();
    let waiting = Waiting {
        reason: WaitReason::TenantLimit,
        limit: 1,
        since: since.parse().unwrap(),
        position: "p".into(),
    };
    store.mark_waiting(&id, &waiting).await.expect("a pending job waits");
    let entry = entry_in(store, "waiting", &id).await.expect("a waiting job is in `waiting`");
    assert_eq!(entry.at, since, "a waiting job is indexed at the wait's start");
    assert!(entry_in(store, "pending", &id).await.is_none(), "… and no longer in `pending`");

    let steps = [
        (JobStatus::Pending, "waiting", JobStatus::Queued, "9999-01-01T00:00:00.000Z"),
        (JobStatus::Queued, "queued", JobStatus::Running, "9999-01-02T00:00:00.000Z"),
        (JobStatus::Running, "running", JobStatus::Succeeded, "9999-01-03T00:00:00.000Z"),
    ];
    for (from, left, to, at) in steps {
        let mut request = TransitionRequest::new(&id, &[from], to, "moved").indexed_at(at.into());
        if to == JobStatus::Running {
            request = request.set("lease", "lease-i").set("attempt", 1);
        }
        moved(store, request).await;
        let entry = entry_in(store, to.as_str(), &id).await;
        assert_eq!(entry.map(|e| e.at).as_deref(), Some(at), "{to} is indexed at the write's key");
        assert!(entry_in(store, left, &id).await.is_none(), "{to}: no longer in {left}");
    }
    let before = format_rfc3339(Utc::now() - Span::seconds(1));
    let request = TransitionRequest::new(&id, &[JobStatus::Succeeded], JobStatus::Expired, "old");
    moved(store, request).await;
    let after = format_rfc3339(Utc::now() + Span::seconds(1));
    let entry = entry_in(store, "expired", &id).await.expect("an expired job is in `expired`");
    assert!(before <= entry.at && entry.at <= after, "indexed now by default: {}", entry.at);
    assert!(entry_in(store, "succeeded", &id).await.is_none());

    let other = created(store, &owner, None).await;
    let other_id = other.job_id.clone();
    let request =
        TransitionRequest::new(&other_id, &[JobStatus::Pending], JobStatus::Cancelled, "gone");
    moved(store, request).await;
    for kind in ["pending", "waiting", "queued", "running", "succeeded", "expired", "cancelled"] {
        assert!(
            entry_in(store, kind, &other_id).await.is_none(),
            "a cancelled job is in no {kind}"
        );
    }

    // A job written already dispatched (submit seats it first) is in `queued` from its write,
    // at its creation (here in the future, where no reaper sweep looks).
    let later = Timestamp::from(Utc::now() + Span::days(36_500));
    let seated =
        JobRecord { status: JobStatus::Queued, dispatches: 1, ..pending_job(&owner, later) };
    let seated_id = seated.job_id.clone();
    store.put_job(&seated).await.expect("a new job is written queued");
    let entry = entry_in(store, "queued", &seated_id).await.expect("written queued: in `queued`");
    assert_eq!(entry.at, later.to_rfc3339(), "indexed at its creation");
    assert!(entry_in(store, "pending", &seated_id).await.is_none(), "… and not in `pending`");
    let request =
        TransitionRequest::new(&seated_id, &[JobStatus::Queued], JobStatus::Cancelled, "gone");
    moved(store, request).await;
}

async fn pages_hold_what_is_due_oldest_first_and_end(store: &impl SweptTable) {
    let owner = fresh_owner("pages");
    let shard = shard_of(&JobId::new());
    // Far in the past, so nothing else on a shared table sorts among them.
    let at = |s: u32| format!("2001-01-01T00:00:0{s}.000Z");
    let mut due = Vec::new();
    // Written out of order: the index orders them.
    for s in [3, 1, 2] {
        due.push((at(s), succeeded(store, &owner, shard, &at(s)).await.job_id.clone()));
    }
    due.sort();
    let not_yet = succeeded(store, &owner, shard, &at(5)).await.job_id.clone();
    let (entries, pages) = sweep_all(store, "succeeded", shard, &at(5), 1).await;
    let mine: Vec<(String, JobId)> = entries
        .iter()
        .filter(|e| e.job.as_ref().is_ok_and(|j| j.owner == owner))
        .map(|e| (e.at.clone(), e.job_id.clone()))
        .collect();
    assert_eq!(mine, due, "every entry before `before`, oldest first, once; none at it");
    assert!(pages >= due.len(), "a page of one holds one entry ({pages} pages)");
    assert!(!mine.iter().any(|(_, id)| *id == not_yet));
    let (entries, _) = sweep_all(store, "succeeded", shard, &at(5), 100).await;
    assert!(entries.len() >= due.len(), "one page of 100 holds them too");
    for other in (0..longhaul_aws::jobs::STATUS_SHARDS).filter(|s| *s != shard) {
        let (entries, _) = sweep_all(store, "succeeded", other, &at(5), 100).await;
        assert!(
            !entries.iter().any(|e| due.iter().any(|(_, id)| *id == e.job_id)),
            "a shard holds only its own jobs"
        );
    }
}

async fn a_saved_cursor_goes_on_where_it_stopped(store: &impl SweptTable) {
    let owner = fresh_owner("cursor");
    let shard = shard_of(&JobId::new());
    let at = |s: u32| format!("2002-01-01T00:00:0{s}.000Z");
    let mut ids = Vec::new();
    for s in 1..=3 {
        ids.push(succeeded(store, &owner, shard, &at(s)).await.job_id.clone());
    }
    let before = at(4);
    let before = before.as_str();
    // Read up to and including the first of ours; its page's cursor goes on after it.
    let mut start = None;
    let cursor = loop {
        let page = store.due_page("succeeded", shard, before, 1, start).await.unwrap();
        let first = page.entries.iter().any(|e| e.as_ref().is_ok_and(|e| e.job_id == ids[0]));
        let next = page.next.expect("a page before the last of ours names where the next starts");
        if first {
            break next;
        }
        start = Some(next);
    };
    let name = sweep_name(&format!("contract-{}", JobId::new()), shard);
    store.save_sweep_cursor(&name, Some(cursor.clone())).await.expect("a cursor is saved");
    let saved = store.sweep_cursors().await.expect("the cursors").remove(&name);
    assert_eq!(saved.as_ref(), Some(&cursor), "a saved cursor reads back as it was");
    let rest = |start: SweepCursor| async move {
        let mut ids = Vec::new();
        let mut start = Some(start);
        while let Some(cursor) = start {
            let page = store.due_page("succeeded", shard, before, 1, Some(cursor)).await.unwrap();
            ids.extend(page.entries.into_iter().map(|e| e.unwrap().job_id));
            start = page.next;
        }
        ids
    };
    let from_saved = rest(saved.unwrap()).await;
    assert_eq!(from_saved, rest(cursor).await, "a saved cursor goes on as the cursor did");
    assert_eq!(from_saved, ids[1..].to_vec(), "it goes on after the page it ended");
    store.save_sweep_cursor(&name, None).await.expect("a sweep that ended is saved");
    assert!(
        !store.sweep_cursors().await.unwrap().contains_key(&name),
        "a sweep saved as ended starts from the oldest entry"
    );
    store.save_sweep_cursor(&name, None).await.expect("saving an end twice is no error");
}

/// Every page of a count of bucket `kind`'s shard `shard`, `limit` entries each, to its end.
async fn count_all(store: &impl SweptTable, kind: &str, shard: u32, limit: usize) -> Vec<u64> {
    let mut counts = Vec::new();
    let mut start = None;
    loop {
        assert!(counts.len() < 10_000, "the count of {kind}#{shard} ends");
        let CountPage { count, next } =
            store.count_page(kind, shard, limit, start).await.expect("a count page");
        assert!(count <= limit as u64, "a count page counts at most its limit: {count}");
        counts.push(count);
        match next {
            Some(next) => start = Some(next),
            None => return counts,
        }
    }
}

async fn a_count_goes_page_by_page_and_counts_every_entry(store: &impl SweptTable) {
    let owner = fresh_owner("count");
    let shard = shard_of(&JobId::new());
    let at = |s: u32| format!("2004-01-01T00:00:0{s}.000Z");
    for s in 1..=3 {
        succeeded(store, &owner, shard, &at(s)).await;
    }
    let first = store.count_page("succeeded", shard, 1, None).await.expect("a count page");
    assert_eq!(first.count, 1, "a page of one counts one");
    let next = first.next.expect("a count that stopped at its limit names where it goes on");
    let rest = store.count_page("succeeded", shard, 1_000, Some(next)).await.expect("a page");
    assert!(rest.count >= 2, "it goes on after the page it ended: {rest:?}");
    // The table may be shared: a count is compared with sweeps of the shard that agree.
    for tries in 1.. {
        let (before, _) = sweep_all(store, "succeeded", shard, END, 100).await;
        let counts = count_all(store, "succeeded", shard, 2).await;
        let (after, _) = sweep_all(store, "succeeded", shard, END, 100).await;
        if before.len() != after.len() && tries < 5 {
            continue;
        }
        let total: u64 = counts.iter().sum();
        assert!(total >= 3, "the count holds our entries: {counts:?}");
        assert_eq!(total, before.len() as u64, "the pages together count every entry once");
        let pages = counts.len() as u64;
        assert!(
            pages == total.div_ceil(2) || pages == total / 2 + 1,
            "pages of two: {total} entries in {pages} pages"
        );
        break;
    }
}

async fn retention_takes_a_job_out_of_the_index(store: &impl SweptTable) {
    let owner = fresh_owner("retain");
    let shard = shard_of(&JobId::new());
    let job = succeeded(store, &owner, shard, "2003-01-01T00:00:00.000Z").await;
    let id = job.job_id.clone();
    let request = TransitionRequest::new(&id, &[JobStatus::Succeeded], JobStatus::Expired, "old")
        .indexed_at("2003-01-02T00:00:00.000Z".into());
    moved(store, request).await;
    assert!(entry_in(store, "expired", &id).await.is_some(), "an expired job waits in `expired`");
    let ttl = Utc::now().timestamp() + 86_400;
    store.retain_until(&id, ttl).await.expect("an expired job is marked");
    assert!(entry_in(store, "expired", &id).await.is_none(), "a marked job leaves the index");
    let read = store.job(&id).await.unwrap().expect("a marked job still reads");
    assert_eq!(read.status, JobStatus::Expired);
    store.retain_until(&id, ttl).await.expect("marking twice is no error");
    let missing = JobId::new();
    store.retain_until(&missing, ttl).await.expect("marking a job that is not there is no error");
    assert!(store.job(&missing).await.unwrap().is_none(), "… and writes no record");
}
