//! Multipart result uploads on the local stack, through the stage function's host: a kind
//! defined here (`big_result`) uploads its result in two parts (5 MiB, then a small last
//! part), keeping the upload and its parts in its checkpoint. A job's `GET /result` serves the
//! completed object; tries of one attempt continue the attempt's upload, while the next
//! attempt cannot — the framework aborts the earlier attempt's upload and the kind starts over.
//! Every call goes through the edge's IAM check of the template's roles (create, upload and
//! complete as `s3:PutObject`, `ListParts` as `s3:ListMultipartUploadParts`, the abort).

use std::time::Duration;

use longhaul_tests::{Api, Aws, harness, harness_with_registry, principal};
use longhaul_worker::{
    Checkpoint, JobKind, KindError, MIN_PART_SIZE, PublicMessage, Registry, ResultUpload,
    StageContext, StageOutcome, UploadedPart,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The params of `big_result`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct BigParams {
    /// An upload: the result is named after its file.
    input: String,
    /// Fail every try of the first attempt, once its first part is uploaded.
    #[serde(default)]
    fail_first_attempt: bool,
    /// The first part's size (default 5 MiB, S3's least for a part other than the last).
    #[serde(default)]
    first_part: Option<usize>,
}

/// Where the upload is, and how it went.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Uploading {
    upload: Option<ResultUpload>,
    parts: Vec<UploadedPart>,
    /// Uploads begun.
    begun: u32,
    /// Invocations that continued an upload they found in the checkpoint.
    continued: u32,
}

impl Checkpoint for Uploading {
    const VERSION: u32 = 1;
}

#[derive(Debug, Clone, Copy)]
struct BigResult;

impl JobKind for BigResult {
    const NAME: &'static str = "big_result";
    type Params = BigParams;

    fn stages(&self) -> &'static [&'static str] {
        &["write"]
    }

    fn validate(&self, _: &BigParams) -> Result<(), String> {
        Ok(())
    }

    fn inputs(&self, params: &BigParams) -> Vec<String> {
        vec![params.input.clone()]
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &BigParams,
    ) -> Result<StageOutcome, KindError> {
        let mut state: Uploading = ctx.resume().await?.unwrap_or_default();
        if let Some(upload) = state.upload.clone() {
            if ctx.can_continue(&upload).await? {
                state.continued += 1;
                ctx.checkpoint(&state, state.parts.len() as u64, Some(2)).await?;
            } else {
                state.upload = None;
                state.parts.clear();
            }
        }
        let upload = match state.upload.clone() {
            Some(upload) => upload,
            None => {
                let name = format!("{}.out", ctx.input_name(&params.input)?);
                let upload = ctx.begin_result_upload(&name, "application/octet-stream").await?;
                state.begun += 1;
                state.upload = Some(upload.clone());
                ctx.checkpoint(&state, 0, Some(2)).await?;
                upload
            }
        };
        if state.parts.is_empty() {
            let size = params.first_part.unwrap_or(MIN_PART_SIZE);
            state.parts.push(ctx.upload_part(&upload, 1, vec![b'a'; size]).await?);
            ctx.checkpoint(&state, 1, Some(2)).await?;
        }
        if params.fail_first_attempt && ctx.attempt() == 1 {
            return Err(KindError::retryable(PublicMessage::fixed("the first attempt fails")));
        }
        let tail =
            json!({"begun": state.begun, "continued": state.continued, "attempt": ctx.attempt()});
        let tail = serde_json::to_vec(&tail).expect("json");
        state.parts.push(ctx.upload_part(&upload, 2, tail).await?);
        let result = ctx.complete_result_upload(&upload, &state.parts).await?;
        Ok(StageOutcome::Finished(result))
    }
}

fn api(label: &str) -> Api {
    harness_with_registry(
        Registry::builder()
            .kinds_of(&longhaul_jobs::registry())
            .kind(BigResult)
            .build()
            .expect("big_result's name is its own"),
        &[("ENABLED_JOB_TYPES", "demo,csv_report,big_result")],
    );
    Api::new(&principal(label))
}

/// The multipart uploads still open under `prefix`.
async fn open_uploads(aws: &Aws, prefix: &str) -> Vec<String> {
    let listed = aws
        .s3
        .list_multipart_uploads()
        .bucket(harness().stack.resource("DataBucket"))
        .prefix(prefix)
        .send()
        .await
        .expect("list multipart uploads");
    listed.uploads().iter().filter_map(|u| u.key().map(str::to_owned)).collect()
}

/// The result's bytes: the first part, then the JSON of the last.
fn split(result: &[u8]) -> (&[u8], Value) {
    assert!(result.len() > MIN_PART_SIZE, "{} bytes", result.len());
    let (first, last) = result.split_at(MIN_PART_SIZE);
    (first, serde_json::from_slice(last).expect("the last part is JSON"))
}

#[tokio::test]
async fn a_two_part_upload_completes_into_the_result_get_result_serves() {
    let api = api("multipart");
    let input = api.upload("source.txt", "text/plain", b"hello".to_vec()).await;
    let job_id = api.submit(&json!({"type": "big_result", "params": {"input": input}})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(90)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let result = api.result(&job_id).await;
    let (first, last) = split(&result);
    assert!(first.iter().all(|b| *b == b'a'));
    assert_eq!(last, json!({"begun": 1, "continued": 0, "attempt": 1}));
    // Named after the input's file, under the attempt's own key; no upload left open.
    let aws = Aws::new().await;
    let prefix = format!("results/{job_id}/");
    assert_eq!(aws.keys(&prefix).await, [format!("{prefix}1/source.txt.out")]);
    assert!(open_uploads(&aws, &prefix).await.is_empty());
}

#[tokio::test]
async fn an_upload_of_attempt_1_is_continued_by_its_tries_but_not_by_attempt_2() {
    let api = api("multipart-attempts");
    let input = api.upload("data.csv", "text/csv", b"a,b\n".to_vec()).await;
    let params = json!({"input": input, "fail_first_attempt": true});
    let job_id = api.submit(&json!({"type": "big_result", "params": params})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(180)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 2, "{job}");
    let result = api.result(&job_id).await;
    let (_, last) = split(&result);
    // The first attempt's four later tries (the execution's that took its direct run over, and
    // its three retries within the attempt) continued its upload; the second attempt began
    // its own.
    assert_eq!(last, json!({"begun": 2, "continued": 4, "attempt": 2}));
    // The first attempt's upload was aborted: nothing of it is left open.
    let aws = Aws::new().await;
    let prefix = format!("results/{job_id}/");
    assert!(open_uploads(&aws, &prefix).await.is_empty(), "attempt 1's upload is aborted");
    assert_eq!(aws.keys(&prefix).await, [format!("{prefix}2/data.csv.out")]);
}

#[tokio::test]
async fn a_first_part_under_5_mib_fails_the_job_with_a_clear_reason() {
    let api = api("multipart-small");
    let input = api.upload("x.bin", "application/octet-stream", vec![1]).await;
    let params = json!({"input": input, "first_part": 1024});
    let job_id = api.submit(&json!({"type": "big_result", "params": params})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(90)).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "Job.Fatal", "{job}");
    let message = job["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("smaller than 5 MiB"), "{job}");
}
