//! The bookkeeping of a stream mapping on one shard, without I/O: which records are done,
//! which batch to invoke next, and what a failed invocation means (retry, bisect, give up).
//!
//! It follows Lambda's stream event source mappings:
//! * records are handled in order; a record the filters dropped is done as soon as every
//!   record before it is;
//! * a batch is the next `BatchSize` records (fewer after a bisection);
//! * a success finishes the batch. With `ReportBatchItemFailures`, the failure with the
//!   lowest sequence number is the checkpoint: the records before it are done and the batch is
//!   retried from it (only the batch's remainder when bisecting, as AWS does); an invalid
//!   identifier (null, empty, not in the batch) fails the whole batch;
//! * a failed invocation retries the same batch, or with `BisectBatchOnFunctionError` splits
//!   it in two halves, each retried as a batch of its own with a fresh retry count;
//! * after `MaximumRetryAttempts` failed retries of a batch the caller sends it to the
//!   on-failure destination and moves past it ([`Shard::give_up`]).
//!
//! A retry that starts at a later record than the failed invocation (partial progress)
//! restarts the count, like a bisected half: the count is always the number of consecutive
//! failures of the record at the head of the batch, so every record is tried at least
//! `MaximumRetryAttempts + 1` times before it is given up.

use std::collections::VecDeque;

use serde_json::Value;

/// How a mapping treats failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Most records per invocation.
    pub batch_size: usize,
    /// Retries of a failing batch before giving it up (`None`: forever).
    pub maximum_retry_attempts: Option<u32>,
    /// Split a batch in two when an invocation fails.
    pub bisect: bool,
}

/// What an invocation of the current batch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The function succeeded (and reported no failures, or the mapping ignores reports).
    Success,
    /// The function succeeded and reported these `itemIdentifier`s as failed.
    ItemFailures(Vec<Option<String>>),
    /// The invocation failed: a function error, a timeout, a crash.
    FunctionError,
}

/// What to do after an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The batch is done; go on.
    Done,
    /// Invoke the (new) current batch again.
    Retry {
        /// Failed invocations of the current batch's first record so far.
        attempts: u32,
        /// Whether the failed batch was split in two.
        bisected: bool,
    },
    /// Retries are exhausted: send the current batch to the on-failure destination, then
    /// [`Shard::give_up`] on it.
    Exhausted,
}

#[derive(Debug, Clone)]
struct Entry {
    sequence: String,
    /// The record's event form; `None` when the filters dropped it.
    event: Option<Value>,
}

/// One shard's records from the checkpoint on.
#[derive(Debug, Clone)]
pub struct Shard {
    policy: Policy,
    /// Everything up to this sequence number is done (delivered, filtered out or given up).
    done: Option<String>,
    /// Records read and not done, in order; never starts with a filtered-out one.
    unfinished: VecDeque<Entry>,
    /// How many of `unfinished` passed the filters.
    passing: usize,
    /// Sizes of the next batches after bisections, first batch first.
    splits: VecDeque<usize>,
    /// Consecutive failed invocations of the current batch's first record.
    attempts: u32,
}

impl Shard {
    /// A shard whose records up to `done` (if any) are done.
    pub fn new(policy: Policy, done: Option<String>) -> Shard {
        Shard {
            policy: Policy { batch_size: policy.batch_size.max(1), ..policy },
            done,
            unfinished: VecDeque::new(),
            passing: 0,
            splits: VecDeque::new(),
            attempts: 0,
        }
    }

    /// The checkpoint: the last sequence number such that it and every record before it are done.
    pub fn done(&self) -> Option<&str> {
        self.done.as_deref()
    }

    /// Consecutive failed invocations of the current batch's first record.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Adds the next record read from the shard: its event form, or `None` if the filters
    /// dropped it.
    pub fn push(&mut self, sequence: String, event: Option<Value>) {
        if event.is_none() && self.unfinished.is_empty() {
            self.done = Some(sequence);
            return;
        }
        self.passing += usize::from(event.is_some());
        self.unfinished.push_back(Entry { sequence, event });
    }

    /// Whether fewer records than a full batch are waiting.
    pub fn wants_more(&self) -> bool {
        self.passing < self.policy.batch_size
    }

    fn batch_len(&self) -> usize {
        self.splits
            .front()
            .copied()
            .unwrap_or(self.policy.batch_size)
            .min(self.policy.batch_size)
            .min(self.passing)
    }

    /// The batch to invoke next: (sequence number, event record) in order; empty when no
    /// record is waiting.
    pub fn batch(&self) -> Vec<(&str, &Value)> {
        self.unfinished
            .iter()
            .filter_map(|e| e.event.as_ref().map(|event| (e.sequence.as_str(), event)))
            .take(self.batch_len())
            .collect()
    }

    /// Marks the first `n` waiting records done, with the filtered-out ones among and right
    /// after them.
    fn finish(&mut self, n: usize) {
        let mut finished = 0;
        while let Some(entry) = self.unfinished.front() {
            if entry.event.is_some() {
                if finished == n {
                    break;
                }
                finished += 1;
                self.passing -= 1;
            }
            if let Some(entry) = self.unfinished.pop_front() {
                self.done = Some(entry.sequence);
            }
        }
    }

    /// Records what the invocation of the current batch came to.
    pub fn outcome(&mut self, outcome: Outcome) -> Next {
        let size = self.batch_len();
        let first_failed = match outcome {
            Outcome::Success => None,
            Outcome::ItemFailures(ids) => {
                let batch = self.batch();
                let positions: Option<Vec<usize>> = ids
                    .iter()
                    .map(|id| {
                        let id = id.as_deref().filter(|id| !id.is_empty())?;
                        batch.iter().position(|(sequence, _)| *sequence == id)
                    })
                    .collect();
                match positions {
                    // An invalid identifier: Lambda treats the batch as a complete failure.
                    None => Some(None),
                    Some(positions) => positions.into_iter().min().map(Some),
                }
            }
            Outcome::FunctionError => Some(None),
        };
        match first_failed {
            None => {
                self.give_up();
                return Next::Done;
            }
            // The records before the lowest reported failure are done; retry from it.
            Some(Some(k)) if k > 0 => {
                self.finish(k);
                match self.splits.front_mut() {
                    Some(front) => *front -= k,
                    None if self.policy.bisect => self.splits.push_front(size - k),
                    None => {}
                }
                self.attempts = 1;
            }
            Some(Some(_)) => self.attempts += 1,
            Some(None) if self.policy.bisect && size > 1 => {
                let first = size.div_ceil(2);
                self.splits.pop_front();
                self.splits.push_front(size - first);
                self.splits.push_front(first);
                self.attempts = 0;
                return Next::Retry { attempts: 0, bisected: true };
            }
            Some(None) => {
                // Retried as exactly the batch that failed, even if more records arrived since.
                if self.splits.is_empty() {
                    self.splits.push_front(size);
                }
                self.attempts += 1;
            }
        }
        if self.policy.maximum_retry_attempts.is_some_and(|max| self.attempts > max) {
            Next::Exhausted
        } else {
            Next::Retry { attempts: self.attempts, bisected: false }
        }
    }

    /// Moves past the current batch (after a success, or once it went to the on-failure
    /// destination).
    pub fn give_up(&mut self) {
        let size = self.batch_len();
        self.finish(size);
        self.splits.pop_front();
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(batch_size: usize, maximum_retry_attempts: Option<u32>, bisect: bool) -> Policy {
        Policy { batch_size, maximum_retry_attempts, bisect }
    }

    /// A shard holding records 1..=n (sequence numbers "1"…), those in `dropped` filtered out.
    fn shard(policy: Policy, n: u32, dropped: &[u32]) -> Shard {
        let mut shard = Shard::new(policy, None);
        for i in 1..=n {
            shard.push(i.to_string(), (!dropped.contains(&i)).then(|| json!({ "seq": i })));
        }
        shard
    }

    fn sequences(shard: &Shard) -> Vec<String> {
        shard.batch().iter().map(|(s, _)| s.to_string()).collect()
    }

    fn ids(ids: &[&str]) -> Outcome {
        Outcome::ItemFailures(ids.iter().map(|s| Some(s.to_string())).collect())
    }

    #[test]
    fn filtered_records_are_done_once_everything_before_them_is() {
        let mut s = shard(policy(2, None, false), 0, &[]);
        s.push("1".into(), None);
        s.push("2".into(), None);
        assert_eq!(
            (s.done(), s.batch().len()),
            (Some("2"), 0),
            "nothing waits: dropped records are done at once"
        );
        s.push("3".into(), Some(json!(3)));
        s.push("4".into(), None);
        s.push("5".into(), Some(json!(5)));
        s.push("6".into(), None);
        s.push("7".into(), Some(json!(7)));
        assert_eq!(sequences(&s), ["3", "5"]);
        assert_eq!(s.done(), Some("2"), "a dropped record behind a waiting one is not done yet");
        assert_eq!(s.outcome(Outcome::Success), Next::Done);
        assert_eq!((s.done(), sequences(&s)), (Some("6"), vec!["7".to_string()]));
        assert_eq!(s.outcome(Outcome::Success), Next::Done);
        assert_eq!((s.done(), s.batch().len()), (Some("7"), 0));
    }

    #[test]
    fn batches_hold_at_most_batch_size_records_and_reading_stops_at_a_full_batch() {
        let mut s = shard(policy(3, None, false), 2, &[]);
        assert!(s.wants_more());
        s.push("3".into(), Some(json!(3)));
        s.push("4".into(), Some(json!(4)));
        assert!(!s.wants_more());
        assert_eq!(sequences(&s), ["1", "2", "3"]);
    }

    #[test]
    fn a_partial_failure_finishes_the_records_before_the_lowest_one_and_retries_from_it() {
        let mut s = shard(policy(3, Some(10), false), 5, &[]);
        assert_eq!(s.outcome(ids(&["3", "2"])), Next::Retry { attempts: 1, bisected: false });
        assert_eq!(s.done(), Some("1"));
        assert_eq!(
            sequences(&s),
            ["2", "3", "4"],
            "without bisecting, the retry is a full batch from the checkpoint"
        );
        assert_eq!(
            s.outcome(ids(&["2"])),
            Next::Retry { attempts: 2, bisected: false },
            "no progress: the count goes on"
        );
        assert_eq!(
            s.outcome(Outcome::ItemFailures(vec![])),
            Next::Done,
            "an empty list is a success"
        );
        assert_eq!(s.done(), Some("4"));
    }

    #[test]
    fn bisecting_a_partial_failure_retries_only_the_remainder() {
        let mut s = shard(policy(3, Some(10), true), 5, &[]);
        assert_eq!(s.outcome(ids(&["2"])), Next::Retry { attempts: 1, bisected: false });
        assert_eq!(sequences(&s), ["2", "3"]);
        assert_eq!(s.outcome(Outcome::Success), Next::Done);
        assert_eq!(sequences(&s), ["4", "5"]);
    }

    #[test]
    fn an_invalid_identifier_fails_the_whole_batch() {
        for bad in [Outcome::ItemFailures(vec![None]), ids(&[""]), ids(&["99"])] {
            let mut s = shard(policy(3, Some(10), false), 3, &[]);
            assert_eq!(s.outcome(bad), Next::Retry { attempts: 1, bisected: false });
            assert_eq!((s.done(), sequences(&s).len()), (None, 3));
        }
    }

    #[test]
    fn a_function_error_bisects_down_to_the_poison_record_then_retries_it_until_exhausted() {
        let mut s = shard(policy(4, Some(2), true), 4, &[]);
        // Record 3 is poison: any batch holding it fails.
        let mut invocations = 0;
        let mut dead = Vec::new();
        while !s.batch().is_empty() {
            invocations += 1;
            let batch = sequences(&s);
            let outcome = if batch.contains(&"3".to_string()) {
                Outcome::FunctionError
            } else {
                Outcome::Success
            };
            match s.outcome(outcome) {
                Next::Exhausted => {
                    dead.push(sequences(&s));
                    s.give_up();
                }
                Next::Retry { bisected: true, attempts } => assert_eq!(attempts, 0),
                _ => {}
            }
        }
        // [1 2 3 4] → [1 2] ok, [3 4] fails → [3] fails 3 times (1 + 2 retries) → [4] ok.
        assert_eq!(dead, vec![vec!["3".to_string()]]);
        assert_eq!(invocations, 1 + 1 + 1 + 3 + 1);
        assert_eq!(s.done(), Some("4"));
    }

    #[test]
    fn without_bisecting_a_failing_batch_is_retried_whole_then_given_up_whole() {
        let mut s = shard(policy(3, Some(1), false), 3, &[2]);
        assert_eq!(sequences(&s), ["1", "3"]);
        assert_eq!(s.outcome(Outcome::FunctionError), Next::Retry { attempts: 1, bisected: false });
        s.push("4".into(), Some(json!(4)));
        assert_eq!(
            sequences(&s),
            ["1", "3"],
            "the retry is the same batch, not one grown by new records"
        );
        assert_eq!(s.outcome(Outcome::FunctionError), Next::Exhausted);
        assert_eq!(sequences(&s), ["1", "3"], "the batch to dead-letter");
        assert_eq!(s.done(), None, "nothing is done before it is dead-lettered");
        s.give_up();
        assert_eq!((s.done(), sequences(&s), s.attempts()), (Some("3"), vec!["4".to_string()], 0));
    }

    #[test]
    fn retrying_forever_never_exhausts() {
        let mut s = shard(policy(1, None, true), 1, &[]);
        for attempt in 1..=1000 {
            assert_eq!(
                s.outcome(Outcome::FunctionError),
                Next::Retry { attempts: attempt, bisected: false }
            );
        }
    }

    #[test]
    fn zero_retries_gives_up_a_partial_failure_at_once() {
        let mut s = shard(policy(3, Some(0), false), 3, &[]);
        assert_eq!(s.outcome(ids(&["2"])), Next::Exhausted);
        assert_eq!((s.done(), sequences(&s)), (Some("1"), vec!["2".to_string(), "3".to_string()]));
    }

    #[test]
    fn a_checkpoint_is_where_a_new_shard_starts() {
        let s = Shard::new(policy(10, None, false), Some("41".into()));
        assert_eq!(s.done(), Some("41"));
    }
}
