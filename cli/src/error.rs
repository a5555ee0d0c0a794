//! What can go wrong, and the exit code each outcome maps to.

use std::process::ExitCode;

use crate::problem::Problem;

/// The documented exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The job succeeded, or the command did what it was asked.
    Ok = 0,
    /// The job ended `failed`.
    JobFailed = 1,
    /// The command line (or a file it names) is unusable.
    Usage = 2,
    /// The job ended `cancelled`.
    JobCancelled = 3,
    /// The API refused the request (including authentication), or could not be reached.
    Api = 4,
}

impl Exit {
    /// The exit code of a job that ended in `status` (`None`: the job is not terminal).
    pub fn for_status(status: &str) -> Option<Exit> {
        match status {
            "succeeded" | "expired" => Some(Exit::Ok),
            "failed" => Some(Exit::JobFailed),
            "cancelled" => Some(Exit::JobCancelled),
            _ => None,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// A command's failure.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The API answered with an error (a problem+json, or a gateway's error).
    #[error("{0}")]
    Api(Box<Problem>),
    /// The API could not be reached or its answer not read.
    #[error("{what}: {}", chain(source))]
    Transport {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered something this client cannot read (not the documented shape).
    #[error("unexpected answer from the API: {0}")]
    Protocol(String),
    /// The command line, or an input file it names, is unusable.
    #[error("{0}")]
    Usage(String),
    /// A schedule's tick submitted no job (skipped or refused, with why), or its outcome
    /// could not be learnt in time.
    #[error("{0}")]
    Tick(String),
    /// A local file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl CliError {
    /// The exit code this failure ends the command with.
    pub fn exit(&self) -> Exit {
        match self {
            CliError::Usage(_) => Exit::Usage,
            CliError::Api(_)
            | CliError::Transport { .. }
            | CliError::Protocol(_)
            | CliError::Tick(_) => Exit::Api,
            CliError::Io { .. } => Exit::Api,
        }
    }

    /// A transport failure while doing `what`. The URL is left out of the message: a stream
    /// link or a presigned URL carries credentials.
    pub fn transport(what: impl Into<String>) -> impl FnOnce(reqwest::Error) -> CliError {
        let what = what.into();
        move |source| CliError::Transport { what, source: source.without_url() }
    }

    /// A local I/O failure while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CliError {
        let what = what.into();
        move |source| CliError::Io { what, source }
    }
}

/// `error` and its sources, outermost first (reqwest's own message alone rarely says why).
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_statuses_map_to_their_exit_codes() {
        assert_eq!(Exit::for_status("succeeded"), Some(Exit::Ok));
        assert_eq!(Exit::for_status("expired"), Some(Exit::Ok));
        assert_eq!(Exit::for_status("failed"), Some(Exit::JobFailed));
        assert_eq!(Exit::for_status("cancelled"), Some(Exit::JobCancelled));
        for live in ["pending", "queued", "running", "whatever"] {
            assert_eq!(Exit::for_status(live), None, "{live}");
        }
        assert_eq!(
            [Exit::Ok, Exit::JobFailed, Exit::Usage, Exit::JobCancelled, Exit::Api]
                .map(|e| e as u8),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn errors_map_to_their_exit_codes() {
        let problem = Problem::from_answer(401, None, br#"{"message":"Unauthorized"}"#);
        assert_eq!(CliError::Api(Box::new(problem)).exit(), Exit::Api);
        assert_eq!(CliError::Usage("x".into()).exit(), Exit::Usage);
        assert_eq!(CliError::Protocol("x".into()).exit(), Exit::Api);
    }
}
