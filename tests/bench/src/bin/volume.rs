//! The reaper and the expirer at volume, by simulation on the local stack.
//!
//! Writes section `20-volume` of BENCHMARKS.md. For each N (`LONGHAUL_VOLUME_NS`, default
//! 1,000, 10,000 and 50,000), on two fresh stacks side by side (steps 1–3 on one, 1 and 4 on
//! the other):
//!
//! 1. **Real items to copy.** One demo job is submitted through the API and read while it runs
//!    (its job and progress records), then cancelled; another runs to success (its records and
//!    its result object). Every seeded item is a copy of those, with the job id, the lease and
//!    the times the sweeps read replaced — so the seeded items are exactly what the code writes,
//!    and the status index (moto projects what `template.yaml` says) follows the template.
//! 2. **N running jobs** are written straight into the emulator (`BatchWriteItem`, uncounted),
//!    their claim times spread over twelve hours. Every 100th in claim order (from the 4th) is a
//!    **zombie** (last heartbeat past the timeout), every 200th (from the 12th) **stalled**
//!    (heartbeating, progress unchanged past the stall threshold), every 400th (from the 38th)
//!    **timed out** (started past the maximum run time); the rest are healthy, their heartbeat
//!    and progress stamped hours ahead so they stay fresh however long the bench takes (their
//!    workers' writes are not what is measured).
//! 3. **The reaper runs as scheduled** (`POST /_local/schedules/reaper`, the hosted function
//!    with its template timeout), one run after another, until every seeded zombie, stall and
//!    timeout was found and one full sweep more has run. After each run the seeded unhealthy
//!    jobs are read back (uncounted) to see which run found which.
//! 4. **N due successes** (on the other stack: result retention passed, expiry spread over the last week, each
//!    with its result object in S3) are seeded, and the expirer runs until nothing is due.
//!
//! Counted per run: the edge's AWS calls of the function by operation, its wall time (the
//! emulator's, not AWS's), the function's own report. Billed units are computed from item
//! sizes (see [`Billing`]). The stack's own timers for the two schedules are set to a year in
//! a copy of the template (`target/volume-stack-*/template.yaml`, otherwise identical), so that
//! the only runs are the bench's.
//!
//! Run: `cargo run --profile bench-local -p longhaul-bench --bin volume` (needs `make venv`).
//! Knobs: `LONGHAUL_VOLUME_NS` (comma-separated), `LONGHAUL_VOLUME_REAPER_PAGE` (default: the
//! function's own default), `LONGHAUL_VOLUME_EXPIRER_PAGE` (likewise), `LONGHAUL_VOLUME_MAX_RUNS`
//! (30).
//!
//! One file of ~2,000 lines on purpose: a benchmark is one scenario read top to bottom (seed,
//! run, measure, write the section), and its steps are used nowhere else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, PutRequest, WriteRequest};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use longhaul_aws::jobs::{STATUS_SHARDS, status_bucket};
use longhaul_domain::format_rfc3339;
use longhaul_local::{LocalStack, Options};
use serde_json::{Value, json};

type Item = HashMap<String, AttributeValue>;

// ------------------------------------------------------------------------------------------
// Prices: the DynamoDB, Lambda and S3 lines of the jobs section's table (tests/bench/src/bin/
// jobs.rs, `PRICES`), us-east-1 list prices on the date of the run; edit both together.
// ------------------------------------------------------------------------------------------

/// $ per read request unit (on demand).
const RRU_PRICE: f64 = 0.125 / 1e6;
/// $ per write request unit (on demand).
const WRU_PRICE: f64 = 0.625 / 1e6;
/// $ per Lambda GB-second (arm64).
const GB_S_PRICE: f64 = 0.000_013_333_4;
/// $ per Lambda request.
const LAMBDA_REQUEST_PRICE: f64 = 0.20 / 1e6;
/// $ per S3 PUT/COPY/POST/LIST request (ListObjectsV2 is billed in this class).
const S3_LIST_PRICE: f64 = 0.005 / 1e3;
/// Minutes in the month the jobs section prices by (730 h).
const MINUTES_PER_MONTH: f64 = 730.0 * 60.0;

/// The reaper's and the expirer's time budgets as their defaults set them (passed explicitly so
/// that the section says what it measured).
const REAPER_BUDGET_S: u64 = 40;
/// The reaper's budget in the bench (unless `LONGHAUL_VOLUME_REAPER_BUDGET` says otherwise):
/// the emulator takes about a hundred times AWS's time per call (an unhealthy job's
/// consistent query scans the whole table there), so with 40 s a local sweep of 50,000 jobs
/// would be cut into a dozen runs that AWS does not need (the projection gives AWS's sweep
/// time against the 40 s). The cursor that carries a sweep the budget cuts into the next run
/// is tested in tests/tests/sweeps.rs.
const LOCAL_REAPER_BUDGET_S: u64 = LOCAL_TIMEOUT_S - 60;
const EXPIRER_BUDGET_S: u64 = 240;
/// The functions' own page sizes (`LONGHAUL_REAPER_PAGE`, `LONGHAUL_EXPIRER_PAGE`), for the
/// projection.
const DEFAULT_REAPER_PAGE: usize = 100;
const DEFAULT_EXPIRER_PAGE: usize = 200;
/// The page size the bench runs the reaper with unless told otherwise: moto's index query
/// costs time in proportion to the whole table per page, so the function's default (100)
/// would spend most of a 50,000-job run in the emulator's page overhead. 1,000 entries of a
/// few hundred bytes are well under a query's 1 MB, and the reaper still reads progress
/// records 100 to a `BatchGetItem`. (The expirer keeps its default: its time goes into each
/// job's writes, and bigger pages only make the pages in flight at its budget longer.)
const BENCH_PAGE: usize = 1000;
/// Every how-many-th due success gets its result object in S3: moto's `ListObjectsV2` scans
/// the whole bucket, so 50,000 objects would make every listing of the run slow. The sample
/// shows the deletes; jobs without an object cost the same listings.
const OBJECT_EVERY: usize = 50;

// ------------------------------------------------------------------------------------------
// Item sizes and billed units
// ------------------------------------------------------------------------------------------

/// DynamoDB's size of an attribute value (as jobs.rs measures it).
fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.trim_start_matches('-').len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::M(m) => {
            3 + m.iter().map(|(k, v)| k.len() + value_size(v) + 1).sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        _ => 0,
    }
}

/// DynamoDB's size of an item: attribute names plus values.
fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// Write units of one write of `bytes` (per 1 KB, rounded up).
fn wu(bytes: usize) -> f64 {
    bytes.max(1).div_ceil(1024) as f64
}

/// What a global secondary index holds of an item (`template.yaml`).
#[derive(Debug, Clone, PartialEq)]
enum Projection {
    All,
    KeysOnly,
    Include(BTreeSet<String>),
}

/// A global secondary index of the job table, as the template declares it.
#[derive(Debug, Clone)]
struct Index {
    name: String,
    keys: Vec<String>,
    projection: Projection,
}

/// The job table's keys and indexes, read from the template: how writes and reads are billed.
#[derive(Debug, Clone)]
struct Billing {
    table_keys: Vec<String>,
    indexes: Vec<Index>,
}

impl Billing {
    fn from_template(stack: &LocalStack) -> anyhow::Result<Self> {
        let (_, table) = stack
            .template
            .of_type("AWS::DynamoDB::Table")
            .find(|(name, _)| name.as_str() == "JobsTable")
            .context("JobsTable in the template")?;
        let props = &table["Properties"];
        let names = |schema: &Value| -> Vec<String> {
            schema
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k["AttributeName"].as_str().map(str::to_owned))
                .collect()
        };
        let indexes = props["GlobalSecondaryIndexes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|gsi| {
                let projection = match gsi["Projection"]["ProjectionType"].as_str() {
                    Some("KEYS_ONLY") => Projection::KeysOnly,
                    Some("INCLUDE") => Projection::Include(
                        gsi["Projection"]["NonKeyAttributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|a| a.as_str().map(str::to_owned))
                            .collect(),
                    ),
                    _ => Projection::All,
                };
                Index {
                    name: gsi["IndexName"].as_str().unwrap_or_default().to_owned(),
                    keys: names(&gsi["KeySchema"]),
                    projection,
                }
            })
            .collect();
        Ok(Billing { table_keys: names(&props["KeySchema"]), indexes })
    }

    /// The entry `index` holds for `item` (`None`: the item lacks a key of the index).
    fn entry(&self, index: &Index, item: &Item) -> Option<Item> {
        if index.keys.iter().any(|k| !item.contains_key(k)) {
            return None;
        }
        Some(
            item.iter()
                .filter(|(name, _)| {
                    index.keys.contains(name)
                        || self.table_keys.contains(name)
                        || match &index.projection {
                            Projection::All => true,
                            Projection::KeysOnly => false,
                            Projection::Include(names) => names.contains(*name),
                        }
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// Write units of one write that turned `before` into `after` (`None`: absent): the item
    /// by the larger of its two sizes, and each index as DynamoDB bills it — an entry added or
    /// removed is one write of its size, a key changed is a delete and a put, a projected
    /// attribute changed is one write of the entry; an index the write does not touch costs
    /// nothing.
    fn write_units(&self, before: Option<&Item>, after: Option<&Item>) -> (f64, f64) {
        let size = |i: Option<&Item>| i.map(item_size).unwrap_or(0);
        let base = wu(size(before).max(size(after)));
        let mut indexes = 0.0;
        for index in &self.indexes {
            let old = before.and_then(|b| self.entry(index, b));
            let new = after.and_then(|a| self.entry(index, a));
            indexes += match (&old, &new) {
                (None, None) => 0.0,
                (Some(o), None) => wu(item_size(o)),
                (None, Some(n)) => wu(item_size(n)),
                (Some(o), Some(n)) => {
                    let keys_moved = index.keys.iter().any(|k| o.get(k) != n.get(k));
                    if keys_moved {
                        wu(item_size(o)) + wu(item_size(n))
                    } else if o != n {
                        wu(item_size(o).max(item_size(n)))
                    } else {
                        0.0
                    }
                }
            };
        }
        (base, indexes)
    }
}

/// Read units of a query that read `bytes` of entries, eventually consistent (GSI reads are):
/// the bytes summed over the request, rounded up to 4 KB, half a unit each.
fn query_ru(bytes: f64) -> f64 {
    (bytes / 4096.0).ceil().max(1.0) * 0.5
}

// ------------------------------------------------------------------------------------------
// The stack
// ------------------------------------------------------------------------------------------

/// Functions whose schedule the bench fires itself.
const SCHEDULED: [&str; 2] = ["ReaperFunction", "ExpirerFunction"];

/// The Lambda timeout the bench's copy of the template gives the scheduled functions: the
/// emulator's slowness (a 50,000-job run takes minutes there) must not kill a run that AWS
/// would finish in seconds. Each run is still compared with the template's own timeout.
const LOCAL_TIMEOUT_S: u64 = 900;

/// A copy of the repository root for the bench's stack: the template with the reaper's and
/// the expirer's schedule rates set to a year (the bench fires them) and their timeouts set to
/// [`LOCAL_TIMEOUT_S`], and links to what the template and the stack read beside it (`infra/`,
/// `.venv`), in `target/volume-stack-<label>` (one per stack the bench runs at once). Returns
/// the directory and the template's own timeouts of those functions.
fn stack_root(label: &str) -> anyhow::Result<(PathBuf, BTreeMap<String, Duration>)> {
    let root = longhaul_bench::workspace_root();
    let dir = root.join(format!("target/volume-stack-{label}"));
    std::fs::create_dir_all(&dir)?;
    let (template, mappings) =
        without_stream_mappings(&std::fs::read_to_string(root.join("template.yaml"))?);
    if mappings == 0 {
        bail!("expected DynamoDB stream event sources (`Type: DynamoDB`) in template.yaml");
    }
    let mut patched = String::with_capacity(template.len());
    let mut rates = 0;
    let mut timeouts = BTreeMap::new();
    let mut resource = String::new();
    for line in template.lines() {
        // A resource starts at two spaces of indentation: `  Name:`.
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'))
            && !name.starts_with(' ')
            && !name.contains(' ')
        {
            resource = name.to_owned();
        }
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(at) = line.find("Schedule: rate(") {
            patched.push_str(&line[..at]);
            patched.push_str("Schedule: rate(365 days)");
            rates += 1;
        } else if SCHEDULED.contains(&resource.as_str())
            && indent.len() == 6
            && let Some(seconds) = trimmed.strip_prefix("Timeout:")
        {
            let seconds: u64 = seconds.trim().parse().context("a function's Timeout")?;
            timeouts.insert(resource.clone(), Duration::from_secs(seconds));
            patched.push_str(&format!("{indent}Timeout: {LOCAL_TIMEOUT_S}"));
        } else {
            patched.push_str(line);
        }
        patched.push('\n');
    }
    if rates < 2 || timeouts.len() < 2 {
        bail!(
            "expected the reaper's and the expirer's `Schedule: rate(…)` and `Timeout:` in template.yaml"
        );
    }
    std::fs::write(dir.join("template.yaml"), patched)?;
    for name in ["infra", ".venv"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(root.join(name), &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok((dir, timeouts))
}

/// `template` without its DynamoDB stream event sources (and an `Events:` left empty by
/// that), and how many were removed. The stream consumers (slots, notifier) only read the
/// seeded writes and filter them all out, but the local stack's pollers read them from moto in
/// pages of 1,000 records, which at tens of thousands of seeded items took moto longer than
/// the poller's timeout, again and again, and starved the functions measured here. What they
/// would do for the reaper's few failed jobs (release slots, notify) is not measured.
fn without_stream_mappings(template: &str) -> (String, usize) {
    let lines: Vec<&str> = template.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start().len();
    // Lines deeper than `depth` (or blank) from `from` on: the block they form ends here.
    let block_end = |from: usize, depth: usize| {
        (from..lines.len())
            .find(|&j| !lines[j].trim().is_empty() && indent(lines[j]) <= depth)
            .unwrap_or(lines.len())
    };
    let (mut out, mut removed, mut i) = (Vec::with_capacity(lines.len()), 0, 0);
    while i < lines.len() {
        let line = lines[i];
        if line.trim_end() != "      Events:" {
            out.push(line);
            i += 1;
            continue;
        }
        let end = block_end(i + 1, 6);
        let mut kept = Vec::new();
        let mut event = i + 1;
        while event < end {
            let next = block_end(event + 1, 8).min(end);
            let lines = &lines[event..next];
            if lines.iter().any(|l| l.trim() == "Type: DynamoDB") {
                removed += 1;
            } else {
                kept.extend_from_slice(lines);
            }
            event = next;
        }
        if !kept.is_empty() {
            out.push(line);
            out.extend(kept);
        }
        i = end;
    }
    (out.join("\n") + "\n", removed)
}

/// The thresholds and knobs the scheduled functions run with.
#[derive(Debug, Clone)]
struct Knobs {
    heartbeat_timeout: i64,
    stall: i64,
    stall_grace: i64,
    max_runtime: i64,
    reaper_page: usize,
    expirer_page: usize,
    reaper_budget: u64,
    reaper_timeout: Duration,
    expirer_timeout: Duration,
    reaper_memory_mb: f64,
    expirer_memory_mb: f64,
}

struct Bench {
    stack: LocalStack,
    http: reqwest::Client,
    token: String,
    dynamodb: aws_sdk_dynamodb::Client,
    s3: aws_sdk_s3::Client,
    table: String,
    bucket: String,
    billing: Billing,
    knobs: Knobs,
}

/// One scheduled run, as measured.
#[derive(Debug, Clone, Default)]
struct Run {
    /// 1-based, per function and N.
    index: usize,
    /// Local wall time of the invocation (the emulator's speed, not AWS's), seconds.
    wall_s: f64,
    /// The function's report (`output` of the schedule route), or the error.
    report: Value,
    /// AWS calls the function made, by `service:Operation`.
    calls: BTreeMap<String, u64>,
    /// Seeded jobs first seen handled after this run (reaper: zombies, stalls, timeouts).
    found: usize,
    /// Read and write units, as computed (see the section).
    rru: f64,
    wru: f64,
}

impl Run {
    fn call(&self, op: &str) -> u64 {
        self.calls.get(op).copied().unwrap_or(0)
    }
    fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }
    fn dynamodb_calls(&self) -> u64 {
        self.calls.iter().filter(|(k, _)| k.starts_with("dynamodb:")).map(|(_, v)| v).sum()
    }
    fn number(&self, field: &str) -> u64 {
        self.report.get(field).and_then(Value::as_u64).unwrap_or(0)
    }
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

impl Bench {
    /// Starts a stack of its own (`label` names its directory, see [`stack_root`]).
    async fn start(label: &str) -> anyhow::Result<Self> {
        longhaul_aws::sdk::install_tls_provider();
        let (root, timeouts) = stack_root(label)?;
        let mut options = Options::ephemeral(root);
        let reaper_page = env_usize("LONGHAUL_VOLUME_REAPER_PAGE").unwrap_or(BENCH_PAGE);
        let reaper_budget = env_usize("LONGHAUL_VOLUME_REAPER_BUDGET")
            .map(|b| b as u64)
            .unwrap_or(LOCAL_REAPER_BUDGET_S);
        let expirer_page =
            env_usize("LONGHAUL_VOLUME_EXPIRER_PAGE").unwrap_or(DEFAULT_EXPIRER_PAGE);
        let overrides = [
            // A zombie is failed (its one attempt spent) rather than re-dispatched: a
            // re-dispatch would start thousands of real executions in the emulator. Failing
            // costs the same reads and one write fewer (no progress revocation); see the section.
            ("LONGHAUL_MAX_ATTEMPTS", Some("1".to_owned())),
            // Flagged stalls stay flagged for the bench (not failed as zombies ten minutes
            // later, in the middle of the sweep that measures watching healthy jobs).
            ("LONGHAUL_STALL_GRACE_SECONDS", Some("21600".to_owned())),
            ("LONGHAUL_REAPER_BUDGET_SECONDS", Some(reaper_budget.to_string())),
            ("LONGHAUL_EXPIRER_BUDGET_SECONDS", Some(EXPIRER_BUDGET_S.to_string())),
            ("LONGHAUL_REAPER_PAGE", Some(reaper_page.to_string())),
            ("LONGHAUL_EXPIRER_PAGE", Some(expirer_page.to_string())),
        ];
        for (name, value) in overrides {
            if let Some(value) = value {
                options.env_overrides.insert(name.into(), value);
            }
        }
        let stack = LocalStack::start(options)
            .await
            .context("starting the local stack (make venv first)")?;
        let config = stack.emulator_sdk_config().await;
        let specs = longhaul_local::model::functions(&stack.template)?;
        let spec = |logical: &str| specs.iter().find(|s| s.logical == logical).cloned();
        let reaper = spec("ReaperFunction").context("ReaperFunction")?;
        let expirer = spec("ExpirerFunction").context("ExpirerFunction")?;
        let var = |name: &str, default: i64| {
            reaper.env.get(name).and_then(|v| v.parse().ok()).unwrap_or(default)
        };
        let global = stack.template.function_globals["MemorySize"].as_f64().unwrap_or(128.0);
        let memory = |logical: &str| {
            stack
                .template
                .of_type("AWS::Serverless::Function")
                .find(|(name, _)| name.as_str() == logical)
                .and_then(|(_, r)| r["Properties"]["MemorySize"].as_f64())
                .unwrap_or(global)
        };
        let knobs = Knobs {
            heartbeat_timeout: var("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", 90),
            stall: var("LONGHAUL_STALL_SECONDS", 300),
            stall_grace: var("LONGHAUL_STALL_GRACE_SECONDS", 600),
            max_runtime: reaper
                .env
                .get("LONGHAUL_MAX_RUNTIME_SECONDS_DEMO")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| var("LONGHAUL_MAX_RUNTIME_SECONDS", 86_400)),
            reaper_page,
            expirer_page,
            reaper_budget,
            reaper_timeout: timeouts.get("ReaperFunction").copied().unwrap_or(reaper.timeout),
            expirer_timeout: timeouts.get("ExpirerFunction").copied().unwrap_or(expirer.timeout),
            reaper_memory_mb: memory("ReaperFunction"),
            expirer_memory_mb: memory("ExpirerFunction"),
        };
        Ok(Bench {
            token: stack.token("bench-volume"),
            http: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?,
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            s3: aws_sdk_s3::Client::new(&config),
            table: stack.resource("JobsTable"),
            bucket: stack.resource("DataBucket"),
            billing: Billing::from_template(&stack)?,
            knobs,
            stack,
        })
    }

    async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method.parse()?, format!("{}{path}", self.stack.api_url))
            .bearer_auth(&self.token)
            .header("idempotency-key", uuid::Uuid::new_v4().simple().to_string());
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// An item of the job table, read from the emulator (uncounted).
    async fn item(&self, pk: &str, sk: &str) -> anyhow::Result<Option<Item>> {
        Ok(self
            .dynamodb
            .get_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S(pk.into()))
            .key("sk", AttributeValue::S(sk.into()))
            .consistent_read(true)
            .send()
            .await?
            .item)
    }

    /// Submits a demo job and waits until `ready` holds of its job and progress records.
    async fn real_job(
        &self,
        params: Value,
        ready: impl Fn(&Item, Option<&Item>) -> bool,
    ) -> anyhow::Result<(String, Item, Item)> {
        let (status, reply) =
            self.api("POST", "/jobs", Some(&json!({"type": "demo", "params": params}))).await?;
        if status != 202 {
            bail!("submit answered {status}: {reply}");
        }
        let id = reply["job_id"].as_str().context("job_id")?.to_owned();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pk = format!("JOB#{id}");
            if let Some(job) = self.item(&pk, "JOB").await? {
                let progress = self.item(&pk, "PROGRESS").await?;
                if ready(&job, progress.as_ref()) {
                    return Ok((id, job, progress.context("a progress record")?));
                }
            }
            if Instant::now() > deadline {
                bail!("job {id} did not get ready within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Copies of the items the code writes: a running job with its progress, a succeeded job
    /// with its progress and result objects.
    async fn templates(&self) -> anyhow::Result<Templates> {
        let s = |item: &Item, name: &str| {
            item.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default()
        };
        let n = |item: Option<&Item>, name: &str| {
            item.and_then(|i| i.get(name))
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // A job that works for ten minutes, read once its progress has moved.
        let (running_id, running_job, running_progress) = self
            .real_job(json!({"items": 600, "item_ms": 1000}), |job, progress| {
                s(job, "status") == "running" && n(progress, "items_done") >= 1.0
            })
            .await?;
        let (status, reply) = self.api("POST", &format!("/jobs/{running_id}/cancel"), None).await?;
        if !(200..300).contains(&status) {
            bail!("cancel answered {status}: {reply}");
        }
        let (done_id, done_job, done_progress) = self
            .real_job(json!({"items": 20, "item_ms": 0}), |job, _| s(job, "status") == "succeeded")
            .await?;
        let mut objects = Vec::new();
        for prefix in [format!("results/{done_id}/"), format!("checkpoints/{done_id}/")] {
            let listed =
                self.s3.list_objects_v2().bucket(&self.bucket).prefix(&prefix).send().await?;
            for object in listed.contents() {
                let key = object.key().context("object key")?.to_owned();
                let got = self.s3.get_object().bucket(&self.bucket).key(&key).send().await?;
                let content_type =
                    got.content_type().unwrap_or("application/octet-stream").to_owned();
                let body = got.body.collect().await?.into_bytes().to_vec();
                objects.push((key, content_type, body));
            }
        }
        // The cancelled job has left the index; wait for it so nothing else runs meanwhile.
        let deadline = Instant::now() + Duration::from_secs(60);
        while self
            .item(&format!("JOB#{running_id}"), "JOB")
            .await?
            .is_some_and(|j| s(&j, "status") == "running")
        {
            if Instant::now() > deadline {
                bail!("the template job {running_id} was not cancelled within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Templates {
            running_lease: s(&running_job, "lease"),
            running_id,
            running_job,
            running_progress,
            done_id,
            done_job,
            done_progress,
            objects,
        })
    }

    async fn batch_write(&self, items: Vec<Item>) -> anyhow::Result<()> {
        let chunks: Vec<Vec<Item>> = items.chunks(25).map(<[Item]>::to_vec).collect();
        let mut writes = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let mut requests = chunk
                    .into_iter()
                    .map(|item| {
                        let put = PutRequest::builder().set_item(Some(item)).build()?;
                        anyhow::Ok(WriteRequest::builder().put_request(put).build())
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                while !requests.is_empty() {
                    let output = self
                        .dynamodb
                        .batch_write_item()
                        .request_items(&self.table, requests)
                        .send()
                        .await?;
                    requests = output
                        .unprocessed_items
                        .and_then(|mut u| u.remove(&self.table))
                        .unwrap_or_default();
                }
                anyhow::Ok(())
            })
            .buffer_unordered(4);
        while let Some(result) = writes.next().await {
            result?;
        }
        Ok(())
    }

    /// The job records of `ids`, read from the emulator in batches of 100 (uncounted).
    async fn jobs(&self, ids: &[String]) -> anyhow::Result<HashMap<String, Item>> {
        let chunks: Vec<Vec<String>> = ids.chunks(100).map(<[String]>::to_vec).collect();
        let mut reads = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let mut out = Vec::new();
                let keys = chunk
                    .iter()
                    .map(|id| {
                        HashMap::from([
                            ("pk".to_owned(), AttributeValue::S(format!("JOB#{id}"))),
                            ("sk".to_owned(), AttributeValue::S("JOB".into())),
                        ])
                    })
                    .collect::<Vec<_>>();
                let mut request = Some(KeysAndAttributes::builder().set_keys(Some(keys)).build()?);
                while let Some(keys) = request.take() {
                    let output = self
                        .dynamodb
                        .batch_get_item()
                        .request_items(&self.table, keys)
                        .send()
                        .await?;
                    out.extend(
                        output
                            .responses
                            .and_then(|mut r| r.remove(&self.table))
                            .unwrap_or_default(),
                    );
                    request = output
                        .unprocessed_keys
                        .and_then(|mut u| u.remove(&self.table))
                        .filter(|k| !k.keys.is_empty());
                }
                anyhow::Ok(out)
            })
            .buffer_unordered(4);
        let mut out = HashMap::with_capacity(ids.len());
        while let Some(items) = reads.next().await {
            for item in items? {
                if let Some(id) =
                    item.get("pk").and_then(|v| v.as_s().ok()).and_then(|p| p.strip_prefix("JOB#"))
                {
                    out.insert(id.to_owned(), item);
                }
            }
        }
        Ok(out)
    }

    /// The mean size of a few entries of status-index bucket `bucket` (shard 0), as the
    /// emulator projects them (it follows the template's projection).
    async fn entry_size(&self, bucket: &str) -> anyhow::Result<f64> {
        let page = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .index_name(longhaul_aws::jobs::STATUS_INDEX)
            .key_condition_expression("gsi2pk = :b")
            .expression_attribute_values(":b", AttributeValue::S(format!("{bucket}#0")))
            .limit(25)
            .send()
            .await?;
        let items = page.items();
        if items.is_empty() {
            bail!("no entries in {bucket}#0");
        }
        Ok(items.iter().map(item_size).sum::<usize>() as f64 / items.len() as f64)
    }

    /// The function's AWS calls so far, by operation.
    fn calls_of(&self, function: &str) -> BTreeMap<String, u64> {
        self.stack.calls.by_function().get(function).cloned().unwrap_or_default()
    }

    /// Fires schedule `name` once and measures the run.
    async fn fire(&self, name: &str, function: &str, index: usize) -> anyhow::Result<Run> {
        let before = self.calls_of(function);
        let started = Instant::now();
        let response = self
            .http
            .post(format!("{}/_local/schedules/{name}", self.stack.api_url))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let wall_s = started.elapsed().as_secs_f64();
        let report = if status.is_success() {
            // The function's own report, whole, for whoever reads the bench's log.
            eprintln!("  {name} run {index} report: {}", body["output"]);
            body["output"].clone()
        } else {
            eprintln!("  {name} run {index} failed ({status}): {body}");
            json!({"run_error": body})
        };
        let after = self.calls_of(function);
        let calls = after
            .iter()
            .filter_map(|(op, n)| {
                let delta = n - before.get(op).copied().unwrap_or(0);
                (delta > 0).then(|| (op.clone(), delta))
            })
            .collect();
        Ok(Run { index, wall_s, report, calls, ..Default::default() })
    }
}

// ------------------------------------------------------------------------------------------
// Seeding
// ------------------------------------------------------------------------------------------

/// The real items the seeded ones are copied from.
struct Templates {
    running_id: String,
    running_lease: String,
    running_job: Item,
    running_progress: Item,
    done_id: String,
    done_job: Item,
    done_progress: Item,
    /// Result (and checkpoint) objects of the succeeded job: key, content type, bytes.
    objects: Vec<(String, String, Vec<u8>)>,
}

/// `value` with every `from` replaced by its `to` in every string, at any depth.
fn substitute(value: &AttributeValue, map: &[(&str, &str)]) -> AttributeValue {
    match value {
        AttributeValue::S(s) => {
            let mut s = s.clone();
            for (from, to) in map {
                if !from.is_empty() && s.contains(from) {
                    s = s.replace(from, to);
                }
            }
            AttributeValue::S(s)
        }
        AttributeValue::M(m) => {
            AttributeValue::M(m.iter().map(|(k, v)| (k.clone(), substitute(v, map))).collect())
        }
        AttributeValue::L(l) => AttributeValue::L(l.iter().map(|v| substitute(v, map)).collect()),
        other => other.clone(),
    }
}

fn copy_of(item: &Item, map: &[(&str, &str)]) -> Item {
    item.iter().map(|(k, v)| (k.clone(), substitute(v, map))).collect()
}

fn set(item: &mut Item, name: &str, value: impl Into<String>) {
    item.insert(name.to_owned(), AttributeValue::S(value.into()));
}

/// Every how-many-th running job in claim order is a zombie, stalled, timed out. Every
/// unhealthy job costs the reaper a handful of sequential calls, which at the emulator's speed
/// (not AWS's) would otherwise dominate the bench's time.
const ZOMBIE_EVERY: usize = 400;
const STALLED_EVERY: usize = 800;
const TIMED_OUT_EVERY: usize = 1600;

/// What a seeded running job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Healthy,
    Zombie,
    Stalled,
    TimedOut,
}

impl Kind {
    /// The kind of the `k`-th job in claim order: every [`ZOMBIE_EVERY`]th a zombie, every
    /// [`STALLED_EVERY`]th stalled, every [`TIMED_OUT_EVERY`]th timed out (0.25 %, 0.125 %,
    /// 0.0625 %),
    /// interleaved through the whole order (and so through every shard and page).
    fn at(k: usize) -> Kind {
        if k % ZOMBIE_EVERY == 3 {
            Kind::Zombie
        } else if k % STALLED_EVERY == 11 {
            Kind::Stalled
        } else if k % TIMED_OUT_EVERY == 37 {
            Kind::TimedOut
        } else {
            Kind::Healthy
        }
    }
}

/// The seeded running population.
struct Running {
    /// Unhealthy jobs: kind, and the item as seeded (then as last read).
    watched: BTreeMap<String, (Kind, Item)>,
    healthy: Vec<String>,
    /// Jobs per running-bucket shard.
    per_shard: BTreeMap<String, usize>,
    seconds: f64,
}

async fn seed_running(
    bench: &Bench,
    t: &Templates,
    n: usize,
    now: DateTime<Utc>,
) -> anyhow::Result<Running> {
    let started = Instant::now();
    let k = &bench.knobs;
    let secs = chrono::Duration::seconds;
    let ahead = format_rfc3339(now + chrono::Duration::hours(6));
    let span = chrono::Duration::hours(12) - chrono::Duration::minutes(2);
    let mut items = Vec::with_capacity(2 * n);
    let mut watched = BTreeMap::new();
    let mut healthy = Vec::new();
    let mut per_shard = BTreeMap::new();
    for i in 0..n {
        let kind = Kind::at(i);
        let id = longhaul_domain::JobId::new().to_string();
        let lease = uuid::Uuid::new_v4().simple().to_string();
        let claimed = now - chrono::Duration::hours(12) + span * i as i32 / n.max(1) as i32;
        let map =
            [(t.running_id.as_str(), id.as_str()), (t.running_lease.as_str(), lease.as_str())];
        let mut job = copy_of(&t.running_job, &map);
        let mut progress = copy_of(&t.running_progress, &map);
        let bucket = status_bucket("running", &id.parse()?);
        *per_shard.entry(bucket.clone()).or_default() += 1;
        set(&mut job, "gsi2pk", bucket);
        set(&mut job, "gsi2sk", format_rfc3339(claimed));
        set(&mut job, "updated_at", format_rfc3339(claimed));
        set(&mut job, "started_at", format_rfc3339(claimed));
        job.remove("stalled_at");
        // Healthy: heartbeat and progress fresh for the whole bench.
        let (mut heartbeat, mut changed) = (ahead.clone(), ahead.clone());
        match kind {
            Kind::Healthy => {}
            Kind::Zombie => {
                // Silent for 10 s to 10 min past the timeout.
                let silent = k.heartbeat_timeout + 10 + (i as i64 * 7) % 600;
                heartbeat = format_rfc3339(now - secs(silent));
                changed = heartbeat.clone();
            }
            Kind::Stalled => changed = format_rfc3339(now - secs(k.stall + 100)),
            Kind::TimedOut => {
                // Started past the maximum, claimed again since (a second attempt).
                set(&mut job, "started_at", format_rfc3339(now - secs(k.max_runtime + 3600)));
                job.insert("attempt".into(), AttributeValue::N("2".into()));
                job.insert("dispatches".into(), AttributeValue::N("2".into()));
            }
        }
        set(&mut progress, "heartbeat_at", heartbeat);
        set(&mut progress, "progress_changed_at", changed.clone());
        set(&mut progress, "updated_at", changed);
        if kind == Kind::Healthy {
            healthy.push(id);
        } else {
            watched.insert(id, (kind, job.clone()));
        }
        items.push(job);
        items.push(progress);
    }
    bench.batch_write(items).await?;
    Ok(Running { watched, healthy, per_shard, seconds: started.elapsed().as_secs_f64() })
}

/// The seeded due successes.
struct Due {
    ids: Vec<String>,
    /// A sample (every N/200-th): job and progress as seeded.
    sample: Vec<(String, Item, Item)>,
    seconds: f64,
    objects: usize,
}

async fn seed_due(
    bench: &Bench,
    t: &Templates,
    n: usize,
    now: DateTime<Utc>,
) -> anyhow::Result<Due> {
    let started = Instant::now();
    let span = chrono::Duration::days(7) - chrono::Duration::minutes(1);
    let every = (n / 200).max(1);
    let mut items = Vec::with_capacity(2 * n);
    let mut ids = Vec::with_capacity(n);
    let mut sample = Vec::new();
    let mut objects = Vec::new();
    for i in 0..n {
        let id = longhaul_domain::JobId::new().to_string();
        let expiry = now - chrono::Duration::days(7) + span * i as i32 / n.max(1) as i32;
        let map = [(t.done_id.as_str(), id.as_str())];
        let mut job = copy_of(&t.done_job, &map);
        let progress = copy_of(&t.done_progress, &map);
        set(&mut job, "gsi2pk", status_bucket("succeeded", &id.parse()?));
        set(&mut job, "gsi2sk", format_rfc3339(expiry));
        if i % OBJECT_EVERY == 0 {
            for (key, content_type, body) in &t.objects {
                objects.push((key.replace(&t.done_id, &id), content_type.clone(), body.clone()));
            }
        }
        if i % every == 0 {
            sample.push((id.clone(), job.clone(), progress.clone()));
        }
        ids.push(id);
        items.push(job);
        items.push(progress);
    }
    bench.batch_write(items).await?;
    let count = objects.len();
    let mut puts = futures::stream::iter(objects)
        .map(|(key, content_type, body)| async move {
            bench
                .s3
                .put_object()
                .bucket(&bench.bucket)
                .key(key)
                .content_type(content_type)
                .body(aws_sdk_s3::primitives::ByteStream::from(body))
                .send()
                .await
                .map(|_| ())
        })
        .buffer_unordered(8);
    while let Some(result) = puts.next().await {
        result?;
    }
    Ok(Due { ids, sample, seconds: started.elapsed().as_secs_f64(), objects: count })
}

// ------------------------------------------------------------------------------------------
// The scenarios
// ------------------------------------------------------------------------------------------

/// The reaper at one N.
#[derive(Debug, Default)]
struct ReaperResult {
    n: usize,
    seeded: BTreeMap<Kind, usize>,
    /// Kind → (found, worst run that found one, found with the expected verdict).
    found: BTreeMap<Kind, (usize, usize, usize)>,
    /// Stalled jobs later failed as zombies (still stalled past the grace).
    stalled_then_failed: usize,
    healthy_touched: usize,
    healthy: usize,
    runs: Vec<Run>,
    /// Runs of the last full sweep, once every unhealthy job had been handled (what watching N
    /// healthy jobs costs).
    steady: Vec<usize>,
    seed_s: f64,
    running_entry: f64,
    job_size: usize,
    progress_size: usize,
}

impl ReaperResult {
    fn steady_runs(&self) -> impl Iterator<Item = &Run> {
        self.runs.iter().filter(|r| self.steady.contains(&r.index))
    }
    fn steady_sum(&self, f: impl Fn(&Run) -> f64) -> f64 {
        self.steady_runs().map(f).sum()
    }
}

fn status_of(item: &Item) -> &str {
    item.get("status").and_then(|v| v.as_s().ok()).map(String::as_str).unwrap_or("")
}

fn error_code(item: &Item) -> String {
    item.get("error")
        .and_then(|e| e.as_m().ok())
        .and_then(|m| m.get("code"))
        .and_then(|c| c.as_s().ok())
        .cloned()
        .unwrap_or_default()
}

/// Whether the reaper handled a seeded unhealthy job, and with the verdict its kind calls for.
fn handled(kind: Kind, item: &Item) -> (bool, bool) {
    let status = status_of(item);
    match kind {
        Kind::Healthy => (false, false),
        Kind::Zombie => {
            (status != "running", error_code(item) == "Job.Abandoned" || status == "queued")
        }
        Kind::TimedOut => (status != "running", error_code(item) == "Job.Timeout"),
        Kind::Stalled => {
            let flagged = item.contains_key("stalled_at") || status != "running";
            (flagged, flagged)
        }
    }
}

async fn reaper_scenario(
    bench: &Bench,
    t: &Templates,
    n: usize,
    max_runs: usize,
) -> anyhow::Result<ReaperResult> {
    let now = Utc::now();
    eprintln!("N={n}: seeding {n} running jobs");
    let mut seeded = seed_running(bench, t, n, now).await?;
    eprintln!("  seeded in {:.1} s ({} per shard: {:?})", seeded.seconds, n, seeded.per_shard);
    let mut result = ReaperResult {
        n,
        seed_s: seeded.seconds,
        healthy: seeded.healthy.len(),
        running_entry: bench.entry_size("running").await?,
        job_size: item_size(&t.running_job),
        progress_size: item_size(&t.running_progress),
        ..Default::default()
    };
    for (kind, _) in seeded.watched.values() {
        *result.seeded.entry(*kind).or_default() += 1;
    }
    let ids: Vec<String> = seeded.watched.keys().cloned().collect();
    let mut found_at: HashMap<String, (usize, bool)> = HashMap::new();
    let mut all_found_at = None;
    let mut cycle_start = None;
    let jp_ru = ((result.job_size + result.progress_size) as f64 / 4096.0).ceil();
    for index in 1..=max_runs {
        let mut run = bench.fire("reaper", "ReaperFunction", index).await?;
        // What the run did to the watched jobs (read back uncounted), and what it cost to write.
        let now_items = bench.jobs(&ids).await?;
        let (mut wru, mut found) = (0.0, 0);
        for (id, (kind, last)) in seeded.watched.iter_mut() {
            let Some(item) = now_items.get(id) else { continue };
            if item != last {
                let (base, indexes) = bench.billing.write_units(Some(last), Some(item));
                wru += base + indexes;
                if *kind == Kind::Stalled
                    && status_of(item) == "failed"
                    && status_of(last) == "running"
                {
                    result.stalled_then_failed += 1;
                }
                *last = item.clone();
            }
            let (was_handled, right) = handled(*kind, item);
            if was_handled && !found_at.contains_key(id) {
                found_at.insert(id.clone(), (index, right));
                found += 1;
            }
        }
        // Sweep cursors saved (the only other writes): one small item, 1 unit each.
        let job_writes = run.report["failed"].as_u64().unwrap_or(0)
            + run.number("stalled")
            + run.number("recovered")
            + run.number("redispatched")
            + run.number("backfilled");
        let cursor_writes = run.call("dynamodb:UpdateItem").saturating_sub(job_writes);
        run.wru = wru + cursor_writes as f64;
        // Reads: the cursor item; every index query by the entries it read (the counts of the
        // live buckets read them all, the sweeps what they examined); a progress record per
        // examined running entry (BatchGetItem, eventually consistent); a consistent query of
        // job and progress per job that did not look healthy.
        let active: u64 = run.report["active"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        let examined = run.number("examined");
        let views = job_writes + run.number("raced") + run.number("errors");
        let index_queries = run.call("dynamodb:Query").saturating_sub(views);
        let index_bytes = (active + examined) as f64 * result.running_entry;
        run.rru = run.call("dynamodb:GetItem") as f64
            + index_bytes / 8192.0
            + 0.25 * index_queries as f64
            + examined as f64 * 0.5 * (result.progress_size as f64 / 4096.0).ceil()
            + views as f64 * jp_ru;
        run.found = found;
        eprintln!(
            "  reaper run {index}: {:.1} s, examined {examined}, found {found}, unfinished {}, calls {}",
            run.wall_s,
            run.number("unfinished"),
            run.total_calls()
        );
        let unfinished = run.number("unfinished");
        let errored = run.report.get("run_error").is_some();
        result.runs.push(run);
        if all_found_at.is_none() && found_at.len() == ids.len() {
            all_found_at = Some(index);
        }
        // Once all are found, the next full sweep is the steady cost: it starts with the run
        // after one that ended a sweep (no unfinished shard), and ends with the next such run.
        let ended_sweep = |run: Option<&Run>| {
            run.is_some_and(|r| r.number("unfinished") == 0 && r.report.get("run_error").is_none())
        };
        if cycle_start.is_none()
            && all_found_at.is_some_and(|at| at < index)
            && ended_sweep(index.checked_sub(2).and_then(|i| result.runs.get(i)))
        {
            cycle_start = Some(index);
        }
        if let Some(start) = cycle_start
            && unfinished == 0
            && !errored
        {
            result.steady = (start..=index).collect();
            break;
        }
    }
    for (id, (kind, _)) in &seeded.watched {
        if let Some((run, right)) = found_at.get(id) {
            let entry = result.found.entry(*kind).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(*run);
            entry.2 += usize::from(*right);
        }
    }
    // No healthy job was touched.
    let healthy = bench.jobs(&seeded.healthy).await?;
    result.healthy_touched = healthy
        .values()
        .filter(|j| status_of(j) != "running" || j.contains_key("stalled_at"))
        .count()
        + seeded.healthy.len().saturating_sub(healthy.len());
    Ok(result)
}

/// The expirer at one N.
#[derive(Debug, Default)]
struct ExpirerResult {
    n: usize,
    runs: Vec<Run>,
    expired: usize,
    finished: usize,
    objects_left: usize,
    objects_seeded: usize,
    seed_s: f64,
    due_entry: f64,
    /// Write units per expired job (sampled), split as item / indexes.
    wru_per_job: (f64, f64),
}

async fn expirer_scenario(
    bench: &Bench,
    t: &Templates,
    n: usize,
    max_runs: usize,
) -> anyhow::Result<ExpirerResult> {
    let now = Utc::now();
    eprintln!("N={n}: seeding {n} due successes");
    let due = seed_due(bench, t, n, now).await?;
    eprintln!("  seeded in {:.1} s ({} objects)", due.seconds, due.objects);
    let mut result = ExpirerResult {
        n,
        seed_s: due.seconds,
        objects_seeded: due.objects,
        due_entry: bench.entry_size("succeeded").await?,
        ..Default::default()
    };
    let page = bench.knobs.expirer_page as f64;
    for index in 1..=max_runs {
        let mut run = bench.fire("expirer", "ExpirerFunction", index).await?;
        let expired = run.number("expired") as f64;
        let pages = run.number("pages").max(1) as f64;
        let read = expired + run.number("resumed") as f64;
        // Index pages by the entries they read (rounded per page), eventually consistent.
        run.rru = pages * query_ru(result.due_entry * (read / pages).min(page));
        eprintln!(
            "  expirer run {index}: {:.1} s, expired {}, finished {}, pages {}, budget spent {}",
            run.wall_s,
            run.number("expired"),
            run.number("finished"),
            run.number("pages"),
            run.report["budget_spent"]
        );
        let done = run.number("expired") == 0
            && run.number("finished") == 0
            && run.report["budget_spent"] != json!(true)
            && run.report.get("run_error").is_none();
        result.runs.push(run);
        if done {
            break;
        }
    }
    // Write units per expired job, from the sample's images: the expiring transition (the entry
    // moves to the `expired` bucket), then the follow-up marking progress and job (the entry
    // leaves the index).
    let sample_ids: Vec<String> = due.sample.iter().map(|(id, _, _)| id.clone()).collect();
    let after = bench.jobs(&sample_ids).await?;
    let (mut base, mut indexes, mut counted) = (0.0, 0.0, 0.0f64);
    for (id, before, progress) in &due.sample {
        let Some(last) = after.get(id) else { continue };
        if status_of(last) != "expired" {
            continue;
        }
        let mut middle = last.clone();
        set(&mut middle, "gsi2pk", status_bucket("expired", &id.parse()?));
        set(&mut middle, "gsi2sk", format_rfc3339(now));
        let p_after = bench.item(&format!("JOB#{id}"), "PROGRESS").await?;
        for (b, a) in [
            (Some(before), Some(&middle)),
            (Some(progress), p_after.as_ref()),
            (Some(&middle), Some(last)),
        ] {
            let (x, y) = bench.billing.write_units(b, a);
            base += x;
            indexes += y;
        }
        counted += 1.0;
    }
    result.wru_per_job = (base / counted.max(1.0), indexes / counted.max(1.0));
    let per_job = result.wru_per_job.0 + result.wru_per_job.1;
    for run in &mut result.runs {
        run.wru = run.number("expired") as f64 * per_job;
    }
    let final_jobs = bench.jobs(&due.ids).await?;
    result.expired = final_jobs.values().filter(|j| status_of(j) == "expired").count();
    result.finished = final_jobs
        .values()
        .filter(|j| status_of(j) == "expired" && !j.contains_key("gsi2pk"))
        .count();
    let mut token = None;
    loop {
        let page = bench
            .s3
            .list_objects_v2()
            .bucket(&bench.bucket)
            .prefix("results/")
            .set_continuation_token(token)
            .send()
            .await?;
        result.objects_left += page
            .contents()
            .iter()
            .filter(|o| o.key().is_some_and(|k| !k.contains(&t.done_id)))
            .count();
        token = page.next_continuation_token.clone();
        if token.is_none() {
            break;
        }
    }
    Ok(result)
}

// ------------------------------------------------------------------------------------------
// The report
// ------------------------------------------------------------------------------------------

fn num(x: f64) -> String {
    let x = x + 0.0;
    if x.abs() >= 100.0 || (x - x.round()).abs() < 1e-9 {
        let s = format!("{:.0}", x.round());
        // thousands separators
        let (sign, digits) = s.strip_prefix('-').map(|d| ("-", d)).unwrap_or(("", s.as_str()));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn money(d: f64) -> String {
    let d = d + 0.0;
    if d >= 100.0 {
        format!("${}", num(d))
    } else if d >= 1.0 {
        format!("${d:.2}")
    } else {
        format!("${d:.3}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 { format!("{:.1}×", a / b) } else { "–".into() }
}

fn ops(calls: &BTreeMap<String, u64>) -> String {
    calls.iter().map(|(k, v)| format!("`{k}` {}", num(*v as f64))).collect::<Vec<_>>().join(", ")
}

fn sum_calls<'a>(runs: impl Iterator<Item = &'a Run>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for run in runs {
        for (k, v) in &run.calls {
            *out.entry(k.clone()).or_default() += v;
        }
    }
    out
}

struct Setup {
    knobs: Knobs,
    billing: Billing,
    running_job: usize,
    running_progress: usize,
    done_job: usize,
    done_progress: usize,
    objects: usize,
    object_bytes: usize,
    reaper_page: usize,
    expirer_page: usize,
    in_flight: usize,
}

fn projection_text(billing: &Billing) -> String {
    billing
        .indexes
        .iter()
        .map(|i| {
            let p = match &i.projection {
                Projection::All => "ALL".to_owned(),
                Projection::KeysOnly => "KEYS_ONLY".to_owned(),
                Projection::Include(a) => {
                    format!("INCLUDE {}", a.iter().cloned().collect::<Vec<_>>().join(", "))
                }
            };
            format!("`{}` {p}", i.name)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What one reaper run reads with `n` healthy running jobs (the calls the code makes).
struct ReaperModel {
    page: usize,
    count_queries: f64,
    sweep_queries: f64,
    batches: f64,
    index_rru: f64,
    progress_rru: f64,
}

/// One row of the growth table: a quantity read off a reaper and an expirer result.
type GrowthMeasure = Box<dyn Fn(&ReaperResult, &ExpirerResult) -> f64>;

impl ReaperModel {
    fn new(n: f64, page: usize, entry: f64, progress: usize) -> Self {
        let shards = STATUS_SHARDS as f64;
        let per_shard = n / shards;
        let pages = (per_shard / page as f64).ceil();
        // The counts read every live bucket shard by shard in 1 MB pages (the empty pending and
        // queued shards one query each); the sweeps page the running shards (and query the
        // empty ones once).
        let count_queries =
            shards * (per_shard * entry / 1_048_576.0).ceil().max(1.0) + 2.0 * shards;
        let sweep_queries = shards * pages + 2.0 * shards;
        let batches = shards * pages * (page as f64 / 100.0).ceil();
        let index_rru = 2.0 * n * entry / 8192.0 + 0.25 * (count_queries + sweep_queries);
        let progress_rru = n * 0.5 * (progress as f64 / 4096.0).ceil();
        ReaperModel { page, count_queries, sweep_queries, batches, index_rru, progress_rru }
    }
    fn requests(&self) -> f64 {
        1.0 + self.count_queries + self.sweep_queries + self.batches
    }
    fn rru(&self) -> f64 {
        1.0 + self.index_rru + self.progress_rru
    }
    /// The counts, one query after another.
    fn count_s(&self, ms: f64) -> f64 {
        self.count_queries * ms / 1000.0
    }
    /// One running shard's sweep: its queries and batch reads one after another.
    fn sweep_s(&self, ms: f64) -> f64 {
        let shards = STATUS_SHARDS as f64;
        (self.sweep_queries - 2.0 * shards + self.batches) / shards * ms / 1000.0
    }
}

fn report(
    setup: &Setup,
    reapers: &[ReaperResult],
    expirers: &[ExpirerResult],
    total_s: f64,
) -> String {
    let mut md = String::new();
    let w = &mut md;
    let k = &setup.knobs;
    let shards = STATUS_SHARDS as f64;
    let _ = writeln!(w, "## Volume: every running job watched, every due result expired\n");
    let _ = writeln!(
        w,
        "`make bench-volume` (tests/bench/src/bin/volume.rs) seeds the job table of a fresh local stack \
         directly — copies of the items the code wrote for a real demo job while it ran and for one that \
         succeeded, so the status index holds what `template.yaml` projects ({}) — with N running jobs, and \
         that of a second stack beside it with N due successes, and runs the hosted reaper (on the first) \
         and expirer (on the second, at the same time: each emulator has about one of the machine's two \
         cores) as their schedules would \
         (`POST /_local/schedules/…`, one run after another, each with its template timeout: reaper {} s, \
         expirer {} s). Of the running jobs, in claim order spread over 12 hours (every shard and page), \
         every {}th is a **zombie** (silent {}–{} s, timeout {} s), every {}th **stalled** (heartbeating, \
         progress still for {} s, threshold {} s; flagged — the grace after which a flagged job is failed as a zombie is set to {} s here, so that the flags stay put while the steady sweep is measured), every {}th **timed out** (started {} s ago, maximum {} s); \
         the healthy rest have heartbeats stamped hours ahead (their workers' writes are not what is \
         measured). Zombies are failed, not re-dispatched (`LONGHAUL_MAX_ATTEMPTS=1`: a re-dispatch would \
         start thousands of real executions in the emulator); a re-dispatch reads the same and writes one \
         item more (it revokes the progress record) and starts an execution. Due successes have their \
         result retention passed (spread over the last week); every {}th has its result ({} object(s) of {} bytes) \
         in S3 (moto's `ListObjectsV2` scans the whole bucket; every job's prefixes are listed all the same). \
         Pages: reaper `LONGHAUL_REAPER_PAGE` {}, expirer `LONGHAUL_EXPIRER_PAGE` {} (the functions' defaults \
         are 100 and 200; moto's query costs time in proportion to the whole table per page, so the bench \
         reads the reaper's bucket in bigger pages — billed units barely depend on it, and the projection \
         shows both); budgets: reaper {} s here (the template's default is {} s: at the emulator's pace a \
         40 s run would cut a 50,000-job sweep into a dozen runs that AWS does not need — the projection \
         below sets AWS's sweep time against the 40 s, and tests/tests/sweeps.rs tests the cursor that carries \
         a cut sweep into the next run), expirer {} s; {} shards per status; the expirer handles {} jobs at \
         once per shard. The bench's copy of the template gives both functions a {} s timeout so that the emulator's \
         slowness does not kill a run (a run it stops anyway is named below the runs' table); the \
         DynamoDB stream mappings (slots, notifier) are left out of the bench's stacks — they would \
         only read the seeded writes, and moto serialising those pages for them starved the functions \
         measured. Every run is compared with the template's own timeout.\n",
        projection_text(&setup.billing),
        k.reaper_timeout.as_secs(),
        k.expirer_timeout.as_secs(),
        ZOMBIE_EVERY,
        k.heartbeat_timeout + 10,
        k.heartbeat_timeout + 609,
        k.heartbeat_timeout,
        STALLED_EVERY,
        k.stall + 100,
        k.stall,
        k.stall_grace,
        TIMED_OUT_EVERY,
        k.max_runtime + 3600,
        k.max_runtime,
        OBJECT_EVERY,
        setup.objects,
        setup.object_bytes,
        setup.reaper_page,
        setup.expirer_page,
        k.reaper_budget,
        REAPER_BUDGET_S,
        EXPIRER_BUDGET_S,
        STATUS_SHARDS,
        setup.in_flight,
        LOCAL_TIMEOUT_S,
    );
    let _ = writeln!(
        w,
        "**How units are computed** (moto does not bill): item sizes are measured (attribute names plus values) — \
         running job record {} B, its progress record {} B, succeeded job record {} B, its progress {} B; index entries \
         are read back from the emulator's index (which projects as the template says). Reads: a query is billed by \
         the bytes of the entries it read, rounded up to 4 KB per request, half a unit each (index reads are eventually \
         consistent) — the sweeps' pages and the reaper's `ActiveJobs` counts (`Select=COUNT` reads every entry of a \
         bucket all the same); each progress record in a `BatchGetItem` is half a unit (≤ 4 KB, eventually \
         consistent); the consistent query of job and progress for a job that did not look healthy is one unit per 4 KB; \
         the cursor `GetItem` one. Writes: every change of a seeded job (read back after each run) is billed as DynamoDB \
         does — the item by its larger size per 1 KB, and each index entry added, removed (1 write), moved to another \
         key (2) or with a projected attribute changed (1), by the entry's size per 1 KB; a sweep cursor save is one \
         unit. Requests are the edge's counts of the function's calls. Wall times are **local**: moto's index query scans \
         the whole table per page, so they grow faster than N here and say nothing about AWS.\n",
        setup.running_job, setup.running_progress, setup.done_job, setup.done_progress
    );

    // Reaper: found.
    let _ = writeln!(w, "### Reaper: every zombie, stall and timeout found\n");
    let _ = writeln!(
        w,
        "| N running | zombies found / seeded | stalled flagged / seeded | timed out failed / seeded | right verdict | worst delay past the threshold (runs) | healthy jobs touched | runs until all found | runs per full sweep (local) |"
    );
    let _ = writeln!(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in reapers {
        let f = |kind: Kind| r.found.get(&kind).copied().unwrap_or_default();
        let s = |kind: Kind| r.seeded.get(&kind).copied().unwrap_or_default();
        let right: usize = r.found.values().map(|v| v.2).sum();
        let all: usize = r.seeded.values().sum();
        let worst = r.found.values().map(|v| v.1).max().unwrap_or(0);
        let until = r
            .runs
            .iter()
            .scan(0, |acc, run| {
                *acc += run.found;
                Some((run.index, *acc))
            })
            .find(|(_, acc)| *acc >= all)
            .map(|(i, _)| i.to_string())
            .unwrap_or_else(|| "not all".into());
        let _ = writeln!(
            w,
            "| {} | {} / {} | {} / {} | {} / {} | {} / {} | {} | {} of {} | {} | {} |",
            num(r.n as f64),
            num(f(Kind::Zombie).0 as f64),
            num(s(Kind::Zombie) as f64),
            num(f(Kind::Stalled).0 as f64),
            num(s(Kind::Stalled) as f64),
            num(f(Kind::TimedOut).0 as f64),
            num(s(Kind::TimedOut) as f64),
            num(right as f64),
            num(all as f64),
            worst,
            r.healthy_touched,
            num(r.healthy as f64),
            until,
            r.steady.len().max(1),
        );
    }
    let _ = writeln!(
        w,
        "\nEvery unhealthy job was past its threshold before the first run, so the delay is the run that \
         found it (1 = the first run after the threshold passed). A run sweeps until its budget; a sweep the \
         budget cuts saves its cursor and the next run resumes it (with the bench's budget of {} s, only if \
         the emulator needs longer than that); the projection below says how many runs a sweep takes in AWS.\n",
        k.reaper_budget
    );

    // Reaper: per run.
    let _ = writeln!(w, "**Reaper runs** (local wall times are moto's):\n");
    let _ = writeln!(
        w,
        "| N | run | wall s (local) | fits {} s timeout | entries examined | found | unfinished shards | requests | DynamoDB requests by operation | other requests | RRU | WRU |",
        k.reaper_timeout.as_secs()
    );
    let _ = writeln!(w, "|--:|--:|--:|---|--:|--:|--:|--:|---|---|--:|--:|");
    for r in reapers {
        for run in &r.runs {
            let (ddb, other): (BTreeMap<_, _>, BTreeMap<_, _>) = run
                .calls
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .partition(|(k, _)| k.starts_with("dynamodb:"));
            let _ = writeln!(
                w,
                "| {} | {}{} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(r.n as f64),
                run.index,
                if r.steady.contains(&run.index) { " (steady)" } else { "" },
                run.wall_s,
                if run.wall_s < k.reaper_timeout.as_secs_f64() { "yes" } else { "**no**" },
                num(run.number("examined") as f64),
                run.found,
                run.number("unfinished"),
                num(run.total_calls() as f64),
                ops(&ddb),
                if other.is_empty() { "–".into() } else { ops(&other) },
                num(run.rru),
                num(run.wru),
            );
        }
    }
    let _ = writeln!(
        w,
        "\n\"(steady)\": the full sweep after everything was handled — what watching N healthy running jobs \
         costs every minute.\n"
    );
    let killed: Vec<String> = reapers
        .iter()
        .flat_map(|r| {
            r.runs
                .iter()
                .filter(|run| run.report.get("run_error").is_some())
                .map(|run| format!("N = {} run {}", num(r.n as f64), run.index))
        })
        .collect();
    if !killed.is_empty() {
        let _ = writeln!(
            w,
            "Stopped by the bench's own {LOCAL_TIMEOUT_S} s timeout: {}. Locally a page takes minutes \
             once a sweep meets many unhealthy jobs (each one's consistent query scans the whole table \
             in moto), so the last pages a run started before its {} s budget ran out outlasted the \
             timeout. Such a run's own report is lost (entries examined 0); what it did is read from \
             the job records (found, WRU) and the edge (requests); its RRU, computed from the report, \
             is not known. A shard it was cutting saved no \
             cursor, so the next run re-read that shard from its last saved one — entries read twice, \
             none skipped.\n",
            killed.join(", "),
            k.reaper_budget,
        );
    }

    // Expirer.
    let _ = writeln!(w, "### Expirer: every due result expired\n");
    let _ = writeln!(
        w,
        "| N due | expired / seeded | follow-up finished | result objects left | runs that expired jobs | WRU per job (item + indexes) |"
    );
    let _ = writeln!(w, "|--:|--:|--:|--:|--:|--:|");
    for e in expirers {
        let _ = writeln!(
            w,
            "| {} | {} / {} | {} | {} of {} | {} | {:.1} ({} + {}) |",
            num(e.n as f64),
            num(e.expired as f64),
            num(e.n as f64),
            num(e.finished as f64),
            e.objects_left,
            num(e.objects_seeded as f64),
            e.runs.iter().filter(|r| r.number("expired") > 0).count(),
            e.wru_per_job.0 + e.wru_per_job.1,
            num(e.wru_per_job.0),
            num(e.wru_per_job.1),
        );
    }
    let _ = writeln!(w, "\n**Expirer runs** (local wall times are moto's):\n");
    let _ = writeln!(
        w,
        "| N | run | wall s (local) | fits {} s timeout | expired | index pages | budget spent | requests | DynamoDB requests by operation | other requests | RRU | WRU |",
        k.expirer_timeout.as_secs()
    );
    let _ = writeln!(w, "|--:|--:|--:|---|--:|--:|---|--:|---|---|--:|--:|");
    for e in expirers {
        for run in &e.runs {
            let (ddb, other): (BTreeMap<_, _>, BTreeMap<_, _>) = run
                .calls
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .partition(|(k, _)| k.starts_with("dynamodb:"));
            let _ = writeln!(
                w,
                "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(e.n as f64),
                run.index,
                run.wall_s,
                if run.wall_s < k.expirer_timeout.as_secs_f64() { "yes" } else { "**no**" },
                num(run.number("expired") as f64),
                run.number("pages"),
                if run.report["budget_spent"] == json!(true) { "yes" } else { "no" },
                num(run.total_calls() as f64),
                ops(&ddb),
                if other.is_empty() { "–".into() } else { ops(&other) },
                num(run.rru),
                num(run.wru),
            );
        }
    }

    // Growth.
    let _ = writeln!(w, "\n### Growth with N\n");
    let _ = writeln!(
        w,
        "Ratios between consecutive N within this run (N grows {}); linear growth is the N ratio itself.\n",
        reapers
            .windows(2)
            .map(|p| ratio(p[1].n as f64, p[0].n as f64))
            .collect::<Vec<_>>()
            .join(", then ")
    );
    let _ = writeln!(
        w,
        "| quantity | {} |{}",
        reapers.iter().map(|r| format!("N = {}", num(r.n as f64))).collect::<Vec<_>>().join(" | "),
        reapers
            .windows(2)
            .map(|p| format!(" {} → {} |", num(p[0].n as f64), num(p[1].n as f64)))
            .collect::<String>()
    );
    let _ = writeln!(w, "|---|{}", "--:|".repeat(reapers.len() + reapers.len().saturating_sub(1)));
    let rows: Vec<(&str, GrowthMeasure)> = vec![
        (
            "reaper, steady sweep: requests",
            Box::new(|r, _| r.steady_sum(|x| x.total_calls() as f64)),
        ),
        (
            "reaper, steady sweep: DynamoDB requests",
            Box::new(|r, _| r.steady_sum(|x| x.dynamodb_calls() as f64)),
        ),
        (
            "reaper, steady sweep: entries read (examined + counted)",
            Box::new(|r, _| {
                r.steady_sum(|x| {
                    x.number("examined") as f64
                        + x.report["active"]
                            .as_object()
                            .map(|m| m.values().filter_map(Value::as_u64).sum::<u64>())
                            .unwrap_or(0) as f64
                })
            }),
        ),
        ("reaper, steady sweep: RRU", Box::new(|r, _| r.steady_sum(|x| x.rru))),
        ("reaper, steady sweep: local wall s (moto)", Box::new(|r, _| r.steady_sum(|x| x.wall_s))),
        ("reaper, all runs: WRU", Box::new(|r, _| r.runs.iter().map(|x| x.wru).sum())),
        (
            "expirer, all runs: requests",
            Box::new(|_, e| e.runs.iter().map(|x| x.total_calls() as f64).sum()),
        ),
        ("expirer, all runs: RRU", Box::new(|_, e| e.runs.iter().map(|x| x.rru).sum())),
        ("expirer, all runs: WRU", Box::new(|_, e| e.runs.iter().map(|x| x.wru).sum())),
        (
            "expirer, all runs: local wall s (moto)",
            Box::new(|_, e| e.runs.iter().map(|x| x.wall_s).sum()),
        ),
    ];
    for (label, f) in &rows {
        let values: Vec<f64> = reapers.iter().zip(expirers).map(|(r, e)| f(r, e)).collect();
        let _ = write!(w, "| {label} |");
        for v in &values {
            let _ = write!(w, " {} |", num(*v));
        }
        for p in values.windows(2) {
            let _ = write!(w, " {} |", ratio(p[1], p[0]));
        }
        let _ = writeln!(w);
    }

    // Projection.
    if let (Some(r), Some(e)) = (reapers.last(), expirers.last()) {
        let _ = writeln!(w, "\n### On paper: 1,000,000 running jobs\n");
        let big = 1e6;
        let models: Vec<ReaperModel> = BTreeSet::from([DEFAULT_REAPER_PAGE, setup.reaper_page])
            .into_iter()
            .map(|page| ReaperModel::new(big, page, r.running_entry, r.progress_size))
            .collect();
        // Measured, scaled: the steady sweep at the largest N, per entry it examined.
        let examined = r.steady_sum(|x| x.number("examined") as f64).max(1.0);
        let measured_requests = r.steady_sum(|x| x.total_calls() as f64) / examined * big;
        let measured_rru = r.steady_sum(|x| x.rru) / examined * big;
        let _ = writeln!(
            w,
            "A reaper run (every minute) with 1,000,000 healthy running jobs, {} shards of the running bucket \
             ({} each), index entries of {:.0} B and progress records of {} B (measured), a `BatchGetItem` per \
             100 progress records. The model counts the calls the code makes; the last column scales what the \
             steady sweep at N = {} made per entry it examined (page {}).\n",
            STATUS_SHARDS,
            num(big / shards),
            r.running_entry,
            r.progress_size,
            num(r.n as f64),
            setup.reaper_page,
        );
        let _ = write!(w, "| per reaper run |");
        for m in &models {
            let _ = write!(w, " page {} |", m.page);
        }
        let _ = writeln!(w, " measured at N = {}, × 1M / examined |", num(r.n as f64));
        let _ = writeln!(w, "|---|{}--:|", "--:|".repeat(models.len()));
        let row =
            |w: &mut String, label: &str, f: &dyn Fn(&ReaperModel) -> String, last: String| {
                let _ = write!(w, "| {label} |");
                for m in &models {
                    let _ = write!(w, " {} |", f(m));
                }
                let _ = writeln!(w, " {last} |");
            };
        row(
            w,
            "`ActiveJobs` count queries (1 MB pages of entries, every live bucket)",
            &|m| num(m.count_queries),
            String::new(),
        );
        row(w, "sweep index queries", &|m| num(m.sweep_queries), String::new());
        row(w, "`BatchGetItem` of progress records", &|m| num(m.batches), String::new());
        row(w, "requests in all", &|m| num(m.requests()), num(measured_requests));
        row(w, "RRU: index entries (counts + sweep)", &|m| num(m.index_rru), String::new());
        row(w, "RRU: progress records", &|m| num(m.progress_rru), String::new());
        row(w, "RRU in all", &|m| num(m.rru()), num(measured_rru));
        for ms in [5.0, 10.0] {
            row(
                w,
                &format!(
                    "AWS time at {ms:.0} ms a call: counts (one query after another) + one shard's sweep (shards side by side)"
                ),
                &|m| format!("{:.0} s + {:.0} s", m.count_s(ms), m.sweep_s(ms)),
                String::new(),
            );
            row(
                w,
                &format!(
                    "runs per full sweep at {ms:.0} ms (budget {REAPER_BUDGET_S} s from the end of the counts)"
                ),
                &|m| num((m.sweep_s(ms) / REAPER_BUDGET_S as f64).ceil().max(1.0)),
                String::new(),
            );
            row(
                w,
                &format!(
                    "a run fits the {} s timeout at {ms:.0} ms (counts + at most the budget)",
                    k.reaper_timeout.as_secs()
                ),
                &|m| {
                    let run = m.count_s(ms) + m.sweep_s(ms).min(REAPER_BUDGET_S as f64);
                    if run < k.reaper_timeout.as_secs_f64() {
                        format!("yes ({run:.0} s)")
                    } else {
                        format!("**no** ({run:.0} s)")
                    }
                },
                String::new(),
            );
        }
        let m = models.iter().find(|m| m.page == DEFAULT_REAPER_PAGE).unwrap_or(&models[0]);
        let month_rru = m.rru() * MINUTES_PER_MONTH;
        let gb = k.reaper_memory_mb / 1024.0;
        let lambda_month = |ms: f64| {
            let run = m.count_s(ms) + m.sweep_s(ms).min(REAPER_BUDGET_S as f64);
            MINUTES_PER_MONTH * (run * gb * GB_S_PRICE + LAMBDA_REQUEST_PRICE)
        };
        let heartbeats = big * 2.0 * MINUTES_PER_MONTH * WRU_PRICE;
        let _ = writeln!(
            w,
            "\n**$ per month** (43,800 runs, page {}): DynamoDB reads {} RRU = **{}** — progress records {}, \
             the sweep's index pages {}, the counts {}; Lambda at {} MB for the run's time at 5–10 ms a call {}–{}. \
             For scale: those jobs' own heartbeats (at least one 1-WRU progress write every 30 s per job) cost {} a \
             month, so the reaper reads for {:.0}% of that (far less for jobs that write progress every 2 s).\n",
            m.page,
            num(month_rru),
            money(month_rru * RRU_PRICE),
            money(m.progress_rru * MINUTES_PER_MONTH * RRU_PRICE),
            money(m.index_rru / 2.0 * MINUTES_PER_MONTH * RRU_PRICE),
            money(m.index_rru / 2.0 * MINUTES_PER_MONTH * RRU_PRICE),
            k.reaper_memory_mb,
            money(lambda_month(5.0)),
            money(lambda_month(10.0)),
            money(heartbeats),
            100.0 * month_rru * RRU_PRICE / heartbeats,
        );
        // Expirer: per job, from the largest N.
        let expired: f64 = e.runs.iter().map(|x| x.number("expired") as f64).sum::<f64>().max(1.0);
        let calls = sum_calls(e.runs.iter());
        let per = |op: &str| calls.get(op).copied().unwrap_or(0) as f64 / expired;
        let objects = (e.objects_seeded as f64).max(1.0);
        // Every job with its result object: the measured calls, plus a delete for each job the
        // sample left without one.
        let deletes = per("s3:DeleteObject") * expired / objects;
        let per_job_calls =
            calls.values().sum::<u64>() as f64 / expired - per("s3:DeleteObject") + deletes;
        let lists = per("s3:ListObjectsV2") + per("s3:ListObjects");
        let wru_job = e.wru_per_job.0 + e.wru_per_job.1;
        let rru_job = e.runs.iter().map(|x| x.rru).sum::<f64>() / expired;
        let lanes = setup.in_flight as f64 * shards;
        let secs = |jobs: f64, ms: f64| jobs / lanes * per_job_calls * ms / 1000.0;
        let day = 1e6;
        let month = day * 30.4;
        let calls_by_kind = format!(
            "DynamoDB {:.2} (`UpdateItem` {:.2}, `Query` {:.3}), `s3:ListObjectsV2` {:.2}, `s3:DeleteObject` {:.2}",
            per("dynamodb:UpdateItem") + per("dynamodb:Query"),
            per("dynamodb:UpdateItem"),
            per("dynamodb:Query"),
            lists,
            deletes
        );
        let _ = writeln!(
            w,
            "**Expirer at a million successes a day** (~41,700 due per hourly run), per job as measured at N = {} \
             (each with its result object): {:.2} requests — {} — {:.2} WRU, {:.3} RRU. A month (30.4 M jobs): \
             DynamoDB {} + S3 LIST {} = **{}**, plus Lambda ({} MB, 730 runs) {}–{}. Time in AWS: a job's calls run \
             one after another, {} jobs at once per shard × {} shards: an hourly run of 41,700 takes ~{:.0}–{:.0} s \
             at 5–10 ms a call (budget {} s); a backlog of 1,000,000 takes ~{:.0}–{:.0} s, i.e. {}–{} runs.\n",
            num(e.n as f64),
            per_job_calls,
            calls_by_kind,
            wru_job,
            rru_job,
            money(month * (wru_job * WRU_PRICE + rru_job * RRU_PRICE)),
            money(month * lists * S3_LIST_PRICE),
            money(month * (wru_job * WRU_PRICE + rru_job * RRU_PRICE + lists * S3_LIST_PRICE)),
            k.expirer_memory_mb,
            money(730.0 * secs(41_700.0, 5.0) * k.expirer_memory_mb / 1024.0 * GB_S_PRICE),
            money(730.0 * secs(41_700.0, 10.0) * k.expirer_memory_mb / 1024.0 * GB_S_PRICE),
            setup.in_flight,
            STATUS_SHARDS,
            secs(41_700.0, 5.0),
            secs(41_700.0, 10.0),
            EXPIRER_BUDGET_S,
            secs(big, 5.0),
            secs(big, 10.0),
            (secs(big, 5.0) / EXPIRER_BUDGET_S as f64).ceil(),
            (secs(big, 10.0) / EXPIRER_BUDGET_S as f64).ceil(),
        );
    }
    let _ = writeln!(
        w,
        "Local seeding: {}. Whole bench {:.0} s on this machine.\n",
        reapers
            .iter()
            .zip(expirers)
            .map(|(r, e)| format!(
                "N = {}: running {:.0} s, due {:.0} s",
                num(r.n as f64),
                r.seed_s,
                e.seed_s
            ))
            .collect::<Vec<_>>()
            .join("; "),
        total_s
    );
    md
}

// ------------------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    let ns: Vec<usize> = std::env::var("LONGHAUL_VOLUME_NS")
        .unwrap_or_else(|_| "1000,10000,50000".into())
        .split(',')
        .filter_map(|n| n.trim().replace('_', "").parse().ok())
        .collect();
    let max_runs = env_usize("LONGHAUL_VOLUME_MAX_RUNS").unwrap_or(30);
    let mut reapers = Vec::new();
    let mut expirers = Vec::new();
    let mut setup = None;
    for n in ns {
        // The reaper and the expirer are measured side by side, each on a stack of its own
        // (the emulator is one single-threaded process per stack, so each has about a core):
        // neither scenario reads what the other seeds, and the two together take the time of
        // the longer one instead of the sum.
        let (reaper, expirer) = tokio::try_join!(
            async {
                let bench = Bench::start("reaper").await?;
                eprintln!("N={n}: reaper's local stack up at {}", bench.stack.api_url);
                let templates = bench.templates().await?;
                let result = reaper_scenario(&bench, &templates, n, max_runs).await?;
                bench.stack.shutdown();
                anyhow::Ok(result)
            },
            async {
                let bench = Bench::start("expirer").await?;
                eprintln!("N={n}: expirer's local stack up at {}", bench.stack.api_url);
                let templates = bench.templates().await?;
                let result = expirer_scenario(&bench, &templates, n, max_runs).await?;
                let setup = Setup {
                    knobs: bench.knobs.clone(),
                    billing: bench.billing.clone(),
                    running_job: item_size(&templates.running_job),
                    running_progress: item_size(&templates.running_progress),
                    done_job: item_size(&templates.done_job),
                    done_progress: item_size(&templates.done_progress),
                    objects: templates.objects.len(),
                    object_bytes: templates.objects.first().map(|o| o.2.len()).unwrap_or(0),
                    reaper_page: bench.knobs.reaper_page,
                    expirer_page: bench.knobs.expirer_page,
                    in_flight: expirer::IN_FLIGHT,
                };
                bench.stack.shutdown();
                anyhow::Ok((result, setup))
            },
        )?;
        reapers.push(reaper);
        expirers.push(expirer.0);
        setup = Some(expirer.1);
    }
    let setup = setup.context("no N to measure (LONGHAUL_VOLUME_NS)")?;
    let md = report(&setup, &reapers, &expirers, started.elapsed().as_secs_f64());
    longhaul_bench::write_section("20-volume", &md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(pairs: &[(&str, &str)]) -> Item {
        pairs.iter().map(|(k, v)| (k.to_string(), AttributeValue::S(v.to_string()))).collect()
    }

    fn billing(projection: Projection) -> Billing {
        Billing {
            table_keys: vec!["pk".into(), "sk".into()],
            indexes: vec![Index {
                name: "StatusIndex".into(),
                keys: vec!["gsi2pk".into(), "gsi2sk".into()],
                projection,
            }],
        }
    }

    #[test]
    fn index_writes_are_billed_as_dynamodb_bills_them() {
        let b = billing(Projection::Include(["status".to_owned()].into()));
        let running = item(&[
            ("pk", "JOB#1"),
            ("sk", "JOB"),
            ("gsi2pk", "running#1"),
            ("gsi2sk", "t"),
            ("status", "running"),
            ("params", "x"),
        ]);
        // Leaving the index: the item, and one delete of the entry.
        let mut failed = running.clone();
        failed.remove("gsi2pk");
        failed.remove("gsi2sk");
        set(&mut failed, "status", "failed");
        assert_eq!(b.write_units(Some(&running), Some(&failed)), (1.0, 1.0));
        // Moving to another bucket: a delete and a put.
        let mut moved = running.clone();
        set(&mut moved, "gsi2pk", "expired#1");
        assert_eq!(b.write_units(Some(&running), Some(&moved)), (1.0, 2.0));
        // A projected attribute changed: one write; an unprojected one: none.
        let mut flagged = running.clone();
        set(&mut flagged, "status", "x");
        assert_eq!(b.write_units(Some(&running), Some(&flagged)), (1.0, 1.0));
        let mut params = running.clone();
        set(&mut params, "params", "y");
        assert_eq!(b.write_units(Some(&running), Some(&params)), (1.0, 0.0));
        // ALL projects every attribute.
        assert_eq!(billing(Projection::All).write_units(Some(&running), Some(&params)), (1.0, 1.0));
        // Sizes round up per KB.
        let big = item(&[("pk", "JOB#1"), ("p", &"x".repeat(1500))]);
        assert_eq!(b.write_units(None, Some(&big)).0, 2.0);
    }

    #[test]
    fn entries_hold_the_projection() {
        let b = billing(Projection::KeysOnly);
        let index = b.indexes[0].clone();
        let full =
            item(&[("pk", "a"), ("sk", "b"), ("gsi2pk", "c"), ("gsi2sk", "d"), ("status", "e")]);
        assert_eq!(b.entry(&index, &full).map(|e| e.len()), Some(4));
        assert_eq!(b.entry(&index, &item(&[("pk", "a"), ("sk", "b")])), None);
    }

    #[test]
    fn queries_round_up_per_request_at_half_a_unit() {
        assert_eq!(query_ru(0.0), 0.5);
        assert_eq!(query_ru(4096.0), 0.5);
        assert_eq!(query_ru(4097.0), 1.0);
    }

    #[test]
    fn kinds_are_spread_through_the_claim_order() {
        let kinds: Vec<Kind> = (0..1000).map(Kind::at).collect();
        let count = |k: Kind| kinds.iter().filter(|x| **x == k).count();
        assert_eq!((count(Kind::Zombie), count(Kind::Stalled), count(Kind::TimedOut)), (3, 2, 1));
        // In every part of the order.
        let kinds: Vec<Kind> = (0..16_000).map(Kind::at).collect();
        for part in kinds.chunks(1600) {
            assert!(part.contains(&Kind::Zombie) && part.contains(&Kind::TimedOut));
        }
    }

    #[test]
    fn substitution_reaches_nested_strings() {
        let v = AttributeValue::M(
            [("l".to_owned(), AttributeValue::L(vec![AttributeValue::S("results/ID/1".into())]))]
                .into(),
        );
        let out = substitute(&v, &[("ID", "xyz")]);
        assert_eq!(
            out,
            AttributeValue::M(
                [(
                    "l".to_owned(),
                    AttributeValue::L(vec![AttributeValue::S("results/xyz/1".into())])
                )]
                .into()
            )
        );
    }

    #[test]
    fn stream_mappings_are_left_out_and_nothing_else() {
        let template = "\
Resources:
  Slots:
    Properties:
      Events:
        JobEnded:
          Type: DynamoDB
          Properties:
            Stream: x

            # a comment
      Timeout: 5
  Api:
    Properties:
      Events:
        Get:
          Type: HttpApi
        Ended:
          Type: DynamoDB
          Properties:
            Stream: y
      Timeout: 6
";
        let (out, removed) = without_stream_mappings(template);
        assert_eq!(removed, 2);
        assert_eq!(
            out,
            "\
Resources:
  Slots:
    Properties:
      Timeout: 5
  Api:
    Properties:
      Events:
        Get:
          Type: HttpApi
      Timeout: 6
"
        );
        let real = std::fs::read_to_string(longhaul_bench::workspace_root().join("template.yaml"))
            .unwrap();
        let (out, removed) = without_stream_mappings(&real);
        assert!(removed >= 2 && !out.contains("Type: DynamoDB"));
        assert!(out.contains("Type: HttpApi") && out.contains("Type: SQS"));
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(1234567.0), "1,234,567");
        assert_eq!(num(12.0), "12");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(0.25), "0.25");
    }
}
