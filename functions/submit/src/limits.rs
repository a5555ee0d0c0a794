//! The tenant's limits on submitting: its backlog of jobs not yet running, and its rate.

use lambda_http::http::{StatusCode, header};
use longhaul_aws::api::Problem;
use longhaul_aws::limits::Admission;
use longhaul_domain::Owner;

use crate::Deps;
use crate::response::internal;

/// How long a client refused for its backlog is asked to wait: its jobs start at the pace its
/// running limit allows, so a minute frees some room in most cases.
pub const BACKLOG_RETRY_AFTER_SECONDS: u64 = 60;

/// Refuses (`429`) a submission of `owner` whose jobs not yet running are at the cap; checked
/// before the rate is charged, so a refused submission writes nothing.
pub(crate) async fn within_backlog(deps: &Deps, owner: &Owner) -> Result<(), Problem> {
    if deps.max_pending == 0 {
        return Ok(());
    }
    let backlog = deps.jobs.backlog(owner, deps.max_pending).await.map_err(internal)?;
    if backlog < deps.max_pending {
        return Ok(());
    }
    tracing::info!(
        backlog,
        cap = deps.max_pending,
        "submission refused: the tenant's backlog is full"
    );
    Err(Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "backlog-full",
        "Too many jobs not yet running",
        format!(
            "This principal has {} jobs that have not started yet (at most {}); submit more once some have started.",
            backlog, deps.max_pending
        ),
    )
    .with("max_pending", deps.max_pending)
    .header(header::RETRY_AFTER, BACKLOG_RETRY_AFTER_SECONDS.to_string()))
}

/// The `429` of a submission refused by its tenant's rate limit.
pub(crate) fn rate_limited(retry_after: u64) -> Problem {
    tracing::info!(retry_after, "submission refused: the tenant's rate limit is reached");
    Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        "Too many submissions",
        format!(
            "This principal has used its submissions for this minute; retry in {retry_after} s."
        ),
    )
    .header(header::RETRY_AFTER, retry_after.to_string())
}

/// Counts a submission of `owner` against its per-minute limit, or refuses it (`429`).
pub(crate) async fn charge(deps: &Deps, owner: &Owner) -> Result<(), Problem> {
    match deps.limiter.charge(owner).await {
        Ok(Admission::Admitted) => Ok(()),
        Ok(Admission::Limited { retry_after }) => Err(rate_limited(retry_after)),
        Err(err) => {
            tracing::error!(error = %err, "the submission rate limiter failed");
            Err(Problem::internal())
        }
    }
}
