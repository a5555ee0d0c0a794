//! Admission: when a job may start running, under the running-job limits.
//!
//! A tenant may have at most `LONGHAUL_TENANT_MAX_RUNNING` jobs between dispatch and their end,
//! and a kind at most its policy's `concurrency_limit`. Each limit is a **pool** of slots. A job
//! takes a slot of every pool that applies to it before it is dispatched and gives them back
//! when it ends, however it ends. A job that finds a pool full **waits**: it stays `pending`,
//! holds no execution and no Lambda, and sits in the pool's waiting list until a slot frees.
//!
//! The order in which a pool's waiting jobs are admitted:
//!
//! * a **tenant pool** holds one tenant's jobs only: they are admitted by [`Priority`], then by
//!   submission time ([`waiting_sort_key`]);
//! * a **kind pool** is shared by every tenant that submits the kind, and is fair across them:
//!   each tenant with waiting jobs has its own list, ordered as a tenant pool's, and a **ring**
//!   of those tenants orders them by when each was last served ([`ring_key`]). A freed slot goes
//!   to the first job of the tenant served least recently, and that tenant moves to the back of
//!   the ring; a tenant that starts waiting joins at the back. So tenants take turns, one job
//!   each, and a tenant's priorities reorder only its own jobs: a backlog submitted as `high`
//!   never runs ahead of another tenant's earlier jobs.
//!
//! This module is the vocabulary and the ordering; the slot and waiting-list items are
//! `longhaul_aws::slots`.

use serde::{Deserialize, Serialize};

use crate::{JobId, Owner};

/// How urgent a job is among its tenant's waiting jobs (`"priority"` on `POST /jobs`).
/// Priority orders a waiting list only: it never lets a tenant past its limit, and a tenant's
/// priorities never reorder another tenant's jobs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Starts before every `normal` and `low` job of its tenant waiting for the same limit.
    High,
    /// The default.
    #[default]
    Normal,
    /// Starts after every `high` and `normal` job of its tenant waiting for the same limit.
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
    /// When it started waiting.
    pub since: crate::Timestamp,
    /// Its key in the waiting list ([`waiting_sort_key`]).
    pub position: String,
}

/// The sort key of a job in a waiting list — a tenant pool's, or its tenant's list in a kind
/// pool: priority first, then submission time, then the job id (unique, and a tie-break among
/// jobs of the same millisecond). A `Query` of the list in key order is the order in which its
/// jobs are admitted. The key depends only on the job: a job woken and refused again re-enters
/// at the same place.
pub fn waiting_sort_key(priority: Priority, created_at: &str, job_id: &JobId) -> String {
    format!("{}#{created_at}#{job_id}", priority.rank())
}

/// The sort key of a tenant's place in a kind pool's ring: when the tenant was last served
/// (RFC 3339 with milliseconds, as [`crate::format_rfc3339`] writes it: when a job of it was
/// last admitted, or when it joined the ring), then the tenant (length-prefixed, a tie-break
/// among tenants served in the same millisecond). A `Query` of the ring in key order starts
/// with the tenant served least recently: the one whose turn it is.
pub fn ring_key(served: &str, owner: &Owner) -> String {
    format!("{RING_PREFIX}{served}#{}:{owner}", owner.len())
}

/// What every [`ring_key`] starts with (a ring shares its partition with other items).
pub const RING_PREFIX: &str = "RING#";

/// The job id at the end of a waiting-list sort key, if the key ends with one.
pub fn job_of_waiting_key(key: &str) -> Option<JobId> {
    key.rsplit_once('#').and_then(|(_, id)| id.parse().ok())
}

/// How many waiting jobs a pool of `limit` slots with `held` of them taken can admit now.
pub fn free_slots(limit: u32, held: usize) -> usize {
    (limit as usize).saturating_sub(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The `n`th of some job ids, in key order.
    fn id(n: u128) -> JobId {
        uuid::Uuid::from_u128(n).hyphenated().to_string().parse().unwrap()
    }

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
        let key = waiting_sort_key(Priority::Low, "2026-11-24T10:00:00.000Z", &id(0x192ab));
        assert_eq!(job_of_waiting_key(&key), Some(id(0x192ab)));
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
            let ka = waiting_sort_key(pa, &at(ta), &id(0xa));
            let kb = waiting_sort_key(pb, &at(tb), &id(0xb));
            let expected = pa.cmp(&pb).then(ta.cmp(&tb)).then(id(0xa).cmp(&id(0xb)));
            prop_assert_eq!(ka.cmp(&kb), expected);
        }

        /// Ring order is turn order: the tenant served longer ago first, whatever the names.
        #[test]
        fn ring_order_is_least_recently_served_first(
            ta in 0i64..4_000_000_000_000, tb in 0i64..4_000_000_000_000,
            a in "[a-z:#]{1,12}", b in "[a-z:#]{1,12}",
        ) {
            let (a, b): (Owner, Owner) = (a.parse().unwrap(), b.parse().unwrap());
            let ka = ring_key(&millis(ta), &a);
            let kb = ring_key(&millis(tb), &b);
            prop_assert!(ka.starts_with(RING_PREFIX));
            if ta != tb {
                prop_assert_eq!(ka.cmp(&kb), ta.cmp(&tb));
            } else {
                prop_assert_eq!(ka == kb, a == b, "one key per tenant");
            }
        }

        /// However the jobs of several tenants are mixed, and whatever their priorities: each
        /// tenant's jobs start in its own priority-then-time order, and while two tenants both
        /// have jobs waiting, neither has had more than one job more admitted than the other.
        #[test]
        fn tenants_take_turns_and_priority_orders_only_their_own_jobs(
            jobs in proptest::collection::vec((0usize..3, 0usize..3, 0i64..1_000), 1..40),
        ) {
            let mut pool = KindPool::default();
            for (n, (tenant, priority, created)) in jobs.iter().enumerate() {
                pool.enter(&format!("t{tenant}"), Priority::ALL[*priority], *created, n);
            }
            let mut admitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
            while let Some((owner, position)) = pool.admit() {
                admitted.entry(owner.clone()).or_default().push(position);
                let still: Vec<&String> = pool.lists.iter()
                    .filter(|(_, list)| !list.is_empty()).map(|(o, _)| o).collect();
                for a in &still {
                    for b in &still {
                        let count = |o: &String| admitted.get(o).map_or(0, Vec::len);
                        prop_assert!(count(a) <= count(b) + 1, "{a} ran ahead of {b}: {admitted:?}");
                    }
                }
            }
            for (owner, positions) in &admitted {
                let mut sorted = positions.clone();
                sorted.sort();
                prop_assert_eq!(&sorted, positions, "{} out of order", owner);
            }
            prop_assert_eq!(admitted.values().map(Vec::len).sum::<usize>(), jobs.len());
        }
    }

    fn millis(t: i64) -> String {
        crate::format_rfc3339(chrono::DateTime::from_timestamp_millis(t).unwrap())
    }

    /// A kind pool as the table holds it (`longhaul_aws::slots`): each tenant's list and the
    /// ring, each a partition read in key order (here a `BTreeMap`), admitted from as the
    /// adapter does: the ring's first tenant gives its first job and moves to the back, or
    /// leaves the ring once its list is empty.
    #[derive(Default)]
    struct KindPool {
        lists: BTreeMap<String, BTreeSet<String>>,
        ring: BTreeMap<String, String>,
        seats: BTreeMap<String, String>,
        clock: i64,
    }

    impl KindPool {
        fn now(&mut self) -> String {
            self.clock += 1;
            millis(1_800_000_000_000 + self.clock)
        }

        /// A job refused by the pool: into its tenant's list; its tenant joins the ring at
        /// the back unless it is in it already.
        fn enter(&mut self, owner: &str, priority: Priority, created: i64, n: usize) {
            let position = waiting_sort_key(priority, &millis(created), &id(n as u128));
            self.lists.entry(owner.to_owned()).or_default().insert(position);
            if !self.seats.contains_key(owner) {
                let key = ring_key(&self.now(), &owner.parse().unwrap());
                self.ring.insert(key.clone(), owner.to_owned());
                self.seats.insert(owner.to_owned(), key);
            }
        }

        /// A freed slot: the job it goes to (its tenant, its position).
        fn admit(&mut self) -> Option<(String, String)> {
            loop {
                let (key, owner) = self.ring.pop_first()?;
                self.seats.remove(&owner);
                let list = self.lists.entry(owner.clone()).or_default();
                let Some(position) = list.pop_first() else { continue };
                if !list.is_empty() {
                    let back = ring_key(&self.now(), &owner.parse().unwrap());
                    assert!(back > key, "served moves a tenant back");
                    self.ring.insert(back.clone(), owner.clone());
                    self.seats.insert(owner.clone(), back);
                }
                return Some((owner, position));
            }
        }
    }

    #[test]
    fn a_high_priority_backlog_takes_turns_with_another_tenants_later_jobs() {
        let mut pool = KindPool::default();
        for n in 0..6 {
            pool.enter("a", Priority::High, n as i64, n);
        }
        for n in 6..9 {
            pool.enter("b", Priority::Normal, n as i64, n);
        }
        let order: Vec<String> = std::iter::from_fn(|| pool.admit()).map(|(o, _)| o).collect();
        assert_eq!(order, ["a", "b", "a", "b", "a", "b", "a", "a", "a"]);
    }

    #[test]
    fn priority_still_orders_one_tenants_own_jobs() {
        let mut pool = KindPool::default();
        pool.enter("a", Priority::Normal, 1, 1);
        pool.enter("a", Priority::Low, 0, 0);
        pool.enter("a", Priority::High, 2, 2);
        let jobs: Vec<JobId> = std::iter::from_fn(|| pool.admit())
            .filter_map(|(_, position)| job_of_waiting_key(&position))
            .collect();
        assert_eq!(jobs, [id(2), id(1), id(0)]);
    }

    #[test]
    fn a_tenant_that_starts_waiting_queues_behind_the_tenants_already_waiting() {
        let mut pool = KindPool::default();
        pool.enter("a", Priority::Normal, 0, 0);
        pool.enter("b", Priority::Normal, 1, 1);
        pool.enter("b", Priority::Normal, 2, 2);
        assert_eq!(pool.admit().map(|(o, _)| o).as_deref(), Some("a"));
        // `a` has nothing left and left the ring; coming back, it queues behind `b`.
        pool.enter("a", Priority::High, 3, 3);
        pool.enter("c", Priority::High, 4, 4);
        let order: Vec<String> = std::iter::from_fn(|| pool.admit()).map(|(o, _)| o).collect();
        assert_eq!(order, ["b", "a", "c", "b"]);
    }
}
