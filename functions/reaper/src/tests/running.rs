//! `running` jobs: zombies re-dispatched, failed past their budget, back-filled, or ended
//! `cancelled` when their owner asked; stalls flagged, cleared, and rescued past the grace;
//! overtime failed; healthy jobs left alone.

use super::*;

use longhaul_domain::Cancellation;
use longhaul_domain::policy::JobPolicy;

impl World {
    /// The job's progress record (what a revocation changes).
    pub(super) fn progress(&self, id: &JobId) -> ProgressRecord {
        self.jobs.progress(id).expect("a progress record")
    }

    /// The status of execution `name` and the cause it was stopped with, if it was.
    pub(super) fn execution_of(&self, name: &str) -> (String, Option<String>) {
        let execution = self.executions.started().into_iter().find(|e| e.name == name);
        let execution = execution.expect("the execution was started");
        (execution.status, execution.stopped_because)
    }

    /// The reason of the job's last transition.
    async fn last_reason(&self, id: &JobId) -> String {
        self.job(id).await.transitions.last().expect("a transition").reason.clone()
    }
}

fn cancellation() -> Cancellation {
    Cancellation {
        requested_at: "2026-11-24T10:00:00.000Z".parse().unwrap(),
        requested_by: owner(OWNER),
        reason: Some("wrong input".into()),
    }
}

#[tokio::test]
async fn a_zombie_is_revoked_and_re_dispatched_as_its_next_attempt() {
    let world = world();
    let id = world.running(&Running::zombie()).await;
    let report = world.run().await;
    assert_eq!((report.redispatched, report.failed, report.examined), (1, 0, 1));
    let next = execution_name(&id, 2);
    let job = world.job(&id).await;
    assert_eq!(
        (job.status, job.dispatches, job.execution.as_deref()),
        (JobStatus::Queued, 2, Some(next.as_str()))
    );
    assert_eq!(
        world.last_reason(&id).await,
        "no heartbeat for 300 s; re-dispatched as attempt 2 of 3"
    );
    assert_eq!(world.progress(&id).lease, format!("revoked:{LEASE}"), "the old worker fenced off");
    assert_eq!(world.progress(&id).checkpoint_key, None, "the record kept as it was");
    assert_eq!(
        world.execution_of(&id),
        ("ABORTED".to_owned(), Some("superseded by a re-dispatch".to_owned()))
    );
    assert_eq!(world.execution_of(&next).0, "RUNNING", "the next attempt's execution runs");
    assert_eq!(world.entry(&id).map(|(kind, _)| kind).as_deref(), Some("queued"));
}

#[tokio::test]
async fn a_zombie_past_its_budget_fails_abandoned_with_the_reason() {
    let world = world();
    let id = world.running(&Running { attempt: 3, ..Running::zombie() }).await;
    let report = world.run().await;
    assert_eq!((report.failed, report.redispatched), (1, 0));
    assert_eq!(
        world.failure(&id, ErrorCode::Abandoned).await,
        "no heartbeat for 300 s; retry budget of 3 attempts spent"
    );
    assert_eq!(world.progress(&id).lease, format!("revoked:{LEASE}"));
    assert_eq!(world.execution_of(&execution_name(&id, 3)).0, "ABORTED");
    assert_eq!(world.started().len(), 1, "no other attempt");
    assert_eq!(world.entry(&id), None);
}

#[tokio::test]
async fn the_deployments_max_attempts_outranks_the_jobs_policy() {
    let world = world_of(&[("LONGHAUL_MAX_ATTEMPTS", "5")]);
    let id = world.running(&Running { attempt: 3, ..Running::zombie() }).await;
    assert_eq!(world.run().await.redispatched, 1);
    assert_eq!(
        world.last_reason(&id).await,
        "no heartbeat for 300 s; re-dispatched as attempt 4 of 5"
    );
}

#[tokio::test]
async fn a_zombie_whose_result_is_stored_is_recorded_as_succeeded() {
    let world = world();
    let id = world.running(&Running::zombie()).await;
    let result = format!("results/{id}/1/report.csv");
    world.objects.insert(&result, b"a,b\n", "text/csv");
    world.objects.insert(&format!("checkpoints/{id}/render-0001"), b"{}", "application/json");
    let report = world.run().await;
    assert_eq!((report.backfilled, report.redispatched), (1, 0));
    let job = world.job(&id).await;
    assert_eq!(
        (job.status, job.result_key.as_deref()),
        (JobStatus::Succeeded, Some(result.as_str()))
    );
    assert_eq!(world.objects.keys(), [result], "its checkpoints tidied, its result kept");
    // Indexed where the expirer finds it when its result's week is up.
    let (kind, expires) = world.entry(&id).expect("an entry");
    assert_eq!(kind, "succeeded");
    assert_eq!(expires, at(world.now + Span::days(7)));
}

#[tokio::test]
async fn a_zombie_whose_owner_asked_to_cancel_it_ends_cancelled() {
    let world = world();
    let asked = cancellation();
    let how = Running::zombie();
    let id = world.running_with(&how, None, |job| job.cancellation = Some(asked.clone())).await;
    world.objects.insert(&format!("results/{id}/1/part-0001"), b"a,b\n", "text/csv");
    let report = world.run().await;
    assert_eq!((report.cancelled, report.redispatched, report.failed), (1, 0, 0));
    let job = world.job(&id).await;
    assert_eq!((job.status, job.error), (JobStatus::Cancelled, None));
    assert_eq!(world.last_reason(&id).await, asked.log_reason(), "the requester's reason");
    assert!(world.objects.keys().is_empty(), "its partial result deleted");
    assert_eq!(world.progress(&id).lease, format!("revoked:{LEASE}"));
    assert_eq!(
        world.execution_of(&id),
        ("ABORTED".to_owned(), Some("cancelled by its owner".to_owned()))
    );
    assert_eq!(world.started().len(), 1, "not re-dispatched");
}

#[tokio::test]
async fn a_healthy_job_is_left_alone() {
    let world = world();
    let id = world.running(&Running::healthy()).await;
    assert_eq!(world.run().await, quiet(1, [0, 0, 0, 1, 0, 0]));
    assert_eq!(world.job(&id).await.stalled_at, None);
    assert_eq!(world.progress(&id).lease, LEASE);
    assert_eq!(world.execution_of(&id).0, "RUNNING");
}

#[tokio::test]
async fn a_claim_that_never_handed_the_progress_over_is_judged_by_its_claim() {
    let world = world();
    // The progress record is still the previous attempt's, fresh: the claim 10 minutes ago
    // is this lease's only sign of life.
    let how = Running { attempt: 2, ..Running::healthy() };
    let id = world.running(&how).await;
    world.jobs.put_progress(&id, ProgressRecord { lease: "lease-0".into(), ..world.progress(&id) });
    assert_eq!(world.run().await.redispatched, 1);
    assert!(world.last_reason(&id).await.starts_with("no heartbeat for 600 s"));
    assert_eq!(world.progress(&id).lease, "lease-0", "another lease's record is left alone");
}

#[tokio::test]
async fn stalled_progress_is_flagged_then_rescued_past_the_grace() {
    let world = world();
    // Heartbeats, but no progress for 6 minutes (the threshold is 5).
    let how = Running { progress_changed: 360, ..Running::healthy() };
    let id = world.running(&how).await;
    let report = world.run().await;
    assert_eq!((report.stalled, report.redispatched), (1, 0));
    assert_eq!(world.job(&id).await.stalled_at, Some(Timestamp::from(world.now)));
    assert_eq!(world.run().await.stalled, 0, "flagged once");

    // Still heartbeating, still no progress, 11 minutes after the flag (the grace is 10).
    let later = world.now + Span::minutes(11);
    let heartbeat = Timestamp::from(later - Span::seconds(5));
    world.jobs.put_progress(&id, ProgressRecord { heartbeat_at: heartbeat, ..world.progress(&id) });
    let report = world.run_at(later).await;
    assert_eq!((report.redispatched, report.stalled), (1, 0));
    let reason = world.last_reason(&id).await;
    assert!(reason.starts_with("stalled: no progress for 1020 s while heartbeating"), "{reason}");
    assert_eq!(world.job(&id).await.status, JobStatus::Queued);
}

#[tokio::test]
async fn a_stalled_job_that_progresses_again_is_cleared() {
    let world = world();
    let id = world.running(&Running { stalled: Some(120), ..Running::healthy() }).await;
    let report = world.run().await;
    assert_eq!((report.recovered, report.stalled), (1, 0));
    let job = world.job(&id).await;
    assert_eq!((job.status, job.stalled_at), (JobStatus::Running, None));
}

#[tokio::test]
async fn a_job_running_past_its_maximum_fails_timed_out() {
    let world = world();
    let policy = JobPolicy { max_runtime_seconds: 3_600, ..JobPolicy::default() };
    let how = Running { started: 7_200, ..Running::healthy() };
    let id = world.running_with(&how, None, |job| job.policy = Some(policy)).await;
    let report = world.run().await;
    assert_eq!((report.failed, report.redispatched), (1, 0));
    assert_eq!(
        world.failure(&id, ErrorCode::Timeout).await,
        "ran longer than its maximum of 3600 s"
    );
    // Its worker may be alive: its writes are refused from now on, its execution stopped.
    assert_eq!(world.progress(&id).lease, format!("revoked:{LEASE}"));
    assert_eq!(world.execution_of(&id).0, "ABORTED");
}

#[tokio::test]
async fn the_deployments_max_runtime_outranks_the_jobs_policy() {
    let world = world_of(&[("LONGHAUL_MAX_RUNTIME_SECONDS", "300")]);
    let id = world.running(&Running::healthy()).await;
    assert_eq!(world.run().await.failed, 1);
    let message = world.failure(&id, ErrorCode::Timeout).await;
    assert_eq!(message, "ran longer than its maximum of 300 s");
}

#[tokio::test]
async fn an_overtime_job_whose_owner_asked_to_cancel_it_ends_cancelled_without_its_partial_result()
{
    let world = world();
    let policy = JobPolicy { max_runtime_seconds: 3_600, ..JobPolicy::default() };
    let how = Running { started: 7_200, ..Running::healthy() };
    let id = world
        .running_with(&how, None, |job| {
            job.policy = Some(policy);
            job.cancellation = Some(cancellation());
        })
        .await;
    world.objects.insert(&format!("results/{id}/1/part-0001"), b"a,b\n", "text/csv");
    let report = world.run().await;
    assert_eq!((report.cancelled, report.failed), (1, 0));
    assert_eq!(world.job(&id).await.status, JobStatus::Cancelled);
    assert!(world.objects.keys().is_empty(), "its partial result deleted");
}

#[tokio::test]
async fn a_cancelled_zombie_whose_result_cannot_be_deleted_stays_for_the_next_run() {
    let world = world();
    let how = Running::zombie();
    let id = world.running_with(&how, None, |job| job.cancellation = Some(cancellation())).await;
    world.objects.set_unavailable(true);
    let report = world.run().await;
    assert_eq!((report.errors, report.cancelled), (1, 0));
    assert_eq!(world.job(&id).await.status, JobStatus::Running, "never cancelled with a result");
    world.objects.set_unavailable(false);
    assert_eq!(world.run().await.cancelled, 1);
}
