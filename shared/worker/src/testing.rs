//! An in-memory host for testing a kind without the emulator (feature `testing`).
//!
//! [`Host`] runs a kind's stages the way the stage function does — one current checkpoint that
//! a stage resumes from and the next stage starts from, results keyed by attempt, progress
//! writes that can be refused by a cancellation — with everything in memory and no real time
//! passing (`pause` returns at once). On top of it:
//!
//! * [`Host::run`] runs a job to its end;
//! * [`assert_resumable`] runs it once straight through, then again crashed right after each
//!   of its checkpoints in turn (the invocation dies; a new one resumes from what is durable),
//!   and asserts every run produces the same result;
//! * [`Host::cancel_after_writes`] makes the n-th progress write find the job cancelled: as in
//!   the stage function, that write asks the stage to stop (`deadline_near`), its next
//!   checkpoint is the final one ([`Trace::final_checkpoint`]), and progress reported after
//!   that fails as cancelled.
//! * multipart result uploads follow S3's rules (part numbers 1 to 10,000, every part but the
//!   last at least 5 MiB, parts named by the etag they were stored with, an aborted or
//!   completed upload is gone) and are traced ([`Trace::parts_uploaded`],
//!   [`Trace::uploads_aborted`]), so a test can assert a resumed stage did not upload a part
//!   twice.
//!
//! Attempts are modelled as the state machine makes them: a crash or a pause continues the
//! same attempt (the same lease: an upload it began can be continued); a retryable error is
//! retried within the attempt up to three times, then in a new attempt;
//! [`Host::new_attempt_after_checkpoint`] crashes a run into a new attempt (a dead worker
//! re-dispatched), and [`assert_resumable`] does both after every checkpoint.
//!
//! ```
//! # use longhaul_worker::testing::{Host, assert_resumable};
//! # fn check<K: longhaul_worker::JobKind + Clone>(kind: K) {
//! let params = serde_json::json!({"n": 10});
//! let finished = Host::new().run(&kind, &params).expect("the job succeeds");
//! assert_resumable(&kind, &Host::new(), &params);
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use serde_json::Value;

use crate::context::{
    ByteStream, ResultRef, ResultUpload, StageContext, StageOutcome, StagedFile, UploadedPart,
    check_part_number, check_parts,
};
use crate::message::{ErrorClass, KindError, PublicMessage};
use crate::registry::{DynKind, JobKind, Registry};

/// What a finished job left: its result file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The name the kind gave it.
    pub name: String,
    /// Its content type.
    pub content_type: String,
    /// Its bytes.
    pub body: Vec<u8>,
    /// The attempt that wrote it.
    pub attempt: u32,
}

/// How a run went, beyond its result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Checkpoints saved, in all invocations.
    pub checkpoints: u32,
    /// Stage invocations.
    pub invocations: u32,
    /// Invocations that ended `Paused`.
    pub pauses: u32,
    /// Simulated crashes.
    pub crashes: u32,
    /// Retryable failures retried.
    pub retries: u32,
    /// Whether a cancelled run saved a final checkpoint (what a retry would resume from).
    pub final_checkpoint: bool,
    /// Attempts the run took (1 unless a retryable error outlasted an attempt's tries or a
    /// run was crashed into a new attempt).
    pub attempts: u32,
    /// Multipart result uploads begun.
    pub uploads_begun: u32,
    /// Every part stored by `upload_part`, in order (re-uploads included).
    pub parts_uploaded: Vec<PartUploaded>,
    /// Multipart uploads of an earlier attempt aborted by the host (`can_continue`).
    pub uploads_aborted: u32,
    /// Multipart result uploads completed (a completion repeated after a lost answer is not
    /// counted again).
    pub uploads_completed: u32,
}

/// One `upload_part` call that stored a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartUploaded {
    /// Which upload: 1 for the run's first `begin_result_upload`, 2 for its second…
    pub upload: u32,
    /// The attempt that uploaded it.
    pub attempt: u32,
    /// The part number.
    pub number: u32,
    /// Its size in bytes.
    pub size: u64,
}

/// An in-memory host: the job's inputs and how the run is disturbed.
#[derive(Debug, Clone)]
pub struct Host {
    owner_inputs: HashMap<String, (Vec<u8>, usize)>,
    deadline_every: Option<u32>,
    crash_after_checkpoint: Option<u32>,
    crash_after_completion: bool,
    new_attempt_after_checkpoint: Option<u32>,
    cancel_after_writes: Option<u32>,
    max_attempts: u32,
    checkpoint_items: u64,
}

impl Default for Host {
    fn default() -> Self {
        Host::new()
    }
}

/// The durable state of a job between invocations (what S3 and the progress record hold).
#[derive(Debug, Default)]
struct Durable {
    stage_index: usize,
    /// The current checkpoint: its stage, schema version and state.
    checkpoint: Option<(String, u32, Value)>,
    files: HashMap<String, (String, Vec<u8>)>,
    failures: u32,
    attempt: u32,
    /// Tries of the current attempt that failed retryably.
    tries: u32,
    writes: u32,
    /// Multipart uploads by upload id (what S3 keeps of them).
    uploads: HashMap<String, MemoryUpload>,
    trace: Trace,
}

/// Tries of one attempt: the first, then the state machine's three retries of
/// `Job.Retryable` (the ASL's retrier); after them the job is retried in a new attempt.
const TRIES_PER_ATTEMPT: u32 = 4;

/// A multipart upload as S3 keeps it.
#[derive(Debug)]
struct MemoryUpload {
    /// Its number in the run (for the trace).
    ordinal: u32,
    location: String,
    attempt: u32,
    content_type: String,
    state: UploadState,
    /// Parts by number: etag and bytes.
    parts: BTreeMap<u32, (String, Vec<u8>)>,
    /// Once completed: the parts it was completed from (number, etag, size), what S3's
    /// object at the key tells of them (its size and multipart ETag).
    completed_from: Vec<(u32, String, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UploadState {
    Open,
    Aborted,
    Completed,
}

impl Host {
    /// A host with no inputs and no disturbance.
    pub fn new() -> Self {
        Host {
            owner_inputs: HashMap::new(),
            deadline_every: None,
            crash_after_checkpoint: None,
            crash_after_completion: false,
            new_attempt_after_checkpoint: None,
            cancel_after_writes: None,
            max_attempts: 10,
            checkpoint_items: 1_000,
        }
    }

    /// Adds an upload of the job's owner named `name`, read back in chunks of `chunk` bytes
    /// (small chunks exercise a kind's chunk-boundary handling).
    pub fn input(mut self, name: &str, bytes: Vec<u8>, chunk: usize) -> Self {
        self.owner_inputs.insert(name.to_owned(), (bytes, chunk.max(1)));
        self
    }

    /// The deadline nears at the `n`-th `deadline_near` call of each invocation (at least the
    /// second, so every invocation gets some work done): stages pause and are called again.
    pub fn deadline_every(mut self, n: u32) -> Self {
        self.deadline_every = Some(n.max(2));
        self
    }

    /// The invocation crashes right after the `n`-th checkpoint of the run (1-based) is saved.
    pub fn crash_after_checkpoint(mut self, n: u32) -> Self {
        self.crash_after_checkpoint = Some(n);
        self
    }

    /// The invocation crashes right after the first completion of a result upload took effect,
    /// before the kind heard of it (S3's answer lost): the retried invocation finds the upload
    /// gone and its object in place.
    pub fn crash_after_completion(mut self) -> Self {
        self.crash_after_completion = true;
        self
    }

    /// The invocation crashes right after the `n`-th checkpoint of the run (1-based) is saved,
    /// and the job goes on in a new attempt (a dead worker's job re-dispatched): what that
    /// attempt began is the next one's to abandon.
    pub fn new_attempt_after_checkpoint(mut self, n: u32) -> Self {
        self.new_attempt_after_checkpoint = Some(n);
        self
    }

    /// The `n`-th progress write of the run (1-based) finds the job cancelled.
    pub fn cancel_after_writes(mut self, n: u32) -> Self {
        self.cancel_after_writes = Some(n);
        self
    }

    /// Checkpoint cadence in items (default 1,000; 1 makes every item a checkpoint).
    pub fn checkpoint_items(mut self, n: u64) -> Self {
        self.checkpoint_items = n.max(1);
        self
    }

    /// Runs `kind`'s job with `params` (checked as submit checks them) to its end: its result,
    /// or the error that ended it (fatal, cancelled, or retryable with the attempts spent).
    pub fn run<K: JobKind + Clone>(&self, kind: &K, params: &Value) -> Result<Finished, KindError> {
        self.run_traced(kind, params).0
    }

    /// [`Host::run`], with how the run went.
    pub fn run_traced<K: JobKind + Clone>(
        &self,
        kind: &K,
        params: &Value,
    ) -> (Result<Finished, KindError>, Trace) {
        let registry = Registry::builder().kind(kind.clone()).build().expect("a valid kind");
        let kind = registry.get(K::NAME).expect("registered");
        futures::executor::block_on(self.drive(kind, params))
    }

    async fn drive(
        &self,
        kind: &dyn DynKind,
        params: &Value,
    ) -> (Result<Finished, KindError>, Trace) {
        let mut durable = Durable { attempt: 1, ..Durable::default() };
        durable.trace.attempts = 1;
        let inputs = match kind.check(params) {
            Ok(inputs) => inputs,
            Err(e) => return (Err(KindError::fatal(PublicMessage::domain(e))), durable.trace),
        };
        let stages = kind.stages();
        loop {
            durable.trace.invocations += 1;
            let stage = stages[durable.stage_index];
            let mut ctx = MemoryContext {
                host: self,
                durable: &mut durable,
                stage,
                inputs: &inputs,
                deadline_calls: std::cell::Cell::new(0),
                checkpoint_base: 0,
                cancelled: false,
                crashed: false,
                new_attempt: false,
            };
            let outcome = kind.run_stage(&mut ctx, params).await;
            let (crashed, cancelled, new_attempt) = (ctx.crashed, ctx.cancelled, ctx.new_attempt);
            match outcome {
                _ if crashed => {
                    durable.trace.crashes += 1;
                    if new_attempt {
                        durable.next_attempt();
                    }
                }
                // Stopped as asked after the cancellation (or finished regardless): the job
                // ends cancelled, as the stage function ends it.
                Ok(_) if cancelled => return (Err(KindError::cancelled()), durable.trace),
                Ok(StageOutcome::Paused) => durable.trace.pauses += 1,
                Ok(StageOutcome::StageDone) if durable.stage_index + 1 < stages.len() => {
                    durable.stage_index += 1;
                }
                Ok(StageOutcome::StageDone) => {
                    let error = KindError::fatal(PublicMessage::fixed(
                        "the last stage ended without a result",
                    ));
                    return (Err(error), durable.trace);
                }
                Ok(StageOutcome::Finished(result)) => {
                    let (name, attempt) = parse_result(result.location());
                    let (content_type, body) = durable
                        .files
                        .get(result.location())
                        .cloned()
                        .expect("the result is stored");
                    let finished = Finished { name, content_type, body, attempt };
                    return (Ok(finished), durable.trace);
                }
                // The state machine retries the stage within the attempt, then in a new
                // attempt; the durable state stays.
                Err(e)
                    if e.class == ErrorClass::Retryable
                        && (durable.tries + 1 < TRIES_PER_ATTEMPT
                            || durable.attempt < self.max_attempts) =>
                {
                    durable.trace.retries += 1;
                    durable.tries += 1;
                    if durable.tries >= TRIES_PER_ATTEMPT {
                        durable.next_attempt();
                    }
                }
                Err(e) => return (Err(e), durable.trace),
            }
            if durable.trace.invocations > 100_000 {
                let error = KindError::fatal(PublicMessage::fixed("the job never finished"));
                return (Err(error), durable.trace);
            }
        }
    }
}

impl Durable {
    /// The job goes on in a new attempt (a new lease).
    fn next_attempt(&mut self) {
        self.attempt += 1;
        self.tries = 0;
        self.trace.attempts += 1;
    }
}

fn parse_result(location: &str) -> (String, u32) {
    let rest = location.strip_prefix("results/").unwrap_or(location);
    let (attempt, name) = rest.split_once('/').unwrap_or(("0", rest));
    (name.to_owned(), attempt.parse().unwrap_or(0))
}

/// Runs `kind`'s job with `params` on `host` straight through, then once more for each of its
/// checkpoints, crashed right after that checkpoint and resumed — within the same attempt, and
/// again in a new attempt; panics unless every run produces the same result bytes.
pub fn assert_resumable<K: JobKind + Clone>(kind: &K, host: &Host, params: &Value) {
    let (baseline, trace) = host.run_traced(kind, params);
    let baseline = baseline.unwrap_or_else(|e| panic!("the uninterrupted run failed: {e}"));
    for n in 1..=trace.checkpoints {
        for new_attempt in [false, true] {
            let host = if new_attempt {
                host.clone().new_attempt_after_checkpoint(n)
            } else {
                host.clone().crash_after_checkpoint(n)
            };
            let how = if new_attempt { "into a new attempt" } else { "within the attempt" };
            let (resumed, resumed_trace) = host.run_traced(kind, params);
            let resumed =
                resumed.unwrap_or_else(|e| panic!("crashed after checkpoint {n} {how}: {e}"));
            assert_eq!(resumed_trace.crashes, 1, "the run crashed after checkpoint {n} {how}");
            assert_eq!(
                (resumed.name.as_str(), resumed.body.as_slice()),
                (baseline.name.as_str(), baseline.body.as_slice()),
                "crashed after checkpoint {n} of {} {how}, the result differs",
                trace.checkpoints
            );
        }
    }
}

struct MemoryContext<'a> {
    host: &'a Host,
    durable: &'a mut Durable,
    stage: &'static str,
    inputs: &'a [String],
    deadline_calls: std::cell::Cell<u32>,
    checkpoint_base: u64,
    cancelled: bool,
    crashed: bool,
    /// Crashed into a new attempt ([`Host::new_attempt_after_checkpoint`]).
    new_attempt: bool,
}

impl MemoryContext<'_> {
    fn write(&mut self) -> Result<(), KindError> {
        if self.crashed {
            return Err(crash());
        }
        self.durable.writes += 1;
        if self.host.cancel_after_writes.is_some_and(|n| self.durable.writes >= n) {
            self.cancelled = true;
            return Err(KindError::cancelled());
        }
        Ok(())
    }

    /// A progress write from the kind: the one that finds the job cancelled succeeds (the
    /// stage is asked to stop), any after it fails as cancelled.
    fn write_unless_cancelled(&mut self) -> Result<(), KindError> {
        if self.cancelled {
            return Err(KindError::cancelled());
        }
        match self.write() {
            Err(e) if e.is_cancelled() => Ok(()),
            other => other,
        }
    }

    fn input(&self, input: &str) -> Result<&(Vec<u8>, usize), KindError> {
        if !self.inputs.iter().any(|i| i == input) {
            return Err(KindError::fatal(PublicMessage::fixed(
                "the input is not one of the job owner's uploads",
            )));
        }
        self.host.owner_inputs.get(input).ok_or_else(|| {
            KindError::fatal(PublicMessage::fixed(
                "the input upload does not exist (upload it before submitting the job)",
            ))
        })
    }
}

/// A simulated crash: the invocation is gone (the host discards whatever the stage answers).
fn crash() -> KindError {
    KindError::lease_lost("simulated crash")
}

fn name_ok(name: &str) -> Result<String, KindError> {
    crate::context::check_result_name(name).map(str::to_owned)
}

/// S3's answer to a part or a completion of an upload that is not open (never begun,
/// aborted, completed), as the stage function reports it.
fn no_such_upload() -> KindError {
    KindError::fatal(PublicMessage::fixed(
        "the job's result could not be stored: it does not exist",
    ))
}

/// A stage that goes on with an upload of another attempt (it must ask `can_continue`).
fn not_this_attempts() -> KindError {
    KindError::fatal(PublicMessage::fixed(
        "the job kind went on with a result upload of another attempt",
    ))
}

/// A content tag like S3's (the MD5 of the part): the same bytes, the same tag.
fn etag(body: &[u8]) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}{:08x}\"", hasher.finish(), body.len())
}

impl MemoryContext<'_> {
    /// The open upload `upload` names, if it is this attempt's.
    /// The result of this attempt's `upload` if it was completed already from exactly `parts`
    /// (what the stage host checks of the object at the upload's key when S3 answers that the
    /// upload is gone).
    fn completed_already(
        &self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> Option<ResultRef> {
        let stored = self.durable.uploads.get(upload.upload_id())?;
        let same_parts = stored.completed_from.len() == parts.len()
            && stored.completed_from.iter().zip(parts).all(|((number, etag, size), part)| {
                *number == part.number() && etag == part.etag() && *size == part.size()
            });
        (!self.crashed
            && upload.attempt() == self.durable.attempt
            && stored.state == UploadState::Completed
            && stored.location == upload.location()
            && same_parts)
            .then(|| ResultRef::from_host(stored.location.clone()))
    }

    fn open_upload(&mut self, upload: &ResultUpload) -> Result<&mut MemoryUpload, KindError> {
        if self.crashed {
            return Err(crash());
        }
        if upload.attempt() != self.durable.attempt {
            return Err(not_this_attempts());
        }
        match self.durable.uploads.get_mut(upload.upload_id()) {
            Some(stored)
                if stored.state == UploadState::Open && stored.location == upload.location() =>
            {
                Ok(stored)
            }
            _ => Err(no_such_upload()),
        }
    }
}

impl StageContext for MemoryContext<'_> {
    fn stage(&self) -> &str {
        self.stage
    }

    fn attempt(&self) -> u32 {
        self.durable.attempt
    }

    fn progress(
        &mut self,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let written = self.write_unless_cancelled();
        async move { written }.boxed()
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            if !self.cancelled {
                match self.write() {
                    // Found cancelled while saved: it is the final checkpoint.
                    Err(e) if e.is_cancelled() => {}
                    other => other?,
                }
            }
            self.durable.trace.final_checkpoint |= self.cancelled;
            self.durable.checkpoint = Some((self.stage.to_owned(), version, state));
            self.durable.trace.checkpoints += 1;
            self.checkpoint_base = done;
            let n = Some(self.durable.trace.checkpoints);
            if self.host.crash_after_checkpoint == n || self.host.new_attempt_after_checkpoint == n
            {
                self.crashed = true;
                self.new_attempt = self.host.new_attempt_after_checkpoint == n;
                return Err(crash());
            }
            Ok(())
        }
        .boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        let found = match &self.durable.checkpoint {
            Some((stage, v, state)) if stage == self.stage && *v == version => Some(state.clone()),
            _ => None,
        };
        async move { Ok(found) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        self.durable.checkpoint.as_ref().is_some_and(|(stage, _, _)| stage == self.stage)
    }

    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        let found = match &self.durable.checkpoint {
            Some((stage, v, state)) if stage == from_stage && *v == version => Ok(state.clone()),
            _ => Err(KindError::fatal(PublicMessage::domain(format!(
                "the {from_stage} stage's output is missing or not of schema version {version}"
            )))),
        };
        async move { found }.boxed()
    }

    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        let size = self.input(input).map(|(bytes, _)| bytes.len() as u64);
        async move { size }.boxed()
    }

    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        let stream = self.input(input).map(|(bytes, chunk)| {
            let from = (offset as usize).min(bytes.len());
            let chunks: Vec<Result<bytes::Bytes, KindError>> = bytes[from..]
                .chunks(*chunk)
                .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                .collect();
            futures::StreamExt::boxed(futures::stream::iter(chunks))
        });
        async move { stream }.boxed()
    }

    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            let location = format!("staged/{}/a{}-{name}", self.stage, self.durable.attempt);
            self.durable.files.insert(location.clone(), (content_type.clone(), body));
            Ok(StagedFile::from_host(location, content_type, name))
        }
        .boxed()
    }

    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let location = format!("results/{}/{}", self.durable.attempt, name?);
            self.durable.files.insert(location.clone(), (content_type, body));
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let staged = staged.clone();
        async move {
            let file = self.durable.files.get(staged.location()).cloned().ok_or_else(|| {
                KindError::fatal(PublicMessage::fixed("the staged file is missing"))
            })?;
            let location = format!("results/{}/{}", self.durable.attempt, name_ok(staged.name())?);
            self.durable.files.insert(location.clone(), file);
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            if self.crashed {
                return Err(crash());
            }
            let attempt = self.durable.attempt;
            self.durable.trace.uploads_begun += 1;
            let ordinal = self.durable.trace.uploads_begun;
            let upload_id = format!("upload-{ordinal}");
            let location = format!("results/{attempt}/{name}");
            self.durable.uploads.insert(
                upload_id.clone(),
                MemoryUpload {
                    ordinal,
                    location: location.clone(),
                    attempt,
                    content_type: content_type.clone(),
                    state: UploadState::Open,
                    parts: BTreeMap::new(),
                    completed_from: Vec::new(),
                },
            );
            Ok(ResultUpload::from_host(location, upload_id, attempt, name, content_type))
        }
        .boxed()
    }

    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        let upload = upload.clone();
        async move {
            let attempt = self.durable.attempt;
            let Some(stored) = self.durable.uploads.get_mut(upload.upload_id()) else {
                return Ok(false);
            };
            if stored.location != upload.location() || stored.attempt != upload.attempt() {
                return Ok(false);
            }
            if stored.attempt != attempt {
                // An earlier attempt's: a zombie of it may still write to it. Aborted.
                if stored.state == UploadState::Open {
                    stored.state = UploadState::Aborted;
                    stored.parts.clear();
                    self.durable.trace.uploads_aborted += 1;
                }
                return Ok(false);
            }
            // Open, or completed already (a completion whose answer was lost): the kind goes
            // on, and completing it again answers the same result.
            Ok(matches!(stored.state, UploadState::Open | UploadState::Completed))
        }
        .boxed()
    }

    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        let upload = upload.clone();
        async move {
            check_part_number(number)?;
            let attempt = self.durable.attempt;
            let stored = self.open_upload(&upload)?;
            let (tag, size) = (etag(&body), body.len() as u64);
            stored.parts.insert(number, (tag.clone(), body));
            let part = PartUploaded { upload: stored.ordinal, attempt, number, size };
            self.durable.trace.parts_uploaded.push(part);
            Ok(UploadedPart::from_host(number, tag, size))
        }
        .boxed()
    }

    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let upload = upload.clone();
        let parts = parts.to_vec();
        async move {
            check_parts(&parts)?;
            if let Some(done) = self.completed_already(&upload, &parts) {
                return Ok(done);
            }
            let stored = self.open_upload(&upload)?;
            let mut body = Vec::new();
            for part in &parts {
                // What the store has under that number, tagged as the kind says (S3's
                // InvalidPart otherwise); the sizes checked are the stored ones.
                match stored.parts.get(&part.number()) {
                    Some((tag, bytes)) if tag == part.etag() && bytes.len() as u64 == part.size() => {
                        body.extend_from_slice(bytes);
                    }
                    _ => {
                        return Err(KindError::fatal(PublicMessage::fixed(
                            "the job kind completed its result upload with a part that was not uploaded",
                        ))
                        .because(format!("part {}", part.number())));
                    }
                }
            }
            stored.state = UploadState::Completed;
            stored.parts.clear();
            stored.completed_from =
                parts.iter().map(|p| (p.number(), p.etag().to_owned(), p.size())).collect();
            let (location, content_type) = (stored.location.clone(), stored.content_type.clone());
            self.durable.files.insert(location.clone(), (content_type, body));
            self.durable.trace.uploads_completed += 1;
            if self.host.crash_after_completion && self.durable.trace.uploads_completed == 1 {
                self.crashed = true;
                return Err(crash());
            }
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.input(input)?;
        Ok(input.rsplit('/').next().unwrap_or(input).to_owned())
    }

    fn pause(
        &mut self,
        _duration: Duration,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let written = self.write_unless_cancelled();
        async move { written }.boxed()
    }

    fn deadline_near(&self) -> bool {
        let calls = self.deadline_calls.get() + 1;
        self.deadline_calls.set(calls);
        self.cancelled || self.host.deadline_every.is_some_and(|n| calls >= n)
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        self.cancelled || items.saturating_sub(self.checkpoint_base) >= self.host.checkpoint_items
    }

    fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn attempt_failures(&self) -> u32 {
        self.durable.failures
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            self.write()?;
            self.durable.failures += 1;
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{Checkpoint, MIN_PART_SIZE};
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    /// Uploads `parts` parts (all 5 MiB but the last, `last` bytes), a checkpoint after each;
    /// once a part is uploaded, it fails retryably (before the next) `fail_times` times.
    #[derive(Debug, Clone, Copy)]
    struct Parts;

    #[derive(Deserialize, schemars::JsonSchema)]
    struct PartsParams {
        parts: u32,
        last: usize,
        #[serde(default)]
        fail_times: u32,
    }

    #[derive(Default, Serialize, Deserialize)]
    struct Uploading {
        upload: Option<ResultUpload>,
        parts: Vec<UploadedPart>,
    }

    impl Checkpoint for Uploading {
        const VERSION: u32 = 1;
    }

    fn body(number: u32, size: usize) -> Vec<u8> {
        vec![number as u8; size]
    }

    impl JobKind for Parts {
        const NAME: &'static str = "parts";
        type Params = PartsParams;

        fn stages(&self) -> &'static [&'static str] {
            &["upload"]
        }

        fn validate(&self, _: &PartsParams) -> Result<(), String> {
            Ok(())
        }

        async fn run_stage(
            &self,
            ctx: &mut dyn StageContext,
            params: &PartsParams,
        ) -> Result<StageOutcome, KindError> {
            let mut state: Uploading = ctx.resume().await?.unwrap_or_default();
            if let Some(upload) = &state.upload
                && !ctx.can_continue(upload).await?
            {
                state = Uploading::default();
            }
            let upload = match state.upload.clone() {
                Some(upload) => upload,
                None => {
                    let upload = ctx.begin_result_upload("big.bin", "application/x-big").await?;
                    state.upload = Some(upload.clone());
                    upload
                }
            };
            while (state.parts.len() as u32) < params.parts {
                if !state.parts.is_empty() && ctx.attempt_failures() < params.fail_times {
                    ctx.count_failure().await?;
                    return Err(KindError::retryable(PublicMessage::fixed("flaky")));
                }
                let n = state.parts.len() as u32 + 1;
                let size = if n == params.parts { params.last } else { MIN_PART_SIZE };
                state.parts.push(ctx.upload_part(&upload, n, body(n, size)).await?);
                ctx.checkpoint(&state, u64::from(n), Some(u64::from(params.parts))).await?;
                if ctx.deadline_near() {
                    return Ok(StageOutcome::Paused);
                }
            }
            Ok(StageOutcome::Finished(ctx.complete_result_upload(&upload, &state.parts).await?))
        }
    }

    fn expected(parts: u32, last: usize) -> Vec<u8> {
        (1..=parts).flat_map(|n| body(n, if n == parts { last } else { MIN_PART_SIZE })).collect()
    }

    fn numbers(trace: &Trace) -> Vec<(u32, u32)> {
        trace.parts_uploaded.iter().map(|p| (p.upload, p.number)).collect()
    }

    #[test]
    fn a_multipart_result_is_the_parts_in_order_and_survives_any_crash() {
        let params = json!({"parts": 3, "last": 10});
        let (finished, trace) = Host::new().run_traced(&Parts, &params);
        let finished = finished.unwrap();
        assert_eq!(finished.name, "big.bin");
        assert_eq!(finished.content_type, "application/x-big");
        assert_eq!(finished.body, expected(3, 10));
        assert_eq!(numbers(&trace), [(1, 1), (1, 2), (1, 3)]);
        assert_eq!(trace.parts_uploaded[2].size, 10);
        assert_resumable(&Parts, &Host::new(), &params);
    }

    #[test]
    fn a_resumed_invocation_of_the_same_attempt_continues_the_upload() {
        let params = json!({"parts": 3, "last": 10});
        for host in [
            Host::new().crash_after_checkpoint(1),
            Host::new().deadline_every(2),
            Host::new(), // with a retryable failure, retried within the attempt
        ] {
            let params = if host.crash_after_checkpoint.is_none() && host.deadline_every.is_none() {
                json!({"parts": 3, "last": 10, "fail_times": 1})
            } else {
                params.clone()
            };
            let (finished, trace) = host.run_traced(&Parts, &params);
            let finished = finished.unwrap();
            assert_eq!(finished.body, expected(3, 10));
            assert_eq!(finished.attempt, 1);
            assert_eq!(numbers(&trace), [(1, 1), (1, 2), (1, 3)], "no part twice: {trace:?}");
            assert_eq!((trace.uploads_begun, trace.uploads_aborted), (1, 0));
        }
    }

    #[test]
    fn another_attempts_upload_cannot_continue_and_is_aborted() {
        let params = json!({"parts": 3, "last": 10});
        let (finished, trace) =
            Host::new().new_attempt_after_checkpoint(2).run_traced(&Parts, &params);
        let finished = finished.unwrap();
        assert_eq!((finished.attempt, finished.body), (2, expected(3, 10)));
        assert_eq!(numbers(&trace), [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3)]);
        assert_eq!((trace.uploads_begun, trace.uploads_aborted, trace.attempts), (2, 1, 2));
        // A retryable failure that outlasts the attempt's four tries: the same.
        let flaky = json!({"parts": 2, "last": 1, "fail_times": 4});
        let (finished, trace) = Host::new().run_traced(&Parts, &flaky);
        assert_eq!(finished.unwrap().attempt, 2);
        assert_eq!(trace.retries, 4);
        assert_eq!(numbers(&trace), [(1, 1), (2, 1), (2, 2)], "{trace:?}");
        assert_eq!((trace.uploads_begun, trace.uploads_aborted), (2, 1));
    }

    /// A context on `durable` (attempt 1 unless set), for calling the host directly.
    fn context<'a>(host: &'a Host, durable: &'a mut Durable) -> MemoryContext<'a> {
        durable.attempt = durable.attempt.max(1);
        MemoryContext {
            host,
            durable,
            stage: "upload",
            inputs: &[],
            deadline_calls: std::cell::Cell::new(0),
            checkpoint_base: 0,
            cancelled: false,
            crashed: false,
            new_attempt: false,
        }
    }

    fn block<T>(f: BoxFuture<'_, T>) -> T {
        futures::executor::block_on(f)
    }

    #[test]
    fn s3s_rules_are_enforced_at_complete() {
        let host = Host::new();
        let mut durable = Durable::default();
        let mut ctx = context(&host, &mut durable);
        let upload = block(ctx.begin_result_upload("r.bin", "application/octet-stream")).unwrap();
        // Part numbers 1 to 10,000.
        for bad in [0, 10_001] {
            let err = block(ctx.upload_part(&upload, bad, vec![1])).unwrap_err();
            assert_eq!(err.class, ErrorClass::Fatal);
            assert!(err.public.as_str().contains("outside 1 to 10000"), "{err}");
        }
        // A too-small part other than the last is refused when completing, as S3 does.
        let small = block(ctx.upload_part(&upload, 1, vec![1; MIN_PART_SIZE - 1])).unwrap();
        let last = block(ctx.upload_part(&upload, 2, vec![2; 3])).unwrap();
        let err =
            block(ctx.complete_result_upload(&upload, &[small.clone(), last.clone()])).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert!(err.public.as_str().contains("smaller than 5 MiB"), "{err}");
        // Parts out of order, or none, are refused.
        for parts in [vec![last.clone(), small.clone()], vec![]] {
            let err = block(ctx.complete_result_upload(&upload, &parts)).unwrap_err();
            assert_eq!(err.class, ErrorClass::Fatal, "{err}");
        }
        // Re-uploading a number replaces the part: the old part (its etag) is gone.
        let big = block(ctx.upload_part(&upload, 1, vec![7; MIN_PART_SIZE])).unwrap();
        assert_ne!(big.etag(), small.etag());
        let stale = UploadedPart::from_host(1, small.etag().to_owned(), MIN_PART_SIZE as u64);
        let err = block(ctx.complete_result_upload(&upload, &[stale, last.clone()])).unwrap_err();
        assert!(err.public.as_str().contains("not uploaded"), "{err}");
        // A wrong etag is refused.
        let forged = UploadedPart::from_host(2, "\"nope\"".into(), 3);
        let err = block(ctx.complete_result_upload(&upload, &[big.clone(), forged])).unwrap_err();
        assert!(err.public.as_str().contains("not uploaded"), "{err}");
        // The right parts complete it: the replacement's bytes, then the last part.
        let result =
            block(ctx.complete_result_upload(&upload, &[big.clone(), last.clone()])).unwrap();
        assert_eq!(result.location(), "results/1/r.bin");
        // Completed, the upload takes no part and no other completion; the same completion
        // again (its first answer lost) answers the same result, and the kind may go on to it.
        assert!(block(ctx.upload_part(&upload, 3, vec![1])).is_err());
        assert!(block(ctx.complete_result_upload(&upload, std::slice::from_ref(&last))).is_err());
        let again = block(ctx.complete_result_upload(&upload, &[big, last])).unwrap();
        assert_eq!(again.location(), result.location());
        assert!(block(ctx.can_continue(&upload)).unwrap());
        let (_, body) = &durable.files["results/1/r.bin"];
        assert_eq!(body.len(), MIN_PART_SIZE + 3);
        assert!(body[..MIN_PART_SIZE].iter().all(|b| *b == 7));
    }

    #[test]
    fn an_upload_of_an_earlier_attempt_cannot_continue_and_is_aborted() {
        let host = Host::new();
        let mut durable = Durable::default();
        let upload = {
            let mut ctx = context(&host, &mut durable);
            let upload = block(ctx.begin_result_upload("r.bin", "text/plain")).unwrap();
            assert!(block(ctx.can_continue(&upload)).unwrap(), "its own attempt's");
            upload
        };
        durable.next_attempt();
        let mut ctx = context(&host, &mut durable);
        assert_eq!(ctx.attempt(), 2);
        assert!(!block(ctx.can_continue(&upload)).unwrap());
        // Going on with it anyway is refused.
        let err = block(ctx.upload_part(&upload, 1, vec![1])).unwrap_err();
        assert!(err.public.as_str().contains("another attempt"), "{err}");
        // Unknown uploads cannot continue either.
        let unknown = ResultUpload::from_host(
            "results/2/r.bin".into(),
            "upload-99".into(),
            2,
            "r.bin".into(),
            "text/plain".into(),
        );
        assert!(!block(ctx.can_continue(&unknown)).unwrap());
        assert!(block(ctx.upload_part(&unknown, 1, vec![1])).is_err());
        assert_eq!(durable.trace.uploads_aborted, 1);
        assert_eq!(durable.uploads["upload-1"].state, UploadState::Aborted);
    }

    #[test]
    fn input_names_are_the_uploads_file_names_of_declared_inputs_only() {
        let host = Host::new().input("uploads/abc/id-1/data.csv", b"a".to_vec(), 1);
        let mut durable = Durable::default();
        let inputs = ["uploads/abc/id-1/data.csv".to_owned()];
        let mut ctx = context(&host, &mut durable);
        ctx.inputs = &inputs;
        assert_eq!(ctx.input_name("uploads/abc/id-1/data.csv").unwrap(), "data.csv");
        assert!(ctx.input_name("uploads/abc/id-2/other.csv").is_err());
    }
}
