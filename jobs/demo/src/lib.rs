//! The `demo` job kind: one stage, `process`, extending a SHA-256 hash chain item by item with
//! a pause per item, and with failures and stalls injected on request — a diagnostic kind whose
//! result tells a correct run from a skipped, repeated or reordered one (see [`domain`]).

pub mod domain;

use std::time::Duration;

use longhaul_worker::{
    Checkpoint, JobKind, KindError, Policy, PublicMessage, Shard, ShardOutcome, ShardOutput,
    StageContext, StageOutcome, Undo, Waited,
};

pub use domain::{DemoParams, DemoResult, DemoState, FailKind, ItemRange};

/// The `demo` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Demo;

impl Checkpoint for DemoState {
    const VERSION: u32 = 1;
}

impl JobKind for Demo {
    const NAME: &'static str = "demo";
    type Params = DemoParams;

    fn stages(&self) -> &'static [&'static str] {
        &["process"]
    }

    fn validate(&self, params: &DemoParams) -> Result<(), String> {
        params.validate().map_err(|domain::SpecError::InvalidParams(message)| message)
    }

    fn policy(&self) -> Policy {
        Policy::default()
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &DemoParams,
    ) -> Result<StageOutcome, KindError> {
        process(ctx, params).await
    }

    fn fans_out(&self, _stage: &str, params: &DemoParams) -> bool {
        params.shards.is_some()
    }

    async fn split(
        &self,
        _ctx: &mut dyn StageContext,
        params: &DemoParams,
    ) -> Result<Vec<Shard>, KindError> {
        let ranges = (0..params.shards.unwrap_or(1)).map(|i| params.shard_range(i));
        ranges.map(|range| Shard::new(&range, range.end - range.start)).collect()
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        params: &DemoParams,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        process_shard(ctx, params, shard).await
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        params: &DemoParams,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        let digests: Vec<String> =
            outputs.iter().map(ShardOutput::get).collect::<Result<_, _>>()?;
        let result = DemoResult {
            items: params.items,
            shards: Some(digests.len() as u64),
            digest: domain::merged_digest(&digests),
            signals: Default::default(),
        };
        write_result(ctx, &result).await
    }

    fn undo_stages(&self, params: &DemoParams) -> Vec<&'static str> {
        if params.compensate { vec!["process"] } else { Vec::new() }
    }

    async fn undo(&self, undo: &Undo, params: &DemoParams) -> Result<(), KindError> {
        if params.compensate_fails {
            return Err(KindError::retryable(PublicMessage::domain(format!(
                "injected undo failure (attempt {})",
                undo.attempt
            ))));
        }
        // What a real undo would key its call by (a refund's idempotency key, say).
        tracing::info!(stage = undo.stage, key = undo.key, attempt = undo.attempt, "demo undo ran");
        Ok(())
    }
}

/// Runs the `process` stage (unsharded) until done, the deadline, or a failure.
async fn process(
    ctx: &mut dyn StageContext,
    params: &DemoParams,
) -> Result<StageOutcome, KindError> {
    let mut state: DemoState = ctx.resume().await?.unwrap_or_default();
    if chain(ctx, params, &mut state, 0..params.items).await? == Chained::Paused {
        return Ok(StageOutcome::Paused);
    }
    let result = DemoResult {
        items: state.next_item,
        shards: None,
        digest: state.digest.clone(),
        signals: state.signals.clone(),
    };
    write_result(ctx, &result).await
}

/// Runs one shard of a sharded `process` stage: the chain over its own items.
async fn process_shard(
    ctx: &mut dyn StageContext,
    params: &DemoParams,
    shard: &Shard,
) -> Result<ShardOutcome, KindError> {
    let range: ItemRange = shard.descriptor()?;
    let mut state: DemoState =
        ctx.resume().await?.unwrap_or_else(|| DemoState::starting_at(range.start));
    match chain(ctx, params, &mut state, range.start..range.end).await? {
        Chained::Paused => Ok(ShardOutcome::Paused),
        Chained::Done => Ok(ShardOutcome::Done(ShardOutput::new(&state.digest)?)),
    }
}

/// Whether [`chain`] got to the end of its items.
#[derive(Debug, PartialEq, Eq)]
enum Chained {
    Done,
    Paused,
}

/// Extends `state`'s chain over the items of `range` from `state.next_item`: progress counts
/// within the range. Paused: the deadline came and the state is checkpointed.
async fn chain(
    ctx: &mut dyn StageContext,
    params: &DemoParams,
    state: &mut DemoState,
    range: std::ops::Range<u64>,
) -> Result<Chained, KindError> {
    let total = Some(range.end - range.start);
    let done = |state: &DemoState| state.next_item - range.start;
    ctx.progress(done(state), total).await?;
    while state.next_item < range.end {
        if ctx.deadline_near() {
            ctx.checkpoint(state, done(state), total).await?;
            return Ok(Chained::Paused);
        }
        if let Some(kind) = params.injected_failure(state.next_item, ctx.attempt_failures()) {
            // Keep the work done so far, count the failure (fenced), then fail as asked.
            ctx.checkpoint(state, done(state), total).await?;
            ctx.count_failure().await?;
            let message = PublicMessage::domain(
                format!("injected {kind:?} failure at item {}", state.next_item).to_lowercase(),
            );
            return Err(match kind {
                FailKind::Transient => KindError::retryable(message),
                FailKind::Fatal => KindError::fatal(message),
            });
        }
        if let Some(wait) = params.wait_for.as_ref().filter(|w| w.at_item == state.next_item)
            && !state.signals.contains_key(&wait.signal)
        {
            // Where the resume starts (the wait parks the job until the signal comes).
            ctx.checkpoint(state, done(state), total).await?;
            let timeout = Duration::from_secs(wait.timeout_seconds);
            match ctx.wait_for(&wait.signal, timeout).await? {
                Waited::Signal(payload) => {
                    state.signals.insert(wait.signal.clone(), payload);
                }
                Waited::TimedOut => {
                    return Err(KindError::fatal(PublicMessage::domain(format!(
                        "waited {} s for signal {}; it did not come",
                        wait.timeout_seconds, wait.signal
                    ))));
                }
            }
        }
        if params.stall_at == Some(state.next_item) {
            tracing::info!(item = state.next_item, "stalling as asked");
            let stall = Duration::from_millis(params.stall_ms.unwrap_or(0));
            ctx.pause(stall, done(state), total).await?;
        }
        state.process_next();
        if params.item_ms > 0 {
            ctx.pause(Duration::from_millis(params.item_ms), done(state), total).await?;
        }
        // No checkpoint after the last item, whatever the cadence: the result (or the shard's
        // output), written next, is what keeps the work (a crash before it redoes the items
        // since the last checkpoint).
        let last = state.next_item == range.end;
        if !last && ctx.checkpoint_due(done(state)) {
            ctx.checkpoint(state, done(state), total).await?;
        } else {
            ctx.progress(done(state), total).await?;
        }
    }
    Ok(Chained::Done)
}

/// Stores `result` as the job's result.
async fn write_result(
    ctx: &mut dyn StageContext,
    result: &DemoResult,
) -> Result<StageOutcome, KindError> {
    let body = serde_json::to_vec(result).map_err(|e| {
        KindError::fatal(PublicMessage::fixed("the job's result could not be encoded")).because(e)
    })?;
    // Nothing is checkpointed after the result: once it is stored, a retry that finds the job
    // still running redoes at most the items since the last checkpoint, and the job's success
    // shows 100 % whatever the last progress write said. A job that ends before its first
    // checkpoint falls due writes none at all.
    let result = ctx.write_result("result.json", "application/json", body).await?;
    Ok(StageOutcome::Finished(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_worker::ErrorClass;
    use longhaul_worker::testing::{Host, assert_resumable};
    use proptest::prelude::*;
    use serde_json::json;

    fn expected(items: u64) -> Vec<u8> {
        serde_json::to_vec(&DemoResult::expected(items)).unwrap()
    }

    fn waiting(signal: &str) -> serde_json::Value {
        json!({"items": 6, "wait_for": {"signal": signal, "at_item": 3, "timeout_seconds": 60}})
    }

    #[test]
    fn a_wait_parks_the_job_until_its_signal_and_the_payload_goes_into_the_result() {
        // No signal: the job parks before item 3, its checkpoint saved there.
        let (parked, trace) = Host::new().run_traced(&Demo, &waiting("approval"));
        assert_eq!(parked.unwrap_err().class, ErrorClass::Paused);
        assert_eq!(trace.waiting.as_deref(), Some("approval"));
        assert_eq!(trace.checkpoints, 1, "the resume starts at the wait");
        // The signal sent (before the wait, or while it waits: the same to the stage).
        let host = Host::new().signal("approval", json!({"by": "ops"}));
        let finished = host.run(&Demo, &waiting("approval")).unwrap();
        let result: DemoResult = serde_json::from_slice(&finished.body).unwrap();
        assert_eq!((result.items, result.digest.clone()), (6, DemoResult::expected(6).digest));
        assert_eq!(result.signals["approval"], json!({"by": "ops"}));
        assert_resumable(&Demo, &host, &waiting("approval"));
    }

    #[test]
    fn a_wait_that_times_out_fails_the_job_saying_so() {
        let err = Host::new().time_out("approval").run(&Demo, &waiting("approval")).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert_eq!(err.public.to_string(), "waited 60 s for signal approval; it did not come");
    }

    #[test]
    fn bad_waits_are_refused() {
        for bad in [
            json!({"items": 6, "wait_for": {"signal": "a b", "at_item": 3, "timeout_seconds": 60}}),
            json!({"items": 6, "wait_for": {"signal": "ok", "at_item": 6, "timeout_seconds": 60}}),
            json!({"items": 6, "wait_for": {"signal": "ok", "at_item": 3, "timeout_seconds": 0}}),
            json!({"items": 6, "wait_for": {"signal": "ok", "at_item": 3}}),
        ] {
            assert!(Host::new().run(&Demo, &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn runs_to_the_expected_digest() {
        let finished = Host::new().run(&Demo, &json!({"items": 5, "item_ms": 1})).unwrap();
        assert_eq!((finished.name.as_str(), finished.body), ("result.json", expected(5)));
        assert_eq!(finished.content_type, "application/json");
    }

    #[test]
    fn no_checkpoint_is_written_that_nothing_could_resume_from() {
        // Done before its first checkpoint falls due (the default cadence: 1,000 items or
        // 60 s): none at all, not even after the result.
        let (finished, trace) = Host::new().run_traced(&Demo, &json!({"items": 100}));
        assert_eq!(finished.unwrap().body, expected(100));
        assert_eq!(trace.checkpoints, 0, "{trace:?}");
        // Every 5 items of 10: at item 5 only — not at the last item, nor after the result.
        let (finished, trace) =
            Host::new().checkpoint_items(5).run_traced(&Demo, &json!({"items": 10}));
        assert_eq!(finished.unwrap().body, expected(10));
        assert_eq!(trace.checkpoints, 1, "{trace:?}");
    }

    #[test]
    fn injected_failures_are_retried_then_pass_or_fail_the_job() {
        let params = json!({"items": 4, "fail_at": 2, "fail_times": 2});
        let (finished, trace) = Host::new().run_traced(&Demo, &params);
        assert_eq!(finished.unwrap().body, expected(4));
        assert_eq!(trace.retries, 2);
        let fatal = json!({"items": 4, "fail_at": 1, "fail_kind": "fatal"});
        let err = Host::new().run(&Demo, &fatal).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert_eq!(err.public.as_str(), "injected fatal failure at item 1");
    }

    #[test]
    fn a_cancellation_mid_stage_ends_the_run_with_a_final_checkpoint() {
        let (result, trace) =
            Host::new().cancel_after_writes(3).run_traced(&Demo, &json!({"items": 50}));
        let err = result.unwrap_err();
        assert!(err.is_cancelled(), "{err}");
        assert!(trace.final_checkpoint, "where it stopped is kept for a retry: {trace:?}");
    }

    #[test]
    fn invalid_params_never_run() {
        let err = Host::new().run(&Demo, &json!({"items": 0})).unwrap_err();
        assert_eq!(err.public.as_str(), "invalid params: items must be between 1 and 10000000");
    }

    #[test]
    fn compensate_gives_process_an_undo_that_compensate_fails_makes_fail_retryably() {
        let params = |v: serde_json::Value| -> DemoParams { serde_json::from_value(v).unwrap() };
        let undo = Undo { stage: "process".into(), key: "j:undo:process".into(), attempt: 2 };
        let run = |p: &DemoParams| futures::executor::block_on(Demo.undo(&undo, p));
        let plain = params(json!({"items": 1}));
        assert!(Demo.undo_stages(&plain).is_empty());
        let compensated = params(json!({"items": 1, "compensate": true}));
        assert_eq!(Demo.undo_stages(&compensated), ["process"]);
        assert_eq!(run(&compensated), Ok(()));
        let failing = params(json!({"items": 1, "compensate": true, "compensate_fails": true}));
        let err = run(&failing).unwrap_err();
        assert_eq!(err.class, ErrorClass::Retryable);
        assert_eq!(err.public.as_str(), "injected undo failure (attempt 2)");
        let alone = Host::new().run(&Demo, &json!({"items": 1, "compensate_fails": true}));
        assert_eq!(
            alone.unwrap_err().public.as_str(),
            "invalid params: compensate_fails needs compensate"
        );
    }

    #[test]
    fn a_failed_or_cancelled_run_undoes_process_and_a_failing_undo_is_given_up() {
        let failing = json!({"items": 5, "fail_at": 2, "fail_kind": "fatal", "compensate": true});
        let (result, trace) = Host::new().run_traced(&Demo, &failing);
        assert_eq!(result.unwrap_err().class, ErrorClass::Fatal);
        assert_eq!(trace.undos.len(), 1, "{trace:?}");
        assert_eq!((trace.undos[0].stage.as_str(), trace.undos[0].attempts), ("process", 1));
        assert_eq!(trace.undos[0].result, Ok(()));
        let cancelled = json!({"items": 5, "compensate": true, "compensate_fails": true});
        let (result, trace) = Host::new().cancel_after_writes(2).run_traced(&Demo, &cancelled);
        assert!(result.unwrap_err().is_cancelled());
        let undo = &trace.undos[0];
        assert_eq!(undo.attempts, 3, "retried within the policy's attempts: {trace:?}");
        assert_eq!(undo.result.as_ref().unwrap_err().class, ErrorClass::Retryable);
        let (result, trace) =
            Host::new().run_traced(&Demo, &json!({"items": 3, "compensate": true}));
        assert!(result.is_ok() && trace.undos.is_empty(), "a job that succeeds undoes nothing");
    }

    fn sharded(items: u64, shards: u64) -> Vec<u8> {
        serde_json::to_vec(&DemoResult::expected_sharded(items, shards)).unwrap()
    }

    #[test]
    fn a_sharded_run_digests_its_shards_digests_in_shard_order() {
        let params = json!({"items": 10, "shards": 3});
        let (finished, trace) = Host::new().run_traced(&Demo, &params);
        let body = finished.unwrap().body;
        assert_eq!(body, sharded(10, 3));
        let result: DemoResult = serde_json::from_slice(&body).unwrap();
        assert_eq!((result.items, result.shards), (10, Some(3)));
        // Shard i covers [i·10/3, (i+1)·10/3): 0..3, 3..6, 6..10, each from the initial digest.
        let shard = |start: u64, end: u64| {
            let mut state = DemoState::starting_at(start);
            (start..end).for_each(|_| state.process_next());
            state.digest
        };
        let digests = [shard(0, 3), shard(3, 6), shard(6, 10)];
        assert_eq!(result.digest, domain::merged_digest(&digests));
        assert_ne!(result.digest, DemoResult::expected(10).digest);
        assert_eq!(trace.checkpoints, 1, "none was due, but one keeps the outputs: {trace:?}");
        // More shards than items: the empty shards digest nothing.
        assert_eq!(
            Host::new().run(&Demo, &json!({"items": 2, "shards": 5})).unwrap().body,
            sharded(2, 5)
        );
    }

    #[test]
    fn a_transient_failure_fails_only_its_shard_and_the_done_shards_are_kept() {
        // Item 7 is in shard 2 of 3 (6..10); the scrambled order runs shard 1 first, and the
        // retry must not run it again.
        let params = json!({"items": 10, "shards": 3, "fail_at": 7, "fail_times": 2});
        let host = Host::new().checkpoint_items(1);
        let (finished, trace) = host.run_traced(&Demo, &params);
        assert_eq!(finished.unwrap().body, sharded(10, 3));
        assert_eq!(trace.retries, 2, "{trace:?}");
        let fatal = json!({"items": 10, "shards": 3, "fail_at": 7, "fail_kind": "fatal"});
        let err = Host::new().run(&Demo, &fatal).unwrap_err();
        assert_eq!(err.public.as_str(), "injected fatal failure at item 7");
    }

    #[test]
    fn a_cancelled_sharded_run_stops_with_a_final_checkpoint() {
        let params = json!({"items": 60, "shards": 4});
        let (result, trace) = Host::new().cancel_after_writes(5).run_traced(&Demo, &params);
        assert!(result.unwrap_err().is_cancelled());
        assert!(trace.final_checkpoint, "{trace:?}");
    }

    #[test]
    fn bad_shard_counts_are_refused() {
        for bad in [
            json!({"items": 10, "shards": 1}),
            json!({"items": 10, "shards": 1001}),
            json!({"items": 10, "shards": 2,
                   "wait_for": {"signal": "go", "at_item": 3, "timeout_seconds": 60}}),
        ] {
            let err = Host::new().run(&Demo, &bad).unwrap_err();
            assert!(err.public.as_str().starts_with("invalid params: "), "{bad}: {err}");
        }
        let most: DemoParams =
            serde_json::from_value(json!({"items": 10, "shards": 1000})).unwrap();
        assert_eq!(most.validate(), Ok(()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Crashed after any checkpoint (in any shard) and resumed, in the same attempt or a
        /// new one, a sharded run gives the same digest; shards done are not run again.
        #[test]
        fn a_sharded_run_resumed_after_any_checkpoint_gives_the_same_result(
            items in 1u64..40,
            shards in 2u64..7,
            every in 1u64..6,
            deadline in 2u32..8,
        ) {
            let host = Host::new().checkpoint_items(every).deadline_every(deadline);
            let params = json!({"items": items, "shards": shards});
            prop_assert_eq!(host.run(&Demo, &params).unwrap().body, sharded(items, shards));
            assert_resumable(&Demo, &host, &params);
        }

        /// Crashed right after any of its checkpoints and resumed, a run gives the same digest.
        #[test]
        fn a_run_resumed_after_any_checkpoint_gives_the_same_result(
            items in 1u64..40,
            every in 1u64..6,
            deadline in 2u32..8,
        ) {
            let host = Host::new().checkpoint_items(every).deadline_every(deadline);
            let params = json!({"items": items});
            prop_assert_eq!(host.run(&Demo, &params).unwrap().body, expected(items));
            assert_resumable(&Demo, &host, &params);
        }
    }
}
