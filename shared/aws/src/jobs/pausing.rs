//! An owner's pause and resume of a job.
//!
//! A `pending` or `queued` job pauses at once (`paused` in the same write, its running slot
//! given back by the slots function from the table's stream); a `running` one gets a pause
//! request on its record and a flag on its progress record, which every progress write is
//! conditional on the absence of — its stage learns of it at its next write, saves its final
//! checkpoint and parks the job ([`JobStore::park`]). `resume` moves a paused job back to
//! `pending` (to be dispatched again, a slot taken again) or withdraws a pause that has not
//! taken effect yet.

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::signals::Wait;
use longhaul_domain::{JobStatus, Pause, Timestamp, now_rfc3339};

/// What a pause request did.
#[derive(Debug, Clone, PartialEq)]
pub enum PauseOutcome {
    /// The job was `pending` or `queued`: it is `paused` now.
    Paused(Box<JobRecord>),
    /// The job runs: its stage parks it at its next progress write.
    Requested(Box<JobRecord>),
    /// It is paused, or a pause is asked for, already: the first request stands.
    Already(Box<JobRecord>),
}

/// What a resume did.
#[derive(Debug, Clone, PartialEq)]
pub enum ResumeOutcome {
    /// The paused job is `pending` again, to be dispatched.
    Resumed(Box<JobRecord>),
    /// The running job's pause had not taken effect: it is withdrawn, and the job runs on.
    Withdrawn(Box<JobRecord>),
}

/// `pending | queued → paused` for `pause` (paused at its request), indexed by when it lapses.
/// (`waiting` stays: the slots function takes a job paused while it waited out of the waiting
/// lists by it; the resume removes it.)
pub fn pause_request(job_id: &JobId, pause: &Pause, lapses_at: Timestamp) -> TransitionRequest {
    let paused = Pause { paused_at: Some(pause.requested_at), ..pause.clone() };
    TransitionRequest::new(
        job_id,
        &[JobStatus::Pending, JobStatus::Queued],
        JobStatus::Paused,
        pause.log_reason(),
    )
    .unless_cancelled()
    .set("pause", &paused)
    .indexed_at(lapses_at.to_rfc3339())
}

/// `paused → pending` of `job` as read, resumed by `by` at `now`: the paused time and the
/// resume counted, the pause and any wait for a slot gone (a `retry_at` stays: the dispatcher
/// holds the job until then, as it would have).
pub fn resume_request(job: &JobRecord, why: &str, now: Timestamp) -> TransitionRequest {
    // Only a job that had started counts the time: its runtime counts from `started_at`,
    // which a job paused before it ever ran has yet to get.
    let started = job.started_at.is_some();
    let paused_at = job.pause.as_ref().and_then(|p| p.paused_at).filter(|_| started);
    let paused_for = paused_at.map_or(0, |at| now.since(at).as_secs());
    TransitionRequest::new(&job.job_id, &[JobStatus::Paused], JobStatus::Pending, why)
        .unchanged_since(job.updated_at)
        .set("paused_seconds", job.paused_seconds.saturating_add(paused_for))
        .set("resumes", job.resumes + 1)
        .remove("pause")
        .remove("waiting")
}

/// `running → paused` of `job` as read (its pause asked for), under `lease` at `now`, while a
/// pause is still asked for: the attempt given back, indexed by when the pause lapses. `None`
/// if `job` asks no pause.
pub fn park_request(
    job: &JobRecord,
    lease: &str,
    now: Timestamp,
    lapses_at: Timestamp,
) -> Option<TransitionRequest> {
    let pause = job.pause.as_ref()?;
    Some(
        TransitionRequest::new(
            &job.job_id,
            &[JobStatus::Running],
            JobStatus::Paused,
            pause.log_reason(),
        )
        .fenced(lease)
        .unless_cancelled()
        .requires("pause")
        .set("pause", Pause { paused_at: Some(now), ..pause.clone() })
        .set("attempt", job.attempt.saturating_sub(1))
        .indexed_at(lapses_at.to_rfc3339()),
    )
}

/// `running → paused` of `job` as read, under `lease` at `now`, its stage waiting for `wait`:
/// the attempt given back, indexed by when the wait times out.
pub fn wait_request(
    job: &JobRecord,
    lease: &str,
    wait: &Wait,
    now: Timestamp,
) -> TransitionRequest {
    let pause = Pause {
        requested_at: now,
        requested_by: job.owner.clone(),
        reason: None,
        paused_at: Some(now),
        wait: Some(wait.clone()),
    };
    TransitionRequest::new(
        &job.job_id,
        &[JobStatus::Running],
        JobStatus::Paused,
        pause.log_reason(),
    )
    .fenced(lease)
    .unless_cancelled()
    // An owner's pause that landed since the stage's read parks the job as theirs instead.
    .lacks("pause")
    .set("pause", pause)
    .set("attempt", job.attempt.saturating_sub(1))
    .indexed_at(wait.until.to_rfc3339())
}

impl JobStore {
    /// Parks `job` (as read) `paused` under `lease`, its stage waiting for `wait` (see
    /// [`wait_request`]). Refused if the lease is lost, or its owner asked to cancel or pause
    /// it meanwhile.
    pub async fn park_waiting(
        &self,
        job: &JobRecord,
        lease: &str,
        wait: &Wait,
        now: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        self.transition(wait_request(job, lease, wait, now)).await
    }

    /// Pauses a job for its owner (see the module documentation); `lapses_at` is when a paused
    /// job's pause lapses (the reaper cancels it then): the status index keys it so. A job
    /// being cancelled, or ended, is a conflict carrying the job.
    pub async fn pause(
        &self,
        job_id: &JobId,
        pause: &Pause,
        lapses_at: Timestamp,
    ) -> Result<PauseOutcome, StoreError> {
        let value: AttributeValue =
            serde_dynamo::to_attribute_value(pause).expect("pauses serialise");
        // A running job can turn `queued` between the two writes below (its attempt failed and
        // its next one was scheduled): then the first applies after all. Three rounds are
        // plenty, each needing the job to move between our writes.
        for _ in 0..3 {
            let current = match self.transition(pause_request(job_id, pause, lapses_at)).await {
                Ok(job) => return Ok(PauseOutcome::Paused(Box::new(job))),
                Err(StoreError::Conflict { current: Some(job) }) => job,
                Err(err) => return Err(err),
            };
            match (current.status, &current.pause, &current.cancellation) {
                (_, _, Some(_)) => return Err(StoreError::Conflict { current: Some(current) }),
                (JobStatus::Paused, _, _) => return Ok(PauseOutcome::Already(current)),
                (JobStatus::Running, Some(asked), _) => {
                    self.flag_pause(job_id, asked.requested_at).await?;
                    return Ok(PauseOutcome::Already(current));
                }
                (JobStatus::Running, None, _) => {}
                _ => return Err(StoreError::Conflict { current: Some(current) }),
            }
            let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
            let values = HashMap::from([
                (":running".to_owned(), s(JobStatus::Running.as_str())),
                (":p".to_owned(), value.clone()),
                (":now".to_owned(), s(now_rfc3339())),
            ]);
            let requested = self
                .update_job(
                    job_id,
                    "SET pause = :p, updated_at = :now".into(),
                    "#status = :running AND attribute_not_exists(pause) \
                     AND attribute_not_exists(cancellation)"
                        .into(),
                    names,
                    values,
                )
                .await;
            match requested {
                Ok(job) => {
                    self.flag_pause(job_id, pause.requested_at).await?;
                    return Ok(PauseOutcome::Requested(Box::new(job)));
                }
                // Back to waiting for an attempt: paused as such in the next round.
                Err(StoreError::Conflict { current: Some(job) })
                    if matches!(job.status, JobStatus::Pending | JobStatus::Queued) => {}
                // Another request got there first (or a cancellation): said by the next round.
                Err(StoreError::Conflict { current: Some(job) })
                    if job.status == JobStatus::Running => {}
                Err(err) => return Err(err),
            }
        }
        Err(StoreError::Conflict { current: self.job(job_id).await?.map(Box::new) })
    }

    /// Resumes `job` as read (see the module documentation): `paused → pending`, counting the
    /// time it was paused and the resume, or a pause not yet taken effect withdrawn. Refused
    /// ([`StoreError::Conflict`], with the job as it is) if the job is neither, or was written
    /// since it was read.
    pub async fn resume(
        &self,
        job: &JobRecord,
        why: &str,
        now: Timestamp,
    ) -> Result<ResumeOutcome, StoreError> {
        let job_id = &job.job_id;
        match (job.status, job.pause.as_ref().and_then(|p| p.paused_at)) {
            (JobStatus::Paused, _) => {
                // The flag a running job's pause left goes first, while no stage can run the
                // job: should the transition then fail, the retried resume finds it paused.
                self.unflag_pause(job_id).await?;
                let resumed = self.transition(resume_request(job, why, now)).await?;
                Ok(ResumeOutcome::Resumed(Box::new(resumed)))
            }
            (JobStatus::Running | JobStatus::Queued, None) if job.pause.is_some() => {
                // The flag first: should the second write fail, the stage runs on and a retry
                // of the resume withdraws the request. (A flag a racing pause sets again after
                // this is found stale by the stage, which drops it.)
                self.unflag_pause(job_id).await?;
                let names = HashMap::from([("#status".to_owned(), "status".to_owned())]);
                let values = HashMap::from([
                    (":running".to_owned(), s(JobStatus::Running.as_str())),
                    (":queued".to_owned(), s(JobStatus::Queued.as_str())),
                    (":now".to_owned(), s(now_rfc3339())),
                ]);
                let withdrawn = self
                    .update_job(
                        job_id,
                        "SET updated_at = :now REMOVE pause".into(),
                        "#status IN (:running, :queued) AND attribute_exists(pause) \
                         AND attribute_not_exists(pause.paused_at)"
                            .into(),
                        names,
                        values,
                    )
                    .await?;
                Ok(ResumeOutcome::Withdrawn(Box::new(withdrawn)))
            }
            _ => Err(StoreError::Conflict { current: Some(Box::new(job.clone())) }),
        }
    }

    /// `running → paused` by the stage holding `lease`, which saw the pause request of `job`
    /// (as read after it) and saved its final checkpoint: the attempt is not spent — its next
    /// claim, after the resume, has the same number — and the pause lapses at `lapses_at`.
    /// Refused if the lease is lost, the pause was withdrawn since, or its owner asked to
    /// cancel the job. (Nothing else it writes can have changed under the lease: the attempt is
    /// the lease's, the pause is asked for once.)
    pub async fn park(
        &self,
        job: &JobRecord,
        lease: &str,
        now: Timestamp,
        lapses_at: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        let Some(request) = park_request(job, lease, now, lapses_at) else {
            return Err(StoreError::Conflict { current: Some(Box::new(job.clone())) });
        };
        self.transition(request).await
    }

    /// Sets the pause flag on the running job's progress record (see
    /// [`JobStore::flag_progress`]).
    async fn flag_pause(&self, job_id: &JobId, requested_at: Timestamp) -> Result<(), StoreError> {
        self.flag_progress(job_id, PAUSE_FLAG, Some(requested_at)).await.map(drop)
    }

    /// Removes the pause flag from the job's progress record, if it has one.
    async fn unflag_pause(&self, job_id: &JobId) -> Result<(), StoreError> {
        self.flag_progress(job_id, PAUSE_FLAG, None).await.map(|_| ())
    }

    /// Removes a pause flag nothing asks for any more (its pause was withdrawn, and a racing
    /// request set the flag again after the withdrawal) under `lease`: the stage holding the
    /// job does this when it finds the job record without a pause. Refused (a conflict) once
    /// another lease holds the record.
    pub async fn drop_stale_pause_flag(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<(), StoreError> {
        let dropped = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::progress_key(job_id).into_iter().collect()))
            .update_expression(format!("REMOVE {PAUSE_FLAG}"))
            .condition_expression(
                "attribute_exists(pk) AND (attribute_not_exists(lease) OR lease = :lease)",
            )
            .expression_attribute_values(":lease", s(lease))
            .send()
            .await;
        match dropped {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => {
                Err(StoreError::Conflict { current: None })
            }
            Err(err) => {
                Err(crate::AwsError::new(format!("drop the pause flag of {job_id}"), err).into())
            }
        }
    }
}

/// The progress record's attribute a pause request sets.
const PAUSE_FLAG: &str = "pause_requested_at";
