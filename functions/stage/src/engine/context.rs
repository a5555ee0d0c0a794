//! The worker API's [`StageContext`] over the engine: what a kind's stage calls.

use super::*;

impl Ctx<'_> {
    /// Refuses a staged file that is not the job's own, nor one of the job it retries (whose
    /// checkpoint it resumed from: a retry of a failed publish, or of a merge over staged
    /// shards) — both its owner's.
    fn own_staged(&self, staged: &StagedFile) -> Result<(), KindError> {
        let of = |job: &JobId| {
            staged.location().starts_with(&longhaul_aws::objects::checkpoints_prefix(job))
        };
        if !of(&self.job.job_id) && !self.job.retry_of.as_ref().is_some_and(of) {
            return Err(KindError::fatal(PublicMessage::fixed(
                "the job kind named a staged file of another job",
            ))
            .because(staged.location()));
        }
        Ok(())
    }

    /// `input`, if the kind declared it and it is the job owner's upload.
    fn readable<'i>(&self, input: &'i str) -> Result<&'i str, KindError> {
        if self.inputs.iter().any(|i| i == input) && owns_upload(&self.job.owner, input) {
            Ok(input)
        } else {
            Err(KindError::fatal(PublicMessage::fixed(
                "the input is not one of the job owner's uploads",
            )))
        }
    }
}

fn unreadable(err: longhaul_aws::AwsError) -> KindError {
    failure_message::aws_failure(failure_message::INPUT_UNREADABLE, &err)
}

/// A read of the input's body that broke off (the connection, a timeout): retried.
fn broke_off(err: impl std::fmt::Display) -> KindError {
    KindError::retryable(failure_message::INPUT_UNREADABLE).because(err)
}

impl StageContext for Ctx<'_> {
    fn stage(&self) -> &str {
        self.stage
    }

    fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    fn progress(&mut self, done: u64, total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(Ctx::progress(self, done, total).await?) }.boxed()
    }

    fn record_shards(
        &mut self,
        counts: longhaul_worker::ShardCounts,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let counts = ShardCounts {
            total: counts.total,
            pending: counts.pending,
            running: counts.running,
            succeeded: counts.succeeded,
            failed: counts.failed,
            attempts: counts.attempts,
        };
        async move { Ok(Ctx::record_shards(self, counts).await?) }.boxed()
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: serde_json::Value,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(self.checkpoint(version, &state, done, total).await?) }.boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<serde_json::Value>, KindError>> {
        async move { Ok(self.resume(version).await?) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        Ctx::has_own_checkpoint(self)
    }

    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<serde_json::Value, KindError>> {
        let from_stage = from_stage.to_owned();
        async move { Ok(self.carried(&from_stage, version).await?) }.boxed()
    }

    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        let input = self.readable(input).map(str::to_owned);
        async move {
            let input = input?;
            if let Some((_, size)) = self.input_sizes.iter().find(|(seen, _)| *seen == input) {
                return Ok(*size);
            }
            let size =
                self.deps.objects.size(&input).await.map_err(unreadable)?.ok_or_else(|| {
                    KindError::fatal(PublicMessage::fixed(
                        "the input upload does not exist (upload it before submitting the job)",
                    ))
                })?;
            self.input_sizes.push((input, size));
            Ok(size)
        }
        .boxed()
    }

    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        let input = self.readable(input).map(str::to_owned);
        async move {
            let chunks =
                self.deps.objects.stream_from(&input?, offset).await.map_err(unreadable)?;
            // A read that broke off ends after its error (the port's stream does).
            Ok(futures::StreamExt::boxed(futures::TryStreamExt::map_err(chunks, broke_off)))
        }
        .boxed()
    }

    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        let name = check_result_name(name).map(str::to_owned);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            // Per stage and attempt, under the job's checkpoints (tidied when the job ends).
            let key = format!(
                "{}{}/a{}-{name}",
                longhaul_aws::objects::checkpoints_prefix(&self.job.job_id),
                self.stage,
                self.lease.attempt
            );
            self.deps
                .objects
                .put(&key, body, &content_type)
                .await
                .map_err(|e| failure_message::aws_failure(CHECKPOINT_FAILED, &e))?;
            Ok(StagedFile::from_host(key, content_type, name))
        }
        .boxed()
    }

    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let name = check_result_name(name).map(str::to_owned);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            // A small result travels with the job's success, in the record: no object PUT.
            if longhaul_domain::inline_result::InlineResult::fits(&content_type, body.len()) {
                return Ok(ResultRef::inline_from_host(content_type, body));
            }
            // Keyed by attempt: a stale attempt's result can never be the one recorded.
            let key = result_key(self.job_id(), &format!("{}/{}", self.lease.attempt, name));
            self.deps.objects.put(&key, body, &content_type).await.map_err(|e| {
                failure_message::aws_failure(failure_message::RESULT_NOT_STORED, &e)
            })?;
            Ok(ResultRef::from_host(key))
        }
        .boxed()
    }

    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        let staged = staged.clone();
        async move {
            self.own_staged(&staged)?;
            match self.deps.objects.get(staged.location()).await {
                Ok(Some(body)) => Ok(body),
                Ok(None) => Err(KindError::fatal(PublicMessage::fixed(
                    "a staged file of the job is missing",
                ))
                .because(staged.location())),
                Err(e) => Err(failure_message::aws_failure(CHECKPOINT_FAILED, &e)),
            }
        }
        .boxed()
    }

    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let staged = staged.clone();
        async move {
            let name = check_result_name(staged.name())?;
            self.own_staged(&staged)?;
            let key = result_key(self.job_id(), &format!("{}/{name}", self.lease.attempt));
            self.deps.objects.copy(staged.location(), &key, staged.content_type()).await.map_err(
                |e| failure_message::aws_failure(failure_message::RESULT_NOT_STORED, &e),
            )?;
            // Needed until the success is recorded (a retry publishes it again), then not.
            self.published.push(staged.location().to_owned());
            Ok(ResultRef::from_host(key))
        }
        .boxed()
    }

    // Multipart result uploads: see `crate::multipart`.
    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        let (name, content_type) = (name.to_owned(), content_type.to_owned());
        async move { self.begin_upload(&name, &content_type).await }.boxed()
    }

    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        let upload = upload.clone();
        async move { self.continuable(&upload).await }.boxed()
    }

    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        let upload = upload.clone();
        async move { self.put_part(&upload, number, body).await }.boxed()
    }

    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let (upload, parts) = (upload.clone(), parts.to_vec());
        async move { self.complete_upload(&upload, &parts).await }.boxed()
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        // The key is `uploads/<owner>/<id>/<filename>` (longhaul_domain::uploads::upload_key),
        // checked as every read is.
        let input = self.readable(input)?;
        Ok(input.rsplit('/').next().unwrap_or(input).to_owned())
    }

    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move { Ok(Ctx::pause(self, duration, done, total).await?) }.boxed()
    }

    fn deadline_near(&self) -> bool {
        Ctx::deadline_near(self)
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        Ctx::checkpoint_due(self, items)
    }

    fn cancelled(&self) -> bool {
        Ctx::cancelled(self)
    }

    fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<longhaul_worker::Waited, KindError>> {
        let name = name.to_owned();
        async move { Ok(Ctx::wait_for(self, &name, timeout).await?) }.boxed()
    }

    fn attempt_failures(&self) -> u32 {
        self.job.injected_failures
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            self.deps
                .jobs
                .count_injected_failure(self.job_id(), &self.lease.token)
                .await
                .map_err(crate::fenced)?;
            Ok(())
        }
        .boxed()
    }
}
