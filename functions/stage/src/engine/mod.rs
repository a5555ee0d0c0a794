//! The stage engine: what every job type's stages share — the deadline, lease-fenced
//! progress with heartbeats and an ETA, and checkpoints that a crashed or continued
//! invocation resumes from.
//!
//! Checkpoints are written as new objects (`checkpoints/<job>/<stage>/<seq>.json`) and then
//! made current by a progress write that carries their key; that write is conditional on the
//! lease, so a stale attempt may leave an orphan object behind but can never make a newer
//! checkpoint unreachable. Once the pointer has moved, the checkpoint it pointed at is deleted
//! by key (nothing can reach it any more), so a job has one checkpoint object at a time and
//! its success deletes that one by key ([`Ctx::leftovers`]), with no listing; orphans are the
//! bucket's lifecycle rule's. Every checkpoint carries a `schema_version`: one that does not
//! match the stage's current version is never consumed — the stage restarts from its
//! beginning, with a warning in the log.
//!
//! A stage's time in an attempt is bounded by its policy's stage timeout, across the
//! invocations that continue it: the progress record keeps when the attempt started the stage
//! ([`StageClock`]), so a continuation counts on from there, and a new attempt (or the next
//! stage) starts a clock of its own. A stage past it ends the attempt with `Job.StageTimeout`
//! at its next progress or heartbeat write or at the start of its next invocation
//! ([`Ctx::check_stage_timeout`]); its checkpoints are still saved (the next attempt resumes
//! from the last), and a stage that finishes past it is not failed for it.

use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt};
use longhaul_aws::jobs::{
    FinalCheckpoint, JobRecord, Lease, ProgressRecord, ProgressRefused, SignalRecord, StageClock,
};
use longhaul_aws::objects::result_key;
use longhaul_aws::objects::{PutNewError, checkpoint_key};
use longhaul_domain::progress::{
    ETA_WINDOW_SECONDS, Position, ShardCounts, ThroughputWindow, weighted_pct,
};
use longhaul_domain::signals::{InvalidSignalName, MAX_WAIT_SECONDS, SignalName, Wait};
use longhaul_domain::uploads::owns_upload;
use longhaul_domain::{JobId, Timestamp};
use longhaul_worker::context::check_result_name;
use longhaul_worker::{
    ByteStream, Cadence, KindError, ResultRef, ResultUpload, StageContext, StagedFile,
    UploadedPart, Waited,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::failure_message::{self, CHECKPOINT_FAILED, Failure, PublicMessage};
use crate::{Deps, StageError};

mod checkpoints;
mod context;
mod kind_errors;
pub mod shard;

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
    pub written_at: Timestamp,
    /// The stage's count of items done that it was saved at: where the item cadence of the
    /// invocation that resumes from it counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_done: Option<u64>,
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
    /// The total the kind last reported, written or not (where the stage ends: [`Ctx::stage_end`]).
    last_total: Option<u64>,
    checkpoint_key: Option<String>,
    /// The staged files this invocation published as the job's result: with the current
    /// checkpoint, what a success leaves to delete ([`Ctx::leftovers`]).
    published: Vec<String>,
    /// Recent progress, for the ETA; `started` is its clock's zero.
    throughput: ThroughputWindow,
    started: Instant,
    last_checkpoint: (Instant, u64),
    changed_at: Option<Timestamp>,
    /// The uploads the kind declared it reads (the only ones it may read).
    inputs: Vec<String>,
    /// The sizes of inputs asked this invocation (an upload does not change under its job):
    /// a stage's split and its scan ask once.
    input_sizes: Vec<(String, u64)>,
    /// The checkpoint cadence: the deployment's override, else the kind's.
    cadence: Cadence,
    /// The longest the stage may run in this attempt, and since when it runs (kept on the
    /// progress record with every write).
    stage_timeout: Duration,
    stage_clock: StageClock,
    /// How much of the job each stage is (empty: the same).
    weights: &'static [u32],
    /// Whether a write was refused because the owner cancelled or paused the job: from then
    /// on the stage is asked to stop (`deadline_near`), its next checkpoint is the attempt's
    /// final one, and any further progress write fails with `Job.Cancelled` (or, paused, the
    /// error that parks the job). A cancellation outranks a pause.
    stop: Option<Stop>,
    /// The signal the kind waits for (it asked, none came yet): the job is parked for it.
    waiting: Option<Wait>,
    /// How the shards of the job's latest fanned-out stage stand: written with every
    /// progress write, kept through the stages after it.
    shards: Option<ShardCounts>,
    /// The record's count of its shards' writes, carried by every write of the attempt.
    shard_seq: u64,
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
        let now = deps.clock.instant();
        // The stage's clock as an earlier invocation of this attempt (since the job's last
        // resume) left it; else it starts.
        let stage_clock = progress
            .stage_clock
            .filter(|c| {
                same_stage
                    && c.attempt == lease.attempt
                    && c.stage_index == stage_index
                    && c.resumes == job.resumes
            })
            .unwrap_or(StageClock {
                attempt: lease.attempt,
                stage_index,
                resumes: job.resumes,
                started_at: Timestamp::from(deps.clock.now()),
            });
        Ctx {
            deps,
            job,
            lease,
            stage: stages[stage_index as usize - 1],
            stage_index,
            stages_total: stages.len() as u32,
            stop_at: deadline.checked_sub(deps.margin).unwrap_or(now),
            seq: progress.seq,
            last_write: now,
            last_pct: progress.pct,
            floor_done: if same_stage { progress.items_done } else { 0 },
            last_done: 0,
            last_reported: (0, None),
            last_total: None,
            checkpoint_key: if same_stage { progress.checkpoint_key.clone() } else { None },
            published: Vec::new(),
            throughput: ThroughputWindow::new(ETA_WINDOW_SECONDS),
            started: now,
            last_checkpoint: (now, 0),
            changed_at: progress.progress_changed_at,
            inputs: kind.inputs.clone(),
            input_sizes: Vec::new(),
            cadence: Cadence {
                items: deps.checkpoint_items.unwrap_or(kind.cadence.items).max(1),
                interval: deps.checkpoint_interval.unwrap_or(kind.cadence.interval),
            },
            weights: kind.weights,
            stage_timeout: kind.stage_timeout,
            stage_clock,
            stop: None,
            waiting: None,
            shards: progress.shards,
            shard_seq: progress.shard_seq,
        }
    }

    /// The job's id.
    pub fn job_id(&self) -> &JobId {
        &self.job.job_id
    }

    /// Whether the stage must stop now (checkpoint and return `Paused`): Lambda would stop the
    /// invocation within the configured margin.
    pub fn deadline_near(&self) -> bool {
        self.stop.is_some() || self.deps.clock.instant() >= self.stop_at
    }

    /// `Job.StageTimeout` once the stage has run its stage timeout in this attempt (counted
    /// from when the attempt started it, across invocations); checked before a stage
    /// invocation runs and at every progress or heartbeat write.
    pub fn check_stage_timeout(&self) -> Result<(), StageError> {
        let started = self.stage_clock.started_at;
        let ran = Timestamp::from(self.deps.clock.now()).since(started);
        if ran < self.stage_timeout {
            return Ok(());
        }
        Err(StageError::stage_timeout(
            self.stage,
            self.stage_timeout,
            format!(
                "attempt {} ran the stage {} s, since {started}",
                self.lease.attempt,
                ran.as_secs()
            ),
        ))
    }

    /// How long ago `at` was, by the clock.
    fn since(&self, at: Instant) -> Duration {
        self.deps.clock.instant().saturating_duration_since(at)
    }

    /// Whether a checkpoint is due: every `checkpoint_items` items or `checkpoint_interval`,
    /// whichever comes first.
    pub fn checkpoint_due(&self, items_done: u64) -> bool {
        self.stop.is_some()
            || items_done.saturating_sub(self.last_checkpoint.1) >= self.cadence.items
            || self.since(self.last_checkpoint.0) >= self.cadence.interval
    }

    /// Reports progress: at most one write per progress interval (2 s by default — what a
    /// progress bar needs, and each write is a billed DynamoDB write), which also serves as
    /// the heartbeat. Writing on every whole percent as well, as this once did, cost a 10 s
    /// job about a hundred writes instead of five (`make bench` measured it).
    ///
    /// The write that finds the job cancelled (or paused) does not fail: it asks the stage to
    /// stop ([`Ctx::deadline_near`]), so that a kind that checkpoints and pauses there saves
    /// where it got to — a retry of the cancelled job, or the paused job's resume, continues
    /// from that. A kind that goes on regardless fails with `Job.Cancelled` (or the error that
    /// parks a paused job) at its next progress report.
    pub async fn progress(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        self.last_total = total;
        let since = self.since(self.last_write);
        if since >= self.deps.progress_interval || since >= self.deps.heartbeat_interval {
            return self.write_unless_cancelled(done, total).await;
        }
        Ok(())
    }

    /// Writes a heartbeat if one is due (for work that makes no countable progress for a while);
    /// a cancellation found is handled as in [`Ctx::progress`].
    pub async fn heartbeat(&mut self, done: u64, total: Option<u64>) -> Result<(), StageError> {
        if self.since(self.last_write) >= self.deps.heartbeat_interval {
            return self.write_unless_cancelled(done, total).await;
        }
        Ok(())
    }

    /// A progress write from the kind: `Job.Cancelled` once the stage was asked to stop for a
    /// cancellation; the write that finds it asks and succeeds. `Job.StageTimeout`, with
    /// nothing written, once the stage ran past its stage timeout.
    async fn write_unless_cancelled(
        &mut self,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        match self.stop {
            Some(Stop::Cancel) => return Err(StageError::Cancelled),
            Some(Stop::Pause) => return Err(StageError::Paused),
            None => {}
        }
        self.check_stage_timeout()?;
        match self.write(done, total).await {
            Err(StageError::Cancelled) => {
                tracing::info!("cancellation seen; the stage is asked to checkpoint and stop");
                Ok(())
            }
            Err(StageError::Paused) => {
                tracing::info!("pause seen; the stage is asked to checkpoint and stop");
                Ok(())
            }
            other => other,
        }
    }

    /// Whether the owner's cancellation was seen.
    pub fn cancelled(&self) -> bool {
        self.stop == Some(Stop::Cancel)
    }

    /// Whether the owner's pause was seen (and no cancellation since).
    pub fn pausing(&self) -> bool {
        self.stop == Some(Stop::Pause)
    }

    /// The signal the kind waits for, if it asked for one that has not come.
    pub fn waiting(&self) -> Option<&Wait> {
        self.waiting.as_ref()
    }

    /// The kind's wait for signal `name` ([`longhaul_worker::StageContext::wait_for`]): the
    /// signal, or that its wait timed out, if either is recorded; else the job is to be parked
    /// waiting until `timeout` from now ([`StageError::Paused`], which the kind propagates).
    pub async fn wait_for(&mut self, name: &str, timeout: Duration) -> Result<Waited, StageError> {
        let signal: SignalName = name.parse().map_err(|e: InvalidSignalName| {
            StageError::Fatal(Failure::new(PublicMessage::domain(e.to_string())))
        })?;
        match self.deps.jobs.signal(&self.job.job_id, &signal).await.map_err(crate::store_failed)? {
            Some(SignalRecord::Received { payload, .. }) => Ok(Waited::Signal(payload)),
            Some(SignalRecord::TimedOut { .. }) => Ok(Waited::TimedOut),
            None => {
                let timeout = timeout.min(Duration::from_secs(MAX_WAIT_SECONDS));
                let now = self.deps.clock.now();
                let until =
                    Timestamp::from(now + chrono::Duration::from_std(timeout).unwrap_or_default());
                tracing::info!(signal = %signal, %until, "waiting for a signal; the job parks");
                self.waiting = Some(Wait { signal, until });
                Err(StageError::Paused)
            }
        }
    }

    /// Where the current stage ends, as the kind last reported it (the total it counted, if
    /// any, in this invocation): recorded with the job's success, so that its view shows the
    /// end even when no progress write came after the last items.
    pub fn stage_end(&self) -> longhaul_domain::progress::StageEnd {
        longhaul_domain::progress::StageEnd {
            stage: self.stage.to_owned(),
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            items_total: self.last_total,
            shards: self.shards,
        }
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
        let now = self.deps.clock.instant();
        // ETA from the throughput of about the last minute; none until 10 % is done.
        let eta = self.throughput.observe(now.duration_since(self.started).as_secs_f64(), pct);
        self.seq += 1;
        let stamp = Timestamp::from(self.deps.clock.now());
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
            // Kept while the stage is on its way to being parked (its boundary write).
            pause_requested_at: self.pausing().then_some(stamp),
            progress_changed_at: self.changed_at,
            attempt: Some(self.lease.attempt),
            owner: Some(self.job.owner.clone()),
            stage_clock: Some(self.stage_clock),
            shards: self.shards,
            shard_seq: self.shard_seq,
        };
        let written = self.deps.jobs.record_progress(&self.job.job_id, &record).await;
        match &written {
            Err(ProgressRefused::Cancelled) => self.stop = Some(Stop::Cancel),
            Err(ProgressRefused::PauseRequested) if self.stop.is_none() => {
                self.stop = Some(Stop::Pause)
            }
            _ => {}
        }
        written.map_err(refused)?;
        self.last_write = now;
        self.last_pct = pct;
        self.floor_done = record.items_done;
        self.last_done = done;
        self.last_reported = (done, total);
        Ok(())
    }

    /// Writes the progress record now, at `total` items for the stage (the stage's clock and
    /// its shards' counts with it), as a stage that hands its shards to the map again does; a
    /// cancellation or pause found is the answer ([`StageError::Cancelled`],
    /// [`StageError::Paused`]).
    pub async fn write_now(&mut self, total: u64) -> Result<(), StageError> {
        self.last_total = Some(total);
        let (done, total) = (self.last_done.max(self.floor_done), self.last_total);
        self.write_unless_cancelled(done, total).await?;
        match self.stop {
            Some(Stop::Cancel) => Err(StageError::Cancelled),
            Some(Stop::Pause) => Err(StageError::Paused),
            None => Ok(()),
        }
    }

    /// Counts the current stage from its start again: a retried job whose shards all run
    /// again (none of its own was ever taken) shows the stage's items from 0, not the count
    /// of the job it retries on top of its own.
    pub fn restart_stage_count(&mut self, total: u64) {
        self.floor_done = 0;
        self.last_done = 0;
        let start = Position {
            stage_index: self.stage_index,
            stages_total: self.stages_total,
            done: 0,
            total: Some(total),
        };
        self.last_pct = weighted_pct(start, self.weights, 0.0);
    }

    /// Keeps `counts` as how the stage's shards stand (written with the next progress write);
    /// a shard that failed is written at once, as the stage is about to fail with it. A
    /// refused write is handled as in [`Ctx::progress`].
    pub async fn record_shards(&mut self, counts: ShardCounts) -> Result<(), StageError> {
        let failed_before = self.shards.map_or(0, |c| c.failed);
        self.shards = Some(counts);
        if counts.failed > failed_before {
            let (done, total) = (self.last_done.max(self.floor_done), self.last_total);
            return self.write_unless_cancelled(done, total).await;
        }
        Ok(())
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
                    Err(StageError::Cancelled | StageError::Paused) => {} // the stage stops after the call
                    Err(err) => return Err(err),
                },
            }
        }
    }

    /// Sleeps `duration` in short steps, heartbeating while it waits (when a heartbeat is due
    /// by the clock). The sleep itself is real: it ends by the machine's monotonic clock, as
    /// tokio's timer does, whatever the clock says.
    pub async fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        match self.stop {
            Some(Stop::Cancel) => return Err(StageError::Cancelled),
            Some(Stop::Pause) => return Err(StageError::Paused),
            None => {}
        }
        let step =
            self.deps.heartbeat_interval.min(Duration::from_secs(5)).max(Duration::from_millis(1));
        let end = Instant::now() + duration;
        while let Some(left) = end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            tokio::time::sleep(left.min(step)).await;
            self.heartbeat(done, total).await?;
            if self.stop.is_some() {
                break; // asked to stop: the kind checkpoints and pauses
            }
        }
        Ok(())
    }
}

fn refused(err: ProgressRefused) -> StageError {
    match err {
        ProgressRefused::Cancelled => StageError::Cancelled,
        ProgressRefused::PauseRequested => StageError::Paused,
        ProgressRefused::LeaseLost => StageError::LeaseLost("another attempt holds the job".into()),
        ProgressRefused::Stale { seq } => {
            StageError::LeaseLost(format!("a duplicate worker already recorded progress {seq}"))
        }
        ProgressRefused::Store(err) => crate::store_failed(err),
    }
}

/// Why the owner asked a running stage to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The job is to end `cancelled`.
    Cancel,
    /// The job is to be parked `paused`, to be resumed.
    Pause,
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
    /// The longest one stage may run in an attempt: the job's policy's, else the kind's.
    pub stage_timeout: Duration,
}
