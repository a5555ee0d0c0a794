//! Per-kind worker functions on the local stack: every task of a job runs in the worker
//! function its kind's policy names — `csv_report` in its own `CsvReportWorkerFunction`, `demo`
//! in the shared `StageFunction` — through every execution of the job (continue-as-new passes
//! the worker on), and a kind naming a worker the template does not declare runs in the
//! shared stage function instead of waiting forever. The stage's deadline is ~1 s per
//! invocation and every run continues in a new execution, so a job that works for longer
//! spans several invocations: its direct run's, then those of the executions that take it
//! over. How long a job works is set by its params (the demo kind's sleeps), never by how
//! fast this machine scans a CSV.

use longhaul_domain::JobId;
use std::collections::BTreeSet;
use std::time::Duration;

use longhaul_job_demo::{Demo, DemoParams};
use longhaul_tests::csvgen::{Gen, csv_bytes};
use longhaul_tests::{Api, Aws, harness, harness_with_registry, principal};
use longhaul_worker::{JobKind, KindError, Policy, Registry, StageContext, StageOutcome};
use serde::Deserialize;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(180);

/// A kind whose policy names a worker function the template does not declare.
#[derive(Debug, Clone, Copy)]
struct Orphan;

/// The params of `orphan`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct OrphanParams {}

impl JobKind for Orphan {
    const NAME: &'static str = "orphan";
    type Params = OrphanParams;

    fn stages(&self) -> &'static [&'static str] {
        &["only"]
    }

    fn validate(&self, _: &OrphanParams) -> Result<(), String> {
        Ok(())
    }

    fn inputs(&self, _: &OrphanParams) -> Vec<String> {
        Vec::new()
    }

    fn policy(&self) -> Policy {
        Policy { worker: "NoSuchWorkerFunction", ..Policy::default() }
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        _: &OrphanParams,
    ) -> Result<StageOutcome, KindError> {
        ctx.progress(1, Some(1)).await?;
        let result = ctx.write_result("done.txt", "text/plain", b"done".to_vec()).await?;
        Ok(StageOutcome::Finished(result))
    }
}

/// The demo kind under another name, run by `csv_report`'s worker function: a job whose
/// length its params set (items × item_ms), in a worker function of its own.
#[derive(Debug, Clone, Copy)]
struct DemoInCsvWorker;

impl JobKind for DemoInCsvWorker {
    const NAME: &'static str = "demo_in_csv_worker";
    type Params = DemoParams;

    fn stages(&self) -> &'static [&'static str] {
        Demo.stages()
    }

    fn validate(&self, params: &DemoParams) -> Result<(), String> {
        Demo.validate(params)
    }

    fn policy(&self) -> Policy {
        Policy { worker: "CsvReportWorkerFunction", ..Demo.policy() }
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &DemoParams,
    ) -> Result<StageOutcome, KindError> {
        Demo.run_stage(ctx, params).await
    }
}

fn api(label: &str) -> Api {
    harness_with_registry(
        Registry::builder()
            .kinds_of(&longhaul_jobs::registry())
            .kind(Orphan)
            .kind(DemoInCsvWorker)
            .build()
            .expect("the test kinds' names are their own"),
        &[
            ("ENABLED_JOB_TYPES", "demo,csv_report,orphan,demo_in_csv_worker"),
            ("LONGHAUL_STAGE_MARGIN_SECONDS", "899"),
            ("LONGHAUL_RUNS_PER_EXECUTION", "1"),
            // A checkpoint (where a stage looks at its deadline) every 2 items (MiB of CSV).
            ("LONGHAUL_CHECKPOINT_ITEMS", "2"),
        ],
    );
    Api::new(&principal(label))
}

/// The functions that ran the job's invocations, and how many invocations there were.
fn functions_of(job_id: &JobId) -> (BTreeSet<String>, usize) {
    let stack = &harness().stack;
    let runs: Vec<_> = stack
        .invocations
        .snapshot()
        .into_iter()
        .filter(|i| i.job_id.as_deref() == Some(job_id.as_str()))
        .collect();
    (runs.iter().map(|i| i.function.clone()).collect(), runs.len())
}

/// The job's executions (the first and those it continued in).
async fn executions_of(job_id: &JobId) -> usize {
    Aws::new().await.executions_named(job_id.as_str()).await.len()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn each_kind_runs_in_the_worker_function_its_policy_names() {
    let api = api("workers");
    let input = api.upload("small.csv", "text/csv", csv_bytes(&Gen::new(3).rows(10_000))).await;
    let csv = api
        .submit(&json!({"type": "csv_report", "params": {
            "input": input, "group_by": ["region"], "metrics": [{"op": "count"}]}}))
        .await;
    // Each works ~6 s against a ~1 s stage deadline: several invocations, whatever the machine.
    let long = json!({"items": 30, "item_ms": 200});
    let demo = api.submit(&json!({"type": "demo", "params": long})).await;
    let elsewhere = api.submit(&json!({"type": "demo_in_csv_worker", "params": long})).await;
    for job_id in [&csv, &demo, &elsewhere] {
        let job = api.wait_terminal(job_id, TIMEOUT).await;
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    let report: Value = serde_json::from_slice(&api.result(&csv).await).unwrap();
    assert_eq!(report["rows_scanned"], 10_000);
    assert_eq!(functions_of(&csv).0, set(&["CsvReportWorkerFunction"]), "{csv}");

    for (job_id, worker) in [(&demo, "StageFunction"), (&elsewhere, "CsvReportWorkerFunction")] {
        let (functions, invocations) = functions_of(job_id);
        assert_eq!(functions, set(&[worker]), "{job_id}");
        // More than one invocation: the direct run hands the job over to an execution, which
        // continues it in new ones, and every one of them keeps the job's worker.
        let executions = executions_of(job_id).await;
        assert!(
            invocations >= 2 && executions >= 1,
            "{worker}: {executions} executions, {invocations} invocations"
        );
    }
}

#[tokio::test]
async fn a_kind_naming_an_undeployed_worker_runs_in_the_shared_stage_function() {
    let api = api("orphan");
    let job_id = api.submit(&json!({"type": "orphan", "params": {}})).await;
    let job = api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let store = longhaul_aws::jobs::JobStore::new(
        Aws::new().await.dynamodb.clone(),
        harness().stack.resource("JobsTable"),
    );
    let record = store.job(&job_id).await.unwrap().expect("the job record");
    assert_eq!(record.policy.expect("a stored policy").worker, "NoSuchWorkerFunction");
    assert_eq!(functions_of(&job_id).0, set(&["StageFunction"]));
}

/// The template wires every shipped kind's worker: the dispatcher and the reaper (the
/// functions that start executions) map it to its function's ARN, and the state machine may
/// invoke exactly the worker functions — none of the others.
#[test]
fn every_shipped_kinds_worker_is_deployed_and_only_workers_are_invocable() {
    use longhaul_local::iam::Policies;
    use longhaul_local::template::{Template, function_arn};
    let template = Template::load(
        &longhaul_tests::root().join("template.yaml"),
        "longhaul",
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        &Default::default(),
    )
    .unwrap();
    let workers_of = |function: &str| -> Value {
        let env = template.function_environment(function).unwrap();
        serde_json::from_str(&env["LONGHAUL_WORKERS"]).unwrap()
    };
    let workers = workers_of("DispatcherFunction");
    assert_eq!(workers, workers_of("ReaperFunction"), "the maps must agree");
    assert_eq!(workers, workers_of("SubmitFunction"), "the maps must agree");
    let workers = workers.as_object().unwrap();
    let arn = |logical: &str| function_arn(&template.physical_name(logical).unwrap());
    for kind in longhaul_jobs::registry().kinds() {
        let worker = kind.policy().worker;
        assert_eq!(workers[worker], arn(worker), "{}'s worker {worker}", kind.name());
    }
    assert_eq!(
        longhaul_jobs::registry().get("csv_report").unwrap().policy().worker,
        "CsvReportWorkerFunction"
    );
    let policies = Policies::from_template(&template).unwrap();
    for (logical, _) in template.of_type("AWS::Serverless::Function") {
        let invocable = policies.check_invoke(&arn(logical)).is_ok();
        assert_eq!(invocable, workers.contains_key(logical.as_str()), "{logical}");
    }
    for (logical, value) in workers {
        assert_eq!(value, &arn(logical), "{logical}");
    }
}
