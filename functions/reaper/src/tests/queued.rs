//! `queued` jobs that are not running: an execution that never started is started under its
//! name, one that ended without running the job is replaced by the next, within the budget.

use super::*;

impl World {
    /// Starts the job's execution `name` and ends it with `status` (`None`: it runs on).
    async fn execution(&self, id: &JobId, name: &str, status: Option<&str>) {
        let input = self.deps.config.workers.execution_input(id, &Default::default());
        self.executions.start(name, &input).await.expect("started");
        if let Some(status) = status {
            self.executions.finish(name, status);
        }
    }
}

#[tokio::test]
async fn a_queued_job_whose_execution_never_started_is_started_under_its_name() {
    let world = world();
    let id = world.queued(300, 1).await;
    let report = world.run().await;
    assert_eq!((report.restarted, report.examined), (1, 1));
    let started = world.executions.started();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].name, id.as_str(), "the name it was dispatched to");
    assert_eq!(started[0].input["job_id"], id.as_str());
    let job = world.job(&id).await;
    assert_eq!((job.status, job.dispatches), (JobStatus::Queued, 1), "no attempt spent");
}

#[tokio::test]
async fn a_queued_job_whose_execution_ended_gets_the_next_execution() {
    let world = world();
    let id = world.queued(300, 1).await;
    world.execution(&id, &id, Some("FAILED")).await;
    let report = world.run().await;
    assert_eq!(report.restarted, 1);
    let next = execution_name(&id, 2);
    assert_eq!(world.started(), [id.to_string(), next.clone()]);
    let job = world.job(&id).await;
    assert_eq!(
        (job.status, job.dispatches, job.execution.as_deref()),
        (JobStatus::Queued, 2, Some(next.as_str()))
    );
    // Indexed at the re-dispatch: judged again only a grace from now.
    assert_eq!(world.entry(&id).map(|(kind, _)| kind).as_deref(), Some("queued"));
    assert_eq!(world.run().await.restarted, 0);
    assert_eq!(world.started().len(), 2);
}

#[tokio::test]
async fn a_queued_job_whose_execution_runs_is_left_alone() {
    let world = world();
    let id = world.queued(300, 1).await;
    world.execution(&id, &id, None).await;
    assert_eq!(world.run().await, quiet(1, [0, 0, 1, 0, 0, 0]));
    assert_eq!(world.started(), [id.as_str()]);
    assert_eq!(world.job(&id).await.dispatches, 1);
}

#[tokio::test]
async fn a_queued_job_within_its_grace_is_left_alone() {
    let world = world();
    world.queued(60, 1).await;
    assert_eq!(world.run().await, quiet(0, [0, 0, 1, 0, 0, 0]));
    assert!(world.started().is_empty());
}

#[tokio::test]
async fn a_queued_job_whose_last_dispatch_ended_fails_undispatchable() {
    let world = world();
    let id = world.queued(300, 3).await;
    let name = execution_name(&id, 3);
    world.execution(&id, &name, Some("TIMED_OUT")).await;
    let report = world.run().await;
    assert_eq!((report.failed, report.restarted), (1, 0));
    assert_eq!(
        world.failure(&id, ErrorCode::Undispatchable).await,
        format!("its execution {name} ended without running it")
    );
    assert_eq!(world.started(), [name], "no other execution");
}

#[tokio::test]
async fn a_queued_job_whose_execution_could_not_start_for_max_pending_fails() {
    let world = world();
    let id = world.queued(25 * 3_600, 1).await;
    let report = world.run().await;
    assert_eq!((report.failed, report.restarted), (1, 0));
    assert_eq!(
        world.failure(&id, ErrorCode::Undispatchable).await,
        "its execution could not be started within 86400 s of being accepted"
    );
    assert!(world.started().is_empty());
}

#[tokio::test]
async fn an_unreachable_state_machine_is_reported_and_the_job_left_for_the_next_run() {
    let world = world();
    let id = world.queued(300, 1).await;
    world.executions.set_unavailable(true);
    let report = world.run().await;
    assert_eq!((report.errors, report.restarted), (1, 0));
    assert_eq!(world.job(&id).await.dispatches, 1, "nothing changed");
    world.executions.set_unavailable(false);
    assert_eq!(world.run().await.restarted, 1);
    assert_eq!(world.started(), [id.to_string()]);
}
