//! The pausing contract ([`JobPausing`]): a `pending` or `queued` job pauses at once, a
//! `running` one is asked (its progress record flagged, which refuses every progress write but
//! one carrying the flag itself), a cancelling or ended job not at all; the stage parks a job
//! only under its lease and only as read, its attempt unspent; a resume moves a paused job
//! back to `pending` once, counting the time and the resume, or withdraws a pause that has not
//! taken effect; the next claim of a resumed job drops a flag left behind.

use std::time::Duration;

use longhaul_aws::jobs::{
    JobRecord, PauseOutcome, ProgressRecord, ProgressRefused, ResumeOutcome, StoreError,
    TransitionRequest,
};
use longhaul_aws::jobs::{SignalKept, SignalRecord};
use longhaul_aws::ports::{
    JobAttempts, JobCancellation, JobCreation, JobPausing, JobReads, JobSignals, JobTransitions,
};
use longhaul_domain::signals::{MAX_SIGNALS_PER_JOB, SignalName, Wait};
use longhaul_domain::{Cancellation, JobId, JobStatus, Owner, Pause, Timestamp};

use super::{fresh_owner, pending_job};

/// The job-table ports the pausing contract arranges its jobs with, and the pausing port.
pub trait PausingTable:
    JobReads + JobTransitions + JobCreation + JobCancellation + JobAttempts + JobPausing + JobSignals
{
}

impl<T> PausingTable for T where
    T: JobReads
        + JobTransitions
        + JobCreation
        + JobCancellation
        + JobAttempts
        + JobPausing
        + JobSignals
{
}

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn job_pausing(store: &impl PausingTable) {
    a_job_not_running_pauses_at_once_and_resumes_once(store).await;
    a_running_job_is_asked_flagged_parked_and_resumed_from_where_it_stopped(store).await;
    a_pause_not_taken_effect_is_withdrawn(store).await;
    cancelling_or_ended_jobs_do_not_pause(store).await;
    a_signal_name_is_recorded_once_and_a_wait_parks_by_its_lease(store).await;
    a_job_keeps_a_bounded_number_of_signals(store).await;
    a_started_job_with_undos_is_not_cancelled_at_once(store).await;
}

/// The store's cancellation ends at once only a job that would not compensate: a paused job
/// that started stages with an undo is refused, with its record as it is (its caller moves it
/// to `compensating`); one that never started is cancelled.
async fn a_started_job_with_undos_is_not_cancelled_at_once(store: &impl PausingTable) {
    for started in [true, false] {
        let mut job = pending_job(&fresh_owner("undo-cancel"), Timestamp::now());
        job.undo_stages = vec!["reserve".into()];
        store.put_job(&job).await.expect("a new job is written");
        let mut pause = TransitionRequest::new(
            &job.job_id,
            &[JobStatus::Pending],
            JobStatus::Paused,
            "arranged",
        );
        if started {
            pause = pause.set("started_at", Timestamp::now());
        }
        store.transition(pause).await.expect("pending → paused");
        let cancellation = Cancellation {
            requested_at: Timestamp::now(),
            requested_by: job.owner.clone(),
            reason: None,
        };
        let outcome = store.cancel(&job.job_id, &cancellation).await;
        match (started, outcome) {
            (true, Err(StoreError::Conflict { current: Some(current) })) => {
                assert_eq!(current.status, JobStatus::Paused, "left as it is");
                assert!(current.cancellation.is_none() && current.wants_compensation());
            }
            (false, Ok(longhaul_aws::jobs::CancelOutcome::Cancelled(ended))) => {
                assert_eq!(ended.status, JobStatus::Cancelled)
            }
            (started, other) => panic!("started {started}: {other:?}"),
        }
    }
}

/// A job keeps at most [`MAX_SIGNALS_PER_JOB`] signals: a name it has is still taken (not
/// refused for the bound), a name taken twice counts once, and a job that does not exist
/// keeps none.
async fn a_job_keeps_a_bounded_number_of_signals(store: &impl PausingTable) {
    let job = created(store, "signal-bound", None).await;
    let at = Timestamp::now();
    let name = |i: u32| -> SignalName { format!("s{i}").parse().unwrap() };
    let put =
        async |i: u32| store.put_signal(&job.job_id, &name(i), &serde_json::Value::Null, at).await;
    assert_eq!(put(0).await.unwrap(), SignalKept::Kept);
    assert_eq!(put(0).await.unwrap(), SignalKept::Taken, "counted once");
    for i in 1..MAX_SIGNALS_PER_JOB {
        assert_eq!(put(i).await.unwrap(), SignalKept::Kept, "signal {i}");
    }
    assert_eq!(put(MAX_SIGNALS_PER_JOB).await.unwrap(), SignalKept::Full);
    assert_eq!(store.signal(&job.job_id, &name(MAX_SIGNALS_PER_JOB)).await.unwrap(), None);
    assert_eq!(put(7).await.unwrap(), SignalKept::Taken, "a kept name is still taken");
    let missing = JobId::new();
    let err = store.put_signal(&missing, &name(0), &serde_json::Value::Null, at).await;
    assert!(matches!(err, Err(StoreError::Conflict { current: None })), "{err:?}");
}

async fn a_signal_name_is_recorded_once_and_a_wait_parks_by_its_lease(store: &impl PausingTable) {
    let job = created(store, "signal", Some("exec-1")).await;
    let id = &job.job_id;
    let name: SignalName = "approval".parse().unwrap();
    let at = Timestamp::now();
    assert_eq!(store.signal(id, &name).await.unwrap(), None, "nothing yet");
    assert_eq!(
        store.put_signal(id, &name, &serde_json::json!({"ok": true}), at).await.unwrap(),
        SignalKept::Kept
    );
    assert_eq!(
        store.put_signal(id, &name, &serde_json::json!(2), later(at, 1)).await.unwrap(),
        SignalKept::Taken,
        "a name is kept once"
    );
    assert!(!store.time_out_signal(id, &name, later(at, 2)).await.unwrap(), "it came first");
    assert_eq!(
        store.signal(id, &name).await.unwrap(),
        Some(SignalRecord::Received { payload: serde_json::json!({"ok": true}), at })
    );
    let other: SignalName = "other".parse().unwrap();
    assert!(store.time_out_signal(id, &other, at).await.unwrap());
    assert_eq!(store.signal(id, &other).await.unwrap(), Some(SignalRecord::TimedOut { at }));

    let (lease, running) = store.claim(id, "exec-1").await.expect("claimed");
    let wait = Wait { signal: name.clone(), until: later(at, 600) };
    assert!(
        matches!(
            store.park_waiting(&running, "another-lease", &wait, at).await,
            Err(StoreError::Conflict { .. })
        ),
        "only the lease parks the job"
    );
    let parked = store.park_waiting(&running, &lease.token, &wait, at).await.expect("parked");
    assert_eq!((parked.status, parked.attempt), (JobStatus::Paused, 0));
    assert_eq!(parked.pause.and_then(|p| p.wait), Some(wait));
}

fn pause_of(owner: &Owner, at: Timestamp) -> Pause {
    Pause {
        requested_at: at,
        requested_by: owner.clone(),
        reason: Some("contract".into()),
        paused_at: None,
        wait: None,
    }
}

fn later(at: Timestamp, seconds: u64) -> Timestamp {
    Timestamp::from(at.as_datetime() + Duration::from_secs(seconds))
}

async fn job(store: &impl PausingTable, id: &JobId) -> JobRecord {
    store.job(id).await.unwrap().expect("the job")
}

/// A job of a fresh owner's, `pending` (or `queued` for `execution`).
async fn created(store: &impl PausingTable, label: &str, execution: Option<&str>) -> JobRecord {
    let job = pending_job(&fresh_owner(label), Timestamp::now());
    store.put_job(&job).await.expect("a new job is written");
    let Some(execution) = execution else { return job };
    let queue =
        TransitionRequest::new(&job.job_id, &[JobStatus::Pending], JobStatus::Queued, "queued")
            .set("execution", execution)
            .set("dispatches", 1);
    store.transition(queue).await.expect("pending → queued")
}

async fn a_job_not_running_pauses_at_once_and_resumes_once(store: &impl PausingTable) {
    for execution in [None, Some("exec-1")] {
        let created = created(store, "pause", execution).await;
        let (id, owner) = (&created.job_id, &created.owner);
        let at = Timestamp::now();
        let outcome = store.pause(id, &pause_of(owner, at), later(at, 60)).await.unwrap();
        let PauseOutcome::Paused(paused) = outcome else {
            panic!("a {} job pauses at once: {outcome:?}", created.status)
        };
        assert_eq!(paused.status, JobStatus::Paused);
        assert_eq!(paused.pause.as_ref().and_then(|p| p.paused_at), Some(at), "since the request");
        assert_eq!(paused.transitions.last().map(|t| t.state), Some(JobStatus::Paused));
        let again = store.pause(id, &pause_of(owner, later(at, 5)), later(at, 65)).await.unwrap();
        assert!(
            matches!(&again, PauseOutcome::Already(job) if job.pause == paused.pause),
            "a second pause changes nothing: {again:?}"
        );
        assert_eq!(job(store, id).await, *paused, "nor writes anything");

        let resumed = store.resume(&paused, "resumed by its owner", later(at, 90)).await.unwrap();
        let ResumeOutcome::Resumed(resumed) = resumed else {
            panic!("a paused job resumes: {resumed:?}")
        };
        assert_eq!((resumed.status, resumed.pause.is_none()), (JobStatus::Pending, true));
        assert_eq!(
            (resumed.paused_seconds, resumed.resumes),
            (0, 1),
            "the resume counted; not the time, of a job that had not started (its runtime has not)"
        );
        assert!(
            matches!(
                store.resume(&paused, "resumed by its owner", later(at, 95)).await,
                Err(StoreError::Conflict { current: Some(_) })
            ),
            "a resume from a stale read is refused"
        );
        assert_eq!(job(store, id).await.resumes, 1, "resumed once");
    }
}

/// A progress write of `lease` (attempt 1) at `seq`, carrying the pause flag if `flag`.
fn progress(lease: &str, seq: u64, flag: bool) -> ProgressRecord {
    ProgressRecord {
        stage: "count".into(),
        stage_index: 1,
        stages_total: 1,
        items_done: seq,
        seq,
        lease: lease.to_owned(),
        attempt: Some(1),
        pause_requested_at: flag.then(Timestamp::now),
        ..ProgressRecord::default()
    }
}

async fn a_running_job_is_asked_flagged_parked_and_resumed_from_where_it_stopped(
    store: &impl PausingTable,
) {
    let created = created(store, "park", Some("exec-1")).await;
    let (id, owner) = (&created.job_id, &created.owner);
    let (lease, _) = store.claim(id, "exec-1").await.expect("claimed");
    store.record_progress(id, &progress(&lease.token, 1, false)).await.expect("a write");
    let at = Timestamp::now();
    let outcome = store.pause(id, &pause_of(owner, at), later(at, 60)).await.unwrap();
    let PauseOutcome::Requested(asked) = outcome else {
        panic!("a running job is asked to pause: {outcome:?}")
    };
    assert_eq!(asked.status, JobStatus::Running);
    assert_eq!(asked.pause.as_ref().map(|p| (p.requested_at, p.paused_at)), Some((at, None)));
    assert!(matches!(
        store.record_progress(id, &progress(&lease.token, 2, false)).await,
        Err(ProgressRefused::PauseRequested)
    ));
    store
        .record_progress(id, &progress(&lease.token, 3, true))
        .await
        .expect("a write carrying the flag (a boundary on the way to parking) is not refused");
    assert!(
        matches!(
            store.pause(id, &pause_of(owner, later(at, 1)), later(at, 61)).await,
            Ok(PauseOutcome::Already(_))
        ),
        "asked already"
    );

    // Written since the read (a fenced counter): the park still applies — it needs the lease
    // and a pause still asked for, not an unchanged record.
    let read = job(store, id).await;
    store.count_injected_failure(id, &lease.token).await.expect("a fenced write");
    assert!(
        matches!(
            store.park(&read, "another-lease", later(at, 2), later(at, 62)).await,
            Err(StoreError::Conflict { .. })
        ),
        "only the lease parks the job"
    );
    let parked =
        store.park(&read, &lease.token, later(at, 2), later(at, 62)).await.expect("parked");
    assert_eq!(parked.status, JobStatus::Paused);
    assert_eq!(parked.attempt, 0, "the attempt is not spent");
    assert_eq!(parked.pause.as_ref().and_then(|p| p.paused_at), Some(later(at, 2)));
    assert!(
        matches!(
            store.park(&read, &lease.token, later(at, 3), later(at, 63)).await,
            Err(StoreError::Conflict { .. })
        ),
        "a park from a stale read is refused"
    );

    let ResumeOutcome::Resumed(resumed) =
        store.resume(&parked, "resumed by its owner", later(at, 12)).await.unwrap()
    else {
        panic!("the parked job resumes")
    };
    assert_eq!((resumed.status, resumed.paused_seconds), (JobStatus::Pending, 10));
    let queue = TransitionRequest::new(id, &[JobStatus::Pending], JobStatus::Queued, "queued")
        .set("execution", "exec-2")
        .set("dispatches", 2);
    store.transition(queue).await.expect("dispatched again");
    let (again, claimed) = store.claim(id, "exec-2").await.expect("the new dispatch claims");
    assert_eq!((again.attempt, claimed.attempt), (1, 1), "the same attempt, a new lease");
    let view = store.view(id).await.unwrap().expect("the job");
    let handed = view.progress.expect("the progress record");
    assert_eq!(
        (handed.items_done, handed.pause_requested_at),
        (3, None),
        "where it stopped, unflagged"
    );
    store.record_progress(id, &progress(&again.token, 4, false)).await.expect("it writes again");
}

async fn a_pause_not_taken_effect_is_withdrawn(store: &impl PausingTable) {
    let created = created(store, "withdraw", Some("exec-1")).await;
    let (id, owner) = (&created.job_id, &created.owner);
    let (lease, _) = store.claim(id, "exec-1").await.expect("claimed");
    store.record_progress(id, &progress(&lease.token, 1, false)).await.expect("a write");
    let at = Timestamp::now();
    store.pause(id, &pause_of(owner, at), later(at, 60)).await.unwrap();
    let asked = job(store, id).await;
    let ResumeOutcome::Withdrawn(running) =
        store.resume(&asked, "resumed by its owner", later(at, 1)).await.unwrap()
    else {
        panic!("a pause not taken effect is withdrawn")
    };
    assert_eq!((running.status, running.pause.is_none()), (JobStatus::Running, true));
    assert_eq!(running.resumes, 0, "no resume counted");
    store.record_progress(id, &progress(&lease.token, 2, false)).await.expect("writes go on");
    assert!(
        matches!(
            store.park(&asked, &lease.token, later(at, 2), later(at, 62)).await,
            Err(StoreError::Conflict { .. })
        ),
        "a withdrawn pause parks nothing"
    );
}

async fn cancelling_or_ended_jobs_do_not_pause(store: &impl PausingTable) {
    let created = created(store, "cancelling", Some("exec-1")).await;
    let (id, owner) = (&created.job_id, &created.owner);
    let (lease, _) = store.claim(id, "exec-1").await.expect("claimed");
    store.record_progress(id, &progress(&lease.token, 1, false)).await.expect("a write");
    let cancellation =
        Cancellation { requested_at: Timestamp::now(), requested_by: owner.clone(), reason: None };
    store.cancel(id, &cancellation).await.expect("cancellation requested");
    let at = Timestamp::now();
    assert!(
        matches!(
            store.pause(id, &pause_of(owner, at), later(at, 60)).await,
            Err(StoreError::Conflict { current: Some(job) }) if job.cancellation.is_some()
        ),
        "a job its owner is cancelling does not pause"
    );
    let ended = TransitionRequest::new(id, &[JobStatus::Running], JobStatus::Cancelled, "ended")
        .fenced(&lease.token);
    store.transition(ended).await.expect("ended");
    assert!(matches!(
        store.pause(id, &pause_of(owner, at), later(at, 60)).await,
        Err(StoreError::Conflict { current: Some(job) }) if job.status == JobStatus::Cancelled
    ));
    let cancelled = job(store, id).await;
    assert!(matches!(
        store.resume(&cancelled, "resumed by its owner", at).await,
        Err(StoreError::Conflict { current: Some(_) })
    ));

    // A paused job is cancelled at once.
    let paused = self::created(store, "cancel-paused", None).await;
    store.pause(&paused.job_id, &pause_of(&paused.owner, at), later(at, 60)).await.unwrap();
    let cancellation =
        Cancellation { requested_at: at, requested_by: paused.owner.clone(), reason: None };
    let outcome = store.cancel(&paused.job_id, &cancellation).await.expect("cancelled");
    assert!(matches!(outcome, longhaul_aws::jobs::CancelOutcome::Cancelled(_)), "{outcome:?}");
}
