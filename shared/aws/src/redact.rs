//! What `Debug` output shows instead of a value that must not reach a log (params, callback
//! URLs, idempotency keys, lease tokens, secrets). A leaf: the records and the logging both use
//! it.

/// A placeholder for a redacted value in `Debug` output.
pub struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
