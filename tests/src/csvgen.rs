//! A generated CSV file for `csv_report` tests, with every RFC 4180 feature the job must
//! handle, and the report computed directly from the generated values (not by parsing).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One generated row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Group column 1 (sometimes with commas, quotes, newlines).
    pub region: String,
    /// Group column 2.
    pub product: String,
    /// A metric column: a number, or junk.
    pub amount: Option<f64>,
    /// How `amount` is written.
    pub amount_text: String,
}

/// A deterministic generator (xorshift), so failures reproduce.
pub struct Gen(u64);

impl Gen {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Gen(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }

    /// `n` rows.
    pub fn rows(&mut self, n: usize) -> Vec<Row> {
        let regions =
            ["eu", "us", "Asia, Pacific", "the \"north\"", "multi\nline", "  padded  ", ""];
        let products = ["widget", "gadget", "gizmo", "sprocket"];
        (0..n)
            .map(|_| {
                let region = self.pick(&regions).to_owned();
                let product = self.pick(&products).to_owned();
                let (amount, amount_text) = match self.next() % 10 {
                    0 => (None, "n/a".to_owned()),
                    1 => (None, String::new()),
                    _ => {
                        let cents = (self.next() % 200_000) as i64 - 50_000;
                        let value = cents as f64 / 100.0;
                        (Some(value), format!("{value}"))
                    }
                };
                Row { region, product, amount, amount_text }
            })
            .collect()
    }
}

fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) || field.starts_with(' ') {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

/// The file: a UTF-8 BOM, CRLF line ends, quoted fields, and blank lines here and there.
pub fn csv_bytes(rows: &[Row]) -> Vec<u8> {
    let mut out = String::from("\u{feff}region,product,amount,note\r\n");
    for (i, row) in rows.iter().enumerate() {
        if i % 97 == 5 {
            out.push_str("\r\n");
        }
        let note = if i % 3 == 0 { "\"said \"\"hi\"\", left\"" } else { "plain" };
        out.push_str(&format!(
            "{},{},{},{}\r\n",
            quote(&row.region),
            quote(&row.product),
            quote(&row.amount_text),
            note
        ));
    }
    out.into_bytes()
}

/// The report's rows computed directly: group by (region, product); count, sum, min, max,
/// mean of amount; and how many amount cells were invalid.
pub fn expected(rows: &[Row]) -> (Vec<Value>, u64) {
    #[derive(Default)]
    struct Acc {
        count: u64,
        sum: f64,
        valid: u64,
        min: Option<f64>,
        max: Option<f64>,
    }
    let mut groups: BTreeMap<(String, String), Acc> = BTreeMap::new();
    let mut invalid = 0;
    for row in rows {
        let acc = groups.entry((row.region.clone(), row.product.clone())).or_default();
        acc.count += 1;
        match row.amount {
            Some(v) => {
                acc.sum += v;
                acc.valid += 1;
                acc.min = Some(acc.min.map_or(v, |m| m.min(v)));
                acc.max = Some(acc.max.map_or(v, |m| m.max(v)));
            }
            None => invalid += 1,
        }
    }
    let rows = groups
        .into_iter()
        .map(|((region, product), a)| {
            let mean = (a.valid > 0).then(|| a.sum / a.valid as f64);
            json!([region, product, a.count, (a.valid > 0).then_some(a.sum), a.min, a.max, mean])
        })
        .collect();
    (rows, invalid)
}

/// Whether two report rows agree (numbers within a relative 1e-9).
pub fn rows_match(actual: &Value, expected: &Value) -> bool {
    let (Some(a), Some(e)) = (actual.as_array(), expected.as_array()) else { return false };
    a.len() == e.len()
        && a.iter().zip(e).all(|(a, e)| match (a.as_f64(), e.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * y.abs().max(1.0),
            _ => a == e,
        })
}
