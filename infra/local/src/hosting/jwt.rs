//! The local JWT authorizer: mints HS256 tokens and validates them as API Gateway's JWT
//! authorizer would (signature, expiry, issuer, audience), exposing the claims to functions.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::Value;

/// Signing key, issuer and audience of the local identity provider.
#[derive(Clone)]
pub struct Authorizer {
    secret: Vec<u8>,
    issuer: String,
    audience: String,
}

impl Authorizer {
    /// An authorizer with the key stored at `path` (created on first use), so `make token`
    /// and a running stack agree.
    pub fn from_key_file(path: &Path, issuer: &str, audience: &str) -> anyhow::Result<Self> {
        let secret = match std::fs::read(path) {
            Ok(secret) if secret.len() >= 32 => secret,
            _ => {
                let secret =
                    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
                        .into_bytes();
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                std::fs::write(path, &secret)
                    .with_context(|| format!("writing {}", path.display()))?;
                secret
            }
        };
        Ok(Authorizer { secret, issuer: issuer.to_owned(), audience: audience.to_owned() })
    }

    /// A token for principal `sub`, valid for `ttl_seconds`.
    pub fn token(&self, sub: &str, ttl_seconds: u64) -> String {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = serde_json::json!({
            "sub": sub, "iss": self.issuer, "aud": self.audience,
            "iat": now, "exp": now + ttl_seconds, "scope": "jobs",
        });
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(&self.secret),
        )
        .expect("HS256 encoding cannot fail")
    }

    /// The claims of a valid `Authorization` header value, as API Gateway passes them to
    /// the function (every claim as a string), or `None` (→ 401).
    pub fn authorize(&self, header: Option<&str>) -> Option<HashMap<String, String>> {
        let value = header?.trim();
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .unwrap_or(value)
            .trim();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(
            token,
            &DecodingKey::from_secret(&self.secret),
            &validation,
        )
        .ok()?;
        Some(
            data.claims
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, v)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_forgeries_fail() {
        let dir = std::env::temp_dir().join(format!("longhaul-jwt-{}", uuid::Uuid::new_v4()));
        let auth = Authorizer::from_key_file(&dir.join("key"), "iss", "aud").unwrap();
        let token = auth.token("alice", 60);
        assert_eq!(auth.authorize(Some(&format!("Bearer {token}"))).unwrap()["sub"], "alice");
        assert!(auth.authorize(None).is_none());
        assert!(auth.authorize(Some("Bearer nonsense")).is_none());
        let other = Authorizer::from_key_file(&dir.join("other"), "iss", "aud").unwrap();
        assert!(other.authorize(Some(&token)).is_none());
        let wrong_audience = Authorizer { audience: "else".into(), ..auth.clone() };
        assert!(wrong_audience.authorize(Some(&token)).is_none());
        std::fs::remove_dir_all(dir).ok();
    }
}
