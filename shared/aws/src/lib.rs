//! AWS adapters for longhaul: one module per AWS service, plus the pieces every function
//! shares (SDK configuration, typed environment, HTTP API helpers).
//!
//! Functions build these once at init and pass them to plain async handlers, so tests call
//! the same handlers against the local stack.

pub mod api;
pub mod callbacks;
pub mod client;
pub mod config;
pub mod endpoint_events;
pub mod executions;
pub mod invocations;
pub mod jobs;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod objects;
pub mod pool_rate;
pub mod ports;
pub mod queue;
pub mod redact;
pub mod runs;
pub mod scheduler;
pub mod sdk;
pub mod secrets;
pub mod slots;
pub mod streams;
pub mod workers;

use longhaul_domain::JobId;
use std::error::Error as StdError;

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

/// An AWS call that failed, with what we were doing when it did.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {detail}")]
pub struct AwsError {
    /// What the call was for.
    pub context: String,
    /// The SDK's full error chain.
    pub detail: String,
    /// Set when the service refused the request in a way no retry changes (see
    /// [`AwsError::service`]); unset for throttling, 5xx, timeouts, network failures and
    /// errors that are not a service's answer — those are worth retrying.
    pub refusal: Option<Refusal>,
}

/// Why a service refused a request for good: its error code, classified. Retrying such a
/// request only delays the failure (and, for a job, spends its retry budget on nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Access denied (an IAM policy, a bucket policy, a service control policy).
    AccessDenied,
    /// What the request names does not exist (an object, a bucket, a resource).
    NotFound,
    /// The request itself is invalid.
    Invalid,
    /// The encryption key the data needs is disabled, pending deletion or gone.
    KeyUnusable,
}

impl Refusal {
    /// The refusal an AWS error code stands for, if it is one.
    pub fn of_code(code: &str) -> Option<Refusal> {
        Some(match code {
            "AccessDenied"
            | "AccessDeniedException"
            | "UnauthorizedOperation"
            | "AllAccessDisabled"
            | "KMS.AccessDeniedException" => Refusal::AccessDenied,
            "NoSuchKey"
            | "NoSuchBucket"
            | "NoSuchUpload"
            | "NotFound"
            | "ResourceNotFoundException" => Refusal::NotFound,
            "ValidationException"
            | "InvalidArgument"
            | "InvalidRequest"
            | "InvalidParameterValue"
            | "EntityTooLarge" => Refusal::Invalid,
            "KMS.DisabledException"
            | "KMS.KMSInvalidStateException"
            | "KMS.NotFoundException"
            | "DisabledException"
            | "KMSInvalidStateException" => Refusal::KeyUnusable,
            _ => return None,
        })
    }

    /// What a job's owner is told about it (no resource names: those stay in the log).
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::AccessDenied => "access was denied",
            Refusal::NotFound => "it does not exist",
            Refusal::Invalid => "the request was refused as invalid",
            Refusal::KeyUnusable => "its encryption key is disabled or gone",
        }
    }
}

impl AwsError {
    /// Wraps an SDK operation's error like [`AwsError::new`], and classifies a service's
    /// refusal that no retry changes ([`Refusal`]) from its error code.
    pub fn service<E, R>(context: impl Into<String>, err: SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + StdError + 'static,
        R: std::fmt::Debug,
    {
        let refusal = match &err {
            SdkError::ServiceError(service) => service.err().code().and_then(Refusal::of_code),
            _ => None,
        };
        AwsError { refusal, ..AwsError::new(context, err) }
    }

    /// Wraps any SDK error with context, keeping the whole source chain in the message (the
    /// SDK's own `Display` says only "service error").
    pub fn new(context: impl Into<String>, err: impl StdError) -> Self {
        let mut detail = err.to_string();
        let mut source = err.source();
        while let Some(inner) = source {
            detail.push_str(": ");
            detail.push_str(&inner.to_string());
            source = inner.source();
        }
        AwsError { context: context.into(), detail, refusal: None }
    }
}

/// Whether DynamoDB refused a conditional write because its condition did not hold: a race
/// lost, a fence, an idempotent repeat — the expected answer of a conditional write, which each
/// caller turns into its own outcome, never a failure.
pub fn condition_refused<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> bool {
    err.as_service_error().and_then(ProvideErrorMetadata::code)
        == Some("ConditionalCheckFailedException")
}

/// What the end of a job (by its stage or by the reaper) leaves to clean, when nobody kept
/// track of its checkpoint objects (the reaper's ends, a stage's end redone by a retried call):
/// [`tidy_after_end_with`] with [`Leftovers::Unknown`], so a succeeded job's checkpoints are
/// found by listing them.
pub async fn tidy_after_end(
    objects: &(impl ports::ObjectCleanup + ?Sized),
    job_id: &JobId,
    ended: longhaul_domain::JobStatus,
) -> Result<(), jobs::StoreError> {
    tidy_after_end_with(objects, job_id, ended, Leftovers::Unknown).await
}

/// What is known of the checkpoint objects a job leaves when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftovers<'a> {
    /// Not known key by key: whatever is under the job's checkpoints prefix (a LIST, then a
    /// delete per object).
    Unknown,
    /// Exactly these objects: the stage's own success knows them (the checkpoint the progress
    /// record points at — the stage deletes each one it supersedes as it goes — and the staged
    /// files it published). Deleted by key, no LIST; none is no S3 call at all. A key outside
    /// the job's own checkpoints (a retried job's checkpoint this job started from) is never
    /// deleted. Objects a crashed or stale invocation left behind are the bucket's
    /// `checkpoints-backstop` lifecycle rule's.
    Keys(&'a [String]),
}

/// What the end of a job leaves to clean. A succeeded job's checkpoints are deleted (nothing
/// resumes it): by key when `leftovers` names them, else by prefix. A failed or cancelled job
/// keeps them, so that `POST /jobs/{id}/retry` can start the new job from the last one; the
/// bucket's lifecycle rule deletes them after the records' retention (30 days). The job left
/// the running index in the write that ended it.
pub async fn tidy_after_end_with(
    objects: &(impl ports::ObjectCleanup + ?Sized),
    job_id: &JobId,
    ended: longhaul_domain::JobStatus,
    leftovers: Leftovers<'_>,
) -> Result<(), jobs::StoreError> {
    if ended != longhaul_domain::JobStatus::Succeeded {
        return Ok(());
    }
    let own = objects::checkpoints_prefix(job_id);
    match leftovers {
        Leftovers::Unknown => {
            objects.delete_prefix(&own).await?;
        }
        Leftovers::Keys(keys) => {
            let mut doomed: Vec<&str> = keys
                .iter()
                .map(String::as_str)
                .filter(|key| key.starts_with(&own) && key.len() > own.len())
                .collect();
            doomed.sort_unstable();
            doomed.dedup();
            let deletes = doomed.into_iter().map(|key| objects.delete(key));
            for deleted in futures::future::join_all(deletes).await {
                deleted?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn refusals_are_the_codes_no_retry_changes() {
        assert_eq!(Refusal::of_code("AccessDenied"), Some(Refusal::AccessDenied));
        assert_eq!(Refusal::of_code("NoSuchKey"), Some(Refusal::NotFound));
        assert_eq!(Refusal::of_code("ValidationException"), Some(Refusal::Invalid));
        assert_eq!(Refusal::of_code("KMS.DisabledException"), Some(Refusal::KeyUnusable));
        for transient in [
            "ThrottlingException",
            "SlowDown",
            "ProvisionedThroughputExceededException",
            "InternalError",
            "ServiceUnavailable",
            "RequestTimeout",
            "ConditionalCheckFailedException",
        ] {
            assert_eq!(Refusal::of_code(transient), None, "{transient}");
        }
        assert_eq!(AwsError::new("x", std::fmt::Error).refusal, None);
    }
}
