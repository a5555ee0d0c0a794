//! Logs against the local stack: every line the functions emit about a job carries `job_id`,
//! `attempt` and `principal` (the `job` span of `longhaul_aws::logs`), and no line carries a
//! secret, a token, a presigned URL or a job's params.
//!
//! The functions run in-process in the local stack, so this test binary installs the
//! subscriber Lambda installs (lambda_runtime's `init_default_subscriber` with
//! `AWS_LAMBDA_LOG_FORMAT=JSON`: `tracing_subscriber::fmt().json()`, level INFO) before the
//! stack starts — with targets switched on, so a line can be told to come from a function —
//! and captures every line it writes. It then runs jobs through every function (submit,
//! dispatcher, stage, status, uploads, webhooks, the notifier, the webhook deliverer, cancel, the SSE
//! stream, the reaper and the expirer) with recognisable secret values, and reads the lines.

use longhaul_domain::JobId;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use lambda_http::tracing::subscriber as tracing_subscriber;
use longhaul_tests::{Api, Aws, Deadline, Harness, fire_until, harness_with, principal};
use serde_json::{Value, json};
use tracing_subscriber::util::SubscriberInitExt;

const TIMEOUT: Duration = Duration::from_secs(120);
/// When a worker's heartbeat is stale (the reaper then judges it dead).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a succeeded job's result is kept.
const RESULT_TTL: Duration = Duration::from_secs(3);

/// The crates whose lines are the functions' own (the handlers and the adapters they call).
const FUNCTION_CRATES: &[&str] = &[
    "submit",
    "status",
    "cancel",
    "uploads",
    "webhooks",
    "dispatcher",
    "stage",
    "reaper",
    "expirer",
    "webhook",
    "events",
    "notifier",
    "longhaul_aws",
];
/// Functions whose lines are about a principal but never about one job.
const PRINCIPAL_ONLY: &[&str] = &["uploads", "webhooks"];
/// Lines about a whole scheduled run, not one job.
const RUN_SUMMARIES: &[&str] = &["reaper run", "expirer run"];

/// Every line written, in order.
static LINES: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<String>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes each line whole, in one call.
        let text = String::from_utf8_lossy(buf);
        self.0
            .lock()
            .unwrap()
            .extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lines() -> Vec<String> {
    LINES.get().expect("capture installed").lock().unwrap().clone()
}

fn stack() -> &'static Harness {
    LINES.get_or_init(|| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(lines.clone());
        // lambda_runtime_api_client::tracing::init_default_subscriber_with_writer, JSON branch,
        // with the target kept.
        tracing_subscriber::fmt()
            .without_time()
            .with_env_filter(
                tracing_subscriber::EnvFilter::builder()
                    .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
                    .parse_lossy(""),
            )
            .with_writer(move || writer.clone())
            .json()
            .finish()
            .try_init()
            .expect("this test binary installs the only subscriber");
        lines
    });
    harness_with(&[
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1"),
        ("LONGHAUL_STREAM_POLL_MS", "100"),
        ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS", HEARTBEAT_TIMEOUT.as_secs().to_string().as_str()),
        ("LONGHAUL_HEARTBEAT_INTERVAL_SECONDS", "1"),
        ("LONGHAUL_STALL_SECONDS", "30"),
        ("LONGHAUL_RESULT_TTL_SECONDS", RESULT_TTL.as_secs().to_string().as_str()),
        ("LONGHAUL_MAX_ATTEMPTS", "3"),
    ])
}

/// A partner answering 204 to every webhook.
fn receiver() -> SocketAddr {
    static RECEIVER: OnceLock<SocketAddr> = OnceLock::new();
    *RECEIVER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new().route(
                    "/hook",
                    axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
                );
                axum::serve(listener, app).await.unwrap();
            });
        });
        rx.recv().unwrap()
    })
}

/// The `X-Amz-Signature` of a presigned URL.
fn signature(url: &str) -> String {
    let url = reqwest::Url::parse(url).expect("a URL");
    url.query_pairs()
        .find(|(k, _)| k == "X-Amz-Signature")
        .map(|(_, v)| v.into_owned())
        .expect("a presigned URL")
}

/// Reads an SSE stream to its end; returns its last event's data.
async fn read_stream(url: &str) -> String {
    let response = reqwest::Client::new().get(url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(60), body.next()).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    text
}

/// What the scenarios leave behind: the jobs (id → owner) and the values no line may hold.
#[derive(Default)]
struct Run {
    owners: BTreeMap<String, String>,
    secrets: BTreeMap<&'static str, String>,
}

/// A csv_report job whose params (a column name, the upload's file name) look like secrets,
/// under an Idempotency-Key that does too; its result is fetched through a presigned URL;
/// then the expirer expires it.
async fn params_job(run: &Mutex<Run>) {
    let owner = principal("logs-params");
    let api = Api::new(&owner);
    let column = format!("sk_live_COLUMN{}", uuid::Uuid::new_v4().simple());
    let file = format!("sk_live_FILE{}", uuid::Uuid::new_v4().simple());
    let csv = format!("{column},amount\neu,1\nus,2\neu,3\n");
    let upload = api.post_json("/uploads", &json!({"filename": format!("{file}.csv"), "content_type": "text/csv", "size_bytes": csv.len()})).await;
    assert_eq!(upload.status, 201, "{}", upload.text);
    let upload_signature = signature(upload.json["upload_url"].as_str().unwrap());
    let input = api.upload(&format!("{file}.csv"), "text/csv", csv.into_bytes()).await;
    let key = format!("idem_SECRET{}", uuid::Uuid::new_v4().simple());
    let body = json!({"type": "csv_report", "params": {
        "input": input, "group_by": [column], "metrics": [{"op": "sum", "column": "amount"}], "format": "json"}});
    let reply = api
        .send(
            "POST",
            "/jobs",
            Some(("application/json", body.to_string().into_bytes())),
            &[("idempotency-key", key.as_str())],
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let job_id = reply.json["job_id"].as_str().unwrap().parse::<JobId>().unwrap();
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(job["status"], "succeeded", "{job}");
    let result = api.get(&format!("/jobs/{job_id}/result")).await;
    assert_eq!(result.status, 303);
    let result_signature = signature(result.header("location").unwrap());
    // Expired once its result's TTL has passed.
    fire_until(&api, &job_id, "expirer", "expiry", RESULT_TTL * 40, |j| j["status"] == "expired")
        .await;
    assert_eq!(api.get(&format!("/jobs/{job_id}")).await.json["status"], "expired");
    let mut run = run.lock().unwrap();
    run.owners.insert(job_id.to_string(), owner.to_string());
    run.secrets.insert("a params value (column name)", column);
    run.secrets.insert("a params value (upload file name)", file);
    run.secrets.insert("an Idempotency-Key", key);
    run.secrets.insert("a presigned upload URL's signature", upload_signature);
    run.secrets.insert("a presigned result URL's signature", result_signature);
    run.secrets.insert("a bearer token", api.token.clone().unwrap());
}

/// A job with a callback whose URL carries a token, signed with the principal's webhook
/// secrets (one rotated out), watched through the SSE stream with its stream token.
async fn webhook_job(run: &Mutex<Run>) {
    let owner = principal("logs-webhook");
    let api = Api::new(&owner);
    let first =
        api.get("/webhooks/secret").await.json["secrets"][0]["secret"].as_str().unwrap().to_owned();
    let rotated = api.post_json("/webhooks/secret/rotate", &json!({})).await;
    assert_eq!(rotated.status, 200, "{}", rotated.text);
    let second = rotated.json["secrets"][0]["secret"].as_str().unwrap().to_owned();
    let callback_token = format!("cbtok_SECRET{}", uuid::Uuid::new_v4().simple());
    let callback = format!("http://{}/hook?token={callback_token}", receiver());
    let job_id = api.submit(&json!({"type": "demo", "params": {"items": 20, "item_ms": 50}, "callback_url": callback})).await;
    let events_url = api.wait_for(&job_id, "an events_url", |j| j["events_url"].is_string()).await
        ["events_url"]
        .as_str()
        .unwrap()
        .to_owned();
    let stream_token = reqwest::Url::parse(&events_url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "token")
        .unwrap()
        .1
        .into_owned();
    let events = read_stream(&events_url).await;
    assert!(events.contains("\"status\":\"succeeded\""), "{events}");
    let deadline = Deadline::new(format!("a delivered webhook of {job_id}"), TIMEOUT);
    loop {
        let deliveries =
            api.get(&format!("/jobs/{job_id}/deliveries")).await.json["deliveries"].clone();
        if deliveries.as_array().is_some_and(|d| d.iter().any(|d| d["outcome"] == "delivered")) {
            break;
        }
        deadline.tick(Duration::from_millis(100), deliveries).await;
    }
    let mut run = run.lock().unwrap();
    run.owners.insert(job_id.to_string(), owner.to_string());
    run.secrets.insert("a webhook signing secret", first);
    run.secrets.insert("a rotated-in webhook signing secret", second);
    run.secrets.insert("a callback URL's token", callback_token);
    run.secrets.insert("a stream token", stream_token);
}

/// A running job its owner cancels.
async fn cancelled_job(run: &Mutex<Run>) {
    let owner = principal("logs-cancel");
    let api = Api::new(&owner);
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 400, "item_ms": 50}})).await;
    api.wait_for(&job_id, "progress", |j| j["progress"]["items_done"].as_u64().unwrap_or(0) >= 2)
        .await;
    let reply =
        api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({"reason": "not needed"})).await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(api.wait_terminal(&job_id, TIMEOUT).await["status"], "cancelled");
    run.lock().unwrap().owners.insert(job_id.to_string(), owner.to_string());
}

/// A job whose worker dies: the reaper re-dispatches it and attempt 2 finishes it.
async fn zombie_job(run: &Mutex<Run>) {
    let owner = principal("logs-zombie");
    let api = Api::new(&owner);
    let job_id =
        api.submit(&json!({"type": "demo", "params": {"items": 40, "item_ms": 100}})).await;
    api.wait_for(&job_id, "progress", |j| j["progress"]["items_done"].as_u64().unwrap_or(0) >= 5)
        .await;
    let aws = Aws::new().await;
    let store = longhaul_aws::jobs::JobStore::new(
        aws.dynamodb.clone(),
        stack().stack.resource("JobsTable"),
    );
    let execution = store.job(&job_id).await.unwrap().unwrap().execution.unwrap();
    let machine = stack().stack.resource("JobStateMachine");
    let arn = format!("{}:{execution}", machine.replace(":stateMachine:", ":execution:"));
    // Its direct run has no execution to stop, unless one took the job over.
    if let Err(err) = aws.sfn.stop_execution().execution_arn(arn).send().await {
        assert!(err.as_service_error().is_some_and(|e| e.is_execution_does_not_exist()), "{err:?}");
    }
    // Dead for good: Lambda loses the crashed run's event, so nothing retries it.
    let crash = format!(
        "{}/_local/functions/StageFunction/crash?job_id={job_id}&for_good=true",
        stack().stack.api_url
    );
    reqwest::Client::new().post(crash).send().await.unwrap();
    // Re-dispatched once its heartbeat is stale.
    let limit = HEARTBEAT_TIMEOUT * 20;
    fire_until(&api, &job_id, "reaper", "re-dispatch", limit, |j| j["attempt"] == 2).await;
    let job = api.wait_terminal(&job_id, TIMEOUT).await;
    assert_eq!(
        (job["status"].as_str(), job["attempt"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{job}"
    );
    run.lock().unwrap().owners.insert(job_id.to_string(), owner.to_string());
}

/// A captured line's `job` span (the current span), if any.
fn job_span(line: &Value) -> Option<&Value> {
    line.get("span").filter(|s| s["name"] == "job")
}

#[tokio::test]
async fn every_job_line_names_its_job_attempt_and_principal_and_no_line_holds_a_secret() {
    stack();
    let run = Mutex::new(Run::default());
    futures::join!(params_job(&run), webhook_job(&run), cancelled_job(&run), zombie_job(&run));
    // Let trailing lines (the webhook deliverer, the last stage task) land.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let run = run.into_inner().unwrap();
    let lines = lines();
    // `LOGS_DUMP=<file>` keeps the captured lines for a look.
    if let Some(path) = std::env::var_os("LOGS_DUMP") {
        std::fs::write(path, lines.join("\n")).unwrap();
    }

    // 1. No line — from a function or anything else in the process — holds a secret.
    for (what, secret) in &run.secrets {
        assert!(secret.len() >= 16, "{what} is too short to be recognisable: {secret:?}");
        if let Some(line) = lines.iter().find(|l| l.contains(secret.as_str())) {
            panic!("{what} was logged: {line}");
        }
    }

    // 2. Every function line about a job carries job_id, attempt and principal in its span,
    //    and they are the job's: the principal is the job's owner.
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for text in &lines {
        let line: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON line ({e}): {text}"));
        let target = line["target"].as_str().unwrap_or_default();
        let krate = target.split("::").next().unwrap_or_default();
        // A job kind's lines are the stage function's: its stages run there, in its span.
        let krate = if krate.starts_with("longhaul_job_") { "stage" } else { krate };
        if !FUNCTION_CRATES.contains(&krate) {
            continue;
        }
        let message = line["fields"]["message"].as_str().unwrap_or_default().to_owned();
        if RUN_SUMMARIES.contains(&message.as_str()) {
            continue;
        }
        let span =
            job_span(&line).unwrap_or_else(|| panic!("a {krate} line outside a job span: {text}"));
        assert!(span["principal"].is_string(), "a {krate} line without principal: {text}");
        if PRINCIPAL_ONLY.contains(&krate) {
            continue;
        }
        let job_id = span["job_id"]
            .as_str()
            .unwrap_or_else(|| panic!("a {krate} line without job_id: {text}"));
        let attempt = span["attempt"]
            .as_u64()
            .unwrap_or_else(|| panic!("a {krate} line without attempt: {text}"));
        if let Some(owner) = run.owners.get(job_id) {
            assert_eq!(
                span["principal"].as_str(),
                Some(owner.as_str()),
                "the principal is the job's owner: {text}"
            );
            if krate == "stage" {
                assert!(
                    (1..=2).contains(&attempt),
                    "a stage line names the attempt it works for: {text}"
                );
            }
            seen.entry(job_id.to_owned()).or_default().insert(format!("{krate}: {message}"));
        }
        // A line naming one of our jobs anywhere names it in its span.
        for other in run.owners.keys().filter(|id| id.as_str() != job_id) {
            assert!(
                !text.contains(other.as_str()),
                "a line about {other} in the span of {job_id}: {text}"
            );
        }
    }

    // 3. The test is not vacuous: each function spoke about the jobs it handled.
    let all: BTreeSet<&str> = seen.values().flatten().map(String::as_str).collect();
    for expected in [
        "submit: submitted",
        "dispatcher: run queued",
        "stage: claimed",
        "stage: succeeded",
        "stage: scan complete",
        "stage: cancelled while running",
        "cancel: cancellation requested from the running stage",
        "events: stream opened",
        "events: stream ended: the job is terminal",
        "notifier: webhook queued",
        "webhook: webhook attempt made",
        "reaper: zombie re-dispatched",
        "expirer: expired: result retention passed",
    ] {
        assert!(
            all.contains(expected),
            "no line {expected:?} about the test's jobs; seen: {seen:#?}"
        );
    }
    for job_id in run.owners.keys() {
        assert!(
            seen.get(job_id).is_some_and(|s| s.len() >= 3),
            "few lines about {job_id}: {:?}",
            seen.get(job_id)
        );
    }
}
