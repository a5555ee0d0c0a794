//! The scanner: a resumable, push-based CSV parse of one object, record by record.

use super::aggregate::Aggregates;
use super::{CsvReportParams, ScanState};

#[cfg(doc)]
use super::render;

/// Longest record (the bytes of its fields, without quotes and separators); longer is
/// [`ScanError::NotCsv`]. This bounds memory when a stray quote would otherwise turn the rest
/// of a file into one field.
pub const MAX_RECORD_BYTES: usize = 16 * 1024 * 1024;
/// Most fields in one record; more is [`ScanError::NotCsv`].
pub const MAX_FIELDS: usize = 65_536;

pub(super) const UTF8_BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Why a scan stopped. Every variant is a property of the file (or of the params against
/// it): retrying will not help.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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

/// A resumable, push-based scan of one CSV object. See the [module docs](super).
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
    /// The scan ends before the first record that starts at or past this offset: a shard's
    /// records are those that start before its end (`u64::MAX`: the whole object's).
    limit: u64,
    /// Whether the scan ended so.
    stopped: bool,
    /// Between records: the next byte begins a record, unless it is a line end (a blank
    /// line, or the LF of a CRLF), which is skipped. A record *starts* at its first byte
    /// that is not one: that is where `offset` stands between records, so every scan of a
    /// file — whole, resumed, or a shard's — agrees on where each record starts.
    between: bool,
    /// Speculating: the records read until one ends at or past `skip_before` are the rest of
    /// one that started before the shard (under the reading's assumption of the parser's
    /// state, a byte early). They are not aggregated and their fields are not kept.
    skipping: bool,
    skip_before: u64,
    /// Whether the scan speculated ([`Scanner::for_shard`]'s `lead_in`).
    speculative: bool,
    /// Inside the quoted field a `"` lead-in opened, before any quote: only a quote changes
    /// the parser's state there, so the bytes up to the next one are passed over at once
    /// (a reading assuming a quoted field over a file with no quotes costs next to nothing).
    lead_quote: bool,
    /// Where the first record after the skipped ones starts.
    first: Option<u64>,
    /// Just past the header row, once this scanner read it.
    header_end: Option<u64>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("offset", &self.offset)
            .field("pos", &self.pos)
            .field("rows_scanned", &self.agg.rows_scanned)
            .field("groups", &self.agg.group_count())
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
        let offset = state.offset;
        let (agg, failed) = Aggregates::resume(params, state);
        let mut reader = csv_core::Reader::new();
        // csv_core strips a byte order mark from the first input it sees, but only when all
        // three bytes come in one call, and also at a resume offset, where it is data. The
        // scanner handles the BOM itself, so mark the reader as having read already: with no
        // output space this consumes nothing and leaves the parser at the start of a record.
        let (_, consumed, _, _) = reader.read_record(b"\0", &mut [], &mut []);
        debug_assert_eq!(consumed, 0, "priming the reader consumes no input");
        Scanner {
            reader,
            agg,
            offset,
            pos: offset,
            bom: (offset == 0).then(Vec::new),
            out: vec![0; 4096],
            out_len: 0,
            ends: vec![0; 64],
            ends_len: 0,
            max_record_bytes: MAX_RECORD_BYTES,
            failed,
            limit: u64::MAX,
            stopped: false,
            between: true,
            skipping: false,
            skip_before: 0,
            speculative: false,
            lead_quote: false,
            first: None,
            header_end: None,
        }
    }

    /// A scanner of one shard's records, from `state.offset` (a record boundary, or — when
    /// `lead_in` is given — a byte the scan assumes a parser state at) until the first record
    /// boundary at or past `limit`. `state` carries the header; errors name records by byte
    /// offset only (their number in the file is not known here).
    ///
    /// With `lead_in` (bytes, and the shard's start), the reader first reads those bytes
    /// (which must not end a record) to put it in the assumed state, and skips the records
    /// it then reads until one ends at or past the shard's start: they are the rest of a
    /// record the scan did not see begin ([`Scanner::first_boundary`]).
    pub fn for_shard(
        params: &CsvReportParams,
        state: ScanState,
        limit: u64,
        lead_in: Option<(&[u8], u64)>,
    ) -> Scanner {
        let mut scanner = Scanner::new(params, state);
        scanner.agg.numbered = false;
        scanner.limit = limit;
        scanner.bom = None;
        if let Some((lead_in, start)) = lead_in {
            let (res, consumed, nout, nend) =
                scanner.reader.read_record(lead_in, &mut scanner.out, &mut scanner.ends);
            debug_assert!(
                consumed == lead_in.len() && res == csv_core::ReadRecordResult::InputEmpty,
                "a lead-in is read whole and ends no record"
            );
            scanner.out_len = nout;
            scanner.ends_len = nend;
            scanner.skipping = true;
            scanner.skip_before = start;
            scanner.speculative = true;
            scanner.between = false;
            scanner.lead_quote = lead_in == b"\"";
        }
        scanner
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
        if self.done() {
            return Ok(self.checkpoint());
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
        self.agg.state(self.offset)
    }

    /// Absolute byte offset just past the last complete record.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Data rows aggregated so far.
    pub fn rows_scanned(&self) -> u64 {
        self.agg.rows_scanned
    }

    /// Absolute offset of the next byte to feed.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Whether the scan reached its limit ([`Scanner::for_shard`]): it takes no more bytes.
    pub fn done(&self) -> bool {
        self.stopped
    }

    /// Whether it is still looking for where its first record starts
    /// ([`Scanner::for_shard`]'s `lead_in`).
    pub(super) fn searching(&self) -> bool {
        self.speculative && self.first.is_none()
    }

    /// Where the first record after the skipped ones starts: the first record boundary the
    /// scan found.
    pub(super) fn first_boundary(&self) -> Option<u64> {
        self.first
    }

    /// The scanner, resumed past its skipped records, the first record after them starting
    /// at `first`.
    pub(super) fn found_first(mut self, first: Option<u64>) -> Scanner {
        self.first = first;
        self.speculative = true;
        self
    }

    /// The header row, once read, and the offset just past it (when this scanner read it).
    pub fn header(&self) -> Option<(&[String], Option<u64>)> {
        self.agg.header.as_deref().map(|header| (header, self.header_end))
    }

    /// The aggregates so far, as of [`Scanner::offset`]; the scan goes on from there with
    /// none (the parser's state is kept).
    pub(super) fn take_aggregates(&mut self) -> ScanState {
        let state = self.checkpoint();
        self.agg.clear();
        state
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
            // A NUL past the scan's limit is another shard's.
            Some(_) if !self.done() => Err(ScanError::NotCsv(format!(
                "byte offset {} is a NUL byte: this looks like a binary file, not CSV text",
                self.pos
            ))),
            _ => Ok(()),
        }
    }

    fn parse_text(&mut self, mut input: &[u8]) -> Result<(), ScanError> {
        // Never call read_record with empty input: to csv_core that means end of data.
        while !input.is_empty() && !self.stopped {
            if self.between {
                // Line ends between records are blank lines to csv_core too.
                let blank = input.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
                input = &input[blank..];
                self.pos += blank as u64;
                self.offset = self.pos;
                if input.is_empty() {
                    break;
                }
                self.between = false;
                if self.speculative && !self.skipping && self.first.is_none() {
                    self.first = Some(self.offset);
                }
                if self.offset >= self.limit {
                    self.stopped = true;
                    break;
                }
            }
            if self.lead_quote {
                match input.iter().position(|&b| b == b'"') {
                    None => {
                        self.pos += input.len() as u64;
                        break;
                    }
                    Some(quote) => {
                        input = &input[quote..];
                        self.pos += quote as u64;
                        self.lead_quote = false;
                    }
                }
            }
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
        if self.skipping {
            self.skipping = self.pos < self.skip_before;
        } else {
            let header = self.agg.header.is_none();
            self.agg.record(&self.out[..self.out_len], &self.ends[..self.ends_len], self.offset)?;
            if header {
                self.header_end = Some(self.pos);
            }
        }
        self.out_len = 0;
        self.ends_len = 0;
        self.offset = self.pos;
        self.between = true;
        Ok(())
    }

    fn record_name(&self) -> String {
        match self.agg.header {
            None => "the header row".to_owned(),
            Some(_) => self.agg.record_name(self.offset),
        }
    }

    /// Makes room for more field bytes, up to one more than the limit (so a record of
    /// exactly the limit fits whatever follows it).
    fn grow_out(&mut self) -> Result<(), ScanError> {
        if self.skipping {
            self.out_len = 0; // the skipped record's fields are not kept
            return Ok(());
        }
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
        if self.skipping {
            self.ends_len = 0;
            return Ok(());
        }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use serde_json::{Value, json};

    use crate::domain::fixtures::{not_csv, params, report, sales, scan};
    use crate::domain::{MAX_GROUPS, render};

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
        assert_eq!(cp.offset, 3, "past the header's CRLF");
        let mut s = Scanner::new(&p, cp);
        s.feed(&data[3..]).unwrap();
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
        // The offset moves past each record's line end ('\r' ends a record), then past the
        // '\n' after it, skipped like a blank line, on resume too: between records the offset
        // is where the next one starts.
        let moves: Vec<usize> = offsets
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[0] != w[1])
            .map(|(i, _)| i + 2)
            .collect();
        assert_eq!(moves, vec![14, 15, 19, 20, 28, 29]);
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
}
