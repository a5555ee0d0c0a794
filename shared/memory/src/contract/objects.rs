//! The objects' contract ([`Objects`], [`MultipartUploads`], [`UploadPresence`]): a missing
//! object is absent (and an upload's presence is whether its object is stored); a
//! write-once put refuses an existing key and changes nothing; a read from an offset yields
//! the rest of the object, in order; ETags are S3's (a part's and a plain object's the MD5 of
//! its bytes, a completed upload's the multipart ETag of its parts); a completion S3 refuses
//! for its parts is a refusal (`Invalid`), a repeated completion of a completed upload is done,
//! and an upload is gone once completed or aborted. Objects are deleted by key (a missing one
//! is no error) or by prefix, and a succeeded job's checkpoints are tidied by the keys its
//! stage names, never another job's (`longhaul_aws::tidy_after_end_with`).

use futures::TryStreamExt;
use longhaul_aws::objects::{PutNewError, StoredPart, multipart_etag};
use longhaul_aws::ports::{MultipartUploads, Objects, UploadPresence};
use longhaul_aws::{AwsError, Refusal};
use longhaul_domain::JobId;

/// The object ports, as the contract exercises them together.
pub trait ObjectStorage: Objects + MultipartUploads + UploadPresence {}

impl<T: Objects + MultipartUploads + UploadPresence> ObjectStorage for T {}

/// Runs the whole contract on `objects`, under a prefix of its own. Panics, naming the clause,
/// on the first breach.
pub async fn objects(objects: &impl ObjectStorage) {
    let prefix = format!("contract/objects/{}/", JobId::new());
    missing_objects_are_absent(objects, &prefix).await;
    objects_are_written_and_read(objects, &prefix).await;
    presence_is_whether_an_object_is_stored(objects, &prefix).await;
    a_new_object_is_written_once(objects, &prefix).await;
    a_read_from_an_offset_yields_the_rest(objects, &prefix).await;
    objects_are_deleted_by_prefix(objects, &prefix).await;
    objects_are_deleted_by_key(objects, &prefix).await;
    a_succeeded_jobs_checkpoints_are_tidied_by_key_or_prefix(objects).await;
    an_upload_completes_from_its_parts(objects, &prefix).await;
    refused_completions_and_aborts(objects, &prefix).await;
    objects.delete_prefix(&prefix).await.expect("tidy the contract's objects");
}

async fn presence_is_whether_an_object_is_stored(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}present.csv");
    assert!(!objects.exists(&key).await.unwrap(), "a missing upload is absent, not an error");
    objects.put(&key, b"a,b\n".to_vec(), "text/csv").await.unwrap();
    assert!(objects.exists(&key).await.unwrap(), "a stored upload is present");
    assert!(!objects.exists(&format!("{prefix}present")).await.unwrap(), "a prefix is not a key");
}

/// The quoted MD5 of `body`: S3's ETag of a part, or of an object put whole.
fn md5_etag(body: &[u8]) -> String {
    use md5::{Digest, Md5};
    format!("\"{}\"", hex::encode(Md5::digest(body)))
}

/// Asserts `result` is an error refused as `expected` (`None`: not a refusal).
fn assert_refused(
    result: Result<impl std::fmt::Debug, AwsError>,
    expected: Option<Refusal>,
    what: &str,
) {
    match result {
        Err(err) => assert_eq!(err.refusal, expected, "{what}: {err}"),
        Ok(value) => panic!("{what}: expected an error, got {value:?}"),
    }
}

async fn read_from(objects: &impl ObjectStorage, key: &str, offset: u64) -> Vec<u8> {
    let chunks = objects.stream_from(key, offset).await.expect("a read from an offset");
    let chunks: Vec<bytes::Bytes> = chunks.try_collect().await.expect("read to the end");
    chunks.concat()
}

async fn missing_objects_are_absent(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}missing");
    assert_eq!(objects.get(&key).await.unwrap(), None, "a missing object reads as absent");
    assert_eq!(objects.head(&key).await.unwrap(), None, "its head is absent");
    assert_eq!(objects.size(&key).await.unwrap(), None, "its size is absent");
    assert_refused(
        objects.stream_from(&key, 0).await.map(|_| ()),
        Some(Refusal::NotFound),
        "a read of a missing object's body is NoSuchKey",
    );
    assert!(
        objects.copy(&key, &format!("{prefix}copy-of-missing"), "text/plain").await.is_err(),
        "a missing object is not copied"
    );
    assert_eq!(objects.get(&format!("{prefix}copy-of-missing")).await.unwrap(), None);
    assert_eq!(objects.first_key(prefix).await.unwrap(), None, "nothing under a fresh prefix");
}

async fn objects_are_written_and_read(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}plain.txt");
    objects.put(&key, b"hello".to_vec(), "text/plain").await.expect("a put");
    assert_eq!(objects.get(&key).await.unwrap().as_deref(), Some(&b"hello"[..]));
    let head = objects.head(&key).await.unwrap().expect("a head");
    assert_eq!((head.size, head.etag.as_str()), (5, md5_etag(b"hello").as_str()));
    assert_eq!(objects.size(&key).await.unwrap(), Some(5));
    objects.put(&key, b"bye".to_vec(), "text/plain").await.expect("a put replaces");
    assert_eq!(objects.get(&key).await.unwrap().as_deref(), Some(&b"bye"[..]));
    assert_eq!(objects.size(&key).await.unwrap(), Some(3));
    let copy = format!("{prefix}copied.json");
    objects.copy(&key, &copy, "application/json").await.expect("a copy");
    assert_eq!(objects.get(&copy).await.unwrap().as_deref(), Some(&b"bye"[..]));
    assert_eq!(objects.get(&key).await.unwrap().as_deref(), Some(&b"bye"[..]), "source stays");
    let empty = format!("{prefix}empty");
    objects.put(&empty, Vec::new(), "text/plain").await.unwrap();
    assert_eq!(objects.get(&empty).await.unwrap(), Some(Vec::new()), "empty is not absent");
    assert_eq!(objects.size(&empty).await.unwrap(), Some(0));
}

async fn a_new_object_is_written_once(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}once.json");
    objects.put_new(&key, b"first".to_vec(), "application/json").await.expect("a new key");
    match objects.put_new(&key, b"second".to_vec(), "application/json").await {
        Err(PutNewError::Exists(existing)) => assert_eq!(existing, key, "names the key"),
        other => panic!("a second write-once put is refused as existing, got {other:?}"),
    }
    assert_eq!(
        objects.get(&key).await.unwrap().as_deref(),
        Some(&b"first"[..]),
        "a refused put changes nothing"
    );
}

async fn a_read_from_an_offset_yields_the_rest(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}input.bin");
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    objects.put(&key, body.clone(), "application/octet-stream").await.unwrap();
    assert_eq!(read_from(objects, &key, 0).await, body, "from the start: all of it, in order");
    assert_eq!(read_from(objects, &key, 70_001).await, body[70_001..], "from an offset: the rest");
    assert_eq!(read_from(objects, &key, 199_999).await, body[199_999..], "the last byte");
}

async fn objects_are_deleted_by_prefix(objects: &impl ObjectStorage, prefix: &str) {
    let doomed = format!("{prefix}doomed/");
    for name in ["a", "b", "c/d"] {
        objects.put(&format!("{doomed}{name}"), b"x".to_vec(), "text/plain").await.unwrap();
    }
    let kept = format!("{prefix}doomed-not/a");
    objects.put(&kept, b"y".to_vec(), "text/plain").await.unwrap();
    assert!(objects.first_key(&doomed).await.unwrap().is_some_and(|k| k.starts_with(&doomed)));
    assert_eq!(objects.delete_prefix(&doomed).await.unwrap(), 3, "every object under it");
    assert_eq!(objects.first_key(&doomed).await.unwrap(), None);
    assert_eq!(objects.get(&format!("{doomed}a")).await.unwrap(), None);
    assert!(objects.get(&kept).await.unwrap().is_some(), "none outside it");
    assert_eq!(objects.delete_prefix(&doomed).await.unwrap(), 0, "nothing left: none deleted");
}

async fn objects_are_deleted_by_key(objects: &impl ObjectStorage, prefix: &str) {
    let doomed = format!("{prefix}by-key/a");
    let kept = [format!("{prefix}by-key/a.json"), format!("{prefix}by-key/b")];
    for key in kept.iter().chain([&doomed]) {
        objects.put(key, b"x".to_vec(), "text/plain").await.unwrap();
    }
    objects.delete(&doomed).await.expect("an object is deleted by its key");
    assert_eq!(objects.get(&doomed).await.unwrap(), None, "gone");
    for key in &kept {
        assert!(objects.get(key).await.unwrap().is_some(), "only that key: {key} is kept");
    }
    objects.delete(&doomed).await.expect("deleting a missing object is not an error");
    objects.delete(&format!("{prefix}never-written")).await.expect("nor is one never written");
    objects.delete_prefix(&format!("{prefix}by-key/")).await.unwrap();
}

/// [`longhaul_aws::tidy_after_end_with`] over the port: a succeeded job's checkpoints named by
/// key go (and nothing else, not another job's), unknown ones go by prefix; a failed job's
/// stay.
async fn a_succeeded_jobs_checkpoints_are_tidied_by_key_or_prefix(objects: &impl ObjectStorage) {
    use longhaul_aws::{Leftovers, tidy_after_end_with};
    use longhaul_domain::JobStatus;
    let (job, retried) = (JobId::new(), JobId::new());
    let own = longhaul_aws::objects::checkpoints_prefix(&job);
    let (current, staged, orphan) = (
        format!("{own}render/00000000000000000004.a1.0123456789ab.json"),
        format!("{own}render/a1-report.csv"),
        format!("{own}count/00000000000000000002.a1.ba9876543210.json"),
    );
    let foreign =
        format!("{}count/00000000000000000009.a1.0123456789ab.json", checkpoints_prefix(&retried));
    for key in [&current, &staged, &orphan, &foreign] {
        objects.put(key, b"{}".to_vec(), "application/json").await.unwrap();
    }
    let present = |key: &String| {
        let key = key.clone();
        async move { objects.get(&key).await.unwrap().is_some() }
    };

    let named = [current.clone(), staged.clone(), foreign.clone(), own.clone()];
    tidy_after_end_with(objects, &job, JobStatus::Failed, Leftovers::Keys(&named)).await.unwrap();
    assert!(present(&current).await && present(&staged).await, "a failed job keeps them");

    tidy_after_end_with(objects, &job, JobStatus::Succeeded, Leftovers::Keys(&named))
        .await
        .unwrap();
    assert!(!present(&current).await && !present(&staged).await, "the named ones go");
    assert!(present(&orphan).await, "by key only: an object no one named is not listed");
    assert!(present(&foreign).await, "another job's checkpoint is never deleted");
    tidy_after_end_with(objects, &job, JobStatus::Succeeded, Leftovers::Keys(&named))
        .await
        .expect("tidying again finds them gone, which is fine");
    tidy_after_end_with(objects, &job, JobStatus::Succeeded, Leftovers::Keys(&[]))
        .await
        .expect("nothing named: nothing to do");

    tidy_after_end_with(objects, &job, JobStatus::Succeeded, Leftovers::Unknown).await.unwrap();
    assert!(!present(&orphan).await, "unknown leftovers: everything under the job's prefix");
    assert!(present(&foreign).await, "and nothing of another job's");
    objects.delete(&foreign).await.unwrap();
}

fn checkpoints_prefix(job: &JobId) -> String {
    longhaul_aws::objects::checkpoints_prefix(job)
}

/// S3's least size of a part that is not an upload's last.
const MIN_PART: usize = 5 * 1024 * 1024;

async fn upload(
    objects: &impl ObjectStorage,
    key: &str,
    upload_id: &str,
    number: u32,
    body: &[u8],
) -> StoredPart {
    let etag = objects
        .upload_part(key, upload_id, number, body.to_vec())
        .await
        .unwrap_or_else(|e| panic!("part {number} is stored: {e}"));
    assert_eq!(etag, md5_etag(body), "a part's ETag is its MD5");
    StoredPart { number, etag, size: body.len() as u64 }
}

async fn an_upload_completes_from_its_parts(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}result.csv");
    let id = objects.create_multipart_upload(&key, "text/csv").await.expect("an upload");
    assert!(objects.multipart_upload_open(&key, &id).await.unwrap(), "open once created");
    assert_eq!(objects.get(&key).await.unwrap(), None, "no object until it completes");
    let first = vec![b'a'; MIN_PART];
    let part_one = upload(objects, &key, &id, 1, &first).await;
    // A part uploaded again replaces the first upload of its number.
    upload(objects, &key, &id, 2, b"draft").await;
    let part_two = upload(objects, &key, &id, 2, b"tail").await;
    let parts = [part_one.clone(), part_two];
    objects.complete_multipart_upload(&key, &id, &parts).await.expect("completed");
    assert!(!objects.multipart_upload_open(&key, &id).await.unwrap(), "gone once completed");
    let mut whole = first.clone();
    whole.extend_from_slice(b"tail");
    assert_eq!(objects.get(&key).await.unwrap(), Some(whole.clone()), "its parts, in order");
    let head = objects.head(&key).await.unwrap().expect("the object");
    assert_eq!(head.size, whole.len() as u64);
    assert_eq!(Some(head.etag), multipart_etag(&parts), "the multipart ETag of its parts");
    assert!(objects.completed_from(&key, &parts).await.unwrap(), "made of these parts");
    assert!(!objects.completed_from(&key, &parts[..1]).await.unwrap(), "not of others");
    assert!(!objects.completed_from(&format!("{prefix}none"), &parts).await.unwrap());
    objects
        .complete_multipart_upload(&key, &id, &parts)
        .await
        .expect("a completion repeated after its answer was lost is done");
    objects.abort_multipart_upload(&key, &id).await.expect("aborting a completed upload: none");
    assert_eq!(objects.get(&key).await.unwrap(), Some(whole), "and leaves the object");
    // A put at the key makes it a plain object again.
    objects.put(&key, b"plain".to_vec(), "text/csv").await.unwrap();
    let head = objects.head(&key).await.unwrap().expect("the object");
    assert_eq!(head.etag, md5_etag(b"plain"));
    assert!(!objects.completed_from(&key, &parts).await.unwrap());
}

async fn refused_completions_and_aborts(objects: &impl ObjectStorage, prefix: &str) {
    let key = format!("{prefix}refused.csv");
    let id = objects.create_multipart_upload(&key, "text/csv").await.unwrap();
    let small =
        [upload(objects, &key, &id, 1, b"one").await, upload(objects, &key, &id, 2, b"two").await];
    assert_refused(
        objects.complete_multipart_upload(&key, &id, &small).await,
        Some(Refusal::Invalid),
        "a part but the last under 5 MiB is refused",
    );
    let forged = [StoredPart { etag: md5_etag(b"other"), ..small[0].clone() }];
    assert_refused(
        objects.complete_multipart_upload(&key, &id, &forged).await,
        Some(Refusal::Invalid),
        "a part named by an ETag it was not stored with is refused",
    );
    let unknown = [StoredPart { number: 3, ..small[0].clone() }];
    assert_refused(
        objects.complete_multipart_upload(&key, &id, &unknown).await,
        Some(Refusal::Invalid),
        "a part never uploaded is refused",
    );
    assert!(objects.multipart_upload_open(&key, &id).await.unwrap(), "a refusal leaves it open");
    assert_eq!(objects.get(&key).await.unwrap(), None, "and makes no object");
    objects.abort_multipart_upload(&key, &id).await.expect("aborted");
    assert!(!objects.multipart_upload_open(&key, &id).await.unwrap(), "gone once aborted");
    objects.abort_multipart_upload(&key, &id).await.expect("aborting again: nothing to do");
    // (S3 says `NoSuchUpload`, a refusal; moto answers without an error code.)
    assert!(
        objects.complete_multipart_upload(&key, &id, &small[1..]).await.is_err(),
        "an aborted upload is not completed"
    );
    assert!(objects.upload_part(&key, &id, 3, b"late".to_vec()).await.is_err(), "nor takes parts");
    assert_eq!(objects.get(&key).await.unwrap(), None);
}
