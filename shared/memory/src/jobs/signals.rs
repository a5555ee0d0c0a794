//! A job's signals in memory ([`JobSignals`]): each name recorded once, as the DynamoDB
//! adapter's conditional put records it.

use super::*;

use longhaul_aws::jobs::{SignalKept, SignalRecord};
use longhaul_aws::ports::JobSignals;
use longhaul_domain::signals::{MAX_SIGNALS_PER_JOB, SignalName};

#[async_trait]
impl JobSignals for MemoryJobStore {
    async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<SignalKept, StoreError> {
        self.check("record a signal")?;
        let mut table = self.lock();
        if !table.jobs.contains_key(job_id) {
            return Err(StoreError::Conflict { current: None });
        }
        let kept = table.signals_kept.entry(job_id.clone()).or_default();
        if *kept >= MAX_SIGNALS_PER_JOB {
            let taken = table.signals.contains_key(&(job_id.clone(), name.clone()));
            return Ok(if taken { SignalKept::Taken } else { SignalKept::Full });
        }
        *kept += 1;
        let record = SignalRecord::Received { payload: payload.clone(), at };
        if table.record_signal(job_id, name, record) {
            return Ok(SignalKept::Kept);
        }
        *table.signals_kept.entry(job_id.clone()).or_default() -= 1;
        Ok(SignalKept::Taken)
    }

    async fn time_out_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.check("record a signal")?;
        Ok(self.lock().record_signal(job_id, name, SignalRecord::TimedOut { at }))
    }

    async fn signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
    ) -> Result<Option<SignalRecord>, StoreError> {
        self.check("read a signal")?;
        Ok(self.lock().signals.get(&(job_id.clone(), name.clone())).cloned())
    }
}

impl Table {
    /// Records `record` for signal `name` of `job_id` unless the name has one: whether it did.
    fn record_signal(&mut self, job_id: &JobId, name: &SignalName, record: SignalRecord) -> bool {
        match self.signals.entry((job_id.clone(), name.clone())) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(record);
                true
            }
        }
    }
}
