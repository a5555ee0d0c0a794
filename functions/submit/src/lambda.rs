//! The `submit` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `submit`.

use crate::{Config, Deps};
use lambda_http::{Error, Request, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{sdk_config_from, warm_up},
};

/// Runs the `submit` function under the Lambda runtime: its start-up (configuration, SDK
/// clients, connection warm-up) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let vars = Vars::from_env();
    let config = Config::from_vars(&vars)?;
    let deps = Deps::new(&sdk_config_from(&vars)?, &config);
    warm_up(deps.warm_set()).await;
    let deps = &deps;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, std::convert::Infallible>(crate::handle(deps, request).await)
    }))
    .await
}
