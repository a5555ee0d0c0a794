//! AWS adapters for longhaul: one module per AWS service, plus the pieces every function
//! shares (SDK configuration, typed environment, HTTP API helpers).
//!
//! Functions build these once at init and pass them to plain async handlers, so tests call
//! the same handlers against the local stack.

pub mod api;
pub mod config;
pub mod executions;
pub mod jobs;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod objects;
pub mod queue;
pub mod sdk;
pub mod slots;
pub mod streams;

use std::error::Error as StdError;

/// An AWS call that failed, with what we were doing when it did.
#[derive(Debug, thiserror::Error)]
#[error("{context}: {detail}")]
pub struct AwsError {
    /// What the call was for.
    pub context: String,
    /// The SDK's full error chain.
    pub detail: String,
}

impl AwsError {
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
        AwsError { context: context.into(), detail }
    }
}

/// What every end of a job (succeeded, failed, cancelled — by its stage or by the reaper)
/// leaves to clean: its checkpoints are deleted (nothing resumes an ended job; a retry is a
/// new job). The job left the running index in the write that ended it.
pub async fn tidy_after_end(
    objects: &objects::ObjectStore,
    job_id: &str,
) -> Result<(), jobs::StoreError> {
    objects.delete_prefix(&objects::checkpoints_prefix(job_id)).await?;
    Ok(())
}
