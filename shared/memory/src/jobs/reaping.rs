//! The reaper's moves in memory ([`JobReaping`]): each decided under the table's one lock
//! with the DynamoDB adapter's condition (`attribute_exists(pk) AND …`), refusing as it does
//! with the record as it is, and moving the status-index entry as its `gsi2sk` write does (the
//! sort key only, in the bucket the entry is in).

use super::*;
use longhaul_domain::JobId;

use longhaul_aws::ports::JobReaping;

impl Table {
    /// An update of a job record applied only if `holds` holds of it (and the record exists);
    /// refused with the record as it is. The record afterwards.
    pub(super) fn update_when(
        &mut self,
        job_id: &JobId,
        holds: impl FnOnce(&JobRecord) -> bool,
        update: impl FnOnce(&mut JobRecord),
    ) -> Result<JobRecord, StoreError> {
        let Some(job) = self.jobs.get_mut(job_id) else { return Err(conflict(None)) };
        if !holds(job) {
            return Err(conflict(Some(job)));
        }
        update(job);
        Ok(job.clone())
    }
}

#[async_trait]
impl JobReaping for MemoryJobStore {
    async fn count_enqueue(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        self.check(&format!("update job {job_id}"))?;
        let mut table = self.lock();
        // `SET updated_at = :now, gsi2sk = :look ADD enqueues :one`, if `#status = :pending`.
        let job = table.update_when(
            job_id,
            |job| job.status == JobStatus::Pending,
            |job| {
                job.enqueues += 1;
                job.updated_at = Timestamp::now();
            },
        )?;
        table.index.resorted(job_id, &next_look.to_rfc3339());
        Ok(job)
    }

    async fn defer_pending_look(
        &self,
        job_id: &JobId,
        next_look: Timestamp,
    ) -> Result<(), StoreError> {
        self.check(&format!("update job {job_id}"))?;
        let mut table = self.lock();
        // `SET gsi2sk = :look`, if `#status = :pending`.
        table.update_when(job_id, |job| job.status == JobStatus::Pending, |_| {})?;
        table.index.resorted(job_id, &next_look.to_rfc3339());
        Ok(())
    }

    async fn redispatch_queued(
        &self,
        job_id: &JobId,
        seen_dispatches: u32,
        execution: &str,
    ) -> Result<JobRecord, StoreError> {
        self.check(&format!("update job {job_id}"))?;
        let now = Timestamp::now();
        let mut table = self.lock();
        // `#status = :queued AND dispatches = :seen` (with `attribute_not_exists(dispatches)`
        // also for 0: a record without a count reads as 0 here).
        let job = table.update_when(
            job_id,
            |job| job.status == JobStatus::Queued && job.dispatches == seen_dispatches,
            |job| {
                job.execution = Some(execution.to_owned());
                job.dispatches = seen_dispatches + 1;
                job.updated_at = now;
            },
        )?;
        table.index.resorted(job_id, &now.to_rfc3339());
        Ok(job)
    }

    async fn mark_stalled(
        &self,
        job_id: &JobId,
        lease: &str,
        stalled_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.check(&format!("update job {job_id}"))?;
        // `#status = :running AND #lease = :lease AND attribute_not_exists(stalled_at)` to set
        // it (`SET stalled_at = :at`), `… AND attribute_exists(stalled_at)` to clear it.
        let fenced = |job: &JobRecord| {
            job.status == JobStatus::Running
                && job.lease.as_deref() == Some(lease)
                && job.stalled_at.is_some() != stalled_at.is_some()
        };
        self.lock().update_when(job_id, fenced, |job| job.stalled_at = stalled_at)?;
        Ok(())
    }

    async fn progress_records(
        &self,
        job_ids: &[JobId],
    ) -> Result<HashMap<JobId, ProgressRecord>, StoreError> {
        self.check("read a batch of progress records")?;
        let table = self.lock();
        Ok(job_ids
            .iter()
            .filter_map(|id| Some((id.clone(), table.progress.get(id)?.clone())))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_job_store_keeps_the_reaping_contract() {
        crate::contract::job_reaping(&MemoryJobStore::new()).await;
    }
}
