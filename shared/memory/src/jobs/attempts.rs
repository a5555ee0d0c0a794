//! An attempt's writes in memory ([`JobAttempts`]): the claim and its hand-over of the progress
//! record, the lease-fenced progress writes, and the fenced counters and marks — each decided
//! under the table's one lock with the DynamoDB adapter's conditions, refusing as it does.

use super::*;

use longhaul_aws::jobs::{FinalCheckpoint, JobView, Lease, ProgressRefused};
use longhaul_aws::ports::JobAttempts;
use longhaul_domain::JobId;

/// A fresh fencing token: 32 random hex digits, as the AWS adapter mints them.
fn new_token() -> String {
    JobId::new().as_str().replace('-', "")
}

impl Table {
    /// The claim's write: `queued → running` only for the execution the job was last
    /// dispatched to, counting the attempt, stamping the first start, leaving the backlog and
    /// a backoff's `retry_at`, entering the running index — all in one write.
    fn claim_update(
        &mut self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<JobRecord, StoreError> {
        let Some(job) = self.jobs.get(job_id) else { return Err(conflict(None)) };
        if job.status != JobStatus::Queued || job.execution.as_deref() != Some(execution) {
            return Err(conflict(Some(job)));
        }
        let request = TransitionRequest::new(
            job_id,
            &[JobStatus::Queued],
            JobStatus::Running,
            "claimed by a stage",
        )
        .set("lease", new_token())
        .set("attempt", job.attempt + 1)
        .remove("retry_at");
        let request = match claimant {
            Some(claimant) => request.set("claimant", claimant),
            // An execution's claim: the job is its alone, whatever run held an earlier attempt.
            None => request.remove("claimant"),
        };
        let mut claimed = self.transition(request)?;
        if claimed.started_at.is_none() {
            claimed.started_at = Some(claimed.updated_at);
            self.jobs.insert(job_id.to_owned(), claimed.clone());
        }
        Ok(claimed)
    }

    /// Hands the progress record to `lease` (creating it if there is none), keeping its stage,
    /// counts, checkpoint pointer and any cancellation or pause flag; refused, with the job
    /// record, if a later attempt holds it.
    fn take_progress(
        &mut self,
        job_id: &JobId,
        lease: &Lease,
    ) -> Result<ProgressRecord, StoreError> {
        let now = Timestamp::now();
        // A new record starts as the hand-over's `if_not_exists` writes it: nothing done.
        let progress = self.progress.entry(job_id.to_owned()).or_default();
        if progress.attempt.is_some_and(|held| held > lease.attempt) {
            return Err(conflict(self.jobs.get(job_id)));
        }
        progress.lease = lease.token.clone();
        progress.attempt = Some(lease.attempt);
        progress.heartbeat_at = now;
        progress.updated_at = now;
        progress.progress_changed_at = Some(now);
        Ok(progress.clone())
    }

    /// An update of a running job's record under `lease`, applied only if `also` holds too;
    /// refused with the record as it is.
    fn update_fenced(
        &mut self,
        job_id: &JobId,
        lease: &str,
        also: impl FnOnce(&JobRecord) -> bool,
        update: impl FnOnce(&mut JobRecord),
    ) -> Result<JobRecord, StoreError> {
        let Some(job) = self.jobs.get_mut(job_id) else { return Err(conflict(None)) };
        if job.status != JobStatus::Running || job.lease.as_deref() != Some(lease) || !also(job) {
            return Err(conflict(Some(job)));
        }
        update(job);
        Ok(job.clone())
    }

    /// Adds one to a running job's counter (fenced), stamping the change.
    fn count_fenced(
        &mut self,
        job_id: &JobId,
        lease: &str,
        counter: impl FnOnce(&mut JobRecord) -> &mut u32,
    ) -> Result<JobRecord, StoreError> {
        self.update_fenced(
            job_id,
            lease,
            |_| true,
            |job| {
                *counter(job) += 1;
                job.updated_at = Timestamp::now();
            },
        )
    }
}

#[async_trait]
impl JobAttempts for MemoryJobStore {
    async fn claim_as(
        &self,
        job_id: &JobId,
        execution: &str,
        claimant: Option<&str>,
    ) -> Result<(Lease, JobView), StoreError> {
        self.check("claim job")?;
        let mut table = self.lock();
        match table.claim_update(job_id, execution, claimant) {
            // The first claim: no record to hand over (the attempt's first write makes it).
            Ok(job) if job.is_first_claim() => {
                let lease =
                    Lease { attempt: job.attempt, token: job.lease.clone().unwrap_or_default() };
                Ok((lease, JobView { job, progress: None }))
            }
            Ok(job) => {
                let lease =
                    Lease { attempt: job.attempt, token: job.lease.clone().unwrap_or_default() };
                let progress = table.take_progress(job_id, &lease)?;
                Ok((lease, JobView { job, progress: Some(progress) }))
            }
            // This execution holds the job already (the claim's answer was lost): its lease
            // again, and the hand-over again.
            Err(StoreError::Conflict { current: Some(job) })
                if job.holds_claim(execution, claimant) =>
            {
                let lease =
                    Lease { attempt: job.attempt, token: job.lease.clone().unwrap_or_default() };
                let progress = table.take_progress(job_id, &lease)?;
                Ok((lease, JobView { job: *job, progress: Some(progress) }))
            }
            Err(err) => Err(err),
        }
    }

    async fn record_progress(
        &self,
        job_id: &JobId,
        progress: &ProgressRecord,
    ) -> Result<(), ProgressRefused> {
        self.check("write progress").map_err(ProgressRefused::Store)?;
        let mut table = self.lock();
        // `(attribute_not_exists(lease) OR lease = :lease) AND (attribute_not_exists(seq) OR
        // seq < :seq)`, and no request the write does not carry.
        let current = table.progress.get(job_id);
        match current {
            None => {}
            Some(p)
                if (p.lease == progress.lease || p.lease.is_empty())
                    && p.seq < progress.seq
                    && p.cancel_requested_at.is_none()
                    && (p.pause_requested_at.is_none()
                        || progress.pause_requested_at.is_some()) => {}
            Some(p) => return Err(ProgressRefused::of(Some(p), &progress.lease)),
        }
        table.progress.insert(job_id.to_owned(), progress.clone());
        Ok(())
    }

    async fn record_final_checkpoint(
        &self,
        job_id: &JobId,
        lease: &str,
        checkpoint: FinalCheckpoint<'_>,
    ) -> Result<(), ProgressRefused> {
        self.check("record the final checkpoint").map_err(ProgressRefused::Store)?;
        let FinalCheckpoint { seq, stage, stage_index, checkpoint_key, items_done } = checkpoint;
        let mut table = self.lock();
        // A first claim's attempt may not have made its record yet: this write makes it.
        let p = table.progress.entry(job_id.to_owned()).or_default();
        match p {
            p if (p.lease == lease || p.lease.is_empty())
                && p.seq < seq
                && p.stage_index <= stage_index =>
            {
                p.lease = lease.to_owned();
                p.checkpoint_key = Some(checkpoint_key.to_owned());
                p.seq = seq;
                p.items_done = items_done;
                p.updated_at = Timestamp::now();
                p.stage = stage.to_owned();
                p.stage_index = stage_index;
                Ok(())
            }
            _ => Err(ProgressRefused::LeaseLost),
        }
    }

    async fn revoke_progress(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        self.check("revoke progress")?;
        let mut table = self.lock();
        // A record no attempt holds (or none yet: a first claim's attempt that never wrote
        // one) is revoked too, so that the attempt's first write is refused.
        let p = table.progress.entry(job_id.to_owned()).or_default();
        if p.lease == lease || p.lease.is_empty() {
            p.lease = format!("revoked:{lease}");
        }
        Ok(())
    }

    async fn forget_resume(&self, job_id: &JobId, lease: &str) -> Result<(), StoreError> {
        self.check("forget resume")?;
        let result = self.lock().update_fenced(
            job_id,
            lease,
            |job| job.resumed_from.is_some(),
            |job| job.resumed_from = None,
        );
        match result {
            Ok(_) => Ok(()),
            // Already said (an earlier invocation of the attempt took it back).
            Err(StoreError::Conflict { current: Some(job) })
                if job.resumed_from.is_none()
                    && job.status == JobStatus::Running
                    && job.lease.as_deref() == Some(lease) =>
            {
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    async fn count_continuation(&self, job_id: &JobId, lease: &str) -> Result<u32, StoreError> {
        self.check("count continuation")?;
        let job = self.lock().count_fenced(job_id, lease, |job| &mut job.continuations)?;
        Ok(job.continuations)
    }

    async fn record_execution(
        &self,
        job_id: &JobId,
        lease: &str,
        name: &str,
    ) -> Result<JobRecord, StoreError> {
        self.check("record execution")?;
        self.lock().update_fenced(
            job_id,
            lease,
            |_| true,
            |job| {
                job.execution = Some(name.to_owned());
                job.claimant = None;
                job.updated_at = Timestamp::now();
            },
        )
    }

    async fn count_injected_failure(
        &self,
        job_id: &JobId,
        lease: &str,
    ) -> Result<JobRecord, StoreError> {
        self.check("count injected failure")?;
        self.lock().count_fenced(job_id, lease, |job| &mut job.injected_failures)
    }
}
