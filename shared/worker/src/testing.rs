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
//!
//! ```
//! # use longhaul_worker::testing::{Host, assert_resumable};
//! # fn check<K: longhaul_worker::JobKind + Clone>(kind: K) {
//! let params = serde_json::json!({"n": 10});
//! let finished = Host::new().run(&kind, &params).expect("the job succeeds");
//! assert_resumable(&kind, &Host::new(), &params);
//! # }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use serde_json::Value;

use crate::context::{ByteStream, ResultRef, StageContext, StageOutcome, StagedFile};
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
}

/// An in-memory host: the job's inputs and how the run is disturbed.
#[derive(Debug, Clone)]
pub struct Host {
    owner_inputs: HashMap<String, (Vec<u8>, usize)>,
    deadline_every: Option<u32>,
    crash_after_checkpoint: Option<u32>,
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
    writes: u32,
    trace: Trace,
}

impl Host {
    /// A host with no inputs and no disturbance.
    pub fn new() -> Self {
        Host {
            owner_inputs: HashMap::new(),
            deadline_every: None,
            crash_after_checkpoint: None,
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
            };
            let outcome = kind.run_stage(&mut ctx, params).await;
            let (crashed, cancelled) = (ctx.crashed, ctx.cancelled);
            match outcome {
                _ if crashed => {
                    durable.trace.crashes += 1;
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
                Err(e)
                    if e.class == ErrorClass::Retryable && durable.attempt < self.max_attempts =>
                {
                    // The state machine retries the stage; the durable state stays.
                    durable.trace.retries += 1;
                    durable.attempt += 1;
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

fn parse_result(location: &str) -> (String, u32) {
    let rest = location.strip_prefix("results/").unwrap_or(location);
    let (attempt, name) = rest.split_once('/').unwrap_or(("0", rest));
    (name.to_owned(), attempt.parse().unwrap_or(0))
}

/// Runs `kind`'s job with `params` on `host` straight through, then once more for each of its
/// checkpoints, crashed right after that checkpoint and resumed; panics unless every run
/// produces the same result bytes.
pub fn assert_resumable<K: JobKind + Clone>(kind: &K, host: &Host, params: &Value) {
    let (baseline, trace) = host.run_traced(kind, params);
    let baseline = baseline.unwrap_or_else(|e| panic!("the uninterrupted run failed: {e}"));
    for n in 1..=trace.checkpoints {
        let (resumed, trace) = host.clone().crash_after_checkpoint(n).run_traced(kind, params);
        let resumed = resumed.unwrap_or_else(|e| panic!("crashed after checkpoint {n}: {e}"));
        assert_eq!(trace.crashes, 1, "the run crashed after checkpoint {n}");
        assert_eq!(
            (resumed.name.as_str(), resumed.body.as_slice()),
            (baseline.name.as_str(), baseline.body.as_slice()),
            "crashed after checkpoint {n} of {}, the result differs",
            trace.checkpoints
        );
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
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if plain {
        Ok(name.to_owned())
    } else {
        Err(KindError::fatal(PublicMessage::fixed("the job kind named an invalid result file")))
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
            if self.host.crash_after_checkpoint == Some(self.durable.trace.checkpoints) {
                self.crashed = true;
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
