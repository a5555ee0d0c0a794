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

use std::collections::HashSet;
use std::sync::Mutex;

use longhaul_aws::jobs::JobEntry;
use longhaul_aws::logs;
use longhaul_aws::queue::DispatchMessage;
use longhaul_aws::slots::{Pool, pools_of};
use longhaul_domain::JobStatus;
use longhaul_domain::admission::waiting_sort_key;
use tracing::Instrument;

use crate::{Deps, ReaperError, Report, counted};

/// The pools this run already reconciled (the buckets' shards are swept at once).
#[derive(Debug, Default)]
pub(crate) struct Reconciled(Mutex<HashSet<Pool>>);

impl Reconciled {
    /// `true` the first time `pool` is claimed in this run.
    fn claim(&self, pool: &Pool) -> bool {
        self.0.lock().expect("the set of reconciled pools is never poisoned").insert(pool.clone())
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
    let mut pools = Vec::new();
    for entry in jobs {
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

/// Puts a waiting job back in the lists of its pools (and notes the pools); a job that waits
/// for no pool any more (its limit switched off) is woken at once.
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
        let message = DispatchMessage { job_id: job.job_id.clone() };
        deps.admitter.intake.send(&message, &job.owner).await?;
        report.admitted += 1;
        tracing::info!("waits for a limit that is off now; woken");
        return Ok(());
    }
    let position = waiting_sort_key(job.priority, &job.created_at, &job.job_id);
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
