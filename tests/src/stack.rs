//! The stack's own moves: its schedules fired now, its job table seeded, a worker killed.

use super::*;

/// Runs the local stack's schedule `schedule` (`reaper`, `expirer`) once, now, and returns its
/// report; panics unless the run succeeded.
pub async fn fire(schedule: &str) -> Value {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/schedules/{schedule}", harness().stack.api_url))
        .send()
        .await
        .expect("the schedule endpoint answers");
    assert_eq!(reply.status(), 200, "the {schedule} run failed");
    reply.json::<Value>().await.expect("a run's report is JSON")
}

/// Fires the schedule `schedule` (see [`fire`]) until `done` holds for the job `job_id` of
/// `api`, and answers the job; panics, naming `what` it waited for, once `limit` has passed (a
/// limit derived, with a wide margin, from the thresholds the schedule waits out).
pub async fn fire_until(
    api: &Api,
    job_id: &JobId,
    schedule: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Deadline::new(format!("{what} of job {job_id} (firing the {schedule})"), limit);
    loop {
        fire(schedule).await;
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        if done(&job) {
            return job;
        }
        deadline.tick(Duration::from_millis(250), job).await;
    }
}

/// A `pending` `demo` job record of `owner`, accepted at `created_at`, as submit stores it —
/// for tests that seed the table directly ([`longhaul_memory::contract::pending_job`]).
pub fn seeded_job(owner: &Owner, created_at: String) -> longhaul_aws::jobs::JobRecord {
    let at: longhaul_domain::Timestamp = created_at.parse().expect("a seeded job's creation time");
    longhaul_memory::contract::pending_job(owner, at)
}

/// The job table's adapter, on this binary's stack (direct to the emulator, uncounted).
pub async fn job_store() -> longhaul_aws::jobs::JobStore {
    longhaul_aws::jobs::JobStore::new(
        Aws::new().await.dynamodb.clone(),
        harness().stack.resource("JobsTable"),
    )
}

/// The job's worker dies for good: its execution (if an execution took the job over) is
/// stopped and its stage invocation killed, with its direct run's event lost (so Lambda
/// retries nothing), so its heartbeats stop (what the reaper calls a zombie). Returns the job
/// as it was.
pub async fn kill_worker(job_id: &JobId) -> longhaul_aws::jobs::JobRecord {
    let job = job_store().await.job(job_id).await.unwrap().expect("the job exists");
    let machine = harness().stack.resource("JobStateMachine");
    let arn = format!(
        "{}:{}",
        machine.replace(":stateMachine:", ":execution:"),
        job.execution.clone().expect("a started job names its execution")
    );
    let stopped = Aws::new().await.sfn.stop_execution().execution_arn(arn).send().await;
    if let Err(err) = stopped {
        assert!(
            err.as_service_error().is_some_and(|e| e.is_execution_does_not_exist()),
            "stop execution: {err:?}"
        );
    }
    let crashed = reqwest::Client::new()
        .post(format!(
            "{}/_local/functions/StageFunction/crash?job_id={job_id}&for_good=true",
            harness().stack.api_url
        ))
        .send()
        .await
        .unwrap();
    assert!(crashed.status().is_success(), "crash: {}", crashed.status());
    job
}
