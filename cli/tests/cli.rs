//! The `longhaul` binary against the local stack: every command, its exit codes, its JSON
//! output, and a pseudo-terminal run of `watch` whose bar must reach 100 %.

use std::io::Read;
use std::process::Output;
use std::time::Duration;

use longhaul_tests::{Api, Aws, Harness, harness_with, principal};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// This binary's stack: `http` and loopback callback URLs are accepted (a schedule's callback
/// is checked at creation, and nothing here listens on a public host).
fn stack() -> &'static Harness {
    harness_with(&[("LONGHAUL_ALLOW_INSECURE_CALLBACKS", "1")])
}

/// One principal's token and API client.
struct User {
    token: String,
    api: Api,
}

fn user(label: &str) -> User {
    let name = principal(label);
    User { token: stack().stack.token(&name), api: Api::new(&name) }
}

/// Runs `longhaul args…` as `token` (no terminal: bars hidden) and waits for it.
async fn run(token: &str, args: &[&str]) -> Output {
    let output = tokio::time::timeout(Duration::from_secs(120), command(token, args).output())
        .await
        .expect("longhaul finished within 2 minutes")
        .expect("longhaul ran");
    eprintln!(
        "$ longhaul {}\n-> {:?}\nstdout: {}\nstderr: {}",
        args.join(" "),
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn command(token: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(args)
        .env("LONGHAUL_API", &stack().stack.api_url)
        .env("LONGHAUL_TOKEN", token)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_out(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", stdout(output)))
}

#[tokio::test]
async fn submit_wait_ends_with_the_jobs_exit_code() {
    let me = user("cli-wait");
    let ok =
        run(&me.token, &["submit", "demo", "--params", r#"{"items": 5, "item_ms": 20}"#, "--wait"])
            .await;
    assert_eq!(code(&ok), 0);
    assert!(stdout(&ok).contains(" succeeded"), "{}", stdout(&ok));

    let fatal = r#"{"items": 4, "fail_at": 1, "fail_kind": "fatal"}"#;
    let failed = run(&me.token, &["submit", "demo", "--params", fatal, "--wait"]).await;
    assert_eq!(code(&failed), 1, "a failed job exits 1");
    assert!(stdout(&failed).contains("failed: Job.Fatal: injected fatal failure at item 1"));

    // --json: one document, the job's final state.
    let doc =
        run(&me.token, &["--json", "submit", "demo", "--params", r#"{"items": 2}"#, "--wait"])
            .await;
    assert_eq!(code(&doc), 0);
    let job = json_out(&doc);
    assert_eq!((job["status"].as_str(), job["type"].as_str()), (Some("succeeded"), Some("demo")));
}

#[tokio::test]
async fn params_from_a_file_priority_and_idempotency_key_reach_the_api() {
    let me = user("cli-submit");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.json");
    std::fs::write(&file, r#"{"items": 3, "item_ms": 1}"#).unwrap();
    let at_file = format!("@{}", file.display());
    let args = ["submit", "demo", "--params", &at_file, "--idempotency-key", "cli-key-1"];
    let first = run(&me.token, &args).await;
    assert_eq!(code(&first), 0);
    let job_id = stdout(&first).trim().to_owned();
    let job = me.api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(job["type"], "demo");
    let again = run(&me.token, &args).await;
    assert_eq!((code(&again), stdout(&again).trim()), (0, job_id.as_str()), "the key replays");
    assert!(stderr(&again).contains("idempotent replay"));

    let high = run(
        &me.token,
        &["--json", "submit", "demo", "--params", "{\"items\": 1}", "--priority", "high"],
    )
    .await;
    assert_eq!(code(&high), 0);
    let high_id = json_out(&high)["job_id"].as_str().unwrap().to_owned();
    let job = me.api.get(&format!("/jobs/{high_id}")).await.json;
    assert_eq!(job["priority"], "high", "{job}");
}

#[tokio::test]
async fn a_cancelled_job_exits_3_from_watch() {
    let me = user("cli-cancel");
    let job_id =
        me.api.submit(&json!({"type": "demo", "params": {"items": 300, "item_ms": 100}})).await;
    let watcher = command(&me.token, &["watch", &job_id]).output();
    let watcher = tokio::spawn(watcher);
    me.api.wait_for(&job_id, "running", |j| j["status"] == "running").await;
    let cancel = run(&me.token, &["cancel", &job_id, "--reason", "cli test"]).await;
    assert_eq!(code(&cancel), 0);
    assert!(stdout(&cancel).contains(job_id.as_str()));
    let watched =
        tokio::time::timeout(Duration::from_secs(60), watcher).await.unwrap().unwrap().unwrap();
    assert_eq!(code(&watched), 3, "{}", stderr(&watched));
    assert!(stdout(&watched).contains(&format!("job {job_id} cancelled")), "{}", stdout(&watched));

    // Cancelling it again is the API's 409, shown from its problem.
    let again = run(&me.token, &["cancel", &job_id]).await;
    assert_eq!(code(&again), 4);
    assert!(stderr(&again).contains("(HTTP 409)"), "{}", stderr(&again));

    // A cancelled job can be retried; `--wait` on a cancelled submission exits 3 too.
    let retried = run(&me.token, &["retry", &job_id]).await;
    assert_eq!(code(&retried), 0);
    let new_id = stdout(&retried).trim().to_owned();
    assert_ne!(new_id, job_id.as_str());
    assert_eq!(me.api.get(&format!("/jobs/{new_id}")).await.json["retry_of"], job_id.as_str());
    let cancel = run(&me.token, &["cancel", &new_id]).await;
    assert_eq!(code(&cancel), 0);
    let watched = run(&me.token, &["watch", &new_id]).await;
    assert_eq!(code(&watched), 3);
}

#[tokio::test]
async fn pause_and_resume_say_what_became_of_the_job() {
    let me = user("cli-pause");
    let job_id = me
        .api
        .submit(&json!({"type": "demo", "params": {"items": 1}, "delay_seconds": 3_600}))
        .await;
    let paused = run(&me.token, &["pause", &job_id, "--reason", "cli test"]).await;
    assert_eq!(code(&paused), 0, "{}", stderr(&paused));
    assert_eq!(stdout(&paused).trim(), format!("job {job_id} paused"));
    let job = me.api.get(&format!("/jobs/{job_id}")).await.json;
    assert_eq!(
        (job["status"].as_str(), job["pause"]["reason"].as_str()),
        (Some("paused"), Some("cli test"))
    );
    let listed = run(&me.token, &["--json", "ls", "--status", "paused"]).await;
    assert_eq!(code(&listed), 0, "{}", stderr(&listed));
    assert_eq!(json_out(&listed)["jobs"][0]["job_id"], job_id.as_str());

    let resumed = run(&me.token, &["resume", &job_id]).await;
    assert_eq!(code(&resumed), 0, "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed).trim(), format!("job {job_id} resumed (status now pending)"));
    let again = run(&me.token, &["resume", &job_id]).await;
    assert_eq!(code(&again), 4, "not paused: the API's 409");
    assert!(stderr(&again).contains("(HTTP 409)"), "{}", stderr(&again));
    assert_eq!(code(&run(&me.token, &["cancel", &job_id]).await), 0);
}

#[tokio::test]
async fn signal_sends_what_a_waiting_job_waits_for() {
    let me = user("cli-signal");
    let job_id = me
        .api
        .submit(&json!({"type": "demo", "params": {"items": 3, "wait_for":
            {"signal": "approval", "at_item": 1, "timeout_seconds": 3_600}}}))
        .await;
    me.api.wait_for(&job_id, "waiting", |j| j["status"] == "paused").await;
    let sent =
        run(&me.token, &["signal", &job_id, "approval", "--payload", r#"{"ok": true}"#]).await;
    assert_eq!(code(&sent), 0, "{}", stderr(&sent));
    assert_eq!(stdout(&sent).trim(), format!("signal approval sent: job {job_id} resumes"));
    let bad = run(&me.token, &["signal", &job_id, "approval", "--payload", "{nope"]).await;
    assert_eq!(code(&bad), 2, "a usage error: {}", stderr(&bad));
    let done = me.api.wait_terminal(&job_id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "succeeded", "{done}");
}

#[tokio::test]
async fn api_errors_exit_4_showing_the_problem() {
    let bad = run("not-a-token", &["status", "0190d2a4-0000-7000-8000-000000000000"]).await;
    assert_eq!(code(&bad), 4);
    assert!(stderr(&bad).contains("error: Unauthorized (HTTP 401)"), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("LONGHAUL_TOKEN"));
    let bad = run("not-a-token", &["--json", "ls"]).await;
    assert_eq!(code(&bad), 4);
    assert_eq!(json_out(&bad)["error"]["title"], "Unauthorized");
    assert_eq!(json_out(&bad)["error"]["status"], 401);

    let me = user("cli-errors");
    let missing = run(&me.token, &["status", "0190d2a4-0000-7000-8000-000000000000"]).await;
    assert_eq!(code(&missing), 4);
    assert!(stderr(&missing).contains("(HTTP 404)"), "{}", stderr(&missing));
    let unknown = run(&me.token, &["submit", "no_such_type"]).await;
    assert_eq!(code(&unknown), 4);
    assert!(stderr(&unknown).contains("(HTTP 422)"), "{}", stderr(&unknown));
    assert!(!stderr(&unknown).contains('{'), "never a raw body: {}", stderr(&unknown));

    // The result of a job that has not succeeded: 409, from its problem.
    let job_id =
        me.api.submit(&json!({"type": "demo", "params": {"items": 50, "item_ms": 100}})).await;
    let early = run(&me.token, &["result", &job_id, "-o", "/dev/null"]).await;
    assert_eq!(code(&early), 4);
    assert!(stderr(&early).contains("(HTTP 409)"), "{}", stderr(&early));
    assert_eq!(code(&run(&me.token, &["cancel", &job_id]).await), 0);
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let me = user("cli-usage");
    for args in [
        &["submit"][..],
        &["submit", "demo", "--priority", "urgent"],
        &["submit", "demo", "--params", "{not json"],
        &["submit", "demo", "--params", "@/no/such/file.json"],
        &["upload", "/no/such/file.csv"],
        &["frobnicate"],
    ] {
        let output = run(&me.token, args).await;
        assert_eq!(code(&output), 2, "{args:?}: {}", stderr(&output));
    }
    let no_token = run("", &["ls"]).await;
    assert_eq!(code(&no_token), 2);
    assert!(stderr(&no_token).contains("LONGHAUL_TOKEN"));
}

#[tokio::test]
async fn upload_then_run_a_job_on_it_and_download_the_result() {
    let me = user("cli-upload");
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sales.csv");
    std::fs::write(&csv, "region,amount\neu,1\nus,2\neu,3\n").unwrap();
    let uploaded = run(&me.token, &["upload", csv.to_str().unwrap()]).await;
    assert_eq!(code(&uploaded), 0);
    let input = stdout(&uploaded).trim().to_owned();
    assert!(!input.is_empty());
    let params = json!({"input": input, "group_by": ["region"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}]})
    .to_string();
    let submitted =
        run(&me.token, &["--json", "submit", "csv_report", "--params", &params, "--wait"]).await;
    assert_eq!(code(&submitted), 0);
    let job_id: longhaul_tests::JobId =
        json_out(&submitted)["job_id"].as_str().unwrap().parse().unwrap();

    let file = dir.path().join("report.json");
    let got = run(&me.token, &["result", &job_id, "-o", file.to_str().unwrap()]).await;
    assert_eq!(code(&got), 0);
    let written = std::fs::read(&file).unwrap();
    assert_eq!(written, me.api.result(&job_id).await, "the file holds the result's bytes");
    assert!(stdout(&got).contains(&format!("wrote {} bytes", written.len())));
    // Without -o the bytes go to stdout.
    let piped = run(&me.token, &["result", &job_id]).await;
    assert_eq!((code(&piped), piped.stdout), (0, written));

    let doc = run(&me.token, &["--json", "upload", csv.to_str().unwrap()]).await;
    assert_eq!(code(&doc), 0);
    assert_eq!(json_out(&doc)["size_bytes"], std::fs::metadata(&csv).unwrap().len());

    // Once expired (written directly, as the expirer would), the result is a clear 410.
    Aws::new().await.mark_expired(&job_id).await;
    let gone = run(&me.token, &["result", &job_id, "-o", file.to_str().unwrap()]).await;
    assert_eq!(code(&gone), 4);
    assert!(stderr(&gone).contains("(HTTP 410)"), "{}", stderr(&gone));
    assert!(stderr(&gone).contains("hint: the result is gone"), "{}", stderr(&gone));
}

#[tokio::test]
async fn read_commands_print_json_for_scripts() {
    let me = user("cli-json");
    let first = me.api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    let second = me.api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    me.api.wait_terminal(&first, Duration::from_secs(60)).await;

    let ls = json_out(&run(&me.token, &["--json", "ls"]).await);
    let ids: Vec<&str> =
        ls["jobs"].as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [second.as_str(), first.as_str()], "newest first");
    // --limit 1 pages: one job and a cursor; --all follows it.
    let one = json_out(&run(&me.token, &["--json", "ls", "--type", "demo", "--limit", "1"]).await);
    assert_eq!(one["jobs"].as_array().unwrap().len(), 1);
    assert!(one["next_cursor"].is_string());
    let all = json_out(&run(&me.token, &["--json", "ls", "--all", "--type", "demo"]).await);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 2);
    let text = run(&me.token, &["ls", "--status", "succeeded"]).await;
    assert!(stdout(&text).starts_with("ID "), "{}", stdout(&text));
    assert!(stdout(&text).contains(first.as_str()));

    let status = json_out(&run(&me.token, &["--json", "status", &first]).await);
    assert_eq!(
        (status["job_id"].as_str(), status["status"].as_str()),
        (Some(first.as_str()), Some("succeeded"))
    );
    let text = run(&me.token, &["status", &first]).await;
    assert!(stdout(&text).contains("status:    succeeded"), "{}", stdout(&text));

    let types = json_out(&run(&me.token, &["--json", "job-types"]).await);
    assert!(types["job_types"].as_array().unwrap().iter().any(|t| t["type"] == "demo"));
    assert!(stdout(&run(&me.token, &["job-types"]).await).contains("demo"));

    let deliveries = json_out(&run(&me.token, &["--json", "deliveries", &first]).await);
    assert_eq!(deliveries["deliveries"], json!([]));
    assert!(
        stdout(&run(&me.token, &["deliveries", &first]).await).contains("no webhook deliveries")
    );
}

#[tokio::test]
async fn watch_in_a_terminal_draws_the_bar_to_100_percent() {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};

    let me = user("cli-pty");
    // Its start is delayed, so that watch (started next) connects while the job is still
    // pending: a loaded machine may take a while to start a process, never eight seconds.
    let job_id = me
        .api
        .submit(
            &json!({"type": "demo", "params": {"items": 20, "item_ms": 100}, "delay_seconds": 8}),
        )
        .await;
    let live = me.api.get(&format!("/jobs/{job_id}")).await.json;
    assert!(live["events_url"].is_string(), "a live job links its stream: {live}");
    let pty = native_pty_system();
    let pair = pty
        .openpty(PtySize { rows: 24, cols: 160, pixel_width: 0, pixel_height: 0 })
        .expect("a pseudo-terminal");
    let mut cmd = CommandBuilder::new(BIN);
    cmd.args(["watch", "--verbose", &job_id]);
    cmd.env("LONGHAUL_API", &stack().stack.api_url);
    cmd.env("LONGHAUL_TOKEN", &me.token);
    cmd.env("TERM", "xterm-256color");
    let mut child = pair.slave.spawn_command(cmd).expect("watch started");
    // Only the child holds the terminal's slave end now: reading ends when it exits.
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().expect("a reader");
    let screen = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf) {
                // EIO once the child closed the terminal: the end of its output.
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        seen
    });
    let screen =
        tokio::time::timeout(Duration::from_secs(90), screen).await.expect("watch ended").unwrap();
    let status = child.wait().expect("exit status");
    drop(pair.master);
    let screen = String::from_utf8_lossy(&screen);
    eprintln!("{screen}");
    assert!(status.success(), "{status:?}");
    assert!(screen.contains("/20 items"), "the bar shows items: {screen}");
    assert!(screen.contains("100%"), "the bar reached 100%: {screen}");
    assert!(screen.contains(&format!("job {job_id} succeeded")), "{screen}");
    // The live job's stream fed the bar; watch never polled.
    assert!(screen.contains("live stream: connecting (from the start)"), "{screen}");
    assert!(screen.contains("live stream: the job ended"), "{screen}");
    assert!(!screen.contains("polling"), "the live stream served it: {screen}");
}

#[tokio::test]
async fn watch_falls_back_to_polling_when_the_stream_is_refused() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let me = user("cli-poll");
    // A job that runs until the test cancels it: what watch sees does not depend on how fast
    // the machine is.
    let job_id =
        me.api.submit(&json!({"type": "demo", "params": {"items": 3000, "item_ms": 100}})).await;
    let live = me.api.get(&format!("/jobs/{job_id}")).await.json;
    let url = live["events_url"].as_str().expect("a live job links its stream").to_owned();
    // Hold every stream slot of the job (LONGHAUL_MAX_STREAMS_PER_JOB, 5): the next is a 429.
    let mut held = Vec::new();
    for _ in 0..5 {
        let stream = reqwest::get(&url).await.unwrap();
        assert_eq!(stream.status(), 200);
        held.push(stream);
    }
    let mut watcher = command(&me.token, &["watch", "-v", &job_id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("longhaul runs");
    let mut lines = BufReader::new(watcher.stderr.take().unwrap()).lines();
    let mut note = String::new();
    // Until watch has fallen back and polled once (a deadline only against a hang).
    let polled = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            note.push_str(&line);
            note.push('\n');
            if line.contains("polling: next in ") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(polled, Ok(true)), "watch fell back to polling: {note}");
    let cancel = me.api.post_json(&format!("/jobs/{job_id}/cancel"), &json!({})).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    while let Some(line) = lines.next_line().await.unwrap() {
        note.push_str(&line);
        note.push('\n');
    }
    let watched = tokio::time::timeout(Duration::from_secs(120), watcher.wait_with_output())
        .await
        .expect("watch ends once the job does")
        .unwrap();
    assert_eq!(code(&watched), 3, "a cancelled job: {note}");
    assert!(stdout(&watched).contains(&format!("job {job_id} cancelled")), "{note}");
    assert!(note.contains("live stream unavailable") && note.contains("(HTTP 429)"), "{note}");
    assert!(note.contains("polling instead"), "{note}");
    // At the pace the status answers ask for (`Retry-After`), never faster than a second.
    assert!(!note.contains("polling: next in 0s"), "{note}");
    drop(held);
}

#[tokio::test]
async fn watch_rides_out_an_unreachable_api_then_gives_up_with_4() {
    let me = user("cli-down");
    // Nothing listens on port 9 of loopback (discard, never served here).
    let down = run(&me.token, &["--api", "http://127.0.0.1:9", "watch", "some-job"]).await;
    assert_eq!(code(&down), 4);
    let note = stderr(&down);
    assert_eq!(note.matches("trying again in 2s").count(), 5, "{note}");
    assert!(note.contains("error: GET /jobs/some-job: error sending request"), "{note}");
    // Other commands report it at once.
    let ls = run(&me.token, &["--api", "http://127.0.0.1:9", "ls"]).await;
    assert_eq!(code(&ls), 4);
    assert!(!stderr(&ls).contains("trying again"));
}

/// A cron expression that fires once a year (02:00 on January 1st): no tick of its own comes
/// while a test runs, only the ones the test triggers.
const YEARLY: &str = "cron(0 2 1 1 ? *)";

/// Creates a schedule with `longhaul schedule create args…` and returns its id.
async fn create_schedule(token: &str, args: &[&str]) -> String {
    create(token, "schedule", args).await
}

/// Runs `longhaul <noun> create args…`, which prints the new id on stdout and says
/// `<noun> <id> created: …` on stderr; returns the id.
async fn create(token: &str, noun: &str, args: &[&str]) -> String {
    let mut line = vec![noun, "create"];
    line.extend_from_slice(args);
    let created = run(token, &line).await;
    assert_eq!(code(&created), 0, "{}", stderr(&created));
    let id = stdout(&created).trim().to_owned();
    assert!(stderr(&created).contains(&format!("{noun} {id} created: ")), "{}", stderr(&created));
    id
}

/// The ids of `longhaul ls --schedule id`'s jobs, once there are at least `count` (a
/// triggered tick becomes a job a moment after the trigger's answer).
async fn schedule_jobs(token: &str, id: &str, count: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = run(token, &["--json", "ls", "--schedule", id]).await;
        assert_eq!(code(&listed), 0);
        let jobs = json_out(&listed)["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.len() >= count {
            return jobs;
        }
        assert!(std::time::Instant::now() < deadline, "{count} jobs of schedule {id}: {jobs:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn schedule_commands_create_list_show_pause_resume_trigger_and_remove() {
    let me = user("cli-schedules");
    let params = r#"{"items": 2, "item_ms": 1}"#;
    let nightly = create_schedule(
        &me.token,
        &[
            "--type",
            "demo",
            "--params",
            params,
            "--schedule",
            YEARLY,
            "--timezone",
            "Europe/Paris",
            "--overlap",
            "allow",
            "--priority",
            "low",
            "--pause-on-failure",
        ],
    )
    .await;
    let stored = me.api.get(&format!("/schedules/{nightly}")).await;
    assert_eq!(stored.status, 200, "{}", stored.text);
    let spec = &stored.json;
    assert_eq!(
        (&spec["type"], &spec["params"], &spec["schedule"], &spec["timezone"]),
        (
            &json!("demo"),
            &json!({"items": 2, "item_ms": 1}),
            &json!(YEARLY),
            &json!("Europe/Paris")
        )
    );
    assert_eq!((&spec["overlap"], &spec["priority"]), (&json!("allow"), &json!("low")));
    assert_eq!((&spec["pause_on_failure"], &spec["state"]), (&json!(true), &json!("enabled")));
    assert!(spec["next_fire_at"].is_string(), "{spec}");

    // --paused, a window and a callback, from params in a file; --json prints the schedule.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.json");
    std::fs::write(&file, r#"{"items": 1}"#).unwrap();
    let at_file = format!("@{}", file.display());
    let windowed = run(
        &me.token,
        &[
            "--json",
            "schedule",
            "create",
            "--type",
            "demo",
            "--params",
            &at_file,
            "--schedule",
            "rate(2 hours)",
            "--paused",
            "--start-at",
            "2030-01-01T00:00:00Z",
            "--end-at",
            "2031-01-01T00:00:00Z",
            "--callback-url",
            "http://127.0.0.1:9/hooks/longhaul",
        ],
    )
    .await;
    assert_eq!(code(&windowed), 0, "{}", stderr(&windowed));
    let windowed = json_out(&windowed);
    let paused_id = windowed["schedule_id"].as_str().unwrap().to_owned();
    assert_eq!((&windowed["state"], &windowed["next_fire_at"]), (&json!("paused"), &Value::Null));
    assert_eq!(windowed["params"], json!({"items": 1}));
    assert_eq!(windowed["start_at"], "2030-01-01T00:00:00.000Z", "{windowed}");
    assert_eq!(windowed["callback_url"], "http://127.0.0.1:9/hooks/longhaul", "{windowed}");

    // ls: a table, or pages of JSON (oldest first).
    let table = run(&me.token, &["schedule", "ls"]).await;
    assert_eq!(code(&table), 0);
    let text = stdout(&table);
    assert!(text.starts_with("ID "), "{text}");
    assert!(text.contains(&nightly) && text.contains(&paused_id), "{text}");
    assert!(text.contains("Europe/Paris") && text.contains("paused"), "{text}");
    let one = json_out(&run(&me.token, &["--json", "schedule", "ls", "--limit", "1"]).await);
    assert_eq!(one["schedules"].as_array().unwrap().len(), 1, "{one}");
    assert!(one["next_cursor"].is_string(), "{one}");
    let all = json_out(&run(&me.token, &["--json", "schedule", "ls", "--all"]).await);
    let ids: Vec<&str> = all["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["schedule_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{all}");
    assert!(ids.contains(&nightly.as_str()) && ids.contains(&paused_id.as_str()), "{all}");

    // show: the spec, its state, next and last fire, counts, and (no) jobs.
    let shown = run(&me.token, &["schedule", "show", &nightly]).await;
    assert_eq!(code(&shown), 0);
    let text = stdout(&shown);
    for line in [
        format!("schedule:   {nightly}"),
        format!("expression: {YEARLY}"),
        "timezone:   Europe/Paris".into(),
        "state:      enabled".into(),
        "last fire:  - (never fired)".into(),
        "counts:     fired 0 · submitted 0 · skipped 0 · refused 0".into(),
        "no jobs yet".into(),
    ] {
        assert!(text.contains(&line), "{line:?} in\n{text}");
    }
    assert!(text.contains("next fire:  20"), "{text}");

    // pause (with a reason) and resume.
    let paused = run(&me.token, &["schedule", "pause", &nightly, "--reason", "maintenance"]).await;
    assert_eq!(code(&paused), 0);
    assert_eq!(stdout(&paused).trim(), format!("schedule {nightly} paused (maintenance)"));
    let view = me.api.get(&format!("/schedules/{nightly}")).await.json;
    assert_eq!((&view["state"], &view["paused_reason"]), (&json!("paused"), &json!("maintenance")));
    let text = stdout(&run(&me.token, &["schedule", "show", &nightly]).await);
    assert!(text.contains("state:      paused (maintenance)"), "{text}");
    assert!(text.contains("next fire:  - (paused)"), "{text}");

    // A trigger fires even while paused: it prints the tick and how to follow its job.
    let fired = run(&me.token, &["schedule", "trigger", &nightly]).await;
    assert_eq!(code(&fired), 0, "{}", stderr(&fired));
    let text = stdout(&fired);
    assert!(text.contains(&format!("schedule {nightly}: tick 20")), "{text}");
    assert!(text.contains(&format!("longhaul ls --schedule {nightly}")), "{text}");
    let jobs = schedule_jobs(&me.token, &nightly, 1).await;
    let first = jobs[0]["job_id"].as_str().unwrap().to_owned();
    let job = me.api.get(&format!("/jobs/{first}")).await.json;
    assert_eq!((&job["schedule_id"], &job["priority"]), (&json!(nightly), &json!("low")), "{job}");
    let status = stdout(&run(&me.token, &["status", &first]).await);
    assert!(status.contains(&format!("schedule:  {nightly} (tick 20")), "{status}");

    let resumed = run(&me.token, &["--json", "schedule", "resume", &nightly]).await;
    assert_eq!(code(&resumed), 0);
    let resumed = json_out(&resumed);
    assert_eq!(resumed["state"], "enabled", "{resumed}");
    assert!(resumed["next_fire_at"].is_string() && resumed.get("paused_reason").is_none());
    let text = stdout(&run(&me.token, &["schedule", "resume", &nightly]).await);
    assert!(
        text.contains(&format!("schedule {nightly} resumed: {YEARLY} in Europe/Paris, next at 20")),
        "{text}"
    );

    // trigger --wait follows the tick's job to its end (overlap allow: submitted even if the
    // first job still runs), and exits with its code.
    let waited = run(&me.token, &["schedule", "trigger", "--wait", &nightly]).await;
    assert_eq!(code(&waited), 0, "{}", stderr(&waited));
    assert!(stderr(&waited).contains("submitted job "), "{}", stderr(&waited));
    let second = stderr(&waited).split("submitted job ").nth(1).unwrap().trim().to_owned();
    assert_ne!(second, first);
    assert_eq!(stdout(&waited).trim(), format!("job {second} succeeded"));

    // show now has both jobs, newest first, and the last fire names the second.
    me.api.wait_terminal(&first.parse().unwrap(), Duration::from_secs(60)).await;
    let shown = json_out(&run(&me.token, &["--json", "schedule", "show", &nightly]).await);
    assert_eq!(shown["last_fire"]["job_id"], second.as_str(), "{shown}");
    assert_eq!(shown["last_fire"]["outcome"], "submitted", "{shown}");
    assert_eq!(shown["counts"]["fired"], 2, "{shown}");
    assert_eq!(shown["counts"]["submitted"], 2, "{shown}");
    let recent: Vec<&str> = shown["recent_jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(recent, [second.as_str(), first.as_str()], "{shown}");
    let text = stdout(&run(&me.token, &["schedule", "show", &nightly]).await);
    assert!(text.contains("recent jobs:\nID ") && text.contains(&first), "{text}");
    assert!(text.contains(&format!("submitted: job {second}")), "{text}");
    assert!(text.contains("counts:     fired 2 · submitted 2 · skipped 0 · refused 0"), "{text}");

    // rm: gone (its jobs stay).
    let removed = run(&me.token, &["schedule", "rm", &nightly]).await;
    assert_eq!(code(&removed), 0);
    assert!(stdout(&removed).contains(&format!("schedule {nightly} deleted")));
    assert_eq!(me.api.get(&format!("/schedules/{nightly}")).await.status, 404);
    assert_eq!(me.api.get(&format!("/jobs/{first}")).await.status, 200);
    let removed = json_out(&run(&me.token, &["--json", "schedule", "rm", &paused_id]).await);
    assert_eq!(removed, json!({"schedule_id": paused_id, "deleted": true}));
    let none = run(&me.token, &["schedule", "ls"]).await;
    assert_eq!(stdout(&none).trim(), "no schedules");
}

#[tokio::test]
async fn schedule_errors_show_the_problem_and_exit_non_zero() {
    let me = user("cli-schedule-errors");
    // A bad expression: the API's 422 problem, nothing created.
    let bad =
        run(&me.token, &["schedule", "create", "--type", "demo", "--schedule", "cron(0 2 * * *)"])
            .await;
    assert_eq!(code(&bad), 4);
    let said = stderr(&bad);
    assert!(said.contains("error: Invalid schedule expression (HTTP 422): "), "{said}");
    assert!(!said.contains('{'), "never a raw body: {said}");
    let bad = run(
        &me.token,
        &["--json", "schedule", "create", "--type", "demo", "--schedule", "rate(30 seconds)"],
    )
    .await;
    assert_eq!(code(&bad), 4);
    let problem = &json_out(&bad)["error"];
    assert_eq!(problem["status"], 422, "{problem}");
    assert!(problem["type"].as_str().unwrap().ends_with("invalid-schedule"), "{problem}");
    for (flag, value, kind) in [
        ("--timezone", "Mars/Olympus_Mons", "invalid-timezone"),
        ("--params", r#"{"items": 0}"#, "invalid-params"),
        ("--end-at", "yesterday", "invalid-window"),
    ] {
        let refused = run(
            &me.token,
            &["--json", "schedule", "create", "--type", "demo", "--schedule", YEARLY, flag, value],
        )
        .await;
        assert_eq!(code(&refused), 4, "{flag} {value}");
        let problem = &json_out(&refused)["error"];
        assert_eq!(problem["status"], 422, "{problem}");
        assert!(problem["type"].as_str().unwrap().ends_with(kind), "{kind}: {problem}");
    }
    let unknown =
        run(&me.token, &["schedule", "create", "--type", "no_such_type", "--schedule", YEARLY])
            .await;
    assert_eq!(code(&unknown), 4);
    assert!(stderr(&unknown).contains("(HTTP 422)"), "{}", stderr(&unknown));
    let listed = json_out(&run(&me.token, &["--json", "schedule", "ls"]).await);
    assert_eq!(listed["schedules"], json!([]), "nothing was created: {listed}");

    // Usage errors exit 2 before any request.
    for args in [
        &["schedule", "create", "--type", "demo"][..],
        &["schedule", "create", "--schedule", YEARLY],
        &["schedule", "create", "--type", "demo", "--schedule", YEARLY, "--params", "{not json"],
        &["schedule", "create", "--type", "demo", "--schedule", YEARLY, "--overlap", "never"],
        &["schedule", "pause"],
        &["schedule", "frobnicate", "x"],
    ] {
        let output = run(&me.token, args).await;
        assert_eq!(code(&output), 2, "{args:?}: {}", stderr(&output));
    }

    // Another principal's schedule, or none: 404 for every command naming one.
    let other = user("cli-schedule-other");
    let theirs = create_schedule(
        &other.token,
        &["--type", "demo", "--params", r#"{"items": 1}"#, "--schedule", YEARLY],
    )
    .await;
    for command in ["show", "pause", "resume", "trigger", "rm"] {
        for id in [theirs.as_str(), "0190d2a4-0000-7000-8000-000000000000"] {
            let output = run(&me.token, &["schedule", command, id]).await;
            assert_eq!(code(&output), 4, "{command} {id}");
            assert!(stderr(&output).contains("(HTTP 404)"), "{command}: {}", stderr(&output));
        }
    }
    assert_eq!(other.api.get(&format!("/schedules/{theirs}")).await.json["state"], "enabled");

    // A tick that submits nothing: trigger --wait says why and exits 4. With overlap skip, a
    // tick while the schedule's job runs is skipped.
    let id = create_schedule(
        &me.token,
        &["--type", "demo", "--params", r#"{"items": 3000, "item_ms": 100}"#, "--schedule", YEARLY],
    )
    .await;
    let fired = me.api.post_json(&format!("/schedules/{id}/trigger"), &json!({})).await;
    assert_eq!(fired.status, 202, "{}", fired.text);
    let job = schedule_jobs(&me.token, &id, 1).await[0]["job_id"].as_str().unwrap().to_owned();
    let skipped = run(&me.token, &["schedule", "trigger", "--wait", &id]).await;
    assert_eq!(code(&skipped), 4, "{}", stderr(&skipped));
    let said = stderr(&skipped);
    assert!(said.contains(&format!("schedule {id}: tick 20")), "{said}");
    assert!(said.contains(&format!("was skipped: job {job} is still ")), "{said}");
    let cancel = me.api.post_json(&format!("/jobs/{job}/cancel"), &json!({})).await;
    assert_eq!(cancel.status, 202, "{}", cancel.text);
    let shown = stdout(&run(&me.token, &["schedule", "show", &id]).await);
    assert!(shown.contains("counts:     fired 2 · submitted 1 · skipped 1 · refused 0"), "{shown}");
}

/// A local partner for the endpoint tests: answers every request with the status it is set
/// to, and records each request's `webhook-id` with the status it was answered.
struct Receiver {
    url: String,
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
    received: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
}

impl Receiver {
    /// Listens on loopback (the stack allows insecure callbacks), answering `status`.
    async fn start(status: u16) -> Receiver {
        use std::sync::atomic::AtomicU16;
        use std::sync::{Arc, Mutex};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let receiver = Receiver {
            url,
            status: Arc::new(AtomicU16::new(status)),
            received: Arc::new(Mutex::new(Vec::new())),
        };
        let (answer, received) = (receiver.status.clone(), receiver.received.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(Receiver::answer(socket, answer.clone(), received.clone()));
            }
        });
        receiver
    }

    /// Reads one request (its head, then `content-length` bytes of body) and answers it.
    async fn answer(
        mut socket: tokio::net::TcpStream,
        status: std::sync::Arc<std::sync::atomic::AtomicU16>,
        received: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        };
        let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|line| line.strip_prefix(&format!("{name}:")))
                .map(|value| value.trim().to_owned())
        };
        let length: usize = header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        while request.len() < head_end + length {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let code = status.load(std::sync::atomic::Ordering::SeqCst);
        received.lock().unwrap().push((header("webhook-id").unwrap_or_default(), code));
        let answer =
            format!("HTTP/1.1 {code} Set\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        if let Err(err) = socket.write_all(answer.as_bytes()).await {
            eprintln!("receiver: answering failed: {err}");
        }
    }

    fn answer_with(&self, status: u16) {
        self.status.store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many requests carrying `webhook_id` were answered `status`.
    fn count(&self, webhook_id: &str, status: u16) -> usize {
        let received = self.received.lock().unwrap();
        received.iter().filter(|(id, code)| id == webhook_id && *code == status).count()
    }
}

/// Creates an endpoint with `longhaul endpoint create args…` and returns its id.
async fn create_endpoint(token: &str, args: &[&str]) -> String {
    create(token, "endpoint", args).await
}

/// `longhaul --json endpoint deliveries id --all` (with `--status status`) once `check`
/// holds for its deliveries; panics after a minute, naming `what` it waited for.
async fn endpoint_deliveries(
    token: &str,
    id: &str,
    status: &str,
    what: &str,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed =
            run(token, &["--json", "endpoint", "deliveries", id, "--all", "--status", status])
                .await;
        assert_eq!(code(&listed), 0, "{}", stderr(&listed));
        let deliveries = json_out(&listed)["deliveries"].as_array().cloned().unwrap_or_default();
        if check(&deliveries) {
            return deliveries;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {deliveries:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn endpoint_commands_create_list_get_update_and_remove() {
    let me = user("cli-endpoints");
    // Nothing listens on port 9 of loopback; no job is submitted, so nothing is sent there.
    let url = "http://127.0.0.1:9/hooks/billing";
    let billing = create_endpoint(
        &me.token,
        &["--url", url, "--events", "job.succeeded,job.failed", "--description", "billing"],
    )
    .await;
    let stored = me.api.get(&format!("/webhooks/endpoints/{billing}")).await;
    assert_eq!(stored.status, 200, "{}", stored.text);
    let spec = &stored.json;
    assert_eq!((&spec["url"], &spec["description"]), (&json!(url), &json!("billing")));
    assert_eq!(spec["events"], json!(["job.failed", "job.succeeded"]), "{spec}");
    assert_eq!(spec["status"], "enabled", "{spec}");

    // --json prints the endpoint; --events may be repeated.
    let ops = run(
        &me.token,
        &[
            "--json",
            "endpoint",
            "create",
            "--url",
            "http://127.0.0.1:9/hooks/ops",
            "--events",
            "job.cancelled",
            "--events",
            "job.progress",
        ],
    )
    .await;
    assert_eq!(code(&ops), 0, "{}", stderr(&ops));
    let ops = json_out(&ops);
    let ops_id = ops["endpoint_id"].as_str().unwrap().to_owned();
    assert_eq!(ops["events"], json!(["job.cancelled", "job.progress"]), "{ops}");
    assert!(ops.get("description").is_none(), "{ops}");

    // ls: a table, or the API's document.
    let table = run(&me.token, &["endpoint", "ls"]).await;
    assert_eq!(code(&table), 0);
    let text = stdout(&table);
    assert!(text.starts_with("ID "), "{text}");
    for part in [billing.as_str(), ops_id.as_str(), url, "job.failed,job.succeeded", "enabled"] {
        assert!(text.contains(part), "{part:?} in\n{text}");
    }
    let listed = json_out(&run(&me.token, &["--json", "endpoint", "list"]).await);
    let mut ids: Vec<&str> = listed["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut expected = [billing.as_str(), ops_id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected, "{listed}");

    // get: the endpoint's JSON, with or without --json.
    for line in [&["endpoint", "get", &billing][..], &["--json", "endpoint", "show", &billing]] {
        let got = run(&me.token, line).await;
        assert_eq!(code(&got), 0);
        assert_eq!(json_out(&got), stored.json, "{line:?}");
    }

    // update: only what is named changes; --no-description removes it.
    let updated = run(
        &me.token,
        &["endpoint", "update", &billing, "--events", "job.failed", "--no-description"],
    )
    .await;
    assert_eq!(code(&updated), 0, "{}", stderr(&updated));
    assert_eq!(stdout(&updated).trim(), format!("endpoint {billing} updated: job.failed → {url}"));
    let view = me.api.get(&format!("/webhooks/endpoints/{billing}")).await.json;
    assert_eq!((&view["events"], &view["url"]), (&json!(["job.failed"]), &json!(url)), "{view}");
    assert!(view.get("description").is_none(), "{view}");
    let moved = "http://127.0.0.1:9/hooks/billing-v2";
    let updated = run(
        &me.token,
        &["--json", "endpoint", "update", &billing, "--url", moved, "--description", "v2"],
    )
    .await;
    assert_eq!(code(&updated), 0, "{}", stderr(&updated));
    let updated = json_out(&updated);
    assert_eq!((&updated["url"], &updated["description"]), (&json!(moved), &json!("v2")));
    assert_eq!(updated["events"], json!(["job.failed"]), "{updated}");

    // enable on an enabled endpoint changes nothing and says so.
    let enabled = run(&me.token, &["endpoint", "enable", &ops_id]).await;
    assert_eq!(code(&enabled), 0, "{}", stderr(&enabled));
    assert_eq!(stdout(&enabled).trim(), format!("endpoint {ops_id} is enabled (it was already)"));

    // Nothing was sent: no deliveries.
    let none = run(&me.token, &["endpoint", "deliveries", &billing]).await;
    assert_eq!(code(&none), 0, "{}", stderr(&none));
    assert_eq!(stdout(&none).trim(), format!("endpoint {billing}: no deliveries"));
    let none = json_out(&run(&me.token, &["--json", "endpoint", "deliveries", &billing]).await);
    assert_eq!(none, json!({"deliveries": [], "next_cursor": null}));

    // rm: gone.
    let removed = run(&me.token, &["endpoint", "rm", &billing]).await;
    assert_eq!(code(&removed), 0, "{}", stderr(&removed));
    assert_eq!(stdout(&removed).trim(), format!("endpoint {billing} deleted"));
    assert_eq!(me.api.get(&format!("/webhooks/endpoints/{billing}")).await.status, 404);
    let removed = json_out(&run(&me.token, &["--json", "endpoint", "delete", &ops_id]).await);
    assert_eq!(removed, json!({"endpoint_id": ops_id, "deleted": true}));
    let none = run(&me.token, &["endpoint", "ls"]).await;
    assert_eq!(stdout(&none).trim(), "no webhook endpoints");
}

#[tokio::test]
async fn endpoint_errors_show_the_problem_and_exit_non_zero() {
    let me = user("cli-endpoint-errors");
    // A URL the API refuses: its 422 problem, nothing created.
    let bad = run(
        &me.token,
        &["endpoint", "create", "--url", "ftp://127.0.0.1/hook", "--events", "job.failed"],
    )
    .await;
    assert_eq!(code(&bad), 4);
    let said = stderr(&bad);
    assert!(said.contains("error: Invalid endpoint (HTTP 422): "), "{said}");
    assert!(!said.contains('{'), "never a raw body: {said}");
    let bad = run(
        &me.token,
        &["--json", "endpoint", "create", "--url", "not a url", "--events", "job.failed"],
    )
    .await;
    assert_eq!(code(&bad), 4);
    let problem = &json_out(&bad)["error"];
    assert_eq!(problem["status"], 422, "{problem}");
    assert!(problem["type"].as_str().unwrap().ends_with("invalid-endpoint"), "{problem}");
    let listed = json_out(&run(&me.token, &["--json", "endpoint", "ls"]).await);
    assert_eq!(listed["endpoints"], json!([]), "nothing was created: {listed}");

    // Usage errors exit 2 before any request.
    for args in [
        &["endpoint", "create", "--url", "http://127.0.0.1:9/h"][..],
        &["endpoint", "create", "--events", "job.failed"],
        &["endpoint", "create", "--url", "http://127.0.0.1:9/h", "--events", "job.exploded"],
        &["endpoint", "update", "0190d2a4-0000-7000-8000-000000000000"],
        &["endpoint", "deliveries", "0190d2a4-0000-7000-8000-000000000000", "--status", "lost"],
        &["endpoint", "recover", "0190d2a4-0000-7000-8000-000000000000"],
        &["endpoint", "frobnicate"],
    ] {
        let output = run(&me.token, args).await;
        assert_eq!(code(&output), 2, "{args:?}: {}", stderr(&output));
    }

    // Another principal's endpoint, or none: 404 for every command naming one.
    let other = user("cli-endpoint-other");
    let theirs = create_endpoint(
        &other.token,
        &["--url", "http://127.0.0.1:9/theirs", "--events", "job.failed"],
    )
    .await;
    // A `since` the API accepts (within the record retention): the time that endpoint was
    // made.
    let since = other.api.get(&format!("/webhooks/endpoints/{theirs}")).await.json["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let since = since.as_str();
    for id in [theirs.as_str(), "0190d2a4-0000-7000-8000-000000000000"] {
        for line in [
            &["endpoint", "get", id][..],
            &["endpoint", "update", id, "--description", "mine now"],
            &["endpoint", "enable", id],
            &["endpoint", "deliveries", id],
            &["endpoint", "recover", id, "--since", since],
            &["endpoint", "rm", id],
        ] {
            let output = run(&me.token, line).await;
            assert_eq!(code(&output), 4, "{line:?}");
            assert!(stderr(&output).contains("(HTTP 404)"), "{line:?}: {}", stderr(&output));
        }
    }
    let resend = run(&me.token, &["endpoint", "resend", "msg_nothing"]).await;
    assert_eq!(code(&resend), 4);
    assert!(stderr(&resend).contains("(HTTP 404)"), "{}", stderr(&resend));
    let view = other.api.get(&format!("/webhooks/endpoints/{theirs}")).await;
    assert_eq!(view.status, 200, "{}", view.text);
    assert!(view.json.get("description").is_none(), "untouched: {}", view.text);

    // A recovery's `since` the API refuses: its 400.
    let mine =
        create_endpoint(&me.token, &["--url", "http://127.0.0.1:9/mine", "--events", "job.failed"])
            .await;
    let refused = run(&me.token, &["endpoint", "recover", &mine, "--since", "yesterday"]).await;
    assert_eq!(code(&refused), 4);
    assert!(stderr(&refused).contains("(HTTP 400)"), "{}", stderr(&refused));
}

#[tokio::test]
async fn a_gone_endpoint_is_listed_disabled_then_enabled_recovered_and_resent() {
    let me = user("cli-endpoint-deliveries");
    let receiver = Receiver::start(410).await;
    let id =
        create_endpoint(&me.token, &["--url", &receiver.url, "--events", "job.succeeded"]).await;
    let first = me.api.submit(&json!({"type": "demo", "params": {"items": 1}})).await;
    // Other params: the same request would be the first one's idempotent replay.
    let second = me.api.submit(&json!({"type": "demo", "params": {"items": 2}})).await;
    let since = me.api.wait_terminal(&first, Duration::from_secs(60)).await["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    me.api.wait_terminal(&second, Duration::from_secs(60)).await;

    // The receiver answers 410: the endpoint is disabled, and both jobs' deliveries failed
    // (the second one either answered 410 too, or was recorded failed while disabled).
    let failed =
        endpoint_deliveries(&me.token, &id, "failed", "both deliveries failed", |d| d.len() == 2)
            .await;
    let mut jobs: Vec<&str> = failed.iter().map(|d| d["job_id"].as_str().unwrap()).collect();
    jobs.sort_unstable();
    let mut expected = [first.as_str(), second.as_str()];
    expected.sort_unstable();
    assert_eq!(jobs, expected, "{failed:?}");
    let webhook_ids: Vec<String> =
        failed.iter().map(|d| d["webhook_id"].as_str().unwrap().to_owned()).collect();
    let view = me.api.get(&format!("/webhooks/endpoints/{id}")).await.json;
    assert_eq!((&view["status"], &view["disabled_reason"]), (&json!("disabled"), &json!("gone")));
    let text = stdout(&run(&me.token, &["endpoint", "ls"]).await);
    assert!(
        text.contains(&format!("disabled (gone) at {}", view["disabled_at"].as_str().unwrap()))
    );

    // The table names each delivery's webhook id, its event and the 410.
    let table = run(&me.token, &["endpoint", "deliveries", &id, "--status", "failed"]).await;
    let text = stdout(&table);
    assert!(text.starts_with("WEBHOOK ID "), "{text}");
    for webhook_id in &webhook_ids {
        assert!(text.contains(webhook_id.as_str()), "{webhook_id} in\n{text}");
    }
    assert!(text.contains("job.succeeded") && text.contains("410"), "{text}");
    // Pages: --limit 1 leaves a cursor, --all follows it.
    let one =
        json_out(&run(&me.token, &["--json", "endpoint", "deliveries", &id, "--limit", "1"]).await);
    assert_eq!(one["deliveries"].as_array().unwrap().len(), 1, "{one}");
    assert!(one["next_cursor"].is_string(), "{one}");
    let text = stdout(&run(&me.token, &["endpoint", "deliveries", &id, "--limit", "1"]).await);
    assert!(text.ends_with("(more: raise --limit or use --all)\n"), "{text}");
    let none = run(&me.token, &["endpoint", "deliveries", &id, "--status", "delivered"]).await;
    assert_eq!(stdout(&none).trim(), format!("endpoint {id}: no delivered deliveries"));

    // Nothing is queued for a disabled endpoint: resend and recover are refused.
    let refused = run(&me.token, &["endpoint", "resend", &webhook_ids[0]]).await;
    assert_eq!(code(&refused), 4);
    assert!(stderr(&refused).contains("(HTTP 409)"), "{}", stderr(&refused));
    let refused = run(&me.token, &["endpoint", "recover", &id, "--since", &since]).await;
    assert_eq!(code(&refused), 4);
    assert!(stderr(&refused).contains("(HTTP 409)"), "{}", stderr(&refused));

    // The partner is back: enable, then recover what failed.
    receiver.answer_with(200);
    let enabled = run(&me.token, &["endpoint", "enable", &id]).await;
    assert_eq!(code(&enabled), 0, "{}", stderr(&enabled));
    assert_eq!(stdout(&enabled).trim(), format!("endpoint {id} enabled"));
    let hint = stderr(&enabled);
    assert!(hint.contains("it was disabled (gone) at "), "{hint}");
    assert!(hint.contains(&format!("longhaul endpoint recover {id} --since TIME")), "{hint}");
    assert_eq!(me.api.get(&format!("/webhooks/endpoints/{id}")).await.json["status"], "enabled");
    let recovered = run(&me.token, &["endpoint", "recover", &id, "--since", &since]).await;
    assert_eq!(code(&recovered), 0, "{}", stderr(&recovered));
    assert_eq!(
        stdout(&recovered).trim(),
        format!("endpoint {id}: 2 failed deliveries since {since} queued again")
    );
    let delivered =
        endpoint_deliveries(&me.token, &id, "delivered", "both recovered deliveries", |d| {
            d.len() == 2
        })
        .await;
    for webhook_id in &webhook_ids {
        assert!(delivered.iter().any(|d| d["webhook_id"] == webhook_id.as_str()), "{delivered:?}");
        assert!(receiver.count(webhook_id, 200) >= 1, "{webhook_id}: the same webhook-id");
    }
    // Nothing failed is left to recover.
    let again =
        json_out(&run(&me.token, &["--json", "endpoint", "recover", &id, "--since", &since]).await);
    assert_eq!(again, json!({"endpoint_id": id, "since": since, "requeued": 0, "complete": true}));

    // A delivered one may be asked for again: same webhook-id.
    let resent = run(&me.token, &["endpoint", "resend", &webhook_ids[0]]).await;
    assert_eq!(code(&resent), 0, "{}", stderr(&resent));
    assert_eq!(stdout(&resent).trim(), format!("delivery {} queued again", webhook_ids[0]));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while receiver.count(&webhook_ids[0], 200) < 2 {
        assert!(std::time::Instant::now() < deadline, "the resent delivery never came");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
