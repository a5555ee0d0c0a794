//! The job record, its index entry and the views read from it.

use super::*;

use longhaul_domain::admission::{Priority, Waiting};
use longhaul_domain::policy::JobPolicy;
use longhaul_domain::{
    Cancellation, JobError, JobId, JobStatus, Owner, Pause, Timestamp, Transition,
};
use serde::{Deserialize, Serialize};

/// The job record. Its `Debug` leaves out what must not reach a log: the params, the
/// callback URL, the idempotency key and the lease token (see [`crate::redact`]).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Its id.
    pub job_id: JobId,
    /// The principal (token `sub`) that submitted the job; the only one who can see it.
    pub owner: Owner,
    /// The job type's name.
    #[serde(rename = "type")]
    pub job_type: String,
    /// The validated parameters, as submitted.
    pub params: serde_json::Value,
    /// Where the job is in its life.
    pub status: JobStatus,
    /// How many times the job was claimed (0 until it first runs).
    pub attempt: u32,
    /// The current attempt's fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The execution that holds the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// Where the job's last stage ended, recorded with its success
    /// ([`longhaul_domain::progress::StageEnd`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_stage: Option<longhaul_domain::progress::StageEnd>,
    /// The invocation that claimed the job for a direct run (its payload's `claimant`), while
    /// the run holds it; none once an execution holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimant: Option<String>,
    /// The idempotency key (sent or derived) the job was created under.
    pub idempotency_key: String,
    /// SHA-256 of the canonical request, to tell a replay from a conflicting reuse of the key.
    pub fingerprint: String,
    /// Where to deliver the terminal event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// When it was accepted.
    pub created_at: Timestamp,
    /// Last change of any kind.
    pub updated_at: Timestamp,
    /// First claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// Entry into a terminal state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Why the job failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobError>,
    /// The result object's key in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// The result itself, when it was small enough to keep here instead of the bucket
    /// ([`longhaul_domain::inline_result`]); removed when the job expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_inline: Option<longhaul_domain::inline_result::InlineResult>,
    /// Every status change, oldest first.
    pub transitions: Vec<Transition>,
    /// Failures injected so far by a diagnostic kind (`StageContext::count_failure`).
    #[serde(default)]
    pub injected_failures: u32,
    /// The failed or cancelled job this one re-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<JobId>,
    /// Who asked to cancel the job, when and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<Cancellation>,
    /// Who paused the job, when and why (and since when it is `paused`): while a pause is asked
    /// for or holds; its resume removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<Pause>,
    /// Seconds it spent `paused`, all pauses together (added at each resume): `max_runtime`
    /// does not count them.
    #[serde(default)]
    pub paused_seconds: u64,
    /// How many times it was resumed: each resume dispatches it again, and those dispatches
    /// are not counted against its attempts.
    #[serde(default)]
    pub resumes: u32,
    /// The stages its kind gives an undo for these params (stored at submit): when it ends
    /// `failed` or `cancelled` after starting one of them, it compensates first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undo_stages: Vec<String>,
    /// Its compensation: while it is `compensating`, and on the job it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<longhaul_domain::compensation::Compensation>,
    /// How many times the current attempt continued as a new execution.
    #[serde(default)]
    pub continuations: u32,
    /// How many executions were started for the job (the dispatcher's, then re-dispatches).
    #[serde(default)]
    pub dispatches: u32,
    /// How many times the reaper re-enqueued the job while it was pending.
    #[serde(default)]
    pub enqueues: u32,
    /// When the reaper saw progress stop while heartbeats went on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_at: Option<Timestamp>,
    /// A delayed job: not started before this time (RFC 3339, as stored). See
    /// [`longhaul_domain::schedule`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    /// How urgent it is among its tenant's waiting jobs (left off when `normal`).
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
    /// Its policy, as its kind and the deployment said when it was submitted (absent only on
    /// records from before policies were stored: [`JobRecord::policy_or_default`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<JobPolicy>,
    /// Why the job waits for a running slot, and since when; only while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
    /// A retry that starts from the retried job's last checkpoint: where it took over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<ResumedFrom>,
    /// A `queued` job whose last attempt failed retryably: when its next attempt starts
    /// (RFC 3339, as stored; see [`longhaul_domain::retry`]). Removed by the next claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// Why the job's last failed attempt failed (the job goes on: this is not its `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<JobError>,
    /// The small structured outcome its kind finished with, beside the result (at most
    /// `longhaul_worker::MAX_SUMMARY_BYTES`); only on a succeeded job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<serde_json::Value>,
    /// The schedule tick that submitted the job, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<ScheduledBy>,
}

/// The schedule tick that submitted a job (its view shows `schedule_id` and `scheduled_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledBy {
    /// The schedule.
    pub schedule_id: longhaul_domain::schedules::ScheduleId,
    /// The tick's time.
    pub scheduled_at: Timestamp,
}

/// Where a retry took over from the job it retries (`POST /jobs/{id}/retry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumedFrom {
    /// The retried job.
    pub job_id: JobId,
    /// The stage it had reached.
    pub stage: String,
    /// Items of that stage its last checkpoint covers.
    pub items_done: u64,
}

impl JobRecord {
    /// Whether ending it `failed` or `cancelled` now runs undos first: it started, and its
    /// kind gave some of its stages an undo.
    pub fn wants_compensation(&self) -> bool {
        longhaul_domain::compensation::wanted(&self.undo_stages, self.started_at.is_some())
    }

    /// Whether the claim that left this record was the job's first — its attempt 1, never
    /// resumed (a pause or a wait gives its attempt back, and only a resume makes it pending
    /// again) — with no progress record to resume from (none was seeded for a retry): no
    /// attempt before it could have written one, so the claim hands none over.
    pub fn is_first_claim(&self) -> bool {
        self.attempt == 1 && self.resumes == 0 && self.resumed_from.is_none()
    }

    /// Whether a claim by `execution` (for `claimant`, a direct run's; none, an execution's)
    /// finds the job already its own, so that it gets the lease back: the job runs under that
    /// execution, held by the same claimant — a direct run's retry, or an execution once no run
    /// holds the job any more (an execution takes a run's job over only after
    /// `record_execution` ended the run's hold, so the two never work side by side).
    pub fn holds_claim(&self, execution: &str, claimant: Option<&str>) -> bool {
        self.status == JobStatus::Running
            && self.execution.as_deref() == Some(execution)
            && self.claimant.as_deref() == claimant
    }

    /// Most jobs of its kind that may run at once, if its policy limits them.
    pub fn concurrency_limit(&self) -> Option<u32> {
        self.policy.as_ref().and_then(|p| p.concurrency_limit)
    }

    /// Its policy; a record from before policies were stored gets the default policy.
    pub fn policy_or_default(&self) -> JobPolicy {
        self.policy.clone().unwrap_or_default()
    }

    /// What its progress counts (`items`, `bytes`, …), as its kind declared it.
    pub fn progress_unit(&self) -> String {
        self.policy
            .as_ref()
            .map_or_else(|| JobPolicy::default().progress_unit, |p| p.progress_unit.clone())
    }
}

impl std::fmt::Debug for JobRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::redact::Redacted;
        let redacted = |present: bool| present.then_some(Redacted);
        f.debug_struct("JobRecord")
            .field("job_id", &self.job_id)
            .field("owner", &self.owner)
            .field("job_type", &self.job_type)
            .field("params", &Redacted)
            .field("status", &self.status)
            .field("attempt", &self.attempt)
            .field("lease", &redacted(self.lease.is_some()))
            .field("execution", &self.execution)
            .field("idempotency_key", &Redacted)
            .field("fingerprint", &self.fingerprint)
            .field("callback_url", &redacted(self.callback_url.is_some()))
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .field("started_at", &self.started_at)
            .field("finished_at", &self.finished_at)
            .field("error", &self.error)
            .field("result_key", &self.result_key)
            .field("result_inline", &redacted(self.result_inline.is_some()))
            .field("transitions", &self.transitions)
            .field("injected_failures", &self.injected_failures)
            .field("retry_of", &self.retry_of)
            .field("cancellation", &self.cancellation)
            .field("pause", &self.pause)
            .field("paused_seconds", &self.paused_seconds)
            .field("resumes", &self.resumes)
            .field("undo_stages", &self.undo_stages)
            .field("compensation", &self.compensation)
            .field("continuations", &self.continuations)
            .field("dispatches", &self.dispatches)
            .field("enqueues", &self.enqueues)
            .field("stalled_at", &self.stalled_at)
            .field("not_before", &self.not_before)
            .field("summary", &redacted(self.summary.is_some()))
            .finish()
    }
}

/// What the indexes hold of a job record (their projection, `template.yaml`): enough for the
/// reaper to judge and act on a job, for a listing to summarise it, and for logs and metrics
/// to name it — not the params, the transition log or the error, so a burst of large
/// submissions costs the indexes no more than small ones, and the writes that change only
/// those attributes write nothing to the indexes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEntry {
    /// The job id.
    pub job_id: JobId,
    /// The principal that owns the job.
    pub owner: Owner,
    /// The job type.
    #[serde(rename = "type")]
    pub job_type: String,
    /// Current status.
    pub status: JobStatus,
    /// Attempt number (0 until first claimed).
    pub attempt: u32,
    /// Whether a lease is held, and which (see [`JobRecord::lease`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The execution name of the current dispatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// When the job was accepted.
    pub created_at: Timestamp,
    /// When the record last changed (for a running job: its claim).
    pub updated_at: Timestamp,
    /// When the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When the reaper flagged its progress stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_at: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Dispatches so far.
    #[serde(default)]
    pub dispatches: u32,
    /// Re-enqueues of a pending job so far.
    #[serde(default)]
    pub enqueues: u32,
    /// Its policy (see [`JobRecord::policy`]): what the reaper judges it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<JobPolicy>,
    /// Its priority (left off the record when `normal`): with `created_at` and `job_id`, a
    /// waiting job's place in its waiting lists, which the reaper checks without a read.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
}

impl JobEntry {
    /// Its policy; a record from before policies were stored gets the default policy.
    pub fn policy_or_default(&self) -> JobPolicy {
        self.policy.clone().unwrap_or_default()
    }
}

/// The attributes of a job record both indexes project (`template.yaml` must list the same; a
/// test compares them).
pub const INDEX_ATTRIBUTES: [&str; 16] = [
    "job_id",
    "owner",
    "type",
    "status",
    "attempt",
    "lease",
    "execution",
    "created_at",
    "updated_at",
    "started_at",
    "stalled_at",
    "finished_at",
    "dispatches",
    "enqueues",
    "policy",
    "priority",
];

impl From<&JobRecord> for JobEntry {
    fn from(job: &JobRecord) -> Self {
        JobEntry {
            job_id: job.job_id.clone(),
            owner: job.owner.clone(),
            job_type: job.job_type.clone(),
            status: job.status,
            attempt: job.attempt,
            lease: job.lease.clone(),
            execution: job.execution.clone(),
            created_at: job.created_at,
            updated_at: job.updated_at,
            started_at: job.started_at,
            stalled_at: job.stalled_at,
            finished_at: job.finished_at,
            dispatches: job.dispatches,
            enqueues: job.enqueues,
            policy: job.policy.clone(),
            priority: job.priority,
        }
    }
}

/// What logs and metrics name a job by, from its whole record or its index entry.
pub trait JobIdentity {
    /// The job id.
    fn job_id(&self) -> &JobId;
    /// The job type.
    fn job_type(&self) -> &str;
    /// The owning principal.
    fn owner(&self) -> &Owner;
    /// The attempt number.
    fn attempt(&self) -> u32;
}

macro_rules! job_identity {
    ($($record:ty),*) => {$(
        impl JobIdentity for $record {
            fn job_id(&self) -> &JobId {
                &self.job_id
            }
            fn job_type(&self) -> &str {
                &self.job_type
            }
            fn owner(&self) -> &Owner {
                &self.owner
            }
            fn attempt(&self) -> u32 {
                self.attempt
            }
        }
    )*};
}
job_identity!(JobRecord, JobEntry);

/// A job with its progress: what `GET /jobs/{id}` shows, read in one query.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    /// The job record.
    pub job: JobRecord,
    /// Its progress, once a stage has claimed it.
    pub progress: Option<ProgressRecord>,
}

impl JobView {
    /// The job's progress as its clients are shown it, the same in `GET /jobs/{id}` and its
    /// live stream ([`longhaul_domain::progress::ProgressView::for_status`]).
    pub fn shown_progress(&self) -> longhaul_domain::progress::ProgressView {
        self.progress
            .as_ref()
            .map_or_else(longhaul_domain::progress::ProgressView::unknown, ProgressRecord::recorded)
            .for_status(self.job.status, self.job.ended_at_stage.as_ref())
    }
}

/// A job's lease: what every write of one attempt is fenced by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The attempt number (1 for the first claim).
    pub attempt: u32,
    /// The random fencing token.
    pub token: String,
}
