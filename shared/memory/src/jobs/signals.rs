//! A job's signals in memory ([`JobSignals`]): each name recorded once, as the DynamoDB
//! adapter's conditional put records it.

use super::*;

use longhaul_aws::jobs::SignalRecord;
use longhaul_aws::ports::JobSignals;
use longhaul_domain::signals::SignalName;

#[async_trait]
impl JobSignals for MemoryJobStore {
    async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.check("record a signal")?;
        let record = SignalRecord::Received { payload: payload.clone(), at };
        Ok(self.lock().record_signal(job_id, name, record))
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
