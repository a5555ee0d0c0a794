//! A job's signals (`SIGNALS#<job>` / `SIGNAL#<name>`): each name received once — its payload,
//! or that the wait for it timed out — with the TTL of the job's records. Apart from the job's
//! own partition, so a job's view (one query of its partition) never reads a payload.

use super::*;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::Timestamp;
use longhaul_domain::signals::SignalName;

use crate::AwsError;

/// What became of a signal name of a job.
#[derive(Debug, Clone, PartialEq)]
pub enum SignalRecord {
    /// The signal came, with this payload.
    Received {
        /// What the sender sent.
        payload: serde_json::Value,
        /// When.
        at: Timestamp,
    },
    /// The wait for it timed out first.
    TimedOut {
        /// When.
        at: Timestamp,
    },
}

fn signal_key(job_id: &JobId, name: &SignalName) -> HashMap<String, AttributeValue> {
    HashMap::from([
        ("pk".to_owned(), s(format!("SIGNALS#{job_id}"))),
        ("sk".to_owned(), s(format!("SIGNAL#{name}"))),
    ])
}

impl JobStore {
    /// Keeps signal `name` of job `job_id` with `payload`, received `at`, unless the name has a
    /// record already (a signal, or a timed-out wait): whether it was kept.
    pub async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(payload).expect("JSON values serialise");
        self.put_signal_record(job_id, name, Some(text), at).await
    }

    /// Records that the wait for signal `name` of job `job_id` timed out `at`, unless the
    /// signal came first: whether it was recorded.
    pub async fn time_out_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.put_signal_record(job_id, name, None, at).await
    }

    async fn put_signal_record(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: Option<String>,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut item = signal_key(job_id, name);
        item.insert("at".into(), s(at.to_rfc3339()));
        // Kept past the longest wait a job could still start (a signal may come long before),
        // and then as long as the job's records.
        let keep =
            self.retention.0 + Duration::from_secs(longhaul_domain::signals::MAX_WAIT_SECONDS);
        let expires = chrono::Utc::now() + chrono::Duration::from_std(keep).unwrap_or_default();
        item.insert("expires_at".into(), AttributeValue::N(expires.timestamp().to_string()));
        match payload {
            Some(text) => item.insert("payload".into(), s(text)),
            None => item.insert("timed_out".into(), AttributeValue::Bool(true)),
        };
        self.put_if_absent(item, &format!("signal {name} of {job_id}")).await
    }

    /// What became of signal `name` of job `job_id`, if anything (a strongly consistent read).
    pub async fn signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
    ) -> Result<Option<SignalRecord>, StoreError> {
        let read = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(signal_key(job_id, name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read signal {name} of {job_id}"), e))?;
        let Some(item) = read.item else { return Ok(None) };
        let corrupt = |reason: &str| StoreError::Corrupt {
            key: format!("SIGNALS#{job_id}/SIGNAL#{name}"),
            reason: reason.to_owned(),
        };
        let at = item
            .get("at")
            .and_then(|v| v.as_s().ok())
            .and_then(|v| v.parse::<Timestamp>().ok())
            .ok_or_else(|| corrupt("no time"))?;
        match item.get("payload").and_then(|v| v.as_s().ok()) {
            Some(text) => {
                let payload = serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
                Ok(Some(SignalRecord::Received { payload, at }))
            }
            None => Ok(Some(SignalRecord::TimedOut { at })),
        }
    }
}
