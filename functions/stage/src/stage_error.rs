//! The stage's errors, named for the state machine (`Job.*`, [`ErrorCode`]): what the state
//! machine matches on and the owner is told, kept apart from what the log gets
//! ([`failure_message`]).

use std::time::Duration;

use lambda_runtime::Diagnostic;
use longhaul_aws::jobs::StoreError;
use longhaul_domain::{ErrorCode, JobStatus};

use crate::failure_message::{self, Failure, PublicMessage};

/// A stage failure, named for the state machine. Its `Display` is the log's form (with the
/// internal detail); the state machine gets only [`StageError::public_message`].
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Worth retrying (throttling, a transient dependency failure).
    #[error("{0}")]
    Retryable(Failure),
    /// Retrying cannot help.
    #[error("{0}")]
    Fatal(Failure),
    /// Another attempt holds the job; stop without side effects. (Never recorded on the job:
    /// the state machine ends such an execution without a failure.)
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The job is not waiting to be claimed. (Never recorded on the job either.)
    #[error("{0}")]
    NotClaimable(String),
    /// The stage ran past its policy's stage timeout in this attempt: the attempt ends, and
    /// the job is retried in a new one within its attempts (the state machine does not retry
    /// it within the attempt, whose stage clock has run out).
    #[error("{0}")]
    StageTimeout(Failure),
    /// The owner asked to cancel the running job.
    #[error("cancellation requested")]
    Cancelled,
    /// The owner asked to pause the running job: the stage parks it (never a failure, never
    /// an answer to the state machine — the work op turns it into the `paused` outcome).
    #[error("pause requested")]
    Paused,
}

impl StageError {
    /// The stable error name the state machine matches on.
    pub fn name(&self) -> &'static str {
        match self {
            StageError::Retryable(_) => ErrorCode::Retryable.as_str(),
            StageError::Fatal(_) => ErrorCode::Fatal.as_str(),
            StageError::LeaseLost(_) => ErrorCode::LeaseLost.as_str(),
            StageError::NotClaimable(_) => ErrorCode::NotClaimable.as_str(),
            StageError::StageTimeout(_) => ErrorCode::StageTimeout.as_str(),
            StageError::Cancelled => ErrorCode::Cancelled.as_str(),
            StageError::Paused => ErrorCode::Paused.as_str(),
        }
    }
}

impl StageError {
    /// A failure worth retrying: `public` for the job's owner, `internal` for the log only.
    pub fn retryable(public: PublicMessage, internal: impl std::fmt::Display) -> Self {
        StageError::Retryable(Failure::because(public, internal))
    }

    /// A failure retrying cannot help: `public` for the job's owner, `internal` for the log.
    pub fn fatal(public: PublicMessage, internal: impl std::fmt::Display) -> Self {
        StageError::Fatal(Failure::because(public, internal))
    }

    /// Stage `stage` ran past its stage timeout `limit` (`internal`, for the log: how long it
    /// ran, since when).
    pub fn stage_timeout(stage: &str, limit: Duration, internal: impl std::fmt::Display) -> Self {
        let public = PublicMessage::domain(format!(
            "stage `{stage}` ran past its {} s stage timeout",
            limit.as_secs()
        ));
        StageError::StageTimeout(Failure::because(public, internal))
    }

    /// The message the state machine gets (and for `Job.Retryable`, `Job.Fatal` and
    /// `Job.StageTimeout`, the job's `error.message`): never the internal detail.
    pub fn public_message(&self) -> String {
        match self {
            StageError::Retryable(failure)
            | StageError::Fatal(failure)
            | StageError::StageTimeout(failure) => failure.public.to_string(),
            other => other.to_string(),
        }
    }
}

impl From<StageError> for Diagnostic {
    fn from(err: StageError) -> Diagnostic {
        Diagnostic { error_type: err.name().to_owned(), error_message: err.public_message() }
    }
}

/// An AWS call failed where no more particular message applies: the client is told a
/// dependency failed (and why, if the service refused for good: then it is not retried), the
/// log gets the chain.
impl From<longhaul_aws::AwsError> for StageError {
    fn from(err: longhaul_aws::AwsError) -> Self {
        StageError::from(failure_message::aws_failure(failure_message::SERVICE_FAILED, &err))
    }
}

/// A store failure during an attempt's own writes: a refused condition means the lease is
/// gone; anything else is worth retrying.
pub(crate) fn fenced(err: StoreError) -> StageError {
    match err {
        StoreError::Conflict { current } => StageError::LeaseLost(match current {
            Some(job) => format!("job is {} (attempt {})", job.status, job.attempt),
            None => "progress write refused".into(),
        }),
        StoreError::Illegal(e) => StageError::fatal(
            PublicMessage::fixed("the job is not in a state that allows this step"),
            e,
        ),
        other => store_failed(other),
    }
}

/// A refused write of an attempt's end (see [`fenced`]), except that a refusal because the
/// owner asked to cancel the job while it still runs under `lease` — the condition of a
/// [`TransitionRequest::unless_cancelled`] change — is [`StageError::Cancelled`]: the caller
/// ends the job `cancelled` instead.
///
/// [`TransitionRequest::unless_cancelled`]: longhaul_aws::jobs::TransitionRequest::unless_cancelled
pub(crate) fn end_refused(err: StoreError, lease: &str) -> StageError {
    match err {
        StoreError::Conflict { current: Some(job) }
            if job.status == JobStatus::Running
                && job.lease.as_deref() == Some(lease)
                && job.cancellation.is_some() =>
        {
            StageError::Cancelled
        }
        other => fenced(other),
    }
}

/// The job table failed (retried).
pub(crate) fn store_failed(err: StoreError) -> StageError {
    StageError::retryable(failure_message::STORE_FAILED, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_machine_gets_the_public_message_and_the_log_the_chain() {
        let chain = longhaul_aws::AwsError {
            context: "get s3://longhaul-data/uploads/u/x.csv from byte 0".into(),
            detail: "service error: unhandled error (AccessDenied): User: \
                arn:aws:sts::123456789012:assumed-role/StageRole/Stage is not authorized"
                .into(),
            refusal: None,
        };
        let err = StageError::retryable(failure_message::INPUT_UNREADABLE, &chain);
        assert!(err.to_string().contains("arn:aws:sts::123456789012"), "the log keeps it: {err}");
        let diagnostic = Diagnostic::from(err);
        assert_eq!(diagnostic.error_type, "Job.Retryable");
        assert_eq!(diagnostic.error_message, "the input upload could not be read");

        // An AWS error with no particular message, and a store error: generic, retried.
        let diagnostic = Diagnostic::from(StageError::from(chain));
        assert_eq!(
            (diagnostic.error_type.as_str(), diagnostic.error_message.as_str()),
            ("Job.Retryable", "a service the job depends on failed")
        );
        let store = StoreError::Aws(longhaul_aws::AwsError {
            context: "update job j".into(),
            detail: "arn:aws:dynamodb:eu-west-1:123456789012:table/jobs".into(),
            refusal: None,
        });
        let diagnostic = Diagnostic::from(fenced(store));
        assert_eq!(diagnostic.error_message, "the job's record could not be read or updated");
    }

    #[test]
    fn a_refusal_fails_at_once_saying_why_and_naming_nothing() {
        let denied = longhaul_aws::AwsError {
            context: "get s3://longhaul-data/uploads/u/x.csv".into(),
            detail: "AccessDenied: arn:aws:iam::123456789012:role/Stage".into(),
            refusal: Some(longhaul_aws::Refusal::AccessDenied),
        };
        let diagnostic = Diagnostic::from(StageError::from(denied));
        assert_eq!(
            (diagnostic.error_type.as_str(), diagnostic.error_message.as_str()),
            ("Job.Fatal", "a service the job depends on failed: access was denied")
        );
        let missing = longhaul_aws::AwsError {
            context: "get".into(),
            detail: "NoSuchKey".into(),
            refusal: Some(longhaul_aws::Refusal::NotFound),
        };
        let err = failure_message::aws_failure(failure_message::INPUT_UNREADABLE, &missing);
        assert_eq!(err.class, longhaul_worker::ErrorClass::Fatal);
        assert_eq!(err.public.as_str(), "the input upload could not be read: it does not exist");
    }

    #[test]
    fn what_a_job_kind_says_about_the_owners_data_is_shown_as_it_is() {
        let err = StageError::Fatal(Failure::new(PublicMessage::domain(
            "column \"country\" is not in the CSV header row",
        )));
        assert_eq!(
            Diagnostic::from(err).error_message,
            "column \"country\" is not in the CSV header row"
        );
    }
}
