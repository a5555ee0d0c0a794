//! Running-slot pools, waiting lists and kind pools' rings in memory, item for item as
//! `longhaul_aws::slots` keeps them in the job table: a pool's holders set, each waiting list
//! in key order, and a ring's `MEMBER#` items (the truth about a tenant's place) beside its
//! `RING#` places (the order to read them in). Every step the DynamoDB adapter takes in one
//! request is one step under the lock here, in the same order, so a failure half-way (the
//! intake queue refusing a wake-up) leaves what the DynamoDB adapter leaves.

use longhaul_domain::{JobId, Owner};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::limits::Admission;
use longhaul_aws::pool_rate::{Charged, RateCharge};
use longhaul_aws::ports::{DispatchQueue, SlotPools, Warm};
use longhaul_aws::queue::DispatchMessage;
use longhaul_aws::slots::{Held, Pool, RingChange, Seat, Turn, WaitingEntry};
use longhaul_domain::admission::{free_slots, job_of_waiting_key, ring_key};
use longhaul_domain::format_rfc3339;
use longhaul_domain::limits::{RateWindow, WindowCharge};

use crate::Outage;

/// Most ring places one admission passes without waking a job (as the DynamoDB adapter).
const MAX_EMPTY_TURNS: usize = 10;

/// A tenant's `MEMBER#` item: the place it names, and when the tenant was served.
#[derive(Debug, Clone)]
struct Member {
    ring: String,
    served: String,
}

/// A `RING#` place: its tenant and when it was served.
#[derive(Debug, Clone)]
struct Place {
    owner: Owner,
    served: String,
}

/// The slot items, by the partition keys the table uses.
#[derive(Debug, Default)]
struct Items {
    /// A pool's holders, by [`Pool::holders_pk`], each with the run that holds its slot.
    holders: BTreeMap<String, BTreeMap<JobId, u32>>,
    /// A pool's waiting mark, by [`Pool::holders_pk`] (the holders item's `waiters`).
    marks: BTreeMap<String, String>,
    /// Waiting lists, by [`Pool::waiting_list_pk`]: position → owner.
    lists: BTreeMap<String, BTreeMap<String, Owner>>,
    /// A kind pool's members, by [`Pool::waiting_pk`], then tenant.
    members: BTreeMap<String, BTreeMap<Owner, Member>>,
    /// A kind pool's ring places, by [`Pool::waiting_pk`], then [`ring_key`].
    places: BTreeMap<String, BTreeMap<String, Place>>,
    /// A pool's submission window, by [`Pool::holders_pk`] (the holders item's `rate_window`
    /// and `rate_n`, [`longhaul_aws::pool_rate`]).
    rates: BTreeMap<String, (i64, u64)>,
}

impl Items {
    /// Counts one submission `rate` on the pool's item, unless its window is full: what
    /// both of the DynamoDB adapter's conditional charges together allow.
    fn charge(&mut self, pool: &Pool, rate: RateCharge) -> Admission {
        let window = RateWindow::at(rate.now);
        let stored = self.rates.get(&pool.holders_pk()).copied();
        match WindowCharge::after_refusal(window.index, stored, rate.per_minute) {
            None => Admission::Limited { retry_after: window.retry_after },
            Some(charge) => {
                let count = match charge {
                    WindowCharge::Add { .. } => stored.map_or(0, |(_, n)| n) + 1,
                    WindowCharge::Open { .. } => 1,
                };
                self.rates.insert(pool.holders_pk(), (charge.index(), count));
                Admission::Admitted
            }
        }
    }

    /// The pool's holders item as it is.
    fn held(&self, pool: &Pool) -> Held {
        let key = pool.holders_pk();
        Held {
            holders: self.holders.get(&key).map_or(0, BTreeMap::len),
            waiting_mark: self.marks.get(&key).cloned(),
        }
    }

    /// Sets the pool's waiting mark to a value never set before.
    fn mark_waiting(&mut self, pool: &Pool) {
        self.marks.insert(pool.holders_pk(), JobId::new().to_string());
    }

    fn first_waiting(&self, pool: &Pool, owner: &Owner, n: usize) -> Vec<WaitingEntry> {
        let Some(list) = self.lists.get(&pool.waiting_list_pk(owner)) else { return Vec::new() };
        list.iter()
            .take(n.min(1_000))
            .filter_map(|(position, owner)| {
                Some(WaitingEntry {
                    position: position.clone(),
                    job_id: job_of_waiting_key(position)?,
                    owner: owner.clone(),
                })
            })
            .collect()
    }

    /// Takes `position` out of the list: whether it was there.
    fn claim_waiting(&mut self, pool: &Pool, owner: &Owner, position: &str) -> bool {
        self.lists
            .get_mut(&pool.waiting_list_pk(owner))
            .is_some_and(|list| list.remove(position).is_some())
    }

    fn put_place(&mut self, pool: &Pool, owner: &Owner, served: &str) -> String {
        let key = ring_key(served, owner);
        let place = Place { owner: owner.to_owned(), served: served.to_owned() };
        self.places.entry(pool.waiting_pk()).or_default().insert(key.clone(), place);
        key
    }

    fn member(&self, pool: &Pool, owner: &Owner) -> Option<&Member> {
        self.members.get(&pool.waiting_pk())?.get(owner)
    }

    fn put_member(&mut self, pool: &Pool, owner: &Owner, served: &str) {
        let member = Member { ring: ring_key(served, owner), served: served.to_owned() };
        self.members.entry(pool.waiting_pk()).or_default().insert(owner.to_owned(), member);
    }

    fn join_ring(&mut self, pool: &Pool, owner: &Owner) -> RingChange {
        if self.member(pool, owner).is_some() {
            return RingChange::Raced;
        }
        let served = format_rfc3339(chrono::Utc::now());
        self.put_member(pool, owner, &served);
        self.put_place(pool, owner, &served);
        RingChange::Done
    }

    fn first_turn(&self, pool: &Pool) -> Option<Turn> {
        let (key, place) = self.places.get(&pool.waiting_pk())?.first_key_value()?;
        Some(Turn { key: key.clone(), owner: place.owner.clone(), served: place.served.clone() })
    }

    /// The tenant of `turn` moves to the back (its new place), unless its member names
    /// another place; the place read is deleted either way.
    fn take_turn(&mut self, pool: &Pool, turn: &Turn) -> Option<String> {
        let now = chrono::Utc::now();
        let served = chrono::DateTime::parse_from_rfc3339(&turn.served)
            .map(|at| at.to_utc() + chrono::Duration::milliseconds(1))
            .map_or(now, |after| after.max(now));
        let served = format_rfc3339(served);
        let names_it = self.member(pool, &turn.owner).is_some_and(|m| m.ring == turn.key);
        let back = names_it.then(|| {
            self.put_member(pool, &turn.owner, &served);
            self.put_place(pool, &turn.owner, &served)
        });
        self.delete_place(pool, &turn.key);
        back
    }

    fn delete_place(&mut self, pool: &Pool, key: &str) {
        if let Some(places) = self.places.get_mut(&pool.waiting_pk()) {
            places.remove(key);
        }
    }

    /// Takes `owner` out of the ring unless its place is no longer `place`; a tenant found
    /// waiting after joins again.
    fn leave_ring(&mut self, pool: &Pool, owner: &Owner, place: &str) {
        if self.member(pool, owner).is_none_or(|m| m.ring != place) {
            return;
        }
        if let Some(members) = self.members.get_mut(&pool.waiting_pk()) {
            members.remove(owner);
        }
        self.delete_place(pool, place);
        if !self.first_waiting(pool, owner, 1).is_empty() {
            self.join_ring(pool, owner);
        }
    }
}

/// The slot pools in memory, waking jobs through `intake` as the admitter wakes them through
/// the intake queue.
#[derive(Debug)]
pub struct MemorySlotPools {
    items: Mutex<Items>,
    intake: Arc<dyn DispatchQueue>,
    outage: Outage,
}

impl MemorySlotPools {
    /// No slot held, no job waiting; woken jobs' messages go to `intake`.
    pub fn new(intake: Arc<dyn DispatchQueue>) -> Self {
        MemorySlotPools { items: Mutex::default(), intake, outage: Outage::default() }
    }

    /// While `down`, every call fails as an unavailable table does.
    pub fn set_unavailable(&self, down: bool) {
        self.outage.set(down);
    }

    /// The tenants of kind pool `pool`'s ring, in turn order (whose turn it is first).
    pub fn ring(&self, pool: &Pool) -> Vec<Owner> {
        let items = self.items();
        let places = items.places.get(&pool.waiting_pk());
        places.into_iter().flatten().map(|(_, place)| place.owner.clone()).collect()
    }

    /// Deletes `owner`'s place in `pool`'s ring and keeps its member (a test's arrangement of
    /// a crash between the two writes, which the reaper's [`SlotPools::seat`] repairs).
    pub fn lose_place(&self, pool: &Pool, owner: &Owner) {
        let mut items = self.items();
        if let Some(member) = items.member(pool, owner).cloned() {
            items.delete_place(pool, &member.ring);
        }
    }

    fn items(&self) -> MutexGuard<'_, Items> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn wake(&self, entry: &WaitingEntry) -> Result<(), AwsError> {
        let message = DispatchMessage::new(entry.job_id.clone());
        self.intake.send(&message, &entry.owner).await
    }

    /// The first `free` jobs of a tenant pool's list: each is sent its message, then leaves
    /// the list.
    async fn admit_in_order(
        &self,
        pool: &Pool,
        owner: &Owner,
        free: usize,
    ) -> Result<(usize, bool), AwsError> {
        let waiting = self.items().first_waiting(pool, owner, free);
        for entry in &waiting {
            self.wake(entry).await?;
            self.items().claim_waiting(pool, owner, &entry.position);
        }
        Ok((waiting.len(), waiting.is_empty()))
    }

    /// `free` jobs of a kind pool, one per turn of its ring; and whether its first read found
    /// the ring empty.
    async fn admit_by_turns(&self, pool: &Pool, free: usize) -> Result<(usize, bool), AwsError> {
        let (mut admitted, mut passed, mut none_waiting) = (0, 0, false);
        while admitted < free && passed < MAX_EMPTY_TURNS {
            let (turn, place, entry, last) = {
                let mut items = self.items();
                let Some(turn) = items.first_turn(pool) else {
                    none_waiting = admitted == 0 && passed == 0;
                    break;
                };
                let Some(place) = items.take_turn(pool, &turn) else {
                    passed += 1;
                    continue;
                };
                let waiting = items.first_waiting(pool, &turn.owner, 2);
                let Some(entry) = waiting.first().cloned() else {
                    items.leave_ring(pool, &turn.owner, &place);
                    passed += 1;
                    continue;
                };
                let claimed = items.claim_waiting(pool, &turn.owner, &entry.position);
                (turn, place, claimed.then_some(entry), waiting.len() == 1)
            };
            if let Some(entry) = entry {
                self.wake(&entry).await?;
                admitted += 1;
            }
            if last {
                self.items().leave_ring(pool, &turn.owner, &place);
            }
        }
        Ok((admitted, none_waiting))
    }

    /// Wakes `free` waiting jobs of `pool`: how many, and whether none waited at all.
    async fn admit_free(&self, pool: &Pool, free: usize) -> Result<(usize, bool), AwsError> {
        match pool {
            Pool::Tenant(owner) => self.admit_in_order(pool, owner, free).await,
            Pool::Kind(_) => self.admit_by_turns(pool, free).await,
        }
    }
}

#[async_trait]
impl Warm for MemorySlotPools {}

#[async_trait]
impl SlotPools for MemorySlotPools {
    async fn acquire(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
    ) -> Result<bool, AwsError> {
        self.outage.check(&format!("take a slot for job {job_id}"))?;
        let mut items = self.items();
        let holders = items.holders.entry(pool.holders_pk()).or_default();
        // `attribute_not_exists(holders) OR size(holders) < :limit OR contains(holders, :id)`
        // (an empty set is no attribute in DynamoDB).
        let room =
            holders.is_empty() || holders.len() < limit as usize || holders.contains_key(job_id);
        if room {
            holders.insert(job_id.to_owned(), run);
        }
        Ok(room)
    }

    async fn acquire_counting(
        &self,
        pool: &Pool,
        limit: u32,
        job_id: &JobId,
        run: u32,
        rate: RateCharge,
    ) -> Result<Charged, AwsError> {
        self.outage.check(&format!("take a slot for job {job_id}"))?;
        let mut items = self.items();
        let holders = items.holders.entry(pool.holders_pk()).or_default();
        let room =
            holders.is_empty() || holders.len() < limit as usize || holders.contains_key(job_id);
        if !room {
            return Ok(Charged::Full);
        }
        match items.charge(pool, rate) {
            Admission::Limited { retry_after } => Ok(Charged::Limited { retry_after }),
            Admission::Admitted => {
                items.holders.entry(pool.holders_pk()).or_default().insert(job_id.to_owned(), run);
                Ok(Charged::Taken)
            }
        }
    }

    async fn count_submission(&self, pool: &Pool, rate: RateCharge) -> Result<Admission, AwsError> {
        self.outage.check("count a submission")?;
        Ok(self.items().charge(pool, rate))
    }

    async fn give_back_run(
        &self,
        pool: &Pool,
        job_id: &JobId,
        run: u32,
    ) -> Result<Option<Held>, AwsError> {
        self.outage.check(&format!("give back the slot of job {job_id}'s run {run}"))?;
        let mut items = self.items();
        let holders = items.holders.entry(pool.holders_pk()).or_default();
        // `attribute_not_exists(#run) OR #run <= :run`
        if holders.get(job_id).is_some_and(|held_by| *held_by > run) {
            return Ok(None);
        }
        holders.remove(job_id);
        Ok(Some(items.held(pool)))
    }

    async fn give_back(&self, pool: &Pool, job_ids: &[JobId]) -> Result<Held, AwsError> {
        self.outage.check("give back slots")?;
        let mut items = self.items();
        let holders = items.holders.entry(pool.holders_pk()).or_default();
        for job_id in job_ids {
            holders.remove(job_id);
        }
        Ok(items.held(pool))
    }

    async fn holders(&self, pool: &Pool) -> Result<Vec<JobId>, AwsError> {
        self.outage.check("read a pool's slot holders")?;
        let items = self.items();
        Ok(items
            .holders
            .get(&pool.holders_pk())
            .into_iter()
            .flatten()
            .map(|(id, _)| id.clone())
            .collect())
    }

    async fn enter_waiting(
        &self,
        pool: &Pool,
        position: &str,
        job_id: &JobId,
        owner: &Owner,
    ) -> Result<(), AwsError> {
        self.outage.check(&format!("put job {job_id} in a waiting list"))?;
        let mut items = self.items();
        let list = items.lists.entry(pool.waiting_list_pk(owner)).or_default();
        list.insert(position.to_owned(), owner.to_owned());
        if matches!(pool, Pool::Kind(_)) {
            items.join_ring(pool, owner);
        }
        items.mark_waiting(pool);
        Ok(())
    }

    async fn leave_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<(), AwsError> {
        self.outage.check(&format!("take {position} out of a waiting list"))?;
        self.items().claim_waiting(pool, owner, position);
        Ok(())
    }

    async fn is_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        position: &str,
    ) -> Result<bool, AwsError> {
        self.outage.check("read a waiting-list item")?;
        let items = self.items();
        Ok(items.lists.get(&pool.waiting_list_pk(owner)).is_some_and(|l| l.contains_key(position)))
    }

    async fn first_waiting(
        &self,
        pool: &Pool,
        owner: &Owner,
        n: usize,
    ) -> Result<Vec<WaitingEntry>, AwsError> {
        self.outage.check("read a waiting list")?;
        Ok(self.items().first_waiting(pool, owner, n))
    }

    async fn seat(&self, pool: &Pool, owner: &Owner) -> Result<Seat, AwsError> {
        self.outage.check("read a tenant's place in a ring")?;
        let mut items = self.items();
        let Some(member) = items.member(pool, owner).cloned() else {
            return Ok(match items.join_ring(pool, owner) {
                RingChange::Done => {
                    items.mark_waiting(pool);
                    Seat::Joined
                }
                RingChange::Raced => Seat::Seated,
            });
        };
        if items.places.get(&pool.waiting_pk()).is_some_and(|p| p.contains_key(&member.ring)) {
            return Ok(Seat::Seated);
        }
        items.put_place(pool, owner, &member.served);
        items.mark_waiting(pool);
        Ok(Seat::Restored)
    }

    async fn admit(&self, pool: &Pool, limit: u32, held: usize) -> Result<usize, AwsError> {
        let free = free_slots(limit, held);
        if free == 0 {
            return Ok(0); // no request made: nothing to fail
        }
        self.outage.check("admit waiting jobs")?;
        Ok(self.admit_free(pool, free).await?.0)
    }

    async fn admit_marked(&self, pool: &Pool, limit: u32, held: &Held) -> Result<usize, AwsError> {
        let Some(mark) = &held.waiting_mark else { return Ok(0) };
        let free = free_slots(limit, held.holders);
        if free == 0 {
            return Ok(0); // no request made: nothing to fail
        }
        self.outage.check("admit waiting jobs")?;
        let (woken, none_waiting) = self.admit_free(pool, free).await?;
        if none_waiting {
            // `REMOVE waiters` on condition `waiters = :mark`.
            let mut items = self.items();
            let key = pool.holders_pk();
            if items.marks.get(&key) == Some(mark) {
                items.marks.remove(&key);
            }
        }
        Ok(woken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryDispatchQueue;
    use crate::{nth_job, owner};
    use longhaul_domain::admission::{Priority, waiting_sort_key};

    fn pools() -> (Arc<MemoryDispatchQueue>, MemorySlotPools) {
        let queue = Arc::new(MemoryDispatchQueue::new());
        let slots = MemorySlotPools::new(queue.clone());
        (queue, slots)
    }

    fn position(job_id: &JobId) -> String {
        waiting_sort_key(Priority::Normal, "2026-11-24T10:00:00.000Z", job_id)
    }

    #[tokio::test]
    async fn the_memory_slot_pools_keep_the_slot_pools_contract() {
        let (queue, slots) = pools();
        let woken = async || queue.sent().into_iter().map(|(m, _, _)| m.job_id).collect();
        crate::contract::slot_pools(&slots, woken).await;
        crate::contract::pool_rates(&slots, &slots).await;
    }

    #[tokio::test]
    async fn a_woken_job_is_sent_to_its_owners_group_at_once() {
        let (queue, slots) = pools();
        let pool = Pool::Tenant(owner("alice"));
        slots
            .enter_waiting(&pool, &position(&nth_job(1)), &nth_job(1), &owner("alice"))
            .await
            .unwrap();
        assert_eq!(slots.admit(&pool, 1, 0).await.unwrap(), 1);
        let sent = queue.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!((&sent[0].0.job_id, sent[0].1, &sent[0].2), (&nth_job(1), 0, &owner("alice")));
    }

    #[tokio::test]
    async fn a_lost_ring_place_is_restored_by_the_seat_check() {
        let (_, slots) = pools();
        let kind = Pool::Kind("demo".into());
        slots
            .enter_waiting(&kind, &position(&nth_job(1)), &nth_job(1), &owner("alice"))
            .await
            .unwrap();
        assert_eq!(slots.ring(&kind), [owner("alice")]);
        slots.lose_place(&kind, &owner("alice"));
        assert!(slots.ring(&kind).is_empty());
        assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 0, "no place: no turn");
        assert_eq!(slots.seat(&kind, &owner("alice")).await.unwrap(), Seat::Restored);
        assert_eq!(slots.ring(&kind), [owner("alice")]);
        assert_eq!(slots.seat(&kind, &owner("alice")).await.unwrap(), Seat::Seated);
        assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 1, "its turn comes again");
    }

    #[tokio::test]
    async fn a_refused_wake_up_leaves_what_the_dynamodb_adapter_leaves() {
        // A tenant pool sends before the job leaves its list: the job waits on in it.
        let (queue, slots) = pools();
        let pool = Pool::Tenant(owner("alice"));
        slots
            .enter_waiting(&pool, &position(&nth_job(1)), &nth_job(1), &owner("alice"))
            .await
            .unwrap();
        queue.set_unavailable(true);
        assert!(slots.admit(&pool, 1, 0).await.is_err());
        assert!(slots.is_waiting(&pool, &owner("alice"), &position(&nth_job(1))).await.unwrap());
        // A kind pool claims the job first (of two admitters, one wakes it): it is out of its
        // list, waiting outside it for the reaper to put it back.
        let kind = Pool::Kind("demo".into());
        slots
            .enter_waiting(&kind, &position(&nth_job(2)), &nth_job(2), &owner("bob"))
            .await
            .unwrap();
        assert!(slots.admit(&kind, 1, 0).await.is_err());
        assert!(!slots.is_waiting(&kind, &owner("bob"), &position(&nth_job(2))).await.unwrap());
        assert_eq!(slots.ring(&kind), [owner("bob")], "its turn was taken; it leaves at the next");
        queue.set_unavailable(false);
        assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 0);
        assert!(slots.ring(&kind).is_empty());
    }

    #[tokio::test]
    async fn an_unavailable_store_fails_every_call_but_an_admission_with_no_room_or_no_mark() {
        let (_, slots) = pools();
        let pool = Pool::Tenant(owner("alice"));
        slots.set_unavailable(true);
        assert!(slots.acquire(&pool, 1, &nth_job(1), 0).await.is_err());
        assert!(slots.give_back(&pool, &[]).await.is_err());
        assert!(
            slots
                .enter_waiting(&pool, &position(&nth_job(1)), &nth_job(1), &owner("alice"))
                .await
                .is_err()
        );
        assert!(slots.admit(&pool, 1, 0).await.is_err());
        assert_eq!(slots.admit(&pool, 1, 1).await.unwrap(), 0, "no slot free: no request");
        let unmarked = Held { holders: 0, waiting_mark: None };
        assert_eq!(
            slots.admit_marked(&pool, 1, &unmarked).await.unwrap(),
            0,
            "no mark: no request"
        );
        let full = Held { holders: 1, waiting_mark: Some("a mark".into()) };
        assert_eq!(slots.admit_marked(&pool, 1, &full).await.unwrap(), 0, "no slot free either");
        let marked = Held { holders: 0, waiting_mark: Some("a mark".into()) };
        assert!(slots.admit_marked(&pool, 1, &marked).await.is_err(), "a mark and a slot: a read");
        slots.set_unavailable(false);
        assert!(slots.holders(&pool).await.unwrap().is_empty(), "nothing changed");
        assert!(slots.first_waiting(&pool, &owner("alice"), 10).await.unwrap().is_empty());
    }
}
