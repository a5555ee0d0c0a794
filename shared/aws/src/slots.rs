//! Running-job slots and waiting lists, kept in the job table (the rules are
//! [`longhaul_domain::admission`]).
//!
//! | item | pk / sk |
//! |------|---------|
//! | a pool's holders | `SLOTS#T#<len>:<owner>` or `SLOTS#K#<len>:<kind>` / `HOLDERS` — `holders` (string set of job ids) |
//! | a waiting job | `WAITING#T#<len>:<owner>` or `WAITING#K#<len>:<kind>` / `<priority>#<created_at>#<job id>` — `job_id` |
//!
//! A slot is taken by one conditional `UpdateItem` (`ADD holders :job` if the set has room or
//! already holds the job: idempotent) and given back by one unconditional `DELETE holders
//! :job` (idempotent too), so a redelivered message or a retried stream record never takes two
//! slots or frees someone else's. The set names its holders, which is what lets the reaper
//! reconcile a pool with the jobs that really run (a counter could only be trusted). A
//! waiting list is a partition read in key order: priority, then submission time.

use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use longhaul_domain::admission::{WaitReason, job_of_waiting_key};

use crate::AwsError;
use crate::queue::{DispatchMessage, IntakeQueue};

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// Sort key of a pool's holders item.
const HOLDERS_SK: &str = "HOLDERS";

/// A limit on running jobs: its slots and its waiting list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// One tenant's jobs (`LONGHAUL_TENANT_MAX_RUNNING`).
    Tenant(String),
    /// One kind's jobs (its policy's `concurrency_limit`).
    Kind(String),
}

impl Pool {
    /// The key part naming the pool; names are length-prefixed, so no owner or kind name can
    /// reach another's items.
    fn name(&self) -> String {
        match self {
            Pool::Tenant(owner) => format!("T#{}:{owner}", owner.len()),
            Pool::Kind(kind) => format!("K#{}:{kind}", kind.len()),
        }
    }

    /// Partition key of the pool's holders.
    pub fn holders_pk(&self) -> String {
        format!("SLOTS#{}", self.name())
    }

    /// Partition key of the pool's waiting list.
    pub fn waiting_pk(&self) -> String {
        format!("WAITING#{}", self.name())
    }

    /// What a job refused by this pool waits for.
    pub fn reason(&self) -> WaitReason {
        match self {
            Pool::Tenant(_) => WaitReason::TenantLimit,
            Pool::Kind(_) => WaitReason::KindLimit,
        }
    }
}

/// The pools a job takes a slot of, with their limits: its tenant's (unless the tenant limit
/// is 0, off) and its kind's (if the kind has a `concurrency_limit`, copied onto the job at
/// submit).
pub fn pools_of(
    owner: &str,
    job_type: &str,
    kind_limit: Option<u32>,
    tenant_limit: u32,
) -> Vec<(Pool, u32)> {
    let mut pools = Vec::with_capacity(2);
    if tenant_limit > 0 {
        pools.push((Pool::Tenant(owner.to_owned()), tenant_limit));
    }
    if let Some(limit) = kind_limit.filter(|l| *l > 0) {
        pools.push((Pool::Kind(job_type.to_owned()), limit));
    }
    pools
}

/// A job in a waiting list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingEntry {
    /// Its sort key in the list.
    pub position: String,
    /// The job.
    pub job_id: String,
    /// Its owner (the message group of its dispatch message).
    pub owner: String,
}

/// The slot and waiting-list items of the job table.
#[derive(Debug, Clone)]
pub struct SlotStore {
    client: aws_sdk_dynamodb::Client,
    table: String,
}

impl SlotStore {
    /// An adapter for the slots kept in `table`.
    pub fn new(client: aws_sdk_dynamodb::Client, table: String) -> Self {
        SlotStore { client, table }
    }

    /// Takes a slot of `pool` (of `limit`) for `job_id`: `true` if the job holds one now
    /// (also when it already did), `false` if the pool is full.
    pub async fn acquire(&self, pool: &Pool, limit: u32, job_id: &str) -> Result<bool, AwsError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("ADD holders :job")
            .condition_expression(
                "attribute_not_exists(holders) OR size(holders) < :limit OR contains(holders, :id)",
            )
            .expression_attribute_values(":job", AttributeValue::Ss(vec![job_id.to_owned()]))
            .expression_attribute_values(":id", s(job_id))
            .expression_attribute_values(":limit", AttributeValue::N(limit.to_string()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => Err(AwsError::new(format!("take a slot for job {job_id}"), err)),
        }
    }

    /// Gives back the slots of `pool` that `job_ids` hold (none held: nothing changes);
    /// answers how many holders the pool has afterwards.
    pub async fn release(&self, pool: &Pool, job_ids: &[String]) -> Result<usize, AwsError> {
        if job_ids.is_empty() {
            return Ok(self.holders(pool).await?.len());
        }
        let output = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .update_expression("DELETE holders :jobs")
            .expression_attribute_values(":jobs", AttributeValue::Ss(job_ids.to_vec()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("give back the slots of {job_ids:?}"), e))?;
        Ok(output
            .attributes
            .and_then(|mut a| a.remove("holders"))
            .and_then(|v| v.as_ss().ok().map(Vec::len))
            .unwrap_or(0))
    }

    /// The jobs that hold a slot of `pool` (a consistent read).
    pub async fn holders(&self, pool: &Pool) -> Result<Vec<String>, AwsError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pool.holders_pk()))
            .key("sk", s(HOLDERS_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read a pool's slot holders", e))?;
        Ok(output
            .item
            .and_then(|mut item| item.remove("holders"))
            .and_then(|v| v.as_ss().ok().cloned())
            .unwrap_or_default())
    }

    /// Puts `job_id` of `owner` in `pool`'s waiting list at `position` (idempotent).
    pub async fn enter_waiting(
        &self,
        pool: &Pool,
        position: &str,
        job_id: &str,
        owner: &str,
    ) -> Result<(), AwsError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(HashMap::from([
                ("pk".to_owned(), s(pool.waiting_pk())),
                ("sk".to_owned(), s(position)),
                ("job_id".to_owned(), s(job_id)),
                ("owner".to_owned(), s(owner)),
            ])))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("put job {job_id} in a waiting list"), e))?;
        Ok(())
    }

    /// Takes the entry at `position` out of `pool`'s waiting list (idempotent).
    pub async fn leave_waiting(&self, pool: &Pool, position: &str) -> Result<(), AwsError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(pool.waiting_pk()))
            .key("sk", s(position))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("take {position} out of a waiting list"), e))?;
        Ok(())
    }

    /// The first `n` entries of `pool`'s waiting list, in admission order.
    pub async fn first_waiting(
        &self,
        pool: &Pool,
        n: usize,
    ) -> Result<Vec<WaitingEntry>, AwsError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(pool.waiting_pk()))
            .consistent_read(true)
            .limit(n.min(1_000) as i32)
            .send()
            .await
            .map_err(|e| AwsError::new("read a waiting list", e))?;
        Ok(output
            .items
            .unwrap_or_default()
            .into_iter()
            .filter_map(|item| {
                let position = item.get("sk")?.as_s().ok()?.clone();
                let job_id = job_of_waiting_key(&position)?.to_owned();
                let owner = item.get("owner")?.as_s().ok()?.clone();
                Some(WaitingEntry { position, job_id, owner })
            })
            .collect())
    }

    /// Every position in `pool`'s waiting list (all pages; only the keys are read): what the
    /// reaper checks its waiting jobs against, one query per pool instead of a read and a write
    /// per waiting job.
    pub async fn waiting_positions(&self, pool: &Pool) -> Result<HashSet<String>, AwsError> {
        let mut positions = HashSet::new();
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(pool.waiting_pk()))
            .projection_expression("sk")
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| AwsError::new("read a waiting list", e))?;
            positions.extend(
                page.items
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|mut item| item.remove("sk")?.as_s().ok().cloned()),
            );
        }
        Ok(positions)
    }
}

/// Frees and hands out slots: what the dispatcher, the slots function and the reaper share.
#[derive(Debug, Clone)]
pub struct Admitter {
    /// The slot items.
    pub slots: SlotStore,
    /// Where an admitted waiting job's dispatch message goes.
    pub intake: IntakeQueue,
}

impl Admitter {
    /// The admitter of the slots in `table`, waking jobs through the queue at
    /// `intake_queue_url`.
    pub fn new(sdk: &aws_config::SdkConfig, table: &str, intake_queue_url: &str) -> Self {
        Admitter {
            slots: SlotStore::new(aws_sdk_dynamodb::Client::new(sdk), table.to_owned()),
            intake: IntakeQueue::new(aws_sdk_sqs::Client::new(sdk), intake_queue_url.to_owned()),
        }
    }

    /// Gives back `job_ids`' slots of `pool` and admits as many waiting jobs as are free.
    pub async fn release(
        &self,
        pool: &Pool,
        limit: u32,
        job_ids: &[String],
    ) -> Result<usize, AwsError> {
        let held = self.slots.release(pool, job_ids).await?;
        self.admit(pool, limit, held).await
    }

    /// Sends a dispatch message for each of the first waiting jobs of `pool` that its free
    /// slots (`limit` less `held`) can take, and takes each out of the list, so that the next
    /// wake-up reaches the next job even while this one's dispatch is in flight; answers how
    /// many. Admitting only wakes a job: the dispatcher takes the slot, or finds it gone to a
    /// newcomer and puts the job back in the list at the same position (priority, then
    /// submission time: the key does not depend on when it re-enters). A wake-up message
    /// that is lost leaves the job waiting outside the list; the reaper puts it back.
    pub async fn admit(&self, pool: &Pool, limit: u32, held: usize) -> Result<usize, AwsError> {
        let free = longhaul_domain::admission::free_slots(limit, held);
        let waiting = self.slots.first_waiting(pool, free).await?;
        for entry in &waiting {
            let message = DispatchMessage { job_id: entry.job_id.clone() };
            self.intake.send(&message, &entry.owner).await?;
            self.slots.leave_waiting(pool, &entry.position).await?;
        }
        if !waiting.is_empty() {
            tracing::info!(pool = ?pool, admitted = waiting.len(), "waiting jobs admitted");
        }
        Ok(waiting.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_cannot_collide_across_names() {
        // Owner "a:b" and kind "a" with a crafted suffix never share a partition.
        let keys = [
            Pool::Tenant("a".into()).holders_pk(),
            Pool::Tenant("a:b".into()).holders_pk(),
            Pool::Kind("a".into()).holders_pk(),
            Pool::Kind("T#1:a".into()).holders_pk(),
        ];
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
        assert_eq!(Pool::Tenant("alice".into()).waiting_pk(), "WAITING#T#5:alice");
    }

    #[test]
    fn pools_follow_the_limits() {
        assert_eq!(pools_of("o", "k", None, 0), vec![]);
        assert_eq!(pools_of("o", "k", None, 2), vec![(Pool::Tenant("o".into()), 2)]);
        assert_eq!(
            pools_of("o", "k", Some(3), 2),
            vec![(Pool::Tenant("o".into()), 2), (Pool::Kind("k".into()), 3)]
        );
        assert_eq!(pools_of("o", "k", Some(0), 0), vec![], "a limit of 0 is no limit");
    }
}
