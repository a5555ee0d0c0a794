//! The owner's pause of a running job: seen at a progress write, the stage saves its final
//! checkpoint and parks the job `paused` (its attempt unspent); resumed and dispatched again,
//! the job continues from that checkpoint, each item counted once. A pause withdrawn before it
//! took effect lets the stage go on; one that lands at a stage boundary parks the job at the
//! next stage.

use super::*;

use longhaul_aws::executions::execution_name;
use longhaul_aws::ports::JobPausing;
use longhaul_domain::Pause;

fn owners_pause() -> Pause {
    Pause {
        requested_at: Timestamp::now(),
        requested_by: owner("alice"),
        reason: Some("month end".into()),
        paused_at: None,
        wait: None,
    }
}

/// A week on (when a pause asked now would lapse).
fn lapses() -> Timestamp {
    Timestamp::from(chrono::Utc::now() + chrono::Duration::days(7))
}

impl World {
    /// Resumes the paused job and dispatches it again as the dispatcher does (its next
    /// execution); the new execution's name.
    async fn resume_and_dispatch(&self, id: &JobId) -> String {
        let job = self.job(id).await;
        self.jobs.resume(&job, "resumed by alice", Timestamp::now()).await.expect("resumed");
        let job = self.job(id).await;
        assert_eq!(job.status, JobStatus::Pending);
        let name = execution_name(id, job.dispatches + 1);
        let queue = TransitionRequest::new(id, &[JobStatus::Pending], JobStatus::Queued, "queued")
            .set("execution", &name)
            .set("dispatches", job.dispatches + 1);
        self.jobs.transition(queue).await.unwrap();
        name
    }
}

#[tokio::test]
async fn a_pause_mid_run_parks_the_job_at_its_checkpoint_and_the_resume_counts_every_item_once() {
    let w = world();
    let id = w.queued("script", json!({"items": 5, "hook_at": 2})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.pause(&job, &owners_pause(), lapses()).await.unwrap();
    });
    let out = w.first_run(&id, far()).await.expect("the run ends paused");
    assert_eq!(out["run"]["next"], "paused");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Paused);
    assert_eq!(job.attempt, 0, "the paused attempt is not spent");
    let pause = job.pause.expect("who paused it");
    assert!(pause.paused_at.is_some(), "and since when");
    assert_eq!(job.transitions.last().unwrap().reason, "paused by alice: month end");
    let progress = w.progress(&id);
    assert_eq!(progress.items_done, 3, "the write that saw the flag asked the stage to stop");
    let last = progress.checkpoint_key.clone().expect("the final checkpoint is current");
    let saved: Value = serde_json::from_slice(&w.object(&last).await.unwrap()).unwrap();
    assert_eq!(saved["state"]["next"], 3, "where the resume continues");
    assert_eq!(w.jobs.index_entry(&id).map(|(b, _)| b.starts_with("paused#")), Some(true));

    let execution = w.resume_and_dispatch(&id).await;
    assert_ne!(execution, id.to_string(), "a dispatch of its own");
    let start = json!({"job_id": id, "worker_arn": WORKER});
    w.run(&id, &execution, start, far()).await.expect("the resumed run finishes");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt, job.resumes), (JobStatus::Succeeded, 1, 1));
    let result: Value = serde_json::from_slice(&w.result(&id).await.unwrap()).unwrap();
    assert_eq!(result, json!({"counted": 5, "starts": [0, 3]}), "each item once");
}

#[tokio::test]
async fn a_stale_run_of_the_paused_dispatch_cannot_claim_the_resumed_job() {
    let w = world();
    let id = w.queued("script", json!({"items": 3, "hook_at": 1})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.pause(&job, &owners_pause(), lapses()).await.unwrap();
    });
    let state = w.first_run(&id, far()).await.unwrap();
    assert_eq!(state["run"]["next"], "paused");
    w.resume_and_dispatch(&id).await;
    // The first dispatch's execution runs again (a late retry of its task): refused.
    let late = w.first_run(&id, far()).await;
    assert!(matches!(late, Err(StageError::NotClaimable(_))), "{late:?}");
    assert_eq!(w.job(&id).await.status, JobStatus::Queued);
}

#[tokio::test]
async fn a_pause_withdrawn_before_the_stage_parks_the_job_lets_it_go_on() {
    let w = world();
    let id = w.queued("script", json!({"items": 4, "hook_at": 1})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.pause(&job, &owners_pause(), lapses()).await.unwrap();
        // Resumed before the stage's next write saw the flag: the request is withdrawn.
        let asked = jobs.job(&job).await.unwrap().unwrap();
        jobs.resume(&asked, "resumed by alice", Timestamp::now()).await.unwrap();
    });
    let out = w.first_run(&id, far()).await.expect("the run finishes");
    assert_eq!(out["run"]["next"], "done");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.pause.is_none()), (JobStatus::Succeeded, true));
}

#[tokio::test]
async fn a_pause_asked_between_invocations_parks_the_job_before_its_stage_runs_again() {
    let w = world();
    let id = w.queued("script", json!({"items": 2})).await;
    let state = w.first_run(&id, near()).await.expect("one item, then the deadline");
    w.jobs.pause(&id, &owners_pause(), lapses()).await.unwrap();
    let out = w.run(&id, &id, state, far()).await.expect("the run ends paused");
    assert_eq!(out["run"]["next"], "paused");
    assert_eq!(w.job(&id).await.status, JobStatus::Paused);
    assert_eq!(w.progress(&id).items_done, 1, "nothing ran after the pause");
}

#[tokio::test]
async fn a_pause_that_lands_as_a_stage_ends_parks_the_job_at_the_next_stage() {
    // No progress write falls due within the run: the pause is first seen by the count
    // stage's last checkpoint, so the stage ends and the boundary is crossed before parking.
    let w = world_with(|deps| deps.progress_interval = Duration::from_secs(3_600));
    let id = w.queued("script", json!({"items": 3, "hook_at": 1})).await;
    let jobs = w.jobs.clone();
    let job = id.clone();
    w.set_hook(async move {
        jobs.pause(&job, &owners_pause(), lapses()).await.unwrap();
    });
    let out = w.first_run(&id, far()).await.expect("the run ends paused");
    assert_eq!(out["run"]["next"], "paused");
    assert_eq!(w.job(&id).await.status, JobStatus::Paused);
    let progress = w.progress(&id);
    assert_eq!((progress.stage.as_str(), progress.stage_index), ("report", 2), "{progress:?}");
    assert!(progress.pause_requested_at.is_some(), "the boundary write kept the flag");

    let execution = w.resume_and_dispatch(&id).await;
    assert!(w.progress(&id).pause_requested_at.is_none(), "the resume removed the flag");
    let start = json!({"job_id": id, "worker_arn": WORKER});
    w.run(&id, &execution, start, far()).await.expect("the resumed run finishes");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Succeeded);
    let result: Value = serde_json::from_slice(&w.result(&id).await.unwrap()).unwrap();
    assert_eq!(result["counted"], 3, "the report stage read what count carried over");
}

#[tokio::test]
async fn a_kind_waiting_for_a_signal_parks_the_job_until_it_and_then_receives_its_payload() {
    use longhaul_aws::ports::JobSignals;
    let w = world();
    let params = json!({"items": 5, "wait_for": {"signal": "approval", "at_item": 2, "timeout_seconds": 600}});
    let id = w.queued("demo", params).await;
    let out = w.first_run(&id, far()).await.expect("the run ends parked");
    assert_eq!(out["run"]["next"], "paused");
    let job = w.job(&id).await;
    assert_eq!((job.status, job.attempt), (JobStatus::Paused, 0), "parked, its attempt unspent");
    let wait = job.pause.as_ref().and_then(|p| p.wait.clone()).expect("what it waits for");
    assert_eq!(wait.signal.as_str(), "approval");
    assert_eq!(
        job.transitions.last().unwrap().reason,
        format!("waiting for signal approval until {}", wait.until)
    );
    let (bucket, at) = w.jobs.index_entry(&id).expect("indexed");
    assert!(bucket.starts_with("paused#"), "{bucket}");
    assert_eq!(at, wait.until.to_rfc3339(), "keyed by when the wait times out");

    let name = "approval".parse().unwrap();
    let kept = w.jobs.put_signal(&id, &name, &json!("yes"), Timestamp::now()).await.unwrap();
    assert_eq!(kept, longhaul_aws::jobs::SignalKept::Kept);
    let execution = w.resume_and_dispatch(&id).await;
    let start = json!({"job_id": id, "worker_arn": WORKER});
    w.run(&id, &execution, start, far()).await.expect("the resumed run finishes");
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Succeeded);
    let result: Value = serde_json::from_slice(&w.result(&id).await.unwrap()).unwrap();
    assert_eq!(result["signals"], json!({"approval": "yes"}));
    assert_eq!(result["digest"], longhaul_job_demo::DemoResult::expected(5).digest);
}

#[test]
fn the_worker_api_and_the_domain_agree_on_signal_names() {
    for name in ["ok", "a.b_c-d", "", "a b", "é", &"x".repeat(64), &"x".repeat(65), "a/b"] {
        assert_eq!(
            name.parse::<longhaul_domain::signals::SignalName>().is_ok(),
            longhaul_worker::is_signal_name(name),
            "{name:?}"
        );
    }
    assert_eq!(longhaul_worker::MAX_WAIT.as_secs(), longhaul_domain::signals::MAX_WAIT_SECONDS);
}

/// A pause reaches every shard of a distributed stage at its next write; `Run`, after the
/// map, parks the job; its resume fans out again and runs only what is left.
#[tokio::test]
async fn a_paused_fanned_out_job_parks_after_the_map_and_its_resume_runs_what_is_left() {
    let w = super::fan_out::distributed();
    let id = w.queued("demo", json!({"items": 8, "shards": 2})).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    w.shard(&out, &items[0], None, far()).await.expect("shard 0 is done before the pause");
    w.jobs.pause(&id, &owners_pause(), lapses()).await.unwrap();
    let err = w.shard(&out, &items[1], None, far()).await.expect_err("paused");
    assert_eq!(err.name(), "Job.Paused", "the map does not retry it");
    let parked = w.run(&id, &id, out.clone(), far()).await.expect("Run after the map");
    assert_eq!(parked["run"]["next"], "paused");
    assert_eq!(w.job(&id).await.status, JobStatus::Paused);

    let execution = w.resume_and_dispatch(&id).await;
    let start = json!({"job_id": id, "worker_arn": WORKER});
    let again = w.run(&id, &execution, start, far()).await.expect("fans out again");
    assert_eq!(again["run"]["next"], "fan_out");
    assert_eq!(again["run"]["fan_out"]["manifest"], out["run"]["fan_out"]["manifest"]);
    let done = w.shard(&again, &items[0], None, far()).await.unwrap();
    assert_eq!(done["next"], "done", "a shard done before the pause is not run again");
    w.shard(&again, &items[1], None, far()).await.expect("the other runs under the new lease");
    let end = w.run(&id, &execution, again, far()).await.unwrap();
    assert_eq!(end["run"]["next"], "done");
    let body = w.result(&id).await.expect("the result");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&body).unwrap(),
        DemoResult::expected_sharded(8, 2)
    );
}
