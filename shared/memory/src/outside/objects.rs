//! The bucket's objects as a stage reads and writes them, in memory ([`Objects`],
//! [`MultipartUploads`]), as S3 keeps them: a conditional put refuses an existing key and
//! changes nothing, a missing object is absent (its ranged read fails `NoSuchKey`), ETags are
//! MD5 digests (a completed multipart object's is the multipart ETag of its parts), and a
//! multipart upload follows S3's rules — parts 1 to 10,000 named by their ETags, every part but
//! the last at least 5 MiB, gone once completed or aborted, a completion repeated after its
//! answer was lost done if the object is the one its parts make.

use super::*;

use longhaul_aws::objects::{ObjectChunks, ObjectHead, PutNewError, StoredPart, multipart_etag};
use longhaul_aws::ports::{MultipartUploads, Objects};
use md5::{Digest, Md5};

/// S3's least size of a part that is not an upload's last.
const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;

/// The most bytes one chunk of a ranged read carries (a body arrives in pieces).
const CHUNK_BYTES: usize = 64 * 1024;

/// Multipart uploads, and what completing them made.
#[derive(Debug, Default)]
pub(super) struct Multipart {
    /// Open uploads by upload id.
    open: HashMap<String, Upload>,
    /// The ETag of each object a completion made, by key, with the MD5 of the body it made:
    /// an object written at the key since is a plain object again.
    completed: HashMap<String, (String, [u8; 16])>,
    /// Upload ids given so far.
    issued: u64,
}

#[derive(Debug)]
struct Upload {
    key: String,
    content_type: String,
    /// Parts by number: ETag and bytes.
    parts: BTreeMap<u32, (String, Vec<u8>)>,
}

impl Multipart {
    /// The ETag of `body`, the object at `key`: the multipart ETag if a completion made it.
    fn etag(&self, key: &str, body: &[u8]) -> String {
        match self.completed.get(key) {
            Some((etag, made)) if *made == md5(body) => etag.clone(),
            _ => etag_of(body),
        }
    }
}

fn md5(body: &[u8]) -> [u8; 16] {
    Md5::digest(body).into()
}

/// A plain object's ETag: its MD5, quoted.
fn etag_of(body: &[u8]) -> String {
    format!("\"{}\"", hex::encode(md5(body)))
}

/// Whether an object of `size` bytes with `etag` is the one completing an upload from `parts`
/// makes: their total size, and their multipart ETag.
fn made_from(size: u64, etag: &str, parts: &[StoredPart]) -> bool {
    size == parts.iter().map(|p| p.size).sum::<u64>()
        && multipart_etag(parts).is_some_and(|made| made == etag)
}

fn no_such_upload(doing: &str) -> AwsError {
    refused(doing, Refusal::NotFound, "NoSuchUpload: the upload does not exist")
}

fn no_such_key(doing: &str) -> AwsError {
    refused(doing, Refusal::NotFound, "NoSuchKey: the object does not exist")
}

impl MemoryObjects {
    fn store(&self, key: &str, body: Vec<u8>, content_type: &str) {
        let mut objects = lock(&self.objects);
        lock(&self.multipart).completed.remove(key);
        objects.insert(key.to_owned(), (body, content_type.to_owned()));
    }
}

#[async_trait]
impl Objects for MemoryObjects {
    async fn put(&self, key: &str, body: Vec<u8>, content_type: &str) -> Result<(), AwsError> {
        self.outage.check("put object")?;
        self.store(key, body, content_type);
        Ok(())
    }

    async fn put_new(
        &self,
        key: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Result<(), PutNewError> {
        self.outage.check("put new object")?;
        let mut objects = lock(&self.objects);
        if objects.contains_key(key) {
            return Err(PutNewError::Exists(key.to_owned()));
        }
        lock(&self.multipart).completed.remove(key);
        objects.insert(key.to_owned(), (body, content_type.to_owned()));
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, AwsError> {
        self.outage.check("get object")?;
        Ok(lock(&self.objects).get(key).map(|(body, _)| body.clone()))
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectHead>, AwsError> {
        self.outage.check("head object")?;
        let objects = lock(&self.objects);
        let Some((body, _)) = objects.get(key) else { return Ok(None) };
        let etag = lock(&self.multipart).etag(key, body);
        Ok(Some(ObjectHead { size: body.len() as u64, etag }))
    }

    async fn size(&self, key: &str) -> Result<Option<u64>, AwsError> {
        Ok(self.head(key).await?.map(|head| head.size))
    }

    async fn stream_from(&self, key: &str, offset: u64) -> Result<ObjectChunks, AwsError> {
        let doing = format!("get {key} from byte {offset}");
        self.outage.check(&doing)?;
        let body = lock(&self.objects).get(key).map(|(body, _)| body.clone());
        let body = body.ok_or_else(|| no_such_key(&doing))?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        if start > body.len() {
            // S3 answers 416 (`InvalidRange`): not a refusal its code classifies.
            return Err(AwsError {
                context: doing,
                detail: "InvalidRange: the requested range is not satisfiable".into(),
                refusal: None,
            });
        }
        let chunks: Vec<Result<bytes::Bytes, AwsError>> = body[start..]
            .chunks(CHUNK_BYTES)
            .map(|chunk| Ok(bytes::Bytes::copy_from_slice(chunk)))
            .collect();
        Ok(Box::pin(futures::stream::iter(chunks)))
    }

    async fn copy(&self, from: &str, to: &str, content_type: &str) -> Result<(), AwsError> {
        let doing = format!("copy {from} to {to}");
        self.outage.check(&doing)?;
        let body = lock(&self.objects).get(from).map(|(body, _)| body.clone());
        self.store(to, body.ok_or_else(|| no_such_key(&doing))?, content_type);
        Ok(())
    }
}

#[async_trait]
impl MultipartUploads for MemoryObjects {
    async fn create_multipart_upload(
        &self,
        key: &str,
        content_type: &str,
    ) -> Result<String, AwsError> {
        self.outage.check("create multipart upload")?;
        let mut multipart = lock(&self.multipart);
        multipart.issued += 1;
        let upload_id = format!("memory-upload-{}", multipart.issued);
        let upload = Upload {
            key: key.to_owned(),
            content_type: content_type.to_owned(),
            parts: BTreeMap::new(),
        };
        multipart.open.insert(upload_id.clone(), upload);
        Ok(upload_id)
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Vec<u8>,
    ) -> Result<String, AwsError> {
        let doing = format!("upload part {number} of {key} ({upload_id})");
        self.outage.check(&doing)?;
        if !(1..=10_000).contains(&number) {
            return Err(refused(&doing, Refusal::Invalid, "InvalidArgument: part number"));
        }
        let mut multipart = lock(&self.multipart);
        let upload = multipart
            .open
            .get_mut(upload_id)
            .filter(|upload| upload.key == key)
            .ok_or_else(|| no_such_upload(&doing))?;
        let etag = etag_of(&body);
        upload.parts.insert(number, (etag.clone(), body));
        Ok(etag)
    }

    async fn complete_multipart_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[StoredPart],
    ) -> Result<(), AwsError> {
        let doing = format!("complete multipart upload {key} ({upload_id})");
        self.outage.check(&doing)?;
        let mut objects = lock(&self.objects);
        let mut multipart = lock(&self.multipart);
        let Some(upload) = multipart.open.get(upload_id).filter(|upload| upload.key == key) else {
            // Gone: completed by an earlier try whose answer was lost, if the object at the key
            // is the one these parts make.
            let made = objects.get(key).is_some_and(|(body, _)| {
                made_from(body.len() as u64, &multipart.etag(key, body), parts)
            });
            return if made { Ok(()) } else { Err(no_such_upload(&doing)) };
        };
        let invalid = |code: &str| refused(&doing, Refusal::Invalid, code);
        if parts.is_empty() {
            return Err(invalid("MalformedXML: no parts"));
        }
        if parts.windows(2).any(|w| w[0].number >= w[1].number) {
            return Err(invalid("InvalidPartOrder: parts are not in ascending order"));
        }
        let mut body = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let stored = upload
                .parts
                .get(&part.number)
                .filter(|(etag, _)| etag.trim_matches('"') == part.etag.trim_matches('"'));
            let Some((_, bytes)) = stored else {
                return Err(invalid("InvalidPart: a part was not uploaded, or not with this ETag"));
            };
            if i + 1 < parts.len() && (bytes.len() as u64) < MIN_PART_SIZE {
                return Err(invalid("EntityTooSmall: a part but the last is under 5 MiB"));
            }
            body.extend_from_slice(bytes);
        }
        let content_type = upload.content_type.clone();
        let etag = multipart_etag(parts).unwrap_or_else(|| etag_of(&body));
        multipart.open.remove(upload_id);
        multipart.completed.insert(key.to_owned(), (etag, md5(&body)));
        objects.insert(key.to_owned(), (body, content_type));
        Ok(())
    }

    async fn abort_multipart_upload(&self, key: &str, upload_id: &str) -> Result<(), AwsError> {
        self.outage.check("abort multipart upload")?;
        let mut multipart = lock(&self.multipart);
        if multipart.open.get(upload_id).is_some_and(|upload| upload.key == key) {
            multipart.open.remove(upload_id);
        }
        Ok(())
    }

    async fn multipart_upload_open(&self, key: &str, upload_id: &str) -> Result<bool, AwsError> {
        self.outage.check("list parts")?;
        Ok(lock(&self.multipart).open.get(upload_id).is_some_and(|upload| upload.key == key))
    }

    async fn completed_from(&self, key: &str, parts: &[StoredPart]) -> Result<bool, AwsError> {
        Ok(self.head(key).await?.is_some_and(|head| made_from(head.size, &head.etag, parts)))
    }
}
