//! The in-memory host runs fanned-out stages as the framework does: shards out of index
//! order, each from its own checkpoint, the done ones never again, merged in shard order.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::*;
use crate::context::Checkpoint;
use crate::fan_out::{Shard, ShardCounts, ShardOutcome, ShardOutput};

/// Two stages: `split` fans out into `shards` shards of `per_shard` items each (shard `i`'s
/// output is `i` and its item count), checkpointing every item; `sum` reads what `split`
/// carried over. Every shard invocation is logged with the item it started at.
#[derive(Clone, Default)]
struct Squares {
    log: Arc<Mutex<Vec<(usize, u64)>>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct SquaresParams {
    shards: usize,
    per_shard: u64,
}

#[derive(Default, Serialize, Deserialize)]
struct Counted {
    done: u64,
}

impl Checkpoint for Counted {
    const VERSION: u32 = 1;
}

#[derive(Serialize, Deserialize)]
struct Merged {
    outputs: Vec<(usize, u64)>,
}

impl Checkpoint for Merged {
    const VERSION: u32 = 1;
}

impl JobKind for Squares {
    const NAME: &'static str = "squares";
    type Params = SquaresParams;

    fn stages(&self) -> &'static [&'static str] {
        &["split", "sum"]
    }

    fn fans_out(&self, stage: &str, _params: &SquaresParams) -> bool {
        stage == "split"
    }

    async fn split(
        &self,
        _ctx: &mut dyn StageContext,
        params: &SquaresParams,
    ) -> Result<Vec<Shard>, KindError> {
        (0..params.shards).map(|i| Shard::new(&i, params.per_shard)).collect()
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        params: &SquaresParams,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        let index: usize = shard.descriptor()?;
        let mut state: Counted = ctx.resume().await?.unwrap_or_default();
        self.log.lock().unwrap().push((index, state.done));
        while state.done < params.per_shard {
            if ctx.deadline_near() {
                ctx.checkpoint(&state, state.done, None).await?;
                return Ok(ShardOutcome::Paused);
            }
            state.done += 1;
            ctx.checkpoint(&state, state.done, None).await?;
        }
        Ok(ShardOutcome::Done(ShardOutput::new(&(index, state.done))?))
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        _params: &SquaresParams,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        let outputs = outputs.iter().map(ShardOutput::get).collect::<Result<_, _>>()?;
        ctx.checkpoint(&Merged { outputs }, 0, None).await?;
        Ok(StageOutcome::StageDone)
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        _params: &SquaresParams,
    ) -> Result<StageOutcome, KindError> {
        let merged: Merged = ctx.carried("split").await?;
        let body = serde_json::to_vec(&merged.outputs).unwrap();
        Ok(StageOutcome::Finished(ctx.write_result("sums.json", "application/json", body).await?))
    }
}

fn params(shards: usize, per_shard: u64) -> Value {
    json!({"shards": shards, "per_shard": per_shard})
}

/// What a correct run's result is: every shard's output, in shard order.
fn merged(shards: usize, per_shard: u64) -> Vec<u8> {
    serde_json::to_vec(&(0..shards).map(|i| (i, per_shard)).collect::<Vec<_>>()).unwrap()
}

#[test]
fn shards_run_out_of_order_and_merge_in_shard_order() {
    let kind = Squares::default();
    let finished = Host::new().run(&kind, &params(5, 2)).unwrap();
    assert_eq!(finished.body, merged(5, 2));
    let log = kind.log.lock().unwrap().clone();
    let order: Vec<usize> = log.iter().map(|(i, _)| *i).collect();
    assert_ne!(order, [0, 1, 2, 3, 4], "the host scrambles the order");
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, [0, 1, 2, 3, 4], "each shard ran once: {log:?}");
}

#[test]
fn a_crash_resumes_the_running_shard_from_its_checkpoint_and_never_reruns_a_done_one() {
    // 3 shards of 3 items, a checkpoint per item: the 5th is the second shard's (in run
    // order) second.
    let kind = Squares::default();
    let finished = Host::new().crash_after_checkpoint(5).run(&kind, &params(3, 3)).unwrap();
    assert_eq!(finished.body, merged(3, 3));
    let log = kind.log.lock().unwrap().clone();
    assert_eq!(log.len(), 4, "three shards and one resume: {log:?}");
    let crashed = log[1].0;
    assert_eq!(log[2], (crashed, 2), "the crashed shard resumed at its checkpoint: {log:?}");
    let starts: Vec<usize> = log.iter().filter(|(_, at)| *at == 0).map(|(i, _)| *i).collect();
    assert_eq!(starts.len(), 3, "no shard started twice: {log:?}");
}

/// The host is told how the shards stand as they change: from all pending to all
/// succeeded, each count adding up to the total; a crash's resume is another attempt, a
/// deadline's is not.
#[test]
fn the_host_is_told_how_the_shards_stand() {
    let counts = |host: Host| {
        let (finished, trace) = host.run_traced(&Squares::default(), &params(3, 3));
        assert_eq!(finished.unwrap().body, merged(3, 3));
        trace.shards
    };
    let plain = counts(Host::new());
    let first = ShardCounts { total: 3, pending: 3, ..ShardCounts::default() };
    assert_eq!(plain.first(), Some(&first));
    let last = ShardCounts { total: 3, succeeded: 3, attempts: 3, ..ShardCounts::default() };
    assert_eq!(plain.last(), Some(&last));
    for c in &plain {
        assert_eq!(c.pending + c.running + c.succeeded + c.failed, c.total, "{plain:?}");
        assert!(c.running <= 1, "inline: one at a time");
    }
    assert!(plain.windows(2).all(|w| w[0].succeeded <= w[1].succeeded), "{plain:?}");
    // The crash lands in the second shard run, after its first item's checkpoint: resumed
    // from it, that is a second attempt.
    let crashed = counts(Host::new().crash_after_checkpoint(5));
    assert_eq!(crashed.last(), Some(&ShardCounts { attempts: 4, ..last }), "{crashed:?}");
    // Paused at every deadline and continued: the same runs.
    let paced = counts(Host::new().deadline_every(2));
    assert_eq!(paced.last(), Some(&last), "{paced:?}");
}

#[test]
fn a_fanned_out_stage_survives_any_crash_and_deadlines() {
    let kind = Squares::default();
    assert_resumable(&kind, &Host::new(), &params(4, 3));
    let paced = Host::new().deadline_every(3);
    assert_eq!(paced.run(&kind, &params(4, 5)).unwrap().body, merged(4, 5));
    assert_resumable(&kind, &paced, &params(3, 4));
}

#[test]
fn a_shard_cannot_write_the_result_nor_wait() {
    #[derive(Clone)]
    struct Rogue(bool);
    impl JobKind for Rogue {
        const NAME: &'static str = "rogue";
        type Params = Value;
        fn stages(&self) -> &'static [&'static str] {
            &["only"]
        }
        fn fans_out(&self, _: &str, _: &Value) -> bool {
            true
        }
        async fn split(
            &self,
            _: &mut dyn StageContext,
            _: &Value,
        ) -> Result<Vec<Shard>, KindError> {
            Ok(vec![Shard::new(&0, 1)?])
        }
        async fn run_shard(
            &self,
            ctx: &mut dyn StageContext,
            _: &Value,
            _: &Shard,
        ) -> Result<ShardOutcome, KindError> {
            if self.0 {
                ctx.write_result("r.json", "application/json", vec![]).await?;
            } else {
                ctx.wait_for("go", std::time::Duration::from_secs(1)).await?;
            }
            Ok(ShardOutcome::Done(ShardOutput::new(&())?))
        }
        async fn run_stage(
            &self,
            _: &mut dyn StageContext,
            _: &Value,
        ) -> Result<StageOutcome, KindError> {
            unreachable!("the stage fans out")
        }
    }
    let err = Host::new().run(&Rogue(true), &json!({})).unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(err.public.as_str().starts_with("a shard cannot write the job's result"), "{err}");
    let err = Host::new().run(&Rogue(false), &json!({})).unwrap_err();
    assert!(err.public.as_str().starts_with("a shard cannot wait"), "{err}");
}

#[test]
fn a_crash_after_the_merge_saved_its_output_runs_no_shard_again() {
    let kind = Squares::default();
    let (finished, trace) = Host::new().run_traced(&kind, &params(3, 2));
    assert_eq!(finished.unwrap().body, merged(3, 2));
    let runs = kind.log.lock().unwrap().len();
    assert_eq!(runs, 3);
    // The merge's checkpoint is the run's last (`sum` saves none); the one before it keeps
    // every shard's output.
    for n in [trace.checkpoints, trace.checkpoints - 1] {
        let kind = Squares::default();
        let resumed = Host::new().crash_after_checkpoint(n).run(&kind, &params(3, 2)).unwrap();
        assert_eq!(resumed.body, merged(3, 2), "crashed after checkpoint {n}");
        assert_eq!(kind.log.lock().unwrap().len(), 3, "no shard ran again after checkpoint {n}");
    }
}

#[test]
fn neither_a_shard_nor_a_merge_reads_the_previous_stages_output() {
    #[derive(Clone)]
    struct Reader(bool);
    impl JobKind for Reader {
        const NAME: &'static str = "reader";
        type Params = Value;
        fn stages(&self) -> &'static [&'static str] {
            &["first", "second"]
        }
        fn fans_out(&self, stage: &str, _: &Value) -> bool {
            stage == "second"
        }
        async fn split(
            &self,
            ctx: &mut dyn StageContext,
            _: &Value,
        ) -> Result<Vec<Shard>, KindError> {
            let n: Counted = ctx.carried("first").await?; // split may
            Ok(vec![Shard::new(&n.done, 1)?])
        }
        async fn run_shard(
            &self,
            ctx: &mut dyn StageContext,
            _: &Value,
            _: &Shard,
        ) -> Result<ShardOutcome, KindError> {
            if self.0 {
                ctx.carried::<Counted>("first").await?;
            }
            Ok(ShardOutcome::Done(ShardOutput::new(&())?))
        }
        async fn merge(
            &self,
            ctx: &mut dyn StageContext,
            _: &Value,
            _: &[ShardOutput],
        ) -> Result<StageOutcome, KindError> {
            ctx.carried::<Counted>("first").await?;
            unreachable!("the merge cannot read it")
        }
        async fn run_stage(
            &self,
            ctx: &mut dyn StageContext,
            _: &Value,
        ) -> Result<StageOutcome, KindError> {
            ctx.checkpoint(&Counted { done: 7 }, 1, Some(1)).await?;
            Ok(StageOutcome::StageDone)
        }
    }
    for in_shard in [true, false] {
        let err = Host::new().run(&Reader(in_shard), &json!({})).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert!(err.public.as_str().starts_with("a shard or a merge cannot read"), "{err}");
    }
}

/// Shards whose outputs are too large for a [`ShardOutput`]: each stages a file and hands the
/// merge the [`crate::StagedFile`]; the merge reads them back ([`StageContext::read_staged`]).
#[derive(Clone, Default)]
struct Parts;

impl JobKind for Parts {
    const NAME: &'static str = "parts";
    type Params = Value;

    fn stages(&self) -> &'static [&'static str] {
        &["count"]
    }

    fn fans_out(&self, _: &str, _: &Value) -> bool {
        true
    }

    async fn split(
        &self,
        _ctx: &mut dyn StageContext,
        _params: &Value,
    ) -> Result<Vec<Shard>, KindError> {
        (0..3u32).map(|i| Shard::new(&i, 1)).collect()
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        _params: &Value,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        let index: u32 = shard.descriptor()?;
        let body = format!("shard {index}\n").repeat(200).into_bytes();
        let staged = ctx.stage_file("part.txt", "text/plain", body).await?;
        Ok(ShardOutcome::Done(ShardOutput::new(&staged)?))
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        _params: &Value,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        let mut body = Vec::new();
        for output in outputs {
            body.extend(ctx.read_staged(&output.get::<crate::StagedFile>()?).await?);
        }
        Ok(StageOutcome::Finished(ctx.write_result("all.txt", "text/plain", body).await?))
    }

    async fn run_stage(
        &self,
        _ctx: &mut dyn StageContext,
        _params: &Value,
    ) -> Result<StageOutcome, KindError> {
        unreachable!("the stage fans out")
    }
}

#[test]
fn a_merge_reads_the_files_its_shards_staged_in_shard_order() {
    let expected: Vec<u8> =
        (0..3).map(|i| format!("shard {i}\n").repeat(200)).collect::<String>().into_bytes();
    let finished = Host::new().run(&Parts, &json!({})).unwrap();
    assert!(expected.len() > 3 * crate::MAX_SHARD_BYTES, "larger than outputs may be");
    assert_eq!(finished.body, expected);
    assert_resumable(&Parts, &Host::new(), &json!({}));
}

/// Fans out only when `items` exceeds `per_shard`: a smaller job splits into the whole and
/// runs plain (`run_stage`, checkpointing every item), never as a shard.
#[derive(Clone, Default)]
struct Sometimes {
    shard_runs: Arc<Mutex<u32>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct SometimesParams {
    items: u64,
    per_shard: u64,
    /// Answer the whole among other shards (a kind's bug).
    #[serde(default)]
    mixed: bool,
}

impl JobKind for Sometimes {
    const NAME: &'static str = "sometimes";
    type Params = SometimesParams;

    fn stages(&self) -> &'static [&'static str] {
        &["count"]
    }

    fn fans_out(&self, _: &str, _: &SometimesParams) -> bool {
        true
    }

    async fn split(
        &self,
        _: &mut dyn StageContext,
        params: &SometimesParams,
    ) -> Result<Vec<Shard>, KindError> {
        if params.mixed {
            return Ok(vec![Shard::whole(), Shard::new(&1, 1)?]);
        }
        if params.items <= params.per_shard {
            return Ok(vec![Shard::whole()]);
        }
        let shards = params.items.div_ceil(params.per_shard);
        (0..shards).map(|i| Shard::new(&i, params.per_shard)).collect()
    }

    async fn run_shard(
        &self,
        _: &mut dyn StageContext,
        _: &SometimesParams,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        *self.shard_runs.lock().unwrap() += 1;
        Ok(ShardOutcome::Done(ShardOutput::new(&shard.items())?))
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        _: &SometimesParams,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        let items: Vec<u64> = outputs.iter().map(ShardOutput::get).collect::<Result<_, _>>()?;
        let body = format!("sharded {}", items.iter().sum::<u64>()).into_bytes();
        Ok(StageOutcome::Finished(ctx.write_result("n.txt", "text/plain", body).await?))
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &SometimesParams,
    ) -> Result<StageOutcome, KindError> {
        let mut state: Counted = ctx.resume().await?.unwrap_or_default();
        while state.done < params.items {
            if ctx.deadline_near() {
                ctx.checkpoint(&state, state.done, Some(params.items)).await?;
                return Ok(StageOutcome::Paused);
            }
            state.done += 1;
            ctx.checkpoint(&state, state.done, Some(params.items)).await?;
        }
        let body = format!("plain {}", state.done).into_bytes();
        Ok(StageOutcome::Finished(ctx.write_result("n.txt", "text/plain", body).await?))
    }
}

#[test]
fn a_stage_split_into_the_whole_runs_plain_through_crashes_and_deadlines() {
    let kind = Sometimes::default();
    let small = json!({"items": 4, "per_shard": 4});
    let (finished, trace) = Host::new().run_traced(&kind, &small);
    assert_eq!(finished.unwrap().body, b"plain 4");
    assert!(trace.shards.is_empty(), "no shard counts: {:?}", trace.shards);
    assert_eq!(trace.checkpoints, 4, "the kind's own checkpoints, no fan-out state");
    assert_resumable(&kind, &Host::new(), &small);
    assert_resumable(&kind, &Host::new().deadline_every(1), &small);
    assert_eq!(*kind.shard_runs.lock().unwrap(), 0, "no shard ever ran");
    let large = json!({"items": 5, "per_shard": 2});
    assert_eq!(Host::new().run(&kind, &large).unwrap().body, b"sharded 6");
    assert_eq!(*kind.shard_runs.lock().unwrap(), 3);
    let err = Host::new().run(&kind, &json!({"items": 1, "per_shard": 1, "mixed": true}));
    let err = err.unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert_eq!(err.public.as_str(), "the job's stage split inconsistently");
}
