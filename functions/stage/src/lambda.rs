//! The `stage` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `stage`.

use crate::{Config, Deps, StageInput};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{sdk_config_from, warm_up},
};

/// Runs the `stage` function under the Lambda runtime: its start-up (configuration, SDK
/// clients, connection warm-up) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    longhaul_aws::logs::init_subscriber();
    let vars = Vars::from_env();
    let config = Config::from_vars(&vars)?;
    let deps = Deps::new(&sdk_config_from(&vars)?, &config);
    warm_up(deps.warm_set()).await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<StageInput>| async move {
        let deadline = crate::deadline_from_epoch_ms(&*deps.clock, event.context.deadline);
        let input = event.payload.with_worker_default(&event.context.invoked_function_arn);
        crate::handle(deps, input, deadline).await
    }))
    .await
}
