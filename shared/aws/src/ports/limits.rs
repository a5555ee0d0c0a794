//! Per-owner rate limits (submissions; webhook endpoint deliveries).

use async_trait::async_trait;
use longhaul_domain::Owner;

use super::Warm;
use crate::AwsError;
use crate::limits::{Admission, TenantRateLimiter, UploadQuota};

/// A per-owner rate limit (one [`crate::limits::RateCounter`]).
#[async_trait]
pub trait RateLimits: Warm {
    /// Charges one event to `owner`: admitted, or refused until a given time.
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError>;
}

/// A per-owner daily quota of upload bytes (one [`UploadQuota`]).
#[async_trait]
pub trait UploadQuotas: Warm {
    /// Counts `bytes` of `owner`'s uploads today: admitted, or refused (nothing counted) until
    /// the next day, when they do not fit in what is left of today's quota.
    async fn charge(&self, owner: &Owner, bytes: u64) -> Result<Admission, AwsError>;
}

#[async_trait]
impl Warm for UploadQuota {
    async fn warm(&self) {
        UploadQuota::warm(self).await
    }
}

#[async_trait]
impl UploadQuotas for UploadQuota {
    async fn charge(&self, owner: &Owner, bytes: u64) -> Result<Admission, AwsError> {
        UploadQuota::charge(self, owner, bytes).await
    }
}

#[async_trait]
impl Warm for TenantRateLimiter {}

#[async_trait]
impl RateLimits for TenantRateLimiter {
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        TenantRateLimiter::charge(self, owner).await
    }
}
