//! A job's signals (`SIGNALS#<job>` / `SIGNAL#<name>`): each name received once — its payload,
//! or that the wait for it timed out — with the TTL of the job's records. Apart from the job's
//! own partition, so a job's view (one query of its partition) never reads a payload.

use super::*;

use aws_sdk_dynamodb::types::AttributeValue;
use longhaul_domain::Timestamp;
use longhaul_domain::signals::{MAX_SIGNALS_PER_JOB, SignalName};

use crate::AwsError;

/// What a signal sent to a job came to ([`JobStore::put_signal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKept {
    /// Kept: the first signal of its name.
    Kept,
    /// Not kept: the name has a record already (a signal, or a timed-out wait), also when
    /// the job keeps as many signals as it may.
    Taken,
    /// Not kept: the job keeps [`MAX_SIGNALS_PER_JOB`] signals already, none of this name.
    Full,
}

/// The job record's count of the signals kept for it ([`MAX_SIGNALS_PER_JOB`]).
const SIGNALS_KEPT: &str = "signals_kept";

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
    /// record already (a signal, or a timed-out wait) or the job keeps
    /// [`MAX_SIGNALS_PER_JOB`] signals. The job record counts them: the count is taken first
    /// (on condition that it is below the bound) and given back when the name was taken, so
    /// the bound holds whatever the order of concurrent senders. A job that does not exist
    /// is a [`StoreError::Conflict`].
    pub async fn put_signal(
        &self,
        job_id: &JobId,
        name: &SignalName,
        payload: &serde_json::Value,
        at: Timestamp,
    ) -> Result<SignalKept, StoreError> {
        if !self.count_signal(job_id, 1).await? {
            if self.signal(job_id, name).await?.is_some() {
                return Ok(SignalKept::Taken);
            }
            return match self.job(job_id).await? {
                Some(_) => Ok(SignalKept::Full),
                None => Err(StoreError::Conflict { current: None }),
            };
        }
        let text = serde_json::to_string(payload).expect("JSON values serialise");
        let put = self.put_signal_record(job_id, name, Some(text), at).await;
        if let Ok(true) = put {
            return Ok(SignalKept::Kept);
        }
        // Not kept (the name was taken, or the put failed): the count goes back. If even that
        // fails (or the invocation dies first), the count stays one high: the job keeps one
        // signal fewer than it may, which is logged.
        if let Err(err) = self.count_signal(job_id, -1).await {
            tracing::error!(error = %err, job_id = %job_id, "giving back a signal's count failed");
        }
        put.map(|_| SignalKept::Taken)
    }

    /// Adds `by` (1 or −1) to the job's count of kept signals, within 0 ..=
    /// [`MAX_SIGNALS_PER_JOB`]: whether it did (not: the bound, or no such job).
    async fn count_signal(&self, job_id: &JobId, by: i32) -> Result<bool, StoreError> {
        let (bound, limit) = match by {
            1 => ("attribute_not_exists(#kept) OR #kept < :limit", MAX_SIGNALS_PER_JOB),
            _ => ("#kept > :limit", 0),
        };
        let counted = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(job_pk(job_id)))
            .key("sk", s(JOB_SK))
            .update_expression("SET #kept = if_not_exists(#kept, :zero) + :by")
            .condition_expression(format!("attribute_exists(pk) AND ({bound})"))
            .expression_attribute_names("#kept", SIGNALS_KEPT)
            .expression_attribute_values(":zero", AttributeValue::N("0".into()))
            .expression_attribute_values(":by", AttributeValue::N(by.to_string()))
            .expression_attribute_values(":limit", AttributeValue::N(limit.to_string()))
            .send()
            .await;
        match counted {
            Ok(_) => Ok(true),
            Err(err) if crate::condition_refused(&err) => Ok(false),
            Err(err) => Err(AwsError::new(format!("count a signal of {job_id}"), err).into()),
        }
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
