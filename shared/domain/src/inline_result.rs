//! A small result kept in the job's record instead of the bucket.
//!
//! Most jobs end with a result of a few hundred bytes (a count, a digest, a small JSON
//! document). Storing it as an object costs an S3 `PUT` per job — the dearest request of a
//! short job — and a `GET` per download. A result of at most [`MAX_INLINE_RESULT_BYTES`] is
//! written instead with the write that records the job's success, and served from the record by
//! the link `GET /jobs/{id}/result` redirects to ([`crate::result_link`]). Every later write of
//! the record is billed by its size, so the bound is small: one write unit's worth.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// The largest result kept in the job's record; a larger one is stored in the bucket.
pub const MAX_INLINE_RESULT_BYTES: usize = 1024;

/// The longest media type a result kept in the record may have (a result with a longer one is
/// stored in the bucket): the record's size stays bounded whatever a kind names.
pub const MAX_INLINE_CONTENT_TYPE_BYTES: usize = 255;

/// A result kept in the job's record: its media type and its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineResult {
    /// The media type the kind gave it.
    pub content_type: String,
    /// The bytes, as text when they are UTF-8 (most results: nothing added), else base64.
    pub body: InlineBody,
}

/// How a result's bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InlineBody {
    /// UTF-8 text, as it is.
    Text(String),
    /// Any other bytes, base64 (standard alphabet, padded).
    Base64(String),
}

/// An inline result whose base64 does not decode: the record was changed by hand, or is
/// corrupt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the inline result's base64 does not decode: {0}")]
pub struct CorruptInlineResult(String);

impl InlineResult {
    /// Whether a result of `len` bytes and media type `content_type` is kept in the record.
    pub fn fits(content_type: &str, len: usize) -> bool {
        len <= MAX_INLINE_RESULT_BYTES && content_type.len() <= MAX_INLINE_CONTENT_TYPE_BYTES
    }

    /// `body` of type `content_type`, if it is small enough to keep inline ([`Self::fits`]);
    /// `None` if it is not.
    pub fn of(content_type: &str, body: Vec<u8>) -> Option<Self> {
        if !Self::fits(content_type, body.len()) {
            return None;
        }
        let body = match String::from_utf8(body) {
            Ok(text) => InlineBody::Text(text),
            Err(err) => InlineBody::Base64(STANDARD.encode(err.into_bytes())),
        };
        Some(InlineResult { content_type: content_type.to_owned(), body })
    }

    /// The result's bytes.
    pub fn bytes(&self) -> Result<Vec<u8>, CorruptInlineResult> {
        match &self.body {
            InlineBody::Text(text) => Ok(text.as_bytes().to_vec()),
            InlineBody::Base64(encoded) => {
                STANDARD.decode(encoded).map_err(|e| CorruptInlineResult(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_is_kept_as_text_and_other_bytes_as_base64() {
        let json = InlineResult::of("application/json", br#"{"items":10}"#.to_vec()).unwrap();
        assert_eq!(json.body, InlineBody::Text(r#"{"items":10}"#.into()));
        assert_eq!(
            serde_json::to_value(&json).unwrap(),
            serde_json::json!({"content_type": "application/json", "body": {"text": "{\"items\":10}"}})
        );
        let binary = InlineResult::of("application/octet-stream", vec![0xff, 0, 1]).unwrap();
        assert_eq!(binary.body, InlineBody::Base64("/wAB".into()));
        assert_eq!(binary.bytes().unwrap(), [0xff, 0, 1]);
    }

    #[test]
    fn only_results_up_to_the_bound_are_kept_inline() {
        let at_bound = vec![b'a'; MAX_INLINE_RESULT_BYTES];
        assert!(InlineResult::of("text/plain", at_bound).is_some());
        let over = vec![b'a'; MAX_INLINE_RESULT_BYTES + 1];
        assert_eq!(InlineResult::of("text/plain", over), None);
        assert!(InlineResult::of("text/plain", Vec::new()).is_some(), "an empty result too");
        let long_type = "x".repeat(MAX_INLINE_CONTENT_TYPE_BYTES + 1);
        assert_eq!(InlineResult::of(&long_type, b"1".to_vec()), None, "a media type too long");
        assert!(InlineResult::fits(&long_type[1..], MAX_INLINE_RESULT_BYTES));
    }

    #[test]
    fn corrupt_base64_is_an_error() {
        let corrupt = InlineResult {
            content_type: "application/octet-stream".into(),
            body: InlineBody::Base64("not base64!".into()),
        };
        assert!(corrupt.bytes().is_err());
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip_through_the_record(
            body in proptest::collection::vec(any::<u8>(), 0..=MAX_INLINE_RESULT_BYTES),
        ) {
            let inline = InlineResult::of("application/octet-stream", body.clone()).unwrap();
            let stored: InlineResult =
                serde_json::from_value(serde_json::to_value(&inline).unwrap()).unwrap();
            prop_assert_eq!(stored.bytes().unwrap(), body);
        }
    }
}
