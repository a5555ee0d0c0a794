//! `longhaul`: the command line client of the longhaul job API (see docs/cli.md).

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = longhaul_cli::cli::Cli::parse();
    longhaul_cli::run(cli).into()
}
