//! S3: results and checkpoints.

use aws_sdk_s3::operation::get_object::GetObjectError;
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
}
