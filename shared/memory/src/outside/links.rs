//! Upload links of the bucket in memory: like [`MemoryObjects`]' read links, a URL on the
//! reserved `.invalid` domain naming the key, its lifetime and the signed headers.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use longhaul_aws::AwsError;
use longhaul_aws::ports::UploadLinks;

use super::{MemoryObjects, Refusal, refused};

/// The longest lifetime of a presigned link (SigV4's).
const MAX_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

#[async_trait]
impl UploadLinks for MemoryObjects {
    async fn presign_put(
        &self,
        key: &str,
        content_type: &str,
        content_length: u64,
        expires_in: Duration,
    ) -> Result<(String, BTreeMap<String, String>), AwsError> {
        self.outage.check("presign an upload link")?;
        if i64::try_from(content_length).is_err() {
            return Err(refused("content length", Refusal::Invalid, "out of range for i64"));
        }
        if expires_in > MAX_LIFETIME {
            return Err(refused(
                "presigning config",
                Refusal::Invalid,
                "presigned requests expire within a week",
            ));
        }
        let url = format!(
            "https://bucket.memory.invalid/{key}?X-Amz-Expires={}&X-Amz-SignedHeaders=content-length%3Bcontent-type%3Bhost",
            expires_in.as_secs()
        );
        let headers = BTreeMap::from([
            ("content-length".to_owned(), content_length.to_string()),
            ("content-type".to_owned(), content_type.to_owned()),
        ]);
        Ok((url, headers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_objects_keep_the_upload_links_contract() {
        crate::contract::upload_links(&MemoryObjects::new()).await;
    }

    #[tokio::test]
    async fn an_unavailable_bucket_presigns_nothing() {
        let objects = MemoryObjects::new();
        objects.set_unavailable(true);
        let link = objects.presign_put("k", "text/csv", 1, Duration::from_secs(1)).await;
        assert!(link.is_err());
    }
}
