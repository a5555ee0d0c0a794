//! The `csv_report` job end to end: upload, submit, scan → render → publish, download.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_tests::csvgen::{Gen, csv_bytes, expected, rows_match};
use longhaul_tests::{Api, Aws, principal};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);

fn report_params(input: &str, format: &str) -> Value {
    json!({"type": "csv_report", "params": {
        "input": input,
        "group_by": ["region", "product"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "min", "column": "amount"},
                    {"op": "max", "column": "amount"}, {"op": "mean", "column": "amount"}],
        "format": format,
    }})
}

/// `report` is the one an independent computation over `rows` gives: its row count, invalid
/// cells and every group's figures (sums and means within a relative 1e-9).
fn assert_report_of(report: &Value, rows: &[longhaul_tests::csvgen::Row]) {
    assert_eq!(report["rows_scanned"], rows.len());
    let (rows_expected, invalid) = expected(rows);
    assert_eq!(report["invalid"], json!({"amount": invalid}));
    let actual = report["rows"].as_array().unwrap();
    assert_eq!(actual.len(), rows_expected.len());
    for (a, e) in actual.iter().zip(&rows_expected) {
        assert!(rows_match(a, e), "row {a} ≠ expected {e}");
    }
}

#[tokio::test]
async fn a_report_equals_an_independent_computation() {
    let api = Api::new(&principal("report"));
    let rows = Gen::new(7).rows(5_000);
    let input = api.upload("sales.csv", "text/csv", csv_bytes(&rows)).await;
    let job_id = api.submit(&report_params(&input, "json")).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["stages_total"], 3);
    // The kind's summary beside the result, recorded with the success.
    assert_eq!(job["summary"]["rows_scanned"], 5_000, "{job}");
    assert_eq!(job["progress"]["unit"], "bytes", "its kind counts the input's bytes");
    // All three stages in one invocation: a direct run, no execution, nothing billed per stage.
    assert!(!Aws::new().await.execution_exists(&job_id).await, "no execution");

    let report: Value = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    assert_eq!(
        report["columns"],
        json!([
            "region",
            "product",
            "count",
            "sum(amount)",
            "min(amount)",
            "max(amount)",
            "mean(amount)"
        ])
    );
    assert_report_of(&report, &rows);
}

#[tokio::test]
async fn the_csv_format_has_the_same_columns_and_rows() {
    let api = Api::new(&principal("report-csv"));
    let rows = Gen::new(11).rows(500);
    let input = api.upload("s.csv", "text/csv", csv_bytes(&rows)).await;
    let job_id = api.submit(&report_params(&input, "csv")).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    let body = api.result(&job_id).await;
    let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(body.as_slice());
    let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_owned).collect();
    assert_eq!(
        header,
        ["region", "product", "count", "sum(amount)", "min(amount)", "max(amount)", "mean(amount)"]
    );
    let (rows_expected, _) = expected(&rows);
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(records.len(), rows_expected.len());
    for (record, e) in records.iter().zip(&rows_expected) {
        assert_eq!(record.get(0), e[0].as_str());
        assert_eq!(record.get(1), e[1].as_str());
        assert_eq!(record.get(2).unwrap().parse::<u64>().unwrap(), e[2].as_u64().unwrap());
    }
}

#[tokio::test]
async fn a_missing_column_or_a_file_that_is_not_csv_fails_without_retries() {
    let api = Api::new(&principal("report-bad"));
    let input = api.upload("s.csv", "text/csv", b"region,amount\neu,3\n".to_vec()).await;
    let mut params = report_params(&input, "json");
    params["params"]["group_by"] = json!(["country"]);
    let job_id = api.submit(&params).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "Job.Fatal");
    assert!(job["error"]["message"].as_str().unwrap().contains("country"), "{job}");
    // Recorded by the direct run itself: no retry loop, no execution.
    assert!(!Aws::new().await.execution_exists(&job_id).await, "no execution");

    let binary: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let input = api.upload("blob.csv", "text/csv", binary).await;
    let job_id = api.submit(&report_params(&input, "json")).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "Job.Fatal");
}

#[tokio::test]
async fn a_job_may_only_read_its_owners_uploads() {
    let owner = Api::new(&principal("upload-owner"));
    let thief = Api::new(&principal("upload-thief"));
    let input = owner.upload("secret.csv", "text/csv", b"a,b\n1,2\n".to_vec()).await;
    for api in [&thief] {
        let reply = api.post_json("/jobs", &report_params(&input, "json")).await;
        assert_eq!(reply.status, 404, "{}", reply.text);
        assert_eq!(reply.json["type"], "/problems/upload-not-found");
    }
    let forged = format!(
        "{}../../{input}",
        longhaul_domain::uploads::owner_prefix(&"upload-thief".parse().unwrap())
    );
    assert_eq!(thief.post_json("/jobs", &report_params(&forged, "json")).await.status, 404);
}

#[tokio::test]
async fn scanning_is_measured() {
    // Not a benchmark (that lives in make bench): just the order of magnitude, printed.
    let api = Api::new(&principal("report-size"));
    let rows = Gen::new(3).rows(200_000);
    let bytes = csv_bytes(&rows);
    let size = bytes.len();
    let input = api.upload("big.csv", "text/csv", bytes).await;
    let started = Instant::now();
    let job_id = api.submit(&report_params(&input, "json")).await;
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "succeeded");
    eprintln!("{size} bytes in {:?}", started.elapsed());
    let report: Value = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    assert_eq!(report["rows_scanned"], 200_000);
}

/// An input named but never uploaded is refused at submission like someone else's (404,
/// nothing created); one that is gone by the time the job runs fails the job at once, with the
/// reason, rather than being retried as a transient error. In AWS the latter needs the stage to
/// be allowed to list the bucket: S3 answers a HEAD of a missing key with 403 (not 404) to a
/// caller that may not, and the local edge answers the same way.
#[tokio::test]
async fn an_input_that_is_not_there_is_refused_at_submission_or_fails_the_job_at_once() {
    let api = Api::new(&principal("never-uploaded"));
    let reply = api
        .post_json(
            "/uploads",
            &json!({"filename": "later.csv", "content_type": "text/csv", "size_bytes": 10}),
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text);
    let input = reply.json["input"].as_str().unwrap().to_owned();
    let refused = api.post_json("/jobs", &report_params(&input, "json")).await;
    assert_eq!(refused.status, 404, "{}", refused.text);
    assert_eq!(refused.json["type"], "/problems/upload-not-found");
    assert_eq!(api.get("/jobs").await.json["jobs"], json!([]), "nothing created");

    // Uploaded, accepted, then gone before the job starts: its start is an hour away (beyond
    // SQS's delays, so nothing is enqueued for it yet), and only once the upload is deleted
    // does the test make it due and send it to the dispatcher — so the job starts after the
    // deletion, however slow the machine.
    let input = api.upload("gone.csv", "text/csv", b"a,b\n1,2\n".to_vec()).await;
    let mut delayed = report_params(&input, "json");
    delayed["delay_seconds"] = json!(3600);
    let job_id = api.submit(&delayed).await;
    let aws = Aws::new().await;
    let stack = &longhaul_tests::harness().stack;
    aws.s3
        .delete_object()
        .bucket(stack.resource("DataBucket"))
        .key(&input)
        .send()
        .await
        .expect("the upload is deleted");
    let id: longhaul_domain::JobId = job_id.parse().expect("a job id");
    aws.dynamodb
        .update_item()
        .table_name(stack.resource("JobsTable"))
        .key("pk", AttributeValue::S(longhaul_aws::jobs::job_pk(&id)))
        .key("sk", AttributeValue::S(longhaul_aws::jobs::JOB_SK.into()))
        .update_expression("SET not_before = :now")
        .expression_attribute_values(
            ":now",
            AttributeValue::S(longhaul_domain::format_rfc3339(chrono::Utc::now())),
        )
        .send()
        .await
        .expect("the job is made due");
    aws.sqs
        .send_message()
        .queue_url(stack.resource("IntakeQueue"))
        .message_body(json!({"job_id": job_id}).to_string())
        .send()
        .await
        .expect("the job is sent to the dispatcher");
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "Job.Fatal", "{job}");
    assert!(job["error"]["message"].as_str().unwrap().contains("does not exist"), "{job}");
    assert_eq!(job["attempt"], 1, "not retried as a new attempt: {job}");
}

/// An input over `shard_bytes` is scanned in parallel on the engine that deploys: the scan
/// fans out under the state machine's Distributed Map, each shard in its own worker
/// invocation, and the merged report equals an independent computation (the generated file's
/// quoted line breaks land in the shards' cuts).
#[tokio::test]
async fn a_large_input_scans_in_parallel_shards_and_reports_the_same() {
    let api = Api::new(&principal("report-shards"));
    let rows = Gen::new(11).rows(90_000);
    let bytes = csv_bytes(&rows);
    let shard_bytes: u64 = 1024 * 1024;
    assert!(bytes.len() as u64 > 2 * shard_bytes, "{} bytes", bytes.len());
    let input = api.upload("large.csv", "text/csv", bytes).await;
    let mut params = report_params(&input, "json");
    params["params"]["shard_bytes"] = json!(shard_bytes);
    let job_id = api.submit(&params).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let counts = &job["progress"]["shards"];
    let shards = counts["total"].as_u64().expect("the scan fanned out");
    assert!(shards >= 3, "{job}");
    assert_eq!(counts["succeeded"], json!(shards), "{job}");
    assert_eq!(job["summary"]["rows_scanned"], 90_000, "{job}");
    let records = Aws::new().await.shard_records(&job_id).await;
    assert_eq!(records as u64, shards, "each shard ran in its own invocation under the map");

    let report: Value = serde_json::from_slice(&api.result(&job_id).await).unwrap();
    assert_report_of(&report, &rows);
}
