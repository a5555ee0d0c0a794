//! Retries across attempts: which failures earn a job another attempt, and when it starts.
//!
//! Within an attempt the state machine retries a retryable error a few times, seconds apart
//! (its `Retry`). A failure that outlasts those ends the *attempt*, not the job: the job goes
//! back to `queued` with a `retry_at` and starts its next attempt (from its checkpoint) after
//! an exponential backoff with full jitter, until its policy's `max_attempts` are spent. What
//! retrying cannot fix — a job kind's fatal error, a deterministic state-machine error — ends
//! the job at once. Temporal's activity retry policy and River's `retryable` state are the
//! models: waiting costs nothing (no execution, no Lambda), and the wait can be cancelled.

use std::time::Duration;

use crate::ErrorCode;

/// Whether a failure is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// Transient (throttling, a 5xx, a timeout, a crashed invocation): try again later.
    Retryable,
    /// Retrying cannot help (bad input, access denied, a kind's fatal error): fail now.
    Final,
}

/// Step Functions' own errors that are deterministic: the same input fails the same way.
const DETERMINISTIC_STATES_ERRORS: [&str; 6] = [
    "States.Runtime",
    "States.DataLimitExceeded",
    "States.Permissions",
    "States.ResultPathMatchFailure",
    "States.ParameterPathFailure",
    "States.IntrinsicFailure",
];

/// Classifies the error name the state machine caught (`$.error.Error`).
///
/// Our own `Job.*` names say what they are: `Job.Retryable` and `Job.StageTimeout` (a stage
/// that ran past its stage timeout: the next attempt starts the stage's clock afresh, from its
/// checkpoint) are transient, the others final. Anything else comes from the infrastructure —
/// Lambda's (`Lambda.ServiceException`, a throttle), a timeout (`States.Timeout`,
/// `Sandbox.Timedout`), a crashed invocation (a panic reports its type name) — and is transient
/// unless it is one of Step Functions' deterministic errors.
pub fn classify(error_name: &str) -> FailureClass {
    match ErrorCode::parse(error_name) {
        Some(ErrorCode::Retryable | ErrorCode::StageTimeout) => FailureClass::Retryable,
        Some(_) => FailureClass::Final,
        None if ErrorCode::is_ours(error_name)
            || DETERMINISTIC_STATES_ERRORS.contains(&error_name) =>
        {
            FailureClass::Final
        }
        None => FailureClass::Retryable,
    }
}

/// The wait before each further attempt, in units of the base delay: 1, 5, 15, 60, then 60
/// again (the cap) for every attempt after. With the default base of a minute: 1, 5, 15 and
/// 60 minutes.
pub const STEPS: [u32; 4] = [1, 5, 15, 60];

/// The backoff schedule across attempts (`LONGHAUL_RETRY_BASE_DELAY_SECONDS`, default 60).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// One step of [`STEPS`].
    pub base: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: Duration::from_secs(60) }
    }
}

impl Backoff {
    /// The longest wait after the `failed_attempt`-th attempt (1-based) failed.
    pub fn ceiling(&self, failed_attempt: u32) -> Duration {
        let step = failed_attempt.saturating_sub(1) as usize;
        let units = STEPS[step.min(STEPS.len() - 1)];
        self.base.saturating_mul(units)
    }

    /// The wait after the `failed_attempt`-th attempt failed, with full jitter: `unit` (drawn
    /// uniformly from `[0, 1)`) of the ceiling, so that jobs failed by one outage do not all
    /// come back at the same moment.
    pub fn delay(&self, failed_attempt: u32, unit: f64) -> Duration {
        self.ceiling(failed_attempt).mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// Whether a job whose `attempt`-th attempt (1-based) failed with `class` gets another attempt
/// within its budget of `max_attempts`.
pub fn retries(class: FailureClass, attempt: u32, max_attempts: u32) -> bool {
    class == FailureClass::Retryable && attempt < max_attempts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_transient_errors_are_retried() {
        for name in [
            "Job.Retryable",
            "Job.StageTimeout",
            "States.Timeout",
            "Lambda.ServiceException",
            "&str",
        ] {
            assert_eq!(classify(name), FailureClass::Retryable, "{name}");
        }
        for name in ["Job.Fatal", "Job.Cancelled", "Job.Timeout", "Job.Unknown", "States.Runtime"] {
            assert_eq!(classify(name), FailureClass::Final, "{name}");
        }
    }

    #[test]
    fn the_default_schedule_is_1_5_15_60_minutes_then_capped() {
        let minutes: Vec<u64> =
            (1..=6).map(|n| Backoff::default().ceiling(n).as_secs() / 60).collect();
        assert_eq!(minutes, [1, 5, 15, 60, 60, 60]);
    }

    #[test]
    fn the_budget_counts_attempts() {
        assert!(retries(FailureClass::Retryable, 1, 3));
        assert!(retries(FailureClass::Retryable, 2, 3));
        assert!(!retries(FailureClass::Retryable, 3, 3));
        assert!(!retries(FailureClass::Final, 1, 3));
    }

    proptest! {
        #[test]
        fn jitter_stays_within_the_ceiling_which_never_shrinks(
            base in 0u64..100_000, attempt in 0u32..1_000, unit in -1.0f64..2.0,
        ) {
            let backoff = Backoff { base: Duration::from_secs(base) };
            prop_assert!(backoff.delay(attempt, unit) <= backoff.ceiling(attempt));
            prop_assert!(backoff.ceiling(attempt) <= backoff.ceiling(attempt + 1));
            prop_assert!(backoff.ceiling(attempt) <= backoff.base * 60);
        }
    }
}
