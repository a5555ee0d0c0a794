//! One shard of a distributed stage, in its own invocation: the worker API's [`StageContext`]
//! over the shard's record ([`longhaul_aws::jobs::ShardRecord`]) instead of the job's
//! progress record.
//!
//! The shard's checkpoints are objects of their own (`checkpoints/<job>/<stage>/shard<i>-…`),
//! made current by a write to the shard's record fenced by the invocation's `run`, so a stale
//! invocation of the shard (one the map gave up on and ran again) can never move it. Its
//! progress is added to the job's progress record ([`JobShards::add_shard_progress`]), fenced
//! by the attempt's lease and refused once the owner cancels or pauses the job — how a
//! running shard learns of either, as a stage does. The record keeps the items the shard
//! counted into the job's progress, written before they are added, so a run that resumes
//! from its checkpoint never counts an item twice.
//!
//! Everything else — inputs, staged files, the deadline and the checkpoint cadence, the
//! stage's timeout — is the stage's ([`Ctx`]).

use super::*;

use longhaul_aws::jobs::{ShardKey, ShardProgress, ShardRecord, ShardUpdate, StoreError};
use longhaul_aws::ports::JobShards;
use longhaul_worker::fan_out::{NOT_CARRIED, SHARD_RESULT, SHARD_WAIT};
use serde_json::Value;

/// One invocation of one shard.
pub struct ShardCtx<'a> {
    /// The stage's context (never writes the job's progress record here).
    pub(crate) inner: Ctx<'a>,
    shards: &'a dyn JobShards,
    key: ShardKey,
    /// The shard's items: what its progress counts to.
    items: u64,
    /// This invocation's token: every write to the shard's record is fenced by it.
    run: String,
    /// Items counted into the job's progress so far (kept on the shard's record first).
    reported: u64,
    /// Percentage points of the job one item of the stage is.
    points_per_item: f64,
    /// The job's percentage when the stage started, and the job's after this invocation's
    /// last write: what the ETA is estimated from (the stage's pace since it started).
    start_pct: f64,
    seen_pct: Option<f64>,
    checkpoint_key: Option<String>,
    last_checkpoint: (Instant, u64),
    last_write: Instant,
    stop: Option<Stop>,
}

impl<'a> ShardCtx<'a> {
    /// The context of `record`'s shard (taken by `run`), of `items` items, in a stage of
    /// `stage_items`.
    pub fn new(
        inner: Ctx<'a>,
        shards: &'a dyn JobShards,
        record: &ShardRecord,
        items: u64,
        stage_items: u64,
    ) -> Self {
        let now = inner.deps.clock.instant();
        let at = |done| {
            let position = Position {
                stage_index: inner.stage_index,
                stages_total: inner.stages_total,
                done,
                total: Some(stage_items),
            };
            weighted_pct(position, inner.weights, 0.0)
        };
        let start_pct = at(0);
        let points_per_item = match stage_items {
            0 => 0.0,
            n => (at(n) - start_pct).max(0.0) / n as f64,
        };
        ShardCtx {
            key: ShardKey { stage_index: record.stage_index, index: record.index },
            items,
            run: record.run.clone(),
            reported: record.reported.min(items),
            points_per_item,
            start_pct,
            seen_pct: None,
            checkpoint_key: record.checkpoint_key.clone(),
            last_checkpoint: (now, 0),
            last_write: now,
            stop: None,
            shards,
            inner,
        }
    }

    /// Why the shard stopped, if the owner asked it to.
    pub(crate) fn stopped(&self) -> Option<StageError> {
        match self.stop {
            Some(Stop::Cancel) => Some(StageError::Cancelled),
            Some(Stop::Pause) => Some(StageError::Paused),
            None => None,
        }
    }

    /// Items the shard counted into the job's progress.
    pub(crate) fn reported(&self) -> u64 {
        self.reported
    }

    /// What moving the count to `done` adds to the job's progress, with `counts`.
    pub(crate) fn added(&self, done: u64, counts: ShardProgress) -> ShardProgress {
        let items = done.min(self.items).saturating_sub(self.reported);
        ShardProgress { items, pct: items as f64 * self.points_per_item, ..counts }
    }

    /// Adds `add` to the job's progress (a refusal for a cancellation or pause asks the shard
    /// to stop and is answered as one, as [`Ctx::progress`] does).
    pub(crate) async fn add(&mut self, add: ShardProgress) -> Result<(), StageError> {
        // The stage's pace since it started, from the job's percentage at this invocation's
        // last write: every shard's items are in it.
        let started = self.inner.stage_clock.started_at;
        let elapsed = Timestamp::from(self.inner.deps.clock.now()).since(started).as_secs_f64();
        let eta = self.seen_pct.and_then(|pct| {
            longhaul_domain::progress::eta_seconds(pct + add.pct, self.start_pct, elapsed)
        });
        let add = ShardProgress { eta_seconds: eta, ..add };
        let job_id = &self.inner.job.job_id;
        let added = self.shards.add_shard_progress(job_id, &self.inner.lease.token, &add).await;
        match added {
            Ok(pct) => {
                self.seen_pct = Some(pct);
                self.reported = self.reported.saturating_add(add.items);
                self.last_write = self.inner.deps.clock.instant();
                Ok(())
            }
            Err(ProgressRefused::Cancelled) => {
                self.stop = Some(Stop::Cancel);
                Err(StageError::Cancelled)
            }
            Err(ProgressRefused::PauseRequested) => {
                self.stop.get_or_insert(Stop::Pause);
                Err(StageError::Paused)
            }
            Err(other) => Err(refused(other)),
        }
    }

    /// Counts the shard's items up to `done` (at most its items) into the job's progress: on
    /// the shard's record first (fenced by the run), then added to the job's.
    async fn count(&mut self, done: u64, checkpoint: Option<String>) -> Result<(), StageError> {
        let add = self.added(done, ShardProgress::default());
        let update = ShardUpdate::Progress {
            reported: self.reported + add.items,
            checkpoint_key: checkpoint,
        };
        self.write_record(&update).await?;
        self.add(add).await
    }

    /// Writes the shard's record, fenced by this invocation's run.
    pub(crate) async fn write_record(&self, update: &ShardUpdate) -> Result<(), StageError> {
        let job_id = &self.inner.job.job_id;
        self.shards.update_shard(job_id, self.key, &self.run, update).await.map_err(|err| match err
        {
            StoreError::Conflict { .. } => StageError::LeaseLost(format!(
                "another invocation holds shard {} of the stage",
                self.key.index
            )),
            other => crate::store_failed(other),
        })
    }

    /// A progress write of the kind: at most one per progress interval (or heartbeat), after
    /// the stage's timeout is checked. The one that finds the job cancelled or paused asks the
    /// shard to stop and succeeds; any after it fails so.
    async fn progress_write(&mut self, done: u64, due: bool) -> Result<(), StageError> {
        if let Some(stopped) = self.stopped() {
            return Err(stopped);
        }
        if !due {
            return Ok(());
        }
        self.inner.check_stage_timeout()?;
        match self.count(done, None).await {
            Err(StageError::Cancelled | StageError::Paused) => Ok(()),
            other => other,
        }
    }

    fn since(&self, at: Instant) -> Duration {
        self.inner.deps.clock.instant().saturating_duration_since(at)
    }

    fn due(&self) -> bool {
        let since = self.since(self.last_write);
        since >= self.inner.deps.progress_interval || since >= self.inner.deps.heartbeat_interval
    }

    /// Saves the shard's checkpoint object and makes it current on the shard's record (with
    /// the count up to `done`), then deletes the one it superseded.
    async fn save(&mut self, version: u32, state: Value, done: u64) -> Result<(), StageError> {
        let inner = &self.inner;
        let key = format!(
            "{}{}/shard{}-{}-{}.json",
            longhaul_aws::objects::checkpoints_prefix(&inner.job.job_id),
            inner.stage,
            self.key.index,
            self.run,
            inner.deps.clock.now().timestamp_micros(),
        );
        let body = inner.checkpoint_body(version, &state, done);
        inner
            .deps
            .objects
            .put(&key, body, "application/json")
            .await
            .map_err(|e| StageError::from(failure_message::aws_failure(CHECKPOINT_FAILED, &e)))?;
        let superseded = self.checkpoint_key.replace(key.clone());
        match self.count(done, Some(key)).await {
            // Made current before the job's progress refused it: the resume (or a retry of the
            // cancelled job) continues from here.
            Ok(()) | Err(StageError::Cancelled | StageError::Paused) => {}
            Err(err) => return Err(err),
        }
        self.last_checkpoint = (self.inner.deps.clock.instant(), done);
        if let Some(old) = superseded
            && let Err(err) = self.inner.deps.objects.delete(&old).await
        {
            tracing::warn!(key = old, error = %err, "deleting a superseded shard checkpoint failed; the lifecycle rule is the backstop");
        }
        Ok(())
    }

    /// The shard's current checkpoint, if it is of schema `version`.
    async fn resume(&mut self, version: u32) -> Result<Option<Value>, StageError> {
        let Some(key) = self.checkpoint_key.clone() else { return Ok(None) };
        let body = self
            .inner
            .deps
            .objects
            .get(&key)
            .await
            .map_err(|e| StageError::from(failure_message::aws_failure(CHECKPOINT_FAILED, &e)))?
            .ok_or_else(|| {
                StageError::retryable(
                    CHECKPOINT_FAILED,
                    format!("the shard's checkpoint {key} is missing"),
                )
            })?;
        let saved: Checkpoint<Value> = serde_json::from_slice(&body).map_err(|e| {
            StageError::fatal(PublicMessage::fixed("a checkpoint of the job is unreadable"), e)
        })?;
        if saved.schema_version != version {
            tracing::warn!(
                key,
                found = saved.schema_version,
                expected = version,
                "a shard checkpoint of another schema version; the shard restarts"
            );
            return Ok(None);
        }
        self.last_checkpoint.1 = saved.items_done.unwrap_or(0);
        Ok(Some(saved.state))
    }
}

fn refuse<T: Send + 'static>(why: &'static str) -> BoxFuture<'static, Result<T, KindError>> {
    async move { Err(KindError::fatal(longhaul_worker::PublicMessage::fixed(why))) }.boxed()
}

impl StageContext for ShardCtx<'_> {
    fn stage(&self) -> &str {
        self.inner.stage
    }

    fn attempt(&self) -> u32 {
        self.inner.lease.attempt
    }

    fn progress(&mut self, done: u64, _total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>> {
        let due = self.due();
        async move { Ok(self.progress_write(done, due).await?) }.boxed()
    }

    fn record_shards(
        &mut self,
        _counts: longhaul_worker::ShardCounts,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        // The shard's own moves are counted by the shard op; a shard has no shards.
        async { Ok(()) }.boxed()
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(self.save(version, state, done).await?) }.boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        async move { Ok(self.resume(version).await?) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        self.checkpoint_key.is_some()
    }

    fn carried_raw(
        &mut self,
        _from_stage: &str,
        _version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        refuse(NOT_CARRIED)
    }

    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        self.inner.input_size(input)
    }

    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        self.inner.read_input(input, offset)
    }

    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        // Each shard's files apart: shards of one stage may use the same names.
        let name = format!("shard{}-{name}", self.key.index);
        let content_type = content_type.to_owned();
        async move { self.inner.stage_file(&name, &content_type, body).await }.boxed()
    }

    fn write_result(
        &mut self,
        _: &str,
        _: &str,
        _: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn begin_result_upload(
        &mut self,
        _: &str,
        _: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn can_continue(&mut self, _: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn upload_part(
        &mut self,
        _: &ResultUpload,
        _: u32,
        _: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn complete_result_upload(
        &mut self,
        _: &ResultUpload,
        _: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.inner.input_name(input)
    }

    fn publish(&mut self, _: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        refuse(SHARD_RESULT)
    }

    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        self.inner.read_staged(staged)
    }

    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            if let Some(stopped) = self.stopped() {
                return Err(stopped.into());
            }
            let step = self
                .inner
                .deps
                .heartbeat_interval
                .min(Duration::from_secs(5))
                .max(Duration::from_millis(1));
            let end = Instant::now() + duration;
            while let Some(left) =
                end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
            {
                tokio::time::sleep(left.min(step)).await;
                let heartbeat = self.since(self.last_write) >= self.inner.deps.heartbeat_interval;
                self.progress_write(done, heartbeat).await?;
                if self.stop.is_some() {
                    break; // asked to stop: the kind checkpoints and pauses
                }
            }
            Ok(())
        }
        .boxed()
    }

    fn deadline_near(&self) -> bool {
        self.stop.is_some() || self.inner.deps.clock.instant() >= self.inner.stop_at
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        self.stop.is_some()
            || items.saturating_sub(self.last_checkpoint.1) >= self.inner.cadence.items
            || self.since(self.last_checkpoint.0) >= self.inner.cadence.interval
    }

    fn cancelled(&self) -> bool {
        self.stop == Some(Stop::Cancel)
    }

    fn wait_for(&mut self, _: &str, _: Duration) -> BoxFuture<'_, Result<Waited, KindError>> {
        refuse(SHARD_WAIT)
    }

    fn attempt_failures(&self) -> u32 {
        self.inner.job.injected_failures
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.count_failure()
    }
}
