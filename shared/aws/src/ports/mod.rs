//! The ports: what the functions' logic needs from the outside world, as small traits.
//!
//! Each AWS adapter of this crate implements the ports of its service ([`JobStore`] the job
//! table's, [`Executions`] the state machine's, …); `longhaul-memory` implements the same ports
//! in memory, keeping the contracts the logic relies on (a conditional write refuses and says
//! why, pages end, a missing item is absent). A function's `Deps` holds its ports as trait
//! objects, so its handler runs unchanged over either: the AWS adapters in Lambda and against
//! the local stack, the in-memory ones in unit tests. One contract test
//! (`longhaul_memory::contract`) runs against both, so they cannot drift.
//!
//! The traits are cut by concern rather than by service, so a function names only what it
//! uses (the cancel function reads jobs and cancels them; it cannot list or claim them).

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use longhaul_domain::Cancellation;
use longhaul_domain::admission::Waiting;
use secrecy::SecretString;

use crate::AwsError;
use crate::executions::{Executions, StartOutcome};
use crate::jobs::{
    CancelOutcome, DeliveryRecord, IdempotencyRecord, JobEntry, JobRecord, JobStore, JobView,
    ListError, ListFilter, ProgressRecord, Rotation, SecretsRecord, StoreError, TransitionRequest,
};
use crate::limits::{Admission, SubmissionLimiter};
use crate::objects::ObjectStore;
use crate::queue::{DeadLetterQueue, DispatchMessage, IntakeQueue, WebhookMessage, WebhookQueue};
use crate::secrets::SecretKey;

mod streams;
pub use streams::*;
mod links;
pub use links::*;
mod retention;
pub use retention::*;
mod sweeps;
pub use sweeps::*;
mod slots;
pub use slots::*;
mod attempts;
pub use attempts::*;
mod objects;
pub use objects::*;
mod reaping;
pub use reaping::*;
mod uploads;
pub use uploads::*;

/// Every port can open its connection ahead of the first request (see
/// [`crate::sdk::warm_up`]); in-memory adapters have nothing to open.
#[async_trait]
pub trait Warm: Send + Sync + Debug {
    /// Opens (and pools) the adapter's connection, if it has one. Never fails: a failed
    /// warm-up is logged and the first request connects instead.
    async fn warm(&self) {}
}

/// Reading one job.
#[async_trait]
pub trait JobReads: Warm {
    /// The job record, or `None` if there is no such job.
    async fn job(&self, job_id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// The job with its progress, read together, or `None` if there is no such job.
    async fn view(&self, job_id: &str) -> Result<Option<JobView>, StoreError>;
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
        job_id: &str,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError>;
}

/// An owner's listing of their jobs.
#[async_trait]
pub trait JobListing: Warm {
    /// A page of `owner`'s jobs, newest first, and the cursor of the next page (`None` at the
    /// end). A cursor that is not one this listing issued to `owner` is
    /// [`ListError::InvalidCursor`].
    async fn list(
        &self,
        owner: &str,
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
        owner: &str,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Gives `key` back, if it is still held for `job_id`.
    async fn release_key(&self, owner: &str, key: &str, job_id: &str) -> Result<(), StoreError>;
    /// The record of `owner`'s idempotency `key`, if claimed.
    async fn idempotency(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
    /// Writes a new job record; a record with its id already there is a conflict.
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError>;
    /// Gives a retry the progress of the job it retries.
    async fn seed_progress(&self, job_id: &str, from: &ProgressRecord) -> Result<(), StoreError>;
    /// How many of `owner`'s jobs have not run yet, counted up to `at_most`.
    async fn backlog(&self, owner: &str, at_most: usize) -> Result<usize, StoreError>;
}

/// Marks the dispatcher sets on a job it cannot start yet.
#[async_trait]
pub trait JobDispatchMarks: Warm {
    /// Records why a queued job waits for a running slot (and since when).
    async fn mark_waiting(&self, job_id: &str, waiting: &Waiting) -> Result<JobRecord, StoreError>;
}

/// A tenant's webhook signing secrets.
#[async_trait]
pub trait WebhookSecrets: Warm {
    /// The owner's secrets (created on first use).
    async fn webhook_secrets(&self, owner: &str) -> Result<SecretsRecord, StoreError>;
    /// Rotates the owner's secret, keeping the old one valid until `overlap_until`.
    async fn rotate_webhook_secret(
        &self,
        owner: &str,
        overlap_until: longhaul_domain::Timestamp,
    ) -> Result<Rotation, StoreError>;
}

/// The log of a job's webhook delivery attempts.
#[async_trait]
pub trait DeliveryLog: Warm {
    /// Records one attempt.
    async fn record_delivery(
        &self,
        job_id: &str,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError>;
    /// The job's attempts, oldest first.
    async fn deliveries(&self, job_id: &str) -> Result<Vec<DeliveryRecord>, StoreError>;
}

/// Executions of the job state machine.
#[async_trait]
pub trait JobExecutions: Warm {
    /// Starts execution `name` with `input`; a name used before is
    /// [`StartOutcome::AlreadyExists`], never a second run.
    async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError>;
    /// The status of execution `name` (`RUNNING`, `SUCCEEDED`, …), `None` if there is none.
    async fn status(&self, name: &str) -> Result<Option<String>, AwsError>;
    /// Stops execution `name` if it runs; stopping one that does not exist is not an error.
    async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError>;
}

/// The intake queue, which the dispatcher drains.
#[async_trait]
pub trait DispatchQueue: Warm {
    /// Enqueues `message` for `owner`'s job now.
    async fn send(&self, message: &DispatchMessage, owner: &str) -> Result<(), AwsError>;
    /// Enqueues `message`, visible after `delay_seconds` (at most 900).
    async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &str,
    ) -> Result<(), AwsError>;
}

/// The webhook queue, which the webhook function drains.
#[async_trait]
pub trait WebhookDispatch: Warm {
    /// Enqueues one delivery, visible after `delay_seconds`.
    async fn send(&self, message: &WebhookMessage, delay_seconds: u64) -> Result<(), AwsError>;
    /// Enqueues many deliveries at once; whether each was accepted, in order.
    async fn send_batch(&self, messages: &[WebhookMessage]) -> Result<Vec<bool>, AwsError>;
}

/// Where what cannot be delivered or processed is kept for an operator.
#[async_trait]
pub trait DeadLetters: Warm {
    /// Keeps `body`.
    async fn send(&self, body: &serde_json::Value) -> Result<(), AwsError>;
}

/// The per-owner submission rate limit.
#[async_trait]
pub trait RateLimits: Warm {
    /// Charges one submission to `owner`: admitted, or refused until a given time.
    async fn charge(&self, owner: &str) -> Result<Admission, AwsError>;
}

/// The bucket's objects as the API hands them out: links, not bytes.
#[async_trait]
pub trait ObjectLinks: Warm {
    /// A link that reads `key` for `expires_in`.
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError>;
}

/// Deleting objects by prefix (a job's checkpoints, an expired job's result and inputs).
#[async_trait]
pub trait ObjectCleanup: Warm {
    /// Deletes every object under `prefix`; how many there were.
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError>;
    /// The first key under `prefix`, if any.
    async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError>;
}

/// A secret key the function signs or checks tokens with.
#[async_trait]
pub trait SigningKey: Warm {
    /// The key.
    async fn get(&self) -> Result<&SecretString, AwsError>;
}

// The AWS adapters implement their ports by their inherent methods.

#[async_trait]
impl Warm for JobStore {
    async fn warm(&self) {
        JobStore::warm(self).await
    }
}

#[async_trait]
impl JobReads for JobStore {
    async fn job(&self, job_id: &str) -> Result<Option<JobRecord>, StoreError> {
        JobStore::job(self, job_id).await
    }
    async fn view(&self, job_id: &str) -> Result<Option<JobView>, StoreError> {
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
        job_id: &str,
        cancellation: &Cancellation,
    ) -> Result<CancelOutcome, StoreError> {
        JobStore::cancel(self, job_id, cancellation).await
    }
}

#[async_trait]
impl JobListing for JobStore {
    async fn list(
        &self,
        owner: &str,
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
        owner: &str,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&str>,
    ) -> Result<(), StoreError> {
        JobStore::claim_key(self, owner, key, record, replacing).await
    }
    async fn release_key(&self, owner: &str, key: &str, job_id: &str) -> Result<(), StoreError> {
        JobStore::release_key(self, owner, key, job_id).await
    }
    async fn idempotency(
        &self,
        owner: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        JobStore::idempotency(self, owner, key).await
    }
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        JobStore::put_job(self, job).await
    }
    async fn seed_progress(&self, job_id: &str, from: &ProgressRecord) -> Result<(), StoreError> {
        JobStore::seed_progress(self, job_id, from).await
    }
    async fn backlog(&self, owner: &str, at_most: usize) -> Result<usize, StoreError> {
        JobStore::backlog(self, owner, at_most).await
    }
}

#[async_trait]
impl JobDispatchMarks for JobStore {
    async fn mark_waiting(&self, job_id: &str, waiting: &Waiting) -> Result<JobRecord, StoreError> {
        JobStore::mark_waiting(self, job_id, waiting).await
    }
}

#[async_trait]
impl WebhookSecrets for JobStore {
    async fn webhook_secrets(&self, owner: &str) -> Result<SecretsRecord, StoreError> {
        JobStore::webhook_secrets(self, owner).await
    }
    async fn rotate_webhook_secret(
        &self,
        owner: &str,
        overlap_until: longhaul_domain::Timestamp,
    ) -> Result<Rotation, StoreError> {
        JobStore::rotate_webhook_secret(self, owner, overlap_until).await
    }
}

#[async_trait]
impl DeliveryLog for JobStore {
    async fn record_delivery(
        &self,
        job_id: &str,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        JobStore::record_delivery(self, job_id, delivery).await
    }
    async fn deliveries(&self, job_id: &str) -> Result<Vec<DeliveryRecord>, StoreError> {
        JobStore::deliveries(self, job_id).await
    }
}

#[async_trait]
impl Warm for Executions {
    async fn warm(&self) {
        Executions::warm(self).await
    }
}

#[async_trait]
impl JobExecutions for Executions {
    async fn start(&self, name: &str, input: &serde_json::Value) -> Result<StartOutcome, AwsError> {
        Executions::start(self, name, input).await
    }
    async fn status(&self, name: &str) -> Result<Option<String>, AwsError> {
        Executions::status(self, name).await
    }
    async fn stop(&self, name: &str, cause: &str) -> Result<(), AwsError> {
        Executions::stop(self, name, cause).await
    }
}

#[async_trait]
impl Warm for IntakeQueue {
    async fn warm(&self) {
        IntakeQueue::warm(self).await
    }
}

#[async_trait]
impl DispatchQueue for IntakeQueue {
    async fn send(&self, message: &DispatchMessage, owner: &str) -> Result<(), AwsError> {
        IntakeQueue::send(self, message, owner).await
    }
    async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &str,
    ) -> Result<(), AwsError> {
        IntakeQueue::send_delayed(self, message, delay_seconds, owner).await
    }
}

#[async_trait]
impl Warm for WebhookQueue {
    async fn warm(&self) {
        WebhookQueue::warm(self).await
    }
}

#[async_trait]
impl WebhookDispatch for WebhookQueue {
    async fn send(&self, message: &WebhookMessage, delay_seconds: u64) -> Result<(), AwsError> {
        WebhookQueue::send(self, message, delay_seconds).await
    }
    async fn send_batch(&self, messages: &[WebhookMessage]) -> Result<Vec<bool>, AwsError> {
        WebhookQueue::send_batch(self, messages).await
    }
}

#[async_trait]
impl Warm for DeadLetterQueue {}

#[async_trait]
impl DeadLetters for DeadLetterQueue {
    async fn send(&self, body: &serde_json::Value) -> Result<(), AwsError> {
        DeadLetterQueue::send(self, body).await
    }
}

#[async_trait]
impl Warm for SubmissionLimiter {}

#[async_trait]
impl RateLimits for SubmissionLimiter {
    async fn charge(&self, owner: &str) -> Result<Admission, AwsError> {
        SubmissionLimiter::charge(self, owner).await
    }
}

#[async_trait]
impl Warm for ObjectStore {
    async fn warm(&self) {
        ObjectStore::warm(self).await
    }
}

#[async_trait]
impl ObjectLinks for ObjectStore {
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError> {
        ObjectStore::presign_get(self, key, expires_in).await
    }
}

#[async_trait]
impl ObjectCleanup for ObjectStore {
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError> {
        ObjectStore::delete_prefix(self, prefix).await
    }
    async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError> {
        ObjectStore::first_key(self, prefix).await
    }
}

#[async_trait]
impl Warm for SecretKey {
    async fn warm(&self) {
        SecretKey::warm(self).await
    }
}

#[async_trait]
impl SigningKey for SecretKey {
    async fn get(&self) -> Result<&SecretString, AwsError> {
        SecretKey::get(self).await
    }
}
