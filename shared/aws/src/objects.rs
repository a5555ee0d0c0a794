//! S3: results and checkpoints.

use aws_sdk_s3::operation::get_object::GetObjectError;
use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;

use crate::AwsError;

/// The bucket holding results (`results/<job id>/…`) and checkpoints (`checkpoints/<job id>/…`).
#[derive(Debug, Clone)]
pub struct ObjectStore {
    client: aws_sdk_s3::Client,
    bucket: String,
}

/// Where a job's result object lives.
pub fn result_key(job_id: &str, file: &str) -> String {
    format!("results/{job_id}/{file}")
}

/// Where a job's checkpoint for `stage` lives.
pub fn checkpoint_key(job_id: &str, stage: &str) -> String {
    format!("checkpoints/{job_id}/{stage}.json")
}

impl ObjectStore {
    /// An adapter for `bucket`.
    pub fn new(client: aws_sdk_s3::Client, bucket: String) -> Self {
        ObjectStore { client, bucket }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Writes `body` at `key`.
    pub async fn put(&self, key: &str, body: Vec<u8>, content_type: &str) -> Result<(), AwsError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("put s3://{}/{key}", self.bucket), e))?;
        Ok(())
    }

    /// Reads the whole object at `key`, or `None` if there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, AwsError> {
        let context = || format!("get s3://{}/{key}", self.bucket);
        match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(output) => {
                let bytes = output.body.collect().await.map_err(|e| AwsError::new(context(), e))?;
                Ok(Some(bytes.into_bytes().to_vec()))
            }
            Err(err) if matches!(err.as_service_error(), Some(GetObjectError::NoSuchKey(_))) => Ok(None),
            Err(err) => Err(AwsError::new(context(), err)),
        }
    }

    /// A URL that GETs `key` until `expires_in` has passed (and no longer than the signing
    /// credentials live: mint one per request, never store it).
    pub async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError> {
        let config = PresigningConfig::expires_in(expires_in).map_err(|e| AwsError::new("presigning config", e))?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(config)
            .await
            .map_err(|e| AwsError::new(format!("presign GET {key}"), e))?;
        Ok(request.uri().to_owned())
    }

    /// A URL that PUTs `key` with `content_type` until `expires_in` has passed, and the
    /// headers the upload must send (they are part of the signature).
    pub async fn presign_put(
        &self,
        key: &str,
        content_type: &str,
        expires_in: Duration,
    ) -> Result<(String, BTreeMap<String, String>), AwsError> {
        let config = PresigningConfig::expires_in(expires_in).map_err(|e| AwsError::new("presigning config", e))?;
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .presigned(config)
            .await
            .map_err(|e| AwsError::new(format!("presign PUT {key}"), e))?;
        let headers = request.headers().map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned())).collect();
        Ok((request.uri().to_owned(), headers))
    }
}
