//! The checkpointable state of a scan, and its serialised form.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::CsvReportParams;

/// Version of [`ScanState`]'s shape. Stored beside a checkpoint; bump it whenever the shape
/// changes so an old checkpoint is never read as a new one.
pub const SCAN_STATE_VERSION: u32 = 1;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    use crate::domain::fixtures::{params, scan};
    use crate::domain::render;

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
}
