//! The one Lambda binary: runs the function `LONGHAUL_FUNCTION` names (see the crate docs).

use longhaul_lambda::Function;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    Function::from_env()?.run().await
}
