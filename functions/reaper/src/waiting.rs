//! Reconciling the pools of waiting jobs (`waiting` bucket of the status index).
//!
//! A job waits for a running slot until whoever frees one wakes it: the slots function, when
//! a job ends. Whatever that misses — a stream record it could not read, a wake-up message
//! lost, a waiting-list entry lost between two writes of the dispatcher, a limit raised or
//! switched off — this sweep repairs, once a run, for every pool that has a waiting job:
//! slots held by jobs that ended (or are gone) are given back, every waiting job is put back
//! in its list (idempotent), and the pool's free slots wake as many waiting jobs, first in
//! priority order. Pools without waiting jobs need no repair: a leaked slot there blocks no
//! one until someone waits, and then it is found here within a run.
//!
//! At volume the check must cost next to nothing when nothing is wrong: each pool's waiting
//! list is read once per run (its keys only, a query), and a waiting job's index entry carries
//! what its place in the lists is made of (owner, kind, policy, priority, creation, id). Only a
//! job missing from a list is read and put back.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use longhaul_aws::jobs::JobEntry;
use longhaul_aws::logs;
use longhaul_aws::queue::DispatchMessage;
use longhaul_aws::slots::{Pool, pools_of};
use longhaul_domain::JobStatus;
use longhaul_domain::admission::waiting_sort_key;
use tracing::Instrument;

use crate::{Deps, ReaperError, Report, counted};

/// What this run knows of the pools (the buckets' shards are swept at once): which were
/// reconciled, and the positions each waiting list held when first read.
#[derive(Debug, Default)]
pub(crate) struct Reconciled {
    done: Mutex<HashSet<Pool>>,
    lists: Mutex<HashMap<Pool, Arc<HashSet<String>>>>,
}

impl Reconciled {
    /// `true` the first time `pool` is claimed in this run.
    fn claim(&self, pool: &Pool) -> bool {
        self.done
            .lock()
            .expect("the set of reconciled pools is never poisoned")
            .insert(pool.clone())
    }

    /// The positions in `pool`'s waiting list, read once per run (two shards reading the same
    /// list at the same moment may both read it: harmless).
    async fn positions(
        &self,
        deps: &Deps,
        pool: &Pool,
    ) -> Result<Arc<HashSet<String>>, ReaperError> {
        let known =
            self.lists.lock().expect("the waiting lists are never poisoned").get(pool).cloned();
        if let Some(positions) = known {
            return Ok(positions);
        }
        let positions = Arc::new(deps.admitter.slots.waiting_positions(pool).await?);
        self.lists
            .lock()
            .expect("the waiting lists are never poisoned")
            .insert(pool.clone(), positions.clone());
        Ok(positions)
    }

    /// Whether `entry` (a waiting job's index entry) is in the waiting list of every pool in
    /// `pools`.
    async fn listed(&self, deps: &Deps, entry: &JobEntry, pools: &[(Pool, u32)]) -> bool {
        let position =
            waiting_sort_key(entry.priority, &entry.created_at.to_rfc3339(), &entry.job_id);
        for (pool, _) in pools {
            match self.positions(deps, pool).await {
                Ok(positions) if positions.contains(&position) => {}
                Ok(_) => return false,
                Err(err) => {
                    // Check the job the careful way instead.
                    tracing::warn!(error = %err, pool = ?pool, "reading a waiting list failed");
                    return false;
                }
            }
        }
        !pools.is_empty()
    }
}

/// One page of waiting jobs: each is put back in its lists, then each pool they wait in is
/// reconciled (once per run).
pub(crate) async fn waiting_page(
    deps: &Deps,
    jobs: Vec<JobEntry>,
    reconciled: &Reconciled,
) -> Report {
    let mut report = Report::default();
    let mut pools: Vec<(Pool, u32)> = Vec::new();
    for entry in jobs {
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
        if reconciled.listed(deps, &entry, &its_pools).await {
            continue; // in every list it waits in: nothing to read or write
        }
        let span = logs::span_of(&entry);
        let result =
            still_waiting(deps, &entry, &mut pools, &mut report).instrument(span.clone()).await;
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

/// Puts a waiting job missing from a list back in the lists of its pools, from its record (and
/// notes the pools); a job that waits for no pool any more (its limit switched off) is woken at
/// once.
async fn still_waiting(
    deps: &Deps,
    entry: &JobEntry,
    pools: &mut Vec<(Pool, u32)>,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let Some(job) = deps.jobs.job(&entry.job_id).await? else { return Ok(()) };
    if job.status != JobStatus::Pending || job.waiting.is_none() {
        return Ok(()); // moved on since the index page was read
    }
    let its_pools = pools_of(
        &job.owner,
        &job.job_type,
        job.concurrency_limit(),
        deps.config.tenant_max_running,
    );
    if its_pools.is_empty() {
        let message = DispatchMessage { job_id: job.job_id.to_string() };
        deps.admitter.intake.send(&message, &job.owner).await?;
        report.admitted += 1;
        tracing::info!("waits for a limit that is off now; woken");
        return Ok(());
    }
    let position = waiting_sort_key(job.priority, &job.created_at.to_rfc3339(), &job.job_id);
    tracing::warn!("a waiting job was missing from its waiting list; put back");
    report.waiting_restored += 1;
    for (pool, limit) in its_pools {
        deps.admitter.slots.enter_waiting(&pool, &position, &job.job_id, &job.owner).await?;
        if !pools.iter().any(|(p, _)| *p == pool) {
            pools.push((pool, limit));
        }
    }
    Ok(())
}

/// Gives back `pool`'s slots held by jobs that ended or are gone, then wakes as many waiting
/// jobs as it has free slots.
async fn reconcile(
    deps: &Deps,
    pool: &Pool,
    limit: u32,
    report: &mut Report,
) -> Result<(), ReaperError> {
    let holders = deps.admitter.slots.holders(pool).await?;
    let mut ended = Vec::new();
    for job_id in &holders {
        // A pending holder is being dispatched (or its dispatch died, and the pending sweep
        // sends it again): only an end frees a slot.
        match deps.jobs.job(job_id).await? {
            Some(job) if !job.status.is_terminal() => {}
            _ => ended.push(job_id.clone()),
        }
    }
    let held = if ended.is_empty() {
        holders.len()
    } else {
        tracing::warn!(pool = ?pool, jobs = ?ended, "slots held by jobs that ended; given back");
        report.slots_reclaimed += ended.len() as u32;
        deps.admitter.slots.release(pool, &ended).await?
    };
    report.admitted += deps.admitter.admit(pool, limit, held).await? as u32;
    Ok(())
}
