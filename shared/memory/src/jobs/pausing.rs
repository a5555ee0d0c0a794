//! An owner's pause and resume in memory ([`JobPausing`]): each decided under the table's one
//! lock with the DynamoDB adapter's conditions — the very transition requests it writes
//! (`pause_request`, `resume_request`, `park_request`) — refusing as it does with the record as
//! it is.

use super::*;

use longhaul_aws::jobs::{
    PauseOutcome, ResumeOutcome, park_request, pause_request, resume_request, wait_request,
};
use longhaul_aws::ports::JobPausing;
use longhaul_domain::Pause;
use longhaul_domain::signals::Wait;

impl Table {
    /// Sets (or, `None`, removes) the pause flag of the job's progress record (a flag already
    /// set keeps its time). Setting it makes the record, under no lease, if a first claim's
    /// attempt has not made it yet.
    fn flag_pause(&mut self, job_id: &JobId, at: Option<Timestamp>) {
        let progress = match at {
            Some(_) => Some(self.progress.entry(job_id.to_owned()).or_default()),
            None => self.progress.get_mut(job_id),
        };
        if let Some(progress) = progress {
            progress.pause_requested_at = at.and(progress.pause_requested_at).or(at);
        }
    }
}

#[async_trait]
impl JobPausing for MemoryJobStore {
    async fn pause(
        &self,
        job_id: &JobId,
        pause: &Pause,
        lapses_at: Timestamp,
    ) -> Result<PauseOutcome, StoreError> {
        self.check("pause job")?;
        let mut table = self.lock();
        let current = match table.transition(pause_request(job_id, pause, lapses_at)) {
            Ok(job) => return Ok(PauseOutcome::Paused(Box::new(job))),
            Err(StoreError::Conflict { current: Some(job) }) => job,
            Err(err) => return Err(err),
        };
        match (current.status, &current.pause, &current.cancellation) {
            (_, _, Some(_)) => Err(StoreError::Conflict { current: Some(current) }),
            (JobStatus::Paused, _, _) => Ok(PauseOutcome::Already(current)),
            (JobStatus::Running, Some(asked), _) => {
                let at = asked.requested_at;
                table.flag_pause(job_id, Some(at));
                Ok(PauseOutcome::Already(current))
            }
            (JobStatus::Running, None, _) => {
                let job = table.update_when(
                    job_id,
                    |_| true,
                    |job| {
                        job.pause = Some(pause.clone());
                        job.updated_at = Timestamp::now();
                    },
                )?;
                table.flag_pause(job_id, Some(pause.requested_at));
                Ok(PauseOutcome::Requested(Box::new(job)))
            }
            _ => Err(StoreError::Conflict { current: Some(current) }),
        }
    }

    async fn resume(
        &self,
        job: &JobRecord,
        why: &str,
        now: Timestamp,
    ) -> Result<ResumeOutcome, StoreError> {
        self.check("resume job")?;
        let mut table = self.lock();
        match (job.status, job.pause.as_ref().and_then(|p| p.paused_at)) {
            (JobStatus::Paused, _) => {
                let resumed = table.transition(resume_request(job, why, now))?;
                table.flag_pause(&job.job_id, None);
                Ok(ResumeOutcome::Resumed(Box::new(resumed)))
            }
            (JobStatus::Running | JobStatus::Queued, None) if job.pause.is_some() => {
                let withdrawn = table.update_when(
                    &job.job_id,
                    |current| {
                        matches!(current.status, JobStatus::Running | JobStatus::Queued)
                            && current.pause.as_ref().is_some_and(|p| p.paused_at.is_none())
                    },
                    |current| {
                        current.pause = None;
                        current.updated_at = now;
                    },
                )?;
                table.flag_pause(&job.job_id, None);
                Ok(ResumeOutcome::Withdrawn(Box::new(withdrawn)))
            }
            _ => Err(StoreError::Conflict { current: Some(Box::new(job.clone())) }),
        }
    }

    async fn drop_stale_pause_flag(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        self.check("drop a pause flag")?;
        let mut table = self.lock();
        match table.progress.get_mut(job_id) {
            Some(progress) if progress.lease == lease || progress.lease.is_empty() => {
                progress.pause_requested_at = None;
                Ok(())
            }
            _ => Err(StoreError::Conflict { current: None }),
        }
    }

    async fn park_waiting(
        &self,
        job: &JobRecord,
        lease: &str,
        wait: &Wait,
        now: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        self.check("park job")?;
        self.lock().transition(wait_request(job, lease, wait, now))
    }

    async fn park(
        &self,
        job: &JobRecord,
        lease: &str,
        now: Timestamp,
        lapses_at: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        self.check("park job")?;
        let Some(request) = park_request(job, lease, now, lapses_at) else {
            return Err(StoreError::Conflict { current: Some(Box::new(job.clone())) });
        };
        self.lock().transition(request)
    }
}
