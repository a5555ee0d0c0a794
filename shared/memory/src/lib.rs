//! In-memory adapters of longhaul's ports ([`longhaul_aws::ports`]), for the functions' unit
//! tests: the logic of a handler runs over these exactly as over the AWS adapters, without the
//! emulator. Each keeps the contract its logic relies on — a conditional write refuses and says
//! why, pages end, a missing item is absent — and [`contract`] holds the AWS adapters to the
//! same tests on the local stack, so the two cannot drift.
//!
//! Each adapter can be made unavailable (`set_unavailable`), failing every call as a throttled
//! or unreachable service does, so the handlers' failure paths are tested too.

pub mod api;
pub mod contract;
mod jobs;
mod outside;
mod slots;
mod streams;

pub use jobs::MemoryJobStore;
pub use outside::{
    MemoryDeadLetters, MemoryDispatchQueue, MemoryExecutions, MemoryObjects, MemoryRateLimits,
    MemorySigningKey, MemoryWebhookQueue, Started,
};
pub use slots::MemorySlotPools;
pub use streams::MemoryStreamSlots;

use std::sync::atomic::{AtomicBool, Ordering};

use longhaul_aws::AwsError;

/// Whether an adapter is down: every call then fails with a retryable [`AwsError`].
#[derive(Debug, Default)]
pub(crate) struct Outage(AtomicBool);

impl Outage {
    pub(crate) fn set(&self, down: bool) {
        self.0.store(down, Ordering::SeqCst);
    }

    pub(crate) fn check(&self, doing: &str) -> Result<(), AwsError> {
        if self.0.load(Ordering::SeqCst) {
            return Err(AwsError {
                context: doing.to_owned(),
                detail: "service unavailable (in-memory outage)".to_owned(),
                refusal: None,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_job_table_contract() {
        contract::job_table(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_attempts_contract() {
        contract::job_attempts(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn the_memory_queues_keep_the_queue_contracts() {
        let intake = MemoryDispatchQueue::new();
        contract::dispatch_queue(&intake, async |_| {
            intake
                .sent()
                .iter()
                .map(|(message, _, _)| serde_json::to_value(message).unwrap())
                .collect()
        })
        .await;
        let webhooks = MemoryWebhookQueue::new();
        contract::webhook_queue(&webhooks, async |_| {
            webhooks
                .sent()
                .iter()
                .map(|(message, _)| serde_json::to_value(message).unwrap())
                .collect()
        })
        .await;
        let dead = MemoryDeadLetters::new();
        contract::dead_letters(&dead, async |_| dead.kept()).await;
    }

    #[tokio::test]
    async fn the_memory_intake_queue_refuses_a_delay_sqs_refuses() {
        use longhaul_aws::ports::DispatchQueue;
        let intake = MemoryDispatchQueue::new();
        let message = longhaul_aws::queue::DispatchMessage { job_id: "j".into() };
        let refused = intake.send_delayed(&message, 901, "o").await.unwrap_err();
        assert_eq!(refused.refusal, Some(longhaul_aws::Refusal::Invalid));
        assert!(intake.sent().is_empty(), "nothing sent");
    }

    #[tokio::test]
    async fn the_memory_executions_keep_the_executions_contract() {
        contract::executions(&MemoryExecutions::new()).await;
    }

    #[tokio::test]
    async fn the_memory_rate_limits_keep_the_rate_limit_contract() {
        contract::rate_limits(&MemoryRateLimits::new(2)).await;
    }

    #[tokio::test]
    async fn the_memory_objects_keep_the_objects_contract() {
        contract::objects(&MemoryObjects::new()).await;
    }

    #[tokio::test]
    async fn an_unavailable_store_fails_every_call_and_changes_nothing() {
        use longhaul_aws::ports::{JobCreation, JobReads};
        let store = MemoryJobStore::new();
        let job = contract::pending_job("o", longhaul_domain::Timestamp::now());
        store.set_unavailable(true);
        assert!(store.put_job(&job).await.is_err());
        assert!(store.job(job.job_id.as_str()).await.is_err());
        store.set_unavailable(false);
        assert!(store.job(job.job_id.as_str()).await.unwrap().is_none());
    }
}
