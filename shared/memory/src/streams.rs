//! The open-stream caps in memory: the same slot items, keys and lease arithmetic as the
//! table's ([`longhaul_aws::limits::StreamSlots`], [`StreamLeases`]), decided under one lock.

use longhaul_domain::{JobId, Owner};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::limits::{DEPLOYMENT_STREAMS_PK, SlotError, StreamLease, streams_pk};
use longhaul_aws::ports::{StreamCaps, Warm};
use longhaul_domain::limits::StreamLeases;

use crate::Outage;

/// The caps on open progress streams in memory. Each slot item (the job's, the tenant's, the
/// deployment's, keyed as in the table) holds stream id → lease expiry. An acquire takes the
/// items in the order job, tenant, deployment — each dropping its expired leases and refusing
/// at its cap ([`StreamLeases::admit`]) — and gives back what it took when a later one
/// refuses; a release removes the stream's lease from each item; a cap of 0 is off (that item
/// is not touched). Time is the clock's, as for the table.
#[derive(Debug, Default)]
pub struct MemoryStreamSlots {
    per_job: usize,
    per_tenant: usize,
    per_deployment: usize,
    /// `(pk, sk)` → the item's leases.
    items: Mutex<HashMap<(String, String), StreamLeases>>,
    /// How many acquires were asked for (taken or refused); also numbers the stream ids.
    acquires: Mutex<usize>,
    outage: Outage,
}

impl MemoryStreamSlots {
    /// Caps of `per_job`, `per_tenant` and `per_deployment` open streams (0: that cap is off).
    pub fn new(per_job: usize, per_tenant: usize, per_deployment: usize) -> Self {
        MemoryStreamSlots { per_job, per_tenant, per_deployment, ..Self::default() }
    }

    /// While `down`, every call fails as an unavailable table does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// The live leases (not expired) of `owner`'s `job_id`'s item.
    pub fn open_of_job(&self, owner: &Owner, job_id: &JobId) -> usize {
        self.live(&job_item(owner, job_id))
    }

    /// The live leases of `owner`'s item.
    pub fn open_of_tenant(&self, owner: &Owner) -> usize {
        self.live(&tenant_item(owner))
    }

    /// The live leases of the deployment's item.
    pub fn open_in_deployment(&self) -> usize {
        self.live(&deployment_item())
    }

    /// How many acquires were asked for, taken or refused (what a test checks "nothing was
    /// taken before the refusal" by).
    pub fn acquires(&self) -> usize {
        *lock(&self.acquires)
    }

    fn live(&self, key: &(String, String)) -> usize {
        let now = chrono::Utc::now().timestamp();
        lock(&self.items)
            .get(key)
            .map_or(0, |leases| leases.0.values().filter(|at| **at >= now).count())
    }

    /// The items a stream of `owner`'s `job_id` takes, with their scope and cap, in order.
    fn items(&self, owner: &Owner, job_id: &JobId) -> Vec<(&'static str, (String, String), usize)> {
        [
            ("job", job_item(owner, job_id), self.per_job),
            ("tenant", tenant_item(owner), self.per_tenant),
            ("deployment", deployment_item(), self.per_deployment),
        ]
        .into_iter()
        .filter(|(_, _, cap)| *cap > 0)
        .collect()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn job_item(owner: &Owner, job_id: &JobId) -> (String, String) {
    (streams_pk(owner), format!("JOB#{job_id}"))
}

fn tenant_item(owner: &Owner) -> (String, String) {
    (streams_pk(owner), "TENANT".to_owned())
}

fn deployment_item() -> (String, String) {
    (DEPLOYMENT_STREAMS_PK.to_owned(), "DEPLOYMENT".to_owned())
}

#[async_trait]
impl Warm for MemoryStreamSlots {}

#[async_trait]
impl StreamCaps for MemoryStreamSlots {
    async fn acquire(
        &self,
        owner: &Owner,
        job_id: &JobId,
        expiry: i64,
    ) -> Result<StreamLease, SlotError> {
        let number = {
            let mut acquires = lock(&self.acquires);
            *acquires += 1;
            *acquires
        };
        self.outage.check("read stream slots")?;
        let lease = StreamLease {
            owner: owner.to_owned(),
            job_id: job_id.to_owned(),
            stream_id: format!("memory-stream-{number}"),
        };
        let now = chrono::Utc::now().timestamp();
        let items = self.items(owner, job_id);
        let mut table = lock(&self.items);
        for (taken, (scope, key, cap)) in items.iter().enumerate() {
            let leases = table.entry(key.clone()).or_default();
            if let Err(full) = leases.admit(&lease.stream_id, expiry, now, *cap) {
                for (_, held, _) in &items[..taken] {
                    if let Some(leases) = table.get_mut(held) {
                        leases.0.remove(&lease.stream_id);
                    }
                }
                return Err(SlotError::Full { scope, full });
            }
        }
        Ok(lease)
    }

    async fn release(&self, lease: &StreamLease) -> Result<(), AwsError> {
        self.outage.check("release a stream slot")?;
        let mut table = lock(&self.items);
        for (_, key, _) in self.items(&lease.owner, &lease.job_id) {
            if let Some(leases) = table.get_mut(&key) {
                leases.0.remove(&lease.stream_id);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{nth_job, owner};

    #[tokio::test]
    async fn the_memory_stream_slots_keep_the_stream_caps_contract() {
        crate::contract::stream_slots(MemoryStreamSlots::new).await;
    }

    #[tokio::test]
    async fn the_counts_show_live_leases_and_an_outage_takes_nothing() {
        let slots = MemoryStreamSlots::new(2, 2, 2);
        let now = chrono::Utc::now().timestamp();
        let lease = slots.acquire(&owner("alice"), &nth_job(1), now + 60).await.unwrap();
        slots.acquire(&owner("alice"), &nth_job(1), now - 10).await.unwrap();
        assert_eq!(
            (
                slots.open_of_job(&owner("alice"), &nth_job(1)),
                slots.open_of_tenant(&owner("alice")),
                slots.open_in_deployment()
            ),
            (1, 1, 1),
            "the expired lease is not counted"
        );
        slots.set_unavailable(true);
        assert!(matches!(
            slots.acquire(&owner("alice"), &nth_job(2), now + 60).await,
            Err(SlotError::Aws(_))
        ));
        assert!(slots.release(&lease).await.is_err());
        slots.set_unavailable(false);
        assert_eq!(slots.open_of_tenant(&owner("alice")), 1, "the failed calls changed nothing");
        assert_eq!(slots.acquires(), 3);
        slots.release(&lease).await.unwrap();
        assert_eq!(slots.open_in_deployment(), 0);
    }
}
