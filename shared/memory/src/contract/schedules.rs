//! The schedule store's contract ([`ScheduleStore`]), as the schedules API and the firing
//! rely on it: a schedule is its owner's alone; the per-owner cap holds; pages end; a change
//! is refused when the schedule changed since it was read, and keeps what a firing recorded;
//! a tick is recorded once, never after a later one; a held tick is released once.

use longhaul_aws::jobs::{FireRecord, FireWrite, ScheduleRecord, ScheduleWrite};
use longhaul_aws::ports::{ScheduleStore, ScheduleSweep, ScheduleTwins};
use longhaul_aws::scheduler::{Twin, whole_seconds};
use longhaul_domain::schedules::{FireOutcome, ScheduleId, ScheduleState};
use longhaul_domain::{JobId, Owner, Timestamp};

use super::fresh_owner;

fn record(owner: &Owner) -> ScheduleRecord {
    ScheduleRecord::new(
        owner.clone(),
        "demo".into(),
        serde_json::json!({"items": 3}),
        "rate(5 minutes)".parse().expect("an expression"),
        "UTC".parse().expect("a zone"),
        Timestamp::now(),
    )
}

fn fire(tick: &str, outcome: FireOutcome, job_id: Option<JobId>, hold: bool) -> FireRecord {
    FireRecord {
        tick: tick.parse().expect("a contract tick parses"),
        job_id,
        outcome,
        reason: (outcome != FireOutcome::Submitted).then(|| "contract".to_owned()),
        hold,
        trigger: false,
    }
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn schedule_store(store: &(impl ScheduleStore + ScheduleSweep)) {
    let owner = fresh_owner("schedules");
    let other = fresh_owner("schedules-other");

    // Created, read back whole, and its owner's alone.
    let first = record(&owner);
    assert!(store.create_schedule(&first, 3).await.expect("create"), "under the cap");
    let read = store.schedule(&owner, &first.schedule_id).await.expect("read");
    assert_eq!(read.as_ref(), Some(&first), "a schedule reads back as written");
    assert_eq!(
        store.schedule(&other, &first.schedule_id).await.expect("read as another"),
        None,
        "another owner's schedule reads as none"
    );
    assert_eq!(store.schedule(&owner, &ScheduleId::new()).await.expect("read"), None);

    // The cap: three fit, the fourth is refused and not written.
    let (second, third) = (record(&owner), record(&owner));
    assert!(store.create_schedule(&second, 3).await.expect("create"));
    assert!(store.create_schedule(&third, 3).await.expect("create"));
    let fourth = record(&owner);
    assert!(!store.create_schedule(&fourth, 3).await.expect("create"), "over the cap");
    assert_eq!(store.schedule(&owner, &fourth.schedule_id).await.expect("read"), None);
    assert!(store.create_schedule(&record(&other), 3).await.expect("create"), "caps are per owner");

    // Pages: oldest first, each id once, and they end.
    let mut seen = Vec::new();
    let mut after: Option<ScheduleId> = None;
    for _ in 0..5 {
        let page = store.schedules(&owner, 2, after.as_ref()).await.expect("list");
        assert!(page.schedules.len() <= 2, "a page holds at most its limit");
        seen.extend(page.schedules.iter().map(|s| s.schedule_id.clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut expected =
        vec![first.schedule_id.clone(), second.schedule_id.clone(), third.schedule_id.clone()];
    expected.sort();
    assert_eq!(seen, expected, "every schedule of the owner, once, in id order");

    // A tick is recorded once, and never after a later one.
    let job = JobId::new();
    let at_two = fire("2026-11-26T02:00:00Z", FireOutcome::Submitted, Some(job.clone()), false);
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &at_two).await.expect("fire"),
        FireWrite::Recorded
    );
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &at_two).await.expect("fire again"),
        FireWrite::Stale,
        "the same tick again records nothing"
    );
    let earlier = fire("2026-11-26T01:00:00Z", FireOutcome::Submitted, Some(JobId::new()), false);
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &earlier).await.expect("fire"),
        FireWrite::Superseded,
        "an earlier tick after a later one records nothing, and says so"
    );
    assert!(
        store.count_fire(&owner, &first.schedule_id, &earlier).await.expect("count"),
        "a superseded tick's job is counted"
    );
    assert!(
        !store.count_fire(&other, &first.schedule_id, &earlier).await.expect("count"),
        "another owner's count finds no schedule"
    );
    assert_eq!(
        store
            .record_fire(
                &other,
                &first.schedule_id,
                &fire("2026-11-26T03:00:00Z", FireOutcome::Skipped, None, false)
            )
            .await
            .expect("fire"),
        FireWrite::Stale,
        "another owner's firing of the schedule records nothing"
    );
    // A trigger is recorded once, and never makes a tick delivered after it look stale.
    let trigger = FireRecord {
        trigger: true,
        ..fire("2026-11-26T02:30:00Z", FireOutcome::Submitted, Some(JobId::new()), false)
    };
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &trigger).await.expect("trigger"),
        FireWrite::Recorded
    );
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &trigger).await.expect("trigger again"),
        FireWrite::Stale,
        "the same trigger again records nothing"
    );
    let tick_after = fire("2026-11-26T02:10:00Z", FireOutcome::Submitted, Some(job.clone()), false);
    assert_eq!(
        store.record_fire(&owner, &first.schedule_id, &tick_after).await.expect("tick"),
        FireWrite::Recorded,
        "a tick before a trigger, delivered after it, is recorded"
    );
    let fired = store.schedule(&owner, &first.schedule_id).await.expect("read").expect("there");
    assert_eq!((fired.fired, fired.submitted, fired.skipped), (4, 4, 0));
    assert_eq!(fired.live_job.as_ref(), Some(&job), "a superseded tick's job is not the live one");
    assert_eq!(fired.last_fire, Some(tick_after.last_fire()), "the last recorded firing");

    // A change is conditional on the version read, and keeps what the firing recorded.
    let mut paused = first.clone();
    paused.state = ScheduleState::Paused;
    paused.paused_reason = Some("contract".into());
    paused.version = 2;
    assert_eq!(store.replace_schedule(&paused, 1).await.expect("write"), ScheduleWrite::Written);
    let now = store.schedule(&owner, &first.schedule_id).await.expect("read").expect("there");
    assert_eq!((now.state, now.version), (ScheduleState::Paused, 2));
    assert_eq!((now.fired, now.live_job.as_ref()), (4, Some(&job)), "the firing is kept");
    let mut stale = first.clone();
    stale.version = 2;
    match store.replace_schedule(&stale, 1).await.expect("write") {
        ScheduleWrite::Conflict(Some(current)) => assert_eq!(current.version, 2),
        other => panic!("a write from a stale read is refused with the current record: {other:?}"),
    }
    let mut gone = record(&owner);
    gone.version = 2;
    assert_eq!(
        store.replace_schedule(&gone, 1).await.expect("write"),
        ScheduleWrite::Conflict(None),
        "a write of a schedule that is not there is refused"
    );
    assert_eq!(store.schedule(&owner, &gone.schedule_id).await.expect("read"), None);

    // A held tick is released once.
    let held = fire("2026-11-26T04:00:00Z", FireOutcome::Skipped, None, true);
    assert_eq!(
        store.record_fire(&owner, &second.schedule_id, &held).await.expect("hold"),
        FireWrite::Recorded
    );
    let holding = store.schedule(&owner, &second.schedule_id).await.expect("read").expect("there");
    assert_eq!(holding.held, Some(held.tick));
    let release = fire("2026-11-26T04:00:00Z", FireOutcome::Submitted, Some(JobId::new()), false);
    assert!(store.release_held(&owner, &second.schedule_id, &release).await.expect("release"));
    assert!(
        !store.release_held(&owner, &second.schedule_id, &release).await.expect("release again"),
        "a held tick is released once"
    );
    let released = store.schedule(&owner, &second.schedule_id).await.expect("read").expect("there");
    assert_eq!(released.held, None);
    assert_eq!(
        (released.fired, released.skipped, released.submitted),
        (1, 0, 1),
        "a released tick counts as submitted, no longer as skipped"
    );
    assert_eq!(released.live_job, release.job_id);

    // A tick that submits drops a tick held for the job before: it is superseded.
    let held_again = fire("2026-11-26T05:00:00Z", FireOutcome::Skipped, None, true);
    store.record_fire(&owner, &second.schedule_id, &held_again).await.expect("hold");
    let newer = fire("2026-11-26T06:00:00Z", FireOutcome::Submitted, Some(JobId::new()), false);
    store.record_fire(&owner, &second.schedule_id, &newer).await.expect("submit");
    let superseded =
        store.schedule(&owner, &second.schedule_id).await.expect("read").expect("there");
    assert_eq!(superseded.held, None, "a submitted tick clears the held one");
    assert!(
        !store.release_held(&owner, &second.schedule_id, &held_again).await.expect("release"),
        "a superseded tick is not released"
    );

    // The sweep's walk: every schedule, whoever owns it, once, shard by shard, in pages.
    let mut walked = Vec::new();
    for shard in 0..longhaul_aws::jobs::STATUS_SHARDS {
        let mut after: Option<ScheduleId> = None;
        for page in 0.. {
            assert!(page < 1000, "the sweep's pages end");
            let entries = store.schedule_entries(shard, after.as_ref(), 1).await.expect("walk");
            assert!(entries.entries.len() <= 1, "a page holds at most its limit");
            walked.extend(entries.entries.into_iter().map(|e| (e.owner, e.schedule_id)));
            match entries.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    for schedule in [&first, &second, &third] {
        let found = walked.iter().filter(|(_, id)| *id == schedule.schedule_id).count();
        assert_eq!(found, 1, "the sweep finds each schedule once");
        assert!(walked.contains(&(owner.clone(), schedule.schedule_id.clone())), "with its owner");
    }
    assert!(walked.iter().any(|(o, _)| *o == other), "and other owners' schedules");

    // Deleted once; the cap counts it no more.
    assert!(store.delete_schedule(&owner, &third.schedule_id).await.expect("delete"));
    assert!(!store.delete_schedule(&owner, &third.schedule_id).await.expect("delete again"));
    assert_eq!(store.schedule(&owner, &third.schedule_id).await.expect("read"), None);
    assert!(store.create_schedule(&record(&owner), 3).await.expect("create"), "a freed place");
}

/// The twins' contract ([`ScheduleTwins`]): a twin is written whole and read back as written
/// (its expression, zone, window, state and input), a second write replaces it, a deleted
/// twin is gone, and deleting or reading one that is not there is not an error.
pub async fn schedule_twins(twins: &impl ScheduleTwins) {
    let name = ScheduleId::new().to_string();
    assert_eq!(twins.twin(&name).await.expect("read"), None, "no twin before it is written");
    let owner = fresh_owner("twins");
    let missing = Twin {
        name: name.clone(),
        expression: "rate(5 minutes)".into(),
        timezone: "UTC".into(),
        start_at: None,
        end_at: None,
        enabled: false,
        input: Twin::input_for(&owner, &name),
    };
    assert!(!twins.update_twin(&missing).await.expect("update none"), "no twin to update");
    assert_eq!(twins.twin(&name).await.expect("read"), None, "an update creates none");
    let twin = Twin {
        name: name.clone(),
        expression: "cron(30 2 * * ? *)".into(),
        timezone: "Europe/Berlin".into(),
        // A start in the future (one already past is not sent: Scheduler refuses it).
        start_at: Some(whole_seconds(Timestamp::from(
            chrono::Utc::now() + chrono::Duration::days(30),
        ))),
        end_at: Some(whole_seconds(Timestamp::from(
            chrono::Utc::now() + chrono::Duration::days(400),
        ))),
        enabled: true,
        input: Twin::input_for(&owner, &name),
    };
    twins.put_twin(&twin).await.expect("create");
    assert_eq!(twins.twin(&name).await.expect("read"), Some(twin.clone()), "read back whole");
    let mut listed = Vec::new();
    let mut token = None;
    for page in 0.. {
        assert!(page < 10_000, "the listing's pages end");
        let (names, next) = twins.twin_names(token).await.expect("list");
        listed.extend(names);
        match next {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    assert_eq!(listed.iter().filter(|n| **n == name).count(), 1, "listed once: {listed:?}");
    let paused = Twin {
        expression: "rate(5 minutes)".into(),
        timezone: "UTC".into(),
        start_at: None,
        end_at: None,
        enabled: false,
        ..twin.clone()
    };
    twins.put_twin(&paused).await.expect("update");
    assert_eq!(
        twins.twin(&name).await.expect("read"),
        Some(paused.clone()),
        "a write replaces it whole"
    );
    assert!(twins.update_twin(&twin).await.expect("update"), "an update of one there is");
    assert_eq!(twins.twin(&name).await.expect("read"), Some(twin.clone()), "replaced whole");
    twins.put_twin(&paused).await.expect("update");
    let started = Twin {
        start_at: Some(Timestamp::from(chrono::Utc::now() - chrono::Duration::hours(1))),
        ..paused.clone()
    };
    twins.put_twin(&started).await.expect("a start already past is written (without it)");
    let read = twins.twin(&name).await.expect("read").expect("there");
    assert!(read.fires_as(&started), "it fires as the record says: {read:?}");
    assert!(twins.delete_twin(&name).await.expect("delete"));
    assert_eq!(twins.twin(&name).await.expect("read"), None, "a deleted twin is gone");
    assert!(!twins.delete_twin(&name).await.expect("delete again"), "deleting none is no error");
}
