//! The `console` function as a Lambda: what the one `longhaul` binary runs when
//! `LONGHAUL_FUNCTION` is `console`.

use lambda_http::{Error, Request, service_fn};

/// Runs the `console` function under the Lambda runtime: its start-up (configuration, SDK
/// clients, connection warm-up) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    lambda_http::run(service_fn(|request: Request| async move {
        Ok::<_, std::convert::Infallible>(crate::handle(&request))
    }))
    .await
}
