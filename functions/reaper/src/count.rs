//! Counting the live jobs of each bucket for the dashboard's `ActiveJobs` gauge, at a cost that
//! does not grow with the number of jobs.
//!
//! A count reads the status index as a sweep does (a `Select=COUNT` query reads, and is billed
//! for, every entry it counts; only the number crosses the wire), so counting a whole bucket
//! would cost time and reads in proportion to its size — at 100,000 waiting jobs, longer than
//! the run's whole budget on the local stack. So each run counts each shard of each bucket for
//! at most `LONGHAUL_REAPER_COUNT_MAX_PAGES` pages of `LONGHAUL_REAPER_COUNT_PAGE` entries
//! (by default 2 × 1,000: at most 8 requests per bucket and 32 per run, whatever the table
//! holds), every shard and bucket at once, and only **after the sweeps**, with what is left of
//! the run's budget: no page is started once the run's deadline has passed, so the count never
//! holds a sweep up nor makes a run longer than its budget.
//!
//! Each bucket is then emitted as two gauges (dimension `Status`): `ActiveJobs`, the entries
//! counted, and `ActiveJobsTruncated`, 0 when every shard's count reached its end (the reading
//! is exact) or 1 when one stopped at its cap or at the deadline (the reading is a lower bound:
//! "at least this many"). The run's report says the same (`active`, `active_at_least`). A
//! bucket of which not one page could be read (the sweeps spent the whole budget) is not
//! emitted at all — a reading of 0 would read as an empty bucket — and a bucket whose count
//! failed is missing too, counted in `errors`. A shard that holds exactly a whole number of
//! pages at the cap may read as a lower bound although it is exact: DynamoDB names where a full
//! page goes on even when nothing follows.

use std::time::Instant;

use futures::future::join_all;
use longhaul_aws::jobs::{STATUS_SHARDS, StoreError};
use longhaul_aws::metrics::{self, Metric};

use crate::{Bucket, Deps, Report};

/// What a bucket's count came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counted {
    /// The entries counted.
    jobs: u64,
    /// Pages read (requests made).
    pages: u32,
    /// Whether every page was read to the end (the count is exact).
    done: bool,
}

/// Counts every live bucket, each shard at most [`crate::Config::count_max_pages`] pages,
/// starting none at or after `deadline`; emits the gauges and reports them.
pub(crate) async fn count(deps: &Deps, deadline: Instant) -> Report {
    let mut report = Report::default();
    if deps.config.count_max_pages == 0 {
        return report;
    }
    let buckets = Bucket::ALL.map(|bucket| async move {
        let shards = (0..STATUS_SHARDS).map(|shard| count_shard(deps, bucket, shard, deadline));
        (bucket, join_all(shards).await)
    });
    let mut uncounted = Vec::new();
    for (bucket, shards) in join_all(buckets).await {
        let counted = shards.into_iter().try_fold(
            Counted { done: true, ..Counted::default() },
            |sum, shard| {
                let shard = shard?;
                Ok::<_, StoreError>(Counted {
                    jobs: sum.jobs + shard.jobs,
                    pages: sum.pages + shard.pages,
                    done: sum.done && shard.done,
                })
            },
        );
        match counted {
            Ok(Counted { pages: 0, .. }) => uncounted.push(bucket.as_str()),
            Ok(Counted { jobs, done, .. }) => {
                metrics::emit_status(Metric::ActiveJobs, jobs as f64, bucket.as_str());
                let truncated = if done { 0.0 } else { 1.0 };
                metrics::emit_status(Metric::ActiveJobsTruncated, truncated, bucket.as_str());
                report.active.insert(bucket, jobs);
                if !done {
                    report.active_at_least.insert(bucket);
                }
            }
            Err(err) => {
                tracing::error!(error = %err, status = bucket.as_str(), "counting the live jobs failed");
                report.errors += 1;
            }
        }
    }
    if !uncounted.is_empty() {
        tracing::warn!(
            buckets = ?uncounted,
            "the sweeps spent the run's budget: live jobs not counted this run"
        );
    }
    report
}

/// Counts shard `shard` of `bucket`: pages until its end, the cap, or the deadline.
async fn count_shard(
    deps: &Deps,
    bucket: Bucket,
    shard: u32,
    deadline: Instant,
) -> Result<Counted, StoreError> {
    let mut counted = Counted::default();
    let mut start = None;
    while counted.pages < deps.config.count_max_pages && deps.clock.instant() < deadline {
        let page =
            deps.jobs.count_page(bucket.as_str(), shard, deps.config.count_page, start).await?;
        counted.pages += 1;
        counted.jobs += page.count;
        match page.next {
            Some(next) => start = Some(next),
            None => {
                counted.done = true;
                break;
            }
        }
    }
    Ok(counted)
}
