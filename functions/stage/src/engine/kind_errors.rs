//! The kind's errors and the stage's, each in the other's terms: same class, same messages.

use super::*;

/// The kind's view of a stage error the engine raised: same class, same messages.
impl From<StageError> for KindError {
    fn from(err: StageError) -> Self {
        match err {
            StageError::Retryable(f) => with_internal(KindError::retryable(f.public), f.internal),
            StageError::Fatal(f) => with_internal(KindError::fatal(f.public), f.internal),
            StageError::StageTimeout(f) => {
                with_internal(KindError::stage_timeout(f.public), f.internal)
            }
            StageError::Cancelled => KindError::cancelled(),
            StageError::Paused => KindError::paused(),
            StageError::LeaseLost(why) | StageError::NotClaimable(why) => {
                KindError::lease_lost(why)
            }
        }
    }
}

fn with_internal(err: KindError, internal: Option<String>) -> KindError {
    match internal {
        Some(internal) => err.because(internal),
        None => err,
    }
}

/// A kind's error, named for the state machine.
impl From<KindError> for StageError {
    fn from(err: KindError) -> Self {
        use longhaul_worker::ErrorClass;
        match err.class {
            ErrorClass::Retryable => {
                StageError::Retryable(Failure { public: err.public, internal: err.internal })
            }
            ErrorClass::Fatal => {
                StageError::Fatal(Failure { public: err.public, internal: err.internal })
            }
            ErrorClass::StageTimeout => {
                StageError::StageTimeout(Failure { public: err.public, internal: err.internal })
            }
            ErrorClass::Cancelled => StageError::Cancelled,
            ErrorClass::Paused => StageError::Paused,
            ErrorClass::LeaseLost => {
                StageError::LeaseLost(err.internal.unwrap_or_else(|| err.public.to_string()))
            }
        }
    }
}
