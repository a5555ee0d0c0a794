//! Request fingerprints and derived idempotency keys.
//!
//! Both hash the RFC 8785 canonical form (JSON Canonicalization Scheme) of a JSON value:
//! object members sorted by their UTF-16 code units, numbers in ECMAScript's shortest form,
//! strings minimally escaped, no whitespace. So the same logical request always hashes the
//! same, whatever key order, whitespace or number spelling (`1.0`, `1e0`, `1`) the client
//! sent — and the hash does not hang on how serde_json happens to order or print a `Value`
//! (its `preserve_order` feature, switched on by any crate in the build, would otherwise
//! change every derived key).

use sha2::{Digest, Sha256};

/// The RFC 8785 canonical JSON text of `value`.
pub fn canonical_json(value: &serde_json::Value) -> String {
    // Fails only for non-finite floats, which a `serde_json::Value` cannot hold.
    serde_jcs::to_string(value).expect("a JSON value always canonicalises")
}

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn fingerprint(value: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value).as_bytes()))
}

/// The fingerprint of a `POST /jobs` request: everything in it that decides what the job is
/// and does — its type, params and (normalised) callback URL.
pub fn submission_fingerprint(
    job_type: &str,
    params: &serde_json::Value,
    callback_url: Option<&str>,
) -> String {
    fingerprint(&serde_json::json!({
        "type": job_type, "params": params, "callback_url": callback_url,
    }))
}

/// The idempotency key used when a client sends none: a hash of who asked and the whole
/// request (its [`submission_fingerprint`]), so a double-clicked submit does not start the
/// same work twice. Covering everything the fingerprint covers means a derived key can never
/// meet a different request (the 422 of a reused key): two submissions that differ only in
/// their callback URL are two jobs, each notifying its own URL. It contains a space, which a
/// client's `Idempotency-Key` cannot, so the two never collide.
pub fn derived_idempotency_key(owner: &crate::Owner, submission_fingerprint: &str) -> String {
    let canonical = serde_json::json!({ "owner": owner, "request": submission_fingerprint });
    format!("derived {}", fingerprint(&canonical))
}

/// Whether `key` is one [`derived_idempotency_key`] made (a client's key cannot contain a
/// space).
pub fn is_derived_key(key: &str) -> bool {
    key.starts_with("derived ")
}

/// The idempotency key of "retry job `job_id`": retrying the same job twice yields the same
/// new job, and a failed retry can itself be retried (a key whose job failed may be reused).
pub fn retry_idempotency_key(job_id: &crate::JobId) -> String {
    format!("retry {job_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = parse(r#"{"b": 1, "a": {"y": 2, "x": 3}}"#);
        let b = parse(r#"{"a":{"x":3,"y":2},"b":1}"#);
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn number_spelling_does_not_matter() {
        let plain = fingerprint(&parse(r#"{"items": 100, "ratio": 0.5}"#));
        for spelling in [
            r#"{"items": 100.0, "ratio": 0.5}"#,
            r#"{"items": 1e2, "ratio": 5e-1}"#,
            r#"{"items": 1.00E+2, "ratio": 0.50}"#,
        ] {
            assert_eq!(fingerprint(&parse(spelling)), plain, "{spelling}");
        }
        assert_ne!(fingerprint(&parse(r#"{"items": 101}"#)), plain);
    }

    /// The example of RFC 8785 section 3.2.2 (input) and 3.2.3 (its canonical form).
    #[test]
    fn rfc_8785_example() {
        let input = parse(
            r#"{
                "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals": [null, true, false]
            }"#,
        );
        assert_eq!(
            canonical_json(&input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    /// RFC 8785 section 3.2.3's sorting example: members sort by UTF-16 code units, which
    /// puts U+1F600 (a surrogate pair, 0xD83D…) before U+FB33 — UTF-8 byte order would not.
    #[test]
    fn rfc_8785_member_order() {
        let input = parse(
            r#"{
                "\u20ac": "Euro Sign",
                "\r": "Carriage Return",
                "\ufb33": "Hebrew Letter Dalet With Dagesh",
                "1": "One",
                "\ud83d\ude00": "Emoji: Grinning Face",
                "\u0080": "Control",
                "\u00f6": "Latin Small Letter O With Diaeresis"
            }"#,
        );
        assert_eq!(
            canonical_json(&input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
             \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    /// A submission's fingerprint pinned, so no dependency change can move it unnoticed.
    #[test]
    fn submission_fingerprint_is_the_hash_of_its_canonical_form() {
        assert_eq!(
            submission_fingerprint("some_kind", &json!({"items": 3, "item_ms": 1.0}), None),
            hex::encode(Sha256::digest(
                br#"{"callback_url":null,"params":{"item_ms":1,"items":3},"type":"some_kind"}"#
            ))
        );
    }

    #[test]
    fn derived_keys_separate_owners_and_requests() {
        let request = submission_fingerprint("some_kind", &json!({"items": 3}), None);
        let alice_: crate::Owner = "alice".parse().unwrap();
        let alice = derived_idempotency_key(&alice_, &request);
        assert_eq!(alice, derived_idempotency_key(&alice_, &request));
        assert_ne!(alice, derived_idempotency_key(&"bob".parse().unwrap(), &request));
        let more = submission_fingerprint("some_kind", &json!({"items": 4}), None);
        assert_ne!(alice, derived_idempotency_key(&alice_, &more));
        let called_back =
            submission_fingerprint("some_kind", &json!({"items": 3}), Some("https://a.example/"));
        assert_ne!(alice, derived_idempotency_key(&alice_, &called_back));
        assert!(alice.starts_with("derived ") && alice.contains(' '));
    }
}
