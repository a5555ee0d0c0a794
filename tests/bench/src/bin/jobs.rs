//! What a job costs and how long the submit path takes, measured on the local stack.
//!
//! Writes section `10-jobs` of BENCHMARKS.md:
//!
//! 1. **Billable AWS requests per job** by `service:Operation`, Lambda invocations and
//!    GB-seconds, and **Step Functions state transitions** (StateEntered events of the
//!    execution history, continuations included) for three scenarios run one job after another:
//!    `demo` (100 items × 100 ms), a 3-stage `csv_report` of a small uploaded CSV, and `demo`
//!    with a webhook delivered to a receiver this binary serves on 127.0.0.1.
//! 2. **$ per 1M jobs** from those counts and the price table [`PRICES`] (the one place to edit),
//!    next to an explicit model of the seeds' reference design (a Standard workflow with a state
//!    per stage and progress written to the job record every 2 s) priced the same way.
//! 3. **The submit path**: the submit handler's own time vs its time in AWS calls over ~300
//!    submissions, and local submit → succeeded latency over ~20 small jobs (observed by polling
//!    DynamoDB directly, uncounted).
//!
//! Counts are deltas of the local stack's meters (`LocalStack::calls`, `invocations`, the
//! DynamoDB write journal) around each scenario, divided by its number of jobs. The scheduled
//! functions (reaper, expirer) are excluded from per-job counts and reported as a fixed cost.
//!
//! Run: `cargo run --profile bench-local -p longhaul-bench --bin jobs` (needs `make venv`).
//! `LONGHAUL_JOBS_SUBMITS` (default 300), `LONGHAUL_JOBS_LATENCY` (default 20) and
//! `LONGHAUL_JOBS_PER_SCENARIO` (default 3) size the runs.
//!
//! One file of ~1,500 lines on purpose: a benchmark is one scenario read top to bottom (run,
//! count, price, write the section), and its steps are used nowhere else.

use longhaul_domain::JobId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_local::model::EventSpec;
use longhaul_local::{LocalStack, Options};
use serde_json::{Value, json};

// ------------------------------------------------------------------------------------------
// PRICE TABLE — us-east-1 list prices as we understand them on the date of the run. They must
// be checked against https://aws.amazon.com/pricing before anyone relies on them. This table is
// the one place to edit; the report prints it.
// ------------------------------------------------------------------------------------------

/// One line of the price table.
#[derive(Debug, Clone, Copy)]
struct Price {
    /// What is billed.
    item: &'static str,
    /// Dollars per `per` units.
    dollars: f64,
    /// Units the price is quoted for.
    per: f64,
    /// The unit.
    unit: &'static str,
}

impl Price {
    fn unit_price(&self) -> f64 {
        self.dollars / self.per
    }
}

/// Indexes into [`PRICES`].
mod p {
    pub const LAMBDA_REQUESTS: usize = 0;
    pub const LAMBDA_GB_S: usize = 1;
    pub const APIGW_HTTP: usize = 2;
    pub const SQS: usize = 3;
    pub const SFN_TRANSITIONS: usize = 4;
    pub const DDB_WRU: usize = 5;
    pub const DDB_RRU: usize = 6;
    pub const S3_PUT: usize = 7;
    pub const S3_GET: usize = 8;
}

/// us-east-1 list prices (see the comment above).
const PRICES: [Price; 9] = [
    Price { item: "Lambda requests", dollars: 0.20, per: 1e6, unit: "requests" },
    Price { item: "Lambda duration, arm64", dollars: 0.000_013_333_4, per: 1.0, unit: "GB-second" },
    Price { item: "API Gateway HTTP API requests", dollars: 1.00, per: 1e6, unit: "requests" },
    Price { item: "SQS standard requests", dollars: 0.40, per: 1e6, unit: "requests" },
    Price {
        item: "Step Functions Standard state transitions",
        dollars: 0.025,
        per: 1e3,
        unit: "transitions",
    },
    Price {
        item: "DynamoDB on-demand write request units",
        dollars: 0.625,
        per: 1e6,
        unit: "WRU (≤1 KB write)",
    },
    Price {
        item: "DynamoDB on-demand read request units",
        dollars: 0.125,
        per: 1e6,
        unit: "RRU (≤4 KB strong read; eventual = 0.5)",
    },
    Price { item: "S3 Standard PUT/COPY/POST/LIST", dollars: 0.005, per: 1e3, unit: "requests" },
    Price {
        item: "S3 Standard GET/HEAD (and other reads)",
        dollars: 0.0004,
        per: 1e3,
        unit: "requests",
    },
];

/// Billable quantities for one job (or one scheduled run).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Bill {
    lambda_requests: f64,
    lambda_gb_s: f64,
    apigw_requests: f64,
    sqs_requests: f64,
    transitions: f64,
    wru: f64,
    rru: f64,
    s3_put: f64,
    s3_get: f64,
}

impl Bill {
    /// Quantities in [`PRICES`] order.
    fn quantities(&self) -> [f64; 9] {
        let mut q = [0.0; 9];
        q[p::LAMBDA_REQUESTS] = self.lambda_requests;
        q[p::LAMBDA_GB_S] = self.lambda_gb_s;
        q[p::APIGW_HTTP] = self.apigw_requests;
        q[p::SQS] = self.sqs_requests;
        q[p::SFN_TRANSITIONS] = self.transitions;
        q[p::DDB_WRU] = self.wru;
        q[p::DDB_RRU] = self.rru;
        q[p::S3_PUT] = self.s3_put;
        q[p::S3_GET] = self.s3_get;
        q
    }

    /// Dollars per line of [`PRICES`].
    fn dollars_by_line(&self) -> [f64; 9] {
        let q = self.quantities();
        std::array::from_fn(|i| q[i] * PRICES[i].unit_price())
    }

    /// Dollars in all.
    fn dollars(&self) -> f64 {
        self.dollars_by_line().iter().sum()
    }

    /// Dollars of everything but the job's own compute: `job_gb_s` of Lambda duration.
    fn overhead(&self, job_gb_s: f64) -> f64 {
        self.dollars() - job_gb_s * PRICES[p::LAMBDA_GB_S].unit_price()
    }
}

/// Nearest-rank percentile (`pct` in 0–100) of `values`; `NaN` when empty.
fn percentile(values: &[f64], pct: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// DynamoDB's size of an attribute value (strings and binaries by length, numbers about one
/// byte per two digits plus one, maps and lists 3 bytes plus 1 per element).
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
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// Write request units of one write of an item of `bytes`.
fn wru(bytes: usize) -> f64 {
    bytes.max(1).div_ceil(1024) as f64
}

/// Read request units of one strongly consistent read of `bytes`.
fn rru(bytes: usize) -> f64 {
    bytes.max(1).div_ceil(4096) as f64
}

// ------------------------------------------------------------------------------------------
// The stack and its meters
// ------------------------------------------------------------------------------------------

/// Functions that run on a schedule: their cost is per minute or hour, not per job.
const SCHEDULED: [&str; 2] = ["ReaperFunction", "ExpirerFunction"];

struct Bench {
    stack: LocalStack,
    http: reqwest::Client,
    token: String,
    dynamodb: aws_sdk_dynamodb::Client,
    sfn: aws_sdk_sfn::Client,
    table: String,
    machine: String,
    /// Logical names of the functions behind HTTP API routes (each invocation = 1 API request).
    http_functions: BTreeSet<String>,
    /// Logical names of the SQS-triggered functions.
    sqs_functions: BTreeSet<String>,
    /// MemorySize (MB) per logical function.
    memory: BTreeMap<String, f64>,
    /// Schedule rate per scheduled function.
    rates: BTreeMap<String, Duration>,
    inbox: Inbox,
    receiver: SocketAddr,
}

/// What the meters read at one moment.
struct Marks {
    calls: BTreeMap<String, u64>,
    by_function: BTreeMap<String, BTreeMap<String, u64>>,
    invocations: usize,
    journal: usize,
}

type Inbox = Arc<Mutex<BTreeMap<String, Vec<(HeaderMap, Vec<u8>)>>>>;
type HeaderMap = axum::http::HeaderMap;

/// Requests S3 does not bill.
fn is_free_op(op: &str) -> bool {
    matches!(op, "s3:DeleteObject" | "s3:AbortMultipartUpload")
}

/// A scenario's results, per job.
#[derive(Default)]
struct Scenario {
    name: String,
    description: String,
    jobs: usize,
    stages: usize,
    /// Billable AWS requests by `service:Operation`, per job (scheduled functions excluded).
    ops: BTreeMap<String, f64>,
    /// The same, by the function that made them (`client`: none did, e.g. a presigned PUT).
    ops_by_function: BTreeMap<String, BTreeMap<String, f64>>,
    /// Invocations and GB-seconds per function, per job.
    lambda: BTreeMap<String, (f64, f64, f64)>,
    /// State transitions per job, and the states entered by the first job, in order.
    transitions: f64,
    executions: f64,
    path: Vec<String>,
    /// Effective DynamoDB writes per job by item kind.
    writes_by_kind: BTreeMap<String, f64>,
    /// Measured item sizes (bytes) by kind.
    sizes: BTreeMap<String, usize>,
    /// The stage function's wall time per job (ms): the job's working time.
    stage_ms: f64,
    /// The worker functions' GB-s per job: the job's own compute.
    stage_gb_s: f64,
    /// Shards the job's stage fans out into (0: none), and the transitions of the map's
    /// child executions per job (in `transitions`).
    shards: u64,
    shard_transitions: f64,
    ours: Bill,
    reference: Bill,
    reference_transitions: f64,
    reference_progress_writes: f64,
}

impl Bench {
    /// A bench on a stack of its own, its functions configured as the template says, but for
    /// `env` (every function's).
    async fn start(env: &[(&str, &str)]) -> anyhow::Result<Self> {
        longhaul_aws::sdk::install_tls_provider();
        let mut options = Options::ephemeral(longhaul_bench::workspace_root());
        options.env_overrides.insert("LONGHAUL_ALLOW_INSECURE_CALLBACKS".into(), "1".into());
        for (name, value) in env {
            options.env_overrides.insert((*name).into(), (*value).into());
        }
        let stack = LocalStack::start(options)
            .await
            .context("starting the local stack (make venv first)")?;
        stack
            .faults
            .set_plan(longhaul_local::faults::FaultPlan { journal: true, ..Default::default() });
        let config = stack.emulator_sdk_config().await;
        let mut http_functions = BTreeSet::new();
        let mut sqs_functions = BTreeSet::new();
        let mut rates = BTreeMap::new();
        for spec in longhaul_local::model::functions(&stack.template)? {
            for event in &spec.events {
                match event {
                    EventSpec::Http { .. } => {
                        http_functions.insert(spec.logical.clone());
                    }
                    EventSpec::Sqs { .. } => {
                        sqs_functions.insert(spec.logical.clone());
                    }
                    EventSpec::Schedule { every: Some(every), .. } => {
                        rates.insert(spec.logical.clone(), *every);
                    }
                    _ => {}
                }
            }
        }
        let global = stack.template.function_globals["MemorySize"].as_f64().unwrap_or(128.0);
        let memory = stack
            .template
            .of_type("AWS::Serverless::Function")
            .map(|(name, r)| {
                (name.clone(), r["Properties"]["MemorySize"].as_f64().unwrap_or(global))
            })
            .collect();
        let (receiver, inbox) = serve_receiver().await?;
        Ok(Bench {
            token: stack.token("bench-jobs"),
            http: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?,
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            sfn: aws_sdk_sfn::Client::new(&config),
            table: stack.resource("JobsTable"),
            machine: stack.resource("JobStateMachine"),
            stack,
            http_functions,
            sqs_functions,
            memory,
            rates,
            inbox,
            receiver,
        })
    }

    fn marks(&self) -> Marks {
        Marks {
            calls: self.stack.calls.snapshot(),
            by_function: self.stack.calls.by_function(),
            invocations: self.stack.invocations.snapshot().len(),
            journal: self.stack.faults.journal().len(),
        }
    }

    /// `METHOD path` on the API with the bench's token.
    async fn api(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method.parse()?, format!("{}{path}", self.stack.api_url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Submits a job (a fresh Idempotency-Key each time) and returns its id.
    async fn submit(&self, body: &Value) -> anyhow::Result<JobId> {
        let key = uuid::Uuid::new_v4().simple().to_string();
        let (status, reply) = self.api("POST", "/jobs", Some(body), Some(&key)).await?;
        if status != 202 {
            bail!("submit answered {status}: {reply}");
        }
        reply["job_id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| anyhow!("no job_id in {reply}"))
    }

    /// Uploads `bytes` as a client would: `POST /uploads`, then the presigned PUT.
    async fn upload(&self, bytes: Vec<u8>) -> anyhow::Result<String> {
        let body =
            json!({"filename": "sales.csv", "content_type": "text/csv", "size_bytes": bytes.len()});
        let (status, reply) = self.api("POST", "/uploads", Some(&body), None).await?;
        if status != 201 {
            bail!("uploads answered {status}: {reply}");
        }
        let mut put =
            self.http.put(reply["upload_url"].as_str().context("upload_url")?).body(bytes);
        for (name, value) in reply["headers"].as_object().context("headers")? {
            put = put.header(name, value.as_str().context("header value")?);
        }
        let status = put.send().await?.status();
        if !status.is_success() {
            bail!("presigned upload answered {status}");
        }
        reply["input"].as_str().map(str::to_owned).context("input")
    }

    /// An item of the job table, read directly from the emulator (uncounted).
    async fn item(
        &self,
        pk: &str,
        sk: &str,
    ) -> anyhow::Result<Option<HashMap<String, AttributeValue>>> {
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

    /// Polls the job record directly (uncounted) until the job is terminal; returns its status.
    async fn wait_terminal(&self, job_id: &JobId, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(item) = self.item(&format!("JOB#{job_id}"), "JOB").await?
                && let Some(AttributeValue::S(status)) = item.get("status")
                && matches!(status.as_str(), "succeeded" | "failed" | "cancelled" | "expired")
            {
                return Ok(status.clone());
            }
            if Instant::now() > deadline {
                bail!("job {job_id} not terminal after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The executions of a job (the one that took its direct run over and its continuations),
    /// by name.
    async fn executions(&self, job_id: &JobId) -> anyhow::Result<Vec<String>> {
        let mut arns = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .sfn
                .list_executions()
                .state_machine_arn(&self.machine)
                .max_results(1000)
                .set_next_token(token)
                .send()
                .await?;
            for execution in page.executions() {
                let name = execution.name();
                if name == job_id.as_str() || name.starts_with(&format!("{job_id}.")) {
                    arns.push(execution.execution_arn().to_owned());
                }
            }
            token = page.next_token;
            if token.is_none() {
                break;
            }
        }
        // None at all: a direct run finished the job.
        Ok(arns)
    }

    /// Waits until the job's executions have ended.
    async fn wait_executions(&self, job_id: &JobId) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut running = false;
            for arn in self.executions(job_id).await? {
                let status = self
                    .sfn
                    .describe_execution()
                    .execution_arn(&arn)
                    .send()
                    .await?
                    .status()
                    .as_str()
                    .to_owned();
                running |= status == "RUNNING";
            }
            if !running {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{job_id}: an execution still runs after 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// StateEntered events of the job's executions (retries and continuations included), and
    /// the names of the states entered, in order.
    async fn transitions(&self, job_id: &JobId) -> anyhow::Result<(usize, usize, Vec<String>)> {
        let executions = self.executions(job_id).await?;
        let mut names = Vec::new();
        for arn in &executions {
            let mut token = None;
            loop {
                let page = self
                    .sfn
                    .get_execution_history()
                    .execution_arn(arn)
                    .max_results(1000)
                    .set_next_token(token)
                    .send()
                    .await?;
                for event in page.events() {
                    if event.r#type().as_str().ends_with("StateEntered") {
                        names.push(
                            event
                                .state_entered_event_details()
                                .map(|d| d.name().to_owned())
                                .unwrap_or_default(),
                        );
                    }
                }
                token = page.next_token;
                if token.is_none() {
                    break;
                }
            }
        }
        Ok((names.len(), executions.len(), names))
    }

    /// Waits until no hosted function but the scheduled ones is called or invoked for 600 ms.
    async fn settle(&self) {
        let reading = || {
            let by_function = self.stack.calls.by_function();
            let scheduled: u64 = SCHEDULED
                .iter()
                .filter_map(|f| by_function.get(*f))
                .flat_map(|ops| ops.values())
                .sum();
            let calls: u64 = self.stack.calls.snapshot().values().sum::<u64>() - scheduled;
            let invocations = self
                .stack
                .invocations
                .snapshot()
                .iter()
                .filter(|i| !SCHEDULED.contains(&i.function.as_str()))
                .count();
            (calls, invocations)
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = reading();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let now = reading();
            if now == last {
                return;
            }
            last = now;
        }
    }

    /// Runs `jobs` jobs one after another (`make` builds each job's request; `webhook` waits for
    /// the delivery too) and measures them.
    async fn scenario<F, Fut>(
        &self,
        name: &str,
        description: &str,
        jobs: usize,
        (stages, shards): (usize, u64),
        webhook: bool,
        make: F,
    ) -> anyhow::Result<Scenario>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<(Value, Option<String>)>>,
    {
        eprintln!("scenario {name}: {jobs} job(s)");
        self.settle().await;
        let before = self.marks();
        let mut job_ids = Vec::new();
        for _ in 0..jobs {
            let (body, key) = make().await?;
            let job_id = self.submit(&body).await?;
            let status = self.wait_terminal(&job_id, Duration::from_secs(300)).await?;
            if status != "succeeded" {
                bail!("{name}: job {job_id} ended {status}");
            }
            self.wait_executions(&job_id).await?;
            if webhook {
                let key = key.as_deref().context("webhook scenario without a receiver key")?;
                let deadline = Instant::now() + Duration::from_secs(60);
                while self.inbox.lock().expect("inbox").get(key).is_none_or(Vec::is_empty) {
                    if Instant::now() > deadline {
                        bail!("{name}: no webhook delivered for {job_id}");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            self.settle().await;
            job_ids.push(job_id);
        }
        let after = self.marks();
        let n = jobs as f64;

        // Requests by operation: every call, minus those the scheduled functions made.
        let mut ops = BTreeMap::new();
        for (op, count) in &after.calls {
            let mut delta = (*count - before.calls.get(op).copied().unwrap_or(0)) as f64;
            for function in SCHEDULED {
                let at = |m: &Marks| {
                    m.by_function.get(function).and_then(|o| o.get(op)).copied().unwrap_or(0)
                };
                delta -= (at(&after) - at(&before)) as f64;
            }
            if delta > 0.0 {
                ops.insert(op.clone(), delta / n);
            }
        }

        // The same by function; what no function made is the client's.
        let mut ops_by_function: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
        for (function, calls) in &after.by_function {
            if SCHEDULED.contains(&function.as_str()) {
                continue;
            }
            for (op, count) in calls {
                let earlier = before.by_function.get(function).and_then(|o| o.get(op));
                let delta = (*count - earlier.copied().unwrap_or(0)) as f64 / n;
                if delta > 0.0 {
                    ops_by_function.entry(function.clone()).or_default().insert(op.clone(), delta);
                }
            }
        }
        for (op, per_job) in &ops {
            let attributed: f64 = ops_by_function.values().filter_map(|o| o.get(op)).sum::<f64>();
            if per_job - attributed > 1e-9 {
                ops_by_function
                    .entry("client".to_owned())
                    .or_default()
                    .insert(op.clone(), per_job - attributed);
            }
        }

        // Lambda: invocations and GB-seconds per function; the stage function's time per job.
        let invocations = self.stack.invocations.snapshot();
        let mut lambda: BTreeMap<String, (f64, f64, f64)> = BTreeMap::new();
        let mut stage_ms = 0.0;
        for record in &invocations[before.invocations.min(invocations.len())..] {
            if SCHEDULED.contains(&record.function.as_str()) {
                continue;
            }
            let memory = self.memory.get(&record.function).copied().unwrap_or(128.0);
            let entry = lambda.entry(record.function.clone()).or_default();
            entry.0 += 1.0 / n;
            entry.1 += record.duration_ms / n;
            entry.2 += record.duration_ms / 1000.0 * memory / 1024.0 / n;
            if is_worker(&record.function) {
                stage_ms += record.duration_ms / n;
            }
        }

        // DynamoDB writes that took effect, by item kind.
        let journal = self.stack.faults.journal();
        let mut writes_by_kind: BTreeMap<String, f64> = BTreeMap::new();
        for entry in &journal[before.journal.min(journal.len())..] {
            let kind = match entry.sk.as_deref() {
                Some(sk) if sk.starts_with("WEBHOOK#") => "WEBHOOK# (delivery record)".to_owned(),
                Some(sk) => sk.to_owned(),
                None => format!("{} (no single key)", entry.operation),
            };
            *writes_by_kind.entry(kind).or_default() += 1.0 / n;
        }

        // Item sizes, measured on the last job.
        let last = job_ids.last().context("no jobs")?;
        let mut sizes = BTreeMap::new();
        let pk = format!("JOB#{last}");
        for sk in ["JOB", "PROGRESS"] {
            if let Some(item) = self.item(&pk, sk).await? {
                sizes.insert(sk.to_owned(), item_size(&item));
            }
        }
        let items = self
            .dynamodb
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            // Delivery records have a partition of their own (longhaul_aws::jobs::delivery_pk).
            .expression_attribute_values(":pk", AttributeValue::S(format!("DELIVERY#{last}")))
            .send()
            .await?;
        for item in items.items() {
            if let Some(AttributeValue::S(sk)) = item.get("sk")
                && sk.starts_with("WEBHOOK#")
            {
                let size = sizes.entry("WEBHOOK# (delivery record)".to_owned()).or_insert(0);
                *size = (*size).max(item_size(item));
            }
        }
        let idem = self
            .dynamodb
            .scan()
            .table_name(&self.table)
            .filter_expression("job_id = :id AND begins_with(pk, :idem)")
            .expression_attribute_values(":id", AttributeValue::S(last.to_string()))
            .expression_attribute_values(":idem", AttributeValue::S("IDEM#".into()))
            .send()
            .await?;
        if let Some(item) = idem.items().first() {
            sizes.insert("IDEM".to_owned(), item_size(item));
        }

        let mut transitions = 0.0;
        let mut executions = 0.0;
        let mut path = Vec::new();
        for (i, job_id) in job_ids.iter().enumerate() {
            let (count, execs, names) = self.transitions(job_id).await?;
            transitions += count as f64 / n;
            executions += execs as f64 / n;
            if i == 0 {
                path = names;
            }
        }

        // A fanned-out job's shards run as the `FanOut` map's child executions, which the
        // emulator does not list: each shard invocation enters `Shard` and `More?`, and each
        // shard ends in `ShardDone`. Its invocations are the worker's, less the direct run's
        // one and the parent's `Run`s.
        let mut shard_transitions = 0.0;
        if shards > 0 {
            let worker: f64 = lambda.iter().filter(|(f, _)| is_worker(f)).map(|(_, l)| l.0).sum();
            let runs = path.iter().filter(|state| *state == "Run").count() as f64;
            let shard_invocations = (worker - 1.0 - runs).max(shards as f64);
            shard_transitions = 2.0 * shard_invocations + shards as f64;
            transitions += shard_transitions;
        }

        let mut scenario = Scenario {
            name: name.to_owned(),
            description: description.to_owned(),
            jobs,
            stages,
            ops,
            ops_by_function,
            lambda,
            transitions,
            executions,
            path,
            writes_by_kind,
            sizes,
            stage_ms,
            shards,
            shard_transitions,
            ..Default::default()
        };
        self.price(&mut scenario, &before, &after, n);
        Ok(scenario)
    }

    /// Prices a scenario (ours) and the reference design's model of it.
    fn price(&self, s: &mut Scenario, before: &Marks, after: &Marks, n: f64) {
        let size = |kind: &str| s.sizes.get(kind).copied().unwrap_or(1024);
        let job_and_progress = size("JOB") + size("PROGRESS");
        let read_units = rru(job_and_progress);
        let lambda_requests: f64 = s.lambda.values().map(|l| l.0).sum();
        let gb_s: f64 = s.lambda.values().map(|l| l.2).sum();
        let apigw: f64 = s
            .lambda
            .iter()
            .filter(|(f, _)| self.http_functions.contains(*f))
            .map(|(_, l)| l.0)
            .sum();
        let esm_batches: f64 = s
            .lambda
            .iter()
            .filter(|(f, _)| self.sqs_functions.contains(*f))
            .map(|(_, l)| l.0)
            .sum();
        let op = |name: &str| s.ops.get(name).copied().unwrap_or(0.0);
        let sum_ops = |pred: &dyn Fn(&str) -> bool| {
            s.ops.iter().filter(|(k, _)| pred(k)).map(|(_, v)| *v).sum::<f64>()
        };
        let sqs = sum_ops(&|k| k.starts_with("sqs:")) + 2.0 * esm_batches;
        let is_put_class = |k: &str| {
            matches!(
                k,
                "s3:PutObject"
                    | "s3:CopyObject"
                    | "s3:UploadPart"
                    | "s3:CreateMultipartUpload"
                    | "s3:CompleteMultipartUpload"
                    | "s3:ListObjects"
                    | "s3:ListObjectsV2"
                    | "s3:DeleteObjects"
            )
        };
        let is_free = is_free_op;
        let s3_put = sum_ops(&|k| k.starts_with("s3:") && is_put_class(k));
        let s3_get = sum_ops(&|k| k.starts_with("s3:") && !is_put_class(k) && !is_free(k));
        let write_calls =
            op("dynamodb:PutItem") + op("dynamodb:UpdateItem") + op("dynamodb:DeleteItem");
        let journaled: f64 = s.writes_by_kind.values().sum();
        let mut wru_total: f64 = s
            .writes_by_kind
            .iter()
            .map(|(kind, count)| {
                count * if kind.contains("no single key") { 1.0 } else { wru(size(kind.as_str())) }
            })
            .sum();
        // Writes refused by their condition are billed too (1 WRU each for these small items).
        wru_total += (write_calls - journaled).max(0.0);
        wru_total += 2.0 * op("dynamodb:TransactWriteItems") + op("dynamodb:BatchWriteItem");
        let reads = op("dynamodb:GetItem")
            + op("dynamodb:Query")
            + op("dynamodb:BatchGetItem")
            + op("dynamodb:Scan");
        s.ours = Bill {
            lambda_requests,
            lambda_gb_s: gb_s,
            apigw_requests: apigw,
            sqs_requests: sqs,
            transitions: s.transitions,
            wru: wru_total,
            rru: reads * read_units,
            s3_put,
            s3_get,
        };

        // The reference design: the same submit, upload, dispatch and webhook delivery (the
        // calls of those functions and of clients, measured), plus a modelled workflow.
        let shared_functions =
            ["SubmitFunction", "UploadsFunction", "DispatcherFunction", "WebhookFunction"];
        let delta = |m_after: &Marks, m_before: &Marks, f: &str, op: &str| {
            let at = |m: &Marks| m.by_function.get(f).and_then(|o| o.get(op)).copied().unwrap_or(0);
            (at(m_after) - at(m_before)) as f64 / n
        };
        let mut shared_ops: BTreeMap<String, f64> = BTreeMap::new();
        for f in shared_functions {
            for op in after
                .by_function
                .get(f)
                .map(|o| o.keys().cloned().collect::<Vec<_>>())
                .unwrap_or_default()
            {
                *shared_ops.entry(op.clone()).or_default() += delta(after, before, f, &op);
            }
        }
        // Calls no hosted function made (the client's presigned upload), except Step Functions'
        // task invocations, which the model counts itself.
        for (op, per_job) in &s.ops {
            let by_functions: f64 = after
                .by_function
                .keys()
                .filter(|f| !SCHEDULED.contains(&f.as_str()))
                .map(|f| delta(after, before, f, op))
                .sum();
            let unattributed = per_job - by_functions;
            if unattributed > 1e-9 && op != "lambda:Invoke" {
                *shared_ops.entry(op.clone()).or_default() += unattributed;
            }
        }
        let shared_op = |name: &str| shared_ops.get(name).copied().unwrap_or(0.0);
        let shared_lambda = |pick: &dyn Fn(&str) -> bool, field: usize| -> f64 {
            s.lambda
                .iter()
                .filter(|(f, _)| shared_functions.contains(&f.as_str()) && pick(f))
                .map(|(_, l)| [l.0, l.1, l.2][field])
                .sum()
        };
        let shared_wru: f64 = ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"]
            .iter()
            .map(|o| shared_op(o))
            .sum::<f64>()
            * wru(size("JOB"));
        let shared_reads = shared_op("dynamodb:GetItem") + shared_op("dynamodb:Query");
        let webhook_messages = s.lambda.get("WebhookFunction").map(|l| l.0).unwrap_or(0.0);
        let stages = s.stages as f64;
        let stage_gb_s: f64 = s.lambda.iter().filter(|(f, _)| is_worker(f)).map(|(_, l)| l.2).sum();
        s.stage_gb_s = stage_gb_s;
        let progress_writes = (s.stage_ms / 2000.0).floor();
        // One job record holding the progress fields too.
        let reference_job_wru = wru(job_and_progress);
        s.reference_progress_writes = progress_writes;
        // The fewest states the design allows: one Task per stage, the first marking the job
        // running and the last marking it succeeded, a failure state success never enters.
        s.reference_transitions = stages;
        let stage_s3_gets: f64 = ["s3:GetObject", "s3:HeadObject"]
            .iter()
            .map(|o| {
                let count = |calls: &BTreeMap<String, BTreeMap<String, u64>>| -> f64 {
                    calls
                        .iter()
                        .filter(|(f, _)| is_worker(f))
                        .map(|(_, m)| m.get(*o).copied().unwrap_or(0) as f64)
                        .sum()
                };
                count(&after.by_function) / n - count(&before.by_function) / n
            })
            .sum::<f64>()
            .max(0.0);
        s.reference = Bill {
            lambda_requests: shared_lambda(&|_| true, 0) + stages,
            lambda_gb_s: shared_lambda(&|_| true, 2) + stage_gb_s,
            apigw_requests: apigw,
            // Its stage queues each webhook message itself: one SendMessage per delivery ours made.
            sqs_requests: shared_ops
                .iter()
                .filter(|(k, _)| k.starts_with("sqs:"))
                .map(|(_, v)| v)
                .sum::<f64>()
                + 2.0 * esm_batches
                + webhook_messages,
            transitions: s.reference_transitions,
            wru: shared_wru + (2.0 + progress_writes) * reference_job_wru,
            rru: (shared_reads + stages) * read_units,
            s3_put: shared_ops
                .iter()
                .filter(|(k, _)| k.starts_with("s3:") && is_put_class(k))
                .map(|(_, v)| v)
                .sum::<f64>()
                + stages
                + 1.0,
            s3_get: stage_s3_gets,
        };
    }

    /// Fires a schedule once while no job runs; returns its calls and its Lambda bill.
    async fn idle_run(
        &self,
        function: &str,
        schedule: &str,
    ) -> anyhow::Result<(BTreeMap<String, u64>, Bill, f64)> {
        let before = self.marks();
        let response = self
            .http
            .post(format!("{}/_local/schedules/{schedule}", self.stack.api_url))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("firing {schedule}: {}", response.text().await?);
        }
        let after = self.marks();
        let mut calls = BTreeMap::new();
        for (op, count) in after.by_function.get(function).cloned().unwrap_or_default() {
            let delta = count
                - before.by_function.get(function).and_then(|o| o.get(&op)).copied().unwrap_or(0);
            if delta > 0 {
                calls.insert(op, delta);
            }
        }
        let records = self.stack.invocations.snapshot();
        let record = records[before.invocations..]
            .iter()
            .rev()
            .find(|r| r.function == function)
            .context("no invocation record")?;
        let memory = self.memory.get(function).copied().unwrap_or(128.0);
        let get = |op: &str| calls.get(op).copied().unwrap_or(0) as f64;
        let s3_put = get("s3:ListObjectsV2")
            + get("s3:ListObjects")
            + get("s3:PutObject")
            + get("s3:DeleteObjects");
        let reads = get("dynamodb:GetItem") + get("dynamodb:Query") + get("dynamodb:Scan");
        let writes =
            get("dynamodb:PutItem") + get("dynamodb:UpdateItem") + get("dynamodb:DeleteItem");
        let sqs: f64 =
            calls.iter().filter(|(k, _)| k.starts_with("sqs:")).map(|(_, v)| *v as f64).sum();
        let bill = Bill {
            lambda_requests: 1.0,
            lambda_gb_s: record.duration_ms / 1000.0 * memory / 1024.0,
            sqs_requests: sqs,
            wru: writes,
            rru: reads,
            s3_put,
            s3_get: get("s3:GetObject") + get("s3:HeadObject"),
            ..Default::default()
        };
        Ok((calls, bill, record.duration_ms))
    }
}

/// A local webhook receiver: `POST /{key}` answers 204 and keeps the request.
async fn serve_receiver() -> anyhow::Result<(SocketAddr, Inbox)> {
    let inbox: Inbox = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let state = inbox.clone();
    let app = axum::Router::new()
        .route(
            "/{key}",
            axum::routing::post(
                |axum::extract::State(inbox): axum::extract::State<Inbox>,
                 axum::extract::Path(key): axum::extract::Path<String>,
                 headers: HeaderMap,
                 body: axum::body::Bytes| async move {
                    inbox
                        .lock()
                        .expect("inbox")
                        .entry(key)
                        .or_default()
                        .push((headers, body.to_vec()));
                    axum::http::StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(state);
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            eprintln!("webhook receiver stopped: {err}");
        }
    });
    Ok((address, inbox))
}

// ------------------------------------------------------------------------------------------
// The report
// ------------------------------------------------------------------------------------------

fn money(d: f64) -> String {
    let d = d + 0.0; // an empty f64 sum is -0.0
    if d >= 100.0 {
        format!("${d:.0}")
    } else if d >= 1.0 {
        format!("${d:.2}")
    } else {
        format!("${d:.3}")
    }
}

fn num(x: f64) -> String {
    let x = x + 0.0; // an empty f64 sum is -0.0
    if (x - x.round()).abs() < 1e-9 { format!("{x:.0}") } else { format!("{x:.2}") }
}

fn profile() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.parent().and_then(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A scheduled function's idle run: name, calls, bill, local ms, schedule rate.
type FixedRun = (String, BTreeMap<String, u64>, Bill, f64, Duration);

struct SubmitPath {
    quiet_own: Vec<f64>,
    quiet_aws: Vec<f64>,
    own: Vec<f64>,
    aws: Vec<f64>,
    total: Vec<f64>,
    client: Vec<f64>,
    aws_calls: f64,
}

fn report(
    bench: &Bench,
    scenarios: &[Scenario],
    fixed: &[FixedRun],
    submit: &SubmitPath,
    latency: &[f64],
) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "## Jobs: requests, transitions, cost and latency\n");
    let _ = writeln!(
        w,
        "Measured by `tests/bench/src/bin/jobs.rs` on the local stack (moto + the functions hosted in-process), \
         built with the `{}` profile (optimised like release, unstripped and incremental). Each scenario runs its jobs **one after \
         another**. Submit starts each job itself (none is delayed), so the intake queue and the dispatcher carry none of \
         them. Counts are deltas of the stack's meters around a scenario, divided \
         by its jobs. The scheduled reaper and expirer are excluded from per-job counts (see fixed costs). \
         The jobs run with the template's defaults (progress interval 2 s), not the tests' shortened ones.\n",
        profile()
    );

    // 1. Requests per job.
    let _ = writeln!(w, "### Billable AWS requests per job\n");
    for s in scenarios {
        let _ = writeln!(
            w,
            "- **{}**: {} ({} job(s), {} stage(s))",
            s.name, s.description, s.jobs, s.stages
        );
    }
    let mut all_ops: BTreeSet<String> = BTreeSet::new();
    for s in scenarios {
        all_ops.extend(s.ops.keys().cloned());
    }
    let _ = write!(w, "\n| service:Operation |");
    for s in scenarios {
        let _ = write!(w, " {} |", s.name);
    }
    let _ = write!(w, "\n|---|");
    for _ in scenarios {
        let _ = write!(w, "--:|");
    }
    let _ = writeln!(w);
    let row = |w: &mut String, label: &str, values: Vec<f64>| {
        let _ = write!(w, "| {label} |");
        for v in values {
            let _ = write!(w, " {} |", num(v));
        }
        let _ = writeln!(w);
    };
    for op in &all_ops {
        let label = if op == "lambda:Invoke" {
            "`lambda:Invoke` (submit → worker: the direct run; Step Functions → worker)".to_owned()
        } else {
            format!("`{op}`")
        };
        row(w, &label, scenarios.iter().map(|s| s.ops.get(op).copied().unwrap_or(0.0)).collect());
    }
    let functions: BTreeSet<String> =
        scenarios.iter().flat_map(|s| s.lambda.keys().cloned()).collect();
    for f in &functions {
        let memory = bench.memory.get(f).copied().unwrap_or(0.0);
        row(
            w,
            &format!("Lambda invocations: {f} ({memory:.0} MB)"),
            scenarios.iter().map(|s| s.lambda.get(f).map(|l| l.0).unwrap_or(0.0)).collect(),
        );
    }
    row(
        w,
        "**AWS requests above, billable** (all but the free `s3:DeleteObject`)",
        scenarios
            .iter()
            .map(|s| s.ops.iter().filter(|(op, _)| !is_free_op(op)).map(|(_, n)| n).sum())
            .collect(),
    );
    row(
        w,
        "API Gateway HTTP API requests",
        scenarios.iter().map(|s| s.ours.apigw_requests).collect(),
    );
    row(
        w,
        "SQS receive + delete by the event source mappings (modelled: 2 per batch)",
        scenarios
            .iter()
            .map(|s| {
                s.lambda
                    .iter()
                    .filter(|(f, _)| bench.sqs_functions.contains(*f))
                    .map(|(_, l)| 2.0 * l.0)
                    .sum()
            })
            .collect(),
    );
    row(
        w,
        "**Step Functions state transitions**",
        scenarios.iter().map(|s| s.transitions).collect(),
    );
    row(w, "Step Functions executions", scenarios.iter().map(|s| s.executions).collect());
    let _ = writeln!(w);
    for s in scenarios {
        let path =
            if s.path.is_empty() { "none (no execution)".to_owned() } else { s.path.join(" → ") };
        let _ = writeln!(w, "- {} — states entered (first job): {path}", s.name);
        if s.shards > 0 {
            let _ = writeln!(
                w,
                "  - and {} per job in the `FanOut` map's child executions ({} per shard): `Shard` and \
                 `More?` per shard invocation, `ShardDone` per shard — counted from the shard \
                 invocations, as the emulator lists no child executions",
                num(s.shard_transitions),
                num(s.shard_transitions / s.shards as f64)
            );
        }
    }
    let _ = writeln!(
        w,
        "\nThe billable requests by the function that made them (`client`: the presigned upload; Step Functions' invocations of the worker):\n"
    );
    let _ = writeln!(w, "| scenario | function | requests per job |\n|---|---|---|");
    for s in scenarios {
        for (function, calls) in &s.ops_by_function {
            let listed: Vec<String> = calls
                .iter()
                .filter(|(op, _)| !is_free_op(op))
                .map(|(op, n)| format!("`{op}` {}", num(*n)))
                .collect();
            if !listed.is_empty() {
                let _ = writeln!(w, "| {} | {function} | {} |", s.name, listed.join(", "));
            }
        }
    }
    let _ = writeln!(
        w,
        "\nTransitions are the StateEntered events of the job's executions (the one that took its direct run \
         over, its continuations `<job>.a<attempt>c<n>` and retries included): a job one invocation finishes has \
         none. `lambda:Invoke` is submit queueing the job's direct run (the dispatcher, for a job submit did not start), or Step Functions invoking the \
         worker (a Lambda request, counted below as an invocation, not an extra charge). The client's presigned \
         upload PUT is counted under `s3:PutObject`. Polling `GET /jobs/{{id}}` is not in these counts: each poll costs one \
         API request, one status invocation and one strongly consistent DynamoDB `Query` (job + progress); \
         SSE and webhooks avoid it. SQS polling by the event source mappings goes to the emulator directly and is \
         not metered locally, so it is modelled (one receive and one delete per one-message batch).\n"
    );

    // Lambda time and DynamoDB detail.
    let _ = writeln!(
        w,
        "Lambda time per job (ms, local wall time of the handler) and DynamoDB writes that took effect, by item:\n"
    );
    let _ = write!(w, "| |");
    for s in scenarios {
        let _ = write!(w, " {} |", s.name);
    }
    let _ = write!(w, "\n|---|");
    for _ in scenarios {
        let _ = write!(w, "--:|");
    }
    let _ = writeln!(w);
    for f in &functions {
        row(
            w,
            &format!("{f} ms"),
            scenarios.iter().map(|s| s.lambda.get(f).map(|l| l.1).unwrap_or(0.0)).collect(),
        );
    }
    row(
        w,
        "Lambda GB-s (MemorySize × duration)",
        scenarios.iter().map(|s| s.ours.lambda_gb_s).collect(),
    );
    let kinds: BTreeSet<String> =
        scenarios.iter().flat_map(|s| s.writes_by_kind.keys().cloned()).collect();
    for kind in &kinds {
        row(
            w,
            &format!("writes to `{kind}` items"),
            scenarios.iter().map(|s| s.writes_by_kind.get(kind).copied().unwrap_or(0.0)).collect(),
        );
    }
    let sized: BTreeSet<String> = scenarios.iter().flat_map(|s| s.sizes.keys().cloned()).collect();
    for kind in &sized {
        row(
            w,
            &format!("size of the `{kind}` item (bytes, at the end)"),
            scenarios.iter().map(|s| s.sizes.get(kind).copied().unwrap_or(0) as f64).collect(),
        );
    }
    let _ = writeln!(
        w,
        "\nLocal durations include the emulator's latency for every AWS call (moto on loopback, slower than \
         DynamoDB in-region: an overestimate) and the demo's deliberate sleeps (`item_ms`), which dominate its \
         stage time. `s3:DeleteObjects` (multi-object delete, a POST) is priced as PUT-class here, conservatively; \
         single `DeleteObject` calls are free. Item sizes are computed from the stored items with DynamoDB's sizing rules (names + values); \
         each write is billed at the item's final size (≥ its size at the time), reads as strongly consistent \
         reads of job + progress (≤ 4 KB → 1 RRU each), writes refused by their condition at 1 WRU.\n"
    );

    // 2. Cost.
    let _ = writeln!(w, "### $ per 1M jobs, ours vs the reference design\n");
    let _ = writeln!(
        w,
        "The price table (`PRICES` in jobs.rs, the one place to edit): **us-east-1 list prices as we understand \
         them on the date of this run — check them against <https://aws.amazon.com/pricing> before relying on them.**\n"
    );
    let _ = writeln!(w, "| item | price |\n|---|---|");
    for price in PRICES {
        let _ = writeln!(
            w,
            "| {} | ${} per {} {} |",
            price.item,
            price.dollars,
            num(price.per),
            price.unit
        );
    }
    let _ = writeln!(w, "| S3 DELETE | free |\n");
    let _ = writeln!(
        w,
        "**The reference design** (the seeds' \"a Standard workflow with a state per stage, progress writes to the job \
         record\"), modelled explicitly and priced with the same table:\n\n\
         - the same submit, upload, dispatch and webhook delivery as ours (the calls and Lambda time of those \
         functions and of the client, as measured above);\n\
         - a Standard execution with one Task state per stage and nothing else: *stages* transitions, \
         the fewest the design allows (the first stage's task marks the job running and the last one's marks it \
         succeeded; a Catch to a failure state costs nothing on success). No start, end, claim, boundary or \
         choice state, no retries: every state a real implementation would add costs the reference one more \
         transition per job, so this prices the reference at its cheapest;\n\
         - one Lambda invocation per stage, doing the same work in the same time as ours (our stage function's \
         measured GB-s);\n\
         - DynamoDB: one strongly consistent read of the job per stage, two status writes (running, succeeded) and \
         a progress write **to the job record every 2 s for the job's duration** (our stage function's measured \
         time; no separate progress record, no batching), each write billed at the size of one record holding \
         job + progress (measured sizes above);\n\
         - S3: a checkpoint PUT per stage plus one result PUT; the same data GETs as our stage function;\n\
         - webhooks queued by the stage itself, one `SendMessage` per delivery, with no outbox (a crash between \
         ending the job and sending loses the event). Ours queues them from the table's stream (the notifier, \
         `SendMessageBatch`): Lambda's reads of a DynamoDB stream are free and records its filter drops invoke \
         nothing, so the outbox costs one notifier invocation per batch of job ends (one per job here, where jobs \
         run one at a time; up to 100 ends share one under load).\n"
    );
    let _ = writeln!(
        w,
        "| per job | {} |",
        scenarios
            .iter()
            .map(|s| format!("{} ours | {} reference", s.name, s.name))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(w, "|---|{}", "--:|".repeat(2 * scenarios.len()));
    let pair_row = |w: &mut String, label: &str, f: &dyn Fn(&Bill) -> f64| {
        let _ = write!(w, "| {label} |");
        for s in scenarios {
            let _ = write!(w, " {} | {} |", num(f(&s.ours)), num(f(&s.reference)));
        }
        let _ = writeln!(w);
    };
    pair_row(w, "Lambda requests", &|b| b.lambda_requests);
    pair_row(w, "Lambda GB-s", &|b| b.lambda_gb_s);
    pair_row(w, "API Gateway requests", &|b| b.apigw_requests);
    pair_row(w, "SQS requests", &|b| b.sqs_requests);
    pair_row(w, "Step Functions transitions", &|b| b.transitions);
    pair_row(w, "DynamoDB WRU", &|b| b.wru);
    pair_row(w, "DynamoDB RRU", &|b| b.rru);
    pair_row(w, "S3 PUT-class", &|b| b.s3_put);
    pair_row(w, "S3 GET-class", &|b| b.s3_get);
    let _ = writeln!(w, "\n**$ per 1M jobs** by line:\n");
    let _ = writeln!(
        w,
        "| line | {} |",
        scenarios
            .iter()
            .map(|s| format!("{} ours | {} reference", s.name, s.name))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(w, "|---|{}", "--:|".repeat(2 * scenarios.len()));
    for (i, price) in PRICES.iter().enumerate() {
        let _ = write!(w, "| {} |", price.item);
        for s in scenarios {
            let _ = write!(
                w,
                " {} | {} |",
                money(s.ours.dollars_by_line()[i] * 1e6),
                money(s.reference.dollars_by_line()[i] * 1e6)
            );
        }
        let _ = writeln!(w);
    }
    let _ = write!(w, "| **total** |");
    for s in scenarios {
        let _ = write!(
            w,
            " **{}** | **{}** |",
            money(s.ours.dollars() * 1e6),
            money(s.reference.dollars() * 1e6)
        );
    }
    let _ = writeln!(w, "\n");
    let _ = writeln!(
        w,
        "| scenario | ours $/1M jobs | reference $/1M jobs | ours ÷ reference | overhead ours | overhead reference | **overhead ÷** | Step Functions: ours | reference | reference progress writes |"
    );
    let _ = writeln!(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in scenarios {
        let (ours, reference) = (s.ours.overhead(s.stage_gb_s), s.reference.overhead(s.stage_gb_s));
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} | {} | {} | **{:.2}** | {} | {} | {} |",
            s.name,
            money(s.ours.dollars() * 1e6),
            money(s.reference.dollars() * 1e6),
            s.ours.dollars() / s.reference.dollars(),
            money(ours * 1e6),
            money(reference * 1e6),
            ours / reference,
            money(s.ours.dollars_by_line()[p::SFN_TRANSITIONS] * 1e6),
            money(s.reference.dollars_by_line()[p::SFN_TRANSITIONS] * 1e6),
            num(s.reference_progress_writes)
        );
    }
    let _ = writeln!(
        w,
        "\n**Overhead** is everything but the job's own Lambda compute (the worker's GB-s, the same in both \
         designs): requests, Step Functions, DynamoDB, S3, SQS, API Gateway and the other functions' time.\n"
    );
    let _ = writeln!(
        w,
        "\nNot included (for either design): CloudWatch Logs and metrics, data transfer, S3 storage and KMS, \
         the free tiers. Lambda duration is billed here at the local wall time, which includes the emulator's \
         latency and the demo's sleeps.\n"
    );

    // Fixed cost.
    let _ = writeln!(
        w,
        "**Fixed cost of the scheduled functions** (independent of jobs; one run fired on an idle stack):\n"
    );
    let _ = writeln!(
        w,
        "| function | schedule | calls per idle run | ms per run (local) | runs per month (730 h) | $ per month |"
    );
    let _ = writeln!(w, "|---|---|---|--:|--:|--:|");
    for (function, calls, bill, ms, every) in fixed {
        let runs = 730.0 * 3600.0 / every.as_secs_f64();
        let listed = calls.iter().map(|(k, v)| format!("`{k}` {v}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(
            w,
            "| {function} | every {} s | {} | {ms:.1} | {runs:.0} | {} |",
            every.as_secs(),
            if listed.is_empty() { "none".into() } else { listed },
            money(bill.dollars() * runs)
        );
    }
    let _ = writeln!(
        w,
        "\nThe idle run is on a small table; the reaper's and expirer's reads grow with the jobs they find. \
         Also fixed and not measured here: the SQS event source mappings' empty long polls on the intake and \
         webhook queues (Lambda's pollers keep polling an idle queue; if a mapping keeps ~5 pollers with 20 s long \
         polls, that is ~15 requests a minute, ~0.66M a month, ~$0.26 per queue per month at the table's price — an \
         assumption about Lambda's poller behaviour, not a measurement).\n"
    );

    // 3. Submit path and latency.
    let _ = writeln!(w, "### Submit path and local latency\n");
    let _ = writeln!(
        w,
        "{} submissions of `{{\"type\":\"demo\",\"params\":{{\"items\":1,\"item_ms\":0}}}}`, one after another, each with a new \
         `Idempotency-Key` ({:.1} AWS calls per submission). The handler's own time is its wall time minus the time \
         it waited for AWS calls; its jobs run in the background meanwhile, on the same 2 shared cores, so the emulator (and the edge, which lets one DynamoDB write into moto at a time) \
         is busy with them: the AWS wait is inflated by that contention. The last two rows are the {} submissions \
         of the latency phase below, made while at most one small job ran.\n",
        submit.own.len(),
        submit.aws_calls,
        submit.quiet_own.len()
    );
    let _ = writeln!(w, "| submit, ms | p50 | p99 |\n|---|--:|--:|");
    for (label, values) in [
        ("handler's own time (not waiting for AWS)", &submit.own),
        ("waiting for AWS calls (local emulator)", &submit.aws),
        ("handler total", &submit.total),
        ("client round trip through the local API", &submit.client),
        ("quiet: own time, the latency phase's submissions (one job at a time)", &submit.quiet_own),
        ("quiet: waiting for AWS calls, same submissions", &submit.quiet_aws),
    ] {
        let _ = writeln!(
            w,
            "| {label} | {:.2} | {:.2} |",
            percentile(values, 50.0),
            percentile(values, 99.0)
        );
    }
    let _ = writeln!(
        w,
        "\n**Local submit → succeeded**: {} jobs `{{\"items\":1,\"item_ms\":0}}` one after another, from sending \
         `POST /jobs` to seeing `succeeded` in the job record (polled directly in the emulator every 5 ms, uncounted): \
         p50 **{:.0} ms**, p99 **{:.0} ms** (with {} samples p99 is the maximum). Locally this is dominated by moto \
         (its Step Functions interpreter and its emulated services); it says nothing precise about AWS's own \
         latencies.\n",
        latency.len(),
        percentile(latency, 50.0),
        percentile(latency, 99.0),
        latency.len()
    );
    md
}

// ------------------------------------------------------------------------------------------

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let per_scenario = env_usize("LONGHAUL_JOBS_PER_SCENARIO", 3);
    let submits = env_usize("LONGHAUL_JOBS_SUBMITS", 300);
    let latency_jobs = env_usize("LONGHAUL_JOBS_LATENCY", 20);
    let bench = Bench::start(&[]).await?;
    eprintln!("local stack up at {}", bench.stack.api_url);

    // Fixed costs first, on an idle stack.
    let mut fixed = Vec::new();
    for (function, schedule) in [("ReaperFunction", "reaper"), ("ExpirerFunction", "expirer")] {
        let (calls, bill, ms) = bench.idle_run(function, schedule).await?;
        let every = bench.rates.get(function).copied().unwrap_or(Duration::from_secs(60));
        fixed.push((function.to_owned(), calls, bill, ms, every));
    }

    // A partner fetches its signing secret once, not per job.
    let (status, secrets) = bench.api("GET", "/webhooks/secret", None, None).await?;
    if status != 200 {
        bail!("GET /webhooks/secret answered {status}: {secrets}");
    }
    let secret = secrets["secrets"][0]["secret"].as_str().context("a secret")?.to_owned();

    let mut scenarios = Vec::new();
    let receiver = bench.receiver;
    scenarios.push(
        bench
            .scenario(
                "demo, short",
                "`{\"type\":\"demo\",\"params\":{\"items\":10,\"item_ms\":10}}`, ~0.1 s: a job that ends before its first checkpoint is due",
                per_scenario,
                (1, 0),
                false,
                || async {
                    Ok((json!({"type": "demo", "params": {"items": 10, "item_ms": 10}}), None))
                },
            )
            .await?,
    );
    scenarios.push(
        bench
            .scenario(
                "demo",
                "`{\"type\":\"demo\",\"params\":{\"items\":100,\"item_ms\":100}}`, ~10 s",
                per_scenario,
                (1, 0),
                false,
                || async {
                    Ok((json!({"type": "demo", "params": {"items": 100, "item_ms": 100}}), None))
                },
            )
            .await?,
    );
    scenarios.push(
        bench
            .scenario(
                "demo, 4 shards",
                "`{\"type\":\"demo\",\"params\":{\"items\":100,\"item_ms\":100,\"shards\":4}}`: the demo job's stage fanned out into 4 shards of 25 items (~2.5 s each, at once), then merged",
                per_scenario,
                (1, 4),
                false,
                || async {
                    Ok((
                        json!({"type": "demo", "params": {"items": 100, "item_ms": 100, "shards": 4}}),
                        None,
                    ))
                },
            )
            .await?,
    );
    let rows = longhaul_tests::csvgen::Gen::new(7).rows(5_000);
    let csv = longhaul_tests::csvgen::csv_bytes(&rows);
    let csv_len = csv.len();
    let (csv, b) = (&csv, &bench);
    scenarios.push(
        bench
            .scenario(
                "csv_report",
                &format!("upload of a {csv_len}-byte, 5,000-row CSV, then a 3-stage report (scan → render → publish), json"),
                per_scenario,
                (3, 0),
                false,
                move || async move {
                    let input = b.upload(csv.clone()).await?;
                    Ok((
                        json!({"type": "csv_report", "params": {
                            "input": input,
                            "group_by": ["region", "product"],
                            "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}, {"op": "mean", "column": "amount"}],
                            "format": "json",
                        }}),
                        None,
                    ))
                },
            )
            .await?,
    );
    scenarios.push(
        bench
            .scenario("demo+webhook", "the demo job with a `callback_url` (a receiver on 127.0.0.1 answering 204)", per_scenario, (1, 0), true, move || async move {
                let key = uuid::Uuid::new_v4().simple().to_string();
                let url = format!("http://{receiver}/{key}");
                Ok((json!({"type": "demo", "params": {"items": 100, "item_ms": 100}, "callback_url": url}), Some(key)))
            })
            .await?,
    );
    // A job that needs more than one invocation, so that both paths are priced: the demo job
    // on a stack of its own whose workers stop 4 s into each invocation (the stop margin set
    // to their timeout less 4 s): its direct run hands it over to an execution after 4 s.
    let timeout = bench.stack.template.function_timeout("StageFunction")?;
    let margin = timeout.saturating_sub(4).to_string();
    {
        let sliced = Bench::start(&[("LONGHAUL_STAGE_MARGIN_SECONDS", margin.as_str())]).await?;
        eprintln!("second local stack (4 s invocations) up at {}", sliced.stack.api_url);
        scenarios.push(
            sliced
                .scenario(
                    "demo, 3 invocations",
                    "the demo job (~10 s) with 4-s invocations: a direct run, then an execution's `Run` twice",
                    per_scenario,
                    (1, 0),
                    false,
                    || async {
                        Ok((json!({"type": "demo", "params": {"items": 100, "item_ms": 100}}), None))
                    },
                )
                .await?,
        );
    }
    // The deliveries are signed with the partner's secret.
    for (_, received) in bench.inbox.lock().expect("inbox").iter() {
        for (headers, body) in received {
            let header = |n: &str| {
                headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
            };
            let timestamp = header("webhook-timestamp").parse().unwrap_or(0);
            if !longhaul_domain::webhooks::verify(
                &secret.as_str().into(),
                &header("webhook-id"),
                timestamp,
                body,
                &header("webhook-signature"),
            ) {
                bail!("a webhook delivery does not verify with the partner's secret");
            }
        }
    }

    // Latency: small jobs one after another.
    eprintln!("latency: {latency_jobs} small jobs");
    bench.settle().await;
    let small = json!({"type": "demo", "params": {"items": 1, "item_ms": 0}});
    let mut latency = Vec::new();
    let quiet_from = bench.stack.invocations.snapshot().len();
    for _ in 0..latency_jobs {
        let started = Instant::now();
        let job_id = bench.submit(&small).await?;
        let status = bench.wait_terminal(&job_id, Duration::from_secs(120)).await?;
        latency.push(started.elapsed().as_secs_f64() * 1e3);
        if status != "succeeded" {
            bail!("latency job {job_id} ended {status}");
        }
        bench.wait_executions(&job_id).await?;
    }

    let quiet: Vec<_> = bench.stack.invocations.snapshot()[quiet_from..]
        .iter()
        .filter(|r| r.function == "SubmitFunction")
        .cloned()
        .collect();

    // Submit path: many submissions one after another.
    eprintln!("submit path: {submits} submissions");
    bench.settle().await;
    let before = bench.stack.invocations.snapshot().len();
    let mut client = Vec::new();
    for _ in 0..submits {
        let started = Instant::now();
        bench.submit(&small).await?;
        client.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let records: Vec<_> = bench.stack.invocations.snapshot()[before..]
        .iter()
        .filter(|r| r.function == "SubmitFunction")
        .cloned()
        .collect();
    let submit = SubmitPath {
        quiet_own: quiet.iter().map(|r| (r.duration_ms - r.aws_ms).max(0.0)).collect(),
        quiet_aws: quiet.iter().map(|r| r.aws_ms).collect(),
        own: records.iter().map(|r| (r.duration_ms - r.aws_ms).max(0.0)).collect(),
        aws: records.iter().map(|r| r.aws_ms).collect(),
        total: records.iter().map(|r| r.duration_ms).collect(),
        aws_calls: records.iter().map(|r| r.aws_calls as f64).sum::<f64>()
            / records.len().max(1) as f64,
        client,
    };

    let md = report(&bench, &scenarios, &fixed, &submit, &latency);
    longhaul_bench::write_section("10-jobs", &md)?;
    bench.stack.shutdown();
    Ok(())
}

/// Whether `function` (a logical name) runs job stages: the shared stage function or a kind's
/// own worker (`…WorkerFunction`, e.g. csv_report's), whose time and calls are the stage's.
fn is_worker(function: &str) -> bool {
    function == "StageFunction" || function.ends_with("WorkerFunction")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn the_price_table_prices_each_line() {
        let million = Bill {
            lambda_requests: 1e6,
            lambda_gb_s: 1.0,
            apigw_requests: 1e6,
            sqs_requests: 1e6,
            transitions: 1e6,
            wru: 1e6,
            rru: 1e6,
            s3_put: 1e6,
            s3_get: 1e6,
        };
        let lines = million.dollars_by_line();
        let expected = [0.20, 0.000_013_333_4, 1.00, 0.40, 25.0, 0.625, 0.125, 5.0, 0.40];
        for (got, want) in lines.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{got} ≠ {want}");
        }
        assert!((million.dollars() - expected.iter().sum::<f64>()).abs() < 1e-9);
        // A 10-transition job: $250 per million jobs for Step Functions alone.
        let job = Bill { transitions: 10.0, ..Default::default() };
        assert!((job.dollars() * 1e6 - 250.0).abs() < 1e-6);
    }

    #[test]
    fn request_units_round_up_per_item() {
        assert_eq!(wru(1), 1.0);
        assert_eq!(wru(1024), 1.0);
        assert_eq!(wru(1025), 2.0);
        assert_eq!(rru(4096), 1.0);
        assert_eq!(rru(4097), 2.0);
        let item: HashMap<String, AttributeValue> = [
            ("pk".to_owned(), AttributeValue::S("JOB#1".into())),
            ("n".to_owned(), AttributeValue::N("1234".into())),
            (
                "m".to_owned(),
                AttributeValue::M([("a".to_owned(), AttributeValue::Bool(true))].into()),
            ),
        ]
        .into();
        // pk(2)+5, n(1)+3, m(1)+3+(1+1+1)
        assert_eq!(item_size(&item), 7 + 4 + 7);
    }
}
