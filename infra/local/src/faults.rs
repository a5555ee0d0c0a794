//! Fault injection: the failures AWS and Lambda inflict on a job system, on demand.
//!
//! A test installs a [`FaultPlan`] (`POST /_local/faults`) and the stack then
//! * **crashes** invocations of the chosen functions just *before* an AWS call leaves the
//!   function, or just *after* the call took effect and before the function saw the answer
//!   (the invocation ends as a Lambda sandbox crash does: `Runtime.ExitError`, or a 502 from
//!   API Gateway for an API function), at most `max_crashes_per_job` times per job (or per
//!   submission, for the API: per `Idempotency-Key`), counted per function, AWS operation and
//!   side of the call;
//! * **pauses** an invocation that holds a job's lease just before an AWS call, for longer
//!   than the reaper's heartbeat timeout, then lets the call go: a worker frozen (a throttled
//!   sandbox, a long stop of the world) while the reaper declares it dead and a new attempt
//!   takes the job, whose stale writes must then be refused;
//! * **delivers `StartExecution` twice** at the edge, the first answer lost, as when the SDK
//!   retries a call whose answer timed out after it took effect;
//! * **throttles** AWS calls at the edge (`ThrottlingException`, S3 `SlowDown`), which the
//!   SDK retries and the code must survive when retries run out;
//! * **delivers SQS and stream batches twice**, concurrently, as at-least-once delivery may;
//! * keeps a **journal** of every DynamoDB write that took effect, and of every write made
//!   under a lease that the table refused, in the order the table applied them, with the
//!   lease of the attempt that made it — so a checker can prove that no write of an attempt
//!   landed after a newer attempt took the job, and that stale attempts did try.
//!
//! Crashes happen in the SDK's HTTP client ([`FaultyHttpClient`]), which knows the
//! invocation it runs in through a task-local set by the host ([`Invocation`]); throttling
//! and the journal happen in the edge, which sees every call's wire form.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// The header that carries an attempt's lease from the function to the edge's journal.
pub const LEASE_HEADER: &str = "x-longhaul-lease";
/// The header that names the function making a call, for the edge's per-function counts.
pub const FUNCTION_HEADER: &str = "x-longhaul-function";
/// The header that names the invocation making a call (see [`Faults::journal_write`]).
pub const INVOCATION_HEADER: &str = "x-longhaul-invocation";

/// Numbers invocations, for [`INVOCATION_HEADER`].
static NEXT_INVOCATION: AtomicU64 = AtomicU64::new(1);

/// Which faults to inject, and how often. All probabilities are per opportunity (per AWS
/// call, per batch) and default to zero: no plan, no faults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    /// Logical names of the functions whose invocations may crash (empty: none).
    pub crash_functions: Vec<String>,
    /// Probability that an invocation crashes just before an AWS call.
    pub crash_before_call: f64,
    /// Probability that an invocation crashes just after an AWS call took effect.
    pub crash_after_call: f64,
    /// When set, crashes strike only the calls it matches (a test aiming at one moment of one
    /// job); `None`: any call of the planned functions.
    pub crash_only: Option<CallMatch>,
    /// Most crashes injected into the invocations of any one job (0: unlimited). Keeps every
    /// job within the state machine's retry budget, so that a correct system finishes every
    /// job and a lost or failed one is a finding, not bad luck.
    pub max_crashes_per_job: u32,
    /// Probability that the edge answers an AWS call with a throttling error.
    pub throttle: f64,
    /// When set, the edge refuses every call it matches with `AccessDenied`, worded as IAM
    /// words it (the caller's role ARN with the account, the resource's ARN): an AWS error
    /// whose text names our infrastructure, for tests that check no client is ever shown it.
    pub deny: Option<CallMatch>,
    /// When set, throttling strikes only the calls it matches (a test holding one job's
    /// `StartExecution` back, say); `None`: any call.
    pub throttle_only: Option<CallMatch>,
    /// Probability that an SQS or DynamoDB stream batch is delivered to its function twice at once.
    pub duplicate_delivery: f64,
    /// Probability that the edge sends a `StartExecution` twice, answering with the second
    /// answer (the first is lost after it took effect).
    pub duplicate_start: f64,
    /// Logical names of the functions whose invocations may pause (empty: none).
    pub pause_functions: Vec<String>,
    /// Probability that an invocation holding a job's lease pauses just before an AWS call
    /// (at most once per job).
    pub pause_before_call: f64,
    /// When set, pauses strike only the calls it matches (a test aiming at one write, say a
    /// stage boundary); `None`: any call of the planned functions.
    pub pause_only: Option<CallMatch>,
    /// Most pauses in all (0: unlimited). A test at scale pauses only its first jobs, while
    /// few jobs run and the reaper, fired often, examines every running job each time.
    pub max_pauses: u64,
    /// How long a pause lasts, in milliseconds: make it longer than the reaper's heartbeat
    /// timeout, so that the paused attempt is declared dead while it still lives. (The hosted
    /// functions' SDK runs without stalled-stream protection, whose timers would otherwise cut
    /// a pause short, where a frozen sandbox freezes them too.)
    pub pause_ms: u64,
    /// Whether to keep the journal of DynamoDB writes.
    pub journal: bool,
    /// Seed of the fault dice (runs with the same seed and timing draw the same faults).
    pub seed: u64,
}

/// The calls a fault plan aims at: one operation, whose request (URI or body) contains a text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallMatch {
    /// `service:Operation`, as the edge names calls (`dynamodb:PutItem`, `s3:PutObject`…).
    pub operation: String,
    /// Text the request's URI or body contains (a job id, a key prefix…).
    pub contains: String,
}

impl CallMatch {
    fn matches(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let needle = self.contains.as_bytes();
        let contains = |haystack: &[u8]| {
            needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
        };
        operation == self.operation && (contains(uri.as_bytes()) || body.is_some_and(contains))
    }
}

/// How many faults were injected, by kind (`GET /_local/faults`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Invocations crashed before an AWS call.
    pub crashed_before_call: u64,
    /// Invocations crashed after an AWS call took effect.
    pub crashed_after_call: u64,
    /// AWS calls answered with a throttling error.
    pub throttled: u64,
    /// AWS calls refused with `AccessDenied` ([`FaultPlan::deny`]).
    #[serde(default)]
    pub denied: u64,
    /// SQS and stream batches delivered twice.
    pub duplicated_batches: u64,
    /// `StartExecution` calls sent twice.
    pub duplicated_starts: u64,
    /// Invocations paused before an AWS call.
    pub paused: u64,
    /// Pauses that are over: the call went out and was answered, or the invocation died (or
    /// the SDK gave up on the call) meanwhile.
    pub pauses_over: u64,
    /// Crashes by where they struck: `"<function> <service:Operation> before|after"`.
    pub crash_sites: BTreeMap<String, u64>,
    /// Pauses by where they struck: `"<function> <service:Operation>"`.
    pub pause_sites: BTreeMap<String, u64>,
}

/// One DynamoDB write that took effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position in the order the table applied the writes (from 0).
    pub seq: u64,
    /// `dynamodb:UpdateItem`, …
    pub operation: String,
    /// The item's partition key (`JOB#<id>`, …), when the request names one item.
    pub pk: Option<String>,
    /// The item's sort key.
    pub sk: Option<String>,
    /// The lease of the attempt that made the write (`None`: not made by a lease holder).
    pub writer_lease: Option<String>,
    /// The item's `lease` after the write, when the response returned the item.
    pub lease_after: Option<String>,
    /// The item's `status` after the write, when the response returned the item.
    pub status_after: Option<String>,
    /// The table refused the write (its condition failed): it changed nothing. Only writes
    /// made under a lease are journaled when refused.
    #[serde(default)]
    pub refused: bool,
}

/// The stack's fault injector, shared by the edge, the hosts and the event sources.
#[derive(Debug, Default)]
pub struct Faults {
    plan: RwLock<FaultPlan>,
    rng: Mutex<Option<fastrand::Rng>>,
    crashes_by_job: Mutex<HashMap<String, u32>>,
    crashed_before: AtomicU64,
    crashed_after: AtomicU64,
    throttled: AtomicU64,
    denied: AtomicU64,
    duplicated: AtomicU64,
    duplicated_starts: AtomicU64,
    paused: AtomicU64,
    pauses_over: AtomicU64,
    paused_jobs: Mutex<HashSet<String>>,
    crash_sites: Mutex<BTreeMap<String, u64>>,
    pause_sites: Mutex<BTreeMap<String, u64>>,
    journal: Mutex<Vec<JournalEntry>>,
    /// Leases invocations minted by claiming their job (invocation → job key, lease).
    claimed: Mutex<HashMap<u64, (String, String)>>,
}

/// Where a crash strikes relative to the AWS call that triggers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The call never leaves the function.
    BeforeCall,
    /// The call takes effect; the function dies before it sees the answer.
    AfterCall,
}

impl Faults {
    /// Installs `plan`, resetting the dice, the counts and the journal.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.rng.lock().expect("fault rng") = Some(fastrand::Rng::with_seed(plan.seed));
        *self.plan.write().expect("fault plan") = plan;
        self.crashes_by_job.lock().expect("crash counts").clear();
        self.paused_jobs.lock().expect("paused jobs").clear();
        self.crash_sites.lock().expect("crash sites").clear();
        self.pause_sites.lock().expect("pause sites").clear();
        self.journal.lock().expect("journal").clear();
        self.claimed.lock().expect("claimed leases").clear();
        for counter in [
            &self.crashed_before,
            &self.crashed_after,
            &self.throttled,
            &self.denied,
            &self.duplicated,
            &self.duplicated_starts,
            &self.paused,
            &self.pauses_over,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// The plan in force.
    pub fn plan(&self) -> FaultPlan {
        self.plan.read().expect("fault plan").clone()
    }

    /// How many faults were injected since the plan was installed.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            crashed_before_call: self.crashed_before.load(Ordering::Relaxed),
            crashed_after_call: self.crashed_after.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            duplicated_batches: self.duplicated.load(Ordering::Relaxed),
            duplicated_starts: self.duplicated_starts.load(Ordering::Relaxed),
            paused: self.paused.load(Ordering::Relaxed),
            pauses_over: self.pauses_over.load(Ordering::Relaxed),
            crash_sites: self.crash_sites.lock().expect("crash sites").clone(),
            pause_sites: self.pause_sites.lock().expect("pause sites").clone(),
        }
    }

    fn roll(&self, probability: f64) -> bool {
        if probability <= 0.0 {
            return false;
        }
        let mut rng = self.rng.lock().expect("fault rng");
        rng.get_or_insert_with(|| fastrand::Rng::with_seed(0)).f64() < probability
    }

    /// Whether the plan may pause a call of `operation` to `uri` with `body` at all (see
    /// [`FaultPlan::pause_only`]).
    pub fn pause_targets(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let plan = self.plan.read().expect("fault plan");
        plan.pause_only.as_ref().is_none_or(|only| only.matches(operation, uri, body))
    }

    /// Whether the plan may crash a call of `operation` to `uri` with `body` at all (see
    /// [`FaultPlan::crash_only`]).
    pub fn crash_targets(&self, operation: &str, uri: &str, body: Option<&[u8]>) -> bool {
        let plan = self.plan.read().expect("fault plan");
        plan.crash_only.as_ref().is_none_or(|only| only.matches(operation, uri, body))
    }

    /// Whether `invocation` crashes at the AWS call (`operation`, as `service:Operation`) it
    /// is about to make, and where.
    pub fn crash_at_call(&self, invocation: &Invocation, operation: &str) -> Option<Crash> {
        let plan = self.plan.read().expect("fault plan");
        if !plan.crash_functions.contains(&invocation.function) {
            return None;
        }
        let crash = if self.roll(plan.crash_before_call) {
            Crash::BeforeCall
        } else if self.roll(plan.crash_after_call) {
            Crash::AfterCall
        } else {
            return None;
        };
        if plan.max_crashes_per_job > 0 {
            let job = invocation.crash_key.clone().unwrap_or_default();
            let mut counts = self.crashes_by_job.lock().expect("crash counts");
            let count = counts.entry(job).or_default();
            if *count >= plan.max_crashes_per_job {
                return None;
            }
            *count += 1;
        }
        let (counter, side) = match crash {
            Crash::BeforeCall => (&self.crashed_before, "before"),
            Crash::AfterCall => (&self.crashed_after, "after"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let site = format!("{} {operation} {side}", invocation.function);
        *self.crash_sites.lock().expect("crash sites").entry(site).or_default() += 1;
        Some(crash)
    }

    /// How long `invocation` pauses before the AWS call (`operation`) it is about to make, if
    /// it does: only an invocation of a planned function that holds (`holds_lease`) a job's
    /// lease, at most once per job.
    pub fn pause_at_call(
        &self,
        invocation: &Invocation,
        operation: &str,
        holds_lease: bool,
    ) -> Option<std::time::Duration> {
        let plan = self.plan.read().expect("fault plan");
        let job = invocation.job_id.as_ref()?;
        if !holds_lease
            || !plan.pause_functions.contains(&invocation.function)
            || !self.roll(plan.pause_before_call)
        {
            return None;
        }
        let mut paused_jobs = self.paused_jobs.lock().expect("paused jobs");
        if (plan.max_pauses > 0 && paused_jobs.len() as u64 >= plan.max_pauses)
            || !paused_jobs.insert(job.clone())
        {
            return None;
        }
        drop(paused_jobs);
        self.paused.fetch_add(1, Ordering::Relaxed);
        let site = format!("{} {operation}", invocation.function);
        *self.pause_sites.lock().expect("pause sites").entry(site).or_default() += 1;
        Some(std::time::Duration::from_millis(plan.pause_ms))
    }

    /// Whether the edge sends the `StartExecution` it is about to forward twice.
    pub fn duplicate_start(&self) -> bool {
        let probability = self.plan.read().expect("fault plan").duplicate_start;
        let hit = self.roll(probability);
        if hit {
            self.duplicated_starts.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether the edge throttles the call it is about to forward (`operation`, with its
    /// request URI and body).
    pub fn throttle_call(&self, operation: &str, uri: &str, body: &[u8]) -> bool {
        let probability = {
            let plan = self.plan.read().expect("fault plan");
            match &plan.throttle_only {
                Some(only) if !only.matches(operation, uri, Some(body)) => 0.0,
                _ => plan.throttle,
            }
        };
        let hit = self.roll(probability);
        if hit {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether the edge refuses the call of `operation` to `uri` with `body` it is about to
    /// forward (see [`FaultPlan::deny`]).
    pub fn deny_call(&self, operation: &str, uri: &str, body: &[u8]) -> bool {
        let plan = self.plan.read().expect("fault plan");
        let hit = plan.deny.as_ref().is_some_and(|only| only.matches(operation, uri, Some(body)));
        if hit {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether an SQS or stream batch is delivered twice.
    pub fn duplicate_delivery(&self) -> bool {
        let probability = self.plan.read().expect("fault plan").duplicate_delivery;
        let hit = self.roll(probability);
        if hit {
            self.duplicated.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Whether DynamoDB writes are journaled.
    pub fn journaling(&self) -> bool {
        self.plan.read().expect("fault plan").journal
    }

    /// Journals a DynamoDB write that took effect (`applied`), or that the table refused:
    /// `request` and `response` are the wire bodies. Call it while writes are serialised, so
    /// the journal's order is the table's.
    ///
    /// A write by invocation `invocation` holding no lease that made a job item `running`
    /// under a lease is a claim: the invocation's later calls on that job carry the lease it
    /// minted (the state machine's first stage call claims the job and works in one
    /// invocation, so its event cannot name the lease).
    pub fn journal_write(
        &self,
        operation: &str,
        writer_lease: Option<String>,
        invocation: Option<u64>,
        applied: bool,
        request: &[u8],
        response: &[u8],
    ) {
        let request: serde_json::Value = serde_json::from_slice(request).unwrap_or_default();
        let response: serde_json::Value = serde_json::from_slice(response).unwrap_or_default();
        let key = request.get("Key").or_else(|| request.get("Item"));
        let string = |v: Option<&serde_json::Value>, name: &str| {
            v.and_then(|v| v.get(name))
                .and_then(|a| a.get("S"))
                .and_then(|s| s.as_str())
                .map(str::to_owned)
        };
        // A refused write's answer may carry the item as it is (ALL_OLD): not after the write.
        let attributes = response.get("Attributes").filter(|_| applied);
        let entry = JournalEntry {
            seq: 0,
            operation: operation.to_owned(),
            pk: string(key, "pk"),
            sk: string(key, "sk"),
            writer_lease,
            lease_after: string(attributes, "lease"),
            status_after: string(attributes, "status"),
            refused: !applied,
        };
        if let (Some(invocation), None, Some("JOB"), Some("running"), Some(pk), Some(lease)) = (
            invocation,
            &entry.writer_lease,
            entry.sk.as_deref(),
            entry.status_after.as_deref(),
            &entry.pk,
            &entry.lease_after,
        ) {
            self.claimed
                .lock()
                .expect("claimed leases")
                .insert(invocation, (pk.clone(), lease.clone()));
        }
        let mut journal = self.journal.lock().expect("journal");
        let seq = journal.len() as u64;
        journal.push(JournalEntry { seq, ..entry });
    }

    /// The lease `invocation` minted by claiming job `job_id`, if it did.
    fn claimed_lease(&self, invocation: u64, job_id: &str) -> Option<String> {
        let claimed = self.claimed.lock().expect("claimed leases");
        let (pk, lease) = claimed.get(&invocation)?;
        (pk.strip_prefix("JOB#") == Some(job_id)).then(|| lease.clone())
    }

    /// The journal so far.
    pub fn journal(&self) -> Vec<JournalEntry> {
        self.journal.lock().expect("journal").clone()
    }
}

tokio::task_local! {
    static INVOCATION: Invocation;
}

/// The invocation a task runs: which function, for which job and lease, and how to tell the
/// host that it crashed.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Unique per invocation (within the process).
    pub id: u64,
    /// The function's logical name.
    pub function: String,
    /// The job the event names, if any.
    pub job_id: Option<String>,
    /// The lease the event carries, if any.
    pub lease: Option<String>,
    /// What the per-job crash cap counts against: the job, for an SQS or stream batch its
    /// first message or record (a redelivered batch must not crash until it is dead-lettered),
    /// for an API request its `Idempotency-Key` (the submission a client retries).
    crash_key: Option<String>,
    crashed: Arc<Notify>,
    aws: Arc<Mutex<AwsUse>>,
}

/// The AWS calls one invocation made, and the time it spent waiting for them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AwsUse {
    /// Calls made (SDK attempts: a retried call counts each attempt).
    pub calls: u32,
    /// Wall time from handing each request to the HTTP client to its response head.
    pub time: std::time::Duration,
}

impl Invocation {
    /// An invocation of `function` with `event` (read for `job_id` and `lease.token`, or
    /// `state.lease.token` as the state machine's `Run` state passes it).
    pub fn new(function: &str, event: Option<&serde_json::Value>) -> Self {
        let field = |path: &[&str]| {
            let mut value = event?;
            for name in path {
                value = value.get(name)?;
            }
            value.as_str().map(str::to_owned)
        };
        let job_id = field(&["job_id"]);
        let first = event.and_then(|e| e.get("Records")?.get(0));
        let first_message = first
            .and_then(|r| r.get("messageId")?.as_str())
            .map(|id| format!("message {id}"))
            .or_else(|| {
                first
                    .and_then(|r| r["dynamodb"]["SequenceNumber"].as_str())
                    .map(|seq| format!("record {seq}"))
            });
        Invocation {
            id: NEXT_INVOCATION.fetch_add(1, Ordering::Relaxed),
            function: function.to_owned(),
            crash_key: job_id.clone().or(first_message).or_else(|| {
                let key = event?.get("headers")?.get("idempotency-key")?.as_str()?;
                Some(format!("submission {key}"))
            }),
            job_id,
            lease: field(&["lease", "token"]).or_else(|| field(&["state", "lease", "token"])),
            crashed: Arc::new(Notify::new()),
            aws: Arc::default(),
        }
    }

    /// Runs `future` as this invocation (its AWS calls are subject to the fault plan).
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        INVOCATION.scope(self.clone(), future)
    }

    /// Completes when a fault crashed this invocation.
    pub async fn crashed(&self) {
        self.crashed.notified().await;
    }

    /// The AWS calls this invocation made so far.
    pub fn aws_use(&self) -> AwsUse {
        *self.aws.lock().expect("aws use")
    }

    fn count_call(&self, time: std::time::Duration) {
        let mut aws = self.aws.lock().expect("aws use");
        aws.calls += 1;
        aws.time += time;
    }

    fn crash(&self) {
        // `notify_one` keeps a permit if the host is not waiting yet.
        self.crashed.notify_one();
    }
}

/// The SDK HTTP client of the hosted functions: the real client, with crashes injected
/// around the calls of invocations the plan targets, each call tagged with the function and
/// the lease of the attempt making it, and each invocation's AWS time measured.
#[derive(Debug, Clone)]
pub struct FaultyHttpClient {
    inner: SharedHttpClient,
    faults: Arc<Faults>,
}

impl FaultyHttpClient {
    /// Wraps `inner`.
    pub fn new(inner: SharedHttpClient, faults: Arc<Faults>) -> Self {
        FaultyHttpClient { inner, faults }
    }
}

impl HttpClient for FaultyHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(FaultyConnector {
            inner: self.inner.http_connector(settings, components),
            faults: self.faults.clone(),
        })
    }
}

#[derive(Debug)]
struct FaultyConnector {
    inner: SharedHttpConnector,
    faults: Arc<Faults>,
}

impl HttpConnector for FaultyConnector {
    fn call(&self, mut request: HttpRequest) -> HttpConnectorFuture {
        // The SDK calls the connector from the task that awaits the operation, so the
        // task-local names the invocation (calls from tasks a handler spawns are not
        // attributed, and never crash).
        let Ok(invocation) = INVOCATION.try_with(Invocation::clone) else {
            return self.inner.call(request);
        };
        // Added after signing, so not part of the signature; the edge reads and drops them.
        let lease = invocation.lease.clone().or_else(|| {
            let job_id = invocation.job_id.as_deref()?;
            self.faults.claimed_lease(invocation.id, job_id)
        });
        let holds_lease = lease.is_some();
        if let Some(lease) = lease {
            request.headers_mut().insert(LEASE_HEADER, lease);
        }
        request.headers_mut().insert(FUNCTION_HEADER, invocation.function.clone());
        request.headers_mut().insert(INVOCATION_HEADER, invocation.id.to_string());
        let operation = operation_of(&request);
        let targeted = self.faults.crash_targets(&operation, request.uri(), request.body().bytes());
        match targeted.then(|| self.faults.crash_at_call(&invocation, &operation)).flatten() {
            None => {
                let aimed =
                    self.faults.pause_targets(&operation, request.uri(), request.body().bytes());
                let pause = aimed
                    .then(|| self.faults.pause_at_call(&invocation, &operation, holds_lease))
                    .flatten();
                let (inner, faults) = (self.inner.clone(), self.faults.clone());
                HttpConnectorFuture::new(async move {
                    // Counts the pause over however this future ends (answered or dropped).
                    let _pause_over = pause.map(|_| PauseOver(faults));
                    if let Some(pause) = pause {
                        tracing::info!(
                            function = invocation.function,
                            job_id = invocation.job_id,
                            ?pause,
                            "invocation paused (fault injected)"
                        );
                        tokio::time::sleep(pause).await;
                    }
                    let started = std::time::Instant::now();
                    let answer = inner.call(request).await;
                    invocation.count_call(started.elapsed());
                    answer
                })
            }
            Some(Crash::BeforeCall) => {
                invocation.crash();
                HttpConnectorFuture::new(std::future::pending())
            }
            Some(Crash::AfterCall) => {
                let call = self.inner.call(request);
                HttpConnectorFuture::new(async move {
                    // Whatever the answer, the function never sees it.
                    let _answer_never_seen = call.await;
                    invocation.crash();
                    std::future::pending().await
                })
            }
        }
    }
}

/// Counts a pause over when dropped.
struct PauseOver(Arc<Faults>);

impl Drop for PauseOver {
    fn drop(&mut self) {
        self.0.pauses_over.fetch_add(1, Ordering::Relaxed);
    }
}

/// Names a signed SDK request `service:Operation`, as the edge does.
fn operation_of(request: &HttpRequest) -> String {
    let mut headers = axum::http::HeaderMap::new();
    for name in ["authorization", "x-amz-target", "x-amz-copy-source"] {
        if let Some(value) =
            request.headers().get(name).and_then(|v| axum::http::HeaderValue::from_str(v).ok())
        {
            headers.insert(name, value);
        }
    }
    let method = axum::http::Method::from_bytes(request.method().as_bytes()).unwrap_or_default();
    let uri = request.uri().parse::<axum::http::Uri>().unwrap_or_default();
    crate::operations::classify(&method, &uri, &headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation(job: &str) -> Invocation {
        Invocation::new(
            "StageFunction",
            Some(&serde_json::json!({"job_id": job, "lease": {"token": "t1"}})),
        )
    }

    #[test]
    fn an_invocation_reads_job_and_lease_from_its_event() {
        let i = invocation("j1");
        assert_eq!((i.job_id.as_deref(), i.lease.as_deref()), (Some("j1"), Some("t1")));
        let bare = Invocation::new("DispatcherFunction", Some(&serde_json::json!({"Records": []})));
        assert_eq!((bare.job_id, bare.lease), (None, None));
        let batch = Invocation::new(
            "DispatcherFunction",
            Some(&serde_json::json!({"Records": [{"messageId": "m1"}]})),
        );
        assert_eq!(
            batch.crash_key.as_deref(),
            Some("message m1"),
            "a batch's crashes are capped by its first message"
        );
        let stream = Invocation::new(
            "NotifierFunction",
            Some(&serde_json::json!({"Records": [{"dynamodb": {"SequenceNumber": "7"}}]})),
        );
        assert_eq!(
            stream.crash_key.as_deref(),
            Some("record 7"),
            "a stream batch's by its first record"
        );
    }

    #[test]
    fn crashes_only_target_the_planned_functions_and_respect_the_per_job_cap() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            crash_functions: vec!["StageFunction".into()],
            crash_before_call: 1.0,
            max_crashes_per_job: 2,
            ..FaultPlan::default()
        });
        let other = Invocation::new("DispatcherFunction", None);
        assert_eq!(faults.crash_at_call(&other, "s3:GetObject"), None);
        let stage = invocation("j1");
        assert_eq!(faults.crash_at_call(&stage, "s3:GetObject"), Some(Crash::BeforeCall));
        assert_eq!(faults.crash_at_call(&stage, "dynamodb:UpdateItem"), Some(Crash::BeforeCall));
        assert_eq!(
            faults.crash_at_call(&stage, "s3:GetObject"),
            None,
            "the third crash of j1 exceeds the cap"
        );
        assert_eq!(
            faults.crash_at_call(&invocation("j2"), "s3:GetObject"),
            Some(Crash::BeforeCall)
        );
        let counts = faults.counts();
        assert_eq!(counts.crashed_before_call, 3);
        assert_eq!(
            counts.crash_sites,
            BTreeMap::from([
                ("StageFunction dynamodb:UpdateItem before".to_owned(), 1),
                ("StageFunction s3:GetObject before".to_owned(), 2)
            ])
        );
    }

    #[test]
    fn a_plan_can_aim_its_crashes_at_one_kind_of_call() {
        let faults = Faults::default();
        let only = CallMatch {
            operation: "dynamodb:PutItem".into(),
            contains: "checkpoints/j1/render/".into(),
        };
        faults.set_plan(FaultPlan { crash_only: Some(only), ..FaultPlan::default() });
        let body = br#"{"Item":{"checkpoint_key":{"S":"checkpoints/j1/render/00000000000000000003.json"}}}"#;
        assert!(faults.crash_targets("dynamodb:PutItem", "/", Some(body)));
        assert!(!faults.crash_targets("dynamodb:UpdateItem", "/", Some(body)), "another operation");
        assert!(!faults.crash_targets("dynamodb:PutItem", "/", Some(b"{}")), "another request");
        assert!(
            faults.crash_targets("dynamodb:PutItem", "/bucket/checkpoints/j1/render/x", None),
            "the URI counts too"
        );
        faults.set_plan(FaultPlan::default());
        assert!(faults.crash_targets("s3:GetObject", "/", None), "no aim: every call");
    }

    #[test]
    fn a_plan_can_refuse_one_kind_of_call() {
        let faults = Faults::default();
        let only =
            CallMatch { operation: "s3:GetObject".into(), contains: "uploads/u/x.csv".into() };
        faults.set_plan(FaultPlan { deny: Some(only), ..FaultPlan::default() });
        assert!(faults.deny_call("s3:GetObject", "/bucket/uploads/u/x.csv", b""));
        assert!(!faults.deny_call("s3:HeadObject", "/bucket/uploads/u/x.csv", b""));
        assert!(!faults.deny_call("s3:GetObject", "/bucket/uploads/u/y.csv", b""));
        assert_eq!(faults.counts().denied, 1);
        faults.set_plan(FaultPlan::default());
        assert!(!faults.deny_call("s3:GetObject", "/bucket/uploads/u/x.csv", b""), "no plan");
        assert_eq!(faults.counts().denied, 0);
    }

    #[test]
    fn a_submission_is_capped_by_its_idempotency_key() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            crash_functions: vec!["SubmitFunction".into()],
            crash_after_call: 1.0,
            max_crashes_per_job: 1,
            ..FaultPlan::default()
        });
        let submit = |key: &str| {
            Invocation::new(
                "SubmitFunction",
                Some(&serde_json::json!({"headers": {"idempotency-key": key}})),
            )
        };
        assert_eq!(faults.crash_at_call(&submit("k1"), "dynamodb:PutItem"), Some(Crash::AfterCall));
        assert_eq!(
            faults.crash_at_call(&submit("k1"), "dynamodb:PutItem"),
            None,
            "k1's retry is spared"
        );
        assert_eq!(
            faults.crash_at_call(&submit("k2"), "dynamodb:PutItem"),
            Some(Crash::AfterCall),
            "another submission is not"
        );
    }

    #[test]
    fn only_a_lease_holder_of_a_planned_function_pauses_and_once_per_job() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            pause_functions: vec!["StageFunction".into()],
            pause_before_call: 1.0,
            pause_ms: 1_500,
            ..FaultPlan::default()
        });
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", false),
            None,
            "not before it holds the lease"
        );
        assert_eq!(
            faults.pause_at_call(
                &Invocation::new("DispatcherFunction", None),
                "s3:PutObject",
                true
            ),
            None
        );
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", true),
            Some(std::time::Duration::from_millis(1_500))
        );
        assert_eq!(
            faults.pause_at_call(&invocation("j1"), "s3:PutObject", true),
            None,
            "once per job"
        );
        faults.set_plan(FaultPlan { max_pauses: 1, ..faults.plan() });
        assert!(faults.pause_at_call(&invocation("j2"), "s3:PutObject", true).is_some());
        assert_eq!(
            faults.pause_at_call(&invocation("j3"), "s3:PutObject", true),
            None,
            "at most max_pauses in all"
        );
        assert_eq!(faults.counts().paused, 1);
        assert_eq!(
            faults.counts().pause_sites,
            BTreeMap::from([("StageFunction s3:PutObject".to_owned(), 1)])
        );
    }

    #[test]
    fn throttling_aimed_at_one_call_spares_the_others() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan {
            throttle: 1.0,
            throttle_only: Some(CallMatch {
                operation: "sfn:StartExecution".into(),
                contains: "job-1".into(),
            }),
            ..FaultPlan::default()
        });
        assert!(faults.throttle_call("sfn:StartExecution", "/", br#"{"name":"job-1-1"}"#));
        assert!(!faults.throttle_call("sfn:StartExecution", "/", br#"{"name":"job-2-1"}"#));
        assert!(!faults.throttle_call("dynamodb:PutItem", "/", br#"{"pk":"JOB#job-1"}"#));
        assert_eq!(faults.counts().throttled, 1);
    }

    #[test]
    fn no_plan_injects_nothing() {
        let faults = Faults::default();
        assert_eq!(faults.crash_at_call(&invocation("j1"), "s3:GetObject"), None);
        assert_eq!(faults.pause_at_call(&invocation("j1"), "s3:PutObject", true), None);
        assert!(
            !faults.throttle_call("sqs:SendMessage", "/", b"")
                && !faults.duplicate_delivery()
                && !faults.duplicate_start()
        );
        assert_eq!(faults.counts(), FaultCounts::default());
    }

    #[test]
    fn the_journal_keeps_keys_and_the_lease_after_each_write() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan { journal: true, ..FaultPlan::default() });
        let request = serde_json::json!({"Key": {"pk": {"S": "JOB#1"}, "sk": {"S": "JOB"}}});
        let response =
            serde_json::json!({"Attributes": {"lease": {"S": "t2"}, "status": {"S": "running"}}});
        faults.journal_write(
            "dynamodb:UpdateItem",
            Some("t1".into()),
            Some(7),
            true,
            request.to_string().as_bytes(),
            response.to_string().as_bytes(),
        );
        faults.journal_write("dynamodb:PutItem", None, None, true, b"not json", b"");
        // Refused: journaled, but nothing of the item is read from the answer.
        faults.journal_write(
            "dynamodb:UpdateItem",
            Some("t0".into()),
            None,
            false,
            request.to_string().as_bytes(),
            response.to_string().as_bytes(),
        );
        let journal = faults.journal();
        assert_eq!(journal.len(), 3);
        assert!(!journal[0].refused);
        assert!(journal[2].refused);
        assert_eq!(
            (journal[2].lease_after.as_deref(), journal[2].status_after.as_deref()),
            (None, None)
        );
        assert_eq!(journal[0].pk.as_deref(), Some("JOB#1"));
        assert_eq!(journal[0].writer_lease.as_deref(), Some("t1"));
        assert_eq!(journal[0].lease_after.as_deref(), Some("t2"));
        assert_eq!(journal[0].status_after.as_deref(), Some("running"));
        assert_eq!((journal[1].seq, journal[1].pk.as_deref()), (1, None));
        // Written under a lease: not a claim, nothing learned.
        assert_eq!(faults.claimed_lease(7, "1"), None);
    }

    #[test]
    fn an_invocation_that_claims_its_job_writes_under_the_lease_it_minted() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan { journal: true, ..FaultPlan::default() });
        let request = serde_json::json!({"Key": {"pk": {"S": "JOB#j1"}, "sk": {"S": "JOB"}}});
        let claimed = serde_json::json!({"Attributes": {"lease": {"S": "minted"}, "status": {"S": "running"}}});
        faults.journal_write(
            "dynamodb:UpdateItem",
            None,
            Some(9),
            true,
            request.to_string().as_bytes(),
            claimed.to_string().as_bytes(),
        );
        assert_eq!(faults.claimed_lease(9, "j1").as_deref(), Some("minted"));
        assert_eq!(faults.claimed_lease(9, "j2"), None, "only for the job it claimed");
        assert_eq!(faults.claimed_lease(10, "j1"), None, "only for the invocation that claimed");
        let work = Invocation::new(
            "StageFunction",
            Some(&serde_json::json!({"job_id": "j1", "state": {"lease": {"token": "t3"}}})),
        );
        assert_eq!(work.lease.as_deref(), Some("t3"));
    }
}
