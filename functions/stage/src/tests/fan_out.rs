//! A fanned-out stage in an execution: `work` splits it and answers the `FanOut` map's
//! manifest, the map's `Shard` state runs each shard (`op: shard`), and `Run` merges them —
//! with every task state called as the state machine calls it.

use super::*;

use longhaul_aws::jobs::ShardProgress;
use longhaul_domain::progress::ShardCounts;

use longhaul_worker::{Shard, ShardOutcome, ShardOutput, StagedFile};

use crate::fan_out::FanOutSettings;
use crate::wire::ManifestItem;

/// Shards whose outputs are files they stage (too large for a shard output), which the merge
/// reads back and concatenates, in shard order.
#[derive(Clone, Copy)]
pub(super) struct Parts;

impl JobKind for Parts {
    const NAME: &'static str = "parts";
    type Params = Value;

    fn stages(&self) -> &'static [&'static str] {
        &["count"]
    }

    fn fans_out(&self, _: &str, _: &Value) -> bool {
        true
    }

    /// `{"whole": true}`: not worth fanning out, run plain (`run_stage`).
    async fn split(
        &self,
        _: &mut dyn StageContext,
        params: &Value,
    ) -> Result<Vec<Shard>, KindError> {
        if params["whole"] == true {
            return Ok(vec![Shard::whole()]);
        }
        (0..3u32).map(|i| Shard::new(&i, 1)).collect()
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        _: &Value,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        let index: u32 = shard.descriptor()?;
        let body = format!("shard {index}\n").repeat(200).into_bytes();
        let staged = ctx.stage_file("part.txt", "text/plain", body).await?;
        Ok(ShardOutcome::Done(ShardOutput::new(&staged)?))
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        _: &Value,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        let mut body = Vec::new();
        for output in outputs {
            body.extend(ctx.read_staged(&output.get::<StagedFile>()?).await?);
        }
        Ok(StageOutcome::Finished(ctx.write_result("all.txt", "text/plain", body).await?))
    }

    /// The whole stage, plain: three items, a checkpoint after each, pausing at the deadline.
    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        _: &Value,
    ) -> Result<StageOutcome, KindError> {
        let mut done: Counted = ctx.resume().await?.unwrap_or_default();
        while done.0 < 3 {
            if ctx.deadline_near() && done.0 > 0 {
                return Ok(StageOutcome::Paused);
            }
            done.0 += 1;
            ctx.checkpoint(&done, done.0, Some(3)).await?;
        }
        let body = format!("plain {}", done.0).into_bytes();
        Ok(StageOutcome::Finished(ctx.write_result("all.txt", "text/plain", body).await?))
    }
}

/// [`Parts`]' plain count.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Counted(u64);

impl longhaul_worker::Checkpoint for Counted {
    const VERSION: u32 = 1;
}

pub(super) fn distributed() -> World {
    world_with(|deps| {
        deps.fan_out = Some(FanOutSettings { bucket: "data".into(), max_parallel_shards: 3 });
    })
}

impl World {
    /// The manifest `out` (a `fan_out` answer) names.
    pub(super) async fn manifest(&self, out: &Value) -> Vec<ManifestItem> {
        let key = out["run"]["fan_out"]["manifest"].as_str().expect("a manifest");
        serde_json::from_slice(&self.object(key).await.expect("the manifest is stored")).unwrap()
    }

    /// The `Shard` state for `item` of the execution state `out`, continuing `run`.
    pub(super) async fn shard(
        &self,
        out: &Value,
        item: &ManifestItem,
        run: Option<&Value>,
        deadline: Instant,
    ) -> Result<Value, StageError> {
        let input = json!({"op": "shard", "job_id": out["job_id"], "lease": out["lease"],
            "stage_index": out["run"]["fan_out"]["stage_index"], "item": item, "run": run});
        handle(&self.deps, serde_json::from_value(input).unwrap(), deadline).await
    }
}

#[tokio::test]
async fn a_stage_fans_out_to_a_manifest_its_shards_run_apart_and_run_merges_them() {
    let w = distributed();
    let id = w.queued("demo", json!({"items": 12, "shards": 4})).await;
    let out = w.first_run(&id, far()).await.expect("fanned out");
    assert_eq!(out["run"]["next"], "fan_out");
    let task = &out["run"]["fan_out"];
    assert_eq!((task["bucket"].as_str(), task["stage_index"].as_u64()), (Some("data"), Some(1)));
    assert_eq!(task["max_concurrency"], 3, "the kind's 10, capped by the deployment's 3");
    let items = w.manifest(&out).await;
    assert_eq!(
        items.iter().map(|i| (i.index, i.shard.items())).collect::<Vec<_>>(),
        [(0, 3), (1, 3), (2, 3), (3, 3)]
    );
    let pending = ShardCounts { total: 4, pending: 4, ..ShardCounts::default() };
    assert_eq!(w.progress(&id).shards, Some(pending), "the split is recorded");

    // The map runs the shards in any order, each on its own; 10 s pass meanwhile.
    for item in items.iter().rev() {
        w.clock.advance(Duration::from_millis(2_500));
        let answer = w.shard(&out, item, None, far()).await.expect("the shard runs");
        assert_eq!(answer["next"], "done");
        if item.index == 2 {
            // Half done 5 s into the stage: about 5 s to go, by the stage's pace.
            assert_eq!(w.progress(&id).eta_seconds, Some(5), "{:?}", w.progress(&id));
        }
    }
    let progress = w.progress(&id);
    assert_eq!(progress.items_done, 12, "each shard's items added to the job's");
    assert_eq!(
        progress.shards,
        Some(ShardCounts { total: 4, succeeded: 4, attempts: 4, ..ShardCounts::default() })
    );
    assert!(progress.shard_seq >= 8, "each shard write moves the stream on");

    // A shard run again after it succeeded (the map's retry of a lost answer): done at once.
    let again = w.shard(&out, &items[0], None, far()).await.unwrap();
    assert_eq!(again["next"], "done");

    // Run, after the map: the merge.
    let done = w.run(&id, &id, out.clone(), far()).await.expect("merged");
    assert_eq!(done["run"]["next"], "done");
    let body = w.result(&id).await.expect("the result");
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&body).unwrap(),
        DemoResult::expected_sharded(12, 4)
    );
    let job = w.job(&id).await;
    assert_eq!(job.status, JobStatus::Succeeded);
    assert_eq!(job.ended_at_stage.and_then(|e| e.shards).map(|s| s.succeeded), Some(4));
    assert!(
        w.keys(&checkpoints(&id)).is_empty(),
        "the manifest and the shards' checkpoints are tidied with the job"
    );
}

#[tokio::test]
async fn a_shard_continues_its_run_past_the_deadline_and_a_retry_after_a_crash_is_an_attempt() {
    let w = distributed();
    let id = w.queued("demo", json!({"items": 10, "shards": 2})).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    let paused = w.shard(&out, &items[1], None, near()).await.expect("paused");
    assert_eq!(paused["next"], "continue");
    // The map's next `Shard` call continues the run: no new attempt.
    let continued = w.shard(&out, &items[1], Some(&paused), near()).await.unwrap();
    assert_eq!(continued["next"], "continue");
    assert_eq!(w.progress(&id).shards.unwrap().attempts, 1, "a continuation is the same run");
    // The invocation died: the map's retry is a new run, and the old one writes nothing.
    let retried = w.shard(&out, &items[1], Some(&paused), far()).await.unwrap();
    assert_eq!(retried["next"], "done");
    let shards = w.progress(&id).shards.unwrap();
    assert_eq!((shards.attempts, shards.succeeded, shards.running), (2, 1, 0), "{shards:?}");
    w.shard(&out, &items[0], None, far()).await.unwrap();
    let done = w.run(&id, &id, out.clone(), far()).await.unwrap();
    assert_eq!(done["run"]["next"], "done");
    let body = w.result(&id).await.unwrap();
    assert_eq!(
        serde_json::from_slice::<DemoResult>(&body).unwrap(),
        DemoResult::expected_sharded(10, 2),
        "the resumed shard went on from its checkpoint"
    );
}

#[tokio::test]
async fn unfinished_shards_after_the_map_fail_the_attempt_and_a_new_run_fans_out_again() {
    let w = distributed();
    let id = w.queued("demo", json!({"items": 6, "shards": 3})).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    w.shard(&out, &items[0], None, far()).await.unwrap();
    let err = w.run(&id, &id, out.clone(), far()).await.expect_err("shards unfinished");
    assert_eq!(err.name(), "Job.Retryable");
    assert!(err.public_message().contains("2 of the 3 shards"), "{}", err.public_message());
    // A `Run` that does not follow the map (a new execution) fans out again, the same manifest.
    let state = json!({"job_id": id, "lease": out["lease"]});
    let seq = w.progress(&id).seq;
    let again = w.run(&id, &id, state, far()).await.unwrap();
    assert_eq!(again["run"]["next"], "fan_out");
    assert_eq!(again["run"]["fan_out"]["manifest"], out["run"]["fan_out"]["manifest"]);
    let progress = w.progress(&id);
    assert!(progress.seq > seq, "the stage clock and the counts written again");
    assert_eq!((progress.items_done, progress.items_total), (2, Some(6)), "the stage's count kept");
    let counts =
        ShardCounts { total: 3, pending: 2, succeeded: 1, attempts: 1, ..ShardCounts::default() };
    assert_eq!(progress.shards, Some(counts), "exact, from the shards' records");
}

#[tokio::test]
async fn a_shard_that_fails_fatally_fails_the_job_with_its_error() {
    let w = distributed();
    let params = json!({"items": 8, "shards": 2, "fail_at": 5, "fail_kind": "fatal"});
    let id = w.queued("demo", params).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    w.shard(&out, &items[0], None, far()).await.expect("shard 0 has no failure");
    let err = w.shard(&out, &items[1], None, far()).await.expect_err("shard 1 fails");
    assert_eq!(err.name(), "Job.Fatal", "the map does not retry it");
    let shards = w.progress(&id).shards.unwrap();
    assert_eq!((shards.failed, shards.succeeded, shards.running), (1, 1, 0));
    let err = w.run(&id, &id, out.clone(), far()).await.expect_err("the merge fails");
    assert_eq!(err.name(), "Job.Fatal");
    assert!(
        err.public_message().starts_with("shard 1 of stage `process` failed"),
        "{}",
        err.public_message()
    );
    w.record_failure(&id, &id, out, err).await.unwrap();
    let (code, _) = w.failed_with(&id).await;
    assert_eq!(code, "Job.Fatal");
}

/// The map fails on one shard while another's invocation still runs (Step Functions stops the
/// map's child executions, not invocations under way): once the failure is recorded, that
/// shard's next progress write is refused and it stops, counting nothing into the job.
#[tokio::test]
async fn a_shard_still_running_when_the_job_fails_is_fenced_off() {
    let w = distributed();
    let params = json!({"items": 8, "shards": 2, "fail_at": 5, "fail_kind": "fatal"});
    let id = w.queued("demo", params).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    let paused = w.shard(&out, &items[0], None, near()).await.expect("shard 0 runs on");
    assert_eq!(paused["next"], "continue");
    let lease = w.job(&id).await.lease.expect("the attempt's lease");
    let err = w.shard(&out, &items[1], None, far()).await.expect_err("shard 1 fails");
    // The map's Catch hands the shard's error to RecordFailure.
    w.record_failure(&id, &id, out.clone(), err).await.unwrap();
    assert_eq!(w.job(&id).await.status, JobStatus::Failed);
    let ended = w.progress(&id);
    assert!(ended.lease.starts_with("revoked:"), "the attempt's workers are fenced off");
    // Shard 0's invocation, mid-run, writes its progress as it always does: refused.
    let add = ShardProgress { items: 1, pct: 12.5, ..ShardProgress::default() };
    let refused = w.jobs.add_shard_progress(&id, &lease, &add).await;
    assert!(refused.is_err(), "the failed attempt's shard counts on: {refused:?}");
    // Its next invocation stops before any work.
    let late = w.shard(&out, &items[0], Some(&paused), far()).await.expect_err("fenced off");
    assert_eq!(late.name(), "Job.LeaseLost", "{late:?}");
    let after = w.progress(&id);
    assert_eq!((after.items_done, after.shards), (ended.items_done, ended.shards));
}

#[tokio::test]
async fn a_cancellation_reaches_every_shard_and_the_merge_ends_the_job_cancelled() {
    let w = distributed();
    let id = w.queued("demo", json!({"items": 6, "shards": 2})).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    w.jobs.cancel(&id, &owners_cancellation()).await.unwrap();
    let err = w.shard(&out, &items[0], None, far()).await.expect_err("cancelled");
    assert_eq!(err.name(), "Job.Cancelled");
    let ended = w.run(&id, &id, out.clone(), far()).await.expect("Run after the map");
    assert_eq!(ended["run"]["next"], "cancelled");
    assert_eq!(w.job(&id).await.status, JobStatus::Cancelled);
    let late = w.shard(&out, &items[1], None, far()).await.expect_err("the job ended");
    assert_eq!(late.name(), "Job.LeaseLost", "a shard of an ended job runs nothing");
}

#[tokio::test]
async fn a_merge_reads_the_files_its_shards_staged_each_in_its_own_invocation() {
    let w = distributed();
    let id = w.queued("parts", json!({})).await;
    let out = w.first_run(&id, far()).await.unwrap();
    let items = w.manifest(&out).await;
    for item in items.iter().rev() {
        w.shard(&out, item, None, far()).await.expect("the shard stages its part");
    }
    let staged = w.keys(&checkpoints(&id));
    assert!(
        staged.iter().any(|k| k.contains("shard2-part.txt")),
        "each shard's file apart: {staged:?}"
    );
    let done = w.run(&id, &id, out, far()).await.expect("merged");
    assert_eq!(done["run"]["next"], "done");
    // Larger than a record keeps: stored in the bucket, under the attempt's key.
    assert_eq!(w.job(&id).await.result_inline, None);
    let body = w.object(&format!("results/{id}/1/all.txt")).await.expect("the result");
    let expected: String = (0..3).map(|i| format!("shard {i}\n").repeat(200)).collect();
    assert_eq!(String::from_utf8(body).unwrap(), expected, "read back, in shard order");
}

/// A stage whose split answers `Shard::whole` runs plain in its own invocations: no manifest,
/// no map, no shard counts — paused at the deadline and resumed from the kind's own
/// checkpoint like any stage.
#[tokio::test]
async fn a_stage_split_into_the_whole_runs_plain_without_the_map() {
    let w = distributed();
    let id = w.queued("parts", json!({"whole": true})).await;
    let paused = w.first_run(&id, near()).await.expect("ran plain");
    assert_eq!(paused["run"]["next"], "continue", "{paused}");
    assert!(paused["run"]["fan_out"].is_null(), "no map: {paused}");
    assert_eq!(w.progress(&id).items_done, 1);
    let done = w.run(&id, &id, paused.clone(), far()).await.expect("resumed plain");
    assert_eq!(done["run"]["next"], "done", "{done}");
    let body = w.result(&id).await.expect("the result");
    assert_eq!(body, b"plain 3");
    assert_eq!(w.progress(&id).shards, None, "it never fanned out");
    assert!(!w.keys(&checkpoints(&id)).iter().any(|k| k.ends_with("-shards.json")), "no manifest");
}
