//! Merging shards' scans, in shard order, into the scan of the whole object.
//!
//! A [`Chain`] knows where the records merged so far end: the first record boundary of the
//! next shard. Of that shard's readings it takes the one whose first boundary is exactly
//! there (a reading from a true boundary is exact, [`super::shard`]); when none is, the
//! caller scans the shard's records again from there, sequentially ([`Linked::Rescan`]).
//! Aggregates merge as the scan would have built them: counts and row counts add, minima and
//! maxima combine, compensated sums add with their compensations (equal to the sequential
//! sum within rounding, far inside 1e-9 relative).

use super::aggregate::MAX_GROUPS;
use super::shard::{ShardRange, ShardScanned};
use super::{ColumnStats, GroupState, ScanError, ScanState};

impl ColumnStats {
    /// Adds `other`'s cells, as if they had been added one by one.
    fn absorb(&mut self, other: &ColumnStats) {
        if other.count == 0 {
            return;
        }
        let (a, b) = (self.sum, other.sum);
        let t = a + b;
        if t.is_finite() {
            // Neumaier, on the two high parts; the low parts add.
            let lost = if a.abs() >= b.abs() { (a - t) + b } else { (b - t) + a };
            self.compensation += other.compensation + lost;
        }
        self.sum = t;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.count += other.count;
    }
}

impl GroupState {
    fn absorb(&mut self, other: &GroupState) {
        self.rows += other.rows;
        for (mine, theirs) in self.columns.iter_mut().zip(&other.columns) {
            mine.absorb(theirs);
        }
    }
}

impl ScanState {
    /// Adds the records of `next`, which follow this state's: its groups, rows and invalid
    /// cells; the state then ends where `next` does. More than [`MAX_GROUPS`] groups in all
    /// is [`ScanError::TooManyGroups`].
    pub fn absorb(&mut self, next: ScanState) -> Result<(), ScanError> {
        let mine = std::mem::take(&mut self.groups);
        let mut merged = Vec::with_capacity(mine.len().max(next.groups.len()));
        let (mut mine, mut theirs) =
            (mine.into_iter().peekable(), next.groups.into_iter().peekable());
        // Both are sorted by key: merge them in order.
        loop {
            let group = match (mine.peek(), theirs.peek()) {
                (Some(a), Some(b)) if a.key == b.key => {
                    let mut group = mine.next().expect("peeked");
                    group.absorb(&theirs.next().expect("peeked"));
                    group
                }
                (Some(a), Some(b)) if a.key < b.key => mine.next().expect("peeked"),
                (Some(_), None) => mine.next().expect("peeked"),
                (_, Some(_)) => theirs.next().expect("peeked"),
                (None, None) => break,
            };
            if merged.len() >= MAX_GROUPS {
                return Err(ScanError::TooManyGroups(MAX_GROUPS));
            }
            merged.push(group);
        }
        self.groups = merged;
        self.rows_scanned += next.rows_scanned;
        for (column, n) in next.invalid {
            *self.invalid.entry(column).or_insert(0) += n;
        }
        self.offset = next.offset;
        Ok(())
    }
}

/// The shards' scans merged so far, in shard order.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// The merged records' aggregates; `offset` is where they end.
    state: ScanState,
}

/// How a shard linked onto a [`Chain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linked {
    /// Its records are merged (or it has none: a record before it runs past its end).
    Merged,
    /// No reading starts where the merged records end: scan the records that start from
    /// `from` up to `range.end` sequentially and hand them to [`Chain::rescanned`].
    Rescan {
        /// Where the merged records end: a record boundary.
        from: u64,
        /// The shard.
        range: ShardRange,
    },
}

impl Chain {
    /// A chain of a file whose header row is `header`, ending at `header_end` (where the
    /// first shard starts).
    pub fn new(header: Vec<String>, header_end: u64) -> Chain {
        Chain {
            state: ScanState { offset: header_end, header: Some(header), ..ScanState::default() },
        }
    }

    /// A chain as saved ([`Chain::state`]).
    pub fn resume(state: ScanState) -> Chain {
        Chain { state }
    }

    /// Links the next shard on: merges the reading that starts where the merged records end.
    /// That reading's error is the file's ([`ScanError`]).
    pub fn link(&mut self, scanned: ShardScanned) -> Result<Linked, ScanError> {
        let next = self.state.offset;
        if next >= scanned.range.end {
            return Ok(Linked::Merged);
        }
        let Some(reading) = scanned.readings.into_iter().find(|r| r.first == Some(next)) else {
            return Ok(Linked::Rescan { from: next, range: scanned.range });
        };
        if let Some(error) = reading.error {
            return Err(error);
        }
        let joined = match (reading.joined, scanned.joined) {
            (false, _) => None,
            (true, Some(joined)) => Some(joined),
            // A reading that joined records its shard did not keep: read them again.
            (true, None) => return Ok(Linked::Rescan { from: next, range: scanned.range }),
        };
        if let Some(error) = joined.as_ref().and_then(|j| j.error.clone()) {
            return Err(error);
        }
        self.state.absorb(reading.own)?;
        if let Some(joined) = joined {
            self.state.absorb(joined.state)?;
        }
        Ok(Linked::Merged)
    }

    /// Merges a shard's records scanned again sequentially ([`Linked::Rescan`]).
    pub fn rescanned(&mut self, state: ScanState) -> Result<(), ScanError> {
        self.state.absorb(state)
    }

    /// The merged state (to save, or — after the last shard — the whole scan's).
    pub fn state(&self) -> &ScanState {
        &self.state
    }

    /// The whole scan's state, once every shard is linked.
    pub fn finish(self) -> ScanState {
        self.state
    }
}

/// The byte ranges of at most `max_shards` shards of about `shard_bytes` each that split
/// the data rows `[data_start, size)`: contiguous, in order, none empty.
pub fn shard_ranges(
    data_start: u64,
    size: u64,
    shard_bytes: u64,
    max_shards: usize,
) -> Vec<ShardRange> {
    let len = size.saturating_sub(data_start);
    if len == 0 {
        return Vec::new();
    }
    let shards = len.div_ceil(shard_bytes.max(1)).clamp(1, max_shards.max(1) as u64);
    let at = |i: u64| data_start + (u128::from(i) * u128::from(len) / u128::from(shards)) as u64;
    (0..shards).map(|i| ShardRange { start: at(i), end: at(i + 1) }).collect()
}
