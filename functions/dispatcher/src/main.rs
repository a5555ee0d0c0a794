use aws_lambda_events::sqs::SqsEvent;
use dispatcher::{Config, Deps};
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
        tokio::join!(deps.jobs.warm(), deps.executions.warm());
    })
    .await;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, std::convert::Infallible>(dispatcher::handle(deps, event.payload).await)
    }))
    .await
}
