//! The web console (`console/`, served at `/console/` by the console function), driven in a
//! real browser: headless Chromium through chromedriver (Debian's `chromium` and
//! `chromium-driver`, installed here with apt-get when missing — a machine where they cannot
//! be installed FAILS this test, it never passes without a browser).
//!
//! The console is opened at `http://localhost:<port>/console/` while the stack's links (the
//! events function URL, presigned S3 URLs) name `127.0.0.1`: every stream, download and
//! upload is cross-origin, as deployed, and works only with the CORS answers of the function
//! URL and the bucket. Stream links live 3 s here (`LONGHAUL_STREAM_TOKEN_TTL_SECONDS`) and
//! streams end every 2 s (`LONGHAUL_STREAM_MAX_SECONDS`), so a job of a few seconds already
//! sees EventSource reconnect with Last-Event-ID and then its link expire: the console must
//! fetch a fresh one, or the bar stops. Screenshots go to `target/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use longhaul_tests::browser::{Driver, browser, start_driver};
use longhaul_tests::{Api, harness_with, principal, root};
use serde_json::{Value, json};

/// The stack of the console's cases: short stream links (see above), and `http` loopback
/// webhook endpoints allowed (the endpoint case's partner listens on loopback; nothing here
/// listens on a public host, and public names may not even resolve).
fn stack() -> &'static longhaul_tests::Harness {
    harness_with(&[
        ("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1"),
        ("LONGHAUL_STREAM_TOKEN_TTL_SECONDS", "3"),
        ("LONGHAUL_STREAM_MAX_SECONDS", "2"),
        ("LONGHAUL_STREAM_POLL_MS", "100"),
    ])
}

/// The API client of a new principal named after `label`, on the stack of [`stack`] (started
/// here if it is not yet: the first use of a test binary's stack decides its settings).
fn user(label: &str) -> Api {
    stack();
    Api::new(&principal(label))
}

/// One browser at a time: two Chromium sessions side by side would slow each other's
/// timing-sensitive checks on a small machine.
static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A raw WebDriver command chromedriver understands beyond the W3C set.
#[derive(Debug)]
struct Raw {
    path: &'static str,
    body: Value,
}

impl WebDriverCompatibleCommand for Raw {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/{}", session.unwrap_or_default(), self.path))
    }

    fn method_and_body(&self, _url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

async fn open_browser(driver: &Driver, chromium: &Path, downloads: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--no-proxy-server"],
            "prefs": {"download.default_directory": downloads, "download.prompt_for_download": false},
        }),
    );
    caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session");
    client
        .issue_cmd(Raw {
            path: "goog/cdp/execute",
            body: json!({"cmd": "Browser.setDownloadBehavior",
                         "params": {"behavior": "allow", "downloadPath": downloads}}),
        })
        .await
        .expect("allowing downloads");
    client
}

/// A fresh folder for the browser's downloads (Chromium wants a plain absolute path, no `..`).
fn downloads_dir() -> PathBuf {
    let downloads = root().join(format!("target/console-downloads/{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&downloads).unwrap();
    downloads.canonicalize().unwrap()
}

/// A browser (and its chromedriver, stopped when dropped) on the console, downloading into
/// `downloads`, signed in as `api`'s principal from `#token=` (which leaves the address bar at
/// once). The console is opened on another origin (`localhost`) than the links the stack hands
/// out (`127.0.0.1`): all of them are cross-origin, as deployed.
async fn open_console(api: &Api, downloads: &Path) -> (Driver, Client) {
    let (chromedriver, chromium) = browser();
    let console_origin = stack().stack.api_url.replace("127.0.0.1", "localhost");
    let token = api.token.clone().unwrap();
    let driver = start_driver(&chromedriver).await;
    let client = open_browser(&driver, &chromium, downloads).await;
    client.goto(&format!("{console_origin}/console/#token={token}")).await.unwrap();
    (driver, client)
}

/// The jobs table as the page shows it.
async fn rows(client: &Client) -> Vec<Value> {
    let script = r#"return [...document.querySelectorAll('#jobs tbody tr')].map(r => ({
        id: r.dataset.jobId, status: r.dataset.status || '',
        pct: Number(r.querySelector('progress').value),
        streams: Number(r.dataset.streams), opened: Number(r.dataset.streamsOpened),
        refreshes: Number(r.dataset.linkRefreshes),
        downloaded: r.dataset.downloadedBytes ? Number(r.dataset.downloadedBytes) : null,
        shards: (s => s.hidden ? null : {total: Number(s.dataset.total),
            succeeded: Number(s.dataset.succeeded), running: Number(s.dataset.running),
            segments: [...s.children].map(c => c.getBoundingClientRect().width)})(
            r.querySelector('.shards')) }));"#;
    match client.execute(script, vec![]).await.expect("reading the jobs table") {
        Value::Array(rows) => rows,
        other => panic!("{other:?}"),
    }
}

async fn row(client: &Client, job_id: &str) -> Option<Value> {
    rows(client).await.into_iter().find(|r| r["id"] == job_id)
}

async fn screenshot(client: &Client, name: &str) {
    let dir = root().join("target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = client.screenshot().await.expect("a screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Waits until `check` holds for the job's row, recording every row seen; panics after
/// `within`, with a screenshot.
async fn wait_row(
    client: &Client,
    job_id: &str,
    within: Duration,
    what: &str,
    seen: &mut Vec<Value>,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some(row) = row(client, job_id).await {
            seen.push(row.clone());
            if check(&row) {
                return row;
            }
        }
        if Instant::now() > deadline {
            screenshot(client, &format!("timeout-{what}")).await;
            panic!("{what}: not within {within:?}; last rows {:?}", seen.last());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn submit_from_form(client: &Client, job_type: &str, params: &[(&str, &str)]) -> String {
    let before: Vec<Value> = rows(client).await.into_iter().map(|r| r["id"].clone()).collect();
    client.find(Locator::Id("job-type")).await.unwrap().select_by_value(job_type).await.unwrap();
    for (name, value) in params {
        let input = client.find(Locator::Id(&format!("param-{name}"))).await.unwrap();
        input.clear().await.unwrap();
        input.send_keys(value).await.unwrap();
    }
    client.find(Locator::Id("submit")).await.unwrap().click().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = rows(client).await;
        if let Some(new) = now.iter().find(|r| !before.contains(&r["id"])) {
            return new["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the submitted job never showed in the list");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The browser's console log: every entry of level SEVERE, except the failed loads this test
/// provokes on purpose (an expired stream link answers 401; an invalid submission 422).
async fn severe_log_entries(client: &Client) -> Vec<Value> {
    let log = client
        .issue_cmd(Raw { path: "se/log", body: json!({"type": "browser"}) })
        .await
        .expect("the browser log");
    log.as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["level"] == "SEVERE")
        .filter(|e| {
            let message = e["message"].as_str().unwrap_or_default();
            let expected_expiry =
                message.contains("/_fn/EventsFunction/jobs/") && message.contains("401");
            let expected_refusal = (message.contains("/jobs ")
                || message.contains("/schedules ")
                || message.contains("/webhooks/endpoints "))
                && message.contains("422");
            !(expected_expiry || expected_refusal)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_submits_watches_downloads_pauses_and_cancels_in_a_real_browser() {
    let _browser = BROWSER.lock().await;
    let api = user("console");
    let token = api.token.clone().unwrap();
    let seeded = api
        .post_json("/jobs", &json!({"type": "demo", "params": {"items": 1, "item_ms": 0}}))
        .await;
    assert_eq!(seeded.status, 202, "{}", seeded.text);
    let seeded_id = seeded.json["job_id"].as_str().unwrap().to_owned();

    let downloads = downloads_dir();
    // Signed in from the fragment, which leaves the address bar at once.
    let (driver, client) = open_console(&api, &downloads).await;
    let mut seen = Vec::new();
    wait_row(&client, &seeded_id, Duration::from_secs(30), "seeded job listed", &mut seen, |r| {
        r["status"] == "succeeded"
    })
    .await;
    let url = client.current_url().await.unwrap();
    assert!(!url.as_str().contains("token"), "the token stayed in the address: {url}");
    let stored = client.execute("return sessionStorage.getItem('longhaul.token')", vec![]).await;
    assert_eq!(stored.unwrap(), Value::String(token.clone()));
    screenshot(&client, "1-signed-in").await;

    // A problem+json answer is shown, title and detail.
    client.find(Locator::Id("raw-mode")).await.unwrap().click().await.unwrap();
    let raw = client.find(Locator::Id("raw-params")).await.unwrap();
    raw.clear().await.unwrap();
    raw.send_keys(r#"{"items": 0}"#).await.unwrap();
    client.find(Locator::Id("job-type")).await.unwrap().select_by_value("demo").await.unwrap();
    client.find(Locator::Id("submit")).await.unwrap().click().await.unwrap();
    let problem = client.wait().for_element(Locator::Css("#problem:not([hidden])")).await.unwrap();
    let shown = problem.text().await.unwrap();
    assert!(shown.contains("items"), "the problem's detail is shown: {shown:?}");
    screenshot(&client, "2-problem").await;
    client.find(Locator::Id("problem-close")).await.unwrap().click().await.unwrap();
    client.find(Locator::Id("raw-mode")).await.unwrap().click().await.unwrap();
    // The params form is generated from the type's params_schema.
    client.find(Locator::Id("job-type")).await.unwrap().select_by_value("demo").await.unwrap();

    // A job submitted from the form: its bar moves over the stream and reaches 100 %.
    // Fanned out over two shards: the row shows them as a segmented bar.
    let job =
        submit_from_form(&client, "demo", &[("items", "50"), ("item_ms", "200"), ("shards", "2")])
            .await;
    let mut seen = Vec::new();
    let done = wait_row(&client, &job, Duration::from_secs(120), "job succeeded", &mut seen, |r| {
        r["status"] == "succeeded" && r["pct"] == 100.0
    })
    .await;
    screenshot(&client, "3-succeeded").await;
    assert!(
        seen.iter()
            .any(|r| r["status"] == "running"
                && r["pct"].as_f64().is_some_and(|p| p > 0.0 && p < 100.0)),
        "the bar moved while the job ran: {seen:?}"
    );
    let mut last = 0.0;
    for r in &seen {
        let pct = r["pct"].as_f64().unwrap();
        assert!(pct >= last, "the bar went backwards: {seen:?}");
        last = pct;
    }
    let shards = &done["shards"];
    assert_eq!((&shards["total"], &shards["succeeded"]), (&json!(2), &json!(2)), "{done}");
    assert!(shards["segments"][0].as_f64().unwrap() > 0.0, "the done segment is drawn: {done}");
    assert!(
        seen.iter().any(|r| r["status"] == "running" && r["shards"]["total"] == 2),
        "the shards were shown while the job ran: {seen:?}"
    );
    // Streams were reopened with fresh links as the 3-second links expired: never a dead end.
    assert!(done["opened"].as_f64().unwrap() >= 2.0, "{done}");
    assert!(done["refreshes"].as_f64().unwrap() >= 1.0, "{done}");

    // Download the result (the 303 to its link, here the API's own for a small result,
    // followed by the page).
    click(&client, &format!("tr[data-job-id='{job}'] button.download")).await;
    let file = downloads.join(format!("{job}-result.json"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !file.is_file() {
        if Instant::now() > deadline {
            screenshot(&client, "timeout-download").await;
            let problem = client.find(Locator::Id("problem")).await.unwrap().text().await;
            panic!(
                "no download appeared in {}; the page says {problem:?}; rows {:?}; browser log {:#?}",
                downloads.display(),
                rows(&client).await,
                severe_log_entries(&client).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Chromium writes the file, then renames it; wait until it parses.
    let result: Value = loop {
        if let Ok(result) = serde_json::from_slice(&std::fs::read(&file).unwrap()) {
            break result;
        }
        assert!(Instant::now() < deadline, "the download never completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(result["items"], 50, "{result}");

    // A job whose params name an upload: the file input uploads it (POST /uploads, then the
    // presigned PUT, cross-origin) and fills in the `input` to name.
    let csv = downloads.join("sales.csv");
    std::fs::write(&csv, "region,amount\neu,1\nus,2\neu,3\n").unwrap();
    client
        .find(Locator::Id("job-type"))
        .await
        .unwrap()
        .select_by_value("csv_report")
        .await
        .unwrap();
    let file_input = client.find(Locator::Css("input[data-upload-for='input']")).await.unwrap();
    file_input.send_keys(csv.to_str().unwrap()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let named = client.execute("return document.getElementById('param-input').value", vec![]);
        if named.await.unwrap().as_str().is_some_and(|v| v.starts_with("uploads/")) {
            break;
        }
        if Instant::now() > deadline {
            screenshot(&client, "timeout-upload").await;
            let problem = client.find(Locator::Id("problem")).await.unwrap().text().await;
            panic!("the upload never named its input; the page says {problem:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = submit_from_form(
        &client,
        "csv_report",
        &[("group_by", r#"["region"]"#), ("metrics", r#"[{"op": "sum", "column": "amount"}]"#)],
    )
    .await;
    wait_row(&client, &report, Duration::from_secs(60), "report succeeded", &mut seen, |r| {
        r["status"] == "succeeded"
    })
    .await;
    let report = api.get(&format!("/jobs/{report}/result")).await;
    assert_eq!(report.status, 303, "{}", report.text);

    // The job's transitions, in the detail view.
    click(&client, &format!("tr[data-job-id='{job}'] a.job-link")).await;
    client.wait().for_element(Locator::Css("#detail-section:not([hidden])")).await.unwrap();
    let transitions = client.find(Locator::Id("transitions")).await.unwrap().text().await.unwrap();
    for state in ["queued", "running", "succeeded"] {
        assert!(transitions.contains(state), "{state} in {transitions:?}");
    }
    screenshot(&client, "4-detail").await;

    // A long job, cancelled from its row.
    let long = submit_from_form(&client, "demo", &[("items", "1000"), ("item_ms", "1000")]).await;
    let mut seen = Vec::new();
    wait_row(&client, &long, Duration::from_secs(60), "long job running", &mut seen, |r| {
        r["status"] == "running"
    })
    .await;
    // Paused from its row (it saves its checkpoint at its next progress write), then resumed.
    click(&client, &format!("tr[data-job-id='{long}'] button.pause")).await;
    wait_row(&client, &long, Duration::from_secs(60), "long job paused", &mut seen, |r| {
        r["status"] == "paused"
    })
    .await;
    let paused = api.get(&format!("/jobs/{long}")).await;
    assert_eq!(paused.json["pause"]["reason"], "paused from the web console", "{}", paused.text);
    click(&client, &format!("tr[data-job-id='{long}'] button.resume")).await;
    wait_row(&client, &long, Duration::from_secs(60), "long job running again", &mut seen, |r| {
        r["status"] == "running"
    })
    .await;
    let resumed = api.get(&format!("/jobs/{long}")).await;
    assert!(resumed.json["paused_seconds"].is_u64(), "{}", resumed.text);
    click(&client, &format!("tr[data-job-id='{long}'] button.cancel")).await;
    wait_row(&client, &long, Duration::from_secs(60), "long job cancelled", &mut seen, |r| {
        r["status"] == "cancelled"
    })
    .await;
    let cancelled = api.get(&format!("/jobs/{long}")).await;
    assert_eq!(cancelled.json["status"], "cancelled", "{}", cancelled.text);
    // ... and retried: a new job, listed at the top.
    click(&client, &format!("tr[data-job-id='{long}'] button.retry")).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let retried = loop {
        let first = rows(&client).await.into_iter().next().unwrap();
        if first["id"] != long.as_str() && first["id"] != job.as_str() {
            break first["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the retry never showed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let retry = api.get(&format!("/jobs/{retried}")).await;
    assert_eq!(retry.json["retry_of"], long.as_str(), "{}", retry.text);
    let stop = api.post_json(&format!("/jobs/{retried}/cancel"), &json!({})).await;
    assert_eq!(stop.status, 202, "{}", stop.text);
    screenshot(&client, "5-cancelled").await;

    let errors = severe_log_entries(&client).await;
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
    client.close().await.unwrap();
    drop(driver);
    longhaul_tests::assert_no_access_denied();
}

/// The rows of a table as `script` (which returns an array) reads them.
async fn table_rows(client: &Client, script: &str) -> Vec<Value> {
    match client.execute(script, vec![]).await.expect("reading a table") {
        Value::Array(rows) => rows,
        other => panic!("{other:?}"),
    }
}

/// The schedules table as the page shows it.
const SCHEDULE_ROWS: &str = r#"return [...document.querySelectorAll('#schedules tbody tr')].map(r => ({
    id: r.dataset.scheduleId, state: r.dataset.state, next: r.dataset.nextFireAt,
    outcome: r.dataset.lastOutcome, job: r.dataset.lastJobId, fired: Number(r.dataset.fired),
    expression: r.querySelector('.expression').textContent,
    timezone: r.querySelector('.timezone').textContent }));"#;

async fn schedule_rows(client: &Client) -> Vec<Value> {
    table_rows(client, SCHEDULE_ROWS).await
}

/// Reads the table `script` reads until `found` picks from its rows what the test waits for;
/// panics after 30 s, with a screenshot named after `what`.
async fn wait_rows<T>(
    client: &Client,
    script: &str,
    what: &str,
    found: impl Fn(&[Value]) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = table_rows(client, script).await;
        if let Some(found) = found(&rows) {
            return found;
        }
        if Instant::now() > deadline {
            screenshot(client, &format!("timeout-{what}")).await;
            let problem = client.find(Locator::Id("problem")).await.unwrap().text().await;
            panic!("{what}: not within 30 s; rows {rows:?}; the page says {problem:?}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// The first row of the table `script` reads, once there is one (the row a form just created).
async fn first_row(client: &Client, script: &str, what: &str) -> Value {
    wait_rows(client, script, what, |rows| rows.first().cloned()).await
}

/// Waits until `check` holds for the row whose `id` is `id` of the table `script` reads
/// (`None`: the row is gone).
async fn wait_table_row(
    client: &Client,
    script: &str,
    id: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> Option<Value> {
    wait_rows(client, script, what, |rows| {
        let row = rows.iter().find(|r| r["id"] == id);
        check(row).then(|| row.cloned())
    })
    .await
}

/// Waits until `check` holds for schedule `id`'s row (`None`: the row is gone).
async fn wait_schedule(
    client: &Client,
    id: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> Option<Value> {
    wait_table_row(client, SCHEDULE_ROWS, id, what, check).await
}

/// Clicks the element `css` finds. The tables re-render as they refresh, so an element found
/// may be replaced before the click lands (a stale element): then it is found again — a few
/// times at most; any other error fails the test.
async fn click(client: &Client, css: &str) {
    for attempt in 1.. {
        let element = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"));
        match element.click().await {
            Ok(()) => return,
            Err(fantoccini::error::CmdError::Standard(e))
                if e.error == fantoccini::error::ErrorStatus::StaleElementReference
                    && attempt < 10 => {}
            Err(e) => panic!("clicking {css}: {e}"),
        }
    }
}

/// Clicks the link `link` to a view, waits until the view's section (id `section`) shows,
/// and returns the text of its summary (id `summary`).
async fn open_view(client: &Client, link: &str, section: &str, summary: &str) -> String {
    click(client, link).await;
    let shown = format!("#{section}:not([hidden])");
    client.wait().for_element(Locator::Css(&shown)).await.unwrap();
    client.find(Locator::Id(summary)).await.unwrap().text().await.unwrap()
}

async fn fill(client: &Client, id: &str, value: &str) {
    let input = client.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}"));
    input.clear().await.unwrap();
    input.send_keys(value).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_creates_lists_pauses_resumes_and_runs_a_schedule() {
    let _browser = BROWSER.lock().await;
    let api = user("console-schedules");
    let (driver, client) = open_console(&api, &downloads_dir()).await;
    client.wait().for_element(Locator::Css("#schedules-empty:not([hidden])")).await.unwrap();
    client.wait().for_element(Locator::Css("#job-type option[value='demo']")).await.unwrap();

    // The job form, switched to a schedule: the kind's params form plus the schedule fields.
    client.find(Locator::Id("job-type")).await.unwrap().select_by_value("demo").await.unwrap();
    fill(&client, "param-items", "1").await;
    fill(&client, "param-item_ms", "0").await;
    click(&client, "#schedule-mode").await;
    client.wait().for_element(Locator::Css("#schedule-fields:not([hidden])")).await.unwrap();
    let button = client.find(Locator::Id("submit")).await.unwrap().text().await.unwrap();
    assert_eq!(button, "Create schedule");
    // A bad expression: the API's problem is shown, nothing is listed.
    fill(&client, "schedule-expression", "cron(0 2 * *)").await;
    click(&client, "#submit").await;
    let problem = client.wait().for_element(Locator::Css("#problem:not([hidden])")).await.unwrap();
    let shown = problem.text().await.unwrap();
    assert!(shown.contains("Invalid schedule expression"), "{shown:?}");
    click(&client, "#problem-close").await;
    assert!(schedule_rows(&client).await.is_empty());

    let yearly = "cron(0 2 1 1 ? *)";
    fill(&client, "schedule-expression", yearly).await;
    fill(&client, "schedule-timezone", "Europe/Paris").await;
    client
        .find(Locator::Id("schedule-overlap"))
        .await
        .unwrap()
        .select_by_value("allow")
        .await
        .unwrap();
    click(&client, "#submit").await;
    let created = first_row(&client, SCHEDULE_ROWS, "schedule-created").await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (&created["expression"], &created["timezone"]),
        (&json!(yearly), &json!("Europe/Paris"))
    );
    assert_eq!(created["state"], "enabled", "{created}");
    assert!(created["next"].as_str().is_some_and(|n| !n.is_empty()), "{created}");
    let stored = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(stored.status, 200, "{}", stored.text);
    assert_eq!(stored.json["params"], json!({"items": 1, "item_ms": 0}), "{}", stored.text);
    assert_eq!((&stored.json["type"], &stored.json["overlap"]), (&json!("demo"), &json!("allow")));
    screenshot(&client, "schedules-1-created").await;

    // Listed after a reload too (from GET /schedules).
    client.refresh().await.unwrap();
    wait_schedule(&client, &id, "listed after a reload", |r| {
        r.is_some_and(|r| r["state"] == "enabled")
    })
    .await;

    // Pause, then resume, from its row.
    click(&client, &format!("tr[data-schedule-id='{id}'] button.pause")).await;
    wait_schedule(&client, &id, "paused", |r| {
        r.is_some_and(|r| r["state"] == "paused" && r["next"] == "")
    })
    .await;
    let paused = api.get(&format!("/schedules/{id}")).await.json;
    assert_eq!(paused["state"], "paused", "{paused}");
    assert_eq!(paused["paused_reason"], "paused from the web console", "{paused}");
    screenshot(&client, "schedules-2-paused").await;
    click(&client, &format!("tr[data-schedule-id='{id}'] button.resume")).await;
    wait_schedule(&client, &id, "resumed", |r| {
        r.is_some_and(|r| r["state"] == "enabled" && r["next"] != "")
    })
    .await;
    assert_eq!(api.get(&format!("/schedules/{id}")).await.json["state"], "enabled");

    // Run it now: its tick's job joins the jobs list and runs to the end there.
    click(&client, &format!("tr[data-schedule-id='{id}'] button.trigger")).await;
    let fired = wait_schedule(&client, &id, "tick submitted", |r| {
        r.is_some_and(|r| r["outcome"] == "submitted" && r["job"] != "")
    })
    .await
    .unwrap();
    assert_eq!(fired["fired"], 1, "{fired}");
    let job = fired["job"].as_str().unwrap().to_owned();
    let mut seen = Vec::new();
    wait_row(&client, &job, Duration::from_secs(60), "scheduled job succeeded", &mut seen, |r| {
        r["status"] == "succeeded"
    })
    .await;
    assert_eq!(api.get(&format!("/jobs/{job}")).await.json["schedule_id"], id.as_str());

    // Its view: the spec and its recent jobs, each linking to the job's own view.
    let link = format!("tr[data-schedule-id='{id}'] a.schedule-link");
    let summary = open_view(&client, &link, "schedule-detail-section", "schedule-summary").await;
    for part in [yearly, "Europe/Paris", "allow", "1 fired · 1 submitted · 0 skipped · 0 refused"]
    {
        assert!(summary.contains(part), "{part:?} in {summary:?}");
    }
    click(&client, &format!("#schedule-jobs tr[data-job-id='{job}'] a.job-link")).await;
    client.wait().for_element(Locator::Css("#detail-section:not([hidden])")).await.unwrap();
    let detail = client.find(Locator::Id("detail-summary")).await.unwrap().text().await.unwrap();
    assert!(detail.contains(&id), "the job names its schedule: {detail:?}");
    screenshot(&client, "schedules-3-detail").await;

    // Delete takes a second click.
    click(&client, &format!("tr[data-schedule-id='{id}'] button.delete")).await;
    assert_eq!(api.get(&format!("/schedules/{id}")).await.status, 200, "one click deletes nothing");
    click(&client, &format!("tr[data-schedule-id='{id}'] button.delete.confirming")).await;
    wait_schedule(&client, &id, "deleted", |r| r.is_none()).await;
    assert_eq!(api.get(&format!("/schedules/{id}")).await.status, 404);
    assert!(
        client
            .find(Locator::Id("schedule-detail-section"))
            .await
            .unwrap()
            .attr("hidden")
            .await
            .unwrap()
            .is_some()
    );

    let errors = severe_log_entries(&client).await;
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
    client.close().await.unwrap();
    drop(driver);
    longhaul_tests::assert_no_access_denied();
}

/// The webhook endpoints table as the page shows it (`descriptionElements`: elements inside
/// the description, which is text only).
const ENDPOINT_ROWS: &str = r#"return [...document.querySelectorAll('#endpoints tbody tr')].map(r => {
    const description = r.querySelector('.url .description');
    return { id: r.dataset.endpointId, status: r.dataset.status,
        reason: r.dataset.disabledReason, url: r.querySelector('.url').firstChild.textContent,
        description: description ? description.textContent : null,
        descriptionElements: description ? description.children.length : 0,
        events: r.querySelector('.events').textContent,
        health: r.querySelector('.health').textContent }; });"#;

/// The open endpoint's deliveries as the page shows them.
const DELIVERY_ROWS: &str = r#"return [...document.querySelectorAll('#endpoint-deliveries tbody tr')].map(r => ({
    id: r.dataset.webhookId, job: r.dataset.jobId, status: r.dataset.status,
    resend: r.querySelector('button.resend') !== null }));"#;

/// A local partner for the endpoint case: answers every delivery with the status it is set
/// to, and records each one's `webhook-id` with the status it was answered.
#[derive(Clone, Default)]
struct Partner {
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
    received: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
}

impl Partner {
    /// Listens on loopback, answering `status`; returns it and its URL.
    async fn start(status: u16) -> (Partner, String) {
        let partner = Partner::default();
        partner.answer_with(status);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/partner", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/hooks/partner", axum::routing::post(Partner::receive))
            .with_state(partner.clone());
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                eprintln!("the partner stopped: {err}");
            }
        });
        (partner, url)
    }

    async fn receive(
        axum::extract::State(partner): axum::extract::State<Partner>,
        headers: axum::http::HeaderMap,
    ) -> axum::http::StatusCode {
        let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let status = partner.status.load(std::sync::atomic::Ordering::SeqCst);
        partner.received.lock().unwrap().push((id.to_owned(), status));
        axum::http::StatusCode::from_u16(status).expect("a status code")
    }

    fn answer_with(&self, status: u16) {
        self.status.store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many deliveries of `webhook_id` it answered `status`.
    fn count(&self, webhook_id: &str, status: u16) -> usize {
        let received = self.received.lock().unwrap();
        received.iter().filter(|(id, code)| id == webhook_id && *code == status).count()
    }

    /// Waits (up to a minute) until it has answered a delivery of `webhook_id` with 200.
    async fn wait_delivered(&self, webhook_id: &str) {
        let deadline = longhaul_tests::Deadline::new(
            format!("delivery {webhook_id} answered 200"),
            Duration::from_secs(60),
        );
        while self.count(webhook_id, 200) == 0 {
            deadline.tick(Duration::from_millis(150), format!("{:?}", self.received)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_creates_lists_enables_recovers_and_deletes_a_webhook_endpoint() {
    let _browser = BROWSER.lock().await;
    let (partner, partner_url) = Partner::start(410).await;
    let api = user("console-endpoints");
    let (driver, client) = open_console(&api, &downloads_dir()).await;
    client.wait().for_element(Locator::Css("#endpoints-empty:not([hidden])")).await.unwrap();

    // No event ticked: the API's problem is shown, nothing is listed.
    fill(&client, "endpoint-url", &partner_url).await;
    for event in ["job.succeeded", "job.failed"] {
        click(&client, &format!("input[name='endpoint-event'][value='{event}']")).await;
    }
    click(&client, "#endpoint-create").await;
    let problem = client.wait().for_element(Locator::Css("#problem:not([hidden])")).await.unwrap();
    let shown = problem.text().await.unwrap();
    assert!(shown.contains("Invalid endpoint") && shown.contains("events"), "{shown:?}");
    click(&client, "#problem-close").await;
    assert!(table_rows(&client, ENDPOINT_ROWS).await.is_empty());

    // Created from the form, with a description that is shown as text, never as markup.
    click(&client, "input[name='endpoint-event'][value='job.succeeded']").await;
    let description = "billing <b>partner</b> & co";
    fill(&client, "endpoint-description", description).await;
    click(&client, "#endpoint-create").await;
    let created = first_row(&client, ENDPOINT_ROWS, "endpoint-created").await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (&created["status"], &created["url"], &created["events"]),
        (&json!("enabled"), &json!(partner_url), &json!("job.succeeded"))
    );
    assert_eq!(
        (&created["description"], &created["descriptionElements"]),
        (&json!(description), &json!(0))
    );
    assert_eq!(created["health"], "", "{created}");
    let stored = api.get(&format!("/webhooks/endpoints/{id}")).await;
    assert_eq!(stored.status, 200, "{}", stored.text);
    assert_eq!(
        (&stored.json["url"], &stored.json["events"], &stored.json["description"]),
        (&json!(partner_url), &json!(["job.succeeded"]), &json!(description))
    );
    screenshot(&client, "endpoints-1-created").await;

    // Listed after a reload too (from GET /webhooks/endpoints).
    client.refresh().await.unwrap();
    wait_table_row(&client, ENDPOINT_ROWS, &id, "endpoint listed after a reload", |r| {
        r.is_some_and(|r| r["status"] == "enabled")
    })
    .await;

    // Two jobs end; the partner answers 410 Gone: the endpoint is disabled, both deliveries
    // failed (the second answered 410 too, or was recorded failed while disabled).
    let first = api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    let second = api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    api.wait_terminal(&first, Duration::from_secs(60)).await;
    api.wait_terminal(&second, Duration::from_secs(60)).await;
    let deadline = longhaul_tests::Deadline::new("two failed deliveries", Duration::from_secs(60));
    loop {
        let failed = api.get(&format!("/webhooks/endpoints/{id}/deliveries?status=failed")).await;
        if failed.json["deliveries"].as_array().is_some_and(|d| d.len() == 2) {
            break;
        }
        deadline.tick(Duration::from_millis(200), failed.text).await;
    }
    click(&client, "#endpoints-refresh").await;
    let disabled = wait_table_row(&client, ENDPOINT_ROWS, &id, "endpoint disabled", |r| {
        r.is_some_and(|r| r["status"] == "disabled")
    })
    .await
    .unwrap();
    assert_eq!(disabled["reason"], "gone", "{disabled}");
    assert!(disabled["health"].as_str().unwrap().contains("410 Gone"), "{disabled}");
    assert!(
        client
            .find(Locator::Css(&format!("tr[data-endpoint-id='{id}'] button.enable")))
            .await
            .is_ok()
    );

    // Its view lists the failed deliveries, each with a resend button.
    let link = format!("tr[data-endpoint-id='{id}'] a.endpoint-link");
    let summary = open_view(&client, &link, "endpoint-detail-section", "endpoint-summary").await;
    assert!(summary.contains(&partner_url) && summary.contains("disabled"), "{summary:?}");
    let deliveries = table_rows(&client, DELIVERY_ROWS).await;
    let mut jobs: Vec<&str> = deliveries.iter().map(|d| d["job"].as_str().unwrap()).collect();
    jobs.sort_unstable();
    let mut expected = [first.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(jobs, expected, "{deliveries:?}");
    assert!(
        deliveries.iter().all(|d| d["status"] == "failed" && d["resend"] == true),
        "{deliveries:?}"
    );
    let resent = deliveries[0]["id"].as_str().unwrap().to_owned();
    let recovered = deliveries[1]["id"].as_str().unwrap().to_owned();
    screenshot(&client, "endpoints-2-disabled").await;

    // The partner is back: enable it from its row.
    partner.answer_with(200);
    click(&client, &format!("tr[data-endpoint-id='{id}'] button.enable")).await;
    wait_table_row(&client, ENDPOINT_ROWS, &id, "endpoint enabled", |r| {
        r.is_some_and(|r| r["status"] == "enabled" && r["health"] == "")
    })
    .await;
    assert_eq!(api.get(&format!("/webhooks/endpoints/{id}")).await.json["status"], "enabled");

    // Resend one delivery: queued again (pending), and the partner gets it, same webhook-id.
    click(&client, &format!("#endpoint-deliveries tr[data-webhook-id='{resent}'] button.resend"))
        .await;
    wait_table_row(&client, DELIVERY_ROWS, &resent, "delivery resent", |r| {
        r.is_some_and(|r| r["status"] == "pending" && r["resend"] == false)
    })
    .await;
    partner.wait_delivered(&resent).await;

    // Recover the rest (the default: failed since a day ago): the other one.
    click(&client, "#recover").await;
    let result =
        client.wait().for_element(Locator::Css("#recover-result[data-requeued]")).await.unwrap();
    assert_eq!(result.attr("data-requeued").await.unwrap().as_deref(), Some("1"));
    let said = result.text().await.unwrap();
    assert!(said.starts_with("1 failed delivery since "), "{said:?}");
    partner.wait_delivered(&recovered).await;
    client.wait().for_element(Locator::Css("#endpoint-no-deliveries:not([hidden])")).await.unwrap();
    screenshot(&client, "endpoints-3-recovered").await;

    // Delete takes a second click; its view closes.
    click(&client, &format!("tr[data-endpoint-id='{id}'] button.delete")).await;
    assert_eq!(
        api.get(&format!("/webhooks/endpoints/{id}")).await.status,
        200,
        "one click deletes nothing"
    );
    click(&client, &format!("tr[data-endpoint-id='{id}'] button.delete.confirming")).await;
    wait_table_row(&client, ENDPOINT_ROWS, &id, "endpoint deleted", |r| r.is_none()).await;
    assert_eq!(api.get(&format!("/webhooks/endpoints/{id}")).await.status, 404);
    client.wait().for_element(Locator::Css("#endpoints-empty:not([hidden])")).await.unwrap();
    let detail = client.find(Locator::Id("endpoint-detail-section")).await.unwrap();
    assert!(detail.attr("hidden").await.unwrap().is_some(), "the deleted endpoint's view closed");

    let errors = severe_log_entries(&client).await;
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
    client.close().await.unwrap();
    drop(driver);
    longhaul_tests::assert_no_access_denied();
}

/// The events function URL answers CORS as its `FunctionUrlConfig.Cors` says (the preflight
/// without invoking the function), and the console's files are served with a strict policy.
#[tokio::test]
async fn the_events_url_answers_cors_and_the_console_is_served() {
    let api_url = stack().stack.api_url.clone();
    let http = reqwest::Client::new();
    let origin = "https://app.example";
    let preflight = http
        .request(reqwest::Method::OPTIONS, format!("{api_url}/_fn/EventsFunction/jobs/x/events"))
        .header("origin", origin)
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", "last-event-id")
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 200);
    let header = |r: &reqwest::Response, name: &str| {
        r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
    };
    assert_eq!(header(&preflight, "access-control-allow-origin").as_deref(), Some("*"));
    assert!(header(&preflight, "access-control-allow-headers").unwrap().contains("last-event-id"));
    // A refused stream (no token) still carries the header, so the page can read the 401.
    let refused = http
        .get(format!("{api_url}/_fn/EventsFunction/jobs/x/events"))
        .header("origin", origin)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&refused, "access-control-allow-origin").as_deref(), Some("*"));

    let page = http.get(format!("{api_url}/console/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(header(&page, "content-security-policy").unwrap().contains("script-src 'self'"));
    assert!(page.text().await.unwrap().contains("app.js"));
    let redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{api_url}/console"))
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 308);
    let missing = http.get(format!("{api_url}/console/nope.js")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
