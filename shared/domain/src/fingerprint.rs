//! Request fingerprints and derived idempotency keys.
//!
//! serde_json (without `preserve_order`) keeps object keys sorted, so serialising a `Value`
//! is a canonical form: the same logical request always hashes the same, whatever key order
//! or whitespace the client sent.

use sha2::{Digest, Sha256};

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn fingerprint(value: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(value.to_string().as_bytes()))
}

/// The idempotency key used when a client sends none: a hash of who asked and what for, so a
/// double-clicked submit does not start the same work twice. It contains a space, which a
/// client's `Idempotency-Key` cannot, so the two never collide.
pub fn derived_idempotency_key(owner: &str, job_type: &str, params: &serde_json::Value) -> String {
    let canonical = serde_json::json!({ "owner": owner, "type": job_type, "params": params });
    format!("derived {}", fingerprint(&canonical))
}

/// The idempotency key of "retry job `job_id`": retrying the same job twice yields the same
/// new job, and a failed retry can itself be retried (a key whose job failed may be reused).
pub fn retry_idempotency_key(job_id: &str) -> String {
    format!("retry {job_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b": 1, "a": {"y": 2, "x": 3}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":{"x":3,"y":2},"b":1}"#).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn derived_keys_separate_owners_and_params() {
        let params = json!({"items": 3});
        let alice = derived_idempotency_key("alice", "demo", &params);
        assert_eq!(alice, derived_idempotency_key("alice", "demo", &params));
        assert_ne!(alice, derived_idempotency_key("bob", "demo", &params));
        assert_ne!(alice, derived_idempotency_key("alice", "demo", &json!({"items": 4})));
    }
}
