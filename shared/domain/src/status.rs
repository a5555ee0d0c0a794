//! The job state machine as a pure function.
//!
//! `pending → queued → running → succeeded | failed | cancelled`, `succeeded → expired`,
//! `running → queued` for a retry within budget, any live state → `cancelled`; a live job may
//! be `paused` by its owner and `paused → pending` resumes it through dispatch again; a live
//! job that started stages with an undo ends `failed` or `cancelled` through `compensating`
//! (the undos run) — see [`crate::compensation`]. Terminal
//! states never change (except `succeeded → expired`). The store enforces the same rules with
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
    /// Paused by its owner: no worker runs and it holds no running slot; its last checkpoint
    /// is where `resume` continues from. Not terminal.
    Paused,
    /// Ending `failed` or `cancelled`, but first running the undos of the stages it started
    /// (its `compensation` says which, and how they went). Not terminal.
    Compensating,
}

impl JobStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [JobStatus; 9] = [
        JobStatus::Pending,
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Paused,
        JobStatus::Compensating,
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
            JobStatus::Paused => "paused",
            JobStatus::Compensating => "compensating",
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
                | (Pending | Queued | Running | Paused, Cancelled)
                // The owner pauses a live job (a running one at its stage's next progress
                // write); resuming dispatches it again.
                | (Pending | Queued | Running, Paused)
                | (Paused, Pending)
                // A job can fail before it ever runs (e.g. dispatch exhausted its retries).
                | (Pending | Queued, Failed)
                // A job that started stages with an undo, ending failed or cancelled, runs
                // those undos first (a pending one had started: it was paused and resumed).
                | (Pending | Queued | Running | Paused, Compensating)
                | (Compensating, Failed | Cancelled)
                | (Succeeded, Expired)
        )
    }

    /// Checks a move against the FSM.
    pub fn transition(self, to: JobStatus) -> Result<JobStatus, TransitionError> {
        if self.can_transition_to(to) { Ok(to) } else { Err(TransitionError { from: self, to }) }
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
    use proptest::sample::Index;

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

    /// The statuses `from` can move to.
    fn moves_from(from: JobStatus) -> Vec<JobStatus> {
        JobStatus::ALL.into_iter().filter(|to| from.can_transition_to(*to)).collect()
    }

    /// The states a job ends in: it gets there only once.
    const ENDINGS: [JobStatus; 3] = [JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled];

    /// No job gets stuck alive: from every live (non-terminal) state some terminal state is
    /// reachable through legal moves (breadth-first over `can_transition_to`).
    #[test]
    fn a_terminal_state_is_reachable_from_every_live_state() {
        for start in JobStatus::ALL.into_iter().filter(|status| !status.is_terminal()) {
            let mut seen = vec![start];
            let mut frontier = std::collections::VecDeque::from([start]);
            while let Some(status) = frontier.pop_front() {
                for to in moves_from(status) {
                    if !seen.contains(&to) {
                        seen.push(to);
                        frontier.push_back(to);
                    }
                }
            }
            assert!(
                seen.iter().any(|status| status.is_terminal()),
                "{start} can only reach {seen:?}"
            );
        }
    }

    /// Terminal states never change, except succeeded → expired (checked on every pair, and
    /// that one move is allowed).
    #[test]
    fn terminal_states_only_move_from_succeeded_to_expired() {
        for from in JobStatus::ALL.into_iter().filter(|status| status.is_terminal()) {
            for to in moves_from(from) {
                assert_eq!((from, to), (JobStatus::Succeeded, JobStatus::Expired), "{from} → {to}");
            }
        }
        assert!(JobStatus::Succeeded.can_transition_to(JobStatus::Expired));
    }

    /// Any live state can be cancelled, as the owner may cancel a job at any point before it
    /// ends.
    #[test]
    fn every_live_state_can_be_cancelled() {
        for from in JobStatus::ALL.into_iter().filter(|status| !status.is_terminal()) {
            assert!(from.can_transition_to(JobStatus::Cancelled), "{from} cannot be cancelled");
        }
    }

    /// No state moves to itself and only a resume returns to pending (checked on every pair).
    #[test]
    fn no_self_loops_and_only_a_resume_returns_to_pending() {
        for from in JobStatus::ALL {
            for to in moves_from(from) {
                assert_ne!(from, to);
                if to == JobStatus::Pending {
                    assert_eq!(from, JobStatus::Paused, "{from} → pending");
                }
            }
        }
    }

    /// A paused job neither runs nor ends on its own: it resumes (to pending) or is cancelled
    /// (compensating first if it started stages with an undo).
    #[test]
    fn a_paused_job_resumes_or_is_cancelled() {
        assert_eq!(
            moves_from(JobStatus::Paused),
            [JobStatus::Pending, JobStatus::Compensating, JobStatus::Cancelled]
        );
        assert!(!JobStatus::Paused.is_terminal());
        for from in [JobStatus::Pending, JobStatus::Queued, JobStatus::Running] {
            assert!(from.can_transition_to(JobStatus::Paused), "{from} cannot be paused");
        }
    }

    /// A compensating job only ends, failed or cancelled, as it was going to.
    #[test]
    fn a_compensating_job_only_ends_failed_or_cancelled() {
        assert_eq!(moves_from(JobStatus::Compensating), [JobStatus::Failed, JobStatus::Cancelled]);
        assert!(!JobStatus::Compensating.is_terminal());
        for from in [JobStatus::Pending, JobStatus::Queued, JobStatus::Running, JobStatus::Paused] {
            assert!(from.can_transition_to(JobStatus::Compensating), "{from}");
        }
        for from in JobStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            assert!(!from.can_transition_to(JobStatus::Compensating), "{from}");
        }
    }

    /// Whether `from → to` goes round again: the retry (running → queued) or a pause or resume
    /// (an owner's doing).
    fn goes_round(from: JobStatus, to: JobStatus) -> bool {
        (from, to) == (JobStatus::Running, JobStatus::Queued)
            || to == JobStatus::Paused
            || from == JobStatus::Paused && to == JobStatus::Pending
    }

    /// The retry edge running → queued and the owner's pause and resume are the only ways
    /// round: without them the moves form no cycle (every state drops out when states are
    /// repeatedly removed once nothing moves to them), and with the retry queued → running →
    /// queued is one.
    #[test]
    fn the_retry_and_the_pause_are_the_only_cycles() {
        let is_retry = goes_round;
        let mut left = JobStatus::ALL.to_vec();
        let entered = |left: &[JobStatus], to: JobStatus| {
            left.iter().any(|from| from.can_transition_to(to) && !is_retry(*from, to))
        };
        while let Some(i) = left.iter().position(|to| !entered(&left, *to)) {
            left.remove(i);
        }
        assert!(left.is_empty(), "{left:?} form a cycle without the retry and the pause");
        assert!(JobStatus::Queued.can_transition_to(JobStatus::Running));
        assert!(JobStatus::Running.can_transition_to(JobStatus::Queued));
    }

    proptest! {
        /// Every walk through legal moves from pending ends — runs out of moves — in a terminal
        /// state within 4 moves plus 2 per retry (pending → queued → running → succeeded →
        /// expired is the longest run, and each running → queued adds queued → running): only
        /// the retry edge can keep a job alive. The walk picks among the legal moves at random
        /// and retries at most `retries` times.
        #[test]
        fn every_walk_ends_in_a_terminal_state(retries in 0usize..5, choices in proptest::collection::vec(any::<Index>(), 64)) {
            let (mut status, mut moves, mut retried) = (JobStatus::Pending, 0usize, 0usize);
            let mut choices = choices.into_iter();
            loop {
                let next: Vec<_> = moves_from(status)
                    .into_iter()
                    .filter(|to| retried < retries || (status, *to) != (JobStatus::Running, JobStatus::Queued))
                    // A pause and its resume are the owner's: a walk of the system alone has none.
                    .filter(|to| !goes_round(status, *to) || (status, *to) == (JobStatus::Running, JobStatus::Queued))
                    .collect();
                if next.is_empty() { break; }
                let choice = choices.next().expect("a walk longer than 4 moves + 2 per retry");
                let to = next[choice.index(next.len())];
                if (status, to) == (JobStatus::Running, JobStatus::Queued) { retried += 1; }
                status = to;
                moves += 1;
            }
            prop_assert!(status.is_terminal(), "the walk stopped at {}", status);
            prop_assert!(moves <= 4 + 2 * retried, "{} moves with {} retries", moves, retried);
        }

        /// A job ends once: any walk through legal moves, from any state, enters succeeded,
        /// failed or cancelled at most once; after a terminal state only succeeded → expired
        /// follows; and a walk that comes back to a state has retried (moved running → queued)
        /// since it was last there.
        #[test]
        fn a_walk_ends_at_most_once_and_repeats_only_through_a_retry(
            start in proptest::sample::select(JobStatus::ALL.to_vec()),
            choices in proptest::collection::vec(any::<Index>(), 1..40),
        ) {
            let mut walk = vec![start];
            for choice in choices {
                let status = *walk.last().unwrap();
                let next = moves_from(status);
                if next.is_empty() { break; }
                let to = next[choice.index(next.len())];
                prop_assert!(status.transition(to).is_ok());
                if status.is_terminal() {
                    prop_assert_eq!((status, to), (JobStatus::Succeeded, JobStatus::Expired));
                }
                if let Some(last_visit) = walk.iter().rposition(|seen| *seen == to) {
                    let retried = walk[last_visit..]
                        .windows(2)
                        .chain([[status, to].as_slice()])
                        .any(|pair| goes_round(pair[0], pair[1]));
                    prop_assert!(retried, "{:?} came back to {} without a retry or a pause", walk, to);
                }
                walk.push(to);
            }
            let endings = walk.windows(2).filter(|pair| ENDINGS.contains(&pair[1])).count();
            prop_assert!(endings <= 1, "{:?} ends {} times", walk, endings);
        }
    }
}
