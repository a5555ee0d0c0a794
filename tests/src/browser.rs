//! A real browser for the tests that need one (the console's, the TypeScript client's):
//! Debian's headless `chromium` driven through `chromedriver`, installed with apt-get when
//! missing (a machine where they cannot be installed fails the test, saying so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `program` on `PATH`, if it is there.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|p| p.is_file())
    })
}

/// chromedriver and chromium, installed from Debian's packages when missing.
pub fn browser() -> (PathBuf, PathBuf) {
    let found = || which("chromedriver").zip(which("chromium"));
    if let Some(found) = found() {
        return found;
    }
    eprintln!("browser test: installing chromium and chromium-driver with apt-get");
    let run = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_else(|e| format!("apt-get could not run: {e}"))
    };
    let update = run(&["update", "-qq"]);
    let install = run(&["install", "-y", "-qq", "chromium", "chromium-driver"]);
    found().unwrap_or_else(|| {
        panic!(
            "the browser test needs `chromedriver` and `chromium` on PATH (Debian packages \
             chromium and chromium-driver) and could not install them:\n{update}\n{install}"
        )
    })
}

/// A chromedriver process on a free port, killed when dropped.
pub struct Driver {
    child: std::process::Child,
    /// Its WebDriver endpoint.
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Err(err) = self.child.kill() {
            eprintln!("stopping chromedriver: {err}");
        }
        if let Err(err) = self.child.wait() {
            eprintln!("reaping chromedriver: {err}");
        }
    }
}

/// Starts `chromedriver` on a free port and waits (up to 20 s) until it answers.
pub async fn start_driver(chromedriver: &Path) -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", chromedriver.display()));
    let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if reqwest::get(format!("{}/status", driver.url)).await.is_ok_and(|r| r.status() == 200) {
            return driver;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not answer on {}", driver.url);
}
