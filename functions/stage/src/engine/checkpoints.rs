//! A stage's checkpoints: saved as new objects and made current by a fenced progress write,
//! resumed from, carried to the next stage, and given up when they cannot be continued.

use super::*;
use longhaul_worker::fan_out::FAN_OUT_VERSION;

impl Ctx<'_> {
    /// Saves `state` as the stage's checkpoint and makes it current (fenced); then deletes the
    /// checkpoint it superseded (see [`Ctx::superseded`]). Saved whatever the stage's clock
    /// says: a stage past its stage timeout ends at its next progress write, and the next
    /// attempt resumes from here.
    pub async fn checkpoint<T: Serialize>(
        &mut self,
        version: u32,
        state: &T,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), StageError> {
        // What the progress record points at until this one is made current.
        let superseded = self.checkpoint_key.clone();
        let key = checkpoint_key(&self.job.job_id, self.stage, self.seq + 1, self.lease.attempt);
        let body = self.checkpoint_body(version, state, done);
        self.deps.objects.put_new(&key, body, "application/json").await.map_err(|e| match e {
            // The key is new by construction: only another writer of this very key (none
            // exists) could have been first. Refuse to go on rather than trust either object.
            PutNewError::Exists(key) => StageError::LeaseLost(format!("checkpoint {key} exists")),
            PutNewError::Aws(e) => {
                StageError::from(failure_message::aws_failure(CHECKPOINT_FAILED, &e))
            }
        })?;
        if self.stop.is_none() {
            self.checkpoint_key = Some(key.clone());
            match self.write(done, total).await {
                Ok(()) => {
                    self.last_checkpoint = (self.deps.clock.instant(), done);
                    self.superseded(superseded).await;
                    return Ok(());
                }
                // Cancelled or paused while it was saved: it becomes the final checkpoint,
                // below.
                Err(StageError::Cancelled | StageError::Paused) => {}
                Err(err) => return Err(err),
            }
        }
        // The attempt's final checkpoint, after its owner cancelled or paused the job: made
        // current by the one write a stopped attempt may still make, so a retry or the resume
        // continues from here.
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
        self.last_checkpoint = (self.deps.clock.instant(), done);
        tracing::info!(items_done, stop = ?self.stop, "final checkpoint of the stopped attempt saved");
        self.superseded(superseded).await;
        Ok(())
    }

    /// The checkpoint object of `state` (schema `version`) at `done` items of the stage, as
    /// this attempt writes it now.
    pub(super) fn checkpoint_body<T: Serialize>(
        &self,
        version: u32,
        state: &T,
        done: u64,
    ) -> Vec<u8> {
        serde_json::to_vec(&Checkpoint {
            schema_version: version,
            stage: self.stage.to_owned(),
            attempt: self.lease.attempt,
            written_at: Timestamp::from(self.deps.clock.now()),
            items_done: Some(done),
            state,
        })
        .expect("checkpoints serialise")
    }

    /// Whether `key` is one of this job's own checkpoint objects (not the checkpoint of the job
    /// a retry started from, which that job keeps for its own retries).
    fn own_object(&self, key: &str) -> bool {
        key.starts_with(&longhaul_aws::objects::checkpoints_prefix(&self.job.job_id))
    }

    /// Deletes `superseded`, the checkpoint the progress record pointed at before the fenced
    /// write that just moved it to a newer one: nothing reads it any more (resuming and carrying
    /// both read the pointer), so a job keeps one checkpoint object at a time and its success
    /// deletes that one by key, with no listing. Best effort: an object left behind is the
    /// bucket's lifecycle rule's (`checkpoints-backstop`). A deleted S3 object costs nothing
    /// (S3 bills no `DeleteObject`).
    async fn superseded(&self, superseded: Option<String>) {
        let Some(old) = superseded.filter(|old| self.own_object(old)) else { return };
        if self.checkpoint_key.as_deref() == Some(old.as_str()) {
            return;
        }
        if let Err(err) = self.deps.objects.delete(&old).await {
            tracing::warn!(
                key = old,
                error = %err,
                "deleting the superseded checkpoint failed; the lifecycle rule is the backstop"
            );
        }
    }

    /// What the job's success leaves to delete, by key: the checkpoint the progress record
    /// points at (the only one left: each superseded one was deleted as the pointer moved) and
    /// the staged files this invocation published. Never another job's objects. Deleted only
    /// once the success is recorded: until then a retry of the last stage resumes from (or
    /// carries, or publishes) them.
    pub fn leftovers(&self) -> Vec<String> {
        self.checkpoint_key
            .iter()
            .chain(&self.published)
            .filter(|key| self.own_object(key))
            .cloned()
            .collect()
    }

    /// The checkpoint `key` the pointer named is missing. Checkpoints are deleted once the
    /// pointer moved past them, so the usual reason is a duplicate invocation of this attempt
    /// that moved on (its writes win, and this one's are refused at its next write): it stops
    /// now, as a refused write stops it. `None`: the record still points at `key` under this
    /// lease — the object is missing for another reason, which the caller judges.
    async fn moved_past(&self, key: &str) -> Option<StageError> {
        let view = match self.deps.jobs.view(&self.job.job_id).await {
            Ok(view) => view,
            Err(err) => return Some(crate::store_failed(err)),
        };
        let progress = view.and_then(|view| view.progress);
        let ours = progress.as_ref().is_some_and(|p| p.lease == self.lease.token);
        let current = progress.as_ref().and_then(|p| p.checkpoint_key.as_deref());
        if ours && current == Some(key) {
            return None;
        }
        Some(StageError::LeaseLost(format!(
            "the checkpoint {key} was superseded by another invocation of the attempt"
        )))
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
            .map_err(|e| StageError::retryable(CHECKPOINT_FAILED, e))?;
        let bytes = match bytes {
            Some(bytes) => bytes,
            None => {
                return Err(self.moved_past(&key).await.unwrap_or_else(|| {
                    StageError::fatal(public("is missing"), format!("no object {key}"))
                }));
            }
        };
        let mismatch = || {
            StageError::fatal(
                public(&format!("is not of schema version {version}")),
                format!("object {key}"),
            )
        };
        let checkpoint: Checkpoint<serde_json::Value> = serde_json::from_slice(&bytes)
            .ok()
            .filter(|c: &Checkpoint<serde_json::Value>| c.stage == stage)
            .ok_or_else(mismatch)?;
        // A fanned-out stage's own checkpoint holds what its merge saved: that is its output.
        let output =
            longhaul_worker::fan_out::stage_output(checkpoint.schema_version, checkpoint.state)
                .map_err(|e| {
                    StageError::fatal(public("is unreadable"), format!("object {key}: {e:?}"))
                })?;
        match output {
            Some((found, state)) if found == version => {
                serde_json::from_value(state).map_err(|_| mismatch())
            }
            _ => Err(mismatch()),
        }
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
            if let Some(err) = self.moved_past(&key).await {
                return Err(err);
            }
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
        if header.schema_version != version && version == FAN_OUT_VERSION {
            // The fan-out asking whether its stage runs plain: it does.
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
        // The item cadence counts from the checkpoint resumed, so a resumed stage is not due
        // a checkpoint at once; the time cadence counts from this invocation's start.
        if let Some(done) = checkpoint.items_done {
            self.last_checkpoint.1 = done;
        }
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
            .map_err(crate::stage_error::fenced)?;
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

    /// Moves the progress record to the next stage (the stage boundary), whose clock starts
    /// now. The checkpoint pointer is kept: the finished stage's last checkpoint is the next
    /// stage's input.
    pub async fn advance(&mut self, next_stage: &'static str) -> Result<(), StageError> {
        self.stage_index += 1;
        self.stage = next_stage;
        self.stage_clock = StageClock {
            attempt: self.lease.attempt,
            stage_index: self.stage_index,
            resumes: self.job.resumes,
            started_at: Timestamp::from(self.deps.clock.now()),
        };
        self.floor_done = 0;
        self.last_done = 0;
        match self.write(0, None).await {
            // The owner paused the job as the stage ended: the boundary is crossed all the
            // same (the write carrying the flag), so the resume starts the next stage.
            Err(StageError::Paused) => self.write(0, None).await,
            other => other,
        }
    }
}
