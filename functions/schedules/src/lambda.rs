//! The functions of this crate as Lambdas: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `schedules` (the routes), `firing` (the schedule queue's consumer) or
//! `schedule_repair` (the hourly twin repair).

use aws_lambda_events::sqs::SqsEvent;
use lambda_http::{Request, service_fn};
use lambda_runtime::{Error, LambdaEvent};
use longhaul_aws::{
    config::Vars,
    sdk::{sdk_config_from, warm_up},
};

use crate::fire::{FireConfig, FireDeps};
use crate::{Config, Deps};

/// Runs the `schedules` function (the `/schedules` routes) under the Lambda runtime.
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

/// Runs the `firing` function (the schedule queue's consumer) under the Lambda runtime.
pub async fn run_firing() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let vars = Vars::from_env();
    let config = FireConfig::from_vars(&vars)?;
    let deps = FireDeps::new(&sdk_config_from(&vars)?, &config);
    warm_up(deps.warm_set()).await;
    let deps = &deps;
    lambda_runtime::run(lambda_runtime::service_fn(
        move |event: LambdaEvent<SqsEvent>| async move {
            Ok::<_, std::convert::Infallible>(crate::fire::handle(deps, event.payload).await)
        },
    ))
    .await
}

/// Runs the `schedule_repair` function (the hourly twin repair) under the Lambda runtime.
pub async fn run_repair() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let vars = Vars::from_env();
    let config = crate::repair::RepairConfig::from_vars(&vars)?;
    let deps = crate::repair::RepairDeps::new(&sdk_config_from(&vars)?, &config);
    let deps = &deps;
    lambda_runtime::run(lambda_runtime::service_fn(
        move |_event: LambdaEvent<serde_json::Value>| async move {
            Ok::<_, std::convert::Infallible>(crate::repair::repair(deps).await)
        },
    ))
    .await
}
