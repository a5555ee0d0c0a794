//! The shards' contract ([`JobShards`]): a shard is taken by one run at a time — a
//! continuation of the run that holds it counts no attempt, any other take counts one — and
//! only that run's writes land; a shard that ended is answered as it is; a stage's shards are
//! read in index order, apart from other stages'; a shard's progress adds to the job's
//! record under the attempt's lease, and is refused once the owner cancelled.

use longhaul_aws::jobs::{
    ProgressRecord, ProgressRefused, ShardKey, ShardProgress, ShardStatus, ShardTaken, ShardUpdate,
    StoreError,
};
use longhaul_aws::ports::JobShards;
use longhaul_domain::progress::ShardCounts;
use longhaul_domain::{Cancellation, JobId, Timestamp};

use super::{AttemptTable, fresh_owner, pending_job};

/// Runs the whole contract on `store`. Panics, naming the clause, on the first breach.
pub async fn job_shards(store: &(impl AttemptTable + JobShards)) {
    a_shard_is_held_by_one_run_and_only_its_writes_land(store).await;
    a_stages_shards_are_read_in_order_apart_from_other_stages(store).await;
    shard_progress_adds_to_the_jobs_under_its_lease(store).await;
}

fn key(stage_index: u32, index: u32) -> ShardKey {
    ShardKey { stage_index, index }
}

fn taken(result: Result<ShardTaken, StoreError>) -> (u32, bool) {
    match result {
        Ok(ShardTaken::Taken { record, continued }) => (record.attempts, continued),
        other => panic!("expected the shard taken, got {other:?}"),
    }
}

async fn a_shard_is_held_by_one_run_and_only_its_writes_land(store: &impl JobShards) {
    let job = JobId::new();
    let k = key(2, 7);
    assert_eq!(taken(store.take_shard(&job, k, ("l", 1), "run-1", None).await), (1, false));
    let progress = ShardUpdate::Progress { reported: 5, checkpoint_key: Some("cp-1".into()) };
    store.update_shard(&job, k, "run-1", &progress).await.expect("the holder writes");
    // The deadline's continuation: the same run, no attempt.
    assert_eq!(
        taken(store.take_shard(&job, k, ("l", 1), "run-2", Some("run-1")).await),
        (1, true),
        "a continuation of the holding run counts no attempt"
    );
    assert!(
        matches!(
            store.update_shard(&job, k, "run-1", &progress).await,
            Err(StoreError::Conflict { .. })
        ),
        "a run taken over writes nothing"
    );
    // A crash: the next take does not continue the holder.
    let (attempts, continued) =
        taken(store.take_shard(&job, k, ("l", 1), "run-3", Some("run-1")).await);
    assert_eq!((attempts, continued), (2, false), "any other take is another attempt");
    let shards = store.shards(&job, 2).await.unwrap();
    assert_eq!(shards.len(), 1);
    assert_eq!(
        (shards[0].reported, shards[0].checkpoint_key.as_deref(), shards[0].run.as_str()),
        (5, Some("cp-1"), "run-3"),
        "a take keeps the checkpoint and the count"
    );
    let done = ShardUpdate::Succeeded { reported: 9, output: "{\"n\":1}".into() };
    store.update_shard(&job, k, "run-3", &done).await.expect("the holder ends it");
    match store.take_shard(&job, k, ("l", 1), "run-4", None).await {
        Ok(ShardTaken::Ended(record)) => {
            assert_eq!(record.status, ShardStatus::Succeeded);
            assert_eq!((record.output.as_deref(), record.reported), (Some("{\"n\":1}"), 9));
        }
        other => panic!("an ended shard is answered as it is, not taken: {other:?}"),
    }
    // A later attempt takes a running shard; an invocation of the earlier one cannot take
    // it back.
    let later = key(2, 9);
    taken(store.take_shard(&job, later, ("l", 1), "run-a1", None).await);
    taken(store.take_shard(&job, later, ("l2", 2), "run-a2", None).await);
    assert!(
        matches!(
            store.take_shard(&job, later, ("l", 1), "run-a1-late", None).await,
            Err(StoreError::Conflict { .. })
        ),
        "an earlier attempt never takes a shard back"
    );
    assert_eq!(store.shards(&job, 2).await.unwrap().last().unwrap().run, "run-a2");
    let failing = key(2, 8);
    taken(store.take_shard(&job, failing, ("l", 1), "run-5", None).await);
    let failed = ShardUpdate::Failed { error: "bad row".into() };
    store.update_shard(&job, failing, "run-5", &failed).await.unwrap();
    assert!(
        matches!(
            store.update_shard(&job, failing, "run-5", &progress).await,
            Err(StoreError::Conflict { .. })
        ),
        "an ended shard takes no more writes"
    );
}

async fn a_stages_shards_are_read_in_order_apart_from_other_stages(store: &impl JobShards) {
    let job = JobId::new();
    for index in [12, 3, 100, 0] {
        taken(store.take_shard(&job, key(1, index), ("l", 1), &format!("r{index}"), None).await);
    }
    taken(store.take_shard(&job, key(3, 1), ("l", 1), "other-stage", None).await);
    taken(store.take_shard(&JobId::new(), key(1, 1), ("l", 1), "other-job", None).await);
    let indexes: Vec<u32> = store.shards(&job, 1).await.unwrap().iter().map(|s| s.index).collect();
    assert_eq!(indexes, [0, 3, 12, 100], "a stage's shards, in index order");
    assert!(store.shards(&job, 2).await.unwrap().is_empty(), "a stage with none");
}

async fn shard_progress_adds_to_the_jobs_under_its_lease(store: &(impl AttemptTable + JobShards)) {
    let job = pending_job(&fresh_owner("shards"), Timestamp::now());
    let id = job.job_id.clone();
    store.put_job(&job).await.unwrap();
    let queue = longhaul_aws::jobs::TransitionRequest::new(
        &id,
        &[longhaul_domain::JobStatus::Pending],
        longhaul_domain::JobStatus::Queued,
        "queued",
    )
    .set("execution", "exec-1")
    .set("dispatches", 1);
    store.transition(queue).await.unwrap();
    let (lease, _) = store.claim(&id, "exec-1").await.unwrap();
    let add = ShardProgress {
        items: 4,
        pct: 2.5,
        started: 1,
        running: 1,
        attempts: 1,
        ..ShardProgress::default()
    };
    assert!(
        matches!(
            store.add_shard_progress(&id, &lease.token, &add).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "refused before the stage recorded its shards"
    );
    let counts = ShardCounts { total: 3, pending: 3, ..ShardCounts::default() };
    let split = ProgressRecord {
        pct: 10.0,
        items_done: 1,
        items_total: Some(30),
        seq: 1,
        lease: lease.token.clone(),
        shards: Some(counts),
        ..ProgressRecord::default()
    };
    store.record_progress(&id, &split).await.unwrap();
    let pct = store.add_shard_progress(&id, &lease.token, &add).await.expect("under the lease");
    assert_eq!(pct, 12.5, "the job's percentage after the write");
    let done = ShardProgress {
        items: 6,
        pct: 1.5,
        running: -1,
        succeeded: 1,
        eta_seconds: Some(42),
        ..ShardProgress::default()
    };
    store.add_shard_progress(&id, &lease.token, &done).await.unwrap();
    let progress = store.view(&id).await.unwrap().unwrap().progress.unwrap();
    assert_eq!((progress.items_done, progress.pct), (11, 14.0), "items and points add up");
    assert_eq!(
        progress.shards,
        Some(ShardCounts {
            total: 3,
            pending: 2,
            running: 0,
            succeeded: 1,
            failed: 0,
            attempts: 1
        })
    );
    assert_eq!((progress.seq, progress.event_seq()), (1, 3), "each write moves the stream on");
    assert_eq!(progress.eta_seconds, Some(42), "a shard's estimate is kept");
    assert!(
        matches!(
            store.add_shard_progress(&id, "another-lease", &add).await,
            Err(ProgressRefused::LeaseLost)
        ),
        "another lease's shard adds nothing"
    );
    let asked = Cancellation {
        requested_at: Timestamp::now(),
        requested_by: job.owner.clone(),
        reason: None,
    };
    store.cancel(&id, &asked).await.unwrap();
    assert!(
        matches!(
            store.add_shard_progress(&id, &lease.token, &add).await,
            Err(ProgressRefused::Cancelled)
        ),
        "a cancellation reaches every shard at its next write"
    );
    let after = store.view(&id).await.unwrap().unwrap().progress.unwrap();
    assert_eq!(after.items_done, 11, "a refused write adds nothing");
}
