use expirer::{Config, Deps};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{load_sdk_config, warm_up},
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Config::from_vars(&Vars::from_env())?;
    let deps = Deps::new(&load_sdk_config().await, &config);
    warm_up(async {
        tokio::join!(deps.jobs.warm(), deps.objects.warm());
    })
    .await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        let deadline = expirer::deadline_from_epoch_ms(event.context.deadline);
        expirer::handle(deps, chrono::Utc::now(), deadline).await
    }))
    .await
}
