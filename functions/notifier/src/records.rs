//! What a stream record is to the notifier: a job's end, a progress change, or neither.

use aws_lambda_events::dynamodb::EventRecord;
use longhaul_aws::jobs::PROGRESS_SK;
use longhaul_aws::streams::{RecordError, job_end};
use longhaul_domain::{JobId, JobStatus, Owner, Timestamp};
use serde::Deserialize;

/// A change of the job table the notifier acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A job moved into a terminal status.
    Ended(Ended),
    /// A job's progress changed.
    Progressed(Progressed),
}

impl Change {
    /// The job.
    pub fn job_id(&self) -> &JobId {
        match self {
            Change::Ended(ended) => &ended.job_id,
            Change::Progressed(progressed) => &progressed.job_id,
        }
    }

    /// The job's owner, whose endpoints hear of it.
    pub fn owner(&self) -> &Owner {
        match self {
            Change::Ended(ended) => &ended.owner,
            Change::Progressed(progressed) => &progressed.owner,
        }
    }

    /// The job's attempt (for the log lines about it): the one it ended in, or the one whose
    /// progress changed (`None` on a progress record that names none).
    pub fn attempt(&self) -> Option<u32> {
        match self {
            Change::Ended(ended) => Some(ended.attempt),
            Change::Progressed(progressed) => progressed.attempt,
        }
    }
}

/// A job's end, read from its record's stream record.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Ended {
    /// The job.
    pub job_id: JobId,
    /// Its owner.
    pub owner: Owner,
    /// The terminal status it moved into.
    pub status: JobStatus,
    /// Its attempt when it ended (for the log lines about it).
    pub attempt: u32,
    /// Whether it has a `callback_url` (which receives its terminal event).
    #[serde(default, rename = "callback_url", deserialize_with = "present")]
    pub callback: bool,
}

/// A job's progress change, read from its progress record's stream record.
#[derive(Debug, Clone, PartialEq)]
pub struct Progressed {
    /// The job.
    pub job_id: JobId,
    /// Its owner.
    pub owner: Owner,
    /// The attempt whose progress changed.
    pub attempt: Option<u32>,
}

fn present<'de, D: serde::Deserializer<'de>>(input: D) -> Result<bool, D::Error> {
    Ok(Option::<String>::deserialize(input)?.is_some())
}

/// The fields of a progress record's image this function reads.
#[derive(Debug, Deserialize)]
struct ProgressImage {
    #[serde(default)]
    owner: Option<Owner>,
    #[serde(default)]
    attempt: Option<u32>,
    #[serde(default)]
    progress_changed_at: Option<Timestamp>,
}

/// Reads one stream record: a job record moving into a terminal status, a progress record
/// whose progress changed (heartbeats alone change nothing), or `None` for every other change
/// of the table. The event source mapping's filter passes only the first two; this check does
/// not depend on it.
pub fn change(record: &EventRecord) -> Result<Option<Change>, RecordError> {
    if let Some(ended) = job_end::<Ended>(record)? {
        return Ok(Some(Change::Ended(ended)));
    }
    let change = &record.change;
    let is_progress = change
        .keys
        .get("sk")
        .is_some_and(|sk| sk == &serde_dynamo::AttributeValue::S(PROGRESS_SK.to_owned()));
    if !is_progress || !matches!(record.event_name.as_str(), "INSERT" | "MODIFY") {
        return Ok(None);
    }
    let new: ProgressImage = serde_dynamo::from_item(change.new_image.clone())?;
    let Some(owner) = new.owner else { return Ok(None) };
    if record.event_name == "MODIFY" {
        if change.old_image.is_empty() {
            return Err(RecordError::NoOldImage);
        }
        let old: ProgressImage = serde_dynamo::from_item(change.old_image.clone())?;
        if old.progress_changed_at == new.progress_changed_at {
            return Ok(None);
        }
    }
    let job_id = match change.keys.get("pk") {
        Some(serde_dynamo::AttributeValue::S(pk)) => {
            pk.strip_prefix("JOB#").and_then(|id| id.parse().ok())
        }
        _ => None,
    };
    let Some(job_id) = job_id else {
        return Err(RecordError::Unreadable(serde::de::Error::custom(
            "a progress record's key is not JOB#<job id>",
        )));
    };
    Ok(Some(Change::Progressed(Progressed { job_id, owner, attempt: new.attempt })))
}
