//! Typed function configuration from environment variables.
//!
//! Deployed functions read their process environment; the local stack hosts every function in
//! one process and hands each the variables its template resource declares, so configuration
//! is read from a [`Vars`] rather than from `std::env` directly.

use std::collections::HashMap;

/// A set of configuration variables.
#[derive(Debug, Clone, Default)]
pub struct Vars(HashMap<String, String>);

/// A missing or malformed configuration variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("environment variable {0} is not set")]
    Missing(String),
    /// A variable is set but does not parse.
    #[error("environment variable {name} has an invalid value {value:?}: {reason}")]
    Invalid {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Vars {
    /// The process environment.
    pub fn from_env() -> Self {
        Vars(std::env::vars().collect())
    }

    /// An explicit set of variables.
    pub fn from_map(map: HashMap<String, String>) -> Self {
        Vars(map)
    }

    /// A required variable.
    pub fn required(&self, name: &str) -> Result<String, ConfigError> {
        self.0
            .get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| ConfigError::Missing(name.to_owned()))
    }

    /// An optional variable parsed as `T`.
    pub fn parsed<T>(&self, name: &str) -> Result<Option<T>, ConfigError>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        match self.0.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(value) => value.parse().map(Some).map_err(|e: T::Err| ConfigError::Invalid {
                name: name.to_owned(),
                value: value.clone(),
                reason: e.to_string(),
            }),
        }
    }

    /// An optional variable parsed as `T`, or `default` when unset.
    pub fn parsed_or<T>(&self, name: &str, default: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        Ok(self.parsed(name)?.unwrap_or(default))
    }
}

/// How long results are kept: each kind's policy says, unless the deployment sets
/// `LONGHAUL_RESULT_TTL_SECONDS` (other than 0), which then holds for every kind.
#[derive(Debug, Clone, Default)]
pub struct ResultTtl {
    deployment: Option<std::time::Duration>,
}

impl ResultTtl {
    /// The longest a result is kept when neither the deployment nor a kind says (7 days).
    pub const DEFAULT: std::time::Duration = std::time::Duration::from_secs(604_800);

    /// Reads the retention settings.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        Ok(ResultTtl {
            deployment: vars
                .parsed::<u64>("LONGHAUL_RESULT_TTL_SECONDS")?
                .filter(|&secs| secs > 0)
                .map(std::time::Duration::from_secs),
        })
    }

    /// The retention of a result when its kind is not known.
    pub fn default_ttl(&self) -> std::time::Duration {
        self.deployment.unwrap_or(Self::DEFAULT)
    }

    /// The retention of results of a kind whose policy keeps them `kind`.
    pub fn of(&self, kind: std::time::Duration) -> std::time::Duration {
        self.deployment.unwrap_or(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_and_parsed() {
        let vars = Vars::from_map(HashMap::from([
            ("A".to_string(), "x".to_string()),
            ("N".to_string(), "12".to_string()),
            ("BAD".to_string(), "twelve".to_string()),
        ]));
        assert_eq!(vars.required("A").unwrap(), "x");
        assert!(matches!(vars.required("B"), Err(ConfigError::Missing(_))));
        assert_eq!(vars.parsed_or("N", 3u32).unwrap(), 12);
        assert_eq!(vars.parsed_or("M", 3u32).unwrap(), 3);
        assert!(matches!(vars.parsed_or("BAD", 3u32), Err(ConfigError::Invalid { .. })));
    }
}

#[cfg(test)]
mod result_ttl_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_deployment_overrides_the_kinds_retention() {
        let none = ResultTtl::from_vars(&Vars::from_map(HashMap::new())).unwrap();
        assert_eq!(none.of(Duration::from_secs(60)), Duration::from_secs(60));
        assert_eq!(none.default_ttl(), ResultTtl::DEFAULT);
        let set = ResultTtl::from_vars(&Vars::from_map(HashMap::from([(
            "LONGHAUL_RESULT_TTL_SECONDS".to_string(),
            "5".to_string(),
        )])))
        .unwrap();
        assert_eq!(set.of(Duration::from_secs(60)), Duration::from_secs(5));
        let zero = ResultTtl::from_vars(&Vars::from_map(HashMap::from([(
            "LONGHAUL_RESULT_TTL_SECONDS".to_string(),
            "0".to_string(),
        )])))
        .unwrap();
        assert_eq!(zero.of(Duration::from_secs(60)), Duration::from_secs(60));
    }
}

/// `LONGHAUL_WEBHOOK_SCHEDULE_SECONDS`: the delays between a webhook delivery's attempts
/// (comma-separated seconds; unset: [`longhaul_domain::webhooks::RetrySchedule::default`]).
/// Read by the deliverer, which follows it, and by the webhooks API, which judges by it when a
/// pending delivery was lost.
pub fn webhook_schedule(
    vars: &Vars,
) -> Result<longhaul_domain::webhooks::RetrySchedule, ConfigError> {
    use longhaul_domain::webhooks::RetrySchedule;
    match vars.parsed::<String>("LONGHAUL_WEBHOOK_SCHEDULE_SECONDS")? {
        None => Ok(RetrySchedule::default()),
        Some(text) => RetrySchedule::parse(&text).ok_or_else(|| ConfigError::Invalid {
            name: "LONGHAUL_WEBHOOK_SCHEDULE_SECONDS".into(),
            value: text.clone(),
            reason: "expected comma-separated seconds".into(),
        }),
    }
}
