//! The job table as the functions use it: reading a job, changing its status, cancelling,
//! listing, creating, marking a wait.

use async_trait::async_trait;
use longhaul_domain::admission::Waiting;
use longhaul_domain::compensation::Compensation;
use longhaul_domain::signals::{SignalName, Wait};
use longhaul_domain::{Cancellation, JobId, Owner, Pause, Timestamp};

use super::Warm;
use crate::jobs::{
    CancelOutcome, IdempotencyRecord, JobEntry, JobRecord, JobStore, JobView, ListError,
    ListFilter, PauseOutcome, ProgressRecord, ResumeOutcome, SignalKept, SignalRecord, StoreError,
    TransitionRequest,
};

/// Reading one job.
#[async_trait]
pub trait JobReads: Warm {
    /// The job record, or `None` if there is no such job.
    async fn job(&self, job_id: &JobId) -> Result<Option<JobRecord>, StoreError>;
    /// The job with its progress, read together, or `None` if there is no such job.
    async fn view(&self, job_id: &JobId) -> Result<Option<JobView>, StoreError>;
}

/// Changing a job's status: one conditional write ([`TransitionRequest`]) that refuses with
/// [`StoreError::Conflict`] carrying the record as it is when its condition does not hold.
#[async_trait]
pub trait JobTransitions: Warm {
    /// Applies the change and returns the record as it is afterwards.
    async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError>;
}

/// An owner's cancellation of a job ([`JobStore::cancel`] says what it does in each status).
#[async_trait]
pub trait JobCancellation: Warm {
    /// Cancels a pending or queued job at once, or records the request for a running one.
    async fn cancel(
        &self,
        job_id: &JobId,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError>;
}

/// An owner's pause and resume of a job, and the stage's parking of a job it paused
/// (`JobStore::pause`, `JobStore::resume`, `JobStore::park` say what each does).
#[async_trait]
pub trait JobPausing: Warm {
    /// Pauses a pending or queued job at once, or records the request for a running one.
    async fn pause(
        &self,
        job_id: &JobId,
        pause: &Pause,
        lapses_at: Timestamp,
    ) -> Result<PauseOutcome, StoreError>;
    /// Resumes `job` as read: `paused → pending`, or a pause not yet taken effect withdrawn.
    async fn resume(
        &self,
        job: &JobRecord,
        why: &str,
        now: Timestamp,
    ) -> Result<ResumeOutcome, StoreError>;
    /// Removes the pause flag of the job's progress record under `lease`: the stage holding
    /// the job found it stale (the job record asks no pause).
    async fn drop_stale_pause_flag(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError>;
    /// `running → paused` by the stage holding `lease`, its stage waiting for `wait`.
    async fn park_waiting(
        &self,
        job: &JobRecord,
        lease: &str,
        wait: &Wait,
        now: Timestamp,
    ) -> Result<JobRecord, StoreError>;
    /// `running → paused` by the stage holding `lease`, after it saw the pause of `job`.
    async fn park(
        &self,
        job: &JobRecord,
        lease: &str,
        now: Timestamp,
        lapses_at: Timestamp,
    ) -> Result<JobRecord, StoreError>;
}

/// A compensating job's undos, recorded as they go ([`JobStore::record_compensation`]).
#[async_trait]
pub trait JobCompensation: Warm {
    /// Writes `compensation` while the job is `compensating` at the revision before
    /// `compensation.revision`, indexed under `due`.
    async fn record_compensation(
        &self,
        job_id: &JobId,
        compensation: &Compensation,
        due: Timestamp,
    ) -> Result<JobRecord, StoreError>;
}

#[async_trait]
impl JobCompensation for JobStore {
    async fn record_compensation(
        &self,
        job_id: &JobId,
        compensation: &Compensation,
        due: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        JobStore::record_compensation(self, job_id, compensation, due).await
    }
}

/// A job's signals: each name received once (or its wait timed out first).
#[async_trait]
pub trait JobSignals: Warm {
    /// Keeps signal `name` with `payload` unless the name has a record or the job keeps
    /// [`longhaul_domain::signals::MAX_SIGNALS_PER_JOB`] signals already; a job that does not
    /// exist is a [`StoreError::Conflict`].
    async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<SignalKept, StoreError>;
    /// Records that the wait for `name` timed out, unless the signal came first: whether it
    /// was recorded.
    async fn time_out_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        at: Timestamp,
    ) -> Result<bool, StoreError>;
    /// What became of signal `name`, if anything.
    async fn signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
    ) -> Result<Option<SignalRecord>, StoreError>;
}

#[async_trait]
impl JobSignals for JobStore {
    async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<SignalKept, StoreError> {
        JobStore::put_signal(self, job_id, name, payload, at).await
    }
    async fn time_out_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        JobStore::time_out_signal(self, job_id, name, at).await
    }
    async fn signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
    ) -> Result<Option<SignalRecord>, StoreError> {
        JobStore::signal(self, job_id, name).await
    }
}

/// An owner's listing of their jobs.
#[async_trait]
pub trait JobListing: Warm {
    /// A page of `owner`'s jobs, newest first, and the cursor of the next page (`None` at the
    /// end). A cursor that is not one this listing issued to `owner` is
    /// [`ListError::InvalidCursor`].
    async fn list(
        &self,
        owner: &Owner,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Vec<JobEntry>, Option<String>), ListError>;
}

/// Creating a job: its idempotency key, its record, its seeded progress, and the owner's
/// backlog that bounds how many may wait.
#[async_trait]
pub trait JobCreation: Warm {
    /// Claims `owner`'s idempotency `key` for `record`; [`StoreError::KeyTaken`] with the
    /// existing record if it is taken — unless it is taken by the job `replacing` names.
    async fn claim_key(
        &self,
        owner: &Owner,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&JobId>,
    ) -> Result<(), StoreError>;
    /// Gives `key` back, if it is still held for `job_id`.
    async fn release_key(&self, owner: &Owner, key: &str, job_id: &JobId)
    -> Result<(), StoreError>;
    /// The record of `owner`'s idempotency `key`, if claimed.
    async fn idempotency(
        &self,
        owner: &Owner,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
    /// Writes a new job record; a record with its id already there is a conflict.
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError>;
    /// Gives a retry the progress of the job it retries.
    async fn seed_progress(&self, job_id: &JobId, from: &ProgressRecord) -> Result<(), StoreError>;
    /// How many of `owner`'s jobs have not run yet, counted up to `at_most`.
    async fn backlog(&self, owner: &Owner, at_most: usize) -> Result<usize, StoreError>;
}

/// Marks the dispatcher sets on a job it cannot start yet.
#[async_trait]
pub trait JobDispatchMarks: Warm {
    /// Records why a queued job waits for a running slot (and since when).
    async fn mark_waiting(
        &self,
        job_id: &JobId,
        waiting: &Waiting,
    ) -> Result<JobRecord, StoreError>;
}

#[async_trait]
impl Warm for JobStore {
    async fn warm(&self) {
        JobStore::warm(self).await
    }
}

#[async_trait]
impl JobReads for JobStore {
    async fn job(&self, job_id: &JobId) -> Result<Option<JobRecord>, StoreError> {
        JobStore::job(self, job_id).await
    }
    async fn view(&self, job_id: &JobId) -> Result<Option<JobView>, StoreError> {
        JobStore::view(self, job_id).await
    }
}

#[async_trait]
impl JobTransitions for JobStore {
    async fn transition(&self, request: TransitionRequest) -> Result<JobRecord, StoreError> {
        JobStore::transition(self, request).await
    }
}

#[async_trait]
impl JobCancellation for JobStore {
    async fn cancel(
        &self,
        job_id: &JobId,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError> {
        JobStore::cancel(self, job_id, cancellation).await
    }
}

#[async_trait]
impl JobPausing for JobStore {
    async fn pause(
        &self,
        job_id: &JobId,
        pause: &Pause,
        lapses_at: Timestamp,
    ) -> Result<PauseOutcome, StoreError> {
        JobStore::pause(self, job_id, pause, lapses_at).await
    }
    async fn resume(
        &self,
        job: &JobRecord,
        why: &str,
        now: Timestamp,
    ) -> Result<ResumeOutcome, StoreError> {
        JobStore::resume(self, job, why, now).await
    }
    async fn drop_stale_pause_flag(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        JobStore::drop_stale_pause_flag(self, job_id, lease).await
    }
    async fn park_waiting(
        &self,
        job: &JobRecord,
        lease: &str,
        wait: &Wait,
        now: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        JobStore::park_waiting(self, job, lease, wait, now).await
    }
    async fn park(
        &self,
        job: &JobRecord,
        lease: &str,
        now: Timestamp,
        lapses_at: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        JobStore::park(self, job, lease, now, lapses_at).await
    }
}

#[async_trait]
impl JobListing for JobStore {
    async fn list(
        &self,
        owner: &Owner,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Vec<JobEntry>, Option<String>), ListError> {
        JobStore::list(self, owner, filter, limit, cursor).await
    }
}

#[async_trait]
impl JobCreation for JobStore {
    async fn claim_key(
        &self,
        owner: &Owner,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&JobId>,
    ) -> Result<(), StoreError> {
        JobStore::claim_key(self, owner, key, record, replacing).await
    }
    async fn release_key(
        &self,
        owner: &Owner,
        key: &str,
        job_id: &JobId,
    ) -> Result<(), StoreError> {
        JobStore::release_key(self, owner, key, job_id).await
    }
    async fn idempotency(
        &self,
        owner: &Owner,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        JobStore::idempotency(self, owner, key).await
    }
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        JobStore::put_job(self, job).await
    }
    async fn seed_progress(&self, job_id: &JobId, from: &ProgressRecord) -> Result<(), StoreError> {
        JobStore::seed_progress(self, job_id, from).await
    }
    async fn backlog(&self, owner: &Owner, at_most: usize) -> Result<usize, StoreError> {
        JobStore::backlog(self, owner, at_most).await
    }
}

#[async_trait]
impl JobDispatchMarks for JobStore {
    async fn mark_waiting(
        &self,
        job_id: &JobId,
        waiting: &Waiting,
    ) -> Result<JobRecord, StoreError> {
        JobStore::mark_waiting(self, job_id, waiting).await
    }
}
