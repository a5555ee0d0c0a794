//! The `stage` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `stage`.

use std::sync::Arc;

use crate::{Config, Deps, StageInput};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{
    config::Vars,
    ports::Warm,
    sdk::{sdk_config_from, warm_up},
};

/// Runs the `stage` function under the Lambda runtime: its start-up (configuration, SDK
/// clients, connection warm-up) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    longhaul_aws::logs::init_subscriber();
    let vars = Vars::from_env();
    let config = Config::from_vars(&vars)?;
    let deps = Deps::new(&sdk_config_from(&vars)?, &config);
    // What a run's first request uses: the table (its claim, its success), and S3 (a kind's
    // inputs, a large result, a checkpoint). Step Functions opens its connection when a run
    // first hands its job over to the workflow.
    warm_up([deps.jobs.clone() as Arc<dyn Warm>, deps.objects.clone()]).await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<StageInput>| async move {
        let deadline = crate::deadline_from_epoch_ms(&*deps.clock, event.context.deadline);
        let input = event.payload.with_worker_default(&event.context.invoked_function_arn);
        crate::handle(deps, input, deadline).await
    }))
    .await
}
