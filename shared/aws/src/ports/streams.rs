//! The caps on open progress streams: a stream holds a slot of its job, of its owner and of
//! the deployment while it is open ([`StreamSlots`] keeps them as expiring leases in the job
//! table).

use async_trait::async_trait;
use longhaul_domain::{JobId, Owner};

use super::Warm;
use crate::AwsError;
use crate::limits::{SlotError, StreamLease, StreamSlots};

/// Taking and giving back a stream's slots.
///
/// The contract ([`StreamSlots`] is the reference): a cap of 0 is off; the caps are checked in
/// the order job, tenant, deployment, and a refusal is [`SlotError::Full`] naming the first
/// scope that is full, its live leases, its cap and a `retry_after` of 1 … 60 s — and leaves
/// nothing held. A lease stops counting once its expiry has passed, held or not; a release
/// frees its slots at once, and releasing a lease that holds nothing (released before,
/// expired, never taken) is not an error.
#[async_trait]
pub trait StreamCaps: Warm {
    /// Takes a slot of the job, of the tenant and of the deployment for a stream of `owner`'s
    /// `job_id` whose lease expires at `expiry` (Unix seconds).
    async fn acquire(
        &self,
        owner: &Owner,
        job_id: &JobId,
        expiry: i64,
    ) -> Result<StreamLease, SlotError>;
    /// Gives back every slot of `lease`.
    async fn release(&self, lease: &StreamLease) -> Result<(), AwsError>;
}

#[async_trait]
impl Warm for StreamSlots {}

#[async_trait]
impl StreamCaps for StreamSlots {
    async fn acquire(
        &self,
        owner: &Owner,
        job_id: &JobId,
        expiry: i64,
    ) -> Result<StreamLease, SlotError> {
        StreamSlots::acquire(self, owner, job_id, expiry).await
    }
    async fn release(&self, lease: &StreamLease) -> Result<(), AwsError> {
        StreamSlots::release(self, lease).await
    }
}
