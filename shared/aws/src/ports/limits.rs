//! Per-owner rate limits (submissions; webhook endpoint deliveries).

use async_trait::async_trait;
use longhaul_domain::Owner;

use super::Warm;
use crate::AwsError;
use crate::limits::{Admission, TenantRateLimiter};

/// A per-owner rate limit (one [`crate::limits::RateCounter`]).
#[async_trait]
pub trait RateLimits: Warm {
    /// Charges one event to `owner`: admitted, or refused until a given time.
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError>;
}

#[async_trait]
impl Warm for TenantRateLimiter {}

#[async_trait]
impl RateLimits for TenantRateLimiter {
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        TenantRateLimiter::charge(self, owner).await
    }
}
