//! The per-owner submission rate limit.

use async_trait::async_trait;
use longhaul_domain::Owner;

use super::Warm;
use crate::AwsError;
use crate::limits::{Admission, SubmissionLimiter};

/// The per-owner submission rate limit.
#[async_trait]
pub trait RateLimits: Warm {
    /// Charges one submission to `owner`: admitted, or refused until a given time.
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError>;
}

#[async_trait]
impl Warm for SubmissionLimiter {}

#[async_trait]
impl RateLimits for SubmissionLimiter {
    async fn charge(&self, owner: &Owner) -> Result<Admission, AwsError> {
        SubmissionLimiter::charge(self, owner).await
    }
}
