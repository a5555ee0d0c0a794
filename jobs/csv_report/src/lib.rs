//! The `csv_report` job kind: group-by aggregates over an uploaded CSV file, in three stages.
//!
//! * **scan** streams the input from the checkpointed byte offset into a push parser
//!   ([`domain::Scanner`]); it checkpoints the offset of the last complete record with the
//!   partial aggregates. Memory holds one chunk, one partial record and the aggregates — never
//!   the file. Progress counts bytes; for the checkpoint cadence an "item" is one MiB of input
//!   ([`MibCadence`] says which). An input larger than `shard_bytes` fans out
//!   ([`sharded`]): its shards are scanned in parallel, each speculatively, and merged.
//! * **render** turns the final aggregates into the report and stages it.
//! * **publish** publishes the staged report as the job's result: the result is durable before
//!   the job can be marked succeeded.

pub mod domain;
pub mod sharded;

use futures::TryStreamExt;
use longhaul_worker::{
    Checkpoint, JobKind, KindError, Policy, PublicMessage, Shard, ShardOutcome, ShardOutput,
    StageContext, StageOutcome, StagedFile,
};
use serde::{Deserialize, Serialize};

pub use domain::{CsvReportParams, Format, ScanError, ScanState, Scanner, render};

/// The `csv_report` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct CsvReport;

/// The logical name (in template.yaml) of the worker function csv_report jobs run in.
pub const WORKER: &str = "CsvReportWorkerFunction";

/// Bytes per checkpoint "item".
const MIB: u64 = 1024 * 1024;

/// The scan's checkpoint cadence in MiB of input, asked of a host that counts in bytes.
///
/// The scan reports `done` in bytes (its checkpoints and progress carry the byte offset), while
/// its cadence counts MiB (`LONGHAUL_CHECKPOINT_ITEMS` = 10 means every 10 MiB). The host
/// answers [`StageContext::checkpoint_due`] by subtracting the `done` of the last checkpoint
/// this invocation saved (0 before the first) from the items it is asked about; this turns the
/// MiB scanned since the last checkpoint into the number that makes that difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MibCadence {
    /// The `done` (a byte offset) of the last checkpoint this invocation saved, 0 before one:
    /// what the host counts from.
    host_base: u64,
    /// The byte offset the scan last checkpointed or resumed at: what the MiB are counted from.
    mark: u64,
}

impl MibCadence {
    /// The cadence of an invocation that resumed the scan from a checkpoint whose `done` is
    /// `offset` (the host counts from it), or started it at 0.
    pub fn resumed_at(offset: u64) -> Self {
        MibCadence { host_base: offset, mark: offset }
    }

    /// What to ask `checkpoint_due` at byte `offset`: the host's base plus the whole MiB
    /// scanned since the mark.
    pub fn items_at(&self, offset: u64) -> u64 {
        self.host_base.saturating_add(offset.saturating_sub(self.mark) / MIB)
    }

    /// A checkpoint at byte `offset` (its `done`) was saved.
    pub fn saved(&mut self, offset: u64) {
        self.host_base = offset;
        self.mark = offset;
    }
}

impl Checkpoint for ScanState {
    const VERSION: u32 = domain::SCAN_STATE_VERSION;
}

/// What render hands to publish: the staged report and the job's summary.
#[derive(Debug, Serialize, Deserialize)]
struct Rendered {
    report: StagedFile,
    /// Absent in a checkpoint rendered before summaries: the job then finishes without one.
    #[serde(default)]
    summary: Option<Summary>,
}

/// The job's summary: what the scan found, beside the report (`GET /jobs/{id}`'s `summary`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Summary {
    /// Data rows in the file.
    rows_scanned: u64,
    /// Groups in the report.
    groups: usize,
    /// Per metric column with non-numeric cells, how many there were.
    invalid_cells: std::collections::BTreeMap<String, u64>,
}

impl Checkpoint for Rendered {
    const VERSION: u32 = 2;
}

/// The kind's stages, in order: what [`JobKind::stages`] lists, typed. The framework only ever
/// runs a stage the kind lists; a name that is none of these is refused, never run as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Streams the input into the aggregates.
    Scan,
    /// Turns the final aggregates into the staged report.
    Render,
    /// Publishes the staged report as the job's result.
    Publish,
}

impl Stage {
    /// The names, in order ([`JobKind::stages`]).
    const NAMES: &'static [&'static str] = &["scan", "render", "publish"];

    /// The stage named `name`, or a fatal error (no attempt would run it).
    fn parse(name: &str) -> Result<Stage, KindError> {
        match name {
            "scan" => Ok(Stage::Scan),
            "render" => Ok(Stage::Render),
            "publish" => Ok(Stage::Publish),
            other => Err(KindError::fatal(PublicMessage::fixed(
                "the job is at a stage its kind does not have",
            ))
            .because(format!(
                "csv_report has no stage {:?} (its stages: {})",
                other.chars().take(64).collect::<String>(),
                Stage::NAMES.join(", ")
            ))),
        }
    }
}

/// What the scan found wrong with the owner's file: their data, told to them as it is.
pub(crate) fn fatal(err: ScanError) -> KindError {
    KindError::fatal(PublicMessage::domain(err))
}

impl JobKind for CsvReport {
    const NAME: &'static str = "csv_report";
    type Params = CsvReportParams;

    fn stages(&self) -> &'static [&'static str] {
        Stage::NAMES
    }

    /// The scan reads every byte of the input; rendering and publishing a report of a few
    /// groups take a moment: the bar moves with the work, not by thirds.
    fn stage_weights(&self) -> &'static [u32] {
        &[8, 1, 1]
    }

    /// Runs in its own worker function (template.yaml's `CsvReportWorkerFunction`: one full
    /// vCPU for parsing and aggregating, and a role for exactly what the kind reads and writes),
    /// at most 50 jobs at once over every tenant (the function reserves 60 executions: the
    /// template's concurrency budget, checked by a test of `longhaul-local`); everything else
    /// is the default policy.
    fn policy(&self) -> Policy {
        // Its long stage, the scan, counts the input's bytes.
        Policy {
            worker: WORKER,
            concurrency_limit: Some(50),
            progress_unit: "bytes",
            ..Policy::default()
        }
    }

    fn validate(&self, params: &CsvReportParams) -> Result<(), String> {
        params.validate().map_err(|domain::SpecError::InvalidParams(message)| message)
    }

    fn inputs(&self, params: &CsvReportParams) -> Vec<String> {
        vec![params.input.clone()]
    }

    /// The scan fans out when its input is larger than `shard_bytes` (the split decides: a
    /// smaller one splits into the whole, scanned plain).
    fn fans_out(&self, stage: &str, _params: &CsvReportParams) -> bool {
        matches!(Stage::parse(stage), Ok(Stage::Scan))
    }

    async fn split(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<Vec<Shard>, KindError> {
        sharded::split(ctx, params).await
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        sharded::scan_shard(ctx, params, shard).await
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        sharded::merge(ctx, params, outputs).await
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<StageOutcome, KindError> {
        match Stage::parse(ctx.stage())? {
            Stage::Scan => scan(ctx, params).await,
            Stage::Render => render_stage(ctx, params).await,
            Stage::Publish => publish(ctx).await,
        }
    }
}

async fn scan(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
) -> Result<StageOutcome, KindError> {
    let size = ctx.input_size(&params.input).await?;
    let state: ScanState = ctx.resume().await?.unwrap_or_default();
    let mut scanner = Scanner::new(params, state);
    let mut cadence = MibCadence::resumed_at(scanner.offset());
    ctx.progress(scanner.offset(), Some(size)).await?;
    if scanner.offset() < size {
        let mut body = ctx.read_input(&params.input, scanner.offset()).await?;
        while let Some(chunk) = body.try_next().await? {
            scanner.feed(&chunk).map_err(fatal)?;
            if ctx.deadline_near() {
                let state = scanner.checkpoint();
                ctx.checkpoint(&state, state.offset, Some(size)).await?;
                return Ok(StageOutcome::Paused);
            }
            if ctx.checkpoint_due(cadence.items_at(scanner.offset())) {
                let state = scanner.checkpoint();
                ctx.checkpoint(&state, state.offset, Some(size)).await?;
                cadence.saved(state.offset);
            } else {
                ctx.progress(scanner.offset(), Some(size)).await?;
            }
        }
    }
    let state = scanner.finish().map_err(fatal)?;
    // The final aggregates are the checkpoint the render stage starts from.
    ctx.checkpoint(&state, size, Some(size)).await?;
    // A kind logs with `tracing`: its lines are written inside the stage's job span.
    tracing::info!(rows = state.rows_scanned, "scan complete");
    Ok(StageOutcome::StageDone)
}

async fn render_stage(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
) -> Result<StageOutcome, KindError> {
    // An invocation that rendered and checkpointed the report, then died before crossing the
    // boundary, left the current checkpoint at the rendered report, not at the scan's output:
    // the stage is done. (Reading it as the scan's output failed the job once.)
    if ctx.has_own_checkpoint() && ctx.resume::<Rendered>().await?.is_some() {
        return Ok(StageOutcome::StageDone);
    }
    let state: ScanState = ctx.carried("scan").await?;
    let report = render(params, &state);
    let summary = Summary {
        rows_scanned: report.rows_scanned,
        groups: report.rows.len(),
        invalid_cells: report.invalid.clone(),
    };
    let (content_type, name) = match params.format {
        Format::Json => ("application/json", "report.json"),
        Format::Csv => ("text/csv; charset=utf-8", "report.csv"),
    };
    let report = ctx.stage_file(name, content_type, report.encode(params.format)).await?;
    ctx.checkpoint(&Rendered { report, summary: Some(summary) }, 1, Some(1)).await?;
    Ok(StageOutcome::StageDone)
}

async fn publish(ctx: &mut dyn StageContext) -> Result<StageOutcome, KindError> {
    let rendered: Rendered = ctx.carried("render").await?;
    let mut result = ctx.publish(&rendered.report).await?;
    if let Some(summary) = &rendered.summary {
        result = result.with_summary(summary)?;
    }
    ctx.progress(1, Some(1)).await?;
    Ok(StageOutcome::Finished(result))
}

#[cfg(test)]
mod tests;
