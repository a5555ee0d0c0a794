//! A compensating job's progress through its undos: each step's outcome written as it happens,
//! while the job is `compensating` (the move into `compensating` and out of it are
//! [`TransitionRequest`]s).

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use longhaul_domain::compensation::Compensation;
use longhaul_domain::{JobStatus, Timestamp};

impl JobStore {
    /// Writes `compensation` on the job while it is `compensating` and its stored revision is
    /// the one before `compensation.revision` (what the writer read, bumped), indexed (for the
    /// reaper) under `due`: when its worker should next have been heard of. Refused
    /// ([`StoreError::Conflict`]) once the job has moved on, or another writer wrote first.
    pub async fn record_compensation(
        &self,
        job_id: &JobId,
        compensation: &Compensation,
        due: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        let names = HashMap::from([
            ("#status".to_owned(), "status".to_owned()),
            ("#c".to_owned(), "compensation".to_owned()),
            ("#rev".to_owned(), "revision".to_owned()),
        ]);
        let read = compensation.revision.saturating_sub(1);
        let values = HashMap::from([
            (":compensating".to_owned(), s(JobStatus::Compensating.as_str())),
            (":read".to_owned(), AttributeValue::N(read.to_string())),
            (
                ":c".to_owned(),
                attribute_value(
                    serde_json::to_value(compensation).expect("compensations serialise"),
                ),
            ),
            (":now".to_owned(), s(Timestamp::now().to_rfc3339())),
            (":due".to_owned(), s(due.to_rfc3339())),
        ]);
        self.update_job(
            job_id,
            "SET #c = :c, updated_at = :now, gsi2sk = :due".into(),
            // A record written without a revision reads as revision 0 (as serde reads it).
            if read == 0 {
                "#status = :compensating AND (attribute_not_exists(#c.#rev) OR #c.#rev = :read)"
            } else {
                "#status = :compensating AND #c.#rev = :read"
            }
            .into(),
            names,
            values,
        )
        .await
    }
}

/// How long a compensating job's worker may go unheard of before the reaper dispatches its
/// compensation again: the longest a Lambda invocation runs (an undo under way), with room.
pub const COMPENSATION_SILENCE: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// `from → compensating` of `job_id` at `now`, to end as `ending` says once its undos ran:
/// indexed (for the reaper) under when its worker should have been heard of.
pub fn compensation_request(
    job_id: &JobId,
    from: &[JobStatus],
    ending: longhaul_domain::compensation::Ending,
    now: Timestamp,
) -> TransitionRequest {
    let reason = format!("undoing its stages, then {}: {}", ending.status, ending.reason);
    let due = now.as_datetime()
        + chrono::Duration::from_std(COMPENSATION_SILENCE).expect("a short duration");
    TransitionRequest::new(job_id, from, JobStatus::Compensating, reason)
        .set("compensation", Compensation::begin(ending, now))
        .indexed_at(longhaul_domain::format_rfc3339(due))
}
