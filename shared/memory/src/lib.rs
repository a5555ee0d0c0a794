//! In-memory adapters of longhaul's ports ([`longhaul_aws::ports`]), for the functions' unit
//! tests: the logic of a handler runs over these exactly as over the AWS adapters, without the
//! emulator. Each keeps the contract its logic relies on — a conditional write refuses and says
//! why, pages end, a missing item is absent — and [`contract`] holds the AWS adapters to the
//! same tests on the local stack, so the two cannot drift.
//!
//! Each adapter can be made unavailable (`set_unavailable`), failing every call as a throttled
//! or unreachable service does, so the handlers' failure paths are tested too.

pub mod api;
mod clock;
pub mod contract;
mod endpoints;
mod jobs;
mod names;
mod outside;
mod schedules;
mod slots;
mod streams;

pub use clock::ManualClock;
pub use endpoints::MemoryEndpoints;
pub use jobs::MemoryJobStore;
pub use names::{job_named, nth_job, owner};
pub use outside::{
    MemoryDeadLetters, MemoryDispatchQueue, MemoryExecutions, MemoryInvocations, MemoryObjects,
    MemoryRateLimits, MemorySigningKey, MemoryUploadQuota, MemoryWebhookQueue, Started,
};
pub use schedules::{MemoryScheduleFirings, MemoryScheduleTwins, MemorySchedules};
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
            return Err(Outage::unavailable(doing));
        }
        Ok(())
    }

    /// The error of a call made while the adapter is down.
    pub(crate) fn unavailable(doing: &str) -> AwsError {
        AwsError {
            context: doing.to_owned(),
            detail: "service unavailable (in-memory outage)".to_owned(),
            refusal: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_schedules_keep_the_schedule_store_contract() {
        contract::schedule_store(&MemorySchedules::new()).await;
    }

    #[tokio::test]
    async fn the_memory_twins_keep_the_schedule_twins_contract() {
        contract::schedule_twins(&MemoryScheduleTwins::new()).await;
    }

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_job_table_contract() {
        contract::job_table(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_pausing_contract() {
        contract::job_pausing(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn the_memory_endpoints_keep_the_endpoint_table_contract() {
        contract::endpoint_table(&MemoryEndpoints::new()).await;
    }

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_attempts_contract() {
        contract::job_attempts(&MemoryJobStore::new()).await;
    }

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_shards_contract() {
        contract::job_shards(&MemoryJobStore::new()).await;
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
        let message = longhaul_aws::queue::DispatchMessage::new(nth_job(1));
        let refused = intake.send_delayed(&message, 901, &owner("o")).await.unwrap_err();
        assert_eq!(refused.refusal, Some(longhaul_aws::Refusal::Invalid));
        assert!(intake.sent().is_empty(), "nothing sent");
    }

    #[tokio::test]
    async fn the_memory_backlog_stops_counting_at_at_most() {
        // The DynamoDB adapter stops at the page that reaches `at_most`; a page here is one
        // entry, so the count is `at_most` exactly once there are that many.
        use longhaul_aws::ports::JobCreation;
        let store = MemoryJobStore::new();
        let owner = contract::fresh_owner("backlog");
        for _ in 0..3 {
            let job = contract::pending_job(&owner, longhaul_domain::Timestamp::now());
            store.put_job(&job).await.unwrap();
        }
        for (at_most, counted) in [(1, 1), (2, 2), (3, 3), (10, 3)] {
            assert_eq!(store.backlog(&owner, at_most).await.unwrap(), counted, "{at_most}");
        }
    }

    #[tokio::test]
    async fn the_memory_signing_key_keeps_the_signing_key_contract() {
        let unreadable = MemorySigningKey::new("later");
        unreadable.set_unavailable(true);
        contract::signing_key(
            "k-1",
            &MemorySigningKey::new("k-1"),
            &MemorySigningKey::new("k-1"),
            &MemorySigningKey::new("k-2"),
            &unreadable,
            async || unreadable.set_unavailable(false),
        )
        .await;
    }

    #[tokio::test]
    async fn the_system_and_the_manual_clocks_keep_the_clock_contract() {
        contract::clock(&longhaul_aws::ports::SystemClock).await;
        contract::clock(&ManualClock::new()).await;
        contract::clock(&ManualClock::new().stepping(std::time::Duration::from_secs(3))).await;
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        use longhaul_aws::ports::Clock;
        use std::time::Duration;
        let start = chrono::Utc::now();
        let clock = ManualClock::at(start);
        let instant = clock.instant();
        assert_eq!((clock.now(), clock.instant()), (start, instant), "it stands still");
        clock.advance(Duration::from_secs(90));
        assert_eq!(clock.now(), start + chrono::Duration::seconds(90));
        assert_eq!(clock.instant(), instant + Duration::from_secs(90));
        let later = start + chrono::Duration::hours(1);
        clock.set(later);
        assert_eq!((clock.now(), clock.instant()), (later, instant + Duration::from_secs(3600)));
        // Set back, the time of day goes back; the instant never does.
        clock.set(start);
        assert_eq!((clock.now(), clock.instant()), (start, instant + Duration::from_secs(3600)));
        // Stepping: each reading a step later than the one before.
        let stepping = ManualClock::at(start).stepping(Duration::from_secs(2));
        let first = stepping.instant();
        assert_eq!(stepping.instant(), first + Duration::from_secs(2));
        assert_eq!(stepping.now(), start + chrono::Duration::seconds(4));
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
    async fn the_memory_upload_quota_keeps_the_upload_quota_contract() {
        contract::upload_quotas(&MemoryUploadQuota::new(100)).await;
    }

    #[tokio::test]
    async fn the_memory_objects_keep_the_objects_contract() {
        contract::objects(&MemoryObjects::new()).await;
    }

    #[tokio::test]
    async fn an_unavailable_store_fails_every_call_and_changes_nothing() {
        use longhaul_aws::ports::{JobCreation, JobReads};
        let store = MemoryJobStore::new();
        let job = contract::pending_job(&owner("o"), longhaul_domain::Timestamp::now());
        store.set_unavailable(true);
        assert!(store.put_job(&job).await.is_err());
        assert!(store.job(&job.job_id).await.is_err());
        store.set_unavailable(false);
        assert!(store.job(&job.job_id).await.unwrap().is_none());
    }
}
