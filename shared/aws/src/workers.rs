//! The worker functions a job's execution runs in.
//!
//! A kind's policy names its worker by the function's *logical* name in the template
//! (`StageFunction`, the shared default, or a kind's own, e.g. `CsvReportWorkerFunction` with
//! its own memory, timeout and role); the job record keeps that name. The functions that
//! start executions (dispatcher, reaper) get the deployed ARNs from the template
//! (`LONGHAUL_WORKERS`, a JSON object of logical name → function ARN) and put the job's
//! worker ARN in the execution input, where every task state of the state machine invokes it
//! (`lambda:invoke` with `FunctionName.$`). The stage passes it on to the execution it
//! continues a long job in.
//!
//! A job naming a worker this deployment does not have (its kind's worker was removed from
//! the template after the job was accepted, or a kind names one the template never declared)
//! runs in the shared stage function, which hosts every kind, with an error in the log:
//! failing to start it would leave the job waiting for a function that will never exist.

use longhaul_domain::JobId;
use std::collections::BTreeMap;

use longhaul_domain::policy::{JobPolicy, SHARED_WORKER};
use serde_json::Value;

use crate::config::{ConfigError, Vars};

/// The variable holding the map of logical worker names to function ARNs.
pub const WORKERS_VAR: &str = "LONGHAUL_WORKERS";

/// The key of the worker's function ARN in an execution's input (the state machine's task
/// states read it as `$$.Execution.Input.worker_arn`).
pub const INPUT_KEY: &str = "worker_arn";

/// Why `LONGHAUL_WORKERS` was refused (at start-up).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkersError {
    /// Not a JSON object of strings.
    #[error("not a JSON object of worker name → function ARN: {0}")]
    Malformed(String),
    /// The shared stage function is missing: it is every kind's default and the fallback.
    #[error("the shared worker {SHARED_WORKER} is missing")]
    NoSharedWorker,
    /// A value is not a Lambda function ARN.
    #[error("{name}: {value:?} is not a Lambda function ARN")]
    NotAnArn {
        /// The worker's logical name.
        name: String,
        /// What was given.
        value: String,
    },
}

/// The deployed worker functions, by logical name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workers {
    arns: BTreeMap<String, String>,
}

impl Workers {
    /// Parses `text` (`{"StageFunction": "arn:aws:lambda:…:function:…", …}`).
    pub fn parse(text: &str) -> Result<Self, WorkersError> {
        let arns: BTreeMap<String, String> =
            serde_json::from_str(text).map_err(|e| WorkersError::Malformed(e.to_string()))?;
        for (name, arn) in &arns {
            let parts: Vec<&str> = arn.split(':').collect();
            if !matches!(parts.as_slice(), ["arn", _, "lambda", _, _, "function", f] if !f.is_empty())
            {
                return Err(WorkersError::NotAnArn { name: name.clone(), value: arn.clone() });
            }
        }
        if !arns.contains_key(SHARED_WORKER) {
            return Err(WorkersError::NoSharedWorker);
        }
        Ok(Workers { arns })
    }

    /// Reads [`WORKERS_VAR`] (required: without it no execution could name its worker).
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let text = vars.required(WORKERS_VAR)?;
        Workers::parse(&text).map_err(|e| ConfigError::Invalid {
            name: WORKERS_VAR.into(),
            value: text.clone(),
            reason: e.to_string(),
        })
    }

    /// Whether `worker` is deployed.
    pub fn knows(&self, worker: &str) -> bool {
        self.arns.contains_key(worker)
    }

    /// The function ARN of `worker`; the shared stage function's if it is not deployed.
    pub fn function_arn(&self, worker: &str) -> &str {
        self.arns
            .get(worker)
            .or_else(|| self.arns.get(SHARED_WORKER))
            .expect("parse checked the shared worker is there")
    }

    /// The input of an execution of job `job_id` whose policy is `policy`: the job and the
    /// ARN of the function its task states invoke.
    pub fn execution_input(&self, job_id: &JobId, policy: &JobPolicy) -> Value {
        crate::runs::execution_input(job_id, self.worker_of(policy))
    }

    /// The ARN of the function a job whose policy is `policy` runs in (the shared stage
    /// function, with an error in the log, if the deployment does not have the one it names).
    pub fn worker_of(&self, policy: &JobPolicy) -> &str {
        if !self.knows(&policy.worker) {
            tracing::error!(
                worker = policy.worker,
                "the job names a worker function this deployment does not have; it runs in the shared {SHARED_WORKER}"
            );
        }
        self.function_arn(&policy.worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const STAGE: &str = "arn:aws:lambda:us-east-1:123456789012:function:longhaul-StageFunction";
    const CSV: &str = "arn:aws:lambda:us-east-1:123456789012:function:longhaul-CsvReportWorker";

    fn workers() -> Workers {
        Workers::parse(&json!({"StageFunction": STAGE, "CsvReportWorkerFunction": CSV}).to_string())
            .unwrap()
    }

    fn policy(worker: &str) -> JobPolicy {
        JobPolicy { worker: worker.into(), ..JobPolicy::default() }
    }

    #[test]
    fn a_job_runs_in_the_worker_its_policy_names() {
        let w = workers();
        let (j1, j2) = (JobId::new(), JobId::new());
        assert_eq!(
            w.execution_input(&j1, &policy("CsvReportWorkerFunction")),
            json!({"job_id": j1, "worker_arn": CSV})
        );
        assert_eq!(
            w.execution_input(&j2, &JobPolicy::default()),
            json!({"job_id": j2, "worker_arn": STAGE})
        );
    }

    #[test]
    fn an_unknown_worker_falls_back_to_the_shared_stage_function() {
        let w = workers();
        assert!(!w.knows("PdfWorkerFunction"));
        assert_eq!(w.function_arn("PdfWorkerFunction"), STAGE);
        assert_eq!(
            w.execution_input(&JobId::new(), &policy("PdfWorkerFunction"))["worker_arn"],
            STAGE
        );
    }

    #[test]
    fn bad_maps_are_refused() {
        assert_eq!(
            Workers::parse(&json!({"CsvReportWorkerFunction": CSV}).to_string()),
            Err(WorkersError::NoSharedWorker)
        );
        assert!(matches!(
            Workers::parse(&json!({"StageFunction": "longhaul-StageFunction"}).to_string()),
            Err(WorkersError::NotAnArn { .. })
        ));
        assert!(matches!(Workers::parse("[]"), Err(WorkersError::Malformed(_))));
        assert!(matches!(Workers::parse(""), Err(WorkersError::Malformed(_))));
        let missing = Workers::from_vars(&Vars::default()).unwrap_err();
        assert!(matches!(missing, ConfigError::Missing(name) if name == WORKERS_VAR));
    }
}
