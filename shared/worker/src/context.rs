//! What a stage sees of the framework: [`StageContext`], implemented by each host (the stage
//! function over S3 and DynamoDB; an in-memory host for tests).

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::message::{KindError, PublicMessage};

/// A chunked read of an input, in order, from the requested offset.
pub type ByteStream = BoxStream<'static, Result<Bytes, KindError>>;

/// A type a stage checkpoints. `VERSION` is written with it: a checkpoint of another version
/// is never consumed (the stage restarts), so bump it whenever the serialised form changes.
pub trait Checkpoint: Serialize + DeserializeOwned + Send + Sync {
    /// The schema version of the serialised form.
    const VERSION: u32;
}

/// A result the framework stored, keyed by the attempt: only the framework makes one, so a
/// stage can only finish with a result of its own attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRef(String);

impl ResultRef {
    /// For hosts: the stored result's location (opaque to kinds).
    pub fn from_host(location: String) -> Self {
        ResultRef(location)
    }

    /// For hosts: the stored result's location.
    pub fn location(&self) -> &str {
        &self.0
    }
}

/// A file a stage staged for a later stage to publish (see
/// [`StageContext::stage_file`]); it serialises, so it can travel in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagedFile {
    location: String,
    content_type: String,
    name: String,
}

impl StagedFile {
    /// For hosts: a staged file at `location`.
    pub fn from_host(location: String, content_type: String, name: String) -> Self {
        StagedFile { location, content_type, name }
    }

    /// For hosts: where it is.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Its content type.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The file name the stage gave it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// How a stage invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOutcome {
    /// The deadline is near and the state is checkpointed: call the stage again.
    Paused,
    /// The stage is complete; the next one starts (its input is this stage's last
    /// checkpoint, see [`StageContext::carried_raw`]).
    StageDone,
    /// The last stage is complete and the result is stored.
    Finished(ResultRef),
}

/// The framework as one stage invocation sees it. Object-safe: kinds take
/// `&mut dyn StageContext`; the typed helpers (`checkpoint`, `resume`, `carried`) are
/// inherent methods of `dyn StageContext`.
///
/// Every write is fenced by the attempt's lease: a write the framework refuses surfaces as a
/// [`KindError`] (cancelled, lease lost) that the stage returns with `?`.
pub trait StageContext: Send {
    /// The current stage's name.
    fn stage(&self) -> &str;

    /// The attempt running (1-based).
    fn attempt(&self) -> u32;

    /// Reports progress within the stage (`done` of `total` items); rate-limited by the
    /// framework, and the heartbeat.
    fn progress(&mut self, done: u64, total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>>;

    /// Saves `state` (schema `version`) as the stage's checkpoint and makes it current.
    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: serde_json::Value,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>>;

    /// The stage's own current checkpoint, if there is one of schema `version` (one of another
    /// version is not consumed: the stage restarts).
    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<serde_json::Value>, KindError>>;

    /// Whether the current checkpoint is this stage's own (not the previous stage's output).
    fn has_own_checkpoint(&self) -> bool;

    /// The final checkpoint of the previous stage `from_stage` (schema `version`), which this
    /// stage starts from. Missing or of another version: a fatal error.
    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<serde_json::Value, KindError>>;

    /// The size of `input` (one of the kind's declared inputs; the framework checks it is the
    /// job owner's upload). A missing input is a fatal error.
    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>>;

    /// Streams `input` from byte `offset` to its end.
    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>>;

    /// Stores a file for a later stage to publish (e.g. a rendered report); the framework
    /// picks where, per stage and attempt.
    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>>;

    /// Stores `body` as the job's result, named `name` (e.g. `result.json`); the framework
    /// picks the key, per attempt.
    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>>;

    /// Publishes a staged file as the job's result (a copy, not a re-upload).
    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>>;

    /// Sleeps `duration` while heartbeating (at `done` of `total`).
    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>>;

    /// Whether the stage must checkpoint and return [`StageOutcome::Paused`] now: the
    /// invocation's deadline is near, or the owner cancelled the job. A cancelled stage's
    /// checkpoint is its final one, kept so that a retry of the job resumes from it.
    fn deadline_near(&self) -> bool;

    /// Whether a checkpoint is due at `items` done (the kind's cadence; always once the owner
    /// cancelled, see [`StageContext::deadline_near`]).
    fn checkpoint_due(&self, items: u64) -> bool;

    /// Whether the owner's cancellation has been seen. The progress write that sees it
    /// succeeds and asks the stage to stop ([`StageContext::deadline_near`]); any progress
    /// reported after that fails with an error for which [`KindError::is_cancelled`] holds.
    fn cancelled(&self) -> bool;

    /// Diagnostic kinds' injected failures: how many this job has had so far…
    fn attempt_failures(&self) -> u32;

    /// …and counting one more (fenced, durable across attempts).
    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>>;
}

fn unserialisable(err: serde_json::Error) -> KindError {
    KindError::fatal(PublicMessage::fixed("a checkpoint of the job is unreadable")).because(err)
}

impl dyn StageContext + '_ {
    /// Saves `state` as the stage's checkpoint (schema version [`Checkpoint::VERSION`]).
    pub async fn checkpoint<C: Checkpoint>(
        &mut self,
        state: &C,
        done: u64,
        total: Option<u64>,
    ) -> Result<(), KindError> {
        let value = serde_json::to_value(state).map_err(unserialisable)?;
        self.save_checkpoint_raw(C::VERSION, value, done, total).await
    }

    /// The stage's own checkpoint of type `C`, if any.
    pub async fn resume<C: Checkpoint>(&mut self) -> Result<Option<C>, KindError> {
        match self.load_checkpoint_raw(C::VERSION).await? {
            Some(value) => serde_json::from_value(value).map(Some).map_err(unserialisable),
            None => Ok(None),
        }
    }

    /// The previous stage `from_stage`'s final checkpoint, of type `C`.
    pub async fn carried<C: Checkpoint>(&mut self, from_stage: &str) -> Result<C, KindError> {
        let value = self.carried_raw(from_stage, C::VERSION).await?;
        serde_json::from_value(value).map_err(|e| {
            KindError::fatal(PublicMessage::domain(format!(
                "the {from_stage} stage's output is not of schema version {}",
                C::VERSION
            )))
            .because(e)
        })
    }
}
