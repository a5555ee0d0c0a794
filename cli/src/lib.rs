//! The `longhaul` command line client: submit jobs, watch them with a live progress bar (from
//! the job's server-sent event stream, or by polling), upload inputs and download results.
//!
//! `main.rs` only parses the arguments; [`run`] does the rest and maps the outcome to one of
//! the documented exit codes ([`error::Exit`]).

#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod commands;
pub mod error;
pub mod output;
pub mod params;
pub mod problem;
pub mod watch;

use error::{CliError, Exit};
use output::Output;

/// Runs one parsed command line and returns its exit code. Errors are reported here: a
/// human line on stderr and, with `--json`, an `{"error": …}` document on stdout.
pub fn run(cli: cli::Cli) -> Exit {
    install_tls_provider();
    let out = Output::new(cli.global.json, cli.global.verbose);
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(err) => {
                out.error(&CliError::Io { what: "starting the async runtime".into(), source: err });
                return Exit::Api;
            }
        };
    match runtime.block_on(commands::dispatch(&cli, &out)) {
        Ok(exit) => exit,
        Err(err) => {
            out.error(&err);
            err.exit()
        }
    }
}

/// reqwest is built without a bundled crypto provider: the workspace's rustls uses `ring`.
fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none()
        && rustls::crypto::ring::default_provider().install_default().is_err()
    {
        // Another thread installed one between the check and the install: that one serves.
    }
}
