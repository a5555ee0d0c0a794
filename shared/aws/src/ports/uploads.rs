//! Whether an upload exists: submit refuses a job whose params name an upload that is not
//! there, as it refuses one that is not the caller's.

use async_trait::async_trait;

use super::Warm;
use crate::AwsError;
use crate::objects::ObjectStore;

/// The uploads in the bucket, as submit checks them.
#[async_trait]
pub trait UploadPresence: Warm {
    /// Whether an object is stored at `key` (one HEAD request; a missing key is `false`,
    /// never an error).
    async fn exists(&self, key: &str) -> Result<bool, AwsError>;
}

#[async_trait]
impl UploadPresence for ObjectStore {
    async fn exists(&self, key: &str) -> Result<bool, AwsError> {
        Ok(ObjectStore::size(self, key).await?.is_some())
    }
}
