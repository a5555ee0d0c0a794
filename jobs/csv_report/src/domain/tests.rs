//! The key property of the domain: random documents, random chunks, random stops and
//! resumes give the report computed straight from the generated rows.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::scan::UTF8_BOM;
use super::{
    Chain, CsvReportParams, Format, Linked, Metric, Report, ScanError, ScanState, Scanner,
    ShardRange, ShardScan, ShardScanned, render,
};

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
        "q \"x\"\r\ny \"\"",
        "\"\n",
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
                    (Metric::Mean { .. }, Some(v)) => whole(v.iter().sum::<f64>() / v.len() as f64),
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
        let p = case_params(&case);
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

/// Scans `doc` as shards cut at `cuts`, each fed in random chunks from where it asks and
/// stopped and resumed from a serialised checkpoint at random, then merged in shard order with
/// the sequential rescan where no reading links. Also answers how many shards were rescanned.
fn scan_sharded(
    p: &CsvReportParams,
    doc: &[u8],
    cuts: &[usize],
    rng: &mut Rng,
) -> Result<(ScanState, usize), ScanError> {
    // What split does: read up to the header row.
    let mut head = Scanner::new(p, ScanState::default());
    for chunk in doc.chunks(16) {
        if head.header().is_some() {
            break;
        }
        head.feed(chunk)?;
    }
    let Some((header, Some(header_end))) = head.header() else {
        return head.finish().map(|state| (state, 0));
    };
    let header = header.to_vec();
    let mut bounds: Vec<u64> = cuts
        .iter()
        .map(|&c| c as u64)
        .filter(|&c| c > header_end && c < doc.len() as u64)
        .collect();
    bounds.insert(0, header_end);
    bounds.push(doc.len() as u64);
    bounds.sort_unstable();
    bounds.dedup();
    let mut scanned = Vec::new();
    for (i, w) in bounds.windows(2).enumerate() {
        let range = ShardRange { start: w[0], end: w[1] };
        let mut scan = ShardScan::new(p, &header, range, i == 0);
        while !scan.done() && (scan.position() as usize) < doc.len() {
            let at = scan.position() as usize;
            let most = if rng.below(2) == 0 { 4 } else { 64 };
            let n = 1 + rng.below(most) as usize;
            scan.feed(at as u64, &doc[at..(at + n).min(doc.len())]);
            if rng.below(4) == 0
                && let Some(saved) = scan.checkpoint()
            {
                let text = serde_json::to_string(&saved).unwrap();
                scan = ShardScan::resume(p, serde_json::from_str(&text).unwrap());
            }
        }
        let text = serde_json::to_string(&scan.finish()).unwrap();
        scanned.push(serde_json::from_str::<ShardScanned>(&text).unwrap());
    }
    let mut chain = Chain::new(header.clone(), header_end);
    let mut rescans = 0;
    for shard in scanned {
        if let Linked::Rescan { from, range } = chain.link(shard)? {
            let state =
                ScanState { offset: from, header: Some(header.clone()), ..ScanState::default() };
            let mut s = Scanner::for_shard(p, state, range.end, None);
            for chunk in doc[from as usize..].chunks(5) {
                if s.done() {
                    break;
                }
                s.feed(chunk)?;
            }
            chain.rescanned(s.finish()?)?;
            rescans += 1;
        }
    }
    Ok((chain.finish(), rescans))
}

/// Params over `case`'s columns.
fn case_params(case: &Case) -> CsvReportParams {
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
    let p = CsvReportParams {
        input: "uploads/x/1/f.csv".into(),
        group_by,
        metrics,
        format: Format::Json,
        shard_bytes: None,
    };
    p.validate().unwrap();
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Cut anywhere — inside quoted fields, between a CR and its LF, inside blank lines —
    /// a sharded scan equals the sequential one: the same report, or the same kind of error.
    /// Stray quotes (which a lenient parser reads as data in an unquoted field, so that no
    /// count of quotes tells where records begin) are sprinkled in half the documents.
    #[test]
    fn sharded_scans_equal_the_sequential_scan(
        case in case(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        quotes in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let mut rng = Rng(case.seed | 1);
        let p = case_params(&case);
        let mut doc = encode_document(&case.header, &case.rows, &mut rng);
        if case.seed % 2 == 0 {
            for at in &quotes {
                let at = at.index(doc.len() + 1);
                doc.insert(at, b'"');
            }
        }
        let cuts: Vec<usize> = cuts.iter().map(|c| c.index(doc.len() + 1)).collect();
        let sequential = super::fixtures::scan_chunked(&p, &doc, 7);
        let sharded = scan_sharded(&p, &doc, &cuts, &mut rng);
        match (&sequential, &sharded) {
            (Ok(whole), Ok((merged, rescans))) => {
                if case.seed % 2 == 1 {
                    prop_assert_eq!(*rescans, 0, "well-formed: the readings link {:?} {:?}", String::from_utf8_lossy(&doc), cuts);
                }
                prop_assert_eq!(render(&p, merged), render(&p, whole));
                prop_assert_eq!(merged.rows_scanned, whole.rows_scanned);
                prop_assert_eq!(&merged.invalid, &whole.invalid);
            }
            (Err(a), Err(b)) => {
                prop_assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b), "{} vs {}", a, b);
            }
            _ => prop_assert!(false, "sequential {:?} vs sharded {:?}", sequential, sharded),
        }
    }
}

/// On documents without stray quotes, the readings link: no shard is scanned again.
#[test]
fn well_formed_documents_need_no_rescan() {
    let p = super::fixtures::sales();
    let mut doc = b"region,amount\r\n".to_vec();
    for i in 0..400 {
        let row = match i % 4 {
            0 => format!("north,{i}\r\n"),
            1 => format!("\"so,uth\",{i}.5\n"),
            2 => format!("\"multi\nline \"\"quoted\"\"\r\nregion\",{i}\r\n"),
            _ => format!("west,x{i}\n\n"),
        };
        doc.extend_from_slice(row.as_bytes());
    }
    let whole = super::fixtures::scan_chunked(&p, &doc, 4096).unwrap();
    let mut rng = Rng(7);
    for step in [1usize, 2, 3, 5, 7, 11, 64, 1000] {
        let cuts: Vec<usize> = (1..doc.len()).step_by(step).collect();
        let (merged, rescans) = scan_sharded(&p, &doc, &cuts, &mut rng).unwrap();
        assert_eq!(render(&p, &merged), render(&p, &whole), "cut every {step} bytes");
        assert_eq!(rescans, 0, "cut every {step} bytes");
    }
}

/// Cut once at every byte — inside `""`, just past an opening quote, between CR and LF, in
/// blank lines — a well-formed document's shards link without a rescan.
#[test]
fn a_cut_anywhere_in_a_well_formed_document_links() {
    let p = super::fixtures::sales();
    let mut doc = b"region,amount\r\n".to_vec();
    for i in 0..12 {
        let row = match i % 4 {
            0 => format!("north,{i}\r\n"),
            1 => format!("\"so,\"\"u\"\"th\",{i}.5\n"),
            2 => format!("\"multi\n\"\"line\"\"\r\n\"\"\",{i}\r\n"),
            _ => format!("west,x{i}\n\n"),
        };
        doc.extend_from_slice(row.as_bytes());
    }
    let whole = super::fixtures::scan_chunked(&p, &doc, 4096).unwrap();
    let mut rng = Rng(11);
    for cut in 1..doc.len() {
        let (merged, rescans) = scan_sharded(&p, &doc, &[cut], &mut rng).unwrap();
        assert_eq!(render(&p, &merged), render(&p, &whole), "cut at {cut}");
        assert_eq!(
            rescans,
            0,
            "cut at {cut}: {:?}",
            String::from_utf8_lossy(&doc[cut.saturating_sub(3)..cut])
        );
    }
}
