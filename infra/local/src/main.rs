//! `longhaul-local`: run the local stack (`make dev`), mint tokens (`make token`), stop the
//! emulator (`make stop`).

use std::path::PathBuf;

use anyhow::Context;
use longhaul_local::{Options, emulator, template::Template};

fn root() -> anyhow::Result<PathBuf> {
    match std::env::var_os("LONGHAUL_ROOT") {
        Some(root) => Ok(PathBuf::from(root)),
        None => std::env::current_dir().context("reading the current directory"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "info,aws_config=warn,aws_smithy_runtime=warn,hyper=warn".into()
            }),
        )
        .init();
    longhaul_aws::sdk::install_tls_provider();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["dev"] => dev().await,
        ["token", sub] => {
            let options = Options::dev(root()?)?;
            let template = Template::load(
                &options.root.join("template.yaml"),
                &options.stack,
                "",
                "",
                &Default::default(),
            )?;
            let authorizer = longhaul_local::authorizer(&template, options.state_dir.as_deref())?;
            println!("{}", authorizer.token(sub, 86_400));
            Ok(())
        }
        ["stop"] => {
            match emulator::stop_recorded(
                Options::dev(root()?)?
                    .state_dir
                    .as_deref()
                    .unwrap_or(std::path::Path::new(".local")),
            )? {
                Some(pid) => println!("stopped the emulator (pid {pid})"),
                None => println!("no emulator is recorded as running"),
            }
            Ok(())
        }
        _ => {
            eprintln!("usage: longhaul-local dev | token <principal> | stop");
            std::process::exit(2);
        }
    }
}

async fn dev() -> anyhow::Result<()> {
    longhaul_local::run_until_signal(Options::dev(root()?)?).await
}
