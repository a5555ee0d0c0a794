//! Compensation (the saga pattern): when a job ends `failed` or `cancelled` after stages with
//! an undo started, the framework runs those undos in reverse order before the job ends.
//!
//! The job is `compensating` meanwhile and carries a [`Compensation`]: how it ends once the
//! undos are done ([`Ending`]), and one [`UndoStep`] per stage to undo, latest stage first.
//! Each step is retried with the job's backoff within its attempts ([`Compensation::attempts`])
//! and then given up (`failed`), the others still run: a compensation always ends, `done` when
//! every undo succeeded, `failed` when one was given up.

use serde::{Deserialize, Serialize};

use crate::{JobError, JobStatus, Timestamp};

/// How a compensation is going: `running` while the job is `compensating`, then `done` or
/// `failed` on the ended job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompensationStatus {
    /// Undos remain.
    Running,
    /// Every undo succeeded.
    Done,
    /// At least one undo was given up (its retries exhausted, or it failed fatally).
    Failed,
}

/// One stage's undo, as far as it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UndoStatus {
    /// Not run yet.
    Pending,
    /// Being run (an attempt is counted before it runs, so one that crashes counts too).
    Running,
    /// Failed and waits for its next attempt (`retry_at`).
    Retrying,
    /// Succeeded.
    Done,
    /// Given up.
    Failed,
}

impl UndoStatus {
    /// Whether the step is over (done or given up).
    pub fn is_settled(self) -> bool {
        matches!(self, UndoStatus::Done | UndoStatus::Failed)
    }
}

/// The terminal status a compensating job moves to, and why: what it would have ended as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ending {
    /// `failed` or `cancelled`.
    pub status: JobStatus,
    /// The reason for the transition log.
    pub reason: String,
    /// A failed job's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
}

/// One stage's undo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndoStep {
    /// The stage undone.
    pub stage: String,
    /// How far it went.
    pub status: UndoStatus,
    /// When it last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// Attempts begun.
    #[serde(default)]
    pub attempts: u32,
    /// When its next attempt starts (`retrying`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// Why its last attempt failed (the message written for the owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A job's compensation: stored on the job while it is `compensating` and kept after it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compensation {
    /// How it is going.
    pub status: CompensationStatus,
    /// What the job ends as afterwards.
    pub ending: Ending,
    /// When it began.
    pub started_at: Timestamp,
    /// Whether `stages` was planned yet (the worker plans it from the stages the job started).
    #[serde(default)]
    pub planned: bool,
    /// The undos, in the order they run (the latest stage first).
    #[serde(default)]
    pub stages: Vec<UndoStep>,
    /// Bumped by every write of it while the job compensates: each write is conditional on the
    /// revision it read, so of two invocations compensating the same job (a duplicate message,
    /// the reaper's backup) only one goes on.
    #[serde(default)]
    pub revision: u64,
}

impl Compensation {
    /// A compensation about to begin, its undos not yet planned.
    pub fn begin(ending: Ending, now: Timestamp) -> Self {
        Compensation {
            status: CompensationStatus::Running,
            ending,
            started_at: now,
            planned: false,
            stages: Vec::new(),
            revision: 0,
        }
    }

    /// Plans the undos of `started` (the stages the job started, in order) that are in
    /// `undoable`: the latest first.
    pub fn plan(&mut self, started: &[&str], undoable: &[String]) {
        self.stages = started
            .iter()
            .rev()
            .filter(|stage| undoable.iter().any(|u| u == *stage))
            .map(|stage| UndoStep {
                stage: (*stage).to_owned(),
                status: UndoStatus::Pending,
                at: None,
                attempts: 0,
                retry_at: None,
                error: None,
            })
            .collect();
        self.planned = true;
    }

    /// The index of the next step to run, if any remains.
    pub fn next_step(&self) -> Option<usize> {
        self.stages.iter().position(|step| !step.status.is_settled())
    }

    /// How it ended, once no step remains: `done`, or `failed` if any step was given up.
    pub fn outcome(&self) -> CompensationStatus {
        if self.stages.iter().any(|step| step.status == UndoStatus::Failed) {
            CompensationStatus::Failed
        } else {
            CompensationStatus::Done
        }
    }
}

/// Whether a job ending now should compensate first: its kind gave undos to some of its
/// stages (`undo_stages`, stored at submit) and it started (`started_at`).
pub fn wanted(undo_stages: &[String], started: bool) -> bool {
    started && !undo_stages.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending() -> Ending {
        Ending { status: JobStatus::Failed, reason: "boom".into(), error: None }
    }

    #[test]
    fn undos_run_latest_stage_first_and_only_for_started_stages_that_have_one() {
        let mut c = Compensation::begin(ending(), Timestamp::now());
        assert!(!c.planned);
        c.plan(&["reserve", "charge", "ship"], &["reserve".into(), "charge".into(), "x".into()]);
        assert!(c.planned);
        let order: Vec<_> = c.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(order, ["charge", "reserve"]);
        assert_eq!(c.next_step(), Some(0));
        c.plan(&["reserve"], &["charge".into()]);
        assert!(c.stages.is_empty());
        assert_eq!(c.next_step(), None);
        assert_eq!(c.outcome(), CompensationStatus::Done);
    }

    #[test]
    fn a_given_up_undo_fails_the_compensation_but_the_others_still_run() {
        let mut c = Compensation::begin(ending(), Timestamp::now());
        c.plan(&["a", "b"], &["a".into(), "b".into()]);
        c.stages[0].status = UndoStatus::Failed;
        assert_eq!(c.next_step(), Some(1), "a given-up undo does not stop the rest");
        c.stages[1].status = UndoStatus::Done;
        assert_eq!(c.next_step(), None);
        assert_eq!(c.outcome(), CompensationStatus::Failed);
        c.stages[0].status = UndoStatus::Retrying;
        assert_eq!(c.next_step(), Some(0), "a retrying undo is not settled");
    }

    #[test]
    fn only_a_started_job_with_undos_compensates() {
        assert!(wanted(&["a".into()], true));
        assert!(!wanted(&["a".into()], false));
        assert!(!wanted(&[], true));
    }

    #[test]
    fn the_record_round_trips_in_the_shape_the_api_shows() {
        let mut c = Compensation::begin(ending(), Timestamp::now());
        c.plan(&["a"], &["a".into()]);
        let value = serde_json::to_value(&c).unwrap();
        assert_eq!(value["status"], "running");
        assert_eq!(value["stages"][0]["stage"], "a");
        assert_eq!(value["stages"][0]["status"], "pending");
        assert_eq!(value["ending"]["status"], "failed");
        let back: Compensation = serde_json::from_value(value).unwrap();
        assert_eq!(back, c);
        assert!(serde_json::from_value::<UndoStatus>("later".into()).is_err());
    }
}
