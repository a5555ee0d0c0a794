//! Multipart uploads of a job's result, for the stage's [`Ctx`]: a kind uploads a result too
//! large to hold in memory part by part, across invocations, keeping the
//! [`ResultUpload`] and its [`UploadedPart`]s in its checkpoint.
//!
//! The key is the attempt's, as `write_result`'s (`results/<job>/<attempt>/<name>`), so the
//! completed object passes the check `work` makes of a finished result, and a stale attempt's
//! upload can never become the job's result. An upload is continued only by the attempt that
//! began it: a zombie of an earlier attempt may still be writing to its own, so a later attempt
//! that finds one in the checkpoint aborts it and the kind starts over. Uploads abandoned any
//! other way (a cancelled or expired job, a crash between beginning and checkpointing) are not
//! objects — the expirer's and cancellation's `delete_prefix` never sees them — and are removed
//! by the bucket's `AbortIncompleteMultipartUpload` lifecycle rule (template.yaml).

use longhaul_aws::objects::{StoredPart, result_key};
use longhaul_worker::context::{check_part_number, check_parts, check_result_name};
use longhaul_worker::{KindError, PublicMessage, ResultRef, ResultUpload, UploadedPart};

use crate::engine::Ctx;
use crate::failure_message::{RESULT_NOT_STORED, aws_failure};

/// Whose an upload read back from a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// This attempt's (its key is the one this attempt would give it).
    ThisAttempt,
    /// An earlier attempt's of this job: abandoned, to be aborted.
    EarlierAttempt,
    /// Anything else (a later attempt's, seen by a zombie; a key not of this job's results):
    /// never touched.
    Other,
}

impl Ctx<'_> {
    /// The key of the result `name` of `attempt` of this job.
    fn result_key_of(&self, attempt: u32, name: &str) -> String {
        result_key(self.job_id(), &format!("{attempt}/{name}"))
    }

    fn owner(&self, upload: &ResultUpload) -> Owner {
        let ours = longhaul_worker::is_result_name(upload.name())
            && upload.location() == self.result_key_of(upload.attempt(), upload.name());
        match upload.attempt().cmp(&self.lease.attempt) {
            _ if !ours => Owner::Other,
            std::cmp::Ordering::Equal => Owner::ThisAttempt,
            std::cmp::Ordering::Less => Owner::EarlierAttempt,
            std::cmp::Ordering::Greater => Owner::Other,
        }
    }

    /// Whether `upload` is under another job's results (a retried job's, named by the
    /// checkpoint a retry starts from), not this job's.
    fn is_another_jobs(&self, upload: &ResultUpload) -> bool {
        !upload.location().starts_with(&result_key(self.job_id(), ""))
    }

    /// Refuses an upload this attempt did not begin (a kind must ask `can_continue`).
    fn own_upload(&self, upload: &ResultUpload) -> Result<(), KindError> {
        if self.owner(upload) == Owner::ThisAttempt {
            Ok(())
        } else {
            Err(KindError::fatal(PublicMessage::fixed(
                "the job kind went on with a result upload of another attempt",
            ))
            .because(format!(
                "upload of attempt {} at {}",
                upload.attempt(),
                upload.location()
            )))
        }
    }

    /// Starts a multipart upload of the result `name` under this attempt's key.
    pub(crate) async fn begin_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> Result<ResultUpload, KindError> {
        let name = check_result_name(name)?;
        let key = self.result_key_of(self.lease.attempt, name);
        let upload_id = self
            .deps
            .objects
            .create_multipart_upload(&key, content_type)
            .await
            .map_err(|e| aws_failure(RESULT_NOT_STORED, &e))?;
        tracing::info!(key, "result upload begun");
        Ok(ResultUpload::from_host(
            key,
            upload_id,
            self.lease.attempt,
            name.to_owned(),
            content_type.to_owned(),
        ))
    }

    /// Whether `upload` is this attempt's and still open. An earlier attempt's is aborted
    /// (best effort: a failure is logged, and the lifecycle rule removes it later).
    pub(crate) async fn continuable(&mut self, upload: &ResultUpload) -> Result<bool, KindError> {
        match self.owner(upload) {
            Owner::ThisAttempt => {
                let objects = &self.deps.objects;
                let open = objects
                    .multipart_upload_open(upload.location(), upload.upload_id())
                    .await
                    .map_err(|e| aws_failure(RESULT_NOT_STORED, &e))?;
                if open {
                    return Ok(true);
                }
                // Gone: aborted by the bucket's rule, or completed by an invocation that died
                // before it heard so. Completed, the kind goes on to complete it again, which
                // finds the object made of its parts (`complete_upload`).
                let completed = objects
                    .size(upload.location())
                    .await
                    .map_err(|e| aws_failure(RESULT_NOT_STORED, &e))?
                    .is_some();
                if completed {
                    tracing::info!(
                        key = upload.location(),
                        "the result upload was completed already"
                    );
                }
                Ok(completed)
            }
            Owner::EarlierAttempt => {
                let aborted = self
                    .deps
                    .objects
                    .abort_multipart_upload(upload.location(), upload.upload_id())
                    .await;
                match aborted {
                    Ok(()) => tracing::info!(
                        job_id = self.job_id().as_str(),
                        upload_attempt = upload.attempt(),
                        "the result upload of an earlier attempt was aborted; the stage starts it over"
                    ),
                    Err(err) => tracing::warn!(
                        job_id = self.job_id().as_str(),
                        upload_attempt = upload.attempt(),
                        error = %err,
                        "the result upload of an earlier attempt could not be aborted (the bucket's lifecycle rule will)"
                    ),
                }
                Ok(false)
            }
            Owner::Other if self.is_another_jobs(upload) => {
                // A retry's checkpoint, copied from the job it retries: that job's upload is
                // not this job's to continue. The stage starts over, and says so.
                self.start_over().await.map_err(KindError::from)?;
                Ok(false)
            }
            Owner::Other => {
                tracing::warn!(
                    job_id = self.job_id().as_str(),
                    upload_attempt = upload.attempt(),
                    location = upload.location(),
                    "a checkpoint names a result upload that is not this job's or is a later attempt's; not continued"
                );
                Ok(false)
            }
        }
    }

    /// Uploads part `number` of this attempt's `upload`.
    pub(crate) async fn put_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> Result<UploadedPart, KindError> {
        check_part_number(number)?;
        self.own_upload(upload)?;
        let size = body.len() as u64;
        let etag = self
            .deps
            .objects
            .upload_part(upload.location(), upload.upload_id(), number, body)
            .await
            .map_err(|e| aws_failure(RESULT_NOT_STORED, &e))?;
        Ok(UploadedPart::from_host(number, etag, size))
    }

    /// Completes this attempt's `upload` from `parts`: the result.
    pub(crate) async fn complete_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> Result<ResultRef, KindError> {
        check_parts(parts)?;
        self.own_upload(upload)?;
        let parts: Vec<StoredPart> = parts
            .iter()
            .map(|p| StoredPart { number: p.number(), etag: p.etag().to_owned(), size: p.size() })
            .collect();
        // S3 assembles the parts before it answers: minutes for a large result. The progress
        // record keeps heartbeating meanwhile, so the reaper does not take the stage for dead.
        let deps = self.deps;
        let objects = &deps.objects;
        let completing =
            objects.complete_multipart_upload(upload.location(), upload.upload_id(), &parts);
        self.heartbeating(completing)
            .await
            .map_err(KindError::from)?
            .map_err(|e| aws_failure(RESULT_NOT_STORED, &e))?;
        tracing::info!(key = upload.location(), parts = parts.len(), "result upload completed");
        Ok(ResultRef::from_host(upload.location().to_owned()))
    }
}
