//! Keys kept in Secrets Manager, read once per sandbox: the stream-token signing key.
//!
//! The key never passes through the function's environment (which the Lambda console, the
//! `GetFunctionConfiguration` API and every deployment tool show in plain text); the
//! environment names only the secret's ARN, and the role may read that one secret.

use crate::client::LazyClient;
use secrecy::SecretString;
use tokio::sync::OnceCell;

use crate::AwsError;

/// A secret's value, fetched on first use and kept for the sandbox's life (a rotated key
/// reaches new sandboxes; tokens live minutes, so old and new keys overlap only briefly).
#[derive(Debug, Clone)]
pub struct SecretKey {
    client: LazyClient<aws_sdk_secretsmanager::Client>,
    arn: String,
    value: std::sync::Arc<OnceCell<SecretString>>,
}

impl SecretKey {
    /// The secret at `arn`, not yet read.
    pub fn new(client: impl Into<LazyClient<aws_sdk_secretsmanager::Client>>, arn: String) -> Self {
        SecretKey { client: client.into(), arn, value: std::sync::Arc::new(OnceCell::new()) }
    }

    /// The secret's value: read once (`GetSecretValue`), then from memory. A failed read is
    /// not remembered: the next call tries again.
    pub async fn get(&self) -> Result<&SecretString, AwsError> {
        self.value
            .get_or_try_init(|| async {
                let output = self
                    .client
                    .get_secret_value()
                    .secret_id(&self.arn)
                    .send()
                    .await
                    .map_err(|e| AwsError::service("read a signing key", e))?;
                let value = output.secret_string.ok_or_else(|| AwsError {
                    context: "read a signing key".into(),
                    detail: format!("secret {} has no string value", self.arn),
                    refusal: None,
                })?;
                Ok(SecretString::from(value))
            })
            .await
    }

    /// Reads the key ahead of the first request (at init, within the warm-up budget); a
    /// failure is logged and the first request reads it again.
    pub async fn warm(&self) {
        if let Err(err) = self.get().await {
            tracing::error!(error = %err, "reading the signing key at init failed; the first request reads it again");
        }
    }
}
