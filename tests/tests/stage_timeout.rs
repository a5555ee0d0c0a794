//! A kind's stage timeout on the local stack: `demo`'s is set to 4 s (`JobPolicyOverrides`,
//! with 2 attempts) and every stage invocation works ~1 s (`LONGHAUL_STAGE_MARGIN_SECONDS` =
//! the function's timeout − 1), so a job of slow items runs its stage over several
//! invocations — its direct run's, then its execution's — and the stage's clock, carried across
//! them, runs out in each attempt. Its own test binary, so these settings touch no other test.

use std::time::Duration;

use longhaul_tests::{Api, Aws, Harness, harness_with, principal};
use serde_json::json;

/// `demo`'s stage timeout here: four times an invocation's work (1 s), so each attempt's
/// direct run hands its stage over to an execution before the clock runs out, even on a
/// machine slowed by other work.
const STAGE_TIMEOUT: Duration = Duration::from_secs(4);
/// `demo`'s attempts here.
const ATTEMPTS: u64 = 2;
/// The job's items, each this long: work that two attempts cannot finish within their stage
/// timeouts, however fast the machine (the items' sleeps alone take longer; the first attempt
/// ends within a progress write of its timeout, and the second resumes from its checkpoint).
const ITEMS: u64 = 120;
const ITEM_MS: u64 = 100;
/// The longest the job may stand still before the test gives up: an invocation (1 s), a
/// backoff (the local stack's step, 1 s) or a stage timeout, many times over.
const STILL_FOR: Duration = Duration::from_secs(30 * STAGE_TIMEOUT.as_secs());

fn stack() -> &'static Harness {
    let overrides = json!({"demo": {
        "stage_timeout_seconds": STAGE_TIMEOUT.as_secs(),
        "max_attempts": ATTEMPTS,
    }});
    harness_with(&[
        ("LONGHAUL_POLICY_OVERRIDES", overrides.to_string().as_str()),
        ("LONGHAUL_STAGE_MARGIN_SECONDS", "899"),
    ])
}

#[tokio::test]
async fn a_stage_past_its_timeout_is_retried_then_fails_the_job_saying_so() {
    stack();
    const { assert!(ITEMS * ITEM_MS >= 3 * 1_000 * STAGE_TIMEOUT.as_secs()) };
    let api = Api::new(&principal("stage-timeout"));
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": ITEMS, "item_ms": ITEM_MS}})).await;
    let job = api.wait_terminal(&job_id, STILL_FOR).await;
    let message =
        format!("stage `process` ran past its {} s stage timeout", STAGE_TIMEOUT.as_secs());
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["attempt"], ATTEMPTS, "retried until its attempts were spent: {job}");
    assert_eq!(
        (job["error"]["code"].as_str(), job["error"]["message"].as_str()),
        (Some("Job.StageTimeout"), Some(message.as_str())),
        "{job}"
    );
    let retried: Vec<&str> = job["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "queued")
        .filter_map(|t| t["reason"].as_str())
        .filter(|reason| reason.starts_with("attempt "))
        .collect();
    let reason = format!("attempt 1 of {ATTEMPTS} failed (Job.StageTimeout: {message})");
    assert!(
        retried.len() == 1 && retried[0].starts_with(&reason),
        "the first attempt was retried after its backoff: {retried:?}"
    );

    // The direct run of each attempt works a quarter of the stage timeout and hands the job over: the
    // stage times out in the execution, whose `Run` does not retry it but ends the attempt.
    let aws = Aws::new().await;
    let executions = aws.executions_named(job_id.as_str()).await;
    assert!(!executions.is_empty(), "the attempts continued in executions");
    for execution in &executions {
        let entered = aws.states_entered(execution).await;
        let runs = |states: &[String]| states.iter().filter(|s| *s == "Run").count();
        assert_eq!(
            runs(&aws.scheduled_tasks(execution).await),
            runs(&entered),
            "no `Run` retried within the attempt: {execution} {entered:?}"
        );
        let last_run = entered.iter().rposition(|s| s == "Run").expect("a `Run`");
        assert_eq!(
            entered.get(last_run + 1).map(String::as_str),
            Some("RecordFailure"),
            "the attempt ended in `RecordFailure`: {execution} {entered:?}"
        );
    }
}
