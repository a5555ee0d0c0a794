//! The `shard` op: one shard of a distributed stage, as the `FanOut` map's `Shard` state runs
//! it ([`crate::fan_out`]).
//!
//! The invocation checks that the job is still running under the lease in that stage (and
//! not cancelled, paused, or past its stage timeout), takes the shard's record for a run of
//! its own (continuing the run of its previous answer, else as a new attempt of the shard),
//! and runs the kind's `run_shard` over the shard's own context ([`ShardCtx`]). It answers
//! `continue` (the deadline neared: the map runs it again, the same run) or `done` (its output
//! kept on its record); a fatal failure is recorded on the shard before it fails the map's
//! iteration, so the merge fails the job with it. Any other failure is retried by the map, the
//! shard alone, from its own checkpoint.

use std::time::Instant;

use longhaul_aws::jobs::{
    ShardKey, ShardProgress, ShardStatus, ShardTaken, ShardUpdate, StoreError,
};
use longhaul_domain::{JobId, JobStatus};
use longhaul_worker::ShardOutcome;
use serde_json::Value;

use crate::engine::Ctx;
use crate::engine::shard::ShardCtx;
use crate::failure_message::{Failure, PublicMessage};
use crate::wire::{ManifestItem, ShardAnswer, ShardNext, TaskLease};
use crate::{Deps, StageError, store_failed, work};

/// Runs shard `item` of stage `stage_index` of `job_id` under `lease`; `previous`: this map
/// iteration's previous answer.
pub(crate) async fn run(
    deps: &Deps,
    job_id: &JobId,
    lease: &TaskLease,
    stage_index: u32,
    item: &ManifestItem,
    previous: Option<&ShardAnswer>,
    deadline: Instant,
) -> Result<Value, StageError> {
    let view = deps.jobs.view(job_id).await.map_err(store_failed)?.ok_or_else(|| {
        StageError::Fatal(Failure::new(PublicMessage::fixed("the job does not exist")))
    })?;
    let job = &view.job;
    if job.status != JobStatus::Running || job.lease.as_deref() != Some(&lease.token) {
        return Err(StageError::LeaseLost(format!("job is {} under another lease", job.status)));
    }
    let progress = view.progress.clone().unwrap_or_default();
    if job.cancellation.is_some() || progress.cancel_requested_at.is_some() {
        return Err(StageError::Cancelled);
    }
    if job.pause.is_some() || progress.pause_requested_at.is_some() {
        return Err(StageError::Paused);
    }
    if progress.stage_index != stage_index {
        return Err(StageError::LeaseLost(format!(
            "the job is at stage {}, not the fanned-out stage {stage_index}",
            progress.stage_index
        )));
    }
    let (kind, run) = work::kind_run(deps, job)?;
    let ctx = Ctx::new(deps, job, lease, kind.stages(), &progress, deadline, &run);
    ctx.check_stage_timeout()?;
    let key = ShardKey { stage_index, index: item.index };
    let token = run_token()?;
    let continues = previous.map(|p| p.run.as_str());
    let taken = deps
        .jobs
        .take_shard(job_id, key, (&lease.token, lease.attempt), &token, continues)
        .await
        .map_err(|err| match err {
            StoreError::Conflict { .. } => {
                StageError::LeaseLost(format!("a later attempt holds shard {}", item.index))
            }
            other => store_failed(other),
        })?;
    let answer = |next: ShardNext| {
        Ok(serde_json::to_value(ShardAnswer { next, run: token.clone() })
            .expect("answers serialise"))
    };
    let (record, continued) = match taken {
        ShardTaken::Ended(record) if record.status == ShardStatus::Succeeded => {
            return answer(ShardNext::Done);
        }
        ShardTaken::Ended(record) => {
            let why = record.error.unwrap_or_else(|| "the shard failed".into());
            return Err(StageError::Fatal(Failure::new(PublicMessage::domain(why))));
        }
        ShardTaken::Taken { record, continued } => (record, continued),
    };
    let stage_items = progress.items_total.unwrap_or(0);
    let mut shard = ShardCtx::new(ctx, &*deps.jobs, &record, item.shard.items(), stage_items);
    // The first take leaves pending; each take that is not a continuation is an attempt.
    let first = record.attempts == 1 && !continued;
    let start = ShardProgress {
        started: i64::from(first),
        running: i64::from(first),
        attempts: i64::from(!continued),
        ..ShardProgress::default()
    };
    if start != ShardProgress::default() {
        shard.add(start).await?;
    }
    tracing::info!(shard = item.index, continued, attempts = record.attempts, "shard runs");
    let outcome = kind.run_shard(&mut shard, &job.params, &item.shard).await;
    match outcome {
        Ok(ShardOutcome::Paused) => match shard.stopped() {
            Some(stopped) => Err(stopped),
            None => answer(ShardNext::Continue),
        },
        Ok(ShardOutcome::Done(output)) => {
            let output = serde_json::to_string(&output).expect("shard outputs serialise");
            let add = shard.added(
                item.shard.items(),
                ShardProgress { running: -1, succeeded: 1, ..ShardProgress::default() },
            );
            let reported = shard.reported() + add.items;
            shard.write_record(&ShardUpdate::Succeeded { reported, output }).await?;
            ended(&mut shard, add).await?;
            tracing::info!(shard = item.index, "shard done");
            answer(ShardNext::Done)
        }
        Err(err) => {
            let err = StageError::from(err);
            if let StageError::Fatal(failure) = &err {
                let error = failure.public.to_string();
                shard.write_record(&ShardUpdate::Failed { error }).await?;
                let add = ShardProgress { running: -1, failed: 1, ..ShardProgress::default() };
                ended(&mut shard, add).await?;
            }
            Err(err)
        }
    }
}

/// Counts a shard's end into the job's progress. Its record says how it ended whatever this
/// write does: a cancellation or pause seen here is the merge's to act on.
async fn ended(shard: &mut ShardCtx<'_>, add: ShardProgress) -> Result<(), StageError> {
    match shard.add(add).await {
        Ok(()) | Err(StageError::Cancelled | StageError::Paused) => Ok(()),
        Err(err) => Err(err),
    }
}

/// A fresh token for one invocation's hold on a shard, from the OS's RNG.
fn run_token() -> Result<String, StageError> {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| {
        StageError::retryable(PublicMessage::fixed("the worker could not start the shard"), e)
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
