//! Reading the job table's stream: what its consumers (the notifier, the slots function) share.
//!
//! A job ends in one write of its record; its stream record carries the images before and
//! after. Both consumers act on the same change — a job record moving into `succeeded`,
//! `failed` or `cancelled` from a live status — and report a failure the same way (the record
//! to resume the shard from). The slots function also acts on a move into `paused`.

use aws_lambda_events::dynamodb::EventRecord;
use aws_lambda_events::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use longhaul_domain::JobStatus;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::jobs::JOB_SK;

/// Why a stream record could not be read (no retry would change that).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The stream does not carry old images (it must be `NEW_AND_OLD_IMAGES`): without the
    /// status before the change, an end cannot be told from a later write to an ended job.
    #[error("the stream record has no old image; the table's stream must be NEW_AND_OLD_IMAGES")]
    NoOldImage,
    /// The job record's image is not one this version reads.
    #[error("the job record's image cannot be read: {0}")]
    Unreadable(#[from] serde_dynamo::Error),
}

/// The status of an image.
#[derive(Debug, Deserialize)]
struct StatusImage {
    status: JobStatus,
}

/// The job's new image, read as `T`, if `record` is a job record moving into `succeeded`,
/// `failed` or `cancelled` from a live status; `None` for every other change of the table
/// (event source mappings filter those out; this check does not depend on it).
pub fn job_end<T: DeserializeOwned>(record: &EventRecord) -> Result<Option<T>, RecordError> {
    job_moved(record, |status| {
        matches!(status, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    })
}

/// The job's new image, read as `T`, if `record` is a job record moving into `paused` (its
/// owner paused it: it gives back its slots); `None` for every other change.
pub fn job_paused<T: DeserializeOwned>(record: &EventRecord) -> Result<Option<T>, RecordError> {
    job_moved(record, |status| status == JobStatus::Paused)
}

/// The job's new image, if `record` is a job record moving into a status `into` holds of
/// from one it does not hold of and that is not terminal.
fn job_moved<T: DeserializeOwned>(
    record: &EventRecord,
    into: impl Fn(JobStatus) -> bool,
) -> Result<Option<T>, RecordError> {
    let change = &record.change;
    let is_job_record = change
        .keys
        .get("sk")
        .is_some_and(|sk| sk == &serde_dynamo::AttributeValue::S(JOB_SK.to_owned()));
    if record.event_name != "MODIFY" || !is_job_record {
        return Ok(None);
    }
    let new: StatusImage = serde_dynamo::from_item(change.new_image.clone())?;
    if !into(new.status) {
        return Ok(None);
    }
    if change.old_image.is_empty() {
        return Err(RecordError::NoOldImage);
    }
    let old: StatusImage = serde_dynamo::from_item(change.old_image.clone())?;
    if old.status.is_terminal() || into(old.status) {
        return Ok(None);
    }
    Ok(Some(serde_dynamo::from_item(change.new_image.clone())?))
}

/// The response that makes Lambda retry the shard from `record` on.
pub fn failure_at(record: &EventRecord) -> DynamoDbEventResponse {
    let mut failure = DynamoDbBatchItemFailure::default();
    failure.item_identifier = record.change.sequence_number.clone();
    let mut response = DynamoDbEventResponse::default();
    response.batch_item_failures.push(failure);
    response
}
