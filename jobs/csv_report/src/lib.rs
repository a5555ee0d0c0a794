//! The `csv_report` job kind: group-by aggregates over an uploaded CSV file, in three stages.
//!
//! * **scan** streams the input from the checkpointed byte offset into a push parser
//!   ([`domain::Scanner`]); it checkpoints the offset of the last complete record with the
//!   partial aggregates. Memory holds one chunk, one partial record and the aggregates — never
//!   the file. For checkpoint cadence an "item" is one MiB of input.
//! * **render** turns the final aggregates into the report and stages it.
//! * **publish** publishes the staged report as the job's result: the result is durable before
//!   the job can be marked succeeded.

pub mod domain;

use futures::TryStreamExt;
use longhaul_worker::{
    Checkpoint, JobKind, KindError, Policy, PublicMessage, StageContext, StageOutcome, StagedFile,
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

impl Checkpoint for ScanState {
    const VERSION: u32 = domain::SCAN_STATE_VERSION;
}

/// What render hands to publish: the staged report.
#[derive(Debug, Serialize, Deserialize)]
struct Rendered {
    report: StagedFile,
}

impl Checkpoint for Rendered {
    const VERSION: u32 = 2;
}

/// What the scan found wrong with the owner's file: their data, told to them as it is.
fn fatal(err: ScanError) -> KindError {
    KindError::fatal(PublicMessage::domain(err))
}

impl JobKind for CsvReport {
    const NAME: &'static str = "csv_report";
    type Params = CsvReportParams;

    fn stages(&self) -> &'static [&'static str] {
        &["scan", "render", "publish"]
    }

    /// The scan reads every byte of the input; rendering and publishing a report of a few
    /// groups take a moment: the bar moves with the work, not by thirds.
    fn stage_weights(&self) -> &'static [u32] {
        &[8, 1, 1]
    }

    /// Runs in its own worker function (template.yaml's `CsvReportWorkerFunction`: one full
    /// vCPU for parsing and aggregating, and a role for exactly what the kind reads and writes);
    /// everything else is the default policy.
    fn policy(&self) -> Policy {
        Policy { worker: WORKER, ..Policy::default() }
    }

    fn validate(&self, params: &CsvReportParams) -> Result<(), String> {
        params.validate().map_err(|domain::SpecError::InvalidParams(message)| message)
    }

    fn inputs(&self, params: &CsvReportParams) -> Vec<String> {
        vec![params.input.clone()]
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<StageOutcome, KindError> {
        match ctx.stage() {
            "scan" => scan(ctx, params).await,
            "render" => render_stage(ctx, params).await,
            _ => publish(ctx).await,
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
            if ctx.checkpoint_due(scanner.offset() / MIB) {
                let state = scanner.checkpoint();
                ctx.checkpoint(&state, state.offset, Some(size)).await?;
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
    let (content_type, name) = match params.format {
        Format::Json => ("application/json", "report.json"),
        Format::Csv => ("text/csv; charset=utf-8", "report.csv"),
    };
    let report = ctx.stage_file(name, content_type, report.encode(params.format)).await?;
    ctx.checkpoint(&Rendered { report }, 1, Some(1)).await?;
    Ok(StageOutcome::StageDone)
}

async fn publish(ctx: &mut dyn StageContext) -> Result<StageOutcome, KindError> {
    let rendered: Rendered = ctx.carried("render").await?;
    let result = ctx.publish(&rendered.report).await?;
    ctx.progress(1, Some(1)).await?;
    Ok(StageOutcome::Finished(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_worker::ErrorClass;
    use longhaul_worker::testing::{Host, assert_resumable};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    const INPUT: &str = "uploads/owner/1/sales.csv";

    fn params(format: &str) -> Value {
        json!({"input": INPUT, "group_by": ["region"], "format": format,
            "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}]})
    }

    /// The report computed directly, in one pass.
    fn expected(params: &Value, csv: &[u8]) -> Vec<u8> {
        let params: CsvReportParams = serde_json::from_value(params.clone()).unwrap();
        let mut scanner = Scanner::new(&params, ScanState::default());
        scanner.feed(csv).unwrap();
        render(&params, &scanner.finish().unwrap()).encode(params.format)
    }

    fn csv(rows: &[(u8, i32)]) -> Vec<u8> {
        let mut out = b"region,amount\n".to_vec();
        for (region, amount) in rows {
            out.extend(format!("r{region},{amount}\n").into_bytes());
        }
        out
    }

    #[test]
    fn the_three_stages_publish_the_report() {
        let data = csv(&[(1, 5), (2, 7), (1, -2)]);
        for (format, name) in [("json", "report.json"), ("csv", "report.csv")] {
            let host = Host::new().input(INPUT, data.clone(), 4);
            let finished = host.run(&CsvReport, &params(format)).unwrap();
            assert_eq!(finished.name, name);
            assert_eq!(finished.body, expected(&params(format), &data));
        }
    }

    #[test]
    fn the_owners_data_errors_are_fatal_and_said_as_they_are() {
        let host = Host::new().input(INPUT, b"region,price\nx,1\n".to_vec(), 64);
        let err = host.run(&CsvReport, &params("json")).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert!(err.public.as_str().contains("amount"), "{err}");
        let err = Host::new().run(&CsvReport, &params("json")).unwrap_err();
        assert_eq!(
            err.public.as_str(),
            "the input upload does not exist (upload it before submitting the job)"
        );
    }

    #[test]
    fn a_cancellation_mid_scan_ends_the_run() {
        let host = Host::new().input(INPUT, csv(&[(1, 1); 50]), 8).cancel_after_writes(5);
        let (result, trace) = host.run_traced(&CsvReport, &params("json"));
        assert!(result.unwrap_err().is_cancelled());
        assert!(trace.final_checkpoint, "where it stopped is kept for a retry: {trace:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Crashed right after any checkpoint — mid-scan, at the scan's end, after the render
        /// (the case that once failed jobs) — and resumed, a run publishes the same report.
        #[test]
        fn a_run_resumed_after_any_checkpoint_gives_the_same_report(
            rows in proptest::collection::vec((0u8..4, -50i32..50), 0..30),
            chunk in 1usize..16,
            deadline in proptest::option::of(2u32..6),
            format in prop_oneof![Just("json"), Just("csv")],
        ) {
            let data = csv(&rows);
            let host = match deadline {
                None => Host::new().input(INPUT, data.clone(), chunk),
                // An invocation must get past at least one record (the header's 14 bytes and
                // one row), or it would pause at the same offset for ever — as a real one
                // whose deadline is shorter than one record's read would.
                Some(n) => Host::new().input(INPUT, data.clone(), chunk.max(12)).deadline_every(n),
            };
            let params = params(format);
            prop_assert_eq!(host.run(&CsvReport, &params).unwrap().body, expected(&params, &data));
            assert_resumable(&CsvReport, &host, &params);
        }
    }
}
