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

/// Largest [`ResultRef::with_summary`], serialised: a summary is shown with the job and sent
/// in its webhook, not a second result.
pub const MAX_SUMMARY_BYTES: usize = 4 * 1024;

/// A result the framework stored, keyed by the attempt: only the framework makes one, so a
/// stage can only finish with a result of its own attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRef {
    held: Held,
    summary: Option<serde_json::Value>,
}

/// Where the framework keeps a result.
#[derive(Debug, Clone, PartialEq)]
enum Held {
    /// Stored at this location (opaque to kinds).
    Stored(String),
    /// Small enough to travel with the job's success: kept by the host in the job's record.
    Inline { content_type: String, body: Vec<u8> },
}

impl ResultRef {
    /// For hosts: the stored result's location (opaque to kinds).
    pub fn from_host(location: String) -> Self {
        ResultRef { held: Held::Stored(location), summary: None }
    }

    /// For hosts: a result the host keeps with the job's success instead of storing it now.
    pub fn inline_from_host(content_type: String, body: Vec<u8>) -> Self {
        ResultRef { held: Held::Inline { content_type, body }, summary: None }
    }

    /// For hosts: the stored result's location; `None` for a result kept inline.
    pub fn location(&self) -> Option<&str> {
        match &self.held {
            Held::Stored(location) => Some(location),
            Held::Inline { .. } => None,
        }
    }

    /// For hosts: a result kept inline, as its media type and bytes.
    pub fn inline(&self) -> Option<(&str, &[u8])> {
        match &self.held {
            Held::Stored(_) => None,
            Held::Inline { content_type, body } => Some((content_type, body)),
        }
    }

    /// The result with a small structured outcome beside it — a count of invalid lines, the
    /// rows written — shown as the job's `summary` on `GET /jobs/{id}` and in its terminal
    /// webhook. At most [`MAX_SUMMARY_BYTES`] serialised; a larger one is a fatal error (a
    /// bug of the kind, not of the job's input).
    pub fn with_summary(mut self, summary: impl serde::Serialize) -> Result<Self, KindError> {
        let summary = serde_json::to_value(summary).map_err(|e| {
            KindError::fatal(PublicMessage::fixed("the job's summary does not serialise"))
                .because(e)
        })?;
        let size = summary.to_string().len();
        if size > MAX_SUMMARY_BYTES {
            return Err(KindError::fatal(PublicMessage::fixed(
                "the job's summary is larger than the framework allows",
            ))
            .because(format!("a summary of {size} bytes; at most {MAX_SUMMARY_BYTES}")));
        }
        self.summary = Some(summary);
        Ok(self)
    }

    /// The summary given with [`ResultRef::with_summary`], if any.
    pub fn summary(&self) -> Option<&serde_json::Value> {
        self.summary.as_ref()
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

/// The smallest part a multipart result upload accepts, except its last part (S3's rule): 5 MiB.
pub const MIN_PART_SIZE: usize = 5 * 1024 * 1024;
/// The most parts one multipart result upload may have (S3's rule).
pub const MAX_PARTS: u32 = 10_000;

/// A multipart upload of the job's result in progress (see
/// [`StageContext::begin_result_upload`]). Serialisable: a kind keeps it in its checkpoint
/// (with its [`UploadedPart`]s) to continue the upload after a crash. Its fields are the
/// host's: a kind only hands it back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResultUpload {
    location: String,
    upload_id: String,
    attempt: u32,
    name: String,
    content_type: String,
}

impl ResultUpload {
    /// For hosts: an upload of `attempt` to `location` (the result's key), with the store's
    /// `upload_id`, of the file `name` with `content_type`.
    pub fn from_host(
        location: String,
        upload_id: String,
        attempt: u32,
        name: String,
        content_type: String,
    ) -> Self {
        ResultUpload { location, upload_id, attempt, name, content_type }
    }

    /// For hosts: where the result will be.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// For hosts: the store's id of the upload.
    pub fn upload_id(&self) -> &str {
        &self.upload_id
    }

    /// The attempt that began it.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The file name the stage gave the result.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The result's content type.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }
}

/// A part of a [`ResultUpload`] the framework stored (see [`StageContext::upload_part`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UploadedPart {
    number: u32,
    etag: String,
    size: u64,
}

impl UploadedPart {
    /// For hosts: part `number`, stored as `etag` (what completing the upload names it by),
    /// `size` bytes long.
    pub fn from_host(number: u32, etag: String, size: u64) -> Self {
        UploadedPart { number, etag, size }
    }

    /// Its part number (1-based).
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// For hosts: the store's tag of the part's content.
    pub fn etag(&self) -> &str {
        &self.etag
    }
}

/// Longest name of a result or staged file, in bytes.
pub const MAX_RESULT_NAME_BYTES: usize = 200;

/// Whether `name` may name a result or staged file: one plain path segment (letters, digits,
/// `.`, `_`, `-`), not starting with `.`, 1 to [`MAX_RESULT_NAME_BYTES`] bytes — the host keys
/// the file by it under the attempt's prefix. A kind that takes the name from its params
/// checks it with this, so a bad one is the client's 422, not the job's failure.
pub fn is_result_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_RESULT_NAME_BYTES
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// For hosts: refuses a result or staged file name that is not [`is_result_name`].
pub fn check_result_name(name: &str) -> Result<&str, KindError> {
    if is_result_name(name) {
        Ok(name)
    } else {
        Err(KindError::fatal(PublicMessage::fixed("the job kind named an invalid result file"))
            .because(format!("file name {name:?}")))
    }
}

/// For hosts: refuses a part number outside `1..=MAX_PARTS` (S3's range).
pub fn check_part_number(number: u32) -> Result<(), KindError> {
    if (1..=MAX_PARTS).contains(&number) {
        Ok(())
    } else {
        Err(KindError::fatal(PublicMessage::fixed(
            "the job kind numbered a part of its result outside 1 to 10000",
        ))
        .because(format!("part number {number}")))
    }
}

/// For hosts: what S3 checks of the parts a multipart upload is completed from, before asking
/// it (so every host refuses with the same words): at least one, in ascending order of number,
/// every one but the last at least [`MIN_PART_SIZE`] bytes. (That each part is what was
/// uploaded — its etag — only the store can tell.)
pub fn check_parts(parts: &[UploadedPart]) -> Result<(), KindError> {
    if parts.is_empty() {
        return Err(KindError::fatal(PublicMessage::fixed(
            "the job kind completed its result upload without any part",
        )));
    }
    for part in parts {
        check_part_number(part.number)?;
    }
    if parts.windows(2).any(|w| w[0].number >= w[1].number) {
        return Err(KindError::fatal(PublicMessage::fixed(
            "the job kind completed its result upload with parts out of order",
        )));
    }
    if let Some(small) = parts[..parts.len() - 1].iter().find(|p| p.size < MIN_PART_SIZE as u64) {
        return Err(KindError::fatal(PublicMessage::fixed(
            "a part of the job's result other than the last is smaller than 5 MiB",
        ))
        .because(format!("part {} is {} bytes", small.number, small.size)));
    }
    Ok(())
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

    /// Records how a fanned-out stage's shards stand: the framework's fan-out calls it as
    /// they change (a kind has no reason to). The host shows them with the job's progress,
    /// written with its next progress write — at once when a shard failed, since the stage
    /// fails with it.
    fn record_shards(
        &mut self,
        counts: crate::fan_out::ShardCounts,
    ) -> BoxFuture<'_, Result<(), KindError>>;

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

    /// Starts a multipart upload of the job's result, named `name` (one plain path segment,
    /// as for [`StageContext::write_result`]); the framework picks the key, per attempt. For
    /// a result too large to hold in memory: upload it in parts, keeping the
    /// [`ResultUpload`] and its [`UploadedPart`]s in the stage's checkpoint.
    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>>;

    /// Whether `upload` (read back from a checkpoint) can be continued by this invocation:
    /// true only for an upload this attempt began that is still open — or that this attempt
    /// already completed, when the invocation that completed it died before it heard so (the
    /// kind goes on to complete it again, which answers the same result). An upload of an
    /// earlier attempt cannot (a zombie of that attempt may still write to it): the kind
    /// abandons it and starts over; the framework aborts it.
    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>>;

    /// Uploads part `number` (1..=[`MAX_PARTS`]) of `upload`. Every part but the last must be
    /// at least [`MIN_PART_SIZE`] bytes (checked when the upload completes, as S3 does).
    /// Re-uploading a number replaces it.
    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>>;

    /// Completes `upload` from `parts` (in order) and returns the result the stage finishes
    /// with. Idempotent: completing an upload this attempt already completed from the same
    /// parts (a completion whose answer was lost, retried) answers the same result.
    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>>;

    /// Names an input's file: the name it was uploaded with (the last part of
    /// `POST /uploads`' `filename`). Only for the kind's declared inputs, as
    /// [`StageContext::read_input`].
    fn input_name(&self, input: &str) -> Result<String, KindError>;

    /// Publishes a staged file as the job's result (a copy, not a re-upload).
    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>>;

    /// The contents of a file the job staged ([`StageContext::stage_file`]), read whole: how a
    /// merge reads what its shards handed it in staged files (an output larger than
    /// `MAX_SHARD_BYTES`). Only the job's own staged files (or those of the job it retries);
    /// meant for files that fit in the worker's memory.
    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>>;

    /// Sleeps `duration` while heartbeating (at `done` of `total`).
    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>>;

    /// Whether the stage must checkpoint and return [`StageOutcome::Paused`] now: the
    /// invocation's deadline is near, or the owner cancelled or paused the job. A cancelled
    /// stage's checkpoint is its final one, kept so that a retry of the job resumes from it; a
    /// paused stage's is where its resume continues. A kind that goes on instead is stopped at
    /// its next progress report (the error's class says which: `Cancelled` or `Paused`).
    fn deadline_near(&self) -> bool;

    /// Whether a checkpoint is due at `items` done (the kind's cadence; always once the owner
    /// cancelled or paused the job, see [`StageContext::deadline_near`]).
    fn checkpoint_due(&self, items: u64) -> bool;

    /// Whether the owner's cancellation has been seen. The progress write that sees it
    /// succeeds and asks the stage to stop ([`StageContext::deadline_near`]); any progress
    /// reported after that fails with an error for which [`KindError::is_cancelled`] holds.
    fn cancelled(&self) -> bool;

    /// Waits for the job's signal `name` (1–64 ASCII letters, digits, `.`, `_`, `-`) for at
    /// most `timeout` (at most 29 days). A signal that came already — before the wait started
    /// included — is answered at once ([`Waited::Signal`] with its payload), as is a wait that
    /// timed out ([`Waited::TimedOut`]: the kind decides what that means). Otherwise the job is
    /// parked `paused`, waiting: this returns an error of class `Paused` that the kind must
    /// propagate with `?`, and the invocation ends — nothing runs or is billed while the job
    /// waits. When the signal comes (or the wait times out) the job is dispatched again and
    /// the stage starts over from its last checkpoint, so **save a checkpoint before calling
    /// this**: the stage then calls it again and gets the answer. Each name is received once
    /// per job; asking again for a name answers the same.
    fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Waited, KindError>>;

    /// Diagnostic kinds' injected failures: how many this job has had so far…
    fn attempt_failures(&self) -> u32;

    /// …and counting one more (fenced, durable across attempts).
    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>>;
}

/// The longest a wait for a signal may last ([`StageContext::wait_for`]): 29 days (a paused
/// job's checkpoint is kept 30 days).
pub const MAX_WAIT: Duration = Duration::from_secs(29 * 86_400);

/// Whether `name` is a signal name: 1 to 64 ASCII letters, digits, `.`, `_` or `-`.
pub fn is_signal_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What a wait for a signal came to ([`StageContext::wait_for`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// The signal came, with this payload (any JSON, at most 64 KB).
    Signal(serde_json::Value),
    /// The wait's timeout passed first.
    TimedOut,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_are_one_plain_segment() {
        for good in ["result.json", "bundle.zip", "a-b_c.1", &"x".repeat(MAX_RESULT_NAME_BYTES)] {
            assert!(is_result_name(good), "{good:?}");
            assert_eq!(check_result_name(good).unwrap(), good);
        }
        let long = "x".repeat(MAX_RESULT_NAME_BYTES + 1);
        for bad in ["", ".hidden", "a/b", "../x", "a b", "ü.zip", long.as_str()] {
            assert!(!is_result_name(bad), "{bad:?}");
            assert!(check_result_name(bad).is_err(), "{bad:?}");
        }
    }
}
