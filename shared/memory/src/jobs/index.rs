//! The job table's sparse status index in memory, with what the sweeps keep beside it: the
//! saved sweep cursors and the records' TTL marks.
//!
//! A job's entry moves as the AWS adapter's writes move it: a new job enters `pending` at its
//! creation (a delayed one at [`pending_index_at`]), a transition to `queued`, `running`,
//! `succeeded` or `expired` moves it to that bucket under the request's `index_at` (default:
//! now), any other transition takes it out, [`JobDispatchMarks::mark_waiting`] moves it to
//! `waiting` under the wait's start, and [`JobRetention::retain_until`] takes it out for good.
//! Pages are read as DynamoDB reads them: by sort key, then item key; a full page names its
//! last entry as the cursor even when nothing follows.

use super::*;
use longhaul_domain::JobId;

use longhaul_aws::jobs::{JOB_SK, WAITING_BUCKET, status_bucket};
use longhaul_aws::ports::{
    CountPage, IndexEntry, IndexPage, JobRetention, StatusIndex, SweepCursor, SweepCursors,
};
use longhaul_aws::{AwsError, Refusal};
use longhaul_domain::format_rfc3339;
use longhaul_domain::schedule::pending_index_at;

/// The index and the sweeps' state.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Entries by their item's key (`JOB#<id>` for a job record): bucket (`<kind>#<shard>`)
    /// and sort key.
    entries: HashMap<String, (String, String)>,
    /// TTL marks (epoch seconds) by job id: the job record's and the progress record's.
    retained: HashMap<JobId, (Option<i64>, Option<i64>)>,
    /// Saved sweep cursors by name.
    cursors: HashMap<String, SweepCursor>,
    /// Count pages answered ([`StatusIndex::count_page`] calls that reached the table).
    count_pages: usize,
}

fn item_key(job_id: &JobId) -> String {
    format!("JOB#{job_id}")
}

impl Index {
    /// A new job enters its status: `pending`, or `queued` when written already dispatched.
    pub(super) fn created(&mut self, job: &JobRecord) {
        let at = match job.not_before {
            Some(at) => format_rfc3339(pending_index_at(at.as_datetime(), chrono::Utc::now())),
            None => job.created_at.to_rfc3339(),
        };
        self.put(&job.job_id, job.status.as_str(), at);
    }

    /// A transition to `to` moves the job's entry (or takes it out).
    pub(super) fn moved(
        &mut self,
        job_id: &JobId,
        to: JobStatus,
        index_at: Option<&str>,
        now: &str,
    ) {
        match to {
            JobStatus::Pending
            | JobStatus::Queued
            | JobStatus::Running
            | JobStatus::Paused
            | JobStatus::Compensating
            | JobStatus::Succeeded
            | JobStatus::Expired => {
                self.put(job_id, to.as_str(), index_at.unwrap_or(now).to_owned())
            }
            _ => {
                self.entries.remove(&item_key(job_id));
            }
        }
    }

    /// A pending job waits for a running slot since `since`.
    pub(super) fn waiting(&mut self, job_id: &JobId, since: &str) {
        self.put(job_id, WAITING_BUCKET, since.to_owned());
    }

    /// A write that sets `gsi2sk` alone moves the job's entry to sort key `at` in the bucket
    /// it is in (the reaper's next look); a job without an entry stays without one.
    pub(super) fn resorted(&mut self, job_id: &JobId, at: &str) {
        if let Some((_, key)) = self.entries.get_mut(&item_key(job_id)) {
            *key = at.to_owned();
        }
    }

    fn put(&mut self, job_id: &JobId, kind: &str, at: String) {
        self.entries.insert(item_key(job_id), (status_bucket(kind, job_id), at));
    }
}

impl MemoryJobStore {
    /// The job's status-index entry, if it has one: its bucket (`<kind>#<shard>`) and sort key.
    pub fn index_entry(&self, job_id: &JobId) -> Option<(String, String)> {
        self.lock().index.entries.get(&item_key(job_id)).cloned()
    }

    /// Puts the job's status-index entry in bucket `kind` (of its shard) under `at` (a test's
    /// arrangement: a job a sweep must find, or an entry a concurrent write left behind).
    pub fn put_index_entry(&self, job_id: &JobId, kind: &str, at: &str) {
        self.lock().index.put(job_id, kind, at.to_owned());
    }

    /// Puts an entry that is not a job record's (item key `key`) in bucket `kind`, shard
    /// `shard`, under `at`: what a sweep cannot read.
    pub fn put_stray_index_entry(&self, key: &str, kind: &str, shard: u32, at: &str) {
        self.lock()
            .index
            .entries
            .insert(key.to_owned(), (format!("{kind}#{shard}"), at.to_owned()));
    }

    /// How many count pages ([`StatusIndex::count_page`]) the table has answered: the
    /// requests a count cost.
    pub fn count_pages_read(&self) -> usize {
        self.lock().index.count_pages
    }

    /// The TTL mark (epoch seconds) [`JobRetention::retain_until`] set on the job record.
    pub fn retained_until(&self, job_id: &JobId) -> Option<i64> {
        self.lock().index.retained.get(job_id).and_then(|(job, _)| *job)
    }

    /// The TTL mark [`JobRetention::retain_until`] set on the job's progress record.
    pub fn progress_retained_until(&self, job_id: &JobId) -> Option<i64> {
        self.lock().index.retained.get(job_id).and_then(|(_, progress)| *progress)
    }
}

/// Where a page of shard `bucket` (`<kind>#<shard>`) starts after: the sort key and item key
/// of cursor `start`, or an error as DynamoDB refuses a starting key that is not the shard's.
fn start_after<'a>(
    start: &'a Option<SweepCursor>,
    bucket: &str,
    doing: &str,
) -> Result<Option<(&'a str, &'a str)>, StoreError> {
    match start {
        None => Ok(None),
        Some(cursor) => match (cursor.key("gsi2sk"), cursor.key("pk"), cursor.key("gsi2pk")) {
            (Some(at), Some(key), Some(of)) if of == bucket => Ok(Some((at, key))),
            _ => Err(AwsError {
                context: doing.to_owned(),
                detail: "The provided starting key is invalid".into(),
                refusal: Some(Refusal::Invalid),
            }
            .into()),
        },
    }
}

impl Index {
    /// Up to `limit` entries (sort key, item key) of shard `bucket` whose sort key is before
    /// `before` (if given), after `after`, in the index's order; and the cursor of the last one
    /// if the page is full.
    fn page<'a>(
        &'a self,
        bucket: &str,
        before: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> (Vec<(&'a str, &'a str)>, Option<SweepCursor>) {
        let limit = limit.clamp(1, i32::MAX as usize);
        let mut page: Vec<(&str, &str)> = self
            .entries
            .iter()
            .filter(|(_, (b, at))| *b == bucket && before.is_none_or(|before| at.as_str() < before))
            .map(|(key, (_, at))| (at.as_str(), key.as_str()))
            .filter(|position| after.is_none_or(|after| *position > after))
            .collect();
        page.sort_unstable();
        page.truncate(limit);
        let next = (page.len() == limit).then(|| {
            let (at, key) = page[page.len() - 1];
            cursor_of(key, bucket, at)
        });
        (page, next)
    }
}

/// The cursor DynamoDB names after an entry: the table's keys and the index's.
fn cursor_of(key: &str, bucket: &str, at: &str) -> SweepCursor {
    SweepCursor::from_keys([
        ("pk".to_owned(), key.to_owned()),
        ("sk".to_owned(), JOB_SK.to_owned()),
        ("gsi2pk".to_owned(), bucket.to_owned()),
        ("gsi2sk".to_owned(), at.to_owned()),
    ])
}

#[async_trait]
impl StatusIndex for MemoryJobStore {
    async fn due_page(
        &self,
        kind: &str,
        shard: u32,
        before: &str,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<IndexPage, StoreError> {
        let doing = format!("query the {kind} index (shard {shard})");
        self.check(&doing)?;
        let bucket = format!("{kind}#{shard}");
        let after = start_after(&start, &bucket, &doing)?;
        let table = self.lock();
        let (page, next) = table.index.page(&bucket, Some(before), after, limit);
        let entries = page
            .into_iter()
            .map(|(at, key)| {
                let job_id: JobId = key
                    .strip_prefix("JOB#")
                    .and_then(|id| id.parse().ok())
                    .ok_or_else(|| StoreError::Corrupt {
                        key: format!("{key:?}"),
                        reason: "a status-index entry without a job id or sort key".into(),
                    })?;
                let job = table.jobs.get(&job_id).map(JobEntry::from).ok_or_else(|| {
                    StoreError::Corrupt { key: key.to_owned(), reason: "no job record".into() }
                });
                Ok(IndexEntry { job_id, at: at.to_owned(), job })
            })
            .collect();
        Ok(IndexPage { entries, next })
    }

    async fn count_page(
        &self,
        kind: &str,
        shard: u32,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<CountPage, StoreError> {
        let doing = format!("count the {kind} index (shard {shard})");
        self.check(&doing)?;
        let bucket = format!("{kind}#{shard}");
        let after = start_after(&start, &bucket, &doing)?;
        let mut table = self.lock();
        table.index.count_pages += 1;
        let (page, next) = table.index.page(&bucket, None, after, limit);
        Ok(CountPage { count: page.len() as u64, next })
    }
}

#[async_trait]
impl SweepCursors for MemoryJobStore {
    async fn sweep_cursors(&self) -> Result<HashMap<String, SweepCursor>, StoreError> {
        self.check("read the sweep cursors")?;
        Ok(self.lock().index.cursors.clone())
    }

    async fn save_sweep_cursor(
        &self,
        name: &str,
        start: Option<SweepCursor>,
    ) -> Result<(), StoreError> {
        self.check(&format!("save the {name} sweep cursor"))?;
        let cursors = &mut self.lock().index.cursors;
        match start {
            Some(start) => cursors.insert(name.to_owned(), start),
            None => cursors.remove(name),
        };
        Ok(())
    }
}

#[async_trait]
impl JobRetention for MemoryJobStore {
    async fn retain_until(&self, job_id: &JobId, epoch_seconds: i64) -> Result<(), StoreError> {
        self.check(&format!("set retention of {job_id}"))?;
        let table = &mut *self.lock();
        let (has_progress, has_job) =
            (table.progress.contains_key(job_id), table.jobs.contains_key(job_id));
        if !(has_progress || has_job) {
            return Ok(());
        }
        let marks = table.index.retained.entry(job_id.to_owned()).or_default();
        if has_progress {
            marks.1 = Some(epoch_seconds);
        }
        if has_job {
            marks.0 = Some(epoch_seconds);
            table.index.entries.remove(&item_key(job_id));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_status_index_contract() {
        crate::contract::status_index(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn a_stray_entry_reads_as_an_error_in_its_place() {
        let store = MemoryJobStore::new();
        store.put_stray_index_entry("SWEEP#x", "succeeded", 2, "2001-01-01T00:00:00.000Z");
        let page = store.due_page("succeeded", 2, "2002", 10, None).await.unwrap();
        assert_eq!(page.entries.len(), 1);
        assert!(page.entries[0].is_err());
        let counted = store.count_page("succeeded", 2, 10, None).await.unwrap();
        assert_eq!(counted, CountPage { count: 1, next: None }, "a stray entry is counted");
        assert_eq!(store.count_pages_read(), 1);
    }

    #[tokio::test]
    async fn a_cursor_of_another_bucket_is_refused() {
        let store = MemoryJobStore::new();
        let cursor = cursor_of("JOB#x", "queued#1", "2001");
        assert!(store.due_page("succeeded", 1, "2002", 10, Some(cursor)).await.is_err());
    }
}
