//! Fault injection at scale: thousands of jobs run while the stack crashes functions before
//! and after their AWS calls, pauses workers until the reaper declares them dead and
//! re-dispatches their jobs, throttles AWS, delivers SQS batches twice, and a job's start — its
//! direct run's invocation or an execution's `StartExecution` — twice.
//! The checker then proves, from the table, the result objects and the journal of every
//! DynamoDB write: every job ended exactly once, in `succeeded`, with the right result; none
//! was lost; jobs did change hands between attempts, and no attempt's write ever landed after
//! a newer attempt had taken the job (the stale attempts' writes were refused).
//!
//! Most jobs are `demo` jobs that checkpoint every two items and write progress every 50 ms;
//! one in twenty is a three-stage `csv_report` over a 2 MiB+ upload, so that
//! resuming a scan from its checkpoint and crossing stage boundaries happen under faults too
//! (every other one scans in 1 MiB shards: its speculative shard scans and their merge run
//! under faults), and one in ten fans `process` out into shards, so that a crash inside a
//! shard resumes it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::StreamExt;
use longhaul_aws::jobs::JobRecord;
use longhaul_domain::{JobId, JobStatus, Owner};
use longhaul_job_demo::DemoResult;
use longhaul_local::faults::{FaultCounts, FaultPlan, JournalEntry};
use longhaul_tests::csvgen::{Gen, csv_bytes, expected, rows_match};
use longhaul_tests::{Api, Aws, Deadline, Harness, harness_with, principal};
use serde_json::{Value, json};

/// Jobs in the run. The default proves every property below in a few minutes of CI on two
/// cores; `make bench-faults` runs 2,000 (`LONGHAUL_FAULT_JOBS`) and writes the run's figures
/// to BENCHMARKS.md.
fn job_count() -> usize {
    std::env::var("LONGHAUL_FAULT_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(CI_JOBS)
}
const CI_JOBS: usize = 400;

/// Whether this run writes its figures as a section of BENCHMARKS.md (`make bench-faults`).
fn writes_section() -> bool {
    std::env::var_os("LONGHAUL_FAULT_SECTION").is_some()
}

/// How long the run may go with nothing moving — no job created, ended or transitioned —
/// before the test calls it stuck and names the unfinished jobs. Twice the longest a job can
/// legitimately sit with nothing written: a paused worker frozen for [`PAUSE`], then a pending
/// job's next re-enqueue (`MAX_ENQUEUE_INTERVAL` after `PENDING_GRACE`) or a queued job's
/// grace. The run as a whole has no deadline: as long as jobs keep ending, it is not stuck,
/// however slow the machine.
const STUCK_AFTER: Duration = Duration::from_secs(
    2 * (PAUSE.as_secs() + HEARTBEAT_TIMEOUT + PENDING_GRACE + MAX_ENQUEUE_INTERVAL + QUEUED_GRACE),
);
const HEARTBEAT_TIMEOUT: u64 = 8;
const PENDING_GRACE: u64 = 20;
const MAX_ENQUEUE_INTERVAL: u64 = 60;
const QUEUED_GRACE: u64 = 90;

/// How long a paused worker stays frozen: well beyond the heartbeat timeout below plus a
/// reaper run (which takes seconds under this load) and [`REAPER_EVERY`], so the reaper
/// declares it dead while it still lives.
const PAUSE: Duration = Duration::from_secs(120);
const REAPER_EVERY: Duration = Duration::from_secs(3);
/// What the reaper fired by the test did, summed over its runs (its report's counts).
static REAPER_DID: std::sync::Mutex<BTreeMap<String, u64>> = std::sync::Mutex::new(BTreeMap::new());

fn stack() -> &'static Harness {
    harness_with(&[
        // A job whose submission crashed between writing it and queueing it is re-enqueued
        // by the reaper after this long.
        ("LONGHAUL_PENDING_GRACE_SECONDS", PENDING_GRACE.to_string().as_str()),
        // A pending job looked at often while the intake backlogs is re-enqueued at growing
        // intervals; at the default ceiling (900 s) a job whose message was lost late in a
        // long backlog waits up to 15 minutes for its next look — past the run's budget on a
        // slow machine (seen: 72 pending jobs, nothing queued, the pipeline idle, at the end).
        ("LONGHAUL_MAX_ENQUEUE_INTERVAL_SECONDS", MAX_ENQUEUE_INTERVAL.to_string().as_str()),
        ("LONGHAUL_QUEUED_GRACE_SECONDS", QUEUED_GRACE.to_string().as_str()),
        // A worker silent this long is a zombie (a paused one is silent for PAUSE).
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", HEARTBEAT_TIMEOUT.to_string().as_str()),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "2"),
        // Re-dispatches of slow-but-alive workers under load must not exhaust the budget:
        // a job failed for that would be the fault model's doing, not a finding.
        ("LONGHAUL_MAX_ATTEMPTS", "6"),
        // Many small checkpoints and progress writes: more AWS calls to crash around, and
        // resumes from real checkpoints.
        ("LONGHAUL_CHECKPOINT_ITEMS", "2"),
        ("LONGHAUL_PROGRESS_INTERVAL_MS", "50"),
        // One principal submits every job. CI's run holds it to the default running limit
        // (50), so that submit's seats, the waiting lists and their wake-ups run under the
        // faults too (about half again as long at 400 jobs); a larger run has no limit, which
        // at 2,000 would take about six times as long.
        ("LONGHAUL_TENANT_MAX_RUNNING", if job_count() <= CI_JOBS { "50" } else { "0" }),
    ])
}

fn plan() -> FaultPlan {
    FaultPlan {
        crash_functions: vec![
            "StageFunction".into(),
            // csv_report's own worker function.
            "CsvReportWorkerFunction".into(),
            "DispatcherFunction".into(),
            "SubmitFunction".into(),
        ],
        crash_before_call: 0.02,
        crash_after_call: 0.02,
        crash_only: None,
        max_crashes_per_job: 2,
        throttle: 0.03,
        throttle_only: None,
        deny: None,
        duplicate_delivery: 0.1,
        duplicate_start: 0.05,
        pause_functions: vec!["StageFunction".into(), "CsvReportWorkerFunction".into()],
        // The first jobs' workers only: later in the run hundreds of jobs run at once, and a
        // local reaper run (moto under that load) takes tens of seconds, too slow to catch a
        // pause within its 120 s. One pause per 40 jobs, 10 to 30.
        pause_before_call: 0.02,
        pause_only: None,
        max_pauses: (job_count() as u64 / 40).clamp(10, 30),
        pause_ms: PAUSE.as_millis() as u64,
        journal: true,
        seed: 20261123,
    }
}

/// Whether job `i` is a `csv_report` (one in twenty), not a `demo`.
fn is_report(i: usize) -> bool {
    i % 20 == 19
}

/// What job `i` asks for: demo jobs of different lengths, and reports over `input` (every
/// other one in shards of 1 MiB).
fn spec(i: usize, input: &str) -> Value {
    if is_report(i) {
        let mut report = json!({"type": "csv_report", "params": {
            "input": input,
            "group_by": ["region", "product"],
            "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "min", "column": "amount"},
                        {"op": "max", "column": "amount"}, {"op": "mean", "column": "amount"}],
            "format": "json",
        }});
        if i % 40 == 39 {
            report["params"]["shard_bytes"] = json!(1 << 20);
        }
        return report;
    }
    let mut params = json!({"items": 2 + (i % 7), "item_ms": 5 * (i % 3)});
    if let Some(shards) = shards(i) {
        params["shards"] = json!(shards);
    }
    json!({"type": "demo", "params": params})
}

/// The shards demo job `i` fans out into, if it does (one in ten: 2 to 4 shards).
fn shards(i: usize) -> Option<u64> {
    (i % 10 == 3).then_some(2 + (i % 3) as u64)
}

/// Submits with an Idempotency-Key, retrying (same key) through crashes and throttling, as
/// a well-behaved client does; returns the job id. (A submission that crashed between its
/// writes leaves its key in flight, `409`, for `IN_FLIGHT_WINDOW`: retries go on for several
/// windows.)
async fn submit(http: &reqwest::Client, token: &str, i: usize, input: &str) -> String {
    let key = format!("fault-run-{i}");
    // As the run's: a submission is not stuck while the stack, however slow (hundreds of jobs
    // and a build beside them on two cores can hold a submission past its function's timeout
    // time after time), keeps moving.
    let deadline = Deadline::new(format!("submission {i} to be accepted"), STUCK_AFTER);
    loop {
        let response = http
            .post(format!("{}/jobs", stack().stack.api_url))
            .bearer_auth(token)
            .header("idempotency-key", &key)
            .json(&spec(i, input))
            .send()
            .await
            .expect("the local API answers");
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        match status {
            200 | 202 => return body["job_id"].as_str().expect("job_id").to_owned(),
            // A crashed or throttled submission (502/503), or a replay of a request still in
            // flight (409): retry with the same key.
            409 | 429 | 500..=599 => {
                deadline.tick(Duration::from_millis(200), format!("{status} {body}")).await;
            }
            _ => panic!("submission {i} refused with {status}: {body}"),
        }
    }
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
    reqwest::get(format!("{}/_local/{path}", stack().stack.api_url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Every job record of `owner`, by job id (a scan of the emulator's table: uncounted).
async fn jobs_of(aws: &Aws, owner: &Owner) -> HashMap<JobId, JobRecord> {
    let mut jobs = HashMap::new();
    let mut start = None;
    loop {
        let page = aws
            .dynamodb
            .scan()
            .table_name(stack().stack.resource("JobsTable"))
            .filter_expression("#owner = :owner AND sk = :job")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":owner", AttributeValue::S(owner.to_string()))
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

/// The job a journal entry wrote to, if it names one.
fn job_of(entry: &JournalEntry) -> Option<&str> {
    entry.pk.as_deref()?.strip_prefix("JOB#")
}

/// The journal replayed against each job's current lease (the journal is in the table's order).
#[derive(Debug, Default)]
struct Fences {
    /// Violations of "never two live leases": a write that took effect, made by an attempt
    /// while the job item named another lease (or none) as the current one.
    violations: Vec<String>,
    /// Writes the table refused because their attempt's lease was no longer the job's: the
    /// fence at work (a refusal for another reason, such as a cancelled job, is not counted).
    stale_refused: usize,
}

fn replay_fences(journal: &[JournalEntry]) -> Fences {
    let mut current: HashMap<&str, Option<&str>> = HashMap::new();
    let mut fences = Fences::default();
    for entry in journal {
        let Some(job) = job_of(entry) else { continue };
        let holder = current.get(job).copied().flatten();
        match entry.writer_lease.as_deref() {
            Some(writer) if entry.refused => {
                fences.stale_refused += usize::from(holder != Some(writer))
            }
            Some(writer) if holder != Some(writer) => fences.violations.push(format!(
                "job {job}: #{} {} {:?} by lease {writer} while the job's lease was {holder:?}",
                entry.seq, entry.operation, entry.sk
            )),
            _ => {}
        }
        // A write that returned the job item tells its lease after the write (none: removed).
        if !entry.refused && entry.sk.as_deref() == Some("JOB") && entry.status_after.is_some() {
            current.insert(job, entry.lease_after.as_deref());
        }
    }
    fences
}

/// Per job, the distinct leases it was run under, from the journal.
fn leases_by_job(journal: &[JournalEntry]) -> HashMap<&str, BTreeSet<&str>> {
    let mut leases: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for entry in journal.iter().filter(|e| !e.refused && e.sk.as_deref() == Some("JOB")) {
        if let (Some(job), Some(lease)) = (job_of(entry), entry.lease_after.as_deref()) {
            leases.entry(job).or_default().insert(lease);
        }
    }
    leases
}

/// Violations of "exactly one terminal state": per job, the statuses its item took, write
/// by write, must reach a terminal state once and never leave it.
fn terminal_violations(journal: &[JournalEntry]) -> Vec<String> {
    let mut statuses: HashMap<&str, Vec<JobStatus>> = HashMap::new();
    for entry in journal.iter().filter(|e| !e.refused && e.sk.as_deref() == Some("JOB")) {
        if let (Some(job), Some(status)) = (job_of(entry), entry.status_after.as_deref()) {
            let status = serde_json::from_value(json!(status)).expect("a known status");
            statuses.entry(job).or_default().push(status);
        }
    }
    statuses
        .into_iter()
        .filter_map(|(job, seen)| {
            let first_end = seen.iter().position(|s| s.is_terminal())?;
            let ends =
                seen.windows(2).filter(|w| !w[0].is_terminal() && w[1].is_terminal()).count()
                    + usize::from(first_end == 0);
            (ends != 1 || seen[first_end..].iter().any(|s| *s != seen[first_end]))
                .then(|| format!("job {job}: statuses written {seen:?}"))
        })
        .collect()
}

/// What the checker watches for movement: jobs created, ended, and transitions written.
#[derive(Debug, Default, PartialEq, Eq)]
struct Progress {
    jobs: usize,
    ended: usize,
    transitions: usize,
}

impl Progress {
    fn of(records: &HashMap<JobId, JobRecord>) -> Self {
        Progress {
            jobs: records.len(),
            ended: records.values().filter(|j| j.status.is_terminal()).count(),
            transitions: records.values().map(|j| j.transitions.len()).sum(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_ends_exactly_once_and_correctly_under_injected_faults() {
    let jobs = job_count();
    let owner = principal("faults");
    let token = stack().stack.token(&owner);
    let aws = Aws::new().await;

    // The reports' input: over two checkpoint intervals of the scan (LONGHAUL_CHECKPOINT_ITEMS
    // MiB), uploaded before the faults start.
    let rows = Gen::new(23).rows(80_000);
    let csv = csv_bytes(&rows);
    assert!(csv.len() > 2 << 20, "the report input spans a scan checkpoint ({} bytes)", csv.len());
    let input = Api::new(&owner).upload("faults.csv", "text/csv", csv).await;
    let (report_rows, report_invalid) = expected(&rows);

    let plan = plan();
    set_plan(&plan).await;
    let calls_before: BTreeMap<String, BTreeMap<String, u64>> =
        local("aws-calls/by-function").await;
    let started = std::time::Instant::now();

    // The reaper, often, until every pause is over (then only its schedule, every minute): it
    // is what declares a paused worker dead and re-dispatches its job. Its reports are summed,
    // to tell what it did.
    let max_pauses = plan.max_pauses;
    let reaper = tokio::spawn(async move {
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
        let mut did: BTreeMap<String, u64> = BTreeMap::new();
        loop {
            let injected: FaultCounts =
                serde_json::from_value(local::<Value>("faults").await["injected"].clone()).unwrap();
            if injected.paused >= max_pauses && injected.pauses_over == injected.paused {
                return;
            }
            let run_started = std::time::Instant::now();
            let run = http
                .post(format!("{}/_local/schedules/reaper", stack().stack.api_url))
                .send()
                .await;
            let report = match run {
                Ok(reply) => reply.json::<Value>().await.unwrap_or_default(),
                Err(err) => json!({"error": err.to_string()}),
            };
            match report["output"].as_object() {
                Some(output) => {
                    for (name, value) in output.iter().filter_map(|(k, v)| Some((k, v.as_u64()?))) {
                        *did.entry(name.clone()).or_default() += value;
                    }
                }
                None => *did.entry(format!("failed runs: {report}")).or_default() += 1,
            }
            *did.entry("runs".into()).or_default() += 1;
            *did.entry("run seconds".into()).or_default() += run_started.elapsed().as_secs();
            REAPER_DID.lock().expect("reaper totals").clone_from(&did);
            tokio::time::sleep(REAPER_EVERY).await;
        }
    });

    // Submit everything, a few requests at a time, as clients that retry properly.
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let ids: Vec<(usize, String)> = futures::stream::iter(0..jobs)
        .map(|i| {
            let (http, token, input) = (&http, &token, &input);
            async move { (i, submit(http, token, i, input).await) }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let expected_jobs: HashMap<String, usize> =
        ids.iter().map(|(i, id)| (id.clone(), *i)).collect();
    eprintln!("{jobs} jobs submitted after {:?}", started.elapsed());
    assert_eq!(
        expected_jobs.len(),
        jobs,
        "each submission created its own job (no key reuse across jobs)"
    );

    // Await the end of every job, for as long as the run keeps moving.
    let mut moved = Progress::default();
    let mut still_since = tokio::time::Instant::now();
    loop {
        let records = jobs_of(&aws, &owner).await;
        let open: Vec<&JobRecord> = records.values().filter(|j| !j.status.is_terminal()).collect();
        if records.len() >= jobs && open.is_empty() {
            break;
        }
        let now = Progress::of(&records);
        if now != moved {
            (moved, still_since) = (now, tokio::time::Instant::now());
        }
        assert!(
            still_since.elapsed() < STUCK_AFTER,
            "nothing moved for {STUCK_AFTER:?}: {} of {jobs} jobs unfinished after {:?}, e.g. {:?}",
            open.len() + jobs.saturating_sub(records.len()),
            started.elapsed(),
            open.iter().take(5).map(|j| (&j.job_id, j.status, &j.transitions)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ran_for = started.elapsed();
    eprintln!("{jobs} jobs ended after {ran_for:?}");
    // Then await quiet: every paused worker woke and tried its stale writes, and nothing has
    // written since, so what the table holds now is final, not a snapshot. A paused worker
    // wakes within PAUSE of its pause; the journal stops growing once the last has.
    let quiet_by = tokio::time::Instant::now() + PAUSE + STUCK_AFTER;
    let mut last_length = usize::MAX;
    loop {
        let injected: FaultCounts =
            serde_json::from_value(local::<Value>("faults").await["injected"].clone()).unwrap();
        let length = local::<Vec<JournalEntry>>("journal").await.len();
        if injected.pauses_over == injected.paused && length == last_length {
            break;
        }
        assert!(tokio::time::Instant::now() < quiet_by, "the stack never went quiet: {injected:?}");
        last_length = length;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    reaper.abort();
    let records = jobs_of(&aws, &owner).await;
    let injected: FaultCounts =
        serde_json::from_value(local::<Value>("faults").await["injected"].clone()).unwrap();
    let journal: Vec<JournalEntry> = local("journal").await;
    set_plan(&FaultPlan::default()).await;
    let calls_after: BTreeMap<String, BTreeMap<String, u64>> = local("aws-calls/by-function").await;

    // Every kind of fault happened, at scale, or this test proved nothing.
    eprintln!("after {:?}, faults injected: {injected:#?}", started.elapsed());
    eprintln!("the reaper did: {:?}", REAPER_DID.lock().expect("reaper totals"));
    let n = jobs as u64;
    assert!(injected.crashed_before_call >= n / 10, "{injected:?}");
    assert!(injected.crashed_after_call >= n / 10, "{injected:?}");
    assert!(injected.throttled >= n / 4, "{injected:?}");
    assert!(injected.duplicated_batches >= n / 100, "{injected:?}");
    assert!(injected.duplicated_starts >= n / 100, "{injected:?}");
    assert_eq!(injected.paused, plan.max_pauses, "{injected:?}");
    // Crashes struck on both sides of every AWS call the crashing functions make often.
    let calls_during = |function: &str, operation: &str| {
        let count = |calls: &BTreeMap<String, BTreeMap<String, u64>>| {
            calls.get(function).and_then(|c| c.get(operation)).copied().unwrap_or(0)
        };
        count(&calls_after) - count(&calls_before)
    };
    let (mut frequent_calls, frequent) = (0usize, (n / 2).max(500));
    for function in &plan.crash_functions {
        for operation in calls_after
            .get(function)
            .map(|c| c.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            if calls_during(function, &operation) < frequent {
                continue;
            }
            frequent_calls += 1;
            for side in ["before", "after"] {
                let site = format!("{function} {operation} {side}");
                assert!(
                    injected.crash_sites.get(&site).copied().unwrap_or(0) > 0,
                    "no crash {side} {function}'s {operation}: {injected:#?}"
                );
            }
        }
    }
    eprintln!(
        "{frequent_calls} frequent calls (≥ {frequent} in the run), each crashed on both sides"
    );
    assert!(
        frequent_calls >= 4,
        "the crashing functions' frequent calls ({frequent_calls}) were found"
    );

    // Exactly the submitted jobs exist: none lost, none created twice.
    assert_eq!(records.len(), jobs, "jobs in the table vs jobs submitted");
    let mut wrong = Vec::new();
    for (job_id, job) in &records {
        let Some(&i) = expected_jobs.get(job_id.as_str()) else {
            wrong.push(format!("{job_id}: a job nobody submitted"));
            continue;
        };
        // One terminal state, reached once, through legal transitions only.
        let terminal: Vec<_> = job.transitions.iter().filter(|t| t.state.is_terminal()).collect();
        if job.status != JobStatus::Succeeded || terminal.len() != 1 {
            wrong.push(format!(
                "{job_id}: {:?}, transitions {:?}, error {:?}",
                job.status, job.transitions, job.error
            ));
            continue;
        }
        let states: Vec<JobStatus> = job.transitions.iter().map(|t| t.state).collect();
        if let Some(pair) = states.windows(2).find(|w| !w[0].can_transition_to(w[1])) {
            wrong.push(format!("{job_id}: illegal transition {pair:?} in {states:?}"));
        }
        // The right result: the hash chain over every item, each processed exactly once, or
        // the report equal to one computed directly from the generated rows.
        // Kept in the record when small (the demo's), else an object the record names.
        let bytes = match (&job.result_inline, job.result_key.as_deref()) {
            (Some(inline), _) => inline.bytes().expect("an inline result decodes").into(),
            (None, Some(key)) => {
                let object = aws
                    .s3
                    .get_object()
                    .bucket(stack().stack.resource("DataBucket"))
                    .key(key)
                    .send()
                    .await
                    .expect("the result object exists");
                object.body.collect().await.expect("result body").into_bytes()
            }
            (None, None) => {
                wrong.push(format!("{job_id}: succeeded without a result"));
                continue;
            }
        };
        if is_report(i) {
            let report: Value = serde_json::from_slice(&bytes).expect("a JSON report");
            let actual = report["rows"].as_array().cloned().unwrap_or_default();
            let right = report["rows_scanned"] == json!(rows.len())
                && report["invalid"] == json!({"amount": report_invalid})
                && actual.len() == report_rows.len()
                && actual.iter().zip(&report_rows).all(|(a, e)| rows_match(a, e));
            if !right {
                wrong.push(format!(
                    "{job_id}: a report that differs from the direct computation: {}",
                    &report.to_string()[..200.min(report.to_string().len())]
                ));
            }
            continue;
        }
        let result: DemoResult = serde_json::from_slice(&bytes).expect("a demo result");
        let items = spec(i, &input)["params"]["items"].as_u64().unwrap();
        let expected = match shards(i) {
            Some(shards) => DemoResult::expected_sharded(items, shards),
            None => DemoResult::expected(items),
        };
        if result != expected {
            wrong.push(format!("{job_id}: result {result:?}, expected {expected:?}"));
        }
    }
    assert!(wrong.is_empty(), "{} of {jobs} jobs went wrong:\n{}", wrong.len(), wrong.join("\n"));

    // The journal saw every job's writes: each job's item reached one terminal state once and
    // stayed there (counted write by write, after the stack went quiet).
    let journaled_jobs = journal
        .iter()
        .filter(|e| !e.refused && e.sk.as_deref() == Some("JOB") && e.status_after.is_some())
        .count();
    assert!(
        journaled_jobs >= 2 * jobs,
        "the journal holds the jobs' transitions ({journaled_jobs} entries)"
    );
    let fenced = journal.iter().filter(|e| !e.refused && e.writer_lease.is_some()).count();
    assert!(fenced >= jobs, "attempts' own writes are journaled ({fenced})");
    let ends = terminal_violations(&journal);
    assert!(ends.is_empty(), "{} jobs did not end exactly once:\n{}", ends.len(), ends.join("\n"));

    // Jobs changed hands between live attempts (a paused worker woke after the reaper had
    // given its job to a new attempt), and yet no attempt wrote after losing its lease: the
    // stale attempts tried, and the table refused them.
    let leases = leases_by_job(&journal);
    let handed_over = leases.values().filter(|l| l.len() >= 2).count();
    let fences = replay_fences(&journal);
    let refused = fences.stale_refused;
    eprintln!("{handed_over} jobs ran under two or more leases; {refused} stale writes refused");
    // (A pause after the job's last write, or one the reaper's run missed, hands nothing over.)
    assert!(handed_over >= 1, "{handed_over} jobs changed hands for {} pauses", injected.paused);
    assert!(
        refused >= 1,
        "{refused} stale writes refused for {handed_over} jobs that changed hands"
    );
    let violations = fences.violations;
    assert!(
        violations.is_empty(),
        "{} writes outside their lease:\n{}",
        violations.len(),
        violations.join("\n")
    );

    if writes_section() {
        let section = section(&Figures {
            jobs,
            ran_for,
            injected: &injected,
            handed_over,
            refused,
            frequent_calls,
            journal: journal.len(),
            reaper: &REAPER_DID.lock().expect("reaper totals"),
        });
        longhaul_tests::sections::write_section("60-faults", &section).expect("section written");
    }
}

/// What a run measured, for its section of BENCHMARKS.md.
struct Figures<'a> {
    jobs: usize,
    ran_for: Duration,
    injected: &'a FaultCounts,
    handed_over: usize,
    refused: usize,
    frequent_calls: usize,
    journal: usize,
    reaper: &'a BTreeMap<String, u64>,
}

/// The section `make bench-faults` writes: a run that passed every check of this test.
fn section(f: &Figures) -> String {
    let i = f.injected;
    let minutes = f.ran_for.as_secs_f64() / 60.0;
    let reaper: Vec<String> = f.reaper.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "## Faults: every job ends exactly once under injected faults\n\n\
         `make bench-faults`: tests/tests/faults.rs at {jobs} jobs (CI runs it at {ci} — the same \
         checks, fewer jobs, under the default running limit of 50 so that the waiting lists \
         run under the faults too; this run has none). One principal submits every job (1 in 20 a three-stage csv_report \
         over a 2 MiB+ upload, every other one of those in 1 MiB shards; 1 in 10 a demo job \
         fanned out into shards; the rest plain demo jobs) while the local stack crashes functions \
         before and after their AWS calls, throttles, delivers batches and starts executions \
         twice, and freezes workers for {pause} s so the reaper hands their jobs to a new \
         attempt. The run passed every check: {jobs} of {jobs} jobs succeeded exactly once with \
         the right result, no write landed outside its lease.\n\n\
         | | |\n|---|---:|\n\
         | jobs | {jobs} |\n\
         | submission to last end (min) | {minutes:.1} |\n\
         | crashes before / after an AWS call | {cb} / {ca} |\n\
         | crash sites (function, operation, side) | {sites} |\n\
         | frequent calls crashed on both sides | {frequent} |\n\
         | throttled calls | {throttled} |\n\
         | batches / starts delivered twice | {db} / {ds} |\n\
         | workers frozen | {paused} |\n\
         | jobs run under two or more leases | {handed} |\n\
         | stale writes refused by the lease fence | {refused} |\n\
         | DynamoDB writes journaled and replayed | {journal} |\n\n\
         The reaper, fired every {every} s until the last pause was over: {reaper}.\n",
        jobs = f.jobs,
        ci = CI_JOBS,
        pause = PAUSE.as_secs(),
        cb = i.crashed_before_call,
        ca = i.crashed_after_call,
        sites = i.crash_sites.len(),
        frequent = f.frequent_calls,
        throttled = i.throttled,
        db = i.duplicated_batches,
        ds = i.duplicated_starts,
        paused = i.paused,
        handed = f.handed_over,
        refused = f.refused,
        journal = f.journal,
        every = REAPER_EVERY.as_secs(),
        reaper = reaper.join(", "),
    )
}

/// A journal entry for job `j`, for the checkers' own tests.
fn entry(
    seq: u64,
    sk: &str,
    writer: Option<&str>,
    lease_after: Option<&str>,
    status: Option<&str>,
    refused: bool,
) -> JournalEntry {
    JournalEntry {
        seq,
        operation: "dynamodb:UpdateItem".into(),
        pk: Some("JOB#j".into()),
        sk: Some(sk.into()),
        writer_lease: writer.map(Into::into),
        lease_after: lease_after.map(Into::into),
        status_after: status.map(Into::into),
        refused,
    }
}

#[test]
fn the_lease_checker_finds_a_write_after_a_newer_claim() {
    let healthy = vec![
        entry(0, "JOB", None, Some("a"), Some("running"), false),
        entry(1, "PROGRESS", Some("a"), None, None, false),
        entry(2, "JOB", None, None, Some("queued"), false),
        entry(3, "JOB", None, Some("b"), Some("running"), false),
        entry(4, "PROGRESS", Some("b"), None, None, false),
    ];
    assert!(replay_fences(&healthy).violations.is_empty());
    let mut stale = healthy.clone();
    stale.push(entry(5, "PROGRESS", Some("a"), None, None, false));
    assert_eq!(replay_fences(&stale).violations.len(), 1);
    let mut after_requeue = healthy[..3].to_vec();
    after_requeue.push(entry(3, "PROGRESS", Some("a"), None, None, false));
    assert_eq!(replay_fences(&after_requeue).violations.len(), 1, "a requeue ends lease a");
}

#[test]
fn the_fence_checker_counts_stale_refusals_and_ignores_them_as_violations() {
    let journal = vec![
        entry(0, "JOB", None, Some("a"), Some("running"), false),
        entry(1, "JOB", Some("a"), None, Some("queued"), false),
        entry(2, "JOB", None, Some("b"), Some("running"), false),
        // Lease a's worker wakes: its writes are refused.
        entry(3, "PROGRESS", Some("a"), None, None, true),
        entry(4, "JOB", Some("a"), None, None, true),
        // b's own refused write (say, a cancelled job) is not a stale one.
        entry(5, "JOB", Some("b"), None, None, true),
        entry(6, "JOB", Some("b"), Some("b"), Some("succeeded"), false),
    ];
    let fences = replay_fences(&journal);
    assert!(fences.violations.is_empty(), "refused writes changed nothing");
    assert_eq!(fences.stale_refused, 2);
    assert_eq!(leases_by_job(&journal)["j"].len(), 2);
    assert!(terminal_violations(&journal).is_empty());
    let mut twice = journal.clone();
    twice.push(entry(7, "JOB", Some("b"), Some("b"), Some("failed"), false));
    assert_eq!(terminal_violations(&twice).len(), 1, "left its terminal state");
    let mut again = journal;
    again.push(entry(7, "JOB", None, Some("c"), Some("running"), false));
    again.push(entry(8, "JOB", Some("c"), Some("c"), Some("succeeded"), false));
    assert_eq!(terminal_violations(&again).len(), 1, "ended twice");
}
