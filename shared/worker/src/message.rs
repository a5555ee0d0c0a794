//! What a failed stage tells the job's owner, and how it tells the framework to go on.

use std::borrow::Cow;
use std::fmt;

/// A message written for the job's owner: what went wrong in their terms. Built only from
/// fixed text ([`PublicMessage::fixed`]) or from what a job kind's own validation says about
/// the owner's data ([`PublicMessage::domain`]) — never from an infrastructure error, which
/// goes to the log only (see [`KindError::because`]).
///
/// A job's `error.message` is shown by `GET /jobs/{id}`, carried in its webhook and written to
/// its transition log: it must never name the infrastructure (bucket names, ARNs, SDK chains).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicMessage(Cow<'static, str>);

impl PublicMessage {
    /// A fixed message.
    pub const fn fixed(message: &'static str) -> Self {
        PublicMessage(Cow::Borrowed(message))
    }

    /// A message a job kind's own validation authored about the owner's input or parameters
    /// (a missing column, a file that is not CSV, invalid params): it names their data, not
    /// our infrastructure.
    pub fn domain(message: impl fmt::Display) -> Self {
        PublicMessage(Cow::Owned(message.to_string()))
    }

    /// The message.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PublicMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a stage failure is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying: the state machine retries the stage with backoff.
    Retryable,
    /// Retrying cannot help: the job fails.
    Fatal,
    /// The owner cancelled the job: the framework ends it `cancelled`. Raised by the context
    /// (a refused progress write), never by a kind.
    Cancelled,
    /// The owner paused the job: the framework parks it `paused` at its last checkpoint, and
    /// its resume continues from there. Raised by the context (a progress write after the
    /// stage was asked to stop for a pause), never by a kind.
    Paused,
    /// Another attempt holds the job: stop with no further side effects. Raised by the
    /// context, never by a kind.
    LeaseLost,
    /// The stage ran past its policy's `stage_timeout` in this attempt: the attempt ends and
    /// the job is retried in a new one (within its attempts). Raised by the context, never by
    /// a kind.
    StageTimeout,
}

/// Why a stage stopped without an outcome: a class, a [`PublicMessage`] for the job's owner
/// and, for the log only, the internal detail. Errors the context raises (cancellation, a lost
/// lease, a failed write) are of this type too: a kind propagates them with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindError {
    /// How the framework handles it.
    pub class: ErrorClass,
    /// What the job's owner is told.
    pub public: PublicMessage,
    /// What only the log is told.
    pub internal: Option<String>,
}

impl KindError {
    /// A failure worth retrying; `public` goes to the job's owner.
    pub fn retryable(public: PublicMessage) -> Self {
        KindError { class: ErrorClass::Retryable, public, internal: None }
    }

    /// A failure retrying cannot help; `public` goes to the job's owner.
    pub fn fatal(public: PublicMessage) -> Self {
        KindError { class: ErrorClass::Fatal, public, internal: None }
    }

    /// The owner cancelled the job (raised by contexts).
    pub fn cancelled() -> Self {
        KindError {
            class: ErrorClass::Cancelled,
            public: PublicMessage::fixed("cancellation requested"),
            internal: None,
        }
    }

    /// The owner paused the job (raised by contexts).
    pub fn paused() -> Self {
        KindError {
            class: ErrorClass::Paused,
            public: PublicMessage::fixed("pause requested"),
            internal: None,
        }
    }

    /// Another attempt holds the job (raised by contexts); `why` goes to the log.
    pub fn lease_lost(why: impl fmt::Display) -> Self {
        KindError {
            class: ErrorClass::LeaseLost,
            public: PublicMessage::fixed("another attempt holds the job"),
            internal: Some(why.to_string()),
        }
    }

    /// The stage ran past its stage timeout (raised by contexts); `public` says which stage
    /// and what timeout.
    pub fn stage_timeout(public: PublicMessage) -> Self {
        KindError { class: ErrorClass::StageTimeout, public, internal: None }
    }

    /// Adds the internal cause (an error chain), for the log only.
    pub fn because(mut self, internal: impl fmt::Display) -> Self {
        self.internal = Some(internal.to_string());
        self
    }

    /// Whether the owner cancelled the job.
    pub fn is_cancelled(&self) -> bool {
        self.class == ErrorClass::Cancelled
    }
}

/// The log's form: the public message, then the internal detail.
impl fmt::Display for KindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.internal {
            Some(internal) => write!(f, "{}: {internal}", self.public),
            None => write!(f, "{}", self.public),
        }
    }
}

impl std::error::Error for KindError {}
