//! Test harness: one local stack per test binary, shared by its tests, plus small clients for
//! the API and the emulator.
//!
//! The stack runs on its own thread with its own runtime, so it outlives any single
//! `#[tokio::test]` runtime; its emulator dies with the test process.

pub mod browser;
pub mod csvgen;
pub mod kinds;
pub mod openapi;
pub mod partner;
pub mod sections;

mod api;
mod aws;
mod faults;
mod stack;
mod waits;

pub use api::*;
pub use aws::*;
pub use faults::*;
/// What the tests name jobs and principals by (the domain's types).
pub use longhaul_domain::{JobId, Owner};
pub use stack::*;
pub use waits::*;

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
pub async fn metric_points(name: &str, job_id: &JobId, at_least: usize) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let points: Vec<Value> = harness()
            .stack
            .metrics
            .parsed()
            .into_iter()
            .filter(|line| line["job_id"] == job_id.as_str() && line.get(name).is_some())
            .collect();
        if points.len() >= at_least || tokio::time::Instant::now() >= deadline {
            return points;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the functions counted `name` for job `job_id` exactly once.
pub async fn assert_counted_once(name: &str, job_id: &JobId) {
    let points = metric_points(name, job_id, 1).await;
    assert_eq!(points.len(), 1, "{name} for {job_id}: {points:?}");
    assert_eq!(points[0][name], 1.0, "{:?}", points[0]);
}
