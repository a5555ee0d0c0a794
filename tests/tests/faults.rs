//! Fault injection at scale: thousands of jobs run while the stack crashes functions before
//! and after their AWS calls, throttles AWS, and delivers SQS batches twice. The checker
//! then proves, from the table, the result objects and the journal of every DynamoDB write:
//! every job ended exactly once, in `succeeded`, with the right result; none was lost; and
//! no attempt's write ever landed after a newer attempt had taken the job.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::StreamExt;
use longhaul_aws::jobs::JobRecord;
use longhaul_domain::JobStatus;
use longhaul_domain::demo::DemoResult;
use longhaul_local::faults::{FaultCounts, FaultPlan, JournalEntry};
use longhaul_tests::{Aws, Harness, harness_with, principal};
use serde_json::{Value, json};

/// Jobs in the run (`LONGHAUL_FAULT_JOBS` lowers it while developing).
fn job_count() -> usize {
    std::env::var("LONGHAUL_FAULT_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000)
}

/// How long the whole run may take before the test gives up and names the unfinished jobs.
const RUN_BUDGET: Duration = Duration::from_secs(20 * 60);

fn stack() -> &'static Harness {
    harness_with(&[
        // A job whose submission crashed between writing it and queueing it is re-enqueued
        // by the reaper after this long.
        ("LONGHAUL_PENDING_GRACE_SECONDS", "20"),
        ("LONGHAUL_QUEUED_GRACE_SECONDS", "90"),
    ])
}

fn plan() -> FaultPlan {
    FaultPlan {
        crash_functions: vec!["StageFunction".into(), "DispatcherFunction".into(), "SubmitFunction".into()],
        crash_before_call: 0.02,
        crash_after_call: 0.02,
        max_crashes_per_job: 2,
        throttle: 0.03,
        duplicate_delivery: 0.1,
        journal: true,
        seed: 20261122,
    }
}

/// What job `i` asks for: small demo jobs of different lengths.
fn spec(i: usize) -> Value {
    json!({"type": "demo", "params": {"items": 2 + (i % 7), "item_ms": 5 * (i % 3)}})
}

/// Submits with an Idempotency-Key, retrying (same key) through crashes and throttling, as
/// a well-behaved client does; returns the job id.
async fn submit(http: &reqwest::Client, token: &str, i: usize) -> String {
    let key = format!("fault-run-{i}");
    for _ in 0..30 {
        let response = http
            .post(format!("{}/jobs", stack().stack.api_url))
            .bearer_auth(token)
            .header("idempotency-key", &key)
            .json(&spec(i))
            .send()
            .await
            .expect("the local API answers");
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        match status {
            200 | 202 => return body["job_id"].as_str().expect("job_id").to_owned(),
            // A crashed or throttled submission (502/503), or a replay of a request still in
            // flight (409): retry with the same key.
            409 | 429 | 500..=599 => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => panic!("submission {i} refused with {status}: {body}"),
        }
    }
    panic!("submission {i} never accepted");
}

async fn set_plan(plan: &FaultPlan) -> Value {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/faults", stack().stack.api_url))
        .json(plan)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    reply.json().await.unwrap()
}

async fn local<T: serde::de::DeserializeOwned>(path: &str) -> T {
    reqwest::get(format!("{}/_local/{path}", stack().stack.api_url)).await.unwrap().json().await.unwrap()
}

/// Every job record of `owner`, by job id (a scan of the emulator's table: uncounted).
async fn jobs_of(aws: &Aws, owner: &str) -> HashMap<String, JobRecord> {
    let mut jobs = HashMap::new();
    let mut start = None;
    loop {
        let page = aws
            .dynamodb
            .scan()
            .table_name(stack().stack.resource("JobsTable"))
            .filter_expression("#owner = :owner AND sk = :job")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":owner", AttributeValue::S(owner.to_owned()))
            .expression_attribute_values(":job", AttributeValue::S("JOB".into()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        for item in page.items.unwrap_or_default() {
            let job: JobRecord = serde_dynamo::from_item(item).expect("a valid job record");
            jobs.insert(job.job_id.clone(), job);
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            return jobs;
        }
    }
}

/// Violations of "never two live leases": a write made by an attempt while the job item
/// named another lease (or none) as the current one. The journal is in the table's order.
fn lease_violations(journal: &[JournalEntry]) -> Vec<String> {
    let mut current: HashMap<&str, Option<&str>> = HashMap::new();
    let mut violations = Vec::new();
    for entry in journal {
        let Some(job) = entry.pk.as_deref().and_then(|pk| pk.strip_prefix("JOB#")) else { continue };
        if let Some(writer) = entry.writer_lease.as_deref() {
            let holder = current.get(job).copied().flatten();
            if holder != Some(writer) {
                violations.push(format!(
                    "job {job}: #{} {} {:?} by lease {writer} while the job's lease was {holder:?}",
                    entry.seq, entry.operation, entry.sk
                ));
            }
        }
        // A write that returned the job item tells its lease after the write (none: removed).
        if entry.sk.as_deref() == Some("JOB") && entry.status_after.is_some() {
            current.insert(job, entry.lease_after.as_deref());
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_ends_exactly_once_and_correctly_under_injected_faults() {
    let jobs = job_count();
    let owner = principal("faults");
    let token = stack().stack.token(&owner);
    let aws = Aws::new().await;
    let plan = plan();
    set_plan(&plan).await;
    let calls_before: BTreeMap<String, u64> = local("aws-calls").await;
    let started = std::time::Instant::now();

    // Submit everything, a few requests at a time, as clients that retry properly.
    let http = reqwest::Client::new();
    let ids: Vec<(usize, String)> = futures::stream::iter(0..jobs)
        .map(|i| {
            let (http, token) = (&http, &token);
            async move { (i, submit(http, token, i).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let expected: HashMap<String, usize> = ids.iter().map(|(i, id)| (id.clone(), *i)).collect();
    eprintln!("{jobs} jobs submitted after {:?}", started.elapsed());
    assert_eq!(expected.len(), jobs, "each submission created its own job (no key reuse across jobs)");

    // Await the end of every job (the reaper's schedule runs on its own).
    let deadline = tokio::time::Instant::now() + RUN_BUDGET;
    let records = loop {
        let records = jobs_of(&aws, &owner).await;
        let open: Vec<&JobRecord> = records.values().filter(|j| !j.status.is_terminal()).collect();
        if records.len() >= jobs && open.is_empty() {
            break records;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {jobs} jobs unfinished after {RUN_BUDGET:?}, e.g. {:?}",
            open.len() + jobs.saturating_sub(records.len()),
            open.iter().take(5).map(|j| (&j.job_id, j.status, &j.transitions)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let injected: FaultCounts = serde_json::from_value(local::<Value>("faults").await["injected"].clone()).unwrap();
    let journal: Vec<JournalEntry> = local("journal").await;
    set_plan(&FaultPlan::default()).await;
    let calls_after: BTreeMap<String, u64> = local("aws-calls").await;

    // Every kind of fault happened, at scale, or this test proved nothing.
    eprintln!("{jobs} jobs ended after {:?}; faults injected: {injected:?}", started.elapsed());
    let n = jobs as u64;
    assert!(injected.crashed_before_call >= n / 10, "{injected:?}");
    assert!(injected.crashed_after_call >= n / 10, "{injected:?}");
    assert!(injected.throttled >= n / 4, "{injected:?}");
    assert!(injected.duplicated_batches >= n / 100, "{injected:?}");
    let start_executions = calls_after.get("states:StartExecution").copied().unwrap_or(0)
        - calls_before.get("states:StartExecution").copied().unwrap_or(0);
    assert!(
        start_executions > jobs as u64,
        "duplicate deliveries and dispatcher crashes must have repeated StartExecution ({start_executions} calls)"
    );

    // Exactly the submitted jobs exist: none lost, none created twice.
    assert_eq!(records.len(), jobs, "jobs in the table vs jobs submitted");
    let mut wrong = Vec::new();
    for (job_id, job) in &records {
        let Some(i) = expected.get(job_id) else {
            wrong.push(format!("{job_id}: a job nobody submitted"));
            continue;
        };
        // One terminal state, reached once, through legal transitions only.
        let terminal: Vec<_> = job.transitions.iter().filter(|t| t.state.is_terminal()).collect();
        if job.status != JobStatus::Succeeded || terminal.len() != 1 {
            wrong.push(format!("{job_id}: {:?}, transitions {:?}, error {:?}", job.status, job.transitions, job.error));
            continue;
        }
        let states: Vec<JobStatus> = job.transitions.iter().map(|t| t.state).collect();
        if let Some(pair) = states.windows(2).find(|w| !w[0].can_transition_to(w[1])) {
            wrong.push(format!("{job_id}: illegal transition {pair:?} in {states:?}"));
        }
        // The right result: the hash chain over every item, each processed exactly once.
        let key = job.result_key.as_deref().expect("a succeeded job has a result");
        let object = aws
            .s3
            .get_object()
            .bucket(stack().stack.resource("DataBucket"))
            .key(key)
            .send()
            .await
            .expect("the result object exists");
        let bytes = object.body.collect().await.expect("result body").into_bytes();
        let result: DemoResult = serde_json::from_slice(&bytes).expect("a demo result");
        let items = spec(*i)["params"]["items"].as_u64().unwrap();
        if result != DemoResult::expected(items) {
            wrong.push(format!("{job_id}: result {result:?}, expected {:?}", DemoResult::expected(items)));
        }
    }
    assert!(wrong.is_empty(), "{} of {jobs} jobs went wrong:\n{}", wrong.len(), wrong.join("\n"));

    // The journal saw every job's writes, and no attempt wrote after losing its lease.
    let journaled_jobs = journal.iter().filter(|e| e.sk.as_deref() == Some("JOB") && e.status_after.is_some()).count();
    assert!(journaled_jobs >= 2 * jobs, "the journal holds the jobs' transitions ({journaled_jobs} entries)");
    let fenced = journal.iter().filter(|e| e.writer_lease.is_some()).count();
    assert!(fenced >= jobs, "attempts' own writes are journaled ({fenced})");
    let violations = lease_violations(&journal);
    assert!(violations.is_empty(), "{} writes outside their lease:\n{}", violations.len(), violations.join("\n"));
}

#[test]
fn the_lease_checker_finds_a_write_after_a_newer_claim() {
    let entry = |seq, sk: &str, writer: Option<&str>, lease_after: Option<&str>, status: Option<&str>| JournalEntry {
        seq,
        operation: "dynamodb:UpdateItem".into(),
        pk: Some("JOB#j".into()),
        sk: Some(sk.into()),
        writer_lease: writer.map(Into::into),
        lease_after: lease_after.map(Into::into),
        status_after: status.map(Into::into),
    };
    let healthy = vec![
        entry(0, "JOB", None, Some("a"), Some("running")),
        entry(1, "PROGRESS", Some("a"), None, None),
        entry(2, "JOB", None, None, Some("queued")),
        entry(3, "JOB", None, Some("b"), Some("running")),
        entry(4, "PROGRESS", Some("b"), None, None),
    ];
    assert!(lease_violations(&healthy).is_empty());
    let mut stale = healthy.clone();
    stale.push(entry(5, "PROGRESS", Some("a"), None, None));
    assert_eq!(lease_violations(&stale).len(), 1);
    let mut after_requeue = healthy[..3].to_vec();
    after_requeue.push(entry(3, "PROGRESS", Some("a"), None, None));
    assert_eq!(lease_violations(&after_requeue).len(), 1, "a requeue ends lease a");
}
