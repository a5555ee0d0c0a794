//! A compensating job's undos in memory ([`JobCompensation`]), as the DynamoDB adapter's
//! conditional update writes them.

use super::*;

use longhaul_aws::ports::JobCompensation;
use longhaul_domain::compensation::Compensation;

#[async_trait]
impl JobCompensation for MemoryJobStore {
    async fn record_compensation(
        &self,
        job_id: &JobId,
        compensation: &Compensation,
        due: Timestamp,
    ) -> Result<JobRecord, StoreError> {
        self.check("record a compensation")?;
        let mut table = self.lock();
        let Some(job) = table.jobs.get_mut(job_id) else { return Err(conflict(None)) };
        let read = compensation.revision.saturating_sub(1);
        let stored = job.compensation.as_ref().map(|c| c.revision);
        if job.status != JobStatus::Compensating || stored != Some(read) {
            return Err(conflict(Some(job)));
        }
        job.compensation = Some(compensation.clone());
        job.updated_at = Timestamp::now();
        let job = job.clone();
        table.index.resorted(job_id, &due.to_rfc3339());
        Ok(job)
    }
}
