//! Fanned-out stages ([`JobKind::fans_out`]): a stage that splits its work into shards
//! ([`JobKind::split`]), runs each shard on its own ([`JobKind::run_shard`]) and merges the
//! shards' outputs, in shard order, into the stage's outcome ([`JobKind::merge`]).
//!
//! Each shard has its own checkpoint and its own progress: a crash resumes the shard that was
//! running from its own checkpoint, and a shard done and kept (by the stage's next checkpoint,
//! always one before the merge) is not run again. The job's progress is the sum of its shards'
//! items ([`Shard::items`]).
//!
//! Today every host runs a fanned-out stage's shards one after another within the stage's
//! invocations ([`run_stage`]): the shards, the running shard's checkpoint, the outputs of the
//! shards done and the merge's own checkpoint live in the stage's checkpoint, so the stage
//! pauses, resumes, retries and is cancelled as any stage is, and the next stage reads the
//! merge's checkpoint as its input ([`stage_output`]). A kind written against this API never
//! sees how its shards are scheduled.
//!
//! [`JobKind::fans_out`]: crate::JobKind::fans_out
//! [`JobKind::split`]: crate::JobKind::split
//! [`JobKind::run_shard`]: crate::JobKind::run_shard
//! [`JobKind::merge`]: crate::JobKind::merge

use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::{
    ByteStream, ResultRef, ResultUpload, StageContext, StageOutcome, StagedFile, UploadedPart,
    Waited,
};
use crate::message::{ErrorClass, KindError, PublicMessage};
use crate::registry::JobKind;

/// Most shards one stage may split into.
pub const MAX_SHARDS: usize = 10_000;

/// Largest shard descriptor ([`Shard::new`]) or shard output ([`ShardOutput::new`]),
/// serialised: a shard is described by a reference to its work (a byte range, a list of
/// input names, a frame range) and hands the merge a reference to what it made (a staged
/// file, a few aggregates) — never the data itself.
pub const MAX_SHARD_BYTES: usize = 1024;

/// One shard of a fanned-out stage: the kind's description of its part of the work, and how
/// many items its progress counts to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shard {
    descriptor: Value,
    items: u64,
    /// Set by [`Shard::whole`]: the stage runs plain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    whole: bool,
}

impl Shard {
    /// A shard described by `descriptor` (any serde value of at most [`MAX_SHARD_BYTES`]
    /// serialised: a larger one is a fatal error, a bug of the kind), whose progress counts
    /// to `items` (the job's progress bar sums its shards').
    pub fn new(descriptor: &impl Serialize, items: u64) -> Result<Shard, KindError> {
        Ok(Shard { descriptor: small_value(descriptor, "shard descriptor")?, items, whole: false })
    }

    /// The whole stage, not worth fanning out this time (a small input, say): a split that
    /// answers `vec![Shard::whole()]` runs the stage plain, as [`JobKind::run_stage`] —
    /// no shard, no map, no merge, nothing to pay for them. Every later invocation of the
    /// stage runs it plain too (it is split once). A kind whose stage fans out only
    /// sometimes writes both paths.
    ///
    /// [`JobKind::run_stage`]: crate::JobKind::run_stage
    pub fn whole() -> Shard {
        Shard { descriptor: Value::Null, items: 0, whole: true }
    }

    /// The descriptor, as the type it was made from.
    pub fn descriptor<T: DeserializeOwned>(&self) -> Result<T, KindError> {
        serde_json::from_value(self.descriptor.clone()).map_err(|e| {
            KindError::fatal(PublicMessage::fixed("a shard of the job is unreadable")).because(e)
        })
    }

    /// How many items the shard's progress counts to.
    pub fn items(&self) -> u64 {
        self.items
    }
}

/// What a finished shard hands the merge ([`ShardOutcome::Done`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardOutput(Value);

impl ShardOutput {
    /// An output of `value` (at most [`MAX_SHARD_BYTES`] serialised: a larger one is a fatal
    /// error — stage a file with [`StageContext::stage_file`], hand over the [`StagedFile`],
    /// and read it in the merge with [`StageContext::read_staged`]).
    pub fn new(value: &impl Serialize) -> Result<ShardOutput, KindError> {
        Ok(ShardOutput(small_value(value, "shard output")?))
    }

    /// The output, as the type it was made from.
    pub fn get<T: DeserializeOwned>(&self) -> Result<T, KindError> {
        serde_json::from_value(self.0.clone()).map_err(|e| {
            KindError::fatal(PublicMessage::fixed("a shard's output is unreadable")).because(e)
        })
    }
}

fn small_value(value: &impl Serialize, what: &str) -> Result<Value, KindError> {
    let value = serde_json::to_value(value).map_err(|e| {
        KindError::fatal(PublicMessage::fixed("a shard of the job does not serialise"))
            .because(format!("the {what}: {e}"))
    })?;
    let size = value.to_string().len();
    if size > MAX_SHARD_BYTES {
        return Err(KindError::fatal(PublicMessage::fixed(
            "a shard of the job is larger than the framework allows",
        ))
        .because(format!("a {what} of {size} bytes; at most {MAX_SHARD_BYTES}")));
    }
    Ok(value)
}

/// How a fanned-out stage's shards stand, as the job's view shows them
/// (`progress.shards`). The host is told them with [`StageContext::record_shards`] as they
/// change; a kind has no reason to call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ShardCounts {
    /// Shards the stage split into.
    pub total: u64,
    /// Shards not started yet.
    pub pending: u64,
    /// Shards started and not done (one at most while they run inline).
    pub running: u64,
    /// Shards done, their output kept for the merge.
    pub succeeded: u64,
    /// Shards that failed fatally (the stage fails with them).
    pub failed: u64,
    /// Shard runs started: a shard's first, and each start again after a crash or a
    /// failure (a run the deadline paused and the next invocation continues is the same
    /// run), so `attempts − total` is about how many runs were retried. Counted in the stage's
    /// checkpoint: a run that crashed before the shard's first checkpoint is started again
    /// uncounted.
    pub attempts: u64,
}

/// How a shard's invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardOutcome {
    /// The deadline is near and the shard's state is checkpointed: run the shard again.
    Paused,
    /// The shard is done; its output goes to the merge.
    Done(ShardOutput),
}

/// The order a host runs a fanned-out stage's shards in. A kind must not depend on it: the
/// merge always gets the outputs in shard order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardOrder {
    /// Shard 0 first.
    #[default]
    Index,
    /// A fixed permutation that is far from the index order (test hosts use it, to catch a
    /// kind whose shards depend on each other).
    Scrambled,
}

impl ShardOrder {
    fn permutation(self, shards: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..shards).collect();
        if self == ShardOrder::Scrambled {
            // Odd indexes from the last down, then even ones from the first up.
            order.sort_by_key(|&i| if i % 2 == 1 { (0, shards - i) } else { (1, i) });
        }
        order
    }
}

/// The reserved checkpoint version of a fanned-out stage's own checkpoint: kinds' versions
/// are small numbers. A host asked for it when the stage's checkpoint is of another version
/// is being asked whether the stage fans out at all (a stage split into [`Shard::whole`]
/// keeps the kind's own checkpoints): not a mismatch to log or restart for.
pub const FAN_OUT_VERSION: u32 = u32::MAX;

/// Where a fanned-out stage is, kept as the stage's checkpoint.
#[derive(Debug, Default, Serialize, Deserialize)]
struct FanOutState {
    /// The shards the stage split into when it started.
    shards: Vec<Shard>,
    /// Each shard's output, once it is done (in shard order).
    outputs: Vec<Option<ShardOutput>>,
    /// The shard that saved a checkpoint and is not done yet, with that checkpoint.
    running: Option<RunningShard>,
    /// What the merge saved as the stage's checkpoint: the next stage's input
    /// ([`stage_output`] hands it over), and where a merge run again resumes.
    #[serde(default)]
    merged: Option<SavedState>,
    /// Shard runs started ([`ShardCounts::attempts`]).
    #[serde(default)]
    attempts: u64,
    /// Set when a host runs the shards each in its own invocation ([`run_distributed`]): the
    /// shards and their outputs are then the host's, not kept here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    distributed: Option<DistributedShards>,
}

/// A fanned-out stage whose shards a host runs each in its own invocation: where it put
/// them, how many, and the items they count to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistributedShards {
    /// What the host answered when it was handed the shards ([`ShardHost::dispatch`]): where
    /// their invocations read them.
    pub manifest: String,
    /// How many shards.
    pub shards: usize,
    /// Their items, summed.
    pub items: u64,
}

/// A host that runs each shard of a fanned-out stage in its own invocation (the stage
/// function's, under a Step Functions Distributed Map): [`run_distributed`] hands it the
/// shards once, then asks how they stand each time the stage runs again.
pub trait ShardHost: Send {
    /// Stores `shards` (in shard order) where their invocations read them; answers where
    /// (kept with the stage's checkpoint).
    fn dispatch<'a>(&'a mut self, shards: &'a [Shard]) -> BoxFuture<'a, Result<String, KindError>>;
    /// How the stage's `shards` dispatched shards stand: a shard that failed fatally is that
    /// error.
    fn collect(&mut self, shards: usize) -> BoxFuture<'_, Result<Collected, KindError>>;
}

/// How a distributed stage's shards stand ([`ShardHost::collect`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Collected {
    /// Not all of them are done.
    Unfinished,
    /// All are done: their outputs, in shard order.
    Done(Vec<ShardOutput>),
}

/// Where a distributed fanned-out stage is after [`run_distributed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Distributed {
    /// Its shards are dispatched (now, or before) and not all done: the host runs them.
    Running(DistributedShards),
    /// Every shard was done and the merge ended so.
    Merged(StageOutcome),
    /// The stage split into [`Shard::whole`] and ran plain, ending so.
    Plain(StageOutcome),
}

/// A checkpoint a kind saved: its schema version and state.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedState {
    version: u32,
    state: Value,
}

/// What the previous stage `version`'s checkpoint (schema `version`, `state`) hands the next
/// stage: the checkpoint itself, or — for a fanned-out stage's own checkpoint — what its merge
/// saved (`None`: it saved nothing). Hosts read a stage's output through this
/// ([`StageContext::carried_raw`]).
pub fn stage_output(version: u32, state: Value) -> Result<Option<(u32, Value)>, KindError> {
    if version != FAN_OUT_VERSION {
        return Ok(Some((version, state)));
    }
    let fanned: FanOutState = serde_json::from_value(state).map_err(unreadable)?;
    Ok(fanned.merged.map(|m| (m.version, m.state)))
}

#[derive(Debug, Serialize, Deserialize)]
struct RunningShard {
    index: usize,
    version: u32,
    state: Value,
    done: u64,
    /// Whether the shard saved it with the deadline near (to pause): the next invocation
    /// continues the same run. Otherwise a run that starts from it follows a crash or a
    /// failure, and is another attempt.
    #[serde(default)]
    yielded: bool,
}

impl FanOutState {
    /// Items done: every finished shard's, and the running shard's as of its checkpoint.
    fn done(&self, shards: &[Shard]) -> u64 {
        let finished: u64 = self
            .outputs
            .iter()
            .zip(shards)
            .filter(|(output, _)| output.is_some())
            .map(|(_, shard)| shard.items)
            .fold(0, u64::saturating_add);
        finished.saturating_add(self.running.as_ref().map_or(0, |r| r.done))
    }

    /// The shards' counts, with a shard running or not, and one failed or not.
    fn counts(&self, running: bool, failed: bool) -> ShardCounts {
        let total = self.shards.len() as u64;
        let succeeded = self.outputs.iter().filter(|o| o.is_some()).count() as u64;
        let (running, failed) = (u64::from(running && !failed), u64::from(failed));
        ShardCounts {
            total,
            pending: total.saturating_sub(succeeded + running + failed),
            running,
            succeeded,
            failed,
            attempts: self.attempts,
        }
    }
}

fn unreadable(err: impl std::fmt::Display) -> KindError {
    KindError::fatal(PublicMessage::fixed("a checkpoint of the job is unreadable")).because(err)
}

/// Runs stage `ctx.stage()` of `kind`: a stage that fans out ([`JobKind::fans_out`]) is split
/// when it starts, its shards run in `order`, one after another, each from its own
/// checkpoint, then merged; any other stage runs as [`JobKind::run_stage`].
pub async fn run_stage<K: JobKind>(
    kind: &K,
    ctx: &mut dyn StageContext,
    params: &K::Params,
    order: ShardOrder,
) -> Result<StageOutcome, KindError> {
    if !kind.fans_out(ctx.stage(), params) {
        return kind.run_stage(ctx, params).await;
    }
    // A fanned-out stage's own checkpoint is always a `FanOutState` (also one a retried job
    // starts from, which a host may not count as this job's own).
    let saved = ctx.load_checkpoint_raw(FAN_OUT_VERSION).await?;
    let mut state = match saved {
        Some(saved) => serde_json::from_value::<FanOutState>(saved).map_err(unreadable)?,
        // A checkpoint of the kind's own: the stage split into the whole and runs plain.
        None if ctx.has_own_checkpoint() => return kind.run_stage(ctx, params).await,
        None => {
            let Split::Shards(shards) = split_checked(kind, ctx, params).await? else {
                return kind.run_stage(ctx, params).await;
            };
            FanOutState {
                outputs: vec![None; shards.len()],
                shards,
                running: None,
                merged: None,
                attempts: 0,
                distributed: None,
            }
        }
    };
    if state.distributed.is_some() {
        return Err(unreadable("the stage's shards run in their own invocations, not here"));
    }
    if state.outputs.len() != state.shards.len() {
        return Err(unreadable(format!(
            "{} outputs for {} shards",
            state.outputs.len(),
            state.shards.len()
        )));
    }
    let shards = state.shards.clone();
    ctx.record_shards(state.counts(state.running.is_some(), false)).await?;
    let total: u64 = shards.iter().map(|s| s.items).fold(0, u64::saturating_add);
    // Whether a shard ran since the stage's checkpoint was last saved.
    let mut unsaved = false;
    let mut order = order.permutation(shards.len());
    // The shard that was running goes on first: its checkpoint is the stage's.
    if let Some(running) = &state.running {
        order.retain(|&i| i != running.index);
        order.insert(0, running.index);
    }
    for index in order {
        if state.outputs.get(index).is_none_or(Option::is_some) {
            continue;
        }
        let finished_items = state.done(&shards) - state.running.as_ref().map_or(0, |r| r.done);
        unsaved = true;
        // A run the deadline paused goes on; any other start is another attempt.
        if !state.running.as_ref().is_some_and(|r| r.index == index && r.yielded) {
            state.attempts += 1;
        }
        ctx.record_shards(state.counts(true, false)).await?;
        let outcome = {
            let mut shard_ctx = ShardContext {
                inner: &mut *ctx,
                state: &mut state,
                index,
                items: shards[index].items,
                finished_items,
                total,
            };
            kind.run_shard(&mut shard_ctx, params, &shards[index]).await
        };
        match outcome {
            Ok(ShardOutcome::Paused) => return Ok(StageOutcome::Paused),
            Ok(ShardOutcome::Done(output)) => {
                state.outputs[index] = Some(output);
                state.running = None;
                ctx.record_shards(state.counts(false, false)).await?;
            }
            Err(err) if err.class == ErrorClass::Fatal => {
                // The host records the failed shard before the stage fails with it.
                ctx.record_shards(state.counts(false, true)).await?;
                return Err(err);
            }
            Err(err) => return Err(err),
        }
        let left = state.outputs.iter().any(Option::is_none);
        let done = state.done(&shards);
        if left && (ctx.deadline_near() || ctx.checkpoint_due(done)) {
            save(ctx, &state, done, total).await?;
            unsaved = false;
            if ctx.deadline_near() {
                return Ok(StageOutcome::Paused);
            }
        }
    }
    // Every output is kept before the merge runs: a merge that pauses, fails or dies is run
    // again from the same outputs, never after the shards ran again.
    let done = state.done(&shards);
    if unsaved && state.merged.is_none() {
        save(ctx, &state, done, total).await?;
        if ctx.deadline_near() {
            return Ok(StageOutcome::Paused);
        }
    }
    let outputs: Vec<ShardOutput> = state.outputs.iter().flatten().cloned().collect();
    let mut merge_ctx = MergeContext { inner: ctx, state: &mut state, done, total };
    kind.merge(&mut merge_ctx, params, &outputs).await
}

/// What a stage split into.
enum Split {
    /// [`Shard::whole`]: the stage runs plain.
    Whole,
    /// Shards to fan out.
    Shards(Vec<Shard>),
}

/// `split`, with its answer checked: 1 to [`MAX_SHARDS`] shards, or the whole alone.
async fn split_checked<K: JobKind>(
    kind: &K,
    ctx: &mut dyn StageContext,
    params: &K::Params,
) -> Result<Split, KindError> {
    let shards = kind.split(ctx, params).await?;
    if shards.iter().any(|s| s.whole) {
        if shards.len() == 1 {
            return Ok(Split::Whole);
        }
        return Err(KindError::fatal(PublicMessage::fixed("the job's stage split inconsistently"))
            .because(format!("Shard::whole among {} shards; it must be alone", shards.len())));
    }
    if shards.is_empty() {
        return Err(KindError::fatal(PublicMessage::fixed("the job's stage split into no shards"))
            .because(format!("split answered none; 1 to {MAX_SHARDS}")));
    }
    if shards.len() > MAX_SHARDS {
        return Err(KindError::fatal(PublicMessage::fixed(
            "the job's stage split into more shards than the framework allows",
        ))
        .because(format!("{} shards; 1 to {MAX_SHARDS}", shards.len())));
    }
    Ok(Split::Shards(shards))
}

/// Runs stage `ctx.stage()` of `kind`, which fans out, with its shards run by `host`, each in
/// its own invocation ([`JobKind::run_shard`], over the host's shard context): when the stage starts, it is split and the shards
/// handed to the host, and the stage's checkpoint says so; each time it runs again, the host
/// is asked how they stand, and once all are done their outputs are merged (the merge
/// checkpointing inside the stage's checkpoint, as inline).
pub async fn run_distributed<K: JobKind>(
    kind: &K,
    ctx: &mut dyn StageContext,
    params: &K::Params,
    host: &mut dyn ShardHost,
) -> Result<Distributed, KindError> {
    let saved = ctx.load_checkpoint_raw(FAN_OUT_VERSION).await?;
    let saved = saved.map(serde_json::from_value::<FanOutState>).transpose().map_err(unreadable)?;
    let mut state = match saved {
        Some(state) => state,
        // A checkpoint of the kind's own: the stage split into the whole and runs plain.
        None if ctx.has_own_checkpoint() => {
            return Ok(Distributed::Plain(kind.run_stage(ctx, params).await?));
        }
        None => {
            let Split::Shards(shards) = split_checked(kind, ctx, params).await? else {
                return Ok(Distributed::Plain(kind.run_stage(ctx, params).await?));
            };
            let manifest = host.dispatch(&shards).await?;
            let items = shards.iter().map(|s| s.items).fold(0, u64::saturating_add);
            let distributed = DistributedShards { manifest, shards: shards.len(), items };
            let state =
                FanOutState { distributed: Some(distributed.clone()), ..FanOutState::default() };
            let total = shards.len() as u64;
            ctx.record_shards(ShardCounts { total, pending: total, ..ShardCounts::default() })
                .await?;
            save(ctx, &state, 0, items).await?;
            return Ok(Distributed::Running(distributed));
        }
    };
    let Some(distributed) = state.distributed.clone() else {
        return Err(unreadable("the stage's shards ran inline, and cannot be run apart"));
    };
    let outputs = match host.collect(distributed.shards).await? {
        Collected::Unfinished => return Ok(Distributed::Running(distributed)),
        Collected::Done(outputs) if outputs.len() == distributed.shards => outputs,
        Collected::Done(outputs) => {
            return Err(unreadable(format!(
                "{} outputs for {} shards",
                outputs.len(),
                distributed.shards
            )));
        }
    };
    let (done, total) = (distributed.items, distributed.items);
    let mut merge_ctx = MergeContext { inner: ctx, state: &mut state, done, total };
    Ok(Distributed::Merged(kind.merge(&mut merge_ctx, params, &outputs).await?))
}

async fn save(
    ctx: &mut dyn StageContext,
    state: &FanOutState,
    done: u64,
    total: u64,
) -> Result<(), KindError> {
    let value = serde_json::to_value(state).map_err(unreadable)?;
    ctx.save_checkpoint_raw(FAN_OUT_VERSION, value, done, Some(total)).await
}

/// What a shard sees: the stage's context, with its own checkpoint and its progress counted
/// into the stage's. It cannot write the job's result (the merge does) nor wait for a signal.
struct ShardContext<'a> {
    inner: &'a mut dyn StageContext,
    state: &'a mut FanOutState,
    index: usize,
    /// The shard's items ([`Shard::items`]): what its progress counts to.
    items: u64,
    /// Items of the shards done before this one ran.
    finished_items: u64,
    total: u64,
}

impl ShardContext<'_> {
    /// The stage's items done when the shard has done `done` of its own (at most its items,
    /// so that one shard's count never spills into another's).
    fn stage_done(&self, done: u64) -> u64 {
        self.finished_items.saturating_add(done.min(self.items))
    }

    fn refused<T: Send + 'static>(what: &'static str) -> BoxFuture<'static, Result<T, KindError>> {
        async move { Err(KindError::fatal(PublicMessage::fixed(what))) }.boxed()
    }
}

/// Why a shard cannot wait for a signal (what a shard's context answers `wait_for`).
pub const SHARD_WAIT: &str =
    "a shard cannot wait for a signal: wait before the stage splits, or after it";

/// Why a shard or a merge cannot read the previous stage's output: once the stage saved its
/// first checkpoint, that output is no longer kept.
pub const NOT_CARRIED: &str = "a shard or a merge cannot read the previous stage's output: split \
    reads it, and puts what the shards need in their descriptors";

pub const SHARD_RESULT: &str =
    "a shard cannot write the job's result: it hands the merge an output, and the merge writes it";

impl StageContext for ShardContext<'_> {
    fn stage(&self) -> &str {
        self.inner.stage()
    }

    fn attempt(&self) -> u32 {
        self.inner.attempt()
    }

    fn progress(&mut self, done: u64, _total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>> {
        let done = self.stage_done(done);
        self.inner.progress(done, Some(self.total))
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let done = done.min(self.items);
        let yielded = self.inner.deadline_near();
        self.state.running =
            Some(RunningShard { index: self.index, version, state, done, yielded });
        let stage_done = self.stage_done(done);
        let total = self.total;
        async move { save(&mut *self.inner, &*self.state, stage_done, total).await }.boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        let own = self
            .state
            .running
            .as_ref()
            .filter(|r| r.index == self.index && r.version == version)
            .map(|r| r.state.clone());
        async move { Ok(own) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        self.state.running.as_ref().is_some_and(|r| r.index == self.index)
    }

    fn carried_raw(
        &mut self,
        _from_stage: &str,
        _version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        Self::refused(NOT_CARRIED)
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
        let name = format!("shard{}-{name}", self.index);
        let content_type = content_type.to_owned();
        async move { self.inner.stage_file(&name, &content_type, body).await }.boxed()
    }

    fn write_result(
        &mut self,
        _name: &str,
        _content_type: &str,
        _body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn begin_result_upload(
        &mut self,
        _name: &str,
        _content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn can_continue(&mut self, _upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn upload_part(
        &mut self,
        _upload: &ResultUpload,
        _number: u32,
        _body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn complete_result_upload(
        &mut self,
        _upload: &ResultUpload,
        _parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.inner.input_name(input)
    }

    fn publish(&mut self, _staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        Self::refused(SHARD_RESULT)
    }

    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let done = self.stage_done(done);
        self.inner.pause(duration, done, Some(self.total))
    }

    fn deadline_near(&self) -> bool {
        self.inner.deadline_near()
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        self.inner.checkpoint_due(self.stage_done(items))
    }

    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }

    fn wait_for(
        &mut self,
        _name: &str,
        _timeout: Duration,
    ) -> BoxFuture<'_, Result<Waited, KindError>> {
        Self::refused(SHARD_WAIT)
    }

    fn attempt_failures(&self) -> u32 {
        self.inner.attempt_failures()
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.count_failure()
    }

    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        self.inner.read_staged(staged)
    }

    fn record_shards(&mut self, _counts: ShardCounts) -> BoxFuture<'_, Result<(), KindError>> {
        // The framework counts the stage's shards; a shard or a merge has none of its own.
        async { Ok(()) }.boxed()
    }
}

/// What a merge sees: the stage's context, its checkpoint kept inside the fan-out's (so a
/// merge run again resumes from it, and the next stage gets it as this stage's output), the
/// stage's progress at its end.
struct MergeContext<'a> {
    inner: &'a mut dyn StageContext,
    state: &'a mut FanOutState,
    done: u64,
    total: u64,
}

impl StageContext for MergeContext<'_> {
    fn stage(&self) -> &str {
        self.inner.stage()
    }

    fn attempt(&self) -> u32 {
        self.inner.attempt()
    }

    fn progress(
        &mut self,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.progress(self.done, Some(self.total))
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        self.state.merged = Some(SavedState { version, state });
        let (done, total) = (self.done, self.total);
        async move { save(&mut *self.inner, &*self.state, done, total).await }.boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        let own =
            self.state.merged.as_ref().filter(|m| m.version == version).map(|m| m.state.clone());
        async move { Ok(own) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        self.state.merged.is_some()
    }

    fn carried_raw(
        &mut self,
        _from_stage: &str,
        _version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        ShardContext::refused(NOT_CARRIED)
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
        self.inner.stage_file(name, content_type, body)
    }

    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.write_result(name, content_type, body)
    }

    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        self.inner.begin_result_upload(name, content_type)
    }

    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        self.inner.can_continue(upload)
    }

    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        self.inner.upload_part(upload, number, body)
    }

    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.complete_result_upload(upload, parts)
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.inner.input_name(input)
    }

    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.publish(staged)
    }

    fn pause(
        &mut self,
        duration: Duration,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.pause(duration, self.done, Some(self.total))
    }

    fn deadline_near(&self) -> bool {
        self.inner.deadline_near()
    }

    fn checkpoint_due(&self, _items: u64) -> bool {
        self.inner.checkpoint_due(self.done)
    }

    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }

    fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Waited, KindError>> {
        self.inner.wait_for(name, timeout)
    }

    fn attempt_failures(&self) -> u32 {
        self.inner.attempt_failures()
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.count_failure()
    }

    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        self.inner.read_staged(staged)
    }

    fn record_shards(&mut self, _counts: ShardCounts) -> BoxFuture<'_, Result<(), KindError>> {
        // The framework counts the stage's shards; a shard or a merge has none of its own.
        async { Ok(()) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrambled_order_is_a_permutation_far_from_the_index_order() {
        for n in [1, 2, 3, 10, 11] {
            let mut order = ShardOrder::Scrambled.permutation(n);
            if n > 2 {
                assert_ne!(order[0], 0, "{order:?}");
                assert_ne!(order, (0..n).rev().collect::<Vec<_>>(), "not just reversed");
            }
            order.sort();
            assert_eq!(order, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(ShardOrder::Index.permutation(3), [0, 1, 2]);
    }

    #[test]
    fn descriptors_and_outputs_are_small_typed_values() {
        let shard = Shard::new(&(3u64, 9u64), 6).unwrap();
        assert_eq!(shard.descriptor::<(u64, u64)>().unwrap(), (3, 9));
        assert_eq!(shard.items(), 6);
        assert!(shard.descriptor::<String>().is_err());
        let big = "x".repeat(MAX_SHARD_BYTES);
        assert!(Shard::new(&big, 1).is_err());
        assert!(ShardOutput::new(&big).is_err());
        assert_eq!(ShardOutput::new(&"ab").unwrap().get::<String>().unwrap(), "ab");
    }
}
