//! Recurring schedules: their records, their EventBridge Scheduler twins, and the queue their
//! firings arrive on.

use async_trait::async_trait;
use longhaul_domain::Owner;
use longhaul_domain::schedules::ScheduleId;

use super::Warm;
use crate::AwsError;
use crate::jobs::{
    FireRecord, FireWrite, JobStore, ScheduleEntries, SchedulePage, ScheduleRecord, ScheduleWrite,
    StoreError,
};
use crate::queue::ScheduleQueue;
use crate::scheduler::{ScheduleFiring, Scheduler, Twin};

/// The schedules' records: the source of truth of every schedule.
#[async_trait]
pub trait ScheduleStore: Warm {
    /// Creates `record` unless its owner has `max` schedules already (`Ok(false)`).
    async fn create_schedule(&self, record: &ScheduleRecord, max: u32) -> Result<bool, StoreError>;
    /// `owner`'s schedule `id`, if there is one.
    async fn schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleRecord>, StoreError>;
    /// A page of `owner`'s schedules after `after`, oldest first.
    async fn schedules(
        &self,
        owner: &Owner,
        limit: u32,
        after: Option<&ScheduleId>,
    ) -> Result<SchedulePage, StoreError>;
    /// Writes `record`'s spec and state if the stored version is still `read`.
    async fn replace_schedule(
        &self,
        record: &ScheduleRecord,
        read: u64,
    ) -> Result<ScheduleWrite, StoreError>;
    /// Deletes `owner`'s schedule `id`; whether there was one.
    async fn delete_schedule(&self, owner: &Owner, id: &ScheduleId) -> Result<bool, StoreError>;
    /// Records a firing, unless this tick or a later one was recorded.
    async fn record_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<FireWrite, StoreError>;
    /// Counts a firing whose record was superseded, leaving the last firing as it is; whether
    /// the schedule is there.
    async fn count_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError>;
    /// Records the release of the held tick `fire.tick`, if it is still held; whether it was.
    async fn release_held(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError>;
}

#[async_trait]
impl ScheduleStore for JobStore {
    async fn create_schedule(&self, record: &ScheduleRecord, max: u32) -> Result<bool, StoreError> {
        JobStore::create_schedule(self, record, max).await
    }
    async fn schedule(
        &self,
        owner: &Owner,
        id: &ScheduleId,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        JobStore::schedule(self, owner, id).await
    }
    async fn schedules(
        &self,
        owner: &Owner,
        limit: u32,
        after: Option<&ScheduleId>,
    ) -> Result<SchedulePage, StoreError> {
        JobStore::schedules(self, owner, limit, after).await
    }
    async fn replace_schedule(
        &self,
        record: &ScheduleRecord,
        read: u64,
    ) -> Result<ScheduleWrite, StoreError> {
        JobStore::replace_schedule(self, record, read).await
    }
    async fn delete_schedule(&self, owner: &Owner, id: &ScheduleId) -> Result<bool, StoreError> {
        JobStore::delete_schedule(self, owner, id).await
    }
    async fn record_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<FireWrite, StoreError> {
        JobStore::record_fire(self, owner, id, fire).await
    }
    async fn count_fire(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        JobStore::count_fire(self, owner, id, fire).await
    }
    async fn release_held(
        &self,
        owner: &Owner,
        id: &ScheduleId,
        fire: &FireRecord,
    ) -> Result<bool, StoreError> {
        JobStore::release_held(self, owner, id, fire).await
    }
}

/// Every schedule, whoever owns it, shard by shard: what the repair sweep walks.
#[async_trait]
pub trait ScheduleSweep: Warm {
    /// A page of at most `limit` schedules of `shard` after `after`, in id order.
    async fn schedule_entries(
        &self,
        shard: u32,
        after: Option<&ScheduleId>,
        limit: u32,
    ) -> Result<ScheduleEntries, StoreError>;
}

#[async_trait]
impl ScheduleSweep for JobStore {
    async fn schedule_entries(
        &self,
        shard: u32,
        after: Option<&ScheduleId>,
        limit: u32,
    ) -> Result<ScheduleEntries, StoreError> {
        JobStore::schedule_entries(self, shard, after, limit).await
    }
}

/// The schedules' EventBridge Scheduler twins, which fire them.
#[async_trait]
pub trait ScheduleTwins: Warm {
    /// Writes `twin` whole (creating it if there is none).
    async fn put_twin(&self, twin: &Twin) -> Result<(), AwsError>;
    /// Writes `twin` whole over the twin of its name; `false` (and nothing written) if there
    /// is none.
    async fn update_twin(&self, twin: &Twin) -> Result<bool, AwsError>;
    /// Deletes the twin named `name`; whether there was one.
    async fn delete_twin(&self, name: &str) -> Result<bool, AwsError>;
    /// The twin named `name`, if there is one.
    async fn twin(&self, name: &str) -> Result<Option<Twin>, AwsError>;
    /// A page of the names of every twin in the group, and the token of the next page
    /// (`None`: the last); `token` is the previous page's.
    async fn twin_names(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), AwsError>;
}

/// Not warmed: a schedule's first write opens the connection.
#[async_trait]
impl Warm for Scheduler {}

#[async_trait]
impl ScheduleTwins for Scheduler {
    async fn put_twin(&self, twin: &Twin) -> Result<(), AwsError> {
        Scheduler::put(self, twin).await
    }
    async fn update_twin(&self, twin: &Twin) -> Result<bool, AwsError> {
        Scheduler::update(self, twin).await
    }
    async fn delete_twin(&self, name: &str) -> Result<bool, AwsError> {
        Scheduler::delete(self, name).await
    }
    async fn twin(&self, name: &str) -> Result<Option<Twin>, AwsError> {
        Scheduler::get(self, name).await
    }
    async fn twin_names(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), AwsError> {
        Scheduler::names(self, token).await
    }
}

/// The queue schedule firings arrive on (a trigger, a held tick's release).
#[async_trait]
pub trait ScheduleFirings: Warm {
    /// Sends one firing.
    async fn send_firing(&self, firing: &ScheduleFiring) -> Result<(), AwsError>;
}

/// Not warmed: rarely used (a trigger, a release).
#[async_trait]
impl Warm for ScheduleQueue {}

#[async_trait]
impl ScheduleFirings for ScheduleQueue {
    async fn send_firing(&self, firing: &ScheduleFiring) -> Result<(), AwsError> {
        ScheduleQueue::send(self, firing).await
    }
}
