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

/// How long results are kept, per job type: `LONGHAUL_RESULT_TTL_SECONDS` (default 604,800
/// = 7 days), overridden for one type by `LONGHAUL_RESULT_TTL_SECONDS_<TYPE>`.
#[derive(Debug, Clone)]
pub struct ResultTtl {
    default: std::time::Duration,
    per_type: Vec<(longhaul_domain::JobType, std::time::Duration)>,
}

impl ResultTtl {
    /// Reads the retention settings.
    pub fn from_vars(vars: &Vars) -> Result<Self, ConfigError> {
        let mut per_type = Vec::new();
        for job_type in longhaul_domain::JobType::ALL {
            let name = format!("LONGHAUL_RESULT_TTL_SECONDS_{}", job_type.as_str().to_uppercase());
            if let Some(secs) = vars.parsed::<u64>(&name)? {
                per_type.push((job_type, std::time::Duration::from_secs(secs)));
            }
        }
        Ok(ResultTtl {
            default: std::time::Duration::from_secs(
                vars.parsed_or("LONGHAUL_RESULT_TTL_SECONDS", 604_800)?,
            ),
            per_type,
        })
    }

    /// The retention of results of a job type without its own setting.
    pub fn default_ttl(&self) -> std::time::Duration {
        self.default
    }

    /// The retention of results of `job_type`.
    pub fn of(&self, job_type: longhaul_domain::JobType) -> std::time::Duration {
        self.per_type.iter().find(|(t, _)| *t == job_type).map(|(_, d)| *d).unwrap_or(self.default)
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
