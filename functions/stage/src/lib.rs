//! **stage** — the Step Functions task that does a job's work.
//!
//! One function serves every task state of the job state machine, selected by `op`:
//! `claim` (`queued → running`, minting the lease), `run` (do work until done or until the
//! Lambda deadline nears, checkpointing, and say `continue` or `done`), `complete`
//! (`running → succeeded`, after the result is durable) and `fail` (record why).
//!
//! Errors carry stable names the state machine matches: `Job.Retryable` (retried with
//! backoff), `Job.Fatal` (fails the job), `Job.LeaseLost` (another attempt owns the job: stop
//! with no further side effects), `Job.NotClaimable` (the job is not waiting to run).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lambda_runtime::Diagnostic;
use longhaul_aws::config::{ConfigError, Vars};
use longhaul_aws::jobs::{JobRecord, JobStore, Lease, ProgressRecord, StoreError, TransitionRequest};
use longhaul_aws::objects::{ObjectStore, checkpoint_key, result_key};
use longhaul_domain::demo::{DemoParams, DemoResult, DemoState, FailKind};
use longhaul_domain::{JobError, JobSpec, JobStatus, now_rfc3339};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `BUCKET_NAME`: results and checkpoints.
    pub bucket: String,
    /// `LONGHAUL_STAGE_MARGIN_SECONDS` (default 30): stop and checkpoint this long before the
    /// Lambda deadline.
    pub margin: Duration,
    /// `LONGHAUL_PROGRESS_INTERVAL_MS` (default 2,000): least time between progress writes
    /// (unless progress moved by a whole percent).
    pub progress_interval: Duration,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            bucket: vars.required("BUCKET_NAME")?,
            margin: Duration::from_secs(vars.parsed_or("LONGHAUL_STAGE_MARGIN_SECONDS", 30)?),
            progress_interval: Duration::from_millis(vars.parsed_or("LONGHAUL_PROGRESS_INTERVAL_MS", 2_000)?),
        })
    }
}

/// What the handler needs, built once per sandbox.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The job table.
    pub jobs: JobStore,
    /// Results and checkpoints.
    pub objects: ObjectStore,
    /// Stop this long before the deadline.
    pub margin: Duration,
    /// Least time between progress writes.
    pub progress_interval: Duration,
}

impl Deps {
    /// Builds the adapters from one SDK configuration.
    pub fn new(sdk: &aws_config::SdkConfig, config: &Config) -> Self {
        Deps {
            jobs: JobStore::new(aws_sdk_dynamodb::Client::new(sdk), config.table.clone()),
            objects: ObjectStore::new(aws_sdk_s3::Client::new(sdk), config.bucket.clone()),
            margin: config.margin,
            progress_interval: config.progress_interval,
        }
    }
}

/// The error a state's `Catch` hands to `fail` (`ResultPath: $.error`).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StateError {
    /// The error name (`Job.Fatal`, `States.Timeout`, …).
    #[serde(rename = "Error")]
    pub error: String,
    /// The cause; for a Lambda error, JSON `{"errorType", "errorMessage"}`.
    #[serde(rename = "Cause", default)]
    pub cause: String,
}

/// A task state's input.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StageInput {
    /// Take the job: `queued → running`.
    Claim {
        /// The job.
        job_id: String,
        /// The execution's name (claims are idempotent per execution).
        execution: String,
    },
    /// Do work.
    Run {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: Lease,
    },
    /// Mark the job succeeded.
    Complete {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: Lease,
        /// What `run` returned.
        run: RunOutput,
    },
    /// Record a failure.
    Fail {
        /// The job.
        job_id: String,
        /// The claim's lease.
        lease: Lease,
        /// What went wrong.
        error: StateError,
    },
}

/// What `run` returns.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct RunOutput {
    /// `continue` (call `run` again) or `done`.
    pub next: String,
    /// When done: the result object's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
}

/// A stage failure, named for the state machine.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Worth retrying (throttling, a transient dependency failure).
    #[error("{0}")]
    Retryable(String),
    /// Retrying cannot help.
    #[error("{0}")]
    Fatal(String),
    /// Another attempt holds the job; stop without side effects.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The job is not waiting to be claimed.
    #[error("{0}")]
    NotClaimable(String),
}

impl StageError {
    /// The stable error name the state machine matches on.
    pub fn name(&self) -> &'static str {
        match self {
            StageError::Retryable(_) => "Job.Retryable",
            StageError::Fatal(_) => "Job.Fatal",
            StageError::LeaseLost(_) => "Job.LeaseLost",
            StageError::NotClaimable(_) => "Job.NotClaimable",
        }
    }
}

impl From<StageError> for Diagnostic {
    fn from(err: StageError) -> Diagnostic {
        Diagnostic { error_type: err.name().to_owned(), error_message: err.to_string() }
    }
}

impl From<longhaul_aws::AwsError> for StageError {
    fn from(err: longhaul_aws::AwsError) -> Self {
        StageError::Retryable(err.to_string())
    }
}

/// A store failure during an attempt's own writes: a refused condition means the lease is
/// gone; anything else is worth retrying.
fn fenced(err: StoreError) -> StageError {
    match err {
        StoreError::Conflict { current } => StageError::LeaseLost(match current {
            Some(job) => format!("job is {} (attempt {})", job.status, job.attempt),
            None => "progress write refused".into(),
        }),
        StoreError::Illegal(e) => StageError::Fatal(e.to_string()),
        other => StageError::Retryable(other.to_string()),
    }
}

/// The Lambda deadline (epoch milliseconds) as an `Instant`.
pub fn deadline_from_epoch_ms(deadline_ms: u64) -> Instant {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    Instant::now() + Duration::from_millis(deadline_ms.saturating_sub(now_ms))
}

/// Handles one task invocation; `deadline` is when Lambda would stop the invocation.
pub async fn handle(deps: &Deps, input: StageInput, deadline: Instant) -> Result<serde_json::Value, StageError> {
    match input {
        StageInput::Claim { job_id, execution } => {
            let lease = deps.jobs.claim(&job_id, &execution).await.map_err(|err| match err {
                StoreError::Conflict { current } => StageError::NotClaimable(format!(
                    "job {job_id} is {}",
                    current.map(|j| j.status.as_str()).unwrap_or("missing")
                )),
                other => StageError::Retryable(other.to_string()),
            })?;
            tracing::info!(job_id, attempt = lease.attempt, "claimed");
            Ok(serde_json::to_value(lease).expect("leases serialise"))
        }
        StageInput::Run { job_id, lease } => {
            let output = run(deps, &job_id, &lease, deadline).await?;
            Ok(serde_json::to_value(output).expect("outputs serialise"))
        }
        StageInput::Complete { job_id, lease, run } => {
            let result_key = run.result_key.ok_or_else(|| StageError::Fatal("complete without a result".into()))?;
            let request = TransitionRequest::new(&job_id, &[JobStatus::Running], JobStatus::Succeeded, "result stored")
                .fenced(&lease.token)
                .set("result_key", aws_sdk_dynamodb::types::AttributeValue::S(result_key));
            match deps.jobs.transition(request).await {
                Ok(_) => {}
                // A retried `complete` whose first try landed.
                Err(StoreError::Conflict { current: Some(job) })
                    if job.status == JobStatus::Succeeded && job.lease.as_deref() == Some(&lease.token) => {}
                Err(err) => return Err(fenced(err)),
            }
            tracing::info!(job_id, attempt = lease.attempt, "succeeded");
            Ok(json!({}))
        }
        StageInput::Fail { job_id, lease, error } => {
            let message = serde_json::from_str::<serde_json::Value>(&error.cause)
                .ok()
                .and_then(|cause| cause.get("errorMessage").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or(error.cause);
            let job_error = JobError { code: error.error, message };
            let request = TransitionRequest::new(&job_id, &[JobStatus::Running], JobStatus::Failed, job_error.message.clone())
                .fenced(&lease.token)
                .set("error", serde_dynamo::to_attribute_value(&job_error).expect("errors serialise"));
            match deps.jobs.transition(request).await {
                Ok(_) => {}
                Err(StoreError::Conflict { current: Some(job) })
                    if job.status == JobStatus::Failed && job.lease.as_deref() == Some(&lease.token) => {}
                Err(err) => return Err(fenced(err)),
            }
            tracing::warn!(job_id, attempt = lease.attempt, code = job_error.code, "failed");
            Ok(json!({}))
        }
    }
}

async fn run(deps: &Deps, job_id: &str, lease: &Lease, deadline: Instant) -> Result<RunOutput, StageError> {
    let view = deps.jobs.view(job_id).await.map_err(|e| StageError::Retryable(e.to_string()))?;
    let view = view.ok_or_else(|| StageError::Fatal(format!("job {job_id} does not exist")))?;
    let job = &view.job;
    if job.status != JobStatus::Running || job.lease.as_deref() != Some(&lease.token) {
        return Err(StageError::LeaseLost(format!("job is {} under another lease", job.status)));
    }
    let spec = JobSpec::parse(&job.job_type, &job.params).map_err(|e| StageError::Fatal(e.to_string()))?;
    let progress = view.progress.unwrap_or_default();
    match spec {
        JobSpec::Demo(params) => run_demo(deps, job, &params, lease, progress.seq, deadline).await,
    }
}

/// Throttled, lease-fenced progress reporting.
struct ProgressReporter<'a> {
    deps: &'a Deps,
    job_id: &'a str,
    lease: &'a Lease,
    seq: u64,
    last_write: Instant,
    last_pct: f64,
}

impl ProgressReporter<'_> {
    async fn report(&mut self, done: u64, total: u64, force: bool) -> Result<(), StageError> {
        let pct = if total == 0 { 100.0 } else { (done as f64 * 100.0 / total as f64 * 10.0).floor() / 10.0 };
        let due = self.last_write.elapsed() >= self.deps.progress_interval || pct - self.last_pct >= 1.0;
        if !force && !due {
            return Ok(());
        }
        self.seq += 1;
        let now = now_rfc3339();
        let record = ProgressRecord {
            pct,
            stage: "process".into(),
            stage_index: 1,
            stages_total: 1,
            items_done: done,
            items_total: Some(total),
            eta_seconds: None,
            seq: self.seq,
            heartbeat_at: now.clone(),
            updated_at: now,
            lease: self.lease.token.clone(),
        };
        self.deps.jobs.record_progress(self.job_id, &record).await.map_err(fenced)?;
        self.last_write = Instant::now();
        self.last_pct = pct;
        Ok(())
    }
}

async fn run_demo(
    deps: &Deps,
    job: &JobRecord,
    params: &DemoParams,
    lease: &Lease,
    seq: u64,
    deadline: Instant,
) -> Result<RunOutput, StageError> {
    let job_id = job.job_id.as_str();
    let checkpoint = checkpoint_key(job_id, "demo");
    let mut state: DemoState = match deps.objects.get(&checkpoint).await? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| StageError::Fatal(format!("unreadable checkpoint {checkpoint}: {e}")))?,
        None => DemoState::default(),
    };
    let mut progress =
        ProgressReporter { deps, job_id, lease, seq, last_write: Instant::now(), last_pct: -1.0 };
    progress.report(state.next_item, params.items, true).await?;
    let stop_at = deadline.checked_sub(deps.margin).unwrap_or_else(Instant::now);
    while state.next_item < params.items {
        if Instant::now() >= stop_at {
            save_checkpoint(deps, &checkpoint, &state).await?;
            progress.report(state.next_item, params.items, true).await?;
            tracing::info!(job_id, next_item = state.next_item, "deadline near; continuing in a new invocation");
            return Ok(RunOutput { next: "continue".into(), result_key: None });
        }
        if let Some(kind) = params.injected_failure(state.next_item, job.injected_failures) {
            // Keep the work done so far, count the failure (fenced), then fail as asked.
            save_checkpoint(deps, &checkpoint, &state).await?;
            deps.jobs.count_injected_failure(job_id, &lease.token).await.map_err(fenced)?;
            let message = format!("injected {kind:?} failure at item {}", state.next_item).to_lowercase();
            return Err(match kind {
                FailKind::Transient => StageError::Retryable(message),
                FailKind::Fatal => StageError::Fatal(message),
            });
        }
        state.process_next();
        if params.item_ms > 0 {
            tokio::time::sleep(Duration::from_millis(params.item_ms)).await;
        }
        progress.report(state.next_item, params.items, false).await?;
    }
    let result = DemoResult { items: state.next_item, digest: state.digest.clone() };
    let key = result_key(job_id, "result.json");
    // The result is durable before anyone can see the job succeeded.
    deps.objects
        .put(&key, serde_json::to_vec(&result).expect("results serialise"), "application/json")
        .await?;
    progress.report(params.items, params.items, true).await?;
    Ok(RunOutput { next: "done".into(), result_key: Some(key) })
}

async fn save_checkpoint(deps: &Deps, key: &str, state: &DemoState) -> Result<(), StageError> {
    let body = serde_json::to_vec(state).expect("checkpoints serialise");
    deps.objects.put(key, body, "application/json").await?;
    Ok(())
}
