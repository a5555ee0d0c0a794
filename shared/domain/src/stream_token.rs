//! Job-scoped, short-lived tokens for the live progress stream.
//!
//! Browsers' `EventSource` cannot send an `Authorization` header, so `GET /jobs/{id}` (which
//! is authenticated) hands out a URL carrying a token that names one job and expires soon:
//!
//! ```text
//! <expiry epoch seconds>.<base64url owner>.<base64url HMAC-SHA256>
//! ```
//!
//! The MAC covers the job id, the owner and the expiry (each length-prefixed, after a
//! version tag), under the server's key. The job id is not in the token — the verifier
//! takes it from the request's path — so a token opens one job's stream only. Everything the
//! MAC needs is in the token or the path, so [`verify`] runs **before any database read**: a
//! malformed, tampered, expired or wrongly signed token costs no DynamoDB call. The owner it
//! returns is then checked against the job record (defence in depth: a token is only issued
//! to the job's owner).
//!
//! The owner is carried in clear (base64url, not encrypted): it is the holder's own
//! principal, the link is only handed to them, and the token is a bearer credential anyway.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{JobId, Owner};

/// Tokens longer than this are refused unread (bounds the work a hostile request causes;
/// real tokens are well under 200 bytes).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Domain separation: a MAC made for anything else with the same key never verifies here,
/// and a change of layout changes the tag.
const TAG: &[u8] = b"longhaul/stream-token/v2";

/// What a verified token grants: the stream of the job it was checked against, to `owner`,
/// until `expires`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The principal the token was issued to; must still own the job.
    pub owner: Owner,
    /// Epoch seconds after which the token is refused.
    pub expires: i64,
}

/// Why a token was refused. None of these carries any part of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the token's shape (missing, empty, too long, bad base64, non-canonical expiry…).
    #[error("the token is malformed")]
    Malformed,
    /// Well-formed but its MAC does not match: tampered, for another job, or not ours.
    #[error("the token's signature does not match")]
    BadSignature,
    /// Authentic but past its expiry.
    #[error("the token has expired")]
    Expired,
}

/// The MAC of a stream token (the tests forge tokens with it).
#[cfg(test)]
fn mac(secret: &[u8], job_id: &JobId, owner: &str, expires: i64) -> Hmac<Sha256> {
    tagged_mac(TAG, secret, job_id, owner, expires)
}

/// The MAC of an owner's job-scoped token made for the use `tag` names. `owner` is the
/// token's text, not yet an [`Owner`]: [`verify`] checks the MAC before it trusts anything
/// the token says.
fn tagged_mac(
    tag: &[u8],
    secret: &[u8],
    job_id: &JobId,
    owner: &str,
    expires: i64,
) -> Hmac<Sha256> {
    // Length-prefixed: owners such as `auth0|123` contain any separator one might pick.
    crate::link_mac::mac(secret, tag, &[job_id.as_bytes(), owner.as_bytes()], expires)
}

/// A token for `owner`'s job `job_id`, valid until `expires` (epoch seconds).
pub fn issue(secret: &[u8], job_id: &JobId, owner: &Owner, expires: i64) -> String {
    issue_tagged(TAG, secret, job_id, owner, expires)
}

/// [`issue`], for the use `tag` names: the layout every owner's job-scoped link token has
/// (this one's and [`crate::result_link`]'s), told apart by the tag.
pub(crate) fn issue_tagged(
    tag: &[u8],
    secret: &[u8],
    job_id: &JobId,
    owner: &Owner,
    expires: i64,
) -> String {
    let signature = tagged_mac(tag, secret, job_id, owner, expires).finalize().into_bytes();
    format!(
        "{expires}.{}.{}",
        URL_SAFE_NO_PAD.encode(owner.as_bytes()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// Checks that `token` was issued by the holder of `secret` for job `job_id` and is still
/// valid at `now`, without reading anything: returns whom it was issued to, for the caller to
/// check against the job record.
///
/// The MAC is compared in constant time, and before the expiry, so only authentic tokens
/// are ever told apart as [`TokenError::Expired`]. Never panics, whatever `token` is.
pub fn verify(secret: &[u8], token: &str, job_id: &JobId, now: i64) -> Result<Grant, TokenError> {
    verify_tagged(TAG, secret, token, job_id, now)
}

/// [`verify`], of a token [`issue_tagged`] made with `tag`.
pub(crate) fn verify_tagged(
    tag: &[u8],
    secret: &[u8],
    token: &str,
    job_id: &JobId,
    now: i64,
) -> Result<Grant, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(expires), Some(owner), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    // Only the form `issue` writes: no sign, no leading zeros, so a token has one spelling.
    let expires = crate::link_mac::parse_expiry(expires).ok_or(TokenError::Malformed)?;
    let owner = URL_SAFE_NO_PAD
        .decode(owner)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or(TokenError::Malformed)?;
    let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| TokenError::Malformed)?;
    // `verify_slice` compares in constant time (it uses `subtle`); a wrong length fails.
    tagged_mac(tag, secret, job_id, &owner, expires)
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    // Authentic, so issued for an `Owner`: one that does not parse was never ours to issue.
    let owner = owner.parse().map_err(|_| TokenError::Malformed)?;
    if expires < now {
        return Err(TokenError::Expired);
    }
    Ok(Grant { owner, expires })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &[u8] = b"secret";
    const JOB_ID: &str = "01a201ea-fb15-7355-87ef-3777d21385c6";

    fn job() -> JobId {
        JOB_ID.parse().unwrap()
    }

    fn owner(name: &str) -> Owner {
        name.parse().unwrap()
    }

    fn grant(owner: &str, expires: i64) -> Result<Grant, TokenError> {
        Ok(Grant { owner: owner.parse().unwrap(), expires })
    }

    #[test]
    fn a_token_opens_its_job_until_it_expires_and_names_its_owner() {
        let token = issue(KEY, &job(), &owner("alice"), 1_000);
        assert_eq!(verify(KEY, &token, &job(), 999), grant("alice", 1_000));
        assert_eq!(
            verify(KEY, &token, &job(), 1_000),
            grant("alice", 1_000),
            "valid to the second"
        );
        assert_eq!(verify(KEY, &token, &job(), 1_001), Err(TokenError::Expired));
        // Owners with any characters, including the one separators would use.
        for name in ["auth0|123", "a.b.c", "ünïcødé", "client:svc/1"] {
            let token = issue(KEY, &job(), &owner(name), 5);
            assert_eq!(verify(KEY, &token, &job(), 0), grant(name, 5), "{name}");
        }
        // An authentic token for what is not an owner (no `issue` makes one) grants nothing.
        let signature = mac(KEY, &job(), "", 5).finalize().into_bytes();
        let empty_owner = format!("5..{}", URL_SAFE_NO_PAD.encode(signature));
        assert_eq!(verify(KEY, &empty_owner, &job(), 0), Err(TokenError::Malformed));
    }

    #[test]
    fn a_token_is_refused_for_another_job_or_under_another_key() {
        let token = issue(KEY, &job(), &owner("alice"), 1_000);
        let other_job: JobId = "01a201ea-fb15-7355-87ef-3777d21385c7".parse().unwrap();
        assert_eq!(verify(KEY, &token, &other_job, 0), Err(TokenError::BadSignature));
        assert_eq!(verify(b"other", &token, &job(), 0), Err(TokenError::BadSignature));
        assert_eq!(verify(b"", &token, &job(), 0), Err(TokenError::BadSignature));
    }

    #[test]
    fn tampering_with_any_part_is_refused() {
        let token = issue(KEY, &job(), &owner("alice"), 1_000);
        let parts: Vec<&str> = token.split('.').collect();
        let (expires, owner, signature) = (parts[0], parts[1], parts[2]);
        let bob = URL_SAFE_NO_PAD.encode("bob");
        let mac_bytes = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let cut = URL_SAFE_NO_PAD.encode(&mac_bytes[..31]);
        let mut flipped = mac_bytes;
        flipped[0] ^= 1;
        let flipped = URL_SAFE_NO_PAD.encode(flipped);
        for (tampered, why) in [
            (format!("9999.{owner}.{signature}"), "extended"),
            (format!("999.{owner}.{signature}"), "shortened"),
            (format!("{expires}.{bob}.{signature}"), "another owner"),
            (format!("{expires}.{owner}.{flipped}"), "a flipped MAC bit"),
            (format!("{expires}.{owner}.{cut}"), "a cut MAC"),
            (format!("{expires}.{owner}.{signature}AAAA"), "a longer MAC"),
            (format!("{expires}.{owner}."), "no MAC"),
        ] {
            assert_eq!(verify(KEY, &tampered, &job(), 0), Err(TokenError::BadSignature), "{why}");
        }
        // A forged token stays refused even when long expired: no expiry oracle for forgers.
        assert_eq!(
            verify(KEY, &format!("1.{owner}.{signature}"), &job(), 2_000),
            Err(TokenError::BadSignature)
        );
        // Other spellings of the same expiry are not the token.
        for spelling in ["+1000", "01000", " 1000", "1000 "] {
            let respelled = format!("{spelling}.{owner}.{signature}");
            assert_eq!(
                verify(KEY, &respelled, &job(), 0),
                Err(TokenError::Malformed),
                "{spelling}"
            );
        }
        // The previous format (no owner) is not accepted.
        assert_eq!(
            verify(KEY, &format!("{expires}.{signature}"), &job(), 0),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn garbage_of_every_shape_is_malformed() {
        let valid = issue(KEY, &job(), &owner("alice"), 1_000);
        let long = format!("{valid}{}", "A".repeat(MAX_TOKEN_LEN));
        for garbage in [
            "",
            ".",
            "..",
            "...",
            "garbage",
            "0.invalid",
            "1.AAAA",
            "-.-.-",
            "99999999999999999999.YQ.AAAA",
            "-9223372036854775809.YQ.AAAA",
            "1.YQ==.AAAA",
            "1.YQ.AAAA=",
            "1.Y.AAAA",
            "1.//8.AAAA",
            "1.YQ.+/+/",
            "1.%FF.AAAA",
            "١.YQ.AAAA",
            "1.YQ.AAAA.extra",
            "\0.\0.\0",
            long.as_str(),
        ] {
            assert_eq!(verify(KEY, garbage, &job(), 0), Err(TokenError::Malformed), "{garbage:?}");
        }
        // Of the token's shape, with empty parts: only the MAC can tell.
        for empty in ["1..AAAA", "1.YWxpY2U.", "0.."] {
            assert_eq!(verify(KEY, empty, &job(), 0), Err(TokenError::BadSignature), "{empty:?}");
        }
    }

    #[test]
    fn extreme_expiries_round_trip() {
        for expires in [i64::MIN, -1, 0, i64::MAX] {
            let token = issue(KEY, &job(), &owner("alice"), expires);
            assert_eq!(verify(KEY, &token, &job(), i64::MIN), grant("alice", expires));
        }
        assert_eq!(
            verify(KEY, &issue(KEY, &job(), &owner("alice"), i64::MIN), &job(), i64::MAX),
            Err(TokenError::Expired)
        );
    }

    proptest! {
        #[test]
        fn verify_never_panics_and_refuses_arbitrary_strings(token in ".{0,300}") {
            prop_assert!(verify(KEY, &token, &job(), 0).is_err());
        }

        #[test]
        fn verify_refuses_token_shaped_forgeries(
            expires in any::<i64>(),
            owner in any::<Vec<u8>>(),
            signature in proptest::collection::vec(any::<u8>(), 0..48),
        ) {
            let token = format!(
                "{expires}.{}.{}",
                URL_SAFE_NO_PAD.encode(owner),
                URL_SAFE_NO_PAD.encode(signature)
            );
            prop_assert!(verify(KEY, &token, &job(), 0).is_err());
        }

        #[test]
        fn issued_tokens_verify_and_any_one_byte_change_is_refused(
            owner in "\\PC{1,40}",
            job in any::<u128>(),
            expires in 0i64..i64::MAX,
            at in any::<proptest::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let job: JobId = uuid::Uuid::from_u128(job).hyphenated().to_string().parse().unwrap();
            let token = issue(KEY, &job, &owner.parse().unwrap(), expires);
            prop_assert_eq!(verify(KEY, &token, &job, 0), grant(&owner, expires));
            let mut changed = token.clone().into_bytes();
            let i = at.index(changed.len());
            prop_assume!(changed[i] != byte);
            changed[i] = byte;
            if let Ok(changed) = String::from_utf8(changed) {
                prop_assert!(verify(KEY, &changed, &job, 0).is_err(), "{}", changed);
            }
        }
    }
}
