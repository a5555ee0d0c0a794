//! Compensation: a job that started stages with an undo and ends failed or cancelled moves to
//! `compensating` and is sent to the dispatcher; the `compensate` op runs the undos of the
//! stages it started, latest first, retrying a failed one with backoff within the job's
//! attempts and giving up one that fails fatally or runs out of them (the others still run),
//! then ends the job as it was going to end, its `compensation` saying how it went.

use super::*;

use longhaul_aws::jobs::COMPENSATION_SILENCE;
use longhaul_domain::compensation::{CompensationStatus, UndoStatus};
use longhaul_worker::Undo;

/// The undos a test kind ran.
pub(super) type UndoLog = Arc<Mutex<Vec<Undo>>>;

/// A three-stage kind (`reserve`, `charge`, `ship`) whose stages do nothing but may fail, and
/// whose undos are logged and may fail.
pub(super) struct Saga {
    pub(super) hook: Hook,
    pub(super) undos: UndoLog,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SagaParams {
    /// The stages with an undo.
    undo: Vec<String>,
    /// Fail (fatally) in this stage.
    #[serde(default)]
    fail_in: Option<String>,
    /// Run the test's hook at the start of this stage (before its progress write).
    #[serde(default)]
    hook_in: Option<String>,
    /// The undo of this stage fails…
    #[serde(default)]
    undo_fails: Option<String>,
    /// …in its first this many attempts (default: all)…
    #[serde(default)]
    undo_failures: Option<u32>,
    /// …fatally (default: retryably).
    #[serde(default)]
    undo_fatal: bool,
}

impl JobKind for Saga {
    const NAME: &'static str = "saga";
    type Params = SagaParams;

    fn stages(&self) -> &'static [&'static str] {
        &["reserve", "charge", "ship"]
    }

    fn undo_stages(&self, params: &SagaParams) -> Vec<&'static str> {
        self.stages().iter().copied().filter(|s| params.undo.iter().any(|u| u == s)).collect()
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &SagaParams,
    ) -> Result<StageOutcome, KindError> {
        let stage = ctx.stage().to_owned();
        if params.hook_in.as_deref() == Some(stage.as_str()) {
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook.await;
            }
        }
        ctx.progress(1, Some(1)).await?;
        if params.fail_in.as_deref() == Some(stage.as_str()) {
            return Err(KindError::fatal(PublicMessage::domain(format!("{stage} refused"))));
        }
        if stage == "ship" {
            let result =
                ctx.write_result("result.json", "application/json", b"{}".to_vec()).await?;
            return Ok(StageOutcome::Finished(result));
        }
        Ok(StageOutcome::StageDone)
    }

    async fn undo(&self, undo: &Undo, params: &SagaParams) -> Result<(), KindError> {
        self.undos.lock().unwrap().push(undo.clone());
        let failing = params.undo_fails.as_deref() == Some(undo.stage.as_str())
            && params.undo_failures.is_none_or(|n| undo.attempt <= n);
        if !failing {
            return Ok(());
        }
        let message = PublicMessage::domain(format!("undo of {} refused", undo.stage));
        Err(if params.undo_fatal {
            KindError::fatal(message)
        } else {
            KindError::retryable(message)
        })
    }
}

impl World {
    /// A `saga` job with `params`, queued as submit and the dispatcher leave it (its undo
    /// stages stored as submit stores them).
    async fn saga(&self, params: Value) -> JobId {
        let undo_stages = self.deps.registry.get("saga").unwrap().undo_stages(&params);
        let job = JobRecord {
            job_type: "saga".into(),
            params,
            undo_stages: undo_stages.into_iter().map(str::to_owned).collect(),
            ..pending_job(&owner("alice"), Timestamp::now())
        };
        self.queued_record(job).await
    }

    /// Runs the job's first execution to its failure, recorded as the state machine records
    /// it: what `RecordFailure` answered.
    async fn run_to_failure(&self, id: &JobId) -> Value {
        let err = self.first_run(id, far()).await.expect_err("the run fails");
        self.record_failure(id, id, json!({"job_id": id}), err).await.expect("recorded")
    }

    /// The worker's `compensate` op, as the dispatcher invokes it.
    async fn compensate(&self, id: &JobId, deadline: Instant) -> Value {
        let input = json!({"op": "compensate", "job_id": id});
        handle(&self.deps, serde_json::from_value(input).unwrap(), deadline)
            .await
            .expect("the compensation answers")
    }

    /// The stages undone so far, in order, with their attempts.
    fn undone(&self) -> Vec<(String, u32)> {
        self.undos.lock().unwrap().iter().map(|u| (u.stage.clone(), u.attempt)).collect()
    }

    /// The stages of the job's compensation, with their status and attempts.
    async fn steps(&self, id: &JobId) -> Vec<(String, UndoStatus, u32)> {
        let job = self.job(id).await;
        let compensation = job.compensation.expect("a compensation");
        compensation.stages.iter().map(|s| (s.stage.clone(), s.status, s.attempts)).collect()
    }
}

fn pair(stage: &str, attempt: u32) -> (String, u32) {
    (stage.to_owned(), attempt)
}

#[tokio::test]
async fn a_failure_undoes_the_started_stages_latest_first_then_fails_the_job() {
    let w = world();
    let id = w.saga(json!({"undo": ["reserve", "charge", "ship"], "fail_in": "charge"})).await;
    assert_eq!(w.run_to_failure(&id).await, json!({"next": "compensating"}));
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Compensating);
    assert!(job.error.is_none(), "not failed yet");
    let sent = w.intake.sent();
    assert_eq!(sent.len(), 1, "sent to be compensated: {sent:?}");
    assert_eq!((&sent[0].0.job_id, sent[0].1), (&id, 0));
    assert!(w.undone().is_empty(), "nothing undone before the compensate op runs");

    let out = w.compensate(&id, far()).await;
    assert_eq!(out["outcome"], "failed");
    assert_eq!(w.undone(), [pair("charge", 1), pair("reserve", 1)], "ship never started");
    let keys: Vec<String> = w.undos.lock().unwrap().iter().map(|u| u.key.clone()).collect();
    assert_eq!(keys, [format!("{id}:undo:charge"), format!("{id}:undo:reserve")]);
    let (code, message) = w.failed_with_compensation(&id).await;
    assert_eq!((code.as_str(), message.as_str()), ("Job.Fatal", "charge refused"));
    let job = w.job(&id).await;
    let compensation = job.compensation.expect("kept on the ended job");
    assert_eq!(compensation.status, CompensationStatus::Done);
    assert!(compensation.stages.iter().all(|s| s.status == UndoStatus::Done && s.at.is_some()));
    let states: Vec<JobStatus> = job.transitions.iter().map(|t| t.state).collect();
    assert_eq!(
        states[states.len() - 2..],
        [JobStatus::Compensating, JobStatus::Failed],
        "running → compensating → failed"
    );
    // A duplicate message finds the job ended and does nothing.
    assert_eq!(w.compensate(&id, far()).await["outcome"], "not_compensating");
    assert_eq!(w.undone().len(), 2);
}

impl World {
    /// The failed job's error (its last transition says the undos ran).
    async fn failed_with_compensation(&self, id: &JobId) -> (String, String) {
        let job = self.job(id).await;
        assert_eq!(job.status, JobStatus::Failed);
        let reason = &job.transitions.last().unwrap().reason;
        assert!(reason.contains("undone") || reason.contains("an undo failed"), "{reason}");
        let error = job.error.expect("why it failed");
        (error.code, error.message)
    }
}

#[tokio::test]
async fn a_job_without_undos_for_its_started_stages_ends_with_an_empty_compensation() {
    let w = world();
    let id = w.saga(json!({"undo": ["ship"], "fail_in": "reserve"})).await;
    assert_eq!(w.run_to_failure(&id).await, json!({"next": "compensating"}));
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert!(w.undone().is_empty());
    let compensation = w.job(&id).await.compensation.unwrap();
    assert!(compensation.stages.is_empty() && compensation.status == CompensationStatus::Done);
}

#[tokio::test]
async fn a_job_whose_kind_gives_no_undo_fails_at_once() {
    let w = world();
    let id = w.saga(json!({"undo": [], "fail_in": "charge"})).await;
    assert_eq!(w.run_to_failure(&id).await, json!({"next": "failed"}));
    assert!(w.job(&id).await.compensation.is_none());
    assert!(w.intake.sent().is_empty());
}

#[tokio::test]
async fn a_failing_undo_is_retried_after_a_backoff_then_succeeds() {
    let w = world();
    let id = w
        .saga(json!({"undo": ["reserve", "charge"], "fail_in": "ship",
            "undo_fails": "charge", "undo_failures": 1}))
        .await;
    w.run_to_failure(&id).await;
    assert_eq!(w.compensate(&id, far()).await["outcome"], "retry_scheduled");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Compensating);
    let step = &job.compensation.as_ref().unwrap().stages[0];
    assert_eq!(
        (step.stage.as_str(), step.status, step.attempts),
        ("charge", UndoStatus::Retrying, 1)
    );
    assert_eq!(step.error.as_deref(), Some("undo of charge refused"));
    let retry_at = step.retry_at.expect("when it is retried");
    let sent = w.intake.sent();
    let delay = sent.last().unwrap().1;
    assert!(delay >= 1, "the retry waits out its backoff in a delayed message: {delay}");
    // Woken early (a duplicate): it only waits again.
    assert_eq!(w.compensate(&id, far()).await["outcome"], "retry_scheduled");
    assert_eq!(w.undone(), [pair("charge", 1)]);
    w.clock.set(retry_at.as_datetime() + chrono::Duration::seconds(1));
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("charge", 1), pair("charge", 2), pair("reserve", 1)]);
    assert_eq!(
        w.steps(&id).await,
        [("charge".into(), UndoStatus::Done, 2), ("reserve".into(), UndoStatus::Done, 1)]
    );
    assert_eq!(w.job(&id).await.compensation.unwrap().status, CompensationStatus::Done);
}

#[tokio::test]
async fn an_undo_that_keeps_failing_is_given_up_after_the_jobs_attempts_and_the_rest_still_run() {
    let w = world_with(|deps| deps.max_attempts = Some(2));
    let id = w
        .saga(json!({"undo": ["reserve", "charge"], "fail_in": "ship", "undo_fails": "charge"}))
        .await;
    w.run_to_failure(&id).await;
    assert_eq!(w.compensate(&id, far()).await["outcome"], "retry_scheduled");
    let retry_at = w.job(&id).await.compensation.unwrap().stages[0].retry_at.unwrap();
    w.clock.set(retry_at.as_datetime() + chrono::Duration::seconds(1));
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("charge", 1), pair("charge", 2), pair("reserve", 1)]);
    let job = w.job(&id).await;
    let compensation = job.compensation.unwrap();
    assert_eq!(compensation.status, CompensationStatus::Failed, "one undo was given up");
    assert_eq!(compensation.stages[0].status, UndoStatus::Failed);
    assert_eq!(compensation.stages[0].error.as_deref(), Some("undo of charge refused"));
    assert_eq!(compensation.stages[1].status, UndoStatus::Done, "the other undo still ran");
    assert_eq!(job.status, JobStatus::Failed, "the job ends as it was going to");
}

#[tokio::test]
async fn a_fatal_undo_error_is_given_up_at_once() {
    let w = world();
    let id = w
        .saga(json!({"undo": ["reserve"], "fail_in": "charge", "undo_fails": "reserve",
            "undo_fatal": true}))
        .await;
    w.run_to_failure(&id).await;
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("reserve", 1)]);
    assert_eq!(w.steps(&id).await, [("reserve".into(), UndoStatus::Failed, 1)]);
}

#[tokio::test]
async fn an_undo_whose_invocation_died_counts_and_is_given_up_once_its_attempts_are_spent() {
    let w = world_with(|deps| deps.max_attempts = Some(1));
    let id = w.saga(json!({"undo": ["reserve", "charge"], "fail_in": "ship"})).await;
    w.run_to_failure(&id).await;
    // Planned, and the undo of `charge` began its only attempt, then the invocation died.
    let job = w.job(&id).await;
    let mut compensation = job.compensation.unwrap();
    compensation.plan(&["reserve", "charge", "ship"], &job.undo_stages);
    compensation.stages[0].status = UndoStatus::Running;
    compensation.stages[0].attempts = 1;
    w.jobs.record_compensation(&id, &compensation, Timestamp::now()).await.unwrap();
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("reserve", 1)], "the dead undo is not run again");
    let steps = w.job(&id).await.compensation.unwrap().stages;
    assert_eq!(steps[0].status, UndoStatus::Failed);
    assert_eq!(steps[0].error.as_deref(), Some("the undo did not finish in 1 attempts"));
}

#[tokio::test]
async fn a_compensation_near_the_deadline_sends_itself_on_and_runs_nothing() {
    let w = world();
    let id = w.saga(json!({"undo": ["reserve"], "fail_in": "charge"})).await;
    w.run_to_failure(&id).await;
    assert_eq!(w.compensate(&id, near()).await["outcome"], "continued");
    assert!(w.undone().is_empty());
    assert_eq!(w.intake.sent().len(), 2, "the begin's message and the continuation's");
    assert_eq!(w.job(&id).await.status, JobStatus::Compensating);
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("reserve", 1)]);
}

#[tokio::test]
async fn a_cancellation_while_running_undoes_the_started_stages_then_cancels() {
    let w = world();
    let id = w.saga(json!({"undo": ["reserve", "charge"], "hook_in": "charge"})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.cancel(&job, &owners_cancellation()).await.unwrap();
    });
    let out = w.first_run(&id, far()).await.expect("the run ends");
    assert_eq!(out["run"]["next"], "compensating");
    assert_eq!(w.job(&id).await.status, JobStatus::Compensating);
    assert_eq!(w.compensate(&id, far()).await["outcome"], "cancelled");
    assert_eq!(w.undone(), [pair("charge", 1), pair("reserve", 1)]);
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Cancelled);
    assert!(job.error.is_none());
    assert!(w.keys(&results(&id)).is_empty(), "a cancelled job has no result");
}

#[tokio::test]
async fn a_compensate_op_for_a_job_that_is_not_compensating_does_nothing() {
    let w = world();
    let id = w.saga(json!({"undo": ["reserve"]})).await;
    assert_eq!(w.compensate(&id, far()).await["outcome"], "not_compensating");
    let input = json!({"op": "compensate", "job_id": "not a job id"});
    let out = handle(&w.deps, serde_json::from_value(input).unwrap(), far()).await.unwrap();
    assert_eq!(out["outcome"], "missing");
    assert!(w.undone().is_empty());
}

#[tokio::test]
async fn a_duplicate_invocation_leaves_an_undo_under_way_to_the_one_running_it() {
    let w = world();
    let id = w.saga(json!({"undo": ["reserve", "charge"], "fail_in": "ship"})).await;
    w.run_to_failure(&id).await;
    assert!(w.progress(&id).lease.starts_with("revoked:"), "the attempt's worker is fenced off");
    let job = w.job(&id).await;
    let mut compensation = job.compensation.unwrap();
    compensation.plan(&["reserve", "charge", "ship"], &job.undo_stages);
    compensation.stages[0].status = UndoStatus::Running;
    compensation.stages[0].attempts = 1;
    compensation.stages[0].at = Some(Timestamp::from(w.clock.now()));
    compensation.revision += 1;
    w.jobs.record_compensation(&id, &compensation, Timestamp::now()).await.unwrap();
    assert_eq!(w.compensate(&id, far()).await["outcome"], "in_progress");
    assert!(w.undone().is_empty(), "not run beside the invocation running it");
    assert_eq!(w.job(&id).await.compensation.unwrap().revision, compensation.revision);
    // Once that invocation has been silent for long, it is taken to have died.
    w.clock.advance(COMPENSATION_SILENCE + Duration::from_secs(1));
    assert_eq!(w.compensate(&id, far()).await["outcome"], "failed");
    assert_eq!(w.undone(), [pair("charge", 2), pair("reserve", 1)]);
}

#[tokio::test]
async fn a_kind_this_worker_does_not_know_has_its_undos_given_up_never_called_done() {
    let w = world();
    let job = JobRecord {
        job_type: "retired".into(),
        params: json!({}),
        undo_stages: vec!["reserve".into()],
        ..pending_job(&owner("alice"), Timestamp::now())
    };
    let id = job.job_id.clone();
    w.jobs.put_job(&job).await.unwrap();
    let ending = longhaul_domain::compensation::Ending {
        status: JobStatus::Cancelled,
        reason: "cancelled by alice".into(),
        error: None,
    };
    let begin = longhaul_aws::jobs::compensation_request(
        &id,
        &[JobStatus::Pending],
        ending,
        Timestamp::now(),
    );
    w.jobs.transition(begin).await.unwrap();
    assert_eq!(w.compensate(&id, far()).await["outcome"], "cancelled");
    let compensation = w.job(&id).await.compensation.unwrap();
    assert_eq!(compensation.status, CompensationStatus::Failed);
    assert_eq!(w.steps(&id).await, [("reserve".into(), UndoStatus::Failed, 1)]);
    let error = compensation.stages[0].error.as_deref().unwrap();
    assert!(error.contains("not known to this worker"), "{error}");
}
