//! The job table in memory: job, progress, idempotency, webhook-secret and delivery records,
//! with the table's conditional writes decided under one lock.

use longhaul_domain::{JobId, Owner};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use longhaul_aws::jobs::{
    CancelOutcome, DeliveryRecord, IdempotencyRecord, JobEntry, JobRecord, JobView, ListError,
    ListFilter, ProgressRecord, Rotation, SecretsRecord, StoreError, TransitionRequest,
    WebhookSecret,
};
use longhaul_aws::ports::{
    DeliveryLog, JobCancellation, JobCreation, JobDispatchMarks, JobListing, JobReads,
    JobTransitions, Warm, WebhookSecrets,
};
use longhaul_domain::admission::Waiting;
use longhaul_domain::cursor::{self, ListPosition};
use longhaul_domain::{Cancellation, JobStatus, Timestamp, Transition};

use crate::Outage;

/// An attempt's writes (the claim, progress, fenced marks): `attempts.rs`.
mod attempts;
/// A compensating job's undos: `compensation.rs`.
mod compensation;
mod index;
/// An owner's pause and resume, and the stage's parking of a paused job: `pausing.rs`.
mod pausing;
/// The reaper's moves (re-enqueue counts, next looks, re-dispatch, stall flags): `reaping.rs`.
mod reaping;
/// A distributed stage's shards: `shards.rs`.
mod shards;
/// A job's signals: `signals.rs`.
mod signals;

#[derive(Debug, Default)]
struct Table {
    jobs: HashMap<JobId, JobRecord>,
    progress: HashMap<JobId, ProgressRecord>,
    keys: HashMap<(Owner, String), IdempotencyRecord>,
    secrets: HashMap<Owner, SecretsRecord>,
    /// Per job, keyed as the table sorts them (`<event>#<attempt>`).
    deliveries: HashMap<JobId, BTreeMap<String, DeliveryRecord>>,
    /// Jobs in their owner's backlog: not yet run, not ended.
    backlog: HashSet<JobId>,
    /// The status index, the sweeps' cursors and the TTL marks (`index.rs`).
    index: index::Index,
    /// Jobs' signals, by job and name (`signals.rs`).
    signals:
        HashMap<(JobId, longhaul_domain::signals::SignalName), longhaul_aws::jobs::SignalRecord>,
    /// Per job, how many signals it keeps (the job record's `signals_kept`).
    signals_kept: HashMap<JobId, u32>,
    /// Distributed stages' shards, by job and shard (`shards.rs`).
    shards: BTreeMap<(JobId, longhaul_aws::jobs::ShardKey), longhaul_aws::jobs::ShardRecord>,
}

/// The job table in memory. Every write is decided under one lock, so it is atomic as a
/// DynamoDB conditional write is; a refused write changes nothing and says why as the AWS
/// adapter does ([`StoreError::Conflict`] with the record as it is, [`StoreError::KeyTaken`]).
#[derive(Debug, Default)]
pub struct MemoryJobStore {
    table: Mutex<Table>,
    outage: Outage,
}

impl MemoryJobStore {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// While `down`, every call fails as an unavailable table does (a retryable AWS error).
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// The job's progress record, if it has one (what a test checks a stage or a cancel by).
    pub fn progress(&self, job_id: &JobId) -> Option<ProgressRecord> {
        self.lock().progress.get(job_id).cloned()
    }

    /// The ids of the jobs that have a progress record, in no particular order (what a test
    /// finds a record written for a job that does not exist by).
    pub fn progress_ids(&self) -> Vec<JobId> {
        self.lock().progress.keys().cloned().collect()
    }

    /// Writes `progress` as the job's progress record, as a stage's hand-over does.
    pub fn put_progress(&self, job_id: &JobId, progress: ProgressRecord) {
        self.lock().progress.insert(job_id.to_owned(), progress);
    }

    /// Replaces a job record as it stands (a test's arrangement of a state the handlers under
    /// test did not make). The job stays in its owner's backlog only while pending or queued.
    pub fn put_record(&self, job: JobRecord) {
        let mut table = self.lock();
        if matches!(job.status, JobStatus::Pending | JobStatus::Queued) && job.attempt == 0 {
            table.backlog.insert(job.job_id.clone());
        } else {
            table.backlog.remove(&job.job_id);
        }
        table.jobs.insert(job.job_id.clone(), job);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, doing: &str) -> Result<(), StoreError> {
        self.outage.check(doing).map_err(StoreError::from)
    }
}

/// The record with `set` attributes written and `remove` attributes removed, by their
/// stored names — what an `UpdateItem`'s `SET` and `REMOVE` do to the item.
fn with_attributes(
    job: &JobRecord,
    set: Vec<(String, serde_json::Value)>,
    remove: &[String],
) -> Result<JobRecord, StoreError> {
    let mut value = serde_json::to_value(job).expect("records serialise");
    let object = value.as_object_mut().expect("a record is an object");
    for (name, attribute) in set {
        object.insert(name, attribute);
    }
    for name in remove {
        object.remove(name);
    }
    serde_json::from_value(value).map_err(|e| StoreError::Corrupt {
        key: format!("JOB#{}", job.job_id),
        reason: e.to_string(),
    })
}

/// Whether the record, as stored, has attribute `name` (`attribute_exists`).
fn has_attribute(job: &JobRecord, name: &str) -> bool {
    let value = serde_json::to_value(job).expect("records serialise");
    value.get(name).is_some_and(|v| !v.is_null())
}

fn conflict(current: Option<&JobRecord>) -> StoreError {
    StoreError::Conflict { current: current.cloned().map(Box::new) }
}

impl Table {
    fn transition(&mut self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        for from in &request.from {
            from.transition(request.to)?;
        }
        let Some(job) = self.jobs.get(&request.job_id) else {
            return Err(conflict(None));
        };
        let holds = request.from.contains(&job.status)
            && request.fence.as_ref().is_none_or(|lease| job.lease.as_ref() == Some(lease))
            && (!request.unless_cancelled || job.cancellation.is_none())
            && (!request.unless_compensable || !job.wants_compensation())
            && request.unchanged_since.is_none_or(|read| job.updated_at == read)
            && request.requires.iter().all(|name| has_attribute(job, name))
            && !request.lacks.iter().any(|name| has_attribute(job, name))
            && request.due_at.as_ref().is_none_or(|due| {
                job.not_before.is_none_or(|at| at.to_rfc3339().as_str() <= due.as_str())
            });
        if !holds {
            return Err(conflict(Some(job)));
        }
        let now = Timestamp::now();
        let mut next = with_attributes(job, request.set, &request.remove)?;
        next.status = request.to;
        next.updated_at = now;
        next.transitions.push(Transition { state: request.to, at: now, reason: request.reason });
        if request.to.is_terminal() {
            next.finished_at = Some(now);
        }
        if !matches!(request.to, JobStatus::Pending | JobStatus::Queued | JobStatus::Paused) {
            self.backlog.remove(&request.job_id);
        }
        self.index.moved(
            &request.job_id,
            request.to,
            request.index_at.as_deref(),
            &now.to_rfc3339(),
        );
        self.jobs.insert(request.job_id, next.clone());
        Ok(next)
    }
}

#[async_trait]
impl Warm for MemoryJobStore {}

#[async_trait]
impl JobReads for MemoryJobStore {
    async fn job(&self, job_id: &JobId) -> Result<Option<JobRecord>, StoreError> {
        self.check("read job")?;
        Ok(self.lock().jobs.get(job_id).cloned())
    }

    async fn view(&self, job_id: &JobId) -> Result<Option<JobView>, StoreError> {
        self.check("read job")?;
        let table = self.lock();
        Ok(table
            .jobs
            .get(job_id)
            .map(|job| JobView { job: job.clone(), progress: table.progress.get(job_id).cloned() }))
    }
}

#[async_trait]
impl JobTransitions for MemoryJobStore {
    async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        self.check("update job")?;
        self.lock().transition(request)
    }
}

#[async_trait]
impl JobCancellation for MemoryJobStore {
    async fn cancel(
        &self,
        job_id: &JobId,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError> {
        self.check("cancel job")?;
        let mut table = self.lock();
        let request = TransitionRequest::new(
            job_id,
            &[JobStatus::Pending, JobStatus::Queued, JobStatus::Paused],
            JobStatus::Cancelled,
            cancellation.log_reason(),
        )
        .set("cancellation", cancellation)
        // One that started stages with an undo compensates first: its caller moves it.
        .unless_compensable();
        let job = match table.transition(request) {
            Ok(job) => return Ok(CancelOutcome::Cancelled(Box::new(job))),
            Err(StoreError::Conflict { current: Some(job) })
                if job.status == JobStatus::Running =>
            {
                job
            }
            Err(err) => return Err(err),
        };
        // The first request stands; a repeat sets the flag again with its time.
        let job = if job.cancellation.is_some() {
            *job
        } else {
            let mut job = *job;
            job.cancellation = Some(cancellation.clone());
            job.updated_at = Timestamp::now();
            table.jobs.insert(job_id.to_owned(), job.clone());
            job
        };
        let requested_at = job.cancellation.as_ref().map(|c| c.requested_at);
        // A first claim's attempt may have no record yet: the flag makes one, under no lease.
        if let Some(at) = requested_at {
            let progress = table.progress.entry(job_id.to_owned()).or_default();
            progress.cancel_requested_at = progress.cancel_requested_at.or(Some(at));
        }
        Ok(CancelOutcome::Requested(Box::new(job)))
    }
}

#[async_trait]
impl JobListing for MemoryJobStore {
    async fn list(
        &self,
        owner: &Owner,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Vec<JobEntry>, Option<String>), ListError> {
        self.check("list jobs")?;
        let after = cursor
            .map(|c| cursor::decode(owner, c).map_err(|_| ListError::InvalidCursor))
            .transpose()?
            .map(|position| position.index_sort_key());
        let table = self.lock();
        // The owner index: newest first by `<created_at>#<job id>`.
        let mut owned: Vec<(String, &JobRecord)> = table
            .jobs
            .values()
            .filter(|job| job.owner == *owner)
            .map(|job| (format!("{}#{}", job.created_at, job.job_id), job))
            .filter(|(key, _)| after.as_ref().is_none_or(|after| key < after))
            .filter(|(_, job)| {
                filter.status.is_none_or(|status| job.status == status)
                    && filter.job_type.as_ref().is_none_or(|t| &job.job_type == t)
                    && filter.schedule_id.as_ref().is_none_or(|id| {
                        job.scheduled.as_ref().is_some_and(|by| &by.schedule_id == id)
                    })
            })
            .collect();
        owned.sort_by(|a, b| b.0.cmp(&a.0));
        let more = owned.len() > limit;
        owned.truncate(limit);
        let next = match owned.last() {
            Some((_, job)) if more => Some(cursor::encode(
                owner,
                &ListPosition {
                    created_at: job.created_at.to_string(),
                    job_id: job.job_id.clone(),
                },
            )),
            _ => None,
        };
        Ok((owned.into_iter().map(|(_, job)| JobEntry::from(job)).collect(), next))
    }
}

#[async_trait]
impl JobCreation for MemoryJobStore {
    async fn claim_key(
        &self,
        owner: &Owner,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&JobId>,
    ) -> Result<(), StoreError> {
        self.check("claim idempotency key")?;
        let now = chrono::Utc::now().timestamp();
        let mut table = self.lock();
        let slot = (owner.to_owned(), key.to_owned());
        let free = match (table.keys.get(&slot), replacing) {
            (None, None) => true,
            (Some(existing), None) => existing.expires_at < now,
            (Some(existing), Some(old)) => existing.job_id == *old || existing.expires_at < now,
            (None, Some(_)) => return Err(StoreError::Conflict { current: None }),
        };
        if !free {
            let existing = table.keys[&slot].clone();
            return Err(StoreError::KeyTaken(Box::new(existing)));
        }
        table.keys.insert(slot, record.clone());
        Ok(())
    }

    async fn release_key(
        &self,
        owner: &Owner,
        key: &str,
        job_id: &JobId,
    ) -> Result<(), StoreError> {
        self.check("release an idempotency key")?;
        let mut table = self.lock();
        let slot = (owner.to_owned(), key.to_owned());
        if table.keys.get(&slot).is_some_and(|r| r.job_id == *job_id) {
            table.keys.remove(&slot);
        }
        Ok(())
    }

    async fn idempotency(
        &self,
        owner: &Owner,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.check("read idempotency record")?;
        let now = chrono::Utc::now().timestamp();
        Ok(self
            .lock()
            .keys
            .get(&(owner.to_owned(), key.to_owned()))
            .filter(|r| r.expires_at >= now)
            .cloned())
    }

    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.check("create job")?;
        let mut table = self.lock();
        if table.jobs.contains_key(&job.job_id) {
            return Err(StoreError::Conflict { current: None });
        }
        table.backlog.insert(job.job_id.clone());
        table.index.created(job);
        table.jobs.insert(job.job_id.clone(), job.clone());
        Ok(())
    }

    async fn seed_progress(&self, job_id: &JobId, from: &ProgressRecord) -> Result<(), StoreError> {
        self.check("seed progress")?;
        let mut table = self.lock();
        if table.progress.contains_key(job_id) {
            return Ok(());
        }
        let seeded = from.seeded_for(job_id);
        table.progress.insert(job_id.to_owned(), seeded);
        Ok(())
    }

    async fn backlog(&self, owner: &Owner, at_most: usize) -> Result<usize, StoreError> {
        self.check("count a tenant's jobs not yet running")?;
        let table = self.lock();
        // As the AWS adapter: it counts page by page and stops once the count reaches
        // `at_most` (having read at least one page, so `at_most` 0 still counts the first);
        // here a page is one entry, so the count stops exactly there.
        let count = table
            .backlog
            .iter()
            .filter(|id| table.jobs.get(*id).is_some_and(|job| job.owner == *owner))
            .take(at_most.max(1))
            .count();
        Ok(count)
    }
}

#[async_trait]
impl JobDispatchMarks for MemoryJobStore {
    async fn mark_waiting(
        &self,
        job_id: &JobId,
        waiting: &Waiting,
    ) -> Result<JobRecord, StoreError> {
        self.check("mark job waiting")?;
        let mut table = self.lock();
        let Some(job) = table.jobs.get_mut(job_id) else {
            return Err(conflict(None));
        };
        if job.status != JobStatus::Pending {
            return Err(conflict(Some(job)));
        }
        job.waiting = Some(waiting.clone());
        job.updated_at = Timestamp::now();
        let job = job.clone();
        table.index.waiting(job_id, &waiting.since.to_rfc3339());
        Ok(job)
    }
}

#[async_trait]
impl WebhookSecrets for MemoryJobStore {
    async fn webhook_secrets(&self, owner: &Owner) -> Result<SecretsRecord, StoreError> {
        self.check("read webhook secrets")?;
        let mut table = self.lock();
        if let Some(record) = table.secrets.get(owner) {
            return Ok(record.clone());
        }
        let record =
            SecretsRecord { version: 1, secrets: vec![WebhookSecret::generate(Timestamp::now())?] };
        table.secrets.insert(owner.to_owned(), record.clone());
        Ok(record)
    }

    async fn rotate_webhook_secret(
        &self,
        owner: &Owner,
        overlap_until: Timestamp,
    ) -> Result<Rotation, StoreError> {
        let read = self.webhook_secrets(owner).await?;
        let now = Timestamp::now();
        let record = read.rotated(WebhookSecret::generate(now)?, now, overlap_until);
        let mut table = self.lock();
        let current = table.secrets.get(owner).cloned().unwrap_or_default();
        if current.version != read.version {
            return Ok(Rotation::Lost(current));
        }
        table.secrets.insert(owner.to_owned(), record.clone());
        Ok(Rotation::Rotated(record))
    }
}

#[async_trait]
impl DeliveryLog for MemoryJobStore {
    async fn record_delivery(
        &self,
        job_id: &JobId,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        self.check("record webhook delivery")?;
        let key = format!("{}#{:04}", delivery.event, delivery.attempt);
        self.lock().deliveries.entry(job_id.to_owned()).or_default().insert(key, delivery.clone());
        Ok(())
    }

    async fn deliveries(&self, job_id: &JobId) -> Result<Vec<DeliveryRecord>, StoreError> {
        self.check("read deliveries")?;
        Ok(self
            .lock()
            .deliveries
            .get(job_id)
            .map(|attempts| attempts.values().cloned().collect())
            .unwrap_or_default())
    }
}
