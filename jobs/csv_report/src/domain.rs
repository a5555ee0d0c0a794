//! The `csv_report` job kind's domain logic: group-by aggregation over an uploaded CSV file of any size.
//!
//! # Streaming
//!
//! The file may be many gigabytes, so it is never held in memory. The caller does the I/O: it
//! streams the object from S3 and hands the bytes to a [`Scanner`] in chunks of any size
//! ([`Scanner::feed`]), then calls [`Scanner::finish`] at the end of the object. Chunk
//! boundaries do not matter: a chunk may end inside a quoted field, between the `\r` and `\n`
//! of a CRLF, or inside a multi-byte UTF-8 character. Parsing is done by the push-based
//! [`csv_core::Reader`], which keeps its state between chunks; the scanner keeps only the
//! bytes of the current, incomplete record (in buffers that grow as needed, up to
//! [`MAX_RECORD_BYTES`]) plus the aggregates. Each complete record is folded into the
//! aggregates and forgotten.
//!
//! # Checkpoints
//!
//! The aggregates only ever change at record boundaries, so the state "as of the last
//! complete record" is always at hand: [`Scanner::checkpoint`] returns it as a [`ScanState`]
//! whose `offset` is the absolute byte offset just past that record. A Lambda that is about
//! to run out of time saves the checkpoint; its successor builds a new scanner with
//! [`Scanner::new`] from that state and feeds the bytes from `offset` on (a ranged GET). The
//! bytes of the partial record after `offset` are simply read again. Resuming gives exactly
//! the same result as never stopping: the state carries every accumulator, floats are
//! serialised in a form that round-trips bit for bit, and a resumed reader starts in the same
//! parser state (start of a record) as the original was in at that offset.
//!
//! The header row is stored in the state too, so a resumed scan does not read it again. A
//! UTF-8 byte order mark is skipped only at offset 0 of the object.
//!
//! # Aggregates
//!
//! Rows are grouped by the values of the `group_by` columns. Per group the scanner keeps the
//! row count and, per metric column, the count, compensated (Neumaier) sum, minimum and
//! maximum of the cells that parse as finite numbers; `mean` is sum / count. Cells that do
//! not parse are counted per column under `invalid`, once per row however many metrics use
//! the column. [`render`] turns a final state into a [`Report`], which encodes as JSON or CSV.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
/// Most distinct groups a report may have; more is [`ScanError::TooManyGroups`].
pub const MAX_GROUPS: usize = 1_000_000;
/// Longest record (the bytes of its fields, without quotes and separators); longer is
/// [`ScanError::NotCsv`]. This bounds memory when a stray quote would otherwise turn the rest
/// of a file into one field.
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Most fields in one record; more is [`ScanError::NotCsv`].
pub const MAX_FIELDS: usize = 65_536;
/// Version of [`ScanState`]'s shape. Stored beside a checkpoint; bump it whenever the shape
/// changes so an old checkpoint is never read as a new one.
pub const SCAN_STATE_VERSION: u32 = 1;

const UTF8_BOM: &[u8; 3] = b"\xEF\xBB\xBF";

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

    /// The distinct columns the metrics read, in order of first use. Each group's
    /// [`GroupState::columns`] follows this order.
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

/// The checkpointable state of a scan: everything needed to go on from [`ScanState::offset`].
///
/// This is what goes into a checkpoint (as JSON, beside [`SCAN_STATE_VERSION`]). It is only
/// meaningful with the [`CsvReportParams`] it was made with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScanState {
    /// Absolute byte offset of the first byte not yet consumed into a complete record.
    pub offset: u64,
    /// The header row, once read.
    pub header: Option<Vec<String>>,
    /// Data rows aggregated so far (the header and blank lines are not rows).
    pub rows_scanned: u64,
    /// The groups seen so far, sorted by key.
    #[serde(default)]
    pub groups: Vec<GroupState>,
    /// Per metric column, the number of cells that were not numbers (only columns with some).
    #[serde(default)]
    pub invalid: BTreeMap<String, u64>,
}

/// One group's accumulators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupState {
    /// The values of the `group_by` columns, in `group_by` order.
    pub key: Vec<String>,
    /// Rows in the group.
    pub rows: u64,
    /// One entry per metric column, in [`CsvReportParams::metric_columns`] order.
    pub columns: Vec<ColumnStats>,
}

/// Running statistics over one column's numeric cells within one group.
///
/// Floats are serialised as strings in Rust's shortest round-trip form (`"0.1"`, `"1e300"`,
/// `"inf"`), so a checkpoint restores them bit for bit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Numeric cells seen.
    pub count: u64,
    /// Their sum (the high part of a Neumaier compensated sum).
    #[serde(with = "exact_f64")]
    pub sum: f64,
    /// The compensation term of the sum: the total is `sum + compensation`.
    #[serde(with = "exact_f64")]
    pub compensation: f64,
    /// The smallest (`inf` while `count` is 0).
    #[serde(with = "exact_f64")]
    pub min: f64,
    /// The largest (`-inf` while `count` is 0).
    #[serde(with = "exact_f64")]
    pub max: f64,
}

impl Default for ColumnStats {
    fn default() -> Self {
        ColumnStats {
            count: 0,
            sum: 0.0,
            compensation: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl ColumnStats {
    fn add(&mut self, v: f64) {
        let t = self.sum + v;
        if t.is_finite() {
            // Neumaier: recover the low-order bits lost in `t`.
            self.compensation +=
                if self.sum.abs() >= v.abs() { (self.sum - t) + v } else { (v - t) + self.sum };
        }
        self.sum = t;
        if v < self.min {
            self.min = v;
        }
        if v > self.max {
            self.max = v;
        }
        self.count += 1;
    }

    fn total(&self) -> f64 {
        if self.sum.is_finite() { self.sum + self.compensation } else { self.sum }
    }
}

/// Serde for an `f64` as its shortest round-trip string.
mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{v:?}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|_| D::Error::custom(format!("not a number: {text:?}")))
    }
}

/// Why a scan stopped. Every variant is a property of the file (or of the params against
/// it): retrying will not help.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScanError {
    /// The input is not a CSV file this job can read.
    #[error("the input is not readable as CSV: {0}")]
    NotCsv(String),
    /// A `group_by` or metric column is not in the header row.
    #[error(
        "column {0:?} is not in the CSV header row; column names must match the file's first row exactly (case and spaces included)"
    )]
    MissingColumn(String),
    /// The report would have more groups than allowed.
    #[error("the report would have more than {0} groups; group by fewer or coarser columns")]
    TooManyGroups(usize),
}

/// Column positions, resolved against the header.
#[derive(Debug, Clone)]
struct Resolved {
    /// Fields per record.
    width: usize,
    /// Field index of each `group_by` column.
    group: Vec<usize>,
    /// Field index of each metric column.
    metric: Vec<usize>,
}

/// The aggregates and everything a record needs to be folded into them.
#[derive(Debug)]
struct Aggregates {
    group_by: Vec<String>,
    metric_columns: Vec<String>,
    header: Option<Vec<String>>,
    resolved: Option<Resolved>,
    rows_scanned: u64,
    /// Group key (encoded by [`encode_key_part`]) → accumulators.
    groups: HashMap<Box<[u8]>, GroupAcc>,
    /// Invalid cells per metric column.
    invalid: Vec<u64>,
    max_groups: usize,
    /// Reused to build each row's key without allocating.
    key: Vec<u8>,
}

#[derive(Debug, Clone)]
struct GroupAcc {
    rows: u64,
    columns: Box<[ColumnStats]>,
}

/// Appends one group value to an encoded key: its length, then its bytes.
fn encode_key_part(key: &mut Vec<u8>, value: &[u8]) {
    key.extend_from_slice(&(value.len() as u64).to_le_bytes());
    key.extend_from_slice(value);
}

fn decode_key(mut key: &[u8]) -> Vec<String> {
    let mut values = Vec::new();
    while key.len() >= 8 {
        let (len, rest) = key.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        let (value, rest) = rest.split_at(len.min(rest.len()));
        values.push(String::from_utf8_lossy(value).into_owned());
        key = rest;
    }
    values
}

/// Parses a metric cell: trimmed, a finite `f64`.
fn parse_number(cell: &[u8]) -> Option<f64> {
    let v: f64 = std::str::from_utf8(cell).ok()?.trim().parse().ok()?;
    v.is_finite().then_some(v)
}

fn resolve(
    header: &[String],
    group_by: &[String],
    metric_columns: &[String],
) -> Result<Resolved, ScanError> {
    // The first column of a given name wins.
    let find = |name: &String| {
        header.iter().position(|h| h == name).ok_or_else(|| ScanError::MissingColumn(name.clone()))
    };
    Ok(Resolved {
        width: header.len(),
        group: group_by.iter().map(find).collect::<Result<_, _>>()?,
        metric: metric_columns.iter().map(find).collect::<Result<_, _>>()?,
    })
}

impl Aggregates {
    /// Folds one complete record (`data`, with field `i` ending at `ends[i]`) into the
    /// aggregates. Nothing changes if it fails.
    fn record(&mut self, data: &[u8], ends: &[usize], after: u64) -> Result<(), ScanError> {
        let field = |i: usize| &data[if i == 0 { 0 } else { ends[i - 1] }..ends[i]];
        let Some(resolved) = &self.resolved else {
            return self.header_record(ends.len(), field);
        };
        let number = self.rows_scanned + 1;
        if ends.len() != resolved.width {
            return Err(ScanError::NotCsv(format!(
                "data record {number} (after byte offset {after}) has {} fields but the header has {}",
                ends.len(),
                resolved.width
            )));
        }
        self.key.clear();
        for (&at, name) in resolved.group.iter().zip(&self.group_by) {
            let value = field(at);
            if std::str::from_utf8(value).is_err() {
                return Err(ScanError::NotCsv(format!(
                    "data record {number} (after byte offset {after}): the value of group_by column {name:?} is not UTF-8 text"
                )));
            }
            encode_key_part(&mut self.key, value);
        }
        let group = match self.groups.get_mut(self.key.as_slice()) {
            Some(group) => group,
            None => {
                if self.groups.len() >= self.max_groups {
                    return Err(ScanError::TooManyGroups(self.max_groups));
                }
                let fresh = GroupAcc {
                    rows: 0,
                    columns: vec![ColumnStats::default(); self.metric_columns.len()]
                        .into_boxed_slice(),
                };
                self.groups.entry(self.key.clone().into_boxed_slice()).or_insert(fresh)
            }
        };
        group.rows += 1;
        for ((&at, stats), invalid) in
            resolved.metric.iter().zip(group.columns.iter_mut()).zip(&mut self.invalid)
        {
            match parse_number(field(at)) {
                Some(v) => stats.add(v),
                None => *invalid += 1,
            }
        }
        self.rows_scanned += 1;
        Ok(())
    }

    fn header_record<'a>(
        &mut self,
        fields: usize,
        field: impl Fn(usize) -> &'a [u8],
    ) -> Result<(), ScanError> {
        let mut names = Vec::with_capacity(fields);
        for i in 0..fields {
            let Ok(name) = std::str::from_utf8(field(i)) else {
                return Err(ScanError::NotCsv(format!(
                    "column {} of the header row is not UTF-8 text",
                    i + 1
                )));
            };
            names.push(name.to_owned());
        }
        if names.iter().all(String::is_empty) {
            return Err(ScanError::NotCsv("the header row has no column names".into()));
        }
        self.resolved = Some(resolve(&names, &self.group_by, &self.metric_columns)?);
        self.header = Some(names);
        Ok(())
    }
}

/// A resumable, push-based scan of one CSV object. See the [module docs](self).
pub struct Scanner {
    reader: csv_core::Reader,
    agg: Aggregates,
    /// Absolute offset just past the last complete record.
    offset: u64,
    /// Absolute offset of the next byte to parse.
    pos: u64,
    /// At offset 0 of the object: the first bytes, held until it is known whether they are a
    /// byte order mark.
    bom: Option<Vec<u8>>,
    /// The current record's field bytes; `out_len` are in use.
    out: Vec<u8>,
    out_len: usize,
    /// The current record's field end positions; `ends_len` are in use.
    ends: Vec<usize>,
    ends_len: usize,
    max_record_bytes: usize,
    /// The error that stopped the scan, returned again by every later call.
    failed: Option<ScanError>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("offset", &self.offset)
            .field("pos", &self.pos)
            .field("rows_scanned", &self.agg.rows_scanned)
            .field("groups", &self.agg.groups.len())
            .field("partial_record_bytes", &self.out_len)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Scanner {
    /// A scanner that goes on from `state` (`ScanState::default()` for a new scan). The
    /// caller feeds the object's bytes from `state.offset` on.
    ///
    /// If `state`'s header lacks a column of `params`, the first [`Scanner::feed`] or
    /// [`Scanner::finish`] returns [`ScanError::MissingColumn`].
    ///
    /// # Panics
    ///
    /// If `state` was made with other params: a group key or column list of the wrong length.
    pub fn new(params: &CsvReportParams, state: ScanState) -> Scanner {
        let metric_columns = params.metric_columns();
        let mut groups = HashMap::with_capacity(state.groups.len());
        for group in state.groups {
            assert!(
                group.key.len() == params.group_by.len()
                    && group.columns.len() == metric_columns.len(),
                "csv_report checkpoint does not match the job's params"
            );
            let mut key = Vec::new();
            for value in &group.key {
                encode_key_part(&mut key, value.as_bytes());
            }
            groups.insert(
                key.into_boxed_slice(),
                GroupAcc { rows: group.rows, columns: group.columns.into() },
            );
        }
        let invalid =
            metric_columns.iter().map(|c| state.invalid.get(c).copied().unwrap_or(0)).collect();
        let mut failed = None;
        let resolved = match &state.header {
            Some(header) => match resolve(header, &params.group_by, &metric_columns) {
                Ok(resolved) => Some(resolved),
                Err(e) => {
                    failed = Some(e);
                    None
                }
            },
            None => None,
        };
        let mut reader = csv_core::Reader::new();
        // csv_core strips a byte order mark from the first input it sees, but only when all
        // three bytes come in one call, and also at a resume offset, where it is data. The
        // scanner handles the BOM itself, so mark the reader as having read already: with no
        // output space this consumes nothing and leaves the parser at the start of a record.
        let (_, consumed, _, _) = reader.read_record(b"\0", &mut [], &mut []);
        debug_assert_eq!(consumed, 0, "priming the reader consumes no input");
        Scanner {
            reader,
            agg: Aggregates {
                group_by: params.group_by.clone(),
                metric_columns,
                header: state.header,
                resolved,
                rows_scanned: state.rows_scanned,
                groups,
                invalid,
                max_groups: MAX_GROUPS,
                key: Vec::new(),
            },
            offset: state.offset,
            pos: state.offset,
            bom: (state.offset == 0).then(Vec::new),
            out: vec![0; 4096],
            out_len: 0,
            ends: vec![0; 64],
            ends_len: 0,
            max_record_bytes: MAX_RECORD_BYTES,
            failed,
        }
    }

    /// Consumes the next bytes of the object. Chunks may be split anywhere.
    ///
    /// After an error the scan is over: this and [`Scanner::finish`] return it again.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), ScanError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.feed_inner(chunk);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    /// Ends the scan at the end of the object (a last record without a line end counts) and
    /// returns the final state, for [`render`].
    pub fn finish(mut self) -> Result<ScanState, ScanError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if let Some(first) = self.bom.take() {
            self.parse(&first)?;
        }
        loop {
            // Empty input tells csv_core the data has ended.
            let (res, _, nout, nend) = self.reader.read_record(
                &[],
                &mut self.out[self.out_len..],
                &mut self.ends[self.ends_len..],
            );
            self.out_len += nout;
            self.ends_len += nend;
            match res {
                csv_core::ReadRecordResult::Record => self.complete_record()?,
                csv_core::ReadRecordResult::OutputEndsFull => self.grow_ends()?,
                csv_core::ReadRecordResult::OutputFull => self.grow_out()?,
                csv_core::ReadRecordResult::InputEmpty | csv_core::ReadRecordResult::End => break,
            }
        }
        if self.agg.header.is_none() {
            return Err(ScanError::NotCsv("the file is empty: it has no header row".into()));
        }
        self.offset = self.pos;
        Ok(self.checkpoint())
    }

    /// The state as of the last complete record. A new scanner built from it and fed the
    /// bytes from its `offset` on ends with exactly the result of never stopping.
    ///
    /// This copies and sorts every group (O(groups · log groups)): call it when saving a
    /// checkpoint, not per chunk.
    pub fn checkpoint(&self) -> ScanState {
        let mut groups: Vec<GroupState> = self
            .agg
            .groups
            .iter()
            .map(|(key, acc)| GroupState {
                key: decode_key(key),
                rows: acc.rows,
                columns: acc.columns.to_vec(),
            })
            .collect();
        groups.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let invalid = self
            .agg
            .metric_columns
            .iter()
            .zip(&self.agg.invalid)
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c.clone(), *n))
            .collect();
        ScanState {
            offset: self.offset,
            header: self.agg.header.clone(),
            rows_scanned: self.agg.rows_scanned,
            groups,
            invalid,
        }
    }

    /// Absolute byte offset just past the last complete record.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Data rows aggregated so far.
    pub fn rows_scanned(&self) -> u64 {
        self.agg.rows_scanned
    }

    fn feed_inner(&mut self, mut chunk: &[u8]) -> Result<(), ScanError> {
        if let Some(mut first) = self.bom.take() {
            let take = (UTF8_BOM.len() - first.len()).min(chunk.len());
            first.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if first.len() < UTF8_BOM.len() && UTF8_BOM.starts_with(&first) {
                self.bom = Some(first); // all of `chunk` was taken; wait for more
                return Ok(());
            }
            if first == UTF8_BOM {
                self.pos += UTF8_BOM.len() as u64;
            } else {
                self.parse(&first)?;
            }
        }
        self.parse(chunk)
    }

    /// Parses input bytes, which must not be the end of the data. A NUL byte ends the scan
    /// after the records before it.
    fn parse(&mut self, input: &[u8]) -> Result<(), ScanError> {
        let nul = input.iter().position(|&b| b == 0);
        self.parse_text(&input[..nul.unwrap_or(input.len())])?;
        match nul {
            Some(_) => Err(ScanError::NotCsv(format!(
                "byte offset {} is a NUL byte: this looks like a binary file, not CSV text",
                self.pos
            ))),
            None => Ok(()),
        }
    }

    fn parse_text(&mut self, mut input: &[u8]) -> Result<(), ScanError> {
        // Never call read_record with empty input: to csv_core that means end of data.
        while !input.is_empty() {
            let (res, nin, nout, nend) = self.reader.read_record(
                input,
                &mut self.out[self.out_len..],
                &mut self.ends[self.ends_len..],
            );
            input = &input[nin..];
            self.pos += nin as u64;
            self.out_len += nout;
            self.ends_len += nend;
            match res {
                csv_core::ReadRecordResult::Record => self.complete_record()?,
                csv_core::ReadRecordResult::OutputFull => self.grow_out()?,
                csv_core::ReadRecordResult::OutputEndsFull => self.grow_ends()?,
                csv_core::ReadRecordResult::InputEmpty | csv_core::ReadRecordResult::End => {
                    if nin == 0 {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn complete_record(&mut self) -> Result<(), ScanError> {
        self.agg.record(&self.out[..self.out_len], &self.ends[..self.ends_len], self.offset)?;
        self.out_len = 0;
        self.ends_len = 0;
        self.offset = self.pos;
        Ok(())
    }

    fn record_name(&self) -> String {
        match self.agg.header {
            None => "the header row".to_owned(),
            Some(_) => format!(
                "data record {} (after byte offset {})",
                self.agg.rows_scanned + 1,
                self.offset
            ),
        }
    }

    /// Makes room for more field bytes, up to one more than the limit (so a record of
    /// exactly the limit fits whatever follows it).
    fn grow_out(&mut self) -> Result<(), ScanError> {
        if self.out.len() > self.max_record_bytes {
            return Err(ScanError::NotCsv(format!(
                "{} is longer than {} bytes; is a quote left open?",
                self.record_name(),
                self.max_record_bytes
            )));
        }
        let len = (self.out.len() * 2).min(self.max_record_bytes + 1);
        self.out.resize(len, 0);
        Ok(())
    }

    fn grow_ends(&mut self) -> Result<(), ScanError> {
        if self.ends.len() >= MAX_FIELDS {
            return Err(ScanError::NotCsv(format!(
                "{} has more than {MAX_FIELDS} fields",
                self.record_name()
            )));
        }
        let len = (self.ends.len() * 2).min(MAX_FIELDS);
        self.ends.resize(len, 0);
        Ok(())
    }
}

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
    use proptest::prelude::*;
    use serde_json::json;

    fn params(group_by: &[&str], metrics: Value) -> CsvReportParams {
        serde_json::from_value(
            json!({"input": "uploads/x/1/f.csv", "group_by": group_by, "metrics": metrics}),
        )
        .unwrap()
    }

    fn sales() -> CsvReportParams {
        params(
            &["region"],
            json!([{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "min", "column": "amount"},
                   {"op": "max", "column": "amount"}, {"op": "mean", "column": "amount"}]),
        )
    }

    /// Scans `data` fed in chunks of `chunk` bytes.
    fn scan_chunked(
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
    fn scan(p: &CsvReportParams, data: &[u8]) -> Result<ScanState, ScanError> {
        let whole = scan_chunked(p, data, data.len().max(1));
        assert_eq!(scan_chunked(p, data, 1), whole, "1-byte chunks differ");
        assert_eq!(scan_chunked(p, data, 7), whole, "7-byte chunks differ");
        whole
    }

    fn report(p: &CsvReportParams, data: &[u8]) -> Report {
        render(p, &scan(p, data).unwrap())
    }

    fn not_csv(p: &CsvReportParams, data: &[u8]) -> String {
        match scan(p, data) {
            Err(ScanError::NotCsv(msg)) => msg,
            other => panic!("expected NotCsv, got {other:?}"),
        }
    }

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

    #[test]
    fn aggregates_by_group() {
        let data = b"region,amount,note\nnorth,1,a\nsouth,2.5,b\nnorth,5,c\nsouth,4,d\nwest,x,e\n";
        let r = report(&sales(), data);
        assert_eq!(
            r.columns,
            ["region", "count", "sum(amount)", "min(amount)", "max(amount)", "mean(amount)"]
        );
        assert_eq!(
            r.rows,
            vec![
                vec![json!("north"), json!(2), json!(6), json!(1), json!(5), json!(3)],
                vec![json!("south"), json!(2), json!(6.5), json!(2.5), json!(4), json!(3.25)],
                vec![json!("west"), json!(1), Value::Null, Value::Null, Value::Null, Value::Null],
            ]
        );
        assert_eq!(r.rows_scanned, 5);
        assert_eq!(r.invalid, BTreeMap::from([("amount".to_owned(), 1)]));
    }

    #[test]
    fn groups_sort_by_the_tuple_of_values() {
        let p = params(&["a", "b"], json!([{"op": "count"}]));
        let r = report(&p, b"a,b\nx,2\n,z\nx,10\nab,1\nx,2\n");
        let keys: Vec<_> =
            r.rows.iter().map(|row| (row[0].clone(), row[1].clone(), row[2].clone())).collect();
        assert_eq!(
            keys,
            vec![
                (json!(""), json!("z"), json!(1)),
                (json!("ab"), json!("1"), json!(1)),
                (json!("x"), json!("10"), json!(1)),
                (json!("x"), json!("2"), json!(2)),
            ]
        );
    }

    #[test]
    fn rfc4180_quoting() {
        let p = params(&["name"], json!([{"op": "sum", "column": "n"}]));
        let data = b"name,n\r\n\"a,b\",1\r\n\"say \"\"hi\"\"\",2\r\n\"multi\r\nline\nvalue\",3\r\n\"\",4\r\n\"a,b\",\" 10 \"\r\n";
        let r = report(&p, data);
        assert_eq!(
            r.rows,
            vec![
                vec![json!(""), json!(4)],
                vec![json!("a,b"), json!(11)],
                vec![json!("multi\r\nline\nvalue"), json!(3)],
                vec![json!("say \"hi\""), json!(2)],
            ]
        );
        assert_eq!(r.rows_scanned, 5);
        assert!(r.invalid.is_empty());
    }

    #[test]
    fn quoted_header_names_are_exact() {
        let p = params(&[" a,b "], json!([{"op": "max", "column": "say \"x\""}]));
        let r = report(&p, b"\" a,b \",\"say \"\"x\"\"\"\nk,3\nk,-4\n");
        assert_eq!(r.rows, vec![vec![json!("k"), json!(3)]]);
        let trimmed = params(&["a,b"], json!([{"op": "count"}]));
        assert_eq!(scan(&trimmed, b"\" a,b \"\nk\n"), Err(ScanError::MissingColumn("a,b".into())));
    }

    #[test]
    fn crlf_and_lf_line_ends() {
        let p = params(&["k"], json!([{"op": "sum", "column": "v"}]));
        let lf = report(&p, b"k,v\na,1\nb,2\na,3\n");
        let crlf = report(&p, b"k,v\r\na,1\r\nb,2\r\na,3\r\n");
        let mixed = report(&p, b"k,v\r\na,1\nb,2\r\na,3");
        assert_eq!(lf, crlf);
        assert_eq!(lf, mixed);
        assert_eq!(lf.rows, vec![vec![json!("a"), json!(4)], vec![json!("b"), json!(2)]]);
    }

    #[test]
    fn byte_order_mark_is_skipped_at_offset_zero_only() {
        let p = params(&["k"], json!([{"op": "count"}]));
        let r = report(&p, b"\xEF\xBB\xBFk\nx\n\xEF\xBB\xBFy\n");
        assert_eq!(r.rows, vec![vec![json!("x"), json!(1)], vec![json!("\u{FEFF}y"), json!(1)]]);
        // A BOM-like prefix that is not a BOM is data (and here not UTF-8).
        let msg = not_csv(&p, b"\xEF\xBBk\nx\n");
        assert!(msg.contains("header"), "{msg}");
        // A file that is only a BOM, or part of one.
        assert!(not_csv(&p, b"\xEF\xBB\xBF").contains("empty"));
        assert!(not_csv(&p, b"\xEF\xBB").contains("header"));
        // Resuming at a record that starts with U+FEFF keeps it as data.
        let data = b"k\r\n\xEF\xBB\xBFz\r\nz\r\n";
        let mut s = Scanner::new(&p, ScanState::default());
        s.feed(&data[..3]).unwrap();
        let cp = s.checkpoint();
        assert_eq!(cp.offset, 2);
        let mut s = Scanner::new(&p, cp);
        s.feed(&data[2..]).unwrap();
        let r = render(&p, &s.finish().unwrap());
        assert_eq!(r.rows, vec![vec![json!("z"), json!(1)], vec![json!("\u{FEFF}z"), json!(1)]]);
    }

    #[test]
    fn blank_lines_are_not_rows() {
        let p = params(&[], json!([{"op": "count"}]));
        for data in [
            &b"\n\r\n\nk\n\na\n\n\nb\n\n"[..],
            b"\r\n\r\nk\r\n\r\n\r\na\r\n\r\nb\r\n\r\n",
            b"k\r\na\r\n\r\n\n\r\rb",
            b"k\na\nb\n\r\n\r\n",
        ] {
            let state = scan(&p, data).unwrap();
            assert_eq!(state.rows_scanned, 2, "{data:?}");
            assert_eq!(state.offset, data.len() as u64);
            assert_eq!(render(&p, &state).rows, vec![vec![json!(2)]]);
        }
        // A quoted empty field is a row, an empty line is not.
        assert_eq!(scan(&p, b"k\n\"\"\n\n").unwrap().rows_scanned, 1);
    }

    #[test]
    fn last_record_without_line_end_counts() {
        let p = params(&[], json!([{"op": "count"}, {"op": "sum", "column": "v"}]));
        assert_eq!(report(&p, b"v\n1\n2").rows, vec![vec![json!(2), json!(3)]]);
        assert_eq!(report(&p, b"v\r\n1\r\n\"2\"").rows, vec![vec![json!(2), json!(3)]]);
        // A header only: no rows, and the single group still has a row.
        assert_eq!(report(&p, b"v").rows, vec![vec![json!(0), Value::Null]]);
        assert_eq!(report(&p, b"v\r\n").rows_scanned, 0);
        let grouped = params(&["v"], json!([{"op": "count"}]));
        assert!(report(&grouped, b"v\n").rows.is_empty());
    }

    #[test]
    fn invalid_cells_are_counted_once_per_row_and_column() {
        let p = params(
            &[],
            json!([{"op": "sum", "column": "a"}, {"op": "mean", "column": "a"}, {"op": "max", "column": "b"},
                   {"op": "min", "column": "c"}]),
        );
        let data = "a,b,c\n1,x,1\n,2,2\n  3\t,NaN,3\nabc,inf,4\n4,-Infinity,5\n1e999,1e3,6\n0x10,\"1,5\",7\n€,+2.5,8\n";
        let r = report(&p, data.as_bytes());
        assert_eq!(r.rows, vec![vec![json!(8), json!(8.0 / 3.0), json!(1000), json!(1)]]);
        assert_eq!(r.invalid, BTreeMap::from([("a".to_owned(), 5), ("b".to_owned(), 5)]));
        assert_eq!(r.rows_scanned, 8);
    }

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

    #[test]
    fn missing_columns() {
        let data = b"region,amount\nn,1\n";
        let p = params(&["Region"], json!([{"op": "count"}]));
        assert_eq!(scan(&p, data), Err(ScanError::MissingColumn("Region".into())));
        let p = params(&["region"], json!([{"op": "sum", "column": "amount "}]));
        let err = scan(&p, data).unwrap_err();
        assert_eq!(err, ScanError::MissingColumn("amount ".into()));
        assert!(err.to_string().contains("\"amount \" is not in the CSV header"), "{err}");
        // The header is checked as soon as it is complete, before the rest of the file.
        let mut s = Scanner::new(&p, ScanState::default());
        assert!(s.feed(b"region,amount\n").is_err());
        // Resuming with params the checkpoint's header lacks fails too.
        let ok = scan(&sales(), b"region,amount\nn,1\n").unwrap();
        let mut s = Scanner::new(&p, ScanState { groups: vec![], ..ok });
        assert_eq!(s.feed(b"n,2\n"), Err(ScanError::MissingColumn("amount ".into())));
    }

    #[test]
    fn ragged_rows_are_not_csv() {
        let p = params(&[], json!([{"op": "count"}]));
        let msg = not_csv(&p, b"a,b,c\n1,2,3\n4,5\n");
        assert!(
            msg.contains("data record 2") && msg.contains("has 2 fields but the header has 3"),
            "{msg}"
        );
        let msg = not_csv(&p, b"a,b\r\n1,2\r\n3,4,5");
        assert!(
            msg.contains("data record 2") && msg.contains("has 3 fields but the header has 2"),
            "{msg}"
        );
        assert!(
            ScanError::NotCsv(msg).to_string().starts_with("the input is not readable as CSV: ")
        );
    }

    #[test]
    fn binary_and_empty_input_is_not_csv() {
        let p = params(&[], json!([{"op": "count"}]));
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\x01\0";
        assert!(not_csv(&p, png).contains("header row is not UTF-8"));
        let msg = not_csv(&p, b"a\n1\n2\x003\n");
        assert!(msg.contains("byte offset 5 is a NUL byte"), "{msg}");
        assert!(not_csv(&p, b"\0").contains("NUL"));
        let garbage: Vec<u8> =
            (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        not_csv(&p, &garbage);
        assert!(not_csv(&p, b"").contains("empty"));
        assert!(not_csv(&p, b"\r\n\n\r\n").contains("empty"));
        assert!(not_csv(&p, b",,\n1,2,3\n").contains("no column names"));
        // Group values must be text; other cells need not be.
        let g = params(&["k"], json!([{"op": "count"}, {"op": "sum", "column": "v"}]));
        assert!(not_csv(&g, b"k,v\na,1\n\xFF,2\n").contains("group_by column \"k\" is not UTF-8"));
        let r = report(&g, b"k,v,other\na,\xFF,\xFE\n");
        assert_eq!(r.invalid, BTreeMap::from([("v".to_owned(), 1)]));
        // Multi-byte characters split across chunks are fine.
        let r = report(&g, "k,v\nü€😀,1\n".as_bytes());
        assert_eq!(r.rows, vec![vec![json!("ü€😀"), json!(1), json!(1)]]);
    }

    #[test]
    fn records_and_field_counts_are_bounded() {
        let p = params(&[], json!([{"op": "count"}]));
        // A record of exactly the limit fits; one byte more does not, whatever the chunking.
        for chunk in [1, 5, 1000] {
            let run = |data: &[u8], limit: usize| {
                let mut s = Scanner::new(&p, ScanState::default());
                s.max_record_bytes = limit;
                data.chunks(chunk).try_for_each(|c| s.feed(c)).and_then(|()| s.finish())
            };
            let exact = format!("v\n{}\n", "x".repeat(5000));
            assert_eq!(run(exact.as_bytes(), 5000).unwrap().rows_scanned, 1);
            let quoted = format!("v\n\"{}\"\r\n", "x\n".repeat(2500));
            assert_eq!(run(quoted.as_bytes(), 5000).unwrap().rows_scanned, 1);
            let over = format!("v\n{}\n", "x".repeat(5001));
            assert!(matches!(run(over.as_bytes(), 5000), Err(ScanError::NotCsv(_))));
            let open_quote = format!("v\n\"{}\n1\n", "x".repeat(5000));
            let Err(ScanError::NotCsv(msg)) = run(open_quote.as_bytes(), 5000) else { panic!() };
            assert!(
                msg.contains("data record 1 (after byte offset 2) is longer than 5000 bytes"),
                "{msg}"
            );
        }
        let wide = format!("{}\n", ",".repeat(MAX_FIELDS - 1));
        assert!(not_csv(&p, wide.as_bytes()).contains("no column names"));
        let wider = format!("{}\n", ",".repeat(MAX_FIELDS));
        assert!(
            not_csv(&p, wider.as_bytes())
                .contains(&format!("header row has more than {MAX_FIELDS} fields"))
        );
    }

    #[test]
    fn too_many_groups() {
        let p = params(&["k"], json!([{"op": "count"}]));
        let mut s = Scanner::new(&p, ScanState::default());
        assert_eq!(s.agg.max_groups, MAX_GROUPS);
        s.agg.max_groups = 3;
        s.feed(b"k\na\nb\na\nc\nb\n").unwrap();
        assert_eq!(s.feed(b"d\n"), Err(ScanError::TooManyGroups(3)));
        assert_eq!(s.checkpoint().rows_scanned, 5);
        assert_eq!(s.checkpoint().offset, 12);
        // The scan stays failed.
        assert_eq!(s.feed(b"a\n"), Err(ScanError::TooManyGroups(3)));
        assert_eq!(s.finish(), Err(ScanError::TooManyGroups(3)));
        assert!(
            ScanError::TooManyGroups(MAX_GROUPS).to_string().contains("more than 1000000 groups")
        );
    }

    #[test]
    fn checkpoint_is_at_the_last_record_boundary() {
        let p = sales();
        let data = b"region,amount\r\nn,1\r\n\"s\r\n\",2\r\nn,3";
        let mut s = Scanner::new(&p, ScanState::default());
        let mut offsets = Vec::new();
        for b in data.chunks(1) {
            s.feed(b).unwrap();
            offsets.push(s.offset());
        }
        // The offset moves past each record's line end ('\r' ends a record; the '\n' after it
        // is skipped like a blank line, on resume too).
        let moves: Vec<usize> = offsets
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] != w[1])
            .map(|(i, _)| i + 2)
            .collect();
        assert_eq!(moves, vec![14, 19, 28]);
        assert_eq!(s.rows_scanned(), 2);
        let full = s.finish().unwrap();
        assert_eq!(full.offset, data.len() as u64);
        for cut in 0..=data.len() {
            let mut s = Scanner::new(&p, ScanState::default());
            s.feed(&data[..cut]).unwrap();
            let cp = s.checkpoint();
            assert!(cp.offset as usize <= cut);
            let mut s = Scanner::new(&p, cp.clone());
            s.feed(&data[cp.offset as usize..]).unwrap();
            assert_eq!(s.finish().unwrap(), full, "cut at {cut}");
        }
    }

    #[test]
    fn scan_state_round_trips_exactly() {
        let p = params(&["k"], json!([{"op": "sum", "column": "v"}, {"op": "min", "column": "w"}]));
        let data = b"k,v,w\na,0.1,x\na,0.2,x\nb,1e300,1\nb,1e300,-0.5\nc,1e308,\nc,1e308,\n";
        let state = scan(&p, data).unwrap();
        let text = serde_json::to_string(&state).unwrap();
        assert!(
            text.contains(r#""sum":"0.30000000000000004""#) || text.contains(r#""sum":"0.3""#),
            "{text}"
        );
        let back: ScanState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        let r = render(&p, &back);
        assert_eq!(r.rows[2], vec![json!("c"), Value::Null, Value::Null]); // the sum overflowed
        assert_eq!(r.invalid, BTreeMap::from([("w".to_owned(), 4)]));
        assert_eq!(
            ScanState::default(),
            serde_json::from_str(r#"{"offset":0,"header":null,"rows_scanned":0}"#).unwrap()
        );
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

    // ---- The key property: random documents, random chunks, random stops and resumes. ----

    /// A generated cell: its text and, if the text is a number, its value (known from
    /// generation, not from parsing).
    #[derive(Debug, Clone)]
    struct Cell {
        text: String,
        value: Option<f64>,
    }

    fn cell() -> impl Strategy<Value = Cell> {
        let quarter = (-400i64..400).prop_map(|q| {
            let v = q as f64 / 4.0;
            Cell { text: format!("{v}"), value: Some(v) }
        });
        let integer = (-1000i64..1000, 0..5u8).prop_map(|(i, style)| {
            let text = match style {
                0 => format!("{i}"),
                1 => format!(" {i}\t"),
                2 => format!("{i}.0"),
                3 => format!("{}e1", i as f64 / 10.0),
                _ => format!("+{i}"),
            };
            let text = if style == 4 && i < 0 { format!("{i}") } else { text };
            Cell { text, value: Some(i as f64) }
        });
        let junk = prop::sample::select(vec![
            "",
            " ",
            "abc",
            "NaN",
            "inf",
            "-Infinity",
            "1,5",
            "1 2",
            "0x1F",
            "\"7\"",
            "1e999",
            "x\ny",
            "a\r\nb",
            "€",
            "say \"hi\"",
            "a",
            "b",
            "a,b",
            "\u{FEFF}bom",
            "ü",
            "\r",
            "--1",
        ])
        .prop_map(|t| Cell { text: t.to_owned(), value: None });
        prop_oneof![3 => quarter, 3 => integer, 4 => junk]
    }

    #[derive(Debug, Clone)]
    struct Case {
        header: Vec<String>,
        rows: Vec<Vec<Cell>>,
        group_by: Vec<usize>,
        metrics: Vec<(u8, usize)>,
        seed: u64,
        stops: Vec<prop::sample::Index>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (1usize..=4).prop_flat_map(|width| {
            let suffixes = prop::sample::select(vec!["", " x", ",", "\"q\"", "\nn", "é", " "]);
            (
                prop::collection::vec(suffixes, width),
                prop::collection::vec(prop::collection::vec(cell(), width), 0..25),
                prop::collection::vec(0..width, 0..=2),
                prop::collection::vec((0u8..5, 0..width), 1..5),
                any::<u64>(),
                prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            )
                .prop_map(|(suffixes, rows, group_by, metrics, seed, stops)| Case {
                    header: suffixes.iter().enumerate().map(|(i, s)| format!("c{i}{s}")).collect(),
                    rows,
                    group_by,
                    metrics,
                    seed,
                    stops,
                })
        })
    }

    /// A small deterministic generator for layout choices and chunk sizes.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn encode_field(out: &mut Vec<u8>, text: &str, must_quote: bool, rng: &mut Rng) {
        let special = text.contains([',', '"', '\r', '\n']);
        if special || must_quote || rng.below(4) == 0 {
            out.push(b'"');
            out.extend_from_slice(text.replace('"', "\"\"").as_bytes());
            out.push(b'"');
        } else {
            out.extend_from_slice(text.as_bytes());
        }
    }

    fn encode_document(header: &[String], rows: &[Vec<Cell>], rng: &mut Rng) -> Vec<u8> {
        let mut out = Vec::new();
        if rng.below(3) == 0 {
            out.extend_from_slice(UTF8_BOM);
        }
        let texts = std::iter::once(header.to_vec())
            .chain(rows.iter().map(|r| r.iter().map(|c| c.text.clone()).collect()));
        let records: Vec<Vec<String>> = texts.collect();
        for (n, record) in records.iter().enumerate() {
            for _ in 0..rng.below(4).saturating_sub(2) {
                out.extend_from_slice(if rng.below(2) == 0 { b"\n" } else { b"\r\n" });
            }
            for (i, text) in record.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // A lone empty field unquoted would be a blank line.
                encode_field(&mut out, text, record.len() == 1 && text.is_empty(), rng);
            }
            if n + 1 < records.len() || rng.below(2) == 0 {
                out.extend_from_slice(if rng.below(2) == 0 { b"\n" } else { b"\r\n" });
            }
        }
        if rng.below(4) == 0 {
            out.extend_from_slice(b"\r\n\n");
        }
        out
    }

    fn feed_random(s: &mut Scanner, mut bytes: &[u8], rng: &mut Rng) {
        while !bytes.is_empty() {
            let n = match rng.below(4) {
                0 => 1,
                1 => 1 + rng.below(3),
                2 => 1 + rng.below(16),
                _ => 1 + rng.below(300),
            } as usize;
            let (chunk, rest) = bytes.split_at(n.min(bytes.len()));
            s.feed(chunk).unwrap();
            bytes = rest;
        }
    }

    /// The report computed straight from the generated rows.
    fn expected_report(p: &CsvReportParams, header: &[String], rows: &[Vec<Cell>]) -> Report {
        let index = |name: &str| header.iter().position(|h| h == name).unwrap();
        let mut columns: Vec<&str> = Vec::new();
        for m in &p.metrics {
            if let Some(c) = m.column()
                && !columns.contains(&c)
            {
                columns.push(c);
            }
        }
        let mut groups: BTreeMap<Vec<String>, (u64, Vec<Vec<f64>>)> = BTreeMap::new();
        let mut invalid: BTreeMap<String, u64> = BTreeMap::new();
        for row in rows {
            let key = p.group_by.iter().map(|g| row[index(g)].text.clone()).collect();
            let group = groups.entry(key).or_insert_with(|| (0, vec![Vec::new(); columns.len()]));
            group.0 += 1;
            for (j, c) in columns.iter().enumerate() {
                match row[index(c)].value {
                    Some(v) => group.1[j].push(v),
                    None => *invalid.entry(c.to_string()).or_default() += 1,
                }
            }
        }
        if p.group_by.is_empty() && groups.is_empty() {
            groups.insert(Vec::new(), (0, vec![Vec::new(); columns.len()]));
        }
        let whole = |x: f64| {
            if x.fract() == 0.0 { json!(x as i64) } else { json!(x) }
        };
        let table = groups
            .into_iter()
            .map(|(key, (count, values))| {
                let mut row: Vec<Value> = key.into_iter().map(Value::String).collect();
                for m in &p.metrics {
                    let vals =
                        m.column().map(|c| &values[columns.iter().position(|x| *x == c).unwrap()]);
                    row.push(match (m, vals) {
                        (Metric::Count, _) => json!(count),
                        (_, Some(v)) if v.is_empty() => Value::Null,
                        (Metric::Sum { .. }, Some(v)) => whole(v.iter().sum()),
                        (Metric::Min { .. }, Some(v)) => {
                            whole(v.iter().copied().fold(f64::INFINITY, f64::min))
                        }
                        (Metric::Max { .. }, Some(v)) => {
                            whole(v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
                        }
                        (Metric::Mean { .. }, Some(v)) => {
                            whole(v.iter().sum::<f64>() / v.len() as f64)
                        }
                        (_, None) => unreachable!(),
                    });
                }
                row
            })
            .collect();
        let mut names = p.group_by.clone();
        names.extend(p.metrics.iter().map(Metric::name));
        Report { columns: names, rows: table, rows_scanned: rows.len() as u64, invalid }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn chunked_stopped_and_resumed_scans_match_a_direct_computation(case in case()) {
            let mut rng = Rng(case.seed | 1);
            let mut group_by: Vec<String> = Vec::new();
            for &g in &case.group_by {
                if !group_by.contains(&case.header[g]) {
                    group_by.push(case.header[g].clone());
                }
            }
            let mut metrics: Vec<Metric> = Vec::new();
            for &(op, c) in &case.metrics {
                let column = case.header[c].clone();
                let m = match op {
                    0 => Metric::Count,
                    1 => Metric::Sum { column },
                    2 => Metric::Min { column },
                    3 => Metric::Max { column },
                    _ => Metric::Mean { column },
                };
                if !metrics.contains(&m) {
                    metrics.push(m);
                }
            }
            let p = CsvReportParams { input: "uploads/x/1/f.csv".into(), group_by, metrics, format: Format::Json };
            p.validate().unwrap();
            let doc = encode_document(&case.header, &case.rows, &mut rng);
            let expected = expected_report(&p, &case.header, &case.rows);

            // Without stopping.
            let mut s = Scanner::new(&p, ScanState::default());
            feed_random(&mut s, &doc, &mut rng);
            let straight = s.finish().unwrap();
            prop_assert_eq!(&render(&p, &straight), &expected);
            prop_assert_eq!(straight.offset, doc.len() as u64);

            // Stopping at random points, resuming from a serialised checkpoint each time.
            let mut stops: Vec<usize> = case.stops.iter().map(|i| i.index(doc.len() + 1)).collect();
            stops.sort_unstable();
            let mut state = ScanState::default();
            for stop in stops {
                let mut s = Scanner::new(&p, state);
                let from = s.offset() as usize;
                feed_random(&mut s, &doc[from..stop.max(from)], &mut rng);
                let cp = s.checkpoint();
                prop_assert!(cp.offset as usize <= stop.max(from));
                prop_assert_eq!(cp.offset, s.offset());
                prop_assert_eq!(cp.rows_scanned, s.rows_scanned());
                let text = serde_json::to_string(&cp).unwrap();
                state = serde_json::from_str(&text).unwrap();
                prop_assert_eq!(&state, &cp);
            }
            let mut s = Scanner::new(&p, state);
            let from = s.offset() as usize;
            feed_random(&mut s, &doc[from..], &mut rng);
            let resumed = s.finish().unwrap();
            prop_assert_eq!(&resumed, &straight);
            prop_assert_eq!(render(&p, &resumed), expected);
        }
    }
}
