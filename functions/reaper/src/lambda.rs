//! The `reaper` function as a Lambda: what the one `longhaul-lambda` binary runs when
//! `LONGHAUL_FUNCTION` is `reaper`.

use crate::{Config, Deps};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{config::Vars, sdk::sdk_config_from};

/// Runs the `reaper` function under the Lambda runtime: its start-up (configuration and
/// SDK clients) and then its handler for every event, until the runtime stops.
pub async fn run() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let vars = Vars::from_env();
    let config = Config::from_vars(&vars)?;
    let deps = Deps::new(&sdk_config_from(&vars)?, &config);
    // No connection warm-up (see longhaul_aws::sdk::warm_up): it takes handshakes out of the
    // latency of a caller waiting on the first event, and no one waits on a scheduled run.
    let deps = &deps;
    lambda_runtime::run(service_fn(move |_event: LambdaEvent<serde_json::Value>| async move {
        crate::handle(deps, deps.clock.now()).await
    }))
    .await
}
