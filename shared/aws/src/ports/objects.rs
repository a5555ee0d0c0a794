//! The bucket's objects as a job's stage reads and writes them: checkpoints, staged files and
//! results by key, an input read from an offset, and a large result uploaded in parts.

use async_trait::async_trait;

use super::Warm;
use crate::AwsError;
use crate::objects::{ObjectChunks, ObjectHead, ObjectStore, PutNewError, StoredPart};

/// Objects by key (and, as [`ObjectCleanup`], deleted by prefix). A missing object is absent
/// (`None`), never an error, except to a read of its body from an offset, which fails as S3's
/// `NoSuchKey` does ([`crate::Refusal::NotFound`]).
#[async_trait]
pub trait Objects: ObjectCleanup {
    /// Writes `body` at `key` (replacing any object there).
    async fn put(&self, key: &str, body: Vec<u8>, content_type: &str) -> Result<(), AwsError>;
    /// Writes `body` at `key` only if no object is there: [`PutNewError::Exists`] otherwise,
    /// and the object there is unchanged.
    async fn put_new(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<(), PutNewError>;
    /// The whole object at `key`, or `None`.
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, AwsError>;
    /// The size and ETag of the object at `key`, or `None`.
    async fn head(&self, key: &str) -> Result<Option<ObjectHead>, AwsError>;
    /// The size of the object at `key`, or `None`.
    async fn size(&self, key: &str) -> Result<Option<u64>, AwsError>;
    /// The object at `key` from byte `offset` to its end, as it arrives.
    async fn stream_from(&self, key: &str, offset: u64) -> Result<ObjectChunks, AwsError>;
    /// Copies `from` to `to`, setting the content type.
    async fn copy(&self, from: &str, to: &str, content_type: &str) -> Result<(), AwsError>;
}

/// Multipart uploads, as S3 makes them: parts named by the ETag they were stored with, every
/// part but the last at least 5 MiB, an upload gone once completed or aborted.
#[async_trait]
pub trait MultipartUploads: Warm {
    /// Starts an upload of `key`; its upload id.
    async fn create_multipart_upload(
        &self,
        key: &str,
        content_type: &str,
    ) -> Result<String, AwsError>;
    /// Stores part `number` (1 to 10,000) of upload `upload_id` of `key`; its ETag.
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Vec<u8>,
    ) -> Result<String, AwsError>;
    /// Completes the upload from `parts` (ascending): the object at `key`. Parts S3 refuses
    /// (unknown, out of order, too small) are [`crate::Refusal::Invalid`]; an upload already
    /// completed from exactly these parts (an answer lost) is done.
    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[StoredPart],
    ) -> Result<(), AwsError>;
    /// Aborts the upload (its parts are deleted); one already gone is not an error.
    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), AwsError>;
    /// Whether the upload is still open (neither completed nor aborted).
    async fn multipart_upload_open(&self, key: &str, upload_id: &str) -> Result<bool, AwsError>;
    /// Whether the object at `key` is the one completing an upload from `parts` makes (their
    /// total size and multipart ETag, [`crate::objects::multipart_etag`]).
    async fn completed_from(&self, key: &str, parts: &[StoredPart]) -> Result<bool, AwsError>;
}

#[async_trait]
impl Objects for ObjectStore {
    async fn put(&self, key: &str, body: Vec<u8>, content_type: &str) -> Result<(), AwsError> {
        ObjectStore::put(self, key, body, content_type).await
    }
    async fn put_new(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<(), PutNewError> {
        ObjectStore::put_new(self, key, body, content_type).await
    }
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, AwsError> {
        ObjectStore::get(self, key).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectHead>, AwsError> {
        ObjectStore::head(self, key).await
    }
    async fn size(&self, key: &str) -> Result<Option<u64>, AwsError> {
        ObjectStore::size(self, key).await
    }
    async fn stream_from(&self, key: &str, offset: u64) -> Result<ObjectChunks, AwsError> {
        ObjectStore::stream_from(self, key, offset).await
    }
    async fn copy(&self, from: &str, to: &str, content_type: &str) -> Result<(), AwsError> {
        ObjectStore::copy(self, from, to, content_type).await
    }
}

#[async_trait]
impl MultipartUploads for ObjectStore {
    async fn create_multipart_upload(
        &self,
        key: &str,
        content_type: &str,
    ) -> Result<String, AwsError> {
        ObjectStore::create_multipart_upload(self, key, content_type).await
    }
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Vec<u8>,
    ) -> Result<String, AwsError> {
        ObjectStore::upload_part(self, key, upload_id, number, body).await
    }
    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[StoredPart],
    ) -> Result<(), AwsError> {
        ObjectStore::complete_multipart_upload(self, key, upload_id, parts).await
    }
    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), AwsError> {
        ObjectStore::abort_multipart_upload(self, key, upload_id).await
    }
    async fn multipart_upload_open(&self, key: &str, upload_id: &str) -> Result<bool, AwsError> {
        ObjectStore::multipart_upload_open(self, key, upload_id).await
    }
    async fn completed_from(&self, key: &str, parts: &[StoredPart]) -> Result<bool, AwsError> {
        ObjectStore::completed_from(self, key, parts).await
    }
}

/// Deleting objects, by key (a job's checkpoints its stage knows) or by prefix (a job's
/// checkpoints no one kept track of, an expired job's result and inputs).
#[async_trait]
pub trait ObjectCleanup: Warm {
    /// Deletes the object at `key` (no listing); a missing object is not an error.
    async fn delete(&self, key: &str) -> Result<(), AwsError>;
    /// Deletes every object under `prefix`; how many there were.
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError>;
    /// The first key under `prefix`, if any.
    async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError>;
}

#[async_trait]
impl Warm for ObjectStore {
    async fn warm(&self) {
        ObjectStore::warm(self).await
    }
}

#[async_trait]
impl ObjectCleanup for ObjectStore {
    async fn delete(&self, key: &str) -> Result<(), AwsError> {
        ObjectStore::delete(self, key).await
    }
    async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError> {
        ObjectStore::delete_prefix(self, prefix).await
    }
    async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError> {
        ObjectStore::first_key(self, prefix).await
    }
}
