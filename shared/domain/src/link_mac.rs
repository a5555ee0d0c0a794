//! The MAC both signed links use ([`crate::stream_token`], [`crate::signals`]): HMAC-SHA256
//! under the deployment's key over a version tag (domain separation: a link made for one use
//! never verifies for another), length-prefixed fields (no two field lists collide, whatever
//! separators they contain) and the expiry; and the one spelling an expiry may have.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The MAC of `fields` and `expires` under `secret`, tagged `tag`.
pub(crate) fn mac(secret: &[u8], tag: &[u8], fields: &[&[u8]], expires: i64) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(tag);
    for field in fields {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field);
    }
    mac.update(&expires.to_be_bytes());
    mac
}

/// An expiry as links write it (epoch seconds, no sign, no leading zeros: one spelling per
/// value); `None` for anything else.
pub(crate) fn parse_expiry(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().filter(|e| e.to_string() == text)
}
