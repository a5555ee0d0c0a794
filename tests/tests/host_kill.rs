//! SIGKILL of the functions host mid-run, then a restart: the emulator (the "cloud") lives
//! on, the restarted host adopts it, and every job still finishes, correctly. This is the
//! local stand-in for losing every Lambda sandbox at once.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use longhaul_job_demo::DemoResult;
use longhaul_local::template::Template;
use longhaul_tests::Deadline;
use serde_json::{Value, json};

const JOBS: u64 = 24;
const BUDGET: Duration = Duration::from_secs(300);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The host process and where it keeps its state; stops the emulator when dropped, so a
/// failing test leaves nothing running.
struct Host {
    child: Option<Child>,
    env: Vec<(String, String)>,
    state_dir: std::path::PathBuf,
    api: String,
}

impl Host {
    fn new() -> Self {
        let state_dir = std::env::temp_dir()
            .join(format!("longhaul-host-kill-{}", uuid::Uuid::new_v4().simple()));
        let api_port = free_port();
        let env = vec![
            ("LONGHAUL_API_PORT".to_owned(), api_port.to_string()),
            ("LONGHAUL_EDGE_PORT".to_owned(), free_port().to_string()),
            ("LONGHAUL_MOTO_PORT".to_owned(), free_port().to_string()),
            ("LONGHAUL_STATE_DIR".to_owned(), state_dir.display().to_string()),
            ("LONGHAUL_PROGRESS_INTERVAL_MS".to_owned(), "200".to_owned()),
            // A job whose stage died with the host is a zombie after this long.
            ("LONGHAUL_HEARTBEAT_TIMEOUT_SECONDS".to_owned(), "5".to_owned()),
            ("LONGHAUL_QUEUED_GRACE_SECONDS".to_owned(), "20".to_owned()),
            ("LONGHAUL_PENDING_GRACE_SECONDS".to_owned(), "10".to_owned()),
        ];
        Host { child: None, env, state_dir, api: format!("http://127.0.0.1:{api_port}") }
    }

    async fn start(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_host"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .spawn()
            .expect("starting the host");
        self.child = Some(child);
        // Up when it answers; a host that exited fails at once, one still starting is waited for.
        let deadline = Deadline::new("the host to come up", BUDGET);
        loop {
            if reqwest::get(format!("{}/_local/aws-calls", self.api))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            let exited = self.child.as_mut().expect("started").try_wait().expect("the host");
            assert!(exited.is_none(), "the host exited while starting: {exited:?}");
            deadline.tick(Duration::from_millis(100), "no answer").await;
        }
    }

    fn kill(&mut self) {
        let mut child = self.child.take().expect("a running host");
        child.kill().expect("SIGKILL"); // std's kill is SIGKILL
        child.wait().expect("reaped");
    }

    fn token(&self, principal: &str) -> String {
        let root = longhaul_tests::root();
        let template =
            Template::load(&root.join("template.yaml"), "longhaul", "", "", &Default::default())
                .unwrap();
        longhaul_local::authorizer(&template, Some(&self.state_dir)).unwrap().token(principal, 3600)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
        longhaul_local::emulator::stop_recorded(&self.state_dir).ok();
        std::fs::remove_dir_all(&self.state_dir).ok();
    }
}

async fn get(http: &reqwest::Client, token: &str, url: String) -> (u16, Value) {
    let response = http.get(url).bearer_auth(token).send().await.expect("the API answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_survive_a_sigkill_of_the_functions_host() {
    longhaul_aws::sdk::install_tls_provider();
    let mut host = Host::new();
    host.start().await;
    let token = host.token("host-kill");
    let http = reqwest::Client::new();

    let mut jobs = Vec::new();
    for i in 0..JOBS {
        let items = 20 + i % 5;
        let response = http
            .post(format!("{}/jobs", host.api))
            .bearer_auth(&token)
            .header("idempotency-key", format!("host-kill-{i}"))
            .json(&json!({"type": "demo", "params": {"items": items, "item_ms": 100}}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        let body: Value = response.json().await.unwrap();
        jobs.push((body["job_id"].as_str().unwrap().to_owned(), items));
    }

    // Kill the host while jobs are mid-run (some running with checkpoints, some queued).
    let deadline = Deadline::new("four jobs running at once", BUDGET);
    let running = loop {
        let (_, list) = get(&http, &token, format!("{}/jobs?status=running", host.api)).await;
        let running = list["jobs"].as_array().map_or(0, Vec::len);
        if running >= 4 {
            break running;
        }
        deadline.tick(Duration::from_millis(100), format!("{running} running")).await;
    };
    assert!(running >= 4, "jobs were running when the host was killed");
    host.kill();
    assert!(
        reqwest::get(format!("{}/_local/aws-calls", host.api)).await.is_err(),
        "the host is gone"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    host.start().await;

    let deadline = tokio::time::Instant::now() + BUDGET;
    for (job_id, items) in &jobs {
        let job = loop {
            let (status, job) = get(&http, &token, format!("{}/jobs/{job_id}", host.api)).await;
            assert_eq!(status, 200, "{job}");
            if matches!(
                job["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "expired")
            ) {
                break job;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job {job_id} did not finish after the restart: {job}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert_eq!(job["status"], "succeeded", "{job}");
        let redirect =
            reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let reply = redirect
            .get(format!("{}/jobs/{job_id}/result", host.api))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 303);
        let location = reply.headers()["location"].to_str().unwrap();
        // Relative to the request (a small result's link), or a URL of its own.
        let link = reply.url().join(location).unwrap();
        let result: DemoResult = reqwest::get(link).await.unwrap().json().await.unwrap();
        assert_eq!(
            result,
            DemoResult::expected(*items),
            "job {job_id}: every item processed exactly once"
        );
    }
}
