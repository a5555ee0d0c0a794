//! Lost dispatches of `pending` jobs: re-enqueued past the grace at growing intervals, a
//! delayed job for its start and never before, failed only past `max_pending`.

use super::*;

#[tokio::test]
async fn a_pending_job_past_its_grace_is_enqueued_again_and_looked_at_later() {
    let world = world();
    let id = world.submitted(120).await;
    let report = world.run().await;
    assert_eq!((report.re_enqueued, report.examined), (1, 1));
    assert_eq!(world.sent(), [(id.clone(), 0)], "sent now, to be dispatched");
    assert_eq!(world.intake.sent()[0].2, OWNER, "in its owner's group");
    let job = world.job(&id).await;
    assert_eq!((job.status, job.enqueues), (JobStatus::Pending, 1), "counted");
    // The next look in 2 × the grace (the entry's key less the grace is due).
    let next = ("pending".to_owned(), at(world.now + Span::seconds(60)));
    assert_eq!(world.entry(&id), Some(next));

    assert_eq!(world.run().await.re_enqueued, 0, "not again before its next look");
    let later = world.now + Span::seconds(121);
    assert_eq!(world.run_at(later).await.re_enqueued, 1, "again at its next look");
    assert_eq!(world.sent().len(), 2);
    assert_eq!(world.job(&id).await.enqueues, 2);
    // …then twice as long.
    let next = ("pending".to_owned(), at(later + Span::seconds(240 - 60)));
    assert_eq!(world.entry(&id), Some(next));
}

#[tokio::test]
async fn a_pending_job_within_its_grace_is_left_alone() {
    let world = world();
    let id = world.submitted(30).await;
    assert_eq!(world.run().await, quiet(0, [1, 0, 0, 0, 0, 0]));
    assert!(world.sent().is_empty());
    assert_eq!(world.job(&id).await.enqueues, 0);
}

#[tokio::test]
async fn re_enqueues_are_spaced_by_the_longest_interval_at_most() {
    let world = world();
    let id = world.submitted_with(3_600, |job| job.enqueues = 10).await.job_id.clone();
    assert_eq!(world.run().await.re_enqueued, 1);
    // 60 s × 2¹¹ is far past the longest interval, 900 s.
    let next = ("pending".to_owned(), at(world.now + Span::seconds(900 - 60)));
    assert_eq!(world.entry(&id), Some(next));
}

#[tokio::test]
async fn a_delayed_job_coming_due_is_enqueued_for_its_start_and_not_before() {
    let world = world();
    let start = world.now + Span::seconds(600);
    // Submitted an hour ago to start in ten minutes: submit indexed it 15 minutes before its
    // start (out of SQS's reach then, the reaper enqueues it when it comes due).
    let job = world.submitted_with(3_600, |job| job.not_before = Some(start.into())).await;
    let id = job.job_id.clone();
    world.jobs.put_index_entry(&id, "pending", &at(start - Span::seconds(900)));
    let report = world.run().await;
    assert_eq!(report.re_enqueued, 1);
    assert_eq!(world.sent(), [(id.clone(), 600)], "its message waits for the start");
    assert_eq!(world.entry(&id), Some(("pending".to_owned(), at(start))), "next look: its start");
    assert_eq!(world.run().await.re_enqueued, 0, "nothing more before its start");
    assert_eq!(world.sent().len(), 1);
}

#[tokio::test]
async fn a_delayed_job_far_from_its_start_is_not_looked_at() {
    let world = world();
    let start = world.now + Span::hours(2);
    world.submitted_with(3_600, |job| job.not_before = Some(start.into())).await;
    assert_eq!(world.run().await, quiet(0, [1, 0, 0, 0, 0, 0]));
    assert!(world.sent().is_empty());
}

#[tokio::test]
async fn a_job_pending_past_max_pending_fails_undispatchable() {
    let world = world();
    let id = world.submitted_with(25 * 3_600, |job| job.enqueues = 7).await.job_id.clone();
    let report = world.run().await;
    assert_eq!((report.failed, report.re_enqueued), (1, 0));
    assert_eq!(
        world.failure(&id, ErrorCode::Undispatchable).await,
        "not dispatched within 86400 s of being accepted (7 re-enqueues)"
    );
    assert!(world.sent().is_empty(), "no message for a failed job");
    assert_eq!(world.entry(&id), None, "an ended job leaves the index");
}

#[tokio::test]
async fn a_delayed_job_counts_max_pending_from_its_start() {
    let world = world();
    let start = world.now - Span::hours(1);
    let job = world.submitted_with(25 * 3_600, |job| job.not_before = Some(start.into())).await;
    let id = job.job_id.clone();
    let report = world.run().await;
    assert_eq!((report.failed, report.re_enqueued), (0, 1));
    assert_eq!(world.sent(), [(id.clone(), 0)], "its start has passed: sent now");
    assert_eq!(world.job(&id).await.status, JobStatus::Pending);
}

#[tokio::test]
async fn a_job_that_moved_on_is_a_lost_race_not_a_message() {
    let world = world();
    let id = world.queued(600, 1).await;
    // An entry the dispatcher's write left behind in `pending` (the index is eventually
    // consistent): the re-enqueue's condition refuses.
    world.jobs.put_index_entry(&id, "pending", &at(world.ago(600)));
    let report = world.run().await;
    assert_eq!((report.raced, report.re_enqueued, report.errors), (1, 0, 0));
    assert!(world.sent().is_empty());
    assert_eq!(world.job(&id).await.enqueues, 0);
}

#[tokio::test]
async fn a_failed_send_is_reported_and_sent_at_the_next_look() {
    let world = world();
    let id = world.submitted(120).await;
    world.intake.set_unavailable(true);
    let report = world.run().await;
    assert_eq!((report.errors, report.re_enqueued), (1, 0));
    assert!(world.sent().is_empty());
    // The count was written before the send: the job is looked at again at its next look.
    let next = ("pending".to_owned(), at(world.now + Span::seconds(60)));
    assert_eq!(world.entry(&id), Some(next));
    world.intake.set_unavailable(false);
    assert_eq!(world.run_at(world.now + Span::seconds(121)).await.re_enqueued, 1);
    assert_eq!(world.sent(), [(id, 0)]);
}
