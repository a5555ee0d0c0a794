//! The local stack: longhaul on a laptop, with no AWS and no Docker.
//!
//! * **moto** (pinned, in the project's virtualenv) plays DynamoDB, SQS, S3 and Step
//!   Functions, and executes the real state machine definition.
//! * **the edge** hosts every function of `template.yaml` in-process and serves
//!   - the HTTP API (API Gateway HTTP API, payload 2.0, JWT authorizer emulated),
//!   - the Lambda Invoke endpoint moto's interpreter calls for task states,
//!   - SQS and DynamoDB stream event source mappings and EventBridge schedules,
//!   - EventBridge Scheduler's firing of the schedules the functions create (moto stores
//!     them, `triggers::scheduler` fires them),
//!   - `/_local/` routes (AWS call counts, firing schedules).
//!
//! Every resource and trigger is derived from `template.yaml`, so what runs here is what
//! deploys. Function code is unaware of all this: it reads the standard SDK configuration.

pub mod checks;
pub mod hosting;
pub mod stack;
pub mod triggers;

// The paths other crates (the end-to-end tests, the benchmarks) name.
pub use checks::{faults, iam};
pub use stack::{emulator, model, template};

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use hosting::{edge, hosted, http_api, jwt};
use stack::provision;
use triggers::{event_sources, scheduler, schedules, streams};

pub use emulator::Lifetime;

/// How to run the stack.
#[derive(Debug, Clone)]
pub struct Options {
    /// The repository root (holds `template.yaml` and `.venv`).
    pub root: PathBuf,
    /// HTTP API port (0: any free port).
    pub api_port: u16,
    /// Edge port: the AWS endpoint of the functions, and moto's `MOTO_PORT` (0: any).
    pub edge_port: u16,
    /// Emulator port (0: any).
    pub moto_port: u16,
    /// Whether the emulator may outlive this process.
    pub lifetime: Lifetime,
    /// Where the emulator record, its log and the JWT key live (`None`: nowhere; tests).
    pub state_dir: Option<PathBuf>,
    /// Variables given to every function on top of what the template declares (shorter
    /// thresholds, `LONGHAUL_ALLOW_INSECURE_CALLBACKS`), replacing declared values.
    pub env_overrides: BTreeMap<String, String>,
    /// Stack name (prefix of physical names).
    pub stack: String,
    /// The job kinds every hosted function knows (submit validates through it, status lists
    /// it, the stage runs it, the reaper reads its policies): the catalog
    /// (`longhaul_jobs::registry()`) unless a test brings kinds of its own. `ENABLED_JOB_TYPES`
    /// still decides which of them are accepted.
    pub registry: longhaul_worker::Registry,
}

impl Options {
    /// `make dev`: fixed ports (overridable by `LONGHAUL_API_PORT`, `LONGHAUL_EDGE_PORT`,
    /// `LONGHAUL_MOTO_PORT`), state in `.local/` (or `LONGHAUL_STATE_DIR`), an emulator that
    /// survives a crash of this process, and every `LONGHAUL_*` variable of this environment
    /// passed to every function.
    pub fn dev(root: PathBuf) -> anyhow::Result<Self> {
        let port = |name: &str, default: u16| -> anyhow::Result<u16> {
            std::env::var(name)
                .ok()
                .map(|v| v.parse().with_context(|| format!("{name}={v}")))
                .unwrap_or(Ok(default))
        };
        let state_dir = std::env::var_os("LONGHAUL_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".local"));
        Ok(Options {
            state_dir: Some(state_dir),
            root,
            api_port: port("LONGHAUL_API_PORT", 3000)?,
            edge_port: port("LONGHAUL_EDGE_PORT", 4510)?,
            moto_port: port("LONGHAUL_MOTO_PORT", 4511)?,
            lifetime: Lifetime::Detached,
            env_overrides: std::env::vars().filter(|(k, _)| k.starts_with("LONGHAUL_")).collect(),
            stack: "longhaul".into(),
            registry: longhaul_jobs::registry(),
        })
    }

    /// Tests: free ports, an emulator that dies with the test process.
    pub fn ephemeral(root: PathBuf) -> Self {
        Options {
            root,
            api_port: 0,
            edge_port: 0,
            moto_port: 0,
            lifetime: Lifetime::DiesWithParent,
            state_dir: None,
            env_overrides: BTreeMap::new(),
            stack: "longhaul".into(),
            registry: longhaul_jobs::registry(),
        }
    }
}

/// A running local stack.
pub struct LocalStack {
    /// `http://127.0.0.1:<api port>`.
    pub api_url: String,
    /// `http://127.0.0.1:<edge port>`: the AWS endpoint functions use (calls are counted).
    pub edge_url: String,
    /// The emulator.
    pub emulator: emulator::Emulator,
    /// The template as resolved.
    pub template: template::Template,
    /// AWS call counts.
    pub calls: edge::CallCounter,
    /// EMF metric lines the hosted functions emitted (`GET /_local/metrics`).
    pub metrics: http_api::MetricLines,
    /// The fault injector (`/_local/faults`, `/_local/journal`).
    pub faults: Arc<faults::Faults>,
    /// Finished invocations of the hosted functions (`/_local/invocations`).
    pub invocations: hosted::InvocationLog,
    /// AWS calls the edge refused because the caller's role does not grant them
    /// (`/_local/iam/denials`).
    pub denials: edge::Denials,
    authorizer: jwt::Authorizer,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// SDK configuration for talking to `endpoint` with the emulator's dummy credentials.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    sdk_config_with(endpoint, longhaul_aws::sdk::http_client()).await
}

async fn sdk_config_with(
    endpoint: &str,
    http_client: impl aws_smithy_runtime_api::client::http::HttpClient + 'static,
) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new(template::REGION))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            iam::ADMIN_KEY,
            "local",
            None,
            None,
            "local",
        ))
        .http_client(http_client)
        .load()
        .await
}

/// `sdk` signing as the function `logical` (its own access key id): the edge tells the
/// caller of every request by it and checks the call against that function's role.
pub fn function_identity(sdk: &SdkConfig, logical: &str) -> SdkConfig {
    let credentials = aws_sdk_sqs::config::Credentials::new(
        iam::access_key_id(logical),
        "local",
        None,
        None,
        "local",
    );
    sdk.to_builder()
        .credentials_provider(aws_sdk_sqs::config::SharedCredentialsProvider::new(credentials))
        .build()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The job kind a deployment leaves off by default (`EnabledJobTypes`) but the local stack
/// turns on: the walk-through, the tests and the benchmarks run `demo` jobs.
pub const LOCAL_EXTRA_JOB_TYPE: &str = "demo";

/// One step of the backoff between attempts on the local stack (`RetryBaseDelaySeconds`):
/// seconds instead of the deployed minute, so a job retried across attempts finishes while
/// someone watches (and in the tests).
pub const LOCAL_RETRY_BASE_DELAY_SECONDS: &str = "1";

/// The template parameters the local stack sets on top of the template's defaults
/// (`defaults`): `EnabledJobTypes` with [`LOCAL_EXTRA_JOB_TYPE`] added, and
/// [`LOCAL_RETRY_BASE_DELAY_SECONDS`].
pub fn local_parameters(defaults: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut overrides = BTreeMap::new();
    if defaults.contains_key("RetryBaseDelaySeconds") {
        overrides
            .insert("RetryBaseDelaySeconds".to_owned(), LOCAL_RETRY_BASE_DELAY_SECONDS.to_owned());
    }
    if let Some(enabled) = defaults.get("EnabledJobTypes") {
        let mut kinds: Vec<&str> =
            enabled.split(',').map(str::trim).filter(|k| !k.is_empty()).collect();
        if !kinds.contains(&LOCAL_EXTRA_JOB_TYPE) {
            kinds.insert(0, LOCAL_EXTRA_JOB_TYPE);
        }
        overrides.insert("EnabledJobTypes".to_owned(), kinds.join(","));
    }
    overrides
}

/// The JWT authorizer of the template's API, with the key kept in `key_dir` (or a fresh
/// key when `None`).
pub fn authorizer(
    template: &template::Template,
    key_dir: Option<&std::path::Path>,
) -> anyhow::Result<jwt::Authorizer> {
    let param = |name: &str| template.parameters.get(name).cloned().unwrap_or_default();
    let temp;
    let path = match key_dir {
        Some(dir) => dir.join("jwt-signing-key"),
        None => {
            temp = std::env::temp_dir().join(format!("longhaul-key-{}", uuid::Uuid::new_v4()));
            temp.clone()
        }
    };
    let authorizer =
        jwt::Authorizer::from_key_file(&path, &param("JwtIssuer"), &param("JwtAudience"))?;
    if key_dir.is_none() {
        std::fs::remove_file(&path).ok();
    }
    Ok(authorizer)
}

/// Runs the stack with `options` until SIGINT or SIGTERM (`make dev`), printing where
/// everything listens.
pub async fn run_until_signal(options: Options) -> anyhow::Result<()> {
    let stack = LocalStack::start(options).await?;
    println!();
    println!("longhaul is running locally");
    println!("  API          {}", stack.api_url);
    println!(
        "  AWS endpoint {}  (functions and Step Functions tasks; counts at {}/_local/aws-calls)",
        stack.edge_url, stack.api_url
    );
    println!(
        "  emulator     {}  (pid {}; survives a crash of this process, `make stop` ends it)",
        stack.emulator.url, stack.emulator.pid
    );
    println!("  token        make token SUB=alice");
    println!("Ctrl-C stops everything.");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    println!("stopping…");
    stack.shutdown();
    Ok(())
}

impl LocalStack {
    /// Starts (or adopts) the emulator, provisions the template's resources and serves.
    pub async fn start(options: Options) -> anyhow::Result<LocalStack> {
        longhaul_aws::sdk::install_tls_provider();
        let edge_listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], options.edge_port)))
                .await
                .with_context(|| format!("binding the edge port {}", options.edge_port))?;
        let edge_port = edge_listener.local_addr()?.port();
        let api_listener =
            tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], options.api_port)))
                .await
                .with_context(|| format!("binding the API port {}", options.api_port))?;
        let api_port = api_listener.local_addr()?.port();
        let moto_port = if options.moto_port == 0 { free_port()? } else { options.moto_port };
        let venv = std::env::var_os("LONGHAUL_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| options.root.join(".venv"));
        let emulator = emulator::ensure(
            &venv.join("bin/moto_server"),
            moto_port,
            edge_port,
            options.lifetime,
            options.state_dir.as_deref(),
        )
        .await?;
        let edge_url = format!("http://127.0.0.1:{edge_port}");
        let api_url = format!("http://127.0.0.1:{api_port}");

        let load = |overrides: &BTreeMap<String, String>| {
            template::Template::load(
                &options.root.join("template.yaml"),
                &options.stack,
                &edge_url,
                &api_url,
                overrides,
            )
        };
        let template = load(&local_parameters(&load(&BTreeMap::new())?.parameters))?;
        let direct = sdk_config(&emulator.url).await;
        let clients = provision::Clients {
            dynamodb: aws_sdk_dynamodb::Client::new(&direct),
            sqs: aws_sdk_sqs::Client::new(&direct),
            s3: aws_sdk_s3::Client::new(&direct),
            sfn: aws_sdk_sfn::Client::new(&direct),
            secrets: aws_sdk_secretsmanager::Client::new(&direct),
            scheduler: aws_sdk_scheduler::Client::new(&direct),
        };
        provision::provision(&template, &clients).await?;

        // The functions' SDK goes through the fault injector (inert until a plan is set).
        let faults = Arc::new(faults::Faults::default());
        // Without stalled-stream protection: its timers run on while an injected pause holds a
        // call's request body, and it would end the pause after a few seconds, where a frozen
        // sandbox (what a pause stands for) freezes those timers too.
        let function_sdk = sdk_config_with(
            &edge_url,
            faults::FaultyHttpClient::new(longhaul_aws::sdk::http_client(), faults.clone()),
        )
        .await
        .to_builder()
        .stalled_stream_protection(
            aws_config::stalled_stream_protection::StalledStreamProtectionConfig::disabled(),
        )
        .build();
        let invocations = hosted::InvocationLog::default();
        let policies = Arc::new(iam::Policies::from_template(&template)?);
        let mut hosted = Vec::new();
        for mut spec in model::functions(&template)? {
            spec.env.extend(options.env_overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
            hosted.push(hosted::host(
                &spec,
                &function_identity(&function_sdk, &spec.logical),
                &invocations,
                &options.registry,
            )?);
        }
        let denials = edge::Denials::default();
        let calls = edge::CallCounter::default();
        let metrics = http_api::MetricLines::default();
        let recorder = metrics.clone();
        if !longhaul_aws::metrics::set_sink(Box::new(move |line| recorder.record(line))) {
            tracing::debug!("a metrics sink is already installed (another stack in this process)");
        }
        let by_name: HashMap<String, hosted::HostedFunction> =
            hosted.iter().map(|f| (f.spec.name.clone(), f.clone())).collect();
        let edge_state = edge::EdgeState {
            functions: Arc::new(by_name),
            calls: calls.clone(),
            emulator_url: emulator.url.clone(),
            client: reqwest::Client::new(),
            dynamodb_lock: Default::default(),
            faults: faults.clone(),
            policies,
            denials: denials.clone(),
            sqs: clients.sqs.clone(),
        };
        let authorizer = authorizer(&template, options.state_dir.as_deref())?;
        let schedules = schedules::Schedules::new(&hosted);
        let firer = scheduler::Firer::new(
            &template,
            clients.scheduler.clone(),
            clients.sqs.clone(),
            edge_state.policies.clone(),
            denials.clone(),
        )?;
        let api_state = http_api::ApiState {
            routes: Arc::new(http_api::routes(&hosted)),
            authorizer: authorizer.clone(),
            calls: calls.clone(),
            schedules: schedules.clone(),
            scheduler: firer.clone(),
            functions: Arc::new(hosted.clone()),
            metrics: metrics.clone(),
            faults: faults.clone(),
            invocations: invocations.clone(),
            denials: denials.clone(),
            cors: crate::stack::model::api_cors(&template)?,
        };
        let mut tasks = vec![
            tokio::spawn(async move {
                if let Err(err) = axum::serve(edge_listener, edge::router(edge_state)).await {
                    tracing::error!(error = %err, "edge server stopped");
                }
            }),
            tokio::spawn(async move {
                if let Err(err) = axum::serve(api_listener, http_api::router(api_state)).await {
                    tracing::error!(error = %err, "API server stopped");
                }
            }),
        ];
        // Each function's init warm-up, as deployed, under its own identity, before anything
        // else calls: its role must allow every call (a denied one would be a warning in every
        // cold start's log). Each call runs to its end here (no time budget, unlike a Lambda's
        // init), so a slow machine cannot make the check pass without calling.
        futures::future::join_all(
            hosted.iter().flat_map(|function| &function.warm_set).map(|adapter| adapter.warm()),
        )
        .await;
        let denied = denials.snapshot();
        if !denied.is_empty() {
            for task in &tasks {
                task.abort();
            }
            anyhow::bail!("a function's init warm-up was denied by its role: {denied:?}");
        }
        tasks.extend(event_sources::spawn(&hosted, &clients.sqs, &faults));
        tasks.extend(streams::spawn(
            &hosted,
            &streams::Environment {
                emulator_url: emulator.url.clone(),
                sqs: clients.sqs.clone(),
                faults: faults.clone(),
                state_dir: options.state_dir.clone(),
            },
        ));
        tasks.extend(schedules.spawn());
        tasks.extend(firer.spawn());
        Ok(LocalStack {
            api_url,
            edge_url,
            emulator,
            template,
            calls,
            metrics,
            faults,
            invocations,
            denials,
            authorizer,
            tasks,
        })
    }

    /// A bearer token for principal `sub` (valid one day).
    pub fn token(&self, sub: &str) -> String {
        self.authorizer.token(sub, 86_400)
    }

    /// The resolved `Ref` of a template resource (table name, queue URL, bucket, ARN…).
    pub fn resource(&self, logical: &str) -> String {
        self.template.reference(logical).unwrap_or_else(|e| panic!("{logical}: {e}"))
    }

    /// SDK configuration that talks to the emulator directly (not counted as AWS calls).
    pub async fn emulator_sdk_config(&self) -> SdkConfig {
        sdk_config(&self.emulator.url).await
    }

    /// Stops serving and stops the emulator.
    pub fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.emulator.stop();
    }
}
