//! Signals: what a waiting job waits for, and the signed one-time link a partner sends one by.
//!
//! A job's stage may wait for a named signal (`wait_for` in the worker API): the job is parked
//! `paused` until the signal arrives — from its owner (`POST /jobs/{id}/signals/{name}`) or
//! from whoever holds the link its view offers for the wait — or its wait times out. A job
//! receives each name once: the first signal of a name is kept (if no wait has started yet,
//! until one does), a second is refused.
//!
//! The link's token is `<expiry>.<base64url HMAC-SHA256>`, the MAC over the job id and the
//! signal's name (both from the link's path, each length-prefixed after a version tag) and the
//! expiry, under the deployment's key. Everything [`verify`] needs is in the token and the
//! path, so it runs **before any read**, in constant time; a tampered, expired or other job's
//! or signal's token costs no database call. Domain separation keeps a stream token (the same
//! key, another tag) from ever verifying here.

use std::fmt;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::JobId;

/// The largest signal payload (its JSON text).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The longest a wait may last (a paused job's checkpoint is kept 30 days: see
/// [`crate::policy::MAX_PAUSED_LIMIT_SECONDS`]).
pub const MAX_WAIT_SECONDS: u64 = crate::policy::MAX_PAUSED_LIMIT_SECONDS;
/// The most signals a job keeps: a client could otherwise make a job keep records without
/// end, one per name it invents (each up to [`MAX_PAYLOAD_BYTES`]).
pub const MAX_SIGNALS_PER_JOB: u32 = 100;
/// Tokens longer than this are refused unread.
pub const MAX_TOKEN_LEN: usize = 256;
/// Domain separation from every other MAC made with the same key.
const TAG: &[u8] = b"longhaul/signal-token/v1";

/// A signal's name: 1 to 64 characters of ASCII letters, digits, `.`, `_` and `-` (it is a
/// path segment and a key part; `longhaul_worker::is_signal_name` says the same to kinds).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SignalName(String);

/// A name that is not a signal name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a signal name is 1 to 64 characters of ASCII letters, digits, '.', '_' and '-'; got {0:?}"
)]
pub struct InvalidSignalName(pub String);

impl SignalName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SignalName {
    type Err = InvalidSignalName;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let valid = (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(SignalName(name.to_owned()))
        } else {
            Err(InvalidSignalName(name.chars().take(80).collect()))
        }
    }
}

impl TryFrom<String> for SignalName {
    type Error = InvalidSignalName;
    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl From<SignalName> for String {
    fn from(name: SignalName) -> String {
        name.0
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a parked job waits for: a signal, until a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    /// The signal.
    pub signal: SignalName,
    /// When the wait times out.
    pub until: crate::Timestamp,
}

/// Why a signal link's token was refused. None carries any part of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the token's shape.
    #[error("the token is malformed")]
    Malformed,
    /// Its MAC does not match: tampered, for another job or signal, or not ours.
    #[error("the token's signature does not match")]
    BadSignature,
    /// Authentic but past its expiry.
    #[error("the token has expired")]
    Expired,
}

fn mac(secret: &[u8], job_id: &JobId, name: &SignalName, expires: i64) -> Hmac<Sha256> {
    crate::link_mac::mac(secret, TAG, &[job_id.as_bytes(), name.as_str().as_bytes()], expires)
}

/// A token for signal `name` of job `job_id`, valid until `expires` (epoch seconds).
pub fn issue(secret: &[u8], job_id: &JobId, name: &SignalName, expires: i64) -> String {
    let signature = mac(secret, job_id, name, expires).finalize().into_bytes();
    format!("{expires}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// Checks that `token` was issued by the holder of `secret` for signal `name` of job `job_id`
/// (both from the request's path) and is still valid at `now`, reading nothing. The MAC is
/// compared in constant time, and before the expiry. Never panics, whatever `token` is.
pub fn verify(
    secret: &[u8],
    token: &str,
    job_id: &JobId,
    name: &SignalName,
    now: i64,
) -> Result<(), TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    let Some((expires, signature)) = token.split_once('.') else {
        return Err(TokenError::Malformed);
    };
    let expires = crate::link_mac::parse_expiry(expires).ok_or(TokenError::Malformed)?;
    let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| TokenError::Malformed)?;
    mac(secret, job_id, name, expires)
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    if expires < now {
        return Err(TokenError::Expired);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &[u8] = b"secret";

    fn job() -> JobId {
        "01a201ea-fb15-7355-87ef-3777d21385c6".parse().unwrap()
    }

    fn name(text: &str) -> SignalName {
        text.parse().unwrap()
    }

    #[test]
    fn names_are_short_and_plain() {
        for good in ["approval", "a", "file.arrived", "step_2-ok", &"x".repeat(64)] {
            assert_eq!(good.parse::<SignalName>().unwrap().as_str(), good);
        }
        for bad in ["", "with space", "slash/y", "é", &"x".repeat(65), "a?b"] {
            assert!(bad.parse::<SignalName>().is_err(), "{bad:?}");
        }
        assert!(serde_json::from_value::<SignalName>("no/slash".into()).is_err());
    }

    #[test]
    fn a_token_opens_its_job_and_signal_until_it_expires() {
        let token = issue(KEY, &job(), &name("approval"), 1_000);
        assert_eq!(verify(KEY, &token, &job(), &name("approval"), 999), Ok(()));
        assert_eq!(verify(KEY, &token, &job(), &name("approval"), 1_000), Ok(()));
        assert_eq!(verify(KEY, &token, &job(), &name("approval"), 1_001), Err(TokenError::Expired));
        assert_eq!(
            verify(KEY, &token, &job(), &name("other"), 999),
            Err(TokenError::BadSignature),
            "another signal's"
        );
        let other: JobId = "01a201ea-fb15-7355-87ef-3777d21385c7".parse().unwrap();
        assert_eq!(
            verify(KEY, &token, &other, &name("approval"), 999),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            verify(b"other key", &token, &job(), &name("approval"), 999),
            Err(TokenError::BadSignature)
        );
        // A stream token made with the same key never verifies here.
        let owner: crate::Owner = "alice".parse().unwrap();
        let stream = crate::stream_token::issue(KEY, &job(), &owner, 1_000);
        assert!(verify(KEY, &stream, &job(), &name("approval"), 999).is_err());
    }

    #[test]
    fn malformed_tokens_are_refused_unread() {
        let token = issue(KEY, &job(), &name("approval"), 1_000);
        let (_, signature) = token.split_once('.').unwrap();
        for bad in [
            String::new(),
            "1000".into(),
            format!("01000.{signature}"),
            format!("+1000.{signature}"),
            "1000.!!".into(),
            "x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert_eq!(
                verify(KEY, &bad, &job(), &name("approval"), 0),
                Err(TokenError::Malformed),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn verify_never_panics_and_refuses_arbitrary_strings(token in ".{0,300}") {
            prop_assert!(verify(KEY, &token, &job(), &name("approval"), 0).is_err());
        }
    }
}
