//! The signed link a small result is fetched by.
//!
//! A result of at most [`crate::inline_result::MAX_INLINE_RESULT_BYTES`] is kept in the job's
//! record, not in the bucket ([`crate::inline_result`]). `GET /jobs/{id}/result` still answers
//! `303 See Other` to a link that needs no bearer token, as it does for a stored result's
//! presigned URL: `/jobs/{id}/result/{token}`, the token naming the job's owner and expiring
//! soon. Its layout is the stream token's ([`crate::stream_token`]),
//!
//! ```text
//! <expiry epoch seconds>.<base64url owner>.<base64url HMAC-SHA256>
//! ```
//!
//! under its own tag, so a stream token never opens a result and a result link never opens a
//! stream. Every character is one a path segment may hold. [`verify`] needs only the token and
//! the path's job id, so it runs **before any read**, comparing the MAC in constant time.

use crate::{JobId, Owner};

pub use crate::stream_token::{Grant, MAX_TOKEN_LEN, TokenError};

/// Domain separation from every other MAC made with the same key.
const TAG: &[u8] = b"longhaul/result-link/v1";

/// A token for `owner`'s result of job `job_id`, valid until `expires` (epoch seconds).
pub fn issue(secret: &[u8], job_id: &JobId, owner: &Owner, expires: i64) -> String {
    crate::stream_token::issue_tagged(TAG, secret, job_id, owner, expires)
}

/// Checks that `token` was issued by the holder of `secret` for job `job_id`'s result and is
/// still valid at `now`, reading nothing: returns whom it was issued to, for the caller to
/// check against the job record. Never panics, whatever `token` is.
pub fn verify(secret: &[u8], token: &str, job_id: &JobId, now: i64) -> Result<Grant, TokenError> {
    crate::stream_token::verify_tagged(TAG, secret, token, job_id, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_token;

    const KEY: &[u8] = b"secret";

    fn job() -> JobId {
        "01a201ea-fb15-7355-87ef-3777d21385c6".parse().unwrap()
    }

    #[test]
    fn a_link_opens_its_jobs_result_until_it_expires() {
        let alice: Owner = "auth0|alice".parse().unwrap();
        let token = issue(KEY, &job(), &alice, 1_000);
        assert_eq!(verify(KEY, &token, &job(), 1_000), Ok(Grant { owner: alice, expires: 1_000 }));
        assert_eq!(verify(KEY, &token, &job(), 1_001), Err(TokenError::Expired));
        let other: JobId = "01a201ea-fb15-7355-87ef-3777d21385c7".parse().unwrap();
        assert_eq!(verify(KEY, &token, &other, 0), Err(TokenError::BadSignature));
        assert_eq!(verify(b"other", &token, &job(), 0), Err(TokenError::BadSignature));
        // A path segment as it is: nothing to escape.
        assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)), "{token}");
    }

    #[test]
    fn stream_tokens_and_result_links_never_stand_for_each_other() {
        let alice: Owner = "alice".parse().unwrap();
        let stream = stream_token::issue(KEY, &job(), &alice, 1_000);
        assert_eq!(verify(KEY, &stream, &job(), 0), Err(TokenError::BadSignature));
        let result = issue(KEY, &job(), &alice, 1_000);
        assert_eq!(stream_token::verify(KEY, &result, &job(), 0), Err(TokenError::BadSignature));
    }

    #[test]
    fn garbage_is_refused() {
        for garbage in ["", "...", "1.YQ.AAAA", "x", &"A".repeat(MAX_TOKEN_LEN + 1)] {
            assert!(verify(KEY, garbage, &job(), 0).is_err(), "{garbage:?}");
        }
    }
}
