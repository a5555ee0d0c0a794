//! Cold start and binary size: runs the one release binary every function deploys
//! (`longhaul-lambda`) as each function in turn (its `LONGHAUL_FUNCTION`) against a minimal
//! Lambda Runtime API emulator and times its init, next to a bare `lambda_runtime` hello binary
//! (`src/bin/hello.rs`) measured in the same run.
//!
//! It builds what it measures first (`cargo build --release` of `longhaul-lambda` and of
//! `hello`; a no-op when they are up to date — set `LONGHAUL_COLDSTART_NO_BUILD=1` to measure the
//! binaries already in `target/release` as they are). `LONGHAUL_COLDSTART_RUNS` sets the runs
//! per binary (default 60: a process start varies by tens of percent from one run to the next
//! on a shared machine; the median of 60 moves by a few).
//!
//! Per run: spawn the binary with a Lambda-like environment (`env_clear`, the runtime variables,
//! region, dummy credentials, the function's own variables) → wait for its first
//! `GET /runtime/invocation/next` (**init**) → hand it the function's sample event from
//! `events/` → wait for its response or error (**first event**) → kill it. Binaries are
//! interleaved round by round, so machine noise is shared. `AWS_ENDPOINT_URL` points at the
//! emulator, which answers every AWS call at once with a `400 ResourceNotFoundException`: the
//! warm-up calls the functions make at init do their full SDK work (certificates, endpoint
//! resolution, signing, a connection) and are counted, but cost no network round trip or TLS
//! handshake, which a real region adds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::mpsc;

/// The functions (as `LONGHAUL_FUNCTION` names them) and their sample event in `events/`.
const FUNCTIONS: [(&str, &str); 12] = [
    ("submit", "submit.json"),
    ("status", "status.json"),
    ("cancel", "cancel.json"),
    ("uploads", "uploads.json"),
    ("webhooks", "webhooks.json"),
    ("notifier", "notifier.json"),
    ("events", "events.json"),
    ("dispatcher", "dispatcher.json"),
    ("stage", "stage-work.json"),
    ("webhook", "webhook.json"),
    ("reaper", "reaper.json"),
    ("expirer", "expirer.json"),
];

/// The binary every function deploys (functions/lambda).
const LAMBDA: &str = "longhaul-lambda";

/// The baseline binary (tests/bench/src/bin/hello.rs).
const HELLO: &str = "hello";

/// How long a run may take to reach `/next`, and then to answer its event.
const RUN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the emulator saw during one run, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mark {
    /// `GET /runtime/invocation/next` (the first one ends init).
    Next(Instant),
    /// `POST /runtime/invocation/{id}/response`.
    Response(Instant),
    /// `POST /runtime/invocation/{id}/error`.
    InvocationError(Instant),
    /// `POST /runtime/init/error`.
    InitError(String),
    /// Any other request: an AWS API call (`AWS_ENDPOINT_URL` points here).
    Aws(Instant),
}

/// The run in progress: where to report marks, and the event to hand out once.
#[derive(Default)]
struct Current {
    marks: Option<mpsc::UnboundedSender<Mark>>,
    event: Option<Vec<u8>>,
}

/// The Runtime API emulator's state: at most one run at a time.
#[derive(Clone, Default)]
struct Emulator(Arc<Mutex<Current>>);

impl Emulator {
    /// Starts a run that will be handed `event`; returns where its marks arrive.
    fn begin(&self, event: Vec<u8>) -> mpsc::UnboundedReceiver<Mark> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.0.lock().expect("emulator state") = Current { marks: Some(tx), event: Some(event) };
        rx
    }

    fn mark(&self, mark: Mark) {
        if let Some(tx) = &self.0.lock().expect("emulator state").marks {
            // The receiver is gone only after its run ended; a late request is irrelevant.
            let _ = tx.send(mark);
        }
    }

    fn take_event(&self) -> Option<Vec<u8>> {
        self.0.lock().expect("emulator state").event.take()
    }

    /// The Runtime API routes, plus a fallback that plays every AWS service.
    fn router(self) -> Router {
        Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route("/2018-06-01/runtime/invocation/{id}/response", post(response))
            .route("/2018-06-01/runtime/invocation/{id}/error", post(invocation_error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .fallback(aws)
            .with_state(self)
    }
}

async fn next(State(emulator): State<Emulator>) -> Response {
    emulator.mark(Mark::Next(Instant::now()));
    let Some(event) = emulator.take_event() else {
        // One event per run: the runtime's next poll waits here until the run kills it.
        std::future::pending::<()>().await;
        unreachable!("pending never completes");
    };
    let deadline =
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default() + Duration::from_secs(15);
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, HeaderValue::from_str(&value).expect("ASCII header value"));
    };
    set("lambda-runtime-aws-request-id", "8476a536-e9f4-11e8-9739-2dfe598c3fcd".to_owned());
    set("lambda-runtime-deadline-ms", deadline.as_millis().to_string());
    set(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:us-east-1:123456789012:function:coldstart".to_owned(),
    );
    set(
        "lambda-runtime-trace-id",
        "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=0".to_owned(),
    );
    set("content-type", "application/json".to_owned());
    (StatusCode::OK, headers, event).into_response()
}

async fn response(State(emulator): State<Emulator>) -> StatusCode {
    emulator.mark(Mark::Response(Instant::now()));
    StatusCode::ACCEPTED
}

async fn invocation_error(State(emulator): State<Emulator>) -> StatusCode {
    emulator.mark(Mark::InvocationError(Instant::now()));
    StatusCode::ACCEPTED
}

async fn init_error(State(emulator): State<Emulator>, body: String) -> StatusCode {
    emulator.mark(Mark::InitError(body));
    StatusCode::ACCEPTED
}

/// Every AWS call: answered at once with an error every SDK parses as a service error.
async fn aws(State(emulator): State<Emulator>, uri: Uri) -> Response {
    emulator.mark(Mark::Aws(Instant::now()));
    let body = serde_json::json!({
        "__type": "ResourceNotFoundException",
        "message": format!("coldstart emulator: no AWS behind {}", uri.path()),
    });
    (StatusCode::BAD_REQUEST, [("content-type", "application/x-amz-json-1.0")], body.to_string())
        .into_response()
}

/// One run's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Spawn → first `/next`.
    init: Duration,
    /// Event handed out → response (or error) posted; `None` if none came in time.
    first_event: Option<Duration>,
    /// AWS calls made before the first `/next` (the warm-up).
    init_aws_calls: usize,
    /// How long the warm-up took, as the function logged it (`None`: no warm-up logged).
    warm_up: Option<Duration>,
}

/// What one binary is run with and measured as.
struct Binary {
    name: &'static str,
    path: PathBuf,
    event: Vec<u8>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

/// A plausible deployed environment of function `name` (the values template.yaml would resolve
/// to; every function gets the whole set, which is harmless: each reads only its own).
fn lambda_env(name: &str, runtime_api: &str) -> Vec<(String, String)> {
    let account = "123456789012";
    let region = "us-east-1";
    let memory = if name == "stage" { "512" } else { "256" };
    let queue = |q: &str| format!("https://sqs.{region}.amazonaws.com/{account}/longhaul-{q}");
    [
        ("AWS_LAMBDA_RUNTIME_API", runtime_api.to_owned()),
        ("AWS_LAMBDA_FUNCTION_NAME", format!("longhaul-{name}")),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", memory.to_owned()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/longhaul-{name}")),
        ("AWS_LAMBDA_LOG_STREAM_NAME", "2026/11/22/[$LATEST]coldstart".to_owned()),
        ("AWS_LAMBDA_LOG_FORMAT", "JSON".to_owned()),
        ("AWS_LAMBDA_LOG_LEVEL", "INFO".to_owned()),
        // The one debug line the warm-up's duration is read from.
        ("RUST_LOG", "longhaul_aws::sdk=debug".to_owned()),
        ("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand".to_owned()),
        ("AWS_EXECUTION_ENV", "AWS_Lambda_provided.al2023".to_owned()),
        ("_HANDLER", "bootstrap".to_owned()),
        ("LONGHAUL_FUNCTION", name.to_owned()),
        ("TZ", ":UTC".to_owned()),
        ("LANG", "en_US.UTF-8".to_owned()),
        ("PATH", "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("AWS_REGION", region.to_owned()),
        ("AWS_DEFAULT_REGION", region.to_owned()),
        ("AWS_ACCESS_KEY_ID", "ASIACOLDSTARTBENCH00".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "coldstart-bench-secret-key".to_owned()),
        ("AWS_SESSION_TOKEN", "coldstart-bench-session-token".to_owned()),
        ("AWS_ENDPOINT_URL", format!("http://{runtime_api}")),
        ("TABLE_NAME", "longhaul-JobsTable-0123456789AB".to_owned()),
        ("BUCKET_NAME", "longhaul-databucket-0123456789ab".to_owned()),
        ("INTAKE_QUEUE_URL", queue("IntakeQueue")),
        ("WEBHOOK_QUEUE_URL", queue("WebhookQueue")),
        ("WEBHOOK_DLQ_URL", queue("WebhookDeadLetterQueue")),
        ("NOTIFIER_DLQ_URL", queue("NotifierDeadLetterQueue")),
        (
            "STATE_MACHINE_ARN",
            format!("arn:aws:states:{region}:{account}:stateMachine:longhaul-jobs"),
        ),
        (
            "EVENTS_URL",
            "https://abcdefghijklmnopqrstuvwxyz012345.lambda-url.us-east-1.on.aws".to_owned(),
        ),
        (
            "STREAM_TOKEN_SECRET_ARN",
            format!("arn:aws:secretsmanager:{region}:{account}:secret:longhaul-StreamTokenSecret"),
        ),
        ("ENABLED_JOB_TYPES", "demo,csv_report".to_owned()),
        (
            "LONGHAUL_WORKERS",
            format!(
                r#"{{"StageFunction": "arn:aws:lambda:{region}:{account}:function:longhaul-StageFunction", "CsvReportWorkerFunction": "arn:aws:lambda:{region}:{account}:function:longhaul-CsvReportWorkerFunction"}}"#
            ),
        ),
        ("IDEMPOTENCY_TTL_SECONDS", "86400".to_owned()),
        ("LONGHAUL_RESULT_TTL_SECONDS", "604800".to_owned()),
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", "120".to_owned()),
        ("LONGHAUL_STALL_SECONDS", "600".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Runs `binary` once: spawn, init, one event, kill.
async fn run_once(emulator: &Emulator, binary: &Binary) -> anyhow::Result<Sample> {
    let mut marks = emulator.begin(binary.event.clone());
    let log = std::fs::File::create(&binary.log)?;
    let mut command = tokio::process::Command::new(&binary.path);
    command.env_clear().envs(binary.env.iter().map(|(k, v)| (k, v)));
    command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
    let spawned = Instant::now();
    let mut child = command.spawn().with_context(|| format!("spawn {}", binary.path.display()))?;
    let outcome = async {
        let mut init: Option<Instant> = None;
        let mut init_aws_calls = 0;
        let deadline = tokio::time::sleep(2 * RUN_TIMEOUT);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                mark = marks.recv() => match mark.expect("the emulator holds the sender") {
                    Mark::Next(at) if init.is_none() => init = Some(at),
                    Mark::Next(_) => {}
                    Mark::Aws(_) if init.is_none() => init_aws_calls += 1,
                    Mark::Aws(_) => {}
                    Mark::Response(at) | Mark::InvocationError(at) => {
                        let init = init.context("a response before any /next")?;
                        return Ok(Sample { init: init - spawned, first_event: Some(at - init), init_aws_calls, warm_up: None });
                    }
                    Mark::InitError(body) => bail!("init error: {body}"),
                },
                status = child.wait() => bail!("exited during the run ({})", status?),
                () = &mut deadline => match init {
                    Some(init) => {
                        return Ok(Sample { init: init - spawned, first_event: None, init_aws_calls, warm_up: None });
                    }
                    None => bail!("no /next within {:?}", 2 * RUN_TIMEOUT),
                },
            }
        }
    }
    .await;
    // Killed, not stopped: a cold start's process is never reused here.
    let _ = child.kill().await;
    let mut sample =
        outcome.with_context(|| format!("{} (log: {})", binary.name, binary.log.display()))?;
    sample.warm_up = logged_warm_up(&std::fs::read_to_string(&binary.log).unwrap_or_default());
    Ok(sample)
}

/// The duration of the warm-up a function logged (`longhaul_aws::sdk::warm_up`'s debug line
/// `warm-up done`, in Lambda's JSON log format), if it logged one.
fn logged_warm_up(log: &str) -> Option<Duration> {
    log.lines().filter(|line| line.contains("warm-up done")).find_map(|line| {
        let entry: serde_json::Value = serde_json::from_str(line).ok()?;
        let elapsed_ms =
            entry.pointer("/fields/elapsed_ms").or_else(|| entry.get("elapsed_ms"))?.as_f64()?;
        Some(Duration::from_secs_f64(elapsed_ms / 1000.0))
    })
}

/// The value at percentile `p` (0–100) of `sorted`, nearest rank.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    assert!(!sorted.is_empty(), "percentile of nothing");
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// Milliseconds with two decimals.
fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// One binary's row of the report.
#[derive(Debug, Clone)]
struct Row {
    name: String,
    size_bytes: u64,
    init: Vec<Duration>,
    first_event: Vec<Duration>,
    missing_events: usize,
    init_aws_calls: usize,
    warm_up: Vec<Duration>,
}

/// The report: method, table (rows in the given order; the first is the baseline), reading.
fn report(rows: &[Row], runs: usize, host: &str) -> String {
    let base = &rows[0];
    let mut sorted_base = base.init.clone();
    sorted_base.sort();
    let base_median = percentile(&sorted_base, 50);
    let mut out = String::new();
    out.push_str("## Cold start and binary sizes\n\n");
    out.push_str(&format!(
        "`cargo run --release -p longhaul-bench --bin coldstart` runs the one stripped release binary \
         every function deploys (`{LAMBDA}`; {host}, the workspace release profile) as each function \
         (its `LONGHAUL_FUNCTION`) {runs} times against a minimal Lambda Runtime API emulator, interleaved round by round with a \
         bare `lambda_runtime` binary that returns its event (`{HELLO}`, the baseline). **Init** is \
         process spawn → its first `GET /2018-06-01/runtime/invocation/next`: tracing set-up, \
         configuration, the SDK configuration and DynamoDB's client, and the connection warm-up \
         (`longhaul_aws::sdk::warm_up`). **First event** is the event handed out → the response (or \
         error) posted, for the function's sample event from `events/`.\n\n"
    ));
    out.push_str(
        "`AWS_ENDPOINT_URL` points at the emulator, which answers every AWS call at once with a \
         `400 ResourceNotFoundException` over plain HTTP on loopback. So init includes all the warm-up's \
         local work (building the clients it uses, the TLS configuration, endpoint resolution, signing, \
         opening a connection); \
         *AWS calls at init* shows the warm-up happened and *warm-up* is its share of init (median of the \
         duration the function logs; `RUST_LOG=longhaul_aws::sdk=debug` is the one addition to a \
         deployed environment). The warm-up is work the first event needs anyway (its connections), \
         done at init on purpose; *init less warm-up* is the rest, what the function adds at init that \
         the first event would not otherwise pay. The scheduled reaper and expirer warm nothing: no \
         one waits on their first run. Not included is what a region adds: one \
         TCP+TLS handshake per service (concurrent; a few round trips plus certificate verification) — \
         which the warm-up moves from the first invocation into init, where on-demand functions run on a \
         full vCPU. The \
         first-event times are handler paths whose AWS calls fail at once: a lower bound, not a latency. \
         Not measured at all: Lambda's own sandbox creation and code download, and the arm64 CPUs the \
         functions are deployed on.\n\n",
    );
    out.push_str(
        "| function | size (bytes) | size (MB) | init median (ms) | init p90 (ms) | init × hello | \
         AWS calls at init | warm-up (ms) | init less warm-up × hello | first event median (ms) | \
         first event p90 (ms) |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in rows {
        let mut init = row.init.clone();
        init.sort();
        let mut first = row.first_event.clone();
        first.sort();
        let (first_median, first_p90) = if first.is_empty() {
            ("—".to_owned(), "—".to_owned())
        } else {
            (ms(percentile(&first, 50)), ms(percentile(&first, 90)))
        };
        let missing = if row.missing_events > 0 {
            format!(" ({} runs no answer)", row.missing_events)
        } else {
            String::new()
        };
        let mut warm_up = row.warm_up.clone();
        warm_up.sort();
        let init_median = percentile(&init, 50);
        let (warm_up, own_init) = if warm_up.is_empty() {
            ("—".to_owned(), init_median)
        } else {
            let median = percentile(&warm_up, 50);
            (ms(median), init_median.saturating_sub(median))
        };
        out.push_str(&format!(
            "| `{}` | {} | {:.2} | {} | {} | {:.1}× | {} | {} | {:.1}× | {}{} | {} |\n",
            row.name,
            row.size_bytes,
            row.size_bytes as f64 / 1_000_000.0,
            ms(init_median),
            ms(percentile(&init, 90)),
            init_median.as_secs_f64() / base_median.as_secs_f64(),
            row.init_aws_calls,
            warm_up,
            own_init.as_secs_f64() / base_median.as_secs_f64(),
            first_median,
            missing,
            first_p90,
        ));
    }
    out.push('\n');
    out.push_str(&reading(rows, base_median));
    out
}

/// A short reading of the numbers, computed from them.
fn reading(rows: &[Row], base_median: Duration) -> String {
    let functions = &rows[1..];
    let medians: Vec<(String, Duration)> = functions
        .iter()
        .map(|r| {
            let mut init = r.init.clone();
            init.sort();
            (r.name.clone(), percentile(&init, 50))
        })
        .collect();
    let (Some(fastest), Some(slowest)) =
        (medians.iter().min_by_key(|(_, d)| *d), medians.iter().max_by_key(|(_, d)| *d))
    else {
        return String::new();
    };
    let warm_ups: Vec<Duration> = functions
        .iter()
        .filter(|r| !r.warm_up.is_empty())
        .map(|r| {
            let mut warm_up = r.warm_up.clone();
            warm_up.sort();
            percentile(&warm_up, 50)
        })
        .collect();
    let warm_up = match (warm_ups.iter().min(), warm_ups.iter().max()) {
        (Some(least), Some(most)) => format!(
            " The warm-up itself takes {} to {} ms of that here, where the \"endpoint\" answers over \
             loopback without TLS.",
            ms(*least),
            ms(*most)
        ),
        _ => String::new(),
    };
    let size = functions.iter().map(|r| r.size_bytes).max().expect("functions exist");
    format!(
        "Reading: a bare `lambda_runtime` binary reaches `/next` in {} ms; the functions take {} ms \
         (`{}`) to {} ms (`{}`), {:.1}× to {:.1}× the baseline. What they add is tracing set-up, \
         configuration, the SDK configuration and DynamoDB's client, and the warm-up (which builds \
         the other clients the first event uses and does the lazy work of their first AWS call at \
         init; every other client is built on first use).{} The one binary is {:.1} MB \
         stripped, every function's handler and the SDK clients they use, against {:.1} MB for the \
         baseline; a process maps it lazily, so a function pays for the pages it runs.\n",
        ms(base_median),
        ms(fastest.1),
        fastest.0,
        ms(slowest.1),
        slowest.0,
        fastest.1.as_secs_f64() / base_median.as_secs_f64(),
        slowest.1.as_secs_f64() / base_median.as_secs_f64(),
        warm_up,
        size as f64 / 1_000_000.0,
        rows[0].size_bytes as f64 / 1_000_000.0,
    )
}

/// `cargo build --release` of what is measured (a no-op when up to date).
fn build(root: &Path) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let functions = ["build", "--release", "-p", LAMBDA].map(str::to_owned).to_vec();
    let hello =
        ["build", "--release", "-p", "longhaul-bench", "--bin", HELLO].map(str::to_owned).to_vec();
    for args in [functions, hello] {
        eprintln!("coldstart: {cargo} {}", args.join(" "));
        let status = std::process::Command::new(&cargo).args(&args).current_dir(root).status()?;
        if !status.success() {
            bail!("cargo {} failed: {status}", args.join(" "));
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let root = longhaul_bench::workspace_root();
    let runs: usize =
        std::env::var("LONGHAUL_COLDSTART_RUNS").ok().map(|v| v.parse()).transpose()?.unwrap_or(60);
    if runs == 0 {
        bail!("LONGHAUL_COLDSTART_RUNS must be at least 1");
    }
    if std::env::var_os("LONGHAUL_COLDSTART_NO_BUILD").is_none() {
        build(&root)?;
    }
    let release = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("release");
    let logs = root.join("target/coldstart");
    std::fs::create_dir_all(&logs)?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let runtime_api = listener.local_addr()?.to_string();
    let emulator = Emulator::default();
    // The emulator runs on its own thread, so it answers while this one spawns and waits.
    let router = emulator.clone().router();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("emulator runtime");
        rt.block_on(async move {
            let listener =
                tokio::net::TcpListener::from_std(listener.into_std().expect("std listener"))
                    .expect("listener");
            axum::serve(listener, router).await.expect("emulator serves");
        });
    });

    let mut binaries = vec![Binary {
        name: HELLO,
        path: release.join(HELLO),
        event: br#"{"hello":"world"}"#.to_vec(),
        env: lambda_env(HELLO, &runtime_api),
        log: logs.join(format!("{HELLO}.log")),
    }];
    for (name, event) in FUNCTIONS {
        let event_path = root.join("events").join(event);
        binaries.push(Binary {
            name,
            path: release.join(LAMBDA),
            event: std::fs::read(&event_path)
                .with_context(|| format!("read {}", event_path.display()))?,
            env: lambda_env(name, &runtime_api),
            log: logs.join(format!("{name}.log")),
        });
    }
    let mut rows: Vec<Row> = Vec::new();
    for binary in &binaries {
        let size_bytes = std::fs::metadata(&binary.path)
            .with_context(|| {
                format!(
                    "{} (build it, or unset LONGHAUL_COLDSTART_NO_BUILD)",
                    binary.path.display()
                )
            })?
            .len();
        rows.push(Row {
            name: binary.name.to_owned(),
            size_bytes,
            init: Vec::new(),
            first_event: Vec::new(),
            missing_events: 0,
            init_aws_calls: 0,
            warm_up: Vec::new(),
        });
    }

    let mut failures: BTreeMap<&str, String> = BTreeMap::new();
    for round in 0..runs {
        // Rotate the order each round: no binary always runs right after the same one.
        for k in 0..binaries.len() {
            let i = (k + round) % binaries.len();
            let binary = &binaries[i];
            match run_once(&emulator, binary).await {
                Ok(sample) => {
                    let row = &mut rows[i];
                    row.init.push(sample.init);
                    match sample.first_event {
                        Some(d) => row.first_event.push(d),
                        None => row.missing_events += 1,
                    }
                    row.init_aws_calls = row.init_aws_calls.max(sample.init_aws_calls);
                    row.warm_up.extend(sample.warm_up);
                }
                Err(err) => {
                    failures.entry(binary.name).or_insert_with(|| format!("{err:#}"));
                }
            }
        }
        eprintln!("coldstart: round {}/{runs} done", round + 1);
        if !failures.is_empty() {
            break; // a broken binary stays broken: say so now rather than after every round
        }
    }
    if !failures.is_empty() {
        for (name, err) in &failures {
            eprintln!("coldstart: {name} failed: {err}");
        }
        bail!("{} binaries failed; nothing written", failures.len());
    }

    let host = format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS);
    let markdown = report(&rows, runs, &host);
    print!("{markdown}");
    longhaul_bench::write_section("50-coldstart", &markdown)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn request(addr: &str, head: &str, body: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let message = format!(
            "{head}\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(message.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn the_emulator_hands_out_one_event_and_records_the_run() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let emulator = Emulator::default();
        tokio::spawn(axum::serve(listener, emulator.clone().router()).into_future());
        let mut marks = emulator.begin(br#"{"x":1}"#.to_vec());

        let aws = request(&addr, "POST / HTTP/1.1", "{}").await;
        assert!(aws.starts_with("HTTP/1.1 400"), "{aws}");
        assert!(matches!(marks.recv().await, Some(Mark::Aws(_))));

        let next = request(&addr, "GET /2018-06-01/runtime/invocation/next HTTP/1.1", "").await;
        assert!(next.starts_with("HTTP/1.1 200"), "{next}");
        assert!(next.contains("lambda-runtime-aws-request-id: 8476a536"), "{next}");
        assert!(next.contains("lambda-runtime-deadline-ms: "), "{next}");
        assert!(next.ends_with(r#"{"x":1}"#), "{next}");
        assert!(matches!(marks.recv().await, Some(Mark::Next(_))));

        let posted =
            request(&addr, "POST /2018-06-01/runtime/invocation/abc/response HTTP/1.1", "{}").await;
        assert!(posted.starts_with("HTTP/1.1 202"), "{posted}");
        assert!(matches!(marks.recv().await, Some(Mark::Response(_))));

        let failed = request(&addr, "POST /2018-06-01/runtime/init/error HTTP/1.1", "boom").await;
        assert!(failed.starts_with("HTTP/1.1 202"), "{failed}");
        assert_eq!(marks.recv().await, Some(Mark::InitError("boom".to_owned())));
        // The event was handed out once: a second poll waits (until the run ends).
        assert!(emulator.take_event().is_none());
    }

    #[test]
    fn the_warm_up_duration_is_read_from_the_json_log() {
        let log = concat!(
            r#"{"timestamp":"t","level":"DEBUG","fields":{"message":"connection warmed","service":"sqs"}}"#,
            "\n",
            r#"{"timestamp":"t","level":"DEBUG","fields":{"message":"warm-up done","elapsed_ms":2.5},"target":"x"}"#,
            "\n",
        );
        assert_eq!(logged_warm_up(log), Some(Duration::from_micros(2500)));
        assert_eq!(logged_warm_up("warm-up done, not JSON\n"), None);
        assert_eq!(logged_warm_up(""), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 50), Duration::from_millis(10));
        assert_eq!(percentile(&sorted, 90), Duration::from_millis(18));
        assert_eq!(percentile(&sorted[..1], 90), Duration::from_millis(1));
    }

    #[test]
    fn the_report_has_a_row_per_binary_and_ratios_to_the_baseline() {
        let row = |name: &str, init_ms: u64, size_bytes: u64| Row {
            name: name.to_owned(),
            size_bytes,
            init: vec![Duration::from_millis(init_ms); 3],
            first_event: vec![Duration::from_millis(1); 3],
            missing_events: 0,
            init_aws_calls: 2,
            warm_up: vec![Duration::from_millis(1); 3],
        };
        let markdown =
            report(&[row("hello", 2, 1_000_000), row("submit", 6, 6_000_000)], 3, "x86_64-linux");
        assert!(markdown.starts_with("## Cold start and binary sizes\n"));
        assert!(
            markdown.contains(
                "| `hello` | 1000000 | 1.00 | 2.00 | 2.00 | 1.0× | 2 | 1.00 | 0.5× | 1.00 | 1.00 |"
            ),
            "{markdown}"
        );
        assert!(
            markdown
                .contains("| `submit` | 6000000 | 6.00 | 6.00 | 6.00 | 3.0× | 2 | 1.00 | 2.5× |"),
            "{markdown}"
        );
        assert!(markdown.contains("Reading:"));
    }
}
