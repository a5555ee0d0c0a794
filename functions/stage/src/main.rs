use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{load_sdk_config, warm_up},
};
use stage::{Config, Deps, StageInput};

#[tokio::main]
async fn main() -> Result<(), Error> {
    longhaul_aws::logs::init_subscriber();
    let config = Config::from_vars(&Vars::from_env())?;
    let deps = Deps::new(&load_sdk_config().await, &config);
    warm_up(async {
        tokio::join!(deps.jobs.warm(), deps.objects.warm(), deps.executions.warm());
    })
    .await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<StageInput>| async move {
        let deadline = stage::deadline_from_epoch_ms(event.context.deadline);
        let input = event.payload.with_worker_default(&event.context.invoked_function_arn);
        stage::handle(deps, input, deadline).await
    }))
    .await
}
