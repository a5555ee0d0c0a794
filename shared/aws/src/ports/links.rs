//! Links to the bucket's objects as the API hands them out: a presigned GET of a result, a
//! presigned PUT a client uploads one file with.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::Warm;
use crate::AwsError;
use crate::objects::ObjectStore;

/// The bucket's uploads as the API hands them out: a link that writes one object, and the
/// headers the upload must send with it.
#[async_trait]
pub trait UploadLinks: Warm {
    /// A link that PUTs `key` with `content_type` until `expires_in` has passed, and the
    /// headers (lower-case names) the upload must send: they are signed, so the object is
    /// exactly `content_length` bytes of `content_type` ([`ObjectStore::presign_put`]). A
    /// lifetime over a week, or a length over `i64::MAX`, is refused.
    async fn presign_put(
        &self,
        key: &str,
        content_type: &str,
        content_length: u64,
        expires_in: Duration,
    ) -> Result<(String, BTreeMap<String, String>), AwsError>;
}

#[async_trait]
impl UploadLinks for ObjectStore {
    async fn presign_put(
        &self,
        key: &str,
        content_type: &str,
        content_length: u64,
        expires_in: Duration,
    ) -> Result<(String, BTreeMap<String, String>), AwsError> {
        ObjectStore::presign_put(self, key, content_type, content_length, expires_in).await
    }
}

/// The bucket's objects as the API hands them out: links, not bytes.
#[async_trait]
pub trait ObjectLinks: Warm {
    /// A link that reads `key` for `expires_in`.
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError>;
}

#[async_trait]
impl ObjectLinks for ObjectStore {
    async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError> {
        ObjectStore::presign_get(self, key, expires_in).await
    }
}
