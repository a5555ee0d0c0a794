//! A job kind defined outside the framework crates — here, in this test file — registered
//! beside the shipped ones and run end to end on the local stack: `GET /job-types` lists it
//! with its params schema, `POST /jobs` validates through it, and a job of it streams its
//! upload, checkpoints, carries its count to a second stage and writes its result. The same
//! kind is unit-tested with the in-memory host (`longhaul_worker::testing`), as
//! docs/job-types.md shows a kind's author doing.

use std::time::Duration;

use futures::StreamExt;
use longhaul_tests::kinds::{KindName, Sleeper};
use longhaul_tests::{Api, Faults, harness_with_registry, principal};
use longhaul_worker::{
    Cadence, Checkpoint, JobKind, KindError, Policy, PublicMessage, Registry, StageContext,
    StageOutcome,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The params of `word_count`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct WordCountParams {
    /// The text to count: an `input` from `POST /uploads`.
    input: String,
}

/// Where the `count` stage is: its checkpoint, and its output to the `write` stage.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Counted {
    /// Bytes of the input read so far (where a resumed stage reads on from).
    offset: u64,
    words: u64,
    lines: u64,
    /// Whether the last byte read was inside a word (a word may span two chunks).
    in_word: bool,
}

impl Checkpoint for Counted {
    const VERSION: u32 = 1;
}

impl Counted {
    fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            let space = byte.is_ascii_whitespace();
            if !space && !self.in_word {
                self.words += 1;
            }
            self.in_word = !space;
            self.lines += u64::from(byte == b'\n');
        }
        self.offset += chunk.len() as u64;
    }
}

/// A kind that tries to finish with another job's result: the stage function refuses a
/// `ResultRef` that is not the attempt's own, so no kind can point a job's result link (and its
/// presigned download) at someone else's object.
#[derive(Debug, Clone, Copy)]
struct Forger;

/// The params of `forger`: the job whose result it claims.
#[derive(Deserialize, schemars::JsonSchema)]
struct ForgerParams {
    victim: String,
}

impl JobKind for Forger {
    const NAME: &'static str = "forger";
    type Params = ForgerParams;

    fn stages(&self) -> &'static [&'static str] {
        &["forge"]
    }

    async fn run_stage(
        &self,
        _: &mut dyn StageContext,
        params: &ForgerParams,
    ) -> Result<StageOutcome, KindError> {
        let forged = format!("results/{}/1/report.json", params.victim);
        Ok(StageOutcome::Finished(longhaul_worker::ResultRef::from_host(forged)))
    }
}

/// `serial`: a kind for a downstream that takes one job at a time: its policy's
/// `concurrency_limit` is 1 (and its retry budget 5), so its jobs run one after another
/// whoever submits them. Its one stage works `millis`.
struct Serial;

impl KindName for Serial {
    const NAME: &'static str = "serial";
}

/// Two stages and nothing else: a stage boundary to aim a fault at (its second stage's name
/// is this kind's alone, so an aimed pause matches only its boundary write).
#[derive(Debug, Clone, Copy)]
struct TwoStep;

/// The params of `two_step`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TwoStepParams {}

impl JobKind for TwoStep {
    const NAME: &'static str = "two_step";
    type Params = TwoStepParams;

    fn stages(&self) -> &'static [&'static str] {
        &["first_step", "second_step"]
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        _: &TwoStepParams,
    ) -> Result<StageOutcome, KindError> {
        ctx.progress(1, Some(1)).await?;
        if ctx.stage() == "first_step" {
            return Ok(StageOutcome::StageDone);
        }
        let result = ctx.write_result("done.txt", "text/plain", b"done".to_vec()).await?;
        Ok(StageOutcome::Finished(result))
    }
}

/// Counts the words and lines of an upload, in two stages: `count` streams it, `write` writes
/// `{"words", "lines", "bytes"}`.
#[derive(Debug, Clone, Copy)]
struct WordCount;

impl JobKind for WordCount {
    const NAME: &'static str = "word_count";
    type Params = WordCountParams;

    fn stages(&self) -> &'static [&'static str] {
        &["count", "write"]
    }

    fn validate(&self, params: &WordCountParams) -> Result<(), String> {
        if params.input.trim().is_empty() {
            return Err("input must name an upload (the `input` POST /uploads answered)".into());
        }
        Ok(())
    }

    fn inputs(&self, params: &WordCountParams) -> Vec<String> {
        vec![params.input.clone()]
    }

    fn policy(&self) -> Policy {
        // Items are bytes: a checkpoint every MiB (or the default minute).
        Policy {
            checkpoint: Cadence { items: 1 << 20, ..Policy::default().checkpoint },
            ..Policy::default()
        }
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &WordCountParams,
    ) -> Result<StageOutcome, KindError> {
        match ctx.stage() {
            "count" => count(ctx, &params.input).await,
            _ => write(ctx).await,
        }
    }
}

async fn count(ctx: &mut dyn StageContext, input: &str) -> Result<StageOutcome, KindError> {
    let total = Some(ctx.input_size(input).await?);
    let mut state: Counted = ctx.resume().await?.unwrap_or_default();
    let mut stream = ctx.read_input(input, state.offset).await?;
    while let Some(chunk) = stream.next().await {
        state.feed(&chunk?);
        if ctx.deadline_near() {
            ctx.checkpoint(&state, state.offset, total).await?;
            return Ok(StageOutcome::Paused);
        }
        // An item is a byte here: `done` (and the cadence) count the same unit.
        if ctx.checkpoint_due(state.offset) {
            ctx.checkpoint(&state, state.offset, total).await?;
        } else {
            ctx.progress(state.offset, total).await?;
        }
    }
    // The stage's last checkpoint is what the `write` stage starts from.
    ctx.checkpoint(&state, state.offset, total).await?;
    Ok(StageOutcome::StageDone)
}

async fn write(ctx: &mut dyn StageContext) -> Result<StageOutcome, KindError> {
    let counted: Counted = ctx.carried("count").await?;
    let body = serde_json::to_vec(
        &json!({"words": counted.words, "lines": counted.lines, "bytes": counted.offset}),
    )
    .map_err(|e| {
        KindError::fatal(PublicMessage::fixed("the count could not be encoded")).because(e)
    })?;
    let result = ctx.write_result("counts.json", "application/json", body).await?;
    Ok(StageOutcome::Finished(result))
}

/// The shipped kinds plus `word_count`.
fn registry() -> Registry {
    Registry::builder()
        .kinds_of(&longhaul_jobs::registry())
        .kind(WordCount)
        .kind(Forger)
        .kind(Sleeper::<Serial>::new().concurrency_limit(1).max_attempts(5))
        .kind(TwoStep)
        .build()
        .expect("word_count's name is its own")
}

/// This binary's stack: its functions know `word_count`, and the deployment enables it.
fn api(label: &str) -> Api {
    harness_with_registry(
        registry(),
        &[("ENABLED_JOB_TYPES", "demo,csv_report,word_count,forger,serial,two_step")],
    );
    Api::new(&principal(label))
}

const TEXT: &str = "the quick brown fox\njumps over\n  the lazy dog\n";

#[test]
fn word_count_is_resumable_in_memory() {
    use longhaul_worker::testing::{Host, assert_resumable};
    let params = json!({"input": "text"});
    // Chunks of 3 bytes: words span chunks; a checkpoint every chunk, a deadline every few.
    let host = Host::new().input("text", TEXT.as_bytes().to_vec(), 3).checkpoint_items(1);
    let finished = host.run(&WordCount, &params).expect("the job succeeds");
    assert_eq!(finished.name, "counts.json");
    let counts: Value = serde_json::from_slice(&finished.body).unwrap();
    assert_eq!(counts, json!({"words": 9, "lines": 3, "bytes": TEXT.len()}));
    assert_resumable(&WordCount, &host.clone().deadline_every(3), &params);
    let cancelled = host.clone().cancel_after_writes(2).run(&WordCount, &params).unwrap_err();
    assert!(cancelled.is_cancelled(), "{cancelled}");
    let err = Host::new().run(&WordCount, &json!({"input": " "})).unwrap_err();
    assert!(err.public.as_str().contains("input must name an upload"), "{err}");
}

#[tokio::test]
async fn a_kind_defined_in_a_test_is_listed_with_its_params_schema() {
    let api = api("custom-list");
    let reply = api.get("/job-types").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    let kinds = reply.json["job_types"].as_array().expect("a list");
    let names: Vec<&str> = kinds.iter().filter_map(|k| k["type"].as_str()).collect();
    assert_eq!(names, ["demo", "csv_report", "word_count", "forger", "serial", "two_step"]);
    let kind = kinds.iter().find(|k| k["type"] == "word_count").unwrap();
    assert_eq!(kind["stages"], json!(["count", "write"]));
    assert_eq!(kind["policy"]["checkpoint"]["items"], 1 << 20);
    let schema = jsonschema::validator_for(&kind["params_schema"]).expect("a schema");
    assert!(schema.is_valid(&json!({"input": "uploads/x/y"})));
    assert!(!schema.is_valid(&json!({})));
    assert!(!schema.is_valid(&json!({"input": "uploads/x/y", "extra": 1})));
}

#[tokio::test]
async fn bad_params_of_a_custom_kind_are_422_with_its_message() {
    let api = api("custom-bad");
    let reply =
        api.post_json("/jobs", &json!({"type": "word_count", "params": {"input": ""}})).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    let detail = reply.json["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("input must name an upload"), "{}", reply.text);
    let reply = api.post_json("/jobs", &json!({"type": "word_count", "params": {}})).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert!(reply.text.contains("input"), "{}", reply.text);
}

#[tokio::test]
async fn a_custom_kind_runs_end_to_end_on_the_local_stack() {
    let api = api("custom-run");
    let input = api.upload("words.txt", "text/plain", TEXT.as_bytes().to_vec()).await;
    let job_id = api.submit(&json!({"type": "word_count", "params": {"input": input}})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let counts: Value = serde_json::from_slice(&api.result(&job_id).await).expect("JSON");
    assert_eq!(counts, json!({"words": 9, "lines": 3, "bytes": TEXT.len()}));
}

#[tokio::test]
async fn a_kind_cannot_finish_with_another_jobs_result() {
    let api = api("custom-forger");
    let victim = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    assert_eq!(api.wait_terminal(&victim, Duration::from_secs(60)).await["status"], "succeeded");
    let job_id = api.submit(&json!({"type": "forger", "params": {"victim": victim}})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(
        (job["status"].as_str(), job["error"]["code"].as_str()),
        (Some("failed"), Some("Job.Fatal")),
        "{job}"
    );
    assert_eq!(job["error"]["message"], "the job kind finished with a result that is not its own");
    assert_eq!(api.get(&format!("/jobs/{job_id}/result")).await.status, 409);
}

#[tokio::test]
async fn a_kinds_concurrency_limit_runs_its_jobs_one_at_a_time_across_tenants() {
    let apis: Vec<Api> = (0..3).map(|i| api(&format!("custom-serial-{i}"))).collect();
    let mut ids = Vec::new();
    for (i, api) in apis.iter().enumerate() {
        ids.push(api.submit(&json!({"type": "serial", "params": {"millis": 3000 + i}})).await);
    }
    // One runs; the others wait for the kind's slot (not their tenants', which are free), and
    // say so. (Which one runs first is the dispatcher's order; the slot may also be held by
    // another test's `serial` job for a moment.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let waiting = 'seen: loop {
        for (api, id) in apis.iter().zip(&ids) {
            let job = api.get(&format!("/jobs/{id}")).await.json;
            if job["waiting"]["reason"] == "kind_limit" {
                break 'seen job;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no serial job was seen waiting");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(waiting["waiting"]["limit"], 1, "{waiting}");
    let mut done = Vec::new();
    for (api, id) in apis.iter().zip(&ids) {
        let job = api.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(job["status"], "succeeded", "{job}");
        done.push(job);
    }
    let span = |j: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(j[field].as_str().unwrap()).unwrap()
    };
    for a in &done {
        for b in &done {
            if a["job_id"] != b["job_id"] {
                let overlap = span(a, "started_at") < span(b, "finished_at")
                    && span(b, "started_at") < span(a, "finished_at");
                assert!(!overlap, "two serial jobs ran at once: {a} / {b}");
            }
        }
    }
}

#[tokio::test]
async fn the_kinds_policy_is_stored_on_the_job() {
    let api = api("custom-policy");
    let id = api.submit(&json!({"type": "serial", "params": {"millis": 0}})).await;
    let aws = longhaul_tests::Aws::new().await;
    let item = aws
        .dynamodb
        .get_item()
        .table_name(longhaul_tests::harness().stack.resource("JobsTable"))
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(format!("JOB#{id}")))
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("JOB".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the job record");
    let record: longhaul_aws::jobs::JobRecord = serde_dynamo::from_item(item).unwrap();
    let policy = record.policy.expect("a policy on the record");
    assert_eq!((policy.max_attempts, policy.concurrency_limit), (5, Some(1)));
    assert_eq!(policy.worker, "StageFunction");
    api.wait_terminal(&id, Duration::from_secs(60)).await;
}

/// A cancel that lands while the stage boundary is being written: the boundary write is
/// refused (the progress record says "cancel requested"), and the job must end `cancelled` —
/// not `failed` with `Job.Cancelled` — counted once as cancelled.
#[tokio::test]
async fn a_cancel_at_a_stage_boundary_ends_the_job_cancelled() {
    let api = api("custom-boundary-cancel");
    // Hold the boundary write (the progress record moving to `second_step`) for 4 s. (Only
    // an invocation holding the job's lease pauses; the edge learns a claim's lease from its
    // journal of writes, hence `journal`.)
    let faults = Faults::install(&json!({"pause_functions": ["StageFunction"],
        "pause_before_call": 1.0, "pause_ms": 4000, "max_pauses": 1, "journal": true,
        "pause_only": {"operation": "dynamodb:PutItem", "contains": "second_step"}}))
    .await;
    let job_id = api.submit(&json!({"type": "two_step", "params": {}})).await;
    faults.wait_paused(&api, &job_id).await;
    let reply = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let job = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    faults.clear().await;
    assert_eq!(job["status"], "cancelled", "{job}");
    assert!(job.get("error").is_none(), "a cancellation is not a failure: {job}");
    longhaul_tests::assert_counted_once("JobsCancelled", &job_id).await;
}
