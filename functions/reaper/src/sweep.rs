//! Sweeping a status-index bucket to its end, whatever its size.
//!
//! Every run pages through every shard of the bucket (the shards at once, each page
//! `LONGHAUL_REAPER_PAGE` entries) until the end or until the run's time budget
//! (`LONGHAUL_REAPER_BUDGET_SECONDS`) is spent, rather than reading only the oldest page: a
//! running job's index key is its claim time, so a page of healthy long jobs would hide every
//! zombie claimed after them until they ended. A shard that ran out of budget saves where it
//! stopped (its `LastEvaluatedKey`, in the table's `SWEEP` item) and the next run resumes
//! there, so every entry is judged within ⌈sweep time / budget⌉ runs, and at any count a sweep
//! that fits its budget judges every job every run. Why a full sweep and not an index ordered
//! by heartbeat deadline: that index would be rewritten by every heartbeat (a second write unit
//! each time, for every running job, every few seconds), while a sweep reads each running job
//! once a minute from the index page it is on plus one `BatchGetItem` of 100 progress records —
//! about a hundredth of the heartbeats' own cost (BENCHMARKS.md, "volume").

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

use longhaul_aws::jobs::{JobEntry, STATUS_SHARDS, sweep_name};
use longhaul_aws::ports::SweepCursor;

use crate::{Bucket, Deps, Report, readable};

/// Sweeps every shard of status-index bucket `bucket` (entries whose sort key is before
/// `before`) at once, handing each page's readable entries to `handle_page`, until every
/// shard is done or `deadline` (by [`Deps::clock`]'s instant) has passed. `cursors` are the saved starts
/// of unfinished sweeps (see [`longhaul_aws::ports::SweepCursors`]).
pub(crate) async fn sweep<'a, F, Fut>(
    deps: &'a Deps,
    bucket: Bucket,
    before: &'a str,
    deadline: Instant,
    cursors: &'a HashMap<String, SweepCursor>,
    handle_page: F,
) -> Report
where
    F: Fn(Vec<JobEntry>) -> Fut + Copy + 'a,
    Fut: Future<Output = Report> + 'a,
{
    let shards = (0..STATUS_SHARDS).map(|shard| async move {
        let name = sweep_name(bucket.as_str(), shard);
        let resumed = cursors.get(&name).cloned();
        let mut start = resumed.clone();
        let mut report = Report::default();
        loop {
            if deps.clock.instant() >= deadline {
                // Out of time: the next run starts where this one stopped.
                report.unfinished += 1;
                tracing::warn!(sweep = name, "the run's budget ran out; the next run resumes here");
                save(deps, &name, start, &mut report).await;
                break;
            }
            let page = match deps
                .jobs
                .due_page(bucket.as_str(), shard, before, deps.config.page, start.clone())
                .await
            {
                Ok(page) => page,
                Err(err) => {
                    // The saved cursor (if any) stays: the next run tries from there again.
                    tracing::error!(error = %err, sweep = name, "reading the index failed");
                    report.errors += 1;
                    break;
                }
            };
            report.examined += page.entries.len() as u64;
            let jobs =
                page.entries.into_iter().filter_map(|entry| readable(entry, &mut report)).collect();
            report.merge(handle_page(jobs).await);
            match page.next {
                Some(next) => start = Some(next),
                None => {
                    if resumed.is_some() {
                        save(deps, &name, None, &mut report).await;
                    }
                    break;
                }
            }
        }
        report
    });
    let mut report = Report::default();
    for shard in futures::future::join_all(shards).await {
        report.merge(shard);
    }
    report
}

async fn save(deps: &Deps, name: &str, start: Option<SweepCursor>, report: &mut Report) {
    if let Err(err) = deps.jobs.save_sweep_cursor(name, start).await {
        // The next run starts from the previous cursor (or the oldest entry): it re-reads
        // entries, it skips none.
        tracing::error!(error = %err, sweep = name, "saving the sweep cursor failed");
        report.errors += 1;
    }
}
