//! The report: a final scan state rendered as a table, and its JSON and CSV encodings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ColumnStats, CsvReportParams, Format, GroupState, Metric, ScanState};

#[cfg(doc)]
use super::Scanner;

/// A finished report: a table plus scan counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The `group_by` names, then the metric names.
    pub columns: Vec<String>,
    /// One row per group, sorted by group key; group values are strings, metrics numbers or
    /// null (no numeric cell).
    pub rows: Vec<Vec<Value>>,
    /// Data rows in the file.
    pub rows_scanned: u64,
    /// Per metric column with at least one non-numeric cell, how many there were.
    pub invalid: BTreeMap<String, u64>,
}

/// A float as a JSON value: whole numbers below 2^53 in magnitude as integers, non-finite
/// values (an overflowed sum) as null.
fn number(x: f64) -> Value {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if x.fract() == 0.0 && x.abs() < EXACT {
        Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// Builds the report from a final state (from [`Scanner::finish`]) and the params it was made
/// with.
pub fn render(params: &CsvReportParams, state: &ScanState) -> Report {
    let metric_columns = params.metric_columns();
    let metric_at: Vec<Option<usize>> = params
        .metrics
        .iter()
        .map(|m| m.column().and_then(|c| metric_columns.iter().position(|mc| mc == c)))
        .collect();
    let mut groups: Vec<&GroupState> = state.groups.iter().collect();
    groups.sort_by(|a, b| a.key.cmp(&b.key));
    let empty;
    if params.group_by.is_empty() && groups.is_empty() {
        empty = GroupState {
            key: Vec::new(),
            rows: 0,
            columns: vec![ColumnStats::default(); metric_columns.len()],
        };
        groups.push(&empty);
    }
    let rows = groups
        .into_iter()
        .map(|group| {
            let mut row: Vec<Value> = group.key.iter().cloned().map(Value::String).collect();
            for (metric, at) in params.metrics.iter().zip(&metric_at) {
                let stats = at.and_then(|i| group.columns.get(i)).filter(|s| s.count > 0);
                row.push(match (metric, stats) {
                    (Metric::Count, _) => Value::from(group.rows),
                    (_, None) => Value::Null,
                    (Metric::Sum { .. }, Some(s)) => number(s.total()),
                    (Metric::Min { .. }, Some(s)) => number(s.min),
                    (Metric::Max { .. }, Some(s)) => number(s.max),
                    (Metric::Mean { .. }, Some(s)) => number(s.total() / s.count as f64),
                });
            }
            row
        })
        .collect();
    let mut columns = params.group_by.clone();
    columns.extend(params.metrics.iter().map(Metric::name));
    Report {
        columns,
        rows,
        rows_scanned: state.rows_scanned,
        invalid: state
            .invalid
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c.clone(), *n))
            .collect(),
    }
}

impl Report {
    /// `{"columns": [...], "rows": [[...]], "rows_scanned": N, "invalid": {column: count}}`.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a report always serialises")
    }

    /// The table as CSV: a header line of column names, then the rows; RFC 4180 quoting and
    /// CRLF line ends; null is an empty field. `rows_scanned` and `invalid` are not included.
    pub fn to_csv(&self) -> Vec<u8> {
        let mut writer =
            csv::WriterBuilder::new().terminator(csv::Terminator::CRLF).from_writer(Vec::new());
        let cell = |v: &Value| match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        writer.write_record(&self.columns).expect("writing to memory cannot fail");
        for row in &self.rows {
            writer.write_record(row.iter().map(cell)).expect("writing to memory cannot fail");
        }
        writer.into_inner().expect("writing to memory cannot fail")
    }

    /// The report in `format`.
    pub fn encode(&self, format: Format) -> Vec<u8> {
        match format {
            Format::Json => self.to_json(),
            Format::Csv => self.to_csv(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::domain::fixtures::{params, report};

    #[test]
    fn numbers_render_as_integers_when_whole() {
        assert_eq!(number(6.0), json!(6));
        assert_eq!(number(-0.0), json!(0));
        assert_eq!(number(2.5), json!(2.5));
        assert_eq!(number(9_007_199_254_740_991.0), json!(9_007_199_254_740_991_i64));
        assert_eq!(number(9_007_199_254_740_992.0), json!(9_007_199_254_740_992.0));
        assert_eq!(number(1e300), json!(1e300));
        assert_eq!(number(f64::INFINITY), Value::Null);
        // Compensated summation keeps decimal sums readable.
        let p = params(&[], json!([{"op": "sum", "column": "v"}]));
        let data = format!("v\n{}", "0.1\n".repeat(10));
        assert_eq!(report(&p, data.as_bytes()).rows, vec![vec![json!(1)]]);
    }

    fn small_report() -> Report {
        let p = params(
            &["city"],
            json!([{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "mean", "column": "amount"}]),
        );
        report(&p, b"city,amount\nOslo,10\n\"Bergen, Vestland\",2.5\nOslo,x\n\"say \"\"hi\"\"\",\n")
    }

    #[test]
    fn json_encoding() {
        let r = small_report();
        let expected = r#"{"columns":["city","count","sum(amount)","mean(amount)"],"rows":[["Bergen, Vestland",1,2.5,2.5],["Oslo",2,10,10],["say \"hi\"",1,null,null]],"rows_scanned":4,"invalid":{"amount":2}}"#;
        assert_eq!(String::from_utf8(r.to_json()).unwrap(), expected);
        assert_eq!(r.encode(Format::Json), r.to_json());
        assert_eq!(serde_json::from_slice::<Report>(&r.to_json()).unwrap(), r);
    }

    #[test]
    fn csv_encoding() {
        let r = small_report();
        let expected = "city,count,sum(amount),mean(amount)\r\n\
                        \"Bergen, Vestland\",1,2.5,2.5\r\n\
                        Oslo,2,10,10\r\n\
                        \"say \"\"hi\"\"\",1,,\r\n";
        assert_eq!(String::from_utf8(r.to_csv()).unwrap(), expected);
        assert_eq!(r.encode(Format::Csv), r.to_csv());
        // What we write, we read back the same.
        let p = params(&["city"], json!([{"op": "count"}]));
        let back = report(&p, &r.to_csv());
        assert_eq!(back.rows_scanned, 3);
        assert_eq!(back.rows[2][0], json!("say \"hi\""));
    }
}
