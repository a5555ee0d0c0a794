//! Owners: the authenticated principal a job, an upload, a secret or a stream belongs to.

use serde::Serialize;
use std::str::FromStr;

/// The principal that owns jobs: the JWT `sub` claim (or `client_id` for machine clients
/// without a subject) as API Gateway's authorizer hands it over, held as that text so it reads
/// as a `&str` without a copy.
///
/// Any characters an identity provider puts in a subject are kept (`auth0|123`,
/// `client:svc/1`, non-ASCII): the keys built from an owner length-prefix it, so no separator
/// needs to be excluded. What is refused is what no identity provider issues and what would
/// make the keys unbounded or unreadable: the empty string (no caller), more than
/// [`Owner::MAX_BYTES`] bytes (OpenID Connect bounds a `sub` to 255 ASCII characters), and
/// control characters. Only a valid owner parses (or deserialises).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Owner(String);

impl Owner {
    /// The longest owner, in bytes of UTF-8.
    pub const MAX_BYTES: usize = 256;

    /// The principal's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(Owner);

impl FromStr for Owner {
    type Err = InvalidOwner;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Owner::try_from(s.to_owned())
    }
}

impl TryFrom<String> for Owner {
    type Error = InvalidOwner;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        if s.is_empty() {
            Err(InvalidOwner::Empty)
        } else if s.len() > Owner::MAX_BYTES {
            Err(InvalidOwner::TooLong)
        } else if s.chars().any(char::is_control) {
            Err(InvalidOwner::ControlCharacter)
        } else {
            Ok(Owner(s))
        }
    }
}

/// A string that is not an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidOwner {
    /// No principal at all.
    #[error("not an owner: empty")]
    Empty,
    /// Longer than [`Owner::MAX_BYTES`].
    #[error("not an owner: longer than {} bytes", Owner::MAX_BYTES)]
    TooLong,
    /// A control character (a newline, a NUL…).
    #[error("not an owner: contains a control character")]
    ControlCharacter,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn principals_as_identity_providers_issue_them_parse() {
        for text in ["alice", "auth0|123", "a.b.c", "ünïcødé", "client:svc/1", "a b", "OWNER#x"]
        {
            let owner: Owner = text.parse().unwrap();
            assert_eq!(owner.as_str(), text);
            assert_eq!(&*owner, text);
            assert_eq!(owner.to_string(), text);
            assert_eq!(serde_json::to_value(&owner).unwrap(), serde_json::json!(text));
        }
        let longest = "é".repeat(Owner::MAX_BYTES / 2);
        assert_eq!(longest.parse::<Owner>().unwrap().len(), Owner::MAX_BYTES);
    }

    #[test]
    fn empty_overlong_and_control_characters_are_refused() {
        assert_eq!("".parse::<Owner>(), Err(InvalidOwner::Empty));
        assert_eq!("a".repeat(Owner::MAX_BYTES + 1).parse::<Owner>(), Err(InvalidOwner::TooLong));
        for text in ["a\nb", "\0", "tab\there", "\u{7f}", "\u{85}x"] {
            assert_eq!(text.parse::<Owner>(), Err(InvalidOwner::ControlCharacter), "{text:?}");
        }
        assert!(serde_json::from_value::<Owner>(serde_json::json!("")).is_err());
        assert!(serde_json::from_value::<Owner>(serde_json::json!("a\u{1}")).is_err());
        assert!(serde_json::from_value::<Owner>(serde_json::json!(7)).is_err());
    }

    proptest! {
        #[test]
        fn parsing_is_total_and_round_trips(text in "\\PC{0,40}|.{0,300}") {
            if let Ok(owner) = text.parse::<Owner>() {
                prop_assert_eq!(owner.as_str(), text.as_str());
                let json = serde_json::to_string(&owner).unwrap();
                prop_assert_eq!(serde_json::from_str::<Owner>(&json).unwrap(), owner);
            }
        }
    }
}
