//! The job state machine as a pure function.
//!
//! `pending → queued → running → succeeded | failed | cancelled`, `succeeded → expired`,
//! `running → queued` for a retry within budget, any live state → `cancelled`. Terminal states
//! never change (except `succeeded → expired`). The store enforces the same rules with
//! conditional writes; this module is the single source of which moves are legal.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a job is in its life. Serialised in lower case, as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Accepted and stored; not yet handed to the orchestrator.
    Pending,
    /// An execution has been started (or is being started) for the job.
    Queued,
    /// A stage holds the lease and is working.
    Running,
    /// The result is durable in S3.
    Succeeded,
    /// Ended with an error; `error` says why.
    Failed,
    /// Cancelled by its owner.
    Cancelled,
    /// Succeeded, but the result has passed its retention and was deleted.
    Expired,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 7] = [
        JobStatus::Pending,
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Cancelled,
        JobStatus::Expired,
    ];

    /// The lower-case name used in the API and in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Expired => "expired",
        }
    }

    /// A terminal job no longer changes, except `succeeded → expired`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled | JobStatus::Expired
        )
    }

    /// Whether the FSM allows `self → to`.
    pub fn can_transition_to(self, to: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, to),
            (Pending, Queued)
                | (Queued, Running)
                | (Running, Succeeded)
                | (Running, Failed)
                | (Running, Queued)
                | (Pending | Queued | Running, Cancelled)
                // A job can fail before it ever runs (e.g. dispatch exhausted its retries).
                | (Pending | Queued, Failed)
                | (Succeeded, Expired)
        )
    }

    /// Checks a move against the FSM.
    pub fn transition(self, to: JobStatus) -> Result<JobStatus, TransitionError> {
        if self.can_transition_to(to) {
            Ok(to)
        } else {
            Err(TransitionError { from: self, to })
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// A status name that is not one of ours.
#[derive(Debug, thiserror::Error)]
#[error("unknown job status {0:?}")]
pub struct UnknownStatus(pub String);

/// An illegal move in the job state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {from} job cannot become {to}")]
pub struct TransitionError {
    /// The status the job is in.
    pub from: JobStatus,
    /// The status that was asked for.
    pub to: JobStatus,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn happy_path_is_legal() {
        let path = [
            JobStatus::Pending,
            JobStatus::Queued,
            JobStatus::Running,
            JobStatus::Succeeded,
            JobStatus::Expired,
        ];
        for pair in path.windows(2) {
            assert!(pair[0].can_transition_to(pair[1]), "{} → {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn names_round_trip() {
        for status in JobStatus::ALL {
            assert_eq!(status.as_str().parse::<JobStatus>().unwrap(), status);
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
        }
        assert!("RUNNING".parse::<JobStatus>().is_err());
    }

    fn any_status() -> impl Strategy<Value = JobStatus> {
        proptest::sample::select(JobStatus::ALL.to_vec())
    }

    proptest! {
        /// Terminal states never change, except succeeded → expired.
        #[test]
        fn terminal_states_are_final(from in any_status(), to in any_status()) {
            if from.is_terminal() && from.can_transition_to(to) {
                prop_assert_eq!((from, to), (JobStatus::Succeeded, JobStatus::Expired));
            }
        }

        /// No state moves to itself and nothing returns to pending.
        #[test]
        fn no_self_loops_or_return_to_pending(from in any_status(), to in any_status()) {
            if from.can_transition_to(to) {
                prop_assert_ne!(from, to);
                prop_assert_ne!(to, JobStatus::Pending);
            }
        }

        /// Any walk through legal moves from pending reaches a terminal state within a bounded
        /// number of moves unless it loops through running → queued, the retry edge.
        #[test]
        fn walks_only_loop_through_retry(choices in proptest::collection::vec(0usize..7, 1..40)) {
            let mut status = JobStatus::Pending;
            for choice in choices {
                let next: Vec<_> = JobStatus::ALL.into_iter().filter(|to| status.can_transition_to(*to)).collect();
                if next.is_empty() { prop_assert!(status.is_terminal()); break; }
                let to = next[choice % next.len()];
                prop_assert!(status.transition(to).is_ok());
                if to == JobStatus::Queued { prop_assert!(matches!(status, JobStatus::Pending | JobStatus::Running)); }
                status = to;
            }
        }
    }
}
