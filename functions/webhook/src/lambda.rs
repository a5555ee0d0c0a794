//! The `webhook` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `webhook`.

use crate::{Config, Deps, SystemResolver};
use aws_lambda_events::sqs::SqsEvent;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{sdk_config_from, warm_up},
};

/// Runs the `webhook` function under the Lambda runtime: its start-up (configuration, SDK
/// clients, connection warm-up) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let vars = Vars::from_env();
    let config = Config::from_vars(&vars)?;
    let deps = Deps::new(&sdk_config_from(&vars)?, &config, std::sync::Arc::new(SystemResolver))?;
    warm_up(deps.warm_set()).await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, std::convert::Infallible>(crate::handle(deps, event.payload).await)
    }))
    .await
}
