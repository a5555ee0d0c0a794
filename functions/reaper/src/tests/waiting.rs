//! The pools of waiting jobs reconciled: slots held by ended jobs given back and waiting jobs
//! admitted in their place, a job missing from its list put back, a tenant's lost place in a
//! kind pool's ring restored, a job whose limit is off woken.

use super::*;

use longhaul_aws::ports::{JobDispatchMarks, SlotPools};
use longhaul_aws::slots::{Pool, UNWRITTEN_HOLDER_GRACE};
use longhaul_domain::admission::{WaitReason, Waiting, waiting_sort_key};
use longhaul_domain::policy::JobPolicy;

/// The kind of the tests' jobs (`pending_job`'s).
const KIND: &str = "demo";

fn tenant() -> Pool {
    Pool::Tenant(owner(OWNER))
}

fn kind() -> Pool {
    Pool::Kind(KIND.to_owned())
}

/// A policy that limits the kind to `limit` running jobs.
fn limited(limit: u32) -> Option<JobPolicy> {
    Some(JobPolicy { concurrency_limit: Some(limit), ..JobPolicy::default() })
}

impl World {
    /// A job submitted 5 minutes ago with `policy`, refused for `reason` 4 minutes ago (so in
    /// the `waiting` bucket), and in its list of `pool` if given; its id and list position.
    async fn waiting(
        &self,
        policy: Option<JobPolicy>,
        reason: WaitReason,
        pool: Option<&Pool>,
    ) -> (JobId, String) {
        self.waiting_since(300, policy, reason, pool).await
    }

    /// [`World::waiting`], submitted `seconds` ago (its place in the list), in shard 0.
    async fn waiting_since(
        &self,
        seconds: i64,
        policy: Option<JobPolicy>,
        reason: WaitReason,
        pool: Option<&Pool>,
    ) -> (JobId, String) {
        let job = self
            .submitted_with(seconds, |job| {
                job.policy = policy;
                job.job_id = id_in_shard(0);
            })
            .await;
        let id = job.job_id.clone();
        let position = waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), &id);
        let waiting =
            Waiting { reason, limit: 1, since: self.ago(240).into(), position: position.clone() };
        self.jobs.mark_waiting(&id, &waiting).await.expect("a pending job waits");
        if let Some(pool) = pool {
            self.slots.enter_waiting(pool, &position, &id, &owner(OWNER)).await.expect("listed");
        }
        (id, position)
    }

    /// A job holding a slot of `pool`, running (or ended, if `ended`).
    async fn holder(&self, pool: &Pool, policy: Option<JobPolicy>, ended: bool) -> JobId {
        let id = self.running_with(&Running::healthy(), None, |job| job.policy = policy).await;
        assert!(self.slots.acquire(pool, 1, &id, 0).await.unwrap(), "the holder has its slot");
        if ended {
            self.end(&id).await;
        }
        id
    }

    /// A job holding a slot of the tenant pool, paused (as the stage parks it, its pause's
    /// record lost on the way).
    async fn paused_holder(&self) -> JobId {
        let paused = self.holder(&tenant(), None, false).await;
        let mut job = self.job(&paused).await;
        job.status = JobStatus::Paused;
        self.jobs.put_record(job);
        paused
    }

    /// The job ends (its owner cancelled it), as the slots function would miss it.
    async fn end(&self, id: &JobId) {
        let request =
            TransitionRequest::new(id, &[JobStatus::Running], JobStatus::Cancelled, "cancelled")
                .fenced(LEASE);
        self.jobs.transition(request).await.expect("running → cancelled");
    }

    async fn listed(&self, pool: &Pool, position: &str) -> bool {
        self.slots.is_waiting(pool, &owner(OWNER), position).await.unwrap()
    }
}

// The waiting jobs of one shard, as one page: a job woken by a pool's reconciliation in one
// shard's page may be found missing from its list by another shard's page (they are swept at
// once) and put back, which the dispatcher takes out again when it dispatches the job.
#[tokio::test]
async fn a_slot_held_by_an_ended_job_goes_to_the_first_waiting_job() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    let ended = world.holder(&tenant(), None, true).await;
    let listed = Some(&tenant());
    let (second, second_at) = world.waiting_since(290, None, WaitReason::TenantLimit, listed).await;
    let (first, first_at) = world.waiting_since(300, None, WaitReason::TenantLimit, listed).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted, report.errors), (1, 1, 0));
    assert!(!world.slots.holders(&tenant()).await.unwrap().contains(&ended), "given back");
    assert_eq!(world.sent(), [(first.clone(), 0)], "woken, in admission order");
    assert!(!world.listed(&tenant(), &first_at).await, "out of its list");
    assert!(world.listed(&tenant(), &second_at).await, "the other waits on");
    assert_eq!(world.job(&first).await.status, JobStatus::Pending, "the dispatcher takes it");
    assert_eq!(world.job(&second).await.status, JobStatus::Pending);
}

#[tokio::test]
async fn a_slot_held_by_a_paused_job_goes_to_the_first_waiting_job() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    let paused = world.paused_holder().await;
    let (waiting, _) = world.waiting(None, WaitReason::TenantLimit, Some(&tenant())).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted), (1, 1), "{report:?}");
    assert!(!world.slots.holders(&tenant()).await.unwrap().contains(&paused), "given back");
    assert_eq!(world.sent(), [(waiting, 0)]);
}

#[tokio::test]
async fn a_paused_holder_whose_next_run_took_the_slot_keeps_it() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    let paused = world.paused_holder().await;
    // Read as paused (pause 0), but resumed and dispatched before the reconciliation's
    // give-back: its run 1 holds the slot now.
    assert!(world.slots.acquire(&tenant(), 1, &paused, 1).await.unwrap());
    world.waiting(None, WaitReason::TenantLimit, Some(&tenant())).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted), (0, 0), "{report:?}");
    assert_eq!(world.slots.holders(&tenant()).await.unwrap(), [paused]);
    assert!(world.sent().is_empty(), "no one woken into a full pool");
}

#[tokio::test]
async fn a_pool_whose_holders_still_run_wakes_no_one() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    world.holder(&tenant(), None, false).await;
    let (_, position) = world.waiting(None, WaitReason::TenantLimit, Some(&tenant())).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted, report.waiting_restored), (0, 0, 0));
    assert_eq!((report.examined, report.errors), (2, 0), "the waiting job and the holder");
    assert!(world.sent().is_empty());
    assert!(world.listed(&tenant(), &position).await);
}

#[tokio::test]
async fn a_waiting_job_missing_from_its_list_is_put_back() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    world.holder(&tenant(), None, false).await;
    let (id, position) = world.waiting(None, WaitReason::TenantLimit, None).await;
    let report = world.run().await;
    assert_eq!((report.waiting_restored, report.admitted), (1, 0));
    assert!(world.listed(&tenant(), &position).await, "back in the list it waits in");
    assert_eq!(world.run().await.waiting_restored, 0, "listed: neither read nor written");
    assert_eq!(world.job(&id).await.status, JobStatus::Pending);
}

#[tokio::test]
async fn a_tenants_lost_place_in_a_kind_pools_ring_is_restored() {
    // No tenant limit: the kind's limit of one is the only one, held by a running job.
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "0")]);
    let holder = world.holder(&kind(), limited(1), false).await;
    let (id, position) = world.waiting(limited(1), WaitReason::KindLimit, Some(&kind())).await;
    world.slots.lose_place(&kind(), &owner(OWNER));
    assert!(world.slots.ring(&kind()).is_empty(), "its jobs would never be admitted");
    let report = world.run().await;
    assert_eq!((report.admitted, report.errors), (0, 0), "the pool is full");
    assert_eq!(world.slots.ring(&kind()), [OWNER], "its place is back");
    assert!(world.listed(&kind(), &position).await);

    // Its turn comes when the slot is free.
    world.end(&holder).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted), (1, 1));
    assert_eq!(world.sent(), [(id, 0)]);
}

#[tokio::test]
async fn a_job_waiting_for_a_limit_that_is_off_now_is_woken() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "0")]);
    // It waited for its kind's limit, which its policy no longer has.
    let (id, _) = world.waiting(None, WaitReason::KindLimit, None).await;
    let report = world.run().await;
    assert_eq!((report.admitted, report.waiting_restored, report.errors), (1, 0, 0));
    assert_eq!(world.sent(), [(id, 0)], "for the dispatcher to judge it again");
}

#[tokio::test]
async fn an_unavailable_slot_table_is_reported_and_the_next_run_reconciles() {
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "1")]);
    world.holder(&tenant(), None, true).await;
    let (id, _) = world.waiting(None, WaitReason::TenantLimit, Some(&tenant())).await;
    world.slots.set_unavailable(true);
    let report = world.run().await;
    // Its membership read failed, so it was put back (which failed), and its pool's
    // reconciliation failed: both reported; nothing admitted.
    assert_eq!((report.errors, report.admitted, report.slots_reclaimed), (2, 0, 0));
    assert!(world.sent().is_empty());
    world.slots.set_unavailable(false);
    let report = world.run().await;
    assert_eq!((report.errors, report.slots_reclaimed, report.admitted), (0, 1, 1));
    assert_eq!(world.sent(), [(id, 0)]);
}

/// A job id made `seconds` before the world's now (a UUIDv7 carries its time, to the ms).
fn id_made_ago(world: &World, seconds: i64) -> JobId {
    let hex = format!("{:012x}", world.ago(seconds).timestamp_millis());
    format!("{}-{}-7000-8000-000000000000", &hex[..8], &hex[8..]).parse().unwrap()
}

#[tokio::test]
async fn a_slot_taken_for_a_job_not_written_yet_is_kept_until_the_grace_has_passed() {
    // Submit seats a job before it writes it: a holder whose job is missing may be one.
    let world = world_of(&[("LONGHAUL_TENANT_MAX_RUNNING", "2")]);
    let grace = UNWRITTEN_HOLDER_GRACE.as_secs() as i64;
    let young = id_made_ago(&world, grace / 2);
    let old = id_made_ago(&world, grace * 2);
    assert_eq!(young.made_at(), Some(world.at_ago(grace / 2)));
    for id in [&young, &old] {
        assert!(world.slots.acquire(&tenant(), 2, id, 0).await.unwrap());
    }
    let (waiting, _) = world.waiting(None, WaitReason::TenantLimit, Some(&tenant())).await;
    let report = world.run().await;
    assert_eq!((report.slots_reclaimed, report.admitted, report.errors), (1, 1, 0));
    assert_eq!(world.slots.holders(&tenant()).await.unwrap(), [young], "its job may be written");
    assert_eq!(world.sent(), [(waiting, 0)], "the other slot goes to the waiting job");
}
