//! The `csv_report` job: three stages.
//!
//! * **scan** streams the uploaded object with a ranged GET from the checkpointed byte offset,
//!   feeding a push parser; it checkpoints the offset of the last complete record with the
//!   partial aggregates. Memory holds one chunk, one partial record and the aggregates —
//!   never the file. For checkpoint cadence an "item" is one MiB of input.
//! * **render** turns the final aggregates into the report and stages it.
//! * **publish** copies the staged report to `results/<job>/<attempt>/report.<ext>`: the
//!   result is durable before the job can be marked succeeded.

use longhaul_aws::objects::result_key;
use longhaul_domain::csv_report::{
    CsvReportParams, Format, SCAN_STATE_VERSION, ScanError, ScanState, Scanner, render,
};
use longhaul_domain::uploads::owns_upload;
use serde::{Deserialize, Serialize};

use crate::StageError;
use crate::engine::{Ctx, StageOutcome};
use crate::failure::{self, Failure, PublicMessage};

/// The csv_report job's stages.
pub const STAGES: &[&str] = &["scan", "render", "publish"];
/// Version of the render stage's output record.
const RENDERED_VERSION: u32 = 1;
/// Bytes per checkpoint "item".
const MIB: u64 = 1024 * 1024;

/// What render hands to publish: where the staged report is.
#[derive(Debug, Serialize, Deserialize)]
struct Rendered {
    key: String,
    content_type: String,
    extension: String,
}

/// What the scan found wrong with the owner's file: their data, told to them as it is.
fn fatal(err: ScanError) -> StageError {
    StageError::Fatal(Failure::new(PublicMessage::domain(err)))
}

/// Reading the input failed (an S3 error): the client hears that, the log gets the chain.
fn unreadable(err: impl std::fmt::Display) -> StageError {
    StageError::retryable(failure::INPUT_UNREADABLE, err)
}

/// Runs the current stage.
pub async fn run(ctx: &mut Ctx<'_>, params: &CsvReportParams) -> Result<StageOutcome, StageError> {
    match ctx.stage {
        "scan" => scan(ctx, params).await,
        "render" => render_stage(ctx, params).await,
        _ => publish(ctx).await,
    }
}

async fn scan(ctx: &mut Ctx<'_>, params: &CsvReportParams) -> Result<StageOutcome, StageError> {
    if !owns_upload(&ctx.job.owner, &params.input) {
        return Err(StageError::Fatal(Failure::new(PublicMessage::fixed(
            "the input is not one of the job owner's uploads",
        ))));
    }
    let size =
        ctx.deps.objects.size(&params.input).await.map_err(unreadable)?.ok_or_else(|| {
            StageError::Fatal(Failure::new(PublicMessage::fixed(
                "the input upload does not exist (upload it before submitting the job)",
            )))
        })?;
    let state: ScanState = ctx.resume(SCAN_STATE_VERSION).await?.unwrap_or_default();
    let mut scanner = Scanner::new(params, state);
    ctx.progress(scanner.offset(), Some(size)).await?;
    if scanner.offset() < size {
        let mut body = ctx
            .deps
            .objects
            .stream_from(&params.input, scanner.offset())
            .await
            .map_err(unreadable)?;
        while let Some(chunk) = body.try_next().await.map_err(unreadable)? {
            scanner.feed(&chunk).map_err(fatal)?;
            if ctx.deadline_near() {
                let state = scanner.checkpoint();
                ctx.checkpoint(SCAN_STATE_VERSION, &state, state.offset, Some(size)).await?;
                return Ok(StageOutcome::Paused);
            }
            if ctx.checkpoint_due(scanner.offset() / MIB) {
                let state = scanner.checkpoint();
                ctx.checkpoint(SCAN_STATE_VERSION, &state, state.offset, Some(size)).await?;
            } else {
                ctx.progress(scanner.offset(), Some(size)).await?;
            }
        }
    }
    let state = scanner.finish().map_err(fatal)?;
    // The final aggregates are the checkpoint the render stage starts from.
    ctx.checkpoint(SCAN_STATE_VERSION, &state, size, Some(size)).await?;
    tracing::info!(rows = state.rows_scanned, "scan complete");
    Ok(StageOutcome::StageDone)
}

async fn render_stage(
    ctx: &mut Ctx<'_>,
    params: &CsvReportParams,
) -> Result<StageOutcome, StageError> {
    // An invocation that rendered and checkpointed the report, then died before crossing the
    // boundary, left the progress record pointing at the rendered report, not at the scan's
    // output: the stage is done. (Reading the pointer as the scan's output failed the job.)
    if ctx.has_own_checkpoint() && ctx.resume::<Rendered>(RENDERED_VERSION).await?.is_some() {
        return Ok(StageOutcome::StageDone);
    }
    let state: ScanState = ctx.carried("scan", SCAN_STATE_VERSION).await?;
    let report = render(params, &state);
    let (content_type, extension) = match params.format {
        Format::Json => ("application/json", "json"),
        Format::Csv => ("text/csv; charset=utf-8", "csv"),
    };
    let key =
        format!("checkpoints/{}/render/a{}-report.{extension}", ctx.job_id(), ctx.lease.attempt);
    ctx.deps
        .objects
        .put(&key, report.encode(params.format), content_type)
        .await
        .map_err(|e| StageError::retryable(failure::CHECKPOINT_FAILED, e))?;
    let rendered = Rendered { key, content_type: content_type.into(), extension: extension.into() };
    ctx.checkpoint(RENDERED_VERSION, &rendered, 1, Some(1)).await?;
    Ok(StageOutcome::StageDone)
}

async fn publish(ctx: &mut Ctx<'_>) -> Result<StageOutcome, StageError> {
    let rendered: Rendered = ctx.carried("render", RENDERED_VERSION).await?;
    let key =
        result_key(ctx.job_id(), &format!("{}/report.{}", ctx.lease.attempt, rendered.extension));
    ctx.deps
        .objects
        .copy(&rendered.key, &key, &rendered.content_type)
        .await
        .map_err(|e| StageError::retryable(failure::RESULT_NOT_STORED, e))?;
    ctx.progress(1, Some(1)).await?;
    Ok(StageOutcome::Finished { result_key: key })
}
