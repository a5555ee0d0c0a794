//! The handler over in-memory adapters: every task state with the inputs the state machine
//! gives it (`infra/statemachine/job.asl.json`), every path and every refusal. The Lambda
//! deadline is a parameter: a test forces the stop margin by passing a deadline that is already
//! within it ([`near`]) or an hour away ([`far`]); nothing sleeps, and no answer depends on
//! the machine's speed.

use super::*;

use std::sync::Mutex;

use futures::future::BoxFuture;
use lambda_runtime::Diagnostic;
use longhaul_aws::jobs::{JobRecord, Lease, ProgressRecord, ResumedFrom};
use longhaul_aws::ports::{JobCancellation, JobCreation, ObjectCleanup};
use longhaul_domain::{Cancellation, Timestamp};
use longhaul_job_demo::{Demo, DemoResult};
use longhaul_memory::contract::pending_job;
use longhaul_memory::{
    ManualClock, MemoryDispatchQueue, MemoryExecutions, MemoryJobStore, MemoryObjects, owner,
};
use longhaul_worker::{Checkpoint, JobKind, KindError, PublicMessage, StageContext, StageOutcome};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The function the state machine's tasks invoke (`$$.Execution.Input.worker_arn`).
const WORKER: &str = "arn:aws:lambda:eu-west-1:123456789012:function:longhaul-Stage";

/// A deadline already within the stop margin: the stage checkpoints and pauses at its first
/// look.
fn near() -> Instant {
    Instant::now()
}

/// A deadline an hour away: the stage never nears it.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(3_600)
}

/// What a test runs inside the kind's stage, once, before the item it names (`hook_at`): what
/// happens to the job while its stage works (another attempt claims it, its owner cancels).
type Hook = Arc<Mutex<Option<BoxFuture<'static, ()>>>>;

/// A test kind of two stages: `count` counts to `items` (one item per invocation when the
/// deadline is near, checkpointing where it got to, each invocation noting where it started),
/// and `report` writes what the count stage carried over as the result.
struct Script {
    hook: Hook,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ScriptParams {
    items: u64,
    /// Run the test's hook before this item.
    #[serde(default)]
    hook_at: Option<u64>,
    /// Fail at this item (after checkpointing it)…
    #[serde(default)]
    fail_at: Option<u64>,
    /// …so…
    #[serde(default)]
    fail: Option<FailAs>,
    /// …in the first this many attempts (default: all).
    #[serde(default)]
    failing_attempts: Option<u32>,
    /// Write a partial result first.
    #[serde(default)]
    partial: bool,
    /// Finish the job at the end of `count`, its result written there (no `report` stage
    /// runs): the hook then strikes in the job's last stage.
    #[serde(default)]
    finish_in_count: bool,
}

#[derive(Deserialize, schemars::JsonSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum FailAs {
    Retryable,
    Fatal,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Counted {
    next: u64,
    /// The item each invocation started from.
    starts: Vec<u64>,
}

impl Checkpoint for Counted {
    const VERSION: u32 = 1;
}

impl JobKind for Script {
    const NAME: &'static str = "script";
    type Params = ScriptParams;

    fn stages(&self) -> &'static [&'static str] {
        &["count", "report"]
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &ScriptParams,
    ) -> Result<StageOutcome, KindError> {
        if ctx.stage() == "report" {
            let counted: Counted = ctx.carried("count").await?;
            let body = serde_json::json!({"counted": counted.next, "starts": counted.starts});
            let body = serde_json::to_vec(&body).expect("JSON");
            let result = ctx.write_result("result.json", "application/json", body).await?;
            return Ok(StageOutcome::Finished(result));
        }
        let total = Some(params.items);
        let mut state: Counted = ctx.resume().await?.unwrap_or_default();
        state.starts.push(state.next);
        if params.partial {
            // Larger than a record keeps: an object, which an end must tidy.
            let body = vec![b' '; longhaul_domain::inline_result::MAX_INLINE_RESULT_BYTES + 1];
            ctx.write_result("partial.json", "application/json", body).await?;
        }
        while state.next < params.items {
            if params.hook_at == Some(state.next) {
                let hook = self.hook.lock().unwrap().take();
                if let Some(hook) = hook {
                    hook.await;
                }
            }
            let failing = params.failing_attempts.is_none_or(|n| ctx.attempt() <= n);
            if let (Some(fail), true, true) =
                (params.fail, params.fail_at == Some(state.next), failing)
            {
                ctx.checkpoint(&state, state.next, total).await?;
                let message = PublicMessage::domain(format!("scripted failure at {}", state.next));
                return Err(match fail {
                    FailAs::Retryable => KindError::retryable(message),
                    FailAs::Fatal => KindError::fatal(message),
                });
            }
            state.next += 1;
            ctx.progress(state.next, total).await?;
            if ctx.deadline_near() {
                ctx.checkpoint(&state, state.next, total).await?;
                return Ok(StageOutcome::Paused);
            }
        }
        if params.finish_in_count {
            let body = serde_json::to_vec(&serde_json::json!({"counted": state.next})).unwrap();
            let result = ctx.write_result("result.json", "application/json", body).await?;
            return Ok(StageOutcome::Finished(result));
        }
        ctx.checkpoint(&state, state.next, total).await?;
        Ok(StageOutcome::StageDone)
    }
}

struct World {
    jobs: Arc<MemoryJobStore>,
    objects: Arc<MemoryObjects>,
    executions: Arc<MemoryExecutions>,
    intake: Arc<MemoryDispatchQueue>,
    hook: Hook,
    /// The undos the `saga` kind ran, in order.
    undos: compensation::UndoLog,
    /// The handler's clock: standing still at the time the world was made, unless a test
    /// moves it.
    clock: Arc<ManualClock>,
    deps: Deps,
}

fn world() -> World {
    world_with(|_| {})
}

fn world_with(configure: impl FnOnce(&mut Deps)) -> World {
    let jobs = Arc::new(MemoryJobStore::new());
    let objects = Arc::new(MemoryObjects::new());
    let executions = Arc::new(MemoryExecutions::new());
    let intake = Arc::new(MemoryDispatchQueue::new());
    let clock = Arc::new(ManualClock::new());
    let hook: Hook = Arc::default();
    let undos: compensation::UndoLog = Arc::default();
    let registry = Registry::builder()
        .kind(Demo)
        .kind(Script { hook: hook.clone() })
        .kind(compensation::Saga { hook: hook.clone(), undos: undos.clone() })
        .kind(fan_out::Parts)
        .build()
        .expect("the test kinds register");
    let mut deps = Deps {
        jobs: jobs.clone(),
        objects: objects.clone(),
        margin: Duration::from_secs(30),
        // Every progress report writes, so what a test sees does not depend on timing; no
        // checkpoint falls due by the clock.
        progress_interval: Duration::ZERO,
        heartbeat_interval: Duration::from_secs(30),
        checkpoint_items: None,
        checkpoint_interval: Some(Duration::from_secs(3_600)),
        runs_per_execution: 500,
        executions: executions.clone(),
        result_ttl: ResultTtl::default(),
        registry,
        intake: intake.clone(),
        retry_delay: Some(Duration::from_secs(60)),
        max_attempts: None,
        clock: clock.clone(),
        fan_out: None,
    };
    configure(&mut deps);
    World { jobs, objects, executions, intake, hook, clock, undos, deps }
}

impl World {
    /// A job of `kind` with `params`, queued and dispatched to its first execution (named as
    /// the job, as the dispatcher names it).
    async fn queued(&self, kind: &str, params: Value) -> JobId {
        self.queued_with_policy(kind, params, None).await
    }

    /// [`World::queued`], with `policy` stored on the job as submit stores it (none: the
    /// kind's current policy rules it).
    async fn queued_with_policy(
        &self,
        kind: &str,
        params: Value,
        policy: Option<longhaul_domain::policy::JobPolicy>,
    ) -> JobId {
        let job = JobRecord {
            job_type: kind.to_owned(),
            params,
            policy,
            ..pending_job(&owner("alice"), Timestamp::now())
        };
        self.queued_record(job).await
    }

    /// `job` (pending, as submit writes it), queued and dispatched to its first execution.
    async fn queued_record(&self, job: JobRecord) -> JobId {
        let id = job.job_id.clone();
        self.jobs.put_job(&job).await.unwrap();
        let queue = TransitionRequest::new(&id, &[JobStatus::Pending], JobStatus::Queued, "queued")
            .set("execution", &id)
            .set("dispatches", 1);
        self.jobs.transition(queue).await.unwrap();
        id
    }

    /// The `Run` task of `execution` with the execution's state `state` (`$`).
    async fn run(
        &self,
        id: &JobId,
        execution: &str,
        state: Value,
        deadline: Instant,
    ) -> Result<Value, StageError> {
        let input = json!({"op": "work", "job_id": id, "execution": execution, "state": state});
        handle(&self.deps, serde_json::from_value(input).unwrap(), deadline).await
    }

    /// The first `Run` of the job's first execution: its state is the execution's input.
    async fn first_run(&self, id: &JobId, deadline: Instant) -> Result<Value, StageError> {
        self.run(id, id, json!({"job_id": id, "worker_arn": WORKER}), deadline).await
    }

    /// The `RecordFailure` task after `Run` failed with `err`: the state is the failed
    /// state's input with the error at `$.error`, and the error is as Lambda reports it.
    async fn record_failure(
        &self,
        id: &JobId,
        execution: &str,
        mut state: Value,
        err: StageError,
    ) -> Result<Value, StageError> {
        let diagnostic = Diagnostic::from(err);
        let cause = json!({"errorType": diagnostic.error_type,
            "errorMessage": diagnostic.error_message});
        let error = json!({"Error": diagnostic.error_type, "Cause": cause.to_string()});
        state["error"] = error.clone();
        let input = json!({"op": "fail", "job_id": id, "execution": execution,
            "state": state, "error": error});
        handle(&self.deps, serde_json::from_value(input).unwrap(), far()).await
    }

    async fn job(&self, id: &JobId) -> JobRecord {
        self.jobs.job(id).await.unwrap().expect("the job exists")
    }

    /// The job's error, once it failed: its code and message (also its last transition's
    /// reason).
    async fn failed_with(&self, id: &JobId) -> (String, String) {
        let job = self.job(id).await;
        assert_eq!(job.status, JobStatus::Failed);
        let error = job.error.expect("why it failed");
        assert_eq!(job.transitions.last().map(|t| &t.reason), Some(&error.message));
        (error.code, error.message)
    }

    fn progress(&self, id: &JobId) -> ProgressRecord {
        self.jobs.progress(id).expect("a progress record")
    }

    /// The progress record as a stage starts from it: a first claim's attempt has none until
    /// its first write, and starts from a new one (as `work` does).
    fn progress_or_new(&self, id: &JobId) -> ProgressRecord {
        self.jobs.progress(id).unwrap_or_default()
    }

    fn keys(&self, prefix: &str) -> Vec<String> {
        self.objects.keys().into_iter().filter(|k| k.starts_with(prefix)).collect()
    }

    async fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.objects.get(key).await.unwrap()
    }

    /// The result job `id` recorded: kept in its record, or the object its record names.
    async fn result(&self, id: &JobId) -> Option<Vec<u8>> {
        let job = self.job(id).await;
        match (job.result_inline, job.result_key) {
            (Some(inline), _) => Some(inline.bytes().unwrap()),
            (None, Some(key)) => self.object(&key).await,
            (None, None) => None,
        }
    }

    fn set_hook(&self, hook: impl Future<Output = ()> + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::pin(hook));
    }
}

fn checkpoints(id: &JobId) -> String {
    longhaul_aws::objects::checkpoints_prefix(id)
}

fn results(id: &JobId) -> String {
    result_key(id, "")
}

fn lease_of(output: &Value) -> TaskLease {
    serde_json::from_value(output["lease"].clone()).expect("a lease")
}

fn owners_cancellation() -> Cancellation {
    Cancellation {
        requested_at: Timestamp::now(),
        requested_by: owner("alice"),
        reason: Some("not needed".into()),
    }
}

#[tokio::test]
async fn a_claimed_job_runs_to_success_with_its_result_and_no_checkpoints_left() {
    let w = world();
    let id = w.queued("demo", json!({"items": 3})).await;
    let out = w.first_run(&id, far()).await.expect("the run succeeds");
    assert_eq!(out["run"]["next"], "done");
    assert_eq!(out["job_id"], id.as_str());
    let lease = lease_of(&out);
    assert_eq!((lease.attempt, lease.principal.as_ref()), (1, Some(&owner("alice"))));
    // The result is small: it is kept in the job's record, not sent on nor stored.
    assert!(out["run"]["result_key"].is_null(), "{out}");
    assert_eq!(out["run"]["result_ttl_seconds"], ResultTtl::DEFAULT.as_secs());

    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Succeeded);
    assert_eq!((job.attempt, job.lease.as_deref()), (1, Some(lease.token.as_str())));
    assert_eq!(job.result_key, None);
    let inline = job.result_inline.clone().expect("the result, in the record");
    assert_eq!(inline.content_type, "application/json");
    let expected = serde_json::to_vec(&DemoResult::expected(3)).unwrap();
    assert_eq!(inline.bytes().unwrap(), expected, "the kind's result is recorded");
    // Done before a checkpoint fell due: none was written (none after the result either).
    assert_eq!(w.progress(&id).checkpoint_key, None, "no checkpoint");
    assert!(w.keys(&checkpoints(&id)).is_empty(), "no checkpoint object, ever");
    assert!(w.objects.keys().is_empty(), "no object written at all");
    assert_eq!(w.objects.deletes(), 0, "no delete of anything that never existed");
    assert_eq!(w.objects.lists(), 0, "nothing listed to tidy up");

    // The state machine retries a `Run` whose answer was lost: it answers `done` again.
    let again = w.run(&id, &id, out.clone(), far()).await.expect("answered again");
    assert_eq!(again["run"]["next"], "done");
    assert_eq!(w.job(&id).await.transitions, job.transitions, "nothing recorded twice");
}

#[tokio::test]
async fn the_deadline_margin_answers_continue_with_a_checkpoint_the_next_call_resumes() {
    let w = world();
    let id = w.queued("script", json!({"items": 3})).await;
    let first = w.first_run(&id, near()).await.expect("paused");
    assert_eq!(first["run"]["next"], "continue");
    assert_eq!(
        (first["run"]["stage"].as_str(), first["run"]["loops"].as_u64()),
        (Some("count"), Some(1))
    );
    let progress = w.progress(&id);
    assert_eq!((progress.stage.as_str(), progress.items_done), ("count", 1));
    let checkpoint = progress.checkpoint_key.expect("the pause saved a checkpoint");
    assert!(checkpoint.starts_with(&format!("{}count/", checkpoints(&id))), "{checkpoint}");
    let saved: Value = serde_json::from_slice(&w.object(&checkpoint).await.unwrap()).unwrap();
    assert_eq!(saved["state"], json!({"next": 1, "starts": [0]}));
    assert_eq!((saved["schema_version"].as_u64(), saved["attempt"].as_u64()), (Some(1), Some(1)));
    assert_eq!(w.job(&id).await.status, JobStatus::Running);

    // `Next?` loops back to `Run` with its answer as the state.
    let second = w.run(&id, &id, first.clone(), near()).await.expect("paused again");
    assert_eq!(
        (second["run"]["next"].as_str(), second["run"]["loops"].as_u64()),
        (Some("continue"), Some(2))
    );
    assert_eq!(lease_of(&second), lease_of(&first), "the same lease throughout");
    assert_eq!(w.progress(&id).items_done, 2);

    let third = w.run(&id, &id, second, far()).await.expect("done");
    assert_eq!(third["run"]["next"], "done");
    assert_eq!(third["run"]["stage"], "report", "the stage boundary is crossed within the call");
    let body = w.result(&id).await.expect("a result");
    let result: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        result,
        json!({"counted": 3, "starts": [0, 1, 2]}),
        "each call resumed from the checkpoint the one before saved"
    );
    assert_eq!(w.job(&id).await.status, JobStatus::Succeeded);
    assert!(w.keys(&checkpoints(&id)).is_empty());
}

#[tokio::test]
async fn a_repeated_claim_of_the_execution_gets_its_lease_and_a_superseded_one_none() {
    let w = world();
    let id = w.queued("script", json!({"items": 3})).await;
    let first = w.first_run(&id, near()).await.unwrap();
    // The claim's answer was lost: the state machine runs `Run` again with the same state.
    let again = w.first_run(&id, near()).await.expect("the same execution's claim again");
    assert_eq!(lease_of(&again), lease_of(&first), "idempotent per execution");
    assert_eq!(w.job(&id).await.attempt, 1, "one attempt");

    let before = w.job(&id).await;
    let err = w
        .run(&id, &format!("{id}-0"), json!({"job_id": id}), far())
        .await
        .expect_err("a superseded execution does not claim the job");
    assert_eq!(err.name(), "Job.NotClaimable");
    assert_eq!(w.job(&id).await, before, "and changes nothing");
}

#[tokio::test]
async fn a_task_naming_no_job_id_is_answered_as_a_missing_jobs() {
    let w = world();
    let missing = JobId::new();
    let lease = json!({"attempt": 1, "token": "t"});
    for job_id in [json!(missing), json!("no-such-job")] {
        let ops = [
            json!({"op": "work", "job_id": job_id, "execution": "e", "state": {}}),
            json!({"op": "continue_as_new", "job_id": job_id, "lease": lease, "worker_arn": WORKER}),
            json!({"op": "fail", "job_id": job_id, "execution": "e",
                "error": {"Error": "Job.Fatal", "Cause": "{}"}}),
        ];
        let answers: Vec<Result<Value, &str>> = futures::future::join_all(ops.map(|op| async {
            handle(&w.deps, serde_json::from_value(op).unwrap(), far()).await.map_err(|e| e.name())
        }))
        .await;
        assert_eq!(
            answers,
            [Err("Job.NotClaimable"), Err("Job.LeaseLost"), Ok(json!({"next": "unrecorded"}))],
            "{job_id}"
        );
    }
    assert!(w.executions.started().is_empty(), "nothing started");
}

#[tokio::test]
async fn a_lease_lost_mid_run_stops_the_stale_attempt_without_writing() {
    let w = world();
    let id = w.queued("script", json!({"items": 5, "hook_at": 1})).await;
    let first = w.first_run(&id, near()).await.unwrap();
    let stale = lease_of(&first);
    let kept = w.progress(&id).checkpoint_key.clone();
    // While the stage works, the reaper takes the job for dead and re-dispatches it, and the
    // next attempt claims it (the progress record is revoked, then handed over).
    let jobs = w.jobs.clone();
    let (job, token) = (id.clone(), stale.token.clone());
    w.set_hook(async move {
        jobs.revoke_progress(&job, &token).await.unwrap();
        let redispatch =
            TransitionRequest::new(&job, &[JobStatus::Running], JobStatus::Queued, "zombie")
                .fenced(&token)
                .set("execution", format!("{job}-2"))
                .set("dispatches", 2);
        jobs.transition(redispatch).await.unwrap();
        jobs.claim(&job, &format!("{job}-2")).await.unwrap();
    });
    let err = w.run(&id, &id, first.clone(), far()).await.expect_err("the lease is gone");
    assert_eq!(err.name(), "Job.LeaseLost", "the name the state machine ends as Superseded");

    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Running, 2), "the new attempt runs on");
    assert_ne!(job.lease.as_deref(), Some(stale.token.as_str()));
    let progress = w.progress(&id);
    assert_eq!(Some(progress.lease.as_str()), job.lease.as_deref(), "the record is the new one's");
    assert_eq!((progress.items_done, progress.checkpoint_key), (1, kept), "nothing moved");
    assert!(w.keys(&results(&id)).is_empty(), "no result of the stale attempt");

    // The stale execution's next `Run` stops at once.
    let err = w.run(&id, &id, first, far()).await.expect_err("still not ours");
    assert_eq!(err.name(), "Job.LeaseLost");
    assert_eq!(w.job(&id).await, job);
}

#[tokio::test]
async fn a_cancellation_seen_at_the_next_call_ends_the_job_and_deletes_its_partial_result() {
    let w = world();
    let id = w.queued("script", json!({"items": 5, "partial": true})).await;
    let first = w.first_run(&id, near()).await.unwrap();
    assert_eq!(w.keys(&results(&id)).len(), 1, "a partial result");
    let asked = owners_cancellation();
    w.jobs.cancel(&id, &asked).await.unwrap();

    let out = w.run(&id, &id, first, far()).await.expect("the run ends cancelled");
    assert_eq!(out["run"]["next"], "cancelled");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Cancelled);
    assert_eq!(job.transitions.last().map(|t| t.reason.clone()), Some(asked.log_reason()));
    assert!(w.keys(&results(&id)).is_empty(), "the partial result is deleted");
    assert!(!w.keys(&checkpoints(&id)).is_empty(), "the checkpoints stay for a retry");
}

#[tokio::test]
async fn a_cancellation_mid_run_saves_a_final_checkpoint_and_ends_the_job() {
    let w = world();
    let id = w.queued("script", json!({"items": 5, "partial": true, "hook_at": 2})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.cancel(&job, &owners_cancellation()).await.unwrap();
    });
    let out = w.first_run(&id, far()).await.expect("the run ends cancelled");
    assert_eq!(out["run"]["next"], "cancelled");
    assert_eq!(w.job(&id).await.status, JobStatus::Cancelled);
    assert!(w.keys(&results(&id)).is_empty(), "the partial result is deleted");
    let progress = w.progress(&id);
    assert!(progress.cancel_requested_at.is_some());
    assert_eq!(progress.items_done, 3, "the write that saw the flag asked the stage to stop");
    let last = progress.checkpoint_key.expect("the final checkpoint is current");
    let saved: Value = serde_json::from_slice(&w.object(&last).await.unwrap()).unwrap();
    assert_eq!(saved["state"]["next"], 3, "where a retry of the job resumes");
}

#[tokio::test]
async fn a_retryable_failure_backs_off_to_the_next_attempt_which_resumes() {
    let w = world();
    let params = json!({"items": 3, "fail_at": 1, "fail": "retryable", "failing_attempts": 1});
    let id = w.queued("script", params).await;
    let state = w.first_run(&id, near()).await.unwrap();
    let err = w.run(&id, &id, state.clone(), far()).await.expect_err("the kind fails");
    assert_eq!(err.name(), "Job.Retryable");
    let token = lease_of(&state).lease.token;

    let before = Timestamp::from(w.clock.now());
    let out = w.record_failure(&id, &id, state.clone(), err).await.expect("recorded");
    assert_eq!(out["next"], "retry");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Queued);
    assert_eq!(job.execution.as_deref(), Some(format!("{id}-2").as_str()), "the next execution");
    assert_eq!(job.dispatches, 2);
    let retry_at = job.retry_at.expect("when the next attempt starts");
    assert_eq!(out["retry_at"], retry_at.to_rfc3339());
    assert!(before <= retry_at && retry_at.since(before) <= Duration::from_secs(61), "{retry_at}");
    let last_error = job.last_error.clone().expect("the attempt's error is kept");
    assert_eq!(
        (last_error.code.as_str(), last_error.message.as_str()),
        ("Job.Retryable", "scripted failure at 1")
    );
    assert_eq!(
        w.progress(&id).lease,
        format!("revoked:{token}"),
        "the failed attempt writes no more"
    );
    let sent = w.intake.sent();
    assert_eq!(sent.len(), 1, "the intake message starts the next attempt");
    let (message, delay, owner) = &sent[0];
    assert_eq!((message.job_id.as_str(), owner.as_str()), (id.as_str(), "alice"));
    assert!(*delay <= 61, "delayed until retry_at: {delay}");

    // A repeated `RecordFailure` (its answer lost) only sends the message again.
    let again = w
        .record_failure(
            &id,
            &id,
            state,
            StageError::Retryable(failure_message::Failure::new(PublicMessage::domain(
                "scripted failure at 1",
            ))),
        )
        .await
        .unwrap();
    assert_eq!(again["next"], "retry");
    assert_eq!(w.job(&id).await.dispatches, 2, "not scheduled twice");
    assert_eq!(w.intake.sent().len(), 2);

    // The dispatcher starts the next execution, whose claim is the second attempt.
    let out = w.run(&id, &format!("{id}-2"), json!({"job_id": id}), far()).await.unwrap();
    assert_eq!(out["run"]["next"], "done");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt, job.retry_at), (JobStatus::Succeeded, 2, None));
    let body = w.result(&id).await.expect("attempt 2's");
    let result: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(result["starts"], json!([0, 1, 1]), "it resumed where attempt 1 checkpointed");
}

#[tokio::test]
async fn a_backoffs_retry_at_counts_from_the_clock() {
    let w = world();
    // A time the machine's clock is not at: the handler reads the clock it is given (and the
    // deadline is an instant of that clock's, an hour after it).
    let now: Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(now.as_datetime());
    let params = json!({"items": 3, "fail_at": 1, "fail": "retryable"});
    let id = w.queued("script", params).await;
    let err = w.first_run(&id, w.clock.instant() + Duration::from_secs(3_600)).await.unwrap_err();
    let out = w.record_failure(&id, &id, json!({"job_id": id}), err).await.expect("recorded");
    assert_eq!(out["next"], "retry");
    let retry_at = w.job(&id).await.retry_at.expect("when the next attempt starts");
    assert!(now <= retry_at && retry_at.since(now) <= Duration::from_secs(60), "{retry_at}");
    let (_, delay, _) = &w.intake.sent()[0];
    assert_eq!(
        *delay,
        longhaul_domain::schedule::sqs_delay(retry_at.as_datetime(), now.as_datetime()),
        "delayed until retry_at, by the clock"
    );
}

#[tokio::test]
async fn a_results_expiry_and_the_progress_stamps_count_from_the_clock() {
    let w = world();
    let now: Timestamp = "2031-02-03T04:05:06.789Z".parse().unwrap();
    w.clock.set(now.as_datetime());
    let id = w.queued("demo", json!({"items": 3})).await;
    let out = w.first_run(&id, w.clock.instant() + Duration::from_secs(3_600)).await.unwrap();
    assert_eq!(out["run"]["next"], "done");
    let (bucket, expires) = w.jobs.index_entry(&id).expect("indexed at its result's expiry");
    assert!(bucket.starts_with("succeeded#"), "{bucket}");
    let ttl = chrono::Duration::from_std(ResultTtl::DEFAULT).unwrap();
    assert_eq!(expires, longhaul_domain::format_rfc3339(now.as_datetime() + ttl));
    let progress = w.progress(&id);
    assert_eq!((progress.heartbeat_at, progress.updated_at), (now, now));
}

/// A claimed `script` job and a context of its stage `stage_index` (1: count, 2: report) as an
/// invocation starting from `progress` sees it.
async fn claimed_script(w: &World) -> (JobId, Lease, JobRecord) {
    let id = w.queued("script", json!({"items": 10})).await;
    let (lease, job) = w.deps.jobs.claim(&id, id.as_str()).await.unwrap();
    (id, lease, job)
}

fn script_run() -> crate::engine::KindRun {
    crate::engine::KindRun {
        inputs: Vec::new(),
        cadence: longhaul_worker::Cadence { items: 1_000, interval: Duration::from_secs(60) },
        weights: &[],
        stage_timeout: Duration::from_secs(900),
    }
}

const SCRIPT_STAGES: &[&str] = &["count", "report"];

#[tokio::test]
async fn a_superseded_checkpoint_is_deleted_once_the_pointer_moved_so_one_is_left_by_key() {
    let w = world();
    let (id, lease, job) = claimed_script(&w).await;
    let run = script_run();
    let progress = w.progress_or_new(&id);
    let mut ctx =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    assert!(ctx.leftovers().is_empty(), "no checkpoint yet: nothing to delete");
    for done in 1..=3 {
        ctx.checkpoint(1, &json!({"next": done}), done, Some(10)).await.unwrap();
        let current = w.progress(&id).checkpoint_key.expect("current");
        assert_eq!(
            w.keys(&checkpoints(&id)),
            std::slice::from_ref(&current),
            "only the current one is kept"
        );
        assert_eq!(ctx.leftovers(), [current]);
    }
    assert_eq!(w.objects.deletes(), 2, "each superseded checkpoint, by key");
    // Across the boundary the previous stage's output stays current, until the next stage's
    // own first checkpoint supersedes it.
    let carried = w.progress(&id).checkpoint_key.unwrap();
    ctx.advance("report").await.unwrap();
    drop(ctx);
    let progress = w.progress(&id);
    let mut ctx =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    let _: Value = ctx.carried("count", 1).await.expect("the count stage's output");
    let staged = ctx.stage_file("report.json", "application/json", b"{}".to_vec()).await.unwrap();
    ctx.checkpoint(1, &json!({"staged": staged}), 1, Some(1)).await.unwrap();
    assert_eq!(w.object(&carried).await, None, "superseded by the report stage's own");
    let current = w.progress(&id).checkpoint_key.unwrap();
    ctx.publish(&staged).await.unwrap();
    assert_eq!(ctx.leftovers(), [current, staged.location().to_owned()]);
    assert_eq!(w.objects.lists(), 0, "nothing was listed");
}

#[tokio::test]
async fn a_retried_jobs_checkpoint_it_started_from_is_never_deleted_nor_left_to_delete() {
    let w = world();
    let (id, lease, job) = claimed_script(&w).await;
    let retried = JobId::new();
    let theirs =
        format!("{}count/00000000000000000003.a1.0123456789ab.json", checkpoints(&retried));
    w.objects.insert(&theirs, br#"{"schema_version":1,"stage":"count","attempt":1,"written_at":"2025-01-01T00:00:00Z","state":{"next":4}}"#, "application/json");
    let progress = ProgressRecord {
        stage_index: 1,
        checkpoint_key: Some(theirs.clone()),
        ..w.progress_or_new(&id)
    };
    let run = script_run();
    let mut ctx =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    assert!(ctx.leftovers().is_empty(), "the retried job's checkpoint is not this job's to delete");
    let resumed: Option<Value> = ctx.resume(1).await.unwrap();
    assert_eq!(resumed, Some(json!({"next": 4})), "it resumes from it");
    ctx.checkpoint(1, &json!({"next": 5}), 5, Some(10)).await.unwrap();
    assert!(w.object(&theirs).await.is_some(), "superseded, but the retried job's: kept");
    assert_eq!(ctx.leftovers(), [w.progress(&id).checkpoint_key.unwrap()]);
}

#[tokio::test]
async fn a_retry_publishes_the_retried_jobs_staged_file_and_no_one_elses() {
    let w = world();
    let (id, lease, mut job) = claimed_script(&w).await;
    let (retried, stranger) = (JobId::new(), JobId::new());
    job.retry_of = Some(retried.clone());
    let staged_by = |of: &JobId| {
        let key = format!("{}report/report.json.a1", checkpoints(of));
        w.objects.insert(&key, b"{}", "application/json");
        longhaul_worker::StagedFile::from_host(key, "application/json".into(), "report.json".into())
    };
    let (theirs, strangers) = (staged_by(&retried), staged_by(&stranger));
    let progress = w.progress_or_new(&id);
    let run = script_run();
    let mut ctx =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    // The failed job's publish stage, retried: its render's staged report is published.
    ctx.publish(&theirs).await.expect("the retried job's staged file");
    assert!(w.object(theirs.location()).await.is_some(), "copied, not moved");
    let err = ctx.publish(&strangers).await.expect_err("another job's");
    assert_eq!(err.public.as_str(), "the job kind named a staged file of another job");
}

#[tokio::test]
async fn a_duplicate_invocation_finding_its_checkpoint_superseded_stops_without_failing_the_job() {
    let w = world();
    let (id, lease, job) = claimed_script(&w).await;
    let run = script_run();
    let progress = w.progress_or_new(&id);
    let mut first =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    first.checkpoint(1, &json!({"next": 4}), 4, Some(10)).await.unwrap();
    first.advance("report").await.unwrap();
    drop(first);
    // Two invocations of the attempt start the report stage from the same record.
    let progress = w.progress(&id);
    let mut ahead =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    let mut behind =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    let _: Value = ahead.carried("count", 1).await.unwrap();
    ahead.checkpoint(1, &json!({"rendered": true}), 1, Some(1)).await.unwrap();
    let err = behind.carried::<Value>("count", 1).await.expect_err("its input was superseded");
    assert_eq!(err.name(), "Job.LeaseLost", "{err}: not a fatal error that would fail the job");
    // The same when what it resumes was superseded by a newer checkpoint of the stage.
    let progress = w.progress(&id);
    let mut behind =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    ahead.checkpoint(1, &json!({"rendered": 2}), 1, Some(1)).await.unwrap();
    let err = behind.resume::<Value>(1).await.expect_err("superseded");
    assert_eq!(err.name(), "Job.LeaseLost", "{err}");
    // A current checkpoint missing for another reason: the stage restarts, as before.
    let current = w.progress(&id).checkpoint_key.unwrap();
    w.objects.delete(&current).await.unwrap();
    let progress = w.progress(&id);
    let mut alone =
        crate::engine::Ctx::new(&w.deps, &job, &lease, SCRIPT_STAGES, &progress, far(), &run);
    assert_eq!(alone.resume::<Value>(1).await.unwrap(), None, "restarts the stage");
}

#[tokio::test]
async fn the_deadline_and_the_progress_heartbeat_and_checkpoint_cadence_follow_the_clock() {
    let w = world_with(|deps| {
        deps.progress_interval = Duration::from_secs(2);
        deps.heartbeat_interval = Duration::from_secs(30);
        deps.checkpoint_interval = Some(Duration::from_secs(60));
    });
    let id = w.queued("script", json!({"items": 10})).await;
    let (lease, job) = w.deps.jobs.claim(&id, id.as_str()).await.unwrap();
    let run = crate::engine::KindRun {
        inputs: Vec::new(),
        cadence: longhaul_worker::Cadence { items: 1_000, interval: Duration::from_secs(60) },
        weights: &[],
        stage_timeout: Duration::from_secs(900),
    };
    // The Lambda deadline 90 s after the clock's now: with the 30 s margin, the stage is to
    // stop 60 s in.
    let deadline = w.clock.instant() + Duration::from_secs(90);
    let progress = w.progress_or_new(&id);
    let mut ctx =
        crate::engine::Ctx::new(&w.deps, &job, &lease, &["count"], &progress, deadline, &run);
    let seq = progress.seq;
    ctx.progress(1, Some(10)).await.unwrap();
    assert!(w.jobs.progress(&id).is_none(), "no write within the progress interval");
    w.clock.advance(Duration::from_secs(2));
    ctx.progress(2, Some(10)).await.unwrap();
    let written = w.progress(&id);
    assert_eq!((written.seq, written.items_done), (seq + 1, 2), "written once it passed");
    assert_eq!(written.heartbeat_at, Timestamp::from(w.clock.now()));
    ctx.heartbeat(2, Some(10)).await.unwrap();
    assert_eq!(w.progress(&id).seq, seq + 1, "no heartbeat right after a write");
    w.clock.advance(Duration::from_secs(30));
    ctx.heartbeat(2, Some(10)).await.unwrap();
    assert_eq!(w.progress(&id).seq, seq + 2, "a heartbeat once the interval passed");
    assert!(!ctx.checkpoint_due(2) && !ctx.deadline_near(), "32 s in");
    w.clock.advance(Duration::from_secs(28));
    assert!(ctx.checkpoint_due(2), "60 s since the last checkpoint");
    assert!(ctx.deadline_near(), "within the margin of the deadline");
}

#[tokio::test]
async fn a_retryable_failure_with_the_attempts_spent_fails_the_job_with_its_reason() {
    let w = world_with(|deps| deps.max_attempts = Some(1));
    let id = w.queued("script", json!({"items": 3, "fail_at": 1, "fail": "retryable"})).await;
    let err = w.first_run(&id, far()).await.unwrap_err();
    let out = w.record_failure(&id, &id, json!({"job_id": id}), err).await.expect("recorded");
    assert_eq!(out, json!({"next": "failed"}));
    assert_eq!(w.failed_with(&id).await, ("Job.Retryable".into(), "scripted failure at 1".into()));
    assert!(w.intake.sent().is_empty(), "no next attempt");
}

#[tokio::test]
async fn a_fatal_failure_fails_the_job_at_once_with_its_reason() {
    let w = world();
    let id = w.queued("script", json!({"items": 3, "fail_at": 2, "fail": "fatal"})).await;
    let err = w.first_run(&id, far()).await.unwrap_err();
    assert_eq!(err.name(), "Job.Fatal", "the state machine does not retry it");
    let out = w.record_failure(&id, &id, json!({"job_id": id}), err).await.unwrap();
    assert_eq!(out, json!({"next": "failed"}));
    assert_eq!(w.failed_with(&id).await, ("Job.Fatal".into(), "scripted failure at 2".into()));
    assert!(w.intake.sent().is_empty(), "attempts remain, but a fatal error is not retried");
}

#[tokio::test]
async fn a_kind_or_stage_the_worker_cannot_run_is_fatal_and_says_which() {
    let w = world();
    let id = w.queued("nope", json!({})).await;
    let err = w.first_run(&id, far()).await.unwrap_err();
    let unknown = "job type \"nope\" is not known to this worker";
    assert_eq!((err.name(), err.public_message().as_str()), ("Job.Fatal", unknown));
    let out = w.record_failure(&id, &id, json!({"job_id": id}), err).await.unwrap();
    assert_eq!(out, json!({"next": "failed"}));
    assert_eq!(w.failed_with(&id).await, ("Job.Fatal".into(), unknown.into()));

    // Params the kind no longer accepts.
    let id = w.queued("script", json!({"items": "many"})).await;
    let err = w.first_run(&id, far()).await.unwrap_err();
    assert_eq!(err.name(), "Job.Fatal");
    assert!(err.public_message().starts_with("invalid params: "), "{}", err.public_message());

    // A retry whose seeded record has it at the report stage, but the count stage left no
    // output.
    let resumed_from = ResumedFrom { job_id: JobId::new(), stage: "report".into(), items_done: 0 };
    let retry = JobRecord {
        job_type: "script".into(),
        params: json!({"items": 3}),
        resumed_from: Some(resumed_from),
        ..pending_job(&owner("alice"), Timestamp::now())
    };
    let id = w.queued_record(retry).await;
    let seeded = ProgressRecord { stage: "report".into(), stage_index: 2, ..Default::default() };
    w.jobs.seed_progress(&id, &seeded).await.unwrap();
    let err = w.first_run(&id, far()).await.unwrap_err();
    assert_eq!(err.name(), "Job.Fatal");
    assert_eq!(err.public_message(), "the count stage's output is missing");

    // A task the state machine does not have.
    let bogus = json!({"op": "rewind", "job_id": id});
    assert!(serde_json::from_value::<StageInput>(bogus).is_err(), "no such op");
}

#[tokio::test]
async fn a_failing_table_or_bucket_is_a_retryable_error_never_a_silent_success() {
    let w = world();
    let id = w.queued("script", json!({"items": 3})).await;
    let queued = w.job(&id).await;
    w.jobs.set_unavailable(true);
    let err = w.first_run(&id, far()).await.expect_err("the claim fails");
    assert_eq!(err.name(), "Job.Retryable");
    assert_eq!(err.public_message(), "the job's record could not be read or updated");
    let recorded = w.record_failure(&id, &id, json!({"job_id": id}), StageError::Cancelled).await;
    assert_eq!(recorded.expect_err("nothing is recorded blind").name(), "Job.Retryable");
    w.jobs.set_unavailable(false);
    assert_eq!(w.job(&id).await, queued, "nothing changed");

    let first = w.first_run(&id, near()).await.unwrap();
    w.objects.set_unavailable(true);
    let err =
        w.run(&id, &id, first.clone(), far()).await.expect_err("the checkpoint is unreadable");
    assert_eq!(err.name(), "Job.Retryable");
    w.objects.set_unavailable(false);
    w.jobs.set_unavailable(true);
    let err = w.run(&id, &id, first.clone(), far()).await.expect_err("the job is unreadable");
    assert_eq!(err.name(), "Job.Retryable");
    let continued = json!({"op": "continue_as_new", "job_id": id, "lease": first["lease"],
        "worker_arn": WORKER});
    let err = handle(&w.deps, serde_json::from_value(continued).unwrap(), far()).await;
    assert_eq!(err.expect_err("not continued blind").name(), "Job.Retryable");
    w.jobs.set_unavailable(false);
    assert!(w.executions.started().is_empty());
    assert_eq!(w.job(&id).await.status, JobStatus::Running);

    // The backoff's message cannot be sent: the task fails (and is retried), and its retry
    // sends it.
    let w = world();
    let id = w.queued("script", json!({"items": 3, "fail_at": 1, "fail": "retryable"})).await;
    let state = w.first_run(&id, near()).await.unwrap();
    let err = w.run(&id, &id, state.clone(), far()).await.unwrap_err();
    w.intake.set_unavailable(true);
    let failed = w.record_failure(&id, &id, state.clone(), err).await;
    assert_eq!(failed.expect_err("the message is not sent").name(), "Job.Retryable");
    assert_eq!(w.job(&id).await.status, JobStatus::Queued);
    w.intake.set_unavailable(false);
    let err = StageError::Retryable(failure_message::Failure::new(PublicMessage::domain("x")));
    let out = w.record_failure(&id, &id, state, err).await.expect("the retry sends it");
    assert_eq!(out["next"], "retry");
    assert_eq!(w.intake.sent().len(), 1);
}

#[tokio::test]
async fn continue_as_new_starts_the_next_execution_with_the_same_lease() {
    let w = world_with(|deps| deps.runs_per_execution = 1);
    let id = w.queued("script", json!({"items": 3})).await;
    let out = w.first_run(&id, near()).await.unwrap();
    assert_eq!(out["run"]["next"], "continue_as_new", "the execution's history nears its cap");
    let lease = lease_of(&out);

    let input = json!({"op": "continue_as_new", "job_id": id, "lease": out["lease"],
        "worker_arn": WORKER});
    let answer = handle(&w.deps, serde_json::from_value(input).unwrap(), far()).await.unwrap();
    let name = format!("{id}.a1c1");
    assert_eq!(answer, json!({"execution": name}));
    let started = w.executions.started();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].name, name);
    let next = started[0].input.clone();
    assert_eq!(
        (next["job_id"].as_str(), next["worker_arn"].as_str()),
        (Some(id.as_str()), Some(WORKER))
    );
    assert_eq!(lease_of(&next), lease, "the same lease");
    assert_eq!(next["run"]["next"], "start");
    let job = w.job(&id).await;
    assert_eq!((job.execution.as_deref(), job.continuations), (Some(name.as_str()), 1));

    // The new execution's `Run` goes on under the lease: no claim, the same attempt.
    let done = w.run(&id, &name, next, far()).await.expect("it runs on");
    assert_eq!(done["run"]["next"], "done");
    assert_eq!(lease_of(&done), lease);
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1));
    let body = w.result(&id).await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["starts"], json!([0, 1]));

    // A continuation under a lease that no longer holds the job starts nothing.
    let stale = json!({"op": "continue_as_new", "job_id": id,
        "lease": {"attempt": 1, "token": "stale"}, "worker_arn": WORKER});
    let err = handle(&w.deps, serde_json::from_value(stale).unwrap(), far()).await.unwrap_err();
    assert_eq!(err.name(), "Job.LeaseLost");
    assert_eq!(w.executions.started().len(), 1);
}

mod compensation;
mod direct;
mod fan_out;
mod pause;
mod stage_timeout;

/// A fanned-out stage's shard counts: every shard done once the job succeeded (recorded with
/// the success, which its view shows over the last progress write).
#[tokio::test]
async fn a_fanned_out_jobs_success_records_every_shard_done() {
    let w = world();
    let id = w.queued("demo", json!({"items": 8, "shards": 4})).await;
    let out = w.first_run(&id, far()).await.expect("the run succeeds");
    assert_eq!(out["run"]["next"], "done");
    let end = w.job(&id).await.ended_at_stage.expect("where it ended");
    let shards = longhaul_domain::progress::ShardCounts {
        total: 4,
        pending: 0,
        running: 0,
        succeeded: 4,
        failed: 0,
        attempts: 4,
    };
    assert_eq!(end.shards, Some(shards), "each shard ran once");
}

/// A shard that fails fatally is written at once (the stage fails with it), ahead of the
/// progress interval: the failed job shows which of its shards stood where.
#[tokio::test]
async fn a_shard_that_fails_fatally_is_recorded_before_the_job_fails() {
    let w = world();
    // Shard 1 of 2 covers items 4..8: it fails at item 5.
    let params = json!({"items": 8, "shards": 2, "fail_at": 5, "fail_kind": "fatal"});
    let id = w.queued("demo", params).await;
    let err = w.first_run(&id, far()).await.unwrap_err();
    assert_eq!(err.name(), "Job.Fatal");
    let shards = w.progress(&id).shards.expect("written with the failure");
    assert_eq!((shards.total, shards.failed, shards.running), (2, 1, 0), "{shards:?}");
    assert_eq!(shards.pending + shards.succeeded + shards.failed, 2, "{shards:?}");
    w.record_failure(&id, &id, json!({"job_id": id}), err).await.unwrap();
    let view = w.jobs.view(&id).await.unwrap().unwrap();
    assert_eq!(view.shown_progress().shards, Some(shards), "the failed job shows them");
}
