//! Reconciling the pools of waiting jobs (`waiting` bucket of the status index).
//!
//! A job waits for a running slot until whoever frees one wakes it: the slots function, when
//! a job ends. Whatever that misses — a stream record it could not read, a wake-up message
//! lost, a waiting-list entry lost between two writes of the dispatcher, a limit raised or
//! switched off — this sweep repairs, once a run, for every pool that has a waiting job:
//! slots held by jobs that ended (or are gone) are given back, a waiting job missing from the
//! list it waits in is put back (idempotent), a tenant with jobs waiting in a kind pool gets
//! its place in the pool's ring back, and the pool's free slots wake as many waiting jobs, in
//! admission order.
//! Pools without waiting jobs need no repair: a leaked slot there blocks no one until someone
//! waits, and then it is found here within a run.
//!
//! **Bounded whatever the backlog.** The sweep reads the waiting bucket a page at a time, within
//! the run's budget, resuming from a saved cursor ([`crate::sweep`]), and judges each page on
//! its own: every waiting job of the page is checked against its lists by reading its own entry
//! (one `GetItem` of the entry's key per list it may wait in, [`CHECKS_AT_ONCE`] at a time),
//! and each tenant found waiting in a kind pool by reading its place in the ring (once a run). No waiting list is ever read
//! whole: a tenant's multi-day backlog of millions of entries costs this sweep what the same
//! number of waiting jobs costs, page by page, and its memory is one page, plus the names of the
//! pools and (kind, tenant) pairs already handled this run. A waiting job's index entry carries
//! what its place in the lists is made of (owner, kind, policy, priority, creation, id): a job
//! that is listed is neither read nor written; only a missing one is read and put back.

use std::collections::HashSet;
use std::sync::Mutex;

use futures::StreamExt;
use longhaul_aws::jobs::JobEntry;
use longhaul_aws::logs;
use longhaul_aws::queue::DispatchMessage;
use longhaul_aws::slots::{Pool, Seat, UNWRITTEN_HOLDER_GRACE, pools_of};
use longhaul_domain::admission::waiting_sort_key;
use longhaul_domain::{JobStatus, Owner, Timestamp};
use tracing::Instrument;

use crate::{Deps, ReaperError, Report, counted};

/// Membership reads in flight at once for one page.
const CHECKS_AT_ONCE: usize = 16;

/// What this run has done to the pools (the buckets' shards are swept at once): which pools
/// were reconciled, and which tenants' ring places were checked. Both grow with the pools and
/// tenants that have waiting jobs, never with the jobs.
#[derive(Debug, Default)]
pub(crate) struct Reconciled {
    done: Mutex<HashSet<Pool>>,
    seated: Mutex<HashSet<(Pool, Owner)>>,
}

impl Reconciled {
    /// `true` the first time `pool` is claimed in this run.
    fn claim(&self, pool: &Pool) -> bool {
        self.done
            .lock()
            .expect("the set of reconciled pools is never poisoned")
            .insert(pool.clone())
    }

    /// `true` the first time `owner`'s place in `pool`'s ring is claimed for a check in this
    /// run.
    fn claim_seat(&self, pool: &Pool, owner: &Owner) -> bool {
        self.seated
            .lock()
            .expect("the set of checked ring places is never poisoned")
            .insert((pool.clone(), owner.to_owned()))
    }
}

/// Whether one waiting job of a page is in `owner`'s list of `pool` at `position`: one read
/// of that key. A page asks at most one per job and pool it is under (two), whatever the lists
/// hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    /// The job's index in its page.
    job: usize,
    pool: Pool,
    owner: Owner,
    position: String,
}

/// The reads that tell whether each of `jobs` (with the pools each is under) is listed.
fn checks(jobs: &[(JobEntry, Vec<(Pool, u32)>)]) -> Vec<Listed> {
    let mut checks = Vec::new();
    for (job, (entry, pools)) in jobs.iter().enumerate() {
        let position =
            waiting_sort_key(entry.priority, &entry.created_at.to_rfc3339(), &entry.job_id);
        for (pool, _) in pools {
            checks.push(Listed {
                job,
                pool: pool.clone(),
                owner: entry.owner.clone(),
                position: position.clone(),
            });
        }
    }
    checks
}

/// The (kind pool, tenant) pairs whose place in the pool's ring is to be checked: a tenant
/// with a job found in its list of a kind pool, once a run (`found`: the checks that found
/// their entry).
fn seats_to_check<'a>(
    found: impl IntoIterator<Item = &'a Listed>,
    reconciled: &Reconciled,
) -> Vec<(Pool, Owner)> {
    found
        .into_iter()
        .filter(|listed| matches!(listed.pool, Pool::Kind(_)))
        .filter(|listed| reconciled.claim_seat(&listed.pool, &listed.owner))
        .map(|listed| (listed.pool.clone(), listed.owner.clone()))
        .collect()
}

/// One page of waiting jobs: each is checked against its lists and put back if it is in
/// none, each tenant found waiting in a kind pool against the pool's ring, then each pool they
/// wait in is reconciled (once per run).
///
/// A job waits in the list of the pool that refused it (its record's `waiting.reason`, which
/// the index entry does not carry): found in any of its lists, it is listed.
pub(crate) async fn waiting_page(
    deps: &Deps,
    jobs: Vec<JobEntry>,
    reconciled: &Reconciled,
) -> Report {
    let mut report = Report::default();
    let mut pools: Vec<(Pool, u32)> = Vec::new();
    let jobs: Vec<(JobEntry, Vec<(Pool, u32)>)> = jobs
        .into_iter()
        .map(|entry| {
            let its_pools = pools_of(
                &entry.owner,
                &entry.job_type,
                entry.policy.as_ref().and_then(|policy| policy.concurrency_limit),
                deps.config.tenant_max_running,
            );
            for (pool, limit) in &its_pools {
                if !pools.iter().any(|(p, _)| p == pool) {
                    pools.push((pool.clone(), *limit));
                }
            }
            (entry, its_pools)
        })
        .collect();
    let answers: Vec<(Listed, bool)> = futures::stream::iter(checks(&jobs))
        .map(|check| async move {
            let answer = deps.slots.is_waiting(&check.pool, &check.owner, &check.position).await;
            // A read that failed counts as missing: the job is read and put back, which is
            // idempotent.
            let found = answer.unwrap_or_else(|err| {
                tracing::warn!(error = %err, check = ?check, "reading a waiting-list entry failed");
                false
            });
            (check, found)
        })
        .buffered(CHECKS_AT_ONCE)
        .collect()
        .await;
    let mut listed = vec![false; jobs.len()];
    for (check, found) in &answers {
        listed[check.job] |= *found;
    }
    let found = answers.iter().filter(|(_, found)| *found).map(|(check, _)| check);
    for (pool, owner) in seats_to_check(found, reconciled) {
        if let Err(err) = seat(deps, &pool, &owner).await {
            tracing::error!(error = %err, pool = ?pool, owner = owner.as_str(), "checking a tenant's place in a kind pool's ring failed; the next run tries again");
            report.errors += 1;
        }
    }
    for ((entry, _), listed) in jobs.iter().zip(listed) {
        if listed {
            continue; // in the list it waits in: nothing to read or write
        }
        let span = logs::span_of(entry);
        let result =
            still_waiting(deps, entry, &mut pools, &mut report).instrument(span.clone()).await;
        counted(result, &span, &mut report);
    }
    for (pool, limit) in pools {
        if reconciled.claim(&pool) {
            let result = reconcile(deps, &pool, limit, &mut report).await;
            if let Err(err) = result {
                tracing::error!(error = %err, pool = ?pool, "reconciling a pool failed; the next run tries again");
                report.errors += 1;
            }
        }
    }
    report
}

/// Gives a tenant whose jobs wait in kind pool `pool` its place in the ring back if it lost
/// it (its jobs there would never be admitted): two reads when all is well.
async fn seat(deps: &Deps, pool: &Pool, owner: &Owner) -> Result<(), ReaperError> {
    match deps.slots.seat(pool, owner).await? {
        Seat::Seated => {}
        Seat::Joined => {
            tracing::warn!(pool = ?pool, owner = owner.as_str(), "a tenant with waiting jobs had no place in its kind pool's ring; it joined")
        }
        Seat::Restored => {
            tracing::warn!(pool = ?pool, owner = owner.as_str(), "a tenant's place in its kind pool's ring was missing; written again")
        }
    }
    Ok(())
}

/// Puts a waiting job missing from its list back in the list of the pool that refused it,
/// from its record (and notes the pool); a job whose pool has no limit any more (switched
/// off) is woken at once, for the dispatcher to judge it again.
async fn still_waiting(
    deps: &Deps,
    entry: &JobEntry,
    pools: &mut Vec<(Pool, u32)>,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let Some(job) = deps.jobs.job(&entry.job_id).await? else { return Ok(()) };
    let Some(waiting) = job.waiting.as_ref().filter(|_| job.status == JobStatus::Pending) else {
        return Ok(()); // moved on since the index page was read
    };
    let its_pools = pools_of(
        &job.owner,
        &job.job_type,
        job.concurrency_limit(),
        deps.config.tenant_max_running,
    );
    let Some((pool, limit)) =
        its_pools.into_iter().find(|(pool, _)| pool.reason() == waiting.reason)
    else {
        let message = DispatchMessage::new(job.job_id.clone());
        deps.intake.send(&message, &job.owner).await?;
        report.admitted += 1;
        tracing::info!(reason = ?waiting.reason, "waits for a limit that is off now; woken");
        return Ok(());
    };
    let position = waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), &job.job_id);
    tracing::warn!(pool = ?pool, "a waiting job was missing from its waiting list; put back");
    report.waiting_restored += 1;
    deps.slots.enter_waiting(&pool, &position, &job.job_id, &job.owner).await?;
    if !pools.iter().any(|(p, _)| *p == pool) {
        pools.push((pool, limit));
    }
    Ok(())
}

/// Gives back `pool`'s slots held by jobs that ended, are paused or are gone (a job not
/// written yet is gone only [`UNWRITTEN_HOLDER_GRACE`] after its id was made), then wakes as
/// many waiting jobs as it has free slots.
async fn reconcile(
    deps: &Deps,
    pool: &Pool,
    limit: u32,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let holders = deps.slots.holders(pool).await?;
    let mut held = holders.len();
    let mut ended = Vec::new();
    let now = Timestamp::from(deps.clock.now());
    for job_id in &holders {
        // A pending holder is being dispatched (or its dispatch died, and the pending sweep
        // sends it again): only an end, or a pause, frees a slot.
        match deps.jobs.job(job_id).await? {
            // Seated by a submission that has not written it yet (`UNWRITTEN_HOLDER_GRACE`).
            None if job_id.made_at().is_some_and(|at| now.since(at) < UNWRITTEN_HOLDER_GRACE) => {}
            Some(job) if job.status == JobStatus::Paused => {
                // Only the paused run's: a resume since the read may have dispatched it again.
                if let Some(after) = deps.slots.give_back_run(pool, job_id, job.resumes).await? {
                    tracing::warn!(pool = ?pool, job = %job_id, "a slot held by a paused job; given back");
                    report.slots_reclaimed += 1;
                    held = after.holders;
                }
            }
            Some(job) if !job.status.is_terminal() => {}
            _ => ended.push(job_id.clone()),
        }
    }
    if !ended.is_empty() {
        tracing::warn!(pool = ?pool, jobs = ?ended, "slots held by jobs that ended; given back");
        report.slots_reclaimed += ended.len() as u32;
        held = deps.slots.give_back(pool, &ended).await?.holders;
    }
    report.admitted += deps.slots.admit(pool, limit, held).await? as u32;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::types::AttributeValue;
    use longhaul_aws::jobs::{Item, JobStore};
    use longhaul_domain::policy::JobPolicy;

    /// A waiting job's index entry, as the status index returns it.
    fn entry(owner: &str, kind_limit: Option<u32>) -> JobEntry {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let mut item: Item = [
            ("job_id", s(longhaul_domain::JobId::new().as_str())),
            ("owner", s(owner)),
            ("type", s("demo")),
            ("status", s("pending")),
            ("attempt", AttributeValue::N("0".to_owned())),
            ("created_at", s("2026-11-24T10:00:00.000Z")),
            ("updated_at", s("2026-11-24T10:00:00.000Z")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let policy = JobPolicy { concurrency_limit: kind_limit, ..JobPolicy::default() };
        item.insert("policy".to_owned(), serde_dynamo::to_attribute_value(policy).unwrap());
        JobStore::entry_from(item).expect("a readable entry")
    }

    /// A page of waiting jobs of one tenant behind a kind limit: however long the tenant's
    /// lists are (the reads name keys, they never page through a list), judging the page costs
    /// one read per job and list it may wait in, plus one per tenant found in a kind pool's
    /// list — and that once a run, not once a page.
    #[test]
    fn judging_a_page_reads_per_job_never_a_whole_list() {
        let page = 100;
        let jobs: Vec<_> = (0..page)
            .map(|_| {
                let entry = entry("backlog", Some(3));
                let pools = pools_of(&entry.owner, &entry.job_type, Some(3), 2);
                (entry, pools)
            })
            .collect();
        let checks = checks(&jobs);
        assert_eq!(checks.len(), page * 2, "one read per job and pool (tenant, kind)");
        let last = checks.last().expect("checks");
        assert_eq!((last.job, &last.owner), (page - 1, &"backlog".parse().unwrap()));
        assert!(last.position.ends_with(jobs[page - 1].0.job_id.as_str()), "{last:?}");
        let reconciled = Reconciled::default();
        let seats = seats_to_check(&checks, &reconciled);
        assert_eq!(seats, [(Pool::Kind("demo".into()), "backlog".parse().unwrap())]);
        assert_eq!(seats_to_check(&checks, &reconciled), [], "once a run");
    }

    #[test]
    fn a_job_under_no_kind_limit_is_checked_in_its_tenant_list_only() {
        let entry = entry("alice", None);
        let pools = pools_of(&entry.owner, &entry.job_type, None, 2);
        let checks = checks(&[(entry, pools)]);
        assert!(
            matches!(checks.as_slice(), [Listed { pool: Pool::Tenant(owner), .. }] if owner == "alice"),
            "{checks:?}"
        );
        assert_eq!(seats_to_check(&checks, &Reconciled::default()), []);
    }
}
