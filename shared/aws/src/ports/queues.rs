//! The intake queue, which the dispatcher drains.

use async_trait::async_trait;
use longhaul_domain::Owner;

use super::Warm;
use crate::AwsError;
use crate::queue::{DispatchMessage, IntakeQueue};

/// The intake queue, which the dispatcher drains.
#[async_trait]
pub trait DispatchQueue: Warm {
    /// Enqueues `message` for `owner`'s job now.
    async fn send(&self, message: &DispatchMessage, owner: &Owner) -> Result<(), AwsError>;
    /// Enqueues `message`, visible after `delay_seconds` (at most 900).
    async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &Owner,
    ) -> Result<(), AwsError>;
}

#[async_trait]
impl Warm for IntakeQueue {
    async fn warm(&self) {
        IntakeQueue::warm(self).await
    }
}

#[async_trait]
impl DispatchQueue for IntakeQueue {
    async fn send(&self, message: &DispatchMessage, owner: &Owner) -> Result<(), AwsError> {
        IntakeQueue::send(self, message, owner).await
    }
    async fn send_delayed(
        &self,
        message: &DispatchMessage,
        delay_seconds: u32,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        IntakeQueue::send_delayed(self, message, delay_seconds, owner).await
    }
}
