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

use futures::future::{BoxFuture, FutureExt};
use longhaul_aws::jobs::{FinalCheckpoint, JobRecord, Lease, ProgressRecord, ProgressRefused};
use longhaul_aws::objects::result_key;
use longhaul_aws::objects::{PutNewError, checkpoint_key};
use longhaul_domain::progress::{ETA_WINDOW_SECONDS, Position, ThroughputWindow, weighted_pct};
use longhaul_domain::uploads::owns_upload;
use longhaul_domain::{Timestamp, now_rfc3339};
use longhaul_worker::context::check_result_name;
use longhaul_worker::{
    ByteStream, Cadence, KindError, ResultRef, ResultUpload, StageContext, StagedFile, UploadedPart,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::failure::{self, CHECKPOINT_FAILED, Failure, PublicMessage};
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
    /// The count the kind reported at this invocation's last write: a resumed attempt redoing
    /// the work since its checkpoint (below `floor_done`, so the record does not move) is
    /// still progressing, and the reaper's stall check must see it.
    last_done: u64,
    /// The count and total of the last progress write (what a heartbeat repeats).
    last_reported: (u64, Option<u64>),
    checkpoint_key: Option<String>,
    /// Recent progress, for the ETA; `started` is its clock's zero.
    throughput: ThroughputWindow,
    started: Instant,
    last_checkpoint: (Instant, u64),
    changed_at: Option<Timestamp>,
    /// The uploads the kind declared it reads (the only ones it may read).
    inputs: Vec<String>,
    /// The checkpoint cadence: the deployment's override, else the kind's.
    cadence: Cadence,
    /// How much of the job each stage is (empty: the same).
    weights: &'static [u32],
    /// Whether a write was refused because the owner cancelled: from then on the stage is
    /// asked to stop (`deadline_near`), its next checkpoint is the attempt's final one, and any
    /// further progress write fails with `Job.Cancelled`.
    cancelled: bool,
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
        kind: &KindRun,
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
            last_done: 0,
            last_reported: (0, None),
            checkpoint_key: if same_stage { progress.checkpoint_key.clone() } else { None },
            throughput: ThroughputWindow::new(ETA_WINDOW_SECONDS),
            started: Instant::now(),
            last_checkpoint: (Instant::now(), 0),
            changed_at: progress.progress_changed_at,
            inputs: kind.inputs.clone(),
            cadence: Cadence {
                items: deps.checkpoint_items.unwrap_or(kind.cadence.items).max(1),
                interval: deps.checkpoint_interval.unwrap_or(kind.cadence.interval),
            },
            weights: kind.weights,
            cancelled: false,
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.job.job_id
    }

    /// Whether the stage must stop now (checkpoint and return `Paused`): Lambda would stop the
    /// invocation within the configured margin.
    pub fn deadline_near(&self) -> bool {
        self.cancelled || Instant::now() >= self.stop_at
    }

    /// Whether a checkpoint is due: every `checkpoint_items` items or `checkpoint_interval`,
    /// whichever comes first.
    pub fn checkpoint_due(&self, items_done: u64) -> bool {
        self.cancelled
            || items_done.saturating_sub(self.last_checkpoint.1) >= self.cadence.items
            || self.last_checkpoint.0.elapsed() >= self.cadence.interval
    }

    /// Reports progress: at most one write per progress interval (2 s by default — what a
    /// progress bar needs, and each write is a billed DynamoDB write), which also serves as
    /// the heartbeat. Writing on every whole percent as well, as this once did, cost a 10 s
    /// job about a hundred writes instead of five (`make bench` measured it).
    ///
    /// The write that finds the job cancelled does not fail: it asks the stage to stop
    /// ([`Ctx::deadline_near`]), so that a kind that checkpoints and pauses there saves where
    /// it got to — a retry of the cancelled job resumes from that. A kind that goes on
    /// regardless fails with `Job.Cancelled` at its next progress report.
    pub async fn progress(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        let since = self.last_write.elapsed();
        if since >= self.deps.progress_interval || since >= self.deps.heartbeat_interval {
            return self.write_unless_cancelled(done, total).await;
        }
        Ok(())
    }

    /// Writes a heartbeat if one is due (for work that makes no countable progress for a while);
    /// a cancellation found is handled as in [`Ctx::progress`].
    pub async fn heartbeat(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        if self.last_write.elapsed() >= self.deps.heartbeat_interval {
            return self.write_unless_cancelled(done, total).await;
        }
        Ok(())
    }

    /// A progress write from the kind: `Job.Cancelled` once the stage was asked to stop for a
    /// cancellation; the write that finds it asks and succeeds.
    async fn write_unless_cancelled(
        &mut self,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        if self.cancelled {
            return Err(StageError::Cancelled);
        }
        match self.write(done, total).await {
            Err(StageError::Cancelled) => {
                tracing::info!("cancellation seen; the stage is asked to checkpoint and stop");
                Ok(())
            }
            other => other,
        }
    }

    /// Whether the owner's cancellation was seen.
    pub fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn pct(&self, done: u64, total: Option<u64>) -> f64 {
        let position = Position {
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            done,
            total,
        };
        weighted_pct(position, self.weights, self.last_pct)
    }

    /// Writes the progress record now (monotonic: never below what was reported before).
    async fn write(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        let pct = self.pct(done, total);
        let now = Instant::now();
        // ETA from the throughput of about the last minute; none until 10 % is done.
        let eta = self.throughput.observe(now.duration_since(self.started).as_secs_f64(), pct);
        self.seq += 1;
        let stamp = Timestamp::now();
        let items_done = done.max(self.floor_done);
        // (A count above the floor is above the last count too: the floor is never below it.)
        if pct > self.last_pct || done > self.last_done || self.changed_at.is_none() {
            self.changed_at = Some(stamp);
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
            heartbeat_at: stamp,
            updated_at: stamp,
            lease: self.lease.token.clone(),
            checkpoint_key: self.checkpoint_key.clone(),
            cancel_requested_at: None,
            progress_changed_at: self.changed_at,
            attempt: Some(self.lease.attempt),
        };
        let written = self.deps.jobs.record_progress(&self.job.job_id, &record).await;
        if let Err(ProgressRefused::Cancelled) = &written {
            self.cancelled = true;
        }
        written.map_err(refused)?;
        self.last_write = now;
        self.last_pct = pct;
        self.floor_done = record.items_done;
        self.last_done = done;
        self.last_reported = (done, total);
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
        let key = checkpoint_key(&self.job.job_id, self.stage, self.seq + 1, self.lease.attempt);
        let body = serde_json::to_vec(&Checkpoint {
            schema_version: version,
            stage: self.stage.to_owned(),
            attempt: self.lease.attempt,
            written_at: now_rfc3339(),
            state,
        })
        .expect("checkpoints serialise");
        self.deps.objects.put_new(&key, body, "application/json").await.map_err(|e| match e {
            // The key is new by construction: only another writer of this very key (none
            // exists) could have been first. Refuse to go on rather than trust either object.
            PutNewError::Exists(key) => StageError::LeaseLost(format!("checkpoint {key} exists")),
            PutNewError::Aws(e) => StageError::from(failure::aws_failure(CHECKPOINT_FAILED, &e)),
        })?;
        if !self.cancelled {
            self.checkpoint_key = Some(key.clone());
            match self.write(done, total).await {
                Ok(()) => {
                    self.last_checkpoint = (Instant::now(), done);
                    return Ok(());
                }
                // Cancelled while it was saved: it becomes the final checkpoint, below.
                Err(StageError::Cancelled) => {}
                Err(err) => return Err(err),
            }
        }
        // The attempt's final checkpoint, after its owner cancelled: made current by the one
        // write a cancelled attempt may still make, so a retry resumes from here.
        self.seq += 1;
        let items_done = done.max(self.floor_done);
        self.deps
            .jobs
            .record_final_checkpoint(
                &self.job.job_id,
                &self.lease.token,
                FinalCheckpoint {
                    seq: self.seq,
                    stage: self.stage,
                    stage_index: self.stage_index,
                    checkpoint_key: &key,
                    items_done,
                },
            )
            .await
            .map_err(refused)?;
        self.checkpoint_key = Some(key);
        self.last_checkpoint = (Instant::now(), done);
        tracing::info!(items_done, "final checkpoint of the cancelled attempt saved");
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
            self.last_done = 0;
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

    /// The checkpoint this attempt started from is not one it can go on from (a retry's
    /// checkpoint naming the retried job's result upload, which this job may not continue):
    /// the stage starts over, and says so — the job no longer claims `resumed_from`, and the
    /// progress bar goes back to the stage's start instead of staying at the retried job's
    /// count.
    pub(crate) async fn start_over(&mut self) -> Result<(), StageError> {
        self.deps
            .jobs
            .forget_resume(&self.job.job_id, &self.lease.token)
            .await
            .map_err(crate::error::fenced)?;
        tracing::info!(
            stage = self.stage,
            "the retried job's checkpoint cannot be continued: the stage starts over"
        );
        self.floor_done = 0;
        self.last_done = 0;
        self.last_pct = 0.0;
        self.checkpoint_key = None;
        self.write(0, None).await
    }

    /// Moves the progress record to the next stage (the stage boundary). The checkpoint
    /// pointer is kept: the finished stage's last checkpoint is the next stage's input.
    pub async fn advance(&mut self, next_stage: &'static str) -> Result<(), StageError> {
        self.stage_index += 1;
        self.stage = next_stage;
        self.floor_done = 0;
        self.last_done = 0;
        self.write(0, None).await
    }

    /// Awaits `call` (one long AWS call, such as completing a large multipart upload) while
    /// writing heartbeats at the heartbeat interval, at the progress last reported, so the
    /// reaper does not take the waiting stage for a zombie. A cancellation seen meanwhile is
    /// handled as in [`Ctx::progress`] (the call still runs to its end).
    pub async fn heartbeating<T>(
        &mut self,
        call: impl Future<Output = T>,
    ) -> Result<T, StageError> {
        let step = self.deps.heartbeat_interval.max(Duration::from_millis(1));
        let (done, total) = self.last_reported;
        tokio::pin!(call);
        loop {
            tokio::select! {
                out = &mut call => return Ok(out),
                () = tokio::time::sleep(step) => match self.heartbeat(done, total).await {
                    Ok(()) => {}
                    Err(StageError::Cancelled) => {} // the stage stops after the call
                    Err(err) => return Err(err),
                },
            }
        }
    }

    /// Sleeps `duration` in short steps, heartbeating while it waits.
    pub async fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        if self.cancelled {
            return Err(StageError::Cancelled);
        }
        let step =
            self.deps.heartbeat_interval.min(Duration::from_secs(5)).max(Duration::from_millis(1));
        let end = Instant::now() + duration;
        while let Some(left) = end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            tokio::time::sleep(left.min(step)).await;
            self.heartbeat(done, total).await?;
            if self.cancelled {
                break; // asked to stop: the kind checkpoints and pauses
            }
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

/// What the engine needs to know of the job's kind.
#[derive(Debug, Clone)]
pub struct KindRun {
    /// The uploads the job's params name (already owner-checked at submit; checked again on
    /// every read).
    pub inputs: Vec<String>,
    /// The kind's checkpoint cadence.
    pub cadence: Cadence,
    /// The kind's stage weights ([`longhaul_worker::JobKind::stage_weights`]).
    pub weights: &'static [u32],
}

/// The kind's view of a stage error the engine raised: same class, same messages.
impl From<StageError> for KindError {
    fn from(err: StageError) -> Self {
        match err {
            StageError::Retryable(f) => with_internal(KindError::retryable(f.public), f.internal),
            StageError::Fatal(f) => with_internal(KindError::fatal(f.public), f.internal),
            StageError::Cancelled => KindError::cancelled(),
            StageError::LeaseLost(why) | StageError::NotClaimable(why) => {
                KindError::lease_lost(why)
            }
        }
    }
}

fn with_internal(err: KindError, internal: Option<String>) -> KindError {
    match internal {
        Some(internal) => err.because(internal),
        None => err,
    }
}

/// A kind's error, named for the state machine.
impl From<KindError> for StageError {
    fn from(err: KindError) -> Self {
        use longhaul_worker::ErrorClass;
        match err.class {
            ErrorClass::Retryable => {
                StageError::Retryable(Failure { public: err.public, internal: err.internal })
            }
            ErrorClass::Fatal => {
                StageError::Fatal(Failure { public: err.public, internal: err.internal })
            }
            ErrorClass::Cancelled => StageError::Cancelled,
            ErrorClass::LeaseLost => {
                StageError::LeaseLost(err.internal.unwrap_or_else(|| err.public.to_string()))
            }
        }
    }
}

impl Ctx<'_> {
    /// `input`, if the kind declared it and it is the job owner's upload.
    fn readable<'i>(&self, input: &'i str) -> Result<&'i str, KindError> {
        if self.inputs.iter().any(|i| i == input) && owns_upload(&self.job.owner, input) {
            Ok(input)
        } else {
            Err(KindError::fatal(PublicMessage::fixed(
                "the input is not one of the job owner's uploads",
            )))
        }
    }
}

fn unreadable(err: longhaul_aws::AwsError) -> KindError {
    failure::aws_failure(failure::INPUT_UNREADABLE, &err)
}

/// A read of the input's body that broke off (the connection, a timeout): retried.
fn broke_off(err: impl std::fmt::Display) -> KindError {
    KindError::retryable(failure::INPUT_UNREADABLE).because(err)
}

impl StageContext for Ctx<'_> {
    fn stage(&self) -> &str {
        self.stage
    }

    fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    fn progress(&mut self, done: u64, total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(Ctx::progress(self, done, total).await?) }.boxed()
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: serde_json::Value,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(self.checkpoint(version, &state, done, total).await?) }.boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<serde_json::Value>, KindError>> {
        async move { Ok(self.resume(version).await?) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        Ctx::has_own_checkpoint(self)
    }

    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<serde_json::Value, KindError>> {
        let from_stage = from_stage.to_owned();
        async move { Ok(self.carried(&from_stage, version).await?) }.boxed()
    }

    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        let input = self.readable(input).map(str::to_owned);
        async move {
            let input = input?;
            self.deps.objects.size(&input).await.map_err(unreadable)?.ok_or_else(|| {
                KindError::fatal(PublicMessage::fixed(
                    "the input upload does not exist (upload it before submitting the job)",
                ))
            })
        }
        .boxed()
    }

    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        let input = self.readable(input).map(str::to_owned);
        async move {
            let body = self.deps.objects.stream_from(&input?, offset).await.map_err(unreadable)?;
            // The SDK's body as a plain stream of chunks; after an error it ends.
            let chunks = futures::stream::unfold(Some(body), |body| async move {
                let mut body = body?;
                match body.try_next().await {
                    Ok(Some(chunk)) => Some((Ok(chunk), Some(body))),
                    Ok(None) => None,
                    Err(err) => Some((Err(broke_off(err)), None)),
                }
            });
            Ok(futures::StreamExt::boxed(chunks))
        }
        .boxed()
    }

    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        let name = check_result_name(name).map(str::to_owned);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            // Per stage and attempt, under the job's checkpoints (tidied when the job ends).
            let key = format!(
                "{}{}/a{}-{name}",
                longhaul_aws::objects::checkpoints_prefix(&self.job.job_id),
                self.stage,
                self.lease.attempt
            );
            self.deps
                .objects
                .put(&key, body, &content_type)
                .await
                .map_err(|e| failure::aws_failure(CHECKPOINT_FAILED, &e))?;
            Ok(StagedFile::from_host(key, content_type, name))
        }
        .boxed()
    }

    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let name = check_result_name(name).map(str::to_owned);
        let content_type = content_type.to_owned();
        async move {
            // Keyed by attempt: a stale attempt's result can never be the one recorded.
            let key = result_key(self.job_id(), &format!("{}/{}", self.lease.attempt, name?));
            self.deps
                .objects
                .put(&key, body, &content_type)
                .await
                .map_err(|e| failure::aws_failure(failure::RESULT_NOT_STORED, &e))?;
            Ok(ResultRef::from_host(key))
        }
        .boxed()
    }

    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let staged = staged.clone();
        async move {
            let name = check_result_name(staged.name())?;
            let own = longhaul_aws::objects::checkpoints_prefix(&self.job.job_id);
            if !staged.location().starts_with(&own) {
                return Err(KindError::fatal(PublicMessage::fixed(
                    "the job kind named a staged file of another job",
                ))
                .because(staged.location()));
            }
            let key = result_key(self.job_id(), &format!("{}/{name}", self.lease.attempt));
            self.deps
                .objects
                .copy(staged.location(), &key, staged.content_type())
                .await
                .map_err(|e| failure::aws_failure(failure::RESULT_NOT_STORED, &e))?;
            Ok(ResultRef::from_host(key))
        }
        .boxed()
    }

    // Multipart result uploads: see `crate::multipart`.
    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        let (name, content_type) = (name.to_owned(), content_type.to_owned());
        async move { self.begin_upload(&name, &content_type).await }.boxed()
    }

    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        let upload = upload.clone();
        async move { self.continuable(&upload).await }.boxed()
    }

    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        let upload = upload.clone();
        async move { self.put_part(&upload, number, body).await }.boxed()
    }

    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let (upload, parts) = (upload.clone(), parts.to_vec());
        async move { self.complete_upload(&upload, &parts).await }.boxed()
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        // The key is `uploads/<owner>/<id>/<filename>` (longhaul_domain::uploads::upload_key),
        // checked as every read is.
        let input = self.readable(input)?;
        Ok(input.rsplit('/').next().unwrap_or(input).to_owned())
    }

    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(Ctx::pause(self, duration, done, total).await?) }.boxed()
    }

    fn deadline_near(&self) -> bool {
        Ctx::deadline_near(self)
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        Ctx::checkpoint_due(self, items)
    }

    fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn attempt_failures(&self) -> u32 {
        self.job.injected_failures
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            self.deps
                .jobs
                .count_injected_failure(self.job_id(), &self.lease.token)
                .await
                .map_err(crate::fenced)?;
            Ok(())
        }
        .boxed()
    }
}
