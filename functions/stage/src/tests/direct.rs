//! The `run` op (a direct run) over in-memory adapters: a job one invocation finishes needs no
//! execution; one that needs more, or fails in a way worth retrying, is handed over to an
//! execution of the run's name under the same lease; a fatal failure is recorded by the run
//! itself; a second invocation of the run never works beside the first, while Lambda's retry
//! of the same one resumes it.

use super::*;

use longhaul_aws::runs::DirectRun;

impl World {
    /// An invocation of the job's first run (named as the job, as the dispatcher names it).
    fn direct_run(&self, id: &JobId) -> DirectRun {
        DirectRun::new(id, id.as_str(), WORKER)
    }

    /// Runs `run`'s invocation with the payload the dispatcher queues.
    async fn invoke_run(&self, run: &DirectRun, deadline: Instant) -> Result<Value, StageError> {
        handle(&self.deps, serde_json::from_value(run.payload()).unwrap(), deadline).await
    }
}

#[tokio::test]
async fn a_job_one_invocation_finishes_succeeds_with_no_execution() {
    let w = world();
    let id = w.queued("demo", json!({"items": 3})).await;
    let run = w.direct_run(&id);
    let out = w.invoke_run(&run, far()).await.expect("the run succeeds");
    assert_eq!(out["outcome"], "succeeded");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1));
    assert_eq!(job.claimant.as_deref(), Some(run.claimant.as_str()), "claimed by the run");
    assert!(w.result(&id).await.is_some());
    assert!(w.executions.started().is_empty(), "no execution");
    let end = job.ended_at_stage.clone().expect("where its last stage ended");
    assert_eq!((end.stage.as_str(), end.stage_index, end.stages_total), ("process", 1, 1));
    assert_eq!(end.items_total, Some(3), "the count, though no progress write came after it");

    // Lambda's retry of the same invocation (its answer lost) changes nothing.
    let again = w.invoke_run(&run, far()).await.expect("answered again");
    assert_eq!(again["outcome"], "succeeded");
    assert_eq!(w.job(&id).await.transitions, job.transitions, "nothing recorded twice");
    // Another invocation of the run finds it ended: nothing to do.
    let late = w.invoke_run(&w.direct_run(&id), far()).await.unwrap();
    assert_eq!(late["outcome"], "not_claimed");
    assert!(w.executions.started().is_empty());
}

#[tokio::test]
async fn a_job_that_needs_another_invocation_is_handed_over_under_the_same_lease() {
    let w = world();
    let id = w.queued("script", json!({"items": 3})).await;
    let run = w.direct_run(&id);
    let out = w.invoke_run(&run, near()).await.expect("paused, then handed over");
    assert_eq!(out["outcome"], "handed_over");
    let job = w.job(&id).await;
    let lease = job.lease.clone().expect("the run's lease");
    assert_eq!(job.claimant, None, "the run's hold ended");
    let started = w.executions.started();
    assert_eq!(started.len(), 1);
    let name = started[0].name.clone();
    assert!(name.starts_with(&format!("{id}.h")), "a new execution, not the run's name: {name}");
    assert_eq!(job.execution.as_deref(), Some(name.as_str()), "recorded as the job's holder");
    assert_eq!(started[0].input, json!({"job_id": id, "worker_arn": WORKER}));
    assert!(w.progress(&id).checkpoint_key.is_some(), "the run checkpointed first");

    // Lambda's retry of the run's invocation no longer gets the job; it starts the hand-over's
    // execution again (its start may have failed), which Step Functions deduplicates.
    let retry = w.invoke_run(&run, far()).await.unwrap();
    assert_eq!(retry["outcome"], "not_claimed");
    assert_eq!(w.executions.start_calls(), [name.clone(), name.clone()]);
    assert_eq!(w.executions.started().len(), 1);

    // The execution's first `Run` claims the job as its own, under the run's lease, and
    // resumes from the run's checkpoint.
    let first = w.run(&id, &name, json!({"job_id": id, "worker_arn": WORKER}), far()).await;
    let first = first.expect("the execution runs it to its end");
    assert_eq!(first["run"]["next"], "done");
    assert_eq!(lease_of(&first).lease.token, lease);
    let body = w.result(&id).await.unwrap();
    let result: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(result["starts"], json!([0, 1]), "resumed where the run checkpointed");
    assert_eq!(w.job(&id).await.attempt, 1, "one attempt throughout");
}

#[tokio::test]
async fn a_second_invocation_of_a_run_never_works_beside_the_first() {
    let w = world();
    let id = w.queued("script", json!({"items": 3})).await;
    let first = w.direct_run(&id);
    let second = w.direct_run(&id);
    w.jobs.claim_as(&id, &first.execution, Some(&first.claimant)).await.unwrap();
    let out = w.invoke_run(&second, far()).await.unwrap();
    assert_eq!(out["outcome"], "not_claimed");
    assert_eq!(w.progress_or_new(&id).items_done, 0, "the second did no work");
    assert!(w.executions.started().is_empty());
    // Nor does an execution of the run's name (the reaper starts one for a job still queued
    // when it looked) while the run holds the job.
    let err = w.first_run(&id, far()).await.expect_err("the run holds the job");
    assert_eq!(err.name(), "Job.NotClaimable");
    assert_eq!(w.progress_or_new(&id).items_done, 0);
    // Lambda's retry of the first (it crashed after claiming) resumes it to the end.
    let out = w.invoke_run(&first, far()).await.unwrap();
    assert_eq!(out["outcome"], "succeeded");
}

#[tokio::test]
async fn a_retryable_failure_hands_the_job_over_for_the_state_machines_retries() {
    let w = world();
    let params = json!({"items": 3, "fail_at": 1, "fail": "retryable", "failing_attempts": 1});
    let id = w.queued("script", params).await;
    let out = w.invoke_run(&w.direct_run(&id), far()).await.unwrap();
    assert_eq!(out["outcome"], "handed_over");
    assert_eq!(w.job(&id).await.status, JobStatus::Running, "the attempt goes on");
    assert_eq!(w.executions.started().len(), 1);
}

#[tokio::test]
async fn a_fatal_failure_is_recorded_by_the_run_with_its_reason() {
    let w = world();
    let id = w.queued("script", json!({"items": 3, "fail_at": 1, "fail": "fatal"})).await;
    let out = w.invoke_run(&w.direct_run(&id), far()).await.unwrap();
    assert_eq!(
        (out["outcome"].as_str(), out["recorded"]["next"].as_str()),
        (Some("failed"), Some("failed"))
    );
    assert_eq!(
        w.failed_with(&id).await,
        ("Job.Fatal".to_owned(), "scripted failure at 1".to_owned())
    );
    assert!(w.executions.started().is_empty(), "no execution");
}

#[tokio::test]
async fn a_failing_table_answers_an_error_so_lambda_retries_the_run() {
    let w = world();
    let id = w.queued("demo", json!({"items": 3})).await;
    let run = w.direct_run(&id);
    w.jobs.set_unavailable(true);
    let err = w.invoke_run(&run, far()).await.expect_err("an error Lambda retries");
    assert_eq!(err.name(), "Job.Retryable");
    w.jobs.set_unavailable(false);
    assert_eq!(w.invoke_run(&run, far()).await.unwrap()["outcome"], "succeeded");
}

#[tokio::test]
async fn a_cancellation_the_claims_read_predates_ends_the_job_cancelled_not_succeeded() {
    let w = world();
    let params = json!({"items": 2, "hook_at": 1, "finish_in_count": true});
    let id = w.queued("script", params).await;
    let (jobs, cancelled) = (w.jobs.clone(), id.clone());
    w.set_hook(async move {
        // The owner's request lands on the job record only: its flag on the progress record
        // was refused, the claim not having handed one over yet.
        let mut job = jobs.job(&cancelled).await.unwrap().unwrap();
        job.cancellation = Some(owners_cancellation());
        jobs.put_record(job);
    });
    let out = w.invoke_run(&w.direct_run(&id), far()).await.unwrap();
    assert_eq!(out["outcome"], "cancelled");
    assert_eq!(w.job(&id).await.status, JobStatus::Cancelled, "not succeeded");
    assert!(w.keys(&results(&id)).is_empty(), "its result is deleted");
}
