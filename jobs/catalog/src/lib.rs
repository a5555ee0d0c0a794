//! The job kinds longhaul ships. Adding a kind: a crate under `jobs/` (the workspace takes
//! `jobs/*`), its dependency line in this crate's `Cargo.toml`, and one `.kind(…)` line below.
//! A deployment's default (`EnabledJobTypes` `*`) enables it; nothing else changes.

use longhaul_worker::Registry;

/// Every shipped kind. A deployment enables some of them with `ENABLED_JOB_TYPES`; its default,
/// `*`, is every kind registered with `.kind(…)` (an `.opt_in_kind(…)` only when named).
pub fn registry() -> Registry {
    Registry::builder()
        // Diagnostic: anyone could hold workers with it, so a deployment runs it only when its
        // `EnabledJobTypes` names it (the local stack does).
        .opt_in_kind(longhaul_job_demo::Demo)
        .kind(longhaul_job_csv_report::CsvReport)
        .kind(longhaul_job_archive::Archive)
        .build()
        .expect("the shipped job kinds have distinct names and valid stages")
}

/// What every registered kind must satisfy, whichever kinds there are: adding a kind changes
/// none of these tests.
#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use longhaul_worker::EVERY_KIND;

    #[test]
    fn the_built_in_kinds_are_registered_and_demo_is_opt_in() {
        let registry = super::registry();
        let names = registry.names();
        for shipped in ["demo", "csv_report", "archive"] {
            assert!(names.contains(&shipped), "{shipped} is not registered: {names:?}");
        }
        // `*` (the template's default) enables every kind but `demo`.
        let defaults = registry.default_names();
        assert!(!defaults.contains(&"demo"), "{defaults:?}");
        assert_eq!(defaults.len(), names.len() - 1, "only demo is opt-in: {defaults:?}");
        assert_eq!(registry.enabled_names(Some(EVERY_KIND)).unwrap(), defaults);
    }

    #[test]
    fn names_are_unique_lowercase_snake_case() {
        let names = super::registry().names();
        assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len(), "{names:?}");
        for name in names {
            let mut chars = name.chars();
            assert!(chars.next().is_some_and(|c| c.is_ascii_lowercase()), "{name:?}");
            assert!(
                name.len() <= 64
                    && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && !name.ends_with('_')
                    && !name.contains("__"),
                "{name:?} is not lowercase snake_case"
            );
        }
    }

    #[test]
    fn every_policy_is_one_the_framework_can_run() {
        let template = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"),
        )
        .expect("the repository's template.yaml");
        for kind in super::registry().kinds() {
            let (name, policy) = (kind.name(), kind.policy());
            assert!(policy.max_attempts >= 1, "{name}: {policy:?}");
            // Published and stored in whole seconds: none may round to zero.
            let second = Duration::from_secs(1);
            for (what, d) in [
                ("max_runtime", policy.max_runtime),
                ("result_retention", policy.result_retention),
                ("retry_delay", policy.retry_delay),
                ("checkpoint.interval", policy.checkpoint.interval),
                ("stage_timeout", policy.stage_timeout),
            ] {
                assert!(d >= second, "{name}: {what} {d:?}");
            }
            // A stage's timeout counts across the invocations that continue it (each within
            // Lambda's 15 minutes); the job's runtime bounds every stage of it anyway.
            assert!(policy.stage_timeout <= policy.max_runtime, "{name}: {policy:?}");
            assert!(policy.checkpoint.items >= 1, "{name}: {policy:?}");
            assert_ne!(policy.concurrency_limit, Some(0), "{name}: no job could ever run");
            // The worker is a function of the template (its logical id, as a resource).
            let declared = format!("\n  {}:\n    Type: AWS::Serverless::Function\n", policy.worker);
            assert!(template.contains(&declared), "{name}: no function {:?}", policy.worker);
        }
    }

    #[test]
    fn every_kind_has_stages_and_an_object_params_schema() {
        for kind in super::registry().kinds() {
            let name = kind.name();
            assert!(!kind.stages().is_empty(), "{name}");
            let schema = kind.params_schema();
            assert_eq!(schema["type"], "object", "{name}: params are a JSON object: {schema}");
        }
    }
}
