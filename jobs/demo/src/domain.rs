//! The `demo` job kind's domain logic: a diagnostic job that does real, checkable work.
//!
//! Each item extends a SHA-256 hash chain (`digest = sha256(digest ‖ index)`), and the job
//! waits `item_ms` per item to stand in for I/O. The final digest depends on every item being
//! processed exactly once and in order, so a test can tell a correct run from a skipped,
//! repeated or reordered one. `fail_at` / `fail_kind` / `fail_times` inject failures so the
//! retry and failure paths can be exercised end to end.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why params were refused (the message goes to the client).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// `params` do not fit the kind.
    #[error("invalid params: {0}")]
    InvalidParams(String),
}

/// Most items a demo job may have.
pub const MAX_ITEMS: u64 = 10_000_000;
/// Longest pause per item.
pub const MAX_ITEM_MS: u64 = 60_000;
/// Longest injected stall.
pub const MAX_STALL_MS: u64 = 3_600_000;
/// Most injected failures.
pub const MAX_FAIL_TIMES: u32 = 30;
/// The shards a sharded demo job may have.
pub const SHARDS: std::ops::RangeInclusive<u64> = 2..=1_000;

/// Parameters of a `demo` job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DemoParams {
    /// How many items to process (1 ..= 10,000,000).
    pub items: u64,
    /// Pause per item in milliseconds (0 ..= 60,000).
    #[serde(default)]
    pub item_ms: u64,
    /// The item index at which to inject a failure.
    #[serde(default)]
    pub fail_at: Option<u64>,
    /// The kind of injected failure (default `transient`).
    #[serde(default)]
    pub fail_kind: Option<FailKind>,
    /// How many times the injected failure happens before the item succeeds (default 1).
    #[serde(default)]
    pub fail_times: Option<u32>,
    /// The item index at which the job stalls: it keeps heartbeating but stops advancing
    /// for `stall_ms` (to exercise stalled-progress detection).
    #[serde(default)]
    pub stall_at: Option<u64>,
    /// How long the stall lasts (milliseconds, at most one hour).
    #[serde(default)]
    pub stall_ms: Option<u64>,
    /// Wait for a signal before an item: the job parks `paused` (costing nothing) until the
    /// signal comes, and its payload goes into the result's `signals`; a wait that times out
    /// fails the job, saying so.
    #[serde(default)]
    pub wait_for: Option<WaitFor>,
    /// Give `process` an undo: a job that ends `failed` or `cancelled` after it started
    /// compensates first, its undo shown in the job's `compensation.stages`.
    #[serde(default)]
    pub compensate: bool,
    /// Make that undo fail (retryably) every time: retried with the job's backoff, then given
    /// up, the compensation ending `failed` (needs `compensate`).
    #[serde(default)]
    pub compensate_fails: bool,
    /// Fan `process` out into this many shards (2 ..= 1,000): shard `i` runs the chain over
    /// items `[i·items/shards, (i+1)·items/shards)`, from the initial digest, with its own
    /// checkpoint; the result's digest is the SHA-256 of the shards' digests (hex, in shard
    /// order). Absent: one worker runs every item.
    #[serde(default)]
    pub shards: Option<u64>,
}

/// The items one shard of a sharded demo job runs: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemRange {
    /// The first item.
    pub start: u64,
    /// One past the last item.
    pub end: u64,
}

/// A demo job's wait for a signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitFor {
    /// The signal's name (1–64 ASCII letters, digits, `.`, `_`, `-`).
    pub signal: String,
    /// The item index before which the job waits (below `items`).
    pub at_item: u64,
    /// How long it waits at most (1 second to 29 days).
    pub timeout_seconds: u64,
}

/// An injected failure's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailKind {
    /// Retryable: the state machine retries the stage.
    Transient,
    /// Not retryable: the job fails at once.
    Fatal,
}

impl DemoParams {
    /// A plain run over `items` items: no pauses, failures, stalls, waits or shards.
    pub fn new(items: u64) -> Self {
        DemoParams {
            items,
            item_ms: 0,
            fail_at: None,
            fail_kind: None,
            fail_times: None,
            stall_at: None,
            stall_ms: None,
            wait_for: None,
            compensate: false,
            compensate_fails: false,
            shards: None,
        }
    }

    /// Checks the ranges serde cannot express.
    pub fn validate(&self) -> Result<(), SpecError> {
        let invalid = |msg: String| Err(SpecError::InvalidParams(msg));
        if self.items == 0 || self.items > MAX_ITEMS {
            return invalid(format!("items must be between 1 and {MAX_ITEMS}"));
        }
        if self.compensate_fails && !self.compensate {
            return invalid("compensate_fails needs compensate".into());
        }
        if self.item_ms > MAX_ITEM_MS {
            return invalid(format!("item_ms must be at most {MAX_ITEM_MS}"));
        }
        match self.fail_at {
            Some(at) if at >= self.items => {
                return invalid("fail_at must be an item index below items".into());
            }
            None if self.fail_kind.is_some() || self.fail_times.is_some() => {
                return invalid("fail_kind and fail_times need fail_at".into());
            }
            _ => {}
        }
        match (self.stall_at, self.stall_ms) {
            (Some(at), Some(ms)) if at < self.items && ms <= MAX_STALL_MS => {}
            (None, None) => {}
            _ => {
                return invalid(format!(
                    "stall_at (below items) and stall_ms (at most {MAX_STALL_MS}) go together"
                ));
            }
        }
        if let Some(times) = self.fail_times
            && !(1..=MAX_FAIL_TIMES).contains(&times)
        {
            return invalid(format!("fail_times must be between 1 and {MAX_FAIL_TIMES}"));
        }
        if let Some(shards) = self.shards {
            if !SHARDS.contains(&shards) {
                return invalid(format!(
                    "shards must be between {} and {}",
                    SHARDS.start(),
                    SHARDS.end()
                ));
            }
            if self.wait_for.is_some() {
                return invalid(
                    "wait_for cannot be combined with shards (a shard never waits)".into(),
                );
            }
        }
        if let Some(wait) = &self.wait_for {
            if !longhaul_worker::is_signal_name(&wait.signal) {
                return invalid(
                    "wait_for.signal must be 1 to 64 ASCII letters, digits, '.', '_' or '-'".into(),
                );
            }
            if wait.at_item >= self.items {
                return invalid("wait_for.at_item must be an item index below items".into());
            }
            let max = longhaul_worker::MAX_WAIT.as_secs();
            if !(1..=max).contains(&wait.timeout_seconds) {
                return invalid(format!("wait_for.timeout_seconds must be between 1 and {max}"));
            }
        }
        Ok(())
    }

    /// The items shard `index` of a sharded job runs (see [`DemoParams::shards`]).
    pub fn shard_range(&self, index: u64) -> ItemRange {
        let shards = u128::from(self.shards.unwrap_or(1).max(1));
        let at = |i: u64| (u128::from(i) * u128::from(self.items) / shards) as u64;
        ItemRange { start: at(index), end: at(index + 1) }
    }

    /// The failure to inject before processing `item`, given how many were injected already.
    pub fn injected_failure(&self, item: u64, injected_so_far: u32) -> Option<FailKind> {
        if self.fail_at != Some(item) {
            return None;
        }
        let kind = self.fail_kind.unwrap_or(FailKind::Transient);
        let times = self.fail_times.unwrap_or(1);
        (kind == FailKind::Fatal || injected_so_far < times).then_some(kind)
    }
}

/// Where a demo run is: the next item and the hash chain so far, and the signals it received.
/// This is the checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoState {
    /// Index of the next item to process.
    pub next_item: u64,
    /// Hex SHA-256 chain over the items processed so far.
    pub digest: String,
    /// The signals received, by name (their payloads).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub signals: std::collections::BTreeMap<String, serde_json::Value>,
}

impl Default for DemoState {
    fn default() -> Self {
        DemoState { next_item: 0, digest: hex::encode([0u8; 32]), signals: Default::default() }
    }
}

impl DemoState {
    /// A chain from the initial digest whose next item is `item` (a shard's start).
    pub fn starting_at(item: u64) -> Self {
        DemoState { next_item: item, ..DemoState::default() }
    }

    /// Processes the next item.
    pub fn process_next(&mut self) {
        let mut hasher = Sha256::new();
        hasher.update(self.digest.as_bytes());
        hasher.update(self.next_item.to_be_bytes());
        self.digest = hex::encode(hasher.finalize());
        self.next_item += 1;
    }
}

/// The result object of a demo job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoResult {
    /// Items processed.
    pub items: u64,
    /// The shards `process` fanned out into (absent: it did not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u64>,
    /// Final hash chain digest (of a sharded job: the digest of its shards' digests).
    pub digest: String,
    /// The signals the job received, by name (their payloads).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub signals: std::collections::BTreeMap<String, serde_json::Value>,
}

impl DemoResult {
    /// What a correct run over `items` items produces, computed directly.
    pub fn expected(items: u64) -> DemoResult {
        let mut state = DemoState::default();
        for _ in 0..items {
            state.process_next();
        }
        DemoResult { items, shards: None, digest: state.digest, signals: Default::default() }
    }

    /// What a correct run over `items` items fanned out into `shards` produces, computed
    /// directly.
    pub fn expected_sharded(items: u64, shards: u64) -> DemoResult {
        let params = DemoParams { shards: Some(shards), ..DemoParams::new(items) };
        let digests: Vec<String> = (0..shards)
            .map(|i| {
                let range = params.shard_range(i);
                let mut state = DemoState::starting_at(range.start);
                while state.next_item < range.end {
                    state.process_next();
                }
                state.digest
            })
            .collect();
        DemoResult {
            items,
            shards: Some(shards),
            digest: merged_digest(&digests),
            signals: Default::default(),
        }
    }
}

/// A sharded job's digest: the SHA-256 of its shards' digests (hex strings), in shard order.
pub fn merged_digest(shard_digests: &[String]) -> String {
    let mut hasher = Sha256::new();
    for digest in shard_digests {
        hasher.update(digest.as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(json: serde_json::Value) -> DemoParams {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn validation() {
        assert!(params(serde_json::json!({"items": 1})).validate().is_ok());
        assert!(params(serde_json::json!({"items": 0})).validate().is_err());
        assert!(params(serde_json::json!({"items": 3, "fail_at": 3})).validate().is_err());
        assert!(params(serde_json::json!({"items": 3, "fail_kind": "fatal"})).validate().is_err());
        assert!(
            params(serde_json::json!({"items": 3, "fail_at": 1, "fail_times": 0}))
                .validate()
                .is_err()
        );
        assert!(params(serde_json::json!({"items": 3, "item_ms": 60001})).validate().is_err());
        assert!(
            params(serde_json::json!({"items": 3, "stall_at": 1, "stall_ms": 10}))
                .validate()
                .is_ok()
        );
        assert!(params(serde_json::json!({"items": 3, "stall_at": 1})).validate().is_err());
        assert!(
            params(serde_json::json!({"items": 3, "stall_at": 3, "stall_ms": 10}))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn injected_failures_stop_after_fail_times_unless_fatal() {
        let transient = params(serde_json::json!({"items": 5, "fail_at": 2, "fail_times": 2}));
        assert_eq!(transient.injected_failure(1, 0), None);
        assert_eq!(transient.injected_failure(2, 0), Some(FailKind::Transient));
        assert_eq!(transient.injected_failure(2, 1), Some(FailKind::Transient));
        assert_eq!(transient.injected_failure(2, 2), None);
        let fatal = params(serde_json::json!({"items": 5, "fail_at": 0, "fail_kind": "fatal"}));
        assert_eq!(fatal.injected_failure(0, 7), Some(FailKind::Fatal));
    }

    #[test]
    fn the_chain_depends_on_every_item() {
        assert_ne!(DemoResult::expected(3).digest, DemoResult::expected(4).digest);
        let mut resumed = DemoState::default();
        resumed.process_next();
        let checkpoint = serde_json::to_string(&resumed).unwrap();
        let mut resumed: DemoState = serde_json::from_str(&checkpoint).unwrap();
        resumed.process_next();
        resumed.process_next();
        assert_eq!(resumed.digest, DemoResult::expected(3).digest);
    }
}
