//! The function's configuration: its variables, read and checked at start-up.

use longhaul_aws::config::{ConfigError, Vars};
use longhaul_domain::callback::CallbackPolicy;
use longhaul_domain::policy::PolicyOverrides;
use longhaul_worker::Registry;

/// The function's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TABLE_NAME`: the job table.
    pub table: String,
    /// `INTAKE_QUEUE_URL`: where new jobs are enqueued.
    pub intake_queue_url: String,
    /// `BUCKET_NAME`: where the uploads a job's params name are.
    pub bucket: String,
    /// `IDEMPOTENCY_TTL_SECONDS` (default 86,400): how long a key maps to its job.
    pub idempotency_ttl_seconds: u64,
    /// `ENABLED_JOB_TYPES` (comma-separated; default every registered kind): the job kinds
    /// this deployment accepts, so an operator can switch off a diagnostic kind.
    pub enabled_job_types: Vec<String>,
    /// `LONGHAUL_ALLOW_INSECURE_CALLBACKS=1`: accept `http` and loopback callback URLs. For
    /// the local stack only; the template never sets it.
    pub allow_insecure_callbacks: bool,
    /// `LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE` (default 600; 0 = unlimited): submissions one
    /// principal may make per minute (`POST /jobs` and `POST /jobs/{id}/retry`; idempotent
    /// replays do not count). Beyond it: `429` with `Retry-After`, nothing written.
    pub submissions_per_minute: u32,
    /// `LONGHAUL_TENANT_MAX_PENDING` (default 10,000; 0 = no cap): jobs one principal may have
    /// that have not yet run (pending or queued). Beyond it: `429` with `Retry-After`,
    /// nothing written.
    pub max_pending: usize,
    /// `LONGHAUL_TENANT_MAX_RUNNING` (50; 0 = no limit), as the dispatcher has it: with tenant
    /// pools, a tenant's submissions are counted on its pool's item
    /// (`longhaul_aws::pool_rate`), whether or not this function starts jobs.
    pub tenant_max_running: u32,
    /// `LONGHAUL_POLICY_OVERRIDES` (JSON `{"<type>": {"max_attempts": 5, …}}`, default none):
    /// the deployment's changes to kinds' policies, applied to the policy stored on each job.
    pub policy_overrides: PolicyOverrides,
    /// The jobs this function starts itself, in the request that writes them
    /// ([`crate::Deps::start`]), configured as the dispatcher is (`STATE_MACHINE_ARN`,
    /// `LONGHAUL_WORKERS`, `LONGHAUL_TENANT_MAX_RUNNING`): only where `LONGHAUL_WORKERS` is
    /// set, as the submit function's template sets it. Without it (the schedules function,
    /// which submits through this crate) every job goes through the intake queue.
    pub start: Option<dispatcher::Config>,
}

impl Config {
    /// Reads the configuration.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(Config {
            table: vars.required("TABLE_NAME")?,
            intake_queue_url: vars.required("INTAKE_QUEUE_URL")?,
            bucket: vars.required("BUCKET_NAME")?,
            idempotency_ttl_seconds: vars.parsed_or("IDEMPOTENCY_TTL_SECONDS", 86_400)?,
            enabled_job_types: parse_enabled_job_types(vars, &longhaul_jobs::registry())?,
            allow_insecure_callbacks: vars.parsed_or("LONGHAUL_ALLOW_INSECURE_CALLBACKS", 0u8)?
                == 1,
            submissions_per_minute: vars.parsed_or(
                "LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE",
                DEFAULT_SUBMISSIONS_PER_MINUTE,
            )?,
            max_pending: vars.parsed_or("LONGHAUL_TENANT_MAX_PENDING", DEFAULT_MAX_PENDING)?,
            tenant_max_running: vars.parsed_or("LONGHAUL_TENANT_MAX_RUNNING", 50)?,
            policy_overrides: parse_policy_overrides(vars, &longhaul_jobs::registry())?,
            start: match vars.required("LONGHAUL_WORKERS") {
                Ok(_) => Some(dispatcher::Config::from_vars(vars)?),
                Err(_) => None,
            },
        })
    }

    /// The job kinds this deployment accepts: the registry, filtered by `ENABLED_JOB_TYPES`.
    pub fn registry(&self) -> Registry {
        longhaul_jobs::registry().enabled(&self.enabled_job_types)
    }

    /// The rules a callback URL is checked by.
    pub fn callbacks(&self) -> CallbackPolicy {
        CallbackPolicy { allow_insecure: self.allow_insecure_callbacks }
    }
}

/// `LONGHAUL_POLICY_OVERRIDES`, checked against the registered kinds (a typo fails the start).
fn parse_policy_overrides(
    vars: &Vars,
    registry: &Registry,
) -> Result<PolicyOverrides, ConfigError> {
    let text = vars.required("LONGHAUL_POLICY_OVERRIDES").unwrap_or_default();
    PolicyOverrides::parse(&text, &registry.names()).map_err(|e| ConfigError::Invalid {
        name: "LONGHAUL_POLICY_OVERRIDES".into(),
        value: text.clone(),
        reason: e.to_string(),
    })
}

/// `ENABLED_JOB_TYPES`: comma-separated names of registered kinds; unset, every kind.
fn parse_enabled_job_types(vars: &Vars, registry: &Registry) -> Result<Vec<String>, ConfigError> {
    let list = vars.required("ENABLED_JOB_TYPES").ok();
    registry.enabled_names(list.as_deref()).map_err(|e| ConfigError::Invalid {
        name: "ENABLED_JOB_TYPES".into(),
        value: list.unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// Default of `LONGHAUL_TENANT_MAX_PENDING`.
pub const DEFAULT_MAX_PENDING: usize = 10_000;

/// Default of `LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE`.
pub const DEFAULT_SUBMISSIONS_PER_MINUTE: u32 = 600;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(extra: &[(&str, &str)]) -> Vars {
        let mut map = HashMap::from([
            ("TABLE_NAME".to_string(), "t".to_string()),
            ("INTAKE_QUEUE_URL".to_string(), "q".to_string()),
            ("BUCKET_NAME".to_string(), "b".to_string()),
        ]);
        map.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Vars::from_map(map)
    }

    #[test]
    fn enabled_job_types() {
        let first = longhaul_jobs::registry().names()[0];
        assert_eq!(
            Config::from_vars(&vars(&[])).unwrap().enabled_job_types,
            longhaul_jobs::registry().names()
        );
        assert_eq!(
            Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", &format!(" {first} "))]))
                .unwrap()
                .enabled_job_types,
            vec![first.to_owned()]
        );
        let unknown = format!("{first},nope");
        assert!(Config::from_vars(&vars(&[("ENABLED_JOB_TYPES", &unknown)])).is_err());
    }

    #[test]
    fn bad_policy_overrides_stop_the_start() {
        let err = Config::from_vars(&vars(&[("LONGHAUL_POLICY_OVERRIDES", r#"{"nope": {}}"#)]));
        assert!(err.is_err());
        assert!(Config::from_vars(&vars(&[("LONGHAUL_POLICY_OVERRIDES", "")])).is_ok());
    }

    #[test]
    fn jobs_are_started_at_once_only_where_the_worker_functions_are_configured() {
        assert!(Config::from_vars(&vars(&[])).unwrap().start.is_none(), "enqueued");
        let workers = r#"{"StageFunction": "arn:aws:lambda:us-east-1:1:function:s"}"#;
        let starting = [("LONGHAUL_WORKERS", workers), ("STATE_MACHINE_ARN", "arn:sm")];
        let start = Config::from_vars(&vars(&starting)).unwrap().start.expect("started at once");
        assert_eq!((start.state_machine_arn.as_str(), start.tenant_max_running), ("arn:sm", 50));
        // Configured wrongly, the function does not start at all (never a silent fallback).
        assert!(Config::from_vars(&vars(&[("LONGHAUL_WORKERS", "{")])).is_err());
        assert!(Config::from_vars(&vars(&[("LONGHAUL_WORKERS", workers)])).is_err(), "no ARN");
    }
}
