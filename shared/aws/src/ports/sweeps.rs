//! What the reaper and the expirer read: pages of the status index, where unfinished sweeps
//! stopped, and pages of a count of a bucket's entries.
//!
//! The status index (`StatusIndex`, see [`crate::jobs::STATUS_INDEX`]) holds a job record
//! under `<bucket>#<shard>` (its status, or `waiting`) and a sort key that says when the entry
//! becomes interesting (created, queued, claimed, the result's expiry, expired). A sweep pages
//! through one bucket's shard oldest first; the place where a page ends is a [`SweepCursor`],
//! opaque to the sweep, which hands it back to read on or saves it for the next run.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;

use longhaul_domain::JobId;

use super::Warm;
use crate::jobs::{Item, JobEntry, JobStore, StoreError};

/// Where a sweep of one status-index shard goes on from: the keys of the last entry a page
/// held. Opaque to the sweep: it hands the cursor back to read the next page, or saves it
/// ([`SweepCursors::save_sweep_cursor`]) for the next run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepCursor(BTreeMap<String, String>);

impl SweepCursor {
    /// A cursor of the given key attributes (an adapter's own; a sweep never builds one).
    pub fn from_keys(keys: impl IntoIterator<Item = (String, String)>) -> Self {
        SweepCursor(keys.into_iter().collect())
    }

    /// The key attribute `name`, if the cursor has it.
    pub fn key(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// A DynamoDB key (`LastEvaluatedKey`, or a saved cursor) as a cursor; `None` if an
    /// attribute is not a string (the status index's keys all are).
    fn from_item(item: Item) -> Option<Self> {
        item.into_iter()
            .map(|(name, value)| Some((name, value.as_s().ok()?.clone())))
            .collect::<Option<BTreeMap<_, _>>>()
            .map(SweepCursor)
    }

    /// The cursor as the DynamoDB key it was read from.
    fn into_item(self) -> Item {
        self.0.into_iter().map(|(name, value)| (name, AttributeValue::S(value))).collect()
    }
}

/// One entry of a status-index page.
#[derive(Debug)]
pub struct IndexEntry {
    /// The job, from the entry's key.
    pub job_id: JobId,
    /// The entry's sort key: when it became interesting (for a `succeeded` job, when its
    /// result expires; for an `expired` one, when it expired).
    pub at: String,
    /// The job as the index projects it, or why it cannot be read.
    pub job: Result<JobEntry, StoreError>,
}

/// One page of a status-index shard (see [`StatusIndex::due_page`]).
#[derive(Debug, Default)]
pub struct IndexPage {
    /// The page's entries, oldest first; an entry that is not a job's (no job key or no sort
    /// key) is an error in its place, so one bad entry holds none of the others up.
    pub entries: Vec<Result<IndexEntry, StoreError>>,
    /// Where the next page starts; `None` once the shard is done. A full page always names
    /// one, even when nothing follows (the next page is then empty), as DynamoDB does.
    pub next: Option<SweepCursor>,
}

/// One page of a count of a status-index shard (see [`StatusIndex::count_page`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CountPage {
    /// The entries the page counted (at most its limit).
    pub count: u64,
    /// Where the next page of the count starts; `None` once the shard is counted. A full page
    /// always names one, even when nothing follows, as DynamoDB does.
    pub next: Option<SweepCursor>,
}

/// Reading the status index.
#[async_trait]
pub trait StatusIndex: Warm {
    /// One page of bucket `kind` (a status, or `waiting`), shard `shard`: up to `limit`
    /// entries whose sort key is before `before`, oldest first, starting after `start` (the
    /// previous page's [`IndexPage::next`]). Sweeps that must see every entry, whatever their
    /// number, page with it.
    async fn due_page(
        &self,
        kind: &str,
        shard: u32,
        before: &str,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<IndexPage, StoreError>;

    /// One page of a count of bucket `kind`, shard `shard`: how many entries (of any sort key)
    /// follow `start` (the previous page's [`CountPage::next`]), up to `limit`, and where the
    /// next page starts. One request, whatever the bucket holds (only the count crosses the
    /// wire, but the entries are read, and billed, all the same): a count that must stay
    /// bounded reads only as many pages as it can afford, and knows whether it reached the end.
    async fn count_page(
        &self,
        kind: &str,
        shard: u32,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<CountPage, StoreError>;
}

/// Where unfinished sweeps stopped, kept from one run to the next (one read per run).
#[async_trait]
pub trait SweepCursors: Warm {
    /// The saved cursors by sweep name ([`crate::jobs::sweep_name`]); a sweep missing from it
    /// starts from its shard's oldest entry.
    async fn sweep_cursors(&self) -> Result<HashMap<String, SweepCursor>, StoreError>;

    /// Records where the sweep `name` stopped (`Some`: the next run starts there) or that it
    /// reached the end (`None`: the next run starts from the oldest entry).
    async fn save_sweep_cursor(
        &self,
        name: &str,
        start: Option<SweepCursor>,
    ) -> Result<(), StoreError>;
}

/// An index item as a page entry: its job id and sort key from its keys alone (both are index
/// keys, so any projection holds them), and the job as projected.
pub(crate) fn index_entry(item: Item) -> Result<IndexEntry, StoreError> {
    let get = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let pk = get("pk");
    let keys = pk.as_deref().and_then(|pk| pk.strip_prefix("JOB#")?.parse::<JobId>().ok());
    match (keys, get("gsi2sk")) {
        (Some(job_id), Some(at)) => Ok(IndexEntry { job_id, at, job: JobStore::entry_from(item) }),
        _ => Err(StoreError::Corrupt {
            key: format!("{pk:?}"),
            reason: "a status-index entry without a job id or sort key".into(),
        }),
    }
}

/// A page's `LastEvaluatedKey` as the cursor the next page of shard `kind#shard` starts from.
fn next_cursor(
    kind: &str,
    shard: u32,
    key: Option<Item>,
) -> Result<Option<SweepCursor>, StoreError> {
    key.map(|key| {
        SweepCursor::from_item(key).ok_or_else(|| StoreError::Corrupt {
            key: format!("{kind}#{shard}"),
            reason: "the index page's last key is not all strings".into(),
        })
    })
    .transpose()
}

#[async_trait]
impl StatusIndex for JobStore {
    async fn due_page(
        &self,
        kind: &str,
        shard: u32,
        before: &str,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<IndexPage, StoreError> {
        let page =
            JobStore::due_page(self, kind, shard, before, limit, start.map(SweepCursor::into_item))
                .await?;
        let next = next_cursor(kind, shard, page.next)?;
        Ok(IndexPage { entries: page.items.into_iter().map(index_entry).collect(), next })
    }

    async fn count_page(
        &self,
        kind: &str,
        shard: u32,
        limit: usize,
        start: Option<SweepCursor>,
    ) -> Result<CountPage, StoreError> {
        let (count, next) =
            JobStore::count_page(self, kind, shard, limit, start.map(SweepCursor::into_item))
                .await?;
        let next = next_cursor(kind, shard, next)?;
        Ok(CountPage { count, next })
    }
}

#[async_trait]
impl SweepCursors for JobStore {
    async fn sweep_cursors(&self) -> Result<HashMap<String, SweepCursor>, StoreError> {
        // A saved cursor that is not all strings cannot be one this adapter saved: its sweep
        // starts from the oldest entry (nothing is skipped, some are read again).
        Ok(JobStore::sweep_cursors(self)
            .await?
            .into_iter()
            .filter_map(|(name, item)| Some((name, SweepCursor::from_item(item)?)))
            .collect())
    }

    async fn save_sweep_cursor(
        &self,
        name: &str,
        start: Option<SweepCursor>,
    ) -> Result<(), StoreError> {
        JobStore::save_sweep_cursor(self, name, start.map(SweepCursor::into_item)).await
    }
}

impl IndexEntry {
    /// The cursor of a sweep that stopped right after this entry of bucket `kind`, shard
    /// `shard` — what a sweep that must not see an entry twice saves when its last page ended
    /// short (a short page names no next key).
    pub fn cursor_after(&self, kind: &str, shard: u32) -> SweepCursor {
        SweepCursor::from_keys([
            ("pk".to_owned(), crate::jobs::job_pk(&self.job_id)),
            ("sk".to_owned(), crate::jobs::JOB_SK.to_owned()),
            ("gsi2pk".to_owned(), format!("{kind}#{shard}")),
            ("gsi2sk".to_owned(), self.at.clone()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttributeValue::S;

    #[test]
    fn an_entry_is_read_from_its_keys_alone() {
        let id = JobId::new();
        let item: Item = [
            ("pk".to_owned(), S(format!("JOB#{id}"))),
            ("sk".to_owned(), S("JOB".into())),
            ("gsi2sk".to_owned(), S("2025-01-01T00:00:00.000Z".into())),
        ]
        .into();
        let entry = index_entry(item).unwrap();
        assert_eq!((&entry.job_id, entry.at.as_str()), (&id, "2025-01-01T00:00:00.000Z"));
        assert!(entry.job.is_err(), "a keys-only item is no readable job entry");
        let foreign: Item = [("pk".to_owned(), S("SWEEP#x".into()))].into();
        assert!(index_entry(foreign).is_err());
        let not_a_job_id: Item = [
            ("pk".to_owned(), S("JOB#j1".into())),
            ("gsi2sk".to_owned(), S("2025-01-01T00:00:00.000Z".into())),
        ]
        .into();
        assert!(index_entry(not_a_job_id).is_err(), "an unreadable id is an error, not a job");
    }

    #[test]
    fn a_cursor_is_the_key_it_was_read_from() {
        let key: Item = [
            ("pk".to_owned(), S("JOB#j1".into())),
            ("gsi2pk".to_owned(), S("succeeded#1".into())),
            ("gsi2sk".to_owned(), S("2025-01-01T00:00:00.000Z".into())),
        ]
        .into();
        let cursor = SweepCursor::from_item(key.clone()).unwrap();
        assert_eq!(cursor.key("gsi2pk"), Some("succeeded#1"));
        assert_eq!(cursor.into_item(), key);
        let numeric: Item = [("n".to_owned(), AttributeValue::N("1".into()))].into();
        assert_eq!(SweepCursor::from_item(numeric), None);
    }
}
