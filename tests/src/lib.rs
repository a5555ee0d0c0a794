//! Test harness: one local stack per test binary, shared by its tests, plus small clients for
//! the API and the emulator.
//!
//! The stack runs on its own thread with its own runtime, so it outlives any single
//! `#[tokio::test]` runtime; its emulator dies with the test process.

pub mod csvgen;
pub mod kinds;
pub mod openapi;
pub mod sections;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use longhaul_local::{LocalStack, Options};
use serde_json::{Value, json};

/// The shared stack.
pub struct Harness {
    /// The running stack.
    pub stack: LocalStack,
}

static HARNESS: OnceLock<Harness> = OnceLock::new();
static OVERRIDES: OnceLock<Vec<(String, String)>> = OnceLock::new();
static REGISTRY: OnceLock<longhaul_worker::Registry> = OnceLock::new();

/// The stack of this test binary, started with extra function environment (shortened
/// deadlines, intervals…). Call it before anything else touches the stack: the first call of
/// a test binary decides.
pub fn harness_with(overrides: &[(&str, &str)]) -> &'static Harness {
    OVERRIDES
        .get_or_init(|| overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    harness()
}

/// The stack of this test binary, its functions knowing the kinds of `registry` instead of
/// the catalog's (a test's own kinds, with or without the shipped ones), started with extra
/// function environment as in [`harness_with`]. `ENABLED_JOB_TYPES` in `overrides` decides
/// which kinds are accepted (unset: the template's default, which names only shipped kinds).
/// Call it before anything else touches the stack: the first call of a test binary decides.
pub fn harness_with_registry(
    registry: longhaul_worker::Registry,
    overrides: &[(&str, &str)],
) -> &'static Harness {
    REGISTRY.get_or_init(|| registry);
    harness_with(overrides)
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The stack of this test binary, started on first use.
pub fn harness() -> &'static Harness {
    HARNESS.get_or_init(|| {
        longhaul_aws::sdk::install_tls_provider();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("local-stack".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let mut options = Options::ephemeral(root());
                    options
                        .env_overrides
                        .insert("LONGHAUL_PROGRESS_INTERVAL_MS".into(), "200".into());
                    for (name, value) in OVERRIDES.get_or_init(Vec::new) {
                        options.env_overrides.insert(name.clone(), value.clone());
                    }
                    if let Some(registry) = REGISTRY.get() {
                        options.registry = registry.clone();
                    }
                    match LocalStack::start(options).await {
                        Ok(stack) => tx.send(Ok(Harness { stack })).expect("test thread waits"),
                        Err(err) => tx.send(Err(format!("{err:#}"))).expect("test thread waits"),
                    }
                    std::future::pending::<()>().await;
                });
            })
            .expect("spawning the stack thread");
        rx.recv()
            .expect("stack thread answers")
            .unwrap_or_else(|e| panic!("the local stack did not start: {e}"))
    })
}

/// Fails if any function of this binary's stack made an AWS call its role in template.yaml
/// does not grant (the edge refused it as AWS would). Every API call a test makes checks
/// this, as it checks the answer against the OpenAPI document: a permission missing from the
/// template fails the test that reaches the code needing it, or the next one to call the API.
pub fn assert_no_access_denied() {
    let denials = harness().stack.denials.snapshot();
    assert!(denials.is_empty(), "calls refused by the template's IAM policies: {denials:#?}");
}

/// The EMF data points of metric `name` about job `job_id` that this binary's functions
/// emitted, once there are at least `at_least` (a function may record a job's new state a
/// moment before it emits the metric; this waits up to 30 s, then returns what there is).
pub async fn metric_points(name: &str, job_id: &str, at_least: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let points: Vec<Value> = harness()
            .stack
            .metrics
            .parsed()
            .into_iter()
            .filter(|line| line["job_id"] == job_id && line.get(name).is_some())
            .collect();
        if points.len() >= at_least || tokio::time::Instant::now() >= deadline {
            return points;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the functions counted `name` for job `job_id` exactly once.
pub async fn assert_counted_once(name: &str, job_id: &str) {
    let points = metric_points(name, job_id, 1).await;
    assert_eq!(points.len(), 1, "{name} for {job_id}: {points:?}");
    assert_eq!(points[0][name], 1.0, "{:?}", points[0]);
}

/// A unique principal, so tests never see each other's jobs.
pub fn principal(label: &str) -> String {
    format!("{label}-{}", uuid::Uuid::new_v4().simple())
}

/// An API client acting as one principal.
pub struct Api {
    /// Base URL.
    pub base: String,
    /// Bearer token (`None`: anonymous).
    pub token: Option<String>,
    http: reqwest::Client,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// Body parsed as JSON (`Null` if empty or not JSON).
    pub json: Value,
    /// Raw body.
    pub text: String,
}

impl Reply {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Api {
    /// A client that does not follow redirects (so tests see the 303 itself).
    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
    }

    /// A client for `principal`.
    pub fn new(principal: &str) -> Self {
        let h = harness();
        Api {
            base: h.stack.api_url.clone(),
            token: Some(h.stack.token(principal)),
            http: Self::client(),
        }
    }

    /// A client without a token.
    pub fn anonymous() -> Self {
        Api { base: harness().stack.api_url.clone(), token: None, http: Self::client() }
    }

    /// Sends a request with optional raw body and extra headers.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request =
            self.http.request(method.parse().expect("method"), format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request reaches the local API");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        let reply = Reply { status, headers, json, text };
        if !path.starts_with("/_local/") {
            openapi::check(method, path, &reply);
        }
        assert_no_access_denied();
        reply
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, &[]).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, Some(("application/json", body.to_string().into_bytes())), &[])
            .await
    }

    /// Submits a job and returns its id (asserting 202).
    pub async fn submit(&self, body: &Value) -> String {
        let reply = self.post_json("/jobs", body).await;
        assert_eq!(reply.status, 202, "submit: {}", reply.text);
        reply.json["job_id"].as_str().expect("job_id").to_owned()
    }

    /// `POST /jobs` with `body` and the `Idempotency-Key` `key`; the reply as it is (no status
    /// asserted: refusals and replays are what some tests look at).
    pub async fn submit_with_key(&self, body: &Value, key: &str) -> Reply {
        let json = ("application/json", body.to_string().into_bytes());
        self.send("POST", "/jobs", Some(json), &[("idempotency-key", key)]).await
    }

    /// Uploads `bytes` through `POST /uploads` and returns the `input` reference.
    pub async fn upload(&self, filename: &str, content_type: &str, bytes: Vec<u8>) -> String {
        let body = serde_json::json!({"filename": filename, "content_type": content_type, "size_bytes": bytes.len()});
        let reply = self.post_json("/uploads", &body).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        let mut put = reqwest::Client::new()
            .put(reply.json["upload_url"].as_str().expect("upload_url"))
            .body(bytes);
        for (name, value) in reply.json["headers"].as_object().expect("headers") {
            put = put.header(name, value.as_str().expect("header value"));
        }
        let response = put.send().await.expect("upload");
        assert_eq!(response.status(), 200, "upload failed");
        reply.json["input"].as_str().expect("input").to_owned()
    }

    /// Downloads a succeeded job's result through `GET /jobs/{id}/result` (303 → S3).
    pub async fn result(&self, job_id: &str) -> Vec<u8> {
        let reply = self.get(&format!("/jobs/{job_id}/result")).await;
        assert_eq!(reply.status, 303, "{}", reply.text);
        let download =
            reqwest::get(reply.header("location").expect("Location")).await.expect("download");
        assert_eq!(download.status(), 200);
        download.bytes().await.expect("body").to_vec()
    }

    /// Polls `GET /jobs/{id}` until `pred` holds for the job's JSON (or panics, naming `what`
    /// it waited for, once nothing about the job has moved for a minute); returns that JSON.
    pub async fn wait_for(&self, job_id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let mut watch = Movement::new(Duration::from_secs(60));
        loop {
            let job = self.get(&format!("/jobs/{job_id}")).await.json;
            if pred(&job) {
                return job;
            }
            assert!(
                watch.still_moving(&job),
                "job {job_id}: waiting for {what}, nothing moved for {:?}: {job}",
                watch.limit
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Polls the job until it is terminal; panics once nothing about it has moved (status,
    /// attempt, progress, transitions) for `still_for`. A job that keeps working is waited
    /// for however slow the machine is; one that is stuck fails the test.
    pub async fn wait_terminal(&self, job_id: &str, still_for: Duration) -> Value {
        let mut watch = Movement::new(still_for);
        loop {
            let reply = self.get(&format!("/jobs/{job_id}")).await;
            assert_eq!(reply.status, 200, "{}", reply.text);
            if matches!(
                reply.json["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "expired")
            ) {
                return reply.json;
            }
            assert!(
                watch.still_moving(&reply.json),
                "job {job_id} not terminal, nothing moved for {still_for:?}: {}",
                reply.json
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Watches a job's view for movement: its status, attempt, progress and transitions. The
/// waits above give up only when none of these changed for `limit`, so a test's outcome does
/// not depend on how fast the machine works through the job.
struct Movement {
    limit: Duration,
    last: Option<Value>,
    since: tokio::time::Instant,
}

impl Movement {
    fn new(limit: Duration) -> Self {
        Movement { limit, last: None, since: tokio::time::Instant::now() }
    }

    /// Records `job`'s view; whether it moved within the last `limit`.
    fn still_moving(&mut self, job: &Value) -> bool {
        let seen = json!([
            job["status"],
            job["attempt"],
            job["progress"]["items_done"],
            job["progress"]["pct"],
            job["progress"]["stage_index"],
            job["transitions"].as_array().map(Vec::len),
        ]);
        if self.last.as_ref() != Some(&seen) {
            self.last = Some(seen);
            self.since = tokio::time::Instant::now();
        }
        self.since.elapsed() < self.limit
    }
}

/// A wait for something the stack's own settings make due (a heartbeat timeout, a keepalive, a
/// retry schedule), or for something that watches no job: it gives up once `limit` has passed,
/// a limit the test derives from those settings with a wide margin, so that only what never
/// happens fails it, however slow the machine. (A wait on a job that works watches its
/// movement instead: [`Api::wait_for`], [`Api::wait_terminal`], [`Faults::wait_paused`].)
pub struct Deadline {
    what: String,
    limit: Duration,
    since: tokio::time::Instant,
}

impl Deadline {
    /// A wait for `what`, from now, for at most `limit`.
    pub fn new(what: impl Into<String>, limit: Duration) -> Self {
        Deadline { what: what.into(), limit, since: tokio::time::Instant::now() }
    }

    /// Whether the wait is over (the limit has passed).
    pub fn passed(&self) -> bool {
        self.since.elapsed() >= self.limit
    }

    /// Between two looks: panics, naming what was awaited and what the last look `saw`, once
    /// the limit has passed; sleeps `every` otherwise.
    pub async fn tick(&self, every: Duration, saw: impl std::fmt::Display) {
        assert!(
            !self.passed(),
            "waited {:?} for {}, in vain; last seen: {saw}",
            self.limit,
            self.what
        );
        tokio::time::sleep(every).await;
    }
}

/// The local stack's fault plan (`/_local/faults`): one for the whole stack, so tests that
/// install one take turns.
pub struct Faults {
    url: String,
    http: reqwest::Client,
}

impl Faults {
    /// Installs `plan` (its counts start at zero).
    pub async fn install(plan: &Value) -> Self {
        let faults = Faults {
            url: format!("{}/_local/faults", harness().stack.api_url),
            http: reqwest::Client::new(),
        };
        faults.set(plan).await;
        faults
    }

    async fn set(&self, plan: &Value) {
        let reply = self.http.post(&self.url).json(plan).send().await.expect("the faults endpoint");
        assert_eq!(reply.status(), 200, "installing {plan}: {:?}", reply.text().await);
    }

    /// What the plan injected so far: `{"plan": …, "injected": {counts}}`.
    pub async fn injected(&self) -> Value {
        let reply = self.http.get(&self.url).send().await.expect("the faults endpoint");
        reply.json().await.expect("the fault counts are JSON")
    }

    /// Turns faults off; answers what the plan had injected.
    pub async fn clear(self) -> Value {
        let injected = self.injected().await;
        self.set(&json!({})).await;
        injected
    }

    /// Waits until the plan has paused an invocation (`injected.paused` ≥ 1) while the job
    /// `job_id` of `api` goes on; panics if the job ends first (it ran on without its pause),
    /// or once nothing about it moved for a minute. Answers the counts.
    pub async fn wait_paused(&self, api: &Api, job_id: &str) -> Value {
        let mut watch = Movement::new(Duration::from_secs(60));
        loop {
            let injected = self.injected().await;
            if injected["injected"]["paused"].as_u64().unwrap_or(0) >= 1 {
                return injected;
            }
            let job = api.get(&format!("/jobs/{job_id}")).await.json;
            assert!(
                matches!(job["status"].as_str(), Some("pending" | "queued" | "running")),
                "the job ran on without its pause: {job} {injected}"
            );
            assert!(
                watch.still_moving(&job),
                "job {job_id}: no pause, nothing moved for {:?}: {job} {injected}",
                watch.limit
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// SDK clients talking to the emulator directly (uncounted).
pub struct Aws {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// S3.
    pub s3: aws_sdk_s3::Client,
    /// SQS.
    pub sqs: aws_sdk_sqs::Client,
    /// Step Functions.
    pub sfn: aws_sdk_sfn::Client,
}

impl Aws {
    /// Clients for the shared stack's emulator.
    pub async fn new() -> Self {
        let config = harness().stack.emulator_sdk_config().await;
        Aws {
            dynamodb: aws_sdk_dynamodb::Client::new(&config),
            s3: aws_sdk_s3::Client::new(&config),
            sqs: aws_sdk_sqs::Client::new(&config),
            sfn: aws_sdk_sfn::Client::new(&config),
        }
    }

    /// Every item in the job table that belongs to `owner` (job, progress and idempotency
    /// records), by a full scan — fine for a test table.
    pub async fn items_of(
        &self,
        owner: &str,
    ) -> Vec<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let table = harness().stack.resource("JobsTable");
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .dynamodb
                .scan()
                .table_name(&table)
                .filter_expression("#owner = :owner OR begins_with(pk, :idem)")
                .expression_attribute_names("#owner", "owner")
                .expression_attribute_values(":owner", AttributeValue::S(owner.to_owned()))
                .expression_attribute_values(
                    ":idem",
                    // The idempotency records' prefix, as the store writes it (`IDEM#<len>:<owner>#`).
                    AttributeValue::S(longhaul_aws::jobs::idempotency_pk(owner, "")),
                )
                .set_exclusive_start_key(start)
                .send()
                .await
                .expect("scan");
            items.extend(page.items.unwrap_or_default());
            start = page.last_evaluated_key;
            if start.is_none() {
                return items;
            }
        }
    }

    /// Marks the job `expired` straight in the table, as the expirer's transition would (for
    /// tests of what clients see of an expired job, without running the expirer).
    pub async fn mark_expired(&self, job_id: &str) {
        use aws_sdk_dynamodb::types::AttributeValue;
        self.dynamodb
            .update_item()
            .table_name(harness().stack.resource("JobsTable"))
            .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
            .key("sk", AttributeValue::S("JOB".into()))
            .update_expression("SET #s = :expired")
            .expression_attribute_names("#s", "status")
            .expression_attribute_values(":expired", AttributeValue::S("expired".into()))
            .send()
            .await
            .expect("mark the job expired");
    }

    /// The job's progress record, straight from the table.
    pub async fn progress_record(&self, job_id: &str) -> longhaul_aws::jobs::ProgressRecord {
        use aws_sdk_dynamodb::types::AttributeValue;
        let item = self
            .dynamodb
            .get_item()
            .table_name(harness().stack.resource("JobsTable"))
            .key("pk", AttributeValue::S(format!("JOB#{job_id}")))
            .key("sk", AttributeValue::S("PROGRESS".into()))
            .consistent_read(true)
            .send()
            .await
            .expect("get progress")
            .item
            .expect("a progress record");
        serde_dynamo::from_item(item).expect("a valid progress record")
    }

    /// Keys of the objects under `prefix` in the data bucket.
    pub async fn keys(&self, prefix: &str) -> Vec<String> {
        let page = self
            .s3
            .list_objects_v2()
            .bucket(harness().stack.resource("DataBucket"))
            .prefix(prefix)
            .send()
            .await
            .expect("list");
        page.contents().iter().filter_map(|o| o.key().map(str::to_owned)).collect()
    }

    fn execution_arn(job_id: &str) -> String {
        harness().stack.resource("JobStateMachine").replace(":stateMachine:", ":execution:")
            + ":"
            + job_id
    }

    async fn history(&self, job_id: &str) -> Vec<aws_sdk_sfn::types::HistoryEvent> {
        let history = self
            .sfn
            .get_execution_history()
            .execution_arn(Self::execution_arn(job_id))
            .max_results(1000)
            .send()
            .await
            .expect("execution history");
        history.events().to_vec()
    }

    /// The names of the states whose Lambda task was scheduled, in order, for the job's
    /// first execution (the task states invoke the job's worker through the Lambda
    /// integration, `lambda:invoke`: a `TaskScheduled` event of resource type `lambda`).
    pub async fn scheduled_tasks(&self, job_id: &str) -> Vec<String> {
        let mut state = String::new();
        let mut out = Vec::new();
        for event in self.history(job_id).await {
            if let Some(entered) = event.state_entered_event_details() {
                state = entered.name().to_owned();
            }
            let lambda_task =
                event.task_scheduled_event_details().is_some_and(|t| t.resource_type() == "lambda");
            if event.r#type().as_str() == "LambdaFunctionScheduled" || lambda_task {
                out.push(state.clone());
            }
        }
        out
    }

    /// The names of the states the job's first execution entered (each one a billed state
    /// transition), once the execution has ended.
    pub async fn states_entered(&self, job_id: &str) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let execution = self
                .sfn
                .describe_execution()
                .execution_arn(Self::execution_arn(job_id))
                .send()
                .await
                .expect("execution");
            if execution.status().as_str() != "RUNNING" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "execution of {job_id} still running");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let history = self.history(job_id).await;
        history
            .iter()
            .filter_map(|e| e.state_entered_event_details())
            .map(|d| d.name().to_owned())
            .collect()
    }
}

/// Runs the local stack's schedule `schedule` (`reaper`, `expirer`) once, now, and returns its
/// report; panics unless the run succeeded.
pub async fn fire(schedule: &str) -> Value {
    let reply = reqwest::Client::new()
        .post(format!("{}/_local/schedules/{schedule}", harness().stack.api_url))
        .send()
        .await
        .expect("the schedule endpoint answers");
    assert_eq!(reply.status(), 200, "the {schedule} run failed");
    reply.json::<Value>().await.expect("a run's report is JSON")
}

/// Fires the schedule `schedule` (see [`fire`]) until `done` holds for the job `job_id` of
/// `api`, and answers the job; panics, naming `what` it waited for, once `limit` has passed (a
/// limit derived, with a wide margin, from the thresholds the schedule waits out).
pub async fn fire_until(
    api: &Api,
    job_id: &str,
    schedule: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Deadline::new(format!("{what} of job {job_id} (firing the {schedule})"), limit);
    loop {
        fire(schedule).await;
        let job = api.get(&format!("/jobs/{job_id}")).await.json;
        if done(&job) {
            return job;
        }
        deadline.tick(Duration::from_millis(250), job).await;
    }
}

/// A `pending` `demo` job record of `owner`, accepted at `created_at`, as submit stores it —
/// for tests that seed the table directly ([`longhaul_memory::contract::pending_job`]).
pub fn seeded_job(owner: &str, created_at: String) -> longhaul_aws::jobs::JobRecord {
    let at: longhaul_domain::Timestamp = created_at.parse().expect("a seeded job's creation time");
    longhaul_memory::contract::pending_job(owner, at)
}

/// The job table's adapter, on this binary's stack (direct to the emulator, uncounted).
pub async fn job_store() -> longhaul_aws::jobs::JobStore {
    longhaul_aws::jobs::JobStore::new(
        Aws::new().await.dynamodb.clone(),
        harness().stack.resource("JobsTable"),
    )
}

/// The job's worker dies: its execution is stopped and its stage invocation killed, so its
/// heartbeats stop (what the reaper calls a zombie). Returns the job as it was.
pub async fn kill_worker(job_id: &str) -> longhaul_aws::jobs::JobRecord {
    let job = job_store().await.job(job_id).await.unwrap().expect("the job exists");
    let machine = harness().stack.resource("JobStateMachine");
    let arn = format!(
        "{}:{}",
        machine.replace(":stateMachine:", ":execution:"),
        job.execution.clone().expect("a started job names its execution")
    );
    Aws::new().await.sfn.stop_execution().execution_arn(arn).send().await.unwrap();
    let crashed = reqwest::Client::new()
        .post(format!(
            "{}/_local/functions/StageFunction/crash?job_id={job_id}",
            harness().stack.api_url
        ))
        .send()
        .await
        .unwrap();
    assert!(crashed.status().is_success(), "crash: {}", crashed.status());
    job
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_deadline_lets_a_wait_go_on_until_its_limit() {
        let deadline = Deadline::new("nothing", Duration::from_secs(60));
        deadline.tick(Duration::ZERO, "a first look").await;
        assert!(!deadline.passed());
    }

    #[tokio::test]
    #[should_panic(expected = "waited 0ns for the impossible, in vain; last seen: a look")]
    async fn a_deadline_fails_the_wait_once_its_limit_has_passed() {
        let deadline = Deadline::new("the impossible", Duration::ZERO);
        assert!(deadline.passed());
        deadline.tick(Duration::ZERO, "a look").await;
    }
}
