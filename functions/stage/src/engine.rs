//! The stage engine: what every job type's stages share — the deadline, lease-fenced
//! progress with heartbeats and an ETA, and checkpoints that a crashed or continued
//! invocation resumes from.
//!
//! Checkpoints are written as new objects (`checkpoints/<job>/<stage>/<seq>.json`) and then
//! made current by a progress write that carries their key; that write is conditional on the
//! lease, so a stale attempt may leave an orphan object behind but can never make a newer
//! checkpoint unreachable. Every checkpoint carries a `schema_version`: one that does not match
//! the stage's current version is never consumed — the stage restarts from its beginning,
//! with a warning in the log.

use std::time::{Duration, Instant};

use longhaul_aws::jobs::{JobRecord, Lease, ProgressRecord, ProgressRefused};
use longhaul_aws::objects::checkpoint_key;
use longhaul_domain::now_rfc3339;
use longhaul_domain::progress::{Position, eta_seconds, overall_pct};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::failure::{CHECKPOINT_FAILED, Failure, PublicMessage};
use crate::{Deps, StageError};

/// A checkpoint object.
#[derive(Debug, Serialize, Deserialize)]
pub struct Checkpoint<T> {
    /// The version of the stage's state schema that wrote it.
    pub schema_version: u32,
    /// The stage it belongs to.
    pub stage: String,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// When.
    pub written_at: String,
    /// The stage's state.
    pub state: T,
}

/// How a stage invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOutcome {
    /// The deadline is near; the state is checkpointed; call again.
    Paused,
    /// This stage is complete; the next stage starts in the next invocation.
    StageDone,
    /// The last stage is complete and the result is durable at this key.
    Finished {
        /// The result object's key.
        result_key: String,
    },
}

/// One invocation's view of its stage.
pub struct Ctx<'a> {
    /// Adapters and settings.
    pub deps: &'a Deps,
    /// The job as read at the start of the invocation.
    pub job: &'a JobRecord,
    /// The attempt's lease.
    pub lease: &'a Lease,
    /// The stage's name.
    pub stage: &'static str,
    /// 1-based index of the stage.
    pub stage_index: u32,
    /// How many stages the job type has.
    pub stages_total: u32,
    stop_at: Instant,
    seq: u64,
    last_write: Instant,
    last_pct: f64,
    floor_done: u64,
    checkpoint_key: Option<String>,
    origin: Option<(Instant, f64)>,
    last_checkpoint: (Instant, u64),
    changed_at: Option<String>,
}

impl<'a> Ctx<'a> {
    /// The context of stage `stage_index` (1-based) of `stages`, continuing from `progress`.
    pub fn new(
        deps: &'a Deps,
        job: &'a JobRecord,
        lease: &'a Lease,
        stages: &[&'static str],
        progress: &ProgressRecord,
        deadline: Instant,
    ) -> Self {
        let stage_index = progress.stage_index.clamp(1, stages.len() as u32);
        let same_stage = progress.stage_index == stage_index;
        Ctx {
            deps,
            job,
            lease,
            stage: stages[stage_index as usize - 1],
            stage_index,
            stages_total: stages.len() as u32,
            stop_at: deadline.checked_sub(deps.margin).unwrap_or_else(Instant::now),
            seq: progress.seq,
            last_write: Instant::now(),
            last_pct: progress.pct,
            floor_done: if same_stage { progress.items_done } else { 0 },
            checkpoint_key: if same_stage { progress.checkpoint_key.clone() } else { None },
            origin: None,
            last_checkpoint: (Instant::now(), 0),
            changed_at: progress.progress_changed_at.clone(),
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job.job_id
    }

    /// Whether the stage must stop now (checkpoint and return `Paused`): Lambda would stop the
    /// invocation within the configured margin.
    pub fn deadline_near(&self) -> bool {
        Instant::now() >= self.stop_at
    }

    /// Whether a checkpoint is due: every `checkpoint_items` items or `checkpoint_interval`,
    /// whichever comes first.
    pub fn checkpoint_due(&self, items_done: u64) -> bool {
        items_done.saturating_sub(self.last_checkpoint.1) >= self.deps.checkpoint_items
            || self.last_checkpoint.0.elapsed() >= self.deps.checkpoint_interval
    }

    /// Reports progress: at most one write per progress interval (2 s by default — what a
    /// progress bar needs, and each write is a billed DynamoDB write), which also serves as
    /// the heartbeat. Writing on every whole percent as well, as this once did, cost a 10 s
    /// job about a hundred writes instead of five (`make bench` measured it).
    pub async fn progress(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        let since = self.last_write.elapsed();
        if since >= self.deps.progress_interval || since >= self.deps.heartbeat_interval {
            self.write(done, total).await?;
        }
        Ok(())
    }

    /// Writes a heartbeat if one is due (for work that makes no countable progress for a while).
    pub async fn heartbeat(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        if self.last_write.elapsed() >= self.deps.heartbeat_interval {
            self.write(done, total).await?;
        }
        Ok(())
    }

    fn pct(&self, done: u64, total: Option<u64>) -> f64 {
        let position = Position {
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            done,
            total,
        };
        overall_pct(position, self.last_pct)
    }

    /// Writes the progress record now (monotonic: never below what was reported before).
    async fn write(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        let pct = self.pct(done, total);
        let now = Instant::now();
        let origin = *self.origin.get_or_insert((now, pct));
        let elapsed = now.duration_since(origin.0).as_secs_f64();
        // ETA from this invocation's throughput; none until 10 % is done.
        let eta = eta_seconds(pct, origin.1, elapsed);
        self.seq += 1;
        let stamp = now_rfc3339();
        let items_done = done.max(self.floor_done);
        if pct > self.last_pct || items_done > self.floor_done || self.changed_at.is_none() {
            self.changed_at = Some(stamp.clone());
        }
        let record = ProgressRecord {
            pct,
            stage: self.stage.to_owned(),
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            items_done,
            items_total: total,
            eta_seconds: eta,
            seq: self.seq,
            heartbeat_at: stamp.clone(),
            updated_at: stamp.clone(),
            lease: self.lease.token.clone(),
            checkpoint_key: self.checkpoint_key.clone(),
            cancel_requested_at: None,
            progress_changed_at: self.changed_at.clone(),
            attempt: Some(self.lease.attempt),
        };
        self.deps.jobs.record_progress(&self.job.job_id, &record).await.map_err(refused)?;
        self.last_write = now;
        self.last_pct = pct;
        self.floor_done = record.items_done;
        Ok(())
    }

    /// Saves `state` as the stage's checkpoint and makes it current (fenced).
    pub async fn checkpoint<T: Serialize>(
        &mut self,
        version: u32,
        state: &T,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        let key = checkpoint_key(&self.job.job_id, self.stage, self.seq + 1);
        let body = serde_json::to_vec(&Checkpoint {
            schema_version: version,
            stage: self.stage.to_owned(),
            attempt: self.lease.attempt,
            written_at: now_rfc3339(),
            state,
        })
        .expect("checkpoints serialise");
        self.deps
            .objects
            .put(&key, body, "application/json")
            .await
            .map_err(|e| StageError::retryable(CHECKPOINT_FAILED, e))?;
        self.checkpoint_key = Some(key);
        self.write(done, total).await?;
        self.last_checkpoint = (Instant::now(), done);
        Ok(())
    }

    /// Whether the current checkpoint is this stage's own (written by an earlier invocation of
    /// this stage), not the previous stage's output carried across the boundary. Told by its
    /// key, so the common case costs no read.
    pub fn has_own_checkpoint(&self) -> bool {
        let own = format!(
            "{}{}/",
            longhaul_aws::objects::checkpoints_prefix(&self.job.job_id),
            self.stage
        );
        self.checkpoint_key.as_deref().is_some_and(|key| key.starts_with(&own))
    }

    /// The previous stage's final checkpoint, which this stage starts from (the progress record
    /// keeps pointing at it across the stage boundary). A version mismatch here cannot be
    /// healed by restarting this stage, so it fails the job with a clear reason (the object's
    /// key goes to the log only: our storage layout is not the client's business).
    pub async fn carried<T: DeserializeOwned>(
        &mut self,
        stage: &str,
        version: u32,
    ) -> Result<T, StageError> {
        let public =
            |what: &str| PublicMessage::domain(format!("the {stage} stage's output {what}"));
        let key = self
            .checkpoint_key
            .clone()
            .ok_or_else(|| StageError::Fatal(Failure::new(public("is missing"))))?;
        let bytes = self
            .deps
            .objects
            .get(&key)
            .await
            .map_err(|e| StageError::retryable(CHECKPOINT_FAILED, e))?
            .ok_or_else(|| StageError::fatal(public("is missing"), format!("no object {key}")))?;
        let checkpoint: Checkpoint<T> = serde_json::from_slice(&bytes)
            .ok()
            .filter(|c: &Checkpoint<T>| c.schema_version == version && c.stage == stage)
            .ok_or_else(|| {
                StageError::fatal(
                    public(&format!("is not of schema version {version}")),
                    format!("object {key}"),
                )
            })?;
        Ok(checkpoint.state)
    }

    /// The stage's current checkpoint, if there is one of schema `version`. A checkpoint of
    /// another version is not consumed: the stage restarts (logged).
    pub async fn resume<T: DeserializeOwned>(
        &mut self,
        version: u32,
    ) -> Result<Option<T>, StageError> {
        let Some(key) = self.checkpoint_key.clone() else { return Ok(None) };
        let Some(bytes) = self
            .deps
            .objects
            .get(&key)
            .await
            .map_err(|e| StageError::retryable(CHECKPOINT_FAILED, e))?
        else {
            tracing::warn!(key, "the current checkpoint is missing; restarting the stage");
            return Ok(None);
        };
        #[derive(Deserialize)]
        struct Header {
            schema_version: u32,
            stage: String,
        }
        let unreadable = PublicMessage::fixed("a checkpoint of the job is unreadable");
        let header: Header = serde_json::from_slice(&bytes)
            .map_err(|e| StageError::fatal(unreadable.clone(), format!("checkpoint {key}: {e}")))?;
        if header.stage != self.stage {
            // The previous stage's output, carried across the boundary: nothing to resume.
            return Ok(None);
        }
        if header.schema_version != version {
            tracing::warn!(
                key,
                found = header.schema_version,
                expected = version,
                "checkpoint schema version mismatch; restarting the stage instead of consuming it"
            );
            self.floor_done = 0;
            return Ok(None);
        }
        let checkpoint: Checkpoint<T> = serde_json::from_slice(&bytes).map_err(|e| {
            StageError::fatal(
                unreadable,
                format!("checkpoint {key} does not match its schema version {version}: {e}"),
            )
        })?;
        tracing::info!(stage = self.stage, key, "resuming from checkpoint");
        Ok(Some(checkpoint.state))
    }

    /// Moves the progress record to the next stage (the stage boundary). The checkpoint
    /// pointer is kept: the finished stage's last checkpoint is the next stage's input.
    pub async fn advance(&mut self, next_stage: &'static str) -> Result<(), StageError> {
        self.stage_index += 1;
        self.stage = next_stage;
        self.floor_done = 0;
        self.write(0, None).await
    }

    /// Sleeps `duration` in short steps, heartbeating while it waits.
    pub async fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        let step =
            self.deps.heartbeat_interval.min(Duration::from_secs(5)).max(Duration::from_millis(1));
        let end = Instant::now() + duration;
        while let Some(left) = end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            tokio::time::sleep(left.min(step)).await;
            self.heartbeat(done, total).await?;
        }
        Ok(())
    }
}

fn refused(err: ProgressRefused) -> StageError {
    match err {
        ProgressRefused::Cancelled => StageError::Cancelled,
        ProgressRefused::LeaseLost => StageError::LeaseLost("another attempt holds the job".into()),
        ProgressRefused::Stale { seq } => {
            StageError::LeaseLost(format!("a duplicate worker already recorded progress {seq}"))
        }
        ProgressRefused::Store(err) => crate::store_failed(err),
    }
}
