//! What a failed job tells its owner, kept apart from what the log is told.
//!
//! A job's `error.message` is shown by `GET /jobs/{id}`, carried in its `job.failed` webhook
//! and written to its transition log: it must never name our infrastructure — bucket names,
//! ARNs, account ids, SDK error chains. So a [`Failure`] holds two things: a
//! [`PublicMessage`], written for the client, which is all the state machine (and so the job
//! record) ever gets, and the internal detail (the full error chain), which only the stage's
//! log line gets, in the job's span with its id.
//!
//! The `fail` task receives the error as a string from Step Functions, where no type
//! survives: [`recorded_message`] takes our own messages from `Job.*` errors, replaces any
//! other error's cause (a timeout, a crashed sandbox, a Lambda service error) by a fixed
//! message, and — defence in depth — refuses any message that [`looks_internal`].

use std::fmt;

use longhaul_domain::ErrorCode;
pub use longhaul_worker::PublicMessage;

/// The input upload could not be read (an S3 error on the input).
pub const INPUT_UNREADABLE: PublicMessage =
    PublicMessage::fixed("the input upload could not be read");
/// A checkpoint or a stage's output could not be written or read.
pub const CHECKPOINT_FAILED: PublicMessage =
    PublicMessage::fixed("the job's intermediate results could not be saved or read");
/// The result could not be stored.
pub const RESULT_NOT_STORED: PublicMessage =
    PublicMessage::fixed("the job's result could not be stored");
/// The job's record could not be read or written.
pub const STORE_FAILED: PublicMessage =
    PublicMessage::fixed("the job's record could not be read or updated");
/// Any other dependency failed.
pub const SERVICE_FAILED: PublicMessage =
    PublicMessage::fixed("a service the job depends on failed");

/// A failed AWS call as a kind sees it: retryable (throttling, a 5xx, a timeout, the network),
/// unless the service refused the request for good ([`longhaul_aws::Refusal`]: access denied,
/// a missing object, an invalid request, a disabled key): then fatal at once, saying why in
/// words that name no resource — retrying would only spend the job's retry budget.
pub fn aws_failure(
    public: PublicMessage,
    err: &longhaul_aws::AwsError,
) -> longhaul_worker::KindError {
    use longhaul_worker::KindError;
    match err.refusal {
        Some(refusal) => {
            KindError::fatal(PublicMessage::domain(format!("{public}: {}", refusal.describe())))
                .because(err)
        }
        None => KindError::retryable(public).because(err),
    }
}

/// A failure: the message for the client and, for the log only, the internal detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What the job's owner is told.
    pub public: PublicMessage,
    /// What only the log is told (an AWS error chain with ARNs and bucket names, a key).
    pub internal: Option<String>,
}

impl Failure {
    /// A failure with nothing more to log than its message.
    pub fn new(public: PublicMessage) -> Self {
        Failure { public, internal: None }
    }

    /// A failure whose cause, `internal`, goes to the log only.
    pub fn because(public: PublicMessage, internal: impl fmt::Display) -> Self {
        Failure { public, internal: Some(internal.to_string()) }
    }
}

/// The log's form: the public message, then the internal detail.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.internal {
            Some(internal) => write!(f, "{}: {internal}", self.public),
            None => write!(f, "{}", self.public),
        }
    }
}

/// The message recorded for an error the state machine caught (`error` its name, `cause` its
/// cause, which for a Lambda error is `{"errorType", "errorMessage"}`), and whether the cause
/// was replaced (the caller logs the original then).
///
/// Only our own errors (`Job.*`, raised by this function with a [`PublicMessage`]) keep their
/// message; any other — `States.Timeout`, `Runtime.ExitError`, `Lambda.*` — is infrastructure
/// speaking, and its cause (request ids, ARNs, runtime output) is replaced by a fixed message.
pub fn recorded_message(error: &str, cause: &str) -> (String, bool) {
    let own = ErrorCode::is_ours(error)
        .then(|| serde_json::from_str::<serde_json::Value>(cause).ok())
        .flatten()
        .and_then(|cause| cause.get("errorMessage")?.as_str().map(str::to_owned))
        .filter(|message| !message.is_empty() && !looks_internal(message));
    match own {
        Some(message) => (message, false),
        None => (infrastructure_message(error).to_owned(), true),
    }
}

/// The fixed message for an error whose own cause is not shown.
fn infrastructure_message(error: &str) -> &'static str {
    match error {
        "States.Timeout" | "States.HeartbeatTimeout" | "Sandbox.Timedout" => {
            "the job's worker timed out"
        }
        _ if error == ErrorCode::Fatal.as_str() => "the job failed and cannot be retried",
        _ if error == ErrorCode::Retryable.as_str() => "the job failed and its retries were spent",
        _ if error == ErrorCode::StageTimeout.as_str() => {
            "a stage of the job ran past its stage timeout"
        }
        _ => "the job's worker failed (an infrastructure error); retrying the job may succeed",
    }
}

/// Whether `message` names our infrastructure: an ARN, an S3 URL or host, an AWS account id
/// (twelve digits in a row), or the SDK's error chain. A safety net under the typed
/// separation, not the separation itself: what it catches is logged and replaced.
pub fn looks_internal(message: &str) -> bool {
    const MARKERS: &[&str] = &[
        "arn:",
        "s3://",
        "amazonaws.com",
        "service error",
        "dispatch failure",
        "unhandled error",
        "request id",
        "requestid",
        "x-amz-",
        "assumed-role",
        "not authorized to perform",
    ];
    let lower = message.to_ascii_lowercase();
    if MARKERS.iter().any(|marker| lower.contains(marker)) {
        return true;
    }
    let mut run = 0;
    for byte in message.bytes() {
        run = if byte.is_ascii_digit() { run + 1 } else { 0 };
        if run == 12 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the SDK's chain looks like when S3 refuses a read (as `AwsError` renders it).
    const CHAIN: &str = "get s3://longhaul-local-results/uploads/u/x.csv from byte 0: service error: \
        unhandled error (AccessDenied): Error { code: \"AccessDenied\", message: \"User: \
        arn:aws:sts::123456789012:assumed-role/StageFunctionRole/StageFunction is not authorized \
        to perform: s3:GetObject on resource: arn:aws:s3:::longhaul-local-results/uploads/u/x.csv\" }";

    fn cause(error_type: &str, message: &str) -> String {
        json!({"errorType": error_type, "errorMessage": message}).to_string()
    }

    #[test]
    fn a_failure_shows_its_public_message_and_logs_the_rest() {
        let failure = Failure::because(INPUT_UNREADABLE, CHAIN);
        assert_eq!(failure.public.as_str(), "the input upload could not be read");
        assert_eq!(failure.to_string(), format!("the input upload could not be read: {CHAIN}"));
        assert_eq!(Failure::new(RESULT_NOT_STORED).to_string(), RESULT_NOT_STORED.as_str());
    }

    #[test]
    fn our_own_messages_are_recorded() {
        for (error, message) in [
            ("Job.Fatal", "column \"x\" is not in the CSV header row"),
            ("Job.Retryable", "the input upload could not be read"),
            ("Job.Fatal", "injected fatal failure at item 3"),
        ] {
            assert_eq!(
                recorded_message(error, &cause(error, message)),
                (message.to_owned(), false)
            );
        }
    }

    #[test]
    fn infrastructure_causes_are_replaced() {
        let cases = [
            ("States.Timeout", String::new(), "the job's worker timed out"),
            (
                "Runtime.ExitError",
                cause(
                    "Runtime.ExitError",
                    "RequestId: 1f2e Error: Runtime exited with error: signal: killed",
                ),
                "the job's worker failed (an infrastructure error); retrying the job may succeed",
            ),
            (
                "Lambda.ServiceException",
                "Lambda is unable to invoke arn:aws:lambda:eu-west-1:123456789012:function:stage"
                    .to_owned(),
                "the job's worker failed (an infrastructure error); retrying the job may succeed",
            ),
            // A `Job.*` name with a cause that is not ours (not the runtime's JSON).
            ("Job.Fatal", "forged".to_owned(), "the job failed and cannot be retried"),
            // Ours, but leaking: the safety net.
            (
                "Job.Retryable",
                cause("Job.Retryable", CHAIN),
                "the job failed and its retries were spent",
            ),
        ];
        for (error, cause, expected) in cases {
            let (message, replaced) = recorded_message(error, &cause);
            assert_eq!((message.as_str(), replaced), (expected, true), "{error}: {cause}");
            assert!(!looks_internal(&message));
        }
    }

    #[test]
    fn internal_details_are_recognised() {
        for leak in [
            CHAIN,
            "arn:aws:states:eu-west-1:123456789012:execution:jobs:x",
            "head s3://bucket/key",
            "https://bucket.s3.eu-west-1.amazonaws.com/key",
            "dispatch failure: io error: connection refused",
            "Rate Exceeded. (Service: AWSLambda; Status Code: 429; Request ID: 42)",
            "account 123456789012",
        ] {
            assert!(looks_internal(leak), "{leak}");
        }
        for fine in [
            "the input upload could not be read",
            "column \"region\" is not in the CSV header row",
            "the report would have more than 10000 groups; group by fewer or coarser columns",
            "injected fatal failure at item 12345678901",
            "invalid params: unknown field `extra`",
        ] {
            assert!(!looks_internal(fine), "{fine}");
        }
    }
}
