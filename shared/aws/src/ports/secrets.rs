//! A secret key the function signs or checks tokens with.

use async_trait::async_trait;
use secrecy::SecretString;

use super::Warm;
use crate::AwsError;
use crate::secrets::SecretKey;

/// A secret key the function signs or checks tokens with.
#[async_trait]
pub trait SigningKey: Warm {
    /// The key.
    async fn get(&self) -> Result<&SecretString, AwsError>;
}

#[async_trait]
impl Warm for SecretKey {
    async fn warm(&self) {
        SecretKey::warm(self).await
    }
}

#[async_trait]
impl SigningKey for SecretKey {
    async fn get(&self) -> Result<&SecretString, AwsError> {
        SecretKey::get(self).await
    }
}
