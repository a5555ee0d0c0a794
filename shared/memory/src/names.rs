//! Owners and job ids as tests spell them, parsed as the edge parses them.

use longhaul_domain::{JobId, Owner};

/// The owner `name`, a test's principal (panics if it is not one: a test's own mistake).
pub fn owner(name: &str) -> Owner {
    name.parse().unwrap_or_else(|e| panic!("{name:?} in a test: {e}"))
}

/// The job id numbered `n`: the same id for every call, and ids sort as their numbers (for a
/// test that needs fixed ids, or their order; a fresh one is [`JobId::new`]).
pub fn nth_job(n: u32) -> JobId {
    format!("00000000-0000-7000-8000-{n:012x}").parse().expect("a canonical job id")
}

/// The job id spelled from `name` (at most 16 bytes): the same id for every call, and ids
/// sort as their names do (for a test that names its jobs, `"done"`, `"next"`, and relies on
/// their order).
pub fn job_named(name: &str) -> JobId {
    assert!(name.len() <= 16, "{name:?}: a job's name in a test is at most 16 bytes");
    let mut bytes = [0u8; 16];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let id =
        format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
    id.parse().expect("a canonical job id")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_are_fixed_and_sort_as_spelled() {
        assert_eq!(nth_job(7), nth_job(7));
        assert!(nth_job(9) < nth_job(10) && nth_job(10) < nth_job(0x100));
        assert_eq!(owner("auth0|1").as_str(), "auth0|1");
        assert_eq!(job_named("done"), job_named("done"));
        assert!(job_named("a") < job_named("ab") && job_named("ab") < job_named("b"));
    }
}
