//! The `console` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `console`.

use lambda_http::{Error, Request, service_fn};

/// Runs the `console` function under the Lambda runtime: its handler for every event (it has
/// no configuration and no AWS client), until the runtime stops.
pub async fn run() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    lambda_http::run(service_fn(|request: Request| async move {
        Ok::<_, std::convert::Infallible>(crate::handle(&request))
    }))
    .await
}
