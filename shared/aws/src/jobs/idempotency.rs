//! Idempotency records: a submission's key claimed, released, and looked up.

use super::*;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use serde::{Deserialize, Serialize};

use crate::AwsError;

/// An idempotency record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The job created under the key.
    pub job_id: JobId,
    /// The request fingerprint that created it.
    pub fingerprint: String,
    /// When the key was claimed.
    pub created_at: longhaul_domain::Timestamp,
    /// Epoch seconds at which the record stops naming its job: from then on the key is free
    /// (see [`JobStore::claim_key`]), whether or not DynamoDB TTL has deleted the record yet.
    pub expires_at: i64,
}

impl JobStore {
    /// Gives back `owner`'s idempotency `key` that this request claimed for `job_id` and will
    /// not use (its submission was refused after the claim): deleted only if it still names
    /// that job, so a request that took the key over meanwhile keeps it.
    pub async fn release_key(
        &self,
        owner: &Owner,
        key: &str,
        job_id: &JobId,
    ) -> Result<(), StoreError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key("pk", s(idempotency_pk(owner, key)))
            .key("sk", s("IDEM"))
            .condition_expression("job_id = :job")
            .expression_attribute_values(":job", s(job_id))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if crate::condition_refused(&err) => Ok(()),
            Err(err) => Err(AwsError::new("release an idempotency key", err).into()),
        }
    }

    /// Claims `owner`'s idempotency `key` for the job in `record` (step 1 of creating a job).
    /// A record past its `expires_at` counts as absent and is taken over in the same
    /// conditional write: DynamoDB's TTL deletion may lag expiry by days, and the published
    /// window is the record's own expiry, not the deletion. `replacing` names the job a
    /// reused key pointed at (a failed or cancelled one): the record is then replaced only if
    /// it still points there (or has expired meanwhile). When the key is taken, the error
    /// carries the record as it is, read in the same request.
    pub async fn claim_key(
        &self,
        owner: &Owner,
        key: &str,
        record: &IdempotencyRecord,
        replacing: Option<&JobId>,
    ) -> Result<(), StoreError> {
        let mut item = to_item(record);
        item.insert("pk".into(), s(idempotency_pk(owner, key)));
        item.insert("sk".into(), s(IDEM_SK));
        let now = chrono::Utc::now().timestamp();
        let mut request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        request = match replacing {
            None => request.condition_expression("attribute_not_exists(pk) OR expires_at < :now"),
            Some(old) => request
                .condition_expression("job_id = :old OR expires_at < :now")
                .expression_attribute_values(":old", s(old)),
        };
        match request.send().await {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item().cloned() {
                        Some(item) => Err(StoreError::KeyTaken(Box::new(from_item(item)?))),
                        // Replacing, and the record vanished (TTL): the caller starts afresh.
                        None => Err(StoreError::Conflict { current: None }),
                    }
                }
                _ => Err(AwsError::new("claim idempotency key", err).into()),
            },
        }
    }

    /// The idempotency record for `owner`'s `key`, if there is one that has not expired (an
    /// expired one names no job any more, though TTL may not have deleted it yet).
    pub async fn idempotency(
        &self,
        owner: &Owner,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(idempotency_pk(owner, key)))
            .key("sk", s(IDEM_SK))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read idempotency record", e))?;
        let record: Option<IdempotencyRecord> = output.item.map(from_item).transpose()?;
        let now = chrono::Utc::now().timestamp();
        Ok(record.filter(|r| r.expires_at >= now))
    }
}
