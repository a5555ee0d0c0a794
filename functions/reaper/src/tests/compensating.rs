//! Compensation and the reaper: a job it fails (a zombie past its budget) or cancels (a lapsed
//! pause) that started stages with an undo is moved to `compensating` and sent to its worker
//! instead; a compensating job whose worker went silent is sent again; one still compensating
//! a day after it began is ended as it was going to end, its unfinished undos given up.

use super::*;

use longhaul_aws::jobs::{COMPENSATION_SILENCE, compensation_request};
use longhaul_aws::ports::JobCompensation;
use longhaul_domain::compensation::{Compensation, CompensationStatus, Ending, UndoStatus};

/// The ids the dispatch messages sent so far name.
fn sent_ids(world: &World) -> Vec<JobId> {
    world.intake.sent().into_iter().map(|(m, _, _)| m.job_id).collect()
}

#[tokio::test]
async fn a_zombie_past_its_budget_with_undos_compensates_instead_of_failing() {
    let world = world();
    let how = Running { attempt: 3, ..Running::zombie() };
    let id = world.running_with(&how, None, |job| job.undo_stages = vec!["render".into()]).await;
    let report = world.run().await;
    assert_eq!(report.redispatched, 0, "{report:?}");
    let job = world.job(&id).await;
    assert_eq!(job.status, JobStatus::Compensating);
    assert!(job.error.is_none(), "not failed yet");
    let ending = job.compensation.expect("a compensation").ending;
    assert_eq!(ending.status, JobStatus::Failed);
    let error = ending.error.expect("the error it ends with");
    assert_eq!(error.code, ErrorCode::Abandoned.as_str());
    assert_eq!(world.progress(&id).lease, format!("revoked:{LEASE}"), "its worker is fenced off");
    assert_eq!(world.execution_of(&execution_name(&id, 3)).0, "ABORTED");
    assert_eq!(sent_ids(&world), std::slice::from_ref(&id), "sent to its worker to undo");
    assert_eq!(
        world.intake.sent()[0].1,
        90,
        "once a worker still alive has met its revoked lease (the heartbeat timeout)"
    );
    assert_eq!(world.entry(&id).map(|(kind, _)| kind).as_deref(), Some("compensating"));
}

/// A job of the world's owner moved to `compensating` `seconds` ago (its entry due
/// [`COMPENSATION_SILENCE`] later), its compensation planned with one pending undo.
async fn compensating_since(world: &World, seconds: i64) -> JobId {
    let id = world
        .submitted_with(seconds + 60, |job| job.undo_stages = vec!["render".into()])
        .await
        .job_id;
    let began = world.at_ago(seconds);
    let ending =
        Ending { status: JobStatus::Cancelled, reason: "no longer needed".into(), error: None };
    let request = compensation_request(&id, &[JobStatus::Pending], ending.clone(), began);
    let job = world.jobs.transition(request).await.expect("pending → compensating");
    let mut compensation = job.compensation.unwrap_or_else(|| Compensation::begin(ending, began));
    compensation.plan(&["render"], &job.undo_stages);
    let due = Timestamp::from(
        began.as_datetime() + Span::from_std(COMPENSATION_SILENCE).expect("minutes"),
    );
    world.jobs.record_compensation(&id, &compensation, due).await.unwrap();
    // As its last write left it then.
    let mut record = world.job(&id).await;
    record.updated_at = began;
    world.jobs.put_record(record);
    id
}

#[tokio::test]
async fn a_silent_compensation_is_sent_again_and_a_recent_one_left_alone() {
    let world = world();
    let recent = compensating_since(&world, 60).await;
    let silent = compensating_since(&world, 3_600).await;
    let report = world.run().await;
    assert_eq!(sent_ids(&world), std::slice::from_ref(&silent), "{report:?}");
    assert_eq!(report.re_enqueued, 1);
    assert_eq!(report.active.get(&Bucket::Compensating), Some(&2));
    for id in [&recent, &silent] {
        assert_eq!(world.job(id).await.status, JobStatus::Compensating, "its worker ends it");
    }
    // Looked at again only a silence later: the next run sends nothing more.
    let (_, due) = world.entry(&silent).expect("still indexed");
    assert!(due > at(world.now), "re-keyed to its next look: {due}");
    world.run().await;
    assert_eq!(world.intake.sent().len(), 1, "one message per look");
}

#[tokio::test]
async fn a_compensation_older_than_a_day_is_ended_as_it_was_going_to_end() {
    let world = world();
    let id = compensating_since(&world, 86_400 + 60).await;
    let report = world.run().await;
    assert_eq!(report.failed, 1, "{report:?}");
    let job = world.job(&id).await;
    assert_eq!(job.status, JobStatus::Cancelled, "as it was going to end");
    let compensation = job.compensation.expect("kept");
    assert_eq!(compensation.status, CompensationStatus::Failed);
    assert_eq!(compensation.stages[0].status, UndoStatus::Failed);
    assert!(compensation.stages[0].error.as_deref().unwrap().contains("within a day"));
    assert!(world.intake.sent().is_empty(), "nothing sent again");
    assert_eq!(world.entry(&id), None, "out of the index");
}
