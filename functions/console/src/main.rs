use lambda_http::{Error, Request, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    lambda_http::run(service_fn(|request: Request| async move {
        Ok::<_, std::convert::Infallible>(console::handle(&request))
    }))
    .await
}
