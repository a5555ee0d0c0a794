//! Webhooks as Standard Webhooks (standardwebhooks.com) specifies them: the event payload,
//! signing with `whsec_` secrets, and the retry schedule.
//!
//! A delivery carries `webhook-id` (stable across retries, so receivers can deduplicate),
//! `webhook-timestamp` (seconds) and `webhook-signature`: `v1,<base64 HMAC-SHA256 of
//! "id.timestamp.body">` under each active secret, space-separated (two during a rotation).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use secrecy::ExposeSecretMut;
pub use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

use crate::JobStatus;

/// Prefix of a webhook signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Bytes of key material in a generated secret (HMAC-SHA256's block-sized key is overkill;
/// 32 bytes is its full strength, and what Standard Webhooks' own libraries generate).
pub const SECRET_BYTES: usize = 32;

/// The OS random generator could not be read (on Linux only before the kernel's pool is
/// initialised, or with neither `getrandom(2)` nor `/dev/urandom`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the OS random generator is unavailable: {0}")]
pub struct RandomUnavailable(String);

/// A new signing secret: `whsec_` + base64 of [`SECRET_BYTES`] bytes read from the OS random
/// generator (not a UUIDv4: its bits are fewer, and its generator is not ours to vouch for).
/// Kept in a [`SecretString`], whose `Debug` prints `[REDACTED]`, so no log can carry it.
pub fn generate_secret() -> Result<SecretString, RandomUnavailable> {
    // In a `SecretBox`, so the raw key material is zeroed when it is dropped.
    let mut bytes = secrecy::SecretBox::new(Box::new([0u8; SECRET_BYTES]));
    getrandom::fill(bytes.expose_secret_mut()).map_err(|e| RandomUnavailable(e.to_string()))?;
    Ok(SecretString::from(format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes.expose_secret()))))
}

/// Why a secret cannot sign.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a webhook secret is whsec_ followed by base64")]
pub struct InvalidSecret;

/// The HMAC of message `id` at `timestamp` with `body` under `secret`, ready to finalise or
/// to verify against.
fn mac(
    secret: &SecretString,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<Hmac<Sha256>, InvalidSecret> {
    let encoded = secret.expose_secret().strip_prefix(SECRET_PREFIX).ok_or(InvalidSecret)?;
    let key = secrecy::SecretSlice::from(STANDARD.decode(encoded).map_err(|_| InvalidSecret)?);
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose_secret()).map_err(|_| InvalidSecret)?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(mac)
}

/// The `v1,<signature>` of `body` for message `id` at `timestamp` under `secret`.
pub fn sign(
    secret: &SecretString,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, InvalidSecret> {
    let mac = mac(secret, id, timestamp, body)?;
    Ok(format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes())))
}

/// Whether `header` (a `webhook-signature` value) holds a valid signature of the message
/// under `secret` — what a receiver checks. Each candidate is compared in constant time
/// (`Mac::verify_slice`), and every candidate is checked, so the time taken says neither how
/// much of a forged signature was right nor which candidate matched.
pub fn verify(secret: &SecretString, id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
    let Ok(mac) = mac(secret, id, timestamp, body) else { return false };
    header
        .split(' ')
        .filter_map(|candidate| candidate.strip_prefix("v1,"))
        .filter_map(|signature| STANDARD.decode(signature).ok())
        .fold(false, |found, signature| mac.clone().verify_slice(&signature).is_ok() | found)
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
pub fn message_id(job_id: &crate::JobId, status: JobStatus) -> String {
    format!("msg_{}_{}", job_id.replace('-', ""), status.as_str())
}

/// What came of one delivery attempt (stored on its delivery record, shown to the owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryOutcome {
    /// The receiver answered 2xx.
    Delivered,
    /// It failed; the next attempt is scheduled.
    Retrying,
    /// The receiver answered 410 Gone: no more attempts.
    Stopped,
    /// It failed and the schedule is spent: the delivery went to the dead-letter queue.
    DeadLettered,
}

impl DeliveryOutcome {
    /// The outcome of an attempt the receiver answered with `status_code` (none: no answer),
    /// given whether the schedule has a `further_attempt`.
    pub fn of(status_code: Option<u16>, further_attempt: bool) -> Self {
        match status_code {
            Some(200..=299) => DeliveryOutcome::Delivered,
            Some(410) => DeliveryOutcome::Stopped,
            _ if further_attempt => DeliveryOutcome::Retrying,
            _ => DeliveryOutcome::DeadLettered,
        }
    }

    /// Its name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryOutcome::Delivered => "delivered",
            DeliveryOutcome::Retrying => "retrying",
            DeliveryOutcome::Stopped => "stopped",
            DeliveryOutcome::DeadLettered => "dead_lettered",
        }
    }
}

impl PartialEq<&str> for DeliveryOutcome {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
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

    /// The longest delay between two attempts, in seconds: a delivery left `pending` with
    /// nothing attempted or queued for longer is not being retried any more.
    pub fn longest_delay(&self) -> u64 {
        self.0.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_attempt_ends_in_one_outcome() {
        use DeliveryOutcome::*;
        assert_eq!(DeliveryOutcome::of(Some(204), false), Delivered);
        assert_eq!(DeliveryOutcome::of(Some(410), true), Stopped);
        assert_eq!(DeliveryOutcome::of(Some(500), true), Retrying);
        assert_eq!(DeliveryOutcome::of(None, true), Retrying);
        assert_eq!(DeliveryOutcome::of(Some(429), false), DeadLettered);
        for outcome in [Delivered, Retrying, Stopped, DeadLettered] {
            assert_eq!(serde_json::to_value(outcome).unwrap(), outcome.as_str());
        }
    }

    #[test]
    fn standard_webhooks_test_vector() {
        // From the Standard Webhooks specification's reference test. The expected signature
        // is checked by verifying it (constant time), not by comparing strings.
        let secret = SecretString::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = br#"{"test": 2432232314}"#;
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let vector = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert!(verify(&secret, id, 1614265330, body, vector));
        let signature = sign(&secret, id, 1614265330, body).unwrap();
        assert!(verify(&secret, id, 1614265330, body, &signature));
        assert!(verify(&secret, id, 1614265330, body, &format!("v1,other {signature}")));
        assert!(!verify(&secret, id, 1614265331, body, vector), "another timestamp");
        assert!(!verify(&secret, id, 1614265330, b"{}", vector), "another body");
        assert!(!verify(&secret, id, 1614265330, body, &vector.replace("v1,", "v2,")));
        assert!(!verify(&secret, id, 1614265330, body, "v1,not-base64 v1, "));
        assert!(!verify(&SecretString::from("nope"), id, 1614265330, body, vector));
    }

    #[test]
    fn generated_secrets_are_32_random_bytes_behind_the_prefix() {
        let (a, b) = (generate_secret().unwrap(), generate_secret().unwrap());
        for secret in [&a, &b] {
            let text = secret.expose_secret();
            let encoded = text.strip_prefix(SECRET_PREFIX).expect("whsec_ prefix");
            assert_eq!(text.len(), SECRET_PREFIX.len() + 44, "base64 of 32 bytes is 44 chars");
            assert_eq!(STANDARD.decode(encoded).unwrap().len(), SECRET_BYTES);
            assert!(sign(secret, "id", 1, b"x").is_ok());
        }
        assert_ne!(a.expose_secret(), b.expose_secret(), "two secrets differ");
        assert!(sign(&SecretString::from("nope"), "id", 1, b"x").is_err());
    }

    #[test]
    fn a_secret_never_shows_in_debug_output() {
        let secret = generate_secret().unwrap();
        let shown = format!("{secret:?} {:?}", vec![secret.clone()]);
        assert!(!shown.contains(secret.expose_secret()), "{shown}");
        assert!(!shown.contains(SECRET_PREFIX), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
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
