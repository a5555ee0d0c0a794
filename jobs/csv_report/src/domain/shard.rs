//! One shard's scan: the data records that start in a byte range of the object, read without
//! knowing the parser's state at the range's first byte.
//!
//! Where a record begins inside a range depends on whether its first byte is inside a quoted
//! field, which only a scan from the start of the object knows. So a shard reads its range
//! under each assumption ([`Assumed`]): each reading skips what it takes for the rest of a
//! record begun before the range, notes where that ends (its *first* boundary), and from there
//! aggregates every record that starts before the range's end (reading on past the end to
//! finish the last one). The merge later learns where the previous shard's records really
//! ended and takes the reading whose first boundary is exactly there ([`super::Chain`]).
//!
//! A reading that starts at a true record boundary parses exactly as a scan from the start of
//! the object would (a resumed scan relies on the same fact), so a chosen reading is exact
//! whatever its assumption was. Two readings that reach the same record boundary parse alike
//! from there on: the scan then *joins* them, keeps what each read before, and reads the rest
//! once. On real files they join within a record or two, so a shard costs about one scan of
//! its bytes.

use serde::{Deserialize, Serialize};

use super::{CsvReportParams, MAX_RECORD_BYTES, ScanError, ScanState, Scanner};

/// How far past its shard's start a reading looks for its first record boundary before it
/// gives up: more than any record a scan accepts takes ([`MAX_RECORD_BYTES`] of fields, with
/// their quotes doubled and their separators). A true first boundary further on (after
/// megabytes of blank lines) is found by the merge's sequential fallback instead.
pub const SEARCH_BYTES: u64 = 3 * MAX_RECORD_BYTES as u64;

/// The bytes a shard answers for: the data records that start in `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRange {
    /// First byte (past the header row).
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// What a reading assumes about the parser's state at its shard's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Assumed {
    /// Nothing: the shard starts at a record boundary (the first shard, just past the header).
    Boundary,
    /// Not inside a quoted field: the reading starts a byte early, so that it (a
    /// separator, a line end, a field's text) sets the state.
    Unquoted,
    /// Inside a quoted field.
    Quoted,
    /// Inside a quoted field until the byte before the start, which the reading starts at: a
    /// quote there is a closing quote or the first of a doubled one (a cut between the two
    /// quotes of `""`); any other byte leaves it as [`Assumed::Quoted`], which it then joins
    /// at once.
    AfterQuote,
}

impl Assumed {
    /// Where a reading under this assumption begins, and the bytes that put a fresh parser in
    /// the assumed state there.
    fn lead_in(self, start: u64) -> (u64, Option<(&'static [u8], u64)>) {
        match self {
            Assumed::Boundary => (start, None),
            Assumed::Unquoted => (start.saturating_sub(1), Some((b"x", start))),
            Assumed::Quoted => (start, Some((b"\"", start))),
            Assumed::AfterQuote => (start.saturating_sub(1), Some((b"\"", start))),
        }
    }
}

/// How one reading of a shard ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    /// Its assumption.
    pub assumed: Assumed,
    /// Its first record boundary at or past the shard's start: `None` if it found none
    /// before the shard's end (or gave up looking, or failed first).
    pub first: Option<u64>,
    /// The records it read from `first`: until it joined the other reading (at
    /// `own.offset`), or all of them (`own.offset` is then where they end).
    pub own: ScanState,
    /// Whether it joined the other reading at `own.offset`: its records from there on are
    /// the shard's [`ShardScanned::joined`] ones.
    pub joined: bool,
    /// The error it stopped with: the file's fault if the merge takes this reading.
    pub error: Option<ScanError>,
}

/// The records past where a shard's readings joined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Joined {
    /// Their aggregates (`offset`: where they end).
    pub state: ScanState,
    /// The error they stopped with.
    pub error: Option<ScanError>,
}

/// What a shard's scan hands the merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardScanned {
    /// The shard's bytes.
    pub range: ShardRange,
    /// One per assumption.
    pub readings: Vec<Reading>,
    /// The records past where the readings joined, if they did.
    pub joined: Option<Joined>,
}

/// A shard's scan as checkpointed: the readings (one still scanning is as of its last record
/// boundary, where a scanner resumes exactly) and the joined records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardScanState {
    /// The shard, as it stands.
    scanned: ShardScanned,
    /// Per reading, whether it is still scanning.
    scanning: Vec<bool>,
    /// Whether the joined records are still being scanned.
    joined_scanning: bool,
}

/// A reading in progress.
enum Now {
    Scanning(Box<Scanner>),
    /// Handed its scanner to the joined records.
    Joined {
        first: u64,
        own: ScanState,
    },
    Ended(Reading),
}

struct Live {
    assumed: Assumed,
    now: Now,
}

/// A shard's scan in progress: fed the object's bytes from [`ShardScan::position`] on, until
/// [`ShardScan::done`] or the end of the object ([`ShardScan::finish`]).
pub struct ShardScan {
    range: ShardRange,
    readings: Vec<Live>,
    joined: Option<Result<Scanner, Joined>>,
}

impl std::fmt::Debug for ShardScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardScan")
            .field("range", &self.range)
            .field("position", &self.position())
            .field("done", &self.done())
            .finish_non_exhaustive()
    }
}

impl ShardScan {
    /// A new scan of `range`, whose file has `header`. `at_boundary`: the range starts at a
    /// record boundary (just past the header row), so one reading does.
    pub fn new(
        params: &CsvReportParams,
        header: &[String],
        range: ShardRange,
        at_boundary: bool,
    ) -> ShardScan {
        let assumptions: &[Assumed] = if at_boundary {
            &[Assumed::Boundary]
        } else {
            &[Assumed::Unquoted, Assumed::Quoted, Assumed::AfterQuote]
        };
        let readings = assumptions
            .iter()
            .map(|&assumed| {
                let (from, lead_in) = assumed.lead_in(range.start);
                let state = ScanState {
                    offset: from,
                    header: Some(header.to_vec()),
                    ..ScanState::default()
                };
                let scanner = Scanner::for_shard(params, state, range.end, lead_in);
                Live { assumed, now: Now::Scanning(Box::new(scanner)) }
            })
            .collect();
        ShardScan { range, readings, joined: None }
    }

    /// The scan a checkpoint ([`ShardScan::checkpoint`]) saved.
    pub fn resume(params: &CsvReportParams, saved: ShardScanState) -> ShardScan {
        let range = saved.scanned.range;
        let scanner = |state: ScanState| Scanner::for_shard(params, state, range.end, None);
        let readings = saved
            .scanned
            .readings
            .into_iter()
            .zip(saved.scanning)
            .map(|(reading, scanning)| {
                let assumed = reading.assumed;
                let now = match (scanning, reading.joined, reading.first) {
                    (true, _, first) => {
                        Now::Scanning(Box::new(scanner(reading.own).found_first(first)))
                    }
                    (false, true, Some(first)) => Now::Joined { first, own: reading.own },
                    _ => Now::Ended(reading),
                };
                Live { assumed, now }
            })
            .collect();
        let joined = saved.scanned.joined.map(|joined| match saved.joined_scanning {
            true => Ok(scanner(joined.state)),
            false => Err(joined),
        });
        ShardScan { range, readings, joined }
    }

    fn scanners(&self) -> impl Iterator<Item = &Scanner> {
        let readings = self.readings.iter().filter_map(|live| match &live.now {
            Now::Scanning(scanner) => Some(&**scanner),
            _ => None,
        });
        readings.chain(self.joined.iter().filter_map(|joined| joined.as_ref().ok()))
    }

    /// Where the bytes it is fed next must begin (a checkpointed scan resumes there).
    pub fn position(&self) -> u64 {
        self.scanners().map(Scanner::position).min().unwrap_or(self.range.end)
    }

    /// Whether every reading ended: the scan takes no more bytes.
    pub fn done(&self) -> bool {
        self.scanners().next().is_none()
    }

    /// Feeds the object's bytes `chunk`, which begin at byte `at`; each reading takes those
    /// from where it is on (readings go at their own pace while they are apart).
    pub fn feed(&mut self, at: u64, chunk: &[u8]) {
        let slice = |scanner: &Scanner| {
            let skip = scanner.position().checked_sub(at)?;
            chunk.get(usize::try_from(skip).ok()?..).filter(|rest| !rest.is_empty())
        };
        for live in &mut self.readings {
            if let Now::Scanning(scanner) = &mut live.now
                && let Some(bytes) = slice(scanner)
                && let Err(error) = scanner.feed(bytes)
            {
                live.now = Now::Ended(ended(live.assumed, self.range, scanner, Some(error)));
            }
        }
        if let Some(Ok(scanner)) = &mut self.joined
            && let Some(bytes) = slice(scanner)
            && let Err(error) = scanner.feed(bytes)
        {
            self.joined = Some(Err(Joined { state: scanner.checkpoint(), error: Some(error) }));
        }
        self.settle();
    }

    /// Ends readings that are done or gave up looking, and joins two that met.
    fn settle(&mut self) {
        let range = self.range;
        let give_up_at = range.end.min(range.start.saturating_add(SEARCH_BYTES));
        for live in &mut self.readings {
            if let Now::Scanning(scanner) = &live.now {
                let lost = scanner.searching() && scanner.position() >= give_up_at;
                if lost || scanner.done() {
                    live.now = Now::Ended(ended(live.assumed, range, scanner, None));
                }
            }
        }
        if let Some(Ok(scanner)) = &self.joined
            && scanner.done()
        {
            self.joined = Some(Err(Joined { state: scanner.checkpoint(), error: None }));
        }
        self.join();
    }

    /// Readings at the same record boundary parse alike from there: one scanner reads on for
    /// all of them (the joined records), each keeping what it read before. A reading that
    /// reaches the joined records' boundary later joins them too: what they held until then
    /// goes to the readings that joined before it.
    fn join(&mut self) {
        let at = |live: &Live| match &live.now {
            Now::Scanning(scanner) if !scanner.searching() => Some(scanner.offset()),
            _ => None,
        };
        let meeting = match &self.joined {
            Some(Ok(joined)) => joined.offset(),
            Some(Err(_)) => return,
            None => {
                let offsets: Vec<u64> = self.readings.iter().filter_map(at).collect();
                let met = offsets.iter().enumerate().find(|(i, o)| offsets[i + 1..].contains(o));
                let Some((_, &meeting)) = met else { return };
                meeting
            }
        };
        let meeting: Vec<usize> =
            (0..self.readings.len()).filter(|&i| at(&self.readings[i]) == Some(meeting)).collect();
        if meeting.is_empty() {
            return;
        }
        if let Some(Ok(joined)) = &mut self.joined {
            let before = joined.take_aggregates();
            for live in &mut self.readings {
                if let Now::Joined { first, own } = &mut live.now
                    && let Err(error) = own.absorb(before.clone())
                {
                    let (first, own) = (Some(*first), own.clone());
                    let assumed = live.assumed;
                    let reading =
                        Reading { assumed, first, own, joined: false, error: Some(error) };
                    live.now = Now::Ended(reading);
                }
            }
        }
        let range = self.range;
        for i in meeting {
            let live = &mut self.readings[i];
            let placeholder = Now::Joined { first: 0, own: ScanState::default() };
            let Now::Scanning(mut scanner) = std::mem::replace(&mut live.now, placeholder) else {
                unreachable!("a meeting reading is scanning");
            };
            let first = first_boundary(live.assumed, range, &scanner)
                .expect("a reading past its search has a first boundary");
            let own = match self.joined {
                Some(_) => scanner.checkpoint(),
                None => {
                    let own = scanner.take_aggregates();
                    self.joined = Some(Ok(*scanner));
                    own
                }
            };
            live.now = Now::Joined { first, own };
        }
    }

    /// The scan's checkpoint, unless a reading is still looking for its first boundary
    /// (which no checkpoint can hold: that is at most [`SEARCH_BYTES`] of reading).
    pub fn checkpoint(&self) -> Option<ShardScanState> {
        let mut scanning = Vec::new();
        let mut readings = Vec::new();
        for live in &self.readings {
            let reading = match &live.now {
                Now::Scanning(scanner) if scanner.searching() => return None,
                Now::Scanning(scanner) => Reading {
                    assumed: live.assumed,
                    first: first_boundary(live.assumed, self.range, scanner),
                    own: scanner.checkpoint(),
                    joined: false,
                    error: None,
                },
                Now::Joined { first, own } => Reading {
                    assumed: live.assumed,
                    first: Some(*first),
                    own: own.clone(),
                    joined: true,
                    error: None,
                },
                Now::Ended(reading) => reading.clone(),
            };
            scanning.push(matches!(live.now, Now::Scanning(_)));
            readings.push(reading);
        }
        let joined = self.joined.as_ref().map(|joined| match joined {
            Ok(scanner) => Joined { state: scanner.checkpoint(), error: None },
            Err(joined) => joined.clone(),
        });
        let joined_scanning = matches!(self.joined, Some(Ok(_)));
        Some(ShardScanState {
            scanned: ShardScanned { range: self.range, readings, joined },
            scanning,
            joined_scanning,
        })
    }

    /// Ends the scan at the end of the object (or once [`ShardScan::done`]): what the merge
    /// gets.
    pub fn finish(self) -> ShardScanned {
        let range = self.range;
        let readings = self
            .readings
            .into_iter()
            .map(|live| match live.now {
                Now::Scanning(scanner) if scanner.searching() => {
                    // The object ended inside what it skips: no record of its own.
                    ended(live.assumed, range, &scanner, None)
                }
                Now::Scanning(scanner) => {
                    let first = first_boundary(live.assumed, range, &scanner);
                    let (own, error) = finished(*scanner);
                    Reading { assumed: live.assumed, first, own, joined: false, error }
                }
                Now::Joined { first, own } => Reading {
                    assumed: live.assumed,
                    first: Some(first),
                    own,
                    joined: true,
                    error: None,
                },
                Now::Ended(reading) => reading,
            })
            .collect();
        let joined = self.joined.map(|joined| match joined {
            Ok(scanner) => {
                let (state, error) = finished(scanner);
                Joined { state, error }
            }
            Err(joined) => joined,
        });
        ShardScanned { range, readings, joined }
    }
}

/// A scanner's first record boundary: the shard's start for one that assumed nothing.
fn first_boundary(assumed: Assumed, range: ShardRange, scanner: &Scanner) -> Option<u64> {
    match assumed {
        Assumed::Boundary => Some(range.start),
        _ => scanner.first_boundary(),
    }
}

/// How a reading that stopped scanning ended (`error`: why it stopped early).
fn ended(
    assumed: Assumed,
    range: ShardRange,
    scanner: &Scanner,
    error: Option<ScanError>,
) -> Reading {
    let first = first_boundary(assumed, range, scanner);
    Reading { assumed, first, own: scanner.checkpoint(), joined: false, error }
}

/// A scanner's state at the end of the object: its last record (which no line end
/// ends) counted.
fn finished(scanner: Scanner) -> (ScanState, Option<ScanError>) {
    let fallback = scanner.checkpoint();
    match scanner.finish() {
        Ok(state) => (state, None),
        Err(error) => (fallback, Some(error)),
    }
}
