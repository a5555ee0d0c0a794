//! Webhooks: a tenant's signing secrets, the delivery log, the webhook queue and the
//! dead letters.

use async_trait::async_trait;
use longhaul_domain::{JobId, Owner};

use super::Warm;
use crate::AwsError;
use crate::jobs::{DeliveryRecord, JobStore, Rotation, SecretsRecord, StoreError};
use crate::queue::{DeadLetterQueue, WebhookMessage, WebhookQueue};

/// A tenant's webhook signing secrets.
#[async_trait]
pub trait WebhookSecrets: Warm {
    /// The owner's secrets (created on first use).
    async fn webhook_secrets(&self, owner: &Owner) -> Result<SecretsRecord, StoreError>;
    /// Rotates the owner's secret, keeping the old one valid until `overlap_until`.
    async fn rotate_webhook_secret(
        &self,
        owner: &Owner,
        overlap_until: longhaul_domain::Timestamp,
    ) -> Result<Rotation, StoreError>;
}

/// The log of a job's webhook delivery attempts.
#[async_trait]
pub trait DeliveryLog: Warm {
    /// Records one attempt.
    async fn record_delivery(
        &self,
        job_id: &JobId,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError>;
    /// The job's attempts, oldest first.
    async fn deliveries(&self, job_id: &JobId) -> Result<Vec<DeliveryRecord>, StoreError>;
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

#[async_trait]
impl WebhookSecrets for JobStore {
    async fn webhook_secrets(&self, owner: &Owner) -> Result<SecretsRecord, StoreError> {
        JobStore::webhook_secrets(self, owner).await
    }
    async fn rotate_webhook_secret(
        &self,
        owner: &Owner,
        overlap_until: longhaul_domain::Timestamp,
    ) -> Result<Rotation, StoreError> {
        JobStore::rotate_webhook_secret(self, owner, overlap_until).await
    }
}

#[async_trait]
impl DeliveryLog for JobStore {
    async fn record_delivery(
        &self,
        job_id: &JobId,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        JobStore::record_delivery(self, job_id, delivery).await
    }
    async fn deliveries(&self, job_id: &JobId) -> Result<Vec<DeliveryRecord>, StoreError> {
        JobStore::deliveries(self, job_id).await
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
