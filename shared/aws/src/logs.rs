//! Log context: every line about a job carries `job_id`, `attempt` and `principal`.
//!
//! The functions emit their lines inside one span per job they work on, named `job`, whose
//! fields are `job_id`, `attempt` (the job's attempt number: 0 until its first claim) and
//! `principal` (the job's owner, the JWT subject that submitted it). Lambda's JSON log format
//! (lambda_runtime's subscriber, `tracing_subscriber::fmt().json()`) prints the current span
//! under `span` and every open span under `spans`, so each line shows the three fields
//! without repeating them in every event. A field the code does not know yet when the span
//! opens is declared empty and recorded as soon as the job record (or the caller's token)
//! tells it; an empty field is left out of the line.
//!
//! The span is at level ERROR on purpose: a span is only recorded when its level is enabled,
//! and the context must stay on the lines even when an operator lowers the log level to WARN
//! or ERROR.
//!
//! What never goes into a log line (see `docs/runbook.md`): job params, webhook signing
//! secrets, bearer or stream tokens, the stream token key, presigned URLs, callback URLs,
//! idempotency keys, lease tokens. The `Debug` impls of the records that hold them redact them.

use longhaul_domain::{JobId, Owner};
use tracing::Span;
use tracing::field::Empty;

use crate::jobs::{JobIdentity, JobRecord};

/// The span's name.
pub const SPAN_NAME: &str = "job";

/// A `job` span; whatever is `None` is recorded later (see [`record_job`] and friends).
pub fn job_span(job_id: Option<&JobId>, attempt: Option<u32>, principal: Option<&Owner>) -> Span {
    let span = tracing::error_span!("job", job_id = Empty, attempt = Empty, principal = Empty);
    if let Some(job_id) = job_id {
        span.record("job_id", job_id.as_str());
    }
    if let Some(attempt) = attempt {
        span.record("attempt", attempt);
    }
    if let Some(principal) = principal {
        span.record("principal", principal.as_str());
    }
    span
}

/// The span for work on `job` as its record reads.
pub fn span_of(job: &impl JobIdentity) -> Span {
    job_span(Some(job.job_id()), Some(job.attempt()), Some(job.owner()))
}

/// Records the job's id, attempt and principal from its record in `span`.
pub fn record_job(span: &Span, job: &JobRecord) {
    span.record("job_id", job.job_id.as_str());
    span.record("attempt", job.attempt);
    span.record("principal", job.owner.as_str());
}

/// Records the job id in `span`.
pub fn record_job_id(span: &Span, job_id: &JobId) {
    span.record("job_id", job_id.as_str());
}

/// Records the attempt in `span`.
pub fn record_attempt(span: &Span, attempt: u32) {
    span.record("attempt", attempt);
}

/// Records the principal in `span`.
pub fn record_principal(span: &Span, principal: &Owner) {
    span.record("principal", principal.as_str());
}

/// Records the job's fields in the current span (the `job` span the caller runs in).
pub fn current_job(job: &JobRecord) {
    record_job(&Span::current(), job);
}

/// The target of lambda_runtime's line for a handler's error (and panic).
pub const RUNTIME_ERROR_TARGET: &str = "lambda_runtime::layers::panic";

/// Installs the subscriber lambda_runtime installs (`init_default_subscriber`: JSON when the
/// function's LoggingConfig says so, the level from `AWS_LAMBDA_LOG_LEVEL` or `RUST_LOG`), less
/// the runtime's own line for a handler's error. That line is written after the handler's
/// `job` span closed, so it would be a line about a job without its id, attempt and principal;
/// a handler that returns job errors (the stage) logs each in its span instead. A panic still
/// reaches the log through Rust's panic hook (stderr).
pub fn init_subscriber() {
    use tracing_subscriber::util::SubscriberInitExt;
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL").or_else(|_| std::env::var("RUST_LOG")).ok();
    if json {
        subscriber(level.as_deref(), std::io::stdout).json().finish().init();
    } else {
        subscriber(level.as_deref(), std::io::stdout).finish().init();
    }
}

/// Lambda's formatter: full lines, no timestamp (CloudWatch stamps each line).
type Builder<W> = tracing_subscriber::fmt::SubscriberBuilder<
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full, ()>,
    tracing_subscriber::EnvFilter,
    W,
>;

/// The subscriber builder of [`init_subscriber`], writing to `writer`.
fn subscriber<W>(level: Option<&str>, writer: W) -> Builder<W>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use std::str::FromStr;
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let level = LevelFilter::from_str(level.unwrap_or("INFO")).unwrap_or(LevelFilter::INFO);
    // Also `RUST_LOG`'s per-target directives, as lambda_runtime's subscriber reads them (the
    // cold-start benchmark sets `longhaul_aws::sdk=debug`).
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .from_env_lossy()
        .add_directive(format!("{RUNTIME_ERROR_TARGET}=off").parse().expect("a valid directive"));
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_env_filter(filter)
        .with_writer(writer)
}

/// A placeholder for a redacted value in `Debug` output (defined in a leaf module, so that the
/// records can redact without depending on this one).
pub use crate::redact::Redacted;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The JSON subscriber Lambda functions install (lambda_runtime's, with
    /// `AWS_LAMBDA_LOG_FORMAT=JSON` and level WARN) puts the span's fields on every line,
    /// including the ones recorded after the span opened.
    #[test]
    fn span_fields_reach_json_lines_at_any_level() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_target(false)
            .without_time()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .json()
            .finish();
        let id = JobId::new();
        tracing::subscriber::with_default(subscriber, || {
            let span = job_span(Some(&id), None, None);
            let _entered = span.enter();
            record_attempt(&span, 3);
            record_principal(&span, &"alice".parse().unwrap());
            tracing::warn!("about the job");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["span"]["job_id"], id.as_str(), "{line}");
        assert_eq!(line["span"]["attempt"], 3, "{line}");
        assert_eq!(line["span"]["principal"], "alice", "{line}");
        assert_eq!(line["span"]["name"], SPAN_NAME);
    }

    /// The stage's subscriber drops lambda_runtime's context-less line for a handler error and
    /// keeps everything else, at the configured level.
    #[test]
    fn the_runtime_error_line_is_dropped_and_the_rest_kept() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = subscriber(Some("WARN"), move || writer.clone()).json().finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(target: "lambda_runtime::layers::panic", "Retryable(\"x\")");
            tracing::error!(target: "stage", "task failed");
            tracing::info!(target: "stage", "below the level");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("task failed"), "{text}");
    }

    #[test]
    fn debug_output_redacts_params_secrets_and_tokens() {
        let job: JobRecord = serde_json::from_value(serde_json::json!({
            "job_id": "0192a4c1-7d3e-7b2a-9f00-000000000001", "owner": "alice", "type": "some_kind", "params": {"api_key": "sk_live_PARAM"},
            "status": "running", "attempt": 1, "lease": "LEASE_TOKEN", "idempotency_key": "IDEM_KEY",
            "fingerprint": "f", "callback_url": "https://example.com/hook?token=CALLBACK_TOKEN",
            "created_at": "2026-11-24T18:00:00.000Z", "updated_at": "2026-11-24T18:00:00.000Z", "transitions": []
        }))
        .unwrap();
        let text = format!("{job:?}");
        for secret in ["sk_live_PARAM", "LEASE_TOKEN", "IDEM_KEY", "CALLBACK_TOKEN"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("0192a4c1-7d3e-7b2a-9f00-000000000001") && text.contains("alice"),
            "{text}"
        );
        let secret = crate::jobs::WebhookSecret {
            secret: "whsec_SECRET".into(),
            created_at: longhaul_domain::Timestamp::now(),
            expires_at: None,
        };
        assert!(!format!("{secret:?}").contains("whsec_SECRET"));
    }
}
