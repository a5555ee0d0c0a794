//! The job kinds longhaul ships. Adding a kind: a crate under `jobs/`, its dependency in this
//! crate's `Cargo.toml`, and one `.kind(…)` line below.

use longhaul_worker::Registry;

/// Every shipped kind (a deployment enables some of them with `ENABLED_JOB_TYPES`).
pub fn registry() -> Registry {
    Registry::builder()
        .kind(longhaul_job_demo::Demo)
        .kind(longhaul_job_csv_report::CsvReport)
        .kind(longhaul_job_archive::Archive)
        .build()
        .expect("the shipped job kinds have distinct names and valid stages")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_kinds_register() {
        assert_eq!(super::registry().names(), ["demo", "csv_report", "archive"]);
    }
}
