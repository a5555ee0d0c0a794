use lambda_http::{Error, Request, service_fn};
use longhaul_aws::{config::Vars, sdk::load_sdk_config};
use uploads::{Config, Deps};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = Config::from_vars(&Vars::from_env())?;
    // No connection warm-up (see longhaul_aws::sdk::warm_up): presigning is local, this function
    // never calls S3 itself.
    let deps = Deps::new(&load_sdk_config().await, &config);
    let deps = &deps;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, std::convert::Infallible>(uploads::handle(deps, request).await)
    }))
    .await
}
