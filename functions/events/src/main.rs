use events::{Config, Deps};
use lambda_http::{Error, Request, service_fn};
use longhaul_aws::{
    config::Vars,
    sdk::{load_sdk_config, warm_up},
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = Config::from_vars(&Vars::from_env())?;
    let deps = std::sync::Arc::new(Deps::new(&load_sdk_config().await, &config));
    warm_up(async {
        tokio::join!(deps.jobs.warm(), deps.token_key.warm());
    })
    .await;
    lambda_http::run_with_streaming_response(service_fn(move |request: Request| {
        let deps = deps.clone();
        async move { Ok::<_, std::convert::Infallible>(events::handle(deps, request).await) }
    }))
    .await
}
