//! The functions host as its own process, for tests that kill it (`tests/tests/host_kill.rs`):
//! exactly what `make dev` runs, configured by the same `LONGHAUL_*` variables.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").with_writer(std::io::stderr).init();
    longhaul_aws::sdk::install_tls_provider();
    longhaul_local::run_until_signal(longhaul_local::Options::dev(longhaul_tests::root())?).await
}
