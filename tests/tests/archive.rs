//! The `archive` kind end to end on the local stack: uploads bundled into one ZIP written with
//! an S3 multipart upload, read back with a real ZIP reader; another principal's upload
//! refused at submit; and a stage crashed between two parts resumes without uploading its
//! finished parts again (counted at the edge: the stack's per-function count of
//! `s3:UploadPart` calls).

use longhaul_domain::JobId;
use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::time::Duration;

use longhaul_tests::{Api, Aws, Faults, Harness, harness_with, principal};
use serde_json::{Value, json};

const MIB: usize = 1024 * 1024;
const TIMEOUT: Duration = Duration::from_secs(90);

fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_PROGRESS_INTERVAL_MS", "100")])
}

/// The tests that count `UploadPart` calls run one at a time (the count is the stack's).
static PARTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

/// Three uploads, two of them with one file name: 8 MiB, 3 MiB and 1 KiB — three parts.
async fn three_uploads(api: &Api) -> (Vec<String>, Vec<(&'static str, Vec<u8>)>) {
    let files = vec![
        ("data.bin", bytes(8 * MIB, 1)),
        ("notes.csv", bytes(3 * MIB, 2)),
        ("data.bin", bytes(1024, 3)),
    ];
    let mut inputs = Vec::new();
    for (name, data) in &files {
        inputs.push(api.upload(name, "application/octet-stream", data.clone()).await);
    }
    let expected = vec![
        ("data.bin", files[0].1.clone()),
        ("notes.csv", files[1].1.clone()),
        ("data (2).bin", files[2].1.clone()),
    ];
    (inputs, expected)
}

/// Reads a ZIP with the `zip` crate: each entry's name and bytes (its CRC-32 checked).
fn unzip(body: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(Cursor::new(body)).expect("a ZIP archive");
    (0..archive.len())
        .map(|i| {
            let mut file = archive.by_index(i).unwrap();
            let mut data = Vec::new();
            file.read_to_end(&mut data).expect("read, its CRC-32 checked");
            (file.name().unwrap().into_owned(), data)
        })
        .collect()
}

fn assert_entries(body: &[u8], expected: &[(&str, Vec<u8>)]) {
    let entries = unzip(body);
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    let want: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, want);
    for ((name, got), (_, want)) in entries.iter().zip(expected) {
        assert!(got == want, "{name}: {} bytes, expected {}", got.len(), want.len());
    }
}

/// The stage function's `s3:UploadPart` calls so far.
async fn parts_uploaded(api: &Api) -> u64 {
    let calls: BTreeMap<String, BTreeMap<String, u64>> =
        serde_json::from_value(api.get("/_local/aws-calls/by-function").await.json).unwrap();
    calls.get("StageFunction").and_then(|c| c.get("s3:UploadPart")).copied().unwrap_or(0)
}

/// Runs an archive job of `inputs` under the fault plan `plan`: installs it, submits the job,
/// waits for its end and turns faults off. Answers the job's id, its end and what the plan
/// injected.
async fn archive_under(api: &Api, plan: Value, inputs: &[String]) -> (JobId, Value, Value) {
    let faults = Faults::install(&plan).await;
    let job_id = api.submit(&json!({"type": "archive", "params": {"inputs": inputs}})).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    (job_id, job, faults.clear().await)
}

#[tokio::test]
async fn uploads_are_bundled_into_one_zip_uploaded_in_parts() {
    stack();
    let _one_at_a_time = PARTS.lock().await;
    let api = Api::new(&principal("archive"));
    let (inputs, expected) = three_uploads(&api).await;
    let before = parts_uploaded(&api).await;
    let job_id = api
        .submit(&json!({"type": "archive", "params": {"inputs": inputs, "name": "bundle.zip"}}))
        .await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(
        job["progress"]["items_done"],
        json!(11 * MIB + 1024),
        "progress counts input bytes: {job}"
    );
    let body = api.result(&job_id).await;
    assert_entries(&body, &expected);
    assert_eq!(parts_uploaded(&api).await - before, 3, "5 MiB, 5 MiB and the rest");
}

#[tokio::test]
async fn another_principals_upload_is_refused_and_nothing_is_created() {
    stack();
    let (owner, intruder) = (principal("archive-owner"), principal("archive-intruder"));
    let theirs = Api::new(&owner).upload("secret.csv", "text/csv", b"a,b\n1,2\n".to_vec()).await;
    let api = Api::new(&intruder);
    let mine = api.upload("mine.csv", "text/csv", b"x\n".to_vec()).await;
    let reply = api
        .post_json("/jobs", &json!({"type": "archive", "params": {"inputs": [mine, theirs]}}))
        .await;
    assert!(matches!(reply.status, 404 | 422), "{}", reply.text);
    assert_eq!(reply.json["type"], "/problems/upload-not-found", "{}", reply.text);
    assert!(!reply.text.contains(owner.as_str()), "{}", reply.text);
    let jobs = api.get("/jobs").await;
    assert_eq!(jobs.json["jobs"], json!([]), "{}", jobs.text);
    assert!(
        Aws::new().await.items_of(&intruder).await.iter().all(|item| !item.contains_key("job_id")),
        "no job record"
    );
    // Bad params are the kind's 422s.
    for params in [json!({"inputs": []}), json!({"inputs": [mine], "name": "x.tar"})] {
        let reply = api.post_json("/jobs", &json!({"type": "archive", "params": params})).await;
        assert_eq!(reply.status, 422, "{}", reply.text);
        assert_eq!(reply.json["type"], "/problems/invalid-params", "{}", reply.text);
    }
}

#[tokio::test]
async fn a_stage_crashed_between_parts_does_not_upload_its_finished_parts_again() {
    stack();
    let _one_at_a_time = PARTS.lock().await;
    let api = Api::new(&principal("archive-crash"));
    let (inputs, expected) = three_uploads(&api).await;
    let before = parts_uploaded(&api).await;
    // The stage dies just before it uploads part 2: part 1 is uploaded and checkpointed.
    let plan = json!({"crash_functions": ["StageFunction"], "crash_before_call": 1.0, "max_crashes_per_job": 1,
        "crash_only": {"operation": "s3:UploadPart", "contains": "partNumber=2"}});
    let (job_id, job, injected) = archive_under(&api, plan, &inputs).await;
    assert_eq!(
        injected["injected"]["crash_sites"],
        json!({"StageFunction s3:UploadPart before": 1}),
        "{injected}"
    );
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_entries(&api.result(&job_id).await, &expected);
    // Parts 1, 2 and 3 once each: the resumed stage (the same attempt) went on from part 2.
    assert_eq!(job["attempt"], 1, "the crash was retried within the attempt: {job}");
    let calls = api.get("/_local/aws-calls/by-function").await.json;
    assert_eq!(
        parts_uploaded(&api).await - before,
        3,
        "a finished part was uploaded again: {job} {}",
        calls["StageFunction"]
    );
}

/// The stage dies right after S3 completed the result upload, before it heard so (a lost
/// answer). The retried invocation finds the upload gone and the object made of its parts:
/// the job succeeds in the same attempt, with the archive's three parts uploaded once — no
/// `Job.Fatal` for the missing upload, no rebuilding of the archive.
#[tokio::test]
async fn a_completion_whose_answer_was_lost_is_recognised_as_done() {
    stack();
    let _one_at_a_time = PARTS.lock().await;
    let api = Api::new(&principal("archive-lost-completion"));
    let (inputs, expected) = three_uploads(&api).await;
    let before = parts_uploaded(&api).await;
    let plan = json!({"crash_functions": ["StageFunction"], "crash_after_call": 1.0, "max_crashes_per_job": 1,
        "crash_only": {"operation": "s3:CompleteMultipartUpload", "contains": "uploadId"}});
    let (job_id, job, injected) = archive_under(&api, plan, &inputs).await;
    assert_eq!(
        injected["injected"]["crash_sites"],
        json!({"StageFunction s3:CompleteMultipartUpload after": 1}),
        "{injected}"
    );
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["attempt"], 1, "the crash was retried within the attempt: {job}");
    assert_entries(&api.result(&job_id).await, &expected);
    assert_eq!(parts_uploaded(&api).await - before, 3, "the archive was built again: {job}");
}

/// A retry of a cancelled archive job starts from the cancelled job's checkpoint, which names
/// that job's result upload — not one the retry may continue. The retry starts over and says
/// so: it does not claim `resumed_from`, and its archive is whole.
#[tokio::test]
async fn a_retry_that_cannot_use_the_checkpoint_does_not_claim_it_resumed() {
    stack();
    let _one_at_a_time = PARTS.lock().await;
    let api = Api::new(&principal("archive-retry"));
    let (inputs, expected) = three_uploads(&api).await;
    // The stage is frozen just before part 2 while the job is cancelled: it stops at its next
    // progress write, its checkpoint after part 1 kept for a retry. (A pause strikes only an
    // invocation known to hold the lease; the journal is what tells a claim's.)
    let faults = Faults::install(&json!({"pause_functions": ["StageFunction"],
        "pause_before_call": 1.0, "max_pauses": 1, "pause_ms": 5000, "journal": true,
        "pause_only": {"operation": "s3:UploadPart", "contains": "partNumber=2"}}))
    .await;
    let job_id = api.submit(&json!({"type": "archive", "params": {"inputs": inputs}})).await;
    faults.wait_paused(&api, &job_id).await;
    let cancel = api.send("DELETE", &format!("/jobs/{job_id}"), None, &[]).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    let cancelled = api.wait_terminal(&job_id, TIMEOUT).await;
    faults.clear().await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");

    let retry = api.send("POST", &format!("/jobs/{job_id}/retry"), None, &[]).await;
    assert_eq!(retry.status, 202, "{}", retry.text);
    let retry_id = retry.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let done = api.wait_terminal(&retry_id, TIMEOUT).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_entries(&api.result(&retry_id).await, &expected);
    assert!(done.get("resumed_from").is_none(), "a resume that did not happen: {done}");
}
