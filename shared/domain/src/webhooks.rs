//! Webhooks as Standard Webhooks (standardwebhooks.com) specifies them: the event payload,
//! signing with `whsec_` secrets, and the retry schedule.
//!
//! A delivery carries `webhook-id` (stable across retries, so receivers can deduplicate),
//! `webhook-timestamp` (seconds) and `webhook-signature`: `v1,<base64 HMAC-SHA256 of
//! "id.timestamp.body">` under each active secret, space-separated (two during a rotation).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::JobStatus;

/// Prefix of a webhook signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new random signing secret (`whsec_` + base64 of 32 random bytes).
pub fn generate_secret() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes))
}

/// Why a secret cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a webhook secret is whsec_ followed by base64")]
pub struct InvalidSecret;

/// The `v1,<signature>` of `body` for message `id` at `timestamp` under `secret`.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, InvalidSecret> {
    let key = STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).ok_or(InvalidSecret)?)
        .map_err(|_| InvalidSecret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|_| InvalidSecret)?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// Whether `header` (a `webhook-signature` value) holds a valid signature of the message
/// under `secret` — what a receiver checks.
pub fn verify(secret: &str, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    let Ok(expected) = sign(secret, id, timestamp, body) else { return false };
    header.split(' ').any(|candidate| candidate == expected)
}

/// The event type of a terminal status, or `None` for statuses that send no webhook.
pub fn event_type(status: JobStatus) -> Option<&'static str> {
    match status {
        JobStatus::Succeeded => Some("job.succeeded"),
        JobStatus::Failed => Some("job.failed"),
        JobStatus::Cancelled => Some("job.cancelled"),
        _ => None,
    }
}

/// The `webhook-id` of a job's terminal event: the same for every retry of that event.
pub fn message_id(job_id: &str, status: JobStatus) -> String {
    format!("msg_{}_{}", job_id.replace('-', ""), status.as_str())
}

/// Delays between delivery attempts, in seconds; after the last one fails the delivery is
/// dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(pub Vec<u64>);

impl Default for RetrySchedule {
    /// Retries after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h: eight attempts spanning
    /// about 27.6 hours.
    fn default() -> Self {
        RetrySchedule(vec![5, 300, 1_800, 7_200, 18_000, 36_000, 36_000])
    }
}

impl RetrySchedule {
    /// Parses `"5,300,1800"`.
    pub fn parse(text: &str) -> Option<Self> {
        let delays: Option<Vec<u64>> = text.split(',').map(|d| d.trim().parse().ok()).collect();
        delays.filter(|d| !d.is_empty()).map(RetrySchedule)
    }

    /// The delay before attempt `attempt` (attempt 1 is immediate), or `None` when attempts
    /// are exhausted.
    pub fn delay_before(&self, attempt: u32) -> Option<u64> {
        match attempt {
            0 | 1 => Some(0),
            n => self.0.get(n as usize - 2).copied(),
        }
    }

    /// Total span of the schedule, in seconds.
    pub fn span(&self) -> u64 {
        self.0.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_test_vector() {
        // From the Standard Webhooks specification's reference test.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let signature = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).unwrap();
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &format!("v1,other {signature}")
        ));
        assert!(!verify(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265331, body, &signature));
    }

    #[test]
    fn secrets_sign_and_differ() {
        let (a, b) = (generate_secret(), generate_secret());
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert!(sign(&a, "id", 1, b"x").is_ok());
        assert!(sign("nope", "id", 1, b"x").is_err());
    }

    #[test]
    fn the_default_schedule_spans_more_than_a_day() {
        let schedule = RetrySchedule::default();
        assert!(schedule.span() >= 24 * 3600);
        assert_eq!(schedule.delay_before(1), Some(0));
        assert_eq!(schedule.delay_before(2), Some(5));
        assert_eq!(schedule.delay_before(9), None);
        assert_eq!(RetrySchedule::parse("1, 2").unwrap().0, vec![1, 2]);
        assert!(RetrySchedule::parse("x").is_none());
    }
}
