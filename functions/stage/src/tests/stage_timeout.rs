//! A stage's timeout: counted by the clock from when the attempt started the stage, across the
//! invocations that continue it; a stage past it ends the attempt with `Job.StageTimeout`
//! (at its next progress write, or before its next invocation runs it), which is retried in a
//! new attempt — whose clock starts afresh — until the job's attempts are spent. Nothing
//! sleeps: the tests move the world's clock.

use super::*;

use longhaul_aws::jobs::StageClock;
use longhaul_aws::runs::DirectRun;
use longhaul_domain::policy::JobPolicy;

/// The stage timeout of the tests' jobs.
const TIMEOUT: Duration = Duration::from_secs(900);

/// What a job whose `count` stage ran past [`TIMEOUT`] is told.
const TIMED_OUT: &str = "stage `count` ran past its 900 s stage timeout";

/// A policy with [`TIMEOUT`] as its stage timeout, as submit stores it on a job.
fn policy() -> JobPolicy {
    JobPolicy { stage_timeout_seconds: TIMEOUT.as_secs(), ..JobPolicy::default() }
}

/// A context of the claimed `script` job `job` (see `claimed_script`) as an invocation starting
/// from `progress` sees it, its stage timeout [`TIMEOUT`].
fn timed_ctx<'a>(
    w: &'a World,
    job: &'a JobRecord,
    lease: &'a Lease,
    progress: &ProgressRecord,
) -> crate::engine::Ctx<'a> {
    let run = crate::engine::KindRun { stage_timeout: TIMEOUT, ..script_run() };
    crate::engine::Ctx::new(&w.deps, job, lease, SCRIPT_STAGES, progress, far(), &run)
}

impl World {
    /// A `script` job with `params` and a stage timeout of [`TIMEOUT`], queued.
    async fn timed(&self, params: Value) -> JobId {
        self.queued_with_policy("script", params, Some(policy())).await
    }

    /// A hook (see `Script`'s `hook_at`) that moves the clock on by `by` while the stage works.
    fn clock_moves_on(&self, by: Duration) {
        let clock = self.clock.clone();
        self.set_hook(async move { clock.advance(by) });
    }

    /// The stage clock on the job's progress record.
    fn stage_clock(&self, id: &JobId) -> StageClock {
        self.progress(id).stage_clock.expect("the stage's clock is kept on the record")
    }
}

#[tokio::test]
async fn a_stage_whose_clock_passes_its_timeout_between_two_writes_ends_the_attempt_and_is_retried()
{
    let w = world();
    let id = w.timed(json!({"items": 5, "hook_at": 2})).await;
    let started = Timestamp::from(w.clock.now());
    w.clock_moves_on(TIMEOUT);
    let err = w.first_run(&id, far()).await.expect_err("the stage ran past its timeout");
    assert_eq!(
        (err.name(), err.public_message().as_str()),
        ("Job.StageTimeout", TIMED_OUT),
        "a transient failure the state machine ends the attempt with"
    );
    let progress = w.progress(&id);
    assert_eq!(progress.items_done, 2, "the write past the timeout was not made");
    assert_eq!(
        w.stage_clock(&id),
        StageClock { attempt: 1, stage_index: 1, resumes: 0, started_at: started },
        "counted from when the attempt started the stage"
    );

    // `RecordFailure` counts the attempt and schedules the next one, as for `Job.Retryable`.
    let state = json!({"job_id": id});
    let out = w.record_failure(&id, &id, state, err).await.expect("recorded");
    assert_eq!(out["next"], "retry");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Queued, 1));
    let last_error = job.last_error.expect("why the attempt ended");
    assert_eq!(
        (last_error.code.as_str(), last_error.message.as_str()),
        ("Job.StageTimeout", TIMED_OUT)
    );
    assert_eq!(w.intake.sent().len(), 1, "the next attempt is dispatched after its backoff");

    // The next attempt's clock starts afresh, long after the first attempt's ran out.
    let retried = w.clock.now();
    let out = w.run(&id, &format!("{id}-2"), json!({"job_id": id}), far()).await;
    assert_eq!(out.expect("the next attempt runs")["run"]["next"], "done");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 2));
    assert_eq!(w.progress(&id).stage_clock.map(|c| c.attempt), Some(2));
    assert!(
        w.progress(&id).stage_clock.is_some_and(|c| c.started_at >= Timestamp::from(retried)),
        "the retry's own clock"
    );
}

#[tokio::test]
async fn a_stage_within_its_timeout_runs_on() {
    let w = world();
    let id = w.timed(json!({"items": 5, "hook_at": 2})).await;
    w.clock_moves_on(TIMEOUT - Duration::from_secs(1));
    let out = w.first_run(&id, far()).await.expect("a second short of the timeout");
    assert_eq!(out["run"]["next"], "done");
    assert_eq!(w.job(&id).await.status, JobStatus::Succeeded);
}

#[tokio::test]
async fn the_clock_carries_across_the_invocations_that_continue_the_stage() {
    let w = world();
    let id = w.timed(json!({"items": 5})).await;
    let started = Timestamp::from(w.clock.now());
    let first = w.first_run(&id, near()).await.expect("paused at the deadline");
    assert_eq!(first["run"]["next"], "continue");
    let clock = StageClock { attempt: 1, stage_index: 1, resumes: 0, started_at: started };
    assert_eq!(w.stage_clock(&id), clock);

    // The next invocation counts on from the same start.
    w.clock.advance(TIMEOUT / 2);
    let second = w.run(&id, &id, first, near()).await.expect("within the timeout");
    assert_eq!(second["run"]["next"], "continue");
    assert_eq!((w.stage_clock(&id), w.progress(&id).items_done), (clock, 2), "still the same");

    // Past it in all, though each invocation was short: the next one does not run the stage.
    w.clock.advance(TIMEOUT / 2);
    let before = w.progress(&id);
    let err = w.run(&id, &id, second.clone(), far()).await.expect_err("timed out");
    assert_eq!((err.name(), err.public_message().as_str()), ("Job.StageTimeout", TIMED_OUT));
    assert_eq!(w.progress(&id), before, "the stage did not run");

    // The same across a continuation in a new execution (same lease, same attempt).
    let input = json!({"op": "continue_as_new", "job_id": id, "lease": second["lease"],
        "worker_arn": WORKER});
    let answer = handle(&w.deps, serde_json::from_value(input).unwrap(), far()).await.unwrap();
    let next = w.executions.started()[0].input.clone();
    let name = answer["execution"].as_str().expect("the next execution").to_owned();
    let err = w.run(&id, &name, next, far()).await.expect_err("still timed out");
    assert_eq!(err.name(), "Job.StageTimeout");
}

#[tokio::test]
async fn each_stage_has_its_own_clock() {
    let w = world();
    let (id, lease, job) = claimed_script(&w).await;
    let mut ctx = timed_ctx(&w, &job, &lease, &w.progress_or_new(&id));
    ctx.checkpoint(1, &json!({"next": 10, "starts": [0]}), 10, Some(10)).await.unwrap();
    w.clock.advance(TIMEOUT - Duration::from_secs(100));
    let boundary = Timestamp::from(w.clock.now());
    ctx.advance("report").await.expect("the count stage finished within its timeout");
    drop(ctx);
    assert_eq!(
        w.stage_clock(&id),
        StageClock { attempt: 1, stage_index: 2, resumes: 0, started_at: boundary },
        "the report stage's clock starts at the boundary"
    );
    // Past the count stage's start by more than the timeout, not the report stage's.
    w.clock.advance(TIMEOUT - Duration::from_secs(100));
    let mut ctx = timed_ctx(&w, &job, &lease, &w.progress(&id));
    ctx.check_stage_timeout().expect("the report stage is within its own");
    ctx.progress(0, Some(1)).await.expect("written");
    w.clock.advance(Duration::from_secs(100));
    let err = ctx.heartbeat(0, Some(1)).await.expect_err("a heartbeat write past it");
    assert_eq!(err.public_message(), "stage `report` ran past its 900 s stage timeout");
}

#[tokio::test]
async fn a_clock_of_an_earlier_attempt_or_from_before_it_was_kept_starts_afresh() {
    let w = world();
    let (id, lease, job) = claimed_script(&w).await;
    let long_ago: Timestamp = "2020-01-01T00:00:00Z".parse().unwrap();
    let now = Timestamp::from(w.clock.now());
    let earlier =
        StageClock { attempt: lease.attempt - 1, stage_index: 1, resumes: 0, started_at: long_ago };
    for kept in [Some(earlier), None] {
        let progress =
            ProgressRecord { stage_index: 1, stage_clock: kept, ..w.progress_or_new(&id) };
        let mut ctx = timed_ctx(&w, &job, &lease, &progress);
        ctx.check_stage_timeout().expect("a clock of its own, from now");
        ctx.progress(1, Some(10)).await.expect("written");
        assert_eq!(
            w.stage_clock(&id),
            StageClock { attempt: lease.attempt, stage_index: 1, resumes: 0, started_at: now },
            "{kept:?}"
        );
    }
}

#[tokio::test]
async fn after_the_last_attempt_the_job_fails_saying_which_stage_and_what_timeout() {
    let w = world_with(|deps| deps.max_attempts = Some(2));
    let id = w.timed(json!({"items": 5, "hook_at": 1})).await;
    w.clock_moves_on(TIMEOUT);
    let err = w.first_run(&id, far()).await.expect_err("attempt 1 times out");
    let out = w.record_failure(&id, &id, json!({"job_id": id}), err).await.unwrap();
    assert_eq!(out["next"], "retry");

    let second = format!("{id}-2");
    w.clock_moves_on(TIMEOUT);
    let err = w.run(&id, &second, json!({"job_id": id}), far()).await.expect_err("so does 2");
    assert_eq!(err.name(), "Job.StageTimeout");
    let out = w.record_failure(&id, &second, json!({"job_id": id}), err).await.unwrap();
    assert_eq!(out, json!({"next": "failed"}), "the attempts are spent");
    assert_eq!(w.failed_with(&id).await, ("Job.StageTimeout".to_owned(), TIMED_OUT.to_owned()));
    assert_eq!(w.intake.sent().len(), 1, "no third attempt");
}

#[tokio::test]
async fn a_direct_run_past_its_stage_timeout_ends_the_attempt_itself() {
    let w = world();
    let id = w.timed(json!({"items": 5, "hook_at": 2})).await;
    w.clock_moves_on(TIMEOUT);
    let run = DirectRun::new(&id, id.as_str(), WORKER);
    let payload = serde_json::from_value(run.payload()).unwrap();
    let out = handle(&w.deps, payload, far()).await.expect("recorded by the run");
    assert_eq!(
        (out["outcome"].as_str(), out["recorded"]["next"].as_str()),
        (Some("retry_scheduled"), Some("retry"))
    );
    assert!(w.executions.started().is_empty(), "no execution to retry it within the attempt");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Queued);
    assert_eq!(job.last_error.map(|e| e.code), Some("Job.StageTimeout".to_owned()));
    assert_eq!(w.intake.sent().len(), 1, "the next attempt is dispatched");
}

#[test]
fn the_state_machine_ends_the_attempt_at_a_stage_timeout_without_retrying_it_within() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../infra/statemachine/job.asl.json");
    let asl: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let run = &asl["States"]["Run"];
    let name = StageError::stage_timeout("s", TIMEOUT, "").name();
    // The first of `Retry` or `Catch` whose `ErrorEquals` matches it, as Step Functions picks.
    let first_matching = |field: &str| -> Value {
        let matchers = run[field].as_array().unwrap();
        matchers
            .iter()
            .find(|m| {
                let names = m["ErrorEquals"].as_array().unwrap();
                names.iter().any(|n| n == name || n == "States.ALL")
            })
            .cloned()
            .unwrap_or_else(|| panic!("no {field} matches {name}"))
    };
    let retrier = first_matching("Retry");
    assert_eq!(
        (
            retrier["ErrorEquals"].as_array().unwrap().contains(&name.into()),
            &retrier["MaxAttempts"]
        ),
        (true, &json!(0)),
        "not retried within the attempt: {retrier}"
    );
    let catcher = first_matching("Catch");
    assert_eq!(catcher["Next"], "RecordFailure", "which schedules the next attempt");
}
