//! The aggregates: rows folded into per-group accumulators, and the group keys.

use std::collections::HashMap;

use super::{ColumnStats, CsvReportParams, GroupState, ScanError, ScanState};

/// Most distinct groups a report may have; more is [`ScanError::TooManyGroups`].
pub const MAX_GROUPS: usize = 1_000_000;

impl ColumnStats {
    /// Adds one numeric cell.
    pub(super) fn add(&mut self, v: f64) {
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

    /// The compensated sum.
    pub(super) fn total(&self) -> f64 {
        if self.sum.is_finite() { self.sum + self.compensation } else { self.sum }
    }
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
pub(super) struct Aggregates {
    group_by: Vec<String>,
    metric_columns: Vec<String>,
    /// The header row, once read.
    pub(super) header: Option<Vec<String>>,
    resolved: Option<Resolved>,
    /// Data rows aggregated so far.
    pub(super) rows_scanned: u64,
    /// Group key (encoded by [`encode_key_part`]) → accumulators.
    groups: HashMap<Box<[u8]>, GroupAcc>,
    /// Invalid cells per metric column.
    invalid: Vec<u64>,
    /// Most groups ([`MAX_GROUPS`]; less in tests).
    pub(super) max_groups: usize,
    /// Reused to build each row's key without allocating.
    key: Vec<u8>,
    /// Whether errors name a record by its number in the file (a shard's scan does not know
    /// it: only its byte offset).
    pub(super) numbered: bool,
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
    /// The aggregates of `state` (`ScanState::default()` for a new scan) for `params`, and the
    /// error that ends the scan if `state`'s header lacks a column of `params`.
    ///
    /// # Panics
    ///
    /// If `state` was made with other params: a group key or column list of the wrong length.
    pub(super) fn resume(
        params: &CsvReportParams,
        state: ScanState,
    ) -> (Aggregates, Option<ScanError>) {
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
        let aggregates = Aggregates {
            group_by: params.group_by.clone(),
            metric_columns,
            header: state.header,
            resolved,
            rows_scanned: state.rows_scanned,
            groups,
            invalid,
            max_groups: MAX_GROUPS,
            key: Vec::new(),
            numbered: true,
        };
        (aggregates, failed)
    }

    /// The state of the aggregates as of byte `offset` (just past the last complete record).
    ///
    /// This copies and sorts every group (O(groups · log groups)).
    pub(super) fn state(&self, offset: u64) -> ScanState {
        let mut groups: Vec<GroupState> = self
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
            .metric_columns
            .iter()
            .zip(&self.invalid)
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| (c.clone(), *n))
            .collect();
        ScanState {
            offset,
            header: self.header.clone(),
            rows_scanned: self.rows_scanned,
            groups,
            invalid,
        }
    }

    /// Forgets the rows aggregated so far (the header stays).
    pub(super) fn clear(&mut self) {
        self.rows_scanned = 0;
        self.groups.clear();
        self.invalid.iter_mut().for_each(|n| *n = 0);
    }

    /// How an error names the next data record, which starts just past byte `after`.
    pub(super) fn record_name(&self, after: u64) -> String {
        if self.numbered {
            format!("data record {} (after byte offset {after})", self.rows_scanned + 1)
        } else {
            format!("the data record after byte offset {after}")
        }
    }

    /// Distinct groups so far.
    pub(super) fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Folds one complete record (`data`, with field `i` ending at `ends[i]`) into the
    /// aggregates. Nothing changes if it fails.
    pub(super) fn record(
        &mut self,
        data: &[u8],
        ends: &[usize],
        after: u64,
    ) -> Result<(), ScanError> {
        let field = |i: usize| &data[if i == 0 { 0 } else { ends[i - 1] }..ends[i]];
        let Some(resolved) = &self.resolved else {
            return self.header_record(ends.len(), field);
        };
        if ends.len() != resolved.width {
            return Err(ScanError::NotCsv(format!(
                "{} has {} fields but the header has {}",
                self.record_name(after),
                ends.len(),
                resolved.width
            )));
        }
        self.key.clear();
        for (&at, name) in resolved.group.iter().zip(&self.group_by) {
            let value = field(at);
            if std::str::from_utf8(value).is_err() {
                return Err(ScanError::NotCsv(format!(
                    "{}: the value of group_by column {name:?} is not UTF-8 text",
                    self.record_name(after)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use crate::domain::fixtures::{params, report, sales};

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
}
