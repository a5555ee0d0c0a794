//! Helpers of the domain's unit tests.

use serde_json::{Value, json};

use super::{CsvReportParams, Report, ScanError, ScanState, Scanner, render};

pub(crate) fn params(group_by: &[&str], metrics: Value) -> CsvReportParams {
    serde_json::from_value(
        json!({"input": "uploads/x/1/f.csv", "group_by": group_by, "metrics": metrics}),
    )
    .unwrap()
}

pub(crate) fn sales() -> CsvReportParams {
    params(
        &["region"],
        json!([{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "min", "column": "amount"},
               {"op": "max", "column": "amount"}, {"op": "mean", "column": "amount"}]),
    )
}

/// Scans `data` fed in chunks of `chunk` bytes.
pub(crate) fn scan_chunked(
    p: &CsvReportParams,
    data: &[u8],
    chunk: usize,
) -> Result<ScanState, ScanError> {
    let mut s = Scanner::new(p, ScanState::default());
    for c in data.chunks(chunk) {
        s.feed(c)?;
    }
    s.finish()
}

/// Scans `data` whole, in 1-byte chunks and in 7-byte chunks; all must agree.
pub(crate) fn scan(p: &CsvReportParams, data: &[u8]) -> Result<ScanState, ScanError> {
    let whole = scan_chunked(p, data, data.len().max(1));
    assert_eq!(scan_chunked(p, data, 1), whole, "1-byte chunks differ");
    assert_eq!(scan_chunked(p, data, 7), whole, "7-byte chunks differ");
    whole
}

pub(crate) fn report(p: &CsvReportParams, data: &[u8]) -> Report {
    render(p, &scan(p, data).unwrap())
}

pub(crate) fn not_csv(p: &CsvReportParams, data: &[u8]) -> String {
    match scan(p, data) {
        Err(ScanError::NotCsv(msg)) => msg,
        other => panic!("expected NotCsv, got {other:?}"),
    }
}
