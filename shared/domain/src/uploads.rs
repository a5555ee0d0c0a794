//! Uploads: where a principal's uploaded inputs live, and who may reference them.
//!
//! An upload's object key starts with a prefix derived from its owner, so "may this job read
//! that input?" is a pure check of the key against the caller — no lookup, and nothing in the
//! key reveals the principal's name.

use sha2::{Digest, Sha256};

use crate::Owner;

/// Longest accepted file name, in bytes.
pub const MAX_FILENAME_BYTES: usize = 255;

/// The key prefix of `owner`'s uploads.
pub fn owner_prefix(owner: &Owner) -> String {
    let digest = hex::encode(Sha256::digest(owner.as_bytes()));
    format!("uploads/{}/", &digest[..32])
}

/// The object key of a new upload: `uploads/<owner hash>/<upload id>/<file name>`.
pub fn upload_key(owner: &Owner, upload_id: &str, filename: &str) -> String {
    format!("{}{upload_id}/{filename}", owner_prefix(owner))
}

/// Whether `input` names one of `owner`'s uploads (and nothing else: no traversal, no prefix
/// of someone else's key).
pub fn owns_upload(owner: &Owner, input: &str) -> bool {
    let Some(rest) = input.strip_prefix(&owner_prefix(owner)) else { return false };
    let mut parts = rest.splitn(2, '/');
    let (Some(id), Some(name)) = (parts.next(), parts.next()) else { return false };
    !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && validate_filename(name).is_ok()
}

/// Why a file name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "filename must be 1 to {MAX_FILENAME_BYTES} bytes, not . or .., without slashes, backslashes or control characters"
)]
pub struct InvalidFilename;

/// Checks an upload's file name: it becomes the last segment of an object key.
pub fn validate_filename(name: &str) -> Result<(), InvalidFilename> {
    let ok = !name.is_empty()
        && name.len() <= MAX_FILENAME_BYTES
        && name != "."
        && name != ".."
        && !name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if ok { Ok(()) } else { Err(InvalidFilename) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn filenames() {
        assert!(validate_filename("report 2026.csv").is_ok());
        for bad in ["", ".", "..", "a/b", "a\\b", "a\nb", &"x".repeat(256)] {
            assert!(validate_filename(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ownership() {
        let (alice, bob): (Owner, Owner) = ("alice".parse().unwrap(), "bob".parse().unwrap());
        let key = upload_key(&alice, "0192-ab", "data.csv");
        assert!(owns_upload(&alice, &key));
        assert!(!owns_upload(&bob, &key));
        assert!(!owns_upload(&alice, &format!("{}../x/data.csv", owner_prefix(&alice))));
        assert!(!owns_upload(&alice, &owner_prefix(&alice)));
        assert!(!owns_upload(&alice, "results/x/result.json"));
    }

    proptest! {
        /// No principal can reference another principal's upload, whatever the names.
        #[test]
        fn uploads_belong_to_their_owner(a in "\\PC{1,20}", b in "\\PC{1,20}", name in "[a-z]{1,10}\\.csv") {
            prop_assume!(a != b);
            let (a, b): (Owner, Owner) = (a.parse().unwrap(), b.parse().unwrap());
            let key = upload_key(&a, "id-1", &name);
            prop_assert!(owns_upload(&a, &key));
            prop_assert!(!owns_upload(&b, &key));
        }
    }
}
