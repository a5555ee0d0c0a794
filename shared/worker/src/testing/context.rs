//! The worker API's [`StageContext`] over the in-memory host's durable state: one invocation
//! of a stage, as a kind sees it.

use super::*;

impl MemoryContext<'_> {
    fn write(&mut self) -> Result<(), KindError> {
        if self.crashed {
            return Err(crash());
        }
        self.durable.writes += 1;
        if self.host.cancel_after_writes.is_some_and(|n| self.durable.writes >= n) {
            self.cancelled = true;
            return Err(KindError::cancelled());
        }
        Ok(())
    }

    /// A progress write from the kind: the one that finds the job cancelled succeeds (the
    /// stage is asked to stop), any after it fails as cancelled.
    fn write_unless_cancelled(&mut self) -> Result<(), KindError> {
        if self.cancelled {
            return Err(KindError::cancelled());
        }
        match self.write() {
            Err(e) if e.is_cancelled() => Ok(()),
            other => other,
        }
    }

    fn input(&self, input: &str) -> Result<&(Vec<u8>, usize), KindError> {
        if !self.inputs.iter().any(|i| i == input) {
            return Err(KindError::fatal(PublicMessage::fixed(
                "the input is not one of the job owner's uploads",
            )));
        }
        self.host.owner_inputs.get(input).ok_or_else(|| {
            KindError::fatal(PublicMessage::fixed(
                "the input upload does not exist (upload it before submitting the job)",
            ))
        })
    }
}

/// A simulated crash: the invocation is gone (the host discards whatever the stage answers).
fn crash() -> KindError {
    KindError::lease_lost("simulated crash")
}

fn name_ok(name: &str) -> Result<String, KindError> {
    crate::context::check_result_name(name).map(str::to_owned)
}

/// S3's answer to a part or a completion of an upload that is not open (never begun,
/// aborted, completed), as the stage function reports it.
fn no_such_upload() -> KindError {
    KindError::fatal(PublicMessage::fixed(
        "the job's result could not be stored: it does not exist",
    ))
}

/// A stage that goes on with an upload of another attempt (it must ask `can_continue`).
fn not_this_attempts() -> KindError {
    KindError::fatal(PublicMessage::fixed(
        "the job kind went on with a result upload of another attempt",
    ))
}

/// A content tag like S3's (the MD5 of the part): the same bytes, the same tag.
fn etag(body: &[u8]) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("\"{:016x}{:08x}\"", hasher.finish(), body.len())
}

impl MemoryContext<'_> {
    /// The open upload `upload` names, if it is this attempt's.
    /// The result of this attempt's `upload` if it was completed already from exactly `parts`
    /// (what the stage host checks of the object at the upload's key when S3 answers that the
    /// upload is gone).
    fn completed_already(
        &self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> Option<ResultRef> {
        let stored = self.durable.uploads.get(upload.upload_id())?;
        let same_parts = stored.completed_from.len() == parts.len()
            && stored.completed_from.iter().zip(parts).all(|((number, etag, size), part)| {
                *number == part.number() && etag == part.etag() && *size == part.size()
            });
        (!self.crashed
            && upload.attempt() == self.durable.attempt
            && stored.state == UploadState::Completed
            && stored.location == upload.location()
            && same_parts)
            .then(|| ResultRef::from_host(stored.location.clone()))
    }

    fn open_upload(&mut self, upload: &ResultUpload) -> Result<&mut MemoryUpload, KindError> {
        if self.crashed {
            return Err(crash());
        }
        if upload.attempt() != self.durable.attempt {
            return Err(not_this_attempts());
        }
        match self.durable.uploads.get_mut(upload.upload_id()) {
            Some(stored)
                if stored.state == UploadState::Open && stored.location == upload.location() =>
            {
                Ok(stored)
            }
            _ => Err(no_such_upload()),
        }
    }
}

impl StageContext for MemoryContext<'_> {
    fn stage(&self) -> &str {
        self.stage
    }

    fn attempt(&self) -> u32 {
        self.durable.attempt
    }

    fn progress(
        &mut self,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let written = self.write_unless_cancelled();
        async move { written }.boxed()
    }

    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            if !self.cancelled {
                match self.write() {
                    // Found cancelled while saved: it is the final checkpoint.
                    Err(e) if e.is_cancelled() => {}
                    other => other?,
                }
            }
            self.durable.trace.final_checkpoint |= self.cancelled;
            self.durable.checkpoint = Some((self.stage.to_owned(), version, state));
            self.durable.checkpoint_done = done;
            self.durable.trace.checkpoints += 1;
            self.checkpoint_base = done;
            let n = Some(self.durable.trace.checkpoints);
            if self.host.crash_after_checkpoint == n || self.host.new_attempt_after_checkpoint == n
            {
                self.crashed = true;
                self.new_attempt = self.host.new_attempt_after_checkpoint == n;
                return Err(crash());
            }
            Ok(())
        }
        .boxed()
    }

    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        let found = match &self.durable.checkpoint {
            Some((stage, v, state)) if stage == self.stage && *v == version => Some(state.clone()),
            _ => None,
        };
        // As the stage function: the item cadence counts from the checkpoint resumed.
        if found.is_some() {
            self.checkpoint_base = self.durable.checkpoint_done;
        }
        async move { Ok(found) }.boxed()
    }

    fn has_own_checkpoint(&self) -> bool {
        self.durable.checkpoint.as_ref().is_some_and(|(stage, _, _)| stage == self.stage)
    }

    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        // A fanned-out stage's output is what its merge saved (as the stage function reads it).
        let output = match &self.durable.checkpoint {
            Some((stage, v, state)) if stage == from_stage => {
                crate::fan_out::stage_output(*v, state.clone())
            }
            _ => Ok(None),
        };
        let found = match output {
            Ok(Some((v, state))) if v == version => Ok(state),
            Err(e) => Err(e),
            _ => Err(KindError::fatal(PublicMessage::domain(format!(
                "the {from_stage} stage's output is missing or not of schema version {version}"
            )))),
        };
        async move { found }.boxed()
    }

    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        let size = self.input(input).map(|(bytes, _)| bytes.len() as u64);
        async move { size }.boxed()
    }

    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        let stream = self.input(input).map(|(bytes, chunk)| {
            let from = (offset as usize).min(bytes.len());
            let chunks: Vec<Result<bytes::Bytes, KindError>> = bytes[from..]
                .chunks(*chunk)
                .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
                .collect();
            futures::StreamExt::boxed(futures::stream::iter(chunks))
        });
        async move { stream }.boxed()
    }

    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            let location = format!("staged/{}/a{}-{name}", self.stage, self.durable.attempt);
            self.durable.files.insert(location.clone(), (content_type.clone(), body));
            Ok(StagedFile::from_host(location, content_type, name))
        }
        .boxed()
    }

    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let location = format!("results/{}/{}", self.durable.attempt, name?);
            self.durable.files.insert(location.clone(), (content_type, body));
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let staged = staged.clone();
        async move {
            let file = self.durable.files.get(staged.location()).cloned().ok_or_else(|| {
                KindError::fatal(PublicMessage::fixed("the staged file is missing"))
            })?;
            let location = format!("results/{}/{}", self.durable.attempt, name_ok(staged.name())?);
            self.durable.files.insert(location.clone(), file);
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn read_staged(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        let read = if self.crashed {
            Err(crash())
        } else {
            self.durable.files.get(staged.location()).map(|(_, body)| body.clone()).ok_or_else(
                || KindError::fatal(PublicMessage::fixed("a staged file of the job is missing")),
            )
        };
        async move { read }.boxed()
    }

    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        let name = name_ok(name);
        let content_type = content_type.to_owned();
        async move {
            let name = name?;
            if self.crashed {
                return Err(crash());
            }
            let attempt = self.durable.attempt;
            self.durable.trace.uploads_begun += 1;
            let ordinal = self.durable.trace.uploads_begun;
            let upload_id = format!("upload-{ordinal}");
            let location = format!("results/{attempt}/{name}");
            self.durable.uploads.insert(
                upload_id.clone(),
                MemoryUpload {
                    ordinal,
                    location: location.clone(),
                    attempt,
                    content_type: content_type.clone(),
                    state: UploadState::Open,
                    parts: BTreeMap::new(),
                    completed_from: Vec::new(),
                },
            );
            Ok(ResultUpload::from_host(location, upload_id, attempt, name, content_type))
        }
        .boxed()
    }

    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        let upload = upload.clone();
        async move {
            let attempt = self.durable.attempt;
            let Some(stored) = self.durable.uploads.get_mut(upload.upload_id()) else {
                return Ok(false);
            };
            if stored.location != upload.location() || stored.attempt != upload.attempt() {
                return Ok(false);
            }
            if stored.attempt != attempt {
                // An earlier attempt's: a zombie of it may still write to it. Aborted.
                if stored.state == UploadState::Open {
                    stored.state = UploadState::Aborted;
                    stored.parts.clear();
                    self.durable.trace.uploads_aborted += 1;
                }
                return Ok(false);
            }
            // Open, or completed already (a completion whose answer was lost): the kind goes
            // on, and completing it again answers the same result.
            Ok(matches!(stored.state, UploadState::Open | UploadState::Completed))
        }
        .boxed()
    }

    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        let upload = upload.clone();
        async move {
            check_part_number(number)?;
            let attempt = self.durable.attempt;
            let stored = self.open_upload(&upload)?;
            let (tag, size) = (etag(&body), body.len() as u64);
            stored.parts.insert(number, (tag.clone(), body));
            let part = PartUploaded { upload: stored.ordinal, attempt, number, size };
            self.durable.trace.parts_uploaded.push(part);
            Ok(UploadedPart::from_host(number, tag, size))
        }
        .boxed()
    }

    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        let upload = upload.clone();
        let parts = parts.to_vec();
        async move {
            check_parts(&parts)?;
            if let Some(done) = self.completed_already(&upload, &parts) {
                return Ok(done);
            }
            let stored = self.open_upload(&upload)?;
            let mut body = Vec::new();
            for part in &parts {
                // What the store has under that number, tagged as the kind says (S3's
                // InvalidPart otherwise); the sizes checked are the stored ones.
                match stored.parts.get(&part.number()) {
                    Some((tag, bytes)) if tag == part.etag() && bytes.len() as u64 == part.size() => {
                        body.extend_from_slice(bytes);
                    }
                    _ => {
                        return Err(KindError::fatal(PublicMessage::fixed(
                            "the job kind completed its result upload with a part that was not uploaded",
                        ))
                        .because(format!("part {}", part.number())));
                    }
                }
            }
            stored.state = UploadState::Completed;
            stored.parts.clear();
            stored.completed_from =
                parts.iter().map(|p| (p.number(), p.etag().to_owned(), p.size())).collect();
            let (location, content_type) = (stored.location.clone(), stored.content_type.clone());
            self.durable.files.insert(location.clone(), (content_type, body));
            self.durable.trace.uploads_completed += 1;
            if self.host.crash_after_completion && self.durable.trace.uploads_completed == 1 {
                self.crashed = true;
                return Err(crash());
            }
            Ok(ResultRef::from_host(location))
        }
        .boxed()
    }

    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.input(input)?;
        Ok(input.rsplit('/').next().unwrap_or(input).to_owned())
    }

    fn pause(
        &mut self,
        _duration: Duration,
        _done: u64,
        _total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        let written = self.write_unless_cancelled();
        async move { written }.boxed()
    }

    fn deadline_near(&self) -> bool {
        let calls = self.deadline_calls.get() + 1;
        self.deadline_calls.set(calls);
        self.cancelled || self.host.deadline_every.is_some_and(|n| calls >= n)
    }

    fn checkpoint_due(&self, items: u64) -> bool {
        self.cancelled || items.saturating_sub(self.checkpoint_base) >= self.host.checkpoint_items
    }

    fn cancelled(&self) -> bool {
        self.cancelled
    }

    fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<crate::Waited, KindError>> {
        // As the stage function refuses them: a bad name fails the job.
        if !crate::is_signal_name(name) || timeout.is_zero() {
            let message = format!("{name:?} is not a signal name, or the wait has no time");
            return async move { Err(KindError::fatal(PublicMessage::domain(message))) }.boxed();
        }
        let waited = match self.host.signals.get(name) {
            Some(Some(payload)) => Some(crate::Waited::Signal(payload.clone())),
            Some(None) => Some(crate::Waited::TimedOut),
            None => None,
        };
        self.durable.trace.waits.push((name.to_owned(), waited.clone()));
        async move { waited.ok_or_else(KindError::paused) }.boxed()
    }

    fn attempt_failures(&self) -> u32 {
        self.durable.failures
    }

    fn record_shards(
        &mut self,
        counts: crate::fan_out::ShardCounts,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        // Held with the progress it would be written with: a crash loses what was not yet.
        let recorded = if self.crashed { Err(crash()) } else { Ok(()) };
        if recorded.is_ok() {
            self.durable.trace.shards.push(counts);
        }
        async move { recorded }.boxed()
    }

    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        async move {
            self.write()?;
            self.durable.failures += 1;
            Ok(())
        }
        .boxed()
    }
}
