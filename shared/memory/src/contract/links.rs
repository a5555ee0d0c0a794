//! The upload links' contract ([`UploadLinks`]): a link names its key and lifetime, and the
//! headers it comes with sign the declared content type and length; a lifetime over a week,
//! or a length no request can carry, is refused.

use std::time::Duration;

use longhaul_aws::ports::UploadLinks;
use longhaul_domain::JobId;

use super::fresh_owner;

/// Runs the whole contract on `links`. Panics, naming the clause, on the first breach.
pub async fn upload_links(links: &impl UploadLinks) {
    let key = format!("uploads/{}/{}/data.csv", fresh_owner("links"), JobId::new());
    let lifetime = Duration::from_secs(900);
    let (url, headers) =
        links.presign_put(&key, "text/csv", 11, lifetime).await.expect("a link is presigned");
    assert!(url.contains(&format!("/{key}?")), "the link names its key: {url}");
    assert!(url.contains("X-Amz-Expires=900"), "the link names its lifetime: {url}");
    assert_eq!(headers.get("content-type").map(String::as_str), Some("text/csv"), "{headers:?}");
    assert_eq!(headers.get("content-length").map(String::as_str), Some("11"), "{headers:?}");
    assert!(
        headers.keys().all(|name| *name == name.to_ascii_lowercase()),
        "header names are lower-case: {headers:?}"
    );
    let week = Duration::from_secs(7 * 24 * 3600);
    assert!(links.presign_put(&key, "text/csv", 11, week).await.is_ok(), "a week is allowed");
    let longer = week + Duration::from_secs(1);
    assert!(links.presign_put(&key, "text/csv", 11, longer).await.is_err(), "over a week");
    assert!(
        links.presign_put(&key, "text/csv", u64::MAX, lifetime).await.is_err(),
        "a length no request carries is refused"
    );
}
