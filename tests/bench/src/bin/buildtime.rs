//! Build time: `make build` (what `sam build` runs: cargo-lambda and zig, arm64, the
//! workspace release profile) from a clean checkout of the current commit.
//!
//! 1. Clones the workspace's `HEAD` into a scratch directory (committed state only; a dirty
//!    tree is measured as its last commit), so there is no target directory and no SAM cache.
//! 2. Installs the build tools into the project virtualenv first, untimed
//!    (`make build-tools VENV=…`: cargo-lambda, zig and the aarch64 standard library, which a
//!    developer installs once), so that the figure is the build itself.
//! 3. Times `make build` there (`CARGO_INCREMENTAL=0`, as CI builds), which runs `sam build`:
//!    every function has the same build definition (the one `longhaul-lambda` binary, the same
//!    Metadata), so SAM runs `cargo lambda build` once and copies its binary to every function.
//! 4. Writes section `55-build` of BENCHMARKS.md: the wall time, the machine's cores and its
//!    load average before and after (a busy machine is slower; the section says so), the
//!    binary's size, the number of functions that deploy it and how many `cargo lambda build`
//!    runs SAM made for them.
//!
//! `LONGHAUL_BUILD_KEEP=1` keeps the scratch clone (its path is printed).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

/// The binary every function deploys, as cargo-lambda leaves it for SAM.
const ARTIFACT: &str = "target/lambda/longhaul-lambda/bootstrap";

fn main() -> anyhow::Result<()> {
    let root = longhaul_bench::workspace_root();
    let venv = root.join(".venv");
    let scratch = std::env::temp_dir().join(format!("longhaul-build-bench-{}", std::process::id()));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)?;
    }
    run(Command::new("git").args(["clone", "--quiet"]).arg(&root).arg(&scratch), "git clone")?;
    let make = |target: &str| {
        let mut command = Command::new("make");
        command
            .arg(target)
            .arg(format!("VENV={}", venv.display()))
            .current_dir(&scratch)
            .env("CARGO_INCREMENTAL", "0")
            .env_remove("CARGO_TARGET_DIR");
        command
    };
    eprintln!("build: installing the build tools (untimed)");
    run(&mut make("build-tools"), "make build-tools")?;

    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let load_before = load_average();
    eprintln!("build: make build in {} (timed)", scratch.display());
    let started = Instant::now();
    let output = make("build").output().context("start make build")?;
    let elapsed = started.elapsed();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    eprint!("{stdout}{stderr}");
    if !output.status.success() {
        bail!("make build failed: {}", output.status);
    }
    let cargo_lambda_runs = [&stdout, &stderr]
        .iter()
        .map(|text| text.matches("Running RustCargoLambdaBuilder:CargoLambdaBuild").count())
        .sum::<usize>();
    let load_after = load_average();

    let size = std::fs::metadata(scratch.join(ARTIFACT)).context(ARTIFACT)?.len();
    let functions = count_built_functions(&scratch.join(".aws-sam/build"))?;
    let markdown = format!(
        "## Build time\n\n\
         `cargo run --release -p longhaul-bench --bin buildtime` clones the current commit into a \
         scratch directory and times `make build` there — `sam build`, which runs \
         `cargo lambda build --release` (arm64, zig as the linker; the workspace release profile: \
         `opt-level = \"s\"`, no cross-crate LTO, 16 codegen units). Every function deploys the one \
         `longhaul-lambda` binary (its `LONGHAUL_FUNCTION` chooses the handler) and carries the \
         same Metadata, word for word, so SAM sees one build definition: one `cargo lambda \
         build` compiles and links the binary and SAM copies it to every function. The build tools (cargo-lambda, zig, the aarch64 standard library) are installed \
         beforehand, untimed.\n\n\
         | what | value |\n|---|---:|\n\
         | `make build`, clean checkout (wall, minutes) | {:.1} |\n\
         | cores | {cores} |\n\
         | load average (1 min) before → after | {load_before} → {load_after} |\n\
         | functions built | {functions} |\n\
         | `cargo lambda build` runs | {cargo_lambda_runs} |\n\
         | binary size (bytes, stripped, arm64) | {size} |\n\n\
         Reading: one release link of the SDK graph for the whole template; before this, each of \
         14 functions was its own binary and its own fat-LTO link (27 minutes on this machine); \
         then one binary, but a `cargo lambda build` per function (a Metadata of each function's \
         own made each its own build definition), the later ones finding it up to date: 5.6 \
         minutes at `bf5408a`; then one `cargo lambda build`, still fat LTO over one codegen \
         unit: 5.5 minutes at `84d63c6`. Without the whole-program link, the SDK crates' code \
         generation (most of the build) runs on both cores. \
         A load average above the core count means other work shared the machine during the \
         build, and the figure is an overestimate.\n",
        elapsed.as_secs_f64() / 60.0,
    );
    print!("{markdown}");
    longhaul_bench::write_section("55-build", &markdown)?;
    if std::env::var_os("LONGHAUL_BUILD_KEEP").is_some() {
        eprintln!("build: kept {}", scratch.display());
    } else {
        std::fs::remove_dir_all(&scratch)?;
    }
    Ok(())
}

/// Runs `command` with inherited output; an unsuccessful exit is an error naming `what`.
fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("start {what}"))?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

/// The 1-minute load average, as `/proc/loadavg` gives it ("?" where there is none).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// How many functions `sam build` left an artifact for (one directory each with a `bootstrap`).
fn count_built_functions(build_dir: &Path) -> anyhow::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(build_dir).with_context(|| build_dir.display().to_string())? {
        if entry?.path().join("bootstrap").is_file() {
            count += 1;
        }
    }
    Ok(count)
}
