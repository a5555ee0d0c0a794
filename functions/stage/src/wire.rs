//! The stage's wire protocol: what the state machine's task states send (`op` and the
//! execution's state) and what they get back (the run's `next`, the recorded failure).

use longhaul_aws::jobs::Lease;
use longhaul_aws::runs::DirectRun;
use longhaul_domain::Owner;
use serde::{Deserialize, Serialize};

impl StageInput {
    /// Names `invoked` (the function this invocation runs in) as the worker of a continuation
    /// whose execution named none: one started by the definition before per-kind workers,
    /// whose tasks invoked the stage function directly. Without it, the next execution's
    /// tasks would have no function to invoke (`States.Runtime`) and the attempt would be lost
    /// until the reaper restarts it. (The runtime gives a placeholder text, not an ARN, when
    /// the invocation names no function: that is no default.)
    pub fn with_worker_default(mut self, invoked: &str) -> Self {
        if let StageInput::ContinueAsNew { worker_arn: worker_arn @ None, .. } = &mut self
            && invoked.starts_with("arn:")
        {
            *worker_arn = Some(invoked.to_owned());
        }
        self
    }
}

/// The error a state's `Catch` hands to `fail` (`ResultPath: $.error`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StateError {
    /// The error name (`Job.Fatal`, `States.Timeout`, …).
    #[serde(rename = "Error")]
    pub error: String,
    /// The cause; for a Lambda error, JSON `{"errorType", "errorMessage"}`.
    #[serde(rename = "Cause", default)]
    pub cause: String,
}

/// An execution's state as the state machine carries it (`$`): what `work` reads, and (with
/// the lease and its answer) returns in place of it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct WorkState {
    /// The lease this execution holds: none before its first `work` (a continued execution
    /// starts with the lease of the attempt it continues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<TaskLease>,
    /// The previous `work` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunOutput>,
}

/// A task state's input.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StageInput {
    /// A direct run (the dispatcher's asynchronous invocation, no execution): claim the job
    /// for this invocation, work through its stages, and record its end — or hand it over to
    /// an execution of the run's name ([`longhaul_aws::runs`]).
    Run(DirectRun),
    /// Claim the job if needed, work through its stages, record success.
    Work {
        /// The job (its id as the state machine passes it: [`crate::handle`] parses it).
        job_id: String,
        /// The execution's name (claims are idempotent per execution).
        execution: String,
        /// The execution's state (`$`).
        #[serde(default)]
        state: WorkState,
    },
    /// Start the next execution of this attempt (same lease) and let this one end.
    ContinueAsNew {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: TaskLease,
        /// The function ARN this execution's task states invoke (its input's `worker_arn`):
        /// the next execution runs in the same worker. Absent from an execution that an
        /// older definition started (its tasks named the stage function itself): see
        /// [`StageInput::with_worker_default`].
        #[serde(default)]
        worker_arn: Option<String>,
    },
    /// Record a failure.
    Fail {
        /// The job.
        job_id: String,
        /// The execution's state: it carries the lease once the first `work` answered…
        #[serde(default)]
        state: WorkState,
        /// …or, when the first `work` failed before answering, the job record names this
        /// execution as the one holding it.
        #[serde(default)]
        execution: Option<String>,
        /// What went wrong.
        error: StateError,
    },
    /// Run a compensating job's undos and end it (the dispatcher's asynchronous invocation:
    /// `crate::compensate`).
    Compensate {
        /// The job.
        job_id: String,
    },
    /// Run one shard of a distributed stage: the `FanOut` map's `Shard` state (`crate::shard`).
    Shard {
        /// The job.
        job_id: String,
        /// The attempt's lease (the parent execution's).
        lease: TaskLease,
        /// 1-based index of the fanned-out stage.
        stage_index: u32,
        /// The shard, as the manifest lists it.
        item: ManifestItem,
        /// The previous `Shard` answer of this shard's map iteration: the run it continues.
        #[serde(default)]
        run: Option<ShardAnswer>,
    },
}

/// One shard as the manifest of a distributed stage lists it (the map's item).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestItem {
    /// Its index in the stage.
    pub index: u32,
    /// The kind's descriptor of it.
    pub shard: longhaul_worker::Shard,
}

/// What the `Shard` state answers: go on (the same run, the deadline neared) or done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAnswer {
    /// What the map iteration does next.
    pub next: ShardNext,
    /// The invocation's run (the next `Shard` continues it).
    pub run: String,
}

/// The `More?` choice of a map iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardNext {
    /// Run the shard again: it checkpointed as the deadline neared.
    Continue,
    /// The shard is done (its output kept for the merge).
    Done,
}

/// What the `FanOut` map runs: the manifest of a distributed stage's shards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FanOutTask {
    /// The bucket of the manifest (the `ItemReader` reads it).
    pub bucket: String,
    /// The manifest's key.
    pub manifest: String,
    /// 1-based index of the fanned-out stage.
    pub stage_index: u32,
    /// Most shards running at once.
    pub max_concurrency: u32,
}

/// The lease as the state machine carries it (`$.lease`, the claim's output): the
/// attempt's [`Lease`] plus the job's owner, so that every task of the attempt puts the
/// principal on its log lines without reading the job. A lease minted before the principal
/// was carried (or forged by a test) has none; `run` and the terminal tasks then take it from
/// the record they read or write anyway.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct TaskLease {
    /// The fencing lease.
    #[serde(flatten)]
    pub lease: Lease,
    /// The job's owner, for log context only (never for authorization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Owner>,
}

impl std::ops::Deref for TaskLease {
    type Target = Lease;
    fn deref(&self) -> &Lease {
        &self.lease
    }
}

/// What `run` returns.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct RunOutput {
    /// What the state machine does next.
    pub next: Next,
    /// The stage now current (its name shows in the execution history).
    #[serde(default)]
    pub stage: String,
    /// `run` invocations so far in this execution.
    #[serde(default)]
    pub loops: u32,
    /// When done: the result object's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// When done: the result itself, when it is kept in the job's record (small enough; see
    /// `longhaul_domain::inline_result`). Recorded by this invocation, never sent on.
    #[serde(skip)]
    pub result_inline: Option<longhaul_domain::inline_result::InlineResult>,
    /// When done: how long the job type's results are kept (so recording the success needs
    /// no read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_ttl_seconds: Option<u64>,
    /// When done: the summary the kind finished with, recorded with the success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<serde_json::Value>,
    /// When done: where the last stage ended (recorded with the success).
    #[serde(skip)]
    pub ended_at_stage: Option<longhaul_domain::progress::StageEnd>,
    /// When done: what the success leaves to delete, by key (the engine's `leftovers`);
    /// `None`: not known (a retried call whose end already landed tidies by prefix).
    #[serde(skip)]
    pub leftovers: Option<Vec<String>>,
    /// When paused by its own stage: the signal it waits for, and until when.
    #[serde(skip)]
    pub wait: Option<longhaul_domain::signals::Wait>,
    /// When fanning out: what the `FanOut` map runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOutTask>,
}

/// What `work` answers: the state machine's `Next?` choice reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    /// Call `work` again: the Lambda deadline neared and the stage checkpointed.
    #[default]
    Continue,
    /// Start the next execution of this attempt first: the execution's history nears its
    /// limit.
    ContinueAsNew,
    /// The owner cancelled the job; it is recorded `cancelled`.
    Cancelled,
    /// The owner paused the job; it is recorded `paused` at its last checkpoint (its resume
    /// dispatches it again: this execution ends).
    Paused,
    /// The job is recorded `succeeded`.
    Done,
    /// The job, ending failed or cancelled, is recorded `compensating`: its undos run
    /// without this execution (which ends).
    Compensating,
    /// A stage boundary was crossed: `work` goes on with the next stage within the same call
    /// (never answered to the state machine).
    NextStage,
    /// The state a continued execution starts from (`ContinueAsNew` writes it into the new
    /// execution's input; never answered).
    Start,
    /// Run the current stage's shards, each in its own invocation (`fan_out`): the `FanOut`
    /// map, then `Run` again, which merges them.
    FanOut,
}

/// What `fail` answers: the state machine's `Recorded?` choice reads `next`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "next", rename_all = "snake_case")]
pub enum Recorded {
    /// The attempt failed transiently within the budget: the job waits `queued` for its next
    /// attempt, which starts at `retry_at`.
    Retry {
        /// When the next attempt starts.
        retry_at: longhaul_domain::Timestamp,
    },
    /// The job is recorded `failed`.
    Failed,
    /// The owner had cancelled the job: it is recorded `cancelled`.
    Cancelled,
    /// The job is recorded `compensating` (to end failed or cancelled once its undos ran).
    Compensating,
    /// The execution never held the job: nothing of it was this execution's to record.
    Unrecorded,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn continuation(worker: Option<&str>) -> StageInput {
        let mut input = serde_json::json!({"op": "continue_as_new", "job_id": "j1",
            "lease": {"attempt": 1, "token": "t"}});
        if let Some(worker) = worker {
            input["worker_arn"] = worker.into();
        }
        serde_json::from_value(input).unwrap()
    }

    fn worker_of(input: &StageInput) -> Option<&str> {
        match input {
            StageInput::ContinueAsNew { worker_arn, .. } => worker_arn.as_deref(),
            _ => panic!("not a continuation"),
        }
    }

    #[test]
    fn a_continuation_without_a_worker_continues_in_the_invoked_function() {
        let stage = "arn:aws:lambda:eu-west-1:123456789012:function:longhaul-Stage";
        let csv = "arn:aws:lambda:eu-west-1:123456789012:function:longhaul-CsvReportWorker";
        assert_eq!(worker_of(&continuation(None).with_worker_default(stage)), Some(stage));
        assert_eq!(worker_of(&continuation(Some(csv)).with_worker_default(stage)), Some(csv));
        let placeholder = "No header lambda-runtime-invoked-function-arn found.";
        assert_eq!(worker_of(&continuation(None).with_worker_default(placeholder)), None);
    }
}
