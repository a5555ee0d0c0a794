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
//! * a stage that fans out ([`JobKind::fans_out`]) runs its shards in a scrambled order
//!   ([`crate::ShardOrder::Scrambled`]), so a kind whose shards depend on their order shows
//!   it; crashes land inside shards as anywhere else;
//! * a job that ends failed or cancelled runs the undos of the stages it started, latest
//!   first, as the framework does ([`Trace::undos`]);
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

/// What a finished job left: its result file (and its summary, if the kind gave one).
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The name the kind gave it.
    pub name: String,
    /// Its content type.
    pub content_type: String,
    /// Its bytes.
    pub body: Vec<u8>,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// The summary the kind finished with ([`crate::ResultRef::with_summary`]).
    pub summary: Option<Value>,
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
    /// Every wait for a signal, in order, with what it came to: the payload, `TimedOut`, or
    /// (`None`) parked — the run ends there.
    pub waits: Vec<(String, Option<crate::Waited>)>,
    /// The signal a run that ended parked waits for.
    pub waiting: Option<String>,
    /// The undos run after the job failed or was cancelled, in order ([`JobKind::undo`]).
    pub undos: Vec<UndoRun>,
    /// Every count of a fanned-out stage's shards the framework recorded, in order
    /// ([`crate::StageContext::record_shards`]).
    pub shards: Vec<crate::fan_out::ShardCounts>,
}

/// One stage's undo as the host ran it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoRun {
    /// The stage undone.
    pub stage: String,
    /// Attempts it took (retryable failures retried within the job's attempts).
    pub attempts: u32,
    /// How its last attempt ended: an error here is an undo given up.
    pub result: Result<(), KindError>,
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
    /// Signals by name: sent with a payload, or (`None`) their wait timed out.
    signals: HashMap<String, Option<Value>>,
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
    /// The stage's count of items done when the current checkpoint was saved.
    checkpoint_done: u64,
    files: HashMap<String, (String, Vec<u8>)>,
    failures: u32,
    attempt: u32,
    /// Tries of the current attempt that failed retryably.
    tries: u32,
    writes: u32,
    /// Multipart uploads by upload id (what S3 keeps of them).
    uploads: HashMap<String, MemoryUpload>,
    /// Whether a stage began (the job was claimed): what its compensation needs.
    started: bool,
    trace: Trace,
}

/// Invocations in a row that may pause without a new checkpoint before [`Host::run`] gives up
/// on the stage: resumed from the same checkpoint, each would pause in the same place again.
const STALLED_PAUSES: u32 = 3;

/// Why [`Host::run`] gave up on a stage that pauses without checkpointing.
const NO_PROGRESS: &str = "the stage paused three invocations in a row without a new checkpoint: \
    it makes no progress within one invocation (it must save a checkpoint before it pauses; \
    with deadline_every(n), an invocation's n-th deadline_near call says pause)";

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
            signals: HashMap::new(),
        }
    }

    /// Signal `name` is sent with `payload` (before the run: kept until a wait asks for it).
    pub fn signal(mut self, name: &str, payload: Value) -> Self {
        self.signals.insert(name.to_owned(), Some(payload));
        self
    }

    /// The wait for signal `name` times out.
    pub fn time_out(mut self, name: &str) -> Self {
        self.signals.insert(name.to_owned(), None);
        self
    }

    /// Adds an upload of the job's owner named `name`, read back in chunks of `chunk` bytes
    /// (small chunks exercise a kind's chunk-boundary handling).
    pub fn input(mut self, name: &str, bytes: Vec<u8>, chunk: usize) -> Self {
        self.owner_inputs.insert(name.to_owned(), (bytes, chunk.max(1)));
        self
    }

    /// The deadline nears at the `n`-th `deadline_near` call of each invocation (at least the
    /// second, so every invocation gets some work done): stages pause and are called again.
    /// A stage that pauses three invocations in a row without a new checkpoint fails the run
    /// (resumed from the same checkpoint, it would pause in the same place for ever).
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
    /// or the error that ended it (fatal, cancelled, or retryable with the attempts spent) — or,
    /// class `Paused`, that it waits for a signal this host was not given
    /// ([`Trace::waiting`] names it).
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

    /// Runs the job's stages; a job that ends failed or cancelled then compensates, as the
    /// framework does: the undos of the stages it started, latest first
    /// ([`JobKind::undo`]), each retried on a retryable error within its policy's attempts.
    async fn drive(
        &self,
        kind: &dyn DynKind,
        params: &Value,
    ) -> (Result<Finished, KindError>, Trace) {
        let (outcome, mut durable) = self.drive_stages(kind, params).await;
        let ended = outcome.as_ref().err().is_some_and(|e| e.class != ErrorClass::Paused);
        if ended && durable.started {
            let undoable = kind.undo_stages(params);
            // The job's attempts, as its policy gives them (the framework's bound on an undo).
            let undo_attempts = kind.policy().max_attempts.max(1);
            let started = &kind.stages()[..=durable.stage_index];
            for stage in started.iter().rev().filter(|s| undoable.contains(s)) {
                let mut attempt = 0;
                let result = loop {
                    attempt += 1;
                    let undo = crate::registry::Undo {
                        stage: (*stage).to_owned(),
                        key: format!("job:undo:{stage}"),
                        attempt,
                    };
                    match kind.undo(&undo, params).await {
                        Err(e) if e.class == ErrorClass::Retryable && attempt < undo_attempts => {}
                        other => break other,
                    }
                };
                durable.trace.undos.push(UndoRun {
                    stage: (*stage).to_owned(),
                    attempts: attempt,
                    result,
                });
            }
        }
        (outcome, durable.trace)
    }

    async fn drive_stages(
        &self,
        kind: &dyn DynKind,
        params: &Value,
    ) -> (Result<Finished, KindError>, Durable) {
        let mut durable = Durable { attempt: 1, ..Durable::default() };
        durable.trace.attempts = 1;
        let inputs = match kind.check(params) {
            Ok(inputs) => inputs,
            Err(e) => return (Err(KindError::fatal(PublicMessage::domain(e))), durable),
        };
        let stages = kind.stages();
        // Invocations in a row that paused where the previous one left off.
        let mut stalled_pauses = 0;
        loop {
            durable.trace.invocations += 1;
            durable.started = true;
            let stage = stages[durable.stage_index];
            let before = (durable.stage_index, durable.checkpoint.clone());
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
            let outcome = kind.run_stage_in(&mut ctx, params, crate::ShardOrder::Scrambled).await;
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
                Ok(_) if cancelled => return (Err(KindError::cancelled()), durable),
                Ok(StageOutcome::Paused) => {
                    durable.trace.pauses += 1;
                    if before == (durable.stage_index, durable.checkpoint.clone()) {
                        stalled_pauses += 1;
                    } else {
                        stalled_pauses = 0;
                    }
                    if stalled_pauses >= STALLED_PAUSES {
                        return (Err(KindError::fatal(PublicMessage::fixed(NO_PROGRESS))), durable);
                    }
                }
                Ok(StageOutcome::StageDone) if durable.stage_index + 1 < stages.len() => {
                    durable.stage_index += 1;
                }
                Ok(StageOutcome::StageDone) => {
                    let error = KindError::fatal(PublicMessage::fixed(
                        "the last stage ended without a result",
                    ));
                    return (Err(error), durable);
                }
                Ok(StageOutcome::Finished(result)) => {
                    // This host stores every result: only another host keeps one inline.
                    let location = result.location().expect("this host stores every result");
                    let (name, attempt) = parse_result(location);
                    let (content_type, body) =
                        durable.files.get(location).cloned().expect("the result is stored");
                    let summary = result.summary().cloned();
                    let finished = Finished { name, content_type, body, attempt, summary };
                    return (Ok(finished), durable);
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
                // Parked waiting for a signal this host was not given: the job waits for ever.
                Err(e) if e.class == ErrorClass::Paused => {
                    durable.trace.waiting =
                        durable.trace.waits.last().map(|(name, _)| name.clone());
                    return (Err(e), durable);
                }
                Err(e) => return (Err(e), durable),
            }
            if durable.trace.invocations > 100_000 {
                let error = KindError::fatal(PublicMessage::fixed("the job never finished"));
                return (Err(error), durable);
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

mod context;

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

#[cfg(test)]
mod fan_out_tests;
#[cfg(test)]
mod tests;
