//! Per-owner webhook signing secrets and the delivery log.

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use longhaul_domain::Timestamp;
use serde::{Deserialize, Serialize};

use crate::AwsError;
use longhaul_domain::webhooks::{DeliveryOutcome, ExposeSecret, SecretString};

/// How many signing secrets a principal has at most: the newest, and during a rotation's
/// overlap the one before it. A rotation while two are active retires the older at once.
pub const MAX_ACTIVE_SECRETS: usize = 2;

/// A principal's webhook signing secrets (`SECRET#<len>:<owner>` / `WEBHOOK`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SecretsRecord {
    /// Bumped by every rotation, which is conditional on the version it read: of two
    /// concurrent rotations one is written and the other refused, so no secret that was
    /// handed out is ever overwritten unseen. Records from before versioning read as 0.
    #[serde(default)]
    pub version: u64,
    /// Newest first; during a rotation the previous one stays until its `expires_at`. At
    /// most [`MAX_ACTIVE_SECRETS`].
    pub secrets: Vec<WebhookSecret>,
}

/// One signing secret. The secret is a [`SecretString`]: its `Debug` prints `[REDACTED]`,
/// and it is exposed only to sign and to hand it to its owner (and to store it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// `whsec_…`.
    #[serde(serialize_with = "expose_secret", deserialize_with = "secret_string")]
    pub secret: SecretString,
    /// When it was made.
    pub created_at: Timestamp,
    /// When a rotated-out secret stops signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

pub(super) fn expose_secret<S: serde::Serializer>(
    secret: &SecretString,
    out: S,
) -> Result<S::Ok, S::Error> {
    out.serialize_str(secret.expose_secret())
}

pub(super) fn secret_string<'de, D: serde::Deserializer<'de>>(
    input: D,
) -> Result<SecretString, D::Error> {
    String::deserialize(input).map(SecretString::from)
}

impl WebhookSecret {
    /// A fresh secret from the OS random generator, made now.
    pub fn generate(now: Timestamp) -> Result<Self, StoreError> {
        let secret = longhaul_domain::webhooks::generate_secret()
            .map_err(|e| AwsError::new("generate a webhook secret", e))?;
        Ok(WebhookSecret { secret, created_at: now, expires_at: None })
    }
}

impl SecretsRecord {
    /// The secrets that sign now.
    pub fn active(&self, now: Timestamp) -> Vec<&WebhookSecret> {
        self.secrets.iter().filter(|s| s.expires_at.is_none_or(|at| at > now)).collect()
    }

    /// The record after rotating in `new` at `now`: `new` signs from now on, the newest
    /// active secret keeps signing until `overlap_until` (or its earlier expiry), and every
    /// other one — expired, or the older of two still in their overlap — is retired, so at
    /// most [`MAX_ACTIVE_SECRETS`] remain.
    pub fn rotated(
        &self,
        new: WebhookSecret,
        now: Timestamp,
        overlap_until: Timestamp,
    ) -> SecretsRecord {
        let mut secrets = vec![new];
        if let Some(previous) = self.active(now).first() {
            let mut previous = (*previous).clone();
            previous.expires_at = Some(match previous.expires_at {
                Some(at) if at < overlap_until => at,
                _ => overlap_until,
            });
            secrets.push(previous);
        }
        debug_assert!(secrets.len() <= MAX_ACTIVE_SECRETS);
        SecretsRecord { version: self.version + 1, secrets }
    }
}

/// What a rotation came to.
#[derive(Debug, Clone)]
pub enum Rotation {
    /// Written: the record now holds these secrets (the new one first).
    Rotated(SecretsRecord),
    /// Another rotation was written first, between our read and our write; ours was not
    /// written (its secret was never handed out). The record as the winner left it.
    Lost(SecretsRecord),
}

/// One webhook delivery attempt (`DELIVERY#<job id>` / `WEBHOOK#<event>#<attempt>`): in a
/// partition of its own, not the job's, so the webhook function's role can be granted writes
/// of delivery records only (`dynamodb:LeadingKeys` constrains the partition key, never the
/// sort key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// The `webhook-id`.
    pub webhook_id: String,
    /// The event type (`job.succeeded`, …).
    pub event: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// When it was made.
    pub at: longhaul_domain::Timestamp,
    /// The receiver's status code, if it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// How long it took.
    pub latency_ms: u64,
    /// What went wrong, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What came of it.
    pub outcome: DeliveryOutcome,
}

pub(super) fn secrets_pk(owner: &Owner) -> String {
    format!("SECRET#{}:{owner}", owner.len())
}

pub(super) fn secrets_key(owner: &Owner) -> Item {
    HashMap::from([("pk".to_owned(), s(secrets_pk(owner))), ("sk".to_owned(), s("WEBHOOK"))])
}

/// The partition of a job's delivery records.
pub fn delivery_pk(job_id: &JobId) -> String {
    format!("DELIVERY#{job_id}")
}

impl JobStore {
    /// `owner`'s webhook secrets, created on first use (a conditional put, so concurrent
    /// first uses agree on one secret).
    pub async fn webhook_secrets(&self, owner: &Owner) -> Result<SecretsRecord, StoreError> {
        let existing = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(secrets_key(owner)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read webhook secrets", e))?;
        if let Some(item) = existing.item {
            return from_item(item);
        }
        let record =
            SecretsRecord { version: 1, secrets: vec![WebhookSecret::generate(Timestamp::now())?] };
        let mut item = to_item(&record);
        item.extend(secrets_key(owner));
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(record),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed))
                    if failed.item().is_some() =>
                {
                    from_item(failed.item().cloned().unwrap_or_default())
                }
                _ => Err(AwsError::new("create webhook secret", err).into()),
            },
        }
    }

    /// Rotates `owner`'s secret: a new one signs from now on; the current one keeps signing
    /// (alongside) until `overlap_until`, so receivers can switch without losing messages,
    /// and any older one is retired ([`SecretsRecord::rotated`]: at most two are active).
    ///
    /// The write is conditional on the version read: of two concurrent rotations one is
    /// written and the other comes back [`Rotation::Lost`] with the winner's record, so a
    /// secret handed to a caller is never silently replaced by another caller's.
    pub async fn rotate_webhook_secret(
        &self,
        owner: &Owner,
        overlap_until: Timestamp,
    ) -> Result<Rotation, StoreError> {
        let current = self.webhook_secrets(owner).await?;
        self.rotate_webhook_secret_from(owner, &current, overlap_until).await
    }

    /// The write of a rotation made from `read`, the record as the caller read it: written
    /// only if the record is still at `read.version` ([`Rotation::Lost`] otherwise). Public so
    /// that a test can replay the stale read of a concurrent rotation.
    pub async fn rotate_webhook_secret_from(
        &self,
        owner: &Owner,
        read: &SecretsRecord,
        overlap_until: Timestamp,
    ) -> Result<Rotation, StoreError> {
        let now = Timestamp::now();
        let record = read.rotated(WebhookSecret::generate(now)?, now, overlap_until);
        let mut item = to_item(&record);
        item.extend(secrets_key(owner));
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            // A record from before versioning has no `version`: it reads as 0.
            .condition_expression(if read.version == 0 {
                "attribute_exists(pk) AND attribute_not_exists(#version)"
            } else {
                "#version = :read"
            })
            .expression_attribute_names("#version", "version")
            .set_expression_attribute_values((read.version > 0).then(|| {
                HashMap::from([(":read".to_owned(), AttributeValue::N(read.version.to_string()))])
            }))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(Rotation::Rotated(record)),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item() {
                        Some(item) => Ok(Rotation::Lost(from_item(item.clone())?)),
                        None => Err(StoreError::Corrupt {
                            key: secrets_pk(owner),
                            reason: "the webhook secrets vanished during a rotation".into(),
                        }),
                    }
                }
                _ => Err(AwsError::new("rotate webhook secret", err).into()),
            },
        }
    }

    /// Records one delivery attempt, in the job's delivery partition ([`delivery_pk`]).
    pub async fn record_delivery(
        &self,
        job_id: &JobId,
        delivery: &DeliveryRecord,
    ) -> Result<(), StoreError> {
        let mut item = to_item(delivery);
        item.insert("pk".into(), s(delivery_pk(job_id)));
        item.insert("sk".into(), s(format!("WEBHOOK#{}#{:04}", delivery.event, delivery.attempt)));
        // Written after the job ended, outside its partition (which the expirer marks for
        // TTL): each attempt carries its own, so the last one lapses a retention after it.
        item.insert("expires_at".into(), self.retention.ttl_from_now());
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| AwsError::new(format!("record webhook delivery of {job_id}"), e))?;
        Ok(())
    }

    /// A job's delivery attempts, oldest first.
    pub async fn deliveries(&self, job_id: &JobId) -> Result<Vec<DeliveryRecord>, StoreError> {
        let output = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(delivery_pk(job_id)))
            .expression_attribute_values(":prefix", s("WEBHOOK#"))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("read deliveries of {job_id}"), e))?;
        output.items.unwrap_or_default().into_iter().map(from_item).collect()
    }
}
