use super::*;
use crate::context::{Checkpoint, MIN_PART_SIZE};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Counts to `items`, checking the deadline before each item and — when `checkpoint` —
/// saving a checkpoint before it pauses; without one it can never get past the first
/// deadline of an invocation.
#[derive(Debug, Clone, Copy)]
struct Counter;

#[derive(Deserialize, schemars::JsonSchema)]
struct CounterParams {
    items: u64,
    checkpoint: bool,
    /// Also checkpoints whenever the cadence says one is due, noting how far apart.
    #[serde(default)]
    cadence: bool,
}

#[derive(Default, Serialize, Deserialize)]
struct Counted {
    done: u64,
    /// `done` at the last checkpoint.
    saved_at: u64,
    /// Items between each cadence checkpoint and the checkpoint before it.
    gaps: Vec<u64>,
}

impl Checkpoint for Counted {
    const VERSION: u32 = 1;
}

impl JobKind for Counter {
    const NAME: &'static str = "counter";
    type Params = CounterParams;

    fn stages(&self) -> &'static [&'static str] {
        &["count"]
    }

    fn validate(&self, _: &CounterParams) -> Result<(), String> {
        Ok(())
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CounterParams,
    ) -> Result<StageOutcome, KindError> {
        let mut state: Counted = ctx.resume().await?.unwrap_or_default();
        while state.done < params.items {
            if ctx.deadline_near() {
                if params.checkpoint {
                    state.saved_at = state.done;
                    ctx.checkpoint(&state, state.done, Some(params.items)).await?;
                }
                return Ok(StageOutcome::Paused);
            }
            state.done += 1;
            if params.cadence && ctx.checkpoint_due(state.done) {
                state.gaps.push(state.done - state.saved_at);
                state.saved_at = state.done;
                ctx.checkpoint(&state, state.done, Some(params.items)).await?;
            }
        }
        if params.cadence {
            let gaps = serde_json::to_vec(&state.gaps).expect("numbers serialise");
            let result = ctx.write_result("gaps.json", "application/json", gaps).await?;
            return Ok(StageOutcome::Finished(result));
        }
        let result = ctx
            .write_result("count.txt", "text/plain", state.done.to_string().into_bytes())
            .await?;
        Ok(StageOutcome::Finished(result))
    }
}

#[test]
fn a_stage_that_pauses_without_a_checkpoint_fails_instead_of_looping() {
    let host = Host::new().deadline_every(3);
    let (result, trace) = host.run_traced(&Counter, &json!({"items": 10, "checkpoint": false}));
    let error = result.expect_err("it can never finish");
    assert!(error.to_string().contains("without a new checkpoint"), "{error}");
    assert_eq!(trace.invocations, STALLED_PAUSES, "{trace:?}");
    // The same kind, checkpointing before it pauses, finishes over many invocations.
    let (result, trace) = host.run_traced(&Counter, &json!({"items": 10, "checkpoint": true}));
    assert_eq!(result.expect("it finishes").body, b"10");
    assert!(trace.invocations > 3, "{trace:?}");
}

#[test]
fn a_resumed_stage_counts_its_cadence_from_the_checkpoint_it_resumed() {
    // Every fifth item is due; each invocation pauses after eight items (a checkpoint).
    let host = Host::new().deadline_every(9).checkpoint_items(5);
    let params = json!({"items": 40, "checkpoint": true, "cadence": true});
    let (result, trace) = host.run_traced(&Counter, &params);
    let gaps: Vec<u64> = serde_json::from_slice(&result.expect("it finishes").body).unwrap();
    assert!(trace.pauses >= 3, "{trace:?}");
    assert!(!gaps.is_empty(), "some checkpoints fell due by the cadence");
    assert!(gaps.iter().all(|gap| *gap >= 5), "a resume forced a checkpoint early: {gaps:?}");
}

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
    let (finished, trace) = Host::new().new_attempt_after_checkpoint(2).run_traced(&Parts, &params);
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
    let result = block(ctx.complete_result_upload(&upload, &[big.clone(), last.clone()])).unwrap();
    assert_eq!(result.location(), Some("results/1/r.bin"));
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

#[test]
fn a_summary_is_at_most_its_limit() {
    let result = ResultRef::from_host("results/j/1/r.json".into());
    let small = result.clone().with_summary(json!({"rows": 3})).expect("a small summary");
    assert_eq!(small.summary(), Some(&json!({"rows": 3})));
    let big = "x".repeat(crate::MAX_SUMMARY_BYTES);
    let err = result.with_summary(json!({ "text": big })).expect_err("over the limit");
    assert_eq!(err.class, ErrorClass::Fatal);
}
