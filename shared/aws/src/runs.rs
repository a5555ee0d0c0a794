//! Direct runs: a job that one worker invocation can finish runs without a Step Functions
//! execution.
//!
//! The dispatcher queues an asynchronous invocation of the job's worker function (Lambda's
//! `InvocationType=Event`) carrying a [`DirectRun`]. The worker claims the job under the
//! run's name — the execution name the dispatch recorded, so everything that finds jobs by
//! their execution (the reaper, cancel) treats a run as an execution that may not exist —
//! and works until the job is done. Only a job that needs more than that invocation pays for
//! a Standard execution: the worker hands it over (the job's lease goes on in a new execution,
//! [`hand_over_name`], which claims it again as its own) when its deadline nears, or when a
//! stage failed in a way the state machine's retries handle. A run Lambda gave up on (its function
//! failed on every try, or the event aged out of Lambda's queue) comes back to the intake
//! queue as a [`GivenUpRun`], from the worker function's on-failure destination, and the
//! dispatcher hands it over the same way.
//!
//! Why not always an execution: a Standard workflow bills every state entered, and a job
//! whose happy path is one invocation gains nothing from it (docs/architecture.md, "Direct
//! runs"). Why not Express workflows: they run at most 5 minutes, have no exactly-once start
//! by name, and still bill per request and per GB-s.
//!
//! The same run may be invoked twice (a redelivered dispatch message, the reaper starting a
//! lost one again); each invocation the dispatcher queues carries a fresh `claimant`, stored
//! with the claim, and only Lambda's retries of the same event (the same claimant) get the
//! lease back, so a second invocation of a run never works beside the first. (Lambda's own
//! rare duplicate delivery of the same event carries the same claimant: docs/architecture.md,
//! "Direct runs", says what holds then.)

use longhaul_domain::JobId;
use serde::{Deserialize, Serialize};

use crate::executions::StartOutcome;
use crate::jobs::StoreError;
use crate::ports::{JobAttempts, JobExecutions};
use crate::workers::INPUT_KEY;

/// The payload of a direct run's invocation (the worker's `run` op).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectRun {
    /// The job.
    pub job_id: JobId,
    /// The run's name: the job's execution name for this dispatch (an execution that takes
    /// the job over gets it too).
    pub execution: String,
    /// This invocation's claimant (OS-random, fresh per invocation queued).
    pub claimant: String,
    /// The worker function's ARN (an execution taking over the job invokes it too).
    pub worker_arn: String,
}

impl DirectRun {
    /// A new invocation of run `execution` of `job_id` in `worker_arn`, with a fresh claimant.
    pub fn new(job_id: &JobId, execution: &str, worker_arn: &str) -> Self {
        DirectRun {
            job_id: job_id.clone(),
            execution: execution.to_owned(),
            claimant: uuid::Uuid::new_v4().simple().to_string(),
            worker_arn: worker_arn.to_owned(),
        }
    }

    /// The invocation's payload: the worker's `run` op.
    pub fn payload(&self) -> serde_json::Value {
        let mut payload = serde_json::to_value(self).expect("a run serialises");
        payload["op"] = "run".into();
        payload
    }
}

/// The payload of the invocation that runs a compensating job's undos (the worker's
/// `compensate` op).
pub fn compensation_payload(job_id: &JobId) -> serde_json::Value {
    serde_json::json!({ "op": "compensate", "job_id": job_id })
}

/// What Lambda sends to a worker function's on-failure destination about a compensation it
/// gave up on (see [`compensation_payload`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GivenUpCompensation {
    /// The invocation, as the dispatcher queued it.
    pub request_payload: CompensationRequest,
}

/// The payload of a compensation's invocation, as read back.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CompensationRequest {
    /// Always `compensate`.
    pub op: String,
    /// The job.
    pub job_id: JobId,
}

/// What Lambda sends to a worker function's on-failure destination about a direct run it
/// gave up on (an asynchronous invocation record: its `requestPayload` is the run's payload).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GivenUpRun {
    /// Why Lambda gave up, and on what.
    pub request_context: GivenUpContext,
    /// The run, as the dispatcher queued it.
    pub request_payload: DirectRun,
    /// The last try's answer (the function's error), when there was one.
    #[serde(default)]
    pub response_payload: Option<serde_json::Value>,
}

/// The `requestContext` of an asynchronous invocation record.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GivenUpContext {
    /// `RetriesExhausted` or `EventAgeExceeded`.
    pub condition: String,
    /// How many times Lambda ran it.
    #[serde(default)]
    pub approximate_invoke_count: u32,
}

/// The input of an execution of `job_id` whose task states invoke `worker_arn`.
pub fn execution_input(job_id: &JobId, worker_arn: &str) -> serde_json::Value {
    serde_json::json!({ "job_id": job_id, INPUT_KEY: worker_arn })
}

/// The name of the execution a hand-over of `run` starts: the run's name, `.h` and a random
/// suffix. Never the run's own name: an execution of that name may exist already, and have
/// ended — the reaper starts one for a job still `queued` when it looks (the run's event
/// delayed in Lambda's queue), which the run's later claim refuses.
pub fn hand_over_name(run: &DirectRun) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{}.h{}", run.execution, &suffix[..12])
}

/// Whether `execution` is one a hand-over of `run` started ([`hand_over_name`]).
pub fn is_hand_over_of(execution: &str, run: &DirectRun) -> bool {
    execution.strip_prefix(run.execution.as_str()).is_some_and(|rest| rest.starts_with(".h"))
}

/// Hands `run`'s job over to a new execution ([`hand_over_name`]), going on under the run's
/// `lease` (its first task claims the job again as its own): the job records the execution as
/// its holder first, which ends the run's hold ([`JobAttempts::record_execution`]), so no retry
/// of the run's invocation works beside the execution. A refusal ([`StoreError::Conflict`])
/// means the lease is no longer the job's.
pub async fn hand_over(
    jobs: &(impl JobAttempts + ?Sized),
    executions: &(impl JobExecutions + ?Sized),
    run: &DirectRun,
    lease: &str,
) -> Result<(), StoreError> {
    let name = hand_over_name(run);
    jobs.record_execution(&run.job_id, lease, &name).await?;
    start_execution(executions, run, &name).await
}

/// Starts execution `name` of `run`'s job (again: starting is idempotent by name): the one a
/// hand-over recorded ([`hand_over`]), or the run's own name for a job no invocation of the
/// run claimed.
pub async fn start_execution(
    executions: &(impl JobExecutions + ?Sized),
    run: &DirectRun,
    name: &str,
) -> Result<(), StoreError> {
    let input = execution_input(&run.job_id, &run.worker_arn);
    match executions.start(name, &input).await? {
        StartOutcome::Started { execution_arn } => {
            tracing::info!(execution_arn, "the job goes on in an execution")
        }
        StartOutcome::AlreadyExists => tracing::info!("the job's execution exists already"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_names_a_new_execution_of_its_run() {
        let job = JobId::new();
        let run = DirectRun::new(&job, &format!("{job}-2"), "arn:w");
        let (a, b) = (hand_over_name(&run), hand_over_name(&run));
        assert_ne!(a, b);
        assert!(a.len() <= 80, "a Step Functions execution name: {a}");
        assert!(is_hand_over_of(&a, &run));
        assert!(!is_hand_over_of(&run.execution, &run), "not the run's own name");
        let first = DirectRun::new(&job, job.as_str(), "arn:w");
        assert!(!is_hand_over_of(&a, &first), "not the hand-over of another dispatch's run");
    }

    #[test]
    fn a_run_is_the_workers_run_op_with_a_fresh_claimant() {
        let job = JobId::new();
        let (a, b) = (DirectRun::new(&job, "x", "arn:w"), DirectRun::new(&job, "x", "arn:w"));
        assert_ne!(a.claimant, b.claimant, "each invocation queued claims as itself");
        assert_eq!(a.payload()["op"], "run");
        assert_eq!(a.payload()["job_id"], job.as_str());
    }

    /// The record Lambda sends to an SQS on-failure destination (the documented shape).
    #[test]
    fn lambdas_record_of_a_run_it_gave_up_on_parses() {
        let job = JobId::new();
        let run = DirectRun::new(&job, job.as_str(), "arn:aws:lambda:us-east-1:1:function:w");
        let record = serde_json::json!({
            "version": "1.0",
            "timestamp": "2026-11-26T05:00:00.000Z",
            "requestContext": {
                "requestId": "e4b46cbf-b738-xmpl-8880-a18cdf61200e",
                "functionArn": "arn:aws:lambda:us-east-1:1:function:w:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": 3
            },
            "requestPayload": run.payload(),
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": {"errorType": "Runtime.ExitError", "errorMessage": "exited"}
        });
        let given_up: GivenUpRun = serde_json::from_value(record).unwrap();
        assert_eq!(given_up.request_payload, run);
        assert_eq!(given_up.request_context.condition, "RetriesExhausted");
        assert_eq!(given_up.request_context.approximate_invoke_count, 3);
    }
}
