//! The baseline of the cold-start benchmark (`coldstart`): a bare `lambda_runtime` function that
//! returns its event. No SDK, no tracing, nothing at init — the least a Rust Lambda can do, built
//! with the same release profile as the functions.

use lambda_runtime::{Error, LambdaEvent, service_fn};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|event: LambdaEvent<serde_json::Value>| async move {
        Ok::<_, Error>(event.payload)
    }))
    .await
}
