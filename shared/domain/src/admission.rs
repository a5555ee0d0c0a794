//! Admission: when a job may start running, under the running-job limits.
//!
//! A tenant may have at most `LONGHAUL_TENANT_MAX_RUNNING` jobs between dispatch and their end,
//! and a kind at most its policy's `concurrency_limit`. Each limit is a **pool** of slots. A job
//! takes a slot of every pool that applies to it before it is dispatched and gives them back
//! when it ends, however it ends. A job that finds a pool full **waits**: it stays `pending`,
//! holds no execution and no Lambda, and sits in the pool's waiting list, ordered by
//! [`Priority`] and then by submission time, until a slot frees.
//!
//! This module is the vocabulary and the ordering; the slot and waiting-list items are
//! `longhaul_aws::slots`.

use serde::{Deserialize, Serialize};

/// How urgent a job is among its tenant's waiting jobs (`"priority"` on `POST /jobs`).
/// Priority orders a waiting list only: it never lets a tenant past its limit, and a tenant's
/// priorities never reorder another tenant's jobs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Starts before every `normal` and `low` job of the same waiting list.
    High,
    /// The default.
    #[default]
    Normal,
    /// Starts after every `high` and `normal` job of the same waiting list.
    Low,
}

impl Priority {
    /// Every priority, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The digit that leads a waiting-list sort key: lower starts first.
    fn rank(self) -> u8 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }

    /// The priority named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// Whether this is the default (left off the job record and the API's answers).
    pub fn is_normal(&self) -> bool {
        *self == Priority::Normal
    }
}

/// Which limit a job waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Its tenant has as many jobs running as `LONGHAUL_TENANT_MAX_RUNNING` allows.
    TenantLimit,
    /// Its kind has as many jobs running as its policy's `concurrency_limit` allows.
    KindLimit,
}

impl WaitReason {
    /// What `GET /jobs/{id}` says about the wait.
    pub fn message(self, limit: u32) -> String {
        match self {
            WaitReason::TenantLimit => format!(
                "Waiting for a slot: you have {limit} job(s) running, your limit; it starts when \
                 one of them ends."
            ),
            WaitReason::KindLimit => format!(
                "Waiting for a slot: this job type runs at most {limit} job(s) at once; it starts \
                 when one of them ends."
            ),
        }
    }
}

/// Why and since when a `pending` job waits (on the job record while it waits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// The limit it waits for.
    pub reason: WaitReason,
    /// The limit's value when the job was refused.
    pub limit: u32,
    /// When it started waiting (RFC 3339, as stored).
    pub since: String,
    /// Its key in the waiting list ([`waiting_sort_key`]).
    pub position: String,
}

/// The sort key of a job in a waiting list: priority first, then submission time, then the
/// job id (unique, and a tie-break among jobs of the same millisecond). A `Query` of the list
/// in key order is the order in which jobs are admitted.
pub fn waiting_sort_key(priority: Priority, created_at: &str, job_id: &str) -> String {
    format!("{}#{created_at}#{job_id}", priority.rank())
}

/// The job id at the end of a waiting-list sort key.
pub fn job_of_waiting_key(key: &str) -> Option<&str> {
    key.rsplit_once('#').map(|(_, id)| id).filter(|id| !id.is_empty())
}

/// How many waiting jobs a pool of `limit` slots with `held` of them taken can admit now.
pub fn free_slots(limit: u32, held: usize) -> usize {
    (limit as usize).saturating_sub(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn priorities_parse_and_default() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        assert_eq!(Priority::parse("urgent"), None);
        assert_eq!(Priority::default(), Priority::Normal);
    }

    #[test]
    fn the_job_id_comes_back_from_its_key() {
        let key = waiting_sort_key(Priority::Low, "2026-11-24T10:00:00.000Z", "0192-ab");
        assert_eq!(job_of_waiting_key(&key), Some("0192-ab"));
        assert_eq!(job_of_waiting_key("1#x#"), None);
    }

    #[test]
    fn free_slots_never_underflow() {
        assert_eq!(free_slots(2, 0), 2);
        assert_eq!(free_slots(2, 2), 0);
        assert_eq!(free_slots(2, 5), 0);
    }

    proptest! {
        /// Key order is admission order: a more urgent priority first whatever the times,
        /// then the earlier submission, among RFC 3339 times of one format.
        #[test]
        fn key_order_is_priority_then_fifo(
            a in 0usize..3, b in 0usize..3,
            ta in 0i64..4_000_000_000, tb in 0i64..4_000_000_000,
        ) {
            let at = |t: i64| crate::format_rfc3339(chrono::DateTime::from_timestamp(t, 0).unwrap());
            let (pa, pb) = (Priority::ALL[a], Priority::ALL[b]);
            let ka = waiting_sort_key(pa, &at(ta), "a");
            let kb = waiting_sort_key(pb, &at(tb), "b");
            let expected = pa.cmp(&pb).then(ta.cmp(&tb)).then("a".cmp("b"));
            prop_assert_eq!(ka.cmp(&kb), expected);
        }
    }
}
