//! Job-scoped, short-lived tokens for the live progress stream.
//!
//! Browsers' `EventSource` cannot send an `Authorization` header, so `GET /jobs/{id}` (which
//! is authenticated) hands out a URL carrying a token that names one job and expires soon:
//! `<expiry epoch seconds>.<base64url HMAC-SHA256 of "job_id|owner|expiry">`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

fn mac(secret: &[u8], job_id: &str, owner: &str, expires: i64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(job_id.as_bytes());
    mac.update(b"|");
    mac.update(owner.as_bytes());
    mac.update(b"|");
    mac.update(expires.to_string().as_bytes());
    mac
}

/// A token for `owner`'s job `job_id`, valid until `expires` (epoch seconds).
pub fn issue(secret: &[u8], job_id: &str, owner: &str, expires: i64) -> String {
    let signature = mac(secret, job_id, owner, expires).finalize().into_bytes();
    format!("{expires}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// Whether `token` was issued for `owner`'s job `job_id` and is still valid at `now`.
pub fn verify(secret: &[u8], token: &str, job_id: &str, owner: &str, now: i64) -> bool {
    let Some((expires, signature)) = token.split_once('.') else { return false };
    let (Ok(expires), Ok(signature)) = (expires.parse::<i64>(), URL_SAFE_NO_PAD.decode(signature))
    else {
        return false;
    };
    expires >= now && mac(secret, job_id, owner, expires).verify_slice(&signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_one_job_one_owner_and_expire() {
        let token = issue(b"secret", "job-1", "alice", 1_000);
        assert!(verify(b"secret", &token, "job-1", "alice", 999));
        assert!(verify(b"secret", &token, "job-1", "alice", 1_000));
        assert!(!verify(b"secret", &token, "job-1", "alice", 1_001), "expired");
        assert!(!verify(b"secret", &token, "job-2", "alice", 999), "another job");
        assert!(!verify(b"secret", &token, "job-1", "bob", 999), "another owner");
        assert!(!verify(b"other", &token, "job-1", "alice", 999), "another key");
        assert!(
            !verify(b"secret", &token.replace("1000.", "9999."), "job-1", "alice", 999),
            "extended"
        );
        assert!(!verify(b"secret", "garbage", "job-1", "alice", 0));
    }
}
