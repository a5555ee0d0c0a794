use aws_lambda_events::dynamodb::Event;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use longhaul_aws::{config::Vars, sdk::load_sdk_config};
use slots::{Config, Deps};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = Config::from_vars(&Vars::from_env())?;
    let deps = Deps::new(&load_sdk_config().await, &config);
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Event>| async move {
        Ok::<_, std::convert::Infallible>(slots::handle(deps, event.payload).await)
    }))
    .await
}
