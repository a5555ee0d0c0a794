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
//! Then, on a third stack alone, **a waiting backlog of one tenant** (`LONGHAUL_VOLUME_WAITING`,
//! W, default 100,000; 0 skips it): the tenant's running slots are held by healthy running
//! jobs of its own, one job is submitted through the API and left waiting by the dispatcher,
//! and copies of its job record and its waiting-list entry make W waiting jobs — at W/10
//! first, then topped up to W — beside `LONGHAUL_VOLUME_WAITING_RUNNING` (2,000) running jobs
//! of another tenant, made as in step 2 (afresh with each size, replacing the last size's).
//! The reaper runs with a local budget ([`WAITING_BUDGET_S`], `LONGHAUL_VOLUME_WAITING_BUDGET`)
//! until its waiting sweep has gone through the whole list, and each run is measured against
//! its budget, for whether the other sweeps judged every running job in the first run, for its
//! `ActiveJobs` counts (made after the sweeps, within the budget, at most a few pages a shard:
//! the waiting bucket's a lower bound, each checked against what the table holds), and for
//! the heap the bench process allocated at its peak during the run (a counting global
//! allocator, [`heap`]). The bench exits non-zero, after writing the section, if a run passes
//! its budget by more than [`BUDGET_MARGIN`], a first run leaves a running job unjudged, a count
//! is wrong (an exact one that is not the truth, a lower bound above it), or the peak grows
//! with W (more than [`HEAP_GROWTH_LIMIT`] from W/10 to W).
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
//! (30), `LONGHAUL_VOLUME_WAITING` (100,000), `LONGHAUL_VOLUME_WAITING_RUNNING` (2,000),
//! `LONGHAUL_VOLUME_WAITING_BUDGET` (600).
//!
//! One file of ~3,000 lines on purpose: a benchmark is one scenario read top to bottom (seed,
//! run, measure, write the section), and its steps are used nowhere else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, KeysAndAttributes, PutRequest, WriteRequest,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use longhaul_aws::jobs::{STATUS_SHARDS, WAITING_BUCKET, status_bucket};
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
/// The reaper's `ActiveJobs` counts as its defaults set them (`LONGHAUL_REAPER_COUNT_PAGE`,
/// `LONGHAUL_REAPER_COUNT_MAX_PAGES`, functions/reaper/src/lib.rs `Config`), unless the
/// template sets them: after the sweeps, within the run's budget, each shard of each live
/// bucket is counted at most this many pages of this many entries.
const DEFAULT_COUNT_PAGE: usize = 1000;
const DEFAULT_COUNT_MAX_PAGES: usize = 2;
/// The live buckets the reaper sweeps and counts (`pending`, `waiting`, `queued`, `running`:
/// functions/reaper/src/bucket.rs `Bucket::ALL`), for the projection (the bench reads the
/// buckets' names from the run's report).
const LIVE_BUCKETS: usize = 4;
/// Waiting-list reads a waiting page has in flight at once per shard (functions/reaper/src/
/// waiting.rs `CHECKS_AT_ONCE`), for the AWS time of a pass over the list.
const LIST_CHECKS_AT_ONCE: usize = 16;
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
// The heap, counted
// ------------------------------------------------------------------------------------------

/// The bench process's heap, counted by its global allocator: the bytes allocated now, and the
/// most at once since [`heap::reset`]. The local stack hosts the reaper in this process, so
/// what the process allocated at its peak during a run bounds what the run allocated from
/// above (it also holds the edge forwarding the run's calls, and whatever else the stack did
/// meanwhile). Heap, not RSS: code, stacks and memory the allocator keeps after a free are not
/// in it.
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering::Relaxed;

    static NOW: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    /// The system allocator, counting.
    pub struct Counting;

    fn grew(bytes: usize) {
        let now = NOW.fetch_add(bytes, Relaxed) + bytes;
        PEAK.fetch_max(now, Relaxed);
    }

    fn shrank(bytes: usize) {
        NOW.fetch_sub(bytes, Relaxed);
    }

    // SAFETY: every call is passed on to `System` unchanged; only sizes are counted.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            let ptr = unsafe { System.alloc_zeroed(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) };
            shrank(layout.size());
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let new = unsafe { System.realloc(ptr, layout, new_size) };
            if !new.is_null() {
                if new_size >= layout.size() {
                    grew(new_size - layout.size());
                } else {
                    shrank(layout.size() - new_size);
                }
            }
            new
        }
    }

    /// Starts a new peak from the heap as it is now, and answers that.
    pub fn reset() -> usize {
        let now = NOW.load(Relaxed);
        PEAK.store(now, Relaxed);
        now
    }

    /// The most bytes allocated at once since [`reset`].
    pub fn peak() -> usize {
        PEAK.load(Relaxed)
    }
}

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

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
/// `timeout_s` ([`LOCAL_TIMEOUT_S`] but for the waiting backlog's stack), and links to what the
/// template and the stack read beside it (`infra/`, `.venv`), in `target/volume-stack-<label>`
/// (one per stack the bench runs at once). Returns the directory and the template's own
/// timeouts of those functions.
fn stack_root(
    label: &str,
    timeout_s: u64,
) -> anyhow::Result<(PathBuf, BTreeMap<String, Duration>)> {
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
            patched.push_str(&format!("{indent}Timeout: {timeout_s}"));
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
    /// `LONGHAUL_TENANT_MAX_RUNNING`: a tenant's running slots.
    tenant_max_running: usize,
    /// `LONGHAUL_REAPER_COUNT_PAGE`, `LONGHAUL_REAPER_COUNT_MAX_PAGES`: the `ActiveJobs`
    /// counts' page and the most pages a run counts of a shard.
    count_page: usize,
    count_max_pages: usize,
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
    /// The reaper run's `ActiveJobs` readings (its report's `active`, counted after the
    /// sweeps), by bucket: the entries counted, and whether the reading is a lower bound (the
    /// report's `active_at_least`, `ActiveJobsTruncated` = 1: a shard's count stopped at its
    /// page cap or at the run's deadline). A bucket the run did not count is missing.
    fn counts(&self) -> BTreeMap<String, (u64, bool)> {
        let at_least: BTreeSet<&str> = self.report["active_at_least"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        self.report["active"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(bucket, n)| {
                Some((bucket.clone(), (n.as_u64()?, at_least.contains(bucket.as_str()))))
            })
            .collect()
    }
    /// Index entries the run's counts read: as many as they counted (`Select=COUNT` reads, and
    /// is billed for, every entry it counts, and stops where its count stops).
    fn counted(&self) -> u64 {
        self.counts().values().map(|(n, _)| n).sum()
    }
    /// How the run's `ActiveJobs` reading of `bucket` reads: "≥ n" for a lower bound.
    fn reading(&self, bucket: &str) -> String {
        match self.counts().get(bucket) {
            Some((n, true)) => format!("≥ {}", num(*n as f64)),
            Some((n, false)) => num(*n as f64),
            None => "not counted".into(),
        }
    }
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

impl Bench {
    /// Starts a stack of its own (`label` names its directory, see [`stack_root`]), the
    /// reaper's budget `reaper_budget` seconds (`None`: `LONGHAUL_VOLUME_REAPER_BUDGET`, else
    /// [`LOCAL_REAPER_BUDGET_S`]), the scheduled functions' timeout `timeout_s`.
    async fn start(
        label: &str,
        reaper_budget: Option<u64>,
        timeout_s: u64,
    ) -> anyhow::Result<Self> {
        longhaul_aws::sdk::install_tls_provider();
        let (root, timeouts) = stack_root(label, timeout_s)?;
        let mut options = Options::ephemeral(root);
        let reaper_page = env_usize("LONGHAUL_VOLUME_REAPER_PAGE").unwrap_or(BENCH_PAGE);
        let reaper_budget = reaper_budget.unwrap_or_else(|| {
            env_usize("LONGHAUL_VOLUME_REAPER_BUDGET")
                .map(|b| b as u64)
                .unwrap_or(LOCAL_REAPER_BUDGET_S)
        });
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
            tenant_max_running: var("LONGHAUL_TENANT_MAX_RUNNING", 50).max(0) as usize,
            count_page: var("LONGHAUL_REAPER_COUNT_PAGE", DEFAULT_COUNT_PAGE as i64).max(1)
                as usize,
            count_max_pages: var("LONGHAUL_REAPER_COUNT_MAX_PAGES", DEFAULT_COUNT_MAX_PAGES as i64)
                .max(0) as usize,
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
        self.api_as(&self.token, method, path, body).await
    }

    /// A call of the API as the principal of `token`.
    async fn api_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method.parse()?, format!("{}{path}", self.stack.api_url))
            .bearer_auth(token)
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
        self.batch(items, |item| {
            let put = PutRequest::builder().set_item(Some(item)).build()?;
            anyhow::Ok(WriteRequest::builder().put_request(put).build())
        })
        .await
    }

    /// Deletes the items of `keys` (uncounted).
    async fn batch_delete(&self, keys: Vec<Item>) -> anyhow::Result<()> {
        self.batch(keys, |key| {
            let delete = DeleteRequest::builder().set_key(Some(key)).build()?;
            anyhow::Ok(WriteRequest::builder().delete_request(delete).build())
        })
        .await
    }

    /// `request` of each of `items`, written straight into the emulator (uncounted) in
    /// `BatchWriteItem`s of 25, four at once.
    async fn batch(
        &self,
        items: Vec<Item>,
        request: impl Fn(Item) -> anyhow::Result<WriteRequest> + Copy,
    ) -> anyhow::Result<()> {
        let chunks: Vec<Vec<Item>> = items.chunks(25).map(<[Item]>::to_vec).collect();
        let mut writes = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let mut requests =
                    chunk.into_iter().map(request).collect::<anyhow::Result<Vec<_>>>()?;
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

/// A copy of the running template as job `id` under a lease of its own, claimed at `claimed`,
/// its heartbeat and progress last written at `fresh`, and each `from` of `also` replaced by
/// its `to` (another owner): its job and progress records.
fn running_copy(
    t: &Templates,
    id: &str,
    claimed: DateTime<Utc>,
    fresh: &str,
    also: &[(&str, &str)],
) -> anyhow::Result<(Item, Item)> {
    let lease = uuid::Uuid::new_v4().simple().to_string();
    let mut map = vec![(t.running_id.as_str(), id), (t.running_lease.as_str(), lease.as_str())];
    map.extend_from_slice(also);
    let mut job = copy_of(&t.running_job, &map);
    let mut progress = copy_of(&t.running_progress, &map);
    set(&mut job, "gsi2pk", status_bucket("running", &id.parse()?));
    set(&mut job, "gsi2sk", format_rfc3339(claimed));
    set(&mut job, "updated_at", format_rfc3339(claimed));
    set(&mut job, "started_at", format_rfc3339(claimed));
    job.remove("stalled_at");
    set(&mut progress, "heartbeat_at", fresh);
    set(&mut progress, "progress_changed_at", fresh);
    set(&mut progress, "updated_at", fresh);
    Ok((job, progress))
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
        let claimed = now - chrono::Duration::hours(12) + span * i as i32 / n.max(1) as i32;
        // Healthy: heartbeat and progress fresh for the whole bench.
        let (mut job, mut progress) = running_copy(t, &id, claimed, &ahead, &[])?;
        let bucket = job.get("gsi2pk").and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        *per_shard.entry(bucket).or_default() += 1;
        match kind {
            Kind::Healthy => {}
            Kind::Zombie => {
                // Silent for 10 s to 10 min past the timeout.
                let silent = k.heartbeat_timeout + 10 + (i as i64 * 7) % 600;
                let heartbeat = format_rfc3339(now - secs(silent));
                set(&mut progress, "heartbeat_at", heartbeat.clone());
                set(&mut progress, "progress_changed_at", heartbeat.clone());
                set(&mut progress, "updated_at", heartbeat);
            }
            Kind::Stalled => {
                let changed = format_rfc3339(now - secs(k.stall + 100));
                set(&mut progress, "progress_changed_at", changed.clone());
                set(&mut progress, "updated_at", changed);
            }
            Kind::TimedOut => {
                // Started past the maximum, claimed again since (a second attempt).
                set(&mut job, "started_at", format_rfc3339(now - secs(k.max_runtime + 3600)));
                job.insert("attempt".into(), AttributeValue::N("2".into()));
                job.insert("dispatches".into(), AttributeValue::N("2".into()));
            }
        }
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
        // Reads: the cursor item; every index query by the entries it read (the `ActiveJobs`
        // counts after the sweeps what they counted — at most a few pages a shard, see
        // [`Run::counted`] — the sweeps what they examined); a progress record per examined
        // running entry (BatchGetItem, eventually consistent); a consistent query of job and
        // progress per job that did not look healthy.
        let counted = run.counted();
        let examined = run.number("examined");
        let views = job_writes + run.number("raced") + run.number("errors");
        let index_queries = run.call("dynamodb:Query").saturating_sub(views);
        let index_bytes = (counted + examined) as f64 * result.running_entry;
        run.rru = run.call("dynamodb:GetItem") as f64
            + index_bytes / 8192.0
            + 0.25 * index_queries as f64
            + examined as f64 * 0.5 * (result.progress_size as f64 / 4096.0).ceil()
            + views as f64 * jp_ru;
        run.found = found;
        eprintln!(
            "  reaper run {index}: {:.1} s, examined {examined}, found {found}, unfinished {}, calls {}, running counted {}",
            run.wall_s,
            run.number("unfinished"),
            run.total_calls(),
            run.reading("running")
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
// A waiting backlog
// ------------------------------------------------------------------------------------------

/// The principal whose backlog waits (its token's `sub`: the jobs' owner).
const BACKLOG_OWNER: &str = "bench-backlog";
/// The reaper's budget in the waiting scenario unless `LONGHAUL_VOLUME_WAITING_BUDGET` says
/// otherwise. Not the template's 40 s: moto reads the whole table for every page of an index
/// query, so with 100,000 waiting jobs (some 200,000 items) a page of the list and its
/// thousand list reads take it about 10 s, and a 40 s run would cover some 4,000 jobs — the
/// list would take some 25 runs. 600 s still cuts it (into two runs on a 2-core machine),
/// which is what is to be shown.
const WAITING_BUDGET_S: u64 = 600;
/// The reaper's timeout on the waiting backlog's stack, well past the budget and its margin:
/// a run's sweeps and counts stop at its deadline, but what is in flight then (a waiting page's
/// list reads, a count page) ends after it in an emulator that serves one call at a time; a
/// run that overruns is to be measured (and failed past [`BUDGET_MARGIN`]), not killed.
const WAITING_TIMEOUT_S: u64 = 3600;
/// How far past its budget a run may go, as a fraction of the budget, before the bench fails:
/// when the budget runs out, every shard's sweep finishes the page it is on (for a waiting
/// page, one list read per job, 16 at a time per shard) and every count page started before
/// the deadline ends (the counts start no page after it), in an emulator that serves one call
/// at a time.
const BUDGET_MARGIN: f64 = 0.25;
/// The most the highest heap peak of the runs at W may be of the highest at W/10 before the
/// bench fails: a sweep that held the list, or anything per waiting job, would grow with W
/// (tenfold for the list).
const HEAP_GROWTH_LIMIT: f64 = 1.5;

/// One reaper run of the waiting scenario, as measured.
#[derive(Debug)]
struct WaitingRun {
    run: Run,
    /// Heap the bench process held when the run was fired, bytes.
    heap_before: usize,
    /// The most the process held above that during the run, bytes.
    heap_added: usize,
    /// Waiting-bucket shards whose sweep the budget cut (their cursor saved for the next run).
    waiting_cut: usize,
    /// The other sweeps' shards the budget cut (`running#1`, …): any, and some running jobs
    /// went unjudged in the run.
    others_cut: Vec<String>,
    /// Unhealthy running jobs seeded with this size that were handled by the end of the run.
    judged: usize,
    /// What each live bucket held at the end of the run, read from the job records (uncounted):
    /// what its `ActiveJobs` reading, counted after the sweeps, is checked against.
    truth: BTreeMap<String, u64>,
}

impl WaitingRun {
    /// The run's `ActiveJobs` readings that are not true (see [`Run::counts`]): an exact one
    /// that is not what the bucket held, a lower bound above it, a bucket of unknown name.
    fn wrong_counts(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (bucket, (n, at_least)) in self.run.counts() {
            match self.truth.get(&bucket) {
                Some(&truth) if at_least && n > truth => out.push(format!(
                    "`ActiveJobs` {bucket} read at least {} where {} were",
                    num(n as f64),
                    num(truth as f64)
                )),
                Some(&truth) if !at_least && n != truth => out.push(format!(
                    "`ActiveJobs` {bucket} read exactly {} where {} were",
                    num(n as f64),
                    num(truth as f64)
                )),
                Some(_) => {}
                None => out.push(format!("`ActiveJobs` of an unknown bucket {bucket}")),
            }
        }
        out
    }

    /// Waiting jobs the run checked against their list: its `GetItem`s less the sweep cursors'
    /// read and the reconciliation of the tenant's pool (its holders' item, and each of its
    /// `limit` holders' job). Every job here waits in one list (its tenant's; `demo` has no
    /// kind limit) and is found there, so one read is one job judged.
    fn list_reads(&self, limit: usize) -> u64 {
        self.run.call("dynamodb:GetItem").saturating_sub(2 + limit as u64)
    }

    fn failed(&self) -> bool {
        self.run.report.get("run_error").is_some()
    }
}

/// The waiting scenario at one size.
#[derive(Debug, Default)]
struct WaitingSize {
    /// Waiting jobs of the tenant.
    w: usize,
    /// Unhealthy running jobs seeded with this size.
    unhealthy: usize,
    /// Healthy running jobs (the tenant's slot holders, the other tenant's) a run changed.
    healthy_touched: usize,
    /// Seconds to seed the waiting jobs added for this size (job record and list entry each).
    seed_s: f64,
    runs: Vec<WaitingRun>,
    /// The run after which every shard of the waiting bucket had been swept to its end once.
    covered_at: Option<usize>,
}

impl WaitingSize {
    fn heap_peak(&self) -> usize {
        self.runs.iter().map(|r| r.heap_added).max().unwrap_or(0)
    }
}

/// The waiting scenario.
#[derive(Debug, Default)]
struct WaitingResult {
    sizes: Vec<WaitingSize>,
    budget: u64,
    page: usize,
    /// The tenant's running slots (`LONGHAUL_TENANT_MAX_RUNNING`).
    limit: usize,
    /// Running jobs of the other tenant seeded with each size.
    running_per_size: usize,
    job_size: usize,
    list_entry_size: usize,
    /// A waiting job's status-index entry, bytes (as the emulator projects it).
    index_entry: f64,
    timeout: Duration,
    memory_mb: f64,
    /// The `ActiveJobs` counts' page and the most pages a run counts of a shard.
    count_page: usize,
    count_max_pages: usize,
}

impl WaitingResult {
    /// What fails the bench: a run past its budget by more than the margin (or killed), a
    /// first run that left a running job unjudged, an `ActiveJobs` reading that is not true, a
    /// list never covered, list entries the reaper had to put back (the seeding was wrong), a
    /// heap peak that grows with W.
    fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let allowed = self.budget as f64 * (1.0 + BUDGET_MARGIN);
        for size in &self.sizes {
            let w = num(size.w as f64);
            for run in &size.runs {
                if run.failed() {
                    out.push(format!("W = {w}, run {}: the run failed", run.run.index));
                } else if run.run.wall_s > allowed {
                    out.push(format!(
                        "W = {w}, run {}: ran {:.1} s, past its {} s budget by more than {:.0} %",
                        run.run.index,
                        run.run.wall_s,
                        self.budget,
                        BUDGET_MARGIN * 100.0
                    ));
                }
                for wrong in run.wrong_counts() {
                    out.push(format!("W = {w}, run {}: {wrong}", run.run.index));
                }
            }
            match size.runs.first() {
                Some(first) if first.judged < size.unhealthy || !first.others_cut.is_empty() => out
                    .push(format!(
                        "W = {w}: the first run judged {} of {} unhealthy running jobs, cut {:?}",
                        first.judged, size.unhealthy, first.others_cut
                    )),
                Some(_) => {}
                None => out.push(format!("W = {w}: no run")),
            }
            if size.covered_at.is_none() {
                out.push(format!("W = {w}: the waiting sweep did not cover the list"));
            }
            let restored: u64 = size.runs.iter().map(|r| r.run.number("waiting_restored")).sum();
            if restored > 0 {
                out.push(format!("W = {w}: {restored} waiting-list entries put back (seeding)"));
            }
        }
        if let [small, .., large] = self.sizes.as_slice()
            && large.heap_peak() as f64 > HEAP_GROWTH_LIMIT * small.heap_peak() as f64
        {
            out.push(format!(
                "heap peak {} B at W = {} against {} B at W = {}: more than {HEAP_GROWTH_LIMIT}×",
                large.heap_peak(),
                num(large.w as f64),
                small.heap_peak(),
                num(small.w as f64)
            ));
        }
        out
    }
}

impl Bench {
    /// Fires the reaper once (see [`Bench::fire`]) and measures the heap the process allocated
    /// at its peak meanwhile.
    async fn fire_watched(&self, index: usize) -> anyhow::Result<WaitingRun> {
        let heap_before = heap::reset();
        let run = self.fire("reaper", "ReaperFunction", index).await?;
        let heap_added = heap::peak().saturating_sub(heap_before);
        Ok(WaitingRun {
            run,
            heap_before,
            heap_added,
            waiting_cut: 0,
            others_cut: Vec::new(),
            judged: 0,
            truth: BTreeMap::new(),
        })
    }

    /// The sweeps whose cursor is saved, by [`longhaul_aws::jobs::sweep_name`]: those the last
    /// run cut (read uncounted).
    async fn cut_sweeps(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .item("SWEEP", "CURSORS")
            .await?
            .map(|item| item.into_keys().filter(|name| name.contains('#')).collect())
            .unwrap_or_default())
    }

    /// Forgets the saved cursors `names`: their sweeps start from the oldest entry.
    async fn forget_sweeps(&self, names: &BTreeSet<String>) -> anyhow::Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let mut update = self
            .dynamodb
            .update_item()
            .table_name(&self.table)
            .key("pk", AttributeValue::S("SWEEP".into()))
            .key("sk", AttributeValue::S("CURSORS".into()));
        let mut removed = Vec::new();
        for (i, name) in names.iter().enumerate() {
            update = update.expression_attribute_names(format!("#c{i}"), name);
            removed.push(format!("#c{i}"));
        }
        update.update_expression(format!("REMOVE {}", removed.join(", "))).send().await?;
        Ok(())
    }
}

fn string_of(item: &Item, name: &str) -> anyhow::Result<String> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .with_context(|| format!("`{name}` in {item:?}"))
}

/// Submits a job as [`BACKLOG_OWNER`] (whose slots are all held) and waits until the
/// dispatcher has left it waiting: its job record and its waiting-list entry.
async fn waiting_template(
    bench: &Bench,
    pool: &longhaul_aws::slots::Pool,
) -> anyhow::Result<(String, Item, Item)> {
    let token = bench.stack.token(BACKLOG_OWNER);
    let body = json!({"type": "demo", "params": {"items": 1, "item_ms": 0}});
    let (status, reply) = bench.api_as(&token, "POST", "/jobs", Some(&body)).await?;
    if status != 202 {
        bail!("submit answered {status}: {reply}");
    }
    let id = reply["job_id"].as_str().context("job_id")?.to_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    let job = loop {
        if let Some(job) = bench.item(&format!("JOB#{id}"), "JOB").await?
            && string_of(&job, "gsi2pk").is_ok_and(|b| b.starts_with(WAITING_BUCKET))
        {
            break job;
        }
        if Instant::now() > deadline {
            bail!("job {id} was not left waiting within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waiting = job.get("waiting").and_then(|w| w.as_m().ok()).context("`waiting`")?;
    let position = string_of(waiting, "position")?;
    let entry = bench
        .item(&pool.waiting_pk(), &position)
        .await?
        .with_context(|| format!("job {id}'s entry {position} in its waiting list"))?;
    if status_of(&job) != "pending" {
        bail!("job {id} waits but is {}, not pending", status_of(&job));
    }
    Ok((id, job, entry))
}

async fn waiting_scenario(
    bench: &Bench,
    t: &Templates,
    w: usize,
    running_per_size: usize,
    max_runs: usize,
) -> anyhow::Result<WaitingResult> {
    let k = &bench.knobs;
    if k.tenant_max_running == 0 {
        bail!("LONGHAUL_TENANT_MAX_RUNNING is 0 (no limit): no job would wait");
    }
    let owner: longhaul_domain::Owner = BACKLOG_OWNER.parse()?;
    let pool = longhaul_aws::slots::Pool::Tenant(owner);
    // The tenant's slots, held by healthy running jobs of its own; the slot holders' item is
    // named in shared/aws/src/slots.rs.
    let now = Utc::now();
    let ahead = format_rfc3339(now + chrono::Duration::hours(6));
    let template_owner = string_of(&t.running_job, "owner")?;
    let (mut items, mut holders) = (Vec::new(), Vec::new());
    for _ in 0..k.tenant_max_running {
        let id = longhaul_domain::JobId::new().to_string();
        let claimed = now - chrono::Duration::hours(1);
        let also = [(template_owner.as_str(), BACKLOG_OWNER)];
        let (job, progress) = running_copy(t, &id, claimed, &ahead, &also)?;
        items.extend([job, progress]);
        holders.push(id);
    }
    items.push(HashMap::from([
        ("pk".to_owned(), AttributeValue::S(pool.holders_pk())),
        ("sk".to_owned(), AttributeValue::S("HOLDERS".into())),
        ("holders".to_owned(), AttributeValue::Ss(holders.clone())),
    ]));
    bench.batch_write(items).await?;
    let (template_id, job, entry) = waiting_template(bench, &pool).await?;
    eprintln!("waiting: job {template_id} waits; its record and list entry are the template");
    let mut result = WaitingResult {
        budget: k.reaper_budget,
        page: k.reaper_page,
        limit: k.tenant_max_running,
        running_per_size,
        job_size: item_size(&job),
        list_entry_size: item_size(&entry),
        timeout: k.reaper_timeout,
        memory_mb: k.reaper_memory_mb,
        count_page: k.count_page,
        count_max_pages: k.count_max_pages,
        ..Default::default()
    };
    let template_created = string_of(&job, "created_at")?;
    let created_at = DateTime::parse_from_rfc3339(&template_created)?.to_utc();
    let since_at = DateTime::parse_from_rfc3339(&string_of(&job, "gsi2sk")?)?.to_utc();
    let mut seeded = 1; // the template
    let mut previous: Vec<String> = Vec::new();
    let sizes = BTreeSet::from([(w / 10).max(1), w]);
    for size in sizes {
        // Copies of the waiting job, a millisecond apart before it (creation, and the start
        // of its wait, which is its status-index sort key).
        let started = Instant::now();
        eprintln!("W={size}: seeding {} waiting jobs", size - seeded);
        let mut items = Vec::with_capacity(2 * (size - seeded));
        for g in seeded..size {
            let id = longhaul_domain::JobId::new().to_string();
            let back = chrono::Duration::milliseconds((w - g) as i64);
            let (created, since) =
                (format_rfc3339(created_at - back), format_rfc3339(since_at - back));
            let map = [
                (template_id.as_str(), id.as_str()),
                (template_created.as_str(), created.as_str()),
            ];
            let mut copy = copy_of(&job, &map);
            set(&mut copy, "gsi2pk", status_bucket(WAITING_BUCKET, &id.parse()?));
            set(&mut copy, "gsi2sk", since.clone());
            if let Some(AttributeValue::M(waiting)) = copy.get_mut("waiting") {
                waiting.insert("since".into(), AttributeValue::S(since));
            }
            items.push(copy);
            items.push(copy_of(&entry, &map));
        }
        bench.batch_write(items).await?;
        let seed_s = started.elapsed().as_secs_f64();
        seeded = size;
        if result.index_entry == 0.0 {
            result.index_entry = bench.entry_size(WAITING_BUCKET).await?;
        }
        // The same running population with each size: the last size's running jobs go, and as
        // many are seeded afresh (so that the first run has unhealthy jobs to judge).
        let keys = previous
            .iter()
            .flat_map(|id| {
                ["JOB", "PROGRESS"].map(|sk| {
                    HashMap::from([
                        ("pk".to_owned(), AttributeValue::S(format!("JOB#{id}"))),
                        ("sk".to_owned(), AttributeValue::S(sk.into())),
                    ])
                })
            })
            .collect();
        bench.batch_delete(keys).await?;
        eprintln!("  seeded in {seed_s:.1} s; seeding {running_per_size} running jobs");
        let running = seed_running(bench, t, running_per_size, Utc::now()).await?;
        let healthy: Vec<String> = holders.iter().chain(&running.healthy).cloned().collect();
        previous = running.healthy.iter().chain(running.watched.keys()).cloned().collect();
        // The sweep of the list starts from its oldest entry with each size.
        let cut = bench.cut_sweeps().await?;
        bench.forget_sweeps(&cut).await?;
        let mut size_result =
            WaitingSize { w: size, unhealthy: running.watched.len(), seed_s, ..Default::default() };
        // Every running job of this size: the tenant's slot holders, the other tenant's jobs.
        let all_running: Vec<String> =
            healthy.iter().chain(running.watched.keys()).cloned().collect();
        let mut covered = BTreeSet::new();
        let mut admitted = 0;
        for index in 1..=max_runs {
            let mut run = bench.fire_watched(index).await?;
            let cut = bench.cut_sweeps().await?;
            let jobs = bench.jobs(&all_running).await?;
            run.judged = running
                .watched
                .iter()
                .filter(|(id, (kind, _))| jobs.get(*id).is_some_and(|j| handled(*kind, j).0))
                .count();
            // What the live buckets held when the run counted them, after its sweeps: the
            // running jobs still running, the waiting jobs less any the reaper woke (none,
            // while the slot holders run), nothing pending or queued.
            admitted += run.run.number("admitted");
            let still_running = jobs.values().filter(|j| status_of(j) == "running").count();
            run.truth = BTreeMap::from([
                ("pending".to_owned(), 0),
                (WAITING_BUCKET.to_owned(), (size as u64).saturating_sub(admitted)),
                ("queued".to_owned(), 0),
                ("running".to_owned(), still_running as u64),
            ]);
            let (waiting_cut, others_cut): (Vec<String>, Vec<String>) =
                cut.into_iter().partition(|name| name.starts_with(WAITING_BUCKET));
            if !run.failed() {
                for shard in 0..STATUS_SHARDS {
                    let name = longhaul_aws::jobs::sweep_name(WAITING_BUCKET, shard);
                    if !waiting_cut.contains(&name) {
                        covered.insert(shard);
                    }
                }
            }
            (run.waiting_cut, run.others_cut) = (waiting_cut.len(), others_cut);
            eprintln!(
                "  reaper run {index}: {:.1} s, waiting jobs checked {} (entries examined {}), waiting shards cut {}, others cut {:?}, judged {}/{}, ActiveJobs {:?} of {:?}{}, heap {:.1} MB +{:.1} MB",
                run.run.wall_s,
                run.list_reads(k.tenant_max_running),
                run.run.number("examined"),
                run.waiting_cut,
                run.others_cut,
                run.judged,
                size_result.unhealthy,
                run.run.counts(),
                run.truth,
                run.wrong_counts().iter().map(|w| format!(" — {w}")).collect::<String>(),
                run.heap_before as f64 / 1e6,
                run.heap_added as f64 / 1e6
            );
            size_result.runs.push(run);
            if covered.len() == STATUS_SHARDS as usize {
                size_result.covered_at = Some(index);
                break;
            }
        }
        let jobs = bench.jobs(&healthy).await?;
        size_result.healthy_touched = jobs
            .values()
            .filter(|j| status_of(j) != "running" || j.contains_key("stalled_at"))
            .count()
            + healthy.len().saturating_sub(jobs.len());
        result.sizes.push(size_result);
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

/// One row of the growth table: a quantity read off a reaper and an expirer result.
type GrowthMeasure = Box<dyn Fn(&ReaperResult, &ExpirerResult) -> f64>;

/// What one reaper run reads with `n` healthy running jobs and the other live buckets empty
/// (the calls the code makes): the sweeps first, then, with what they left of the budget, the
/// `ActiveJobs` counts.
struct ReaperModel {
    page: usize,
    /// The counts' queries: for each shard of each live bucket, the pages its entries need (a
    /// full page names where it goes on, so `⌊entries / page⌋ + 1`: an empty shard's one) up
    /// to the cap.
    count_queries: f64,
    /// The index entries the counts read: per shard, its entries up to cap × page.
    count_entries: f64,
    /// The most pages one shard's count reads (the shards are counted at once).
    count_pages: f64,
    sweep_queries: f64,
    batches: f64,
    count_rru: f64,
    sweep_rru: f64,
    progress_rru: f64,
}

impl ReaperModel {
    fn new(
        n: f64,
        page: usize,
        entry: f64,
        progress: usize,
        count_page: usize,
        count_max_pages: usize,
    ) -> Self {
        let shards = STATUS_SHARDS as f64;
        let empty = (LIVE_BUCKETS - 1) as f64 * shards;
        let per_shard = n / shards;
        let pages = (per_shard / page as f64).ceil();
        // The counts: every running shard as far as the cap, each empty shard one query (of
        // nothing) — none at all if the cap is 0.
        let cap = count_max_pages as f64;
        let count_pages = ((per_shard / count_page.max(1) as f64).floor() + 1.0).min(cap);
        let count_queries = shards * count_pages + empty * cap.min(1.0);
        let count_entries = shards * per_shard.min(cap * count_page as f64);
        // The sweeps page the running shards (and query the empty ones once).
        let sweep_queries = shards * pages + empty;
        let batches = shards * pages * (page as f64 / 100.0).ceil();
        let count_rru = count_entries * entry / 8192.0 + 0.25 * count_queries;
        let sweep_rru = n * entry / 8192.0 + 0.25 * sweep_queries;
        let progress_rru = n * 0.5 * (progress as f64 / 4096.0).ceil();
        ReaperModel {
            page,
            count_queries,
            count_entries,
            count_pages: count_pages.max(cap.min(1.0)),
            sweep_queries,
            batches,
            count_rru,
            sweep_rru,
            progress_rru,
        }
    }
    fn requests(&self) -> f64 {
        1.0 + self.count_queries + self.sweep_queries + self.batches
    }
    fn index_rru(&self) -> f64 {
        self.count_rru + self.sweep_rru
    }
    fn rru(&self) -> f64 {
        1.0 + self.index_rru() + self.progress_rru
    }
    /// The counts: every shard of every bucket at once, one shard's pages one after another.
    fn count_s(&self, ms: f64) -> f64 {
        self.count_pages * ms / 1000.0
    }
    /// One running shard's sweep: its queries and batch reads one after another.
    fn sweep_s(&self, ms: f64) -> f64 {
        let shards = STATUS_SHARDS as f64;
        let empty = (LIVE_BUCKETS - 1) as f64 * shards;
        (self.sweep_queries - empty + self.batches) / shards * ms / 1000.0
    }
    /// A run: its sweeps, to their end or to the budget; then, if the budget is not spent,
    /// the counts, which start no page past the deadline (so at most one page's time past it).
    fn run_s(&self, ms: f64, budget: f64) -> f64 {
        let swept = self.sweep_s(ms);
        if swept >= budget { budget } else { (swept + self.count_s(ms)).min(budget + ms / 1000.0) }
    }
}

fn report(
    setup: &Setup,
    reapers: &[ReaperResult],
    expirers: &[ExpirerResult],
    waiting: Option<&WaitingResult>,
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
         consistent) — the sweeps' pages and the reaper's `ActiveJobs` counts (after the sweeps, within the run's \
         budget, at most {} pages of {} entries a shard of each live bucket: `Select=COUNT` is billed for every entry it \
         counts, which is what the run's report gives; a bucket larger than that is reported as a lower bound, \
         shown ≥ below); each progress record in a `BatchGetItem` is half a unit (≤ 4 KB, eventually \
         consistent); the consistent query of job and progress for a job that did not look healthy is one unit per 4 KB; \
         the cursor `GetItem` one. Writes: every change of a seeded job (read back after each run) is billed as DynamoDB \
         does — the item by its larger size per 1 KB, and each index entry added, removed (1 write), moved to another \
         key (2) or with a projected attribute changed (1), by the entry's size per 1 KB; a sweep cursor save is one \
         unit. Requests are the edge's counts of the function's calls. Wall times are **local**: moto's index query scans \
         the whole table per page, so they grow faster than N here and say nothing about AWS.\n",
        setup.running_job,
        setup.running_progress,
        setup.done_job,
        setup.done_progress,
        k.count_max_pages,
        num(k.count_page as f64),
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
        "| N | run | wall s (local) | fits {} s timeout | entries examined | found | unfinished shards | `ActiveJobs` running (after the sweeps) | requests | DynamoDB requests by operation | other requests | RRU | WRU |",
        k.reaper_timeout.as_secs()
    );
    let _ = writeln!(w, "|--:|--:|--:|---|--:|--:|--:|--:|--:|---|---|--:|--:|");
    for r in reapers {
        for run in &r.runs {
            let (ddb, other): (BTreeMap<_, _>, BTreeMap<_, _>) = run
                .calls
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .partition(|(k, _)| k.starts_with("dynamodb:"));
            let _ = writeln!(
                w,
                "| {} | {}{} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                num(r.n as f64),
                run.index,
                if r.steady.contains(&run.index) { " (steady)" } else { "" },
                run.wall_s,
                if run.wall_s < k.reaper_timeout.as_secs_f64() { "yes" } else { "**no**" },
                num(run.number("examined") as f64),
                run.found,
                run.number("unfinished"),
                run.reading("running"),
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
         costs every minute. `ActiveJobs` running: the run's count of the running bucket after its sweeps, \
         ≥ where it stopped at its cap of {} pages of {} entries a shard (a lower bound, \
         `ActiveJobsTruncated` 1), \"not counted\" where the sweeps had spent the budget.\n",
        k.count_max_pages,
        num(k.count_page as f64),
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
            "reaper, steady sweep: entries read (examined + counted, the counts capped)",
            Box::new(|r, _| r.steady_sum(|x| (x.number("examined") + x.counted()) as f64)),
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
        let model = |n: f64, page: usize| {
            ReaperModel::new(
                n,
                page,
                r.running_entry,
                r.progress_size,
                k.count_page,
                k.count_max_pages,
            )
        };
        let models: Vec<ReaperModel> = BTreeSet::from([DEFAULT_REAPER_PAGE, setup.reaper_page])
            .into_iter()
            .map(|page| model(big, page))
            .collect();
        // Measured, scaled: the steady sweep at the largest N, per entry it examined — less its
        // counts, which do not grow with N past their cap: the model's counts at N are taken
        // out of each steady run, its counts at 1,000,000 put back.
        let (at_n, at_big) = (model(r.n as f64, setup.reaper_page), model(big, setup.reaper_page));
        let steady = r.steady_runs().count() as f64;
        let examined = r.steady_sum(|x| x.number("examined") as f64).max(1.0);
        let scaled = |measured: f64, counts_at_n: f64, counts_at_big: f64| {
            (measured - steady * counts_at_n).max(0.0) / examined * big + counts_at_big
        };
        let measured_requests = scaled(
            r.steady_sum(|x| x.total_calls() as f64),
            at_n.count_queries,
            at_big.count_queries,
        );
        let measured_rru = scaled(r.steady_sum(|x| x.rru), at_n.count_rru, at_big.count_rru);
        let counted_at_n: Vec<String> = r
            .steady_runs()
            .map(|x| x.reading("running"))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let _ = writeln!(
            w,
            "A reaper run (every minute) with 1,000,000 healthy running jobs, {} shards of the running bucket \
             ({} each), index entries of {:.0} B and progress records of {} B (measured), a `BatchGetItem` per \
             100 progress records. A run sweeps first, to the end of every bucket or to its budget; then, with \
             what the sweeps left of the budget, it counts every shard of the {LIVE_BUCKETS} live buckets at once \
             for the `ActiveJobs` gauge, at most {} pages of {} entries a shard, no page started past the deadline \
             — so the counts read at most {} running entries a run, whatever N, and report a bucket larger than \
             that as a lower bound (the steady sweep at N = {} counted the running bucket as {}). The model counts \
             the calls the code makes; the last column scales what the steady sweep at N = {} made per entry it \
             examined (page {}), its counts taken out and the model's put back.\n",
            STATUS_SHARDS,
            num(big / shards),
            r.running_entry,
            r.progress_size,
            k.count_max_pages,
            num(k.count_page as f64),
            num(shards * (k.count_max_pages * k.count_page) as f64),
            num(r.n as f64),
            counted_at_n.join(", "),
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
            &format!(
                "`ActiveJobs` count queries (after the sweeps: per shard of each live bucket the pages its entries need, at least 1, at most {})",
                k.count_max_pages
            ),
            &|m| num(m.count_queries),
            String::new(),
        );
        row(w, "entries the counts read", &|m| num(m.count_entries), String::new());
        row(w, "sweep index queries", &|m| num(m.sweep_queries), String::new());
        row(w, "`BatchGetItem` of progress records", &|m| num(m.batches), String::new());
        row(w, "requests in all", &|m| num(m.requests()), num(measured_requests));
        row(w, "RRU: index entries, the sweep", &|m| num(m.sweep_rru), String::new());
        row(w, "RRU: index entries, the counts", &|m| num(m.count_rru), String::new());
        row(w, "RRU: progress records", &|m| num(m.progress_rru), String::new());
        row(w, "RRU in all", &|m| num(m.rru()), num(measured_rru));
        let budget = REAPER_BUDGET_S as f64;
        for ms in [5.0, 10.0] {
            row(
                w,
                &format!(
                    "AWS time at {ms:.0} ms a call: one shard's sweep (shards side by side) + the counts (every shard at once)"
                ),
                &|m| format!("{:.0} s + {:.2} s", m.sweep_s(ms), m.count_s(ms)),
                String::new(),
            );
            row(
                w,
                &format!(
                    "runs per full sweep at {ms:.0} ms (budget {REAPER_BUDGET_S} s from the run's start)"
                ),
                &|m| num((m.sweep_s(ms) / budget).ceil().max(1.0)),
                String::new(),
            );
            row(
                w,
                &format!(
                    "a run fits the {} s timeout at {ms:.0} ms (the sweep to its end or the budget, then the counts within it)",
                    k.reaper_timeout.as_secs()
                ),
                &|m| {
                    let run = m.run_s(ms, budget);
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
            MINUTES_PER_MONTH * (m.run_s(ms, budget) * gb * GB_S_PRICE + LAMBDA_REQUEST_PRICE)
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
            money(m.sweep_rru * MINUTES_PER_MONTH * RRU_PRICE),
            money(m.count_rru * MINUTES_PER_MONTH * RRU_PRICE),
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
    if let Some(waiting) = waiting {
        w.push_str(&waiting_report(waiting));
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

/// The waiting scenario's part of the section.
fn waiting_report(r: &WaitingResult) -> String {
    let mut md = String::new();
    let w = &mut md;
    let (Some(small), Some(large)) = (r.sizes.first(), r.sizes.last()) else { return md };
    let mib = |bytes: usize| bytes as f64 / 1_048_576.0;
    let shards = STATUS_SHARDS as f64;
    let cap = r.count_max_pages * r.count_page;
    let _ = writeln!(
        w,
        "### Reaper: a waiting backlog of {} jobs of one tenant\n",
        num(large.w as f64)
    );
    let _ = writeln!(
        w,
        "`LONGHAUL_VOLUME_WAITING` = W, on a third stack alone (after the others). One tenant has its {} running \
         slots (`TenantMaxRunningJobs`) held by {} healthy running jobs of its own, and W jobs waiting for one: \
         the first submitted through the API and left waiting by the dispatcher (status `pending`, `waiting` set, \
         its status-index entry in the `waiting` bucket, its key in the tenant's waiting list `WAITING#T#…`), the \
         other W − 1 copies of its job record ({} B) and its list entry ({} B) with the job id, the creation time \
         and the start of the wait replaced (a millisecond apart), written straight into the emulator — W = {} \
         first, then topped up to W = {}. With each size, {} running jobs of another tenant, seeded as above \
         (zombies, stalls and timeouts among them), replace the last size's. The reaper runs with a budget of {} s \
         (`LONGHAUL_VOLUME_WAITING_BUDGET`; the template's is {REAPER_BUDGET_S} s, but moto reads the whole \
         table for every page of an index query, so a page of the list takes it seconds where AWS takes \
         milliseconds) and page {}, and a {WAITING_TIMEOUT_S} s timeout (so that a run past its budget is measured, \
         not killed), one run after another until its waiting sweep has been through every shard of the list; \
         each size starts that sweep from the oldest entry. A run sweeps all the live buckets at once against one \
         deadline, its budget from its start; then, with what the sweeps left of the budget, it counts them for \
         the `ActiveJobs` gauge — every shard of every bucket at once, at most {} pages of {} entries a shard \
         (`LONGHAUL_REAPER_COUNT_MAX_PAGES`, `LONGHAUL_REAPER_COUNT_PAGE`), no page started past the deadline. \
         A bucket with {} entries or more in a shard reads as a lower bound (the report's `active_at_least`, \
         the gauge `ActiveJobsTruncated` = 1, shown as ≥ below), and a run whose sweeps spent the budget \
         counts nothing. Each reading is checked against what the bucket held at the end of the run, read \
         from the job records: an exact one must be that, a lower bound must not pass it. *Heap* is what the \
         bench process allocated at its peak during the run above what it held when the run was fired (a \
         counting global allocator): the reaper's run, plus the edge forwarding its calls and whatever else the \
         stack did meanwhile — an upper bound on the run's own heap, and heap, not RSS.\n",
        r.limit,
        r.limit,
        r.job_size,
        r.list_entry_size,
        num(small.w as f64),
        num(large.w as f64),
        num(r.running_per_size as f64),
        r.budget,
        r.page,
        r.count_max_pages,
        num(r.count_page as f64),
        num(cap as f64),
    );
    let _ = writeln!(
        w,
        "| W waiting | run | wall s (local; budget {} s) | waiting jobs checked | waiting shards cut | other sweeps cut | unhealthy running jobs judged | `ActiveJobs` waiting, of the jobs waiting | `ActiveJobs` running, of the jobs running | requests | heap, MiB |",
        r.budget
    );
    let _ = writeln!(w, "|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|");
    let truth =
        |run: &WaitingRun, bucket: &str| num(run.truth.get(bucket).copied().unwrap_or(0) as f64);
    // A bucket's reading beside what it held ("not counted" alone if the run did not count it).
    let against = |run: &WaitingRun, bucket: &str| match run.run.counts().get(bucket) {
        Some(_) => format!("{} of {}", run.run.reading(bucket), truth(run, bucket)),
        None => run.run.reading(bucket),
    };
    for size in &r.sizes {
        for run in &size.runs {
            let _ = writeln!(
                w,
                "| {} | {}{} | {:.1} | {} | {} | {} | {} / {} | {} | {} | {} | {:.1} |",
                num(size.w as f64),
                run.run.index,
                if run.failed() { " (failed)" } else { "" },
                run.run.wall_s,
                num(run.list_reads(r.limit) as f64),
                run.waiting_cut,
                if run.others_cut.is_empty() { "none".into() } else { run.others_cut.join(", ") },
                run.judged,
                size.unhealthy,
                against(run, WAITING_BUCKET),
                against(run, "running"),
                num(run.run.total_calls() as f64),
                mib(run.heap_added),
            );
        }
    }
    let allowed = r.budget as f64 * (1.0 + BUDGET_MARGIN);
    let runs = || r.sizes.iter().flat_map(|s| s.runs.iter());
    let longest = runs().map(|run| run.run.wall_s).fold(0.0, f64::max);
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let covered = |s: &WaitingSize| {
        s.covered_at.map_or_else(|| "not within the runs allowed".into(), |n| plural(n, "run"))
    };
    let crowded = r
        .sizes
        .iter()
        .any(|s| s.runs.first().is_none_or(|f| f.judged < s.unhealthy || !f.others_cut.is_empty()));
    let first_runs = r
        .sizes
        .iter()
        .map(|s| {
            let first = s.runs.first();
            format!(
                "at W = {}, {} of {} zombies, stalls and timeouts judged, {} cut",
                num(s.w as f64),
                first.map_or(0, |f| f.judged),
                s.unhealthy,
                plural(first.map_or(0, |f| f.others_cut.len()), "running shard"),
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // The counts, run by run: what the waiting bucket read, and whether it was a lower bound.
    let counts = r
        .sizes
        .iter()
        .map(|s| {
            let runs = s
                .runs
                .iter()
                .map(|run| match run.run.counts().get(WAITING_BUCKET) {
                    Some((n, at_least)) => format!(
                        "run {} read {}{} of {} waiting{}",
                        run.run.index,
                        if *at_least { "at least " } else { "exactly " },
                        num(*n as f64),
                        truth(run, WAITING_BUCKET),
                        if *at_least { " (`ActiveJobsTruncated` 1)" } else { "" },
                    ),
                    None if run.run.counts().is_empty() => format!(
                        "run {} counted no bucket (its sweeps spent the budget: no `ActiveJobs` point that minute)",
                        run.run.index
                    ),
                    None => format!("run {} did not count the waiting bucket", run.run.index),
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!("at W = {}, {runs}", num(s.w as f64))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let wrong: Vec<String> = r
        .sizes
        .iter()
        .flat_map(|s| {
            s.runs.iter().flat_map(move |run| {
                run.wrong_counts().into_iter().map(move |wrong| {
                    format!("W = {} run {}: {wrong}", num(s.w as f64), run.run.index)
                })
            })
        })
        .collect();
    let readings = runs().map(|run| run.run.counts().len()).sum::<usize>();
    let checked = if wrong.is_empty() {
        format!(
            "all {readings} readings of the runs held against the table (an exact one equal to what its bucket \
             held, a lower bound below it)"
        )
    } else {
        format!(
            "**{} of the runs' {readings} readings were wrong**: {}",
            wrong.len(),
            wrong.join("; ")
        )
    };
    let peaks = |s: &WaitingSize| {
        let low = s.runs.iter().map(|r| r.heap_added).min().unwrap_or(0);
        format!("{:.1}–{:.1} MiB at W = {}", mib(low), mib(s.heap_peak()), num(s.w as f64))
    };
    let (peak_small, peak_large) = (small.heap_peak(), large.heap_peak());
    let touched: usize = r.sizes.iter().map(|s| s.healthy_touched).sum();
    // In AWS: the waiting bucket's count, capped, against counting the whole list; and a pass
    // of the waiting sweep over the list at the template's page.
    let per_shard = large.w as f64 / shards;
    let count_pages =
        ((per_shard / r.count_page as f64).floor() + 1.0).min(r.count_max_pages as f64);
    let count_entries = per_shard.min(cap as f64);
    let count_rru =
        shards * count_pages * query_ru(r.index_entry * count_entries / count_pages.max(1.0));
    let whole_rru = shards * query_ru(r.index_entry * per_shard);
    let month = |rru: f64| money(rru * MINUTES_PER_MONTH * RRU_PRICE);
    let page = DEFAULT_REAPER_PAGE as f64;
    let pass_pages = (per_shard / page).floor() + 1.0;
    let pass_calls = pass_pages * (1.0 + (page / LIST_CHECKS_AT_ONCE as f64).ceil());
    let pass_s = |ms: f64| pass_calls * ms / 1000.0;
    let runs_per_pass = (pass_s(10.0) / REAPER_BUDGET_S as f64).ceil().max(1.0);
    let pass_rru = shards * pass_pages * query_ru(r.index_entry * page)
        + large.w as f64 * 0.5 * (r.list_entry_size as f64 / 4096.0).ceil();
    let _ = writeln!(
        w,
        "\n**Reading.** *Time:* every run ended within {:.1} s of its start (budget {} s; the bench fails a run past \
         {:.0} s): the budget cuts the list, and a run ends with the pages then in flight and, if its sweeps left \
         time, its counts. *The other sweeps* {}: in the first run {first_runs} (healthy running jobs changed: \
         {touched}). *Coverage:* the waiting sweep went through the whole list in {} at W = {} and {} at \
         W = {}, each run resuming where the last stopped. *The counts:* {counts}; {checked}. *Memory:* the \
         runs' heap peaks were {} and {}: the highest {} for a list {} as long (the bench fails above \
         {HEAP_GROWTH_LIMIT}×), against the {} MB the reaper gets (`MemorySize`, which also holds its binary \
         and runtime); the whole process, the bench's own data and the local stack, held {:.1}–{:.1} MiB of heap \
         when the runs were fired. *What grows with W* is not a run — its sweeps stop at the budget, its counts \
         at {} pages a shard — but the passes over the list. In AWS the waiting bucket's count at W = {} reads at \
         most {} entries of {:.0} B a run, {} RRU ({} a month at one run a minute), where counting the whole list \
         would read {} RRU ({} a month); and a pass of the waiting sweep over W = {} at the template's page {} \
         (one list read per job, {LIST_CHECKS_AT_ONCE} at a time per shard, shards side by side) takes \
         {:.0}–{:.0} s at 5–10 ms a call against the {REAPER_BUDGET_S} s budget ({} a pass at 10 ms) and \
         reads {} RRU (W index entries and W list entries), {} a month at that pace (a run a minute).\n",
        longest,
        r.budget,
        allowed,
        if crowded { "**were crowded out**" } else { "were not crowded out" },
        covered(small),
        num(small.w as f64),
        covered(large),
        num(large.w as f64),
        peaks(small),
        peaks(large),
        ratio(peak_large as f64, peak_small as f64),
        ratio(large.w as f64, small.w as f64),
        r.memory_mb,
        mib(runs().map(|r| r.heap_before).min().unwrap_or(0)),
        mib(runs().map(|r| r.heap_before).max().unwrap_or(0)),
        r.count_max_pages,
        num(large.w as f64),
        num(shards * count_entries),
        r.index_entry,
        num(count_rru),
        month(count_rru),
        num(whole_rru),
        month(whole_rru),
        num(large.w as f64),
        DEFAULT_REAPER_PAGE,
        pass_s(5.0),
        pass_s(10.0),
        plural(runs_per_pass as usize, "run"),
        num(pass_rru),
        month(pass_rru / runs_per_pass),
    );
    let _ = writeln!(
        w,
        "Local seeding of the waiting jobs: {}. A run's template timeout is {} s.\n",
        r.sizes
            .iter()
            .map(|s| format!("{:.0} s for W = {}", s.seed_s, num(s.w as f64)))
            .collect::<Vec<_>>()
            .join(", "),
        r.timeout.as_secs()
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
                let bench = Bench::start("reaper", None, LOCAL_TIMEOUT_S).await?;
                eprintln!("N={n}: reaper's local stack up at {}", bench.stack.api_url);
                let templates = bench.templates().await?;
                let result = reaper_scenario(&bench, &templates, n, max_runs).await?;
                bench.stack.shutdown();
                anyhow::Ok(result)
            },
            async {
                let bench = Bench::start("expirer", None, LOCAL_TIMEOUT_S).await?;
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
    // A waiting backlog of one tenant, on a stack of its own, alone: its heap is measured in
    // this process.
    let waiting_w = env_usize("LONGHAUL_VOLUME_WAITING").unwrap_or(100_000);
    let waiting = if waiting_w > 0 {
        let budget = env_usize("LONGHAUL_VOLUME_WAITING_BUDGET")
            .map_or(WAITING_BUDGET_S, |budget| budget as u64);
        let running = env_usize("LONGHAUL_VOLUME_WAITING_RUNNING").unwrap_or(2_000);
        let bench = Bench::start("waiting", Some(budget), WAITING_TIMEOUT_S).await?;
        eprintln!("W={waiting_w}: the waiting backlog's local stack up at {}", bench.stack.api_url);
        let templates = bench.templates().await?;
        let result = waiting_scenario(&bench, &templates, waiting_w, running, max_runs).await?;
        bench.stack.shutdown();
        Some(result)
    } else {
        None
    };
    let md = report(&setup, &reapers, &expirers, waiting.as_ref(), started.elapsed().as_secs_f64());
    longhaul_bench::write_section("20-volume", &md)?;
    let failures = waiting.as_ref().map(WaitingResult::failures).unwrap_or_default();
    if !failures.is_empty() {
        bail!(
            "the waiting backlog's proof failed (the section is written):\n{}",
            failures.join("\n")
        );
    }
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
    fn the_heap_counts_what_is_allocated() {
        // The other tests of this binary allocate and free beside this one (the count is the
        // process's): what they free meanwhile is allowed for, well under the block.
        const SLACK: usize = 4 << 20;
        let before = heap::reset();
        let block = vec![1u8; 8 << 20];
        assert!(
            heap::peak() + SLACK >= before + block.len(),
            "{} < {before} + 8 MiB - 4 MiB",
            heap::peak()
        );
    }

    fn waiting_run(index: usize, wall_s: f64, heap_added: usize) -> WaitingRun {
        WaitingRun {
            run: Run { index, wall_s, report: json!({}), ..Default::default() },
            heap_before: 0,
            heap_added,
            waiting_cut: 0,
            others_cut: Vec::new(),
            judged: 3,
            truth: BTreeMap::from([("waiting".to_owned(), 1000), ("running".to_owned(), 60)]),
        }
    }

    #[test]
    fn a_run_reads_its_counts_and_whether_each_is_a_lower_bound() {
        let run = Run {
            report: json!({"active": {"waiting": 8000, "running": 60}, "active_at_least": ["waiting"]}),
            ..Default::default()
        };
        assert_eq!(
            run.counts(),
            BTreeMap::from([
                ("running".to_owned(), (60, false)),
                ("waiting".to_owned(), (8000, true))
            ])
        );
        assert_eq!(run.counted(), 8060);
        assert_eq!(
            (run.reading("waiting"), run.reading("running")),
            ("≥ 8,000".into(), "60".into())
        );
        assert_eq!(run.reading("queued"), "not counted");
        // A run whose sweeps spent the budget counts nothing.
        assert_eq!(Run { report: json!({"active": {}}), ..Default::default() }.counted(), 0);
    }

    #[test]
    fn a_count_is_wrong_if_exact_and_not_the_truth_or_a_lower_bound_above_it() {
        let with = |report: Value| {
            let mut run = waiting_run(1, 10.0, 0);
            run.run.report = report;
            run.wrong_counts()
        };
        let fine = with(
            json!({"active": {"waiting": 800, "running": 60}, "active_at_least": ["waiting"]}),
        );
        assert_eq!(fine, Vec::<String>::new());
        let too_many = with(json!({"active": {"waiting": 1001}, "active_at_least": ["waiting"]}));
        assert!(too_many[0].contains("at least 1,001"), "{too_many:?}");
        let not_exact = with(json!({"active": {"waiting": 800}, "active_at_least": []}));
        assert!(not_exact[0].contains("exactly 800"), "{not_exact:?}");
        let off = with(json!({"active": {"running": 59}}));
        assert_eq!(off.len(), 1, "{off:?}");
        assert_eq!(with(json!({"active": {"sideways": 1}})).len(), 1);
    }

    #[test]
    fn the_model_caps_the_counts_and_counts_after_the_sweeps() {
        // 4 running shards of 250,000: each counted 2 pages of 1,000 (a lower bound), each
        // empty shard of the other buckets one query.
        let m = ReaperModel::new(1e6, 100, 500.0, 300, 1000, 2);
        let empty = ((LIVE_BUCKETS - 1) * STATUS_SHARDS as usize) as f64;
        assert_eq!(m.count_queries, 2.0 * STATUS_SHARDS as f64 + empty);
        assert_eq!(m.count_entries, 2000.0 * STATUS_SHARDS as f64);
        assert_eq!(m.count_s(10.0), 0.02);
        // A small bucket is counted to its end, a full page needing one more (empty) page.
        let small = ReaperModel::new(4.0 * 500.0, 100, 500.0, 300, 1000, 2);
        assert_eq!(small.count_entries, 2000.0);
        assert_eq!(small.count_queries, STATUS_SHARDS as f64 + empty);
        let whole = ReaperModel::new(4.0 * 1000.0, 100, 500.0, 300, 1000, 2);
        assert_eq!(whole.count_queries, 2.0 * STATUS_SHARDS as f64 + empty);
        // No counts at all with a cap of 0.
        let off = ReaperModel::new(1e6, 100, 500.0, 300, 1000, 0);
        assert_eq!((off.count_queries, off.count_entries, off.count_rru), (0.0, 0.0, 0.0));
        // A sweep past the budget: the run ends at it, the counts get nothing.
        assert_eq!(m.run_s(10.0, m.sweep_s(10.0) / 2.0), m.sweep_s(10.0) / 2.0);
        assert_eq!(m.run_s(10.0, 1e9), m.sweep_s(10.0) + m.count_s(10.0));
    }

    #[test]
    fn the_waiting_proof_fails_on_a_run_past_its_budget_a_crowded_sweep_or_a_growing_heap() {
        let size = |w, runs| WaitingSize {
            w,
            unhealthy: 3,
            runs,
            covered_at: Some(1),
            ..Default::default()
        };
        let result = |small, large| WaitingResult {
            sizes: vec![size(100, vec![small]), size(1000, vec![large])],
            budget: 40,
            ..Default::default()
        };
        // Up to 40 s × 1.25 from the run's start, sweeps and counts.
        let fine = result(waiting_run(1, 49.0, 10 << 20), waiting_run(1, 50.0, 14 << 20));
        assert_eq!(fine.failures(), Vec::<String>::new());
        let late = result(waiting_run(1, 49.0, 10 << 20), waiting_run(1, 51.0, 10 << 20));
        assert_eq!(late.failures().len(), 1, "{:?}", late.failures());
        let mut miscounted = result(waiting_run(1, 49.0, 10 << 20), waiting_run(1, 50.0, 10 << 20));
        miscounted.sizes[1].runs[0].run.report = json!({"active": {"waiting": 7}});
        assert!(miscounted.failures()[0].contains("exactly 7"), "{:?}", miscounted.failures());
        let grown = result(waiting_run(1, 50.0, 10 << 20), waiting_run(1, 50.0, 16 << 20));
        assert!(grown.failures()[0].contains("heap"), "{:?}", grown.failures());
        let mut crowded = fine;
        crowded.sizes[1].runs[0].others_cut = vec!["running#2".into()];
        crowded.sizes[0].covered_at = None;
        assert_eq!(crowded.failures().len(), 2, "{:?}", crowded.failures());
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(1234567.0), "1,234,567");
        assert_eq!(num(12.0), "12");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(0.25), "0.25");
    }
}
