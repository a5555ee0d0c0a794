//! The TypeScript client (`clients/typescript`, npm package `@longhaul/client`) against this
//! binary's local stack: its generated types checked current with `docs/openapi.json`, its
//! Node test suite (`node --test`: the happy path, problem errors, a real `429`, the fallback
//! to polling, cancel, retry, uploads), and the live stream in headless Chromium.
//!
//! Node ≥ 20 and npm must be on PATH (this test fails, saying so, where they are not).
//! `npm ci` runs in `clients/typescript` when `node_modules` is missing or was installed from
//! another `package-lock.json`, then `tsc` builds `dist/`. The browser is Debian's `chromium`
//! and `chromium-driver`, installed with apt-get when missing, as `console.rs` does.
//!
//! The stack's stream links live 3 s (`LONGHAUL_STREAM_TOKEN_TTL_SECONDS`) and its streams end
//! every 2 s (`LONGHAUL_STREAM_MAX_SECONDS`), so a job of 8 s sees the client reconnect with
//! `Last-Event-ID` and fetch a fresh link; each principal may submit 5 jobs a minute
//! (`LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE`), so the Node suite meets a real `429`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use fantoccini::ClientBuilder;
use longhaul_tests::browser::{browser, start_driver, which};
use longhaul_tests::{Harness, harness_with, principal, root};
use serde_json::{Value, json};

/// Submissions per minute and principal on this stack: low, for a real `429`.
const SUBMISSIONS_PER_MINUTE: &str = "5";

/// The principals the Node suite acts as (`token(label)` in `test/helpers.mjs`), one per test
/// case or so, so that no case sees another's jobs or uses up another's rate.
const PRINCIPALS: &[&str] = &[
    "happy",
    "happy-terminal",
    "errors",
    "pause",
    "idempotency",
    "network",
    "ratelimit",
    "ratelimit-cap",
    "ratelimit-abort",
    "fallback",
    "fallback-poll",
    "fallback-502",
    "manage",
    "upload",
    "example",
    "react",
];

/// Tests the Node suite has (`test/*.test.mjs`); fewer ran means a file was not picked up.
const NODE_TESTS: usize = 19;

fn stack() -> &'static Harness {
    harness_with(&[
        ("LONGHAUL_STREAM_TOKEN_TTL_SECONDS", "3"),
        ("LONGHAUL_STREAM_MAX_SECONDS", "2"),
        ("LONGHAUL_STREAM_POLL_MS", "100"),
        ("LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE", SUBMISSIONS_PER_MINUTE),
    ])
}

fn package() -> PathBuf {
    root().join("clients/typescript")
}

fn node() -> PathBuf {
    which("node").expect(
        "the TypeScript client's tests need Node.js >= 20 and npm on PATH (Debian: apt-get \
         install nodejs npm)",
    )
}

/// Runs `program args` in the package directory; panics with its output unless it succeeded.
fn run(program: &Path, args: &[&str], what: &str) -> Output {
    let output = Command::new(program)
        .args(args)
        .current_dir(package())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {} could not run: {e}", program.display()));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `npm ci` when `node_modules` is missing or stale (installed from another lock file), then
/// `tsc`: once per test binary.
fn built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let version = run(&node(), &["--version"], "node --version");
        let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
        let major: u32 =
            version.trim_start_matches('v').split('.').next().unwrap().parse().unwrap();
        assert!(major >= 20, "the TypeScript client needs Node.js >= 20; this is {version}");
        let dir = package();
        let lock = std::fs::read(dir.join("package-lock.json")).expect("package-lock.json");
        let stamp = dir.join("node_modules/.longhaul-installed-lock");
        if std::fs::read(&stamp).ok().as_deref() != Some(lock.as_slice()) {
            let npm = which("npm").expect("npm on PATH (it comes with Node.js)");
            let started = Instant::now();
            run(&npm, &["ci", "--no-audit", "--no-fund", "--loglevel=error"], "npm ci");
            std::fs::write(&stamp, &lock).expect("writing the install stamp");
            eprintln!("npm ci: {:?}", started.elapsed());
        }
        let started = Instant::now();
        run(&node(), &["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], "tsc");
        eprintln!("tsc: {:?}", started.elapsed());
    });
}

async fn built_async() {
    tokio::task::spawn_blocking(built).await.expect("the build thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_types_are_current_and_the_check_can_fail() {
    built_async().await;
    let check = ["scripts/check-generated.mjs"];
    let output = run(&node(), &check, "the generated types check");
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));

    // The same check against a description with one more schema must fail.
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(root().join("docs/openapi.json")).unwrap()).unwrap();
    spec["components"]["schemas"]["CheckCanFail"] = json!({"type": "string"});
    let changed = root().join(format!("target/typescript-client/{}.json", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(changed.parent().unwrap()).unwrap();
    std::fs::write(&changed, serde_json::to_vec(&spec).unwrap()).unwrap();
    let stale = Command::new(node())
        .args(check)
        .env("LONGHAUL_OPENAPI", &changed)
        .current_dir(package())
        .output()
        .unwrap();
    std::fs::remove_file(&changed).unwrap();
    assert!(!stale.status.success(), "the check passed a description the types do not match");
    assert!(String::from_utf8_lossy(&stale.stderr).contains("not current"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_suite_passes_against_the_local_stack() {
    let api_url = stack().stack.api_url.clone();
    built_async().await;
    let tokens: BTreeMap<&str, String> =
        PRINCIPALS.iter().map(|label| (*label, stack().stack.token(&principal(label)))).collect();
    let mut files: Vec<String> = std::fs::read_dir(package().join("test"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".test.mjs"))
        .map(|name| format!("test/{name}"))
        .collect();
    files.sort();
    let started = Instant::now();
    let output = tokio::process::Command::new(node())
        .args(["--test", "--test-reporter=tap", "--test-concurrency=8"])
        .args(&files)
        .env("LONGHAUL_API", &api_url)
        .env("LONGHAUL_TEST_TOKENS", serde_json::to_string(&tokens).unwrap())
        .env("LONGHAUL_TEST_SUBMISSIONS_PER_MINUTE", SUBMISSIONS_PER_MINUTE)
        .current_dir(package())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("node --test ({:?}):\n{stdout}\n{stderr}", started.elapsed());
    let count = |name: &str| -> usize {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("# {name} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `# {name}` line in the TAP output"))
    };
    assert!(output.status.success(), "the Node suite failed ({})", output.status);
    assert_eq!(count("fail"), 0);
    assert_eq!(count("cancelled"), 0);
    assert!(count("pass") >= NODE_TESTS, "only {} of {NODE_TESTS} tests passed", count("pass"));
    longhaul_tests::assert_no_access_denied();
}

// ------------------------------------------------------------------------------- the browser

/// The test page's server: the package's files (`dist/`, the parser, `test/browser/`) and the
/// API under `/api` (an app's own origin in front of the API, as some deployments put it; the
/// live stream stays cross-origin, through the function URL's CORS).
#[derive(Clone)]
struct Site {
    api: String,
    http: reqwest::Client,
}

async fn proxy(
    State(site): State<Site>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let target = format!("{}{}", site.api, path.strip_prefix("/api").unwrap_or(path));
    let mut request = site.http.request(method, target).body(body);
    for name in ["authorization", "content-type", "accept", "idempotency-key", "if-none-match"] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value);
        }
    }
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(err) => return (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !matches!(name.as_str(), "content-length" | "transfer-encoding" | "connection") {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    let bytes = answer.bytes().await.unwrap_or_default();
    response.body(axum::body::Body::from(bytes)).unwrap()
}

async fn file(uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    let allowed = ["dist/", "node_modules/eventsource-parser/dist/", "test/browser/"];
    if path.contains("..") || !allowed.iter().any(|prefix| path.starts_with(prefix)) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Ok(bytes) = std::fs::read(package().join(path)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let content_type = match Path::new(path).extension().and_then(|e| e.to_str()) {
        Some("js" | "mjs") => "text/javascript",
        Some("html") => "text/html; charset=utf-8",
        _ => "application/json",
    };
    ([("content-type", content_type)], bytes).into_response()
}

/// Serves the test page on `localhost` (a secure context, another origin than the stack's
/// `127.0.0.1` links); answers its origin.
async fn serve_site(api: String) -> String {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build();
    let site = Site { api, http: http.unwrap() };
    let app = axum::Router::new()
        .route("/api/{*rest}", axum::routing::any(proxy))
        .fallback(file)
        .with_state(site);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://localhost:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_the_stream_in_headless_chromium() {
    let api_url = stack().stack.api_url.clone();
    built_async().await;
    let (chromedriver, chromium) = browser();
    let origin = serve_site(api_url.clone()).await;
    let token = stack().stack.token(&principal("browser"));
    let driver = start_driver(&chromedriver).await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--no-proxy-server"]}),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session");
    client.goto(&format!("{origin}/test/browser/index.html#token={token}")).await.unwrap();

    // Wait for the page to finish, as long as it keeps moving (its phase, its progress updates,
    // its requests): a minute without a change fails the test.
    let still_for = Duration::from_secs(60);
    let mut last = Value::Null;
    let mut since = Instant::now();
    let state = loop {
        let state = client.execute("return window.__state ?? null", vec![]).await.unwrap();
        if matches!(state["phase"].as_str(), Some("done" | "failed")) {
            break state;
        }
        let moved = json!([
            state["phase"],
            state["updates"].as_array().map(Vec::len),
            state["requests"].as_array().map(Vec::len)
        ]);
        if moved != last {
            last = moved;
            since = Instant::now();
        }
        assert!(since.elapsed() < still_for, "the page stopped moving: {state:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    client.close().await.unwrap();
    drop(driver);
    assert_eq!(state["phase"], "done", "{}", state["error"].as_str().unwrap_or_default());

    assert_eq!(state["final"]["status"], "succeeded", "{state:#}");
    let updates = state["updates"].as_array().unwrap();
    let pcts: Vec<f64> = updates.iter().map(|u| u["pct"].as_f64().unwrap()).collect();
    assert!(pcts.windows(2).all(|w| w[0] <= w[1]), "the bar went backwards: {pcts:?}");
    assert!(pcts.iter().any(|p| *p > 0.0 && *p < 100.0), "the bar moved: {pcts:?}");
    assert_eq!(pcts.last(), Some(&100.0));

    // Over the stream, cross-origin (through the function URL's CORS): opened, resumed with
    // Last-Event-ID, a fresh link after one expired — and never a request the browser refused.
    let requests = state["requests"].as_array().unwrap();
    let streams: Vec<&Value> =
        requests.iter().filter(|r| r["url"].as_str().unwrap().contains("/events?token=")).collect();
    assert!(streams.iter().all(|r| r["error"].is_null()), "a stream request failed: {streams:#?}");
    assert!(streams.iter().all(|r| r["url"].as_str().unwrap().starts_with(&api_url)));
    assert!(streams.iter().filter(|r| r["status"] == 200).count() >= 2, "{streams:#?}");
    assert!(streams.iter().any(|r| r["lastEventId"].is_string()), "resumed: {streams:#?}");
    assert!(streams.iter().any(|r| r["status"] == 401), "a link expired: {streams:#?}");
    let is_stream = |r: &Value| r["url"].as_str().unwrap().contains("/events?token=");
    for (i, expired) in requests.iter().enumerate().filter(|(_, r)| is_stream(r)) {
        if expired["status"] != 401 {
            continue;
        }
        // The next request reads the job for a fresh link, and the stream reopens with it.
        let next = &requests[i + 1];
        assert!(!is_stream(next) && next["url"].as_str().unwrap().contains("/api/jobs/"));
        if let Some(reopened) = requests[i + 1..].iter().find(|r| is_stream(r)) {
            assert_ne!(reopened["url"], expired["url"], "a fresh link: {requests:#?}");
        }
    }

    // The result's URL (the 303, followed by the browser), the upload (XHR progress), a problem.
    assert_eq!(state["resultItems"], 80, "{state:#}");
    let size = state["uploadSize"].as_u64().unwrap();
    let uploads = state["uploads"].as_array().unwrap();
    assert_eq!(uploads.first(), Some(&json!({"loaded": 0, "total": size})));
    assert_eq!(uploads.last(), Some(&json!({"loaded": size, "total": size})));
    assert!(state["input"].as_str().unwrap().ends_with("/browser.csv"), "{state:#}");
    assert_eq!(
        state["problem"],
        json!({"name": "LonghaulError", "status": 422, "type": "/problems/unknown-job-type",
               "title": "Unknown job type"})
    );
    longhaul_tests::assert_no_access_denied();
}
