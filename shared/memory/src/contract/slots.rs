//! The slot pools' contract: a full pool refuses a slot and a holder takes its own again; a
//! slot is given back once; waiting lists read in priority, then submission order, and an
//! entry is there once; admission wakes a tenant pool's first jobs, and a kind pool's tenants
//! in turn (the one served least recently first), each woken job out of its list and sent its
//! dispatch message; a tenant with no job left leaves the ring; the reaper's seat check puts
//! back a tenant that has none. A give-back answers the pool's waiting mark: set by each entry,
//! taken away only by an admission that found no job waiting and read the mark as it still is;
//! without it, an admission after a give-back reads and wakes nothing.

use longhaul_domain::Owner;
use std::time::Duration;

use longhaul_aws::ports::SlotPools;
use longhaul_aws::slots::{Held, Pool, Seat};
use longhaul_domain::JobId;
use longhaul_domain::admission::{Priority, waiting_sort_key};

/// A name no other test uses.
fn fresh(what: &str) -> String {
    format!("contract-{what}-{}", JobId::new())
}

/// A tenant no other test has.
fn tenant(what: &str) -> Owner {
    crate::owner(&fresh(what))
}

fn sorted(mut ids: Vec<JobId>) -> Vec<JobId> {
    ids.sort();
    ids
}

/// A waiting job of `owner`: its id and its position.
struct Waiter {
    job_id: JobId,
    position: String,
}

impl Waiter {
    /// A job submitted `second` seconds into a fixed minute, at `priority`.
    fn new(priority: Priority, second: u32) -> Self {
        let job_id = JobId::new();
        let created_at = format!("2026-11-24T10:00:{second:02}.000Z");
        let position = waiting_sort_key(priority, &created_at, &job_id);
        Waiter { job_id, position }
    }

    async fn enter(&self, slots: &impl SlotPools, pool: &Pool, owner: &Owner) {
        slots.enter_waiting(pool, &self.position, &self.job_id, owner).await.unwrap();
    }

    async fn waits(&self, slots: &impl SlotPools, pool: &Pool, owner: &Owner) -> bool {
        slots.is_waiting(pool, owner, &self.position).await.unwrap()
    }
}

/// Lets the clock move on, so that ring places written one after the other are served in
/// that order (places of the same millisecond are ordered by tenant).
async fn tick() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// Runs every clause on `slots`; `woken` answers the job ids of the dispatch messages its
/// admissions sent so far (in any order; ids of other tests may be among them).
pub async fn slot_pools(slots: &impl SlotPools, woken: impl AsyncFn() -> Vec<JobId>) {
    slots_are_taken_and_given_back(slots).await;
    a_pause_gives_back_only_its_own_runs_slot(slots).await;
    waiting_lists_keep_their_order(slots).await;
    a_tenant_pool_admits_in_list_order(slots, &woken).await;
    a_kind_pool_admits_tenants_in_turn(slots, &woken).await;
    a_tenant_without_waiting_jobs_leaves_the_ring(slots, &woken).await;
    the_waiting_mark_says_whether_a_job_may_wait(slots, &woken).await;
}

async fn slots_are_taken_and_given_back(slots: &impl SlotPools) {
    let pool = Pool::Tenant(tenant("holder"));
    let [a, b, c] = [0; 3].map(|_| JobId::new());
    assert!(slots.holders(&pool).await.unwrap().is_empty(), "a new pool has no holder");
    assert!(slots.acquire(&pool, 2, &a, 0).await.unwrap());
    assert!(slots.acquire(&pool, 2, &b, 0).await.unwrap());
    assert!(!slots.acquire(&pool, 2, &c, 0).await.unwrap(), "a full pool refuses");
    let both = sorted(vec![a.clone(), b.clone()]);
    assert_eq!(sorted(slots.holders(&pool).await.unwrap()), both, "a refusal changes nothing");
    assert!(slots.acquire(&pool, 2, &a, 0).await.unwrap(), "a holder takes its own slot again");
    assert_eq!(sorted(slots.holders(&pool).await.unwrap()), both, "and holds one");

    assert_eq!(slots.give_back(&pool, std::slice::from_ref(&a)).await.unwrap().holders, 1);
    assert_eq!(slots.give_back(&pool, std::slice::from_ref(&a)).await.unwrap().holders, 1, "once");
    assert_eq!(
        slots.give_back(&pool, std::slice::from_ref(&c)).await.unwrap().holders,
        1,
        "a job that holds no slot frees none"
    );
    assert_eq!(slots.give_back(&pool, &[]).await.unwrap().holders, 1, "nothing given back: a read");
    assert!(slots.acquire(&pool, 2, &c, 0).await.unwrap(), "the slot given back is free");
    assert_eq!(slots.give_back(&pool, &[b.clone(), c.clone()]).await.unwrap().holders, 0);
    assert!(slots.holders(&pool).await.unwrap().is_empty());

    let untouched = Pool::Kind(fresh("untouched"));
    assert_eq!(slots.give_back(&untouched, std::slice::from_ref(&a)).await.unwrap().holders, 0);
    // The condition lets the first job into a pool no one holds, whatever its limit (pools
    // of limit 0 are never built: 0 is "no limit").
    assert!(slots.acquire(&untouched, 0, &a, 0).await.unwrap());
    assert!(!slots.acquire(&untouched, 0, &b, 0).await.unwrap());
    assert_eq!(slots.give_back(&untouched, std::slice::from_ref(&a)).await.unwrap().holders, 0);
}

/// A pause gives back the slot of the run it paused, never the slot the job's next run took
/// since (the id still in the set, so that run's `acquire` only moved the run on).
async fn a_pause_gives_back_only_its_own_runs_slot(slots: &impl SlotPools) {
    let pool = Pool::Tenant(tenant("runs"));
    let [a, b, c] = [0; 3].map(|_| JobId::new());
    assert!(slots.acquire(&pool, 2, &a, 0).await.unwrap());
    assert!(slots.acquire(&pool, 2, &b, 3).await.unwrap());
    assert_eq!(
        slots.give_back_run(&pool, &a, 0).await.unwrap().map(|h| h.holders),
        Some(1),
        "its own run's"
    );
    assert_eq!(
        slots.give_back_run(&pool, &a, 0).await.unwrap().map(|h| h.holders),
        Some(1),
        "idempotent"
    );
    // Paused in run 0, resumed: run 1 takes the slot again before the pause's give-back.
    assert!(slots.acquire(&pool, 2, &a, 0).await.unwrap());
    assert!(slots.acquire(&pool, 2, &a, 1).await.unwrap(), "the same slot, a later run");
    assert_eq!(
        slots.give_back_run(&pool, &a, 0).await.unwrap().map(|h| h.holders),
        None,
        "the late pause's"
    );
    assert!(!slots.acquire(&pool, 2, &c, 0).await.unwrap(), "the pool is still full");
    assert_eq!(sorted(slots.holders(&pool).await.unwrap()), sorted(vec![a.clone(), b.clone()]));
    // A dispatch that read the job before its resume writes the earlier run: the paused
    // run's give-back still frees it.
    assert!(slots.acquire(&pool, 2, &a, 0).await.unwrap());
    assert_eq!(slots.give_back_run(&pool, &a, 1).await.unwrap().map(|h| h.holders), Some(1));
    // An unconditional give-back frees whichever run holds it; a job holding none frees none.
    assert_eq!(slots.give_back(&pool, std::slice::from_ref(&b)).await.unwrap().holders, 0);
    assert_eq!(slots.give_back_run(&pool, &c, 0).await.unwrap().map(|h| h.holders), Some(0));
    assert!(slots.holders(&pool).await.unwrap().is_empty());
}

async fn waiting_lists_keep_their_order(slots: &impl SlotPools) {
    let owner = tenant("waiting");
    let pool = Pool::Tenant(owner.clone());
    let low = Waiter::new(Priority::Low, 0);
    let late = Waiter::new(Priority::Normal, 2);
    let high = Waiter::new(Priority::High, 3);
    let early = Waiter::new(Priority::Normal, 1);
    for waiter in [&low, &late, &high, &early] {
        waiter.enter(slots, &pool, &owner).await;
    }
    late.enter(slots, &pool, &owner).await; // again: still one entry
    let list = slots.first_waiting(&pool, &owner, 10).await.unwrap();
    let order: Vec<&JobId> = list.iter().map(|e| &e.job_id).collect();
    let expected = [&high, &early, &late, &low].map(|w| &w.job_id);
    assert_eq!(order, expected, "priority first, then submission time");
    for (entry, waiter) in list.iter().zip([&high, &early, &late, &low]) {
        assert_eq!((entry.position.as_str(), &entry.owner), (waiter.position.as_str(), &owner));
    }
    let first: Vec<JobId> = slots
        .first_waiting(&pool, &owner, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.job_id)
        .collect();
    assert_eq!(first, [high.job_id.clone(), early.job_id.clone()]);
    assert!(slots.first_waiting(&pool, &owner, 0).await.unwrap().is_empty());

    assert!(late.waits(slots, &pool, &owner).await);
    assert!(!Waiter::new(Priority::Normal, 9).waits(slots, &pool, &owner).await);
    slots.leave_waiting(&pool, &owner, &late.position).await.unwrap();
    assert!(!late.waits(slots, &pool, &owner).await, "left");
    slots.leave_waiting(&pool, &owner, &late.position).await.unwrap(); // again: nothing to do
    assert_eq!(slots.first_waiting(&pool, &owner, 10).await.unwrap().len(), 3);
    let other = tenant("other");
    assert!(
        slots.first_waiting(&Pool::Tenant(other.clone()), &other, 10).await.unwrap().is_empty()
    );

    // A kind pool keeps one list per tenant.
    let kind = Pool::Kind(fresh("lists"));
    let (alice, bob) = (tenant("alice"), tenant("bob"));
    let (of_alice, of_bob) = (Waiter::new(Priority::Normal, 0), Waiter::new(Priority::High, 0));
    of_alice.enter(slots, &kind, &alice).await;
    of_bob.enter(slots, &kind, &bob).await;
    let alices = slots.first_waiting(&kind, &alice, 10).await.unwrap();
    assert_eq!(alices.iter().map(|e| &e.job_id).collect::<Vec<_>>(), [&of_alice.job_id]);
    assert!(!of_bob.waits(slots, &kind, &alice).await, "bob's job is not in alice's list");
    assert!(of_bob.waits(slots, &kind, &bob).await);
    assert_eq!(slots.seat(&kind, &alice).await.unwrap(), Seat::Seated, "entering joined the ring");
}

async fn a_tenant_pool_admits_in_list_order(
    slots: &impl SlotPools,
    woken: &impl AsyncFn() -> Vec<JobId>,
) {
    let owner = tenant("admit");
    let pool = Pool::Tenant(owner.clone());
    let waiters = [1, 2, 3].map(|s| Waiter::new(Priority::Normal, s));
    for waiter in &waiters {
        waiter.enter(slots, &pool, &owner).await;
    }
    assert_eq!(slots.admit(&pool, 3, 3).await.unwrap(), 0, "no slot free: no one woken");
    assert_eq!(slots.admit(&pool, 3, 5).await.unwrap(), 0, "more held than the limit");
    for waiter in &waiters {
        assert!(waiter.waits(slots, &pool, &owner).await);
    }
    assert_eq!(slots.admit(&pool, 3, 1).await.unwrap(), 2, "two slots free");
    let sent = woken().await;
    for waiter in &waiters[..2] {
        assert!(sent.contains(&waiter.job_id), "{} woken", waiter.job_id);
        assert!(!waiter.waits(slots, &pool, &owner).await, "a woken job leaves its list");
    }
    assert!(!sent.contains(&waiters[2].job_id), "the third waits on");
    assert!(waiters[2].waits(slots, &pool, &owner).await);

    // Giving a slot back wakes who waits for it.
    let holder = JobId::new();
    assert!(slots.acquire(&pool, 1, &holder, 0).await.unwrap());
    assert_eq!(slots.release(&pool, 1, std::slice::from_ref(&holder)).await.unwrap(), 1);
    assert!(slots.holders(&pool).await.unwrap().is_empty());
    assert!(woken().await.contains(&waiters[2].job_id));
    assert!(slots.first_waiting(&pool, &owner, 10).await.unwrap().is_empty());
    assert_eq!(slots.admit(&pool, 1, 0).await.unwrap(), 0, "an empty list wakes no one");
}

async fn a_kind_pool_admits_tenants_in_turn(
    slots: &impl SlotPools,
    woken: &impl AsyncFn() -> Vec<JobId>,
) {
    let kind = Pool::Kind(fresh("turns"));
    let id = JobId::new();
    // Of the same length, `a-…` before `b-…`: a tie in the ring's time goes to the first.
    let (a, b) =
        (crate::owner(&format!("contract-a-{id}")), crate::owner(&format!("contract-b-{id}")));
    let of_a = [1, 2, 3].map(|s| Waiter::new(Priority::Normal, s));
    for waiter in &of_a {
        waiter.enter(slots, &kind, &a).await;
    }
    tick().await;
    let of_b = Waiter::new(Priority::High, 0);
    of_b.enter(slots, &kind, &b).await;
    tick().await;

    assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 1);
    let sent = woken().await;
    assert!(sent.contains(&of_a[0].job_id), "the tenant that joined first goes first");
    assert!(!sent.contains(&of_b.job_id), "b's turn is next, however high its priority");
    assert!(!of_a[0].waits(slots, &kind, &a).await);
    tick().await;

    assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 1);
    let sent = woken().await;
    assert!(sent.contains(&of_b.job_id), "a went to the back: b's turn");
    assert!(!sent.contains(&of_a[1].job_id));
    tick().await;

    // b has no job left: it left the ring with its last, and a takes every turn.
    assert_eq!(slots.admit(&kind, 3, 0).await.unwrap(), 2, "only two jobs wait");
    let sent = woken().await;
    assert!(sent.contains(&of_a[1].job_id) && sent.contains(&of_a[2].job_id));
    assert!(slots.first_waiting(&kind, &a, 10).await.unwrap().is_empty());
    assert_eq!(slots.admit(&kind, 3, 0).await.unwrap(), 0, "no one waits");
    assert_eq!(slots.seat(&kind, &b).await.unwrap(), Seat::Joined, "b had left the ring");
    assert_eq!(slots.seat(&kind, &a).await.unwrap(), Seat::Joined, "a left with its last job");
    assert_eq!(slots.seat(&kind, &a).await.unwrap(), Seat::Seated, "and has a place now");
}

async fn a_tenant_without_waiting_jobs_leaves_the_ring(
    slots: &impl SlotPools,
    woken: &impl AsyncFn() -> Vec<JobId>,
) {
    let kind = Pool::Kind(fresh("empty"));
    let owner = tenant("gone");
    let waiter = Waiter::new(Priority::Normal, 0);
    waiter.enter(slots, &kind, &owner).await;
    slots.leave_waiting(&kind, &owner, &waiter.position).await.unwrap(); // cancelled, say
    assert_eq!(slots.seat(&kind, &owner).await.unwrap(), Seat::Seated, "the place stays");
    assert_eq!(slots.admit(&kind, 1, 0).await.unwrap(), 0, "its turn wakes no one");
    assert!(!woken().await.contains(&waiter.job_id));
    assert_eq!(slots.seat(&kind, &owner).await.unwrap(), Seat::Joined, "it had left the ring");
}

async fn the_waiting_mark_says_whether_a_job_may_wait(
    slots: &impl SlotPools,
    woken: &impl AsyncFn() -> Vec<JobId>,
) {
    let owner = tenant("mark");
    let pool = Pool::Tenant(owner.clone());
    let holder = JobId::new();
    assert!(slots.acquire(&pool, 1, &holder, 0).await.unwrap());
    assert_eq!(slots.give_back(&pool, &[]).await.unwrap().waiting_mark, None, "no job waited");

    let first = Waiter::new(Priority::Normal, 1);
    first.enter(slots, &pool, &owner).await;
    let full = slots.give_back(&pool, &[]).await.unwrap();
    assert!(full.waiting_mark.is_some(), "an entry sets the mark");
    assert_eq!(slots.admit_marked(&pool, 1, &full).await.unwrap(), 0, "no slot free");
    let freed = slots.give_back(&pool, std::slice::from_ref(&holder)).await.unwrap();
    assert_eq!(freed, Held { holders: 0, waiting_mark: full.waiting_mark.clone() });
    assert_eq!(slots.admit_marked(&pool, 1, &freed).await.unwrap(), 1, "the waiter is woken");
    assert!(woken().await.contains(&first.job_id));
    let after = slots.give_back(&pool, &[]).await.unwrap();
    assert_eq!(after.waiting_mark, freed.waiting_mark, "an admission that woke a job keeps it");

    // A job entered (and left) since the give-back's read: its mark is newer than the one
    // read, and the admission that finds the list empty leaves it.
    let since = Waiter::new(Priority::Normal, 2);
    since.enter(slots, &pool, &owner).await;
    slots.leave_waiting(&pool, &owner, &since.position).await.unwrap();
    assert_eq!(slots.admit_marked(&pool, 1, &after).await.unwrap(), 0);
    let newer = slots.give_back(&pool, &[]).await.unwrap();
    assert!(newer.waiting_mark.is_some() && newer.waiting_mark != after.waiting_mark);
    assert_eq!(slots.admit_marked(&pool, 1, &newer).await.unwrap(), 0, "no one waits");
    assert_eq!(slots.give_back(&pool, &[]).await.unwrap().waiting_mark, None, "taken away");

    // Without the mark nothing is read; the reaper's `admit` reads whatever the mark says.
    let unmarked = Waiter::new(Priority::Normal, 3);
    unmarked.enter(slots, &pool, &owner).await;
    let lost = Held { holders: 0, waiting_mark: None };
    assert_eq!(slots.admit_marked(&pool, 1, &lost).await.unwrap(), 0);
    assert!(unmarked.waits(slots, &pool, &owner).await, "not woken");
    assert_eq!(slots.admit(&pool, 1, 0).await.unwrap(), 1);
    assert!(woken().await.contains(&unmarked.job_id));

    // A kind pool's mark: set by an entry, taken away once its ring is empty.
    let kind = Pool::Kind(fresh("mark"));
    let waiter = Waiter::new(Priority::Normal, 4);
    waiter.enter(slots, &kind, &owner).await;
    let held = slots.give_back(&kind, &[]).await.unwrap();
    assert!(held.waiting_mark.is_some(), "an entry in a kind pool's list sets its mark");
    assert_eq!(slots.admit_marked(&kind, 1, &held).await.unwrap(), 1);
    assert!(woken().await.contains(&waiter.job_id));
    assert_eq!(slots.admit_marked(&kind, 1, &held).await.unwrap(), 0, "its ring is empty");
    assert_eq!(slots.give_back(&kind, &[]).await.unwrap().waiting_mark, None);
}

/// The submission rate counted on a tenant pool's item (`longhaul_aws::pool_rate`): a slot
/// taken counts its submission in the same write, or neither changes; a full pool refuses the
/// slot whatever the window; a full window refuses both; a charge without a slot counts on
/// the same counter; a new minute starts at nought; a charge whose clock lags a minute behind
/// the stored one counts in the stored one. `other` is a second handle on the same pools (a
/// second process: the DynamoDB adapter's own guesses of the window are its own).
pub async fn pool_rates(slots: &impl SlotPools, other: &impl SlotPools) {
    use longhaul_aws::limits::Admission;
    use longhaul_aws::pool_rate::{Charged, RateCharge};
    let pool = Pool::Tenant(tenant("rate"));
    // Fixed minutes long past: no other test's charges share them.
    let minute = 1_700_000_040;
    let at = |minutes: i64, per_minute: u32| RateCharge { per_minute, now: minute + 60 * minutes };
    let [a, b, c, d] = [0; 4].map(|_| JobId::new());

    assert_eq!(slots.acquire_charged(&pool, 3, &a, 0, at(0, 2)).await.unwrap(), Charged::Taken);
    // Another process's first charge in a window this one opened (its guess is to open it).
    assert_eq!(other.acquire_charged(&pool, 3, &b, 0, at(0, 2)).await.unwrap(), Charged::Taken);
    let limited = slots.acquire_charged(&pool, 3, &c, 0, at(0, 2)).await.unwrap();
    assert!(matches!(limited, Charged::Limited { retry_after } if retry_after > 0), "{limited:?}");
    let held = sorted(vec![a.clone(), b.clone()]);
    assert_eq!(sorted(slots.holders(&pool).await.unwrap()), held, "a refused charge takes no slot");
    assert!(
        matches!(slots.charge(&pool, at(0, 2)).await.unwrap(), Admission::Limited { .. }),
        "a charge without a slot counts on the same counter"
    );

    // The next minute starts at nought; a charge alone counts in it too.
    assert_eq!(slots.charge(&pool, at(1, 2)).await.unwrap(), Admission::Admitted);
    assert_eq!(other.acquire_charged(&pool, 3, &c, 0, at(1, 2)).await.unwrap(), Charged::Taken);
    let full_window = slots.acquire_charged(&pool, 4, &d, 0, at(1, 2)).await.unwrap();
    assert!(matches!(full_window, Charged::Limited { .. }), "{full_window:?}");

    // Full pool: refused as full before the window is looked at, nothing counted.
    assert_eq!(slots.acquire_charged(&pool, 3, &d, 0, at(2, 1)).await.unwrap(), Charged::Full);
    assert_eq!(slots.charge(&pool, at(2, 1)).await.unwrap(), Admission::Admitted, "not counted");
    // A holder taking its own slot again is counted again (a new submission of the same job is
    // never made: each submission is a new job id).
    slots.give_back(&pool, std::slice::from_ref(&a)).await.unwrap();
    assert_eq!(slots.acquire_charged(&pool, 3, &d, 0, at(3, 5)).await.unwrap(), Charged::Taken);
    // A clock a minute behind counts in the newer window stored.
    assert_eq!(slots.charge(&pool, at(3, 2)).await.unwrap(), Admission::Admitted);
    assert!(matches!(other.charge(&pool, at(2, 2)).await.unwrap(), Admission::Limited { .. }));
    // A clock far ahead (not just the next minute) leaves a window the others take for stale.
    assert_eq!(slots.charge(&pool, at(10, 1)).await.unwrap(), Admission::Admitted);
    assert_eq!(other.charge(&pool, at(4, 1)).await.unwrap(), Admission::Admitted);
    assert!(matches!(slots.charge(&pool, at(4, 1)).await.unwrap(), Admission::Limited { .. }));
    // No limit: a plain acquire, nothing counted.
    assert_eq!(
        slots.acquire_charged(&pool, 3, &a, 0, at(3, 0)).await.unwrap(),
        Charged::Full,
        "the pool is full (b, c, d)"
    );
    slots.give_back(&pool, &[b, c, d]).await.unwrap();
    assert_eq!(slots.acquire_charged(&pool, 3, &a, 0, at(3, 0)).await.unwrap(), Charged::Taken);
    assert_eq!(slots.charge(&pool, at(3, 0)).await.unwrap(), Admission::Admitted);
    slots.give_back(&pool, std::slice::from_ref(&a)).await.unwrap();
}
