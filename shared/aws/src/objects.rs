//! S3: results and checkpoints.

use crate::client::LazyClient;
use aws_sdk_s3::operation::get_object::GetObjectError;
use longhaul_domain::JobId;
use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;

use crate::AwsError;

/// The bucket holding results (`results/<job id>/…`) and checkpoints (`checkpoints/<job id>/…`).
#[derive(Debug, Clone)]
pub struct ObjectStore {
    client: LazyClient<aws_sdk_s3::Client>,
    bucket: String,
}

/// Where a job's result object lives.
pub fn result_key(job_id: &JobId, file: &str) -> String {
    format!("results/{job_id}/{file}")
}

/// The prefix of all of a job's checkpoints.
pub fn checkpoints_prefix(job_id: &JobId) -> String {
    format!("checkpoints/{job_id}/")
}

/// Where checkpoint number `seq` of a job's `stage`, written by `attempt`, lives. Every
/// checkpoint is a new object, never overwritten: the key ends in a random part, and it is
/// written with [`ObjectStore::put_new`] (`If-None-Match: *`). A stale or duplicate worker can
/// therefore never replace the checkpoint the progress record points at (it could, when two
/// workers computed the same key from the same sequence number); the pointer, moved only
/// under the lease, decides which checkpoint is current.
pub fn checkpoint_key(job_id: &JobId, stage: &str, seq: u64, attempt: u32) -> String {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("{}{stage}/{seq:020}.a{attempt}.{}.json", checkpoints_prefix(job_id), &unique[..12])
}

/// A read of an object from an offset ([`ObjectStore::stream_from`]): its bytes in order, in the
/// chunks they arrive in; a read that broke off yields its error and ends.
pub type ObjectChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, AwsError>> + Send>>;

/// Why [`ObjectStore::put_new`] wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum PutNewError {
    /// An object already exists at the key.
    #[error("an object already exists at {0}")]
    Exists(String),
    /// S3 failed.
    #[error(transparent)]
    Aws(#[from] AwsError),
}

/// Percent-encodes a key for `x-amz-copy-source` (slashes stay).
fn urlencode_key(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl ObjectStore {
    /// An adapter for `bucket`.
    pub fn new(client: impl Into<LazyClient<aws_sdk_s3::Client>>, bucket: String) -> Self {
        ObjectStore { client: client.into(), bucket }
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
            .map_err(|e| AwsError::service(format!("put s3://{}/{key}", self.bucket), e))?;
        Ok(())
    }

    /// Writes `body` at `key` only if no object is there (`If-None-Match: *`): write-once.
    pub async fn put_new(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<(), PutNewError> {
        let result = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .if_none_match("*")
            .body(ByteStream::from(body))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // 412 Precondition Failed (409 while a concurrent conditional write is in flight).
            Err(err)
                if err.raw_response().is_some_and(|r| matches!(r.status().as_u16(), 409 | 412)) =>
            {
                Err(PutNewError::Exists(key.to_owned()))
            }
            Err(err) => {
                Err(AwsError::service(format!("put new s3://{}/{key}", self.bucket), err).into())
            }
        }
    }

    /// Reads the whole object at `key`, or `None` if there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, AwsError> {
        let context = || format!("get s3://{}/{key}", self.bucket);
        match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(output) => {
                let bytes = output.body.collect().await.map_err(|e| AwsError::new(context(), e))?;
                Ok(Some(bytes.into_bytes().to_vec()))
            }
            Err(err) if matches!(err.as_service_error(), Some(GetObjectError::NoSuchKey(_))) => {
                Ok(None)
            }
            Err(err) => Err(AwsError::service(context(), err)),
        }
    }

    /// A URL that GETs `key` until `expires_in` has passed (and no longer than the signing
    /// credentials live: mint one per request, never store it).
    pub async fn presign_get(&self, key: &str, expires_in: Duration) -> Result<String, AwsError> {
        let config = PresigningConfig::expires_in(expires_in)
            .map_err(|e| AwsError::new("presigning config", e))?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .presigned(config)
            .await
            .map_err(|e| AwsError::service(format!("presign GET {key}"), e))?;
        Ok(request.uri().to_owned())
    }

    /// A URL that PUTs `key` with `content_type` until `expires_in` has passed, and the
    /// headers the upload must send (they are part of the signature).
    ///
    /// `content_length` is signed (`X-Amz-SignedHeaders` names `content-length`): S3 refuses
    /// the PUT (403 `SignatureDoesNotMatch`) unless the body is exactly that long, which is
    /// how an upload's declared size becomes its cap.
    pub async fn presign_put(
        &self,
        key: &str,
        content_type: &str,
        content_length: u64,
        expires_in: Duration,
    ) -> Result<(String, BTreeMap<String, String>), AwsError> {
        let content_length =
            i64::try_from(content_length).map_err(|e| AwsError::new("content length", e))?;
        let config = PresigningConfig::expires_in(expires_in)
            .map_err(|e| AwsError::new("presigning config", e))?;
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .content_length(content_length)
            .presigned(config)
            .await
            .map_err(|e| AwsError::service(format!("presign PUT {key}"), e))?;
        let headers =
            request.headers().map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned())).collect();
        Ok((request.uri().to_owned(), headers))
    }

    /// The size of the object at `key`, or `None` if there is none.
    pub async fn size(&self, key: &str) -> Result<Option<u64>, AwsError> {
        Ok(self.head(key).await?.map(|head| head.size))
    }

    /// Streams `key` from byte `offset` to its end (one ranged GET; the body is read as it
    /// arrives, never held whole), in the chunks the SDK's body yields them.
    pub async fn stream_from(&self, key: &str, offset: u64) -> Result<ObjectChunks, AwsError> {
        let context = format!("get s3://{}/{key} from byte {offset}", self.bucket);
        let output = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes={offset}-"))
            .send()
            .await
            .map_err(|e| AwsError::service(context.clone(), e))?;
        // The SDK's body as a plain stream of chunks; after an error it ends.
        let chunks = futures::stream::unfold(Some(output.body), move |body| {
            let context = context.clone();
            async move {
                let mut body = body?;
                match body.try_next().await {
                    Ok(Some(chunk)) => Some((Ok(chunk), Some(body))),
                    Ok(None) => None,
                    Err(err) => Some((Err(AwsError::new(context, err)), None)),
                }
            }
        });
        Ok(Box::pin(chunks))
    }

    /// The first key under `prefix`, if any.
    pub async fn first_key(&self, prefix: &str) -> Result<Option<String>, AwsError> {
        let page = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .max_keys(1)
            .send()
            .await
            .map_err(|e| AwsError::service(format!("list s3://{}/{prefix}", self.bucket), e))?;
        Ok(page.contents().first().and_then(|o| o.key()).map(str::to_owned))
    }

    /// Copies `from` to `to` within the bucket, setting the content type.
    pub async fn copy(&self, from: &str, to: &str, content_type: &str) -> Result<(), AwsError> {
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .copy_source(format!("{}/{}", self.bucket, urlencode_key(from)))
            .key(to)
            .content_type(content_type)
            .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
            .send()
            .await
            .map_err(|e| {
                AwsError::service(format!("copy s3://{}/{from} to {to}", self.bucket), e)
            })?;
        Ok(())
    }

    /// Deletes the object at `key` (one `DeleteObject`, which S3 does not bill); a missing
    /// object is not an error (S3 answers a delete of a missing key with success).
    pub async fn delete(&self, key: &str) -> Result<(), AwsError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| AwsError::service(format!("delete s3://{}/{key}", self.bucket), e))?;
        Ok(())
    }

    /// Deletes every object under `prefix`. A page of a few keys is deleted key by key
    /// (concurrently): `DeleteObject` is free, while a `DeleteObjects` batch is billed as a
    /// PUT-class request — which made tidying a small job cost as much as storing its result.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<usize, AwsError> {
        /// Most keys of a page deleted one by one.
        const ONE_BY_ONE: usize = 4;
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        let context = || format!("delete s3://{}/{prefix}*", self.bucket);
        let mut deleted = 0;
        let mut token = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(|e| AwsError::service(context(), e))?;
            let ids: Vec<ObjectIdentifier> = page
                .contents()
                .iter()
                .filter_map(|o| ObjectIdentifier::builder().key(o.key()?).build().ok())
                .collect();
            if (1..=ONE_BY_ONE).contains(&ids.len()) {
                deleted += ids.len();
                let deletes = ids.iter().map(|id| {
                    self.client.delete_object().bucket(&self.bucket).key(id.key()).send()
                });
                for result in futures::future::join_all(deletes).await {
                    result.map_err(|e| AwsError::service(context(), e))?;
                }
            } else if !ids.is_empty() {
                deleted += ids.len();
                let delete = Delete::builder()
                    .set_objects(Some(ids))
                    .quiet(true)
                    .build()
                    .map_err(|e| AwsError::new(context(), e))?;
                self.client
                    .delete_objects()
                    .bucket(&self.bucket)
                    .delete(delete)
                    .send()
                    .await
                    .map_err(|e| AwsError::service(context(), e))?;
            }
            token = page.next_continuation_token;
            if token.is_none() {
                return Ok(deleted);
            }
        }
    }
}

/// A part of a multipart upload S3 stored: its number, the ETag completing names it by, and
/// its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPart {
    /// The part number (1 to 10,000).
    pub number: u32,
    /// S3's ETag of the part.
    pub etag: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The ETag S3 gives the object completed from `parts` (in order): the MD5 of the parts' MD5
/// digests, then `-` and their count, quoted. S3's part ETags are their MD5 digests for
/// objects encrypted with S3's own keys (the bucket's `SSE-S3` default); `None` if one is not
/// (an ETag that is not 32 hex digits), when the ETag cannot be predicted.
pub fn multipart_etag(parts: &[StoredPart]) -> Option<String> {
    use md5::{Digest, Md5};
    let mut digests = Md5::new();
    for part in parts {
        let digest = hex::decode(part.etag.trim_matches('"')).ok().filter(|d| d.len() == 16)?;
        digests.update(&digest);
    }
    Some(format!("\"{}-{}\"", hex::encode(digests.finalize()), parts.len()))
}

/// What `HeadObject` tells of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectHead {
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag, quoted as S3 sends it.
    pub etag: String,
}

/// S3's error codes for a completion whose parts S3 refuses (too small, not uploaded, out of
/// order): the request is wrong, no retry changes that. The SDK's `AwsError::service` does not
/// know them (they are S3's own), so they are classified here.
const REFUSED_COMPLETION: [&str; 4] =
    ["EntityTooSmall", "InvalidPart", "InvalidPartOrder", "MalformedXML"];

/// Multipart uploads (a job's large result, uploaded part by part across invocations).
impl ObjectStore {
    /// Starts a multipart upload of `key`; its upload id.
    pub async fn create_multipart_upload(
        &self,
        key: &str,
        content_type: &str,
    ) -> Result<String, AwsError> {
        let context = || format!("create multipart upload s3://{}/{key}", self.bucket);
        let output = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .content_type(content_type)
            .send()
            .await
            .map_err(|e| AwsError::service(context(), e))?;
        output.upload_id.ok_or_else(|| AwsError {
            context: context(),
            detail: "S3 answered without an upload id".into(),
            refusal: None,
        })
    }

    /// Uploads part `number` of upload `upload_id` of `key`; its ETag.
    pub async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Vec<u8>,
    ) -> Result<String, AwsError> {
        let context =
            || format!("upload part {number} of s3://{}/{key} ({upload_id})", self.bucket);
        let number = i32::try_from(number).map_err(|e| AwsError::new(context(), e))?;
        let output = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| AwsError::service(context(), e))?;
        output.e_tag.ok_or_else(|| AwsError {
            context: context(),
            detail: "S3 answered without an ETag".into(),
            refusal: None,
        })
    }

    /// Completes upload `upload_id` of `key` from `parts` (in ascending order). A completion
    /// S3 refuses for its parts is an [`AwsError`] with [`crate::Refusal::Invalid`].
    pub async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[StoredPart],
    ) -> Result<(), AwsError> {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let context =
            || format!("complete multipart upload s3://{}/{key} ({upload_id})", self.bucket);
        let mut completed = Vec::with_capacity(parts.len());
        for part in parts {
            let number = i32::try_from(part.number).map_err(|e| AwsError::new(context(), e))?;
            completed.push(CompletedPart::builder().part_number(number).e_tag(&part.etag).build());
        }
        let upload = CompletedMultipartUpload::builder().set_parts(Some(completed)).build();
        let result = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(upload)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Gone: aborted, or completed by an earlier try whose answer was lost. The object
            // at the key tells which: made of exactly these parts (their total size and the
            // multipart ETag), it is this completion's, done.
            Err(err) if is_no_such_upload(&err) && self.completed_from(key, parts).await? => {
                tracing::info!(
                    key,
                    upload_id,
                    "the upload was completed already (an earlier answer was lost)"
                );
                Ok(())
            }
            Err(err) => {
                let refused = err
                    .as_service_error()
                    .and_then(aws_smithy_types::error::metadata::ProvideErrorMetadata::code)
                    .is_some_and(|code| REFUSED_COMPLETION.contains(&code));
                let mut error = AwsError::service(context(), err);
                if refused {
                    error.refusal = Some(crate::Refusal::Invalid);
                }
                Err(error)
            }
        }
    }

    /// Aborts upload `upload_id` of `key` (its parts are deleted). An upload already gone
    /// (aborted, completed) is not an error.
    pub async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), AwsError> {
        let result = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if is_no_such_upload(&err) => Ok(()),
            Err(err) => Err(AwsError::service(
                format!("abort multipart upload s3://{}/{key} ({upload_id})", self.bucket),
                err,
            )),
        }
    }

    /// Whether the object at `key` is the one completing an upload from `parts` makes: its
    /// size is theirs and its ETag the multipart ETag of theirs (one `HeadObject`).
    pub async fn completed_from(&self, key: &str, parts: &[StoredPart]) -> Result<bool, AwsError> {
        let Some(head) = self.head(key).await? else { return Ok(false) };
        let size: u64 = parts.iter().map(|p| p.size).sum();
        Ok(head.size == size && multipart_etag(parts).is_some_and(|etag| head.etag == etag))
    }

    /// The size and ETag of the object at `key`, or `None` if there is none.
    pub async fn head(&self, key: &str) -> Result<Option<ObjectHead>, AwsError> {
        match self.client.head_object().bucket(&self.bucket).key(key).send().await {
            Ok(output) => Ok(Some(ObjectHead {
                size: output.content_length.unwrap_or(0).max(0) as u64,
                etag: output.e_tag.unwrap_or_default(),
            })),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(err) => Err(AwsError::service(format!("head s3://{}/{key}", self.bucket), err)),
        }
    }

    /// Whether upload `upload_id` of `key` is still open (neither aborted — by us or by the
    /// bucket's lifecycle rule — nor completed): one `ListParts` of at most one part.
    pub async fn multipart_upload_open(
        &self,
        key: &str,
        upload_id: &str,
    ) -> Result<bool, AwsError> {
        let result = self
            .client
            .list_parts()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .max_parts(1)
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) if is_no_such_upload(&err) => Ok(false),
            Err(err) => Err(AwsError::service(
                format!("list parts of s3://{}/{key} ({upload_id})", self.bucket),
                err,
            )),
        }
    }
}

/// S3's `NoSuchUpload`: the upload was aborted or completed (or never existed).
fn is_no_such_upload<E, R>(err: &aws_smithy_runtime_api::client::result::SdkError<E, R>) -> bool
where
    E: aws_smithy_types::error::metadata::ProvideErrorMetadata,
{
    err.as_service_error().and_then(aws_smithy_types::error::metadata::ProvideErrorMetadata::code)
        == Some("NoSuchUpload")
}

impl ObjectStore {
    /// Opens (and pools) a connection to the bucket's S3 endpoint during init — see
    /// [`crate::sdk::warm_up`] for why. Lists at most one key under `results/warm-up/` (a prefix
    /// no job id produces), the read every S3-calling function's policy already allows.
    /// Functions that only presign (status, uploads) make no S3 calls and need no warm-up.
    pub async fn warm(&self) {
        let started = std::time::Instant::now();
        let result = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix("results/warm-up/")
            .max_keys(1)
            .send()
            .await;
        crate::sdk::log_warm_up("s3", started, result);
    }
}
