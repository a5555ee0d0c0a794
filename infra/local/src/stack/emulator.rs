//! The moto server that plays the cloud: started once, outliving a crashed functions host.
//!
//! moto's Step Functions interpreter invokes Lambda at `http://localhost:$MOTO_PORT/…`, where
//! `MOTO_PORT` is *its own* environment variable: we set it to the edge's port, so task states
//! reach the functions hosted by the edge.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};

/// How the emulator process relates to this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Its own process group: survives a SIGKILL of the host so a restarted host adopts it
    /// (and with it the state of in-flight jobs). `make dev`.
    Detached,
    /// Dies with the thread that started it (tests).
    DiesWithParent,
}

/// What is recorded about a running emulator (in `.local/moto.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Its process id.
    pub pid: u32,
    /// Where it listens.
    pub port: u16,
    /// The `MOTO_PORT` it was started with (the edge port it invokes Lambda on).
    pub edge_port: u16,
}

/// A running emulator.
#[derive(Debug)]
pub struct Emulator {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its process id.
    pub pid: u32,
    record_path: Option<PathBuf>,
}

async fn healthy(client: &reqwest::Client, url: &str) -> bool {
    client
        .get(format!("{url}/moto-api/"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Starts moto on `port` (or adopts the one recorded at `state_dir/moto.json` if it is alive
/// and was started for the same ports), then enables Step Functions execution.
pub async fn ensure(
    moto_server: &Path,
    port: u16,
    edge_port: u16,
    lifetime: Lifetime,
    state_dir: Option<&Path>,
) -> anyhow::Result<Emulator> {
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let record_path = state_dir.map(|d| d.join("moto.json"));
    if let Some(path) = &record_path
        && let Ok(text) = std::fs::read_to_string(path)
        && let Ok(record) = serde_json::from_str::<Record>(&text)
        && record.port == port
        && healthy(&client, &url).await
    {
        if record.edge_port != edge_port {
            bail!(
                "the running emulator (pid {}) invokes functions on port {}, not {edge_port}; stop it with `make stop`",
                record.pid,
                record.edge_port
            );
        }
        tracing::info!(pid = record.pid, %url, "adopting the running emulator");
        configure(&client, &url).await?;
        return Ok(Emulator { url, pid: record.pid, record_path });
    }
    if healthy(&client, &url).await {
        bail!("something else already answers on {url}; set LONGHAUL_MOTO_PORT or stop it");
    }
    if !moto_server.exists() {
        bail!(
            "{} not found: run `make venv` (make dev and make test do it for you)",
            moto_server.display()
        );
    }
    let log = match state_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Stdio::from(std::fs::File::create(dir.join("moto.log"))?)
        }
        None => Stdio::null(),
    };
    let mut command = std::process::Command::new(moto_server);
    command
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .env("MOTO_PORT", edge_port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    match lifetime {
        Lifetime::Detached => {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        Lifetime::DiesWithParent => die_with_parent(&mut command)?,
    }
    let mut child =
        command.spawn().with_context(|| format!("starting {}", moto_server.display()))?;
    let pid = child.id();
    for _ in 0..300 {
        if healthy(&client, &url).await {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!("the emulator exited at start ({status}); see .local/moto.log");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !healthy(&client, &url).await {
        bail!("the emulator did not become ready on {url}");
    }
    // The child handle is dropped, not waited on: the emulator must be able to outlive us.
    drop(child);
    if let Some(path) = &record_path {
        std::fs::write(path, serde_json::to_string(&Record { pid, port, edge_port })?)?;
    }
    configure(&client, &url).await?;
    tracing::info!(pid, %url, "emulator started");
    Ok(Emulator { url, pid, record_path })
}

async fn configure(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let response = client
        .post(format!("{url}/moto-api/config"))
        .json(&serde_json::json!({ "stepfunctions": { "execute_state_machine": true } }))
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(anyhow!("configuring the emulator failed: {}", response.status()));
    }
    Ok(())
}

impl Emulator {
    /// Stops the emulator (graceful shutdown of the stack).
    pub fn stop(&self) {
        stop_pid(self.pid);
        if let Some(path) = &self.record_path {
            std::fs::remove_file(path).ok();
        }
    }
}

/// Stops the emulator recorded in `state_dir`, if any (`make stop`).
pub fn stop_recorded(state_dir: &Path) -> anyhow::Result<Option<u32>> {
    let path = state_dir.join("moto.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let record: Record = serde_json::from_str(&text)?;
    stop_pid(record.pid);
    std::fs::remove_file(&path).ok();
    Ok(Some(record.pid))
}

fn stop_pid(pid: u32) {
    // Only signal the pid if it still is a moto server: a recorded pid may have been reused.
    let is_moto = command_line(pid).is_some_and(|cmdline| cmdline.contains("moto"));
    if !is_moto {
        return;
    }
    // SAFETY: kill(2) on a process we checked is the emulator.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// Makes the process `command` starts die with the thread that starts it
/// (`PR_SET_PDEATHSIG`), so a test binary that crashes or is killed leaves no emulator behind.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut std::process::Command) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Without `PR_SET_PDEATHSIG` (Linux only), every test binary that crashed or was killed
/// would leave a moto server running, one more per run: the tests' stack refuses to start
/// rather than leak them. `make dev` keeps its emulator on purpose and runs anywhere.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut std::process::Command) -> anyhow::Result<()> {
    bail!(
        "the local stack's test mode needs Linux: its emulator must die with the test process \
         (prctl PR_SET_PDEATHSIG), which {} cannot do; `make dev` works here",
        std::env::consts::OS
    )
}

/// The command line of process `pid`, if it is running.
#[cfg(target_os = "linux")]
fn command_line(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&cmdline).into_owned())
}

/// The command line of process `pid`, if it is running.
#[cfg(not(target_os = "linux"))]
fn command_line(pid: u32) -> Option<String> {
    command_line_from_ps(pid)
}

/// Where there is no `/proc` (macOS, the BSDs): asks `ps` (POSIX `-o args=`). Compiled on
/// Linux for its unit test only.
#[cfg(any(not(target_os = "linux"), test))]
fn command_line_from_ps(pid: u32) -> Option<String> {
    let output = match std::process::Command::new("ps")
        .args(["-o", "args=", "-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(err) => {
            tracing::warn!(pid, error = %err, "cannot run ps to check the emulator's pid");
            return None;
        }
    };
    let line = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.success() && !line.is_empty()).then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ps` (the fallback outside Linux) and `/proc` agree on a running process, and both know
    /// that a finished one is gone.
    #[test]
    fn command_lines_come_from_proc_or_ps() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        // `spawn` may return while the kernel is still setting up the new program's arguments
        // (its command line reads empty for that moment), so look until both name it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (from_proc, from_ps) = (command_line(pid), command_line_from_ps(pid));
            let named =
                |line: &Option<String>| line.as_deref().is_some_and(|l| l.contains("sleep"));
            if named(&from_proc) && named(&from_ps) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{from_proc:?} {from_ps:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        assert_eq!(command_line(pid), None);
        assert_eq!(command_line_from_ps(pid), None);
    }
}
