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
//!
//! One file per concern: `params` (what a client may ask: [`CsvReportParams`]), `checkpoint`
//! ([`ScanState`]), `scan` ([`Scanner`]), `aggregate` (the per-group accumulators) and `render`
//! ([`Report`]).

mod aggregate;
mod checkpoint;
mod merge;
mod params;
mod render;
mod scan;
mod shard;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

pub use aggregate::MAX_GROUPS;
pub use checkpoint::{ColumnStats, GroupState, SCAN_STATE_VERSION, ScanState};
pub use merge::{Chain, Linked, shard_ranges};
pub use params::{
    CsvReportParams, DEFAULT_SHARD_BYTES, Format, MAX_COLUMN_NAME_CHARS, MAX_GROUP_BY,
    MAX_INPUT_BYTES, MAX_METRICS, MIN_SHARD_BYTES, Metric, SpecError,
};
pub use render::{Report, render};
pub use scan::{MAX_FIELDS, MAX_RECORD_BYTES, ScanError, Scanner};
pub use shard::{
    Assumed, Joined, Reading, SEARCH_BYTES, ShardRange, ShardScan, ShardScanState, ShardScanned,
};
