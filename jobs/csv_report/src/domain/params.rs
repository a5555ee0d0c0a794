//! The job's parameters: what a client may ask of a report, and the limits on it.

use serde::{Deserialize, Serialize};

/// Why params were refused (the message goes to the client).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// `params` do not fit the kind.
    #[error("invalid params: {0}")]
    InvalidParams(String),
}

/// Longest `input` reference, in bytes (the longest S3 object key).
pub const MAX_INPUT_BYTES: usize = 1024;
/// Most `group_by` columns.
pub const MAX_GROUP_BY: usize = 16;
/// Most metrics in one report.
pub const MAX_METRICS: usize = 32;
/// Longest column name in `group_by` or a metric, in characters.
pub const MAX_COLUMN_NAME_CHARS: usize = 256;
/// Smallest `shard_bytes`: below it a shard's fixed costs (a worker invocation, a few
/// requests) outweigh its scan.
pub const MIN_SHARD_BYTES: u64 = 1024 * 1024;
/// `shard_bytes` when absent: a shard a worker scans in a few seconds.
pub const DEFAULT_SHARD_BYTES: u64 = 256 * 1024 * 1024;

/// Parameters of a `csv_report` job:
/// `{"input": <upload reference>, "group_by": [column, ...], "metrics": [{"op": "count"} |
/// {"op": "sum"|"min"|"max"|"mean", "column": name}, ...], "format": "json"|"csv"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CsvReportParams {
    /// The uploaded CSV file (an upload's object key).
    pub input: String,
    /// Columns whose values form the group key, in report order. Empty: one group.
    #[serde(default)]
    pub group_by: Vec<String>,
    /// What to compute per group, in report order.
    pub metrics: Vec<Metric>,
    /// The encoding of the result.
    #[serde(default)]
    pub format: Format,
    /// An input larger than this many bytes is scanned in parallel, in shards of about this
    /// size (at least 1 MiB; default 256 MiB; at most 10,000 shards, larger ones past that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_bytes: Option<u64>,
}

impl CsvReportParams {
    /// Checks what serde cannot: lengths, counts, emptiness and duplicates.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |msg: String| Err(SpecError::InvalidParams(msg));
        if self.input.is_empty() || self.input.len() > MAX_INPUT_BYTES {
            return invalid(format!("input must be 1 to {MAX_INPUT_BYTES} bytes"));
        }
        if self.group_by.len() > MAX_GROUP_BY {
            return invalid(format!("group_by may name at most {MAX_GROUP_BY} columns"));
        }
        for (i, column) in self.group_by.iter().enumerate() {
            check_column_name(column, "group_by")?;
            if self.group_by[..i].contains(column) {
                return invalid(format!("group_by names column {column:?} twice"));
            }
        }
        if self.shard_bytes.is_some_and(|n| n < MIN_SHARD_BYTES) {
            return invalid(format!("shard_bytes must be at least {MIN_SHARD_BYTES} (1 MiB)"));
        }
        if self.metrics.is_empty() || self.metrics.len() > MAX_METRICS {
            return invalid(format!("metrics must list 1 to {MAX_METRICS} metrics"));
        }
        for (i, metric) in self.metrics.iter().enumerate() {
            if let Some(column) = metric.column() {
                check_column_name(column, "a metric's column")?;
            }
            if self.metrics[..i].contains(metric) {
                return invalid(format!("metric {} is listed twice", metric.name()));
            }
        }
        Ok(())
    }

    /// The shard size: `shard_bytes`, or [`DEFAULT_SHARD_BYTES`].
    pub fn shard_bytes(&self) -> u64 {
        self.shard_bytes.unwrap_or(DEFAULT_SHARD_BYTES)
    }

    /// The distinct columns the metrics read, in order of first use. Each group's
    /// [`GroupState::columns`](super::GroupState::columns) follows this order.
    pub fn metric_columns(&self) -> Vec<String> {
        let mut columns: Vec<String> = Vec::new();
        for column in self.metrics.iter().filter_map(Metric::column) {
            if !columns.iter().any(|c| c == column) {
                columns.push(column.to_owned());
            }
        }
        columns
    }
}

fn check_column_name(column: &str, what: &str) -> Result<(), SpecError> {
    if column.is_empty() || column.chars().count() > MAX_COLUMN_NAME_CHARS {
        return Err(SpecError::InvalidParams(format!(
            "{what} must name a column of 1 to {MAX_COLUMN_NAME_CHARS} characters"
        )));
    }
    Ok(())
}

/// One aggregate computed per group: `{"op": "count"}` or `{"op": "sum", "column": name}`
/// (likewise `min`, `max`, `mean`).
///
/// Deserialised through a strict form, so that `{"op": "count", "column": ...}` (which serde
/// would otherwise accept, dropping the column) is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields, try_from = "MetricSpec")]
pub enum Metric {
    /// The number of rows in the group.
    Count,
    /// The sum of the column's numeric cells.
    Sum {
        /// The column.
        column: String,
    },
    /// The smallest of the column's numeric cells.
    Min {
        /// The column.
        column: String,
    },
    /// The largest of the column's numeric cells.
    Max {
        /// The column.
        column: String,
    },
    /// The arithmetic mean of the column's numeric cells.
    Mean {
        /// The column.
        column: String,
    },
}

impl Metric {
    /// The metric's report column name: `count`, `sum(amount)`, `min(x)`, ...
    pub fn name(&self) -> String {
        match self {
            Metric::Count => "count".to_owned(),
            Metric::Sum { column } => format!("sum({column})"),
            Metric::Min { column } => format!("min({column})"),
            Metric::Max { column } => format!("max({column})"),
            Metric::Mean { column } => format!("mean({column})"),
        }
    }

    /// The column the metric reads (none for `count`).
    pub fn column(&self) -> Option<&str> {
        match self {
            Metric::Count => None,
            Metric::Sum { column }
            | Metric::Min { column }
            | Metric::Max { column }
            | Metric::Mean { column } => Some(column),
        }
    }
}

/// The wire form of a [`Metric`], checked in `TryFrom`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MetricSpec {
    op: String,
    column: Option<String>,
}

impl TryFrom<MetricSpec> for Metric {
    type Error = String;

    fn try_from(spec: MetricSpec) -> Result<Metric, String> {
        let op = spec.op;
        match (op.as_str(), spec.column) {
            ("count", None) => Ok(Metric::Count),
            ("count", Some(_)) => Err("metric count takes no column".into()),
            ("sum" | "min" | "max" | "mean", None) => Err(format!("metric {op} needs a column")),
            ("sum", Some(column)) => Ok(Metric::Sum { column }),
            ("min", Some(column)) => Ok(Metric::Min { column }),
            ("max", Some(column)) => Ok(Metric::Max { column }),
            ("mean", Some(column)) => Ok(Metric::Mean { column }),
            _ => Err(format!(
                "unknown metric op {:?}: expected count, sum, min, max or mean",
                op.chars().take(32).collect::<String>()
            )),
        }
    }
}

/// The encoding of a report.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `{"columns": [...], "rows": [[...]], "rows_scanned": N, "invalid": {...}}`.
    #[default]
    Json,
    /// A header line of column names, then one line per row (RFC 4180, CRLF line ends).
    Csv,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    use crate::domain::fixtures::{params, sales};

    #[test]
    fn params_parse_and_validate() {
        let p: CsvReportParams = serde_json::from_value(json!({
            "input": "uploads/a/1/f.csv",
            "metrics": [{"op": "count"}, {"op": "mean", "column": "x"}]
        }))
        .unwrap();
        assert_eq!(p.group_by, Vec::<String>::new());
        assert_eq!(p.format, Format::Json);
        assert_eq!(p.metrics[1], Metric::Mean { column: "x".into() });
        p.validate().unwrap();
        let csv: CsvReportParams = serde_json::from_value(json!({
            "input": "i", "group_by": ["a"], "metrics": [{"op": "count"}], "format": "csv"
        }))
        .unwrap();
        assert_eq!(csv.format, Format::Csv);
        assert_eq!((csv.shard_bytes, csv.shard_bytes()), (None, DEFAULT_SHARD_BYTES));
        let sharded = |n: u64| CsvReportParams { shard_bytes: Some(n), ..csv.clone() };
        assert_eq!(sharded(MIN_SHARD_BYTES).validate(), Ok(()));
        assert_eq!(sharded(MIN_SHARD_BYTES).shard_bytes(), MIN_SHARD_BYTES);
        let SpecError::InvalidParams(msg) = sharded(MIN_SHARD_BYTES - 1).validate().unwrap_err();
        assert!(msg.contains("shard_bytes must be at least 1048576"), "{msg}");
        assert!(
            serde_json::from_value::<CsvReportParams>(json!({
                "input": "i", "metrics": [{"op": "count"}], "shard_bytes": -1
            }))
            .is_err()
        );

        for bad in [
            json!({"input": "i", "metrics": [{"op": "count"}], "extra": 1}),
            json!({"input": "i", "metrics": [{"op": "median", "column": "x"}]}),
            json!({"input": "i", "metrics": [{"op": "sum"}]}),
            json!({"input": "i", "metrics": [{"op": "sum", "column": "x", "extra": 1}]}),
            json!({"input": "i", "metrics": [{"op": "count"}], "format": "xml"}),
            json!({"metrics": [{"op": "count"}]}),
            json!({"input": "i", "metrics": [{"op": "count", "column": "x"}]}),
            json!({"input": "i", "metrics": {"op": "count"}}),
        ] {
            assert!(serde_json::from_value::<CsvReportParams>(bad.clone()).is_err(), "{bad}");
        }

        let err = |v: Value| serde_json::from_value::<Metric>(v).unwrap_err().to_string();
        assert!(err(json!({"op": "count", "column": "x"})).contains("count takes no column"));
        assert!(err(json!({"op": "mean"})).contains("mean needs a column"));
        assert!(
            err(json!({"op": "median", "column": "x"})).contains("unknown metric op \"median\"")
        );
        assert_eq!(serde_json::to_value(Metric::Count).unwrap(), json!({"op": "count"}));
        let max = Metric::Max { column: "x".into() };
        assert_eq!(serde_json::to_value(&max).unwrap(), json!({"op": "max", "column": "x"}));
        let p = sales();
        assert_eq!(
            serde_json::from_value::<CsvReportParams>(serde_json::to_value(&p).unwrap()).unwrap(),
            p
        );

        let base = || sales();
        let check = |p: CsvReportParams| p.validate().unwrap_err();
        base().validate().unwrap();
        assert!(matches!(
            check(CsvReportParams { input: String::new(), ..base() }),
            SpecError::InvalidParams(_)
        ));
        check(CsvReportParams { input: "x".repeat(MAX_INPUT_BYTES + 1), ..base() });
        CsvReportParams { input: "x".repeat(MAX_INPUT_BYTES), ..base() }.validate().unwrap();
        check(CsvReportParams { group_by: vec!["a".into(), "a".into()], ..base() });
        check(CsvReportParams { group_by: vec![String::new()], ..base() });
        check(CsvReportParams { group_by: vec!["x".repeat(MAX_COLUMN_NAME_CHARS + 1)], ..base() });
        CsvReportParams { group_by: vec!["é".repeat(MAX_COLUMN_NAME_CHARS)], ..base() }
            .validate()
            .unwrap();
        check(CsvReportParams {
            group_by: (0..=MAX_GROUP_BY).map(|i| i.to_string()).collect(),
            ..base()
        });
        CsvReportParams { group_by: (0..MAX_GROUP_BY).map(|i| i.to_string()).collect(), ..base() }
            .validate()
            .unwrap();
        check(CsvReportParams { metrics: vec![], ..base() });
        check(CsvReportParams { metrics: vec![Metric::Count, Metric::Count], ..base() });
        let sum = |c: &str| Metric::Sum { column: c.into() };
        check(CsvReportParams { metrics: vec![sum("a"), sum("a")], ..base() });
        CsvReportParams { metrics: vec![sum("a"), Metric::Max { column: "a".into() }], ..base() }
            .validate()
            .unwrap();
        check(CsvReportParams { metrics: vec![sum("")], ..base() });
        check(CsvReportParams {
            metrics: (0..=MAX_METRICS).map(|i| sum(&i.to_string())).collect(),
            ..base()
        });
        CsvReportParams {
            metrics: (0..MAX_METRICS).map(|i| sum(&i.to_string())).collect(),
            ..base()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn metric_names_and_columns() {
        assert_eq!(Metric::Count.name(), "count");
        assert_eq!(Metric::Sum { column: "amount".into() }.name(), "sum(amount)");
        assert_eq!(Metric::Min { column: "x".into() }.name(), "min(x)");
        assert_eq!(Metric::Max { column: "x".into() }.name(), "max(x)");
        assert_eq!(Metric::Mean { column: "a b".into() }.name(), "mean(a b)");
        let p = params(
            &[],
            json!([{"op": "sum", "column": "b"}, {"op": "count"}, {"op": "min", "column": "a"},
                   {"op": "max", "column": "b"}]),
        );
        assert_eq!(p.metric_columns(), ["b", "a"]);
    }
}
