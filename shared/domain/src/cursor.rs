//! The opaque cursor of `GET /jobs`: where the next page of one caller's listing starts.
//!
//! A cursor is base64url (no padding) of a small JSON object naming the last job of the page
//! by its place in the owner index — its `created_at` and job id — plus a tag of the owner it
//! was issued to. Decoding is strict: anything that is not exactly such an object, for this
//! caller, with a well-formed time and a canonical job id, is an [`InvalidCursor`] (a 400, not
//! something handed to the database to fail on as a 500).
//!
//! What keeps a cursor from reaching another tenant's jobs is not the tag but the adapter: the
//! owner index partition a listing reads is always the caller's own, never taken from the
//! cursor. The tag only makes a cursor issued to someone else read as what it is, a cursor
//! that is not yours, instead of silently paging your own jobs from some odd position.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{JobId, Owner};

/// Longest cursor accepted, checked before anything is decoded (ours are about 160 bytes).
pub const MAX_CURSOR_LEN: usize = 512;
/// Longest `created_at` a cursor may carry (ours are 24 bytes: RFC 3339 UTC, milliseconds).
const MAX_TIME_LEN: usize = 40;

/// A position in one owner's listing: the job the previous page ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPosition {
    /// The job's `created_at` (RFC 3339), the first half of its owner-index sort key.
    pub created_at: String,
    /// The job.
    pub job_id: JobId,
}

impl ListPosition {
    /// The owner-index sort key of the position (`<created_at>#<job id>`).
    pub fn index_sort_key(&self) -> String {
        format!("{}#{}", self.created_at, self.job_id)
    }

    /// The position named by an owner-index sort key, if it is one we write.
    pub fn from_index_sort_key(key: &str) -> Option<Self> {
        let (created_at, job_id) = key.rsplit_once('#')?;
        let position =
            ListPosition { created_at: created_at.to_owned(), job_id: job_id.parse().ok()? };
        position.is_well_formed().then_some(position)
    }

    fn is_well_formed(&self) -> bool {
        self.created_at.len() <= MAX_TIME_LEN
            && chrono::DateTime::parse_from_rfc3339(&self.created_at).is_ok()
    }
}

/// A cursor that this API did not issue to this caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cursor")]
pub struct InvalidCursor;

/// What a cursor encodes. Short field names: the cursor travels in a URL.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    /// Format version, so a later format can tell old cursors apart.
    v: u8,
    /// [`owner_tag`] of the caller it was issued to.
    o: String,
    /// `created_at` of the position.
    t: String,
    /// Job id of the position.
    j: String,
}

const VERSION: u8 = 1;

/// A short, non-secret tag of the owner: a cursor carries it instead of the principal, which
/// it does not need to reveal. Not an authenticator (anyone who knows a principal can compute
/// it), so it is compared plainly; see the module docs for what actually isolates tenants.
fn owner_tag(owner: &Owner) -> String {
    let digest =
        Sha256::new_with_prefix(b"longhaul list cursor\0").chain_update(owner.as_str()).finalize();
    hex::encode(&digest[..8])
}

/// The cursor of `position` in `owner`'s listing.
pub fn encode(owner: &Owner, position: &ListPosition) -> String {
    let wire = Wire {
        v: VERSION,
        o: owner_tag(owner),
        t: position.created_at.clone(),
        j: position.job_id.to_string(),
    };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&wire).expect("a cursor always serialises"))
}

/// The position `cursor` names in `owner`'s listing, if it is a cursor this API issued to
/// `owner`. Pure and total: any input at all gives a position or [`InvalidCursor`].
pub fn decode(owner: &Owner, cursor: &str) -> Result<ListPosition, InvalidCursor> {
    if cursor.is_empty() || cursor.len() > MAX_CURSOR_LEN {
        return Err(InvalidCursor);
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| InvalidCursor)?;
    let wire: Wire = serde_json::from_slice(&bytes).map_err(|_| InvalidCursor)?;
    if wire.v != VERSION || wire.o != owner_tag(owner) {
        return Err(InvalidCursor);
    }
    let position =
        ListPosition { created_at: wire.t, job_id: wire.j.parse().map_err(|_| InvalidCursor)? };
    position.is_well_formed().then_some(position).ok_or(InvalidCursor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn position() -> ListPosition {
        ListPosition {
            created_at: "2026-01-02T03:04:05.678Z".into(),
            job_id: "01a201ea-fb15-7355-87ef-3777d21385c6".parse().unwrap(),
        }
    }

    fn owner(name: &str) -> Owner {
        name.parse().unwrap()
    }

    fn wire(value: serde_json::Value) -> String {
        URL_SAFE_NO_PAD.encode(value.to_string())
    }

    #[test]
    fn a_cursor_round_trips_for_its_owner_only() {
        let cursor = encode(&owner("alice"), &position());
        assert_eq!(decode(&owner("alice"), &cursor), Ok(position()));
        assert_eq!(decode(&owner("bob"), &cursor), Err(InvalidCursor));
        assert!(!cursor.contains("alice"));
        assert!(cursor.len() < MAX_CURSOR_LEN);
    }

    #[test]
    fn index_sort_keys_round_trip() {
        let key = position().index_sort_key();
        assert_eq!(key, "2026-01-02T03:04:05.678Z#01a201ea-fb15-7355-87ef-3777d21385c6");
        assert_eq!(ListPosition::from_index_sort_key(&key), Some(position()));
        for bad in ["", "#", "2026-01-02T03:04:05.678Z#", "x#01a201ea-fb15-7355-87ef-3777d21385c6"]
        {
            assert_eq!(ListPosition::from_index_sort_key(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn crafted_cursors_are_refused() {
        let tag = owner_tag(&owner("alice"));
        let id = "01a201ea-fb15-7355-87ef-3777d21385c6";
        let at = "2026-01-02T03:04:05.678Z";
        let long = "x".repeat(3000);
        for cursor in [
            String::new(),
            "%%%".into(),
            "A".into(),
            "e30=".into(),
            "A".repeat(MAX_CURSOR_LEN + 4),
            URL_SAFE_NO_PAD.encode("hello"),
            URL_SAFE_NO_PAD.encode(b"\xff\xfe"),
            wire(json!(null)),
            wire(json!({})),
            wire(json!([format!("JOB#{id}"), "JOB", format!("{at}#{id}")])),
            wire(json!({"v": 1, "o": tag, "t": at})),
            wire(json!({"v": 2, "o": tag, "t": at, "j": id})),
            wire(json!({"v": "1", "o": tag, "t": at, "j": id})),
            wire(json!({"v": 1, "o": tag, "t": at, "j": 7})),
            wire(json!({"v": 1, "o": tag, "t": at, "j": id, "gsi1pk": "OWNER#bob"})),
            wire(json!({"v": 1, "o": owner_tag(&owner("bob")), "t": at, "j": id})),
            wire(json!({"v": 1, "o": tag, "t": "", "j": id})),
            wire(json!({"v": 1, "o": tag, "t": "yesterday", "j": id})),
            wire(json!({"v": 1, "o": tag, "t": long, "j": id})),
            wire(json!({"v": 1, "o": tag, "t": at, "j": ""})),
            wire(json!({"v": 1, "o": tag, "t": at, "j": id.to_uppercase()})),
            wire(json!({"v": 1, "o": tag, "t": at, "j": format!("{id}#x")})),
            wire(json!({"v": 1, "o": tag, "t": format!("{at}#{id}"), "j": id})),
        ] {
            assert_eq!(decode(&owner("alice"), &cursor), Err(InvalidCursor), "{cursor}");
        }
        // The well-formed one of these shapes is accepted.
        assert!(
            decode(&owner("alice"), &wire(json!({"v": 1, "o": tag, "t": at, "j": id}))).is_ok()
        );
    }

    proptest! {
        /// Whatever a client sends, decoding answers (no panic), and only a position it could
        /// have been given comes back.
        #[test]
        fn decoding_any_string_is_total(owner in "\\PC{1,40}", cursor in ".{0,600}") {
            let owner: Owner = owner.parse().unwrap();
            if let Ok(position) = decode(&owner, &cursor) {
                prop_assert!(position.is_well_formed());
                prop_assert_eq!(decode(&owner, &encode(&owner, &position)), Ok(position));
            }
        }

        /// The same for any bytes that are valid base64url, which get past the first check.
        #[test]
        fn decoding_any_base64_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let cursor = URL_SAFE_NO_PAD.encode(&bytes);
            if let Ok(position) = decode(&owner("alice"), &cursor) {
                prop_assert!(position.is_well_formed());
            }
        }

        /// And for any JSON object of the right field names but arbitrary values.
        #[test]
        fn decoding_any_fields_is_total(
            v in any::<u8>(),
            o in ".{0,20}",
            t in ".{0,50}",
            j in ".{0,40}",
        ) {
            let cursor = wire(json!({"v": v, "o": o, "t": t, "j": j}));
            if let Ok(position) = decode(&owner("alice"), &cursor) {
                prop_assert!(position.is_well_formed());
                prop_assert_eq!(o, owner_tag(&owner("alice")));
            }
        }

        /// Every position we write round-trips through a cursor.
        #[test]
        fn positions_round_trip(owner in "\\PC{1,40}", millis in 0i64..4_102_444_800_000) {
            let owner: Owner = owner.parse().unwrap();
            let at = chrono::DateTime::from_timestamp_millis(millis).unwrap();
            let position = ListPosition {
                created_at: crate::format_rfc3339(at),
                job_id: JobId::new(),
            };
            prop_assert_eq!(decode(&owner, &encode(&owner, &position)), Ok(position.clone()));
            prop_assert_eq!(
                ListPosition::from_index_sort_key(&position.index_sort_key()),
                Some(position)
            );
        }
    }
}
