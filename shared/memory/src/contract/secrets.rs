//! The signing key's contract ([`SigningKey`]), as the handlers rely on it: the status
//! function issues stream tokens with the key, the events function (another sandbox, another
//! reader of the same secret) checks them with it. So: the key is the secret's value, byte for
//! byte, every time it is read; what one reader signs, another reader of the same secret
//! verifies; what a reader of another secret signs is refused; and a secret that cannot be
//! read is an error — never an empty key — and is not remembered as one: the next read, once
//! the secret is there, returns it.

use chrono::Utc;
use longhaul_aws::ports::SigningKey;
use longhaul_domain::stream_token::{self, TokenError};
use longhaul_domain::{JobId, Owner};
use secrecy::ExposeSecret;

use super::fresh_owner;

/// Runs the whole contract: `key` and `same` read one secret, whose value is `secret`;
/// `other` reads another; `unreadable` reads a secret that cannot be read until
/// `make_readable` has run. Panics, naming the clause, on the first breach.
pub async fn signing_key(
    secret: &str,
    key: &impl SigningKey,
    same: &impl SigningKey,
    other: &impl SigningKey,
    unreadable: &impl SigningKey,
    make_readable: impl AsyncFnOnce(),
) {
    let read = key.get().await.expect("the key is read").expose_secret().to_owned();
    assert_eq!(read, secret, "the key is the secret's value, byte for byte");
    let again = key.get().await.expect("the key is read again").expose_secret().to_owned();
    assert_eq!(again, secret, "the same key at every read");

    let job = JobId::new();
    let owner: Owner = fresh_owner("signing").parse().expect("a contract owner parses");
    let now = Utc::now().timestamp();
    let token = stream_token::issue(read.as_bytes(), &job, &owner, now + 60);
    let same_key = same.get().await.expect("another reader of the secret reads it");
    let grant = stream_token::verify(same_key.expose_secret().as_bytes(), &token, &job, now)
        .expect("what one reader signs, another reader of the same secret verifies");
    assert_eq!((grant.owner, grant.expires), (owner.clone(), now + 60));

    let theirs = other.get().await.expect("the other key is read").expose_secret().to_owned();
    assert_ne!(theirs, secret, "another secret is another key");
    assert_eq!(
        stream_token::verify(theirs.as_bytes(), &token, &job, now),
        Err(TokenError::BadSignature),
        "another key refuses this key's token"
    );
    let foreign = stream_token::issue(theirs.as_bytes(), &job, &owner, now + 60);
    assert_eq!(
        stream_token::verify(read.as_bytes(), &foreign, &job, now),
        Err(TokenError::BadSignature),
        "this key refuses another key's token"
    );

    for attempt in ["first", "second"] {
        assert!(
            unreadable.get().await.is_err(),
            "an unreadable secret is an error ({attempt} read)"
        );
    }
    make_readable().await;
    let late = unreadable.get().await.expect("a failed read is not remembered: read once there");
    assert!(!late.expose_secret().is_empty(), "a key is never empty");
}
