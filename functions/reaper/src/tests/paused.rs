//! Paused jobs: left alone while their pause holds, cancelled once it lapsed, and their paused
//! time not counted against `max_runtime`.

use super::*;

use longhaul_aws::ports::JobPausing;
use longhaul_domain::Pause;
use longhaul_domain::policy::JobPolicy;

/// A job of [`OWNER`]'s paused by them `seconds` before the world's `now` (its policy's
/// `max_paused` a day), through the store's own pause.
async fn paused(world: &World, seconds: i64) -> JobId {
    let id = world
        .submitted_with(seconds + 10, |job| {
            job.policy = Some(JobPolicy { max_paused_seconds: 86_400, ..JobPolicy::default() })
        })
        .await
        .job_id;
    let at = world.at_ago(seconds);
    let pause = Pause {
        requested_at: at,
        requested_by: owner(OWNER),
        reason: None,
        paused_at: None,
        wait: None,
    };
    let lapses_at = Timestamp::from(at.as_datetime() + Span::days(1));
    world.jobs.pause(&id, &pause, lapses_at).await.expect("a pending job pauses");
    id
}

#[tokio::test]
async fn a_paused_job_is_left_alone_until_its_pause_lapses_then_cancelled_with_why() {
    let world = world();
    let holds = paused(&world, 3_600).await;
    let lapsed = paused(&world, 86_400 + 60).await;
    let report = world.run().await;
    assert_eq!(report.cancelled, 1, "{report:?}");
    assert_eq!(report.active.get(&Bucket::Paused), Some(&1), "one paused job left");
    assert_eq!(world.job(&holds).await.status, JobStatus::Paused, "its pause holds");
    assert!(world.sent().is_empty(), "a paused job is not enqueued");
    let job = world.job(&lapsed).await;
    assert_eq!(job.status, JobStatus::Cancelled);
    let reason = job.cancellation.expect("who and why").reason.expect("a reason");
    assert!(reason.contains("longer than its max_paused (86400 s)"), "{reason}");
    assert_eq!(world.entry(&lapsed), None, "out of the index");
}

#[tokio::test]
async fn a_stale_entry_of_a_job_resumed_and_paused_again_cancels_nothing() {
    let world = world();
    let id = paused(&world, 60).await;
    // The index still holds an old pause's lapse (it is eventually consistent): the record
    // says when the current one lapses.
    world.jobs.put_index_entry(&id, "paused", &at(world.ago(10)));
    let report = world.run().await;
    assert_eq!(report.cancelled, 0, "{report:?}");
    assert_eq!(world.job(&id).await.status, JobStatus::Paused);
}

#[tokio::test]
async fn time_spent_paused_does_not_count_towards_the_maximum_runtime() {
    let world = world();
    let policy = JobPolicy { max_runtime_seconds: 3_600, ..JobPolicy::default() };
    let how = Running { started: 7_200, ..Running::healthy() };
    // Started two hours ago, of which it spent 90 minutes paused: it has run 30 minutes.
    let rested = world
        .running_with(&how, None, |job| {
            job.policy = Some(policy.clone());
            job.paused_seconds = 5_400;
        })
        .await;
    let overtime = world
        .running_with(&how, None, |job| {
            job.policy = Some(policy.clone());
            job.paused_seconds = 1_800;
        })
        .await;
    let report = world.run().await;
    assert_eq!(report.failed, 1, "{report:?}");
    assert_eq!(world.job(&rested).await.status, JobStatus::Running);
    world.failure(&overtime, ErrorCode::Timeout).await;
}

#[tokio::test]
async fn a_zombie_whose_owner_asked_to_pause_it_is_parked_not_rescued() {
    let world = world();
    let at = world.at_ago(300);
    let asked = Pause {
        requested_at: at,
        requested_by: owner(OWNER),
        reason: None,
        paused_at: None,
        wait: None,
    };
    let id = world.running_with(&Running::zombie(), None, |job| job.pause = Some(asked)).await;
    let report = world.run().await;
    assert_eq!((report.parked, report.redispatched, report.failed), (1, 0, 0), "{report:?}");
    let job = world.job(&id).await;
    assert_eq!(job.status, JobStatus::Paused);
    assert_eq!(job.attempt, 0, "its attempt is not spent");
    assert!(job.pause.and_then(|p| p.paused_at).is_some(), "paused since the reaper's run");
    assert_eq!(
        world.progress(&id).lease,
        format!("revoked:{LEASE}"),
        "a live worker writes no more"
    );
    assert_eq!(world.execution_of(&id).0, "ABORTED");
    assert_eq!(world.entry(&id).map(|(bucket, _)| bucket), Some("paused".into()));
}

#[tokio::test]
async fn a_wait_past_its_end_is_recorded_timed_out_and_the_job_resumed() {
    use longhaul_aws::jobs::SignalRecord;
    use longhaul_aws::ports::{JobAttempts, JobSignals};
    use longhaul_domain::signals::Wait;
    let world = world();
    let id = world.queued(60, 1).await;
    let (lease, running) = world.jobs.claim(&id, &execution_name(&id, 1)).await.unwrap();
    let until = world.at_ago(30);
    let wait = Wait { signal: "approval".parse().unwrap(), until };
    world.jobs.park_waiting(&running, &lease.token, &wait, world.at_ago(90)).await.unwrap();
    let report = world.run().await;
    assert_eq!((report.resumed, report.cancelled), (1, 0), "{report:?}");
    let job = world.job(&id).await;
    assert_eq!(job.status, JobStatus::Pending, "resumed, its stage to be told");
    assert_eq!(job.transitions.last().unwrap().reason, "the wait for signal approval timed out");
    assert!(matches!(
        world.jobs.signal(&id, &wait.signal).await.unwrap(),
        Some(SignalRecord::TimedOut { .. })
    ));
    assert_eq!(world.sent(), [(id, 0)], "dispatched again");
}
