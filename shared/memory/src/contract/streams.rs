//! The open-stream caps' contract ([`StreamCaps`]): a full job, tenant or deployment refuses,
//! in that order, naming its scope, and leaves nothing held; a release frees at once and may
//! be repeated; an expired lease stops counting; a cap of 0 is off; racing streams cannot both
//! take the last slot.

use longhaul_aws::limits::{SlotError, StreamLease};
use longhaul_aws::ports::StreamCaps;
use longhaul_domain::JobId;
use longhaul_domain::Owner;
use longhaul_domain::limits::MAX_STREAM_RETRY_AFTER;

use super::fresh_owner;

/// Runs the whole contract on the adapters `slots` builds: `slots(per_job, per_tenant,
/// per_deployment)` is an adapter with those caps (0: off) over the one store the contract
/// runs on. Panics, naming the clause, on the first breach.
///
/// Owners and jobs are fresh; the deployment's slot item is not anyone's, so the clause on it
/// assumes no other stream holds a deployment slot of the store while it runs (true of a
/// test binary that streams nothing else). Every lease it takes expires within two minutes.
pub async fn stream_slots<S: StreamCaps>(slots: impl Fn(usize, usize, usize) -> S) {
    the_job_cap_refuses_before_the_tenant_cap(&slots(2, 3, 0)).await;
    a_refused_acquire_holds_nothing(&slots(2, 3, 0)).await;
    a_release_frees_at_once_and_may_be_repeated(&slots(1, 0, 0)).await;
    an_expired_lease_stops_counting(&slots(1, 0, 0)).await;
    the_deployment_cap_counts_every_tenant(&slots(0, 2, 3)).await;
    caps_of_zero_are_off(&slots(0, 0, 0)).await;
    racing_streams_cannot_both_take_the_last_slot(&slots(1, 0, 0)).await;
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A lease's expiry for the contract's streams: soon, so a run that stops half-way leaves
/// nothing held for long.
fn soon() -> i64 {
    now() + 120
}

fn job() -> JobId {
    JobId::new()
}

async fn take(slots: &impl StreamCaps, owner: &Owner, job_id: &JobId) -> StreamLease {
    match slots.acquire(owner, job_id, soon()).await {
        Ok(lease) => {
            assert_eq!((&lease.owner, &lease.job_id), (owner, job_id));
            lease
        }
        Err(err) => panic!("a slot for {owner}'s {job_id} was refused: {err}"),
    }
}

/// The refusal of an acquire: its scope, live leases and cap; `retry_after` is checked here.
async fn refused(
    slots: &impl StreamCaps,
    owner: &Owner,
    job_id: &JobId,
) -> (&'static str, usize, usize) {
    match slots.acquire(owner, job_id, soon()).await {
        Err(SlotError::Full { scope, full }) => {
            assert!(
                (1..=MAX_STREAM_RETRY_AFTER).contains(&full.retry_after),
                "retry_after is 1 … {MAX_STREAM_RETRY_AFTER} s: {full}"
            );
            (scope, full.open, full.cap)
        }
        Ok(lease) => panic!("a slot was given over a cap: {lease:?}"),
        Err(err) => panic!("expected a full cap, got {err}"),
    }
}

async fn release(slots: &impl StreamCaps, leases: &[&StreamLease]) {
    for lease in leases {
        slots.release(lease).await.expect("a release succeeds");
    }
}

async fn the_job_cap_refuses_before_the_tenant_cap(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-order");
    let (one, two) = (job(), job());
    let a = take(slots, &owner, &one).await;
    let b = take(slots, &owner, &one).await;
    assert_ne!(a.stream_id, b.stream_id, "each stream has its own lease");
    assert_eq!(refused(slots, &owner, &one).await, ("job", 2, 2), "the job's cap");
    let c = take(slots, &owner, &two).await;
    // The tenant is full now too (3 of 3) and `one` still is: the job is named first.
    assert_eq!(refused(slots, &owner, &one).await, ("job", 2, 2), "job before tenant");
    assert_eq!(refused(slots, &owner, &job()).await, ("tenant", 3, 3), "the tenant's cap");
    // Another owner's streams of a job of the same id count on their own items.
    let other = fresh_owner("streams-other");
    let d = take(slots, &other, &one).await;
    release(slots, &[&a, &b, &c, &d]).await;
}

async fn a_refused_acquire_holds_nothing(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-undo");
    let (one, two, three) = (job(), job(), job());
    let a = take(slots, &owner, &one).await;
    let b = take(slots, &owner, &one).await;
    let c = take(slots, &owner, &two).await;
    // `three`'s job slot is taken, then the tenant's refuses: the job slot goes back.
    assert_eq!(refused(slots, &owner, &three).await, ("tenant", 3, 3));
    release(slots, &[&a]).await;
    let d = take(slots, &owner, &three).await;
    release(slots, &[&b]).await;
    // `three` holds one lease (`d`), not two: a second is admitted.
    let e = take(slots, &owner, &three).await;
    assert_eq!(refused(slots, &owner, &three).await, ("job", 2, 2));
    release(slots, &[&c, &d, &e]).await;
}

async fn a_release_frees_at_once_and_may_be_repeated(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-release");
    let one = job();
    let a = take(slots, &owner, &one).await;
    assert_eq!(refused(slots, &owner, &one).await, ("job", 1, 1));
    release(slots, &[&a]).await;
    let b = take(slots, &owner, &one).await;
    // Released twice, or released without ever being taken: not an error, frees nothing else.
    release(slots, &[&a]).await;
    let never =
        StreamLease { owner: owner.clone(), job_id: one.clone(), stream_id: "never".into() };
    release(slots, &[&never]).await;
    let elsewhere =
        StreamLease { owner: fresh_owner("streams-none"), job_id: job(), stream_id: "x".into() };
    release(slots, &[&elsewhere]).await;
    assert_eq!(refused(slots, &owner, &one).await, ("job", 1, 1), "`b` still holds its slot");
    release(slots, &[&b]).await;
}

async fn an_expired_lease_stops_counting(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-expiry");
    let one = job();
    // A crashed stream's lease, already expired: it never blocks the next stream.
    slots.acquire(&owner, &one, now() - 10).await.expect("the cap is free");
    let live = take(slots, &owner, &one).await;
    assert_eq!(refused(slots, &owner, &one).await, ("job", 1, 1), "the expired one is not counted");
    release(slots, &[&live]).await;
    // Retry-After counts to the earliest live lease's expiry (capped at a minute).
    let two = job();
    let short = slots.acquire(&owner, &two, now() + 5).await.expect("the cap is free");
    match slots.acquire(&owner, &two, soon()).await {
        Err(SlotError::Full { scope: "job", full }) => {
            assert!((1..=5).contains(&full.retry_after), "until the lease expires: {full}")
        }
        other => panic!("expected the job's cap, got {other:?}"),
    }
    release(slots, &[&short]).await;
}

async fn the_deployment_cap_counts_every_tenant(slots: &impl StreamCaps) {
    let (alice, bob) = (fresh_owner("streams-deploy-a"), fresh_owner("streams-deploy-b"));
    let a = take(slots, &alice, &job()).await;
    let b = take(slots, &alice, &job()).await;
    assert_eq!(refused(slots, &alice, &job()).await, ("tenant", 2, 2));
    let c = take(slots, &bob, &job()).await;
    // Bob's tenant slot is taken, then the deployment's refuses: his slot goes back.
    assert_eq!(refused(slots, &bob, &job()).await, ("deployment", 3, 3), "the deployment's cap");
    release(slots, &[&a]).await;
    // Bob holds one tenant slot (`c`), not two: a second is admitted.
    let d = take(slots, &bob, &job()).await;
    release(slots, &[&b, &c, &d]).await;
}

async fn caps_of_zero_are_off(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-off");
    let one = job();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(take(slots, &owner, &one).await);
    }
    for lease in &held {
        slots.release(lease).await.expect("a release succeeds");
    }
}

async fn racing_streams_cannot_both_take_the_last_slot(slots: &impl StreamCaps) {
    let owner = fresh_owner("streams-race");
    let one = job();
    let race = || slots.acquire(&owner, &one, soon());
    let (a, b, c, d) = tokio::join!(race(), race(), race(), race());
    let results = [a, b, c, d];
    let taken: Vec<&StreamLease> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(taken.len(), 1, "one racer takes the last slot: {results:?}");
    for result in &results {
        assert!(
            matches!(result, Ok(_) | Err(SlotError::Full { scope: "job", .. })),
            "the others see the job full: {result:?}"
        );
    }
    release(slots, &taken).await;
}
