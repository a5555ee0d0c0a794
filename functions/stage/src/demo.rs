//! The `demo` job: one stage, `process`, hashing items with a pause per item.

use std::time::Duration;

use longhaul_aws::objects::result_key;
use longhaul_domain::demo::{DemoParams, DemoResult, DemoState, FailKind};

use crate::StageError;
use crate::engine::{Ctx, StageOutcome};
use crate::failure::{self, Failure, PublicMessage};

/// The demo job's stages.
pub const STAGES: &[&str] = &["process"];
/// Version of the checkpointed [`DemoState`].
pub const STATE_VERSION: u32 = 1;

/// Runs the `process` stage until done, the deadline, or a failure.
pub async fn run(ctx: &mut Ctx<'_>, params: &DemoParams) -> Result<StageOutcome, StageError> {
    let total = Some(params.items);
    let mut state: DemoState = ctx.resume(STATE_VERSION).await?.unwrap_or_default();
    ctx.progress(state.next_item, total).await?;
    while state.next_item < params.items {
        if ctx.deadline_near() {
            ctx.checkpoint(STATE_VERSION, &state, state.next_item, total).await?;
            return Ok(StageOutcome::Paused);
        }
        if let Some(kind) = params.injected_failure(state.next_item, ctx.job.injected_failures) {
            // Keep the work done so far, count the failure (fenced), then fail as asked.
            ctx.checkpoint(STATE_VERSION, &state, state.next_item, total).await?;
            ctx.deps
                .jobs
                .count_injected_failure(ctx.job_id(), &ctx.lease.token)
                .await
                .map_err(crate::fenced)?;
            let message = PublicMessage::domain(
                format!("injected {kind:?} failure at item {}", state.next_item).to_lowercase(),
            );
            let message = Failure::new(message);
            return Err(match kind {
                FailKind::Transient => StageError::Retryable(message),
                FailKind::Fatal => StageError::Fatal(message),
            });
        }
        if params.stall_at == Some(state.next_item) {
            tracing::info!(item = state.next_item, "stalling as asked");
            ctx.pause(Duration::from_millis(params.stall_ms.unwrap_or(0)), state.next_item, total)
                .await?;
        }
        state.process_next();
        if params.item_ms > 0 {
            ctx.pause(Duration::from_millis(params.item_ms), state.next_item, total).await?;
        }
        if ctx.checkpoint_due(state.next_item) {
            ctx.checkpoint(STATE_VERSION, &state, state.next_item, total).await?;
        } else {
            ctx.progress(state.next_item, total).await?;
        }
    }
    let result = DemoResult { items: state.next_item, digest: state.digest.clone() };
    // Keyed by attempt: a stale attempt's result can never be the one `complete` records.
    let key = result_key(ctx.job_id(), &format!("{}/result.json", ctx.lease.attempt));
    ctx.deps
        .objects
        .put(&key, serde_json::to_vec(&result).expect("results serialise"), "application/json")
        .await
        .map_err(|e| StageError::retryable(failure::RESULT_NOT_STORED, e))?;
    ctx.checkpoint(STATE_VERSION, &state, params.items, total).await?;
    Ok(StageOutcome::Finished { result_key: key })
}
